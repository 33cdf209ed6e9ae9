//! Control plane, pure: what a policy edit changes, computed: both policies planned
//! with their drains settled, every network of the geo database asked through both
//! plans at one instant, and the settings of each name that differ.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use rand::SeedableRng;
use tokio::time::Instant;

use super::model::{
    Example, Moved, NameDiff, PolicyDiff, Presence, RegionDiff, Setting, Share, Side, Traffic,
    Weighed,
};
use super::{SOURCE_V4, SOURCE_V6};
use crate::config::{HostPolicy, Policy, Selection};
use crate::control::decide::drains::Drains;
use crate::control::decide::planner::{self, DrainCut, Removed};
use crate::inputs::Loaded;
use crate::plan::{Asker, Plan, Steered};

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

/// Up to this many examples of each kind (changed, kept) per region.
const EXAMPLES: usize = 3;

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
