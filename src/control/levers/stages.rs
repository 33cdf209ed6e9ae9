//! Control plane, the levers: the stages of a staged policy rollout, as asked
//! (`POST /v1/policy?stages=5,25,100&stage_seconds=300`) and as the set's `policy` key
//! holds them (`cluster/policy.rs`), and where a rollout is at an instant.

use serde::{Deserialize, Serialize};

/// The stages of a rollout, as asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stages {
    /// Percent of client networks per stage: rising, the last 100.
    pub stages: Vec<u8>,
    pub stage_seconds: u32,
}

/// At most this many stages.
pub(crate) const MAX_STAGES: usize = 10;
/// The longest stage: a day.
pub(crate) const MAX_STAGE_SECONDS: u32 = 86_400;

/// Why stages cannot run, or were not asked right.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadStages {
    #[error("stages: 1 to {MAX_STAGES} percents, as 5,25,100")]
    Count,
    #[error("stages: percents from 1 to 100, each above the one before")]
    Rising,
    #[error("stages: the last stage is 100 (every client gets the version)")]
    Last,
    #[error("stage_seconds: from 1 to {MAX_STAGE_SECONDS} (how long each stage lasts)")]
    Seconds,
    /// `?stages=` without `stage_seconds=`, or the other way round.
    #[error("stages and stage_seconds go together: ?stages=5,25,100&stage_seconds=300")]
    Alone,
    /// `?stages=` as asked.
    #[error("stages: {0:?} is not percents separated by commas, as 5,25,100")]
    NotPercents(String),
    /// `?stage_seconds=` as asked.
    #[error("stage_seconds: {0:?} is not a number of seconds")]
    NotSeconds(String),
}

impl Stages {
    /// Whether the stages can run: 1 to [`MAX_STAGES`] percents, each 1-100, rising,
    /// the last 100; 1 to [`MAX_STAGE_SECONDS`] seconds per stage.
    pub fn check(&self) -> Result<(), BadStages> {
        let s = &self.stages;
        if s.is_empty() || s.len() > MAX_STAGES {
            return Err(BadStages::Count);
        }
        if s.iter().any(|&p| p == 0 || p > 100) || s.windows(2).any(|w| w[0] >= w[1]) {
            return Err(BadStages::Rising);
        }
        if s.last() != Some(&100) {
            return Err(BadStages::Last);
        }
        if self.stage_seconds == 0 || self.stage_seconds > MAX_STAGE_SECONDS {
            return Err(BadStages::Seconds);
        }
        Ok(())
    }

    /// When the last stage starts, from the first's `start` (ms): the rollout is over.
    pub fn end_ms(&self, start: u64) -> u64 {
        let n = self.stages.len().saturating_sub(1) as u64;
        start.saturating_add(n * u64::from(self.stage_seconds) * 1000)
    }

    /// The stage at `now` of a rollout whose first stage starts at `start` (ms): its
    /// index, or `None` before the first.
    pub fn stage_at(&self, start: u64, now: u64) -> Option<usize> {
        let step = u64::from(self.stage_seconds).max(1) * 1000;
        let k = now.checked_sub(start)? / step;
        Some((k as usize).min(self.stages.len().saturating_sub(1)))
    }

    /// When the stage after the one at `now` starts (ms); `None` from the last on.
    pub fn next_ms(&self, start: u64, now: u64) -> Option<u64> {
        let step = u64::from(self.stage_seconds).max(1) * 1000;
        match self.stage_at(start, now) {
            None => Some(start),
            Some(k) if k + 1 < self.stages.len() => Some(start + (k as u64 + 1) * step),
            Some(_) => None,
        }
    }
}
