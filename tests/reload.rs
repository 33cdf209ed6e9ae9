//! Hot reload: edits apply within a second as one swap while queries keep flowing,
//! broken edits change nothing and say why, and health and failover carry over.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::mock_cdn::Mode;
use common::stack::*;
use common::*;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use tokio::time::Instant;

/// Queries www.example.com in a loop until stopped; counts answers and failures
/// (anything but one CNAME to a known target).
fn query_loop(stack: &Stack, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<(usize, usize)> {
    let dns = stack.dns;
    tokio::spawn(async move {
        let (mut ok, mut bad) = (0, 0);
        let q = query("www.example.com.", RecordType::A);
        while !stop.load(Ordering::Relaxed) {
            let bytes = q.to_vec().unwrap();
            let good = match raw(dns, Proto::Udp, &bytes)
                .await
                .map(|b| hickory_proto::op::Message::from_vec(&b))
            {
                Some(Ok(m)) => {
                    m.metadata.response_code == ResponseCode::NoError
                        && m.answers.len() == 1
                        && matches!(&m.answers[0].data, hickory_proto::rr::RData::CNAME(c) if c.0.to_string().ends_with(".cdn.test."))
                }
                _ => false,
            };
            if good {
                ok += 1
            } else {
                bad += 1
            }
        }
        (ok, bad)
    })
}

/// At the default `--reload-poll-ms` (the other tests poll every 50 ms): three edits in
/// a row, each made as soon as the last is served, each served within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_applies_within_a_second_while_queries_keep_flowing() {
    let dir = scratch("reload-edit");
    policy(&dir, "[100]", 0.2);
    let poll = Duration::from_millis(steerdns::app::DEFAULT_RELOAD_POLL_MS);
    let stack = Stack::start_polling(&dir, poll).await;
    let version = stack.state().await["config_version"].clone();
    let stop = Arc::new(AtomicBool::new(false));
    let flowing = query_loop(&stack, stop.clone());

    for (from, to) in [("a", "a2"), ("a2", "a33"), ("a33", "a444")] {
        edit(
            &stack.dir.join("steering.yaml"),
            &format!("a: {{ cname: {from}.cdn.test. }}"),
            &format!("a: {{ cname: {to}.cdn.test. }}"),
        );
        let edited = Instant::now();
        loop {
            let (counts, _) = stack.answers(20).await;
            if counts.contains_key(to) {
                break;
            }
            assert!(
                edited.elapsed() < Duration::from_secs(1),
                "the edit to {to} did not apply within a second (poll {poll:?})"
            );
        }
        // One swap: never an answer from the old a once the new one is seen.
        let (counts, _) = stack.answers(100).await;
        assert!(!counts.contains_key(from), "{counts:?}");
    }
    stop.store(true, Ordering::Relaxed);
    let (ok, bad) = flowing.await.unwrap();
    assert!(ok > 50, "only {ok} answers");
    assert_eq!(bad, 0, "{bad} failed answers during the reloads");
    // `/v1/state` follows once the state is saved, a moment after the swap.
    let s = stack
        .wait_for("the reload in /v1/state", |s| last_reload(s).0 == "applied")
        .await;
    assert_ne!(s["config_version"], version);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_edits_change_nothing_and_say_why() {
    let (stack, _a, _b, _c) = healthy_stack("reload-broken", "[100]", 0.2).await;
    let dir = stack.dir.clone();
    let policy = dir.join("steering.yaml");
    let zone = dir.join("zones/example.com.zone");
    // First an edit that applies (a's CNAME, mail's address): the last good
    // configuration is this one, not the one the server started with.
    edit(
        &policy,
        "a: { cname: a.cdn.test. }",
        "a: { cname: a2.cdn.test. }",
    );
    edit(
        &zone,
        "mail    IN A    192.0.2.25",
        "mail    IN A    192.0.2.26",
    );
    stack
        .wait_for("the edit applied", |s| last_reload(s).0 == "applied")
        .await;
    let good_policy = std::fs::read_to_string(&policy).unwrap();
    let good_zone = std::fs::read_to_string(&zone).unwrap();
    let good_geo = std::fs::read(dir.join("geo.mmdb")).unwrap();

    type Break = Box<dyn Fn()>;
    let cases: Vec<(&str, Break, &str)> = vec![
        (
            "YAML error",
            Box::new({
                let p = policy.clone();
                move || edit(&p, "weights: { a: 50, b: 50 }", "weights: { a: 50, b: 50")
            }),
            "steering.yaml:",
        ),
        (
            "unknown CDN",
            Box::new({
                let p = policy.clone();
                move || {
                    edit(
                        &p,
                        "weights: { a: 50, b: 50 }",
                        "weights: { a: 50, akamai: 50 }",
                    )
                }
            }),
            "steering.yaml:10: hostnames.www.example.com.regions[0].weights.akamai: unknown CDN",
        ),
        (
            "weights summing to zero",
            Box::new({
                let p = policy.clone();
                move || edit(&p, "weights: { a: 50, b: 50 }", "weights: { a: 0, b: 0 }")
            }),
            "all weights are zero",
        ),
        (
            "bad zone",
            Box::new({
                let z = zone.clone();
                move || {
                    edit(
                        &z,
                        "mail    IN A    192.0.2.26",
                        "mail    IN A    192.0.2.256",
                    )
                }
            }),
            "example.com.zone:20: zone file syntax",
        ),
        (
            "corrupt geo database",
            Box::new({
                let d = dir.clone();
                move || {
                    std::fs::copy(
                        repo("tests/fixtures/geo/MaxMind-DB-test-broken-search-tree-24.mmdb"),
                        d.join("geo.mmdb"),
                    )
                    .unwrap();
                }
            }),
            "corrupt search tree",
        ),
    ];
    let refused = || async {
        stack
            .metric(r#"steerdns_config_reloads_total{result="refused"}"#)
            .await
            .unwrap_or(0.0)
    };
    for (what, break_it, expected) in cases {
        let refused_before = refused().await;
        break_it();
        let s = stack
            .wait_for(what, |s| {
                last_reload(s).0 == "refused" && last_reload(s).1.contains(expected)
            })
            .await;
        assert!(last_reload(&s).1.contains(expected), "{what}: {s:#}");
        assert_eq!(
            refused().await,
            refused_before + 1.0,
            "{what}: counted once"
        );
        // Still serving the last good configuration: the edited one.
        let (counts, _) = stack.answers(50).await;
        assert!(
            counts.keys().all(|k| k == "a2" || k == "b") && counts.len() == 2,
            "{what}: {counts:?}"
        );
        let m = ask(
            stack.dns,
            Proto::Udp,
            &query("mail.example.com.", RecordType::A),
        )
        .await;
        assert_eq!(m.answers.len(), 1, "{what}: the zone still serves");
        assert_eq!(
            m.answers[0].data.to_string(),
            "192.0.2.26",
            "{what}: the edited zone still serves"
        );

        std::fs::write(&policy, &good_policy).unwrap();
        std::fs::write(&zone, &good_zone).unwrap();
        std::fs::write(dir.join("geo.mmdb"), &good_geo).unwrap();
        stack
            .wait_for("the fix applied", |s| last_reload(s).0 == "applied")
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_failover_survive_a_reload() {
    let (stack, a, _b, _c) = healthy_stack("reload-health", "[100]", 0.2).await;
    a.set(Mode::Status(503));
    stack
        .wait_for("a out", |s| removed(s, "a") == Some(100))
        .await;
    let s = stack
        .edit(
            "steering.yaml",
            "b: { cname: b.cdn.test. }",
            "b: { cname: b2.cdn.test. }",
        )
        .await;
    assert_eq!(health(&s, "a")["state"], "down", "{s:#}");
    assert_eq!(removed(&s, "a"), Some(100));
    let (counts, _) = stack.answers(50).await;
    assert_eq!(counts.get("b2"), Some(&50), "{counts:?}");
}

/// A probe file edited while serving applies at the next poll: the prober starts over
/// with the new definition (here an `expect_body` the mock does not serve, which fails
/// a), and the edit back brings a back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_file_edit_applies_live() {
    let (stack, _a, _b, _c) = healthy_stack("reload-probe", "[100]", 0.2).await;
    let file = stack.dir.join("probes/a.yaml");
    edit(&file, "expect_body: healthy-v1", "expect_body: healthy-v2");
    let s = stack
        .wait_for("a failed by the new probe", |s| {
            removed(s, "a") == Some(100)
        })
        .await;
    assert!(
        health(&s, "a")["last_verdict"]
            .as_str()
            .is_some_and(|v| v.contains("body mismatch")),
        "{s:#}"
    );
    let (counts, _) = stack.answers(50).await;
    assert_eq!(counts.get("b"), Some(&50), "{counts:?}");
    edit(&file, "expect_body: healthy-v2", "expect_body: healthy-v1");
    stack
        .wait_for("a back", |s| removed(s, "a").is_none())
        .await;
    let (counts, _) = stack.answers(100).await;
    assert!(counts.contains_key("a"), "{counts:?}");
}

/// Valid edits of a zone file and of the geo database apply while serving, as a
/// policy edit does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zone_and_geo_database_edits_apply_live() {
    let (stack, _a, _b, _c) = healthy_stack("reload-data", "[100]", 0.2).await;
    let mail = || async {
        let m = ask(
            stack.dns,
            Proto::Udp,
            &query("mail.example.com.", RecordType::A),
        )
        .await;
        m.answers[0].data.to_string()
    };
    assert_eq!(mail().await, "192.0.2.25");
    edit(
        &stack.dir.join("zones/example.com.zone"),
        "mail    IN A    192.0.2.25",
        "mail    IN A    192.0.2.26",
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while mail().await != "192.0.2.26" {
        assert!(Instant::now() < deadline, "the zone edit never served");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // US clients to a, everyone else to b. 8.8.8.8 is not in the test database (so: b);
    // the shipped database places it in the US (so: a).
    edit(
        &stack.dir.join("steering.yaml"),
        "      - match: [\"*\"]\n        weights: { a: 50, b: 50 }",
        "      - match: [US]\n        weights: { a: 1 }\n      - match: [\"*\"]\n        weights: { b: 1 }",
    );
    let google = || stack.answers_from("8.8.8.0", 24, 5);
    let deadline = Instant::now() + Duration::from_secs(10);
    while google().await.get("b") != Some(&5) {
        assert!(Instant::now() < deadline, "the policy edit never served");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let version = stack.state().await["config_version"].clone();
    // Written to a temporary file and renamed, as an operator (or geoipupdate) does.
    let tmp = stack.dir.join("geo.mmdb.tmp");
    std::fs::copy(repo("geo/country.mmdb"), &tmp).unwrap();
    std::fs::rename(&tmp, stack.dir.join("geo.mmdb")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while google().await.get("a") != Some(&5) {
        assert!(
            Instant::now() < deadline,
            "the new geo database never served"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let s = stack
        .wait_for("the reload in /v1/state", |s| {
            s["config_version"] != version
        })
        .await;
    assert_eq!(last_reload(&s).0, "applied", "{s:#}");
}
