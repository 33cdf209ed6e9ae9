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
}

/// Validates the block; every problem with its line and field.
pub(super) fn validate(
    file: &Path,
    source: &str,
    raw: RawDnssec,
    issues: &mut Issues,
) -> Option<DnssecSettings> {
    let mut error = |field: &str, msg: String| {
        let path = [Seg::Key("dnssec".into()), Seg::Key(field.into())];
        let path = if field.is_empty() {
            &path[..1]
        } else {
            &path[..]
        };
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
    Some(DnssecSettings {
        keys: keys?,
        validity: validity?,
        refresh: refresh.filter(|r| Some(*r) < validity)?,
        dnskey_ttl: dnskey_ttl?,
    })
}
