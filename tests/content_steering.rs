//! Content steering (`--steering-http`) over real sockets: both manifest formats, the
//! weighted order of first pathways (shares within 5 standard deviations), sessions
//! kept across reloads, drains and failover steps moving only the drained pathway's
//! sessions and bringing the same ones back, the throughput floor, trusted proxies,
//! every error, the connection limits, metrics and explain.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::mock_cdn::{MockCdn, Mode};
use common::stack::{probe, scratch, up_verdict, Stack};
use common::*;
use reqwest::Method;
use serde_json::{json, Value};
use steerdns::control::content::{self, SteeringOptions};
use steerdns::control::surfaces::api::ApiLimits;
use steerdns::metrics::Metrics;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const POLICY: &str = "tests/fixtures/steering-content.yaml";
/// In the test geo database's GB.
const GB: &str = "81.2.69.142";

/// A DNS server on the content fixture and a steering server on its snapshot.
struct Steering {
    addr: SocketAddr,
    metrics: Metrics,
    http: reqwest::Client,
    _dns: TestServer,
    stop: CancellationToken,
}

impl Drop for Steering {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn steering(trusted: &[&str], limits: Option<ApiLimits>) -> Steering {
    let dns = TestServer::start(POLICY, TEST_ZONES, TEST_GEO, "127.0.0.1:0").await;
    let metrics = Metrics::new();
    let stop = CancellationToken::new();
    let mut opts = SteeringOptions::new(
        "127.0.0.1:0".parse().unwrap(),
        trusted.iter().map(|t| t.parse().unwrap()).collect(),
    );
    if let Some(l) = limits {
        opts.limits = l;
    }
    let addr = content::spawn(
        opts,
        dns.running.live().clone(),
        metrics.clone(),
        stop.clone(),
    )
    .await
    .unwrap();
    Steering {
        addr,
        metrics,
        http: reqwest::Client::builder().no_proxy().build().unwrap(),
        _dns: dns,
        stop,
    }
}

/// A response: status, headers, body.
struct Got {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: String,
}

impl Got {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

async fn call(
    http: &reqwest::Client,
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
) -> Got {
    let mut req = http.request(method, format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.text().await.unwrap();
    Got {
        status,
        headers,
        body,
    }
}

impl Steering {
    async fn get(&self, path: &str) -> Got {
        call(&self.http, self.addr, Method::GET, path, &[]).await
    }
}

/// The ordered list of a manifest.
fn order(m: &Value, key: &str) -> Vec<String> {
    m[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key}: {m}"))
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

/// The session key of a manifest's RELOAD-URI.
fn session_of(m: &Value) -> String {
    let uri = m["RELOAD-URI"].as_str().unwrap();
    let at = uri.find("session=").unwrap() + "session=".len();
    uri[at..at + 16].to_string()
}

#[tokio::test]
async fn both_formats_serve_a_manifest_with_cors_and_cache_control() {
    let s = steering(&[], None).await;
    for (format, key) in [
        ("hls", "PATHWAY-PRIORITY"),
        ("dash", "SERVICE-LOCATION-PRIORITY"),
    ] {
        let g = s.get(&format!("/steer/{format}/video.example.com")).await;
        assert_eq!(g.status, 200, "{}", g.body);
        assert_eq!(g.header("content-type"), "application/json");
        assert_eq!(
            g.header("cache-control"),
            "private, max-age=7",
            "the configured TTL"
        );
        assert_eq!(g.header("access-control-allow-origin"), "*");
        let m = g.json();
        assert_eq!(m["VERSION"], 1);
        assert_eq!(m["TTL"], 7);
        let uri = m["RELOAD-URI"].as_str().unwrap();
        assert!(
            uri.starts_with("video.example.com?session="),
            "relative, with the session: {uri}"
        );
        let mut o = order(&m, key);
        o.sort();
        assert_eq!(o, ["b", "c", "cdn-a"], "every pathway, a mapped to cdn-a");
        // The beacon ticket: in RELOAD-URI (the next poll carries it) and on its own.
        let ticket = m["STEERDNS-TICKET"].as_str().unwrap();
        assert!(uri.ends_with(&format!("&ticket={ticket}")), "{uri}");
        if format == "hls" {
            assert!(m.get("SERVICE-LOCATION-PRIORITY").is_none());
            assert_eq!(m.as_object().unwrap().len(), 5, "{m}");
        } else {
            // Also under the key dash.js reads.
            assert_eq!(order(&m, "PATHWAY-PRIORITY"), order(&m, key));
            assert_eq!(m.as_object().unwrap().len(), 6, "{m}");
        }
    }
    // No content_steering block: the CDN names, the DNS TTL; any case, trailing dot.
    let g = s.get("/steer/hls/WWW.Example.COM.").await;
    assert_eq!(g.status, 200, "{}", g.body);
    assert_eq!(g.header("cache-control"), "private, max-age=20");
    let mut o = order(&g.json(), "PATHWAY-PRIORITY");
    o.sort();
    assert_eq!(o, ["cloudflare", "fastly"]);
    assert!(g.json()["RELOAD-URI"]
        .as_str()
        .unwrap()
        .starts_with("www.example.com?session="));
    // HEAD: the headers, no body.
    let g = call(
        &s.http,
        s.addr,
        Method::HEAD,
        "/steer/dash/video.example.com",
        &[],
    )
    .await;
    assert_eq!(g.status, 200);
    assert_eq!(g.header("cache-control"), "private, max-age=7");
    assert_eq!(g.header("access-control-allow-origin"), "*");
    assert!(g.body.is_empty());
    // A CORS preflight, as a browser sends it.
    let g = call(
        &s.http,
        s.addr,
        Method::OPTIONS,
        "/steer/hls/video.example.com",
        &[
            ("origin", "http://player.test"),
            ("access-control-request-method", "GET"),
            ("access-control-request-headers", "x-custom"),
        ],
    )
    .await;
    assert_eq!(g.status, 204);
    assert_eq!(g.header("access-control-allow-origin"), "*");
    assert!(g.header("access-control-allow-methods").contains("GET"));
    assert_eq!(g.header("access-control-allow-headers"), "*");
}

#[tokio::test]
async fn first_pathways_follow_the_effective_shares() {
    let s = steering(&["127.0.0.1/32"], None).await;
    let n = 3000;
    // Loopback is in no country: the default region, a 60 / b 30 / c 10.
    let mut first: HashMap<String, usize> = HashMap::new();
    for _ in 0..n {
        let m = s.get("/steer/hls/video.example.com").await.json();
        *first
            .entry(order(&m, "PATHWAY-PRIORITY")[0].clone())
            .or_default() += 1;
    }
    let count = |p: &str| first.get(p).copied().unwrap_or(0);
    assert_share(count("cdn-a"), n, 0.6, "world: a first");
    assert_share(count("b"), n, 0.3, "world: b first");
    assert_share(count("c"), n, 0.1, "world: c first");
    // A GB player behind our proxy: a 10 / b 90, and c (no weight there) always last.
    let mut first: HashMap<String, usize> = HashMap::new();
    for _ in 0..n {
        let g = call(
            &s.http,
            s.addr,
            Method::GET,
            "/steer/dash/video.example.com",
            &[("x-forwarded-for", GB)],
        )
        .await;
        let o = order(&g.json(), "SERVICE-LOCATION-PRIORITY");
        assert_eq!(o[2], "c", "{o:?}");
        *first.entry(o[0].clone()).or_default() += 1;
    }
    let count = |p: &str| first.get(p).copied().unwrap_or(0);
    assert_share(count("cdn-a"), n, 0.1, "uk: a first");
    assert_share(count("b"), n, 0.9, "uk: b first");
}

#[tokio::test]
async fn a_session_keeps_its_order_across_reloads() {
    let s = steering(&[], None).await;
    let mut firsts = HashMap::new();
    for _ in 0..60 {
        let m = s.get("/steer/hls/video.example.com").await.json();
        let o = order(&m, "PATHWAY-PRIORITY");
        let session = session_of(&m);
        *firsts.entry(o[0].clone()).or_insert(0) += 1;
        let mut uri = m["RELOAD-URI"].as_str().unwrap().to_string();
        for _ in 0..5 {
            // As hls.js reloads: RELOAD-URI resolved against /steer/hls/, its own
            // parameters added.
            let path = format!(
                "/steer/hls/{uri}&_HLS_pathway={}&_HLS_throughput=5000000",
                o[0]
            );
            let m2 = s.get(&path).await.json();
            assert_eq!(order(&m2, "PATHWAY-PRIORITY"), o, "session {session}");
            assert_eq!(session_of(&m2), session);
            uri = m2["RELOAD-URI"].as_str().unwrap().to_string();
        }
        // The same session on the DASH endpoint: the same order.
        let m3 = s
            .get(&format!("/steer/dash/video.example.com?session={session}"))
            .await
            .json();
        assert_eq!(order(&m3, "SERVICE-LOCATION-PRIORITY"), o);
    }
    assert!(firsts.len() >= 2, "sessions differ: {firsts:?}");
}

#[tokio::test]
async fn a_throughput_below_the_floor_demotes_the_pathway_for_the_session() {
    let s = steering(&[], None).await;
    // A session that starts on cdn-a.
    let mut first_on_a = None;
    for _ in 0..200 {
        let m = s.get("/steer/hls/video.example.com").await.json();
        let o = order(&m, "PATHWAY-PRIORITY");
        if o[0] == "cdn-a" {
            first_on_a = Some((session_of(&m), o));
            break;
        }
    }
    let (session, o) = first_on_a.expect("no new session in 200 started on cdn-a");
    let base = format!("/steer/hls/video.example.com?session={session}");
    // At or above the floor (1 Mbit/s): nothing changes.
    let m = s
        .get(&format!(
            "{base}&_HLS_pathway=cdn-a&_HLS_throughput=1000000"
        ))
        .await
        .json();
    assert_eq!(order(&m, "PATHWAY-PRIORITY"), o);
    assert!(!m["RELOAD-URI"].as_str().unwrap().contains("demoted"));
    // Below: cdn-a goes after the other serving pathways, and stays there.
    let m = s
        .get(&format!(
            "{base}&_HLS_pathway=cdn-a&_HLS_throughput=400000.5"
        ))
        .await
        .json();
    let demoted = order(&m, "PATHWAY-PRIORITY");
    assert_eq!(demoted[2], "cdn-a", "{demoted:?}");
    assert_eq!(&demoted[..2], &[o[1].clone(), o[2].clone()]);
    let uri = m["RELOAD-URI"].as_str().unwrap().to_string();
    assert!(uri.contains("&demoted=cdn-a&ticket="), "{uri}");
    let m = s
        .get(&format!(
            "/steer/hls/{uri}&_HLS_pathway={}&_HLS_throughput=9000000",
            demoted[0]
        ))
        .await
        .json();
    assert_eq!(
        order(&m, "PATHWAY-PRIORITY"),
        demoted,
        "kept for the session"
    );
    // Another session is not affected.
    let other = s.get("/steer/hls/video.example.com").await.json();
    assert!(!other["RELOAD-URI"].as_str().unwrap().contains("demoted"));
    // DASH: dash.js lists the service locations it measured, in kbit/s.
    let m = s
        .get(&format!(
            "/steer/dash/video.example.com?session={session}&_DASH_pathway=%22cdn-a%2Cb%22&_DASH_throughput=400%2C9000"
        ))
        .await
        .json();
    assert_eq!(order(&m, "SERVICE-LOCATION-PRIORITY"), demoted);
    // Every serving pathway demoted: the demotions are dropped.
    let m = s.get(&format!("{base}&demoted=cdn-a,b,c")).await.json();
    assert_eq!(order(&m, "PATHWAY-PRIORITY"), o);
    assert!(!m["RELOAD-URI"].as_str().unwrap().contains("demoted"));
}

#[tokio::test]
async fn forwarded_for_counts_only_from_trusted_proxies() {
    let series = |m: &Metrics, region: &str| -> f64 {
        let text = String::from_utf8(m.encode().unwrap()).unwrap();
        text.lines()
            .filter(|l| {
                l.starts_with("steerdns_steering_responses_total{")
                    && l.contains("name=\"video.example.com.\"")
                    && l.contains(&format!("region=\"{region}\""))
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    // Loopback trusted: the forwarded GB address is the client.
    let s = steering(&["127.0.0.0/8"], None).await;
    let xff = format!("{GB}, 127.0.0.9");
    for _ in 0..5 {
        let g = call(
            &s.http,
            s.addr,
            Method::GET,
            "/steer/hls/video.example.com",
            &[("x-forwarded-for", &xff)],
        )
        .await;
        assert_eq!(g.status, 200);
    }
    assert_eq!(series(&s.metrics, "uk"), 5.0);
    assert_eq!(series(&s.metrics, "world"), 0.0);
    // A malformed header from a trusted proxy is a bad request.
    let g = call(
        &s.http,
        s.addr,
        Method::GET,
        "/steer/hls/video.example.com",
        &[("x-forwarded-for", "not-an-address")],
    )
    .await;
    assert_eq!(g.status, 400);
    assert!(g.json()["error"]
        .as_str()
        .unwrap()
        .contains("X-Forwarded-For"));

    // Only another network trusted: the header is ignored, loopback is the client.
    let s = steering(&["10.0.0.0/8"], None).await;
    for xff in [GB, "garbage"] {
        let g = call(
            &s.http,
            s.addr,
            Method::GET,
            "/steer/hls/video.example.com",
            &[("x-forwarded-for", xff)],
        )
        .await;
        assert_eq!(g.status, 200);
    }
    assert_eq!(series(&s.metrics, "uk"), 0.0);
    assert_eq!(series(&s.metrics, "world"), 2.0);
    // Metrics: by name, region and first pathway.
    let text = String::from_utf8(s.metrics.encode().unwrap()).unwrap();
    assert!(
        text.lines().any(|l| l.starts_with(
            "steerdns_steering_responses_total{name=\"video.example.com.\",pathway=\""
        ) && l.contains("region=\"world\"")),
        "{text}"
    );
}

#[tokio::test]
async fn every_error_is_json_with_cors_and_counted() {
    let s = steering(&[], None).await;
    let cases: &[(Method, &str, u16, &str)] = &[
        (
            Method::GET,
            "/steer/hls/nope.example.com",
            404,
            "not a steered name",
        ),
        (
            Method::GET,
            "/steer/dash/example.org",
            404,
            "not a steered name",
        ),
        (
            Method::GET,
            "/steer/rtmp/video.example.com",
            404,
            "/steer/hls/",
        ),
        (Method::GET, "/steer/hls/", 404, "/steer/hls/"),
        (
            Method::GET,
            "/steer/hls/video.example.com/x",
            404,
            "/steer/hls/",
        ),
        (Method::GET, "/", 404, "/steer/hls/"),
        (Method::GET, "/steer/hls/a..b", 400, "not a DNS name"),
        (Method::GET, "/steer/hls/a%20b", 400, "not a DNS name"),
        (
            Method::GET,
            "/steer/hls/video.example.com?session=12",
            400,
            "session",
        ),
        (
            Method::GET,
            "/steer/hls/video.example.com?session=zzzzzzzzzzzzzzzz",
            400,
            "session",
        ),
        (
            Method::GET,
            "/steer/hls/video.example.com?_HLS_pathway=a%2Fb",
            400,
            "_HLS_pathway",
        ),
        (
            Method::GET,
            "/steer/hls/video.example.com?_HLS_throughput=-5",
            400,
            "_HLS_throughput",
        ),
        (
            Method::GET,
            "/steer/hls/video.example.com?_HLS_throughput=1&_HLS_throughput=2",
            400,
            "twice",
        ),
        (
            Method::GET,
            "/steer/dash/video.example.com?_DASH_throughput=1,fast",
            400,
            "_DASH_throughput",
        ),
        (
            Method::GET,
            "/steer/dash/video.example.com?_DASH_pathway=%ZZ",
            400,
            "percent",
        ),
        (
            Method::GET,
            "/steer/hls/video.example.com?demoted=a%00",
            400,
            "demoted",
        ),
        (
            Method::POST,
            "/steer/hls/video.example.com",
            405,
            "GET, HEAD or OPTIONS",
        ),
        (
            Method::DELETE,
            "/steer/hls/video.example.com",
            405,
            "GET, HEAD or OPTIONS",
        ),
        (Method::PUT, "/", 405, "GET, HEAD or OPTIONS"),
    ];
    for (method, path, status, says) in cases {
        let g = call(&s.http, s.addr, method.clone(), path, &[]).await;
        assert_eq!(g.status, *status, "{method} {path}: {}", g.body);
        assert_eq!(g.header("access-control-allow-origin"), "*", "{path}");
        assert_eq!(g.header("cache-control"), "no-store", "{path}");
        assert_eq!(g.header("content-type"), "application/json", "{path}");
        let e = g.json()["error"].as_str().unwrap_or_default().to_string();
        assert!(e.contains(says), "{method} {path}: {e:?} lacks {says:?}");
        if *status == 405 {
            assert_eq!(g.header("allow"), "GET, HEAD, OPTIONS");
        }
    }
    // Unknown parameters are ignored (players and proxies add their own).
    let g = s
        .get("/steer/hls/video.example.com?_HLS_pathway=zzz&cachebust=1&x")
        .await;
    assert_eq!(g.status, 200, "{}", g.body);
    let text = String::from_utf8(s.metrics.encode().unwrap()).unwrap();
    let refused = |status: &str| {
        text.lines()
            .find(|l| {
                l.starts_with(&format!(
                    "steerdns_steering_refused_total{{status=\"{status}\"}}"
                ))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert_eq!(refused("404"), 6);
    assert_eq!(refused("400"), 10);
    assert_eq!(refused("405"), 3);
}

#[tokio::test]
async fn requests_are_bounded_in_size_time_and_connections() {
    let limits = ApiLimits {
        header_timeout: Duration::from_millis(300),
        max_per_source: 4,
        ..SteeringOptions::new("127.0.0.1:0".parse().unwrap(), Vec::new()).limits
    };
    let s = steering(&[], Some(limits)).await;
    // Headers over 64 KiB: 431.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let big = format!(
        "GET /steer/hls/video.example.com HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(70 * 1024)
    );
    let _ = c.write_all(big.as_bytes()).await;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
        .await
        .unwrap()
        .unwrap_or(0);
    let head = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(head.starts_with("HTTP/1.1 431"), "{head:?}");
    // A client that trickles its headers is cut off after the header timeout.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"GET /steer/hls/video.example.com HTTP/1.1\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        let mut b = [0u8; 512];
        loop {
            match c.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "a silent client is closed");
    assert!(started.elapsed() < Duration::from_secs(3));
    // Four connections from one source at most: a fifth is closed at once, and the
    // four still answer.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(s.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut fifth = TcpStream::connect(s.addr).await.unwrap();
    let _ = fifth
        .write_all(b"GET /steer/hls/video.example.com HTTP/1.1\r\nhost: x\r\n\r\n")
        .await;
    let mut b = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), fifth.read(&mut b))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0, "the fifth connection is closed without an answer");
    for c in &mut held {
        c.write_all(b"GET /steer/hls/video.example.com HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let n = c.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    }
}

// === with the whole server: drains, steps, explain ===

/// www.example.com: a and b 50/50 everywhere, pathways pa and pb, TTL 1, failover
/// in one step (a drain and its end apply at once). slow.example.com: the same with
/// steps [50, 100] ten minutes apart (a plateau that holds while it is measured).
fn stack_policy(dir: &std::path::Path) {
    let name = |name: &str, steps: &str| {
        format!(
            "  {name}:
    ttl: 30
    cdns:
      a: {{ cname: a.cdn.test. }}
      b: {{ cname: b.cdn.test. }}
    regions:
      - match: [\"*\"]
        weights: {{ a: 50, b: 50 }}
    failover:
      steps: {steps}
      step_interval_seconds: 600
    content_steering:
      pathways: {{ a: pa, b: pb }}
      ttl: 1
"
        )
    };
    let text = format!(
        "hostnames:\n{}{}",
        name("www.example.com", "[100]"),
        name("slow.example.com", "[50, 100]")
    );
    std::fs::write(dir.join("steering.yaml"), text).unwrap();
}

async fn stack(tag: &str) -> Stack {
    let dir = scratch(tag);
    stack_policy(&dir);
    Stack::start(&dir).await
}

/// The order each session of `name` gets now.
async fn orders(stack: &Stack, name: &str, sessions: &[String]) -> Vec<Vec<String>> {
    let http = &stack.http;
    let mut out = Vec::new();
    for s in sessions {
        let g = call(
            http,
            stack.steering,
            Method::GET,
            &format!("/steer/hls/{name}?session={s}"),
            &[],
        )
        .await;
        out.push(order(&g.json(), "PATHWAY-PRIORITY"));
    }
    out
}

/// How many sessions went from pa to pb between `before` and `step`; none may have
/// left pb.
fn moved_to_pb(before: &[Vec<String>], step: &[Vec<String>]) -> usize {
    let mut moved = 0;
    for (b, s) in before.iter().zip(step) {
        if b[0] == "pb" {
            assert_eq!(s, b, "a session on pb moved");
        } else if s[0] == "pb" {
            moved += 1;
        }
    }
    moved
}

/// Polls until `pred` holds for the orders of `sessions` (10 s at most).
async fn orders_until(
    stack: &Stack,
    name: &str,
    sessions: &[String],
    what: &str,
    pred: impl Fn(&[Vec<String>]) -> bool,
) -> Vec<Vec<String>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let o = orders(stack, name, sessions).await;
        if pred(&o) {
            return o;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn drains_and_steps_move_only_the_drained_pathways_sessions_and_bring_them_back() {
    let stack = stack("content-drains").await;
    let sessions: Vec<String> = (0..400u64)
        .map(|i| format!("{:016x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
        .collect();
    let www = "www.example.com";
    let before = orders(&stack, www, &sessions).await;
    let on_a = before.iter().filter(|o| o[0] == "pa").count();
    assert_share(on_a, sessions.len(), 0.5, "pa first");

    // An immediate drain of a: every session gets pb first, pa still listed last.
    let (status, rule) = stack
        .post(
            "/v1/drains",
            json!({"name": "www.example.com", "cdn": "a", "reason": "test", "immediate": true}),
        )
        .await;
    assert_eq!(status, 201, "{rule}");
    let drained = orders_until(&stack, www, &sessions, "pa drained", |o| {
        o.iter().all(|o| o[0] == "pb")
    })
    .await;
    assert!(drained.iter().all(|o| o == &["pb", "pa"]));
    // Its end: the same sessions come back to pa.
    let id = rule["id"].as_str().unwrap();
    let status = stack.undrain(id).await;
    assert_eq!(status, 200);
    let after = orders_until(&stack, www, &sessions, "drain ended", |o| {
        o == before.as_slice()
    })
    .await;
    assert_eq!(after, before);

    // A drain in failover steps: at the 50 % step, about half of pa's sessions move
    // to pb, and no pb session moves.
    let slow = "slow.example.com";
    let before = orders(&stack, slow, &sessions).await;
    let on_a = before.iter().filter(|o| o[0] == "pa").count();
    let (status, rule) = stack
        .post(
            "/v1/drains",
            json!({"name": slow, "cdn": "a", "reason": "steps"}),
        )
        .await;
    assert_eq!(status, 201, "{rule}");
    let step = orders_until(&stack, slow, &sessions, "the first step", |o| {
        o != before.as_slice()
    })
    .await;
    let moved = moved_to_pb(&before, &step);
    assert_share(moved, on_a, 0.5, "pa sessions moved at the 50 % step");
    // Its end, from the first step: the one step back applies at once, and every
    // session gets its order of before.
    let id = rule["id"].as_str().unwrap();
    let status = stack.undrain(id).await;
    assert_eq!(status, 200);
    let back = orders_until(&stack, slow, &sessions, "the drain ended", |o| {
        o != step.as_slice()
    })
    .await;
    assert_eq!(back, before, "one step back from the first step: all of it");

    // From the last step, the sessions come back in steps: an immediate drain takes all
    // of pa at once, and its end brings back the sessions of the 50 % step (the same
    // ones, since a pick is consistent), the rest ten minutes later.
    let (status, rule) = stack
        .post(
            "/v1/drains",
            json!({"name": slow, "cdn": "a", "reason": "all at once", "immediate": true}),
        )
        .await;
    assert_eq!(status, 201, "{rule}");
    orders_until(&stack, slow, &sessions, "pa drained", |o| {
        o.iter().all(|o| o[0] == "pb")
    })
    .await;
    let status = stack.undrain(rule["id"].as_str().unwrap()).await;
    assert_eq!(status, 200);
    let back = orders_until(&stack, slow, &sessions, "the first step back", |o| {
        o.iter().any(|o| o[0] == "pa")
    })
    .await;
    assert_eq!(
        back, step,
        "the first step back is the 50 % plateau, not all of pa"
    );
}

/// Content steering under a health failover step: pa's CDN fails its probes, and the
/// sessions move as the DNS answers do: on slow.example.com (steps [50, 100]) about
/// half of pa's sessions at the first step and none of pb's, on www.example.com
/// ([100]) all of them; when it recovers, every session gets its order back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_failover_step_moves_sessions_as_the_dns_answers_do() {
    let dir = scratch("content-health");
    stack_policy(&dir);
    let a = MockCdn::start(Mode::Healthy).await;
    probe(&dir, "a", &a.url("/_health/v1.txt"), 1);
    let stack = Stack::start(&dir).await;
    stack.wait_for("a probed", |s| up_verdict(s, "a")).await;
    let sessions: Vec<String> = (0..400u64)
        .map(|i| format!("{:016x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
        .collect();
    let (www, slow) = ("www.example.com", "slow.example.com");
    let before_www = orders(&stack, www, &sessions).await;
    let before = orders(&stack, slow, &sessions).await;
    let on_a = before.iter().filter(|o| o[0] == "pa").count();

    a.set(Mode::Status(503));
    orders_until(&stack, www, &sessions, "a out of www", |o| {
        o.iter().all(|o| o[0] == "pb")
    })
    .await;
    let step = orders(&stack, slow, &sessions).await;
    let moved = moved_to_pb(&before, &step);
    assert_share(
        moved,
        on_a,
        0.5,
        "pa sessions moved at the first failover step",
    );

    a.set(Mode::Healthy);
    orders_until(&stack, www, &sessions, "a back", |o| {
        o == before_www.as_slice()
    })
    .await;
    assert_eq!(orders(&stack, slow, &sessions).await, before);
}

#[tokio::test]
async fn explain_shows_the_order_a_session_gets() {
    let stack = stack("content-explain").await;
    let session = "00000000c0ffee00";
    let g = call(
        &stack.http,
        stack.steering,
        Method::GET,
        &format!("/steer/dash/www.example.com?session={session}"),
        &[],
    )
    .await;
    let served = order(&g.json(), "SERVICE-LOCATION-PRIORITY");
    let e = stack
        .get(&format!(
            "/v1/explain?name=www.example.com&client=127.0.0.1&session={session}"
        ))
        .await;
    let cs = &e["content_steering"];
    assert_eq!(cs["ttl"], 1);
    assert_eq!(cs["session"], session);
    let explained: Vec<String> = cs["order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect();
    assert_eq!(explained, served);
    let first: Vec<(String, f64)> = cs["first"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["pathway"].as_str().unwrap().to_string(),
                p["first_percent"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(first, [("pa".to_string(), 50.0), ("pb".to_string(), 50.0)]);
    let (status, body) = stack
        .call(
            Method::GET,
            "/v1/explain?name=www.example.com&client=127.0.0.1&session=xyz",
            None,
            None,
        )
        .await;
    assert_eq!(status, 400, "{body}");
}
