//! Control plane, the modifiers of the policy weights, in their one order ([`chain::Chain`]):
//! performance shifts, then commit biases; failover and drains apply after them.
//!
//! | room | holds |
//! |---|---|
//! | `chain` | `Chain`: the one order, used by `serve`, the set and `explain` |
//! | `perf` | performance steering: samples, cells, evaluations, shifts |
//! | `commit` | commit- and capacity-aware steering: the usage ledger, biases, the simulator |

pub(crate) mod chain;
pub mod commit;
pub(crate) mod perf;
