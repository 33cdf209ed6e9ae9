//! The contract between the planes: an immutable `Plan` that the control plane builds
//! and the data plane reads, published together with the geo database and the zones as
//! one `Snapshot` behind an `ArcSwap`.
//!
//! A query does one atomic load of the snapshot, one geo lookup, one region lookup in
//! precomputed tables, and one weighted pick over at most a few CDNs (rendezvous
//! hashing of a key, [`crate::selection`]). Nothing here decides policy: the planner (`control::planner`) did that.
//!
//! # Layout
//! With many steered names the plan does not stay in the CPU's caches or its TLB, and
//! each pointer a query follows can be a miss. So what a query reads is packed into a
//! few flat tables shared by every name: a small open-addressing table of the names,
//! one header per name, every name's wire bytes (its own name, then its CNAMEs), every
//! name's country table, and every choice, each one cache line holding its weight
//! table, where its CNAMEs are, and its answer counts. The large tables sit on huge
//! pages ([`crate::huge`]). What only `explain`, the API and the metrics read (the name
//! as text, region and CDN names) sits apart, in `Labels`.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use hickory_proto::rr::Name;
use hickory_server::zone_handler::Catalog;
use ipnet::IpNet;
use rand::{Rng, RngExt};

use crate::config::{ContentSteering, Selection};
use crate::selection;

use crate::config::Match;
use crate::huge::Table;
use crate::place::geo::{GeoDb, Place};
use crate::place::wider::Places;

/// Everything a query needs, swapped as one piece so that no query ever sees a plan
/// from one configuration and zones from another.
pub struct Snapshot {
    pub plan: Plan,
    pub geo: Arc<GeoDb>,
    pub zones: Arc<Catalog>,
    /// When (Unix seconds) the signatures served expire; `None`: nothing is signed.
    pub signed_until: Option<u64>,
    /// The signed zones' denials (NXDOMAIN with both NSEC proofs); `None`: nothing is
    /// signed.
    pub denials: Option<Arc<crate::zones::denial::Denials>>,
}

/// The live snapshot: the data plane loads it, the control plane stores a new one.
pub type Live = ArcSwap<Snapshot>;

/// Every steered name, and how to answer it right now.
#[derive(Debug, Default)]
pub struct Plan {
    /// One header per name, in policy order.
    names: Table<Header>,
    /// Open addressing over the names' lowercase wire forms (labels with their lengths,
    /// the root's 0), so that the UDP fast path looks a query up by the bytes it
    /// received: `EMPTY`, or `hash tag << 32 | index into names`. At most half full.
    slots: Box<[u64]>,
    /// Per name: its lowercase wire form, then for each target its CNAME's length in
    /// wire form (one byte) and the CNAME in wire form.
    wire: Table<u8>,
    /// Per name: the first region listing each country (`COUNTRIES` entries).
    countries: Table<u16>,
    /// Per name: its CIDR entries with the first region listing each, shortest prefix
    /// first.
    nets: Table<(IpNet, u16)>,
    /// Per name: `2^drain_scopes` choices per region, in policy order: index
    /// `region << drain_scopes | mask`.
    choices: Table<Choice>,
    /// The weight tables of `WIDE` choices.
    wide: Box<[Box<[WideEntry]>]>,
    /// Per name: each target's rendezvous salt ([`selection::salt`] of its CDN name).
    salts: Table<u64>,
    /// Per name, for explain, the API and the metrics.
    labels: Box<[Labels]>,
    /// Per choice (same index as `choices`): the places of the geo database whose
    /// clients get that choice by their place alone ([`Plan::fit`]); empty until fitted,
    /// and then no answer reaches past its network.
    allowed: Box<[Places]>,
}

const EMPTY: u64 = u64::MAX;

/// Entries of a country table: one per two-letter code.
const COUNTRIES: usize = 676;

/// What a query reads of a name, besides the flat tables.
#[derive(Debug)]
struct Header {
    /// Where the name's bytes start in `Plan::wire`.
    wire: u32,
    key_len: u8,
    /// How many location scopes of drains (`Labels::drain_scopes`); each doubles the
    /// choices.
    scopes: u8,
    /// TTL of the CNAME answer (the incident TTL while any CDN is off its weight).
    ttl: u32,
    /// `selection: random`: a random key per query instead of a consistent one.
    random: bool,
    /// Whether the answer depends on the client's origin AS (AS entries in the regions
    /// or a drain's `where:`): only then is the ASN database read.
    origin: bool,
    /// Where the name's salts start in `Plan::salts`.
    salts: u32,
    /// Where the name's country table starts in `Plan::countries`.
    countries: u32,
    /// Where the name's choices start in `Plan::choices`.
    choices: u32,
    regions: Regions,
}

/// What only explain, the API, the metrics and the rare drain scopes read.
#[derive(Debug)]
struct Labels {
    /// The name as configured (lowercase, absolute).
    name: Name,
    /// `name` as text, for metric labels.
    text: Arc<str>,
    /// Region names, in policy order.
    regions: Box<[Arc<str>]>,
    targets: Box<[Target]>,
    /// Location scopes of active drains (`where: [GB]`): bit `i` of a client's mask is
    /// set when it matches `drain_scopes[i]`. Usually empty.
    drain_scopes: Box<[Box<[Match]>]>,
    /// The location-scoped drains a client falls in by its place, precomputed from
    /// `drain_scopes` ([`drain_masks`]): per country, per continent, then those that
    /// hold every place. Empty without such drains.
    drain_masks: Box<[u8]>,
    /// AS entries of the regions, with the first region listing each. Usually empty.
    asns: Box<[(u32, u16)]>,
    /// Content steering for players: pathway ids by target, TTL, throughput floor.
    content: ContentSteering,
    /// Per target: the pre-signed RRSIGs of its CNAME (RDLENGTH and RDATA of each),
    /// for DO=1 queries; empty when the zone is unsigned.
    rrsigs: Box<[Arc<[u8]>]>,
}

/// One steered name of a plan: what the data plane looks up and answers from.
#[derive(Clone, Copy, Debug)]
pub struct Steered<'p> {
    plan: &'p Plan,
    header: &'p Header,
    labels: &'p Labels,
}

/// A steered name as the planner describes it; [`Plan::new`] lays it out.
pub struct NameSpec {
    pub name: Name,
    pub ttl: u32,
    pub selection: Selection,
    pub index: RegionIndex,
    /// Region names, in policy order.
    pub regions: Vec<Arc<str>>,
    pub targets: Vec<Target>,
    /// Location scopes of active drains (see `Labels::drain_scopes`).
    pub drain_scopes: Vec<Box<[Match]>>,
    /// `2^drain_scopes.len()` choices per region (index `region << drain_scopes.len()
    /// | mask`), each built from indexes into `targets`.
    pub choices: Vec<ChoiceSpec>,
    /// Content steering: `pathways` has one id per target.
    pub content: ContentSteering,
}

/// What a region answers: the CDNs that may serve it now, their weights, and how many
/// answers each has given.
///
/// One cache line, which a pick reads and counts in without following a pointer, for
/// up to [`INLINE`] CDNs whose weights sum within `u32`: always, for validated
/// policies of up to four CDNs (weights are at most 10^6, scaled by at most 100).
/// Other choices are `WIDE`: their table is in `Plan::wide`.
#[derive(Debug)]
#[repr(align(64))]
pub struct Choice {
    /// Answers given with each CDN; the metrics read them at scrape time.
    answered: [AtomicU64; INLINE],
    /// Running sums of the weights; the last is the total (> 0). For a `WIDE` choice,
    /// `sums[0]` is its index in `Plan::wide`.
    sums: [u32; INLINE],
    /// Where each CDN's CNAME is among the name's bytes in `Plan::wire` (its length
    /// byte).
    start: [u16; INLINE],
    /// Each CDN's index in the name's targets.
    target: [u8; INLINE],
    /// How many CDNs are inline, or `WIDE`.
    n: u8,
    /// Why the weights are what they are.
    pub reason: Reason,
}

/// CDNs a choice holds inline (policies have 2 to 4).
const INLINE: usize = 4;
const _: () = assert!(
    std::mem::size_of::<Choice>() == 64,
    "a choice is one cache line"
);
const WIDE: u8 = u8::MAX;

/// One CDN of a `WIDE` choice.
#[derive(Debug)]
struct WideEntry {
    /// Running sum of the weights up to and including this one.
    sum: u64,
    answered: AtomicU64,
    target: usize,
    start: usize,
}

/// A choice as the planner describes it.
pub struct ChoiceSpec {
    reason: Reason,
    /// (index into the targets, running sum of the weights); zero weights left out.
    weighted: Vec<(usize, u64)>,
}

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

/// A steered answer: the CDN picked, the decision behind it, and the ECS scope to echo.
pub struct Answer<'p> {
    pub pick: Pick<'p>,
    pub decision: Decision,
    /// The ECS scope prefix of the answer (0 when not tailored).
    pub scope: u8,
}

/// Region lookup tables: for each key, the index of the *first* region that matches it.
/// The first matching region overall is the smallest index among the keys that match.
#[derive(Debug)]
pub struct RegionIndex {
    by_country: Box<[u16; COUNTRIES]>,
    /// CIDR entries with the first region listing each, shortest prefix first.
    nets: Vec<(IpNet, u16)>,
    /// AS entries with the first region listing each.
    asns: Vec<(u32, u16)>,
    rest: Regions,
}

/// A region index but for its country table and CIDR entries, which the plan keeps in
/// flat tables.
#[derive(Debug)]
struct Regions {
    by_continent: [u16; 7],
    /// Where the CIDR entries start in `Plan::nets`, and how many there are.
    nets: u32,
    nets_len: u32,
    /// The region with `"*"`.
    default: u16,
    /// False when every client gets the same region (ECS scope 0).
    location_dependent: bool,
}

const NONE: u16 = u16::MAX;

// === impl Plan ===

impl Plan {
    /// Lays the names out. A name whose wire form does not fit 255 bytes is left out
    /// (validation refuses such names before).
    pub fn new(specs: Vec<NameSpec>) -> Plan {
        let mut buf = [0u8; 255];
        let specs: Vec<NameSpec> = specs
            .into_iter()
            .filter(|s| wire_name(&s.name, &mut buf).is_some())
            .collect();
        let mut wire_len = 0;
        for s in &specs {
            let cnames = s.targets.iter().map(|t| &t.cname);
            for name in std::iter::once(&s.name).chain(cnames) {
                wire_len += 1 + wire_name(name, &mut buf).map_or(1, <[u8]>::len);
            }
        }
        let choices_len: usize = specs.iter().map(|s| s.choices.len()).sum();
        let nets_len = specs.iter().map(|s| s.index.nets.len()).sum();
        let mut plan = Plan {
            names: Table::with_capacity(specs.len()),
            nets: Table::with_capacity(nets_len),
            slots: Box::default(),
            wire: Table::with_capacity(wire_len),
            countries: Table::with_capacity(specs.len() * COUNTRIES),
            choices: Table::with_capacity(choices_len),
            wide: Box::default(),
            salts: Table::with_capacity(specs.iter().map(|s| s.targets.len()).sum()),
            labels: Box::default(),
            allowed: Box::default(),
        };
        let mut labels = Vec::with_capacity(specs.len());
        let mut wide = Vec::new();
        for spec in specs {
            let (header, label) = plan.lay_out(spec, &mut wide);
            plan.names.push(header);
            labels.push(label);
        }
        plan.labels = labels.into_boxed_slice();
        plan.wide = wide.into_boxed_slice();
        let size = (plan.names.len() * 2).next_power_of_two().max(8);
        let mut slots = vec![EMPTY; size].into_boxed_slice();
        for i in 0..plan.names.len() {
            let h = hash(plan.steered(i).key());
            let mut at = h as usize & (size - 1);
            while slots[at] != EMPTY {
                at = (at + 1) & (size - 1);
            }
            slots[at] = (h >> 32) << 32 | i as u64;
        }
        plan.slots = slots;
        plan
    }

    /// Fits the plan to a geo database's places (`GeoDb::places`): for every choice,
    /// which places get it, so that answers reach as far as their choice holds. The
    /// plan must then be used with that database only (a `Snapshot` pairs them).
    pub fn fit(&mut self, places: &[Place]) {
        let mut allowed = vec![Places::default(); self.choices.len()];
        for s in self.names() {
            let at = s.header.countries as usize;
            let by_country = &self.countries[at..at + COUNTRIES];
            for (i, p) in places.iter().enumerate() {
                let choice = s.header.choices as usize + s.by_place(by_country, p);
                allowed[choice].insert(i as u16);
            }
        }
        self.allowed = allowed.into_boxed_slice();
    }

    /// Appends one name's bytes, country table and choices to the flat tables.
    fn lay_out(&mut self, spec: NameSpec, wide: &mut Vec<Box<[WideEntry]>>) -> (Header, Labels) {
        let at = self.wire.len();
        let mut buf = [0u8; 255];
        let key = wire_name(&spec.name, &mut buf).unwrap_or(&[0]);
        let key_len = key.len() as u8;
        self.wire.extend_from_slice(key);
        let mut starts = Vec::with_capacity(spec.targets.len());
        for t in &spec.targets {
            starts.push(self.wire.len() - at);
            // Configured names are checked to fit when the policy is loaded; the root
            // stands in for one that does not.
            let cname = wire_name(&t.cname, &mut buf).unwrap_or(&[0]);
            self.wire.push(cname.len() as u8);
            self.wire.extend_from_slice(cname);
        }
        let header = Header {
            wire: at as u32,
            key_len,
            scopes: spec.drain_scopes.len() as u8,
            ttl: spec.ttl,
            random: spec.selection == Selection::Random,
            origin: !spec.index.asns.is_empty()
                || spec
                    .drain_scopes
                    .iter()
                    .flatten()
                    .any(|m| matches!(m, Match::Asn(_))),
            salts: self.salts.len() as u32,
            countries: self.countries.len() as u32,
            choices: self.choices.len() as u32,
            regions: Regions {
                nets: self.nets.len() as u32,
                nets_len: spec.index.nets.len() as u32,
                ..spec.index.rest
            },
        };
        for t in &spec.targets {
            self.salts.push(selection::salt(&t.cdn));
        }
        self.countries.extend_from_slice(&spec.index.by_country[..]);
        self.nets.extend_from_slice(&spec.index.nets);
        for c in &spec.choices {
            self.choices.push(Choice::lay_out(c, &starts, wide));
        }
        let labels = Labels {
            text: Arc::from(spec.name.to_string()),
            name: spec.name,
            regions: spec.regions.into_boxed_slice(),
            targets: spec.targets.into_boxed_slice(),
            drain_masks: drain_masks(&spec.drain_scopes),
            drain_scopes: spec.drain_scopes.into_boxed_slice(),
            asns: spec.index.asns.into_boxed_slice(),
            content: spec.content,
            rrsigs: Box::default(),
        };
        (header, labels)
    }

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
    /// A hash of the bytes, then linear probing over a table at most half full whose
    /// slots carry a 32-bit tag, so that a name is compared only on a tag match. The
    /// hash is not keyed: the table holds only configured names, so a client choosing
    /// its query name chooses where a probe starts, never how long the runs are.
    pub fn get_wire(&self, wire: &[u8]) -> Option<Steered<'_>> {
        let h = hash(wire);
        let mask = self.slots.len().checked_sub(1)?;
        let mut at = h as usize & mask;
        loop {
            let slot = self.slots[at];
            if slot == EMPTY {
                return None;
            }
            if slot >> 32 == h >> 32 {
                let s = self.steered(slot as u32 as usize);
                if s.key() == wire {
                    return Some(s);
                }
            }
            at = (at + 1) & mask;
        }
    }

    /// Attaches the pre-signed RRSIGs of each (name, CNAME target) that `signed` gives
    /// (`crate::dnssec`); a name missing one for any target stays unsigned.
    pub fn set_rrsigs(&mut self, signed: impl Fn(&Name, &Name) -> Option<Arc<[u8]>>) {
        for l in self.labels.iter_mut() {
            let sigs: Option<Vec<_>> = l
                .targets
                .iter()
                .map(|t| signed(&l.name, &t.cname))
                .collect();
            l.rrsigs = sigs.unwrap_or_default().into_boxed_slice();
        }
    }

    /// In policy order.
    pub fn names(&self) -> impl Iterator<Item = Steered<'_>> {
        (0..self.names.len()).map(|i| self.steered(i))
    }
}

/// FxHash-style: 8 bytes at a time, one multiply each.
fn hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h = bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let word = u64::from_le_bytes(c.try_into().unwrap_or_default());
        h = (h.rotate_left(5) ^ word).wrapping_mul(K);
    }
    let mut tail = [0u8; 8];
    tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    h = (h.rotate_left(5) ^ u64::from_le_bytes(tail)).wrapping_mul(K);
    // The multiply leaves the low bits weakest; the slot index uses them.
    h ^ (h >> 29)
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

    /// The name's lowercase wire form.
    fn key(self) -> &'p [u8] {
        let at = self.header.wire as usize;
        &self.plan.wire[at..at + usize::from(self.header.key_len)]
    }

    /// Finds the client's region, the drains it falls in, and the ECS scope of that
    /// finding: the widest block around the client whose every address gets the same
    /// answer (neighbouring networks of other countries in the same region included).
    ///
    /// Without `tailored` (no ECS, or source /0) no scope is echoed: the steps up are
    /// not followed and the scope is 0.
    ///
    /// # Hot path
    /// Table lookups, a set test per step up the geo database's tree
    /// ([`GeoDb::widest`], tailored only) and, only for policies with CIDR entries or
    /// location-scoped drains, a short scan.
    pub fn decide(self, ip: IpAddr, place: &Place, geo: &GeoDb, tailored: bool) -> Decision {
        let at = self.header.countries as usize;
        let by_country = &self.plan.countries[at..at + COUNTRIES];
        let regions = &self.header.regions;
        if !regions.location_dependent && self.header.scopes == 0 {
            return Decision {
                region: regions.default as usize,
                scope: 0,
                mask: 0,
            };
        }
        // What the answer is by place alone, and how far around the client that holds.
        let by_place = self.by_place(by_country, place);
        let at = self.header.choices as usize + by_place;
        let widest = match self.plan.allowed.get(at) {
            Some(allowed) if tailored => geo.widest(ip, place, allowed),
            _ => place.prefix_len,
        };
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

    /// The index of the choice a client at `place` gets by its place alone (CIDR
    /// entries aside): its region, shifted, and the drain scopes it falls in.
    ///
    /// # Hot path
    /// Table lookups: the drains by place are precomputed ([`drain_masks`]).
    fn by_place(self, by_country: &[u16], place: &Place) -> usize {
        let region = usize::from(self.header.regions.of_place(by_country, place));
        let masks = &self.labels.drain_masks[..];
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
        region << self.header.scopes | usize::from(mask)
    }

    /// The choice for a decision.
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
    pub fn locate(self, geo: &GeoDb, ip: IpAddr) -> Place {
        let mut place = geo.locate(ip);
        if self.header.origin {
            place.origin = geo.origin(ip);
        }
        place
    }

    /// The answer to `asker` at `now` (Unix seconds): locate, decide the region and
    /// drains, choose, pick. The one function the fast path, the full path and
    /// explain answer with; `rng` draws only for `selection: random`.
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
        let place = self.locate(geo, asker.client);
        let decision = self.decide(asker.client, &place, geo, asker.tailored());
        let scope = decision.scope;
        // The network in the key goes as far as the scope echoed, and no further than
        // what the resolver told.
        let within = asker.source.map_or(0, |s| s.min(scope));
        let key = self.pick_key(asker.resolver, asker.client, within, now, rng);
        let pick = self.pick(self.choose(&decision), key);
        Answer {
            pick,
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

    /// Target `i` (as in [`Pick::target`]).
    pub fn target(self, i: usize) -> &'p Target {
        &self.labels.targets[i]
    }
}

// === impl ChoiceSpec ===

impl ChoiceSpec {
    /// `weighted` lists (index into the name's targets, weight). `None` if every
    /// weight is zero or they overflow (the planner never builds such a choice).
    pub fn new(
        reason: Reason,
        weighted: impl IntoIterator<Item = (usize, u64)>,
    ) -> Option<ChoiceSpec> {
        let mut total = 0u64;
        let mut sums = Vec::new();
        for (target, w) in weighted.into_iter().filter(|(_, w)| *w > 0) {
            total = total.checked_add(w)?;
            sums.push((target, total));
        }
        (total > 0).then_some(ChoiceSpec {
            reason,
            weighted: sums,
        })
    }
}

// === impl Choice ===

impl Choice {
    /// Inline when it fits, else `WIDE` with its table pushed onto `wide`. `starts`:
    /// where each target's CNAME is among the name's bytes.
    fn lay_out(spec: &ChoiceSpec, starts: &[usize], wide: &mut Vec<Box<[WideEntry]>>) -> Choice {
        let mut c = Choice {
            answered: Default::default(),
            sums: [0; INLINE],
            start: [0; INLINE],
            target: [0; INLINE],
            n: WIDE,
            reason: spec.reason,
        };
        let inline = spec.weighted.len() <= INLINE
            && spec.weighted.iter().all(|&(t, sum)| {
                u8::try_from(t).is_ok()
                    && u32::try_from(sum).is_ok()
                    && u16::try_from(starts[t]).is_ok()
            });
        if inline {
            for (i, &(t, sum)) in spec.weighted.iter().enumerate() {
                c.sums[i] = sum as u32;
                c.start[i] = starts[t] as u16;
                c.target[i] = t as u8;
            }
            c.n = spec.weighted.len() as u8;
        } else {
            c.sums[0] = wide.len() as u32;
            let entries = spec.weighted.iter().map(|&(t, sum)| WideEntry {
                sum,
                answered: AtomicU64::new(0),
                target: t,
                start: starts[t],
            });
            wide.push(entries.collect());
        }
        c
    }
}

// === impl Pick ===

impl Pick<'_> {
    /// Counts this answer as given: one relaxed atomic add on the choice's cache line.
    pub fn count(&self) {
        self.answered.fetch_add(1, Ordering::Relaxed);
    }
}

// === impl Target ===

impl Target {
    pub fn new(cdn: Arc<str>, cname: Name) -> Target {
        Target { cdn, cname }
    }
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
    #[allow(clippy::too_many_arguments)]
    fn decide(
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

/// Continents, after the countries in [`drain_masks`].
const CONTINENTS: usize = 7;
const _: () = assert!(crate::config::MAX_DRAIN_SCOPES <= 8, "a drain mask is a u8");

/// For each country, then each continent, then every place: the location-scoped
/// drains (bit `i` for `scopes[i]`) whose entries hold it by place
/// ([`Match::covers_place`]; CIDR and AS entries are decided per address). Empty
/// without scopes.
fn drain_masks(scopes: &[Box<[Match]>]) -> Box<[u8]> {
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
    use crate::place::countries::Country;
    use rand::{RngExt, SeedableRng};

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

    /// A name with CDNs `cdns` (CNAME `<cdn>.example.net.`) and one region per entry of
    /// `regions`, each listing (CDN index, weight).
    fn spec(name: &str, cdns: &[&str], regions: &[Vec<(usize, u64)>]) -> NameSpec {
        let targets = cdns
            .iter()
            .map(|c| {
                Target::new(
                    (*c).into(),
                    Name::from_ascii(format!("{c}.example.net.")).unwrap(),
                )
            })
            .collect();
        let specs = regions
            .iter()
            .map(|w| ChoiceSpec::new(Reason::Normal, w.clone()).unwrap())
            .collect();
        NameSpec {
            name: Name::from_ascii(name).unwrap(),
            ttl: 30,
            selection: Selection::Random,
            index: idx(&[vec![m("*")]]),
            regions: (0..regions.len()).map(|r| format!("r{r}").into()).collect(),
            targets,
            drain_scopes: Vec::new(),
            choices: specs,
            content: ContentSteering::default(),
        }
    }

    /// A plan of that one name.
    fn one(name: &str, cdns: &[&str], regions: &[Vec<(usize, u64)>]) -> Plan {
        Plan::new(vec![spec(name, cdns, regions)])
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
        let names: Vec<String> = (0..300).map(|i| format!("h{i}.example.com.")).collect();
        let plan = Plan::new(
            names
                .iter()
                .map(|n| spec(n, &["a"], &[vec![(0, 1)]]))
                .collect(),
        );
        assert_eq!(plan.names().count(), 300);
        // 300 country tables are large enough for huge pages; 300 choices are not.
        assert!(plan.countries.is_huge());
        assert!(!plan.choices.is_huge());
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
