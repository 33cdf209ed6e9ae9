//! Control plane, the store: the key schema, written (`Display`) and read (`FromStr`)
//! here and nowhere else. A key is written under the set's prefix ([`Key::under`]);
//! what follows the prefix parses back to the same [`Key`]. What each key holds and who
//! writes it: the table in `control/cluster/mod.rs`. Whether a parsed key counts (sane
//! names, members, caps) is the view's business (`cluster/view.rs`).

use std::fmt;
use std::str::FromStr;

/// One key of the store, without the prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Key {
    /// A vantage point's latest observation of a CDN.
    Obs { vantage: String, cdn: String },
    /// The failover timeline of a (name, CDN).
    Timeline { name: String, cdn: String },
    /// A drain override.
    Drain { id: String },
    /// The freeze of every name.
    Freeze,
    /// The freeze of a tenant's names.
    TenantFreeze { tenant: String },
    /// One CDN's usage records of one UTC day.
    Usage { cdn: String, day: String },
    /// The commit biases of a name.
    Commit { name: String },
    /// One node's performance buckets of a region (by index) of a name.
    Perf {
        node: String,
        name: String,
        region: usize,
    },
    /// The performance evaluation of a region of a name.
    Shift { name: String, region: usize },
    /// The DNS cookie secrets.
    Cookie,
    /// An audit entry of a node.
    Audit { node: String, serial: String },
    /// The head (seq and hash of the last entry) of a node's audit log.
    AuditHead { node: String },
    /// The policy version in force in the set, with its YAML and its history.
    Policy,
    /// The YAML of a version of the policy (kept for a rollback), by its version.
    PolicyVersion { version: String },
}

impl Key {
    /// The key under `prefix` (which ends in `/`).
    pub fn under(&self, prefix: &str) -> String {
        format!("{prefix}{self}")
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Obs { vantage, cdn } => write!(f, "obs/{vantage}/{cdn}"),
            Key::Timeline { name, cdn } => write!(f, "timeline/{name}/{cdn}"),
            Key::Drain { id } => write!(f, "drain/{id}"),
            Key::Freeze => f.write_str("freeze"),
            Key::TenantFreeze { tenant } => write!(f, "freeze/{tenant}"),
            Key::Usage { cdn, day } => write!(f, "usage/{cdn}/{day}"),
            Key::Commit { name } => write!(f, "commit/{name}"),
            Key::Perf { node, name, region } => write!(f, "perf/{node}/{name}/{region}"),
            Key::Shift { name, region } => write!(f, "shift/{name}/{region}"),
            Key::Cookie => f.write_str("cookie"),
            Key::Audit { node, serial } => write!(f, "audit/{node}/{serial}"),
            Key::AuditHead { node } => write!(f, "audit-head/{node}"),
            Key::Policy => f.write_str("policy"),
            Key::PolicyVersion { version } => write!(f, "versions/{version}"),
        }
    }
}

/// One part of a whole read of the store: the keys of one kind, or one member's keys
/// of its own kinds, read on its own so that one kind's volume never hides another's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// What follows the set's prefix.
    pub under: String,
    /// The member whose own keys these are (observations, performance cells, audit
    /// entries); `None`: the set's decisions.
    pub member: Option<String>,
    /// Read newest first (audit entries: their serials grow with time).
    pub newest_first: bool,
}

impl Key {
    /// The parts of a whole read, in order: the set's decisions first, each kind on its
    /// own (the policy in force, freezes, drains, timelines, commit biases, performance
    /// shifts, usage), then each member's observations, performance cells, audit
    /// entries and audit head. Keys of no part (the cookie secrets, the policy versions kept for a
    /// rollback, unknown keys) are not read.
    pub fn parts<'a>(members: impl IntoIterator<Item = &'a str>) -> Vec<Part> {
        let shared = |under: &str| Part {
            under: under.to_string(),
            member: None,
            newest_first: false,
        };
        let mut parts: Vec<Part> = [
            "policy",
            "freeze",
            "drain/",
            "timeline/",
            "commit/",
            "shift/",
            "usage/",
        ]
        .into_iter()
        .map(shared)
        .collect();
        for m in members {
            for (kind, newest_first) in [("obs", false), ("perf", false), ("audit", true)] {
                parts.push(Part {
                    under: format!("{kind}/{m}/"),
                    member: Some(m.to_string()),
                    newest_first,
                });
            }
            parts.push(Part {
                under: format!("audit-head/{m}"),
                member: Some(m.to_string()),
                newest_first: false,
            });
        }
        parts
    }
}

/// Why a key is not one of steerdns's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadKey {
    #[error("not a key of steerdns")]
    Unknown,
    #[error("region `{0}` is not an index")]
    Region(String),
}

impl FromStr for Key {
    type Err = BadKey;

    fn from_str(rest: &str) -> Result<Key, BadKey> {
        let parts: Vec<&str> = rest.split('/').collect();
        let s = |x: &&str| x.to_string();
        Ok(match parts.as_slice() {
            ["obs", v, c] => Key::Obs {
                vantage: s(v),
                cdn: s(c),
            },
            ["timeline", n, c] => Key::Timeline {
                name: s(n),
                cdn: s(c),
            },
            ["drain", id] => Key::Drain { id: s(id) },
            ["freeze"] => Key::Freeze,
            ["freeze", t] => Key::TenantFreeze { tenant: s(t) },
            ["usage", c, d] => Key::Usage {
                cdn: s(c),
                day: s(d),
            },
            ["commit", n] => Key::Commit { name: s(n) },
            ["perf", node, n, r] => Key::Perf {
                node: s(node),
                name: s(n),
                region: region(r)?,
            },
            ["shift", n, r] => Key::Shift {
                name: s(n),
                region: region(r)?,
            },
            ["cookie"] => Key::Cookie,
            ["audit", node, serial] => Key::Audit {
                node: s(node),
                serial: s(serial),
            },
            ["audit-head", node] => Key::AuditHead { node: s(node) },
            ["policy"] => Key::Policy,
            ["versions", v] => Key::PolicyVersion { version: s(v) },
            _ => return Err(BadKey::Unknown),
        })
    }
}

/// A region index as written: digits, no leading zero.
fn region(s: &str) -> Result<usize, BadKey> {
    s.parse::<usize>()
        .ok()
        .filter(|r| r.to_string() == s)
        .ok_or_else(|| BadKey::Region(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_reads_back_as_written() {
        let keys = [
            Key::Obs {
                vantage: "ns1".into(),
                cdn: "a".into(),
            },
            Key::Timeline {
                name: "www.example.com.".into(),
                cdn: "a".into(),
            },
            Key::Drain { id: "api-1".into() },
            Key::Freeze,
            Key::TenantFreeze {
                tenant: "shop".into(),
            },
            Key::Usage {
                cdn: "a".into(),
                day: "2026-12-05".into(),
            },
            Key::Commit {
                name: "dl.example.com.".into(),
            },
            Key::Perf {
                node: "ns1".into(),
                name: "p.example.com.".into(),
                region: 3,
            },
            Key::Shift {
                name: "p.example.com.".into(),
                region: 0,
            },
            Key::Cookie,
            Key::Audit {
                node: "ns1".into(),
                serial: "17".into(),
            },
            Key::AuditHead { node: "ns1".into() },
            Key::Policy,
            Key::PolicyVersion {
                version: "0123456789ab".into(),
            },
        ];
        for k in keys {
            let text = k.to_string();
            assert_eq!(text.parse::<Key>(), Ok(k.clone()), "{text}");
            assert_eq!(k.under("/s/"), format!("/s/{text}"));
        }
        assert_eq!("nope/x".parse::<Key>(), Err(BadKey::Unknown));
        assert_eq!("freeze/a/b".parse::<Key>(), Err(BadKey::Unknown));
        // Every key of a member's own kinds falls in that member's part.
        let parts = Key::parts(["ns1"]);
        for k in [
            Key::Policy,
            Key::Freeze,
            Key::TenantFreeze { tenant: "t".into() },
            Key::Drain { id: "api-1".into() },
            Key::Perf {
                node: "ns1".into(),
                name: "p.".into(),
                region: 0,
            },
            Key::Audit {
                node: "ns1".into(),
                serial: "1".into(),
            },
            Key::AuditHead { node: "ns1".into() },
        ] {
            let text = k.to_string();
            assert_eq!(
                parts.iter().filter(|p| text.starts_with(&p.under)).count(),
                1,
                "{text}"
            );
        }
        // The versions kept for a rollback are in no part: never read whole.
        let kept = Key::PolicyVersion {
            version: "0123456789ab".into(),
        }
        .to_string();
        assert!(!parts.iter().any(|p| kept.starts_with(&p.under)));
        assert_eq!(
            "shift/n/01".parse::<Key>(),
            Err(BadKey::Region("01".into()))
        );
    }
}
