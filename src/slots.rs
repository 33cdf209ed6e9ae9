//! Data and control plane: connection slots, so that no client can hold every
//! connection of a server. DNS over TCP (`dns/tcp.rs`), the admin API and content
//! steering (`control::http::serve_http`) take a [`Slot`] of their listener's [`Slots`]
//! for each accepted connection and hold it until the connection ends: one of
//! `max_connections` (a semaphore), counted against its source prefix ([`Sources`]),
//! or, past either limit, one of a few kept for loopback sources (the admin API's, so
//! that an operator on the host can still act while it is flooded).
//!
//! One /24 (IPv4) or /56 (IPv6) is one source by default: an attacker holding a
//! network holds many addresses of it, but rarely many networks. The same prefix is
//! what response rate limiting counts by (`dns/rrl.rs`, [`prefix_key`]).
//!
//! It sits in the bottom layer because both planes use it and the data plane may not
//! import the control plane.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::net::{cut_v4, cut_v6};

/// A listener's connection slots: the connections it serves at once, by source prefix,
/// and the reserve kept for loopback sources.
#[derive(Clone, Debug)]
pub(crate) struct Slots {
    /// `max_connections` permits.
    main: Arc<Semaphore>,
    /// Permits beyond `main`, for loopback sources only (0: none).
    reserve: Arc<Semaphore>,
    /// Open connections by source prefix.
    sources: Sources,
}

/// Why a connection got no slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Its source prefix holds `max_per_source` connections already.
    Source,
    /// Every one of `max_connections` is taken.
    Connections,
}

/// One connection's hold on its listener's slots, given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    /// A permit of the main semaphore, or of the loopback reserve.
    _permit: OwnedSemaphorePermit,
    /// The connection counted against its source prefix (`None` on the reserve when
    /// the source was at its cap).
    _source: Option<SourceSlot>,
    /// Whether the permit is one of the loopback reserve.
    pub reserved: bool,
}

impl Slots {
    /// `max_connections` at once (at least 1) plus `reserved_for_loopback`, sources
    /// counted by `prefix_v4`-bit IPv4 and `prefix_v6`-bit IPv6 prefixes.
    pub(crate) fn new(
        max_connections: usize,
        reserved_for_loopback: usize,
        prefix_v4: u8,
        prefix_v6: u8,
    ) -> Slots {
        Slots {
            main: Arc::new(Semaphore::new(max_connections.max(1))),
            reserve: Arc::new(Semaphore::new(reserved_for_loopback)),
            sources: Sources::new(prefix_v4, prefix_v6),
        }
    }

    /// A slot for a connection from `ip`, whose source prefix may hold `max_per_source`
    /// (0: no limit). A source at its cap, or every slot taken: only loopback goes on,
    /// to the reserve, so that a local flood from 127.0.0.1 itself does not lock out
    /// the operator's curl from the same address. Never waits.
    pub(crate) fn take(&self, ip: IpAddr, max_per_source: usize) -> Result<Slot, Refused> {
        let source = self.sources.take(ip, max_per_source);
        let main = source
            .is_some()
            .then(|| self.main.clone().try_acquire_owned().ok())
            .flatten();
        if let Some(permit) = main {
            return Ok(Slot {
                _permit: permit,
                _source: source,
                reserved: false,
            });
        }
        match self.reserve.clone().try_acquire_owned() {
            Ok(permit) if ip.to_canonical().is_loopback() => Ok(Slot {
                _permit: permit,
                _source: source,
                reserved: true,
            }),
            _ if source.is_none() => Err(Refused::Source),
            _ => Err(Refused::Connections),
        }
    }
}

/// `ip`'s prefix (`v4` or `v6` bits long) as one number, the family in the top bit;
/// IPv4-mapped IPv6 addresses count as IPv4. One client network, one key: for the
/// per-source cap here and for response rate limiting (`dns/rrl.rs`).
pub(crate) fn prefix_key(ip: IpAddr, v4: u8, v6: u8) -> u128 {
    match ip.to_canonical() {
        IpAddr::V4(a) => u128::from(u32::from(cut_v4(a, v4))),
        IpAddr::V6(a) => u128::from(cut_v6(a, v6)) >> 1 | 1 << 127,
    }
}

/// Open connections by source prefix, shared by one listener's connections.
#[derive(Clone, Debug)]
pub(crate) struct Sources {
    open: Arc<Mutex<HashMap<u128, usize>>>,
    /// The IPv4 prefix a source is counted by.
    v4: u8,
    /// The IPv6 prefix a source is counted by.
    v6: u8,
}

impl Sources {
    /// Counts sources by `v4`-bit IPv4 and `v6`-bit IPv6 prefixes.
    pub(crate) fn new(v4: u8, v6: u8) -> Sources {
        Sources {
            open: Arc::default(),
            v4,
            v6,
        }
    }

    /// Counts a connection from `ip`; `None` if its prefix has `max` open already
    /// (`max` 0: no limit).
    pub(crate) fn take(&self, ip: IpAddr, max: usize) -> Option<SourceSlot> {
        let key = self.key(ip);
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(key).or_default();
        if max > 0 && *n >= max {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            sources: self.open.clone(),
            key,
        })
    }

    /// `ip`'s source prefix as one number ([`prefix_key`]).
    fn key(&self, ip: IpAddr) -> u128 {
        prefix_key(ip, self.v4, self.v6)
    }
}

/// One connection counted against its source prefix until dropped.
#[derive(Debug)]
pub(crate) struct SourceSlot {
    sources: Arc<Mutex<HashMap<u128, usize>>>,
    key: u128,
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut open = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_counted_by_prefix() {
        let s = Sources::new(24, 56);
        let key = |a: &str| s.key(a.parse().unwrap());
        assert_eq!(key("192.0.2.1"), key("192.0.2.254"));
        assert_ne!(key("192.0.2.1"), key("192.0.3.1"));
        assert_eq!(key("::ffff:192.0.2.1"), key("192.0.2.9"));
        assert_eq!(key("2001:db8:0:1::1"), key("2001:db8:0:ff::2"));
        assert_ne!(key("2001:db8:0:1::1"), key("2001:db8:0:100::1"));
        assert_ne!(key("0.0.0.0"), key("::"));
    }

    #[test]
    fn a_source_slot_is_given_back() {
        let s = Sources::new(24, 56);
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let a = s.take(ip, 2).unwrap();
        let _b = s.take("192.0.2.77".parse().unwrap(), 2).unwrap();
        assert!(s.take(ip, 2).is_none());
        assert!(s.take("192.0.3.1".parse().unwrap(), 2).is_some());
        assert!(s.take(ip, 0).is_some(), "0: no limit");
        drop(a);
        assert!(s.take(ip, 2).is_some());
    }

    #[test]
    fn one_ipv6_56_is_one_source() {
        let s = Sources::new(24, 56);
        let _held: Vec<_> = (0..32)
            .map(|i| s.take(format!("2001:db8:0:{i:x}::1").parse().unwrap(), 32))
            .collect::<Option<_>>()
            .unwrap();
        assert!(s.take("2001:db8:0:ff::9".parse().unwrap(), 32).is_none());
        assert!(s.take("2001:db8:0:100::1".parse().unwrap(), 32).is_some());
    }

    #[test]
    fn past_either_limit_only_loopback_gets_the_reserve() {
        let slots = Slots::new(2, 1, 24, 56);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let a = slots.take(ip("192.0.2.1"), 1).unwrap();
        assert!(!a.reserved);
        assert_eq!(
            slots.take(ip("192.0.2.2"), 1).err(),
            Some(Refused::Source),
            "one per source"
        );
        let _b = slots.take(ip("198.51.100.1"), 1).unwrap();
        assert_eq!(
            slots.take(ip("203.0.113.1"), 1).err(),
            Some(Refused::Connections)
        );
        let local = slots.take(ip("::ffff:127.0.0.1"), 1).unwrap();
        assert!(local.reserved, "loopback past the limit: the reserve");
        assert_eq!(
            slots.take(ip("127.0.0.1"), 1).err(),
            Some(Refused::Source),
            "the reserve is spent"
        );
        drop(a);
        assert!(!slots.take(ip("192.0.2.3"), 1).unwrap().reserved);
    }

    #[test]
    fn without_a_reserve_loopback_is_refused_too() {
        let slots = Slots::new(1, 0, 24, 56);
        let _a = slots.take("127.0.0.1".parse().unwrap(), 0).unwrap();
        assert_eq!(
            slots.take("127.0.0.2".parse().unwrap(), 0).err(),
            Some(Refused::Connections)
        );
    }
}
