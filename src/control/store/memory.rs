//! Control plane, the store: the set of one's store, in memory, with etcd's semantics
//! as steerdns uses them (one revision counter for the whole store, a key's
//! `mod_revision`, create-if-absent and compare-and-swap on it, leases that delete
//! their keys when they run out, a watch from a revision, and a compacted history
//! that makes a watcher read everything anew). A single node keeps its shared
//! decisions here, saved with its state (`Saved::store`), so that one node and a set
//! go through the same code: the session reads and watches this store as it would
//! etcd, and the controller writes the same keys.
//!
//! Time is `tokio::time::Instant` (leases are durations), so paused-time tests move it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::etcd::{EtcdError, Event, Kv, Page, MAX_VALUE};

/// Events kept for watchers that start from an older revision; a watcher further
/// behind is told "compacted", as etcd would, and reads everything anew.
const HISTORY: usize = 8192;

#[derive(Clone, Debug)]
struct Entry {
    value: Vec<u8>,
    mod_revision: i64,
    lease: Option<i64>,
}

#[derive(Debug, Default)]
struct Inner {
    revision: i64,
    kvs: BTreeMap<String, Entry>,
    /// Lease id → (when it runs out, its length).
    leases: BTreeMap<i64, (Instant, Duration)>,
    next_lease: i64,
    /// `(revision, event)`, oldest first.
    history: VecDeque<(i64, Event)>,
    /// The revision of the newest event dropped from the history.
    compacted: i64,
}

/// The store in memory: cheap to clone (an `Arc` inside).
#[derive(Clone, Debug)]
pub struct Memory {
    inner: Arc<Mutex<Inner>>,
    /// The revision now: watchers wake when it moves.
    revision: watch::Sender<i64>,
}

impl Default for Memory {
    fn default() -> Memory {
        Memory::new()
    }
}

/// One key as saved with the state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedKey {
    pub key: String,
    /// The value (every value steerdns writes is JSON text).
    pub value: String,
    /// What was left of its lease when saved (none: no lease).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_left_ms: Option<u64>,
    /// The revision it was last written at, kept across a restart: an audit entry
    /// the log appended already is not appended again (none: saved by an earlier
    /// release, restored at a new revision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mod_revision: Option<i64>,
}

/// The store as saved with the state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedStore {
    pub revision: i64,
    pub keys: Vec<SavedKey>,
}

impl Memory {
    pub fn new() -> Memory {
        let inner = Inner {
            revision: 1,
            next_lease: 1,
            ..Inner::default()
        };
        Memory {
            inner: Arc::new(Mutex::new(inner)),
            revision: watch::channel(1).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the store, first ending the leases that ran out; wakes the watchers
    /// when the revision moved.
    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        self.with_at(Instant::now(), f)
    }

    /// [`Memory::with`] as of `now` (tests move it).
    fn with_at<T>(&self, now: Instant, f: impl FnOnce(&mut Inner) -> T) -> T {
        let mut inner = self.lock();
        let was = inner.revision;
        inner.expire(now);
        let out = f(&mut inner);
        let now = inner.revision;
        drop(inner);
        if now != was {
            self.revision.send_replace(now);
        }
        out
    }

    /// The store's revision now.
    pub fn revision(&self) -> i64 {
        self.with(|i| i.revision)
    }

    /// Moves the revision to at least `rev` (a restored audit log has appended entries
    /// up to `rev`: later ones must come after it).
    pub fn advance_to(&self, rev: i64) {
        self.with(|i| i.revision = i.revision.max(rev));
    }

    /// [`super::Etcd::range_page`] on the store as it is now (a set of one's reads are
    /// followed by a watch from the first page's revision, which brings whatever
    /// changed between the pages).
    pub fn range_page(&self, prefix: &str, after: Option<&str>, newest_first: bool) -> Page {
        const PAGE: usize = 256;
        self.with(|i| {
            let under = |(k, _): &(&String, _)| k.starts_with(prefix);
            let mut kvs: Vec<Kv> = match (newest_first, after) {
                (false, None) => i
                    .kvs
                    .range(prefix.to_string()..)
                    .take_while(under)
                    .take(PAGE + 1)
                    .map(|(k, e)| kv(k, e))
                    .collect(),
                (false, Some(a)) => i
                    .kvs
                    .range::<str, _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded))
                    .take_while(under)
                    .take(PAGE + 1)
                    .map(|(k, e)| kv(k, e))
                    .collect(),
                (true, after) => {
                    let upper = match after {
                        Some(a) => std::ops::Bound::Excluded(a),
                        None => std::ops::Bound::Unbounded,
                    };
                    i.kvs
                        .range::<str, _>((std::ops::Bound::Included(prefix), upper))
                        .rev()
                        .filter(|(k, _)| k.starts_with(prefix))
                        .take(PAGE + 1)
                        .map(|(k, e)| kv(k, e))
                        .collect()
                }
            };
            let more = kvs.len() > PAGE;
            kvs.truncate(PAGE);
            Page {
                kvs,
                more,
                revision: i.revision,
                member: 0,
            }
        })
    }

    pub fn get(&self, key: &str) -> Option<Kv> {
        self.with(|i| i.kvs.get(key).map(|e| kv(key, e)))
    }

    pub fn put(&self, key: &str, value: &[u8], lease: Option<i64>) -> Result<(), EtcdError> {
        self.with(|i| i.put(key, value, Lease::Set(lease)))
    }

    /// Writes `key` (with `lease`) only if it does not exist.
    pub fn create(&self, key: &str, value: &[u8], lease: Option<i64>) -> Result<bool, EtcdError> {
        self.with(|i| {
            if i.kvs.contains_key(key) {
                return Ok(false);
            }
            i.put(key, value, Lease::Set(lease)).map(|()| true)
        })
    }

    /// Writes `key` only if its `mod_revision` is still `mod_revision` (0: absent);
    /// `keep_lease` keeps the key's lease, else the write has none.
    pub fn replace(
        &self,
        key: &str,
        mod_revision: i64,
        value: &[u8],
        keep_lease: bool,
    ) -> Result<bool, EtcdError> {
        self.with(|i| {
            let now = i.kvs.get(key).map_or(0, |e| e.mod_revision);
            if now != mod_revision {
                return Ok(false);
            }
            let lease = if keep_lease {
                Lease::Keep
            } else {
                Lease::Set(None)
            };
            i.put(key, value, lease).map(|()| true)
        })
    }

    pub fn delete(&self, key: &str) {
        self.with(|i| i.delete(key));
    }

    /// A lease of `ttl` (at least a second, as etcd's); its id.
    pub fn grant(&self, ttl: Duration) -> i64 {
        let ttl = ttl.max(Duration::from_secs(1));
        self.with(|i| {
            let id = i.next_lease;
            i.next_lease += 1;
            i.leases.insert(id, (Instant::now() + ttl, ttl));
            id
        })
    }

    /// Refreshes a lease; `false` when it has run out.
    pub fn keepalive(&self, lease: i64) -> bool {
        self.with(|i| match i.leases.get_mut(&lease) {
            Some((until, ttl)) => {
                *until = Instant::now() + *ttl;
                true
            }
            None => false,
        })
    }

    /// Sends every change under `prefix` from `revision` on to `out`, as batches with
    /// the revision after each, until `out` closes; "compacted" when `revision` is
    /// older than the history kept.
    pub async fn watch(
        &self,
        prefix: &str,
        revision: i64,
        out: &mpsc::Sender<(Vec<Event>, i64)>,
    ) -> EtcdError {
        let mut woken = self.revision.subscribe();
        let mut from = revision;
        loop {
            let (batch, now, next_lease) = {
                let mut inner = self.lock();
                let was = inner.revision;
                inner.expire(Instant::now());
                if inner.revision != was {
                    self.revision.send_replace(inner.revision);
                }
                if from <= inner.compacted {
                    return EtcdError::Refused("watch canceled: compacted".into());
                }
                let batch: Vec<Event> = inner
                    .history
                    .iter()
                    .filter(|(r, e)| *r >= from && key_of(e).starts_with(prefix))
                    .map(|(_, e)| e.clone())
                    .collect();
                let next = inner.leases.values().map(|(until, _)| *until).min();
                (batch, inner.revision, next)
            };
            from = now + 1;
            if !batch.is_empty() && out.send((batch, now)).await.is_err() {
                return EtcdError::Unreachable("nobody listens".into());
            }
            let lease_runs_out = async {
                match next_lease {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = woken.changed() => {
                    if changed.is_err() {
                        return EtcdError::Unreachable("the store is gone".into());
                    }
                }
                _ = lease_runs_out => {}
                _ = out.closed() => return EtcdError::Unreachable("nobody listens".into()),
            }
        }
    }

    /// Every key, to save with the state.
    pub fn saved(&self) -> SavedStore {
        self.with(|i| {
            let now = Instant::now();
            let keys =
                i.kvs
                    .iter()
                    .map(|(k, e)| SavedKey {
                        key: k.clone(),
                        value: String::from_utf8_lossy(&e.value).into_owned(),
                        lease_left_ms: e.lease.and_then(|l| i.leases.get(&l)).map(|(until, _)| {
                            until.saturating_duration_since(now).as_millis() as u64
                        }),
                        mod_revision: Some(e.mod_revision),
                    })
                    .collect();
            SavedStore {
                revision: i.revision,
                keys,
            }
        })
    }

    /// Puts back what [`Memory::saved`] saved: each key with a lease of what was left
    /// of its own; the revision goes on from the saved one.
    pub fn restore(&self, saved: &SavedStore) {
        self.with(|i| {
            let top = i.revision.max(saved.revision);
            // Each key at its own revision (in order), those without one after them.
            let mut keys: Vec<&SavedKey> = saved.keys.iter().collect();
            keys.sort_by_key(|k| k.mod_revision.unwrap_or(i64::MAX));
            for k in keys {
                let lease = k.lease_left_ms.map(|ms| {
                    let id = i.next_lease;
                    i.next_lease += 1;
                    let ttl = Duration::from_millis(ms);
                    i.leases.insert(id, (Instant::now() + ttl, ttl));
                    id
                });
                i.revision = match k.mod_revision {
                    Some(rev) if rev >= 1 && rev <= top => rev - 1,
                    _ => i.revision.max(top),
                };
                let _ = i.put(&k.key, k.value.as_bytes(), Lease::Set(lease));
            }
            i.revision = i.revision.max(top);
            i.history.clear();
            i.compacted = i.revision;
        });
    }
}

enum Lease {
    Set(Option<i64>),
    Keep,
}

impl Inner {
    fn put(&mut self, key: &str, value: &[u8], lease: Lease) -> Result<(), EtcdError> {
        let lease = match lease {
            Lease::Keep => self.kvs.get(key).and_then(|e| e.lease),
            Lease::Set(Some(l)) if !self.leases.contains_key(&l) => {
                return Err(EtcdError::Refused("requested lease not found".into()))
            }
            Lease::Set(l) => l,
        };
        self.revision += 1;
        let entry = Entry {
            value: value.to_vec(),
            mod_revision: self.revision,
            lease,
        };
        self.record(Event::Put(kv(key, &entry)));
        self.kvs.insert(key.to_string(), entry);
        Ok(())
    }

    fn delete(&mut self, key: &str) {
        if self.kvs.remove(key).is_some() {
            self.revision += 1;
            self.record(Event::Delete(key.to_string()));
        }
    }

    fn record(&mut self, event: Event) {
        if self.history.len() == HISTORY {
            if let Some((rev, _)) = self.history.pop_front() {
                self.compacted = rev;
            }
        }
        self.history.push_back((self.revision, event));
    }

    /// Ends the leases that ran out by `now`, with their keys.
    fn expire(&mut self, now: Instant) {
        let ended: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, (until, _))| *until <= now)
            .map(|(id, _)| *id)
            .collect();
        if ended.is_empty() {
            return;
        }
        for id in &ended {
            self.leases.remove(id);
        }
        let gone: Vec<String> = self
            .kvs
            .iter()
            .filter(|(_, e)| e.lease.is_some_and(|l| ended.contains(&l)))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.delete(&k);
        }
    }
}

fn kv(key: &str, e: &Entry) -> Kv {
    let too_big = e.value.len() > MAX_VALUE;
    Kv {
        key: key.to_string(),
        value: if too_big { Vec::new() } else { e.value.clone() },
        mod_revision: e.mod_revision,
        too_big,
    }
}

fn key_of(e: &Event) -> &str {
    match e {
        Event::Put(kv) => &kv.key,
        Event::Delete(k) => k,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn create_and_compare_and_swap_hold_as_in_etcd() {
        let m = Memory::new();
        assert!(m.create("/s/a", b"1", None).unwrap());
        assert!(!m.create("/s/a", b"2", None).unwrap());
        let rev = m.get("/s/a").unwrap().mod_revision;
        assert!(!m.replace("/s/a", rev - 1, b"3", false).unwrap());
        assert!(m.replace("/s/a", rev, b"4", false).unwrap());
        assert_eq!(m.get("/s/a").unwrap().value, b"4");
        assert!(m.put("/s/b", b"x", Some(999)).is_err(), "no such lease");
        m.delete("/s/a");
        assert!(m.get("/s/a").is_none());
        assert_eq!(m.range_page("/s/", None, false).kvs.len(), 0);
    }

    #[tokio::test]
    async fn a_lease_ends_its_keys_and_a_watch_sees_it() {
        let m = Memory::new();
        let lease = m.grant(Duration::from_secs(5));
        m.put("/s/drain/x", b"{}", Some(lease)).unwrap();
        m.put("/s/freeze", b"{}", None).unwrap();
        let start = m.range_page("/s/", None, false);
        assert_eq!(start.kvs.len(), 2);
        let now = Instant::now();
        m.with_at(now + Duration::from_secs(4), |_| ());
        assert!(m.get("/s/drain/x").is_some(), "not yet");
        m.with_at(now + Duration::from_secs(6), |_| ());
        assert!(m.get("/s/drain/x").is_none(), "its lease ran out");
        assert!(m.get("/s/freeze").is_some());
        assert!(!m.keepalive(lease));
        let (tx, mut rx) = mpsc::channel(8);
        let w = m.clone();
        tokio::spawn(async move { w.watch("/s/", start.revision + 1, &tx).await });
        let (batch, rev) = rx.recv().await.unwrap();
        assert_eq!(batch, vec![Event::Delete("/s/drain/x".into())]);
        assert_eq!(rev, m.revision());
        // A write after the watch started reaches it too.
        m.put("/s/drain/y", b"{}", None).unwrap();
        let (batch, _) = rx.recv().await.unwrap();
        assert!(matches!(&batch[..], [Event::Put(kv)] if kv.key == "/s/drain/y"));
    }

    #[tokio::test]
    async fn a_kept_alive_lease_goes_on() {
        let m = Memory::new();
        let lease = m.grant(Duration::from_secs(5));
        m.put("/s/obs/ns1/a", b"{}", Some(lease)).unwrap();
        assert!(m.keepalive(lease));
        m.with_at(Instant::now() + Duration::from_secs(4), |_| ());
        assert!(m.get("/s/obs/ns1/a").is_some());
    }

    #[tokio::test]
    async fn saved_and_restored_it_goes_on_where_it_was() {
        let m = Memory::new();
        let lease = m.grant(Duration::from_secs(60));
        m.put("/s/drain/x", b"{\"a\":1}", Some(lease)).unwrap();
        m.put("/s/freeze", b"{}", None).unwrap();
        let saved = m.saved();
        let left = saved
            .keys
            .iter()
            .find(|k| k.key == "/s/drain/x")
            .unwrap()
            .lease_left_ms;
        assert!(
            left.is_some_and(|ms| (59_000..=60_000).contains(&ms)),
            "{left:?}"
        );
        let back = Memory::new();
        back.restore(&saved);
        assert!(back.revision() >= saved.revision);
        assert_eq!(back.get("/s/drain/x").unwrap().value, b"{\"a\":1}");
        back.with_at(Instant::now() + Duration::from_secs(61), |_| ());
        assert!(back.get("/s/drain/x").is_none(), "the lease went on");
        assert!(back.get("/s/freeze").is_some());
    }
}
