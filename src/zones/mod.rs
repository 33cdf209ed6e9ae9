//! Input: the zone files in `zones/` (RFC 1035 master files), served for every name that
//! is not steered: SOA and NS at the apex, glue, static records, NXDOMAIN and NODATA.
//!
//! hickory's parser does the reading; this module adds what an operator needs from a
//! loader: the line of a parse error (the parser reports none), and the checks hickory
//! leaves out (NS at the apex, owners inside the zone, a CNAME alone at its name, one
//! file per zone). `denial.rs`: the whole NXDOMAIN proof of a signed zone, which
//! hickory's handler gives only in part.

mod catalog;
pub(crate) mod denial;
pub use catalog::*;
