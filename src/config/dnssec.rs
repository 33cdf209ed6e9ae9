//! Input: the `dnssec:` block of `steering.yaml`: where the zone keys are and how long
//! signatures last. The keys themselves are files (`steerdns dnssec keygen`), read by
//! `crate::dnssec`.
//!
//! ```yaml
//! dnssec:
//!   keys: keys/          # directory of key files, relative to steering.yaml
//!   validity: 14d        # signature lifetime (default 14d)
//!   refresh: 7d          # re-sign when less than this remains (default 7d)
//!   dnskey_ttl: 3600     # TTL of DNSKEY, CDS and CDNSKEY (default 3600)
//!   rollover:            # how `steerdns dnssec rollover` times a CSK rollover
//!     every: 90d         # a key signs this long before its successor takes over
//!     propagation: 1h    # a change reaches every node, secondary and cache (Dprp)
//!     ds_ttl: 1d         # the TTL of the parent's DS set
//!     parent_delay: 2d   # the parent puts a new DS in within this (Dreg)
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::locate::{self, Seg};
use crate::error::{ConfigIssue, Issues};

/// The validated `dnssec:` block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnssecSettings {
    /// The key directory, resolved against the policy file's directory.
    pub keys: PathBuf,
    /// How long a signature is valid from the start of its window.
    pub validity: Duration,
    /// Signatures are replaced when less than this remains.
    pub refresh: Duration,
    /// TTL of DNSKEY, CDS and CDNSKEY records.
    pub dnskey_ttl: u32,
    /// The timings of a key rollover (every key in the block has a default).
    pub rollover: RolloverSettings,
}

/// The `rollover:` block: the RFC 7583 inputs of a CSK rollover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RolloverSettings {
    /// How long a key signs before its successor takes over.
    pub every: Duration,
    /// How long a change takes to reach every node, secondary and resolver (Dprp).
    pub propagation: Duration,
    /// The TTL of the parent's DS set (TTLds).
    pub ds_ttl: Duration,
    /// How long the parent takes to put a new DS in once the CDS asks, or once the
    /// operator submits it (Dreg).
    pub parent_delay: Duration,
}

impl Default for RolloverSettings {
    fn default() -> RolloverSettings {
        RolloverSettings {
            every: Duration::from_secs(90 * 86_400),
            propagation: Duration::from_secs(3600),
            ds_ttl: Duration::from_secs(86_400),
            parent_delay: Duration::from_secs(2 * 86_400),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRollover {
    every: Option<String>,
    propagation: Option<String>,
    ds_ttl: Option<String>,
    parent_delay: Option<String>,
}

impl DnssecSettings {
    pub const DEFAULT_VALIDITY: Duration = Duration::from_secs(14 * 86_400);
    pub const DEFAULT_REFRESH: Duration = Duration::from_secs(7 * 86_400);
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDnssec {
    keys: Option<String>,
    validity: Option<String>,
    refresh: Option<String>,
    dnskey_ttl: Option<i64>,
    rollover: Option<RawRollover>,
}

/// Validates the block; every problem with its line and field.
pub(super) fn validate(
    file: &Path,
    source: &str,
    raw: RawDnssec,
    issues: &mut Issues,
) -> Option<DnssecSettings> {
    let mut error = |field: &str, msg: String| {
        let mut path = vec![Seg::Key("dnssec".into())];
        path.extend(
            field
                .split('.')
                .filter(|f| !f.is_empty())
                .map(|f| Seg::Key(f.into())),
        );
        let path = &path[..];
        issues.push(ConfigIssue::error(
            file,
            locate::line_of(source, path),
            locate::render(path),
            msg,
        ));
    };
    let keys = match raw.keys.as_deref() {
        None | Some("") => {
            error(
                "",
                "`keys:` (the directory of the zone's key files) is required".into(),
            );
            None
        }
        Some(k) => Some(file.parent().unwrap_or(Path::new(".")).join(k)),
    };
    let mut duration = |field: &str, v: Option<&str>, default: Duration| match v {
        None => Some(default),
        Some(text) => match humantime::parse_duration(text) {
            Ok(d) if d >= Duration::from_secs(60) => Some(d),
            Ok(_) => {
                error(field, format!("`{text}` is shorter than a minute"));
                None
            }
            Err(e) => {
                error(field, format!("`{text}` is not a duration (14d, 36h): {e}"));
                None
            }
        },
    };
    let validity = duration(
        "validity",
        raw.validity.as_deref(),
        DnssecSettings::DEFAULT_VALIDITY,
    );
    let refresh = duration(
        "refresh",
        raw.refresh.as_deref(),
        DnssecSettings::DEFAULT_REFRESH,
    );
    if let (Some(v), Some(r)) = (validity, refresh) {
        if r >= v {
            error(
                "refresh",
                format!(
                    "refresh ({}) must be shorter than validity ({}): signatures are replaced when less than `refresh` remains",
                    humantime::format_duration(r),
                    humantime::format_duration(v)
                ),
            );
        }
    }
    let dnskey_ttl = match raw.dnskey_ttl {
        None => Some(3600),
        Some(t) if (1..=86_400).contains(&t) => Some(t as u32),
        Some(t) => {
            error("dnskey_ttl", format!("{t} is not 1 to 86400 seconds"));
            None
        }
    };
    let rollover = {
        let raw = raw.rollover.unwrap_or(RawRollover {
            every: None,
            propagation: None,
            ds_ttl: None,
            parent_delay: None,
        });
        let d = RolloverSettings::default();
        // Seconds are allowed, for rehearsals at an accelerated schedule.
        let mut timing = |field: &str, v: Option<&str>, default: Duration| match v {
            None => Some(default),
            Some(text) => match humantime::parse_duration(text) {
                Ok(t) if t >= Duration::from_secs(1) => Some(t),
                Ok(_) => {
                    error(
                        &format!("rollover.{field}"),
                        format!("`{text}` is shorter than a second"),
                    );
                    None
                }
                Err(e) => {
                    error(
                        &format!("rollover.{field}"),
                        format!("`{text}` is not a duration (90d, 1h, 30s): {e}"),
                    );
                    None
                }
            },
        };
        let every = timing("every", raw.every.as_deref(), d.every);
        let propagation = timing("propagation", raw.propagation.as_deref(), d.propagation);
        let ds_ttl = timing("ds_ttl", raw.ds_ttl.as_deref(), d.ds_ttl);
        let parent_delay = timing("parent_delay", raw.parent_delay.as_deref(), d.parent_delay);
        match (every, propagation, ds_ttl, parent_delay) {
            (Some(every), Some(propagation), Some(ds_ttl), Some(parent_delay)) => {
                Some(RolloverSettings {
                    every,
                    propagation,
                    ds_ttl,
                    parent_delay,
                })
            }
            _ => None,
        }
    };
    Some(DnssecSettings {
        rollover: rollover?,
        keys: keys?,
        validity: validity?,
        refresh: refresh.filter(|r| Some(*r) < validity)?,
        dnskey_ttl: dnskey_ttl?,
    })
}
