//! Control plane: the times that enter from outside (a drain's `until` or
//! `ttl_seconds`, a saved state, an etcd record) and how they are shown.
//!
//! Every such time is at most [`MAX_TIME_MS`], 9999-12-31T23:59:59.999Z, the last one
//! RFC 3339 can write: the API refuses a later one with a `400`, and a saved state or
//! an etcd record holding one is refused as malformed when read ([`bounded`],
//! [`bounded_opt`]). [`rfc3339`] shows any `u64` without panicking, bound or not, so
//! no page or report can fail on a time however it got in.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

pub use crate::clock::{rfc3339, MAX_TIME_MS};

/// What is said of a time past [`MAX_TIME_MS`].
pub const TOO_LATE: &str = "after 9999-12-31T23:59:59Z, the last time RFC 3339 can write";

/// How far ahead of a node's clock an evaluation of a set (a commit bias, a
/// performance shift) may be and still be taken, besides one of its periods: the
/// clock skew a set tolerates.
pub const AHEAD_MS: u64 = 60_000;

/// Whether a set's evaluation at `at_ms`, made every `period_ms`, is further ahead of
/// `now_ms` than a period and [`AHEAD_MS`]: from a clock far ahead, or written by
/// hand. It is not taken, and the next evaluation writes over it. (With one period
/// alone, a node whose clock is 2 s behind a set evaluating every 0.5 s would refuse
/// each of the set's evaluations and write over them.)
pub fn far_ahead(at_ms: u64, period_ms: u64, now_ms: u64) -> bool {
    at_ms > now_ms.saturating_add(period_ms.max(AHEAD_MS))
}

/// Deserializes a Unix time in ms, refusing one past [`MAX_TIME_MS`].
pub fn bounded<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let ms = u64::deserialize(d)?;
    if ms > MAX_TIME_MS {
        return Err(D::Error::custom(format!("{ms} ms is {TOO_LATE}")));
    }
    Ok(ms)
}

/// As [`bounded`], for an optional time.
pub fn bounded_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match Option::<u64>::deserialize(d)? {
        Some(ms) if ms > MAX_TIME_MS => Err(D::Error::custom(format!("{ms} ms is {TOO_LATE}"))),
        t => Ok(t),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_time_can_be_shown() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(MAX_TIME_MS), "9999-12-31T23:59:59Z");
        assert!(rfc3339(MAX_TIME_MS + 1).starts_with("after 9999"));
        assert!(rfc3339(u64::MAX).starts_with("after 9999"));
    }

    #[derive(Deserialize)]
    struct T {
        #[serde(deserialize_with = "bounded")]
        at: u64,
        #[serde(default, deserialize_with = "bounded_opt")]
        until: Option<u64>,
    }

    #[test]
    fn times_past_the_bound_are_refused_when_read() {
        let ok: T = serde_json::from_str(r#"{"at": 253402300799999}"#).unwrap();
        assert_eq!((ok.at, ok.until), (MAX_TIME_MS, None));
        let err = serde_json::from_str::<T>(r#"{"at": 1, "until": 300000000000000}"#)
            .err()
            .unwrap();
        assert!(err.to_string().contains("after 9999-12-31"), "{err}");
        assert!(serde_json::from_str::<T>(r#"{"at": 18446744073709551615}"#).is_err());
    }
}
