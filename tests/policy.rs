//! The policy as a version (a single node, a set of one): `POST /v1/policy` with
//! `If-Match`, refused when stale or broken, rolled back; an edit of the file proposed
//! as a version; an edit made while the node was down taken at start. The set's side
//! (three nodes on etcd) is in `tests/cluster.rs`.

mod common;

use std::time::Duration;

use common::stack::*;
use common::*;
use serde_json::Value;
use tokio::time::Instant;

/// POST `body` (YAML) to `/v1/policy` with `If-Match: "<if_match>"` (none: no header).
async fn post_policy(stack: &Stack, body: &str, if_match: Option<&str>) -> (u16, Value) {
    post_to(stack, "", body, if_match).await
}

/// POST `body` to `/v1/policy?{query}`, based on `if_match`.
async fn post_staged(stack: &Stack, body: &str, if_match: &str, query: &str) -> (u16, Value) {
    post_to(stack, query, body, Some(if_match)).await
}

/// POST `body` (YAML) to `/v1/policy?{query}`, with `If-Match` when given.
async fn post_to(stack: &Stack, query: &str, body: &str, if_match: Option<&str>) -> (u16, Value) {
    let mut req = stack
        .http
        .post(format!("http://{}/v1/policy?{query}", stack.api))
        .bearer_auth(TOKEN)
        .header("content-type", "application/yaml")
        .body(body.to_string());
    if let Some(v) = if_match {
        req = req.header("if-match", format!("\"{v}\""));
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// The CDNs (first label of the CNAME) answering www.example.com over 40 resolvers.
async fn cdns(stack: &Stack) -> Vec<String> {
    let (counts, _) = stack.answers(40).await;
    let mut cdns: Vec<String> = counts.into_keys().collect();
    cdns.sort();
    cdns
}

/// Waits (5 s at most) until www.example.com is answered by exactly `want`.
async fn wait_cdns(stack: &Stack, want: &[&str]) {
    let start = Instant::now();
    loop {
        let seen = cdns(stack).await;
        if seen == want {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "answers {seen:?}, wanted {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn version_of(text: &str) -> String {
    steerdns::config::version_of(text)
}

/// The set's history as `(version, how)`, newest first.
fn history(p: &Value) -> Vec<(String, String)> {
    p["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["version"].as_str().unwrap().to_string(),
                a["how"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_needs_the_version_in_force_loads_or_is_refused_and_rolls_back() {
    let dir = scratch("policy-api");
    policy(&dir, "[100]", 1.0);
    let original = std::fs::read_to_string(dir.join("steering.yaml")).unwrap();
    let v0 = version_of(&original);
    let stack = Stack::start_polling(&dir, Duration::from_millis(50)).await;
    // The set of one takes its file's version as its first.
    let p = stack
        .wait_for_path("/v1/policy", "the first version", |p| {
            !p["history"].as_array().unwrap().is_empty()
        })
        .await;
    assert_eq!(p["version"], v0.as_str(), "{p:#}");
    assert_eq!(history(&p), [(v0.clone(), "first".into())]);
    assert_eq!(p["rollout"], Value::Null);
    wait_cdns(&stack, &["a", "b"]).await;

    let edited = original.replace("weights: { a: 50, b: 50 }", "weights: { a: 100 }");
    assert_ne!(edited, original);
    let v1 = version_of(&edited);

    // Without If-Match, or with a version not in force: 412, nothing changes.
    let (code, body) = post_policy(&stack, &edited, None).await;
    assert_eq!(code, 412, "{body}");
    let (code, body) = post_policy(&stack, &edited, Some("0123456789ab")).await;
    assert_eq!(code, 412, "{body}");
    assert!(body["error"].as_str().unwrap().contains(&v0), "{body}");
    // A policy that does not load: 400 with its line and field, nothing changes.
    let broken = edited.replace("weights: { a: 100 }", "weights: { a: 100, zz: 5 }");
    let (code, body) = post_policy(&stack, &broken, Some(&v0)).await;
    assert_eq!(code, 400, "{body}");
    let errors = body["errors"].to_string();
    let line = broken
        .lines()
        .position(|l| l.contains("zz: 5"))
        .map(|i| i + 1)
        .unwrap();
    assert!(
        errors.contains(&format!(":{line}:")) && errors.contains("weights"),
        "line {line} and the field: {body}"
    );
    assert_eq!(cdns(&stack).await, ["a", "b"]);
    assert_eq!(stack.get("/v1/policy").await["version"], v0.as_str());

    // With the version in force: 202, the answers change once it is answered.
    let (code, body) = post_policy(&stack, &edited, Some(&v0)).await;
    assert_eq!(code, 202, "{body}");
    assert_eq!(body["version"], v1.as_str());
    assert!(body["activate_at_unix_ms"].as_u64().unwrap() > 0);
    wait_cdns(&stack, &["a"]).await;
    let p = stack.get("/v1/policy").await;
    assert_eq!(p["version"], v1.as_str());
    assert_eq!(
        history(&p),
        [(v1.clone(), "api".into()), (v0.clone(), "first".into())]
    );
    assert_eq!(p["history"][0]["based_on"], v0.as_str());
    assert_eq!(p["history"][0]["author"], "api-token-file");
    // 202 says it is accepted: `/v1/state` shows it once applied and saved.
    let st = stack
        .wait_for("the version in /v1/state", |s| {
            s["policy_version"] == v1.as_str()
        })
        .await;
    // The file was not edited: it differs from the version in force.
    assert_eq!(st["policy"]["file_version"], v0.as_str(), "{st:#}");
    assert_eq!(st["policy"]["file_differs"], true);
    let info = format!("steerdns_policy_info{{version=\"{v1}\"}}");
    assert_eq!(stack.metric(&info).await, Some(1.0));
    let explained = stack
        .get("/v1/explain?name=www.example.com&client=81.2.69.142")
        .await;
    assert_eq!(explained["policy_version"], v1.as_str(), "{explained:#}");

    // The same version again: nothing new.
    let (code, body) = post_policy(&stack, &edited, Some(&v1)).await;
    assert_eq!(code, 202, "{body}");
    assert_eq!(body["unchanged"], true);

    // Rolled back (to the one before, by default): the old answers.
    let (code, body) = stack
        .post("/v1/policy/rollback", serde_json::json!({}))
        .await;
    assert_eq!(code, 202, "{body}");
    assert_eq!(body["version"], v0.as_str());
    wait_cdns(&stack, &["a", "b"]).await;
    let p = stack.get("/v1/policy").await;
    assert_eq!(history(&p)[0], (v0.clone(), "rollback".into()));
    assert_eq!(history(&p).len(), 3);
    // No staged rollout runs: a halt has nothing to halt.
    let (code, _) = stack.post("/v1/policy/halt", serde_json::json!({})).await;
    assert_eq!(code, 409);

    // Every application is in the audit log.
    let log = std::fs::read_to_string(dir.join("state/audit.jsonl")).unwrap();
    let applied: Vec<String> = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["kind"] == "policy")
        .map(|e| e["how"].as_str().unwrap().to_string())
        .collect();
    // The first version is no change: the history has it, the log the changes.
    assert_eq!(applied, ["api", "rollback"], "{log}");
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_of_the_file_is_a_version_and_one_made_while_down_is_taken_at_start() {
    let dir = scratch("policy-file");
    policy(&dir, "[100]", 1.0);
    let file = dir.join("steering.yaml");
    let original = std::fs::read_to_string(&file).unwrap();
    let stack = Stack::start_polling(&dir, Duration::from_millis(50)).await;
    wait_cdns(&stack, &["a", "b"]).await;

    edit(&file, "weights: { a: 50, b: 50 }", "weights: { a: 100 }");
    let v1 = version_of(&std::fs::read_to_string(&file).unwrap());
    wait_cdns(&stack, &["a"]).await;
    let p = stack.get("/v1/policy").await;
    assert_eq!(p["version"], v1.as_str());
    assert_eq!(history(&p)[0], (v1.clone(), "file".into()), "{p:#}");
    assert_eq!(p["history"][0]["author"], "file on test");
    assert_eq!(p["node"]["file_differs"], false);
    stack.stop().await;

    // Edited while the node was down: proposed at start, based on the version it
    // served then.
    std::fs::write(
        &file,
        original.replace("weights: { a: 50, b: 50 }", "weights: { b: 100 }"),
    )
    .unwrap();
    let v2 = version_of(&std::fs::read_to_string(&file).unwrap());
    let stack = Stack::start_polling(&dir, Duration::from_millis(50)).await;
    wait_cdns(&stack, &["b"]).await;
    let p = stack.get("/v1/policy").await;
    assert_eq!(
        history(&p)[..2],
        [(v2.clone(), "file".into()), (v1.clone(), "file".into())],
        "{p:#}"
    );
    stack.stop().await;

    // Restarted with the same file: the same version, no new entry.
    let stack = Stack::start_polling(&dir, Duration::from_millis(50)).await;
    wait_cdns(&stack, &["b"]).await;
    let p = stack.get("/v1/policy").await;
    assert_eq!(history(&p).len(), 3, "{p:#}");
    stack.stop().await;
}

/// The client network `i` of 400 (an ECS /24).
fn network(i: usize) -> String {
    format!("10.{}.{}.0", i / 200, i % 200)
}

/// What each of 400 client networks (ECS /24, one resolver) gets for www.example.com:
/// the CDN (the CNAME's first label) or the RCODE; and the ECS scopes echoed.
async fn by_network(stack: &Stack) -> (Vec<String>, Vec<u8>) {
    let mut got = Vec::new();
    let mut scopes = Vec::new();
    for i in 0..400 {
        let q = query_edns(
            "www.example.com.",
            hickory_proto::rr::RecordType::A,
            Some((&network(i), 24)),
        );
        let m = ask_from(stack.dns, resolver(0), Proto::Udp, &q).await;
        got.push(match m.answers.first().map(|r| &r.data) {
            Some(hickory_proto::rr::RData::CNAME(c)) => {
                c.0.to_string().split('.').next().unwrap().to_string()
            }
            _ => format!("{:?}", m.metadata.response_code),
        });
        let scope = m.edns.as_ref().and_then(|e| {
            e.options().as_ref().iter().find_map(|(_, o)| match o {
                hickory_proto::rr::rdata::opt::EdnsOption::Subnet(s) => Some(s.scope_prefix()),
                _ => None,
            })
        });
        if let Some(s) = scope {
            if !scopes.contains(&s) {
                scopes.push(s);
            }
        }
    }
    (got, scopes)
}

/// The networks (indices) answered `cdn`.
fn answered(got: &[String], cdn: &str) -> Vec<usize> {
    (0..got.len()).filter(|&i| got[i] == cdn).collect()
}

/// Polls the 400 networks (10 s at most) until `done` holds of what they get.
async fn wait_networks(stack: &Stack, what: &str, done: impl Fn(&[String]) -> bool) -> Vec<String> {
    let start = Instant::now();
    loop {
        let (got, _) = by_network(stack).await;
        if done(&got) {
            return got;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what}: {:?}",
            got.iter()
                .fold(std::collections::BTreeMap::new(), |mut m, g| {
                    *m.entry(g.clone()).or_insert(0) += 1;
                    m
                })
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_rollout_answers_its_share_of_networks_then_all_and_halts() {
    let dir = scratch("policy-stages");
    policy(&dir, "[100]", 1.0);
    let original = std::fs::read_to_string(dir.join("steering.yaml")).unwrap();
    let on_a = original.replace("weights: { a: 50, b: 50 }", "weights: { a: 100 }");
    let on_b = original.replace("weights: { a: 50, b: 50 }", "weights: { b: 100 }");
    let (v0, va, vb) = (version_of(&original), version_of(&on_a), version_of(&on_b));
    let stack = Stack::start_polling(&dir, Duration::from_millis(50)).await;
    stack
        .wait_for_path("/v1/policy", "the first version", |p| {
            !p["history"].as_array().unwrap().is_empty()
        })
        .await;
    let (code, body) = post_policy(&stack, &on_a, Some(&v0)).await;
    assert_eq!(code, 202, "{body}");
    wait_networks(&stack, "all on a", |g| answered(g, "a").len() == 400).await;

    // Stages are checked before anything is written.
    for bad in [
        "stages=10,100",
        "stages=10,50&stage_seconds=2",
        "stages=50,10,100&stage_seconds=2",
        "stages=10,100&stage_seconds=0",
        "stages=x&stage_seconds=2",
    ] {
        let (code, body) = post_staged(&stack, &on_b, &va, bad).await;
        assert_eq!(code, 400, "{bad}: {body}");
    }

    // Stages of 10 % then all, 2 s each: the new version answers about a tenth of
    // the networks, the same ones at every poll, with an ECS scope of at least /24.
    let (code, body) = post_staged(&stack, &on_b, &va, "stages=10,100&stage_seconds=2").await;
    assert_eq!(code, 202, "{body}");
    assert_eq!(body["version"], vb.as_str());
    wait_networks(&stack, "the first stage", |g| !answered(g, "b").is_empty()).await;
    // The poll that first saw the new version may have begun before its instant (the
    // networks asked first then still had the old one): the next poll is the canary.
    let (got, _) = by_network(&stack).await;
    let canary = answered(&got, "b");
    assert!(
        (20..=60).contains(&canary.len()),
        "5-15 % of 400 networks get the new version: {}",
        canary.len()
    );
    let p = stack.get("/v1/policy").await;
    assert_eq!(p["rollout"]["version"], vb.as_str(), "{p:#}");
    assert_eq!(p["rollout"]["from"], va.as_str(), "{p:#}");
    assert_eq!(p["rollout"]["share_percent"], 10.0, "{p:#}");
    assert_eq!(p["history"][0]["how"], "staged", "{p:#}");
    // While it runs, no other version is taken.
    let (code, body) = post_policy(&stack, &original, Some(&vb)).await;
    assert_eq!(code, 409, "{body}");
    for _ in 0..2 {
        let (again, scopes) = by_network(&stack).await;
        if answered(&again, "b").len() == 400 {
            break; // the last stage began
        }
        assert_eq!(
            answered(&again, "b"),
            canary,
            "the same networks at every poll"
        );
        assert!(scopes.iter().all(|&s| s >= 24), "scopes {scopes:?}");
    }
    // explain says which cohort and version decide.
    let ask = |i: usize| {
        format!(
            "/v1/explain?name=www.example.com&client={}&resolver=127.0.0.1&source=24",
            network(i)
        )
    };
    let e = stack.get(&ask(canary[0])).await;
    if e["rollout"].is_object() {
        assert_eq!(e["rollout"]["cohort"], "canary", "{e:#}");
        assert_eq!(e["policy_version"], vb.as_str(), "{e:#}");
        let control = (0..400).find(|i| !canary.contains(i)).unwrap();
        let e = stack.get(&ask(control)).await;
        assert_eq!(e["rollout"]["cohort"], "control", "{e:#}");
        assert_eq!(e["policy_version"], va.as_str(), "{e:#}");
    }
    // After the stage: every network, and the new version is the one in force.
    wait_networks(&stack, "the last stage", |g| answered(g, "b").len() == 400).await;
    let p = stack
        .wait_for_path("/v1/policy", "the rollout done", |p| {
            p["rollout"].is_null() && p["version"] == vb.as_str()
        })
        .await;
    assert_eq!(history(&p)[0], (vb.clone(), "staged".into()));

    // A halt: every network back to the version before the rollout.
    let (code, body) = post_staged(&stack, &on_a, &vb, "stages=50,100&stage_seconds=60").await;
    assert_eq!(code, 202, "{body}");
    wait_networks(&stack, "half on a", |g| answered(g, "a").len() > 100).await;
    let (code, body) = stack
        .post("/v1/policy/halt", serde_json::json!({"ticket": "INC-7"}))
        .await;
    assert_eq!(code, 202, "{body}");
    assert_eq!(body["version"], vb.as_str());
    wait_networks(&stack, "all back on b", |g| answered(g, "b").len() == 400).await;
    let p = stack.get("/v1/policy").await;
    assert_eq!(history(&p)[0], (vb.clone(), "halt".into()), "{p:#}");
    assert_eq!(p["history"][0]["ticket"], "INC-7");
    let (code, _) = stack.post("/v1/policy/halt", serde_json::json!({})).await;
    assert_eq!(code, 409, "nothing left to halt");

    // A version whose answers fail (the name is gone: NXDOMAIN for its cohort) halts
    // by itself.
    let without_www = {
        let at = on_b.find("  other.example.com:").unwrap();
        format!("hostnames:\n{}", &on_b[at..])
    };
    let (code, body) =
        post_staged(&stack, &without_www, &vb, "stages=50,100&stage_seconds=60").await;
    assert_eq!(code, 202, "{body}");
    let start = Instant::now();
    let p = loop {
        let (got, _) = by_network(&stack).await;
        let p = stack.get("/v1/policy").await;
        if p["history"][0]["how"] == "halt" {
            break p;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "not halted: {p:#} {:?}",
            answered(&got, "b").len()
        );
    };
    assert_eq!(
        p["history"][1]["version"],
        version_of(&without_www).as_str()
    );
    let why = p["history"][0]["why"].as_str().unwrap_or_default();
    assert!(why.contains("error answers rose"), "{p:#}");
    wait_networks(&stack, "all back on b", |g| answered(g, "b").len() == 400).await;
    assert_eq!(
        stack.metric("steerdns_policy_rollout_halts_total").await,
        Some(1.0)
    );
    // Every stage, halt and rollout is in the audit log.
    let log = std::fs::read_to_string(dir.join("state/audit.jsonl")).unwrap();
    let kinds: Vec<String> = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|e| match e["kind"].as_str() {
            Some("policy") => Some(format!("policy {}", e["how"].as_str().unwrap())),
            Some("policy_stage") => Some(format!("stage {}", e["percent"])),
            _ => None,
        })
        .collect();
    assert_eq!(
        kinds[..6],
        [
            "policy api",
            "policy staged",
            "stage 10",
            "stage 100",
            "policy staged",
            "stage 50"
        ],
        "{kinds:?}"
    );
    assert!(kinds.contains(&"policy halt".to_string()), "{kinds:?}");
    stack.stop().await;
}
