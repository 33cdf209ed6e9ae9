//! Control plane, the store: `Store`, the set's store of decisions, memory or etcd, one
//! set of calls with one semantics for both.
//! (The main room of its folder; the folder's door, `mod.rs`, says what else lives there.)

use super::*;
use std::time::Duration;

use tokio::sync::mpsc;

/// Where the set's decisions are kept: cheap to clone.
#[derive(Clone)]
pub enum Store {
    Etcd(Etcd),
    Memory(Memory),
}

impl Store {
    /// Whether this is a set of one (the store in memory).
    pub fn is_memory(&self) -> bool {
        matches!(self, Store::Memory(_))
    }

    /// What to save with this node's state: a store in memory, all of it; etcd keeps
    /// its own.
    pub fn saved(&self) -> Option<SavedStore> {
        match self {
            Store::Etcd(_) => None,
            Store::Memory(m) => Some(m.saved()),
        }
    }

    /// A store in memory gets back what `saved` gives (when anything was saved), its
    /// revision past `audit_rev` (the last one the audit log appended); etcd keeps
    /// its own.
    pub fn restore(&self, audit_rev: i64, saved: impl FnOnce() -> Option<SavedStore>) {
        if let Store::Memory(m) = self {
            m.advance_to(audit_rev);
            if let Some(keys) = saved() {
                m.restore(&keys);
            }
        }
    }

    /// One page of the keys under `prefix` (see [`Etcd::range_page`]).
    pub async fn range_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        at: Option<(i64, usize)>,
        newest_first: bool,
    ) -> Result<Page, EtcdError> {
        match self {
            Store::Etcd(e) => e.range_page(prefix, after, at, newest_first).await,
            Store::Memory(m) => Ok(m.range_page(prefix, after, newest_first)),
        }
    }

    /// One key (`None`: absent).
    pub async fn get(&self, key: &str) -> Result<Option<Kv>, EtcdError> {
        match self {
            Store::Etcd(e) => e.get(key).await,
            Store::Memory(m) => Ok(m.get(key)),
        }
    }

    /// Writes `key` (attached to `lease` when given).
    pub async fn put(&self, key: &str, value: &[u8], lease: Option<i64>) -> Result<(), EtcdError> {
        match self {
            Store::Etcd(e) => e.put(key, value, lease).await,
            Store::Memory(m) => m.put(key, value, lease),
        }
    }

    /// Writes `key` only if it does not exist; whether it was written.
    pub async fn create(&self, key: &str, value: &[u8]) -> Result<bool, EtcdError> {
        self.create_with(key, value, None).await
    }

    /// [`Store::create`], the key attached to `lease`.
    pub async fn create_leased(
        &self,
        key: &str,
        value: &[u8],
        lease: i64,
    ) -> Result<bool, EtcdError> {
        self.create_with(key, value, Some(lease)).await
    }

    pub(super) async fn create_with(
        &self,
        key: &str,
        value: &[u8],
        lease: Option<i64>,
    ) -> Result<bool, EtcdError> {
        match (self, lease) {
            (Store::Etcd(e), Some(l)) => e.create_leased(key, value, l).await,
            (Store::Etcd(e), None) => e.create(key, value).await,
            (Store::Memory(m), l) => m.create(key, value, l),
        }
    }

    /// Writes `key` only if it is still at `mod_revision`; whether it was written.
    pub async fn replace(
        &self,
        key: &str,
        mod_revision: i64,
        value: &[u8],
    ) -> Result<bool, EtcdError> {
        self.replace_with(key, mod_revision, value, false).await
    }

    /// [`Store::replace`], keeping the key's lease.
    pub async fn replace_keeping_lease(
        &self,
        key: &str,
        mod_revision: i64,
        value: &[u8],
    ) -> Result<bool, EtcdError> {
        self.replace_with(key, mod_revision, value, true).await
    }

    pub(super) async fn replace_with(
        &self,
        key: &str,
        rev: i64,
        value: &[u8],
        keep_lease: bool,
    ) -> Result<bool, EtcdError> {
        match (self, keep_lease) {
            (Store::Etcd(e), true) => e.replace_keeping_lease(key, rev, value).await,
            (Store::Etcd(e), false) => e.replace(key, rev, value).await,
            (Store::Memory(m), keep) => m.replace(key, rev, value, keep),
        }
    }

    /// Deletes `key`.
    pub async fn delete(&self, key: &str) -> Result<(), EtcdError> {
        match self {
            Store::Etcd(e) => e.delete(key).await,
            Store::Memory(m) => {
                m.delete(key);
                Ok(())
            }
        }
    }

    /// A lease of `ttl`; its id.
    pub async fn grant(&self, ttl: Duration) -> Result<i64, EtcdError> {
        match self {
            Store::Etcd(e) => e.grant(ttl).await,
            Store::Memory(m) => Ok(m.grant(ttl)),
        }
    }

    /// Refreshes a lease; `false` when the store no longer has it.
    pub async fn keepalive(&self, lease: i64) -> Result<bool, EtcdError> {
        match self {
            Store::Etcd(e) => e.keepalive(lease).await,
            Store::Memory(m) => Ok(m.keepalive(lease)),
        }
    }

    /// A revision at which the store holds every write this node saw answered: the
    /// highest its writes were answered at, without asking again (a round trip saved
    /// on every lever, which counts across an ocean), else the store's revision now.
    pub async fn revision_after_writes(&self, key: &str) -> Result<i64, EtcdError> {
        match self {
            Store::Etcd(e) => match e.written_revision() {
                Some(rev) => Ok(rev),
                None => e.revision(key).await,
            },
            Store::Memory(m) => Ok(m.revision()),
        }
    }

    /// Watches every key under `prefix` from `revision` (on `member`), sending each
    /// batch to `out` until it fails (the error says why).
    pub async fn watch(
        &self,
        member: usize,
        prefix: &str,
        revision: i64,
        out: &mpsc::Sender<(Vec<Event>, i64)>,
    ) -> EtcdError {
        match self {
            Store::Etcd(e) => e.watch(member, prefix, revision, out).await,
            Store::Memory(m) => m.watch(prefix, revision, out).await,
        }
    }

    /// A linearizable read of `key` on `member`: fails on a member without a quorum.
    pub async fn check(&self, member: usize, key: &str) -> Result<(), EtcdError> {
        match self {
            Store::Etcd(e) => e.check(member, key).await,
            Store::Memory(_) => Ok(()),
        }
    }

    /// This node's clock offset against etcd, ms (none in memory).
    pub fn skew_ms(&self) -> Option<i64> {
        match self {
            Store::Etcd(e) => e.skew_ms(),
            Store::Memory(_) => None,
        }
    }

    /// The member requests go to now.
    pub fn current(&self) -> usize {
        match self {
            Store::Etcd(e) => e.current(),
            Store::Memory(_) => 0,
        }
    }

    /// Moves past member `i` (after it stopped answering).
    pub fn skip(&self, i: usize) {
        if let Store::Etcd(e) = self {
            e.skip(i);
        }
    }

    /// Member `i`, as shown.
    pub fn endpoint_url(&self, i: usize) -> String {
        match self {
            Store::Etcd(e) => e.endpoint_url(i),
            Store::Memory(_) => "memory".into(),
        }
    }
}
