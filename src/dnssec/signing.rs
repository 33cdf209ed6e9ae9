//! Input: DNSSEC signing of the served zones and the pre-signed steered answers
//! (`Signing`, `Signed`): the signature window, the keys in use, `refresh`.
//! (The main room of its folder; the folder's door, `mod.rs`, says what else lives there.)

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use hickory_proto::rr::Name;
use hickory_server::zone_handler::Catalog;
use serde::Serialize;

use super::keys::{Key, KeyError};
use super::sign::Window;
use crate::config::dnssec::DnssecSettings;
use crate::config::Policy;
use crate::error::{ConfigIssue, Issues};
use crate::zones::Zones;

/// Why signing, or a `steerdns dnssec` command, failed.
#[derive(Debug, thiserror::Error)]
pub enum DnssecError {
    /// A key cannot be made, read or used.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The key directory holds a bad key (each problem against its file).
    #[error("{0}")]
    Keys(Issues),
    /// The policy or the zones do not load.
    #[error("{0}")]
    Inputs(Issues),
    /// The policy has no `dnssec:` block.
    #[error("{}: no `dnssec:` block", config.display())]
    NoDnssecBlock { config: PathBuf },
    /// The zone given on the command line is not a domain name.
    #[error("`{zone}` is not a zone name: {error}")]
    ZoneName { zone: String, error: String },
    /// No key of the zone in the key directory.
    #[error("no key for {zone} in {}", dir.display())]
    NoKey { zone: Name, dir: PathBuf },
    /// No key of the zone to roll over.
    #[error("no key of {zone} to roll over: make one with `steerdns dnssec keygen`")]
    NoKeyToRoll { zone: Name },
    /// A zone has keys, none active now.
    #[error("{zone}: no key is active now")]
    NoActiveKey { zone: Name },
    /// A zone with no SOA record.
    #[error("{zone}: no SOA record")]
    NoSoa { zone: Name },
    /// An RRset cannot be signed (`what`: its name and type, or `signing …`).
    #[error("{what}: {error}")]
    Sign { what: String, error: String },
    /// A signature cannot be encoded.
    #[error("{0}")]
    Encode(String),
    /// A new key file would replace one.
    #[error("{}: exists already", path.display())]
    Exists { path: PathBuf },
    /// A directory or file of the key directory cannot be written.
    #[error("{}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl DnssecError {
    pub(super) fn write(path: &Path) -> impl FnOnce(std::io::Error) -> DnssecError + '_ {
        move |source| DnssecError::Write {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The keys and settings of a policy with a `dnssec:` block.
pub struct Signing {
    pub settings: DnssecSettings,
    pub keys: Vec<Key>,
}

/// Everything signed for one window.
pub struct Signed {
    pub window: Window,
    /// The zones, signed ones replaced by their signed copies.
    pub catalog: Arc<Catalog>,
    /// The RRSIGs of each (steered name, CNAME target), as [`super::sign::cname_rrsigs`].
    pub(super) cnames: HashMap<(Name, Name), Arc<[u8]>>,
    /// Per signed zone: (origin, tags of the keys published, tags of those signing).
    pub zones: Vec<(Name, Vec<u16>, Vec<u16>)>,
    /// The next time (Unix seconds) a key is published, activated, retired or
    /// removed: the zones are signed again then.
    pub keys_change: Option<u64>,
    /// The signed zones' NSEC records, for whole NXDOMAIN proofs.
    pub denials: Arc<crate::zones::denial::Denials>,
}

impl Signing {
    /// The keys of the policy's key directory, checked against the zones: each key's
    /// zone is served. `None` without a `dnssec:` block.
    pub fn load(policy: &Policy, zones: &Zones) -> Result<Option<Signing>, Issues> {
        let Some(settings) = policy.dnssec.clone() else {
            return Ok(None);
        };
        let keys = super::keys::load_dir(&settings.keys)?;
        let mut issues = Issues::default();
        for k in &keys {
            if !zones.origins().any(|o| *o == k.zone) {
                issues.push(ConfigIssue::error(
                    &k.file,
                    None,
                    "zone",
                    format!("{} is not a zone served here (zones/)", k.zone),
                ));
            }
        }
        if keys.is_empty() {
            issues.push(ConfigIssue::error(
                &settings.keys,
                None,
                "",
                "no key file (*.key): make one with `steerdns dnssec keygen ZONE`",
            ));
        }
        if issues.has_errors() {
            return Err(issues);
        }
        Ok(Some(Signing { settings, keys }))
    }

    /// Signs every zone that has a key, and every steered CNAME in those zones, for
    /// the window of `now`.
    pub fn sign(&self, policy: &Policy, zones: &Zones, now: u64) -> Result<Signed, DnssecError> {
        let w = Window::at(now, &self.settings);
        let steered: Vec<Name> = policy.hosts.iter().map(|h| h.name.clone()).collect();
        let mut cnames = HashMap::new();
        let mut summary = Vec::new();
        let mut signed = HashMap::new();
        let mut denials = crate::zones::denial::Denials::default();
        for z in zones.zones() {
            let of_zone = |k: &&Key| k.zone == *z.origin();
            if !self.keys.iter().any(|k| of_zone(&k)) {
                continue;
            }
            let mine = || self.keys.iter().filter(of_zone);
            let keys = super::sign::ZoneKeys {
                published: mine().filter(|k| k.times.published(now)).collect(),
                key_signers: mine().filter(|k| k.times.signs_keys(now)).collect(),
                active: mine()
                    .filter(|k| k.times.published(now) && k.times.active(now))
                    .collect(),
            };
            if keys.active.is_empty() {
                return Err(DnssecError::NoActiveKey {
                    zone: z.origin().clone(),
                });
            }
            let records = super::sign::sign_zone(
                z.origin(),
                z.records(),
                &steered,
                &keys,
                &self.settings,
                w,
            )?;
            let records = super::sign::shared(records);
            denials.add(z.origin(), &records);
            signed.insert(z.origin().clone(), z.handler_of(records));
            for h in policy.hosts.iter().filter(|h| {
                zones
                    .zone_of(&h.name)
                    .is_some_and(|o| o.origin() == z.origin())
            }) {
                let ttl = h.ttl.max(h.incident_ttl.unwrap_or(0));
                for c in &h.cdns {
                    let sigs = super::sign::cname_rrsigs(&h.name, &c.cname, ttl, &keys.active, w)?;
                    cnames.insert((h.name.clone(), c.cname.clone()), Arc::from(sigs));
                }
            }
            summary.push((
                z.origin().clone(),
                keys.published.iter().map(|k| k.tag).collect(),
                keys.active.iter().map(|k| k.tag).collect(),
            ));
        }
        let catalog = zones.catalog_with(|z| signed.remove(z.origin()));
        let keys_change = self
            .keys
            .iter()
            .flat_map(|k| k.times.events())
            .filter(|&t| t > now)
            .min();
        Ok(Signed {
            window: w,
            catalog: Arc::new(catalog),
            cnames,
            zones: summary,
            keys_change,
            denials: Arc::new(denials),
        })
    }
}

/// `steerdns dnssec keygen`: a new key for `zone` in `dir` (made if missing), written
/// owner-only; its path.
pub fn keygen(dir: &Path, zone: &str, algorithm: u8, now: u64) -> Result<PathBuf, DnssecError> {
    let zone = zone_name(zone)?;
    let (name, text) = super::keys::generate(&zone, algorithm, now)?;
    std::fs::create_dir_all(dir).map_err(DnssecError::write(dir))?;
    let path = dir.join(name);
    write_owner_only(&path, text.as_bytes(), true)?;
    Ok(path)
}

/// Writes `bytes` to `path`, owner-only (0600), synced; a new file only with
/// `create_new`, else created or replaced.
pub(super) fn write_owner_only(
    path: &Path,
    bytes: &[u8],
    create_new: bool,
) -> Result<(), DnssecError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true);
    if create_new {
        options.create_new(true);
    } else {
        options.create(true).truncate(true);
    }
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options.open(path).map_err(DnssecError::write(path))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(DnssecError::write(path))
}

/// The policy's `dnssec:` settings and the zones, read from `config` and `zones` (for
/// `dnssec rollover` and `dnssec status`).
pub(super) fn inputs(
    config: &Path,
    zones: &Path,
) -> Result<(Policy, Zones, DnssecSettings), DnssecError> {
    let (policy, _) = crate::config::load(config).map_err(DnssecError::Inputs)?;
    let settings = policy
        .dnssec
        .clone()
        .ok_or_else(|| DnssecError::NoDnssecBlock {
            config: config.to_path_buf(),
        })?;
    let (zones, _) = Zones::load(zones).map_err(DnssecError::Inputs)?;
    Ok((policy, zones, settings))
}

/// The largest TTL zone `origin` signs: its records' and its steered names' (with
/// the incident TTL).
pub(super) fn max_ttl(origin: &Name, policy: &Policy, zones: &Zones) -> u32 {
    let records = zones
        .zones()
        .iter()
        .filter(|z| z.origin() == origin)
        .flat_map(|z| z.records().values().map(|s| s.ttl()));
    let steered = policy
        .hosts
        .iter()
        .filter(|h| origin.zone_of(&h.name))
        .map(|h| h.ttl.max(h.incident_ttl.unwrap_or(0)));
    records.chain(steered).max().unwrap_or(0)
}

/// `steerdns dnssec rollover ZONE`: see [`super::rollover::roll`].
pub fn rollover_command(
    config: &Path,
    zones: &Path,
    zone: &str,
    now: u64,
    start_now: bool,
) -> Result<String, DnssecError> {
    let zone = zone_name(zone)?;
    let (policy, zones, settings) = inputs(config, zones)?;
    let ttl = max_ttl(&zone, &policy, &zones);
    super::rollover::roll(&settings.keys, &settings, ttl, &zone, now, start_now)
}

/// `steerdns dnssec status`: see [`super::rollover::status`].
pub fn status_command(config: &Path, zones: &Path, now: u64) -> Result<String, DnssecError> {
    let (policy, zones, settings) = inputs(config, zones)?;
    let keys = super::keys::load_dir(&settings.keys).map_err(DnssecError::Keys)?;
    let ttl = zones
        .origins()
        .map(|o| max_ttl(o, &policy, &zones))
        .max()
        .unwrap_or(0);
    Ok(super::rollover::status(&keys, &settings, ttl, now))
}

/// `steerdns dnssec ds`: the DS records of `zone`'s keys in `dir` published at `now`
/// or later (a key waiting to be published goes to the parent first).
pub fn ds(dir: &Path, zone: &str, now: u64) -> Result<Vec<String>, DnssecError> {
    let zone = zone_name(zone)?;
    let keys = super::keys::load_dir(dir).map_err(DnssecError::Keys)?;
    let lines: Vec<String> = keys
        .iter()
        .filter(|k| k.zone == zone && k.times.remove.is_none_or(|r| now < r))
        .map(Key::ds)
        .collect::<Result<_, _>>()?;
    if lines.is_empty() {
        return Err(DnssecError::NoKey {
            zone,
            dir: dir.to_path_buf(),
        });
    }
    Ok(lines)
}

pub(super) fn zone_name(zone: &str) -> Result<Name, DnssecError> {
    let mut name = Name::from_str(zone)
        .map_err(|e| DnssecError::ZoneName {
            zone: zone.to_string(),
            error: e.to_string(),
        })?
        .to_lowercase();
    name.set_fqdn(true);
    Ok(name)
}

/// Signing as the server runs it: the keys, and what is signed now, replaced when the
/// window ends ([`Dnssec::refresh`]); a failed signing leaves the last signatures
/// serving.
pub struct Dnssec {
    pub signing: Signing,
    pub(super) signed: ArcSwap<Signed>,
    /// After a failed signing, when to try again (Unix seconds; 0: no failure).
    pub(super) retry: AtomicU64,
}

/// How long after a failed signing the next attempt is made.
pub const RETRY: u64 = 60;

impl Dnssec {
    pub fn new(signing: Signing, signed: Signed) -> Dnssec {
        Dnssec {
            signing,
            signed: ArcSwap::from_pointee(signed),
            retry: AtomicU64::new(0),
        }
    }

    /// What is signed now.
    pub fn signed(&self) -> Arc<Signed> {
        self.signed.load_full()
    }

    /// When (Unix seconds) the signatures are to be replaced: the window ends, or a
    /// key changes phase (or, after a failure, signing is tried again).
    pub fn due(&self) -> u64 {
        let signed = self.signed.load();
        let next = signed
            .keys_change
            .map_or(signed.window.next, |k| k.min(signed.window.next));
        next.max(self.retry.load(Ordering::Relaxed))
    }

    /// Signs again if the window has moved on or a key changed phase; `Ok(true)`: new
    /// signatures. On an error the current ones stay, and the next attempt is
    /// [`RETRY`] seconds later.
    pub fn refresh(&self, policy: &Policy, zones: &Zones, now: u64) -> Result<bool, DnssecError> {
        if now < self.due() {
            return Ok(false);
        }
        match self.signing.sign(policy, zones, now) {
            Ok(signed) => {
                self.signed.store(Arc::new(signed));
                self.retry.store(0, Ordering::Relaxed);
                Ok(true)
            }
            Err(e) => {
                self.retry.store(now + RETRY, Ordering::Relaxed);
                Err(e)
            }
        }
    }
}

/// What `/v1/state` and the status page show of signing.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Status {
    /// When the signatures served expire, and when they are replaced (Unix seconds).
    pub signed_until_unix: u64,
    pub resign_at_unix: u64,
    pub keys: Vec<KeyStatus>,
}

#[derive(Clone, Debug, Serialize)]
pub struct KeyStatus {
    pub zone: String,
    pub tag: u16,
    pub algorithm: u8,
    /// `waiting` (not yet published), `published` (DNSKEY served, not signing),
    /// `active` (served and signing), `retired` (served, no longer signing),
    /// `removed`.
    pub phase: &'static str,
    pub file: String,
    /// The key's times (Unix seconds): published, signing, retired, withdrawn.
    pub times: super::keys::Times,
}

impl Dnssec {
    /// Every key's phase at `now`, and the signatures' times.
    pub fn status(&self, now: u64) -> Status {
        let signed = self.signed();
        Status {
            signed_until_unix: signed.window.expiration,
            resign_at_unix: self.due(),
            keys: self
                .signing
                .keys
                .iter()
                .map(|k| KeyStatus {
                    zone: k.zone.to_string(),
                    tag: k.tag,
                    algorithm: u8::from(k.algorithm),
                    phase: k.times.phase(now),
                    file: k.file.display().to_string(),
                    times: k.times,
                })
                .collect(),
        }
    }
}

impl Signed {
    /// The RRSIGs of `name CNAME target`, if its zone is signed.
    pub fn cname(&self, name: &Name, target: &Name) -> Option<Arc<[u8]>> {
        self.cnames.get(&(name.clone(), target.clone())).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(keys: PathBuf) -> DnssecSettings {
        DnssecSettings {
            keys,
            validity: DnssecSettings::DEFAULT_VALIDITY,
            refresh: DnssecSettings::DEFAULT_REFRESH,
            dnskey_ttl: 3600,
            rollover: Default::default(),
        }
    }

    #[test]
    fn windows_are_aligned_backdated_and_leave_refresh() {
        let s = settings(PathBuf::new());
        let t = 1_796_152_579;
        let w = Window::at(t, &s);
        // Every moment of a window gives the same signature times.
        assert_eq!(Window::at(w.next - 1, &s), w);
        assert_eq!(
            w.inception + super::super::sign::BACKDATE,
            w.next - 7 * 86_400
        );
        assert!(w.inception + 3600 <= t);
        for now in [w.next - 7 * 86_400, t, w.next - 1] {
            let left = w.expiration - now;
            assert!(left > 7 * 86_400 && left <= 14 * 86_400, "{left}");
        }
        assert_ne!(Window::at(w.next, &s), w);
    }

    /// A signing that fails (no key active at that moment) keeps the signatures of
    /// the last window serving, and is tried again a minute later.
    #[test]
    fn a_failed_signing_keeps_the_last_signatures() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = std::env::temp_dir().join(format!("steerdns-resign-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let t = 1_796_152_579;
        let path = keygen(&dir, "example.com", 13, t).unwrap();
        let text = std::fs::read_to_string(repo.join("steering.yaml")).unwrap();
        let (mut policy, _) = crate::config::parse(&repo.join("steering.yaml"), text).unwrap();
        policy.dnssec = Some(settings(dir.clone()));
        let (zones, _) = Zones::load(&repo.join("zones")).unwrap();
        let signing = Signing::load(&policy, &zones).unwrap().unwrap();
        let first = signing.sign(&policy, &zones, t).unwrap();
        let www = Name::from_str("www.example.com.").unwrap();
        let fastly = Name::from_str("example.map.fastly.net.").unwrap();
        assert!(first.cname(&www, &fastly).is_some());
        let before = first.window;
        let mut signing = signing;
        // The key retires before the next window: nothing can sign then.
        signing.keys[0].times.retire = Some(before.next - 10);
        let d = Dnssec::new(signing, first);
        assert!(matches!(
            d.refresh(&policy, &zones, before.next - 20),
            Ok(false)
        ));
        let e = d.refresh(&policy, &zones, before.next).unwrap_err();
        assert!(matches!(e, DnssecError::NoActiveKey { .. }));
        assert!(e.to_string().contains("no key is active"), "{e}");
        assert_eq!(d.signed().window, before, "the last signatures stay");
        assert_eq!(d.due(), before.next + RETRY);
        assert_eq!(d.status(before.next).keys[0].phase, "retired");
        std::fs::remove_file(path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
