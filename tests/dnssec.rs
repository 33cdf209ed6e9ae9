//! DNSSEC, checked by a real validator: BIND's `delv` with the zone's DS as its trust
//! anchor asks steerdns (through a small relay that adds an ECS option, since delv has
//! no `+subnet`) and must report "fully validated" for the steered CNAME from three
//! regions, for SOA, NS, DNSKEY, an NXDOMAIN and a NODATA. The fast path, the full path
//! and TCP give the same signed bytes.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::str::FromStr;

use common::dnssec::{delv, signed_dir, signed_inputs};
use common::unbound::{Mode as UnboundMode, Unbound};
use common::{raw, Proto};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::rdata::opt::{ClientSubnet, EdnsOption};
use hickory_proto::rr::{Name, RecordType};
use steerdns::app::{self, Running};
use steerdns::control::decide::planner;
use tokio::net::UdpSocket;

async fn serve(dir: &Path) -> Running {
    let loaded = app::load(&signed_inputs(dir)).unwrap_or_else(|e| panic!("does not load: {e}"));
    app::start(
        planner::snapshot(&loaded),
        &["127.0.0.1:0".parse().unwrap()],
    )
    .await
    .expect("bind loopback")
}

/// A UDP relay on loopback that adds `ecs` to each query's OPT record (the client a
/// resolver asks for) and passes the answers back as they are.
async fn ecs_relay(server: SocketAddr, ecs: &'static str) -> SocketAddr {
    let front = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = front.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_535];
        loop {
            let Ok((n, client)) = front.recv_from(&mut buf).await else {
                return;
            };
            let Ok(mut m) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let (net, len) = ecs.split_once('/').unwrap();
            let subnet = ClientSubnet::new(net.parse().unwrap(), len.parse().unwrap(), 0);
            let mut edns = m.edns.take().unwrap_or_default();
            edns.options_mut().insert(EdnsOption::Subnet(subnet));
            m.edns = Some(edns);
            let Some(answer) = raw(server, Proto::Udp, &m.to_vec().unwrap()).await else {
                continue;
            };
            let _ = front.send_to(&answer, client).await;
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread")]
async fn delv_validates_steered_answers_and_the_zone() {
    for algorithm in [13, 15] {
        let s = signed_dir(&format!("delv{algorithm}"), algorithm, "");
        let running = serve(&s.dir).await;
        let server = running.addrs()[0];
        // Three regions, each pinned to its CDN: the signed CNAME of each validates.
        for (ecs, target) in [
            ("2.125.160.216/29", "uk.cdn.example.net."),
            ("2001:218::/32", "asia.cdn.example.net."),
            ("192.0.2.0/24", "world.cdn.example.net."),
        ] {
            let relay = ecs_relay(server, ecs).await;
            let out = delv(&s.anchor, relay, false, "pinned.example.com", "CNAME");
            assert!(
                out.contains("; fully validated"),
                "alg {algorithm} {ecs}: {out}"
            );
            assert!(
                out.contains(&format!("CNAME\t{target}")),
                "alg {algorithm} {ecs}: {out}"
            );
            assert!(out.contains("RRSIG\tCNAME"), "{out}");
        }
        // The zone's own data, over UDP (the fast path and the cache) and over TCP.
        for tcp in [false, true] {
            for (name, qtype, expect) in [
                ("example.com", "SOA", "; fully validated"),
                ("example.com", "NS", "; fully validated"),
                ("example.com", "DNSKEY", "; fully validated"),
                ("flat.example.com", "CNAME", "; fully validated"),
                (
                    "nothing-here.example.com",
                    "A",
                    "; negative response, fully validated",
                ),
                (
                    "mail.example.com",
                    "TXT",
                    "; negative response, fully validated",
                ),
                // Two labels below the closest encloser: the wildcard's NSEC is a
                // second record (zones/denial.rs).
                (
                    "deep.missing.example.com",
                    "A",
                    "; negative response, fully validated",
                ),
                (
                    "a.b.c.pinned.example.com",
                    "AAAA",
                    "; negative response, fully validated",
                ),
            ] {
                let out = delv(&s.anchor, server, tcp, name, qtype);
                assert!(
                    out.contains(expect),
                    "alg {algorithm} {name} {qtype}: {out}"
                );
            }
        }
        let nx = delv(&s.anchor, server, false, "nothing-here.example.com", "A");
        assert!(nx.contains("NXDOMAIN"), "{nx}");
        running.stop().await.unwrap();
    }
}

/// The NSEC chain lists every steered name: the NSEC at a steered name says CNAME, and
/// no NSEC covers (denies) one.
#[tokio::test]
async fn the_nsec_chain_lists_every_steered_name() {
    let s = signed_dir("chain", 13, "");
    let running = serve(&s.dir).await;
    let server = running.addrs()[0];
    // `pinned0` sorts right after `pinned` (RFC 4034 §6.1): its NXDOMAIN proof is the
    // NSEC owned by the steered name.
    let mut owners = Vec::new();
    for name in ["pinned0.example.com.", "flat0.example.com."] {
        let m = ask_do(server, name, RecordType::A).await;
        for r in m
            .authorities
            .iter()
            .filter(|r| r.record_type() == RecordType::NSEC)
        {
            let text = r.to_string();
            owners.push(text);
        }
    }
    let all = owners.join("\n");
    for steered in ["pinned.example.com.", "flat.example.com."] {
        let at = all
            .lines()
            .find(|l| l.starts_with(steered))
            .unwrap_or_else(|| panic!("no NSEC at {steered} in:\n{all}"));
        assert!(at.contains("CNAME"), "{at}");
    }
    running.stop().await.unwrap();
}

async fn ask_do(server: SocketAddr, name: &str, qtype: RecordType) -> Message {
    let mut m = Message::new(7, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(Name::from_str(name).unwrap(), qtype));
    let mut edns = Edns::new();
    edns.set_dnssec_ok(true);
    edns.set_max_payload(1232);
    m.edns = Some(edns);
    let bytes = raw(server, Proto::Tcp, &m.to_vec().unwrap()).await.unwrap();
    Message::from_vec(&bytes).unwrap()
}

/// A server with a signed zone shows it: `/v1/state` lists the key as active with the
/// signatures' expiry, `/metrics` has `steerdns_dnssec_signature_expiry_seconds` (at
/// least `refresh` left, at most `validity`), the status page has its DNSSEC section,
/// and `steerdns explain` says the answer is signed and until when.
#[tokio::test(flavor = "multi_thread")]
async fn state_metrics_status_and_explain_show_signing() {
    use common::stack::{policy, scratch, Stack};
    let dir = scratch("dnssec-state");
    policy(&dir, "[100]", 1.0);
    let now = steerdns::clock::now_secs();
    let key = steerdns::dnssec::keygen(&dir.join("keys"), "example.com", 15, now).unwrap();
    let text = std::fs::read_to_string(dir.join("steering.yaml")).unwrap();
    std::fs::write(
        dir.join("steering.yaml"),
        format!("{text}dnssec:\n  keys: keys\n  validity: 10d\n  refresh: 4d\n"),
    )
    .unwrap();
    let stack = Stack::start(&dir).await;
    let state = stack.state().await;
    let d = &state["dnssec"];
    assert_eq!(d["keys"][0]["phase"], "active", "{state}");
    assert_eq!(d["keys"][0]["algorithm"], 15, "{state}");
    assert_eq!(d["keys"][0]["file"], key.display().to_string(), "{state}");
    let until = d["signed_until_unix"].as_u64().unwrap();
    assert!(
        (now + 4 * 86_400..=now + 10 * 86_400).contains(&until),
        "{state}"
    );
    let left = stack
        .metric("steerdns_dnssec_signature_expiry_seconds")
        .await
        .expect("the expiry gauge");
    assert!(
        (4.0 * 86_400.0 - 5.0..=10.0 * 86_400.0).contains(&left),
        "{left}"
    );
    let page = stack.text("/").await;
    assert!(page.contains("<h2>DNSSEC <a class=\"manual\""), "{page}");
    assert!(page.contains("<td>active</td>"), "{page}");

    let text = common::stack::explain_offline(&dir, "www.example.com", "81.2.69.160");
    assert!(
        text.contains("dnssec:  signed (DO=1 answers carry the CNAME's RRSIG), valid until 20"),
        "{text}"
    );
    drop(stack);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Aggressive NSEC caching (RFC 8198) never hides a steered name: a validating Unbound
/// with `aggressive-nsec: yes` (and no ECS: Unbound's subnetcache never synthesizes a
/// denial, DNSSEC-NOTES.md) asked 200 random nonexistent names gets each one NXDOMAIN,
/// validated, and synthesizes many of them from the NSEC records it cached; then every
/// steered name still resolves, validated. A chain that left the steered names out
/// (they are in no zone file) would make Unbound deny them.
#[tokio::test(flavor = "multi_thread")]
async fn aggressive_nsec_caching_never_hides_a_steered_name() {
    for tool in ["unbound", "unbound-control", "dig"] {
        if !common::etcd::have(tool) && !Path::new(&format!("/usr/sbin/{tool}")).exists() {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{tool} is required in CI (.ci/run installs it)");
            }
            eprintln!("SKIPPED: {tool} not installed");
            return;
        }
    }
    let s = signed_dir("aggressive", 13, "");
    let running = serve(&s.dir).await;
    let ds = steerdns::dnssec::ds(
        &s.dir.join("keys"),
        "example.com",
        steerdns::clock::now_secs(),
    )
    .unwrap();
    let unbound = Unbound::start(
        &s.dir.join("unbound"),
        running.addrs()[0],
        &ds,
        UnboundMode::Aggressive,
    );
    let mut denied = 0;
    for i in 0..200u32 {
        let name = format!("rnd-{:08x}.example.com", i.wrapping_mul(2_654_435_761));
        let (status, ad, _) = unbound.ask(&name, "A", None);
        assert!(
            status == "NXDOMAIN" && ad,
            "{name}: {status} ad={ad}\n{}",
            unbound.log()
        );
        denied += 1;
    }
    let synthesized = unbound.stat("num.query.aggressive.NXDOMAIN");
    eprintln!("{denied} random names denied, {synthesized} of them from cached NSEC records");
    assert!(
        synthesized >= 50,
        "Unbound synthesized {synthesized} denials: aggressive NSEC caching was not exercised"
    );
    let policy = std::fs::read_to_string(s.dir.join("steering.yaml")).unwrap();
    // The names under `hostnames:` (two spaces in, a colon after).
    let steered: Vec<&str> = policy
        .lines()
        .filter_map(|l| l.strip_prefix("  ")?.strip_suffix(':'))
        .filter(|n| !n.starts_with(' ') && n.ends_with(".example.com"))
        .collect();
    assert!(steered.len() >= 2, "{steered:?}");
    for name in steered {
        let (status, ad, target) = unbound.ask(name, "CNAME", None);
        assert!(
            status == "NOERROR" && ad && !target.is_empty(),
            "{name} after the burst: {status} ad={ad} {target}\n{}",
            unbound.log()
        );
    }
    drop(unbound);
    running.stop().await.unwrap();
}

/// `count` copies of `query` (ids 0..count) sent back to back from a socket bound to
/// `from`; the answers that came back (until none for 500 ms) and their largest size.
async fn flood_with(server: SocketAddr, from: &str, query: &Message, count: u16) -> (usize, usize) {
    let sock = UdpSocket::bind((from, 0)).await.unwrap();
    let mut q = query.clone();
    for id in 0..count {
        q.metadata.id = id;
        sock.send_to(&q.to_vec().unwrap(), server).await.unwrap();
    }
    let (mut answered, mut largest) = (0, 0);
    let mut buf = vec![0u8; 4096];
    while let Ok(Ok((n, _))) = tokio::time::timeout(
        std::time::Duration::from_millis(500),
        sock.recv_from(&mut buf),
    )
    .await
    {
        let m = Message::from_vec(&buf[..n]).unwrap();
        assert!(!m.metadata.truncation, "slip 0: no truncated answers");
        answered += 1;
        largest = largest.max(n);
    }
    (answered, largest)
}

/// Response rate limiting counts answers by their size: a DO=1 query for a name
/// missing from a signed zone gets an NXDOMAIN with its NSEC proofs and signatures,
/// several times the size of the plain NXDOMAIN, and a burst of them is limited after
/// a fraction of the answers a burst of plain queries gets.
#[tokio::test(flavor = "multi_thread")]
async fn the_rate_limit_counts_large_signed_answers_by_their_size() {
    use steerdns::dns::rrl::{RrlConfig, UNIT};
    let s = signed_dir("rrl", 13, "");
    let loaded = app::load(&signed_inputs(&s.dir)).unwrap_or_else(|e| panic!("{e}"));
    const RATE: u32 = 30;
    let opts = app::DnsOptions {
        rrl: RrlConfig {
            rate: RATE,
            slip: 0,
            exempt: vec![],
            ..RrlConfig::default()
        },
        ..app::DnsOptions::default()
    };
    let running = app::start_with_options(
        planner::snapshot(&loaded),
        &["127.0.0.1:0".parse().unwrap()],
        steerdns::metrics::Metrics::new(),
        &opts,
    )
    .await
    .unwrap();
    let server = running.addrs()[0];
    let missing = Name::from_str("no-such-name.example.com.").unwrap();
    let mut plain = Message::new(1, MessageType::Query, OpCode::Query);
    plain.add_query(Query::query(missing.clone(), RecordType::A));
    let mut signed = plain.clone();
    let mut edns = Edns::new();
    edns.set_dnssec_ok(true);
    edns.set_max_payload(1232);
    signed.edns = Some(edns);
    // Both floods at once, from two /24s: should a second begin during them, both get
    // a new budget at the same moment.
    let ((plain_answered, plain_size), (signed_answered, signed_size)) = tokio::join!(
        flood_with(server, "127.0.30.1", &plain, 200),
        flood_with(server, "127.0.31.1", &signed, 200),
    );
    assert!(plain_size <= UNIT, "a plain NXDOMAIN of {plain_size} bytes");
    assert!(
        signed_size > UNIT,
        "a signed NXDOMAIN of {signed_size} bytes"
    );
    let cost = 1 + (signed_size - 1) / UNIT;
    // The plain ones: one unit each, the whole budget (twice, at most, across a new
    // second). The signed ones: `cost` units each.
    assert!(
        (RATE as usize..=2 * RATE as usize).contains(&plain_answered),
        "plain: {plain_answered}"
    );
    assert!(
        signed_answered <= plain_answered.div_ceil(cost) + 1,
        "signed answers of {signed_size} bytes ({cost} units each): {signed_answered}, plain: {plain_answered}"
    );
    running.stop().await.unwrap();
}
