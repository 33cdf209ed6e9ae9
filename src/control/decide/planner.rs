//! Control plane: the planner, `(Policy, failover state) -> Plan`, a pure function.
//!
//! It resolves everything a query would otherwise compute: per steered name the region
//! lookup tables, and per region the cumulative weight table of the CDNs that may serve
//! it *now*, with their CNAME targets, the TTL and the reason.
//!
//! A failover or drain step of `r` % on a CDN moves `r` % of its share to the other CDNs
//! of the region, in proportion to what they keep; the region's total does not change
//! ([`effective`]). GB fastly 90 / cloudflare 10 with steps [50, 100]: fastly 45 %, then
//! 0 %. A share with nowhere to go (no other CDN of the region keeps any weight) stays
//! where it is and the region is said to fail open: answering something beats answering
//! nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::{DrainScope, HostPolicy, Match, Policy};
use crate::control::decide::keys::{NameCdn, NameRegion};
use crate::inputs::Loaded;
use crate::place::geo::Place;
use std::fmt::Write as _;

use crate::plan::{ChoiceSpec, NameSpec, Plan, Reason, RegionIndex, Snapshot, Target};

/// Percent of weight removed by failover, by (steered name, CDN name); absent = 0.
pub type Removed = BTreeMap<NameCdn, u8>;

/// A drain in force: `percent` of a CDN's weight removed for the clients in `scope`
/// (empty: everywhere) of one steered name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainCut {
    /// The drain's id (`policy` or `api-N`), named by dnstap's steering decisions.
    pub id: String,
    pub name: String,
    pub cdn: String,
    pub scope: Vec<DrainScope>,
    pub percent: u8,
}

pub use crate::config::MAX_DRAIN_SCOPES;

/// A plan and what it had to do to stay up.
pub struct Planned {
    pub plan: Plan,
    /// (steered name, region) pairs answering with configured weights, for some or
    /// all of their clients, because every CDN there is out.
    pub fail_open: Vec<NameRegion>,
}

// === snapshots ===

/// The snapshot of `loaded` with every CDN at its configured weight.
pub fn snapshot(loaded: &Loaded) -> Snapshot {
    snapshot_with(loaded, &Removed::new(), &[]).0
}

/// The snapshot of `loaded` for a failover state, and the regions that had to fail
/// open.
pub fn snapshot_with(
    loaded: &Loaded,
    removed: &Removed,
    drains: &[DrainCut],
) -> (Snapshot, Vec<NameRegion>) {
    snapshot_for(loaded, &loaded.policy, removed, drains)
}

/// The snapshot of `policy` (the loaded one, or it with weights changed by a
/// modifier, `control/modifiers/perf/`) for a failover state: the plan for `loaded`'s geo
/// database, with the zones (signed, and the CNAMEs' RRSIGs attached, when the policy
/// signs).
pub fn snapshot_for(
    loaded: &Loaded,
    policy: &Policy,
    removed: &Removed,
    drains: &[DrainCut],
) -> (Snapshot, Vec<NameRegion>) {
    let mut planned = plan(policy, removed, drains, loaded.geo.places());
    let signed = loaded.dnssec.as_ref().map(|d| d.signed());
    let zones = match &signed {
        Some(signed) => {
            planned
                .plan
                .set_rrsigs(|name, target| signed.cname(name, target));
            signed.catalog.clone()
        }
        None => loaded.zones.catalog().clone(),
    };
    let snapshot = Snapshot {
        plan: planned.plan,
        geo: loaded.geo.clone(),
        zones,
        signed_until: signed.as_ref().map(|s| s.window.expiration),
        denials: signed.map(|s| s.denials.clone()),
        canary: None,
    };
    (snapshot, planned.fail_open)
}

/// The plan of `loaded`'s own policy (a staged rollout's new version) for the geo
/// database whose places are `places` (the one the version in force serves with), with
/// the CNAMEs' RRSIGs when its policy signs.
pub fn plan_alone(
    loaded: &Loaded,
    removed: &Removed,
    drains: &[DrainCut],
    places: &[Place],
) -> Plan {
    let mut planned = plan(&loaded.policy, removed, drains, places);
    if let Some(signed) = loaded.dnssec.as_ref().map(|d| d.signed()) {
        planned
            .plan
            .set_rrsigs(|name, target| signed.cname(name, target));
    }
    planned.plan
}

/// Builds the plan for a validated policy, the failover state and the drains in force,
/// for a geo database whose places are `places` (`GeoDb::places`; the plan is then
/// used with that database only).
pub fn plan(policy: &Policy, removed: &Removed, drains: &[DrainCut], places: &[Place]) -> Planned {
    let mut fail_open = Vec::new();
    let names = policy
        .hosts
        .iter()
        .map(|h| steered(h, &policy.version, removed, drains, &mut fail_open))
        .collect();
    Planned {
        plan: Plan::new(names, places),
        fail_open,
    }
}

/// Percent removed by failover for one CDN of one host.
pub fn removed_of(removed: &Removed, host: &HostPolicy, cdn: &str) -> u8 {
    removed
        .get(&NameCdn::new(host.name.to_string(), cdn))
        .copied()
        .unwrap_or(0)
        .min(100)
}

/// A drain as the one line of a choice names it: the drain, its CDN's index, the
/// regions it cuts in (`None`: all) and its location group.
type Applied<'d> = (&'d DrainCut, usize, Option<Vec<usize>>, Option<usize>);

fn steered(
    host: &HostPolicy,
    version: &str,
    removed: &Removed,
    drains: &[DrainCut],
    fail_open: &mut Vec<NameRegion>,
) -> NameSpec {
    let n_cdn = host.cdns.len();
    let name = host.name.to_string();
    let idx = |cdn: &str| host.cdns.iter().position(|c| c.name == cdn);
    let health: Vec<u8> = host
        .cdns
        .iter()
        .map(|c| removed_of(removed, host, &c.name))
        .collect();

    // Drains: the region-wide part per region, and the location part per scope group.
    let mut region_drain = vec![vec![0u8; n_cdn]; host.regions.len()];
    let mut groups: Vec<(Vec<Match>, Vec<u8>)> = Vec::new();
    // For dnstap's one line: each drain applied, by the regions (None: all) and the
    // location group it cuts in.
    let mut applied: Vec<Applied> = Vec::new();
    for d in drains.iter().filter(|d| d.name == name && d.percent > 0) {
        let Some(c) = idx(&d.cdn) else { continue };
        let in_regions: Vec<usize> = d
            .scope
            .iter()
            .filter_map(|s| match *s {
                DrainScope::Region(r) => Some(r),
                DrainScope::Match(_) => None,
            })
            .collect();
        if d.scope.is_empty() {
            applied.push((d, c, None, None));
        } else if !in_regions.is_empty() {
            applied.push((d, c, Some(in_regions), None));
        }
        if d.scope.is_empty() {
            region_drain
                .iter_mut()
                .for_each(|r| r[c] = r[c].max(d.percent));
            continue;
        }
        let mut matches = Vec::new();
        for s in &d.scope {
            match *s {
                DrainScope::Region(r) if r < region_drain.len() => {
                    region_drain[r][c] = region_drain[r][c].max(d.percent)
                }
                DrainScope::Region(_) => {}
                DrainScope::Match(m) => matches.push(m),
            }
        }
        if matches.is_empty() {
            continue;
        }
        let g = match groups.iter().position(|(m, _)| *m == matches) {
            Some(g) => g,
            None if groups.len() < MAX_DRAIN_SCOPES => {
                groups.push((matches, vec![0; n_cdn]));
                groups.len() - 1
            }
            None => {
                // Drains::admit keeps this from happening; a scoped drain is never
                // widened to everywhere.
                tracing::warn!(name = %name, cdn = %d.cdn, "too many location-scoped drains: this one is not applied");
                continue;
            }
        };
        groups[g].1[c] = groups[g].1[c].max(d.percent);
        applied.push((d, c, Some(Vec::new()), Some(g)));
    }

    let any_cut = health.iter().any(|&r| r > 0)
        || region_drain.iter().flatten().any(|&r| r > 0)
        || groups.iter().any(|(_, cut)| cut.iter().any(|&r| r > 0));
    // While any CDN of the name is off its weight, answers may be cached less long.
    let ttl = if any_cut {
        host.incident_ttl.unwrap_or(host.ttl)
    } else {
        host.ttl
    };

    let targets: Vec<Target> = host
        .cdns
        .iter()
        .map(|c| Target::new(Arc::from(c.name.as_str()), c.cname.clone()))
        .collect();
    let regions = RegionIndex::new(host.regions.iter().map(|r| r.matches.as_slice()));
    let masks = 1usize << groups.len();
    let mut choices = Vec::with_capacity(host.regions.len() * masks);
    for (r, region) in host.regions.iter().enumerate() {
        let mut failed_open = false;
        for mask in 0..masks {
            let drain: Vec<u8> = (0..n_cdn)
                .map(|c| {
                    let located = (0..groups.len())
                        .filter(|g| mask & (1 << g) != 0)
                        .map(|g| groups[g].1[c])
                        .max()
                        .unwrap_or(0);
                    region_drain[r][c].max(located)
                })
                .collect();
            let serving: Vec<usize> = (0..n_cdn).filter(|&c| region.weights[c] > 0).collect();
            let cut = |c: usize| health[c].max(drain[c]).min(100);
            let configured: Vec<u64> = region.weights.iter().map(|&w| u64::from(w)).collect();
            let (weights, stuck) = effective(&configured, cut);
            let reason = if stuck {
                failed_open = true;
                Reason::FailOpen
            } else if serving.iter().any(|&c| drain[c] > 0) {
                Reason::Drain
            } else if serving.iter().any(|&c| health[c] > 0) {
                Reason::Failover
            } else {
                Reason::Normal
            };
            let mut why = format!("{name} region={} reason={reason}", region.name);
            // A performance shift or a commit bias moved the weights the reason starts
            // from.
            for m in &region.moved_by {
                let _ = write!(why, " moved-by={m}");
            }
            // What cuts here: each drain (by its id) and each failover step.
            if reason != Reason::Normal {
                let hits = applied.iter().filter(|(_, c, regions, group)| {
                    region.weights[*c] > 0
                        && match (regions, group) {
                            (None, _) => true,
                            (_, Some(g)) => mask & (1 << g) != 0,
                            (Some(rs), None) => rs.contains(&r),
                        }
                });
                for (d, _, _, _) in hits {
                    let _ = write!(why, " drain={}:{}:-{}%", d.id, d.cdn, d.percent);
                }
                for &c in serving.iter().filter(|&&c| health[c] > 0) {
                    let cdn = &host.cdns[c].name;
                    let _ = write!(why, " failover={cdn}:-{}%", health[c]);
                }
            }
            let _ = write!(why, " policy={version}");
            // Validation refused regions whose weights are all zero, and a share is
            // never lost (only moved), so some weight is always positive.
            choices.push(
                ChoiceSpec::new(reason, weights.into_iter().enumerate())
                    .expect("validated region has a positive weight")
                    .with_why(why),
            );
        }
        if failed_open {
            fail_open.push(NameRegion::new(name.clone(), region.name.clone()));
        }
    }
    let scopes = groups
        .into_iter()
        .map(|(m, _)| m.into_boxed_slice())
        .collect();
    let region_names = host
        .regions
        .iter()
        .map(|r| Arc::from(r.name.as_str()))
        .collect();
    NameSpec {
        name: host.name.clone(),
        ttl,
        selection: host.selection,
        index: regions,
        regions: region_names,
        targets,
        drain_scopes: scopes,
        choices,
        content: host.content.clone(),
    }
}

/// The effective weights of one region, in hundredths of the configured ones, and
/// whether some removed share had nowhere to go.
///
/// Each CDN `c` keeps `w_c × (100 − cut_c)`. What it gives up, `w_c × cut_c`, goes to
/// the other CDNs in proportion to what they keep, so the total stays `100 × Σ w`:
/// 60/30/10 with 50 % cut on the first gives 30/52.5/17.5. When no other CDN keeps any
/// weight (a region of one CDN, or every other one out), the share stays with `c`:
/// with every CDN out, that is exactly the configured weights (fail-open).
pub fn effective(configured: &[u64], cut: impl Fn(usize) -> u8) -> (Vec<u64>, bool) {
    let n = configured.len();
    let keep: Vec<u64> = (0..n)
        .map(|c| configured[c] * (100 - u64::from(cut(c).min(100))))
        .collect();
    let mut out = keep.clone();
    let mut stuck = false;
    for from in 0..n {
        let gone = configured[from] * 100 - keep[from];
        if gone == 0 {
            continue;
        }
        let others = (0..n).filter(|&c| c != from);
        let kept: u64 = others.clone().map(|c| keep[c]).sum();
        let Some(largest) = others
            .clone()
            .filter(|&c| keep[c] > 0)
            .max_by_key(|&c| keep[c])
        else {
            out[from] += gone;
            stuck = true;
            continue;
        };
        let mut given = 0;
        for to in others {
            // u128: weights are at most 10^6 × 100, their products fit.
            let part = (u128::from(gone) * u128::from(keep[to]) / u128::from(kept)) as u64;
            out[to] += part;
            given += part;
        }
        // What rounding down left over goes to the largest recipient.
        out[largest] += gone - given;
    }
    (out, stuck)
}

/// Checks what every plan must hold, whatever the policy and the cuts: for every steered
/// name of `policy` and every choice of every region (each mask of location-scoped
/// drains),
///
/// - the shares sum to the region's configured total (a share is moved, never lost or
///   invented), so no region is ever left without an answer;
/// - only CDNs the region lists (weight above 0) answer;
/// - a CDN that failover or a drain of the whole region removed entirely answers
///   nothing, unless the region fails open, which `fail_open` then lists;
/// - the TTL is the incident TTL exactly while some CDN of the name is cut.
///
/// The `policy` fuzz target and the planner's tests run it over many policies.
pub fn check(
    policy: &Policy,
    removed: &Removed,
    drains: &[DrainCut],
    planned: &Planned,
) -> Result<(), String> {
    use crate::plan::Decision;
    for host in &policy.hosts {
        let name = host.name.to_string();
        let s = planned
            .plan
            .get(&host.name)
            .ok_or_else(|| format!("{name}: not in the plan"))?;
        if s.regions() != host.regions.len() {
            return Err(format!("{name}: {} regions planned", s.regions()));
        }
        let host_drains: Vec<&DrainCut> = drains
            .iter()
            .filter(|d| d.name == name && d.percent > 0)
            .filter(|d| host.cdns.iter().any(|c| c.name == d.cdn))
            .collect();
        let cut = host
            .cdns
            .iter()
            .any(|c| removed_of(removed, host, &c.name) > 0)
            || !host_drains.is_empty();
        let ttl = if cut {
            host.incident_ttl.unwrap_or(host.ttl)
        } else {
            host.ttl
        };
        if s.ttl() != ttl {
            return Err(format!("{name}: TTL {} (cut: {cut}), want {ttl}", s.ttl()));
        }
        for (r, region) in host.regions.iter().enumerate() {
            let total: u64 = region.weights.iter().map(|&w| u64::from(w) * 100).sum();
            // Cut for every client of the region: failover, drains everywhere and drains
            // of this region by name.
            let everywhere = |c: usize| {
                let cdn = &host.cdns[c].name;
                host_drains
                    .iter()
                    .filter(|d| &d.cdn == cdn)
                    .filter(|d| d.scope.is_empty() || d.scope.contains(&DrainScope::Region(r)))
                    .map(|d| d.percent)
                    .chain([removed_of(removed, host, cdn)])
                    .max()
                    .unwrap_or(0)
                    .min(100)
            };
            let mut failed_open = false;
            for mask in 0..1usize << s.drain_scopes() {
                let what = format!("{name} region {r} `{}` mask {mask}", region.name);
                let choice = s.choose(&Decision {
                    region: r,
                    scope: 0,
                    mask,
                });
                let weights: Vec<(usize, u64)> = s
                    .weights(choice)
                    .map(|(t, w)| {
                        let c = host.cdns.iter().position(|c| *c.name == *t.cdn);
                        (c.unwrap_or(usize::MAX), w)
                    })
                    .collect();
                let sum: u64 = weights.iter().map(|&(_, w)| w).sum();
                if weights.is_empty() || sum != total {
                    return Err(format!(
                        "{what}: shares {weights:?} sum to {sum}, want {total}"
                    ));
                }
                for &(c, w) in &weights {
                    if c == usize::MAX || region.weights[c] == 0 || w == 0 {
                        return Err(format!("{what}: answers with CDN {c} at {w}: {weights:?}"));
                    }
                }
                let stuck = choice.reason == Reason::FailOpen;
                failed_open |= stuck;
                for &(c, w) in &weights {
                    if everywhere(c) == 100 && !stuck {
                        return Err(format!(
                            "{what}: {} is out but answers {w} (reason {})",
                            host.cdns[c].name, choice.reason
                        ));
                    }
                }
            }
            let listed = planned
                .fail_open
                .iter()
                .any(|k| k.name == name && k.region == region.name);
            if failed_open != listed {
                return Err(format!(
                    "{name} region `{}`: fails open: {failed_open}, listed: {listed}",
                    region.name
                ));
            }
        }
    }
    Ok(())
}

/// Every CDN of `policy` removed at each of its steps, then drained (everywhere,
/// in the first region by name, in GB), and every CDN removed at once: each plan
/// checked by [`check`]; the number of plans checked. The `policy` fuzz target runs it
/// over its inputs, the planner's tests over generated policies.
pub fn check_every_cut(policy: &Policy) -> Result<usize, String> {
    let mut plans = 0;
    let mut run = |removed: &Removed, drains: &[DrainCut]| {
        plans += 1;
        // The weights checked do not depend on a geo database: no places.
        check(policy, removed, drains, &plan(policy, removed, drains, &[]))
            .map_err(|e| format!("removed {removed:?}, drains {drains:?}: {e}"))
    };
    run(&Removed::new(), &[])?;
    for host in &policy.hosts {
        let name = host.name.to_string();
        let gb = Match::parse("GB").expect("a country");
        for cdn in &host.cdns {
            for &pct in &host.failover.steps {
                let key = NameCdn::new(name.clone(), cdn.name.clone());
                run(&[(key, pct)].into_iter().collect(), &[])?;
                for scope in [
                    vec![],
                    vec![DrainScope::Region(0)],
                    vec![DrainScope::Match(gb)],
                ] {
                    let cut = DrainCut {
                        id: "check".into(),
                        name: name.clone(),
                        cdn: cdn.name.clone(),
                        scope,
                        percent: pct,
                    };
                    run(&Removed::new(), &[cut])?;
                }
            }
        }
        let all = host
            .cdns
            .iter()
            .map(|c| (NameCdn::new(name.clone(), c.name.clone()), 100))
            .collect();
        run(&all, &[])?;
    }
    Ok(plans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const POLICY: &str = "\
hostname: www.example.com
ttl: 30
incident_ttl: 10
cdns:
  a: { cname: a.example.net. }
  b: { cname: b.example.net. }
regions:
  - match: [GB]
    weights: { a: 90, b: 10 }
  - match: [JP]
    weights: { a: 100 }
  - match: [\"*\"]
    weights: { a: 50, b: 50 }
";

    fn policy() -> Policy {
        config_parse(POLICY)
    }

    fn config_parse(text: &str) -> Policy {
        crate::config::parse(Path::new("t.yaml"), text.to_string())
            .unwrap()
            .0
    }

    fn weights(p: &Planned, region: usize) -> (Vec<(String, u64)>, Reason, u32) {
        let s = p.plan.names().next().unwrap();
        let c = s.choice(region);
        (
            s.weights(c).map(|(t, w)| (t.cdn.to_string(), w)).collect(),
            c.reason,
            s.ttl(),
        )
    }

    fn cut(pct: u8) -> Removed {
        [(NameCdn::new("www.example.com.", "a"), pct)]
            .into_iter()
            .collect()
    }

    /// The one line of region `region`'s choice (clients outside location drains).
    fn why(p: &Planned, region: usize) -> String {
        let s = p.plan.names().next().unwrap();
        s.why(s.choice(region)).to_string()
    }

    #[test]
    fn each_choice_says_why_in_one_line_naming_drains_steps_and_the_policy_version() {
        let policy = policy();
        let v = &policy.version;
        assert_eq!(v.len(), 12);
        let p = plan(&policy, &Removed::new(), &[], &[]);
        assert_eq!(
            why(&p, 0),
            format!("www.example.com. region=GB reason=normal policy={v}")
        );
        // Failover at 50 % on a; a drain of b in the default region only.
        let drain = DrainCut {
            id: "api-7".into(),
            name: "www.example.com.".into(),
            cdn: "b".into(),
            scope: vec![DrainScope::Region(2)],
            percent: 50,
        };
        let p = plan(&policy, &cut(50), &[drain], &[]);
        assert_eq!(
            why(&p, 0),
            format!("www.example.com. region=GB reason=failover failover=a:-50% policy={v}")
        );
        assert_eq!(
            why(&p, 2),
            format!(
                "www.example.com. region=default reason=drain drain=api-7:b:-50% failover=a:-50% policy={v}"
            )
        );
        // JP has a alone: cut, it stays (fail-open).
        let p = plan(&policy, &cut(100), &[], &[]);
        assert_eq!(
            why(&p, 1),
            format!("www.example.com. region=JP reason=fail-open failover=a:-100% policy={v}")
        );
        // Weights moved by a modifier are named.
        let mut moved = policy.clone();
        moved.hosts[0].regions[0].moved_by.push("performance");
        let p = plan(&moved, &Removed::new(), &[], &[]);
        assert_eq!(
            why(&p, 0),
            format!("www.example.com. region=GB reason=normal moved-by=performance policy={v}")
        );
    }

    #[test]
    fn normal_weights_and_ttl() {
        let p = plan(&policy(), &Removed::new(), &[], &[]);
        assert_eq!(
            weights(&p, 0),
            (
                vec![("a".into(), 9000), ("b".into(), 1000)],
                Reason::Normal,
                30
            )
        );
        assert!(p.fail_open.is_empty());
    }

    #[test]
    fn a_removed_share_moves_to_the_others_and_shortens_the_ttl() {
        // GB 90/10, steps [50, 100]: fastly 45 %, then 0 %; the total stays 100 %.
        let p = plan(&policy(), &cut(50), &[], &[]);
        assert_eq!(
            weights(&p, 0),
            (
                vec![("a".into(), 4500), ("b".into(), 5500)],
                Reason::Failover,
                10
            )
        );
        let p = plan(&policy(), &cut(100), &[], &[]);
        assert_eq!(
            weights(&p, 0),
            (vec![("b".into(), 10000)], Reason::Failover, 10)
        );
        assert_eq!(weights(&p, 2).0, vec![("b".into(), 10000)]);
    }

    #[test]
    fn three_cdns_share_what_one_gives_up_in_proportion() {
        let three = |w: [u64; 3], cuts: [u8; 3]| effective(&w, |c| cuts[c]);
        // The example: 60/30/10, 50 % on the first: 30 / 52.5 / 17.5.
        assert_eq!(
            three([60, 30, 10], [50, 0, 0]),
            (vec![3000, 5250, 1750], false)
        );
        assert_eq!(
            three([60, 30, 10], [100, 0, 0]),
            (vec![0, 7500, 2500], false)
        );
        // Two cut: each gives to the others by what they keep; the total holds.
        let (w, stuck) = three([60, 30, 10], [50, 100, 0]);
        assert!(!stuck);
        assert_eq!(w.iter().sum::<u64>(), 10000);
        assert_eq!(w[1], 0, "a CDN fully out gets nothing back");
        // Rounding never loses or invents weight.
        let (w, _) = three([1, 1, 1], [33, 0, 0]);
        assert_eq!((w.iter().sum::<u64>(), w[0]), (300, 67));
        // Nobody left to take it: every share stays (fail-open).
        assert_eq!(
            three([60, 30, 10], [100, 100, 100]),
            (vec![6000, 3000, 1000], true)
        );
    }

    /// A policy drawn from `seed`: one or two names, one to five CDNs, one to four
    /// regions (the last `"*"`), weights from 0 to 10^6 (never all 0 in a region), and
    /// step lists of one to three steps.
    fn random_policy(seed: u64) -> String {
        let mut state = seed;
        let mut next = move |n: u64| {
            // splitmix64
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) % n
        };
        const WEIGHTS: [u32; 8] = [0, 1, 2, 3, 10, 50, 90, 1_000_000];
        const MATCHES: [&str; 5] = [
            "[GB]",
            "[US, CA]",
            "[\"continent:EU\"]",
            "[\"81.2.69.0/24\"]",
            "[JP, NZ]",
        ];
        const STEPS: [&str; 4] = ["[100]", "[50, 100]", "[10, 33, 100]", "[1, 99, 100]"];
        let mut text = String::from("hostnames:\n");
        for h in 0..1 + next(2) {
            let cdns = 1 + next(5) as usize;
            text += &format!("  n{h}.example.com:\n    ttl: 30\n");
            if next(2) == 0 {
                text += "    incident_ttl: 5\n";
            }
            text += "    cdns:\n";
            for c in 0..cdns {
                text += &format!("      c{c}: {{ cname: c{c}.cdn.test. }}\n");
            }
            text += "    regions:\n";
            let regions = 1 + next(4);
            for r in 0..regions {
                let matches = if r + 1 == regions {
                    "[\"*\"]"
                } else {
                    MATCHES[next(MATCHES.len() as u64) as usize]
                };
                let mut w: Vec<u32> = (0..cdns)
                    .map(|_| WEIGHTS[next(WEIGHTS.len() as u64) as usize])
                    .collect();
                if w.iter().all(|&w| w == 0) {
                    w[next(cdns as u64) as usize] = 1 + next(100) as u32;
                }
                let w: Vec<String> = w
                    .iter()
                    .enumerate()
                    .map(|(c, w)| format!("c{c}: {w}"))
                    .collect();
                text += &format!(
                    "      - name: r{r}\n        match: {matches}\n        weights: {{ {} }}\n",
                    w.join(", ")
                );
            }
            let steps = STEPS[next(STEPS.len() as u64) as usize];
            text +=
                &format!("    failover:\n      steps: {steps}\n      step_interval_seconds: 1\n");
        }
        text
    }

    #[test]
    fn every_cut_of_many_policies_keeps_the_invariants() {
        let (mut policies, mut plans) = (0, 0);
        for seed in 0..400 {
            let text = random_policy(seed);
            let policy = match crate::config::parse(Path::new("t.yaml"), text.clone()) {
                Ok((p, _)) => p,
                Err(e) => panic!("seed {seed}: a generated policy is refused: {e}\n{text}"),
            };
            policies += 1;
            plans +=
                check_every_cut(&policy).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}"));
        }
        // The demo policy and the test fixtures too.
        for file in ["steering.yaml", "tests/fixtures/steering-multi.yaml"] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
            let text = std::fs::read_to_string(&path).unwrap();
            let policy = crate::config::parse(&path, text).unwrap().0;
            plans += check_every_cut(&policy).unwrap_or_else(|e| panic!("{file}: {e}"));
        }
        assert!(
            policies == 400 && plans > 4000,
            "{policies} policies, {plans} plans"
        );
    }

    #[test]
    fn a_region_with_nobody_left_fails_open() {
        let p = plan(&policy(), &cut(100), &[], &[]);
        assert_eq!(
            weights(&p, 1),
            (vec![("a".into(), 10000)], Reason::FailOpen, 10)
        );
        assert_eq!(p.fail_open, vec![NameRegion::new("www.example.com.", "JP")]);
        // Half removed in a region of one CDN: the half has nowhere to go, so a keeps
        // serving everything, and the plan says so.
        let p = plan(&policy(), &cut(50), &[], &[]);
        assert_eq!(weights(&p, 1).0, vec![("a".into(), 10000)]);
        assert_eq!(weights(&p, 1).1, Reason::FailOpen);
        assert_eq!(p.fail_open.len(), 1);
    }
}
