//! Control plane: the gauges that describe the control state, and the changes of the
//! vantage points and of fail-open, each logged once when it happens. The controller
//! calls [`Gauges::export`] whenever the state it serves changes.

use std::collections::{BTreeMap, BTreeSet};

use tracing::{info, warn};

use crate::clock::now_ms;
use crate::control::decide::drains::DrainState;
use crate::control::decide::health::{self, State, VantageView};
use crate::control::decide::keys::{NameCdn, NameRegion};
use crate::control::decide::state::ControlState;
use crate::inputs::Loaded;
use crate::metrics::Metrics;

/// What the gauges were last set to, so that a change is logged (and a series
/// removed) once.
#[derive(Debug, Default)]
pub(crate) struct Gauges {
    /// (name, CDN) pairs whose `drains_active` gauge is set.
    drains_active: BTreeSet<NameCdn>,
    /// Peers currently unhappy, with why.
    unhappy_peers: BTreeMap<String, String>,
}

impl Gauges {
    /// Sets the gauges that describe the plan: health, removed percentages, drains.
    /// (`/metrics` reads the effective shares from the plan being served.)
    pub(crate) fn export(&mut self, m: &Metrics, loaded: &Loaded, state: &ControlState) {
        let removed = state.removed(loaded);
        // Every probed CDN, the ones without a verdict yet too (up until shown down):
        // its series exists from the start.
        for spec in &loaded.probes.specs {
            let up = state
                .failover
                .health
                .get(&spec.cdn)
                .is_none_or(|t| t.state == State::Up);
            m.health(&spec.cdn, up);
        }
        for host in &loaded.policy.hosts {
            let name = host.name.to_string();
            for cdn in &host.cdns {
                m.removed(
                    &name,
                    &cdn.name,
                    removed
                        .get(&NameCdn::new(name.clone(), cdn.name.clone()))
                        .copied()
                        .unwrap_or(0),
                );
            }
        }
        let active: BTreeSet<NameCdn> = state
            .drains
            .report(&loaded.policy, now_ms())
            .into_iter()
            .filter(|d| d.status == DrainState::InForce)
            .map(|d| NameCdn::new(d.name, d.cdn))
            .collect();
        for k in self.drains_active.difference(&active) {
            m.drain_active(&k.name, &k.cdn, false);
        }
        for k in &active {
            m.drain_active(&k.name, &k.cdn, true);
        }
        self.drains_active = active;
    }

    /// Notes which of the other vantage points are unhappy now.
    pub(crate) fn unhappy_peers(&mut self, m: &Metrics, views: &[VantageView]) {
        let now: BTreeMap<String, String> = views
            .iter()
            .filter_map(|v| health::unhappy(v).map(|u| (v.name.clone(), u.to_string())))
            .collect();
        for peer in now.keys() {
            m.vantage_unhappy(peer, true);
        }
        // A vantage point no longer unhappy loses its series: names come from peers,
        // and a peer renaming itself each reading must not grow /metrics.
        for peer in self.unhappy_peers.keys().filter(|p| !now.contains_key(*p)) {
            m.forget_vantage(peer);
        }
        for (peer, why) in &now {
            if self.unhappy_peers.get(peer) != Some(why) {
                warn!(peer = %peer, reason = %why, "vantage point unhappy: its failures do not count");
            }
        }
        for peer in self.unhappy_peers.keys().filter(|p| !now.contains_key(*p)) {
            info!(peer = %peer, "vantage point happy again");
        }
        self.unhappy_peers = now;
    }
}

/// Logs and counts the (name, region) pairs that start or stop failing open.
pub(crate) fn fail_open(m: &Metrics, was: &[NameRegion], now: &[NameRegion]) {
    for NameRegion { name, region } in now.iter().filter(|r| !was.contains(r)) {
        warn!(name = %name, region = %region, "fail-open: a removed share has no other CDN of the region to go to; the CDN it belongs to keeps serving it");
        m.fail_open(name, region, true);
    }
    for NameRegion { name, region } in was.iter().filter(|r| !now.contains(r)) {
        info!(name = %name, region = %region, "fail-open over: every removed share of the region has somewhere to go");
        m.fail_open(name, region, false);
    }
}
