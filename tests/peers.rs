//! The HTTP peer exchange of a single node (`probes/vantages.yaml`), against peers that
//! try to get past its checks: a CDN name the policy does not have (to escape "sees
//! every CDN fail"), a redirect to a document that would demote a CDN, a vantage name
//! that changes at every reading (to grow `/metrics`). Quorum is 1 throughout, so any
//! claim that counted would demote a CDN.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::mock_cdn::{MockCdn, Mode};
use common::stack::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[derive(Clone, Copy)]
enum Claim {
    /// a, b and c fail, and an invented CDN `zzz` is fine.
    Invented,
    /// A redirect to `to`.
    Redirect(std::net::SocketAddr),
    /// a fails, b and c are fine (a claim that would count).
    OnlyA,
    /// Every CDN fails, under a new vantage name each time.
    Renaming,
}

/// A peer answering every request with `claim`; counts its readings.
async fn peer(claim: Claim) -> (std::net::SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicU64::new(0));
    let count = served.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            let r = count.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16384 {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let o = |ok: bool| json!({"round": r, "ok": ok, "reason": if ok {"ok"} else {"status 503"}, "age_ms": 0});
                let (status, extra, body) = match claim {
                    Claim::Invented => (
                        "200 OK",
                        String::new(),
                        json!({"vantage": "p2", "observations": {"a": o(false), "b": o(false), "c": o(false), "zzz": o(true)}}),
                    ),
                    Claim::OnlyA => (
                        "200 OK",
                        String::new(),
                        json!({"vantage": "p3", "observations": {"a": o(false), "b": o(true), "c": o(true)}}),
                    ),
                    Claim::Renaming => (
                        "200 OK",
                        String::new(),
                        json!({"vantage": format!("p{r}"), "observations": {"a": o(false), "b": o(false), "c": o(false)}}),
                    ),
                    Claim::Redirect(to) => (
                        "302 Found",
                        format!("Location: http://{to}/v1/observations\r\n"),
                        json!({}),
                    ),
                };
                let body = body.to_string();
                let head = format!(
                    "HTTP/1.1 {status}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(body.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (addr, served)
}

/// A single node probing healthy a, b, c, reading `peer`.
async fn node(tag: &str, peer: std::net::SocketAddr) -> (Stack, [MockCdn; 3]) {
    let dir = scratch(tag);
    let cdns = [
        MockCdn::start(Mode::Healthy).await,
        MockCdn::start(Mode::Healthy).await,
        MockCdn::start(Mode::Healthy).await,
    ];
    policy(&dir, "[100]", 0.2);
    for (cdn, m) in ["a", "b", "c"].iter().zip(&cdns) {
        probe(&dir, cdn, &m.url("/_health/v1.txt"), 1);
    }
    vantages(&dir, &[format!("http://{peer}")]);
    (Stack::start(&dir).await, cdns)
}

async fn readings(served: &AtomicU64, n: u64) {
    let start = served.load(Ordering::SeqCst);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while served.load(Ordering::SeqCst) < start + n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the peer is not read"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_inventing_a_cdn_still_sees_every_cdn_fail() {
    let (addr, served) = peer(Claim::Invented).await;
    let (stack, _cdns) = node("peer-invented", addr).await;
    readings(&served, 10).await;
    stack.rounds("a", 10).await;
    let s = stack.state().await;
    assert_eq!(removed(&s, "a"), None, "{s:#}");
    let p = &s["peers"][0];
    assert!(
        p["unhappy"]
            .as_str()
            .is_some_and(|u| u.contains("every CDN")),
        "zzz must not count: {s:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_redirect_is_not_followed() {
    let (target, target_served) = peer(Claim::OnlyA).await;
    let (addr, served) = peer(Claim::Redirect(target)).await;
    let (stack, _cdns) = node("peer-redirect", addr).await;
    readings(&served, 10).await;
    stack.rounds("a", 10).await;
    let s = stack.state().await;
    assert_eq!(removed(&s, "a"), None, "{s:#}");
    assert!(
        s["peers"][0]["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("status")),
        "{s:#}"
    );
    assert_eq!(
        target_served.load(Ordering::SeqCst),
        0,
        "the redirect was followed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_renaming_itself_adds_no_metric_series() {
    let (addr, served) = peer(Claim::Renaming).await;
    let (stack, _cdns) = node("peer-renaming", addr).await;
    readings(&served, 20).await;
    stack.rounds("a", 5).await;
    let text = stack.text("/metrics").await;
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("steerdns_vantage_unhappy{"))
        .collect();
    // This node's own series, and the peer's latest name (and the one before it,
    // between two readings): the peer, unhappy (it sees every CDN fail), is shown.
    let peer_series = series
        .iter()
        .filter(|l| l.contains("vantage=\"p") && l.ends_with(" 1"))
        .count();
    assert!(
        (1..=2).contains(&peer_series) && series.len() <= 3,
        "{series:#?}"
    );
}
