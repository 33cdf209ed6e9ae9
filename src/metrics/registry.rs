//! Both planes: `Metrics`, the registry of every family `/metrics` serves, and the
//! label sets they share.
//! (The main room of its folder; the folder's door, `mod.rs`, says what else lives there.)

use super::*;
use std::cell::RefCell;
use std::fmt;
use std::sync::{Arc, Mutex};

use prometheus::core::Collector;
use prometheus::{
    exponential_buckets, Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use super::steered::{effective_weights, label, Tally};

/// The prefix of our families' names (`steerdns_…`), which the registry adds as it
/// gathers them.
pub(super) const PREFIX: &str = "steerdns";

/// The content type of [`Metrics::encode`]'s output (`text/plain; version=0.0.4`).
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// The rcodes counted through a pre-resolved counter (no label lookup).
pub(super) const COMMON_RCODES: [u16; 7] = [0, 1, 2, 3, 4, 5, 16];

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
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    /// Our own registry (not the global default), so tests and several servers in one
    /// process each have theirs.
    pub(super) registry: Registry,
    /// The standard `process_*` families, which carry no `steerdns_` prefix (dashboards
    /// and alerts written for any exporter read them by these names).
    pub(super) process: Registry,
    /// A handle on every family registered, for [`Metrics::catalogue`] (the registry
    /// lists only the families that have series).
    pub(super) catalogue: Vec<Box<dyn Collector>>,
    pub(super) queries: IntCounterVec,
    /// The steered part of `queries_total`, added at scrape time.
    pub(super) tally: Mutex<Tally>,
    /// `queries_total{name="",region="",cdn="",rcode=R}` for each of `COMMON_RCODES`.
    pub(super) unsteered: [IntCounter; COMMON_RCODES.len()],
    pub(super) duration: Histogram,
    pub(super) probes: IntCounterVec,
    pub(super) cdn_up: IntGaugeVec,
    pub(super) transitions: IntCounterVec,
    pub(super) removed: IntGaugeVec,
    pub(super) fail_open: IntGaugeVec,
    pub(super) fail_open_events: IntCounterVec,
    pub(super) vantage_unhappy: IntGaugeVec,
    pub(super) reloads_applied: IntCounter,
    pub(super) reloads_refused: IntCounter,
    /// `api_tokens_reloads_total{result}`: `applied`, `refused`.
    pub(super) tokens_applied: IntCounter,
    pub(super) tokens_refused: IntCounter,
    pub(super) config_info: IntGaugeVec,
    pub(super) drains: IntGaugeVec,
    /// `udp_dropped_total{reason}` for each of `UDP_DROP_REASONS`.
    pub(super) udp_dropped: [IntCounter; UDP_DROP_REASONS.len()],
    /// `rate_limited_total{action}`: `dropped`, `slipped`, `badcookie`.
    pub(super) rate_limited: [IntCounter; 3],
    /// `cookies_total{result}` for each of `COOKIE_RESULTS`.
    pub(super) cookies: [IntCounter; COOKIE_RESULTS.len()],
    pub(super) tcp_connections: IntGauge,
    /// `tcp_closed_total{reason}` for each of `TCP_CLOSE_REASONS`.
    pub(super) tcp_closed: [IntCounter; TCP_CLOSE_REASONS.len()],
    pub(super) peer_errors: IntCounterVec,
    pub(super) state_save_errors: IntCounter,
    pub(super) udp_thread_restarts: IntCounter,
    pub(super) dnstap: DnstapCounters,
    pub(super) state_save_failing: prometheus::IntGauge,
    pub(super) etcd_fail_static: prometheus::IntGauge,
    pub(super) audit_failing: prometheus::IntGauge,
    pub(super) audit_head_seq: prometheus::IntGauge,
    pub(super) policy_info: IntGaugeVec,
    pub(super) policy_refused: prometheus::IntGauge,
    pub(super) policy_file_refused: prometheus::IntCounter,
    pub(super) policy_rollout_percent: prometheus::Gauge,
    pub(super) policy_rollout_halts: prometheus::IntCounter,
    pub(super) etcd_refused: prometheus::IntGauge,
    pub(super) etcd_skew: prometheus::Gauge,
    pub(super) state_load_errors: IntCounterVec,
    pub(super) steering_responses: IntCounterVec,
    pub(super) steering_refused: IntCounterVec,
    pub(super) rum_samples: IntCounterVec,
    pub(super) perf_measured: prometheus::GaugeVec,
    pub(super) perf_reason: IntGaugeVec,
    pub(super) commit_mtd: prometheus::GaugeVec,
    pub(super) commit_projection: prometheus::GaugeVec,
    pub(super) commit_burst: IntGaugeVec,
    pub(super) commit_bias: prometheus::GaugeVec,
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
        let audit_failing = prometheus::IntGauge::new(
            "audit_failing",
            "1 while the audit log (STATE_DIR/audit.jsonl) cannot be written or opened: every \
             mutation is refused (503), so that nothing changes unaudited.",
        )
        .expect("static gauge");
        reg.add(audit_failing.clone());
        let audit_head_seq = prometheus::IntGauge::new(
            "audit_head_seq",
            "The seq of the last entry of this node's audit log (its head; 0 without one). \
             The head's hash is in /v1/state (audit.head) and, in a set, in the store under \
             audit-head/{node}: not a label, which would make a new series per entry.",
        )
        .expect("static gauge");
        reg.add(audit_head_seq.clone());
        let policy_refused = prometheus::IntGauge::new(
            "policy_refused",
            "1 while this node cannot load the set's policy version against its own zones, geo \
             database and probes: it keeps serving the last good version.",
        )
        .expect("static gauge");
        reg.add(policy_refused.clone());
        let policy_file_refused = prometheus::IntCounter::new(
            "policy_file_refused_total",
            "Edits of this node's policy file the set did not take: based on a version the set \
             has moved past (the file then differs from the version in force).",
        )
        .expect("static counter");
        reg.add(policy_file_refused.clone());
        let policy_rollout_percent = prometheus::Gauge::new(
            "policy_rollout_percent",
            "During a staged policy rollout, the percent of client networks the new version \
             answers on this node (its stage); 0 without a rollout.",
        )
        .expect("static gauge");
        reg.add(policy_rollout_percent.clone());
        let policy_rollout_halts = prometheus::IntCounter::new(
            "policy_rollout_halts_total",
            "Staged policy rollouts this node halted by itself: it could not load the new \
             version, or the new version's error answers rose above the old one's.",
        )
        .expect("static counter");
        reg.add(policy_rollout_halts.clone());
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
             etcd is ahead; 0 unless the answers prove the clocks apart, then the smallest \
             offset they allow, within about 0.2 s), updated at each liveness check; NaN until \
             measured (and without --etcd). Timelines are scheduled by the clock: keep every \
             node on NTP.",
        )
        .expect("static gauge");
        // Not measured yet (and never without --etcd): NaN, not a skew of 0.
        etcd_skew.set(f64::NAN);
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
        let tokens_reloads = reg.counters(
            "api_tokens_reloads_total",
            "Changes of the API tokens file (--api-tokens) by result: applied (the tokens in force changed, with the reload or on their own while the rest of it was refused), or refused (a broken file: the last good tokens stay in force).",
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
                tokens_applied: tokens_reloads.with_label_values(&["applied"]),
                tokens_refused: tokens_reloads.with_label_values(&["refused"]),
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
                audit_failing,
                audit_head_seq,
                policy_refused,
                policy_file_refused,
                policy_rollout_percent,
                policy_rollout_halts,
                policy_info: reg.gauges(
                    "policy_info",
                    "1 for the policy version in force (the first 12 hex digits of the SHA-256 \
                     of its YAML): one version across the set outside an apply's window.",
                    &["version"],
                ),
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
                     refused_rate (beacons or polls over a network's rate), refused_ticket \
                     (no valid ticket for the name and region: beacons 403), refused_budget \
                     (the process-wide budget of sample memory is spent), invalid (beacons \
                     refused 400, 413 or 415), unused (the client's region has no \
                     performance block).",
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
pub(super) fn signature_expiry(until: u64, now: u64) -> prometheus::proto::MetricFamily {
    let mut family = signature_expiry_family();
    let mut m = prometheus::proto::Metric::default();
    let mut g = prometheus::proto::Gauge::default();
    g.set_value(until as f64 - now as f64);
    m.set_gauge(g);
    family.mut_metric().push(m);
    family
}

/// The family of [`signature_expiry`], without its one series.
pub(super) fn signature_expiry_family() -> prometheus::proto::MetricFamily {
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
pub(super) fn process_registry() -> Registry {
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
pub(super) struct Reg<'r> {
    pub(super) registry: &'r Registry,
    pub(super) kept: RefCell<Vec<Box<dyn Collector>>>,
}

impl<'r> Reg<'r> {
    pub(super) fn new(registry: &'r Registry) -> Self {
        Reg {
            registry,
            kept: RefCell::default(),
        }
    }

    pub(super) fn add<C: Collector + Clone + 'static>(&self, c: C) -> C {
        self.registry
            .register(Box::new(c.clone()))
            .expect("registered once");
        self.kept.borrow_mut().push(Box::new(c.clone()));
        c
    }

    pub(super) fn counters(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(IntCounterVec::new(Opts::new(name, help), labels).expect("static counter"))
    }

    pub(super) fn float_gauges(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> prometheus::GaugeVec {
        self.add(prometheus::GaugeVec::new(Opts::new(name, help), labels).expect("static gauge"))
    }

    pub(super) fn gauges(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.add(IntGaugeVec::new(Opts::new(name, help), labels).expect("static gauge"))
    }
}
