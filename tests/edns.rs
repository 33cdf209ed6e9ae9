//! EDNS compliance over real sockets (issue 6, item 3): RFC 6891, RFC 8906 and the checks
//! of DNS Flag Day 2019 (ISC's `genreport`: `dns`, `edns`, `edns1`, `ednsopt`,
//! `edns1opt`, `do`, `ednsflags`, `zflag`, `ednstcp`).
//!
//! Every kind of answer is checked: a steered CNAME, zone data from the Catalog,
//! NXDOMAIN, REFUSED outside our zones, and the errors our handler makes (NOTIMP,
//! FORMERR, REFUSED for other classes).

mod common;

use common::*;
use hickory_proto::op::{Edns, Message, OpCode, ResponseCode};
use hickory_proto::rr::rdata::opt::EdnsOption;
use hickory_proto::rr::{DNSClass, RecordType};

/// Queries answered by every path of the handler, the rcode each gets, and the
/// INFO-CODE of the Extended DNS Error (RFC 8914) it carries when the query has an OPT.
fn every_path() -> Vec<(&'static str, Message, ResponseCode, Option<u16>)> {
    let mut notimp = query("www.example.com.", RecordType::A);
    notimp.metadata.op_code = OpCode::Status;
    let mut chaos = query("version.bind.", RecordType::TXT);
    chaos.queries[0].set_query_class(DNSClass::CH);
    let mut no_question = query("www.example.com.", RecordType::A);
    no_question.queries.clear();
    vec![
        (
            "steered",
            query("www.example.com.", RecordType::A),
            ResponseCode::NoError,
            None,
        ),
        (
            "zone data",
            query("example.com.", RecordType::SOA),
            ResponseCode::NoError,
            None,
        ),
        (
            "NXDOMAIN",
            query("nope.example.com.", RecordType::A),
            ResponseCode::NXDomain,
            None,
        ),
        (
            "outside our zones",
            query("example.org.", RecordType::A),
            ResponseCode::Refused,
            Some(20),
        ),
        (
            "zone transfer",
            query("example.com.", RecordType::AXFR),
            ResponseCode::Refused,
            Some(21),
        ),
        ("opcode STATUS", notimp, ResponseCode::NotImp, Some(21)),
        ("class CH", chaos, ResponseCode::Refused, Some(21)),
        ("no question", no_question, ResponseCode::FormErr, Some(0)),
    ]
}

fn with_edns(mut m: Message, f: impl FnOnce(&mut Edns)) -> Message {
    let mut e = Edns::new();
    e.set_max_payload(1232);
    f(&mut e);
    m.set_edns(e);
    m
}

#[tokio::test]
async fn no_opt_in_the_query_means_none_in_any_answer() {
    let srv = TestServer::demo().await;
    for proto in BOTH {
        for (what, q, rcode, _) in every_path() {
            let m = srv.ask(proto, &q).await;
            assert_eq!(m.metadata.response_code, rcode, "{what} {proto:?}");
            assert!(m.edns.is_none(), "{what} over {proto:?}: {:?}", m.edns);
        }
    }
}

#[tokio::test]
async fn an_opt_in_the_query_gets_one_in_every_answer() {
    let srv = TestServer::demo().await;
    for proto in BOTH {
        for (what, q, rcode, _) in every_path() {
            let m = srv.ask(proto, &with_edns(q, |_| {})).await;
            assert_eq!(m.metadata.response_code, rcode, "{what} {proto:?}");
            let opt = m
                .edns
                .unwrap_or_else(|| panic!("{what} over {proto:?}: no OPT"));
            assert_eq!(opt.version(), 0);
            assert_eq!(opt.max_payload(), 1232);
        }
    }
}

#[tokio::test]
async fn unknown_options_are_ignored_and_not_echoed() {
    let srv = TestServer::demo().await;
    for proto in BOTH {
        for (what, q, rcode, _) in every_path() {
            let q = with_edns(q, |e| {
                // genreport's `ednsopt` sends option 100; NSID-like and local-use codes too.
                for (code, data) in [
                    (100u16, vec![]),
                    (65001, vec![1, 2, 3]),
                    (26946, vec![0; 40]),
                ] {
                    e.options_mut().insert(EdnsOption::Unknown(code, data));
                }
            });
            let m = srv.ask(proto, &q).await;
            assert_eq!(m.metadata.response_code, rcode, "{what} {proto:?}");
            // Nothing but the answer's own Extended DNS Error.
            let others = other_options(&m).expect("OPT");
            assert!(
                others.iter().all(|(code, _)| *code == 15),
                "{what} over {proto:?} echoed {others:?}"
            );
        }
    }
    // With ECS among them, only ECS comes back.
    let mut q = query_edns("www.example.com.", RecordType::A, Some(("81.2.69.0", 24)));
    q.edns
        .as_mut()
        .unwrap()
        .options_mut()
        .insert(EdnsOption::Unknown(100, vec![9; 8]));
    let m = srv.ask(Proto::Udp, &q).await;
    let opts = &m.edns.as_ref().unwrap().options().options;
    assert_eq!(opts.len(), 1, "{opts:?}");
    assert!(ecs_of(&m).is_some());
}

#[tokio::test]
async fn unknown_edns_flags_are_ignored_and_not_echoed() {
    let srv = TestServer::demo().await;
    for proto in BOTH {
        for (what, q, rcode, _) in every_path() {
            // genreport's `ednsflags` sets an undefined flag (0x0080); set them all.
            for (z, dnssec_ok) in [(0x0080u16, false), (0x7fff, false), (0x7fff, true)] {
                let q = with_edns(q.clone(), |e| {
                    e.flags_mut().z = z;
                    e.set_dnssec_ok(dnssec_ok);
                });
                let m = srv.ask(proto, &q).await;
                assert_eq!(m.metadata.response_code, rcode, "{what} {proto:?} z={z:#x}");
                let opt = m.edns.expect("OPT");
                assert_eq!(opt.flags().z, 0, "{what} over {proto:?}: Z bits echoed");
                assert_eq!(opt.flags().dnssec_ok, dnssec_ok, "{what}: DO");
            }
        }
    }
}

#[tokio::test]
async fn the_header_z_bit_is_not_echoed() {
    // genreport's `zflag`: the reserved header bit (0x0040) must be zero in the answer.
    let srv = TestServer::demo().await;
    let q = query("www.example.com.", RecordType::A).to_vec().unwrap();
    for proto in BOTH {
        let mut bytes = q.clone();
        bytes[3] |= 0x40;
        let a = raw(srv.addr, proto, &bytes).await.expect("answer");
        assert_eq!(raw_rcode(&a), 0);
        assert_eq!(a[3] & 0x40, 0, "Z echoed over {proto:?}");
    }
}

#[tokio::test]
async fn edns_version_one_gets_badvers_with_version_zero() {
    let srv = TestServer::demo().await;
    for proto in BOTH {
        for (what, q, _, _) in every_path() {
            for (version, option) in [(1u8, false), (1, true), (255, false)] {
                // `edns1` and `edns1opt`: the answer is BADVERS with our version, no data.
                let q = with_edns(q.clone(), |e| {
                    e.set_version(version);
                    if option {
                        e.options_mut().insert(EdnsOption::Unknown(100, vec![]));
                    }
                });
                let bytes = q.to_vec().unwrap();
                let a = raw(srv.addr, proto, &bytes).await.expect("answer");
                // BADVERS is 16: header RCODE 0, OPT extended RCODE 1.
                assert_eq!(
                    raw_rcode(&a),
                    0,
                    "{what} v{version} {proto:?}: header rcode"
                );
                let m = Message::from_vec(&a).unwrap();
                let opt = m.edns.as_ref().expect("BADVERS needs an OPT");
                assert_eq!(opt.rcode_high(), 1, "{what} v{version}: extended rcode");
                assert_eq!(u16::from(m.metadata.response_code), 16, "{what}");
                assert_eq!(opt.version(), 0, "{what}: our version");
                assert!(opt.options().options.is_empty(), "{what}: options echoed");
                assert!(m.answers.is_empty() && m.authorities.is_empty(), "{what}");
                assert_eq!(m.metadata.id, q.metadata.id);
            }
        }
    }
}

#[tokio::test]
async fn the_do_bit_is_copied_and_nothing_is_signed() {
    // RFC 3225 §3: the DO bit of the query is copied into the response. We serve no
    // DNSSEC, so no RRSIG, NSEC or DNSKEY appears in any answer.
    let srv = TestServer::demo().await;
    for proto in BOTH {
        for (what, q, rcode, _) in every_path() {
            for dnssec_ok in [false, true] {
                let m = srv
                    .ask(
                        proto,
                        &with_edns(q.clone(), |e| {
                            e.set_dnssec_ok(dnssec_ok);
                        }),
                    )
                    .await;
                assert_eq!(m.metadata.response_code, rcode, "{what}");
                assert_eq!(
                    m.edns.as_ref().unwrap().flags().dnssec_ok,
                    dnssec_ok,
                    "{what}"
                );
                assert!(!m.metadata.authentic_data, "{what}: AD without DNSSEC");
                for r in m.answers.iter().chain(&m.authorities).chain(&m.additionals) {
                    assert!(
                        !matches!(
                            r.record_type(),
                            RecordType::RRSIG | RecordType::NSEC | RecordType::NSEC3
                        ),
                        "{what}: {r:?}"
                    );
                }
            }
        }
    }
    let m = srv
        .ask(
            Proto::Udp,
            &with_edns(query("example.com.", RecordType::DNSKEY), |e| {
                e.set_dnssec_ok(true);
            }),
        )
        .await;
    assert!(m.answers.is_empty(), "DNSKEY: {:?}", m.answers);
}

/// A raw `name TXT` query whose OPT advertises `size` (hickory's encoder clamps to 512).
fn txt_query_with_size(id: u16, name: &str, size: u16) -> Vec<u8> {
    let mut q = query(name, RecordType::TXT);
    q.metadata.id = id;
    q.set_edns(Edns::new());
    let mut bytes = q.to_vec().unwrap();
    // The OPT is the last record: owner(1) type(2) then the class, which is the size.
    let at = bytes.len() - 11 + 3;
    bytes[at..at + 2].copy_from_slice(&size.to_be_bytes());
    bytes
}

#[tokio::test]
async fn the_advertised_udp_size_is_honoured() {
    let srv = TestServer::demo().await;
    // big: about 1,000 bytes; huge: about 1,500.
    let cases: [(&str, u16, bool); 9] = [
        ("big.example.com.", 0, true), // below 512 counts as 512 (RFC 6891 §6.2.3)
        ("big.example.com.", 511, true),
        ("big.example.com.", 512, true),
        ("big.example.com.", 900, true),
        ("big.example.com.", 1100, false),
        ("big.example.com.", 1232, false),
        ("huge.example.com.", 1232, true),
        // Over 1232 we still send at most 1232: no fragmentation (DNS Flag Day 2020).
        ("huge.example.com.", 4096, true),
        ("huge.example.com.", 65535, true),
    ];
    for (i, (name, size, truncated)) in cases.into_iter().enumerate() {
        let id = 300 + i as u16;
        let a = raw(srv.addr, Proto::Udp, &txt_query_with_size(id, name, size))
            .await
            .expect("answer");
        let m = Message::from_vec(&a).unwrap();
        assert_eq!(m.metadata.id, id);
        assert_eq!(m.metadata.truncation, truncated, "{name} at {size}: TC");
        let limit = usize::from(size.clamp(512, 1232));
        assert!(a.len() <= limit, "{name}: {} bytes over {size}", a.len());
        let opt = m.edns.as_ref().expect("OPT");
        assert_eq!(opt.max_payload(), size.clamp(512, 1232), "advertised size");
        if !truncated {
            assert_eq!(m.answers.len(), 1, "{name} at {size}");
        }
    }
    // Over TCP the size does not apply.
    for size in [512u16, 1232] {
        let a = raw(
            srv.addr,
            Proto::Tcp,
            &txt_query_with_size(400, "huge.example.com.", size),
        )
        .await
        .expect("answer");
        let m = Message::from_vec(&a).unwrap();
        assert!(!m.metadata.truncation, "TC over TCP");
        assert_eq!(m.answers.len(), 1);
        assert!(a.len() > 1232);
    }
    // Without EDNS, 512.
    let m = srv
        .ask(Proto::Udp, &query("big.example.com.", RecordType::TXT))
        .await;
    assert!(m.metadata.truncation);
}

#[tokio::test]
async fn edns_over_tcp() {
    // genreport's `ednstcp`: EDNS works over TCP too.
    let srv = TestServer::demo().await;
    let m = srv
        .ask(
            Proto::Tcp,
            &query_edns("www.example.com.", RecordType::A, None),
        )
        .await;
    cname_of(&m);
    assert_eq!(m.edns.as_ref().unwrap().version(), 0);
}

#[tokio::test]
async fn error_answers_say_why_in_an_extended_dns_error() {
    // RFC 8914: each error answer to a query with an OPT carries the INFO-CODE of
    // `every_path` (and an EXTRA-TEXT); answers that are not errors carry none; without
    // an OPT in the query there is none (`no_opt_in_the_query_means_none_in_any_answer`).
    let srv = TestServer::demo().await;
    for proto in BOTH {
        for (what, q, rcode, want) in every_path() {
            // Twice: the second UDP answer may come from the answer cache.
            for round in 0..2 {
                let m = srv.ask(proto, &with_edns(q.clone(), |_| {})).await;
                assert_eq!(m.metadata.response_code, rcode, "{what} {proto:?}");
                let ede = ede_of(&m);
                assert_eq!(
                    ede.as_ref().map(|e| e.0),
                    want,
                    "{what} over {proto:?}, round {round}: {ede:?}"
                );
                if let Some((_, text)) = ede {
                    assert!(!text.is_empty(), "{what}: no EXTRA-TEXT");
                }
            }
        }
    }
    // Out of zone with ECS, again and again (the answer cache replays it): the EDE, then
    // the ECS echo with scope 0.
    for round in 0..3 {
        let m = srv
            .ask(
                Proto::Udp,
                &query_edns("example.org.", RecordType::A, Some(("81.2.69.0", 24))),
            )
            .await;
        assert_eq!(m.metadata.response_code, ResponseCode::Refused);
        assert_eq!(ede_of(&m).map(|e| e.0), Some(20), "round {round}");
        let ecs = ecs_of(&m).unwrap_or_else(|| panic!("round {round}: no ECS echo"));
        assert_eq!((ecs.source_prefix(), ecs.scope_prefix()), (24, 0));
    }
    // A malformed ECS option (a bit set past the source prefix): FORMERR, EDE 0.
    let mut bad = query("www.example.com.", RecordType::A);
    bad.set_edns(Edns::new());
    let mut bytes = bad.to_vec().unwrap();
    let n = bytes.len();
    // The OPT's RDLENGTH (last two bytes, 0), then one ECS option: 81.2.77.0/22.
    bytes[n - 2..].copy_from_slice(&[0, 11]);
    bytes.extend_from_slice(&[0, 8, 0, 7, 0, 1, 22, 0, 81, 2, 77]);
    for proto in BOTH {
        let a = raw(srv.addr, proto, &bytes).await.expect("an answer");
        let m = Message::from_vec(&a).unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr, "{proto:?}");
        assert_eq!(ede_of(&m).map(|e| e.0), Some(0), "{proto:?}");
    }
}

#[test]
fn dig_shows_the_extended_dns_error() {
    if !require_dig("dig_shows_the_extended_dns_error") {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let srv = rt.block_on(TestServer::demo());
    let dig = |args: &[&str]| {
        let out = std::process::Command::new("dig")
            .args(["@127.0.0.1", "-p", &srv.addr.port().to_string()])
            .args(["+tries=1", "+time=2"])
            .args(args)
            .output()
            .expect("dig runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = dig(&["example.org", "A"]);
    assert!(out.contains("status: REFUSED"), "{out}");
    assert!(out.contains("EDE: 20 (Not Authoritative)"), "{out}");
    let out = dig(&["+opcode=notify", "example.com", "SOA"]);
    assert!(out.contains("status: NOTIMP"), "{out}");
    assert!(out.contains("EDE: 21 (Not Supported)"), "{out}");
    // No EDNS, no EDE.
    let out = dig(&["+noedns", "example.org", "A"]);
    assert!(
        out.contains("status: REFUSED") && !out.contains("EDE"),
        "{out}"
    );
    drop(srv);
}
