//! The command line: `serve`, `check`, `explain`, `agent`. Parsing with clap; each command
//! returns an exit code, and problems are printed for a person to read. Two hidden
//! commands write the manual pages and the shell completions from this definition
//! (`steerdns man DIR`, `steerdns completions SHELL`), for packages.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, CommandFactory, Parser, Subcommand};
use tracing::{info, warn};

use crate::app::{self, DnsOptions, Inputs, Loaded, ServeOptions};
use crate::control::cluster::{ClusterOptions, EtcdOptions};
use crate::control::content::SteeringOptions;
use crate::control::controller::StateFile;
use crate::control::state::{ControlState, SAVED_MAX_AGE};
use crate::dns::rrl::RrlConfig;
use crate::dns::tcp::TcpLimits;

/// `steerdns --version`: the crate version and the commit built.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("STEERDNS_COMMIT"),
    ")"
);

#[derive(Parser, Debug)]
#[command(
    name = "steerdns",
    version = VERSION,
    about = "Authoritative DNS server that steers a hostname across CDNs"
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
        /// Where health and failover progress are saved across restarts.
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
        /// Read usage records for commit steering from this URL (what `POST
        /// /v1/usage` takes: one record or an array) every --usage-poll-ms.
        #[arg(long, value_name = "URL")]
        usage_url: Option<reqwest::Url>,
        /// How often --usage-url is read.
        #[arg(long, value_name = "MS", default_value_t = app::DEFAULT_USAGE_POLL.as_millis() as u64)]
        usage_poll_ms: u64,
    },
    /// Run only the prober, publishing observations for the servers on --api.
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
    Check {
        #[command(flatten)]
        inputs: InputArgs,
    },
    /// Replay five-minute demand (CSV `start,region,mbps` or `start,region,bytes`)
    /// through the commit and capacity controller at full speed, with the same code
    /// the server runs: per CDN, the month's total against commit and cap, the
    /// five-minute samples above a p95 cap, the largest shift per period, and an SVG
    /// chart of the shares. One steered name is simulated: `--name`, by default the
    /// first with a contract or a capacity.
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
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// DNSSEC zone keys: make one, roll one over, show their status, print the DS records for the parent zone.
    Dnssec {
        #[command(subcommand)]
        command: DnssecCommand,
    },
    /// Write the manual pages (steerdns.1, steerdns-serve.1, ...) into DIR, or
    /// steerdns.1 to standard output.
    #[command(hide = true)]
    Man { dir: Option<PathBuf> },
    /// Write the completion script for SHELL to standard output.
    #[command(hide = true)]
    Completions { shell: clap_complete::Shell },
}

/// A set of nameservers sharing one view through etcd.
#[derive(Args, Debug, Clone)]
pub struct EtcdArgs {
    /// etcd client URLs (`http://` or `https://`), comma-separated: join a set of
    /// nameservers that share observations, failover timelines and overrides.
    #[arg(long, value_name = "URL[,URL…]", value_delimiter = ',')]
    pub etcd: Vec<reqwest::Url>,
    /// The key prefix of this set in etcd.
    #[arg(
        long,
        value_name = "PREFIX",
        default_value = "/steerdns/",
        requires = "etcd"
    )]
    pub etcd_prefix: String,
    /// etcd user (its role limited to the prefix); the password comes from
    /// --etcd-password-file or STEERDNS_ETCD_PASSWORD.
    #[arg(long, value_name = "NAME", requires = "etcd")]
    pub etcd_user: Option<String>,
    #[arg(long, value_name = "FILE", requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,
    /// CA certificate(s), PEM, that sign the etcd members' certificates (https URLs).
    #[arg(long, value_name = "FILE", requires = "etcd")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) for members run with --client-cert-auth.
    #[arg(long, value_name = "FILE", requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
    /// The set's members, nodes and agents, comma-separated: only their observations
    /// count (an observation under any other name is refused and counted).
    #[arg(
        long,
        value_name = "NAME[,NAME…]",
        value_delimiter = ',',
        requires = "etcd"
    )]
    pub members: Vec<String>,
    /// Accept an etcd link that is not secure: no authentication (no --etcd-user, no
    /// --etcd-cert: whoever reaches etcd decides for the set), or --etcd-user over
    /// http:// to a member off loopback (the password in clear). Refused without it.
    #[arg(long, requires = "etcd")]
    pub etcd_insecure: bool,
}

impl EtcdArgs {
    /// The set's options for `node`, or `None` without `--etcd`.
    fn options(self, node: &str) -> anyhow::Result<Option<ClusterOptions>> {
        if self.etcd.is_empty() {
            return Ok(None);
        }
        let user = match self.etcd_user {
            Some(u) => {
                let password = match &self.etcd_password_file {
                    Some(f) => crate::secret::read_secret_text(f)
                        .map_err(|e| anyhow::anyhow!("--etcd-password-file {e}"))?,
                    None => std::env::var("STEERDNS_ETCD_PASSWORD").map_err(|_| {
                        anyhow::anyhow!(
                            "--etcd-user needs --etcd-password-file or STEERDNS_ETCD_PASSWORD"
                        )
                    })?,
                };
                Some((u, password))
            }
            None => None,
        };
        let mut prefix = self.etcd_prefix;
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        Ok(Some(ClusterOptions {
            etcd: EtcdOptions {
                endpoints: self.etcd,
                user,
                ca_file: self.etcd_ca,
                cert_file: self.etcd_cert,
                key_file: self.etcd_key,
                insecure: self.etcd_insecure,
            },
            node: node.to_string(),
            prefix,
            members: self.members,
        }))
    }
}

/// `steerdns audit …`.
#[derive(Subcommand, Debug)]
pub enum AuditCommand {
    /// Check the hash chain of FILE (several: oldest first, e.g. audit.jsonl.1
    /// audit.jsonl); names the first line removed, changed or reordered and exits
    /// non-zero.
    Verify {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the latest entries of the audit log for people.
    Tail {
        /// Where `serve` keeps its state and the audit log.
        #[arg(long, value_name = "DIR", default_value = "state/")]
        state_dir: PathBuf,
        /// How many entries.
        #[arg(short = 'n', long, value_name = "N", default_value_t = 20)]
        lines: usize,
    },
}

/// `steerdns dnssec …`.
#[derive(Subcommand, Debug)]
pub enum DnssecCommand {
    /// Make a key (a CSK: it signs the whole zone) for ZONE in the key directory,
    /// owner-only, published and active from now; prints its file name.
    Keygen {
        zone: String,
        /// 13 (ECDSA P-256 with SHA-256) or 15 (Ed25519).
        #[arg(long, short = 'a', value_name = "N", default_value_t = 13)]
        algorithm: u8,
        /// The key directory (`dnssec: keys:` of the policy).
        #[arg(long, value_name = "DIR", default_value = "keys/")]
        keys: PathBuf,
    },
    /// Roll ZONE's key over: write its successor (of the same algorithm) and the old
    /// key's retirement into the key directory, timed as RFC 7583 says from the policy's `dnssec: rollover:`
    /// (at the scheduled time, `every` after the current key began signing; or with
    /// --now as soon as the files can reach every node). Prints the timeline and what
    /// to do at the parent.
    Rollover {
        zone: String,
        /// Start now (plus `propagation`), not at the scheduled time.
        #[arg(long)]
        now: bool,
        /// The steering policy (its `dnssec:` block).
        #[arg(long, value_name = "FILE", default_value = "steering.yaml")]
        config: PathBuf,
        /// The directory of zone files (their TTLs time the rollover).
        #[arg(long, value_name = "DIR", default_value = "zones/")]
        zones: PathBuf,
    },
    /// Print each key's phase and times, the DS the parent should hold, and what is
    /// due next (a rollover to start, a DS to replace at the parent).
    Status {
        /// The steering policy (its `dnssec:` block).
        #[arg(long, value_name = "FILE", default_value = "steering.yaml")]
        config: PathBuf,
        /// The directory of zone files.
        #[arg(long, value_name = "DIR", default_value = "zones/")]
        zones: PathBuf,
    },
    /// Print the DS records (SHA-256) of ZONE's published keys, for the parent zone.
    Ds {
        zone: String,
        /// The key directory (`dnssec: keys:` of the policy).
        #[arg(long, value_name = "DIR", default_value = "keys/")]
        keys: PathBuf,
    },
}

/// The input files, relative to the working directory by default.
#[derive(Args, Debug, Clone)]
pub struct InputArgs {
    /// The steering policy.
    #[arg(long, value_name = "FILE", default_value = "steering.yaml")]
    pub config: PathBuf,
    /// The directory of zone files.
    #[arg(long, value_name = "DIR", default_value = "zones/")]
    pub zones: PathBuf,
    /// The geo database (MaxMind DB: GeoIP2/GeoLite2 Country or City, or flat country_code).
    #[arg(long, value_name = "FILE", default_value = "geo/country.mmdb")]
    pub geo: PathBuf,
    /// The directory of probe files (one `<cdn>.yaml` per probed CDN, `vantages.yaml`).
    #[arg(long, value_name = "DIR", default_value = "probes/")]
    pub probes: PathBuf,
    /// An AS-number database (MaxMind DB: GeoLite2-ASN), for `match: [AS13335]`.
    #[arg(long = "asn-db", value_name = "FILE")]
    pub asn: Option<PathBuf>,
    /// Scoped API tokens (YAML, owner-only mode): each a `name`, the `sha256` of its
    /// secret, its `verbs` (drain, undrain, freeze, resume, usage), and optionally the
    /// `names`, `tenants` and `regions` it may touch and `require_ticket`. Reloaded with
    /// the policy; see the README, "Operating it live".
    #[arg(long = "api-tokens", value_name = "FILE")]
    pub api_tokens: Option<PathBuf>,
}

fn parse_session(s: &str) -> Result<u64, String> {
    crate::control::content::manifest::parse_session(s)
}

/// `--api ADDR`, or `off`.
#[derive(Clone, Copy, Debug)]
pub struct ApiAddr(pub Option<SocketAddr>);

impl std::str::FromStr for ApiAddr {
    type Err = std::net::AddrParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "off" {
            return Ok(ApiAddr(None));
        }
        s.parse().map(|a| ApiAddr(Some(a)))
    }
}

/// What an operator should know about an API listening on `addr`: `None` on loopback.
/// A non-loopback API is allowed (peers must read `/v1/observations` from other
/// machines), but it is plain HTTP: the read-only endpoints are open to whoever can
/// reach the port, and a bearer token would cross the network in clear.
pub fn api_exposure(addr: SocketAddr, token: bool) -> Option<String> {
    if addr.ip().is_loopback() {
        return None;
    }
    Some(if token {
        "api on a non-loopback address over plain HTTP: the bearer token crosses the network in clear, and /v1/state, /v1/explain, /metrics and /v1/observations are open to whoever reaches the port; restrict it with a firewall, or keep --api on loopback behind a TLS proxy".into()
    } else {
        "api on a non-loopback address: mutations are refused (no token), but /v1/state, /v1/explain, /metrics and /v1/observations are open to whoever reaches the port; restrict it with a firewall".into()
    })
}

/// The API token: from the file, else from STEERDNS_API_TOKEN; never empty. A file
/// that anyone but its owner may read is refused (the token is a secret).
fn api_token(file: Option<&std::path::Path>) -> anyhow::Result<Option<String>> {
    let token = match file {
        Some(f) => Some(
            crate::secret::read_secret_text(f)
                .map_err(|e| anyhow::anyhow!("--api-token-file {e}"))?,
        ),
        None => std::env::var("STEERDNS_API_TOKEN").ok(),
    };
    match token.map(|t| t.trim().to_string()) {
        Some(t) if t.len() < 16 => bail!("the API token must be at least 16 characters"),
        other => Ok(other),
    }
}

/// The machine's host name, the default vantage point name. From `uname(2)`, not
/// `/proc/sys`, which the systemd unit hides (`ProcSubset=pid`).
fn host_name() -> String {
    // SAFETY: `uname` fills the zeroed struct it is given; `nodename` is NUL-terminated.
    let node = unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        (libc::uname(&mut u) == 0).then(|| {
            std::ffi::CStr::from_ptr(u.nodename.as_ptr())
                .to_string_lossy()
                .into_owned()
        })
    };
    node.map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "local".into())
}

/// How the DNS listeners treat their clients.
#[derive(Args, Debug)]
pub struct DnsArgs {
    /// UDP sockets per --listen address, sharing its port with SO_REUSEPORT (the
    /// kernel spreads queries over them); default: the number of CPUs available.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    udp_sockets: Option<u16>,
    /// Open DNS-over-TCP connections at most; more are closed when accepted.
    #[arg(long, value_name = "N", default_value_t = 256)]
    tcp_max_connections: usize,
    /// A TCP connection idle this long, or this slow to send one message, is closed.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    tcp_idle_timeout: f64,
    /// Open DNS-over-TCP connections from one source prefix at most (0: no limit).
    #[arg(long, value_name = "N", default_value_t = 32)]
    tcp_max_per_source: usize,
    /// The IPv4 prefix --tcp-max-per-source counts by.
    #[arg(long, value_name = "BITS", default_value_t = 24, value_parser = clap::value_parser!(u8).range(8..=32))]
    tcp_source_ipv4_prefix: u8,
    /// The IPv6 prefix --tcp-max-per-source counts by.
    #[arg(long, value_name = "BITS", default_value_t = 56, value_parser = clap::value_parser!(u8).range(16..=128))]
    tcp_source_ipv6_prefix: u8,
    /// Queries read per TCP connection before it is closed, after answering every query
    /// already read (0: no limit).
    #[arg(long, value_name = "N", default_value_t = 0)]
    tcp_max_queries: u32,
    /// Response rate limit: UDP responses per second per client prefix (0: off).
    #[arg(long, value_name = "N", default_value_t = 1000)]
    rrl_rate: u32,
    /// Every Nth rate-limited query is answered truncated (TC) so that real clients
    /// retry over TCP; the others are dropped (0: drop all).
    #[arg(long, value_name = "N", default_value_t = 2)]
    rrl_slip: u32,
    /// The client prefix an IPv4 rate applies to.
    #[arg(long, value_name = "BITS", default_value_t = 24, value_parser = clap::value_parser!(u8).range(8..=32))]
    rrl_ipv4_prefix: u8,
    /// The client prefix an IPv6 rate applies to.
    #[arg(long, value_name = "BITS", default_value_t = 56, value_parser = clap::value_parser!(u8).range(16..=128))]
    rrl_ipv6_prefix: u8,
    /// Sources never rate limited; repeat for several. Giving it replaces the default
    /// (loopback), e.g. `--rrl-exempt 127.0.0.0/8 --rrl-exempt 192.0.2.53/32`.
    #[arg(long, value_name = "CIDR", default_values = ["127.0.0.0/8", "::1/128"])]
    rrl_exempt: Vec<ipnet::IpNet>,
    /// Bytes of cached answers (zone data, NXDOMAIN: names that are not steered) for
    /// the whole process, split between the UDP sockets (0: no cache).
    #[arg(long, value_name = "BYTES", default_value_t = crate::dns::cache::DEFAULT_BUDGET)]
    answer_cache_bytes: usize,
}

impl DnsArgs {
    fn options(self) -> anyhow::Result<DnsOptions> {
        if !(self.tcp_idle_timeout.is_finite() && self.tcp_idle_timeout > 0.0) {
            bail!("--tcp-idle-timeout must be a positive number of seconds");
        }
        if self.tcp_max_connections == 0 {
            bail!("--tcp-max-connections must be at least 1");
        }
        Ok(DnsOptions {
            udp_sockets: self
                .udp_sockets
                .map_or_else(crate::dns::listen::default_udp_sockets, usize::from),
            tcp: TcpLimits {
                max_connections: self.tcp_max_connections,
                max_per_source: self.tcp_max_per_source,
                source_prefix_v4: self.tcp_source_ipv4_prefix,
                source_prefix_v6: self.tcp_source_ipv6_prefix,
                idle_timeout: Duration::from_secs_f64(self.tcp_idle_timeout),
                max_queries: self.tcp_max_queries,
            },
            rrl: RrlConfig {
                rate: self.rrl_rate,
                slip: self.rrl_slip,
                ipv4_prefix: self.rrl_ipv4_prefix,
                ipv6_prefix: self.rrl_ipv6_prefix,
                exempt: self.rrl_exempt,
            },
            answer_cache_bytes: self.answer_cache_bytes,
            udp_panic_on: None,
        })
    }
}

impl From<InputArgs> for Inputs {
    fn from(a: InputArgs) -> Inputs {
        Inputs {
            config: a.config,
            zones: a.zones,
            geo: a.geo,
            probes: a.probes,
            asn: a.asn,
            api_tokens: a.api_tokens,
        }
    }
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
            state_dir,
            state_max_age_seconds,
            vantage,
            vantage_address,
            etcd,
            reload_poll_ms,
            api_token_file,
            steering_http,
            trusted_proxies,
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
            let dns = match dns.options() {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("steerdns: {e:#}");
                    return ExitCode::FAILURE;
                }
            };
            let opts = ServeOptions {
                inputs: inputs.clone(),
                reload_poll: Duration::from_millis(reload_poll_ms),
                api_token,
                listen,
                dns,
                api: api.0,
                api_hosts,
                state: Some(StateFile::new(
                    state_dir,
                    Duration::from_secs(state_max_age_seconds),
                )),
                vantage,
                vantage_address,
                cluster,
                steering: steering_http
                    .0
                    .map(|addr| SteeringOptions::new(addr, trusted_proxies)),
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
        Command::Simulate {
            demand,
            policy,
            svg,
            start,
            delay_seconds,
            name,
        } => {
            end_quietly_on_a_closed_pipe();
            let args = crate::control::commit::simulate::Args {
                demand,
                policy,
                svg,
                start,
                delay_seconds,
                name,
            };
            match crate::control::commit::simulate::command(&args) {
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

/// Prints what `audit verify` found; the exit code.
fn verify_report(files: &[PathBuf]) -> ExitCode {
    match crate::control::audit::verify(files) {
        Ok(v) => {
            println!(
                "ok: {} entries, seq {} to {}, last hash {}",
                v.entries, v.first_seq, v.last_seq, v.last_hash
            );
            ExitCode::SUCCESS
        }
        Err(broken) => {
            eprintln!("{broken}");
            ExitCode::FAILURE
        }
    }
}

/// `audit verify` and `audit tail`.
fn dnssec(command: DnssecCommand) -> ExitCode {
    let now = crate::clock::now_secs();
    let done = match command {
        DnssecCommand::Keygen {
            zone,
            algorithm,
            keys,
        } => crate::dnssec::keygen(&keys, &zone, algorithm, now)
            .map(|path| println!("{}", path.display())),
        DnssecCommand::Rollover {
            zone,
            now: start_now,
            config,
            zones,
        } => crate::dnssec::rollover_command(&config, &zones, &zone, now, start_now)
            .map(|text| println!("{text}")),
        DnssecCommand::Status { config, zones } => {
            crate::dnssec::status_command(&config, &zones, now).map(|text| print!("{text}"))
        }
        DnssecCommand::Ds { zone, keys } => crate::dnssec::ds(&keys, &zone, now).map(|lines| {
            for l in lines {
                println!("{l}");
            }
        }),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("steerdns: {e}");
            ExitCode::FAILURE
        }
    }
}

fn audit(command: AuditCommand) -> ExitCode {
    use crate::control::audit;
    match command {
        AuditCommand::Verify { mut files } => {
            // The live log alone: with its rotated files, oldest first.
            if let [one] = files.as_slice() {
                let all = audit::files(one);
                if all.len() > 1 && all.last() == Some(one) {
                    files = all;
                }
            }
            verify_report(&files)
        }
        AuditCommand::Tail { state_dir, lines } => {
            let files = audit::files(&state_dir.join("audit.jsonl"));
            if files.is_empty() {
                eprintln!(
                    "steerdns: no audit log in {} (serve --state-dir)",
                    state_dir.display()
                );
                return ExitCode::FAILURE;
            }
            let mut last: std::collections::VecDeque<String> = Default::default();
            for f in &files {
                let Ok(text) = std::fs::read_to_string(f) else {
                    eprintln!("steerdns: cannot read {}", f.display());
                    return ExitCode::FAILURE;
                };
                for line in text.lines().filter(|l| !l.trim().is_empty()) {
                    if last.len() == lines {
                        last.pop_front();
                    }
                    last.push_back(line.to_string());
                }
            }
            for line in last.iter().filter(|_| lines > 0) {
                println!("{}", audit::human(line));
            }
            ExitCode::SUCCESS
        }
    }
}

/// The manual pages, from the command-line definition: every visible subcommand gets
/// its own page in `dir`; without `dir`, the main page goes to standard output.
fn man(dir: Option<&std::path::Path>) -> ExitCode {
    let written = match dir {
        Some(dir) => clap_mangen::generate_to(Cli::command(), dir)
            .with_context(|| format!("cannot write the manual pages into {}", dir.display())),
        None => clap_mangen::Man::new(Cli::command())
            .render(&mut std::io::stdout())
            .context("cannot write the manual page"),
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("steerdns: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `steerdns explain … | head` ends as other Unix tools do when the reader goes away
/// (killed by SIGPIPE), rather than panicking in `println!` on EPIPE. Only for the
/// commands that print and exit: `serve` and `agent` keep SIGPIPE ignored, so that a
/// peer closing a socket is an error on that socket, not the end of the server.
fn end_quietly_on_a_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restores the default disposition of one signal, before any output.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn load_or_report(inputs: &Inputs) -> Option<Loaded> {
    match app::load(inputs) {
        Ok(loaded) => {
            for w in loaded.warnings.warnings() {
                eprintln!("{w}");
            }
            Some(loaded)
        }
        Err(issues) => {
            for w in issues.warnings() {
                eprintln!("{w}");
            }
            eprint!("{issues}");
            None
        }
    }
}

async fn serve(inputs: Inputs, opts: ServeOptions) -> ExitCode {
    let Some(loaded) = load_or_report(&inputs) else {
        eprintln!("steerdns: not starting: fix the errors above (`steerdns check` lists them)");
        return ExitCode::FAILURE;
    };
    let names: Vec<String> = loaded
        .policy
        .hosts
        .iter()
        .map(|h| h.name.to_string())
        .collect();
    let zones: Vec<String> = loaded.zones.origins().map(ToString::to_string).collect();
    info!(
        steered = %names.join(" "),
        zones = %zones.join(" "),
        geo = %loaded.geo.path().display(),
        geo_networks = loaded.geo.networks(),
        asn_networks = loaded.geo.asn().map(|a| a.networks()),
        "loaded"
    );
    let probed: Vec<&str> = loaded.probes.specs.iter().map(|s| s.cdn.as_str()).collect();
    info!(probed = %probed.join(" "), vantages = loaded.probes.vantages.len(), vantage = %opts.vantage, "health checks");
    let mut service = match app::serve(loaded, &opts).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("steerdns: {e}");
            return ExitCode::FAILURE;
        }
    };
    crate::huge::give_back();
    for addr in service.dns.addrs() {
        info!(%addr, udp_sockets = opts.dns.udp_sockets, "listening (udp, tcp)");
    }
    if let Some(addr) = service.steering {
        info!(%addr, "content steering listening (http): /steer/hls/{{name}}, /steer/dash/{{name}}");
    }
    if let Some(addr) = service.api {
        info!(%addr, "api listening (http)");
        if let Some(why) = api_exposure(addr, opts.api_token.is_some()) {
            warn!(%addr, "{why}");
        }
    }

    let token = service.shutdown_token();
    tokio::spawn(async move {
        shutdown_signal().await;
        info!("shutting down");
        token.cancel();
    });
    match service.wait().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            warn!(error = %e, "server stopped with an error");
            ExitCode::FAILURE
        }
    }
}

async fn agent(
    dir: PathBuf,
    api: SocketAddr,
    vantage: String,
    cluster: Option<ClusterOptions>,
) -> ExitCode {
    let probes = match crate::config::probes::load_dir(&dir, None) {
        Ok((p, warnings)) => {
            for w in warnings.warnings() {
                eprintln!("{w}");
            }
            p
        }
        Err(issues) => {
            eprint!("{issues}");
            return ExitCode::FAILURE;
        }
    };
    let agent = match app::agent_with(probes, api, vantage.clone(), cluster).await {
        Ok(a) => a,
        Err(e) => {
            eprintln!("steerdns: agent on {api}: {e}");
            return ExitCode::FAILURE;
        }
    };
    info!(addr = %agent.api, vantage = %vantage, "agent: probing, observations on /v1/observations");
    shutdown_signal().await;
    info!("shutting down");
    drop(agent);
    ExitCode::SUCCESS
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

fn check(inputs: Inputs) -> ExitCode {
    let Some(loaded) = load_or_report(&inputs) else {
        return ExitCode::FAILURE;
    };
    println!(
        "ok: {} steered name(s) [{}], {} zone(s) [{}], geo database {} ({}, {} networks)",
        loaded.policy.hosts.len(),
        loaded
            .policy
            .hosts
            .iter()
            .map(|h| h.name.to_string())
            .collect::<Vec<_>>()
            .join(" "),
        loaded.zones.origins().count(),
        loaded
            .zones
            .origins()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" "),
        loaded.geo.path().display(),
        loaded.geo.database_type(),
        loaded.geo.networks(),
    );
    for (tenant, names) in loaded.policy.tenants() {
        println!("tenant {tenant}: {}", names.join(" "));
    }
    if inputs.api_tokens.is_some() {
        for t in &loaded.tokens.list {
            println!("{}", token_line(t));
        }
    }
    ExitCode::SUCCESS
}

/// One token of `--api-tokens` as `check` lists it.
fn token_line(t: &crate::config::tokens::Token) -> String {
    let verbs: Vec<&str> = t.verbs.iter().map(|v| v.as_str()).collect();
    // Names and tenants limit together: one of them given, the other adds nothing.
    let limited = t.names.is_some() || t.tenants.is_some();
    let list = |l: &Option<Vec<String>>, none: &str| {
        l.as_ref().map_or_else(|| none.to_string(), |v| v.join(","))
    };
    let by_name = if limited { "none" } else { "any" };
    format!(
        "token {}: {}; names {}; tenants {}; regions {}{}",
        t.name,
        verbs.join(","),
        list(&t.names, by_name),
        list(&t.tenants, by_name),
        list(&t.regions, "any"),
        if t.require_ticket {
            "; ticket required"
        } else {
            ""
        },
    )
}

fn explain(
    inputs: Inputs,
    name: &str,
    client: IpAddr,
    resolver: Option<(IpAddr, u8)>,
    session: Option<u64>,
    state_dir: &std::path::Path,
    json: bool,
) -> ExitCode {
    let Some(loaded) = load_or_report(&inputs) else {
        return ExitCode::FAILURE;
    };
    // The failover state `serve` saved, if recent: explain what is served now.
    let max_age = crate::control::state::SAVED_MAX_AGE;
    let saved = match crate::control::persist::load(state_dir, max_age) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("warning: {e}: showing configured weights");
            None
        }
    };
    let (now, now_ms) = (tokio::time::Instant::now(), crate::clock::now_ms());
    let state = match &saved {
        Some(s) => ControlState::from_saved(s, &loaded, now, now_ms),
        None => {
            let mut state = ControlState::default();
            state.drains.sync(&loaded.policy, now, now_ms);
            state
        }
    };
    // The performance shifts and commit biases saved with it, applied as `serve`
    // applies them: perf, then commit, then failover and drains.
    let mut perf = crate::control::perf::Perf::default();
    perf.configure(&loaded.policy, now_ms);
    if let Some(s) = &saved {
        perf.restore(&s.performance, now_ms);
    }
    let shifted = perf.apply(&loaded.policy);
    let base = shifted.as_ref().unwrap_or(&loaded.policy);
    let mut commit = crate::control::commit::Commit::default();
    commit.configure(&loaded.policy, now_ms);
    match saved.as_ref().and_then(|s| s.commit.as_ref()) {
        Some(c) => commit.restore(c),
        None => commit.ledger = crate::control::persist::saved_usage(state_dir).unwrap_or_default(),
    }
    let committed = commit.apply(base, &|n: &str, r: usize, c: usize| perf.outside(n, r, c));
    let (snapshot, _) = state.snapshot_for(&loaded, committed.as_ref().unwrap_or(base));
    let facts = crate::control::explain::Facts {
        loaded: &loaded,
        snapshot: &snapshot,
        health: &state.failover.health,
        removed: &state.removed(&loaded),
        drains: state.drains.report(&loaded.policy, now_ms),
        frozen: state.frozen_for(&loaded, name),
        state: match &saved {
            Some(s) => format!(
                "saved by `serve` {} s ago in {}",
                s.age_ms() / 1000,
                state_dir.display()
            ),
            None => format!(
                "none saved by `serve` (or older than {} min): no failover in progress",
                max_age.as_secs() / 60
            ),
        },
    };
    let question = crate::control::explain::Question {
        name,
        client,
        resolver,
        now: crate::clock::now_secs(),
        session,
    };
    let explained = crate::control::explain::explain(&facts, &question).map(|mut e| {
        e.commit = commit.name_view(&e.name, now_ms);
        e.performance = perf.region_view(&e.name, e.region.index);
        e
    });
    match explained {
        Ok(e) if json => match serde_json::to_string_pretty(&e) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("steerdns: cannot write the explanation as JSON: {err}");
                ExitCode::FAILURE
            }
        },
        Ok(e) => {
            print!("{e}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("steerdns: {e}");
            ExitCode::FAILURE
        }
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
