//! `steerdns diff OLD NEW`, the real binary on the demo policy and the shipped geo
//! database: the shares and the networks whose answer changes, the exit codes, the
//! JSON, names, CDNs and settings changed; and the networks it names answered by real
//! servers (OLD and NEW) over DNS as it says.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use hickory_proto::rr::RecordType;

const GB_REGION: &str = "GB,IE,DE,FR,NL,ES,IT";
const GB_WEIGHTS: &str = "weights: { fastly: 90, cloudflare: 10 }";

/// A scratch directory holding a copy of the demo policy as `steering.yaml`.
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("steerdns-diff-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(repo(DEMO_POLICY), dir.join("steering.yaml")).unwrap();
    dir
}

/// The demo policy copied to `dir/name`, with `from` replaced by `to` (`from` empty:
/// the copy unchanged).
fn edited(dir: &Path, name: &str, from: &str, to: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::copy(dir.join("steering.yaml"), &path).unwrap();
    if !from.is_empty() {
        edit(&path, from, to);
    }
    path
}

/// `steerdns diff OLD NEW ARGS` in `dir`, against the demo's zones and probes and the
/// shipped geo database.
fn diff(dir: &Path, old: &str, new: &str, args: &[&str]) -> std::process::Output {
    steerdns(&["diff", old, new])
        .args(args)
        .current_dir(dir)
        .args(["--zones", repo("zones").to_str().unwrap()])
        .args(["--probes", repo("probes").to_str().unwrap()])
        .args(["--geo", repo("geo/country.mmdb").to_str().unwrap()])
        .output()
        .unwrap()
}

/// The percent after `what` in `line` (`… IPv4 80.1 % (…`).
fn percent_after(line: &str, what: &str) -> f64 {
    let rest = &line[line
        .find(what)
        .unwrap_or_else(|| panic!("{what:?} in {line}"))
        + what.len()..];
    rest.split(" %").next().unwrap().trim().parse().unwrap()
}

#[test]
fn a_gb_90_10_to_10_90_edit_changes_about_80_percent_of_gb_and_exits_1() {
    let dir = scratch("gb");
    edited(
        &dir,
        "edited.yaml",
        GB_WEIGHTS,
        "weights: { fastly: 10, cloudflare: 90 }",
    );
    let started = std::time::Instant::now();
    let out = diff(&dir, "steering.yaml", "edited.yaml", &[]);
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{}", printed(&out));
    let gb = text
        .lines()
        .find(|l| l.contains(&format!("region {GB_REGION}:")))
        .unwrap_or_else(|| panic!("no GB line:\n{text}"));
    assert!(
        gb.contains("fastly 90 % → 10 %, cloudflare 10 % → 90 %"),
        "{gb}"
    );
    let v4 = percent_after(gb, "IPv4 ");
    let v6 = percent_after(gb, "IPv6 ");
    assert!((70.0..=90.0).contains(&v4), "IPv4 {v4}: {gb}");
    assert!((70.0..=90.0).contains(&v6), "IPv6 {v6}: {gb}");
    // The other regions keep every answer.
    for region in ["US,CA,MX", "AU,NZ,SG,JP", "default"] {
        let line = text
            .lines()
            .find(|l| l.contains(&format!("region {region}:")))
            .unwrap_or_else(|| panic!("no {region} line:\n{text}"));
        assert!(line.contains("IPv4 0 % (0 of "), "{line}");
        assert!(line.contains("IPv6 0 % (0 of "), "{line}");
    }
    assert!(text.trim_end().ends_with("answers change"), "{text}");
    eprintln!("{gb}\n(diff took {took:?})");
}

#[test]
fn an_identical_copy_exits_0_and_says_every_answer_is_alike() {
    let dir = scratch("same");
    edited(&dir, "copy.yaml", "", "");
    let out = diff(&dir, "steering.yaml", "copy.yaml", &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", printed(&out));
    assert!(text.trim_end().ends_with("every answer alike"), "{text}");
    let gb = text
        .lines()
        .find(|l| l.contains(&format!("region {GB_REGION}:")))
        .unwrap();
    assert!(gb.contains("fastly 90 %, cloudflare 10 %"), "{gb}");
    assert!(gb.contains("IPv4 0 % (0 of "), "{gb}");
}

#[test]
fn a_broken_new_policy_exits_2_naming_file_line_and_field() {
    let dir = scratch("broken");
    edited(
        &dir,
        "edited.yaml",
        "weights: { fastly: 85, cloudflare: 15 }",
        "weights: { fastly: 85, akamai: 15 }",
    );
    let out = diff(&dir, "steering.yaml", "edited.yaml", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}", printed(&out));
    assert!(
        stderr.contains("edited.yaml:12: regions[1].weights.akamai: unknown CDN `akamai`"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "{}", printed(&out));
    // A missing OLD is an error too, not a difference.
    let out = diff(&dir, "missing.yaml", "steering.yaml", &[]);
    assert_eq!(out.status.code(), Some(2), "{}", printed(&out));
}

#[test]
fn json_has_the_per_region_figures() {
    let dir = scratch("json");
    edited(
        &dir,
        "edited.yaml",
        GB_WEIGHTS,
        "weights: { fastly: 10, cloudflare: 90 }",
    );
    let out = diff(&dir, "steering.yaml", "edited.yaml", &["--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", printed(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["changes_answers"], true);
    assert_eq!(doc["resolver"], "127.0.0.1");
    let name = &doc["names"][0];
    assert_eq!(name["name"], "www.example.com.");
    let regions = name["regions"].as_array().unwrap();
    assert_eq!(regions.len(), 4, "{name}");
    let gb = &regions[0];
    assert_eq!(gb["region"], GB_REGION);
    assert_eq!(gb["presence"], "both");
    let share = |cdn: &str, when: &str| {
        gb["shares"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["cdn"] == cdn)
            .unwrap()[when]
            .as_f64()
            .unwrap()
    };
    assert_eq!(
        [
            share("fastly", "before"),
            share("fastly", "after"),
            share("cloudflare", "before"),
            share("cloudflare", "after")
        ],
        [90.0, 10.0, 10.0, 90.0]
    );
    for family in ["ipv4", "ipv6"] {
        let f = &gb[family];
        let pct = f["changed_percent"].as_f64().unwrap();
        assert!((70.0..=90.0).contains(&pct), "{family}: {f}");
        let (n, changed) = (
            f["networks"].as_u64().unwrap(),
            f["changed_networks"].as_u64().unwrap(),
        );
        assert!(n > 1000 && changed > n / 2 && changed < n, "{family}: {f}");
    }
    for r in &regions[1..] {
        assert_eq!(r["ipv4"]["changed_networks"], 0, "{r}");
        assert_eq!(r["ipv6"]["changed_networks"], 0, "{r}");
        assert!(r["ipv4"]["networks"].as_u64().unwrap() > 0, "{r}");
    }
    // The name's totals hold the GB region's changes alone.
    assert_eq!(
        name["ipv4"]["changed_networks"],
        gb["ipv4"]["changed_networks"]
    );
}

#[test]
fn names_cdns_and_settings_changed_are_reported() {
    let dir = scratch("names");
    let two = dir.join("two.yaml");
    std::fs::write(
        &two,
        "hostnames:
  www.example.com:
    ttl: 60
    cdns:
      fastly:     { cname: example.map.fastly.net. }
      cloudflare: { cname: example.cdn.cloudflare.net. }
      akamai:     { cname: example.edgesuite.net. }
    regions:
      - match: [GB, IE, DE, FR, NL, ES, IT]
        weights: { fastly: 90, cloudflare: 10 }
      - match: [US, CA, MX]
        weights: { fastly: 85, cloudflare: 15 }
      - match: [AU, NZ, SG, JP]
        weights: { cloudflare: 90, fastly: 10 }
      - match: [\"*\"]
        weights: { fastly: 50, cloudflare: 50 }
    failover:
      steps: [50, 100]
      step_interval_seconds: 90
  cdn.example.com:
    ttl: 30
    cdns:
      fastly: { cname: example.map.fastly.net. }
    regions:
      - match: [\"*\"]
        weights: { fastly: 1 }
",
    )
    .unwrap();
    let out = diff(&dir, "steering.yaml", "two.yaml", &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{}", printed(&out));
    assert!(text.contains("name added: cdn.example.com."), "{text}");
    assert!(text.contains("  ttl: 30 → 60"), "{text}");
    assert!(text.contains("  cdn added: akamai"), "{text}");
    // akamai has no weight anywhere: no network changes, the TTL alone does.
    assert!(
        text.contains("www.example.com.: answers change: IPv4 0 % (0 of "),
        "{text}"
    );
    let out = diff(&dir, "two.yaml", "steering.yaml", &["--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", printed(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        doc["names_removed"],
        serde_json::json!(["cdn.example.com."])
    );
    assert_eq!(doc["names_added"], serde_json::json!([]));
    let www = &doc["names"][0];
    assert_eq!(www["cdns_removed"], serde_json::json!(["akamai"]));
    let ttl = www["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["field"] == "ttl")
        .unwrap_or_else(|| panic!("{www}"));
    assert_eq!(
        (&ttl["before"], &ttl["after"], &ttl["changes_answers"]),
        (&"60".into(), &"30".into(), &true.into())
    );

    // A failover setting alone is reported, and every answer stays.
    edited(
        &dir,
        "steps.yaml",
        "steps: [50, 100]",
        "steps: [25, 50, 100]",
    );
    let out = diff(&dir, "steering.yaml", "steps.yaml", &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", printed(&out));
    assert!(
        text.contains("  failover.steps: [50, 100] → [25, 50, 100]"),
        "{text}"
    );
}

/// The networks `diff` names as examples get, over DNS from real servers serving OLD
/// and NEW, the CDN it says, before and after: its figures are what dig sees.
#[tokio::test]
async fn the_networks_it_names_answer_over_dns_as_it_says() {
    let dir = scratch("dns");
    let new = edited(
        &dir,
        "edited.yaml",
        GB_WEIGHTS,
        "weights: { fastly: 10, cloudflare: 90 }",
    );
    let old_server =
        TestServer::start(DEMO_POLICY, "zones", "geo/country.mmdb", "127.0.0.1:0").await;
    let new_server = TestServer::start(
        new.to_str().unwrap(),
        "zones",
        "geo/country.mmdb",
        "127.0.0.1:0",
    )
    .await;
    let cname_of_cdn = |cdn: &str| match cdn {
        "fastly" => FASTLY,
        "cloudflare" => CLOUDFLARE,
        other => panic!("{other}"),
    };
    // A network whose selection window ends between the diff and the queries gets a
    // new draw: once in a great while; then the whole check is made again.
    let mut mismatches = Vec::new();
    for _attempt in 0..2 {
        let out = diff(&dir, "steering.yaml", "edited.yaml", &["--json"]);
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        mismatches.clear();
        let mut checked = (0, 0);
        for region in doc["names"][0]["regions"].as_array().unwrap() {
            for e in region["examples"].as_array().unwrap() {
                let (net, prefix) = e["network"].as_str().unwrap().split_once('/').unwrap();
                let q = query_edns(
                    "www.example.com.",
                    RecordType::A,
                    Some((net, prefix.parse().unwrap())),
                );
                let before = old_server.cname(Proto::Udp, &q).await;
                let after = new_server.cname(Proto::Udp, &q).await;
                let want = (
                    cname_of_cdn(e["before"].as_str().unwrap()),
                    cname_of_cdn(e["after"].as_str().unwrap()),
                );
                if (before.as_str(), after.as_str()) != want {
                    mismatches.push(format!("{e}: served {before} → {after}"));
                }
                if e["changed"] == true {
                    checked.0 += 1;
                } else {
                    checked.1 += 1;
                }
            }
        }
        // Changed ones in GB, kept ones in every region.
        assert!(checked.0 >= 3 && checked.1 >= 4 * 3, "{checked:?}");
        if mismatches.is_empty() {
            return;
        }
    }
    panic!(
        "answers over DNS differ from diff's:\n{}",
        mismatches.join("\n")
    );
}

/// A drain written into NEW counts at its last step (where the edit leads), not at the
/// first step a server would take at once.
#[test]
fn a_drain_in_the_policy_counts_at_its_last_step() {
    let dir = scratch("drain");
    let drained = dir.join("drained.yaml");
    let text = std::fs::read_to_string(dir.join("steering.yaml")).unwrap();
    std::fs::write(
        &drained,
        format!(
            "{text}drain:\n  - cdn: fastly\n    where: [\"{GB_REGION}\"]\n    reason: \"INC-1 fastly LHR 503s\"\n"
        ),
    )
    .unwrap();
    let out = diff(&dir, "steering.yaml", "drained.yaml", &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{}", printed(&out));
    assert!(
        text.contains(&format!("  drain: none → fastly ({GB_REGION})")),
        "{text}"
    );
    let gb = text
        .lines()
        .find(|l| l.contains(&format!("region {GB_REGION}:")))
        .unwrap();
    assert!(
        gb.contains("fastly 90 % → 0 %, cloudflare 10 % → 100 %"),
        "{gb}"
    );
    let v4 = percent_after(gb, "IPv4 ");
    assert!((80.0..=97.0).contains(&v4), "IPv4 {v4}: {gb}");
}

/// OLD for the recorded-traffic test: GB and IE in one region that records beacon
/// samples (`performance:`, a window of ten minutes and too few samples to shift).
const TRAFFIC_OLD: &str = "hostname: www.example.com
ttl: 30
cdns:
  fastly: { cname: fastly.cdn.test. }
  cloudflare: { cname: cloudflare.cdn.test. }
regions:
  - name: europe
    match: [GB, IE]
    weights: { fastly: 90, cloudflare: 10 }
    performance:
      metric: ttfb_p75
      window_seconds: 600
      shift_period_seconds: 600
      min_samples: 400
  - name: default
    match: [\"*\"]
    weights: { fastly: 50, cloudflare: 50 }
";

/// A beacon measuring both CDNs twice: four samples.
fn four_samples(ticket: &str) -> String {
    format!(
        r#"{{"ticket":"{ticket}","samples":[{{"cdn":"fastly","ttfb_ms":80,"ok":true}},{{"cdn":"fastly","ttfb_ms":90}},{{"cdn":"cloudflare","ttfb_ms":85,"ok":true}},{{"cdn":"cloudflare","ttfb_ms":95}}]}}"#
    )
}

/// The traffic figures of the region called `name` in a `--json` diff: (samples,
/// changed samples, percent changed).
fn traffic_of(doc: &serde_json::Value, name: &str) -> (u64, u64, Option<f64>) {
    let r = doc["names"][0]["regions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["region"] == name)
        .unwrap_or_else(|| panic!("no region {name}: {doc}"));
    (
        r["traffic_samples"].as_u64().unwrap(),
        r["traffic_changed_samples"].as_u64().unwrap(),
        r["traffic_changed_percent"].as_f64(),
    )
}

/// Beacons posted to a real server (`serve` in-process, `--steering-http`) from four
/// networks of the region, three of them Irish, and saved by it in its state
/// directory: an edit that sends Ireland to cloudflare changes a few percent of the
/// region's address space but half of its recorded traffic (the Irish networks hold
/// half the samples), and all of Ireland's.
#[tokio::test(flavor = "multi_thread")]
async fn recorded_beacon_traffic_weighs_the_networks_whose_answer_changes() {
    let dir = common::stack::scratch("diff-traffic");
    std::fs::copy(repo("geo/country.mmdb"), dir.join("geo.mmdb")).unwrap();
    std::fs::write(dir.join("steering.yaml"), TRAFFIC_OLD).unwrap();
    let new = TRAFFIC_OLD.replace("match: [GB, IE]", "match: [GB]").replace(
        "  - name: default",
        "  - name: ie\n    match: [IE]\n    weights: { fastly: 0, cloudflare: 100 }\n  - name: default",
    );
    std::fs::write(dir.join("edited.yaml"), new).unwrap();
    let run = |args: &[&str]| {
        steerdns(&["diff", "steering.yaml", "edited.yaml", "--json"])
            .args(args)
            .args([
                "--zones", "zones", "--probes", "probes", "--geo", "geo.mmdb",
            ])
            .current_dir(&dir)
            .output()
            .unwrap()
    };

    // No state directory yet: address space alone, and said so.
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", printed(&out));
    let before: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(before["traffic"]["file"].is_null(), "{}", before["traffic"]);
    assert_eq!(traffic_of(&before, "europe"), (0, 0, None));
    // The networks to post from, as the diff names them: Irish networks whose answer
    // changes (fastly → cloudflare), and one that keeps fastly (so not Irish).
    let examples = |region: &str| -> Vec<serde_json::Value> {
        before["names"][0]["regions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["region"] == region)
            .unwrap()["examples"]
            .as_array()
            .unwrap()
            .clone()
    };
    let irish: Vec<String> = examples("ie")
        .iter()
        .filter(|e| e["changed"] == true && e["network"].as_str().unwrap().ends_with("/24"))
        .map(|e| e["network"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(irish.len(), 3, "{:?}", examples("ie"));
    let kept = examples("europe")
        .iter()
        .find(|e| {
            e["changed"] == false
                && e["before"] == "fastly"
                && e["network"].as_str().unwrap().ends_with("/24")
        })
        .map(|e| e["network"].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("a network keeping fastly: {:?}", examples("europe")));
    let client = |net: &str| format!("{}.7", net.rsplit_once('.').unwrap().0);
    // (Each network is drawn again when its hourly selection window ends, at a time
    // of its own: one of these four doing so in the seconds between this diff and the
    // last one, and changing its draw, would fail the test; about once in a thousand
    // runs.)

    let s = common::stack::Stack::start(&dir).await;
    // The server serving OLD answers them with fastly, as the diff says.
    for net in irish.iter().chain([&kept]) {
        let (addr, _) = net.split_once('/').unwrap();
        let q = query_edns("www.example.com.", RecordType::A, Some((addr, 24)));
        let answer = cname_of(&ask(s.dns, Proto::Udp, &q).await);
        assert_eq!(answer, "fastly.cdn.test.", "{net}");
    }
    // One beacon from each Irish network, three from the kept one: 12 samples each way.
    let beacons = irish.iter().map(|n| (n, 1)).chain([(&kept, 3)]);
    for (net, count) in beacons {
        let ticket = s.ticket("www.example.com", &client(net)).await;
        for _ in 0..count {
            let r = s
                .http
                .post(format!("http://{}/rum/www.example.com", s.steering))
                .header("x-forwarded-for", client(net))
                .header("content-type", "application/json")
                .body(four_samples(&ticket))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 204, "{net}");
        }
    }
    // Saved each bucket width in which samples came (at most 5 s): poll the file.
    let file = dir.join("state/steerdns-traffic.json");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        let saved = std::fs::read(&file)
            .ok()
            .and_then(|t| serde_json::from_slice::<serde_json::Value>(&t).ok());
        let samples: u64 = saved
            .iter()
            .flat_map(|v| v["regions"].as_array().cloned().unwrap_or_default())
            .flat_map(|r| r["networks"].as_object().cloned().unwrap_or_default())
            .map(|(_, n)| n.as_u64().unwrap())
            .sum();
        if samples == 24 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} holds {samples} samples, not 24",
            file.display()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    s.stop().await;

    let out = run(&["--state-dir", "state"]);
    assert_eq!(out.status.code(), Some(1), "{}", printed(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["traffic"]["samples"], 24, "{}", doc["traffic"]);
    assert!(doc["traffic"]["file"]
        .as_str()
        .unwrap()
        .ends_with("steerdns-traffic.json"));
    // Half of the region's samples change (weighed by network, 3 of 4 would), while
    // its address space barely moves.
    assert_eq!(traffic_of(&doc, "europe"), (24, 12, Some(50.0)));
    assert_eq!(traffic_of(&doc, "ie"), (12, 12, Some(100.0)));
    assert_eq!(traffic_of(&doc, "default"), (0, 0, None));
    let europe = &doc["names"][0]["regions"][0];
    let space = europe["ipv4"]["changed_percent"].as_f64().unwrap();
    assert!(space > 0.0 && space < 20.0, "{europe}");
    // The address-space figure is the one without traffic (a few networks whose
    // hourly selection window ended in between draw again).
    let earlier = before["names"][0]["regions"][0]["ipv4"]["changed_percent"]
        .as_f64()
        .unwrap();
    assert!((space - earlier).abs() < 0.5, "{space} then {earlier}");

    // The text says both, and where the weights came from.
    let out = steerdns(&[
        "diff",
        "steering.yaml",
        "edited.yaml",
        "--state-dir",
        "state",
    ])
    .args([
        "--zones", "zones", "--probes", "probes", "--geo", "geo.mmdb",
    ])
    .current_dir(&dir)
    .output()
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("recorded traffic: 24 samples by source network"),
        "{text}"
    );
    let line = |region: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("  region {region}")))
            .unwrap_or_else(|| panic!("no {region} line:\n{text}"))
            .to_string()
    };
    assert!(
        line("europe").ends_with("; traffic 50 % (12 of 24 samples)"),
        "{text}"
    );
    assert!(
        line("ie").ends_with("; traffic 100 % (12 of 12 samples)"),
        "{text}"
    );
    assert!(line("default").ends_with("; no recorded traffic"), "{text}");
    eprintln!("{text}");
}
