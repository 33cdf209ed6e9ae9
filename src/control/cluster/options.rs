//! Control plane, the set: its options (`ClusterOptions`: the node, the prefix, the
//! members), its bounds (liveness, fail static, caps per kind), the key builders (on
//! `store::Key`) and `write_evaluation` (first writer wins).
//! (The main room of its folder; the folder's door, `mod.rs`, says what else lives there.)

use super::*;
use std::time::Duration;

use tracing::warn;

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
/// Most drains kept (of the policy's names and CDNs). Every other kind is bounded by
/// the policy and the members: one timeline per (name, CDN), one observation per
/// (member, CDN probed), and so on (`scope.rs`).
pub const MAX_DRAINS: usize = 256;
/// Most keys a whole read takes of one kind of the set's decisions (freezes, drains,
/// timelines, …), valid or not: past it, the read is not whole and the node fails
/// static rather than serve a part of the decisions.
pub const MAX_KIND_KEYS: usize = 16_384;
/// Most keys a whole read takes of one member's observations or performance cells
/// (the rest of that member's are refused, counted, and not read).
pub const MAX_MEMBER_KEYS: usize = 4096;
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
/// Audit entries kept from the store per member (its newest: one member's volume never
/// pushes out another's), and the largest one read.
pub const MAX_AUDIT_PER_MEMBER: usize = 1024;
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
