//! The UDP fast path (`dns::wire`) against the full path (hickory decode, `Handler`):
//! every plain form of a steered query is sent over UDP and over TCP, where the fast path
//! answers it, and to the full path in-process (as over TCP), and the answers must be the
//! same message.
//! That each form really takes the fast path is checked in-process on the same bytes.
//!
//! The multi-name policy pins each region to one CDN, so the answers are deterministic.

mod common;

use common::*;
use hickory_proto::op::Message;
use hickory_proto::rr::rdata::opt::EdnsOption;
use hickory_proto::rr::RecordType;
use hickory_server::net::xfer::Protocol;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use steerdns::control::decide::planner;
use steerdns::dns::wire;
use steerdns::metrics::Metrics;

/// A query for `name` (wire labels as given, so case is kept), type `qtype`, with the
/// header flags byte `flags` (RD = 0x01, AA = 0x04), CD from `cd`, and `opt` as the
/// additional section (`None`: no OPT).
fn form(id: u16, flags: u8, cd: bool, name: &str, qtype: u16, opt: Option<Vec<u8>>) -> Vec<u8> {
    let flags = u16::from_be_bytes([flags, if cd { 0x10 } else { 0 }]);
    let counts = [1, 0, 0, u16::from(opt.is_some())];
    packet(
        id,
        flags,
        counts,
        &[&question(name, qtype, 1), &opt.unwrap_or_default()],
    )
}

/// An OPT record: payload size, DO bit, and raw options `(code, data)`.
fn opt(payload: u16, dnssec_ok: bool, options: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let options: Vec<(u16, &[u8])> = options.iter().map(|(c, d)| (*c, d.as_slice())).collect();
    opt_record(payload, dnssec_ok, &options)
}

fn forms() -> Vec<(&'static str, Vec<u8>)> {
    const A: u16 = 1;
    let gb = || ecs(1, 24, &[81, 2, 69]);
    vec![
        (
            "no EDNS",
            form(1, 0x01, false, "pinned.example.com", A, None),
        ),
        (
            "no EDNS, RD clear, CD set",
            form(2, 0, true, "pinned.example.com", A, None),
        ),
        (
            "AA set in the query",
            form(3, 0x05, false, "pinned.example.com", A, None),
        ),
        (
            "mixed case",
            form(4, 0x01, false, "PiNNed.Example.COM", A, None),
        ),
        ("AAAA", form(5, 0x01, false, "pinned.example.com", 28, None)),
        ("TXT", form(6, 0x01, false, "flat.example.com", 16, None)),
        ("CNAME", form(7, 0x01, false, "flat.example.com", 5, None)),
        (
            "EDNS, no options",
            form(
                8,
                0x01,
                false,
                "pinned.example.com",
                A,
                Some(opt(1232, false, &[])),
            ),
        ),
        (
            "EDNS payload 4096",
            form(
                9,
                0x01,
                false,
                "pinned.example.com",
                A,
                Some(opt(4096, false, &[])),
            ),
        ),
        (
            "EDNS payload 100",
            form(
                10,
                0x01,
                false,
                "pinned.example.com",
                A,
                Some(opt(100, false, &[])),
            ),
        ),
        (
            "DO bit",
            form(
                11,
                0x01,
                false,
                "pinned.example.com",
                A,
                Some(opt(1232, true, &[])),
            ),
        ),
        (
            "ECS GB /24",
            form(
                12,
                0x01,
                false,
                "pinned.example.com",
                A,
                Some(opt(1232, false, &[gb()])),
            ),
        ),
        (
            "ECS office /25",
            form(
                13,
                0x01,
                false,
                "pinned.example.com",
                A,
                Some(opt(1232, false, &[ecs(1, 25, &[81, 2, 69, 128])])),
            ),
        ),
        (
            "ECS lab /26 inside /24",
            form(
                14,
                0x01,
                false,
                "pinned.example.com",
                A,
                Some(opt(1232, false, &[ecs(1, 24, &[175, 16, 199])])),
            ),
        ),
        (
            "ECS /0 opt-out",
            form(
                15,
                0x01,
                false,
                "pinned.example.com",
                A,
                Some(opt(1232, false, &[ecs(1, 0, &[])])),
            ),
        ),
        (
            "ECS IPv6 JP /48",
            form(
                16,
                0x01,
                false,
                "pinned.example.com",
                A,
                Some(opt(
                    1232,
                    false,
                    &[ecs(2, 48, &[0x20, 0x01, 0x02, 0x18, 0, 0])],
                )),
            ),
        ),
        (
            "ECS IPv6 /0",
            form(
                17,
                0x01,
                false,
                "pinned.example.com",
                A,
                Some(opt(1232, false, &[ecs(2, 0, &[])])),
            ),
        ),
        (
            "ECS /32",
            form(
                18,
                0x01,
                false,
                "pinned.example.com",
                A,
                Some(opt(1232, false, &[ecs(1, 32, &[216, 160, 83, 56])])),
            ),
        ),
        (
            "ECS /20, odd bits clear",
            form(
                19,
                0x01,
                false,
                "pinned.example.com",
                A,
                Some(opt(1232, false, &[ecs(1, 20, &[81, 2, 64])])),
            ),
        ),
        (
            "ECS, unknown options and a client cookie",
            form(
                20,
                0x01,
                false,
                "pinned.example.com",
                A,
                Some(opt(
                    1232,
                    true,
                    &[(65001, vec![1, 2, 3]), gb(), (10, vec![7; 8])],
                )),
            ),
        ),
        (
            "ECS and DO, flat name",
            form(
                21,
                0x01,
                false,
                "flat.example.com",
                A,
                Some(opt(1232, true, &[gb()])),
            ),
        ),
    ]
}

#[tokio::test]
async fn fast_and_full_paths_give_the_same_answer() {
    let srv = TestServer::multi().await;
    let loaded = load_fixture(MULTI_POLICY, TEST_ZONES, TEST_GEO);
    same_answers(&srv, &planner::snapshot(&loaded), false).await;
}

/// The same forms against a signed zone: DO=1 answers carry the CNAME's pre-signed
/// RRSIG, byte for byte the same on the fast path (UDP and TCP) and the full path.
#[tokio::test]
async fn signed_fast_and_full_paths_give_the_same_answer() {
    let signed = common::dnssec::signed_dir("fastpath", 13, "");
    let loaded = steerdns::app::load(&common::dnssec::signed_inputs(&signed.dir)).unwrap();
    let running = steerdns::app::start(
        planner::snapshot(&loaded),
        &["127.0.0.1:0".parse().unwrap()],
    )
    .await
    .unwrap();
    let srv = TestServer {
        addr: running.addrs()[0],
        running,
    };
    same_answers(&srv, &planner::snapshot(&loaded), true).await;
}

/// `m` with the timestamp and hash of its server cookie zeroed (they depend on the
/// second it was made in).
fn timeless(mut m: Message) -> Message {
    if let Some(e) = m.edns.as_mut() {
        for (_, o) in e.options_mut().options.iter_mut() {
            if let EdnsOption::Unknown(10, data) = o {
                assert!(data.len() == 24, "our cookies are 24 bytes");
                data[12..].fill(0);
            }
        }
    }
    m
}

/// Every form of [`forms`] on the fast path in-process, then over UDP and TCP and
/// through the full path, all the same message; with `signed`, DO=1 answers hold the
/// CNAME and its RRSIG, and the others the CNAME alone.
async fn same_answers(srv: &TestServer, snap: &steerdns::plan::Snapshot, signed: bool) {
    let mut rng = SmallRng::seed_from_u64(1);
    let secrets = srv.running.cookies().load_full();
    for (what, q) in forms() {
        // In-process: these bytes take the fast path (with their DNS cookie judged as
        // the UDP and TCP loops judge it).
        let mut out = Vec::new();
        let src = "127.0.0.1".parse().unwrap();
        let now = steerdns::clock::now_secs();
        let cookie = steerdns::dns::wire::cookie_of(&q, &secrets, src, now);
        assert!(
            wire::answer(snap, &q, src, &mut out, now, &mut rng, cookie.reply()).is_some(),
            "{what}: not on the fast path"
        );
        let udp = raw(srv.addr, Proto::Udp, &q).await.expect("UDP answer");
        let tcp = raw(srv.addr, Proto::Tcp, &q).await.expect("TCP answer");
        let full = steerdns::dns::Handler::with_cookies(
            srv.running.live().clone(),
            Metrics::new(),
            srv.running.cookies().clone(),
        )
        .respond(&q, "127.0.0.1:5353".parse().unwrap(), Protocol::Tcp)
        .await
        .expect("full path answer");
        let udp = timeless(Message::from_vec(&udp).unwrap_or_else(|e| panic!("{what}: UDP: {e}")));
        let tcp = timeless(Message::from_vec(&tcp).unwrap_or_else(|e| panic!("{what}: TCP: {e}")));
        let full =
            timeless(Message::from_vec(&full).unwrap_or_else(|e| panic!("{what}: full: {e}")));
        assert_eq!(udp, full, "{what}: fast path (UDP) and full path differ");
        assert_eq!(tcp, full, "{what}: fast path (TCP) and full path differ");
        let dnssec_ok = udp.edns.as_ref().is_some_and(|e| e.flags().dnssec_ok);
        let expect = if signed && dnssec_ok { 2 } else { 1 };
        assert_eq!(udp.answers.len(), expect, "{what}: {udp:?}");
        if expect == 2 {
            assert_eq!(udp.answers[1].record_type(), RecordType::RRSIG, "{what}");
        }
    }
}

#[tokio::test]
async fn other_forms_take_the_full_path_and_are_still_answered() {
    let srv = TestServer::multi().await;
    let loaded = load_fixture(MULTI_POLICY, TEST_ZONES, TEST_GEO);
    let snap = planner::snapshot(&loaded);
    let mut rng = SmallRng::seed_from_u64(1);
    let gb = ecs(1, 24, &[81, 2, 69]);
    let cases: Vec<(&str, Vec<u8>, u8)> = vec![
        // (what, packet, expected rcode)
        ("zone data", form(1, 1, false, "example.com", 6, None), 0),
        (
            "NXDOMAIN",
            form(2, 1, false, "nope.example.com", 1, None),
            3,
        ),
        (
            "EDNS version 1",
            {
                let mut p = form(
                    3,
                    1,
                    false,
                    "pinned.example.com",
                    1,
                    Some(opt(1232, false, &[])),
                );
                let n = p.len();
                p[n - 5] = 1; // version byte of the OPT's TTL
                p
            },
            0,
        ),
        (
            "two ECS options",
            form(
                4,
                1,
                false,
                "pinned.example.com",
                1,
                Some(opt(1232, false, &[gb.clone(), gb.clone()])),
            ),
            1,
        ),
        (
            "ECS host bits set",
            form(
                5,
                1,
                false,
                "pinned.example.com",
                1,
                Some(opt(1232, false, &[ecs(1, 22, &[81, 2, 77])])),
            ),
            1,
        ),
        (
            "class CH",
            {
                let mut p = form(6, 1, false, "pinned.example.com", 1, None);
                let n = p.len();
                p[n - 1] = 3;
                p
            },
            5,
        ),
        (
            "AXFR over UDP",
            form(7, 1, false, "pinned.example.com", 252, None),
            5,
        ),
    ];
    for (what, q, rcode) in cases {
        let mut out = Vec::new();
        let src = "127.0.0.1".parse().unwrap();
        assert!(
            wire::answer(
                &snap,
                &q,
                src,
                &mut out,
                steerdns::clock::now_secs(),
                &mut rng,
                None
            )
            .is_none(),
            "{what}: took the fast path"
        );
        let a = raw(srv.addr, Proto::Udp, &q).await.expect("an answer");
        let got = if what == "EDNS version 1" {
            // BADVERS is 16: 0 in the header, 1 in the OPT's extended rcode.
            let m = Message::from_vec(&a).unwrap();
            u16::from(m.metadata.response_code) as u8
        } else {
            raw_rcode(&a)
        };
        let want = if what == "EDNS version 1" { 16 } else { rcode };
        assert_eq!(got, want, "{what}");
    }
}

/// Queries for names that are not steered, in the plain form the answer cache takes.
fn zone_forms() -> Vec<(&'static str, Vec<u8>)> {
    let gb = || ecs(1, 24, &[81, 2, 69]);
    let edns = |options: &[(u16, Vec<u8>)]| Some(opt(1232, false, options));
    vec![
        ("SOA", form(1, 0x01, false, "example.com", 6, None)),
        (
            "SOA, ECS",
            form(2, 0x01, false, "example.com", 6, edns(&[gb()])),
        ),
        (
            "NS and glue",
            form(3, 0x01, false, "example.com", 2, edns(&[gb()])),
        ),
        (
            "A, mixed case",
            form(4, 0x01, false, "NS1.Example.com", 1, None),
        ),
        (
            "AAAA, DO",
            form(
                5,
                0x01,
                true,
                "ns1.example.com",
                28,
                Some(opt(1232, true, &[])),
            ),
        ),
        (
            "in-zone CNAME",
            form(6, 0x01, false, "api.example.com", 1, edns(&[gb()])),
        ),
        ("MX", form(7, 0x01, false, "multi.example.com", 15, None)),
        (
            "big TXT, no EDNS: TC",
            form(8, 0x01, false, "big.example.com", 16, None),
        ),
        (
            "big TXT, ECS",
            form(9, 0x01, false, "big.example.com", 16, edns(&[gb()])),
        ),
        (
            "huge TXT: TC",
            form(10, 0x01, false, "huge.example.com", 16, edns(&[gb()])),
        ),
        (
            "NXDOMAIN, IPv6 ECS",
            form(
                11,
                0x01,
                false,
                "nope.example.com",
                1,
                edns(&[ecs(2, 48, &[0x20, 0x01, 0x02, 0x18, 0, 0])]),
            ),
        ),
        (
            "NODATA",
            form(
                12,
                0x01,
                false,
                "mail.example.com",
                28,
                edns(&[ecs(1, 0, &[])]),
            ),
        ),
        (
            "referral",
            form(13, 0x01, false, "www.sub.example.com", 1, None),
        ),
        (
            "out of zone: REFUSED",
            form(14, 0x01, false, "example.org", 1, edns(&[gb()])),
        ),
        (
            "payload 512",
            form(
                15,
                0x01,
                false,
                "big.example.com",
                16,
                Some(opt(512, false, &[gb()])),
            ),
        ),
    ]
}

#[tokio::test]
async fn cached_answers_are_the_full_paths() {
    // One UDP socket, so one thread and one cache: round 0 is a miss, rounds 1 and 2
    // are hits whatever the number of CPUs.
    let srv = TestServer::demo_with(&steerdns::app::DnsOptions {
        udp_sockets: 1,
        ..Default::default()
    })
    .await;
    let full = steerdns::dns::Handler::new(srv.running.live().clone(), Metrics::new());
    let src = "127.0.0.1:5353".parse().unwrap();
    for (what, mut q) in zone_forms() {
        // Three rounds from fresh client ports, each with its own id.
        for round in 0..3u16 {
            q[0..2].copy_from_slice(&(1000 + round).to_be_bytes());
            let want = full
                .respond(&q, src, Protocol::Udp)
                .await
                .expect("full path answer");
            let want = Message::from_vec(&want).unwrap();
            let got = raw(srv.addr, Proto::Udp, &q).await.expect("UDP answer");
            let got = Message::from_vec(&got).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(
                got, want,
                "{what}, round {round}: cached and full answers differ"
            );
        }
    }
}

#[tokio::test]
async fn a_new_snapshot_empties_the_cache() {
    let srv = TestServer::demo().await;
    // Not steered by the demo policy: answered from the zone (and cached).
    let q = form(1, 0x01, false, "flat.example.com", 1, None);
    for _ in 0..3 {
        let m = Message::from_vec(&raw(srv.addr, Proto::Udp, &q).await.unwrap()).unwrap();
        assert!(m.answers.is_empty(), "{m:?}");
    }
    // The multi-name policy steers it.
    let multi = load_fixture(MULTI_POLICY, TEST_ZONES, TEST_GEO);
    srv.running
        .live()
        .store(std::sync::Arc::new(planner::snapshot(&multi)));
    for _ in 0..3 {
        let m = Message::from_vec(&raw(srv.addr, Proto::Udp, &q).await.unwrap()).unwrap();
        assert_eq!(cname_of(&m), "only.example.net.");
    }
}
