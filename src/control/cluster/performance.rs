//! Control plane: the performance modifier in a set (`serve --etcd`). Each node's
//! samples and the shifts in force go through etcd, so that beacons posted to any
//! node count for every node, and every node serves the same shares.
//!
//! - `perf/{node}/{name}/{region}` ([`SharedCells`]): the buckets of one node's window
//!   of one (name, region index), bucket counts and not samples, written by that
//!   node ([`CellsPublisher`]) each bucket width in which it took samples, under a
//!   lease of the window (and 2 s): what a node no longer writes ages out with its
//!   window. Each bucket carries at most [`SHARED_NETS`] of its source networks (the
//!   lowest numbers, the same ones whichever node merges them), so a value stays far
//!   below etcd's limit; the distinct networks of a set are counted from those.
//!   Only the members' (`--members`) count.
//! - `shift/{name}/{region}` ([`SharedShift`]): the set's latest evaluation of a
//!   region. As for the commit biases (`usage.rs`), evaluations fall on multiples of
//!   the period; at each, every connected node measures (its own cells and the other
//!   nodes' from etcd), computes the shares from those in force, and writes them
//!   unless the set already has that evaluation (the first node wins); every node puts
//!   in force what the key says when the watch brings it. An evaluation more than a
//!   period (and a minute) ahead of a node's clock is not taken and is written over.
//! - Failing static, a node evaluates nothing and holds the shares in force.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::clock::now_ms;
use crate::control::decide::times;
use crate::control::modifiers::perf::cell::{Bucket, SLOTS};
use crate::control::modifiers::perf::hist::{Hist, BUCKETS};
use crate::control::modifiers::perf::modifier::PerfReason;
use crate::control::modifiers::perf::{Evaluation, NodeCells, Perf, Samples};
use crate::metrics::Metrics;

use super::etcd::MAX_VALUE;
use super::node::ClusterLink;
use super::refused::Refused;
use super::{sane_name, EtcdError, Key, Store};

/// Most source networks a node shares per bucket (fewer when the value would not fit).
pub(crate) const SHARED_NETS: usize = 64;
/// Most CDNs in one region's cells or shift; longest region name.
const MAX_CDNS: usize = 64;
const MAX_REGION_NAME: usize = 2048;
/// Highest region index in a key.
const MAX_REGION: usize = 4096;

/// One bucket of one CDN, as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SharedBucket {
    /// Unix ms / the bucket width.
    pub slot: u64,
    pub ttfb: Hist,
    pub throughput: Hist,
    pub ok: u32,
    pub failed: u32,
    pub samples: u32,
    /// Source networks (/24, /48 as numbers), ascending: at most [`SHARED_NETS`].
    pub nets: Vec<u64>,
}

/// One node's buckets of one (name, region), as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SharedCells {
    /// The region's name (index and name must both match to count).
    pub region: String,
    /// The window in ms (buckets of another window do not add).
    pub window_ms: u64,
    /// By CDN name: the buckets of the window.
    pub cdns: BTreeMap<String, Vec<SharedBucket>>,
}

/// One CDN of an evaluation, as stored.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShiftedCdn {
    pub share: f64,
    pub target: f64,
    pub reason: PerfReason,
}

/// The set's latest evaluation of one region, as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedShift {
    /// A multiple of the region's period (Unix ms).
    #[serde(deserialize_with = "times::bounded")]
    pub at_unix_ms: u64,
    /// The node that made it.
    pub node: String,
    pub region: String,
    /// The region's policy weights it was made from (a node with others does not
    /// take it).
    pub policy: Vec<u32>,
    /// In the policy's order of CDNs.
    pub cdns: Vec<(String, ShiftedCdn)>,
}

/// Key of one node's cells of one region.
pub(crate) fn cells_key(prefix: &str, node: &str, name: &str, region: usize) -> String {
    Key::Perf {
        node: node.to_string(),
        name: name.to_string(),
        region,
    }
    .under(prefix)
}

/// Key of a region's shift.
pub(crate) fn shift_key(prefix: &str, name: &str, region: usize) -> String {
    Key::Shift {
        name: name.to_string(),
        region,
    }
    .under(prefix)
}

/// The region index of a key, if it is one.
pub(crate) fn region_index(r: usize) -> Result<usize, Refused> {
    (r < MAX_REGION).then_some(r).ok_or(Refused::RegionIndex {
        region: r,
        max: MAX_REGION,
    })
}

impl SharedBucket {
    fn of(b: &Bucket, nets: usize) -> SharedBucket {
        let mut n: Vec<u64> = b.nets.keys().copied().collect();
        n.sort_unstable();
        n.truncate(nets);
        SharedBucket {
            slot: b.slot,
            ttfb: b.ttfb.clone(),
            throughput: b.throughput.clone(),
            ok: b.ok,
            failed: b.failed,
            samples: b.samples,
            nets: n,
        }
    }

    fn check(&self) -> Result<(), Refused> {
        let samples = u64::from(self.samples);
        if self.slot > times::MAX_TIME_MS {
            return Err(Refused::SlotLate(self.slot));
        }
        if u64::from(self.ok) + u64::from(self.failed) > samples {
            return Err(Refused::Outcomes);
        }
        if self.nets.len() > 4 * SHARED_NETS || self.nets.len() as u64 > samples {
            return Err(Refused::Networks {
                nets: self.nets.len(),
                samples,
                max: 4 * SHARED_NETS,
            });
        }
        if self.nets.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Refused::NetworkOrder);
        }
        for h in [&self.ttfb, &self.throughput] {
            if h.count() > samples {
                return Err(Refused::HistogramSamples);
            }
            let ordered = h.0.windows(2).all(|w| w[0].0 < w[1].0);
            if !ordered
                || h.0
                    .iter()
                    .any(|&(i, n)| usize::from(i) >= BUCKETS || n == 0)
            {
                return Err(Refused::HistogramBuckets);
            }
        }
        Ok(())
    }

    fn bucket(&self) -> Bucket {
        Bucket {
            slot: self.slot,
            ttfb: self.ttfb.clone(),
            throughput: self.throughput.clone(),
            ok: self.ok,
            failed: self.failed,
            samples: self.samples,
            // Only which networks: the counts per network are the writer's business.
            nets: self.nets.iter().map(|&n| (n, 1)).collect(),
        }
    }
}

impl SharedCells {
    /// Checked, as the cells of `node` for region `region` of `name`; `Err` says why
    /// they do not count.
    pub(crate) fn check(
        &self,
        node: &str,
        name: &str,
        region: usize,
    ) -> Result<NodeCells, Refused> {
        if self.region.is_empty() || self.region.len() > MAX_REGION_NAME {
            return Err(Refused::RegionName);
        }
        if !(100..=86_400_000).contains(&self.window_ms) {
            return Err(Refused::Window(self.window_ms));
        }
        if self.cdns.len() > MAX_CDNS {
            return Err(Refused::Cdns(MAX_CDNS));
        }
        let mut cdns = BTreeMap::new();
        for (cdn, buckets) in &self.cdns {
            if !sane_name(cdn) {
                return Err(Refused::Cdn);
            }
            if buckets.len() > SLOTS as usize {
                return Err(Refused::Buckets {
                    cdn: cdn.clone(),
                    max: SLOTS,
                });
            }
            let mut slots: Vec<u64> = buckets.iter().map(|b| b.slot).collect();
            slots.sort_unstable();
            if slots.windows(2).any(|w| w[0] == w[1]) {
                return Err(Refused::SlotTwice(cdn.clone()));
            }
            for b in buckets {
                b.check().map_err(|why| Refused::Bucket {
                    cdn: cdn.clone(),
                    why: Box::new(why),
                })?;
            }
            cdns.insert(
                cdn.clone(),
                buckets.iter().map(SharedBucket::bucket).collect(),
            );
        }
        Ok(NodeCells {
            node: node.to_string(),
            name: name.to_string(),
            region,
            region_name: self.region.clone(),
            window_ms: self.window_ms,
            cdns,
        })
    }

    /// As stored, each bucket with at most `nets` networks.
    fn of(c: &NodeCells, nets: usize) -> SharedCells {
        SharedCells {
            region: c.region_name.clone(),
            window_ms: c.window_ms,
            cdns: c
                .cdns
                .iter()
                .map(|(cdn, bs)| {
                    (
                        cdn.clone(),
                        bs.iter().map(|b| SharedBucket::of(b, nets)).collect(),
                    )
                })
                .collect(),
        }
    }

    /// The value written for `c`: with [`SHARED_NETS`] networks per bucket, fewer if
    /// it would not fit an etcd value; `None` if even none fit.
    pub(crate) fn encode(c: &NodeCells) -> Option<Vec<u8>> {
        [SHARED_NETS, SHARED_NETS / 4, 0]
            .into_iter()
            .find_map(|nets| {
                let v = serde_json::to_vec(&SharedCells::of(c, nets)).ok()?;
                (v.len() <= MAX_VALUE).then_some(v)
            })
    }
}

impl SharedShift {
    /// Whether the shift read counts: `Err` says why not.
    pub fn check(&self) -> Result<(), Refused> {
        if !sane_name(&self.node) {
            return Err(Refused::Node);
        }
        if self.region.is_empty() || self.region.len() > MAX_REGION_NAME {
            return Err(Refused::RegionName);
        }
        if self.cdns.len() > MAX_CDNS || self.policy.len() > MAX_CDNS {
            return Err(Refused::Cdns(MAX_CDNS));
        }
        for (cdn, c) in &self.cdns {
            if !sane_name(cdn) {
                return Err(Refused::Cdn);
            }
            for v in [c.share, c.target] {
                if !(v.is_finite() && (0.0..=100.0).contains(&v)) {
                    return Err(Refused::Share {
                        cdn: cdn.clone(),
                        share: v,
                    });
                }
            }
        }
        Ok(())
    }

    /// As an evaluation of region `region` of `name`.
    pub fn evaluation(&self, name: &str, region: usize) -> Evaluation {
        Evaluation {
            name: name.to_string(),
            region,
            region_name: self.region.clone(),
            at_ms: self.at_unix_ms,
            policy: self.policy.clone(),
            cdns: self
                .cdns
                .iter()
                .map(|(cdn, c)| (cdn.clone(), c.share, c.target, c.reason))
                .collect(),
        }
    }

    fn of(e: &Evaluation, node: &str) -> SharedShift {
        SharedShift {
            at_unix_ms: e.at_ms,
            node: node.to_string(),
            region: e.region_name.clone(),
            policy: e.policy.clone(),
            cdns: e
                .cdns
                .iter()
                .map(|(cdn, share, target, reason)| {
                    let c = ShiftedCdn {
                        share: *share,
                        target: *target,
                        reason: *reason,
                    };
                    (cdn.clone(), c)
                })
                .collect(),
        }
    }
}

impl ClusterLink {
    /// Hands `perf` the other nodes' cells, and puts in force every evaluation of the
    /// set that it takes now ([`Perf::takes`]). True when weights changed.
    pub(crate) fn follow_perf(&mut self, perf: &mut Perf, now_ms: u64, metrics: &Metrics) -> bool {
        let Some(view) = self.latest().map(|s| s.view.clone()) else {
            return false;
        };
        let own = self.node.clone();
        perf.set_remote(
            view.perf_cells
                .iter()
                .filter(|((node, _, _), _)| *node != own)
                .map(|(_, c)| c.clone())
                .collect(),
        );
        let mut changed = false;
        for ((name, region), (s, _)) in view.shifts.iter() {
            if !perf.takes(name, *region, s.at_unix_ms, now_ms) {
                continue;
            }
            match perf.adopt(&s.evaluation(name, *region), Some(&s.node)) {
                Ok(c) => changed |= c,
                Err(why) => {
                    let why = format!("region {region}, by {} at {}: {why}", s.node, s.at_unix_ms);
                    self.refuse_evaluation("performance shift", name, &why, metrics);
                }
            }
        }
        changed
    }

    /// The evaluations due now, each written for the set unless the set already has
    /// it (or a later one), or etcd is unreachable (failing static: the shares in
    /// force hold). Nothing is put in force here: every node takes the set's from the
    /// watch.
    pub(crate) fn propose_perf(&mut self, perf: &mut Perf, now_ms: u64) {
        let due = perf.take_due(now_ms);
        if !self.connected() {
            return;
        }
        let Some(shared) = self.latest() else { return };
        for e in due {
            let seen = shared.view.shifts.get(&(e.name.clone(), e.region));
            let ahead =
                seen.is_some_and(|(s, _)| perf.ahead(&e.name, e.region, s.at_unix_ms, now_ms));
            if seen.is_some_and(|(s, _)| s.at_unix_ms >= e.at_ms) && !ahead {
                continue;
            }
            if let (true, Some((s, _))) = (ahead, seen) {
                warn!(name = %e.name, region = e.region, at_unix_ms = s.at_unix_ms, node = %s.node, "the set's performance shift is from a clock more than a period ahead: not taken, written over");
            }
            let key = shift_key(&self.prefix, &e.name, e.region);
            let value = serde_json::to_vec(&SharedShift::of(&e, &self.node)).unwrap_or_default();
            let rev = seen.map(|(_, r)| *r);
            super::write_evaluation(&self.store, key, value, rev, "performance shift");
        }
    }
}

/// This node's cells, written to etcd each bucket width in which they took samples.
pub(crate) struct CellsPublisher {
    pub store: Store,
    pub prefix: String,
    pub node: String,
    pub samples: Arc<Samples>,
}

impl CellsPublisher {
    pub(crate) fn spawn(self, stop: CancellationToken) {
        tokio::spawn(async move {
            // The samples accepted when each region was last written.
            let mut written: BTreeMap<(String, usize), u64> = BTreeMap::new();
            let mut failing = false;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(self.samples.share_every()) => {}
                }
                let changed = self.samples.changed(&written, now_ms());
                if changed.is_empty() {
                    continue;
                }
                match self.publish(&changed).await {
                    Ok(()) => {
                        if failing {
                            info!(node = %self.node, "etcd: performance samples shared again");
                            failing = false;
                        }
                        for (c, accepted) in changed {
                            written.insert((c.name, c.region), accepted);
                        }
                    }
                    Err(e) => {
                        if !failing {
                            warn!(node = %self.node, error = %e, "etcd: cannot share this node's performance samples");
                            failing = true;
                        }
                    }
                }
            }
        });
    }

    async fn publish(&self, changed: &[(NodeCells, u64)]) -> Result<(), EtcdError> {
        let longest = changed.iter().map(|(c, _)| c.window_ms).max().unwrap_or(0);
        let lease = self
            .store
            .grant(Duration::from_millis(longest + 2000))
            .await?;
        for (c, _) in changed {
            let key = cells_key(&self.prefix, &self.node, &c.name, c.region);
            match SharedCells::encode(c) {
                Some(value) => self.store.put(&key, &value, Some(lease)).await?,
                None => {
                    warn!(key = %key, "performance samples too many to share in one etcd value")
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(slot: u64, nets: impl IntoIterator<Item = u64>) -> Bucket {
        let mut b = Bucket {
            slot,
            ..Bucket::default()
        };
        for n in nets {
            b.nets.insert(n, 1);
            b.samples += 1;
            b.ok += 1;
            b.ttfb.add(80);
        }
        b
    }

    fn cells(buckets: Vec<Bucket>) -> NodeCells {
        NodeCells {
            node: "ns1".into(),
            name: "www.example.com.".into(),
            region: 0,
            region_name: "gb".into(),
            window_ms: 3000,
            cdns: [("fastly".to_string(), buckets)].into_iter().collect(),
        }
    }

    #[test]
    fn cells_go_through_etcd_with_their_lowest_networks() {
        let c = cells(vec![bucket(7, (0..100).rev()), bucket(8, [5, 9])]);
        let value = SharedCells::encode(&c).unwrap();
        let back: SharedCells = serde_json::from_slice(&value).unwrap();
        let read = back.check("ns1", "www.example.com.", 0).unwrap();
        let b = &read.cdns["fastly"][0];
        // Counts kept whole; the networks cut to the lowest 64.
        assert_eq!((b.samples, b.ok, b.ttfb.count()), (100, 100, 100));
        let mut nets: Vec<u64> = b.nets.keys().copied().collect();
        nets.sort_unstable();
        assert_eq!(nets, (0..SHARED_NETS as u64).collect::<Vec<_>>());
        assert_eq!(read.cdns["fastly"][1], c.cdns["fastly"][1]);
    }

    #[test]
    fn cells_that_do_not_add_up_are_refused() {
        let good = SharedCells::of(&cells(vec![bucket(7, [1, 2, 3])]), SHARED_NETS);
        assert!(good.check("ns1", "n", 0).is_ok());
        let refused = |edit: &dyn Fn(&mut SharedBucket)| {
            let mut bad = good.clone();
            edit(&mut bad.cdns.get_mut("fastly").unwrap()[0]);
            bad.check("ns1", "n", 0).unwrap_err()
        };
        refused(&|b| b.ok = 4);
        refused(&|b| b.nets = vec![3, 2, 1]);
        refused(&|b| b.nets = (0..10).collect());
        refused(&|b| b.ttfb.0 = vec![(9999, 1)]);
        refused(&|b| b.ttfb.0 = vec![(3, 5)]);
        refused(&|b| b.slot = u64::MAX);
        let mut twice = good.clone();
        let b = twice.cdns["fastly"][0].clone();
        twice.cdns.get_mut("fastly").unwrap().push(b);
        assert!(twice.check("ns1", "n", 0).is_err());
        let mut wide = good.clone();
        wide.window_ms = 10;
        assert!(wide.check("ns1", "n", 0).is_err());
        assert!(region_index(4096).is_err());
        assert_eq!(region_index(3), Ok(3));
    }
}
