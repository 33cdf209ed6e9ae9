//! Control plane, pure: `Drains`, every drain in force or stepping back (from the
//! policy and the API) and its progress, synced against the policy.
//! (The main room of its folder; the folder's door, `mod.rs`, says what else lives there.)

use super::*;
use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::config::{DrainScope, Policy, MAX_DRAIN_SCOPES};
use crate::control::decide::planner::DrainCut;
use crate::control::decide::stepper::{Direction, Stepper};

use super::report::scope_text;

/// A drain's progress: its stepper and the rule (kept while it steps back after the
/// rule ended).
#[derive(Clone, Debug)]
pub(super) struct Draining {
    pub(super) rule: DrainRule,
    pub(super) stepper: Stepper,
    /// The rule is in force (not removed, not expired).
    pub(super) active: bool,
}

/// Every drain in force or stepping back, and the runtime overrides.
#[derive(Clone, Debug, Default)]
pub struct Drains {
    /// Added over the API; persisted.
    pub overrides: Vec<DrainRule>,
    pub(super) next_id: u64,
    pub(super) steps: BTreeMap<DrainKey, Draining>,
    /// Drains in force that [`Drains::admit`] refused when they came (a reload, or a
    /// set's override written by another node or by hand): they cut nothing.
    pub(super) refused: BTreeMap<DrainKey, (DrainRule, String)>,
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
                    id: d.rule.id.clone(),
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
    pub(super) fn check_scopes(
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
                next_in_ms: d.stepper.next_in_ms(now),
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
            let stepper = Stepper::restored(s.level, s.direction, s.next_in_ms, now, away_ms);
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
