//! Input: CSK rollover, timed as RFC 7583 says, written into the key files.
//!
//! A rollover is a successor key and new times for its predecessor; every node reads
//! the same files and the same clock, so every node serves the same DNSKEY set at every
//! moment. `steerdns dnssec rollover ZONE` writes them; the server signs again at each
//! time (`Signed::keys_change`). With Dprp the propagation, TTLkey the DNSKEY TTL,
//! TTLsig the largest TTL the zone signs, Dreg the parent's delay and TTLds the DS TTL:
//!
//! ```text
//! publish   successor's DNSKEY served, signing nothing        (start)
//! activate  successor signs; predecessor retires, but keeps   (publish + Dprp + TTLkey)
//!           signing the DNSKEY set; CDS/CDNSKEY name the
//!           successor: the parent replaces the DS
//! remove    predecessor's DNSKEY withdrawn                    (activate + max(Dprp +
//!                                                              TTLsig, Dreg + Dprp + TTLds))
//! ```
//!
//! No cache can then hold a DNSKEY set without the key that signed what it holds, or a
//! DS for a key that is gone: a validating resolver never fails in between.

use std::path::{Path, PathBuf};

use hickory_proto::rr::Name;

use super::keys::{self, Key, Times};
use super::DnssecError;
use crate::clock::rfc3339;
use crate::config::dnssec::DnssecSettings;

/// The durations (seconds) a rollover is timed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timings {
    /// From publication to activation: Dprp + TTLkey.
    pub publish_to_activate: u64,
    /// From activation to the predecessor's removal: the longer of Dprp + TTLsig (its
    /// signatures leave the caches) and Dreg + Dprp + TTLds (the parent's DS changed
    /// over, and the old DS left the caches).
    pub activate_to_remove: u64,
    /// Dprp: files copied to every node ahead of the first change.
    pub propagation: u64,
    /// How long a key signs.
    pub every: u64,
}

impl Timings {
    /// The timings for `settings`, the zone's largest TTL being `max_ttl`.
    pub(crate) fn new(settings: &DnssecSettings, max_ttl: u32) -> Timings {
        let r = &settings.rollover;
        let prp = r.propagation.as_secs();
        let sigs = prp + u64::from(max_ttl.max(settings.dnskey_ttl));
        let ds = r.parent_delay.as_secs() + prp + r.ds_ttl.as_secs();
        Timings {
            publish_to_activate: prp + u64::from(settings.dnskey_ttl),
            activate_to_remove: sigs.max(ds),
            propagation: prp,
            every: r.every.as_secs(),
        }
    }
}

/// The zone's current key: the one active now or next, that no rollover retires yet.
fn current<'k>(keys: &'k [Key], zone: &Name) -> Option<&'k Key> {
    keys.iter()
        .filter(|k| k.zone == *zone && k.times.retire.is_none() && k.times.remove.is_none())
        .max_by_key(|k| k.times.activate)
}

/// The times of a rollover from `old` started at `start` (the successor's
/// publication): the successor's times and the predecessor's new ones.
pub(crate) fn schedule(old: &Times, start: u64, now: u64, t: &Timings) -> (Times, Times) {
    let activate = start + t.publish_to_activate;
    let new = Times {
        created: now,
        publish: start,
        activate,
        retire: None,
        remove: None,
    };
    let old = Times {
        retire: Some(activate),
        remove: Some(activate + t.activate_to_remove),
        ..*old
    };
    (new, old)
}

/// When the rollover from `old` is due to start: so that its successor signs `every`
/// after `old` began to.
pub(crate) fn due(old: &Times, t: &Timings) -> u64 {
    (old.activate + t.every).saturating_sub(t.publish_to_activate)
}

/// `steerdns dnssec rollover`: writes the successor of `zone`'s current key (of its
/// algorithm: a change of algorithm wants both signing meanwhile, RFC 6781 §4.1.4)
/// and the predecessor's new times into the key directory. Starts at the scheduled time, or
/// `now` (plus the propagation, for the files to reach every node) with `start_now`.
/// What was done, for the operator.
pub(crate) fn roll(
    keys_dir: &Path,
    settings: &DnssecSettings,
    max_ttl: u32,
    zone: &Name,
    now: u64,
    start_now: bool,
) -> Result<String, DnssecError> {
    let keys = keys::load_dir(keys_dir).map_err(DnssecError::Keys)?;
    let t = Timings::new(settings, max_ttl);
    let old =
        current(&keys, zone).ok_or_else(|| DnssecError::NoKeyToRoll { zone: zone.clone() })?;
    // Nothing to do while a successor waits: run from cron or a timer, the command
    // schedules each rollover once.
    if old.times.activate > now {
        return Ok(format!(
            "{zone}: nothing to do, a rollover is under way: key {} signs from {}",
            old.tag,
            rfc3339(old.times.activate * 1000)
        ));
    }
    let earliest = now + t.propagation;
    let start = if start_now {
        earliest
    } else {
        due(&old.times, &t).max(earliest)
    };
    let (new_times, old_times) = schedule(&old.times, start, now, &t);
    let (name, text) = keys::generate_with(zone, u8::from(old.algorithm), new_times)?;
    let path = keys_dir.join(&name);
    if path.exists() {
        return Err(DnssecError::Exists { path });
    }
    // Each file appears whole (a server reading the directory meanwhile sees the old
    // file or the new one), the successor first: alone, it only waits.
    replace(&path, &text)?;
    replace(&old.file, &keys::rewrite_times(&old.file, old_times)?)?;
    let at = |s: u64| rfc3339(s * 1000);
    // The parent's new DS must be out that long before the old key goes.
    let ds_wait = settings.rollover.propagation.as_secs() + settings.rollover.ds_ttl.as_secs();
    Ok(format!(
        "{zone}: key {new} ({path}) is published at {p} and signs from {a}; key {old} retires then and is withdrawn at {r}.\n\
         Copy the key directory to every node before {p}.\n\
         At the parent: from {a} the zone's CDS and CDNSKEY name key {new}; a parent that scans them replaces the DS itself.\n\
         Otherwise replace the DS of key {old} with this one between {a} and {deadline}:\n{ds}",
        new = keys::load(&path)?.tag,
        path = path.display(),
        p = at(new_times.publish),
        a = at(new_times.activate),
        old = old.tag,
        r = at(old_times.remove.unwrap_or(0)),
        deadline = at(old_times.remove.unwrap_or(0).saturating_sub(ds_wait)),
        ds = keys::load(&path)?.ds()?,
    ))
}

/// Writes `text` to `path` owner-only through a temporary file renamed over it.
fn replace(path: &Path, text: &str) -> Result<(), DnssecError> {
    let tmp = PathBuf::from(format!("{}.tmp", path.display()));
    super::write_owner_only(&tmp, text.as_bytes(), false)?;
    std::fs::rename(&tmp, path).map_err(DnssecError::write(path))
}

/// `steerdns dnssec status`: each key of each zone with its phase and times at `now`,
/// the DS the parent should hold, and what is due next.
pub(crate) fn status(keys: &[Key], settings: &DnssecSettings, max_ttl: u32, now: u64) -> String {
    let t = Timings::new(settings, max_ttl);
    let at = |s: u64| rfc3339(s * 1000);
    let mut zones: Vec<&Name> = keys.iter().map(|k| &k.zone).collect();
    zones.sort();
    zones.dedup();
    let mut out = String::new();
    for zone in zones {
        out.push_str(&format!("{zone}\n"));
        let mut mine: Vec<&Key> = keys.iter().filter(|k| k.zone == *zone).collect();
        mine.sort_by_key(|k| (k.times.activate, k.tag));
        for k in &mine {
            let tm = &k.times;
            let mut line = format!(
                "  key {:5} algorithm {:2} {:9} published {} active {}",
                k.tag,
                u8::from(k.algorithm),
                tm.phase(now),
                at(tm.publish),
                at(tm.activate)
            );
            if let Some(r) = tm.retire {
                line.push_str(&format!(" retires {}", at(r)));
            }
            if let Some(r) = tm.remove {
                line.push_str(&format!(" withdrawn {}", at(r)));
            }
            out.push_str(&line);
            out.push('\n');
        }
        let parent: Vec<String> = mine
            .iter()
            .filter(|k| k.times.published(now) && k.times.active(now))
            .map(|k| k.tag.to_string())
            .collect();
        out.push_str(&format!(
            "  the parent should hold the DS of key {} (CDS and CDNSKEY say so)\n",
            parent.join(", ")
        ));
        let next = mine.iter().find(|k| k.times.activate > now);
        let leaving = mine
            .iter()
            .filter_map(|k| k.times.remove.filter(|&r| r > now).map(|r| (k.tag, r)))
            .min_by_key(|&(_, r)| r);
        match (next, leaving) {
            (Some(n), Some((old, remove))) => out.push_str(&format!(
                "  rollover under way: from {} replace the DS of key {old} with the DS of key {} at the parent (`steerdns dnssec ds`), or let a parent that scans CDS do it; key {old} is withdrawn at {}\n",
                at(n.times.activate),
                n.tag,
                at(remove)
            )),
            (None, Some((old, remove))) => out.push_str(&format!(
                "  the parent must hold only the DS of the active key by now; key {old} is withdrawn at {}\n",
                at(remove)
            )),
            _ => {
                if let Some(cur) = current(keys, zone) {
                    let due = due(&cur.times, &t);
                    let what = if due <= now { "due now" } else { "due" };
                    out.push_str(&format!(
                        "  next rollover {what} at {}: run `steerdns dnssec rollover {zone}` and copy the key directory to every node\n",
                        at(due)
                    ));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::dnssec::RolloverSettings;
    use std::time::Duration;

    fn settings() -> DnssecSettings {
        DnssecSettings {
            keys: PathBuf::new(),
            validity: DnssecSettings::DEFAULT_VALIDITY,
            refresh: DnssecSettings::DEFAULT_REFRESH,
            dnskey_ttl: 3600,
            rollover: RolloverSettings::default(),
        }
    }

    /// RFC 7583's intervals with the defaults: published an hour and the DNSKEY TTL
    /// before it signs; the old key stays until the parent's two days, an hour and a
    /// day of DS TTL have passed.
    #[test]
    fn a_rollover_waits_for_the_caches_and_the_parent() {
        let t = Timings::new(&settings(), 300);
        assert_eq!(t.publish_to_activate, 3600 + 3600);
        assert_eq!(t.activate_to_remove, 2 * 86_400 + 3600 + 86_400);
        let old = Times {
            created: 1000,
            publish: 1000,
            activate: 1000,
            retire: None,
            remove: None,
        };
        let (new, old2) = schedule(&old, 50_000, 40_000, &t);
        assert_eq!(new.publish, 50_000);
        assert_eq!(new.activate, 50_000 + 7200);
        assert_eq!(old2.retire, Some(new.activate));
        assert_eq!(old2.remove, Some(new.activate + t.activate_to_remove));
        assert_eq!(old2.activate, 1000);
        // At every moment some key signs, and the DNSKEY set is signed by a key whose
        // DS the parent holds (the old one until its removal).
        for now in [
            new.publish,
            new.activate - 1,
            new.activate,
            old2.remove.unwrap() - 1,
        ] {
            assert!(old2.signs_keys(now) && old2.published(now), "{now}");
            assert!(old2.active(now) || new.active(now), "{now}");
        }
        assert!(!old2.published(old2.remove.unwrap()));
        // A long TTL in the zone keeps the old key longer than the parent does.
        let mut s = settings();
        s.rollover.parent_delay = Duration::from_secs(1);
        s.rollover.ds_ttl = Duration::from_secs(1);
        let t = Timings::new(&s, 86_400 * 3);
        assert_eq!(t.activate_to_remove, 3600 + 3 * 86_400);
        assert_eq!(due(&old, &t), 1000 + 90 * 86_400 - t.publish_to_activate);
    }
}
