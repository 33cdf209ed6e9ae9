//! Control plane: the controller as a node of its set (of one, or of many): the peers'
//! views, what the set's session brings (steps, drains, freeze, shifts, biases, usage),
//! and the answers of API writes, given once the view holds them.

use tokio::time::Instant;

use super::{Controller, REPLY_WAIT};
use crate::clock::now_ms;
use crate::control::cluster::node::{Done, Followed};
use crate::control::cluster::Shared;
use crate::control::decide::health::VantageView;
use crate::control::modifiers::chain::Chain;

impl Controller {
    /// The other vantage points now: the set's from etcd, or the HTTP peers'. What a
    /// peer reports of a CDN this policy does not probe counts for nothing, not even
    /// towards "sees every CDN fail".
    pub(super) fn peer_views(&self) -> Vec<VantageView> {
        // A set of one reads `probes/vantages.yaml`'s peers; a set of many shares
        // observations through its store (and reads no peers: see `start_probing`).
        let mut peers = self.set.vantage_views(&self.loaded);
        peers.extend(self.peers.views());
        for p in &mut peers {
            p.latest
                .retain(|cdn, _| self.loaded.probes.get(cdn).is_some());
        }
        peers
    }

    /// A new view or link state from the session: applied, then shown or published.
    pub(super) fn on_shared(&mut self, shared: Shared) {
        let revision = shared.link.connected.then_some(shared.revision);
        self.follow(shared);
        self.follow_policy();
        self.answer_waiting(revision);
    }

    fn follow(&mut self, shared: Shared) {
        let c = &mut self.set;
        let audit = self.audit.as_ref();
        let followed = c.on_shared(shared, &mut self.state, &self.loaded, &self.metrics, audit);
        let shifted = c.follow_perf(&mut self.perf, now_ms(), &self.metrics);
        let (biased, new) = self.follow_commit();
        match followed {
            Followed::Nothing | Followed::Shown if biased || shifted => self.publish(),
            // New usage or an evaluation: saved (the ledger) and shown.
            Followed::Nothing | Followed::Shown if new => self.persist(),
            Followed::Nothing => {}
            Followed::Shown => self.update_doc(),
            Followed::Applied(pending) => {
                self.note_steps(Instant::now());
                self.publish();
                self.set.catch_up(pending, &self.state, &self.loaded);
            }
        }
    }

    /// The usage records and commit biases the set holds, taken into the ledger and
    /// put in force. `(a bias in force changed, anything new)`.
    pub(super) fn follow_commit(&mut self) -> (bool, bool) {
        let c = &mut self.set;
        let took = c.follow_usage(&mut self.commit, &self.loaded.policy);
        let newer = c.newer_biases(&self.commit, now_ms());
        let mut changed = false;
        if !newer.is_empty() {
            let chain = Chain::new(&self.perf);
            let base = chain.shifted(&self.loaded.policy);
            let outside = |n: &str, r: usize, c: usize| chain.outside(n, r, c);
            for (name, b) in &newer {
                let biases: Vec<_> = b.biases.iter().map(|(k, v)| (k.clone(), *v)).collect();
                let by = Some(b.node.as_str());
                match self
                    .commit
                    .adopt(&base, &outside, name, b.at_unix_ms, by, &biases)
                {
                    Ok(c) => changed |= c,
                    Err(why) => {
                        let why = format!("by {} at {}: {why}", b.node, b.at_unix_ms);
                        self.set
                            .refuse_evaluation("commit biases", name, &why, &self.metrics);
                    }
                }
            }
        }
        let new = took || !newer.is_empty();
        if new {
            self.commit.export(&self.metrics, now_ms());
        }
        (changed, new)
    }
}

impl Controller {
    /// A write to the store finished: its answer waits until this node's view holds
    /// it (at most [`REPLY_WAIT`]); a failed write is answered at once.
    pub(super) fn on_written(&mut self, done: Done) {
        match done.revision {
            Some(rev) if self.set.latest().is_none_or(|s| s.revision < rev) => {
                let latest = Instant::now() + REPLY_WAIT;
                self.waiting.push((rev, latest, done.answer));
            }
            _ => self.answer(done.answer),
        }
    }

    /// Answers the calls whose write the view at `revision` holds (`None`: only those
    /// that waited long enough; a node failing static may never see its write).
    pub(super) fn answer_waiting(&mut self, revision: Option<i64>) {
        if self.waiting.is_empty() {
            return;
        }
        let now = Instant::now();
        let (due, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|(rev, latest, _)| revision.is_some_and(|r| r >= *rev) || *latest <= now);
        self.waiting = wait;
        for (_, _, answer) in due {
            self.answer(answer);
        }
    }
}
