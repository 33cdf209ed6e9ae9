//! The status page (`GET /` on the API) in a real browser during a drill: headless
//! Chromium loads it from a running server while a CDN fails (a failover step, and
//! fail-open for the name it serves alone) and an operator drains another with a
//! reason full of markup. The DOM Chromium built must show each of them, with the
//! reason as text; the screenshots are kept as artifacts (`target/artifacts/`, or
//! `$CARGO_TARGET_DIR/artifacts/`, or `$STEERDNS_ARTIFACTS`).
//!
//! Needs `chromium` (Debian: `apt-get install chromium`; or `$CHROMIUM`): without it
//! the test says so and passes, except under `CI=true`, where it fails.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::mock_cdn::Mode;
use common::stack::*;
use serde_json::json;
use tokio::time::Instant;

/// The browser to drive, or `None` (after saying why) when the test should skip.
fn chromium() -> Option<String> {
    let candidates = match std::env::var("CHROMIUM") {
        Ok(c) => vec![c],
        Err(_) => vec!["chromium".into(), "chromium-browser".into()],
    };
    let found = candidates.into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if found.is_none() {
        let why = "chromium not found (apt-get install chromium, or set CHROMIUM)";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("status_page: SKIPPED: {why}");
    }
    found
}

/// Where screenshots and DOM dumps are kept.
fn artifacts() -> PathBuf {
    let dir = match (
        std::env::var_os("STEERDNS_ARTIFACTS"),
        option_env!("CARGO_TARGET_DIR"),
    ) {
        (Some(d), _) => PathBuf::from(d),
        (None, Some(t)) => Path::new(t).join("artifacts"),
        (None, None) => common::repo("target/artifacts"),
    };
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs headless Chromium on `url` with `extra` arguments and a fresh profile; its
/// standard output. Stopped by its PID if it takes over 60 s.
fn browse(browser: &str, url: &str, extra: &[String]) -> String {
    let profile = std::env::temp_dir().join(format!(
        "steerdns-chromium-{}-{}",
        std::process::id(),
        PROFILES.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    ));
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromium");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut out).map(|_| out)
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = Command::new("kill")
                .args(["-KILL", &child.id().to_string()])
                .status();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(&profile);
            panic!("chromium took over 60 s on {url}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = reader.join().unwrap().unwrap_or_default();
    let _ = std::fs::remove_dir_all(&profile);
    assert!(status.success(), "chromium on {url}: {status}");
    out
}

static PROFILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Chromium's DOM of the page, and a screenshot of it saved as `artifacts/NAME.png`
/// (its DOM as `NAME.html`).
fn look(browser: &str, url: &str, name: &str) -> String {
    let dir = artifacts();
    let dom = browse(browser, url, &["--dump-dom".into()]);
    assert!(dom.contains("</html>"), "no DOM from chromium: {dom}");
    std::fs::write(dir.join(format!("{name}.html")), &dom).unwrap();
    let png = dir.join(format!("{name}.png"));
    let _ = std::fs::remove_file(&png);
    browse(
        browser,
        url,
        &[
            format!("--screenshot={}", png.display()),
            "--window-size=1100,1000".into(),
        ],
    );
    let bytes = std::fs::read(&png).expect("a screenshot");
    // A PNG of the window's size (IHDR: width and height, big-endian, at 16..24).
    assert_eq!(&bytes[1..4], b"PNG");
    let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert_eq!((width, height), (1100, 1000), "{}", png.display());
    eprintln!("status_page: {} ({} bytes)", png.display(), bytes.len());
    dom
}

/// The first element with all of these attributes, e.g.
/// `[("class", "drain"), ("data-cdn", "a")]`: its opening tag up to its closing one
/// (or `/>`, as served; Chromium writes `</polyline>`).
fn element<'d>(dom: &'d str, attrs: &[(&str, &str)]) -> Option<&'d str> {
    let mut at = 0;
    while let Some(i) = dom[at..].find('<') {
        let start = at + i;
        let tag_end = start + dom[start..].find('>')?;
        let tag = &dom[start..=tag_end];
        if attrs
            .iter()
            .all(|(k, v)| tag.contains(&format!(" {k}=\"{v}\"")))
        {
            let name: String = tag[1..]
                .chars()
                .take_while(char::is_ascii_alphanumeric)
                .collect();
            let end = [format!("</{name}>"), "/>".to_string()]
                .iter()
                .filter_map(|e| dom[start..].find(e.as_str()).map(|j| start + j + e.len()))
                .filter(|&e| name == "polyline" || !dom[start..e].ends_with("/>"))
                .min()?;
            return Some(&dom[start..end]);
        }
        at = tag_end;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_a_drill_as_it_happens() {
    let Some(browser) = chromium() else { return };
    // www.example.com: a and b, 50/50; other.example.com: c alone. Steps of 50 % and
    // 100 %, ten minutes apart: a demoted CDN stays at the first step.
    let (stack, _a, _b, c) = healthy_stack("status-page", "[50, 100]", 600.0).await;
    let url = format!("http://{}/", stack.api);

    // The page itself: HTML, nothing to fetch or run.
    let resp = stack.http.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let header = |h: &str| {
        resp.headers()
            .get(h)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(header("content-type"), "text/html; charset=utf-8");
    assert!(header("content-security-policy").starts_with("default-src 'none'"));
    let html = resp.text().await.unwrap();
    assert!(
        !html.contains("<script") && !html.contains(" src="),
        "{html}"
    );

    let dom = look(&browser, &url, "status-healthy");
    let www = [("class", "region"), ("data-name", "www.example.com.")];
    assert!(
        element(&dom, &www).is_some_and(|r| r.contains("data-reason=\"normal\"")
            && r.contains("data-cdn=\"a\" data-share=\"50\"")),
        "www.example.com not at its weights:\n{dom}"
    );
    assert!(element(&dom, &[("class", "cdn"), ("data-state", "down")]).is_none());
    assert!(element(&dom, &[("class", "drain")]).is_none());

    // The drill: c fails (a failover step; other.example.com, which has only c, fails
    // open), and an operator drains a from www.example.com at once.
    c.set(Mode::Status(503));
    stack
        .wait_for("c stepped", |s| {
            s["failover"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f["cdn"] == "c"))
                && !s["fail_open"].as_array().unwrap().is_empty()
        })
        .await;
    let reason = "INC-7 <b>not bold</b> & \"quoted\"";
    let (status, rule) = stack
        .post(
            "/v1/drains",
            json!({ "name": "www.example.com", "cdn": "a", "reason": reason,
                    "immediate": true, "ttl_seconds": 900 }),
        )
        .await;
    assert_eq!(status, 201, "{rule}");
    // The chart's sampler looks at the plan every second: wait until it has seen the
    // drain (a's line has a second point).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let html = stack.text("/").await;
        let line = element(&html, &[("class", "series"), ("data-cdn", "a")]).unwrap_or("");
        // A point, then the step (two), then to now (two): five.
        if line.matches(',').count() >= 5 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the chart never showed the drain:\n{html}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let dom = look(&browser, &url, "status-incident");
    let row = element(&dom, &www).expect("www.example.com's row");
    assert!(row.contains("data-reason=\"drain\""), "{row}");
    assert!(row.contains("data-cdn=\"a\" data-share=\"0\""), "{row}");
    assert!(row.contains("data-cdn=\"b\" data-share=\"100\""), "{row}");
    // The chart: a's line steps from 50 % down to 0 % at its right end.
    let line = element(&dom, &[("class", "series"), ("data-cdn", "a")]).unwrap();
    assert!(
        line.matches(',').count() >= 5 && line.contains(",30.0 ") && line.contains(",60.0"),
        "{line}"
    );

    let drain = element(&dom, &[("class", "drain"), ("data-cdn", "a")])
        .unwrap_or_else(|| panic!("no drain row:\n{dom}"));
    assert!(drain.contains("data-removed=\"100\""), "{drain}");
    // The reason is text, not markup: Chromium parsed no <b> element out of it.
    assert!(
        drain.contains("INC-7 &lt;b&gt;not bold&lt;/b&gt; &amp; \"quoted\""),
        "{drain}"
    );
    assert!(!drain.contains("<b>"), "{drain}");
    assert!(
        drain.contains("(in 15 min)") || drain.contains("(in 14 min)"),
        "{drain}"
    );

    let step = element(&dom, &[("class", "step"), ("data-cdn", "c")])
        .unwrap_or_else(|| panic!("no failover step of c:\n{dom}"));
    assert!(
        step.contains("data-removed=\"50\"") && step.contains("demote"),
        "{step}"
    );
    let health = element(&dom, &[("class", "cdn"), ("data-cdn", "c")]).unwrap();
    assert!(
        health.contains("data-state=\"down\"") && health.contains("503"),
        "the evidence of c's demotion: {health}"
    );
    assert!(
        element(
            &dom,
            &[("class", "fail-open"), ("data-name", "other.example.com.")]
        )
        .is_some(),
        "other.example.com should fail open:\n{dom}"
    );
    let other = element(
        &dom,
        &[("class", "region"), ("data-name", "other.example.com.")],
    );
    assert!(
        other.is_some_and(|r| r.contains("data-reason=\"fail-open\"")),
        "{other:?}"
    );
}
