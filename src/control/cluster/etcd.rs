//! Control plane: a small client of etcd's v3 JSON gateway (`/v3/kv/…`, `/v3/lease/…`,
//! `/v3/watch`, `/v3/auth/authenticate`) over reqwest, the HTTP client already in the
//! tree: no gRPC code generation (the `etcd-client` crate needs `protoc` to build).
//!
//! | call | gateway path | used for |
//! |---|---|---|
//! | [`Etcd::range_prefix`] | `/v3/kv/range` | the initial read of the shared state, and the liveness check |
//! | [`Etcd::put`] | `/v3/kv/put` | observations (under a lease), drains, freeze |
//! | [`Etcd::create`] | `/v3/kv/txn` compare `CREATE == 0` | create-if-absent of a failover timeline |
//! | [`Etcd::replace`] | `/v3/kv/txn` compare `MOD == rev` | a timeline turned around by exactly one node |
//! | [`Etcd::delete`] | `/v3/kv/deleterange` | drains removed, freeze lifted |
//! | [`Etcd::grant`], [`Etcd::keepalive`] | `/v3/lease/grant`, `/v3/lease/keepalive` | observations that vanish with their writer |
//! | [`Etcd::watch`] | `/v3/watch` (one JSON object per line) | every change under the prefix |
//!
//! Keys and values travel base64-encoded; 64-bit numbers come as strings. Every request
//! goes to the endpoint that answered last; a connection failure moves on to the next
//! one. With a user and password, a token from `/v3/auth/authenticate` is sent as the
//! raw `Authorization` header value, and fetched again when etcd says it is invalid.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::{json, Value};

/// How to reach etcd.
#[derive(Clone, Debug, Default)]
pub struct EtcdOptions {
    /// Client URLs of the members (`http://` or `https://`).
    pub endpoints: Vec<reqwest::Url>,
    /// User and password for etcd's authentication.
    pub user: Option<(String, String)>,
    /// CA certificate(s) (PEM) that sign the members' certificates; without it the
    /// system's roots are trusted.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM) for `--client-cert-auth` members.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// A failed call.
#[derive(Clone, Debug, thiserror::Error)]
pub enum EtcdError {
    /// No member could be reached, or none answered in time.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// A member answered with an error (refused, no leader, bad auth, …).
    #[error("etcd said: {0}")]
    Refused(String),
    /// The answer was not what the gateway sends.
    #[error("unexpected answer: {0}")]
    Garbled(String),
}

/// One key and its value, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    pub mod_revision: i64,
}

/// One change seen by a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Put(Kv),
    Delete(String),
}

/// The client: cheap to clone, shared by the cluster's tasks.
#[derive(Clone)]
pub struct Etcd {
    http: reqwest::Client,
    /// For the watch: no overall timeout (the stream lasts), a connect timeout only.
    stream: reqwest::Client,
    endpoints: Arc<Vec<reqwest::Url>>,
    current: Arc<AtomicUsize>,
    user: Option<(String, String)>,
    token: Arc<Mutex<Option<String>>>,
}

/// The end of a prefix range: the prefix with its last byte incremented.
pub fn range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): every key from the prefix on.
    vec![0]
}

fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

fn num(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

fn decode_kv(v: &Value) -> Result<Kv, EtcdError> {
    let key = v["key"]
        .as_str()
        .and_then(|k| B64.decode(k).ok())
        .and_then(|k| String::from_utf8(k).ok())
        .ok_or_else(|| EtcdError::Garbled("a key that is not base64 UTF-8".into()))?;
    let value = match v["value"].as_str() {
        Some(s) => B64
            .decode(s)
            .map_err(|_| EtcdError::Garbled("a value that is not base64".into()))?,
        None => Vec::new(),
    };
    Ok(Kv {
        key,
        value,
        mod_revision: num(&v["mod_revision"]).unwrap_or(0),
    })
}

impl Etcd {
    /// A client for `opts`; fails on unreadable certificate files.
    pub fn new(opts: &EtcdOptions, timeout: Duration) -> Result<Etcd, String> {
        if opts.endpoints.is_empty() {
            return Err("no etcd endpoint".into());
        }
        let mut tls = Vec::new();
        if let Some(ca) = &opts.ca_file {
            let pem = std::fs::read(ca).map_err(|e| format!("{}: {e}", ca.display()))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("{}: not PEM certificates: {e}", ca.display()))?;
            tls = certs;
        }
        let identity = match (&opts.cert_file, &opts.key_file) {
            (Some(c), Some(k)) => {
                let mut pem = std::fs::read(c).map_err(|e| format!("{}: {e}", c.display()))?;
                pem.push(b'\n');
                pem.extend(std::fs::read(k).map_err(|e| format!("{}: {e}", k.display()))?);
                Some(
                    reqwest::Identity::from_pem(&pem)
                        .map_err(|e| format!("client certificate and key: {e}"))?,
                )
            }
            (None, None) => None,
            _ => return Err("a client certificate needs both --etcd-cert and --etcd-key".into()),
        };
        let build = |overall: Option<Duration>| {
            let mut b = reqwest::Client::builder()
                .no_proxy()
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(timeout);
            if let Some(t) = overall {
                b = b.timeout(t);
            }
            if !tls.is_empty() {
                b = b.tls_certs_only(tls.clone());
            }
            if let Some(id) = &identity {
                b = b.identity(id.clone());
            }
            b.build()
                .map_err(|e| format!("cannot build the etcd HTTP client: {e}"))
        };
        Ok(Etcd {
            http: build(Some(timeout))?,
            stream: build(None)?,
            endpoints: Arc::new(opts.endpoints.clone()),
            current: Arc::new(AtomicUsize::new(0)),
            user: opts.user.clone(),
            token: Arc::new(Mutex::new(None)),
        })
    }

    fn endpoint(&self, i: usize) -> &reqwest::Url {
        &self.endpoints[i % self.endpoints.len()]
    }

    async fn authenticate(&self, base: &reqwest::Url) -> Result<Option<String>, EtcdError> {
        let Some((name, password)) = &self.user else {
            return Ok(None);
        };
        if let Some(t) = self.token.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(Some(t));
        }
        let url = base
            .join("v3/auth/authenticate")
            .map_err(|e| EtcdError::Garbled(e.to_string()))?;
        let body = json!({ "name": name, "password": password });
        let v = self.send_once(&url, &body, None).await?;
        let token = v["token"]
            .as_str()
            .ok_or_else(|| EtcdError::Garbled("no token in the authentication answer".into()))?
            .to_string();
        *self.token.lock().unwrap_or_else(|e| e.into_inner()) = Some(token.clone());
        Ok(Some(token))
    }

    async fn send_once(
        &self,
        url: &reqwest::Url,
        body: &Value,
        token: Option<&str>,
    ) -> Result<Value, EtcdError> {
        let mut req = self
            .http
            .post(url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
        if let Some(t) = token {
            req = req.header(reqwest::header::AUTHORIZATION, t);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| EtcdError::Unreachable(format!("{url}: {e}")))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| EtcdError::Unreachable(format!("{url}: {e}")))?;
        let v: Value = serde_json::from_slice(&bytes).map_err(|_| {
            EtcdError::Garbled(format!(
                "{url}: status {status}, not JSON: {:.120}",
                String::from_utf8_lossy(&bytes)
            ))
        })?;
        if let Some(e) = v.get("error").or_else(|| v.get("message")) {
            return Err(EtcdError::Refused(e.as_str().unwrap_or("?").to_string()));
        }
        if !status.is_success() {
            return Err(EtcdError::Refused(format!("status {status}")));
        }
        Ok(v)
    }

    /// POSTs `body` to `path` on the current member, moving on to the next member on a
    /// connection failure or a member without a leader, and authenticating again once
    /// when the token is refused.
    pub async fn call(&self, path: &str, body: &Value) -> Result<Value, EtcdError> {
        let start = self.current.load(Ordering::Relaxed);
        let mut last = EtcdError::Unreachable("no endpoint tried".into());
        for i in start..start + self.endpoints.len() {
            let base = self.endpoint(i).clone();
            let url = base
                .join(path)
                .map_err(|e| EtcdError::Garbled(e.to_string()))?;
            let mut retried_auth = false;
            loop {
                let token = match self.authenticate(&base).await {
                    Ok(t) => t,
                    Err(e) => {
                        last = e;
                        break;
                    }
                };
                match self.send_once(&url, body, token.as_deref()).await {
                    Ok(v) => {
                        self.current
                            .store(i % self.endpoints.len(), Ordering::Relaxed);
                        return Ok(v);
                    }
                    Err(EtcdError::Refused(m))
                        if !retried_auth && self.user.is_some() && m.contains("token") =>
                    {
                        *self.token.lock().unwrap_or_else(|e| e.into_inner()) = None;
                        retried_auth = true;
                    }
                    Err(e) => {
                        last = e;
                        break;
                    }
                }
            }
            // A member that refuses for want of a leader, or cannot be reached: try the
            // next. Any other refusal is final.
            match &last {
                EtcdError::Unreachable(_) => {}
                EtcdError::Refused(m) if m.contains("leader") || m.contains("timed out") => {}
                _ => return Err(last),
            }
        }
        Err(last)
    }

    /// Every key under `prefix`, and the store's revision.
    pub async fn range_prefix(&self, prefix: &str) -> Result<(Vec<Kv>, i64), EtcdError> {
        let body = json!({ "key": b64(prefix.as_bytes()), "range_end": b64(&range_end(prefix)) });
        let v = self.call("v3/kv/range", &body).await?;
        let revision = num(&v["header"]["revision"])
            .ok_or_else(|| EtcdError::Garbled("no revision".into()))?;
        let kvs = match v["kvs"].as_array() {
            Some(a) => a.iter().map(decode_kv).collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        Ok((kvs, revision))
    }

    /// Writes `key` (attached to `lease` when given).
    pub async fn put(&self, key: &str, value: &[u8], lease: Option<i64>) -> Result<(), EtcdError> {
        let mut body = json!({ "key": b64(key.as_bytes()), "value": b64(value) });
        if let Some(l) = lease {
            body["lease"] = json!(l.to_string());
        }
        self.call("v3/kv/put", &body).await.map(|_| ())
    }

    /// Writes `key` only if it does not exist; whether it was written.
    pub async fn create(&self, key: &str, value: &[u8]) -> Result<bool, EtcdError> {
        self.txn(
            key,
            json!({"target": "CREATE", "create_revision": "0"}),
            value,
        )
        .await
    }

    /// Writes `key` only if it is still at `mod_revision`; whether it was written.
    pub async fn replace(
        &self,
        key: &str,
        mod_revision: i64,
        value: &[u8],
    ) -> Result<bool, EtcdError> {
        self.txn(
            key,
            json!({"target": "MOD", "mod_revision": mod_revision.to_string()}),
            value,
        )
        .await
    }

    async fn txn(&self, key: &str, mut compare: Value, value: &[u8]) -> Result<bool, EtcdError> {
        let k = b64(key.as_bytes());
        compare["key"] = json!(k);
        compare["result"] = json!("EQUAL");
        let body = json!({
            "compare": [compare],
            "success": [{ "request_put": { "key": k, "value": b64(value) } }],
        });
        let v = self.call("v3/kv/txn", &body).await?;
        Ok(v["succeeded"].as_bool().unwrap_or(false))
    }

    /// Deletes `key`.
    pub async fn delete(&self, key: &str) -> Result<(), EtcdError> {
        let body = json!({ "key": b64(key.as_bytes()) });
        self.call("v3/kv/deleterange", &body).await.map(|_| ())
    }

    /// A lease of `ttl` (etcd may lengthen a very short one); its id.
    pub async fn grant(&self, ttl: Duration) -> Result<i64, EtcdError> {
        let body = json!({ "TTL": ttl.as_secs().max(1) });
        let v = self.call("v3/lease/grant", &body).await?;
        num(&v["ID"]).ok_or_else(|| EtcdError::Garbled("no lease ID".into()))
    }

    /// Refreshes a lease; `false` when etcd no longer has it.
    pub async fn keepalive(&self, lease: i64) -> Result<bool, EtcdError> {
        let body = json!({ "ID": lease.to_string() });
        let v = self.call("v3/lease/keepalive", &body).await?;
        Ok(num(&v["result"]["TTL"]).is_some_and(|t| t > 0))
    }

    /// Watches every key under `prefix` from `revision`, sending each batch of events
    /// to `out` until the stream ends or fails (the error says why).
    pub async fn watch(
        &self,
        prefix: &str,
        revision: i64,
        out: &tokio::sync::mpsc::Sender<(Vec<Event>, i64)>,
    ) -> EtcdError {
        let i = self.current.load(Ordering::Relaxed);
        let base = self.endpoint(i).clone();
        let Ok(url) = base.join("v3/watch") else {
            return EtcdError::Garbled("bad endpoint".into());
        };
        let token = match self.authenticate(&base).await {
            Ok(t) => t,
            Err(e) => return e,
        };
        let body = json!({ "create_request": {
            "key": b64(prefix.as_bytes()),
            "range_end": b64(&range_end(prefix)),
            "start_revision": revision.to_string(),
        }});
        let mut req = self
            .stream
            .post(url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
        if let Some(t) = &token {
            req = req.header(reqwest::header::AUTHORIZATION, t.as_str());
        }
        let mut resp = match req.send().await {
            Ok(r) => r,
            Err(e) => return EtcdError::Unreachable(format!("{url}: {e}")),
        };
        if !resp.status().is_success() {
            return EtcdError::Refused(format!("watch: status {}", resp.status()));
        }
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let chunk: bytes::Bytes = match resp.chunk().await {
                Ok(Some(c)) => c,
                Ok(None) => return EtcdError::Unreachable("watch stream ended".into()),
                Err(e) => return EtcdError::Unreachable(format!("watch: {e}")),
            };
            buf.extend_from_slice(&chunk);
            // One JSON object per line; a line never grows past what a batch of
            // events makes, but bound it anyway.
            if buf.len() > 64 * 1024 * 1024 {
                return EtcdError::Garbled("a watch message over 64 MiB".into());
            }
            while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                let v: Value = match serde_json::from_slice(&line) {
                    Ok(v) => v,
                    Err(_) if line.iter().all(u8::is_ascii_whitespace) => continue,
                    Err(e) => return EtcdError::Garbled(format!("watch: {e}")),
                };
                if let Some(e) = v.get("error") {
                    return EtcdError::Refused(format!("watch: {e}"));
                }
                let r = &v["result"];
                if r["canceled"].as_bool() == Some(true) {
                    return EtcdError::Refused(format!(
                        "watch canceled: {}",
                        r["cancel_reason"].as_str().unwrap_or("compacted")
                    ));
                }
                let rev = num(&r["header"]["revision"]).unwrap_or(0);
                let Some(events) = r["events"].as_array() else {
                    continue;
                };
                let mut batch = Vec::with_capacity(events.len());
                for e in events {
                    let kv = match decode_kv(&e["kv"]) {
                        Ok(kv) => kv,
                        Err(e) => return e,
                    };
                    batch.push(if e["type"].as_str() == Some("DELETE") {
                        Event::Delete(kv.key)
                    } else {
                        Event::Put(kv)
                    });
                }
                if out.send((batch, rev)).await.is_err() {
                    return EtcdError::Unreachable("nobody listens".into());
                }
            }
        }
    }

    /// Moves on to the next member (after the current one stopped answering).
    pub fn next_endpoint(&self) {
        self.current.fetch_add(1, Ordering::Relaxed);
    }

    /// The member requests go to now.
    pub fn current_endpoint(&self) -> String {
        self.endpoint(self.current.load(Ordering::Relaxed))
            .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_range_ends_past_its_last_byte() {
        assert_eq!(range_end("/steerdns/"), b"/steerdns0".to_vec());
        assert_eq!(range_end("a\u{7f}"), b"a\x80".to_vec());
        assert_eq!(range_end(""), vec![0]);
    }

    #[test]
    fn kvs_decode_from_the_gateway_form() {
        let v = json!({"key": b64(b"/s/a"), "value": b64(b"{}"), "mod_revision": "7"});
        assert_eq!(
            decode_kv(&v).unwrap(),
            Kv {
                key: "/s/a".into(),
                value: b"{}".to_vec(),
                mod_revision: 7
            }
        );
        assert!(decode_kv(&json!({"key": "%%%"})).is_err());
    }
}
