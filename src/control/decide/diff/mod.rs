//! Control plane, pure: what a policy edit changes (`steerdns diff OLD NEW`). Two
//! loaded policies (one zones, geo database and probes) are planned by the planner
//! `serve` runs, and every network of the geo database is asked about every steered
//! name through both plans, at one instant, with [`Steered::answer`](crate::plan::Steered::answer): the answer dig
//! would get. What comes out is a plain [`PolicyDiff`] (serialisable, printable), so
//! that a comparison with a running server's version can reuse it.
//!
//! ```text
//! OLD Loaded ─▶ drains settled ─▶ planner::snapshot_with ─▶ Plan ┐
//!                                                                ├─▶ each network of the
//! NEW Loaded ─▶ drains settled ─▶ planner::snapshot_with ─▶ Plan ┘   geo database, asked
//!     through one resolver with ECS /24 (IPv4) or /56 (IPv6): region and CNAME before and
//!     after ─▶ per name and region: CDN shares, address space whose answer changes
//! ```
//!
//! - Health is taken as good and no failover is in progress: the diff is of the
//!   policies, not of the moment. Drains written in the policy count at their last
//!   step (where the edit leads once its steps are done). Performance and commit
//!   modifiers are not applied: weights are the policy's.
//! - A network counts in the region its clients get before and in the one they get
//!   after (both, when the edit moves it). Networks the database places nowhere (no
//!   country, no continent: unallocated and private space) are left out.
//! - Address space is weighted per family (IPv4 and IPv6 apart): the share of a
//!   region's addresses whose answer (the CNAME) changes. A network's clients all get
//!   the same answer through one resolver ([`crate::selection::key`] cuts the client to
//!   the echoed scope, never narrower than the network), so the figure is exact for
//!   that resolver at that instant; another resolver draws its own keys and sees about
//!   the same share. For `selection: random` a network counts as changed when the
//!   weights it draws from change.
//! - Recorded traffic ([`Traffic`], the beacon samples a `serve` saved in its state
//!   directory, by source /24 or /48), when given, weighs the same networks a second
//!   time: each geo network by the samples of the source networks that start in it,
//!   instead of by its addresses. A network's samples count in the regions it counts
//!   in, wherever `serve` placed it when it recorded them; samples from networks the
//!   database places nowhere are left out. Only regions with a `performance:` block
//!   record samples, and a network holds at most a share of a window
//!   (`perf/cell.rs`): the figure weighs by measured clients, not by bytes.
//!
//! | room | holds |
//! |---|---|
//! | `model` | what a comparison holds, name by name and region by region ([`PolicyDiff`], [`NameDiff`], [`RegionDiff`], [`Moved`]), and its input [`Traffic`] |
//! | `compute` | the comparison: both policies planned with their drains settled, every network asked through both plans ([`diff`]), the settings that differ |
//! | `render` | the comparison as people read it (`Display`: `steerdns diff`'s output) |

mod compute;
mod model;
mod render;

pub use compute::diff;
pub use model::{
    Example, Moved, NameDiff, PolicyDiff, Presence, RegionDiff, Setting, Share, Side, Traffic,
    TrafficFrom,
};

/// The ECS source prefixes public resolvers send: how each network is asked about.
const SOURCE_V4: u8 = 24;
const SOURCE_V6: u8 = 56;
