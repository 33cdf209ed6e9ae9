//! Input: semantic checks of the policy file. Every problem is collected (not just the
//! first) with the file, line and field, then the whole file is refused if any is an
//! error.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use hickory_proto::rr::Name;

use super::locate::Ctx;
use super::{
    valid_pathway, Cdn, ContentSteering, Drain, DrainScope, Failover, HostPolicy, Match,
    OrderedMap, Policy, RawCdn, RawContent, RawDrain, RawFailover, RawFile, RawHost, RawRegion,
    Region, Seg,
};
use crate::error::Issues;
use crate::zones::Zones;

/// RFC 2181 §8: a TTL is at most 2^31 - 1.
const MAX_TTL: i64 = 2_147_483_647;
/// Weights are summed into a u32 table; keep each one far below overflow.
const MAX_WEIGHT: i64 = 1_000_000;
/// A secondary below this share keeps a cold cache (design: warn, allow).
const WARN_SHARE_PERCENT: u64 = 10;

fn key(k: &str) -> Seg {
    Seg::Key(k.to_string())
}

fn at(base: &[Seg], more: &[Seg]) -> Vec<Seg> {
    base.iter().chain(more).cloned().collect()
}

pub(super) fn validate(
    file: &Path,
    source: String,
    raw: RawFile,
) -> Result<(Policy, Issues), Issues> {
    let mut cx = Ctx {
        file,
        source: &source,
        issues: Issues::default(),
    };
    let mut hosts = Vec::new();

    let single_keys = raw.ttl.is_some()
        || raw.incident_ttl.is_some()
        || raw.selection.is_some()
        || raw.cdns.is_some()
        || raw.regions.is_some()
        || raw.failover.is_some()
        || raw.drain.is_some()
        || raw.content_steering.is_some()
        || raw.commit.is_some();
    match (raw.hostname, raw.hostnames) {
        (Some(_), Some(_)) => cx.error(
            &[key("hostnames")],
            "give either `hostname:` with its keys, or `hostnames:`, not both",
        ),
        (None, None) => cx.error(&[], "no steered name: add `hostname:` (or `hostnames:`)"),
        (Some(name), None) => {
            let host = RawHost {
                tenant: None,
                ttl: raw.ttl,
                incident_ttl: raw.incident_ttl,
                selection: raw.selection,
                cdns: raw.cdns,
                regions: raw.regions,
                failover: raw.failover,
                drain: raw.drain,
                content_steering: raw.content_steering,
                commit: raw.commit,
            };
            if let Some(h) = host_policy(&mut cx, &[], &[key("hostname")], &name, host) {
                hosts.push(h);
            }
        }
        (None, Some(map)) => {
            if single_keys {
                cx.error(
                    &[key("hostnames")],
                    "with `hostnames:`, put ttl, selection, cdns, regions, failover, drain, content_steering and commit under each name",
                );
            }
            if map.0.is_empty() {
                cx.error(&[key("hostnames")], "no steered name");
            }
            for (name, host) in map.0 {
                let base = [key("hostnames"), key(&name)];
                if let Some(h) = host_policy(&mut cx, &base, &base, &name, host) {
                    if hosts.iter().any(|o: &HostPolicy| o.name == h.name) {
                        cx.error(&base, format!("`{}` is listed twice", h.name));
                    }
                    hosts.push(h);
                }
            }
        }
    }

    let mut issues = cx.issues;
    let dnssec = raw
        .dnssec
        .and_then(|d| super::dnssec::validate(file, &source, d, &mut issues));
    if issues.has_errors() {
        return Err(issues);
    }
    Ok((
        Policy {
            file: file.to_path_buf(),
            version: super::version_of(&source),
            source,
            by_name: Policy::index(&hosts),
            hosts,
            dnssec,
        },
        issues,
    ))
}

/// Validates one steered name's keys found at `base`; `name_at` is where the name is.
fn host_policy(
    cx: &mut Ctx,
    base: &[Seg],
    name_at: &[Seg],
    name: &str,
    raw: RawHost,
) -> Option<HostPolicy> {
    let errors_before = cx.issues.errors().count();

    let name = match parse_name(name) {
        Ok(n) => Some(n),
        Err(e) => {
            cx.error(name_at, e);
            None
        }
    };
    let ttl = parse_ttl(cx, &at(base, &[key("ttl")]), raw.ttl).unwrap_or(30);
    let incident_ttl = raw
        .incident_ttl
        .and_then(|t| parse_ttl(cx, &at(base, &[key("incident_ttl")]), Some(t)));
    if let Some(i) = incident_ttl {
        if i > ttl {
            cx.warn(
                &at(base, &[key("incident_ttl")]),
                format!(
                    "incident_ttl {i} is longer than ttl {ttl}: incidents would be cached longer"
                ),
            );
        }
    }

    let tenant = raw.tenant.filter(|t| {
        let ok = super::valid_tenant(t);
        if !ok {
            cx.error(
                &at(base, &[key("tenant")]),
                format!("`{t}`: a tenant is 1 to 64 of a-z 0-9 . - _"),
            );
        }
        ok
    });
    let cdns = cdns(cx, base, raw.cdns);
    let regions = regions(cx, base, raw.regions, &cdns);
    let failover = failover(cx, &at(base, &[key("failover")]), raw.failover);
    let drains = drains(cx, base, raw.drain, &cdns, &regions);
    check_drains(cx, base, &cdns, &regions, &drains);
    let content = content(
        cx,
        &at(base, &[key("content_steering")]),
        raw.content_steering,
        &cdns,
    );
    let commit = raw.commit.map_or_else(Default::default, |c| {
        super::contract::validate_commit(cx, &at(base, &[key("commit")]), c)
    });

    if cx.issues.errors().count() > errors_before {
        return None;
    }
    Some(HostPolicy {
        name: name?,
        path: base.to_vec(),
        ttl,
        incident_ttl,
        selection: raw.selection.unwrap_or_default(),
        cdns,
        regions,
        failover,
        drains,
        content,
        tenant,
        commit,
    })
}

/// `content_steering:`: pathway ids (default: the CDN names) that are valid and
/// distinct, a TTL, a throughput floor.
fn content(cx: &mut Ctx, path: &[Seg], raw: Option<RawContent>, cdns: &[Cdn]) -> ContentSteering {
    let mut out = ContentSteering {
        pathways: cdns.iter().map(|c| c.name.clone()).collect(),
        ..ContentSteering::default()
    };
    let Some(raw) = raw else {
        for (c, id) in cdns.iter().zip(&out.pathways) {
            if !valid_pathway(id) {
                // Not an error: the policy may predate content steering.
                cx.warn(
                    &at(path, &[]),
                    format!("CDN name `{}` is a poor pathway id for players (use 1 to 64 of A-Z a-z 0-9 . - _): map it under content_steering: pathways: {{ {}: <id> }}", c.name, c.name),
                );
            }
        }
        return out;
    };
    let mut mapped = vec![false; cdns.len()];
    for (cdn, id) in raw.pathways.map(|m| m.0).unwrap_or_default() {
        let ppath = at(path, &[key("pathways"), key(&cdn)]);
        let Some(i) = cdns.iter().position(|c| c.name == cdn) else {
            cx.error(
                &ppath,
                format!("unknown CDN `{cdn}` (defined under cdns: {})", names(cdns)),
            );
            continue;
        };
        if !valid_pathway(&id.0) {
            cx.error(
                &ppath,
                format!(
                    "`{}` is not a pathway id: 1 to 64 of A-Z a-z 0-9 . - _",
                    id.0
                ),
            );
            continue;
        }
        out.pathways[i] = id.0;
        mapped[i] = true;
    }
    for (i, id) in out.pathways.iter().enumerate() {
        if !mapped[i] && !valid_pathway(id) {
            cx.error(
                &at(path, &[key("pathways")]),
                format!("CDN name `{id}` cannot be a pathway id (1 to 64 of A-Z a-z 0-9 . - _): map it here"),
            );
        }
        if let Some(j) = out.pathways[..i].iter().position(|o| o == id) {
            cx.error(
                &at(path, &[key("pathways")]),
                format!(
                    "pathway id `{id}` is given to both {} and {}: a player could not tell them apart",
                    cdns[j].name, cdns[i].name
                ),
            );
        }
    }
    if let Some(t) = raw.ttl {
        if (1..=86_400).contains(&t) {
            out.ttl = Some(t as u32);
        } else {
            cx.error(
                &at(path, &[key("ttl")]),
                format!("{t} is not a steering TTL (1 to 86400 seconds)"),
            );
        }
    }
    if let Some(f) = raw.throughput_floor_bps {
        if f > 0 {
            out.throughput_floor_bps = Some(f as u64);
        } else {
            cx.error(
                &at(path, &[key("throughput_floor_bps")]),
                format!("{f} is not a throughput floor (bits per second, above 0)"),
            );
        }
    }
    out
}

/// A steered or target name: valid, made absolute and lowercase.
fn parse_name(s: &str) -> Result<Name, String> {
    let n = Name::from_str(s).map_err(|e| format!("`{s}` is not a valid DNS name: {e}"))?;
    if n.is_root() {
        return Err("the root cannot be steered".into());
    }
    let mut n = n.to_lowercase();
    n.set_fqdn(true);
    Ok(n)
}

fn parse_ttl(cx: &mut Ctx, path: &[Seg], v: Option<i64>) -> Option<u32> {
    let v = v?;
    if !(0..=MAX_TTL).contains(&v) {
        cx.error(path, format!("{v} is not a TTL (0 to {MAX_TTL} seconds)"));
        return None;
    }
    if v > 300 {
        cx.warn(
            path,
            format!("{v} s is long for a steered answer: failover waits for caches to expire"),
        );
    }
    Some(v as u32)
}

fn cdns(cx: &mut Ctx, base: &[Seg], raw: Option<OrderedMap<RawCdn>>) -> Vec<Cdn> {
    let Some(raw) = raw else {
        cx.error(
            base,
            "missing `cdns:` (the CDNs this name is steered between)",
        );
        return Vec::new();
    };
    if raw.0.is_empty() {
        cx.error(&at(base, &[key("cdns")]), "no CDN");
    }
    let mut out = Vec::new();
    for (name, cdn) in raw.0 {
        let path = at(base, &[key("cdns"), key(&name), key("cname")]);
        if !cdn.cname.ends_with('.') {
            cx.error(
                &path,
                format!("`{}` is not absolute: write `{}.`", cdn.cname, cdn.cname),
            );
            // Keep the name, so that regions naming it are not also reported.
            out.push(Cdn {
                name,
                cname: Name::root(),
                contract: None,
                capacity_mbps: None,
            });
            continue;
        }
        let cdn_path = at(base, &[key("cdns"), key(&name)]);
        let contract = cdn.contract.and_then(|c| {
            super::contract::validate_contract(cx, &at(&cdn_path, &[key("contract")]), c)
        });
        let capacity_mbps = cdn.capacity_mbps.and_then(|c| {
            super::contract::validate_capacity(cx, &at(&cdn_path, &[key("capacity_mbps")]), c)
        });
        match parse_name(&cdn.cname) {
            Ok(cname) => out.push(Cdn {
                name,
                cname,
                contract,
                capacity_mbps,
            }),
            Err(e) => {
                cx.error(&path, e);
                out.push(Cdn {
                    name,
                    cname: Name::root(),
                    contract: None,
                    capacity_mbps: None,
                });
            }
        }
    }
    out
}

fn regions(cx: &mut Ctx, base: &[Seg], raw: Option<Vec<RawRegion>>, cdns: &[Cdn]) -> Vec<Region> {
    let Some(raw) = raw else {
        cx.error(
            base,
            "missing `regions:` (at least a default region, match: [\"*\"])",
        );
        return Vec::new();
    };
    let mut out: Vec<Region> = Vec::new();
    let mut default_at: Option<usize> = None;
    for (i, r) in raw.into_iter().enumerate() {
        let rpath = at(base, &[key("regions"), Seg::Index(i)]);
        if let Some(d) = default_at {
            cx.error(
                &rpath,
                format!("regions[{d}] matches every client, so this region can never match"),
            );
        }
        let mut matches = Vec::new();
        match r.matches {
            None => cx.error(
                &rpath,
                "missing `match:` (countries, continent:XX, CIDR blocks or \"*\")",
            ),
            Some(list) if list.is_empty() => {
                cx.error(&at(&rpath, &[key("match")]), "empty match list")
            }
            Some(list) => {
                for (j, entry) in list.iter().enumerate() {
                    let mpath = at(&rpath, &[key("match"), Seg::Index(j)]);
                    match Match::parse(&entry.0) {
                        Ok(m) => {
                            if matches.contains(&m) {
                                cx.warn(&mpath, format!("`{m}` is listed twice in this region"));
                            } else if let Some(prev) =
                                out.iter().position(|o| o.matches.contains(&m))
                            {
                                if m != Match::Any {
                                    cx.warn(
                                        &mpath,
                                        format!("`{m}` is already matched by regions[{prev}], which comes first"),
                                    );
                                }
                            }
                            matches.push(m);
                        }
                        Err(e) => cx.error(&mpath, e),
                    }
                }
            }
        }
        if matches.contains(&Match::Any) {
            default_at.get_or_insert(i);
        }

        let mut weights = vec![0u32; cdns.len()];
        match r.weights {
            None => cx.error(&rpath, "missing `weights:` (CDN name: weight)"),
            Some(ws) => {
                for (cdn, w) in ws.0 {
                    let wpath = at(&rpath, &[key("weights"), key(&cdn)]);
                    let Some(idx) = cdns.iter().position(|c| c.name == cdn) else {
                        cx.error(
                            &wpath,
                            format!("unknown CDN `{cdn}` (defined under cdns: {})", names(cdns)),
                        );
                        continue;
                    };
                    if !(0..=MAX_WEIGHT).contains(&w) {
                        cx.error(
                            &wpath,
                            format!("weight {w} is out of range (0 to {MAX_WEIGHT})"),
                        );
                        continue;
                    }
                    weights[idx] = w as u32;
                }
                let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
                if total == 0 {
                    cx.error(
                        &at(&rpath, &[key("weights")]),
                        "all weights are zero: no CDN could answer",
                    );
                } else {
                    for (idx, &w) in weights.iter().enumerate() {
                        if w > 0 && u64::from(w) * 100 < total * WARN_SHARE_PERCENT {
                            cx.warn(
                                &at(&rpath, &[key("weights"), key(&cdns[idx].name)]),
                                format!(
                                    "{} gets {:.1} % here: a CDN with a tiny share keeps a cold cache and fails over badly",
                                    cdns[idx].name,
                                    f64::from(w) * 100.0 / total as f64
                                ),
                            );
                        }
                    }
                }
            }
        }

        let name = match r.name {
            Some(n) if n.trim().is_empty() => {
                cx.error(&at(&rpath, &[key("name")]), "empty region name");
                n
            }
            Some(n) => n,
            None if matches.contains(&Match::Any) => "default".to_string(),
            None => matches
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
        };
        if out.iter().any(|o| o.name == name) {
            cx.error(
                &at(&rpath, &[key("name")]),
                format!("region name `{name}` is used twice"),
            );
        }
        let performance = r
            .performance
            .and_then(|p| super::perf::validate(cx, &at(&rpath, &[key("performance")]), p));
        out.push(Region {
            name,
            matches,
            weights,
            performance,
            moved_by: Vec::new(),
        });
    }
    if default_at.is_none() {
        cx.error(
            &at(base, &[key("regions")]),
            "no default region: add a last region with match: [\"*\"] for clients no other region matches",
        );
    }
    for (idx, cdn) in cdns.iter().enumerate() {
        if !out.is_empty()
            && out
                .iter()
                .all(|r| r.weights.get(idx).is_none_or(|&w| w == 0))
        {
            cx.warn(
                &at(base, &[key("cdns"), key(&cdn.name)]),
                format!("{} has no weight in any region and never answers", cdn.name),
            );
        }
    }
    out
}

fn failover(cx: &mut Ctx, path: &[Seg], raw: Option<RawFailover>) -> Failover {
    let default = Failover::default();
    let Some(raw) = raw else {
        return default;
    };
    let mut steps = Vec::new();
    match raw.steps {
        None => steps = default.steps,
        Some(list) => {
            let spath = at(path, &[key("steps")]);
            if list.is_empty() {
                cx.error(&spath, "no step: use [100] to fail over at once");
            }
            for (i, &s) in list.iter().enumerate() {
                if !(1..=100).contains(&s) {
                    cx.error(
                        &at(&spath, &[Seg::Index(i)]),
                        format!("step {s} is not a percentage (1 to 100)"),
                    );
                } else if i > 0 && s <= list[i - 1] {
                    cx.error(&at(&spath, &[Seg::Index(i)]), "steps must be increasing");
                }
                steps.push(s.clamp(0, 100) as u8);
            }
            if list.last().is_some_and(|&l| l != 100) {
                cx.error(
                    &spath,
                    "the last step must be 100 (the CDN's whole weight removed)",
                );
            }
        }
    }
    let step_interval = match raw.step_interval_seconds {
        None => default.step_interval,
        Some(s) if (0.0..=86_400.0).contains(&s) => Duration::from_secs_f64(s),
        Some(s) => {
            cx.error(
                &at(path, &[key("step_interval_seconds")]),
                format!("{s} is not 0 to 86400 seconds"),
            );
            default.step_interval
        }
    };
    Failover {
        steps,
        step_interval,
    }
}

fn drains(
    cx: &mut Ctx,
    base: &[Seg],
    raw: Option<Vec<RawDrain>>,
    cdns: &[Cdn],
    regions: &[Region],
) -> Vec<Drain> {
    let mut out = Vec::new();
    for (i, d) in raw.unwrap_or_default().into_iter().enumerate() {
        let dpath = at(base, &[key("drain"), Seg::Index(i)]);
        let cdn = cdns.iter().position(|c| c.name == d.cdn);
        if cdn.is_none() {
            cx.error(
                &at(&dpath, &[key("cdn")]),
                format!(
                    "unknown CDN `{}` (defined under cdns: {})",
                    d.cdn,
                    names(cdns)
                ),
            );
        }
        let mut scope = Vec::new();
        for (j, entry) in d.scope.unwrap_or_default().iter().enumerate() {
            if let Some(r) = regions.iter().position(|r| r.name == entry.0) {
                scope.push(DrainScope::Region(r));
                continue;
            }
            match Match::parse(&entry.0) {
                Ok(Match::Any) => {}
                Ok(m) => scope.push(DrainScope::Match(m)),
                Err(e) => cx.error(
                    &at(&dpath, &[key("where"), Seg::Index(j)]),
                    format!("not a region name, and {e}"),
                ),
            }
        }
        let until = match d.until {
            None => None,
            Some(s) => match humantime::parse_rfc3339_weak(s.0.trim()) {
                Ok(t) => Some(t),
                Err(_) => {
                    cx.error(
                        &at(&dpath, &[key("until")]),
                        format!("`{}` is not a UTC time like 2026-12-01T12:00:00Z", s.0),
                    );
                    None
                }
            },
        };
        let reason = d.reason.unwrap_or_default();
        if reason.trim().is_empty() {
            cx.warn(
                &dpath,
                "a drain without a `reason:` leaves the next operator guessing",
            );
        }
        let Some(cdn) = cdn else {
            continue;
        };
        out.push(Drain {
            cdn,
            scope,
            reason,
            until,
            immediate: d.immediate,
        });
    }
    out
}

fn names(cdns: &[Cdn]) -> String {
    if cdns.is_empty() {
        return "none".into();
    }
    cdns.iter()
        .map(|c| c.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks the policy against the zones it will be served from: every steered name must
/// be inside a served zone, below its apex, not delegated away, and own no other data
/// (a CNAME owns its name, RFC 1034 §3.6.2).
pub fn check_against_zones(policy: &Policy, zones: &Zones) -> Issues {
    let mut cx = Ctx {
        file: &policy.file,
        source: &policy.source,
        issues: Issues::default(),
    };
    for host in &policy.hosts {
        let path = if host.path.is_empty() {
            vec![key("hostname")]
        } else {
            host.path.clone()
        };
        let Some(zone) = zones.zone_of(&host.name) else {
            cx.error(
                &path,
                format!(
                    "{} is outside every served zone ({})",
                    host.name,
                    zones
                        .origins()
                        .map(|o| o.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
            continue;
        };
        if host.name == *zone.origin() {
            cx.error(&path, format!("{} is the apex of its zone, where a CNAME cannot live (it must coexist with SOA and NS)", host.name));
            continue;
        }
        if let Some(cut) = zone.delegation_above(&host.name) {
            cx.error(
                &path,
                format!(
                    "{} is below the delegation {cut} in {}: another server answers for it",
                    host.name,
                    zone.file().display()
                ),
            );
            continue;
        }
        let types = zone.types_at(&host.name);
        if !types.is_empty() {
            cx.error(
                &path,
                format!(
                    "{} also has {} records in {}: a steered name is a CNAME and owns its name alone",
                    host.name,
                    types.join("/"),
                    zone.file().display()
                ),
            );
        }
    }
    cx.issues
}

/// Whether `drains` (all in force) would leave some region of `host` with no CDN: the
/// region's every serving CDN is drained everywhere, in that region, or for one of the
/// region's own match entries. Draining a whole region is refused, not failed open.
pub fn empties_a_region(host: &HostPolicy, drains: &[(usize, Vec<DrainScope>)]) -> Option<String> {
    for (r, region) in host.regions.iter().enumerate() {
        let applies = |scope: &[DrainScope]| {
            scope.is_empty()
                || scope.iter().any(|s| match s {
                    DrainScope::Region(i) => *i == r,
                    DrainScope::Match(m) => region.matches.contains(m),
                })
        };
        let serving = (0..host.cdns.len()).filter(|&c| region.weights[c] > 0);
        let all = serving
            .clone()
            .all(|c| drains.iter().any(|(dc, scope)| *dc == c && applies(scope)));
        if all && serving.count() > 0 {
            return Some(region.name.clone());
        }
    }
    None
}

/// Drains in force must leave every region a CDN, and fit the planner's limit.
fn check_drains(cx: &mut Ctx, base: &[Seg], cdns: &[Cdn], regions: &[Region], drains: &[Drain]) {
    let now = crate::clock::now();
    let mut active = Vec::new();
    for (i, d) in drains.iter().enumerate() {
        match d.until {
            Some(t) if t <= now => cx.warn(
                &at(base, &[key("drain"), Seg::Index(i), key("until")]),
                format!(
                    "this drain of {} expired at {}: it no longer applies; remove it",
                    cdns[d.cdn].name,
                    humantime::format_rfc3339_seconds(t)
                ),
            ),
            _ => active.push((d.cdn, d.scope.clone())),
        }
    }
    let probe = HostPolicy {
        name: Name::root(),
        path: Vec::new(),
        ttl: 0,
        incident_ttl: None,
        selection: Default::default(),
        cdns: cdns.to_vec(),
        regions: regions.to_vec(),
        failover: Failover::default(),
        drains: Vec::new(),
        content: ContentSteering::default(),
        tenant: None,
        commit: Default::default(),
    };
    if let Some(region) = empties_a_region(&probe, &active) {
        cx.error(
            &at(base, &[key("drain")]),
            format!("these drains take every CDN out of region `{region}`: refused, traffic would have nowhere to go"),
        );
    }
    let groups = super::location_scopes(active.iter().map(|(_, s)| s.as_slice()));
    if groups > super::MAX_DRAIN_SCOPES {
        cx.error(
            &at(base, &[key("drain")]),
            format!(
                "{} different location scopes in drains: at most {} (use region names)",
                groups,
                super::MAX_DRAIN_SCOPES
            ),
        );
    }
}
