//! Control plane: probing. `start_probing` runs the prober and the peer readers;
//! `on_round` turns a finished round into a verdict (by quorum over this vantage point
//! and its peers), tracks it through hysteresis, and acts on a health change; failover
//! steps are taken, noted and audited as time brings them.

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{peer_interval, Controller};
use crate::clock::now_ms;
use crate::control::decide::failover::Step;
use crate::control::decide::health::{self, State, VantageView, VerdictKind};
use crate::control::tasks::prober::{self, Round};

impl Controller {
    /// Starts the prober and the peer readers for the current probes; the returned
    /// token stops them (on a reload that changes the probes).
    pub(super) fn start_probing(
        &self,
        rounds: &mpsc::Sender<Round>,
        stop: &CancellationToken,
    ) -> CancellationToken {
        let token = stop.child_token();
        self.peers.clear();
        if self.set.store.is_memory() {
            self.peers.spawn(
                self.loaded.probes.vantages.clone(),
                peer_interval(&self.loaded.probes),
                token.clone(),
                Some(self.metrics.clone()),
            );
        } else if !self.loaded.probes.vantages.is_empty() {
            warn!("probes/vantages.yaml is not read in a set (--etcd): observations are shared through etcd only");
        }
        prober::spawn(
            self.loaded.probes.specs.clone(),
            self.vantage.clone(),
            self.local.clone(),
            rounds.clone(),
            token.clone(),
        );
        token
    }

    pub(super) fn on_round(&mut self, round: Round) {
        let Some(spec) = self.loaded.probes.get(&round.cdn).cloned() else {
            return;
        };
        let taken = self
            .perf
            .probed(&round.cdn, round.ok, round.ttfb_ms, now_ms());
        self.metrics.rum_samples("probe", taken);
        let latest = self.local.snapshot();
        // Until every CDN has been probed (since this one began failing, if it is), a
        // failure here cannot be told from a failure of this vantage point's network.
        let warming_up = latest.len() < self.loaded.probes.specs.len()
            || !self.local.others_probed_since_failure(&round.cdn);
        let own = VantageView {
            name: self.vantage.clone(),
            latest,
            error: None,
            warming_up,
        };
        // Waiting for the other CDNs' rounds is routine, not worth a log line.
        let unhappy = health::unhappy(&own)
            .filter(|u| *u != health::Unhappy::WarmingUp)
            .map(|u| u.to_string());
        if unhappy != self.noted.own_unhappy {
            self.metrics
                .vantage_unhappy(&self.vantage, unhappy.is_some());
            match &unhappy {
                Some(why) => {
                    warn!(vantage = %self.vantage, reason = %why, "this vantage point is unhappy: its failures do not demote any CDN")
                }
                None => info!(vantage = %self.vantage, "this vantage point is happy again"),
            }
            self.noted.own_unhappy = unhappy;
        }
        let mut views = vec![own];
        self.set.rounds.notify_one();
        let peers = self.peer_views();
        self.gauges.unhappy_peers(&self.metrics, &peers);
        views.extend(peers);
        // Three rounds, plus a second for a peer's reading to travel and a loaded machine.
        let fresh_ms = (spec.interval * 3).as_millis() as u64 + 1000;
        // With fewer vantage points configured than the quorum, all of them must agree.
        // In a set, the quorum counts vantage points of the whole set, as configured.
        let quorum = match self.set.store.is_memory() {
            false => spec.quorum,
            true => spec
                .quorum
                .min(1 + self.loaded.probes.vantages.len() as u32),
        };
        let verdict = health::verdict(&round.cdn, &views, quorum, fresh_ms);
        let counts = self
            .noted
            .verdict_counts
            .entry(round.cdn.clone())
            .or_default();
        match verdict.kind {
            VerdictKind::Down => counts.down += 1,
            VerdictKind::Up => counts.up += 1,
            VerdictKind::Unknown => counts.unknown += 1,
        }
        let changed =
            self.state
                .failover
                .track(&round.cdn, verdict.kind, spec.down_after, spec.up_after);
        self.noted.verdicts.insert(
            round.cdn.clone(),
            format!("{:?}: {}", verdict.kind, verdict.summary()),
        );
        if let Some(t) = changed {
            self.metrics.transition(&t.cdn, t.to == State::Down);
            info!(cdn = %t.cdn, scope = "global", from = %t.from, to = %t.to, quorum, evidence = %verdict.summary(), "health changed");
            self.audit(
                "health",
                serde_json::json!({
                    "cdn": t.cdn,
                    "from": t.from.to_string(),
                    "to": t.to.to_string(),
                    "evidence": verdict.summary(),
                }),
            );
            if self.state.failover.frozen.is_some() {
                warn!(cdn = %t.cdn, to = %t.to, "failover frozen: not acting on the health change");
                self.persist();
                return;
            }
            // The verdict and the steps it starts show together: once the view holds
            // the timelines written (`on_shared` publishes and saves them).
            let written = self.set.propose(&self.state, &self.loaded, &t.cdn, t.to);
            self.export();
            if written == 0 {
                self.persist();
            }
        } else {
            self.persist();
        }
    }

    /// Applies due steps; returns whether any weight changed.
    pub(super) fn tick_steps(&mut self, now: Instant) -> bool {
        let taken = self.state.failover.tick(&self.loaded.policy, now);
        log_steps(&taken);
        self.note_steps(now);
        !taken.is_empty()
    }

    /// Notes `now` as the time of every failover step taken since the last call.
    pub(super) fn note_steps(&mut self, now: Instant) {
        let removed = self.removed();
        let mut back = Vec::new();
        self.noted.stepped.retain(|k, _| {
            let keep = removed.get(k).is_some_and(|&p| p > 0);
            if !keep {
                back.push(k.clone());
            }
            keep
        });
        for key in back {
            self.audit(
                "step",
                serde_json::json!({ "name": key.name, "cdn": key.cdn, "removed_percent": 0 }),
            );
        }
        for (key, &pct) in removed.iter().filter(|(_, &p)| p > 0) {
            if self
                .noted
                .stepped
                .get(key)
                .is_none_or(|&(was, _)| was != pct)
            {
                self.noted.stepped.insert(key.clone(), (pct, now));
                self.audit(
                    "step",
                    serde_json::json!({ "name": key.name, "cdn": key.cdn, "removed_percent": pct }),
                );
            }
        }
    }
}

/// Logs the steps time took.
pub(super) fn log_steps(taken: &[Step]) {
    for (name, cdn, pct) in taken {
        info!(name = %name, cdn = %cdn, removed_percent = pct, "failover step");
    }
}
