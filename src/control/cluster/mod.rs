//! Control plane: a set of nameservers (and probe agents) sharing one view through etcd
//! (`serve --etcd`, `agent --etcd`). Without `--etcd` nothing here runs.
//!
//! ```text
//!  prober ─▶ Local ─▶ publisher ──put (lease)──▶ etcd ◀──txn / put── controller (transitions,
//!                                                 │                   API drains, freeze)
//!                       controller ◀── Shared ◀── session: range, then watch + liveness check
//! ```
//!
//! Keys under the prefix (default `/steerdns/`), values JSON:
//!
//! | key | value | written by |
//! |---|---|---|
//! | `obs/{vantage}/{cdn}` | [`SharedObservation`], under the vantage's lease (≈ 3 probe intervals) | every node and agent, each round |
//! | `timeline/{name}/{cdn}` | [`Timeline`]: direction, level at start, start time | the first node whose health flips (create-if-absent, or compare-and-swap on the revision) |
//! | `drain/{id}` | [`SharedDrain`]: the rule, who, when | the node whose API got it (a lease ends it at `until`) |
//! | `freeze` | [`Freeze`]: why, who, when | the node whose API got it |
//! | `freeze/{tenant}` | [`Freeze`] of that tenant's names | the node whose API got it |
//! | `usage/{cdn}/{day}` | [`usage::SharedUsage`]: one CDN's usage records of one UTC day (a lease of 64 days) | the node whose API or feed took them (read, merge, compare-and-swap) |
//! | `commit/{name}` | [`usage::SharedBiases`]: the commit biases of the set's latest evaluation | the first node to evaluate that period (create-if-absent, or compare-and-swap) |
//! | `perf/{node}/{name}/{region}` | [`performance::SharedCells`]: one node's performance buckets of a region's window (a lease of the window) | that node, each bucket width in which it took samples |
//! | `shift/{name}/{region}` | [`performance::SharedShift`]: the set's latest performance evaluation of a region | the first node to evaluate that period (create-if-absent, or compare-and-swap) |
//! | `audit/{node}/{serial}` | an audit entry (an hour's lease) | the node where it happened; every node appends them to its `audit.jsonl` in revision order, so all hold the same chain |
//!
//! A timeline is a pure function of time ([`Timeline::at`]): every node derives the same
//! step at the same moment from the same record, so the set moves together without a
//! leader. Everything read is checked before it counts (schema, sane names, CDNs and
//! names of the policy: see the controller); a key that fails is counted and ignored.
//!
//! **Fail static.** The session watches and checks liveness on one and the same member:
//! every [`LIVENESS`] a linearizable read (which a member without a quorum cannot
//! answer) that must come back within [`LIVENESS_TIMEOUT`]. A member that hangs or
//! loses its quorum moves the session to the next member; when no member answers the
//! read within [`FAIL_STATIC_AFTER`], the node fails static: it keeps the last shared
//! state it saw, its observations of others age until they no longer count, and it
//! writes no timeline: no demotion starts from its own probes alone. When etcd answers
//! again it reads everything anew and follows.
//!
//! **Writers.** Only the members named by the operator (`--members`: nodes and agents)
//! are vantage points; an observation under any other name is refused and counted.
//! etcd's roles make each member write only its own `obs/{name}/` (and a node the
//! shared keys): see the README.
//!
//! **Bounds.** A value over [`etcd::MAX_VALUE`], a key outside the table above, or one
//! past the cap of its kind is refused when it is decoded and is not kept; the initial
//! read comes in pages; a watch batch parses only the keys it changes.

pub mod etcd;
pub mod node;
pub mod performance;
pub mod usage;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::clock::now_ms;
use crate::control::drains::DrainRule;
use crate::control::health::{Observation, VantageView};
use crate::control::prober::Local;
use crate::control::stepper::{Direction, Stepper};
use crate::control::times;

pub use etcd::{Etcd, EtcdError, EtcdOptions};

/// How often the session checks that etcd still answers (with a quorum).
pub const LIVENESS: Duration = Duration::from_millis(400);
/// How long the member watched may take to answer a liveness read before the session
/// moves to the next member.
pub const LIVENESS_TIMEOUT: Duration = Duration::from_millis(1000);
/// How long the session may look for a member that answers before the node fails
/// static.
pub const FAIL_STATIC_AFTER: Duration = Duration::from_millis(1000);
/// Most observation keys counted per vantage point (one per probed CDN).
pub const MAX_OBS_PER_VANTAGE: usize = 64;
/// Most timelines, drains kept; and most keys read at once.
pub const MAX_TIMELINES: usize = 1024;
pub const MAX_DRAINS: usize = 256;
pub const MAX_KEYS: usize = 8192;
/// Most refused keys remembered by name (the count goes on past it).
const MAX_REFUSED_KEPT: usize = 1024;
/// How long one call to etcd may take before the member counts as unreachable.
pub const CALL_TIMEOUT: Duration = Duration::from_millis(1500);
/// Longest vantage, node or CDN name accepted in a key.
const MAX_NAME: usize = 128;
/// Most vantage points counted (bounds memory and the per-vantage metric series).
pub const MAX_VANTAGES: usize = 64;
/// Longest reason accepted.
const MAX_REASON: usize = 2048;
/// Audit entries kept from etcd (the newest), and the largest one read.
pub const MAX_AUDIT_KEYS: usize = 4096;
const MAX_AUDIT_VALUE: usize = 16 * 1024;
/// How long an audit entry stays in etcd (every node has appended it by then).
pub const AUDIT_TTL: Duration = Duration::from_secs(3600);

/// `--etcd`, `--node`, `--etcd-prefix` and the credentials.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub etcd: EtcdOptions,
    /// This node's (or agent's) name: its vantage name in the set.
    pub node: String,
    /// Key prefix, ending in `/`.
    pub prefix: String,
    /// The set's members (`--members`: nodes and agents): the only vantage points
    /// whose observations count.
    pub members: Vec<String>,
}

impl ClusterOptions {
    /// Whether the options make sense: sane names, and authentication unless
    /// `--etcd-insecure` says otherwise.
    pub fn check(&self) -> Result<(), String> {
        if !sane_name(&self.node) {
            return Err(format!(
                "--node {:?}: 1 to 128 of letters, digits, ._-:@",
                self.node
            ));
        }
        if let Some(m) = self.members.iter().find(|m| !sane_name(m)) {
            return Err(format!(
                "--members: {m:?} is not 1 to 128 of letters, digits, ._-:@"
            ));
        }
        let authenticated = self.etcd.user.is_some() || self.etcd.cert_file.is_some();
        if !authenticated && !self.etcd.insecure {
            return Err("joining etcd without authentication lets anyone who reaches it decide for the set: give --etcd-user (or --etcd-cert), or --etcd-insecure to accept it".into());
        }
        Ok(())
    }
}

/// Whether `s` may be a name in a key: letters, digits and `._-:@`.
pub fn sane_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:@".contains(&b))
}

// === records ===

/// One vantage point's latest result for one CDN, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedObservation {
    pub round: u64,
    pub ok: bool,
    pub reason: String,
    /// False while the writer cannot yet tell "this CDN fails" from "my network fails"
    /// (not every CDN probed since this failure began): it does not count yet.
    pub settled: bool,
}

/// One failover timeline of a (name, CDN), shared by the whole set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeline {
    pub direction: Direction,
    /// The level (0 = normal, n = `steps[n - 1]` removed) when it started.
    pub from_level: usize,
    /// When it started (Unix ms): the first step applies then, each next one a step
    /// interval later.
    #[serde(deserialize_with = "times::bounded")]
    pub start_unix_ms: u64,
    pub node: String,
    pub reason: String,
}

/// A drain override, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedDrain {
    pub rule: DrainRule,
    pub node: String,
    #[serde(deserialize_with = "times::bounded")]
    pub at_unix_ms: u64,
}

/// The operator's freeze, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Freeze {
    pub reason: String,
    pub node: String,
    #[serde(deserialize_with = "times::bounded")]
    pub at_unix_ms: u64,
}

impl Timeline {
    /// The level at `t` (Unix ms) and when the next step is due, for `top` steps of
    /// `interval_ms` each. Before its start (written by a node whose clock is ahead)
    /// it holds its starting level, and the first step is due at the start.
    pub fn at(&self, top: usize, interval_ms: u64, t: u64) -> (usize, Option<u64>) {
        let from = self.from_level.min(top);
        if t < self.start_unix_ms {
            let moves = match self.direction {
                Direction::Demote => from < top,
                Direction::Promote => from > 0,
            };
            return (from, moves.then_some(self.start_unix_ms));
        }
        let interval = interval_ms.max(1);
        let k = (t - self.start_unix_ms) / interval;
        let taken = usize::try_from(k).unwrap_or(usize::MAX).saturating_add(1);
        let next = self.start_unix_ms + (k + 1) * interval;
        match self.direction {
            Direction::Demote => {
                let level = from.saturating_add(taken).min(top);
                (level, (level < top).then_some(next))
            }
            Direction::Promote => {
                let level = from.saturating_sub(taken);
                (level, (level > 0).then_some(next))
            }
        }
    }

    /// The start as this node schedules it: a start further ahead of `t` than one
    /// step interval (a writer's clock far ahead) is brought back to `t + interval`.
    /// `Some` when clamped.
    pub fn clamp(&mut self, interval_ms: u64, t: u64) -> Option<u64> {
        let latest = t.saturating_add(interval_ms);
        (self.start_unix_ms > latest).then(|| std::mem::replace(&mut self.start_unix_ms, latest))
    }

    /// The stepper for this timeline, as of `t` (Unix ms) and the monotonic `now`.
    pub fn stepper(&self, top: usize, interval_ms: u64, t: u64, now: Instant) -> Stepper {
        let (level, next) = self.at(top, interval_ms, t);
        Stepper {
            level,
            direction: self.direction,
            next_at: next.map(|ms| now + Duration::from_millis(ms.saturating_sub(t))),
        }
    }
}

// === the shared view ===

/// Everything read from etcd, parsed and checked for form (not yet against the policy).
#[derive(Clone, Debug, Default)]
pub struct SharedView {
    /// Per vantage point, per CDN: the observation and when this node received it.
    pub observations: BTreeMap<String, BTreeMap<String, (SharedObservation, Instant)>>,
    /// Per (name, CDN): the timeline and its revision (for compare-and-swap).
    pub timelines: BTreeMap<(String, String), (Timeline, i64)>,
    /// Per override id.
    pub drains: BTreeMap<String, SharedDrain>,
    pub freeze: Option<Freeze>,
    /// Per tenant: the freeze of its names.
    pub freeze_tenants: BTreeMap<String, Freeze>,
    /// Audit entries by revision: every node appends them in this order.
    pub audit: BTreeMap<i64, serde_json::Value>,
    /// Per (CDN, day): its usage records and their revision.
    pub usage: BTreeMap<(String, String), (Arc<usage::SharedUsage>, i64)>,
    /// Per name: the biases of the set's latest evaluation, and their revision.
    pub commits: BTreeMap<String, (usage::SharedBiases, i64)>,
    /// Per (node, name, region index): that node's performance buckets.
    pub perf_cells: BTreeMap<(String, String, usize), Arc<crate::control::perf::NodeCells>>,
    /// Per (name, region index): the set's latest performance evaluation, and its
    /// revision.
    pub shifts: BTreeMap<(String, usize), (performance::SharedShift, i64)>,
    /// Keys refused (bad form), and the last one with why.
    pub refused: u64,
    pub last_refused: Option<String>,
}

impl SharedView {
    /// Every other vantage point's view now (ages counted from when each result was
    /// received here), at most [`MAX_VANTAGES`], without `own`.
    pub fn vantage_views(&self, own: &str, known_cdn: impl Fn(&str) -> bool) -> Vec<VantageView> {
        let now = Instant::now();
        self.observations
            .iter()
            .filter(|(v, _)| v.as_str() != own)
            .map(|(v, cdns)| {
                let latest: BTreeMap<String, Observation> = cdns
                    .iter()
                    .filter(|(c, _)| known_cdn(c))
                    .map(|(c, (o, at))| {
                        let obs = Observation {
                            round: o.round,
                            ok: o.ok,
                            reason: o.reason.clone(),
                            age_ms: now.saturating_duration_since(*at).as_millis() as u64,
                        };
                        (c.clone(), obs)
                    })
                    .collect();
                VantageView {
                    name: v.clone(),
                    warming_up: cdns.values().any(|(o, _)| !o.settled),
                    latest,
                    error: None,
                }
            })
            // A vantage point with nothing of this policy is not one.
            .filter(|v| !v.latest.is_empty())
            .take(MAX_VANTAGES)
            .collect()
    }
}

/// Whether this node is in touch with etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub connected: bool,
    /// Since when (Unix ms).
    pub since_unix_ms: u64,
    /// Why not, when not.
    pub error: Option<String>,
    /// The member watched (and checked) now.
    pub endpoint: String,
}

/// What the session hands the controller: the latest view and the link.
#[derive(Clone, Debug)]
pub struct Shared {
    pub view: Arc<SharedView>,
    pub link: Link,
}

/// Key of an observation.
pub fn obs_key(prefix: &str, vantage: &str, cdn: &str) -> String {
    format!("{prefix}obs/{vantage}/{cdn}")
}

/// Key of a timeline.
pub fn timeline_key(prefix: &str, name: &str, cdn: &str) -> String {
    format!("{prefix}timeline/{name}/{cdn}")
}

/// Key of a drain override.
pub fn drain_key(prefix: &str, id: &str) -> String {
    format!("{prefix}drain/{id}")
}

/// Key of the freeze of a tenant's names.
pub fn tenant_freeze_key(prefix: &str, tenant: &str) -> String {
    format!("{prefix}freeze/{tenant}")
}

/// Key of an audit entry.
pub fn audit_key(prefix: &str, node: &str, serial: u64) -> String {
    format!("{prefix}audit/{node}/{serial}")
}

/// Key of the freeze.
pub fn freeze_key(prefix: &str) -> String {
    format!("{prefix}freeze")
}

fn parse_json<T: serde::de::DeserializeOwned>(v: &[u8]) -> Result<T, String> {
    serde_json::from_slice(v).map_err(|e| format!("not a valid record: {e}"))
}

fn check_reason(r: &str) -> Result<(), String> {
    if r.len() > MAX_REASON {
        return Err(format!("reason longer than {MAX_REASON} bytes"));
    }
    Ok(())
}

/// What was read, kept parsed: each key is parsed once, when it changes.
struct Mirror {
    prefix: String,
    /// Who may write observations (`--members`, and this node).
    members: std::collections::BTreeSet<String>,
    view: SharedView,
    /// The revision of every key kept.
    revisions: BTreeMap<String, i64>,
    /// Keys refused (the first [`MAX_REFUSED_KEPT`] by name), and why.
    refused: BTreeMap<String, String>,
    /// Refused keys past those.
    refused_more: u64,
}

impl Mirror {
    fn new(prefix: &str, members: &[String], own: &str) -> Mirror {
        let mut m: std::collections::BTreeSet<String> = members.iter().cloned().collect();
        m.insert(own.to_string());
        Mirror {
            prefix: prefix.to_string(),
            members: m,
            view: SharedView::default(),
            revisions: BTreeMap::new(),
            refused: BTreeMap::new(),
            refused_more: 0,
        }
    }

    /// Everything read anew: keys unchanged since (same revision) keep their parse and
    /// age, the others are parsed.
    fn replace(&mut self, kvs: Vec<etcd::Kv>, capped: bool, now: Instant) {
        let read: std::collections::BTreeSet<&str> = kvs.iter().map(|kv| kv.key.as_str()).collect();
        let gone: Vec<String> = self
            .revisions
            .keys()
            .chain(self.refused.keys())
            .filter(|k| !read.contains(k.as_str()))
            .cloned()
            .collect();
        for k in gone {
            self.delete(&k);
        }
        self.refused_more = 0;
        for kv in kvs {
            if self.revisions.get(&kv.key) != Some(&kv.mod_revision) {
                self.put(kv, now);
            }
        }
        if capped {
            self.refuse(
                &self.prefix.clone(),
                format!("more than {MAX_KEYS} keys under the prefix: the rest were not read"),
            );
        }
        self.publish_refused();
    }

    /// A batch of changes from the watch.
    fn apply(&mut self, batch: Vec<etcd::Event>, now: Instant) {
        for e in batch {
            match e {
                etcd::Event::Put(kv) => self.put(kv, now),
                etcd::Event::Delete(k) => self.delete(&k),
            }
        }
        self.publish_refused();
    }

    fn put(&mut self, kv: etcd::Kv, now: Instant) {
        self.delete(&kv.key);
        let Some(rest) = kv.key.strip_prefix(&self.prefix) else {
            return self.refuse(&kv.key, "not under the prefix".into());
        };
        if kv.too_big {
            return self.refuse(
                &kv.key,
                format!("value over {} KiB", etcd::MAX_VALUE / 1024),
            );
        }
        let rest = rest.to_string();
        match self
            .view
            .add(&rest, &kv.value, kv.mod_revision, now, &self.members)
        {
            Ok(()) => {
                self.revisions.insert(kv.key, kv.mod_revision);
            }
            Err(why) => self.refuse(&kv.key, why),
        }
    }

    fn delete(&mut self, key: &str) {
        if let Some(rev) = self.revisions.remove(key) {
            if let Some(rest) = key.strip_prefix(&self.prefix) {
                self.view.remove(rest, rev);
            }
        }
        self.refused.remove(shown_key(key));
    }

    fn refuse(&mut self, key: &str, why: String) {
        let shown = shown_key(key);
        self.view.last_refused = Some(format!("{shown}: {why}"));
        if self.refused.len() < MAX_REFUSED_KEPT || self.refused.contains_key(shown) {
            self.refused.insert(shown.to_string(), why);
        } else {
            self.refused_more += 1;
        }
    }

    fn publish_refused(&mut self) {
        self.view.refused = self.refused.len() as u64 + self.refused_more;
    }
}

/// A key as remembered when refused: at most 256 bytes of it.
fn shown_key(key: &str) -> &str {
    let mut end = key.len().min(256);
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    &key[..end]
}

impl SharedView {
    fn add(
        &mut self,
        rest: &str,
        value: &[u8],
        rev: i64,
        at: Instant,
        members: &std::collections::BTreeSet<String>,
    ) -> Result<(), String> {
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            ["obs", vantage, cdn] => {
                if !sane_name(vantage) || !sane_name(cdn) {
                    return Err("vantage or CDN name not 1 to 128 of letters, digits, ._-:@".into());
                }
                if !members.contains(*vantage) {
                    return Err(format!("`{vantage}` is not a member of the set (--members): its observations do not count"));
                }
                let o: SharedObservation = parse_json(value)?;
                check_reason(&o.reason)?;
                if self
                    .observations
                    .get(*vantage)
                    .is_some_and(|c| c.len() >= MAX_OBS_PER_VANTAGE && !c.contains_key(*cdn))
                {
                    return Err(format!(
                        "more than {MAX_OBS_PER_VANTAGE} CDNs observed by `{vantage}`"
                    ));
                }
                self.observations
                    .entry(vantage.to_string())
                    .or_default()
                    .insert(cdn.to_string(), (o, at));
            }
            ["timeline", name, cdn] => {
                if !sane_name(name) || !sane_name(cdn) {
                    return Err("name or CDN not 1 to 128 of letters, digits, ._-:@".into());
                }
                if self.timelines.len() >= MAX_TIMELINES {
                    return Err(format!("more than {MAX_TIMELINES} timelines"));
                }
                let t: Timeline = parse_json(value)?;
                check_reason(&t.reason)?;
                self.timelines
                    .insert((name.to_string(), cdn.to_string()), (t, rev));
            }
            ["drain", id] => {
                if self.drains.len() >= MAX_DRAINS {
                    return Err(format!("more than {MAX_DRAINS} drains"));
                }
                let d: SharedDrain = parse_json(value)?;
                if d.rule.id != *id || !sane_name(id) {
                    return Err("the rule's id is not its key".into());
                }
                check_reason(&d.rule.reason)?;
                self.drains.insert(id.to_string(), d);
            }
            ["audit", node, _] => {
                if !sane_name(node) || value.len() > MAX_AUDIT_VALUE {
                    return Err("node not a sane name, or an entry over 16 KiB".into());
                }
                let v: serde_json::Value = parse_json(value)?;
                if !v.is_object() {
                    return Err("an audit entry is a JSON object".into());
                }
                if !members.contains(*node) {
                    return Err(format!("`{node}` is not a member of the set (--members): its audit entries are not kept"));
                }
                self.audit.insert(rev, v);
                while self.audit.len() > MAX_AUDIT_KEYS {
                    self.audit.pop_first();
                }
            }
            ["freeze", tenant] => {
                if !sane_name(tenant) {
                    return Err("tenant not 1 to 128 of letters, digits, ._-:@".into());
                }
                let f: Freeze = parse_json(value)?;
                check_reason(&f.reason)?;
                self.freeze_tenants.insert(tenant.to_string(), f);
            }
            ["freeze"] => {
                let f: Freeze = parse_json(value)?;
                check_reason(&f.reason)?;
                self.freeze = Some(f);
            }
            ["usage", cdn, day] => {
                if !sane_name(cdn) {
                    return Err("CDN not 1 to 128 of letters, digits, ._-:@".into());
                }
                let key = (cdn.to_string(), day.to_string());
                if self.usage.len() >= usage::MAX_USAGE_DAYS && !self.usage.contains_key(&key) {
                    return Err(format!("more than {} days of usage", usage::MAX_USAGE_DAYS));
                }
                let u: usage::SharedUsage = parse_json(value)?;
                u.check(day)?;
                self.usage.insert(key, (Arc::new(u), rev));
            }
            ["commit", name] => {
                if !sane_name(name) {
                    return Err("name not 1 to 128 of letters, digits, ._-:@".into());
                }
                if self.commits.len() >= usage::MAX_COMMIT_NAMES
                    && !self.commits.contains_key(*name)
                {
                    return Err(format!(
                        "more than {} names with biases",
                        usage::MAX_COMMIT_NAMES
                    ));
                }
                let b: usage::SharedBiases = parse_json(value)?;
                b.check()?;
                self.commits.insert(name.to_string(), (b, rev));
            }
            ["perf", node, name, region] => {
                if !sane_name(node) || !sane_name(name) {
                    return Err("node or name not 1 to 128 of letters, digits, ._-:@".into());
                }
                if !members.contains(*node) {
                    return Err(format!(
                        "`{node}` is not a member of the set (--members): its samples do not count"
                    ));
                }
                let key = (
                    node.to_string(),
                    name.to_string(),
                    performance::region_index(region)?,
                );
                if self.perf_cells.len() >= performance::MAX_PERF_KEYS
                    && !self.perf_cells.contains_key(&key)
                {
                    return Err(format!(
                        "more than {} keys of performance samples",
                        performance::MAX_PERF_KEYS
                    ));
                }
                let c: performance::SharedCells = parse_json(value)?;
                let cells = c.check(node, name, key.2)?;
                self.perf_cells.insert(key, Arc::new(cells));
            }
            ["shift", name, region] => {
                if !sane_name(name) {
                    return Err("name not 1 to 128 of letters, digits, ._-:@".into());
                }
                let key = (name.to_string(), performance::region_index(region)?);
                if self.shifts.len() >= performance::MAX_SHIFTS && !self.shifts.contains_key(&key) {
                    return Err(format!(
                        "more than {} performance shifts",
                        performance::MAX_SHIFTS
                    ));
                }
                let s: performance::SharedShift = parse_json(value)?;
                s.check()?;
                self.shifts.insert(key, (s, rev));
            }
            _ => return Err("not a key of steerdns".into()),
        }
        Ok(())
    }

    /// Forgets what the key `rest` (under the prefix, last written at `rev`) added.
    fn remove(&mut self, rest: &str, rev: i64) {
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            ["obs", vantage, cdn] => {
                if let Some(cdns) = self.observations.get_mut(*vantage) {
                    cdns.remove(*cdn);
                    if cdns.is_empty() {
                        self.observations.remove(*vantage);
                    }
                }
            }
            ["timeline", name, cdn] => {
                self.timelines.remove(&(name.to_string(), cdn.to_string()));
            }
            ["drain", id] => {
                self.drains.remove(*id);
            }
            ["audit", _, _] => {
                self.audit.remove(&rev);
            }
            ["freeze", tenant] => {
                self.freeze_tenants.remove(*tenant);
            }
            ["freeze"] => self.freeze = None,
            ["usage", cdn, day] => {
                self.usage.remove(&(cdn.to_string(), day.to_string()));
            }
            ["commit", name] => {
                self.commits.remove(*name);
            }
            ["perf", node, name, region] => {
                if let Ok(r) = performance::region_index(region) {
                    self.perf_cells
                        .remove(&(node.to_string(), name.to_string(), r));
                }
            }
            ["shift", name, region] => {
                if let Ok(r) = performance::region_index(region) {
                    self.shifts.remove(&(name.to_string(), r));
                }
            }
            _ => {}
        }
    }
}

/// Writes an evaluation (`value` at `key`) for the set, in the background: created
/// when the set has none (`rev` `None`), else replaced if the key is still at `rev`, so
/// that the first node to evaluate a period wins; a failure is logged (`what`).
pub(crate) fn write_evaluation(
    etcd: &Etcd,
    key: String,
    value: Vec<u8>,
    rev: Option<i64>,
    what: &'static str,
) {
    let etcd = etcd.clone();
    tokio::spawn(async move {
        let written = match rev {
            None => etcd.create(&key, &value).await,
            Some(rev) => etcd.replace(&key, rev, &value).await,
        };
        if let Err(e) = written {
            warn!(key = %key, error = %e, "cannot write the {what} for the set");
        }
    });
}

// === the session: read, watch, check liveness ===

/// Starts the session with etcd: the controller reads [`Shared`] from the returned
/// receiver (the first value says "not yet connected").
pub fn spawn_session(
    etcd: Etcd,
    opts: &ClusterOptions,
    stop: CancellationToken,
) -> watch::Receiver<Shared> {
    let (tx, rx) = watch::channel(Shared {
        view: Arc::new(SharedView::default()),
        link: Link {
            connected: false,
            since_unix_ms: now_ms(),
            error: Some("not connected yet".into()),
            endpoint: etcd.endpoint_url(etcd.current()),
        },
    });
    let mirror = Mirror::new(&opts.prefix, &opts.members, &opts.node);
    let prefix = opts.prefix.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = session(etcd, prefix, mirror, tx) => {}
        }
    });
    rx
}

fn set_link(tx: &watch::Sender<Shared>, endpoint: String, error: Option<String>) {
    tx.send_if_modified(|s| {
        let connected = error.is_none();
        if s.link.connected == connected && s.link.error == error && s.link.endpoint == endpoint {
            return false;
        }
        if s.link.connected != connected {
            s.link.since_unix_ms = now_ms();
            match &error {
                None => info!(endpoint = %endpoint, "etcd: connected, following the shared state"),
                Some(e) => warn!(error = %e, "etcd unreachable: failing static (serving the last shared state, starting no demotion)"),
            }
        } else if connected {
            info!(endpoint = %endpoint, was = %s.link.endpoint, "etcd: following the shared state through another member");
        }
        s.link.connected = connected;
        s.link.error = error;
        s.link.endpoint = endpoint;
        true
    });
}

async fn session(etcd: Etcd, prefix: String, mut mirror: Mirror, tx: watch::Sender<Shared>) {
    loop {
        // Read everything from the first member that answers; when none has within
        // FAIL_STATIC_AFTER, say so (fail static) and keep trying.
        let read = etcd.range_prefix(&prefix, MAX_KEYS);
        tokio::pin!(read);
        let read = tokio::select! {
            r = &mut read => r,
            _ = tokio::time::sleep(FAIL_STATIC_AFTER) => {
                set_link(&tx, etcd.endpoint_url(etcd.current()), Some(format!("no etcd member answered within {} ms", FAIL_STATIC_AFTER.as_millis())));
                read.await
            }
        };
        let range = match read {
            Ok(r) => r,
            Err(e) => {
                set_link(&tx, etcd.endpoint_url(etcd.current()), Some(e.to_string()));
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let member = range.member;
        if range.capped {
            warn!(
                max = MAX_KEYS,
                "etcd: more keys under the prefix than a node reads: the rest are ignored"
            );
        }
        mirror.replace(range.kvs, range.capped, Instant::now());
        release_memory();
        let view = Arc::new(mirror.view.clone());
        tx.send_modify(|s| s.view = view);
        set_link(&tx, etcd.endpoint_url(member), None);

        let watched_since = Instant::now();
        let (events_tx, mut events) = tokio::sync::mpsc::channel(64);
        let watching = etcd.watch(member, &prefix, range.revision + 1, &events_tx);
        tokio::pin!(watching);
        let mut alive = Box::pin(liveness(etcd.clone(), member, prefix.clone()));
        let error = loop {
            tokio::select! {
                e = &mut watching => break e,
                batch = events.recv() => {
                    let Some((batch, _rev)) = batch else { continue };
                    mirror.apply(batch, Instant::now());
                    let view = Arc::new(mirror.view.clone());
                    tx.send_modify(|s| s.view = view);
                }
                r = &mut alive => match r {
                    Ok(()) => alive = Box::pin(liveness(etcd.clone(), member, prefix.clone())),
                    Err(e) => break e,
                },
            }
        };
        // The member watched stopped answering (or lost its quorum): the read above,
        // from the next one, says whether this node is still in touch.
        warn!(error = %error, endpoint = %etcd.endpoint_url(member), "etcd: the member watched failed its check, moving to another");
        etcd.skip(member);
        if watched_since.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Gives back to the system the memory a full read used for a while (glibc keeps
/// freed memory in its arenas otherwise: refused values of many keys would stay in the
/// node's RSS).
fn release_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// After [`LIVENESS`], a linearizable read on the member watched: it fails on a member
/// without a quorum, and on one that does not answer within [`LIVENESS_TIMEOUT`].
async fn liveness(etcd: Etcd, member: usize, prefix: String) -> Result<(), EtcdError> {
    tokio::time::sleep(LIVENESS).await;
    let body = serde_json::json!({
        "key": base64_key(&freeze_key(&prefix)),
        "count_only": true,
    });
    match tokio::time::timeout(LIVENESS_TIMEOUT, etcd.call_on(member, "v3/kv/range", &body)).await {
        Ok(r) => r.map(|_| ()),
        Err(_) => Err(EtcdError::Unreachable(format!(
            "no answer within {} ms",
            LIVENESS_TIMEOUT.as_millis()
        ))),
    }
}

fn base64_key(k: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(k.as_bytes())
}

// === the publisher: this vantage point's observations, under a lease ===

/// This vantage point's observations, written to etcd under a lease.
pub struct Publisher {
    pub etcd: Etcd,
    pub prefix: String,
    pub vantage: String,
    /// Where the prober records its rounds.
    pub local: Local,
    /// How many CDNs this vantage point probes (until each is probed once, its
    /// failures do not count).
    pub probed: usize,
    /// The lease: about three probe intervals.
    pub ttl: Duration,
}

impl Publisher {
    /// Writes the observations each time `rounds` says a round ended, under a lease
    /// kept alive meanwhile: when this process dies or loses etcd, its observations
    /// vanish with the lease.
    pub fn spawn(self, rounds: Arc<tokio::sync::Notify>, stop: CancellationToken) {
        tokio::spawn(async move {
            let p = self;
            let mut lease: Option<i64> = None;
            // The round last written per CDN.
            let mut written: BTreeMap<String, u64> = BTreeMap::new();
            let mut keepalive = tokio::time::interval((p.ttl / 3).max(Duration::from_millis(300)));
            let mut failing = false;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = rounds.notified() => {}
                    _ = keepalive.tick() => {
                        if let Some(id) = lease {
                            if !matches!(p.etcd.keepalive(id).await, Ok(true)) {
                                lease = None;
                                written.clear();
                            }
                        }
                    }
                }
                let result = publish(
                    &p.etcd,
                    &p.prefix,
                    &p.vantage,
                    &p.local,
                    p.probed,
                    p.ttl,
                    &mut lease,
                    &mut written,
                )
                .await;
                match (result, failing) {
                    (Ok(()), true) => {
                        info!(vantage = %p.vantage, "etcd: observations published again");
                        failing = false;
                    }
                    (Ok(()), false) => {}
                    (Err(e), was) => {
                        if !was {
                            warn!(vantage = %p.vantage, error = %e, "etcd: cannot publish this vantage point's observations");
                        }
                        failing = true;
                        lease = None;
                        written.clear();
                    }
                }
            }
        });
    }
}

#[allow(clippy::too_many_arguments)]
async fn publish(
    etcd: &Etcd,
    prefix: &str,
    vantage: &str,
    local: &Local,
    probed: usize,
    ttl: Duration,
    lease: &mut Option<i64>,
    written: &mut BTreeMap<String, u64>,
) -> Result<(), EtcdError> {
    let latest = local.snapshot();
    if latest.is_empty() {
        return Ok(());
    }
    let id = match *lease {
        Some(id) => id,
        None => {
            let id = etcd.grant(ttl).await?;
            *lease = Some(id);
            id
        }
    };
    let all_probed = latest.len() >= probed;
    for (cdn, o) in &latest {
        if written.get(cdn) == Some(&o.round) {
            continue;
        }
        let record = SharedObservation {
            round: o.round,
            ok: o.ok,
            reason: o.reason.chars().take(MAX_REASON / 4).collect(),
            settled: all_probed && local.others_probed_since_failure(cdn),
        };
        let value = serde_json::to_vec(&record).unwrap_or_default();
        etcd.put(&obs_key(prefix, vantage, cdn), &value, Some(id))
            .await?;
        written.insert(cdn.clone(), o.round);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tl(direction: Direction, from_level: usize) -> Timeline {
        Timeline {
            direction,
            from_level,
            start_unix_ms: 10_000,
            node: "ns1".into(),
            reason: "test".into(),
        }
    }

    #[test]
    fn a_demotion_takes_its_first_step_at_once_then_one_per_interval() {
        let t = tl(Direction::Demote, 0);
        assert_eq!(t.at(2, 1000, 9_999), (0, Some(10_000)));
        assert_eq!(t.at(2, 1000, 10_000), (1, Some(11_000)));
        assert_eq!(t.at(2, 1000, 10_999), (1, Some(11_000)));
        assert_eq!(t.at(2, 1000, 11_000), (2, None));
        assert_eq!(t.at(2, 1000, 99_000), (2, None));
    }

    #[test]
    fn a_promotion_comes_back_down_from_where_it_started() {
        let t = tl(Direction::Promote, 2);
        assert_eq!(t.at(2, 1000, 10_000), (1, Some(11_000)));
        assert_eq!(t.at(2, 1000, 11_500), (0, None));
        assert_eq!(tl(Direction::Promote, 0).at(2, 1000, 10_000), (0, None));
    }

    #[test]
    fn every_node_derives_the_same_stepper() {
        let t = tl(Direction::Demote, 0);
        let now = Instant::now();
        let a = t.stepper(3, 1000, 10_400, now);
        assert_eq!(a.level, 1);
        assert_eq!(a.next_at, Some(now + Duration::from_millis(600)));
    }

    #[test]
    fn bad_keys_are_refused_and_counted() {
        let mut m = Mirror::new("/s/", &["ns2".into(), "ns3".into()], "ns1");
        let at = Instant::now();
        let good = serde_json::to_vec(&SharedObservation {
            round: 1,
            ok: false,
            reason: "status 503".into(),
            settled: true,
        })
        .unwrap();
        let kv = |k: &str, v: &[u8], rev| etcd::Kv {
            key: k.into(),
            value: v.to_vec(),
            mod_revision: rev,
            too_big: false,
        };
        let mut big = kv("/s/obs/ns2/b", b"", 6);
        big.too_big = true;
        m.replace(
            vec![
                kv("/s/obs/ns2/a", &good, 1),
                kv("/s/obs/ns 2/a", &good, 2),
                kv("/s/obs/ns3/a", b"{\"round\":1}", 3),
                kv("/s/other", &good, 4),
                kv("/s/obs/outsider/a", &good, 5),
                big,
            ],
            false,
            at,
        );
        assert_eq!(m.view.observations.len(), 1);
        assert_eq!(m.view.refused, 5);
        assert!(m.refused["/s/obs/outsider/a"].contains("not a member"));
        // Only what changes is parsed again; a key deleted is forgotten, refused or not.
        m.apply(
            vec![
                etcd::Event::Delete("/s/obs/outsider/a".into()),
                etcd::Event::Put(kv("/s/obs/ns3/a", &good, 7)),
            ],
            at,
        );
        assert_eq!(m.view.observations.len(), 2);
        assert_eq!(m.view.refused, 3);
        m.apply(vec![etcd::Event::Delete("/s/obs/ns2/a".into())], at);
        assert_eq!(m.view.observations.len(), 1);
        assert!(!m.revisions.contains_key("/s/obs/ns2/a"));
    }

    #[test]
    fn junk_vantage_points_do_not_push_real_ones_out() {
        // Before, 64 views were taken before dropping those with nothing of the policy.
        let mut v = SharedView::default();
        let at = Instant::now();
        let o = SharedObservation {
            round: 1,
            ok: false,
            reason: "x".into(),
            settled: true,
        };
        for i in 0..MAX_VANTAGES {
            v.observations
                .entry(format!("a{i:03}"))
                .or_default()
                .insert("junk".into(), (o.clone(), at));
        }
        v.observations
            .entry("z-real".into())
            .or_default()
            .insert("a".into(), (o, at));
        let views = v.vantage_views("ns1", |c| c == "a");
        assert_eq!(views.len(), 1);
        assert_eq!(views[0].name, "z-real");
    }

    #[test]
    fn a_timeline_ahead_of_this_clock_is_due_at_its_start() {
        // Before, a timeline seen before its start was never scheduled.
        let t = tl(Direction::Demote, 0);
        assert_eq!(t.at(2, 1000, 9_990), (0, Some(10_000)));
        let now = Instant::now();
        let s = t.stepper(2, 1000, 9_990, now);
        assert_eq!(s.next_at, Some(now + Duration::from_millis(10)));
        assert_eq!(
            tl(Direction::Promote, 2).at(2, 1000, 9_000),
            (2, Some(10_000))
        );
        assert_eq!(tl(Direction::Promote, 0).at(2, 1000, 9_000), (0, None));
        // Further ahead than a step interval: brought back to one interval.
        let mut far = tl(Direction::Demote, 0);
        assert_eq!(far.clamp(1000, 5_000), Some(10_000));
        assert_eq!(far.start_unix_ms, 6_000);
        assert_eq!(far.clamp(1000, 5_000), None);
    }

    #[test]
    fn records_with_times_too_late_to_print_are_refused() {
        let mut m = Mirror::new("/s/", &["ns2".into()], "ns1");
        let at = Instant::now();
        let drain = |id: &str, until: u64, written: u64| {
            serde_json::json!({
                "rule": {"id": id, "name": "www.example.com.", "cdn": "a", "reason": "x",
                         "until_unix_ms": until},
                "node": "ns1", "at_unix_ms": written
            })
            .to_string()
            .into_bytes()
        };
        let kv = |k: &str, v: Vec<u8>, rev| etcd::Kv {
            key: k.into(),
            value: v,
            mod_revision: rev,
            too_big: false,
        };
        let late = crate::control::times::MAX_TIME_MS + 1;
        let mut t = serde_json::to_value(tl(Direction::Demote, 0)).unwrap();
        t["start_unix_ms"] = late.into();
        m.replace(
            vec![
                kv("/s/drain/api-1", drain("api-1", 5_000, 1_000), 1),
                kv("/s/drain/api-2", drain("api-2", late, 1_000), 2),
                kv("/s/drain/api-3", drain("api-3", 5_000, late), 3),
                kv(
                    "/s/timeline/www.example.com./a",
                    t.to_string().into_bytes(),
                    4,
                ),
            ],
            false,
            at,
        );
        assert_eq!(m.view.drains.keys().collect::<Vec<_>>(), ["api-1"]);
        assert!(m.view.timelines.is_empty());
        assert_eq!(m.view.refused, 3);
        assert!(
            m.refused.values().all(|why| why.contains("9999-12-31")),
            "{:?}",
            m.refused
        );
    }
}
