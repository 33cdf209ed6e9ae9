//! Control plane: the one chain of the modifiers of the policy weights, in their one
//! order: performance shifts, then commit biases, then failover steps and drains
//! (`ControlState::snapshot_for`, through the planner). `serve` (`controller/publish.rs`),
//! a commit evaluation, proposed or followed (`controller/modifiers.rs`,
//! `controller/set.rs`), and `explain` from a saved state (`cli/offline.rs`) all go
//! through it, so that no two of them can apply the modifiers in another order.
//!
//! ```text
//!  policy ─▶ Perf (shifts) ─▶ shifted ─▶ Commit (biases, not where perf holds a CDN
//!                                        outside its band) ─▶ failover + drains ─▶ Snapshot
//! ```

use std::borrow::Cow;

use crate::config::Policy;
use crate::control::decide::keys::NameRegion;
use crate::control::decide::state::ControlState;
use crate::control::modifiers::commit::Commit;
use crate::control::modifiers::perf::Perf;
use crate::inputs::Loaded;
use crate::plan::Snapshot;

/// The chain, from the performance modifier on.
pub(crate) struct Chain<'a> {
    pub perf: &'a Perf,
}

impl<'a> Chain<'a> {
    pub(crate) fn new(perf: &'a Perf) -> Chain<'a> {
        Chain { perf }
    }

    /// The policy after the performance shifts: what the commit modifier evaluates
    /// and applies its biases to.
    pub(crate) fn shifted<'p>(&self, policy: &'p Policy) -> Cow<'p, Policy> {
        match self.perf.apply(policy) {
            Some(p) => Cow::Owned(p),
            None => Cow::Borrowed(policy),
        }
    }

    /// Whether performance steering holds `cdn` (by index) of `region` of `name` outside
    /// its band (penalised or at its floor): the commit modifier leaves it alone.
    pub(crate) fn outside(&self, name: &str, region: usize, cdn: usize) -> bool {
        self.perf.outside(name, region, cdn)
    }

    /// The whole chain: performance, then `commit`, then the failover steps and
    /// drains of `state`; the snapshot to serve and the regions failing open.
    pub(crate) fn snapshot(
        &self,
        commit: &Commit,
        state: &ControlState,
        loaded: &Loaded,
    ) -> (Snapshot, Vec<NameRegion>) {
        let shifted = self.shifted(&loaded.policy);
        let outside = |n: &str, r: usize, c: usize| self.outside(n, r, c);
        let committed = commit.apply(&shifted, &outside);
        let policy = committed.as_ref().unwrap_or(&shifted);
        state.snapshot_for(loaded, policy)
    }
}
