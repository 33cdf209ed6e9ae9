//! Control plane: usage records pulled from a URL (`serve --usage-url`), every
//! `--usage-poll-ms` (30 s by default): the answer is what `POST /v1/usage` takes (one
//! record or an array), at most 4 MiB. Records are idempotent per (CDN, start), so a
//! feed may return the same window every time; a wrong record is skipped and logged,
//! records of a CDN no steered name has are skipped and counted.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::control::levers::command::Command;
use crate::control::modifiers::commit::UsageIn;

/// The largest answer read.
const MAX_BYTES: usize = 4 << 20;

/// Polls `url` every `every` until `stop`, handing the records to the controller.
pub(crate) fn spawn(
    url: reqwest::Url,
    every: Duration,
    commands: mpsc::Sender<Command>,
    stop: CancellationToken,
) {
    let Ok(client) = reqwest::Client::builder()
        .no_proxy()
        .timeout(every.clamp(Duration::from_secs(1), Duration::from_secs(10)))
        .build()
    else {
        tracing::error!("cannot build the HTTP client for --usage-url");
        return;
    };
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let records = tokio::select! {
                _ = stop.cancelled() => return,
                r = fetch(&client, url.clone()) => r,
            };
            let records = match records {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(url = %url, error = %e, "usage feed not read");
                    continue;
                }
            };
            if records.is_empty() {
                continue;
            }
            let (tx, rx) = oneshot::channel();
            if commands
                .send(Command::Usage {
                    records,
                    strict: false,
                    author: "--usage-url".into(),
                    reply: tx,
                })
                .await
                .is_err()
            {
                return;
            }
            match rx.await {
                Ok(Ok(taken)) => tracing::debug!(url = %url, ?taken, "usage feed read"),
                Ok(Err(e)) => tracing::warn!(url = %url, error = %e, "usage feed refused"),
                Err(_) => return,
            }
        }
    });
}

type Checked = Vec<(
    String,
    u64,
    crate::control::modifiers::commit::ledger::Record,
)>;

/// Why a fetch of the feed failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FeedError {
    /// The request or the body's transfer failed.
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    /// The feed answered with an error status.
    #[error("status {0}")]
    Status(reqwest::StatusCode),
    /// The answer is over [`MAX_BYTES`].
    #[error("answer over 4 MiB")]
    TooBig,
    /// The answer is not JSON.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
}

/// The feed's records, the wrong ones skipped (and logged).
async fn fetch(client: &reqwest::Client, url: reqwest::Url) -> Result<Checked, FeedError> {
    let mut resp = client.get(url).send().await?;
    if !resp.status().is_success() {
        return Err(FeedError::Status(resp.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if body.len() + chunk.len() > MAX_BYTES {
            return Err(FeedError::TooBig);
        }
        body.extend_from_slice(&chunk);
    }
    let value: serde_json::Value = serde_json::from_slice(&body)?;
    let items = match value {
        serde_json::Value::Array(a) => a,
        one => vec![one],
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        match serde_json::from_value::<UsageIn>(item)
            .map_err(|e| e.to_string())
            .and_then(|r| r.check().map_err(|e| e.to_string()))
        {
            Ok(c) => out.push(c),
            Err(e) => tracing::warn!(record = i, error = %e, "usage feed: record skipped"),
        }
    }
    Ok(out)
}
