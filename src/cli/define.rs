//! The command line: its definition (`Cli`, `Command` and their flags) and `run`, which
//! hands each command to its file.
//! (The main room of its folder; the folder's door, `mod.rs`, says what else lives there.)

use super::*;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};

use crate::app::{self, Inputs, ServeOptions};
use crate::control::content::server::parse_origin;
use crate::control::content::SteeringOptions;
use crate::control::controller::StateFile;
use crate::control::decide::state::SAVED_MAX_AGE;
use crate::control::surfaces::book::Book;

use super::args::{api_token, host_name, parse_session};
use super::offline::{audit, check, diff, dnssec, explain, man};
use super::serve::{agent, serve};

/// `steerdns --version`: the crate version and the commit built.
pub(super) const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("STEERDNS_COMMIT"),
    ")"
);

#[derive(Parser, Debug)]
#[command(
    name = "steerdns",
    version = VERSION,
    about = "Authoritative DNS server that steers a hostname across CDNs",
    after_help = "The manual is a book: docs/book/src/introduction.md in the source tree (every \
                  command and flag: docs/book/src/reference/cli.md). `bash scripts/book.sh` builds \
                  it, and `serve` shows the built book at /book/ on --api (--book)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once at start: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve DNS (UDP and TCP) from the policy, the zones and the geo database.
    #[command(
        after_help = "The book: docs/book/src/user/install.md (running it), docs/book/src/reference/command-line.md (how the flags work together), docs/book/src/user/operating.md (live operation), docs/book/src/user/set/index.md (--etcd)"
    )]
    Serve {
        #[command(flatten)]
        inputs: InputArgs,
        /// Address to answer on, UDP and TCP; repeat for several (IPv6: [::1]:5353).
        #[arg(long = "listen", value_name = "ADDR", default_value = "127.0.0.1:5353")]
        listen: Vec<SocketAddr>,
        #[command(flatten)]
        dns: DnsArgs,
        /// HTTP API: observations for peers, state (`off` to disable).
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9153")]
        api: ApiAddr,
        /// A name the API may be reached by, besides its address and `localhost`: a
        /// read whose `Host` is another name gets 421 (DNS rebinding); repeat for
        /// several.
        #[arg(long = "api-host", value_name = "NAME")]
        api_hosts: Vec<String>,
        /// Sources that read the audit log (GET /v1/audit) without a token; repeat for
        /// several. Any other source needs a token with the verb `audit`. Giving it
        /// replaces the default (loopback); `--api-audit-open 0.0.0.0/32` (no source)
        /// asks a token of every reader.
        #[arg(long = "api-audit-open", value_name = "CIDR", default_values = ["127.0.0.0/8", "::1/128"])]
        api_audit_open: Vec<ipnet::IpNet>,
        /// Where the manual is, for the status page's links (`/book/…` on the API): a
        /// directory holding the built book, served read-only (`bash scripts/book.sh`
        /// builds it into docs/book/book), or the http(s) URL of a published copy, to
        /// which `/book/PAGE` redirects.
        #[arg(long, value_name = "DIR|URL", default_value = "docs/book/book")]
        book: String,
        /// Where health and failover progress are saved across restarts (and the
        /// beacon samples by source network, for `steerdns diff`).
        #[arg(long, value_name = "DIR", default_value = "state/")]
        state_dir: PathBuf,
        /// A saved state older than this is ignored at startup.
        #[arg(long, value_name = "SECONDS", default_value_t = SAVED_MAX_AGE.as_secs())]
        state_max_age_seconds: u64,
        /// This node's name: its vantage point in probes and in a set (default: the
        /// host name).
        #[arg(long, visible_alias = "node", value_name = "NAME")]
        vantage: Option<String>,
        /// This vantage point's public address: each probe round's time to first byte
        /// counts as a performance sample of the region a client at this address gets
        /// (regions with a `performance:` block). Default: the prober's timings are
        /// not used.
        #[arg(long, value_name = "IP")]
        vantage_address: Option<std::net::IpAddr>,
        #[command(flatten)]
        etcd: EtcdArgs,
        /// File holding the bearer token for the API's mutations (drains, freeze);
        /// or set STEERDNS_API_TOKEN. Without either, mutations are refused.
        #[arg(long, value_name = "FILE")]
        api_token_file: Option<PathBuf>,
        /// How often the inputs are checked for changes; 0 = reload on SIGHUP only.
        #[arg(long, value_name = "MS", default_value_t = app::DEFAULT_RELOAD_POLL_MS)]
        reload_poll_ms: u64,
        /// Content steering for HLS and DASH players: `GET /steer/hls/{name}` and
        /// `/steer/dash/{name}` (`off` to disable).
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8053")]
        steering_http: ApiAddr,
        /// Proxies (CIDR blocks) whose X-Forwarded-For locates a player on
        /// --steering-http; repeat for several. Default: none, the peer is the client.
        #[arg(long, value_name = "CIDR", num_args = 1..)]
        trusted_proxies: Vec<ipnet::IpNet>,
        /// A web origin (`https://player.example.com`) whose pages may post beacons
        /// (`POST /rum/{name}`) and fetch tickets on --steering-http: CORS is answered
        /// for it alone; repeat for several. Default: none, only players that are not
        /// web pages (or pages of the steering server's own origin) can post.
        #[arg(long = "beacon-origin", value_name = "ORIGIN", value_parser = parse_origin)]
        beacon_origins: Vec<String>,
        /// Read usage records for commit steering from this URL (what `POST
        /// /v1/usage` takes: one record or an array) every --usage-poll-ms.
        #[arg(long, value_name = "URL")]
        usage_url: Option<reqwest::Url>,
        /// How often --usage-url is read.
        #[arg(long, value_name = "MS", default_value_t = app::DEFAULT_USAGE_POLL.as_millis() as u64)]
        usage_poll_ms: u64,
    },
    /// Run only the prober, publishing observations for the servers on --api.
    #[command(after_help = "The book: docs/book/src/user/failover.md#vantage-points-and-quorum")]
    Agent {
        /// The directory of probe files.
        #[arg(long, value_name = "DIR", default_value = "probes/")]
        probes: PathBuf,
        /// Where observations are served (`GET /v1/observations`).
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9153")]
        api: SocketAddr,
        /// This vantage point's name (default: the host name).
        #[arg(long, visible_alias = "node", value_name = "NAME")]
        vantage: Option<String>,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// Validate the policy, the zones and the geo database; exit non-zero on any error.
    #[command(
        after_help = "The book: docs/book/src/user/try-it.md#ask-the-server-why-explain-and-check, docs/book/src/user/policy.md#validation"
    )]
    Check {
        #[command(flatten)]
        inputs: InputArgs,
    },
    /// Compare two policies, offline: which shares and which clients' answers serving
    /// NEW instead of OLD changes.
    ///
    /// For each steered name and region, each CDN's share before → after, and the
    /// share of the region's client networks whose answer changes; names, CDNs and
    /// regions added or removed; TTL, selection, failover, CNAME and drain changes.
    ///
    /// Both policies are loaded against the same zones, geo database and probes (the
    /// flags below, as `check` takes them), planned by the planner `serve` runs, and
    /// every network of the geo database is asked about every steered name through
    /// both plans at one instant, as dig would ask: through --resolver, with ECS /24
    /// (IPv4) or /56 (IPv6) of the network. A network counts in the region it is in
    /// before and in the one it is in after. The share is weighted by address space,
    /// IPv4 and IPv6 apart, and, where --state-dir holds recorded traffic (the beacon
    /// samples `serve` saves by source network, for regions with a `performance:`
    /// block), by traffic too: the share of a region's samples whose answer changes,
    /// next to it. Usage records are per CDN, not per network, and weigh nothing.
    /// Every CDN is taken as healthy, drains written in the policies at their last
    /// step, and performance and commit modifiers are not applied.
    ///
    /// Exit status: 0 when both policies give every answer alike, 1 when an answer
    /// changes (a CNAME for some network, a TTL, the selection, a name added or
    /// removed; other setting changes are listed but keep 0), 2 on an error (each
    /// with file:line: field, as `check` prints them).
    #[command(
        after_help = "The book: docs/book/src/user/policy.md#comparing-two-policies, docs/book/src/runbooks/roll-back-a-policy.md"
    )]
    Diff {
        /// The policy before the edit (the one in force).
        old: PathBuf,
        /// The policy after the edit.
        new: PathBuf,
        /// Print the comparison as JSON (the same figures, for scripts).
        #[arg(long)]
        json: bool,
        /// The resolver the networks are asked through: its address is part of the
        /// selection key, so another resolver sees other networks change (about as
        /// many).
        #[arg(long, value_name = "IP", default_value = "127.0.0.1")]
        resolver: IpAddr,
        #[command(flatten)]
        inputs: ContextArgs,
        /// Where `serve` saves its state: the beacon samples it recorded there
        /// (steerdns-traffic.json) weigh the networks by traffic as well; without
        /// any, by address space alone.
        #[arg(long, value_name = "DIR", default_value = "state/")]
        state_dir: PathBuf,
    },
    /// Replay five-minute demand (CSV `start,region,mbps` or `start,region,bytes`)
    /// through the commit and capacity controller at full speed, with the same code
    /// the server runs: per CDN, the month's total against commit and cap, the
    /// five-minute samples above a p95 cap, the largest shift per period, and an SVG
    /// chart of the shares. One steered name is simulated: `--name`, by default the
    /// first with a contract or a capacity.
    #[command(after_help = "The book: docs/book/src/user/commit-steering.md")]
    Simulate {
        /// The demand file: a header `start,region,mbps` (or `bytes`), then one row per
        /// five minutes and region (`region` is a region's `name:` in the policy).
        #[arg(long, value_name = "FILE")]
        demand: PathBuf,
        /// The policy with the CDNs' `contract:`, `capacity_mbps:` and `commit:`.
        #[arg(long, value_name = "FILE", default_value = "steering.yaml")]
        policy: PathBuf,
        /// Write a chart of each CDN's share over the span here (SVG).
        #[arg(long, value_name = "OUT.svg")]
        svg: Option<PathBuf>,
        /// The controller steers from this time (RFC 3339; default: the first row);
        /// before it the policy applies as written, as in a month already under way.
        #[arg(long, value_name = "TIME")]
        start: Option<String>,
        /// Usage records arrive this many seconds after their five minutes end.
        #[arg(long, value_name = "SECONDS", default_value_t = 0)]
        delay_seconds: u64,
        /// The steered name to simulate (default: the first with a contract or a
        /// capacity, else the first).
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
    },
    /// Show, offline, how NAME is answered for a client and why.
    #[command(after_help = "The book: docs/book/src/runbooks/read-explain.md")]
    Explain {
        /// The steered name (www.example.com).
        name: String,
        /// The client address (as the ECS address, or the resolver's).
        #[arg(long)]
        client: IpAddr,
        /// The resolver asking with ECS, for the answer it gets; by default the client
        /// asks itself, without ECS.
        #[arg(long, value_name = "IP")]
        resolver: Option<IpAddr>,
        /// The ECS source prefix the resolver sends (default 24 for IPv4, 56 for IPv6).
        #[arg(long, value_name = "BITS", requires = "resolver")]
        source: Option<u8>,
        /// A content steering session key (16 hex digits, `session=` in a player's
        /// RELOAD-URI), to show the order of pathways that session gets.
        #[arg(long, value_name = "KEY", value_parser = parse_session)]
        session: Option<u64>,
        /// Print the explanation as JSON, as `/v1/explain` serves it.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        inputs: InputArgs,
        /// Where `serve` saves health and failover progress (read to show them).
        #[arg(long, value_name = "DIR", default_value = "state/")]
        state_dir: PathBuf,
    },
    /// The audit log (STATE_DIR/audit.jsonl): check its hash chain, or print it.
    #[command(after_help = "The book: docs/book/src/user/audit-and-faults.md#audit-log")]
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// The policy versions of a running server and its set, over its admin API:
    /// `status`, `diff FILE`, `apply FILE`, `rollback [VERSION]`, `halt`.
    #[command(after_help = "The book: docs/book/src/user/policy.md#changing-the-policy")]
    Policy {
        #[command(subcommand)]
        command: super::policy::PolicyCommand,
    },
    /// DNSSEC zone keys: make one, roll one over, show their status, print the DS records for the parent zone.
    #[command(after_help = "The book: docs/book/src/user/dnssec.md")]
    Dnssec {
        #[command(subcommand)]
        command: DnssecCommand,
    },
    /// Print a generated page of the book's reference in Markdown: every command and
    /// flag (`cli`), or every metric family with its type and labels (`metrics`). CI
    /// compares them with docs/book/src/reference/cli.md and docs/book/src/reference/metrics.md.
    #[command(after_help = "The book: docs/book/src/dev/testing.md")]
    Reference { page: super::reference::Page },
    /// Write the manual pages (steerdns.1, steerdns-serve.1, ...) into DIR, or
    /// steerdns.1 to standard output.
    #[command(hide = true)]
    Man { dir: Option<PathBuf> },
    /// Write the completion script for SHELL to standard output.
    #[command(hide = true)]
    Completions { shell: clap_complete::Shell },
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Serve {
            inputs,
            listen,
            dns,
            api,
            api_hosts,
            api_audit_open,
            book,
            state_dir,
            state_max_age_seconds,
            vantage,
            vantage_address,
            etcd,
            reload_poll_ms,
            api_token_file,
            steering_http,
            trusted_proxies,
            beacon_origins,
            usage_url,
            usage_poll_ms,
        } => {
            let vantage = vantage.unwrap_or_else(host_name);
            let cluster = match etcd.options(&vantage) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("steerdns: {e:#}");
                    return ExitCode::FAILURE;
                }
            };
            let inputs: Inputs = inputs.into();
            let api_token = match api_token(api_token_file.as_deref()) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("steerdns: {e:#}");
                    return ExitCode::FAILURE;
                }
            };
            let mut dns = match dns.options() {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("steerdns: {e:#}");
                    return ExitCode::FAILURE;
                }
            };
            if let Some(tap) = &mut dns.dnstap {
                tap.identity = vantage.clone();
            }
            let opts = ServeOptions {
                inputs: inputs.clone(),
                reload_poll: Duration::from_millis(reload_poll_ms),
                api_token,
                listen,
                dns,
                api: api.0,
                api_hosts,
                api_audit_open,
                book: Book::parse(&book),
                state: Some(StateFile::new(
                    state_dir,
                    Duration::from_secs(state_max_age_seconds),
                )),
                vantage,
                vantage_address,
                cluster,
                steering: steering_http.0.map(|addr| SteeringOptions {
                    beacon_origins,
                    ..SteeringOptions::new(addr, trusted_proxies)
                }),
                usage_url,
                usage_poll: Duration::from_millis(usage_poll_ms.max(100)),
            };
            serve(inputs, opts).await
        }
        Command::Agent {
            probes,
            api,
            vantage,
            etcd,
        } => {
            let vantage = vantage.unwrap_or_else(host_name);
            match etcd.options(&vantage) {
                Ok(cluster) => agent(probes, api, vantage, cluster).await,
                Err(e) => {
                    eprintln!("steerdns: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Check { inputs } => {
            end_quietly_on_a_closed_pipe();
            check(inputs.into())
        }
        Command::Diff {
            old,
            new,
            json,
            resolver,
            inputs,
            state_dir,
        } => {
            end_quietly_on_a_closed_pipe();
            diff(&inputs, old, new, resolver, json, Some(&state_dir))
        }
        Command::Explain {
            name,
            client,
            resolver,
            source,
            session,
            json,
            inputs,
            state_dir,
        } => {
            end_quietly_on_a_closed_pipe();
            let asker = resolver.map(|r| {
                (
                    r,
                    source.unwrap_or(crate::selection::default_source(client)),
                )
            });
            explain(
                inputs.into(),
                &name,
                client,
                asker,
                session,
                &state_dir,
                json,
            )
        }
        Command::Audit { command } => {
            end_quietly_on_a_closed_pipe();
            audit(command)
        }
        Command::Policy { command } => super::policy::run(command).await,
        Command::Simulate {
            demand,
            policy,
            svg,
            start,
            delay_seconds,
            name,
        } => {
            end_quietly_on_a_closed_pipe();
            let args = crate::control::modifiers::commit::simulate::Args {
                demand,
                policy,
                svg,
                start,
                delay_seconds,
                name,
            };
            match crate::control::modifiers::commit::simulate::command(&args) {
                Ok(report) => {
                    print!("{report}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("steerdns simulate: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Dnssec { command } => dnssec(command),
        Command::Man { dir } => man(dir.as_deref()),
        Command::Reference { page } => {
            print!("{}", super::reference::page(page));
            ExitCode::SUCCESS
        }
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "steerdns",
                &mut std::io::stdout(),
            );
            ExitCode::SUCCESS
        }
    }
}

/// `steerdns explain … | head` ends as other Unix tools do when the reader goes away
/// (killed by SIGPIPE), rather than panicking in `println!` on EPIPE. Only for the
/// commands that print and exit: `serve` and `agent` keep SIGPIPE ignored, so that a
/// peer closing a socket is an error on that socket, not the end of the server.
pub(super) fn end_quietly_on_a_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restores the default disposition of one signal, before any output.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Command {
        Cli::try_parse_from(args).unwrap().command
    }

    #[test]
    fn the_api_listens_on_loopback_unless_told_otherwise() {
        let Command::Serve { api, .. } = parse(&["steerdns", "serve"]) else {
            panic!("not serve")
        };
        let addr = api.0.expect("on by default");
        assert!(addr.ip().is_loopback(), "{addr}");
        assert_eq!(api_exposure(addr, false), None);
        let Command::Agent { api, .. } = parse(&["steerdns", "agent"]) else {
            panic!("not agent")
        };
        assert!(api.ip().is_loopback(), "{api}");
        let Command::Serve { api, .. } = parse(&["steerdns", "serve", "--api", "off"]) else {
            panic!("not serve")
        };
        assert!(api.0.is_none());
    }

    #[test]
    fn a_non_loopback_api_is_warned_about() {
        for addr in ["0.0.0.0:9153", "[::]:9153", "192.0.2.1:9153"] {
            let addr: SocketAddr = addr.parse().unwrap();
            let open = api_exposure(addr, false).expect("warned");
            assert!(open.contains("mutations are refused"), "{open}");
            let token = api_exposure(addr, true).expect("warned");
            assert!(token.contains("in clear"), "{token}");
        }
        assert_eq!(api_exposure("[::1]:9153".parse().unwrap(), true), None);
    }

    #[cfg(unix)]
    #[test]
    fn a_token_file_every_user_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("steerdns-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("token");
        std::fs::write(&f, "0123456789abcdef0123\n").unwrap();
        let chmod = |mode| std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode));
        for mode in [0o644, 0o640] {
            chmod(mode).unwrap();
            let e = api_token(Some(&f)).unwrap_err().to_string();
            assert!(
                e.contains("owner only") && e.contains(&format!("{mode:o}")),
                "{e}"
            );
        }
        for mode in [0o600, 0o400] {
            chmod(mode).unwrap();
            assert_eq!(
                api_token(Some(&f)).unwrap().as_deref(),
                Some("0123456789abcdef0123"),
                "mode {mode:o}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
