//! Control plane: the HTTP API on `--api` (loopback by default). Read-only for now:
//! `/v1/observations` (this vantage point's latest probe results, read by peers),
//! `/v1/state` (health, failover steps, fail-open regions), `/metrics` (Prometheus
//! text format) and `/healthz`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{header, Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::control::peers::Published;
use crate::control::prober::Local;
use crate::metrics::{self, Metrics};

/// What the API serves, shared with the tasks that produce it.
#[derive(Clone)]
pub struct ApiState {
    pub vantage: String,
    pub local: Local,
    /// The controller's latest state document (`serve` only).
    pub state: Arc<Mutex<serde_json::Value>>,
    /// What `/metrics` serves.
    pub metrics: Metrics,
}

/// Binds `addr` and serves until `stop`; returns the bound address.
pub async fn spawn(
    addr: SocketAddr,
    state: ApiState,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                _ = stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::debug!(error = %e, "api accept failed");
                        continue;
                    }
                },
            };
            let (state, stop) = (state.clone(), stop.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req| route(req, state.clone()));
                let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    _ = stop.cancelled() => {}
                    r = conn => if let Err(e) = r { tracing::debug!(error = %e, "api connection error") },
                }
            });
        }
    });
    Ok(bound)
}

async fn route(
    req: Request<Incoming>,
    state: ApiState,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n"));
    }
    Ok(match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/metrics" => prometheus_text(&state.metrics),
        "/v1/observations" => json(&Published {
            vantage: state.vantage.clone(),
            observations: state.local.snapshot(),
        }),
        "/v1/state" => {
            let doc = state
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            json(&doc)
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    })
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn prometheus_text(m: &Metrics) -> Response<Full<Bytes>> {
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

fn json<T: serde::Serialize>(value: &T) -> Response<Full<Bytes>> {
    match serde_json::to_vec_pretty(value) {
        Ok(body) => {
            let mut r = Response::new(Full::new(Bytes::from(body)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode\n"),
    }
}
