//! Input: a region's `performance:` block, the bounds within which measured
//! performance may move its weights (the control plane's `control/modifiers/perf/` applies it).
//!
//! ```yaml
//! performance:
//!   metric: ttfb_p75          # or throughput_p25, error_rate
//!   band_percent: 10          # within this of the best: keeps its policy weight
//!   floor_percent: 10         # never below this share (points) while healthy
//!   max_shift_points: 10      # at most this many points of share moved …
//!   shift_period_seconds: 600 # … per this period
//!   window_seconds: 300       # the samples that count
//!   min_samples: 50           # a cell moves only with this many samples …
//!   min_networks: 5           # … from at least this many distinct /24s (/48s)
//! ```

use std::time::Duration;

use serde::Deserialize;

use super::locate::Ctx;
use super::Seg;

/// What is compared between the CDNs of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// The 75th percentile of time to first byte, in ms: lower is better.
    TtfbP75,
    /// The 25th percentile of throughput, in bit/s: higher is better.
    ThroughputP25,
    /// The share of failed samples: lower is better; the band is in percentage points.
    ErrorRate,
}

impl Metric {
    pub fn as_str(self) -> &'static str {
        match self {
            Metric::TtfbP75 => "ttfb_p75",
            Metric::ThroughputP25 => "throughput_p25",
            Metric::ErrorRate => "error_rate",
        }
    }
}

/// A region's `performance:` block, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Performance {
    pub metric: Metric,
    /// Within this many percent of the best (percentage points for `error_rate`): no
    /// penalty.
    pub band_percent: f64,
    /// The share (points of 100) a serving CDN never goes below for performance.
    pub floor_percent: f64,
    /// At most this many points of share moved per `shift_period`.
    pub max_shift_points: f64,
    pub shift_period: Duration,
    /// The samples that count: the last `window`.
    pub window: Duration,
    pub min_samples: u32,
    pub min_networks: u32,
}

impl Performance {
    /// The block with every optional key at its default: band 10 %, floor 10 %, 10
    /// points per 600 s, a 300 s window, 50 samples from 5 networks.
    pub fn defaults(metric: Metric) -> Performance {
        Performance {
            metric,
            band_percent: 10.0,
            floor_percent: 10.0,
            max_shift_points: 10.0,
            shift_period: Duration::from_secs(600),
            window: Duration::from_secs(300),
            min_samples: 50,
            min_networks: 5,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPerformance {
    metric: Option<Metric>,
    band_percent: Option<f64>,
    floor_percent: Option<f64>,
    max_shift_points: Option<f64>,
    shift_period_seconds: Option<f64>,
    window_seconds: Option<f64>,
    min_samples: Option<i64>,
    min_networks: Option<i64>,
}

/// The shortest period or window accepted: a tenth of a second (tests and drills use
/// short ones).
const MIN_SECONDS: f64 = 0.1;
const MAX_SECONDS: f64 = 86_400.0;

/// Validates a `performance:` block found at `path`; `None` after an error.
pub(super) fn validate(cx: &mut Ctx, path: &[Seg], raw: RawPerformance) -> Option<Performance> {
    let errors = cx.errors();
    let d = Performance::defaults(Metric::TtfbP75);
    let field = |k: &str| -> Vec<Seg> {
        let mut p = path.to_vec();
        p.push(Seg::Key(k.to_string()));
        p
    };
    let percent = |cx: &mut Ctx, k: &str, v: Option<f64>, default: f64, max: f64| match v {
        None => default,
        Some(v) if v.is_finite() && (0.0..=max).contains(&v) => v,
        Some(v) => {
            cx.error(&field(k), format!("{v} is not 0 to {max}"));
            default
        }
    };
    let band_percent = percent(cx, "band_percent", raw.band_percent, d.band_percent, 1000.0);
    let floor_percent = percent(
        cx,
        "floor_percent",
        raw.floor_percent,
        d.floor_percent,
        100.0,
    );
    let max_shift_points = percent(
        cx,
        "max_shift_points",
        raw.max_shift_points,
        d.max_shift_points,
        100.0,
    );
    if max_shift_points == 0.0 && raw.max_shift_points.is_some() {
        cx.error(
            &field("max_shift_points"),
            "0 would never move anything: remove the performance block instead",
        );
    }
    let seconds = |cx: &mut Ctx, k: &str, v: Option<f64>, default: Duration| {
        let s = match v {
            None => default.as_secs_f64(),
            Some(v) if v.is_finite() && (MIN_SECONDS..=MAX_SECONDS).contains(&v) => v,
            Some(v) => {
                cx.error(
                    &field(k),
                    format!("{v} is not {MIN_SECONDS} to {MAX_SECONDS} seconds"),
                );
                default.as_secs_f64()
            }
        };
        Duration::from_secs_f64(s)
    };
    let shift_period = seconds(
        cx,
        "shift_period_seconds",
        raw.shift_period_seconds,
        d.shift_period,
    );
    let window = seconds(cx, "window_seconds", raw.window_seconds, d.window);
    let count = |cx: &mut Ctx, k: &str, v: Option<i64>, default: u32| match v {
        None => default,
        Some(v) if (1..=1_000_000).contains(&v) => v as u32,
        Some(v) => {
            cx.error(&field(k), format!("{v} is not 1 to 1000000"));
            default
        }
    };
    let min_samples = count(cx, "min_samples", raw.min_samples, d.min_samples);
    let min_networks = count(cx, "min_networks", raw.min_networks, d.min_networks);
    let metric = match raw.metric {
        Some(m) => m,
        None => {
            cx.error(
                &field("metric"),
                "missing `metric:` (ttfb_p75, throughput_p25 or error_rate)",
            );
            Metric::TtfbP75
        }
    };
    if cx.errors() > errors {
        return None;
    }
    Some(Performance {
        metric,
        band_percent,
        floor_percent,
        max_shift_points,
        shift_period,
        window,
        min_samples,
        min_networks,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    fn check(block: &str) -> Result<super::Performance, String> {
        let text = format!(
            "hostname: www.example.com\ncdns:\n  fastly: {{ cname: a.example.net. }}\n  cloudflare: {{ cname: b.example.net. }}\nregions:\n  - match: [GB, IE]\n    weights: {{ fastly: 90, cloudflare: 10 }}\n    performance:\n{block}  - match: [\"*\"]\n    weights: {{ fastly: 50, cloudflare: 50 }}\n"
        );
        match crate::config::parse(Path::new("steering.yaml"), text) {
            Ok((p, _)) => Ok(p.hosts[0].regions[0].performance.clone().unwrap()),
            Err(issues) => Err(issues.to_string()),
        }
    }

    #[test]
    fn the_issue_block_loads() {
        let p = check("      metric: ttfb_p75\n      band_percent: 10\n      floor_percent: 10\n      max_shift_points: 10\n      shift_period_seconds: 600\n      window_seconds: 300\n      min_samples: 50\n      min_networks: 5\n").unwrap();
        assert_eq!(p.metric, super::Metric::TtfbP75);
        assert_eq!(p.shift_period.as_secs(), 600);
        assert_eq!(p.window.as_secs(), 300);
        assert_eq!((p.min_samples, p.min_networks), (50, 5));
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let e = check("      metric: ttfb_p75\n      floor_percent: 120\n").unwrap_err();
        assert!(
            e.contains(
                "steering.yaml:10: regions[0].performance.floor_percent: 120 is not 0 to 100"
            ),
            "{e}"
        );
        let e = check("      metric: p99\n").unwrap_err();
        assert!(
            e.contains("steering.yaml:9: regions[0].performance.metric"),
            "{e}"
        );
        let e = check("      metric: error_rate\n      window_seconds: 0\n").unwrap_err();
        assert!(
            e.contains("regions[0].performance.window_seconds: 0 is not 0.1 to 86400 seconds"),
            "{e}"
        );
        let e = check("      metric: error_rate\n      min_samples: 0\n").unwrap_err();
        assert!(e.contains("regions[0].performance.min_samples"), "{e}");
        let e = check("      metric: error_rate\n      bands: 3\n").unwrap_err();
        assert!(e.contains("unknown field `bands`"), "{e}");
        let e = check("      band_percent: 5\n").unwrap_err();
        assert!(e.contains("performance.metric: missing `metric:`"), "{e}");
    }
}
