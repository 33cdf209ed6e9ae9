//! `steerdns simulate`: replays five-minute demand (`demand.rs`) through the commit
//! modifier at full speed, with the same code the server runs ([`Commit`]'s
//! `configure`, `record`, `evaluate`, `apply`), and reports per CDN the total against
//! commit and cap, the five-minute samples above a p95 cap, the largest shift of an
//! evaluation, and a chart of the shares (a hand-written SVG).
//!
//! One steered name is simulated (`--name`; by default the first with a contract or a
//! capacity, else the first): each row's region is one of its regions (by name), its
//! traffic split by the region's shares in force, each CDN's five minutes become a
//! usage record, delivered `delay` later.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;

use crate::config::contract::Contract;
use crate::config::Policy;
use crate::control::modifiers::perf::modifier::policy_shares;

use super::bias::Bias;
use super::demand::{by_slot, Row, SLOT_MS};
use super::ledger::Record;
use super::month::Month;
use super::Commit;

/// What to simulate besides the demand.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The controller steers from this time (Unix ms; `None`: the first row): before,
    /// the policy's shares apply as written (a month already under way).
    pub steer_from_ms: Option<u64>,
    /// Usage records arrive this much after their five minutes end.
    pub delay_ms: u64,
    /// (CDN, from, to): performance steering has the CDN outside its band then.
    pub outside_band: Vec<(String, u64, u64)>,
    /// The steered name (`None`: the first with a contract or a capacity, else the
    /// first).
    pub name: Option<String>,
}

/// Why `steerdns simulate` cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// The policy does not load.
    #[error("{0}")]
    Policy(crate::error::Issues),
    /// The demand file cannot be read.
    #[error("{}: cannot read: {source}", path.display())]
    DemandUnreadable {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// The demand file is malformed (`error` names the line).
    #[error("{}: {error}", path.display())]
    Demand {
        path: std::path::PathBuf,
        error: String,
    },
    /// `--start` is not an RFC 3339 time.
    #[error("--start `{0}` is not an RFC 3339 time")]
    Start(String),
    /// `--name` is not a steered name of the policy.
    #[error("`{name}` is not a steered name of the policy ({})", names.join(", "))]
    UnknownName { name: String, names: Vec<String> },
    /// The policy has no steered name.
    #[error("the policy has no steered name")]
    NoName,
    /// A demand row's region is not one of the name's.
    #[error("region `{region}` is not a region of {name} ({})", known.join(", "))]
    UnknownRegion {
        region: String,
        name: String,
        known: Vec<String>,
    },
    /// A usage record is refused (a CDN the name lacks).
    #[error(transparent)]
    Usage(#[from] super::UsageError),
    /// The demand file has no row.
    #[error("no demand")]
    NoDemand,
    /// The SVG cannot be written.
    #[error("{}: cannot write: {source}", path.display())]
    SvgUnwritable {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// The index of the name to simulate.
fn pick(policy: &Policy, name: Option<&str>) -> Result<usize, SimulateError> {
    let hosts = &policy.hosts;
    let found = match name {
        Some(want) => {
            let want = want.trim_end_matches('.');
            hosts.iter().position(|h| {
                h.name
                    .to_string()
                    .trim_end_matches('.')
                    .eq_ignore_ascii_case(want)
            })
        }
        None => hosts
            .iter()
            .position(|h| {
                h.cdns
                    .iter()
                    .any(|c| c.contract.is_some() || c.capacity_mbps.is_some())
            })
            .or((!hosts.is_empty()).then_some(0)),
    };
    found.ok_or_else(|| {
        let names: Vec<String> = hosts.iter().map(|h| h.name.to_string()).collect();
        match name {
            Some(n) => SimulateError::UnknownName {
                name: n.to_string(),
                names,
            },
            None => SimulateError::NoName,
        }
    })
}

/// One evaluation.
#[derive(Clone, Debug)]
pub struct Point {
    pub at_ms: u64,
    /// Each CDN's mean share of the regions it serves, in force from `at_ms`.
    pub shares: Vec<f64>,
    pub biases: Vec<Bias>,
}

/// One CDN over the span.
#[derive(Clone, Debug)]
pub struct CdnReport {
    pub cdn: String,
    pub contract: Option<Contract>,
    pub capacity_mbps: Option<f64>,
    /// Bytes of the span's last calendar month.
    pub month_bytes: f64,
    /// Every five-minute sample of the span, Mbit/s.
    pub samples: Vec<(u64, f64)>,
    /// Samples above a p95 cap (in the last month).
    pub above_cap: Option<u64>,
    pub p95_mbps: f64,
    /// The largest move of its share between two evaluations, points.
    pub largest_shift: f64,
}

/// The result of a simulation.
#[derive(Clone, Debug)]
pub struct Report {
    pub name: String,
    pub cdns: Vec<CdnReport>,
    pub points: Vec<Point>,
    pub month: Month,
}

/// Replays `rows` against one of `policy`'s names (`opts.name`).
pub fn run(policy: &Policy, rows: &[Row], opts: &Options) -> Result<Report, SimulateError> {
    let index = pick(policy, opts.name.as_deref())?;
    let host = &policy.hosts[index];
    let name = host.name.to_string();
    let regions: BTreeMap<&str, usize> = host
        .regions
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name.as_str(), i))
        .collect();
    for r in rows {
        if !regions.contains_key(r.region.as_str()) {
            return Err(SimulateError::UnknownRegion {
                region: r.region.clone(),
                name,
                known: regions.keys().map(|k| k.to_string()).collect(),
            });
        }
    }
    let slots = by_slot(rows);
    let (Some(&first), Some(&last)) = (slots.keys().next(), slots.keys().next_back()) else {
        return Err(SimulateError::NoDemand);
    };
    let steer_from = opts.steer_from_ms.unwrap_or(first).max(first);
    let period = host.commit.shift_period.as_millis() as u64;
    let n = host.cdns.len();
    let cdn_index = |c: &str| host.cdns.iter().position(|x| x.name == c);
    let outside: Vec<(usize, u64, u64)> = opts
        .outside_band
        .iter()
        .map(|(c, a, b)| {
            cdn_index(c)
                .map(|i| (i, *a, *b))
                .ok_or_else(|| super::UsageError::UnknownCdn(c.to_string()))
        })
        .collect::<Result<_, _>>()?;

    let mut commit = Commit::default();
    commit.configure(policy, steer_from.saturating_sub(period));
    let mut pending: VecDeque<(u64, usize, u64, Record)> = VecDeque::new();
    let mut points: Vec<Point> = Vec::new();
    let mut samples: Vec<Vec<(u64, f64)>> = vec![Vec::new(); n];
    let mut in_force = policy.clone();
    let month = Month::of(last);

    for (&t, demand) in &slots {
        // Evaluations due before this slot, each with the records arrived by then.
        while let Some(due) = commit.next_due_ms().filter(|&d| d <= t) {
            while pending.front().is_some_and(|p| p.0 <= due) {
                let (_, c, start, r) = pending.pop_front().expect("front");
                commit.record(policy, &host.cdns[c].name, start, r)?;
            }
            let out = |_: &str, _: usize, c: usize| {
                outside
                    .iter()
                    .any(|&(i, a, b)| i == c && (a..b).contains(&due))
            };
            commit.evaluate(policy, &out, due);
            in_force = commit.apply(policy, &out).unwrap_or_else(|| policy.clone());
            let shares: Vec<f64> = (0..n).map(|c| mean_share(&in_force, index, c)).collect();
            let biases = commit.biases(&name);
            points.push(Point {
                at_ms: due,
                shares,
                biases,
            });
        }
        // This slot's traffic, split by the shares in force.
        let mut mbps = vec![0.0; n];
        let h = &in_force.hosts[index];
        for (region, d) in demand {
            let r = regions[region];
            let shares = policy_shares(&h.regions[r].weights);
            for c in 0..n {
                mbps[c] += d * shares[c] / 100.0;
            }
        }
        for (c, m) in mbps.iter().enumerate() {
            samples[c].push((t, *m));
            let r = Record {
                seconds: 300,
                bytes: m * 1e6 / 8.0 * 300.0,
            };
            pending.push_back((t + SLOT_MS + opts.delay_ms, c, t, r));
        }
    }

    let cdns = host
        .cdns
        .iter()
        .enumerate()
        .map(|(c, cdn)| {
            let in_month: Vec<f64> = samples[c]
                .iter()
                .filter(|(t, _)| *t >= month.start_ms && *t < month.end_ms)
                .map(|&(_, m)| m)
                .collect();
            let month_bytes = in_month.iter().map(|m| m * 1e6 / 8.0 * 300.0).sum();
            let mut sorted = in_month.clone();
            sorted.sort_by(f64::total_cmp);
            let p95 = if sorted.is_empty() {
                0.0
            } else {
                sorted[sorted.len() - 1 - sorted.len() * 5 / 100]
            };
            let above_cap = match cdn.contract {
                Some(Contract::P95Mbps { cap_mbps, .. }) => {
                    Some(in_month.iter().filter(|&&m| m > cap_mbps).count() as u64)
                }
                _ => None,
            };
            let largest_shift = points
                .windows(2)
                .map(|w| (w[1].shares[c] - w[0].shares[c]).abs())
                .fold(0.0, f64::max);
            CdnReport {
                cdn: cdn.name.clone(),
                contract: cdn.contract,
                capacity_mbps: cdn.capacity_mbps,
                month_bytes,
                samples: samples[c].clone(),
                above_cap,
                p95_mbps: p95,
                largest_shift,
            }
        })
        .collect();
    Ok(Report {
        name,
        cdns,
        points,
        month,
    })
}

/// CDN `c`'s mean share of the regions of the first name that it serves.
fn mean_share(p: &Policy, host: usize, c: usize) -> f64 {
    let shares: Vec<f64> = p.hosts[host]
        .regions
        .iter()
        .map(|r| policy_shares(&r.weights)[c])
        .filter(|s| *s > 0.0)
        .collect();
    if shares.is_empty() {
        0.0
    } else {
        shares.iter().sum::<f64>() / shares.len() as f64
    }
}

impl Report {
    /// The report for a person.
    pub fn text(&self) -> String {
        let mut s = format!(
            "{}: {} evaluations, month {} to {}\n",
            self.name,
            self.points.len(),
            crate::control::decide::times::rfc3339(self.month.start_ms),
            crate::control::decide::times::rfc3339(self.month.end_ms)
        );
        for c in &self.cdns {
            let _ = write!(s, "  {}: {:.1} GB this month", c.cdn, c.month_bytes / 1e9);
            match c.contract {
                Some(Contract::GbMonth { commit_gb, cap_gb }) => {
                    let gb = c.month_bytes / 1e9;
                    let verdict = if gb < commit_gb {
                        "BELOW the commit"
                    } else if gb > cap_gb {
                        "ABOVE the cap"
                    } else {
                        "within"
                    };
                    let _ = write!(
                        s,
                        ", commit {commit_gb} GB, cap {cap_gb} GB: {verdict} ({:.1} % of the commit)",
                        100.0 * gb / commit_gb
                    );
                }
                Some(Contract::P95Mbps {
                    commit_mbps,
                    cap_mbps,
                }) => {
                    let _ = write!(
                        s,
                        ", p95 {:.1} Mbit/s (commit {commit_mbps}, cap {cap_mbps}), {} five-minute samples above the cap (free: {})",
                        c.p95_mbps,
                        c.above_cap.unwrap_or(0),
                        self.month.burst_allowance()
                    );
                }
                None => {}
            }
            if let Some(cap) = c.capacity_mbps {
                let peak = c.samples.iter().map(|s| s.1).fold(0.0, f64::max);
                let _ = write!(s, ", peak {peak:.1} of capacity {cap} Mbit/s");
            }
            let _ = writeln!(
                s,
                "; largest shift per period {:.2} points",
                c.largest_shift
            );
        }
        s
    }

    /// The shares over the span as an SVG chart (one line per CDN).
    pub fn svg(&self) -> String {
        let (w, h, pad) = (960.0, 360.0, 40.0);
        let colours = [
            "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
        ];
        let t0 = self.points.first().map_or(0, |p| p.at_ms) as f64;
        let t1 = self.points.last().map_or(1, |p| p.at_ms) as f64;
        let span = (t1 - t0).max(1.0);
        let x = |t: u64| pad + (t as f64 - t0) / span * (w - 2.0 * pad);
        let y = |v: f64| h - pad - v / 100.0 * (h - 2.0 * pad);
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n<text x=\"{pad}\" y=\"20\">{} — share of each CDN (points of 100) per evaluation</text>\n",
            escape(&self.name)
        );
        for v in [0.0, 25.0, 50.0, 75.0, 100.0] {
            let _ = writeln!(
                s,
                "<line x1=\"{pad}\" x2=\"{0}\" y1=\"{1:.1}\" y2=\"{1:.1}\" stroke=\"#ddd\"/><text x=\"4\" y=\"{1:.1}\">{v}</text>",
                w - pad,
                y(v)
            );
        }
        let day = 86_400_000u64;
        let mut d = (t0 as u64).div_ceil(day) * day;
        while (d as f64) <= t1 {
            let _ = writeln!(
                s,
                "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{pad}\" y2=\"{1}\" stroke=\"#f0f0f0\"/>",
                x(d),
                h - pad
            );
            d += day;
        }
        for (c, cdn) in self.cdns.iter().enumerate() {
            let colour = colours[c % colours.len()];
            let pts: Vec<String> = self
                .points
                .iter()
                .map(|p| format!("{:.1},{:.1}", x(p.at_ms), y(p.shares[c])))
                .collect();
            let _ = writeln!(
                s,
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
                pts.join(" ")
            );
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" fill=\"{colour}\">{}</text>",
                w - pad - 150.0,
                40.0 + 14.0 * c as f64,
                escape(&cdn.cdn)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

/// `steerdns simulate`'s arguments (parsed in `cli/mod.rs`).
#[derive(Clone, Debug)]
pub struct Args {
    pub demand: std::path::PathBuf,
    pub policy: std::path::PathBuf,
    pub svg: Option<std::path::PathBuf>,
    pub start: Option<String>,
    pub delay_seconds: u64,
    pub name: Option<String>,
}

/// Runs `steerdns simulate`: the report's text, or what went wrong.
pub fn command(args: &Args) -> Result<String, SimulateError> {
    let (policy, _) = crate::config::load(&args.policy).map_err(SimulateError::Policy)?;
    let text = std::fs::read_to_string(&args.demand).map_err(|source| {
        SimulateError::DemandUnreadable {
            path: args.demand.clone(),
            source,
        }
    })?;
    let rows = super::demand::parse(&text).map_err(|error| SimulateError::Demand {
        path: args.demand.clone(),
        error,
    })?;
    let steer_from_ms = match &args.start {
        None => None,
        Some(s) => Some(
            humantime::parse_rfc3339(s)
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as u64)
                .ok_or_else(|| SimulateError::Start(s.clone()))?,
        ),
    };
    let opts = Options {
        steer_from_ms,
        delay_ms: args.delay_seconds.saturating_mul(1000),
        outside_band: Vec::new(),
        name: args.name.clone(),
    };
    let report = run(&policy, &rows, &opts)?;
    if let Some(out) = &args.svg {
        std::fs::write(out, report.svg()).map_err(|source| SimulateError::SvgUnwritable {
            path: out.clone(),
            source,
        })?;
    }
    Ok(report.text())
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
