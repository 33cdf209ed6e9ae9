//! Both planes (a leaf anyone may use): an address cut to its first bits, the one
//! prefix mask of the crate. The per-source keys of the rate limiter and of the
//! connection slots (`slots::prefix_key`), the selection key (`selection.rs`), the plan's CIDR scope test
//! (`plan/regions.rs`), the networks of performance samples (`control/modifiers/perf/`) and `explain`'s
//! ECS network all cut with it.
//!
//! A prefix past the family's width keeps the whole address; a prefix of 0 leaves the
//! unspecified address of the family.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

/// `ip` with every bit past its first `prefix` cleared (the whole address when
/// `prefix` is the family's width or more).
///
/// # Hot path
/// A shift and a mask; no allocation.
#[inline]
pub(crate) fn cut(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => IpAddr::V4(cut_v4(a, prefix)),
        IpAddr::V6(a) => IpAddr::V6(cut_v6(a, prefix)),
    }
}

/// [`cut`] for an IPv4 address.
#[inline]
pub(crate) fn cut_v4(a: Ipv4Addr, prefix: u8) -> Ipv4Addr {
    Ipv4Net::new(a, prefix.min(32)).map_or(a, |n| n.network())
}

/// [`cut`] for an IPv6 address.
#[inline]
pub(crate) fn cut_v6(a: Ipv6Addr, prefix: u8) -> Ipv6Addr {
    Ipv6Net::new(a, prefix.min(128)).map_or(a, |n| n.network())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn bits_past_the_prefix_are_cleared() {
        assert_eq!(cut(ip("81.2.69.160"), 24), ip("81.2.69.0"));
        assert_eq!(cut(ip("81.2.69.160"), 17), ip("81.2.0.0"));
        assert_eq!(cut(ip("81.2.69.161"), 31), ip("81.2.69.160"));
        assert_eq!(cut(ip("2001:db8:1:2::9"), 48), ip("2001:db8:1::"));
        assert_eq!(cut(ip("2001:db8:1:2::9"), 127), ip("2001:db8:1:2::8"));
    }

    #[test]
    fn prefix_zero_and_past_the_width() {
        assert_eq!(cut(ip("81.2.69.160"), 0), ip("0.0.0.0"));
        assert_eq!(cut(ip("2001:db8::1"), 0), ip("::"));
        for p in [32, 33, 128, 255] {
            assert_eq!(cut(ip("81.2.69.161"), p), ip("81.2.69.161"), "/{p}");
        }
        for p in [128, 129, 255] {
            assert_eq!(cut(ip("2001:db8::1"), p), ip("2001:db8::1"), "/{p}");
        }
    }

    /// The same as the shift-and-mask every caller wrote before, for every prefix.
    #[test]
    fn agrees_with_a_shifted_mask() {
        let (a, b) = (
            0x5102_45a1u32,
            0x2001_0db8_0001_0002_0003_0004_0005_0006u128,
        );
        for p in 0..=u8::MAX {
            let w = u32::from(p.min(32));
            let m = u32::MAX.checked_shl(32 - w).unwrap_or(0);
            assert_eq!(cut_v4(Ipv4Addr::from(a), p), Ipv4Addr::from(a & m), "/{p}");
            let w = u32::from(p.min(128));
            let m = u128::MAX.checked_shl(128 - w).unwrap_or(0);
            assert_eq!(cut_v6(Ipv6Addr::from(b), p), Ipv6Addr::from(b & m), "/{p}");
        }
    }
}
