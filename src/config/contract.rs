//! Input: a CDN's contract (`contract:`), its hard capacity (`capacity_mbps:`) and a
//! name's `commit:` block, the bounds within which the control plane's
//! `control/modifiers/commit/` moves shares to meet commits and stay under caps.
//!
//! ```yaml
//! cdns:
//!   fastly:
//!     cname: example.map.fastly.net.
//!     contract: { billing: gb_month, commit_gb: 500000, cap_gb: 800000 }
//!   cloudflare:
//!     cname: example.cdn.cloudflare.net.
//!     contract: { billing: p95_mbps, commit_mbps: 20000, cap_mbps: 40000 }
//!     capacity_mbps: 50000
//! commit:                       # beside `failover:`; every key optional
//!   max_shift_points: 5         # at most this many points of bias moved …
//!   shift_period_seconds: 3600  # … per this period (one evaluation)
//!   dead_band_percent: 3        # no move while the projection is this close (% of commit)
//!   max_bias_points: 30         # the bias of a CDN stays within ± this
//!   floor_percent: 5            # a CDN over its capacity falls to this share
//! ```

use std::time::Duration;

use serde::Deserialize;

use super::locate::Ctx;
use super::Seg;

/// How a CDN bills, with its commit and cap.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Contract {
    /// Volume per calendar month (GB = 10^9 bytes): pay `commit` whatever, more above
    /// `cap`.
    GbMonth { commit_gb: f64, cap_gb: f64 },
    /// The month's 95th percentile of five-minute Mbit/s samples: the top 5 % (432 of
    /// a 30-day month's 8,640) are free.
    P95Mbps { commit_mbps: f64, cap_mbps: f64 },
}

impl Contract {
    pub fn billing(&self) -> &'static str {
        match self {
            Contract::GbMonth { .. } => "gb_month",
            Contract::P95Mbps { .. } => "p95_mbps",
        }
    }

    /// (commit, cap) in the contract's unit (GB or Mbit/s).
    pub fn bounds(&self) -> (f64, f64) {
        match *self {
            Contract::GbMonth { commit_gb, cap_gb } => (commit_gb, cap_gb),
            Contract::P95Mbps {
                commit_mbps,
                cap_mbps,
            } => (commit_mbps, cap_mbps),
        }
    }
}

/// A name's `commit:` block, validated (defaults when absent).
#[derive(Clone, Debug, PartialEq)]
pub struct CommitSettings {
    /// At most this many points of bias moved per period (the capacity fall and the
    /// clamp of a spent burst budget excepted).
    pub max_shift_points: f64,
    /// One evaluation per period.
    pub shift_period: Duration,
    /// No move while the projection is within this many percent of the commit of
    /// where it should be.
    pub dead_band_percent: f64,
    /// A CDN's bias stays within ± this many points of share.
    pub max_bias_points: f64,
    /// The share (points) a CDN over its capacity falls to.
    pub floor_percent: f64,
}

impl Default for CommitSettings {
    fn default() -> Self {
        CommitSettings {
            max_shift_points: 2.0,
            shift_period: Duration::from_secs(3600),
            dead_band_percent: 3.0,
            max_bias_points: 30.0,
            floor_percent: 5.0,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawContract {
    billing: Option<String>,
    commit_gb: Option<f64>,
    cap_gb: Option<f64>,
    commit_mbps: Option<f64>,
    cap_mbps: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCommit {
    max_shift_points: Option<f64>,
    shift_period_seconds: Option<f64>,
    dead_band_percent: Option<f64>,
    max_bias_points: Option<f64>,
    floor_percent: Option<f64>,
}

/// The largest commit, cap or capacity taken: far beyond any CDN, far below overflow.
const MAX_AMOUNT: f64 = 1e12;

fn field(path: &[Seg], k: &str) -> Vec<Seg> {
    let mut p = path.to_vec();
    p.push(Seg::Key(k.to_string()));
    p
}

fn amount(cx: &mut Ctx, path: &[Seg], k: &str, v: Option<f64>, billing: &str) -> Option<f64> {
    match v {
        None => {
            cx.error(path, format!("missing `{k}:` (billing {billing})"));
            None
        }
        Some(v) if v.is_finite() && v > 0.0 && v <= MAX_AMOUNT => Some(v),
        Some(v) => {
            cx.error(
                &field(path, k),
                format!("{v} is not above 0 and at most 1e12"),
            );
            None
        }
    }
}

/// Validates a CDN's `contract:` found at `path`; `None` after an error.
pub(super) fn validate_contract(cx: &mut Ctx, path: &[Seg], raw: RawContract) -> Option<Contract> {
    let errors = cx.errors();
    // Each billing's commit and cap (in that order), and the keys of the other billing,
    // which it refuses.
    let gb = [("commit_gb", raw.commit_gb), ("cap_gb", raw.cap_gb)];
    let mbps = [("commit_mbps", raw.commit_mbps), ("cap_mbps", raw.cap_mbps)];
    type Make = fn(f64, f64) -> Contract;
    let (billing, own, other, make): (_, _, _, Make) = match raw.billing.as_deref() {
        Some(b @ "gb_month") => (b, gb, mbps, |commit_gb, cap_gb| Contract::GbMonth {
            commit_gb,
            cap_gb,
        }),
        Some(b @ "p95_mbps") => (b, mbps, gb, |commit_mbps, cap_mbps| Contract::P95Mbps {
            commit_mbps,
            cap_mbps,
        }),
        Some(other) => {
            cx.error(
                &field(path, "billing"),
                format!("`{other}` is not a billing: gb_month or p95_mbps"),
            );
            return None;
        }
        None => {
            cx.error(path, "missing `billing:` (gb_month or p95_mbps)");
            return None;
        }
    };
    for (k, _) in other.into_iter().filter(|(_, v)| v.is_some()) {
        cx.error(
            &field(path, k),
            format!("`{k}` does not go with billing {billing}"),
        );
    }
    let [commit, cap] = own.map(|(k, v)| amount(cx, path, k, v, billing));
    let contract = make(commit?, cap?);
    let (commit, cap) = contract.bounds();
    if cap < commit {
        let (k, _) = own[1];
        cx.error(
            &field(path, k),
            format!("the cap {cap} is below the commit {commit}"),
        );
    }
    (cx.errors() == errors).then_some(contract)
}

/// Validates a CDN's `capacity_mbps:` at `path`.
pub(super) fn validate_capacity(cx: &mut Ctx, path: &[Seg], v: f64) -> Option<f64> {
    if v.is_finite() && v > 0.0 && v <= MAX_AMOUNT {
        Some(v)
    } else {
        cx.error(path, format!("{v} is not above 0 and at most 1e12"));
        None
    }
}

/// Validates a `commit:` block found at `path`; the defaults after an error (the
/// error refuses the file anyway).
pub(super) fn validate_commit(cx: &mut Ctx, path: &[Seg], raw: RawCommit) -> CommitSettings {
    let d = CommitSettings::default();
    // `max_shift_points` must move something; the others may be 0.
    let points = |cx: &mut Ctx, k: &str, v: Option<f64>, default: f64, max: f64| match v {
        None => default,
        Some(v)
            if v.is_finite() && v <= max && (v > 0.0 || (v == 0.0 && k != "max_shift_points")) =>
        {
            v
        }
        Some(v) => {
            cx.error(&field(path, k), format!("{v} is not 0 to {max}"));
            default
        }
    };
    let max_shift_points = points(
        cx,
        "max_shift_points",
        raw.max_shift_points,
        d.max_shift_points,
        100.0,
    );
    let dead_band_percent = points(
        cx,
        "dead_band_percent",
        raw.dead_band_percent,
        d.dead_band_percent,
        50.0,
    );
    let max_bias_points = points(
        cx,
        "max_bias_points",
        raw.max_bias_points,
        d.max_bias_points,
        100.0,
    );
    let floor_percent = points(
        cx,
        "floor_percent",
        raw.floor_percent,
        d.floor_percent,
        100.0,
    );
    let shift_period = match raw.shift_period_seconds {
        None => d.shift_period,
        Some(v) if v.is_finite() && (0.05..=86_400.0).contains(&v) => Duration::from_secs_f64(v),
        Some(v) => {
            cx.error(
                &field(path, "shift_period_seconds"),
                format!("{v} is not 0.05 to 86400 seconds"),
            );
            d.shift_period
        }
    };
    CommitSettings {
        max_shift_points,
        shift_period,
        dead_band_percent,
        max_bias_points,
        floor_percent,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    fn check(cdn: &str, commit: &str) -> Result<crate::config::HostPolicy, String> {
        let text = format!(
            "hostname: www.example.com\ncdns:\n  fastly:\n    cname: a.example.net.\n{cdn}  cloudflare: {{ cname: b.example.net. }}\nregions:\n  - match: [\"*\"]\n    weights: {{ fastly: 50, cloudflare: 50 }}\n{commit}"
        );
        match crate::config::parse(Path::new("steering.yaml"), text) {
            Ok((p, _)) => Ok(p.hosts[0].clone()),
            Err(issues) => Err(issues.to_string()),
        }
    }

    #[test]
    fn the_issue_contracts_load() {
        let h = check(
            "    contract: { billing: gb_month, commit_gb: 500000, cap_gb: 800000 }\n    capacity_mbps: 50000\n",
            "commit: { max_shift_points: 5, shift_period_seconds: 600 }\n",
        )
        .unwrap();
        assert_eq!(
            h.cdns[0].contract,
            Some(super::Contract::GbMonth {
                commit_gb: 500000.0,
                cap_gb: 800000.0
            })
        );
        assert_eq!(h.cdns[0].capacity_mbps, Some(50000.0));
        assert_eq!(h.cdns[1].contract, None);
        assert_eq!(h.commit.max_shift_points, 5.0);
        assert_eq!(h.commit.shift_period.as_secs(), 600);
        assert_eq!(h.commit.dead_band_percent, 3.0);
        assert_eq!(h.commit.max_bias_points, 30.0);
        let h = check(
            "    contract: { billing: p95_mbps, commit_mbps: 20000, cap_mbps: 40000 }\n",
            "",
        )
        .unwrap();
        assert_eq!(h.cdns[0].contract.unwrap().bounds(), (20000.0, 40000.0));
        assert_eq!(h.commit, super::CommitSettings::default());
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let e = check(
            "    contract: { billing: gb_month, commit_gb: 5, cap_gb: 4 }\n",
            "",
        )
        .unwrap_err();
        assert!(
            e.contains(
                "steering.yaml:5: cdns.fastly.contract.cap_gb: the cap 4 is below the commit 5"
            ),
            "{e}"
        );
        let e = check(
            "    contract: { billing: p95_mbps, commit_mbps: 5, cap_mbps: 4 }\n",
            "",
        )
        .unwrap_err();
        assert!(
            e.contains("contract.cap_mbps: the cap 4 is below the commit 5"),
            "{e}"
        );
        let e = check(
            "    contract: { billing: gb_month, commit_gb: 5, cap_gb: 6, commit_mbps: 1 }\n",
            "",
        )
        .unwrap_err();
        assert!(
            e.contains("contract.commit_mbps: `commit_mbps` does not go with billing gb_month"),
            "{e}"
        );
        let e = check("    contract: { billing: monthly, commit_gb: 5 }\n", "").unwrap_err();
        assert!(
            e.contains("cdns.fastly.contract.billing: `monthly` is not a billing"),
            "{e}"
        );
        let e = check(
            "    contract:\n      billing: p95_mbps\n      commit_mbps: 10\n      cap_gb: 4\n",
            "",
        )
        .unwrap_err();
        assert!(
            e.contains("steering.yaml:8: cdns.fastly.contract.cap_gb: `cap_gb` does not go with billing p95_mbps"),
            "{e}"
        );
        assert!(
            e.contains("cdns.fastly.contract: missing `cap_mbps:`"),
            "{e}"
        );
        let e = check(
            "    contract: { billing: gb_month, commit_gb: -1, cap_gb: 4 }\n",
            "",
        )
        .unwrap_err();
        assert!(e.contains("contract.commit_gb: -1 is not above 0"), "{e}");
        let e = check("    capacity_mbps: 0\n", "").unwrap_err();
        assert!(
            e.contains("steering.yaml:5: cdns.fastly.capacity_mbps: 0 is not above 0"),
            "{e}"
        );
        let e = check("", "commit:\n  max_bias_points: 130\n").unwrap_err();
        assert!(
            e.contains("steering.yaml:10: commit.max_bias_points: 130 is not 0 to 100"),
            "{e}"
        );
        let e = check("", "commit:\n  max_shift_points: 0\n").unwrap_err();
        assert!(
            e.contains("commit.max_shift_points: 0 is not 0 to 100"),
            "{e}"
        );
        let e = check("", "commit:\n  shift_period_seconds: 0\n").unwrap_err();
        assert!(e.contains("commit.shift_period_seconds: 0 is not"), "{e}");
        let e = check("", "commit:\n  slew: 3\n").unwrap_err();
        assert!(e.contains("unknown field `slew`"), "{e}");
    }
}
