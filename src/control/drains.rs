//! Control plane: drains, the operator's way to take a CDN out of service: from
//! `drain:` in the policy, or as runtime overrides over the admin API. Both become the
//! same `DrainRule`, resolved against the current policy at every plan (a region named
//! in `where:` is found by name, so a reload that reorders regions keeps the drain).
//!
//! A drain moves traffic in the failover steps (the controller runs a stepper per
//! drain), or at once with `immediate`; it ends by itself at `until`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tracing::{info, warn};

pub use crate::config::empties_a_region;
use crate::config::{DrainScope, HostPolicy, Match, Policy, MAX_DRAIN_SCOPES};
use crate::control::planner::DrainCut;
use crate::control::stepper::{Direction, Stepper};
use crate::control::times;

/// Runtime overrides expire by default after this long, so a forgotten one reverts.
pub const DEFAULT_OVERRIDE_TTL: Duration = Duration::from_secs(2 * 3600);

/// One drain, from the policy or the API.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRule {
    /// `policy` or `api-N`.
    pub id: String,
    /// The steered name (absolute, lowercase).
    pub name: String,
    pub cdn: String,
    /// Region names, countries, `continent:XX`, CIDR blocks; empty = everywhere.
    #[serde(default)]
    pub scope: Vec<String>,
    #[serde(default)]
    pub reason: String,
    /// Milliseconds since the Unix epoch; `None` = until removed.
    #[serde(default, deserialize_with = "times::bounded_opt")]
    pub until_unix_ms: Option<u64>,
    #[serde(default)]
    pub immediate: bool,
    /// In a set (`--etcd`): the node whose API took it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_by: Option<String>,
    /// In a set: when that node wrote it to etcd (Unix ms).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "times::bounded_opt"
    )]
    pub written_at_unix_ms: Option<u64>,
    /// The tenant whose drain this is part of (a drain of a tenant is one rule per
    /// name of the tenant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Who made it: the API token's name (`None` for the policy's drains).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// The ticket the request carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ticket: Option<String>,
}

/// Why a drain is refused. The API answers 400 for a request that names what the
/// policy does not have, 409 for one that conflicts with the drains in force, 404 for
/// an override that does not exist.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("{0} is not a steered name")]
    NotSteered(String),
    #[error("no steered name has the tenant `{0}`")]
    NoTenant(String),
    #[error("no steered name of tenant `{tenant}` has a CDN `{cdn}`")]
    NoTenantName { tenant: String, cdn: String },
    /// The API token may not do this: what it lacks (403).
    #[error("{0}")]
    Forbidden(String),
    #[error("{name} has no CDN `{cdn}` (CDNs: {known})")]
    UnknownCdn {
        name: String,
        cdn: String,
        known: String,
    },
    #[error("where: `{entry}` is not a region of {name}, and {why}")]
    BadScope {
        entry: String,
        name: String,
        why: String,
    },
    #[error("`until` is in the past")]
    UntilPassed,
    #[error("refused: this drain would take every CDN out of region `{0}`")]
    EmptiesRegion(String),
    #[error("no drain override `{0}`")]
    NoSuchOverride(String),
    #[error("refused: {name} would have {scopes} different location scopes of drains, at most {max}: drain by region name, or reuse the `where` of a drain in force")]
    TooManyScopes {
        name: String,
        scopes: usize,
        max: usize,
    },
    /// In a set: etcd cannot take it now (the set must agree on every override).
    #[error("etcd unreachable, the set cannot take an override now: {0}")]
    Unavailable(String),
}

impl DrainError {
    /// Whether the request conflicts with the drains in force (rather than being wrong
    /// on its own).
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            DrainError::EmptiesRegion(_) | DrainError::TooManyScopes { .. }
        )
    }
}

/// What identifies a drain across reloads (its stepper is kept by this).
pub type DrainKey = (String, String, String);

impl DrainRule {
    pub fn key(&self) -> DrainKey {
        (self.name.clone(), self.cdn.clone(), self.scope.join(","))
    }

    /// Whether it has expired at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.until_unix_ms.is_some_and(|u| u <= now_ms)
    }

    /// The host and the scope it applies to in `policy`, or why it cannot apply.
    pub fn resolve<'p>(
        &self,
        policy: &'p Policy,
    ) -> Result<(&'p HostPolicy, Vec<DrainScope>), DrainError> {
        let host = policy
            .hosts
            .iter()
            .find(|h| h.name.to_string() == self.name)
            .ok_or_else(|| DrainError::NotSteered(self.name.clone()))?;
        if !host.cdns.iter().any(|c| c.name == self.cdn) {
            let known: Vec<&str> = host.cdns.iter().map(|c| c.name.as_str()).collect();
            return Err(DrainError::UnknownCdn {
                name: self.name.clone(),
                cdn: self.cdn.clone(),
                known: known.join(", "),
            });
        }
        let mut scope = Vec::new();
        for entry in &self.scope {
            if let Some(r) = host.regions.iter().position(|r| r.name == *entry) {
                scope.push(DrainScope::Region(r));
                continue;
            }
            match Match::parse(entry) {
                Ok(Match::Any) => {}
                Ok(m) => scope.push(DrainScope::Match(m)),
                Err(e) => {
                    return Err(DrainError::BadScope {
                        entry: entry.clone(),
                        name: self.name.clone(),
                        why: e,
                    })
                }
            }
        }
        Ok((host, scope))
    }

    /// The rules a drain request makes: itself, or for a drain of a tenant (`tenant`
    /// set, `name` empty) one rule per name of the tenant that has the CDN.
    pub fn expand(self, policy: &Policy) -> Result<Vec<DrainRule>, DrainError> {
        let Some(tenant) = self.tenant.clone().filter(|_| self.name.is_empty()) else {
            return Ok(vec![self]);
        };
        let rules: Vec<DrainRule> = policy
            .hosts
            .iter()
            .filter(|h| h.tenant.as_deref() == Some(&tenant))
            .filter(|h| h.cdns.iter().any(|c| c.name == self.cdn))
            .map(|h| DrainRule {
                name: h.name.to_string(),
                ..self.clone()
            })
            .collect();
        if rules.is_empty() {
            return Err(DrainError::NoTenantName {
                tenant,
                cdn: self.cdn,
            });
        }
        Ok(rules)
    }

    /// The policy's drains as rules.
    pub fn from_policy(policy: &Policy) -> Vec<DrainRule> {
        let mut out = Vec::new();
        for host in &policy.hosts {
            for d in &host.drains {
                out.push(DrainRule {
                    id: "policy".into(),
                    name: host.name.to_string(),
                    cdn: host.cdns[d.cdn].name.clone(),
                    scope: d
                        .scope
                        .iter()
                        .map(|s| match s {
                            DrainScope::Region(r) => host.regions[*r].name.clone(),
                            DrainScope::Match(m) => m.to_string(),
                        })
                        .collect(),
                    reason: d.reason.clone(),
                    until_unix_ms: d.until.map(crate::clock::unix_ms),
                    immediate: d.immediate,
                    written_by: None,
                    written_at_unix_ms: None,
                    tenant: host.tenant.clone(),
                    author: None,
                    ticket: None,
                });
            }
        }
        out
    }
}

/// A drain's progress: its stepper and the rule (kept while it steps back after the
/// rule ended).
#[derive(Clone, Debug)]
struct Draining {
    rule: DrainRule,
    stepper: Stepper,
    /// The rule is in force (not removed, not expired).
    active: bool,
}

/// Every drain in force or stepping back, and the runtime overrides.
#[derive(Clone, Debug, Default)]
pub struct Drains {
    /// Added over the API; persisted.
    pub overrides: Vec<DrainRule>,
    next_id: u64,
    steps: BTreeMap<DrainKey, Draining>,
    /// Drains in force that [`Drains::admit`] refused when they came (a reload, or a
    /// set's override written by another node or by hand): they cut nothing.
    refused: BTreeMap<DrainKey, (DrainRule, String)>,
}

/// Saved form of a drain's progress.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedDrain {
    pub rule: DrainRule,
    pub level: usize,
    pub direction: Direction,
    pub next_in_ms: Option<u64>,
    pub active: bool,
}

impl Drains {
    /// The rules in force now: the policy's and the overrides, not expired.
    pub fn in_force(&self, policy: &Policy, now_ms: u64) -> Vec<DrainRule> {
        DrainRule::from_policy(policy)
            .into_iter()
            .chain(self.overrides.iter().cloned())
            .filter(|r| !r.expired(now_ms) && r.resolve(policy).is_ok())
            .collect()
    }

    /// Starts steppers for new drains and steps back those that ended; returns whether
    /// a weight changed.
    pub fn sync(&mut self, policy: &Policy, now: Instant, now_ms: u64) -> bool {
        let in_force = self.in_force(policy, now_ms);
        let mut changed = false;
        self.refused
            .retain(|k, _| in_force.iter().any(|r| r.key() == *k));
        for rule in &in_force {
            let Ok((host, _)) = rule.resolve(policy) else {
                continue;
            };
            if !self.steps.contains_key(&rule.key()) {
                if let Err(e) = self.check_scopes(policy, rule, now_ms, false) {
                    if let std::collections::btree_map::Entry::Vacant(v) =
                        self.refused.entry(rule.key())
                    {
                        warn!(name = %rule.name, cdn = %rule.cdn, scope = %scope_text(rule), id = %rule.id, error = %e, "drain refused: it cuts nothing (never widened to everywhere)");
                        v.insert((rule.clone(), e.to_string()));
                    }
                    continue;
                }
                self.refused.remove(&rule.key());
            }
            let entry = self.steps.entry(rule.key()).or_insert_with(|| Draining {
                rule: rule.clone(),
                stepper: Stepper::default(),
                active: false,
            });
            entry.rule = rule.clone();
            if !entry.active {
                entry.active = true;
                let before = entry.stepper.level;
                if rule.immediate {
                    entry.stepper = Stepper {
                        level: host.failover.steps.len(),
                        direction: Direction::Demote,
                        next_at: None,
                    };
                } else {
                    entry.stepper.demote(now, &host.failover);
                }
                changed |= entry.stepper.level != before;
                info!(
                    name = %rule.name, cdn = %rule.cdn, scope = %scope_text(rule), reason = %rule.reason, id = %rule.id,
                    immediate = rule.immediate, removed_percent = entry.stepper.removed_percent(&host.failover),
                    "drain applied"
                );
            }
        }
        let keys: Vec<DrainKey> = in_force.iter().map(DrainRule::key).collect();
        for (key, d) in self.steps.iter_mut() {
            if d.active && !keys.contains(key) {
                d.active = false;
                let why = if d.rule.expired(now_ms) {
                    "drain expired"
                } else {
                    "drain removed"
                };
                info!(name = %d.rule.name, cdn = %d.rule.cdn, scope = %scope_text(&d.rule), reason = %d.rule.reason, id = %d.rule.id, "{why}: traffic returns in steps");
                if let Ok((host, _)) = d.rule.resolve(policy) {
                    let before = d.stepper.level;
                    d.stepper.promote(now, &host.failover);
                    changed |= d.stepper.level != before;
                } else {
                    d.stepper = Stepper::default();
                    changed = true;
                }
            }
        }
        self.steps.retain(|_, d| d.active || d.stepper.is_active());
        changed
    }

    /// Applies due steps; returns whether a weight changed.
    pub fn tick(&mut self, policy: &Policy, now: Instant) -> bool {
        let mut changed = false;
        for d in self.steps.values_mut() {
            if let Ok((host, _)) = d.rule.resolve(policy) {
                if d.stepper.tick(now, &host.failover) {
                    changed = true;
                    info!(name = %d.rule.name, cdn = %d.rule.cdn, scope = %scope_text(&d.rule), removed_percent = d.stepper.removed_percent(&host.failover), "drain step");
                }
            }
        }
        self.steps.retain(|_, d| d.active || d.stepper.is_active());
        changed
    }

    /// What the planner removes for the drains.
    pub fn cuts(&self, policy: &Policy) -> Vec<DrainCut> {
        self.steps
            .values()
            .filter_map(|d| {
                let (host, scope) = d.rule.resolve(policy).ok()?;
                let percent = d.stepper.removed_percent(&host.failover);
                (percent > 0).then(|| DrainCut {
                    name: d.rule.name.clone(),
                    cdn: d.rule.cdn.clone(),
                    scope,
                    percent,
                })
            })
            .collect()
    }

    /// When something is next due: a step, a drain to start, or an expiry. A drain
    /// still marked in force whose `until` has passed is due now: wall-clock and
    /// monotonic time may disagree by a little, and an expiry seen a millisecond early
    /// must not be missed for good.
    pub fn next_due(&self, policy: &Policy, now: Instant, now_ms: u64) -> Option<Instant> {
        let steps = self.steps.values().filter_map(|d| d.stepper.next_at);
        let at = |u: u64| now + Duration::from_millis(u.saturating_sub(now_ms));
        let ending = self
            .steps
            .values()
            .filter(|d| d.active)
            .filter_map(|d| d.rule.until_unix_ms)
            .map(at);
        let starting = self
            .in_force(policy, now_ms)
            .into_iter()
            .filter(|r| !self.steps.get(&r.key()).is_some_and(|d| d.active))
            .filter(|r| !self.refused.contains_key(&r.key()))
            .map(|_| now);
        steps.chain(ending).chain(starting).min()
    }

    /// Adds a runtime override after checking it against the policy and the drains
    /// already in force.
    pub fn add(
        &mut self,
        policy: &Policy,
        mut rule: DrainRule,
        now_ms: u64,
    ) -> Result<DrainRule, DrainError> {
        let (host, scope) = rule.resolve(policy)?;
        let cdn = host
            .cdns
            .iter()
            .position(|c| c.name == rule.cdn)
            .unwrap_or(0);
        let mut all: Vec<(usize, Vec<DrainScope>)> = self
            .in_force(policy, now_ms)
            .iter()
            .filter(|r| r.name == rule.name)
            .filter_map(|r| {
                let (h, s) = r.resolve(policy).ok()?;
                Some((h.cdns.iter().position(|c| c.name == r.cdn)?, s))
            })
            .collect();
        all.push((cdn, scope));
        if let Some(region) = empties_a_region(host, &all) {
            return Err(DrainError::EmptiesRegion(region));
        }
        self.admit(policy, &rule, now_ms)?;
        if rule.until_unix_ms.is_some_and(|u| u <= now_ms) {
            return Err(DrainError::UntilPassed);
        }
        rule.until_unix_ms = Some(
            rule.until_unix_ms
                .unwrap_or(now_ms + DEFAULT_OVERRIDE_TTL.as_millis() as u64),
        );
        self.next_id += 1;
        rule.id = format!("api-{}-{}", now_ms, self.next_id);
        self.overrides.retain(|o| o.key() != rule.key());
        self.overrides.push(rule.clone());
        Ok(rule)
    }

    /// The one location-scope check of a drain, for every path (the API, a reload, a
    /// set's override read from etcd): the planner gives each distinct location scope
    /// of a name its own choices, up to [`MAX_DRAIN_SCOPES`]. Every drain of the name
    /// admitted that still cuts counts: in force, or stepping back after it ended.
    /// Overrides added but not applied yet (no `sync` since) count too.
    pub fn admit(&self, policy: &Policy, rule: &DrainRule, now_ms: u64) -> Result<(), DrainError> {
        self.check_scopes(policy, rule, now_ms, true)
    }

    /// [`Drains::admit`]; `sync` applies the rules in order, each checked against
    /// those admitted before it only (`pending` false).
    fn check_scopes(
        &self,
        policy: &Policy,
        rule: &DrainRule,
        now_ms: u64,
        pending: bool,
    ) -> Result<(), DrainError> {
        let Ok((_, scope)) = rule.resolve(policy) else {
            return Ok(());
        };
        let mut cutting: BTreeMap<DrainKey, Vec<DrainScope>> = self
            .steps
            .values()
            .filter(|d| d.rule.name == rule.name && (d.active || d.stepper.level > 0))
            .filter_map(|d| Some((d.rule.key(), d.rule.resolve(policy).ok()?.1)))
            .collect();
        if pending {
            for r in self.in_force(policy, now_ms) {
                let key = r.key();
                if r.name == rule.name && !self.refused.contains_key(&key) {
                    if let Ok((_, s)) = r.resolve(policy) {
                        cutting.entry(key).or_insert(s);
                    }
                }
            }
        }
        cutting.insert(rule.key(), scope);
        let scopes = crate::config::location_scopes(cutting.values().map(Vec::as_slice));
        if scopes > MAX_DRAIN_SCOPES {
            return Err(DrainError::TooManyScopes {
                name: rule.name.clone(),
                scopes,
                max: MAX_DRAIN_SCOPES,
            });
        }
        Ok(())
    }

    /// How many drains in force are refused (see [`Drains::admit`]).
    pub fn refused(&self) -> usize {
        self.refused.len()
    }

    /// Removes a runtime override by id.
    pub fn remove(&mut self, id: &str) -> Option<DrainRule> {
        let i = self.overrides.iter().position(|o| o.id == id)?;
        Some(self.overrides.remove(i))
    }

    /// Forgets overrides that have expired (they are reported once by `sync`).
    pub fn prune(&mut self, now_ms: u64) {
        self.overrides.retain(|o| !o.expired(now_ms));
    }

    pub fn saved(&self, now: Instant) -> Vec<SavedDrain> {
        self.steps
            .values()
            .map(|d| SavedDrain {
                rule: d.rule.clone(),
                level: d.stepper.level,
                direction: d.stepper.direction,
                next_in_ms: d
                    .stepper
                    .next_at
                    .map(|at| at.saturating_duration_since(now).as_millis() as u64),
                active: d.active,
            })
            .collect()
    }

    pub fn restore(
        &mut self,
        overrides: Vec<DrainRule>,
        saved: &[SavedDrain],
        now: Instant,
        away_ms: u64,
    ) {
        self.overrides = overrides;
        for s in saved {
            let stepper = Stepper {
                level: s.level,
                direction: s.direction,
                next_at: s
                    .next_in_ms
                    .map(|ms| now + Duration::from_millis(ms.saturating_sub(away_ms))),
            };
            self.steps.insert(
                s.rule.key(),
                Draining {
                    rule: s.rule.clone(),
                    stepper,
                    active: s.active,
                },
            );
        }
    }

    /// For `/v1/state` and explain: every drain with its progress.
    pub fn report(&self, policy: &Policy, now_ms: u64) -> Vec<DrainStatus> {
        let mut out: Vec<DrainStatus> = self
            .steps
            .values()
            .map(|d| {
                let pct = d
                    .rule
                    .resolve(policy)
                    .map(|(h, _)| d.stepper.removed_percent(&h.failover))
                    .unwrap_or(0);
                let state = if d.active {
                    DrainState::InForce
                } else {
                    DrainState::Ending
                };
                DrainStatus::new(&d.rule, state, pct)
            })
            .collect();
        for r in DrainRule::from_policy(policy)
            .into_iter()
            .filter(|r| r.expired(now_ms))
        {
            out.push(DrainStatus::new(&r, DrainState::Expired, 0));
        }
        for (r, _) in self.refused.values() {
            out.push(DrainStatus::new(r, DrainState::Refused, 0));
        }
        out
    }
}

/// Where a drain stands, as `/v1/state`, `/v1/explain` and `explain` show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum DrainState {
    /// Traffic is moving away, or has.
    #[serde(rename = "in force")]
    InForce,
    /// Removed or expired: traffic is coming back in steps.
    #[serde(rename = "ending")]
    Ending,
    /// A drain of the policy whose `until` has passed: it no longer applies.
    #[serde(rename = "expired: remove it from the policy")]
    Expired,
    /// Over the location-scope cap when it came: it cuts nothing.
    #[serde(rename = "refused: too many location scopes")]
    Refused,
}

impl std::fmt::Display for DrainState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DrainState::InForce => "in force",
            DrainState::Ending => "ending",
            DrainState::Expired => "expired: remove it from the policy",
            DrainState::Refused => "refused: too many location scopes",
        })
    }
}

/// A drain and where it stands.
#[derive(Clone, Debug, Serialize)]
pub struct DrainStatus {
    pub id: String,
    pub name: String,
    pub cdn: String,
    /// Empty: everywhere.
    #[serde(rename = "where")]
    pub scope: Vec<String>,
    pub reason: String,
    pub until_unix_ms: Option<u64>,
    pub immediate: bool,
    /// In a set: the node whose API took it, and when.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub written_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub written_at_unix_ms: Option<u64>,
    /// The tenant of the name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The API token that made it, and the ticket it gave.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ticket: Option<String>,
    pub status: DrainState,
    /// Percent of the CDN's share moved away now.
    pub removed_percent: u8,
}

impl DrainStatus {
    fn new(rule: &DrainRule, status: DrainState, removed_percent: u8) -> DrainStatus {
        DrainStatus {
            id: rule.id.clone(),
            name: rule.name.clone(),
            cdn: rule.cdn.clone(),
            scope: rule.scope.clone(),
            reason: rule.reason.clone(),
            until_unix_ms: rule.until_unix_ms,
            immediate: rule.immediate,
            written_by: rule.written_by.clone(),
            written_at_unix_ms: rule.written_at_unix_ms,
            tenant: rule.tenant.clone(),
            author: rule.author.clone(),
            ticket: rule.ticket.clone(),
            status,
            removed_percent,
        }
    }
}

fn scope_text(rule: &DrainRule) -> String {
    if rule.scope.is_empty() {
        "everywhere".into()
    } else {
        rule.scope.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn policy() -> Policy {
        let text = "hostname: www.example.com\ncdns:\n  a: { cname: a.example.net. }\n  b: { cname: b.example.net. }\nregions:\n  - match: [\"*\"]\n    weights: { a: 1, b: 1 }\nfailover: { steps: [100] }\n";
        crate::config::parse(Path::new("t.yaml"), text.to_string())
            .unwrap()
            .0
    }

    fn rule(until: u64) -> DrainRule {
        DrainRule {
            id: String::new(),
            name: "www.example.com.".into(),
            cdn: "a".into(),
            scope: vec![],
            reason: "test".into(),
            until_unix_ms: Some(until),
            immediate: true,
            written_by: None,
            written_at_unix_ms: None,
            tenant: None,
            author: None,
            ticket: None,
        }
    }

    #[test]
    fn an_expiry_is_due_even_when_the_timer_fired_early() {
        let p = policy();
        let (now, t0) = (Instant::now(), 1_000_000);
        let mut d = Drains::default();
        d.add(&p, rule(t0 + 100), t0).unwrap();
        assert!(d.sync(&p, now, t0));
        assert_eq!(d.cuts(&p)[0].percent, 100);
        // The timer fired 1 ms before `until` by the wall clock: nothing ends yet...
        assert!(!d.sync(&p, now, t0 + 99));
        // ...and once `until` has passed, the end is due at once, not never.
        let due = d.next_due(&p, now, t0 + 101).expect("the expiry is due");
        assert!(due <= now);
        assert!(d.sync(&p, now, t0 + 101));
        assert!(d.cuts(&p).is_empty(), "steps [100]: back at once");
    }

    #[test]
    fn a_drain_that_empties_a_region_is_refused() {
        let p = policy();
        let mut d = Drains::default();
        d.add(&p, rule(2_000_000), 1_000_000).unwrap();
        let mut b = rule(2_000_000);
        b.cdn = "b".into();
        let e = d.add(&p, b, 1_000_000).unwrap_err();
        assert!(
            matches!(e, DrainError::EmptiesRegion(_)) && e.is_conflict(),
            "{e}"
        );
    }

    #[test]
    fn a_seventh_location_scope_is_refused_not_made_global() {
        // Before, the seventh scope was accepted and the planner applied it everywhere.
        let p = policy();
        let mut d = Drains::default();
        let scoped = |c: &str| {
            let mut r = rule(2_000_000);
            r.scope = vec![c.to_string()];
            r
        };
        let countries = ["GB", "FR", "DE", "JP", "US", "CA"];
        assert_eq!(countries.len(), MAX_DRAIN_SCOPES);
        for c in countries {
            d.add(&p, scoped(c), 1_000_000).unwrap();
        }
        let e = d.add(&p, scoped("AU"), 1_000_000).unwrap_err();
        assert!(
            matches!(
                e,
                DrainError::TooManyScopes {
                    scopes: 7,
                    max: 6,
                    ..
                }
            ) && e.is_conflict(),
            "{e}"
        );
        assert!(e.to_string().contains("at most 6"), "{e}");
        // A scope already in force, a region name, or everywhere: still accepted.
        d.add(&p, scoped("GB"), 1_000_000).unwrap();
        d.add(&p, scoped("default"), 1_000_000).unwrap();
        d.add(&p, rule(2_000_000), 1_000_000).unwrap();
    }

    fn stepped_policy() -> Policy {
        let text = "hostname: www.example.com\ncdns:\n  a: { cname: a.example.net. }\n  b: { cname: b.example.net. }\nregions:\n  - match: [\"*\"]\n    weights: { a: 1, b: 1 }\nfailover: { steps: [50, 100], step_interval_seconds: 60 }\n";
        crate::config::parse(Path::new("t.yaml"), text.to_string())
            .unwrap()
            .0
    }

    fn scoped(c: &str) -> DrainRule {
        let mut r = rule(2_000_000);
        r.scope = vec![c.to_string()];
        r
    }

    #[test]
    fn a_drain_stepping_back_still_counts_towards_the_scope_cap() {
        // Before, only the drains in force counted: removing one and adding another
        // within a step interval made seven scopes, and the seventh applied everywhere.
        let p = stepped_policy();
        let (now, t0) = (Instant::now(), 1_000_000);
        let mut d = Drains::default();
        let mut ids = Vec::new();
        for c in ["GB", "FR", "DE", "JP", "US", "CA"] {
            ids.push(d.add(&p, scoped(c), t0).unwrap().id);
        }
        d.sync(&p, now, t0);
        d.remove(&ids[0]).unwrap();
        d.sync(&p, now, t0);
        assert_eq!(d.cuts(&p).len(), 6, "GB steps back, still cutting");
        let e = d.add(&p, scoped("AU"), t0).unwrap_err();
        assert!(
            matches!(e, DrainError::TooManyScopes { scopes: 7, .. }),
            "{e}"
        );
    }

    #[test]
    fn an_override_over_the_cap_that_came_another_way_is_refused_and_shown() {
        // A set's overrides arrive from etcd straight into `overrides` (written by
        // another node, or by hand): the seventh scope cuts nothing anywhere.
        let p = stepped_policy();
        let (now, t0) = (Instant::now(), 1_000_000);
        let mut d = Drains::default();
        for (i, c) in ["GB", "FR", "DE", "JP", "US", "CA", "AU"]
            .iter()
            .enumerate()
        {
            let mut r = scoped(c);
            r.id = format!("x{i}");
            d.overrides.push(r);
        }
        d.sync(&p, now, t0);
        let cuts = d.cuts(&p);
        assert_eq!(cuts.len(), 6);
        assert!(cuts.iter().all(|c| !c.scope.is_empty()), "never everywhere");
        assert_eq!(d.refused(), 1);
        let report = d.report(&p, t0);
        let refused: Vec<_> = report
            .iter()
            .filter(|s| s.status == DrainState::Refused)
            .collect();
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].scope, ["AU"]);
        // Not due again and again (no busy loop on a refused drain).
        assert!(d
            .next_due(&p, now, t0)
            .is_none_or(|at| at > now + Duration::from_secs(1)));
    }
}
