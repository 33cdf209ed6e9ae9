//! Control plane: the document `GET /v1/state` serves, typed. The controller fills it
//! after every change (once the change is saved), and the API serialises the latest.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::control::cluster::Freeze;
use crate::control::drains::DrainStatus;
use crate::control::stepper::Direction;

/// Everything an operator asks "what is it doing now?" about.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StateDoc {
    /// Short hash of the input files being served.
    pub config_version: String,
    /// Why automatic failover is frozen, if it is.
    pub failover_frozen: Option<String>,
    /// Tenants whose failover is frozen, with why (their names take no step).
    pub failover_frozen_tenants: BTreeMap<String, String>,
    /// The steered names of each tenant (`tenant:` in the policy).
    pub tenants: BTreeMap<String, Vec<String>>,
    pub drains: Vec<DrainStatus>,
    /// The outcome of the last reload (none yet: `null`).
    pub last_reload: Option<ReloadOutcome>,
    /// This vantage point's name.
    pub vantage: String,
    /// Why this vantage point is unhappy (its failures do not count), if it is.
    pub vantage_unhappy: Option<String>,
    /// Where the state is saved and whether saving works; `null` without a state dir.
    pub state_save: Option<SaveStatus>,
    /// Per probed CDN.
    pub health: BTreeMap<String, HealthDoc>,
    /// Every (name, CDN) off its weight by failover.
    pub failover: Vec<StepDoc>,
    /// (name, region) pairs failing open.
    pub fail_open: Vec<FailOpenDoc>,
    pub peers: Vec<PeerDoc>,
    /// In a set (`--etcd`): the link to etcd and what the set shares; absent for a
    /// single node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterDoc>,
    /// Signing (a `dnssec:` block): the keys and their phases, the signatures' expiry;
    /// absent when nothing is signed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dnssec: Option<crate::dnssec::Status>,
    /// Regions whose weights follow measured performance (`performance:`): the
    /// measured values, the band, the shares and the reason per CDN.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub performance: Vec<crate::control::perf::RegionView>,
}

/// A node of a set: is it in touch, and who wrote what.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterDoc {
    pub node: String,
    pub prefix: String,
    /// In touch with etcd (a quorum answers).
    pub connected: bool,
    /// Serving the last shared state, starting no demotion (etcd unreachable).
    pub fail_static: bool,
    /// Since when connected or not (Unix ms).
    pub since_unix_ms: Option<u64>,
    /// Why not connected.
    pub error: Option<String>,
    /// The member watched (and checked for liveness) now.
    pub endpoint: String,
    /// The set's members (`--members`): the only vantage points that count.
    pub members: Vec<String>,
    /// This node's clock against etcd's, ms (positive: etcd is ahead); `null` until
    /// etcd has answered.
    pub clock_skew_ms: Option<i64>,
    /// Vantage points with observations in etcd.
    pub vantages: Vec<String>,
    pub timelines: Vec<TimelineDoc>,
    pub drains: Vec<ClusterDrainDoc>,
    pub freeze: Option<Freeze>,
    /// Keys under the prefix refused (form, writer, size or count; drains over the
    /// location-scope cap): they do not count.
    pub refused_keys: u64,
    pub last_refused: Option<String>,
}

/// A shared failover timeline and who started it.
#[derive(Clone, Debug, Serialize)]
pub struct TimelineDoc {
    pub name: String,
    pub cdn: String,
    pub direction: Direction,
    pub from_level: usize,
    pub start_unix_ms: u64,
    pub written_by: String,
    pub reason: String,
}

/// A drain override of the set: who wrote it, when, why.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterDrainDoc {
    pub id: String,
    pub written_by: String,
    pub written_at_unix_ms: u64,
    pub reason: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReloadOutcome {
    /// `file change` or `SIGHUP`.
    pub trigger: String,
    /// `applied` or `refused`.
    pub result: &'static str,
    /// `file:line: field: message` for each error of a refused reload.
    pub errors: Vec<String>,
    /// The version serving after it (the last good one when refused).
    pub serving_version: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct SaveStatus {
    pub dir: String,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_saves: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct HealthDoc {
    /// `up` or `down`.
    pub state: String,
    pub consecutive_down_rounds: u32,
    pub consecutive_up_rounds: u32,
    /// The last round's verdict with its evidence.
    pub last_verdict: Option<String>,
    /// Round verdicts since start: what hysteresis was fed.
    pub verdicts: Option<VerdictCounts>,
}

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct VerdictCounts {
    pub down: u64,
    pub up: u64,
    pub unknown: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct StepDoc {
    pub name: String,
    pub cdn: String,
    /// Percent of the CDN's share moved away.
    pub removed_percent: u8,
    /// When this step was taken (the server's clock, Unix milliseconds).
    pub since_unix_ms: Option<u64>,
    /// `demote` (being taken out) or `promote` (coming back).
    pub direction: Option<Direction>,
}

#[derive(Clone, Debug, Serialize)]
pub struct FailOpenDoc {
    pub name: String,
    pub region: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct PeerDoc {
    pub name: String,
    /// Why the last reading failed, if it did.
    pub error: Option<String>,
    pub unhappy: Option<String>,
}
