//! Input: the policy (`Policy`, `HostPolicy`: names, CDNs, regions, failover, drains,
//! content steering, modifiers) as `steering.yaml` is parsed into it, and `parse`.
//! (The main room of its folder; the folder's door, `mod.rs`, says what else lives there.)

use super::*;
use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use hickory_proto::rr::Name;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::error::{ConfigIssue, Issues};

// ===== the validated policy =====

/// Everything `steering.yaml` says, validated.
#[derive(Clone, Debug)]
pub struct Policy {
    /// The file it came from (messages and `check` output name it).
    pub file: PathBuf,
    /// The file's text, kept so that later cross-checks (against the zones) can still
    /// find the line of a field.
    pub source: String,
    /// The policy version: the first 12 hex digits of the SHA-256 of the file's bytes
    /// (dnstap's steering decisions name it).
    pub version: String,
    pub hosts: Vec<HostPolicy>,
    /// Signing (`dnssec:`); `None`: the zones are served unsigned.
    pub dnssec: Option<super::dnssec::DnssecSettings>,
    /// Each host's index in `hosts`, by its name's text (`www.example.com.`): built
    /// when the policy is validated, read by [`Policy::host`].
    pub(super) by_name: std::collections::HashMap<String, usize>,
}

/// The policy of one steered name.
#[derive(Clone, Debug)]
pub struct HostPolicy {
    /// Fully qualified, lowercase.
    pub name: Name,
    /// Where this host's keys live in the file (`[]` for the single-name form,
    /// `hostnames.<name>` otherwise), to locate errors found later.
    pub path: Vec<Seg>,
    /// TTL of normal answers.
    pub ttl: u32,
    /// TTL while a CDN of this name is off its normal weight (used by failover).
    pub incident_ttl: Option<u32>,
    /// How a CDN is picked among the region's weights.
    pub selection: Selection,
    /// In file order; regions refer to them by index.
    pub cdns: Vec<Cdn>,
    /// In file order: the first that matches a client wins; the last is the default.
    pub regions: Vec<Region>,
    pub failover: Failover,
    pub drains: Vec<Drain>,
    /// How HLS and DASH players are steered (`content_steering:`); defaults when absent.
    pub content: ContentSteering,
    /// The customer this name belongs to (`tenant:`): drains and freezes may target a
    /// tenant, and API tokens may be scoped to tenants.
    pub tenant: Option<String>,
    /// How contracts and capacities move shares (`commit:`); defaults when absent.
    pub commit: super::contract::CommitSettings,
}

/// Content steering of one name for HLS and DASH players (`content_steering:`, beside
/// `ttl`): what the steering manifests on `--steering-http` call each CDN, how long a
/// player keeps a manifest, and when a player's measured throughput demotes a pathway.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContentSteering {
    /// The pathway id (HLS `PATHWAY-ID`, DASH `serviceLocation`) of each CDN, by CDN
    /// index: the CDN's name unless `pathways:` maps it.
    pub pathways: Vec<String>,
    /// The manifest's `TTL`; `None`: the name's DNS TTL (the incident TTL during one).
    pub ttl: Option<u32>,
    /// A player reporting less than this (bits per second) on its current pathway gets
    /// that pathway moved down for its session; `None`: never.
    pub throughput_floor_bps: Option<u64>,
}

/// Whether `name` may be a tenant: 1 to 64 of `[a-z0-9._-]`, so that it reads the same
/// in the policy, a token file, a URL and a log line.
pub fn valid_tenant(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_')
        })
}

/// Whether `id` may be a pathway id: 1 to 64 of `[A-Za-z0-9._-]` (the HLS content
/// steering specification's `PATHWAY-ID` characters), so that it needs no escaping in
/// a playlist, an MPD, JSON or a URL.
pub fn valid_pathway(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

/// How the weighted pick is made (`selection:`, beside `ttl`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Selection {
    /// A pure function of the resolver, the client network within the ECS scope and
    /// a staggered time window (weighted rendezvous hashing): every nameserver of the
    /// set gives the same resolver the same answer, and a step moves only the clients
    /// of the CDN it demotes.
    #[default]
    Consistent,
    /// One random draw per query.
    Random,
}

#[derive(Clone, Debug)]
pub struct Cdn {
    pub name: String,
    /// Absolute name the steered name is a CNAME to.
    pub cname: Name,
    /// How the CDN bills (`contract:`); `None`: no commit or cap to steer by.
    pub contract: Option<super::contract::Contract>,
    /// The most the CDN can carry (`capacity_mbps:`), Mbit/s.
    pub capacity_mbps: Option<f64>,
}

#[derive(Clone, Debug)]
pub struct Region {
    /// `name:` from the file, or the match list (`GB,IE,DE`), or `default` for `"*"`.
    pub name: String,
    pub matches: Vec<Match>,
    /// Weight of each CDN of the host, by CDN index; 0 = never answered here.
    pub weights: Vec<u32>,
    /// How measured performance may move `weights` (`performance:`); `None`: static.
    pub performance: Option<super::perf::Performance>,
    /// What moved `weights` from the file's (`performance`, `commit`), for dnstap's
    /// steering decisions; empty as loaded.
    pub moved_by: Vec<&'static str>,
}

/// At most this many distinct location scopes of drains per name: each doubles the
/// precomputed choices of the plan.
pub const MAX_DRAIN_SCOPES: usize = 6;

/// How many distinct location scopes (the `Match` entries of a scope, as the planner
/// groups them) these drain scopes have: what [`MAX_DRAIN_SCOPES`] limits, for the
/// policy's drains (`check`) and the API's (409).
pub fn location_scopes<'s>(scopes: impl Iterator<Item = &'s [DrainScope]>) -> usize {
    let mut groups: Vec<Vec<Match>> = Vec::new();
    for scope in scopes {
        let g: Vec<Match> = scope
            .iter()
            .filter_map(|s| match s {
                DrainScope::Match(m) => Some(*m),
                DrainScope::Region(_) => None,
            })
            .collect();
        if !g.is_empty() && !groups.contains(&g) {
            groups.push(g);
        }
    }
    groups.len()
}

/// How a demoted CDN's weight is taken away, and given back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failover {
    /// Percent of the weight removed at each step; increasing, ends at 100.
    pub steps: Vec<u8>,
    pub step_interval: Duration,
}

impl Default for Failover {
    fn default() -> Self {
        Failover {
            steps: vec![50, 100],
            step_interval: Duration::from_secs(90),
        }
    }
}

/// An operator's request to take a CDN out of service.
#[derive(Clone, Debug)]
pub struct Drain {
    /// Index into the host's `cdns`.
    pub cdn: usize,
    /// Empty: everywhere.
    pub scope: Vec<DrainScope>,
    pub reason: String,
    pub until: Option<SystemTime>,
    /// Move all traffic at once instead of in failover steps.
    pub immediate: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainScope {
    /// A region, by index.
    Region(usize),
    Match(Match),
}

impl Policy {
    /// The policy of the steered name `name` (absolute, as its text reads:
    /// `www.example.com.`): the one way to find a host by name.
    pub fn host(&self, name: &str) -> Option<&HostPolicy> {
        let h = self.hosts.get(*self.by_name.get(name)?)?;
        // `hosts` is public: a host moved since the index was built is still found.
        if name_is(&h.name, name) {
            Some(h)
        } else {
            self.hosts.iter().find(|h| name_is(&h.name, name))
        }
    }

    /// The index of [`Policy::host`] for `hosts`.
    pub(super) fn index(hosts: &[HostPolicy]) -> std::collections::HashMap<String, usize> {
        let mut by_name = std::collections::HashMap::with_capacity(hosts.len());
        for (i, h) in hosts.iter().enumerate() {
            by_name.entry(h.name.to_string()).or_insert(i);
        }
        by_name
    }

    /// The steered names (absolute) of each tenant.
    /// Whether some steered name has the CDN `cdn`.
    pub fn has_cdn(&self, cdn: &str) -> bool {
        self.hosts.iter().any(|h| h.has_cdn(cdn))
    }

    /// Whether some steered name is of tenant `tenant`.
    pub fn has_tenant(&self, tenant: &str) -> bool {
        self.hosts
            .iter()
            .any(|h| h.tenant.as_deref() == Some(tenant))
    }

    pub fn tenants(&self) -> std::collections::BTreeMap<String, Vec<String>> {
        let mut out: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for h in &self.hosts {
            if let Some(t) = &h.tenant {
                out.entry(t.clone()).or_default().push(h.name.to_string());
            }
        }
        out
    }

    /// The tenant of `name` (absolute), if it has one.
    pub fn tenant_of(&self, name: &str) -> Option<&str> {
        self.host(name).and_then(|h| h.tenant.as_deref())
    }
}

impl HostPolicy {
    /// Whether the name has a CDN called `cdn`.
    pub fn has_cdn(&self, cdn: &str) -> bool {
        self.cdns.iter().any(|c| c.name == cdn)
    }
}

/// Whether `name`'s text (`www.example.com.`) is `text`, without making the text.
pub(super) fn name_is(name: &Name, text: &str) -> bool {
    struct Rest<'a>(&'a str);
    impl fmt::Write for Rest<'_> {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            match self.0.strip_prefix(s) {
                Some(rest) => {
                    self.0 = rest;
                    Ok(())
                }
                None => Err(fmt::Error),
            }
        }
    }
    let mut rest = Rest(text);
    fmt::Write::write_fmt(&mut rest, format_args!("{name}")).is_ok() && rest.0.is_empty()
}

// ===== the file, as written =====

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    pub(super) hostname: Option<String>,
    pub(super) hostnames: Option<OrderedMap<RawHost>>,
    pub(super) ttl: Option<i64>,
    pub(super) incident_ttl: Option<i64>,
    pub(super) selection: Option<Selection>,
    pub(super) cdns: Option<OrderedMap<RawCdn>>,
    pub(super) regions: Option<Vec<RawRegion>>,
    pub(super) failover: Option<RawFailover>,
    pub(super) drain: Option<Vec<RawDrain>>,
    pub(super) content_steering: Option<RawContent>,
    pub(super) commit: Option<super::contract::RawCommit>,
    pub(super) dnssec: Option<super::dnssec::RawDnssec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHost {
    pub(super) tenant: Option<String>,
    pub(super) ttl: Option<i64>,
    pub(super) incident_ttl: Option<i64>,
    pub(super) selection: Option<Selection>,
    pub(super) cdns: Option<OrderedMap<RawCdn>>,
    pub(super) regions: Option<Vec<RawRegion>>,
    pub(super) failover: Option<RawFailover>,
    pub(super) drain: Option<Vec<RawDrain>>,
    pub(super) content_steering: Option<RawContent>,
    pub(super) commit: Option<super::contract::RawCommit>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawContent {
    pub(super) pathways: Option<OrderedMap<Scalar>>,
    pub(super) ttl: Option<i64>,
    pub(super) throughput_floor_bps: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCdn {
    pub(super) cname: String,
    pub(super) contract: Option<super::contract::RawContract>,
    pub(super) capacity_mbps: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRegion {
    pub(super) name: Option<String>,
    #[serde(rename = "match")]
    pub(super) matches: Option<Vec<Scalar>>,
    pub(super) weights: Option<OrderedMap<i64>>,
    pub(super) performance: Option<super::perf::RawPerformance>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFailover {
    pub(super) steps: Option<Vec<i64>>,
    pub(super) step_interval_seconds: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDrain {
    pub(super) cdn: String,
    #[serde(rename = "where")]
    pub(super) scope: Option<Vec<Scalar>>,
    pub(super) reason: Option<String>,
    pub(super) until: Option<Scalar>,
    #[serde(default)]
    pub(super) immediate: bool,
}

/// A string-like YAML scalar. `NO` (Norway) is a boolean to some YAML readers and
/// `2026-12-01T12:00:00Z` a timestamp to others; here both stay the text they were.
#[derive(Clone, Debug)]
pub(super) struct Scalar(pub(super) String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

pub(super) const DUPLICATE: &str = "duplicate key ";

/// A mapping that keeps file order and refuses duplicate keys (serde's maps would
/// silently keep the last one: two `fastly:` entries must be an error).
pub(super) struct OrderedMap<T>(pub(super) Vec<(String, T)>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for OrderedMap<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = OrderedMap<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OrderedMap<T>, A::Error> {
                let mut out: Vec<(String, T)> = Vec::new();
                while let Some(Scalar(key)) = map.next_key()? {
                    if out.iter().any(|(k, _)| *k == key) {
                        return Err(de::Error::custom(format!("{DUPLICATE}`{key}`")));
                    }
                    out.push((key, map.next_value()?));
                }
                Ok(OrderedMap(out))
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

// ===== loading =====

/// A policy's version: the first 12 hex digits of the SHA-256 of its text, so that the
/// same file copied to every node is one version, and any edit is another.
pub fn version_of(text: &str) -> String {
    let mut v = super::tokens::hex(&super::tokens::sha256(text.as_bytes()));
    v.truncate(12);
    v
}

/// Whether `s` is written as a policy version is (12 lowercase hex digits).
pub fn is_version(s: &str) -> bool {
    s.len() == 12
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Reads and validates a policy file. On success the `Issues` hold only warnings.
pub fn load(path: &Path) -> Result<(Policy, Issues), Issues> {
    let source = std::fs::read_to_string(path).map_err(|e| {
        Issues(vec![ConfigIssue::error(
            path,
            None,
            "",
            format!("cannot read: {e}"),
        )])
    })?;
    parse(path, source)
}

/// Every entry of the policy's `match:` lists and drains' `where:` lists, with its
/// field path: what the checks against the node's databases walk.
fn each_match(policy: &Policy, mut f: impl FnMut(Vec<Seg>, &Match)) {
    for host in &policy.hosts {
        for (i, r) in host.regions.iter().enumerate() {
            for (j, m) in r.matches.iter().enumerate() {
                let mut path = host.path.clone();
                path.extend([
                    Seg::Key("regions".into()),
                    Seg::Index(i),
                    Seg::Key("match".into()),
                    Seg::Index(j),
                ]);
                f(path, m);
            }
        }
        for (k, d) in host.drains.iter().enumerate() {
            for (j, s) in d.scope.iter().enumerate() {
                if let DrainScope::Match(m) = s {
                    let mut path = host.path.clone();
                    path.extend([
                        Seg::Key("drain".into()),
                        Seg::Index(k),
                        Seg::Key("where".into()),
                        Seg::Index(j),
                    ]);
                    f(path, m);
                }
            }
        }
    }
}

/// Every AS entry of the policy (`match:` and drains' `where:`), refused: the policy
/// matches AS numbers and no ASN database was given.
pub fn check_without_asn(policy: &Policy) -> Issues {
    let mut issues = Issues::default();
    each_match(policy, |path, m| {
        if matches!(m, Match::Asn(_)) {
            issues.push(ConfigIssue::error(
                &policy.file,
                super::locate::line_of(&policy.source, &path),
                super::locate::render(&path),
                format!("`{m}`: AS-number matching needs an ASN database: give one with --asn-db FILE (GeoLite2-ASN format)"),
            ));
        }
    });
    issues
}

/// Every country or continent the policy names (`match:`, drains' `where:`) that no
/// network of the geo database is in (`places`: the database's distinct places): no
/// client is ever placed there. A warning for the policy file (the entry matches no
/// client; `check`, a reload and a set of one say so), and an error for a version of
/// a set of several nodes (`as_version`): they must place clients alike, so a node
/// whose database lacks a place a version names refuses the version (and a staged
/// rollout of it halts).
pub fn check_against_places(
    policy: &Policy,
    places: &[crate::place::geo::Place],
    as_version: bool,
) -> Issues {
    let mut issues = Issues::default();
    let has = |m: &Match| match *m {
        Match::Country(c) => places.iter().any(|p| p.country == Some(c)),
        Match::Continent(c) => places.iter().any(|p| p.continent == Some(c)),
        Match::Any | Match::Net(_) | Match::Asn(_) => true,
    };
    each_match(policy, |path, m| {
        if has(m) {
            return;
        }
        let line = super::locate::line_of(&policy.source, &path);
        let field = super::locate::render(&path);
        let issue = if as_version {
            ConfigIssue::error(
                &policy.file,
                line,
                field,
                format!("`{m}`: this node's geo database has no network there, so it would place those clients elsewhere than the nodes whose database has (give every node the same geo database, or remove `{m}`)"),
            )
        } else {
            ConfigIssue::warning(
                &policy.file,
                line,
                field,
                format!(
                    "`{m}`: the geo database has no network there, so this entry matches no client"
                ),
            )
        };
        issues.push(issue);
    });
    issues
}

/// Parses and validates policy text (`path` is only used in messages).
pub fn parse(path: &Path, source: String) -> Result<(Policy, Issues), Issues> {
    let raw: RawFile = match serde_yaml::from_str(&source) {
        Ok(raw) => raw,
        Err(e) => return Err(Issues(vec![yaml_issue(path, &source, &e)])),
    };
    super::validate::validate(path, source, raw)
}

/// serde_yaml says ``regions[0].weights: unknown field `wieght`… at line 6 column 9``;
/// split that into our field and line.
pub(crate) fn yaml_issue(path: &Path, source: &str, e: &serde_yaml::Error) -> ConfigIssue {
    let mut line = e.location().map(|l| l.line());
    let mut msg = e.to_string();
    if let Some(i) = msg.rfind(" at line ") {
        msg.truncate(i);
    }
    let (field, message) = match msg.split_once(": ") {
        Some((field, rest)) if !field.contains(' ') => (field.to_string(), rest.to_string()),
        _ => (String::new(), msg),
    };
    // serde_yaml places a duplicate at its mapping; point at the repeated key instead.
    if let Some(key) = message.strip_prefix(DUPLICATE).map(|k| k.trim_matches('`')) {
        let mut at = parse_path(&field);
        at.push(Seg::Repeat(key.to_string()));
        line = line_of(source, &at).or(line);
    }
    ConfigIssue::error(path, line, field, message)
}

/// Reads back a rendered path (`regions[1].weights`); keys holding dots (host names)
/// are matched whole when they follow `hostnames.`.
pub(super) fn parse_path(s: &str) -> Vec<Seg> {
    let mut out = Vec::new();
    let mut rest = s;
    if let Some(host) = rest.strip_prefix("hostnames.") {
        out.push(Seg::Key("hostnames".into()));
        let end = host
            .find(".cdns")
            .or_else(|| host.find(".regions"))
            .or_else(|| host.find(".drain"))
            .or_else(|| host.find(".failover"))
            .or_else(|| host.find(".content_steering"))
            .or_else(|| host.find(".tenant"))
            .or_else(|| host.find(".commit"))
            .unwrap_or(host.len());
        out.push(Seg::Key(host[..end].to_string()));
        rest = host[end..].trim_start_matches('.');
    }
    for part in rest.split('.').filter(|p| !p.is_empty()) {
        let mut it = part.split('[');
        if let Some(k) = it.next().filter(|k| !k.is_empty()) {
            out.push(Seg::Key(k.to_string()));
        }
        for idx in it {
            if let Ok(i) = idx.trim_end_matches(']').parse() {
                out.push(Seg::Index(i));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::place::countries::{Continent, Country};
    use crate::place::geo::Place;

    #[test]
    fn a_place_the_geo_database_lacks_warns_in_a_file_and_refuses_a_version() {
        let text = "hostname: www.example.com\nttl: 30\ncdns:\n  a: { cname: a.cdn.test. }\nregions:\n  - match: [GB, continent:SA]\n    weights: { a: 1 }\n  - match: [continent:EU]\n    weights: { a: 1 }\n  - match: [\"*\"]\n    weights: { a: 1 }\n";
        let (policy, _) = parse(Path::new("steering.yaml"), text.to_string()).unwrap();
        // A database with Great Britain (in Europe) alone.
        let places = [Place {
            country: Country::parse("GB"),
            continent: Some(Continent::Europe),
            ..Place::default()
        }];
        let file = check_against_places(&policy, &places, false);
        let said: Vec<String> = file.0.iter().map(ToString::to_string).collect();
        assert!(!file.has_errors(), "{said:?}");
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].contains(
                "regions[0].match[1]: `continent:SA`: the geo database has no network there"
            ),
            "{said:?}"
        );
        let version = check_against_places(&policy, &places, true);
        assert!(version.has_errors());
        assert_eq!(version.errors().count(), 1);
    }
}
