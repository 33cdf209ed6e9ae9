//! Control plane: commit- and capacity-aware steering, the second modifier of the
//! policy weights (after performance steering, before health failover and drains,
//! which always win).
//!
//! ```text
//! POST /v1/usage ─▶ Ledger: a record per (CDN, start), idempotent (ledger.rs)
//! every `commit.shift_period_seconds` of a name:
//!   Ledger::usage (month so far, recent rate, samples) ─▶ bias::bias per CDN
//!   (±max_bias_points, max_shift_points per period, dead band, burst budget, capacity)
//! Perf::apply(policy) ─▶ Commit::apply: bias::apply per region ─▶ planner
//! ```
//!
//! The same [`Commit`] (configure, record, evaluate, apply) drives the live server
//! and `steerdns simulate` (`simulate.rs`), which replays a month of five-minute
//! demand through it at full speed.
//!
//! | room | holds |
//! |---|---|
//! | `modifier` | `Commit`: configure, record, evaluate (`take_due`, `adopt`), `apply`, its view, saved state |
//! | `usage` | a usage record as it comes in (`UsageIn`) and its checks (`UsageError`) |
//! | `ledger` | the usage ledger: a record per (CDN, start), month to date, rate, projection |
//! | `bias` | a CDN's bias per evaluation, and a region's shares with the biases applied |
//! | `month` | calendar months in UTC and a month's burst allowance |
//! | `page` | the status page's "Commits and capacity" table |
//! | `demand`, `simulate` | `steerdns simulate`: demand files, the replay, the report |

pub(crate) mod bias;
pub mod demand;
pub(crate) mod ledger;
mod modifier;
pub mod month;
pub(crate) mod page;
pub mod simulate;
mod usage;
pub use modifier::*;
pub use usage::{UsageError, UsageIn};
