//! Test harness: a real steerdns server on an ephemeral loopback port, a small DNS
//! client (hickory-proto messages over tokio sockets, UDP and TCP; the messages
//! themselves are in `wire`), and the steerdns binary and its input files.
#![allow(dead_code)]

pub mod demo;
pub mod dnssec;
pub mod etcd;
pub mod mock_cdn;
pub mod relay;
pub mod stack;
pub mod unbound;
pub mod wan;
pub mod wire;

pub use wire::*;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use hickory_proto::op::Message;
use hickory_proto::rr::RecordType;
use steerdns::app::{self, Inputs, Running};
use steerdns::control::decide::planner;
use steerdns::metrics::Metrics;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// A path inside the repository.
pub fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The steerdns binary cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_steerdns");

/// A command running the steerdns binary with `args`; more arguments, a directory or
/// the environment may follow before it is run.
pub fn steerdns(args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new(BIN);
    c.args(args);
    c
}

/// What a finished command printed: its standard output, then its standard error.
pub fn printed(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

/// Rewrites the file at `path` (a policy, a zone), replacing the first `from` with
/// `to`; `from` must be there.
pub fn edit(path: &std::path::Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{from:?} not in {}", path.display());
    std::fs::write(path, text.replacen(from, to, 1)).unwrap();
}

/// The MaxMind test database used by most tests (GB 81.2.69.x, US 216.160.83.x, JP 2001:218::/32).
pub const TEST_GEO: &str = "tests/fixtures/geo/GeoIP2-Country-Test.mmdb";
/// The test zone: the demo zone plus records for ANY, TC and delegation tests.
pub const TEST_ZONES: &str = "tests/fixtures/zones";
/// The demo policy shipped at the repository root.
pub const DEMO_POLICY: &str = "steering.yaml";
/// Several steered names, each region pinned to one CDN.
pub const MULTI_POLICY: &str = "tests/fixtures/steering-multi.yaml";

pub const FASTLY: &str = "example.map.fastly.net.";
pub const CLOUDFLARE: &str = "example.cdn.cloudflare.net.";

/// A running server; stopped when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    pub running: Running,
}

impl TestServer {
    /// The demo policy with the test zone and test geo database, on 127.0.0.1.
    pub async fn demo() -> TestServer {
        TestServer::start(DEMO_POLICY, TEST_ZONES, TEST_GEO, "127.0.0.1:0").await
    }

    /// The multi-name policy.
    pub async fn multi() -> TestServer {
        TestServer::start(MULTI_POLICY, TEST_ZONES, TEST_GEO, "127.0.0.1:0").await
    }

    pub async fn start(policy: &str, zones: &str, geo: &str, listen: &str) -> TestServer {
        let loaded = load_fixture(policy, zones, geo);
        let running = app::start(planner::snapshot(&loaded), &[listen.parse().unwrap()])
            .await
            .expect("bind loopback");
        TestServer {
            addr: running.addrs()[0],
            running,
        }
    }

    /// The demo server with listener options other than the defaults.
    pub async fn demo_with(opts: &app::DnsOptions) -> TestServer {
        let loaded = load_fixture(DEMO_POLICY, TEST_ZONES, TEST_GEO);
        let running = app::start_with_options(
            planner::snapshot(&loaded),
            &["127.0.0.1:0".parse().unwrap()],
            Metrics::new(),
            opts,
        )
        .await
        .expect("bind loopback");
        TestServer {
            addr: running.addrs()[0],
            running,
        }
    }

    /// As [`TestServer::start`], counting answers into `metrics`.
    pub async fn start_with_metrics(
        policy: &str,
        zones: &str,
        geo: &str,
        listen: &str,
        metrics: Metrics,
    ) -> TestServer {
        let loaded = load_fixture(policy, zones, geo);
        let running = app::start_with(
            planner::snapshot(&loaded),
            &[listen.parse().unwrap()],
            2,
            metrics,
        )
        .await
        .expect("bind loopback");
        TestServer {
            addr: running.addrs()[0],
            running,
        }
    }

    pub async fn ask(&self, proto: Proto, msg: &Message) -> Message {
        ask(self.addr, proto, msg).await
    }

    /// As [`TestServer::ask`], sent from the loopback address `from` (a resolver).
    pub async fn ask_from(&self, from: IpAddr, proto: Proto, msg: &Message) -> Message {
        ask_from(self.addr, from, proto, msg).await
    }

    /// The CNAME target of a steered answer (panics if the answer is not one CNAME).
    pub async fn cname(&self, proto: Proto, msg: &Message) -> String {
        cname_of(&self.ask(proto, msg).await)
    }
}

pub fn load_fixture(policy: &str, zones: &str, geo: &str) -> app::Loaded {
    let inputs = Inputs {
        config: repo(policy),
        zones: repo(zones),
        geo: repo(geo),
        probes: repo("tests/fixtures/no-probes"),
        asn: None,
        api_tokens: None,
    };
    app::load(&inputs).unwrap_or_else(|e| panic!("fixture does not load: {e}"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Udp,
    Tcp,
}

pub const BOTH: [Proto; 2] = [Proto::Udp, Proto::Tcp];

/// The `i`-th of many resolvers: distinct loopback addresses in 127.64.0.0/10, away
/// from 127.0.0.0/16 where the rate-limit tests live. Answers are a consistent function
/// of the resolver (and the ECS network), so a test that measures shares asks from many
/// resolvers, as a real population does; asking one resolver n times measures nothing.
pub fn resolver(i: usize) -> IpAddr {
    let i = i as u32 % (1 << 22);
    IpAddr::V4(std::net::Ipv4Addr::from(
        (127 << 24) | (64 << 16) | (i / 254) << 8 | (i % 254 + 1),
    ))
}

/// Asserts that `count` of `n` independent draws is within 5 standard deviations of
/// `n * p`: a correct server fails one such check in about 1.7 million. (At n = 4,000,
/// five standard deviations are 4.0 points at p = 0.5 and 2.4 points at p = 0.9.)
pub fn assert_share(count: usize, n: usize, p: f64, what: &str) {
    let mean = n as f64 * p;
    let bound = 5.0 * (n as f64 * p * (1.0 - p)).sqrt();
    assert!(
        (count as f64 - mean).abs() <= bound,
        "{what}: {count} of {n}, expected {mean:.0} ± {bound:.0} (5 sd)"
    );
}

/// What a UDP client bound to `from` got back for a burst of queries.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Burst {
    /// Answers with records.
    pub answered: usize,
    /// Empty answers with TC set (rate limiting's slips).
    pub truncated: usize,
}

/// Sends `count` queries for www.example.com A back to back from one socket bound to
/// `from`, then counts the replies until none comes for 500 ms.
pub async fn burst(server: SocketAddr, from: IpAddr, count: u16) -> Burst {
    let sock = UdpSocket::bind(SocketAddr::new(from, 0))
        .await
        .expect("bind a loopback alias");
    let mut q = query("www.example.com.", RecordType::A);
    for id in 0..count {
        q.metadata.id = id;
        sock.send_to(&q.to_vec().unwrap(), server).await.unwrap();
    }
    let mut got = Burst::default();
    let mut buf = vec![0u8; 4096];
    while let Ok(Ok((n, _))) =
        tokio::time::timeout(Duration::from_millis(500), sock.recv_from(&mut buf)).await
    {
        let m = Message::from_vec(&buf[..n]).expect("decodable reply");
        if m.metadata.truncation && m.answers.is_empty() {
            got.truncated += 1;
        } else {
            got.answered += 1;
        }
    }
    got
}

/// Sends a message and decodes the answer.
pub async fn ask(addr: SocketAddr, proto: Proto, msg: &Message) -> Message {
    let from = if addr.is_ipv4() { "127.0.0.1" } else { "::1" };
    ask_from(addr, from.parse().unwrap(), proto, msg).await
}

/// Sends a message from the loopback address `from` and decodes the answer.
pub async fn ask_from(addr: SocketAddr, from: IpAddr, proto: Proto, msg: &Message) -> Message {
    let bytes = msg.to_vec().expect("encode query");
    let reply = raw_from(addr, from, proto, &bytes, Duration::from_secs(2))
        .await
        .unwrap_or_else(|| panic!("no answer over {proto:?} to {:?}", msg.queries));
    let answer = Message::from_vec(&reply).expect("decode answer");
    assert_eq!(answer.metadata.id, msg.metadata.id, "answer id");
    answer
}

/// Sends raw bytes; the raw reply, or `None` if none came within 2 s.
pub async fn raw(addr: SocketAddr, proto: Proto, bytes: &[u8]) -> Option<Vec<u8>> {
    raw_within(addr, proto, bytes, Duration::from_secs(2)).await
}

/// Sends raw bytes and waits `wait` for the reply (shorter waits for inputs that must
/// get none).
pub async fn raw_within(
    addr: SocketAddr,
    proto: Proto,
    bytes: &[u8],
    wait: Duration,
) -> Option<Vec<u8>> {
    let from = if addr.is_ipv4() { "127.0.0.1" } else { "::1" };
    raw_from(addr, from.parse().unwrap(), proto, bytes, wait).await
}

/// Sends raw bytes from the loopback address `from` and waits `wait` for the reply.
pub async fn raw_from(
    addr: SocketAddr,
    from: IpAddr,
    proto: Proto,
    bytes: &[u8],
    wait: Duration,
) -> Option<Vec<u8>> {
    let bind = SocketAddr::new(from, 0);
    let io = async {
        match proto {
            Proto::Udp => {
                let sock = UdpSocket::bind(bind).await.ok()?;
                sock.send_to(bytes, addr).await.ok()?;
                let mut buf = vec![0u8; 65535];
                let (n, _) = sock.recv_from(&mut buf).await.ok()?;
                buf.truncate(n);
                Some(buf)
            }
            Proto::Tcp => {
                let socket = match from {
                    IpAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
                    IpAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
                }
                .ok()?;
                socket.bind(bind).ok()?;
                let mut s = socket.connect(addr).await.ok()?;
                s.write_all(&framed(bytes)).await.ok()?;
                read_frame(&mut s).await
            }
        }
    };
    tokio::time::timeout(wait, io).await.ok().flatten()
}

/// One length-prefixed DNS message from a TCP stream.
pub async fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.ok()?;
    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut buf).await.ok()?;
    Some(buf)
}

/// Raises this process's open-file limit towards its hard limit (at most 8,192), for
/// tests that hold hundreds of sockets, client and server side, in one process.
pub fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max.min(8192);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Opens `n` TCP connections from `from` to `server` and keeps them.
pub async fn hold(server: SocketAddr, from: &str, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
        held.push(sock.connect(server).await.expect("connect"));
    }
    held
}

/// Whether dig is here (it fails the test under CI when not).
pub fn require_dig(test: &str) -> bool {
    if etcd::have("dig") {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: dig is required in CI (apt-get install -y dnsutils)");
    }
    eprintln!("SKIPPED {test}: dig not installed (apt-get install -y dnsutils)");
    false
}

/// The CNAME of `name` that `dns` answers to each query, as an operator measures it:
/// one `dig -f` batch (written in `dir`), each query from its own resolver address
/// (`-b`, a 127/8 address) with its ECS subnet if any (`+subnet`). Panics unless every
/// query got a CNAME.
pub async fn dig_cnames(
    dns: SocketAddr,
    dir: &std::path::Path,
    name: &str,
    queries: &[(IpAddr, Option<String>)],
) -> Vec<String> {
    let batch = dir.join("dig-batch.txt");
    let lines: String = queries
        .iter()
        .map(|(from, subnet)| {
            let ecs = subnet
                .as_ref()
                .map_or(String::new(), |s| format!(" +subnet={s}"));
            format!("-b {from} {name} CNAME +short +time=2 +tries=2{ecs}\n")
        })
        .collect();
    std::fs::write(&batch, lines).unwrap();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("dig")
            .arg(format!("@{}", dns.ip()))
            .args(["-p", &dns.port().to_string(), "-f"])
            .arg(&batch)
            .output()
            .expect("dig runs")
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let cnames: Vec<String> = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with(';'))
        .map(str::to_string)
        .collect();
    assert_eq!(cnames.len(), queries.len(), "dig: {text}");
    cnames
}
