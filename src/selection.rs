//! The contract between the planes, continued: how a weighted pick is made, so that
//! every nameserver of a set gives the same resolver the same answer without talking to
//! the others.
//!
//! A pick is weighted rendezvous hashing over a 64-bit key: every CDN of the choice gets
//! the score `ln(u) / w`, with `u` in (0, 1] a hash of the key and the CDN's name and
//! `w` its effective weight, and the highest score wins. CDN `c` wins for a fraction
//! `w_c / Σ w` of keys, and:
//! - when one CDN's weight goes down and the others' go up by one common factor (a
//!   failover or drain step, see `control::decide::planner::effective`), only keys that were on
//!   that CDN move, and the same keys come back when its weight is restored;
//! - adding or removing a CDN moves only the keys it takes or gives up.
//!
//! The key ([`key`]) is a function of the resolver's address, the client network as far
//! as the answer may depend on it (the ECS address cut to the echoed scope), and a time
//! window of [`WINDOW_SECONDS`] whose boundaries are staggered per (resolver, network):
//!
//! ```text
//! base   = H(resolver, network / prefix)
//! window = (unix seconds + base mod W) / W        no network changes at the same second
//! key    = H(base, window)
//! ```
//!
//! - The resolver's address keeps resolvers independent: a large ISP block asked through
//!   several resolvers is spread over the CDNs as their weights say, not sent to one.
//! - The network is cut to the scope echoed, so every address inside the scope a
//!   resolver caches the answer for gets that same answer, and the scope is not narrowed.
//! - The window keeps a network from being pinned to one CDN for ever; staggering keeps
//!   the hour from flipping a share of all traffic at once. Nodes whose clocks agree
//!   within a second disagree for at most a second per key and hour.
//!
//! `selection: random` draws the key at random per query instead: the same scores, so
//! one pick function serves both.
//!
//! The hash is fixed (no per-process seed): nodes and restarts must agree. A client can
//! compute which CDN it will get, as it could by asking; it cannot change anyone else's.

use std::net::IpAddr;

/// Length of a selection window. A network keeps its CDN (weights unchanged) for this
/// long, then is drawn again.
pub const WINDOW_SECONDS: u64 = 3600;

/// The key of a consistent pick for a query from `resolver` about a client in
/// `client / prefix` (prefix 0: the answer does not depend on the client's network),
/// at `now` (seconds since the Unix epoch).
///
/// # Hot path
/// A few multiplies; no allocation.
pub fn key(resolver: IpAddr, client: IpAddr, prefix: u8, now: u64) -> u64 {
    let base = base(resolver, client, prefix);
    let window = (now + base % WINDOW_SECONDS) / WINDOW_SECONDS;
    mix(base ^ mix(window ^ 0x9e37_79b9_7f4a_7c15))
}

/// How many parts the client networks are cut into for a staged rollout: a stage's
/// share is a number of them ([`cohort`]).
pub const COHORT_PARTS: u16 = 10_000;

/// Where a query's network falls among [`COHORT_PARTS`] for a staged rollout
/// (`plan::Canary`), and the ECS scope its answer must then echo at least. A tailored
/// query (ECS source above 0) is placed by its client network cut to `/24` (IPv4) or
/// `/48` (IPv6), or to the source prefix when shorter, and its answer's scope is at
/// least that, so that no resolver caches one cohort's answer for another's network;
/// any other query by its resolver's `/24` or `/48`, scope unchanged (0). No time
/// window: a network stays in its cohort for the whole rollout, and a larger share
/// keeps every network a smaller one had.
///
/// # Hot path
/// A few multiplies; no allocation.
pub fn cohort(resolver: IpAddr, client: IpAddr, source: Option<u8>) -> (u16, u8) {
    let wide = |ip: IpAddr| if ip.is_ipv4() { 24 } else { 48 };
    let (ip, prefix, floor) = match source {
        Some(s) if s > 0 => {
            let p = s.min(wide(client));
            (client, p, p)
        }
        _ => (resolver, wide(resolver), 0),
    };
    let n = network(ip, prefix);
    // Its own salt: a network's cohort says nothing of the CDN its key picks.
    let h = mix(n as u64 ^ mix((n >> 64) as u64 ^ 0x5eed_c040_0000_0001) ^ u64::from(prefix));
    ((h % u64::from(COHORT_PARTS)) as u16, floor)
}

/// When the window of `(resolver, client / prefix)` that holds `now` ends (Unix seconds).
pub fn window_end(resolver: IpAddr, client: IpAddr, prefix: u8, now: u64) -> u64 {
    let offset = base(resolver, client, prefix) % WINDOW_SECONDS;
    ((now + offset) / WINDOW_SECONDS + 1) * WINDOW_SECONDS - offset
}

/// What a key is made of, but the window.
fn base(resolver: IpAddr, client: IpAddr, prefix: u8) -> u64 {
    let (r, n) = (bits(resolver), network(client, prefix));
    let r = mix(r as u64 ^ mix((r >> 64) as u64));
    let n = mix(n as u64 ^ mix((n >> 64) as u64) ^ u64::from(prefix));
    mix(r ^ n.rotate_left(17))
}

/// A CDN's salt: a hash of its name, so that a CDN keeps its keys when others are
/// added, removed or reordered.
pub fn salt(cdn: &str) -> u64 {
    // FNV-1a over the bytes, then mixed.
    mix(cdn.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }))
}

/// The rendezvous score of a CDN with `salt` and `weight` (> 0) for `key`: the highest
/// wins. `ln(u) / w` with `u` uniform in (0, 1], so `P(win) = w / Σ w`.
///
/// # Hot path
/// One mix, one logarithm, one division.
#[inline]
pub fn score(key: u64, salt: u64, weight: u64) -> f64 {
    let u = ((mix(key ^ salt) >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64);
    u.ln() / weight as f64
}

/// The ECS source prefix public resolvers send (/24 for IPv4, /56 for IPv6): what
/// explain assumes when told only which resolver asks.
pub fn default_source(client: IpAddr) -> u8 {
    if client.is_ipv4() {
        24
    } else {
        56
    }
}

/// The address as 128 bits (IPv4 mapped), with a tag so that `::ffff:a.b.c.d` asked over
/// IPv6 and `a.b.c.d` stay apart.
fn bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(v4.to_bits()) | 1 << 127,
        IpAddr::V6(v6) => v6.to_bits(),
    }
}

/// `ip` cut to its first `prefix` bits, as [`bits`] writes it.
fn network(ip: IpAddr, prefix: u8) -> u128 {
    bits(crate::net::cut(ip, prefix))
}

/// splitmix64's finalizer: every input bit affects every output bit.
#[inline]
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// The winner among `(salt, weight)` for a key, as `Steered::pick` computes it.
    fn winner(key: u64, cdns: &[(u64, u64)]) -> usize {
        (0..cdns.len())
            .filter(|&i| cdns[i].1 > 0)
            .max_by(|&a, &b| {
                score(key, cdns[a].0, cdns[a].1).total_cmp(&score(key, cdns[b].0, cdns[b].1))
            })
            .unwrap()
    }

    #[test]
    fn the_key_depends_on_the_network_only_as_far_as_the_prefix() {
        let r = ip("192.0.2.53");
        let now = 1_800_000_000;
        assert_eq!(
            key(r, ip("81.2.69.1"), 24, now),
            key(r, ip("81.2.69.200"), 24, now)
        );
        assert_ne!(
            key(r, ip("81.2.69.1"), 24, now),
            key(r, ip("81.2.70.1"), 24, now)
        );
        assert_eq!(
            key(r, ip("81.2.69.1"), 0, now),
            key(r, ip("10.0.0.1"), 0, now)
        );
        assert_ne!(
            key(r, ip("81.2.69.1"), 24, now),
            key(ip("192.0.2.54"), ip("81.2.69.1"), 24, now),
            "another resolver draws on its own"
        );
        assert_ne!(
            key(r, ip("::ffff:81.2.69.1"), 120, now),
            key(r, ip("81.2.69.1"), 24, now)
        );
    }

    #[test]
    fn windows_rotate_every_key_once_an_hour_and_not_all_at_once() {
        let r = ip("192.0.2.53");
        let t0 = 1_800_000_000 - 1_800_000_000 % WINDOW_SECONDS;
        let mut changed_at = Vec::new();
        for n in 0..2000u32 {
            let c = IpAddr::V4(Ipv4Addr::from(n << 8));
            let first = key(r, c, 24, t0);
            let end = window_end(r, c, 24, t0);
            assert!(end > t0 && end <= t0 + WINDOW_SECONDS);
            assert_eq!(key(r, c, 24, end - 1), first, "stable inside the window");
            assert_ne!(key(r, c, 24, end), first, "a new draw after it");
            assert_eq!(window_end(r, c, 24, end), end + WINDOW_SECONDS);
            changed_at.push((end - t0) / 60);
        }
        // Boundaries spread over the hour: no minute holds more than 3 % of them
        // (1.7 % expected).
        let mut per_minute = [0u32; 61];
        changed_at.iter().for_each(|&m| per_minute[m as usize] += 1);
        assert!(per_minute.iter().all(|&n| n < 60), "{per_minute:?}");
    }

    #[test]
    fn wins_follow_the_weights() {
        let cdns = [(salt("fastly"), 9000), (salt("cloudflare"), 1000)];
        let n = 200_000u64;
        let wins = (0..n).filter(|&k| winner(mix(k), &cdns) == 1).count() as f64;
        // 10 %, sd 0.067 %: 5 sd is 0.34 %.
        assert!((wins / n as f64 - 0.10).abs() < 0.0034, "{wins}");
        let three = [(salt("a"), 3000), (salt("b"), 5250), (salt("c"), 1750)];
        let mut got = [0u64; 3];
        (0..n).for_each(|k| got[winner(mix(k), &three)] += 1);
        for (g, want) in got.iter().zip([0.30, 0.525, 0.175]) {
            assert!((*g as f64 / n as f64 - want).abs() < 0.006, "{got:?}");
        }
    }

    #[test]
    fn a_step_moves_only_the_demoted_cdns_keys_and_failback_returns_them() {
        let (a, b, c) = (salt("a"), salt("b"), salt("c"));
        let before = [(a, 6000), (b, 3000), (c, 1000)];
        let step = [(a, 3000), (b, 5250), (c, 1750)];
        // The last step: a out, its share spread over b and c by one common factor.
        let out = [(a, 0), (b, 6750), (c, 2250)];
        let mut moved = 0;
        for k in (0..100_000u64).map(mix) {
            let (x, y, z) = (winner(k, &before), winner(k, &step), winner(k, &out));
            if x != y {
                assert_eq!(x, 0, "only keys on the demoted CDN move");
                moved += 1;
            }
            // Failback walks the steps backwards: a key on a at the first step was on a
            // before, and a key off a stays where the last step put it, so restoring
            // the weights brings back exactly the keys each step sent away.
            if y == 0 {
                assert_eq!(x, 0, "a key a keeps at the step was a's before");
            } else {
                assert_eq!(z, y, "a key off a keeps its CDN through the next step");
            }
            if x != 0 {
                assert_eq!((y, z), (x, x), "keys never on a never move");
            }
        }
        // Half of a's 60 %.
        assert!((moved as f64 / 100_000.0 - 0.30).abs() < 0.01, "{moved}");
    }

    /// Nodes of a set are upgraded one at a time, so every version must pick as the
    /// last did: these values were computed by this code and must never change (a
    /// change to a mixing constant, the salt, the window or the score moves clients
    /// between CDNs on every upgraded node, and splits the set's answers until the
    /// last node is upgraded).
    #[test]
    fn picks_are_the_same_in_every_version() {
        let keys = [
            (
                "192.0.2.53",
                "81.2.69.0",
                24,
                1_800_000_000,
                0x26d5_ec70_4260_441f,
            ),
            (
                "192.0.2.53",
                "81.2.69.0",
                24,
                1_800_003_600,
                0x09a4_07e3_a895_33bb,
            ),
            (
                "198.51.100.7",
                "2.125.160.0",
                24,
                1_800_000_000,
                0x0d93_8586_565f_bbc4,
            ),
            (
                "2001:db8::53",
                "2001:218::",
                56,
                1_800_000_000,
                0x8e13_30d2_b0c8_2e64,
            ),
            (
                "192.0.2.53",
                "0.0.0.0",
                0,
                1_700_000_000,
                0xcfa3_c5af_a80b_bb6a,
            ),
            (
                "127.0.0.1",
                "10.1.0.0",
                18,
                1_750_000_000,
                0xc8f7_dcd1_b438_cace,
            ),
        ];
        for (resolver, client, prefix, now, want) in keys {
            let got = key(ip(resolver), ip(client), prefix, now);
            assert_eq!(
                got, want,
                "key({resolver}, {client}/{prefix}, {now}): {got:#018x}"
            );
        }
        assert_eq!(salt("fastly"), 0x40e8_e451_05ea_e773);
        assert_eq!(salt("cloudflare"), 0x1de3_c005_ffce_2eab);
        let s = score(0x0123_4567_89ab_cdef, salt("fastly"), 90);
        assert_eq!(s.to_bits(), 0xbf84_be4a_8d20_5375, "{s:e}");
        // The CDN picked at 50/50 for 32 neighbouring /24s (81.2.0.0 to 81.2.31.0)
        // asked through one resolver at one time.
        let cdns = [(salt("fastly"), 50), (salt("cloudflare"), 50)];
        let picked: String = (0..32u32)
            .map(|n| {
                let client = IpAddr::V4(Ipv4Addr::from(0x5102_0000 | n << 8));
                let k = key(ip("192.0.2.53"), client, 24, 1_800_000_000);
                ["f", "c"][winner(k, &cdns)]
            })
            .collect();
        assert_eq!(picked, "cfcccfffcccfffcfccfcfccfcfcccccf");
    }

    #[test]
    fn salts_differ_and_scores_are_finite() {
        assert_ne!(salt("fastly"), salt("cloudflare"));
        assert_ne!(salt(""), salt("a"));
        for k in [0, 1, u64::MAX] {
            let s = score(k, salt("a"), 1);
            assert!(s.is_finite() && s <= 0.0);
        }
    }
}
