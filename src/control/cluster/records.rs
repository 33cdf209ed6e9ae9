//! Control plane, a set: the records the set shares through etcd (observations,
//! failover timelines, drains, freezes), and a timeline as a pure function of time.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::control::decide::drains::DrainRule;
use crate::control::decide::stepper::{Direction, Stepper};
use crate::control::decide::times;

/// One vantage point's latest result for one CDN, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedObservation {
    pub round: u64,
    pub ok: bool,
    pub reason: String,
    /// False while the writer cannot yet tell "this CDN fails" from "my network fails"
    /// (not every CDN probed since this failure began): it does not count yet.
    pub settled: bool,
}

/// One failover timeline of a (name, CDN), shared by the whole set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeline {
    pub direction: Direction,
    /// The level (0 = normal, n = `steps[n - 1]` removed) when it started.
    pub from_level: usize,
    /// When it started (Unix ms): the first step applies then, each next one a step
    /// interval later.
    #[serde(deserialize_with = "times::bounded")]
    pub start_unix_ms: u64,
    pub node: String,
    pub reason: String,
}

/// A drain override, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedDrain {
    pub rule: DrainRule,
    pub node: String,
    #[serde(deserialize_with = "times::bounded")]
    pub at_unix_ms: u64,
}

/// The operator's freeze, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Freeze {
    pub reason: String,
    pub node: String,
    #[serde(deserialize_with = "times::bounded")]
    pub at_unix_ms: u64,
}

impl Timeline {
    /// The level at `t` (Unix ms) and when the next step is due, for `top` steps of
    /// `interval_ms` each. Before its start (written by a node whose clock is ahead)
    /// it holds its starting level, and the first step is due at the start.
    pub fn at(&self, top: usize, interval_ms: u64, t: u64) -> (usize, Option<u64>) {
        let from = self.from_level.min(top);
        if t < self.start_unix_ms {
            let moves = match self.direction {
                Direction::Demote => from < top,
                Direction::Promote => from > 0,
            };
            return (from, moves.then_some(self.start_unix_ms));
        }
        let interval = interval_ms.max(1);
        let k = (t - self.start_unix_ms) / interval;
        let taken = usize::try_from(k).unwrap_or(usize::MAX).saturating_add(1);
        let next = self.start_unix_ms + (k + 1) * interval;
        match self.direction {
            Direction::Demote => {
                let level = from.saturating_add(taken).min(top);
                (level, (level < top).then_some(next))
            }
            Direction::Promote => {
                let level = from.saturating_sub(taken);
                (level, (level > 0).then_some(next))
            }
        }
    }

    /// The start as this node schedules it: a start further ahead of `t` than one
    /// step interval (a writer's clock far ahead) is brought back to `t + interval`.
    /// `Some` when clamped.
    pub fn clamp(&mut self, interval_ms: u64, t: u64) -> Option<u64> {
        let latest = t.saturating_add(interval_ms);
        (self.start_unix_ms > latest).then(|| std::mem::replace(&mut self.start_unix_ms, latest))
    }

    /// The stepper for this timeline, as of `t` (Unix ms) and the monotonic `now`.
    pub fn stepper(&self, top: usize, interval_ms: u64, t: u64, now: Instant) -> Stepper {
        let (level, next) = self.at(top, interval_ms, t);
        Stepper {
            level,
            direction: self.direction,
            next_at: next.map(|ms| now + Duration::from_millis(ms.saturating_sub(t))),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::control::cluster) fn tl(direction: Direction, from_level: usize) -> Timeline {
        Timeline {
            direction,
            from_level,
            start_unix_ms: 10_000,
            node: "ns1".into(),
            reason: "test".into(),
        }
    }

    #[test]
    fn a_demotion_takes_its_first_step_at_once_then_one_per_interval() {
        let t = tl(Direction::Demote, 0);
        assert_eq!(t.at(2, 1000, 9_999), (0, Some(10_000)));
        assert_eq!(t.at(2, 1000, 10_000), (1, Some(11_000)));
        assert_eq!(t.at(2, 1000, 10_999), (1, Some(11_000)));
        assert_eq!(t.at(2, 1000, 11_000), (2, None));
        assert_eq!(t.at(2, 1000, 99_000), (2, None));
    }

    #[test]
    fn a_promotion_comes_back_down_from_where_it_started() {
        let t = tl(Direction::Promote, 2);
        assert_eq!(t.at(2, 1000, 10_000), (1, Some(11_000)));
        assert_eq!(t.at(2, 1000, 11_500), (0, None));
        assert_eq!(tl(Direction::Promote, 0).at(2, 1000, 10_000), (0, None));
    }

    #[test]
    fn every_node_derives_the_same_stepper() {
        let t = tl(Direction::Demote, 0);
        let now = Instant::now();
        let a = t.stepper(3, 1000, 10_400, now);
        assert_eq!(a.level, 1);
        assert_eq!(a.next_at, Some(now + Duration::from_millis(600)));
    }

    #[test]
    fn a_timeline_ahead_of_this_clock_is_due_at_its_start() {
        // Before, a timeline seen before its start was never scheduled.
        let t = tl(Direction::Demote, 0);
        assert_eq!(t.at(2, 1000, 9_990), (0, Some(10_000)));
        let now = Instant::now();
        let s = t.stepper(2, 1000, 9_990, now);
        assert_eq!(s.next_at, Some(now + Duration::from_millis(10)));
        assert_eq!(
            tl(Direction::Promote, 2).at(2, 1000, 9_000),
            (2, Some(10_000))
        );
        assert_eq!(tl(Direction::Promote, 0).at(2, 1000, 9_000), (0, None));
        // Further ahead than a step interval: brought back to one interval.
        let mut far = tl(Direction::Demote, 0);
        assert_eq!(far.clamp(1000, 5_000), Some(10_000));
        assert_eq!(far.start_unix_ms, 6_000);
        assert_eq!(far.clamp(1000, 5_000), None);
    }
}
