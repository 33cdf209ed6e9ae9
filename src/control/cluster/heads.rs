//! Control plane, a set: the head of each node's audit log (the seq and hash of its
//! last entry), published under `audit-head/{node}` by that node
//! ([`HeadPublisher`]) and shown by every node in `/v1/state` (`cluster.audit_heads`),
//! so that a copy of any node's log can be checked against what that node published
//! (`steerdns audit verify --expect-head SEQ:HASH`): a log cut short, or rewritten and
//! rehashed, no longer holds the head its node published.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::refused::Refused;
use super::{Key, Store};
use crate::clock::now_ms;
use crate::control::decide::times;
use crate::control::disk::audit::Watch;

/// How often a node looks whether its head moved (and publishes it if it did).
pub(crate) const HEAD_EVERY: Duration = Duration::from_secs(1);

/// A node's audit head, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedHead {
    /// The seq of the last entry (0: an empty log).
    pub seq: u64,
    /// Its hash: 64 lowercase hex digits.
    pub hash: String,
    /// When the node published it (Unix ms).
    #[serde(deserialize_with = "times::bounded")]
    pub at_unix_ms: u64,
}

impl SharedHead {
    /// Whether the hash is one the log writes.
    pub fn check(&self) -> Result<(), Refused> {
        let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        if self.hash.len() != 64 || !self.hash.bytes().all(hex) {
            return Err(Refused::HeadHash);
        }
        Ok(())
    }

    /// `SEQ:HASH`, as `audit verify --expect-head` takes it.
    pub fn shown(&self) -> String {
        format!("{}:{}", self.seq, self.hash)
    }
}

/// Publishes this node's audit head under `audit-head/{node}` (no lease: the last head
/// of a node that stopped stays to compare with), each [`HEAD_EVERY`] that it moved.
pub(crate) struct HeadPublisher {
    pub store: Store,
    pub prefix: String,
    pub node: String,
    pub audit: Watch,
}

impl HeadPublisher {
    pub(crate) fn spawn(self, stop: CancellationToken) {
        tokio::spawn(async move {
            let key = Key::AuditHead {
                node: self.node.clone(),
            }
            .under(&self.prefix);
            let mut written: Option<(u64, String)> = None;
            let mut failing = false;
            loop {
                let head = self.audit.head();
                if written.as_ref() != Some(&head) {
                    let record = SharedHead {
                        seq: head.0,
                        hash: head.1.clone(),
                        at_unix_ms: now_ms(),
                    };
                    let value = serde_json::to_vec(&record).unwrap_or_default();
                    match self.store.put(&key, &value, None).await {
                        Ok(()) => {
                            if failing {
                                info!(node = %self.node, "etcd: the audit head is published again");
                                failing = false;
                            }
                            written = Some(head);
                        }
                        Err(e) => {
                            if !failing {
                                warn!(node = %self.node, error = %e, "etcd: cannot publish this node's audit head");
                                failing = true;
                            }
                        }
                    }
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(HEAD_EVERY) => {}
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_checked_for_its_form() {
        let head = |hash: &str| SharedHead {
            seq: 7,
            hash: hash.into(),
            at_unix_ms: 1,
        };
        assert!(head(&"0a".repeat(32)).check().is_ok());
        assert_eq!(
            head(&"0a".repeat(32)).shown(),
            format!("7:{}", "0a".repeat(32))
        );
        for bad in [
            "",
            "0A".repeat(32).as_str(),
            &"0".repeat(63),
            &"g".repeat(64),
        ] {
            assert!(head(bad).check().is_err(), "{bad}");
        }
        let late = serde_json::json!({"seq": 1, "hash": "0".repeat(64), "at_unix_ms": u64::MAX});
        assert!(serde_json::from_value::<SharedHead>(late).is_err());
        let extra = serde_json::json!({"seq": 1, "hash": "0".repeat(64), "at_unix_ms": 1, "x": 1});
        assert!(serde_json::from_value::<SharedHead>(extra).is_err());
    }
}
