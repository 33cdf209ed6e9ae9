//! Contract between the planes: an immutable [`Plan`] that the control plane builds and
//! the data plane reads, published together with the geo database and the zones as one
//! [`Snapshot`] behind an `ArcSwap` ([`Live`]). This file holds the snapshot and the
//! public surface; the plan itself is in three parts:
//!
//! - `layout`: the packed tables of a [`Plan`] and how the planner's description of the
//!   names ([`NameSpec`], [`ChoiceSpec`]) is laid out in them, for one geo database's
//!   places, in one step ([`Plan::new`]);
//! - `steering`: what a query does with them: find the name ([`Plan::get_wire`]), say
//!   where the client lands ([`Steered::situate`]: locate, decide, choose) and answer
//!   ([`Steered::answer`]: that, then the weighted pick);
//! - `regions`: the region index of a name ([`RegionIndex`]: first region listing a
//!   country, continent, network or AS) and the drains a client falls in by its place;
//! - `cohort`: a staged rollout's second plan ([`Canary`]) and which of the two
//!   answers a client ([`Snapshot::route`]).
//!
//! A query does one atomic load of the snapshot, one geo lookup, one region lookup in
//! precomputed tables, and one weighted pick over at most a few CDNs (rendezvous
//! hashing of a key, [`crate::selection`]). Nothing here decides policy: the planner
//! (`control::decide::planner`) did that.

use std::sync::Arc;

use arc_swap::ArcSwap;
use hickory_server::zone_handler::Catalog;

use crate::place::geo::GeoDb;

mod cohort;
mod layout;
mod regions;
mod steering;

pub use cohort::{Canary, Cohort, CohortCounts, Counted, Route};
pub use layout::{wire_name, Choice, ChoiceSpec, NameSpec, Plan, Reason, Target};
pub use regions::{Decision, RegionIndex};
pub use steering::{Answer, Asker, Pick, Situation, Steered};

/// Everything a query needs, swapped as one piece so that no query ever sees a plan
/// from one configuration and zones from another.
pub struct Snapshot {
    /// Built for `geo`'s places ([`Plan::new`]).
    pub plan: Plan,
    pub geo: Arc<GeoDb>,
    pub zones: Arc<Catalog>,
    /// When (Unix seconds) the signatures served expire; `None`: nothing is signed.
    pub signed_until: Option<u64>,
    /// The signed zones' denials (NXDOMAIN with both NSEC proofs); `None`: nothing is
    /// signed.
    pub denials: Option<Arc<crate::zones::denial::Denials>>,
    /// A staged rollout's new version and the share of client networks it answers
    /// (`None`: no rollout, [`Snapshot::plan`] answers everyone).
    pub canary: Option<Canary>,
}

/// The live snapshot: the data plane loads it, the control plane stores a new one.
pub type Live = ArcSwap<Snapshot>;
