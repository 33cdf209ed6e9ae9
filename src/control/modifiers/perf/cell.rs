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
//!
//! Memory: a cell is bounded (ten buckets, each at most [`MAX_NETWORKS_PER_BUCKET`]
//! networks and two histograms of at most `hist::BUCKETS` entries), and every cell of
//! the process draws on one [`Budget`] of entries ([`BUDGET_ENTRIES`]): a cell taking
//! its first sample costs [`CELL_ENTRIES`], a new network or histogram entry in a
//! bucket one more, and a bucket that slides out of the window gives its entries back.
//! Past the budget a sample that would need more is refused (`refused_budget`), so
//! names × regions × CDNs cannot add up to more than the budget.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use super::hist::Hist;
use crate::config::perf::{Metric, Performance};

/// Buckets per window.
pub(crate) const SLOTS: u64 = 10;
/// The most of a cell's samples that one source network may hold.
pub(crate) const NETWORK_SHARE_PERCENT: u64 = 5;
/// The most source networks one bucket keeps: a sample from another network is refused
/// (counted as over its share), so a spread of source networks cannot grow memory.
pub(crate) const MAX_NETWORKS_PER_BUCKET: usize = 4096;

/// The entries all the cells of a process may hold: about 32 bytes each (a network's
/// count in a bucket's map, a histogram's (bucket, count)), so about 128 MiB.
pub(crate) const BUDGET_ENTRIES: u64 = 4 << 20;
/// What a cell costs, in entries, once it takes its first sample (its ten buckets).
pub(crate) const CELL_ENTRIES: u64 = SLOTS * 8;

/// The process-wide budget of performance samples' memory, in entries, shared by every
/// cell ([`Cell::record`] takes from it, a bucket reset gives back). Cells are changed
/// under the `Samples` lock; the counter is atomic so that it can be read without it.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: u64,
    used: AtomicU64,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget::new(BUDGET_ENTRIES)
    }
}

impl Budget {
    pub(crate) fn new(limit: u64) -> Budget {
        Budget {
            limit,
            used: AtomicU64::new(0),
        }
    }

    /// Takes `n` entries; false (nothing taken) when they would go past the limit.
    fn take(&self, n: u64) -> bool {
        let used = self.used.load(Ordering::Relaxed);
        if used.saturating_add(n) > self.limit {
            return false;
        }
        self.used.store(used + n, Ordering::Relaxed);
        true
    }

    fn give(&self, n: u64) {
        let used = self.used.load(Ordering::Relaxed);
        self.used.store(used.saturating_sub(n), Ordering::Relaxed);
    }

    /// Entries in use.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Entries in use, counted anew (after cells were dropped or kept by a reload).
    pub(crate) fn set(&self, n: u64) {
        self.used.store(n, Ordering::Relaxed);
    }
}

/// What became of one sample offered to a cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Accepted,
    /// Its network already held its share of the window, or the bucket keeps its most
    /// networks (counted in [`Cell::refused`]).
    RefusedShare,
    /// The process-wide [`Budget`] is spent.
    RefusedBudget,
}

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

    /// What the bucket holds of the [`Budget`].
    fn entries(&self) -> u64 {
        (self.nets.len() + self.ttfb.0.len() + self.throughput.0.len()) as u64
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

    /// What the cell holds of the [`Budget`].
    pub(crate) fn entries(&self) -> u64 {
        if self.buckets.is_empty() {
            return 0;
        }
        CELL_ENTRIES + self.buckets.iter().map(Bucket::entries).sum::<u64>()
    }

    /// Adds a sample from network `net` at `now_ms`, within `budget`; refused when the
    /// network already holds its share of the window (counted in `refused`) or the
    /// budget is spent.
    pub(crate) fn record(
        &mut self,
        perf: &Performance,
        net: u64,
        s: &Sample,
        now_ms: u64,
        budget: &Budget,
    ) -> Outcome {
        let (mut total, mut mine) = (0u64, 0u64);
        for b in self.window(perf, now_ms) {
            total += b.samples();
            mine += u64::from(b.nets.get(&net).copied().unwrap_or(0));
        }
        let start = (u64::from(perf.min_samples) * NETWORK_SHARE_PERCENT).div_ceil(100);
        let share = (total + 1) * NETWORK_SHARE_PERCENT / 100;
        if mine + 1 > start.max(share) {
            self.refused += 1;
            return Outcome::RefusedShare;
        }
        self.add(perf, net, s, now_ms, budget)
    }

    /// Adds a sample of this node's own prober (the vantage point's network `net`):
    /// the operator's measurement, not a client's claim, so not held to a network's
    /// share. Refused only when the bucket already keeps its most networks or the
    /// budget is spent.
    pub(crate) fn record_own(
        &mut self,
        perf: &Performance,
        net: u64,
        s: &Sample,
        now_ms: u64,
        budget: &Budget,
    ) -> Outcome {
        self.add(perf, net, s, now_ms, budget)
    }

    fn add(
        &mut self,
        perf: &Performance,
        net: u64,
        s: &Sample,
        now_ms: u64,
        budget: &Budget,
    ) -> Outcome {
        if self.buckets.is_empty() {
            // A new cell: its buckets first.
            if !budget.take(CELL_ENTRIES) {
                return Outcome::RefusedBudget;
            }
            self.buckets = vec![Bucket::default(); SLOTS as usize];
        }
        let b = self.bucket(perf, now_ms, budget);
        let new_net = !b.nets.contains_key(&net);
        if b.nets.len() >= MAX_NETWORKS_PER_BUCKET && new_net {
            self.refused += 1;
            return Outcome::RefusedShare;
        }
        let new_entries = u64::from(new_net)
            + u64::from(s.ttfb_ms.is_some_and(|t| !b.ttfb.has(t)))
            + u64::from(s.throughput_bps.is_some_and(|t| !b.throughput.has(t)));
        if !budget.take(new_entries) {
            return Outcome::RefusedBudget;
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
        Outcome::Accepted
    }

    /// The bucket of `now_ms` (the buckets are laid out), emptied first when it held an
    /// older slot, its entries given back to `budget`.
    fn bucket(&mut self, perf: &Performance, now_ms: u64, budget: &Budget) -> &mut Bucket {
        let slot = now_ms / width_ms(perf);
        let b = &mut self.buckets[(slot % SLOTS) as usize];
        if b.slot != slot {
            budget.give(b.entries());
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

    /// Whether `c` takes the sample, with no budget to speak of.
    fn rec(c: &mut Cell, p: &Performance, net: u64, s: &Sample, now_ms: u64) -> bool {
        c.record(p, net, s, now_ms, &Budget::new(u64::MAX)) == Outcome::Accepted
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
                assert!(rec(&mut c, &p, net, &s, t0 + i));
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
        assert!(rec(&mut c, &p, 40, &ttfb(300), t0 + 200));
        assert_eq!(aggregate(c.window(&p, t0 + 200)).ttfb_p75_ms, Some(296));

        // The window slides: 9 buckets (270 s) later the samples still count, 10 later
        // they are gone.
        assert_eq!(aggregate(c.window(&p, t0 + 270_000)).samples, 81);
        assert_eq!(aggregate(c.window(&p, t0 + 300_000)).samples, 0);
        // A new sample in the old bucket's place replaces it (50 ms: [50, 52) → 51).
        assert!(rec(&mut c, &p, 1, &ttfb(50), t0 + 300_000));
        let a = aggregate(c.window(&p, t0 + 300_000));
        assert_eq!((a.samples, a.ttfb_p75_ms, a.networks), (1, Some(51), 1));
    }

    #[test]
    fn too_few_samples_or_networks_do_not_count() {
        let p = perf();
        let mut c = Cell::default();
        // 49 samples from 20 networks: one short.
        for i in 0..49u64 {
            assert!(rec(&mut c, &p, i % 20, &ttfb(80), i));
        }
        assert_eq!(aggregate(c.window(&p, 100)).usable(&p), None);
        assert!(rec(&mut c, &p, 19, &ttfb(80), 100));
        assert_eq!(aggregate(c.window(&p, 100)).usable(&p), Some(82.0));
        // 60 samples from 4 networks (the start allowance is 3 each: 12 taken).
        let mut c = Cell::default();
        let taken = (0..60u64)
            .filter(|&i| rec(&mut c, &p, i % 4, &ttfb(80), i))
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
            .filter(|&net| rec(&mut c, &p, net, &ttfb(80), 1000))
            .count();
        assert_eq!(taken, MAX_NETWORKS_PER_BUCKET);
        assert_eq!(c.refused, 5_000 - MAX_NETWORKS_PER_BUCKET as u64);
        // A network already kept still counts.
        assert!(rec(&mut c, &p, 7, &ttfb(80), 1001));
        assert_eq!(aggregate(c.window(&p, 1001)).networks, 4096);
    }

    #[test]
    fn one_network_holds_at_most_five_percent() {
        let p = perf();
        let mut c = Cell::default();
        // 100 networks, 10 samples each: 1000 samples.
        for i in 0..1000u64 {
            assert!(rec(&mut c, &p, 1000 + i % 100, &ttfb(80), i));
        }
        // One network floods: it gets 5 % of the total, (1000 + n + 1) × 5 / 100 ≥ n + 1
        // → n = 52; then all refused.
        let taken = (0..10_000u64)
            .filter(|&i| rec(&mut c, &p, 7, &ttfb(300), 2000 + i))
            .count();
        assert_eq!(taken, 52);
        assert_eq!(c.refused, 10_000 - 52);
        let a = aggregate(c.window(&p, 20_000));
        assert_eq!(a.samples, 1052);
        // p75 stays where the honest samples put it.
        assert_eq!(a.ttfb_p75_ms, Some(82));
    }

    #[test]
    fn every_cell_draws_on_one_budget() {
        let p = perf();
        // Room for two cells and a few entries more.
        let budget = Budget::new(2 * CELL_ENTRIES + 10);
        let (mut a, mut b, mut c) = (Cell::default(), Cell::default(), Cell::default());
        // A cell's first sample: the cell, its network and its histogram entry.
        assert_eq!(a.record(&p, 1, &ttfb(80), 0, &budget), Outcome::Accepted);
        assert_eq!(budget.used(), CELL_ENTRIES + 2);
        assert_eq!(a.entries(), budget.used());
        // The same network and value again cost nothing.
        assert_eq!(a.record(&p, 1, &ttfb(80), 1, &budget), Outcome::Accepted);
        assert_eq!(budget.used(), CELL_ENTRIES + 2);
        assert_eq!(b.record(&p, 1, &ttfb(80), 0, &budget), Outcome::Accepted);
        // A third cell does not fit: refused, not counted as over a network's share.
        assert_eq!(
            c.record(&p, 1, &ttfb(80), 0, &budget),
            Outcome::RefusedBudget
        );
        assert_eq!((c.entries(), c.refused), (0, 0));
        // New networks in the cells fit until the budget is spent (2 entries each).
        let taken = (10..100u64)
            .filter(|&net| a.record(&p, net, &ttfb(1000 * net), 2, &budget) == Outcome::Accepted)
            .count();
        assert_eq!(taken, 3);
        assert_eq!(budget.used(), 2 * CELL_ENTRIES + 10);
        assert_eq!(a.entries() + b.entries(), budget.used());
        // A known network with a known value still counts.
        assert_eq!(a.record(&p, 1, &ttfb(80), 3, &budget), Outcome::Accepted);
        // The window slides past the bucket: its entries come back (not a cell's worth:
        // the third cell is still refused, a network more in a live cell is not).
        let later = 10 * width_ms(&p);
        assert_eq!(
            a.record(&p, 1, &ttfb(80), later, &budget),
            Outcome::Accepted
        );
        assert_eq!(a.entries() + b.entries(), budget.used());
        assert_eq!(
            c.record(&p, 1, &ttfb(80), later, &budget),
            Outcome::RefusedBudget
        );
        assert_eq!(
            b.record(&p, 5, &ttfb(90), later, &budget),
            Outcome::Accepted
        );
    }
}
