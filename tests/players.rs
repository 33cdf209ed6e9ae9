//! Real players in a real browser follow a drain: headless Chromium plays a short
//! stream (made here with ffmpeg, 1 s segments) with hls.js and dash.js side by side
//! (`tests/players/page.html`, packages pinned in `tests/players/package-lock.json`),
//! from two stand-in CDNs (`tests/players/cdn.py`, one per pathway, each writing an
//! access log) under the release `steerdns serve` with `--steering-http`.
//!
//! 1. Both players start on pathway `a` (a session key whose order starts with `a`,
//!    carried in the playlist's and the MPD's steering URL) and fetch segments from A.
//! 2. A drain of `a` posted to the admin API: both fetch their segments from B within
//!    one steering TTL (1 s) plus one segment (1 s), plus [`SLACK`].
//! 3. The drain deleted: both come back to A within the same bound.
//! 4. The page posted performance beacons all along, from the browser, across origins
//!    (its origin is `--beacon-origin`, so the preflight passes): hls.js's with the
//!    ticket of its steering manifest, dash.js's with one of `GET /rum/{name}/ticket`;
//!    every one was taken (204); of the steering polls' throughput, only each player's
//!    first poll (no ticket yet) was refused for its ticket.
//! 5. A screenshot of the playing page is kept in `<target>/artifacts/players.png`.
//!
//! Needs `chromium`, `node` (with `npm ci` run in `tests/players/`), `ffmpeg` and
//! `python3`; without them the test is skipped with a message, except under CI
//! (`CI=true`), where it fails. Takes about 15 s.
//!
//! Chromium comes from Debian, which moves it a major version with its security
//! updates, while puppeteer-core is pinned and built for one Chrome major: the pair is
//! checked first ([`browser_pair`]), and a mismatch fails naming both.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{repo, steerdns};

const TOKEN: &str = "players-test-token-0123456789";
/// The steering manifests' TTL, and the segments' duration.
const TTL: Duration = Duration::from_secs(1);
const SEGMENT: Duration = Duration::from_secs(1);
/// What the bound allows beyond TTL + segment: the player's scheduling of its next
/// segment (it asks when its 2 s buffer runs low) and a loaded CI machine.
const SLACK: Duration = Duration::from_millis(2500);

/// A process stopped by PID when dropped.
struct Proc {
    name: &'static str,
    child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            if !status.success() {
                eprintln!("players: {} had exited: {status}", self.name);
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(name: &'static str, cmd: &mut Command) -> Proc {
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
    Proc { name, child }
}

fn have(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether everything the test needs is here; a failure under CI when not.
fn require() -> bool {
    let mut missing = Vec::new();
    for (program, arg, package) in [
        ("chromium", "--version", "chromium"),
        ("node", "--version", "nodejs"),
        ("ffmpeg", "-version", "ffmpeg"),
        ("python3", "--version", "python3"),
    ] {
        if !have(program, arg) {
            missing.push(format!("{program} (Debian {package})"));
        }
    }
    for module in ["hls.js", "dashjs", "puppeteer-core"] {
        if !repo("tests/players/node_modules").join(module).is_dir() {
            missing.push(format!("{module} (npm ci in tests/players)"));
        }
    }
    if missing.is_empty() {
        return true;
    }
    let what = missing.join(", ");
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("players: required in CI: {what} (.ci/run installs them)");
    }
    eprintln!("SKIPPED players: missing {what}");
    false
}

/// The first major version number in `text` (`Chromium 156.0.8078.114 built on …`,
/// `156.0.8078.47`).
fn major(text: &str) -> Option<u32> {
    text.split(|c: char| !c.is_ascii_digit() && c != '.')
        .find(|w| w.contains('.') && w.starts_with(|c: char| c.is_ascii_digit()))?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// Whether Chromium (major `chromium`) and puppeteer-core (built for Chrome major
/// `built_for`) go together: an older Chromium than puppeteer-core's never does (it
/// lacks the DevTools protocol puppeteer-core speaks); a newer one may, with a warning
/// (`Ok(Some)`), except under CI (`strict`), where the majors must be the same, so that
/// the pair CI runs is the pair the test was seen passing with.
fn pair_verdict(chromium: u32, built_for: u32, strict: bool) -> Result<Option<String>, String> {
    let fix = format!(
        "add the puppeteer-core release built for Chrome {chromium} to \
         tests/players/puppeteer-for-chrome.txt (its PUPPETEER_REVISIONS.chrome; `npm view \
         puppeteer-core` lists the releases), run .ci/run's npm step (or `npm install \
         --no-save puppeteer-core@VERSION` in tests/players) and this test"
    );
    if chromium < built_for {
        return Err(format!("Chromium {chromium} is older than the Chrome {built_for} puppeteer-core is built for: {fix}"));
    }
    if chromium == built_for {
        return Ok(None);
    }
    let what = format!(
        "Chromium {chromium} is newer than the Chrome {built_for} puppeteer-core is built for"
    );
    if strict {
        Err(format!("{what} (CI=true wants the same major): {fix}"))
    } else {
        Ok(Some(format!("{what}; it may work: {fix}")))
    }
}

/// Checks the installed Chromium against the installed puppeteer-core (see
/// [`pair_verdict`]); panics naming both when they do not go together.
fn browser_pair() {
    let out = Command::new("chromium")
        .arg("--version")
        .output()
        .expect("chromium --version");
    let chromium = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // Asked of puppeteer-core itself, as play.mjs loads it.
    let out = Command::new("node")
        .args([
            "--input-type=module",
            "-e",
            "import { PUPPETEER_REVISIONS as r } from 'puppeteer-core';\
             import { readFileSync } from 'node:fs';\
             const p = JSON.parse(readFileSync('node_modules/puppeteer-core/package.json'));\
             console.log(p.version + ' ' + r.chrome);",
        ])
        .current_dir(repo("tests/players"))
        .output()
        .expect("node");
    let puppeteer = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (version, built_for) = puppeteer.split_once(' ').unwrap_or_else(|| {
        panic!(
            "players: cannot read puppeteer-core's version and Chrome: {puppeteer}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let both = format!("`{chromium}` (chromium --version) and puppeteer-core {version} (built for Chrome {built_for})");
    let (Some(c), Some(p)) = (major(&chromium), major(built_for)) else {
        panic!("players: no major version in {both}");
    };
    let strict = std::env::var("CI").is_ok_and(|v| v == "true");
    match pair_verdict(c, p, strict) {
        Ok(None) => eprintln!("players: {both}"),
        Ok(Some(warning)) => eprintln!("players: WARNING: {both}: {warning}"),
        Err(e) => panic!("players: {both} do not go together: {e}"),
    }
}

#[test]
fn the_browser_pair_is_checked_by_major_version() {
    assert_eq!(
        major("Chromium 156.0.8078.114 built on Debian GNU/Linux 12"),
        Some(156)
    );
    assert_eq!(major("136.0.7103.94"), Some(136));
    assert_eq!(major("Chromium"), None);
    assert_eq!(pair_verdict(156, 156, true), Ok(None));
    assert!(pair_verdict(156, 136, true)
        .unwrap_err()
        .contains("Chromium 156 is newer than the Chrome 136"));
    assert!(pair_verdict(156, 136, false).unwrap().is_some());
    assert!(pair_verdict(135, 136, false).is_err());
}

/// `program`'s path on PATH (puppeteer wants one).
fn which(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(program))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("{program} is not on PATH"))
}

/// A port below the kernel's ephemeral range (`common::etcd::free_port`): with
/// `bind(0)`, steerdns once found its port taken when two suites ran at once, and the
/// test said "steerdns does not answer".
fn free_port() -> u16 {
    common::etcd::free_port()
}

fn run(what: &str, cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// 90 s of 320x180 H.264 test picture, as HLS (MPEG-TS) and DASH (fMP4), in 1 s
/// segments, under `dir/hls` and `dir/dash`.
fn make_stream(dir: &Path) {
    let common = |out: &mut Command| {
        out.args(["-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi"])
            .args(["-i", "testsrc2=size=320x180:rate=25", "-t", "90"])
            .args(["-c:v", "libx264", "-preset", "ultrafast", "-profile:v"])
            .args(["baseline", "-pix_fmt", "yuv420p", "-g", "25"])
            .args(["-keyint_min", "25", "-sc_threshold", "0"]);
    };
    std::fs::create_dir_all(dir.join("hls")).unwrap();
    std::fs::create_dir_all(dir.join("dash")).unwrap();
    let mut hls = Command::new("ffmpeg");
    common(&mut hls);
    hls.args(["-f", "hls", "-hls_time", "1", "-hls_playlist_type", "vod"])
        .arg("-hls_segment_filename")
        .arg(dir.join("hls/seg%03d.ts"))
        .arg(dir.join("hls/media.m3u8"));
    run("ffmpeg (HLS)", &mut hls);
    let mut dash = Command::new("ffmpeg");
    common(&mut dash);
    dash.args(["-f", "dash", "-seg_duration", "1", "-use_template", "1"])
        .args([
            "-use_timeline",
            "0",
            "-init_seg_name",
            "init-$RepresentationID$.m4s",
        ])
        .args([
            "-media_seg_name",
            "chunk-$RepresentationID$-$Number%05d$.m4s",
        ])
        .arg(dir.join("dash/stream.mpd"));
    run("ffmpeg (DASH)", &mut dash);
}

/// An access log's segment requests: (unix time, path).
fn segments(log: &Path, player: &str) -> Vec<(f64, String)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let t: f64 = f.next()?.parse().ok()?;
            let (_, path) = (f.next()?, f.next()?);
            let seg = path.starts_with(&format!("/{player}/"))
                && (path.ends_with(".ts") || path.contains("/chunk-"));
            seg.then(|| (t, path.to_string()))
        })
        .collect()
}

fn unix_now() -> f64 {
    steerdns::clock::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Polls `log` until `player` has fetched `n` segments after `since` (unix time), for
/// at most `within`; returns the time of the first.
fn first_after(log: &Path, player: &str, since: f64, n: usize, within: Duration) -> Option<f64> {
    let deadline = Instant::now() + within;
    loop {
        let after: Vec<f64> = segments(log, player)
            .into_iter()
            .map(|(t, _)| t)
            .filter(|&t| t > since)
            .collect();
        if after.len() >= n {
            return after.first().copied();
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A plain HTTP/1.1 request (no client library: the test stays synchronous); the
/// status and body.
fn http(port: u16, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {TOKEN}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

/// The player driver's stdout lines, read on a thread.
struct Driver {
    /// Stopped by PID when the test ends (after it was asked to close Chromium).
    proc: Proc,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Drop for Driver {
    /// Closes the driver's stdin, which makes it close Chromium and exit; waits 10 s
    /// at most for that, so that no browser outlives the test, then `Proc` kills it.
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !matches!(self.proc.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Driver {
    fn expect(&self, prefix: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return l,
                Ok(l) => assert!(!l.starts_with("NOT PLAYING"), "{l}"),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("the player driver did not say {prefix} in {within:?}")
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("the player driver ended before saying {prefix} (its errors are above)")
                }
            }
        }
    }
    fn say(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("the driver's stdin");
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }
}

fn artifacts() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo("target"));
    let dir = target.join("artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn hls_js_and_dash_js_follow_a_drain_in_chromium() {
    if !require() {
        return;
    }
    browser_pair();
    let dir = std::env::temp_dir().join(format!("steerdns-players-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (media, site) = (dir.join("media"), dir.join("site"));
    std::fs::create_dir_all(site.join("lib")).unwrap();
    make_stream(&media);

    // steerdns: www.example.com on a and b, 50/50, drains in one step, TTL 1; the
    // page's origin may post beacons.
    let (dns, api, steer) = (free_port(), free_port(), free_port());
    let (pa, pb, pp) = (free_port(), free_port(), free_port());
    std::fs::create_dir_all(dir.join("probes")).unwrap();
    std::fs::create_dir_all(dir.join("zones")).unwrap();
    std::fs::copy(
        repo("tests/fixtures/zones/example.com.zone"),
        dir.join("zones/example.com.zone"),
    )
    .unwrap();
    std::fs::write(
        dir.join("steering.yaml"),
        "hostname: www.example.com
ttl: 30
cdns:
  a: { cname: a.cdn.test. }
  b: { cname: b.cdn.test. }
regions:
  - match: [\"*\"]
    weights: { a: 50, b: 50 }
failover:
  steps: [100]
content_steering:
  ttl: 1
",
    )
    .unwrap();
    let token = dir.join("token");
    std::fs::write(&token, TOKEN).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let _steerdns = spawn(
        "steerdns",
        steerdns(&["serve"])
            .arg("--config")
            .arg(dir.join("steering.yaml"))
            .arg("--zones")
            .arg(dir.join("zones"))
            .arg("--geo")
            .arg(repo(common::TEST_GEO))
            .arg("--probes")
            .arg(dir.join("probes"))
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--api-token-file")
            .arg(&token)
            .args(["--listen", &format!("127.0.0.1:{dns}")])
            .args(["--api", &format!("127.0.0.1:{api}")])
            .args(["--steering-http", &format!("127.0.0.1:{steer}")])
            .args(["--beacon-origin", &format!("http://127.0.0.1:{pp}")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("steerdns.log")).unwrap()),
    );
    // A session that starts on a (the test's first phase needs both players there).
    let deadline = Instant::now() + Duration::from_secs(10);
    let session = loop {
        assert!(Instant::now() < deadline, "steerdns does not answer");
        if std::net::TcpStream::connect(("127.0.0.1", steer)).is_err() {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let (status, body) = http(steer, "GET", "/steer/hls/www.example.com", None);
        assert_eq!(status, 200, "{body}");
        let m: serde_json::Value = serde_json::from_str(&body).unwrap();
        if m["PATHWAY-PRIORITY"][0] == "a" {
            let uri = m["RELOAD-URI"].as_str().unwrap();
            break uri.rsplit_once("session=").unwrap().1[..16].to_string();
        }
    };
    let steering = |format: &str| {
        format!("http://127.0.0.1:{steer}/steer/{format}/www.example.com?session={session}")
    };

    // The CDNs, and the page's server.
    let (log_a, log_b) = (dir.join("a.log"), dir.join("b.log"));
    let cdn = |name: &'static str, port: u16, root: &Path, log: &Path| {
        spawn(
            name,
            Command::new("python3")
                .arg(repo("tests/players/cdn.py"))
                .arg(port.to_string())
                .arg(root)
                .arg(log)
                .stdout(Stdio::null())
                .stderr(Stdio::inherit()),
        )
    };
    let _a = cdn("cdn a", pa, &media, &log_a);
    let _b = cdn("cdn b", pb, &media, &log_b);
    let _site = cdn("page server", pp, &site, &dir.join("site.log"));

    // The multivariant playlist: one variant per pathway, and the steering server.
    let playlist = format!(
        "#EXTM3U
#EXT-X-VERSION:6
#EXT-X-INDEPENDENT-SEGMENTS
#EXT-X-CONTENT-STEERING:SERVER-URI=\"{}\",PATHWAY-ID=\"a\"
#EXT-X-STREAM-INF:BANDWIDTH=800000,RESOLUTION=320x180,CODECS=\"avc1.42c00c\",PATHWAY-ID=\"a\"
http://127.0.0.1:{pa}/hls/media.m3u8
#EXT-X-STREAM-INF:BANDWIDTH=800000,RESOLUTION=320x180,CODECS=\"avc1.42c00c\",PATHWAY-ID=\"b\"
http://127.0.0.1:{pb}/hls/media.m3u8
",
        steering("hls")
    );
    std::fs::write(site.join("main.m3u8"), playlist).unwrap();
    // The MPD: one BaseURL per service location, and the steering server.
    let mpd = std::fs::read_to_string(media.join("dash/stream.mpd")).unwrap();
    let at = mpd.find("<Period").expect("an MPD with a Period");
    let mpd = format!(
        "{}<BaseURL serviceLocation=\"a\">http://127.0.0.1:{pa}/dash/</BaseURL>
\t<BaseURL serviceLocation=\"b\">http://127.0.0.1:{pb}/dash/</BaseURL>
\t<ContentSteering defaultServiceLocation=\"a\" queryBeforeStart=\"true\">{}</ContentSteering>
\t{}",
        &mpd[..at],
        steering("dash").replace('&', "&amp;"),
        &mpd[at..]
    );
    std::fs::write(site.join("main.mpd"), mpd).unwrap();
    std::fs::copy(repo("tests/players/page.html"), site.join("index.html")).unwrap();
    let modules = repo("tests/players/node_modules");
    std::fs::copy(
        modules.join("hls.js/dist/hls.min.js"),
        site.join("lib/hls.min.js"),
    )
    .unwrap();
    std::fs::copy(
        modules.join("dashjs/dist/dash.all.min.js"),
        site.join("lib/dash.all.min.js"),
    )
    .unwrap();

    // Chromium.
    let page = format!(
        "http://127.0.0.1:{pp}/index.html?hls=http://127.0.0.1:{pp}/main.m3u8&dash=http://127.0.0.1:{pp}/main.mpd&rum=http://127.0.0.1:{steer}/rum/www.example.com&cdns={pa}:a,{pb}:b"
    );
    let mut child = Command::new("node")
        .arg(repo("tests/players/play.mjs"))
        .arg(which("chromium"))
        .arg(&page)
        .current_dir(repo("tests/players"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("node");
    let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut driver = Driver {
        proc: Proc {
            name: "node play.mjs",
            child,
        },
        stdin: Some(stdin),
        lines,
    };
    driver.expect("PLAYING", Duration::from_secs(60));

    let bound = TTL + SEGMENT + SLACK;
    let started = unix_now();
    for player in ["hls", "dash"] {
        assert!(
            first_after(&log_a, player, started, 2, Duration::from_secs(10)).is_some(),
            "{player}: no segments from A while undrained"
        );
    }
    assert!(
        segments(&log_b, "hls").is_empty() && segments(&log_b, "dash").is_empty(),
        "segments from B before the drain: the session should start on a"
    );

    // Drain a.
    let (status, body) = http(
        api,
        "POST",
        "/v1/drains",
        Some(
            r#"{"name": "www.example.com", "cdn": "a", "reason": "players test", "immediate": true}"#,
        ),
    );
    assert_eq!(status, 201, "{body}");
    let drained_at = unix_now();
    let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut moved = Vec::new();
    for player in ["hls", "dash"] {
        let at = first_after(&log_b, player, drained_at, 2, Duration::from_secs(15))
            .unwrap_or_else(|| panic!("{player}: no segments from B after the drain"));
        moved.push((player, at - drained_at));
    }
    driver.say(&format!(
        "shot {}",
        artifacts().join("players-drained.png").display()
    ));
    driver.expect("SHOT", Duration::from_secs(10));
    // Settled on B: while each player fetches two more segments from B, nothing from A.
    let settled = unix_now();
    for player in ["hls", "dash"] {
        first_after(&log_b, player, settled, 2, Duration::from_secs(15))
            .unwrap_or_else(|| panic!("{player}: stopped fetching from B"));
    }
    for player in ["hls", "dash"] {
        let late: Vec<_> = segments(&log_a, player)
            .into_iter()
            .filter(|(t, _)| *t > settled)
            .collect();
        assert!(late.is_empty(), "{player}: still fetching from A: {late:?}");
    }

    // End the drain.
    let (status, body) = http(api, "DELETE", &format!("/v1/drains/{id}"), None);
    assert_eq!(status, 200, "{body}");
    let undrained_at = unix_now();
    let mut back = Vec::new();
    for player in ["hls", "dash"] {
        let at = first_after(&log_a, player, undrained_at, 2, Duration::from_secs(15))
            .unwrap_or_else(|| panic!("{player}: no segments from A after the drain ended"));
        back.push((player, at - undrained_at));
    }
    let shot = artifacts().join("players.png");
    driver.say(&format!("shot {}", shot.display()));
    driver.expect("SHOT", Duration::from_secs(10));
    driver.say("state");
    let state = driver.expect("STATE", Duration::from_secs(10));
    eprintln!(
        "players: moved to B after {moved:?} s, back to A after {back:?} s (bound {:.1} s); {state}; screenshot {}",
        bound.as_secs_f64(),
        shot.display()
    );
    for (player, t) in moved.iter().chain(&back) {
        assert!(
            *t <= bound.as_secs_f64(),
            "{player}: {t:.2} s to follow, over TTL + segment + slack = {bound:?}"
        );
    }
    assert!(state.contains("\"errors\":[]"), "player errors: {state}");
    // The beacons: every one taken, from both players, and counted (the region has no
    // `performance:` block: `unused`), none refused for its ticket.
    let s: serde_json::Value =
        serde_json::from_str(state.trim_start_matches("STATE ")).expect("STATE is JSON");
    let b = &s["beacons"];
    assert_eq!(
        b["refused"],
        serde_json::json!([]),
        "beacons refused: {state}"
    );
    assert!(
        b["ok"].as_u64() >= Some(4) && b["ok"] == b["posted"],
        "beacons: {state}"
    );
    let (status, metrics) = http(api, "GET", "/metrics", None);
    assert_eq!(status, 200);
    let value = |series: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let taken = value(r#"steerdns_rum_samples_total{result="unused"}"#);
    assert!(taken >= 4.0, "samples taken: {taken}");
    // Only each player's first steering poll comes without a ticket (its URL is the
    // playlist's or the MPD's); every later one carries its manifest's.
    let unticketed = value(r#"steerdns_rum_samples_total{result="refused_ticket"}"#);
    assert!(unticketed <= 2.0, "samples without a ticket: {unticketed}");
    drop(driver);
    let _ = std::fs::remove_dir_all(&dir);
}
