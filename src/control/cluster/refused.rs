//! Control plane, a set: why a key of the store does not count in this node's view
//! (`SharedView::add`): its form, the policy in force and the members (`scope.rs`),
//! or its record (`view.rs`, and the checks of `usage.rs`, `performance.rs`,
//! `heads.rs`, `policy.rs`). The text is what `/v1/state` shows of the keys refused.

use super::{MAX_DRAINS, MAX_REASON};
use crate::control::levers::stages::BadStages;
use crate::control::store::BadKey;

/// Why a key read from the store does not count.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Refused {
    // The key.
    #[error(transparent)]
    Key(#[from] BadKey),
    #[error("region `{region}` is not an index below {max}")]
    RegionIndex { region: usize, max: usize },
    #[error("node not 1 to 128 of letters, digits, ._-:@")]
    Node,
    #[error("vantage or CDN name not 1 to 128 of letters, digits, ._-:@")]
    ObservationNames,

    // The policy in force and the members (`scope.rs`).
    #[error("`{0}` is not a steered name of this policy")]
    NotHost(String),
    #[error("`{name}` has no CDN `{cdn}` in this policy")]
    NoCdn { name: String, cdn: String },
    #[error("`{name}` has {regions} regions in this policy, not {asked}")]
    Region {
        name: String,
        regions: usize,
        /// 1-based.
        asked: usize,
    },
    #[error("`{0}` is not a tenant of this policy")]
    NotTenant(String),
    #[error("`{0}` is not a CDN of this policy")]
    NotCdn(String),
    #[error("`{0}` is not probed under this policy")]
    NotProbed(String),
    #[error("`{who}` is not a member of the set (--members): its {what}")]
    NotMember { who: String, what: &'static str },
    #[error("usage of {0}: only this month's and last month's count")]
    UsageDay(String),

    // Any record.
    /// The value is not the record's JSON (serde's words).
    #[error("not a valid record: {0}")]
    Record(String),
    #[error("reason longer than {MAX_REASON} bytes")]
    Reason,
    #[error("CDN not 1 to 128 of letters, digits, ._-:@")]
    Cdn,
    #[error("more than {0} CDNs")]
    Cdns(usize),
    #[error("region name empty or too long")]
    RegionName,

    // Drains and audit entries.
    #[error("the rule's id is not its key")]
    DrainId,
    /// The drain does not resolve against the policy in force (its error's words).
    #[error("{0}")]
    Drain(String),
    #[error("more than {MAX_DRAINS} drains")]
    Drains,
    #[error("node not a sane name, or an entry over 16 KiB")]
    AuditEntry,
    #[error("an audit entry is a JSON object")]
    AuditObject,
    #[error("an entry under `{node}` says it is of node {says}: forged")]
    AuditForged {
        node: String,
        says: serde_json::Value,
    },
    #[error("an audit head's hash is not 64 lowercase hex digits")]
    HeadHash,

    // Usage records and commit biases (`usage.rs`).
    #[error("the day is not YYYY-MM-DD")]
    Day,
    #[error("a record starting at {start} is not of {day}")]
    NotOfDay { start: u64, day: String },
    #[error("records not in order of start")]
    RecordOrder,
    #[error("a record of {0} s (1 to 86400)")]
    Seconds(u32),
    #[error("a record of {0} bytes (0 to 1e18)")]
    Bytes(f64),
    #[error("{cdn}: {points} points (-100 to 100)")]
    Points { cdn: String, points: f64 },

    // Performance cells and shifts (`performance.rs`).
    #[error("slot {0} too late")]
    SlotLate(u64),
    #[error("more outcomes than samples")]
    Outcomes,
    #[error("{nets} networks for {samples} samples (at most {max})")]
    Networks {
        nets: usize,
        samples: u64,
        max: usize,
    },
    #[error("networks not in ascending order")]
    NetworkOrder,
    #[error("a histogram holds more than the samples")]
    HistogramSamples,
    #[error("a histogram's buckets are out of order or out of range")]
    HistogramBuckets,
    #[error("a window of {0} ms (100 to 86400000)")]
    Window(u64),
    #[error("{cdn}: more than {max} buckets")]
    Buckets { cdn: String, max: u64 },
    #[error("{0}: two buckets of one slot")]
    SlotTwice(String),
    /// A bucket of a CDN's cells.
    #[error("{cdn}: {why}")]
    Bucket { cdn: String, why: Box<Refused> },
    #[error("{cdn}: a share of {share} (0 to 100)")]
    Share { cdn: String, share: f64 },

    // The policy version in force (`policy.rs`).
    #[error("a policy over {0} bytes")]
    PolicySize(usize),
    #[error("version {version} is not its YAML's ({of_yaml}): forged")]
    Version { version: String, of_yaml: String },
    #[error("the history does not start with the version in force")]
    HistoryStart,
    #[error("more than {0} entries of history")]
    HistoryLength(usize),
    #[error(transparent)]
    Stages(#[from] BadStages),
    #[error("a rollout's two policies over {0} bytes")]
    RolloutSize(usize),
    #[error("a rollout's version before is not its YAML's: forged")]
    RolloutVersion,
    #[error("a rollout's version before is not the version it is based on: forged")]
    RolloutBase,
    #[error("activates {0} ms ahead of this node's clock (a writer puts it at most 5 s ahead): forged, or a clock is off")]
    ActivatesAhead(u64),
    #[error("a version in the history is not 12 hex digits")]
    HistoryVersion,
    #[error("a history entry with a field too long or unknown")]
    HistoryEntry,
}
