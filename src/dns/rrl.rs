//! Data plane: response rate limiting over UDP, as in NSD, Knot and BIND. A flood with
//! a spoofed source turns steerdns into an amplifier aimed at the owner of that source;
//! RRL bounds what any one client prefix receives.
//!
//! Each client prefix (IPv4 /24 and IPv6 /56 by default) may receive `rate` units of
//! response per second. An answer of up to [`UNIT`] (512) bytes costs one unit, and a
//! larger one one more per started 512 bytes ([`Rrl::charge`], once it is written): a
//! DNSSEC answer (DO=1, 11 times the query's size and more) or an NXDOMAIN with its
//! denial proofs spends the budget faster than a plain steered answer, which costs
//! exactly one. So the budget is in bytes: at most `rate` × 512 bytes a second reach a
//! prefix, whatever the answers' size. Past that, every `slip`-th limited query gets a truncated answer (TC=1,
//! no records: a real client retries over TCP, which cannot be spoofed) and the others
//! are dropped. TCP is never limited. Exempt sources (by default loopback, which the
//! kernel never accepts from the network) are never limited.
//!
//! A client that presents a valid DNS cookie of ours (`cookie.rs`) proved that it
//! receives what is sent to its address: it is no spoofed source. It is counted apart
//! ([`Rrl::check_own`]): by its full address (IPv4 /32, IPv6 /128) in a budget of
//! `rate` responses per second of its own, which a flood from its /24 does not touch;
//! past it, it is dropped, never slipped (a truncated answer would only send a client
//! that is not spoofed to TCP for nothing).
//!
//! The table is a fixed array of atomic counters indexed by a keyed hash of the prefix:
//! constant memory whatever the flood, no locks. Two prefixes that share a slot share
//! its budget (a collision costs the attacker, never the limit: a flood spread over more
//! prefixes than there are slots gets at most `rate` answers per slot and second in all),
//! and a hash key picked at start keeps an attacker from aiming at a victim's slot.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use ipnet::IpNet;

use crate::slots::prefix_key;

/// Slots in the table (512 KiB).
const SLOTS: usize = 1 << 17;
/// Bytes of answer one unit of the budget pays for: an answer costs one unit per
/// started `UNIT` bytes (so one for every answer of at most 512 bytes).
pub const UNIT: usize = 512;
/// Mixed into the key of a full address counted by [`Rrl::check_own`].
const OWN_DOMAIN: u128 = 0x636f_6f6b_6965 << 64;

/// How response rate limiting is set up (`--rrl-*` flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RrlConfig {
    /// Units of response per second per prefix (an answer costs one per started
    /// [`UNIT`] bytes); 0 turns rate limiting off. At most 65,535.
    pub rate: u32,
    /// Every `slip`-th limited query gets a truncated answer; 0: none do.
    pub slip: u32,
    pub ipv4_prefix: u8,
    pub ipv6_prefix: u8,
    /// Sources never limited.
    pub exempt: Vec<IpNet>,
}

impl Default for RrlConfig {
    /// 1,000 responses per second per /24 or /56, slip 2: far above what one resolver's
    /// address block asks of one authoritative server (answers are cached for their
    /// TTL), far below what makes a useful reflection.
    fn default() -> Self {
        RrlConfig {
            rate: 1000,
            slip: 2,
            ipv4_prefix: 24,
            ipv6_prefix: 56,
            exempt: default_exempt(),
        }
    }
}

/// Loopback: a datagram from the network claiming it never reaches a socket.
pub fn default_exempt() -> Vec<IpNet> {
    ["127.0.0.0/8", "::1/128"]
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// What to do with one query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Answer,
    /// Answer with TC=1 and nothing else.
    Slip,
    Drop,
}

pub struct Rrl {
    cfg: RrlConfig,
    /// Per slot: second (16 bits) | responses in it (16 bits), whichever prefixes
    /// hash to it.
    table: Box<[AtomicU32]>,
    key: u64,
    epoch: Instant,
    limited: AtomicU32,
}

impl Rrl {
    /// `None` when `cfg.rate` is 0 (off).
    pub fn new(cfg: RrlConfig) -> Option<Rrl> {
        if cfg.rate == 0 {
            return None;
        }
        Some(Rrl {
            cfg: RrlConfig {
                rate: cfg.rate.min(u32::from(u16::MAX)),
                ipv4_prefix: cfg.ipv4_prefix.min(32),
                ipv6_prefix: cfg.ipv6_prefix.min(128),
                ..cfg
            },
            table: (0..SLOTS).map(|_| AtomicU32::new(0)).collect(),
            key: rand::random::<u64>() | 1,
            epoch: Instant::now(),
            limited: AtomicU32::new(0),
        })
    }

    /// Counts one response to `ip` and says whether it may go.
    ///
    /// # Hot path
    /// A hash and one compare-and-swap on one slot.
    pub fn check(&self, ip: IpAddr) -> Verdict {
        self.check_at(ip, self.epoch.elapsed().as_secs())
    }

    /// Counts one response to `ip`, which presented a valid server cookie: a budget of
    /// its own, by its full address; past it, [`Verdict::Drop`], never a slip.
    ///
    /// # Hot path
    /// A hash and one compare-and-swap on one slot.
    pub fn check_own(&self, ip: IpAddr) -> Verdict {
        self.check_own_at(ip, self.epoch.elapsed().as_secs())
    }

    fn check_own_at(&self, ip: IpAddr, second: u64) -> Verdict {
        if self.cfg.exempt.iter().any(|n| n.contains(&ip)) {
            return Verdict::Answer;
        }
        if self.count(self.own_slot(ip), second) {
            Verdict::Answer
        } else {
            self.limited.fetch_add(1, Ordering::Relaxed);
            Verdict::Drop
        }
    }

    /// [`Rrl::check`] in second `second` since the limiter started.
    fn check_at(&self, ip: IpAddr, second: u64) -> Verdict {
        if self.cfg.exempt.iter().any(|n| n.contains(&ip)) {
            return Verdict::Answer;
        }
        if self.count(self.slot(ip), second) {
            return Verdict::Answer;
        }
        let n = self.limited.fetch_add(1, Ordering::Relaxed);
        if self.cfg.slip > 0 && n.is_multiple_of(self.cfg.slip) {
            Verdict::Slip
        } else {
            Verdict::Drop
        }
    }

    /// Charges the answer of `bytes` just written for `ip` (let through by
    /// [`Rrl::check`], or by [`Rrl::check_own`] when `own`) what it costs beyond the
    /// unit the check counted: one more unit per started [`UNIT`] bytes past the first
    /// 512. It is not taken back: the budget of the rest of the second shrinks.
    ///
    /// # Hot path
    /// Nothing for an answer of at most 512 bytes (every plain steered answer); else a
    /// hash and one compare-and-swap on one slot. No allocation.
    pub fn charge(&self, ip: IpAddr, own: bool, bytes: usize) {
        let extra = extra_units(bytes);
        if extra > 0 {
            self.charge_at(ip, own, extra, self.epoch.elapsed().as_secs());
        }
    }

    fn charge_at(&self, ip: IpAddr, own: bool, extra: u32, second: u64) {
        if self.cfg.exempt.iter().any(|n| n.contains(&ip)) {
            return;
        }
        let slot = if own {
            self.own_slot(ip)
        } else {
            self.slot(ip)
        };
        let slot = &self.table[slot];
        let second = (second & 0xffff) as u32;
        let mut cur = slot.load(Ordering::Relaxed);
        loop {
            let count = if cur >> 16 == second { cur & 0xffff } else { 0 };
            let new = second << 16 | (count + extra).min(0xffff);
            match slot.compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// Counts one response in `slot` in `second`; `false` when its budget is spent.
    fn count(&self, slot: usize, second: u64) -> bool {
        let slot = &self.table[slot];
        let second = (second & 0xffff) as u32;
        let mut cur = slot.load(Ordering::Relaxed);
        loop {
            // Another second's count starts over; a count of this second is kept, whoever
            // it was counted for.
            let count = if cur >> 16 == second { cur & 0xffff } else { 0 };
            if count >= self.cfg.rate {
                break;
            }
            let new = second << 16 | (count + 1);
            match slot.compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
        false
    }

    /// The table index of `ip`'s own budget (a valid cookie): another hash domain than
    /// the prefixes', so that an address is not its /24's slot.
    fn own_slot(&self, ip: IpAddr) -> usize {
        self.hash(prefix_key(ip, 32, 128) ^ OWN_DOMAIN) as usize & (SLOTS - 1)
    }

    /// The table index of `ip`'s prefix.
    fn slot(&self, ip: IpAddr) -> usize {
        (self.hash(self.prefix(ip)) as usize) & (SLOTS - 1)
    }

    fn prefix(&self, ip: IpAddr) -> u128 {
        prefix_key(ip, self.cfg.ipv4_prefix, self.cfg.ipv6_prefix)
    }

    /// Keyed multiply-xorshift over the prefix's two halves.
    fn hash(&self, p: u128) -> u64 {
        let mut h = self.key;
        for half in [p as u64, (p >> 64) as u64] {
            h = (h ^ half).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            h ^= h >> 29;
        }
        h.wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ (h >> 32)
    }
}

/// Units an answer of `bytes` costs beyond the first: one per started [`UNIT`] bytes
/// past the first 512 (at most 65,535).
fn extra_units(bytes: usize) -> u32 {
    (bytes.saturating_sub(1) / UNIT).min(0xffff) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_costs_one_unit_per_started_512_bytes() {
        for (bytes, extra) in [(0, 0), (60, 0), (512, 0), (513, 1), (1024, 1), (1025, 2)] {
            assert_eq!(extra_units(bytes), extra, "{bytes} bytes");
        }
        assert_eq!(extra_units(usize::MAX), 0xffff);
        let r = rrl(10, 0);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "198.51.100.1".parse().unwrap();
        // Plain answers (at most 512 bytes): ten in the second.
        let plain = (0..20)
            .filter(|_| {
                let ok = r.check_at(a, 4) == Verdict::Answer;
                if ok {
                    r.charge_at(a, false, extra_units(300), 4);
                }
                ok
            })
            .count();
        assert_eq!(plain, 10);
        // Answers of 1,100 bytes cost three units each: four in the second (after
        // three, 9 units are spent and the fourth still finds the budget open).
        let large = (0..20)
            .filter(|_| {
                let ok = r.check_at(b, 4) == Verdict::Answer;
                if ok {
                    r.charge_at(b, false, extra_units(1100), 4);
                }
                ok
            })
            .count();
        assert_eq!(large, 4);
        assert_eq!(r.check_at(b, 5), Verdict::Answer, "a new second");
        // A charge past the budget saturates, and starts a new second's count.
        r.charge_at(b, false, 0xffff, 5);
        assert_eq!(r.check_at(b, 5), Verdict::Drop);
        r.charge_at(a, false, 3, 9);
        assert_eq!(
            (0..10)
                .filter(|_| r.check_at(a, 9) == Verdict::Answer)
                .count(),
            7
        );
        // A client's own budget is charged, not its /24's.
        let r = rrl(10, 0);
        r.charge_at(a, true, 9, 2);
        assert_eq!(r.check_own_at(a, 2), Verdict::Answer);
        assert_eq!(r.check_own_at(a, 2), Verdict::Drop);
        assert_eq!(r.check_at(a, 2), Verdict::Answer);
        // Exempt sources are never charged.
        let r = Rrl::new(RrlConfig {
            rate: 1,
            ..RrlConfig::default()
        })
        .unwrap();
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        r.charge_at(lo, false, 100, 1);
        assert_eq!(r.check_at(lo, 1), Verdict::Answer);
    }

    fn rrl(rate: u32, slip: u32) -> Rrl {
        Rrl::new(RrlConfig {
            rate,
            slip,
            exempt: vec![],
            ..RrlConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn off_at_rate_zero() {
        assert!(Rrl::new(RrlConfig {
            rate: 0,
            ..RrlConfig::default()
        })
        .is_none());
    }

    #[test]
    fn limits_per_prefix_and_slips() {
        let r = rrl(10, 2);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let same_24: IpAddr = "192.0.2.200".parse().unwrap();
        let other: IpAddr = "198.51.100.1".parse().unwrap();
        let verdicts: Vec<Verdict> = (0..40)
            .map(|i| r.check(if i % 2 == 0 { a } else { same_24 }))
            .collect();
        // The window may roll over once during the loop: at most two budgets.
        let answered = verdicts.iter().filter(|v| **v == Verdict::Answer).count();
        assert!((10..=20).contains(&answered), "{answered}");
        let slipped = verdicts.iter().filter(|v| **v == Verdict::Slip).count();
        let dropped = verdicts.iter().filter(|v| **v == Verdict::Drop).count();
        assert!(slipped.abs_diff(dropped) <= 1, "{slipped} vs {dropped}");
        // Another prefix has its own budget.
        assert_eq!(r.check(other), Verdict::Answer);

        // Within one second: once one address has spent the budget, its neighbours in
        // the /24 get nothing, and another /24 everything.
        let r = rrl(10, 2);
        let spent = (0..10).filter(|_| r.check_at(a, 7) == Verdict::Answer);
        assert_eq!(spent.count(), 10);
        for ip in [a, same_24, "192.0.2.0".parse().unwrap()] {
            assert_ne!(
                r.check_at(ip, 7),
                Verdict::Answer,
                "{ip} shares the /24's budget"
            );
        }
        assert!((0..10).all(|_| r.check_at(other, 7) == Verdict::Answer));
        assert_eq!(
            r.check_at(a, 8),
            Verdict::Answer,
            "a new second, a new budget"
        );
    }

    #[test]
    fn a_client_with_a_valid_cookie_has_its_own_budget() {
        let r = rrl(10, 1);
        let flood: IpAddr = "192.0.2.1".parse().unwrap();
        let resolver: IpAddr = "192.0.2.53".parse().unwrap();
        // The /24's budget is spent by the flood, and the flood is slipped.
        assert_eq!(
            (0..10)
                .filter(|_| r.check_at(flood, 5) == Verdict::Answer)
                .count(),
            10
        );
        assert_eq!(r.check_at(flood, 5), Verdict::Slip);
        assert_ne!(r.check_at(resolver, 5), Verdict::Answer, "without a cookie");
        // With a cookie: its own ten, then dropped, never slipped.
        let own: Vec<Verdict> = (0..20).map(|_| r.check_own_at(resolver, 5)).collect();
        assert!(own[..10].iter().all(|v| *v == Verdict::Answer), "{own:?}");
        assert!(own[10..].iter().all(|v| *v == Verdict::Drop), "{own:?}");
        // Its own budget takes nothing from its /24's.
        let r = rrl(10, 1);
        assert!((0..10).all(|_| r.check_own_at(resolver, 5) == Verdict::Answer));
        assert!((0..10).all(|_| r.check_at(flood, 5) == Verdict::Answer));
        assert_eq!(r.check_own_at(resolver, 6), Verdict::Answer, "a new second");
    }

    #[test]
    fn exempt_sources_are_never_limited() {
        let r = rrl(1, 0);
        let defaults = Rrl::new(RrlConfig {
            rate: 1,
            ..RrlConfig::default()
        })
        .unwrap();
        let custom = Rrl::new(RrlConfig {
            rate: 1,
            exempt: vec!["203.0.113.0/24".parse().unwrap()],
            ..RrlConfig::default()
        })
        .unwrap();
        let always = |r: &Rrl, ip: &str| {
            let ip: IpAddr = ip.parse().unwrap();
            (0..100).all(|_| r.check(ip) == Verdict::Answer)
        };
        assert!(always(&defaults, "127.0.0.1") && always(&defaults, "::1"));
        assert!(always(&custom, "203.0.113.9"));
        assert!(
            !always(&custom, "127.0.0.1"),
            "the list replaces the default"
        );
        assert!(!always(&r, "127.0.0.1"));
    }

    #[test]
    fn ipv6_prefixes() {
        let r = rrl(1, 0);
        let a: IpAddr = "2001:db8:0:1::1".parse().unwrap();
        let same_56: IpAddr = "2001:db8:0:ff::2".parse().unwrap();
        let other_56: IpAddr = "2001:db8:0:100::1".parse().unwrap();
        // One second: `a` spends the /56's budget; another address of the /56 gets
        // nothing, another /56 its own.
        assert_eq!(r.check_at(a, 3), Verdict::Answer);
        assert_eq!(r.check_at(same_56, 3), Verdict::Drop, "the same /56");
        assert_eq!(r.check_at(other_56, 3), Verdict::Answer);
    }

    /// Two /24s whose prefixes land in the same slot of `r`.
    fn colliding(r: &Rrl) -> (IpAddr, IpAddr) {
        let mut seen = std::collections::HashMap::new();
        for i in 0u32.. {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + (i << 8)));
            if let Some(other) = seen.insert(r.slot(ip), ip) {
                return (other, ip);
            }
        }
        unreachable!()
    }

    #[test]
    fn two_prefixes_in_one_slot_share_its_budget() {
        // Before, a slot holding another prefix's count was reset: two colliding
        // prefixes, alternating, reset each other and were never limited.
        let r = rrl(10, 0);
        let (a, b) = colliding(&r);
        assert_ne!(r.prefix(a), r.prefix(b));
        let answered = (0..100)
            .filter(|i| r.check_at(if i % 2 == 0 { a } else { b }, 7) == Verdict::Answer)
            .count();
        assert_eq!(answered, 10, "one budget for the slot");
        // The next second, a new budget.
        assert_eq!(r.check_at(b, 8), Verdict::Answer);
    }

    #[test]
    fn a_carpet_flood_is_limited_per_slot() {
        // A spoofed flood spread over four times more /24s than there are slots, two
        // queries each, within one second: at most `rate` answers per slot in all.
        let r = rrl(1, 0);
        let prefixes: Vec<IpAddr> = (0..(4 * SLOTS) as u32)
            .map(|i| IpAddr::from(std::net::Ipv4Addr::from(i << 8)))
            .collect();
        let answered = (0..2)
            .flat_map(|_| prefixes.iter())
            .filter(|ip| r.check_at(**ip, 3) == Verdict::Answer)
            .count();
        assert!(answered <= SLOTS, "{answered} answers for {SLOTS} slots");
        // Nearly every slot was used: the limit is per slot, not global.
        assert!(answered > SLOTS * 9 / 10, "{answered}");
    }
}
