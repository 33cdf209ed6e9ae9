//! Control plane, the commit modifier: `Commit`, the usage ledger and the biases in
//! force per name, what is due to evaluate, and the policy weights they make (`apply`).
//! (The main room of its folder; the folder's door, `mod.rs`, says what else lives there.)

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::bias::{Bias, Facts};
use super::ledger::{Ledger, Record, Taken};
use super::month::Month;
use super::usage::UsageError;
use crate::config::contract::{CommitSettings, Contract};
use crate::config::Policy;
use crate::control::decide::times::far_ahead;
use crate::control::modifiers::perf::modifier::{policy_shares, weights_of};

/// At most this many shares are remembered per CDN (one per evaluation).
pub(super) const HISTORY: usize = 2048;

/// One CDN of a name with a contract or a capacity.
#[derive(Clone, Debug)]
pub(super) struct CdnCommit {
    pub(super) name: String,
    pub(super) contract: Option<Contract>,
    pub(super) capacity_mbps: Option<f64>,
    pub(super) bias: Bias,
    /// (time, share in force from then), one per evaluation.
    pub(super) history: VecDeque<(u64, f64)>,
    /// At the last evaluation: its share before the bias and in force.
    pub(super) base: f64,
    pub(super) share: f64,
}

impl CdnCommit {
    /// Its share in force at `ms` (`now` before the history).
    pub(super) fn share_at(&self, ms: u64, now: f64) -> f64 {
        self.history
            .iter()
            .rev()
            .find(|(t, _)| *t <= ms)
            .map_or(now, |&(_, s)| s)
    }

    /// Its mean share since `from_ms` (`now` without a history).
    pub(super) fn share_since(&self, from_ms: u64, now: f64) -> f64 {
        let recent: Vec<f64> = self
            .history
            .iter()
            .filter(|(t, _)| *t >= from_ms)
            .map(|&(_, s)| s)
            .collect();
        if recent.is_empty() {
            now
        } else {
            recent.iter().sum::<f64>() / recent.len() as f64
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct HostCommit {
    pub(super) settings: CommitSettings,
    pub(super) cdns: Vec<CdnCommit>,
    /// The next evaluation, Unix ms (a multiple of the period).
    pub(super) next_ms: u64,
    /// The evaluation in force (Unix ms, 0: none yet), and in a set the node that
    /// made it.
    pub(super) at_ms: u64,
    pub(super) by: Option<String>,
    /// A set's evaluation refused for this policy's bounds (Unix ms, 0: none): not
    /// looked at again.
    pub(super) refused_ms: u64,
}

/// The biases one name would take at an evaluation (not yet in force).
#[derive(Clone, Debug, PartialEq)]
pub struct Proposal {
    pub name: String,
    /// The evaluation: the period boundary at or before the time it was made.
    pub at_ms: u64,
    /// By CDN.
    pub biases: Vec<(String, Bias)>,
}

/// The commit modifier: the ledger and each name's biases.
#[derive(Clone, Debug, Default)]
pub struct Commit {
    pub ledger: Ledger,
    pub(super) hosts: BTreeMap<String, HostCommit>,
}

/// What is saved across restarts: the ledger and the biases in force.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SavedCommit {
    pub ledger: Ledger,
    /// By name, then CDN.
    pub biases: BTreeMap<String, BTreeMap<String, Bias>>,
}

/// One CDN's contract state, for `/v1/state`, `explain`, metrics and the status page.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CdnView {
    pub name: String,
    pub cdn: String,
    pub billing: Option<&'static str>,
    /// In the contract's unit (GB, or Mbit/s for p95).
    pub commit: Option<f64>,
    pub cap: Option<f64>,
    pub capacity_mbps: Option<f64>,
    pub month_to_date_bytes: f64,
    pub projection_bytes: Option<f64>,
    /// p95 billing: the month's 95th percentile so far and the samples above the cap.
    pub p95_mbps: Option<f64>,
    pub samples_above_cap: Option<u64>,
    pub burst_budget_left: Option<i64>,
    /// The latest record's rate.
    pub rate_mbps: Option<f64>,
    pub bias_points: f64,
    pub floored: bool,
    pub reason: &'static str,
    /// Mean share of the regions it serves: before the bias, and in force.
    pub base_share: f64,
    pub share: f64,
    /// The evaluation in force (Unix ms), and in a set the node that made it.
    pub evaluated_unix_ms: Option<u64>,
    pub evaluated_by: Option<String>,
}

/// One line of `explain` for a CDN with a contract or a capacity.
pub fn explain_line(f: &mut std::fmt::Formatter, c: &CdnView) -> std::fmt::Result {
    let gb = |b: f64| b / 1e9;
    write!(
        f,
        "commit:  {} {}: {:.1} GB month to date",
        c.cdn,
        c.billing.unwrap_or(if c.capacity_mbps.is_some() {
            "capacity only"
        } else {
            "no contract"
        }),
        gb(c.month_to_date_bytes)
    )?;
    if let Some(p) = c.projection_bytes {
        write!(f, ", projected {:.1} GB", gb(p))?;
    }
    if let (Some(commit), Some(cap)) = (c.commit, c.cap) {
        write!(f, " (commit {commit}, cap {cap})")?;
    }
    if let Some(left) = c.burst_budget_left {
        write!(f, ", burst budget left {left} samples")?;
    }
    if let Some(cap) = c.capacity_mbps {
        write!(f, ", capacity {cap} Mbit/s")?;
    }
    writeln!(
        f,
        "; bias {:+.2} points{} ({})",
        c.bias_points,
        if c.floored { ", at the floor" } else { "" },
        c.reason
    )
}

/// A name's evaluation period, ms (at least 1).
/// Whether biases of an evaluation at `at_ms` stay within the policy's bounds relative
/// to those in force in `h`, as every evaluation made here does ([`super::bias::bias`]):
/// a bias rises at most `max_shift_points` a period since the evaluation in force (any
/// distance from none) and never past `max_bias_points`; it falls to 0 at once (out of
/// the performance band), and below 0 by a step a period, never past
/// `-max_bias_points`, but for a `p95_mbps` CDN that clamps at once when its burst
/// budget is spent; only a CDN with a `capacity_mbps` is put at the floor.
fn within_bounds(h: &HostCommit, at_ms: u64, biases: &[(String, Bias)]) -> Result<(), String> {
    let s = &h.settings;
    let eps = 1e-6;
    let steps = match h.at_ms {
        0 => f64::INFINITY,
        t => (at_ms.saturating_sub(t) / period_ms(s)).max(1) as f64 * s.max_shift_points,
    };
    for (cdn, next) in biases {
        let Some(c) = h.cdns.iter().find(|c| c.name == *cdn) else {
            continue;
        };
        if next.floored {
            if c.capacity_mbps.is_none() {
                return Err(format!("{cdn}: at the floor without a capacity_mbps"));
            }
            continue;
        }
        let (p, prev, max) = (next.points, c.bias.points, s.max_bias_points);
        let clamps = matches!(c.contract, Some(Contract::P95Mbps { .. }));
        let fits = if !p.is_finite() {
            false
        } else if p > prev {
            p - prev <= steps + eps && p <= max.max(prev) + eps
        } else if p >= 0.0 || (clamps && p >= -100.0) {
            true
        } else {
            p >= (-max).min(prev) - eps && p >= prev.min(0.0) - steps - eps
        };
        if !fits {
            return Err(format!(
                "{cdn}: a bias of {p} points from {prev}, the policy allows ± {max}, {} a period",
                s.max_shift_points
            ));
        }
    }
    Ok(())
}

pub(super) fn period_ms(s: &CommitSettings) -> u64 {
    (s.shift_period.as_millis() as u64).max(1)
}

pub(super) fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// Whether CDN `cdn` of region `region` of `name` is outside its performance band
/// (what performance steering says); the commit modifier never raises it.
pub type OutsideBand<'a> = &'a dyn Fn(&str, usize, usize) -> bool;

impl Commit {
    /// Follows a (re)loaded policy: names with a contract or a capacity get a
    /// controller; the bias of a CDN whose contract and capacity are unchanged goes on.
    pub fn configure(&mut self, policy: &Policy, now_ms: u64) {
        let mut old = std::mem::take(&mut self.hosts);
        for host in &policy.hosts {
            if !host
                .cdns
                .iter()
                .any(|c| c.contract.is_some() || c.capacity_mbps.is_some())
            {
                continue;
            }
            let name = host.name.to_string();
            let prev = old.remove(&name);
            let cdns = host
                .cdns
                .iter()
                .map(|c| {
                    let kept = prev.as_ref().and_then(|p| {
                        p.cdns.iter().find(|o| {
                            o.name == c.name
                                && o.contract == c.contract
                                && o.capacity_mbps == c.capacity_mbps
                        })
                    });
                    match kept {
                        Some(k) => k.clone(),
                        None => CdnCommit {
                            name: c.name.clone(),
                            contract: c.contract,
                            capacity_mbps: c.capacity_mbps,
                            bias: Bias::default(),
                            history: VecDeque::new(),
                            base: 0.0,
                            share: 0.0,
                        },
                    }
                })
                .collect();
            // Evaluations fall on multiples of the period: every node of a set
            // evaluates at the same times.
            let period = period_ms(&host.commit);
            let (next_ms, at_ms, by) = match prev {
                Some(p) if p.settings == host.commit => (p.next_ms, p.at_ms, p.by),
                Some(p) => ((now_ms / period + 1) * period, p.at_ms, p.by),
                None => ((now_ms / period + 1) * period, 0, None),
            };
            self.hosts.insert(
                name,
                HostCommit {
                    settings: host.commit.clone(),
                    cdns,
                    next_ms,
                    at_ms,
                    by,
                    refused_ms: 0,
                },
            );
        }
    }

    /// Takes a usage record; `Err` when no steered name has that CDN.
    pub fn record(
        &mut self,
        policy: &Policy,
        cdn: &str,
        start_ms: u64,
        r: Record,
    ) -> Result<Taken, UsageError> {
        if !policy.has_cdn(cdn) {
            return Err(UsageError::UnknownCdn(cdn.to_string()));
        }
        Ok(self.ledger.record(cdn, start_ms, r))
    }

    /// When the next evaluation is due (Unix ms).
    pub fn next_due_ms(&self) -> Option<u64> {
        self.hosts.values().map(|h| h.next_ms).min()
    }

    /// Evaluates every name due at `now_ms` against `base` (the policy after the
    /// modifiers before this one) and puts the biases in force. True when a bias
    /// changed.
    pub fn evaluate(&mut self, base: &Policy, outside: OutsideBand, now_ms: u64) -> bool {
        let mut changed = false;
        for p in self.take_due(base, outside, now_ms) {
            changed |= self
                .adopt(base, outside, &p.name, p.at_ms, None, &p.biases)
                .unwrap_or(false);
        }
        changed
    }

    /// The biases every name due at `now_ms` would take (each evaluated at its period
    /// boundary), not yet in force; their next evaluation moves a period on. A node
    /// of a set writes these for the set ([`Commit::adopt`] takes the set's).
    pub fn take_due(&mut self, base: &Policy, outside: OutsideBand, now_ms: u64) -> Vec<Proposal> {
        self.ledger.prune(now_ms);
        let mut out = Vec::new();
        for host in &base.hosts {
            let name = host.name.to_string();
            let Some(h) = self.hosts.get_mut(&name) else {
                continue;
            };
            if h.next_ms > now_ms || h.cdns.len() != host.cdns.len() {
                continue;
            }
            let period = period_ms(&h.settings);
            let at = now_ms - now_ms % period;
            h.next_ms = at + period;
            let (base_mean, share_mean, may_raise) =
                means(host, &h.cdns, h.settings.floor_percent, outside, &name);
            let biases = h
                .cdns
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let share = share_mean[i];
                    let usage = self.ledger.usage(&c.name, at);
                    let then = usage.last.map_or(share, |(t, _)| c.share_at(t, share));
                    // The week's peak, each rate scaled from the share then to now.
                    let peak = usage
                        .recent
                        .iter()
                        .map(|&(t, m)| {
                            let then = c.share_at(t, share);
                            if then > 0.0 {
                                m * share / then
                            } else {
                                m
                            }
                        })
                        .reduce(f64::max);
                    let facts = Facts {
                        contract: c.contract,
                        capacity_mbps: c.capacity_mbps,
                        usage: &usage,
                        month: Month::of(at),
                        now_ms: at,
                        share,
                        base: base_mean[i],
                        share_then: then,
                        share_recent: c
                            .share_since(at.saturating_sub(super::ledger::RECENT_MS), share),
                        peak_mbps: peak,
                        may_raise: may_raise[i],
                        period_ms: period,
                    };
                    (
                        c.name.clone(),
                        super::bias::bias(&h.settings, c.bias, &facts),
                    )
                })
                .collect();
            out.push(Proposal {
                name,
                at_ms: at,
                biases,
            });
        }
        out
    }

    /// Puts in force the biases of `name`'s evaluation at `at_ms` (made here, or by
    /// node `by` of the set), unless the one in force is as new. A CDN the biases do
    /// not name keeps its own. `Ok(true)` when a bias changed; `Err` says which of this
    /// policy's bounds the biases break ([`within_bounds`]): they are not put in force,
    /// and that evaluation is not looked at again.
    pub fn adopt(
        &mut self,
        base: &Policy,
        outside: OutsideBand,
        name: &str,
        at_ms: u64,
        by: Option<&str>,
        biases: &[(String, Bias)],
    ) -> Result<bool, String> {
        let Some(host) = base.host(name) else {
            return Ok(false);
        };
        let Some(h) = self.hosts.get_mut(name) else {
            return Ok(false);
        };
        if at_ms <= h.at_ms || h.cdns.len() != host.cdns.len() {
            return Ok(false);
        }
        if let Err(why) = within_bounds(h, at_ms, biases) {
            h.refused_ms = at_ms;
            return Err(why);
        }
        let mut changed = false;
        for c in &mut h.cdns {
            let Some(&(_, next)) = biases.iter().find(|(n, _)| *n == c.name) else {
                continue;
            };
            if next.points != c.bias.points || next.floored != c.bias.floored {
                changed = true;
                tracing::info!(name = %name, cdn = %c.name, from = c.bias.points, to = next.points, floored = next.floored, reason = next.reason.as_str(), by = by.unwrap_or("this node"), "commit bias");
            }
            c.bias = next;
        }
        h.at_ms = at_ms;
        h.by = by.map(String::from);
        // The shares in force from now, remembered to scale rates measured then.
        let (base_mean, share_mean, _) =
            means(host, &h.cdns, h.settings.floor_percent, outside, name);
        for ((c, b), s) in h.cdns.iter_mut().zip(base_mean).zip(share_mean) {
            c.base = b;
            c.share = s;
            c.history.push_back((at_ms, s));
            while c.history.len() > HISTORY {
                c.history.pop_front();
            }
        }
        Ok(changed)
    }

    /// Whether the set's evaluation of `name` at `at_ms` is to be put in force here:
    /// `name` has a controller here, the evaluation is newer than the one in force,
    /// and not from a clock more than a period ahead of `now_ms`.
    pub fn takes(&self, name: &str, at_ms: u64, now_ms: u64) -> bool {
        self.hosts
            .get(name)
            .is_some_and(|h| at_ms > h.at_ms && at_ms != h.refused_ms)
            && !self.ahead(name, at_ms, now_ms)
    }

    /// Whether an evaluation of `name` at `at_ms` is [`far_ahead`] of `now_ms`: kept,
    /// it would hold every node of a set until then.
    pub fn ahead(&self, name: &str, at_ms: u64, now_ms: u64) -> bool {
        self.hosts
            .get(name)
            .is_some_and(|h| far_ahead(at_ms, period_ms(&h.settings), now_ms))
    }

    /// `base` with every biased region's weights replaced; `None` when no bias is in
    /// force (the policy applies as it came).
    pub fn apply(&self, base: &Policy, outside: OutsideBand) -> Option<Policy> {
        let active = self.hosts.values().any(|h| {
            h.cdns
                .iter()
                .any(|c| c.bias.floored || c.bias.points != 0.0)
        });
        if !active {
            return None;
        }
        let mut out = base.clone();
        for host in &mut out.hosts {
            let name = host.name.to_string();
            let Some(h) = self.hosts.get(&name) else {
                continue;
            };
            if h.cdns.len() != host.cdns.len() {
                continue;
            }
            let biases: Vec<Bias> = h.cdns.iter().map(|c| c.bias).collect();
            for (r, region) in host.regions.iter_mut().enumerate() {
                let shares = policy_shares(&region.weights);
                let raise: Vec<bool> = (0..shares.len()).map(|i| !outside(&name, r, i)).collect();
                let biased = super::bias::apply(&shares, &biases, h.settings.floor_percent, &raise);
                let biased = weights_of(&biased);
                if biased != region.weights {
                    region.moved_by.push("commit");
                }
                region.weights = biased;
            }
        }
        Some(out)
    }

    /// The state of every CDN with a contract or a capacity, at `now_ms`.
    pub fn view(&self, now_ms: u64) -> Vec<CdnView> {
        let month = Month::of(now_ms);
        let mut out = Vec::new();
        for (name, h) in &self.hosts {
            for c in &h.cdns {
                let u = self.ledger.usage(&c.name, now_ms);
                let (p95, above, left) = match c.contract {
                    Some(Contract::P95Mbps { cap_mbps, .. }) => {
                        let above = u.above(cap_mbps);
                        (
                            u.p95(),
                            Some(above),
                            Some(month.burst_allowance() as i64 - above as i64),
                        )
                    }
                    _ => (None, None, None),
                };
                out.push(CdnView {
                    name: name.clone(),
                    cdn: c.name.clone(),
                    billing: c.contract.map(|k| k.billing()),
                    commit: c.contract.map(|k| k.bounds().0),
                    cap: c.contract.map(|k| k.bounds().1),
                    capacity_mbps: c.capacity_mbps,
                    month_to_date_bytes: u.bytes,
                    projection_bytes: u.projection(&month),
                    p95_mbps: p95.map(round2),
                    samples_above_cap: above,
                    burst_budget_left: left,
                    rate_mbps: u.last.map(|(_, m)| round2(m)),
                    bias_points: round2(c.bias.points),
                    floored: c.bias.floored,
                    reason: c.bias.reason.as_str(),
                    base_share: round2(c.base),
                    share: round2(c.share),
                    evaluated_unix_ms: (h.at_ms > 0).then_some(h.at_ms),
                    evaluated_by: h.by.clone(),
                });
            }
        }
        out
    }

    /// The view of one name's CDNs (`explain`).
    pub fn name_view(&self, name: &str, now_ms: u64) -> Vec<CdnView> {
        self.view(now_ms)
            .into_iter()
            .filter(|v| v.name.eq_ignore_ascii_case(name))
            .collect()
    }

    /// The biases in force of `name`'s CDNs (empty: no contract or capacity there).
    pub fn biases(&self, name: &str) -> Vec<Bias> {
        self.hosts
            .get(name)
            .map(|h| h.cdns.iter().map(|c| c.bias).collect())
            .unwrap_or_default()
    }

    /// What is saved.
    pub fn saved(&self) -> SavedCommit {
        SavedCommit {
            ledger: self.ledger.clone(),
            biases: self
                .hosts
                .iter()
                .map(|(n, h)| {
                    (
                        n.clone(),
                        h.cdns.iter().map(|c| (c.name.clone(), c.bias)).collect(),
                    )
                })
                .collect(),
        }
    }

    /// Takes back what was saved (after [`Commit::configure`]): the ledger, and the
    /// biases of the CDNs still configured.
    pub fn restore(&mut self, saved: &SavedCommit) {
        self.ledger = saved.ledger.clone();
        for (name, biases) in &saved.biases {
            let Some(h) = self.hosts.get_mut(name) else {
                continue;
            };
            for c in &mut h.cdns {
                if let Some(b) = biases.get(&c.name) {
                    c.bias = *b;
                }
            }
        }
    }

    /// Sets the commit gauges (`steerdns_commit_*`).
    pub fn export(&self, metrics: &crate::metrics::Metrics, now_ms: u64) {
        for v in self.view(now_ms) {
            metrics.commit_cdn(
                &v.name,
                &v.cdn,
                v.month_to_date_bytes,
                v.projection_bytes,
                v.burst_budget_left,
                v.bias_points,
                v.reason,
            );
        }
    }
}

/// Each CDN's mean share over the regions it serves: before the bias (`host`'s
/// weights), and with the biases in force; and whether it may be raised (within its
/// performance band in every region it serves).
pub(super) fn means(
    host: &crate::config::HostPolicy,
    cdns: &[CdnCommit],
    floor: f64,
    outside: OutsideBand,
    name: &str,
) -> (Vec<f64>, Vec<f64>, Vec<bool>) {
    let n = host.cdns.len();
    let biases: Vec<Bias> = cdns.iter().map(|c| c.bias).collect();
    let (mut base, mut now, mut count) = (vec![0.0; n], vec![0.0; n], vec![0usize; n]);
    let mut raise = vec![true; n];
    for (r, region) in host.regions.iter().enumerate() {
        let shares = policy_shares(&region.weights);
        let flags: Vec<bool> = (0..n).map(|i| !outside(name, r, i)).collect();
        let biased = super::bias::apply(&shares, &biases, floor, &flags);
        for i in 0..n {
            if shares[i] > 0.0 {
                base[i] += shares[i];
                now[i] += biased[i];
                count[i] += 1;
                raise[i] &= flags[i];
            }
        }
    }
    for i in 0..n {
        if count[i] > 0 {
            base[i] /= count[i] as f64;
            now[i] /= count[i] as f64;
        }
    }
    (base, now, raise)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_evaluation_is_far_ahead_only_past_a_period_or_a_minute() {
        let text = "hostname: www.example.com
cdns:
  a: { cname: a.cdn.test., contract: { billing: gb_month, commit_gb: 100, cap_gb: 200 } }
  b: { cname: b.cdn.test. }
regions:
  - match: [\"*\"]
    weights: { a: 50, b: 50 }
commit: { shift_period_seconds: 0.5 }
";
        let policy = crate::config::parse(std::path::Path::new("steering.yaml"), text.into())
            .unwrap()
            .0;
        let mut c = Commit::default();
        let now = 1_796_083_200_000;
        c.configure(&policy, now);
        let name = "www.example.com.";
        // A node 2 s behind a set that evaluates every 0.5 s takes the set's evaluation.
        assert!(!c.ahead(name, now + 2_000, now));
        assert!(c.takes(name, now + 2_000, now));
        // A key written an hour ahead is not taken.
        assert!(c.ahead(name, now + 3_600_000, now));
        assert!(!c.takes(name, now + 3_600_000, now));
    }

    #[test]
    fn a_sets_biases_outside_the_policys_bounds_are_refused_once() {
        // ±30 points, 5 a period of 1 s (the defaults but the period); b has a capacity.
        let text = "hostname: www.example.com
cdns:
  a: { cname: a.cdn.test., contract: { billing: gb_month, commit_gb: 100, cap_gb: 200 } }
  b: { cname: b.cdn.test., capacity_mbps: 1000 }
regions:
  - match: [\"*\"]
    weights: { a: 50, b: 50 }
commit: { shift_period_seconds: 1, max_shift_points: 5, max_bias_points: 30 }
";
        let policy = crate::config::parse(std::path::Path::new("steering.yaml"), text.into())
            .unwrap()
            .0;
        let mut c = Commit::default();
        let t = 1_796_083_200_000;
        c.configure(&policy, t);
        let name = "www.example.com.";
        let outside: OutsideBand = &|_, _, _| false;
        let bias = |points: f64, floored: bool| Bias {
            points,
            floored,
            reason: crate::control::modifiers::commit::bias::Reason::CommitBehind,
        };
        let adopt = |c: &mut Commit, at: u64, cdn: &str, b: Bias| {
            c.adopt(
                &policy,
                outside,
                name,
                at,
                Some("ns2"),
                &[(cdn.to_string(), b)],
            )
        };
        // From none, anything within ±30; beyond, refused and not looked at again.
        let e = adopt(&mut c, t + 1_000, "a", bias(-100.0, false)).unwrap_err();
        assert!(e.contains("-100 points"), "{e}");
        assert!(!c.takes(name, t + 1_000, t + 1_000));
        assert_eq!(adopt(&mut c, t + 2_000, "a", bias(20.0, false)), Ok(true));
        // Then 5 points a period: 10 in one period is refused, 10 in two is taken.
        let e = adopt(&mut c, t + 3_000, "a", bias(30.0, false)).unwrap_err();
        assert!(e.contains("a bias of 30 points from 20"), "{e}");
        assert_eq!(adopt(&mut c, t + 4_000, "a", bias(30.0, false)), Ok(true));
        // At the floor: only a CDN with a capacity.
        assert!(adopt(&mut c, t + 5_000, "a", bias(-45.0, true)).is_err());
        assert_eq!(adopt(&mut c, t + 6_000, "b", bias(-45.0, true)), Ok(true));
        // Off the floor, back towards 0 from beyond ±30, a step at a time.
        assert_eq!(adopt(&mut c, t + 7_000, "b", bias(-40.0, false)), Ok(true));
        assert!(adopt(&mut c, t + 8_000, "b", bias(-30.0, false)).is_err());
        // Down to 0 at once (out of its performance band), then below by a step.
        assert_eq!(adopt(&mut c, t + 9_000, "a", bias(0.0, false)), Ok(true));
        assert!(adopt(&mut c, t + 10_000, "a", bias(-10.0, false)).is_err());
        assert_eq!(adopt(&mut c, t + 11_000, "a", bias(-5.0, false)), Ok(true));
    }
}
