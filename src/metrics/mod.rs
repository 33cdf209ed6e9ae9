//! Both planes: the Prometheus metric families, in their own registry (prefix
//! `steerdns_`), and the typed methods that update them. The data plane counts answers
//! and times them; the control plane reports probe results, health, failover steps,
//! fail-open, drains and reloads. `/metrics` on `--api` serves [`Metrics::encode`].
//! This file holds the families (`Metrics::new`) and `encode`; `data.rs` the updates of
//! the data plane and content steering, `control.rs` those of the control plane,
//! `steered.rs` the series read from the plans at scrape time, `labels.rs` the bounded
//! label values.
//!
//! | family | labels | what |
//! |---|---|---|
//! | `queries_total` | name, region, cdn, rcode | answers; name/region/cdn are empty unless steered (¹) |
//! | `query_duration_seconds` | | handler time, 1 µs .. 8 ms buckets |
//! | `probe_results_total` | cdn, vantage, result | `ok` or the reason class (`timeout`, `status`, ...) |
//! | `cdn_up` | cdn | 1 up, 0 down (quorum + hysteresis) |
//! | `health_transitions_total` | cdn, to | `to="down"`: quorum reached, CDN demoted |
//! | `failover_removed_percent` | name, cdn | share removed by failover steps |
//! | `effective_weight` | name, region, cdn | percent of the region's answers, 0..100 (²) |
//! | `fail_open` | name, region | 1 while the region fails open |
//! | `fail_open_events_total` | name, region | times the region started failing open |
//! | `vantage_unhappy` | vantage | 1 while a vantage point is unhappy (not a demotion) |
//! | `config_reloads_total` | result | `applied` or `refused` |
//! | `config_info` | version | 1 for the configuration being served |
//! | `drains_active` | name, cdn | 1 while a drain applies |
//! | `peer_errors_total` | peer, reason | peer readings refused: `timeout`, `connect`, `status`, `http`, `too_large`, `invalid` |
//! | `state_save_errors_total` | | failed saves of the state file (each retried) |
//! | `state_save_failing` | | 1 while the latest save of the state file failed |
//! | `state_load_errors_total` | reason | saved state not restored at startup: `corrupt`, `unreadable` |
//! | `udp_thread_restarts_total` | | UDP threads that panicked and were restarted on their socket |
//! | `rate_limited_total` | action | UDP queries over the rate limit: `dropped`, `slipped` (TC), `badcookie` (BADCOOKIE instead of the slip to a client that sent a cookie) |
//! | `cookies_total` | result | queries with a DNS cookie: `client_only`, `valid`, `invalid`, `malformed` |
//! | `dnstap_frames_total` | | dnstap frames written to the collector (`--dnstap`) |
//! | `dnstap_dropped_total` | | dnstap frames dropped: the queue was full, or the collector went away with them |
//! | `dnstap_connected` | | 1 while the dnstap writer is connected to its collector |
//! | `etcd_fail_static` | | 1 while a node of a set (`--etcd`) cannot reach etcd: it serves the last shared state, starts no demotion |
//! | `etcd_refused_keys` | | keys under the prefix refused (bad form, unknown CDN or name, a writer outside `--members`, over a size or count cap, a drain over the scope cap): they do not count |
//! | `etcd_clock_skew_seconds` | | this node's clock against etcd's, as etcd's answers date them (positive: etcd is ahead); a set needs NTP |
//! | `steering_responses_total` | name, region, pathway | content steering manifests served, by the pathway listed first |
//! | `steering_refused_total` | status | content steering requests refused: 400, 404 or 405 |
//! | `dnssec_signature_expiry_seconds` | | seconds until the DNSSEC signatures served expire (signed zones only; read from the snapshot at scrape time) |
//! | `rum_samples_total` | result | performance samples (beacons, steering polls): `accepted`, `refused_share` (one network over 5 % of a cell, or a new network in a bucket already keeping 4,096), `refused_rate` (beacons over a network's rate), `invalid` (beacons refused 400/413), `unused` (a region without `performance:`), `probe` (probe rounds with `--vantage-address`) |
//! | `perf_measured` | name, region, cdn, metric | the measured value a region's shift uses (ms, bit/s or a ratio); absent without enough fresh samples |
//! | `perf_reason` | name, region, cdn, reason | 1 for the reason of the CDN's target share: `perf_band`, `perf_penalty`, `perf_floor`, `perf_stale` |
//! | `commit_month_to_date_bytes` | name, cdn | bytes a CDN with a contract or a capacity carried this calendar month, from the usage records (`POST /v1/usage`) |
//! | `commit_projection_bytes` | name, cdn | the month's bytes at its end if the time not covered goes at the recent rate; absent without records |
//! | `commit_burst_budget_samples` | name, cdn | p95 billing: five-minute samples above the cap still free this month (432 per 30 days, less those used) |
//! | `commit_bias_points` | name, cdn, reason | the commit bias in force (points of share), under the label of its reason: `none`, `commit_behind`, `cap_ahead`, `burst_budget`, `capacity` |
//! | `build_info` | version, commit | 1; the crate version and the git commit built (`unknown` outside a checkout) |
//! | `process_*` (no prefix) | | the standard process metrics (Linux): CPU seconds, resident and virtual memory, open and max fds, threads, start time |
//!
//! (¹) Every answer our handler gives. A packet hickory cannot decode at all (e.g. an
//! ECS option of unknown family) is answered `FORMERR` by hickory before any handler
//! runs, and is neither counted nor timed.
//!
//! (²) Read from the plan being served when `/metrics` is scraped, as are the steered
//! `queries_total` series: the data plane keeps no prometheus child per (name, region,
//! CDN), which at 1,000 names × 20 regions × 3 CDNs would be 120,000 of them.
//!
//! Every label set is bounded by the configuration (names × regions × CDNs, vantage
//! points, a fixed set of rcodes and reason classes); a client address is never a label,
//! and a peer is labelled by its configured URL, never by what it answers.

use std::cell::RefCell;
use std::fmt;
use std::sync::{Arc, Mutex};

use prometheus::core::Collector;
use prometheus::{
    exponential_buckets, Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

mod catalogue;
mod control;
mod data;
mod labels;
mod steered;

pub use catalogue::Family;
pub use labels::{rcode_name, reason_class};
use steered::{effective_weights, label, Tally};

/// The prefix of our families' names (`steerdns_…`), which the registry adds as it
/// gathers them.
const PREFIX: &str = "steerdns";

/// The content type of [`Metrics::encode`]'s output (`text/plain; version=0.0.4`).
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// The rcodes counted through a pre-resolved counter (no label lookup).
const COMMON_RCODES: [u16; 7] = [0, 1, 2, 3, 4, 5, 16];

/// The metrics of one process. Cheap to clone: every clone updates the same registry.
/// The dnstap writer's counters (`steerdns_dnstap_*`), which the data plane's tap and
/// the writer thread keep.
#[derive(Clone)]
pub struct DnstapCounters {
    /// Frames written to the collector.
    pub frames: IntCounter,
    /// Frames dropped: no free record, or lost with a failed write.
    pub dropped: IntCounter,
    /// 1 while connected to the collector.
    pub connected: IntGauge,
}

#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    /// Our own registry (not the global default), so tests and several servers in one
    /// process each have theirs.
    registry: Registry,
    /// The standard `process_*` families, which carry no `steerdns_` prefix (dashboards
    /// and alerts written for any exporter read them by these names).
    process: Registry,
    /// A handle on every family registered, for [`Metrics::catalogue`] (the registry
    /// lists only the families that have series).
    catalogue: Vec<Box<dyn Collector>>,
    queries: IntCounterVec,
    /// The steered part of `queries_total`, added at scrape time.
    tally: Mutex<Tally>,
    /// `queries_total{name="",region="",cdn="",rcode=R}` for each of `COMMON_RCODES`.
    unsteered: [IntCounter; COMMON_RCODES.len()],
    duration: Histogram,
    probes: IntCounterVec,
    cdn_up: IntGaugeVec,
    transitions: IntCounterVec,
    removed: IntGaugeVec,
    fail_open: IntGaugeVec,
    fail_open_events: IntCounterVec,
    vantage_unhappy: IntGaugeVec,
    reloads_applied: IntCounter,
    reloads_refused: IntCounter,
    config_info: IntGaugeVec,
    drains: IntGaugeVec,
    /// `udp_dropped_total{reason}` for each of `UDP_DROP_REASONS`.
    udp_dropped: [IntCounter; UDP_DROP_REASONS.len()],
    /// `rate_limited_total{action}`: `dropped`, `slipped`, `badcookie`.
    rate_limited: [IntCounter; 3],
    /// `cookies_total{result}` for each of `COOKIE_RESULTS`.
    cookies: [IntCounter; COOKIE_RESULTS.len()],
    tcp_connections: IntGauge,
    /// `tcp_closed_total{reason}` for each of `TCP_CLOSE_REASONS`.
    tcp_closed: [IntCounter; TCP_CLOSE_REASONS.len()],
    peer_errors: IntCounterVec,
    state_save_errors: IntCounter,
    udp_thread_restarts: IntCounter,
    dnstap: DnstapCounters,
    state_save_failing: prometheus::IntGauge,
    etcd_fail_static: prometheus::IntGauge,
    etcd_refused: prometheus::IntGauge,
    etcd_skew: prometheus::Gauge,
    state_load_errors: IntCounterVec,
    steering_responses: IntCounterVec,
    steering_refused: IntCounterVec,
    rum_samples: IntCounterVec,
    perf_measured: prometheus::GaugeVec,
    perf_reason: IntGaugeVec,
    commit_mtd: prometheus::GaugeVec,
    commit_projection: prometheus::GaugeVec,
    commit_burst: IntGaugeVec,
    commit_bias: prometheus::GaugeVec,
}

/// The crate version, as in `steerdns_build_info{version}`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit built (`build.rs`: `STEERDNS_COMMIT`, else `git rev-parse`, else
/// `unknown`), as in `steerdns_build_info{commit}`.
pub const COMMIT: &str = env!("STEERDNS_COMMIT");

/// Why a UDP datagram got no answer (besides rate limiting).
pub const UDP_DROP_REASONS: [&str; 4] = ["oversized", "bad-source", "send-error", "send-timeout"];
/// The `result` label values of `cookies_total` (`dns::cookie`).
pub const COOKIE_RESULTS: [&str; 4] = ["client_only", "valid", "invalid", "malformed"];
/// Why steerdns closed a TCP connection (`client`: the client closed it).
pub const TCP_CLOSE_REASONS: [&str; 7] = [
    "client",
    "idle",
    "query-limit",
    "over-connection-limit",
    "over-source-limit",
    "no-answer",
    "error",
];

// === impl Metrics ===

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// A fresh registry with every family registered.
    pub fn new() -> Metrics {
        let registry = Registry::new_custom(Some(PREFIX.into()), None)
            .expect("static registry prefix is valid");
        let reg = Reg::new(&registry);

        let queries = reg.counters(
            "queries_total",
            "DNS answers; name, region and cdn are set for steered answers only.",
            &["name", "region", "cdn", "rcode"],
        );
        let unsteered =
            COMMON_RCODES.map(|rc| queries.with_label_values(&["", "", "", rcode_name(rc)]));
        let duration = Histogram::with_opts(
            HistogramOpts::new(
                "query_duration_seconds",
                "Time to answer a DNS query, from the received bytes to the response's bytes \
                 (UDP fast path: the mean over its receive batch).",
            )
            // 1 µs, 2 µs, ... 8.192 ms.
            .buckets(exponential_buckets(1e-6, 2.0, 14).expect("static buckets")),
        )
        .expect("static histogram definition");
        reg.add(duration.clone());
        let state_save_failing = prometheus::IntGauge::new(
            "state_save_failing",
            "1 while the latest save of the state file failed (it is retried; the state is kept in memory).",
        )
        .expect("static gauge");
        reg.add(state_save_failing.clone());
        let etcd_fail_static = prometheus::IntGauge::new(
            "etcd_fail_static",
            "1 while this node of a set (--etcd) cannot reach etcd: it keeps the last shared \
             state and starts no demotion; 0 otherwise (and without --etcd).",
        )
        .expect("static gauge");
        reg.add(etcd_fail_static.clone());
        let etcd_refused = prometheus::IntGauge::new(
            "etcd_refused_keys",
            "Keys under the etcd prefix refused now (bad form, a CDN or name outside the policy): \
             they do not count.",
        )
        .expect("static gauge");
        reg.add(etcd_refused.clone());
        let etcd_skew = prometheus::Gauge::new(
            "etcd_clock_skew_seconds",
            "This node's clock against etcd's, from the Date of etcd's answers (positive: \
             etcd is ahead; about 0.1 s precise). Timelines are scheduled by the clock: keep \
             every node on NTP.",
        )
        .expect("static gauge");
        reg.add(etcd_skew.clone());
        let state_save_errors = IntCounter::new(
            "state_save_errors_total",
            "Failed saves of the state file (unwritable, disk full, ...); each is retried.",
        )
        .expect("static counter");
        reg.add(state_save_errors.clone());
        let udp_thread_restarts = IntCounter::new(
            "udp_thread_restarts_total",
            "UDP threads that panicked and were restarted on their socket (a bug: see the log).",
        )
        .expect("static counter");
        reg.add(udp_thread_restarts.clone());
        let dnstap = DnstapCounters {
            frames: IntCounter::new(
                "dnstap_frames_total",
                "dnstap frames (AUTH_QUERY, AUTH_RESPONSE) written to the collector (--dnstap).",
            )
            .expect("static counter"),
            dropped: IntCounter::new(
                "dnstap_dropped_total",
                "dnstap frames dropped: the queue to the writer was full (a slow or absent \
                 collector), or the collector went away while they were written.",
            )
            .expect("static counter"),
            connected: IntGauge::new(
                "dnstap_connected",
                "1 while the dnstap writer is connected to its collector.",
            )
            .expect("static gauge"),
        };
        reg.add(dnstap.frames.clone());
        reg.add(dnstap.dropped.clone());
        reg.add(dnstap.connected.clone());
        reg.gauges(
            "build_info",
            "1; the version and the git commit of the steerdns binary.",
            &["version", "commit"],
        )
        .with_label_values(&[VERSION, COMMIT])
        .set(1);
        let reloads = reg.counters(
            "config_reloads_total",
            "Configuration reloads by result (applied, or refused: the last good one keeps serving).",
            &["result"],
        );

        Metrics {
            inner: Arc::new(Inner {
                queries,
                tally: Mutex::default(),
                unsteered,
                duration,
                probes: reg.counters(
                    "probe_results_total",
                    "Probe rounds of this vantage point by CDN and result (ok, or the reason class).",
                    &["cdn", "vantage", "result"],
                ),
                cdn_up: reg.gauges(
                    "cdn_up",
                    "1 while the CDN is up, 0 while it is marked down (quorum and hysteresis).",
                    &["cdn"],
                ),
                transitions: reg.counters(
                    "health_transitions_total",
                    "Health changes of a CDN; to=\"down\" is a demotion (quorum reached).",
                    &["cdn", "to"],
                ),
                removed: reg.gauges(
                    "failover_removed_percent",
                    "Percent of the CDN's configured weight removed by failover steps.",
                    &["name", "cdn"],
                ),
                fail_open: reg.gauges(
                    "fail_open",
                    "1 while the region answers with configured weights because every CDN is out.",
                    &["name", "region"],
                ),
                fail_open_events: reg.counters(
                    "fail_open_events_total",
                    "Times the region started failing open.",
                    &["name", "region"],
                ),
                vantage_unhappy: reg.gauges(
                    "vantage_unhappy",
                    "1 while the vantage point is unhappy (stale, warming up, everything failing): \
                     its failures do not count; this is not a demotion.",
                    &["vantage"],
                ),
                reloads_applied: reloads.with_label_values(&["applied"]),
                reloads_refused: reloads.with_label_values(&["refused"]),
                config_info: reg.gauges(
                    "config_info",
                    "1 for the version (hash of the input files) of the configuration being served.",
                    &["version"],
                ),
                drains: reg.gauges(
                    "drains_active",
                    "1 while an operator drain of the CDN applies to the name.",
                    &["name", "cdn"],
                ),
                udp_dropped: {
                    let v = reg.counters(
                        "udp_dropped_total",
                        "UDP queries not answered: oversized (> 4096 bytes), bad-source (port 0, \
                         unspecified or broadcast), send-error, send-timeout (the send \
                         buffer stayed full, or the batch took too long to send).",
                        &["reason"],
                    );
                    UDP_DROP_REASONS.map(|r| v.with_label_values(&[r]))
                },
                rate_limited: {
                    let v = reg.counters(
                        "rate_limited_total",
                        "UDP queries over the response rate limit: dropped, slipped (answered \
                         truncated so that real clients retry over TCP), or badcookie (a \
                         client that sent a DNS cookie answered BADCOOKIE with a fresh server \
                         cookie instead of the slip).",
                        &["action"],
                    );
                    ["dropped", "slipped", "badcookie"].map(|a| v.with_label_values(&[a]))
                },
                cookies: {
                    let v = reg.counters(
                        "cookies_total",
                        "DNS queries (UDP and TCP) with a COOKIE option (RFC 7873), by what it \
                         held: client_only (a client cookie alone), valid (a server cookie of \
                         ours, under the current or previous secret, within its hour), \
                         invalid (a server cookie not ours, expired, or from the future: \
                         answered with a fresh one), malformed (a wrong length: FORMERR).",
                        &["result"],
                    );
                    COOKIE_RESULTS.map(|r| v.with_label_values(&[r]))
                },
                tcp_connections: {
                    let g = IntGauge::new("tcp_connections", "Open DNS-over-TCP connections.")
                        .expect("static gauge");
                    reg.add(g.clone());
                    g
                },
                tcp_closed: {
                    let v = reg.counters(
                        "tcp_closed_total",
                        "DNS-over-TCP connections ended, by reason: client, idle (timeout), \
                         query-limit, over-connection-limit and over-source-limit (refused \
                         at accept), no-answer (a frame that gets no answer), error.",
                        &["reason"],
                    );
                    TCP_CLOSE_REASONS.map(|r| v.with_label_values(&[r]))
                },
                peer_errors: reg.counters(
                    "peer_errors_total",
                    "Readings of a peer vantage point refused (timeout, connect, status, http, \
                     too_large, invalid): the peer is unhappy and its observations do not count.",
                    &["peer", "reason"],
                ),
                state_save_errors,
                udp_thread_restarts,
                dnstap,
                state_save_failing,
                etcd_fail_static,
                etcd_refused,
                etcd_skew,
                state_load_errors: reg.counters(
                    "state_load_errors_total",
                    "Saved states not restored at startup (corrupt: set aside; unreadable): \
                     the server started from the configured weights.",
                    &["reason"],
                ),
                steering_responses: reg.counters(
                    "steering_responses_total",
                    "Content steering manifests served (--steering-http), by name, the client's \
                     region and the pathway listed first.",
                    &["name", "region", "pathway"],
                ),
                steering_refused: reg.counters(
                    "steering_refused_total",
                    "Content steering requests refused, by status: 400 (malformed), 404 (not a \
                     steered name, another path), 405 (another method).",
                    &["status"],
                ),
                rum_samples: reg.counters(
                    "rum_samples_total",
                    "Performance samples (beacons on POST /rum/{name}, steering polls' throughput) \
                     by result: accepted, refused_share (one network over its share of a cell), \
                     refused_rate (beacons over a network's rate, 429), invalid (beacons refused \
                     400 or 413), unused (the client's region has no performance block).",
                    &["result"],
                ),
                perf_measured: {
                    let v = prometheus::GaugeVec::new(
                        Opts::new(
                            "perf_measured",
                            "The measured value a region's performance shift compares (ms for \
                             ttfb_p75, bit/s for throughput_p25, a ratio for error_rate); absent \
                             without enough fresh samples.",
                        ),
                        &["name", "region", "cdn", "metric"],
                    )
                    .expect("static gauge");
                    reg.add(v.clone());
                    v
                },
                perf_reason: reg.gauges(
                    "perf_reason",
                    "1 for the reason of a CDN's target share in a region with a performance \
                     block: perf_band, perf_penalty, perf_floor or perf_stale.",
                    &["name", "region", "cdn", "reason"],
                ),
                commit_mtd: reg.float_gauges(
                    "commit_month_to_date_bytes",
                    "Bytes a CDN with a contract or a capacity carried this calendar month, from \
                     the usage records.",
                    &["name", "cdn"],
                ),
                commit_projection: reg.float_gauges(
                    "commit_projection_bytes",
                    "The month's bytes at its end if the time not covered goes at the recent \
                     rate; absent without records.",
                    &["name", "cdn"],
                ),
                commit_burst: reg.gauges(
                    "commit_burst_budget_samples",
                    "p95 billing: five-minute samples above the cap still free this month.",
                    &["name", "cdn"],
                ),
                commit_bias: reg.float_gauges(
                    "commit_bias_points",
                    "The commit bias in force (points of share), labelled with its reason: none, \
                     commit_behind, cap_ahead, burst_budget or capacity.",
                    &["name", "cdn", "reason"],
                ),
                catalogue: reg.kept.into_inner(),
                registry,
                process: process_registry(),
            }),
        }
    }

    /// Every family in the Prometheus text format.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let mut families = self.inner.registry.gather();
        families.extend(self.inner.process.gather());
        let (steered, serving) = {
            let mut tally = self.inner.tally.lock().unwrap_or_else(|e| e.into_inner());
            (tally.counts(), tally.held.last().cloned())
        };
        if let Some(snapshot) = serving {
            families.push(effective_weights(&snapshot.plan));
            if let Some(until) = snapshot.signed_until {
                families.push(signature_expiry(until, crate::clock::now_secs()));
            }
        }
        families.sort_by(|a, b| a.name().cmp(b.name()));
        if let Some(f) = families
            .iter_mut()
            .find(|f| f.name() == "steerdns_queries_total")
        {
            let mut series: Vec<_> = steered.into_iter().collect();
            series.sort_unstable();
            for ((name, region, cdn), n) in series {
                let mut m = prometheus::proto::Metric::from_label(vec![
                    label("cdn", &cdn),
                    label("name", &name),
                    label("rcode", "NOERROR"),
                    label("region", &region),
                ]);
                let mut c = prometheus::proto::Counter::default();
                c.set_value(n as f64);
                m.set_counter(c);
                f.mut_metric().push(m);
            }
        }
        let mut buf = Vec::with_capacity(8 * 1024);
        TextEncoder::new()
            .encode(&families, &mut buf)
            .map_err(|e| format!("cannot encode metrics: {e}"))?;
        Ok(buf)
    }
}

/// `steerdns_dnssec_signature_expiry_seconds`: how long the signatures being served
/// remain valid, read from the snapshot when `/metrics` is scraped.
fn signature_expiry(until: u64, now: u64) -> prometheus::proto::MetricFamily {
    let mut family = signature_expiry_family();
    let mut m = prometheus::proto::Metric::default();
    let mut g = prometheus::proto::Gauge::default();
    g.set_value(until as f64 - now as f64);
    m.set_gauge(g);
    family.mut_metric().push(m);
    family
}

/// The family of [`signature_expiry`], without its one series.
fn signature_expiry_family() -> prometheus::proto::MetricFamily {
    let mut family = prometheus::proto::MetricFamily::default();
    family.set_name("steerdns_dnssec_signature_expiry_seconds".into());
    family.set_help(
        "Seconds until the DNSSEC signatures being served expire (negative: expired).".into(),
    );
    family.set_field_type(prometheus::proto::MetricType::GAUGE);
    family
}

/// A registry without prefix holding the `process_*` collector (Linux only: it reads
/// `/proc/self`; elsewhere the registry stays empty).
fn process_registry() -> Registry {
    let registry = Registry::new();
    #[cfg(target_os = "linux")]
    registry
        .register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .expect("registered once");
    registry
}

/// Registers families in one registry and keeps a handle on each, for
/// [`Metrics::catalogue`]; every definition is static, so a failure is a programming
/// error caught by the unit tests.
struct Reg<'r> {
    registry: &'r Registry,
    kept: RefCell<Vec<Box<dyn Collector>>>,
}

impl<'r> Reg<'r> {
    fn new(registry: &'r Registry) -> Self {
        Reg {
            registry,
            kept: RefCell::default(),
        }
    }

    fn add<C: Collector + Clone + 'static>(&self, c: C) -> C {
        self.registry
            .register(Box::new(c.clone()))
            .expect("registered once");
        self.kept.borrow_mut().push(Box::new(c.clone()));
        c
    }

    fn counters(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(IntCounterVec::new(Opts::new(name, help), labels).expect("static counter"))
    }

    fn float_gauges(&self, name: &str, help: &str, labels: &[&str]) -> prometheus::GaugeVec {
        self.add(prometheus::GaugeVec::new(Opts::new(name, help), labels).expect("static gauge"))
    }

    fn gauges(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.add(IntGaugeVec::new(Opts::new(name, help), labels).expect("static gauge"))
    }
}

#[cfg(test)]
mod tests;
