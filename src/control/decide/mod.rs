//! Control plane, the pure decisions: what is true now and what it does to the weights. No I/O, no task,
//! no clock (every call takes `now`); `scripts/check-layers.py` keeps `tokio::spawn`, sockets and files out of
//! this room.
//!
//! | room | holds |
//! |---|---|
//! | `health` | health per CDN: round verdicts by quorum, then hysteresis (`Tracker`) |
//! | `stepper` | one failover timeline as steps over time (`Stepper`) |
//! | `failover` | the failover state: health, steps and freezes (`FailoverState`) |
//! | `drains` | drains, from the policy and the API: rules, progress, reports |
//! | `state` | `ControlState`: failover and drains together, as the planner reads them |
//! | `planner` | `(policy, state) -> Plan`, the snapshot the data plane serves |
//! | `diff/` | what a policy edit changes: both policies planned, every network of the geo database asked (`PolicyDiff`, `steerdns diff`) |
//! | `keys` | typed keys: (name, CDN), (name, region), (CDN, day) |
//! | `times` | times that enter from outside, bounded, and how they are shown |

pub mod diff;
pub(crate) mod drains;
pub(crate) mod failover;
pub(crate) mod health;
pub mod keys;
pub mod planner;
pub(crate) mod state;
pub(crate) mod stepper;
pub mod times;
