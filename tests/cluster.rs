//! A set of nameservers sharing one view through a real etcd (three members on
//! loopback, started and stopped by PID): three steerdns nodes in this process, two
//! mock CDNs, and a cuttable relay between each node and each etcd member, so that one
//! node can lose etcd while the others keep it.
//!
//! Needs `etcd` and `etcdctl`: skipped with a message without them, failed under CI.
//! The tests take turns (one etcd set at a time) to keep the timing honest on a small
//! machine.

mod common;

use std::os::unix::process::CommandExt;
use std::time::Duration;

use common::etcd::{require_etcd, EtcdSet};
use common::mock_cdn::{MockCdn, Mode};
use common::relay::Relay;
use common::stack::*;
use common::wan::WanRelay;
use serde_json::{json, Value};
use steerdns::control::cluster::{ClusterOptions, EtcdOptions};
use tokio::sync::Mutex;
use tokio::time::Instant;

static SERIAL: Mutex<()> = Mutex::const_new(());

const PREFIX: &str = "/steerdns/";

struct Set {
    nodes: Vec<Stack>,
    /// Each node's options, to start it again.
    opts: Vec<ClusterOptions>,
    /// Per node, one relay per etcd member.
    relays: Vec<Vec<Relay>>,
    /// With `SetUp::wan_ms`: the long link in front of each etcd member.
    _wan: Vec<WanRelay>,
    a: MockCdn,
    b: MockCdn,
    _dead: MockCdn,
    etcd: EtcdSet,
}

#[derive(Default)]
struct SetUp {
    /// Node whose probes reach no CDN.
    no_cdns: Option<usize>,
    /// etcd authentication on, nodes with this user and password.
    auth: Option<(&'static str, &'static str)>,
    /// Failover step interval, seconds.
    step_seconds: f64,
    /// etcd authentication on with one user and role per member (ns1..ns3 nodes,
    /// agent1 an agent), as the book (user/set/security.md) sets them up.
    member_roles: bool,
    /// The policy of [`commit_policy`] instead (`a` behind its commit).
    commit: bool,
    /// Every node this far from every etcd member, one way (ms; `tests/wan-relay.py`).
    wan_ms: u64,
}

async fn set_up(tag: &str, how: SetUp) -> Set {
    let mut etcd = EtcdSet::start(tag).await;
    if let Some((user, pw)) = how.auth {
        etcd.enable_auth(user, pw, PREFIX);
    }
    if how.member_roles {
        etcd.enable_member_roles(PREFIX, &["ns1", "ns2", "ns3"], &["agent1"]);
    }
    let a = MockCdn::start(Mode::Healthy).await;
    let b = MockCdn::start(Mode::Healthy).await;
    let dead = MockCdn::start(Mode::Refused).await;
    let wan: Vec<WanRelay> = if how.wan_ms > 0 {
        (0..3)
            .map(|m| WanRelay::start(etcd.client_addr(m), how.wan_ms))
            .collect()
    } else {
        Vec::new()
    };
    let member = |m: usize| wan.get(m).map_or(etcd.client_addr(m), |w| w.addr);
    let mut nodes = Vec::new();
    let mut all_opts = Vec::new();
    let mut relays = Vec::new();
    for i in 0..3 {
        let dir = scratch(&format!("{tag}-ns{}", i + 1));
        if how.commit {
            commit_policy(&dir);
        } else {
            policy(&dir, "[50, 100]", how.step_seconds.max(0.5));
        }
        let (ua, ub) = if how.no_cdns == Some(i) {
            (dead.url("/a"), dead.url("/b"))
        } else {
            (a.url("/a"), b.url("/b"))
        };
        probe(&dir, "a", &ua, 1);
        probe(&dir, "b", &ub, 1);
        let mut rs = Vec::new();
        for m in 0..3 {
            rs.push(Relay::start(member(m)).await);
        }
        let opts = ClusterOptions {
            etcd: EtcdOptions {
                endpoints: rs.iter().map(|r| r.url().parse().unwrap()).collect(),
                user: match how.auth {
                    Some((u, p)) => Some((u.to_string(), p.to_string())),
                    None if how.member_roles => {
                        Some((format!("ns{}", i + 1), format!("pw-ns{}", i + 1)))
                    }
                    None => None,
                },
                insecure: how.auth.is_none() && !how.member_roles,
                ..EtcdOptions::default()
            },
            node: format!("ns{}", i + 1),
            prefix: PREFIX.into(),
            members: ["ns1", "ns2", "ns3", "agent1"].map(String::from).to_vec(),
        };
        all_opts.push(opts.clone());
        nodes.push(Stack::start_node(&dir, &format!("ns{}", i + 1), opts).await);
        relays.push(rs);
    }
    let set = Set {
        nodes,
        opts: all_opts,
        relays,
        _wan: wan,
        a,
        b,
        _dead: dead,
        etcd,
    };
    for n in &set.nodes {
        n.wait_for("connected to etcd", |s| s["cluster"]["connected"] == true)
            .await;
    }
    set
}

impl Set {
    /// Cuts node `i` off from every etcd member; its state once it fails static.
    async fn cut_off(&self, i: usize) -> Value {
        for r in &self.relays[i] {
            r.cut();
        }
        self.nodes[i]
            .wait_for(&format!("ns{} fails static", i + 1), |s| {
                s["cluster"]["fail_static"] == true
            })
            .await
    }

    /// Gives node `i` its links to etcd back.
    fn rejoin(&self, i: usize) {
        for r in &self.relays[i] {
            r.join();
        }
    }
}

fn cdns_of(counts: &std::collections::HashMap<String, usize>) -> Vec<String> {
    let mut v: Vec<String> = counts.keys().cloned().collect();
    v.sort();
    v
}

/// Polls `pred` on the answers of node `i` (40 resolvers) until it holds; the time
/// it took from `since`.
async fn answers_until(
    set: &Set,
    i: usize,
    since: Instant,
    what: &str,
    pred: impl Fn(&[String]) -> bool,
) -> Duration {
    let deadline = since + Duration::from_secs(10);
    loop {
        let (counts, _) = set.nodes[i].answers(40).await;
        if pred(&cdns_of(&counts)) {
            return since.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "node {}: {what}: answers {counts:?}",
            i + 1
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn timelines(s: &Value) -> Vec<Value> {
    s["cluster"]["timelines"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// When node `s` took the current step of (www, `cdn`): Unix ms.
fn step_since(s: &Value, cdn: &str) -> Option<u64> {
    s["failover"]
        .as_array()?
        .iter()
        .find(|f| f["cdn"] == cdn && f["name"] == "www.example.com.")?["since_unix_ms"]
        .as_u64()
}

/// Every node 100 ms from every etcd member, one way (200 ms round trips through
/// `tests/wan-relay.py`, as across an ocean): a drain is answered by every node within
/// its writer's answer plus one way and 500 ms; a policy version is served by every node
/// from its instant, half a second after the writer's answer; a node cut off fails
/// static within 3.5 s (the book: "about 3 s").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_an_ocean_every_node_applies_a_lever_within_its_bound_and_fails_static_in_time() {
    if !require_etcd("across_an_ocean…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "wan",
        SetUp {
            wan_ms: 100,
            ..SetUp::default()
        },
    )
    .await;
    for i in 0..3 {
        answers_until(&set, i, Instant::now(), "both CDNs answer", |c| {
            c == ["a", "b"]
        })
        .await;
    }
    let t0 = Instant::now();
    let (status, rule) = set.nodes[0]
        .post(
            "/v1/drains",
            json!({"name": "www.example.com", "cdn": "a", "reason": "across an ocean", "immediate": true}),
        )
        .await;
    let answered = t0.elapsed();
    assert_eq!(status, 201, "{rule}");
    // The write was committed through the long link: at least one round trip.
    assert!(
        answered >= Duration::from_millis(180),
        "answered in {answered:?}: the relay delays nothing?"
    );
    // The writer serves it from its answer on.
    let (counts, _) = set.nodes[0].answers(20).await;
    assert_eq!(counts.get("b"), Some(&20), "{counts:?}");
    let bound = answered + Duration::from_millis(100 + 500);
    let mut took = Vec::new();
    for i in [1, 2] {
        let t = answers_until(&set, i, t0, "only b after the drain", |c| c == ["b"]).await;
        assert!(
            t < bound,
            "ns{}: the drain answered after {t:?} (the writer answered after {answered:?})",
            i + 1
        );
        took.push(t);
    }
    eprintln!(
        "wan 100 ms: drain answered by its writer in {answered:?}, by the others in {took:?}"
    );

    // A policy version through ns2: served by every node from its instant.
    let original = std::fs::read_to_string(set.nodes[0].dir.join("steering.yaml")).unwrap();
    let v0 = steerdns::config::version_of(&original);
    let edited = original.replace("ttl: 30", "ttl: 31");
    assert_ne!(edited, original);
    let v1 = steerdns::config::version_of(&edited);
    let t0 = Instant::now();
    let (code, body) = post_policy(&set.nodes[1], edited, &v0).await;
    let answered = t0.elapsed();
    assert_eq!(code, 202, "{body}");
    let bound = answered + Duration::from_millis(500 + 300);
    for (i, n) in set.nodes.iter().enumerate() {
        n.wait_for("the new version", |s| s["policy_version"] == v1.as_str())
            .await;
        let t = t0.elapsed();
        assert!(
            t < bound,
            "ns{}: the version served after {t:?} (the writer answered after {answered:?})",
            i + 1
        );
    }

    // Cut off, ns3 fails static within about 3 s (3.5 s: the check every 400 ms, its
    // 1 s timeout, a second more for the next member, and a poll).
    let t0 = Instant::now();
    set.cut_off(2).await;
    let t = t0.elapsed();
    assert!(t < Duration::from_millis(3_500), "fail static after {t:?}");
    eprintln!("wan 100 ms: policy answered in {answered:?}; ns3 fail static {t:?} after the cut");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_posted_to_one_node_changes_every_nodes_answers_within_a_second() {
    if !require_etcd("a_drain_posted_to_one_node…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up("drain", SetUp::default()).await;
    for i in 0..3 {
        answers_until(&set, i, Instant::now(), "both CDNs answer", |c| {
            c == ["a", "b"]
        })
        .await;
    }
    let t0 = Instant::now();
    let (status, rule) = set.nodes[0]
        .post(
            "/v1/drains",
            json!({"name": "www.example.com", "cdn": "a", "reason": "INC-7 a drained", "immediate": true}),
        )
        .await;
    assert_eq!(status, 201, "{rule}");
    assert_eq!(rule["written_by"], "ns1");
    // Answered once the writer's own view holds it and it is saved: the writer shows it
    // at once, and answers with it from the first query.
    let id = rule["id"].as_str().unwrap();
    let s = set.nodes[0].state().await;
    assert!(
        s["drains"].to_string().contains(id),
        "read your write: {s:#}"
    );
    let (counts, _) = set.nodes[0].answers(20).await;
    assert_eq!(counts.get("b"), Some(&20), "{counts:?}");
    for i in [1, 2] {
        let took = answers_until(&set, i, t0, "only b after the drain", |c| c == ["b"]).await;
        assert!(
            took < Duration::from_secs(1),
            "node {} answered the drain after {took:?}",
            i + 1
        );
    }
    // Who wrote it, when and why, on another node (shown once saved: after the
    // answers changed).
    let s = set.nodes[2]
        .wait_for("the drain shown", |s| s["drains"][0]["written_by"] == "ns1")
        .await;
    let d = &s["drains"][0];
    assert_eq!(d["written_by"], "ns1", "{s:#}");
    assert_eq!(d["reason"], "INC-7 a drained");
    assert!(d["written_at_unix_ms"].as_u64().is_some());
    assert_eq!(s["cluster"]["drains"][0]["written_by"], "ns1");
    // Removed on node 3: every node answers with both again; node 3 at once.
    let status = set.nodes[2].undrain(id).await;
    assert_eq!(status, 200);
    // The override is gone from node 3's view at once; its drain steps back.
    let s = set.nodes[2].state().await;
    assert!(
        !s["cluster"]["drains"].to_string().contains(id),
        "read your undrain: {s:#}"
    );
    let ending = s["drains"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["status"] != "active");
    assert!(ending, "read your undrain: {s:#}");
    let t1 = Instant::now();
    for i in 0..3 {
        answers_until(&set, i, t1, "both CDNs after the drain ended", |c| {
            c == ["a", "b"]
        })
        .await;
    }
    drop(set.etcd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cdn_broken_for_every_vantage_point_steps_every_node_together() {
    if !require_etcd("a_cdn_broken_for_every_vantage_point…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "steps",
        SetUp {
            step_seconds: 1.5,
            ..SetUp::default()
        },
    )
    .await;
    set.a.set(Mode::Status(503));
    for pct in [50, 100] {
        // When each node shows the step, all three polled in turn: a node that applies
        // the set's view late (a watch it polls, a stalled loop) shows it late.
        let started = Instant::now();
        let mut shown: Vec<Option<u128>> = vec![None; set.nodes.len()];
        let mut since = vec![0; set.nodes.len()];
        while shown.iter().any(Option::is_none) {
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "a {pct}% removed: shown at {shown:?} ms"
            );
            for (i, n) in set.nodes.iter().enumerate() {
                if shown[i].is_some() {
                    continue;
                }
                let s = n.state().await;
                if removed(&s, "a") == Some(pct) {
                    shown[i] = Some(started.elapsed().as_millis());
                    since[i] = step_since(&s, "a").expect("the step's time");
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // "Within milliseconds": 300 ms allows for a loaded machine's late timers and
        // the polling; a node that steps on its own clock or late does not make it.
        let spread = since.iter().max().unwrap() - since.iter().min().unwrap();
        assert!(
            spread < 300,
            "step {pct}%: nodes took it at {since:?} (Unix ms)"
        );
        let shown: Vec<u128> = shown.into_iter().flatten().collect();
        let spread = shown.iter().max().unwrap() - shown.iter().min().unwrap();
        assert!(
            spread < 300,
            "step {pct}%: nodes showed it {shown:?} ms after the poll began"
        );
    }
    // One timeline, written by one node, seen by all.
    let writers: Vec<Value> = {
        let mut w = Vec::new();
        for n in &set.nodes {
            let t = timelines(&n.state().await);
            assert_eq!(t.len(), 1, "{t:?}");
            w.push(t[0]["written_by"].clone());
        }
        w
    };
    assert!(writers.iter().all(|w| *w == writers[0]), "{writers:?}");
    // Recovery: every node back to the configured weights.
    set.a.set(Mode::Healthy);
    for n in &set.nodes {
        n.wait_for("a back to normal", |s| removed(s, "a").is_none())
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_the_cdns_demotes_nothing() {
    if !require_etcd("a_node_cut_off_from_the_cdns…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "nocdn",
        SetUp {
            no_cdns: Some(2),
            ..SetUp::default()
        },
    )
    .await;
    // ns3 sees every CDN fail; the others see them healthy.
    set.nodes[2]
        .wait_for("ns3 unhappy", |s| !s["vantage_unhappy"].is_null())
        .await;
    set.nodes[0]
        .wait_for("ns1 sees ns3 unhappy", |s| {
            s["peers"].as_array().is_some_and(|p| {
                p.iter()
                    .any(|p| p["name"] == "ns3" && !p["unhappy"].is_null())
            })
        })
        .await;
    // Many rounds later, nothing is demoted anywhere.
    set.nodes[2].rounds("a", 20).await;
    for n in &set.nodes {
        let s = n.state().await;
        assert_eq!(removed(&s, "a"), None, "{s:#}");
        assert_eq!(removed(&s, "b"), None, "{s:#}");
        assert!(timelines(&s).is_empty(), "{s:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_etcd_fails_static_then_catches_up() {
    if !require_etcd("a_node_cut_off_from_etcd…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "cut",
        SetUp {
            step_seconds: 30.0,
            ..SetUp::default()
        },
    )
    .await;
    let s = set.cut_off(2).await;
    assert!(s["cluster"]["error"].is_string(), "{s:#}");
    assert_eq!(
        set.nodes[2].metric("steerdns_etcd_fail_static").await,
        Some(1.0)
    );
    assert_eq!(
        set.nodes[0].metric("steerdns_etcd_fail_static").await,
        Some(0.0)
    );
    // a breaks: ns1 and ns2 demote it together; ns3, alone with its own evidence,
    // keeps the last shared state (and keeps answering).
    set.a.set(Mode::Status(503));
    for n in &set.nodes[..2] {
        n.wait_for("a demoted", |s| removed(s, "a") == Some(50))
            .await;
    }
    set.nodes[2]
        .wait_for("ns3's own health says down", |s| {
            health(s, "a")["state"] == "down"
        })
        .await;
    set.nodes[2].rounds("a", 10).await;
    let s = set.nodes[2].state().await;
    assert_eq!(
        removed(&s, "a"),
        None,
        "fail static: no demotion on its own: {s:#}"
    );
    let (counts, _) = set.nodes[2].answers(40).await;
    assert_eq!(
        cdns_of(&counts),
        ["a", "b"],
        "ns3 keeps answering from the last shared state"
    );
    // Back in touch: it follows the set's timeline, at the same step.
    set.rejoin(2);
    let s = set.nodes[2]
        .wait_for("ns3 caught up", |s| {
            s["cluster"]["connected"] == true && removed(s, "a") == Some(50)
        })
        .await;
    assert_eq!(timelines(&s).len(), 1, "{s:#}");
    assert_ne!(timelines(&s)[0]["written_by"], "ns3");
    assert_eq!(
        set.nodes[2].metric("steerdns_etcd_fail_static").await,
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_etcd_member_lost_changes_nothing_two_make_every_node_fail_static() {
    if !require_etcd("one_etcd_member_lost…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let mut set = set_up("members", SetUp::default()).await;
    set.etcd.kill(0);
    // The set still agrees: a drain posted to ns1 reaches ns3. If the member killed led
    // the cluster, the other two elect a leader first (about a second, longer on a
    // loaded machine); meanwhile etcd refuses writes and the API says 503 (retry), as
    // the book says. Nothing else may be answered.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = set.nodes[0]
            .post(
                "/v1/drains",
                json!({"name": "www.example.com", "cdn": "a", "reason": "one member down", "immediate": true}),
            )
            .await;
        if status == 201 {
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(
            Instant::now() < deadline,
            "no drain through one member down: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    answers_until(
        &set,
        2,
        Instant::now(),
        "the drain with a member down",
        |c| c == ["b"],
    )
    .await;
    set.nodes[0].rounds("a", 10).await;
    for n in &set.nodes {
        let s = n.state().await;
        assert_eq!(s["cluster"]["connected"], true, "one member down: {s:#}");
    }
    // Two down: no quorum; every node fails static, keeps the drain, refuses new ones.
    set.etcd.kill(1);
    for n in &set.nodes {
        n.wait_for("fail static", |s| s["cluster"]["fail_static"] == true)
            .await;
    }
    for i in 0..3 {
        let (counts, _) = set.nodes[i].answers(20).await;
        assert_eq!(cdns_of(&counts), ["b"], "node {}: last shared state", i + 1);
    }
    let (status, _) = set.nodes[1]
        .post(
            "/v1/drains",
            json!({"name": "www.example.com", "cdn": "b", "reason": "no quorum", "immediate": true}),
        )
        .await;
    assert_eq!(status, 503);
    // Members back: every node rejoins.
    set.etcd.restart(0);
    set.etcd.restart(1);
    for n in &set.nodes {
        n.wait_for("rejoined", |s| s["cluster"]["connected"] == true)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_observation_is_refused() {
    if !require_etcd("a_forged_observation_is_refused") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "auth",
        SetUp {
            auth: Some(("steerdns", "node-pw-4567")),
            ..SetUp::default()
        },
    )
    .await;
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let forged = r#"{"round":99,"ok":false,"reason":"status 503","settled":true}"#;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let endpoint = &set.etcd.endpoints()[0];
    // Without credentials: etcd refuses the write.
    let answer = http
        .post(format!("{endpoint}/v3/kv/put"))
        .body(json!({"key": b64("/steerdns/obs/forger/a"), "value": b64(forged)}).to_string())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(answer.contains("user name is empty"), "{answer}");
    // With a user's credentials, what does not fit is refused by every node: a CDN
    // outside the policy, a record that is not one, an invented vantage name.
    let token: Value = serde_json::from_str(
        &http
            .post(format!("{endpoint}/v3/auth/authenticate"))
            .body(json!({"name": "steerdns", "password": "node-pw-4567"}).to_string())
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    )
    .unwrap();
    let token = token["token"].as_str().unwrap().to_string();
    for (key, value) in [
        ("/steerdns/obs/forger/zzz", forged),
        ("/steerdns/obs/forger/b", r#"{"round":"x"}"#),
        ("/steerdns/obs/bad vantage/a", forged),
    ] {
        let r = http
            .post(format!("{endpoint}/v3/kv/put"))
            .header("authorization", &token)
            .body(json!({"key": b64(key), "value": b64(value)}).to_string())
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(!r.contains("error"), "{r}");
    }
    for n in &set.nodes {
        let s = n
            .wait_for("three keys refused", |s| s["cluster"]["refused_keys"] == 3)
            .await;
        assert!(
            s["peers"]
                .as_array()
                .unwrap()
                .iter()
                .all(|p| p["name"] != "bad vantage"),
            "{s:#}"
        );
        assert_eq!(n.metric("steerdns_etcd_refused_keys").await, Some(3.0));
    }
    // Nothing was demoted, and the nodes themselves (authenticated) still agree.
    set.nodes[0].rounds("a", 5).await;
    for n in &set.nodes {
        assert_eq!(removed(&n.state().await, "a"), None);
    }
    let (status, body) = set.nodes[1]
        .post(
            "/v1/drains",
            json!({"name": "www.example.com", "cdn": "b", "reason": "auth works", "immediate": true}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    answers_until(&set, 0, Instant::now(), "the drain through auth", |c| {
        c == ["a"]
    })
    .await;
    let _ = &set.b;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freeze_posted_to_one_node_holds_every_node_and_a_resume_on_another_releases_them() {
    if !require_etcd("a_freeze_posted_to_one_node…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "freeze",
        SetUp {
            step_seconds: 30.0,
            ..SetUp::default()
        },
    )
    .await;
    let (status, body) = set.nodes[0]
        .post("/v1/failover/freeze", json!({"reason": "CDN maintenance"}))
        .await;
    assert_eq!(status, 200, "{body}");
    let t0 = Instant::now();
    for n in &set.nodes[1..] {
        n.wait_for("frozen by ns1", |s| {
            s["failover_frozen"]
                .as_str()
                .is_some_and(|f| f.contains("CDN maintenance") && f.contains("ns1"))
                && s["cluster"]["freeze"]["node"] == "ns1"
        })
        .await;
    }
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "took {:?}",
        t0.elapsed()
    );
    // a breaks while frozen: health is tracked, no node takes a step.
    set.a.set(Mode::Status(503));
    for n in &set.nodes {
        n.wait_for("a down", |s| health(s, "a")["state"] == "down")
            .await;
    }
    set.nodes[0].rounds("a", 10).await;
    for n in &set.nodes {
        let s = n.state().await;
        assert_eq!(removed(&s, "a"), None, "frozen: {s:#}");
        assert!(timelines(&s).is_empty(), "{s:#}");
    }
    // Resumed on ns2: every node starts the demotion of a, on one timeline.
    let (status, body) = set.nodes[1]
        .post("/v1/failover/resume", json!({"reason": "window over"}))
        .await;
    assert_eq!(status, 200, "{body}");
    let mut since = Vec::new();
    for n in &set.nodes {
        let s = n
            .wait_for("a demoted after the resume", |s| {
                s["failover_frozen"].is_null() && removed(s, "a") == Some(50)
            })
            .await;
        since.push(step_since(&s, "a").unwrap());
        assert_eq!(timelines(&s)[0]["written_by"], "ns2", "{s:#}");
    }
    let spread = since.iter().max().unwrap() - since.iter().min().unwrap();
    assert!(spread < 300, "{since:?}");
}

/// Failing static while a timeline runs: the timeline goes on by the clock (a node cut
/// off after the first step takes the second at the set's time), and a health change a
/// node made while the whole set was failing static (no etcd quorum: nobody could
/// write) is written once etcd answers again, so that the set follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeline_goes_on_while_failing_static_and_a_change_made_meanwhile_is_written() {
    if !require_etcd("a_timeline_goes_on_while_failing_static…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let mut set = set_up(
        "static-timeline",
        SetUp {
            step_seconds: 2.0,
            ..SetUp::default()
        },
    )
    .await;
    set.a.set(Mode::Status(503));
    let s = set.nodes[2]
        .wait_for("a's first step on ns3", |s| removed(s, "a") == Some(50))
        .await;
    // Every node derives its steps from the shared timeline's start.
    let start = timelines(&s)[0]["start_unix_ms"].as_u64().unwrap();
    let vantages = |s: &Value| s["cluster"]["vantages"].to_string();
    assert!(vantages(&set.nodes[0].state().await).contains("ns3"));
    let cut = Instant::now();
    set.cut_off(2).await;
    // A vantage point that can no longer reach etcd is as good as dead to the set: its
    // observations go with their lease (three probe intervals, at least 2 s).
    set.nodes[0]
        .wait_for("ns3's observations gone", |s| !vantages(s).contains("ns3"))
        .await;
    let gone = cut.elapsed();
    assert!(
        gone < Duration::from_secs(5),
        "ns3's observations gone {gone:?} after the cut, want its 2 s lease"
    );
    // The second step, on ns3 as on the others: at the timeline's time, cut off or not.
    let mut since = Vec::new();
    for n in &set.nodes {
        let s = n
            .wait_for("a's second step", |s| removed(s, "a") == Some(100))
            .await;
        since.push(step_since(&s, "a").unwrap());
    }
    assert_eq!(
        set.nodes[2].state().await["cluster"]["fail_static"],
        true,
        "still cut off at its second step"
    );
    for (i, t) in since.iter().enumerate() {
        let gap = t.saturating_sub(start);
        assert!(
            (1995..2500).contains(&gap),
            "ns{}: second step {gap} ms after the timeline's start, want 2000",
            i + 1
        );
    }
    set.rejoin(2);
    for n in &set.nodes {
        n.wait_for("connected", |s| s["cluster"]["connected"] == true)
            .await;
    }

    // No quorum: every node fails static. a recovers meanwhile; every node sees it
    // with its own probes, but none may start the recovery alone.
    set.etcd.kill(0);
    set.etcd.kill(1);
    for n in &set.nodes {
        n.wait_for("fail static", |s| s["cluster"]["fail_static"] == true)
            .await;
    }
    set.a.set(Mode::Healthy);
    for n in &set.nodes {
        n.wait_for("a up by its own probes", |s| {
            health(s, "a")["state"] == "up"
        })
        .await;
    }
    set.nodes[0].rounds("a", 5).await;
    for n in &set.nodes {
        let s = n.state().await;
        assert_eq!(removed(&s, "a"), Some(100), "failing static: {s:#}");
    }
    // etcd back: the change made meanwhile is written, and every node brings a back.
    set.etcd.restart(0);
    set.etcd.restart(1);
    for n in &set.nodes {
        n.wait_for("rejoined", |s| s["cluster"]["connected"] == true)
            .await;
    }
    for n in &set.nodes {
        let s = n
            .wait_for("a promoted by the set", |s| removed(s, "a") != Some(100))
            .await;
        let t = timelines(&s);
        assert!(
            t.len() == 1 && t[0]["direction"] == "promote",
            "the recovery written as the set's timeline: {s:#}"
        );
    }
}

/// The member of etcd node `i` watches now (from `cluster.endpoint`).
async fn watched_member(set: &Set, i: usize) -> usize {
    let s = set.nodes[i].state().await;
    let endpoint = s["cluster"]["endpoint"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    set.relays[i]
        .iter()
        .position(|r| r.url().trim_end_matches('/') == endpoint.trim_end_matches('/'))
        .unwrap_or_else(|| panic!("node {}: endpoint {endpoint:?} is no relay", i + 1))
}

/// Posts a drain to node `i`, again while etcd answers 503 (a member hung or an
/// election under way); the rule.
async fn drain_through(set: &Set, i: usize, body: Value) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, rule) = set.nodes[i].post("/v1/drains", body.clone()).await;
        if status == 201 {
            return rule;
        }
        assert_eq!(status, 503, "{rule}");
        assert!(
            Instant::now() < deadline,
            "no drain through node {}: {rule}",
            i + 1
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_member_moves_a_node_to_another_and_all_hung_fails_it_static() {
    if !require_etcd("a_hung_member_moves_a_node…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up("hung", SetUp::default()).await;
    // Freeze the member ns1 watches: before, ns1 kept watching it, said "connected"
    // and never saw the drain posted through ns2.
    let hung = watched_member(&set, 0).await;
    set.etcd.stop(hung);
    let t0 = Instant::now();
    let other = (0..3).find(|&i| i != 0).unwrap();
    drain_through(
        &set,
        other,
        json!({"name": "www.example.com", "cdn": "a", "reason": "while a member hangs", "immediate": true}),
    )
    .await;
    let took = answers_until(&set, 0, t0, "ns1 follows through another member", |c| {
        c == ["b"]
    })
    .await;
    // The others too (ns2 is asked below; it may have watched the hung member as well),
    // before every member hangs.
    for i in 1..3 {
        answers_until(&set, i, t0, "the drain followed", |c| c == ["b"]).await;
    }
    let s = set.nodes[0]
        .wait_for("ns1 names the member it uses", |s| {
            s["cluster"]["connected"] == true
        })
        .await;
    let now = watched_member(&set, 0).await;
    assert_ne!(now, hung, "{s:#}");
    eprintln!(
        "ns1 followed the drain {took:?} after member m{} hung",
        hung + 1
    );
    // Every member hung: no node says "connected"; each fails static, keeps answering.
    for m in 0..3 {
        if m != hung {
            set.etcd.stop(m);
        }
    }
    let t1 = Instant::now();
    for n in &set.nodes {
        let s = n
            .wait_for("fail static with every member hung", |s| {
                s["cluster"]["fail_static"] == true
            })
            .await;
        assert!(s["cluster"]["error"].is_string(), "{s:#}");
        assert_eq!(n.metric("steerdns_etcd_fail_static").await, Some(1.0));
    }
    eprintln!(
        "every node failed static {:?} after every member hung",
        t1.elapsed()
    );
    let (counts, _) = set.nodes[1].answers(20).await;
    assert_eq!(
        cdns_of(&counts),
        ["b"],
        "the last shared state keeps serving"
    );
    for m in 0..3 {
        set.etcd.cont(m);
    }
    for n in &set.nodes {
        n.wait_for("back", |s| s["cluster"]["connected"] == true)
            .await;
    }
}

/// Writes `value` at `key` in etcd as root (or anonymously without authentication).
fn put(set: &Set, key: &str, value: &Value) {
    let (ok, said) = set.etcd.put_as(None, key, &value.to_string());
    assert!(ok, "{key}: {said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeline_that_starts_ahead_of_a_nodes_clock_is_taken_at_its_start_or_clamped() {
    if !require_etcd("a_timeline_that_starts_ahead…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "ahead",
        SetUp {
            step_seconds: 3.0,
            ..SetUp::default()
        },
    )
    .await;
    let wall = steerdns::clock::now_ms();
    // Written by a node whose clock is 1.5 s ahead (less than a step interval): every
    // node takes the first step when the start comes, with no other key changing.
    // Before, a node that saw it before its start never took it.
    let timeline = |start: u64| json!({"direction": "demote", "from_level": 0, "start_unix_ms": start, "node": "ns9", "reason": "ahead"});
    put(
        &set,
        &format!("{PREFIX}timeline/www.example.com./a"),
        &timeline(wall + 1500),
    );
    // One two minutes ahead: clamped to one step interval (3 s) from now.
    put(
        &set,
        &format!("{PREFIX}timeline/www.example.com./b"),
        &timeline(wall + 120_000),
    );
    for n in &set.nodes {
        let s = n
            .wait_for("a's first step at the start", |s| {
                removed(s, "a") == Some(50)
            })
            .await;
        let since = step_since(&s, "a").unwrap();
        assert!(
            since + 200 >= wall + 1500,
            "not before its start: {since} < {}",
            wall + 1500
        );
        n.wait_for("b's start clamped to one interval", |s| {
            removed(s, "b") == Some(50)
        })
        .await;
    }
    // The observed skew against etcd is shown (one clock here, which no `Date` can
    // prove wrong: exactly 0, not the middle of a second's uncertainty), also by a
    // node that probes nothing (the session measures it, not the probe rounds).
    let s = set.nodes[0].state().await;
    assert_eq!(s["cluster"]["clock_skew_ms"], 0, "{s:#}");
    let dir = scratch("ahead-ns4");
    policy(&dir, "[50, 100]", 1.0);
    let members = ["ns1", "ns2", "ns3", "ns4"];
    let ns4 = Stack::start_node(&dir, "ns4", set.etcd.node_options("ns4", &members)).await;
    ns4.wait_for("ns4 connected", |s| {
        s["cluster"]["connected"] == true && s["cluster"]["clock_skew_ms"].is_i64()
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let gauge = ns4.metric("steerdns_etcd_clock_skew_seconds").await;
        if gauge == Some(0.0) {
            break;
        }
        assert!(Instant::now() < deadline, "the skew gauge says {gauge:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_member_writes_only_its_own_keys_and_outsiders_do_not_count() {
    if !require_etcd("each_member_writes_only_its_own_keys…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "roles",
        SetUp {
            member_roles: true,
            ..SetUp::default()
        },
    )
    .await;
    let obs = r#"{"round":9,"ok":false,"reason":"status 503","settled":true}"#;
    let agent = Some(("agent1", "pw-agent1"));
    let node = Some(("ns1", "pw-ns1"));
    let drain = json!({"rule": {"id": "hand-1", "name": "www.example.com.", "cdn": "a", "reason": "x"}, "node": "ns1", "at_unix_ms": 1}).to_string();
    let head = json!({"seq": 0, "hash": "0".repeat(64), "at_unix_ms": 1}).to_string();
    // The roles the book gives: an agent writes its own observations only...
    let cases = [
        (
            agent,
            format!("{PREFIX}obs/agent1/a"),
            obs.to_string(),
            true,
        ),
        (agent, format!("{PREFIX}obs/ns1/a"), obs.to_string(), false),
        (agent, format!("{PREFIX}drain/hand-1"), drain.clone(), false),
        (agent, format!("{PREFIX}freeze"), "{}".to_string(), false),
        // ...a node its own observations and the shared keys.
        (node, format!("{PREFIX}obs/ns2/a"), obs.to_string(), false),
        (
            node,
            format!("{PREFIX}obs/agent1/b"),
            obs.to_string(),
            false,
        ),
        (node, format!("{PREFIX}drain/hand-1"), drain.clone(), true),
        // ...and its own audit entries (not another's), and a tenant's freeze.
        (node, format!("{PREFIX}audit/ns1/1"), "{}".to_string(), true),
        (
            node,
            format!("{PREFIX}audit/ns2/1"),
            "{}".to_string(),
            false,
        ),
        (
            agent,
            format!("{PREFIX}audit/agent1/1"),
            "{}".to_string(),
            false,
        ),
        (node, format!("{PREFIX}freeze/acme"), "{}".to_string(), true),
        // ...and its own audit head: that one key, not another member's.
        (node, format!("{PREFIX}audit-head/ns1"), head.clone(), true),
        (node, format!("{PREFIX}audit-head/ns2"), head.clone(), false),
        (
            node,
            format!("{PREFIX}audit-head/ns10"),
            head.clone(),
            false,
        ),
        (agent, format!("{PREFIX}audit-head/agent1"), head, false),
    ];
    for (user, key, value, allowed) in &cases {
        let (ok, said) = set.etcd.put_as(*user, key, value);
        assert_eq!(ok, *allowed, "{user:?} put {key}: {said}");
        if !allowed {
            assert!(said.contains("permission denied"), "{said}");
        }
    }
    for key in ["drain/hand-1", "audit/ns1/1", "freeze/acme"] {
        set.etcd.delete(&format!("{PREFIX}{key}"));
    }
    // Observations under names outside --members (written by root: someone who can
    // write the prefix) are refused and counted by every node, and never count: two
    // invented vantage points seeing b fail demote nothing.
    for forger in ["forger1", "forger2"] {
        let (ok, said) = set
            .etcd
            .put_as(None, &format!("{PREFIX}obs/{forger}/b"), obs);
        assert!(ok, "{said}");
    }
    for n in &set.nodes {
        let s = n
            .wait_for("two outsiders refused", |s| {
                s["cluster"]["refused_keys"].as_u64() >= Some(2)
                    && s["cluster"]["last_refused"]
                        .as_str()
                        .is_some_and(|w| w.contains("not a member"))
            })
            .await;
        assert!(
            s["peers"]
                .as_array()
                .unwrap()
                .iter()
                .all(|p| !p["name"].as_str().unwrap().starts_with("forger")),
            "{s:#}"
        );
    }
    set.nodes[0].rounds("b", 5).await;
    for n in &set.nodes {
        assert_eq!(removed(&n.state().await, "b"), None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_still_stepping_back_counts_and_a_seventh_scope_written_by_hand_applies_nowhere() {
    if !require_etcd("a_drain_still_stepping_back_counts…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "scopes",
        SetUp {
            step_seconds: 30.0,
            ..SetUp::default()
        },
    )
    .await;
    let countries = ["GB", "FR", "DE", "JP", "US", "CA"];
    let mut ids = Vec::new();
    for c in countries {
        let rule = drain_through(
            &set,
            0,
            json!({"name": "www.example.com", "cdn": "a", "where": [c], "reason": format!("{c} drained"), "immediate": true}),
        )
        .await;
        ids.push(rule["id"].as_str().unwrap().to_string());
    }
    for n in &set.nodes {
        n.wait_for("six drains", |s| {
            s["cluster"]["drains"]
                .as_array()
                .is_some_and(|d| d.len() == 6)
        })
        .await;
    }
    // The routine sequence: one removed (it steps back over 30 s), another added.
    assert_eq!(set.nodes[1].undrain(&ids[0]).await, 200);
    for n in &set.nodes {
        n.wait_for("GB stepping back", |s| {
            s["drains"]
                .as_array()
                .is_some_and(|d| d.iter().any(|d| d["status"] == "ending"))
        })
        .await;
    }
    let (status, body) = set.nodes[2]
        .post(
            "/v1/drains",
            json!({"name": "www.example.com", "cdn": "a", "where": ["AU"], "reason": "a seventh", "immediate": true}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    // The same drain written by hand (or by a node that let it through): refused by
    // every node, shown and counted, and never applied everywhere.
    let rule = json!({"rule": {"id": "hand-au", "name": "www.example.com.", "cdn": "a", "scope": ["AU"], "reason": "by hand", "immediate": true}, "node": "ns9", "at_unix_ms": 1});
    put(&set, &format!("{PREFIX}drain/hand-au"), &rule);
    for n in &set.nodes {
        let s = n
            .wait_for("the seventh refused", |s| {
                s["drains"].as_array().is_some_and(|d| {
                    d.iter().any(|d| {
                        d["id"] == "hand-au" && d["status"] == "refused: too many location scopes"
                    })
                }) && s["cluster"]["refused_keys"].as_u64() >= Some(1)
            })
            .await;
        assert!(
            s["drains"]
                .as_array()
                .unwrap()
                .iter()
                .all(|d| !d["where"].as_array().unwrap().is_empty()),
            "{s:#}"
        );
        // The resolvers here are located nowhere in those countries: both CDNs answer.
        let (counts, _) = n.answers(40).await;
        assert_eq!(cdns_of(&counts), ["a", "b"], "{s:#}");
    }
}

/// Resident memory of this process (the three nodes run in it), kB.
fn rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_oversize_keys_are_refused_and_not_kept() {
    if !require_etcd("a_thousand_oversize_keys…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up("bounds", SetUp::default()).await;
    set.nodes[0].rounds("a", 3).await;
    let before = rss_kb();
    use base64::Engine;
    let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let endpoint = set.etcd.endpoints()[0].clone();
    // Just over 64 KiB each: observations of a member, and keys outside the schema.
    let value = b64(&vec![b'x'; 65 * 1024 + 1]);
    for i in 0..1000 {
        let key = if i % 2 == 0 {
            format!("{PREFIX}obs/ns2/c{i}")
        } else {
            format!("{PREFIX}junk/{i}")
        };
        let r = http
            .post(format!("{endpoint}/v3/kv/put"))
            .body(json!({"key": b64(key.as_bytes()), "value": value}).to_string())
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{key}: {}", r.status());
    }
    drop(value);
    for n in &set.nodes {
        n.wait_for("a thousand refused", |s| {
            s["cluster"]["refused_keys"].as_u64() >= Some(1000)
        })
        .await;
    }
    set.nodes[0].rounds("a", 3).await;
    let after = rss_kb();
    eprintln!("RSS {before} kB before, {after} kB after 1000 keys of 65 KiB (3 nodes)");
    assert!(
        after < before + 5 * 1024,
        "RSS grew from {before} kB to {after} kB"
    );
    // A node cut off and back reads them all anew (in pages, kind by kind) and keeps
    // none either: ns2's 500 observations are refused again (the keys outside the
    // schema belong to no kind a whole read takes: they are not read at all).
    set.cut_off(1).await;
    set.rejoin(1);
    let s = set.nodes[1]
        .wait_for("ns2 read everything again", |s| {
            s["cluster"]["connected"] == true && s["cluster"]["refused_keys"].as_u64() >= Some(500)
        })
        .await;
    assert!(
        s["cluster"]["vantages"].as_array().unwrap().len() <= 3,
        "{s:#}"
    );
    // One node read them all again: its growth stays within the same bound.
    let end = rss_kb();
    eprintln!("RSS {end} kB after ns2 read them all again");
    assert!(
        end < after + 5 * 1024,
        "RSS grew from {after} kB to {end} kB after a re-read"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_clock_is_two_seconds_behind_sees_the_skew_and_steps_with_the_set() {
    if !require_etcd("a_node_whose_clock_is_two_seconds_behind…") {
        return;
    }
    if !common::etcd::have("faketime") {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("faketime is required in CI (apt-get install -y faketime)");
        }
        eprintln!("SKIPPED: faketime not installed (apt-get install -y faketime)");
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "skew",
        SetUp {
            step_seconds: 3.0,
            ..SetUp::default()
        },
    )
    .await;
    // ns4: the steerdns binary under faketime, its wall clock 2 s behind.
    let dir = scratch("skew-ns4");
    policy(&dir, "[50, 100]", 3.0);
    probe(&dir, "a", &set.a.url("/a"), 1);
    probe(&dir, "b", &set.b.url("/b"), 1);
    let api = common::etcd::free_port();
    let dns = common::etcd::free_port();
    let log = std::fs::File::create(dir.join("ns4.log")).unwrap();
    let ns4 = std::process::Command::new("faketime")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .args(["-f", "-2s", common::BIN, "serve"])
        .args(common::stack::stack_inputs(&dir))
        .args([
            "--listen",
            &format!("127.0.0.1:{dns}"),
            "--api",
            &format!("127.0.0.1:{api}"),
        ])
        .args(["--steering-http", "off", "--node", "ns4", "--etcd-insecure"])
        .args([
            "--members",
            "ns1,ns2,ns3,ns4",
            "--etcd",
            &set.etcd.endpoints().join(","),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(log)
        // Its own process group: `faketime` forks steerdns as its child, so the group
        // is what is stopped (killing `faketime` alone left steerdns running).
        .process_group(0)
        .spawn()
        .expect("faketime steerdns starts");
    // Stopped by its PID, also when the test fails.
    let _ns4 = KillOnDrop(ns4);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let state = || async {
        let r = http
            .get(format!("http://127.0.0.1:{api}/v1/state"))
            .send()
            .await;
        match r {
            Ok(r) => {
                serde_json::from_str(&r.text().await.unwrap_or_default()).unwrap_or(Value::Null)
            }
            Err(_) => Value::Null,
        }
    };
    let wait = |what: &'static str, pred: fn(&Value) -> bool| {
        let state = &state;
        let log = dir.join("ns4.log");
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let s = state().await;
                if pred(&s) {
                    return s;
                }
                assert!(
                    Instant::now() < deadline,
                    "ns4: {what}: {s:#}\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    // It sees etcd's clock 2 s ahead of its own (measured from the first answer, so
    // possibly before its first whole read is in: connected is waited for too).
    wait("connected, the skew measured", |s| {
        s["cluster"]["connected"] == true
            && s["cluster"]["clock_skew_ms"]
                .as_i64()
                .is_some_and(|k| (1300..=2700).contains(&k))
    })
    .await;
    // a breaks: ns4, 2 s behind, takes the first step when the set does (by the real
    // clock), though the timeline's start lies 2 s ahead of its own clock.
    set.a.set(Mode::Status(503));
    let mut since = Vec::new();
    for n in &set.nodes {
        let s = n
            .wait_for("a 50% removed", |s| removed(s, "a") == Some(50))
            .await;
        since.push(step_since(&s, "a").unwrap());
    }
    let s = wait("ns4 takes the step", |s| removed(s, "a") == Some(50)).await;
    let ns4_real = step_since(&s, "a").unwrap() + 2000;
    let first = *since.iter().min().unwrap();
    assert!(
        ns4_real.abs_diff(first) < 3000,
        "ns4 stepped at {ns4_real} (real clock), the others at {since:?}"
    );
}

/// A process started in its own group, stopped with its whole group (the wrapper and
/// what it started) by the group's ID, also when the test fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let group = i32::try_from(self.0.id()).expect("a PID fits in i32");
        // SAFETY: kill(2) with a negative PID signals that process group; no memory
        // is touched.
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// Every node holds the same audit chain: entries go through etcd and each node
/// appends them in revision order, whichever node they happened on.
#[tokio::test]
async fn every_node_appends_the_same_audit_chain() {
    if !require_etcd("every_node_appends_the_same_audit_chain") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "audit",
        SetUp {
            step_seconds: 0.5,
            ..SetUp::default()
        },
    )
    .await;
    let drain = json!({"name": "www.example.com", "cdn": "b", "reason": "audit", "where": ["GB"]});
    let (status, body) = set.nodes[0].post("/v1/drains", drain).await;
    assert_eq!(status, 201, "{body}");
    let (status, _) = set.nodes[1]
        .post("/v1/failover/freeze", json!({"reason": "f"}))
        .await;
    assert_eq!(status, 200);
    let (status, _) = set.nodes[2]
        .post("/v1/failover/resume", json!({"reason": "r"}))
        .await;
    assert_eq!(status, 200);
    // As an operator would: undrained on ns2 once ns2 shows the drain (it comes through
    // etcd; on a loaded machine it was not there yet, and the DELETE got 404).
    let id = body["id"].as_str().unwrap();
    set.nodes[1]
        .wait_for("the drain seen by ns2", |s| {
            s["drains"]
                .as_array()
                .is_some_and(|d| d.iter().any(|d| d["id"] == id))
        })
        .await;
    assert_eq!(set.nodes[1].undrain(id).await, 200);
    // a breaks: every node's health transition and the steps are audited too.
    set.a.set(Mode::Status(503));
    let logs: Vec<_> = set
        .nodes
        .iter()
        .map(|n| n.dir.join("state/audit.jsonl"))
        .collect();
    let read = |p: &std::path::PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let texts: Vec<String> = logs.iter().map(read).collect();
        // Each node appends in the same order: one log is always the start of another.
        for t in &texts[1..] {
            let (short, long) = if t.len() < texts[0].len() {
                (t, &texts[0])
            } else {
                (&texts[0], t)
            };
            assert!(
                long.starts_with(short.as_str()),
                "the chains differ:\n{}\n---\n{t}",
                texts[0]
            );
        }
        let kinds = |t: &str| -> Vec<String> {
            t.lines()
                .map(|l| {
                    serde_json::from_str::<Value>(l).unwrap()["kind"]
                        .as_str()
                        .unwrap()
                        .to_string()
                })
                .collect()
        };
        let k = kinds(&texts[0]);
        let done = ["drain", "freeze", "resume", "undrain"]
            .iter()
            .all(|w| k.iter().any(|x| x == w))
            && k.iter().filter(|x| *x == "health").count() == 3
            && k.iter().filter(|x| *x == "step").count() >= 3
            && texts.iter().all(|t| *t == texts[0]);
        if done {
            let v = steerdns::control::disk::audit::verify(&[logs[0].clone()]).unwrap();
            assert_eq!(v.first_seq, 1);
            let nodes: Vec<String> = texts[0]
                .lines()
                .map(|l| {
                    serde_json::from_str::<Value>(l).unwrap()["node"]
                        .as_str()
                        .unwrap()
                        .to_string()
                })
                .collect();
            for n in ["ns1", "ns2", "ns3"] {
                assert!(
                    nodes.iter().any(|x| x == n),
                    "{n} wrote nothing: {}",
                    texts[0]
                );
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "chains never complete and equal:\n{}",
            texts.join("\n---\n")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The entries of node `i`'s audit log.
fn audit_entries(set: &Set, i: usize) -> Vec<Value> {
    let log = set.nodes[i].dir.join("state/audit.jsonl");
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Each node publishes the head of its audit log in the set's store, under its own
/// key (the book's roles let it write no other node's), and every node shows every
/// member's head in `/v1/state`: an operator checks a copy of a node's log against
/// the head that node published (`audit verify --expect-head`), which a copy cut short
/// fails. The head's seq is a metric too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_publishes_its_audit_head_and_shows_the_others() {
    if !require_etcd("every_node_publishes_its_audit_head_and_shows_the_others") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "heads",
        SetUp {
            member_roles: true,
            ..SetUp::default()
        },
    )
    .await;
    let drain = json!({"name": "www.example.com", "cdn": "b", "reason": "heads", "where": ["GB"]});
    let (status, body) = set.nodes[0].post("/v1/drains", drain).await;
    assert_eq!(status, 201, "{body}");
    // Every node's own head, as every node shows it from the store.
    let deadline = Instant::now() + Duration::from_secs(15);
    let states = loop {
        let mut states = Vec::new();
        for n in &set.nodes {
            states.push(n.state().await);
        }
        let published = |i: usize, j: usize| {
            let own = &states[i]["audit"]["head"];
            own.as_str().is_some_and(|h| !h.starts_with("0:"))
                && states[j]["cluster"]["audit_heads"][format!("ns{}", i + 1)]["head"] == *own
        };
        if (0..3).all(|i| (0..3).all(|j| published(i, j))) {
            break states;
        }
        let shown: Vec<Value> = states
            .iter()
            .map(|s| json!({"own": s["audit"]["head"], "shown": s["cluster"]["audit_heads"]}))
            .collect();
        assert!(
            Instant::now() < deadline,
            "the heads never published and shown: {shown:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // ns2's log holds the head ns2 published (as ns1 shows it); a copy without its last
    // line does not.
    let head = states[0]["cluster"]["audit_heads"]["ns2"]["head"]
        .as_str()
        .unwrap()
        .to_string();
    let seq: f64 = head.split(':').next().unwrap().parse().unwrap();
    assert!(set.nodes[1].metric("steerdns_audit_head_seq").await >= Some(seq));
    let log = set.nodes[1].dir.join("state/audit.jsonl");
    let verify = |p: &std::path::Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_steerdns"))
            .args(["audit", "verify", "--expect-head", &head])
            .arg(p)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), said)
    };
    let (ok, said) = verify(&log);
    assert!(ok, "{said}");
    let text = std::fs::read_to_string(&log).unwrap();
    let cut = set.nodes[1].dir.join("audit-cut.jsonl");
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| serde_json::from_str::<Value>(l).unwrap()["seq"].as_f64() < Some(seq))
        .collect();
    let kept: String = kept.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&cut, kept).unwrap();
    let (ok, said) = verify(&cut);
    assert!(!ok && said.contains("cut short"), "{said}");
}

/// An override written straight to etcd by a member holding a node's credentials,
/// not through a node's API, comes without its writer's audit entry: every node
/// appends an `override_seen` entry to its own log once it waited for one in vain. A
/// drain through a node's API, which that node audits for the set, adds none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_written_straight_to_etcd_is_audited_by_every_node_an_api_drain_once() {
    if !require_etcd("a_drain_written_straight_to_etcd_is_audited_by_every_node…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "unaudited",
        SetUp {
            member_roles: true,
            ..SetUp::default()
        },
    )
    .await;
    let drain = json!({"name": "www.example.com", "cdn": "b", "reason": "through the api", "where": ["GB"]});
    let (status, body) = set.nodes[0].post("/v1/drains", drain).await;
    assert_eq!(status, 201, "{body}");
    let api_id = body["id"].as_str().unwrap().to_string();
    for n in &set.nodes {
        n.wait_for("the API drain", |s| {
            s["drains"]
                .as_array()
                .is_some_and(|d| d.iter().any(|d| d["id"] == api_id.as_str()))
        })
        .await;
    }
    // With ns2's credentials, straight to etcd: the record names ns2, no entry says so.
    let record = json!({
        "rule": {"id": "hand-1", "name": "www.example.com.", "cdn": "a", "reason": "by hand"},
        "node": "ns2", "at_unix_ms": unix_ms(),
    });
    let (ok, said) = set.etcd.put_as(
        Some(("ns2", "pw-ns2")),
        &format!("{PREFIX}drain/hand-1"),
        &record.to_string(),
    );
    assert!(ok, "{said}");
    let seen = |e: &Value| e["kind"] == "override_seen";
    for i in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(15);
        let entries = loop {
            let entries = audit_entries(&set, i);
            if entries
                .iter()
                .any(|e| seen(e) && e["key"] == "drain/hand-1")
            {
                break entries;
            }
            assert!(
                Instant::now() < deadline,
                "ns{}: no override_seen entry",
                i + 1
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // The API drain (seen first, its wait over first) has its writer's entry only.
        let unaudited: Vec<&Value> = entries.iter().filter(|e| seen(e)).collect();
        assert_eq!(unaudited.len(), 1, "ns{}: {unaudited:?}", i + 1);
        let e = unaudited[0];
        assert_eq!(e["key"], "drain/hand-1");
        assert_eq!(e["record_node"], "ns2");
        assert_eq!(e["node"], format!("ns{}", i + 1), "in its own name");
        assert_eq!(e["record"]["rule"]["reason"], "by hand");
        assert!(e["why"]
            .as_str()
            .unwrap()
            .contains("no audit entry from the writer"));
        let api_entries = entries
            .iter()
            .filter(|e| e["kind"] == "drain" && e["id"] == api_id.as_str())
            .count();
        assert_eq!(api_entries, 1, "ns{}", i + 1);
        let log = set.nodes[i].dir.join("state/audit.jsonl");
        steerdns::control::disk::audit::verify(&[log]).unwrap();
    }
}

/// www.example.com with `a` behind a 200,000 GB commit at 30 % (`b` 70 %), evaluated
/// every 0.5 s, by at most 10 points.
fn commit_policy(dir: &std::path::Path) {
    let text = "hostnames:
  www.example.com:
    ttl: 30
    cdns:
      a: { cname: a.cdn.test., contract: { billing: gb_month, commit_gb: 200000, cap_gb: 300000 } }
      b: { cname: b.cdn.test. }
    regions:
      - match: [\"*\"]
        weights: { a: 30, b: 70 }
    commit: { max_shift_points: 10, shift_period_seconds: 0.5 }
";
    std::fs::write(dir.join("steering.yaml"), text).unwrap();
}

/// `a`'s commit state on a node.
fn commit_of(s: &Value) -> Value {
    s["commit"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["cdn"] == "a"))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Usage records of `a` at `mbps` over the six hours before `now` (some may be of
/// the month before: the ledger takes the rate from them), and the bytes of them
/// in `now`'s month.
fn usage_records(now: u64, mbps: f64) -> (Value, f64) {
    let month = steerdns::control::modifiers::commit::month::Month::of(now);
    let last = now / 300_000 * 300_000;
    let starts: Vec<u64> = (1..=72u64).map(|i| last - i * 300_000).collect();
    let bytes = mbps * 1e6 / 8.0 * 300.0;
    let in_month = starts.iter().filter(|&&t| t >= month.start_ms).count() as f64 * bytes;
    let records = starts
        .iter()
        .map(|&t| json!({"cdn": "a", "start": steerdns::control::decide::times::rfc3339(t), "seconds": 300, "mbps": mbps}))
        .collect();
    (Value::Array(records), in_month)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_posted_to_one_node_moves_every_nodes_commit_bias_as_one() {
    if !require_etcd("usage_posted_to_one_node…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "usage",
        SetUp {
            commit: true,
            ..SetUp::default()
        },
    )
    .await;
    // ns3 cut off from etcd: failing static, it holds the biases in force and takes
    // no usage (the set could not keep the same ledger).
    set.cut_off(2).await;
    let (records, in_month) = usage_records(unix_ms(), 300.0);
    let (status, body) = set.nodes[2].post("/v1/usage", records.clone()).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("etcd unreachable"),
        "{body}"
    );

    // Posted to ns1 alone: written for the set, idempotent there too.
    let (status, body) = set.nodes[0].post("/v1/usage", records.clone()).await;
    assert_eq!((status, body["added"].as_u64()), (200, Some(72)), "{body}");
    let (_, body) = set.nodes[0].post("/v1/usage", records.clone()).await;
    assert_eq!(
        (body["added"].as_u64(), body["unchanged"].as_u64()),
        (Some(0), Some(72)),
        "{body}"
    );
    // Both connected nodes keep the same ledger and rise to the bias limit, the
    // same evaluations, written once for the set.
    for n in &set.nodes[..2] {
        n.wait_for("a raised to its bias limit", |s| {
            commit_of(s)["bias_points"].as_f64() == Some(30.0)
        })
        .await;
    }
    let docs: Vec<Value> = [set.nodes[0].state().await, set.nodes[1].state().await]
        .iter()
        .map(commit_of)
        .collect();
    for d in &docs {
        let mtd = d["month_to_date_bytes"].as_f64().unwrap();
        assert!((mtd - in_month).abs() < 1.0, "{d}");
        assert_eq!(d["reason"], "commit_behind", "{d}");
        let by = d["evaluated_by"].as_str().unwrap_or("");
        assert!(by == "ns1" || by == "ns2", "{d}");
        assert_eq!(d["evaluated_unix_ms"].as_u64().unwrap() % 500, 0, "{d}");
    }
    let (counts, _) = set.nodes[1].answers(400).await;
    let a = *counts.get("a").unwrap_or(&0) as f64 / 4.0;
    assert!(
        a > 45.0,
        "ns2 (never posted to) answers a {a} % (policy 30)"
    );
    // ns3 held: no usage, no bias.
    let s = set.nodes[2].state().await;
    assert_eq!(commit_of(&s)["bias_points"].as_f64(), Some(0.0), "{s:#}");
    assert_eq!(commit_of(&s)["month_to_date_bytes"].as_f64(), Some(0.0));

    // Back in touch, ns3 takes the set's ledger and biases as they are: straight to
    // 30, never through 10 or 20 as evaluating on its own would (three periods).
    set.rejoin(2);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = set.nodes[2].state().await;
        let b = commit_of(&s)["bias_points"].as_f64().unwrap_or(-1.0);
        assert!(b == 0.0 || b == 30.0, "ns3 went through {b}: {s:#}");
        if b == 30.0 {
            let mtd = commit_of(&s)["month_to_date_bytes"].as_f64().unwrap();
            assert!((mtd - in_month).abs() < 1.0, "{s:#}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ns3 never took the set's bias: {s:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Biases written by hand far ahead (they would hold the set until then, at -30):
    // no node takes them, and the next evaluation writes over them.
    let put_at = unix_ms();
    put(
        &set,
        &format!("{PREFIX}commit/www.example.com."),
        &json!({"at_unix_ms": 9_000_000_000_000u64, "node": "mallory",
            "biases": {"a": {"points": -30.0, "floored": false, "reason": "none"}}}),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = set.nodes[1].state().await;
        let d = commit_of(&s);
        assert_eq!(
            d["bias_points"].as_f64(),
            Some(30.0),
            "ns2 took the key from far ahead: {d}"
        );
        if d["evaluated_unix_ms"].as_u64() > Some(put_at) {
            assert_ne!(d["evaluated_by"], "mallory", "{d}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the set never evaluated again: {d}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A hand-written day that does not parse, or of another day, counts for nothing.
    let before = set.nodes[0].state().await["cluster"]["refused_keys"]
        .as_f64()
        .unwrap_or(0.0);
    put(
        &set,
        &format!("{PREFIX}usage/a/2020-13-01"),
        &json!({"records": []}),
    );
    put(
        &set,
        &format!("{PREFIX}usage/a/2020-01-01"),
        &json!({"records": [[1, 300, 1e9]]}),
    );
    set.nodes[0]
        .wait_for("the two keys refused", |s| {
            s["cluster"]["refused_keys"].as_f64() >= Some(before + 2.0)
        })
        .await;
    let s = set.nodes[0].state().await;
    let mtd = commit_of(&s)["month_to_date_bytes"].as_f64().unwrap();
    assert!((mtd - in_month).abs() < 1.0, "{s:#}");

    // Biases outside the policy's bounds, written by hand as of now (-100 points where
    // the policy allows ±30, 10 a period): every node refuses and counts them, and
    // the bias in force holds.
    let refused = |s: &Value| s["cluster"]["refused_keys"].as_u64().unwrap_or(0);
    let mut before = Vec::new();
    for n in &set.nodes {
        before.push(refused(&n.state().await));
    }
    put(
        &set,
        &format!("{PREFIX}commit/www.example.com."),
        &json!({"at_unix_ms": unix_ms() + 1, "node": "ns1",
            "biases": {"a": {"points": -100.0, "floored": false, "reason": "cap_ahead"}}}),
    );
    for (n, b) in set.nodes.iter().zip(before) {
        let s = n
            .wait_for("the -100 bias refused", |s| refused(s) > b)
            .await;
        assert_eq!(commit_of(&s)["bias_points"].as_f64(), Some(30.0), "{s:#}");
    }
}

/// What `n` of `kind` junk keys look like under ns1's credentials: names, CDNs and
/// tenants the policy does not have.
fn junk(kind: &str, n: usize) -> Vec<(String, String)> {
    let freeze = json!({"reason": "junk", "node": "ns1", "at_unix_ms": 1}).to_string();
    (0..n)
        .map(|i| match kind {
            "audit" => (
                format!("{PREFIX}audit/ns1/{:016}", i + 1),
                json!({"kind": "junk", "node": "ns1", "at_unix_ms": 1, "pad": "x".repeat(200)})
                    .to_string(),
            ),
            "timeline" => (
                format!("{PREFIX}timeline/junk{i}.example.com./a"),
                "{}".into(),
            ),
            "drain" => (
                format!("{PREFIX}drain/junk-{i}"),
                json!({"rule": {"id": format!("junk-{i}"), "name": format!("junk{i}.example.com."),
                                "cdn": "a", "reason": "junk"}, "node": "ns1", "at_unix_ms": 1})
                .to_string(),
            ),
            "usage" => (format!("{PREFIX}usage/junk{i}/2026-12-01"), "{}".into()),
            "freeze" => (format!("{PREFIX}freeze/junk{i}"), freeze.clone()),
            _ => unreachable!(),
        })
        .collect()
}

/// A member's junk, as its own etcd credentials allow (9,000 audit entries of its own,
/// 1,024 timelines, 256 drains, 4,096 days of usage and 9,000 tenant freezes, all
/// outside the policy), never hides the set's decisions: a node that reads the store
/// anew applies the real drain and freeze and stays connected; the junk is refused
/// and counted; a forged audit entry is refused; the status page stays small.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_junk_never_hides_the_sets_decisions() {
    if !require_etcd("a_members_junk_never_hides_the_sets_decisions") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "junk",
        SetUp {
            member_roles: true,
            step_seconds: 30.0,
            ..SetUp::default()
        },
    )
    .await;
    // ns3 reads the store anew once the junk is in: cut off meanwhile.
    set.cut_off(2).await;
    let ns1 = Some(("ns1", "pw-ns1"));
    let mut kvs = Vec::new();
    for (kind, n) in [
        ("audit", 9000),
        ("timeline", 1024),
        ("drain", 256),
        ("usage", 4096),
        ("freeze", 9000),
    ] {
        kvs.extend(junk(kind, n));
    }
    set.etcd.put_many_as(ns1, &kvs).await;
    // An entry under ns1's key that says it is ns2's.
    let forged = json!({"kind": "drain", "node": "ns2", "at_unix_ms": 1}).to_string();
    let (ok, said) = set
        .etcd
        .put_as(ns1, &format!("{PREFIX}audit/ns1/9999999999999999"), &forged);
    assert!(ok, "{said}");
    // The set's real decisions, through ns2's API: taken and applied.
    let (status, rule) = set.nodes[1]
        .post(
            "/v1/drains",
            json!({"name": "www.example.com", "cdn": "a", "reason": "INC-9 real", "immediate": true}),
        )
        .await;
    assert_eq!(status, 201, "{rule}");
    let id = rule["id"].as_str().unwrap().to_string();
    let (status, body) = set.nodes[1]
        .post("/v1/failover/freeze", json!({"reason": "real freeze"}))
        .await;
    assert_eq!(status, 200, "{body}");
    let applied = |s: &Value| {
        s["cluster"]["connected"] == true
            && s["drains"]
                .as_array()
                .is_some_and(|d| d.iter().any(|d| d["id"] == id.as_str()))
            && s["failover_frozen"]
                .as_str()
                .is_some_and(|f| f.contains("real freeze"))
    };
    for n in &set.nodes[..2] {
        n.wait_for("the drain and the freeze applied", applied)
            .await;
    }
    // ns3, back, reads it all anew: the decisions count, the junk does not.
    set.rejoin(2);
    let s = set.nodes[2]
        .wait_for("ns3 applied the drain and the freeze", applied)
        .await;
    let refused = s["cluster"]["refused_keys"].as_u64().unwrap();
    assert!(refused >= 1024 + 256 + 4096 + 9000, "{refused}");
    let (counts, _) = set.nodes[2].answers(20).await;
    assert_eq!(cdns_of(&counts), ["b"], "the drain applies: {counts:?}");
    for path in ["/v1/state", "/"] {
        let page = get_text(&set.nodes[2].http, set.nodes[2].api, path).await;
        assert!(page.len() < 64 * 1024, "{path}: {} bytes", page.len());
    }
    // Each node's log has ns2's entries; not the forged one; at most 1,024 of ns1's junk.
    for n in &set.nodes {
        let log = n.dir.join("state/audit.jsonl");
        let deadline = Instant::now() + Duration::from_secs(10);
        let text = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("\"real freeze\"") {
                break text;
            }
            assert!(
                Instant::now() < deadline,
                "{}: no freeze entry",
                log.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(lines
            .iter()
            .any(|l| l["kind"] == "drain" && l["node"] == "ns2"));
        assert!(
            !lines
                .iter()
                .any(|l| l["kind"] == "drain" && l["node"] == "ns2" && l["at_unix_ms"] == 1),
            "the forged entry was appended"
        );
        let junk = lines.iter().filter(|l| l["kind"] == "junk").count();
        assert!(junk <= 1024, "{junk} junk entries");
    }
}

/// More keys of one kind of the set's decisions than a read takes: a node that reads
/// the store anew fails static, says why, and reads it whole once the junk is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_is_not_whole_fails_static() {
    if !require_etcd("a_read_that_is_not_whole_fails_static") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "notwhole",
        SetUp {
            member_roles: true,
            step_seconds: 30.0,
            ..SetUp::default()
        },
    )
    .await;
    set.cut_off(2).await;
    set.etcd
        .put_many_as(Some(("ns1", "pw-ns1")), &junk("freeze", 16_400))
        .await;
    set.rejoin(2);
    let s = set.nodes[2]
        .wait_for("ns3 says its read is not whole", |s| {
            s["cluster"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("not read whole"))
        })
        .await;
    assert_eq!(s["cluster"]["fail_static"], true, "{s:#}");
    assert_eq!(
        set.nodes[2].metric("steerdns_etcd_fail_static").await,
        Some(1.0)
    );
    // The nodes that follow the watch refuse the keys one by one and stay connected.
    for n in &set.nodes[..2] {
        assert_eq!(n.state().await["cluster"]["connected"], true);
    }
    set.etcd.delete_prefix(&format!("{PREFIX}freeze/"));
    set.nodes[2]
        .wait_for("ns3 connected again", |s| s["cluster"]["connected"] == true)
        .await;
}

/// The version (old or new) of an answer: the new policy sends `a` to `a2.cdn.test.`.
fn first_new(at: &std::sync::Mutex<Vec<Option<Instant>>>, i: usize) -> Option<Instant> {
    at.lock().unwrap()[i]
}

/// Per node, when it first answered from the new version.
type Firsts = std::sync::Arc<std::sync::Mutex<Vec<Option<Instant>>>>;

/// Polls every node's answer for 100 client networks (ECS) every 50 ms until `stop`:
/// per node, when it first answered from the new version (`a2`), and how many answers
/// from the old one came after that (a node flipping back).
fn poll_versions(
    set: &Set,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (Firsts, tokio::task::JoinHandle<u64>) {
    let at = std::sync::Arc::new(std::sync::Mutex::new(vec![None; 3]));
    let dns: Vec<std::net::SocketAddr> = set.nodes.iter().map(|n| n.dns).collect();
    let seen = at.clone();
    let poll = tokio::spawn(async move {
        use common::*;
        let mut back = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let round = Instant::now();
            for (i, addr) in dns.iter().enumerate() {
                for net in 0..100u32 {
                    let client = format!("10.{}.{}.0", net / 200, net % 200);
                    let q = query_edns(
                        "www.example.com.",
                        hickory_proto::rr::RecordType::A,
                        Some((client.as_str(), 24)),
                    );
                    let m = ask_from(*addr, resolver(net as usize), Proto::Udp, &q).await;
                    // `a2` only in the new version, `a` only in the old (`b` in both).
                    let cname = cname_of(&m);
                    let mut at = seen.lock().unwrap();
                    match (cname.starts_with("a2."), cname.starts_with("a."), at[i]) {
                        (true, _, None) => at[i] = Some(Instant::now()),
                        (_, true, Some(_)) => back += 1,
                        _ => {}
                    }
                }
            }
            tokio::time::sleep_until(round + Duration::from_millis(50)).await;
        }
        back
    });
    (at, poll)
}

/// POST `body` to `node`'s `/v1/policy` with `If-Match: "<if_match>"`.
async fn post_policy(node: &Stack, body: String, if_match: &str) -> (u16, Value) {
    post_staged(node, body, if_match, "").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_version_moves_every_node_at_one_instant_and_rolls_back() {
    if !require_etcd("a_policy_version_moves_every_node…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "policy",
        SetUp {
            member_roles: true,
            step_seconds: 1.0,
            ..SetUp::default()
        },
    )
    .await;
    let original = std::fs::read_to_string(set.nodes[0].dir.join("steering.yaml")).unwrap();
    let v0 = steerdns::config::version_of(&original);
    for n in &set.nodes {
        n.wait_for_path("/v1/policy", "the set's first version", |p| {
            p["history"][0]["version"] == v0.as_str()
        })
        .await;
    }
    let edited = original
        .replace("a: { cname: a.cdn.test. }", "a: { cname: a2.cdn.test. }")
        .replace("weights: { a: 50, b: 50 }", "weights: { a: 100, b: 1 }");
    let v1 = steerdns::config::version_of(&edited);

    // Stale, and broken: 412 and 400, nothing changes anywhere.
    let (code, body) = post_policy(&set.nodes[1], edited.clone(), "0123456789ab").await;
    assert_eq!(code, 412, "{body}");
    let broken = edited.replace("weights: { a: 100, b: 1 }", "weights: { a: 100, zz: 1 }");
    let (code, body) = post_policy(&set.nodes[1], broken, &v0).await;
    assert_eq!(code, 400, "{body}");
    assert!(body["errors"].to_string().contains("weights"), "{body}");

    // Applied through ns1: every node moves at the writer's instant.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (at, poll) = poll_versions(&set, stop.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(*at.lock().unwrap(), vec![None; 3], "moved before the apply");
    let t0 = Instant::now();
    let (code, body) = post_policy(&set.nodes[0], edited.clone(), &v0).await;
    assert_eq!(code, 202, "{body}");
    assert_eq!(body["version"], v1.as_str());
    let wall = steerdns::clock::now_ms();
    let activate = body["activate_at_unix_ms"].as_u64().unwrap();
    // At the instant, less what the writer took to answer.
    let instant = t0 + Duration::from_millis(activate.saturating_sub(wall));
    while (0..3).any(|i| first_new(&at, i).is_none()) {
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", at.lock());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let back = poll.await.unwrap();
    let firsts: Vec<Instant> = (0..3).map(|i| first_new(&at, i).unwrap()).collect();
    let (first, last) = (*firsts.iter().min().unwrap(), *firsts.iter().max().unwrap());
    // A round of polls takes a while: a node is seen switched up to one round late.
    let window = last - first;
    eprintln!(
        "policy apply: activation {} ms after the call; nodes switched within {window:?} of each other (first {:?} after the instant)",
        activate.saturating_sub(wall),
        first.saturating_duration_since(instant)
    );
    assert_eq!(
        back, 0,
        "a node answered from the old version after the new"
    );
    assert!(
        first + Duration::from_millis(100) >= instant,
        "a node switched {:?} before the instant",
        instant - first
    );
    assert!(window < Duration::from_secs(1), "{window:?}");
    for n in &set.nodes {
        let p = n
            .wait_for_path("/v1/policy", "the version in force", |p| {
                p["version"] == v1.as_str()
            })
            .await;
        assert_eq!(p["history"][0]["how"], "api");
        assert_eq!(p["history"][0]["node"], "ns1");
        assert_eq!(p["history"][1]["version"], v0.as_str());
        let info = format!("steerdns_policy_info{{version=\"{v1}\"}}");
        assert_eq!(n.metric(&info).await, Some(1.0));
    }

    // Rolled back through ns2: every node answers as before.
    let (code, body) = set.nodes[1]
        .post("/v1/policy/rollback", json!({"ticket": "INC-9"}))
        .await;
    assert_eq!(code, 202, "{body}");
    assert_eq!(body["version"], v0.as_str());
    let t1 = Instant::now();
    for i in 0..3 {
        answers_until(&set, i, t1, "both CDNs after the rollback", |c| {
            c == ["a", "b"]
        })
        .await;
    }

    // An edit of one node's file moves all three within 2 s; the same file copied to
    // the others afterwards changes nothing more.
    let file = |i: usize| set.nodes[i].dir.join("steering.yaml");
    std::fs::write(file(2), &edited).unwrap();
    let t2 = Instant::now();
    for i in 0..3 {
        let took = answers_until(&set, i, t2, "a2 after the file edit", |c| {
            c.iter().any(|x| x == "a2")
        })
        .await;
        assert!(took < Duration::from_secs(2), "node {}: {took:?}", i + 1);
    }
    let p = set.nodes[0].get("/v1/policy").await;
    assert_eq!(p["history"][0]["how"], "file", "{p:#}");
    assert_eq!(p["history"][0]["node"], "ns3");
    let entries = p["history"].as_array().unwrap().len();
    for i in [0, 1] {
        std::fs::write(file(i), &edited).unwrap();
    }
    for i in [0, 1] {
        set.nodes[i]
            .wait_for("the copy read", |s| s["policy"]["file_differs"] == false)
            .await;
    }
    let p = set.nodes[0].get("/v1/policy").await;
    assert_eq!(p["history"].as_array().unwrap().len(), entries, "{p:#}");
    // ns3 stops; the set moves on (v2 through ns2), and ns3's file is edited while it
    // is down, based on v1: at start it proposes the edit, the set refuses it (stale),
    // and ns3 serves the set's version, its file shown as differing.
    let mut set = set;
    let ns3 = set.nodes.pop().unwrap();
    let dir = ns3.dir.clone();
    ns3.stop().await;
    let other = edited.replace("weights: { a: 100, b: 1 }", "weights: { a: 1, b: 100 }");
    let v2 = steerdns::config::version_of(&other);
    let (code, body) = post_policy(&set.nodes[1], other.clone(), &v1).await;
    assert_eq!(code, 202, "{body}");
    let stale = edited.replace("weights: { a: 100, b: 1 }", "weights: { a: 2, b: 100 }");
    std::fs::write(dir.join("steering.yaml"), &stale).unwrap();
    let ns3 = Stack::start_node(&dir, "ns3", set.opts[2].clone()).await;
    let s = ns3
        .wait_for("ns3 on the set's version", |s| {
            s["policy_version"] == v2.as_str() && s["policy"]["file_error"].is_string()
        })
        .await;
    assert_eq!(s["policy"]["file_differs"], true, "{s:#}");
    assert!(
        s["policy"]["file_error"].as_str().unwrap().contains(&v2),
        "{s:#}"
    );
    assert_eq!(
        ns3.metric("steerdns_policy_file_refused_total").await,
        Some(1.0)
    );
    set.nodes.push(ns3);
    answers_until(&set, 2, Instant::now(), "ns3 answers from v2", |c| {
        c.iter().any(|x| x == "b") && !c.iter().any(|x| x == "a")
    })
    .await;
    let p = set.nodes[0].get("/v1/policy").await;
    assert_eq!(p["version"], v2.as_str(), "{p:#}");
    drop(set.etcd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_cannot_load_the_sets_version_keeps_the_last_good_one_and_says_so() {
    if !require_etcd("a_node_that_cannot_load_the_sets_version…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up("policy-refused", SetUp::default()).await;
    let original = std::fs::read_to_string(set.nodes[0].dir.join("steering.yaml")).unwrap();
    let v0 = steerdns::config::version_of(&original);
    // ns1 and ns2 serve example.net; ns3 does not have the zone.
    let zone = "$ORIGIN example.net.\n$TTL 3600\n@ IN SOA ns1.example.net. hostmaster.example.net. 1 7200 900 1209600 300\n  IN NS ns1.example.net.\nns1 IN A 192.0.2.53\n";
    for n in &set.nodes[..2] {
        std::fs::write(n.dir.join("zones/example.net.zone"), zone).unwrap();
    }
    for n in &set.nodes[..2] {
        n.wait_for("the new zone loaded", |s| {
            last_reload(s).0 == "applied" && s["config_version"] != "?"
        })
        .await;
    }
    let edited = original.replace(
        "  other.example.com:",
        "  www.example.net:\n    cdns:\n      c: { cname: c.cdn.test. }\n    regions:\n      - match: [\"*\"]\n        weights: { c: 1 }\n  other.example.com:",
    );
    assert_ne!(edited, original);
    let v1 = steerdns::config::version_of(&edited);
    let (code, body) = post_policy(&set.nodes[0], edited, &v0).await;
    assert_eq!(code, 202, "{body}");
    for n in &set.nodes[..2] {
        n.wait_for("v1 in force", |s| s["policy_version"] == v1.as_str())
            .await;
    }
    // ns3 refuses it, says why, and keeps answering from v0.
    let s = set.nodes[2]
        .wait_for("ns3 refuses v1", |s| {
            s["policy"]["refused"]["version"] == v1.as_str()
        })
        .await;
    assert_eq!(s["policy_version"], v0.as_str(), "{s:#}");
    let errors = s["policy"]["refused"]["errors"].to_string();
    assert!(errors.contains("www.example.net"), "{errors}");
    assert_eq!(
        set.nodes[2].metric("steerdns_policy_refused").await,
        Some(1.0)
    );
    answers_until(&set, 2, Instant::now(), "ns3 still answers", |c| {
        c == ["a", "b"]
    })
    .await;
    // Given the zone, ns3 loads the set's version at its next reload.
    std::fs::write(set.nodes[2].dir.join("zones/example.net.zone"), zone).unwrap();
    let s = set.nodes[2]
        .wait_for("ns3 on v1", |s| s["policy_version"] == v1.as_str())
        .await;
    assert!(s["policy"]["refused"].is_null(), "{s:#}");
    assert_eq!(
        set.nodes[2].metric("steerdns_policy_refused").await,
        Some(0.0)
    );
    drop(set.etcd);
}

/// Which of 400 client networks (ECS /24, one resolver) node `addr` answers from the
/// new version (`a2`).
async fn a2_networks(addr: std::net::SocketAddr) -> Vec<usize> {
    use common::*;
    let mut out = Vec::new();
    for net in 0..400usize {
        let client = format!("10.{}.{}.0", net / 200, net % 200);
        let q = query_edns(
            "www.example.com.",
            hickory_proto::rr::RecordType::A,
            Some((client.as_str(), 24)),
        );
        let m = ask_from(addr, resolver(0), Proto::Udp, &q).await;
        if cname_of(&m).starts_with("a2.") {
            out.push(net);
        }
    }
    out
}

/// POST `body` to `node`'s `/v1/policy?{query}` based on `if_match`.
async fn post_staged(node: &Stack, body: String, if_match: &str, query: &str) -> (u16, Value) {
    let resp = node
        .http
        .post(format!("http://{}/v1/policy?{query}", node.api))
        .bearer_auth(TOKEN)
        .header("if-match", format!("\"{if_match}\""))
        .body(body)
        .send()
        .await
        .unwrap();
    let code = resp.status().as_u16();
    let bytes = resp.bytes().await.unwrap();
    (
        code,
        serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_rollout_gives_every_node_the_same_networks_and_halts_when_a_node_refuses() {
    if !require_etcd("a_staged_rollout_gives_every_node_the_same_networks…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "policy-stages",
        SetUp {
            member_roles: true,
            ..SetUp::default()
        },
    )
    .await;
    let original = std::fs::read_to_string(set.nodes[0].dir.join("steering.yaml")).unwrap();
    let v0 = steerdns::config::version_of(&original);
    for n in &set.nodes {
        n.wait_for_path("/v1/policy", "the set's first version", |p| {
            p["history"][0]["version"] == v0.as_str()
        })
        .await;
    }
    // The new version answers `a2` everywhere; the old one `a` or `b`.
    let edited = original
        .replace("a: { cname: a.cdn.test. }", "a: { cname: a2.cdn.test. }")
        .replace("weights: { a: 50, b: 50 }", "weights: { a: 100 }");
    let v1 = steerdns::config::version_of(&edited);
    let (code, body) = post_staged(
        &set.nodes[0],
        edited.clone(),
        &v0,
        "stages=10,100&stage_seconds=4",
    )
    .await;
    assert_eq!(code, 202, "{body}");
    // Each node's instants of the stages, on its own clock (the writer's instant, by
    // each node's estimate of its offset to etcd's clock).
    let mut starts = Vec::new();
    for n in &set.nodes {
        let p = n
            .wait_for_path("/v1/policy", "the rollout loaded", |p| {
                p["rollout"]["loaded"] == true
            })
            .await;
        starts.push(p["rollout"]["start_unix_ms"].as_u64().unwrap());
    }
    let (start, last) = (
        *starts.iter().max().unwrap(),
        *starts.iter().min().unwrap() + 4_000,
    );
    // Polls of the first stage, away from both instants: every node gives the new
    // version to the same 5-15 % of the networks, at every poll.
    let mut seen: Vec<Vec<usize>> = Vec::new();
    while steerdns::clock::now_ms() + 1_000 < last {
        for n in &set.nodes {
            let before = steerdns::clock::now_ms();
            let nets = a2_networks(n.dns).await;
            let after = steerdns::clock::now_ms();
            if before > start + 100 && after + 100 < last {
                seen.push(nets);
            }
        }
    }
    assert!(seen.len() >= 3, "polls of the first stage: {}", seen.len());
    let canary = seen[0].clone();
    assert!(
        (20..=60).contains(&canary.len()),
        "5-15 % of 400 networks: {}",
        canary.len()
    );
    for nets in &seen {
        assert_eq!(*nets, canary, "the same networks on every node and poll");
    }
    eprintln!(
        "staged rollout: {} of 400 networks on the new version in the first stage, {} polls over 3 nodes agreed; the nodes' stage instants {} ms apart",
        canary.len(),
        seen.len(),
        start - starts.iter().min().unwrap()
    );
    for n in &set.nodes {
        let p = n.get("/v1/policy").await;
        assert_eq!(p["rollout"]["version"], v1.as_str(), "{p:#}");
        assert_eq!(p["rollout"]["share_percent"], 10.0, "{p:#}");
    }
    // After the stage: every network on every node; the new version is in force.
    for n in &set.nodes {
        let t = Instant::now();
        loop {
            if a2_networks(n.dns).await.len() == 400 {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(8), "not all on a2");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        n.wait_for_path("/v1/policy", "the rollout done", |p| {
            p["rollout"].is_null() && p["version"] == v1.as_str()
        })
        .await;
    }

    // ns1 and ns2 get a geo database that places clients in Australia (the City test
    // database); ns3 keeps one without it. The next version's `AU` region is a place
    // ns3 cannot place clients in: it refuses the version and halts the rollout by
    // itself; every node goes back to v1.
    let mut before = Vec::new();
    for n in &set.nodes[..2] {
        before.push(n.get("/v1/state").await["config_version"].clone());
        std::fs::copy(
            common::repo("tests/fixtures/geo/GeoIP2-City-Test.mmdb"),
            n.dir.join("geo.mmdb"),
        )
        .unwrap();
    }
    for (n, was) in set.nodes[..2].iter().zip(&before) {
        n.wait_for("the new geo database loaded", |s| {
            s["config_version"] != *was && last_reload(s).0 == "applied"
        })
        .await;
    }
    let only_any = "      - match: [\"*\"]\n        weights: { c: 1 }\n";
    assert!(edited.contains(only_any));
    let next = edited
        .replace("weights: { a: 100 }", "weights: { a: 50, b: 50 }")
        .replace(
            only_any,
            &format!("      - match: [AU]\n        weights: {{ c: 1 }}\n{only_any}"),
        );
    let v2 = steerdns::config::version_of(&next);
    let (code, body) =
        post_staged(&set.nodes[0], next, &v1, "stages=50,100&stage_seconds=60").await;
    assert_eq!(code, 202, "{body}");
    for n in &set.nodes {
        let p = n
            .wait_for_path("/v1/policy", "the rollout halted", |p| {
                p["history"][0]["how"] == "halt" && p["rollout"].is_null()
            })
            .await;
        assert_eq!(p["version"], v1.as_str(), "{p:#}");
        assert_eq!(p["history"][1]["version"], v2.as_str(), "{p:#}");
        assert_eq!(p["history"][0]["node"], "ns3", "{p:#}");
        let why = p["history"][0]["why"].as_str().unwrap_or_default();
        assert!(why.contains("cannot load") && why.contains("`AU`"), "{p:#}");
        let t = Instant::now();
        while a2_networks(n.dns).await.len() != 400 {
            assert!(t.elapsed() < Duration::from_secs(5), "not all back on v1");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(
        set.nodes[2]
            .metric("steerdns_policy_rollout_halts_total")
            .await,
        Some(1.0)
    );
    drop(set.etcd);
}

/// A set of three with the book's roles, every node on the set's first version: the
/// set, the policy file's text and its version.
async fn policy_set(tag: &str) -> (Set, String, String) {
    let set = set_up(
        tag,
        SetUp {
            member_roles: true,
            step_seconds: 1.0,
            ..SetUp::default()
        },
    )
    .await;
    let original = std::fs::read_to_string(set.nodes[0].dir.join("steering.yaml")).unwrap();
    let v0 = steerdns::config::version_of(&original);
    for n in &set.nodes {
        n.wait_for_path("/v1/policy", "the set's first version", |p| {
            p["history"][0]["version"] == v0.as_str()
        })
        .await;
    }
    (set, original, v0)
}

/// Writes `record` as the set's `policy` with ns1's credentials, as a member could.
fn policy_as_ns1(set: &Set, record: Value) {
    let (ok, said) = set.etcd.put_as(
        Some(("ns1", "pw-ns1")),
        &format!("{PREFIX}policy"),
        &record.to_string(),
    );
    assert!(ok, "{said}");
}

/// `original` with `a2` for `a`: a version no node has served, and its version.
fn unserved(original: &str) -> (String, String) {
    let evil = original
        .replace("a: { cname: a.cdn.test. }", "a: { cname: a2.cdn.test. }")
        .replace("weights: { a: 50, b: 50 }", "weights: { a: 100, b: 1 }");
    let vx = steerdns::config::version_of(&evil);
    (evil, vx)
}

/// One entry of a `policy` record's history, as ns1's file would have written it at
/// `at`, activating at `activate` (Unix ms).
fn applied_by_ns1(
    version: &str,
    how: &str,
    based_on: Option<&str>,
    (at, activate): (u64, u64),
) -> Value {
    json!({
        "version": version, "author": "file on ns1", "ticket": null, "node": "ns1",
        "at_unix_ms": at, "activate_at_unix_ms": activate, "how": how, "based_on": based_on,
    })
}

/// A member holding ns1's credentials writes the set's `policy` key by hand (its role
/// may): a record of the version in force whose history says it is the set's first,
/// with a rollout "from" a version of no history. Taken, every node would give that
/// version (the one a rollout keeps) to nine clients in ten with no audit entry anywhere
/// (a set's first version the node serves is no change to audit), and a halt would
/// write it as the set's, in the halter's name. Every node refuses it and keeps
/// answering from the version in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_rollout_from_a_version_of_no_history_is_refused_by_every_node() {
    if !require_etcd("a_forged_rollout_from_a_version_of_no_history_is_refused_by_every_node") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let (set, original, v0) = policy_set("policy-forged").await;
    let (evil, vx) = unserved(&original);
    let now = unix_ms();
    let applied = |version: &str, how: &str, based_on: Option<&str>, activate: u64| {
        applied_by_ns1(version, how, based_on, (now, activate))
    };

    // A rollout "from" a version of no history, on the version in force.
    policy_as_ns1(
        &set,
        json!({
            "version": v0, "yaml": original, "activate_at_unix_ms": now,
            "history": [applied(&v0, "first", None, now)],
            "rollout": {"from": vx, "from_yaml": evil, "plan": {"stages": [10, 100], "stage_seconds": 86400}},
        }),
    );
    // Once a node has read the record (and refused it), it must answer no network from
    // it: the read and the refusal are one step of its view.
    for (i, n) in set.nodes.iter().enumerate() {
        let s = n
            .wait_for("the forged rollout refused", |s| {
                s["cluster"]["last_refused"]
                    .as_str()
                    .is_some_and(|w| w.contains("policy") && w.contains("rollout"))
            })
            .await;
        assert_eq!(s["policy_version"], v0.as_str(), "{s:#}");
        let nets = a2_networks(n.dns).await.len();
        let about = audit_entries(&set, i)
            .iter()
            .filter(|e| e["kind"] == "override_seen" || e["kind"] == "policy")
            .count();
        assert_eq!(
            nets,
            0,
            "ns{} answers {nets} of 400 networks from {vx}, a version of no history ({about} audit entries about it)",
            i + 1
        );
    }
    drop(set.etcd);
}

/// A member holding ns1's credentials writes a version activating a year ahead. Taken,
/// every node would hold it pending for a year (a node started meanwhile serving its
/// own file) and every `If-Match` of the version served would be `412`. Every node
/// refuses it, keeps answering from the version in force, and an apply through the API
/// based on that version goes through everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_activating_far_ahead_is_refused_and_an_apply_still_goes_through() {
    if !require_etcd("a_version_activating_far_ahead_is_refused_and_an_apply_still_goes_through") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let (set, original, v0) = policy_set("policy-ahead").await;
    let (evil, vx) = unserved(&original);
    let now = unix_ms();
    let applied = |version: &str, how: &str, based_on: Option<&str>, activate: u64| {
        applied_by_ns1(version, how, based_on, (now, activate))
    };

    // A version activating a year ahead.
    let year = now + 365 * 86_400_000;
    policy_as_ns1(
        &set,
        json!({
            "version": vx, "yaml": evil, "activate_at_unix_ms": year,
            "history": [applied(&vx, "api", Some(&v0), year), applied(&v0, "first", None, now)],
        }),
    );
    for n in &set.nodes {
        let s = n
            .wait_for("the far activation refused", |s| {
                s["cluster"]["last_refused"].as_str().is_some_and(|w| {
                    w.contains("policy") && w.contains("ahead of this node's clock")
                })
            })
            .await;
        assert!(s["policy"]["pending"].is_null(), "{s:#}");
        assert_eq!(s["policy_version"], v0.as_str(), "{s:#}");
    }

    // The version served is what an apply is based on: it goes through, everywhere.
    // Nodes that find the set's record refused propose the version they serve as its
    // first, and one of them may replace the record between this apply's read and its
    // write: then the apply is 412 naming that same version, and the operator's retry
    // (as the 412 says: read it again) goes through.
    let (mut code, mut body) = post_policy(&set.nodes[1], evil.clone(), &v0).await;
    if code == 412 {
        assert!(
            body["error"].as_str().unwrap_or_default().contains(&*v0),
            "{body}"
        );
        (code, body) = post_policy(&set.nodes[1], evil.clone(), &v0).await;
    }
    assert_eq!(code, 202, "{body}");
    for n in &set.nodes {
        let p = n
            .wait_for_path("/v1/policy", "the applied version", |p| {
                p["version"] == vx.as_str()
            })
            .await;
        assert_eq!(p["history"][0]["node"], "ns2", "{p:#}");
        assert_eq!(p["history"][0]["how"], "api", "{p:#}");
        let t = Instant::now();
        while a2_networks(n.dns).await.is_empty() {
            assert!(t.elapsed() < Duration::from_secs(5), "not on {vx}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    drop(set.etcd);
}

/// A member holding ns2's credentials rewrites one drain straight to etcd 1,500 times,
/// each its own revision. Every change is an override without its writer's entry, but
/// each node appends to its own log at most one `override_seen` per key and wait (the
/// changes counted in it), and at most 60 a minute: otherwise one member's writes,
/// copied into every node's log at about 1 KB each, rotate every node's own history
/// out of its log (`KEEP` files of 16 MiB) within minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_rewriting_a_drain_cannot_flood_every_nodes_audit_log() {
    if !require_etcd("a_member_rewriting_a_drain_cannot_flood_every_nodes_audit_log") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let set = set_up(
        "unaudited-flood",
        SetUp {
            member_roles: true,
            ..SetUp::default()
        },
    )
    .await;
    const CHANGES: usize = 1_500;
    let kvs: Vec<(String, String)> = (0..CHANGES)
        .map(|i| {
            let record = json!({
                "rule": {"id": "hand-1", "name": "www.example.com.", "cdn": "a", "reason": format!("by hand {i}")},
                "node": "ns2", "at_unix_ms": unix_ms(),
            });
            (format!("{PREFIX}drain/hand-1"), record.to_string())
        })
        .collect();
    let t0 = Instant::now();
    set.etcd.put_many_in(Some(("ns2", "pw-ns2")), &kvs, 1).await;
    let writing = t0.elapsed();
    let last = format!("by hand {}", CHANGES - 1);
    let seen = |e: &Value| e["kind"] == "override_seen" && e["key"] == "drain/hand-1";
    for i in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let entries = audit_entries(&set, i);
            if entries
                .iter()
                .any(|e| seen(e) && e["record"]["rule"]["reason"] == last.as_str())
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "ns{}: the last change not audited",
                i + 1
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let entries = audit_entries(&set, i);
        let listed: Vec<&Value> = entries.iter().filter(|e| seen(e)).collect();
        let bound = 2 + writing.as_secs() as usize / 5;
        eprintln!(
            "ns{}: {CHANGES} changes written in {writing:?}: {} override_seen entries",
            i + 1,
            listed.len()
        );
        assert!(
            listed.len() <= bound.min(60),
            "ns{}: {} override_seen entries for one key written {CHANGES} times in {writing:?} (at most {} wanted)",
            i + 1,
            listed.len(),
            bound.min(60)
        );
        let counted: u64 = listed
            .iter()
            .map(|e| e["changes"].as_u64().unwrap_or(1))
            .sum();
        assert!(counted > 1, "ns{}: the changes are not counted", i + 1);
        let log = set.nodes[i].dir.join("state/audit.jsonl");
        steerdns::control::disk::audit::verify(&[log]).unwrap();
    }
}

/// A policy file the set's store cannot take (over 53,248 bytes): the node serves its
/// file and says why, as a refused file (it was logged as "another node's first version
/// was taken", and nothing showed it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_version_too_large_for_the_store_is_shown_as_a_refused_file() {
    if !require_etcd("a_first_version_too_large…") {
        return;
    }
    let _turn = SERIAL.lock().await;
    let etcd = EtcdSet::start("policy-large").await;
    let cdn = MockCdn::start(Mode::Healthy).await;
    let dir = scratch("policy-large-ns1");
    policy(&dir, "[50, 100]", 0.5);
    probe(&dir, "a", &cdn.url("/a"), 1);
    probe(&dir, "b", &cdn.url("/b"), 1);
    let file = dir.join("steering.yaml");
    let mut yaml = std::fs::read_to_string(&file).unwrap();
    for i in 0..1_200 {
        yaml.push_str(&format!(
            "# padding {i:04}: a comment line to make the file large\n"
        ));
    }
    assert!(yaml.len() > 56_000, "{}", yaml.len());
    std::fs::write(&file, &yaml).unwrap();
    let ns1 = Stack::start_node(&dir, "ns1", etcd.node_options("ns1", &["ns1"])).await;
    let s = ns1
        .wait_for("the file refused", |s| {
            s["policy"]["file_error"].is_string()
        })
        .await;
    let why = s["policy"]["file_error"].as_str().unwrap();
    assert!(why.contains("at most 53248"), "{s:#}");
    assert_eq!(
        ns1.metric("steerdns_policy_file_refused_total").await,
        Some(1.0)
    );
    // It serves its file meanwhile.
    let (counts, _) = ns1.answers(20).await;
    assert_eq!(counts.values().sum::<usize>(), 20, "{counts:?}");
    ns1.stop().await;
    drop(etcd);
}
