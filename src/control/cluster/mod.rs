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
//! | `audit/{node}/{serial}` | an audit entry (an hour's lease) | the node where it happened; every node appends them to its `audit.jsonl` in revision order, so all hold the same chain |
//!
//! A timeline is a pure function of time ([`Timeline::at`]): every node derives the same
//! step at the same moment from the same record, so the set moves together without a
//! leader. Everything read is checked before it counts (schema, sane names, CDNs and
//! names of the policy: see the controller); a key that fails is counted and ignored.
//!
//! **Fail static.** The session checks etcd every [`LIVENESS`] with a linearizable read
//! (which a member without a quorum cannot answer). While that fails the node keeps the
//! last shared state it saw, its observations of others age until they no longer count,
//! and it writes no timeline: no demotion starts from its own probes alone. When etcd
//! answers again it reads everything anew and follows.

pub mod etcd;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::control::drains::{now_ms, DrainRule};
use crate::control::health::{Observation, VantageView};
use crate::control::prober::Local;
use crate::control::stepper::{Direction, Stepper};

pub use etcd::{Etcd, EtcdError, EtcdOptions};

/// How often the session checks that etcd still answers (with a quorum).
pub const LIVENESS: Duration = Duration::from_millis(400);
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
    pub at_unix_ms: u64,
}

/// The operator's freeze, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Freeze {
    pub reason: String,
    pub node: String,
    pub at_unix_ms: u64,
}

impl Timeline {
    /// The level at `t` (Unix ms) and when the next step is due, for `top` steps of
    /// `interval_ms` each. Before its start (a resumed timeline seen while still
    /// frozen) it holds its starting level.
    pub fn at(&self, top: usize, interval_ms: u64, t: u64) -> (usize, Option<u64>) {
        let from = self.from_level.min(top);
        if t < self.start_unix_ms {
            return (from, None);
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
            .take(MAX_VANTAGES)
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
    /// The member spoken to last.
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

/// The raw keys as read, with when each was received.
#[derive(Default)]
struct Mirror {
    keys: BTreeMap<String, (Vec<u8>, i64, Instant)>,
}

impl Mirror {
    /// Parses every key into a view.
    fn view(&self, prefix: &str) -> SharedView {
        let mut view = SharedView::default();
        for (key, (value, rev, at)) in &self.keys {
            let Some(rest) = key.strip_prefix(prefix) else {
                continue;
            };
            if let Err(why) = view.add(rest, value, *rev, *at) {
                view.refused += 1;
                view.last_refused = Some(format!("{key}: {why}"));
            }
        }
        while view.audit.len() > MAX_AUDIT_KEYS {
            view.audit.pop_first();
        }
        view
    }
}

impl SharedView {
    fn add(&mut self, rest: &str, value: &[u8], rev: i64, at: Instant) -> Result<(), String> {
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            ["obs", vantage, cdn] => {
                if !sane_name(vantage) || !sane_name(cdn) {
                    return Err("vantage or CDN name not 1 to 128 of letters, digits, ._-:@".into());
                }
                let o: SharedObservation = parse_json(value)?;
                check_reason(&o.reason)?;
                self.observations
                    .entry(vantage.to_string())
                    .or_default()
                    .insert(cdn.to_string(), (o, at));
            }
            ["timeline", name, cdn] => {
                if !sane_name(name) || !sane_name(cdn) {
                    return Err("name or CDN not 1 to 128 of letters, digits, ._-:@".into());
                }
                let t: Timeline = parse_json(value)?;
                check_reason(&t.reason)?;
                self.timelines
                    .insert((name.to_string(), cdn.to_string()), (t, rev));
            }
            ["drain", id] => {
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
                self.audit.insert(rev, v);
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
            _ => return Err("not a key of steerdns".into()),
        }
        Ok(())
    }
}

// === the session: read, watch, check liveness ===

/// Starts the session with etcd: the controller reads [`Shared`] from the returned
/// receiver (the first value says "not yet connected").
pub fn spawn_session(
    etcd: Etcd,
    prefix: String,
    stop: CancellationToken,
) -> watch::Receiver<Shared> {
    let (tx, rx) = watch::channel(Shared {
        view: Arc::new(SharedView::default()),
        link: Link {
            connected: false,
            since_unix_ms: now_ms(),
            error: Some("not connected yet".into()),
            endpoint: etcd.current_endpoint(),
        },
    });
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = session(etcd, prefix, tx) => {}
        }
    });
    rx
}

fn set_link(tx: &watch::Sender<Shared>, etcd: &Etcd, error: Option<String>) {
    tx.send_if_modified(|s| {
        let connected = error.is_none();
        if s.link.connected == connected && s.link.error == error {
            return false;
        }
        if s.link.connected != connected {
            s.link.since_unix_ms = now_ms();
            match &error {
                None => info!(endpoint = %etcd.current_endpoint(), "etcd: connected, following the shared state"),
                Some(e) => warn!(error = %e, "etcd unreachable: failing static (serving the last shared state, starting no demotion)"),
            }
        }
        s.link.connected = connected;
        s.link.error = error;
        s.link.endpoint = etcd.current_endpoint();
        true
    });
}

async fn session(etcd: Etcd, prefix: String, tx: watch::Sender<Shared>) {
    let mut mirror = Mirror::default();
    loop {
        let (kvs, revision) = match etcd.range_prefix(&prefix).await {
            Ok(r) => r,
            Err(e) => {
                set_link(&tx, &etcd, Some(e.to_string()));
                etcd.next_endpoint();
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let now = Instant::now();
        let before = std::mem::take(&mut mirror.keys);
        for kv in kvs {
            // A result unchanged since the last reading keeps the age it had.
            let at = match before.get(&kv.key) {
                Some((_, rev, at)) if *rev == kv.mod_revision => *at,
                _ => now,
            };
            mirror.keys.insert(kv.key, (kv.value, kv.mod_revision, at));
        }
        let view = Arc::new(mirror.view(&prefix));
        tx.send_modify(|s| s.view = view);
        set_link(&tx, &etcd, None);

        let watched_since = Instant::now();
        let (events_tx, mut events) = tokio::sync::mpsc::channel(64);
        let watching = etcd.watch(&prefix, revision + 1, &events_tx);
        tokio::pin!(watching);
        let mut alive = Box::pin(liveness(etcd.clone(), prefix.clone()));
        let error = loop {
            tokio::select! {
                e = &mut watching => break e,
                batch = events.recv() => {
                    let Some((batch, _rev)) = batch else { continue };
                    let now = Instant::now();
                    for e in batch {
                        match e {
                            etcd::Event::Put(kv) => {
                                mirror.keys.insert(kv.key, (kv.value, kv.mod_revision, now));
                            }
                            etcd::Event::Delete(k) => {
                                mirror.keys.remove(&k);
                            }
                        }
                    }
                    let view = Arc::new(mirror.view(&prefix));
                    tx.send_modify(|s| s.view = view);
                }
                r = &mut alive => match r {
                    Ok(()) => alive = Box::pin(liveness(etcd.clone(), prefix.clone())),
                    Err(e) => break e,
                },
            }
        };
        // Another member may still have a quorum: the read above, from the next one,
        // says whether this node is still in touch (a member lost changes nothing).
        tracing::debug!(error = %error, endpoint = %etcd.current_endpoint(), "etcd: watch or liveness check failed, reading again");
        etcd.next_endpoint();
        if watched_since.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// After [`LIVENESS`], a linearizable read: it fails on a member without a quorum.
async fn liveness(etcd: Etcd, prefix: String) -> Result<(), EtcdError> {
    tokio::time::sleep(LIVENESS).await;
    let body = serde_json::json!({
        "key": base64_key(&freeze_key(&prefix)),
        "count_only": true,
    });
    etcd.call("v3/kv/range", &body).await.map(|_| ())
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
        assert_eq!(t.at(2, 1000, 9_999), (0, None));
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
        let mut m = Mirror::default();
        let at = Instant::now();
        let good = serde_json::to_vec(&SharedObservation {
            round: 1,
            ok: false,
            reason: "status 503".into(),
            settled: true,
        })
        .unwrap();
        m.keys.insert("/s/obs/ns2/a".into(), (good.clone(), 1, at));
        m.keys.insert("/s/obs/ns 2/a".into(), (good.clone(), 2, at));
        m.keys
            .insert("/s/obs/ns3/a".into(), (b"{\"round\":1}".to_vec(), 3, at));
        m.keys.insert("/s/other".into(), (good, 4, at));
        let v = m.view("/s/");
        assert_eq!(v.observations.len(), 1);
        assert_eq!(v.refused, 3);
    }
}
