//! Control plane: the admin API's commands to the controller (`api.rs` sends them,
//! `controller/commands.rs` answers them on their oneshot), and the checks every command passes
//! before it changes anything, on a single node and in a set alike: a drain against
//! the token's scope and the drains in force ([`admit`]), an undrain against the
//! token ([`may_undrain`]). Also how the audit log records them.

use std::net::IpAddr;
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::config::tokens::{Token, TokenError, Verb};
use crate::config::Policy;
use crate::control::decide::drains::{DrainError, DrainRule, Drains};
use crate::control::disk::audit;
use crate::control::levers::explain::{ExplainError, Explanation};

/// A request from the admin API, answered on its oneshot.
pub enum Command {
    /// A drain of a name, or of every name of a tenant, by the token: the rules made.
    Drain {
        token: Arc<Token>,
        rule: DrainRule,
        reply: oneshot::Sender<Result<Vec<DrainRule>, DrainError>>,
    },
    /// The removal of a drain override, by its id.
    Undrain {
        token: Arc<Token>,
        id: String,
        reply: oneshot::Sender<Result<DrainRule, DrainError>>,
    },
    /// Answered with why it could not be done (an unknown tenant; in a set: etcd
    /// unreachable).
    Freeze {
        lever: Lever,
        reply: oneshot::Sender<Result<(), DrainError>>,
    },
    Resume {
        lever: Lever,
        reply: oneshot::Sender<Result<(), DrainError>>,
    },
    /// Usage records (`POST /v1/usage`, or the `--usage-url` feed), checked; answered
    /// with what became of them. Strict (the API): none is taken when a CDN is
    /// unknown, and the answer says which; otherwise (the feed) those are skipped.
    Usage {
        records: Vec<UsageRecord>,
        strict: bool,
        /// Who sent them, as the audit log records it (the token, or the feed).
        author: String,
        reply: oneshot::Sender<Result<UsageTaken, UsageRefused>>,
    },
    /// A page of the audit log: entries after the seq `after`, at most `limit`.
    Audit {
        after: u64,
        limit: usize,
        reply: oneshot::Sender<Result<audit::Page, audit::PageError>>,
    },
    /// `GET /v1/policy`: the document (`state_doc::PolicyStatus`) as JSON.
    PolicyStatus {
        reply: oneshot::Sender<serde_json::Value>,
    },
    /// `POST /v1/policy`: a new version, based on the version in force `if_match`.
    PolicyApply {
        yaml: String,
        if_match: String,
        author: String,
        ticket: Option<String>,
        /// In stages (`?stages=…&stage_seconds=…`); `None`: at once.
        stages: Option<super::stages::Stages>,
        reply: oneshot::Sender<Result<Written, PolicyRefused>>,
    },
    /// `POST /v1/policy/halt`: the staged rollout in progress stops, every client back
    /// to the version before it.
    PolicyHalt {
        author: String,
        ticket: Option<String>,
        reply: oneshot::Sender<Result<Written, PolicyRefused>>,
    },
    /// `POST /v1/policy/rollback`: to `version`, or the one before the version in force.
    PolicyRollback {
        version: Option<String>,
        author: String,
        ticket: Option<String>,
        reply: oneshot::Sender<Result<Written, PolicyRefused>>,
    },
    /// Name, client, and the resolver asking with ECS and its source prefix (`None`:
    /// the client itself, without ECS), and a content steering session key.
    Explain {
        name: String,
        ip: IpAddr,
        resolver: Option<(IpAddr, u8)>,
        session: Option<u64>,
        reply: oneshot::Sender<Result<Explanation, ExplainError>>,
    },
}

/// A checked usage record: CDN, start (Unix ms), the record.
pub type UsageRecord = (
    String,
    u64,
    crate::control::modifiers::commit::ledger::Record,
);

/// What became of the usage records of a `POST /v1/usage`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct UsageTaken {
    pub added: u64,
    pub replaced: u64,
    pub unchanged: u64,
    /// Of a CDN no steered name has (the feed only).
    pub skipped: u64,
}

/// Why usage records were not taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UsageRefused {
    /// Wrong on its own (an unknown CDN, a start too far ahead): 400.
    #[error("{0}")]
    Bad(String),
    /// In a set: etcd cannot take them now (every node must keep the same ledger): 503.
    #[error("etcd unreachable, the set cannot take usage now: {0}")]
    Unavailable(String),
    /// The audit log cannot be written: no change is made unaudited (503).
    #[error("{0}")]
    NotAudited(String),
}

/// A freeze or resume: why, who, and of which tenant's names (`None`: every name).
#[derive(Clone, Debug)]
pub struct Lever {
    pub reason: String,
    /// The token's name, with the ticket if one was given.
    pub author: String,
    pub tenant: Option<String>,
}

impl Lever {
    /// As the audit log records it.
    pub fn fields(&self) -> serde_json::Value {
        serde_json::json!({ "reason": self.reason, "author": self.author, "tenant": self.tenant })
    }
}

/// What a drain request makes: the rules (one per name of a tenant) and the
/// overrides in force they replace (same name, CDN and scope).
#[derive(Debug, Default)]
pub struct Admitted {
    pub rules: Vec<DrainRule>,
    pub replaced: Vec<DrainRule>,
}

/// Checks a drain request against the token's scope and the drains in force, and
/// adds its rules (one per name of a tenant) to `drains`; all or none. A rule that
/// would end another author's override of the same name, CDN and scope sooner needs
/// the token's `undrain` verb too (a later `until` only extends it).
pub fn admit(
    drains: &mut Drains,
    policy: &Policy,
    token: &Token,
    rule: DrainRule,
    now_ms: u64,
) -> Result<Admitted, DrainError> {
    let rules = rule.expand(policy)?;
    let mut scratch = drains.clone();
    let mut out = Admitted::default();
    for rule in rules {
        if let Ok((host, _)) = rule.resolve(policy) {
            token
                .may_touch(host, &rule.scope)
                .map_err(DrainError::Forbidden)?;
        }
        let before = scratch
            .overrides
            .iter()
            .find(|o| o.key() == rule.key() && !o.expired(now_ms))
            .cloned();
        let made = scratch.add(policy, rule, now_ms)?;
        if let Some(old) = before {
            let others = old.author.as_deref() != Some(token.name.as_str());
            let sooner = made.until_unix_ms < old.until_unix_ms;
            if others && sooner && token.may(Verb::Undrain).is_err() {
                return Err(DrainError::Forbidden(TokenError::EndsAnothers {
                    token: token.name.clone(),
                    id: old.id.clone(),
                    author: old.author.clone().unwrap_or_else(|| "the policy".into()),
                }));
            }
            out.replaced.push(old);
        }
        out.rules.push(made);
    }
    *drains = scratch;
    Ok(out)
}

/// Whether `token` may end the override `rule`.
pub fn may_undrain(policy: &Policy, token: &Token, rule: &DrainRule) -> Result<(), DrainError> {
    match rule.resolve(policy) {
        Ok((host, _)) => token
            .may_touch(host, &rule.scope)
            .map_err(DrainError::Forbidden),
        // A name gone from the policy: only a token unlimited by name may end it.
        Err(_) => token.may_touch_everything().map_err(DrainError::Forbidden),
    }
}

/// A drain as the audit log records it.
pub fn audit_rule(r: &DrainRule) -> serde_json::Value {
    serde_json::json!({
        "id": r.id, "name": r.name, "cdn": r.cdn, "where": r.scope, "reason": r.reason,
        "until_unix_ms": r.until_unix_ms, "immediate": r.immediate, "tenant": r.tenant,
        "author": r.author, "ticket": r.ticket,
    })
}

pub fn undrain_fields(r: &DrainRule, token: &Token) -> serde_json::Value {
    serde_json::json!({ "id": r.id, "name": r.name, "cdn": r.cdn, "author": token.name })
}

/// Usage records as the controller takes them: none starting more than a day ahead
/// (they would only take the place of real ones: the ledger keeps a bounded number)
/// or before last month, and none of a CDN no steered name has. Strict (the API): either is an error that
/// refuses them all; otherwise (the feed) those are left out and counted.
pub fn admit_usage(
    policy: &crate::config::Policy,
    records: Vec<UsageRecord>,
    strict: bool,
    now_ms: u64,
) -> Result<(Vec<UsageRecord>, u64), String> {
    let latest = now_ms + 86_400_000;
    // This month's and last month's usage count (the ledger keeps no more).
    let earliest = crate::control::modifiers::commit::month::Month::last_start(now_ms);
    let known = |cdn: &str| policy.has_cdn(cdn);
    if strict {
        if let Some((_, start, _)) = records.iter().find(|r| r.1 > latest) {
            let at = crate::control::decide::times::rfc3339(*start);
            return Err(format!("start {at} is more than a day ahead"));
        }
        if let Some((_, start, _)) = records.iter().find(|r| r.1 < earliest) {
            let at = crate::control::decide::times::rfc3339(*start);
            return Err(format!(
                "start {at} is before last month: only this month's and last month's usage counts"
            ));
        }
        if let Some((cdn, _, _)) = records.iter().find(|r| !known(&r.0)) {
            return Err(format!("unknown CDN `{cdn}`"));
        }
    }
    let total = records.len();
    let kept: Vec<UsageRecord> = records
        .into_iter()
        .filter(|r| (earliest..=latest).contains(&r.1) && known(&r.0))
        .collect();
    let skipped = (total - kept.len()) as u64;
    Ok((kept, skipped))
}

/// What became of a proposal.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Written {
    pub version: String,
    /// When every node serves it (Unix ms).
    pub activate_at_unix_ms: u64,
    /// The set held this version already: nothing was written.
    pub unchanged: bool,
}

/// Why a proposal was not written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyRefused {
    /// The set's version is not the one it was based on (`412`).
    #[error("the version in force is {in_force}, not {based_on}: read it again (GET /v1/policy) and base the change on it")]
    Stale { in_force: String, based_on: String },
    /// Wrong on its own (`400`): too large, no such version.
    #[error("{0}")]
    Bad(String),
    /// It does not load with this node's inputs (`400`): every error, `file:line: field`.
    #[error("the policy does not load: {}", .0.join("; "))]
    Invalid(Vec<String>),
    /// The store cannot take it now (`503`).
    #[error("the set's store cannot take a policy now: {0}")]
    Unavailable(String),
    /// The audit log cannot be written (`503`).
    #[error("{0}")]
    NotAudited(String),
    /// Not now (`409`): a staged rollout is in progress, or none is to halt.
    #[error("{0}")]
    Conflict(String),
}
