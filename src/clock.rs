//! The wall clock, and the only door to it: `.clippy.toml` forbids
//! `SystemTime::now` everywhere else, so that every reading of the clock is found here
//! (the nodes of a set agree on it through NTP; `faketime` tests move it).
//!
//! Durations and timeouts use the monotonic clock (`tokio::time::Instant`) instead.

use std::time::{SystemTime, UNIX_EPOCH};

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
