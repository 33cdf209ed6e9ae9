//! Control plane: the planner, `(Policy, failover state) -> Plan`, a pure function.
//!
//! It resolves everything a query would otherwise compute: per steered name the region
//! lookup tables, and per region the cumulative weight table of the CDNs that may serve
//! it *now*, with their CNAME targets, the TTL and the reason. A CDN with `r` percent of
//! its weight removed keeps `w × (100 − r)`; the others keep their proportions. A region
//! whose every CDN would be removed fails open to its configured weights.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::{HostPolicy, Policy};
use crate::plan::{Choice, Plan, Reason, RegionIndex, Steered, Target};

/// Percent of weight removed, by (steered name, CDN name); absent = 0.
pub type Removed = BTreeMap<(String, String), u8>;

/// A plan and what it had to do to stay up.
pub struct Planned {
    pub plan: Plan,
    /// (steered name, region) pairs answering with configured weights because every
    /// CDN of the region is out.
    pub fail_open: Vec<(String, String)>,
}

/// Builds the plan for a validated policy and the current failover state.
pub fn plan(policy: &Policy, removed: &Removed) -> Planned {
    let mut fail_open = Vec::new();
    let names = policy
        .hosts
        .iter()
        .map(|h| steered(h, removed, &mut fail_open))
        .collect();
    Planned {
        plan: Plan::new(names),
        fail_open,
    }
}

/// Percent removed for one CDN of one host.
pub fn removed_of(removed: &Removed, host: &HostPolicy, cdn: &str) -> u8 {
    removed
        .get(&(host.name.to_string(), cdn.to_string()))
        .copied()
        .unwrap_or(0)
        .min(100)
}

fn steered(host: &HostPolicy, removed: &Removed, fail_open: &mut Vec<(String, String)>) -> Steered {
    let cdn_names: Vec<Arc<str>> = host
        .cdns
        .iter()
        .map(|c| Arc::from(c.name.as_str()))
        .collect();
    let cut: Vec<u8> = host
        .cdns
        .iter()
        .map(|c| removed_of(removed, host, &c.name))
        .collect();
    // While any CDN of the name is off its weight, answers may be cached less long.
    let ttl = if cut.iter().any(|&r| r > 0) {
        host.incident_ttl.unwrap_or(host.ttl)
    } else {
        host.ttl
    };
    let regions = RegionIndex::new(host.regions.iter().map(|r| r.matches.as_slice()));
    let choices = host
        .regions
        .iter()
        .map(|region| {
            let serving = |i: usize| region.weights[i] > 0;
            let all_out = (0..host.cdns.len())
                .filter(|&i| serving(i))
                .all(|i| cut[i] >= 100);
            let any_cut = (0..host.cdns.len()).any(|i| serving(i) && cut[i] > 0);
            let reason = if all_out {
                fail_open.push((host.name.to_string(), region.name.clone()));
                Reason::FailOpen
            } else if any_cut {
                Reason::Failover
            } else {
                Reason::Normal
            };
            let weighted = host
                .cdns
                .iter()
                .enumerate()
                .map(|(i, cdn)| {
                    let keep = if reason == Reason::FailOpen {
                        100
                    } else {
                        100 - u64::from(cut[i])
                    };
                    let target = Target {
                        cdn: cdn_names[i].clone(),
                        cname: cdn.cname.clone(),
                    };
                    (target, u64::from(region.weights[i]) * keep)
                })
                .collect();
            // Validation refused regions whose weights are all zero, and fail-open
            // restores the configured ones, so some weight is always positive.
            Choice::new(Arc::from(region.name.as_str()), ttl, reason, weighted)
                .expect("validated region has a positive weight")
        })
        .collect();
    Steered::new(host.name.clone(), regions, choices)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const POLICY: &str = "\
hostname: www.example.com
ttl: 30
incident_ttl: 10
cdns:
  a: { cname: a.example.net. }
  b: { cname: b.example.net. }
regions:
  - match: [GB]
    weights: { a: 90, b: 10 }
  - match: [JP]
    weights: { a: 100 }
  - match: [\"*\"]
    weights: { a: 50, b: 50 }
";

    fn policy() -> Policy {
        config_parse(POLICY)
    }

    fn config_parse(text: &str) -> Policy {
        crate::config::parse(Path::new("t.yaml"), text.to_string())
            .unwrap()
            .0
    }

    fn weights(p: &Planned, region: usize) -> (Vec<(String, u64)>, Reason, u32) {
        let s = p.plan.names().next().unwrap();
        let c = s.choice(region);
        (
            c.weights().map(|(t, w)| (t.cdn.to_string(), w)).collect(),
            c.reason,
            c.ttl,
        )
    }

    fn cut(pct: u8) -> Removed {
        [(("www.example.com.".to_string(), "a".to_string()), pct)]
            .into_iter()
            .collect()
    }

    #[test]
    fn normal_weights_and_ttl() {
        let p = plan(&policy(), &Removed::new());
        assert_eq!(
            weights(&p, 0),
            (
                vec![("a".into(), 9000), ("b".into(), 1000)],
                Reason::Normal,
                30
            )
        );
        assert!(p.fail_open.is_empty());
    }

    #[test]
    fn a_removed_share_moves_to_the_others_and_shortens_the_ttl() {
        let p = plan(&policy(), &cut(50));
        assert_eq!(
            weights(&p, 0),
            (
                vec![("a".into(), 4500), ("b".into(), 1000)],
                Reason::Failover,
                10
            )
        );
        let p = plan(&policy(), &cut(100));
        assert_eq!(
            weights(&p, 0),
            (vec![("b".into(), 1000)], Reason::Failover, 10)
        );
        assert_eq!(weights(&p, 2).0, vec![("b".into(), 5000)]);
    }

    #[test]
    fn a_region_with_nobody_left_fails_open() {
        let p = plan(&policy(), &cut(100));
        assert_eq!(
            weights(&p, 1),
            (vec![("a".into(), 10000)], Reason::FailOpen, 10)
        );
        assert_eq!(
            p.fail_open,
            vec![("www.example.com.".to_string(), "JP".to_string())]
        );
        // Half removed still serves from a: no fail-open.
        assert_eq!(weights(&plan(&policy(), &cut(50)), 1).1, Reason::Failover);
    }
}
