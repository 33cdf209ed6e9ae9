//! Input: DNSSEC. Zone keys are files ([`keys`]); signing happens off the query path,
//! when the inputs are loaded and whenever a signature window ends ([`sign`]):
//!
//! - each signed zone becomes a signed copy (DNSKEY set, NSEC chain listing every
//!   steered name, an RRSIG over each RRset) that hickory's Catalog serves, NSEC
//!   denials included;
//! - each (steered name, CNAME target) gets its RRSIG, with the original TTL the
//!   largest TTL the name answers with; the planner puts those bytes in the plan
//!   (`Plan::set_rrsigs`) and the data plane copies them into answers to DO=1 queries.
//!
//! A zone is signed when the `dnssec:` block of the policy is present and the key
//! directory holds a key for it.

pub mod keys;
pub(crate) mod rollover;
pub(crate) mod sign;
mod signing;
pub use signing::*;
