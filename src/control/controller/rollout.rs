//! Control plane: a staged rollout of a policy version (`POST /v1/policy?stages=5,25,100
//! &stage_seconds=300`). The set's `policy` key holds the new version with the rollout
//! (`cluster/policy.rs`, [`Rollout`]): the version before it and its YAML, the stages
//! and their length. Until the last stage, every node keeps the version before as the
//! one in force and loads the new one beside it (the canary); from each stage's
//! instant (on the store's clock, like a version's activation) the snapshot carries
//! both plans and the stage's share of client networks, which the new one answers
//! (`plan/cohort.rs`). At the last stage the new version becomes the one in force.
//!
//! The rollout halts by itself (the set's version goes back to the one before, audited
//! as `halt`) when a node cannot load the new version, or when the canary's error
//! answers rise above the control's; `POST /v1/policy/halt` halts it by hand. Every
//! node drops the canary at the halt's instant.
//!
//! ```text
//! view: policy = new + rollout{from} ─▶ follow_rollout: the reload task keeps `from`;
//!        the new one loads beside it (Trigger::Canary) ─▶ on_canary ─▶ Staged.loaded
//! stage instants (tick_rollout) ─▶ publish: Snapshot.canary = {plan, share}
//! errors of the canary / a refusal ─▶ halt_rollout ─▶ policy = from (how: halt)
//! the last stage ─▶ the new version loads as the one in force ─▶ Staged dropped
//! ```

use std::sync::Arc;

use tokio::sync::oneshot;
use tracing::{error, info, warn};

use super::Controller;
use crate::clock::now_ms;
use crate::control::cluster::policy::{Proposal, Rollout, SharedPolicy, Source, Stages};
use crate::control::levers::command::{PolicyRefused, Written};
use crate::control::tasks::reload::{FilePolicy, Reloaded, Trigger};
use crate::inputs::{Loaded, PolicyText};
use crate::plan::{Canary, CohortCounts, Counted};
use crate::selection::COHORT_PARTS;

/// The canary's error answers that may be seen before they are judged.
const MIN_ERRORS: u64 = 20;

/// How often the canary's error answers are judged (ms).
const CHECK_MS: u64 = 1_000;

/// A staged rollout as this node runs it.
pub(crate) struct Staged {
    /// The new version, and the one before it.
    pub version: String,
    pub from: String,
    pub plan: Stages,
    /// When the first stage starts (this node's Unix ms).
    pub start_ms: u64,
    /// The new version loaded with this node's inputs (`None`: loading, or refused).
    pub loaded: Option<Arc<Loaded>>,
    /// This node cannot load it.
    pub refused: bool,
    /// Halted or replaced: the canary answers until then (this node's ms).
    pub ends_ms: Option<u64>,
    /// Answers and error answers per cohort, since the rollout started here.
    pub counts: Arc<CohortCounts>,
    /// The stage last served (for the log and the audit log).
    pub stage: Option<usize>,
    /// When the canary's errors were last judged (ms).
    pub checked_ms: u64,
}

impl Staged {
    /// Of [`COHORT_PARTS`] client networks, how many the new version answers at `now`.
    fn share(&self, now: u64) -> u16 {
        if self.loaded.is_none() || self.ends_ms.is_some_and(|e| now >= e) {
            return 0;
        }
        self.plan
            .stage_at(self.start_ms, now)
            .map_or(0, |k| u16::from(self.plan.stages[k]) * (COHORT_PARTS / 100))
    }

    /// When the share changes next (ms): the next stage, or the end (at once when
    /// past: the canary is dropped then).
    fn next_ms(&self, now: u64) -> Option<u64> {
        let stage = self.plan.next_ms(self.start_ms, now);
        stage.into_iter().chain(self.ends_ms).min()
    }
}

impl Controller {
    /// The set's version and its rollout: the version the reload task is to load as
    /// the one in force (until the last stage, the one before the rollout), and the
    /// canary started, kept or ended.
    pub(super) fn follow_rollout(&mut self, set: &SharedPolicy) -> (String, Arc<str>) {
        let store_now = self.set.store_ms(now_ms());
        let done_here = self.versions.rolled_out.as_deref() == Some(set.version.as_str());
        if let Some(r) = set.running(store_now).filter(|_| !done_here) {
            let fresh = self
                .versions
                .staged
                .as_ref()
                .is_none_or(|s| s.version != set.version || s.ends_ms.is_some());
            if fresh {
                self.start_staged(set, r);
            }
            return (r.from.clone(), Arc::from(r.from_yaml.as_str()));
        }
        if set.rollout.is_some() {
            // Ended, by either clock: for good, whatever the next estimate of the
            // store's clock reads.
            self.versions.rolled_out = Some(set.version.clone());
        }
        let at = self.set.local_ms(set.activate_at_unix_ms);
        if let Some(s) = &mut self.versions.staged {
            if s.version != set.version && s.ends_ms.is_none() {
                // Halted or replaced: every node drops it at the instant of the set's
                // version.
                info!(version = %s.version, now = %set.version, "policy: the staged rollout ends (halted or replaced); its canary answers until the set's version's instant");
                s.ends_ms = Some(at);
            }
        }
        (set.version.clone(), Arc::from(set.yaml.as_str()))
    }

    /// Loads the rollout's version beside the one in force (the result comes back as a
    /// reload, [`Trigger::Canary`]).
    fn start_staged(&mut self, set: &SharedPolicy, r: &Rollout) {
        let start_ms = self.set.local_ms(set.activate_at_unix_ms);
        info!(version = %set.version, from = %r.from, stages = ?r.plan.stages, stage_seconds = r.plan.stage_seconds, "policy: a staged rollout; loading its version beside the one in force");
        self.versions.staged = Some(Staged {
            version: set.version.clone(),
            from: r.from.clone(),
            plan: r.plan.clone(),
            start_ms,
            loaded: None,
            refused: false,
            ends_ms: None,
            counts: Arc::default(),
            stage: None,
            checked_ms: 0,
        });
        let (Some(checker), Some(back)) =
            (self.versions.checker.clone(), self.versions.reloads.clone())
        else {
            return;
        };
        let text = PolicyText {
            origin: std::path::PathBuf::from(format!("policy version {}", set.version)),
            text: Arc::from(set.yaml.as_str()),
        };
        let version = set.version.clone();
        tokio::spawn(async move {
            let result = checker.load(Some(text)).await;
            let loaded = Reloaded {
                trigger: Trigger::Canary,
                result,
                set: Some(version),
                file: FilePolicy::default(),
                tokens: None,
            };
            let _ = back.send(loaded).await;
        });
    }

    /// The rollout's version, loaded: served from its first stage's instant; or
    /// refused: said, and the rollout halted.
    pub(super) fn on_canary(&mut self, r: Reloaded) {
        let Some(s) = self
            .versions
            .staged
            .as_mut()
            .filter(|s| r.set.as_ref() == Some(&s.version) && s.loaded.is_none() && !s.refused)
        else {
            return;
        };
        match r.result {
            Ok(loaded) => {
                for w in loaded.warnings.warnings() {
                    warn!(version = %s.version, warning = %w, "staged rollout: configuration warning");
                }
                info!(version = %s.version, start_ms = s.start_ms, "policy: the staged rollout's version is loaded");
                s.loaded = Some(Arc::new(loaded));
                // Its stage now, said (the stage's instant may have passed meanwhile).
                self.tick_rollout();
                self.publish();
            }
            Err(issues) => {
                s.refused = true;
                let version = s.version.clone();
                self.refuse_version(&version, &issues);
                let first = issues
                    .errors()
                    .next()
                    .map_or_else(String::new, ToString::to_string);
                self.halt_rollout(format!(
                    "node {} cannot load version {version}: {first}",
                    self.vantage
                ));
            }
        }
    }

    /// The canary of the snapshot to serve now (`None`: no rollout, or a share of 0).
    pub(super) fn canary(&self) -> Option<Canary> {
        let s = self.versions.staged.as_ref()?;
        let loaded = s.loaded.as_ref()?;
        let share = s.share(now_ms());
        if share == 0 {
            return None;
        }
        // Planned for the geo database the version in force serves with, with the
        // failover state and drains in force (performance shifts and commit biases
        // were measured for the version in force's regions: they apply to the new
        // version once it is the one in force).
        let state = &self.state;
        let plan = crate::control::decide::planner::plan_alone(
            loaded,
            &state.removed(loaded),
            &state.cuts(loaded),
            self.loaded.geo.places(),
        );
        Some(Canary {
            plan,
            share,
            version: Arc::from(s.version.as_str()),
            from: Arc::from(self.loaded.policy.version.as_str()),
            counts: s.counts.clone(),
        })
    }

    /// The rollout's version, loaded (for explain).
    pub(super) fn canary_loaded(&self) -> Option<&Loaded> {
        self.versions
            .staged
            .as_ref()
            .and_then(|s| s.loaded.as_deref())
    }

    /// When the rollout needs the controller next (this node's ms): a stage, its end,
    /// or the next look at the canary's errors.
    pub(super) fn rollout_due(&self) -> Option<u64> {
        let s = self.versions.staged.as_ref()?;
        let now = now_ms();
        // A stage not served yet (a timer that woke a millisecond early): at once.
        if s.loaded.is_some() && s.plan.stage_at(s.start_ms, now) != s.stage {
            return Some(now);
        }
        let check = (s.loaded.is_some() && s.ends_ms.is_none())
            .then_some(s.checked_ms.max(s.start_ms) + CHECK_MS);
        s.next_ms(now).into_iter().chain(check).min()
    }

    /// A stage begun (logged and audited), the canary dropped at its end, its errors
    /// judged; whether the snapshot changes.
    pub(super) fn tick_rollout(&mut self) -> bool {
        let now = now_ms();
        let Some(s) = &mut self.versions.staged else {
            return false;
        };
        if s.ends_ms.is_some_and(|e| now >= e) {
            info!(version = %s.version, "policy: the staged rollout's canary stops answering");
            self.versions.staged = None;
            self.perf.store().end_cohorts();
            return true;
        }
        let stage = s
            .plan
            .stage_at(s.start_ms, now)
            .filter(|_| s.loaded.is_some());
        if stage == s.stage {
            self.check_canary(now);
            return false;
        }
        s.stage = stage;
        let Some(k) = stage else {
            return true;
        };
        let (version, percent, of) = (s.version.clone(), s.plan.stages[k], s.plan.stages.len());
        info!(version = %version, stage = k + 1, of, percent, "policy: staged rollout stage");
        self.audit(
            "policy_stage",
            serde_json::json!({ "version": version, "stage": k + 1, "of": of, "percent": percent }),
        );
        if k + 1 == of {
            // The last stage: the new version is the one in force; the canary answers
            // everyone until it is loaded as such.
            self.versions.rolled_out = Some(version);
            self.follow_policy();
        }
        true
    }

    /// Halts the rollout when the canary's error answers rose.
    fn check_canary(&mut self, now: u64) {
        let Some(s) = self.versions.staged.as_mut() else {
            return;
        };
        if s.loaded.is_none() || s.ends_ms.is_some() || now < s.checked_ms + CHECK_MS {
            return;
        }
        s.checked_ms = now;
        let (control, canary) = s.counts.read();
        let version = s.version.clone();
        if let Some(why) = errors_rose(control, canary).or_else(|| self.measured_worse(&version)) {
            self.halt_rollout(why);
        }
    }

    /// Why the new version's clients measure worse than the old one's, in a region
    /// whose performance steering measures it: by more than its `band_percent`, both
    /// cohorts with its `min_samples` and `min_networks`.
    fn measured_worse(&self, version: &str) -> Option<String> {
        let store = self.perf.store();
        store.cohort_aggregates(version).into_iter().find_map(|c| {
            let host = self.loaded.policy.host(&c.name)?;
            let region = host.regions.get(c.region)?;
            let perf = region.performance.as_ref()?;
            let (new, old) = (c.canary.usable(perf)?, c.control.usable(perf)?);
            let gap = crate::control::modifiers::perf::modifier::gap(perf.metric, new, old);
            (gap > perf.band_percent).then(|| {
                format!(
                    "the new version's clients measure {} {new:.3} against {old:.3} for the version before in {} region {} ({gap:.1} worse, band {}): {} and {} samples",
                    perf.metric.as_str(),
                    c.name,
                    region.name,
                    perf.band_percent,
                    c.canary.samples,
                    c.control.samples
                )
            })
        })
    }

    /// Asks the set to halt the rollout in progress, for `why` (once per rollout).
    pub(super) fn halt_rollout(&mut self, why: String) {
        let Some(set) = self.set.set_policy().cloned() else {
            return;
        };
        if set.running(self.set.store_ms(now_ms())).is_none()
            || self.versions.halting.as_deref() == Some(set.version.as_str())
        {
            return;
        }
        error!(version = %set.version, why = %why, "policy: halting the staged rollout");
        self.versions.halting = Some(set.version.clone());
        self.metrics.policy_rollout_halted();
        let (tx, rx) = oneshot::channel();
        let author = format!("steerdns on {}", self.vantage);
        self.write_halt(&set, author, None, Some(why), tx);
        tokio::spawn(async move {
            match rx.await {
                Ok(Ok(w)) => info!(version = %w.version, "policy: the staged rollout is halted"),
                Ok(Err(e)) => warn!(error = %e, "policy: the rollout was not halted"),
                Err(_) => {}
            }
        });
    }

    /// `POST /v1/policy/halt`.
    pub(super) fn halt_policy(
        &mut self,
        author: String,
        ticket: Option<String>,
        reply: oneshot::Sender<Result<Written, PolicyRefused>>,
    ) {
        if let Some(why) = self.unaudited() {
            let _ = reply.send(Err(PolicyRefused::NotAudited(why)));
            return;
        }
        let set = self.set.set_policy().cloned();
        let running = set
            .as_ref()
            .is_some_and(|p| p.running(self.set.store_ms(now_ms())).is_some());
        match set {
            Some(set) if running => self.write_halt(&set, author, ticket, None, reply),
            _ => {
                let _ = reply.send(Err(PolicyRefused::Conflict(
                    "no staged rollout is in progress".into(),
                )));
            }
        }
    }

    /// Writes the version before the rollout of `set` back as the set's.
    fn write_halt(
        &mut self,
        set: &SharedPolicy,
        author: String,
        ticket: Option<String>,
        why: Option<String>,
        reply: oneshot::Sender<Result<Written, PolicyRefused>>,
    ) {
        let Some(r) = &set.rollout else {
            return;
        };
        let proposal = Proposal {
            source: Source::Text(r.from_yaml.clone()),
            check: None,
            based_on: Some(set.version.clone()),
            author,
            ticket,
            how: "halt",
            stages: None,
            why,
        };
        self.set.write_policy(proposal, reply);
    }

    /// The rollout in `GET /v1/policy`: `null` when none runs or is winding down here.
    pub(super) fn rollout_doc(&self) -> Option<serde_json::Value> {
        let s = self.versions.staged.as_ref()?;
        let now = now_ms();
        let (control, canary) = s.counts.read();
        let stage = s.plan.stage_at(s.start_ms, now);
        let counted = |c: Counted| serde_json::json!({ "answers": c.answers, "errors": c.errors });
        Some(serde_json::json!({
            "version": s.version,
            "from": s.from,
            "stages": s.plan.stages,
            "stage_seconds": s.plan.stage_seconds,
            "start_unix_ms": s.start_ms,
            "end_unix_ms": s.plan.end_ms(s.start_ms),
            "stage": stage.map(|k| k + 1),
            "share_percent": f64::from(s.share(now)) * 100.0 / f64::from(COHORT_PARTS),
            "serving_percent": self.live.as_ref().map(|l| {
                let share = l.load().canary.as_ref().map_or(0, |c| c.share);
                f64::from(share) * 100.0 / f64::from(COHORT_PARTS)
            }),
            "stage_served": s.stage.map(|k| k + 1),
            "loaded": s.loaded.is_some(),
            "refused": s.refused,
            "ending_unix_ms": s.ends_ms,
            "control": counted(control),
            "canary": counted(canary),
            "checked_unix_ms": (s.checked_ms > 0).then_some(s.checked_ms),
            "measured": self.measured_doc(&s.version),
        }))
    }

    /// What each cohort's players measure, per (name, region) whose performance is
    /// measured: what a halt for "measure worse" compares.
    fn measured_doc(&self, version: &str) -> Vec<serde_json::Value> {
        let mut out: Vec<serde_json::Value> = self
            .perf
            .store()
            .cohort_aggregates(version)
            .into_iter()
            .filter_map(|c| {
                let host = self.loaded.policy.host(&c.name)?;
                let region = host.regions.get(c.region)?;
                let perf = region.performance.as_ref()?;
                let side = |a: &crate::control::modifiers::perf::cell::Aggregate| {
                    let (value, samples) = a.metric(perf.metric);
                    serde_json::json!({ "value": value, "samples": samples, "networks": a.networks })
                };
                Some(serde_json::json!({
                    "name": c.name,
                    "region": region.name,
                    "metric": perf.metric.as_str(),
                    "control": side(&c.control),
                    "canary": side(&c.canary),
                }))
            })
            .collect();
        out.sort_by(|a, b| {
            (a["name"].as_str(), a["region"].as_str())
                .cmp(&(b["name"].as_str(), b["region"].as_str()))
        });
        out
    }
}

/// Why the canary's error answers are judged to have risen: at least [`MIN_ERRORS`],
/// at a rate above twice the control's plus one point.
fn errors_rose(control: Counted, canary: Counted) -> Option<String> {
    if canary.errors < MIN_ERRORS {
        return None;
    }
    let rate = |c: Counted| c.errors as f64 * 100.0 / c.answers.max(1) as f64;
    (rate(canary) > 2.0 * rate(control) + 1.0).then(|| {
        format!(
            "the new version's error answers rose: {} of {} ({:.1} %) against {} of {} ({:.1} %) for the version in force",
            canary.errors,
            canary.answers,
            rate(canary),
            control.errors,
            control.answers,
            rate(control)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(answers: u64, errors: u64) -> Counted {
        Counted { answers, errors }
    }

    #[test]
    fn errors_rise_only_past_a_floor_and_above_the_controls() {
        assert_eq!(errors_rose(c(1000, 0), c(100, 19)), None);
        assert!(errors_rose(c(1000, 0), c(100, 20)).is_some());
        // The control fails as often: not the new version's doing.
        assert_eq!(errors_rose(c(1000, 300), c(100, 30)), None);
        assert!(errors_rose(c(1000, 10), c(1000, 40)).is_some());
    }

    #[test]
    fn stages_share_and_end() {
        let s = Staged {
            version: "a".into(),
            from: "b".into(),
            plan: Stages {
                stages: vec![10, 100],
                stage_seconds: 60,
            },
            start_ms: 1_000_000,
            loaded: Some(Arc::new(crate::inputs::demo())),
            refused: false,
            ends_ms: None,
            counts: Arc::default(),
            stage: None,
            checked_ms: 0,
        };
        assert_eq!(s.share(999_999), 0);
        assert_eq!(s.next_ms(999_999), Some(1_000_000));
        assert_eq!(s.share(1_000_000), 1_000);
        assert_eq!(s.next_ms(1_000_000), Some(1_060_000));
        assert_eq!(s.share(1_060_000), COHORT_PARTS);
        assert_eq!(s.next_ms(1_060_000), None);
        let halted = Staged {
            ends_ms: Some(1_030_000),
            ..s
        };
        assert_eq!(halted.next_ms(1_000_000), Some(1_030_000));
        assert_eq!(
            halted.next_ms(1_040_000),
            Some(1_030_000),
            "dropped at once"
        );
        assert_eq!(halted.share(1_030_000), 0);
    }
}
