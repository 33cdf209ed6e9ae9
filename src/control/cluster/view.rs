//! Control plane, a set: what this node last read from etcd (`SharedView`), kept
//! current by `Mirror` from the initial read and each watch batch; every key is checked
//! (schema, sane names, caps) before it counts, and a refused one is counted.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::time::Instant;

use super::{etcd, performance, usage};
use super::{
    sane_name, Freeze, SharedDrain, SharedObservation, Timeline, MAX_AUDIT_KEYS, MAX_AUDIT_VALUE,
    MAX_DRAINS, MAX_KEYS, MAX_OBS_PER_VANTAGE, MAX_REASON, MAX_REFUSED_KEPT, MAX_TIMELINES,
    MAX_VANTAGES,
};
use crate::control::decide::health::{Observation, VantageView};
use crate::control::decide::keys::{CdnDay, NameCdn};
use crate::control::store::{BadKey, Key};

/// Everything read from etcd, parsed and checked for form (not yet against the policy).
#[derive(Clone, Debug, Default)]
pub struct SharedView {
    /// Per vantage point, per CDN: the observation and when this node received it.
    pub observations: BTreeMap<String, BTreeMap<String, (SharedObservation, Instant)>>,
    /// Per (name, CDN): the timeline and its revision (for compare-and-swap).
    pub timelines: BTreeMap<NameCdn, (Timeline, i64)>,
    /// Per override id.
    pub drains: BTreeMap<String, SharedDrain>,
    pub freeze: Option<Freeze>,
    /// Per tenant: the freeze of its names.
    pub freeze_tenants: BTreeMap<String, Freeze>,
    /// Audit entries by revision: every node appends them in this order.
    pub audit: BTreeMap<i64, serde_json::Value>,
    /// Per (CDN, day): its usage records and their revision.
    pub usage: BTreeMap<CdnDay, (Arc<usage::SharedUsage>, i64)>,
    /// Per name: the biases of the set's latest evaluation, and their revision.
    pub commits: BTreeMap<String, (usage::SharedBiases, i64)>,
    /// Per (node, name, region index): that node's performance buckets.
    pub perf_cells:
        BTreeMap<(String, String, usize), Arc<crate::control::modifiers::perf::NodeCells>>,
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
pub(super) struct Mirror {
    pub(super) prefix: String,
    /// Who may write observations (`--members`, and this node).
    pub(super) members: std::collections::BTreeSet<String>,
    pub(super) view: SharedView,
    /// The revision of every key kept.
    pub(super) revisions: BTreeMap<String, i64>,
    /// Keys refused (the first [`MAX_REFUSED_KEPT`] by name), and why.
    pub(super) refused: BTreeMap<String, String>,
    /// Refused keys past those.
    pub(super) refused_more: u64,
}

impl Mirror {
    pub(super) fn new(prefix: &str, members: &[String], own: &str) -> Mirror {
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
    pub(super) fn replace(&mut self, kvs: Vec<etcd::Kv>, capped: bool, now: Instant) {
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
    fn add(
        &mut self,
        rest: &str,
        value: &[u8],
        rev: i64,
        at: Instant,
        members: &std::collections::BTreeSet<String>,
    ) -> Result<(), String> {
        let key: Key = rest.parse().map_err(|e: BadKey| e.to_string())?;
        match &key {
            Key::Obs { vantage, cdn } => {
                if !sane_name(vantage) || !sane_name(cdn) {
                    return Err("vantage or CDN name not 1 to 128 of letters, digits, ._-:@".into());
                }
                if !members.contains(vantage.as_str()) {
                    return Err(format!("`{vantage}` is not a member of the set (--members): its observations do not count"));
                }
                let o: SharedObservation = parse_json(value)?;
                check_reason(&o.reason)?;
                if self.observations.get(vantage.as_str()).is_some_and(|c| {
                    c.len() >= MAX_OBS_PER_VANTAGE && !c.contains_key(cdn.as_str())
                }) {
                    return Err(format!(
                        "more than {MAX_OBS_PER_VANTAGE} CDNs observed by `{vantage}`"
                    ));
                }
                self.observations
                    .entry(vantage.to_string())
                    .or_default()
                    .insert(cdn.to_string(), (o, at));
            }
            Key::Timeline { name, cdn } => {
                if !sane_name(name) || !sane_name(cdn) {
                    return Err("name or CDN not 1 to 128 of letters, digits, ._-:@".into());
                }
                if self.timelines.len() >= MAX_TIMELINES {
                    return Err(format!("more than {MAX_TIMELINES} timelines"));
                }
                let t: Timeline = parse_json(value)?;
                check_reason(&t.reason)?;
                self.timelines
                    .insert(NameCdn::new(name.as_str(), cdn.as_str()), (t, rev));
            }
            Key::Drain { id } => {
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
            Key::Audit { node, .. } => {
                if !sane_name(node) || value.len() > MAX_AUDIT_VALUE {
                    return Err("node not a sane name, or an entry over 16 KiB".into());
                }
                let v: serde_json::Value = parse_json(value)?;
                if !v.is_object() {
                    return Err("an audit entry is a JSON object".into());
                }
                if !members.contains(node.as_str()) {
                    return Err(format!("`{node}` is not a member of the set (--members): its audit entries are not kept"));
                }
                self.audit.insert(rev, v);
                while self.audit.len() > MAX_AUDIT_KEYS {
                    self.audit.pop_first();
                }
            }
            Key::TenantFreeze { tenant } => {
                if !sane_name(tenant) {
                    return Err("tenant not 1 to 128 of letters, digits, ._-:@".into());
                }
                let f: Freeze = parse_json(value)?;
                check_reason(&f.reason)?;
                self.freeze_tenants.insert(tenant.to_string(), f);
            }
            Key::Freeze => {
                let f: Freeze = parse_json(value)?;
                check_reason(&f.reason)?;
                self.freeze = Some(f);
            }
            Key::Usage { cdn, day } => {
                if !sane_name(cdn) {
                    return Err("CDN not 1 to 128 of letters, digits, ._-:@".into());
                }
                let key = CdnDay::new(cdn.as_str(), day.as_str());
                if self.usage.len() >= usage::MAX_USAGE_DAYS && !self.usage.contains_key(&key) {
                    return Err(format!("more than {} days of usage", usage::MAX_USAGE_DAYS));
                }
                let u: usage::SharedUsage = parse_json(value)?;
                u.check(day)?;
                self.usage.insert(key, (Arc::new(u), rev));
            }
            Key::Commit { name } => {
                if !sane_name(name) {
                    return Err("name not 1 to 128 of letters, digits, ._-:@".into());
                }
                if self.commits.len() >= usage::MAX_COMMIT_NAMES
                    && !self.commits.contains_key(name.as_str())
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
            Key::Perf { node, name, region } => {
                if !sane_name(node) || !sane_name(name) {
                    return Err("node or name not 1 to 128 of letters, digits, ._-:@".into());
                }
                if !members.contains(node.as_str()) {
                    return Err(format!(
                        "`{node}` is not a member of the set (--members): its samples do not count"
                    ));
                }
                let key = (
                    node.to_string(),
                    name.to_string(),
                    performance::region_index(*region)?,
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
            Key::Shift { name, region } => {
                if !sane_name(name) {
                    return Err("name not 1 to 128 of letters, digits, ._-:@".into());
                }
                let key = (name.to_string(), performance::region_index(*region)?);
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
            // Read and checked by `control::cookies`, which polls it.
            Key::Cookie => {}
        }
        Ok(())
    }

    /// Forgets what the key `rest` (under the prefix, last written at `rev`) added.
    fn remove(&mut self, rest: &str, rev: i64) {
        let Ok(key) = rest.parse::<Key>() else { return };
        match key {
            Key::Obs { vantage, cdn } => {
                if let Some(cdns) = self.observations.get_mut(&vantage) {
                    cdns.remove(&cdn);
                    if cdns.is_empty() {
                        self.observations.remove(&vantage);
                    }
                }
            }
            Key::Timeline { name, cdn } => {
                self.timelines.remove(&NameCdn { name, cdn });
            }
            Key::Drain { id } => {
                self.drains.remove(&id);
            }
            Key::Audit { .. } => {
                self.audit.remove(&rev);
            }
            Key::TenantFreeze { tenant } => {
                self.freeze_tenants.remove(&tenant);
            }
            Key::Freeze => self.freeze = None,
            Key::Usage { cdn, day } => {
                self.usage.remove(&CdnDay { cdn, day });
            }
            Key::Commit { name } => {
                self.commits.remove(&name);
            }
            Key::Perf { node, name, region } => {
                self.perf_cells.remove(&(node, name, region));
            }
            Key::Shift { name, region } => {
                self.shifts.remove(&(name, region));
            }
            Key::Cookie => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::cluster::records::tests::tl;
    use crate::control::decide::stepper::Direction;

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
