//! Control plane: the HTTP API on `--api` (loopback by default).
//!
//! Read-only, open: `/` (the status page, HTML: [`crate::control::surfaces::status`]), `/healthz`, `/metrics` (Prometheus text format), `/v1/observations` (this vantage point's latest probe
//! results, read by peers), `/v1/state` (the whole live state), `/v1/explain?name=&client=[&resolver=&source=&session=]`.
//! Mutating, with `Authorization: Bearer <token>`: `POST /v1/drains`,
//! `DELETE /v1/drains/{id}`, `POST /v1/failover/freeze`, `POST /v1/failover/resume`,
//! `POST /v1/usage` (usage records for commit steering: one object or an array of up to
//! 1,000, `{"cdn","start","seconds","bytes"|"mbps"}`, idempotent per (CDN, start)).
//! Without a configured token every mutation is refused. A token is the one of
//! `--api-token-file` (every right) or one of `--api-tokens` (scoped: its verbs are
//! checked here, the names, tenants and regions it may touch by the controller, with the
//! policy); a request outside its scope gets `403` saying what it lacks.
//! `GET /v1/audit?after=SEQ&limit=N` pages the audit log (`STATE_DIR/audit.jsonl`): open
//! to the sources of `--api-audit-open` (loopback by default), from anywhere else with a
//! token of the verb `audit` (`401` without one, `403` for a token without the verb).
//! Drains (`"tenant"` instead of `"name"`) and freezes (`"tenant"`) may target a tenant;
//! mutations may carry `"ticket"`.
//!
//! Limits ([`ApiLimits`], kept by the accept loop of [`crate::control::http`]), so that
//! no client can hold the server's resources: the request line and headers at most
//! 64 KiB (`431` beyond) and complete within 10 s, bodies at most 64 KiB (`413`) and
//! complete within 10 s, a connection idle between requests is closed after the same
//! 10 s, and at most 256 connections at once, 32 from one source (one /24 or /56:
//! [`crate::slots`]; further ones are closed at once). A slow-loris client sending a
//! header a byte a second is cut off. When every connection is taken, a few more (4) are
//! kept for loopback sources, for mutations only: each serves one request within 2 s,
//! and a read gets 503, so that an operator on the host can still drain a CDN while the
//! API is flooded.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{header, Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::ask::ask;
use super::mutations::mutate;
use crate::clock::now_ms;
use crate::config::tokens::{Token, Tokens, Verb};
use crate::control::http::{error, json_reply, path_matches, serve_http, text, Conn, Reply};
use crate::control::levers::command::Command;
use crate::control::levers::explain::ExplainError;
use crate::control::state_doc::StateDoc;
use crate::control::surfaces::status::{self, StatusSource};
use crate::control::tasks::peers::Published;
use crate::control::tasks::prober::Local;
use crate::metrics::{self, Metrics};

/// The limits of the API's accept loop (`control::http`), where callers have always
/// found them.
pub use crate::control::http::ApiLimits;

/// What the API serves, shared with the tasks that produce it.
#[derive(Clone)]
pub struct ApiState {
    pub vantage: String,
    pub local: Local,
    /// The controller's latest state document (`serve` only).
    pub state: Arc<Mutex<Option<StateDoc>>>,
    /// The controller, for mutations and live explain (`serve` only).
    pub commands: Option<mpsc::Sender<Command>>,
    /// Bearer token for mutations with every right (`--api-token-file`).
    pub token: Option<String>,
    /// The scoped tokens of `--api-tokens`, swapped in by the controller on reload.
    pub tokens: ScopedTokens,
    /// What `/metrics` serves.
    pub metrics: Metrics,
    /// The plan being served and the history of its shares, for the status page
    /// (`serve` only).
    pub status: Option<StatusSource>,
}

/// Binds `addr` and serves until `stop` with the default [`ApiLimits`]; returns the
/// bound address.
pub async fn spawn(
    addr: SocketAddr,
    state: ApiState,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    spawn_with(addr, state, ApiLimits::default(), stop).await
}

/// As [`spawn`], with other limits (tests shorten the timeouts).
pub async fn spawn_with(
    addr: SocketAddr,
    state: ApiState,
    limits: ApiLimits,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let body_timeout = limits.body_timeout;
    let hosts = Arc::new(limits.hosts.clone());
    let audit_open = Arc::new(limits.audit_open.clone());
    serve_http(
        listener,
        limits,
        stop,
        move |req: Request<Incoming>, conn: Conn| {
            let (state, hosts, audit_open) = (state.clone(), hosts.clone(), audit_open.clone());
            async move {
                if let Some(refusal) = misdirected(&req, bound, &hosts) {
                    return Ok(refusal);
                }
                if conn.reserved && req.method() == Method::GET {
                    return Ok(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the API is at its connection limit: this connection, kept for loopback mutations, serves no reads",
                ));
                }
                // Whether this source reads the audit log without a token.
                let ip = conn.peer.ip().to_canonical();
                let open = audit_open.iter().any(|n| n.contains(&ip));
                route(req, state, body_timeout, open).await
            }
        },
    );
    Ok(bound)
}

/// The refusal of a read whose `Host` is not one of the API's own names, or `None` to
/// go ahead. A page on a name its owner points at this address (DNS rebinding) reads
/// nothing through a browser on the host: the browser sends that name as `Host`. The
/// API's names are its listening address (any address of the host when it listens
/// on all of them), `localhost` and `hosts` (`--api-host`). Mutations need the
/// bearer token, which no such page has; `/healthz` says nothing; a request without
/// `Host` is not a browser's.
fn misdirected(req: &Request<Incoming>, bound: SocketAddr, hosts: &[String]) -> Option<Reply> {
    if !matches!(*req.method(), Method::GET | Method::HEAD) || req.uri().path() == "/healthz" {
        return None;
    }
    let host = req.headers().get(header::HOST)?;
    let name = host.to_str().map(host_name).unwrap_or_default();
    let ours = match name.parse::<IpAddr>() {
        Ok(ip) => ip.to_canonical() == bound.ip().to_canonical() || bound.ip().is_unspecified(),
        Err(_) => {
            let name = name.strip_suffix('.').unwrap_or(name);
            name.eq_ignore_ascii_case("localhost")
                || hosts
                    .iter()
                    .any(|h| h.strip_suffix('.').unwrap_or(h).eq_ignore_ascii_case(name))
        }
    };
    (!ours).then(|| {
        error(
            StatusCode::MISDIRECTED_REQUEST,
            &format!(
                "Host {:?} is not this API's address, localhost or a name given with --api-host",
                String::from_utf8_lossy(host.as_bytes())
            ),
        )
    })
}

/// The name or address of a `Host` value, without its port.
fn host_name(host: &str) -> &str {
    match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    }
}

/// The scoped tokens in force, shared by the controller (which swaps them in on a
/// reload) and the API (which reads them per mutation).
pub type ScopedTokens = Arc<arc_swap::ArcSwap<Tokens>>;

/// What the admin API serves: one row per (method, path) its router knows, `{id}` being
/// one path segment. The router below is derived from it ([`op_of`]); `tests/openapi.rs`
/// holds it against `docs/openapi/admin.yaml`.
pub const ROUTES: &[(&str, &str)] = &{
    let mut out = [("", ""); TABLE.len()];
    let mut i = 0;
    while i < TABLE.len() {
        out[i] = (TABLE[i].0, TABLE[i].1);
        i += 1;
    }
    out
};

/// An operation of the admin API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    StatusPage,
    Healthz,
    Metrics,
    Observations,
    State,
    Explain,
    Audit,
    /// `GET /v1/policy`: the version in force and its history.
    Policy,
    /// A file of the manual (`serve --book`).
    Book,
    /// A mutation, with the token verb it needs.
    Mutation(Verb),
}

const TABLE: &[(&str, &str, Op)] = &[
    ("GET", "/", Op::StatusPage),
    ("GET", "/healthz", Op::Healthz),
    ("GET", "/metrics", Op::Metrics),
    ("GET", "/v1/observations", Op::Observations),
    ("GET", "/v1/state", Op::State),
    ("GET", "/v1/explain", Op::Explain),
    ("GET", "/v1/audit", Op::Audit),
    ("GET", "/v1/policy", Op::Policy),
    ("GET", "/book/{page}", Op::Book),
    ("POST", "/v1/drains", Op::Mutation(Verb::Drain)),
    ("DELETE", "/v1/drains/{id}", Op::Mutation(Verb::Undrain)),
    ("POST", "/v1/failover/freeze", Op::Mutation(Verb::Freeze)),
    ("POST", "/v1/failover/resume", Op::Mutation(Verb::Resume)),
    ("POST", "/v1/usage", Op::Mutation(Verb::Usage)),
    ("POST", "/v1/policy", Op::Mutation(Verb::Policy)),
    ("POST", "/v1/policy/rollback", Op::Mutation(Verb::Policy)),
    ("POST", "/v1/policy/halt", Op::Mutation(Verb::Policy)),
];

/// The operation `method` and `path` ask for ([`TABLE`]), or the fallback: `405` with
/// the method the path takes, or `404`.
fn op_of(method: &Method, path: &str) -> Result<Op, Box<Reply>> {
    let mut allowed: Vec<&str> = Vec::new();
    for &(m, template, op) in TABLE {
        if path_matches(template, path) {
            if m == method.as_str() {
                return Ok(op);
            }
            if !allowed.contains(&m) {
                allowed.push(m);
            }
        }
    }
    if allowed.is_empty() {
        return Err(Box::new(text(StatusCode::NOT_FOUND, "not found\n")));
    }
    // Every method the path takes (`/v1/policy`: GET and POST).
    let only = format!("{} only\n", allowed.join(" or "));
    let mut r = text(StatusCode::METHOD_NOT_ALLOWED, only);
    if let Ok(allow) = header::HeaderValue::from_str(&allowed.join(", ")) {
        r.headers_mut().insert(header::ALLOW, allow);
    }
    Err(Box::new(r))
}

async fn route(
    req: Request<Incoming>,
    state: ApiState,
    body_timeout: std::time::Duration,
    audit_open: bool,
) -> Result<Reply, Infallible> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let op = match op_of(req.method(), &path) {
        Ok(op) => op,
        Err(fallback) => return Ok(*fallback),
    };
    Ok(match op {
        Op::StatusPage => status_page(&state),
        Op::Healthz => text(StatusCode::OK, "ok\n"),
        Op::Metrics => prometheus_text(&state.metrics),
        Op::Observations => json_reply(
            StatusCode::OK,
            &Published {
                vantage: state.vantage.clone(),
                observations: state.local.snapshot(),
            },
        ),
        Op::State => {
            let doc = state
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            json_reply(StatusCode::OK, &doc)
        }
        Op::Explain => explain(&state, &query).await,
        Op::Audit => {
            if !audit_open {
                let token = match authenticate(&req, &state) {
                    Ok(t) => t,
                    Err(refusal) => return Ok(*refusal),
                };
                if let Err(lacks) = token.may(Verb::Audit) {
                    return Ok(error(StatusCode::FORBIDDEN, &lacks));
                }
            }
            audit_page(&state, &query).await
        }
        Op::Policy => super::policy::status(state.commands.as_ref()).await,
        Op::Book => match &state.status {
            Some(status) => status.book.get(&path["/book/".len()..]).await,
            None => error(StatusCode::NOT_FOUND, "not available in this mode"),
        },
        Op::Mutation(verb) => {
            let token = match authenticate(&req, &state) {
                Ok(t) => t,
                Err(refusal) => return Ok(*refusal),
            };
            if let Err(lacks) = token.may(verb) {
                return Ok(error(StatusCode::FORBIDDEN, &lacks));
            }
            mutate(req, state.commands.as_ref(), token, &path, body_timeout).await
        }
    })
}

/// The token of a request's bearer (a mutation, or an audit read from a source outside
/// `--api-audit-open`), or its refusal: `403` when no token is configured, `401` for a
/// missing or unknown one.
fn authenticate(req: &Request<Incoming>, state: &ApiState) -> Result<Arc<Token>, Box<Reply>> {
    let scoped = state.tokens.load();
    if state.token.is_none() && scoped.is_empty() {
        return Err(Box::new(error(StatusCode::FORBIDDEN, "mutations (and audit reads from outside --api-audit-open) are disabled: no API token is configured (--api-token-file, STEERDNS_API_TOKEN or --api-tokens)")));
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .unwrap_or("");
    // Both are looked at, whichever matches: the time does not tell which.
    let every_right = state
        .token
        .as_ref()
        .is_some_and(|t| same_token(given.as_bytes(), t.as_bytes()));
    let found = scoped.find(given);
    match (every_right, found) {
        (true, _) => Ok(Arc::new(Token::every_right(EVERY_RIGHT, given))),
        (false, Some(t)) => Ok(t),
        (false, None) => Err(Box::new(error(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token",
        ))),
    }
}

/// The author's name of what the `--api-token-file` token does.
pub const EVERY_RIGHT: &str = "api-token-file";

/// The token of an `Authorization` value of the Bearer scheme, whose name is
/// case-insensitive (RFC 9110 §11.1).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' '))
}

/// Whether `given` is `token`, in a time that depends only on the length of `token`:
/// every byte of the token is compared, whatever `given` is, and a length that differs
/// is one more difference, not an early return.
fn same_token(given: &[u8], token: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != token.len());
    for (i, t) in token.iter().enumerate() {
        diff |= given.get(i).copied().unwrap_or(!t) ^ t;
    }
    diff == 0
}

async fn explain(state: &ApiState, query: &str) -> Reply {
    let mut name = None;
    let mut client = None;
    let mut resolver = None;
    let mut source = None;
    let mut session = None;
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("name", v)) => name = Some(v.to_string()),
            Some(("client", v)) => client = Some(v.replace("%3A", ":").replace("%3a", ":")),
            Some(("resolver", v)) => resolver = Some(v.replace("%3A", ":").replace("%3a", ":")),
            Some(("source", v)) => source = Some(v.to_string()),
            Some(("session", v)) => session = Some(v.to_string()),
            _ => {}
        }
    }
    let (Some(name), Some(client)) = (name, client) else {
        return error(
            StatusCode::BAD_REQUEST,
            "usage: /v1/explain?name=www.example.com&client=81.2.69.142",
        );
    };
    let Ok(ip) = client.parse::<IpAddr>() else {
        return error(StatusCode::BAD_REQUEST, "client: not an IP address");
    };
    let resolver = match resolver.map(|r| r.parse::<IpAddr>()) {
        None => None,
        Some(Ok(r)) => Some(r),
        Some(Err(_)) => return error(StatusCode::BAD_REQUEST, "resolver: not an IP address"),
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let source = match source.map(|s| s.parse::<u8>()) {
        None => crate::selection::default_source(ip),
        Some(Ok(s)) if s <= max => s,
        Some(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "source: not a prefix length of the client's family",
            )
        }
    };
    let resolver = resolver.map(|r| (r, source));
    let session = match session.map(|s| crate::control::content::manifest::parse_session(&s)) {
        None => None,
        Some(Ok(s)) => Some(s),
        Some(Err(e)) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let Some(commands) = &state.commands else {
        return error(StatusCode::NOT_FOUND, "not available in this mode");
    };
    match ask(commands, |tx| Command::Explain {
        name,
        ip,
        resolver,
        session,
        reply: tx,
    })
    .await
    {
        Ok(Ok(doc)) => json_reply(StatusCode::OK, &doc),
        Ok(Err(e @ ExplainError::NotServing)) => {
            error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())
        }
        Ok(Err(e)) => error(StatusCode::NOT_FOUND, &e.to_string()),
        Err(reply) => *reply,
    }
}

/// `GET /v1/audit?after=SEQ&limit=N`: the audit log's entries after `after` (default
/// 0), at most `limit` (default 100, at most 1000), oldest first, with the seq to ask
/// after for the next page.
async fn audit_page(state: &ApiState, query: &str) -> Reply {
    let mut after = 0u64;
    let mut limit = 100usize;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let parsed = match pair.split_once('=') {
            Some(("after", v)) => v.parse().map(|v| after = v).is_ok(),
            Some(("limit", v)) => v.parse().map(|v| limit = v).is_ok(),
            _ => false,
        };
        if !parsed {
            return error(
                StatusCode::BAD_REQUEST,
                "usage: /v1/audit?after=SEQ&limit=N (numbers)",
            );
        }
    }
    let Some(commands) = &state.commands else {
        return error(StatusCode::NOT_FOUND, "not available in this mode");
    };
    match ask(commands, |tx| Command::Audit {
        after,
        limit,
        reply: tx,
    })
    .await
    {
        Ok(Ok(page)) => json_reply(StatusCode::OK, &page),
        Ok(Err(e)) => error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        Err(reply) => *reply,
    }
}

/// The status page: from the latest state document and the plan being served.
fn status_page(state: &ApiState) -> Reply {
    let body = match &state.status {
        Some(source) => {
            let doc = state
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or_default();
            let snapshot = source.live.load_full();
            let history = source.history.lock().unwrap_or_else(|e| e.into_inner());
            status::page(&doc, &snapshot.plan, &history, now_ms())
        }
        None => status::agent_page(&state.vantage),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    let headers = r.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    // Nothing but what the page carries itself: no script, no fetch, no frame.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'",
        ),
    );
    r
}

fn prometheus_text(m: &Metrics) -> Reply {
    match m.encode() {
        Ok(body) => {
            let mut r = Response::new(Full::new(Bytes::from(body)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(metrics::CONTENT_TYPE),
            );
            r
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot encode /metrics");
            text(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Paths the router is tried with: each route's, with `{id}` filled in, and
    /// near misses.
    const PATHS: &[&str] = &[
        "/",
        "/healthz",
        "/metrics",
        "/v1/observations",
        "/v1/state",
        "/v1/explain",
        "/v1/audit",
        "/book/user/operating.html",
        "/book/",
        "/v1/drains",
        "/v1/drains/api-1",
        "/v1/drains/",
        "/v1/drains/api-1/x",
        "/v1/failover/freeze",
        "/v1/failover/resume",
        "/v1/failover",
        "/v1/usage",
        "/v1/usage/",
        "/v1/policy",
        "/v1/policy/rollback",
        "/v1/policy/halt",
        "/v1/policy/",
        "/v1",
        "/v1/",
        "/healthz/",
        "//",
        "/index.html",
        "/v2/state",
        "",
    ];

    #[test]
    fn the_router_serves_its_table_and_nothing_else() {
        for method in crate::control::http::METHODS {
            for path in PATHS {
                let listed = ROUTES
                    .iter()
                    .any(|(m, t)| *m == method.as_str() && path_matches(t, path));
                match op_of(method, path) {
                    Ok(op) => assert!(
                        listed,
                        "{method} {path:?} is served ({op:?}) but not in ROUTES"
                    ),
                    Err(fallback) => {
                        assert!(!listed, "{method} {path:?} is in ROUTES but falls through");
                        let status = fallback.status();
                        assert!(
                            status == StatusCode::NOT_FOUND
                                || status == StatusCode::METHOD_NOT_ALLOWED,
                            "{method} {path:?}: {status}"
                        );
                        // 405 for a path of the table, and it says which method.
                        let known = ROUTES.iter().any(|(_, t)| path_matches(t, path));
                        assert_eq!(
                            status == StatusCode::METHOD_NOT_ALLOWED,
                            known,
                            "{method} {path:?}"
                        );
                        // Allow lists every method the path takes, and no other.
                        if known {
                            let allow = fallback.headers()[header::ALLOW].to_str().unwrap();
                            let mut takes: Vec<&str> = ROUTES
                                .iter()
                                .filter(|(_, t)| path_matches(t, path))
                                .map(|(m, _)| *m)
                                .collect();
                            takes.dedup();
                            assert_eq!(allow, takes.join(", "), "{method} {path:?}");
                        }
                    }
                }
            }
        }
        // Every row of the table is reached by its own method and path.
        for (m, t) in ROUTES {
            let path = t
                .replace("{id}", "api-7")
                .replace("{page}", "user/operating.html");
            let method = Method::from_bytes(m.as_bytes()).unwrap();
            assert!(op_of(&method, &path).is_ok(), "{m} {path}");
            assert!(
                PATHS.contains(&path.replace("api-7", "api-1").as_str()),
                "{path}: add it to PATHS"
            );
        }
    }

    #[test]
    fn templates_match_one_segment_per_parameter() {
        assert!(path_matches("/v1/drains/{id}", "/v1/drains/api-3"));
        assert!(!path_matches("/v1/drains/{id}", "/v1/drains/"));
        assert!(!path_matches("/v1/drains/{id}", "/v1/drains"));
        assert!(!path_matches("/v1/drains/{id}", "/v1/drains/a/b"));
        assert!(path_matches("/", "/"));
        assert!(!path_matches("/", ""));
        assert!(!path_matches("/v1/state", "/v1/state/"));
    }

    #[test]
    fn tokens_are_compared_whole() {
        let t = b"0123456789abcdef";
        assert!(same_token(t, t));
        for given in [
            &b"0123456789abcdeF"[..],
            b"0123456789abcde",
            b"0123456789abcdef0",
            b"",
            b"1123456789abcdef",
        ] {
            assert!(!same_token(given, t), "{given:?}");
        }
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for v in ["Bearer tok", "bearer tok", "BEARER  tok", " Bearer tok"] {
            assert_eq!(bearer(v), Some("tok"), "{v:?}");
        }
        for v in ["Basic tok", "Bearertok", "Token tok", ""] {
            assert_ne!(bearer(v), Some("tok"), "{v:?}");
        }
    }
}
