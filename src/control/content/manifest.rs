//! Control plane, content steering: the pure part. A request's parameters, the order of
//! a name's pathways for one playback session, and the steering manifest's bytes. No
//! I/O; the server ([`super::server`]) and `explain` call it.
//!
//! # The order
//!
//! The client's region and the CDNs' effective weights there are the DNS answer's
//! (`plan::Steered::situate`: health, failover steps and drains included).
//! The pathways serving the region are ranked by weighted rendezvous hashing
//! ([`crate::selection::score`]) of a session key, so that:
//!
//! - the fraction of sessions that get a pathway first is its effective share in the
//!   region (a 50 % failover step moves half the sessions on the failing CDN, and only
//!   those);
//! - a session keeps its order between reloads while the weights stay the same: the key
//!   travels in `RELOAD-URI` (`session=`), drawn at random on a session's first request
//!   (or given by the player's first URL, `SERVER-URI`, to pin one);
//! - when the weights come back, the same sessions come back.
//!
//! CDNs with no weight in the region now (down after the last failover step, or fully
//! drained) are listed last, in policy order, rather than left out: a player only moves
//! to a later pathway when the earlier ones fail it, and a pathway left out is one it
//! could never fall back to. (The specification allows either.)
//!
//! # Throughput floor
//!
//! With `throughput_floor_bps`, a pathway a player reports below the floor
//! (`_HLS_pathway` with `_HLS_throughput` in bit/s; each of `_DASH_pathway`'s service
//! locations with its `_DASH_throughput` entry, in kbit/s as DASH-IF specifies) is
//! demoted for that session: listed after the other serving pathways. The demotion is
//! carried in `RELOAD-URI` (`demoted=`), so it lasts for the session; when every serving
//! pathway is demoted, demotions are dropped and the weighted order applies again.

use std::fmt::Write as _;

use crate::config::valid_pathway;
use crate::plan::{Choice, Situation, Steered};
use crate::selection;

/// Pathways or throughput values one request may list (more is a bad request).
pub(crate) const MAX_LIST: usize = 16;

/// Which manifest a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `/steer/hls/{name}`: `PATHWAY-PRIORITY`, `_HLS_pathway`, `_HLS_throughput`.
    Hls,
    /// `/steer/dash/{name}`: `SERVICE-LOCATION-PRIORITY`, `_DASH_pathway`,
    /// `_DASH_throughput`.
    Dash,
}

impl Format {
    /// The format named by a path segment (`hls`, `dash`).
    pub fn from_segment(s: &str) -> Option<Format> {
        match s {
            "hls" => Some(Format::Hls),
            "dash" => Some(Format::Dash),
            _ => None,
        }
    }

    fn pathway_param(self) -> &'static str {
        match self {
            Format::Hls => "_HLS_pathway",
            Format::Dash => "_DASH_pathway",
        }
    }

    fn throughput_param(self) -> &'static str {
        match self {
            Format::Hls => "_HLS_throughput",
            Format::Dash => "_DASH_throughput",
        }
    }
}

/// What a request's query says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Params {
    /// The session key from `RELOAD-URI` (or the first URL); `None`: a new session.
    pub session: Option<u64>,
    /// Pathways the player reports, each with its throughput in bit/s when it gives
    /// one: HLS's current pathway, DASH's service locations.
    pub reported: Vec<(String, Option<u64>)>,
    /// Pathway ids demoted earlier in the session (`demoted=`, from `RELOAD-URI`).
    pub demoted: Vec<String>,
    /// The beacon ticket carried in `RELOAD-URI` (`ticket=`, see `ticket.rs`): what
    /// makes the reported throughput count as performance samples.
    pub ticket: Option<String>,
}

/// Why a request's query string is refused: the text is the 400's message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ManifestError {
    /// A known parameter given twice.
    #[error("`{key}` is given twice")]
    Twice { key: String },
    /// `session` is not 16 hexadecimal digits.
    #[error("`session`: not 16 hexadecimal digits")]
    Session,
    /// A value that is not percent-encoded ASCII.
    #[error("`{key}`: bad percent-encoding")]
    Encoding { key: String },
    /// A list of throughputs longer than [`MAX_LIST`].
    #[error("`{key}`: more than {} values", MAX_LIST)]
    TooManyValues { key: String },
    /// A list of pathways longer than [`MAX_LIST`].
    #[error("`{key}`: more than {} pathways", MAX_LIST)]
    TooManyPathways { key: String },
    /// Not a pathway id.
    #[error("`{key}`: not a pathway id (1 to 64 of A-Z a-z 0-9 . - _)")]
    Pathway { key: String },
    /// Not a throughput (a non-negative decimal number below 10^15).
    #[error("`{key}`: not a throughput (a non-negative number below 10^15)")]
    Throughput { key: String },
    /// Digits that do not make a number.
    #[error("`{key}`: not a throughput")]
    ThroughputNumber { key: String },
}

/// Parses a request's query string. Unknown parameters are ignored (players and
/// proxies add their own); a known one that is malformed or repeated is an error,
/// whose text is the 400's message.
pub(crate) fn parse_query(format: Format, query: &str) -> Result<Params, ManifestError> {
    let mut params = Params::default();
    let (mut pathways, mut throughputs): (Option<Vec<String>>, Option<Vec<u64>>) = (None, None);
    let mut seen_demoted = false;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let once = |seen: bool| {
            if seen {
                Err(ManifestError::Twice {
                    key: key.to_string(),
                })
            } else {
                Ok(())
            }
        };
        if key == "session" {
            once(params.session.is_some())?;
            params.session = Some(parse_session(value)?);
        } else if key == "ticket" {
            once(params.ticket.is_some())?;
            params.ticket = Some(decode(key, value)?.into_owned());
        } else if key == "demoted" {
            once(seen_demoted)?;
            seen_demoted = true;
            params.demoted = parse_ids(key, &decode(key, value)?)?;
        } else if key == format.pathway_param() {
            once(pathways.is_some())?;
            let text = decode(key, value)?;
            pathways = Some(match format {
                Format::Hls => vec![parse_id(key, &text)?],
                // DASH-IF: a quoted, comma-separated list.
                Format::Dash => parse_ids(key, unquote(&text))?,
            });
        } else if key == format.throughput_param() {
            once(throughputs.is_some())?;
            let text = decode(key, value)?;
            throughputs = Some(match format {
                Format::Hls => vec![parse_rate(key, &text, 1)?],
                Format::Dash => {
                    let list = unquote(&text);
                    let items: Vec<&str> = list.split(',').filter(|s| !s.is_empty()).collect();
                    if items.len() > MAX_LIST {
                        return Err(ManifestError::TooManyValues {
                            key: key.to_string(),
                        });
                    }
                    items
                        .iter()
                        .map(|t| parse_rate(key, t, 1000))
                        .collect::<Result<_, _>>()?
                }
            });
        }
    }
    let throughputs = throughputs.unwrap_or_default();
    if let Some(ids) = pathways {
        // DASH lists the throughputs of the first locations only (those measured).
        params.reported = ids
            .into_iter()
            .enumerate()
            .map(|(i, id)| (id, throughputs.get(i).copied()))
            .collect();
    }
    Ok(params)
}

/// A session key: 16 hexadecimal digits.
pub(crate) fn parse_session(value: &str) -> Result<u64, ManifestError> {
    if value.len() != 16 || !value.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ManifestError::Session);
    }
    u64::from_str_radix(value, 16).map_err(|_| ManifestError::Session)
}

fn parse_id(key: &str, text: &str) -> Result<String, ManifestError> {
    if valid_pathway(text) {
        Ok(text.to_string())
    } else {
        Err(ManifestError::Pathway {
            key: key.to_string(),
        })
    }
}

fn parse_ids(key: &str, text: &str) -> Result<Vec<String>, ManifestError> {
    let items: Vec<&str> = text.split(',').filter(|s| !s.is_empty()).collect();
    if items.len() > MAX_LIST {
        return Err(ManifestError::TooManyPathways {
            key: key.to_string(),
        });
    }
    items.iter().map(|i| parse_id(key, i)).collect()
}

/// A throughput: a non-negative decimal number (players send fractions too), times
/// `scale` to make bit/s.
fn parse_rate(key: &str, text: &str, scale: u64) -> Result<u64, ManifestError> {
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() || int.len() > 15 || !digits(int) || !digits(frac) {
        return Err(ManifestError::Throughput {
            key: key.to_string(),
        });
    }
    let n: u64 = int.parse().map_err(|_| ManifestError::ThroughputNumber {
        key: key.to_string(),
    })?;
    Ok(n.saturating_mul(scale))
}

fn unquote(s: &str) -> &str {
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s)
}

/// Percent-decodes a query value (`+` is a space, as browsers' URLSearchParams write
/// it). Only ASCII results are accepted: every value we read is ASCII.
fn decode<'v>(key: &str, value: &'v str) -> Result<std::borrow::Cow<'v, str>, ManifestError> {
    if !value.contains(['%', '+']) {
        return Ok(value.into());
    }
    let bad = || ManifestError::Encoding {
        key: key.to_string(),
    };
    let bytes = value.as_bytes();
    let mut out = String::with_capacity(value.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = value.get(i + 1..i + 3).ok_or_else(bad)?;
                let b = u8::from_str_radix(hex, 16).map_err(|_| bad())?;
                if !b.is_ascii() {
                    return Err(bad());
                }
                out.push(char::from(b));
                i += 3;
            }
            b'+' => {
                out.push(' ');
                i += 1;
            }
            b => {
                out.push(char::from(b));
                i += 1;
            }
        }
    }
    Ok(out.into())
}

/// The order of a name's pathways for one session, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Order {
    /// The client's region (index in the policy).
    pub region: usize,
    /// Every target (CDN index) of the name, best first: those serving the region in
    /// the session's weighted order, demoted ones after them, then those with no
    /// weight there now, in policy order.
    pub targets: Vec<usize>,
    /// Targets demoted for this session (policy order), carried in `RELOAD-URI`.
    pub demoted: Vec<usize>,
    /// The manifest's TTL: `content_steering.ttl`, else the name's DNS TTL.
    pub ttl: u32,
}

/// The order of `steered`'s pathways for `session`, asked by a client that lands at
/// `at` ([`Steered::situate`]: its region and the choice there), with what the player
/// reported in `params`.
pub(crate) fn order(steered: Steered, at: &Situation, session: u64, params: &Params) -> Order {
    let (d, choice) = (at.decision, at.choice);
    let content = steered.content();
    let n = steered.targets().len();
    let target_of = |id: &str| (0..n).position(|t| pathway(steered, t) == id);

    // The serving pathways, by score for the session: P(first) = w / Σw.
    let key = session ^ selection::salt(steered.text());
    let mut scored: Vec<(f64, usize)> = steered
        .weighted(choice)
        .map(|(t, w)| (selection::score(key, steered.salt(t), w), t))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let serving: Vec<usize> = scored.into_iter().map(|(_, t)| t).collect();

    // Demotions: those carried over, and what is reported below the floor now.
    let mut demoted = vec![false; n];
    for id in &params.demoted {
        if let Some(t) = target_of(id) {
            demoted[t] = true;
        }
    }
    if let Some(floor) = content.throughput_floor_bps {
        for (id, rate) in &params.reported {
            if let (Some(t), Some(rate)) = (target_of(id), rate) {
                if *rate < floor {
                    demoted[t] = true;
                }
            }
        }
    }
    if serving.iter().all(|&t| demoted[t]) {
        demoted.iter_mut().for_each(|d| *d = false);
    }

    let mut targets: Vec<usize> = serving.iter().copied().filter(|&t| !demoted[t]).collect();
    targets.extend(serving.iter().copied().filter(|&t| demoted[t]));
    targets.extend((0..n).filter(|t| !serving.contains(t)));
    Order {
        region: d.region,
        targets,
        demoted: (0..n).filter(|&t| demoted[t]).collect(),
        ttl: content.ttl.unwrap_or_else(|| steered.ttl()),
    }
}

/// The pathway id of target `t`: as configured, else the CDN's name.
pub(crate) fn pathway<'p>(steered: Steered<'p>, t: usize) -> &'p str {
    steered
        .content()
        .pathways
        .get(t)
        .map_or_else(|| &*steered.target(t).cdn, String::as_str)
}

/// The percent of sessions that get each serving target of `choice` (one of
/// `steered`'s) first, as `explain` shows it.
pub(crate) fn first_shares<'p>(steered: Steered<'p>, choice: &'p Choice) -> Vec<(usize, f64)> {
    let weighted: Vec<(usize, u64)> = steered.weighted(choice).collect();
    let total: u64 = weighted.iter().map(|(_, w)| w).sum();
    weighted
        .into_iter()
        .map(|(t, w)| (t, w as f64 * 100.0 / total.max(1) as f64))
        .collect()
}

/// Writes the steering manifest of `order` for `session` into `out`:
///
/// ```json
/// {"VERSION":1,"TTL":15,"RELOAD-URI":"www.example.com?session=00c0ffee00c0ffee","PATHWAY-PRIORITY":["a","b"]}
/// ```
///
/// A DASH manifest lists the order twice: as `SERVICE-LOCATION-PRIORITY` (the DASH-IF
/// name) and as `PATHWAY-PRIORITY`, the key dash.js reads for DASH as well; a player
/// ignores the key it does not know.
///
/// `RELOAD-URI` is relative (to the manifest's own URL, so it survives a proxy that
/// mounts the server under another path): the name, the session key, the session's
/// demotions and the beacon `ticket` (so that the next poll's throughput counts).
/// The ticket is given as `STEERDNS-TICKET` too, for the page's own beacons; a player
/// ignores the keys it does not know.
pub(crate) fn write(
    format: Format,
    steered: Steered,
    order: &Order,
    session: u64,
    ticket: &str,
    out: &mut String,
) {
    let name = steered.text();
    let name = name.strip_suffix('.').unwrap_or(name);
    let mut uri = String::with_capacity(name.len() + 40);
    url_component(name, &mut uri);
    let _ = write!(uri, "?session={session:016x}");
    for (i, &t) in order.demoted.iter().enumerate() {
        uri.push_str(if i == 0 { "&demoted=" } else { "," });
        url_component(pathway(steered, t), &mut uri);
    }
    uri.push_str("&ticket=");
    url_component(ticket, &mut uri);
    let _ = write!(out, "{{\"VERSION\":1,\"TTL\":{},\"RELOAD-URI\":", order.ttl);
    json_string(&uri, out);
    out.push_str(",\"STEERDNS-TICKET\":");
    json_string(ticket, out);
    let keys: &[&str] = match format {
        Format::Hls => &["PATHWAY-PRIORITY"],
        // DASH: the DASH-IF name, and the HLS one, which is what dash.js (4.7 and 5.2
        // checked) reads for DASH too.
        Format::Dash => &["SERVICE-LOCATION-PRIORITY", "PATHWAY-PRIORITY"],
    };
    for key in keys {
        out.push_str(",\"");
        out.push_str(key);
        out.push_str("\":[");
        for (i, &t) in order.targets.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            json_string(pathway(steered, t), out);
        }
        out.push(']');
    }
    out.push('}');
}

/// `s` as a JSON string (RFC 8259 §7).
fn json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `s` percent-encoded but for RFC 3986's unreserved characters.
fn url_component(s: &str, out: &mut String) {
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hls_parameters() {
        let p = parse_query(
            Format::Hls,
            "session=00000000000000ff&_HLS_pathway=cdn-a&_HLS_throughput=1500000.5&x=1&demoted=b%2Cc&ticket=00000000000000ff.9.AB-_",
        )
        .unwrap();
        assert_eq!(p.session, Some(255));
        assert_eq!(p.ticket.as_deref(), Some("00000000000000ff.9.AB-_"));
        assert_eq!(p.reported, vec![("cdn-a".to_string(), Some(1_500_000))]);
        assert_eq!(p.demoted, vec!["b".to_string(), "c".to_string()]);
        // The other format's parameters are not ours.
        let p = parse_query(Format::Hls, "_DASH_pathway=%22a%22").unwrap();
        assert_eq!(p, Params::default());
    }

    #[test]
    fn dash_parameters_are_lists_in_kbit_per_second() {
        let p = parse_query(
            Format::Dash,
            "_DASH_pathway=%22b%2Ca%2Cc%22&_DASH_throughput=900%2C4000",
        )
        .unwrap();
        assert_eq!(
            p.reported,
            vec![
                ("b".to_string(), Some(900_000)),
                ("a".to_string(), Some(4_000_000)),
                ("c".to_string(), None)
            ]
        );
    }

    #[test]
    fn malformed_parameters_are_refused() {
        for (f, q) in [
            (Format::Hls, "session=xyz"),
            (Format::Hls, "session=00000000000000fff"),
            (
                Format::Hls,
                "session=0000000000000000&session=0000000000000001",
            ),
            (Format::Hls, "_HLS_pathway=a%2Fb"),
            (Format::Hls, "_HLS_pathway="),
            (Format::Hls, "_HLS_pathway=%zz"),
            (Format::Hls, "_HLS_pathway=%C3%A9"),
            (Format::Hls, "_HLS_throughput=-1"),
            (Format::Hls, "_HLS_throughput=1e9"),
            (Format::Hls, "_HLS_throughput="),
            (Format::Hls, "_HLS_throughput=NaN"),
            (Format::Dash, "_DASH_throughput=1,x"),
            (Format::Dash, "_DASH_pathway=%22a,b c%22"),
            (Format::Hls, "demoted=a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q"),
            (Format::Hls, "ticket=a&ticket=b"),
        ] {
            assert!(parse_query(f, q).is_err(), "{q} accepted");
        }
    }

    #[test]
    fn strings_are_escaped() {
        let mut out = String::new();
        json_string("a\"b\\c\u{1}", &mut out);
        assert_eq!(out, r#""a\"b\\c\u0001""#);
        let mut out = String::new();
        url_component("a b/é", &mut out);
        assert_eq!(out, "a%20b%2F%C3%A9");
    }
}
