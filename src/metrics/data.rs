//! Data plane (and content steering): the typed updates of the families the answering
//! path and the steering server count. Each is an atomic add or a label lookup; none
//! allocates on the common path.

use std::sync::Arc;
use std::time::Duration;

use super::{
    rcode_name, Metrics, COMMON_RCODES, COOKIE_RESULTS, TCP_CLOSE_REASONS, UDP_DROP_REASONS,
};
use crate::plan::Snapshot;

impl Metrics {
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

    /// Counts a rate-limited query answered BADCOOKIE instead of the slip.
    pub fn rate_limited_badcookie(&self) {
        self.inner.rate_limited[2].inc();
    }

    /// Counts a query's COOKIE option by one of [`COOKIE_RESULTS`] (`None`: none).
    pub fn cookie(&self, result: Option<&str>) {
        if let Some(i) = result.and_then(|r| COOKIE_RESULTS.iter().position(|c| *c == r)) {
            self.inner.cookies[i].inc();
        }
    }

    /// The dnstap writer's counters (`steerdns_dnstap_*`).
    pub fn dnstap_counters(&self) -> super::DnstapCounters {
        self.inner.dnstap.clone()
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
}
