//! Several UDP sockets per address (SO_REUSEPORT): every socket is served, TCP alongside,
//! port 0 still works, and a second server cannot take the same address.

mod common;

use std::net::SocketAddr;

use common::*;
use hickory_proto::rr::RecordType;
use steerdns::app;
use steerdns::control::decide::planner;
use steerdns::metrics::Metrics;

/// Queries from `clients` distinct UDP sockets (distinct source ports, so the kernel's
/// flow hash spreads them over the server's sockets) and over TCP; all must be answered.
async fn answers_everywhere(addr: SocketAddr, clients: usize) {
    let gb = query_edns("www.example.com", RecordType::A, Some(("81.2.69.0", 24)));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let q = gb.clone();
        // `ask` binds a fresh client socket per query.
        tasks.push(tokio::spawn(async move {
            cname_of(&ask(addr, Proto::Udp, &q).await)
        }));
    }
    for t in tasks {
        let cname = t.await.unwrap();
        assert!(cname == FASTLY || cname == CLOUDFLARE, "{cname}");
    }
    let soa = ask(addr, Proto::Tcp, &query("example.com", RecordType::SOA)).await;
    assert_eq!(soa.answers.len(), 1, "{soa:?}");
    let cname = cname_of(&ask(addr, Proto::Tcp, &gb).await);
    assert!(cname == FASTLY || cname == CLOUDFLARE, "{cname}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_udp_sockets_on_port_zero_answer_udp_and_tcp() {
    let loaded = load_fixture(DEMO_POLICY, TEST_ZONES, TEST_GEO);
    let listen: Vec<SocketAddr> = vec!["127.0.0.1:0".parse().unwrap(), "[::1]:0".parse().unwrap()];
    let running = app::start_with(planner::snapshot(&loaded), &listen, 2, Metrics::new())
        .await
        .expect("bind loopback");
    let addrs = running.addrs().to_vec();
    assert_eq!(addrs.len(), 2);
    for addr in &addrs {
        assert_ne!(addr.port(), 0);
        // With one socket left unserved, about half of these would go unanswered.
        answers_everywhere(*addr, 32).await;
    }
}

#[tokio::test]
async fn a_second_server_on_the_same_address_is_refused() {
    let loaded = load_fixture(DEMO_POLICY, TEST_ZONES, TEST_GEO);
    let first = app::start_with(
        planner::snapshot(&loaded),
        &["127.0.0.1:0".parse().unwrap()],
        2,
        Metrics::new(),
    )
    .await
    .expect("bind loopback");
    let addr = first.addrs()[0];
    // The UDP sockets would share the port (SO_REUSEPORT); the TCP listener must not.
    let second = app::start_with(planner::snapshot(&loaded), &[addr], 2, Metrics::new()).await;
    let err = second.err().expect("a second server on the same address");
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
    answers_everywhere(addr, 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_udp_thread_is_restarted_and_every_flow_still_answered() {
    // Four UDP sockets; the test-only fault makes a thread panic on `panic.example.com`.
    let metrics = Metrics::new();
    let loaded = load_fixture(DEMO_POLICY, TEST_ZONES, TEST_GEO);
    let running = app::start_with_options(
        planner::snapshot(&loaded),
        &["127.0.0.1:0".parse().unwrap()],
        metrics.clone(),
        &app::DnsOptions {
            udp_sockets: 4,
            udp_panic_on: Some("panic.example.com.".into()),
            ..app::DnsOptions::default()
        },
    )
    .await
    .expect("bind loopback");
    let addr = running.addrs()[0];
    // 64 flows (client sockets), each first sending the fatal query: with four sockets,
    // every thread receives one (the chance that one does not: 4 × (3/4)^64, 1e-7)...
    let poison = query("panic.example.com.", RecordType::A).to_vec().unwrap();
    let mut flows = Vec::new();
    for _ in 0..64 {
        let s = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        s.send_to(&poison, addr).await.unwrap();
        flows.push(s);
    }
    // ...and then, on the same flows, a normal query: every one is answered.
    let www = query("www.example.com.", RecordType::A).to_vec().unwrap();
    let mut buf = vec![0u8; 4096];
    for (i, s) in flows.iter().enumerate() {
        let mut answered = false;
        // A flow's datagram may be lost with its thread's batch: ask up to three times.
        for _ in 0..3 {
            s.send_to(&www, addr).await.unwrap();
            if let Ok(Ok((n, _))) =
                tokio::time::timeout(std::time::Duration::from_secs(1), s.recv_from(&mut buf)).await
            {
                let m = hickory_proto::op::Message::from_vec(&buf[..n]).unwrap();
                assert_eq!(m.queries[0].name().to_ascii(), "www.example.com.");
                answered = true;
                break;
            }
        }
        assert!(answered, "flow {i} is not answered after the panics");
    }
    let text = String::from_utf8(metrics.encode().unwrap()).unwrap();
    let restarts: f64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("steerdns_udp_thread_restarts_total ")?
                .parse()
                .ok()
        })
        .unwrap_or(0.0);
    assert!((1.0..=64.0).contains(&restarts), "restarts: {restarts}");
    running.stop().await.expect("threads end cleanly");
}
