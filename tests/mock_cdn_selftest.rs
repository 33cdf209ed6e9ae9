//! Self-test of the mock CDN used by the health-prober integration tests.

#[path = "common/mock_cdn.rs"]
mod mock_cdn;

use std::time::{Duration, Instant};

use mock_cdn::{MockCdn, Mode};

/// A plain client. reqwest's rustls backend uses the process-wide crypto provider;
/// with only rustls/aws-lc-rs in the build rustls picks it by itself, but if another
/// crate ever enables rustls/ring too, building a client would panic ("no process-level
/// CryptoProvider"), so install aws-lc-rs explicitly (an error means one is already set).
fn client() -> reqwest::Client {
    let _ = tokio_rustls::rustls::crypto::aws_lc_rs::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()
        .expect("reqwest client")
}

async fn get(url: &str) -> (u16, String) {
    let response = client().get(url).send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

#[tokio::test]
async fn healthy_serves_200_and_records_the_request() {
    let cdn = MockCdn::start(Mode::Healthy).await;
    assert_eq!(cdn.hits(), 0);
    assert_eq!(cdn.last_request(), None);

    let response = client()
        .get(cdn.url("/health?x=1"))
        .header("user-agent", "steerdns-selftest/1")
        .header("cache-control", "no-cache")
        .send()
        .await
        .expect("request");
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers()["content-length"], "11");
    assert_eq!(response.text().await.unwrap(), "healthy-v1\n");

    assert_eq!(cdn.hits(), 1);
    let head = cdn.last_request().expect("a request was recorded");
    assert!(head.starts_with("GET /health?x=1 HTTP/1.1\r\n"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("user-agent: steerdns-selftest/1"), "{head}");
    assert!(lower.contains("cache-control: no-cache"), "{head}");
    assert!(lower.contains(&format!("host: {}", cdn.addr())), "{head}");

    get(&cdn.url("/other")).await;
    assert_eq!(cdn.hits(), 2);
    assert!(cdn.last_request().unwrap().starts_with("GET /other "));
}

#[tokio::test]
async fn status_and_error_page() {
    let cdn = MockCdn::start(Mode::Status(503)).await;
    assert_eq!(get(&cdn.url("/")).await, (503, "error\n".to_string()));

    cdn.set(Mode::ErrorPage);
    assert_eq!(
        get(&cdn.url("/")).await,
        (200, "<html>Service Unavailable</html>".to_string())
    );

    cdn.set(Mode::Healthy);
    assert_eq!(get(&cdn.url("/")).await, (200, "healthy-v1\n".to_string()));
    assert_eq!(cdn.hits(), 3);
}

#[tokio::test]
async fn a_script_shapes_exactly_the_next_responses() {
    let cdn = MockCdn::start(Mode::Status(503)).await;
    cdn.script(&[Mode::Healthy, Mode::ErrorPage, Mode::Healthy]);
    assert_eq!(cdn.scripted(), 3);
    let url = cdn.url("/_health/v1.txt");
    assert_eq!(get(&url).await, (200, mock_cdn::HEALTHY_BODY.to_string()));
    assert_eq!(
        get(&url).await,
        (200, mock_cdn::ERROR_PAGE_BODY.to_string())
    );
    assert_eq!(get(&url).await.0, 200);
    assert_eq!(cdn.scripted(), 0);
    // Then the mode again; `set` drops what is left of a script.
    assert_eq!(get(&url).await.0, 503);
    cdn.script(&[Mode::Healthy]);
    cdn.set(Mode::Status(500));
    assert_eq!(get(&url).await.0, 500);
}

#[tokio::test]
async fn slow_delays_the_response_headers() {
    let cdn = MockCdn::start(Mode::Slow(Duration::from_millis(300))).await;
    let started = Instant::now();
    let response = client().get(cdn.url("/")).send().await.expect("request");
    let to_headers = started.elapsed();
    assert!(
        to_headers >= Duration::from_millis(300),
        "headers after {to_headers:?}"
    );
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.text().await.unwrap(), "healthy-v1\n");
}

#[tokio::test]
async fn refused_is_a_connect_error_and_the_port_comes_back() {
    let cdn = MockCdn::start(Mode::Healthy).await;
    let addr = cdn.addr();
    assert_eq!(get(&cdn.url("/")).await.0, 200);

    // Twice, straight after each switch: set() acts on the socket synchronously.
    for _ in 0..2 {
        cdn.set(Mode::Refused);
        let raw = tokio::net::TcpStream::connect(addr).await.map(|_| ());
        let kind = raw.expect_err("refused").kind();
        assert_eq!(kind, std::io::ErrorKind::ConnectionRefused);
        let err = client()
            .get(cdn.url("/"))
            .send()
            .await
            .expect_err("refused");
        assert!(err.is_connect(), "not a connect error: {err:?}");

        cdn.set(Mode::Healthy);
        assert_eq!(cdn.addr(), addr);
        assert_eq!(get(&cdn.url("/")).await, (200, "healthy-v1\n".to_string()));
    }
    assert_eq!(cdn.hits(), 3);
}

#[tokio::test]
async fn starting_refused_then_serving() {
    let cdn = MockCdn::start(Mode::Refused).await;
    let err = client()
        .get(cdn.url("/"))
        .send()
        .await
        .expect_err("refused");
    assert!(err.is_connect(), "not a connect error: {err:?}");
    cdn.set(Mode::Status(500));
    assert_eq!(get(&cdn.url("/")).await.0, 500);
}

#[tokio::test]
async fn bad_tls_fails_verification_but_serves_when_accepted() {
    let cdn = MockCdn::start(Mode::BadTls).await;
    let https = format!("https://{}/", cdn.addr());

    let _ = tokio_rustls::rustls::crypto::aws_lc_rs::default_provider().install_default();
    let err = reqwest::Client::new()
        .get(&https)
        .send()
        .await
        .expect_err("unverifiable");
    assert!(
        err.is_connect(),
        "expected a TLS handshake (connect) error: {err:?}"
    );
    assert_eq!(cdn.hits(), 0, "no HTTP request without a handshake");

    let insecure = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .no_proxy()
        .build()
        .unwrap();
    let response = insecure.get(&https).send().await.expect("request");
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.text().await.unwrap(), "healthy-v1\n");
    assert_eq!(cdn.hits(), 1);

    // Plain HTTP to a TLS port is not an HTTP answer.
    assert!(client().get(cdn.url("/")).send().await.is_err());

    cdn.set(Mode::Healthy);
    assert_eq!(get(&cdn.url("/")).await.0, 200);
}

#[tokio::test]
async fn drop_stops_the_server() {
    let cdn = MockCdn::start(Mode::Healthy).await;
    let url = cdn.url("/");
    assert_eq!(get(&url).await.0, 200);
    drop(cdn);
    let err = client().get(&url).send().await.expect_err("stopped");
    assert!(err.is_connect(), "not a connect error: {err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_clients_do_not_break_the_server() {
    use tokio::io::AsyncWriteExt;
    let cdn = MockCdn::start(Mode::Slow(Duration::from_millis(50))).await;

    // Disconnects mid-head, an oversized head, and a client gone before the answer.
    let mut s = tokio::net::TcpStream::connect(cdn.addr()).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    drop(s);
    let mut s = tokio::net::TcpStream::connect(cdn.addr()).await.unwrap();
    let _ = s.write_all(&vec![b'a'; 64 * 1024]).await;
    drop(s);
    let mut s = tokio::net::TcpStream::connect(cdn.addr()).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    drop(s);

    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(get(&cdn.url("/")).await.0, 200);
    assert_eq!(cdn.hits(), 2);
}
