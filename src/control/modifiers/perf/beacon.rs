//! Control plane, performance steering: a beacon's body and the rate of beacons per
//! source network.
//!
//! ```json
//! {"ticket":"…","samples":[{"cdn":"fastly","ttfb_ms":80,"throughput_bps":5000000,"ok":true}]}
//! ```
//!
//! `ticket` is the beacon ticket (`control/content/ticket.rs`), which the server checks;
//! every sample field but `cdn` is optional; unknown fields, a sample without any
//! measurement, and values out of range are refused with a message.

use std::collections::HashMap;

use serde::Deserialize;

use super::cell::Sample;

/// The largest body taken (413 above).
pub(crate) const MAX_BODY: usize = 16 * 1024;
/// Samples per beacon at most.
pub(crate) const MAX_SAMPLES: usize = 256;
/// Time to first byte at most (ms): ten minutes.
pub(crate) const MAX_TTFB_MS: u64 = 600_000;
/// Throughput at most (bit/s): 10 Tbit/s.
pub(crate) const MAX_THROUGHPUT_BPS: u64 = 10_000_000_000_000;
/// Beacons per second of one source network (/24, /48) in the long run, and the
/// burst it may send at once.
pub(crate) const RATE_PER_SECOND: f64 = 50.0;
pub(crate) const BURST: f64 = 100.0;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBeacon<'a> {
    #[serde(borrow, default)]
    ticket: Option<&'a str>,
    #[serde(borrow)]
    samples: Vec<RawSample<'a>>,
}

/// A beacon's body, checked.
#[derive(Debug, PartialEq)]
pub(crate) struct Beacon<'a> {
    /// The ticket, as sent (`""`: none).
    pub ticket: &'a str,
    /// (CDN name, sample) pairs.
    pub samples: Vec<(&'a str, Sample)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSample<'a> {
    cdn: &'a str,
    ttfb_ms: Option<u64>,
    throughput_bps: Option<u64>,
    ok: Option<bool>,
}

/// Parses a beacon: its ticket and (CDN name, sample) pairs, or the 400's message.
pub(crate) fn parse(body: &[u8]) -> Result<Beacon<'_>, String> {
    let raw: RawBeacon = serde_json::from_slice(body).map_err(|e| format!("bad beacon: {e}"))?;
    let ticket = raw.ticket.unwrap_or("");
    if raw.samples.is_empty() {
        return Err("bad beacon: no samples".into());
    }
    if raw.samples.len() > MAX_SAMPLES {
        return Err(format!("bad beacon: more than {MAX_SAMPLES} samples"));
    }
    raw.samples
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            if s.ttfb_ms.is_none() && s.throughput_bps.is_none() && s.ok.is_none() {
                return Err(format!(
                    "samples[{i}]: no measurement (ttfb_ms, throughput_bps or ok)"
                ));
            }
            if s.ttfb_ms.is_some_and(|t| t > MAX_TTFB_MS) {
                return Err(format!("samples[{i}].ttfb_ms: 0 to {MAX_TTFB_MS}"));
            }
            if s.throughput_bps
                .is_some_and(|t| t == 0 || t > MAX_THROUGHPUT_BPS)
            {
                return Err(format!(
                    "samples[{i}].throughput_bps: 1 to {MAX_THROUGHPUT_BPS}"
                ));
            }
            Ok((
                s.cdn,
                Sample {
                    ttfb_ms: s.ttfb_ms,
                    throughput_bps: s.throughput_bps,
                    ok: s.ok,
                },
            ))
        })
        .collect::<Result<_, _>>()
        .map(|samples| Beacon { ticket, samples })
}

/// Beacons per source network: a token bucket each ([`RATE_PER_SECOND`], [`BURST`]).
#[derive(Debug, Default)]
pub(crate) struct Limiter {
    /// (tokens, when last filled, unix ms) by network.
    buckets: HashMap<u64, (f64, u64)>,
}

/// Networks tracked at most; past it, the full buckets are forgotten.
const MAX_TRACKED: usize = 100_000;

impl Limiter {
    /// Takes a token of `net` at `now_ms`; false when it has none.
    pub(crate) fn admit(&mut self, net: u64, now_ms: u64) -> bool {
        if self.buckets.len() >= MAX_TRACKED && !self.buckets.contains_key(&net) {
            let full_after = (BURST / RATE_PER_SECOND * 1000.0) as u64;
            self.buckets
                .retain(|_, &mut (_, at)| now_ms.saturating_sub(at) < full_after);
            if self.buckets.len() >= MAX_TRACKED {
                return false;
            }
        }
        let (tokens, at) = self.buckets.entry(net).or_insert((BURST, now_ms));
        let elapsed = now_ms.saturating_sub(*at) as f64 / 1000.0;
        *tokens = (*tokens + elapsed * RATE_PER_SECOND).min(BURST);
        *at = now_ms;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beacons_parse_or_say_why_not() {
        let b = parse(br#"{"ticket":"t.1.x","samples":[{"cdn":"fastly","ttfb_ms":80,"throughput_bps":5000000,"ok":true},{"cdn":"cloudflare","ok":false}]}"#).unwrap();
        assert_eq!(b.ticket, "t.1.x");
        let s = b.samples;
        assert_eq!(s.len(), 2);
        assert_eq!(
            s[0],
            (
                "fastly",
                Sample {
                    ttfb_ms: Some(80),
                    throughput_bps: Some(5_000_000),
                    ok: Some(true)
                }
            )
        );
        assert_eq!(
            parse(br#"{"samples":[{"cdn":"a","ok":true}]}"#)
                .unwrap()
                .ticket,
            ""
        );
        let err = |b: &[u8]| parse(b).unwrap_err();
        assert!(err(b"{").starts_with("bad beacon: EOF"), "{}", err(b"{"));
        assert!(err(br#"{"samples":[]}"#).contains("no samples"));
        assert!(err(br#"{"samples":[{"ttfb_ms":3}]}"#).contains("missing field `cdn`"));
        assert!(err(br#"{"samples":[{"cdn":"a","rtt":3}]}"#).contains("unknown field `rtt`"));
        assert_eq!(
            err(br#"{"samples":[{"cdn":"a","ok":true},{"cdn":"a","ttfb_ms":600001}]}"#),
            "samples[1].ttfb_ms: 0 to 600000"
        );
        assert!(err(br#"{"samples":[{"cdn":"a","ttfb_ms":-1}]}"#).starts_with("bad beacon"));
        assert!(err(br#"{"samples":[{"cdn":"a","throughput_bps":0}]}"#).contains("throughput_bps"));
        assert!(err(br#"{"samples":[{"cdn":"a"}]}"#).contains("no measurement"));
    }

    #[test]
    fn a_network_gets_its_burst_then_its_rate() {
        let mut l = Limiter::default();
        let taken = (0..1000).filter(|_| l.admit(7, 1_000)).count();
        assert_eq!(taken, BURST as usize);
        // Another network is not affected.
        assert!(l.admit(8, 1_000));
        // One second later: 50 more.
        let taken = (0..1000).filter(|_| l.admit(7, 2_000)).count();
        assert_eq!(taken, RATE_PER_SECOND as usize);
    }
}
