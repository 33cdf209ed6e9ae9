//! Control plane: the planner, `Policy -> Plan`, a pure function.
//!
//! It resolves everything a query would otherwise compute: per steered name the region
//! lookup tables, and per region the cumulative weight table of the CDNs that may serve
//! it, with their CNAME targets and the TTL.

use std::sync::Arc;

use crate::config::{HostPolicy, Policy};
use crate::plan::{Choice, Plan, RegionIndex, Steered, Target};

/// Builds the plan for a validated policy.
pub fn plan(policy: &Policy) -> Plan {
    Plan::new(policy.hosts.iter().map(steered).collect())
}

fn steered(host: &HostPolicy) -> Steered {
    let cdn_names: Vec<Arc<str>> = host
        .cdns
        .iter()
        .map(|c| Arc::from(c.name.as_str()))
        .collect();
    let regions = RegionIndex::new(host.regions.iter().map(|r| r.matches.as_slice()));
    let choices = host
        .regions
        .iter()
        .map(|region| {
            let weighted = host
                .cdns
                .iter()
                .zip(&region.weights)
                .enumerate()
                .map(|(i, (cdn, &w))| {
                    let target = Target {
                        cdn: cdn_names[i].clone(),
                        cname: cdn.cname.clone(),
                    };
                    (target, w)
                })
                .collect();
            // Validation refused regions whose weights are all zero.
            Choice::new(Arc::from(region.name.as_str()), host.ttl, weighted)
                .expect("validated region has a positive weight")
        })
        .collect();
    Steered::new(host.name.clone(), regions, choices)
}
