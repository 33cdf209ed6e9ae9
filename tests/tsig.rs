//! TSIG (RFC 8945) over real sockets. steerdns is configured with no TSIG key, so every
//! signed request is signed with a key it does not know: §5.2 asks for `NOTAUTH` with a
//! TSIG record whose error is `BADKEY`, unsigned (§5.3.2: MAC size 0), never for an
//! ordinary answer. The signed queries are built by hand; their MACs are noise, since
//! no key could check them anyway.

mod common;

use common::*;
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::rdata::tsig::{TsigAlgorithm, TsigError};
use hickory_proto::rr::rdata::TSIG;
use hickory_proto::rr::{DNSClass, Name, RData};
use hickory_server::net::xfer::Protocol;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use steerdns::dns::cache::{AnswerCache, Lookup};
use steerdns::dns::wire;
use steerdns::metrics::Metrics;

/// What the signer put in its TSIG record.
struct Signed<'a> {
    key: &'a str,
    algorithm: &'a str,
    /// Time signed: 48 bits.
    time: u64,
    fudge: u16,
    mac: Vec<u8>,
    original_id: u16,
}

/// The TSIG record (RFC 8945 §4.2): key name, type 250, class ANY, TTL 0, then the RDATA.
fn tsig_record(s: &Signed<'_>) -> Vec<u8> {
    let mut rdata = name(s.algorithm);
    rdata.extend_from_slice(&s.time.to_be_bytes()[2..]);
    rdata.extend_from_slice(&s.fudge.to_be_bytes());
    rdata.extend_from_slice(&(s.mac.len() as u16).to_be_bytes());
    rdata.extend_from_slice(&s.mac);
    rdata.extend_from_slice(&s.original_id.to_be_bytes());
    rdata.extend_from_slice(&[0, 0, 0, 0]); // error 0, other len 0
    let mut r = name(s.key);
    r.extend_from_slice(&[0, 250, 0, 255, 0, 0, 0, 0]);
    r.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
    r.extend_from_slice(&rdata);
    r
}

/// A signed query: `qname` `qtype` IN, RD set, then `opt` if given, then the TSIG.
fn signed_query(id: u16, qname: &str, qtype: u16, opt: Option<&[u8]>, s: &Signed<'_>) -> Vec<u8> {
    let counts = [1, 0, 0, 1 + u16::from(opt.is_some())];
    let rest: [&[u8]; 3] = [
        &question(qname, qtype, 1),
        opt.unwrap_or_default(),
        &tsig_record(s),
    ];
    packet(id, RD, counts, &rest)
}

/// The TSIG of a message: key name, class, TTL and RDATA. hickory-proto keeps it apart
/// (`signature`) when built with DNSSEC support, among the additional records without.
fn tsig_of(m: &Message) -> Option<(Name, DNSClass, u32, TSIG)> {
    let apart = m
        .signature
        .iter()
        .map(|r| (r.name.clone(), r.dns_class, r.ttl, r.data.clone()));
    let among = m.additionals.iter().filter_map(|r| match &r.data {
        RData::TSIG(t) => Some((r.name.clone(), r.dns_class, r.ttl, t.clone())),
        _ => None,
    });
    let all: Vec<_> = apart.chain(among).collect();
    assert!(all.len() <= 1, "several TSIG records: {all:?}");
    all.into_iter().next()
}

fn cases() -> Vec<(&'static str, Vec<u8>, Signed<'static>, bool)> {
    let signer = |algorithm, time, original_id| Signed {
        key: "transfer-key.example.org.",
        algorithm,
        time,
        fudge: 300,
        mac: (0u8..32).map(|b| b.wrapping_mul(37)).collect(),
        original_id,
    };
    let edns = opt_record(1232, true, &[(8, &[0, 1, 24, 0, 81, 2, 69])]);
    let mut out = Vec::new();
    // (what, query, its signer, whether it carries an OPT)
    for (what, id, qname, qtype, opt, s) in [
        (
            "steered name, hmac-sha256",
            0x7001,
            "www.example.com",
            1,
            None,
            signer("hmac-sha256", 1_764_000_000, 0x7001),
        ),
        (
            "steered name, EDNS with ECS and DO, then the TSIG",
            0x7002,
            "www.example.com",
            1,
            Some(&edns),
            signer("hmac-sha512", 1_764_000_123, 0x7002),
        ),
        (
            "zone data, an algorithm nobody knows, time past 32 bits",
            0x7003,
            "example.com",
            6,
            None,
            signer("hmac-foo.example", 0x0001_0000_0002, 0x7003),
        ),
        (
            "NXDOMAIN, original id other than the message's (a forwarder)",
            0x7004,
            "nope.example.com",
            1,
            Some(&edns),
            signer("hmac-sha256", 1_764_000_000, 0x1234),
        ),
    ] {
        let q = signed_query(id, qname, qtype, opt.map(|o| o.as_slice()), &s);
        out.push((what, q, s, opt.is_some()));
    }
    out
}

#[tokio::test]
async fn a_signed_query_under_an_unknown_key_gets_notauth_badkey() {
    let srv = TestServer::demo().await;
    let snap = srv.running.live().load_full();
    let mut rng = SmallRng::seed_from_u64(1);
    for (what, q, s, edns) in cases() {
        // The UDP fast path and the answer cache leave it to the full path.
        let mut out = Vec::new();
        let src = "127.0.0.1".parse().unwrap();
        assert!(
            wire::answer(&snap, &q, src, &mut out, 0, &mut rng, None).is_none(),
            "{what}: took the fast path"
        );
        let (mut cache, mut stripped) = (AnswerCache::default(), Vec::new());
        assert!(
            matches!(
                cache.lookup(&snap, &q, &mut out, &mut stripped, None),
                Lookup::Bypass
            ),
            "{what}: the answer cache takes it"
        );

        let udp = raw(srv.addr, Proto::Udp, &q).await.expect("a UDP answer");
        let tcp = raw(srv.addr, Proto::Tcp, &q).await.expect("a TCP answer");
        assert_eq!(udp, tcp, "{what}: UDP and TCP answers differ");
        let m = Message::from_vec(&udp).unwrap_or_else(|e| panic!("{what}: {e}: {udp:02x?}"));
        let id = u16::from_be_bytes([q[0], q[1]]);
        assert_eq!(m.metadata.id, id, "{what}");
        assert_eq!(m.metadata.response_code, ResponseCode::NotAuth, "{what}");
        assert_eq!(udp[3] & 0x0f, 9, "{what}: header rcode");
        assert!(m.metadata.recursion_desired, "{what}: RD copied");
        assert!(!m.metadata.authoritative, "{what}: AA on NOTAUTH");
        assert_eq!(m.queries.len(), 1, "{what}: the question");
        assert!(
            m.answers.is_empty() && m.authorities.is_empty(),
            "{what}: records in {m:?}"
        );
        // RFC 6891 §7: the OPT comes back when the query had one (before the TSIG,
        // which is the last record: RFC 8945 §5.1).
        assert_eq!(m.edns.is_some(), edns, "{what}: OPT");
        if let Some(e) = &m.edns {
            assert!(e.flags().dnssec_ok, "{what}: DO");
        }
        let arcount = u16::from_be_bytes([udp[10], udp[11]]);
        assert_eq!(arcount, 1 + u16::from(edns), "{what}: ARCOUNT");

        let (key, class, ttl, t) =
            tsig_of(&m).unwrap_or_else(|| panic!("{what}: no TSIG in {udp:02x?}"));
        assert_eq!(key, Name::from_ascii(s.key).unwrap(), "{what}: key name");
        assert_eq!((class, ttl), (DNSClass::ANY, 0), "{what}");
        assert_eq!(
            t.algorithm.to_name(),
            TsigAlgorithm::from_name(Name::from_ascii(s.algorithm).unwrap()).to_name(),
            "{what}: algorithm"
        );
        assert_eq!(t.time, s.time, "{what}: time signed");
        assert_eq!(t.fudge, s.fudge, "{what}: fudge");
        assert!(t.mac.is_empty(), "{what}: signed with MAC {:02x?}", t.mac);
        assert_eq!(t.oid, s.original_id, "{what}: original id");
        assert_eq!(t.error, Some(TsigError::BadKey), "{what}: TSIG error");
        assert!(t.other.is_empty(), "{what}: other data");
        // The RDATA as sent, at the end of the message: the algorithm name as received,
        // time signed, fudge, MAC size 0, original id, error 17, other len 0.
        let mut rdata = name(s.algorithm);
        rdata.extend_from_slice(&s.time.to_be_bytes()[2..]);
        rdata.extend_from_slice(&s.fudge.to_be_bytes());
        rdata.extend_from_slice(&[0, 0]);
        rdata.extend_from_slice(&s.original_id.to_be_bytes());
        rdata.extend_from_slice(&[0, 17, 0, 0]);
        assert!(udp.ends_with(&rdata), "{what}: TSIG RDATA in {udp:02x?}");

        // The full path in-process gives the same bytes.
        let full = steerdns::dns::Handler::new(srv.running.live().clone(), Metrics::new());
        let direct = full
            .respond(&q, "127.0.0.1:5353".parse().unwrap(), Protocol::Udp)
            .await
            .expect("a full path answer");
        assert_eq!(direct, udp, "{what}: full path in-process");
    }
    // Unsigned, the same question is answered as ever.
    for proto in BOTH {
        let m = ask(
            srv.addr,
            proto,
            &query("www.example.com.", hickory_proto::rr::RecordType::A),
        )
        .await;
        assert!(tsig_of(&m).is_none());
        cname_of(&m);
    }
}

#[tokio::test]
async fn a_tsig_that_is_not_alone_and_last_gets_formerr() {
    // RFC 8945 §5.1: one TSIG, the last record of the additional section; otherwise
    // FORMERR, unsigned.
    let srv = TestServer::demo().await;
    let s = Signed {
        key: "k.example.org.",
        algorithm: "hmac-sha256",
        time: 1_764_000_000,
        fudge: 300,
        mac: vec![7; 32],
        original_id: 0x7100,
    };
    let tsig = tsig_record(&s);
    let edns = opt_record(1232, false, &[]);
    let cases = [
        (
            "two TSIG records",
            packet(0x7101, RD, [1, 0, 0, 2], &[&www_a(), &tsig, &tsig]),
        ),
        (
            "an OPT after the TSIG",
            packet(0x7102, RD, [1, 0, 0, 2], &[&www_a(), &tsig, &edns]),
        ),
    ];
    for proto in BOTH {
        for (what, q) in &cases {
            let a = raw(srv.addr, proto, q)
                .await
                .unwrap_or_else(|| panic!("{what}: no answer over {proto:?}"));
            assert_eq!(id_of(&a), id_of(q), "{what}: id");
            assert_eq!(raw_rcode(&a), 1, "{what} over {proto:?}: FORMERR expected");
            let m = Message::from_vec(&a).unwrap();
            assert!(tsig_of(&m).is_none(), "{what}: a TSIG in the FORMERR");
            assert!(m.answers.is_empty(), "{what}");
        }
    }
}
