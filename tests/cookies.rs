//! DNS cookies (RFC 7873, RFC 9018 server cookies) over real sockets: `dig +cookie`
//! twice against `steerdns serve`, ISC genreport's cookie probes (`ednscookie`,
//! `edns1cookie`, `bind11`, `dig11`, and `dig`'s own checks), malformed lengths, the fast path, the answer
//! cache and the full path giving the same bytes, a restart keeping cookies valid, the
//! rate limiter (a resolver with a valid cookie is never limited by a flood from its
//! /24; a limited client with a client cookie gets BADCOOKIE), and a set sharing its
//! secret through etcd across a rotation.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::demo::Demo;
use common::etcd::{require_etcd, EtcdSet};
use common::stack::{policy, probe, scratch, Stack};
use common::*;
use hickory_proto::op::Message;
use hickory_proto::rr::RecordType;
use hickory_server::net::xfer::Protocol;
use rand::SeedableRng;
use steerdns::dns::rrl::RrlConfig;
use steerdns::dns::{cookie, wire};
use steerdns::metrics::Metrics;

const CLIENT: [u8; 8] = [0x24, 0x64, 0xc4, 0xab, 0xcf, 0x10, 0xc9, 0x57];

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// `name` type A with an OPT (payload 1232, EDNS `version`) holding `options`.
fn with_options(id: u16, name: &str, version: u8, options: &[(u16, &[u8])]) -> Vec<u8> {
    let mut opt = opt_record(1232, false, options);
    opt[6] = version;
    packet(id, 0x0100, [1, 0, 0, 1], &[&question(name, 1, 1), &opt])
}

/// A query for `name` with a COOKIE option `data`.
fn with_cookie(id: u16, name: &str, data: &[u8]) -> Vec<u8> {
    with_options(id, name, 0, &[(10, data)])
}

/// The COOKIE option data of an answer's OPT, if any.
fn cookie_of(answer: &[u8]) -> Option<Vec<u8>> {
    let m = Message::from_vec(answer).expect("decodable answer");
    let opt = m.edns.as_ref()?;
    opt.options().options.iter().find_map(|(_, o)| match o {
        hickory_proto::rr::rdata::opt::EdnsOption::Unknown(10, data) => Some(data.clone()),
        _ => None,
    })
}

/// The full rcode (header and OPT's extended bits) of an answer.
fn full_rcode(answer: &[u8]) -> u16 {
    let m = Message::from_vec(answer).unwrap();
    u16::from(m.metadata.response_code)
}

/// Whether `reply` (client cookie + server cookie) is a version 1 cookie for `client`
/// at `ip` made with `secret`.
fn made_with(secret: &[u8; 16], client: &[u8], reply: &[u8], ip: IpAddr) -> bool {
    let stamp = u32::from_be_bytes(reply[12..16].try_into().unwrap());
    let c: [u8; 8] = client.try_into().unwrap();
    reply.len() == 24
        && reply[..8] == *client
        && cookie::server_cookie(secret, &c, stamp, ip)[..] == reply[8..]
}

const LOCAL: &str = "127.0.0.1";

fn local() -> IpAddr {
    LOCAL.parse().unwrap()
}

/// Every kind of answer: steered (fast path), zone data (the answer cache), NXDOMAIN,
/// REFUSED, and the handler's errors; with their rcodes.
fn every_path() -> Vec<(&'static str, Vec<u8>, u16)> {
    let c: &[u8] = &CLIENT;
    let mut notimp = with_cookie(7, "www.example.com.", c);
    notimp[2] = 0x10; // opcode STATUS
    let no_question = packet(
        8,
        0x0100,
        [0, 0, 0, 1],
        &[&opt_record(1232, false, &[(10, c)])],
    );
    vec![
        ("steered", with_cookie(1, "www.example.com.", c), 0),
        (
            "zone data",
            with_options(2, "example.com.", 0, &[(10, c)]),
            0,
        ),
        ("NXDOMAIN", with_cookie(3, "nope.example.com.", c), 3),
        ("outside our zones", with_cookie(4, "example.org.", c), 5),
        ("opcode STATUS", notimp, 4),
        ("no question", no_question, 1),
    ]
}

#[tokio::test]
async fn ednscookie_every_answer_carries_the_client_cookie_and_ours() {
    // genreport's `ednscookie`: EDNS and a client cookie; the answer has a COOKIE whose
    // first 8 bytes are the client's, 16 to 40 bytes long.
    let srv = TestServer::demo().await;
    for proto in BOTH {
        for (what, q, rcode) in every_path() {
            let a = raw(srv.addr, proto, &q).await.expect("an answer");
            assert_eq!(full_rcode(&a), rcode, "{what} {proto:?}");
            let c = cookie_of(&a).unwrap_or_else(|| panic!("{what} {proto:?}: no cookie"));
            assert!((16..=40).contains(&c.len()), "{what}: {} bytes", c.len());
            assert_eq!(c[..8], CLIENT, "{what} {proto:?}: the client cookie");
            assert_eq!(c[8], 1, "{what}: server cookie version 1");
            let secrets = srv.running.cookies().load();
            assert!(
                made_with(&secrets.current, &CLIENT, &c, local()),
                "{what} {proto:?}"
            );
        }
    }
}

#[tokio::test]
async fn edns1cookie_gets_badvers() {
    // genreport's `edns1cookie`: EDNS version 1 with a cookie is BADVERS, version 0.
    let srv = TestServer::demo().await;
    for proto in BOTH {
        let q = with_options(9, "www.example.com.", 1, &[(10, &CLIENT)]);
        let a = raw(srv.addr, proto, &q).await.expect("an answer");
        assert_eq!(full_rcode(&a), 16, "{proto:?}");
        let m = Message::from_vec(&a).unwrap();
        assert_eq!(m.edns.as_ref().unwrap().version(), 0);
        assert!(m.answers.is_empty());
        if let Some(c) = cookie_of(&a) {
            assert_eq!(c[..8], CLIENT);
        }
    }
}

#[tokio::test]
async fn bind11_and_dig11_are_answered_with_the_cookie() {
    // genreport's `bind11` (EDNS 0, payload 4096, DO, cookie 0102030405060708, no RD,
    // no AD: what BIND 9.11's named sends) and `dig11` (EDNS 0, cookie, RD and AD:
    // what dig 9.11 sends), on the SOA as genreport asks, and on a steered name.
    let srv = TestServer::demo().await;
    let client: [u8; 8] = [1, 2, 3, 4, 5, 6, 7, 8];
    for (probe, flags, dnssec_ok) in [("bind11", 0x0000u16, true), ("dig11", 0x0120, false)] {
        for (name, qtype) in [("example.com.", 6u16), ("www.example.com.", 1)] {
            let opt = opt_record(4096, dnssec_ok, &[(10, &client)]);
            let q = packet(50, flags, [1, 0, 0, 1], &[&question(name, qtype, 1), &opt]);
            for proto in BOTH {
                let a = raw(srv.addr, proto, &q).await.expect("an answer");
                let what = format!("{probe} {name} {proto:?}");
                assert_eq!(full_rcode(&a), 0, "{what}");
                let m = Message::from_vec(&a).unwrap();
                assert!(m.metadata.authoritative, "{what}: AA");
                assert_eq!(m.answers.len(), 1, "{what}");
                let opt = m.edns.as_ref().expect("an OPT");
                assert_eq!(opt.flags().dnssec_ok, dnssec_ok, "{what}: DO copied");
                let c = cookie_of(&a).unwrap_or_else(|| panic!("{what}: no cookie"));
                assert_eq!((c.len(), &c[..8]), (24, &client[..]), "{what}");
            }
        }
    }
}

#[tokio::test]
async fn a_cookie_of_a_wrong_length_is_formerr() {
    // RFC 7873 §5.2.2: shorter than 8, 9 to 15, longer than 40; and two of them.
    let srv = TestServer::demo().await;
    for proto in BOTH {
        for len in [0usize, 1, 7, 9, 15, 41] {
            for name in ["www.example.com.", "example.com."] {
                let q = with_cookie(10, name, &vec![5; len]);
                let a = raw(srv.addr, proto, &q).await.expect("an answer");
                assert_eq!(full_rcode(&a), 1, "{name} {len} bytes {proto:?}");
                assert!(cookie_of(&a).is_none(), "{len}: no cookie to answer with");
            }
        }
        let q = with_options(11, "www.example.com.", 0, &[(10, &CLIENT), (10, &CLIENT)]);
        let a = raw(srv.addr, proto, &q).await.expect("an answer");
        assert_eq!(full_rcode(&a), 1, "two cookies {proto:?}");
    }
}

#[tokio::test]
async fn a_valid_server_cookie_is_echoed_and_a_foreign_one_replaced_without_badcookie() {
    let srv = TestServer::demo().await;
    for proto in BOTH {
        let first = raw(
            srv.addr,
            proto,
            &with_cookie(12, "www.example.com.", &CLIENT),
        )
        .await
        .unwrap();
        let ours = cookie_of(&first).unwrap();
        // Presented again (dig's second query): accepted, echoed, NOERROR.
        for name in ["www.example.com.", "example.com.", "nope.example.com."] {
            let a = raw(srv.addr, proto, &with_cookie(13, name, &ours))
                .await
                .unwrap();
            assert_ne!(full_rcode(&a), 23, "{name}: BADCOOKIE");
            assert_eq!(cookie_of(&a).unwrap(), ours, "{name} {proto:?}: echoed");
        }
        // Another server's cookie (8 to 32 bytes), or ours with a bit flipped: answered
        // as usual with a fresh one of ours (cookies are not required).
        let mut flipped = ours.clone();
        flipped[23] ^= 1;
        for foreign in [
            flipped,
            [&CLIENT[..], &[0xaa; 8]].concat(),
            [&CLIENT[..], &[0xbb; 32]].concat(),
        ] {
            let a = raw(
                srv.addr,
                proto,
                &with_cookie(14, "www.example.com.", &foreign),
            )
            .await
            .unwrap();
            assert_eq!(full_rcode(&a), 0, "{proto:?}");
            let c = cookie_of(&a).unwrap();
            let secrets = srv.running.cookies().load();
            assert!(made_with(&secrets.current, &CLIENT, &c, local()));
        }
    }
}

/// The answer's bytes with the server cookie's timestamp and hash (the last 12 bytes:
/// the COOKIE option ends the OPT, the last record) zeroed.
fn timeless(mut a: Vec<u8>) -> Vec<u8> {
    let n = a.len();
    a[n - 12..].fill(0);
    a
}

#[tokio::test]
async fn fast_path_cache_and_full_path_give_the_same_bytes() {
    let srv = TestServer::demo().await;
    let full = steerdns::dns::Handler::with_cookies(
        srv.running.live().clone(),
        Metrics::new(),
        srv.running.cookies().clone(),
    );
    let secrets = srv.running.cookies().load_full();
    let now = steerdns::clock::now_secs() as u32;
    let ours = |client: &[u8; 8]| {
        [
            &client[..],
            &cookie::server_cookie(&secrets.current, client, now, local()),
        ]
        .concat()
    };
    let valid = ours(&CLIENT);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "steered, client cookie",
            with_cookie(20, "www.example.com.", &CLIENT),
        ),
        (
            "steered, valid cookie",
            with_cookie(21, "www.example.com.", &valid),
        ),
        (
            "steered, ECS and cookie",
            with_options(
                22,
                "www.example.com.",
                0,
                &[(8, &[0, 1, 24, 0, 81, 2, 69]), (10, &valid)],
            ),
        ),
        (
            "zone data, client cookie",
            with_cookie(23, "example.com.", &CLIENT),
        ),
        (
            "zone data, valid cookie",
            with_cookie(24, "example.com.", &valid),
        ),
        (
            "NXDOMAIN, ECS and cookie",
            with_options(
                25,
                "nope.example.com.",
                0,
                &[(8, &[0, 1, 24, 0, 81, 2, 69]), (10, &valid)],
            ),
        ),
    ];
    // The steered forms take the fast path with their cookie, the others the cache.
    let snap = srv.running.live().load_full();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    for (what, q) in &cases {
        let judged = wire::cookie_of(q, &secrets, local(), now.into());
        assert!(judged.reply().is_some(), "{what}");
        let mut out = Vec::new();
        let fast = wire::answer(
            &snap,
            q,
            local(),
            &mut out,
            now.into(),
            &mut rng,
            judged.reply(),
        );
        assert_eq!(fast.is_some(), what.starts_with("steered"), "{what}");
        // Without the judged cookie the fast path leaves the query to the full path.
        let blind = wire::answer(&snap, q, local(), &mut out, now.into(), &mut rng, None);
        assert!(blind.is_none(), "{what}");
    }
    for (what, q) in cases {
        // Twice: the second UDP answer to zone data comes from the answer cache.
        for round in 0..2 {
            for proto in BOTH {
                let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
                let src = sock.local_addr().unwrap();
                let served = match proto {
                    Proto::Udp => {
                        sock.send_to(&q, srv.addr).await.unwrap();
                        let mut buf = vec![0u8; 4096];
                        let (n, _) =
                            tokio::time::timeout(Duration::from_secs(2), sock.recv_from(&mut buf))
                                .await
                                .unwrap()
                                .unwrap();
                        buf.truncate(n);
                        buf
                    }
                    Proto::Tcp => raw(srv.addr, proto, &q).await.unwrap(),
                };
                let p = if proto == Proto::Udp {
                    Protocol::Udp
                } else {
                    Protocol::Tcp
                };
                let mine = full.respond(&q, src, p).await.expect("a full path answer");
                // The same message (the fast path compresses the owner, hickory does
                // not), the server cookie's time and hash aside.
                let decoded = |a: &[u8]| Message::from_vec(&timeless(a.to_vec())).unwrap();
                assert_eq!(
                    decoded(&served),
                    decoded(&mine),
                    "{what} {proto:?} round {round}"
                );
                assert!(cookie_of(&served).is_some(), "{what}");
                // A valid young cookie is echoed: the same cookie, time and hash included.
                if what.contains("valid") {
                    assert_eq!(cookie_of(&served), Some(valid.clone()), "{what} {proto:?}");
                    assert_eq!(cookie_of(&mine), Some(valid.clone()), "{what} {proto:?}");
                }
            }
        }
    }
}

#[tokio::test]
async fn a_resolver_with_a_valid_cookie_is_never_limited_by_a_flood_from_its_slash_24() {
    let opts = steerdns::app::DnsOptions {
        rrl: RrlConfig {
            rate: 40,
            slip: 1,
            exempt: vec![],
            ..RrlConfig::default()
        },
        ..steerdns::app::DnsOptions::default()
    };
    let srv = TestServer::demo_with(&opts).await;
    let flood: IpAddr = "127.0.0.2".parse().unwrap();
    let resolver: IpAddr = "127.0.0.3".parse().unwrap();
    let newcomer: IpAddr = "127.0.0.4".parse().unwrap();
    let wait = Duration::from_secs(2);
    // The resolver learns its cookie first.
    let first = raw_from(
        srv.addr,
        resolver,
        Proto::Udp,
        &with_cookie(30, "www.example.com.", &CLIENT),
        wait,
    )
    .await
    .unwrap();
    let valid = cookie_of(&first).unwrap();
    let (mut flood_tc, mut flood_ok) = (0, 0);
    for i in 0..300u16 {
        // The spoofed flood, without cookies.
        let a = raw_from(
            srv.addr,
            flood,
            Proto::Udp,
            &encoded("www.example.com.", RecordType::A, i),
            wait,
        )
        .await
        .expect("slip 1: every limited query gets a TC answer");
        if a[2] & 0x02 != 0 {
            flood_tc += 1;
        } else {
            flood_ok += 1;
        }
        if i % 10 == 0 {
            // The resolver in the same /24, with its valid cookie: answered in full.
            let a = raw_from(
                srv.addr,
                resolver,
                Proto::Udp,
                &with_cookie(i, "www.example.com.", &valid),
                wait,
            )
            .await
            .expect("the resolver is answered");
            assert_eq!(a[2] & 0x02, 0, "query {i}: the resolver was truncated");
            assert_eq!(
                full_rcode(&a),
                0,
                "query {i}: the resolver got {}",
                full_rcode(&a)
            );
            assert_eq!(counts_of(&a)[1], 1, "query {i}: an answer");
            assert_eq!(cookie_of(&a).unwrap(), valid, "echoed");
        }
    }
    assert!(
        flood_tc >= 100,
        "the flood is limited: {flood_tc} truncated, {flood_ok} answered"
    );
    // A newcomer of the same /24 while it is limited, with a client cookie only:
    // BADCOOKIE with a fresh server cookie (not the slip), which then gets it answered.
    let mut badcookie = None;
    for i in 0..200u16 {
        let _ = raw_from(
            srv.addr,
            flood,
            Proto::Udp,
            &encoded("www.example.com.", RecordType::A, i),
            wait,
        )
        .await;
        let a = raw_from(
            srv.addr,
            newcomer,
            Proto::Udp,
            &with_cookie(i, "www.example.com.", &[7; 8]),
            wait,
        )
        .await
        .expect("slip 1: an answer");
        if full_rcode(&a) == 23 {
            badcookie = Some(a);
            break;
        }
    }
    let a = badcookie.expect("a limited client with a client cookie gets BADCOOKIE");
    assert_eq!(a[2] & 0x02, 0, "BADCOOKIE is not truncated");
    assert_eq!(a[3] & 0x0f, 7, "header rcode: BADCOOKIE's low bits");
    assert_eq!(counts_of(&a)[1], 0, "no records");
    let fresh = cookie_of(&a).expect("BADCOOKIE carries a fresh cookie");
    assert_eq!(fresh[..8], [7; 8]);
    let secrets = srv.running.cookies().load();
    assert!(made_with(&secrets.current, &[7; 8], &fresh, newcomer));
    // Retried with it, while the /24 is still flooded: answered in full.
    for i in 0..20u16 {
        let _ = raw_from(
            srv.addr,
            flood,
            Proto::Udp,
            &encoded("www.example.com.", RecordType::A, i),
            wait,
        )
        .await;
        let a = raw_from(
            srv.addr,
            newcomer,
            Proto::Udp,
            &with_cookie(i, "www.example.com.", &fresh),
            wait,
        )
        .await
        .expect("answered");
        assert_eq!((full_rcode(&a), a[2] & 0x02), (0, 0), "retry {i}");
    }
    // A flooder presenting garbage as a server cookie is still limited (BADCOOKIE, not
    // an answer).
    let garbage = [
        &[7u8; 8][..],
        &[1, 0, 0, 0, 0, 0, 0, 0, 9, 9, 9, 9, 9, 9, 9, 9],
    ]
    .concat();
    let mut limited = false;
    for i in 0..200u16 {
        let a = raw_from(
            srv.addr,
            flood,
            Proto::Udp,
            &with_cookie(i, "www.example.com.", &garbage),
            wait,
        )
        .await
        .unwrap();
        if full_rcode(&a) == 23 {
            limited = true;
            break;
        }
    }
    assert!(
        limited,
        "an invalid server cookie gets no budget of its own"
    );
}

/// The COOKIE line of dig's output (`; COOKIE: hex (good)`): the hex and the rest.
fn dig_cookie(out: &str) -> Option<(String, String)> {
    let line = out.lines().find(|l| l.starts_with("; COOKIE: "))?;
    let rest = line.trim_start_matches("; COOKIE: ");
    let (hex, tail) = rest.split_once(' ').unwrap_or((rest, ""));
    Some((hex.to_string(), tail.to_string()))
}

fn dig(port: u16, cookie: &str) -> String {
    let out = std::process::Command::new("dig")
        .args([
            "@127.0.0.1",
            "-p",
            &port.to_string(),
            "www.example.com",
            "A",
            "+time=2",
            "+tries=2",
        ])
        .arg(cookie)
        .output()
        .expect("dig runs");
    assert!(out.status.success(), "dig: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn dig_cookie_twice_then_a_restart_keeps_it_valid() {
    if !require_dig("dig_cookie_twice_then_a_restart_keeps_it_valid") {
        return;
    }
    let mut demo = Demo::start("cookies", &repo(TEST_GEO), &[], |_| {});
    let first = dig(demo.dns, "+cookie");
    let (cookie, said) = dig_cookie(&first).unwrap_or_else(|| panic!("no cookie: {first}"));
    assert_eq!(cookie.len(), 48, "{first}");
    assert!(
        said.contains("good"),
        "dig checks the client cookie: {first}"
    );
    // The second query presents it (dig's +cookie=…): accepted, echoed, no BADCOOKIE.
    let second = dig(demo.dns, &format!("+cookie={cookie}"));
    assert!(second.contains("status: NOERROR"), "{second}");
    assert!(!second.contains("BADCOOKIE"), "{second}");
    assert_eq!(dig_cookie(&second).unwrap().0, cookie, "{second}");
    let m = demo.metrics();
    assert!(
        metric(&m, "steerdns_cookies_total{result=\"client_only\"}") >= 1.0,
        "{m}"
    );
    assert!(
        metric(&m, "steerdns_cookies_total{result=\"valid\"}") >= 1.0,
        "{m}"
    );
    // The secret is kept, owner-only, and made the cookie.
    let file = demo.dir.join("state/cookie-secret");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let kept: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let secret: [u8; 16] = unhex(kept["current"].as_str().unwrap()).try_into().unwrap();
    let bytes = unhex(&cookie);
    assert!(made_with(&secret, &bytes[..8], &bytes, local()));
    // After a restart the cookie is still ours: echoed, not replaced.
    demo.restart();
    let third = dig(demo.dns, &format!("+cookie={cookie}"));
    assert!(third.contains("status: NOERROR"), "{third}");
    assert_eq!(dig_cookie(&third).unwrap().0, cookie, "{third}");
    let m = demo.metrics();
    assert!(
        metric(&m, "steerdns_cookies_total{result=\"valid\"}") >= 1.0,
        "after the restart: {m}"
    );
    assert_eq!(
        metric(&m, "steerdns_cookies_total{result=\"invalid\"}"),
        0.0,
        "{m}"
    );
    // A malformed cookie (dig sends what it is given): FORMERR.
    let bad = dig(demo.dns, "+cookie=0102030405");
    assert!(bad.contains("status: FORMERR"), "{bad}");
    assert!(
        bad.contains("EDE: 0") && bad.contains("malformed COOKIE"),
        "{bad}"
    );
}

/// The set's cookie record, as etcdctl reads it.
fn shared_record(etcd: &EtcdSet) -> serde_json::Value {
    let out = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", etcd.endpoints().join(",")))
        .args(["get", "/steerdns/cookie", "--print-value-only"])
        .output()
        .expect("etcdctl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or(serde_json::Value::Null)
}

fn secret_of(v: &serde_json::Value, field: &str) -> Option<[u8; 16]> {
    Some(unhex(v[field].as_str()?).try_into().unwrap())
}

/// Asks `dns` for www.example.com with `cookie`; the answer's cookie.
async fn cookie_from(dns: SocketAddr, data: &[u8]) -> Vec<u8> {
    let a = raw(dns, Proto::Udp, &with_cookie(40, "www.example.com.", data))
        .await
        .expect("an answer");
    assert_eq!(full_rcode(&a), 0);
    cookie_of(&a).expect("a cookie")
}

#[tokio::test]
async fn a_set_shares_its_secret_and_accepts_the_previous_one_after_a_rotation() {
    if !require_etcd("a_set_shares_its_secret_and_accepts_the_previous_one_after_a_rotation") {
        return;
    }
    let etcd = EtcdSet::start("cookies").await;
    let cdn = common::mock_cdn::MockCdn::start(common::mock_cdn::Mode::Healthy).await;
    let mut nodes = Vec::new();
    for name in ["ns1", "ns2"] {
        let dir = scratch(&format!("cookies-{name}"));
        policy(&dir, "[50, 100]", 1.0);
        probe(&dir, "a", &cdn.url("/a"), 1);
        probe(&dir, "b", &cdn.url("/b"), 1);
        let opts = etcd.node_options(name, &["ns1", "ns2"]);
        nodes.push(Stack::start_node(&dir, name, opts).await);
    }
    // The first node to find no record created it; both serve its secret.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let record = loop {
        let r = shared_record(&etcd);
        if let Some(current) = secret_of(&r, "current") {
            let a = cookie_from(nodes[0].dns, &CLIENT).await;
            let b = cookie_from(nodes[1].dns, &CLIENT).await;
            if made_with(&current, &CLIENT, &a, local())
                && made_with(&current, &CLIENT, &b, local())
            {
                break r;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the set never shared a secret: {r}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // A cookie from node A is valid on node B: echoed (an invalid one is replaced),
    // counted valid.
    let from_a = cookie_from(nodes[0].dns, &CLIENT).await;
    assert_eq!(cookie_from(nodes[1].dns, &from_a).await, from_a);
    // As an operator checks it: `dig +cookie` at node A, then that cookie at node B.
    if require_dig("a_set_shares_its_secret_and_accepts_the_previous_one_after_a_rotation") {
        let (a, b) = (nodes[0].dns.port(), nodes[1].dns.port());
        let (first, second) = tokio::task::spawn_blocking(move || {
            let first = dig(a, "+cookie");
            let (cookie, _) = dig_cookie(&first).expect("a cookie from node A");
            (first, dig(b, &format!("+cookie={cookie}")))
        })
        .await
        .unwrap();
        assert!(first.contains("status: NOERROR"), "{first}");
        assert!(second.contains("status: NOERROR"), "{second}");
        let (mine, _) = dig_cookie(&first).unwrap();
        let (echoed, _) = dig_cookie(&second).expect("a cookie from node B");
        // Node B echoed node A's cookie: it is valid there.
        assert_eq!(echoed, mine, "{second}");
    }
    let valid = nodes[1]
        .metric("steerdns_cookies_total{result=\"valid\"}")
        .await;
    assert!(valid.unwrap_or(0.0) >= 1.0, "{valid:?}");
    // A cookie made ten minutes ago under the set's secret: valid on both (echoed).
    let old = secret_of(&record, "current").unwrap();
    let then = steerdns::clock::now_secs() as u32 - 600;
    let aged = [
        &CLIENT[..],
        &cookie::server_cookie(&old, &CLIENT, then, local()),
    ]
    .concat();
    for n in &nodes {
        assert_eq!(cookie_from(n.dns, &aged).await, aged);
    }
    // The record made two days ago: the first node to see it rotates it, keeping the
    // old secret as the previous.
    let mut stale = record.clone();
    stale["made"] = serde_json::json!(steerdns::clock::now_secs() - 2 * 86_400);
    let (ok, said) = etcd.put_as(None, "/steerdns/cookie", &stale.to_string());
    assert!(ok, "{said}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let new = loop {
        let r = shared_record(&etcd);
        if secret_of(&r, "previous") == Some(old) {
            let new = secret_of(&r, "current").unwrap();
            assert_ne!(new, old);
            break new;
        }
        assert!(tokio::time::Instant::now() < deadline, "never rotated: {r}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Both nodes follow: fresh cookies under the new secret…
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    for n in &nodes {
        loop {
            let c = cookie_from(n.dns, &[9; 8]).await;
            if made_with(&new, &[9; 8], &c, local()) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "a node kept the old secret"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // …and the cookie made under the old one still valid: echoed.
        assert_eq!(
            cookie_from(n.dns, &aged).await,
            aged,
            "the previous secret is accepted"
        );
        // The `cookie` key is one of the set's: read by the watch, refused by none.
        let refused = n.metric("steerdns_etcd_refused_keys").await;
        assert_eq!(refused, Some(0.0), "the cookie key refused by the view");
    }
    for n in nodes {
        n.stop().await;
    }
}
