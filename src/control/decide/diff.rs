//! Control plane, pure: what a policy edit changes (`steerdns diff OLD NEW`). Two
//! loaded policies (one zones, geo database and probes) are planned by the planner
//! `serve` runs, and every network of the geo database is asked about every steered
//! name through both plans, at one instant, with [`Steered::answer`]: the answer dig
//! would get. What comes out is a plain [`PolicyDiff`] (serialisable, printable), so
//! that a comparison with a running server's version can reuse it.
//!
//! ```text
//! OLD Loaded ─▶ drains settled ─▶ planner::snapshot_with ─▶ Plan ┐
//!                                                                ├─▶ each network of the
//! NEW Loaded ─▶ drains settled ─▶ planner::snapshot_with ─▶ Plan ┘   geo database, asked
//!     through one resolver with ECS /24 (IPv4) or /56 (IPv6): region and CNAME before and
//!     after ─▶ per name and region: CDN shares, address space whose answer changes
//! ```
//!
//! - Health is taken as good and no failover is in progress: the diff is of the
//!   policies, not of the moment. Drains written in the policy count at their last
//!   step (where the edit leads once its steps are done). Performance and commit
//!   modifiers are not applied: weights are the policy's.
//! - A network counts in the region its clients get before and in the one they get
//!   after (both, when the edit moves it). Networks the database places nowhere (no
//!   country, no continent: unallocated and private space) are left out.
//! - Address space is weighted per family (IPv4 and IPv6 apart): the share of a
//!   region's addresses whose answer (the CNAME) changes. A network's clients all get
//!   the same answer through one resolver ([`crate::selection::key`] cuts the client to
//!   the echoed scope, never narrower than the network), so the figure is exact for
//!   that resolver at that instant; another resolver draws its own keys and sees about
//!   the same share. For `selection: random` a network counts as changed when the
//!   weights it draws from change.
//! - Recorded traffic ([`Traffic`], the beacon samples a `serve` saved in its state
//!   directory, by source /24 or /48), when given, weighs the same networks a second
//!   time: each geo network by the samples of the source networks that start in it,
//!   instead of by its addresses. A network's samples count in the regions it counts
//!   in, wherever `serve` placed it when it recorded them; samples from networks the
//!   database places nowhere are left out. Only regions with a `performance:` block
//!   record samples, and a network holds at most a share of a window
//!   (`perf/cell.rs`): the figure weighs by measured clients, not by bytes.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use rand::SeedableRng;
use serde::Serialize;
use tokio::time::Instant;

use crate::config::{HostPolicy, Policy, Selection};
use crate::control::decide::drains::Drains;
use crate::control::decide::planner::{self, DrainCut, Removed};
use crate::inputs::Loaded;
use crate::plan::{Asker, Plan, Steered};

/// What a policy edit changes, name by name and region by region.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyDiff {
    pub old: Side,
    pub new: Side,
    /// The instant both plans were asked at (Unix seconds): the selection window.
    pub at: u64,
    /// The resolver the questions came through (its address is part of the key).
    pub resolver: IpAddr,
    /// Steered names only NEW has, and only OLD has.
    pub names_added: Vec<String>,
    pub names_removed: Vec<String>,
    /// Every name both have, in NEW's order.
    pub names: Vec<NameDiff>,
    /// Whether some answer differs: a CNAME for some network, a TTL, a name added or
    /// removed, a change of selection.
    pub changes_answers: bool,
    /// Where the traffic the networks are also weighed by came from, or why none.
    pub traffic: TrafficFrom,
}

/// The recorded traffic of the steered names: samples by source network (an input).
#[derive(Clone, Debug, Default)]
pub struct Traffic {
    pub from: TrafficFrom,
    /// Steered name (`www.example.com.`) → the first address of a source network →
    /// its samples.
    pub names: HashMap<String, Vec<(IpAddr, u64)>>,
}

/// Where recorded traffic came from.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TrafficFrom {
    /// The file read; `None`: no recorded traffic, the networks are weighed by address
    /// space alone.
    pub file: Option<String>,
    /// When `serve` saved it (Unix ms).
    pub saved_unix_ms: Option<u64>,
    /// Samples in the file.
    pub samples: u64,
    /// What the samples are, or why there are none.
    pub note: String,
}

/// A name's source networks by (IPv6, first address) → samples.
type Sources = BTreeMap<(bool, u128), u64>;

fn sources(list: &[(IpAddr, u64)]) -> Sources {
    let mut out = Sources::new();
    for (ip, n) in list {
        *out.entry(address_key(*ip)).or_default() += n;
    }
    out
}

fn address_key(ip: IpAddr) -> (bool, u128) {
    match ip.to_canonical() {
        IpAddr::V4(a) => (false, u128::from(u32::from(a))),
        IpAddr::V6(a) => (true, u128::from(a)),
    }
}

/// The samples of the source networks that start in the network at `ip` of `prefix`
/// bits.
fn samples_in(sources: &Sources, ip: IpAddr, prefix: u8) -> u64 {
    if sources.is_empty() {
        return 0;
    }
    let (v6, start) = address_key(ip);
    let bits = if v6 { 128 } else { 32 };
    let last = match 1u128.checked_shl(u32::from(bits - prefix.min(bits))) {
        Some(size) => start.saturating_add(size - 1),
        None => u128::MAX,
    };
    sources
        .range((v6, start)..=(v6, last))
        .map(|(_, n)| n)
        .sum()
}

/// One of the two policies.
#[derive(Clone, Debug, Serialize)]
pub struct Side {
    pub file: String,
    /// The policy version (a hash of the file's bytes).
    pub version: String,
}

/// One steered name both policies have.
#[derive(Clone, Debug, Serialize)]
pub struct NameDiff {
    pub name: String,
    pub cdns_added: Vec<String>,
    pub cdns_removed: Vec<String>,
    /// Settings that differ (TTLs, selection, failover, CNAMEs, drains).
    pub settings: Vec<Setting>,
    /// Every region of either policy: OLD's order, then those only NEW has.
    pub regions: Vec<RegionDiff>,
    /// Over every network placed by the database.
    pub ipv4: Moved,
    pub ipv6: Moved,
    /// Recorded traffic (samples) in those networks, and of it where the answer
    /// changes; `traffic_changed_percent` is `None` without any.
    pub traffic_samples: u64,
    pub traffic_changed_samples: u64,
    pub traffic_changed_percent: Option<f64>,
    pub changes_answers: bool,
}

/// A setting of a name that differs.
#[derive(Clone, Debug, Serialize)]
pub struct Setting {
    /// The field, as in the policy (`ttl`, `failover.steps`, `cdns.fastly.cname`).
    pub field: String,
    pub before: String,
    pub after: String,
    /// Whether the answers themselves change with it (a TTL, the selection); the
    /// others change what happens later (failover) or show in the shares (drains).
    pub changes_answers: bool,
}

/// One region of a name.
#[derive(Clone, Debug, Serialize)]
pub struct RegionDiff {
    /// The region's name (`name:`, else its match list).
    pub region: String,
    pub presence: Presence,
    /// Each CDN's share of the region's clients (outside location-scoped drains), in
    /// percent, before and after; `None` where the region (or the CDN) is absent.
    pub shares: Vec<Share>,
    pub ipv4: Moved,
    pub ipv6: Moved,
    /// The recorded traffic (samples) of the region's networks, and of it where the
    /// answer changes: the share of its traffic whose answer changes, `None` when it
    /// has none recorded.
    pub traffic_samples: u64,
    pub traffic_changed_samples: u64,
    pub traffic_changed_percent: Option<f64>,
    /// A few networks of the region whose answer changes and a few whose answer stays
    /// (up to three of each, in address order), as a resolver asks about them: to
    /// check with dig. None for `selection: random`.
    pub examples: Vec<Example>,
}

/// One network and the CDN it gets before and after.
#[derive(Clone, Debug, Serialize)]
pub struct Example {
    /// The ECS subnet asked with (`2.16.0.0/24`).
    pub network: String,
    pub before: String,
    pub after: String,
    /// Whether the answer (the CNAME) changes.
    pub changed: bool,
}

/// Up to this many examples of each kind (changed, kept) per region.
const EXAMPLES: usize = 3;

/// Whether a region is in both policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Presence {
    Both,
    Added,
    Removed,
}

/// A CDN's share of a region before and after, in percent.
#[derive(Clone, Debug, Serialize)]
pub struct Share {
    pub cdn: String,
    pub before: Option<f64>,
    pub after: Option<f64>,
}

/// The networks of one address family, and those whose answer changes.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Moved {
    pub networks: u64,
    pub changed_networks: u64,
    /// The share of these networks' address space whose answer changes, in percent.
    pub changed_percent: f64,
    #[serde(skip)]
    space: f64,
    #[serde(skip)]
    changed_space: f64,
}

impl Moved {
    fn add(&mut self, size: f64, changed: bool) {
        self.networks += 1;
        self.space += size;
        if changed {
            self.changed_networks += 1;
            self.changed_space += size;
        }
    }

    fn finish(&mut self) {
        self.changed_percent = if self.space > 0.0 {
            100.0 * self.changed_space / self.space
        } else {
            0.0
        };
    }
}

/// Samples, and those whose answer changes.
#[derive(Clone, Copy, Debug, Default)]
struct Weighed {
    samples: u64,
    changed: u64,
}

impl Weighed {
    fn add(&mut self, samples: u64, changed: bool) {
        self.samples += samples;
        if changed {
            self.changed += samples;
        }
    }

    /// (samples, changed, percent changed).
    fn figures(self) -> (u64, u64, Option<f64>) {
        let pct = (self.samples > 0).then(|| 100.0 * self.changed as f64 / self.samples as f64);
        (self.samples, self.changed, pct)
    }
}

/// The ECS source prefixes public resolvers send: how each network is asked about.
const SOURCE_V4: u8 = 24;
const SOURCE_V6: u8 = 56;

/// Compares `old` and `new`, which must have been loaded against the same geo
/// database (the networks are `new`'s), asking through `resolver` at `now` (`now_ms`
/// the same instant as Unix milliseconds, `clock` as the monotonic clock the drains'
/// steps run on); the networks weighed by address space, and by `traffic` too.
pub fn diff(
    old: &Loaded,
    new: &Loaded,
    resolver: IpAddr,
    clock: Instant,
    now_ms: u64,
    traffic: &Traffic,
) -> PolicyDiff {
    let at = now_ms / 1000;
    let plan_old = settled_plan(old, clock, now_ms);
    let plan_new = settled_plan(new, clock, now_ms);
    let name_of = |h: &HostPolicy| h.name.to_string();
    let in_old = |n: &str| old.policy.host(n).is_some();
    let in_new = |n: &str| new.policy.host(n).is_some();
    let names_added: Vec<String> = new
        .policy
        .hosts
        .iter()
        .map(name_of)
        .filter(|n| !in_old(n))
        .collect();
    let names_removed: Vec<String> = old
        .policy
        .hosts
        .iter()
        .map(name_of)
        .filter(|n| !in_new(n))
        .collect();
    let mut names = Vec::new();
    for host in &new.policy.hosts {
        let Some(before) = old.policy.host(&host.name.to_string()) else {
            continue;
        };
        let (Some(s_old), Some(s_new)) = (plan_old.get(&host.name), plan_new.get(&host.name))
        else {
            continue;
        };
        let sides = Pair {
            old: (old, s_old),
            new: (new, s_new),
        };
        let name = host.name.to_string();
        let recorded = traffic
            .names
            .get(&name)
            .map_or_else(Sources::new, |l| sources(l));
        names.push(name_diff(before, host, &sides, resolver, at, &recorded));
    }
    let changes_answers = !names_added.is_empty()
        || !names_removed.is_empty()
        || names.iter().any(|n| n.changes_answers);
    PolicyDiff {
        old: side(&old.policy),
        new: side(&new.policy),
        at,
        resolver,
        names_added,
        names_removed,
        names,
        changes_answers,
        traffic: traffic.from.clone(),
    }
}

fn side(p: &Policy) -> Side {
    Side {
        file: p.file.display().to_string(),
        version: p.version.clone(),
    }
}

/// The plan `serve` would build for `loaded` with every CDN healthy and the policy's
/// drains at their last step.
fn settled_plan(loaded: &Loaded, clock: Instant, now_ms: u64) -> Plan {
    planner::snapshot_with(
        loaded,
        &Removed::new(),
        &settled_drains(loaded, clock, now_ms),
    )
    .0
    .plan
}

/// The policy's drains in force at `now_ms`, stepped to their last step.
fn settled_drains(loaded: &Loaded, clock: Instant, now_ms: u64) -> Vec<DrainCut> {
    let policy = &loaded.policy;
    let mut drains = Drains::default();
    drains.sync(policy, clock, now_ms);
    // Every step of every timeline falls due by then.
    let longest = policy
        .hosts
        .iter()
        .map(|h| {
            h.failover
                .step_interval
                .max(Duration::from_millis(1))
                .saturating_mul(h.failover.steps.len() as u32 + 1)
        })
        .max()
        .unwrap_or_default();
    if let Some(done) = clock.checked_add(longest) {
        drains.tick(policy, done);
    }
    drains.cuts(policy)
}

/// The same name in both plans, with the inputs each was planned from.
struct Pair<'a> {
    old: (&'a Loaded, Steered<'a>),
    new: (&'a Loaded, Steered<'a>),
}

/// What one network gets from one plan: the region and the answer's CNAME (an index
/// into the name's distinct CNAMEs), or, for `selection: random`, the choice it draws
/// from.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Got {
    region: usize,
    answer: Answer,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Answer {
    Cname(usize),
    /// A random draw from this choice (its address in the plan).
    Draw(usize),
}

fn name_diff<'a>(
    before: &HostPolicy,
    after: &HostPolicy,
    sides: &Pair<'a>,
    resolver: IpAddr,
    at: u64,
    recorded: &Sources,
) -> NameDiff {
    let (s_old, s_new) = (sides.old.1, sides.new.1);
    let cdn_names = |h: &HostPolicy| h.cdns.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
    let (cdns_old, cdns_new) = (cdn_names(before), cdn_names(after));
    let cdns_added = cdns_new
        .iter()
        .filter(|c| !cdns_old.contains(c))
        .cloned()
        .collect();
    let cdns_removed = cdns_old
        .iter()
        .filter(|c| !cdns_new.contains(c))
        .cloned()
        .collect();
    let settings = settings(before, after);

    // Regions: OLD's, then those only NEW has.
    let mut regions: Vec<RegionDiff> = Vec::new();
    let mut row_old = Vec::new();
    let mut row_new = Vec::new();
    for r in 0..s_old.regions() {
        row_old.push(regions.len());
        regions.push(region_row(s_old.region_name(r), Presence::Removed));
    }
    for r in 0..s_new.regions() {
        let name = s_new.region_name(r);
        match regions.iter().position(|row| row.region == name) {
            Some(i) => {
                regions[i].presence = Presence::Both;
                row_new.push(i);
            }
            None => {
                row_new.push(regions.len());
                regions.push(region_row(name, Presence::Added));
            }
        }
    }
    for (r, &row) in row_old.iter().enumerate() {
        add_shares(&mut regions[row].shares, s_old, r, true);
    }
    for (r, &row) in row_new.iter().enumerate() {
        add_shares(&mut regions[row].shares, s_new, r, false);
    }

    // The CNAMEs of both, as one list: an answer is its index there.
    let mut cnames = Vec::new();
    let ids_old = cname_ids(s_old, &mut cnames);
    let ids_new = cname_ids(s_new, &mut cnames);
    let random = s_old.is_random() || s_new.is_random();
    // Whether two choices (old, new) draw the same CNAMEs in the same proportions.
    let mut same_draw: HashMap<(usize, usize), bool> = HashMap::new();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0);
    let mut ask = |(loaded, s): (&Loaded, Steered<'a>), ids: &[usize], asker: &Asker| {
        let a = s.answer(&loaded.geo, asker, at, &mut rng);
        let answer = if random {
            Answer::Draw(std::ptr::from_ref(a.pick.choice) as usize)
        } else {
            Answer::Cname(ids[a.pick.target])
        };
        let got = Got {
            region: a.decision.region,
            answer,
        };
        (got, a.pick.choice, a.pick.target)
    };
    let (mut v4, mut v6) = (Moved::default(), Moved::default());
    let mut weighed = vec![Weighed::default(); regions.len()];
    let mut weighed_all = Weighed::default();
    for (ip, place) in sides.new.0.geo.each_network() {
        if place.country.is_none() && place.continent.is_none() {
            continue;
        }
        let (source, bits) = match ip {
            IpAddr::V4(_) => (SOURCE_V4, 32),
            IpAddr::V6(_) => (SOURCE_V6, 128),
        };
        let asker = Asker::new(resolver, Some((crate::net::cut(ip, source), source)));
        let (got_old, choice_old, target_old) = ask(sides.old, &ids_old, &asker);
        let (got_new, choice_new, target_new) = ask(sides.new, &ids_new, &asker);
        let changed = match (got_old.answer, got_new.answer) {
            (Answer::Cname(a), Answer::Cname(b)) => a != b,
            (Answer::Draw(a), Answer::Draw(b)) => !*same_draw.entry((a, b)).or_insert_with(|| {
                draws(s_old, choice_old, &ids_old) == draws(s_new, choice_new, &ids_new)
            }),
            _ => true,
        };
        let size = 2f64.powi(i32::from(bits - place.prefix_len.min(bits)));
        let samples = samples_in(recorded, ip, place.prefix_len);
        weighed_all.add(samples, changed);
        let (a, b) = (row_old[got_old.region], row_new[got_new.region]);
        for row in [a, b].into_iter().take(if a == b { 1 } else { 2 }) {
            weighed[row].add(samples, changed);
            let row = &mut regions[row];
            family(row, ip).add(size, changed);
            let kind = row.examples.iter().filter(|e| e.changed == changed).count();
            if !random && kind < EXAMPLES {
                row.examples.push(Example {
                    network: format!("{}/{source}", crate::net::cut(ip, source)),
                    before: s_old.target(target_old).cdn.to_string(),
                    after: s_new.target(target_new).cdn.to_string(),
                    changed,
                });
            }
        }
        match ip {
            IpAddr::V4(_) => v4.add(size, changed),
            IpAddr::V6(_) => v6.add(size, changed),
        }
    }
    for (row, w) in regions.iter_mut().zip(weighed) {
        row.ipv4.finish();
        row.ipv6.finish();
        (
            row.traffic_samples,
            row.traffic_changed_samples,
            row.traffic_changed_percent,
        ) = w.figures();
    }
    let (traffic_samples, traffic_changed_samples, traffic_changed_percent) = weighed_all.figures();
    v4.finish();
    v6.finish();
    let changes_answers = v4.changed_networks > 0
        || v6.changed_networks > 0
        || settings.iter().any(|s| s.changes_answers);
    NameDiff {
        name: after.name.to_string(),
        cdns_added,
        cdns_removed,
        settings,
        regions,
        ipv4: v4,
        ipv6: v6,
        traffic_samples,
        traffic_changed_samples,
        traffic_changed_percent,
        changes_answers,
    }
}

/// The figures of `ip`'s family in `row`.
fn family(row: &mut RegionDiff, ip: IpAddr) -> &mut Moved {
    match ip {
        IpAddr::V4(_) => &mut row.ipv4,
        IpAddr::V6(_) => &mut row.ipv6,
    }
}

/// The index of each target's CNAME of `s` in `cnames`, added there when new.
fn cname_ids<'p>(s: Steered<'p>, cnames: &mut Vec<&'p hickory_proto::rr::Name>) -> Vec<usize> {
    s.targets()
        .iter()
        .map(|t| match cnames.iter().position(|c| **c == t.cname) {
            Some(i) => i,
            None => {
                cnames.push(&t.cname);
                cnames.len() - 1
            }
        })
        .collect()
}

fn region_row(name: &str, presence: Presence) -> RegionDiff {
    RegionDiff {
        region: name.to_string(),
        presence,
        shares: Vec::new(),
        ipv4: Moved::default(),
        ipv6: Moved::default(),
        traffic_samples: 0,
        traffic_changed_samples: 0,
        traffic_changed_percent: None,
        examples: Vec::new(),
    }
}

/// Region `r`'s shares in `s` (before or after) into `shares`: every CDN of the name,
/// 0 for those without weight there.
fn add_shares(shares: &mut Vec<Share>, s: Steered, r: usize, before: bool) {
    let weights: Vec<(usize, u64)> = s.weighted(s.choice(r)).collect();
    let total: u64 = weights.iter().map(|(_, w)| w).sum();
    let every = (0..s.targets().len()).map(|t| (t, 0));
    for (t, w) in every.chain(weights) {
        let cdn = &*s.target(t).cdn;
        let pct = if total > 0 {
            100.0 * w as f64 / total as f64
        } else {
            0.0
        };
        let at = match shares.iter().position(|sh| sh.cdn == cdn) {
            Some(i) => i,
            None => {
                shares.push(Share {
                    cdn: cdn.to_string(),
                    before: None,
                    after: None,
                });
                shares.len() - 1
            }
        };
        let slot = if before {
            &mut shares[at].before
        } else {
            &mut shares[at].after
        };
        *slot = Some(slot.unwrap_or(0.0) + pct);
    }
}

/// The CNAMEs a choice draws and in what proportion, sorted: what a random pick gives.
fn draws(s: Steered, choice: &crate::plan::Choice, ids: &[usize]) -> Vec<(usize, u64)> {
    let weights: Vec<(usize, u64)> = s.weighted(choice).collect();
    let total: u64 = weights.iter().map(|(_, w)| w).sum::<u64>().max(1);
    let mut by_cname: Vec<(usize, u64)> = Vec::new();
    for (t, w) in weights.into_iter().filter(|(_, w)| *w > 0) {
        // Parts per billion: the same proportion from different totals compares equal.
        let ppb = (u128::from(w) * 1_000_000_000 / u128::from(total)) as u64;
        match by_cname.iter_mut().find(|(c, _)| *c == ids[t]) {
            Some(e) => e.1 += ppb,
            None => by_cname.push((ids[t], ppb)),
        }
    }
    by_cname.sort_unstable();
    by_cname
}

/// The settings of a name that differ between `a` (before) and `b` (after).
fn settings(a: &HostPolicy, b: &HostPolicy) -> Vec<Setting> {
    let mut out = Vec::new();
    let mut differ = |field: &str, before: String, after: String, answers: bool| {
        if before != after {
            out.push(Setting {
                field: field.to_string(),
                before,
                after,
                changes_answers: answers,
            });
        }
    };
    let opt = |t: Option<u32>| t.map_or_else(|| "none".to_string(), |t| t.to_string());
    let selection = |s: Selection| match s {
        Selection::Consistent => "consistent".to_string(),
        Selection::Random => "random".to_string(),
    };
    let steps = |h: &HostPolicy| format!("{:?}", h.failover.steps);
    differ("ttl", a.ttl.to_string(), b.ttl.to_string(), true);
    differ(
        "incident_ttl",
        opt(a.incident_ttl),
        opt(b.incident_ttl),
        false,
    );
    differ(
        "selection",
        selection(a.selection),
        selection(b.selection),
        true,
    );
    differ("failover.steps", steps(a), steps(b), false);
    differ(
        "failover.step_interval_seconds",
        a.failover.step_interval.as_secs().to_string(),
        b.failover.step_interval.as_secs().to_string(),
        false,
    );
    for cdn in &b.cdns {
        if let Some(was) = a.cdns.iter().find(|c| c.name == cdn.name) {
            differ(
                &format!("cdns.{}.cname", cdn.name),
                was.cname.to_string(),
                cdn.cname.to_string(),
                false,
            );
        }
    }
    differ("drain", drains(a), drains(b), false);
    out
}

/// A name's drains in one line.
fn drains(h: &HostPolicy) -> String {
    if h.drains.is_empty() {
        return "none".to_string();
    }
    let one = |d: &crate::config::Drain| {
        let cdn = h.cdns.get(d.cdn).map_or("?", |c| c.name.as_str());
        let scope: Vec<String> = d
            .scope
            .iter()
            .map(|s| match s {
                crate::config::DrainScope::Region(r) => h
                    .regions
                    .get(*r)
                    .map_or_else(|| format!("region {r}"), |r| r.name.clone()),
                crate::config::DrainScope::Match(m) => m.to_string(),
            })
            .collect();
        let scope = if scope.is_empty() {
            "everywhere".to_string()
        } else {
            scope.join(",")
        };
        let how = if d.immediate { ", immediate" } else { "" };
        format!("{cdn} ({scope}{how})")
    };
    h.drains.iter().map(one).collect::<Vec<_>>().join("; ")
}

// === printing ===

/// A percent as people read it: `90`, `33.3`, `0.02`.
fn pct(p: f64) -> String {
    let s = if p != 0.0 && p.abs() < 0.1 {
        format!("{p:.2}")
    } else {
        format!("{p:.1}")
    };
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s} %")
}

impl std::fmt::Display for Moved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({} of {} networks)",
            pct(self.changed_percent),
            self.changed_networks,
            self.networks
        )
    }
}

impl std::fmt::Display for PolicyDiff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} ({}) → {} ({}), asked through {} with ECS /{SOURCE_V4} and /{SOURCE_V6} at {}",
            self.old.file,
            self.old.version,
            self.new.file,
            self.new.version,
            self.resolver,
            crate::clock::rfc3339(self.at.saturating_mul(1000)),
        )?;
        let recorded = self.traffic.file.is_some();
        match (&self.traffic.file, self.traffic.saved_unix_ms) {
            (Some(file), Some(ms)) => writeln!(
                f,
                "recorded traffic: {} samples by source network ({}), saved {} in {file}; answers change also weighed by it",
                self.traffic.samples,
                self.traffic.note,
                crate::clock::rfc3339(ms),
            )?,
            _ => writeln!(
                f,
                "recorded traffic: none: {}; networks weighed by address space alone",
                self.traffic.note
            )?,
        }
        for n in &self.names_added {
            writeln!(f, "name added: {n}")?;
        }
        for n in &self.names_removed {
            writeln!(f, "name removed: {n}")?;
        }
        for n in &self.names {
            write!(f, "{}", Lines(n, recorded))?;
        }
        if self.changes_answers {
            writeln!(f, "answers change")
        } else {
            writeln!(f, "every answer alike")
        }
    }
}

/// The traffic figure of a line: `; traffic 50 % (12 of 24 samples)`, `; no recorded
/// traffic`, or nothing when no traffic was read at all.
fn traffic(samples: u64, changed: u64, percent: Option<f64>, recorded: bool) -> String {
    match percent {
        Some(p) => format!("; traffic {} ({changed} of {samples} samples)", pct(p)),
        None if recorded => "; no recorded traffic".to_string(),
        None => String::new(),
    }
}

/// A name's lines, saying whether recorded traffic was read.
struct Lines<'a>(&'a NameDiff, bool);

impl std::fmt::Display for NameDiff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", Lines(self, self.traffic_samples > 0))
    }
}

impl std::fmt::Display for Lines<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Lines(n, recorded) = *self;
        writeln!(
            f,
            "{}: answers change: IPv4 {}, IPv6 {}{}",
            n.name,
            n.ipv4,
            n.ipv6,
            traffic(
                n.traffic_samples,
                n.traffic_changed_samples,
                n.traffic_changed_percent,
                recorded
            ),
        )?;
        for c in &n.cdns_added {
            writeln!(f, "  cdn added: {c}")?;
        }
        for c in &n.cdns_removed {
            writeln!(f, "  cdn removed: {c}")?;
        }
        for s in &n.settings {
            writeln!(f, "  {}: {} → {}", s.field, s.before, s.after)?;
        }
        for r in &n.regions {
            let shares: Vec<String> = r
                .shares
                .iter()
                .map(|s| match (s.before, s.after) {
                    (Some(a), Some(b)) if (a - b).abs() < 1e-9 => format!("{} {}", s.cdn, pct(a)),
                    (a, b) => {
                        let show = |p: Option<f64>| p.map_or_else(|| "-".to_string(), pct);
                        format!("{} {} → {}", s.cdn, show(a), show(b))
                    }
                })
                .collect();
            let presence = match r.presence {
                Presence::Both => "",
                Presence::Added => " (added)",
                Presence::Removed => " (removed)",
            };
            writeln!(
                f,
                "  region {}{presence}: {}; answers change: IPv4 {}, IPv6 {}{}",
                r.region,
                shares.join(", "),
                r.ipv4,
                r.ipv6,
                traffic(
                    r.traffic_samples,
                    r.traffic_changed_samples,
                    r.traffic_changed_percent,
                    recorded
                ),
            )?;
            if let Some(e) = r.examples.iter().find(|e| e.changed) {
                writeln!(f, "    e.g. {}: {} → {}", e.network, e.before, e.after)?;
            }
        }
        Ok(())
    }
}
