//! Pure: demand for `steerdns simulate`, five-minute rows of a region's traffic.
//!
//! The file is CSV with a header naming its unit, one row per (five minutes, region):
//!
//! ```text
//! start,region,mbps
//! 2026-12-01T00:00:00Z,gb,5200
//! 2026-12-01T00:00:00Z,default,800
//! ```
//!
//! (or `start,region,bytes`: the bytes of the five minutes). `region` is a region's
//! `name:` in the policy (or `default` for an unnamed `"*"`). [`generate`] makes such demand for tests and drills: a daily cycle, a
//! weekend dip and a launch spike.

use std::collections::BTreeMap;

/// One row: five minutes of a region's traffic.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub start_ms: u64,
    pub region: String,
    pub mbps: f64,
}

/// Five minutes.
pub const SLOT_MS: u64 = 300_000;

/// Parses a demand file's text; `Err` names the line and what is wrong.
pub fn parse(text: &str) -> Result<Vec<Row>, String> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
    let Some((_, header)) = lines.next() else {
        return Err("empty: expected a header `start,region,mbps` (or bytes)".into());
    };
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let bytes = match cols.as_slice() {
        ["start", "region", "mbps"] => false,
        ["start", "region", "bytes"] => true,
        _ => {
            return Err(format!(
                "line 1: header `{header}`: expected `start,region,mbps` or `start,region,bytes`"
            ))
        }
    };
    let mut out = Vec::new();
    for (i, line) in lines {
        let n = i + 1;
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let [start, region, value] = f.as_slice() else {
            return Err(format!("line {n}: expected 3 fields, found {}", f.len()));
        };
        let start_ms = humantime::parse_rfc3339(start)
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64)
            .ok_or_else(|| format!("line {n}: start `{start}` is not an RFC 3339 time"))?;
        if start_ms % SLOT_MS != 0 {
            return Err(format!(
                "line {n}: start `{start}` is not on a five-minute boundary"
            ));
        }
        let v: f64 = value
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| format!("line {n}: `{value}` is not a number of 0 or more"))?;
        let mbps = if bytes { v * 8.0 / 300.0 / 1e6 } else { v };
        if region.is_empty() {
            return Err(format!("line {n}: empty region"));
        }
        out.push(Row {
            start_ms,
            region: region.to_string(),
            mbps,
        });
    }
    if out.is_empty() {
        return Err("no rows after the header".into());
    }
    out.sort_by_key(|r| r.start_ms);
    Ok(out)
}

/// The rows as a demand file (`start,region,mbps`).
pub fn to_csv(rows: &[Row]) -> String {
    let mut s = String::from("start,region,mbps\n");
    for r in rows {
        s.push_str(&format!(
            "{},{},{:.3}\n",
            crate::control::decide::times::rfc3339(r.start_ms),
            r.region,
            r.mbps
        ));
    }
    s
}

/// How [`generate`] shapes demand.
#[derive(Clone, Debug)]
pub struct Shape {
    /// The first five minutes (Unix ms, on a five-minute boundary).
    pub start_ms: u64,
    pub days: u32,
    /// Each region's peak on a weekday, Mbit/s.
    pub regions: Vec<(String, f64)>,
    /// The night's low as a part of the peak (the daily cycle).
    pub trough: f64,
    /// Saturdays and Sundays as a part of a weekday.
    pub weekend: f64,
    /// A launch: (its start, Unix ms; hours; demand multiplied by).
    pub spike: Option<(u64, f64, f64)>,
}

impl Shape {
    /// A month from `start_ms` for `regions`: the night at 40 % of the evening peak,
    /// weekends at 70 %, no spike.
    pub fn month(start_ms: u64, days: u32, regions: &[(&str, f64)]) -> Shape {
        Shape {
            start_ms,
            days,
            regions: regions.iter().map(|(r, m)| (r.to_string(), *m)).collect(),
            trough: 0.4,
            weekend: 0.7,
            spike: None,
        }
    }
}

/// Demand of the given shape: the peak at 20:00 UTC, the low at 08:00.
pub fn generate(shape: &Shape) -> Vec<Row> {
    let slots = u64::from(shape.days) * 288;
    let mut out = Vec::with_capacity((slots as usize) * shape.regions.len());
    for i in 0..slots {
        let t = shape.start_ms + i * SLOT_MS;
        let hour = (t % 86_400_000) as f64 / 3_600_000.0;
        let cycle = (1.0 + (std::f64::consts::TAU * (hour - 20.0) / 24.0).cos()) / 2.0;
        let mut k = shape.trough + (1.0 - shape.trough) * cycle;
        // 1970-01-01 was a Thursday: day 2 is a Saturday.
        let weekday = (t / 86_400_000 + 4) % 7;
        if weekday == 0 || weekday == 6 {
            k *= shape.weekend;
        }
        if let Some((at, hours, times)) = shape.spike {
            if t >= at && ((t - at) as f64) < hours * 3_600_000.0 {
                k *= times;
            }
        }
        for (region, peak) in &shape.regions {
            out.push(Row {
                start_ms: t,
                region: region.clone(),
                mbps: peak * k,
            });
        }
    }
    out
}

/// Mbit/s per slot start, by region.
pub fn by_slot(rows: &[Row]) -> BTreeMap<u64, Vec<(&str, f64)>> {
    let mut out: BTreeMap<u64, Vec<(&str, f64)>> = BTreeMap::new();
    for r in rows {
        out.entry(r.start_ms)
            .or_default()
            .push((r.region.as_str(), r.mbps));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEC: u64 = 1_796_083_200_000; // a Tuesday

    #[test]
    fn generated_demand_has_a_cycle_a_weekend_and_a_spike() {
        let mut shape = Shape::month(DEC, 7, &[("gb", 1000.0)]);
        shape.spike = Some((DEC + 86_400_000 + 20 * 3_600_000, 2.0, 3.0));
        let rows = generate(&shape);
        assert_eq!(rows.len(), 7 * 288);
        let at = |day: u64, hour: u64| rows[(day * 288 + hour * 12) as usize].mbps;
        assert!((at(0, 20) - 1000.0).abs() < 1e-6);
        assert!((at(0, 8) - 400.0).abs() < 1e-6);
        // Saturday the 5th.
        assert!((at(4, 20) - 700.0).abs() < 1e-6);
        assert!((at(1, 20) - 3000.0).abs() < 1e-6);
        assert!((at(1, 22) - at(0, 22)).abs() < 1e-6);
    }

    #[test]
    fn the_file_round_trips_and_bad_rows_are_named() {
        let rows = generate(&Shape::month(DEC, 1, &[("gb", 1000.0), ("default", 10.0)]));
        let back = parse(&to_csv(&rows)).unwrap();
        assert_eq!(back.len(), rows.len());
        assert!((back[5].mbps - rows[5].mbps).abs() < 1e-3);
        let bytes = parse("start,region,bytes\n2026-12-01T00:00:00Z,gb,37500000\n").unwrap();
        assert!((bytes[0].mbps - 1.0).abs() < 1e-9);
        let e = parse("start,region,gbps\n").unwrap_err();
        assert!(e.contains("line 1"), "{e}");
        let e = parse("start,region,mbps\n2026-12-01T00:00:00Z,gb,-3\n").unwrap_err();
        assert!(e.contains("line 2: `-3`"), "{e}");
        let e = parse("start,region,mbps\n2026-12-01T00:01:00Z,gb,3\n").unwrap_err();
        assert!(e.contains("five-minute"), "{e}");
        let e = parse("start,region,mbps\nyesterday,gb,3\n").unwrap_err();
        assert!(e.contains("line 2: start `yesterday`"), "{e}");
    }
}
