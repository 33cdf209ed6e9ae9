//! Control plane: the admin API's commands to the controller (`api.rs` sends them,
//! `controller.rs` answers them on their oneshot), and the checks every command passes
//! before it changes anything, on a single node and in a set alike: a drain against
//! the token's scope and the drains in force ([`admit`]), an undrain against the
//! token ([`may_undrain`]). Also how the audit log records them.

use std::net::IpAddr;
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::config::tokens::Token;
use crate::config::Policy;
use crate::control::audit;
use crate::control::drains::{DrainError, DrainRule, Drains};
use crate::control::explain::{ExplainError, Explanation};

/// A request from the admin API, answered on its oneshot.
pub enum Command {
    /// A drain of a name, or of every name of a tenant, by the token: the rules made.
    Drain(
        Arc<Token>,
        DrainRule,
        oneshot::Sender<Result<Vec<DrainRule>, DrainError>>,
    ),
    Undrain(
        Arc<Token>,
        String,
        oneshot::Sender<Result<DrainRule, DrainError>>,
    ),
    /// Answered with why it could not be done (an unknown tenant; in a set: etcd
    /// unreachable).
    Freeze(Lever, oneshot::Sender<Result<(), DrainError>>),
    Resume(Lever, oneshot::Sender<Result<(), DrainError>>),
    /// Usage records (`POST /v1/usage`, or the `--usage-url` feed), checked; answered
    /// with what became of them. Strict (the API): none is taken when a CDN is
    /// unknown, and the answer says which; otherwise (the feed) those are skipped.
    Usage(
        Vec<(String, u64, crate::control::commit::ledger::Record)>,
        bool,
        oneshot::Sender<Result<UsageTaken, String>>,
    ),
    /// A page of the audit log: entries after this seq, at most this many.
    Audit(u64, usize, oneshot::Sender<Result<audit::Page, String>>),
    /// Name, client, and the resolver asking with ECS and its source prefix (`None`:
    /// the client itself, without ECS), and a content steering session key.
    Explain(
        String,
        IpAddr,
        Option<(IpAddr, u8)>,
        Option<u64>,
        oneshot::Sender<Result<Explanation, ExplainError>>,
    ),
}

/// What became of the usage records of a `POST /v1/usage`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct UsageTaken {
    pub added: u64,
    pub replaced: u64,
    pub unchanged: u64,
    /// Of a CDN no steered name has (the feed only).
    pub skipped: u64,
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

/// Checks a drain request against the token's scope and the drains in force, and
/// adds its rules (one per name of a tenant) to `drains`; all or none.
pub fn admit(
    drains: &mut Drains,
    policy: &Policy,
    token: &Token,
    rule: DrainRule,
    now_ms: u64,
) -> Result<Vec<DrainRule>, DrainError> {
    let rules = rule.expand(policy)?;
    let mut scratch = drains.clone();
    let mut out = Vec::new();
    for rule in rules {
        if let Ok((host, _)) = rule.resolve(policy) {
            token
                .may_touch(host, &rule.scope)
                .map_err(DrainError::Forbidden)?;
        }
        out.push(scratch.add(policy, rule, now_ms)?);
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
