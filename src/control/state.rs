//! Control plane: the control state, pure. What moves weight away from a CDN besides
//! the policy: the failover state (health, steps, freeze; `failover.rs`) and the drains
//! (`drains/`). One value read three ways: by the controller that serves it
//! (`controller/`), by `steerdns explain` from what `serve` saved
//! ([`ControlState::from_saved`]), and by a node of a set that applies it from etcd
//! (`cluster/node.rs`).
//!
//! ```text
//!  saved file ─▶ from_saved ─┐
//!  probe rounds, API, etcd ──┴─▶ ControlState ─▶ removed, cuts ─▶ snapshot(&Loaded) ─▶ Plan
//! ```
//!
//! No I/O, no logging: every call takes the time it needs.

use std::time::Duration;

use tokio::time::Instant;

use crate::control::drains::Drains;
use crate::control::failover::FailoverState;
use crate::control::keys::NameRegion;
use crate::control::persist::{self, Saved};
use crate::control::planner::{self, DrainCut, Removed};
use crate::inputs::Loaded;
use crate::plan::Snapshot;

/// How old a saved state may be to be used, unless `serve --state-max-age-seconds`
/// says otherwise (`steerdns explain` reads it with this age too).
pub const SAVED_MAX_AGE: Duration = Duration::from_secs(900);

/// Health, steps and freeze, and the drains with their progress.
#[derive(Clone, Debug, Default)]
pub struct ControlState {
    /// Health, failover steps and freeze.
    pub failover: FailoverState,
    /// Drains from the policy and the API, with their progress.
    pub drains: Drains,
}

impl ControlState {
    /// The state `serve` saved, for `loaded`: what is no longer probed or steered is
    /// forgotten, drains are synced with the policy at `now_ms`.
    pub fn from_saved(saved: &Saved, loaded: &Loaded, now: Instant, now_ms: u64) -> ControlState {
        let mut state = ControlState {
            failover: FailoverState {
                health: saved.health.clone(),
                steps: saved.steppers(now),
                frozen: saved.frozen.clone(),
                frozen_tenants: saved.frozen_tenants.clone(),
            },
            drains: Drains::default(),
        };
        state.failover.retain_known(&loaded.policy, &loaded.probes);
        state
            .drains
            .restore(saved.overrides.clone(), &saved.drains, now, saved.age_ms());
        state.drains.sync(&loaded.policy, now, now_ms);
        state
    }

    /// Percent of each (name, CDN)'s share moved away by failover.
    pub fn removed(&self, loaded: &Loaded) -> Removed {
        self.failover.removed(&loaded.policy)
    }

    /// The drains in force, as the planner cuts them.
    pub fn cuts(&self, loaded: &Loaded) -> Vec<DrainCut> {
        self.drains.cuts(&loaded.policy)
    }

    /// The plan for this state, and the regions that had to fail open.
    pub fn snapshot(&self, loaded: &Loaded) -> (Snapshot, Vec<NameRegion>) {
        self.snapshot_for(loaded, &loaded.policy)
    }

    /// The plan for this state over `policy`: the loaded one with its weights changed
    /// by the modifiers (`control/perf/`); failover and drains apply after them.
    pub fn snapshot_for(
        &self,
        loaded: &Loaded,
        policy: &crate::config::Policy,
    ) -> (Snapshot, Vec<NameRegion>) {
        planner::snapshot_for(loaded, policy, &self.removed(loaded), &self.cuts(loaded))
    }

    /// Why failover of `name` is frozen: the freeze of every name, else its tenant's.
    pub fn frozen_for(&self, loaded: &Loaded, name: &str) -> Option<String> {
        let f = &self.failover;
        f.frozen.clone().or_else(|| {
            let name = name.trim_end_matches('.');
            loaded
                .policy
                .hosts
                .iter()
                .find(|h| {
                    h.name
                        .to_string()
                        .trim_end_matches('.')
                        .eq_ignore_ascii_case(name)
                })
                .and_then(|h| h.tenant.as_ref())
                .and_then(|t| f.frozen_tenants.get(t))
                .map(|why| format!("{why} (tenant freeze)"))
        })
    }

    /// The state to save now.
    pub fn saved(&self, now: Instant) -> Saved {
        let f = &self.failover;
        let mut saved = persist::capture(&f.health, &f.steps, now);
        saved.overrides = self.drains.overrides.clone();
        saved.drains = self.drains.saved(now);
        saved.frozen = f.frozen.clone();
        saved.frozen_tenants = f.frozen_tenants.clone();
        saved
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::health::VerdictKind;
    use crate::control::keys::NameCdn;
    use std::path::Path;

    /// The demo inputs, with the failover tests' policy, its name of tenant `shop`.
    fn loaded() -> Loaded {
        let mut loaded = crate::inputs::demo();
        let policy = crate::control::failover::tests::POLICY;
        loaded.policy = crate::config::parse(Path::new("t.yaml"), policy.into())
            .unwrap()
            .0;
        loaded.policy.hosts[0].tenant = Some("shop".into());
        loaded
    }

    #[test]
    fn a_saved_state_comes_back_as_it_was_served() {
        let loaded = loaded();
        let t0 = Instant::now();
        let mut state = ControlState::default();
        state.failover.track("a", VerdictKind::Down, 1, 1);
        let mut s = crate::control::stepper::Stepper::default();
        s.demote(t0, &loaded.policy.hosts[0].failover);
        state
            .failover
            .steps
            .insert(NameCdn::new("www.example.com.", "a"), s);
        state
            .failover
            .frozen_tenants
            .insert("shop".into(), "maintenance".into());
        let saved = state.saved(t0);
        let back = ControlState::from_saved(&saved, &loaded, t0, saved.saved_unix_ms);
        assert_eq!(back.removed(&loaded), state.removed(&loaded));
        assert_eq!(
            back.removed(&loaded)
                .get(&NameCdn::new("www.example.com.", "a")),
            Some(&50)
        );
        assert_eq!(
            back.frozen_for(&loaded, "WWW.example.com"),
            Some("maintenance (tenant freeze)".into()),
            "the tenant's freeze is the name's"
        );
    }
}
