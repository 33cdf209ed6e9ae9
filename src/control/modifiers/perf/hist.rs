//! Control plane, performance steering: a log-bucketed histogram of positive integers
//! (milliseconds, bits per second), merged by adding counts.
//!
//! Values below 16 have a bucket each; above, each power of two is cut into 16 equal
//! buckets, so a bucket is at most 1/16 (6.25 %) of its value wide. A percentile is the
//! middle of the bucket its rank falls in.

/// Sub-buckets per power of two, and the values below which buckets are exact.
const SUB: u64 = 16;
const SUB_BITS: u32 = 4;
/// Buckets: exact values 0..16, then 16 per power of two up to 2^48.
pub(crate) const BUCKETS: usize = (SUB + (48 - SUB_BITS as u64) * SUB) as usize;
/// The largest value kept exactly in its bucket (above: the last bucket).
pub(crate) const MAX_VALUE: u64 = (1 << 48) - 1;

/// The bucket of `v`.
pub(crate) fn index(v: u64) -> usize {
    let v = v.min(MAX_VALUE);
    if v < SUB {
        return v as usize;
    }
    let e = 63 - v.leading_zeros(); // floor(log2 v) >= 4
    let sub = (v >> (e - SUB_BITS)) - SUB; // 0..16
    (SUB + u64::from(e - SUB_BITS) * SUB + sub) as usize
}

/// The lowest value of bucket `i` and its width.
pub(crate) fn bounds(i: usize) -> (u64, u64) {
    let i = i as u64;
    if i < SUB {
        return (i, 1);
    }
    let e = (i - SUB) / SUB + u64::from(SUB_BITS);
    let sub = (i - SUB) % SUB;
    let width = 1u64 << (e - u64::from(SUB_BITS));
    ((SUB + sub) * width, width)
}

/// The value a percentile falling in bucket `i` is reported as: its middle.
pub(crate) fn value(i: usize) -> u64 {
    let (low, width) = bounds(i);
    low + width / 2
}

/// Counts per bucket, kept sparse: (bucket, count), sorted by bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Hist(pub Vec<(u16, u32)>);

impl Hist {
    /// Whether `v`'s bucket already has a count (adding `v` takes no new entry).
    pub fn has(&self, v: u64) -> bool {
        let i = index(v).min(BUCKETS - 1) as u16;
        self.0.binary_search_by_key(&i, |&(b, _)| b).is_ok()
    }

    pub fn add(&mut self, v: u64) {
        self.add_count(index(v), 1);
    }

    fn add_count(&mut self, i: usize, n: u32) {
        let i = i.min(BUCKETS - 1) as u16;
        match self.0.binary_search_by_key(&i, |&(b, _)| b) {
            Ok(at) => self.0[at].1 = self.0[at].1.saturating_add(n),
            Err(at) => self.0.insert(at, (i, n)),
        }
    }

    /// Adds another histogram's counts.
    pub fn merge(&mut self, other: &Hist) {
        for &(i, n) in &other.0 {
            self.add_count(usize::from(i), n);
        }
    }

    pub fn count(&self) -> u64 {
        self.0.iter().map(|&(_, n)| u64::from(n)).sum()
    }

    /// The `p`-th percentile (0 < p <= 100): the middle of the bucket holding the
    /// sample of rank ceil(p × count / 100); `None` when empty.
    pub fn percentile(&self, p: u32) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = (total * u64::from(p)).div_ceil(100).max(1);
        let mut seen = 0;
        for &(i, n) in &self.0 {
            seen += u64::from(n);
            if seen >= rank {
                return Some(value(usize::from(i)));
            }
        }
        self.0.last().map(|&(i, _)| value(usize::from(i)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_narrow() {
        let mut next = 0;
        for i in 0..BUCKETS {
            let (low, width) = bounds(i);
            assert_eq!(low, next, "bucket {i}");
            assert_eq!(index(low), i);
            assert_eq!(index(low + width - 1), i);
            assert!(low < 16 || width * 16 <= low, "bucket {i} too wide");
            next = low + width;
        }
        assert_eq!(next, MAX_VALUE + 1);
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn exact_figures() {
        // 78 ms falls in [76, 80), 80 in [80, 84), 300 in [288, 304).
        assert_eq!((bounds(index(78)), value(index(78))), ((76, 4), 78));
        assert_eq!((bounds(index(80)), value(index(80))), ((80, 4), 82));
        assert_eq!((bounds(index(300)), value(index(300))), ((288, 16), 296));
        let mut h = Hist::default();
        assert_eq!(h.percentile(75), None);
        // 100 samples: 1..=100 ms; p75 is the 75th, 75 ms, in [72, 76): reported 74.
        for v in 1..=100 {
            h.add(v);
        }
        assert_eq!(h.count(), 100);
        assert_eq!(h.percentile(75), Some(74));
        assert_eq!(h.percentile(25), Some(25));
        assert_eq!(h.percentile(100), Some(102));
        // Merging adds counts: twice the samples, same percentiles.
        let twice = {
            let mut t = h.clone();
            t.merge(&h);
            t
        };
        assert_eq!(twice.count(), 200);
        assert_eq!(twice.percentile(75), Some(74));
        // Three quarters fast, one quarter slow: p75 is the last fast sample.
        let mut m = Hist::default();
        for _ in 0..75 {
            m.add(80);
        }
        for _ in 0..25 {
            m.add(300);
        }
        assert_eq!(m.percentile(75), Some(82));
        m.add(300);
        assert_eq!(m.percentile(75), Some(296));
    }
}
