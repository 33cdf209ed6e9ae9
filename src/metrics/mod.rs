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
//! | `api_tokens_reloads_total` | result | changes of the tokens file: `applied` (with the reload, or on its own while the rest was refused) or `refused` (the last good tokens kept) |
//! | `config_info` | version | 1 for the configuration being served |
//! | `policy_info` | version | 1 for the policy version in force |
//! | `policy_refused` | | 1 while this node cannot load the set's policy version |
//! | `policy_file_refused_total` | | edits of the policy file the set did not take |
//! | `policy_rollout_percent` | | percent of client networks a staged rollout's new version answers |
//! | `policy_rollout_halts_total` | | staged rollouts this node halted by itself |
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
//! | `audit_failing` | | 1 while the audit log cannot be written or opened: every mutation is refused (503) |
//! | `audit_head_seq` | | the seq of the last entry of the audit log (its head; the hash is in `/v1/state` and the set's store, not a label) |
//! | `etcd_fail_static` | | 1 while a node of a set (`--etcd`) cannot reach etcd: it serves the last shared state, starts no demotion |
//! | `etcd_refused_keys` | | keys under the prefix refused (bad form, unknown CDN or name, a writer outside `--members`, over a size or count cap, a drain over the scope cap): they do not count |
//! | `etcd_clock_skew_seconds` | | this node's clock against etcd's, as etcd's answers date them (positive: etcd is ahead); a set needs NTP |
//! | `steering_responses_total` | name, region, pathway | content steering manifests served, by the pathway listed first |
//! | `steering_refused_total` | status | content steering requests refused: 400, 404 or 405 |
//! | `dnssec_signature_expiry_seconds` | | seconds until the DNSSEC signatures served expire (signed zones only; read from the snapshot at scrape time) |
//! | `rum_samples_total` | result | performance samples (beacons, steering polls): `accepted`, `refused_share` (one network over 5 % of a cell, or a new network in a bucket already keeping 4,096), `refused_rate` (beacons or polls' samples over a network's rate), `refused_ticket` (no valid ticket: beacons 403, polls' samples dropped), `refused_budget` (the process-wide budget of sample memory spent), `invalid` (beacons refused 400/413/415), `unused` (a region without `performance:`), `probe` (probe rounds with `--vantage-address`) |
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

mod catalogue;
mod control;
mod data;
mod labels;
mod steered;
pub use catalogue::Family;
pub use labels::{rcode_name, reason_class};
mod registry;
#[cfg(test)]
mod tests;
pub use registry::*;
