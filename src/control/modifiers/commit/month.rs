//! Pure: calendar months in UTC, in Unix milliseconds (a contract's month is the
//! calendar month, 28 to 31 days).

const DAY_MS: u64 = 86_400_000;

/// (year, month 1–12) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m)
}

/// Days since 1970-01-01 of the first of (year, month).
fn days_from_civil(y: i64, m: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from(if m > 2 { m - 3 } else { m + 9 });
    let doy = (153 * mp + 2) / 5;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The calendar month holding a time: its start and end (exclusive), Unix ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Month {
    pub start_ms: u64,
    pub end_ms: u64,
}

impl Month {
    pub fn of(ms: u64) -> Month {
        let days = (ms / DAY_MS) as i64;
        let (y, m) = civil(days);
        let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
        Month {
            start_ms: days_from_civil(y, m) as u64 * DAY_MS,
            end_ms: days_from_civil(ny, nm) as u64 * DAY_MS,
        }
    }

    /// The start of the month before the one holding `ms`: usage from then on counts
    /// (this month's and last month's).
    pub fn last_start(ms: u64) -> u64 {
        Month::of(Month::of(ms).start_ms.saturating_sub(1)).start_ms
    }

    pub fn len_ms(&self) -> u64 {
        self.end_ms - self.start_ms
    }

    /// The free five-minute samples above the cap of 95th-percentile billing: 432 in
    /// a 30-day month, scaled to this month's length (417 in February, 446 in a
    /// 31-day month).
    pub fn burst_allowance(&self) -> u64 {
        self.len_ms() * 432 / (30 * DAY_MS)
    }

    /// The part of the month gone at `ms`, 0 to 1.
    pub fn elapsed(&self, ms: u64) -> f64 {
        (ms.clamp(self.start_ms, self.end_ms) - self.start_ms) as f64 / self.len_ms() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> u64 {
        humantime::parse_rfc3339(s)
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    }

    #[test]
    fn months_have_their_calendar_length() {
        let dec = Month::of(at("2026-12-15T10:00:00Z"));
        assert_eq!(dec.start_ms, at("2026-12-01T00:00:00Z"));
        assert_eq!(dec.end_ms, at("2027-01-01T00:00:00Z"));
        assert_eq!(dec.burst_allowance(), 446);
        let feb = Month::of(at("2028-02-29T23:59:59Z"));
        assert_eq!(feb.start_ms, at("2028-02-01T00:00:00Z"));
        assert_eq!(feb.len_ms(), 29 * DAY_MS);
        assert_eq!(Month::of(at("2027-02-01T00:00:00Z")).burst_allowance(), 403);
        assert_eq!(Month::of(at("2026-11-30T00:00:00Z")).burst_allowance(), 432);
        assert_eq!(Month::of(0).start_ms, 0);
        assert!((dec.elapsed(at("2026-12-16T12:00:00Z")) - 0.5).abs() < 1e-9);
    }
}
