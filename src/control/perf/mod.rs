//! Control plane: performance steering, region weights that follow what viewers
//! measure, inside the bounds of a region's `performance:` block.
//!
//! ```text
//! POST /rum/{name} (beacons)  ─┐
//! steering polls' throughput   ├─▶ Store: a Cell per (name, region, CDN), a sliding
//!                              ┘          window of log-bucketed histograms (cell.rs)
//! controller, every shift period of a region:
//!   Store aggregates ─▶ modifier::target (band, penalty, floor) ─▶ modifier::slew
//!   ─▶ Perf::apply: the policy with the region's weights replaced
//!   ─▶ planner (health failover and drains apply after, and win) ─▶ Plan
//! ```
//!
//! This is the first **modifier** of the policy weights: [`Perf::apply`] takes the
//! policy and gives it back with weights changed; a later modifier takes the result of
//! this one. Weights change only here, in the control plane, once per shift period;
//! the query path picks from the plan's tables as before (consistent selection, so a
//! shift moves the fewest resolvers).
//!
//! Clients are located server-side: the region is the one the DNS answer would use
//! for the client's address (the connection's, or from `--trusted-proxies` the last
//! untrusted `X-Forwarded-For` address); their claims are never trusted.

pub mod beacon;
pub mod cell;
pub mod hist;
pub mod modifier;
pub mod page;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::config::perf::Performance;
use crate::config::Policy;
use cell::{Aggregate, Cell, Sample};
use modifier::PerfReason;

/// A source network of samples: the /24 (IPv4) or /48 (IPv6) as one number.
pub fn network(ip: IpAddr) -> u64 {
    match ip.to_canonical() {
        IpAddr::V4(a) => u64::from(u32::from(a) & 0xffff_ff00),
        IpAddr::V6(a) => (u128::from(a) >> 80) as u64 | 1 << 63,
    }
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
}

impl Recorded {
    /// Counts them in `steerdns_rum_samples_total`.
    pub fn count(&self, metrics: &crate::metrics::Metrics) {
        metrics.rum_samples("accepted", self.accepted);
        metrics.rum_samples("refused_share", self.refused_share);
        metrics.rum_samples("unused", self.unused);
    }
}

/// The cells of one steered name.
#[derive(Debug, Default)]
struct NameCells {
    cdns: Vec<String>,
    /// By region index; `None`: the region has no `performance:` block.
    regions: Vec<Option<(String, Performance, Vec<Cell>)>>,
}

/// The samples of every (name, region, CDN), shared by the steering server (which
/// adds to it) and the controller (which reads aggregates from it).
#[derive(Debug, Default)]
pub struct Store {
    cells: Mutex<HashMap<String, NameCells>>,
    limiter: Mutex<beacon::Limiter>,
}

impl Store {
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
                    let kept = prev.regions.iter_mut().flatten().find(|(n, p, _)| {
                        *n == r.name && p.window == perf.window && prev.cdns == cdns
                    });
                    let cells = match kept {
                        Some((_, _, c)) => std::mem::take(c),
                        None => vec![Cell::default(); cdns.len()],
                    };
                    Some((r.name.clone(), perf, cells))
                })
                .collect();
            prev.cdns.clear();
            cells.insert(name, NameCells { cdns, regions });
        }
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
        let Some(Some((_, perf, region_cells))) = n.regions.get_mut(region) else {
            out.unused = samples.len() as u64;
            return Ok(out);
        };
        for (&i, (_, s)) in idx.iter().zip(samples) {
            if region_cells[i].record(perf, net, s, now_ms) {
                out.accepted += 1;
            } else {
                out.refused_share += 1;
            }
        }
        Ok(out)
    }

    /// Whether a beacon from `net` may be taken now (its source's rate).
    pub fn admit(&self, net: u64, now_ms: u64) -> bool {
        let mut l = self.limiter.lock().unwrap_or_else(|e| e.into_inner());
        l.admit(net, now_ms)
    }

    /// The aggregate of each CDN of (name, region) over the window ending at `now_ms`,
    /// and the samples refused there.
    pub fn aggregates(&self, name: &str, region: usize, now_ms: u64) -> Vec<(Aggregate, u64)> {
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        let Some(Some((_, perf, cells))) = cells.get(name).and_then(|n| n.regions.get(region))
        else {
            return Vec::new();
        };
        cells
            .iter()
            .map(|c| (cell::aggregate(c.window(perf, now_ms)), c.refused))
            .collect()
    }
}

/// The shift of one region with a `performance:` block.
#[derive(Clone, Debug)]
struct Shift {
    region: String,
    perf: Performance,
    cdns: Vec<String>,
    /// The policy weights it starts from.
    policy: Vec<u32>,
    /// In force (points of 100, by CDN).
    shares: Vec<f64>,
    /// Where the shares are going.
    target: Vec<f64>,
    reasons: Vec<PerfReason>,
    measured: Vec<(Aggregate, u64)>,
    /// When the next period starts.
    next: Instant,
}

impl Shift {
    fn at_policy(&self) -> bool {
        let policy = modifier::policy_shares(&self.policy);
        self.shares
            .iter()
            .zip(&policy)
            .all(|(s, p)| (s - p).abs() < 1e-9)
    }
}

/// The performance modifier: a [`Shift`] per (name, region index) with a
/// `performance:` block, and the store its samples come from.
#[derive(Debug, Default)]
pub struct Perf {
    store: Arc<Store>,
    shifts: BTreeMap<(String, usize), Shift>,
}

/// One CDN of a region, as `/v1/state`, `explain` and the status page show it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CdnView {
    pub cdn: String,
    /// Points of 100: the policy's, in force, and where the shift is going.
    pub policy_share: f64,
    pub share: f64,
    pub target_share: f64,
    pub reason: PerfReason,
    /// The metric's value when it has enough samples to count.
    pub measured: Option<f64>,
    pub window: Aggregate,
    /// Samples refused since start (one network over its share).
    pub refused: u64,
}

/// One region with a `performance:` block.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RegionView {
    pub name: String,
    pub region: String,
    pub metric: &'static str,
    pub band_percent: f64,
    pub floor_percent: f64,
    pub max_shift_points: f64,
    pub shift_period_seconds: f64,
    /// The shares in force differ from the target: a shift is under way.
    pub shifting: bool,
    pub cdns: Vec<CdnView>,
}

impl Perf {
    /// The store beacons and steering polls add to.
    pub fn store(&self) -> Arc<Store> {
        self.store.clone()
    }

    /// Follows a (re)loaded policy: shifts of regions whose block, CDNs and weights
    /// are unchanged go on; others start again at the policy weights.
    pub fn configure(&mut self, policy: &Policy, now: Instant) {
        self.store.configure(policy);
        let mut old = std::mem::take(&mut self.shifts);
        for host in &policy.hosts {
            let cdns: Vec<String> = host.cdns.iter().map(|c| c.name.clone()).collect();
            for (i, r) in host.regions.iter().enumerate() {
                let Some(perf) = &r.performance else { continue };
                let key = (host.name.to_string(), i);
                let shift = match old.remove(&key) {
                    Some(s)
                        if s.region == r.name
                            && s.perf == *perf
                            && s.cdns == cdns
                            && s.policy == r.weights =>
                    {
                        s
                    }
                    _ => Shift {
                        region: r.name.clone(),
                        perf: perf.clone(),
                        cdns: cdns.clone(),
                        policy: r.weights.clone(),
                        shares: modifier::policy_shares(&r.weights),
                        target: modifier::policy_shares(&r.weights),
                        reasons: vec![PerfReason::PerfStale; cdns.len()],
                        measured: Vec::new(),
                        next: now + perf.shift_period,
                    },
                };
                self.shifts.insert(key, shift);
            }
        }
    }

    /// Whether performance steering has CDN `cdn` of region `region` of `name` outside
    /// its band (`perf_penalty`, `perf_floor`): the commit modifier never raises it.
    pub fn outside(&self, name: &str, region: usize, cdn: usize) -> bool {
        self.shifts
            .get(&(name.to_string(), region))
            .and_then(|s| s.reasons.get(cdn))
            .is_some_and(|r| matches!(r, PerfReason::PerfPenalty | PerfReason::PerfFloor))
    }

    /// When the next shift period starts.
    pub fn next_due(&self) -> Option<Instant> {
        self.shifts.values().map(|s| s.next).min()
    }

    /// Ends the periods due at `now` (wall clock `now_ms` for the windows): each
    /// region measured, targeted and slewed. True when the weights changed.
    pub fn tick(&mut self, now: Instant, now_ms: u64) -> bool {
        let mut changed = false;
        for ((name, region), s) in &mut self.shifts {
            if s.next > now {
                continue;
            }
            s.measured = self.store.aggregates(name, *region, now_ms);
            let usable: Vec<Option<f64>> =
                s.measured.iter().map(|(a, _)| a.usable(&s.perf)).collect();
            let (target, reasons) = modifier::target(&s.perf, &s.policy, &usable);
            let shares = modifier::slew(&s.shares, &target, s.perf.max_shift_points);
            if modifier::weights_of(&shares) != modifier::weights_of(&s.shares) {
                changed = true;
                tracing::info!(name = %name, region = %s.region, from = ?rounded(&s.shares), to = ?rounded(&shares), target = ?rounded(&target), reasons = ?reasons.iter().map(|r| r.as_str()).collect::<Vec<_>>(), "performance shift");
            }
            (s.shares, s.target, s.reasons) = (shares, target, reasons);
            s.next = (s.next + s.perf.shift_period).max(now);
        }
        changed
    }

    /// The policy with the weights of every shifted region replaced; `None` when
    /// every region is at its policy weights (the policy applies as written).
    pub fn apply(&self, policy: &Policy) -> Option<Policy> {
        if self.shifts.values().all(Shift::at_policy) {
            return None;
        }
        let mut out = policy.clone();
        for host in &mut out.hosts {
            let name = host.name.to_string();
            for (i, r) in host.regions.iter_mut().enumerate() {
                match self.shifts.get(&(name.clone(), i)) {
                    Some(s) if !s.at_policy() && s.policy == r.weights => {
                        r.weights = modifier::weights_of(&s.shares);
                    }
                    _ => {}
                }
            }
        }
        Some(out)
    }

    /// Sets the measured value and the reason of every CDN of a shifted region
    /// (`steerdns_perf_measured`, `steerdns_perf_reason`).
    pub fn export(&self, metrics: &crate::metrics::Metrics) {
        for ((name, _), s) in &self.shifts {
            for (i, cdn) in s.cdns.iter().enumerate() {
                let measured = s.measured.get(i).and_then(|(a, _)| a.usable(&s.perf));
                let reason = s.reasons.get(i).map_or("perf_stale", |r| r.as_str());
                metrics.perf_cdn(
                    name,
                    &s.region,
                    cdn,
                    s.perf.metric.as_str(),
                    measured,
                    reason,
                );
            }
        }
    }

    /// The view of region `region` of `name` (absolute), if it has a `performance:`
    /// block: what `explain` shows.
    pub fn region_view(&self, name: &str, region: usize) -> Option<RegionView> {
        let at = self
            .shifts
            .keys()
            .position(|k| k.0.eq_ignore_ascii_case(name) && k.1 == region)?;
        self.view().into_iter().nth(at)
    }

    /// Every region with a `performance:` block, for `/v1/state` and the status page.
    pub fn view(&self) -> Vec<RegionView> {
        self.shifts
            .iter()
            .map(|((name, _), s)| {
                let policy = modifier::policy_shares(&s.policy);
                let cdns = s
                    .cdns
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| s.policy[i] > 0)
                    .map(|(i, cdn)| {
                        let (window, refused) = s.measured.get(i).cloned().unwrap_or_default();
                        CdnView {
                            cdn: cdn.clone(),
                            policy_share: round2(policy[i]),
                            share: round2(s.shares[i]),
                            target_share: round2(s.target[i]),
                            reason: s.reasons[i],
                            measured: window.usable(&s.perf),
                            window,
                            refused,
                        }
                    })
                    .collect();
                RegionView {
                    name: name.clone(),
                    region: s.region.clone(),
                    metric: s.perf.metric.as_str(),
                    band_percent: s.perf.band_percent,
                    floor_percent: s.perf.floor_percent,
                    max_shift_points: s.perf.max_shift_points,
                    shift_period_seconds: s.perf.shift_period.as_secs_f64(),
                    shifting: modifier::weights_of(&s.shares) != modifier::weights_of(&s.target),
                    cdns,
                }
            })
            .collect()
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn rounded(v: &[f64]) -> Vec<f64> {
    v.iter().map(|&x| round2(x)).collect()
}
