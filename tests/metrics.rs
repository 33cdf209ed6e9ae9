//! Metrics end to end: queries over UDP are counted by name, region, CDN and rcode
//! exactly as they were answered, and timed; `/metrics` on the API serves the text
//! format with the answers and every probe round.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use common::mock_cdn::{MockCdn, Mode};
use common::stack::*;
use common::*;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use serde_json::json;
use steerdns::metrics::Metrics;
use tokio::time::Instant;

/// One sample of the text format.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the Prometheus text format (the subset `TextEncoder` writes).
fn parse(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line.rsplit_once(' ').expect("sample line has a value");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value: {line}"));
        let (name, mut rest) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.strip_suffix('}').expect("labels end")),
            None => (series, ""),
        };
        let mut labels = BTreeMap::new();
        while !rest.is_empty() {
            let (key, after) = rest.split_once("=\"").expect("label key");
            let mut val = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                match chars.next().expect("closing quote") {
                    (_, '\\') => val.push(chars.next().expect("escaped char").1),
                    (i, '"') => break i,
                    (_, c) => val.push(c),
                }
            };
            labels.insert(key.to_string(), val);
            rest = after[end + 1..].trim_start_matches(',');
        }
        out.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    out
}

/// The value of the series with exactly these labels.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && s.labels.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
}

/// The sum of the series whose labels include these.
fn sum(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

fn text_of(m: &Metrics) -> String {
    String::from_utf8(m.encode().expect("encode")).expect("utf-8")
}

/// The handler counts after it has sent, so the last answer can arrive a moment before
/// its count: waits until `n` queries have been timed (2 s at most).
async fn settled(m: &Metrics, n: f64) -> Vec<Sample> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let samples = parse(&text_of(m));
        let timed = value(&samples, "steerdns_query_duration_seconds_count", &[]).unwrap_or(0.0);
        if timed >= n || Instant::now() > deadline {
            return samples;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

const GB_REGION: &str = "GB,IE,DE,FR,NL,ES,IT";
const JP_REGION: &str = "AU,NZ,SG,JP";
const WWW: &str = "www.example.com.";

fn cdn_of(target: &str) -> &'static str {
    match target {
        FASTLY => "fastly",
        CLOUDFLARE => "cloudflare",
        other => panic!("unexpected CNAME target {other}"),
    }
}

/// The demo server on 127.0.0.1, counting into `metrics`.
async fn demo_counting_into(metrics: &Metrics) -> TestServer {
    TestServer::start_with_metrics(
        DEMO_POLICY,
        TEST_ZONES,
        TEST_GEO,
        "127.0.0.1:0",
        metrics.clone(),
    )
    .await
}

#[tokio::test]
async fn answers_are_counted_by_name_region_cdn_and_rcode() {
    let metrics = Metrics::new();
    let srv = demo_counting_into(&metrics).await;

    // Steered: 200 clients in GB, 100 in JP, each through another resolver; what each
    // answer was, by (region, cdn).
    let mut steered: HashMap<(&str, &str), u64> = HashMap::new();
    for (addr, source, region, n) in [
        ("81.2.69.160", 27, GB_REGION, 200),
        ("2001:218::", 32, JP_REGION, 100),
    ] {
        let q = query_edns(WWW, RecordType::A, Some((addr, source)));
        for i in 0..n {
            let cdn = cdn_of(&cname_of(&srv.ask_from(resolver(i), Proto::Udp, &q).await));
            *steered.entry((region, cdn)).or_default() += 1;
        }
    }

    // Not steered: zone data, NXDOMAIN, REFUSED, BADVERS (also for the steered name:
    // it is refused before steering), FORMERR.
    let others = [
        ("mail.example.com.", ResponseCode::NoError, 2, 0u8),
        ("nope.example.com.", ResponseCode::NXDomain, 3, 0),
        ("www.example.org.", ResponseCode::Refused, 2, 0),
        ("example.com.", ResponseCode::BADVERS, 1, 1),
        (WWW, ResponseCode::BADVERS, 1, 1),
    ];
    for (name, rcode, n, edns_version) in others {
        let mut q = query_edns(name, RecordType::A, None);
        q.edns.as_mut().unwrap().set_version(edns_version);
        for _ in 0..n {
            let m = srv.ask(Proto::Udp, &q).await;
            assert_eq!(
                u16::from(m.metadata.response_code),
                u16::from(rcode),
                "{name}"
            );
        }
    }
    // An ECS option with address bits set past its prefix (81.2.77.0/22): FORMERR from
    // our handler. (A packet hickory cannot decode at all is answered FORMERR by hickory
    // itself, before any handler, and is not counted.)
    let formerr = raw(
        srv.addr,
        Proto::Udp,
        &raw_query_with_option(77, 8, &[0, 1, 22, 0, 81, 2, 77]),
    )
    .await
    .expect("an answer to a bad ECS option");
    assert_eq!(raw_rcode(&formerr), 1);

    let total = 300 + 2 + 3 + 2 + 2 + 1;
    let s = settled(&metrics, total as f64).await;
    let q = "steerdns_queries_total";

    // Each steered series holds exactly the answers given with that CDN in that region.
    for region in [GB_REGION, JP_REGION] {
        for cdn in ["fastly", "cloudflare"] {
            let answered = steered.get(&(region, cdn)).copied().unwrap_or(0) as f64;
            let counted = value(
                &s,
                q,
                &[
                    ("name", WWW),
                    ("region", region),
                    ("cdn", cdn),
                    ("rcode", "NOERROR"),
                ],
            )
            .unwrap_or(0.0);
            assert_eq!(counted, answered, "{region} / {cdn}");
        }
    }
    // Per CDN, the series add up to the CDN's answers, and all of them to 300.
    for cdn in ["fastly", "cloudflare"] {
        let answered: u64 = steered
            .iter()
            .filter(|((_, c), _)| *c == cdn)
            .map(|(_, n)| n)
            .sum();
        assert_eq!(sum(&s, q, &[("name", WWW), ("cdn", cdn)]), answered as f64);
    }
    assert_eq!(sum(&s, q, &[("name", WWW)]), 300.0);
    // The answers counted are the weighted ones: GB 90 % fastly, JP 10 %.
    for (region, n, p) in [(GB_REGION, 200, 0.9), (JP_REGION, 100, 0.1)] {
        let fastly = steered.get(&(region, "fastly")).copied().unwrap_or(0);
        assert_share(fastly as usize, n, p, region);
    }

    // Everything else by rcode, with empty name, region and CDN.
    for (rcode, n) in [
        ("NOERROR", 2.0),
        ("NXDOMAIN", 3.0),
        ("REFUSED", 2.0),
        ("BADVERS", 2.0),
        ("FORMERR", 1.0),
        ("SERVFAIL", 0.0),
        ("NOTIMP", 0.0),
    ] {
        let labels = [("name", ""), ("region", ""), ("cdn", ""), ("rcode", rcode)];
        assert_eq!(value(&s, q, &labels), Some(n), "rcode {rcode}");
    }
    assert_eq!(sum(&s, q, &[]), total as f64, "every answer once");

    // Every query was timed, and each took less than a second.
    let h = "steerdns_query_duration_seconds";
    assert_eq!(value(&s, &format!("{h}_count"), &[]), Some(total as f64));
    assert_eq!(
        value(&s, &format!("{h}_bucket"), &[("le", "+Inf")]),
        Some(total as f64)
    );
    let sum_seconds = value(&s, &format!("{h}_sum"), &[]).unwrap();
    assert!(
        sum_seconds > 0.0 && sum_seconds < total as f64,
        "{sum_seconds}"
    );
}

#[tokio::test]
async fn udp_datagrams_dropped_unanswered_are_counted() {
    let metrics = Metrics::new();
    let srv = demo_counting_into(&metrics).await;
    let dropped = |reason: &str| {
        value(
            &parse(&text_of(&metrics)),
            "steerdns_udp_dropped_total",
            &[("reason", reason)],
        )
    };
    assert_eq!(dropped("oversized"), Some(0.0));
    // Three datagrams over the 4,096-byte limit: a query padded with an unknown option,
    // and plain junk. None is answered, each is counted.
    let mut padded = query_edns(WWW, RecordType::A, None).to_vec().unwrap();
    padded.truncate(padded.len() - 11); // drop the OPT; add one with a 5,000-byte option
    padded[11] = 1;
    padded.extend_from_slice(&opt_record(1232, false, &[(65001, &[0x5a; 5_000])]));
    for bytes in [padded, vec![0u8; 4_097], vec![0xffu8; 9_000]] {
        let got = raw_within(srv.addr, Proto::Udp, &bytes, Duration::from_millis(300)).await;
        assert!(got.is_none(), "{} bytes answered", bytes.len());
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while dropped("oversized") != Some(3.0) {
        assert!(
            Instant::now() < deadline,
            "oversized drops: {:?}",
            dropped("oversized")
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for reason in ["bad-source", "send-error", "send-timeout"] {
        assert_eq!(dropped(reason), Some(0.0), "{reason}");
    }
    // 4,096 bytes is not over the limit: answered (FORMERR: trailing junk after the
    // question), not dropped.
    let mut at_limit = query(WWW, RecordType::A).to_vec().unwrap();
    at_limit.resize(4_096, 0);
    assert!(raw(srv.addr, Proto::Udp, &at_limit).await.is_some());
    assert_eq!(dropped("oversized"), Some(3.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_serves_metrics_with_answers_and_every_probe_round() {
    let dir = scratch("metrics");
    let (a, b, c) = (
        MockCdn::start(Mode::Healthy).await,
        MockCdn::start(Mode::Status(503)).await,
        MockCdn::start(Mode::Healthy).await,
    );
    policy(&dir, "[50, 100]", 0.5);
    probe(&dir, "a", &a.url("/_health/v1.txt"), 1);
    probe(&dir, "b", &b.url("/_health/v1.txt"), 1);
    probe(&dir, "c", &c.url("/_health/v1.txt"), 1);
    let stack = Stack::start(&dir).await;
    stack.rounds("a", 2).await;
    stack.rounds("b", 2).await;

    let (answers, _) = stack.answers(20).await;

    let url = format!("http://{}/metrics", stack.api);
    let get = || async {
        let r = stack.http.get(&url).send().await.expect("GET /metrics");
        assert_eq!(r.status(), 200);
        assert_eq!(
            r.headers()["content-type"].to_str().unwrap(),
            "text/plain; version=0.0.4"
        );
        parse(&r.text().await.unwrap())
    };
    // Wait for the last answer's count (the handler counts after sending).
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut s = get().await;
    while value(&s, "steerdns_query_duration_seconds_count", &[]) != Some(20.0) {
        assert!(Instant::now() < deadline, "20 queries never all timed");
        tokio::time::sleep(Duration::from_millis(5)).await;
        s = get().await;
    }

    // The answers, by CDN, as the resolver saw them.
    let q = "steerdns_queries_total";
    for cdn in ["a", "b"] {
        let answered = answers.get(cdn).copied().unwrap_or(0) as f64;
        let labels = [
            ("name", WWW),
            ("region", "default"),
            ("cdn", cdn),
            ("rcode", "NOERROR"),
        ];
        assert_eq!(value(&s, q, &labels).unwrap_or(0.0), answered, "cdn {cdn}");
    }
    assert_eq!(sum(&s, q, &[]), 20.0);

    // Every probe round counted once: between the round counters read before and after.
    let p = "steerdns_probe_results_total";
    let before = (stack.round("a").await, stack.round("b").await);
    let s = get().await;
    let after = (stack.round("a").await, stack.round("b").await);
    let rounds_a = sum(&s, p, &[("cdn", "a"), ("vantage", "test")]);
    let rounds_b = sum(&s, p, &[("cdn", "b"), ("vantage", "test")]);
    assert!(
        (before.0 as f64..=after.0 as f64).contains(&rounds_a),
        "a: {rounds_a} counted, rounds {before:?}..{after:?}"
    );
    assert!(
        (before.1 as f64..=after.1 as f64).contains(&rounds_b),
        "b: {rounds_b} counted, rounds {before:?}..{after:?}"
    );
    // b answers 503 every time: every round is a `status` failure.
    let status_b = value(
        &s,
        p,
        &[("cdn", "b"), ("vantage", "test"), ("result", "status")],
    );
    assert_eq!(status_b, Some(rounds_b));
    assert!(rounds_b >= 2.0);
    let ok_a = value(
        &s,
        p,
        &[("cdn", "a"), ("vantage", "test"), ("result", "ok")],
    );
    assert!(ok_a.is_some_and(|n| n >= 1.0), "{ok_a:?}");

    // The configuration served, and the per-CDN counters created at start.
    let version = stack.state().await["config_version"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        value(&s, "steerdns_config_info", &[("version", &version)]),
        Some(1.0)
    );
    assert_eq!(sum(&s, "steerdns_config_info", &[]), 1.0);
    assert_eq!(
        value(
            &s,
            "steerdns_health_transitions_total",
            &[("cdn", "a"), ("to", "down")]
        ),
        Some(0.0)
    );

    // The same registry is reachable from the Service, for the controller wiring.
    let direct = parse(&text_of(&stack.svc.metrics));
    assert_eq!(sum(&direct, q, &[]), 20.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_counts_its_probe_rounds_by_reason_class() {
    let dir = scratch("metrics-agent");
    let cdns = [
        ("a", MockCdn::start(Mode::Healthy).await, "http", "ok"),
        ("b", MockCdn::start(Mode::Refused).await, "http", "connect"),
        ("c", MockCdn::start(Mode::ErrorPage).await, "http", "body"),
        (
            "d",
            MockCdn::start(Mode::Status(503)).await,
            "http",
            "status",
        ),
        ("e", MockCdn::start(Mode::BadTls).await, "https", "tls"),
    ];
    for (cdn, mock, scheme, _) in &cdns {
        let url = format!("{scheme}://{}/_health/v1.txt", mock.addr());
        probe(&dir, cdn, &url, 1);
    }
    let (probes, _) = steerdns::config::probes::load_dir(&dir.join("probes"), None).unwrap();
    let agent = steerdns::app::agent(probes, "127.0.0.1:0".parse().unwrap(), "agent1".into())
        .await
        .unwrap();

    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let p = "steerdns_probe_results_total";
    let deadline = Instant::now() + Duration::from_secs(10);
    let s = loop {
        let text = get_text(&http, agent.api, "/metrics").await;
        let s = parse(&text);
        if cdns
            .iter()
            .all(|(cdn, ..)| sum(&s, p, &[("cdn", cdn)]) >= 2.0)
        {
            break s;
        }
        assert!(Instant::now() < deadline, "rounds missing:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Each CDN fails (or passes) the same way every round: one result label each.
    for (cdn, _, _, class) in &cdns {
        let all = sum(&s, p, &[("cdn", cdn), ("vantage", "agent1")]);
        let labels = [("cdn", *cdn), ("vantage", "agent1"), ("result", *class)];
        assert_eq!(value(&s, p, &labels), Some(all), "{cdn}: expected {class}");
    }
    // An agent answers no DNS.
    assert_eq!(sum(&s, "steerdns_queries_total", &[]), 0.0);
    assert_eq!(parse(&text_of(&agent.metrics)).len(), s.len());
}

/// Steered answers are counted in the plan that gave them. A drain publishes a new plan,
/// and so does its removal; the counters carry on where they were: every answer once,
/// never going back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steered_counts_carry_over_into_new_plans() {
    let (stack, _a, _b, _c) = healthy_stack("metrics-plans", "[50, 100]", 60.0).await;
    let series = |cdn: &str| {
        format!(
            r#"steerdns_queries_total{{cdn="{cdn}",name="www.example.com.",rcode="NOERROR",region="default"}}"#
        )
    };
    // The handler counts after sending: wait for the counts to reach what was answered.
    let counted = |want: (usize, usize)| {
        let stack = &stack;
        async move {
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                let a = stack.metric(&series("a")).await.unwrap_or(-1.0);
                let b = stack.metric(&series("b")).await.unwrap_or(-1.0);
                if (a, b) == (want.0 as f64, want.1 as f64) {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "counted {a}, {b}; answered {want:?}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    // Both series exist before any answer.
    counted((0, 0)).await;
    let (first, _) = stack.answers(40).await;
    let (a, b) = (
        first.get("a").copied().unwrap_or(0),
        first.get("b").copied().unwrap_or(0),
    );
    assert_eq!(a + b, 40);
    counted((a, b)).await;

    let drain = json!({ "name": "www.example.com", "cdn": "a", "reason": "INC-2", "immediate": true, "ttl_seconds": 600 });
    let (status, rule) = stack.post("/v1/drains", drain).await;
    assert_eq!(status, 201, "{rule}");
    let (second, _) = stack.answers(30).await;
    assert_eq!(second.get("b"), Some(&30), "a is drained: {second:?}");
    counted((a, b + 30)).await;

    let id = rule["id"].as_str().unwrap();
    let status = stack.undrain(id).await;
    assert_eq!(status, 200);
    let (third, _) = stack.answers(20).await;
    let a3 = third.get("a").copied().unwrap_or(0);
    counted((a + a3, b + 30 + third.get("b").copied().unwrap_or(0))).await;
}

/// The open-file limit the binary is started with.
const MAX_FDS: u32 = 1537;

/// The real binary, serving the demo on ephemeral loopback ports; killed when dropped.
struct Binary {
    child: std::process::Child,
    api: std::net::SocketAddr,
    dns: std::net::SocketAddr,
}

impl Binary {
    fn start(state: &std::path::Path) -> Binary {
        use std::io::{BufRead, BufReader};
        // A file limit of its own (`MAX_FDS`), so that its process metrics cannot be
        // mistaken for the test's.
        let mut child = std::process::Command::new("sh")
            .current_dir(repo("."))
            .arg("-c")
            .arg(format!("ulimit -n {MAX_FDS} && exec \"$0\" \"$@\""))
            .arg(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--api", "127.0.0.1:0"])
            // Not the default 127.0.0.1:8053, which another test or server may hold.
            .args(["--steering-http", "off"])
            .args(["--zones", TEST_ZONES, "--geo", TEST_GEO, "--state-dir"])
            .arg(state)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn steerdns");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.split("addr=").nth(1) {
                    let addr = addr.split_whitespace().next().unwrap().to_string();
                    if line.contains("api listening") {
                        let _ = tx.send(("api", addr));
                    } else if line.contains("listening (udp, tcp)") {
                        let _ = tx.send(("dns", addr));
                    }
                }
            }
        });
        let mut served = Binary {
            child,
            api: "0.0.0.0:0".parse().unwrap(),
            dns: "0.0.0.0:0".parse().unwrap(),
        };
        for _ in 0..2 {
            let (what, addr) = rx
                .recv_timeout(Duration::from_secs(20))
                .expect("no `listening` lines from steerdns serve");
            match what {
                "api" => served.api = addr.parse().unwrap(),
                _ => served.dns = addr.parse().unwrap(),
            }
        }
        served
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The commit `build_info` must carry: what git says HEAD is, `unknown` outside a
/// checkout, or what the build was told (`STEERDNS_COMMIT`).
fn expected_commit() -> String {
    if let Some(c) = std::env::var("STEERDNS_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
    {
        return c;
    }
    std::process::Command::new("git")
        .current_dir(repo("."))
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or("unknown".into(), |o| {
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        })
}

/// The CPU time of `pid` so far, in seconds (utime + stime of /proc/PID/stat).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf only reads a system constant.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Sends DNS queries to `server` (from many loopback resolvers, under the rate limit of
/// each) until the kernel says it has used `seconds` of CPU (60 s of wall time at most).
fn burn_cpu(server: &Binary, pid: u32, seconds: f64) {
    let started = std::time::Instant::now();
    let q = query("www.example.com.", RecordType::A).to_vec().unwrap();
    let socks: Vec<std::net::UdpSocket> = (0..64)
        .map(|i| {
            let s = std::net::UdpSocket::bind((resolver(5000 + i * 300), 0)).unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect();
    let mut buf = [0u8; 512];
    while cpu_seconds(pid) < seconds {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the server used only {} s of CPU",
            cpu_seconds(pid)
        );
        for s in &socks {
            for _ in 0..8 {
                let _ = s.send_to(&q, server.dns);
            }
            while s.recv(&mut buf).is_ok() {}
        }
    }
}

/// A /proc/PID/status field, in its unit (kB for memory).
fn proc_status(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} not in /proc/{pid}/status"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_build_info_and_its_own_process_metrics() {
    let state = std::env::temp_dir().join(format!("steerdns-buildinfo-{}", std::process::id()));
    let spawned = steerdns::clock::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let server = Binary::start(&state);
    let pid = server.child.id();
    // The prometheus crate counts CPU time in whole seconds: make the server spend
    // more than one, so that a CPU collector stuck at 0 cannot pass.
    burn_cpu(&server, pid, 1.1);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let text = get_text(&http, server.api, "/metrics").await;
    let s = parse(&text);

    let commit = expected_commit();
    assert_eq!(
        value(
            &s,
            "steerdns_build_info",
            &[("version", env!("CARGO_PKG_VERSION")), ("commit", &commit)]
        ),
        Some(1.0),
        "build_info with commit {commit}:\n{text}"
    );
    assert_eq!(
        s.iter().filter(|x| x.name == "steerdns_build_info").count(),
        1
    );

    // The process metrics are the server's, not this test's: its file limit, start
    // time, memory, threads and files.
    let get =
        |name: &str| value(&s, name, &[]).unwrap_or_else(|| panic!("{name} missing from:\n{text}"));
    let started = get("process_start_time_seconds");
    assert!(
        (started - spawned).abs() <= 3.0,
        "started at {started}, spawned at {spawned}"
    );
    let rss = get("process_resident_memory_bytes");
    let vm_rss = proc_status(pid, "VmRSS:") * 1024.0;
    assert!(
        rss > 1e6 && rss / vm_rss > 0.5 && rss / vm_rss < 2.0,
        "resident {rss} bytes, /proc/{pid}/status says {vm_rss}"
    );
    assert_eq!(get("process_max_fds"), f64::from(MAX_FDS));
    let threads = get("process_threads");
    assert!(
        (threads - proc_status(pid, "Threads:")).abs() <= 2.0 && threads >= 2.0,
        "{threads} threads; /proc/{pid}/status says {}",
        proc_status(pid, "Threads:")
    );
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count() as f64;
    assert!(
        (get("process_open_fds") - fds).abs() <= 4.0,
        "{} open fds; /proc/{pid}/fd has {fds}",
        get("process_open_fds")
    );
    // The prometheus crate counts CPU time in whole seconds: the server's own, from
    // /proc/PID/stat (utime and stime, in clock ticks), read just after the scrape.
    let proc_cpu = cpu_seconds(pid);
    let cpu = get("process_cpu_seconds_total");
    assert!(
        cpu >= 1.0 && cpu <= proc_cpu && cpu >= proc_cpu.floor() - 1.0,
        "{cpu} s of CPU; /proc/{pid}/stat says {proc_cpu} s"
    );
    assert!(get("process_virtual_memory_bytes") >= rss);
    drop(server);
    let _ = std::fs::remove_dir_all(&state);
}
