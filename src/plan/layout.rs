//! Contract, the packed layout of a [`Plan`]: how the planner's description of the
//! steered names ([`NameSpec`], [`ChoiceSpec`]) is laid out in flat tables, built in one
//! step for one geo database's places ([`Plan::new`]).
//!
//! With many steered names the plan does not stay in the CPU's caches or its TLB, and
//! each pointer a query follows can be a miss. So what a query reads is packed into a
//! few flat tables shared by every name: a small open-addressing table of the names,
//! one header per name, every name's wire bytes (its own name, then its CNAMEs), every
//! name's country table, and every choice, each one cache line holding its weight
//! table, where its CNAMEs are, and its answer counts. The large tables sit on huge
//! pages ([`crate::huge`]). What only `explain`, the API and the metrics read (the name
//! as text, region and CDN names) sits apart, in `Labels`. What a query does with them
//! is `steering`'s.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use hickory_proto::rr::Name;
use ipnet::IpNet;

use super::regions::{self, RegionIndex, Regions, COUNTRIES};
use crate::config::{ContentSteering, Match, Selection};
use crate::huge::Table;
use crate::place::geo::Place;
use crate::place::wider::Places;
use crate::selection;

/// Every steered name, and how to answer it right now.
#[derive(Debug, Default)]
pub struct Plan {
    /// One header per name, in policy order.
    pub(super) names: Table<Header>,
    /// Open addressing over the names' lowercase wire forms (labels with their lengths,
    /// the root's 0), so that the UDP fast path looks a query up by the bytes it
    /// received: `EMPTY`, or `hash tag << 32 | index into names`. At most half full.
    slots: Box<[u64]>,
    /// Per name: its lowercase wire form, then for each target its CNAME's length in
    /// wire form (one byte) and the CNAME in wire form.
    pub(super) wire: Table<u8>,
    /// Per name: the first region listing each country (`COUNTRIES` entries).
    pub(super) countries: Table<u16>,
    /// Per name: its CIDR entries with the first region listing each, shortest prefix
    /// first.
    pub(super) nets: Table<(IpNet, u16)>,
    /// Per name: `2^drain_scopes` choices per region, in policy order: index
    /// `region << drain_scopes | mask`.
    pub(super) choices: Table<Choice>,
    /// The weight tables of `WIDE` choices.
    pub(super) wide: Box<[Box<[WideEntry]>]>,
    /// Per name: each target's rendezvous salt ([`selection::salt`] of its CDN name).
    pub(super) salts: Table<u64>,
    /// Per name, for explain, the API and the metrics.
    pub(super) labels: Box<[Labels]>,
    /// Per choice (same index as `choices`): the places of the geo database the plan
    /// was built for ([`Plan::new`]) whose clients get that choice by their place
    /// alone, so that an answer reaches as far as its choice holds.
    pub(super) allowed: Box<[Places]>,
    /// Why each choice answers as it does, in one line (`Choice::why` is an index):
    /// the name, region, reason with the drain's id or the failover step, and the
    /// policy version, as dnstap's steering decisions carry it. Entry 0 is empty.
    pub(super) whys: Box<[Arc<str>]>,
}

const EMPTY: u64 = u64::MAX;

/// What a query reads of a name, besides the flat tables.
#[derive(Debug)]
pub(super) struct Header {
    /// Where the name's bytes start in `Plan::wire`.
    pub(super) wire: u32,
    pub(super) key_len: u8,
    /// How many location scopes of drains (`Labels::drain_scopes`); each doubles the
    /// choices.
    pub(super) scopes: u8,
    /// TTL of the CNAME answer (the incident TTL while any CDN is off its weight).
    pub(super) ttl: u32,
    /// `selection: random`: a random key per query instead of a consistent one.
    pub(super) random: bool,
    /// Whether the answer depends on the client's origin AS (AS entries in the regions
    /// or a drain's `where:`): only then is the ASN database read.
    pub(super) origin: bool,
    /// Where the name's salts start in `Plan::salts`.
    pub(super) salts: u32,
    /// Where the name's country table starts in `Plan::countries`.
    pub(super) countries: u32,
    /// Where the name's choices start in `Plan::choices`.
    pub(super) choices: u32,
    pub(super) regions: Regions,
}

/// What only explain, the API, the metrics and the rare drain scopes read.
#[derive(Debug)]
pub(super) struct Labels {
    /// The name as configured (lowercase, absolute).
    pub(super) name: Name,
    /// `name` as text, for metric labels.
    pub(super) text: Arc<str>,
    /// Region names, in policy order.
    pub(super) regions: Box<[Arc<str>]>,
    pub(super) targets: Box<[Target]>,
    /// Location scopes of active drains (`where: [GB]`): bit `i` of a client's mask is
    /// set when it matches `drain_scopes[i]`. Usually empty.
    pub(super) drain_scopes: Box<[Box<[Match]>]>,
    /// The location-scoped drains a client falls in by its place, precomputed from
    /// `drain_scopes` ([`regions::drain_masks`]): per country, per continent, then
    /// those that hold every place. Empty without such drains.
    pub(super) drain_masks: Box<[u8]>,
    /// AS entries of the regions, with the first region listing each. Usually empty.
    pub(super) asns: Box<[(u32, u16)]>,
    /// Content steering for players: pathway ids by target, TTL, throughput floor.
    pub(super) content: ContentSteering,
    /// Per target: the pre-signed RRSIGs of its CNAME (RDLENGTH and RDATA of each),
    /// for DO=1 queries; empty when the zone is unsigned.
    pub(super) rrsigs: Box<[Arc<[u8]>]>,
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
    pub(super) answered: [AtomicU64; INLINE],
    /// Running sums of the weights; the last is the total (> 0). For a `WIDE` choice,
    /// `sums[0]` is its index in `Plan::wide`.
    pub(super) sums: [u32; INLINE],
    /// Where each CDN's CNAME is among the name's bytes in `Plan::wire` (its length
    /// byte).
    pub(super) start: [u16; INLINE],
    /// Each CDN's index in the name's targets.
    pub(super) target: [u8; INLINE],
    /// How many CDNs are inline, or `WIDE`.
    pub(super) n: u8,
    /// Why the weights are what they are.
    pub reason: Reason,
    /// The same in one line, for dnstap: an index into `Plan::whys`.
    pub(super) why: u16,
}

/// CDNs a choice holds inline (policies have 2 to 4).
pub(super) const INLINE: usize = 4;
const _: () = assert!(
    std::mem::size_of::<Choice>() == 64,
    "a choice is one cache line"
);
pub(super) const WIDE: u8 = u8::MAX;

/// One CDN of a `WIDE` choice.
#[derive(Debug)]
pub(super) struct WideEntry {
    /// Running sum of the weights up to and including this one.
    pub(super) sum: u64,
    pub(super) answered: AtomicU64,
    pub(super) target: usize,
    pub(super) start: usize,
}

/// A choice as the planner describes it.
pub struct ChoiceSpec {
    reason: Reason,
    /// The one line dnstap carries (empty: none).
    why: String,
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

// === impl Plan ===

impl Plan {
    /// Lays the names out for a geo database whose places (`GeoDb::places`) are
    /// `places`: for every choice, which places get it, so that answers reach as far
    /// as their choice holds. The plan must then be used with that database only (a
    /// `Snapshot` pairs them). A name whose wire form does not fit 255 bytes is left
    /// out (validation refuses such names before).
    pub fn new(specs: Vec<NameSpec>, places: &[Place]) -> Plan {
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
            whys: Box::default(),
        };
        let mut whys = Whys::default();
        let mut labels = Vec::with_capacity(specs.len());
        let mut wide = Vec::new();
        for spec in specs {
            let (header, label) = plan.lay_out(spec, &mut wide, &mut whys);
            plan.names.push(header);
            labels.push(label);
        }
        plan.labels = labels.into_boxed_slice();
        plan.wide = wide.into_boxed_slice();
        plan.whys = whys.texts.into_boxed_slice();
        let size = (plan.names.len() * 2).next_power_of_two().max(8);
        let mut slots = vec![EMPTY; size].into_boxed_slice();
        for i in 0..plan.names.len() {
            let h = hash(plan.key(i));
            let mut at = h as usize & (size - 1);
            while slots[at] != EMPTY {
                at = (at + 1) & (size - 1);
            }
            slots[at] = (h >> 32) << 32 | i as u64;
        }
        plan.slots = slots;
        plan.allowed = plan.allowed(places);
        plan
    }

    /// For every choice, which of `places` (by index) get it by their place alone.
    fn allowed(&self, places: &[Place]) -> Box<[Places]> {
        let mut allowed = vec![Places::default(); self.choices.len()];
        for (header, labels) in self.names.iter().zip(self.labels.iter()) {
            let at = header.countries as usize;
            let by_country = &self.countries[at..at + COUNTRIES];
            for (i, p) in places.iter().enumerate() {
                let by_place = regions::by_place(
                    &header.regions,
                    by_country,
                    &labels.drain_masks,
                    header.scopes,
                    p,
                );
                allowed[header.choices as usize + by_place].insert(i as u16);
            }
        }
        allowed.into_boxed_slice()
    }

    /// Appends one name's bytes, country table and choices to the flat tables.
    fn lay_out(
        &mut self,
        spec: NameSpec,
        wide: &mut Vec<Box<[WideEntry]>>,
        whys: &mut Whys,
    ) -> (Header, Labels) {
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
            let mut choice = Choice::lay_out(c, &starts, wide);
            choice.why = whys.index(&c.why);
            self.choices.push(choice);
        }
        let labels = Labels {
            text: Arc::from(spec.name.to_string()),
            name: spec.name,
            regions: spec.regions.into_boxed_slice(),
            targets: spec.targets.into_boxed_slice(),
            drain_masks: regions::drain_masks(&spec.drain_scopes),
            drain_scopes: spec.drain_scopes.into_boxed_slice(),
            asns: spec.index.asns.into_boxed_slice(),
            content: spec.content,
            rrsigs: Box::default(),
        };
        (header, labels)
    }

    /// The lowercase wire form of name `i`.
    pub(super) fn key(&self, i: usize) -> &[u8] {
        let header = &self.names[i];
        let at = header.wire as usize;
        &self.wire[at..at + usize::from(header.key_len)]
    }

    /// The index of the name whose lowercase wire form is `wire`, if any.
    ///
    /// # Hot path
    /// A hash of the bytes, then linear probing over a table at most half full whose
    /// slots carry a 32-bit tag, so that a name is compared only on a tag match. The
    /// hash is not keyed: the table holds only configured names, so a client choosing
    /// its query name chooses where a probe starts, never how long the runs are.
    pub(super) fn find(&self, wire: &[u8]) -> Option<usize> {
        let h = hash(wire);
        let mask = self.slots.len().checked_sub(1)?;
        let mut at = h as usize & mask;
        loop {
            let slot = self.slots[at];
            if slot == EMPTY {
                return None;
            }
            if slot >> 32 == h >> 32 {
                let i = slot as u32 as usize;
                if self.key(i) == wire {
                    return Some(i);
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
}

/// The distinct texts of `Plan::whys` while a plan is laid out; many choices share
/// one (every region of a name without incident says the same but its region).
struct Whys {
    texts: Vec<Arc<str>>,
    index: std::collections::HashMap<Arc<str>, u16>,
}

impl Default for Whys {
    fn default() -> Whys {
        Whys {
            texts: vec![Arc::from("")],
            index: std::collections::HashMap::new(),
        }
    }
}

impl Whys {
    /// The index of `text`, added if new; past 65,535 texts, 0 (no text).
    fn index(&mut self, text: &str) -> u16 {
        if text.is_empty() {
            return 0;
        }
        if let Some(&i) = self.index.get(text) {
            return i;
        }
        let Ok(i) = u16::try_from(self.texts.len()) else {
            return 0;
        };
        let text: Arc<str> = Arc::from(text);
        self.texts.push(text.clone());
        self.index.insert(text, i);
        i
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
            why: String::new(),
            weighted: sums,
        })
    }

    /// With `why`, the one line that explains it (dnstap's steering decision).
    pub fn with_why(mut self, why: String) -> ChoiceSpec {
        self.why = why;
        self
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
            why: 0,
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

// === impl Target ===

impl Target {
    pub fn new(cdn: Arc<str>, cname: Name) -> Target {
        Target { cdn, cname }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::place::countries::Country;
    use crate::plan::regions::tests::{idx, m};

    /// A name with CDNs `cdns` (CNAME `<cdn>.example.net.`) and one region per entry of
    /// `regions`, each listing (CDN index, weight).
    pub(in crate::plan) fn spec(
        name: &str,
        cdns: &[&str],
        regions: &[Vec<(usize, u64)>],
    ) -> NameSpec {
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

    /// A plan of that one name, for a geo database without places.
    pub(in crate::plan) fn one(name: &str, cdns: &[&str], regions: &[Vec<(usize, u64)>]) -> Plan {
        Plan::new(vec![spec(name, cdns, regions)], &[])
    }

    /// A plan of `n` names `h{i}.example.com.` of one CDN, and the names.
    pub(in crate::plan) fn many(n: usize) -> (Vec<String>, Plan) {
        let names: Vec<String> = (0..n).map(|i| format!("h{i}.example.com.")).collect();
        let specs = names.iter().map(|n| spec(n, &["a"], &[vec![(0, 1)]]));
        let plan = Plan::new(specs.collect(), &[]);
        (names, plan)
    }

    #[test]
    fn names_are_laid_out_in_policy_order_and_found_by_wire_form() {
        let (names, plan) = many(300);
        assert_eq!(plan.names.len(), 300);
        // 300 country tables are large enough for huge pages; 300 choices are not.
        assert!(plan.countries.is_huge());
        assert!(!plan.choices.is_huge());
        let mut buf = [0u8; 255];
        for (i, n) in names.iter().enumerate() {
            let wire = wire_name(&Name::from_ascii(n).unwrap(), &mut buf).unwrap();
            assert_eq!(plan.key(i), wire, "policy order");
            assert_eq!(plan.find(wire), Some(i), "{n}");
        }
        assert_eq!(Plan::default().find(&[0]), None);
    }

    #[test]
    fn every_place_is_allowed_in_the_one_choice_it_gets_by_place() {
        // Regions GB, then continent EU, then the default; a drain scoped to FR.
        let mut s = spec("n.example.", &["a", "b"], &[]);
        s.index = idx(&[vec![m("GB")], vec![m("continent:EU")], vec![m("*")]]);
        s.regions = ["gb", "eu", "rest"].map(Arc::from).to_vec();
        s.drain_scopes = vec![vec![m("FR")].into_boxed_slice()];
        s.choices = (0..6)
            .map(|_| ChoiceSpec::new(Reason::Normal, [(0, 1), (1, 1)]).unwrap())
            .collect();
        let place = |cc: &str| {
            let country = Country::parse(cc);
            Place {
                country,
                continent: country.and_then(Country::continent),
                ..Place::default()
            }
        };
        let places = [
            place("GB"),
            place("FR"),
            place("DE"),
            place("US"),
            Place::default(),
        ];
        let plan = Plan::new(vec![s], &places);
        let set = |of: &[u16]| {
            let mut p = Places::default();
            of.iter().for_each(|&i| p.insert(i));
            p
        };
        // Choice `region << 1 | mask`: GB (0), EU and FR (3), EU (2), the rest (4).
        let want = [
            set(&[0]),
            set(&[]),
            set(&[2]),
            set(&[1]),
            set(&[3, 4]),
            set(&[]),
        ];
        assert_eq!(&plan.allowed[..], &want[..]);
    }
}
