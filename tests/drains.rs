//! Drains and the admin API over real sockets: every scope, steps and immediate,
//! expiry, refusal of an empty region, authentication, persistence, freeze, explain.

mod common;

use std::path::Path;
use std::time::Duration;

use common::mock_cdn::Mode;
use common::stack::*;
use reqwest::Method;
use serde_json::{json, Value};

/// www.example.com: region `uk` [GB], region `europe` [continent:EU], default; 50/50
/// everywhere. Steps [50, 100], 1 s apart. slow.example.com: 50/50, steps 10 minutes
/// apart (a plateau that holds while it is measured), incident TTL 5.
fn regional_policy(dir: &Path) {
    let text = "hostnames:
  www.example.com:
    ttl: 30
    cdns:
      a: { cname: a.cdn.test. }
      b: { cname: b.cdn.test. }
    regions:
      - name: uk
        match: [GB]
        weights: { a: 50, b: 50 }
      - name: europe
        match: [\"continent:EU\"]
        weights: { a: 50, b: 50 }
      - name: world
        match: [\"*\"]
        weights: { a: 50, b: 50 }
    failover:
      steps: [50, 100]
      step_interval_seconds: 1.0
  other.example.com:
    cdns:
      c: { cname: c.cdn.test. }
    regions:
      - match: [\"*\"]
        weights: { c: 1 }
  slow.example.com:
    ttl: 30
    incident_ttl: 5
    cdns:
      a: { cname: a.cdn.test. }
      b: { cname: b.cdn.test. }
    regions:
      - match: [\"*\"]
        weights: { a: 50, b: 50 }
    failover:
      steps: [50, 100]
      step_interval_seconds: 600
";
    std::fs::write(dir.join("steering.yaml"), text).unwrap();
}

const GB: (&str, u8) = ("2.125.160.216", 29);
const SE: (&str, u8) = ("89.160.20.112", 28);
const US: (&str, u8) = ("216.160.83.56", 29);

async fn regional_stack(tag: &str) -> (Stack, Vec<common::mock_cdn::MockCdn>) {
    let dir = scratch(tag);
    regional_policy(&dir);
    let mut mocks = Vec::new();
    for cdn in ["a", "b", "c"] {
        let m = common::mock_cdn::MockCdn::start(Mode::Healthy).await;
        probe(&dir, cdn, &m.url("/_health/v1.txt"), 1);
        mocks.push(m);
    }
    let stack = Stack::start(&dir).await;
    stack
        .wait_for("probed", |s| ["a", "b"].iter().all(|c| up_verdict(s, c)))
        .await;
    (stack, mocks)
}

/// Whether `client` gets only b (a drained for it), over 40 queries.
async fn only_b(stack: &Stack, client: (&str, u8)) -> bool {
    let counts = stack.answers_from(client.0, client.1, 40).await;
    counts.get("b") == Some(&40)
}

/// Whether `client` still gets both CDNs (40 queries: both appear unless 1e-12 bad luck).
async fn both(stack: &Stack, client: (&str, u8)) -> bool {
    let counts = stack.answers_from(client.0, client.1, 40).await;
    counts.contains_key("a") && counts.contains_key("b")
}

fn drain(scope: &[&str]) -> Value {
    json!({ "name": "www.example.com", "cdn": "a", "where": scope, "reason": "INC-1 test", "immediate": true, "ttl_seconds": 600 })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_apply_to_exactly_their_scope() {
    let (stack, _m) = regional_stack("drain-scopes").await;
    // (scope, clients drained, clients untouched)
    type Clients<'a> = &'a [(&'a str, u8)];
    let cases: [(&[&str], Clients, Clients); 5] = [
        (&[], &[GB, SE, US], &[]),
        (&["uk"], &[GB], &[SE, US]),
        (&["SE"], &[SE], &[GB, US]),
        (&["continent:EU"], &[GB, SE], &[US]),
        (&["89.160.20.0/24"], &[SE], &[GB, US]),
    ];
    for (scope, drained, untouched) in cases {
        let (status, rule) = stack.post("/v1/drains", drain(scope)).await;
        assert_eq!(status, 201, "{rule}");
        assert_eq!(
            stack
                .metric(r#"steerdns_drains_active{cdn="a",name="www.example.com."}"#)
                .await,
            Some(1.0)
        );
        for &c in drained {
            assert!(only_b(&stack, c).await, "{scope:?}: {c:?} must be drained");
        }
        for &c in untouched {
            assert!(
                both(&stack, c).await,
                "{scope:?}: {c:?} must not be drained"
            );
        }
        let id = rule["id"].as_str().unwrap();
        let status = stack.undrain(id).await;
        assert_eq!(status, 200);
        // Undrained in steps: wait until everyone has a back.
        stack
            .wait_for("drain gone", |s| {
                s["drains"].as_array().is_some_and(|d| d.is_empty())
            })
            .await;
        for &c in drained {
            assert!(both(&stack, c).await, "{scope:?}: {c:?} must be back");
        }
    }
    // A CIDR drain narrows the ECS scope: the database network of SE is a /28 (test DB),
    // the drained block a /24 that contains it: the scope stays 28.
    let (_, rule) = stack.post("/v1/drains", drain(&["89.160.20.112/30"])).await;
    let m = common::ask(
        stack.dns,
        common::Proto::Udp,
        &common::query_edns(
            "www.example.com.",
            hickory_proto::rr::RecordType::A,
            Some(SE),
        ),
    )
    .await;
    assert_eq!(
        common::ecs_of(&m).unwrap().scope_prefix(),
        30,
        "a /30 drain inside a /28 geo network"
    );
    let _ = rule;
}

/// The drain of `id` in a state document.
fn drain_entry<'a>(s: &'a Value, id: &str) -> &'a Value {
    s["drains"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["id"] == id))
        .unwrap_or(&Value::Null)
}

/// Nothing here races a step: the plateau is measured on slow.example.com, whose next
/// step is ten minutes away; the steps of www.example.com (1 s apart) are only waited
/// for; expiry is the server's, at the `until` it reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_moves_in_steps_unless_immediate_and_expires_by_itself() {
    let (stack, _m) = regional_stack("drain-steps").await;
    let pct = |s: &Value, id: &str| drain_entry(s, id)["removed_percent"].as_u64();

    // The first step at once: half of a's 50 moved to b, a keeps 25 %, b has 75 %, as
    // the gauges say and the answers show; the incident TTL while it lasts.
    let body = json!({ "name": "slow.example.com", "cdn": "a", "reason": "INC-2 plateau" });
    let (status, rule) = stack.post("/v1/drains", body).await;
    assert_eq!(status, 201, "{rule}");
    let id = rule["id"].as_str().unwrap().to_string();
    let s = stack.state().await;
    assert_eq!(pct(&s, &id), Some(50), "the first step at once: {s:#}");
    let share = |cdn: &'static str| {
        let stack = &stack;
        async move {
            let series = format!(
                r#"steerdns_effective_weight{{cdn="{cdn}",name="slow.example.com.",region="default"}}"#
            );
            stack.metric(&series).await.unwrap()
        }
    };
    assert_eq!((share("a").await, share("b").await), (25.0, 75.0));
    let slow = common::query("slow.example.com.", hickory_proto::rr::RecordType::A);
    let (counts, ttls) = stack.answers_to(slow.clone(), 400).await;
    common::assert_share(
        counts.get("a").copied().unwrap_or(0),
        400,
        0.25,
        "a at 25 %",
    );
    assert_eq!(ttls, [5], "incident TTL during a drain");
    assert_eq!(
        pct(&stack.state().await, &id),
        Some(50),
        "still the plateau"
    );
    let status = stack.undrain(&id).await;
    assert_eq!(status, 200);
    stack
        .wait_for("the drain gone", |s| drain_entry(s, &id).is_null())
        .await;
    let (counts, ttls) = stack.answers_to(slow, 200).await;
    common::assert_share(counts.get("a").copied().unwrap_or(0), 200, 0.5, "a back");
    assert_eq!(ttls, [30], "the normal TTL once no CDN is cut");

    // www.example.com, steps 1 s apart: 50 % at once, 100 % a step later, and back in
    // steps once removed.
    let body = json!({ "name": "www.example.com", "cdn": "a", "reason": "INC-2 steps" });
    let (status, rule) = stack.post("/v1/drains", body).await;
    assert_eq!(status, 201);
    let id = rule["id"].as_str().unwrap().to_string();
    assert_eq!(pct(&stack.state().await, &id), Some(50));
    stack
        .wait_for("second step", |s| pct(s, &id) == Some(100))
        .await;
    assert!(only_b(&stack, US).await);
    let status = stack.undrain(&id).await;
    assert_eq!(status, 200);
    let s = stack.state().await;
    assert_eq!(
        (drain_entry(&s, &id)["status"].as_str(), pct(&s, &id)),
        (Some("ending"), Some(50)),
        "the first step back at once: {s:#}"
    );
    stack
        .wait_for("back to normal", |s| drain_entry(s, &id).is_null())
        .await;
    assert!(both(&stack, US).await);

    // `until`: the drain ends by itself, not before. Immediate: all of a at once.
    let until = steerdns::clock::now() + Duration::from_millis(1500);
    let until_ms = until
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let body = json!({
        "name": "www.example.com", "cdn": "a", "reason": "INC-2 until", "immediate": true,
        "until": humantime::format_rfc3339_millis(until).to_string(),
    });
    let (status, rule) = stack.post("/v1/drains", body).await;
    assert_eq!(status, 201);
    let id = rule["id"].as_str().unwrap().to_string();
    let s = stack.state().await;
    let d = drain_entry(&s, &id);
    assert_eq!(d["until_unix_ms"], until_ms, "{s:#}");
    // Checked, not skipped: a machine too slow to post and read back within 1.5 s
    // fails here rather than passing without looking.
    let left = until.duration_since(steerdns::clock::now());
    assert!(left.is_ok(), "the POST and the read took over 1.5 s");
    assert_eq!(d["status"], "in force", "{s:#}");
    assert_eq!(pct(&s, &id), Some(100), "{s:#}");
    stack
        .wait_for("expired", |s| drain_entry(s, &id)["status"] != "in force")
        .await;
    // From both sides: not before its `until`, and not long after (1 s allows for a
    // loaded machine; a drain that ends only at some later sweep fails).
    let late = steerdns::clock::now().duration_since(until);
    assert!(late.is_ok(), "ended before its `until`");
    let late = late.unwrap();
    assert!(
        late < Duration::from_secs(1),
        "ended {late:?} after its `until`"
    );
    stack
        .wait_for("back to normal", |s| drain_entry(s, &id).is_null())
        .await;
    assert!(both(&stack, US).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_every_cdn_of_a_region_is_refused() {
    let (stack, _m) = regional_stack("drain-empty").await;
    let (status, _) = stack.post("/v1/drains", drain(&["uk"])).await;
    assert_eq!(status, 201);
    let mut b = drain(&["uk"]);
    b["cdn"] = json!("b");
    let (status, body) = stack.post("/v1/drains", b).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("every CDN out of region `uk`"),
        "{body}"
    );
    assert!(only_b(&stack, GB).await, "the first drain still stands");
    // A request naming what the policy does not have is a bad request, not a conflict.
    let mut unknown = drain(&["uk"]);
    unknown["cdn"] = json!("akamai");
    let (status, body) = stack.post("/v1/drains", unknown).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("has no CDN `akamai`"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutations_need_the_token() {
    let (stack, _m) = regional_stack("drain-auth").await;
    let body = drain(&[]);
    let (status, _) = stack
        .call(Method::POST, "/v1/drains", Some(body.clone()), None)
        .await;
    assert_eq!(status, 401);
    let (status, _) = stack
        .call(
            Method::POST,
            "/v1/drains",
            Some(body.clone()),
            Some("wrong-token-0123456789"),
        )
        .await;
    assert_eq!(status, 401);
    let (status, _) = stack
        .call(
            Method::POST,
            "/v1/failover/freeze",
            Some(json!({"reason": "x"})),
            None,
        )
        .await;
    assert_eq!(status, 401);
    assert!(both(&stack, US).await, "nothing changed");
    let (status, _) = stack
        .call(Method::POST, "/v1/drains", Some(body), Some(TOKEN))
        .await;
    assert_eq!(status, 201);
    let (status, _) = stack.call(Method::GET, "/v1/state", None, None).await;
    assert_eq!(status, 200, "reading needs no token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_survive_a_restart() {
    let (stack, _m) = regional_stack("drain-restart").await;
    let (status, rule) = stack.post("/v1/drains", drain(&["continent:EU"])).await;
    assert_eq!(status, 201);
    let dir = stack.dir.clone();
    stack.stop().await;
    let stack = Stack::start(&dir).await;
    assert!(
        only_b(&stack, SE).await,
        "the override is back after the restart"
    );
    assert!(both(&stack, US).await);
    let s = stack.state().await;
    assert_eq!(s["drains"][0]["id"], rule["id"], "{s:#}");
    assert_eq!(s["drains"][0]["reason"], "INC-1 test");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_failover_takes_no_step_until_resumed() {
    let (stack, mocks) = regional_stack("freeze").await;
    let (status, _) = stack
        .post(
            "/v1/failover/freeze",
            json!({"reason": "CDN maintenance window"}),
        )
        .await;
    assert_eq!(status, 200);
    mocks[0].set(Mode::Status(503));
    let s = stack
        .wait_for("a down but frozen", |s| health(s, "a")["state"] == "down")
        .await;
    assert_eq!(removed(&s, "a"), None, "frozen: no step: {s:#}");
    assert!(both(&stack, US).await);
    let (status, _) = stack
        .post("/v1/failover/resume", json!({"reason": "window over"}))
        .await;
    assert_eq!(status, 200);
    stack
        .wait_for("a stepped out", |s| removed(s, "a") == Some(100))
        .await;
    assert!(only_b(&stack, US).await);
}

/// `steerdns explain --json` over the stack's files and saved state must say what
/// `/v1/explain` says (but where the state comes from): one explanation, two doors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_over_the_cli_and_over_http_give_the_same_facts() {
    let (stack, mocks) = regional_stack("explain-both").await;
    stack.post("/v1/drains", drain(&["uk"])).await;
    mocks[1].set(Mode::Status(503));
    stack
        .wait_for("b stepped", |s| removed(s, "b").is_some())
        .await;
    let (status, _) = stack
        .post("/v1/failover/freeze", json!({"reason": "compare"}))
        .await;
    assert_eq!(status, 200);
    for (client, resolver) in [
        ("2.125.160.216", "192.0.2.1"),
        ("216.160.83.56", "192.0.2.2"),
    ] {
        let (status, mut http) = stack
            .call(
                Method::GET,
                &format!("/v1/explain?name=www.example.com&client={client}&resolver={resolver}"),
                None,
                None,
            )
            .await;
        assert_eq!(status, 200, "{http}");
        let dir = &stack.dir;
        let out = common::steerdns(&[
            "explain",
            "www.example.com",
            "--client",
            client,
            "--resolver",
            resolver,
        ])
        .arg("--json")
        .args(stack_inputs(dir))
        .output()
        .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut cli: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(http["state"], "live");
        assert!(
            cli["state"]
                .as_str()
                .unwrap()
                .starts_with("saved by `serve`"),
            "{cli:#}"
        );
        for doc in [&mut http, &mut cli] {
            doc.as_object_mut().unwrap().remove("state");
        }
        assert_eq!(cli, http, "CLI and HTTP differ for {client}");
        assert_eq!(http["failover_frozen"], "compare");
        assert!(http["answer"]["cdn"].is_string(), "{http:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_over_http_says_why() {
    let (stack, mocks) = regional_stack("explain").await;
    let explain = |client: &'static str| {
        let stack = &stack;
        async move {
            stack
                .call(
                    Method::GET,
                    &format!("/v1/explain?name=www.example.com&client={client}"),
                    None,
                    None,
                )
                .await
        }
    };
    let (status, e) = explain("89.160.20.112").await;
    assert_eq!(status, 200);
    assert_eq!(
        (
            e["country"].as_str(),
            e["continent"].as_str(),
            e["network_prefix"].as_u64()
        ),
        (Some("SE"), Some("EU"), Some(28))
    );
    assert_eq!(e["region"]["name"], "europe");
    assert_eq!(e["reason"], "normal");
    assert_eq!(e["ttl"], 30);
    // The answer explain gives for a resolver is the one that resolver gets over DNS.
    let q = common::query_edns(
        "www.example.com.",
        hickory_proto::rr::RecordType::A,
        Some(("89.160.20.112", 30)),
    );
    let mut seen = std::collections::HashSet::new();
    for i in 0..30 {
        let r = common::resolver(i);
        let (_, e) = stack
            .call(
                Method::GET,
                &format!(
                    "/v1/explain?name=www.example.com&client=89.160.20.112&resolver={r}&source=30"
                ),
                None,
                None,
            )
            .await;
        let dns = common::ask_from(stack.dns, r, common::Proto::Udp, &q).await;
        assert_eq!(
            e["answer"]["cname"].as_str(),
            Some(common::cname_of(&dns).as_str()),
            "{e:#}"
        );
        assert_eq!(e["answer"]["selection"], "consistent");
        seen.insert(common::cname_of(&dns));
    }
    assert_eq!(seen.len(), 2, "30 resolvers, both CDNs");

    stack.post("/v1/drains", drain(&["europe"])).await;
    let (_, e) = explain("89.160.20.112").await;
    assert_eq!(e["reason"], "drain", "{e:#}");
    assert_eq!(e["drains"][0]["where"][0], "europe");
    let a = e["cdns"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cdn"] == "a")
        .unwrap();
    assert_eq!(a["share_percent"], 0.0);

    mocks[1].set(Mode::Status(503));
    stack
        .wait_for("b out", |s| removed(s, "b") == Some(100))
        .await;
    let (_, e) = explain("89.160.20.112").await;
    assert_eq!(e["reason"], "fail-open", "drained a and failed b: {e:#}");
    let (_, e) = explain("216.160.83.56").await;
    assert_eq!(e["reason"], "failover", "{e:#}");
    let b = e["cdns"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cdn"] == "b")
        .unwrap();
    assert_eq!(
        (b["health"].as_str(), b["failover_removed_percent"].as_u64()),
        (Some("down"), Some(100))
    );

    let (status, _) = stack
        .call(
            Method::GET,
            "/v1/explain?name=nope.example.com&client=1.2.3.4",
            None,
            None,
        )
        .await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_written_in_the_policy_applies_on_reload() {
    let (stack, _m) = regional_stack("drain-policy").await;
    let path = stack.dir.join("steering.yaml");
    common::edit(
        &path,
        "  other.example.com:",
        "    drain:\n      - cdn: a\n        where: [uk]\n        reason: \"INC-3 fastly LHR 503s\"\n        immediate: true\n  other.example.com:",
    );
    let s = stack
        .wait_for("policy drain", |s| {
            s["drains"].as_array().is_some_and(|d| !d.is_empty())
        })
        .await;
    assert_eq!(s["drains"][0]["id"], "policy", "{s:#}");
    assert_eq!(s["drains"][0]["reason"], "INC-3 fastly LHR 503s");
    assert!(only_b(&stack, GB).await);
    assert!(both(&stack, SE).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seventh_location_scope_is_refused_with_409() {
    // Each distinct location scope doubles the plan's choices, so there are at most six
    // per name; a seventh used to be accepted and silently applied everywhere.
    let (stack, _m) = regional_stack("drain-seventh").await;
    for c in ["FR", "DE", "JP", "CA", "AU", "BR"] {
        let (status, body) = stack.post("/v1/drains", drain(&[c])).await;
        assert_eq!(status, 201, "{c}: {body}");
    }
    let (status, body) = stack.post("/v1/drains", drain(&["SE"])).await;
    assert_eq!(status, 409, "{body}");
    let msg = body["error"].as_str().unwrap();
    assert!(
        msg.contains("7 different location scopes") && msg.contains("at most 6"),
        "{msg}"
    );
    // Not applied anywhere: Sweden and the US still get both CDNs.
    assert!(both(&stack, SE).await && both(&stack, US).await);
    // A region name is not a location scope: still accepted.
    let (status, body) = stack.post("/v1/drains", drain(&["uk"])).await;
    assert_eq!(status, 201, "{body}");
}
