//! The command line's arguments: the groups of flags shared by `serve` and `agent`
//! (inputs, DNS, etcd, the API address and token) and the subcommands of `audit` and
//! `dnssec`, each turned into the options it configures.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::{Args, Subcommand};

use crate::app::{DnsOptions, Inputs};
use crate::control::cluster::{ClusterOptions, EtcdOptions};
use crate::dns::rrl::RrlConfig;
use crate::dns::tcp::TcpLimits;

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
    pub(super) fn options(self, node: &str) -> anyhow::Result<Option<ClusterOptions>> {
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
        /// The head the server published (`/v1/state` `audit.head`, `SEQ:HASH`): the
        /// files must hold that entry with that hash, so a copy cut short or rewritten
        /// (rehashed from some line on) is caught too.
        #[arg(long, value_name = "SEQ:HASH")]
        expect_head: Option<String>,
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
    #[command(flatten)]
    pub context: ContextArgs,
    /// Scoped API tokens (YAML, owner-only mode): each a `name`, the `sha256` of its
    /// secret, its `verbs` (drain, undrain, freeze, resume, usage, policy, audit), and
    /// optionally the `names`, `tenants` and `regions` it may touch and `require_ticket`.
    /// Reloaded with the policy, and on its own when another input is broken (a removed
    /// token stops working at once); see the book, docs/book/src/user/admin-api.md
    /// (tokens).
    #[arg(long = "api-tokens", value_name = "FILE")]
    pub api_tokens: Option<PathBuf>,
}

/// The input files a policy is loaded against: the zones, the geo database, the probes
/// and the AS-number database (`diff` loads both of its policies against one set).
#[derive(Args, Debug, Clone)]
pub struct ContextArgs {
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
}

impl ContextArgs {
    /// The inputs of the policy at `config` loaded against these files.
    pub(super) fn with_policy(&self, config: PathBuf) -> Inputs {
        Inputs {
            config,
            zones: self.zones.clone(),
            geo: self.geo.clone(),
            probes: self.probes.clone(),
            asn: self.asn.clone(),
            api_tokens: None,
        }
    }
}

pub(super) fn parse_session(
    s: &str,
) -> Result<u64, crate::control::content::manifest::ManifestError> {
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
pub(super) fn api_token(file: Option<&std::path::Path>) -> anyhow::Result<Option<String>> {
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
pub(super) fn host_name() -> String {
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
    /// Response rate limit: UDP answers per second per client prefix (0: off), counted
    /// by size: an answer of up to 512 bytes costs one, a larger one (DNSSEC with DO=1,
    /// an NXDOMAIN with its denial proofs) one more per started 512 bytes, so at most
    /// N × 512 bytes a second reach a prefix.
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
    /// How often the DNS cookie secret is replaced (the previous one is still accepted
    /// until the next rotation); at least 3600, a cookie's lifetime. In a set, the
    /// first node to see the shared secret this old rotates it.
    #[arg(long, value_name = "SECONDS", default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(crate::control::cookies::MIN_ROTATION.as_secs()..))]
    cookie_rotation_seconds: u64,
    /// Copy each query and its response to a dnstap collector (Frame Streams, e.g.
    /// `fstrm_capture`), with the steering decision of each steered answer:
    /// `unix:PATH` or `tcp:HOST:PORT`. Reconnects when the collector comes back.
    #[arg(long, value_name = "unix:PATH|tcp:HOST:PORT")]
    dnstap: Option<crate::dns::dnstap::Endpoint>,
    /// With --dnstap: one in N unremarkable answers is written (steered by the
    /// configured weights, or zone data with NOERROR or NXDOMAIN); every other answer
    /// (failover, drain, fail-open, errors, truncated, rate limited) always is.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    dnstap_sample: u32,
}

impl DnsArgs {
    pub(super) fn options(self) -> anyhow::Result<DnsOptions> {
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
            cookie_rotation: Duration::from_secs(self.cookie_rotation_seconds),
            udp_panic_on: None,
            // The node name is filled in by `serve` (`--node`, else the host name).
            dnstap: self.dnstap.map(|endpoint| crate::dns::dnstap::Config {
                endpoint,
                sample: self.dnstap_sample,
                identity: String::new(),
            }),
        })
    }
}

impl From<InputArgs> for Inputs {
    fn from(a: InputArgs) -> Inputs {
        Inputs {
            api_tokens: a.api_tokens,
            ..a.context.with_policy(a.config)
        }
    }
}
