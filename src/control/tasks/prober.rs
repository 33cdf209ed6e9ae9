//! Control plane: the prober. Fetches each CDN's canary object through the real CDN
//! path on the probe's interval (with jitter, so probes do not march in step) and
//! records each round's result with its reason. Runs in `serve` and, alone, in `agent`.
//!
//! A probe passes only if the connection (and TLS, certificates verified) succeeds, the
//! status is the expected one, the time to first byte is under `max_ttfb`, and the body
//! contains `expect_body`: a 200 whose body is an error page is a failure.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::RngExt;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::probes::ProbeSpec;
use crate::control::decide::health::Observation;
use crate::metrics::Metrics;

/// Probes running at once, whatever the number of CDNs.
const MAX_CONCURRENT: usize = 16;
/// Bytes of body read to look for `expect_body`.
const MAX_BODY: usize = 64 * 1024;

/// This vantage point's latest result per CDN, shared with the API (`/v1/observations`)
/// and the health evaluation.
#[derive(Clone, Default)]
pub struct Local {
    /// Per CDN: the latest observation, when it was recorded, and since when the CDN
    /// has been failing (the first failed round of the current streak).
    inner: Arc<Mutex<BTreeMap<String, Recorded>>>,
    /// Where every round is counted (`probe_results_total`). Held here rather than
    /// passed to [`spawn`], so that whoever creates the store decides, and the callers
    /// of `spawn` (the controller) stay as they are.
    metrics: Option<Metrics>,
}

#[derive(Clone, Debug)]
struct Recorded {
    obs: Observation,
    at: Instant,
    /// When the probe of this observation began. A probe that began before a
    /// failure of this vantage point's network may still succeed after it: only
    /// probes begun since a failure began say anything about it.
    started: Instant,
    /// When the first failed probe of the current streak began.
    failing_since: Option<Instant>,
}

impl Local {
    /// A store that also counts every round into `metrics`.
    pub fn with_metrics(metrics: Metrics) -> Local {
        Local {
            metrics: Some(metrics),
            ..Local::default()
        }
    }

    fn record(&self, vantage: &str, cdn: &str, mut obs: Observation, started: Instant) {
        if let Some(m) = &self.metrics {
            m.probe(cdn, vantage, (!obs.ok).then_some(obs.reason.as_str()));
        }
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let prev = map.get(cdn);
        obs.round = prev.map_or(1, |r| r.obs.round + 1);
        let failing_since = if obs.ok {
            None
        } else {
            Some(prev.and_then(|r| r.failing_since).unwrap_or(started))
        };
        map.insert(
            cdn.to_string(),
            Recorded {
                obs,
                at: now,
                started,
                failing_since,
            },
        );
    }

    /// Whether every other CDN has been probed since `cdn` began failing (by probes
    /// *begun* since then): until then, "this CDN fails" cannot be told from "this
    /// vantage point's network fails".
    pub fn others_probed_since_failure(&self, cdn: &str) -> bool {
        let map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(since) = map.get(cdn).and_then(|r| r.failing_since) else {
            return true;
        };
        map.iter()
            .filter(|(c, _)| c.as_str() != cdn)
            .all(|(_, r)| r.started >= since)
    }

    /// The latest observations with their age now.
    pub fn snapshot(&self) -> BTreeMap<String, Observation> {
        let map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        map.iter()
            .map(|(cdn, r)| {
                let mut o = r.obs.clone();
                o.age_ms = now.saturating_duration_since(r.at).as_millis() as u64;
                (cdn.clone(), o)
            })
            .collect()
    }
}

/// A round finished for `cdn`: the controller evaluates health now. The round's
/// observation is in [`Local`], the one record that the controller and the peers
/// (`/v1/observations`) both read.
#[derive(Clone, Debug)]
pub struct Round {
    pub cdn: String,
    pub ok: bool,
    /// The time to first byte (ms) when the CDN answered, or the timeout when it did
    /// not answer in time (a lower bound); `None` when it could not be reached.
    pub ttfb_ms: Option<u64>,
}

/// Probes every spec until `stop`, recording into `local` (which counts the rounds
/// when it has metrics) and announcing each round.
pub fn spawn(
    specs: Vec<ProbeSpec>,
    vantage: String,
    local: Local,
    rounds: mpsc::Sender<Round>,
    stop: CancellationToken,
) {
    let limit = Arc::new(Semaphore::new(MAX_CONCURRENT));
    let user_agent = format!(
        "steerdns-prober/{} (vantage {vantage})",
        env!("CARGO_PKG_VERSION")
    );
    let vantage: Arc<str> = vantage.into();
    for spec in specs {
        let (local, rounds, stop, limit, ua, vantage) = (
            local.clone(),
            rounds.clone(),
            stop.clone(),
            limit.clone(),
            user_agent.clone(),
            vantage.clone(),
        );
        tokio::spawn(async move {
            // Start within the first interval, not all at once.
            let mut delay = spec.interval.mul_f64(rand::rng().random_range(0.0..0.2));
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                let ((result, ttfb), started) = {
                    let Ok(_permit) = limit.acquire().await else {
                        return;
                    };
                    let started = Instant::now();
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        r = probe_timed(&spec, &ua) => (r, started),
                    }
                };
                let ok = result.is_ok();
                local.record(
                    &vantage,
                    &spec.cdn,
                    Observation {
                        round: 0,
                        ok,
                        reason: result.err().map_or_else(|| "ok".into(), |e| e.to_string()),
                        age_ms: 0,
                    },
                    started,
                );
                if rounds
                    .send(Round {
                        cdn: spec.cdn.clone(),
                        ok,
                        ttfb_ms: ttfb.map(|t| t.as_millis() as u64),
                    })
                    .await
                    .is_err()
                {
                    return;
                }
                delay = spec.interval.mul_f64(rand::rng().random_range(0.9..1.1));
            }
        });
    }
}

/// Why a probe failed: its text is the observation's reason, which starts with the
/// kind (`timeout`, `connect: …`, `tls: …`, `status 503`, `body mismatch`, `slow: …`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// No response head within the timeout.
    #[error("timeout: no response in {timeout_ms} ms")]
    NoResponse { timeout_ms: u128 },
    /// The head came, the body did not complete within the timeout.
    #[error("timeout: body not complete in {timeout_ms} ms")]
    BodyTimeout { timeout_ms: u128 },
    /// A TLS failure (certificate, handshake), with the error chain.
    #[error("tls: {0}")]
    Tls(String),
    /// The client's own timeout, with the error chain.
    #[error("timeout: {0}")]
    TimedOut(String),
    /// The connection could not be made, with the error chain.
    #[error("connect: {0}")]
    Connect(String),
    /// Any other HTTP failure, with the error chain.
    #[error("http: {0}")]
    Http(String),
    /// The probe's host name does not resolve.
    #[error("connect: cannot resolve {host}: {error}")]
    Resolve { host: String, error: String },
    /// The probe's host name resolves to no address.
    #[error("connect: {host} has no address")]
    NoAddress { host: String },
    /// The `host:` cannot be put in the URL.
    #[error("connect: bad host {host}: {error}")]
    BadHost { host: String, error: String },
    /// The HTTP client cannot be built.
    #[error("client: {0}")]
    Client(String),
    /// An unexpected status.
    #[error("status {got} (expected {expected})")]
    Status { got: u16, expected: u16 },
    /// The first byte came after `max_ttfb`.
    #[error("slow: first byte after {ttfb_ms} ms (limit {limit_ms} ms)")]
    Slow { ttfb_ms: u128, limit_ms: u128 },
    /// The body lacks `expect_body`.
    #[error("body mismatch: `{expected}` not found")]
    BodyMismatch { expected: String },
}

/// One probe; `Err` carries the reason ([`ProbeError`]).
pub async fn probe_once(spec: &ProbeSpec, user_agent: &str) -> Result<(), ProbeError> {
    probe_timed(spec, user_agent).await.0
}

/// One probe, as [`probe_once`], with its time to first byte: measured when the
/// response's head arrived, the timeout when none did in time (the time to first
/// byte is at least that), `None` when the CDN could not be reached.
pub async fn probe_timed(
    spec: &ProbeSpec,
    user_agent: &str,
) -> (Result<(), ProbeError>, Option<Duration>) {
    let (client, url) = match client_for(spec).await {
        Ok(c) => c,
        Err(why) => return (Err(why), None),
    };
    let started = Instant::now();
    let request = client
        .get(url)
        .header(reqwest::header::USER_AGENT, user_agent)
        .header(reqwest::header::CACHE_CONTROL, "no-cache")
        .send();
    let response = match tokio::time::timeout(spec.timeout, request).await {
        Err(_) => {
            let why = ProbeError::NoResponse {
                timeout_ms: spec.timeout.as_millis(),
            };
            return (Err(why), Some(spec.timeout));
        }
        Ok(Err(e)) if e.is_timeout() => return (Err(describe(&e)), Some(spec.timeout)),
        Ok(Err(e)) => return (Err(describe(&e)), None),
        Ok(Ok(r)) => r,
    };
    let ttfb = started.elapsed();
    (check(spec, response, started, ttfb).await, Some(ttfb))
}

/// The checks of a response whose head arrived after `ttfb`.
async fn check(
    spec: &ProbeSpec,
    mut response: reqwest::Response,
    started: Instant,
    ttfb: Duration,
) -> Result<(), ProbeError> {
    let status = response.status().as_u16();
    if status != spec.expect_status {
        return Err(ProbeError::Status {
            got: status,
            expected: spec.expect_status,
        });
    }
    if ttfb > spec.max_ttfb {
        return Err(ProbeError::Slow {
            ttfb_ms: ttfb.as_millis(),
            limit_ms: spec.max_ttfb.as_millis(),
        });
    }
    if let Some(expected) = &spec.expect_body {
        let left = spec.timeout.saturating_sub(started.elapsed());
        let body = tokio::time::timeout(left, async {
            let mut body = Vec::new();
            while body.len() < MAX_BODY {
                match response.chunk().await {
                    Ok(Some(c)) => body.extend_from_slice(&c),
                    Ok(None) => break,
                    Err(e) => return Err(describe(&e)),
                }
            }
            Ok(body)
        })
        .await
        .map_err(|_| ProbeError::BodyTimeout {
            timeout_ms: spec.timeout.as_millis(),
        })??;
        if !String::from_utf8_lossy(&body).contains(expected.as_str()) {
            return Err(ProbeError::BodyMismatch {
                expected: expected.clone(),
            });
        }
    }
    Ok(())
}

/// A client that connects where the probe says, with the Host/SNI it says. Built per
/// round: a probe must open a fresh connection to test the path, not reuse one.
async fn client_for(spec: &ProbeSpec) -> Result<(reqwest::Client, reqwest::Url), ProbeError> {
    let mut url = spec.url.clone();
    let port = url.port_or_known_default().unwrap_or(443);
    let mut builder = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .timeout(spec.timeout)
        .connect_timeout(spec.timeout);
    let url_host = url.host_str().unwrap_or_default().to_string();
    let name = spec.host.clone().unwrap_or_else(|| url_host.clone());
    let target: Option<SocketAddr> = match (spec.connect_to, url_host.parse()) {
        (Some(ip), _) => Some(SocketAddr::new(ip, port)),
        (None, Ok(ip)) => Some(SocketAddr::new(ip, port)),
        (None, Err(_)) if spec.host.is_some() => {
            let found = tokio::net::lookup_host((url_host.as_str(), port))
                .await
                .map_err(|e| ProbeError::Resolve {
                    host: url_host.clone(),
                    error: e.to_string(),
                })?
                .next();
            Some(found.ok_or_else(|| ProbeError::NoAddress {
                host: url_host.clone(),
            })?)
        }
        (None, Err(_)) => None,
    };
    if name != url_host {
        url.set_host(Some(&name)).map_err(|e| ProbeError::BadHost {
            host: name.clone(),
            error: e.to_string(),
        })?;
    }
    if let Some(addr) = target {
        if name.parse::<std::net::IpAddr>().is_err() {
            builder = builder.resolve(&name, addr);
        }
    }
    let client = builder
        .build()
        .map_err(|e| ProbeError::Client(e.to_string()))?;
    Ok((client, url))
}

/// The reason of a reqwest error, naming TLS problems as such.
fn describe(e: &reqwest::Error) -> ProbeError {
    let mut chain = String::new();
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = source {
        chain.push_str(&s.to_string());
        chain.push_str(": ");
        source = s.source();
    }
    let chain = chain.trim_end_matches(": ").to_string();
    let lower = chain.to_ascii_lowercase();
    if lower.contains("certificate") || lower.contains("tls") || lower.contains("handshake") {
        ProbeError::Tls(chain)
    } else if e.is_timeout() {
        ProbeError::TimedOut(chain)
    } else if e.is_connect() {
        ProbeError::Connect(chain)
    } else {
        ProbeError::Http(chain)
    }
}

/// A short pause, for loops that retry.
pub fn jittered(base: Duration) -> Duration {
    base.mul_f64(rand::rng().random_range(0.9..1.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(ok: bool) -> Observation {
        Observation {
            round: 0,
            ok,
            reason: if ok { "ok" } else { "connect: refused" }.into(),
            age_ms: 0,
        }
    }

    #[test]
    fn a_probe_begun_before_a_failure_says_nothing_about_it() {
        let local = Local::default();
        let t0 = Instant::now();
        local.record("v", "a", obs(true), t0);
        local.record("v", "b", obs(true), t0);
        // The network breaks. a's next probe begins after and fails at once; b's probe
        // in flight (begun before) succeeds afterwards.
        let t1 = t0 + Duration::from_millis(10);
        local.record("v", "a", obs(false), t1);
        local.record("v", "b", obs(true), t0);
        assert!(
            !local.others_probed_since_failure("a"),
            "b's success began before a's failure: a must wait"
        );
        // b's next probe, begun after, fails too: now a's failure can be judged.
        local.record("v", "b", obs(false), t1 + Duration::from_millis(5));
        assert!(local.others_probed_since_failure("a"));
    }
}
