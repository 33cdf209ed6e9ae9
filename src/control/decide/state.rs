//! Control plane: the control state, pure. What moves weight away from a CDN besides
//! the policy: the failover state (health, steps, freeze; `failover.rs`) and the drains
//! (`drains/`). One value read three ways: by the controller that serves it
//! (`controller/`), by `steerdns explain` from what `serve` saved
//! (`persist::Saved::state`), and by a node of a set that applies it from its store
//! (`cluster/node.rs`).
//!
//! ```text
//!  saved file ─▶ Saved::state ┐
//!  probe rounds, API, etcd ──┴─▶ ControlState ─▶ removed, cuts ─▶ snapshot(&Loaded) ─▶ Plan
//! ```
//!
//! No I/O, no logging: every call takes the time it needs.

use std::time::Duration;

use crate::control::decide::drains::Drains;
use crate::control::decide::failover::FailoverState;
use crate::control::decide::keys::NameRegion;
use crate::control::decide::planner::{self, DrainCut, Removed};
use crate::inputs::Loaded;
use crate::plan::Snapshot;

/// How old a saved state may be to be used, unless `serve --state-max-age-seconds`
/// says otherwise (`steerdns explain` reads it with this age too).
pub(crate) const SAVED_MAX_AGE: Duration = Duration::from_secs(900);

/// Health, steps and freeze, and the drains with their progress.
#[derive(Clone, Debug, Default)]
pub struct ControlState {
    /// Health, failover steps and freeze.
    pub failover: FailoverState,
    /// Drains from the policy and the API, with their progress.
    pub drains: Drains,
}

impl ControlState {
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
    /// by the modifiers (`control/modifiers/perf/`); failover and drains apply after them.
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
}
