//! Control plane: what the controller serves and shows. `plan` runs the one chain of
//! modifiers (`control/modifiers/chain.rs`) into a snapshot; `publish` swaps
//! it into `Live`, sets the gauges and saves the state; `show` hands `/v1/state` to the
//! saver, which shows it once it is written; `reply` answers an API call then.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Controller, REPLY_WAIT};
use crate::clock::now_ms;
use crate::control::cluster::node::Answer;
use crate::control::decide::planner::Removed;
use crate::control::disk::persist::Saved;
use crate::control::gauges;
use crate::control::modifiers::chain::Chain;
use crate::control::saver;
use crate::control::state_doc::{self, SaveStatus, StateDoc};
use crate::plan::Snapshot;

impl Controller {
    /// The snapshot for the current state (also used before the server starts, so that
    /// a restart never serves the configured weights in the middle of a failover).
    pub fn snapshot(&mut self) -> Snapshot {
        let snapshot = self.plan();
        self.update_doc();
        snapshot
    }

    pub(super) fn plan(&mut self) -> Snapshot {
        let chain = Chain::new(&self.perf);
        let (mut snapshot, fail_open) = chain.snapshot(&self.commit, &self.state, &self.loaded);
        self.note_fail_open(fail_open);
        // A staged rollout's new version, for its share of the client networks.
        snapshot.canary = self.canary();
        let share = snapshot.canary.as_ref().map_or(0, |c| c.share);
        self.metrics.policy_rollout_percent(
            f64::from(share) * 100.0 / f64::from(crate::selection::COHORT_PARTS),
        );
        snapshot
    }

    pub(super) fn removed(&self) -> Removed {
        self.state.removed(&self.loaded)
    }

    /// Serves the current state, saves it, and only then shows it in `/v1/state`: what
    /// an operator (or a test) sees there has been persisted.
    pub(super) fn publish(&mut self) {
        self.note_steps(Instant::now());
        let snapshot = self.plan();
        self.export();
        if let Some(live) = &self.live {
            let snapshot = Arc::new(snapshot);
            self.metrics.adopt(&snapshot);
            live.store(snapshot);
        }
        self.persist();
    }

    /// Sets the gauges that describe the plan: health, removed percentages, drains.
    pub(super) fn export(&mut self) {
        self.gauges.export(&self.metrics, &self.loaded, &self.state);
    }

    pub(super) fn note_fail_open(&mut self, now: Vec<crate::control::decide::keys::NameRegion>) {
        gauges::fail_open(&self.metrics, &self.noted.fail_open, &now);
        self.noted.fail_open = now;
    }

    /// Saves the state and then shows it in `/v1/state` (see [`saver`]).
    pub(super) fn persist(&mut self) {
        let saved = self.state_file.is_some().then(|| {
            let mut saved = Saved::of(&self.state, Instant::now());
            saved.commit = Some(self.commit.saved());
            saved.performance = self.perf.saved();
            saved.store = self.set.store.saved();
            saved.policy = self.versions.file.as_ref().map(|(file, _)| {
                crate::control::disk::persist::SavedPolicy {
                    file: file.clone(),
                    served: self.loaded.policy.version.clone(),
                }
            });
            saved
        });
        self.show(saved);
    }

    /// Shows what changed in `/v1/state`, nothing of it saved state.
    pub(super) fn update_doc(&mut self) {
        self.show(None);
    }

    /// Shows the document now, or through the saver once `saved` is written. The first
    /// document shows at once: the API never answers `null` while the saver is busy or
    /// the disk hangs at start (seen: `/v1/state` was `null` right after `serve`
    /// returned, on a machine running two test suites at once).
    pub(super) fn show(&mut self, saved: Option<Saved>) {
        let mut doc = self.doc_now();
        {
            let mut shown = self.doc.lock().unwrap_or_else(|e| e.into_inner());
            if shown.is_none() {
                *shown = Some(doc.clone());
            }
        }
        if let Some(saver) = &self.saver {
            match saver.submit(saved, doc) {
                Ok(generation) => {
                    self.handed = Some(generation);
                    return;
                }
                Err(back) => {
                    saver::gone();
                    self.saver = None;
                    doc = *back;
                }
            }
        }
        doc.state_save = self.state_file.as_ref().map(|sf| SaveStatus {
            dir: sf.dir.display().to_string(),
            ok: false,
            error: Some("the state saver thread has stopped".into()),
            failed_saves: None,
        });
        *self.doc.lock().unwrap_or_else(|e| e.into_inner()) = Some(doc);
    }

    /// Gives an API call's answer once what it changed is saved and shown, without holding up
    /// the controller meanwhile, and at the latest after [`REPLY_WAIT`]: on a hung disk
    /// the change serves and is answered, and `/v1/state` shows it once it is saved.
    pub(super) fn answer(&mut self, answer: Answer) {
        let (Some(saver), Some(generation)) = (&self.saver, self.handed) else {
            answer();
            return;
        };
        let mut written = saver.written();
        tokio::spawn(async move {
            let saved = written.wait_for(|&w| w >= generation);
            let _ = tokio::time::timeout(REPLY_WAIT, saved).await;
            answer();
        });
    }

    /// The `/v1/state` document for the state now.
    pub(super) fn doc_now(&self) -> StateDoc {
        let doc = state_doc::Parts {
            loaded: &self.loaded,
            state: &self.state,
            vantage: &self.vantage,
            noted: &self.noted,
            cluster: (!self.set.store.is_memory()).then_some(&self.set),
            peers: &self.peer_views(),
            performance: self.perf.view(),
            commit: self.commit.view(now_ms()),
            audit: self.audit_doc(),
        };
        let mut doc = doc.assemble();
        doc.policy = Some(self.policy_doc());
        doc
    }
}
