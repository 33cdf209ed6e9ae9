//! Control plane: the other vantage points. Polls each peer's `/v1/observations` and
//! keeps its latest answer; a peer that cannot be read, answers garbage or is slow is
//! reported as unhappy (it never counts as a CDN failure).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::control::health::{Observation, VantageView};

/// Largest observations document accepted from a peer.
const MAX_BODY: usize = 1024 * 1024;

/// What `/v1/observations` serves.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Published {
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

    /// Polls every peer each `every` until `stop`.
    pub fn spawn(&self, urls: Vec<reqwest::Url>, every: Duration, stop: CancellationToken) {
        // Generous even for fast probes: a loaded peer is slow, not down.
        let timeout = every.clamp(Duration::from_secs(1), Duration::from_secs(2));
        let Ok(client) = reqwest::Client::builder()
            .no_proxy()
            .timeout(timeout)
            .build()
        else {
            tracing::error!("cannot build the HTTP client for peers");
            return;
        };
        for url in urls {
            let (client, stop, peers) = (client.clone(), stop.clone(), self.clone());
            let key = url.to_string();
            let endpoint = url.join("/v1/observations").unwrap_or(url);
            tokio::spawn(async move {
                loop {
                    let result = tokio::select! {
                        _ = stop.cancelled() => return,
                        r = fetch(&client, endpoint.clone()) => r,
                    };
                    if let Err(e) = &result {
                        tracing::debug!(peer = %key, error = %e, "peer unreadable");
                    }
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
                        _ = tokio::time::sleep(crate::control::prober::jittered(every)) => {}
                    }
                }
            });
        }
    }
}

async fn fetch(client: &reqwest::Client, url: reqwest::Url) -> Result<Published, String> {
    let mut response = client.get(url).send().await.map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("status {}", response.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_BODY {
            return Err("observations larger than 1 MiB".into());
        }
    }
    serde_json::from_slice(&body).map_err(|e| format!("not an observations document: {e}"))
}
