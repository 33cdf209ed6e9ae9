//! Control plane: health and failover progress saved across restarts, so that a restart
//! in the middle of a failover resumes the timeline instead of snapping back to the
//! configured weights. The file is replaced atomically and durably (write, fsync,
//! rename, fsync of the directory, so that the rename itself survives a power cut); a
//! state older than the configured maximum age is ignored. Temporary files a crash left
//! behind (`steerdns-state.json.<pid>.<n>.tmp` of a process no longer running) are
//! removed at startup.
//!
//! Faults: a save that fails (unwritable directory, a directory where the file should
//! be, a full disk) leaves the previous file as it was and no temporary file behind;
//! the caller counts it and retries. A file that cannot be parsed at startup is set
//! aside (`steerdns-state.json.corrupt-<unix ms>`) for a person to look at, and the
//! server starts from the configured weights rather than refusing to serve.
//! Only names built here are written: nothing read from the network becomes a path.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::control::decide::drains::Drains;
use crate::control::decide::drains::{DrainRule, SavedDrain};
use crate::control::decide::failover::FailoverState;
use crate::control::decide::health::Tracker;
use crate::control::decide::keys::NameCdn;
use crate::control::decide::state::ControlState;
use crate::control::decide::stepper::{Direction, Stepper};
use crate::inputs::Loaded;

const FILE: &str = "steerdns-state.json";
/// The recorded traffic's file (`traffic.rs`), named here so that its temporaries are
/// cleaned with the state's.
pub(super) const TRAFFIC_FILE: &str = "steerdns-traffic.json";

/// The saved state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Saved {
    /// Wall-clock time of the save, milliseconds since the Unix epoch.
    #[serde(deserialize_with = "crate::control::decide::times::bounded")]
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
    /// Tenants whose failover is frozen, with why.
    #[serde(default)]
    pub frozen_tenants: BTreeMap<String, String>,
    /// Commit steering: the usage ledger and the biases in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<crate::control::modifiers::commit::SavedCommit>,
    /// Performance steering: the evaluation in force of every region with a
    /// `performance:` block.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub performance: Vec<crate::control::modifiers::perf::SavedShift>,
    /// A single node's store of decisions (a set of one; `control::store`). Absent
    /// in a state saved by a release before the store: the fields above are then
    /// turned into its keys (`controller/upgrade.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<crate::control::store::SavedStore>,
    /// The policy file's version and the version served when saved: an edit of the
    /// file made while the node was down is proposed to the set at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<SavedPolicy>,
}

/// The policy versions of a saved state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedPolicy {
    pub file: String,
    pub served: String,
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

/// Captures the state now.
pub fn capture(
    health: &BTreeMap<String, Tracker>,
    steps: &BTreeMap<NameCdn, Stepper>,
    now: Instant,
) -> Saved {
    Saved {
        saved_unix_ms: crate::clock::now_ms(),
        health: health.clone(),
        steps: steps
            .iter()
            .filter(|(_, s)| s.is_active())
            .map(|(key, s)| SavedStep {
                name: key.name.clone(),
                cdn: key.cdn.clone(),
                level: s.level,
                direction: s.direction,
                next_in_ms: s.next_in_ms(now),
            })
            .collect(),
        overrides: Vec::new(),
        drains: Vec::new(),
        frozen: None,
        frozen_tenants: BTreeMap::new(),
        commit: None,
        performance: Vec::new(),
        store: None,
        policy: None,
    }
}

/// Disk faults, simulated, for the fault tests: a disk cannot be filled or hung in CI,
/// and a tiny tmpfs needs privileges CI may not have; these switches are the seam. Off
/// unless a test turns them on; nothing else does.
///
/// - *Full*: every save writes the first half of the document and then fails with
///   `StorageFull` (ENOSPC), as a write to a full disk does. The code after the failed
///   write (cleanup, counting, retry) is the real one.
/// - *Stalled*: a save waits before its fsync until the stall ends, as a save to a hung
///   disk (a dying drive, a lost network mount) does.
#[derive(Clone, Debug, Default)]
pub struct DiskFaults {
    full: Arc<AtomicBool>,
    stalled: Arc<AtomicBool>,
}

impl DiskFaults {
    /// Turns the simulated full disk on or off.
    pub fn set_full(&self, full: bool) {
        self.full.store(full, Ordering::Relaxed);
    }

    /// Turns the simulated hung disk on or off.
    pub fn set_stalled(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::Relaxed);
    }

    fn is_full(&self) -> bool {
        self.full.load(Ordering::Relaxed)
    }

    fn wait_while_stalled(&self) {
        while self.stalled.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Writes the state atomically (the tests' shorthand; the saver thread calls
/// [`save_to`]).
#[cfg(test)]
fn save(dir: &Path, saved: &Saved) -> std::io::Result<()> {
    save_to(dir, saved, &DiskFaults::default())
}

/// Writes the state atomically, through `disk` (see [`DiskFaults`]). On an error the
/// previous file is untouched and the temporary file is removed.
pub fn save_to(dir: &Path, saved: &Saved, disk: &DiskFaults) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let bytes = serde_json::to_vec_pretty(saved).map_err(std::io::Error::other)?;
    // A name of its own per write: two writers (a restart overlapping the old process)
    // must never interleave in one temporary file.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!("{FILE}.{}.{n}.tmp", std::process::id()));
    // `create_new`: never follow a link or reuse a file someone left at that name.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)?;
    let written = (|| {
        if disk.is_full() {
            f.write_all(&bytes[..bytes.len() / 2])?;
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "No space left on device (simulated full disk)",
            ));
        }
        f.write_all(&bytes)?;
        disk.wait_while_stalled();
        f.sync_all()?;
        std::fs::rename(&tmp, path(dir))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    sync_dir(dir)
}

/// Makes a rename in `dir` durable.
#[cfg(unix)]
pub(super) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
pub(super) fn sync_dir(_dir: &Path) -> std::io::Result<()> {
    Ok(())
}

/// Removes the temporary files of [`save_to`] (and of `traffic::save`) left in `dir` by processes that are no
/// longer running (a crash between create and rename); returns how many. A file of a
/// running process (a restart overlapping the old one) is left alone.
fn clean_temporaries(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| {
                [FILE, TRAFFIC_FILE]
                    .iter()
                    .find_map(|f| n.strip_prefix(f))?
                    .strip_prefix('.')?
                    .strip_suffix(".tmp")
            })
            .and_then(|rest| rest.split_once('.'))
            .and_then(|(pid, n)| n.parse::<u64>().ok().and(pid.parse::<u32>().ok()))
        else {
            continue;
        };
        if pid != std::process::id() && !running(pid) && std::fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Whether process `pid` exists (signal 0: no signal is sent; EPERM means it exists).
#[cfg(unix)]
fn running(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks for the process.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(not(unix))]
fn running(_pid: u32) -> bool {
    true
}

/// Reads the state back; `Ok(None)` when there is none or it is older than `max_age`.
/// Never changes anything on disk (for `explain`; `serve` uses [`restore`]).
pub fn load(dir: &Path, max_age: Duration) -> Result<Option<Saved>, String> {
    match read(dir, max_age) {
        Ok(s) => Ok(s),
        Err(LoadFault::Unreadable(e)) => Err(e),
        Err(LoadFault::Corrupt(e)) => Err(e),
    }
}

/// Why a saved state was not restored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadFault {
    /// The file exists but cannot be read (a directory, permissions, I/O error).
    Unreadable(String),
    /// The file was read but is not a saved state (half written, edited, garbage).
    Corrupt(String),
}

impl LoadFault {
    /// `unreadable` or `corrupt`, for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            LoadFault::Unreadable(_) => "unreadable",
            LoadFault::Corrupt(_) => "corrupt",
        }
    }
}

impl std::fmt::Display for LoadFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadFault::Unreadable(e) | LoadFault::Corrupt(e) => f.write_str(e),
        }
    }
}

fn read(dir: &Path, max_age: Duration) -> Result<Option<Saved>, LoadFault> {
    let file = path(dir);
    let text = match std::fs::read(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LoadFault::Unreadable(format!("{}: {e}", file.display()))),
    };
    let saved: Saved = serde_json::from_slice(&text)
        .map_err(|e| LoadFault::Corrupt(format!("{}: {e}", file.display())))?;
    let age = crate::clock::now_ms().saturating_sub(saved.saved_unix_ms);
    if age > max_age.as_millis() as u64 {
        return Ok(None);
    }
    Ok(Some(saved))
}

/// Reads the state back for `serve`. A corrupt file is renamed aside (the returned path,
/// when the rename worked) so that the next save does not destroy the evidence.
pub fn restore(
    dir: &Path,
    max_age: Duration,
) -> Result<Option<Saved>, (LoadFault, Option<PathBuf>)> {
    let cleaned = clean_temporaries(dir);
    if cleaned > 0 {
        tracing::info!(dir = %dir.display(), files = cleaned, "removed temporary state files left by a crash");
    }
    match read(dir, max_age) {
        Ok(s) => Ok(s),
        Err(e @ LoadFault::Unreadable(_)) => Err((e, None)),
        Err(e @ LoadFault::Corrupt(_)) => {
            let aside = dir.join(format!("{FILE}.corrupt-{}", crate::clock::now_ms()));
            let kept = std::fs::rename(path(dir), &aside).ok().map(|()| aside);
            Err((e, kept))
        }
    }
}

/// The usage ledger of a saved state whatever its age (what the CDNs carried stays
/// true when the rest of the state is too old to use); `None` without one.
pub fn saved_usage(dir: &Path) -> Option<crate::control::modifiers::commit::ledger::Ledger> {
    let text = std::fs::read(path(dir)).ok()?;
    let saved: Saved = serde_json::from_slice(&text).ok()?;
    saved.commit.map(|c| c.ledger)
}

impl Saved {
    /// Milliseconds since the save.
    pub fn age_ms(&self) -> u64 {
        crate::clock::now_ms().saturating_sub(self.saved_unix_ms)
    }

    /// The control state saved here, for `loaded`: what is no longer probed or steered is
    /// forgotten, drains are synced with the policy at `now_ms`.
    pub fn state(&self, loaded: &Loaded, now: Instant, now_ms: u64) -> ControlState {
        let mut state = ControlState {
            failover: FailoverState {
                health: self.health.clone(),
                steps: self.steppers(now),
                frozen: self.frozen.clone(),
                frozen_tenants: self.frozen_tenants.clone(),
            },
            drains: Drains::default(),
        };
        state.failover.retain_known(&loaded.policy, &loaded.probes);
        state
            .drains
            .restore(self.overrides.clone(), &self.drains, now, self.age_ms());
        state.drains.sync(&loaded.policy, now, now_ms);
        state
    }

    /// What to save of `state` now.
    pub fn of(state: &ControlState, now: Instant) -> Saved {
        let f = &state.failover;
        let mut saved = capture(&f.health, &f.steps, now);
        saved.overrides = state.drains.overrides.clone();
        saved.drains = state.drains.saved(now);
        saved.frozen = f.frozen.clone();
        saved.frozen_tenants = f.frozen_tenants.clone();
        saved
    }

    /// The steppers, with their next step as far in the future as it was left, minus
    /// the time the process was away.
    pub fn steppers(&self, now: Instant) -> BTreeMap<NameCdn, Stepper> {
        let away = self.age_ms();
        self.steps
            .iter()
            .map(|s| {
                let stepper = Stepper::restored(s.level, s.direction, s.next_in_ms, now, away);
                (NameCdn::new(s.name.clone(), s.cdn.clone()), stepper)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::decide::health::{State, VerdictKind};
    use crate::control::decide::keys::NameCdn;
    use std::path::Path;

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
            NameCdn::new("www.example.com.", "a"),
            Stepper {
                level: 1,
                direction: Direction::Demote,
                next_at: Some(now + Duration::from_secs(60)),
            },
        );
        save(&dir, &capture(&health, &steps, now)).unwrap();
        let back = load(&dir, Duration::from_secs(60)).unwrap().unwrap();
        assert_eq!(back.health, health);
        let s = back.steppers(now)[&NameCdn::new("www.example.com.", "a")];
        assert_eq!((s.level, s.direction), (1, Direction::Demote));
        assert!(s.next_at.unwrap() <= now + Duration::from_secs(60));

        let mut old = back.clone();
        old.saved_unix_ms -= 120_000;
        save(&dir, &old).unwrap();
        assert_eq!(load(&dir, Duration::from_secs(60)).unwrap(), None);

        std::fs::write(path(&dir), b"{ half a fi").unwrap();
        assert!(load(&dir, Duration::from_secs(60)).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("steerdns-persist-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn state(ms: u64) -> Saved {
        Saved {
            saved_unix_ms: crate::clock::now_ms() - ms,
            frozen: Some(format!("saved {ms} ms ago")),
            ..Saved::default()
        }
    }

    #[test]
    fn the_usage_ledger_outlives_the_max_age() {
        let dir = scratch("usage-age");
        let mut saved = state(3_600_000);
        let mut commit = crate::control::modifiers::commit::SavedCommit::default();
        let record = crate::control::modifiers::commit::ledger::Record {
            seconds: 300,
            bytes: 7.0,
        };
        commit.ledger.record("fastly", 1_796_083_200_000, record);
        saved.commit = Some(commit.clone());
        save(&dir, &saved).unwrap();
        assert_eq!(load(&dir, Duration::from_secs(60)).unwrap(), None);
        assert_eq!(saved_usage(&dir), Some(commit.ledger));
    }

    #[test]
    fn a_full_disk_keeps_the_previous_file_and_leaves_no_temporary_file() {
        let dir = scratch("full");
        save(&dir, &state(1)).unwrap();
        let before = std::fs::read(path(&dir)).unwrap();
        let disk = DiskFaults::default();
        disk.set_full(true);
        let e = save_to(&dir, &state(2), &disk).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::StorageFull);
        assert_eq!(std::fs::read(path(&dir)).unwrap(), before);
        assert_eq!(files(&dir), [FILE]);
        disk.set_full(false);
        save_to(&dir, &state(3), &disk).unwrap();
        let back = load(&dir, Duration::from_secs(60)).unwrap().unwrap();
        assert_eq!(back.frozen.as_deref(), Some("saved 3 ms ago"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_state_dir_that_is_a_file_or_a_file_that_is_a_directory_fails_cleanly() {
        let dir = scratch("notdir");
        let file = dir.join("plain-file");
        std::fs::write(&file, b"x").unwrap();
        assert!(save(&file, &state(1)).is_err());
        assert!(matches!(
            restore(&file, Duration::from_secs(60)),
            Err((LoadFault::Unreadable(_), None))
        ));
        assert_eq!(std::fs::read(&file).unwrap(), b"x");

        let sdir = dir.join("state");
        std::fs::create_dir_all(path(&sdir).join("in-the-way")).unwrap();
        assert!(save(&sdir, &state(1)).is_err());
        assert_eq!(files(&sdir), [FILE], "no temporary file left behind");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_corrupt_state_is_set_aside_not_overwritten() {
        let dir = scratch("corrupt");
        std::fs::write(path(&dir), b"{\"saved_unix_ms\": \"yesterday\"}").unwrap();
        let (fault, kept) = restore(&dir, Duration::from_secs(60)).unwrap_err();
        assert_eq!(fault.reason(), "corrupt");
        let kept = kept.expect("set aside");
        assert_eq!(
            std::fs::read(&kept).unwrap(),
            b"{\"saved_unix_ms\": \"yesterday\"}"
        );
        assert!(!path(&dir).exists());
        // Nothing left to restore: a fresh start.
        assert_eq!(restore(&dir, Duration::from_secs(60)), Ok(None));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn temporary_files_of_a_crash_are_removed_at_startup() {
        let dir = scratch("tmp-clean");
        save(&dir, &state(1)).unwrap();
        // A crash between create and rename (a pid above any pid_max: not running), a
        // write in flight by a running process (pid 1), and files that are not ours.
        let dead = format!("{FILE}.999999999.3.tmp");
        let dead_traffic = "steerdns-traffic.json.999999999.4.tmp".to_string();
        let live = format!("{FILE}.1.0.tmp");
        for f in [
            &dead,
            &dead_traffic,
            &live,
            &format!("{FILE}.x.tmp"),
            &"other.1.tmp".to_string(),
        ] {
            std::fs::write(dir.join(f), b"{").unwrap();
        }
        assert!(restore(&dir, Duration::from_secs(60)).unwrap().is_some());
        let left = files(&dir);
        assert!(!left.contains(&dead), "{left:?}");
        assert!(!left.contains(&dead_traffic), "{left:?}");
        assert!(left.contains(&live), "{left:?}");
        assert_eq!(left.len(), 4, "{left:?}");
    }

    /// The demo inputs, with the failover tests' policy, its name of tenant `shop`.
    fn loaded() -> Loaded {
        let mut loaded = crate::inputs::demo();
        let policy = crate::control::decide::failover::tests::POLICY;
        loaded.policy = crate::config::parse(Path::new("t.yaml"), policy.into())
            .unwrap()
            .0;
        loaded.policy.hosts[0].tenant = Some("shop".into());
        loaded
    }

    #[test]
    fn a_saved_state_comes_back_as_it_was_served() {
        let loaded = loaded();
        let t0 = Instant::now();
        let mut state = ControlState::default();
        state.failover.track("a", VerdictKind::Down, 1, 1);
        let mut s = crate::control::decide::stepper::Stepper::default();
        s.demote(t0, &loaded.policy.hosts[0].failover);
        state
            .failover
            .steps
            .insert(NameCdn::new("www.example.com.", "a"), s);
        state
            .failover
            .frozen_tenants
            .insert("shop".into(), "maintenance".into());
        let saved = Saved::of(&state, t0);
        let back = saved.state(&loaded, t0, saved.saved_unix_ms);
        assert_eq!(back.removed(&loaded), state.removed(&loaded));
        assert_eq!(
            back.removed(&loaded)
                .get(&NameCdn::new("www.example.com.", "a")),
            Some(&50)
        );
        assert_eq!(
            back.frozen_for(&loaded, "WWW.example.com"),
            Some("maintenance (tenant freeze)".into()),
            "the tenant's freeze is the name's"
        );
    }
}
