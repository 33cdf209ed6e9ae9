//! The contract between the planes: an immutable `Plan` that the control plane builds
//! and the data plane reads, published together with the geo database and the zones as
//! one `Snapshot` behind an `ArcSwap`.
//!
//! A query does one atomic load of the snapshot, one geo lookup, one region lookup in
//! precomputed tables, and one random draw plus a binary search over a cumulative weight
//! table. Nothing here decides policy: the planner (`control::planner`) did that.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use hickory_proto::rr::Name;
use hickory_server::zone_handler::Catalog;
use ipnet::IpNet;
use rand::{Rng, RngExt};

use crate::config::Match;
use crate::dns::geo::{GeoDb, Place};

/// Everything a query needs, swapped as one piece so that no query ever sees a plan
/// from one configuration and zones from another.
pub struct Snapshot {
    pub plan: Plan,
    pub geo: Arc<GeoDb>,
    pub zones: Arc<Catalog>,
}

/// The live snapshot: the data plane loads it, the control plane stores a new one.
pub type Live = ArcSwap<Snapshot>;

/// Every steered name, and how to answer it right now.
#[derive(Debug, Default)]
pub struct Plan {
    /// By the name's lowercase wire form (labels with their lengths, the root's 0), so
    /// that the UDP fast path looks a query up by the bytes it received.
    names: HashMap<Box<[u8]>, Steered>,
}

/// One steered name.
#[derive(Debug)]
pub struct Steered {
    /// The name as configured (lowercase, absolute).
    pub name: Name,
    regions: RegionIndex,
    /// Location scopes of active drains (`where: [GB]`): bit `i` of a client's mask is
    /// set when it matches `drain_scopes[i]`. Usually empty.
    drain_scopes: Box<[Box<[Match]>]>,
    /// `2^drain_scopes.len()` choices per region, in policy order: index
    /// `region << drain_scopes.len() | mask`.
    choices: Box<[Choice]>,
}

/// What a region answers: the CDNs that may serve it now and their weights.
#[derive(Debug)]
pub struct Choice {
    /// Region name, for explain and (later) metrics labels.
    pub region: Arc<str>,
    /// Running sums of the weights of `targets`; the last is the total (> 0).
    cumulative: Cumulative,
    targets: Box<[Target]>,
    /// TTL of the CNAME answer.
    pub ttl: u32,
    /// Why the weights are what they are.
    pub reason: Reason,
}

/// Running sums of a choice's weights. Up to [`INLINE_TARGETS`] of them are stored in
/// the `Choice` itself: with many steered names the plan does not stay in the CPU's
/// caches, and a table behind a pointer of its own costs a pick one more cache miss.
#[derive(Debug)]
enum Cumulative {
    Inline {
        len: u8,
        sums: [u64; INLINE_TARGETS],
    },
    Heap(Box<[u64]>),
}

/// Targets of a choice whose weight table is stored inline (policies have 2 to 4 CDNs).
const INLINE_TARGETS: usize = 4;

/// Why a region answers with the weights it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The configured weights.
    Normal,
    /// Some CDN is off its configured weight (failover steps).
    Failover,
    /// Some CDN is drained here by an operator.
    Drain,
    /// Every CDN of the region would be removed: the configured weights are used
    /// instead, because answering something beats answering nothing.
    FailOpen,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Reason::Normal => "normal",
            Reason::Failover => "failover",
            Reason::Drain => "drain",
            Reason::FailOpen => "fail-open",
        })
    }
}

/// One CDN a name can be answered with.
#[derive(Debug)]
pub struct Target {
    pub cdn: Arc<str>,
    /// The CNAME target (absolute).
    pub cname: Name,
    /// `cname` in uncompressed wire form, as the UDP fast path copies it into answers.
    pub cname_wire: Box<[u8]>,
    /// `queries_total{name, region, cdn, rcode="NOERROR"}`, resolved by the control
    /// plane so that counting an answer is one atomic add (`None` when no metrics are
    /// kept, as in tests that run the DNS server alone).
    pub answered: Option<prometheus::IntCounter>,
}

/// Which region a client falls in, and how far that finding extends (the ECS scope).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub region: usize,
    /// Prefix length over which every address gets this same region; 0 when the answer
    /// does not depend on the client at all.
    pub scope: u8,
    /// Which location-scoped drains the client falls in (bit per `drain_scopes` entry).
    pub mask: usize,
}

/// Region lookup tables: for each key, the index of the *first* region that matches it.
/// The first matching region overall is the smallest index among the keys that match.
#[derive(Debug)]
pub struct RegionIndex {
    by_country: Box<[u16; 676]>,
    by_continent: [u16; 7],
    /// CIDR entries with the first region listing each, shortest prefix first.
    nets: Box<[(IpNet, u16)]>,
    /// The region with `"*"`.
    default: u16,
    /// False when every client gets the same region (ECS scope 0).
    location_dependent: bool,
}

const NONE: u16 = u16::MAX;

// === impl Plan ===

impl Plan {
    pub fn new(names: Vec<Steered>) -> Plan {
        let mut buf = [0u8; 255];
        Plan {
            names: names
                .into_iter()
                .filter_map(|s| Some((Box::from(wire_name(&s.name, &mut buf)?), s)))
                .collect(),
        }
    }

    /// The steered name, if `name` is one (in any case).
    ///
    /// # Hot path
    /// The name's wire form on the stack, then a hash lookup; no allocation.
    pub fn get(&self, name: &Name) -> Option<&Steered> {
        let mut buf = [0u8; 255];
        self.get_wire(wire_name(name, &mut buf)?)
    }

    /// The steered name whose lowercase wire form is `wire`, if any.
    pub fn get_wire(&self, wire: &[u8]) -> Option<&Steered> {
        self.names.get(wire)
    }

    pub fn names(&self) -> impl Iterator<Item = &Steered> {
        self.names.values()
    }

    /// Resolves every target's answer counter with `counter(name, region, cdn)`.
    pub fn attach_counters(
        &mut self,
        counter: impl Fn(&str, &str, &str) -> prometheus::IntCounter,
    ) {
        for steered in self.names.values_mut() {
            let name = steered.name.to_string();
            for choice in steered.choices.iter_mut() {
                for target in choice.targets.iter_mut() {
                    target.answered = Some(counter(&name, &choice.region, &target.cdn));
                }
            }
        }
    }
}

/// Writes `name` in lowercase, uncompressed wire form into `buf`, as an absolute name;
/// `None` if it does not fit (names are at most 255 bytes).
pub fn wire_name<'b>(name: &Name, buf: &'b mut [u8; 255]) -> Option<&'b [u8]> {
    let mut len = 0;
    for label in name.iter() {
        let end = len + 1 + label.len();
        if end >= buf.len() {
            return None;
        }
        buf[len] = u8::try_from(label.len()).ok()?;
        buf[len + 1..end].copy_from_slice(label);
        buf[len + 1..end].make_ascii_lowercase();
        len = end;
    }
    buf[len] = 0;
    Some(&buf[..=len])
}

// === impl Target ===

impl Target {
    pub fn new(cdn: Arc<str>, cname: Name) -> Target {
        let mut buf = [0u8; 255];
        // Configured names are checked to fit when the policy is loaded.
        let cname_wire = wire_name(&cname, &mut buf).map_or_else(|| Box::from([0u8]), Box::from);
        Target {
            cdn,
            cname,
            cname_wire,
            answered: None,
        }
    }
}

// === impl Steered ===

impl Steered {
    /// `choices` holds `2^drain_scopes.len()` entries per region (see the field docs).
    pub fn new(
        name: Name,
        regions: RegionIndex,
        drain_scopes: Vec<Box<[Match]>>,
        choices: Vec<Choice>,
    ) -> Steered {
        Steered {
            name,
            regions,
            drain_scopes: drain_scopes.into_boxed_slice(),
            choices: choices.into_boxed_slice(),
        }
    }

    /// Finds the client's region, the drains it falls in, and the ECS scope of that
    /// finding.
    ///
    /// # Hot path
    /// Table lookups and, only for policies with CIDR entries or location-scoped
    /// drains, a short scan.
    pub fn decide(&self, ip: IpAddr, place: &Place) -> Decision {
        let mut d = self.regions.decide(ip, place);
        if self.drain_scopes.is_empty() {
            return d;
        }
        if d.scope == 0 {
            d.scope = place.prefix_len.min(if ip.is_ipv4() { 32 } else { 128 });
        }
        for (i, scope) in self.drain_scopes.iter().enumerate() {
            for m in scope.iter() {
                let hit = match *m {
                    Match::Any => true,
                    Match::Country(c) => place.country == Some(c),
                    Match::Continent(c) => place.continent == Some(c),
                    Match::Net(n) => {
                        if n.prefix_len() > d.scope && same_network(ip, n.addr(), d.scope) {
                            d.scope = n.prefix_len();
                        }
                        n.contains(&ip)
                    }
                };
                if hit {
                    d.mask |= 1 << i;
                }
            }
        }
        d
    }

    /// The choice for a decision.
    pub fn choose(&self, d: &Decision) -> &Choice {
        &self.choices[(d.region << self.drain_scopes.len()) | d.mask]
    }

    /// The choice of a region for clients outside every location-scoped drain.
    pub fn choice(&self, region: usize) -> &Choice {
        &self.choices[region << self.drain_scopes.len()]
    }

    /// Location scopes of active drains.
    pub fn drain_scopes(&self) -> &[Box<[Match]>] {
        &self.drain_scopes
    }
}

// === impl Choice ===

impl Choice {
    /// `weighted` lists (target, weight); zero weights are left out. `None` if every
    /// weight is zero (the planner never builds such a choice).
    pub fn new(
        region: Arc<str>,
        ttl: u32,
        reason: Reason,
        weighted: Vec<(Target, u64)>,
    ) -> Option<Choice> {
        let mut total = 0u64;
        let mut cumulative = Vec::new();
        let mut targets = Vec::new();
        for (target, w) in weighted.into_iter().filter(|(_, w)| *w > 0) {
            total = total.checked_add(w)?;
            cumulative.push(total);
            targets.push(target);
        }
        (total > 0).then(|| Choice {
            region,
            cumulative: Cumulative::new(cumulative),
            targets: targets.into_boxed_slice(),
            ttl,
            reason,
        })
    }

    /// One weighted-random target.
    ///
    /// # Hot path
    /// One random draw and a binary search; no allocation.
    pub fn pick<R: Rng + ?Sized>(&self, rng: &mut R) -> &Target {
        let cumulative = self.cumulative.as_slice();
        let total = cumulative[cumulative.len() - 1];
        let x = rng.random_range(0..total);
        let i = cumulative.partition_point(|&c| c <= x);
        &self.targets[i]
    }

    /// (target, weight) pairs, for explain and tests.
    pub fn weights(&self) -> impl Iterator<Item = (&Target, u64)> {
        let mut prev = 0;
        self.targets
            .iter()
            .zip(self.cumulative.as_slice().iter())
            .map(move |(t, &c)| {
                let w = c - prev;
                prev = c;
                (t, w)
            })
    }
}

// === impl Cumulative ===

impl Cumulative {
    fn new(sums: Vec<u64>) -> Cumulative {
        if sums.len() > INLINE_TARGETS {
            return Cumulative::Heap(sums.into_boxed_slice());
        }
        let mut inline = [0; INLINE_TARGETS];
        inline[..sums.len()].copy_from_slice(&sums);
        Cumulative::Inline {
            len: sums.len() as u8,
            sums: inline,
        }
    }

    /// # Hot path
    /// A branch; no allocation.
    fn as_slice(&self) -> &[u64] {
        match self {
            Cumulative::Inline { len, sums } => &sums[..usize::from(*len)],
            Cumulative::Heap(sums) => sums,
        }
    }
}

// === impl RegionIndex ===

impl RegionIndex {
    /// Builds the tables from each region's entries, in policy order.
    pub fn new<'a>(regions: impl IntoIterator<Item = &'a [Match]>) -> RegionIndex {
        let mut idx = RegionIndex {
            by_country: Box::new([NONE; 676]),
            by_continent: [NONE; 7],
            nets: Box::new([]),
            default: NONE,
            location_dependent: false,
        };
        let mut nets: Vec<(IpNet, u16)> = Vec::new();
        let mut count = 0usize;
        for (i, matches) in regions.into_iter().enumerate() {
            count += 1;
            let i = i as u16;
            for m in matches {
                match *m {
                    Match::Any => first(&mut idx.default, i),
                    Match::Country(c) => first(&mut idx.by_country[c.index()], i),
                    Match::Continent(c) => first(&mut idx.by_continent[c.index()], i),
                    Match::Net(n) => {
                        if !nets.iter().any(|(o, _)| *o == n) {
                            nets.push((n, i));
                        }
                    }
                }
            }
        }
        nets.sort_by_key(|(n, _)| n.prefix_len());
        idx.nets = nets.into_boxed_slice();
        if idx.default == NONE {
            // Validation requires a default; stay total anyway.
            idx.default = count.saturating_sub(1) as u16;
        }
        idx.location_dependent = count > 1 && idx.default != 0;
        idx
    }

    fn decide(&self, ip: IpAddr, place: &Place) -> Decision {
        if !self.location_dependent {
            return Decision {
                region: self.default as usize,
                scope: 0,
                mask: 0,
            };
        }
        let mut region = self.default;
        if let Some(c) = place.country {
            region = region.min(self.by_country[c.index()]);
        }
        if let Some(c) = place.continent {
            region = region.min(self.by_continent[c.index()]);
        }
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let mut scope = place.prefix_len.min(max);
        for &(net, r) in self.nets.iter() {
            if net.contains(&ip) {
                region = region.min(r);
            }
            // The answer is only constant over a network that lies wholly inside or
            // outside every CIDR entry: narrow the scope past any entry that overlaps.
            if net.prefix_len() > scope && same_network(ip, net.addr(), scope) {
                scope = net.prefix_len();
            }
        }
        Decision {
            region: region as usize,
            scope,
            mask: 0,
        }
    }
}

fn first(slot: &mut u16, region: u16) {
    if *slot == NONE {
        *slot = region;
    }
}

/// Whether `a` and `b` (same family) share their first `prefix` bits.
fn same_network(a: IpAddr, b: IpAddr, prefix: u8) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Match;
    use crate::dns::countries::Country;
    use rand::SeedableRng;

    fn idx(regions: &[Vec<Match>]) -> RegionIndex {
        RegionIndex::new(regions.iter().map(|r| r.as_slice()))
    }

    fn m(s: &str) -> Match {
        Match::parse(s).unwrap()
    }

    fn place(cc: &str, prefix_len: u8) -> Place {
        let country = Country::parse(cc);
        Place {
            country,
            continent: country.and_then(Country::continent),
            prefix_len,
        }
    }

    #[test]
    fn first_matching_region_wins() {
        let r = idx(&[
            vec![m("81.2.69.0/24")],
            vec![m("GB")],
            vec![m("continent:EU")],
            vec![m("*")],
        ]);
        let ip: IpAddr = "81.2.69.142".parse().unwrap();
        assert_eq!(
            r.decide(ip, &place("GB", 18)),
            Decision {
                region: 0,
                scope: 24,
                mask: 0
            }
        );
        let ip: IpAddr = "81.2.70.1".parse().unwrap();
        assert_eq!(
            r.decide(ip, &place("GB", 18)),
            Decision {
                region: 1,
                scope: 24,
                mask: 0
            }
        );
        let ip: IpAddr = "89.160.20.112".parse().unwrap();
        assert_eq!(
            r.decide(ip, &place("SE", 17)),
            Decision {
                region: 2,
                scope: 17,
                mask: 0
            }
        );
        assert_eq!(r.decide(ip, &Place::default()).region, 3);
    }

    #[test]
    fn continent_listed_first_beats_a_later_country() {
        let r = idx(&[vec![m("continent:EU")], vec![m("GB")], vec![m("*")]]);
        assert_eq!(
            r.decide("81.2.69.1".parse().unwrap(), &place("GB", 18))
                .region,
            0
        );
    }

    #[test]
    fn default_only_policy_has_scope_zero() {
        let r = idx(&[vec![m("*")]]);
        assert_eq!(
            r.decide("81.2.69.1".parse().unwrap(), &place("GB", 18)),
            Decision {
                region: 0,
                scope: 0,
                mask: 0
            }
        );
    }

    #[test]
    fn pick_follows_weights() {
        let t = |n: &str| {
            Target::new(
                n.into(),
                Name::from_ascii(format!("{n}.example.net.")).unwrap(),
            )
        };
        let c = Choice::new(
            "r".into(),
            30,
            Reason::Normal,
            vec![(t("a"), 70), (t("b"), 0), (t("c"), 30)],
        )
        .unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut a = 0;
        for _ in 0..10_000 {
            match &*c.pick(&mut rng).cdn {
                "a" => a += 1,
                "c" => {}
                other => panic!("zero-weight target {other} picked"),
            }
        }
        assert!((6_800..7_200).contains(&a), "{a}");
        assert_eq!(
            c.weights()
                .map(|(t, w)| (t.cdn.to_string(), w))
                .collect::<Vec<_>>(),
            vec![("a".into(), 70), ("c".into(), 30)]
        );
        assert!(Choice::new("r".into(), 30, Reason::Normal, vec![(t("a"), 0)]).is_none());
    }

    #[test]
    fn weight_tables_inline_and_on_the_heap_pick_alike() {
        let t = |n: String| {
            let cname = Name::from_ascii(format!("{n}.example.net.")).unwrap();
            Target::new(n.into(), cname)
        };
        for n in 1..=INLINE_TARGETS + 3 {
            // Weights 1, 2, ..., n: the last target is picked with probability n / total.
            let weighted = (0..n).map(|i| (t(format!("c{i}")), i as u64 + 1)).collect();
            let c = Choice::new("r".into(), 30, Reason::Normal, weighted).unwrap();
            assert_eq!(
                matches!(c.cumulative, Cumulative::Inline { .. }),
                n <= INLINE_TARGETS
            );
            assert_eq!(
                c.weights().map(|(_, w)| w).collect::<Vec<_>>(),
                (1..=n as u64).collect::<Vec<_>>()
            );
            let mut rng = rand::rngs::SmallRng::seed_from_u64(n as u64);
            let last = format!("c{}", n - 1);
            let draws = 20_000;
            let hits = (0..draws)
                .filter(|_| *c.pick(&mut rng).cdn == *last)
                .count();
            let want = draws * 2 / (n + 1);
            assert!(
                hits.abs_diff(want) < draws / 20,
                "n={n}: {hits}, want {want}"
            );
        }
    }
}
