//! Control plane, performance steering during a staged policy rollout: the beacons of
//! each cohort (the clients the new version answers, the ones the version before it
//! answers) per (name, region), merged over the CDNs, so that a rollout halts when the
//! new version's clients measure worse than the old one's by more than the region's
//! `band_percent` (`controller/rollout.rs`). A client's cohort is its network's
//! (`plan::Snapshot::route`); its region is the version in force's.
//!
//! A cohort is held to the cells' rule (`cell.rs`): one source network may hold at
//! most [`NETWORK_SHARE_PERCENT`] % of a cohort's samples of a region (and at least
//! `ceil(min_samples × 5 %)`, so that a cohort can start), so that a few networks
//! posting beacons cannot halt a rollout by themselves. Memory: at most
//! [`MAX_NETWORKS`] networks per cohort and region, for regions whose policy has
//! `performance:` only, and all of it dropped when the rollout ends
//! ([`Cohorts::clear`]).

use std::collections::HashMap;

use super::cell::{Aggregate, Sample, NETWORK_SHARE_PERCENT};
use super::hist::Hist;

/// At most this many networks per cohort and region: a sample from another network
/// is refused.
const MAX_NETWORKS: usize = 10_000;

/// The cohorts' samples of one rollout (its new version).
#[derive(Debug, Default)]
pub(crate) struct Cohorts {
    version: Option<String>,
    /// Per (name, region index): (control, canary).
    by: HashMap<(String, usize), [Merged; 2]>,
}

/// One cohort's samples of one region, every CDN merged.
#[derive(Debug, Default)]
struct Merged {
    ttfb: Hist,
    throughput: Hist,
    ok: u64,
    failed: u64,
    samples: u64,
    /// Samples per source network.
    nets: HashMap<u64, u64>,
    /// Samples refused: over their network's share, or from one network too many.
    refused: u64,
}

impl Merged {
    /// Adds a sample of network `net` unless the network holds its share already
    /// (`start`: the share every network may hold however few samples there are).
    fn add(&mut self, net: u64, s: &Sample, start: u64) {
        let mine = self.nets.get(&net).copied();
        let share = (self.samples + 1) * NETWORK_SHARE_PERCENT / 100;
        if mine.unwrap_or(0) + 1 > start.max(share)
            || (mine.is_none() && self.nets.len() >= MAX_NETWORKS)
        {
            self.refused += 1;
            return;
        }
        *self.nets.entry(net).or_default() += 1;
        if let Some(t) = s.ttfb_ms {
            self.ttfb.add(t);
        }
        if let Some(t) = s.throughput_bps {
            self.throughput.add(t);
        }
        match s.ok {
            Some(true) => self.ok += 1,
            Some(false) => self.failed += 1,
            None => {}
        }
        self.samples += 1;
    }

    fn aggregate(&self) -> Aggregate {
        let outcomes = self.ok + self.failed;
        Aggregate {
            samples: self.samples,
            ttfb_samples: self.ttfb.count(),
            ttfb_p75_ms: self.ttfb.percentile(75),
            throughput_samples: self.throughput.count(),
            throughput_p25_bps: self.throughput.percentile(25),
            outcomes,
            success_rate: (outcomes > 0).then(|| self.ok as f64 / outcomes as f64),
            networks: self.nets.len() as u64,
        }
    }
}

/// One region's cohorts, merged.
pub(crate) struct CohortAggregates {
    pub name: String,
    pub region: usize,
    pub control: Aggregate,
    pub canary: Aggregate,
}

impl Cohorts {
    /// Adds `samples` of a client of `region` of `name` in network `net`, of the
    /// canary cohort (or the control) of the rollout of `version` (a new rollout
    /// starts over); `min_samples`: the region's, whose 5 % every network may hold.
    pub(crate) fn record(
        &mut self,
        version: &str,
        key: (String, usize),
        (canary, min_samples): (bool, u32),
        net: u64,
        samples: &[Sample],
    ) {
        if self.version.as_deref() != Some(version) {
            self.by.clear();
            self.version = Some(version.to_string());
        }
        let start = (u64::from(min_samples) * NETWORK_SHARE_PERCENT).div_ceil(100);
        let merged = &mut self.by.entry(key).or_default()[usize::from(canary)];
        for s in samples {
            merged.add(net, s, start);
        }
    }

    /// Drops every sample: the rollout ended.
    pub(crate) fn clear(&mut self) {
        self.by = HashMap::new();
        self.version = None;
    }

    /// The cohorts of every region of the rollout of `version` (none for another).
    pub(crate) fn aggregates(&self, version: &str) -> Vec<CohortAggregates> {
        if self.version.as_deref() != Some(version) {
            return Vec::new();
        }
        self.by
            .iter()
            .map(|((name, region), [control, canary])| CohortAggregates {
                name: name.clone(),
                region: *region,
                control: control.aggregate(),
                canary: canary.aggregate(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rollout_keeps_its_own_cohorts() {
        let mut c = Cohorts::default();
        let s = |ms| Sample {
            ttfb_ms: Some(ms),
            ..Sample::default()
        };
        let key = || ("www.example.com.".to_string(), 0);
        c.record("v1", key(), (true, 40), 1, &[s(400), s(420)]);
        c.record("v1", key(), (false, 40), 2, &[s(100)]);
        let a = c.aggregates("v1");
        assert_eq!(a.len(), 1);
        assert_eq!((a[0].canary.samples, a[0].control.samples), (2, 1));
        assert!(a[0].canary.ttfb_p75_ms > a[0].control.ttfb_p75_ms);
        assert!(c.aggregates("v2").is_empty());
        c.record("v2", key(), (true, 40), 1, &[s(400)]);
        assert_eq!(c.aggregates("v2")[0].control.samples, 0);
        c.clear();
        assert!(c.aggregates("v2").is_empty());
    }

    #[test]
    fn one_network_holds_at_most_its_share_of_a_cohort() {
        let mut c = Cohorts::default();
        let slow = Sample {
            ttfb_ms: Some(900),
            ..Sample::default()
        };
        let key = || ("www.example.com.".to_string(), 0);
        // min_samples 40: every network may hold 2 samples to start with.
        c.record("v1", key(), (true, 40), 7, &[slow; 50]);
        let a = &c.aggregates("v1")[0].canary;
        assert_eq!((a.samples, a.networks), (2, 1));
        // 100 networks of 2 samples each: then one network may hold 5 % of them.
        for net in 100..200 {
            c.record("v1", key(), (true, 40), net, &[slow; 2]);
        }
        // 202 samples: network 7 may grow from 2 to 10 (5 % of 210).
        c.record("v1", key(), (true, 40), 7, &[slow; 50]);
        let a = &c.aggregates("v1")[0].canary;
        assert_eq!(a.samples, 210, "{a:?}");
    }
}
