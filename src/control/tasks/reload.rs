//! Control plane: reload. The inputs (policy, zones, probes, geo database) are watched
//! by polling their size and modification time, and reloaded on change or on SIGHUP.
//! A reload loads and validates *everything* off the query path and hands the result
//! to the controller, which swaps it in as one snapshot; a broken edit changes nothing
//! and is logged with its file, line and field, and the last good input keeps serving.
//! The API tokens file is the exception: when the whole load fails it is loaded again on
//! its own ([`Reloaded::tokens`]), so that a token removed from it stops working even
//! while another input is broken.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::tokens::{self, Tokens};
use crate::error::Issues;
use crate::inputs::{self, fingerprint_with, Inputs, Loaded};

/// What asked for a reload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    FileChange,
    Sighup,
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Trigger::FileChange => "file change",
            Trigger::Sighup => "SIGHUP",
        })
    }
}

/// A reload's outcome, for the controller.
pub struct Reloaded {
    pub trigger: Trigger,
    pub result: Result<Loaded, Issues>,
    /// The tokens file (`--api-tokens`) loaded on its own, when `result` is an error
    /// and there is such a file: a revocation must not wait for a broken zone or policy
    /// to be repaired. `None` when `result` holds the tokens (or there is no file).
    pub tokens: Option<Result<Tokens, Issues>>,
}

/// Watches `inputs` every `poll` (never when zero) and on SIGHUP, until `stop`; reuses
/// the geo database of `geo` (the startup load's) while its files are unchanged. The
/// DNSSEC key directory `keys` (the last good policy's) is watched too.
pub(crate) fn spawn(
    inputs: Inputs,
    poll: Duration,
    out: mpsc::Sender<Reloaded>,
    stop: CancellationToken,
    geo: inputs::GeoCache,
    mut keys: Option<PathBuf>,
) {
    tokio::spawn(async move {
        #[cfg(unix)]
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let mut seen = fingerprint_with(&inputs, keys.as_deref());
        let cache = Arc::new(std::sync::Mutex::new(geo));
        loop {
            let tick = async {
                if poll.is_zero() {
                    std::future::pending::<()>().await
                } else {
                    tokio::time::sleep(poll).await
                }
            };
            #[cfg(unix)]
            let hangup = async {
                match hup.as_mut() {
                    Some(s) => s.recv().await,
                    None => std::future::pending().await,
                }
            };
            #[cfg(not(unix))]
            let hangup = std::future::pending::<Option<()>>();
            let trigger = tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick => {
                    let now = fingerprint_with(&inputs, keys.as_deref());
                    if now == seen {
                        continue;
                    }
                    seen = now;
                    Trigger::FileChange
                }
                _ = hangup => {
                    seen = fingerprint_with(&inputs, keys.as_deref());
                    Trigger::Sighup
                }
            };
            let (inputs2, cache2) = (inputs.clone(), cache.clone());
            // Walking a geo database takes tens of milliseconds: not on a runtime worker.
            let load = move || {
                let mut cache = cache2.lock().unwrap_or_else(|p| p.into_inner());
                let result = inputs::load_cached(&inputs2, &mut cache);
                let tokens = match (&result, &inputs2.api_tokens) {
                    (Err(_), Some(path)) => Some(tokens::load(path)),
                    _ => None,
                };
                (result, tokens)
            };
            let (result, tokens) = match tokio::task::spawn_blocking(load).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, "reload task failed");
                    continue;
                }
            };
            if let Ok(loaded) = &result {
                let now = loaded.policy.dnssec.as_ref().map(|d| d.keys.clone());
                if now != keys {
                    keys = now;
                    seen = fingerprint_with(&inputs, keys.as_deref());
                }
            }
            let reloaded = Reloaded {
                trigger,
                result,
                tokens,
            };
            if out.send(reloaded).await.is_err() {
                return;
            }
        }
    });
}
