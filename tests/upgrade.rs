//! Upgrade without loss (issue 39, item 6): a state directory written by an earlier
//! release (`tests/fixtures/upgrade/`, written at commit 115dcc1, see its README) is
//! read by this build's `steerdns serve`, and every decision it holds is in force
//! again: the API's drain overrides, the failover step in progress, the freezes (all
//! failover, and one tenant), the usage ledger and the commit bias, the performance
//! shift. Everything is read back over real sockets (`/v1/state`, DNS) and compared
//! with concrete values of the fixture's `steerdns-state.json`.
//!
//! The fixture is regenerated (only when its format is meant to change, from the
//! release that writes the old format) with
//! `cargo test --release --test upgrade -- --ignored make_fixture`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::mock_cdn::{MockCdn, Mode};
use common::stack::{scratch, unix_ms, up_verdict, Stack};
use common::{ask_from, cname_of, query_edns, repo, resolver, Proto};
use hickory_proto::rr::RecordType;
use serde_json::{json, Value};
use std::os::unix::process::CommandExt;
use tokio::time::Instant;

const FIXTURE: &str = "tests/fixtures/upgrade";
const WEEK_SECONDS: u64 = 7 * 86_400;

/// The policy the fixture was written with. `fast`: the commit's short period used
/// while the fixture is made (so that the bias reaches its limit in seconds); the
/// fixture keeps an hour, so that the bias is not evaluated again during the test:
/// the bias in force after the upgrade is the one restored. (The performance block
/// stays as it is: a reload that changes it starts the region over at its policy
/// weights. Its window of an hour holds the restored shift for an hour after a start,
/// whatever its period.)
fn policy(fast: bool) -> String {
    let commit_period = if fast { 0.2 } else { 3600.0 };
    format!(
        "# The upgrade fixture's policy (tests/upgrade.rs, make_fixture).
hostnames:
  # Failover in progress: a is down, the first of three steps taken.
  www.example.com:
    ttl: 30
    incident_ttl: 5
    tenant: acme
    cdns:
      a: {{ cname: a.cdn.test. }}
      b: {{ cname: b.cdn.test. }}
    regions:
      - match: [\"*\"]
        weights: {{ a: 50, b: 50 }}
    failover:
      steps: [50, 90, 100]
      step_interval_seconds: 3600
  # The API's drains; its tenant is frozen.
  other.example.com:
    ttl: 30
    tenant: globex
    cdns:
      c: {{ cname: c.cdn.test. }}
      d: {{ cname: d.cdn.test. }}
    regions:
      - name: uk
        match: [GB]
        weights: {{ c: 50, d: 50 }}
      - name: us
        match: [US]
        weights: {{ c: 50, d: 50 }}
      - match: [\"*\"]
        weights: {{ c: 50, d: 50 }}
  # Commit steering: fastly behind its commit, its bias raised.
  dl.example.com:
    ttl: 30
    cdns:
      fastly:
        cname: fastly.dl.cdn.test.
        contract: {{ billing: gb_month, commit_gb: 200000, cap_gb: 300000 }}
      cloudflare: {{ cname: cloudflare.dl.cdn.test. }}
    regions:
      - match: [\"*\"]
        weights: {{ fastly: 30, cloudflare: 70 }}
    commit:
      max_shift_points: 10
      shift_period_seconds: {commit_period}
  # Performance steering: fastly slow in GB, shifted to its floor.
  perf.example.com:
    ttl: 30
    cdns:
      fastly: {{ cname: fastly.perf.cdn.test. }}
      cloudflare: {{ cname: cloudflare.perf.cdn.test. }}
    regions:
      - name: gb
        match: [GB, 100.64.0.0/10]
        weights: {{ fastly: 90, cloudflare: 10 }}
        performance:
          metric: ttfb_p75
          band_percent: 10
          floor_percent: 10
          max_shift_points: 10
          shift_period_seconds: 0.3
          window_seconds: 3600
          min_samples: 50
          min_networks: 5
      - match: [\"*\"]
        weights: {{ fastly: 50, cloudflare: 50 }}
"
    )
}

/// Player `i`'s address: one per /24 of 100.64.0.0/10 (the GB region).
fn player(i: u32) -> String {
    format!("100.{}.{}.7", 64 + i / 256, i % 256)
}

fn beacon(ticket: &str, fastly_ms: u64, cloudflare_ms: u64) -> String {
    format!(
        r#"{{"ticket":"{ticket}","samples":[{{"cdn":"fastly","ttfb_ms":{fastly_ms},"ok":true}},{{"cdn":"fastly","ttfb_ms":{fastly_ms}}},{{"cdn":"cloudflare","ttfb_ms":{cloudflare_ms},"ok":true}},{{"cdn":"cloudflare","ttfb_ms":{cloudflare_ms}}}]}}"#
    )
}

/// Fastly's usage: 300 Mbit/s over each five-minute slot of the last day (as in
/// tests/commit.rs): a projection far below its commit, so its bias rises.
fn usage_records(now: u64) -> Value {
    let last = now / 300_000 * 300_000;
    Value::Array(
        (1..=288u64)
            .rev()
            .map(|i| {
                let t = std::time::UNIX_EPOCH + Duration::from_millis(last - i * 300_000);
                json!({"cdn": "fastly", "start": humantime::format_rfc3339_seconds(t).to_string(), "seconds": 300, "mbps": 300})
            })
            .collect(),
    )
}

fn find(list: &Value, pred: impl Fn(&Value) -> bool) -> &Value {
    list.as_array()
        .and_then(|a| a.iter().find(|v| pred(v)))
        .unwrap_or(&Value::Null)
}

/// `/v1/state`'s commit view of (name, cdn).
fn commit_view<'a>(s: &'a Value, name: &str, cdn: &str) -> &'a Value {
    find(&s["commit"], |c| c["name"] == name && c["cdn"] == cdn)
}

/// `/v1/state`'s performance view of CDN `cdn` in region `region` of `name`.
fn perf_view<'a>(s: &'a Value, name: &str, region: &str, cdn: &str) -> &'a Value {
    let r = find(&s["performance"], |r| {
        r["name"] == name && r["region"] == region
    });
    find(&r["cdns"], |c| c["cdn"] == cdn)
}

/// Writes the fixture: a single node (no etcd) of this build, driven over its API
/// until every lever is in force, stopped, and its directory copied to
/// tests/fixtures/upgrade/. Run by hand (see the module's comment), never in CI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes tests/fixtures/upgrade/; run by hand with the release that writes the fixture's format"]
async fn make_fixture() {
    let dir = scratch("upgrade-make");
    std::fs::write(dir.join("steering.yaml"), policy(true)).unwrap();
    let a = MockCdn::start(Mode::Healthy).await;
    // Only a is probed: its failure is the failover in progress.
    common::stack::probe(&dir, "a", &a.url("/_health/v1.txt"), 1);
    let s = Stack::start(&dir).await;
    s.wait_for("a up", |st| up_verdict(st, "a")).await;

    // Tenant globex frozen, then its name drained twice by the API.
    let (st, body) = s
        .post(
            "/v1/failover/freeze",
            json!({"reason": "CHG-77 globex origin migration", "tenant": "globex"}),
        )
        .await;
    assert_eq!(st, 200, "{body}");
    let (st, body) = s
        .post(
            "/v1/drains",
            json!({"name": "other.example.com", "cdn": "c", "where": ["us"], "reason": "INC-4121 c packet loss in the US", "ttl_seconds": WEEK_SECONDS, "immediate": true}),
        )
        .await;
    assert_eq!(st, 201, "{body}");
    let (st, body) = s
        .post(
            "/v1/drains",
            json!({"name": "other.example.com", "cdn": "d", "where": ["uk"], "reason": "CHG-78 d contract ends in the UK", "immediate": true}),
        )
        .await;
    assert_eq!(st, 201, "{body}");

    // a fails: the first step (50 %) at once, two more to go an hour apart.
    a.set(Mode::Status(503));
    s.wait_for("a's first step", |st| {
        common::stack::removed(st, "a") == Some(50)
    })
    .await;

    // A day of fastly's usage: its bias rises to the limit.
    let (st, body) = s.post("/v1/usage", usage_records(unix_ms())).await;
    assert_eq!(st, 200, "{body}");
    s.wait_for("fastly's bias at its limit", |st| {
        commit_view(st, "dl.example.com.", "fastly")["bias_points"].as_f64() == Some(30.0)
    })
    .await;

    // Players in GB find fastly slow: its share falls to the floor.
    let conditions = Arc::new(Mutex::new(true));
    let (http, steering, go) = (s.http.clone(), s.steering, conditions.clone());
    let mut tickets = Vec::new();
    for i in 0..30 {
        tickets.push(s.ticket("perf.example.com", &player(i)).await);
    }
    let feeder = tokio::spawn(async move {
        while *go.lock().unwrap() {
            for i in 0..30 {
                let r = http
                    .post(format!("http://{steering}/rum/perf.example.com"))
                    .header("x-forwarded-for", player(i))
                    .header("content-type", "application/json")
                    .body(beacon(&tickets[i as usize], 300, 80))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 204);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = s.state().await;
        let f = perf_view(&st, "perf.example.com.", "gb", "fastly");
        if f["share"].as_f64() == Some(10.0) && f["reason"] == "perf_floor" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no shift: {:#}",
            st["performance"]
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    *conditions.lock().unwrap() = false;
    feeder.await.unwrap();

    // All failover frozen (a's step stays where it is).
    let (st, body) = s
        .post(
            "/v1/failover/freeze",
            json!({"reason": "INC-4122 prober false positives under investigation"}),
        )
        .await;
    assert_eq!(st, 200, "{body}");

    // The slow periods of the fixture's policy; then every lever still in force.
    std::fs::write(dir.join("steering.yaml.new"), policy(false)).unwrap();
    let version = s.state().await["config_version"].clone();
    std::fs::rename(dir.join("steering.yaml.new"), dir.join("steering.yaml")).unwrap();
    let st = s
        .wait_for("the slow policy applied", |st| {
            common::stack::last_reload(st).0 == "applied" && st["config_version"] != version
        })
        .await;
    assert_eq!(common::stack::removed(&st, "a"), Some(50), "{st:#}");
    assert_eq!(
        commit_view(&st, "dl.example.com.", "fastly")["bias_points"].as_f64(),
        Some(30.0),
        "{st:#}"
    );
    assert_eq!(
        perf_view(&st, "perf.example.com.", "gb", "fastly")["share"].as_f64(),
        Some(10.0),
        "{st:#}"
    );
    assert_eq!(st["drains"].as_array().map(Vec::len), Some(2), "{st:#}");
    s.stop().await;

    let out = repo(FIXTURE);
    let _ = std::fs::remove_dir_all(out.join("state"));
    let _ = std::fs::remove_dir_all(out.join("probes"));
    std::fs::create_dir_all(out.join("state")).unwrap();
    std::fs::create_dir_all(out.join("probes")).unwrap();
    std::fs::copy(dir.join("steering.yaml"), out.join("steering.yaml")).unwrap();
    std::fs::copy(dir.join("probes/a.yaml"), out.join("probes/a.yaml")).unwrap();
    // The state file only: the audit log and the DNS cookie secret are not decisions.
    std::fs::copy(
        dir.join("state/steerdns-state.json"),
        out.join("state/steerdns-state.json"),
    )
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The server of the upgrade: this build's binary, under `faketime`, stopped (its
/// process group: `faketime` forks steerdns as its child) by its PID when dropped.
struct Upgraded(Child);

impl Drop for Upgraded {
    fn drop(&mut self) {
        let group = i32::try_from(self.0.id()).expect("a PID fits in i32");
        // SAFETY: kill(2) with a negative PID signals that process group; no memory
        // is touched.
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// The fixture's files in a scratch directory (the zones and the geo database are the
/// tests' usual ones, which `scratch` copies).
fn copy_fixture(tag: &str) -> PathBuf {
    let dir = scratch(tag);
    let from = repo(FIXTURE);
    std::fs::create_dir_all(dir.join("state")).unwrap();
    for f in [
        "steering.yaml",
        "probes/a.yaml",
        "state/steerdns-state.json",
    ] {
        std::fs::copy(from.join(f), dir.join(f)).unwrap();
    }
    dir
}

fn fixture_state() -> Value {
    let path = repo(FIXTURE).join("state/steerdns-state.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

async fn get_state(http: &reqwest::Client, api: &str) -> Option<Value> {
    let r = http
        .get(format!("http://{api}/v1/state"))
        .send()
        .await
        .ok()?;
    serde_json::from_str(&r.text().await.ok()?).ok()
}

/// The CNAMEs answered for `name` to a client of `subnet`, each query through another
/// resolver (ECS).
async fn cnames(
    dns: std::net::SocketAddr,
    name: &str,
    subnet: (&str, u8),
    n: usize,
) -> Vec<String> {
    let q = query_edns(name, RecordType::A, Some(subnet));
    let mut out = Vec::new();
    for i in 0..n {
        out.push(cname_of(&ask_from(dns, resolver(i), Proto::Udp, &q).await));
    }
    out.sort();
    out.dedup();
    out
}

/// The upgrade: the fixture's state directory, written by 115dcc1, read by this build.
///
/// A saved state is restored only when younger than `--state-max-age-seconds` (900
/// s), and it holds wall-clock times (the drains' ends, the month of the usage ledger,
/// the evaluations' times). Neither the fixture nor the age limit is changed: the new
/// binary runs under `faketime` with its wall clock set to a second after the fixture
/// was saved (the monotonic clock is left alone), as if it had been started a second
/// after the old release stopped. Every time in the fixture then means what it meant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_directory_of_the_previous_release_is_in_force_after_the_upgrade() {
    if !common::etcd::have("faketime") {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("faketime is required in CI (apt-get install -y faketime)");
        }
        eprintln!("SKIPPED: faketime not installed (apt-get install -y faketime)");
        return;
    }
    let saved = fixture_state();
    let dir = copy_fixture("upgrade");
    let saved_ms = saved["saved_unix_ms"].as_u64().unwrap();
    let offset_s = (saved_ms / 1000 + 1) as i64 - (unix_ms() / 1000) as i64;
    let (dns, api) = (common::etcd::free_port(), common::etcd::free_port());
    let api = format!("127.0.0.1:{api}");
    let log = dir.join("serve.log");
    let child = Command::new("faketime")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .args(["-f", &format!("{offset_s:+}s"), common::BIN, "serve"])
        .args(common::stack::stack_inputs(&dir))
        .args(["--listen", &format!("127.0.0.1:{dns}"), "--api", &api])
        .args(["--steering-http", "off", "--node", "test"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .process_group(0)
        .spawn()
        .expect("faketime steerdns starts");
    let _server = Upgraded(child);
    let dns: std::net::SocketAddr = format!("127.0.0.1:{dns}").parse().unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let logged = |log: &Path| std::fs::read_to_string(log).unwrap_or_default();

    // Serving, and its prober has judged a again (still down: its mock is gone).
    let deadline = Instant::now() + Duration::from_secs(20);
    let s = loop {
        if let Some(s) = get_state(&http, &api).await {
            if s["health"]["a"]["verdicts"]["down"].as_u64() >= Some(1) {
                break s;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the upgraded server never answered with a's verdict:\n{}",
            logged(&log)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let ctx = format!("state after the upgrade:\n{s:#}\nlog:\n{}", logged(&log));
    assert!(
        logged(&log).contains("restored health and failover state"),
        "{ctx}"
    );

    // Freezes: all failover, and tenant globex, with their reasons.
    assert_eq!(
        s["failover_frozen"].as_str(),
        Some("INC-4122 prober false positives under investigation"),
        "{ctx}"
    );
    assert_eq!(s["failover_frozen"], saved["frozen"], "{ctx}");
    assert_eq!(
        s["failover_frozen_tenants"],
        json!({"globex": "CHG-77 globex origin migration"}),
        "{ctx}"
    );
    assert_eq!(
        s["failover_frozen_tenants"], saved["frozen_tenants"],
        "{ctx}"
    );

    // Drains: the API's two overrides, ids, names, CDNs, scopes, reasons, ends and
    // authors as saved, fully in force.
    let overrides = saved["overrides"].as_array().unwrap();
    assert_eq!(overrides.len(), 2, "the fixture's overrides");
    let drains = s["drains"].as_array().expect("drains");
    assert_eq!(drains.len(), overrides.len(), "{ctx}");
    for o in overrides {
        let d = find(&s["drains"], |d| d["id"] == o["id"]);
        let got = (
            &d["name"],
            &d["cdn"],
            &d["where"],
            &d["reason"],
            &d["until_unix_ms"],
            &d["author"],
            &d["immediate"],
            &d["removed_percent"],
        );
        let want = (
            &o["name"],
            &o["cdn"],
            &o["scope"],
            &o["reason"],
            &o["until_unix_ms"],
            &o["author"],
            &o["immediate"],
            &json!(100),
        );
        assert_eq!(got, want, "drain {}: {ctx}", o["id"]);
    }
    let week = find(&s["drains"], |d| d["cdn"] == "c");
    assert_eq!(week["reason"], "INC-4121 c packet loss in the US");
    assert_eq!(
        week["until_unix_ms"].as_u64(),
        Some(1_797_043_934_107),
        "{ctx}"
    );
    let two_hours = find(&s["drains"], |d| d["cdn"] == "d");
    assert_eq!(two_hours["id"], "api-1796439134108-2", "{ctx}");
    assert_eq!(
        two_hours["until_unix_ms"].as_u64(),
        Some(1_796_446_334_108),
        "{ctx}"
    );
    // Over DNS (the test database's US and GB networks, as in tests/drains.rs): US
    // clients of other.example.com get d only, UK clients c only.
    assert_eq!(
        cnames(dns, "other.example.com.", ("216.160.83.56", 29), 40).await,
        ["d.cdn.test."],
        "{ctx}"
    );
    assert_eq!(
        cnames(dns, "other.example.com.", ("2.125.160.216", 29), 40).await,
        ["c.cdn.test."],
        "{ctx}"
    );

    // Failover: a still down, www.example.com's first step of three (50 % of a's
    // share removed), still being demoted; and nothing else stepping.
    assert_eq!(s["health"]["a"]["state"], "down", "{ctx}");
    assert_eq!(s["health"]["a"]["state"], saved["health"]["a"]["state"]);
    let steps = saved["steps"].as_array().unwrap();
    assert_eq!(
        steps
            .iter()
            .map(|st| (&st["name"], &st["cdn"], &st["level"], &st["direction"]))
            .collect::<Vec<_>>(),
        [(
            &json!("www.example.com."),
            &json!("a"),
            &json!(1),
            &json!("demote")
        )],
        "the fixture's steps"
    );
    let failover: Vec<_> = s["failover"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].clone(),
                f["cdn"].clone(),
                f["removed_percent"].clone(),
                f["direction"].clone(),
            )
        })
        .collect();
    // Level 1 of `steps: [50, 90, 100]`.
    assert_eq!(
        failover,
        [(
            json!("www.example.com."),
            json!("a"),
            json!(50),
            json!("demote")
        )],
        "{ctx}"
    );

    // Commit: the ledger's month to date, and the biases, as saved.
    let month = steerdns::control::modifiers::commit::month::Month::of(saved_ms);
    let ledger = saved["commit"]["ledger"]["cdns"]["fastly"]
        .as_object()
        .unwrap();
    assert_eq!(ledger.len(), 288, "the fixture's ledger: a day of slots");
    let month_bytes: f64 = ledger
        .iter()
        .filter(|(start, _)| start.parse::<u64>().unwrap() >= month.start_ms)
        .map(|(_, r)| r["bytes"].as_f64().unwrap())
        .sum();
    assert_eq!(
        month_bytes, 3_240_000_000_000.0,
        "the fixture's month to date"
    );
    let fastly = commit_view(&s, "dl.example.com.", "fastly");
    assert_eq!(
        fastly["month_to_date_bytes"].as_f64(),
        Some(month_bytes),
        "{ctx}"
    );
    assert_eq!(fastly["rate_mbps"].as_f64(), Some(300.0), "{ctx}");
    let biases = saved["commit"]["biases"]["dl.example.com."]
        .as_object()
        .unwrap();
    assert_eq!(biases["fastly"]["points"].as_f64(), Some(30.0));
    for (cdn, b) in biases {
        let v = commit_view(&s, "dl.example.com.", cdn);
        assert_eq!(
            (&v["bias_points"], &v["reason"], &v["floored"]),
            (&b["points"], &b["reason"], &b["floored"]),
            "{cdn}'s bias: {ctx}"
        );
    }
    // The bias in force over DNS: fastly's 30 % plus 30 points (the fixture's view
    // said `share: 60`; `/v1/state`'s share is the last evaluation's, and none has run
    // since the start, so it is not compared here).
    let q = query_edns("dl.example.com.", RecordType::A, None);
    let n = 400;
    let mut on_fastly = 0;
    for i in 0..n {
        if cname_of(&ask_from(dns, resolver(i), Proto::Udp, &q).await) == "fastly.dl.cdn.test." {
            on_fastly += 1;
        }
    }
    common::assert_share(
        on_fastly,
        n,
        0.6,
        "fastly's share of dl.example.com with its bias",
    );

    // Performance: GB's shift to fastly's floor, every CDN's share, target and reason.
    let shifts = saved["performance"].as_array().unwrap();
    assert_eq!(shifts.len(), 1, "the fixture's shifts");
    let e = &shifts[0]["evaluation"];
    assert_eq!(
        e["cdns"][0],
        json!(["fastly", 10.0, 10.0, "perf_floor"]),
        "the fixture's shift"
    );
    for c in e["cdns"].as_array().unwrap() {
        let v = perf_view(
            &s,
            e["name"].as_str().unwrap(),
            e["region_name"].as_str().unwrap(),
            c[0].as_str().unwrap(),
        );
        assert_eq!(
            (&v["share"], &v["target_share"], &v["reason"]),
            (&c[1], &c[2], &c[3]),
            "{}: {ctx}",
            c[0]
        );
    }
    // Over DNS: GB clients of perf.example.com get fastly 10 % of the time (the
    // policy's 90 % without the shift).
    let q = query_edns(
        "perf.example.com.",
        RecordType::A,
        Some(("2.125.160.216", 29)),
    );
    let mut on_fastly = 0;
    for i in 0..n {
        if cname_of(&ask_from(dns, resolver(i), Proto::Udp, &q).await) == "fastly.perf.cdn.test." {
            on_fastly += 1;
        }
    }
    common::assert_share(
        on_fastly,
        n,
        0.1,
        "fastly's share of perf.example.com in GB",
    );
    drop(_server);
    let _ = std::fs::remove_dir_all(&dir);
}
