//! Where a client is: the layer every other one may use, and that uses none of them.
//!
//! - [`countries`]: ISO 3166 countries and the continent of each;
//! - [`geo`]: the geo database, an address to a [`geo::Place`] (country, continent, the
//!   network that holds it, and the origin AS when an ASN database is attached);
//! - [`asn`]: the AS-number database (`--asn-db`);
//! - [`flat`]: networks as flat sorted tables, the form both databases are looked up in;
//! - [`wider`]: the places around each network, for the widest correct ECS scope;
//! - [`mmdb`]: a database file read, opened and walked at load, and [`mmdb::GeoError`],
//!   for both databases;
//! - [`tree`]: the bound on a database walk, checked before it;
//! - [`Match`]: one entry of a policy's `match:` or `where:` list, and whether a client
//!   falls in it: [`Match::covers`] for an address (what `explain` reads) and
//!   [`Match::covers_place`] for a place alone (what the plan's region tables are built
//!   from, `plan/regions.rs`); the query path does not call either, it reads the tables
//!   the planner built from them.

pub mod asn;
pub mod countries;
mod flat;
pub(crate) mod geo;
pub(crate) mod mmdb;
pub(crate) mod tree;
pub(crate) mod wider;

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use countries::{Continent, Country};
use geo::Place;

/// One entry of a region's `match:` list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Match {
    /// `"*"`: every client.
    Any,
    /// `GB`.
    Country(Country),
    /// `continent:EU`.
    Continent(Continent),
    /// `81.2.69.0/24`, `2001:db8::/32` (a bare address is a /32 or /128).
    Net(IpNet),
    /// `AS13335`: the client's origin AS, from the ASN database (`--asn-db`).
    Asn(u32),
}

impl Match {
    /// Parses one entry; `Err` says what was expected.
    pub fn parse(s: &str) -> Result<Match, String> {
        let s = s.trim();
        if s == "*" {
            return Ok(Match::Any);
        }
        if let Some(code) = s.strip_prefix("continent:") {
            return Continent::from_code(code)
                .map(Match::Continent)
                .ok_or_else(|| {
                    format!("unknown continent `{code}` (one of AF AN AS EU NA OC SA)")
                });
        }
        // Bytes, not `&s[..2]`: a multi-byte character across byte 2 would panic (found
        // by the `policy` fuzz target with `+՟::1/128`).
        let b = s.as_bytes();
        if b.len() > 2
            && b[..2].eq_ignore_ascii_case(b"AS")
            && b[2..].iter().all(|c| c.is_ascii_digit())
        {
            return s[2..]
                .parse()
                .map(Match::Asn)
                .map_err(|_| format!("`{s}`: AS numbers go up to 4294967295"));
        }
        if s.contains('/') {
            let net: IpNet = s.parse().map_err(|_| {
                format!("`{s}` is not a CIDR block (e.g. 81.2.69.0/24 or 2001:db8::/32)")
            })?;
            if net.network() != net.addr() {
                return Err(format!(
                    "`{s}` has host bits set past the prefix (did you mean {}?)",
                    net.trunc()
                ));
            }
            return Ok(Match::Net(net));
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(Match::Net(IpNet::from(ip)));
        }
        if s.len() == 2 {
            return Country::parse(s).map(Match::Country).ok_or_else(|| {
                let hint = if s.eq_ignore_ascii_case("UK") {
                    " (the United Kingdom is GB)"
                } else {
                    ""
                };
                format!("`{s}` is not an ISO 3166 country code{hint}")
            });
        }
        Err(format!(
            "`{s}` is not a country (GB), a continent (continent:EU), a CIDR block (81.2.69.0/24) or \"*\""
        ))
    }
}

impl fmt::Display for Match {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Match::Any => f.write_str("*"),
            Match::Country(c) => write!(f, "{c}"),
            Match::Continent(c) => write!(f, "continent:{}", c.code()),
            Match::Net(n) => write!(f, "{n}"),
            Match::Asn(a) => write!(f, "AS{a}"),
        }
    }
}

impl Match {
    /// Whether a client at `ip`, located at `place`, falls in this entry.
    ///
    /// # Hot path
    /// A comparison or a prefix test; no allocation.
    pub fn covers(&self, ip: IpAddr, place: &Place) -> bool {
        match *self {
            Match::Any => true,
            Match::Country(c) => place.country == Some(c),
            Match::Continent(c) => place.continent == Some(c),
            Match::Net(n) => n.contains(&ip),
            Match::Asn(a) => place.origin.asn == Some(a),
        }
    }

    /// Whether every client located at `place` falls in this entry by its place
    /// (false for CIDR blocks, which depend on the address).
    pub fn covers_place(&self, place: &Place) -> bool {
        match *self {
            Match::Any => true,
            Match::Country(c) => place.country == Some(c),
            Match::Continent(c) => place.continent == Some(c),
            // By address: narrowed to the network they hold.
            Match::Net(_) | Match::Asn(_) => false,
        }
    }
}
