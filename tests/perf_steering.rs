//! Performance steering over real sockets: beacons posted to `POST /rum/{name}` on
//! the content steering server through a trusted proxy (127.0.0.1, with
//! `X-Forwarded-For`), each with the ticket its player fetched
//! (`GET /rum/{name}/ticket`), the shares they move read from `/v1/state`, and
//! measured over DNS with ECS from many client networks. Short periods (a few hundred ms) so that
//! the whole timeline runs in seconds; nothing sleeps for a fixed time to decide,
//! every wait polls for a state.

mod common;

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::etcd::{require_etcd, EtcdSet};
use common::mock_cdn::{MockCdn, Mode};
use common::stack::{scratch, Stack, PLAYER_ORIGIN};
use serde_json::Value;
use tokio::time::Instant;

/// The GB region: the test database's GB networks and 100.64.0.0/10, whose /24s are
/// the players (the test database holds too few GB /24s to make many networks).
fn policy(dir: &std::path::Path, period: f64, window: f64) {
    policy_needing(dir, period, window, 50, 5);
}

/// As [`policy`], a CDN's figure counting with `min_samples` samples from
/// `min_networks` networks.
fn policy_needing(
    dir: &std::path::Path,
    period: f64,
    window: f64,
    min_samples: u32,
    min_networks: u32,
) {
    let text = format!(
        "hostname: www.example.com
ttl: 30
cdns:
  fastly: {{ cname: fastly.cdn.test. }}
  cloudflare: {{ cname: cloudflare.cdn.test. }}
regions:
  - name: gb
    match: [GB, 100.64.0.0/10]
    weights: {{ fastly: 90, cloudflare: 10 }}
    performance:
      metric: ttfb_p75
      band_percent: 10
      floor_percent: 10
      max_shift_points: 10
      shift_period_seconds: {period}
      window_seconds: {window}
      min_samples: {min_samples}
      min_networks: {min_networks}
  - match: [\"*\"]
    weights: {{ fastly: 50, cloudflare: 50 }}
"
    );
    std::fs::write(dir.join("steering.yaml"), text).unwrap();
}

async fn start(tag: &str, period: f64, window: f64) -> Stack {
    let dir = scratch(tag);
    policy(&dir, period, window);
    Stack::start(&dir).await
}

/// Player `i`'s address: one per /24 of 100.64.0.0/10.
fn player(i: u32) -> String {
    format!("100.{}.{}.7", 64 + i / 256, i % 256)
}

/// Posts `body` as a beacon from `client` (through the trusted proxy), as a page of
/// the stack's beacon origin does; status, body.
async fn post(s: &Stack, name: &str, client: &str, body: impl Into<String>) -> (u16, String) {
    let r = s
        .http
        .post(format!("http://{}/rum/{name}", s.steering))
        .header("x-forwarded-for", client)
        .header("content-type", "application/json")
        .header("origin", PLAYER_ORIGIN)
        .body(body.into())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let cors = r
        .headers()
        .get("access-control-allow-origin")
        .map(|v| v.to_str().unwrap().to_string());
    assert_eq!(
        cors.as_deref(),
        Some(PLAYER_ORIGIN),
        "CORS for the beacon origin on every answer"
    );
    (status, r.text().await.unwrap())
}

/// A beacon with `ticket`: fastly and cloudflare measured at these times.
fn beacon(ticket: &str, fastly_ms: u64, cloudflare_ms: u64) -> String {
    format!(
        r#"{{"ticket":"{ticket}","samples":[{{"cdn":"fastly","ttfb_ms":{fastly_ms},"ok":true}},{{"cdn":"fastly","ttfb_ms":{fastly_ms}}},{{"cdn":"cloudflare","ttfb_ms":{cloudflare_ms},"ok":true}},{{"cdn":"cloudflare","ttfb_ms":{cloudflare_ms}}}]}}"#
    )
}

/// The DNS cookie secret a stack keeps in its state directory (tickets are signed
/// with a key derived from it).
fn kept_secret(s: &Stack) -> [u8; 16] {
    let text = std::fs::read_to_string(s.dir.join("state/cookie-secret")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let hex = v["current"].as_str().unwrap();
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    out
}

/// What the players measure now: (fastly ms, cloudflare ms, networks); 0 networks:
/// silence.
type Conditions = Arc<Mutex<(u64, u64, u32)>>;

/// Players posting a beacon per network every 50 ms, as `conditions` say, until
/// dropped.
fn players(s: &Stack, conditions: Conditions) -> tokio::task::JoinHandle<()> {
    players_from(s, conditions, 0)
}

/// As [`players`], the networks numbered from `first`.
fn players_from(s: &Stack, conditions: Conditions, first: u32) -> tokio::task::JoinHandle<()> {
    let (http, addr) = (s.http.clone(), s.steering);
    tokio::spawn(async move {
        let mut tickets: HashMap<u32, String> = HashMap::new();
        loop {
            let (f, c, nets) = *conditions.lock().unwrap();
            for i in first..first + nets {
                if let Entry::Vacant(e) = tickets.entry(i) {
                    e.insert(fetch_ticket(&http, addr, &player(i)).await);
                }
                let r = http
                    .post(format!("http://{addr}/rum/www.example.com"))
                    .header("x-forwarded-for", player(i))
                    .header("content-type", "application/json")
                    .body(beacon(&tickets[&i], f, c))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 204);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

/// A ticket for www.example.com to a player at `client`, from the steering server at
/// `addr`.
async fn fetch_ticket(http: &reqwest::Client, addr: std::net::SocketAddr, client: &str) -> String {
    let r = http
        .get(format!("http://{addr}/rum/www.example.com/ticket"))
        .header("x-forwarded-for", client)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    v["ticket"].as_str().unwrap().to_string()
}

/// The GB region's performance document.
fn gb(state: &Value) -> &Value {
    state["performance"]
        .as_array()
        .and_then(|a| a.iter().find(|r| r["region"] == "gb"))
        .unwrap_or(&Value::Null)
}

/// (fastly share, cloudflare share, fastly reason) of the GB region.
fn shares(state: &Value) -> (f64, f64, String) {
    let cdn = |n: &str| {
        gb(state)["cdns"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["cdn"] == n))
            .cloned()
            .unwrap_or(Value::Null)
    };
    (
        cdn("fastly")["share"].as_f64().unwrap_or(-1.0),
        cdn("cloudflare")["share"].as_f64().unwrap_or(-1.0),
        cdn("fastly")["reason"].as_str().unwrap_or("").to_string(),
    )
}

/// Polls the shares every 10 ms until `until` holds (20 s at most); every distinct
/// fastly share seen on the way, in order.
async fn watch(s: &Stack, until: impl Fn(f64, &str) -> bool) -> Vec<f64> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen: Vec<f64> = Vec::new();
    loop {
        let (f, _, reason) = shares(&s.state().await);
        if seen.last() != Some(&f) {
            seen.push(f);
        }
        if until(f, &reason) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "shares never got there: {seen:?}, {reason}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The CNAME answered to clients of `networks` GB /24s, each asking with ECS through
/// its own resolver, measured with dig.
async fn dns_answers(s: &Stack, networks: u32) -> Vec<String> {
    let queries: Vec<(std::net::IpAddr, Option<String>)> = (0..networks)
        .map(|i| {
            let subnet = format!("{}/24", player(1000 + i));
            (common::resolver(i as usize), Some(subnet))
        })
        .collect();
    common::dig_cnames(s.dns, &s.dir, "www.example.com", &queries).await
}

/// Fastly's share (percent) of DNS answers to clients of `networks` GB /24s.
async fn dns_share(s: &Stack, networks: u32) -> f64 {
    let answers = dns_answers(s, networks).await;
    let fastly = answers.iter().filter(|c| c.starts_with("fastly.")).count();
    100.0 * fastly as f64 / f64::from(networks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beacons_are_checked_located_and_limited() {
    // Short periods: the state document shows the windows once a period.
    let s = start("perf-beacons", 0.2, 300.0).await;
    let name = "www.example.com";
    // Accepted: 204, no body, counted for the client's region (the forwarded one).
    let t1 = s.ticket(name, &player(1)).await;
    let (status, body) = post(&s, name, &player(1), beacon(&t1, 80, 78)).await;
    assert_eq!((status, body.as_str()), (204, ""));
    // A client outside the GB region: accepted, unused (its region has no block).
    let other = s.ticket(name, "192.0.2.1").await;
    assert_eq!(
        post(&s, name, "192.0.2.1", beacon(&other, 80, 78)).await.0,
        204
    );
    let t2 = s.ticket(name, &player(2)).await;
    let bad: &[(&str, String, u16, &str)] = &[
        (name, "{".into(), 400, "bad beacon"),
        (name, r#"{"samples":[]}"#.into(), 400, "no samples"),
        (
            name,
            format!(r#"{{"ticket":"{t2}","samples":[{{"cdn":"akamai","ttfb_ms":3}}]}}"#),
            400,
            "unknown CDN `akamai`",
        ),
        (
            name,
            r#"{"samples":[{"cdn":"fastly","ttfb_ms":700000}]}"#.into(),
            400,
            "samples[0].ttfb_ms: 0 to 600000",
        ),
        (
            "nope.example.com",
            beacon(&t2, 80, 78),
            400,
            "nope.example.com. is not a steered name",
        ),
        (name, "x".repeat(17 * 1024), 413, "16 KiB"),
    ];
    for (n, body, status, says) in bad {
        let (got, text) = post(&s, n, &player(2), body.clone()).await;
        assert_eq!(got, *status, "{body:.60}: {text}");
        assert!(text.contains(says), "{text} should say {says}");
    }
    // The state shows the one accepted beacon's samples, in GB, from one network.
    let state = s
        .wait_for("beacon counted", |st| {
            gb(st)["cdns"][0]["window"]["samples"].as_u64() == Some(2)
        })
        .await;
    assert_eq!(gb(&state)["cdns"][0]["window"]["networks"], 1);
    assert_eq!(gb(&state)["metric"], "ttfb_p75");
    // A CORS preflight from the beacon origin allows the POST of JSON.
    let r = s
        .http
        .request(
            reqwest::Method::OPTIONS,
            format!("http://{}/rum/{name}", s.steering),
        )
        .header("origin", PLAYER_ORIGIN)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let allowed = r.headers()["access-control-allow-methods"]
        .to_str()
        .unwrap();
    assert!(allowed.contains("POST"), "{allowed}");
    assert_eq!(r.headers()["access-control-allow-origin"], PLAYER_ORIGIN);
    assert_eq!(r.headers()["access-control-allow-headers"], "content-type");
    // One network over its rate: 429 (the burst is 100 beacons).
    let t3 = s.ticket(name, &player(3)).await;
    let mut statuses = HashMap::new();
    for _ in 0..150 {
        *statuses
            .entry(post(&s, name, &player(3), beacon(&t3, 80, 78)).await.0)
            .or_insert(0) += 1;
    }
    assert!(
        statuses.get(&429).copied().unwrap_or(0) >= 40,
        "{statuses:?}"
    );
    assert!(
        statuses.get(&204).copied().unwrap_or(0) >= 100,
        "{statuses:?}"
    );
    let series = |r: &str| format!(r#"steerdns_rum_samples_total{{result="{r}"}}"#);
    assert!(s.metric(&series("refused_rate")).await.unwrap_or(0.0) >= 40.0);
    assert_eq!(s.metric(&series("unused")).await, Some(4.0));
    assert!(s.metric(&series("invalid")).await.unwrap_or(0.0) >= 6.0);
}

/// A ticket of `name`'s `region` for `session` until `expires`, signed with `secret`
/// (the server's, to test what it checks besides the signature; another, to forge).
fn signed(secret: &[u8; 16], session: u64, name: &str, region: &str, expires: u64) -> String {
    steerdns::control::content::ticket::issue(secret, session, name, region, expires)
}

/// A beacon counts only as `application/json` with a ticket the server signed for its
/// name and the client's region, unexpired; every other is 403 (415 for the type),
/// counted, and adds nothing to the window. CORS is answered for the beacon origin
/// alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_beacon_needs_json_and_a_ticket_for_its_name_and_region() {
    let s = start("perf-tickets", 0.2, 300.0).await;
    let name = "www.example.com";
    let gb = player(1);
    let good = s.ticket(name, &gb).await;
    let mut parts = good.split('.');
    let (session, expires, mac) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let session_n = u64::from_str_radix(session, 16).unwrap();
    let expires_n: u64 = expires.parse().unwrap();
    let now = steerdns::clock::now_secs();
    assert!(
        (now + 590..=now + 610).contains(&expires_n),
        "ten minutes: {good}"
    );
    let secret = kept_secret(&s);
    let fqdn = "www.example.com.";
    let samples = r#"[{"cdn":"fastly","ttfb_ms":80,"ok":true}]"#;
    let body = |t: &str| format!(r#"{{"ticket":"{t}","samples":{samples}}}"#);
    let refused = [
        (
            "no ticket",
            format!(r#"{{"samples":{samples}}}"#),
            "no ticket",
        ),
        ("malformed", body("hello"), "not a ticket"),
        (
            "forged: signed with another secret",
            body(&signed(&[0x42; 16], session_n, fqdn, "gb", expires_n)),
            "not valid",
        ),
        (
            "forged: a real MAC with a later expiry",
            body(&format!("{session}.{}.{mac}", expires_n + 3600)),
            "not valid",
        ),
        (
            "expired",
            body(&signed(&secret, session_n, fqdn, "gb", now - 1)),
            "expired",
        ),
        (
            "another name",
            body(&signed(
                &secret,
                session_n,
                "dl.example.com.",
                "gb",
                expires_n,
            )),
            "not valid",
        ),
        (
            "another region's, fetched there",
            body(&s.ticket(name, "192.0.2.1").await),
            "not valid",
        ),
    ];
    for (what, b, says) in &refused {
        let (status, text) = post(&s, name, &gb, b.clone()).await;
        assert_eq!(status, 403, "{what}: {text}");
        assert!(text.contains(says), "{what}: {text} should say {says}");
    }
    // The server's own, and one the test signs with the server's secret as it does.
    assert_eq!(post(&s, name, &gb, body(&good)).await.0, 204);
    let same = signed(&secret, session_n, fqdn, "gb", expires_n);
    assert_eq!(same, good, "the ticket is the HMAC the docs describe");
    // Not application/json: 415, whatever the ticket.
    for ct in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let mut req = s
            .http
            .post(format!("http://{}/rum/{name}", s.steering))
            .header("x-forwarded-for", &gb)
            .header("origin", PLAYER_ORIGIN)
            .body(body(&good));
        if let Some(ct) = ct {
            req = req.header("content-type", ct);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 415, "{ct:?}");
        assert!(r.text().await.unwrap().contains("application/json"));
    }
    // One sample from the good beacon in the window; the refused ones counted.
    s.wait_for("the accepted beacon counted", |st| {
        gb_window_samples(st, 0) == Some(1)
    })
    .await;
    let series = |r: &str| format!(r#"steerdns_rum_samples_total{{result="{r}"}}"#);
    assert_eq!(s.metric(&series("refused_ticket")).await, Some(7.0));
    assert_eq!(s.metric(&series("accepted")).await, Some(1.0));
    assert_eq!(gb_window_samples(&s.state().await, 0), Some(1));

    // Another web origin: its preflight is refused and nothing it is answered says
    // CORS; the manifests stay open to all.
    let evil = "https://evil.example.net";
    for (method, path) in [
        (reqwest::Method::OPTIONS, format!("/rum/{name}")),
        (reqwest::Method::POST, format!("/rum/{name}")),
        (reqwest::Method::GET, format!("/rum/{name}/ticket")),
    ] {
        let r = s
            .http
            .request(method.clone(), format!("http://{}{path}", s.steering))
            .header("origin", evil)
            .header("x-forwarded-for", &gb)
            .header("content-type", "application/json")
            .body(body(&good))
            .send()
            .await
            .unwrap();
        assert!(
            r.headers().get("access-control-allow-origin").is_none(),
            "{method} {path}: {:?}",
            r.headers()
        );
        if method == reqwest::Method::OPTIONS {
            assert_eq!(r.status(), 403);
        }
    }
    let r = s
        .http
        .get(format!("http://{}/rum/{name}/ticket", s.steering))
        .header("origin", PLAYER_ORIGIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["access-control-allow-origin"], PLAYER_ORIGIN);
    assert_eq!(r.headers()["cache-control"], "no-store");
    let r = s
        .http
        .get(format!("http://{}/steer/hls/{name}", s.steering))
        .header("origin", evil)
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["access-control-allow-origin"], "*");
    s.stop().await;
}

/// Samples in the window of the GB region's CDN `cdn` (0: fastly).
fn gb_window_samples(st: &Value, cdn: usize) -> Option<u64> {
    gb(st)["cdns"][cdn]["window"]["samples"].as_u64()
}

/// The throughput a steering poll reports counts as a beacon does: with the ticket
/// the previous manifest carried in `RELOAD-URI` (for this session), within the rate
/// of the poll's network; the manifest is served all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_samples_need_the_manifests_ticket_and_keep_to_the_rate() {
    let s = start("perf-polls", 0.2, 300.0).await;
    let poll = |query: String| {
        let (http, addr) = (s.http.clone(), s.steering);
        async move {
            let r = http
                .get(format!("http://{addr}/steer/hls/www.example.com?{query}"))
                .header("x-forwarded-for", player(4))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            serde_json::from_str::<Value>(&r.text().await.unwrap()).unwrap()
        }
    };
    let series = |r: &str| format!(r#"steerdns_rum_samples_total{{result="{r}"}}"#);
    let report = "_HLS_pathway=fastly&_HLS_throughput=5000000";
    // A session's first poll has no ticket: its throughput is refused.
    let m = poll(format!("session=00000000000000aa&{report}")).await;
    assert_eq!(s.metric(&series("refused_ticket")).await, Some(1.0));
    let uri = m["RELOAD-URI"].as_str().unwrap().to_string();
    let ticket = m["STEERDNS-TICKET"].as_str().unwrap();
    assert!(uri.ends_with(&format!("&ticket={ticket}")), "{uri}");
    let query = uri.split_once('?').unwrap().1.to_string();
    // The next one, as hls.js makes it from RELOAD-URI: counted.
    poll(format!("{query}&{report}")).await;
    assert_eq!(s.metric(&series("accepted")).await, Some(1.0));
    s.wait_for("the poll's sample in the window", |st| {
        gb_window_samples(st, 0) == Some(1)
    })
    .await;
    // Another session's ticket, a forged one: refused.
    poll(format!("session=00000000000000ab&ticket={ticket}&{report}")).await;
    let forged = signed(&[0x42; 16], 0xaa, "www.example.com.", "gb", u64::MAX / 2);
    poll(format!("session=00000000000000aa&ticket={forged}&{report}")).await;
    assert_eq!(s.metric(&series("refused_ticket")).await, Some(3.0));
    // One network polling with throughput as fast as it can: past the burst of 100,
    // its samples are refused for the rate; every manifest is served.
    for _ in 0..200 {
        poll(format!("{query}&{report}")).await;
    }
    let rate = s.metric(&series("refused_rate")).await.unwrap_or(0.0);
    assert!(rate >= 40.0, "{rate} poll samples refused for the rate");
    s.stop().await;
}

/// The 40-network attack: 40 /24s posting beacons that say fastly takes 300 ms, as
/// fast as the honest players of `shares_follow_measurements_within_the_bounds`, with
/// tickets of the right form, name, region and expiry but not signed by the server:
/// every one is 403 and the shares stay at the policy's weights for six periods. The
/// same players with the tickets the server hands them do move fastly (the attack
/// would have worked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_networks_with_forged_tickets_move_nothing() {
    let s = start("perf-forged", 0.3, 0.6).await;
    let attack = {
        let (http, addr) = (s.http.clone(), s.steering);
        let expires = steerdns::clock::now_secs() + 600;
        tokio::spawn(async move {
            loop {
                for i in 0..40u32 {
                    let forged =
                        signed(&[0x42; 16], u64::from(i), "www.example.com.", "gb", expires);
                    let r = http
                        .post(format!("http://{addr}/rum/www.example.com"))
                        .header("x-forwarded-for", player(i))
                        .header("content-type", "application/json")
                        .body(beacon(&forged, 300, 80))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 403);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let t = Instant::now();
    let seen = watch(&s, |_, _| t.elapsed() > Duration::from_millis(1800)).await;
    assert!(!attack.is_finished(), "the attack stopped early");
    attack.abort();
    assert_eq!(seen, [90.0], "forged tickets moved the shares");
    let series = |r: &str| format!(r#"steerdns_rum_samples_total{{result="{r}"}}"#);
    let refused = s.metric(&series("refused_ticket")).await.unwrap_or(0.0);
    assert!(refused >= 40.0 * 4.0, "{refused} samples refused");
    assert_eq!(s.metric(&series("accepted")).await.unwrap_or(0.0), 0.0);
    assert_eq!(gb_window_samples(&s.state().await, 0), Some(0));

    let conditions: Conditions = Arc::new(Mutex::new((300, 80, 40)));
    let feeder = players(&s, conditions);
    watch(&s, |f, _| f < 90.0).await;
    feeder.abort();
    s.stop().await;
}

/// Near tie, then fastly degrades, then the data stops: the shares stay at the
/// policy, fall to the floor in steps of at most 10 points, stay there, and come back
/// at the same pace; DNS answers follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_follow_measurements_within_the_bounds() {
    if !common::require_dig("shares_follow_measurements_within_the_bounds") {
        return;
    }
    let s = start("perf-shift", 0.3, 0.6).await;
    let before = dns_share(&s, 400).await;
    let conditions: Conditions = Arc::new(Mutex::new((80, 78, 30)));
    let feeder = players(&s, conditions.clone());

    // Near tie: both in the band, nothing moves, however many periods go by.
    s.wait_for("measured", |st| {
        gb(st)["cdns"][0]["measured"].as_f64().is_some()
            && gb(st)["cdns"][1]["measured"].as_f64().is_some()
    })
    .await;
    let tie_start = Instant::now();
    let seen = watch(&s, |_, _| tie_start.elapsed() > Duration::from_millis(1500)).await;
    assert_eq!(seen, [90.0], "near tie: no move");
    let (_, _, reason) = shares(&s.state().await);
    assert_eq!(reason, "perf_band");
    // The plan is the policy's: the same answers, but for the few keys whose hourly
    // selection window turned meanwhile.
    let share = dns_share(&s, 400).await;
    assert!(
        (share - before).abs() <= 2.0,
        "near tie: {share} % vs {before} %"
    );

    // Fastly degrades to 300 ms: down to the floor, at most 10 points per period.
    conditions.lock().unwrap().0 = 300;
    let seen = watch(&s, |f, r| f == 10.0 && r == "perf_floor").await;
    for w in seen.windows(2) {
        assert!(
            w[0] - w[1] <= 10.0 + 1e-6,
            "a step over 10 points: {seen:?}"
        );
        assert!(w[1] < w[0], "not monotonic: {seen:?}");
    }
    // Each network's pick is a fixed draw for the hour, so 400 networks at 10 % fall
    // outside ±3 points in about one hour in twenty (24 of 400 at 05:00 UTC on
    // 2026-12-05): 2,000 networks, held to 5 standard deviations (±3.4 points).
    let answers = dns_answers(&s, 2000).await;
    let fastly = answers.iter().filter(|c| c.starts_with("fastly.")).count();
    common::assert_share(fastly, answers.len(), 0.10, "DNS: fastly at the floor");
    // explain and the status page say why.
    let e = s
        .get(&format!(
            "/v1/explain?name=www.example.com&client={}",
            player(5)
        ))
        .await;
    let p = &e["performance"];
    assert_eq!(p["region"], "gb", "{e}");
    assert_eq!(p["cdns"][0]["reason"], "perf_floor", "{e}");
    assert_eq!(p["cdns"][1]["reason"], "perf_band", "{e}");
    assert!(p["cdns"][0]["measured"].as_f64().unwrap() > 250.0, "{e}");
    let page = s.text("/").await;
    assert!(
        page.contains(r#"data-region="gb" data-cdn="fastly" data-reason="perf_floor""#),
        "the status page shows the reason"
    );
    assert_eq!(
        s.metric(r#"steerdns_perf_reason{cdn="fastly",name="www.example.com.",reason="perf_floor",region="gb"}"#)
            .await,
        Some(1.0)
    );
    // It stays there.
    let held = Instant::now();
    let seen = watch(&s, |_, _| held.elapsed() > Duration::from_millis(1000)).await;
    assert_eq!(seen, [10.0], "the floor holds");

    // The data stops: back to the policy at the same pace.
    conditions.lock().unwrap().2 = 0;
    let seen = watch(&s, |f, r| f == 90.0 && r == "perf_stale").await;
    for w in seen.windows(2) {
        assert!(
            w[1] - w[0] <= 10.0 + 1e-6,
            "a step over 10 points: {seen:?}"
        );
    }
    assert!(seen.len() >= 8, "back in steps: {seen:?}");
    feeder.abort();
    let share = dns_share(&s, 400).await;
    assert!(
        (share - before).abs() <= 2.0,
        "back: {share} % vs {before} %"
    );
}

/// Too few networks do not move anything; one network flooding samples moves
/// nothing and its refused samples are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_or_poisoned_data_moves_nothing() {
    let s = start("perf-poison", 0.3, 3.0).await;
    // Sparse: 4 networks (min_networks is 5) measuring fastly far slower.
    let conditions: Conditions = Arc::new(Mutex::new((300, 78, 4)));
    let feeder = players(&s, conditions.clone());
    let t = Instant::now();
    let seen = watch(&s, |_, _| t.elapsed() > Duration::from_millis(1500)).await;
    assert_eq!(seen, [90.0], "sparse data: no move");
    feeder.abort();

    // Honest players on 30 networks: a near tie.
    let conditions: Conditions = Arc::new(Mutex::new((80, 78, 30)));
    let feeder = players(&s, conditions);
    s.wait_for("measured", |st| {
        gb(st)["cdns"][1]["measured"].as_f64().is_some()
    })
    .await;
    // One /24 (behind the proxy, several addresses) claims fastly is slow, as fast
    // as it can post.
    let poisoner = {
        let (http, addr) = (s.http.clone(), s.steering);
        // A real ticket of that /24 (tickets are per region, not per address).
        let ticket = s.ticket("www.example.com", "100.100.100.1").await;
        tokio::spawn(async move {
            let body = format!(
                r#"{{"ticket":"{ticket}","samples":[{{"cdn":"fastly","ttfb_ms":5000,"ok":false}}]}}"#
            );
            for i in 0..10_000u32 {
                let r = http
                    .post(format!("http://{addr}/rum/www.example.com"))
                    .header("x-forwarded-for", format!("100.100.100.{}", i % 250))
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await
                    .unwrap();
                assert!(matches!(r.status().as_u16(), 204 | 429));
            }
        })
    };
    let t = Instant::now();
    let seen = watch(&s, |_, _| poisoner.is_finished()).await;
    assert_eq!(seen, [90.0], "poisoning: no move");
    let state = s.state().await;
    let refused: u64 = gb(&state)["cdns"][0]["refused"].as_u64().unwrap();
    let rate = s
        .metric(r#"steerdns_rum_samples_total{result="refused_rate"}"#)
        .await
        .unwrap_or(0.0);
    assert!(
        refused > 0 && refused as f64 + rate >= 9_000.0,
        "refused: {refused} over the share, {rate} over the rate ({:?})",
        t.elapsed()
    );
    feeder.abort();
}

/// Flapping: fastly 80 ↔ 300 ms every half period. The window (two periods) always
/// holds both halves, so the target does not follow each flap: the share moves one
/// way (to the floor, since p75 of a half-slow CDN is slow), without oscillating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flapping_does_not_oscillate() {
    let s = start("perf-flap", 0.3, 0.6).await;
    let conditions: Conditions = Arc::new(Mutex::new((80, 78, 30)));
    let feeder = players(&s, conditions.clone());
    let flapper = {
        let conditions = conditions.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(150)).await;
                let mut c = conditions.lock().unwrap();
                c.0 = if c.0 == 80 { 300 } else { 80 };
            }
        })
    };
    let t = Instant::now();
    let seen = watch(&s, |_, _| t.elapsed() > Duration::from_secs(4)).await;
    flapper.abort();
    feeder.abort();
    // Direction changes, and the largest move against the first direction.
    let steps: Vec<f64> = seen.windows(2).map(|w| w[1] - w[0]).collect();
    let reversals = steps
        .windows(2)
        .filter(|w| w[0].signum() != w[1].signum())
        .count();
    assert!(reversals <= 2, "{reversals} reversals: {seen:?}");
    let first = steps.first().copied().unwrap_or(0.0).signum();
    let against: f64 = steps
        .iter()
        .filter(|d| d.signum() != first)
        .map(|d| d.abs())
        .sum();
    assert!(against <= 10.0, "{against} points of swing back: {seen:?}");
    for w in seen.windows(2) {
        assert!(
            (w[1] - w[0]).abs() <= 10.0 + 1e-6,
            "a step over 10 points: {seen:?}"
        );
    }
}

/// `min_networks` deciding alone: a figure counts with 100 samples from 30 networks.
/// 25 networks post fastly at 300 ms and cloudflare at 78 ms, every 50 ms: each holds
/// about 4 % of a window (under its 5 % share, so the share cap does not decide) and
/// the window holds well over 100 samples of each CDN (so `min_samples` does not
/// decide), yet for 1.5 s (five evaluations) nothing moves and both CDNs are
/// `perf_stale` with no measured figure. Five more networks post the same: fastly
/// leaves its policy share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_networks_alone_holds_the_shift_until_enough_networks_report() {
    let dir = scratch("perf-min-networks");
    policy_needing(&dir, 0.3, 2.0, 100, 30);
    let s = Stack::start(&dir).await;
    let conditions: Conditions = Arc::new(Mutex::new((300, 78, 25)));
    let feeder = players(&s, conditions.clone());
    // Both windows full of samples from 25 networks, as an evaluation saw them.
    let window = |st: &Value, cdn: usize, field: &str| {
        gb(st)["cdns"][cdn]["window"][field].as_u64().unwrap_or(0)
    };
    s.wait_for("both windows with 25 networks and 300 samples", |st| {
        (0..2).all(|c| window(st, c, "networks") == 25 && window(st, c, "ttfb_samples") >= 300)
    })
    .await;
    let full = s.state().await;
    let full_at = gb(&full)["evaluated_unix_ms"].as_u64().unwrap();
    let held = Instant::now();
    let seen = watch(&s, |_, _| held.elapsed() > Duration::from_millis(1500)).await;
    let st = s.state().await;
    assert_eq!(
        seen,
        [90.0],
        "25 of 30 networks moved the shares: {:#}",
        gb(&st)
    );
    let evaluated = gb(&st)["evaluated_unix_ms"].as_u64().unwrap();
    assert!(
        evaluated >= full_at + 4 * 300,
        "evaluated at {full_at} and {evaluated} only"
    );
    for c in 0..2 {
        let cdn = &gb(&st)["cdns"][c];
        assert_eq!(cdn["reason"], "perf_stale", "{cdn}");
        assert!(cdn["measured"].is_null(), "{cdn}");
        assert_eq!(window(&st, c, "networks"), 25, "{cdn}");
        let samples = window(&st, c, "ttfb_samples");
        assert!(samples >= 300, "min_samples (100) must not decide: {cdn}");
        assert!(
            cdn["refused"].as_u64().unwrap_or(0) * 10 < samples,
            "the share cap must not decide: {cdn}"
        );
    }

    // Five more networks: 30 report, the figures count, fastly leaves 90.
    let more: Conditions = Arc::new(Mutex::new((300, 78, 5)));
    let feeder2 = players_from(&s, more, 25);
    let seen = watch(&s, |f, r| {
        f < 90.0 && (r == "perf_penalty" || r == "perf_floor")
    })
    .await;
    let st = s.state().await;
    assert_eq!(window(&st, 0, "networks"), 30, "{:#}", gb(&st));
    assert!(
        seen.windows(2).all(|w| w[0] - w[1] <= 10.0 + 1e-6),
        "{seen:?}"
    );
    feeder.abort();
    feeder2.abort();
    s.stop().await;
}

/// The cadence of shifts: fastly slow on 30 networks goes from 90 down to its floor,
/// and no two shifts of the region are closer than `shift_period_seconds` (0.3 s),
/// counted from the evaluations' own timestamps (`/v1/state`
/// `performance[].evaluated_unix_ms` of the state that first shows each new share),
/// not from when the test happened to read them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_two_shifts_of_a_region_are_closer_than_a_period() {
    let s = start("perf-cadence", 0.3, 0.6).await;
    let conditions: Conditions = Arc::new(Mutex::new((300, 78, 30)));
    let feeder = players(&s, conditions);
    let deadline = Instant::now() + Duration::from_secs(20);
    // (fastly share, the evaluation that put it in force)
    let mut shifts: Vec<(f64, u64)> = Vec::new();
    loop {
        let st = s.state().await;
        let (f, _, reason) = shares(&st);
        let at = gb(&st)["evaluated_unix_ms"].as_u64().unwrap_or(0);
        if f != shifts.last().map_or(90.0, |l| l.0) {
            shifts.push((f, at));
        }
        if f == 10.0 && reason == "perf_floor" {
            break;
        }
        assert!(Instant::now() < deadline, "never at the floor: {shifts:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    feeder.abort();
    assert!(shifts.len() >= 8, "90 to 10 in steps of 10: {shifts:?}");
    for w in shifts.windows(2) {
        assert!(
            w[1].1 >= w[0].1 + 300,
            "two shifts {} ms apart (period 300 ms): {shifts:?}",
            w[1].1 as i64 - w[0].1 as i64
        );
    }
    s.stop().await;
}

/// Two nodes of a set on a real three-member etcd, the beacons split between them:
/// 16 networks post to each, and a figure counts with 50 samples from 20 networks,
/// which neither node holds alone (a network holds 3 samples of a window at most).
/// Together they do: both nodes shift fastly to its floor on the set's evaluations
/// and answer 200 resolvers alike. An evaluation written by hand far ahead is taken
/// by neither and written over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beacons_split_between_two_nodes_move_both_alike() {
    if !require_etcd("beacons_split_between_two_nodes_move_both_alike")
        || !common::require_dig("beacons_split_between_two_nodes_move_both_alike")
    {
        return;
    }
    let etcd = EtcdSet::start("perf-set").await;
    let mut nodes = Vec::new();
    for i in 1..=2 {
        let dir = scratch(&format!("perf-set-ns{i}"));
        policy_needing(&dir, 0.5, 3.0, 50, 20);
        let opts = etcd.node_options(&format!("ns{i}"), &["ns1", "ns2"]);
        nodes.push(Stack::start_node(&dir, &format!("ns{i}"), opts).await);
    }
    for n in &nodes {
        n.wait_for("connected to etcd", |s| s["cluster"]["connected"] == true)
            .await;
    }
    let conditions: Conditions = Arc::new(Mutex::new((300, 80, 16)));
    let feeders = [
        players_from(&nodes[0], conditions.clone(), 0),
        players_from(&nodes[1], conditions.clone(), 16),
    ];
    for n in &nodes {
        let s = n
            .wait_for("fastly at its floor", |st| {
                let (f, c, r) = shares(st);
                (f, c, r.as_str()) == (10.0, 90.0, "perf_floor")
            })
            .await;
        // The figures are the set's: more networks than the node's 16.
        let fastly = &gb(&s)["cdns"][0];
        assert!(
            fastly["window"]["networks"].as_u64() >= Some(20),
            "{fastly}"
        );
        let by = gb(&s)["evaluated_by"].as_str().unwrap_or("");
        assert!(by == "ns1" || by == "ns2", "{:#}", gb(&s));
        assert_eq!(gb(&s)["evaluated_unix_ms"].as_u64().unwrap() % 500, 0);
    }
    // Both nodes answer 200 resolvers alike, measured while neither node's shares
    // moved (a node whose window runs short for a period drifts back for a period, on
    // both nodes alike, and the measure is taken again).
    let mut tries = 0;
    let answers = loop {
        let before = [
            shares(&nodes[0].state().await),
            shares(&nodes[1].state().await),
        ];
        let answers = [
            dns_answers(&nodes[0], 200).await,
            dns_answers(&nodes[1], 200).await,
        ];
        let after = [
            shares(&nodes[0].state().await),
            shares(&nodes[1].state().await),
        ];
        if before[0] == before[1] && before == after && before[0].0 == 10.0 {
            break answers;
        }
        tries += 1;
        assert!(
            tries < 5,
            "the shares kept moving: {before:?}, then {after:?}"
        );
    };
    assert_eq!(answers[0], answers[1], "the two nodes answer alike");
    let fastly = answers[0]
        .iter()
        .filter(|c| c.starts_with("fastly."))
        .count();
    assert!(
        (10..=35).contains(&fastly),
        "fastly {fastly} of 200 at its 10 % floor"
    );

    // An evaluation written by hand far ahead (it would hold the set at 50/50 until
    // then): taken by neither, and the next evaluation writes over it.
    let put_at = common::stack::unix_ms();
    let (ok, said) = etcd.put_as(
        None,
        "/steerdns/shift/www.example.com./0",
        r#"{"at_unix_ms":9000000000000,"node":"mallory","region":"gb","policy":[90,10],"cdns":[["fastly",{"share":50.0,"target":50.0,"reason":"perf_band"}],["cloudflare",{"share":50.0,"target":50.0,"reason":"perf_band"}]]}"#,
    );
    assert!(ok, "{said}");
    for n in &nodes {
        n.wait_for("evaluated again, by a node", |st| {
            assert_ne!(
                gb(st)["evaluated_by"],
                "mallory",
                "took the shift from far ahead: {:#}",
                gb(st)
            );
            gb(st)["evaluated_unix_ms"].as_u64() > Some(put_at)
        })
        .await;
    }
    for f in feeders {
        f.abort();
    }
    for n in nodes {
        n.stop().await;
    }
}

/// Players of `networks` GB /24s that measure only what DNS gives them, as real ones
/// do: every 500 ms each asks for www.example.com with ECS through its own resolver,
/// and posts what it measured of the CDN answered (fastly 300 ms, cloudflare 80 ms).
/// Ten tasks, until dropped.
fn steered_players(s: &Stack, networks: u32) -> Vec<tokio::task::JoinHandle<()>> {
    (0..10)
        .map(|t| {
            let (http, steering, dns) = (s.http.clone(), s.steering, s.dns);
            tokio::spawn(async move {
                let mut tickets: HashMap<u32, String> = HashMap::new();
                loop {
                    for i in (t..networks).step_by(10) {
                        if let Entry::Vacant(e) = tickets.entry(i) {
                            e.insert(fetch_ticket(&http, steering, &player(i)).await);
                        }
                        let q = common::query_edns(
                            "www.example.com.",
                            hickory_proto::rr::RecordType::A,
                            Some((&player(i), 24)),
                        );
                        let from = common::resolver(i as usize);
                        let m = common::ask_from(dns, from, common::Proto::Udp, &q).await;
                        let cname = common::cname_of(&m);
                        let (cdn, ms) = if cname.starts_with("fastly.") {
                            ("fastly", 300)
                        } else {
                            ("cloudflare", 80)
                        };
                        let body = format!(
                            r#"{{"ticket":"{}","samples":[{{"cdn":"{cdn}","ttfb_ms":{ms},"ok":true}},{{"cdn":"{cdn}","ttfb_ms":{ms}}}]}}"#,
                            tickets[&i]
                        );
                        let r = http
                            .post(format!("http://{steering}/rum/www.example.com"))
                            .header("x-forwarded-for", player(i))
                            .header("content-type", "application/json")
                            .body(body)
                            .send()
                            .await
                            .unwrap();
                        assert_eq!(r.status(), 204);
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            })
        })
        .collect()
}

/// Snowball: players measure only the CDN the DNS answer gives them, so a CDN that
/// loses its traffic loses its samples. Fastly, slow, goes down to its floor (10 %),
/// and the players it keeps there still report it: over the next 3 s (a window, six
/// periods) its window never falls under `min_samples` and it stays `perf_floor`,
/// never `perf_stale` (which would send it back up to its policy share).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cdn_at_its_floor_still_gets_enough_samples() {
    let dir = scratch("perf-snowball");
    policy_needing(&dir, 0.5, 3.0, 50, 5);
    let s = Stack::start(&dir).await;
    let players = steered_players(&s, 400);
    watch(&s, |f, r| f == 10.0 && r == "perf_floor").await;
    let held = Instant::now();
    let mut least = u64::MAX;
    while held.elapsed() < Duration::from_secs(3) {
        let st = s.state().await;
        let fastly = &gb(&st)["cdns"][0];
        assert_eq!(
            (fastly["share"].as_f64(), fastly["reason"].as_str()),
            (Some(10.0), Some("perf_floor")),
            "{fastly}"
        );
        let samples = fastly["window"]["ttfb_samples"].as_u64().unwrap_or(0);
        assert!(
            samples >= 50,
            "fastly at its floor: {samples} samples: {fastly}"
        );
        least = least.min(samples);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("fastly at its floor: at least {least} samples per window");
    for p in players {
        p.abort();
    }
    s.stop().await;
}

/// A restart keeps the shift in force: fastly at its floor is there again from the
/// first read after a stop and start on the same state directory, and stays there
/// for 600 ms with no beacon at all (the first window after a start is held: the
/// samples were not saved), instead of starting again from the policy's 90 or
/// drifting up on an empty window; with beacons again it stays at the floor.
/// `steerdns explain` run offline on that directory shows the shift.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_the_shift_in_force() {
    let dir = scratch("perf-restart");
    policy(&dir, 0.3, 1.2);
    let s = Stack::start(&dir).await;
    let conditions: Conditions = Arc::new(Mutex::new((300, 80, 30)));
    let feeder = players(&s, conditions.clone());
    watch(&s, |f, r| f == 10.0 && r == "perf_floor").await;
    feeder.abort();
    s.stop().await;

    let text = common::stack::explain_offline(&dir, "www.example.com", &player(5));
    assert!(
        text.contains("perf_floor"),
        "explain offline shows the shift:\n{text}"
    );

    let s = Stack::start(&dir).await;
    let restarted = Instant::now();
    while restarted.elapsed() < Duration::from_millis(600) {
        let st = s.state().await;
        let (f, c, r) = shares(&st);
        assert_eq!(
            (f, c, r.as_str()),
            (10.0, 90.0, "perf_floor"),
            "{} ms after the restart: {:#}",
            restarted.elapsed().as_millis(),
            gb(&st)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let feeder = players(&s, conditions.clone());
    s.wait_for("fastly measured at its floor", |st| {
        let fastly = &gb(st)["cdns"][0];
        fastly["measured"].as_f64().is_some() && shares(st).0 == 10.0
    })
    .await;
    feeder.abort();
    s.stop().await;
}

/// The prober's time to first byte per vantage point: a node started with
/// `--vantage-address 81.2.69.142` (GB in the test database) counts each probe round
/// as a sample of the GB region, and only there. Its probe of fastly takes 150 ms to
/// its first byte, cloudflare's a few ms: with no beacon at all, fastly goes down to
/// its floor in GB, never more than 10 points per period, while the US region (no
/// vantage point there) holds no sample and stays at its policy weights. A node
/// probing the same CDNs without `--vantage-address` takes no sample: the prober's
/// timings count only where the operator said the prober is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probers_first_byte_moves_the_region_of_its_vantage_point() {
    let fastly = MockCdn::start(Mode::Slow(Duration::from_millis(150))).await;
    let cloudflare = MockCdn::start(Mode::Healthy).await;
    let block = "    performance:
      metric: ttfb_p75
      max_shift_points: 10
      shift_period_seconds: 0.5
      window_seconds: 4
      min_samples: 8
      min_networks: 1
";
    let policy = format!(
        "hostname: www.example.com
ttl: 30
cdns:
  fastly: {{ cname: fastly.cdn.test. }}
  cloudflare: {{ cname: cloudflare.cdn.test. }}
regions:
  - name: gb
    match: [GB]
    weights: {{ fastly: 90, cloudflare: 10 }}
{block}  - name: us
    match: [US]
    weights: {{ fastly: 90, cloudflare: 10 }}
{block}  - match: [\"*\"]
    weights: {{ fastly: 50, cloudflare: 50 }}
"
    );
    let dirs = [scratch("perf-vantage"), scratch("perf-no-vantage")];
    for dir in &dirs {
        std::fs::write(dir.join("steering.yaml"), &policy).unwrap();
        for (cdn, mock) in [("fastly", &fastly), ("cloudflare", &cloudflare)] {
            let text = format!(
                "url: {}\nexpect_body: healthy-v1\ninterval_seconds: 0.2\ntimeout_ms: 200\nmax_ttfb_ms: 190\nquorum: 1\n",
                mock.url("/_health/v1.txt")
            );
            std::fs::write(dir.join("probes").join(format!("{cdn}.yaml")), text).unwrap();
        }
    }
    let s = Stack::start_measuring_from(&dirs[0], "81.2.69.142").await;
    let plain = Stack::start(&dirs[1]).await;
    let seen = watch(&s, |f, r| f == 10.0 && r == "perf_floor").await;
    for w in seen.windows(2) {
        assert!(
            w[0] - w[1] <= 10.0 + 1e-9,
            "at most 10 points per period: {seen:?}"
        );
    }
    let st = s.state().await;
    let region = |st: &Value, name: &str| -> Value {
        st["performance"]
            .as_array()
            .and_then(|a| a.iter().find(|r| r["region"] == name))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let gb = region(&st, "gb");
    assert_eq!(gb["vantage_address"], "81.2.69.142", "{gb:#}");
    // At least the mock's 150 ms, as the histogram reports it: the middle of a bucket at
    // most 1/16 of its value wide (a p75 of 150-151 ms is reported as 148, the middle of
    // 144-151), so no less than 150 less half of 1/16.
    let measured = gb["cdns"][0]["measured"].as_f64().unwrap_or(0.0);
    assert!(
        measured >= 150.0 * (1.0 - 1.0 / 32.0),
        "fastly's p75 from the prober: {gb:#}"
    );
    assert_eq!(gb["cdns"][0]["window"]["networks"], 1, "{gb:#}");
    let us = region(&st, "us");
    assert_eq!(us["vantage_address"], Value::Null, "{us:#}");
    assert_eq!(us["cdns"][0]["share"], 90.0, "{us:#}");
    assert_eq!(us["cdns"][0]["window"]["samples"], 0, "{us:#}");
    let probe = s
        .metric("steerdns_rum_samples_total{result=\"probe\"}")
        .await;
    assert!(
        probe.unwrap_or(0.0) >= 16.0,
        "probe samples counted: {probe:?}"
    );
    // The node without --vantage-address probed as often and took nothing.
    assert!(plain.round("fastly").await >= 8);
    let other = region(&plain.state().await, "gb");
    assert_eq!(other["cdns"][0]["window"]["samples"], 0, "{other:#}");
    assert_eq!(other["cdns"][0]["share"], 90.0, "{other:#}");
    s.stop().await;
    plain.stop().await;
}

/// A stack on [`policy`] (long periods: the shares stay as the policy says) with GB's
/// weights swapped by a staged rollout at 50 % for 10 minutes, served; and the version
/// before it.
async fn half_rolled_out(tag: &str) -> (Stack, String) {
    let dir = scratch(tag);
    policy(&dir, 3600.0, 60.0);
    let original = std::fs::read_to_string(dir.join("steering.yaml")).unwrap();
    let v0 = steerdns::config::version_of(&original);
    let s = Stack::start(&dir).await;
    s.wait_for_path("/v1/policy", "the first version", |p| {
        p["history"][0]["version"] == v0.as_str()
    })
    .await;
    let edited = original.replace(
        "weights: { fastly: 90, cloudflare: 10 }",
        "weights: { fastly: 10, cloudflare: 90 }",
    );
    let r = s
        .http
        .post(format!(
            "http://{}/v1/policy?stages=50,100&stage_seconds=600",
            s.api
        ))
        .bearer_auth(common::stack::TOKEN)
        .header("if-match", format!("\"{v0}\""))
        .body(edited)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());
    s.wait_for_path("/v1/policy", "the new version serving half", |p| {
        p["rollout"]["serving_percent"] == 50.0
    })
    .await;
    (s, v0)
}

/// Four networks of the new version's cohort post slow beacons, with valid tickets, 30
/// times each, while every other player measures alike: each network holds at most 5 %
/// of its cohort's samples, so they cannot halt the rollout by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_few_networks_cannot_halt_a_rollout_by_posting_slow_beacons() {
    let (s, _) = half_rolled_out("perf-rollout-few").await;
    // Every player measures 100 ms, whichever version answers it.
    let mut attackers = Vec::new();
    for i in 0..120 {
        let e = s
            .get(&format!(
                "/v1/explain?name=www.example.com&client={}",
                player(i)
            ))
            .await;
        if e["rollout"]["cohort"] == "canary" && attackers.len() < 4 {
            attackers.push(i);
        }
        let ticket = fetch_ticket(&s.http, s.steering, &player(i)).await;
        let (code, body) = post(&s, "www.example.com", &player(i), beacon(&ticket, 100, 100)).await;
        assert_eq!(code, 204, "{body}");
    }
    assert_eq!(attackers.len(), 4);
    // Four of the new version's networks post 400 ms, 30 beacons each.
    for &i in &attackers {
        let ticket = fetch_ticket(&s.http, s.steering, &player(i)).await;
        for _ in 0..30 {
            let (code, body) =
                post(&s, "www.example.com", &player(i), beacon(&ticket, 400, 400)).await;
            assert!(code == 204 || code == 429, "{code} {body}");
        }
    }
    // A judgement after the last beacon: no halt, and the cohorts show why.
    let posted = steerdns::clock::now_ms();
    let p = s
        .wait_for_path("/v1/policy", "the canary judged after the beacons", |p| {
            p["rollout"]["checked_unix_ms"]
                .as_u64()
                .is_some_and(|t| t > posted)
                || p["history"][0]["how"] == "halt"
        })
        .await;
    assert_ne!(p["history"][0]["how"], "halt", "{p:#}");
    let m = &p["rollout"]["measured"][0];
    assert_eq!(m["region"], "gb", "{p:#}");
    assert_eq!(m["control"]["value"], m["canary"]["value"], "{p:#}");
    let canary = m["canary"]["samples"].as_u64().unwrap();
    assert!(canary < 4 * 30 * 4, "the attackers' samples capped: {p:#}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_rollout_halts_when_its_clients_measure_worse() {
    // A long shift period: the shares stay as the policy says, only the cohorts are
    // compared.
    let (s, v0) = half_rolled_out("perf-rollout").await;
    // Players of the new version's cohort measure 400 ms, the others 100 ms.
    let mut canary = 0;
    for i in 0..120 {
        let e = s
            .get(&format!(
                "/v1/explain?name=www.example.com&client={}",
                player(i)
            ))
            .await;
        let is_canary = e["rollout"]["cohort"] == "canary";
        canary += usize::from(is_canary);
        let ms = if is_canary { 400 } else { 100 };
        let ticket = fetch_ticket(&s.http, s.steering, &player(i)).await;
        let (code, body) = post(&s, "www.example.com", &player(i), beacon(&ticket, ms, ms)).await;
        assert_eq!(code, 204, "{body}");
    }
    assert!((30..=90).contains(&canary), "about half: {canary}");
    let p = s
        .wait_for_path("/v1/policy", "the rollout halted by itself", |p| {
            p["history"][0]["how"] == "halt"
        })
        .await;
    let why = p["history"][0]["why"].as_str().unwrap();
    assert!(
        why.contains("measure ttfb_p75") && why.contains("region gb"),
        "{p:#}"
    );
    assert_eq!(p["version"], v0.as_str());
    s.stop().await;
}
