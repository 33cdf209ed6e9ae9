//! Input: the probe files in `probes/`: one `<cdn>.yaml` per CDN that the prober
//! checks, and `vantages.yaml`, the other vantage points whose observations count.
//!
//! ```yaml
//! url: https://a.cdn.example.com/_health/v1.txt  # a real object through the real CDN path
//! host: www.example.com        # optional Host header and TLS SNI
//! connect_to: 151.101.1.57     # optional: the edge address to probe
//! expect_status: 200
//! expect_body: healthy-v1      # a 200 whose body is an error page is a failure
//! timeout_ms: 3000
//! max_ttfb_ms: 800
//! interval_seconds: 10
//! quorum: 1                    # vantage points that must agree a round is bad
//! down_after: 2                # consecutive bad rounds to mark down
//! up_after: 10                 # consecutive good rounds to mark up
//! ```
//!
//! A CDN without a probe file is never demoted by the prober.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{line_of, render, Seg};
use crate::error::{ConfigIssue, Issues};

/// How to check one CDN.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeSpec {
    /// The CDN's name (the file's stem), as in the policy's `cdns:`.
    pub cdn: String,
    pub file: PathBuf,
    pub url: reqwest::Url,
    /// Host header and SNI, when not the URL's host.
    pub host: Option<String>,
    /// Edge address to connect to instead of resolving the URL's host.
    pub connect_to: Option<IpAddr>,
    pub expect_status: u16,
    /// Text the body must contain.
    pub expect_body: Option<String>,
    pub timeout: Duration,
    /// Time to first byte above which the probe fails as slow.
    pub max_ttfb: Duration,
    pub interval: Duration,
    pub quorum: u32,
    pub down_after: u32,
    pub up_after: u32,
}

/// Everything in `probes/`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Probes {
    pub specs: Vec<ProbeSpec>,
    /// Base URLs of the other vantage points (`https://ns2.example.net:9443`; plain
    /// http only on loopback).
    pub vantages: Vec<reqwest::Url>,
}

impl Probes {
    pub fn get(&self, cdn: &str) -> Option<&ProbeSpec> {
        self.specs.iter().find(|s| s.cdn == cdn)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProbe {
    url: String,
    host: Option<String>,
    connect_to: Option<String>,
    expect_status: Option<u16>,
    expect_body: Option<String>,
    timeout_ms: Option<u64>,
    max_ttfb_ms: Option<u64>,
    interval_seconds: Option<f64>,
    quorum: Option<u32>,
    down_after: Option<u32>,
    up_after: Option<u32>,
}

/// Loads `dir`. A missing directory means no probes (nothing is ever demoted).
/// `cdns`, when given, are the CDN names the policy defines: a probe file for any other name is
/// an error (a typo would otherwise leave a CDN unprobed).
pub fn load_dir(dir: &Path, cdns: Option<&[&str]>) -> Result<(Probes, Issues), Issues> {
    let mut issues = Issues::default();
    let mut probes = Probes::default();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((probes, issues)),
        Err(e) => {
            return Err(Issues(vec![ConfigIssue::error(
                dir,
                None,
                "",
                format!("cannot read: {e}"),
            )]))
        }
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    for file in files {
        let stem = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_string();
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) => {
                issues.push(ConfigIssue::error(
                    &file,
                    None,
                    "",
                    format!("cannot read: {e}"),
                ));
                continue;
            }
        };
        if stem == "vantages" {
            probes.vantages = vantages(&file, &text, &mut issues);
            continue;
        }
        if let Some(cdns) = cdns.filter(|c| !c.contains(&stem.as_str())) {
            issues.push(ConfigIssue::error(
                &file,
                None,
                "",
                format!("no CDN named `{stem}` in the policy (CDNs: {}); probe files are named after the CDN", cdns.join(", ")),
            ));
            continue;
        }
        if let Some(spec) = probe(&file, &stem, &text, &mut issues) {
            probes.specs.push(spec);
        }
    }
    if issues.has_errors() {
        return Err(issues);
    }
    Ok((probes, issues))
}

/// Parses one probe file's text as if read from `file` (its stem names the CDN;
/// `vantages.yaml` is the vantage list), without reading the disk; for the fuzzer.
pub fn parse_file(file: &Path, text: &str) -> (Probes, Issues) {
    let mut issues = Issues::default();
    let mut probes = Probes::default();
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if stem == "vantages" {
        probes.vantages = vantages(file, text, &mut issues);
    } else if let Some(spec) = probe(file, stem, text, &mut issues) {
        probes.specs.push(spec);
    }
    (probes, issues)
}

fn probe(file: &Path, cdn: &str, text: &str, issues: &mut Issues) -> Option<ProbeSpec> {
    let raw: RawProbe = match serde_yaml::from_str(text) {
        Ok(r) => r,
        Err(e) => {
            issues.push(super::yaml_issue(file, text, &e));
            return None;
        }
    };
    let errors_before = issues.errors().count();
    let mut err = |field: &str, msg: String| {
        let path = [Seg::Key(field.to_string())];
        issues.push(ConfigIssue::error(
            file,
            line_of(text, &path),
            render(&path),
            msg,
        ));
    };
    let url = match reqwest::Url::parse(&raw.url) {
        Ok(u) if (u.scheme() == "http" || u.scheme() == "https") && u.host_str().is_some() => {
            Some(u)
        }
        Ok(u) => {
            err(
                "url",
                format!("`{u}`: an http:// or https:// URL with a host is needed"),
            );
            None
        }
        Err(e) => {
            err("url", format!("`{}` is not a URL: {e}", raw.url));
            None
        }
    };
    let connect_to = raw
        .connect_to
        .as_deref()
        .and_then(|s| match s.parse::<IpAddr>() {
            Ok(ip) => Some(ip),
            Err(_) => {
                err("connect_to", format!("`{s}` is not an IP address"));
                None
            }
        });
    if let Some(h) = &raw.host {
        if h.is_empty() || h.contains(['/', ' ', ':']) {
            err("host", format!("`{h}` is not a host name"));
        }
    }
    let expect_status = raw.expect_status.unwrap_or(200);
    if !(100..=599).contains(&expect_status) {
        err(
            "expect_status",
            format!("{expect_status} is not an HTTP status"),
        );
    }
    let timeout = Duration::from_millis(raw.timeout_ms.unwrap_or(3000));
    if timeout.is_zero() || timeout > Duration::from_secs(60) {
        err("timeout_ms", "must be 1 to 60000".into());
    }
    let max_ttfb = raw
        .max_ttfb_ms
        .map(Duration::from_millis)
        .unwrap_or(timeout);
    if max_ttfb.is_zero() {
        err("max_ttfb_ms", "must be above 0".into());
    }
    let interval_s = raw.interval_seconds.unwrap_or(10.0);
    if !(0.01..=3600.0).contains(&interval_s) {
        err(
            "interval_seconds",
            format!("{interval_s} is not 0.01 to 3600 seconds"),
        );
    }
    let interval = Duration::from_secs_f64(interval_s.clamp(0.01, 3600.0));
    if timeout > interval && interval_s >= 0.01 {
        issues.push(ConfigIssue::warning(
            file,
            line_of(text, &[Seg::Key("timeout_ms".into())]),
            "timeout_ms",
            "longer than the interval: a hanging CDN delays the next round",
        ));
    }
    let mut count = |field: &str, v: Option<u32>, default: u32| {
        let v = v.unwrap_or(default);
        if !(1..=1000).contains(&v) {
            let path = [Seg::Key(field.to_string())];
            issues.push(ConfigIssue::error(
                file,
                line_of(text, &path),
                field,
                format!("{v} is not 1 to 1000"),
            ));
        }
        v
    };
    let quorum = count("quorum", raw.quorum, 1);
    let down_after = count("down_after", raw.down_after, 2);
    let up_after = count("up_after", raw.up_after, 10);
    if issues.errors().count() > errors_before {
        return None;
    }
    Some(ProbeSpec {
        cdn: cdn.to_string(),
        file: file.to_path_buf(),
        url: url?,
        host: raw.host,
        connect_to,
        expect_status,
        expect_body: raw.expect_body.filter(|b| !b.is_empty()),
        timeout,
        max_ttfb,
        interval,
        quorum,
        down_after,
        up_after,
    })
}

/// Whether `u` names this machine (a loopback address or `localhost`): plain http stays
/// on it.
fn loopback(u: &reqwest::Url) -> bool {
    let Some(host) = u.host_str() else {
        return false;
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(a) => a.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

fn vantages(file: &Path, text: &str, issues: &mut Issues) -> Vec<reqwest::Url> {
    let raw: Option<Vec<String>> = match serde_yaml::from_str(text) {
        Ok(r) => r,
        Err(e) => {
            issues.push(super::yaml_issue(file, text, &e));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (i, v) in raw.unwrap_or_default().iter().enumerate() {
        match reqwest::Url::parse(v) {
            Ok(u) if u.scheme() == "https" => out.push(u),
            Ok(u) if u.scheme() == "http" && loopback(&u) => out.push(u),
            Ok(u) if u.scheme() == "http" => {
                let path = [Seg::Index(i)];
                issues.push(ConfigIssue::error(
                    file,
                    line_of(text, &path),
                    format!("[{i}]"),
                    format!(
                        "`{v}`: plain http to a peer on the network: anyone on the path could \
                         forge its observations and demote a CDN; use https:// (a TLS proxy \
                         in front of the peer's --api) or a set sharing etcd (--etcd)"
                    ),
                ));
            }
            _ => {
                let path = [Seg::Index(i)];
                issues.push(ConfigIssue::error(
                    file,
                    line_of(text, &path),
                    format!("[{i}]"),
                    format!("`{v}` is not a vantage point URL like https://ns2.example.net:9443"),
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str, files: &[(&str, &str)]) -> PathBuf {
        let d = std::env::temp_dir().join(format!("steerdns-probes-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        for (name, text) in files {
            std::fs::write(d.join(name), text).unwrap();
        }
        d
    }

    #[test]
    fn a_peer_on_the_network_needs_https() {
        let (p, issues) = parse_file(
            Path::new("probes/vantages.yaml"),
            "- https://ns2.example.net:9443\n- http://127.0.0.2:9153\n- http://[::1]:9153\n- http://localhost:9153\n",
        );
        assert!(!issues.has_errors(), "{issues}");
        assert_eq!(p.vantages.len(), 4);
        for remote in [
            "- http://ns2.example.net:9153\n",
            "- http://10.0.0.2:9153\n",
        ] {
            let (p, issues) = parse_file(Path::new("probes/vantages.yaml"), remote);
            assert!(issues.has_errors(), "{remote}");
            assert!(issues.to_string().contains("plain http"), "{issues}");
            assert!(p.vantages.is_empty());
        }
    }

    #[test]
    fn one_file_parses_without_the_disk() {
        let (p, issues) = parse_file(
            Path::new("probes/fastly.yaml"),
            "url: https://a.example.com/_health/v1.txt\n",
        );
        assert!(!issues.has_errors(), "{issues}");
        assert_eq!(p.specs[0].cdn, "fastly");
        let (p, _) = parse_file(
            Path::new("probes/vantages.yaml"),
            "- http://127.0.0.2:9153\n",
        );
        assert_eq!(p.vantages.len(), 1);
        let (_, issues) = parse_file(Path::new("probes/fastly.yaml"), "url: [\n");
        assert!(issues.has_errors());
    }

    #[test]
    fn loads_with_defaults() {
        let d = dir("ok", &[
            ("fastly.yaml", "url: https://a.example.com/_health/v1.txt\nexpect_body: healthy-v1\nconnect_to: 127.0.0.1\n"),
            ("vantages.yaml", "- http://127.0.0.2:9153\n"),
        ]);
        let (p, _) = load_dir(&d, Some(&["fastly", "cloudflare"])).unwrap();
        let s = p.get("fastly").unwrap();
        assert_eq!(
            (s.expect_status, s.quorum, s.down_after, s.up_after),
            (200, 1, 2, 10)
        );
        assert_eq!(s.interval, Duration::from_secs(10));
        assert_eq!(s.connect_to, Some("127.0.0.1".parse().unwrap()));
        assert_eq!(p.vantages.len(), 1);
        assert!(p.get("cloudflare").is_none());
        assert!(load_dir(&d.join("missing"), None)
            .unwrap()
            .0
            .specs
            .is_empty());
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let d = dir(
            "bad",
            &[
                (
                    "fastly.yaml",
                    "url: https://a.example.com/\ndown_after: 0\nconnect_to: nowhere\n",
                ),
                ("akamai.yaml", "url: https://a.example.com/\n"),
                (
                    "cloudflare.yaml",
                    "url: https://a.example.com/\nintervall_seconds: 5\n",
                ),
            ],
        );
        let e = load_dir(&d, Some(&["fastly", "cloudflare"]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("fastly.yaml:2: down_after: 0 is not 1 to 1000"),
            "{e}"
        );
        assert!(
            e.contains("fastly.yaml:3: connect_to: `nowhere` is not an IP address"),
            "{e}"
        );
        assert!(e.contains("akamai.yaml: no CDN named `akamai`"), "{e}");
        assert!(
            e.contains("cloudflare.yaml:2:") && e.contains("unknown field `intervall_seconds`"),
            "{e}"
        );
    }
}
