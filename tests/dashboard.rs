//! The Grafana dashboard (`deploy/grafana/steerdns.json`) against a real Prometheus:
//! Prometheus scrapes a running server every second while it goes through a drill (a
//! CDN fails and is stepped out, the name it serves alone fails open, another CDN is
//! drained, the policy is reloaded, queries flow), and every query of every panel and
//! annotation, taken from the JSON, must return data through Prometheus's HTTP API
//! over the drill. The alert rules of `deploy/prometheus/` are loaded too and must all
//! evaluate without error.
//!
//! Needs `prometheus` (Debian: `apt-get install prometheus`; or `$PROMETHEUS`): without
//! it the test says so and passes, except under `CI=true`, where it fails.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::mock_cdn::Mode;
use common::stack::*;
use common::*;
use hickory_proto::rr::RecordType;
use serde_json::{json, Value};
use tokio::time::Instant;

/// The Prometheus server binary, or `None` (after saying why) when the test should skip.
fn prometheus_bin() -> Option<String> {
    let bin = std::env::var("PROMETHEUS").unwrap_or_else(|_| "prometheus".into());
    let found = Command::new(&bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        let why = "prometheus not found (apt-get install prometheus, or set PROMETHEUS)";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("dashboard: SKIPPED: {why}");
        return None;
    }
    Some(bin)
}

/// A Prometheus server in a scratch directory; stopped by its PID when dropped.
struct Prometheus {
    child: std::process::Child,
    url: String,
    http: reqwest::Client,
}

impl Prometheus {
    /// Starts `bin` scraping `target` every second under `job="steerdns"`, with the
    /// alert rules, and waits until it is ready.
    async fn start(bin: &str, dir: &Path, target: std::net::SocketAddr) -> Prometheus {
        let rules = dir.join("steerdns-alerts.yml");
        std::fs::write(
            &rules,
            minutes_as_seconds(
                &std::fs::read_to_string(repo("deploy/prometheus/steerdns-alerts.yml")).unwrap(),
            ),
        )
        .unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: steerdns\n    static_configs:\n      - targets: [\"{target}\"]\n",
            rules.display()
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        // A free port below the kernel's ephemeral range (an outgoing connection cannot
        // take it between this check and Prometheus binding it).
        let port = common::etcd::free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(bin)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let p = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = p.http.get(format!("{}/-/ready", p.url)).send().await;
            if ready.is_ok_and(|r| r.status() == 200) {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready in 30 s; its log:\n{}",
                std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `GET /api/v1/{path}` with `params`: the `data` of a successful answer.
    async fn api(&self, path: &str, params: &[(&str, String)]) -> Value {
        let mut url = reqwest::Url::parse(&format!("{}/api/v1/{path}", self.url)).unwrap();
        url.query_pairs_mut()
            .extend_pairs(params.iter().map(|(k, v)| (*k, v.as_str())));
        let r = self
            .http
            .get(url)
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let r: Value = serde_json::from_slice(&r).expect("prometheus answers JSON");
        assert_eq!(r["status"], "success", "{path} {params:?}: {r}");
        r["data"].clone()
    }

    /// The instant result of `expr` now.
    async fn query(&self, expr: &str) -> Vec<Value> {
        let data = self.api("query", &[("query", expr.to_string())]).await;
        data["result"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The alert rules with time sped up 60 times: every duration in minutes (`for: 1m`,
/// `[10m]`) read as seconds, so that an alert's `for` and windows pass during a drill.
/// Nothing else changes: the expressions and labels are the shipped ones.
fn minutes_as_seconds(rules: &str) -> String {
    let mut out = String::new();
    let mut rest = rules;
    while let Some(at) = rest.find(|c: char| c.is_ascii_digit()) {
        let digits = rest[at..]
            .find(|c: char| !c.is_ascii_digit())
            .map_or(rest.len(), |n| at + n);
        let after = &rest[digits..];
        let minutes = after.starts_with('m')
            && !after[1..].starts_with(|c: char| c.is_ascii_alphanumeric())
            && (rest[..at].ends_with("for: ") || rest[..at].ends_with('['));
        out.push_str(&rest[..digits]);
        rest = if minutes {
            out.push('s');
            &after[1..]
        } else {
            after
        };
    }
    out.push_str(rest);
    out
}

/// The alerts Prometheus holds now: (alert name, state, labels).
async fn alerts(prom: &Prometheus) -> Vec<(String, String, Value)> {
    let data = prom.api("alerts", &[]).await;
    data["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["labels"]["alertname"].as_str().unwrap().to_string(),
                a["state"].as_str().unwrap().to_string(),
                a["labels"].clone(),
            )
        })
        .collect()
}

/// Waits until `alert` (with `label` = `value`) is firing (`true`) or gone (`false`).
async fn alert_until(prom: &Prometheus, alert: &str, label: (&str, &str), firing: bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = alerts(prom).await;
        let fires = now
            .iter()
            .any(|(n, st, l)| n == alert && st == "firing" && l[label.0] == label.1);
        let present = now
            .iter()
            .any(|(n, _, l)| n == alert && l[label.0] == label.1);
        if (firing && fires) || (!firing && !present) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{alert}{{{}=\"{}\"}} never {}: {now:?}",
            label.0,
            label.1,
            if firing { "fired" } else { "resolved" }
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every (where, query) of the dashboard: each panel target's `expr` and each
/// annotation's.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut panels: Vec<&Value> = dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(p) = panels.pop() {
        if let Some(nested) = p["panels"].as_array() {
            panels.extend(nested);
        }
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().expect("a target with an expr");
            out.push((
                format!("panel {:?} target {}", p["title"], t["refId"]),
                expr.to_string(),
            ));
        }
    }
    for a in dashboard["annotations"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(expr) = a["expr"].as_str() {
            out.push((format!("annotation {:?}", a["name"]), expr.to_string()));
        }
    }
    out
}

/// A query as Grafana sends it with every variable at "All" and a 1 s scrape interval
/// (`$__rate_interval` is then 4 scrape intervals).
fn expand(expr: &str) -> String {
    let q = expr
        .replace("$__rate_interval", "4s")
        .replace("$job", "steerdns")
        .replace("$instance", ".*")
        .replace("$name", ".+");
    assert!(!q.contains('$'), "a variable the test does not know: {q}");
    q
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_data_from_a_real_prometheus_during_a_drill() {
    let Some(bin) = prometheus_bin() else { return };
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo("deploy/grafana/steerdns.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let queries = dashboard_queries(&dashboard);
    let panels = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] != "row")
        .count();
    assert!(panels >= 15 && queries.len() > panels, "{panels} panels");

    // www.example.com: a and b, 50/50; other.example.com: c alone; steps 1 s apart.
    let (stack, _a, _b, c) = healthy_stack("dashboard", "[50, 100]", 1.0).await;
    let prom = Prometheus::start(&bin, &stack.dir, stack.api).await;
    let start = steerdns::clock::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(20);
    // Two scrapes of c up at least, so that its fall is seen as a change.
    let twice = r#"count_over_time(steerdns_cdn_up{cdn="c"}[1m]) >= 2"#;
    let up = r#"steerdns_cdn_up{cdn="c"} == 1"#;
    while prom.query(twice).await.is_empty() || prom.query(up).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "prometheus never scraped c up twice: {:?}",
            prom.query(r#"steerdns_cdn_up{cdn="c"}"#).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Queries flow the whole time: steered and not, from many resolvers; and players
    // ask for steering manifests (and one for a name that is not steered: a 404).
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let (stop, dns, http) = (stop.clone(), stack.dns, stack.http.clone());
        let manifest = format!("http://{}/steer/hls/www.example.com", stack.steering);
        let unknown = format!("http://{}/steer/hls/nope.example.com", stack.steering);
        tokio::spawn(async move {
            let steered = query("www.example.com.", RecordType::A);
            let zone = query("nope.example.com.", RecordType::A);
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                ask_from(dns, resolver(i), Proto::Udp, &steered).await;
                if i % 4 == 0 {
                    ask(dns, Proto::Udp, &zone).await;
                }
                if i % 8 == 0 {
                    let ok = http.get(&manifest).send().await.map(|r| r.status());
                    assert_eq!(ok.ok(), Some(reqwest::StatusCode::OK));
                    let refused = http.get(&unknown).send().await.map(|r| r.status());
                    assert_eq!(refused.ok(), Some(reqwest::StatusCode::NOT_FOUND));
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    // The drill: c fails (a step; other.example.com, with c alone, fails open and
    // stays at that step), a is drained
    // from www.example.com, and the policy is edited (a reload).
    c.set(Mode::Status(503));
    stack
        .wait_for("c stepped out, other.example.com failing open", |s| {
            s["failover"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f["cdn"] == "c"))
                && !s["fail_open"].as_array().unwrap().is_empty()
        })
        .await;
    // The alerts fire from the real series: other.example.com fails open, c demoted.
    alert_until(
        &prom,
        "SteerdnsFailOpen",
        ("name", "other.example.com."),
        true,
    )
    .await;
    alert_until(&prom, "SteerdnsCdnDemoted", ("cdn", "c"), true).await;
    let (status, rule) = stack
        .post(
            "/v1/drains",
            json!({ "name": "www.example.com", "cdn": "a", "reason": "INC-9 drill",
                    "ttl_seconds": 600 }),
        )
        .await;
    assert_eq!(status, 201, "{rule}");
    let policy = stack.dir.join("steering.yaml");
    let text = std::fs::read_to_string(&policy).unwrap();
    std::fs::write(&policy, format!("{text}# edited during the drill\n")).unwrap();
    stack
        .wait_for("the edit applied", |s| last_reload(s).0 == "applied")
        .await;

    // Until Prometheus has seen the drill: a drained to its last step, c out, the
    // reload, fail-open.
    let seen = [
        r#"steerdns_effective_weight{name="www.example.com.",cdn="a"} == 0"#,
        r#"steerdns_failover_removed_percent{name="other.example.com.",cdn="c"} > 0"#,
        r#"steerdns_config_reloads_total{result="applied"} > 0"#,
        r#"steerdns_fail_open{name="other.example.com."} == 1"#,
        r#"steerdns_drains_active{name="www.example.com.",cdn="a"} == 1"#,
    ];
    let deadline = Instant::now() + Duration::from_secs(20);
    for expr in seen {
        while prom.query(expr).await.is_empty() {
            assert!(Instant::now() < deadline, "prometheus never saw {expr}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // A few more scrapes so that every rate has samples on both sides of the drill.
    let scrapes = r#"count_over_time(up{job="steerdns"}[1h])"#;
    let before = prom.query(scrapes).await[0]["value"][1]
        .as_str()
        .unwrap()
        .parse::<f64>()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = prom.query(scrapes).await[0]["value"][1]
            .as_str()
            .unwrap()
            .parse::<f64>()
            .unwrap();
        if now >= before + 3.0 {
            break;
        }
        assert!(Instant::now() < deadline, "scrapes stopped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    traffic.await.unwrap();
    let end = steerdns::clock::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();

    // Every query over the drill, as a Grafana time series panel asks for it.
    let mut empty = Vec::new();
    for (place, expr) in &queries {
        let data = prom
            .api(
                "query_range",
                &[
                    ("query", expand(expr)),
                    ("start", format!("{start:.3}")),
                    ("end", format!("{end:.3}")),
                    ("step", "1".into()),
                ],
            )
            .await;
        let points: usize = data["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                s["values"]
                    .as_array()
                    .map_or(0, |v| v.iter().filter(|p| p[1] != "NaN").count())
            })
            .sum();
        eprintln!("dashboard: {points:5} points  {place}");
        if points == 0 {
            empty.push(format!("{place}: {expr}"));
        }
    }
    assert!(
        empty.is_empty(),
        "queries without data:\n{}",
        empty.join("\n")
    );

    // The main panel shows the drill: a went from 50 % to 0 %, b to 100 %.
    let range = |expr: &str| {
        vec![
            ("query", expr.to_string()),
            ("start", format!("{start:.3}")),
            ("end", format!("{end:.3}")),
            ("step", "1".into()),
        ]
    };
    let shares = prom
        .api(
            "query_range",
            &range(r#"steerdns_effective_weight{name="www.example.com.",cdn="a"}"#),
        )
        .await;
    let values: Vec<f64> = shares["result"][0]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[1].as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(values.first(), Some(&50.0), "{values:?}");
    assert_eq!(values.last(), Some(&0.0), "{values:?}");
    assert!(
        values.iter().any(|v| *v > 0.0 && *v < 50.0),
        "the drain's first step (a at 25 of 75): {values:?}"
    );

    // The alert rules load and evaluate.
    let rules = prom.api("rules", &[]).await;
    let mut n = 0;
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            n += 1;
            assert_eq!(rule["health"], "ok", "{rule:#}");
        }
    }
    assert!(n >= 8, "{n} alert rules loaded");

    // c recovers: both alerts resolve (SteerdnsCdnDemoted once its window of recent
    // demotions, 10 s here, has passed).
    c.set(Mode::Healthy);
    alert_until(
        &prom,
        "SteerdnsFailOpen",
        ("name", "other.example.com."),
        false,
    )
    .await;
    alert_until(&prom, "SteerdnsCdnDemoted", ("cdn", "c"), false).await;
    drop(prom);
    let _ = std::fs::remove_dir_all(&stack.dir);
}
