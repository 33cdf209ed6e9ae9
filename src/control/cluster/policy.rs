//! Control plane, the set: the policy as one version for the whole set. The key
//! `policy` holds the version in force, its YAML, the instant every node switches to it
//! and the history of what was applied; `versions/{version}` keeps each version of the
//! history's YAML for a rollback. A version is written by the node that took it (an API
//! call, or an edit of that node's policy file), by compare-and-swap on the version it
//! was based on: two writers never both win, and an edit based on a version the set
//! has moved past is refused. Every node checks the version against its own inputs
//! before it serves it (`controller/policy.rs`).

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tracing::{info, warn};

use super::node::{ClusterLink, Done};
use super::refused::Refused;
use super::{sane_name, Key, MAX_REASON};
use crate::clock::now_ms;
use crate::config::{is_version, version_of};
use crate::control::decide::times;
use crate::control::levers::command::{PolicyRefused, Written};
pub(crate) use crate::control::levers::stages::Stages;
use crate::control::store::etcd::MAX_VALUE;

/// At most this many applications in a version's history (the version in force first).
pub(crate) const MAX_POLICY_HISTORY: usize = 20;

/// How far ahead of a reader's clock a version's activation may be: a writer's
/// allowance is at most 5 s ([`ClusterLink::allowance_ms`]), and a minute more for
/// clocks. A version further ahead would be held pending by every node that follows
/// the set while a node that starts meanwhile serves its own file.
pub(crate) const MAX_ACTIVATION_AHEAD_MS: u64 = 65_000;

/// The longest policy (YAML bytes) the set's store takes: the value cap less room for
/// the history.
pub(crate) const MAX_POLICY_BYTES: usize = MAX_VALUE - 12 * 1024;

/// The version in force in the set, as stored under `policy`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedPolicy {
    /// [`version_of`] `yaml`.
    pub version: String,
    pub yaml: String,
    /// When every node serves it (Unix ms, on the store's clock: each node converts it
    /// with its measured skew): the writer's time plus the set's allowance, so that
    /// nodes never serve different versions outside that window.
    #[serde(deserialize_with = "times::bounded")]
    pub activate_at_unix_ms: u64,
    /// What was applied, newest first: this version's application, then earlier ones.
    pub history: Vec<Applied>,
    /// A staged rollout of this version: until its last stage, the client networks
    /// outside the stage's share keep the version it replaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
}

/// A staged rollout (`POST /v1/policy?stages=…`): stage `k` starts at the version's
/// activation plus `k` × `stage_seconds` and gives the new version to `stages[k]`
/// percent of the client networks; the last stage (100) ends it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rollout {
    /// The version the rest of the clients keep, and its YAML.
    pub from: String,
    pub from_yaml: String,
    pub plan: Stages,
}

impl SharedPolicy {
    /// The rollout of this version while it runs at `now` (the store's ms): before its
    /// last stage.
    pub fn running(&self, now: u64) -> Option<&Rollout> {
        self.rollout
            .as_ref()
            .filter(|r| now < r.plan.end_ms(self.activate_at_unix_ms))
    }
}

/// One application of a version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Applied {
    pub version: String,
    /// The token's name, or `file on {node}`.
    pub author: String,
    pub ticket: Option<String>,
    /// The node that wrote it.
    pub node: String,
    #[serde(deserialize_with = "times::bounded")]
    pub at_unix_ms: u64,
    #[serde(deserialize_with = "times::bounded")]
    pub activate_at_unix_ms: u64,
    /// How: `api`, `file`, `rollback`, `first` (the first version of a set), `staged`
    /// (a staged rollout), `halt` (a rollout halted: back to the version before it).
    pub how: String,
    /// The version it replaced (`None`: the first).
    pub based_on: Option<String>,
    /// Why (a halt's reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

impl SharedPolicy {
    /// Whether the record is what a node writes, read at `now` (Unix ms): its version
    /// is its YAML's, the history starts with it, its activation is not further ahead
    /// than a writer puts it, a rollout keeps the version it is based on, and every
    /// field is bounded.
    pub fn check(&self, now: u64) -> Result<(), Refused> {
        if self.yaml.len() > MAX_POLICY_BYTES {
            return Err(Refused::PolicySize(MAX_POLICY_BYTES));
        }
        if version_of(&self.yaml) != self.version {
            return Err(Refused::Version {
                version: self.version.clone(),
                of_yaml: version_of(&self.yaml),
            });
        }
        if self.history.first().map(|a| a.version.as_str()) != Some(self.version.as_str()) {
            return Err(Refused::HistoryStart);
        }
        if self.history.len() > MAX_POLICY_HISTORY {
            return Err(Refused::HistoryLength(MAX_POLICY_HISTORY));
        }
        let ahead = self.activate_at_unix_ms.saturating_sub(now);
        if ahead > MAX_ACTIVATION_AHEAD_MS {
            return Err(Refused::ActivatesAhead(ahead));
        }
        if let Some(r) = &self.rollout {
            // What the other clients keep is the version this one replaced (the
            // history's next), as its writer applied it: not a version of no history
            // (and not audited), which a halt would then write as the set's.
            let first = &self.history[0];
            if first.how != "staged"
                || first.based_on.as_deref() != Some(r.from.as_str())
                || self.history.get(1).map(|a| a.version.as_str()) != Some(r.from.as_str())
            {
                return Err(Refused::RolloutBase);
            }
            r.plan.check()?;
            if self.yaml.len() + r.from_yaml.len() > MAX_POLICY_BYTES {
                return Err(Refused::RolloutSize(MAX_POLICY_BYTES));
            }
            if version_of(&r.from_yaml) != r.from || r.from == self.version {
                return Err(Refused::RolloutVersion);
            }
        }
        for a in &self.history {
            let versions = std::iter::once(&a.version).chain(&a.based_on);
            if !versions.into_iter().all(|v| is_version(v)) {
                return Err(Refused::HistoryVersion);
            }
            let long = [Some(&a.author), a.ticket.as_ref(), a.why.as_ref()]
                .into_iter()
                .flatten()
                .any(|s| s.len() > MAX_REASON);
            if long
                || !sane_name(&a.node)
                || !matches!(
                    a.how.as_str(),
                    "api" | "file" | "rollback" | "first" | "staged" | "halt"
                )
            {
                return Err(Refused::HistoryEntry);
            }
        }
        Ok(())
    }
}

/// A version to write.
pub(crate) struct Proposal {
    pub source: Source,
    /// Loads it with this node's inputs before it is written (`None`: loaded already,
    /// the policy file's edit).
    pub check: Option<crate::inputs::Checker>,
    /// The version it is based on: the set's must still be it (`None`: the set has
    /// none yet).
    pub based_on: Option<String>,
    pub author: String,
    pub ticket: Option<String>,
    pub how: &'static str,
    /// Rolled out in stages (`None`: at once).
    pub stages: Option<Stages>,
    /// Why (a halt's reason).
    pub why: Option<String>,
}

/// The YAML of a proposal.
pub(crate) enum Source {
    Text(String),
    /// A version kept for a rollback (`versions/{version}`).
    Kept(String),
}

impl Source {
    fn version(&self) -> String {
        match self {
            Source::Text(t) => version_of(t),
            Source::Kept(v) => v.clone(),
        }
    }
}

impl ClusterLink {
    /// The version in force in the set, as this node's view holds it.
    pub(crate) fn set_policy(&self) -> Option<&SharedPolicy> {
        self.latest()
            .and_then(|s| s.view.policy.as_ref())
            .map(|(p, _)| p.as_ref())
    }

    /// How long after a write every node serves it: this node's measured skew to the
    /// store's clock plus 500 ms for every node to read and load it (none for a set
    /// of one, whose only node loads it at once).
    pub(crate) fn allowance_ms(&self) -> u64 {
        if self.store.is_memory() {
            return 0;
        }
        let skew = self.store.skew_ms().map_or(0, i64::unsigned_abs);
        (500 + skew).min(5_000)
    }

    /// The store's clock (Unix ms) at this node's `local` time: instants shared by the
    /// set (a version's activation) are on it, so that a node whose clock is off still
    /// switches with the others.
    pub(crate) fn store_ms(&self, local: u64) -> u64 {
        let skew = self.store.skew_ms().unwrap_or(0);
        local.saturating_add_signed(skew)
    }

    /// This node's time at the store's `shared` instant.
    pub(crate) fn local_ms(&self, shared: u64) -> u64 {
        let skew = self.store.skew_ms().unwrap_or(0);
        shared.saturating_add_signed(-skew)
    }

    /// Writes `proposal` as the set's version, unless the set moved past the version
    /// it is based on; answers `reply` once this node's view holds it.
    pub(crate) fn write_policy(
        &mut self,
        proposal: Proposal,
        reply: oneshot::Sender<Result<Written, PolicyRefused>>,
    ) {
        if let Err(e) = self.writable() {
            let _ = reply.send(Err(PolicyRefused::Unavailable(e.to_string())));
            return;
        }
        let (store, prefix, node) = (self.store.clone(), self.prefix.clone(), self.node.clone());
        // The instant is taken once the version is checked (a load with this node's
        // inputs takes up to a second with a full geo database): taken before, it
        // could pass while the check ran, and every node would switch on receipt
        // instead of at one instant (the audit entry gets it then).
        let (skew, allowance) = (self.store.skew_ms().unwrap_or(0), self.allowance_ms());
        let version = proposal.source.version();
        let (audit_key, mut entry) = self.audit_entry(
            "policy",
            serde_json::json!({
                "version": version,
                "based_on": proposal.based_on,
                "author": proposal.author,
                "ticket": proposal.ticket,
                "how": proposal.how,
                "why": proposal.why,
                "stages": proposal.stages,
            }),
        );
        let done = self.done.clone();
        let how = proposal.how;
        tokio::spawn(async move {
            let key = Key::Policy.under(&prefix);
            let r = async {
                let yaml = match &proposal.source {
                    Source::Text(t) => t.clone(),
                    Source::Kept(v) => fetch(&store, &prefix, v).await?,
                };
                if let Some(checker) = &proposal.check {
                    let text = crate::inputs::PolicyText {
                        origin: std::path::PathBuf::from(match &proposal.source {
                            Source::Text(_) => "policy".to_string(),
                            Source::Kept(v) => format!("policy version {v}"),
                        }),
                        text: std::sync::Arc::from(yaml.as_str()),
                    };
                    if let Err(issues) = checker.load(Some(text)).await {
                        return Err(PolicyRefused::Invalid(
                            issues.errors().map(ToString::to_string).collect(),
                        ));
                    }
                }
                let store_now = now_ms().saturating_add_signed(skew);
                let activate = store_now + allowance;
                entry["activate_at_unix_ms"] = activate.into();
                put_policy(
                    &store,
                    &prefix,
                    &node,
                    (activate, store_now),
                    yaml,
                    proposal,
                )
                .await
            }
            .await;
            let written = matches!(&r, Ok(w) if !w.unchanged);
            match &r {
                Ok(w) if written => {
                    info!(version = %w.version, activate_at_unix_ms = w.activate_at_unix_ms, how, "policy version written for the set");
                    // A set's first version is what its nodes started with, not a
                    // change: the history has it, the audit log the changes.
                    if how != "first" {
                        super::node::put_audit(store.clone(), audit_key, entry).await;
                    }
                }
                Ok(_) => {}
                Err(e) => warn!(version = %version, error = %e, "policy version not written"),
            }
            Done::send(&done, &store, &key, reply, r, written).await;
        });
    }
}

/// The YAML of `version`, as kept for a rollback (checked against its version).
async fn fetch(
    store: &crate::control::store::Store,
    prefix: &str,
    version: &str,
) -> Result<String, PolicyRefused> {
    let key = Key::PolicyVersion {
        version: version.to_string(),
    }
    .under(prefix);
    match store.get(&key).await {
        Ok(Some(kv)) => match String::from_utf8(kv.value) {
            Ok(yaml) if version_of(&yaml) == version => Ok(yaml),
            _ => Err(PolicyRefused::Bad(format!(
                "version {version} as kept is not its YAML: not rolled back to"
            ))),
        },
        Ok(None) => Err(PolicyRefused::Bad(format!(
            "version {version} is not kept (only the versions of the history are)"
        ))),
        Err(e) => Err(PolicyRefused::Unavailable(e.to_string())),
    }
}

/// Reads the set's version, checks the proposal is based on it, and writes the new
/// one by compare-and-swap (create-if-absent for a set's first).
async fn put_policy(
    store: &crate::control::store::Store,
    prefix: &str,
    node: &str,
    (activate, store_now): (u64, u64),
    yaml: String,
    p: Proposal,
) -> Result<Written, PolicyRefused> {
    let unavailable = |e: super::EtcdError| PolicyRefused::Unavailable(e.to_string());
    if yaml.len() > MAX_POLICY_BYTES {
        return Err(PolicyRefused::Bad(format!(
            "the policy is {} bytes: the set's store takes at most {MAX_POLICY_BYTES}",
            yaml.len()
        )));
    }
    let key = Key::Policy.under(prefix);
    let current = match store.get(&key).await.map_err(unavailable)? {
        Some(kv) => {
            let rec = serde_json::from_slice::<SharedPolicy>(&kv.value)
                .ok()
                .filter(|r| r.check(now_ms()).is_ok());
            Some((rec, kv.mod_revision))
        }
        None => None,
    };
    let version = version_of(&yaml);
    let p_based_on = p.based_on.clone();
    let in_force = current.as_ref().and_then(|(r, _)| r.as_ref());
    let running = in_force.and_then(|r| r.running(store_now));
    match (p.how, running) {
        ("halt", None) => {
            return Err(PolicyRefused::Conflict(
                "no staged rollout is in progress".into(),
            ))
        }
        ("halt", Some(r)) if r.from != version => {
            return Err(PolicyRefused::Conflict(format!(
                "the rollout in progress is from {}: not halted to {version}",
                r.from
            )))
        }
        ("halt", Some(_)) => {}
        (_, Some(_)) => {
            return Err(PolicyRefused::Conflict(format!(
                "a staged rollout of {} is in progress: halt it first (POST /v1/policy/halt) or wait for its last stage",
                in_force.map_or("", |r| r.version.as_str())
            )))
        }
        (_, None) => {}
    }
    if let Some(r) = in_force {
        if r.version == version {
            return Ok(Written {
                version,
                activate_at_unix_ms: r.activate_at_unix_ms,
                unchanged: true,
            });
        }
        if p.based_on.as_deref() != Some(r.version.as_str()) {
            return Err(PolicyRefused::Stale {
                in_force: r.version.clone(),
                based_on: p.based_on.unwrap_or_else(|| "none".into()),
            });
        }
    }
    let now = now_ms();
    let mut history = vec![Applied {
        version: version.clone(),
        author: p.author.chars().take(MAX_REASON / 4).collect(),
        ticket: p.ticket.map(|t| t.chars().take(MAX_REASON / 4).collect()),
        node: node.to_string(),
        at_unix_ms: now,
        activate_at_unix_ms: activate,
        how: p.how.to_string(),
        based_on: in_force.map(|r| r.version.clone()),
        why: p.why.map(|t| t.chars().take(MAX_REASON / 4).collect()),
    }];
    history.extend(in_force.map_or(&[][..], |r| &r.history[..]).iter().cloned());
    let dropped: Vec<String> = history
        .split_off(MAX_POLICY_HISTORY.min(history.len()))
        .into_iter()
        .map(|a| a.version)
        .collect();
    let rollout = match (p.stages, in_force) {
        (Some(stages), Some(r)) => {
            stages
                .check()
                .map_err(|e| PolicyRefused::Bad(e.to_string()))?;
            if yaml.len() + r.yaml.len() > MAX_POLICY_BYTES {
                return Err(PolicyRefused::Bad(format!(
                    "a staged rollout keeps both versions in the set's store: {} + {} bytes, over {MAX_POLICY_BYTES}; apply it without stages",
                    yaml.len(),
                    r.yaml.len()
                )));
            }
            Some(Rollout {
                from: r.version.clone(),
                from_yaml: r.yaml.clone(),
                plan: stages,
            })
        }
        (Some(_), None) => {
            return Err(PolicyRefused::Bad(
                "the set has no version yet to roll out from".into(),
            ))
        }
        (None, _) => None,
    };
    let record = SharedPolicy {
        version: version.clone(),
        yaml,
        activate_at_unix_ms: activate,
        history,
        rollout,
    };
    let value = serde_json::to_vec(&record).unwrap_or_default();
    if value.len() > MAX_VALUE {
        return Err(PolicyRefused::Bad(format!(
            "the policy and its history are {} bytes: the set's store takes at most {MAX_VALUE}",
            value.len()
        )));
    }
    let kept = Key::PolicyVersion {
        version: version.clone(),
    }
    .under(prefix);
    store
        .put(&kept, record.yaml.as_bytes(), None)
        .await
        .map_err(unavailable)?;
    let won = match &current {
        None => store.create(&key, &value).await,
        Some((_, rev)) => store.replace(&key, *rev, &value).await,
    }
    .map_err(unavailable)?;
    if !won {
        // Another writer first: the same version (every node of a new set proposes
        // its own first) is this one's too.
        let now_in_force = store
            .get(&key)
            .await
            .ok()
            .flatten()
            .and_then(|kv| serde_json::from_slice::<SharedPolicy>(&kv.value).ok());
        return match now_in_force {
            Some(r) if r.version == version => Ok(Written {
                version,
                activate_at_unix_ms: r.activate_at_unix_ms,
                unchanged: true,
            }),
            // What the operator based it on (not what the record could base it on:
            // none, when the set's record was refused).
            other => Err(PolicyRefused::Stale {
                in_force: other.map_or_else(|| "another".into(), |r| r.version),
                based_on: p_based_on.unwrap_or_else(|| "none".into()),
            }),
        };
    }
    // The versions no longer in the history are not kept.
    for v in dropped {
        if !record.history.iter().any(|a| a.version == v) {
            let _ = store
                .delete(&Key::PolicyVersion { version: v }.under(prefix))
                .await;
        }
    }
    Ok(Written {
        version,
        activate_at_unix_ms: activate,
        unchanged: false,
    })
}
