//! Control plane, content steering: the HTTP server on `--steering-http`.
//!
//! | request | answer |
//! |---|---|
//! | `GET /steer/hls/{name}` | 200, the HLS steering manifest (`PATHWAY-PRIORITY`) |
//! | `GET /steer/dash/{name}` | 200, the DASH steering manifest (`SERVICE-LOCATION-PRIORITY`) |
//! | `HEAD` of either | 200, the same headers, no body |
//! | `POST /rum/{name}` | 204, a beacon's samples recorded (performance steering) |
//! | `OPTIONS` of any of these | 204, CORS preflight (`GET, HEAD, POST, OPTIONS`, any header) |
//! | a name that is not a DNS name, a malformed parameter | 400, `{"error": …}` |
//! | a name that is not steered, another path | 404, `{"error": …}` |
//! | another method | 405, `Allow: GET, HEAD, OPTIONS` (`POST, OPTIONS` on `/rum/{name}`) |
//!
//! [`ROUTES`] lists them; `docs/openapi/steering.yaml` describes them.
//!
//! Every answer carries `Access-Control-Allow-Origin: *` (players fetch cross-origin);
//! a manifest carries `Cache-Control: private, max-age=TTL` (its order is for one client
//! region and one session: a shared cache must not hand it to others), an error
//! `no-store`.
//!
//! The client is the connection's peer, or, when the peer is one of
//! `--trusted-proxies`, the last address of `X-Forwarded-For` that is not one of them
//! (the rightmost entries were added by our own proxies; the leftmost are whatever the
//! client claimed). A peer outside the trusted proxies cannot choose its region.
//!
//! Limits are the admin API's (`http::serve_http`, [`ApiLimits`]): headers at most
//! 64 KiB and within 10 s, idle connections closed after 10 s, at most 4096 connections
//! and 64 per source, one /24 or /56 (trusted proxies excepted). Requests have no body: none
//! is read.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use ipnet::IpNet;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use http_body_util::{BodyExt, Limited};

use super::manifest::{self, Format};
use crate::control::http::{empty, error, serve_http, ApiLimits, Conn, Reply};
use crate::control::modifiers::perf::{self, beacon, Samples};
use crate::metrics::Metrics;
use crate::plan::Live;

/// How the steering server runs.
#[derive(Clone, Debug)]
pub struct SteeringOptions {
    pub addr: SocketAddr,
    /// Peers whose `X-Forwarded-For` is believed (`--trusted-proxies`).
    pub trusted_proxies: Vec<IpNet>,
    pub limits: ApiLimits,
    /// Where beacons (`POST /rum/{name}`) and the throughput of steering polls go
    /// (the controller's, `Controller::perf_store`).
    pub perf: Arc<Samples>,
}

impl SteeringOptions {
    /// The default limits for players: more connections than the admin API, none
    /// kept for loopback mutations.
    pub fn new(addr: SocketAddr, trusted_proxies: Vec<IpNet>) -> SteeringOptions {
        let limits = ApiLimits {
            max_connections: 4096,
            max_per_source: 64,
            reserved_for_loopback: 0,
            unlimited_sources: trusted_proxies.clone(),
            ..ApiLimits::default()
        };
        SteeringOptions {
            addr,
            trusted_proxies,
            limits,
            perf: Arc::default(),
        }
    }
}

struct Shared {
    live: Arc<Live>,
    metrics: Metrics,
    trusted: Vec<IpNet>,
    perf: Arc<Samples>,
    /// Time to send a beacon's body.
    body_timeout: std::time::Duration,
}

/// Binds `opts.addr` and serves steering manifests from `live` until `stop`; returns
/// the bound address.
pub async fn spawn(
    opts: SteeringOptions,
    live: Arc<Live>,
    metrics: Metrics,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(opts.addr).await?;
    let bound = listener.local_addr()?;
    let shared = Arc::new(Shared {
        live,
        metrics,
        trusted: opts.trusted_proxies,
        perf: opts.perf,
        body_timeout: opts.limits.body_timeout,
    });
    serve_http(listener, opts.limits, stop, move |req, conn: Conn| {
        let shared = shared.clone();
        async move {
            let peer = conn.peer.ip().to_canonical();
            let reply = match route(req.method(), req.uri().path()) {
                Route::Beacon => rum(&shared, req, peer).await,
                other => answer(&shared, other, &req, peer),
            };
            Ok::<_, Infallible>(finish(&shared, reply))
        }
    });
    Ok(bound)
}

const ALLOW: &str = "GET, HEAD, OPTIONS";
/// What a beacon's path allows.
const ALLOW_RUM: &str = "POST, OPTIONS";
/// What a preflight allows: beacons are posted.
const ALLOW_CORS: &str = "GET, HEAD, POST, OPTIONS";

/// What the steering server serves: one row per (method, path) its router ([`route`])
/// knows, `{name}` being one path segment. `tests/openapi.rs` holds it against
/// `docs/openapi/steering.yaml`.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/steer/hls/{name}"),
    ("HEAD", "/steer/hls/{name}"),
    ("OPTIONS", "/steer/hls/{name}"),
    ("GET", "/steer/dash/{name}"),
    ("HEAD", "/steer/dash/{name}"),
    ("OPTIONS", "/steer/dash/{name}"),
    ("POST", "/rum/{name}"),
    ("OPTIONS", "/rum/{name}"),
];

/// What a request asks for, by its method and path alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route<'a> {
    /// `GET` or `HEAD` of `/steer/{format}/{name}`.
    Manifest(Format, &'a str),
    /// `POST /rum/{name}`.
    Beacon,
    /// `OPTIONS` of a path of [`ROUTES`].
    Preflight,
    /// `405`, with the methods the path allows (`Allow`) and the message saying so.
    NotAllowed(&'static str, &'static str),
    /// `404`.
    NotFound,
}

/// The router: [`ROUTES`], on the request path without allocating.
fn route<'a>(method: &Method, path: &'a str) -> Route<'a> {
    let target = match path.strip_prefix("/steer/") {
        Some(rest) => rest
            .split_once('/')
            .and_then(|(f, name)| Some((Some(Format::from_segment(f)?), name))),
        None => path.strip_prefix("/rum/").map(|name| (None, name)),
    }
    .filter(|(_, name)| !name.is_empty() && !name.contains('/'));
    match (method, target) {
        (&Method::OPTIONS, Some(_)) => Route::Preflight,
        (&Method::GET | &Method::HEAD, Some((Some(format), name))) => Route::Manifest(format, name),
        (&Method::POST, Some((None, _))) => Route::Beacon,
        (_, Some((None, _))) => Route::NotAllowed(ALLOW_RUM, "POST or OPTIONS only"),
        (&Method::GET | &Method::HEAD | &Method::OPTIONS, _) => Route::NotFound,
        _ => Route::NotAllowed(ALLOW, "GET, HEAD or OPTIONS only"),
    }
}

/// A beacon, `POST /rum/{name}`: 204 once its samples are recorded for the client's
/// region (located here, as for manifests); 400, 413 or 429 with a message.
async fn rum(shared: &Shared, req: Request<Incoming>, peer: IpAddr) -> Reply {
    let reply = beacon(shared, req, peer).await;
    if reply.status() == StatusCode::BAD_REQUEST || reply.status() == StatusCode::PAYLOAD_TOO_LARGE
    {
        shared.metrics.rum_samples("invalid", 1);
    }
    reply
}

async fn beacon(shared: &Shared, req: Request<Incoming>, peer: IpAddr) -> Reply {
    let name = req.uri().path().trim_start_matches("/rum/");
    let Ok(mut dns_name) = hickory_proto::rr::Name::from_ascii(name) else {
        return error(StatusCode::BAD_REQUEST, "the name is not a DNS name");
    };
    dns_name.set_fqdn(true);
    let client = match client_of(peer, req.headers(), &shared.trusted) {
        Ok(ip) => ip,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    let net = perf::network(client);
    let now_ms = crate::clock::now_ms();
    if !shared.perf.admit(net, now_ms) {
        shared.metrics.rum_samples("refused_rate", 1);
        return error(
            StatusCode::TOO_MANY_REQUESTS,
            "too many beacons from this network: slow down",
        );
    }
    let collect = Limited::new(req.into_body(), beacon::MAX_BODY).collect();
    let body = match tokio::time::timeout(shared.body_timeout, collect).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(_)) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body over 16 KiB or unreadable",
            )
        }
        Err(_) => return error(StatusCode::REQUEST_TIMEOUT, "body not sent in time"),
    };
    let samples = match beacon::parse(&body) {
        Ok(s) => s,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    let snapshot = shared.live.load();
    let Some(steered) = snapshot.plan.get(&dns_name) else {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("{dns_name} is not a steered name"),
        );
    };
    let region = steered
        .situate(&snapshot.geo, client, false)
        .decision
        .region;
    match shared
        .perf
        .record(&dns_name.to_string(), region, net, &samples, now_ms)
    {
        Ok(recorded) => {
            recorded.count(&shared.metrics);
            empty(StatusCode::NO_CONTENT)
        }
        Err(why) => error(StatusCode::BAD_REQUEST, &why),
    }
}

/// The answer to one request but a beacon. Never panics, never waits.
fn answer(shared: &Shared, route: Route, req: &Request<Incoming>, peer: IpAddr) -> Reply {
    match route {
        Route::Manifest(format, name) => steer(shared, format, name, req, peer),
        Route::Preflight => {
            let mut r = empty(StatusCode::NO_CONTENT);
            let h = r.headers_mut();
            h.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static(ALLOW_CORS),
            );
            h.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static("*"),
            );
            h.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("86400"),
            );
            r
        }
        Route::NotAllowed(allow, message) => {
            let mut r = error(StatusCode::METHOD_NOT_ALLOWED, message);
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
            r
        }
        Route::NotFound | Route::Beacon => error(
            StatusCode::NOT_FOUND,
            "not found: ask /steer/hls/{name} or /steer/dash/{name}",
        ),
    }
}

/// Every answer's last touch: CORS, and `no-store` and a count for refusals.
fn finish(shared: &Shared, mut reply: Reply) -> Reply {
    let status = reply.status();
    if status.is_client_error() {
        shared.metrics.steering_refused(status.as_u16());
        reply
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    reply.headers_mut().insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    reply
}

/// A `GET` or `HEAD` of `/steer/{format}/{name}`.
fn steer(
    shared: &Shared,
    format: Format,
    name: &str,
    req: &Request<Incoming>,
    peer: IpAddr,
) -> Reply {
    let Ok(mut dns_name) = hickory_proto::rr::Name::from_ascii(name) else {
        return error(StatusCode::BAD_REQUEST, "the name is not a DNS name");
    };
    dns_name.set_fqdn(true);
    let params = match manifest::parse_query(format, req.uri().query().unwrap_or("")) {
        Ok(p) => p,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    let client = match client_of(peer, req.headers(), &shared.trusted) {
        Ok(ip) => ip,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    let snapshot = shared.live.load();
    let Some(steered) = snapshot.plan.get(&dns_name) else {
        return error(
            StatusCode::NOT_FOUND,
            &format!("{dns_name} is not a steered name"),
        );
    };
    let session = params.session.unwrap_or_else(rand::random);
    let at = steered.situate(&snapshot.geo, client, false);
    let order = manifest::order(steered, &at, session, &params);
    feed_throughput(shared, steered, order.region, client, &params);
    let mut body = String::with_capacity(192);
    manifest::write(format, steered, &order, session, &mut body);
    if let Some(&first) = order.targets.first() {
        shared.metrics.steering_response(
            steered.text(),
            steered.region_name(order.region),
            manifest::pathway(steered, first),
        );
    }
    let mut r = Response::new(Full::new(Bytes::from(body)));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("private, max-age={}", order.ttl)) {
        h.insert(header::CACHE_CONTROL, v);
    }
    r
}

/// The throughput a steering poll reports for its pathways, recorded as samples of
/// their CDNs for the client's region (performance steering).
fn feed_throughput(
    shared: &Shared,
    steered: crate::plan::Steered,
    region: usize,
    client: IpAddr,
    params: &manifest::Params,
) {
    let n = steered.targets().len();
    let samples: Vec<(&str, perf::cell::Sample)> = params
        .reported
        .iter()
        .filter_map(|(id, bps)| {
            let bps = (*bps).filter(|&b| b > 0 && b <= beacon::MAX_THROUGHPUT_BPS)?;
            let t = (0..n).find(|&t| manifest::pathway(steered, t) == id.as_str())?;
            let sample = perf::cell::Sample {
                throughput_bps: Some(bps),
                ..perf::cell::Sample::default()
            };
            Some((&*steered.target(t).cdn, sample))
        })
        .collect();
    if samples.is_empty() {
        return;
    }
    let name = steered.name().to_string();
    let now_ms = crate::clock::now_ms();
    if let Ok(recorded) = shared
        .perf
        .record(&name, region, perf::network(client), &samples, now_ms)
    {
        recorded.count(&shared.metrics);
    }
}

/// The client of a request from `peer`: `peer` itself, or, from a trusted proxy, the
/// rightmost address of `X-Forwarded-For` that is not a trusted proxy (all of them
/// trusted: the leftmost).
pub fn client_of(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &[IpNet],
) -> Result<IpAddr, &'static str> {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(&peer) {
        return Ok(peer);
    }
    let mut hops = Vec::new();
    for value in headers.get_all("x-forwarded-for") {
        let text = value.to_str().map_err(|_| "X-Forwarded-For: not ASCII")?;
        for hop in text.split(',').map(str::trim).filter(|h| !h.is_empty()) {
            if hops.len() >= 64 {
                return Err("X-Forwarded-For: more than 64 addresses");
            }
            let ip = parse_hop(hop).ok_or("X-Forwarded-For: not a list of IP addresses")?;
            hops.push(ip.to_canonical());
        }
    }
    Ok(hops
        .iter()
        .rev()
        .find(|ip| !is_trusted(ip))
        .or(hops.first())
        .copied()
        .unwrap_or(peer))
}

/// One `X-Forwarded-For` entry: an address, maybe with a port (`1.2.3.4:5678`,
/// `[2001:db8::1]:443`).
fn parse_hop(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse() {
        return Some(ip);
    }
    hop.parse::<SocketAddr>().ok().map(|s| s.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_router_serves_its_table_and_nothing_else() {
        let matches =
            |template: &str, path: &str| crate::control::http::path_matches(template, path);
        let paths = [
            "/steer/hls/www.example.com",
            "/steer/dash/www.example.com",
            "/rum/www.example.com",
            "/steer/hls/",
            "/steer/hls",
            "/steer/dash/a/b",
            "/steer/mss/www.example.com",
            "/steer/",
            "/rum/",
            "/rum",
            "/rum/a/b",
            "/",
            "/metrics",
            "",
            "/steer/hls/not a name",
        ];
        for method in crate::control::http::METHODS {
            for path in paths {
                let listed = ROUTES
                    .iter()
                    .any(|(m, t)| *m == method.as_str() && matches(t, path));
                let r = route(method, path);
                let fallback = matches!(r, Route::NotFound | Route::NotAllowed(..));
                assert_eq!(listed, !fallback, "{method} {path:?}: {r:?}");
                if let Route::NotAllowed(allow, _) = r {
                    // What it allows is what the table has for the path, if anything.
                    let of_path: Vec<&str> = ROUTES
                        .iter()
                        .filter(|(_, t)| matches(t, path))
                        .map(|(m, _)| *m)
                        .collect();
                    if !of_path.is_empty() {
                        assert_eq!(allow.split(", ").collect::<Vec<_>>(), of_path, "{path}");
                    }
                }
            }
        }
        for (_, t) in ROUTES {
            let path = t.replace("{name}", "www.example.com");
            assert!(
                paths.contains(&path.as_str()),
                "{path}: add it to the paths"
            );
        }
        assert_eq!(
            route(&Method::GET, "/steer/dash/v.example.com"),
            Route::Manifest(Format::Dash, "v.example.com")
        );
    }

    #[test]
    fn forwarded_for_is_believed_from_trusted_proxies_only() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let h = headers(&["81.2.69.142, 10.1.1.1"]);
        assert_eq!(
            client_of(ip("10.0.0.1"), &h, &trusted),
            Ok(ip("81.2.69.142"))
        );
        // A spoofed leftmost entry does not win over what our proxy saw.
        let h = headers(&["1.1.1.1, 81.2.69.142"]);
        assert_eq!(
            client_of(ip("10.0.0.1"), &h, &trusted),
            Ok(ip("81.2.69.142"))
        );
        // Two header lines are one list; ports and brackets are allowed.
        let h = headers(&["[2001:db8::1]:443", "10.2.2.2:80"]);
        assert_eq!(
            client_of(ip("10.0.0.1"), &h, &trusted),
            Ok(ip("2001:db8::1"))
        );
        // Everyone trusted: the leftmost.
        let h = headers(&["10.9.9.9, 10.1.1.1"]);
        assert_eq!(client_of(ip("10.0.0.1"), &h, &trusted), Ok(ip("10.9.9.9")));
        // Untrusted peer: the header is ignored, even malformed.
        let h = headers(&["81.2.69.142", "garbage"]);
        assert_eq!(
            client_of(ip("192.0.2.1"), &h, &trusted),
            Ok(ip("192.0.2.1"))
        );
        // Trusted peer, no header: the peer.
        assert_eq!(
            client_of(ip("10.0.0.1"), &HeaderMap::new(), &trusted),
            Ok(ip("10.0.0.1"))
        );
        assert!(client_of(ip("10.0.0.1"), &headers(&["garbage"]), &trusted).is_err());
    }
}
