//! Several UDP sockets per address (SO_REUSEPORT): every socket is served, TCP alongside,
//! port 0 still works, and a second server cannot take the same address.

mod common;

use std::net::SocketAddr;

use common::*;
use hickory_proto::rr::RecordType;
use steerdns::app;
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
    let running = app::start_with(loaded.snapshot(), &listen, 2, Metrics::new())
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
        loaded.snapshot(),
        &["127.0.0.1:0".parse().unwrap()],
        2,
        Metrics::new(),
    )
    .await
    .expect("bind loopback");
    let addr = first.addrs()[0];
    // The UDP sockets would share the port (SO_REUSEPORT); the TCP listener must not.
    let second = app::start_with(loaded.snapshot(), &[addr], 2, Metrics::new()).await;
    let err = second.err().expect("a second server on the same address");
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
    answers_everywhere(addr, 8).await;
}
