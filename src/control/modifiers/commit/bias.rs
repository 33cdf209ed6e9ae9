//! Pure: the bias of one CDN per evaluation ([`bias`]), and a region's shares with
//! the biases applied ([`apply`]). The live controller and `steerdns simulate` both
//! call these, with the same inputs.
//!
//! - `gb_month`: the projected month (the month so far, plus the time not covered at
//!   the recent rate scaled to the share in force) is kept within [commit, cap]: below
//!   `commit + dead band` the bias rises (`commit_behind`), above `cap − dead band` it
//!   falls (`cap_ahead`), in between it holds. One step of `max_shift_points` per
//!   evaluation, within ± `max_bias_points`.
//! - `p95_mbps`: above the cap the free burst budget (432 samples of a 30-day month)
//!   is spent on purpose while it lasts and keeps pace with the month; once spent (a
//!   reserve of two periods kept) the bias clamps the CDN at once so that the week's
//!   peak is under the cap (`burst_budget`); once the budget is on pace again a
//!   clamped CDN rises back at the slew, its peaks riding over the cap on the budget.
//!   Below the commit's 95th percentile it rises, never so far that the week's peak
//!   would reach the cap.
//! - `capacity_mbps`: above 90 % the share stops growing; above 100 % the CDN falls
//!   to the floor in this evaluation (`capacity`), whatever the slew and the bias limit.
//! - A CDN outside its performance band (`perf_penalty`, `perf_floor`) is never raised.

use serde::Serialize;

use crate::config::contract::{CommitSettings, Contract};

use super::ledger::Usage;
use super::month::Month;

/// Why a CDN's bias is what it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// No pressure: the projection is within its bounds (or no contract).
    #[default]
    None,
    /// The projected month is below the commit: the share rises.
    CommitBehind,
    /// The projected month (or the rate, for p95) is above the cap: the share falls.
    CapAhead,
    /// p95: over the cap on the free burst budget, or clamped to the cap once spent.
    BurstBudget,
    /// Over 90 % of `capacity_mbps` (no growth) or over 100 % (at the floor).
    Capacity,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::None => "none",
            Reason::CommitBehind => "commit_behind",
            Reason::CapAhead => "cap_ahead",
            Reason::BurstBudget => "burst_budget",
            Reason::Capacity => "capacity",
        }
    }
}

/// A CDN's bias in force.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Bias {
    /// Points of share added to (or taken from) the CDN in every region it serves.
    pub points: f64,
    /// Over its capacity: at the floor in every region, whatever `points`.
    pub floored: bool,
    pub reason: Reason,
}

/// What one evaluation knows of a CDN.
#[derive(Clone, Debug)]
pub(crate) struct Facts<'a> {
    pub contract: Option<Contract>,
    pub capacity_mbps: Option<f64>,
    pub usage: &'a Usage,
    pub month: Month,
    pub now_ms: u64,
    /// Its share in force (points, mean of the regions it serves).
    pub share: f64,
    /// Its share before the bias (the policy after performance steering).
    pub base: f64,
    /// Its share when its latest record was taken, and its mean share over the
    /// recent window: a rate measured then is scaled to the share in force.
    pub share_then: f64,
    pub share_recent: f64,
    /// The highest rate of the last week, scaled to the share in force (Mbit/s).
    pub peak_mbps: Option<f64>,
    /// Within its performance band wherever it serves: it may be raised.
    pub may_raise: bool,
    /// The evaluation period.
    pub period_ms: u64,
}

fn scaled(rate: f64, now: f64, then: f64) -> f64 {
    if then > 0.0 {
        rate * now / then
    } else {
        rate
    }
}

/// The bias after one evaluation, from `prev`.
pub(crate) fn bias(s: &CommitSettings, prev: Bias, f: &Facts) -> Bias {
    let step = s.max_shift_points;
    let max = s.max_bias_points;
    let db = s.dead_band_percent / 100.0;
    // The rate now (Mbit/s), at the share in force.
    let now_mbps = f.usage.last.map(|(_, m)| scaled(m, f.share, f.share_then));
    let at_floor = s.floor_percent.min(f.base) - f.base;
    if let (Some(cap), Some(m)) = (f.capacity_mbps, now_mbps) {
        if m > cap && !prev.floored {
            return Bias {
                points: at_floor,
                floored: true,
                reason: Reason::Capacity,
            };
        }
    }
    let mut points = if prev.floored { at_floor } else { prev.points };
    let share = f.base + points;
    // The rate at a share, from the latest record.
    let at_share = |sh: f64| now_mbps.map(|m| scaled(m, sh, f.share));
    let under_capacity = |sh: f64| match (f.capacity_mbps, at_share(sh)) {
        (Some(c), Some(m)) => m <= 0.9 * c,
        _ => true,
    };
    if prev.floored && !under_capacity(share) {
        return Bias {
            points,
            floored: true,
            reason: Reason::Capacity,
        };
    }
    let (want, mut reason) = match f.contract {
        None => (-points.clamp(-step, step), Reason::None),
        Some(Contract::GbMonth { commit_gb, cap_gb }) => {
            let (commit, cap) = (commit_gb * 1e9, cap_gb * 1e9);
            let band = db * commit;
            let left = (f.month.len_ms() as f64 / 1000.0 - f.usage.covered_s).max(0.0);
            match f.usage.recent_bps {
                None => (0.0, prev.reason),
                Some(r) => {
                    let p = f.usage.bytes + scaled(r, share, f.share_recent) * left;
                    // The share whose projection is `aim` (the rate in proportion to
                    // the share): a move stops there rather than cross the dead band.
                    let per_point = if f.share_recent > 0.0 {
                        r * left / f.share_recent
                    } else {
                        0.0
                    };
                    let to = |aim: f64| {
                        if per_point > 0.0 {
                            (aim - f.usage.bytes) / per_point - share
                        } else {
                            f64::INFINITY
                        }
                    };
                    let middle = (commit + cap) / 2.0;
                    if p < commit + band {
                        let aim = (commit + 2.0 * band).min(middle);
                        (to(aim).clamp(0.0, step), Reason::CommitBehind)
                    } else if p > cap - band {
                        let aim = (cap - 2.0 * band).max(middle);
                        (to(aim).clamp(-step, 0.0), Reason::CapAhead)
                    } else {
                        (0.0, Reason::None)
                    }
                }
            }
        }
        Some(Contract::P95Mbps {
            commit_mbps,
            cap_mbps,
        }) => {
            let allowed = f.month.burst_allowance() as f64;
            let used = f.usage.above(cap_mbps) as f64;
            let reserve = 2.0 * (f.period_ms as f64 / 300_000.0).ceil() + 2.0;
            let on_pace = used <= allowed * f.month.elapsed(f.now_ms) + allowed / 4.0;
            let spent = allowed - used <= reserve || !on_pace;
            match at_share(share) {
                None => (0.0, prev.reason),
                Some(m) => {
                    // The week's peak at the share in force, or now if higher.
                    let high = f.peak_mbps.unwrap_or(m).max(m);
                    if m > cap_mbps && !spent {
                        // Spent on purpose: this peak rides over the cap for free.
                        (0.0, Reason::BurstBudget)
                    } else if spent && high > cap_mbps * (1.0 - db) {
                        // Spent: clamp at once, so that the week's peak at the new
                        // share is under the cap by the dead band.
                        let target = share * cap_mbps * (1.0 - db) / high - f.base;
                        points = points.min(target.max(-100.0));
                        (0.0, Reason::BurstBudget)
                    } else {
                        let p95 = f.usage.p95().unwrap_or(0.0);
                        // Rising only while the week's peak would stay under the cap.
                        let room = |sh: f64| scaled(high, sh, share) <= cap_mbps * (1.0 - db);
                        if p95 < commit_mbps * (1.0 - db) && room(share + step) {
                            (step, Reason::CommitBehind)
                        } else if points < 0.0 && room(share + step) {
                            (step.min(-points), Reason::None)
                        } else if points < 0.0 && !spent {
                            // Clamped earlier, the budget on pace again: back towards
                            // the policy at the slew, the peaks riding over the cap on
                            // the budget until it is off pace again.
                            (step.min(-points), Reason::BurstBudget)
                        } else if m > cap_mbps * (1.0 - db) {
                            (0.0, Reason::CapAhead)
                        } else {
                            (0.0, Reason::None)
                        }
                    }
                }
            }
        }
    };
    let mut want = want;
    if !f.may_raise && points > 0.0 {
        // Outside its performance band: no raise is in force, and a later one starts
        // again from the policy at the slew.
        points = 0.0;
    }
    if want > 0.0 && points >= 0.0 && !f.may_raise {
        want = 0.0;
    }
    if want > 0.0 && !under_capacity(share + want) {
        want = 0.0;
        reason = Reason::Capacity;
    }
    let moved = points + want;
    points = if want > 0.0 {
        moved.min(max.max(points))
    } else if want < 0.0 {
        moved.max((-max).min(points))
    } else {
        points
    };
    Bias {
        points,
        floored: false,
        reason,
    }
}

/// A region's shares (points of 100, by CDN) with each CDN's bias applied: what a
/// biased CDN gains is taken from the CDNs without a bias in proportion to their
/// room above the floor; what it loses goes to those within their performance band
/// (`may_raise`) in proportion to their shares. A CDN not serving here (0) stays at 0.
pub(crate) fn apply(shares: &[f64], biases: &[Bias], floor: f64, may_raise: &[bool]) -> Vec<f64> {
    let n = shares.len();
    let serving = |i: usize| shares[i] > 0.0;
    let lowest = |i: usize| floor.min(shares[i]);
    let mut delta: Vec<f64> = (0..n)
        .map(|i| {
            let b = biases.get(i).copied().unwrap_or_default();
            if !serving(i) {
                0.0
            } else if b.floored {
                lowest(i) - shares[i]
            } else if b.points > 0.0 && may_raise.get(i).copied().unwrap_or(true) {
                b.points.min(100.0 - shares[i])
            } else if b.points < 0.0 {
                (shares[i] + b.points).max(lowest(i)) - shares[i]
            } else {
                0.0
            }
        })
        .collect();
    let biased = |i: usize| {
        let b = biases.get(i).copied().unwrap_or_default();
        b.floored || b.points != 0.0
    };
    let free: Vec<usize> = (0..n).filter(|&i| serving(i) && !biased(i)).collect();
    let net: f64 = delta.iter().sum();
    let mut out = shares.to_vec();
    if net > 1e-12 {
        let room: f64 = free.iter().map(|&i| shares[i] - lowest(i)).sum();
        let pos: f64 = delta.iter().filter(|d| **d > 0.0).sum();
        if room < net {
            // Not enough to take from: the gains shrink to what there is.
            let k = ((pos - net) + room) / pos;
            delta.iter_mut().filter(|d| **d > 0.0).for_each(|d| *d *= k);
        }
        let net: f64 = delta.iter().sum();
        for &i in &free {
            if room > 0.0 {
                out[i] -= net * (shares[i] - lowest(i)) / room;
            }
        }
    } else if net < -1e-12 {
        let mut sinks: Vec<usize> = free
            .iter()
            .copied()
            .filter(|&i| may_raise.get(i).copied().unwrap_or(true))
            .collect();
        if sinks.is_empty() && biases.iter().any(|b| b.floored) {
            // Capacity is a hard limit: anyone not at it takes the load.
            sinks = (0..n)
                .filter(|&i| serving(i) && !biases.get(i).is_some_and(|b| b.floored))
                .collect();
        }
        let total: f64 = sinks.iter().map(|&i| shares[i]).sum();
        if total <= 0.0 {
            // Nobody may take it: the losses shrink to the gains.
            let pos: f64 = delta.iter().filter(|d| **d > 0.0).sum();
            let neg: f64 = -delta.iter().filter(|d| **d < 0.0).sum::<f64>();
            let k = if neg > 0.0 { pos / neg } else { 0.0 };
            delta.iter_mut().filter(|d| **d < 0.0).for_each(|d| *d *= k);
        } else {
            for &i in &sinks {
                out[i] -= net * shares[i] / total;
            }
        }
    }
    for (o, d) in out.iter_mut().zip(&delta) {
        *o = (*o + d).max(0.0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::contract::CommitSettings;

    const DEC: u64 = 1_796_083_200_000;
    const DAY: u64 = 86_400_000;

    fn close(a: &[f64], b: &[f64]) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-6, "{a:?} != {b:?}");
        }
    }

    fn b(points: f64) -> Bias {
        Bias {
            points,
            ..Bias::default()
        }
    }

    #[test]
    fn a_bias_is_taken_from_and_given_to_the_unbiased() {
        close(
            &apply(&[30.0, 70.0], &[b(10.0), b(0.0)], 5.0, &[true, true]),
            &[40.0, 60.0],
        );
        close(
            &apply(&[30.0, 70.0], &[b(-10.0), b(0.0)], 5.0, &[true, true]),
            &[20.0, 80.0],
        );
        // Never below the floor, whatever the bias.
        close(
            &apply(&[30.0, 70.0], &[b(-40.0), b(0.0)], 5.0, &[true, true]),
            &[5.0, 95.0],
        );
        // Spread over two in proportion.
        close(
            &apply(
                &[20.0, 40.0, 40.0],
                &[b(-10.0), b(0.0), b(0.0)],
                5.0,
                &[true; 3],
            ),
            &[10.0, 45.0, 45.0],
        );
        // Not serving here: untouched.
        close(
            &apply(&[0.0, 100.0], &[b(10.0), b(0.0)], 5.0, &[true, true]),
            &[0.0, 100.0],
        );
    }

    #[test]
    fn a_cdn_outside_its_band_is_never_raised() {
        // Its own bias up: nothing.
        close(
            &apply(&[30.0, 70.0], &[b(10.0), b(0.0)], 5.0, &[false, true]),
            &[30.0, 70.0],
        );
        // Another's loss does not go to it either.
        close(
            &apply(&[30.0, 70.0], &[b(0.0), b(-10.0)], 5.0, &[false, true]),
            &[30.0, 70.0],
        );
        // But over capacity the load must go somewhere.
        let floored = Bias {
            floored: true,
            ..Bias::default()
        };
        close(
            &apply(&[30.0, 70.0], &[b(0.0), floored], 5.0, &[false, true]),
            &[95.0, 5.0],
        );
    }

    fn facts(usage: &Usage, contract: Contract, share: f64) -> Facts<'_> {
        Facts {
            contract: Some(contract),
            capacity_mbps: None,
            usage,
            month: Month::of(DEC),
            now_ms: DEC + 15 * DAY,
            share,
            base: share,
            share_then: share,
            share_recent: share,
            peak_mbps: None,
            may_raise: true,
            period_ms: 3_600_000,
        }
    }

    /// Fifteen days at `gb_per_day` GB, five-minute records, the last at `mbps`.
    fn usage(gb_per_day: f64) -> Usage {
        let mut l = super::super::ledger::Ledger::default();
        for i in 0..(15 * 288) {
            l.record(
                "a",
                DEC + i * 300_000,
                super::super::ledger::Record {
                    seconds: 300,
                    bytes: gb_per_day * 1e9 / 288.0,
                },
            );
        }
        l.usage("a", DEC + 15 * DAY)
    }

    #[test]
    fn a_month_behind_its_commit_rises_by_the_slew_and_stops_at_the_limit() {
        let s = CommitSettings::default();
        // 15 days at 10 GB a day: 310 GB projected, commit 500.
        let u = usage(10.0);
        let c = Contract::GbMonth {
            commit_gb: 500.0,
            cap_gb: 800.0,
        };
        let f = facts(&u, c, 30.0);
        let next = bias(&s, Bias::default(), &f);
        assert_eq!(
            next,
            Bias {
                points: s.max_shift_points,
                floored: false,
                reason: Reason::CommitBehind
            }
        );
        let at_limit = bias(&s, b(29.5), &f);
        assert_eq!(at_limit.points, 30.0);
        assert_eq!(bias(&s, b(30.0), &f).points, 30.0);
        // Outside its performance band: no rise.
        let f = Facts {
            may_raise: false,
            ..facts(&u, c, 30.0)
        };
        assert_eq!(bias(&s, Bias::default(), &f).points, 0.0);
        // Within [commit + band, cap − band]: holds.
        let c = Contract::GbMonth {
            commit_gb: 300.0,
            cap_gb: 800.0,
        };
        assert_eq!(
            bias(&s, b(4.0), &facts(&u, c, 30.0)),
            Bias {
                points: 4.0,
                floored: false,
                reason: Reason::None
            }
        );
        // Above the cap: falls.
        let c = Contract::GbMonth {
            commit_gb: 100.0,
            cap_gb: 200.0,
        };
        let down = bias(&s, b(4.0), &facts(&u, c, 30.0));
        assert_eq!((down.points, down.reason), (2.0, Reason::CapAhead));
    }

    #[test]
    fn a_step_stops_inside_the_dead_band_rather_than_cross_it() {
        let s = CommitSettings {
            max_shift_points: 10.0,
            ..CommitSettings::default()
        };
        // 310 GB projected at 30 %; a 320 GB commit is 10.3 GB (1 point) away: the
        // bias rises to the share projecting 320 + 2 × 9.6 GB, not by 10 points.
        let u = usage(10.0);
        let f = facts(
            &u,
            Contract::GbMonth {
                commit_gb: 320.0,
                cap_gb: 800.0,
            },
            30.0,
        );
        let up = bias(&s, Bias::default(), &f);
        let expect = (339.2 - 150.0) / (160.0 / 30.0) - 30.0;
        assert!((up.points - expect).abs() < 1e-6, "{up:?} {expect}");
        // And down from the cap alike.
        let f = facts(
            &u,
            Contract::GbMonth {
                commit_gb: 200.0,
                cap_gb: 300.0,
            },
            30.0,
        );
        let down = bias(&s, Bias::default(), &f);
        let expect = (288.0 - 150.0) / (160.0 / 30.0) - 30.0;
        assert!((down.points - expect).abs() < 1e-6, "{down:?} {expect}");
    }

    #[test]
    fn the_projection_follows_the_share_in_force() {
        let s = CommitSettings::default();
        // 310 GB at the old share; the share in force is 1.7 times it: 15 × 10 +
        // 16 × 17 = 422 GB: still behind a 430 GB commit, ahead of a 400 GB one.
        let u = usage(10.0);
        let mut f = facts(
            &u,
            Contract::GbMonth {
                commit_gb: 430.0,
                cap_gb: 800.0,
            },
            17.0,
        );
        f.share_recent = 10.0;
        f.base = 17.0;
        assert_eq!(bias(&s, Bias::default(), &f).reason, Reason::CommitBehind);
        f.contract = Some(Contract::GbMonth {
            commit_gb: 400.0,
            cap_gb: 800.0,
        });
        assert_eq!(bias(&s, Bias::default(), &f).reason, Reason::None);
    }

    #[test]
    fn over_capacity_falls_to_the_floor_at_once() {
        let s = CommitSettings::default();
        // 10 GB a day = 0.926 Mbit/s.
        let u = usage(10.0);
        let c = Contract::GbMonth {
            commit_gb: 500.0,
            cap_gb: 800.0,
        };
        let mut f = facts(&u, c, 40.0);
        f.capacity_mbps = Some(0.9);
        let floored = bias(&s, b(0.0), &f);
        assert_eq!((floored.floored, floored.reason), (true, Reason::Capacity));
        close(
            &apply(
                &[40.0, 60.0],
                &[floored, b(0.0)],
                s.floor_percent,
                &[true; 2],
            ),
            &[5.0, 95.0],
        );
        // Between 90 and 100 %: no growth.
        f.capacity_mbps = Some(1.0);
        let held = bias(&s, b(0.0), &f);
        assert_eq!((held.points, held.reason), (0.0, Reason::Capacity));
        // Back under: off the floor, rising by the slew at most.
        f.capacity_mbps = Some(100.0);
        f.share = 5.0;
        f.share_then = 5.0;
        let back = bias(&s, floored, &f);
        assert!(!back.floored);
        assert!(
            (back.points - (-35.0 + s.max_shift_points)).abs() < 1e-9,
            "{back:?}"
        );
    }

    #[test]
    fn p95_spends_the_burst_budget_then_clamps_to_the_cap() {
        let s = CommitSettings::default();
        // The last record: 0.926 Mbit/s, over a 0.5 cap.
        let u = usage(10.0);
        let c = Contract::P95Mbps {
            commit_mbps: 0.2,
            cap_mbps: 0.5,
        };
        // Every sample is above the cap: 4,320 of 446 allowed, spent.
        let f = facts(&u, c, 40.0);
        let clamped = bias(&s, Bias::default(), &f);
        assert_eq!(clamped.reason, Reason::BurstBudget);
        let expect = 40.0 * 0.5 * 0.97 / (10.0 * 8.0 / 86_400.0 * 1e3) - 40.0;
        assert!(
            (clamped.points - expect).abs() < 1e-6,
            "{clamped:?} {expect}"
        );
        // A budget left: the peak rides.
        let mut quiet = usage(1.0);
        quiet.last = Some((DEC + 15 * DAY - 300_000, 0.926));
        let f = facts(&quiet, c, 40.0);
        assert_eq!(
            bias(&s, Bias::default(), &f),
            Bias {
                points: 0.0,
                floored: false,
                reason: Reason::BurstBudget
            }
        );
        // Clamped earlier, the budget on pace again: back towards the policy at the
        // slew, though the week's peak would ride over the cap (it spends the budget).
        let mut calm = usage(1.0);
        calm.last = Some((DEC + 15 * DAY - 300_000, 0.3));
        let mut f = facts(&calm, c, 40.0);
        f.peak_mbps = Some(0.926);
        let back = bias(&s, b(-10.0), &f);
        assert_eq!(
            (back.points, back.reason),
            (-10.0 + s.max_shift_points, Reason::BurstBudget)
        );
        // Below the commit with room under the cap: rises.
        let c = Contract::P95Mbps {
            commit_mbps: 0.5,
            cap_mbps: 2.0,
        };
        let f = facts(&quiet, c, 40.0);
        assert_eq!(bias(&s, Bias::default(), &f).reason, Reason::CommitBehind);
    }
}
