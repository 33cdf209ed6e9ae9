//! Data and control plane: open connections counted by source prefix, so that one
//! client network cannot hold every connection of a server. DNS over TCP (`tcp.rs`),
//! the admin API and content steering (`control::api::serve_http`) take a
//! [`SourceSlot`] for each accepted connection and hold it until the connection ends.
//! One /24 (IPv4) or /56 (IPv6) is one source by default: an attacker holding a
//! network holds many addresses of it, but rarely many networks.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use super::rrl::prefix_key;

/// Open connections by source prefix, shared by one listener's connections.
#[derive(Clone, Debug)]
pub struct Sources {
    open: Arc<Mutex<HashMap<u128, usize>>>,
    /// The IPv4 prefix a source is counted by.
    v4: u8,
    /// The IPv6 prefix a source is counted by.
    v6: u8,
}

impl Sources {
    /// Counts sources by `v4`-bit IPv4 and `v6`-bit IPv6 prefixes.
    pub fn new(v4: u8, v6: u8) -> Sources {
        Sources {
            open: Arc::default(),
            v4,
            v6,
        }
    }

    /// Counts a connection from `ip`; `None` if its prefix has `max` open already
    /// (`max` 0: no limit).
    pub fn take(&self, ip: IpAddr, max: usize) -> Option<SourceSlot> {
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
pub struct SourceSlot {
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
}
