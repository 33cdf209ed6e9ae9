//! Both planes: the Prometheus metric families, in their own registry (prefix
//! `steerdns_`), and the typed methods that update them. The data plane counts answers
//! and times them; the control plane reports probe results, health, failover steps,
//! fail-open, drains and reloads. `/metrics` on `--api` serves [`Metrics::encode`].
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

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::{
    exponential_buckets, Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

mod labels;
mod steered;

pub use labels::{rcode_name, reason_class};
use steered::{effective_weights, label, Tally};

use crate::plan::Snapshot;

/// The content type of [`Metrics::encode`]'s output (`text/plain; version=0.0.4`).
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// The rcodes counted through a pre-resolved counter (no label lookup).
const COMMON_RCODES: [u16; 7] = [0, 1, 2, 3, 4, 5, 16];

/// The metrics of one process. Cheap to clone: every clone updates the same registry.
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
    /// `rate_limited_total{action="dropped"}` and `{action="slipped"}`.
    rate_limited: [IntCounter; 2],
    tcp_connections: IntGauge,
    /// `tcp_closed_total{reason}` for each of `TCP_CLOSE_REASONS`.
    tcp_closed: [IntCounter; TCP_CLOSE_REASONS.len()],
    peer_errors: IntCounterVec,
    state_save_errors: IntCounter,
    udp_thread_restarts: IntCounter,
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
        let registry = Registry::new_custom(Some("steerdns".into()), None)
            .expect("static registry prefix is valid");
        let reg = Reg(&registry);

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
        registry
            .register(Box::new(duration.clone()))
            .expect("registered once");
        let state_save_failing = prometheus::IntGauge::new(
            "state_save_failing",
            "1 while the latest save of the state file failed (it is retried; the state is kept in memory).",
        )
        .expect("static gauge");
        registry
            .register(Box::new(state_save_failing.clone()))
            .expect("registered once");
        let etcd_fail_static = prometheus::IntGauge::new(
            "etcd_fail_static",
            "1 while this node of a set (--etcd) cannot reach etcd: it keeps the last shared \
             state and starts no demotion; 0 otherwise (and without --etcd).",
        )
        .expect("static gauge");
        registry
            .register(Box::new(etcd_fail_static.clone()))
            .expect("registered once");
        let etcd_refused = prometheus::IntGauge::new(
            "etcd_refused_keys",
            "Keys under the etcd prefix refused now (bad form, a CDN or name outside the policy): \
             they do not count.",
        )
        .expect("static gauge");
        registry
            .register(Box::new(etcd_refused.clone()))
            .expect("registered once");
        let etcd_skew = prometheus::Gauge::new(
            "etcd_clock_skew_seconds",
            "This node's clock against etcd's, from the Date of etcd's answers (positive: \
             etcd is ahead; about 0.1 s precise). Timelines are scheduled by the clock: keep \
             every node on NTP.",
        )
        .expect("static gauge");
        registry
            .register(Box::new(etcd_skew.clone()))
            .expect("registered once");
        let state_save_errors = IntCounter::new(
            "state_save_errors_total",
            "Failed saves of the state file (unwritable, disk full, ...); each is retried.",
        )
        .expect("static counter");
        registry
            .register(Box::new(state_save_errors.clone()))
            .expect("registered once");
        let udp_thread_restarts = IntCounter::new(
            "udp_thread_restarts_total",
            "UDP threads that panicked and were restarted on their socket (a bug: see the log).",
        )
        .expect("static counter");
        registry
            .register(Box::new(udp_thread_restarts.clone()))
            .expect("registered once");
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
                        "UDP queries over the response rate limit: dropped, or slipped (answered \
                         truncated so that real clients retry over TCP).",
                        &["action"],
                    );
                    ["dropped", "slipped"].map(|a| v.with_label_values(&[a]))
                },
                tcp_connections: {
                    let g = IntGauge::new("tcp_connections", "Open DNS-over-TCP connections.")
                        .expect("static gauge");
                    registry
                        .register(Box::new(g.clone()))
                        .expect("registered once");
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
                    reg.0
                        .register(Box::new(v.clone()))
                        .expect("registered once");
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
                registry,
                process: process_registry(),
            }),
        }
    }

    // --- data plane ---

    /// Counts the steered answers of a snapshot the data plane is about to serve.
    /// The data plane counts them in the plan itself (`plan::Pick::count`, one atomic
    /// add); `/metrics` reads them there.
    pub fn adopt(&self, snapshot: &Arc<Snapshot>) {
        let mut tally = self.inner.tally.lock().unwrap_or_else(|e| e.into_inner());
        tally.fold_retired();
        tally.held.push(snapshot.clone());
    }

    /// Counts an answer that was not steered (zone data, or an error) by its rcode.
    ///
    /// # Hot path
    /// The common rcodes are one atomic add; others take a label lookup.
    pub fn answered(&self, rcode: u16) {
        match COMMON_RCODES.iter().position(|&rc| rc == rcode) {
            Some(i) => self.inner.unsteered[i].inc(),
            None => self
                .inner
                .queries
                .with_label_values(&["", "", "", rcode_name(rcode)])
                .inc(),
        }
    }

    /// Counts a UDP query left unanswered, by one of [`UDP_DROP_REASONS`].
    pub fn dropped(&self, reason: &str) {
        if let Some(i) = UDP_DROP_REASONS.iter().position(|r| *r == reason) {
            self.inner.udp_dropped[i].inc();
        }
    }

    /// Counts a query over the rate limit.
    pub fn rate_limited(&self, slipped: bool) {
        self.inner.rate_limited[usize::from(slipped)].inc();
    }

    /// Counts a UDP thread restarted after a panic.
    pub fn udp_thread_restarted(&self) {
        self.inner.udp_thread_restarts.inc();
    }

    /// One more (`+1`) or one fewer (`-1`) open TCP connection.
    pub fn tcp_connections(&self, delta: i64) {
        self.inner.tcp_connections.add(delta);
    }

    /// Counts a TCP connection ended, by one of [`TCP_CLOSE_REASONS`].
    pub fn tcp_closed(&self, reason: &str) {
        if let Some(i) = TCP_CLOSE_REASONS.iter().position(|r| *r == reason) {
            self.inner.tcp_closed[i].inc();
        }
    }

    /// Records a batch of `n` UDP queries answered one after the other in `elapsed`:
    /// each counts as taking the batch's mean.
    ///
    /// # Hot path
    /// Non-atomic adds into a local copy, merged with one atomic add per bucket.
    pub fn observe_batch(&self, elapsed: Duration, n: usize) {
        if n == 0 {
            return;
        }
        let each = elapsed.as_secs_f64() / n as f64;
        let local = self.inner.duration.local();
        for _ in 0..n {
            local.observe(each);
        }
        local.flush();
    }

    /// Records how long a query took.
    ///
    /// # Hot path
    /// One bucket search and atomic adds.
    pub fn observe(&self, elapsed: Duration) {
        self.inner.duration.observe(elapsed.as_secs_f64());
    }

    /// Counts a content steering manifest of `name` for a client in `region` that
    /// lists `pathway` first.
    pub fn steering_response(&self, name: &str, region: &str, pathway: &str) {
        self.inner
            .steering_responses
            .with_label_values(&[name, region, pathway])
            .inc();
    }

    /// Counts `n` performance samples by what became of them.
    pub fn rum_samples(&self, result: &str, n: u64) {
        if n > 0 {
            self.inner
                .rum_samples
                .with_label_values(&[result])
                .inc_by(n);
        }
    }

    /// Shows a CDN's measured value (removed when `None`) and the reason of its target
    /// share in a region with a performance block.
    pub fn perf_cdn(
        &self,
        name: &str,
        region: &str,
        cdn: &str,
        metric: &str,
        measured: Option<f64>,
        reason: &str,
    ) {
        let labels = [name, region, cdn, metric];
        match measured {
            Some(v) => self.inner.perf_measured.with_label_values(&labels).set(v),
            None => {
                let _ = self.inner.perf_measured.remove_label_values(&labels);
            }
        }
        for r in ["perf_band", "perf_penalty", "perf_floor", "perf_stale"] {
            self.inner
                .perf_reason
                .with_label_values(&[name, region, cdn, r])
                .set(i64::from(r == reason));
        }
    }

    /// Sets the commit gauges of a CDN with a contract or a capacity.
    #[allow(clippy::too_many_arguments)]
    pub fn commit_cdn(
        &self,
        name: &str,
        cdn: &str,
        month_to_date: f64,
        projection: Option<f64>,
        burst_left: Option<i64>,
        bias: f64,
        reason: &str,
    ) {
        let i = &self.inner;
        i.commit_mtd
            .with_label_values(&[name, cdn])
            .set(month_to_date);
        match projection {
            Some(p) => i.commit_projection.with_label_values(&[name, cdn]).set(p),
            None => {
                let _ = i.commit_projection.remove_label_values(&[name, cdn]);
            }
        }
        if let Some(b) = burst_left {
            i.commit_burst.with_label_values(&[name, cdn]).set(b);
        }
        for r in [
            "none",
            "commit_behind",
            "cap_ahead",
            "burst_budget",
            "capacity",
        ] {
            if r == reason {
                i.commit_bias.with_label_values(&[name, cdn, r]).set(bias);
            } else {
                let _ = i.commit_bias.remove_label_values(&[name, cdn, r]);
            }
        }
    }

    /// Counts a refused content steering request (4xx).
    pub fn steering_refused(&self, status: u16) {
        let status = match status {
            400 => "400",
            404 => "404",
            405 => "405",
            _ => "other",
        };
        self.inner
            .steering_refused
            .with_label_values(&[status])
            .inc();
    }

    // --- control plane ---

    /// Counts one probe round of this vantage point: `reason` is `None` when it passed,
    /// else the prober's reason (counted by its class, see [`reason_class`]).
    pub fn probe(&self, cdn: &str, vantage: &str, reason: Option<&str>) {
        let result = reason.map_or("ok", reason_class);
        self.inner
            .probes
            .with_label_values(&[cdn, vantage, result])
            .inc();
    }

    /// Creates the per-CDN counters at zero, so that `increase()` sees their first
    /// event. Call for every probed CDN at start and after a reload.
    pub fn cdn_probed(&self, cdn: &str) {
        for to in ["down", "up"] {
            self.inner.transitions.with_label_values(&[cdn, to]);
        }
    }

    /// The CDN's current health (at start, after a restore, after a transition).
    pub fn health(&self, cdn: &str, up: bool) {
        self.inner
            .cdn_up
            .with_label_values(&[cdn])
            .set(i64::from(up));
    }

    /// A health change: counts it (`to_down`: quorum reached, CDN demoted) and sets
    /// `cdn_up` to match.
    pub fn transition(&self, cdn: &str, to_down: bool) {
        let to = if to_down { "down" } else { "up" };
        self.inner.transitions.with_label_values(&[cdn, to]).inc();
        self.health(cdn, !to_down);
    }

    /// The percent of `cdn`'s weight that failover steps have removed for `name`.
    pub fn removed(&self, name: &str, cdn: &str, percent: u8) {
        self.inner
            .removed
            .with_label_values(&[name, cdn])
            .set(i64::from(percent));
    }

    /// Whether the region fails open. Idempotent: a change from off (or never set) to
    /// on counts one event, however often the same state is reported.
    pub fn fail_open(&self, name: &str, region: &str, on: bool) {
        let gauge = self.inner.fail_open.with_label_values(&[name, region]);
        if on && gauge.get() == 0 {
            self.inner
                .fail_open_events
                .with_label_values(&[name, region])
                .inc();
        }
        gauge.set(i64::from(on));
    }

    /// Whether a vantage point (this one or a peer) is unhappy: its failures do not
    /// count towards a demotion. Not a CDN problem.
    pub fn vantage_unhappy(&self, vantage: &str, unhappy: bool) {
        self.inner
            .vantage_unhappy
            .with_label_values(&[vantage])
            .set(i64::from(unhappy));
    }

    /// Drops the `vantage_unhappy` series of another vantage point that is no longer
    /// unhappy: the series of peers stay as many as the peers unhappy now.
    pub fn forget_vantage(&self, vantage: &str) {
        let _ = self.inner.vantage_unhappy.remove_label_values(&[vantage]);
    }

    /// Counts a reload: applied, or refused (the last good configuration keeps serving).
    pub fn reload(&self, applied: bool) {
        match applied {
            true => self.inner.reloads_applied.inc(),
            false => self.inner.reloads_refused.inc(),
        }
    }

    /// The version of the configuration being served; the only `config_info` series.
    pub fn config_version(&self, version: &str) {
        self.inner.config_info.reset();
        self.inner.config_info.with_label_values(&[version]).set(1);
    }

    /// Whether an operator drain of `cdn` applies to `name`.
    pub fn drain_active(&self, name: &str, cdn: &str, on: bool) {
        self.inner
            .drains
            .with_label_values(&[name, cdn])
            .set(i64::from(on));
    }

    /// Counts a refused reading of the peer at `peer` (its configured URL) by `reason`
    /// (`timeout`, `connect`, `status`, `http`, `too_large`, `invalid`).
    pub fn peer_error(&self, peer: &str, reason: &str) {
        self.inner
            .peer_errors
            .with_label_values(&[peer, reason])
            .inc();
    }

    /// The outcome of a save of the state file: a failure is counted, and
    /// `state_save_failing` follows the latest outcome.
    pub fn state_saved(&self, ok: bool) {
        if !ok {
            self.inner.state_save_errors.inc();
        }
        self.inner.state_save_failing.set(i64::from(!ok));
    }

    /// Whether this node fails static (a set's node without etcd).
    pub fn etcd_fail_static(&self, on: bool) {
        self.inner.etcd_fail_static.set(i64::from(on));
    }

    /// This node's clock against etcd's, milliseconds (positive: etcd is ahead).
    pub fn etcd_clock_skew(&self, ms: i64) {
        self.inner.etcd_skew.set(ms as f64 / 1000.0);
    }

    /// How many keys under the etcd prefix are refused now.
    pub fn etcd_refused_keys(&self, n: u64) {
        self.inner
            .etcd_refused
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Counts a saved state that could not be restored at startup (`corrupt`, `unreadable`).
    pub fn state_load_error(&self, reason: &str) {
        self.inner
            .state_load_errors
            .with_label_values(&[reason])
            .inc();
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
    let mut family = prometheus::proto::MetricFamily::default();
    family.set_name("steerdns_dnssec_signature_expiry_seconds".into());
    family.set_help(
        "Seconds until the DNSSEC signatures being served expire (negative: expired).".into(),
    );
    family.set_field_type(prometheus::proto::MetricType::GAUGE);
    let mut m = prometheus::proto::Metric::default();
    let mut g = prometheus::proto::Gauge::default();
    g.set_value(until as f64 - now as f64);
    m.set_gauge(g);
    family.mut_metric().push(m);
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

/// Registers families in one registry; every definition is static, so a failure is a
/// programming error caught by the unit tests.
struct Reg<'r>(&'r Registry);

impl Reg<'_> {
    fn counters(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        let v = IntCounterVec::new(Opts::new(name, help), labels).expect("static counter");
        self.0
            .register(Box::new(v.clone()))
            .expect("registered once");
        v
    }

    fn float_gauges(&self, name: &str, help: &str, labels: &[&str]) -> prometheus::GaugeVec {
        let v = prometheus::GaugeVec::new(Opts::new(name, help), labels).expect("static gauge");
        self.0
            .register(Box::new(v.clone()))
            .expect("registered once");
        v
    }

    fn gauges(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        let v = IntGaugeVec::new(Opts::new(name, help), labels).expect("static gauge");
        self.0
            .register(Box::new(v.clone()))
            .expect("registered once");
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngExt;

    fn text(m: &Metrics) -> String {
        String::from_utf8(m.encode().unwrap()).unwrap()
    }

    #[test]
    fn reason_classes_are_the_text_before_the_first_colon_or_space() {
        for (reason, class) in [
            ("timeout: no response in 3000 ms", "timeout"),
            ("timeout: body not complete in 500 ms", "timeout"),
            ("connect: cannot resolve a.example: failed", "connect"),
            ("tls: invalid peer certificate: UnknownIssuer", "tls"),
            ("status 503 (expected 200)", "status"),
            ("body mismatch: `healthy-v3` not found", "body"),
            ("slow: first byte after 900 ms (limit 800 ms)", "slow"),
            ("http: connection closed before message completed", "http"),
            ("client: builder error", "client"),
            ("status", "status"),
        ] {
            assert_eq!(reason_class(reason), class, "{reason}");
        }
    }

    #[test]
    fn unknown_reasons_are_other_so_the_label_set_stays_bounded() {
        for reason in ["", "weird", "https://x.example/ failed", "Timeout: x", ":"] {
            assert_eq!(reason_class(reason), "other", "{reason:?}");
        }
    }

    #[test]
    fn rcode_names_are_the_iana_mnemonics() {
        assert_eq!(rcode_name(0), "NOERROR");
        assert_eq!(rcode_name(3), "NXDOMAIN");
        assert_eq!(rcode_name(5), "REFUSED");
        assert_eq!(rcode_name(16), "BADVERS");
        assert_eq!(rcode_name(15), "UNKNOWN");
        assert_eq!(rcode_name(4095), "UNKNOWN");
    }

    #[test]
    fn encode_contains_every_family() {
        let m = Metrics::new();
        m.answered(3);
        m.observe(Duration::from_micros(30));
        m.probe("fastly", "ns1", Some("status 503 (expected 200)"));
        m.cdn_probed("fastly");
        m.transition("fastly", true);
        m.removed("www.example.com.", "fastly", 50);
        let snapshot = Arc::new(demo());
        m.adopt(&snapshot);
        m.fail_open("www.example.com.", "eu", true);
        m.vantage_unhappy("ns2", true);
        m.reload(false);
        m.config_version("abc123");
        m.drain_active("www.example.com.", "fastly", true);
        m.peer_error("http://ns2:9153/", "timeout");
        m.state_saved(false);
        m.state_load_error("corrupt");
        let t = text(&m);
        for family in [
            "steerdns_queries_total",
            "steerdns_query_duration_seconds",
            "steerdns_probe_results_total",
            "steerdns_cdn_up",
            "steerdns_health_transitions_total",
            "steerdns_failover_removed_percent",
            "steerdns_effective_weight",
            "steerdns_fail_open",
            "steerdns_fail_open_events_total",
            "steerdns_vantage_unhappy",
            "steerdns_config_reloads_total",
            "steerdns_config_info",
            "steerdns_drains_active",
            "steerdns_peer_errors_total",
            "steerdns_state_save_errors_total",
            "steerdns_state_save_failing",
            "steerdns_state_load_errors_total",
            "steerdns_etcd_fail_static",
            "steerdns_etcd_refused_keys",
            "steerdns_build_info",
        ] {
            assert!(
                t.contains(&format!("# TYPE {family} ")),
                "{family} missing from:\n{t}"
            );
        }
        for line in [
            r#"steerdns_queries_total{cdn="",name="",rcode="NXDOMAIN",region=""} 1"#,
            r#"steerdns_queries_total{cdn="",name="",rcode="REFUSED",region=""} 0"#,
            r#"steerdns_query_duration_seconds_count 1"#,
            r#"steerdns_query_duration_seconds_bucket{le="0.000032"} 1"#,
            r#"steerdns_query_duration_seconds_bucket{le="0.000016"} 0"#,
            r#"steerdns_probe_results_total{cdn="fastly",result="status",vantage="ns1"} 1"#,
            r#"steerdns_cdn_up{cdn="fastly"} 0"#,
            r#"steerdns_health_transitions_total{cdn="fastly",to="down"} 1"#,
            r#"steerdns_health_transitions_total{cdn="fastly",to="up"} 0"#,
            r#"steerdns_failover_removed_percent{cdn="fastly",name="www.example.com."} 50"#,
            r#"steerdns_fail_open{name="www.example.com.",region="eu"} 1"#,
            r#"steerdns_fail_open_events_total{name="www.example.com.",region="eu"} 1"#,
            r#"steerdns_vantage_unhappy{vantage="ns2"} 1"#,
            r#"steerdns_config_reloads_total{result="applied"} 0"#,
            r#"steerdns_config_reloads_total{result="refused"} 1"#,
            r#"steerdns_config_info{version="abc123"} 1"#,
            r#"steerdns_drains_active{cdn="fastly",name="www.example.com."} 1"#,
            r#"steerdns_peer_errors_total{peer="http://ns2:9153/",reason="timeout"} 1"#,
            r#"steerdns_state_save_errors_total 1"#,
            r#"steerdns_state_save_failing 1"#,
            r#"steerdns_state_load_errors_total{reason="corrupt"} 1"#,
        ] {
            assert!(
                t.lines().any(|l| l == line),
                "line `{line}` missing from:\n{t}"
            );
        }
    }

    #[test]
    fn build_info_and_the_process_families_are_served() {
        let t = text(&Metrics::new());
        let info = format!(r#"steerdns_build_info{{commit="{COMMIT}",version="{VERSION}"}} 1"#);
        assert!(t.lines().any(|l| l == info), "`{info}` missing from:\n{t}");
        assert!(!COMMIT.is_empty() && VERSION == env!("CARGO_PKG_VERSION"));
        #[cfg(target_os = "linux")]
        for family in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
        ] {
            // The standard names, without our prefix.
            assert!(
                t.contains(&format!("\n{family} ")),
                "{family} missing from:\n{t}"
            );
            assert!(!t.contains(&format!("steerdns_{family}")), "{t}");
        }
    }

    #[test]
    fn uncommon_rcodes_fall_back_to_a_labelled_counter() {
        let m = Metrics::new();
        m.answered(9);
        m.answered(9);
        m.answered(300);
        let t = text(&m);
        assert!(t.contains(r#"steerdns_queries_total{cdn="",name="",rcode="NOTAUTH",region=""} 2"#));
        assert!(t.contains(r#"steerdns_queries_total{cdn="",name="",rcode="UNKNOWN",region=""} 1"#));
    }

    /// The demo policy's snapshot (the tests read its names and regions from the plan).
    fn demo() -> Snapshot {
        demo_with(false)
    }

    /// A snapshot of the demo policy's steered name built from the plan layer alone
    /// (the planner is a layer above): www.example.com. on fastly and cloudflare in four
    /// regions, at the demo's weights or, with `fastly_out`, with fastly removed by
    /// failover (its whole share on cloudflare).
    fn demo_with(fastly_out: bool) -> Snapshot {
        use crate::config::{ContentSteering, Match, Selection};
        use crate::place::geo::GeoDb;
        use crate::plan::{ChoiceSpec, NameSpec, Plan, Reason, RegionIndex, Target};
        use hickory_proto::rr::Name;

        let regions: [(&str, &[&str], u64); 4] = [
            ("europe", &["GB", "IE", "DE", "FR", "NL", "ES", "IT"], 90),
            ("americas", &["US", "CA", "MX"], 85),
            ("apac", &["AU", "NZ", "SG", "JP"], 10),
            ("default", &["*"], 50),
        ];
        let matches: Vec<Vec<Match>> = regions
            .iter()
            .map(|(_, m, _)| m.iter().map(|m| Match::parse(m).unwrap()).collect())
            .collect();
        let choices = regions
            .iter()
            .map(|&(_, _, fastly)| match fastly_out {
                false => ChoiceSpec::new(Reason::Normal, [(0, fastly), (1, 100 - fastly)]),
                true => ChoiceSpec::new(Reason::Failover, [(0, 0), (1, 100)]),
            })
            .map(Option::unwrap)
            .collect();
        let target =
            |cdn: &str, cname: &str| Target::new(cdn.into(), Name::from_ascii(cname).unwrap());
        let name = NameSpec {
            name: Name::from_ascii("www.example.com.").unwrap(),
            ttl: 30,
            selection: Selection::Consistent,
            index: RegionIndex::new(matches.iter().map(Vec::as_slice)),
            regions: regions.iter().map(|(r, _, _)| (*r).into()).collect(),
            targets: vec![
                target("fastly", "example.map.fastly.net."),
                target("cloudflare", "example.cdn.cloudflare.net."),
            ],
            drain_scopes: Vec::new(),
            choices,
            content: ContentSteering::default(),
        };
        let geo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/geo/GeoIP2-Country-Test.mmdb");
        let geo = Arc::new(GeoDb::open(&geo).unwrap());
        Snapshot {
            plan: Plan::new(vec![name], geo.places()),
            geo,
            zones: Arc::new(hickory_server::zone_handler::Catalog::new()),
            signed_until: None,
            denials: None,
        }
    }

    /// Answers `n` times from region 0 of the snapshot's first name.
    fn answer(s: &Snapshot, n: usize) {
        let steered = s.plan.names().next().unwrap();
        let mut rng = rand::rng();
        for _ in 0..n {
            steered.pick(steered.choice(0), rng.random()).count();
        }
    }

    /// The sum of the steered series of region 0 of the demo's first name.
    fn steered_total(m: &Metrics, s: &Snapshot) -> u64 {
        let steered = s.plan.names().next().unwrap();
        let prefix = format!(
            r#"name="{}",rcode="NOERROR",region="{}"}} "#,
            steered.name(),
            steered.region_name(0)
        );
        text(m)
            .lines()
            .filter(|l| l.starts_with("steerdns_queries_total{") && l.contains(&prefix))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    }

    #[test]
    fn steered_counts_survive_new_plans_and_never_go_back() {
        let m = Metrics::new();
        let first = Arc::new(demo());
        m.adopt(&first);
        let t = text(&m);
        // Every (name, region, CDN) served has a series from the start.
        let steered = first.plan.names().next().unwrap();
        for (region, cdn, _) in steered.answered() {
            let series = format!(
                r#"steerdns_queries_total{{cdn="{cdn}",name="{}",rcode="NOERROR",region="{region}"}} 0"#,
                steered.name()
            );
            assert!(t.contains(&series), "{series} missing from\n{t}");
        }
        answer(&first, 10);
        assert_eq!(steered_total(&m, &first), 10);

        // A new plan while a query still holds the old one: both count.
        let second = Arc::new(demo());
        m.adopt(&second);
        answer(&first, 5);
        answer(&second, 3);
        assert_eq!(steered_total(&m, &first), 18);
        // The old plan's last reader goes: its counts move into the totals.
        drop(first);
        assert_eq!(steered_total(&m, &second), 18);
        assert_eq!(m.inner.tally.lock().unwrap().held.len(), 1);
        let third = Arc::new(demo());
        m.adopt(&third);
        drop(second);
        answer(&third, 2);
        assert_eq!(steered_total(&m, &third), 20);
        assert_eq!(m.inner.tally.lock().unwrap().held.len(), 1);
    }

    #[test]
    fn config_info_shows_only_the_current_version() {
        let m = Metrics::new();
        m.config_version("old");
        m.config_version("new");
        let t = text(&m);
        assert!(t.contains(r#"steerdns_config_info{version="new"} 1"#));
        assert!(!t.contains(r#"version="old""#), "{t}");
    }

    #[test]
    fn fail_open_counts_each_start_once() {
        let m = Metrics::new();
        let events = |m: &Metrics| {
            m.inner
                .fail_open_events
                .with_label_values(&["n.", "eu"])
                .get()
        };
        m.fail_open("n.", "eu", false);
        assert_eq!(events(&m), 0);
        m.fail_open("n.", "eu", true);
        m.fail_open("n.", "eu", true);
        assert_eq!(events(&m), 1);
        m.fail_open("n.", "eu", false);
        m.fail_open("n.", "eu", true);
        assert_eq!(events(&m), 2);
        assert_eq!(m.inner.fail_open.with_label_values(&["n.", "eu"]).get(), 1);
    }

    /// (region, CDN, percent) of every `effective_weight` series of www.example.com.
    fn shares(m: &Metrics) -> Vec<(String, String, f64)> {
        let prefix = "steerdns_effective_weight{cdn=\"";
        text(m)
            .lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .map(|l| {
                let (cdn, rest) = l.split_once('"').unwrap();
                let (_, rest) = rest.split_once("region=\"").unwrap();
                let (region, value) = rest.split_once("\"} ").unwrap();
                (region.to_string(), cdn.to_string(), value.parse().unwrap())
            })
            .collect()
    }

    #[test]
    fn effective_weights_are_those_of_the_plan_being_served() {
        let m = Metrics::new();
        assert!(shares(&m).is_empty(), "no plan served yet");
        let normal = Arc::new(demo());
        m.adopt(&normal);
        let before = shares(&m);
        let regions = normal.plan.names().next().unwrap().regions();
        // Every region, every CDN (two in the demo), adding up to 100 per region.
        assert_eq!(before.len(), regions * 2, "{before:?}");
        for (region, _, _) in &before {
            let total: f64 = before.iter().filter(|s| s.0 == *region).map(|s| s.2).sum();
            assert!((total - 100.0).abs() < 1e-9, "{region}: {total}");
        }
        assert!(
            before.iter().any(|s| s.1 == "fastly" && s.2 == 90.0),
            "{before:?}"
        );

        // fastly removed by failover: the newest plan is what the gauges show.
        let failed = Arc::new(demo_with(true));
        m.adopt(&failed);
        for (region, cdn, share) in shares(&m) {
            let want = if cdn == "fastly" { 0.0 } else { 100.0 };
            assert_eq!(share, want, "{region} / {cdn}");
        }
        drop((normal, failed));
    }

    #[test]
    fn clones_share_one_registry_and_instances_do_not() {
        let (a, b) = (Metrics::new(), Metrics::new());
        a.clone().reload(true);
        assert!(text(&a).contains(r#"steerdns_config_reloads_total{result="applied"} 1"#));
        assert!(text(&b).contains(r#"steerdns_config_reloads_total{result="applied"} 0"#));
    }
}
