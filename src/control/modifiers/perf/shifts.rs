//! Control plane, the performance modifier: `Perf`, the shifts in force per region,
//! what is due to evaluate, and the policy weights they make (`apply`).
//! (The main room of its folder; the folder's door, `mod.rs`, says what else lives there.)

use super::*;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use super::cell::{Aggregate, Sample};
use super::modifier::PerfReason;
use crate::config::perf::Performance;
use crate::config::Policy;
use crate::plan::Snapshot;

/// The shift of one region with a `performance:` block.
#[derive(Clone, Debug)]
pub(super) struct Shift {
    pub(super) region: String,
    pub(super) perf: Performance,
    pub(super) cdns: Vec<String>,
    /// The policy weights it starts from.
    pub(super) policy: Vec<u32>,
    /// In force (points of 100, by CDN).
    pub(super) shares: Vec<f64>,
    /// Where the shares are going.
    pub(super) target: Vec<f64>,
    pub(super) reasons: Vec<PerfReason>,
    pub(super) measured: Vec<(Aggregate, u64)>,
    /// The next evaluation (Unix ms): a multiple of the period, the same instants on
    /// every node of a set.
    pub(super) next_ms: u64,
    /// The evaluation in force (Unix ms; 0: none yet) and the node of a set that made
    /// it.
    pub(super) evaluated_ms: u64,
    pub(super) evaluated_by: Option<String>,
    /// A set's evaluation refused here (it does not fit this policy): not looked at
    /// again.
    pub(super) refused_ms: u64,
    /// Restored from the state file: no evaluation before this (Unix ms), one window
    /// after the start, while the samples come back.
    pub(super) hold_until_ms: u64,
}

impl Shift {
    pub(super) fn at_policy(&self) -> bool {
        let policy = super::modifier::policy_shares(&self.policy);
        self.shares
            .iter()
            .zip(&policy)
            .all(|(s, p)| (s - p).abs() < 1e-9)
    }

    pub(super) fn period_ms(&self) -> u64 {
        (self.perf.shift_period.as_millis() as u64).max(1)
    }
}

/// One evaluation of one region: the shares from then on, where they are going and
/// why. Put in force here (one node), or written for a set and put in force by every
/// node from etcd.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Evaluation {
    pub name: String,
    pub region: usize,
    pub region_name: String,
    /// A multiple of the period (Unix ms).
    pub at_ms: u64,
    /// The policy weights it was made from (a node with others does not take it).
    pub policy: Vec<u32>,
    /// By CDN: (name, share in force, target share, reason).
    pub cdns: Vec<(String, f64, f64, PerfReason)>,
}

/// The evaluation in force of one region, as the state file keeps it: taken back at
/// start while the region's policy weights are the same and it fits.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SavedShift {
    pub evaluation: Evaluation,
    /// The node of a set that made it.
    #[serde(default)]
    pub by: Option<String>,
}

/// The performance modifier: a [`Shift`] per (name, region index) with a
/// `performance:` block, and the store its samples come from.
#[derive(Debug, Default)]
pub(crate) struct Perf {
    pub(super) store: Arc<Samples>,
    pub(super) shifts: BTreeMap<(String, usize), Shift>,
    /// The other nodes' cells, in a set.
    pub(super) remote: Vec<Arc<NodeCells>>,
    /// This node's vantage point (`--vantage-address`), and where it lands: its
    /// prober's rounds are samples there.
    pub(super) vantage: Option<Vantage>,
}

/// Where this node's prober measures from.
#[derive(Clone, Debug)]
pub(super) struct Vantage {
    pub(super) address: IpAddr,
    /// (name, region index, region name), from [`Samples::vantage_regions`].
    pub(super) regions: Vec<(String, usize, String)>,
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
    /// The evaluation in force (Unix ms), and in a set the node that made it.
    pub evaluated_unix_ms: Option<u64>,
    pub evaluated_by: Option<String>,
    /// This node's vantage point (`--vantage-address`) when it lands in this region:
    /// its prober's rounds are samples here.
    pub vantage_address: Option<String>,
    pub cdns: Vec<CdnView>,
}

/// The first multiple of `period_ms` after `now_ms`.
pub(super) fn next_multiple(now_ms: u64, period_ms: u64) -> u64 {
    (now_ms / period_ms + 1).saturating_mul(period_ms)
}

impl Perf {
    /// The store beacons and steering polls add to.
    pub(crate) fn store(&self) -> Arc<Samples> {
        self.store.clone()
    }

    /// Makes this node's prober a source of samples: each round's time to first byte
    /// and outcome, in the region a client at `address` gets ([`Perf::locate`]).
    pub(crate) fn measure_from(&mut self, address: IpAddr) {
        self.vantage = Some(Vantage {
            address,
            regions: Vec::new(),
        });
    }

    /// Locates the vantage point again in `snapshot` (after a reload) and logs where
    /// its prober's rounds count.
    pub(crate) fn locate(&mut self, snapshot: &Snapshot) {
        let Some(v) = &mut self.vantage else {
            return;
        };
        let regions = self.store.vantage_regions(snapshot, v.address);
        if regions != v.regions {
            let at: Vec<String> = regions.iter().map(|(n, _, r)| format!("{n} {r}")).collect();
            tracing::info!(
                address = %v.address,
                regions = %at.join(", "),
                "the prober's time to first byte counts as samples of these regions (--vantage-address)"
            );
            v.regions = regions;
        }
    }

    /// Adds a round of this node's prober of `cdn` (with `--vantage-address`); how
    /// many cells took it.
    pub(crate) fn probed(&self, cdn: &str, ok: bool, ttfb_ms: Option<u64>, now_ms: u64) -> u64 {
        let Some(v) = &self.vantage else {
            return 0;
        };
        let sample = Sample {
            ttfb_ms,
            throughput_bps: None,
            ok: Some(ok),
        };
        let net = network(v.address);
        self.store
            .record_probe(&v.regions, net, cdn, &sample, now_ms)
    }

    /// Whether this node's prober measures region `region` of `name`.
    pub(super) fn vantage_in(&self, name: &str, region: usize) -> Option<String> {
        let v = self.vantage.as_ref()?;
        v.regions
            .iter()
            .any(|(n, r, _)| n == name && *r == region)
            .then(|| v.address.to_string())
    }

    /// Follows a (re)loaded policy: shifts of regions whose block, CDNs and weights
    /// are unchanged go on; others start again at the policy weights.
    pub(crate) fn configure(&mut self, policy: &Policy, now_ms: u64) {
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
                        shares: super::modifier::policy_shares(&r.weights),
                        target: super::modifier::policy_shares(&r.weights),
                        reasons: vec![PerfReason::PerfStale; cdns.len()],
                        measured: Vec::new(),
                        next_ms: next_multiple(
                            now_ms,
                            (perf.shift_period.as_millis() as u64).max(1),
                        ),
                        evaluated_ms: 0,
                        evaluated_by: None,
                        refused_ms: 0,
                        hold_until_ms: 0,
                    },
                };
                self.shifts.insert(key, shift);
            }
        }
    }

    /// The other nodes' cells (a set): added to this node's at each evaluation.
    pub(crate) fn set_remote(&mut self, remote: Vec<Arc<NodeCells>>) {
        self.remote = remote;
    }

    /// Whether performance steering has CDN `cdn` of region `region` of `name` outside
    /// its band (`perf_penalty`, `perf_floor`): the commit modifier never raises it.
    pub(crate) fn outside(&self, name: &str, region: usize, cdn: usize) -> bool {
        self.shifts
            .get(&(name.to_string(), region))
            .and_then(|s| s.reasons.get(cdn))
            .is_some_and(|r| matches!(r, PerfReason::PerfPenalty | PerfReason::PerfFloor))
    }

    /// When the next evaluation is due (Unix ms).
    pub(crate) fn next_due_ms(&self) -> Option<u64> {
        self.shifts.values().map(|s| s.next_ms).min()
    }

    /// The evaluations due at `now_ms`, each region measured (this node's samples and
    /// the set's), targeted and slewed from the shares in force. Nothing is put in
    /// force here.
    pub(crate) fn take_due(&mut self, now_ms: u64) -> Vec<Evaluation> {
        let mut due = Vec::new();
        for ((name, region), s) in &mut self.shifts {
            if s.next_ms > now_ms {
                continue;
            }
            let period = s.period_ms();
            s.next_ms = next_multiple(now_ms, period);
            if now_ms < s.hold_until_ms {
                continue;
            }
            let at_ms = now_ms / period * period;
            // The window ending just before the evaluation: at a multiple of the period
            // (often a bucket's start) the bucket now has barely begun, and every node
            // evaluating `at_ms` measures the same buckets.
            let end = at_ms.saturating_sub(1);
            s.measured = self.store.aggregates(name, *region, end, &self.remote);
            let usable: Vec<Option<f64>> =
                s.measured.iter().map(|(a, _)| a.usable(&s.perf)).collect();
            let (target, reasons) = super::modifier::target(&s.perf, &s.policy, &usable);
            let shares = super::modifier::slew(&s.shares, &target, s.perf.max_shift_points);
            let cdns = (0..s.cdns.len())
                .map(|i| (s.cdns[i].clone(), shares[i], target[i], reasons[i]))
                .collect();
            due.push(Evaluation {
                name: name.clone(),
                region: *region,
                region_name: s.region.clone(),
                at_ms,
                policy: s.policy.clone(),
                cdns,
            });
        }
        due
    }

    /// Whether a set's evaluation of region `region` of `name` at `at_ms` is to be put
    /// in force now: newer than the one in force, not refused before, and not
    /// [`Perf::ahead`].
    pub(crate) fn takes(&self, name: &str, region: usize, at_ms: u64, now_ms: u64) -> bool {
        self.shifts
            .get(&(name.to_string(), region))
            .is_some_and(|s| at_ms > s.evaluated_ms && at_ms != s.refused_ms)
            && !self.ahead(name, region, at_ms, now_ms)
    }

    /// Whether an evaluation at `at_ms` is [`crate::control::decide::times::far_ahead`] of
    /// `now_ms`: it is not taken, and the next evaluation writes over it.
    pub(crate) fn ahead(&self, name: &str, region: usize, at_ms: u64, now_ms: u64) -> bool {
        self.shifts
            .get(&(name.to_string(), region))
            .is_some_and(|s| crate::control::decide::times::far_ahead(at_ms, s.period_ms(), now_ms))
    }

    /// Puts evaluation `e` in force (made by node `by` of a set, or here). `Err` says
    /// why it does not fit this policy's region (then it is not looked at again): it
    /// was made from other policy weights, its CDNs differ, a CDN the policy does not
    /// answer has a share, a CDN is under its floor, the shares do not add up to 100,
    /// or they moved more than `max_shift_points` a period from those in force.
    /// `Ok(true)` when the weights changed.
    pub(crate) fn adopt(&mut self, e: &Evaluation, by: Option<&str>) -> Result<bool, String> {
        let Some(s) = self.shifts.get_mut(&(e.name.clone(), e.region)) else {
            return Err("no such region with a `performance:` block".into());
        };
        match fits(s, e) {
            Ok(()) => {}
            Err(why) => {
                s.refused_ms = e.at_ms;
                return Err(why);
            }
        }
        let shares: Vec<f64> = e.cdns.iter().map(|c| c.1).collect();
        let target: Vec<f64> = e.cdns.iter().map(|c| c.2).collect();
        let reasons: Vec<PerfReason> = e.cdns.iter().map(|c| c.3).collect();
        let changed =
            super::modifier::weights_of(&shares) != super::modifier::weights_of(&s.shares);
        if changed {
            tracing::info!(name = %e.name, region = %s.region, from = ?rounded(&s.shares), to = ?rounded(&shares), target = ?rounded(&target), reasons = ?reasons.iter().map(|r| r.as_str()).collect::<Vec<_>>(), by = by.unwrap_or("this node"), "performance shift");
        }
        (s.shares, s.target, s.reasons) = (shares, target, reasons);
        s.evaluated_ms = e.at_ms;
        s.evaluated_by = by.map(str::to_string);
        Ok(changed)
    }

    /// The evaluation in force of every region evaluated since start, to save.
    pub(crate) fn saved(&self) -> Vec<SavedShift> {
        self.shifts
            .iter()
            .filter(|(_, s)| s.evaluated_ms > 0)
            .map(|((name, region), s)| SavedShift {
                evaluation: Evaluation {
                    name: name.clone(),
                    region: *region,
                    region_name: s.region.clone(),
                    at_ms: s.evaluated_ms,
                    policy: s.policy.clone(),
                    cdns: (0..s.cdns.len())
                        .map(|i| (s.cdns[i].clone(), s.shares[i], s.target[i], s.reasons[i]))
                        .collect(),
                },
                by: s.evaluated_by.clone(),
            })
            .collect()
    }

    /// Takes back saved evaluations (after [`Perf::configure`]): each that fits its
    /// region (made from the same policy weights, see [`Perf::adopt`]). A region taken
    /// back is not evaluated for one window from `now_ms`: its samples were not saved,
    /// and an empty window would send it back towards the policy. How many were taken.
    pub(crate) fn restore(&mut self, saved: &[SavedShift], now_ms: u64) -> usize {
        let mut taken = 0;
        for s in saved {
            let e = &s.evaluation;
            let key = (e.name.clone(), e.region);
            if self.adopt(e, s.by.as_deref()).is_err() {
                continue;
            }
            if let Some(shift) = self.shifts.get_mut(&key) {
                shift.hold_until_ms = now_ms.saturating_add(shift.perf.window.as_millis() as u64);
            }
            taken += 1;
        }
        taken
    }

    /// The policy with the weights of every shifted region replaced; `None` when
    /// every region is at its policy weights (the policy applies as written).
    pub(crate) fn apply(&self, policy: &Policy) -> Option<Policy> {
        if self.shifts.values().all(Shift::at_policy) {
            return None;
        }
        let mut out = policy.clone();
        for host in &mut out.hosts {
            let name = host.name.to_string();
            for (i, r) in host.regions.iter_mut().enumerate() {
                match self.shifts.get(&(name.clone(), i)) {
                    Some(s) if !s.at_policy() && s.policy == r.weights => {
                        r.weights = super::modifier::weights_of(&s.shares);
                        r.moved_by.push("performance");
                    }
                    _ => {}
                }
            }
        }
        Some(out)
    }

    /// Sets the measured value and the reason of every CDN of a shifted region
    /// (`steerdns_perf_measured`, `steerdns_perf_reason`).
    pub(crate) fn export(&self, metrics: &crate::metrics::Metrics) {
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
    pub(crate) fn region_view(&self, name: &str, region: usize) -> Option<RegionView> {
        let at = self
            .shifts
            .keys()
            .position(|k| k.0.eq_ignore_ascii_case(name) && k.1 == region)?;
        self.view().into_iter().nth(at)
    }

    /// Every region with a `performance:` block, for `/v1/state` and the status page.
    pub(crate) fn view(&self) -> Vec<RegionView> {
        self.shifts
            .iter()
            .map(|((name, region), s)| {
                let policy = super::modifier::policy_shares(&s.policy);
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
                    shifting: super::modifier::weights_of(&s.shares)
                        != super::modifier::weights_of(&s.target),
                    evaluated_unix_ms: (s.evaluated_ms > 0).then_some(s.evaluated_ms),
                    evaluated_by: s.evaluated_by.clone(),
                    vantage_address: self.vantage_in(name, *region),
                    cdns,
                }
            })
            .collect()
    }
}

/// Whether evaluation `e` fits shift `s`: the same region, policy weights and CDNs, nothing for a
/// CDN the policy does not answer, every CDN at or above its floor, shares adding up
/// to 100.
pub(super) fn fits(s: &Shift, e: &Evaluation) -> Result<(), String> {
    if e.region_name != s.region {
        return Err(format!("region `{}`, not `{}`", e.region_name, s.region));
    }
    if e.policy != s.policy {
        return Err(format!(
            "made from the policy weights {:?}, not {:?}",
            e.policy, s.policy
        ));
    }
    let names: Vec<&str> = e.cdns.iter().map(|c| c.0.as_str()).collect();
    if names != s.cdns.iter().map(String::as_str).collect::<Vec<_>>() {
        return Err(format!("CDNs {names:?}, not {:?}", s.cdns));
    }
    let policy = super::modifier::policy_shares(&s.policy);
    let mut total = 0.0;
    for ((cdn, share, target, _), p) in e.cdns.iter().zip(&policy) {
        for v in [share, target] {
            if !(v.is_finite() && (0.0..=100.0).contains(v)) {
                return Err(format!("{cdn}: share {v} (0 to 100)"));
            }
        }
        if *p == 0.0 && (*share > 0.0 || *target > 0.0) {
            return Err(format!("{cdn}: a share where the policy gives none"));
        }
        if *share + 0.01 < s.perf.floor_percent.min(*p) {
            return Err(format!("{cdn}: share {share} under the floor"));
        }
        total += share;
    }
    if policy.iter().sum::<f64>() > 0.0 && (total - 100.0).abs() > 0.5 {
        return Err(format!("shares add up to {total}, not 100"));
    }
    // As every evaluation made here: at most `max_shift_points` moved a period since
    // the evaluation in force (any distance from none).
    if s.evaluated_ms > 0 {
        let periods = (e.at_ms.saturating_sub(s.evaluated_ms) / s.period_ms()).max(1) as f64;
        let moved: f64 = e
            .cdns
            .iter()
            .zip(&s.shares)
            .map(|(c, now)| (c.1 - now).max(0.0))
            .sum();
        let max = s.perf.max_shift_points;
        if moved > max * periods + 0.01 {
            return Err(format!(
                "{} points moved in {periods} period(s), the policy allows {max} a period",
                round2(moved)
            ));
        }
    }
    Ok(())
}

pub(super) fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

pub(super) fn rounded(v: &[f64]) -> Vec<f64> {
    v.iter().map(|&x| round2(x)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sets_shift_past_the_pace_of_the_policy_is_refused() {
        let text = "hostname: www.example.com
cdns:
  fastly: { cname: fastly.cdn.test. }
  cloudflare: { cname: cloudflare.cdn.test. }
regions:
  - name: gb
    match: [GB]
    weights: { fastly: 90, cloudflare: 10 }
    performance: { metric: ttfb_p75, floor_percent: 10, max_shift_points: 10, shift_period_seconds: 1 }
  - match: [\"*\"]
    weights: { fastly: 50, cloudflare: 50 }
";
        let policy = crate::config::parse(std::path::Path::new("steering.yaml"), text.into())
            .unwrap()
            .0;
        let t = 1_796_083_200_000;
        let mut p = Perf::default();
        p.configure(&policy, t);
        let e = |at: u64, fastly: f64| Evaluation {
            name: "www.example.com.".into(),
            region: 0,
            region_name: "gb".into(),
            at_ms: at,
            policy: vec![90, 10],
            cdns: vec![
                ("fastly".into(), fastly, 10.0, PerfReason::PerfFloor),
                (
                    "cloudflare".into(),
                    100.0 - fastly,
                    90.0,
                    PerfReason::PerfBand,
                ),
            ],
        };
        // From none in force: any shares within the floors and the sum.
        assert_eq!(p.adopt(&e(t + 1_000, 70.0), Some("ns2")), Ok(true));
        // Then 10 points a period: 60 in one period is refused, and not taken again.
        let why = p.adopt(&e(t + 2_000, 10.0), Some("ns2")).unwrap_err();
        assert!(why.contains("60 points moved in 1 period"), "{why}");
        assert!(!p.takes("www.example.com.", 0, t + 2_000, t + 2_000));
        assert_eq!(p.adopt(&e(t + 3_000, 60.0), Some("ns2")), Ok(true));
        // Over six periods, 50 points is the pace.
        assert_eq!(p.adopt(&e(t + 9_000, 10.0), Some("ns2")), Ok(true));
    }
}
