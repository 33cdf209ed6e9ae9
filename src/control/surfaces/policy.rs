//! Control plane, the admin API's policy versions: `GET /v1/policy` (the version in
//! force, the set's history, a rollout), `POST /v1/policy` (a new version: the body is
//! the policy's YAML, `If-Match: "<version in force>"` required), `POST
//! /v1/policy/rollback` (`{"version": …}`, default the one before the version in force)
//! and `POST /v1/policy/halt` (a staged rollout: back to the version before it). A new
//! version rolls out in stages with `?stages=5,25,100&stage_seconds=300`. The controller checks and writes them
//! (`controller/policy.rs`).

use hyper::StatusCode;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

use super::ask::ask;
use crate::clock::rfc3339;
use crate::config::tokens::Token;
use crate::control::cluster::policy::Stages;
use crate::control::http::{error, json_reply, Reply};
use crate::control::levers::command::{Command, PolicyRefused, Written};
use crate::control::levers::stages::BadStages;

/// `GET /v1/policy`.
pub(super) async fn status(commands: Option<&mpsc::Sender<Command>>) -> Reply {
    let Some(commands) = commands else {
        return error(StatusCode::NOT_FOUND, "not available in this mode");
    };
    match ask(commands, |reply| Command::PolicyStatus { reply }).await {
        Ok(doc) => json_reply(StatusCode::OK, &doc),
        Err(reply) => *reply,
    }
}

/// A policy mutation as asked.
pub(super) struct Asked<'a> {
    pub path: &'a str,
    pub query: &'a str,
    pub if_match: Option<&'a str>,
    pub body: &'a [u8],
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RollbackRequest {
    version: Option<String>,
    ticket: Option<String>,
}

/// `POST /v1/policy`, `/rollback`, `/halt`, for a token with the `policy` verb.
pub(super) async fn mutate(
    commands: &mpsc::Sender<Command>,
    token: &Token,
    asked: Asked<'_>,
) -> Reply {
    // The whole policy of every name: only a token limited by nothing.
    if let Err(lacks) = token.may_touch_everything() {
        return error(StatusCode::FORBIDDEN, &lacks);
    }
    let param = |name: &str| {
        asked.query.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == name).then(|| decode(v))
        })
    };
    match asked.path {
        "/v1/policy" => {
            let stages = match stages_of(param("stages"), param("stage_seconds")) {
                Ok(s) => s,
                Err(why) => return error(StatusCode::BAD_REQUEST, &why.to_string()),
            };
            if asked.body.iter().all(u8::is_ascii_whitespace) {
                return error(
                    StatusCode::BAD_REQUEST,
                    "the body is the policy's YAML: empty",
                );
            }
            let Some(if_match) = asked.if_match.map(entity_tag) else {
                return error(
                    StatusCode::PRECONDITION_FAILED,
                    "If-Match: \"<version>\" is required: the version in force this change is based on (GET /v1/policy)",
                );
            };
            if !crate::config::is_version(&if_match) {
                return error(
                    StatusCode::BAD_REQUEST,
                    "If-Match: not a policy version (\"<12 hex digits>\", as GET /v1/policy names it)",
                );
            }
            let ticket = param("ticket");
            if let Err(e) = token.ticket_ok(ticket.as_deref()) {
                return error(StatusCode::BAD_REQUEST, &e);
            }
            let Ok(yaml) = std::str::from_utf8(asked.body) else {
                return error(
                    StatusCode::BAD_REQUEST,
                    "the body is the policy's YAML, in UTF-8",
                );
            };
            let sent = ask(commands, |reply| Command::PolicyApply {
                yaml: yaml.to_string(),
                if_match,
                author: token.name.clone(),
                ticket,
                stages,
                reply,
            })
            .await;
            answer(sent)
        }
        "/v1/policy/rollback" => {
            let r: RollbackRequest = if asked.body.is_empty() {
                RollbackRequest::default()
            } else {
                match serde_json::from_slice(asked.body) {
                    Ok(r) => r,
                    Err(e) => return error(StatusCode::BAD_REQUEST, &format!("bad request: {e}")),
                }
            };
            if let Err(e) = token.ticket_ok(r.ticket.as_deref()) {
                return error(StatusCode::BAD_REQUEST, &e);
            }
            let sent = ask(commands, |reply| Command::PolicyRollback {
                version: r.version,
                author: token.name.clone(),
                ticket: r.ticket,
                reply,
            })
            .await;
            answer(sent)
        }
        "/v1/policy/halt" => {
            let r: RollbackRequest = if asked.body.iter().all(u8::is_ascii_whitespace) {
                RollbackRequest::default()
            } else {
                match serde_json::from_slice(asked.body) {
                    Ok(r) => r,
                    Err(e) => return error(StatusCode::BAD_REQUEST, &format!("bad request: {e}")),
                }
            };
            if r.version.is_some() {
                return error(
                    StatusCode::BAD_REQUEST,
                    "a halt takes no version: the rollout in progress goes back to the version before it",
                );
            }
            if let Err(e) = token.ticket_ok(r.ticket.as_deref()) {
                return error(StatusCode::BAD_REQUEST, &e);
            }
            let sent = ask(commands, |reply| Command::PolicyHalt {
                author: token.name.clone(),
                ticket: r.ticket,
                reply,
            })
            .await;
            answer(sent)
        }
        _ => error(StatusCode::NOT_FOUND, "not found"),
    }
}

/// `?stages=5,25,100&stage_seconds=300`: both or neither (`None`: at once).
fn stages_of(stages: Option<String>, seconds: Option<String>) -> Result<Option<Stages>, BadStages> {
    let (stages, seconds) = match (stages, seconds) {
        (None, None) => return Ok(None),
        (Some(s), Some(t)) => (s, t),
        _ => return Err(BadStages::Alone),
    };
    let stages = stages
        .split(',')
        .map(|p| p.trim().parse::<u8>())
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|_| BadStages::NotPercents(stages.clone()))?;
    let stage_seconds = seconds
        .trim()
        .parse::<u32>()
        .map_err(|_| BadStages::NotSeconds(seconds.clone()))?;
    let s = Stages {
        stages,
        stage_seconds,
    };
    s.check()?;
    Ok(Some(s))
}

/// A query value, percent-decoded (`+` is a space); a bad escape is kept as it is.
fn decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `"abc"`, `W/"abc"` or `abc` → `abc`.
fn entity_tag(v: &str) -> String {
    let v = v.trim();
    let v = v.strip_prefix("W/").unwrap_or(v);
    v.trim_matches('"').to_string()
}

fn answer(sent: Result<Result<Written, PolicyRefused>, Box<Reply>>) -> Reply {
    match sent {
        Ok(Ok(w)) => json_reply(
            StatusCode::ACCEPTED,
            &json!({
                "version": w.version,
                "activate_at_unix_ms": w.activate_at_unix_ms,
                "activate_at": rfc3339(w.activate_at_unix_ms),
                "unchanged": w.unchanged,
            }),
        ),
        Ok(Err(e @ PolicyRefused::Stale { .. })) => {
            error(StatusCode::PRECONDITION_FAILED, &e.to_string())
        }
        Ok(Err(PolicyRefused::Invalid(errors))) => json_reply(
            StatusCode::BAD_REQUEST,
            &json!({ "error": "the policy does not load on this node", "errors": errors }),
        ),
        Ok(Err(e @ PolicyRefused::Bad(_))) => error(StatusCode::BAD_REQUEST, &e.to_string()),
        Ok(Err(e @ PolicyRefused::Conflict(_))) => error(StatusCode::CONFLICT, &e.to_string()),
        Ok(Err(e @ (PolicyRefused::Unavailable(_) | PolicyRefused::NotAudited(_)))) => {
            error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())
        }
        Err(reply) => *reply,
    }
}
