//! Steering over real sockets: region matching and the weighted distribution.

mod common;

use std::collections::HashMap;

use common::*;
use hickory_proto::rr::RecordType;

/// Counts the CNAME targets of `n` UDP queries with ECS `addr/source`, each from
/// another resolver (one resolver asking n times gets one consistent answer).
async fn shares(
    srv: &TestServer,
    name: &str,
    addr: &str,
    source: u8,
    n: usize,
) -> HashMap<String, usize> {
    shares_over(srv, Proto::Udp, name, addr, source, n).await
}

/// As [`shares`], over `proto`.
async fn shares_over(
    srv: &TestServer,
    proto: Proto,
    name: &str,
    addr: &str,
    source: u8,
    n: usize,
) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    let q = query_edns(name, RecordType::A, Some((addr, source)));
    for i in 0..n {
        let m = srv.ask_from(resolver(i), proto, &q).await;
        *counts.entry(cname_of(&m)).or_insert(0) += 1;
    }
    counts
}

// Shares are checked with `common::assert_share` (5 standard deviations). At n = 4,000
// a correct server fails one such check in about 1.7 million runs, and a share 8 points
// off at p = 0.5 (5 points at p = 0.9) fails it in more than 99.9 % of runs.

#[tokio::test]
async fn region_shares_follow_the_weights() {
    let srv = TestServer::demo().await;
    const N: usize = 4_000;
    // (client subnet, expected fastly share): GB 90/10, US 85/15, JP 10/90, unknown 50/50.
    let cases = [
        ("81.2.69.160", 27, 0.90, "GB"),
        ("216.160.83.56", 29, 0.85, "US"),
        ("2001:218::", 32, 0.10, "JP (IPv6)"),
        ("10.0.0.0", 8, 0.50, "address not in the database"),
    ];
    for (addr, source, p, what) in cases {
        let counts = shares(&srv, "www.example.com.", addr, source, N).await;
        let fastly = counts.get(FASTLY).copied().unwrap_or(0);
        let cloudflare = counts.get(CLOUDFLARE).copied().unwrap_or(0);
        assert_eq!(
            fastly + cloudflare,
            N,
            "{what}: unexpected targets {counts:?}"
        );
        assert_share(fastly, N, p, what);
    }
}

/// Over TCP (the fast path, as over UDP), and through the full path in-process (which
/// answers the steered queries of unusual forms): the same weighted shares, region by
/// region.
#[tokio::test]
async fn weighted_answers_over_tcp_and_the_full_path_follow_the_weights() {
    let srv = TestServer::demo().await;
    let full = steerdns::dns::Handler::new(
        srv.running.live().clone(),
        steerdns::metrics::Metrics::new(),
    );
    const N: usize = 2_000;
    for (addr, source, p, what) in [
        ("81.2.69.160", 27, 0.90, "GB"),
        ("2001:218::", 32, 0.10, "JP"),
    ] {
        let tcp = shares_over(&srv, Proto::Tcp, "www.example.com.", addr, source, N).await;
        let q = query_edns("www.example.com.", RecordType::A, Some((addr, source)))
            .to_vec()
            .unwrap();
        let mut full_path = HashMap::new();
        for i in 0..N {
            let src = std::net::SocketAddr::new(resolver(i), 5353);
            let a = full
                .respond(&q, src, hickory_server::net::xfer::Protocol::Tcp)
                .await
                .expect("a full-path answer");
            let m = hickory_proto::op::Message::from_vec(&a).unwrap();
            *full_path.entry(cname_of(&m)).or_insert(0) += 1;
        }
        for (how, counts) in [("over TCP", tcp), ("full path", full_path)] {
            let fastly = counts.get(FASTLY).copied().unwrap_or(0);
            assert_eq!(
                fastly + counts.get(CLOUDFLARE).copied().unwrap_or(0),
                N,
                "{what} {how}: {counts:?}"
            );
            assert_share(fastly, N, p, &format!("{what} {how}"));
        }
    }
}

#[tokio::test]
async fn first_matching_region_wins() {
    let srv = TestServer::multi().await;
    let cases = [
        // A CIDR region listed before the country region takes the GB address.
        ("81.2.69.142", 32, "office.cdn.example.net."),
        // GB outside that block: the country region, before continent:EU.
        ("2.125.160.216", 29, "uk.cdn.example.net."),
        // Other European countries: the continent.
        ("89.160.20.112", 28, "europe.cdn.example.net."),
        ("2a02:d500::", 29, "europe.cdn.example.net."),
        ("175.16.199.0", 24, "asia.cdn.example.net."),
        ("2001:218::", 32, "asia.cdn.example.net."),
        // US has no region of its own, and unknown addresses go to the default.
        ("216.160.83.56", 29, "world.cdn.example.net."),
        ("10.0.0.0", 8, "world.cdn.example.net."),
        ("2001:db8::", 32, "world.cdn.example.net."),
    ];
    for proto in BOTH {
        for (addr, source, want) in cases {
            let got = srv
                .cname(
                    proto,
                    &query_edns("pinned.example.com.", RecordType::A, Some((addr, source))),
                )
                .await;
            assert_eq!(got, want, "{addr}/{source} over {proto:?}");
        }
    }
}

#[tokio::test]
async fn each_steered_name_has_its_own_policy() {
    let srv = TestServer::multi().await;
    let m = srv
        .ask(
            Proto::Udp,
            &query_edns(
                "flat.example.com.",
                RecordType::A,
                Some(("2.125.160.216", 29)),
            ),
        )
        .await;
    assert_eq!(cname_of(&m), "only.example.net.");
    assert_eq!(m.answers[0].ttl, 60);
    let m = srv
        .ask(
            Proto::Udp,
            &query_edns(
                "pinned.example.com.",
                RecordType::A,
                Some(("2.125.160.216", 29)),
            ),
        )
        .await;
    assert_eq!(m.answers[0].ttl, 20);
    // www.example.com is not steered by this policy: it does not exist in the zone.
    let m = srv
        .ask(Proto::Udp, &query("www.example.com.", RecordType::A))
        .await;
    assert_eq!(
        m.metadata.response_code,
        hickory_proto::op::ResponseCode::NXDomain
    );
}

#[tokio::test]
async fn every_geo_schema_locates_clients() {
    // GeoIP2 City, GeoLite2 Country (nested schema) and the shipped NRO database (flat
    // `country_code`, continent derived from the country).
    for geo in [
        "tests/fixtures/geo/GeoIP2-City-Test.mmdb",
        "tests/fixtures/geo/GeoLite2-Country-Test.mmdb",
        "geo/country.mmdb",
    ] {
        let srv = TestServer::start(MULTI_POLICY, TEST_ZONES, geo, "127.0.0.1:0").await;
        for (addr, source, want) in [
            ("89.160.20.112", 28, "europe.cdn.example.net."),
            ("2.125.160.216", 29, "uk.cdn.example.net."),
        ] {
            let got = srv
                .cname(
                    Proto::Udp,
                    &query_edns("pinned.example.com.", RecordType::A, Some((addr, source))),
                )
                .await;
            assert_eq!(got, want, "{addr} with {geo}");
        }
    }
}

#[tokio::test]
async fn the_readme_dig_examples_hold_with_the_shipped_database() {
    // The demo as a fresh checkout serves it: steering.yaml, zones/, geo/country.mmdb.
    let srv = TestServer::start(DEMO_POLICY, "zones", "geo/country.mmdb", "127.0.0.1:0").await;
    const N: usize = 4_000;
    for (addr, p, scope) in [("81.2.69.0", 0.90, 18), ("216.160.83.0", 0.85, 15)] {
        let m = srv
            .ask(
                Proto::Udp,
                &query_edns("www.example.com.", RecordType::A, Some((addr, 24))),
            )
            .await;
        assert_eq!(ecs_of(&m).unwrap().scope_prefix(), scope, "{addr}/24");
        let counts = shares(&srv, "www.example.com.", addr, 24, N).await;
        assert_share(counts.get(FASTLY).copied().unwrap_or(0), N, p, addr);
    }
    let m = srv
        .ask(
            Proto::Udp,
            &query_edns("example.com.", RecordType::SOA, None),
        )
        .await;
    assert!(m.metadata.authoritative);
    assert_eq!(m.answers.len(), 1);
}
