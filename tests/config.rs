//! Policy validation: every rule of the design's list, each reported with file, line
//! and field, all at once.

use std::path::Path;

use steerdns::config::{self, Match};
use steerdns::error::Issues;

const GOOD: &str = "\
hostname: www.example.com
ttl: 30
cdns:
  fastly:     { cname: example.map.fastly.net. }
  cloudflare: { cname: example.cdn.cloudflare.net. }
regions:
  - match: [GB, IE, DE, FR, NL, ES, IT]
    weights: { fastly: 90, cloudflare: 10 }
  - match: [\"*\"]
    weights: { fastly: 50, cloudflare: 50 }
";

fn errors(text: &str) -> Issues {
    match config::parse(Path::new("steering.yaml"), text.to_string()) {
        Ok((_, warnings)) => panic!("accepted; warnings: {:?}", warnings.0),
        Err(issues) => issues,
    }
}

/// Asserts one error names `line`, `field` and contains `words`.
fn has(issues: &Issues, line: usize, field: &str, words: &str) {
    assert!(
        issues
            .errors()
            .any(|i| i.line == Some(line) && i.field == field && i.message.contains(words)),
        "no error at line {line}, field {field}, containing {words:?}; got:\n{issues}"
    );
}

#[test]
fn the_demo_policy_loads_exactly_as_written() {
    let (policy, warnings) =
        config::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("steering.yaml")).unwrap();
    assert!(warnings.0.is_empty(), "{warnings:?}");
    let host = &policy.hosts[0];
    assert_eq!(host.name.to_string(), "www.example.com.");
    assert_eq!(host.ttl, 30);
    assert_eq!(
        host.cdns
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["fastly", "cloudflare"]
    );
    assert_eq!(host.regions.len(), 4);
    assert_eq!(
        host.regions[2].weights,
        [10, 90],
        "weights follow the cdns order, not the file's"
    );
    assert_eq!(host.regions[3].matches, [Match::Any]);
    assert_eq!(host.failover.steps, [50, 100]);
    assert_eq!(host.failover.step_interval.as_secs(), 90);
    assert!(host.drains.is_empty());
}

#[test]
fn a_correct_file_is_accepted() {
    config::parse(Path::new("steering.yaml"), GOOD.to_string()).unwrap();
}

#[test]
fn unknown_keys_are_refused_with_their_line() {
    let e = errors(&GOOD.replace("weights: { fastly: 50", "wieghts: { fastly: 50"));
    has(&e, 10, "regions[1]", "unknown field `wieghts`");
    let e = errors(&GOOD.replace("ttl: 30", "ttl: 30\nttls: 5"));
    has(&e, 3, "", "unknown field `ttls`");
}

#[test]
fn yaml_syntax_errors_name_the_line() {
    let e = errors(&GOOD.replace("  - match: [\"*\"]", "  - match: [\"*\""));
    assert!(e.errors().next().unwrap().line.is_some(), "{e}");
}

#[test]
fn every_semantic_error_is_reported_at_once() {
    let text = "\
hostname: www.example.com
ttl: -5
cdns:
  fastly:     { cname: example.map.fastly.net }
  cloudflare: { cname: example.cdn.cloudflare.net. }
regions:
  - match: [GB, UK, \"continent:XX\", 81.2.69.1/24, AS4294967296]
    weights: { fastly: -1, akamai: 10 }
  - match: [US]
    weights: { fastly: 0, cloudflare: 0 }
failover:
  steps: [50, 40]
  step_interval_seconds: 90
drain:
  - cdn: limelight
    where: [atlantis]
    until: tomorrow
";
    let e = errors(text);
    has(&e, 2, "ttl", "not a TTL");
    has(&e, 4, "cdns.fastly.cname", "not absolute");
    has(&e, 7, "regions[0].match[1]", "the United Kingdom is GB");
    has(&e, 7, "regions[0].match[2]", "unknown continent");
    has(&e, 7, "regions[0].match[3]", "host bits");
    has(&e, 7, "regions[0].match[4]", "AS numbers go up to");
    has(&e, 8, "regions[0].weights.fastly", "out of range");
    has(&e, 8, "regions[0].weights.akamai", "unknown CDN `akamai`");
    has(&e, 10, "regions[1].weights", "all weights are zero");
    has(&e, 6, "regions", "no default region");
    has(&e, 12, "failover.steps[1]", "increasing");
    has(&e, 12, "failover.steps", "must be 100");
    has(&e, 15, "drain[0].cdn", "unknown CDN `limelight`");
    has(&e, 16, "drain[0].where[0]", "not a region name");
    has(&e, 17, "drain[0].until", "not a UTC time");
    // The report renders as `file:line: field: message`.
    assert!(
        e.to_string()
            .contains("steering.yaml:8: regions[0].weights.akamai: unknown CDN `akamai`"),
        "{e}"
    );
}

#[test]
fn duplicates_are_refused() {
    let e = errors(&GOOD.replace(
        "  cloudflare: { cname: example.cdn.cloudflare.net. }",
        "  cloudflare: { cname: example.cdn.cloudflare.net. }\n  fastly: { cname: other.example.net. }",
    ));
    has(&e, 6, "cdns", "duplicate key `fastly`");

    let e = errors(&GOOD.replace(
        "weights: { fastly: 50, cloudflare: 50 }",
        "weights: { fastly: 50, fastly: 50 }",
    ));
    has(&e, 10, "regions[1].weights", "duplicate key `fastly`");

    let two_names = "\
hostname: www.example.com
cdns: { a: { cname: a.example.net. } }
regions:
  - name: eu
    match: [GB]
    weights: { a: 1 }
  - name: eu
    match: [\"*\"]
    weights: { a: 1 }
";
    has(&errors(two_names), 7, "regions[1].name", "used twice");
}

#[test]
fn the_default_region_must_be_last() {
    let text = GOOD.replace(
        "  - match: [GB, IE, DE, FR, NL, ES, IT]",
        "  - match: [\"*\"]\n    weights: { fastly: 1 }\n  - match: [GB, IE, DE, FR, NL, ES, IT]",
    );
    has(&errors(&text), 9, "regions[1]", "can never match");
}

#[test]
fn steps_must_be_percentages() {
    let e = errors(&format!("{GOOD}failover:\n  steps: [0, 120]\n"));
    has(&e, 12, "failover.steps[0]", "not a percentage");
    has(&e, 12, "failover.steps[1]", "not a percentage");
}

#[test]
fn hostname_forms_cannot_be_mixed() {
    let text = "hostname: a.example.com\nttl: 30\nhostnames:\n  b.example.com: { cdns: { x: { cname: x.example.net. } }, regions: [{ match: [\"*\"], weights: { x: 1 } }] }\n";
    has(&errors(text), 3, "hostnames", "not both");
    has(&errors("ttl: 30\n"), 1, "", "no steered name");
}

#[test]
fn several_hostnames_each_with_their_own_keys() {
    let text = "\
hostnames:
  www.example.com:
    ttl: 30
    cdns: { a: { cname: a.example.net. }, b: { cname: b.example.net. } }
    regions:
      - match: [\"continent:EU\", 2001:db8::/32, NO]
        weights: { a: 3, b: 1 }
      - match: [\"*\"]
        weights: { a: 1, b: 1 }
    drain:
      - cdn: a
        where: [\"continent:EU\", GB]
        reason: INC-1
        until: 2026-12-01T12:00:00Z
        immediate: true
  VIDEO.example.com:
    cdns: { c: { cname: c.example.net. } }
    regions: [{ match: [\"*\"], weights: { c: 1 } }]
";
    let (policy, _) = config::parse(Path::new("steering.yaml"), text.to_string()).unwrap();
    assert_eq!(policy.hosts.len(), 2);
    assert_eq!(
        policy.hosts[1].name.to_string(),
        "video.example.com.",
        "names are lowercased"
    );
    assert_eq!(policy.hosts[1].ttl, 30, "ttl defaults to 30");
    let eu = &policy.hosts[0].regions[0];
    assert_eq!(
        eu.matches[2],
        Match::parse("NO").unwrap(),
        "NO stays Norway, not YAML's false"
    );
    let drain = &policy.hosts[0].drains[0];
    assert!(drain.immediate);
    assert_eq!(drain.scope.len(), 2);
    assert!(drain.until.is_some());

    let dup = text.replace("VIDEO.example.com", "WWW.example.com");
    has(
        &errors(&dup),
        16,
        "hostnames.WWW.example.com",
        "listed twice",
    );
}

#[test]
fn small_shares_are_warned_about_not_refused() {
    let text = GOOD.replace(
        "{ fastly: 90, cloudflare: 10 }",
        "{ fastly: 95, cloudflare: 5 }",
    );
    let (_, warnings) = config::parse(Path::new("steering.yaml"), text).unwrap();
    let w: Vec<String> = warnings.warnings().map(ToString::to_string).collect();
    assert!(
        w.iter().any(
            |w| w.contains("steering.yaml:8: regions[0].weights.cloudflare") && w.contains("5.0 %")
        ),
        "{w:?}"
    );
}

#[test]
fn drains_that_empty_a_region_are_refused_and_expired_ones_reported() {
    let both = format!(
        "{GOOD}drain:\n  - cdn: fastly\n    reason: x\n  - cdn: cloudflare\n    where: [GB]\n    reason: y\n"
    );
    has(
        &errors(&both),
        11,
        "drain",
        "every CDN out of region `GB,IE,DE,FR,NL,ES,IT`",
    );

    let expired = format!(
        "{GOOD}drain:\n  - cdn: fastly\n    reason: old\n    until: 2020-01-01T00:00:00Z\n"
    );
    let (policy, warnings) = config::parse(Path::new("steering.yaml"), expired).unwrap();
    assert_eq!(policy.hosts[0].drains.len(), 1);
    let w: Vec<String> = warnings.warnings().map(ToString::to_string).collect();
    assert!(
        w.iter()
            .any(|w| w.contains("steering.yaml:14: drain[0].until") && w.contains("expired")),
        "{w:?}"
    );
}

/// Found by the `policy` fuzz target: a two-character match entry that is not two
/// letters (`*#`) made the country table index underflow, a panic in `check`, reload or
/// the drain API.
#[test]
fn two_character_matches_that_are_not_letters_are_errors_not_panics() {
    for entry in ["*#", "1A", "[]", "~~"] {
        let text = GOOD.replace("[GB, IE,", &format!("[\"{entry}\", IE,"));
        let issues = errors(&text);
        assert!(issues.has_errors(), "{entry}: {issues}");
        assert!(Match::parse(entry).is_err(), "{entry} parsed as a match");
    }
}

/// Found by the `policy` fuzz target: an entry with a multi-byte character across its
/// second byte (`+՟::1/128`) was sliced at byte 2, a panic.
#[test]
fn match_entries_with_multibyte_characters_are_errors_not_panics() {
    for entry in ["+՟::1/128", "é", "aé1", "A€", "ÅS1"] {
        assert!(Match::parse(entry).is_err(), "{entry} parsed as a match");
        let text = GOOD.replace("[GB, IE,", &format!("[\"{entry}\", IE,"));
        assert!(errors(&text).has_errors(), "{entry}");
    }
}

/// What the `policy` fuzz target does with an input, over its committed seeds: every
/// policy accepted is planned with each CDN removed and drained, and every plan keeps
/// the planner's invariants (`planner::check`).
#[test]
fn the_policy_fuzz_seeds_keep_the_planners_invariants() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/policy");
    let mut seeds = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        if let Ok((policy, _)) = config::parse(Path::new("steering.yaml"), text) {
            let plans = steerdns::control::decide::planner::check_every_cut(&policy)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(plans > 1, "{}", path.display());
            seeds += 1;
        }
    }
    assert!(
        seeds >= 2,
        "{seeds} policies among the seeds of {}",
        dir.display()
    );
}

#[test]
fn content_steering_is_validated_with_its_line_and_field() {
    let text = format!(
        "{GOOD}content_steering:
  pathways: {{ fastly: cdn/a, akamai: x, cloudflare: cdn-b }}
  ttl: 0
  throughput_floor_bps: -5
"
    );
    let issues = errors(&text);
    has(
        &issues,
        12,
        "content_steering.pathways.fastly",
        "not a pathway id",
    );
    has(
        &issues,
        12,
        "content_steering.pathways.akamai",
        "unknown CDN `akamai`",
    );
    has(&issues, 13, "content_steering.ttl", "not a steering TTL");
    has(
        &issues,
        14,
        "content_steering.throughput_floor_bps",
        "not a throughput floor",
    );
    assert_eq!(issues.errors().count(), 4, "{issues}");

    let issues = errors(&format!(
        "{GOOD}content_steering:\n  pathways: {{ fastly: same, cloudflare: same }}\n"
    ));
    has(
        &issues,
        12,
        "content_steering.pathways",
        "given to both fastly and cloudflare",
    );
    let issues = errors(&format!("{GOOD}content_steering:\n  ttls: 5\n"));
    assert!(
        issues.to_string().contains("unknown field `ttls`"),
        "{issues}"
    );

    // Accepted: the mapping, and the defaults (CDN names, the DNS TTL, no floor).
    let (policy, _) = config::parse(
        Path::new("steering.yaml"),
        format!(
            "{GOOD}content_steering: {{ pathways: {{ fastly: cdn-a }}, ttl: 15, throughput_floor_bps: 800000 }}\n"
        ),
    )
    .unwrap();
    let c = &policy.hosts[0].content;
    assert_eq!(c.pathways, ["cdn-a", "cloudflare"]);
    assert_eq!(c.ttl, Some(15));
    assert_eq!(c.throughput_floor_bps, Some(800_000));
    let (policy, _) = config::parse(Path::new("steering.yaml"), GOOD.to_string()).unwrap();
    let c = &policy.hosts[0].content;
    assert_eq!(c.pathways, ["fastly", "cloudflare"]);
    assert_eq!((c.ttl, c.throughput_floor_bps), (None, None));
}
