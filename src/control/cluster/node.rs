//! Control plane: this node as a follower of the set (`serve --etcd`). The controller
//! holds a [`ClusterLink`] when it is a node of a set, and hands it what is shared:
//!
//! - the session's view ([`ClusterLink::on_shared`]): timelines, drains and freeze are
//!   applied to the [`ControlState`], the set's audit entries appended to the local log,
//!   keys that do not count counted ([`refused_keys`]);
//! - a health change of its own ([`ClusterLink::propose`]): the shared timeline of every
//!   name of the CDN is created or turned around in etcd, never applied here directly;
//! - an API change the controller validated ([`ClusterLink::write_drains`],
//!   [`ClusterLink::write_undrain`], [`ClusterLink::write_freeze`],
//!   [`ClusterLink::write_resume`]): written to etcd, applied from the watch like any
//!   other node's.
//!
//! The view applied is the one kept ([`ClusterLink::latest`]): while etcd is
//! unreachable it stays as it was (fail static) and only the link state changes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::clock::now_ms;
use crate::config::tokens::Token;
use crate::control::cluster::{
    self, drain_key, freeze_key, timeline_key, Freeze, Shared, SharedDrain, SharedView, Store,
    Timeline,
};
use crate::control::decide::drains::{DrainError, DrainRule};
use crate::control::decide::failover::Turn;
use crate::control::decide::health::{State, VantageView};
use crate::control::decide::keys::{CdnDay, NameCdn};
use crate::control::decide::state::ControlState;
use crate::control::decide::stepper::Direction;
use crate::control::disk::audit::Audit;
use crate::control::levers::command::{audit_rule, undrain_fields, Lever};
use crate::inputs::Loaded;
use crate::metrics::Metrics;

/// A node's link to the set: where to write, what it applied last.
pub(crate) struct ClusterLink {
    pub store: Store,
    pub prefix: String,
    /// This node's name (also its vantage name).
    pub node: String,
    /// The set's members (`--members`).
    pub members: Vec<String>,
    /// The session's latest view and link state.
    pub shared: watch::Receiver<Shared>,
    /// Woken after each probe round: the publisher writes the new observations.
    pub rounds: Arc<Notify>,
    /// The view applied last, with the link state now.
    latest: Option<Shared>,
    /// Health changes this node could not write (etcd unreachable): written when it is
    /// back, if the health still says so.
    pending: BTreeMap<String, State>,
    /// Serial of drain ids made here.
    next_id: u64,
    /// Keys refused in the latest view, and evaluations of the set refused since start.
    refused: u64,
    /// The set's commit and performance evaluations refused for this policy's bounds.
    refused_evaluations: u64,
    /// The revision of the last shared audit entry appended to the local log.
    pub audit_rev: i64,
    /// Serial of the audit keys written here.
    audit_serial: u64,
    /// The revision of each day of usage merged into the ledger (`usage.rs`).
    pub(super) usage_seen: BTreeMap<CdnDay, i64>,
    /// Where a write's answer goes, to be given once this node applied it.
    pub(super) done: mpsc::UnboundedSender<Done>,
    /// The controller's end (taken once, by `Controller::run`).
    done_rx: Option<mpsc::UnboundedReceiver<Done>>,
    /// The policy in force, to the session (which checks every key against it).
    pub policy: Option<watch::Sender<Arc<Loaded>>>,
    /// Overrides seen without their writer's audit entry (`unaudited.rs`).
    unaudited: super::unaudited::Unaudited,
}

/// The answer to an API call that wrote to the store, given once this node's view
/// holds the write (and what it changed is saved): an API client that is answered
/// reads its own change in `/v1/state`, `explain` and the DNS, on one node and in a set.
pub(crate) struct Done {
    /// The store's revision once the write was made (`None`: it failed, answer now).
    pub revision: Option<i64>,
    pub answer: Answer,
}

/// Sends an API call's answer.
pub(crate) type Answer = Box<dyn FnOnce() + Send>;

impl Done {
    /// Hands `value` for `reply` to the controller: at once when the write failed,
    /// else with the store's revision now.
    pub(super) async fn send<T: Send + 'static>(
        done: &mpsc::UnboundedSender<Done>,
        store: &Store,
        key: &str,
        reply: oneshot::Sender<T>,
        value: T,
        written: bool,
    ) {
        let revision = match written {
            true => store.revision_after_writes(key).await.ok(),
            false => None,
        };
        let answer: Answer = Box::new(move || {
            let _ = reply.send(value);
        });
        if let Err(back) = done.send(Done { revision, answer }) {
            (back.0.answer)();
        }
    }
}

/// What applying a view did, for the controller to show or publish.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Followed {
    /// Nothing the state document shows changed.
    Nothing,
    /// The link state or the refused keys changed: show them.
    Shown,
    /// Steps, drains or freeze changed: publish a new plan, then write the health
    /// changes made while etcd was unreachable (`propose` each).
    Applied(BTreeMap<String, State>),
}

impl ClusterLink {
    pub(crate) fn new(
        store: Store,
        prefix: String,
        node: String,
        members: Vec<String>,
        shared: watch::Receiver<Shared>,
        rounds: Arc<Notify>,
    ) -> ClusterLink {
        let (done, done_rx) = mpsc::unbounded_channel();
        ClusterLink {
            store,
            prefix,
            node,
            members,
            shared,
            rounds,
            latest: None,
            pending: BTreeMap::new(),
            next_id: 0,
            refused: 0,
            refused_evaluations: 0,
            audit_rev: 0,
            audit_serial: 0,
            usage_seen: BTreeMap::new(),
            done,
            done_rx: Some(done_rx),
            policy: None,
            unaudited: Default::default(),
        }
    }

    /// A new policy is in force: the session reads every key anew and checks it
    /// against this one.
    pub(crate) fn rescope(&self, loaded: &Arc<Loaded>) {
        if let Some(p) = &self.policy {
            p.send_replace(loaded.clone());
        }
    }

    /// The answers of writes, for the controller (once).
    pub(crate) fn take_done(&mut self) -> Option<mpsc::UnboundedReceiver<Done>> {
        self.done_rx.take()
    }

    /// The view applied last, with the link state now (`None` before the first).
    pub(crate) fn latest(&self) -> Option<&Shared> {
        self.latest.as_ref()
    }

    /// Keys of the latest view that do not count.
    pub(crate) fn refused(&self) -> u64 {
        self.refused
    }

    /// An evaluation of the set (commit biases, a performance shift) refused here:
    /// logged and counted with the refused keys; the one in force holds.
    pub(crate) fn refuse_evaluation(
        &mut self,
        what: &str,
        name: &str,
        why: &str,
        metrics: &Metrics,
    ) {
        warn!(name = %name, why = %why, "the set's {what} is outside this policy's bounds: not taken");
        self.refused_evaluations += 1;
        self.refused += 1;
        metrics.etcd_refused_keys(self.refused);
    }

    /// This node, when it is the set's only member (a set of one): what it wrote is
    /// shown without its name.
    fn lone(&self) -> Option<&str> {
        (self.members.len() <= 1).then_some(self.node.as_str())
    }

    /// Whether etcd answers (with a quorum).
    pub(crate) fn connected(&self) -> bool {
        self.latest.as_ref().is_some_and(|s| s.link.connected)
    }

    /// Whether etcd can be written now, or why not (for an API answer). A set of one's
    /// store lives in this process and always takes a write, also before the
    /// session's first read is in (the answer waits until the view holds it).
    pub(crate) fn writable(&self) -> Result<(), DrainError> {
        if self.connected() || self.store.is_memory() {
            return Ok(());
        }
        Err(DrainError::Unavailable(
            self.latest
                .as_ref()
                .and_then(|s| s.link.error.clone())
                .unwrap_or_else(|| "not connected".into()),
        ))
    }

    /// Writes an audit entry of this node to etcd, from where every node appends it.
    pub(crate) fn audit(&mut self, kind: &str, fields: serde_json::Value) {
        let (key, entry) = self.audit_entry(kind, fields);
        tokio::spawn(put_audit(self.store.clone(), key, entry));
    }

    /// The key and entry of an audit event of this node, to write to etcd.
    pub(super) fn audit_entry(
        &mut self,
        kind: &str,
        fields: serde_json::Value,
    ) -> (String, serde_json::Value) {
        self.audit_serial += 1;
        let serial = now_ms() * 1000 + self.audit_serial % 1000;
        (
            cluster::audit_key(&self.prefix, &self.node, serial),
            Audit::entry(kind, &self.node, fields),
        )
    }

    /// The other vantage points of the set, as far as this policy probes their CDNs.
    pub(crate) fn vantage_views(&self, loaded: &Loaded) -> Vec<VantageView> {
        let probes = &loaded.probes;
        self.latest.as_ref().map_or_else(Vec::new, |s| {
            s.view
                .vantage_views(&self.node, |cdn| probes.get(cdn).is_some())
        })
    }

    /// A new view or link state from the session: applies the set's timelines, drains
    /// and freeze to `state` when they changed.
    pub(crate) fn on_shared(
        &mut self,
        shared: Shared,
        state: &mut ControlState,
        loaded: &Loaded,
        metrics: &Metrics,
        audit: Option<&Audit>,
    ) -> Followed {
        let was_connected = self.connected();
        let connected = shared.link.connected;
        metrics.etcd_fail_static(!connected);
        if !connected {
            // Fail static: keep what was applied last; its timelines go on by the clock.
            self.latest = Some(match self.latest.take() {
                Some(mut old) => {
                    old.link = shared.link;
                    old
                }
                None => shared,
            });
            return Followed::Shown;
        }
        // A view that changes only observations (each round of each vantage point)
        // publishes nothing.
        let same = was_connected
            && self
                .latest
                .as_ref()
                .is_some_and(|old| same_overrides(&old.view, &shared.view));
        self.latest = Some(shared.clone());
        if let Some(a) = audit {
            for (rev, entry) in shared.view.audit.range(self.audit_rev + 1..) {
                a.append_shared(*rev, (**entry).clone());
                self.audit_rev = *rev;
            }
        }
        if !self.store.is_memory() {
            let (view, serving) = (&shared.view, &loaded.policy.version);
            self.unaudited
                .follow(view, shared.revision, serving, Instant::now());
            self.audit_unaudited(audit);
        }
        let shown = self.note_refused(&shared.view, state, loaded, metrics);
        if same {
            return if shown {
                Followed::Shown
            } else {
                Followed::Nothing
            };
        }
        apply(&shared.view, state, loaded, self.lone());
        self.note_refused(&shared.view, state, loaded, metrics);
        Followed::Applied(if was_connected {
            BTreeMap::new()
        } else {
            std::mem::take(&mut self.pending)
        })
    }

    /// Appends to this node's own log each override of the view whose writer's audit
    /// entry did not come in time (`unaudited.rs`); only while in touch with the store
    /// (the entry may be there).
    pub(crate) fn audit_unaudited(&mut self, audit: Option<&Audit>) {
        let Some(view) = self.latest.as_ref().filter(|s| s.link.connected) else {
            return;
        };
        for e in self.unaudited.due(&view.view, Instant::now()) {
            warn!(key = %e["key"], record_node = %e["record_node"], "an override of the set came without its writer's audit entry (written straight to the store?): audited here");
            if let Some(a) = audit {
                a.record("override_seen", e);
            }
        }
    }

    /// When an override's wait for its writer's audit entry ends (while in touch).
    pub(crate) fn unaudited_due(&self) -> Option<Instant> {
        self.connected()
            .then(|| self.unaudited.next_due())
            .flatten()
    }

    /// Counts, logs and shows the keys of `view` that do not count, and the drains
    /// refused for their location scope; returns whether the count changed.
    fn note_refused(
        &mut self,
        view: &SharedView,
        state: &ControlState,
        loaded: &Loaded,
        metrics: &Metrics,
    ) -> bool {
        let refused =
            refused_keys(view, loaded) + state.drains.refused() as u64 + self.refused_evaluations;
        if refused == self.refused {
            return false;
        }
        self.refused = refused;
        metrics.etcd_refused_keys(refused);
        if let Some(why) = &view.last_refused {
            warn!(refused, last = %why, "etcd: keys refused (they do not count)");
        }
        true
    }

    /// This node's health of `cdn` changed: start (or turn around) the shared timeline
    /// of every name that uses it, unless another node did first. How many timelines
    /// it writes (their steps show once the view holds them).
    pub(crate) fn propose(
        &mut self,
        state: &ControlState,
        loaded: &Loaded,
        cdn: &str,
        to: State,
    ) -> usize {
        let failover = &state.failover;
        if failover.frozen.is_some() {
            warn!(cdn = %cdn, to = %to, "failover frozen: not acting on the health change");
            return 0;
        }
        if !self.connected() {
            warn!(cdn = %cdn, to = %to, "etcd unreachable: failing static, this node starts no failover on its own evidence (written when etcd is back)");
            self.pending.insert(cdn.to_string(), to);
            return 0;
        }
        let Some(shared) = &self.latest else { return 0 };
        let mut written = 0;
        for host in loaded
            .policy
            .hosts
            .iter()
            .filter(|h| h.cdns.iter().any(|x| x.name == cdn) && !failover.held(h))
        {
            let name = host.name.to_string();
            let key = NameCdn::new(name.clone(), cdn);
            let level = failover.steps.get(&key).map_or(0, |s| s.level);
            let existing = shared.view.timelines.get(&key).cloned();
            let direction = match to {
                State::Down => Direction::Demote,
                State::Up => Direction::Promote,
            };
            let write = match (&existing, direction) {
                (None, Direction::Demote) => Some(None),
                (Some((t, rev)), d) if t.direction != d => Some(Some(*rev)),
                _ => None,
            };
            let Some(compare) = write else { continue };
            written += 1;
            let timeline = Timeline {
                direction,
                from_level: level,
                start_unix_ms: now_ms(),
                node: self.node.clone(),
                reason: format!("{cdn} marked {to} by {}", self.node),
            };
            let (store, k) = (self.store.clone(), timeline_key(&self.prefix, &name, cdn));
            let value = serde_json::to_vec(&timeline).unwrap_or_default();
            tokio::spawn(async move {
                let r = match compare {
                    None => store.create(&k, &value).await,
                    Some(rev) => store.replace(&k, rev, &value).await,
                };
                match r {
                    Ok(true) => {
                        info!(key = %k, direction = ?timeline.direction, from_level = timeline.from_level, "failover timeline written for the set")
                    }
                    Ok(false) => {
                        info!(key = %k, "another node wrote the failover timeline first: following it")
                    }
                    Err(e) => warn!(key = %k, error = %e, "cannot write the failover timeline"),
                }
            });
        }
        written
    }

    /// Back in touch: writes what this node's health decided meanwhile, if it still
    /// says so.
    pub(crate) fn catch_up(
        &mut self,
        pending: BTreeMap<String, State>,
        state: &ControlState,
        loaded: &Loaded,
    ) {
        for (cdn, to) in pending {
            if state.failover.health.get(&cdn).map(|t| t.state) == Some(to) {
                info!(cdn = %cdn, to = %to, "etcd back: writing the health change made while it was unreachable");
                let _ = self.propose(state, loaded, &cdn, to);
            }
        }
    }

    /// The drain override `id` as the set holds it.
    pub(crate) fn written_drain(&self, id: &str) -> Option<DrainRule> {
        self.latest
            .as_ref()
            .and_then(|s| s.view.drains.get(id))
            .map(|d| d.rule.clone())
    }

    /// Writes the drain rules an API call made (validated) to etcd, each under a lease
    /// that ends it a little after its `until`, and deletes the overrides they
    /// `replaced` (each audited as replaced, with what replaced it).
    pub(crate) fn write_drains(
        &mut self,
        rules: Vec<DrainRule>,
        replaced: Vec<DrainRule>,
        reply: oneshot::Sender<Result<Vec<DrainRule>, DrainError>>,
    ) {
        if let Err(e) = self.writable() {
            let _ = reply.send(Err(e));
            return;
        }
        // Never a 201 for a drain that no node would keep.
        let held = self.latest.as_ref().map_or(0, |s| s.view.drains.len());
        if held + rules.len() > cluster::MAX_DRAINS {
            let max = cluster::MAX_DRAINS;
            let _ = reply.send(Err(DrainError::TooManyDrains { held, max }));
            return;
        }
        let wall = now_ms();
        let mut writes = Vec::new();
        for mut rule in rules {
            self.next_id += 1;
            // A set of many names the node, so that two nodes never make the same id.
            rule.id = match self.lone() {
                Some(_) => format!("api-{}-{}", wall, self.next_id),
                None => format!("api-{}-{}-{}", self.node, wall, self.next_id),
            };
            rule.written_by = Some(self.node.clone());
            rule.written_at_unix_ms = Some(wall);
            let ttl = rule
                .until_unix_ms
                .map(|u| Duration::from_millis(u.saturating_sub(wall)) + Duration::from_secs(10));
            let record = SharedDrain {
                rule,
                node: self.node.clone(),
                at_unix_ms: wall,
            };
            writes.push((drain_key(&self.prefix, &record.rule.id), ttl, record));
        }
        let mut audits: Vec<_> = writes
            .iter()
            .map(|(_, _, d)| self.audit_entry("drain", audit_rule(&d.rule)))
            .collect();
        // A re-post replaces the override of the same name, CDN and scope: one stays.
        let mut gone = Vec::new();
        for old in &replaced {
            let by = writes.iter().find(|(_, _, d)| d.rule.key() == old.key());
            let Some((_, _, new)) = by.filter(|(_, _, d)| d.rule.id != old.id) else {
                continue;
            };
            let mut fields = audit_rule(old);
            fields["replaced_by"] = new.rule.id.clone().into();
            fields["replaced_by_author"] = new.rule.author.clone().into();
            audits.push(self.audit_entry("replace", fields));
            gone.push(drain_key(&self.prefix, &old.id));
        }
        let (store, done, prefix) = (self.store.clone(), self.done.clone(), self.prefix.clone());
        tokio::spawn(async move {
            let r = async {
                for (key, ttl, record) in &writes {
                    let value = serde_json::to_vec(record).unwrap_or_default();
                    let lease = match ttl {
                        Some(t) => Some(store.grant(*t).await?),
                        None => None,
                    };
                    store.put(key, &value, lease).await?;
                }
                for key in &gone {
                    store.delete(key).await?;
                }
                Ok::<(), cluster::EtcdError>(())
            }
            .await;
            let written = r.is_ok();
            let value = match r {
                Ok(()) => {
                    for (_, _, d) in &writes {
                        let rule = &d.rule;
                        info!(id = %rule.id, name = %rule.name, cdn = %rule.cdn, reason = %rule.reason, author = ?rule.author, "drain override written to the store for the set");
                    }
                    for (key, entry) in audits {
                        put_audit(store.clone(), key, entry).await;
                    }
                    Ok(writes.into_iter().map(|(_, _, d)| d.rule).collect())
                }
                Err(e) => Err(DrainError::Unavailable(e.to_string())),
            };
            Done::send(&done, &store, &prefix, reply, value, written).await;
        });
    }

    /// Deletes the drain override `rule` (validated) from etcd.
    pub(crate) fn write_undrain(
        &mut self,
        rule: DrainRule,
        token: &Token,
        reply: oneshot::Sender<Result<DrainRule, DrainError>>,
    ) {
        if let Err(e) = self.writable() {
            let _ = reply.send(Err(e));
            return;
        }
        let (audit_key, entry) = self.audit_entry("undrain", undrain_fields(&rule, token));
        let (store, key) = (self.store.clone(), drain_key(&self.prefix, &rule.id));
        let (done, prefix) = (self.done.clone(), self.prefix.clone());
        tokio::spawn(async move {
            let r = store.delete(&key).await;
            if r.is_ok() {
                put_audit(store.clone(), audit_key, entry).await;
            }
            let written = r.is_ok();
            let value = match r {
                Ok(()) => {
                    info!(id = %rule.id, name = %rule.name, cdn = %rule.cdn, "drain override removed from the store for the set");
                    Ok(rule)
                }
                Err(e) => Err(DrainError::Unavailable(e.to_string())),
            };
            Done::send(&done, &store, &prefix, reply, value, written).await;
        });
    }

    /// Writes a freeze (of every name, or of a tenant's) to etcd.
    pub(crate) fn write_freeze(
        &mut self,
        lever: Lever,
        reply: oneshot::Sender<Result<(), DrainError>>,
    ) {
        if let Err(e) = self.writable() {
            let _ = reply.send(Err(e));
            return;
        }
        let (audit_key, entry) = self.audit_entry("freeze", lever.fields());
        let record = Freeze {
            reason: lever.reason,
            node: self.node.clone(),
            at_unix_ms: now_ms(),
        };
        let key = self.freeze_key(lever.tenant.as_deref());
        let (store, done, prefix) = (self.store.clone(), self.done.clone(), self.prefix.clone());
        tokio::spawn(async move {
            let value = serde_json::to_vec(&record).unwrap_or_default();
            let r = store.put(&key, &value, None).await;
            if r.is_ok() {
                put_audit(store.clone(), audit_key, entry).await;
            }
            let written = r.is_ok();
            let value = r.map_err(|e| DrainError::Unavailable(e.to_string()));
            Done::send(&done, &store, &prefix, reply, value, written).await;
        });
    }

    /// Writes a resume to etcd: every timeline starts again from where the freeze held
    /// it, in the direction [`FailoverState::turns`](crate::control::decide::failover::FailoverState::turns)
    /// gives it; then the freeze is lifted.
    pub(crate) fn write_resume(
        &mut self,
        lever: Lever,
        turns: &[Turn],
        reply: oneshot::Sender<Result<(), DrainError>>,
    ) {
        if let Err(e) = self.writable() {
            let _ = reply.send(Err(e));
            return;
        }
        let (audit_key, entry) = self.audit_entry("resume", lever.fields());
        let wall = now_ms();
        let writes: Vec<(String, Timeline)> = turns
            .iter()
            .map(|t| {
                let timeline = Timeline {
                    direction: t.direction,
                    from_level: t.from_level,
                    start_unix_ms: wall,
                    node: self.node.clone(),
                    reason: format!("resumed: {}", lever.reason),
                };
                (timeline_key(&self.prefix, &t.name, &t.cdn), timeline)
            })
            .collect();
        let freeze = self.freeze_key(lever.tenant.as_deref());
        let (store, done, prefix) = (self.store.clone(), self.done.clone(), self.prefix.clone());
        tokio::spawn(async move {
            let r = async {
                for (k, t) in &writes {
                    store
                        .put(k, &serde_json::to_vec(t).unwrap_or_default(), None)
                        .await?;
                }
                store.delete(&freeze).await
            }
            .await;
            if r.is_ok() {
                put_audit(store.clone(), audit_key, entry).await;
            }
            let written = r.is_ok();
            let value = r.map_err(|e| DrainError::Unavailable(e.to_string()));
            Done::send(&done, &store, &prefix, reply, value, written).await;
        });
    }

    /// The key of the freeze of every name, or of `tenant`'s.
    fn freeze_key(&self, tenant: Option<&str>) -> String {
        match tenant {
            Some(t) => cluster::tenant_freeze_key(&self.prefix, t),
            None => freeze_key(&self.prefix),
        }
    }
}

/// Whether two views hold the same timelines, drains and freezes.
fn same_overrides(a: &SharedView, b: &SharedView) -> bool {
    a.timelines == b.timelines
        && a.drains == b.drains
        && a.freeze == b.freeze
        && a.freeze_tenants == b.freeze_tenants
}

/// Applies the set's timelines, drains and freeze of `view` to `state`. A freeze is
/// shown with the node that wrote it, but for a set of one (`lone`: this node).
fn apply(view: &SharedView, state: &mut ControlState, loaded: &Loaded, lone: Option<&str>) {
    let now = Instant::now();
    let wall = now_ms();
    let policy = &loaded.policy;
    // The freeze holds every timeline where it stood when it was set.
    let t = match &view.freeze {
        Some(f) => wall.min(f.at_unix_ms),
        None => wall,
    };
    let mut steps = BTreeMap::new();
    for (key, (tl, _)) in view.timelines.iter() {
        let NameCdn { name, cdn } = key;
        let Some(host) = policy.host(name).filter(|h| h.has_cdn(cdn)) else {
            continue;
        };
        let top = host.failover.steps.len();
        let interval = host.failover.step_interval.as_millis() as u64;
        let mut tl = tl.clone();
        if let Some(start) = tl.clamp(interval, wall) {
            warn!(name = %name, cdn = %cdn, written_by = %tl.node, start_unix_ms = start, now_unix_ms = wall, "failover timeline starts further ahead of this clock than a step interval (a clock is off: NTP?): scheduled one step interval from now");
        }
        // A tenant's freeze holds its names' timelines where they stood then.
        let t = match host
            .tenant
            .as_ref()
            .and_then(|x| view.freeze_tenants.get(x))
        {
            Some(f) => t.min(f.at_unix_ms),
            None => t,
        };
        let s = tl.stepper(top, interval, t, now);
        if s.is_active() {
            steps.insert(key.clone(), s);
        }
    }
    let failover = &mut state.failover;
    failover.steps = steps;
    let shown = |f: &Freeze| match lone {
        Some(node) if node == f.node => f.reason.clone(),
        _ => format!("{} (by {})", f.reason, f.node),
    };
    let frozen = view.freeze.as_ref().map(shown);
    if frozen != failover.frozen {
        match &frozen {
            Some(why) => warn!(reason = %why, "automatic failover frozen for the whole set"),
            None => info!("automatic failover resumed for the whole set"),
        }
    }
    failover.frozen = frozen;
    failover.frozen_tenants = view
        .freeze_tenants
        .iter()
        .map(|(t, f)| (t.clone(), shown(f)))
        .collect();
    // In the order they were written: past the scope cap, every node refuses the
    // same (later) ones, also a node that reads them all at once.
    let mut written: Vec<&SharedDrain> = view
        .drains
        .values()
        .filter(|d| d.rule.resolve(policy).is_ok())
        .collect();
    written.sort_by_key(|d| (d.at_unix_ms, d.rule.id.clone()));
    state.drains.overrides = written.into_iter().map(|d| d.rule.clone()).collect();
    state.drains.sync(policy, now, wall);
}

/// Keys of `view` that do not count: of a bad form, outside the policy or past a cap
/// (the session checks each against the policy: `cluster/scope.rs`), and the drains
/// of a name gone from the policy since the view was read.
pub(crate) fn refused_keys(view: &SharedView, loaded: &Loaded) -> u64 {
    let policy = &loaded.policy;
    let drains = view
        .drains
        .values()
        .filter(|d| d.rule.resolve(policy).is_err())
        .count();
    view.refused + drains as u64
}

/// Writes an audit entry to etcd for the set (under a lease: every node has it by then).
pub(super) async fn put_audit(store: Store, key: String, entry: serde_json::Value) {
    let value = serde_json::to_vec(&entry).unwrap_or_default();
    let r = async {
        let lease = store.grant(cluster::AUDIT_TTL).await?;
        store.put(&key, &value, Some(lease)).await
    }
    .await;
    if let Err(e) = r {
        warn!(key = %key, error = %e, "cannot write an audit entry to etcd: the set's log lacks it");
    }
}
