//! Input: every file steerdns serves from, loaded, validated and fingerprinted together,
//! for `serve` at start, for every reload, and for `check` and `explain`.
//!
//! `load` reads the policy (`config`), the zones (`zones`), the geo database
//! (`place::geo`) and the probes, reports the problems of all of them at once, and
//! returns a [`Loaded`] with a short version hash of the files. The planner
//! (`control::decide::planner`) turns a `Loaded` into the snapshot the data plane serves.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use crate::config::probes::{self, Probes};
use crate::config::tokens::{self, Tokens};
use crate::config::{self, Policy};
use crate::dnssec::{Dnssec, Signing};
use crate::error::{ConfigIssue, Issues};
use crate::place::asn::AsnDb;
use crate::place::geo::GeoDb;
use crate::place::mmdb::GeoError;
use crate::zones::Zones;

/// Where the inputs are; the defaults are relative to the working directory, so a fresh
/// checkout serves its demo policy.
#[derive(Clone, Debug)]
pub struct Inputs {
    pub config: PathBuf,
    pub zones: PathBuf,
    pub geo: PathBuf,
    pub probes: PathBuf,
    /// The AS-number database, for policies that match AS numbers.
    pub asn: Option<PathBuf>,
    /// The API tokens file (`--api-tokens`), reloaded with the policy.
    pub api_tokens: Option<PathBuf>,
}

impl Default for Inputs {
    fn default() -> Self {
        Inputs {
            config: "steering.yaml".into(),
            zones: "zones".into(),
            geo: "geo/country.mmdb".into(),
            probes: "probes".into(),
            asn: None,
            api_tokens: None,
        }
    }
}

/// All inputs, loaded and validated together.
pub struct Loaded {
    pub policy: Policy,
    pub zones: Zones,
    pub geo: Arc<GeoDb>,
    /// Health checks; empty when `probes/` is absent.
    pub probes: Probes,
    /// The API's scoped tokens (`--api-tokens`); empty without the file.
    pub tokens: Tokens,
    /// DNSSEC keys and settings (`dnssec:` in the policy), and what they sign.
    pub dnssec: Option<Arc<Dnssec>>,
    /// A short hash of every input file: which configuration this is.
    pub version: String,
    /// The geo database with the file stamps it was read at, for the reloads to start
    /// from: the first policy edit after start then does not read the database again.
    pub geo_cache: GeoCache,
    /// Warnings from every file (the load succeeded).
    pub warnings: Issues,
}

/// Loads and validates the policy, the zones and the geo database; reports the problems
/// of all three at once.
pub fn load(inputs: &Inputs) -> Result<Loaded, Issues> {
    load_cached(inputs, &mut GeoCache::default())
}

/// The geo database last loaded, reused while its file keeps its path, size and
/// modification time: a policy edit then does not re-read and re-walk megabytes of
/// database (nor churn that much memory) on every reload.
#[derive(Clone, Default)]
pub struct GeoCache(Option<(Stamps, Arc<GeoDb>)>);

/// Path, size and modification time of the geo database and of the ASN database.
type Stamps = Vec<(PathBuf, Option<(u64, SystemTime)>)>;

impl GeoCache {
    fn open(&mut self, path: &Path, asn: Option<&Path>) -> Result<Arc<GeoDb>, GeoError> {
        let stamp = |p: &Path| {
            let m = std::fs::metadata(p).ok()?;
            Some((m.len(), m.modified().ok()?))
        };
        let stamps: Stamps = std::iter::once(path)
            .chain(asn)
            .map(|p| (p.to_path_buf(), stamp(p)))
            .collect();
        if let Some((s, geo)) = &self.0 {
            if *s == stamps && stamps.iter().all(|(_, t)| t.is_some()) {
                return Ok(geo.clone());
            }
        }
        let mut geo = GeoDb::open(path)?;
        if let Some(asn) = asn {
            geo = geo.with_asn(AsnDb::open(asn)?);
        }
        let geo = Arc::new(geo);
        self.0 = Some((stamps, geo.clone()));
        Ok(geo)
    }
}

/// As [`load`], reusing the geo database of `cache` when its file is unchanged.
pub fn load_cached(inputs: &Inputs, cache: &mut GeoCache) -> Result<Loaded, Issues> {
    load_with(inputs, cache, None, false)
}

/// A policy given as text instead of the policy file: a version of the set's store,
/// or a `POST /v1/policy` body. `origin` names it in messages (`file:line: field`).
#[derive(Clone, Debug)]
pub struct PolicyText {
    pub origin: PathBuf,
    pub text: Arc<str>,
}

/// As [`load_cached`], with `policy` (when given) in place of the policy file: every
/// other input is this node's own, so a version of the set is checked against this
/// node's zones, geo database and probes before it is served.
///
/// `places_agree`: the node is one of a set of several (`--etcd`), whose nodes must
/// place clients alike: a version naming a place this node's geo database has no
/// network in is refused ([`config::check_against_places`]).
pub fn load_with(
    inputs: &Inputs,
    cache: &mut GeoCache,
    policy: Option<&PolicyText>,
    places_agree: bool,
) -> Result<Loaded, Issues> {
    let mut issues = Issues::default();
    let as_version = policy.is_some() && places_agree;
    let policy = match policy {
        None => config::load(&inputs.config),
        Some(p) => config::parse(&p.origin, p.text.to_string()),
    }
    .map_err(|e| issues.extend(e))
    .ok();
    let zones = Zones::load(&inputs.zones)
        .map_err(|e| issues.extend(e))
        .ok();
    let geo = cache
        .open(&inputs.geo, inputs.asn.as_deref())
        .map_err(|e| issues.push(ConfigIssue::error(&e.path, None, "", e.reason.to_string())))
        .ok();
    let (Some((policy, warnings)), Some((zones, zone_warnings)), Some(geo)) = (policy, zones, geo)
    else {
        return Err(issues);
    };
    issues.extend(warnings);
    issues.extend(zone_warnings);
    issues.extend(config::check_against_zones(&policy, &zones));
    if inputs.asn.is_none() {
        issues.extend(config::check_without_asn(&policy));
    }
    issues.extend(config::check_against_places(
        &policy,
        geo.places(),
        as_version,
    ));
    let cdns: Vec<&str> = policy
        .hosts
        .iter()
        .flat_map(|h| h.cdns.iter().map(|c| c.name.as_str()))
        .collect();
    let probes = match probes::load_dir(&inputs.probes, Some(&cdns)) {
        Ok((p, warnings)) => {
            issues.extend(warnings);
            let vantages = 1 + p.vantages.len() as u32;
            for spec in p.specs.iter().filter(|s| s.quorum > vantages) {
                issues.push(ConfigIssue::warning(
                    &spec.file,
                    None,
                    "quorum",
                    format!("quorum {} but only {vantages} vantage point(s) configured: all of them must agree", spec.quorum),
                ));
            }
            p
        }
        Err(e) => {
            issues.extend(e);
            Probes::default()
        }
    };
    let tokens = match &inputs.api_tokens {
        Some(path) => tokens::load(path)
            .map_err(|e| issues.extend(e))
            .unwrap_or_default(),
        None => Tokens::default(),
    };
    let dnssec = match Signing::load(&policy, &zones) {
        Ok(Some(signing)) => match signing.sign(&policy, &zones, crate::clock::now_secs()) {
            Ok(signed) => Some(Arc::new(Dnssec::new(signing, signed))),
            Err(e) => {
                issues.push(ConfigIssue::error(
                    &signing.settings.keys,
                    None,
                    "",
                    format!("cannot sign: {e}"),
                ));
                None
            }
        },
        Ok(None) => None,
        Err(e) => {
            issues.extend(e);
            None
        }
    };
    if issues.has_errors() {
        return Err(issues);
    }
    Ok(Loaded {
        policy,
        zones,
        dnssec,
        geo,
        probes,
        tokens,
        version: version(inputs),
        geo_cache: cache.clone(),
        warnings: issues,
    })
}

/// Loads the inputs with a policy of the caller's (the reload task, the admin API's
/// `POST /v1/policy`): one geo database cache for both.
#[derive(Clone)]
pub struct Checker {
    pub inputs: Inputs,
    pub cache: Arc<std::sync::Mutex<GeoCache>>,
    /// One of a set of several nodes: see [`load_with`]'s `places_agree`.
    pub places_agree: bool,
}

impl Checker {
    pub fn new(inputs: Inputs, cache: GeoCache) -> Checker {
        Checker {
            inputs,
            cache: Arc::new(std::sync::Mutex::new(cache)),
            places_agree: false,
        }
    }

    /// As one of a set of several nodes: a version naming a place this node's geo
    /// database has no network in is refused.
    pub fn in_a_set(mut self, yes: bool) -> Checker {
        self.places_agree = yes;
        self
    }

    /// [`load_with`], off the async runtime (walking a geo database takes tens of
    /// milliseconds).
    pub async fn load(&self, policy: Option<PolicyText>) -> Result<Loaded, Issues> {
        let me = self.clone();
        let load = move || {
            let mut cache = me.cache.lock().unwrap_or_else(|p| p.into_inner());
            load_with(&me.inputs, &mut cache, policy.as_ref(), me.places_agree)
        };
        match tokio::task::spawn_blocking(load).await {
            Ok(r) => r,
            Err(e) => Err(Issues(vec![ConfigIssue::error(
                &self.inputs.config,
                None,
                "",
                format!("the load failed: {e}"),
            )])),
        }
    }
}

/// (path, size, modification time) of every input file, in a stable order.
pub type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>)>;

pub fn fingerprint(inputs: &Inputs) -> Fingerprint {
    fingerprint_with(inputs, None)
}

/// As [`fingerprint`], with the files of the DNSSEC key directory `keys` (a new or
/// rolled key is taken without a SIGHUP; the keys are not in [`version`]).
pub fn fingerprint_with(inputs: &Inputs, keys: Option<&Path>) -> Fingerprint {
    let mut files = vec![inputs.config.clone(), inputs.geo.clone()];
    files.extend(inputs.asn.clone());
    files.extend(inputs.api_tokens.clone());
    for dir in [inputs.zones.as_path(), inputs.probes.as_path()]
        .into_iter()
        .chain(keys)
    {
        if let Ok(entries) = std::fs::read_dir(dir) {
            files.extend(
                entries
                    .filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.is_file()),
            );
        }
    }
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let meta = std::fs::metadata(&p).ok();
            let (len, mtime) = meta.map_or((u64::MAX, None), |m| (m.len(), m.modified().ok()));
            (p, len, mtime)
        })
        .collect()
}

/// A short version of the inputs' contents (FNV-1a over every file), to tell which
/// configuration is loaded.
pub fn version(inputs: &Inputs) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut add = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    // The files are read in pieces: a whole geo database (8 MB) read into memory on
    // every reload was the largest allocation of a policy edit.
    let mut piece = vec![0; 64 << 10];
    for (path, _, _) in fingerprint(inputs) {
        add(&path_bytes(&path));
        let Ok(mut file) = std::fs::File::open(&path) else {
            continue;
        };
        loop {
            match file.read(&mut piece) {
                Ok(0) => break,
                Ok(n) => add(&piece[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }
    format!("{hash:016x}")
}

fn path_bytes(p: &Path) -> Vec<u8> {
    p.to_string_lossy().as_bytes().to_vec()
}

/// The repository's demo inputs loaded (`steering.yaml`, `zones/`, the country
/// database, no probes), for unit tests.
#[cfg(test)]
pub fn demo() -> Loaded {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    load(&Inputs {
        config: repo.join("steering.yaml"),
        zones: repo.join("zones"),
        geo: repo.join("geo/country.mmdb"),
        probes: repo.join("tests/fixtures/no-probes"),
        asn: None,
        api_tokens: None,
    })
    .expect("the demo inputs load")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_geo_cache_reuses_an_unchanged_file_and_rereads_a_changed_one() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = std::env::temp_dir().join(format!("steerdns-geocache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("geo.mmdb");
        let country = root.join("tests/fixtures/geo/GeoIP2-Country-Test.mmdb");
        let city = root.join("tests/fixtures/geo/GeoIP2-City-Test.mmdb");
        std::fs::copy(&country, &path).unwrap();
        let mut cache = GeoCache::default();
        let first = cache.open(&path, None).unwrap();
        assert!(
            Arc::ptr_eq(&first, &cache.open(&path, None).unwrap()),
            "re-read"
        );
        std::fs::copy(&city, &path).unwrap();
        let second = cache.open(&path, None).unwrap();
        assert!(
            !Arc::ptr_eq(&first, &second),
            "a changed file was not re-read"
        );
        assert_eq!(second.database_type(), "GeoIP2-City");
        std::fs::write(&path, b"garbage").unwrap();
        assert!(cache.open(&path, None).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
