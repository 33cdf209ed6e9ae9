//! Contract, the region index: which region of a name a client falls in, and which of
//! its location-scoped drains. Tables by country and continent (built once per plan
//! from the regions' `match:` entries, first region listing a key wins), the CIDR and
//! AS entries with their first region, and the drains a client falls in by its place
//! ([`drain_masks`]). Pure lookups over these tables; `steering` reads them per query,
//! `layout` keeps them in its flat tables.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::config::Match;
use crate::net;
use crate::place::geo::Place;

/// Entries of a country table: one per two-letter code.
pub(super) const COUNTRIES: usize = 676;

/// Continents, after the countries in [`drain_masks`].
const CONTINENTS: usize = 7;
const _: () = assert!(crate::config::MAX_DRAIN_SCOPES <= 8, "a drain mask is a u8");

/// No region lists this key.
const NONE: u16 = u16::MAX;

/// Which region a client falls in, and how far that finding extends (the ECS scope).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub region: usize,
    /// Prefix length over which every address gets this same region; 0 when the answer
    /// does not depend on the client at all.
    pub scope: u8,
    /// Which location-scoped drains the client falls in (bit per drain scope).
    pub mask: usize,
}

/// Region lookup tables: for each key, the index of the *first* region that matches it.
/// The first matching region overall is the smallest index among the keys that match.
#[derive(Debug)]
pub struct RegionIndex {
    pub(super) by_country: Box<[u16; COUNTRIES]>,
    /// CIDR entries with the first region listing each, shortest prefix first.
    pub(super) nets: Vec<(IpNet, u16)>,
    /// AS entries with the first region listing each.
    pub(super) asns: Vec<(u32, u16)>,
    pub(super) rest: Regions,
}

/// A region index but for its country table and CIDR entries, which the plan keeps in
/// flat tables.
#[derive(Debug)]
pub(super) struct Regions {
    pub(super) by_continent: [u16; 7],
    /// Where the CIDR entries start in `Plan::nets`, and how many there are.
    pub(super) nets: u32,
    pub(super) nets_len: u32,
    /// The region with `"*"`.
    pub(super) default: u16,
    /// False when every client gets the same region (ECS scope 0).
    pub(super) location_dependent: bool,
}

// === impl RegionIndex ===

impl RegionIndex {
    /// Builds the tables from each region's entries, in policy order.
    pub fn new<'a>(regions: impl IntoIterator<Item = &'a [Match]>) -> RegionIndex {
        let mut by_country = Box::new([NONE; COUNTRIES]);
        let mut rest = Regions {
            by_continent: [NONE; 7],
            nets: 0,
            nets_len: 0,
            default: NONE,
            location_dependent: false,
        };
        let mut nets: Vec<(IpNet, u16)> = Vec::new();
        let mut asns: Vec<(u32, u16)> = Vec::new();
        let mut count = 0usize;
        for (i, matches) in regions.into_iter().enumerate() {
            count += 1;
            let i = i as u16;
            for m in matches {
                match *m {
                    Match::Any => first(&mut rest.default, i),
                    Match::Country(c) => first(&mut by_country[c.index()], i),
                    Match::Continent(c) => first(&mut rest.by_continent[c.index()], i),
                    Match::Net(n) => {
                        if !nets.iter().any(|(o, _)| *o == n) {
                            nets.push((n, i));
                        }
                    }
                    Match::Asn(a) => {
                        if !asns.iter().any(|(o, _)| *o == a) {
                            asns.push((a, i));
                        }
                    }
                }
            }
        }
        nets.sort_by_key(|(n, _)| n.prefix_len());
        if rest.default == NONE {
            // Validation requires a default; stay total anyway.
            rest.default = count.saturating_sub(1) as u16;
        }
        rest.location_dependent = count > 1 && rest.default != 0;
        RegionIndex {
            by_country,
            nets,
            asns,
            rest,
        }
    }

    #[cfg(test)]
    fn decide(&self, ip: IpAddr, place: &Place) -> Decision {
        self.rest.decide(
            &self.by_country[..],
            &self.nets,
            &self.asns,
            ip,
            place,
            place.prefix_len,
        )
    }
}

// === impl Regions ===

impl Regions {
    /// The first region whose countries or continents hold `place` (CIDR entries
    /// aside), or the default.
    fn of_place(&self, by_country: &[u16], place: &Place) -> u16 {
        let mut region = self.default;
        if let Some(c) = place.country {
            region = region.min(by_country[c.index()]);
        }
        if let Some(c) = place.continent {
            region = region.min(self.by_continent[c.index()]);
        }
        region
    }

    /// The client's region, and its scope: `widest` (how far the region by place
    /// holds) narrowed past any CIDR entry that cuts it.
    #[inline]
    pub(super) fn decide(
        &self,
        by_country: &[u16],
        nets: &[(IpNet, u16)],
        asns: &[(u32, u16)],
        ip: IpAddr,
        place: &Place,
        widest: u8,
    ) -> Decision {
        if !self.location_dependent {
            return Decision {
                region: self.default as usize,
                scope: 0,
                mask: 0,
            };
        }
        let mut region = self.of_place(by_country, place);
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let mut scope = widest.min(max);
        for &(net, r) in nets {
            if net.contains(&ip) {
                region = region.min(r);
            }
            // The answer is only constant over a network that lies wholly inside or
            // outside every CIDR entry: narrow the scope past any entry that overlaps.
            if net.prefix_len() > scope && same_network(ip, net.addr(), scope) {
                scope = net.prefix_len();
            }
        }
        if !asns.is_empty() {
            // Only over the client's AS network (or the empty block it is in) is the
            // origin AS the same.
            scope = scope.max(place.origin.prefix_len);
            if let Some(&(_, r)) = asns.iter().find(|(a, _)| Some(*a) == place.origin.asn) {
                region = region.min(r);
            }
        }
        Decision {
            region: region as usize,
            scope,
            mask: 0,
        }
    }
}

/// The index of the choice a client at `place` gets by its place alone (CIDR and AS
/// entries aside) among a name's choices: its region (`regions` with the name's
/// country table `by_country`), shifted by the name's `scopes`, and the drain scopes it
/// falls in (`masks`, from [`drain_masks`]).
///
/// # Hot path
/// Table lookups: the drains by place are precomputed.
#[inline]
pub(super) fn by_place(
    regions: &Regions,
    by_country: &[u16],
    masks: &[u8],
    scopes: u8,
    place: &Place,
) -> usize {
    let region = usize::from(regions.of_place(by_country, place));
    let mut mask = 0;
    if let Some(&everywhere) = masks.get(COUNTRIES + CONTINENTS) {
        mask = everywhere;
        if let Some(c) = place.country {
            mask |= masks[c.index()];
        }
        if let Some(c) = place.continent {
            mask |= masks[COUNTRIES + c.index()];
        }
    }
    region << scopes | usize::from(mask)
}

/// For each country, then each continent, then every place: the location-scoped
/// drains (bit `i` for `scopes[i]`) whose entries hold it by place
/// ([`Match::covers_place`]; CIDR and AS entries are decided per address). Empty
/// without scopes.
pub(super) fn drain_masks(scopes: &[Box<[Match]>]) -> Box<[u8]> {
    if scopes.is_empty() {
        return Box::default();
    }
    let mut masks = vec![0u8; COUNTRIES + CONTINENTS + 1];
    for (i, scope) in scopes.iter().enumerate() {
        for m in scope.iter() {
            let at = match *m {
                Match::Country(c) => c.index(),
                Match::Continent(c) => COUNTRIES + c.index(),
                Match::Any => COUNTRIES + CONTINENTS,
                Match::Net(_) | Match::Asn(_) => continue,
            };
            masks[at] |= 1 << i;
        }
    }
    masks.into_boxed_slice()
}

fn first(slot: &mut u16, region: u16) {
    if *slot == NONE {
        *slot = region;
    }
}

/// Whether `a` and `b` (same family) share their first `prefix` bits.
/// Addresses of different families never do.
#[inline]
pub(super) fn same_network(a: IpAddr, b: IpAddr, prefix: u8) -> bool {
    net::cut(a, prefix) == net::cut(b, prefix)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::place::countries::Country;

    /// The region index of `regions`, each a list of entries.
    pub(in crate::plan) fn idx(regions: &[Vec<Match>]) -> RegionIndex {
        RegionIndex::new(regions.iter().map(|r| r.as_slice()))
    }

    pub(in crate::plan) fn m(s: &str) -> Match {
        Match::parse(s).unwrap()
    }

    fn place(cc: &str, prefix_len: u8) -> Place {
        let country = Country::parse(cc);
        Place {
            country,
            continent: country.and_then(Country::continent),
            prefix_len,
            ..Place::default()
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
        // (client, its country and database prefix) → (region, scope)
        for (ip, cc, prefix, region, scope) in [
            ("81.2.69.142", "GB", 18, 0, 24),
            ("81.2.70.1", "GB", 18, 1, 24),
            ("89.160.20.112", "SE", 17, 2, 17),
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let want = Decision {
                region,
                scope,
                mask: 0,
            };
            assert_eq!(r.decide(ip, &place(cc, prefix)), want, "{ip}");
        }
        let ip: IpAddr = "89.160.20.112".parse().unwrap();
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
}
