//! Control plane: the document `GET /v1/state` serves, typed. The controller fills it
//! after every change (once the change is saved), and the API serialises the latest.

use std::collections::BTreeMap;

use serde::Serialize;

use tokio::time::Instant;

use crate::clock::now_ms;
use crate::control::cluster::node::ClusterLink;
use crate::control::cluster::Freeze;
use crate::control::decide::drains::DrainStatus;
use crate::control::decide::health::{self, VantageView};
use crate::control::decide::keys::{NameCdn, NameRegion};
use crate::control::decide::state::ControlState;
use crate::control::decide::stepper::Direction;
use crate::inputs::Loaded;

/// Everything an operator asks "what is it doing now?" about.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StateDoc {
    /// Short hash of the input files being served.
    pub config_version: String,
    /// The policy version in force: the first 12 hex digits of the SHA-256 of its
    /// YAML, as dnstap's steering decisions name it.
    pub policy_version: String,
    /// The policy versions on this node: its file's, one refused or pending.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyDoc>,
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
    /// The audit log (with a state directory): its head, and why it cannot be
    /// written, if it cannot (mutations get 503 then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditDoc>,
    /// Signing (a `dnssec:` block): the keys and their phases, the signatures' expiry;
    /// absent when nothing is signed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dnssec: Option<crate::dnssec::Status>,
    /// Regions whose weights follow measured performance (`performance:`): the
    /// measured values, the band, the shares and the reason per CDN.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub performance: Vec<crate::control::modifiers::perf::RegionView>,
    /// CDNs with a contract or a capacity (`contract:`, `capacity_mbps:`): month to
    /// date, projection, burst budget left, the bias in force and its reason.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub commit: Vec<crate::control::modifiers::commit::CdnView>,
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
    /// Per member: the head of its audit log as it published it in the set's store
    /// (`SEQ:HASH`, and when), to check a copy of that node's log against
    /// (`steerdns audit verify --expect-head`).
    pub audit_heads: BTreeMap<String, AuditHeadDoc>,
}

/// A member's audit head, as the set's store holds it.
#[derive(Clone, Debug, Serialize)]
pub struct AuditHeadDoc {
    /// `SEQ:HASH` of the last entry of its log.
    pub head: String,
    /// When it published it (Unix ms).
    pub at_unix_ms: u64,
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

/// What the controller notes as it goes, besides the control state: shown in the
/// document, and logged when it changes.
#[derive(Debug, Default)]
pub(crate) struct Noted {
    /// (name, region) pairs failing open.
    pub fail_open: Vec<NameRegion>,
    /// Why this vantage point is unhappy, if it is.
    pub own_unhappy: Option<String>,
    /// The last round's verdict per CDN, with its evidence.
    pub verdicts: BTreeMap<String, String>,
    /// Round verdicts per CDN since start: what hysteresis was fed, which the last
    /// verdict alone cannot tell.
    pub verdict_counts: BTreeMap<String, VerdictCounts>,
    /// The percentage of each (name, CDN)'s current failover step and when the step was
    /// taken: the server's own account of the timeline.
    pub stepped: BTreeMap<NameCdn, (u8, Instant)>,
    /// The outcome of the last reload.
    pub last_reload: Option<ReloadOutcome>,
}

/// The audit log in `/v1/state`, read when the document is shown (the head moves
/// with every entry, the document does not): `head`, `SEQ:HASH` of the last entry
/// written (`steerdns audit verify --expect-head` checks a copy of the log against
/// it; `null`: the log could not be opened), and `failing`, why the log cannot be
/// written now (mutations are refused meanwhile).
#[derive(Clone)]
pub struct AuditDoc(pub Option<crate::control::disk::audit::Watch>);

impl std::fmt::Debug for AuditDoc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuditDoc")
    }
}

impl Serialize for AuditDoc {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let (head, failing) = match &self.0 {
            Some(a) => {
                let (seq, hash) = a.head();
                (Some(format!("{seq}:{hash}")), a.failing())
            }
            None => (
                None,
                Some("it could not be opened at start (see the log)".into()),
            ),
        };
        let mut st = s.serialize_struct("AuditDoc", 2)?;
        st.serialize_field("head", &head)?;
        st.serialize_field("failing", &failing)?;
        st.end()
    }
}

/// Everything the document is assembled from.
pub(crate) struct Parts<'a> {
    pub loaded: &'a Loaded,
    pub state: &'a ControlState,
    /// This vantage point's name.
    pub vantage: &'a str,
    pub noted: &'a Noted,
    /// In a set: the link to it.
    pub cluster: Option<&'a ClusterLink>,
    /// The other vantage points now.
    pub peers: &'a [VantageView],
    /// The regions whose weights follow measured performance.
    pub performance: Vec<crate::control::modifiers::perf::RegionView>,
    /// The CDNs with a contract or a capacity.
    pub commit: Vec<crate::control::modifiers::commit::CdnView>,
    pub audit: Option<AuditDoc>,
}

impl Parts<'_> {
    /// The document for these parts.
    pub(crate) fn assemble(&self) -> StateDoc {
        let (loaded, noted) = (self.loaded, self.noted);
        let f = &self.state.failover;
        StateDoc {
            dnssec: (loaded.dnssec.as_ref()).map(|d| d.status(crate::clock::now_secs())),
            performance: self.performance.clone(),
            commit: self.commit.clone(),
            config_version: loaded.version.clone(),
            policy_version: loaded.policy.version.clone(),
            policy: None,
            failover_frozen: f.frozen.clone(),
            failover_frozen_tenants: f.frozen_tenants.clone(),
            tenants: loaded.policy.tenants(),
            drains: self.state.drains.report(&loaded.policy, now_ms()),
            last_reload: noted.last_reload.clone(),
            vantage: self.vantage.to_string(),
            vantage_unhappy: noted.own_unhappy.clone(),
            // Filled in by the saver, which knows how the save went.
            state_save: None,
            health: f
                .health
                .iter()
                .map(|(cdn, t)| {
                    let h = HealthDoc {
                        state: t.state.to_string(),
                        consecutive_down_rounds: t.bad,
                        consecutive_up_rounds: t.good,
                        last_verdict: noted.verdicts.get(cdn).cloned(),
                        verdicts: noted.verdict_counts.get(cdn).copied(),
                    };
                    (cdn.clone(), h)
                })
                .collect(),
            failover: self
                .state
                .removed(loaded)
                .into_iter()
                .map(|(key, pct)| StepDoc {
                    direction: f.steps.get(&key).map(|s| s.direction),
                    since_unix_ms: noted.stepped.get(&key).map(|&(_, at)| {
                        let ago = Instant::now().saturating_duration_since(at);
                        now_ms().saturating_sub(ago.as_millis() as u64)
                    }),
                    name: key.name,
                    cdn: key.cdn,
                    removed_percent: pct,
                })
                .collect(),
            fail_open: noted
                .fail_open
                .iter()
                .map(|k| FailOpenDoc {
                    name: k.name.clone(),
                    region: k.region.clone(),
                })
                .collect(),
            cluster: self.cluster.map(cluster_doc),
            audit: self.audit.clone(),
            peers: self
                .peers
                .iter()
                .map(|v| PeerDoc {
                    name: v.name.clone(),
                    error: v.error.clone(),
                    unhappy: health::unhappy(v).map(|u| u.to_string()),
                })
                .collect(),
        }
    }
}

/// A node of a set, for `/v1/state`.
pub(crate) fn cluster_doc(c: &ClusterLink) -> ClusterDoc {
    let shared = c.latest();
    let view = shared.map(|s| s.view.clone()).unwrap_or_default();
    let link = shared.map(|s| s.link.clone());
    ClusterDoc {
        node: c.node.clone(),
        prefix: c.prefix.clone(),
        connected: link.as_ref().is_some_and(|l| l.connected),
        fail_static: !link.as_ref().is_some_and(|l| l.connected),
        since_unix_ms: link.as_ref().map(|l| l.since_unix_ms),
        error: link.as_ref().and_then(|l| l.error.clone()),
        endpoint: link.map(|l| l.endpoint).unwrap_or_default(),
        vantages: view.observations.keys().cloned().collect(),
        timelines: view
            .timelines
            .iter()
            .map(|(key, (t, _))| TimelineDoc {
                name: key.name.clone(),
                cdn: key.cdn.clone(),
                direction: t.direction,
                from_level: t.from_level,
                start_unix_ms: t.start_unix_ms,
                written_by: t.node.clone(),
                reason: t.reason.clone(),
            })
            .collect(),
        drains: view
            .drains
            .values()
            .map(|d| ClusterDrainDoc {
                id: d.rule.id.clone(),
                written_by: d.node.clone(),
                written_at_unix_ms: d.at_unix_ms,
                reason: d.rule.reason.clone(),
            })
            .collect(),
        freeze: view.freeze.clone(),
        refused_keys: c.refused(),
        last_refused: view.last_refused.clone(),
        audit_heads: view
            .heads
            .iter()
            .map(|(node, h)| {
                let doc = AuditHeadDoc {
                    head: h.shown(),
                    at_unix_ms: h.at_unix_ms,
                };
                (node.clone(), doc)
            })
            .collect(),
        members: {
            let mut m: Vec<String> = c.members.clone();
            m.sort();
            m
        },
        clock_skew_ms: c.store.skew_ms(),
    }
}

/// The policy of `/v1/state` and `GET /v1/policy`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PolicyDoc {
    /// The version in force here: the first 12 hex digits of the SHA-256 of its YAML.
    pub version: String,
    /// The version of this node's policy file, and whether it differs from the one in
    /// force (an edit not taken, or a node started with an old file).
    pub file_version: Option<String>,
    pub file_differs: bool,
    /// Why the file's latest edit is not in force, when it is not.
    pub file_error: Option<String>,
    /// The set's version this node cannot load (it keeps the last good one), and why.
    pub refused: Option<RefusedDoc>,
    /// A version every node serves from `activate_at_unix_ms`.
    pub pending: Option<PendingDoc>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RefusedDoc {
    pub version: String,
    pub errors: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PendingDoc {
    pub version: String,
    pub activate_at_unix_ms: u64,
}

/// `GET /v1/policy`.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct PolicyStatus {
    pub version: String,
    /// The YAML of the version in force (for `steerdns policy diff`, or to put it back
    /// into the files).
    pub yaml: String,
    /// The set's applications, newest first (the version in force first).
    pub history: Vec<crate::control::cluster::policy::Applied>,
    /// A staged rollout in progress (`null`: none).
    pub rollout: Option<serde_json::Value>,
    /// This node: its file, a refused or pending version.
    pub node: PolicyDoc,
}
