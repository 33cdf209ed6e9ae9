//! Control plane, content steering: the HTTP server on `--steering-http`.
//!
//! | request | answer |
//! |---|---|
//! | `GET /steer/hls/{name}` | 200, the HLS steering manifest (`PATHWAY-PRIORITY`) |
//! | `GET /steer/dash/{name}` | 200, the DASH steering manifest (`SERVICE-LOCATION-PRIORITY`) |
//! | `HEAD` of either | 200, the same headers, no body |
//! | `POST /rum/{name}` | 204, a beacon's samples recorded (performance steering); 403 without a valid ticket, 415 unless `application/json` |
//! | `GET /rum/{name}/ticket` | 200, `{"ticket": …, "expires": …}`: a beacon ticket for players that use DNS steering alone |
//! | `OPTIONS` of a manifest | 204, CORS preflight (`GET, HEAD, OPTIONS`, any header) |
//! | `OPTIONS /rum/{name}` | 204, CORS preflight (`POST, OPTIONS`, `Content-Type`) for an origin of `--beacon-origin`; 403 for any other |
//! | a name that is not a DNS name, a malformed parameter | 400, `{"error": …}` |
//! | a name that is not steered, another path | 404, `{"error": …}` |
//! | another method | 405, `Allow: GET, HEAD, OPTIONS` (`POST, OPTIONS` on `/rum/{name}`, `GET` on `/rum/{name}/ticket`) |
//!
//! [`ROUTES`] lists them; `docs/openapi/steering.yaml` describes them.
//!
//! Manifests and their errors carry `Access-Control-Allow-Origin: *` (players fetch
//! cross-origin); beacons and tickets carry it only for an `Origin` listed by
//! `--beacon-origin` (echoed, with `Vary: Origin`), so that no other web page can make
//! its visitors post beacons (a beacon is `application/json`, which needs a preflight).
//! A manifest carries `Cache-Control: private, max-age=TTL` (its order is for one client
//! region and one session: a shared cache must not hand it to others), an error and a
//! ticket `no-store`.
//!
//! Beacons and the throughput a poll reports count only with a ticket
//! ([`super::ticket`]) for the name and the client's region, and both go through the
//! same rate per source network.
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
use super::ticket::{self, Tickets};
use crate::control::http::{empty, error, json_reply, serve_http, ApiLimits, Conn, Reply};
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
    /// The secrets beacon tickets are signed with: the DNS cookie secrets
    /// (`control/cookies.rs`: kept in the state directory, shared by a set), from which
    /// the ticket key is derived.
    pub secrets: Arc<crate::dns::cookie::Jar>,
    /// The web origins (`https://player.example.com`) whose pages may post beacons
    /// and fetch tickets (`--beacon-origin`): CORS is answered for them alone.
    pub beacon_origins: Vec<String>,
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
            secrets: Arc::new(crate::dns::cookie::random_jar()),
            beacon_origins: Vec::new(),
        }
    }
}

/// Checks a `--beacon-origin`: `scheme://host[:port]`, as a browser sends `Origin`
/// (no path, no trailing slash, no `*`).
pub fn parse_origin(text: &str) -> Result<String, String> {
    let bad = || {
        format!("`{text}` is not an origin: scheme://host[:port], e.g. https://player.example.com")
    };
    let (scheme, rest) = text.split_once("://").ok_or_else(bad)?;
    let host_ok = !rest.is_empty()
        && rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'));
    if !matches!(scheme, "http" | "https") || !host_ok {
        return Err(bad());
    }
    Ok(text.to_ascii_lowercase())
}

struct Shared {
    live: Arc<Live>,
    metrics: Metrics,
    trusted: Vec<IpNet>,
    perf: Arc<Samples>,
    tickets: Tickets,
    /// `--beacon-origin`, lowercase.
    origins: Vec<String>,
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
        tickets: Tickets::new(opts.secrets),
        origins: opts.beacon_origins,
        body_timeout: opts.limits.body_timeout,
    });
    serve_http(listener, opts.limits, stop, move |req, conn: Conn| {
        let shared = shared.clone();
        async move {
            let peer = conn.peer.ip().to_canonical();
            let route = route(req.method(), req.uri().path());
            let cors = cors_of(&shared, route, req.headers());
            let reply = match route {
                Route::Beacon => rum(&shared, req, peer).await,
                other => answer(&shared, other, &req, peer, &cors),
            };
            Ok::<_, Infallible>(finish(&shared, reply, cors))
        }
    });
    Ok(bound)
}

const ALLOW: &str = "GET, HEAD, OPTIONS";
/// What a beacon's path allows.
const ALLOW_RUM: &str = "POST, OPTIONS";
/// What a ticket's path allows.
const ALLOW_TICKET: &str = "GET";
/// What a manifest's preflight allows.
const ALLOW_CORS: &str = "GET, HEAD, OPTIONS";

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
    ("GET", "/rum/{name}/ticket"),
];

/// What a request asks for, by its method and path alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route<'a> {
    /// `GET` or `HEAD` of `/steer/{format}/{name}`.
    Manifest(Format, &'a str),
    /// `POST /rum/{name}`.
    Beacon,
    /// `GET /rum/{name}/ticket`.
    Ticket(&'a str),
    /// `OPTIONS` of a path of [`ROUTES`]: a manifest's, or a beacon's (`beacon`).
    Preflight { beacon: bool },
    /// `405`, with the methods the path allows (`Allow`) and the message saying so.
    NotAllowed(&'static str, &'static str),
    /// `404`.
    NotFound,
}

/// The router: [`ROUTES`], on the request path without allocating.
fn route<'a>(method: &Method, path: &'a str) -> Route<'a> {
    let ticket = path
        .strip_prefix("/rum/")
        .and_then(|rest| rest.strip_suffix("/ticket"))
        .filter(|name| !name.is_empty() && !name.contains('/'));
    if let Some(name) = ticket {
        return match *method {
            Method::GET => Route::Ticket(name),
            _ => Route::NotAllowed(ALLOW_TICKET, "GET only"),
        };
    }
    let target = match path.strip_prefix("/steer/") {
        Some(rest) => rest
            .split_once('/')
            .and_then(|(f, name)| Some((Some(Format::from_segment(f)?), name))),
        None => path.strip_prefix("/rum/").map(|name| (None, name)),
    }
    .filter(|(_, name)| !name.is_empty() && !name.contains('/'));
    match (method, target) {
        (&Method::OPTIONS, Some((format, _))) => Route::Preflight {
            beacon: format.is_none(),
        },
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
    if matches!(
        reply.status(),
        StatusCode::BAD_REQUEST
            | StatusCode::PAYLOAD_TOO_LARGE
            | StatusCode::UNSUPPORTED_MEDIA_TYPE
    ) {
        shared.metrics.rum_samples("invalid", 1);
    }
    reply
}

/// Whether a request's body is declared JSON (`application/json`, parameters allowed).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

async fn beacon(shared: &Shared, req: Request<Incoming>, peer: IpAddr) -> Reply {
    let name = req.uri().path().trim_start_matches("/rum/");
    let Ok(mut dns_name) = hickory_proto::rr::Name::from_ascii(name) else {
        return error(StatusCode::BAD_REQUEST, "the name is not a DNS name");
    };
    dns_name.set_fqdn(true);
    if !is_json(req.headers()) {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "a beacon is application/json",
        );
    }
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
    let beacon = match beacon::parse(&body) {
        Ok(b) => b,
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
    let checked = shared.tickets.check(
        beacon.ticket,
        steered.text(),
        steered.region_name(region),
        now_ms / 1000,
    );
    if let Err(why) = checked {
        shared
            .metrics
            .rum_samples("refused_ticket", beacon.samples.len() as u64);
        return error(StatusCode::FORBIDDEN, &why.to_string());
    }
    let name = dns_name.to_string();
    match shared
        .perf
        .record(&name, region, net, &beacon.samples, now_ms)
    {
        Ok(recorded) => {
            recorded.count(&shared.metrics);
            // During a staged rollout, the samples of the client's cohort too.
            if let Some(canary) = &snapshot.canary {
                let route = snapshot.route(&crate::plan::Asker::new(client, None));
                let is_canary = route.cohort == crate::plan::Cohort::Canary;
                shared.perf.record_cohort(
                    &canary.version,
                    (&name, region),
                    is_canary,
                    net,
                    &beacon.samples,
                );
            }
            empty(StatusCode::NO_CONTENT)
        }
        Err(why) => error(StatusCode::BAD_REQUEST, &why),
    }
}

/// The answer to one request but a beacon. Never panics, never waits.
fn answer(
    shared: &Shared,
    route: Route,
    req: &Request<Incoming>,
    peer: IpAddr,
    cors: &Cors,
) -> Reply {
    match route {
        Route::Manifest(format, name) => steer(shared, format, name, req, peer),
        Route::Ticket(name) => issue_ticket(shared, name, req, peer),
        Route::Preflight { beacon } => {
            if beacon && matches!(cors, Cors::Refused) {
                return error(
                    StatusCode::FORBIDDEN,
                    "this origin may not post beacons (--beacon-origin)",
                );
            }
            let (methods, headers) = if beacon {
                (ALLOW_RUM, "content-type")
            } else {
                (ALLOW_CORS, "*")
            };
            let mut r = empty(StatusCode::NO_CONTENT);
            let h = r.headers_mut();
            h.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static(methods),
            );
            h.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static(headers),
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

/// What an answer says to CORS.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Cors {
    /// `Access-Control-Allow-Origin: *`: manifests, and paths that are not ours.
    Any,
    /// A beacon's or a ticket's path, from an origin of `--beacon-origin`: echoed.
    Origin(HeaderValue),
    /// A beacon's or a ticket's path, from no origin or another: no CORS header.
    Refused,
}

/// The CORS of a request: `*` but on the paths of beacons and tickets, where only an
/// `Origin` of `--beacon-origin` is allowed.
fn cors_of(shared: &Shared, route: Route, headers: &HeaderMap) -> Cors {
    let beacons = match route {
        Route::Beacon | Route::Ticket(_) => true,
        Route::Preflight { beacon } => beacon,
        Route::NotAllowed(allow, _) => allow == ALLOW_RUM || allow == ALLOW_TICKET,
        Route::Manifest(..) | Route::NotFound => false,
    };
    if !beacons {
        return Cors::Any;
    }
    match headers.get(header::ORIGIN) {
        Some(o)
            if o.to_str().is_ok_and(|o| {
                shared
                    .origins
                    .iter()
                    .any(|allowed| allowed.eq_ignore_ascii_case(o))
            }) =>
        {
            Cors::Origin(o.clone())
        }
        _ => Cors::Refused,
    }
}

/// Every answer's last touch: CORS, and `no-store` and a count for refusals.
fn finish(shared: &Shared, mut reply: Reply, cors: Cors) -> Reply {
    let status = reply.status();
    if status.is_client_error() {
        shared.metrics.steering_refused(status.as_u16());
        reply
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    let h = reply.headers_mut();
    match cors {
        Cors::Any => {
            h.insert(
                header::ACCESS_CONTROL_ALLOW_ORIGIN,
                HeaderValue::from_static("*"),
            );
        }
        Cors::Origin(origin) => {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            h.insert(header::VARY, HeaderValue::from_static("origin"));
        }
        Cors::Refused => {
            h.insert(header::VARY, HeaderValue::from_static("origin"));
        }
    }
    reply
}

/// `GET /rum/{name}/ticket[?session=KEY]`: a beacon ticket for the client's region,
/// for a player that uses DNS steering alone (one with content steering has one in
/// every manifest).
fn issue_ticket(shared: &Shared, name: &str, req: &Request<Incoming>, peer: IpAddr) -> Reply {
    let Ok(mut dns_name) = hickory_proto::rr::Name::from_ascii(name) else {
        return error(StatusCode::BAD_REQUEST, "the name is not a DNS name");
    };
    dns_name.set_fqdn(true);
    let mut session = None;
    for pair in req.uri().query().unwrap_or("").split('&') {
        if let Some(v) = pair.strip_prefix("session=") {
            match manifest::parse_session(v) {
                Ok(s) if session.is_none() => session = Some(s),
                Ok(_) => return error(StatusCode::BAD_REQUEST, "`session` is given twice"),
                Err(why) => return error(StatusCode::BAD_REQUEST, &why.to_string()),
            }
        }
    }
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
    let region = steered
        .situate(&snapshot.geo, client, false)
        .decision
        .region;
    let (ticket, expires) = shared.tickets.issue(
        session.unwrap_or_else(rand::random),
        steered.text(),
        steered.region_name(region),
        crate::clock::now_secs(),
        ticket::lifetime(steered.ttl()),
    );
    let mut r = json_reply(
        StatusCode::OK,
        &serde_json::json!({ "ticket": ticket, "expires": expires }),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
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
    // During a staged rollout, the version of the player's network's cohort (the one
    // its resolver's answers come from when it asks with ECS).
    let route = snapshot.route(&crate::plan::Asker::new(client, None));
    let Some(steered) = route.plan.get(&dns_name) else {
        return error(
            StatusCode::NOT_FOUND,
            &format!("{dns_name} is not a steered name"),
        );
    };
    let session = params.session.unwrap_or_else(rand::random);
    let at = steered.situate(&snapshot.geo, client, false);
    let order = manifest::order(steered, &at, session, &params);
    feed_throughput(shared, steered, order.region, client, session, &params);
    let (ticket, _) = shared.tickets.issue(
        session,
        steered.text(),
        steered.region_name(order.region),
        crate::clock::now_secs(),
        ticket::lifetime(order.ttl),
    );
    let mut body = String::with_capacity(288);
    manifest::write(format, steered, &order, session, &ticket, &mut body);
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
/// their CDNs for the client's region (performance steering), as a beacon's are: with
/// a ticket for the name, the region and the session (`ticket=` of `RELOAD-URI`), and
/// within the same rate per source network. A poll without is answered all the same;
/// only its samples are refused and counted.
fn feed_throughput(
    shared: &Shared,
    steered: crate::plan::Steered,
    region: usize,
    client: IpAddr,
    session: u64,
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
    let now_ms = crate::clock::now_ms();
    let ticket = shared.tickets.check(
        params.ticket.as_deref().unwrap_or(""),
        steered.text(),
        steered.region_name(region),
        now_ms / 1000,
    );
    if ticket != Ok(session) {
        shared
            .metrics
            .rum_samples("refused_ticket", samples.len() as u64);
        return;
    }
    let net = perf::network(client);
    if !shared.perf.admit(net, now_ms) {
        shared
            .metrics
            .rum_samples("refused_rate", samples.len() as u64);
        return;
    }
    let name = steered.name().to_string();
    if let Ok(recorded) = shared.perf.record(&name, region, net, &samples, now_ms) {
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
            "/rum/www.example.com/ticket",
            "/rum//ticket",
            "/rum/a/b/ticket",
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
