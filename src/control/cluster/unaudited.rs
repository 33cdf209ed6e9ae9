//! Control plane, a set: overrides that came without their writer's audit entry. A
//! node writes a drain, a freeze (of every name or of a tenant's) or a policy version
//! to the store, then its audit entry (`node.rs`, `policy.rs`); a member holding a
//! node's credentials can write the override straight to etcd instead, and no entry
//! says so. So each node watches the overrides of its view: one that appears or
//! changes is waited for, [`UNAUDITED_AFTER`] at most, until the set's audit entries
//! hold the writer's entry for it (the node the record names, the same fields, written
//! after the view that did not have it); failing that, the node appends an
//! `override_seen` entry to its own log (not the set's: each node says what it saw).
//!
//! A key that changes again while it waits is one wait (its changes counted in the
//! entry), and a node appends at most [`MAX_LISTED_PER_MINUTE`] such entries a minute
//! (those past it counted in the next one): a member rewriting an override straight
//! to etcd over and over never floods every node's own log, whose rotation would then
//! drop the node's history.
//!
//! What a node meets at its first view (at start) counts as audited: a restart does
//! not audit the overrides in force again, and those written while no node was
//! following the set are not audited by anyone. An override that goes and comes back
//! the same (a new policy has every key read again) is not a change.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use super::{Freeze, Key, SharedDrain, SharedView};
use crate::control::levers::command::audit_rule;

/// How long a node waits for the writer's entry of an override it saw: the writer
/// appends it right after the override (a few round trips to etcd).
pub(crate) const UNAUDITED_AFTER: Duration = Duration::from_secs(5);

/// Overrides remembered as seen (by key) past which those no longer in the view are
/// forgotten.
const MAX_REMEMBERED: usize = 4096;

/// At most this many `override_seen` entries a minute; the overrides past it are
/// counted in the next one (`unlisted`).
pub(crate) const MAX_LISTED_PER_MINUTE: usize = 60;

const MINUTE: Duration = Duration::from_secs(60);

/// The overrides this node follows, and those waiting for their writer's entry.
#[derive(Default)]
pub(crate) struct Unaudited {
    /// Whether the first view was taken (what it held counts as audited).
    started: bool,
    /// The kinds of the view followed last (a kind that is the same `Arc` has not
    /// changed), and its revision.
    drains: Arc<BTreeMap<String, SharedDrain>>,
    tenants: Arc<BTreeMap<String, Freeze>>,
    freeze: Option<Freeze>,
    /// The revision of the policy version in force.
    policy: Option<i64>,
    revision: i64,
    /// Per key (under the prefix): the digest of the override seen last.
    seen: BTreeMap<String, [u8; 32]>,
    /// Overrides waiting for their writer's entry, in the order seen: one per key.
    waiting: Vec<Waiting>,
    /// When the entries of the last minute were appended.
    listed: VecDeque<Instant>,
    /// Overrides due past [`MAX_LISTED_PER_MINUTE`], not appended on their own.
    unlisted: u64,
}

/// An override seen, and the entry its writer appends for it.
#[derive(Clone, Debug)]
struct Waiting {
    /// The key under the prefix (`drain/{id}`, `freeze`, `freeze/{tenant}`, `policy`).
    key: String,
    /// The node the record names (its writer, by its own account).
    node: String,
    /// The kind of the writer's entry and fields it holds.
    kind: &'static str,
    fields: serde_json::Map<String, Value>,
    /// The override as stored (for the entry appended when none comes).
    record: Value,
    /// The revision of the last view without it: the writer's entry comes after.
    after: i64,
    due: Instant,
    /// How many times it changed while it waited (1: once).
    changes: u64,
}

impl Waiting {
    /// Whether `entry` (a shared audit entry) is the writer's entry of this override.
    fn matches(&self, entry: &Value) -> bool {
        entry["kind"] == self.kind
            && entry["node"] == self.node.as_str()
            && self.fields.iter().all(|(k, v)| entry.get(k) == Some(v))
    }
}

/// An override of the view: its key, digest and the writer's entry it needs.
struct Override {
    key: String,
    digest: [u8; 32],
    node: String,
    kind: &'static str,
    fields: Value,
    record: Value,
}

fn digest(v: &impl serde::Serialize) -> [u8; 32] {
    crate::config::tokens::sha256(&serde_json::to_vec(v).unwrap_or_default())
}

fn drain(d: &SharedDrain) -> Override {
    Override {
        key: Key::Drain {
            id: d.rule.id.clone(),
        }
        .to_string(),
        digest: digest(d),
        node: d.node.clone(),
        kind: "drain",
        fields: audit_rule(&d.rule),
        record: json!(d),
    }
}

fn freeze(key: Key, tenant: Option<&str>, f: &Freeze) -> Override {
    Override {
        key: key.to_string(),
        digest: digest(f),
        node: f.node.clone(),
        kind: "freeze",
        fields: json!({ "reason": f.reason, "tenant": tenant }),
        record: json!(f),
    }
}

impl Unaudited {
    /// A view this node follows (in touch with the store), at `revision`: its
    /// overrides that appeared or changed since the last one wait for their entry.
    /// `serving`: the policy version this node serves.
    pub(crate) fn follow(&mut self, view: &SharedView, revision: i64, serving: &str, now: Instant) {
        let mut found = Vec::new();
        if !Arc::ptr_eq(&self.drains, &view.drains) {
            found.extend(view.drains.values().map(drain));
        }
        if !Arc::ptr_eq(&self.tenants, &view.freeze_tenants) {
            found.extend(view.freeze_tenants.iter().map(|(t, f)| {
                let key = Key::TenantFreeze { tenant: t.clone() };
                freeze(key, Some(t), f)
            }));
        }
        if self.freeze != view.freeze {
            found.extend(view.freeze.iter().map(|f| freeze(Key::Freeze, None, f)));
        }
        // The policy version in force, unless it is a set's first version and the one
        // this node serves: what the set's nodes started with, which its writer does
        // not audit (not a change).
        let policy_rev = view.policy.as_ref().map(|(_, rev)| *rev);
        if let Some((p, _)) = view.policy.as_ref().filter(|_| self.policy != policy_rev) {
            let served = p.version == serving;
            let first = p.history.first();
            if let Some(applied) =
                first.filter(|a| !(a.how == "first" && a.based_on.is_none() && served))
            {
                found.push(Override {
                    key: Key::Policy.to_string(),
                    digest: digest(p),
                    node: applied.node.clone(),
                    kind: "policy",
                    fields: json!({ "version": p.version }),
                    record: json!({
                        "version": p.version, "how": applied.how, "based_on": applied.based_on,
                        "author": applied.author, "at_unix_ms": applied.at_unix_ms,
                    }),
                });
            }
        }
        for o in found {
            if self.seen.get(&o.key) == Some(&o.digest) {
                continue;
            }
            self.seen.insert(o.key.clone(), o.digest);
            if !self.started {
                continue;
            }
            let Value::Object(fields) = o.fields else {
                continue;
            };
            if let Some(w) = self.waiting.iter_mut().find(|w| w.key == o.key) {
                // Changed again while it waits: the same wait, its latest record.
                w.node = o.node;
                w.kind = o.kind;
                w.fields = fields;
                w.record = o.record;
                w.changes += 1;
                continue;
            }
            self.waiting.push(Waiting {
                key: o.key,
                node: o.node,
                kind: o.kind,
                fields,
                record: o.record,
                after: self.revision,
                due: now + UNAUDITED_AFTER,
                changes: 1,
            });
        }
        if self.seen.len() > MAX_REMEMBERED {
            let held = |k: &str| match k.parse::<Key>() {
                Ok(Key::Drain { id }) => view.drains.contains_key(&id),
                Ok(Key::TenantFreeze { tenant }) => view.freeze_tenants.contains_key(&tenant),
                _ => true,
            };
            self.seen.retain(|k, _| held(k));
        }
        self.started = true;
        self.drains = view.drains.clone();
        self.tenants = view.freeze_tenants.clone();
        self.freeze = view.freeze.clone();
        self.policy = policy_rev;
        self.revision = revision;
    }

    /// Forgets the overrides whose writer's entry `view` holds; the entries to append
    /// for those whose wait is over at `now` (`override_seen`, oldest first).
    pub(crate) fn due(&mut self, view: &SharedView, now: Instant) -> Vec<Value> {
        let mut out = Vec::new();
        while self
            .listed
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= MINUTE)
        {
            self.listed.pop_front();
        }
        let (listed, unlisted) = (&mut self.listed, &mut self.unlisted);
        self.waiting.retain(|w| {
            if view
                .audit
                .range(w.after + 1..)
                .any(|(_, entry)| w.matches(entry))
            {
                return false;
            }
            if w.due > now {
                return true;
            }
            if listed.len() >= MAX_LISTED_PER_MINUTE {
                *unlisted += w.changes;
                return false;
            }
            listed.push_back(now);
            let secs = UNAUDITED_AFTER.as_secs();
            let mut e = json!({
                "key": w.key,
                "record_node": w.node,
                "record": w.record,
                "why": format!("no audit entry from the writer within {secs} s: written to the store without going through a node's API"),
            });
            if w.changes > 1 {
                e["changes"] = json!(w.changes);
            }
            if *unlisted > 0 {
                e["unlisted_before"] = json!(std::mem::take(unlisted));
            }
            out.push(e);
            false
        });
        out
    }

    /// When the first wait ends.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.waiting.iter().map(|w| w.due).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::decide::drains::DrainRule;

    fn rule(id: &str) -> DrainRule {
        DrainRule {
            id: id.into(),
            name: "www.example.com.".into(),
            cdn: "a".into(),
            scope: vec![],
            reason: "r".into(),
            until_unix_ms: Some(5_000),
            immediate: false,
            written_by: Some("ns1".into()),
            written_at_unix_ms: Some(1_000),
            tenant: None,
            author: Some("ops".into()),
            ticket: None,
        }
    }

    fn with_drain(view: &SharedView, id: &str, node: &str) -> SharedView {
        let mut v = view.clone();
        let d = SharedDrain {
            rule: rule(id),
            node: node.into(),
            at_unix_ms: 1_000,
        };
        Arc::make_mut(&mut v.drains).insert(id.into(), d);
        v
    }

    fn with_entry(view: &SharedView, rev: i64, entry: Value) -> SharedView {
        let mut v = view.clone();
        Arc::make_mut(&mut v.audit).insert(rev, Arc::new(entry));
        v
    }

    fn entry(kind: &str, node: &str, fields: Value) -> Value {
        crate::control::disk::audit::Audit::entry(kind, node, fields)
    }

    #[test]
    fn an_override_without_its_writers_entry_is_audited_once_its_wait_is_over() {
        let t0 = Instant::now();
        let mut u = Unaudited::default();
        // What the first view holds counts as audited.
        let first = with_drain(&SharedView::default(), "old", "ns1");
        u.follow(&first, 10, "v1", t0);
        assert_eq!(u.next_due(), None);
        // A drain through a node's API: the drain, then its writer's entry.
        let api = with_drain(&first, "api-1", "ns1");
        u.follow(&api, 11, "v1", t0);
        assert_eq!(u.next_due(), Some(t0 + UNAUDITED_AFTER));
        assert!(u.due(&api, t0).is_empty());
        let audited = with_entry(&api, 12, entry("drain", "ns1", audit_rule(&rule("api-1"))));
        u.follow(&audited, 12, "v1", t0);
        assert!(u.due(&audited, t0).is_empty());
        assert_eq!(u.next_due(), None, "the writer's entry came");
        // A drain written straight to etcd (no entry), and one whose entry names
        // another node than its record, or holds other fields: audited when due.
        let hand = with_drain(&audited, "hand-1", "ns2");
        let hand = with_drain(&hand, "hand-2", "ns2");
        let hand = with_drain(&hand, "hand-3", "ns2");
        u.follow(&hand, 13, "v1", t0);
        let mut other = rule("hand-3");
        other.reason = "another".into();
        let later = with_entry(
            &hand,
            14,
            entry("drain", "ns3", audit_rule(&rule("hand-2"))),
        );
        let later = with_entry(&later, 15, entry("drain", "ns2", audit_rule(&other)));
        u.follow(&later, 15, "v1", t0);
        assert!(u.due(&later, t0 + UNAUDITED_AFTER / 2).is_empty());
        let due = u.due(&later, t0 + UNAUDITED_AFTER);
        let keys: Vec<&str> = due.iter().map(|e| e["key"].as_str().unwrap()).collect();
        let drain = |id: &str| Key::Drain { id: id.into() }.to_string();
        assert_eq!(keys, [drain("hand-1"), drain("hand-2"), drain("hand-3")]);
        assert_eq!(due[0]["record_node"], "ns2");
        assert_eq!(due[0]["record"]["rule"]["id"], "hand-1");
        assert!(due[0]["why"].as_str().unwrap().contains("no audit entry"));
        assert_eq!(u.next_due(), None);
        // An entry written before the change does not count for it: an old drain
        // written again with other fields waits anew.
        let mut again = later.clone();
        Arc::make_mut(&mut again.drains)
            .get_mut("api-1")
            .unwrap()
            .at_unix_ms = 2_000;
        u.follow(&again, 16, "v1", t0);
        assert_eq!(u.due(&again, t0 + UNAUDITED_AFTER).len(), 1);
        // A drain that goes and comes back the same (a new policy: every key read
        // again) is not a change.
        let mut gone = again.clone();
        Arc::make_mut(&mut gone.drains).remove("hand-1");
        u.follow(&gone, 17, "v1", t0);
        u.follow(&again, 18, "v1", t0);
        assert_eq!(u.next_due(), None);
    }

    #[test]
    fn a_key_rewritten_while_it_waits_is_one_entry_and_entries_are_capped_per_minute() {
        let t0 = Instant::now();
        let mut u = Unaudited::default();
        u.follow(&SharedView::default(), 1, "v1", t0);
        // One drain rewritten 50 times: one entry, its changes counted, the last record.
        let mut v = SharedView::default();
        for i in 0..50 {
            let mut d = SharedDrain {
                rule: rule("hand-1"),
                node: "ns2".into(),
                at_unix_ms: 1_000,
            };
            d.rule.reason = format!("by hand {i}");
            Arc::make_mut(&mut v.drains).insert("hand-1".into(), d);
            u.follow(&v, 2 + i, "v1", t0);
        }
        let due = u.due(&v, t0 + UNAUDITED_AFTER);
        assert_eq!(due.len(), 1, "{due:?}");
        assert_eq!(due[0]["changes"], 50);
        assert_eq!(due[0]["record"]["rule"]["reason"], "by hand 49");
        // 70 drains at once: 59 more this minute, the other 11 counted in the next.
        let mut many = v.clone();
        for i in 0..70 {
            many = with_drain(&many, &format!("d{i}"), "ns2");
        }
        u.follow(&many, 100, "v1", t0);
        let due = u.due(&many, t0 + UNAUDITED_AFTER);
        assert_eq!(due.len(), MAX_LISTED_PER_MINUTE - 1);
        assert!(due.iter().all(|e| e.get("unlisted_before").is_none()));
        let later = with_drain(&many, "late", "ns2");
        let t1 = t0 + UNAUDITED_AFTER + MINUTE;
        u.follow(&later, 101, "v1", t1);
        let due = u.due(&later, t1 + UNAUDITED_AFTER);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0]["key"], "drain/late");
        assert_eq!(due[0]["unlisted_before"], 11);
    }

    #[test]
    fn freezes_and_policy_versions_are_matched_with_their_writers_entries() {
        let t0 = Instant::now();
        let mut u = Unaudited::default();
        u.follow(&SharedView::default(), 1, "v1", t0);
        let f = |reason: &str| Freeze {
            reason: reason.into(),
            node: "ns1".into(),
            at_unix_ms: 1,
        };
        let mut v = SharedView {
            freeze: Some(f("all")),
            ..SharedView::default()
        };
        Arc::make_mut(&mut v.freeze_tenants).insert("shop".into(), f("shop only"));
        Arc::make_mut(&mut v.freeze_tenants).insert("blog".into(), f("by hand"));
        u.follow(&v, 2, "v1", t0);
        let lever = |reason: &str, tenant: Option<&str>| json!({"reason": reason, "author": "ops", "tenant": tenant});
        let v = with_entry(&v, 3, entry("freeze", "ns1", lever("all", None)));
        let v = with_entry(
            &v,
            4,
            entry("freeze", "ns1", lever("shop only", Some("shop"))),
        );
        let due = u.due(&v, t0 + UNAUDITED_AFTER);
        assert_eq!(due.len(), 1, "{due:?}");
        let blog = Key::TenantFreeze {
            tenant: "blog".into(),
        };
        assert_eq!(due[0]["key"], blog.to_string());
        // A set's first version, the one this node serves, is no change; another
        // version is matched with its writer's `policy` entry.
        // As a node writes it under `policy` (the YAML left out).
        let policy = |version: &str, how: &str| {
            let applied = json!({
                "version": version, "author": "ops", "ticket": null, "node": "ns2",
                "at_unix_ms": 1, "activate_at_unix_ms": 1, "how": how, "based_on": null,
            });
            let record = json!({
                "version": version, "yaml": "", "activate_at_unix_ms": 1, "history": [applied],
            });
            Arc::new(serde_json::from_value(record).unwrap())
        };
        let mut p = v.clone();
        p.policy = Some((policy("v1", "first"), 5));
        u.follow(&p, 5, "v1", t0);
        assert_eq!(u.next_due(), None);
        p.policy = Some((policy("v2", "api"), 6));
        u.follow(&p, 6, "v1", t0);
        let p = with_entry(&p, 7, entry("policy", "ns2", json!({"version": "v2"})));
        assert!(u.due(&p, t0 + UNAUDITED_AFTER).is_empty());
        let mut q = p.clone();
        q.policy = Some((policy("v3", "first"), 8));
        u.follow(&q, 8, "v2", t0);
        let due = u.due(&q, t0 + UNAUDITED_AFTER);
        assert_eq!(due.len(), 1, "a first version this node does not serve");
        assert_eq!(due[0]["record"]["version"], "v3");
    }
}
