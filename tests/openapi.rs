//! The OpenAPI documents (`docs/openapi/admin.yaml`, `docs/openapi/steering.yaml`)
//! against the servers: every route of the routers' tables (`control::surfaces::api::ROUTES`,
//! `control::content::server::ROUTES`) is documented with its method and every
//! documented operation is in a table; then the release binary serves the demo policy
//! with a token and each documented operation is sent once, valid, over HTTP: its
//! status must be the expected success, one the document lists for it, with a
//! documented content type. (`scripts/openapi.sh` runs schemathesis on top.)

mod common;

use std::collections::BTreeSet;
use std::net::TcpStream;

use std::time::Duration;

use common::demo::Demo;
use common::{repo, TEST_GEO};
use serde_yaml::Value;

use common::stack::TOKEN;

/// (method, path template) of every operation of a document, methods upper-case.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let paths = doc["paths"].as_mapping().expect("`paths`");
    for (path, item) in paths {
        let path = path.as_str().unwrap();
        for (method, _) in item.as_mapping().unwrap() {
            let method = method.as_str().unwrap();
            if matches!(
                method,
                "get" | "put" | "post" | "delete" | "options" | "head" | "patch" | "trace"
            ) {
                out.insert((method.to_ascii_uppercase(), path.to_string()));
            }
        }
    }
    out
}

fn load(file: &str) -> Value {
    let text = std::fs::read_to_string(repo(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn table(routes: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    routes
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect()
}

/// What one set has that the other lacks, both ways, as a message (empty: none).
fn differences(
    document: &str,
    documented: &BTreeSet<(String, String)>,
    router: &str,
    routed: &BTreeSet<(String, String)>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (m, p) in routed.difference(documented) {
        out.push(format!("{m} {p} is in {router} but not in {document}"));
    }
    for (m, p) in documented.difference(routed) {
        out.push(format!("{m} {p} is in {document} but not in {router}"));
    }
    out
}

#[test]
fn every_route_is_documented_and_every_documented_route_is_routed() {
    let mut wrong = differences(
        "docs/openapi/admin.yaml",
        &operations(&load("docs/openapi/admin.yaml")),
        "control::surfaces::api::ROUTES",
        &table(steerdns::control::surfaces::api::ROUTES),
    );
    wrong.extend(differences(
        "docs/openapi/steering.yaml",
        &operations(&load("docs/openapi/steering.yaml")),
        "control::content::server::ROUTES",
        &table(steerdns::control::content::server::ROUTES),
    ));
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_mutation_names_its_verb_and_the_bearer_scheme() {
    let doc = load("docs/openapi/admin.yaml");
    let scheme = &doc["components"]["securitySchemes"]["bearerAuth"];
    assert_eq!(scheme["type"].as_str(), Some("http"));
    assert_eq!(scheme["scheme"].as_str(), Some("bearer"));
    let verbs = [
        "drain", "undrain", "freeze", "resume", "usage", "policy", "audit",
    ];
    for (method, path) in operations(&doc) {
        let op = &doc["paths"][path.as_str()][method.to_ascii_lowercase().as_str()];
        // The audit log: open to loopback (`{}`), a token of `audit` from elsewhere.
        if method == "GET" && path != "/v1/audit" {
            assert!(op.get("security").is_none(), "{method} {path} is open");
            continue;
        }
        let security = serde_yaml::to_string(&op["security"]).unwrap();
        assert!(
            security.contains("bearerAuth"),
            "{method} {path}: no bearerAuth"
        );
        let verb = op["x-steerdns-verb"].as_str().unwrap_or_default();
        assert!(
            verbs.contains(&verb),
            "{method} {path}: x-steerdns-verb {verb:?}"
        );
        let description = op["description"].as_str().unwrap_or_default();
        let description = description.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            description.contains(&format!("verb `{verb}`")),
            "{method} {path}: the description does not say it needs the verb `{verb}`"
        );
        for status in ["401", "403"] {
            assert!(
                op["responses"].get(status).is_some(),
                "{method} {path}: no {status}"
            );
        }
    }
}

/// The demo server ([`Demo`]) with a built manual of one page for `/book/{page}`
/// (`--book`).
fn demo() -> Demo {
    Demo::start("openapi", &repo(TEST_GEO), &["--book", "book"], |dir| {
        std::fs::create_dir_all(dir.join("book/user")).unwrap();
        std::fs::write(dir.join("book/index.html"), "<h1>steerdns</h1>").unwrap();
        std::fs::write(
            dir.join("book/user/operating.html"),
            "<h2 id=\"drains\">Drains</h2>",
        )
        .unwrap();
    })
}

struct Reply {
    status: u16,
    content_type: String,
    body: String,
}

/// One HTTP/1.1 request on its own connection (`Connection: close`), read to the end.
fn http(
    method: &str,
    port: u16,
    target: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> std::io::Result<Reply> {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut req =
        format!("{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    let body = body.unwrap_or("");
    if !body.is_empty() || method == "POST" {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    Ok(Reply {
        status,
        content_type,
        body: body.to_string(),
    })
}

/// A valid request of each documented operation and the status it must get.
struct Sample {
    method: &'static str,
    template: &'static str,
    target: String,
    body: Option<String>,
    expect: u16,
}

fn sample(
    method: &'static str,
    template: &'static str,
    target: &str,
    body: Option<&str>,
    expect: u16,
) -> Sample {
    Sample {
        method,
        template,
        target: target.to_string(),
        body: body.map(str::to_string),
        expect,
    }
}

/// Sends `s` and checks its reply against the operation of `doc`; what is wrong, if
/// anything.
fn check(doc: &Value, port: u16, s: &Sample) -> Result<Reply, String> {
    let what = format!("{} {}", s.method, s.target);
    let op = &doc["paths"][s.template][s.method.to_ascii_lowercase().as_str()];
    let token = op.get("security").map(|_| TOKEN);
    let r = http(s.method, port, &s.target, token, s.body.as_deref())
        .map_err(|e| format!("{what}: {e}"))?;
    if r.status != s.expect {
        return Err(format!(
            "{what}: {} (expected {}): {}",
            r.status, s.expect, r.body
        ));
    }
    let documented = &op["responses"][r.status.to_string().as_str()];
    if documented.is_null() {
        return Err(format!(
            "{what}: {} is not a status the document lists for it",
            r.status
        ));
    }
    // A documented body: the reply's type is one of the document's.
    let documented = match documented.get("$ref").and_then(Value::as_str) {
        Some(reference) => {
            let name = reference.rsplit('/').next().unwrap();
            &doc["components"]["responses"][name]
        }
        None => documented,
    };
    if let Some(content) = documented.get("content").and_then(Value::as_mapping) {
        if s.method != "HEAD" {
            let media = r.content_type.split(';').next().unwrap_or("").trim();
            let listed: Vec<&str> = content.keys().filter_map(Value::as_str).collect();
            if !listed.contains(&media) {
                return Err(format!(
                    "{what}: content type {:?}, the document lists {listed:?}",
                    r.content_type
                ));
            }
        }
    }
    Ok(r)
}

#[test]
fn every_documented_operation_answers_as_documented() {
    let admin = load("docs/openapi/admin.yaml");
    let steering = load("docs/openapi/steering.yaml");
    let demo = demo();
    let mut wrong = Vec::new();
    let mut sent = BTreeSet::new();

    // The admin API: reads, then each mutation (a drain is made, then ended).
    let start = steerdns::clock::rfc3339(steerdns::clock::now_ms() - 3_600_000);
    let usage = format!(r#"{{"cdn":"fastly","start":"{start}","seconds":300,"bytes":1000000}}"#);
    let mut samples = vec![
        sample("GET", "/", "/", None, 200),
        sample("GET", "/healthz", "/healthz", None, 200),
        sample("GET", "/metrics", "/metrics", None, 200),
        sample("GET", "/v1/observations", "/v1/observations", None, 200),
        sample("GET", "/v1/state", "/v1/state", None, 200),
        sample(
            "GET",
            "/v1/explain",
            "/v1/explain?name=www.example.com&client=81.2.69.142",
            None,
            200,
        ),
        sample(
            "POST",
            "/v1/drains",
            "/v1/drains",
            Some(
                r#"{"name":"www.example.com","cdn":"fastly","where":["GB"],"reason":"openapi test","ttl_seconds":600}"#,
            ),
            201,
        ),
        sample(
            "POST",
            "/v1/failover/freeze",
            "/v1/failover/freeze",
            Some(r#"{"reason":"openapi test"}"#),
            200,
        ),
        sample(
            "POST",
            "/v1/failover/resume",
            "/v1/failover/resume",
            Some(r#"{"reason":"openapi test"}"#),
            200,
        ),
        sample("POST", "/v1/usage", "/v1/usage", Some(&usage), 200),
        sample("GET", "/v1/audit", "/v1/audit?after=0&limit=10", None, 200),
        sample("GET", "/v1/policy", "/v1/policy", None, 200),
        // Without `If-Match`: refused, nothing changes (the tests of tests/policy.rs
        // apply versions).
        sample(
            "POST",
            "/v1/policy",
            "/v1/policy",
            Some("hostname: x\n"),
            412,
        ),
        // The demo's first version has none before it.
        sample(
            "POST",
            "/v1/policy/rollback",
            "/v1/policy/rollback",
            Some("{}"),
            400,
        ),
        sample("POST", "/v1/policy/halt", "/v1/policy/halt", None, 409),
        sample(
            "GET",
            "/book/{page}",
            "/book/user/operating.html",
            None,
            200,
        ),
    ];
    let mut drain = None;
    for s in &samples {
        sent.insert((s.method.to_string(), s.template.to_string()));
        match check(&admin, demo.api, s) {
            Ok(r) if s.template == "/v1/drains" => {
                let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
                drain = v["id"].as_str().map(str::to_string);
            }
            Ok(_) => {}
            Err(e) => wrong.push(e),
        }
    }
    let id = drain.unwrap_or_else(|| "api-none".into());
    samples = vec![sample(
        "DELETE",
        "/v1/drains/{id}",
        &format!("/v1/drains/{id}"),
        None,
        200,
    )];
    for s in &samples {
        sent.insert((s.method.to_string(), s.template.to_string()));
        if let Err(e) = check(&admin, demo.api, s) {
            wrong.push(e);
        }
    }
    for op in operations(&admin) {
        if !sent.contains(&op) {
            wrong.push(format!(
                "{} {} (admin.yaml): no request of it here: add one",
                op.0, op.1
            ));
        }
    }

    // Content steering: a beacon carries the ticket the server issued.
    sent.clear();
    let name = "www.example.com";
    let ticket = http(
        "GET",
        demo.steering,
        &format!("/rum/{name}/ticket"),
        None,
        None,
    )
    .ok()
    .and_then(|r| serde_json::from_str::<serde_json::Value>(&r.body).ok())
    .and_then(|v| v["ticket"].as_str().map(str::to_string))
    .unwrap_or_default();
    let beacon = format!(
        r#"{{"ticket":"{ticket}","samples":[{{"cdn":"fastly","ttfb_ms":80,"throughput_bps":5000000,"ok":true}}]}}"#
    );
    let samples = vec![
        sample("GET", "/steer/hls/{name}", &format!("/steer/hls/{name}?_HLS_pathway=fastly&_HLS_throughput=5000000"), None, 200),
        sample("HEAD", "/steer/hls/{name}", &format!("/steer/hls/{name}"), None, 200),
        sample("OPTIONS", "/steer/hls/{name}", &format!("/steer/hls/{name}"), None, 204),
        sample("GET", "/steer/dash/{name}", &format!("/steer/dash/{name}?_DASH_pathway=%22fastly,cloudflare%22&_DASH_throughput=%225000,3000%22"), None, 200),
        sample("HEAD", "/steer/dash/{name}", &format!("/steer/dash/{name}"), None, 200),
        sample("OPTIONS", "/steer/dash/{name}", &format!("/steer/dash/{name}"), None, 204),
        sample("POST", "/rum/{name}", &format!("/rum/{name}"), Some(&beacon), 204),
        // No `Origin` of --beacon-origin (the demo lists none): refused.
        sample("OPTIONS", "/rum/{name}", &format!("/rum/{name}"), None, 403),
        sample(
            "GET",
            "/rum/{name}/ticket",
            &format!("/rum/{name}/ticket?session=00000000c0ffee00"),
            None,
            200,
        ),
    ];
    for s in &samples {
        sent.insert((s.method.to_string(), s.template.to_string()));
        if let Err(e) = check(&steering, demo.steering, s) {
            wrong.push(e);
        }
    }
    for op in operations(&steering) {
        if !sent.contains(&op) {
            wrong.push(format!(
                "{} {} (steering.yaml): no request of it here: add one",
                op.0, op.1
            ));
        }
    }

    // And the routers' fallbacks are what the documents say of them.
    let r = http("GET", demo.api, "/v1/nothing", None, None).unwrap();
    assert_eq!((r.status, r.body.as_str()), (404, "not found\n"));
    let r = http("GET", demo.api, "/v1/drains", None, None).unwrap();
    assert_eq!((r.status, r.body.as_str()), (405, "POST only\n"));
    let r = http("PUT", demo.steering, "/rum/www.example.com", None, None).unwrap();
    assert_eq!(r.status, 405);
    let r = http("OPTIONS", demo.steering, "/nothing", None, None).unwrap();
    assert_eq!(r.status, 404);

    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
