//! Control plane: the HTTP/1.1 server both HTTP listeners run on, the admin API
//! (`api.rs`, `--api`) and content steering (`content/server.rs`, `--steering-http`):
//! the accept loop under [`ApiLimits`] and the replies they share (JSON, text, errors,
//! and [`esc`] for the HTML pages).
//!
//! Each accepted connection takes a [`crate::slots::Slot`] (at most `max_connections`,
//! `max_per_source` from one /24 or /56 unless it is one of `unlimited_sources`) or is
//! closed at once; past either limit a loopback source may take one of
//! `reserved_for_loopback` slots: one request, no keep-alive, its headers within 2 s. The
//! request line and headers are bounded in size (`431` beyond) and in time, as is a
//! connection's idleness between requests; bodies are the handlers' to read, under
//! `body_timeout`.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{header, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::slots::Slots;

/// What one client may take of an HTTP server (the admin API's defaults; content
/// steering sets its own in `SteeringOptions::new`).
#[derive(Clone, Debug)]
pub struct ApiLimits {
    /// Time to send a request's line and headers, and the time a connection may stay
    /// idle waiting for the next request.
    pub header_timeout: std::time::Duration,
    /// Time to send a request body (mutations only).
    pub body_timeout: std::time::Duration,
    /// Bytes of request line and headers.
    pub max_header_bytes: usize,
    /// Connections served at once; more are closed as soon as accepted.
    pub max_connections: usize,
    /// Connections from one source at once (0: no limit).
    pub max_per_source: usize,
    /// The IPv4 prefix a source is counted by (one /24 by default).
    pub source_prefix_v4: u8,
    /// The IPv6 prefix a source is counted by (one /56 by default).
    pub source_prefix_v6: u8,
    /// Connections kept beyond `max_connections` for loopback mutations.
    pub reserved_for_loopback: usize,
    /// Names a read's `Host` may carry besides the listening address and `localhost`
    /// (`--api-host`; admin API only).
    pub hosts: Vec<String>,
    /// Sources that `max_per_source` does not apply to (the content steering server's
    /// trusted proxies, which carry many clients each).
    pub unlimited_sources: Vec<ipnet::IpNet>,
    /// Sources that read `GET /v1/audit` without a token (`--api-audit-open`; admin API
    /// only): loopback by default. Any other needs a token with the verb `audit`.
    pub audit_open: Vec<ipnet::IpNet>,
}

/// How long a connection on a reserved slot has to send its request.
const RESERVED_HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl Default for ApiLimits {
    fn default() -> Self {
        ApiLimits {
            header_timeout: std::time::Duration::from_secs(10),
            body_timeout: std::time::Duration::from_secs(10),
            max_header_bytes: 64 * 1024,
            max_connections: 256,
            max_per_source: 32,
            source_prefix_v4: 24,
            source_prefix_v6: 56,
            reserved_for_loopback: 4,
            hosts: Vec::new(),
            unlimited_sources: Vec::new(),
            audit_open: loopback(),
        }
    }
}

/// 127.0.0.0/8 and ::1: the sources on the host itself.
pub(crate) fn loopback() -> Vec<ipnet::IpNet> {
    ["127.0.0.0/8", "::1/128"]
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// One accepted connection, as a request handler of [`serve_http`] sees it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Conn {
    /// The TCP peer.
    pub peer: SocketAddr,
    /// A connection on a slot kept for loopback sources (`reserved_for_loopback`):
    /// one request, no keep-alive, a short header timeout.
    pub reserved: bool,
}

/// Serves HTTP/1.1 on `listener` under `limits` until `stop`: the accept loop of the
/// admin API (`control::surfaces::api`) and of the content steering server (`control::content`).
/// Each request goes to `handle` with its connection.
pub(super) fn serve_http<F, Fut>(
    listener: TcpListener,
    limits: ApiLimits,
    stop: CancellationToken,
    handle: F,
) where
    F: Fn(Request<Incoming>, Conn) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Reply, Infallible>> + Send + 'static,
{
    let slots = Slots::new(
        limits.max_connections,
        limits.reserved_for_loopback,
        limits.source_prefix_v4,
        limits.source_prefix_v6,
    );
    tokio::spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                _ = stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::debug!(error = %e, "http accept failed");
                        // Out of file descriptors, say: do not spin.
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                        continue;
                    }
                },
            };
            let ip = peer.ip().to_canonical();
            let per_source = if limits.unlimited_sources.iter().any(|n| n.contains(&ip)) {
                0
            } else {
                limits.max_per_source
            };
            // A source at its cap, or every slot taken: only loopback goes on, to the
            // reserve (short header timeout, no keep-alive, so a flood cannot sit on
            // it).
            let Ok(slot) = slots.take(ip, per_source) else {
                tracing::debug!(%ip, "http: too many connections (from this source, or in all), closing a new one");
                drop(stream);
                continue;
            };
            let (stop, limits, handle) = (stop.clone(), limits.clone(), handle.clone());
            tokio::spawn(async move {
                let on_reserve = slot.reserved;
                let _slot = slot;
                let conn = Conn {
                    peer,
                    reserved: on_reserve,
                };
                let service = service_fn(move |req: Request<Incoming>| handle(req, conn));
                let header_timeout = if on_reserve {
                    limits.header_timeout.min(RESERVED_HEADER_TIMEOUT)
                } else {
                    limits.header_timeout
                };
                let _ = stream.set_nodelay(true);
                let conn = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(header_timeout)
                    .keep_alive(!on_reserve)
                    .max_buf_size(limits.max_header_bytes.max(8192))
                    .max_header_size(limits.max_header_bytes)
                    .serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    _ = stop.cancelled() => {}
                    r = conn => if let Err(e) = r { tracing::debug!(error = %e, "http connection error") },
                }
            });
        }
    });
}

/// What a request handler answers.
pub(super) type Reply = Response<Full<Bytes>>;

/// `body` as `text/plain`.
pub(super) fn text(status: StatusCode, body: impl Into<Bytes>) -> Reply {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// `{"error": message}` as JSON: every refusal of the API and of content steering.
pub(super) fn error(status: StatusCode, message: &(impl std::fmt::Display + ?Sized)) -> Reply {
    json_reply(status, &json!({ "error": message.to_string() }))
}

/// `value` as pretty-printed JSON.
pub(super) fn json_reply<T: serde::Serialize>(status: StatusCode, value: &T) -> Reply {
    match serde_json::to_vec_pretty(value) {
        Ok(body) => {
            let mut r = Response::new(Full::new(Bytes::from(body)));
            *r.status_mut() = status;
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode\n"),
    }
}

/// No body, as `204 No Content` has.
pub(super) fn empty(status: StatusCode) -> Reply {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = status;
    r
}

/// Whether `path` is an instance of `template`, whose `{…}` segments match one
/// non-empty segment each, but `{page}`, the last, which takes the rest of the path
/// (the manual's files are in folders): how the routers' `ROUTES` tables read.
pub(crate) fn path_matches(template: &str, path: &str) -> bool {
    let (mut t, mut p) = (template.split('/'), path.split('/'));
    loop {
        match (t.next(), p.next()) {
            (None, None) => return true,
            // The manual's pages are in folders: `{page}` takes the rest of the path.
            (Some("{page}"), Some(_)) => return t.next().is_none(),
            (Some(ts), Some(ps)) if ts.starts_with('{') && ts.ends_with('}') => {
                if ps.is_empty() {
                    return false;
                }
            }
            (Some(ts), Some(ps)) if ts == ps => {}
            _ => return false,
        }
    }
}

/// `text` safe inside an element or a quoted attribute.
pub(crate) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The methods the routers' tests try every path with.
#[cfg(test)]
pub(crate) const METHODS: &[hyper::Method] = &[
    hyper::Method::GET,
    hyper::Method::HEAD,
    hyper::Method::POST,
    hyper::Method::PUT,
    hyper::Method::DELETE,
    hyper::Method::PATCH,
    hyper::Method::OPTIONS,
    hyper::Method::TRACE,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_covers_markup_and_quotes() {
        assert_eq!(
            esc(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
    }
}
