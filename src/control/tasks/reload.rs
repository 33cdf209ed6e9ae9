//! Control plane: reload. The inputs (policy, zones, probes, geo database) are watched
//! by polling their size and modification time, and reloaded on change or on SIGHUP.
//! A reload loads and validates *everything* off the query path and hands the result
//! to the controller, which swaps it in as one snapshot; a broken edit changes nothing
//! and is logged with its file, line and field, and the last good input keeps serving.
//!
//! The policy served is the set's version when the set has one (sent on `set` by the
//! controller): the other inputs are this node's own, and the policy file, when it
//! differs from that version, is loaded on its own too, so that the controller can
//! propose a valid edit to the set (`controller/policy.rs`).
//!
//! The API tokens file is the exception: when the whole load fails it is loaded again on
//! its own ([`Reloaded::tokens`]), so that a token removed from it stops working even
//! while another input is broken.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::config::tokens::{self, Tokens};
use crate::error::{ConfigIssue, Issues};
use crate::inputs::{fingerprint_with, Checker, Loaded, PolicyText};

/// What asked for a reload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    FileChange,
    Sighup,
    /// The set's policy version changed.
    SetVersion,
    /// A staged rollout's new version, loaded beside the version in force (its result
    /// is the canary's, never served alone).
    Canary,
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Trigger::FileChange => "file change",
            Trigger::Sighup => "SIGHUP",
            Trigger::SetVersion => "set version",
            Trigger::Canary => "staged rollout",
        })
    }
}

/// The set's policy version, for the reload task to load in place of the file's.
#[derive(Clone, Debug)]
pub struct SetPolicy {
    pub version: String,
    pub text: PolicyText,
}

/// A reload's outcome, for the controller.
pub struct Reloaded {
    pub trigger: Trigger,
    /// The inputs, with the set's version of the policy when it has one (`set`), else
    /// the file's.
    pub result: Result<Loaded, Issues>,
    /// The set's version the result holds (`None`: the policy file's).
    pub set: Option<String>,
    /// The policy file now.
    pub file: FilePolicy,
    /// The tokens file (`--api-tokens`) loaded on its own, when `result` is an error
    /// and there is such a file: a revocation must not wait for a broken zone or policy
    /// to be repaired. `None` when `result` holds the tokens (or there is no file).
    pub tokens: Option<Result<Tokens, Issues>>,
}

/// The policy file as a reload found it.
#[derive(Clone, Debug, Default)]
pub struct FilePolicy {
    /// Its version (`None`: unreadable).
    pub version: Option<String>,
    pub text: Option<std::sync::Arc<str>>,
    /// When it is not the version the result holds: its own load's errors (`Ok`: it
    /// would load, it may be proposed to the set).
    pub check: Option<Result<(), Issues>>,
}

/// Watches the inputs of `checker` every `poll` (never when zero) and on SIGHUP, and
/// the set's version on `set`, until `stop`; reuses the geo database of `checker`
/// while its files are unchanged. The DNSSEC key directory `keys` (the last good
/// policy's) is watched too.
pub(crate) fn spawn(
    checker: Checker,
    poll: Duration,
    out: mpsc::Sender<Reloaded>,
    stop: CancellationToken,
    mut set: watch::Receiver<Option<SetPolicy>>,
    mut keys: Option<PathBuf>,
) {
    tokio::spawn(async move {
        #[cfg(unix)]
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let inputs = checker.inputs.clone();
        let mut seen = fingerprint_with(&inputs, keys.as_deref());
        let mut set_open = true;
        // The policy file's own load, by its version (kept while the file is unchanged).
        let mut checked: Option<(String, Result<(), Issues>)> = None;
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
                changed = set.changed(), if set_open => {
                    if changed.is_err() {
                        set_open = false;
                        continue;
                    }
                    Trigger::SetVersion
                }
            };
            if trigger != Trigger::SetVersion {
                checked = None;
            }
            let wanted = set.borrow_and_update().clone();
            let mut file = read_file(&inputs.config);
            let result = checker.load(wanted.as_ref().map(|w| w.text.clone())).await;
            // The tokens file alone when the whole load failed: a revocation never
            // waits for a broken zone or policy to be repaired.
            let tokens = match (&result, &inputs.api_tokens) {
                (Err(_), Some(path)) => Some(tokens::load(path)),
                _ => None,
            };
            if let (Some(w), Some(v)) = (&wanted, &file.version) {
                if *v != w.version {
                    let check = match &checked {
                        Some((c, r)) if c == v => r.clone(),
                        _ => checker.load(None).await.map(|_| ()),
                    };
                    checked = Some((v.clone(), check.clone()));
                    file.check = Some(check);
                }
            }
            if let Ok(loaded) = &result {
                let now = loaded.policy.dnssec.as_ref().map(|d| d.keys.clone());
                if now != keys {
                    keys = now;
                    seen = fingerprint_with(&inputs, keys.as_deref());
                }
            }
            let set = wanted.map(|w| w.version);
            let reloaded = Reloaded {
                trigger,
                result,
                set,
                file,
                tokens,
            };
            if out.send(reloaded).await.is_err() {
                return;
            }
        }
    });
}

/// The policy file's text and version (none when it cannot be read: the load says
/// why).
fn read_file(path: &std::path::Path) -> FilePolicy {
    match std::fs::read_to_string(path) {
        Ok(text) => FilePolicy {
            version: Some(crate::config::version_of(&text)),
            text: Some(Arc::from(text)),
            check: None,
        },
        Err(e) => FilePolicy {
            check: Some(Err(Issues(vec![ConfigIssue::error(
                path,
                None,
                "",
                format!("cannot read: {e}"),
            )]))),
            ..FilePolicy::default()
        },
    }
}
