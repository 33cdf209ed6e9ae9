//! Input, for the data plane: the signed NXDOMAIN of a signed zone, built off the query
//! path when the zone is signed (`crate::dnssec`).
//!
//! A name that does not exist is denied with two NSEC records (RFC 4035 §3.1.3.2): one
//! covering the name, one covering the wildcard at its closest encloser (the nearest
//! ancestor that exists), so that no wildcard could have answered it. hickory's zone
//! handler gives the first only when the name is two or more labels below its closest
//! encloser (`a.b.example.com` with no `b`), and a validator then fails the answer.
//! This module keeps each signed zone's NSEC records (with their RRSIGs), its SOA and
//! its names, and builds the whole denial; the full path answers a DO=1 query for a
//! missing name with it instead of asking the zone handler.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hickory_proto::rr::{LowerName, Name, Record, RecordSet, RecordType, RrKey};

/// The denial data of every signed zone.
#[derive(Debug, Default)]
pub struct Denials {
    zones: Vec<ZoneDenials>,
}

#[derive(Debug)]
struct ZoneDenials {
    origin: LowerName,
    /// The NSEC sets by owner, in canonical order (the chain's order).
    nsecs: BTreeMap<LowerName, Arc<RecordSet>>,
    soa: Arc<RecordSet>,
    /// Every name that exists: owners, and the empty non-terminals above them.
    names: BTreeSet<LowerName>,
    /// Delegation points below the apex: what lies under one is the child's.
    cuts: BTreeSet<LowerName>,
}

impl Denials {
    /// Adds the signed zone `origin` (its records as signed by `sign::sign_zone`).
    pub fn add(&mut self, origin: &Name, records: &BTreeMap<RrKey, Arc<RecordSet>>) {
        let apex = LowerName::new(origin);
        let Some(soa) = records.get(&RrKey::new(apex.clone(), RecordType::SOA)) else {
            return;
        };
        let mut names = BTreeSet::new();
        let mut nsecs = BTreeMap::new();
        let mut cuts = BTreeSet::new();
        for (key, set) in records {
            let mut n = key.name.clone();
            while n.num_labels() >= apex.num_labels() && names.insert(n.clone()) {
                n = n.base_name();
            }
            match key.record_type {
                RecordType::NSEC => {
                    nsecs.insert(key.name.clone(), set.clone());
                }
                RecordType::NS if key.name != apex => {
                    cuts.insert(key.name.clone());
                }
                _ => {}
            }
        }
        // Steered names are in the chain (typed CNAME) but not among the records.
        names.extend(nsecs.keys().cloned());
        self.zones.push(ZoneDenials {
            origin: apex,
            nsecs,
            soa: soa.clone(),
            names,
            cuts,
        });
    }

    /// The authority section of a signed NXDOMAIN for `name`: the SOA and the NSEC
    /// records covering the name and the wildcard at its closest encloser, each with
    /// its RRSIGs. `None` when the name exists (or is an empty non-terminal), lies at
    /// or under a delegation, is in no signed zone, or the zone has a wildcard there
    /// (the zone handler answers those).
    pub fn nxdomain(&self, name: &Name) -> Option<Vec<Record>> {
        let name = LowerName::new(name);
        let z = self
            .zones
            .iter()
            .filter(|z| z.origin.zone_of(&name))
            .max_by_key(|z| z.origin.num_labels())?;
        if z.names.contains(&name) {
            return None;
        }
        let mut up = name.base_name();
        let encloser = loop {
            if z.cuts.contains(&up) {
                return None;
            }
            if z.names.contains(&up) {
                break up;
            }
            if up.num_labels() <= z.origin.num_labels() {
                return None;
            }
            up = up.base_name();
        };
        let wildcard = LowerName::new(&Name::from(&encloser).prepend_label("*").ok()?);
        if z.names.contains(&wildcard) {
            return None;
        }
        let covering = |n: &LowerName| {
            z.nsecs
                .range(..n.clone())
                .next_back()
                .or_else(|| z.nsecs.iter().next_back())
                .map(|(_, set)| set.clone())
        };
        let first = covering(&name)?;
        let second = covering(&wildcard)?;
        // The SOA as a negative answer carries it: its TTL no more than its minimum
        // (RFC 2308 §3), the RRSIGs alike (an RRSIG's original TTL allows less).
        let negative = z
            .soa
            .records_without_rrsigs()
            .find_map(|r| match &r.data {
                hickory_proto::rr::RData::SOA(soa) => Some(soa.minimum),
                _ => None,
            })
            .map_or(z.soa.ttl(), |m| m.min(z.soa.ttl()));
        let mut out: Vec<Record> = z
            .soa
            .records_with_rrsigs()
            .map(|r| {
                let mut r = r.clone();
                r.ttl = negative;
                r
            })
            .collect();
        out.extend(first.records_with_rrsigs().cloned());
        if second.name() != first.name() {
            out.extend(second.records_with_rrsigs().cloned());
        }
        Some(out)
    }
}
