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
pub use etcd::{Etcd, EtcdError, EtcdOptions, Event, Kv, Page};
pub use key::{BadKey, Key, Part};
pub use memory::{Memory, SavedKey, SavedStore};
mod client;
pub use client::*;
