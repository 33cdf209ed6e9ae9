//! Control plane, performance steering: the aggregate of one (name, region, CDN) cell,
//! a sliding window of buckets.
//!
//! The window is cut into [`SLOTS`] buckets of `window / SLOTS` each, numbered by wall
//! time (`unix ms / width`), so that every node of a set numbers them alike and their
//! counts can be added. A bucket holds log-bucketed histograms of time to first byte and
//! throughput, the successes and failures, and the samples of each source network
//! (/24, /48).
//!
//! One network may not make a cell: a sample is refused when its network already holds
//! its share of the window, at most [`NETWORK_SHARE_PERCENT`] % of the cell's samples
//! (and at least `ceil(min_samples × 5 %)`, so that a cell can start).

use std::collections::HashMap;

use super::hist::Hist;
use crate::config::perf::{Metric, Performance};

/// Buckets per window.
pub(crate) const SLOTS: u64 = 10;
/// The most of a cell's samples that one source network may hold.
pub(crate) const NETWORK_SHARE_PERCENT: u64 = 5;
/// The most source networks one bucket keeps: a sample from another network is refused
/// (counted as over its share), so a spread of source networks cannot grow memory.
pub(crate) const MAX_NETWORKS_PER_BUCKET: usize = 4096;

/// One measurement of one CDN by one client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    pub ttfb_ms: Option<u64>,
    pub throughput_bps: Option<u64>,
    pub ok: Option<bool>,
}

/// The samples of one slot of the window.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Bucket {
    /// Unix ms / the bucket width.
    pub slot: u64,
    pub ttfb: Hist,
    pub throughput: Hist,
    pub ok: u32,
    pub failed: u32,
    /// Samples in all (the sum of `nets`, kept so that a sample's check does not walk
    /// every network).
    pub samples: u32,
    /// Samples per source network (the /24 or /48, as a number).
    pub nets: HashMap<u64, u32>,
}

impl Bucket {
    fn samples(&self) -> u64 {
        u64::from(self.samples)
    }
}

/// The window of one (name, region, CDN).
#[derive(Clone, Debug, Default)]
pub(crate) struct Cell {
    /// By `slot % SLOTS`.
    buckets: Vec<Bucket>,
    /// Samples refused (one network over its share) since start.
    pub refused: u64,
}

/// What a window holds, merged.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Aggregate {
    /// Samples accepted in the window.
    pub samples: u64,
    pub ttfb_samples: u64,
    pub ttfb_p75_ms: Option<u64>,
    pub throughput_samples: u64,
    pub throughput_p25_bps: Option<u64>,
    /// Samples that said whether they succeeded.
    pub outcomes: u64,
    pub success_rate: Option<f64>,
    /// Distinct source networks in the window.
    pub networks: u64,
}

impl Aggregate {
    /// The value of `metric` and how many samples it rests on.
    pub fn metric(&self, metric: Metric) -> (Option<f64>, u64) {
        match metric {
            Metric::TtfbP75 => (self.ttfb_p75_ms.map(|v| v as f64), self.ttfb_samples),
            Metric::ThroughputP25 => (
                self.throughput_p25_bps.map(|v| v as f64),
                self.throughput_samples,
            ),
            Metric::ErrorRate => (self.success_rate.map(|s| 1.0 - s), self.outcomes),
        }
    }

    /// The value of `metric` when the window has enough of it to move weights:
    /// `min_samples` samples from `min_networks` networks.
    pub fn usable(&self, perf: &Performance) -> Option<f64> {
        let (value, n) = self.metric(perf.metric);
        (n >= u64::from(perf.min_samples) && self.networks >= u64::from(perf.min_networks))
            .then_some(value)
            .flatten()
    }
}

/// The width of a bucket of `perf`'s window, in ms (at least 1).
pub(crate) fn width_ms(perf: &Performance) -> u64 {
    (perf.window.as_millis() as u64 / SLOTS).max(1)
}

/// `perf`'s window in ms, as a set compares it (buckets of another window do not add).
pub(crate) fn window_ms(perf: &Performance) -> u64 {
    perf.window.as_millis() as u64
}

/// Whether bucket `b` is in the window ending at `now_ms`.
pub(crate) fn in_window(b: &Bucket, perf: &Performance, now_ms: u64) -> bool {
    let now = now_ms / width_ms(perf);
    b.slot <= now && b.slot + SLOTS > now
}

impl Cell {
    /// The buckets of the window ending at `now_ms`.
    pub(crate) fn window<'c>(
        &'c self,
        perf: &'c Performance,
        now_ms: u64,
    ) -> impl Iterator<Item = &'c Bucket> + 'c {
        self.buckets
            .iter()
            .filter(move |b| in_window(b, perf, now_ms))
    }

    /// Adds a sample from network `net` at `now_ms`; false when the network already
    /// holds its share of the window (the sample is refused and counted).
    pub(crate) fn record(&mut self, perf: &Performance, net: u64, s: &Sample, now_ms: u64) -> bool {
        let (mut total, mut mine) = (0u64, 0u64);
        for b in self.window(perf, now_ms) {
            total += b.samples();
            mine += u64::from(b.nets.get(&net).copied().unwrap_or(0));
        }
        let start = (u64::from(perf.min_samples) * NETWORK_SHARE_PERCENT).div_ceil(100);
        let share = (total + 1) * NETWORK_SHARE_PERCENT / 100;
        if mine + 1 > start.max(share) {
            self.refused += 1;
            return false;
        }
        self.add(perf, net, s, now_ms)
    }

    /// Adds a sample of this node's own prober (the vantage point's network `net`):
    /// the operator's measurement, not a client's claim, so not held to a network's
    /// share. False only when the bucket already keeps its most networks.
    pub(crate) fn record_own(
        &mut self,
        perf: &Performance,
        net: u64,
        s: &Sample,
        now_ms: u64,
    ) -> bool {
        self.add(perf, net, s, now_ms)
    }

    fn add(&mut self, perf: &Performance, net: u64, s: &Sample, now_ms: u64) -> bool {
        let b = self.bucket(perf, now_ms);
        if b.nets.len() >= MAX_NETWORKS_PER_BUCKET && !b.nets.contains_key(&net) {
            self.refused += 1;
            return false;
        }
        *b.nets.entry(net).or_default() += 1;
        b.samples += 1;
        if let Some(t) = s.ttfb_ms {
            b.ttfb.add(t);
        }
        if let Some(t) = s.throughput_bps {
            b.throughput.add(t);
        }
        match s.ok {
            Some(true) => b.ok += 1,
            Some(false) => b.failed += 1,
            None => {}
        }
        true
    }

    /// The bucket of `now_ms`, emptied first when it held an older slot.
    fn bucket(&mut self, perf: &Performance, now_ms: u64) -> &mut Bucket {
        let slot = now_ms / width_ms(perf);
        if self.buckets.is_empty() {
            self.buckets = vec![Bucket::default(); SLOTS as usize];
        }
        let b = &mut self.buckets[(slot % SLOTS) as usize];
        if b.slot != slot {
            *b = Bucket {
                slot,
                ..Bucket::default()
            };
        }
        b
    }
}

/// Merges buckets (of one node's window or of several nodes') into an aggregate: the
/// same buckets give the same figures whichever node adds them.
pub(crate) fn aggregate<'b>(buckets: impl IntoIterator<Item = &'b Bucket>) -> Aggregate {
    let (mut ttfb, mut throughput) = (Hist::default(), Hist::default());
    let (mut ok, mut failed, mut samples) = (0u64, 0u64, 0u64);
    let mut nets = std::collections::HashSet::new();
    for b in buckets {
        ttfb.merge(&b.ttfb);
        throughput.merge(&b.throughput);
        ok += u64::from(b.ok);
        failed += u64::from(b.failed);
        samples += b.samples();
        nets.extend(b.nets.keys().copied());
    }
    let outcomes = ok + failed;
    Aggregate {
        samples,
        ttfb_samples: ttfb.count(),
        ttfb_p75_ms: ttfb.percentile(75),
        throughput_samples: throughput.count(),
        throughput_p25_bps: throughput.percentile(25),
        outcomes,
        success_rate: (outcomes > 0).then(|| ok as f64 / outcomes as f64),
        networks: nets.len() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perf() -> Performance {
        Performance::defaults(Metric::TtfbP75)
    }

    fn ttfb(ms: u64) -> Sample {
        Sample {
            ttfb_ms: Some(ms),
            ok: Some(true),
            ..Sample::default()
        }
    }

    #[test]
    fn a_window_of_exact_figures() {
        let p = perf();
        let mut c = Cell::default();
        let t0 = 999_990_000; // the start of a 30 s bucket
                              // 40 networks × 2 samples: 60 at 80 ms, 20 at 300 ms; 10 failures.
        for net in 0..40u64 {
            for k in 0..2u64 {
                let i = net * 2 + k;
                let s = Sample {
                    ttfb_ms: Some(if i < 60 { 80 } else { 300 }),
                    throughput_bps: Some(1_000_000 * (i + 1)),
                    ok: Some(i % 8 != 0),
                };
                assert!(c.record(&p, net, &s, t0 + i));
            }
        }
        let a = aggregate(c.window(&p, t0 + 100));
        assert_eq!(a.samples, 80);
        assert_eq!(a.networks, 40);
        assert_eq!(a.ttfb_samples, 80);
        // Rank 60 of 80 is the last 80 ms sample: [80, 84) → 82.
        assert_eq!(a.ttfb_p75_ms, Some(82));
        // Rank 20 of 1..=80 Mbit/s: 20 Mbit/s, in a bucket 2^20 wide starting at
        // 19 × 2^20 = 19 922 944 → its middle, 20 447 232.
        assert_eq!(a.throughput_p25_bps, Some(20_447_232));
        assert_eq!(a.outcomes, 80);
        assert_eq!(a.success_rate, Some(70.0 / 80.0));
        assert_eq!(a.usable(&p), Some(82.0));
        // One more at 300 ms: rank 61 → 296.
        assert!(c.record(&p, 40, &ttfb(300), t0 + 200));
        assert_eq!(aggregate(c.window(&p, t0 + 200)).ttfb_p75_ms, Some(296));

        // The window slides: 9 buckets (270 s) later the samples still count, 10 later
        // they are gone.
        assert_eq!(aggregate(c.window(&p, t0 + 270_000)).samples, 81);
        assert_eq!(aggregate(c.window(&p, t0 + 300_000)).samples, 0);
        // A new sample in the old bucket's place replaces it (50 ms: [50, 52) → 51).
        assert!(c.record(&p, 1, &ttfb(50), t0 + 300_000));
        let a = aggregate(c.window(&p, t0 + 300_000));
        assert_eq!((a.samples, a.ttfb_p75_ms, a.networks), (1, Some(51), 1));
    }

    #[test]
    fn too_few_samples_or_networks_do_not_count() {
        let p = perf();
        let mut c = Cell::default();
        // 49 samples from 20 networks: one short.
        for i in 0..49u64 {
            assert!(c.record(&p, i % 20, &ttfb(80), i));
        }
        assert_eq!(aggregate(c.window(&p, 100)).usable(&p), None);
        assert!(c.record(&p, 19, &ttfb(80), 100));
        assert_eq!(aggregate(c.window(&p, 100)).usable(&p), Some(82.0));
        // 60 samples from 4 networks (the start allowance is 3 each: 12 taken).
        let mut c = Cell::default();
        let taken = (0..60u64)
            .filter(|&i| c.record(&p, i % 4, &ttfb(80), i))
            .count();
        assert_eq!(taken, 12);
        assert_eq!(c.refused, 48);
        assert_eq!(aggregate(c.window(&p, 100)).usable(&p), None);
    }

    #[test]
    fn a_bucket_keeps_a_bounded_number_of_networks() {
        let p = perf();
        let mut c = Cell::default();
        // One sample from each of 5,000 networks in one bucket: the first 4,096 are kept.
        let taken = (0..5_000u64)
            .filter(|&net| c.record(&p, net, &ttfb(80), 1000))
            .count();
        assert_eq!(taken, MAX_NETWORKS_PER_BUCKET);
        assert_eq!(c.refused, 5_000 - MAX_NETWORKS_PER_BUCKET as u64);
        // A network already kept still counts.
        assert!(c.record(&p, 7, &ttfb(80), 1001));
        assert_eq!(aggregate(c.window(&p, 1001)).networks, 4096);
    }

    #[test]
    fn one_network_holds_at_most_five_percent() {
        let p = perf();
        let mut c = Cell::default();
        // 100 networks, 10 samples each: 1000 samples.
        for i in 0..1000u64 {
            assert!(c.record(&p, 1000 + i % 100, &ttfb(80), i));
        }
        // One network floods: it gets 5 % of the total, (1000 + n + 1) × 5 / 100 ≥ n + 1
        // → n = 52; then all refused.
        let taken = (0..10_000u64)
            .filter(|&i| c.record(&p, 7, &ttfb(300), 2000 + i))
            .count();
        assert_eq!(taken, 52);
        assert_eq!(c.refused, 10_000 - 52);
        let a = aggregate(c.window(&p, 20_000));
        assert_eq!(a.samples, 1052);
        // p75 stays where the honest samples put it.
        assert_eq!(a.ttfb_p75_ms, Some(82));
    }
}
