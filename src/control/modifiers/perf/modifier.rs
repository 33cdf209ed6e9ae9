//! Control plane, performance steering: the weight modifier, pure.
//!
//! From a region's policy weights and the measured value of each CDN, a **target**
//! share per CDN ([`target`]), then a **slew** from the shares in force towards it, at
//! most `max_shift_points` per period ([`slew`]):
//!
//! - a CDN within `band_percent` of the best keeps its policy share (`perf_band`);
//! - a CDN outside loses `gap − band` percent of its policy share (`perf_penalty`),
//!   never going below `floor_percent` points (`perf_floor`); the gap is relative
//!   (`(value − best) / best`) for time and throughput, in percentage points for
//!   `error_rate`;
//! - what the penalised lose goes to the CDNs in the band, in proportion to their
//!   policy weights, so no CDN ever gets more than its policy share when all perform
//!   alike;
//! - a CDN without enough fresh samples keeps its policy share (`perf_stale`); with
//!   fewer than two CDNs measured the whole region goes back to its policy shares.

use crate::config::perf::{Metric, Performance};

/// Why a CDN has the target share it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(clippy::enum_variant_names)] // serialized as perf_band, perf_penalty, …: the API's words
pub enum PerfReason {
    PerfBand,
    PerfPenalty,
    PerfFloor,
    PerfStale,
}

impl PerfReason {
    pub fn as_str(self) -> &'static str {
        match self {
            PerfReason::PerfBand => "perf_band",
            PerfReason::PerfPenalty => "perf_penalty",
            PerfReason::PerfFloor => "perf_floor",
            PerfReason::PerfStale => "perf_stale",
        }
    }
}

/// The policy shares of `weights`, in points of 100.
pub(crate) fn policy_shares(weights: &[u32]) -> Vec<f64> {
    let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
    weights
        .iter()
        .map(|&w| {
            if total > 0.0 {
                100.0 * f64::from(w) / total
            } else {
                0.0
            }
        })
        .collect()
}

/// How far `value` is from `best`, in percent (percentage points for `error_rate`).
pub(crate) fn gap(metric: Metric, value: f64, best: f64) -> f64 {
    match metric {
        Metric::TtfbP75 => 100.0 * (value - best) / best.max(1.0),
        Metric::ThroughputP25 => 100.0 * (best - value) / best.max(1.0),
        Metric::ErrorRate => 100.0 * (value - best),
    }
}

/// The target shares (points) and their reasons, from the policy `weights` and each
/// CDN's usable measured value (`None`: too few fresh samples).
pub(crate) fn target(
    perf: &Performance,
    weights: &[u32],
    measured: &[Option<f64>],
) -> (Vec<f64>, Vec<PerfReason>) {
    let policy = policy_shares(weights);
    let serving = |i: usize| weights[i] > 0;
    let known: Vec<(usize, f64)> = (0..weights.len())
        .filter(|&i| serving(i))
        .filter_map(|i| Some((i, measured.get(i).copied().flatten()?)))
        .collect();
    let mut reasons: Vec<PerfReason> = (0..weights.len())
        .map(|i| match measured.get(i).copied().flatten() {
            Some(_) if known.len() >= 2 => PerfReason::PerfBand,
            _ => PerfReason::PerfStale,
        })
        .collect();
    if known.len() < 2 {
        return (policy, reasons);
    }
    let best = match perf.metric {
        Metric::ThroughputP25 => known.iter().map(|&(_, v)| v).fold(f64::MIN, f64::max),
        Metric::TtfbP75 | Metric::ErrorRate => {
            known.iter().map(|&(_, v)| v).fold(f64::MAX, f64::min)
        }
    };
    let mut shares = policy.clone();
    let mut lost = 0.0;
    for &(i, v) in &known {
        let g = gap(perf.metric, v, best);
        if g <= perf.band_percent {
            continue;
        }
        let kept = policy[i] * (1.0 - ((g - perf.band_percent) / 100.0).min(1.0));
        let floor = perf.floor_percent.min(policy[i]);
        (shares[i], reasons[i]) = if kept <= floor {
            (floor, PerfReason::PerfFloor)
        } else {
            (kept, PerfReason::PerfPenalty)
        };
        lost += policy[i] - shares[i];
    }
    let receivers: f64 = known
        .iter()
        .filter(|&&(i, _)| reasons[i] == PerfReason::PerfBand)
        .map(|&(i, _)| policy[i])
        .sum();
    if receivers > 0.0 {
        for &(i, _) in &known {
            if reasons[i] == PerfReason::PerfBand {
                shares[i] += lost * policy[i] / receivers;
            }
        }
    }
    (shares, reasons)
}

/// The shares one period later: from `current` towards `target`, moving at most
/// `max_points` points of share in all.
pub(crate) fn slew(current: &[f64], target: &[f64], max_points: f64) -> Vec<f64> {
    let moved: f64 = current
        .iter()
        .zip(target)
        .map(|(c, t)| (t - c).max(0.0))
        .sum();
    if moved <= max_points + 1e-9 {
        return target.to_vec();
    }
    let k = max_points / moved;
    current
        .iter()
        .zip(target)
        .map(|(c, t)| c + (t - c) * k)
        .collect()
}

/// Shares as weights for the planner: basis points (a CDN with any share keeps at
/// least 1).
pub(crate) fn weights_of(shares: &[f64]) -> Vec<u32> {
    shares
        .iter()
        .map(|&s| {
            if s <= 0.0 {
                0
            } else {
                ((s * 100.0).round() as u32).max(1)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perf(metric: Metric) -> Performance {
        Performance::defaults(metric)
    }

    fn close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-9, "{a:?} != {b:?}");
        }
    }

    use PerfReason::*;

    #[test]
    fn a_near_tie_keeps_the_policy() {
        let p = perf(Metric::TtfbP75);
        let (t, r) = target(&p, &[90, 10], &[Some(80.0), Some(78.0)]);
        close(&t, &[90.0, 10.0]);
        assert_eq!(r, [PerfBand, PerfBand]);
    }

    #[test]
    fn a_gap_costs_in_proportion_and_stops_at_the_floor() {
        let p = perf(Metric::TtfbP75);
        // fastly 30 % slower: 20 % over the band, loses 20 % of 90 = 18 points.
        let (t, r) = target(&p, &[90, 10], &[Some(130.0), Some(100.0)]);
        close(&t, &[72.0, 28.0]);
        assert_eq!(r, [PerfPenalty, PerfBand]);
        // 300 vs 78 ms: all of it, down to the floor.
        let (t, r) = target(&p, &[90, 10], &[Some(300.0), Some(78.0)]);
        close(&t, &[10.0, 90.0]);
        assert_eq!(r, [PerfFloor, PerfBand]);
        // What is lost goes to the band in proportion to policy weights.
        let (t, _) = target(&p, &[50, 30, 20], &[Some(300.0), Some(80.0), Some(82.0)]);
        close(&t, &[10.0, 30.0 + 40.0 * 0.6, 20.0 + 40.0 * 0.4]);
        // A floor above the policy share: the policy share.
        let (t, r) = target(&p, &[95, 5], &[Some(80.0), Some(300.0)]);
        close(&t, &[95.0, 5.0]);
        assert_eq!(r, [PerfBand, PerfFloor]);
    }

    #[test]
    fn throughput_and_errors() {
        let p = perf(Metric::ThroughputP25);
        // 3 Mbit/s vs 5: 40 % below, 30 over the band.
        let (t, r) = target(&p, &[50, 50], &[Some(3e6), Some(5e6)]);
        close(&t, &[35.0, 65.0]);
        assert_eq!(r, [PerfPenalty, PerfBand]);
        let p = perf(Metric::ErrorRate);
        // 25 % vs 5 % errors: 20 points, 10 over the band.
        let (t, _) = target(&p, &[50, 50], &[Some(0.25), Some(0.05)]);
        close(&t, &[45.0, 55.0]);
    }

    #[test]
    fn without_two_measured_cdns_nothing_moves() {
        let p = perf(Metric::TtfbP75);
        let (t, r) = target(&p, &[90, 10], &[Some(300.0), None]);
        close(&t, &[90.0, 10.0]);
        assert_eq!(r, [PerfStale, PerfStale]);
        // A third CDN without data keeps its share and gets nothing.
        let (t, r) = target(&p, &[60, 20, 20], &[Some(300.0), Some(80.0), None]);
        close(&t, &[10.0, 70.0, 20.0]);
        assert_eq!(r, [PerfFloor, PerfBand, PerfStale]);
    }

    #[test]
    fn slew_moves_at_most_the_points_of_a_period() {
        let mut s = vec![90.0, 10.0];
        let t = [10.0, 90.0];
        let mut steps = Vec::new();
        while s != t {
            s = slew(&s, &t, 10.0);
            steps.push(s[0]);
        }
        close(&steps, &[80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 20.0, 10.0]);
        // Back to policy at the same pace.
        close(&slew(&[10.0, 90.0], &[90.0, 10.0], 10.0), &[20.0, 80.0]);
        // Moves spread over several receivers count once.
        close(
            &slew(&[50.0, 30.0, 20.0], &[10.0, 54.0, 36.0], 10.0),
            &[40.0, 36.0, 24.0],
        );
        assert_eq!(
            weights_of(&[33.333, 66.667, 0.0, 0.001]),
            [3333, 6667, 0, 1]
        );
    }
}
