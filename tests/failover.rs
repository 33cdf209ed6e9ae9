//! Health and failover end to end: mock CDNs on loopback, the prober at intervals of
//! tens of milliseconds, and the answers read back by querying the DNS server.
//! `/v1/state` is read to know *when* to look (after one bad round, after the first
//! step, ...); what traffic does is always checked over DNS.

mod common;

use std::path::Path;

use common::assert_share;
use common::mock_cdn::{MockCdn, Mode};
use common::stack::*;
use steerdns::app;

/// Only `a` is probed, so each of its rounds is one verdict (see
/// [`healthy_stack_probing`]); rounds are scripted on the mock, and the step times are
/// the server's own: nothing depends on how fast this test polls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_cdn_leaves_in_steps_and_comes_back_slowly() {
    let (stack, a, _b, _c) =
        healthy_stack_probing("timeline", "[90, 100]", 0.5, INTERVAL, &["a"]).await;
    let (counts, ttls) = stack.answers(200).await;
    assert_share(
        counts.get("a").copied().unwrap_or(0),
        200,
        0.5,
        "normal 50/50",
    );
    assert_eq!(ttls, [30]);

    // One bad round changes nothing.
    let (down, ..) = verdicts(&stack.state().await, "a");
    a.script(&[Mode::Status(503)]);
    let s = stack
        .wait_for("one bad round, then a good one", |s| {
            verdicts(s, "a").0 == down + 1 && health(s, "a")["consecutive_down_rounds"] == 0
        })
        .await;
    assert_eq!(health(&s, "a")["state"], "up");
    assert_eq!(removed(&s, "a"), None, "{s:#}");
    assert_eq!(
        stack
            .metric(r#"steerdns_probe_results_total{cdn="a",result="status",vantage="test"}"#)
            .await,
        Some(1.0)
    );
    assert!(up_verdict(&s, "a"), "{s:#}");

    // down_after (2) bad rounds: the first step, 90 % of a's weight removed at once:
    // the first state that counts the second bad verdict shows it (verdicts and steps
    // reach `/v1/state` together), not one step interval later.
    let (down, ..) = verdicts(&stack.state().await, "a");
    a.set(Mode::Status(503));
    let s = stack
        .wait_for("two bad verdicts", |s| verdicts(s, "a").0 >= down + 2)
        .await;
    assert_eq!(removed(&s, "a"), Some(90), "first step at once: {s:#}");
    assert_eq!(health(&s, "a")["state"], "down");
    assert!(
        health(&s, "a")["last_verdict"]
            .as_str()
            .unwrap()
            .contains("status 503"),
        "{s:#}"
    );
    let first_step = stepped_at(&s, "a");
    let (counts, ttls) = stack.answers(150).await;
    // a keeps 10 % of its 50 %: 5 % of answers, mean 7.5 of 150, sd 2.7; the second
    // step can only lower it (the plateau's exact share: `the_plateau_holds_both_ways`).
    let a_share = counts.get("a").copied().unwrap_or(0);
    assert!(a_share <= 21, "a after the first step: {counts:?}");
    assert_eq!(ttls, [5], "incident TTL while a CDN is off its weight");

    // One step interval later (by the server's clock; its ms rounding aside): all of it.
    let s = stack
        .wait_for("second step", |s| removed(s, "a") == Some(100))
        .await;
    // From both sides: the interval (500 ms), not less, and not a multiple of it
    // (twice the interval allows for a loaded machine's late timer).
    let gap = stepped_at(&s, "a") - first_step;
    assert!(
        (498..1000).contains(&gap),
        "second step {gap} ms after the first, want 500"
    );
    let (counts, _) = stack.answers(100).await;
    assert_eq!(
        counts.get("b"),
        Some(&100),
        "all traffic on the survivor: {counts:?}"
    );
    // The same story in the metrics: demoted by quorum, its share gone.
    assert_eq!(stack.metric(r#"steerdns_cdn_up{cdn="a"}"#).await, Some(0.0));
    assert_eq!(
        stack
            .metric(r#"steerdns_health_transitions_total{cdn="a",to="down"}"#)
            .await,
        Some(1.0)
    );
    assert_eq!(
        stack
            .metric(r#"steerdns_failover_removed_percent{cdn="a",name="www.example.com."}"#)
            .await,
        Some(100.0)
    );
    assert_eq!(
        stack
            .metric(
                r#"steerdns_effective_weight{cdn="b",name="www.example.com.",region="default"}"#
            )
            .await,
        Some(100.0)
    );

    // Recovery: nothing before up_after (3) good rounds. Two good rounds, then a bad
    // one: still down, all of it removed.
    let (_, up, _) = verdicts(&stack.state().await, "a");
    a.script(&[Mode::Healthy, Mode::Healthy]);
    let s = stack
        .wait_for("two good rounds, then a bad one", |s| {
            verdicts(s, "a").1 == up + 2 && health(s, "a")["consecutive_up_rounds"] == 0
        })
        .await;
    assert_eq!(health(&s, "a")["state"], "down", "{s:#}");
    assert_eq!(removed(&s, "a"), Some(100));
    let (counts, _) = stack.answers(50).await;
    assert_eq!(counts.get("b"), Some(&50), "{counts:?}");

    // Three good rounds: the steps in reverse.
    a.set(Mode::Healthy);
    let s = stack
        .wait_for("first step back", |s| health(s, "a")["state"] == "up")
        .await;
    assert_eq!(removed(&s, "a"), Some(90), "{s:#}");
    let s = stack
        .wait_for("normal weights", |s| removed(s, "a").is_none())
        .await;
    assert!(s["failover"].as_array().unwrap().is_empty(), "{s:#}");
    let (counts, ttls) = stack.answers(200).await;
    assert_share(
        counts.get("a").copied().unwrap_or(0),
        200,
        0.5,
        "back to 50/50",
    );
    assert_eq!(ttls, [30]);
}

/// GB: a 90 / b 10, steps [50, 100], 1 s apart.
fn gb_policy(dir: &Path) {
    let text = "hostnames:
  www.example.com:
    ttl: 30
    incident_ttl: 5
    cdns:
      a: { cname: a.cdn.test. }
      b: { cname: b.cdn.test. }
    regions:
      - name: uk
        match: [GB]
        weights: { a: 90, b: 10 }
      - match: [\"*\"]
        weights: { a: 50, b: 50 }
    failover:
      steps: [50, 100]
      step_interval_seconds: 1.0
";
    std::fs::write(dir.join("steering.yaml"), text).unwrap();
}

/// a's share of `n` GB answers (each from another resolver), and the effective weight
/// the metrics give it.
async fn gb_share(stack: &Stack, n: usize) -> (f64, Option<f64>) {
    let counts = stack.answers_from("81.2.69.160", 27, n).await;
    let a = counts.get("a").copied().unwrap_or(0);
    assert_eq!(a + counts.get("b").copied().unwrap_or(0), n, "{counts:?}");
    let metric = stack
        .metric(r#"steerdns_effective_weight{cdn="a",name="www.example.com.",region="uk"}"#)
        .await;
    (a as f64 / n as f64, metric)
}

/// The staged failover stages: GB 90/10 with steps [50, 100] puts a at 45 % (half of
/// its 90 moved to b), then 0 %, and on recovery 45 %, then 90 % again. The plateau is
/// held with a freeze while it is measured, so no timing decides the result. (The old
/// planner left a at 45/55 = 82 %: 5 standard deviations here are 10 points.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plateau_holds_both_ways() {
    const N: usize = 600;
    let dir = scratch("plateau");
    gb_policy(&dir);
    let (a, b) = (
        MockCdn::start(Mode::Healthy).await,
        MockCdn::start(Mode::Healthy).await,
    );
    probe(&dir, "a", &a.url("/_health/v1.txt"), 1);
    probe(&dir, "b", &b.url("/_health/v1.txt"), 1);
    let stack = Stack::start(&dir).await;
    stack
        .wait_for("probed", |s| up_verdict(s, "a") && up_verdict(s, "b"))
        .await;
    let freeze = |on: bool| {
        let stack = &stack;
        async move {
            let path = if on { "freeze" } else { "resume" };
            let body = serde_json::json!({"reason": "measure the plateau"});
            let (status, _) = stack.post(&format!("/v1/failover/{path}"), body).await;
            assert_eq!(status, 200);
        }
    };
    let near = |got: f64, want: f64| (got - want).abs() <= 0.10;

    let (share, metric) = gb_share(&stack, N).await;
    assert!(near(share, 0.90), "normal: {share}");
    assert_eq!(metric, Some(90.0));

    a.set(Mode::Status(503));
    stack
        .wait_for("first step", |s| removed(s, "a") == Some(50))
        .await;
    freeze(true).await;
    assert_eq!(
        removed(&stack.state().await, "a"),
        Some(50),
        "held at the plateau"
    );
    let (share, metric) = gb_share(&stack, N).await;
    assert!(near(share, 0.45), "failing, first step: a at {share}");
    assert_eq!(metric, Some(45.0));
    freeze(false).await;

    stack
        .wait_for("second step", |s| removed(s, "a") == Some(100))
        .await;
    let (share, metric) = gb_share(&stack, 200).await;
    assert_eq!((share, metric), (0.0, Some(0.0)));

    a.set(Mode::Healthy);
    stack
        .wait_for("first step back", |s| {
            health(s, "a")["state"] == "up" && removed(s, "a") == Some(50)
        })
        .await;
    freeze(true).await;
    assert_eq!(
        removed(&stack.state().await, "a"),
        Some(50),
        "held at the plateau"
    );
    let (share, metric) = gb_share(&stack, N).await;
    assert!(
        near(share, 0.45),
        "recovering, first step back: a at {share}"
    );
    assert_eq!(metric, Some(45.0));
    freeze(false).await;

    stack
        .wait_for("normal weights", |s| removed(s, "a").is_none())
        .await;
    let (share, metric) = gb_share(&stack, N).await;
    assert!(near(share, 0.90), "recovered: {share}");
    assert_eq!(metric, Some(90.0));
}

/// Bad and good rounds in turn: four bad rounds, each counted (down_after is 2, so one
/// more in a row would demote a), and never two in a row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flapping_never_moves_traffic() {
    let (stack, a, _b, _c) = healthy_stack_probing("flap", "[100]", 0.2, INTERVAL, &["a"]).await;
    let (down, up, _) = verdicts(&stack.state().await, "a");
    let flap = [Mode::Status(503), Mode::Healthy];
    a.script(&[flap, flap, flap, flap].concat());
    let s = stack
        .wait_for("four bad rounds, each followed by a good one", |s| {
            let (d, u, _) = verdicts(s, "a");
            d == down + 4 && u >= up + 4 && a.scripted() == 0
        })
        .await;
    assert_eq!(health(&s, "a")["state"], "up", "{s:#}");
    assert_eq!(removed(&s, "a"), None, "{s:#}");
    assert_eq!(
        stack
            .metric(r#"steerdns_probe_results_total{cdn="a",result="status",vantage="test"}"#)
            .await,
        Some(4.0)
    );
    // Never demoted, not even for a moment.
    assert_eq!(
        stack
            .metric(r#"steerdns_health_transitions_total{cdn="a",to="down"}"#)
            .await
            .unwrap_or(0.0),
        0.0
    );
    let (counts, _) = stack.answers(200).await;
    assert_share(
        counts.get("a").copied().unwrap_or(0),
        200,
        0.5,
        "a keeps its share",
    );
}

/// Three CDNs, a 60 / b 30 / c 10, steps [50, 100]: a's removed share goes to b and c
/// in proportion (30 / 52.5 / 17.5, then 0 / 75 / 25), held by a freeze while measured;
/// then b fails too and c takes everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_cdns_share_a_failing_ones_traffic_in_proportion() {
    const N: usize = 2_000;
    let dir = scratch("three");
    std::fs::write(
        dir.join("steering.yaml"),
        "hostname: www.example.com
ttl: 30
cdns:
  a: { cname: a.cdn.test. }
  b: { cname: b.cdn.test. }
  c: { cname: c.cdn.test. }
regions:
  - match: [\"*\"]
    weights: { a: 60, b: 30, c: 10 }
failover:
  steps: [50, 100]
  step_interval_seconds: 0.5
",
    )
    .unwrap();
    let mocks = [
        MockCdn::start(Mode::Healthy).await,
        MockCdn::start(Mode::Healthy).await,
        MockCdn::start(Mode::Healthy).await,
    ];
    for (cdn, m) in ["a", "b", "c"].iter().zip(&mocks) {
        probe(&dir, cdn, &m.url("/_health/v1.txt"), 1);
    }
    let stack = Stack::start(&dir).await;
    stack
        .wait_for("probed", |s| {
            ["a", "b", "c"].iter().all(|c| up_verdict(s, c))
        })
        .await;
    let freeze = |on: bool| {
        let stack = &stack;
        async move {
            let path = if on { "freeze" } else { "resume" };
            let body = serde_json::json!({"reason": "measure"});
            assert_eq!(
                stack.post(&format!("/v1/failover/{path}"), body).await.0,
                200
            );
        }
    };
    // Shares over N resolvers and the gauges, against (a, b, c) in percent.
    let check = |want: [f64; 3], what: &'static str| {
        let stack = &stack;
        async move {
            let (counts, _) = stack.answers(N).await;
            for (cdn, p) in ["a", "b", "c"].iter().zip(want) {
                let n = counts.get(*cdn).copied().unwrap_or(0);
                if p == 0.0 {
                    assert_eq!(n, 0, "{what}: {cdn}: {counts:?}");
                } else {
                    assert_share(n, N, p / 100.0, &format!("{what}: {cdn}"));
                }
                let gauge = stack
                    .metric(&format!(
                        r#"steerdns_effective_weight{{cdn="{cdn}",name="www.example.com.",region="default"}}"#
                    ))
                    .await
                    .unwrap_or(0.0);
                assert_eq!(gauge, p, "{what}: the gauge of {cdn}");
            }
        }
    };
    check([60.0, 30.0, 10.0], "normal").await;

    mocks[0].set(Mode::Status(503));
    stack
        .wait_for("a's first step", |s| removed(s, "a") == Some(50))
        .await;
    freeze(true).await;
    assert_eq!(removed(&stack.state().await, "a"), Some(50), "held");
    check([30.0, 52.5, 17.5], "a at its first step").await;
    freeze(false).await;
    stack
        .wait_for("a's second step", |s| removed(s, "a") == Some(100))
        .await;
    check([0.0, 75.0, 25.0], "a out").await;

    // b fails too: c, the last one up, takes it all.
    mocks[1].set(Mode::Status(503));
    stack
        .wait_for("b out", |s| removed(s, "b") == Some(100))
        .await;
    check([0.0, 0.0, 100.0], "a and b out").await;
    assert!(stack.state().await["fail_open"]
        .as_array()
        .unwrap()
        .is_empty());
}

/// b has no probe file: whatever happens to the others, it is never demoted, and
/// takes a's share when a fails (were b demoted too, the region would fail open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cdn_without_a_probe_file_is_never_demoted() {
    let (stack, a, b, _c) =
        healthy_stack_probing("unprobed", "[100]", 0.2, INTERVAL, &["a", "c"]).await;
    // Its mock fails, but nobody asks it.
    b.set(Mode::Status(503));
    // A freeze and a resume re-derive every step from health; a reload starts the
    // prober again.
    for path in ["freeze", "resume"] {
        let body = serde_json::json!({"reason": "test"});
        assert_eq!(
            stack.post(&format!("/v1/failover/{path}"), body).await.0,
            200
        );
    }
    stack.edit("steering.yaml", "ttl: 30", "ttl: 31").await;
    a.set(Mode::Status(503));
    let s = stack
        .wait_for("a out", |s| removed(s, "a") == Some(100))
        .await;
    assert_eq!(removed(&s, "b"), None, "{s:#}");
    assert!(
        s["health"]["b"].is_null(),
        "b has no health to track: {s:#}"
    );
    assert!(s["fail_open"].as_array().unwrap().is_empty(), "{s:#}");
    stack.rounds("a", 3).await;
    let (counts, _) = stack.answers(100).await;
    assert_eq!(counts.get("b"), Some(&100), "{counts:?}");
    assert_eq!(b.hits(), 0, "b was probed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cdn_of_a_region_down_fails_open() {
    let (stack, a, b, _c) = healthy_stack("failopen", "[100]", 0.2).await;
    a.set(Mode::Status(503));
    b.set(Mode::ErrorPage);
    // c stays healthy, so this vantage point is happy and its verdicts count.
    let s = stack
        .wait_for("both down", |s| {
            health(s, "a")["state"] == "down" && health(s, "b")["state"] == "down"
        })
        .await;
    let s = if s["fail_open"].as_array().unwrap().is_empty() {
        stack
            .wait_for("fail-open", |s| {
                !s["fail_open"].as_array().unwrap().is_empty()
            })
            .await
    } else {
        s
    };
    assert_eq!(s["fail_open"][0]["name"], "www.example.com.", "{s:#}");
    assert_eq!(
        stack
            .metric(r#"steerdns_fail_open{name="www.example.com.",region="default"}"#)
            .await,
        Some(1.0)
    );
    let (counts, _) = stack.answers(100).await;
    assert!(
        counts["a"] > 20 && counts["b"] > 20,
        "fail-open answers with the configured weights: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vantage_point_that_sees_everything_fail_demotes_nothing() {
    let (stack, a, b, c) = healthy_stack("unhappy", "[100]", 0.2).await;
    for cdn in [&a, &b, &c] {
        cdn.set(Mode::Refused);
    }
    stack
        .wait_for("unhappy", |s| {
            s["vantage_unhappy"] == "sees every CDN fail at once"
        })
        .await;
    assert_eq!(
        stack
            .metric(r#"steerdns_vantage_unhappy{vantage="test"}"#)
            .await,
        Some(1.0)
    );
    stack.rounds("a", 4).await;
    let s = stack.state().await;
    for cdn in ["a", "b", "c"] {
        assert_eq!(health(&s, cdn)["state"], "up", "{s:#}");
    }
    assert!(s["failover"].as_array().unwrap().is_empty(), "{s:#}");
    let (counts, _) = stack.answers(100).await;
    assert!(counts["a"] > 20 && counts["b"] > 20, "{counts:?}");
}

/// Starts a probe-only agent whose `a` is `a_url` and `b`/`c` the given mocks.
async fn agent(name: &str, a_url: &str, b: &MockCdn, c: &MockCdn, dir: &Path) -> app::Agent {
    let d = dir.join(name);
    std::fs::create_dir_all(d.join("probes")).unwrap();
    probe(&d, "a", a_url, 1);
    probe(&d, "b", &b.url("/_health/v1.txt"), 1);
    probe(&d, "c", &c.url("/_health/v1.txt"), 1);
    let (probes, _) = steerdns::config::probes::load_dir(&d.join("probes"), None).unwrap();
    app::agent(probes, "127.0.0.1:0".parse().unwrap(), name.into())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_of_five_agents() {
    let dir = scratch("quorum");
    let (own_a, b, c) = (
        MockCdn::start(Mode::Healthy).await,
        MockCdn::start(Mode::Healthy).await,
        MockCdn::start(Mode::Healthy).await,
    );
    // Each agent reaches `a` through its own path (its own mock), so each can fail alone.
    let mut paths = Vec::new();
    let mut agents = Vec::new();
    for i in 0..5 {
        let m = MockCdn::start(Mode::Healthy).await;
        agents.push(
            agent(
                &format!("agent{i}"),
                &m.url("/_health/v1.txt"),
                &b,
                &c,
                &dir,
            )
            .await,
        );
        paths.push(m);
    }
    policy(&dir, "[100]", 0.2);
    probe(&dir, "a", &own_a.url("/_health/v1.txt"), 3);
    // Recover slowly: on a loaded machine a peer may go stale for a moment, and its
    // failure then stops counting; the demotion must not undo itself mid-assertion.
    let a_file = dir.join("probes/a.yaml");
    let text = std::fs::read_to_string(&a_file)
        .unwrap()
        .replace("up_after: 3", "up_after: 50");
    std::fs::write(&a_file, text).unwrap();
    probe(&dir, "b", &b.url("/_health/v1.txt"), 3);
    probe(&dir, "c", &c.url("/_health/v1.txt"), 3);
    vantages(
        &dir,
        &agents
            .iter()
            .map(|a| format!("http://{}", a.api))
            .collect::<Vec<_>>(),
    );
    let stack = Stack::start(&dir).await;
    stack
        .wait_for("all six vantage points see a up", |s| {
            health(s, "a")["last_verdict"]
                .as_str()
                .is_some_and(|v| v.starts_with("Up") && v.matches(": ok").count() == 6)
        })
        .await;

    // Two of five agents see a fail: below the quorum of three.
    paths[0].set(Mode::Status(503));
    paths[1].set(Mode::Status(503));
    stack
        .wait_for("two failures in the evidence", |s| {
            health(s, "a")["last_verdict"]
                .as_str()
                .is_some_and(|v| v.matches("failed").count() == 2)
        })
        .await;
    stack.rounds("a", 4).await;
    let s = stack.state().await;
    assert_eq!(health(&s, "a")["state"], "up", "{s:#}");
    assert_eq!(removed(&s, "a"), None);

    // A third: quorum reached, a is demoted.
    paths[2].set(Mode::Status(503));
    let s = stack
        .wait_for("a down by quorum", |s| removed(s, "a") == Some(100))
        .await;
    assert_eq!(health(&s, "a")["state"], "down");
    let (counts, _) = stack.answers(50).await;
    assert_eq!(counts.get("b"), Some(&50), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhappy_and_silent_peers_demote_nothing() {
    let dir = scratch("peers");
    let (a, b, c) = (
        MockCdn::start(Mode::Healthy).await,
        MockCdn::start(Mode::Healthy).await,
        MockCdn::start(Mode::Healthy).await,
    );
    // The peer's network is broken: it sees every CDN fail.
    let dead = MockCdn::start(Mode::Refused).await;
    let broken = {
        let d = dir.join("broken");
        std::fs::create_dir_all(d.join("probes")).unwrap();
        for cdn in ["a", "b", "c"] {
            probe(&d, cdn, &dead.url("/_health/v1.txt"), 1);
        }
        let (probes, _) = steerdns::config::probes::load_dir(&d.join("probes"), None).unwrap();
        app::agent(probes, "127.0.0.1:0".parse().unwrap(), "broken".into())
            .await
            .unwrap()
    };
    // And another peer does not answer at all.
    let silent = MockCdn::start(Mode::Refused).await;
    policy(&dir, "[100]", 0.2);
    for (cdn, m) in [("a", &a), ("b", &b), ("c", &c)] {
        probe(&dir, cdn, &m.url("/_health/v1.txt"), 1);
    }
    vantages(
        &dir,
        &[
            format!("http://{}", broken.api),
            format!("http://{}", silent.addr()),
        ],
    );
    let stack = Stack::start(&dir).await;
    let s = stack
        .wait_for("both peers unhappy", |s| {
            let peers = s["peers"].as_array().unwrap();
            peers.len() == 2 && peers.iter().all(|p| !p["unhappy"].is_null())
        })
        .await;
    assert!(
        s.to_string().contains("sees every CDN fail at once"),
        "{s:#}"
    );
    stack.rounds("a", 4).await;
    let s = stack.state().await;
    for cdn in ["a", "b", "c"] {
        assert_eq!(health(&s, cdn)["state"], "up", "{s:#}");
    }
    assert!(
        health(&s, "a")["last_verdict"]
            .as_str()
            .unwrap()
            .starts_with("Up"),
        "{s:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_failover_resumes_the_timeline() {
    let (stack, a, _b, _c) = healthy_stack("restart", "[90, 100]", 1.5).await;
    a.set(Mode::Status(503));
    stack
        .wait_for("first step", |s| removed(s, "a") == Some(90))
        .await;
    let dir = stack.dir.clone();
    // Stopped, and its saver done: nothing of the old service writes behind the new one.
    stack.stop().await;

    let stack = Stack::start(&dir).await;
    // Before any round of the new process: still failed over, not snapped back.
    let s = stack.state().await;
    assert_eq!(health(&s, "a")["state"], "down", "{s:#}");
    assert!(removed(&s, "a").is_some_and(|r| r >= 90), "{s:#}");
    let (counts, _) = stack.answers(100).await;
    assert!(counts.get("a").copied().unwrap_or(0) <= 25, "{counts:?}");
    // And the timeline goes on to the second step.
    stack
        .wait_for("second step after the restart", |s| {
            removed(s, "a") == Some(100)
        })
        .await;
}
