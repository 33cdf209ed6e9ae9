//! Bounded per connection, per prefix and per input, tried as an attacker would over
//! real sockets on loopback (clients on loopback aliases: all of 127.0.0.0/8 is local
//! on Linux): the DNS-over-TCP pipelining amplification against the release binary,
//! the admin API's per-/24 connection cap, times too late to print, and `Host` checks
//! against DNS rebinding.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::stack::*;
use common::*;
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::{RData, RecordType};
use serde_json::json;
use steerdns::control::surfaces::api::{self, ApiLimits, ApiState};
use steerdns::control::tasks::prober::Local;
use steerdns::metrics::Metrics;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

// === DNS over TCP: pipelined queries for large answers ===

/// The release binary serving `dir`'s zones (the demo policy) on ephemeral loopback
/// ports; stopped by its PID when dropped.
struct Binary {
    child: Child,
    dns: SocketAddr,
}

impl Binary {
    fn start(dir: &Path, geo: &str, extra: &[&str]) -> Binary {
        let mut child = Command::new("sh")
            .current_dir(repo("."))
            .arg("-c")
            .arg("ulimit -n 4096 && exec \"$0\" \"$@\"")
            .arg(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--api", "off"])
            .args(["--steering-http", "off", "--geo", geo, "--zones"])
            .arg(dir.join("zones"))
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(extra)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn steerdns");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening (udp, tcp)") {
                    if let Some(addr) = line.split("addr=").nth(1) {
                        let _ = tx.send(addr.split_whitespace().next().unwrap().to_string());
                    }
                }
            }
        });
        let mut served = Binary {
            child,
            dns: "0.0.0.0:0".parse().unwrap(),
        };
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("no `listening (udp, tcp)` line from steerdns serve");
        served.dns = addr.parse().unwrap();
        served
    }

    /// A field of `/proc/PID/status` in kB.
    fn status_kb(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{field} not in /proc/PID/status"))
    }

    /// User and system CPU time so far, in clock ticks.
    fn cpu_ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Strings of a TXT record about 4 KB long.
const TXT_STRINGS: usize = 64;

/// A scratch directory with the test zone plus `txt4k.example.com`, a 4 KB TXT record.
fn zones_with_a_large_txt(tag: &str) -> std::path::PathBuf {
    let dir = scratch(tag);
    let strings: Vec<String> = (0..TXT_STRINGS)
        .map(|i| format!("\"large-answer-{i:02}-{}\"", "z".repeat(48)))
        .collect();
    let mut zone = std::fs::read_to_string(dir.join("zones/example.com.zone")).unwrap();
    zone.push_str(&format!("txt4k IN TXT {}\n", strings.join(" ")));
    std::fs::write(dir.join("zones/example.com.zone"), zone).unwrap();
    dir
}

fn txt4k(id: u16) -> Vec<u8> {
    encoded("txt4k.example.com.", RecordType::TXT, id)
}

/// Connections of the attack, and the queries each pipelines after its padded one.
const CONNECTIONS: usize = 64;
const PIPELINED: u16 = 1000;

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_queries_for_large_answers_hold_little_memory_and_all_are_answered() {
    raise_fd_limit();
    let dir = zones_with_a_large_txt("tcp-amplify");
    // Long enough an idle timeout that no connection is closed while the test waits
    // for the attack to reach its peak: every answer must arrive.
    let server = Binary::start(&dir, TEST_GEO, &["--tcp-idle-timeout", "120"]);
    // Warm up: the large answer over TCP, as the attack will ask it.
    let mut s = TcpStream::connect(server.dns).await.unwrap();
    s.write_all(&framed(&txt4k(7))).await.unwrap();
    let warm = Message::from_vec(&read_frame(&mut s).await.unwrap()).unwrap();
    let size = warm.to_vec().unwrap().len();
    assert!(size > 4000, "the TXT answer is {size} bytes");
    drop(s);
    let base_kb = server.status_kb("VmRSS:");
    // The peak from here on: clear the high-water mark left by loading.
    std::fs::write(format!("/proc/{}/clear_refs", server.child.id()), "5").unwrap();

    // 64 connections from three /24s (a /24 may hold 32), each sending a padded
    // 64 KiB query, then 1000 pipelined queries for the 4 KB answer, reading nothing
    // (and offering a small receive window, so that the answers stay with the server).
    let padded = framed(&raw_query_with_option(0, 12, &vec![0u8; 65_535 - 48]));
    assert_eq!(padded.len(), 65_537);
    let mut attack = padded.clone();
    for id in 1..=PIPELINED {
        attack.extend_from_slice(&framed(&txt4k(id)));
    }
    let attack = Arc::new(attack);
    let mut readers = Vec::new();
    let mut writers = Vec::new();
    for i in 0..CONNECTIONS {
        let from = format!("127.0.{}.{}", 31 + i % 3, 1 + i / 3);
        let sock = TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(8192).unwrap();
        sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
        let stream = sock.connect(server.dns).await.expect("connect");
        let (r, mut w) = stream.into_split();
        let attack = attack.clone();
        writers.push(tokio::spawn(async move {
            w.write_all(&attack).await.unwrap();
            w
        }));
        readers.push(r);
    }
    // The peak is reached once the server has answered what it can and waits for the
    // clients to read: its CPU time stops moving.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut last, mut still) = (server.cpu_ticks(), 0);
    while still < 5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = server.cpu_ticks();
        still = if now == last { still + 1 } else { 0 };
        last = now;
        assert!(Instant::now() < deadline, "the server never settled");
    }
    let peak_kb = server.status_kb("VmHWM:");
    let bound_kb = (CONNECTIONS as u64 * 256) + 16 * 1024;
    assert!(
        peak_kb.saturating_sub(base_kb) < bound_kb,
        "RSS grew from {base_kb} kB to a peak of {peak_kb} kB: more than {bound_kb} kB"
    );

    // Every answer arrives, complete and in order.
    let mut tasks = Vec::new();
    for mut r in readers {
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::with_capacity(usize::from(PIPELINED) + 1);
            for _ in 0..=PIPELINED {
                let mut len = [0u8; 2];
                r.read_exact(&mut len).await.expect("an answer's length");
                let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
                r.read_exact(&mut buf).await.expect("a whole answer");
                let m = Message::from_vec(&buf).expect("an answer that parses");
                if m.metadata.id > 0 {
                    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
                    let strings = match &m.answers[..] {
                        [a] => match &a.data {
                            RData::TXT(t) => t.txt_data.len(),
                            other => panic!("not a TXT: {other:?}"),
                        },
                        other => panic!("{} answers", other.len()),
                    };
                    assert_eq!(strings, TXT_STRINGS);
                }
                ids.push(m.metadata.id);
            }
            ids
        }));
    }
    let within = Instant::now() + Duration::from_secs(120);
    for t in tasks {
        let ids = tokio::time::timeout_at(within, t)
            .await
            .expect("answers still missing after 120 s")
            .unwrap();
        assert_eq!(ids, (0..=PIPELINED).collect::<Vec<_>>());
    }
    for w in writers {
        drop(w.await.unwrap());
    }
}

// === memory at rest ===

#[cfg(target_os = "linux")]
#[test]
fn the_demo_server_gives_back_what_its_load_freed() {
    // The shipped database (the whole Internet): its load builds tables through
    // temporaries several times their size; what is freed goes back to the system.
    let dir = scratch("at-rest");
    let server = Binary::start(&dir, "geo/country.mmdb", &["--udp-sockets", "2"]);
    // Issue 25's bounds: 40 MB at rest, 80 MB at the peak while loading (37.8 to 38.4
    // and 64 to 65.5 MB measured on 2026-12-02; 40.8 at rest before the places went to
    // 16 bits, 68.8 before the load's temporaries were given back).
    let rss_kb = server.status_kb("VmRSS:");
    let peak_kb = server.status_kb("VmHWM:");
    eprintln!("at rest: VmRSS {rss_kb} kB, VmHWM {peak_kb} kB");
    assert!(
        rss_kb <= 40_000 && peak_kb <= 80_000,
        "{rss_kb} kB resident at rest (bound 40,000), peak {peak_kb} kB while loading (bound 80,000)"
    );
}

// === the admin API: connections counted per /24 ===

struct Api {
    addr: SocketAddr,
    stop: CancellationToken,
}

impl Drop for Api {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn api(limits: ApiLimits) -> Api {
    let (tx, _rx) = tokio::sync::mpsc::channel(16);
    let state = ApiState {
        vantage: "test".into(),
        local: Local::default(),
        state: Arc::new(Mutex::new(None)),
        commands: Some(tx),
        token: None,
        tokens: Default::default(),
        metrics: Metrics::new(),
        status: None,
    };
    let stop = CancellationToken::new();
    let addr = api::spawn_with("127.0.0.1:0".parse().unwrap(), state, limits, stop.clone())
        .await
        .unwrap();
    Api { addr, stop }
}

/// A raw request from `from`; the answer's status line, empty when the server closed
/// the connection without one (or sent nothing within 5 s).
async fn get_from(addr: SocketAddr, from: &str, request: &str) -> String {
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut s = sock.connect(addr).await.unwrap();
    let _ = s.write_all(request.as_bytes()).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    text.lines().next().unwrap_or_default().to_string()
}

const STATE: &str = "GET /v1/state HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_three_addresses_of_one_24_get_the_33rd_closed_on_the_api() {
    // No reserved slots here (a loopback source past its cap could take one).
    let api = api(ApiLimits {
        reserved_for_loopback: 0,
        ..ApiLimits::default()
    })
    .await;
    let mut held = Vec::new();
    for i in 1..=32 {
        held.extend(hold(api.addr, &format!("127.0.41.{i}"), 1).await);
    }
    // Let the server accept them all (their slots are taken on accept): the 33rd
    // address of the /24 is closed at once, however long the test waits.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = get_from(api.addr, "127.0.41.33", STATE).await;
        if status.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "33rd address served: {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Another /24 is served meanwhile.
    assert_eq!(
        get_from(api.addr, "127.0.42.1", STATE).await,
        "HTTP/1.1 200 OK"
    );
    // Once one of the 32 ends, its /24 is served again.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    while get_from(api.addr, "127.0.41.33", STATE).await != "HTTP/1.1 200 OK" {
        assert!(Instant::now() < deadline, "never served again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// === Host: DNS rebinding ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_reads_answer_only_the_apis_own_names() {
    let api = api(ApiLimits {
        hosts: vec!["steerdns.example.net".into()],
        ..ApiLimits::default()
    })
    .await;
    let port = api.addr.port();
    let read = |path: &str, host: &str| {
        let (addr, request) = (
            api.addr,
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        );
        async move { get_from(addr, "127.0.0.1", &request).await }
    };
    for host in [
        format!("127.0.0.1:{port}"),
        "127.0.0.1".to_string(),
        format!("localhost:{port}"),
        "LOCALHOST.".to_string(),
        format!("steerdns.example.net:{port}"),
    ] {
        assert_eq!(read("/v1/state", &host).await, "HTTP/1.1 200 OK", "{host}");
    }
    // A name pointed at this address by someone else (DNS rebinding), another
    // address: no read.
    for host in [
        format!("rebind.attacker.example:{port}"),
        "localhost.attacker.example".to_string(),
        format!("127.0.0.2:{port}"),
        format!("[::1]:{port}"),
    ] {
        for path in ["/v1/state", "/metrics", "/", "/v1/observations"] {
            assert_eq!(
                read(path, &host).await,
                "HTTP/1.1 421 Misdirected Request",
                "{host}{path}"
            );
        }
    }
    // A liveness check says nothing: any Host.
    assert_eq!(
        read("/healthz", "rebind.attacker.example").await,
        "HTTP/1.1 200 OK"
    );
}

// === times too late to print ===

/// The status of the status page (`GET /`).
async fn status_page(stack: &Stack) -> u16 {
    let page = stack.http.get(format!("http://{}/", stack.api)).send();
    page.await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_ending_after_the_year_9999_is_refused() {
    let dir = scratch("late-drain");
    policy(&dir, "[100]", 0.2);
    let stack = Stack::start(&dir).await;
    for body in [
        json!({"name": "www.example.com", "cdn": "a", "reason": "x", "ttl_seconds": 300_000_000_000u64}),
        json!({"name": "www.example.com", "cdn": "a", "reason": "x", "ttl_seconds": 253_402_300_800u64}),
    ] {
        let (status, answer) = stack.post("/v1/drains", body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains("9999-12-31"),
            "{answer}"
        );
    }
    // The status page still renders (nothing was kept).
    assert_eq!(status_page(&stack).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_state_with_a_time_too_late_to_print_is_refused_not_rendered() {
    let dir = scratch("late-state");
    policy(&dir, "[100]", 0.2);
    std::fs::create_dir_all(dir.join("state")).unwrap();
    let now = steerdns::clock::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // What a hand edit (or an older build) may leave: a drain until 300,000,000,000 s
    // from now.
    let saved = json!({
        "saved_unix_ms": now,
        "health": {},
        "steps": [],
        "overrides": [{
            "id": "api-1-1", "name": "www.example.com.", "cdn": "a", "scope": [],
            "reason": "hand-written", "until_unix_ms": now + 300_000_000_000_000u64,
            "immediate": true
        }],
        "drains": []
    });
    std::fs::write(
        dir.join("state/steerdns-state.json"),
        serde_json::to_vec(&saved).unwrap(),
    )
    .unwrap();
    // `explain` reads it: a warning naming the file, the configured weights.
    let out = steerdns(&["explain", "www.example.com", "--client", "192.0.2.1"])
        .args(stack_inputs(&dir))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("steerdns-state.json") && stderr.contains("9999-12-31"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("hand-written"));
    // `serve` sets it aside and serves; the status page renders.
    let stack = Stack::start(&dir).await;
    assert_eq!(status_page(&stack).await, 200);
    let s = stack.state().await;
    assert!(!s["drains"].to_string().contains("hand-written"), "{s:#}");
    let aside = std::fs::read_dir(dir.join("state"))
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| e.file_name().to_string_lossy().contains(".corrupt-"));
    assert!(aside, "the refused state is kept aside");
}

// === the answer cache: a byte budget ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_cache_keeps_to_its_byte_budget() {
    use steerdns::dns::cache::{AnswerCache, Lookup};
    let srv = TestServer::demo().await;
    let snap = srv.running.live().load_full();
    const BUDGET: usize = 32 * 1024;
    let mut cache = AnswerCache::new(BUDGET);
    let (mut out, mut stripped) = (Vec::new(), Vec::new());
    let mut stored = 0;
    // Unique names, as a flood would send them: each answer is cached, none is asked
    // twice, and the cache never holds more than its budget.
    for i in 0..2000u16 {
        let mut q = query(&format!("n{i}.nx.example.com."), RecordType::A);
        q.metadata.id = i;
        let packet = q.to_vec().unwrap();
        let Lookup::Miss(miss) = cache.lookup(&snap, &packet, &mut out, &mut stripped, None) else {
            panic!("n{i}: not a miss");
        };
        let answer = raw(srv.addr, Proto::Udp, &stripped)
            .await
            .expect("an answer");
        assert!(cache.store(miss, &answer, &mut out));
        stored += answer.len();
        assert!(
            cache.bytes() <= BUDGET,
            "{} bytes after n{i}",
            cache.bytes()
        );
        // The last answer stored is replayed.
        assert!(matches!(
            cache.lookup(&snap, &packet, &mut out, &mut stripped, None),
            Lookup::Hit(3)
        ));
    }
    assert!(stored > 4 * BUDGET, "only {stored} bytes of answers");
    // The cache does not hold its snapshot: a UDP thread that goes idle after a reload
    // must not keep the replaced plan alive (each one pinned a plan in the soak).
    let fresh = srv.running.live().load_full();
    let held = Arc::strong_count(&fresh);
    let mut idle = AnswerCache::new(BUDGET);
    let packet = query("idle.nx.example.com.", RecordType::A)
        .to_vec()
        .unwrap();
    let _ = idle.lookup(&fresh, &packet, &mut out, &mut stripped, None);
    assert_eq!(
        Arc::strong_count(&fresh),
        held,
        "the answer cache holds a strong reference to its snapshot"
    );
    // A budget of 0 caches nothing.
    let mut none = AnswerCache::new(0);
    let packet = query("www2.nx.example.com.", RecordType::A)
        .to_vec()
        .unwrap();
    let Lookup::Miss(miss) = none.lookup(&snap, &packet, &mut out, &mut stripped, None) else {
        panic!("not a miss");
    };
    let answer = raw(srv.addr, Proto::Udp, &stripped).await.unwrap();
    assert!(none.store(miss, &answer, &mut out));
    assert_eq!(none.bytes(), 0);
    assert!(matches!(
        none.lookup(&snap, &packet, &mut out, &mut stripped, None),
        Lookup::Miss(_)
    ));
}

// === crafted geo and ASN databases ===

/// A MaxMind DB written by hand: 24-bit records, the tree `nodes` (left, right), one
/// data record `record` (a record value of `nodes.len() + 16` points at it), metadata.
fn mmdb(nodes: &[(u32, u32)], ip_version: u16, database_type: &str, record: &[u8]) -> Vec<u8> {
    let text = |b: &mut Vec<u8>, s: &str| {
        b.push(0x40 | s.len() as u8);
        b.extend_from_slice(s.as_bytes());
    };
    let uint16 = |b: &mut Vec<u8>, v: u16| {
        b.push(0xa2);
        b.extend_from_slice(&v.to_be_bytes());
    };
    let mut b = Vec::new();
    for &(l, r) in nodes {
        b.extend_from_slice(&l.to_be_bytes()[1..]);
        b.extend_from_slice(&r.to_be_bytes()[1..]);
    }
    b.extend_from_slice(&[0; 16]);
    b.extend_from_slice(record);
    b.extend_from_slice(b"\xab\xcd\xefMaxMind.com");
    b.push(0xe9); // a map of 9
    text(&mut b, "binary_format_major_version");
    uint16(&mut b, 2);
    text(&mut b, "binary_format_minor_version");
    uint16(&mut b, 0);
    text(&mut b, "build_epoch");
    b.extend_from_slice(&[0x08, 0x02, 0, 0, 0, 0, 0, 0, 0, 0]); // uint64 0
    text(&mut b, "database_type");
    text(&mut b, database_type);
    text(&mut b, "description");
    b.push(0xe0); // an empty map
    text(&mut b, "ip_version");
    uint16(&mut b, ip_version);
    text(&mut b, "languages");
    b.extend_from_slice(&[0x00, 0x04]); // an empty array
    text(&mut b, "node_count");
    b.push(0xc4);
    b.extend_from_slice(&(nodes.len() as u32).to_be_bytes());
    text(&mut b, "record_size");
    uint16(&mut b, 24);
    b
}

/// `{"country": {"iso_code": "US"}}`
const COUNTRY_US: &[u8] = b"\xe1\x47country\xe1\x48iso_code\x42US";
/// `{"autonomous_system_number": 13335}`
const AS13335: &[u8] = b"\xe1\x58autonomous_system_number\xc2\x34\x17";

/// `steerdns check` with `args` (from the repository, the demo's inputs), stopped by
/// its PID if it runs for more than 10 s: (exit status, `None` if stopped; output).
fn check_within(args: &[&str]) -> (Option<bool>, String) {
    let started = std::time::Instant::now();
    let mut child = steerdns(&["check"])
        .current_dir(repo("."))
        .args([
            "--zones",
            TEST_ZONES,
            "--probes",
            "tests/fixtures/no-probes",
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status.success());
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (status, text)
}

#[test]
fn crafted_databases_whose_walk_explodes_are_refused_at_once() {
    let dir = scratch("crafted-mmdb");
    // A geo database whose nodes share children: 24 nodes, 2^24 networks of /24.
    let shared: Vec<(u32, u32)> = (0..24u32)
        .map(|i| {
            if i < 23 {
                (i + 1, i + 1)
            } else {
                (24 + 16, 24 + 16)
            }
        })
        .collect();
    let geo = dir.join("shared.mmdb");
    std::fs::write(&geo, mmdb(&shared, 4, "GeoLite2-Country", COUNTRY_US)).unwrap();
    assert!(std::fs::metadata(&geo).unwrap().len() < 512);
    // An ASN database (IPv6) whose 100 nodes share children: 2^100 networks of /100;
    // and one whose two nodes point at each other, both sides: 2^128 paths.
    let shared_v6: Vec<(u32, u32)> = (0..100u32)
        .map(|i| {
            if i < 99 {
                (i + 1, i + 1)
            } else {
                (100 + 16, 100)
            }
        })
        .collect();
    let asn = dir.join("shared-asn.mmdb");
    std::fs::write(&asn, mmdb(&shared_v6, 6, "GeoLite2-ASN", AS13335)).unwrap();
    let looping = dir.join("looping-asn.mmdb");
    std::fs::write(
        &looping,
        mmdb(&[(1, 1), (0, 0)], 6, "GeoLite2-ASN", AS13335),
    )
    .unwrap();
    // A sound one built the same way loads: 0/1 -> US, 128/1 -> nothing.
    let sound = dir.join("sound.mmdb");
    let one = [(1, 2), (3 + 16, 3), (3, 3)];
    std::fs::write(&sound, mmdb(&one, 4, "GeoLite2-Country", COUNTRY_US)).unwrap();

    let (ok, out) = check_within(&["--geo", sound.to_str().unwrap()]);
    assert_eq!(ok, Some(true), "{out}");
    for (flag, file) in [("--geo", &geo), ("--asn-db", &asn), ("--asn-db", &looping)] {
        let (ok, out) = check_within(&[flag, file.to_str().unwrap()]);
        // `None`: still walking after 10 s, stopped.
        assert_eq!(ok, Some(false), "{flag}: {out}");
        assert!(
            out.contains(file.to_str().unwrap()) && out.contains("share children or loop"),
            "{flag}: {out}"
        );
    }
}
