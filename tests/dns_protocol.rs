//! DNS behaviour over real sockets, UDP and TCP: the design's "DNS behaviour" section.

mod common;

use common::*;
use hickory_proto::op::{Edns, OpCode, ResponseCode};
use hickory_proto::rr::{RData, RecordType};

#[tokio::test]
async fn steered_name_answers_a_cname_for_every_type() {
    let srv = TestServer::demo().await;
    let types = [
        RecordType::A,
        RecordType::AAAA,
        RecordType::CNAME,
        RecordType::MX,
        RecordType::TXT,
        RecordType::SOA,
        RecordType::NS,
        RecordType::HTTPS,
        RecordType::ANY,
    ];
    for proto in BOTH {
        for qtype in types {
            let m = srv.ask(proto, &query("www.example.com.", qtype)).await;
            assert_eq!(
                m.metadata.response_code,
                ResponseCode::NoError,
                "{qtype} {proto:?}"
            );
            assert!(m.metadata.authoritative, "AA for {qtype} {proto:?}");
            assert!(!m.metadata.recursion_available, "RA for {qtype}");
            let target = cname_of(&m);
            assert!(target == FASTLY || target == CLOUDFLARE, "{target}");
            assert_eq!(m.answers[0].ttl, 30);
            assert!(
                m.authorities.is_empty() && m.additionals.is_empty(),
                "{m:?}"
            );
        }
    }
}

#[tokio::test]
async fn query_name_case_is_preserved() {
    let srv = TestServer::demo().await;
    for proto in BOTH {
        let m = srv
            .ask(proto, &query("WwW.ExAmPlE.CoM.", RecordType::A))
            .await;
        assert_eq!(m.queries[0].name().to_string(), "WwW.ExAmPlE.CoM.");
        assert_eq!(m.answers[0].name.to_string(), "WwW.ExAmPlE.CoM.");
        cname_of(&m);
    }
}

#[tokio::test]
async fn apex_answers_soa_and_ns() {
    let srv = TestServer::demo().await;
    for proto in BOTH {
        let m = srv
            .ask(proto, &query("example.com.", RecordType::SOA))
            .await;
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.metadata.authoritative);
        assert!(!m.metadata.recursion_available);
        assert_eq!(m.answers.len(), 1);
        assert!(matches!(m.answers[0].data, RData::SOA(_)));

        let m = srv.ask(proto, &query("example.com.", RecordType::NS)).await;
        assert!(m.metadata.authoritative);
        let mut ns: Vec<String> = m
            .answers
            .iter()
            .map(|r| match &r.data {
                RData::NS(n) => n.0.to_string(),
                other => panic!("{other:?}"),
            })
            .collect();
        ns.sort();
        assert_eq!(ns, ["ns1.example.com.", "ns2.example.com."]);
    }
}

#[tokio::test]
async fn nxdomain_and_nodata_carry_the_soa() {
    let srv = TestServer::demo().await;
    for proto in BOTH {
        let m = srv
            .ask(proto, &query("nope.example.com.", RecordType::A))
            .await;
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
        assert!(m.metadata.authoritative);
        assert!(m.answers.is_empty());
        assert!(
            matches!(m.authorities.as_slice(), [r] if matches!(r.data, RData::SOA(_))),
            "{m:?}"
        );

        let m = srv
            .ask(proto, &query("mail.example.com.", RecordType::AAAA))
            .await;
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.metadata.authoritative);
        assert!(m.answers.is_empty());
        assert!(
            matches!(m.authorities.as_slice(), [r] if matches!(r.data, RData::SOA(_))),
            "{m:?}"
        );

        // A name below the steered one does not exist.
        let m = srv
            .ask(proto, &query("x.www.example.com.", RecordType::A))
            .await;
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    }
}

#[tokio::test]
async fn names_outside_the_zones_are_refused() {
    let srv = TestServer::demo().await;
    for proto in BOTH {
        for name in ["example.org.", "www.example.net.", "com."] {
            let m = srv.ask(proto, &query(name, RecordType::A)).await;
            assert_eq!(m.metadata.response_code, ResponseCode::Refused, "{name}");
            assert!(!m.metadata.authoritative);
            assert!(m.answers.is_empty());
        }
    }
}

#[tokio::test]
async fn static_records_are_served_from_the_zone() {
    let srv = TestServer::demo().await;
    for proto in BOTH {
        let m = srv
            .ask(proto, &query("ns2.example.com.", RecordType::AAAA))
            .await;
        assert!(m.metadata.authoritative);
        assert!(
            matches!(&m.answers[0].data, RData::AAAA(a) if a.0.to_string() == "2001:db8:1::53")
        );

        let m = srv.ask(proto, &query("example.com.", RecordType::MX)).await;
        assert!(
            matches!(&m.answers[0].data, RData::MX(mx) if mx.exchange.to_string() == "mail.example.com.")
        );

        // A static CNAME in the zone is followed inside the zone.
        let m = srv
            .ask(proto, &query("api.example.com.", RecordType::A))
            .await;
        assert!(
            matches!(&m.answers[0].data, RData::CNAME(c) if c.0.to_string() == "origin.example.com.")
        );
        assert!(m
            .answers
            .iter()
            .any(|r| matches!(&r.data, RData::A(a) if a.0.to_string() == "192.0.2.80")));
    }
}

#[tokio::test]
async fn any_gets_a_minimal_answer() {
    // RFC 8482: one RRset, not everything at the name.
    let srv = TestServer::demo().await;
    for proto in BOTH {
        let m = srv
            .ask(proto, &query("multi.example.com.", RecordType::ANY))
            .await;
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(!m.answers.is_empty());
        let first = m.answers[0].record_type();
        assert!(
            m.answers.iter().all(|r| r.record_type() == first),
            "{:?}",
            m.answers
        );

        let m = srv
            .ask(proto, &query("www.example.com.", RecordType::ANY))
            .await;
        cname_of(&m);
    }
}

#[tokio::test]
async fn truncation_follows_the_clients_udp_size() {
    let srv = TestServer::demo().await;
    // About 1,000 bytes of TXT.
    let no_edns = srv
        .ask(Proto::Udp, &query("big.example.com.", RecordType::TXT))
        .await;
    assert!(
        no_edns.metadata.truncation,
        "answer over 512 bytes without EDNS must set TC"
    );

    let mut small = query_edns("big.example.com.", RecordType::TXT, None);
    small.edns.as_mut().unwrap().set_max_payload(600);
    let m = srv.ask(Proto::Udp, &small).await;
    assert!(
        m.metadata.truncation,
        "answer over the client's 600 bytes must set TC"
    );

    let big = query_edns("big.example.com.", RecordType::TXT, None);
    let m = srv.ask(Proto::Udp, &big).await;
    assert!(!m.metadata.truncation);
    assert_eq!(m.answers.len(), 1);
    assert_eq!(
        m.edns.as_ref().unwrap().max_payload(),
        1232,
        "we advertise at most 1232"
    );

    let m = srv
        .ask(Proto::Tcp, &query("big.example.com.", RecordType::TXT))
        .await;
    assert!(!m.metadata.truncation);
    assert_eq!(m.answers.len(), 1);
}

#[tokio::test]
async fn edns_version_above_zero_gets_badvers() {
    let srv = TestServer::demo().await;
    for proto in BOTH {
        for name in ["www.example.com.", "example.com."] {
            let mut q = query_edns(name, RecordType::A, Some(("81.2.69.0", 24)));
            q.edns.as_mut().unwrap().set_version(1);
            let m = srv.ask(proto, &q).await;
            // BADVERS and BADSIG share code 16; hickory's decoder names it BADSIG.
            assert_eq!(
                u16::from(m.metadata.response_code),
                16,
                "{name} {proto:?}: {}",
                m.metadata.response_code
            );
            assert_eq!(m.edns.as_ref().expect("BADVERS needs an OPT").version(), 0);
            assert!(m.answers.is_empty());
        }
    }
}

#[tokio::test]
async fn no_opt_in_the_query_means_none_in_the_answer() {
    let srv = TestServer::demo().await;
    for proto in BOTH {
        for name in [
            "www.example.com.",
            "example.com.",
            "nope.example.com.",
            "example.org.",
        ] {
            let m = srv.ask(proto, &query(name, RecordType::A)).await;
            assert!(m.edns.is_none(), "{name}: {:?}", m.edns);
        }
        let m = srv
            .ask(proto, &query_edns("example.com.", RecordType::SOA, None))
            .await;
        assert!(m.edns.is_some());
    }
}

#[tokio::test]
async fn do_bit_is_copied_and_unknown_options_ignored() {
    let srv = TestServer::demo().await;
    let mut q = query_edns("www.example.com.", RecordType::A, None);
    let edns: &mut Edns = q.edns.as_mut().unwrap();
    edns.set_dnssec_ok(true);
    edns.options_mut()
        .insert(hickory_proto::rr::rdata::opt::EdnsOption::Unknown(
            65001,
            vec![1, 2, 3],
        ));
    let m = srv.ask(Proto::Udp, &q).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    cname_of(&m);
    let opt = m.edns.as_ref().unwrap();
    assert!(opt.flags().dnssec_ok);
    assert!(
        opt.options().options.is_empty(),
        "unknown option echoed: {:?}",
        opt.options()
    );
}

#[tokio::test]
async fn other_opcodes_are_not_implemented() {
    let srv = TestServer::demo().await;
    for proto in BOTH {
        let mut q = query("www.example.com.", RecordType::A);
        q.metadata.op_code = OpCode::Status;
        let m = srv.ask(proto, &q).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NotImp);
    }
}

#[tokio::test]
async fn serves_over_ipv6_loopback() {
    if std::net::UdpSocket::bind("[::1]:0").is_err() {
        // A CI machine must have it: the README promises IPv6 listening.
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "no IPv6 loopback on this machine: required in CI"
        );
        eprintln!("SKIPPED serves_over_ipv6_loopback: no IPv6 loopback on this machine");
        return;
    }
    let srv = TestServer::start(DEMO_POLICY, TEST_ZONES, TEST_GEO, "[::1]:0").await;
    assert!(srv.addr.is_ipv6());
    for proto in BOTH {
        cname_of(
            &srv.ask(proto, &query("www.example.com.", RecordType::AAAA))
                .await,
        );
    }
}

#[tokio::test]
async fn a_stopped_server_no_longer_answers() {
    // An address of this process's own in 127/8: once stopped, its port is free, and a
    // second suite run beside this one (binding 127.0.0.1) cannot be the one answering
    // there, as it once was.
    let pid = std::process::id();
    let own = format!(
        "127.{}.{}.{}:0",
        100 + pid % 100,
        (pid / 100) % 250,
        1 + (pid / 25_000) % 250
    );
    let srv = TestServer::start(DEMO_POLICY, TEST_ZONES, TEST_GEO, &own).await;
    let addr = srv.addr;
    cname_of(&ask(addr, Proto::Udp, &query("www.example.com.", RecordType::A)).await);
    srv.running.stop().await.unwrap();
    let bytes = query("www.example.com.", RecordType::A).to_vec().unwrap();
    assert!(raw(addr, Proto::Tcp, &bytes).await.is_none());
    // The UDP threads have ended and closed their sockets.
    let wait = std::time::Duration::from_millis(300);
    assert!(raw_within(addr, Proto::Udp, &bytes, wait).await.is_none());
}

#[tokio::test]
async fn zone_transfers_and_other_classes_are_refused() {
    let srv = TestServer::demo().await;
    for proto in BOTH {
        for qtype in [RecordType::AXFR, RecordType::IXFR] {
            let m = srv.ask(proto, &query("example.com.", qtype)).await;
            assert_eq!(m.metadata.response_code, ResponseCode::Refused, "{qtype}");
            assert!(m.answers.is_empty());
        }
        for name in ["www.example.com.", "example.com.", "version.bind."] {
            let mut q = query(name, RecordType::TXT);
            q.queries[0].set_query_class(hickory_proto::rr::DNSClass::CH);
            let m = srv.ask(proto, &q).await;
            assert_eq!(m.metadata.response_code, ResponseCode::Refused, "{name} CH");
        }
    }
}
