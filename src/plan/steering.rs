//! Contract, the steering semantics: what a query does with a [`Plan`]. A name is found
//! by its wire form ([`Plan::get_wire`]); [`Steered::situate`] says where a client
//! lands (locate, decide the region and drains and how far that holds, choose), and
//! [`Steered::answer`] picks a CDN from there: the one function the fast path, the full
//! path and explain answer with. Content steering and explain read the same situation.
//!
//! A query does one geo lookup, one region lookup in precomputed tables, and one
//! weighted pick over at most a few CDNs (rendezvous hashing of a key,
//! [`crate::selection`]). Nothing here decides policy: the planner
//! (`control::decide::planner`) did that.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use hickory_proto::rr::Name;
use rand::{Rng, RngExt};

use super::layout::{wire_name, Choice, Header, Labels, Plan, Target, WIDE};
use super::regions::{self, same_network, Decision, COUNTRIES};
use crate::config::{ContentSteering, Match};
use crate::place::geo::{GeoDb, Place};
use crate::selection;

/// The why of a plan without any (`Plan::default`).
static EMPTY_WHY: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from(""));

/// One steered name of a plan: what the data plane looks up and answers from.
#[derive(Clone, Copy, Debug)]
pub struct Steered<'p> {
    plan: &'p Plan,
    header: &'p Header,
    labels: &'p Labels,
}

/// Where a client lands for one steered name: where it is, the region and drains it
/// falls in (and how far around it that holds), and the choice that answers it.
#[derive(Clone, Copy, Debug)]
pub struct Situation<'p> {
    /// The client's place; its origin AS only for a name whose answer depends on it.
    pub place: Place,
    pub decision: Decision,
    /// The choice of the decision's region and drains ([`Steered::choose`]).
    pub choice: &'p Choice,
}

/// The answer a pick gave.
pub struct Pick<'p> {
    pub choice: &'p Choice,
    /// Index into the name's targets ([`Steered::target`]).
    pub target: usize,
    /// The CNAME in uncompressed wire form, as the UDP fast path copies it.
    pub cname_wire: &'p [u8],
    answered: &'p AtomicU64,
}

/// Who asks about whom: what a steered answer may depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asker {
    /// The packet's source: the resolver (or a client asking directly).
    pub resolver: IpAddr,
    /// The address located: the ECS address when the query asks for a tailored answer
    /// (source prefix above 0), else the resolver.
    pub client: IpAddr,
    /// The ECS source prefix; `None` without ECS (0: the client opted out).
    pub source: Option<u8>,
}

/// A steered answer: the CDN picked, the decision behind it, and the ECS scope to echo.
pub struct Answer<'p> {
    pub pick: Pick<'p>,
    pub decision: Decision,
    /// The ECS scope prefix of the answer (0 when not tailored).
    pub scope: u8,
}

// === impl Plan ===

impl Plan {
    fn steered(&self, i: usize) -> Steered<'_> {
        Steered {
            plan: self,
            header: &self.names[i],
            labels: &self.labels[i],
        }
    }

    /// The steered name, if `name` is one (in any case).
    ///
    /// # Hot path
    /// The name's wire form on the stack, then a table lookup; no allocation.
    pub fn get(&self, name: &Name) -> Option<Steered<'_>> {
        let mut buf = [0u8; 255];
        self.get_wire(wire_name(name, &mut buf)?)
    }

    /// The steered name whose lowercase wire form is `wire`, if any.
    ///
    /// # Hot path
    /// A hash of the bytes and a probe of a table at most half full (`Plan::find`); no
    /// allocation.
    pub fn get_wire(&self, wire: &[u8]) -> Option<Steered<'_>> {
        self.find(wire).map(|i| self.steered(i))
    }

    /// In policy order.
    pub fn names(&self) -> impl Iterator<Item = Steered<'_>> {
        (0..self.names.len()).map(|i| self.steered(i))
    }
}

// === impl Asker ===

impl Asker {
    /// A query from `resolver`, with its ECS option's address and source prefix.
    pub fn new(resolver: IpAddr, ecs: Option<(IpAddr, u8)>) -> Asker {
        let client = match ecs {
            Some((ip, source)) if source > 0 => ip,
            _ => resolver,
        };
        Asker {
            resolver,
            client,
            source: ecs.map(|(_, s)| s),
        }
    }

    /// Whether the answer is tailored to the ECS address (and echoes a scope).
    pub fn tailored(&self) -> bool {
        self.source.is_some_and(|s| s > 0)
    }
}

// === impl Steered ===

impl<'p> Steered<'p> {
    /// The name as configured (lowercase, absolute).
    pub fn name(self) -> &'p Name {
        &self.labels.name
    }

    /// TTL of the CNAME answer.
    pub fn ttl(self) -> u32 {
        self.header.ttl
    }

    /// The name's country table: the first region listing each country.
    #[inline]
    fn by_country(self) -> &'p [u16] {
        let at = self.header.countries as usize;
        &self.plan.countries[at..at + COUNTRIES]
    }

    /// Where `ip` lands for this name: its place ([`Steered::locate`]), its region and
    /// drains with the ECS scope of that finding (the widest block around the client
    /// whose every address gets the same answer, neighbouring networks of other
    /// countries in the same region included), and the choice that answers it.
    ///
    /// Without `tailored` (no ECS, or source /0) no scope is echoed: the steps up are
    /// not followed and the scope is 0.
    ///
    /// # Hot path
    /// One geo lookup (and an ASN lookup for names that need it), table lookups, a set
    /// test per step up the geo database's tree ([`GeoDb::widest`], tailored only) and,
    /// only for policies with CIDR entries or location-scoped drains, a short scan; no
    /// allocation.
    #[inline]
    pub fn situate(self, geo: &GeoDb, ip: IpAddr, tailored: bool) -> Situation<'p> {
        let place = self.locate(geo, ip);
        let regions = &self.header.regions;
        let decision = if !regions.location_dependent && self.header.scopes == 0 {
            Decision {
                region: regions.default as usize,
                scope: 0,
                mask: 0,
            }
        } else {
            // What the answer is by place alone, and how far around the client that
            // holds.
            let by_country = self.by_country();
            let masks = &self.labels.drain_masks;
            let by_place =
                regions::by_place(regions, by_country, masks, self.header.scopes, &place);
            let widest = match self
                .plan
                .allowed
                .get(self.header.choices as usize + by_place)
            {
                Some(allowed) if tailored => geo.widest(ip, &place, allowed),
                _ => place.prefix_len,
            };
            self.decide(ip, &place, by_country, by_place, widest, tailored)
        };
        Situation {
            place,
            decision,
            choice: self.choose(&decision),
        }
    }

    /// The region and drains of a client at `ip` and `place`, whose choice by place
    /// alone is `by_place` and holds over `widest` bits around it, and the ECS scope of
    /// that finding: `widest`, narrowed past the CIDR and AS entries and drain scopes
    /// that cut it (0 without `tailored`, or when the region does not depend on the
    /// client and no drain scope splits it).
    ///
    /// # Hot path
    /// Table lookups and, only for policies with CIDR entries or location-scoped
    /// drains, a short scan.
    #[inline]
    fn decide(
        self,
        ip: IpAddr,
        place: &Place,
        by_country: &[u16],
        by_place: usize,
        widest: u8,
        tailored: bool,
    ) -> Decision {
        let regions = &self.header.regions;
        let at = regions.nets as usize;
        let nets = &self.plan.nets[at..at + regions.nets_len as usize];
        let mut d = regions.decide(by_country, nets, &self.labels.asns, ip, place, widest);
        if !tailored {
            d.scope = 0;
        }
        if self.header.scopes == 0 {
            return d;
        }
        if d.scope == 0 {
            d.scope = widest.min(if ip.is_ipv4() { 32 } else { 128 });
        }
        d.mask = by_place & ((1 << self.header.scopes) - 1);
        for (i, scope) in self.labels.drain_scopes.iter().enumerate() {
            for m in scope.iter() {
                // A CIDR scope splits the networks it cuts: the answer's scope narrows.
                match *m {
                    Match::Net(n) => {
                        if tailored
                            && n.prefix_len() > d.scope
                            && same_network(ip, n.addr(), d.scope)
                        {
                            d.scope = n.prefix_len();
                        }
                        if n.contains(&ip) {
                            d.mask |= 1 << i;
                        }
                    }
                    Match::Asn(a) => {
                        if tailored {
                            d.scope = d.scope.max(place.origin.prefix_len);
                        }
                        if place.origin.asn == Some(a) {
                            d.mask |= 1 << i;
                        }
                    }
                    _ => {}
                }
            }
        }
        d
    }

    /// The choice for a decision.
    #[inline]
    pub fn choose(self, d: &Decision) -> &'p Choice {
        let i = (d.region << self.header.scopes) | d.mask;
        &self.plan.choices[self.header.choices as usize + i]
    }

    /// The choice of a region for clients outside every location-scoped drain.
    pub fn choice(self, region: usize) -> &'p Choice {
        let i = region << self.header.scopes;
        &self.plan.choices[self.header.choices as usize + i]
    }

    /// The key of a pick for a query from `resolver` about a client in `client /
    /// prefix` (the ECS address cut to the scope echoed; prefix 0 without ECS) at `now`
    /// (Unix seconds): consistent ([`selection::key`]), or drawn from `rng` for
    /// `selection: random`.
    ///
    /// # Hot path
    /// A few multiplies, or one draw; no allocation.
    pub fn pick_key<R: Rng + ?Sized>(
        self,
        resolver: IpAddr,
        client: IpAddr,
        prefix: u8,
        now: u64,
        rng: &mut R,
    ) -> u64 {
        if self.header.random {
            rng.random()
        } else {
            selection::key(resolver, client, prefix, now)
        }
    }

    /// Where `ip` is, as far as this name's answer cares: its place, and its origin AS
    /// only when the name has AS entries.
    ///
    /// # Hot path
    /// One geo lookup, and an ASN lookup for names that need it; no allocation.
    #[inline]
    pub fn locate(self, geo: &GeoDb, ip: IpAddr) -> Place {
        let mut place = geo.locate(ip);
        if self.header.origin {
            place.origin = geo.origin(ip);
        }
        place
    }

    /// The answer to `asker` at `now` (Unix seconds): where the client lands
    /// ([`Steered::situate`]), then the pick. The one function the fast path, the full
    /// path and explain answer with; `rng` draws only for `selection: random`.
    ///
    /// # Hot path
    /// One geo lookup, table lookups, one pick; no allocation.
    pub fn answer<R: Rng + ?Sized>(
        self,
        geo: &GeoDb,
        asker: &Asker,
        now: u64,
        rng: &mut R,
    ) -> Answer<'p> {
        let Situation {
            decision, choice, ..
        } = self.situate(geo, asker.client, asker.tailored());
        let scope = decision.scope;
        // The network in the key goes as far as the scope echoed, and no further than
        // what the resolver told.
        let within = asker.source.map_or(0, |s| s.min(scope));
        let key = self.pick_key(asker.resolver, asker.client, within, now, rng);
        Answer {
            pick: self.pick(choice, key),
            decision,
            scope,
        }
    }

    /// For explain: the target `asker` gets at `now`, and until when (Unix seconds)
    /// that answer holds. `None` for `selection: random`, whose answer is a draw per
    /// query.
    pub fn consistent_answer(
        self,
        geo: &GeoDb,
        asker: &Asker,
        now: u64,
    ) -> Option<(&'p Target, u64)> {
        if self.header.random {
            return None;
        }
        let a = self.answer(geo, asker, now, &mut rand::rng());
        let within = asker.source.map_or(0, |s| s.min(a.scope));
        let until = selection::window_end(asker.resolver, asker.client, within, now);
        Some((self.target(a.pick.target), until))
    }

    /// Whether picks are random draws (`selection: random`).
    pub fn is_random(self) -> bool {
        self.header.random
    }

    /// The CDN of `choice` (one of this name's) with the highest rendezvous score for
    /// `key` ([`selection::score`]).
    ///
    /// # Hot path
    /// One score per CDN in the choice's own cache line (a hash, a logarithm, a
    /// division); no allocation.
    pub fn pick(self, choice: &'p Choice, key: u64) -> Pick<'p> {
        let at = self.header.salts as usize;
        let score = |target: usize, w: u64| selection::score(key, self.plan.salts[at + target], w);
        let (target, start, answered) = if choice.n != WIDE {
            let mut best = (f64::NEG_INFINITY, 0);
            let mut prev = 0;
            for i in 0..usize::from(choice.n) {
                let w = choice.sums[i] - prev;
                prev = choice.sums[i];
                let s = score(usize::from(choice.target[i]), u64::from(w));
                if s > best.0 {
                    best = (s, i);
                }
            }
            let i = best.1;
            let start = usize::from(choice.start[i]);
            (usize::from(choice.target[i]), start, &choice.answered[i])
        } else {
            let entries = &self.plan.wide[choice.sums[0] as usize];
            let mut best = (f64::NEG_INFINITY, 0);
            let mut prev = 0;
            for (i, e) in entries.iter().enumerate() {
                let s = score(e.target, e.sum - prev);
                prev = e.sum;
                if s > best.0 {
                    best = (s, i);
                }
            }
            let e = &entries[best.1];
            (e.target, e.start, &e.answered)
        };
        let at = self.header.wire as usize + start;
        let len = usize::from(self.plan.wire[at]);
        Pick {
            choice,
            target,
            cname_wire: &self.plan.wire[at + 1..at + 1 + len],
            answered,
        }
    }

    /// (target index, running sum, answers) of each CDN of a choice.
    fn entries(self, choice: &'p Choice) -> Vec<(usize, u64, &'p AtomicU64)> {
        if choice.n == WIDE {
            return self.plan.wide[choice.sums[0] as usize]
                .iter()
                .map(|e| (e.target, e.sum, &e.answered))
                .collect();
        }
        (0..usize::from(choice.n))
            .map(|i| {
                let target = usize::from(choice.target[i]);
                (target, u64::from(choice.sums[i]), &choice.answered[i])
            })
            .collect()
    }

    /// (target, weight) pairs of a choice, for explain and tests; zero weights are
    /// left out.
    pub fn weights(self, choice: &'p Choice) -> impl Iterator<Item = (&'p Target, u64)> {
        let mut prev = 0;
        self.entries(choice).into_iter().map(move |(t, sum, _)| {
            let w = sum - prev;
            prev = sum;
            (&self.labels.targets[t], w)
        })
    }

    /// (index into the targets, weight) of each CDN of a choice; zero weights are left
    /// out. Allocates: not for the DNS hot path.
    pub fn weighted(self, choice: &'p Choice) -> impl Iterator<Item = (usize, u64)> + 'p {
        let mut prev = 0;
        self.entries(choice).into_iter().map(move |(t, sum, _)| {
            let w = sum - prev;
            prev = sum;
            (t, w)
        })
    }

    /// The rendezvous salt of target `i` ([`selection::salt`] of its CDN name).
    pub fn salt(self, i: usize) -> u64 {
        self.plan.salts[self.header.salts as usize + i]
    }

    /// Content steering of the name: pathway ids by target, TTL, throughput floor.
    pub fn content(self) -> &'p ContentSteering {
        &self.labels.content
    }

    /// (region name, CDN name, answers) for every CDN of every choice, for the
    /// metrics. A region with location-scoped drains lists each CDN once per choice.
    pub fn answered(self) -> impl Iterator<Item = (&'p Arc<str>, &'p Arc<str>, u64)> {
        let shift = self.header.scopes;
        let regions = self.labels.regions.len() << shift;
        let at = self.header.choices as usize;
        let choices = &self.plan.choices[at..at + regions];
        choices.iter().enumerate().flat_map(move |(i, c)| {
            let region = &self.labels.regions[i >> shift];
            self.entries(c).into_iter().map(move |(t, _, n)| {
                let cdn = &self.labels.targets[t].cdn;
                (region, cdn, n.load(Ordering::Relaxed))
            })
        })
    }

    /// The name as text, for metric labels.
    pub fn text(self) -> &'p Arc<str> {
        &self.labels.text
    }

    /// The name of region `i`.
    pub fn region_name(self, i: usize) -> &'p str {
        self.labels.regions.get(i).map_or("", |r| r)
    }

    /// How many regions the name has.
    pub fn regions(self) -> usize {
        self.labels.regions.len()
    }

    /// How many location scopes of drains the name has: each region has `2^n` choices,
    /// one per mask of [`Decision::mask`].
    pub fn drain_scopes(self) -> usize {
        usize::from(self.header.scopes)
    }

    /// Every CDN the name can be answered with, in policy order.
    pub fn targets(self) -> &'p [Target] {
        &self.labels.targets
    }

    /// The pre-signed RRSIGs of target `i`'s CNAME (RDLENGTH and RDATA of each); empty
    /// when unsigned.
    pub fn rrsigs(self, i: usize) -> &'p [u8] {
        self.labels.rrsigs.get(i).map_or(&[], |s| &s[..])
    }

    /// Why `choice` (one of this name's) answers as it does, in one line (the name,
    /// region, reason, drain id or failover step, policy version): what dnstap's
    /// steering decision carries. Empty for a plan built without it.
    pub fn why(self, choice: &Choice) -> &'p Arc<str> {
        let whys = &self.plan.whys;
        whys.get(usize::from(choice.why))
            .or_else(|| whys.first())
            .unwrap_or(&EMPTY_WHY)
    }

    /// Target `i` (as in [`Pick::target`]).
    pub fn target(self, i: usize) -> &'p Target {
        &self.labels.targets[i]
    }
}

// === impl Pick ===

impl Pick<'_> {
    /// Counts this answer as given: one relaxed atomic add on the choice's cache line.
    pub fn count(&self) {
        self.answered.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Selection;
    use crate::plan::layout::tests::{many, one, spec};
    use crate::plan::layout::{ChoiceSpec, Reason, INLINE};
    use crate::plan::regions::tests::{idx, m};
    use rand::SeedableRng;

    #[test]
    fn an_answer_is_where_the_client_lands_then_the_pick() {
        let geo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/geo/GeoIP2-Country-Test.mmdb");
        let geo = GeoDb::open(&geo).unwrap();
        // GB answered by `a` alone, everyone else by `b` alone.
        let mut s = spec("n.example.", &["a", "b"], &[vec![(0, 1)], vec![(1, 1)]]);
        s.index = idx(&[vec![m("GB")], vec![m("*")]]);
        s.selection = Selection::Consistent;
        let plan = Plan::new(vec![s], geo.places());
        let n = plan.names().next().unwrap();
        for (ip, region) in [("81.2.69.142", 0), ("89.160.20.112", 1), ("2001:db8::1", 1)] {
            let ip: IpAddr = ip.parse().unwrap();
            for tailored in [false, true] {
                let at = n.situate(&geo, ip, tailored);
                assert_eq!(at.decision.region, region, "{ip}");
                assert_eq!(at.place, n.locate(&geo, ip));
                assert!(std::ptr::eq(at.choice, n.choose(&at.decision)));
                if !tailored {
                    assert_eq!(at.decision.scope, 0, "{ip}: no scope without ECS");
                }
                let asker = Asker::new(ip, tailored.then_some((ip, 24)));
                let a = n.answer(&geo, &asker, 0, &mut rand::rng());
                assert_eq!(a.decision, at.decision, "{ip} tailored {tailored}");
                assert_eq!(a.scope, at.decision.scope);
                assert!(std::ptr::eq(a.pick.choice, at.choice));
                assert_eq!(a.pick.target, region, "{ip}");
            }
        }
        // Built for the database's places, the plan lets a tailored answer reach past
        // the client's own network, as far as every place around gets the same choice:
        // SE's network lies in a wide block of places all in the default region.
        let se = n.situate(&geo, "89.160.20.112".parse().unwrap(), true);
        assert!(se.decision.scope < se.place.prefix_len, "{se:?}");
    }

    #[test]
    fn pick_follows_weights_and_counts_where_it_picked() {
        let plan = one(
            "www.example.com.",
            &["a", "b", "c"],
            &[vec![(0, 70), (1, 0), (2, 30)]],
        );
        let s = plan.names().next().unwrap();
        let c = s.choice(0);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut a = 0;
        for _ in 0..10_000 {
            let p = s.pick(c, rng.random());
            let t = s.target(p.target);
            let mut buf = [0u8; 255];
            assert_eq!(p.cname_wire, wire_name(&t.cname, &mut buf).unwrap());
            match &*t.cdn {
                "a" => a += 1,
                "c" => {}
                other => panic!("zero-weight target {other} picked"),
            }
            p.count();
        }
        assert!((6_800..7_200).contains(&a), "{a}");
        assert_eq!(
            s.weights(c)
                .map(|(t, w)| (t.cdn.to_string(), w))
                .collect::<Vec<_>>(),
            vec![("a".into(), 70), ("c".into(), 30)]
        );
        let answered: Vec<(String, String, u64)> = s
            .answered()
            .map(|(r, c, n)| (r.to_string(), c.to_string(), n))
            .collect();
        assert_eq!(
            answered,
            vec![
                ("r0".into(), "a".into(), a),
                ("r0".into(), "c".into(), 10_000 - a)
            ]
        );
        assert!(ChoiceSpec::new(Reason::Normal, [(0, 0)]).is_none());
    }

    #[test]
    fn weight_tables_inline_and_on_the_heap_pick_alike() {
        for n in 1..=INLINE + 3 {
            let cdns: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
            let cdns: Vec<&str> = cdns.iter().map(|c| c.as_str()).collect();
            // Weights 1, 2, ..., n: the last target is picked with probability n / total.
            let plan = one(
                "n.example.",
                &cdns,
                &[(0..n).map(|i| (i, i as u64 + 1)).collect()],
            );
            let s = plan.names().next().unwrap();
            let c = s.choice(0);
            assert_eq!(c.n != WIDE, n <= INLINE);
            assert_eq!(
                s.weights(c).map(|(_, w)| w).collect::<Vec<_>>(),
                (1..=n as u64).collect::<Vec<_>>()
            );
            let mut rng = rand::rngs::SmallRng::seed_from_u64(n as u64);
            let draws = 20_000;
            let hits = (0..draws)
                .filter(|_| s.pick(c, rng.random()).target == n - 1)
                .count();
            let want = draws * 2 / (n + 1);
            assert!(
                hits.abs_diff(want) < draws / 20,
                "n={n}: {hits}, want {want}"
            );
        }
    }

    #[test]
    fn weights_beyond_u32_are_kept_wide_and_pick_alike() {
        let big = u64::from(u32::MAX);
        let plan = one(
            "n.example.",
            &["a", "b"],
            &[vec![(0, big), (1, big)], vec![(0, 1), (1, 1)]],
        );
        let s = plan.names().next().unwrap();
        assert_eq!(s.choice(0).n, WIDE);
        assert_eq!(s.choice(1).n, 2);
        for region in 0..2 {
            let c = s.choice(region);
            let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
            let a = (0..10_000)
                .filter(|_| {
                    let p = s.pick(c, rng.random());
                    p.count();
                    p.target == 0
                })
                .count();
            assert!((4_700..5_300).contains(&a), "region {region}: {a}");
            assert_eq!(
                s.weights(c).map(|(_, w)| w).sum::<u64>(),
                s.weights(c).next().unwrap().1 * 2
            );
        }
        let answered: u64 = s.answered().map(|(_, _, n)| n).sum();
        assert_eq!(answered, 20_000);
    }

    #[test]
    fn names_are_found_by_wire_form_in_any_case_and_others_are_not() {
        let (names, plan) = many(300);
        assert_eq!(plan.names().count(), 300);
        for (i, n) in names.iter().enumerate() {
            let upper = Name::from_ascii(n.to_uppercase()).unwrap();
            let s = plan.get(&upper).unwrap_or_else(|| panic!("{n} not found"));
            assert_eq!(s.name().to_string(), *n);
            assert_eq!(
                plan.names().nth(i).unwrap().name().to_string(),
                *n,
                "policy order"
            );
        }
        for miss in ["h300.example.com.", "h1.example.co.", "example.com.", "."] {
            assert!(
                plan.get(&Name::from_ascii(miss).unwrap()).is_none(),
                "{miss}"
            );
        }
        assert!(Plan::default().get_wire(&[0]).is_none());
    }
}
