//! Control plane: the failover state, pure. Health per CDN (hysteresis over verdicts),
//! the failover timeline of every (steered name, CDN), and the operator's freeze (of
//! every name, or of a tenant's names); what
//! the planner reads as "how far is each CDN off its weight" ([`FailoverState::removed`]).
//!
//! ```text
//!  verdict ─▶ Tracker (down_after / up_after) ─▶ health change ─▶ the set's timeline
//!                                        (ClusterLink::propose; none while frozen)
//!  the set's view ─▶ Stepper per (name, CDN) (ClusterLink::on_shared) ─┐
//!  time ─────────────────────────────────────────────────▶ tick ───────┘
//! ```
//!
//! No I/O, no logging, no clock: every call takes `now`, and returns what changed so
//! that the controller (`controller/rounds.rs`) logs it, counts it and publishes a new plan.

use std::collections::BTreeMap;

use tokio::time::Instant;

use crate::config::probes::Probes;
use crate::config::{HostPolicy, Policy};
use crate::control::decide::health::{State, Tracker, VerdictKind};
use crate::control::decide::keys::NameCdn;
use crate::control::decide::planner::Removed;
use crate::control::decide::stepper::{Direction, Stepper};

/// Health, steps and freeze: everything that moves weight away from a CDN on its own.
#[derive(Clone, Debug, Default)]
pub struct FailoverState {
    /// Per probed CDN.
    pub health: BTreeMap<String, Tracker>,
    /// Per (steered name, CDN) on its timeline; forgotten when back at normal weight.
    pub steps: BTreeMap<NameCdn, Stepper>,
    /// Why automatic failover is frozen: health is still tracked, no step is taken.
    pub frozen: Option<String>,
    /// Tenants whose names' failover is frozen, with why: the other names go on.
    pub frozen_tenants: BTreeMap<String, String>,
}

/// A CDN's health changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub cdn: String,
    pub from: State,
    pub to: State,
    /// The steps it started: (name, percent removed now). Empty while frozen.
    pub steps: Vec<(String, u8)>,
}

/// Where a resume turns the timeline of a (name, CDN) ([`FailoverState::turns`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    pub name: String,
    pub cdn: String,
    pub direction: Direction,
    /// The level it starts from (0: normal weight).
    pub from_level: usize,
}

/// A step taken by time: (name, CDN, percent removed now).
pub(crate) type Step = (String, String, u8);

impl FailoverState {
    /// Records a round's verdict for `cdn` in its health alone, starting no step: the
    /// steps come from the set's timelines (`ClusterLink::propose` writes them, on one
    /// node as in a set). Returns the change.
    pub fn track(
        &mut self,
        cdn: &str,
        verdict: VerdictKind,
        down_after: u32,
        up_after: u32,
    ) -> Option<Transition> {
        let tracker = self.health.entry(cdn.to_string()).or_default();
        let from = tracker.state;
        let to = tracker.observe(verdict, down_after, up_after)?;
        Some(Transition {
            cdn: cdn.to_string(),
            from,
            to,
            steps: Vec::new(),
        })
    }

    /// Applies every step due by `now` (none while frozen); returns the steps taken.
    pub fn tick(&mut self, policy: &Policy, now: Instant) -> Vec<Step> {
        let mut taken = Vec::new();
        if self.frozen.is_some() {
            return taken;
        }
        let hosts: Vec<&HostPolicy> = policy.hosts.iter().filter(|h| !self.held(h)).collect();
        for host in hosts {
            for cdn in &host.cdns {
                let key = NameCdn::new(host.name.to_string(), cdn.name.clone());
                if let Some(s) = self.steps.get_mut(&key) {
                    if s.tick(now, &host.failover) {
                        taken.push((key.name, key.cdn, s.removed_percent(&host.failover)));
                    }
                }
            }
        }
        self.steps.retain(|_, s| s.is_active());
        taken
    }

    /// When the next step is due (never while frozen, nor for a frozen tenant's names).
    pub fn next_due(&self, policy: &Policy) -> Option<Instant> {
        if self.frozen.is_some() {
            return None;
        }
        policy
            .hosts
            .iter()
            .filter(|h| !self.held(h))
            .flat_map(|h| {
                h.cdns
                    .iter()
                    .map(|c| NameCdn::new(h.name.to_string(), c.name.clone()))
            })
            .filter_map(|key| self.steps.get(&key)?.next_at)
            .min()
    }

    /// Whether `host`'s steps are held by the freeze of its tenant.
    pub fn held(&self, host: &HostPolicy) -> bool {
        host.tenant
            .as_ref()
            .is_some_and(|t| self.frozen_tenants.contains_key(t))
    }

    /// Where a resume (of `tenant`'s names, else of every name not held by its
    /// tenant's freeze) turns each timeline: toward what the health says. Every
    /// (name, CDN) off its normal weight or down, with the level it starts from: the
    /// timelines a resume writes to the set's store.
    pub fn turns(&self, policy: &Policy, tenant: Option<&str>) -> Vec<Turn> {
        let mut turns = Vec::new();
        let hosts = policy.hosts.iter().filter(|h| match tenant {
            Some(t) => h.tenant.as_deref() == Some(t),
            None => !self.held(h),
        });
        for host in hosts {
            for cdn in &host.cdns {
                let name = host.name.to_string();
                let down = self
                    .health
                    .get(&cdn.name)
                    .is_some_and(|t| t.state == State::Down);
                let from_level = self
                    .steps
                    .get(&NameCdn::new(name.clone(), cdn.name.clone()))
                    .map_or(0, |s| s.level);
                if from_level == 0 && !down {
                    continue;
                }
                turns.push(Turn {
                    name,
                    cdn: cdn.name.clone(),
                    direction: if down {
                        Direction::Demote
                    } else {
                        Direction::Promote
                    },
                    from_level,
                });
            }
        }
        turns
    }

    /// Forgets the health of CDNs no longer probed and the steps of names no longer
    /// steered (after a reload).
    pub fn retain_known(&mut self, policy: &Policy, probes: &Probes) {
        self.health.retain(|cdn, _| probes.get(cdn).is_some());
        let names: Vec<String> = policy.hosts.iter().map(|h| h.name.to_string()).collect();
        self.steps.retain(|key, _| names.contains(&key.name));
    }

    /// Percent of each CDN's share moved away, for the planner.
    pub fn removed(&self, policy: &Policy) -> Removed {
        let mut removed = Removed::new();
        for host in &policy.hosts {
            for cdn in &host.cdns {
                let key = NameCdn::new(host.name.to_string(), cdn.name.clone());
                if let Some(s) = self.steps.get(&key) {
                    removed.insert(key, s.removed_percent(&host.failover));
                }
            }
        }
        removed
    }

    /// The CDNs marked down.
    pub fn down(&self) -> Vec<&str> {
        self.health
            .iter()
            .filter(|(_, t)| t.state == State::Down)
            .map(|(c, _)| c.as_str())
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::Path;
    use std::time::Duration;

    /// One name, CDNs a (90) and b (10) everywhere, steps [50, 100] every 90 s.
    pub(crate) const POLICY: &str = "\
hostname: www.example.com
cdns:
  a: { cname: a.example.net. }
  b: { cname: b.example.net. }
regions:
  - match: [\"*\"]
    weights: { a: 90, b: 10 }
failover:
  steps: [50, 100]
  step_interval_seconds: 90
";

    fn policy() -> Policy {
        crate::config::parse(Path::new("t.yaml"), POLICY.into())
            .unwrap()
            .0
    }

    fn removed(f: &FailoverState, p: &Policy) -> Option<u8> {
        f.removed(p)
            .get(&NameCdn::new("www.example.com.", "a"))
            .copied()
    }

    /// `a` down (tracked) and its timeline started at `t0`, as the set's view gives it.
    fn demoted(p: &Policy, t0: Instant) -> FailoverState {
        let mut f = FailoverState::default();
        let t = f.track("a", VerdictKind::Down, 1, 1).expect("down after 1");
        assert_eq!((t.from, t.to, t.steps), (State::Up, State::Down, vec![]));
        let mut s = Stepper::default();
        s.demote(t0, &p.hosts[0].failover);
        f.steps.insert(NameCdn::new("www.example.com.", "a"), s);
        f
    }

    #[test]
    fn a_health_change_starts_no_step_and_steps_come_due_in_time() {
        let p = policy();
        let t0 = Instant::now();
        let mut f = FailoverState::default();
        assert_eq!(f.track("a", VerdictKind::Down, 2, 3), None, "one bad round");
        assert!(f.steps.is_empty(), "tracking takes no step");
        let mut f = demoted(&p, t0);
        assert_eq!(removed(&f, &p), Some(50));
        assert_eq!(f.next_due(&p), Some(t0 + Duration::from_secs(90)));
        assert!(f.tick(&p, t0 + Duration::from_secs(89)).is_empty());
        let taken = f.tick(&p, t0 + Duration::from_secs(90));
        assert_eq!(taken, vec![("www.example.com.".into(), "a".into(), 100)]);
        assert_eq!(f.down(), vec!["a"]);
    }

    #[test]
    fn a_freeze_holds_the_steps_and_a_resume_turns_them_toward_health() {
        let p = policy();
        let t0 = Instant::now();
        let mut f = demoted(&p, t0);
        f.frozen = Some("maintenance".into());
        assert_eq!(f.next_due(&p), None);
        assert!(f.tick(&p, t0 + Duration::from_secs(500)).is_empty());
        assert_eq!(removed(&f, &p), Some(50), "held where it stood");
        let turns = f.turns(&p, None);
        assert_eq!(
            turns,
            vec![Turn {
                name: "www.example.com.".into(),
                cdn: "a".into(),
                direction: Direction::Demote,
                from_level: 1,
            }]
        );
        f.health.get_mut("a").unwrap().state = State::Up;
        assert_eq!(f.turns(&p, None)[0].direction, Direction::Promote);
    }

    #[test]
    fn a_reload_forgets_what_is_no_longer_probed_or_steered() {
        let p = policy();
        let t0 = Instant::now();
        let mut f = demoted(&p, t0);
        f.retain_known(&p, &Probes::default());
        assert!(f.health.is_empty());
        assert_eq!(
            removed(&f, &p),
            Some(50),
            "steps stay while the name is steered"
        );
        let other = crate::config::parse(
            Path::new("t.yaml"),
            POLICY.replace("www.example.com", "cdn.example.com"),
        )
        .unwrap()
        .0;
        f.retain_known(&other, &Probes::default());
        assert!(f.steps.is_empty());
    }
}
