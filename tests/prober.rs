//! One probe against the mock CDN in each of its failure modes: the reason recorded is
//! the real one, and the request is what a CDN should see.

mod common;

use std::time::Duration;

use common::mock_cdn::{MockCdn, Mode};
use steerdns::config::probes::ProbeSpec;
use steerdns::control::tasks::prober::{probe_once, probe_timed};

/// Generous limits, so that a healthy answer passes on a loaded machine; the tests of
/// `slow` and `timeout` tighten one of them against a mock slower still.
fn spec(url: &str) -> ProbeSpec {
    ProbeSpec {
        cdn: "a".into(),
        file: "probes/a.yaml".into(),
        url: url.parse().unwrap(),
        host: None,
        connect_to: None,
        expect_status: 200,
        expect_body: Some("healthy-v1".into()),
        timeout: Duration::from_secs(5),
        max_ttfb: Duration::from_secs(4),
        interval: Duration::from_secs(1),
        quorum: 1,
        down_after: 2,
        up_after: 2,
    }
}

#[tokio::test]
async fn each_failure_has_its_reason() {
    let cdn = MockCdn::start(Mode::Healthy).await;
    let s = spec(&cdn.url("/_health/v1.txt"));
    assert_eq!(probe_once(&s, "ua").await, Ok(()));

    let cases = [
        (Mode::Status(503), "status 503"),
        (Mode::ErrorPage, "body mismatch"),
        (Mode::Refused, "connect"),
    ];
    for (mode, reason) in cases {
        cdn.set(mode);
        let got = probe_once(&s, "ua")
            .await
            .expect_err("must fail")
            .to_string();
        assert!(got.starts_with(reason), "{mode:?}: {got}");
    }
    // The first byte after 300 ms at least, against a limit of 100 ms: slow, however
    // loaded the machine (the timeout is 5 s).
    cdn.set(Mode::Slow(Duration::from_millis(300)));
    let tight = ProbeSpec {
        max_ttfb: Duration::from_millis(100),
        ..s.clone()
    };
    let got = probe_once(&tight, "ua")
        .await
        .expect_err("must be slow")
        .to_string();
    assert!(got.starts_with("slow: first byte after"), "{got}");
    assert!(got.ends_with("(limit 100 ms)"), "{got}");
    // Nothing for 5 s, against a timeout of 300 ms.
    cdn.set(Mode::Slow(Duration::from_secs(5)));
    let short = ProbeSpec {
        timeout: Duration::from_millis(300),
        max_ttfb: Duration::from_millis(300),
        ..s.clone()
    };
    let got = probe_once(&short, "ua")
        .await
        .expect_err("must time out")
        .to_string();
    assert!(got.starts_with("timeout"), "{got}");
    cdn.set(Mode::Healthy);
    assert_eq!(probe_once(&s, "ua").await, Ok(()));
}

#[tokio::test]
async fn a_bad_certificate_is_a_tls_failure() {
    let cdn = MockCdn::start(Mode::BadTls).await;
    let s = spec(&format!("https://{}/_health/v1.txt", cdn.addr()));
    let got = probe_once(&s, "ua")
        .await
        .expect_err("self-signed certificate must fail")
        .to_string();
    assert!(got.starts_with("tls"), "{got}");
}

#[tokio::test]
async fn host_header_pinned_address_and_cache_busting() {
    let cdn = MockCdn::start(Mode::Healthy).await;
    // The URL names a CDN host that does not resolve; the probe connects to the pinned
    // address and sends the configured Host.
    let mut s = spec(&format!(
        "http://edge.cdn.invalid:{}/_health/v1.txt",
        cdn.addr().port()
    ));
    s.host = Some("www.example.com".into());
    s.connect_to = Some(cdn.addr().ip());
    assert_eq!(
        probe_once(&s, "steerdns-prober/test (vantage t1)").await,
        Ok(())
    );
    let head = cdn.last_request().unwrap().to_ascii_lowercase();
    assert!(head.starts_with("get /_health/v1.txt "), "{head}");
    assert!(
        head.contains(&format!("host: www.example.com:{}", cdn.addr().port())),
        "{head}"
    );
    assert!(
        head.contains("user-agent: steerdns-prober/test (vantage t1)"),
        "{head}"
    );
    assert!(head.contains("cache-control: no-cache"), "{head}");
}

/// The time to first byte a probe hands to performance steering: measured when the
/// head arrived (whether the probe then passes or not), the timeout when nothing came
/// in time (a lower bound), nothing when the CDN could not be reached.
#[tokio::test]
async fn a_probe_times_its_first_byte() {
    let cdn = MockCdn::start(Mode::Slow(Duration::from_millis(200))).await;
    let s = spec(&cdn.url("/_health/v1.txt"));
    let (result, ttfb) = probe_timed(&s, "ua").await;
    assert_eq!(result, Ok(()));
    let ttfb = ttfb.expect("a first byte");
    assert!(ttfb >= Duration::from_millis(200), "{ttfb:?}");
    assert!(ttfb < s.timeout, "{ttfb:?}");

    cdn.set(Mode::Status(503));
    let (result, ttfb) = probe_timed(&s, "ua").await;
    assert!(result.is_err());
    assert!(
        ttfb.is_some_and(|t| t < Duration::from_millis(200)),
        "{ttfb:?}"
    );

    cdn.set(Mode::Slow(Duration::from_secs(5)));
    let short = ProbeSpec {
        timeout: Duration::from_millis(300),
        max_ttfb: Duration::from_millis(300),
        ..s.clone()
    };
    let (result, ttfb) = probe_timed(&short, "ua").await;
    assert!(result.is_err_and(|r| r.to_string().starts_with("timeout")));
    assert_eq!(ttfb, Some(Duration::from_millis(300)));

    cdn.set(Mode::Refused);
    let (result, ttfb) = probe_timed(&s, "ua").await;
    assert!(result.is_err_and(|r| r.to_string().starts_with("connect")));
    assert_eq!(ttfb, None);
}
