//! Unit tests of the families: names, labels, bounds, and what `/metrics` serves.

use std::sync::Arc;
use std::time::Duration;

use rand::RngExt;

use super::*;
use crate::plan::Snapshot;

fn text(m: &Metrics) -> String {
    String::from_utf8(m.encode().unwrap()).unwrap()
}

#[test]
fn reason_classes_are_the_text_before_the_first_colon_or_space() {
    for (reason, class) in [
        ("timeout: no response in 3000 ms", "timeout"),
        ("timeout: body not complete in 500 ms", "timeout"),
        ("connect: cannot resolve a.example: failed", "connect"),
        ("tls: invalid peer certificate: UnknownIssuer", "tls"),
        ("status 503 (expected 200)", "status"),
        ("body mismatch: `healthy-v3` not found", "body"),
        ("slow: first byte after 900 ms (limit 800 ms)", "slow"),
        ("http: connection closed before message completed", "http"),
        ("client: builder error", "client"),
        ("status", "status"),
    ] {
        assert_eq!(reason_class(reason), class, "{reason}");
    }
}

#[test]
fn unknown_reasons_are_other_so_the_label_set_stays_bounded() {
    for reason in ["", "weird", "https://x.example/ failed", "Timeout: x", ":"] {
        assert_eq!(reason_class(reason), "other", "{reason:?}");
    }
}

#[test]
fn rcode_names_are_the_iana_mnemonics() {
    assert_eq!(rcode_name(0), "NOERROR");
    assert_eq!(rcode_name(3), "NXDOMAIN");
    assert_eq!(rcode_name(5), "REFUSED");
    assert_eq!(rcode_name(16), "BADVERS");
    assert_eq!(rcode_name(15), "UNKNOWN");
    assert_eq!(rcode_name(4095), "UNKNOWN");
}

#[test]
fn encode_contains_every_family() {
    let m = Metrics::new();
    m.answered(3);
    m.observe(Duration::from_micros(30));
    m.probe("fastly", "ns1", Some("status 503 (expected 200)"));
    m.cdn_probed("fastly");
    m.transition("fastly", true);
    m.removed("www.example.com.", "fastly", 50);
    let snapshot = Arc::new(demo());
    m.adopt(&snapshot);
    m.fail_open("www.example.com.", "eu", true);
    m.vantage_unhappy("ns2", true);
    m.reload(false);
    m.config_version("abc123");
    m.drain_active("www.example.com.", "fastly", true);
    m.peer_error("http://ns2:9153/", "timeout");
    m.state_saved(false);
    m.state_load_error("corrupt");
    let t = text(&m);
    for family in [
        "steerdns_queries_total",
        "steerdns_query_duration_seconds",
        "steerdns_probe_results_total",
        "steerdns_cdn_up",
        "steerdns_health_transitions_total",
        "steerdns_failover_removed_percent",
        "steerdns_effective_weight",
        "steerdns_fail_open",
        "steerdns_fail_open_events_total",
        "steerdns_vantage_unhappy",
        "steerdns_config_reloads_total",
        "steerdns_config_info",
        "steerdns_drains_active",
        "steerdns_peer_errors_total",
        "steerdns_state_save_errors_total",
        "steerdns_state_save_failing",
        "steerdns_state_load_errors_total",
        "steerdns_etcd_fail_static",
        "steerdns_audit_failing",
        "steerdns_audit_head_seq",
        "steerdns_etcd_refused_keys",
        "steerdns_build_info",
    ] {
        assert!(
            t.contains(&format!("# TYPE {family} ")),
            "{family} missing from:\n{t}"
        );
    }
    for line in [
        r#"steerdns_queries_total{cdn="",name="",rcode="NXDOMAIN",region=""} 1"#,
        r#"steerdns_queries_total{cdn="",name="",rcode="REFUSED",region=""} 0"#,
        r#"steerdns_query_duration_seconds_count 1"#,
        r#"steerdns_query_duration_seconds_bucket{le="0.000032"} 1"#,
        r#"steerdns_query_duration_seconds_bucket{le="0.000016"} 0"#,
        r#"steerdns_probe_results_total{cdn="fastly",result="status",vantage="ns1"} 1"#,
        r#"steerdns_cdn_up{cdn="fastly"} 0"#,
        r#"steerdns_health_transitions_total{cdn="fastly",to="down"} 1"#,
        r#"steerdns_health_transitions_total{cdn="fastly",to="up"} 0"#,
        r#"steerdns_failover_removed_percent{cdn="fastly",name="www.example.com."} 50"#,
        r#"steerdns_fail_open{name="www.example.com.",region="eu"} 1"#,
        r#"steerdns_fail_open_events_total{name="www.example.com.",region="eu"} 1"#,
        r#"steerdns_vantage_unhappy{vantage="ns2"} 1"#,
        r#"steerdns_config_reloads_total{result="applied"} 0"#,
        r#"steerdns_config_reloads_total{result="refused"} 1"#,
        r#"steerdns_config_info{version="abc123"} 1"#,
        r#"steerdns_drains_active{cdn="fastly",name="www.example.com."} 1"#,
        r#"steerdns_peer_errors_total{peer="http://ns2:9153/",reason="timeout"} 1"#,
        r#"steerdns_state_save_errors_total 1"#,
        r#"steerdns_state_save_failing 1"#,
        r#"steerdns_state_load_errors_total{reason="corrupt"} 1"#,
    ] {
        assert!(
            t.lines().any(|l| l == line),
            "line `{line}` missing from:\n{t}"
        );
    }
}

#[test]
fn build_info_and_the_process_families_are_served() {
    let t = text(&Metrics::new());
    let info = format!(r#"steerdns_build_info{{commit="{COMMIT}",version="{VERSION}"}} 1"#);
    assert!(t.lines().any(|l| l == info), "`{info}` missing from:\n{t}");
    assert!(!COMMIT.is_empty() && VERSION == env!("CARGO_PKG_VERSION"));
    #[cfg(target_os = "linux")]
    for family in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        // The standard names, without our prefix.
        assert!(
            t.contains(&format!("\n{family} ")),
            "{family} missing from:\n{t}"
        );
        assert!(!t.contains(&format!("steerdns_{family}")), "{t}");
    }
}

#[test]
fn uncommon_rcodes_fall_back_to_a_labelled_counter() {
    let m = Metrics::new();
    m.answered(9);
    m.answered(9);
    m.answered(300);
    let t = text(&m);
    assert!(t.contains(r#"steerdns_queries_total{cdn="",name="",rcode="NOTAUTH",region=""} 2"#));
    assert!(t.contains(r#"steerdns_queries_total{cdn="",name="",rcode="UNKNOWN",region=""} 1"#));
}

/// The demo policy's snapshot (the tests read its names and regions from the plan).
fn demo() -> Snapshot {
    demo_with(false)
}

/// A snapshot of the demo policy's steered name built from the plan layer alone
/// (the planner is a layer above): www.example.com. on fastly and cloudflare in four
/// regions, at the demo's weights or, with `fastly_out`, with fastly removed by
/// failover (its whole share on cloudflare).
fn demo_with(fastly_out: bool) -> Snapshot {
    use crate::config::{ContentSteering, Match, Selection};
    use crate::place::geo::GeoDb;
    use crate::plan::{ChoiceSpec, NameSpec, Plan, Reason, RegionIndex, Target};
    use hickory_proto::rr::Name;

    let regions: [(&str, &[&str], u64); 4] = [
        ("europe", &["GB", "IE", "DE", "FR", "NL", "ES", "IT"], 90),
        ("americas", &["US", "CA", "MX"], 85),
        ("apac", &["AU", "NZ", "SG", "JP"], 10),
        ("default", &["*"], 50),
    ];
    let matches: Vec<Vec<Match>> = regions
        .iter()
        .map(|(_, m, _)| m.iter().map(|m| Match::parse(m).unwrap()).collect())
        .collect();
    let choices = regions
        .iter()
        .map(|&(_, _, fastly)| match fastly_out {
            false => ChoiceSpec::new(Reason::Normal, [(0, fastly), (1, 100 - fastly)]),
            true => ChoiceSpec::new(Reason::Failover, [(0, 0), (1, 100)]),
        })
        .map(Option::unwrap)
        .collect();
    let target = |cdn: &str, cname: &str| Target::new(cdn.into(), Name::from_ascii(cname).unwrap());
    let name = NameSpec {
        name: Name::from_ascii("www.example.com.").unwrap(),
        ttl: 30,
        selection: Selection::Consistent,
        index: RegionIndex::new(matches.iter().map(Vec::as_slice)),
        regions: regions.iter().map(|(r, _, _)| (*r).into()).collect(),
        targets: vec![
            target("fastly", "example.map.fastly.net."),
            target("cloudflare", "example.cdn.cloudflare.net."),
        ],
        drain_scopes: Vec::new(),
        choices,
        content: ContentSteering::default(),
    };
    let geo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/geo/GeoIP2-Country-Test.mmdb");
    let geo = Arc::new(GeoDb::open(&geo).unwrap());
    Snapshot {
        plan: Plan::new(vec![name], geo.places()),
        geo,
        zones: Arc::new(hickory_server::zone_handler::Catalog::new()),
        signed_until: None,
        denials: None,
        canary: None,
    }
}

/// Answers `n` times from region 0 of the snapshot's first name.
fn answer(s: &Snapshot, n: usize) {
    let steered = s.plan.names().next().unwrap();
    let mut rng = rand::rng();
    for _ in 0..n {
        steered.pick(steered.choice(0), rng.random()).count();
    }
}

/// The sum of the steered series of region 0 of the demo's first name.
fn steered_total(m: &Metrics, s: &Snapshot) -> u64 {
    let steered = s.plan.names().next().unwrap();
    let prefix = format!(
        r#"name="{}",rcode="NOERROR",region="{}"}} "#,
        steered.name(),
        steered.region_name(0)
    );
    text(m)
        .lines()
        .filter(|l| l.starts_with("steerdns_queries_total{") && l.contains(&prefix))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

#[test]
fn steered_counts_survive_new_plans_and_never_go_back() {
    let m = Metrics::new();
    let first = Arc::new(demo());
    m.adopt(&first);
    let t = text(&m);
    // Every (name, region, CDN) served has a series from the start.
    let steered = first.plan.names().next().unwrap();
    for (region, cdn, _) in steered.answered() {
        let series = format!(
            r#"steerdns_queries_total{{cdn="{cdn}",name="{}",rcode="NOERROR",region="{region}"}} 0"#,
            steered.name()
        );
        assert!(t.contains(&series), "{series} missing from\n{t}");
    }
    answer(&first, 10);
    assert_eq!(steered_total(&m, &first), 10);

    // A new plan while a query still holds the old one: both count.
    let second = Arc::new(demo());
    m.adopt(&second);
    answer(&first, 5);
    answer(&second, 3);
    assert_eq!(steered_total(&m, &first), 18);
    // The old plan's last reader goes: its counts move into the totals.
    drop(first);
    assert_eq!(steered_total(&m, &second), 18);
    assert_eq!(m.inner.tally.lock().unwrap().held.len(), 1);
    let third = Arc::new(demo());
    m.adopt(&third);
    drop(second);
    answer(&third, 2);
    assert_eq!(steered_total(&m, &third), 20);
    assert_eq!(m.inner.tally.lock().unwrap().held.len(), 1);
}

#[test]
fn config_info_shows_only_the_current_version() {
    let m = Metrics::new();
    m.config_version("old");
    m.config_version("new");
    let t = text(&m);
    assert!(t.contains(r#"steerdns_config_info{version="new"} 1"#));
    assert!(!t.contains(r#"version="old""#), "{t}");
}

#[test]
fn fail_open_counts_each_start_once() {
    let m = Metrics::new();
    let events = |m: &Metrics| {
        m.inner
            .fail_open_events
            .with_label_values(&["n.", "eu"])
            .get()
    };
    m.fail_open("n.", "eu", false);
    assert_eq!(events(&m), 0);
    m.fail_open("n.", "eu", true);
    m.fail_open("n.", "eu", true);
    assert_eq!(events(&m), 1);
    m.fail_open("n.", "eu", false);
    m.fail_open("n.", "eu", true);
    assert_eq!(events(&m), 2);
    assert_eq!(m.inner.fail_open.with_label_values(&["n.", "eu"]).get(), 1);
}

/// (region, CDN, percent) of every `effective_weight` series of www.example.com.
fn shares(m: &Metrics) -> Vec<(String, String, f64)> {
    let prefix = "steerdns_effective_weight{cdn=\"";
    text(m)
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .map(|l| {
            let (cdn, rest) = l.split_once('"').unwrap();
            let (_, rest) = rest.split_once("region=\"").unwrap();
            let (region, value) = rest.split_once("\"} ").unwrap();
            (region.to_string(), cdn.to_string(), value.parse().unwrap())
        })
        .collect()
}

#[test]
fn effective_weights_are_those_of_the_plan_being_served() {
    let m = Metrics::new();
    assert!(shares(&m).is_empty(), "no plan served yet");
    let normal = Arc::new(demo());
    m.adopt(&normal);
    let before = shares(&m);
    let regions = normal.plan.names().next().unwrap().regions();
    // Every region, every CDN (two in the demo), adding up to 100 per region.
    assert_eq!(before.len(), regions * 2, "{before:?}");
    for (region, _, _) in &before {
        let total: f64 = before.iter().filter(|s| s.0 == *region).map(|s| s.2).sum();
        assert!((total - 100.0).abs() < 1e-9, "{region}: {total}");
    }
    assert!(
        before.iter().any(|s| s.1 == "fastly" && s.2 == 90.0),
        "{before:?}"
    );

    // fastly removed by failover: the newest plan is what the gauges show.
    let failed = Arc::new(demo_with(true));
    m.adopt(&failed);
    for (region, cdn, share) in shares(&m) {
        let want = if cdn == "fastly" { 0.0 } else { 100.0 };
        assert_eq!(share, want, "{region} / {cdn}");
    }
    drop((normal, failed));
}

#[test]
fn clones_share_one_registry_and_instances_do_not() {
    let (a, b) = (Metrics::new(), Metrics::new());
    a.clone().reload(true);
    assert!(text(&a).contains(r#"steerdns_config_reloads_total{result="applied"} 1"#));
    assert!(text(&b).contains(r#"steerdns_config_reloads_total{result="applied"} 0"#));
}

#[test]
fn the_etcd_clock_skew_is_nan_until_measured() {
    let m = Metrics::new();
    let t = text(&m);
    assert!(
        t.contains("steerdns_etcd_clock_skew_seconds NaN"),
        "not NaN before a measurement:\n{t}"
    );
    m.etcd_clock_skew(-2_000);
    assert!(text(&m).contains("steerdns_etcd_clock_skew_seconds -2\n"));
}
