//! Control plane, commit steering: a usage record as it comes in (`POST /v1/usage`,
//! the usage feed, `steerdns simulate`'s demand) and its checks ([`UsageIn::check`]),
//! with why one is refused ([`UsageError`]); what is kept of it is the ledger's.

use serde::Deserialize;

use super::ledger::Record;

/// A usage record as `POST /v1/usage` takes it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageIn {
    pub cdn: String,
    /// RFC 3339.
    pub start: String,
    pub seconds: f64,
    pub bytes: Option<f64>,
    pub mbps: Option<f64>,
}

/// Why a usage record is refused (`POST /v1/usage`, the usage feed).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum UsageError {
    /// `start` is not an RFC 3339 time.
    #[error("start `{start}`: {error} (RFC 3339, e.g. 2026-12-01T10:00:00Z)")]
    Start {
        start: String,
        error: humantime::TimestampError,
    },
    /// `start` is before the Unix epoch.
    #[error("start `{0}` is before 1970")]
    BeforeEpoch(String),
    /// `start` is past the largest time kept.
    #[error("start `{0}` is after 9999")]
    AfterMax(String),
    /// `seconds` is not a whole number of seconds up to a day.
    #[error("seconds {0} is not a whole 1 to 86400")]
    Seconds(f64),
    /// Both `bytes` and `mbps`.
    #[error("give `bytes` or `mbps`, not both")]
    BothAmounts,
    /// Neither `bytes` nor `mbps`.
    #[error("missing `bytes` (or `mbps`)")]
    NoAmount,
    /// `bytes` out of range.
    #[error("bytes {0} is not 0 to 1e18")]
    Bytes(f64),
    /// `mbps` out of range.
    #[error("mbps {0} is not 0 to 1e9")]
    Mbps(f64),
    /// `cdn` empty or too long.
    #[error("`cdn` must be 1 to 64 characters")]
    CdnLength,
    /// No steered name has that CDN.
    #[error("unknown CDN `{0}`")]
    UnknownCdn(String),
}

impl UsageIn {
    /// Checked: (cdn, start in Unix ms, record); `Err` says what is wrong.
    pub fn check(&self) -> Result<(String, u64, Record), UsageError> {
        let start = humantime::parse_rfc3339(&self.start)
            .map_err(|error| UsageError::Start {
                start: self.start.clone(),
                error,
            })?
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| UsageError::BeforeEpoch(self.start.clone()))?
            .as_millis() as u64;
        if start > crate::control::decide::times::MAX_TIME_MS {
            return Err(UsageError::AfterMax(self.start.clone()));
        }
        if !(self.seconds.is_finite() && self.seconds >= 1.0 && self.seconds <= 86_400.0)
            || self.seconds.fract() != 0.0
        {
            return Err(UsageError::Seconds(self.seconds));
        }
        let seconds = self.seconds as u32;
        let bytes = match (self.bytes, self.mbps) {
            (Some(b), None) if b.is_finite() && (0.0..=1e18).contains(&b) => b,
            (None, Some(m)) if m.is_finite() && (0.0..=1e9).contains(&m) => {
                m * 1e6 / 8.0 * f64::from(seconds)
            }
            (Some(_), Some(_)) => return Err(UsageError::BothAmounts),
            (None, None) => return Err(UsageError::NoAmount),
            (Some(b), None) => return Err(UsageError::Bytes(b)),
            (None, Some(m)) => return Err(UsageError::Mbps(m)),
        };
        if self.cdn.is_empty() || self.cdn.len() > 64 {
            return Err(UsageError::CdnLength);
        }
        Ok((self.cdn.clone(), start, Record { seconds, bytes }))
    }
}
