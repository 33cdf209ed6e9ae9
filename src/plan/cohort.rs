//! Contract, a staged rollout: while a new policy version rolls out, a snapshot holds
//! two plans, the version in force's ([`Snapshot::plan`]) and the new one's
//! ([`Canary::plan`]), and a share: the client networks whose cohort position
//! ([`crate::selection::cohort`]) falls below it get the new version's answer, the
//! rest the old one's. The position has no time window, so a network never flips back
//! and forth, and a larger share keeps every network of a smaller one. Both plans are
//! built by the planner (`control/decide`); nothing here decides policy.
//!
//! Every answer of a rollout is counted per cohort, with the error answers among them
//! (`SERVFAIL`, `REFUSED`, and a name the other version steers that this cohort's does
//! not answer): the controller halts the rollout when the canary's rise.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{Asker, Plan, Snapshot};
use crate::selection::{self, COHORT_PARTS};

/// The new version of a staged rollout, as the data plane serves it.
pub struct Canary {
    pub plan: Plan,
    /// Of [`COHORT_PARTS`] client networks, how many the canary answers.
    pub share: u16,
    /// The new version, and the version in force the rest get.
    pub version: Arc<str>,
    pub from: Arc<str>,
    /// Shared by every snapshot of one rollout.
    pub counts: Arc<CohortCounts>,
}

/// Which version answered a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cohort {
    /// No rollout: the version in force answers everyone.
    Whole,
    /// A rollout, the version in force.
    Control,
    /// A rollout, the new version.
    Canary,
}

impl Cohort {
    pub fn as_str(self) -> &'static str {
        match self {
            Cohort::Whole => "whole",
            Cohort::Control => "control",
            Cohort::Canary => "canary",
        }
    }
}

/// Answers and error answers per cohort (control, canary) since a rollout started.
#[derive(Debug, Default)]
pub struct CohortCounts {
    answers: [AtomicU64; 2],
    errors: [AtomicU64; 2],
}

/// One cohort's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counted {
    pub answers: u64,
    pub errors: u64,
}

impl CohortCounts {
    /// (control, canary).
    pub fn read(&self) -> (Counted, Counted) {
        let at = |i: usize| Counted {
            answers: self.answers[i].load(Ordering::Relaxed),
            errors: self.errors[i].load(Ordering::Relaxed),
        };
        (at(0), at(1))
    }
}

/// The plan that answers one query, and what its cohort changes of the answer.
pub struct Route<'s> {
    pub plan: &'s Plan,
    pub cohort: Cohort,
    /// The other version's plan during a rollout.
    pub other: Option<&'s Plan>,
    /// The ECS scope the answer echoes at least ([`selection::cohort`]).
    floor: u8,
    counts: Option<&'s CohortCounts>,
}

impl Snapshot {
    /// The plan that answers `asker`: the version in force's, or during a rollout the
    /// one of the asker's cohort.
    ///
    /// # Hot path
    /// Without a rollout, a branch; with one, a few multiplies.
    #[inline]
    pub fn route(&self, asker: &Asker) -> Route<'_> {
        let Some(c) = &self.canary else {
            return Route {
                plan: &self.plan,
                cohort: Cohort::Whole,
                other: None,
                floor: 0,
                counts: None,
            };
        };
        let (at, floor) = selection::cohort(asker.resolver, asker.client, asker.source);
        let (plan, other, cohort) = if at < c.share.min(COHORT_PARTS) {
            (&c.plan, &self.plan, Cohort::Canary)
        } else {
            (&self.plan, &c.plan, Cohort::Control)
        };
        Route {
            plan,
            cohort,
            other: Some(other),
            floor,
            counts: Some(&c.counts),
        }
    }

    /// Whether either plan steers the name `wire` (lower case, wire form).
    pub fn steers_wire(&self, wire: &[u8]) -> bool {
        self.plan.get_wire(wire).is_some()
            || self
                .canary
                .as_ref()
                .is_some_and(|c| c.plan.get_wire(wire).is_some())
    }
}

impl Route<'_> {
    /// The ECS scope to echo for an answer whose plan says `scope`.
    #[inline]
    pub fn scope(&self, scope: u8) -> u8 {
        scope.max(self.floor)
    }

    /// Counts an answer of this cohort during a rollout (nothing otherwise).
    #[inline]
    pub fn count(&self, error: bool) {
        if let Some(c) = self.counts {
            let i = usize::from(self.cohort == Cohort::Canary);
            c.answers[i].fetch_add(1, Ordering::Relaxed);
            if error {
                c.errors[i].fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
