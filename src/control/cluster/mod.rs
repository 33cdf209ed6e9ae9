//! Control plane: the set a node belongs to, sharing one view through the set's store:
//! etcd for a set of nameservers and probe agents (`serve --etcd`, `agent --etcd`), or
//! memory for a single node, a set of one (`control::store`). The same code runs for
//! both; only a set of many publishes observations and performance cells, and reads
//! them from others.
//!
//! ```text
//!  prober ─▶ Local ─▶ publisher ──put (lease)──▶ etcd ◀──txn / put── controller (transitions,
//!                                                 │                   API drains, freeze)
//!                       controller ◀── Shared ◀── session: range, then watch + liveness check
//! ```
//!
//! Keys under the prefix (default `/steerdns/`), values JSON; the schema is written and
//! read in one place, `store::Key` (`control/store/key.rs`); the builders below use it:
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
//! | `cookie` | `control::cookies::SharedSecrets`: the DNS cookie secrets (current, previous, when current was made), read by every node every 2 s (`control/cookies.rs`, not through the watch) | the first node to find none (create-if-absent); the first to find it older than `--cookie-rotation-seconds` rotates it (compare-and-swap on the revision) |
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
//! shared keys): see the book, `docs/book/src/user/set/security.md`.
//!
//! **Bounds.** A value over [`etcd::MAX_VALUE`], a key outside the table above, or one
//! past the cap of its kind is refused when it is decoded and is not kept; the initial
//! read comes in pages; a watch batch parses only the keys it changes.
//!
//! | file | holds |
//! |---|---|
//! | `records.rs` | the records above, and `Timeline::at` |
//! | `view.rs` | `SharedView`, kept by `Mirror` from the read and the watch (`SharedView::add` checks each key) |
//! | `session.rs` | `spawn_session` (read, watch, liveness, fail static) and the `Publisher` of observations |
//! | `node.rs` | `ClusterLink`: the controller's side (writes, `on_shared`, proposals) |
//! | `usage.rs`, `performance.rs` | the usage records, commit biases and performance cells of the set |

pub mod node;
pub mod performance;
mod records;
mod session;
pub mod usage;
mod view;

use std::time::Duration;

use tracing::warn;

pub use crate::control::store::etcd::{self, Etcd, EtcdError, EtcdOptions};
pub use crate::control::store::{Key, Store};
pub use records::{Freeze, SharedDrain, SharedObservation, Timeline};
pub use session::{spawn_session, Publisher};
pub use view::{Link, Shared, SharedView};

/// The key prefix of a set's store unless `--etcd-prefix` says otherwise (also a set of
/// one's, in memory).
pub const DEFAULT_PREFIX: &str = "/steerdns/";

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
pub(crate) const MAX_REFUSED_KEPT: usize = 1024;
/// How long one call to etcd may take before the member counts as unreachable.
pub const CALL_TIMEOUT: Duration = Duration::from_millis(1500);
/// Longest vantage, node or CDN name accepted in a key.
pub(crate) const MAX_NAME: usize = 128;
/// Most vantage points counted (bounds memory and the per-vantage metric series).
pub const MAX_VANTAGES: usize = 64;
/// Longest reason accepted.
pub(crate) const MAX_REASON: usize = 2048;
/// Audit entries kept from etcd (the newest), and the largest one read.
pub const MAX_AUDIT_KEYS: usize = 4096;
pub(crate) const MAX_AUDIT_VALUE: usize = 16 * 1024;
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

/// Key of an observation.
pub fn obs_key(prefix: &str, vantage: &str, cdn: &str) -> String {
    Key::Obs {
        vantage: vantage.into(),
        cdn: cdn.into(),
    }
    .under(prefix)
}

/// Key of a timeline.
pub fn timeline_key(prefix: &str, name: &str, cdn: &str) -> String {
    Key::Timeline {
        name: name.into(),
        cdn: cdn.into(),
    }
    .under(prefix)
}

/// Key of a drain override.
pub fn drain_key(prefix: &str, id: &str) -> String {
    Key::Drain { id: id.into() }.under(prefix)
}

/// Key of the freeze of a tenant's names.
pub fn tenant_freeze_key(prefix: &str, tenant: &str) -> String {
    Key::TenantFreeze {
        tenant: tenant.into(),
    }
    .under(prefix)
}

/// Key of an audit entry.
pub fn audit_key(prefix: &str, node: &str, serial: u64) -> String {
    Key::Audit {
        node: node.into(),
        serial: serial.to_string(),
    }
    .under(prefix)
}

/// Key of the freeze.
pub fn freeze_key(prefix: &str) -> String {
    Key::Freeze.under(prefix)
}

/// Key of the set's DNS cookie secrets.
pub fn cookie_key(prefix: &str) -> String {
    Key::Cookie.under(prefix)
}

/// Writes an evaluation (`value` at `key`) for the set, in the background: created
/// when the set has none (`rev` `None`), else replaced if the key is still at `rev`, so
/// that the first node to evaluate a period wins; a failure is logged (`what`).
pub(crate) fn write_evaluation(
    store: &Store,
    key: String,
    value: Vec<u8>,
    rev: Option<i64>,
    what: &'static str,
) {
    let store = store.clone();
    tokio::spawn(async move {
        let written = match rev {
            None => store.create(&key, &value).await,
            Some(rev) => store.replace(&key, rev, &value).await,
        };
        if let Err(e) = written {
            warn!(key = %key, error = %e, "cannot write the {what} for the set");
        }
    });
}
