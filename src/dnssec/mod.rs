//! Input: DNSSEC. Zone keys are files ([`keys`]); signing happens off the query path,
//! when the inputs are loaded and whenever a signature window ends ([`sign`]):
//!
//! - each signed zone becomes a signed copy (DNSKEY set, NSEC chain listing every
//!   steered name, an RRSIG over each RRset) that hickory's Catalog serves, NSEC
//!   denials included;
//! - each (steered name, CNAME target) gets its RRSIG, with the original TTL the
//!   largest TTL the name answers with; the planner puts those bytes in the plan
//!   (`Plan::set_rrsigs`) and the data plane copies them into answers to DO=1 queries.
//!
//! A zone is signed when the `dnssec:` block of the policy is present and the key
//! directory holds a key for it.

pub mod keys;
pub mod sign;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use hickory_proto::rr::Name;
use hickory_server::zone_handler::Catalog;

use crate::config::dnssec::DnssecSettings;
use crate::config::Policy;
use crate::error::{ConfigIssue, Issues};
use crate::zones::Zones;
use keys::Key;
use sign::Window;

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
    /// The RRSIGs of each (steered name, CNAME target), as [`sign::cname_rrsigs`].
    cnames: HashMap<(Name, Name), Arc<[u8]>>,
    /// Per signed zone: (origin, tags of the keys published, tags of those signing).
    pub zones: Vec<(Name, Vec<u16>, Vec<u16>)>,
}

impl Signing {
    /// The keys of the policy's key directory, checked against the zones: each key's
    /// zone is served. `None` without a `dnssec:` block.
    pub fn load(policy: &Policy, zones: &Zones) -> Result<Option<Signing>, Issues> {
        let Some(settings) = policy.dnssec.clone() else {
            return Ok(None);
        };
        let keys = keys::load_dir(&settings.keys)?;
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
    pub fn sign(&self, policy: &Policy, zones: &Zones, now: u64) -> Result<Signed, String> {
        let w = Window::at(now, &self.settings);
        let steered: Vec<Name> = policy.hosts.iter().map(|h| h.name.clone()).collect();
        let mut cnames = HashMap::new();
        let mut summary = Vec::new();
        let mut signed = HashMap::new();
        for z in zones.zones() {
            let of_zone = |k: &&Key| k.zone == *z.origin();
            let published: Vec<&Key> = self
                .keys
                .iter()
                .filter(of_zone)
                .filter(|k| k.times.published(now))
                .collect();
            let active: Vec<&Key> = published
                .iter()
                .copied()
                .filter(|k| k.times.active(now))
                .collect();
            if published.is_empty() && !self.keys.iter().any(|k| of_zone(&k)) {
                continue;
            }
            if active.is_empty() {
                return Err(format!("{}: no key is active now", z.origin()));
            }
            let records = sign::sign_zone(
                z.origin(),
                z.records(),
                &steered,
                &published,
                &active,
                &self.settings,
                w,
            )?;
            signed.insert(z.origin().clone(), z.handler_of(sign::shared(records)));
            for h in policy.hosts.iter().filter(|h| {
                zones
                    .zone_of(&h.name)
                    .is_some_and(|o| o.origin() == z.origin())
            }) {
                let ttl = h.ttl.max(h.incident_ttl.unwrap_or(0));
                for c in &h.cdns {
                    let sigs = sign::cname_rrsigs(&h.name, &c.cname, ttl, &active, w)?;
                    cnames.insert((h.name.clone(), c.cname.clone()), Arc::from(sigs));
                }
            }
            summary.push((
                z.origin().clone(),
                published.iter().map(|k| k.tag).collect(),
                active.iter().map(|k| k.tag).collect(),
            ));
        }
        let catalog = zones.catalog_with(|z| signed.remove(z.origin()));
        Ok(Signed {
            window: w,
            catalog: Arc::new(catalog),
            cnames,
            zones: summary,
        })
    }
}

/// `steerdns dnssec keygen`: a new key for `zone` in `dir` (made if missing), written
/// owner-only; its path.
pub fn keygen(dir: &Path, zone: &str, algorithm: u8, now: u64) -> Result<PathBuf, String> {
    let zone = zone_name(zone)?;
    let (name, text) = keys::generate(&zone, algorithm, now)?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(name);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// `steerdns dnssec ds`: the DS records of `zone`'s keys in `dir` published at `now`
/// or later (a key waiting to be published goes to the parent first).
pub fn ds(dir: &Path, zone: &str, now: u64) -> Result<Vec<String>, String> {
    let zone = zone_name(zone)?;
    let keys = keys::load_dir(dir).map_err(|e| e.to_string())?;
    let lines: Vec<String> = keys
        .iter()
        .filter(|k| k.zone == zone && k.times.remove.is_none_or(|r| now < r))
        .map(Key::ds)
        .collect::<Result<_, _>>()?;
    if lines.is_empty() {
        return Err(format!("no key for {zone} in {}", dir.display()));
    }
    Ok(lines)
}

fn zone_name(zone: &str) -> Result<Name, String> {
    let mut name = Name::from_str(zone)
        .map_err(|e| format!("`{zone}` is not a zone name: {e}"))?
        .to_lowercase();
    name.set_fqdn(true);
    Ok(name)
}

impl Signed {
    /// The RRSIGs of `name CNAME target`, if its zone is signed.
    pub fn cname(&self, name: &Name, target: &Name) -> Option<Arc<[u8]>> {
        self.cnames.get(&(name.clone(), target.clone())).cloned()
    }
}
