//! Control plane, the admin API's mutations: drains and undrains, freeze and resume, usage
//! records. Each request is read and checked here, handed to the controller as a
//! `Command` and answered with what it did (`api.rs` routes to them).

use crate::clock::{now_ms, unix_ms};
use crate::config::tokens::Token;
use crate::control::decide::drains::{DrainError, DrainRule};
use crate::control::decide::times::{MAX_TIME_MS, TOO_LATE};
use crate::control::http::{error, json_reply, text, Reply};
use crate::control::levers::command::{Command, Lever};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use tokio::sync::mpsc;

use super::ask::ask;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DrainRequest {
    /// A steered name, or (with `tenant`) empty.
    #[serde(default)]
    name: String,
    /// Every name of this tenant that has the CDN.
    tenant: Option<String>,
    cdn: String,
    /// The ticket of the change (required by tokens with `require_ticket`).
    ticket: Option<String>,
    #[serde(default, rename = "where")]
    scope: Vec<String>,
    reason: String,
    /// RFC 3339 time, e.g. 2026-12-01T12:00:00Z.
    until: Option<String>,
    /// Or a duration from now.
    ttl_seconds: Option<u64>,
    #[serde(default)]
    immediate: bool,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct ReasonRequest {
    #[serde(default)]
    reason: String,
    ticket: Option<String>,
    /// Only this tenant's names.
    tenant: Option<String>,
}

pub(super) async fn mutate(
    req: Request<Incoming>,
    commands: Option<&mpsc::Sender<Command>>,
    token: Arc<Token>,
    path: &str,
    body_timeout: std::time::Duration,
) -> Reply {
    let method = req.method().clone();
    let if_match = req
        .headers()
        .get(hyper::header::IF_MATCH)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let query = req.uri().query().unwrap_or("").to_string();
    let collect = Limited::new(req.into_body(), MAX_BODY).collect();
    let body = match tokio::time::timeout(body_timeout, collect).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(_)) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body over 64 KiB or unreadable",
            )
        }
        Err(_) => return error(StatusCode::REQUEST_TIMEOUT, "body not sent in time"),
    };
    let Some(commands) = commands else {
        return error(StatusCode::NOT_FOUND, "not available in this mode");
    };
    match (method, path) {
        (Method::POST, "/v1/drains") => {
            let r: DrainRequest = match serde_json::from_slice(&body) {
                Ok(r) => r,
                Err(e) => {
                    return error(StatusCode::BAD_REQUEST, &format!("bad drain request: {e}"))
                }
            };
            if r.reason.trim().is_empty() {
                return error(StatusCode::BAD_REQUEST, "a drain needs a reason");
            }
            if let Err(e) = token.ticket_ok(r.ticket.as_deref()) {
                return error(StatusCode::BAD_REQUEST, &e);
            }
            if r.name.trim().is_empty() == r.tenant.is_none() {
                return error(
                    StatusCode::BAD_REQUEST,
                    "give either `name` (a steered name) or `tenant` (every name of a tenant)",
                );
            }
            let until_unix_ms = match (&r.until, r.ttl_seconds) {
                (Some(u), _) => match humantime::parse_rfc3339_weak(u) {
                    Ok(t) if unix_ms(t) > MAX_TIME_MS => {
                        return error(StatusCode::BAD_REQUEST, &format!("until: {TOO_LATE}"))
                    }
                    Ok(t) => Some(unix_ms(t)),
                    Err(_) => {
                        return error(
                            StatusCode::BAD_REQUEST,
                            "until: not a time like 2026-12-01T12:00:00Z",
                        )
                    }
                },
                (None, Some(s)) => {
                    match s.checked_mul(1000).and_then(|ms| now_ms().checked_add(ms)) {
                        Some(until) if until <= MAX_TIME_MS => Some(until),
                        _ => {
                            return error(
                                StatusCode::BAD_REQUEST,
                                &format!("ttl_seconds: too large: the drain would end {TOO_LATE}"),
                            )
                        }
                    }
                }
                (None, None) => None,
            };
            let mut name = r.name.trim().to_ascii_lowercase();
            if !name.is_empty() && !name.ends_with('.') {
                name.push('.');
            }
            let rule = DrainRule {
                id: String::new(),
                name,
                cdn: r.cdn,
                scope: r.scope,
                reason: r.reason,
                until_unix_ms,
                immediate: r.immediate,
                written_by: None,
                written_at_unix_ms: None,
                tenant: r.tenant,
                author: Some(token.name.clone()),
                ticket: r.ticket,
            };
            let tenant = rule.tenant.clone().filter(|_| rule.name.is_empty());
            match ask(commands, |tx| Command::Drain {
                token,
                rule,
                reply: tx,
            })
            .await
            {
                Ok(Ok(rules)) => match tenant {
                    Some(t) => json_reply(
                        StatusCode::CREATED,
                        &json!({ "tenant": t, "drains": rules }),
                    ),
                    None => json_reply(StatusCode::CREATED, &rules.first()),
                },
                Ok(Err(e @ DrainError::Forbidden(_))) => {
                    error(StatusCode::FORBIDDEN, &e.to_string())
                }
                Ok(Err(e)) if e.is_conflict() => error(StatusCode::CONFLICT, &e.to_string()),
                Ok(Err(e @ (DrainError::Unavailable(_) | DrainError::NotAudited(_)))) => {
                    error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())
                }
                Ok(Err(e)) => error(StatusCode::BAD_REQUEST, &e.to_string()),
                Err(reply) => *reply,
            }
        }
        (Method::POST, "/v1/usage") => usage(commands, &token, &body).await,
        (Method::POST, p) if p.starts_with("/v1/policy") => {
            let asked = super::policy::Asked {
                path: p,
                query: &query,
                if_match: if_match.as_deref(),
                body: &body,
            };
            super::policy::mutate(commands, &token, asked).await
        }
        (Method::DELETE, p) if p.starts_with("/v1/drains/") => {
            let id = p.trim_start_matches("/v1/drains/").to_string();
            match ask(commands, |tx| Command::Undrain {
                token,
                id,
                reply: tx,
            })
            .await
            {
                Ok(Ok(rule)) => json_reply(StatusCode::OK, &rule),
                Ok(Err(e @ DrainError::Forbidden(_))) => {
                    error(StatusCode::FORBIDDEN, &e.to_string())
                }
                Ok(Err(e @ (DrainError::Unavailable(_) | DrainError::NotAudited(_)))) => {
                    error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())
                }
                Ok(Err(e)) => error(StatusCode::NOT_FOUND, &e.to_string()),
                Err(reply) => *reply,
            }
        }
        (Method::POST, "/v1/failover/freeze" | "/v1/failover/resume") => {
            let r: ReasonRequest = if body.is_empty() {
                ReasonRequest::default()
            } else {
                match serde_json::from_slice(&body) {
                    Ok(r) => r,
                    Err(e) => return error(StatusCode::BAD_REQUEST, &format!("bad request: {e}")),
                }
            };
            if r.reason.trim().is_empty() {
                return error(StatusCode::BAD_REQUEST, "say why: {\"reason\": \"...\"}");
            }
            if let Err(e) = token.ticket_ok(r.ticket.as_deref()) {
                return error(StatusCode::BAD_REQUEST, &e);
            }
            // A freeze holds every name's failover (or a tenant's): only a token that
            // may touch them all.
            let scope = match &r.tenant {
                Some(t) => token.may_touch_tenant(t),
                None => token.may_touch_everything(),
            };
            if let Err(lacks) = scope {
                return error(StatusCode::FORBIDDEN, &lacks);
            }
            let lever = Lever {
                author: match &r.ticket {
                    Some(t) => format!("{} (ticket {t})", token.name),
                    None => token.name.clone(),
                },
                reason: r.reason,
                tenant: r.tenant,
            };
            let freeze = path.ends_with("freeze");
            let tenant = lever.tenant.clone();
            let sent = ask(commands, |tx| {
                if freeze {
                    Command::Freeze { lever, reply: tx }
                } else {
                    Command::Resume { lever, reply: tx }
                }
            })
            .await;
            match sent {
                Ok(Ok(())) => match tenant {
                    Some(t) => json_reply(
                        StatusCode::OK,
                        &json!({ "tenant": t, "failover_frozen": freeze }),
                    ),
                    None => json_reply(StatusCode::OK, &json!({ "failover_frozen": freeze })),
                },
                Ok(Err(e @ (DrainError::Unavailable(_) | DrainError::NotAudited(_)))) => {
                    error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())
                }
                Ok(Err(e @ DrainError::NotFrozen(_))) => {
                    error(StatusCode::CONFLICT, &e.to_string())
                }
                Ok(Err(e)) => error(StatusCode::BAD_REQUEST, &e.to_string()),
                Err(reply) => *reply,
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// At most this many usage records in one `POST /v1/usage`.
pub(super) const MAX_USAGE_RECORDS: usize = 1000;

/// `POST /v1/usage`: one record or an array; each checked, then all handed to the
/// controller (none taken when one is wrong).
pub(super) async fn usage(commands: &mpsc::Sender<Command>, token: &Token, body: &[u8]) -> Reply {
    use crate::control::modifiers::commit::UsageIn;
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(UsageIn),
        Many(Vec<UsageIn>),
    }
    let records = match serde_json::from_slice::<serde_json::Value>(body)
        .map_err(|e| e.to_string())
        .and_then(|v| {
            if v.is_array() {
                serde_json::from_value::<Vec<UsageIn>>(v).map(OneOrMany::Many)
            } else {
                serde_json::from_value::<UsageIn>(v).map(OneOrMany::One)
            }
            .map_err(|e| e.to_string())
        }) {
        Ok(OneOrMany::One(r)) => vec![r],
        Ok(OneOrMany::Many(v)) => v,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("bad usage record: {e} (expected {{\"cdn\", \"start\", \"seconds\", \"bytes\" or \"mbps\"}}, or an array of them)"),
            )
        }
    };
    if records.is_empty() || records.len() > MAX_USAGE_RECORDS {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("1 to {MAX_USAGE_RECORDS} records, not {}", records.len()),
        );
    }
    let mut checked = Vec::with_capacity(records.len());
    for (i, r) in records.iter().enumerate() {
        match r.check() {
            Ok(c) => checked.push(c),
            Err(e) => return error(StatusCode::BAD_REQUEST, &format!("record {i}: {e}")),
        }
    }
    // A CDN is shared by every tenant: only a token that lists it (or is limited by
    // neither names nor tenants) reports for it.
    for (cdn, _, _) in &checked {
        if let Err(e) = token.may_report(cdn) {
            return error(StatusCode::FORBIDDEN, &e.to_string());
        }
    }
    use crate::control::levers::command::UsageRefused;
    match ask(commands, |tx| Command::Usage {
        records: checked,
        strict: true,
        author: token.name.clone(),
        reply: tx,
    })
    .await
    {
        Ok(Ok(taken)) => json_reply(StatusCode::OK, &taken),
        Ok(Err(e @ UsageRefused::Bad(_))) => error(StatusCode::BAD_REQUEST, &e.to_string()),
        Ok(Err(e @ (UsageRefused::Unavailable(_) | UsageRefused::NotAudited(_)))) => {
            error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())
        }
        Err(reply) => *reply,
    }
}

pub(super) const MAX_BODY: usize = 64 * 1024;
