//! AS numbers in `match:` (`--asn-db`, GeoLite2-ASN format), over real sockets and the
//! command line.
//!
//! - `check` refuses AS entries without an ASN database, naming the file and line, and
//!   accepts them with one;
//! - a client in a matched AS gets that region's answer, with the ECS scope of its AS
//!   network (or narrower: its country's); others fall through to the next regions,
//!   with a scope cut at their AS network too;
//! - `explain` shows the origin AS and the entry that matched.

mod common;

use common::*;
use hickory_proto::rr::RecordType;
use steerdns::app;
use steerdns::control::decide::planner;
use steerdns::inputs::Inputs;

const POLICY: &str = "tests/fixtures/steering-asn.yaml";
const ASN_DB: &str = "tests/fixtures/geo/GeoLite2-ASN-Test.mmdb";
const SHIPPED_GEO: &str = "geo/country.mmdb";

/// `steerdns ARGS` on the ASN policy, from the repository: (success, what it printed).
fn with_asn_policy(args: &[&str]) -> (bool, String) {
    let out = steerdns(args)
        .current_dir(repo("."))
        .args(["--config", POLICY, "--probes", "tests/fixtures/no-probes"])
        .output()
        .unwrap();
    (out.status.success(), printed(&out))
}

/// `config` with the zones, the shipped geo database and the test ASN database.
fn load(config: &str) -> app::Loaded {
    let inputs = Inputs {
        config: repo(config),
        zones: repo("zones"),
        geo: repo(SHIPPED_GEO),
        probes: repo("tests/fixtures/no-probes"),
        asn: Some(repo(ASN_DB)),
        api_tokens: None,
    };
    app::load(&inputs).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn check_refuses_as_entries_without_an_asn_database() {
    let (ok, out) = with_asn_policy(&["check"]);
    assert!(!ok, "{out}");
    // The file, the line of `match: [AS1221]` (line 11) and the field.
    assert!(
        out.contains(&format!("{POLICY}:11")) && out.contains("regions[0].match[0]"),
        "{out}"
    );
    assert!(
        out.contains("`AS1221`") && out.contains("--asn-db"),
        "{out}"
    );
    assert!(out.contains("`AS15169`"), "every AS entry is named: {out}");
    let (ok, out) = with_asn_policy(&["check", "--asn-db", ASN_DB]);
    assert!(ok, "{out}");
    // Not an ASN database: refused, named.
    let (ok, out) = with_asn_policy(&["check", "--asn-db", SHIPPED_GEO]);
    assert!(!ok && out.contains("autonomous_system_number"), "{out}");
}

#[tokio::test]
async fn a_client_in_a_matched_as_gets_that_region() {
    let loaded = load(POLICY);
    let running = app::start(
        planner::snapshot(&loaded),
        &["127.0.0.1:0".parse().unwrap()],
    )
    .await
    .unwrap();
    let addr = running.addrs()[0];
    // (client subnet, source, CNAME, the scope echoed). The scope is exact: the widest
    // block over which the answer holds is cut at the client's AS network when a policy
    // matches by AS (outside it, the origin AS, and so the answer, may differ).
    // In the test databases: AS1221 is 1.128.0.0/11 (AU /11 in the country database),
    // AS15169 1.0.0.0/24 (AU /24); 81.2.69.0 is GB /18 in an AS-less /9; 216.160.83.0 is
    // US /15 but AS209 /18, so its scope is the AS network's /18, not the country's /15.
    let cases = [
        ("1.128.0.0", 16, "telstra.cdn.example.net.", 11),
        ("1.130.7.0", 24, "telstra.cdn.example.net.", 11),
        ("1.0.0.0", 24, "google.cdn.example.net.", 24),
        // No AS of the policy: the region by place, within its country and AS network.
        ("81.2.69.0", 24, "google.cdn.example.net.", 18),
        ("216.160.83.0", 24, "world.cdn.example.net.", 18),
    ];
    for proto in [Proto::Udp, Proto::Tcp] {
        for (client, source, want, scope) in cases {
            let q = query_edns("www.example.com.", RecordType::A, Some((client, source)));
            let m = ask(addr, proto, &q).await;
            assert_eq!(cname_of(&m), want, "{client}/{source} over {proto:?}");
            assert_eq!(
                ecs_of(&m).unwrap().scope_prefix(),
                scope,
                "{client}/{source} over {proto:?}: the scope echoed (a wider one than its AS network's is wrong)"
            );
        }
    }
    running.stop().await.unwrap();
}

#[test]
fn explain_shows_the_origin_as() {
    let (ok, out) = with_asn_policy(&[
        "explain",
        "www.example.com",
        "--client",
        "1.130.7.1",
        "--asn-db",
        ASN_DB,
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("origin:  AS1221 (network /11 in"), "{out}");
    assert!(out.contains("first region matching `AS1221`"), "{out}");
    assert!(out.contains("telstra.cdn.example.net."), "{out}");
}

/// Only names whose policy has AS entries read the ASN database: with the same
/// database attached, the demo name (no AS entries) locates a client without its
/// origin, the AS policy's name with it.
#[test]
fn only_names_with_as_entries_look_the_origin_up() {
    let ip = "1.130.7.1".parse().unwrap();
    for (config, want) in [("steering.yaml", None), (POLICY, Some(1221))] {
        let loaded = load(config);
        let snap = planner::snapshot(&loaded);
        let name = snap.plan.names().next().unwrap();
        assert_eq!(name.locate(&snap.geo, ip).origin.asn, want, "{config}");
        assert_eq!(
            snap.geo.origin(ip).asn,
            Some(1221),
            "{config}: the database"
        );
    }
}
