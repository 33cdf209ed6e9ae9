//! Control plane: health and failover progress saved across restarts, so that a restart
//! in the middle of a failover resumes the timeline instead of snapping back to the
//! configured weights. The file is replaced atomically (write, fsync, rename); a state
//! older than the configured maximum age is ignored.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::control::drains::{DrainRule, SavedDrain};
use crate::control::health::Tracker;
use crate::control::stepper::{Direction, Stepper};

const FILE: &str = "steerdns-state.json";

/// The saved state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Saved {
    /// Wall-clock time of the save, milliseconds since the Unix epoch.
    pub saved_unix_ms: u64,
    pub health: BTreeMap<String, Tracker>,
    pub steps: Vec<SavedStep>,
    /// Runtime drain overrides from the admin API.
    #[serde(default)]
    pub overrides: Vec<DrainRule>,
    /// Progress of every drain.
    #[serde(default)]
    pub drains: Vec<SavedDrain>,
    /// Why automatic failover is frozen, when it is.
    #[serde(default)]
    pub frozen: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedStep {
    pub name: String,
    pub cdn: String,
    pub level: usize,
    pub direction: Direction,
    /// Time left to the next step when saved.
    pub next_in_ms: Option<u64>,
}

pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Captures the state now.
pub fn capture(
    health: &BTreeMap<String, Tracker>,
    steps: &BTreeMap<(String, String), Stepper>,
    now: Instant,
) -> Saved {
    Saved {
        saved_unix_ms: unix_ms(),
        health: health.clone(),
        steps: steps
            .iter()
            .filter(|(_, s)| s.is_active())
            .map(|((name, cdn), s)| SavedStep {
                name: name.clone(),
                cdn: cdn.clone(),
                level: s.level,
                direction: s.direction,
                next_in_ms: s
                    .next_at
                    .map(|at| at.saturating_duration_since(now).as_millis() as u64),
            })
            .collect(),
        overrides: Vec::new(),
        drains: Vec::new(),
        frozen: None,
    }
}

/// Writes the state atomically.
pub fn save(dir: &Path, saved: &Saved) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    // A name of its own per write: two writers (a restart overlapping the old process)
    // must never interleave in one temporary file.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!("{FILE}.{}.{n}.tmp", std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(saved).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path(dir))
}

/// Reads the state back; `Ok(None)` when there is none or it is older than `max_age`.
pub fn load(dir: &Path, max_age: Duration) -> Result<Option<Saved>, String> {
    let text = match std::fs::read(path(dir)) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path(dir).display())),
    };
    let saved: Saved =
        serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path(dir).display()))?;
    let age = unix_ms().saturating_sub(saved.saved_unix_ms);
    if age > max_age.as_millis() as u64 {
        return Ok(None);
    }
    Ok(Some(saved))
}

impl Saved {
    /// Milliseconds since the save.
    pub fn age_ms(&self) -> u64 {
        unix_ms().saturating_sub(self.saved_unix_ms)
    }

    /// The steppers, with their next step as far in the future as it was left, minus
    /// the time the process was away.
    pub fn steppers(&self, now: Instant) -> BTreeMap<(String, String), Stepper> {
        let away = self.age_ms();
        self.steps
            .iter()
            .map(|s| {
                let stepper = Stepper {
                    level: s.level,
                    direction: s.direction,
                    next_at: s
                        .next_in_ms
                        .map(|ms| now + Duration::from_millis(ms.saturating_sub(away))),
                };
                ((s.name.clone(), s.cdn.clone()), stepper)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::health::State;

    #[test]
    fn round_trip_and_max_age() {
        let dir = std::env::temp_dir().join(format!("steerdns-persist-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let now = Instant::now();
        let mut health = BTreeMap::new();
        health.insert(
            "a".to_string(),
            Tracker {
                state: State::Down,
                bad: 0,
                good: 3,
            },
        );
        let mut steps = BTreeMap::new();
        steps.insert(
            ("www.example.com.".to_string(), "a".to_string()),
            Stepper {
                level: 1,
                direction: Direction::Demote,
                next_at: Some(now + Duration::from_secs(60)),
            },
        );
        save(&dir, &capture(&health, &steps, now)).unwrap();
        let back = load(&dir, Duration::from_secs(60)).unwrap().unwrap();
        assert_eq!(back.health, health);
        let s = back.steppers(now)[&("www.example.com.".to_string(), "a".to_string())];
        assert_eq!((s.level, s.direction), (1, Direction::Demote));
        assert!(s.next_at.unwrap() <= now + Duration::from_secs(60));

        let mut old = back.clone();
        old.saved_unix_ms -= 120_000;
        save(&dir, &old).unwrap();
        assert_eq!(load(&dir, Duration::from_secs(60)).unwrap(), None);

        std::fs::write(path(&dir), b"{ half a fi").unwrap();
        assert!(load(&dir, Duration::from_secs(60)).is_err());
    }
}
