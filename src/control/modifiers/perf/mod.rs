//! Control plane: performance steering, region weights that follow what viewers
//! measure, inside the bounds of a region's `performance:` block.
//!
//! ```text
//! POST /rum/{name} (beacons)  ─┐
//! steering polls' throughput   │
//! probe rounds (--vantage-     ├─▶ Samples: a Cell per (name, region, CDN), a sliding
//!   address: the prober's TTFB)┘          window of log-bucketed histograms (cell.rs)
//! controller, at each multiple of a region's shift period (wall clock):
//!   Samples aggregates (+ the set's) ─▶ modifier::target (band, penalty, floor)
//!   ─▶ modifier::slew ─▶ an Evaluation, put in force here (one node) or written for
//!   the set and put in force from etcd (`control/cluster/performance.rs`)
//!   ─▶ Perf::apply: the policy with the region's weights replaced
//!   ─▶ planner (health failover and drains apply after, and win) ─▶ Plan
//! ```
//!
//! This is the first **modifier** of the policy weights: [`Perf::apply`] takes the
//! policy and gives it back with weights changed; a later modifier takes the result of
//! this one. Weights change only here, in the control plane, once per shift period;
//! the query path picks from the plan's tables as before (consistent selection, so a
//! shift moves the fewest resolvers).
//!
//! Clients are located server-side: the region is the one the DNS answer would use
//! for the client's address (the connection's, or from `--trusted-proxies` the last
//! untrusted `X-Forwarded-For` address); their claims are never trusted.

pub(crate) mod beacon;
pub(crate) mod cell;
pub(crate) mod cohorts;
pub(crate) mod hist;
pub(crate) mod modifier;
pub(crate) mod page;
mod store;
pub(crate) use store::{network, network_prefix, NodeCells, RegionTraffic, Samples};
mod shifts;
pub(crate) use shifts::*;
