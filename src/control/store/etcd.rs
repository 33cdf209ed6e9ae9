//! Control plane: a small client of etcd's v3 JSON gateway (`/v3/kv/…`, `/v3/lease/…`,
//! `/v3/watch`, `/v3/auth/authenticate`) over reqwest, the HTTP client already in the
//! tree: no gRPC code generation (the `etcd-client` crate needs `protoc` to build).
//!
//! | call | gateway path | used for |
//! |---|---|---|
//! | [`Etcd::range_page`] | `/v3/kv/range` | the whole read of the shared state, a page at a time at one revision |
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
    /// `--etcd-insecure`: a password may cross the network in clear (`http://` to a
    /// member that is not on loopback).
    pub insecure: bool,
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
    /// Empty when the value was over [`MAX_VALUE`] (`too_big`): refused, not kept.
    pub value: Vec<u8>,
    pub mod_revision: i64,
    pub too_big: bool,
}

/// Largest value decoded; a larger one is refused without being decoded.
pub const MAX_VALUE: usize = 64 * 1024;
/// Keys per page of a read (a value may be up to etcd's 1.5 MiB request limit: a page
/// stays small).
const RANGE_PAGE: usize = 16;

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
    skew: Arc<Mutex<Skew>>,
    /// The highest revision a write of this node's was answered at (0: none yet).
    written: Arc<std::sync::atomic::AtomicI64>,
}

/// The offset of etcd's clock from this node's (ms, positive when etcd is ahead), from
/// the `Date` header of its answers. A `Date` has a one-second resolution: each
/// answer bounds the offset to an interval, and the intersection of the latest ones
/// (back to the first that disagrees, after a clock jump) narrows it. The estimate is
/// the smallest offset in that intersection: a node whose clock the answers cannot
/// prove wrong (NTP, the set's requirement) keeps its own, rather than moving by a
/// guess of up to half a second (the interval's middle) that it would then act on.
#[derive(Debug, Default)]
struct Skew {
    samples: std::collections::VecDeque<(i64, i64)>,
}

impl Skew {
    const KEPT: usize = 32;

    /// One answer: etcd's `date` (whole seconds), sent at `sent` and received at
    /// `received` by this node's clock (Unix ms).
    fn add(&mut self, date_ms: i64, sent: i64, received: i64) {
        if self.samples.len() == Self::KEPT {
            self.samples.pop_front();
        }
        self.samples
            .push_back((date_ms - received, date_ms + 999 - sent));
    }

    fn estimate(&self) -> Option<i64> {
        let (mut lo, mut hi) = (i64::MIN, i64::MAX);
        for &(l, h) in self.samples.iter().rev() {
            let (l, h) = (lo.max(l), hi.min(h));
            if l > h {
                break;
            }
            (lo, hi) = (l, h);
        }
        (lo != i64::MIN).then(|| 0.clamp(lo, hi))
    }
}

/// One page of a read of a prefix.
#[derive(Debug)]
pub struct Page {
    pub kvs: Vec<Kv>,
    /// More keys follow (in the order read).
    pub more: bool,
    /// The store's revision the page was read at.
    pub revision: i64,
    /// The member that answered.
    pub member: usize,
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

/// Whether `url` names a loopback host (`127.0.0.0/8`, `::1`, `localhost`).
fn is_loopback(url: &reqwest::Url) -> bool {
    let host = url.host_str().unwrap_or("");
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback())
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
    let encoded = v["value"].as_str().unwrap_or("");
    // Base64 takes 4 characters per 3 bytes: the size is known before decoding.
    let too_big = encoded.len() / 4 * 3 > MAX_VALUE + 3;
    let value = if too_big {
        Vec::new()
    } else {
        B64.decode(encoded)
            .map_err(|_| EtcdError::Garbled("a value that is not base64".into()))?
    };
    Ok(Kv {
        key,
        too_big: too_big || value.len() > MAX_VALUE,
        value: if value.len() > MAX_VALUE {
            Vec::new()
        } else {
            value
        },
        mod_revision: num(&v["mod_revision"]).unwrap_or(0),
    })
}

impl Etcd {
    /// A client for `opts`; fails on unreadable certificate files.
    pub fn new(opts: &EtcdOptions, timeout: Duration) -> Result<Etcd, String> {
        if opts.endpoints.is_empty() {
            return Err("no etcd endpoint".into());
        }
        if opts.user.is_some() && !opts.insecure {
            if let Some(u) = opts
                .endpoints
                .iter()
                .find(|u| u.scheme() == "http" && !is_loopback(u))
            {
                return Err(format!("--etcd-user with {u}: the password would cross the network in clear; use https:// (with --etcd-ca), a loopback address, or --etcd-insecure to accept it"));
            }
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
                pem.extend(crate::secret::read_secret_file(k)?);
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
            skew: Arc::new(Mutex::new(Skew::default())),
            written: Arc::new(std::sync::atomic::AtomicI64::new(0)),
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
        let sent = crate::clock::now_ms() as i64;
        let resp = req
            .send()
            .await
            .map_err(|e| EtcdError::Unreachable(format!("{url}: {e}")))?;
        let received = crate::clock::now_ms() as i64;
        if let Some(date) = resp
            .headers()
            .get(reqwest::header::DATE)
            .and_then(|d| d.to_str().ok())
            .and_then(|d| httpdate::parse_http_date(d).ok())
        {
            let date_ms = crate::clock::unix_ms(date) as i64;
            self.skew
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .add(date_ms, sent, received);
        }
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
        self.call_any(path, body).await.map(|(v, _)| v)
    }

    /// [`Etcd::call`], and the member that answered.
    async fn call_any(&self, path: &str, body: &Value) -> Result<(Value, usize), EtcdError> {
        let n = self.endpoints.len();
        let start = self.current.load(Ordering::Relaxed);
        let mut last = EtcdError::Unreachable("no endpoint tried".into());
        for i in (start..start + n).map(|i| i % n) {
            match self.call_on(i, path, body).await {
                Ok(v) => {
                    self.current.store(i, Ordering::Relaxed);
                    return Ok((v, i));
                }
                Err(e) => last = e,
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

    /// POSTs `body` to `path` on member `i` only, authenticating again once when the
    /// token is refused.
    pub async fn call_on(&self, i: usize, path: &str, body: &Value) -> Result<Value, EtcdError> {
        let base = self.endpoint(i).clone();
        let url = base
            .join(path)
            .map_err(|e| EtcdError::Garbled(e.to_string()))?;
        let mut retried_auth = false;
        loop {
            let token = self.authenticate(&base).await?;
            match self.send_once(&url, body, token.as_deref()).await {
                Err(EtcdError::Refused(m))
                    if !retried_auth && self.user.is_some() && m.contains("token") =>
                {
                    *self.token.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    retried_auth = true;
                }
                r => return r,
            }
        }
    }

    /// One page of the keys under `prefix`: those after `after` (before it, newest
    /// first: in descending key order), at `at` (a revision and the member that gave
    /// it; `None`: now, from any member). No answer holds more than a page.
    pub async fn range_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        at: Option<(i64, usize)>,
        newest_first: bool,
    ) -> Result<Page, EtcdError> {
        let (from, end) = match (newest_first, after) {
            (false, None) => (prefix.as_bytes().to_vec(), range_end(prefix)),
            (false, Some(a)) => {
                let mut k = a.as_bytes().to_vec();
                k.push(0);
                (k, range_end(prefix))
            }
            (true, None) => (prefix.as_bytes().to_vec(), range_end(prefix)),
            (true, Some(a)) => (prefix.as_bytes().to_vec(), a.as_bytes().to_vec()),
        };
        let mut body = json!({ "key": b64(&from), "range_end": b64(&end), "limit": RANGE_PAGE });
        if newest_first {
            body["sort_order"] = json!("DESCEND");
            body["sort_target"] = json!("KEY");
        }
        let (v, member) = match at {
            Some((revision, member)) => {
                body["revision"] = json!(revision.to_string());
                (self.call_on(member, "v3/kv/range", &body).await?, member)
            }
            None => self.call_any("v3/kv/range", &body).await?,
        };
        let revision = match at {
            Some((r, _)) => r,
            None => num(&v["header"]["revision"])
                .ok_or_else(|| EtcdError::Garbled("no revision".into()))?,
        };
        let kvs = match v["kvs"].as_array() {
            Some(a) => a.iter().map(decode_kv).collect::<Result<Vec<_>, _>>()?,
            None => Vec::new(),
        };
        Ok(Page {
            more: v["more"].as_bool() == Some(true) && !kvs.is_empty(),
            kvs,
            revision,
            member,
        })
    }

    /// The store's revision, from a count-only read of `key` on any member.
    pub async fn revision(&self, key: &str) -> Result<i64, EtcdError> {
        let body = json!({ "key": b64(key.as_bytes()), "count_only": true });
        let (v, _) = self.call_any("v3/kv/range", &body).await?;
        num(&v["header"]["revision"]).ok_or_else(|| EtcdError::Garbled("no revision".into()))
    }

    /// A linearizable count-only read of `key` on member `i`: a member without a
    /// quorum cannot answer it.
    pub async fn check(&self, i: usize, key: &str) -> Result<(), EtcdError> {
        let body = json!({ "key": b64(key.as_bytes()), "count_only": true });
        self.call_on(i, "v3/kv/range", &body).await.map(|_| ())
    }

    /// This node's observed clock offset against etcd, ms (positive: etcd is ahead).
    pub fn skew_ms(&self) -> Option<i64> {
        self.skew
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .estimate()
    }

    /// Writes `key` (attached to `lease` when given).
    pub async fn put(&self, key: &str, value: &[u8], lease: Option<i64>) -> Result<(), EtcdError> {
        let mut body = json!({ "key": b64(key.as_bytes()), "value": b64(value) });
        if let Some(l) = lease {
            body["lease"] = json!(l.to_string());
        }
        let v = self.call("v3/kv/put", &body).await?;
        self.wrote(&v);
        Ok(())
    }

    /// Notes the revision a write was answered at.
    fn wrote(&self, answer: &Value) {
        if let Some(rev) = num(&answer["header"]["revision"]) {
            self.written.fetch_max(rev, Ordering::Relaxed);
        }
    }

    /// The highest revision a write of this node's was answered at: a view at it holds
    /// every write this node saw answered (`None` before the first).
    pub fn written_revision(&self) -> Option<i64> {
        Some(self.written.load(Ordering::Relaxed)).filter(|&r| r > 0)
    }

    /// Writes `key` only if it does not exist; whether it was written.
    pub async fn create(&self, key: &str, value: &[u8]) -> Result<bool, EtcdError> {
        self.txn(
            key,
            json!({"target": "CREATE", "create_revision": "0"}),
            value,
            json!({}),
        )
        .await
    }

    /// Writes `key` attached to `lease` only if it does not exist; whether it was
    /// written.
    pub async fn create_leased(
        &self,
        key: &str,
        value: &[u8],
        lease: i64,
    ) -> Result<bool, EtcdError> {
        self.txn(
            key,
            json!({"target": "CREATE", "create_revision": "0"}),
            value,
            json!({"lease": lease.to_string()}),
        )
        .await
    }

    /// Like [`Etcd::replace`], keeping the key's lease.
    pub async fn replace_keeping_lease(
        &self,
        key: &str,
        mod_revision: i64,
        value: &[u8],
    ) -> Result<bool, EtcdError> {
        self.replace_with(key, mod_revision, value, json!({"ignore_lease": true}))
            .await
    }

    /// One key (`None`: absent), from any member.
    pub async fn get(&self, key: &str) -> Result<Option<Kv>, EtcdError> {
        let body = json!({ "key": b64(key.as_bytes()) });
        let (v, _) = self.call_any("v3/kv/range", &body).await?;
        match v["kvs"].as_array().and_then(|a| a.first()) {
            Some(kv) => decode_kv(kv).map(Some),
            None => Ok(None),
        }
    }

    /// Writes `key` only if it is still at `mod_revision`; whether it was written.
    pub async fn replace(
        &self,
        key: &str,
        mod_revision: i64,
        value: &[u8],
    ) -> Result<bool, EtcdError> {
        self.replace_with(key, mod_revision, value, json!({})).await
    }

    /// Writes `key` (with the put's `options`) only if it is still at `mod_revision`.
    async fn replace_with(
        &self,
        key: &str,
        mod_revision: i64,
        value: &[u8],
        options: serde_json::Value,
    ) -> Result<bool, EtcdError> {
        let compare = json!({"target": "MOD", "mod_revision": mod_revision.to_string()});
        self.txn(key, compare, value, options).await
    }

    /// Puts `value` (with the put's `extra` fields: a lease) if `compare` holds.
    async fn txn(
        &self,
        key: &str,
        mut compare: Value,
        value: &[u8],
        mut extra: Value,
    ) -> Result<bool, EtcdError> {
        let k = b64(key.as_bytes());
        compare["key"] = json!(k);
        compare["result"] = json!("EQUAL");
        extra["key"] = json!(k);
        extra["value"] = json!(b64(value));
        let body = json!({
            "compare": [compare],
            "success": [{ "request_put": extra }],
        });
        let v = self.call("v3/kv/txn", &body).await?;
        let written = v["succeeded"].as_bool().unwrap_or(false);
        if written {
            self.wrote(&v);
        }
        Ok(written)
    }

    /// Deletes `key`.
    pub async fn delete(&self, key: &str) -> Result<(), EtcdError> {
        let body = json!({ "key": b64(key.as_bytes()) });
        let v = self.call("v3/kv/deleterange", &body).await?;
        self.wrote(&v);
        Ok(())
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

    /// Watches every key under `prefix` from `revision` on member `member`, sending
    /// each batch of events to `out` until the stream ends or fails (the error says
    /// why).
    pub async fn watch(
        &self,
        member: usize,
        prefix: &str,
        revision: i64,
        out: &tokio::sync::mpsc::Sender<(Vec<Event>, i64)>,
    ) -> EtcdError {
        let base = self.endpoint(member).clone();
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
                // A batch of big values grew the buffer: give the memory back.
                if buf.capacity() > 1024 * 1024 {
                    buf.shrink_to(64 * 1024);
                }
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

    /// The member requests go to now.
    pub fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed) % self.endpoints.len()
    }

    /// Moves the requests that may go to any member past member `i` (after it stopped
    /// answering).
    pub fn skip(&self, i: usize) {
        let _ = self.current.compare_exchange(
            i,
            (i + 1) % self.endpoints.len(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// The client URL of member `i`.
    pub fn endpoint_url(&self, i: usize) -> String {
        self.endpoint(i).to_string()
    }

    /// How many members.
    pub fn members(&self) -> usize {
        self.endpoints.len()
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
                mod_revision: 7,
                too_big: false,
            }
        );
        // Over 64 KiB: refused without being kept.
        let big = vec![b'x'; MAX_VALUE + 1];
        let kv = decode_kv(&json!({"key": b64(b"/s/a"), "value": b64(&big)})).unwrap();
        assert!(kv.too_big && kv.value.is_empty());
        let fits = vec![b'x'; MAX_VALUE];
        let kv = decode_kv(&json!({"key": b64(b"/s/a"), "value": b64(&fits)})).unwrap();
        assert!(!kv.too_big && kv.value.len() == MAX_VALUE);
    }

    #[test]
    fn a_password_over_plain_http_off_loopback_is_refused() {
        let opts = |url: &str, insecure| EtcdOptions {
            endpoints: vec![url.parse().unwrap()],
            user: Some(("ns1".into(), "pw".into())),
            insecure,
            ..EtcdOptions::default()
        };
        let t = Duration::from_secs(1);
        let e = Etcd::new(&opts("http://192.0.2.1:2379", false), t)
            .err()
            .unwrap();
        assert!(e.contains("in clear"), "{e}");
        for ok in [
            "http://127.0.0.1:2379",
            "http://[::1]:2379",
            "http://localhost:2379",
            "https://192.0.2.1:2379",
        ] {
            assert!(Etcd::new(&opts(ok, false), t).is_ok(), "{ok}");
        }
        assert!(Etcd::new(&opts("http://192.0.2.1:2379", true), t).is_ok());
    }

    #[test]
    fn the_skew_narrows_to_what_every_answer_allows() {
        let mut s = Skew::default();
        assert_eq!(s.estimate(), None);
        // etcd 2 s ahead; answers 10 ms apart in time, at several phases of a second.
        for t in [1_000_100i64, 1_000_350, 1_000_620, 1_000_990] {
            let etcd = t + 2_000;
            s.add(etcd - etcd % 1000, t - 5, t + 5);
        }
        // [1_895, 2_015]: its nearest end to no skew.
        assert_eq!(s.estimate(), Some(1_895));
        // The clock jumped: the newest answers win, and they allow no skew at all,
        // wherever in the second they fell (the interval's middle would be 200 ms).
        for t in [2_000_100i64, 2_000_500] {
            s.add(t - t % 1000, t - 5, t + 5);
        }
        assert_eq!(s.estimate(), Some(0));
        // Behind: the end nearest to no skew is the upper one.
        let mut s = Skew::default();
        for t in [3_000_200i64, 3_000_900] {
            let etcd = t - 1_500;
            s.add(etcd - etcd % 1000, t - 5, t + 5);
        }
        // [-1_905, -1_196].
        assert_eq!(s.estimate(), Some(-1_196));
        assert!(decode_kv(&json!({"key": "%%%"})).is_err());
    }
}
