//! Data plane (lookup) and input (building): a database's networks as flat sorted
//! tables, the form both the geo and the ASN database are looked up in.
//!
//! A database walk at load yields every network of the tree (with data, and the empty
//! ones between), sorted by start. [`Starts`] keeps the starts with a first-level index
//! on the top 16 bits: a lookup is one index read and a binary search over the few
//! networks under that /16. The value of each network lives in the caller's columns, by
//! the position [`Starts::find`] returns.
//!
//! The walk of an IPv6 database skips the aliases of the IPv4 space (`::ffff:0:0/96`,
//! `2002::/16`, ...): they are the blocks between its IPv6 networks ([`gaps`]), and
//! [`Aliases::v4`] turns an address there into the IPv4 address it stands for.

use super::wider::Bits;

/// An address as an unsigned integer.
pub(super) trait Key: Bits {
    const MAX: Self;
    fn top16(self) -> usize;
    /// The next address, if any.
    fn next(self) -> Option<Self>;
    /// The address before (`self` is above zero).
    fn prev(self) -> Self;
    /// Whether `self` lies in the network starting at `start` with `prefix` bits.
    fn within(self, start: Self, prefix: u8) -> bool {
        self >= start && self <= start.last(prefix)
    }
}

/// `Key` for an unsigned integer type of `$bits` bits.
macro_rules! key {
    ($t:ty, $bits:expr) => {
        impl Key for $t {
            const MAX: $t = <$t>::MAX;
            fn top16(self) -> usize {
                (self >> ($bits - 16)) as usize
            }
            fn next(self) -> Option<$t> {
                self.checked_add(1)
            }
            fn prev(self) -> $t {
                self - 1
            }
        }
    };
}

key!(u32, 32);
key!(u64, 64);
key!(u128, 128);

/// The sorted starts of one table's networks, indexed by their top 16 bits.
pub(super) struct Starts<K> {
    starts: Box<[K]>,
    /// `index[h]`: the first entry whose start's top 16 bits are `h` or more
    /// (65,537 entries; the last is `starts.len()`).
    index: Box<[u32]>,
}

impl<K: Key> Starts<K> {
    /// The index over `starts`, which must be sorted.
    pub(super) fn new(starts: Vec<K>) -> Starts<K> {
        debug_assert!(starts.is_sorted());
        let starts = starts.into_boxed_slice();
        let index = (0..=1usize << 16)
            .map(|h| starts.partition_point(|s| s.top16() < h) as u32)
            .collect();
        Starts { starts, index }
    }

    /// The position of the network holding `ip`, given each network's prefix length.
    ///
    /// # Hot path
    /// One index read and a binary search among the networks starting under the same
    /// /16 (plus the one before, which may extend into it); no allocation.
    pub(super) fn find(&self, ip: K, prefix: impl Fn(usize) -> u8) -> Option<usize> {
        let h = ip.top16();
        let lo = (self.index[h] as usize).saturating_sub(1);
        let hi = self.index[h + 1] as usize;
        let slice = self.starts.get(lo..hi)?;
        let i = lo + slice.partition_point(|s| *s <= ip).checked_sub(1)?;
        ip.within(self.starts[i], prefix(i)).then_some(i)
    }

    pub(super) fn as_slice(&self) -> &[K] {
        &self.starts
    }
}

/// The range `from..=to` as aligned blocks, each with its prefix.
fn blocks<K: Key>(mut from: K, to: K, out: &mut Vec<(K, u8)>) {
    loop {
        // The widest block starting at `from` that ends by `to`.
        let p = (0..=K::BITS)
            .find(|&p| from.first(p) == from && from.last(p) <= to)
            .unwrap_or(K::BITS);
        out.push((from, p));
        match from.last(p).next() {
            Some(n) if n <= to => from = n,
            _ => return,
        }
    }
}

/// The blocks between sorted networks `(start, prefix)` of a family (and before and
/// after them), as aligned blocks, each with its prefix: what the walk skipped.
fn gaps<K: Key>(networks: impl Iterator<Item = (K, u8)>) -> Vec<(K, u8)> {
    let mut gaps = Vec::new();
    let mut from = Some(K::ZERO);
    for (s, prefix) in networks {
        if let Some(f) = from.filter(|&f| f < s) {
            blocks(f, s.prev(), &mut gaps);
        }
        from = s.last(prefix).next();
    }
    if let Some(f) = from {
        blocks(f, K::MAX, &mut gaps);
    }
    gaps
}

/// The blocks of an IPv6 database that its walk skips, each with its prefix.
#[derive(Default)]
pub(super) struct Aliases(Box<[(u128, u8)]>);

impl Aliases {
    /// The blocks an IPv6 walk skipped between its sorted `networks` (none for an IPv4
    /// database, `ipv6` false: its walk skips nothing).
    pub(super) fn skipped(ipv6: bool, networks: impl Iterator<Item = (u128, u8)>) -> Aliases {
        if !ipv6 {
            return Aliases::default();
        }
        Aliases(gaps(networks).into_boxed_slice())
    }

    /// The IPv4 address an IPv6 address in an alias stands for (the 32 bits past the
    /// alias's prefix), and that prefix.
    pub(super) fn v4(&self, a: u128) -> Option<(u32, u8)> {
        let i = self.0.partition_point(|&(s, _)| s <= a).checked_sub(1)?;
        let (start, prefix) = self.0[i];
        if prefix > 96 || !a.within(start, prefix) {
            return None;
        }
        Some(((a >> (96 - prefix)) as u32, prefix))
    }

    #[cfg(test)]
    pub(crate) fn as_slice(&self) -> &[(u128, u8)] {
        &self.0
    }
}
