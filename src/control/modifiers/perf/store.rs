//! Control plane: the store of performance samples: a `Cell` per (name, region, CDN)
//! that beacons, steering polls and probe rounds record into (`Samples::record`,
//! `Samples::record_probe`), and what it aggregates for an evaluation (`Samples::aggregates`).
//! Every cell draws on one process-wide [`Budget`] of memory (`cell.rs`): past it,
//! samples that need more are refused and counted (`refused_budget`).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use super::cell::{Aggregate, Budget, Cell, Outcome, Sample};
use crate::config::perf::Performance;
use crate::config::Policy;
use crate::plan::Snapshot;

use super::{beacon, cell};

/// A source network of samples: the /24 (IPv4) or /48 (IPv6) as one number.
pub(crate) fn network(ip: IpAddr) -> u64 {
    match ip.to_canonical() {
        IpAddr::V4(a) => u64::from(u32::from(crate::net::cut_v4(a, 24))),
        IpAddr::V6(a) => (u128::from(crate::net::cut_v6(a, 48)) >> 80) as u64 | 1 << 63,
    }
}

/// The network [`network`] numbered, as an address and prefix (`2.16.0.0`, 24).
pub(crate) fn network_prefix(net: u64) -> (IpAddr, u8) {
    if net & 1 << 63 == 0 {
        (IpAddr::V4(std::net::Ipv4Addr::from(net as u32)), 24)
    } else {
        let bits = u128::from(net & !(1 << 63)) << 80;
        (IpAddr::V6(std::net::Ipv6Addr::from(bits)), 48)
    }
}

/// The samples of one (name, region) in its window, by source network: what a
/// region's recorded traffic is (`steerdns diff` weighs networks by it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RegionTraffic {
    pub name: String,
    pub region: String,
    pub window_ms: u64,
    /// Source network ([`network`]) → samples, every CDN's cell together.
    pub nets: BTreeMap<u64, u64>,
}

/// What became of a beacon's samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    /// Added to a cell.
    pub accepted: u64,
    /// Refused: their network already held its share of the cell.
    pub refused_share: u64,
    /// Taken but unused: the client's region has no `performance:` block.
    pub unused: u64,
    /// Refused: the process-wide budget of cells is spent.
    pub refused_budget: u64,
}

impl Recorded {
    /// Counts them in `steerdns_rum_samples_total`.
    pub fn count(&self, metrics: &crate::metrics::Metrics) {
        metrics.rum_samples("accepted", self.accepted);
        metrics.rum_samples("refused_share", self.refused_share);
        metrics.rum_samples("unused", self.unused);
        metrics.rum_samples("refused_budget", self.refused_budget);
    }
}

/// The cells of one region with a `performance:` block.
#[derive(Debug)]
struct RegionCells {
    region: String,
    perf: Performance,
    /// By CDN index.
    cells: Vec<Cell>,
    /// Samples accepted since start: a node of a set shares the region again when it
    /// grew.
    accepted: u64,
}

/// The cells of one steered name.
#[derive(Debug, Default)]
struct NameCells {
    cdns: Vec<String>,
    /// By region index; `None`: the region has no `performance:` block.
    regions: Vec<Option<RegionCells>>,
}

/// One node's cells of one (name, region), as a set shares them
/// (`control/cluster/performance.rs`): the buckets of its window, by CDN name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeCells {
    pub node: String,
    pub name: String,
    /// Region index, and its name (a node with another policy's region there does
    /// not count).
    pub region: usize,
    pub region_name: String,
    /// The window (ms): buckets of another width are not added.
    pub window_ms: u64,
    pub cdns: BTreeMap<String, Vec<cell::Bucket>>,
}

/// The samples of every (name, region, CDN), shared by the steering server (which
/// adds to it) and the controller (which reads aggregates from it).
#[derive(Debug, Default)]
pub struct Samples {
    cells: Mutex<HashMap<String, NameCells>>,
    limiter: Mutex<beacon::Limiter>,
    /// The memory every cell draws on, changed under `cells`' lock.
    budget: Budget,
    /// During a staged policy rollout, the samples of each cohort.
    cohorts: Mutex<super::cohorts::Cohorts>,
}

impl Samples {
    /// Samples whose cells may hold `entries` in all (the default: `cell::BUDGET_ENTRIES`).
    pub fn with_budget(entries: u64) -> Samples {
        Samples {
            budget: Budget::new(entries),
            ..Samples::default()
        }
    }

    /// The entries the cells hold now, of the budget.
    pub fn budget_used(&self) -> u64 {
        let _cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        self.budget.used()
    }

    /// Lays the cells out for `policy`, keeping the samples of every (name, region
    /// name, CDN) whose window is unchanged.
    pub fn configure(&self, policy: &Policy) {
        let mut cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        let mut old = std::mem::take(&mut *cells);
        for host in &policy.hosts {
            let name = host.name.to_string();
            let mut prev = old.remove(&name).unwrap_or_default();
            let cdns: Vec<String> = host.cdns.iter().map(|c| c.name.clone()).collect();
            let regions = host
                .regions
                .iter()
                .map(|r| {
                    let perf = r.performance.clone()?;
                    let kept = prev.regions.iter_mut().flatten().find(|k| {
                        k.region == r.name && k.perf.window == perf.window && prev.cdns == cdns
                    });
                    let (cells, accepted) = match kept {
                        Some(k) => (std::mem::take(&mut k.cells), k.accepted),
                        None => (vec![Cell::default(); cdns.len()], 0),
                    };
                    Some(RegionCells {
                        region: r.name.clone(),
                        perf,
                        cells,
                        accepted,
                    })
                })
                .collect();
            prev.cdns.clear();
            cells.insert(name, NameCells { cdns, regions });
        }
        // The cells dropped give their entries back; those kept keep theirs.
        let used = cells
            .values()
            .flat_map(|n| n.regions.iter().flatten())
            .flat_map(|rc| &rc.cells)
            .map(Cell::entries)
            .sum();
        self.budget.set(used);
    }

    /// The index of `cdn` among `name`'s CDNs; `Err` with why not.
    pub fn cdn_index(&self, name: &str, cdn: &str) -> Result<usize, String> {
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        let n = cells
            .get(name)
            .ok_or_else(|| format!("{name} is not a steered name"))?;
        n.cdns
            .iter()
            .position(|c| c == cdn)
            .ok_or_else(|| format!("unknown CDN `{cdn}` for {name}"))
    }

    /// Adds `samples` (CDN index, sample) of a client of `region` in network `net`.
    /// `Err` when the name or a CDN is unknown (nothing is added then).
    pub fn record(
        &self,
        name: &str,
        region: usize,
        net: u64,
        samples: &[(&str, Sample)],
        now_ms: u64,
    ) -> Result<Recorded, String> {
        let mut cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        let n = cells
            .get_mut(name)
            .ok_or_else(|| format!("{name} is not a steered name"))?;
        let mut idx = Vec::with_capacity(samples.len());
        for (cdn, _) in samples {
            match n.cdns.iter().position(|c| c == cdn) {
                Some(i) => idx.push(i),
                None => return Err(format!("unknown CDN `{cdn}` for {name}")),
            }
        }
        let mut out = Recorded::default();
        let Some(Some(rc)) = n.regions.get_mut(region) else {
            out.unused = samples.len() as u64;
            return Ok(out);
        };
        for (&i, (_, s)) in idx.iter().zip(samples) {
            match rc.cells[i].record(&rc.perf, net, s, now_ms, &self.budget) {
                Outcome::Accepted => out.accepted += 1,
                Outcome::RefusedShare => out.refused_share += 1,
                Outcome::RefusedBudget => out.refused_budget += 1,
            }
        }
        rc.accepted += out.accepted;
        Ok(out)
    }

    /// Adds the `samples` of a client of `region` of `name` in network `net` to its
    /// cohort of the staged rollout of `version` (`canary`: the new version's).
    pub(crate) fn record_cohort(
        &self,
        version: &str,
        (name, region): (&str, usize),
        canary: bool,
        net: u64,
        samples: &[(&str, Sample)],
    ) {
        // Only regions whose performance is measured compare their cohorts.
        let min_samples = {
            let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
            match cells.get(name).and_then(|n| n.regions.get(region)) {
                Some(Some(rc)) => rc.perf.min_samples,
                _ => return,
            }
        };
        let samples: Vec<Sample> = samples.iter().map(|(_, s)| *s).collect();
        let key = (name.to_string(), region);
        self.cohorts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(version, key, (canary, min_samples), net, &samples);
    }

    /// Drops the cohorts' samples: the staged rollout ended.
    pub(crate) fn end_cohorts(&self) {
        self.cohorts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// The cohorts of the staged rollout of `version`, per (name, region).
    pub(crate) fn cohort_aggregates(&self, version: &str) -> Vec<super::cohorts::CohortAggregates> {
        self.cohorts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .aggregates(version)
    }

    /// Adds a round of this node's prober for `cdn` as a sample of each of `regions`
    /// (where its vantage point's address lands, [`Samples::vantage_regions`]) that has
    /// the CDN, from the vantage point's network `net`; how many cells took it.
    pub fn record_probe(
        &self,
        regions: &[(String, usize, String)],
        net: u64,
        cdn: &str,
        s: &Sample,
        now_ms: u64,
    ) -> u64 {
        let mut cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        let mut taken = 0;
        for (name, region, _) in regions {
            let Some(n) = cells.get_mut(name) else {
                continue;
            };
            let Some(i) = n.cdns.iter().position(|c| c == cdn) else {
                continue;
            };
            let Some(Some(rc)) = n.regions.get_mut(*region) else {
                continue;
            };
            if rc.cells[i].record_own(&rc.perf, net, s, now_ms, &self.budget) == Outcome::Accepted {
                rc.accepted += 1;
                taken += 1;
            }
        }
        taken
    }

    /// The region a client at `vantage` gets, for each steered name where that region
    /// has a `performance:` block: (name, region index, region name). Located as a
    /// client at that address is, with the snapshot's geo database and plan.
    pub fn vantage_regions(
        &self,
        snapshot: &Snapshot,
        vantage: IpAddr,
    ) -> Vec<(String, usize, String)> {
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for (name, n) in cells.iter() {
            let Ok(dns_name) = hickory_proto::rr::Name::from_ascii(name) else {
                continue;
            };
            let Some(steered) = snapshot.plan.get(&dns_name) else {
                continue;
            };
            let region = steered
                .situate(&snapshot.geo, vantage, false)
                .decision
                .region;
            if let Some(Some(rc)) = n.regions.get(region) {
                out.push((name.clone(), region, rc.region.clone()));
            }
        }
        out.sort();
        out
    }

    /// Whether a beacon from `net` may be taken now (its source's rate).
    pub fn admit(&self, net: u64, now_ms: u64) -> bool {
        let mut l = self.limiter.lock().unwrap_or_else(|e| e.into_inner());
        l.admit(net, now_ms)
    }

    /// The aggregate of each CDN of (name, region) over the window ending at `now_ms`,
    /// this node's samples and the other nodes' of a set (`remote`), and the samples
    /// refused here.
    pub fn aggregates(
        &self,
        name: &str,
        region: usize,
        now_ms: u64,
        remote: &[Arc<NodeCells>],
    ) -> Vec<(Aggregate, u64)> {
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        let Some(n) = cells.get(name) else {
            return Vec::new();
        };
        let Some(Some(rc)) = n.regions.get(region) else {
            return Vec::new();
        };
        let theirs: Vec<&NodeCells> = remote
            .iter()
            .filter(|r| r.name == name && r.region == region && r.region_name == rc.region)
            .filter(|r| r.window_ms == cell::window_ms(&rc.perf))
            .map(|r| &**r)
            .collect();
        rc.cells
            .iter()
            .zip(&n.cdns)
            .map(|(c, cdn)| {
                let other = theirs
                    .iter()
                    .filter_map(|r| r.cdns.get(cdn))
                    .flatten()
                    .filter(|b| cell::in_window(b, &rc.perf, now_ms));
                (
                    cell::aggregate(c.window(&rc.perf, now_ms).chain(other)),
                    c.refused,
                )
            })
            .collect()
    }

    /// The regions that took samples since `written` said (by (name, region): the
    /// samples accepted then), each with the buckets of its window now: what a node
    /// of a set shares. With each, the samples accepted so far.
    pub fn changed(
        &self,
        written: &BTreeMap<(String, usize), u64>,
        now_ms: u64,
    ) -> Vec<(NodeCells, u64)> {
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for (name, n) in cells.iter() {
            for (i, rc) in n.regions.iter().enumerate() {
                let Some(rc) = rc else { continue };
                let seen = written.get(&(name.clone(), i)).copied().unwrap_or(0);
                if rc.accepted == seen {
                    continue;
                }
                let cdns = n
                    .cdns
                    .iter()
                    .zip(&rc.cells)
                    .map(|(cdn, c)| (cdn.clone(), c.window(&rc.perf, now_ms).cloned().collect()))
                    .collect();
                let shared = NodeCells {
                    node: String::new(),
                    name: name.clone(),
                    region: i,
                    region_name: rc.region.clone(),
                    window_ms: cell::window_ms(&rc.perf),
                    cdns,
                };
                out.push((shared, rc.accepted));
            }
        }
        out
    }

    /// The samples accepted since start, and the samples in each region's window by
    /// source network (regions without any left out).
    pub fn traffic(&self, now_ms: u64) -> (u64, Vec<RegionTraffic>) {
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        let (mut accepted, mut out) = (0, Vec::new());
        for (name, n) in cells.iter() {
            for rc in n.regions.iter().flatten() {
                accepted += rc.accepted;
                let mut nets: BTreeMap<u64, u64> = BTreeMap::new();
                for b in rc.cells.iter().flat_map(|c| c.window(&rc.perf, now_ms)) {
                    for (net, count) in &b.nets {
                        *nets.entry(*net).or_default() += u64::from(*count);
                    }
                }
                if !nets.is_empty() {
                    out.push(RegionTraffic {
                        name: name.clone(),
                        region: rc.region.clone(),
                        window_ms: cell::window_ms(&rc.perf),
                        nets,
                    });
                }
            }
        }
        out.sort_by(|a, b| (&a.name, &a.region).cmp(&(&b.name, &b.region)));
        (accepted, out)
    }

    /// How often a node of a set shares its cells: a bucket's width (the shortest of
    /// every region's), from 100 ms to 5 s.
    pub fn share_every(&self) -> std::time::Duration {
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        let width = cells
            .values()
            .flat_map(|n| n.regions.iter().flatten())
            .map(|rc| cell::width_ms(&rc.perf))
            .min()
            .unwrap_or(1000);
        std::time::Duration::from_millis(width.clamp(100, 5000))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::modifiers::perf::cell::CELL_ENTRIES;

    /// `names` × 2 regions with a `performance:` block × 2 CDNs.
    fn named(names: &[&str]) -> Policy {
        let host = "    cdns:
      fastly: { cname: fastly.cdn.test. }
      cloudflare: { cname: cloudflare.cdn.test. }
    regions:
      - name: gb
        match: [GB]
        weights: { fastly: 90, cloudflare: 10 }
        performance: { metric: ttfb_p75 }
      - name: us
        match: [US]
        weights: { fastly: 90, cloudflare: 10 }
        performance: { metric: ttfb_p75 }
      - match: [\"*\"]
        weights: { fastly: 50, cloudflare: 50 }
";
        let mut text = String::from("hostnames:\n");
        for n in names {
            text += &format!("  {n}:\n{host}");
        }
        crate::config::parse(std::path::Path::new("steering.yaml"), text)
            .unwrap()
            .0
    }

    #[test]
    fn traffic_is_counted_by_source_network_and_numbers_go_back_to_prefixes() {
        let samples = Samples::default();
        samples.configure(&named(&["a.example.com"]));
        let s = Sample {
            ttfb_ms: Some(80),
            ..Sample::default()
        };
        let v4 = network("2.16.0.77".parse().unwrap());
        let v6 = network("2a00:1450:4009:81e::200e".parse().unwrap());
        for (net, cdn) in [(v4, "fastly"), (v4, "cloudflare"), (v6, "fastly")] {
            let r = samples
                .record("a.example.com.", 0, net, &[(cdn, s)], 1_000)
                .unwrap();
            assert_eq!(r.accepted, 1);
        }
        let (accepted, regions) = samples.traffic(1_000);
        assert_eq!(accepted, 3);
        assert_eq!(regions.len(), 1);
        assert_eq!(regions[0].region, "gb");
        assert_eq!(regions[0].nets, BTreeMap::from([(v4, 2), (v6, 1)]));
        assert_eq!(network_prefix(v4), ("2.16.0.0".parse().unwrap(), 24));
        assert_eq!(
            network_prefix(v6),
            ("2a00:1450:4009::".parse().unwrap(), 48)
        );
    }

    #[test]
    fn past_the_process_budget_new_cells_are_refused_and_counted() {
        let policy = named(&["a.example.com", "b.example.com", "c.example.com"]);
        // Room for five of the twelve cells, each with its first network and value.
        let samples = Samples::with_budget(5 * (CELL_ENTRIES + 2));
        samples.configure(&policy);
        let s = Sample {
            ttfb_ms: Some(80),
            ..Sample::default()
        };
        let mut total = Recorded::default();
        for name in ["a.example.com.", "b.example.com.", "c.example.com."] {
            for region in 0..2 {
                for cdn in ["fastly", "cloudflare"] {
                    let r = samples.record(name, region, 7, &[(cdn, s)], 1_000).unwrap();
                    total.accepted += r.accepted;
                    total.refused_budget += r.refused_budget;
                    total.refused_share += r.refused_share;
                }
            }
        }
        assert_eq!(
            (total.accepted, total.refused_budget, total.refused_share),
            (5, 7, 0)
        );
        assert_eq!(samples.budget_used(), 5 * (CELL_ENTRIES + 2));
        // A cell already there still takes what costs nothing more.
        let r = samples
            .record("a.example.com.", 0, 7, &[("fastly", s)], 1_001)
            .unwrap();
        assert_eq!(r.accepted, 1);
        // A reload that drops a name gives its cells back.
        let one = named(&["a.example.com"]);
        samples.configure(&one);
        assert_eq!(samples.budget_used(), 4 * (CELL_ENTRIES + 2));
    }
}
