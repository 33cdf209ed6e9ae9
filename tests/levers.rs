//! Levers per customer over real sockets: tenants in the policy, scoped API tokens
//! (`--api-tokens`: verbs, names, tenants, regions, tickets; 401/403), a drain of one
//! tenant measured over DNS from 300 client networks, the tokens file reloaded with the
//! policy, and the audit log (`GET /v1/audit`, `steerdns audit verify`).

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::stack::*;
use common::*;
use hickory_proto::rr::RecordType;
use reqwest::Method;
use serde_json::{json, Value};

/// Two tenants: acme owns a.example.com, globex owns b.example.com; both 50/50 on the
/// CDNs a and b everywhere, drained at once (steps [100]).
fn tenant_policy(dir: &Path) {
    let mut text = String::from("hostnames:\n");
    for (name, tenant) in [("a.example.com", "acme"), ("b.example.com", "globex")] {
        text.push_str(&format!(
            "  {name}:
    tenant: {tenant}
    cdns:
      a: {{ cname: a.cdn.test. }}
      b: {{ cname: b.cdn.test. }}
    regions:
      - name: uk
        match: [GB]
        weights: {{ a: 50, b: 50 }}
      - match: [\"*\"]
        weights: {{ a: 50, b: 50 }}
    failover: {{ steps: [100] }}
"
        ));
    }
    std::fs::write(dir.join("steering.yaml"), text).unwrap();
}

/// The secret of each scoped token is its name repeated (hashes in the file).
fn secret(name: &str) -> String {
    format!("{name}-{name}-secret")
}

fn sha256_hex(s: &str) -> String {
    let out = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(s.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

/// Writes the tokens file (mode 600) with these entries (YAML after `name`/`sha256`).
fn tokens_file(dir: &Path, entries: &[(&str, &str)]) {
    let mut text = String::from("tokens:\n");
    for (name, rest) in entries {
        text.push_str(&format!(
            "  - name: {name}\n    sha256: {}\n{rest}",
            sha256_hex(&secret(name))
        ));
    }
    write_private(&dir.join("api-tokens.yaml"), &text);
}

fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

const TOKENS: &[(&str, &str)] = &[
    (
        "only-a",
        "    verbs: [drain, undrain, freeze, resume]\n    names: [a.example.com]\n",
    ),
    ("no-freeze", "    verbs: [drain, undrain]\n"),
    (
        "acme-ops",
        "    verbs: [drain, undrain]\n    tenants: [acme]\n    require_ticket: true\n",
    ),
    ("uk-only", "    verbs: [drain, freeze]\n    regions: [uk]\n"),
    (
        "acme-freeze",
        "    verbs: [freeze, resume, undrain]\n    tenants: [acme]\n",
    ),
    ("drain-only", "    verbs: [drain]\n"),
    ("acme-usage", "    verbs: [usage]\n    tenants: [acme]\n"),
    (
        "acme-usage-a",
        "    verbs: [usage]\n    tenants: [acme]\n    cdns: [a]\n",
    ),
];

async fn stack(tag: &str) -> Stack {
    let dir = scratch(tag);
    tenant_policy(&dir);
    tokens_file(&dir, TOKENS);
    Stack::start(&dir).await
}

async fn as_token(s: &Stack, token: &str, method: Method, path: &str, body: Value) -> (u16, Value) {
    s.call(method, path, Some(body), Some(&secret(token))).await
}

/// Asserts that `token` gets `403` for `POST path body`, with an error saying `lacks`.
async fn refused(s: &Stack, token: &str, path: &str, body: Value, lacks: &str) {
    let (code, r) = as_token(s, token, Method::POST, path, body).await;
    assert_eq!(code, 403, "{r}");
    let e = r["error"].as_str().unwrap_or_default();
    assert!(e.contains(lacks), "{lacks:?} not in {e:?}");
}

/// CDN counts for `name` asked from 300 client /24 networks (ECS), each through
/// another resolver.
async fn over_300_networks(s: &Stack, name: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for i in 0..300u32 {
        let net = format!("{}.{}.{}.0", 11 + i / 250, i % 250, (i * 7) % 256);
        let q = query_edns(name, RecordType::A, Some((&net, 24)));
        let m = ask_from(s.dns, resolver(i as usize), Proto::Udp, &q).await;
        let cdn = cname_of(&m).split('.').next().unwrap().to_string();
        *counts.entry(cdn).or_insert(0) += 1;
    }
    counts
}

#[tokio::test]
async fn a_token_acts_only_within_its_scope() {
    let s = stack("levers-scope").await;
    let drain = |name: &str| json!({"name": name, "cdn": "a", "reason": "test", "immediate": true});

    // Scoped to a.example.com: b.example.com is refused, saying what it lacks.
    let (drains, freeze) = ("/v1/drains", "/v1/failover/freeze");
    refused(
        &s,
        "only-a",
        drains,
        drain("b.example.com"),
        "lacks the name b.example.com. (tenant globex)",
    )
    .await;
    let before = steerdns::clock::now_ms();
    let (code, body) = as_token(&s, "only-a", Method::POST, drains, drain("a.example.com")).await;
    let after = steerdns::clock::now_ms();
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["author"], "only-a", "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    // Without `until` or `ttl_seconds`, it expires after 2 hours.
    let until = body["until_unix_ms"].as_u64().unwrap();
    assert!(
        (before + 7_200_000..=after + 7_200_000).contains(&until),
        "until {until}, posted between {before} and {after}"
    );

    // Without the verb `freeze`: 403 naming it; a name-limited token cannot freeze all.
    let why = json!({"reason": "drill"});
    refused(
        &s,
        "no-freeze",
        freeze,
        why.clone(),
        "lacks the verb `freeze`",
    )
    .await;
    refused(&s, "only-a", freeze, why.clone(), "lacks every name").await;
    // Freezing or resuming every name needs a token limited by neither names, tenants
    // nor regions.
    refused(&s, "acme-freeze", freeze, why.clone(), "lacks every name").await;
    refused(
        &s,
        "uk-only",
        freeze,
        why.clone(),
        "lacks the scope everywhere",
    )
    .await;
    refused(
        &s,
        "acme-freeze",
        "/v1/failover/resume",
        why.clone(),
        "lacks every name",
    )
    .await;
    assert!(s.state().await["failover_frozen"].is_null());

    // Regions: a drain in `uk` only; everywhere and other places are refused.
    let scoped = |w: Value| json!({"name": "b.example.com", "cdn": "b", "reason": "t", "where": w});
    refused(
        &s,
        "uk-only",
        drains,
        scoped(json!([])),
        "lacks the scope everywhere",
    )
    .await;
    refused(
        &s,
        "uk-only",
        drains,
        scoped(json!(["FR"])),
        "lacks the region `FR`",
    )
    .await;
    let (code, body) = as_token(
        &s,
        "uk-only",
        Method::POST,
        "/v1/drains",
        scoped(json!(["uk"])),
    )
    .await;
    assert_eq!(code, 201, "{body}");

    // Undrain of another name's drain (b.example.com's, of tenant globex): refused to a
    // token limited to a.example.com and to one limited to the tenant acme.
    let b_id = body["id"].as_str().unwrap().to_string();
    for (token, lacks) in [
        ("only-a", "lacks the name b.example.com."),
        (
            "acme-freeze",
            "lacks the name b.example.com. (tenant globex)",
        ),
    ] {
        let (code, r) = s
            .call(
                Method::DELETE,
                &format!("/v1/drains/{b_id}"),
                None,
                Some(&secret(token)),
            )
            .await;
        assert_eq!(code, 403, "{token}: {r}");
        let e = r["error"].as_str().unwrap_or_default();
        assert!(e.contains(lacks), "{token}: {lacks:?} not in {e:?}");
    }
    assert!(
        s.state().await["drains"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["id"] == b_id.as_str()),
        "b.example.com's drain still in force"
    );

    // Undrain: no-freeze lacks nothing there; uk-only lacks the verb.
    let path = format!("/v1/drains/{id}");
    let (code, _) = s
        .call(Method::DELETE, &path, None, Some(&secret("uk-only")))
        .await;
    assert_eq!(code, 403);
    let (code, body) = s
        .call(Method::DELETE, &path, None, Some(&secret("no-freeze")))
        .await;
    assert_eq!(code, 200, "{body}");

    // An unknown token is 401; the --api-token-file token keeps every right.
    let (code, _) = as_token(
        &s,
        "nobody",
        Method::POST,
        "/v1/failover/freeze",
        why.clone(),
    )
    .await;
    assert_eq!(code, 401);
    let (code, body) = s.post("/v1/failover/freeze", why).await;
    assert_eq!(code, 200, "{body}");
}

#[tokio::test]
async fn a_tenant_drain_moves_only_that_tenants_names() {
    let s = stack("levers-tenant").await;
    // Both names answer a and b before.
    for name in ["a.example.com.", "b.example.com."] {
        let before = over_300_networks(&s, name).await;
        assert!(
            before.get("a").copied().unwrap_or(0) > 60,
            "{name}: {before:?}"
        );
    }
    let body = json!({"tenant": "acme", "cdn": "a", "reason": "INC-7 acme", "immediate": true});
    // This token must give a ticket.
    let (code, r) = as_token(&s, "acme-ops", Method::POST, "/v1/drains", body.clone()).await;
    assert_eq!(code, 400, "{r}");
    assert!(
        r["error"].as_str().unwrap().contains("requires a ticket"),
        "{r}"
    );
    // And it may not touch globex's name.
    let other = json!({"name": "b.example.com", "cdn": "a", "reason": "x", "ticket": "T-1"});
    refused(
        &s,
        "acme-ops",
        "/v1/drains",
        other,
        "lacks the name b.example.com.",
    )
    .await;
    let mut with_ticket = body.clone();
    with_ticket["ticket"] = json!("INC-7");
    let (code, r) = as_token(&s, "acme-ops", Method::POST, "/v1/drains", with_ticket).await;
    assert_eq!(code, 201, "{r}");
    assert_eq!(r["tenant"], "acme");
    let drains = r["drains"].as_array().unwrap();
    assert_eq!(drains.len(), 1, "{r}");
    assert_eq!(drains[0]["name"], "a.example.com.");
    assert_eq!(drains[0]["ticket"], "INC-7");
    let st = s
        .wait_for("the tenant drain in force", |st| {
            st["drains"].as_array().is_some_and(|d| {
                d.iter()
                    .any(|d| d["name"] == "a.example.com." && d["removed_percent"] == 100)
            })
        })
        .await;
    let d = &st["drains"][0];
    assert_eq!(
        (d["author"].clone(), d["tenant"].clone()),
        (json!("acme-ops"), json!("acme")),
        "{st:#}"
    );
    assert!(
        d["until_unix_ms"].as_u64().is_some(),
        "an override expires by default: {st:#}"
    );
    assert_eq!(st["tenants"]["acme"], json!(["a.example.com."]));

    let a = over_300_networks(&s, "a.example.com.").await;
    let b = over_300_networks(&s, "b.example.com.").await;
    assert_eq!(a.get("a"), None, "acme's name still answers a: {a:?}");
    assert_eq!(a.get("b"), Some(&300), "{a:?}");
    assert!(
        b.get("a").copied().unwrap_or(0) > 60,
        "globex's name moved: {b:?}"
    );

    // explain and the status page show the tenant and the author.
    let ex = s
        .get("/v1/explain?name=a.example.com&client=81.2.69.142")
        .await;
    assert_eq!(ex["tenant"], "acme", "{ex:#}");
    let page = s.text("/").await;
    assert!(page.contains("tenant acme"), "no tenant on the status page");
    assert!(
        page.contains("acme-ops, ticket INC-7, tenant acme"),
        "no author on the status page"
    );
}

#[tokio::test]
async fn the_tokens_file_is_reloaded_and_a_broken_one_keeps_the_last_good() {
    let s = stack("levers-reload").await;
    let freeze = json!({"reason": "r"});
    let drain = json!({"name": "a.example.com", "cdn": "a", "reason": "t", "immediate": true});
    let (code, _) = as_token(&s, "only-a", Method::POST, "/v1/drains", drain.clone()).await;
    assert_eq!(code, 201);
    // A file open to its group is refused at reload: the last good tokens stay.
    let path = s.dir.join("api-tokens.yaml");
    let version = s.state().await["config_version"].clone();
    {
        use std::os::unix::fs::PermissionsExt;
        let text = std::fs::read_to_string(&path).unwrap() + "# open to the group\n";
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o640)).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    let st = s
        .wait_for("the reload refused", |st| last_reload(st).0 == "refused")
        .await;
    let errors = last_reload(&st).1;
    assert!(
        errors.contains("api-tokens.yaml") && errors.contains("chmod 600"),
        "{errors}"
    );
    assert_eq!(st["config_version"], version);
    let (code, _) = as_token(&s, "only-a", Method::POST, "/v1/drains", drain.clone()).await;
    assert_eq!(code, 201, "the last good tokens must stay");
    // A new file: only-a is gone, no-freeze may now freeze.
    tokens_file(&s.dir, &[("no-freeze", "    verbs: [freeze]\n")]);
    s.wait_for("the reload applied", |st| {
        last_reload(st).0 == "applied" && st["config_version"] != version
    })
    .await;
    let (code, _) = as_token(&s, "only-a", Method::POST, "/v1/drains", drain).await;
    assert_eq!(code, 401);
    let (code, body) = as_token(&s, "no-freeze", Method::POST, "/v1/failover/freeze", freeze).await;
    assert_eq!(code, 200, "{body}");
}

fn verify(files: &[PathBuf]) -> (bool, String) {
    let out = steerdns(&["audit"])
        .arg("verify")
        .args(files)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[tokio::test]
async fn the_audit_log_chains_every_mutation_and_verify_finds_any_edit() {
    let s = stack("levers-audit").await;
    let drain = json!({"name": "a.example.com", "cdn": "a", "reason": "audit me", "ticket": "T-9", "immediate": true});
    let (code, r) = as_token(&s, "only-a", Method::POST, "/v1/drains", drain).await;
    assert_eq!(code, 201, "{r}");
    let id = r["id"].as_str().unwrap();
    assert_eq!(
        s.post("/v1/failover/freeze", json!({"reason": "f"}))
            .await
            .0,
        200
    );
    assert_eq!(
        s.post("/v1/failover/resume", json!({"reason": "g"}))
            .await
            .0,
        200
    );
    assert_eq!(s.undrain(id).await, 200);
    // A reload too.
    let mut policy = std::fs::read_to_string(s.dir.join("steering.yaml")).unwrap();
    policy = policy.replace("tenant: globex", "tenant: initech");
    let tmp = s.dir.join("steering.yaml.tmp");
    std::fs::write(&tmp, policy).unwrap();
    std::fs::rename(&tmp, s.dir.join("steering.yaml")).unwrap();

    let mut entries = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while entries.len() < 6 {
        assert!(
            std::time::Instant::now() < deadline,
            "audit entries: {entries:#?}"
        );
        entries = s.get("/v1/audit?after=0&limit=100").await["entries"]
            .as_array()
            .unwrap()
            .clone();
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let kinds: Vec<&str> = entries
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["drain", "freeze", "resume", "undrain", "policy", "reload"],
        "{entries:#?}"
    );
    assert_eq!(entries[0]["author"], "only-a");
    assert_eq!(entries[0]["ticket"], "T-9");
    assert_eq!(entries[1]["author"], "api-token-file");
    // The edit of the file is a new policy version, then the reload that applies it.
    assert_eq!(entries[4]["how"], "file", "{:#}", entries[4]);
    assert_eq!(
        entries[5]["diff"]["names_changed"],
        json!(["b.example.com."]),
        "{:#}",
        entries[5]
    );
    assert_eq!(entries[5]["trigger"], "file change", "{:#}", entries[5]);
    // Paged: after the second, one at a time.
    let p = s.get("/v1/audit?after=2&limit=1").await;
    assert_eq!(
        (p["entries"][0]["seq"].as_u64(), p["more"].as_bool()),
        (Some(3), Some(true)),
        "{p:#}"
    );

    let log = s.dir.join("state/audit.jsonl");
    let (ok, out) = verify(std::slice::from_ref(&log));
    assert!(ok, "an untouched log must verify: {out}");
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let tampered = |tag: &str, lines: Vec<String>| {
        let p = s.dir.join(format!("audit-{tag}.jsonl"));
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        verify(&[p])
    };
    let own = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // Deleted: line 3 goes; line 3 (was 4) names the gap.
    let mut del = own(&lines);
    del.remove(2);
    let (ok, out) = tampered("deleted", del);
    assert!(
        !ok && out.contains(":3: line(s) removed before this one"),
        "{out}"
    );
    // The first line deleted: the chain no longer starts at seq 1.
    let (ok, out) = tampered("first", own(&lines[1..]));
    assert!(
        !ok && out.contains(":1: line(s) removed before this one"),
        "{out}"
    );
    // Edited: a reason changed on line 2.
    let mut edit = own(&lines);
    edit[1] = edit[1].replace("\"reason\":\"f\"", "\"reason\":\"x\"");
    assert_ne!(edit[1], lines[1]);
    let (ok, out) = tampered("edited", edit);
    assert!(!ok && out.contains(":2: changed"), "{out}");
    // Edited and re-sealed (its own hash made right again): only the next line's `prev`
    // betrays it.
    let mut resealed = own(&lines);
    let mut v: serde_json::Map<String, Value> = serde_json::from_str(lines[1]).unwrap();
    v.remove("hash");
    v.insert("reason".into(), "x".into());
    resealed[1] = sealed(&v).0;
    assert_ne!(resealed[1], lines[1]);
    let (ok, out) = tampered("resealed", resealed);
    assert!(
        !ok && out.contains(":2: changed: line 3 records another hash for the line before it"),
        "{out}"
    );
    // Swapped: lines 2 and 3.
    let mut swap = own(&lines);
    swap.swap(1, 2);
    let (ok, out) = tampered("swapped", swap);
    assert!(!ok && out.contains(":2: reordered"), "{out}");

    // `audit tail` prints it for people.
    let out = steerdns(&["audit", "tail", "--state-dir"])
        .arg(s.dir.join("state"))
        .args(["-n", "3"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(
        text.contains("undrain") && text.contains("author=\"api-token-file\""),
        "{text}"
    );
}

/// The percent of `cdn` removed from `name` by failover, if any.
fn removed_from(s: &Value, name: &str, cdn: &str) -> Option<u64> {
    s["failover"]
        .as_array()?
        .iter()
        .find(|f| f["cdn"] == cdn && f["name"] == name)?["removed_percent"]
        .as_u64()
}

#[tokio::test]
async fn a_tenant_freeze_holds_only_that_tenants_names() {
    use common::mock_cdn::{MockCdn, Mode};
    let dir = scratch("levers-freeze");
    tenant_policy(&dir);
    tokens_file(&dir, TOKENS);
    let (a, b) = (
        MockCdn::start(Mode::Healthy).await,
        MockCdn::start(Mode::Healthy).await,
    );
    probe(&dir, "a", &a.url("/a"), 1);
    probe(&dir, "b", &b.url("/b"), 1);
    let s = Stack::start(&dir).await;
    s.wait_for("probed", |st| ["a", "b"].iter().all(|c| up_verdict(st, c)))
        .await;
    let acme = json!({"reason": "acme window", "tenant": "acme"});
    // A tenant not frozen has nothing to resume: 409 (its timelines would start anew).
    let (code, r) = s.post("/v1/failover/resume", acme.clone()).await;
    assert_eq!(code, 409, "{r}");
    assert!(
        r["error"].as_str().unwrap_or("").contains("not frozen"),
        "{r}"
    );
    // A token limited to a name may not freeze a tenant; an unknown tenant is 400.
    refused(
        &s,
        "only-a",
        "/v1/failover/freeze",
        acme.clone(),
        "lacks the tenant acme",
    )
    .await;
    let (code, r) = s
        .post(
            "/v1/failover/freeze",
            json!({"reason": "x", "tenant": "nobody"}),
        )
        .await;
    assert_eq!(code, 400, "{r}");
    let (code, r) = s.post("/v1/failover/freeze", acme.clone()).await;
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["tenant"], "acme");

    // a fails: globex's name moves off it, acme's holds.
    a.set(Mode::Status(503));
    let st = s
        .wait_for("a down and b.example.com off it", |st| {
            health(st, "a")["state"] == "down"
                && removed_from(st, "b.example.com.", "a") == Some(100)
        })
        .await;
    assert_eq!(removed_from(&st, "a.example.com.", "a"), None, "{st:#}");
    assert!(st["failover_frozen"].is_null(), "{st:#}");
    assert!(
        st["failover_frozen_tenants"]["acme"]
            .as_str()
            .is_some_and(|w| w.contains("acme window")),
        "{st:#}"
    );
    let held = over_300_networks(&s, "a.example.com.").await;
    let moved = over_300_networks(&s, "b.example.com.").await;
    assert!(
        held.get("a").copied().unwrap_or(0) > 60,
        "acme's name moved: {held:?}"
    );
    assert_eq!(moved.get("a"), None, "globex's name still on a: {moved:?}");
    let ex = s
        .get("/v1/explain?name=a.example.com&client=81.2.69.142")
        .await;
    assert!(
        ex["failover_frozen"]
            .as_str()
            .is_some_and(|w| w.contains("tenant freeze")),
        "{ex:#}"
    );

    // Resumed for acme: its name follows the health now.
    let (code, r) = s.post("/v1/failover/resume", acme).await;
    assert_eq!(code, 200, "{r}");
    s.wait_for("a.example.com off a", |st| {
        removed_from(st, "a.example.com.", "a") == Some(100)
            && st["failover_frozen_tenants"]
                .as_object()
                .is_some_and(|m| m.is_empty())
    })
    .await;
    let after = over_300_networks(&s, "a.example.com.").await;
    assert_eq!(after.get("a"), None, "{after:?}");
}

/// A token with only `drain` may extend another author's drain by posting it again,
/// never end it sooner; one drain stays, and the replaced one is audited. Usage is
/// scoped by CDN, and only this month's and last month's count.
#[tokio::test]
async fn a_drain_cannot_end_anothers_sooner_and_usage_is_scoped_by_cdn() {
    let s = stack("levers-replace").await;
    let drain = |ttl: u64| {
        json!({"name": "a.example.com", "cdn": "a", "reason": "INC-3", "immediate": true,
               "ttl_seconds": ttl})
    };
    let post = |token: &'static str, body: Value| {
        let s = &s;
        async move { as_token(s, token, Method::POST, "/v1/drains", body).await }
    };
    let (code, first) = post("no-freeze", drain(7200)).await;
    assert_eq!(code, 201, "{first}");
    let first_id = first["id"].as_str().unwrap().to_string();
    // Ending it in a second, with only `drain`: refused, saying why.
    refused(
        &s,
        "drain-only",
        "/v1/drains",
        drain(1),
        &format!("would end the drain `{first_id}` of no-freeze sooner"),
    )
    .await;
    // Extending it: taken; the set keeps one drain of (a.example.com, a).
    let (code, longer) = post("drain-only", drain(10_800)).await;
    assert_eq!(code, 201, "{longer}");
    let longer_id = longer["id"].as_str().unwrap().to_string();
    let st = s.state().await;
    let ids: Vec<&str> = st["drains"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["name"] == "a.example.com." && d["cdn"] == "a")
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [longer_id.as_str()], "{st:#}");
    // With `undrain` as well, sooner is allowed.
    let (code, body) = post("no-freeze", drain(60)).await;
    assert_eq!(code, 201, "{body}");
    let log = std::fs::read_to_string(s.dir.join("state/audit.jsonl")).unwrap();
    let replaced: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["kind"] == "replace")
        .collect();
    assert_eq!(replaced.len(), 2, "{log}");
    assert_eq!(replaced[0]["id"], first_id.as_str());
    assert_eq!(replaced[0]["replaced_by"], longer_id.as_str());
    assert_eq!(replaced[0]["replaced_by_author"], "drain-only");

    // Usage: a CDN is every tenant's; a tenant's token reports only for the CDNs it lists.
    let now = steerdns::clock::now_ms() / 300_000 * 300_000 - 300_000;
    let record = |cdn: &str, start: u64| {
        json!({"cdn": cdn, "start": steerdns::control::decide::times::rfc3339(start),
               "seconds": 300, "mbps": 100})
    };
    refused(
        &s,
        "acme-usage",
        "/v1/usage",
        record("a", now),
        "lacks the CDN `a`",
    )
    .await;
    refused(
        &s,
        "acme-usage-a",
        "/v1/usage",
        record("b", now),
        "lacks the CDN `b`",
    )
    .await;
    let (code, body) = as_token(
        &s,
        "acme-usage-a",
        Method::POST,
        "/v1/usage",
        record("a", now),
    )
    .await;
    assert_eq!((code, body["added"].as_u64()), (200, Some(1)), "{body}");
    // A record of 1970 is refused, whoever sends it.
    let (code, body) = s.post("/v1/usage", record("a", 0)).await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("before last month"),
        "{body}"
    );
    // The usage taken is audited, with its author.
    let log = std::fs::read_to_string(s.dir.join("state/audit.jsonl")).unwrap();
    assert!(
        log.lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .any(|e| e["kind"] == "usage" && e["author"] == "acme-usage-a" && e["added"] == 1),
        "{log}"
    );
}

/// The line of audit entry `fields` sealed as the server seals it (the SHA-256 of the
/// line up to its hash): what a forger who rewrites the log from some line on does.
fn sealed(fields: &serde_json::Map<String, Value>) -> (String, String) {
    let body = Value::Object(fields.clone()).to_string();
    let open = &body[..body.len() - 1];
    let hash = sha256_hex(open);
    (format!("{open},\"hash\":\"{hash}\"}}"), hash)
}

/// The audit log never fails open: a line cut short by a crash is cut and kept aside
/// at start, and the chain goes on; a last line that is not an entry stops every
/// mutation (503, the metric, /v1/state) rather than change anything unaudited; the
/// head published in /v1/state catches a copy cut short or rewritten and rehashed.
#[tokio::test]
async fn the_audit_log_never_fails_open_and_its_head_catches_a_rewrite() {
    let s = stack("levers-audit-closed").await;
    let dir = s.dir.clone();
    let drain = json!({"name": "a.example.com", "cdn": "a", "reason": "one", "immediate": true});
    assert_eq!(s.post("/v1/drains", drain.clone()).await.0, 201);
    assert_eq!(
        s.post("/v1/failover/freeze", json!({"reason": "two"}))
            .await
            .0,
        200
    );
    let head = s
        .wait_for("the head at entry 2", |st| {
            st["audit"]["head"]
                .as_str()
                .is_some_and(|h| h.starts_with("2:"))
        })
        .await["audit"]["head"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(s.state().await["audit"]["failing"].is_null());
    s.stop().await;
    let log = dir.join("state/audit.jsonl");
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");

    // --expect-head: the log holds the head; a copy without its last line, or
    // rewritten from line 1 on and rehashed (which verifies on its own), does not.
    let check = |p: &std::path::Path| {
        let out = steerdns(&["audit", "verify", "--expect-head", &head])
            .arg(p)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), said)
    };
    let (ok, said) = check(&log);
    assert!(ok, "{said}");
    let cut = dir.join("audit-cut.jsonl");
    std::fs::write(&cut, format!("{}\n", lines[0])).unwrap();
    let (ok, said) = check(&cut);
    assert!(!ok && said.contains("cut short"), "{said}");
    let mut prev = "0".repeat(64);
    let mut forged = String::new();
    for (i, line) in lines.iter().enumerate() {
        let mut v: serde_json::Map<String, Value> = serde_json::from_str(line).unwrap();
        v.remove("hash");
        v.insert("prev".into(), prev.clone().into());
        if i == 0 {
            v.insert("reason".into(), "someone else".into());
        }
        let (l, h) = sealed(&v);
        forged.push_str(&l);
        forged.push('\n');
        prev = h;
    }
    let rewritten = dir.join("audit-rewritten.jsonl");
    std::fs::write(&rewritten, &forged).unwrap();
    assert!(
        verify(std::slice::from_ref(&rewritten)).0,
        "a rehashed copy verifies alone"
    );
    let (ok, said) = check(&rewritten);
    assert!(!ok && said.contains("rewritten: entry 2"), "{said}");

    // A crash while a line was written: cut at start, kept aside; the chain goes on.
    let torn = r#"{"at_unix_ms":1,"kind":"drain","node":"x","pre"#;
    std::fs::write(&log, format!("{text}{torn}")).unwrap();
    let s = Stack::start(&dir).await;
    assert_eq!(
        s.post("/v1/failover/resume", json!({"reason": "three"}))
            .await
            .0,
        200
    );
    let aside: Vec<_> = std::fs::read_dir(dir.join("state"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("audit.jsonl.torn-")
        })
        .collect();
    assert_eq!(aside.len(), 1);
    assert_eq!(std::fs::read_to_string(aside[0].path()).unwrap(), torn);
    s.wait_for("the resume appended", |_| {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("\"three\""))
    })
    .await;
    let (ok, said) = verify(std::slice::from_ref(&log));
    assert!(ok, "{said}");
    s.stop().await;

    // A whole last line that is no audit entry: the chain cannot go on, so nothing
    // changes: every mutation is 503 and says why, with the metric and /v1/state.
    let text = std::fs::read_to_string(&log).unwrap();
    std::fs::write(&log, format!("{text}not an entry\n")).unwrap();
    let s = Stack::start(&dir).await;
    let (code, body) = s.post("/v1/drains", drain).await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("audit log cannot be written"),
        "{body}"
    );
    let (code, _) = s.post("/v1/failover/freeze", json!({"reason": "x"})).await;
    assert_eq!(code, 503);
    assert_eq!(s.metric("steerdns_audit_failing").await, Some(1.0));
    let st = s.state().await;
    assert!(st["audit"]["failing"].is_string(), "{st:#}");
    assert!(st["failover_frozen"].is_null(), "{st:#}");
    s.stop().await;
}
