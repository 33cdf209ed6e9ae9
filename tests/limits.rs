//! Abuse limits over real sockets: response rate limiting against a spoofed-source flood
//! (clients on loopback aliases: all of 127.0.0.0/8 is local on Linux), and the TCP
//! limits (connections, queries per connection, pipelining), none of which may starve
//! anyone else.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use hickory_proto::op::Message;
use hickory_proto::rr::RecordType;
use steerdns::app::{self, DnsOptions};
use steerdns::control::decide::planner;
use steerdns::dns::rrl::RrlConfig;
use steerdns::dns::tcp::TcpLimits;
use steerdns::metrics::Metrics;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

async fn server(opts: DnsOptions, metrics: Metrics) -> TestServer {
    let loaded = load_fixture(DEMO_POLICY, TEST_ZONES, TEST_GEO);
    let running = app::start_with_options(
        planner::snapshot(&loaded),
        &["127.0.0.1:0".parse().unwrap()],
        metrics,
        &opts,
    )
    .await
    .expect("bind loopback");
    TestServer {
        addr: running.addrs()[0],
        running,
    }
}

/// `www.example.com A` with the id `id`, encoded.
fn www(id: u16) -> Vec<u8> {
    encoded("www.example.com.", RecordType::A, id)
}

/// What a UDP client bound to `from` got back for `count` queries sent back to back.
#[derive(Debug, Default)]
struct Tally {
    answered: usize,
    slipped: usize,
    silent: usize,
}

async fn flood(server: SocketAddr, from: &str, count: u16) -> Tally {
    floods(server, &[from], count).await.remove(0)
}

/// As [`flood`], from several addresses at once, their queries interleaved: a tally per
/// address.
async fn floods(server: SocketAddr, from: &[&str], count: u16) -> Vec<Tally> {
    let mut socks = Vec::new();
    for f in from {
        socks.push(UdpSocket::bind(format!("{f}:0")).await.expect("bind alias"));
    }
    for id in 0..count {
        for sock in &socks {
            sock.send_to(&www(id), server).await.unwrap();
        }
    }
    let mut tallies = Vec::new();
    let mut buf = vec![0u8; 4096];
    for sock in &socks {
        let mut t = Tally::default();
        // Replies come within milliseconds; stop after a quiet spell.
        while let Ok(Ok((n, _))) =
            tokio::time::timeout(Duration::from_millis(500), sock.recv_from(&mut buf)).await
        {
            let m = Message::from_vec(&buf[..n]).expect("decodable reply");
            if m.metadata.truncation {
                assert!(m.answers.is_empty(), "a slip carries no records");
                t.slipped += 1;
            } else {
                assert_eq!(m.answers.len(), 1, "{m:?}");
                t.answered += 1;
            }
        }
        t.silent = usize::from(count) - t.answered - t.slipped;
        tallies.push(t);
    }
    tallies
}

fn no_exemptions(rate: u32, slip: u32) -> DnsOptions {
    DnsOptions {
        rrl: RrlConfig {
            rate,
            slip,
            exempt: vec![],
            ..RrlConfig::default()
        },
        ..DnsOptions::default()
    }
}

fn metric(metrics: &Metrics, series: &str) -> f64 {
    let text = String::from_utf8(metrics.encode().unwrap()).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_spoofed_flood_is_rate_limited_and_others_are_not() {
    let metrics = Metrics::new();
    let srv = server(no_exemptions(20, 2), metrics.clone()).await;

    // The "victim" prefix 127.0.1.0/24 receives a flood of 300 answers' worth.
    let victim = flood(srv.addr, "127.0.1.1", 300).await;
    // At most two one-second budgets (the window may roll over during the flood).
    assert!(
        (1..=40).contains(&victim.answered),
        "answers past the limit: {victim:?}"
    );
    // Slip 2: every second limited query is answered truncated, the others dropped.
    let limited = 300 - victim.answered;
    assert!(
        victim.slipped.abs_diff(limited / 2) <= 2,
        "slip 2 should truncate about half of {limited}: {victim:?}"
    );
    assert!(victim.silent >= limited / 2 - 2, "{victim:?}");

    // Two addresses of one /24 share its budget: flooded together, 100 queries each,
    // they get 20 answers between them, not 20 each. (Sent within milliseconds; should
    // a second begin meanwhile, another /24 tries again.)
    let mut shared = Vec::new();
    for net in ["127.0.5", "127.0.6", "127.0.7"] {
        let pair = floods(srv.addr, &[&format!("{net}.1"), &format!("{net}.200")], 100).await;
        shared.push((pair[0].answered, pair[1].answered));
        if pair[0].answered + pair[1].answered <= 20 {
            break;
        }
    }
    assert!(
        shared.iter().any(|(a, b)| a + b <= 20),
        "one budget per /24, not per address: answered {shared:?}"
    );
    // ...another /24 has its own, and a slipped client gets its answer over TCP.
    let other = flood(srv.addr, "127.0.2.1", 10).await;
    assert_eq!(other.answered, 10, "{other:?}");
    // The slipped client itself, in the limited /24, retries over TCP: 100 pipelined
    // queries, five times the rate (at most 40 would pass a limit of 20/s), all answered.
    let tcp = tokio::net::TcpSocket::new_v4().unwrap();
    tcp.bind("127.0.1.1:0".parse().unwrap()).unwrap();
    let mut tcp = tcp.connect(srv.addr).await.unwrap();
    let batch: Vec<u8> = (0..100).flat_map(|id| framed(&www(id))).collect();
    tcp.write_all(&batch).await.unwrap();
    for id in 0..100 {
        let a = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut tcp))
            .await
            .unwrap_or_else(|_| panic!("TCP answer {id} from the limited prefix"))
            .expect("an answer over TCP");
        let m = Message::from_vec(&a).unwrap();
        assert_eq!((m.metadata.id, m.answers.len()), (id, 1), "{m:?}");
    }

    let dropped = metric(&metrics, "steerdns_rate_limited_total{action=\"dropped\"}");
    let slipped = metric(&metrics, "steerdns_rate_limited_total{action=\"slipped\"}");
    assert!(
        dropped >= (victim.silent) as f64,
        "dropped {dropped}, {victim:?}"
    );
    assert!(
        slipped >= (victim.slipped) as f64,
        "slipped {slipped}, {victim:?}"
    );
}

/// `www.example.com A` with id `id` and, if given, `opt` (a raw OPT record) appended.
fn www_with(id: u16, opt: Option<&[u8]>) -> Vec<u8> {
    let mut q = www(id);
    if let Some(opt) = opt {
        q[11] = 1; // ARCOUNT
        q.extend_from_slice(opt);
    }
    q
}

/// Sends `count` copies of `query` (ids 0, 1, ...) from `from` back to back; the
/// truncated answers (the rate limiter's slips), raw.
async fn slips(server: SocketAddr, from: &str, query: &[u8], count: u16) -> Vec<Vec<u8>> {
    let sock = UdpSocket::bind(format!("{from}:0"))
        .await
        .expect("bind alias");
    for id in 0..count {
        let mut q = query.to_vec();
        q[0..2].copy_from_slice(&id.to_be_bytes());
        sock.send_to(&q, server).await.unwrap();
    }
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    while let Ok(Ok((n, _))) =
        tokio::time::timeout(Duration::from_millis(500), sock.recv_from(&mut buf)).await
    {
        if buf[2] & 0x02 != 0 {
            got.push(buf[..n].to_vec());
        }
    }
    got
}

#[tokio::test]
async fn a_slip_to_a_query_with_an_opt_carries_an_opt() {
    // RFC 6891 §7: a query with an OPT record gets one in its response, the truncated
    // answer of a slip included: the UDP size normal answers advertise (the client's,
    // at least 512, at most 1232), DO copied, version 0, and no options (no ECS echo)
    // but the Extended DNS Error (RFC 8914) that says why: 0, "rate limited".
    let srv = server(no_exemptions(5, 1), Metrics::new()).await;
    let ecs: &[u8] = &[0, 1, 24, 0, 81, 2, 69];
    let cases = [
        (
            "payload 4096, DO, ECS",
            "127.0.5.1",
            Some(opt_record(4096, true, &[(8, ecs)])),
            Some((1232, true)),
        ),
        (
            "payload 100, an unknown option",
            "127.0.6.1",
            Some(opt_record(100, false, &[(65001, &[1, 2, 3])])),
            Some((512, false)),
        ),
        (
            "payload 700",
            "127.0.7.1",
            Some(opt_record(700, false, &[])),
            Some((700, false)),
        ),
        ("no EDNS", "127.0.8.1", None, None),
    ];
    for (what, from, opt, want) in cases {
        let q = www_with(0, opt.as_deref());
        let slipped = slips(srv.addr, from, &q, 40).await;
        assert!(slipped.len() >= 20, "{what}: {} slips", slipped.len());
        for a in &slipped {
            let m = Message::from_vec(a).unwrap_or_else(|e| panic!("{what}: {e}: {a:02x?}"));
            assert!(m.metadata.truncation && m.answers.is_empty(), "{what}");
            assert_eq!(m.queries, query("www.example.com.", RecordType::A).queries);
            let Some((payload, dnssec_ok)) = want else {
                assert!(m.edns.is_none(), "{what}: an OPT without one in the query");
                assert_eq!(a[10..12], [0, 0], "{what}: ARCOUNT");
                continue;
            };
            let e = m
                .edns
                .as_ref()
                .unwrap_or_else(|| panic!("{what}: a slip without an OPT: {a:02x?}"));
            assert_eq!(e.max_payload(), payload, "{what}: UDP size");
            assert_eq!(e.flags().dnssec_ok, dnssec_ok, "{what}: DO");
            assert_eq!((e.version(), e.rcode_high()), (0, 0), "{what}");
            assert_eq!(
                other_options(&m).unwrap().len(),
                1,
                "{what}: {:?}",
                e.options()
            );
            assert!(ecs_of(&m).is_none(), "{what}: ECS echoed");
            let (code, text) = ede_of(&m).unwrap_or_else(|| panic!("{what}: no EDE"));
            assert_eq!(code, 0, "{what}");
            assert!(text.starts_with("rate limited"), "{what}: {text}");
            assert_eq!(a[10..12], [0, 1], "{what}: ARCOUNT");
        }
    }
}

#[tokio::test]
async fn exempt_sources_and_rate_zero_are_never_limited() {
    // The default exemptions (loopback), with a rate of 5 a second: 200 queries are 40
    // times the rate, and every one is answered.
    let low_rate = |exempt: Vec<ipnet::IpNet>| DnsOptions {
        rrl: RrlConfig {
            rate: 5,
            exempt,
            ..RrlConfig::default()
        },
        ..DnsOptions::default()
    };
    let srv = server(low_rate(RrlConfig::default().exempt), Metrics::new()).await;
    let t = flood(srv.addr, "127.0.3.1", 200).await;
    assert_eq!(t.answered, 200, "{t:?}");
    // An exemption of one block leaves the rest of loopback limited at that rate.
    let srv = server(
        low_rate(vec!["127.0.5.0/24".parse().unwrap()]),
        Metrics::new(),
    )
    .await;
    let t = flood(srv.addr, "127.0.5.1", 200).await;
    assert_eq!(t.answered, 200, "{t:?}");
    let t = flood(srv.addr, "127.0.6.1", 200).await;
    assert!(t.answered <= 10, "not exempt: {t:?}");
    // Rate 0 turns it off.
    let srv = server(no_exemptions(0, 2), Metrics::new()).await;
    let t = flood(srv.addr, "127.0.4.1", 200).await;
    assert_eq!(t.answered, 200, "{t:?}");
}

fn tcp_limits(max_connections: usize, max_queries: u32) -> DnsOptions {
    DnsOptions {
        tcp: TcpLimits {
            max_connections,
            max_queries,
            ..TcpLimits::default()
        },
        ..DnsOptions::default()
    }
}

#[tokio::test]
async fn tcp_connections_over_the_limit_are_closed_and_udp_keeps_answering() {
    let metrics = Metrics::new();
    let srv = server(tcp_limits(4, 0), metrics.clone()).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(srv.addr).await.unwrap());
    }
    // Let the server accept all four before the fifth arrives.
    wait_until("4 open connections", || {
        metric(&metrics, "steerdns_tcp_connections") == 4.0
    })
    .await;
    let mut fifth = TcpStream::connect(srv.addr).await.unwrap();
    fifth.write_all(&framed(&www(5))).await.ok();
    let got = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut fifth))
        .await
        .expect("the fifth connection is closed, not left hanging");
    assert!(got.is_none(), "the fifth connection got an answer");
    assert_eq!(
        metric(
            &metrics,
            "steerdns_tcp_closed_total{reason=\"over-connection-limit\"}"
        ),
        1.0
    );
    // The held connections still answer, and so does UDP.
    held[0].write_all(&framed(&www(6))).await.unwrap();
    let a = read_frame(&mut held[0])
        .await
        .expect("an answer on a held connection");
    assert_eq!(Message::from_vec(&a).unwrap().metadata.id, 6);
    let udp = ask(
        srv.addr,
        Proto::Udp,
        &query("www.example.com.", RecordType::A),
    )
    .await;
    assert_eq!(udp.answers.len(), 1);
    // Closing one frees a slot.
    drop(held.pop());
    wait_until("3 open connections", || {
        metric(&metrics, "steerdns_tcp_connections") == 3.0
    })
    .await;
    let again = ask(
        srv.addr,
        Proto::Tcp,
        &query("www.example.com.", RecordType::A),
    )
    .await;
    assert_eq!(again.answers.len(), 1);
}

#[tokio::test]
async fn at_the_query_limit_every_query_read_is_answered_then_the_close_is_graceful() {
    // RFC 7766 §6.2.3: a server closing a connection answers what it has read first.
    let metrics = Metrics::new();
    let srv = server(tcp_limits(16, 5), metrics.clone()).await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    // Eight queries in one write, read in one go: the limit (5) is reached inside the
    // batch, and all eight are answered, in order, before the close.
    let batch: Vec<u8> = (100..108).flat_map(|id| framed(&www(id))).collect();
    s.write_all(&batch).await.unwrap();
    let mut ids = Vec::new();
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(5), read_frame(&mut s)).await {
            Ok(Some(a)) => ids.push(Message::from_vec(&a).unwrap().metadata.id),
            Ok(None) => break "closed",
            Err(_) => break "left open",
        }
    };
    assert_eq!((ids, end), ((100..108).collect(), "closed"));
    wait_until("the close counted", || {
        metric(
            &metrics,
            "steerdns_tcp_closed_total{reason=\"query-limit\"}",
        ) == 1.0
    })
    .await;

    // At the limit exactly: five answers, then nothing more is read; a query sent after
    // that gets no answer but a clean end of stream (FIN, not a reset).
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    let batch: Vec<u8> = (0..5).flat_map(|id| framed(&www(id))).collect();
    s.write_all(&batch).await.unwrap();
    for id in 0..5 {
        let a = read_frame(&mut s)
            .await
            .expect("an answer before the limit");
        assert_eq!(Message::from_vec(&a).unwrap().metadata.id, id);
    }
    let _ = s.write_all(&framed(&www(5))).await;
    let mut rest = Vec::new();
    let got = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    assert!(
        matches!(got, Ok(Ok(0))),
        "after the limit: {got:?}, {} bytes",
        rest.len()
    );

    // Without a query limit (the default), a thousand pipelined queries all come back,
    // in order, on one connection.
    assert_eq!(TcpLimits::default().max_queries, 0, "no limit by default");
    let srv = server(DnsOptions::default(), Metrics::new()).await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    let batch: Vec<u8> = (0..1000).flat_map(|id| framed(&www(id))).collect();
    s.write_all(&batch).await.unwrap();
    for id in 0..1000 {
        let a = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut s))
            .await
            .unwrap()
            .expect("an answer");
        assert_eq!(Message::from_vec(&a).unwrap().metadata.id, id);
    }
}

#[tokio::test]
async fn a_frame_that_gets_no_answer_closes_the_connection() {
    // An empty frame, a frame shorter than a header and a response (QR=1) get no answer;
    // before, each restarted the idle timer without counting, so `\0\0` every few
    // seconds held a connection forever. Now each closes the connection at once, after
    // the answers to the queries before it.
    let metrics = Metrics::new();
    let srv = server(DnsOptions::default(), metrics.clone()).await;
    let mut response = www(9);
    response[2] |= 0x80;
    for (i, (what, bad)) in [
        ("an empty frame", vec![]),
        ("eleven bytes", vec![0; 11]),
        ("a response", response),
    ]
    .into_iter()
    .enumerate()
    {
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        let bytes = [framed(&www(1)), framed(&bad), framed(&www(2))].concat();
        s.write_all(&bytes).await.unwrap();
        let a = read_frame(&mut s).await.expect("the query before");
        assert_eq!(Message::from_vec(&a).unwrap().metadata.id, 1, "{what}");
        // Well within the 10 s idle timeout.
        let next = tokio::time::timeout(Duration::from_secs(3), read_frame(&mut s)).await;
        assert!(matches!(next, Ok(None)), "{what}: not closed: {next:?}");
        wait_until("the close counted", || {
            metric(&metrics, "steerdns_tcp_closed_total{reason=\"no-answer\"}") == (i + 1) as f64
        })
        .await;
    }
}

#[tokio::test]
async fn one_address_holding_300_connections_shuts_no_one_else_out_of_tcp() {
    raise_fd_limit();
    // The defaults: 256 connections, 32 per /24.
    let metrics = Metrics::new();
    let srv = server(DnsOptions::default(), metrics.clone()).await;
    let mut held = hold(srv.addr, "127.0.1.1", 300).await;
    wait_until("the source's connections counted", || {
        metric(
            &metrics,
            "steerdns_tcp_closed_total{reason=\"over-source-limit\"}",
        ) == 268.0
    })
    .await;
    assert_eq!(metric(&metrics, "steerdns_tcp_connections"), 32.0);
    // From another /24 on loopback: TCP answers, a fresh connection per query.
    for i in 0..20u8 {
        let m = ask_from(
            srv.addr,
            format!("127.0.2.{}", i + 1).parse().unwrap(),
            Proto::Tcp,
            &query("www.example.com.", RecordType::A),
        )
        .await;
        assert_eq!(m.answers.len(), 1, "{m:?}");
    }
    // The held ones that were let in still answer.
    held[0].write_all(&framed(&www(7))).await.unwrap();
    let a = read_frame(&mut held[0]).await.expect("a held connection");
    assert_eq!(Message::from_vec(&a).unwrap().metadata.id, 7);
    // The cap is per prefix, and given back when a connection ends.
    held.clear();
    wait_until("the source's connections closed", || {
        metric(&metrics, "steerdns_tcp_connections") == 0.0
    })
    .await;
    let again = hold(srv.addr, "127.0.1.1", 32).await;
    wait_until("32 open again", || {
        metric(&metrics, "steerdns_tcp_connections") == 32.0
    })
    .await;
    drop(again);
}

async fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
