//! Control plane, pure: what a policy edit changes, as people read it (`steerdns
//! diff`'s output): a line per name and per region, percents as people read them.

use super::model::{Moved, NameDiff, PolicyDiff, Presence};
use super::{SOURCE_V4, SOURCE_V6};

/// A percent as people read it: `90`, `33.3`, `0.02`.
fn pct(p: f64) -> String {
    let s = if p != 0.0 && p.abs() < 0.1 {
        format!("{p:.2}")
    } else {
        format!("{p:.1}")
    };
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s} %")
}

impl std::fmt::Display for Moved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({} of {} networks)",
            pct(self.changed_percent),
            self.changed_networks,
            self.networks
        )
    }
}

impl std::fmt::Display for PolicyDiff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} ({}) → {} ({}), asked through {} with ECS /{SOURCE_V4} and /{SOURCE_V6} at {}",
            self.old.file,
            self.old.version,
            self.new.file,
            self.new.version,
            self.resolver,
            crate::clock::rfc3339(self.at.saturating_mul(1000)),
        )?;
        let recorded = self.traffic.file.is_some();
        match (&self.traffic.file, self.traffic.saved_unix_ms) {
            (Some(file), Some(ms)) => writeln!(
                f,
                "recorded traffic: {} samples by source network ({}), saved {} in {file}; answers change also weighed by it",
                self.traffic.samples,
                self.traffic.note,
                crate::clock::rfc3339(ms),
            )?,
            _ => writeln!(
                f,
                "recorded traffic: none: {}; networks weighed by address space alone",
                self.traffic.note
            )?,
        }
        for n in &self.names_added {
            writeln!(f, "name added: {n}")?;
        }
        for n in &self.names_removed {
            writeln!(f, "name removed: {n}")?;
        }
        for n in &self.names {
            write!(f, "{}", Lines(n, recorded))?;
        }
        if self.changes_answers {
            writeln!(f, "answers change")
        } else {
            writeln!(f, "every answer alike")
        }
    }
}

/// The traffic figure of a line: `; traffic 50 % (12 of 24 samples)`, `; no recorded
/// traffic`, or nothing when no traffic was read at all.
fn traffic(samples: u64, changed: u64, percent: Option<f64>, recorded: bool) -> String {
    match percent {
        Some(p) => format!("; traffic {} ({changed} of {samples} samples)", pct(p)),
        None if recorded => "; no recorded traffic".to_string(),
        None => String::new(),
    }
}

/// A name's lines, saying whether recorded traffic was read.
struct Lines<'a>(&'a NameDiff, bool);

impl std::fmt::Display for NameDiff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", Lines(self, self.traffic_samples > 0))
    }
}

impl std::fmt::Display for Lines<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Lines(n, recorded) = *self;
        writeln!(
            f,
            "{}: answers change: IPv4 {}, IPv6 {}{}",
            n.name,
            n.ipv4,
            n.ipv6,
            traffic(
                n.traffic_samples,
                n.traffic_changed_samples,
                n.traffic_changed_percent,
                recorded
            ),
        )?;
        for c in &n.cdns_added {
            writeln!(f, "  cdn added: {c}")?;
        }
        for c in &n.cdns_removed {
            writeln!(f, "  cdn removed: {c}")?;
        }
        for s in &n.settings {
            writeln!(f, "  {}: {} → {}", s.field, s.before, s.after)?;
        }
        for r in &n.regions {
            let shares: Vec<String> = r
                .shares
                .iter()
                .map(|s| match (s.before, s.after) {
                    (Some(a), Some(b)) if (a - b).abs() < 1e-9 => format!("{} {}", s.cdn, pct(a)),
                    (a, b) => {
                        let show = |p: Option<f64>| p.map_or_else(|| "-".to_string(), pct);
                        format!("{} {} → {}", s.cdn, show(a), show(b))
                    }
                })
                .collect();
            let presence = match r.presence {
                Presence::Both => "",
                Presence::Added => " (added)",
                Presence::Removed => " (removed)",
            };
            writeln!(
                f,
                "  region {}{presence}: {}; answers change: IPv4 {}, IPv6 {}{}",
                r.region,
                shares.join(", "),
                r.ipv4,
                r.ipv6,
                traffic(
                    r.traffic_samples,
                    r.traffic_changed_samples,
                    r.traffic_changed_percent,
                    recorded
                ),
            )?;
            if let Some(e) = r.examples.iter().find(|e| e.changed) {
                writeln!(f, "    e.g. {}: {} → {}", e.network, e.before, e.after)?;
            }
        }
        Ok(())
    }
}
