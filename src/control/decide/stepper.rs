//! Control plane: the failover stepper. When a CDN is marked down its weight is taken
//! away in the configured steps (`failover.steps`, percent removed), one step per
//! `step_interval`; when it is marked up it gets the weight back in the same steps in
//! reverse. Pure: the time is passed in.
//!
//! ```text
//!  marked down ─▶ 50 % removed ──90 s──▶ 100 % removed
//!  marked up   ─▶ 50 % removed ──90 s──▶ 0 % removed (normal)
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::config::Failover;

/// Where a CDN stands on its failover timeline, for one steered name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stepper {
    /// 0 = normal weight; `n` = `steps[n - 1]` percent removed.
    pub level: usize,
    pub direction: Direction,
    /// When the next step is due (while moving).
    pub next_at: Option<Instant>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// At the normal weight, or on the way back to it.
    #[default]
    Promote,
    /// Being taken out.
    Demote,
}

impl Stepper {
    /// A stepper as saved (`level`, `direction`, its next step `next_in_ms` ahead when
    /// saved), its next step as far ahead as it was left, less `away_ms` (the time the
    /// process was away).
    pub fn restored(
        level: usize,
        direction: Direction,
        next_in_ms: Option<u64>,
        now: Instant,
        away_ms: u64,
    ) -> Stepper {
        Stepper {
            level,
            direction,
            next_at: next_in_ms.map(|ms| now + Duration::from_millis(ms.saturating_sub(away_ms))),
        }
    }

    /// How far ahead of `now` the next step is, in ms, as saved (see [`Stepper::restored`]).
    pub fn next_in_ms(&self, now: Instant) -> Option<u64> {
        self.next_at
            .map(|at| at.saturating_duration_since(now).as_millis() as u64)
    }

    /// The CDN was marked down: the first step applies at once.
    pub fn demote(&mut self, now: Instant, failover: &Failover) {
        self.direction = Direction::Demote;
        self.next_at = Some(now);
        self.tick(now, failover);
    }

    /// The CDN was marked up: the first step back applies at once.
    pub fn promote(&mut self, now: Instant, failover: &Failover) {
        self.direction = Direction::Promote;
        self.next_at = Some(now);
        self.tick(now, failover);
    }

    /// Applies every step due by `now`; returns whether the level changed.
    pub fn tick(&mut self, now: Instant, failover: &Failover) -> bool {
        let top = failover.steps.len();
        let before = self.level;
        while let Some(at) = self.next_at.filter(|&at| at <= now) {
            match self.direction {
                Direction::Demote if self.level < top => self.level += 1,
                Direction::Promote if self.level > 0 => self.level -= 1,
                _ => {}
            }
            let done = match self.direction {
                Direction::Demote => self.level >= top,
                Direction::Promote => self.level == 0,
            };
            self.next_at =
                (!done).then(|| at + failover.step_interval.max(Duration::from_millis(1)));
        }
        self.level != before
    }

    /// Percent of the configured weight removed now.
    pub fn removed_percent(&self, failover: &Failover) -> u8 {
        match self.level {
            0 => 0,
            n => failover.steps.get(n - 1).copied().unwrap_or(100),
        }
    }

    /// Off its normal weight, or moving.
    pub fn is_active(&self) -> bool {
        self.level > 0 || self.next_at.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failover() -> Failover {
        Failover {
            steps: vec![50, 100],
            step_interval: Duration::from_secs(90),
        }
    }

    #[test]
    fn demotes_then_promotes_in_steps() {
        let f = failover();
        let t0 = Instant::now();
        let mut s = Stepper::default();
        s.demote(t0, &f);
        assert_eq!(s.removed_percent(&f), 50);
        assert!(!s.tick(t0 + Duration::from_secs(89), &f));
        assert!(s.tick(t0 + Duration::from_secs(90), &f));
        assert_eq!(s.removed_percent(&f), 100);
        assert_eq!(s.next_at, None);
        assert!(!s.tick(t0 + Duration::from_secs(900), &f));

        let t1 = t0 + Duration::from_secs(1000);
        s.promote(t1, &f);
        assert_eq!(s.removed_percent(&f), 50);
        assert!(s.tick(t1 + Duration::from_secs(90), &f));
        assert_eq!(s.removed_percent(&f), 0);
        assert!(!s.is_active());
    }

    #[test]
    fn a_late_tick_catches_up() {
        let f = Failover {
            steps: vec![25, 50, 100],
            step_interval: Duration::from_secs(10),
        };
        let t0 = Instant::now();
        let mut s = Stepper::default();
        s.demote(t0, &f);
        assert!(s.tick(t0 + Duration::from_secs(25), &f));
        assert_eq!(s.removed_percent(&f), 100);
    }

    #[test]
    fn recovery_midway_turns_back_from_where_it_is() {
        let f = failover();
        let t0 = Instant::now();
        let mut s = Stepper::default();
        s.demote(t0, &f);
        s.promote(t0 + Duration::from_secs(10), &f);
        assert_eq!(s.removed_percent(&f), 0);
        assert!(!s.is_active());
    }

    #[test]
    fn a_single_step_moves_everything_at_once() {
        let f = Failover {
            steps: vec![100],
            step_interval: Duration::from_secs(90),
        };
        let mut s = Stepper::default();
        s.demote(Instant::now(), &f);
        assert_eq!(s.removed_percent(&f), 100);
    }
}
