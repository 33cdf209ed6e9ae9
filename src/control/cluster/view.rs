//! Control plane, a set: what this node last read from the store (`SharedView`), kept
//! current by `Mirror` from each whole read and each watch batch; every key is checked
//! (schema, sane names, the policy's names, CDNs, tenants and regions, the members,
//! then caps) before it counts, and a refused one is counted.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::time::Instant;

use super::refused::Refused;
use super::scope::Scope;
use super::{etcd, heads, performance, usage};
use super::{
    sane_name, Freeze, SharedDrain, SharedObservation, Timeline, MAX_AUDIT_PER_MEMBER,
    MAX_AUDIT_VALUE, MAX_DRAINS, MAX_REASON, MAX_REFUSED_KEPT, MAX_VANTAGES,
};
use crate::control::decide::health::{Observation, VantageView};
use crate::control::decide::keys::{CdnDay, NameCdn};
use crate::control::store::Key;

/// One vantage point's observations: per CDN, the observation and when this node
/// received it.
pub type Observed = BTreeMap<String, (SharedObservation, Instant)>;

/// Everything read from etcd, parsed and checked for form (not yet against the policy).
/// Each kind is shared (`Arc`): a view published per watch batch copies only the
/// kinds the batch changed (`Arc::make_mut`), never the audit entries or performance
/// cells of a batch that changed a drain.
#[derive(Clone, Debug, Default)]
pub struct SharedView {
    /// The policy version in force in the set, and its revision.
    pub policy: Option<(Arc<super::policy::SharedPolicy>, i64)>,
    /// Per vantage point, per CDN: the observation and when this node received it.
    pub observations: Arc<BTreeMap<String, Observed>>,
    /// Per (name, CDN): the timeline and its revision (for compare-and-swap).
    pub timelines: Arc<BTreeMap<NameCdn, (Timeline, i64)>>,
    /// Per override id.
    pub drains: Arc<BTreeMap<String, SharedDrain>>,
    pub freeze: Option<Freeze>,
    /// Per tenant: the freeze of its names.
    pub freeze_tenants: Arc<BTreeMap<String, Freeze>>,
    /// Audit entries by revision: every node appends them in this order.
    pub audit: Arc<BTreeMap<i64, Arc<serde_json::Value>>>,
    /// The revisions of each member's audit entries kept (at most
    /// [`MAX_AUDIT_PER_MEMBER`]: one member's volume never pushes out another's).
    pub audit_of: Arc<BTreeMap<String, std::collections::BTreeSet<i64>>>,
    /// Per (CDN, day): its usage records and their revision.
    pub usage: Arc<BTreeMap<CdnDay, (Arc<usage::SharedUsage>, i64)>>,
    /// Per name: the biases of the set's latest evaluation, and their revision.
    pub commits: Arc<BTreeMap<String, (usage::SharedBiases, i64)>>,
    /// Per (node, name, region index): that node's performance buckets.
    pub perf_cells:
        Arc<BTreeMap<(String, String, usize), Arc<crate::control::modifiers::perf::NodeCells>>>,
    /// Per (name, region index): the set's latest performance evaluation, and its
    /// revision.
    pub shifts: Arc<BTreeMap<(String, usize), (performance::SharedShift, i64)>>,
    /// Per member: the head of its audit log, as it published it.
    pub heads: Arc<BTreeMap<String, heads::SharedHead>>,
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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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
#[derive(Clone, Debug, Default)]
pub struct Shared {
    pub view: Arc<SharedView>,
    /// The store's revision the view is at: every write answered at or before it is
    /// in it.
    pub revision: i64,
    pub link: Link,
}

fn parse_json<T: serde::de::DeserializeOwned>(v: &[u8]) -> Result<T, Refused> {
    serde_json::from_slice(v).map_err(|e| Refused::Record(e.to_string()))
}

fn check_reason(r: &str) -> Result<(), Refused> {
    if r.len() > MAX_REASON {
        return Err(Refused::Reason);
    }
    Ok(())
}

/// What was read, kept parsed: each key is parsed once, when it changes (and all of
/// them again under a new policy).
pub(super) struct Mirror {
    pub(super) prefix: String,
    /// The policy and members every key is checked against.
    pub(super) scope: Scope,
    pub(super) view: SharedView,
    /// The revision of every key kept.
    pub(super) revisions: BTreeMap<String, i64>,
    /// Keys refused (the first [`MAX_REFUSED_KEPT`] by name), and why.
    pub(super) refused: BTreeMap<String, String>,
    /// Refused keys past those.
    pub(super) refused_more: u64,
    /// The keys met by the whole read under way.
    reading: std::collections::BTreeSet<String>,
}

impl Mirror {
    pub(super) fn new(prefix: &str, scope: Scope) -> Mirror {
        Mirror {
            prefix: prefix.to_string(),
            scope,
            view: SharedView::default(),
            revisions: BTreeMap::new(),
            refused: BTreeMap::new(),
            refused_more: 0,
            reading: Default::default(),
        }
    }

    /// A new policy (or members): every key is checked again by the next whole read.
    pub(super) fn rescope(&mut self, scope: Scope) {
        *self = Mirror::new(&self.prefix, scope);
    }

    /// A whole read starts: [`Mirror::read`] each key, then [`Mirror::end_read`].
    pub(super) fn begin_read(&mut self) {
        self.reading.clear();
        self.refused_more = 0;
    }

    /// One key of the whole read: a key unchanged since (same revision) keeps its
    /// parse and age, another is parsed (and its value dropped when refused).
    pub(super) fn read(&mut self, kv: etcd::Kv, now: Instant) {
        self.reading.insert(kv.key.clone());
        if self.revisions.get(&kv.key) != Some(&kv.mod_revision) {
            self.put(kv, now);
        }
    }

    /// The whole read is done: the keys it did not meet are gone.
    pub(super) fn end_read(&mut self) {
        let read = std::mem::take(&mut self.reading);
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
        self.publish_refused();
    }

    /// The keys of a part past its cap were not read: said as one refusal.
    pub(super) fn not_read(&mut self, under: &str, why: String) {
        let key = format!("{}{under}", self.prefix);
        self.reading.insert(key.clone());
        self.refuse(&key, why);
    }

    /// A whole read of `kvs` at once (tests).
    #[cfg(test)]
    pub(super) fn replace(&mut self, kvs: Vec<etcd::Kv>, now: Instant) {
        self.begin_read();
        for kv in kvs {
            self.read(kv, now);
        }
        self.end_read();
    }

    /// A batch of changes from the watch.
    pub(super) fn apply(&mut self, batch: Vec<etcd::Event>, now: Instant) {
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
            .add(&rest, &kv.value, kv.mod_revision, now, &self.scope)
        {
            Ok(()) => {
                self.revisions.insert(kv.key, kv.mod_revision);
            }
            Err(why) => self.refuse(&kv.key, why.to_string()),
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

    pub(super) fn publish_refused(&mut self) {
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
    /// Checks the key `rest` (under the prefix) and its value against `scope`, then
    /// keeps it. The policy's names, CDNs, tenants and regions are checked before any
    /// cap: a key outside the policy never takes the place of one inside it.
    fn add(
        &mut self,
        rest: &str,
        value: &[u8],
        rev: i64,
        at: Instant,
        scope: &Scope,
    ) -> Result<(), Refused> {
        let key: Key = rest.parse()?;
        match &key {
            Key::Obs { vantage, cdn } => {
                if !sane_name(vantage) || !sane_name(cdn) {
                    return Err(Refused::ObservationNames);
                }
                scope.member(vantage, "observations do not count")?;
                scope.probed(cdn)?;
                let o: SharedObservation = parse_json(value)?;
                check_reason(&o.reason)?;
                Arc::make_mut(&mut self.observations)
                    .entry(vantage.to_string())
                    .or_default()
                    .insert(cdn.to_string(), (o, at));
            }
            Key::Timeline { name, cdn } => {
                scope.host_cdn(name, cdn)?;
                let t: Timeline = parse_json(value)?;
                check_reason(&t.reason)?;
                Arc::make_mut(&mut self.timelines)
                    .insert(NameCdn::new(name.as_str(), cdn.as_str()), (t, rev));
            }
            Key::Drain { id } => {
                let d: SharedDrain = parse_json(value)?;
                if d.rule.id != *id || !sane_name(id) {
                    return Err(Refused::DrainId);
                }
                check_reason(&d.rule.reason)?;
                d.rule
                    .resolve(&scope.loaded.policy)
                    .map_err(|e| Refused::Drain(e.to_string()))?;
                if self.drains.len() >= MAX_DRAINS {
                    return Err(Refused::Drains);
                }
                Arc::make_mut(&mut self.drains).insert(id.to_string(), d);
            }
            Key::Audit { node, .. } => {
                if !sane_name(node) || value.len() > MAX_AUDIT_VALUE {
                    return Err(Refused::AuditEntry);
                }
                scope.member(node, "audit entries are not kept")?;
                let v: serde_json::Value = parse_json(value)?;
                if !v.is_object() {
                    return Err(Refused::AuditObject);
                }
                if v["node"] != node.as_str() {
                    return Err(Refused::AuditForged {
                        node: node.to_string(),
                        says: v["node"].clone(),
                    });
                }
                let audit = Arc::make_mut(&mut self.audit);
                audit.insert(rev, Arc::new(v));
                let revs = Arc::make_mut(&mut self.audit_of)
                    .entry(node.to_string())
                    .or_default();
                revs.insert(rev);
                while revs.len() > MAX_AUDIT_PER_MEMBER {
                    if let Some(oldest) = revs.pop_first() {
                        audit.remove(&oldest);
                    }
                }
            }
            Key::TenantFreeze { tenant } => {
                scope.tenant(tenant)?;
                let f: Freeze = parse_json(value)?;
                check_reason(&f.reason)?;
                Arc::make_mut(&mut self.freeze_tenants).insert(tenant.to_string(), f);
            }
            Key::Freeze => {
                let f: Freeze = parse_json(value)?;
                check_reason(&f.reason)?;
                self.freeze = Some(f);
            }
            Key::Usage { cdn, day } => {
                scope.cdn(cdn)?;
                let u: usage::SharedUsage = parse_json(value)?;
                let start = u.check(day)?;
                scope.usage_day(start, day, crate::clock::now_ms())?;
                Arc::make_mut(&mut self.usage)
                    .insert(CdnDay::new(cdn.as_str(), day.as_str()), (Arc::new(u), rev));
            }
            Key::Commit { name } => {
                scope.host(name)?;
                let b: usage::SharedBiases = parse_json(value)?;
                b.check()?;
                Arc::make_mut(&mut self.commits).insert(name.to_string(), (b, rev));
            }
            Key::Perf { node, name, region } => {
                if !sane_name(node) {
                    return Err(Refused::Node);
                }
                scope.member(node, "samples do not count")?;
                let region = performance::region_index(*region)?;
                scope.region(name, region)?;
                let c: performance::SharedCells = parse_json(value)?;
                let cells = c.check(node, name, region)?;
                Arc::make_mut(&mut self.perf_cells).insert(
                    (node.to_string(), name.to_string(), region),
                    Arc::new(cells),
                );
            }
            Key::Shift { name, region } => {
                let region = performance::region_index(*region)?;
                scope.region(name, region)?;
                let s: performance::SharedShift = parse_json(value)?;
                s.check()?;
                Arc::make_mut(&mut self.shifts).insert((name.to_string(), region), (s, rev));
            }
            Key::AuditHead { node } => {
                if !sane_name(node) {
                    return Err(Refused::Node);
                }
                scope.member(node, "audit head is not kept")?;
                let h: heads::SharedHead = parse_json(value)?;
                h.check()?;
                Arc::make_mut(&mut self.heads).insert(node.to_string(), h);
            }
            Key::Policy => {
                let p: super::policy::SharedPolicy = parse_json(value)?;
                p.check(crate::clock::now_ms())?;
                self.policy = Some((Arc::new(p), rev));
            }
            // Read and checked by `control::cookies`, which polls it; the versions
            // kept for a rollback are read when one is asked for.
            Key::Cookie | Key::PolicyVersion { .. } => {}
        }
        Ok(())
    }

    /// Forgets what the key `rest` (under the prefix, last written at `rev`) added. A
    /// kind is copied (when a published view shares it) only if the key is in it.
    fn remove(&mut self, rest: &str, rev: i64) {
        let Ok(key) = rest.parse::<Key>() else { return };
        match key {
            Key::Obs { vantage, cdn } => {
                if let Some(cdns) = self.observations.get(&vantage) {
                    if !cdns.contains_key(&cdn) {
                        return;
                    }
                    let all = Arc::make_mut(&mut self.observations);
                    let cdns = all.entry(vantage.clone()).or_default();
                    cdns.remove(&cdn);
                    if cdns.is_empty() {
                        all.remove(&vantage);
                    }
                }
            }
            Key::Timeline { name, cdn } => {
                forget(&mut self.timelines, &NameCdn { name, cdn });
            }
            Key::Drain { id } => forget(&mut self.drains, &id),
            Key::Audit { node, .. } => {
                forget(&mut self.audit, &rev);
                if self.audit_of.get(&node).is_some_and(|r| r.contains(&rev)) {
                    let of = Arc::make_mut(&mut self.audit_of);
                    if let Some(revs) = of.get_mut(&node) {
                        revs.remove(&rev);
                        if revs.is_empty() {
                            of.remove(&node);
                        }
                    }
                }
            }
            Key::TenantFreeze { tenant } => forget(&mut self.freeze_tenants, &tenant),
            Key::Freeze => self.freeze = None,
            Key::Usage { cdn, day } => forget(&mut self.usage, &CdnDay { cdn, day }),
            Key::Commit { name } => forget(&mut self.commits, &name),
            Key::Perf { node, name, region } => {
                forget(&mut self.perf_cells, &(node, name, region));
            }
            Key::Shift { name, region } => forget(&mut self.shifts, &(name, region)),
            Key::AuditHead { node } => forget(&mut self.heads, &node),
            Key::Policy => self.policy = None,
            Key::Cookie | Key::PolicyVersion { .. } => {}
        }
    }
}

/// Removes `key` from a kind shared with the views published, copying the kind only
/// when the key is in it.
fn forget<K: Ord + Clone, V: Clone>(kind: &mut Arc<BTreeMap<K, V>>, key: &K) {
    if kind.contains_key(key) {
        Arc::make_mut(kind).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::cluster::records::tests::tl;
    use crate::control::decide::stepper::Direction;

    #[test]
    fn bad_keys_are_refused_and_counted() {
        let mut m = Mirror::new(
            "/s/",
            crate::control::cluster::scope::tests::scope(&["ns2", "ns3"]),
        );
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
            Arc::make_mut(&mut v.observations)
                .entry(format!("a{i:03}"))
                .or_default()
                .insert("junk".into(), (o.clone(), at));
        }
        Arc::make_mut(&mut v.observations)
            .entry("z-real".into())
            .or_default()
            .insert("a".into(), (o, at));
        let views = v.vantage_views("ns1", |c| c == "a");
        assert_eq!(views.len(), 1);
        assert_eq!(views[0].name, "z-real");
    }

    #[test]
    fn records_with_times_too_late_to_print_are_refused() {
        let mut m = Mirror::new(
            "/s/",
            crate::control::cluster::scope::tests::scope(&["ns2"]),
        );
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
        let late = crate::control::decide::times::MAX_TIME_MS + 1;
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

#[cfg(test)]
mod cost {
    use super::*;

    /// A view published per watch batch (as the session publishes it) shares every
    /// kind the batch did not change with the view before: with 6,000 audit entries of
    /// 1 KiB in the view, a drain put or deleted copies none of them (the whole view
    /// was copied before: 4.7 ms per event on a 2-core machine; about 1 µs now).
    #[test]
    fn a_watch_batch_copies_only_the_kinds_it_changes() {
        let members = ["ns2", "ns3", "ns4", "ns5", "ns6", "ns7"];
        let mut m = Mirror::new(
            "/s/",
            crate::control::cluster::scope::tests::scope(&members),
        );
        let at = Instant::now();
        let kv = |k: String, v: Vec<u8>, rev| etcd::Kv {
            key: k,
            value: v,
            mod_revision: rev,
            too_big: false,
        };
        let pad = "x".repeat(1024);
        let entry = |node: &str, i: i64| {
            let e = serde_json::json!({"node": node, "kind": "step", "pad": pad, "i": i});
            e.to_string().into_bytes()
        };
        let mut rev = 0;
        let mut kvs = Vec::new();
        for node in members {
            for i in 0..1000 {
                rev += 1;
                kvs.push(kv(format!("/s/audit/{node}/{i}"), entry(node, i), rev));
            }
        }
        m.replace(kvs, at);
        assert_eq!(m.view.audit.len(), 6000);
        let drain = serde_json::json!({
            "rule": {"id": "api-1", "name": "www.example.com.", "cdn": "a", "reason": "x",
                     "until_unix_ms": 5_000},
            "node": "ns2", "at_unix_ms": 1_000
        })
        .to_string()
        .into_bytes();
        let event = |i: u32, rev: i64| match i % 2 {
            0 => etcd::Event::Put(kv("/s/drain/api-1".into(), drain.clone(), rev)),
            _ => etcd::Event::Delete("/s/drain/api-1".into()),
        };
        let before = Arc::new(m.view.clone());
        rev += 1;
        m.apply(vec![event(0, rev)], Instant::now());
        let after = Arc::new(m.view.clone());
        assert_eq!((before.drains.len(), after.drains.len()), (0, 1));
        assert!(Arc::ptr_eq(&before.audit, &after.audit));
        assert!(Arc::ptr_eq(&before.audit_of, &after.audit_of));
        assert!(Arc::ptr_eq(&before.perf_cells, &after.perf_cells));
        assert!(Arc::ptr_eq(&before.observations, &after.observations));
        // The view before is as it was (the kind changed was copied, not shared).
        assert!(!Arc::ptr_eq(&before.drains, &after.drains));
        // A delete of a key not in a kind copies nothing either.
        m.apply(
            vec![etcd::Event::Delete("/s/audit/ns2/none".into())],
            Instant::now(),
        );
        assert!(Arc::ptr_eq(&after.audit, &m.view.audit));
        let mut published = after;
        let (n, t) = (200, std::time::Instant::now());
        for i in 1..=n {
            rev += 1;
            m.apply(vec![event(i, rev)], Instant::now());
            published = Arc::new(m.view.clone());
        }
        let per_drain = t.elapsed() / n;
        // A batch of one audit entry copies the map of entries (not the entries).
        let t = std::time::Instant::now();
        for i in 0..n {
            rev += 1;
            let key = format!("/s/audit/ns3/{}", 1000 + i);
            m.apply(vec![etcd::Event::Put(kv(key, entry("ns3", 0), rev))], at);
            published = Arc::new(m.view.clone());
        }
        let per_audit = t.elapsed() / n;
        assert_eq!(published.audit.len(), 6000 + MAX_AUDIT_PER_MEMBER - 1000);
        eprintln!("per watch event, 6,000 audit entries of 1 KiB in the view: a drain {per_drain:?}, an audit entry {per_audit:?}");
    }
}
