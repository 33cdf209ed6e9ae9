//! Pure: the usage ledger, what each CDN carried per interval, as the CDNs' logs or
//! a billing feed report it (`POST /v1/usage`, or the simulator). A record is kept
//! per (CDN, start): a duplicate replaces it (idempotent), a late one fills its
//! place, a missing one is estimated at the recent rate (see [`Usage::projection`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::month::Month;

/// One interval of one CDN's traffic.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Its length, seconds (1 to 86,400).
    pub seconds: u32,
    /// Bytes delivered in it.
    pub bytes: f64,
}

impl Record {
    /// Its mean rate, Mbit/s.
    pub fn mbps(&self) -> f64 {
        self.bytes * 8.0 / f64::from(self.seconds.max(1)) / 1e6
    }
}

/// What became of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// New.
    Added,
    /// The same (CDN, start) was known with other values: replaced.
    Replaced,
    /// Known with the same values: nothing changed.
    Same,
}

/// At most this many records are kept per CDN (a 31-day month of five-minute records
/// and the previous month are 17,856); older ones go first.
pub(crate) const MAX_RECORDS: usize = 20_000;

/// The recent rate is measured over this much (a whole daily cycle).
pub(crate) const RECENT_MS: u64 = 86_400_000;

/// Peaks are looked for over this much (a whole weekly cycle).
pub(crate) const PEAK_MS: u64 = 7 * 86_400_000;

/// The records of every CDN, by CDN name then start (Unix ms).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    pub cdns: BTreeMap<String, BTreeMap<u64, Record>>,
}

/// A CDN's month so far, as the controller reads it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    /// Bytes in the month's records.
    pub bytes: f64,
    /// Seconds of the month the records cover.
    pub covered_s: f64,
    /// Bytes per second over the last [`RECENT_MS`] of records (`None`: none).
    pub recent_bps: Option<f64>,
    /// The latest record's start and rate (Mbit/s).
    pub last: Option<(u64, f64)>,
    /// The month's records' rates (Mbit/s), sorted.
    pub samples_mbps: Vec<f64>,
    /// The records of the last [`PEAK_MS`]: (start, Mbit/s).
    pub recent: Vec<(u64, f64)>,
}

impl Usage {
    /// The month's bytes at its end if the time not covered yet (ahead, and any gap
    /// behind: late and missing records) goes at the recent rate.
    pub fn projection(&self, month: &Month) -> Option<f64> {
        let left = (month.len_ms() as f64 / 1000.0 - self.covered_s).max(0.0);
        Some(self.bytes + self.recent_bps? * left)
    }

    /// Samples above `cap` Mbit/s.
    pub fn above(&self, cap: f64) -> u64 {
        let i = self.samples_mbps.partition_point(|&s| s <= cap);
        (self.samples_mbps.len() - i) as u64
    }

    /// The 95th percentile of the samples so far (the billing's: the top 5 % dropped).
    pub fn p95(&self) -> Option<f64> {
        let n = self.samples_mbps.len();
        if n == 0 {
            return None;
        }
        let dropped = n * 5 / 100;
        Some(self.samples_mbps[n - 1 - dropped])
    }
}

impl Ledger {
    /// Records `r` for (cdn, start); the oldest records go past [`MAX_RECORDS`].
    pub fn record(&mut self, cdn: &str, start_ms: u64, r: Record) -> Taken {
        let records = self.cdns.entry(cdn.to_string()).or_default();
        let taken = match records.insert(start_ms, r) {
            None => Taken::Added,
            Some(old) if old == r => Taken::Same,
            Some(_) => Taken::Replaced,
        };
        while records.len() > MAX_RECORDS {
            records.pop_first();
        }
        taken
    }

    /// Drops every record of a month before `now_ms`'s previous one.
    pub fn prune(&mut self, now_ms: u64) {
        let this = Month::of(now_ms);
        let keep_from = Month::of(this.start_ms.saturating_sub(1)).start_ms;
        for records in self.cdns.values_mut() {
            *records = records.split_off(&keep_from);
        }
        self.cdns.retain(|_, r| !r.is_empty());
    }

    /// `cdn`'s usage in the month of `now_ms`, of the records known at `now_ms`.
    pub fn usage(&self, cdn: &str, now_ms: u64) -> Usage {
        let month = Month::of(now_ms);
        let mut u = Usage::default();
        let Some(records) = self.cdns.get(cdn) else {
            return u;
        };
        let (mut recent_bytes, mut recent_s) = (0.0, 0.0);
        let recent_from = now_ms.saturating_sub(RECENT_MS);
        let peak_from = now_ms.saturating_sub(PEAK_MS);
        for (&start, r) in records.range(peak_from..month.start_ms.max(peak_from)) {
            u.recent.push((start, r.mbps()));
        }
        for (&start, r) in records.range(month.start_ms..month.end_ms.min(now_ms + 1)) {
            u.bytes += r.bytes;
            u.covered_s += f64::from(r.seconds);
            u.samples_mbps.push(r.mbps());
            if start >= recent_from {
                recent_bytes += r.bytes;
                recent_s += f64::from(r.seconds);
            }
            if start >= peak_from {
                u.recent.push((start, r.mbps()));
            }
            u.last = Some((start, r.mbps()));
        }
        // Early in a month, the end of the previous one gives the rate.
        if recent_s == 0.0 {
            for (_, r) in records.range(recent_from..month.start_ms.max(recent_from)) {
                recent_bytes += r.bytes;
                recent_s += f64::from(r.seconds);
            }
        }
        if recent_s > 0.0 {
            u.recent_bps = Some(recent_bytes / recent_s);
        }
        u.samples_mbps.sort_by(f64::total_cmp);
        u
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEC: u64 = 1_796_083_200_000; // 2026-12-01T00:00:00Z
    const FIVE: u64 = 300_000;

    fn r(bytes: f64) -> Record {
        Record {
            seconds: 300,
            bytes,
        }
    }

    #[test]
    fn records_are_idempotent_per_cdn_and_start() {
        let mut l = Ledger::default();
        assert_eq!(l.record("a", DEC, r(100.0)), Taken::Added);
        assert_eq!(l.record("a", DEC, r(100.0)), Taken::Same);
        assert_eq!(l.usage("a", DEC + FIVE).bytes, 100.0);
        assert_eq!(l.record("a", DEC, r(50.0)), Taken::Replaced);
        assert_eq!(l.usage("a", DEC + FIVE).bytes, 50.0);
        assert_eq!(l.record("b", DEC, r(7.0)), Taken::Added);
        assert_eq!(l.usage("a", DEC + FIVE).bytes, 50.0);
    }

    #[test]
    fn a_gap_is_projected_at_the_recent_rate_and_filled_when_it_arrives() {
        let month = Month::of(DEC);
        let mut l = Ledger::default();
        // Ten days at 1,000 B/s, the 3rd day missing.
        for i in 0..(10 * 288) {
            if !(2 * 288..3 * 288).contains(&i) {
                l.record("a", DEC + i * FIVE, r(300_000.0));
            }
        }
        let now = DEC + 10 * 86_400_000;
        let u = l.usage("a", now);
        assert_eq!(u.bytes, 9.0 * 86_400_000.0);
        let full = 31.0 * 86_400_000.0;
        assert!((u.projection(&month).unwrap() - full).abs() < 1.0);
        // The late day arrives: the same projection, now from records.
        for i in 2 * 288..3 * 288 {
            l.record("a", DEC + i * FIVE, r(300_000.0));
        }
        let u = l.usage("a", now);
        assert_eq!(u.bytes, 10.0 * 86_400_000.0);
        assert!((u.projection(&month).unwrap() - full).abs() < 1.0);
        // Records of the next month do not count in this one.
        l.record("a", month.end_ms, r(1e12));
        assert_eq!(l.usage("a", now).bytes, 10.0 * 86_400_000.0);
        assert_eq!(l.usage("nobody", now).projection(&month), None);
    }

    #[test]
    fn the_recent_rate_follows_the_last_day() {
        let month = Month::of(DEC);
        let mut l = Ledger::default();
        for i in 0..(4 * 288) {
            let b = if i < 3 * 288 { 300_000.0 } else { 600_000.0 };
            l.record("a", DEC + i * FIVE, r(b));
        }
        let u = l.usage("a", DEC + 4 * 86_400_000);
        assert!((u.recent_bps.unwrap() - 2000.0).abs() < 1e-6);
        let expect = 5.0 * 86_400_000.0 + 2000.0 * 27.0 * 86_400.0;
        assert!((u.projection(&month).unwrap() - expect).abs() < 1.0);
    }

    #[test]
    fn samples_above_the_cap_and_the_95th_percentile() {
        let mut l = Ledger::default();
        // 100 samples at 1..=100 Mbit/s.
        for i in 1..=100u64 {
            l.record("a", DEC + i * FIVE, r(i as f64 * 1e6 / 8.0 * 300.0));
        }
        let u = l.usage("a", DEC + 101 * FIVE);
        assert_eq!(u.above(90.0), 10);
        assert_eq!(u.above(100.0), 0);
        assert!((u.p95().unwrap() - 95.0).abs() < 1e-6);
        assert_eq!(u.last.map(|(s, _)| s), Some(DEC + 100 * FIVE));
    }

    #[test]
    fn old_months_are_pruned_and_records_bounded() {
        let mut l = Ledger::default();
        l.record("a", DEC - 40 * 86_400_000, r(1.0));
        l.record("a", DEC - 86_400_000, r(1.0));
        l.record("a", DEC, r(1.0));
        l.prune(DEC + 1);
        assert_eq!(l.cdns["a"].len(), 2);
        for i in 0..(MAX_RECORDS as u64 + 10) {
            l.record("b", DEC + i * FIVE, r(1.0));
        }
        assert_eq!(l.cdns["b"].len(), MAX_RECORDS);
        assert!(l.cdns["b"].contains_key(&(DEC + (MAX_RECORDS as u64 + 9) * FIVE)));
    }
}
