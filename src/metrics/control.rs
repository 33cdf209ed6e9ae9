//! Control plane: the typed updates of the families the controller, the prober, the
//! peers, the saver and a node of a set report.

use super::{reason_class, Metrics};

impl Metrics {
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

    /// A change of the API tokens file: the tokens in force changed, or the file was
    /// refused (the last good tokens kept).
    pub fn tokens_reload(&self, applied: bool) {
        match applied {
            true => self.inner.tokens_applied.inc(),
            false => self.inner.tokens_refused.inc(),
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

    /// The policy version in force; the only `policy_info` series.
    pub fn policy_version(&self, version: &str) {
        self.inner.policy_info.reset();
        self.inner.policy_info.with_label_values(&[version]).set(1);
    }

    /// Whether this node refuses the set's policy version (it cannot load it).
    pub fn policy_refused(&self, on: bool) {
        self.inner.policy_refused.set(i64::from(on));
    }

    /// Counts an edit of the policy file the set did not take.
    pub fn policy_file_refused(&self) {
        self.inner.policy_file_refused.inc();
    }

    /// The percent of client networks a staged rollout's new version answers.
    pub fn policy_rollout_percent(&self, percent: f64) {
        self.inner.policy_rollout_percent.set(percent);
    }

    /// Counts a staged rollout this node halted by itself.
    pub fn policy_rollout_halted(&self) {
        self.inner.policy_rollout_halts.inc();
    }

    /// Whether the audit log cannot be written.
    pub fn audit_failing(&self, on: bool) {
        self.inner.audit_failing.set(i64::from(on));
    }

    /// The seq of the last entry of the audit log (its head).
    pub fn audit_head(&self, seq: u64) {
        self.inner
            .audit_head_seq
            .set(i64::try_from(seq).unwrap_or(i64::MAX));
    }

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
}
