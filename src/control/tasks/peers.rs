//! Control plane: the other vantage points. Polls each peer's `/v1/observations` and
//! keeps its latest answer; a peer that cannot be read, answers garbage or is slow is
//! reported as unhappy (it never counts as a CDN failure).
//!
//! What a peer sends is checked before it counts:
//!
//! | check | refused as |
//! |---|---|
//! | connection, then the whole exchange within the timeout (1 to 2 s) | `connect`, `timeout` |
//! | status 2xx, a complete HTTP exchange | `status`, `http` |
//! | at most [`MAX_BODY`] bytes, announced or read (reading stops there) | `too_large` |
//! | JSON of the exact schema (unknown fields refused), a sane vantage name, at most [`MAX_OBSERVATIONS`] CDNs with short names and reasons | `invalid` |
//!
//! A refused reading is counted (`steerdns_peer_errors_total{peer,reason}`, the peer
//! labelled by its configured URL) and makes the peer unhappy until a good reading.
//! Freshness: each observation carries its age (`age_ms`, relative, so no clock needs to
//! agree), and an observation whose round number does not advance keeps ageing here
//! even when the peer keeps saying it is new (a peer replaying a cached document); the
//! verdict ignores observations older than three probe intervals.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::control::decide::health::{Observation, VantageView};
use crate::metrics::Metrics;

/// Largest observations document accepted from a peer.
pub(crate) const MAX_BODY: usize = 1024 * 1024;
/// Most CDNs one document may report.
pub(crate) const MAX_OBSERVATIONS: usize = 1024;
/// Longest vantage or CDN name accepted from a peer.
const MAX_NAME: usize = 128;
/// Longest probe reason accepted from a peer.
const MAX_REASON: usize = 2048;

/// What `/v1/observations` serves.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Published {
    pub vantage: String,
    pub observations: BTreeMap<String, Observation>,
}

/// The latest reading of every peer.
#[derive(Clone, Default)]
pub struct Peers {
    inner: Arc<Mutex<BTreeMap<String, Reading>>>,
}

#[derive(Clone)]
struct Reading {
    result: Result<Published, String>,
    at: Instant,
}

/// Why a reading of a peer was refused: a metric label and the detail for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    /// `timeout`, `connect`, `status`, `http`, `too_large` or `invalid`.
    pub reason: &'static str,
    pub detail: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.detail)
    }
}

fn refused(reason: &'static str, detail: impl Into<String>) -> Refused {
    Refused {
        reason,
        detail: detail.into(),
    }
}

impl Peers {
    /// Every peer's view now: observation ages include the time since the reading.
    pub fn views(&self) -> Vec<VantageView> {
        let map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        map.iter()
            .map(|(url, r)| {
                let since = now.saturating_duration_since(r.at).as_millis() as u64;
                match &r.result {
                    Ok(p) => VantageView {
                        name: p.vantage.clone(),
                        latest: p
                            .observations
                            .iter()
                            .map(|(c, o)| {
                                let mut o = o.clone();
                                o.age_ms = o.age_ms.saturating_add(since);
                                (c.clone(), o)
                            })
                            .collect(),
                        error: None,
                        warming_up: false,
                    },
                    Err(e) => VantageView {
                        name: url.clone(),
                        latest: BTreeMap::new(),
                        error: Some(e.clone()),
                        warming_up: false,
                    },
                }
            })
            .collect()
    }

    /// Forgets every reading (before the peers are read anew after a reload).
    pub fn clear(&self) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Polls every peer each `every` until `stop`, counting refused readings into
    /// `metrics`.
    pub fn spawn(
        &self,
        urls: Vec<reqwest::Url>,
        every: Duration,
        stop: CancellationToken,
        metrics: Option<Metrics>,
    ) {
        // Generous even for fast probes: a loaded peer is slow, not down.
        let timeout = every.clamp(Duration::from_secs(1), Duration::from_secs(2));
        // A peer's answer is its own: a redirect to elsewhere is not followed.
        let Ok(client) = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(timeout)
            .build()
        else {
            tracing::error!("cannot build the HTTP client for peers");
            return;
        };
        for url in urls {
            let (client, stop, peers) = (client.clone(), stop.clone(), self.clone());
            let metrics = metrics.clone();
            let key = url.to_string();
            let endpoint = url.join("/v1/observations").unwrap_or(url);
            tokio::spawn(async move {
                let mut progress = Progress::default();
                loop {
                    let result = tokio::select! {
                        _ = stop.cancelled() => return,
                        r = fetch(&client, endpoint.clone()) => r,
                    };
                    let result = match result {
                        Ok(mut p) => {
                            progress.age(&mut p, Instant::now());
                            Ok(p)
                        }
                        Err(e) => {
                            tracing::debug!(peer = %key, reason = e.reason, error = %e.detail, "peer reading refused");
                            if let Some(m) = &metrics {
                                m.peer_error(&key, e.reason);
                            }
                            Err(e.to_string())
                        }
                    };
                    peers
                        .inner
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(
                            key.clone(),
                            Reading {
                                result,
                                at: Instant::now(),
                            },
                        );
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(crate::control::tasks::prober::jittered(every)) => {}
                    }
                }
            });
        }
    }
}

/// Per CDN, the last round number a peer reported, when it was first seen here, and the
/// age the peer gave it then.
#[derive(Default)]
struct Progress(BTreeMap<String, (u64, Instant, u64)>);

impl Progress {
    /// Ages every observation of `p` by at least the time its round number has been
    /// seen here without advancing.
    fn age(&mut self, p: &mut Published, now: Instant) {
        self.0.retain(|cdn, _| p.observations.contains_key(cdn));
        for (cdn, o) in p.observations.iter_mut() {
            match self.0.get(cdn) {
                Some(&(round, first, age)) if round == o.round => {
                    let held = now.saturating_duration_since(first).as_millis() as u64;
                    o.age_ms = o.age_ms.max(age.saturating_add(held));
                }
                _ => {
                    self.0.insert(cdn.clone(), (o.round, now, o.age_ms));
                }
            }
        }
    }
}

fn classify(e: &reqwest::Error) -> Refused {
    let reason = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else {
        "http"
    };
    let mut detail = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        detail.push_str(": ");
        detail.push_str(&s.to_string());
        source = s.source();
    }
    refused(reason, detail)
}

async fn fetch(client: &reqwest::Client, url: reqwest::Url) -> Result<Published, Refused> {
    let mut response = client.get(url).send().await.map_err(|e| classify(&e))?;
    if !response.status().is_success() {
        return Err(refused("status", format!("status {}", response.status())));
    }
    if response
        .content_length()
        .is_some_and(|n| n > MAX_BODY as u64)
    {
        return Err(refused(
            "too_large",
            format!("observations larger than {} KiB", MAX_BODY / 1024),
        ));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| classify(&e))? {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(refused(
                "too_large",
                format!("observations larger than {} KiB", MAX_BODY / 1024),
            ));
        }
        body.extend_from_slice(&chunk);
    }
    parse(&body)
}

/// Parses and validates an observations document from a peer.
pub(crate) fn parse(body: &[u8]) -> Result<Published, Refused> {
    let p: Published = serde_json::from_slice(body)
        .map_err(|e| refused("invalid", format!("not an observations document: {e}")))?;
    validate(&p).map_err(|e| refused("invalid", e))?;
    Ok(p)
}

fn sane_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:@".contains(&b))
}

fn validate(p: &Published) -> Result<(), String> {
    if !sane_name(&p.vantage) {
        return Err(format!(
            "vantage name {:?} is not 1 to {MAX_NAME} characters of letters, digits and ._-:@",
            p.vantage.chars().take(MAX_NAME).collect::<String>()
        ));
    }
    if p.observations.len() > MAX_OBSERVATIONS {
        return Err(format!(
            "{} observations (at most {MAX_OBSERVATIONS})",
            p.observations.len()
        ));
    }
    for (cdn, o) in &p.observations {
        if !sane_name(cdn) {
            return Err(format!(
                "CDN name {:?} is not 1 to {MAX_NAME} characters of letters, digits and ._-:@",
                cdn.chars().take(MAX_NAME).collect::<String>()
            ));
        }
        if o.reason.len() > MAX_REASON {
            return Err(format!("{cdn}: reason longer than {MAX_REASON} bytes"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(vantage: &str, cdn: &str, reason: &str) -> String {
        serde_json::json!({
            "vantage": vantage,
            "observations": { cdn: { "round": 3, "ok": false, "reason": reason, "age_ms": 5 } },
        })
        .to_string()
    }

    #[test]
    fn good_documents_pass() {
        let p = parse(doc("ns2.example.net", "fastly", "status 503").as_bytes()).unwrap();
        assert_eq!(p.vantage, "ns2.example.net");
        assert_eq!(p.observations["fastly"].round, 3);
    }

    #[test]
    fn garbage_is_invalid() {
        for body in [
            "".to_string(),
            "<html>502 Bad Gateway</html>".into(),
            "{\"vantage\": \"x\"}".into(),
            "{\"vantage\": \"x\", \"observations\": {}, \"extra\": 1}".into(),
            "{\"vantage\": \"x\", \"observations\": {\"a\": {\"round\": -1, \"ok\": false, \"reason\": \"\", \"age_ms\": 0}}}".into(),
            "{\"vantage\": \"x\", \"observations\": {\"a\": {\"round\": 1, \"ok\": \"no\", \"reason\": \"\", \"age_ms\": 0}}}".into(),
            doc("../../etc", "a", "x"),
            doc("", "a", "x"),
            doc("ns2\nfake log line", "a", "x"),
            doc(&"v".repeat(MAX_NAME + 1), "a", "x"),
            doc("ns2", "a b", "x"),
            doc("ns2", "a", &"r".repeat(MAX_REASON + 1)),
        ] {
            let e = parse(body.as_bytes()).unwrap_err();
            assert_eq!(e.reason, "invalid", "{body:.80}: {e}");
        }
    }

    #[test]
    fn too_many_observations_are_invalid() {
        let obs: serde_json::Map<String, serde_json::Value> = (0..=MAX_OBSERVATIONS)
            .map(|i| {
                (
                    format!("c{i}"),
                    serde_json::json!({"round": 1, "ok": true, "reason": "ok", "age_ms": 0}),
                )
            })
            .collect();
        let body = serde_json::json!({"vantage": "x", "observations": obs}).to_string();
        assert_eq!(parse(body.as_bytes()).unwrap_err().reason, "invalid");
    }

    #[test]
    fn a_round_that_does_not_advance_keeps_ageing() {
        let mut progress = Progress::default();
        let t0 = Instant::now();
        let mut p = parse(doc("p", "a", "x").as_bytes()).unwrap();
        progress.age(&mut p, t0);
        assert_eq!(p.observations["a"].age_ms, 5);
        // The same round, claimed 5 ms old again, 10 s later: 10 s old here.
        let mut p = parse(doc("p", "a", "x").as_bytes()).unwrap();
        progress.age(&mut p, t0 + Duration::from_secs(10));
        assert_eq!(p.observations["a"].age_ms, 10_005);
        // A new round is as old as the peer says.
        let mut p = parse(doc("p", "a", "x").as_bytes()).unwrap();
        p.observations.get_mut("a").unwrap().round = 4;
        progress.age(&mut p, t0 + Duration::from_secs(11));
        assert_eq!(p.observations["a"].age_ms, 5);
    }
}
