//! The wall clock, and the only door to it: `.clippy.toml` forbids
//! `SystemTime::now` everywhere else, so that every reading of the clock is found here
//! (the nodes of a set agree on it through NTP; `faketime` tests move it).
//!
//! Durations and timeouts use the monotonic clock (`tokio::time::Instant`) instead.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Now, as the wall clock says.
#[allow(clippy::disallowed_methods)]
pub fn now() -> SystemTime {
    SystemTime::now()
}

/// `t` in Unix ms; 0 before 1970 (never panics).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Now, in Unix ms.
pub fn now_ms() -> u64 {
    unix_ms(now())
}

/// Now, in Unix seconds (what the selection window and DNSSEC times count in).
pub fn now_secs() -> u64 {
    now_ms() / 1000
}

/// The latest time RFC 3339 can write (Unix ms): 9999-12-31T23:59:59.999Z.
pub const MAX_TIME_MS: u64 = 253_402_300_799_999;

/// `ms` (Unix ms) as an RFC 3339 time to the second, UTC. Never panics: a time past
/// [`MAX_TIME_MS`] is shown as "after 9999-12-31T23:59:59Z".
pub fn rfc3339(ms: u64) -> String {
    if ms > MAX_TIME_MS {
        return "after 9999-12-31T23:59:59Z".into();
    }
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}
