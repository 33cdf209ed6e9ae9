//! Control plane: drains, the operator's way to take a CDN out of service: from
//! `drain:` in the policy, or as runtime overrides over the admin API. Both become the
//! same `DrainRule`, resolved against the current policy at every plan (a region named
//! in `where:` is found by name, so a reload that reorders regions keeps the drain).
//!
//! A drain moves traffic in the failover steps (the controller runs a stepper per
//! drain), or at once with `immediate`; it ends by itself at `until`.

mod report;
mod rule;
pub(crate) use crate::config::empties_a_region;
pub(crate) use report::{DrainState, DrainStatus};
pub(crate) use rule::{DrainError, DrainKey, DrainRule, DEFAULT_OVERRIDE_TTL};
mod progress;
pub(crate) use progress::*;
