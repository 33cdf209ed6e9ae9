//! Input: the policy file, `steering.yaml`.
//!
//! Two layers, as in hickory's and pingora's configs: a serde model that mirrors the file
//! exactly (`deny_unknown_fields`, so a typo is an error and not a silently ignored key),
//! and `validate`, which turns it into a `Policy` whose names, CDNs and regions are
//! resolved and checked, collecting every problem with its file, line and field.
//!
//! ```yaml
//! hostname: www.example.com          # or `hostnames:` mapping each name to the keys below
//! ttl: 30
//! incident_ttl: 10
//! selection: consistent              # or random
//! cdns:
//!   fastly:     { cname: example.map.fastly.net. }
//! regions:
//!   - match: [GB, "continent:EU", 81.2.69.0/24, "*"]
//!     weights: { fastly: 90, cloudflare: 10 }
//! failover: { steps: [50, 100], step_interval_seconds: 90 }
//! drain: [{ cdn: fastly, where: [GB], reason: "...", until: 2026-12-01T12:00:00Z }]
//! content_steering: { pathways: { fastly: cdn-a }, ttl: 15, throughput_floor_bps: 800000 }
//! ```
//!
//! Under `hostnames:`, an entry may also carry `tenant: acme` (the customer it belongs to).

pub mod contract;
pub(crate) mod dnssec;
mod locate;
pub(crate) mod perf;
pub mod probes;
pub(crate) mod tokens;
mod validate;
pub use crate::place::Match;
pub use locate::{line_of, render, Seg};
pub use validate::{check_against_zones, empties_a_region};
mod policy;
pub use policy::*;
