//! Control plane: the policy as the set's version. The node serves the version the set
//! holds (`cluster/policy.rs`), loaded with its own zones, geo database and probes by
//! the reload task, from the instant the writer chose; a version it cannot load is
//! refused (the last good one keeps serving, said in `/v1/state`, a metric and the
//! log). The policy file stays the operator's interface: an edit is proposed to the set
//! as a new version based on the one this node serves, so copying one file to every
//! node applies it once; an edit based on a version the set has moved past is refused.
//! A node that joins or restarts serves the set's version, not its file's.

use std::sync::Arc;

use tokio::sync::{oneshot, watch};
use tracing::{error, info, warn};

use super::Controller;
use crate::clock::now_ms;
use crate::control::cluster::policy::{Proposal, Source};
use crate::control::levers::command::{PolicyRefused, Written};
use crate::control::state_doc::{PendingDoc, PolicyDoc, PolicyStatus, RefusedDoc};
use crate::control::tasks::reload::{Reloaded, SetPolicy, Trigger};
use crate::error::Issues;
use crate::inputs::PolicyText;

/// What the controller knows of the policy versions.
#[derive(Default)]
pub(crate) struct Versions {
    /// To the reload task: the set's version to load in place of the file's.
    pub to_load: Option<watch::Sender<Option<SetPolicy>>>,
    /// The policy file: its version and text as last read (at start: the one loaded).
    pub file: Option<(String, Arc<str>)>,
    /// Why the file's latest edit is not the version in force (it does not load, or
    /// the set refused it).
    pub file_error: Option<String>,
    /// The set's version this node cannot load, and why.
    pub refused: Option<(String, Vec<String>)>,
    /// A version loaded, waiting for the instant every node serves it (Unix ms).
    pub pending: Option<(Box<Reloaded>, u64)>,
    /// What the saved state said: the file's version and the version served then.
    pub saved: Option<crate::control::disk::persist::SavedPolicy>,
    /// The first view of the set since start was followed.
    pub started: bool,
    /// Loads a version given over the API with this node's inputs.
    pub checker: Option<crate::inputs::Checker>,
    /// The file's edit this node proposed last, and the trigger of the reload that
    /// found it (the reload that applies it says that trigger).
    pub proposed: Option<(String, Trigger)>,
    /// Back to the controller: a reload held for a proposal the set refused.
    pub reloads: Option<tokio::sync::mpsc::Sender<Reloaded>>,
    /// This node proposed a first version (the set had none) and waits for the view.
    pub proposed_first: bool,
    /// The file's latest proposal the set refused: its version and why (set by the
    /// task that waits for the write).
    pub file_refused: Arc<std::sync::Mutex<Option<(String, String)>>>,
    /// A staged rollout running here (`controller/rollout.rs`).
    pub staged: Option<super::rollout::Staged>,
    /// The rollout (its version) this node asked the set to halt.
    pub halting: Option<String>,
    /// The rollout (its version) that ended here, by this node's clock (its last stage
    /// reached) or by its estimate of the store's: done for good, even while the next
    /// estimate (it moves with each measurement of the skew) reads it running again, so
    /// it is never started again.
    pub rolled_out: Option<String>,
}

/// What a reload's policy file brings.
enum FileNote {
    /// Not edited, or a copy of the set's version: nothing to do.
    Same,
    /// An edit that does not load: the reload is refused.
    Refused(Issues),
    /// An edit to propose to the set.
    Propose(Arc<str>),
}

impl Controller {
    /// The reload task loads the set's versions sent on `to`; `checker` loads a
    /// version given over the API.
    pub fn load_versions_with(
        &mut self,
        to: watch::Sender<Option<SetPolicy>>,
        checker: crate::inputs::Checker,
        reloads: tokio::sync::mpsc::Sender<Reloaded>,
    ) {
        self.versions.to_load = Some(to);
        self.versions.checker = Some(checker);
        self.versions.reloads = Some(reloads);
    }

    /// The policy part of `/v1/state`.
    pub(super) fn policy_doc(&self) -> PolicyDoc {
        let version = self.loaded.policy.version.clone();
        let file_version = self.versions.file.as_ref().map(|(v, _)| v.clone());
        let refused = self
            .versions
            .file_refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .filter(|(v, _)| Some(v) == file_version.as_ref())
            .map(|(_, why)| why);
        PolicyDoc {
            file_differs: file_version.as_ref().is_some_and(|f| *f != version),
            version,
            file_version,
            file_error: self.versions.file_error.clone().or(refused),
            refused: self
                .versions
                .refused
                .as_ref()
                .map(|(v, errors)| RefusedDoc {
                    version: v.clone(),
                    errors: errors.clone(),
                }),
            pending: self.versions.pending.as_ref().map(|(r, at)| PendingDoc {
                version: r.set.clone().unwrap_or_default(),
                activate_at_unix_ms: *at,
            }),
        }
    }

    /// `GET /v1/policy`.
    pub(super) fn policy_status(&self) -> PolicyStatus {
        let history = self
            .set
            .set_policy()
            .map(|p| p.history.clone())
            .unwrap_or_default();
        PolicyStatus {
            version: self.loaded.policy.version.clone(),
            yaml: self.loaded.policy.source.clone(),
            history,
            rollout: self.rollout_doc(),
            node: self.policy_doc(),
        }
    }

    /// `POST /v1/policy` and a rollback: `source` becomes the set's version if
    /// `if_match` is the version in force and it loads with this node's inputs (every
    /// node loads it again with its own before serving it).
    pub(super) fn apply_policy(
        &mut self,
        source: Source,
        if_match: String,
        author: String,
        ticket: Option<String>,
        stages: Option<crate::control::cluster::policy::Stages>,
        reply: oneshot::Sender<Result<Written, PolicyRefused>>,
    ) {
        if let Some(why) = self.unaudited() {
            let _ = reply.send(Err(PolicyRefused::NotAudited(why)));
            return;
        }
        let in_force = self.in_force();
        if if_match != in_force {
            let _ = reply.send(Err(PolicyRefused::Stale {
                in_force,
                based_on: if_match,
            }));
            return;
        }
        let how = match (&source, &stages) {
            (Source::Text(_), Some(_)) => "staged",
            (Source::Text(_), None) => "api",
            (Source::Kept(_), _) => "rollback",
        };
        let proposal = Proposal {
            source,
            check: self.versions.checker.clone(),
            based_on: Some(if_match),
            author,
            ticket,
            how,
            stages,
            why: None,
        };
        self.set.write_policy(proposal, reply);
    }

    /// The set's version in force (this node's, before the set has one).
    pub(super) fn in_force(&self) -> String {
        self.set
            .set_policy()
            .map_or(self.loaded.policy.version.clone(), |p| p.version.clone())
    }

    /// `POST /v1/policy/rollback`: to `version`, or to the version before the one in
    /// force.
    pub(super) fn rollback_policy(
        &mut self,
        version: Option<String>,
        author: String,
        ticket: Option<String>,
        reply: oneshot::Sender<Result<Written, PolicyRefused>>,
    ) {
        let previous = self
            .set
            .set_policy()
            .and_then(|p| p.history.first())
            .and_then(|a| a.based_on.clone());
        let Some(target) = version.or(previous) else {
            let _ = reply.send(Err(PolicyRefused::Bad(
                "no version before the one in force to roll back to".into(),
            )));
            return;
        };
        if !crate::config::is_version(&target) {
            let _ = reply.send(Err(PolicyRefused::Bad(format!(
                "version: {target:?} is not 12 hex digits"
            ))));
            return;
        }
        let in_force = self.in_force();
        self.apply_policy(Source::Kept(target), in_force, author, ticket, None, reply);
    }

    /// Proposes `yaml` (the policy file's, or the version served when the set has
    /// none) to the set; a refusal is logged, counted and shown, and `held` (the
    /// reload that found the edit) is applied as it is then.
    fn propose(
        &mut self,
        yaml: Arc<str>,
        based_on: Option<String>,
        how: &'static str,
        held: Option<Reloaded>,
    ) {
        let (tx, rx) = oneshot::channel();
        let proposal = Proposal {
            source: Source::Text(yaml.to_string()),
            // An edit is checked as a version (the set's first is what the nodes
            // serve already): one this node would refuse is never written.
            check: (how != "first")
                .then(|| self.versions.checker.clone())
                .flatten(),
            based_on,
            author: format!("file on {}", self.vantage),
            ticket: None,
            how,
            stages: None,
            why: None,
        };
        let version = crate::config::version_of(&yaml);
        info!(version = %version, how, "policy: proposing a version to the set");
        self.set.write_policy(proposal, tx);
        let metrics = self.metrics.clone();
        let errors = self.versions.file_refused.clone();
        let back = self.versions.reloads.clone();
        tokio::spawn(async move {
            match rx.await {
                // A new set's first version: another node's was taken.
                Ok(Err(e @ PolicyRefused::Stale { .. })) if how == "first" => {
                    info!(version = %version, error = %e, "policy: another node's first version was taken")
                }
                // The set cannot take it at all (too large for the store): the node
                // serves its file, and the set has no version until one is applied.
                Ok(Err(e)) if how == "first" => {
                    metrics.policy_file_refused();
                    warn!(version = %version, error = %e, "policy file: the set cannot take it as its first version; this node serves its file");
                    *errors.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some((version, e.to_string()));
                }
                Ok(Err(e)) => {
                    metrics.policy_file_refused();
                    warn!(version = %version, error = %e, "policy file: the edit is not the set's version (the version in force keeps serving; the file differs from it)");
                    *errors.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some((version, e.to_string()));
                    if let (Some(r), Some(back)) = (held, back) {
                        let _ = back.send(r).await;
                    }
                }
                Ok(Ok(_)) | Err(_) => {}
            }
        });
    }

    /// A reload's policy file: whether it was edited, and what became of the edit.
    fn note_file(&mut self, r: &Reloaded) -> FileNote {
        let (Some(version), Some(text)) = (&r.file.version, &r.file.text) else {
            // Unreadable: said as a refused reload.
            return match r.file.check.clone() {
                Some(Err(issues)) => FileNote::Refused(issues),
                _ => FileNote::Same,
            };
        };
        if self
            .versions
            .file
            .as_ref()
            .is_some_and(|(v, _)| v == version)
        {
            return FileNote::Same;
        }
        self.versions.file = Some((version.clone(), text.clone()));
        self.versions.file_error = None;
        if let Some(Err(issues)) = &r.file.check {
            self.versions.file_error =
                Some("the policy file does not load (see last_reload)".into());
            return FileNote::Refused(issues.clone());
        }
        match &r.set {
            // A copy of the set's version.
            Some(v) if v == version => FileNote::Same,
            Some(_) => FileNote::Propose(text.clone()),
            // The set's version is not known yet (or it has none): the file's is
            // served (the result is its load), and proposed once the set is read.
            None if r.result.is_ok() && self.set.latest().is_some() => {
                let based_on = Some(self.loaded.policy.version.clone());
                self.propose(text.clone(), based_on, "file", None);
                FileNote::Same
            }
            None => FileNote::Same,
        }
    }

    /// A reload: the file's edit proposed, then the set's version switched to (at its
    /// instant) or refused, or the other inputs applied. Whether the probes changed.
    pub(super) fn on_reload(&mut self, mut r: Reloaded) -> bool {
        if r.trigger == Trigger::Canary {
            self.on_canary(r);
            return false;
        }
        if let (Some(v), Some((proposed, trigger))) = (&r.set, &self.versions.proposed) {
            if r.trigger == Trigger::SetVersion && v == proposed {
                // This node's own edit, back from the set.
                r.trigger = *trigger;
            }
        }
        match self.note_file(&r) {
            FileNote::Refused(issues) => {
                // The rest loaded (with the set's version): a token removed meanwhile
                // stops working all the same.
                if let Ok(loaded) = &r.result {
                    self.tokens_alone(Ok(loaded.tokens.clone()), r.trigger);
                }
                self.refuse_reload(r.trigger, &issues);
                return false;
            }
            FileNote::Propose(text) => {
                // Served once the set holds it (its reload brings the other inputs
                // too); if the set refuses it, this reload is applied as it is.
                let based_on = Some(self.loaded.policy.version.clone());
                let version = crate::config::version_of(&text);
                self.versions.proposed = Some((version, r.trigger));
                self.propose(text, based_on, "file", Some(r));
                return false;
            }
            FileNote::Same => {}
        }
        if r.trigger == Trigger::SetVersion {
            if let (Some(v), Err(issues)) = (&r.set, &r.result) {
                self.refuse_version(v, issues);
                return false;
            }
        }
        if let Some(v) = &r.set {
            if self
                .versions
                .refused
                .as_ref()
                .is_some_and(|(rv, _)| rv == v)
                && r.result.is_ok()
            {
                info!(version = %v, "policy: the set's version loads now");
                self.versions.refused = None;
                self.metrics.policy_refused(false);
            }
            let at = self
                .set
                .set_policy()
                .filter(|p| p.version == *v)
                .map_or(0, |p| self.set.local_ms(p.activate_at_unix_ms));
            if *v != self.loaded.policy.version && at > now_ms() && r.result.is_ok() {
                info!(version = %v, activate_at_unix_ms = at, "policy: the set's version is loaded, served from its instant");
                self.versions.pending = Some((Box::new(r), at));
                self.update_doc();
                return false;
            }
        }
        self.versions.pending = None;
        let rolled_out = self.versions.staged.as_ref().is_some_and(|s| {
            r.result.is_ok() && r.set.as_ref() == Some(&s.version) && s.ends_ms.is_none()
        });
        if rolled_out {
            // The last stage reached: the new version is the one in force.
            info!(version = ?r.set, "policy: the staged rollout is complete");
            self.versions.staged = None;
            self.perf.store().end_cohorts();
        }
        let probes_changed = self.apply_reload(r);
        // The load's temporaries, and the configuration replaced, back to the system.
        crate::huge::give_back();
        probes_changed
    }

    /// When the pending version is due (for the event loop's timer).
    pub(super) fn version_due(&self) -> Option<u64> {
        self.versions.pending.as_ref().map(|(_, at)| *at)
    }

    /// The pending version, once its instant has come.
    pub(super) fn take_due_version(&mut self) -> Option<Reloaded> {
        match &self.versions.pending {
            Some((_, at)) if *at <= now_ms() => self.versions.pending.take().map(|(r, _)| *r),
            _ => None,
        }
    }

    pub(super) fn refuse_version(&mut self, version: &str, issues: &Issues) {
        let errors: Vec<String> = issues.errors().map(ToString::to_string).collect();
        for e in &errors {
            error!(version = %version, error = %e, "policy: the set's version does not load on this node: the last good one keeps serving");
        }
        self.metrics.policy_refused(true);
        self.audit(
            "policy_refused",
            serde_json::json!({ "version": version, "errors": errors }),
        );
        self.versions.refused = Some((version.to_string(), errors));
        self.update_doc();
    }

    /// The set's view changed: its version is loaded (or, when the set has none, the
    /// one this node serves is proposed; at the first view after a restart, an edit of
    /// the file made meanwhile is).
    pub(super) fn follow_policy(&mut self) {
        if !self.set.connected() {
            return;
        }
        let set = self.set.set_policy().cloned();
        if !self.versions.started {
            self.versions.started = true;
            if let Some(edit) = self.edited_while_down(set.as_ref().map(|p| p.version.as_str())) {
                return self.propose(edit.0, edit.1, "file", None);
            }
        }
        let Some(set) = set else {
            if !self.versions.proposed_first {
                self.versions.proposed_first = true;
                let text: Arc<str> = Arc::from(self.loaded.policy.source.as_str());
                self.propose(text, None, "first", None);
            }
            return;
        };
        self.versions.proposed_first = false;
        // During a staged rollout, the version before it stays the one in force.
        let (version, yaml) = self.follow_rollout(&set);
        let Some(to) = &self.versions.to_load else {
            return;
        };
        let asked = to.borrow().as_ref().map(|s| s.version.clone());
        if asked.as_deref() == Some(version.as_str()) {
            return;
        }
        let wanted = SetPolicy {
            version: version.clone(),
            text: PolicyText {
                origin: std::path::PathBuf::from(format!("policy version {version}")),
                text: yaml,
            },
        };
        if version == self.loaded.policy.version {
            // Served already (its file's): the next reloads load it, none now; a set
            // of one saves its store with the new key.
            to.send_if_modified(|s| {
                *s = Some(wanted);
                false
            });
            self.persist();
            return;
        }
        if self
            .versions
            .refused
            .as_ref()
            .is_some_and(|(v, _)| *v != set.version)
        {
            self.versions.refused = None;
            self.metrics.policy_refused(false);
        }
        info!(version = %version, serving = %self.loaded.policy.version, "policy: the set's version, loading it");
        to.send_replace(Some(wanted));
    }

    /// The policy file, when it was edited while this node was down (its version is
    /// not the one the saved state says it had): its text and the version this node
    /// served then, to propose it on.
    fn edited_while_down(&self, set: Option<&str>) -> Option<(Arc<str>, Option<String>)> {
        let saved = self.versions.saved.as_ref()?;
        let (file, text) = self.versions.file.as_ref()?;
        if *file == saved.file || Some(file.as_str()) == set {
            return None;
        }
        info!(file = %file, was = %saved.file, "policy file edited while this node was down: proposing it to the set");
        Some((text.clone(), Some(saved.served.clone())))
    }
}
