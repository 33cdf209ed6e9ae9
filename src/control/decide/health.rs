//! Control plane: health. Turns what every vantage point observed into a state per CDN:
//! first a *round verdict* by quorum, then *hysteresis* (`down_after` consecutive down
//! verdicts mark a CDN down, `up_after` consecutive up verdicts mark it up again).
//!
//! Pure: no I/O, no clock (times are passed in), so every rule is unit-tested here.
//!
//! A vantage point that is stale or that sees *every* CDN fail at once is "unhappy": a
//! probe is unhappy, not the CDNs. Its failures never count towards a quorum, so a
//! broken network at one probe location cannot take a CDN out of service.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// One probe result: what one vantage point saw of one CDN in one round.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// Round number at that vantage point for that CDN (increasing).
    pub round: u64,
    pub ok: bool,
    /// `ok`, `timeout`, `connect: …`, `tls: …`, `status 503`, `body mismatch`, `slow: …`.
    pub reason: String,
    /// How old the result was when it was read (set by whoever hands it over).
    pub age_ms: u64,
}

/// The latest results of one vantage point, as seen now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VantageView {
    pub name: String,
    /// Latest observation per CDN.
    pub latest: BTreeMap<String, Observation>,
    /// Set when the vantage point could not be read at all (unreachable, garbage).
    pub error: Option<String>,
    /// This instance has not yet probed every CDN (since the CDN being judged began
    /// failing): "every CDN fails" cannot be told apart from "this CDN fails" yet.
    pub warming_up: bool,
}

/// Why a vantage point's failures do not count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Unhappy {
    /// No result for this CDN, or one older than the freshness limit.
    Stale,
    /// Could not be read.
    Unreachable(String),
    /// Every CDN it probes failed in its latest round: its own network is the suspect.
    AllFailing,
    /// Has not probed every CDN yet.
    WarmingUp,
}

impl fmt::Display for Unhappy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unhappy::Stale => f.write_str("stale"),
            Unhappy::Unreachable(e) => write!(f, "unreachable: {e}"),
            Unhappy::AllFailing => f.write_str("sees every CDN fail at once"),
            Unhappy::WarmingUp => {
                f.write_str("waiting: not every CDN probed yet (since this failure began)")
            }
        }
    }
}

/// What one vantage point contributes to a verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Evidence {
    Ok,
    Failed(String),
    Unhappy(Unhappy),
}

/// The verdict of one round for one CDN, with the evidence of every vantage point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub kind: VerdictKind,
    pub evidence: Vec<(String, Evidence)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerdictKind {
    /// At least `quorum` fresh, happy vantage points saw it fail.
    Down,
    /// Some fresh, happy vantage point saw it, and not enough saw it fail.
    Up,
    /// No fresh, happy vantage point: no evidence either way.
    Unknown,
}

impl Verdict {
    /// `fastly: failed (status 503); ns2: ok; agent3: unhappy (stale)`.
    pub(crate) fn summary(&self) -> String {
        self.evidence
            .iter()
            .map(|(v, e)| match e {
                Evidence::Ok => format!("{v}: ok"),
                Evidence::Failed(r) => format!("{v}: failed ({r})"),
                Evidence::Unhappy(u) => format!("{v}: unhappy ({u})"),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Whether a vantage point is unhappy overall (for every CDN), given its latest round.
pub(crate) fn unhappy(view: &VantageView) -> Option<Unhappy> {
    if let Some(e) = &view.error {
        return Some(Unhappy::Unreachable(e.clone()));
    }
    // With a single probed CDN, "everything fails" cannot be told from "that CDN fails".
    // Checked before warming up: a vantage point that sees everything fail says so,
    // rather than turning "happy" each time a round counts as warming up (which the
    // controller does not report).
    if view.latest.len() >= 2 && view.latest.values().all(|o| !o.ok) {
        return Some(Unhappy::AllFailing);
    }
    if view.warming_up {
        return Some(Unhappy::WarmingUp);
    }
    None
}

/// The round verdict for `cdn`: down when at least `quorum` fresh, happy vantage points
/// saw it fail. `fresh_ms` is the age past which a result is stale.
pub(crate) fn verdict(cdn: &str, views: &[VantageView], quorum: u32, fresh_ms: u64) -> Verdict {
    let mut evidence = Vec::with_capacity(views.len());
    let (mut failed, mut seen) = (0u32, 0u32);
    for view in views {
        let e = match (unhappy(view), view.latest.get(cdn)) {
            (Some(u), _) => Evidence::Unhappy(u),
            (None, None) => Evidence::Unhappy(Unhappy::Stale),
            (None, Some(o)) if o.age_ms > fresh_ms => Evidence::Unhappy(Unhappy::Stale),
            (None, Some(o)) if o.ok => {
                seen += 1;
                Evidence::Ok
            }
            (None, Some(o)) => {
                seen += 1;
                failed += 1;
                Evidence::Failed(o.reason.clone())
            }
        };
        evidence.push((view.name.clone(), e));
    }
    let kind = if failed >= quorum.max(1) {
        VerdictKind::Down
    } else if seen > 0 {
        VerdictKind::Up
    } else {
        VerdictKind::Unknown
    };
    Verdict { kind, evidence }
}

/// Health of one CDN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Up,
    Down,
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            State::Up => "up",
            State::Down => "down",
        })
    }
}

/// Hysteresis over round verdicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tracker {
    pub state: State,
    /// Consecutive down verdicts while up.
    pub bad: u32,
    /// Consecutive up verdicts while down.
    pub good: u32,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker {
            state: State::Up,
            bad: 0,
            good: 0,
        }
    }
}

impl Tracker {
    /// Feeds one round verdict; returns the new state when it changed.
    pub fn observe(
        &mut self,
        verdict: VerdictKind,
        down_after: u32,
        up_after: u32,
    ) -> Option<State> {
        match (self.state, verdict) {
            (_, VerdictKind::Unknown) => None,
            (State::Up, VerdictKind::Down) => {
                self.bad += 1;
                (self.bad >= down_after.max(1)).then(|| self.flip(State::Down))
            }
            (State::Up, VerdictKind::Up) => {
                self.bad = 0;
                None
            }
            (State::Down, VerdictKind::Up) => {
                self.good += 1;
                (self.good >= up_after.max(1)).then(|| self.flip(State::Up))
            }
            (State::Down, VerdictKind::Down) => {
                self.good = 0;
                None
            }
        }
    }

    fn flip(&mut self, to: State) -> State {
        *self = Tracker {
            state: to,
            bad: 0,
            good: 0,
        };
        to
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(ok: bool) -> Observation {
        Observation {
            round: 1,
            ok,
            reason: if ok { "ok".into() } else { "status 503".into() },
            age_ms: 0,
        }
    }

    fn view(name: &str, results: &[(&str, bool)]) -> VantageView {
        VantageView {
            name: name.into(),
            latest: results
                .iter()
                .map(|&(c, ok)| (c.to_string(), obs(ok)))
                .collect(),
            error: None,
            warming_up: false,
        }
    }

    #[test]
    fn seeing_everything_fail_is_reported_as_such_even_while_warming_up() {
        let mut v = view("v0", &[("a", false), ("b", false)]);
        v.warming_up = true;
        assert_eq!(unhappy(&v), Some(Unhappy::AllFailing));
        let mut v = view("v0", &[("a", false), ("b", true)]);
        v.warming_up = true;
        assert_eq!(unhappy(&v), Some(Unhappy::WarmingUp));
        v.warming_up = false;
        assert_eq!(unhappy(&v), None);
    }

    #[test]
    fn quorum_counts_fresh_failures() {
        let views: Vec<_> = (0..5)
            .map(|i| view(&format!("v{i}"), &[("a", i >= 2), ("b", true)]))
            .collect();
        // v0 and v1 see `a` fail.
        assert_eq!(verdict("a", &views, 3, 1000).kind, VerdictKind::Up);
        assert_eq!(verdict("a", &views, 2, 1000).kind, VerdictKind::Down);
        let mut views = views;
        views[2] = view("v2", &[("a", false), ("b", true)]);
        let v = verdict("a", &views, 3, 1000);
        assert_eq!(v.kind, VerdictKind::Down);
        assert!(
            v.summary().contains("v0: failed (status 503)"),
            "{}",
            v.summary()
        );
    }

    #[test]
    fn unhappy_vantage_points_never_count() {
        // Sees every CDN fail: its own network is broken.
        let all_fail = view("broken", &[("a", false), ("b", false)]);
        let v = verdict("a", std::slice::from_ref(&all_fail), 1, 1000);
        assert_eq!(v.kind, VerdictKind::Unknown);
        assert_eq!(v.evidence[0].1, Evidence::Unhappy(Unhappy::AllFailing));

        // Stale results.
        let mut stale = view("old", &[("a", false), ("b", true)]);
        stale.latest.get_mut("a").unwrap().age_ms = 5_000;
        assert_eq!(verdict("a", &[stale], 1, 1000).kind, VerdictKind::Unknown);

        // Unreachable.
        let mut gone = view("gone", &[]);
        gone.error = Some("connection refused".into());
        assert_eq!(
            verdict("a", std::slice::from_ref(&gone), 1, 1000).kind,
            VerdictKind::Unknown
        );

        // A healthy vantage point still decides alone.
        let good = view("good", &[("a", false), ("b", true)]);
        assert_eq!(
            verdict("a", &[all_fail, gone, good], 1, 1000).kind,
            VerdictKind::Down
        );
    }

    #[test]
    fn a_single_probed_cdn_can_fail() {
        assert_eq!(
            verdict("a", &[view("v", &[("a", false)])], 1, 1000).kind,
            VerdictKind::Down
        );
    }

    #[test]
    fn hysteresis_fails_fast_and_recovers_slow() {
        let mut t = Tracker::default();
        assert_eq!(t.observe(VerdictKind::Down, 2, 3), None);
        assert_eq!(t.observe(VerdictKind::Down, 2, 3), Some(State::Down));
        assert_eq!(t.observe(VerdictKind::Up, 2, 3), None);
        assert_eq!(t.observe(VerdictKind::Up, 2, 3), None);
        assert_eq!(t.observe(VerdictKind::Unknown, 2, 3), None);
        assert_eq!(t.observe(VerdictKind::Up, 2, 3), Some(State::Up));
    }

    #[test]
    fn flapping_never_moves() {
        let mut t = Tracker::default();
        for i in 0..50 {
            let v = if i % 2 == 0 {
                VerdictKind::Down
            } else {
                VerdictKind::Up
            };
            assert_eq!(t.observe(v, 2, 10), None, "round {i}");
        }
        assert_eq!(t.state, State::Up);
    }
}
