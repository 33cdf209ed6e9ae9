//! Control plane, the store of the set's decisions: etcd for a set (`--etcd`), memory
//! for a single node, which is a set of one. Both take the same calls with the same
//! semantics (create-if-absent, compare-and-swap on a revision, leases, a watch from a
//! revision), so the session, the writers and the controller have one path for both.
//!
//! | file | holds |
//! |---|---|
//! | `memory.rs` | [`Memory`]: the store of a set of one, saved with the state |
//! | `key.rs` | [`Key`]: the key schema, the one place it is written and read |
//! | `etcd.rs` | [`Etcd`]: the etcd v3 JSON gateway client of a set |

pub mod etcd;
mod key;
mod memory;

use std::time::Duration;

use tokio::sync::mpsc;

pub use key::{BadKey, Key};
pub use memory::{Memory, SavedKey, SavedStore};

pub use etcd::{Etcd, EtcdError, EtcdOptions, Event, Kv, Range};

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

    /// Every key under `prefix` (at most `max_keys`), read at one revision.
    pub async fn range_prefix(&self, prefix: &str, max_keys: usize) -> Result<Range, EtcdError> {
        match self {
            Store::Etcd(e) => e.range_prefix(prefix, max_keys).await,
            Store::Memory(m) => Ok(m.range_prefix(prefix, max_keys)),
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
        match self {
            Store::Etcd(e) => e.create(key, value).await,
            Store::Memory(m) => m.create(key, value, None),
        }
    }

    /// Writes `key` attached to `lease` only if it does not exist.
    pub async fn create_leased(
        &self,
        key: &str,
        value: &[u8],
        lease: i64,
    ) -> Result<bool, EtcdError> {
        match self {
            Store::Etcd(e) => e.create_leased(key, value, lease).await,
            Store::Memory(m) => m.create(key, value, Some(lease)),
        }
    }

    /// Writes `key` only if it is still at `mod_revision`; whether it was written.
    pub async fn replace(
        &self,
        key: &str,
        mod_revision: i64,
        value: &[u8],
    ) -> Result<bool, EtcdError> {
        match self {
            Store::Etcd(e) => e.replace(key, mod_revision, value).await,
            Store::Memory(m) => m.replace(key, mod_revision, value, false),
        }
    }

    /// Like [`Store::replace`], keeping the key's lease.
    pub async fn replace_keeping_lease(
        &self,
        key: &str,
        mod_revision: i64,
        value: &[u8],
    ) -> Result<bool, EtcdError> {
        match self {
            Store::Etcd(e) => e.replace_keeping_lease(key, mod_revision, value).await,
            Store::Memory(m) => m.replace(key, mod_revision, value, true),
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

    /// The store's revision now (every write this node saw answered is at or before
    /// it).
    pub async fn revision(&self, key: &str) -> Result<i64, EtcdError> {
        match self {
            Store::Etcd(e) => e.revision(key).await,
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
