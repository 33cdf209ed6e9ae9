//! EDNS Client Subnet (RFC 7871) over real sockets: echo, SCOPE, opt-out, FORMERR.

mod common;

use common::*;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

/// Asks `name` with ECS `addr/source`; returns (CNAME target, echoed option).
async fn steered(
    srv: &TestServer,
    proto: Proto,
    name: &str,
    addr: &str,
    source: u8,
) -> (String, hickory_proto::rr::rdata::opt::ClientSubnet) {
    let m = srv
        .ask(
            proto,
            &query_edns(name, RecordType::A, Some((addr, source))),
        )
        .await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    let ecs = ecs_of(&m).expect("an ECS query gets an ECS answer");
    (cname_of(&m), ecs)
}

#[tokio::test]
async fn steered_answers_echo_the_subnet_with_the_geo_network_as_scope() {
    let srv = TestServer::multi().await;
    // (client subnet, source, expected CNAME, expected scope): scopes are the test
    // database's networks (GB 2.125.160.216/29, SE 89.160.20.112/28, JP 2001:218::/32,
    // 2a02:d500::/29 continent EU without a country).
    let cases = [
        ("2.125.160.216", 29, "uk.cdn.example.net.", 29),
        ("2.125.160.216", 32, "uk.cdn.example.net.", 29),
        ("89.160.20.112", 28, "europe.cdn.example.net.", 28),
        ("2001:218::", 32, "asia.cdn.example.net.", 32),
        ("2001:218::", 48, "asia.cdn.example.net.", 32),
        ("2a02:d500::", 29, "europe.cdn.example.net.", 29),
    ];
    for proto in BOTH {
        for (addr, source, want, scope) in cases {
            let (got, ecs) = steered(&srv, proto, "pinned.example.com.", addr, source).await;
            assert_eq!(got, want, "{addr}/{source}");
            assert_eq!(ecs.addr().to_string(), addr, "address echoed");
            assert_eq!(ecs.source_prefix(), source, "source echoed");
            assert_eq!(ecs.scope_prefix(), scope, "scope for {addr}/{source}");
        }
    }
}

#[tokio::test]
async fn a_cidr_entry_inside_a_geo_network_narrows_the_scope() {
    let srv = TestServer::multi().await;
    // 175.16.199.0/24 is CN in the database, and the policy pins 175.16.199.64/26 to
    // the `lab` region: the /24 answer is only valid for the part outside the /26.
    let (got, ecs) = steered(&srv, Proto::Udp, "pinned.example.com.", "175.16.199.0", 24).await;
    assert_eq!(got, "asia.cdn.example.net.");
    assert_eq!(ecs.scope_prefix(), 26);
    let (got, ecs) = steered(&srv, Proto::Udp, "pinned.example.com.", "175.16.199.64", 26).await;
    assert_eq!(got, "lab.cdn.example.net.");
    assert_eq!(ecs.scope_prefix(), 26);
    // The geo network (/31) is narrower than the CIDR entry: it stays.
    let (got, ecs) = steered(&srv, Proto::Udp, "pinned.example.com.", "81.2.69.142", 32).await;
    assert_eq!(got, "office.cdn.example.net.");
    assert_eq!(ecs.scope_prefix(), 31);
}

#[tokio::test]
async fn answers_that_do_not_depend_on_location_have_scope_zero() {
    let srv = TestServer::multi().await;
    for proto in BOTH {
        // A name with only a default region.
        let (got, ecs) = steered(&srv, proto, "flat.example.com.", "2.125.160.216", 29).await;
        assert_eq!(got, "only.example.net.");
        assert_eq!(ecs.scope_prefix(), 0);

        // Zone data, NODATA, NXDOMAIN and REFUSED: echoed with scope 0.
        for (name, qtype, rcode) in [
            ("example.com.", RecordType::SOA, ResponseCode::NoError),
            ("mail.example.com.", RecordType::AAAA, ResponseCode::NoError),
            ("nope.example.com.", RecordType::A, ResponseCode::NXDomain),
            ("example.org.", RecordType::A, ResponseCode::Refused),
        ] {
            let m = srv
                .ask(proto, &query_edns(name, qtype, Some(("2.125.160.216", 29))))
                .await;
            assert_eq!(m.metadata.response_code, rcode, "{name}");
            let ecs = ecs_of(&m).unwrap_or_else(|| panic!("{name}: ECS must be echoed"));
            assert_eq!((ecs.source_prefix(), ecs.scope_prefix()), (29, 0), "{name}");
            assert_eq!(ecs.addr().to_string(), "2.125.160.216");
        }
    }
}

#[tokio::test]
async fn source_prefix_zero_is_an_opt_out() {
    // RFC 7871 §7.1.2: the client asks not to be located by subnet; we locate the
    // resolver (127.0.0.1 here, pinned to `loop`) and answer scope 0.
    let srv = TestServer::multi().await;
    for proto in BOTH {
        let (got, ecs) = steered(&srv, proto, "pinned.example.com.", "0.0.0.0", 0).await;
        assert_eq!(got, "loop.cdn.example.net.");
        assert_eq!((ecs.source_prefix(), ecs.scope_prefix()), (0, 0));
        let (got, ecs) = steered(&srv, proto, "pinned.example.com.", "::", 0).await;
        assert_eq!(got, "loop.cdn.example.net.");
        assert_eq!(ecs.scope_prefix(), 0);
    }
}

#[tokio::test]
async fn without_ecs_the_source_address_is_located_and_no_ecs_is_returned() {
    let srv = TestServer::multi().await;
    for proto in BOTH {
        for q in [
            query("pinned.example.com.", RecordType::A),
            query_edns("pinned.example.com.", RecordType::A, None),
        ] {
            let m = srv.ask(proto, &q).await;
            assert_eq!(cname_of(&m), "loop.cdn.example.net.");
            assert!(ecs_of(&m).is_none());
        }
    }
}

#[tokio::test]
async fn malformed_client_subnets_get_formerr() {
    let srv = TestServer::demo().await;
    let cases: [(&str, Vec<u8>); 12] = [
        ("unknown family 3", vec![0, 3, 24, 0, 81, 2, 69]),
        ("IPv4 source prefix 33", vec![0, 1, 33, 0, 81, 2, 69, 0, 0]),
        (
            "IPv6 source prefix 129",
            [vec![0, 2, 129, 0], vec![0x20; 17]].concat(),
        ),
        (
            "host bits past the prefix (81.2.77.0/22)",
            vec![0, 1, 22, 0, 81, 2, 77],
        ),
        (
            "IPv6 host bits past the prefix (2001::/12)",
            vec![0, 2, 12, 0, 0x20, 0x01],
        ),
        ("non-zero scope in a query", vec![0, 1, 24, 16, 81, 2, 69]),
        ("empty option", vec![]),
        // RFC 7871 §6: exactly the octets the source prefix needs, neither more nor
        // fewer (hickory reads what the prefix needs and ignores the rest).
        (
            "IPv4 /24 with 4 address octets",
            vec![0, 1, 24, 0, 81, 2, 69, 0],
        ),
        (
            "IPv6 /56 with 8 address octets",
            vec![0, 2, 56, 0, 0x20, 0x01, 0x02, 0x18, 0, 0, 0, 0],
        ),
        ("IPv4 /0 with an address octet", vec![0, 1, 0, 0, 81]),
        (
            "IPv6 /0 with 16 address octets",
            [vec![0, 2, 0, 0], vec![0; 16]].concat(),
        ),
        ("IPv4 /24 with 2 address octets", vec![0, 1, 24, 0, 81, 2]),
    ];
    for proto in BOTH {
        for (i, (what, data)) in cases.iter().enumerate() {
            let id = 100 + i as u16;
            let answer = raw(srv.addr, proto, &raw_query_with_option(id, 8, data))
                .await
                .unwrap_or_else(|| panic!("{what}: no answer over {proto:?}"));
            assert_eq!(u16::from_be_bytes([answer[0], answer[1]]), id);
            assert_eq!(
                raw_rcode(&answer),
                1,
                "{what} over {proto:?} must be FORMERR"
            );
        }
        // The same packet shape with a valid option is answered.
        let ok = raw(
            srv.addr,
            proto,
            &raw_query_with_option(99, 8, &[0, 1, 24, 0, 2, 125, 160]),
        )
        .await
        .unwrap();
        assert_eq!(raw_rcode(&ok), 0);
    }
}

/// The /24s of `addr / scope`: all of them, or 64 spread evenly when there are more.
fn subnets_inside(addr: std::net::Ipv4Addr, scope: u8) -> Vec<String> {
    let count = 1u32 << (24 - u32::from(scope));
    let base = addr.to_bits() & (u32::MAX << (32 - u32::from(scope)));
    let stride = (count / 64).max(1);
    (0..count.min(64))
        .map(|i| std::net::Ipv4Addr::from(base + ((i * stride) << 8)).to_string())
        .collect()
}

/// RFC 7871 §7.3: a resolver caches an answer for the whole echoed scope and gives it
/// to every client inside, so the server must give them all that same answer too: the
/// key of a consistent pick goes only as far as min(source, scope), never to the
/// source. 50/50 weights: a key cut at the source (/24) would split the /24s of one
/// scope about evenly between the CDNs.
#[tokio::test]
async fn every_subnet_inside_the_echoed_scope_gets_the_same_answer() {
    let srv = TestServer::demo().await;
    // Addresses the test database does not hold: the default region, 50/50, with
    // scopes much wider than /24.
    let mut widest = 32;
    for addr in ["100.64.0.0", "23.1.2.0", "198.18.7.0"] {
        for r in 0..3 {
            let from = resolver(700 + r);
            let (first, ecs) = steered_from(&srv, from, Proto::Udp, addr, 24).await;
            let scope = ecs.scope_prefix();
            assert!(
                scope < 24,
                "{addr}/24: scope {scope}, no wider than the source"
            );
            widest = widest.min(scope);
            for proto in BOTH {
                for net in subnets_inside(addr.parse().unwrap(), scope) {
                    let (got, ecs) = steered_from(&srv, from, proto, &net, 24).await;
                    assert_eq!(
                        (got.as_str(), ecs.scope_prefix()),
                        (first.as_str(), scope),
                        "{net}/24 inside {addr}/{scope} through {from} over {proto:?}"
                    );
                }
            }
        }
    }
    assert!(widest <= 18, "at least one scope of /18 or wider: {widest}");
}

/// As [`steered`], asked through the resolver `from` for `www.example.com`.
async fn steered_from(
    srv: &TestServer,
    from: std::net::IpAddr,
    proto: Proto,
    addr: &str,
    source: u8,
) -> (String, hickory_proto::rr::rdata::opt::ClientSubnet) {
    let m = srv
        .ask_from(
            from,
            proto,
            &query_edns("www.example.com.", RecordType::A, Some((addr, source))),
        )
        .await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    (cname_of(&m), ecs_of(&m).expect("an ECS answer"))
}
