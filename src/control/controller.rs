//! Control plane: the controller. Each finished probe round becomes a verdict (this
//! vantage point's result plus the peers' fresh ones, by quorum), the verdicts go
//! through hysteresis, health changes start failover steps, and every change of the
//! steps publishes a new plan. Every state change is logged with its evidence, and the
//! state is saved so that a restart resumes where it was.
//!
//! ```text
//!  prober rounds ─┐
//!  peers' views ──┴─▶ verdict (quorum) ─▶ Tracker (hysteresis) ─▶ Stepper ─▶ planner ─▶ Live
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::net::IpAddr;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::probes::Probes;
use crate::control::api::ScopedTokens;
use crate::control::audit::{self, Audit};
use crate::control::cluster::{
    self, drain_key, freeze_key, timeline_key, Etcd, Freeze, Shared, SharedDrain, Timeline,
};
use crate::control::command::{admit, audit_rule, may_undrain, undrain_fields, Command, Lever};
use crate::control::drains::{now_ms, DrainError, DrainState};
use crate::control::explain::{self, ExplainError, Explanation};
use crate::control::failover::Step;
use crate::control::health::{self, State, VantageView, VerdictKind};
use crate::control::peers::Peers;
use crate::control::persist::{self, Saved};
use crate::control::planner::Removed;
use crate::control::prober::{self, Local, Round};
use crate::control::reload::Reloaded;
use crate::control::saver::{self, Saver};
use crate::control::state::ControlState;
use crate::control::state_doc::{
    ClusterDoc, ClusterDrainDoc, FailOpenDoc, HealthDoc, PeerDoc, ReloadOutcome, SaveStatus,
    StateDoc, StepDoc, TimelineDoc, VerdictCounts,
};
use crate::control::stepper::Direction;
use crate::inputs::Loaded;
use crate::metrics::Metrics;
use crate::plan::{Live, Snapshot};

/// Where state is saved, and how old a saved state may be to be used.
#[derive(Clone, Debug)]
pub struct StateFile {
    pub dir: PathBuf,
    pub max_age: Duration,
    /// Simulated disk faults, for the fault tests (see [`persist::DiskFaults`]); off
    /// by default.
    pub disk: persist::DiskFaults,
}

impl StateFile {
    /// State saved in `dir`, restored when younger than `max_age`.
    pub fn new(dir: PathBuf, max_age: Duration) -> StateFile {
        StateFile {
            dir,
            max_age,
            disk: persist::DiskFaults::default(),
        }
    }
}

/// How long an API call that changed the state waits for the save before it is
/// answered anyway (see [`Controller::reply`]).
const REPLY_WAIT: Duration = Duration::from_secs(2);

pub struct Controller {
    loaded: Arc<Loaded>,
    vantage: String,
    local: Local,
    peers: Peers,
    /// What `/metrics` serves: gauges set on every change, counts of what happened.
    metrics: Metrics,
    live: Option<Arc<Live>>,
    /// Health, failover steps and freeze, and the drains (pure; see `state.rs`).
    state: ControlState,
    fail_open: Vec<(String, String)>,
    own_unhappy: Option<String>,
    /// Peers currently unhappy, with why (logged when it changes).
    unhappy_peers: BTreeMap<String, String>,
    verdicts: BTreeMap<String, String>,
    /// Round verdicts per CDN since start, for `/v1/state`: what hysteresis was fed,
    /// which the last verdict alone cannot tell.
    verdict_counts: BTreeMap<String, VerdictCounts>,
    /// The percentage of each (name, CDN)'s current failover step and when the step was
    /// taken: the server's own account of the timeline, for `/v1/state`.
    stepped: BTreeMap<(String, String), (u8, Instant)>,
    /// The outcome of the last reload, for `/v1/state`.
    last_reload: Option<ReloadOutcome>,
    /// (name, CDN) pairs whose `drains_active` gauge is set.
    drain_gauges: BTreeSet<(String, String)>,
    state_file: Option<StateFile>,
    /// The thread that saves the state and then shows `/v1/state` (with a state file).
    saver: Option<Saver>,
    /// The generation of the latest hand-over to the saver: an API call is answered
    /// once it is saved and shown.
    handed: Option<u64>,
    /// The document `/v1/state` serves.
    doc: Arc<Mutex<Option<StateDoc>>>,
    /// In a set (`--etcd`): etcd, and what was last read from it.
    cluster: Option<ClusterLink>,
    /// The audit log (with a state file): mutations, reloads, health, steps.
    audit: Option<Audit>,
    /// The API's scoped tokens, swapped on every reload.
    tokens: ScopedTokens,
}

/// A node's link to the set: where to write, what it read last.
pub struct ClusterLink {
    pub etcd: Etcd,
    pub prefix: String,
    /// This node's name (also its vantage name).
    pub node: String,
    /// The set's members (`--members`).
    pub members: Vec<String>,
    /// The session's latest view and link state.
    pub shared: tokio::sync::watch::Receiver<Shared>,
    /// Woken after each probe round: the publisher writes the new observations.
    pub rounds: Arc<tokio::sync::Notify>,
    /// The view applied last.
    latest: Option<Shared>,
    /// Health changes this node could not write (etcd unreachable): written when it is
    /// back, if the health still says so.
    pending: BTreeMap<String, State>,
    /// Serial of drain ids made here.
    next_id: u64,
    /// The timelines, drains and freeze applied last: a view that changes only
    /// observations (each round of each vantage point) publishes nothing.
    applied: Option<Applied>,
    /// Keys refused in the latest view.
    refused: u64,
    /// The revision of the last shared audit entry appended to the local log.
    audit_rev: i64,
    /// Serial of the audit keys written here.
    audit_serial: u64,
}

type Applied = (
    BTreeMap<(String, String), (Timeline, i64)>,
    BTreeMap<String, SharedDrain>,
    Option<Freeze>,
    BTreeMap<String, Freeze>,
);

impl ClusterLink {
    pub fn new(
        etcd: Etcd,
        prefix: String,
        node: String,
        members: Vec<String>,
        shared: tokio::sync::watch::Receiver<Shared>,
        rounds: Arc<tokio::sync::Notify>,
    ) -> ClusterLink {
        ClusterLink {
            etcd,
            prefix,
            node,
            members,
            shared,
            rounds,
            latest: None,
            pending: BTreeMap::new(),
            next_id: 0,
            applied: None,
            refused: 0,
            audit_rev: 0,
            audit_serial: 0,
        }
    }

    /// The key and entry of an audit event of this node, to write to etcd.
    fn audit_entry(
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

    fn connected(&self) -> bool {
        self.latest.as_ref().is_some_and(|s| s.link.connected)
    }
}

impl Controller {
    /// A controller for `loaded`, with the saved state restored when there is one.
    pub fn new(
        loaded: Arc<Loaded>,
        vantage: String,
        local: Local,
        peers: Peers,
        metrics: Metrics,
        state_file: Option<StateFile>,
    ) -> Controller {
        let mut c = Controller {
            loaded,
            vantage,
            local,
            peers,
            metrics,
            live: None,
            state: ControlState::default(),
            fail_open: Vec::new(),
            own_unhappy: None,
            unhappy_peers: BTreeMap::new(),
            verdicts: BTreeMap::new(),
            verdict_counts: BTreeMap::new(),
            stepped: BTreeMap::new(),
            last_reload: None,
            drain_gauges: BTreeSet::new(),
            state_file,
            saver: None,
            handed: None,
            doc: Arc::new(Mutex::new(None)),
            cluster: None,
            audit: None,
            tokens: ScopedTokens::default(),
        };
        c.tokens.store(Arc::new(c.loaded.tokens.clone()));
        if let Some(sf) = &c.state_file {
            let metrics = Some(c.metrics.clone());
            match Saver::start(sf.dir.clone(), sf.disk.clone(), metrics, c.doc.clone()) {
                Ok(saver) => c.saver = Some(saver),
                Err(e) => {
                    error!(error = %e, "cannot start the state saver thread: the state is not saved")
                }
            }
            let path = sf.dir.join("audit.jsonl");
            let started = std::fs::create_dir_all(&sf.dir)
                .and_then(|()| Audit::start(path.clone(), c.vantage.clone(), audit::MAX_BYTES));
            match started {
                Ok(a) => c.audit = Some(a),
                Err(e) => {
                    error!(error = %e, file = %path.display(), "cannot open the audit log: nothing is audited")
                }
            }
        }
        c.restore();
        c.state
            .drains
            .sync(&c.loaded.policy, Instant::now(), now_ms());
        c
    }

    fn restore(&mut self) {
        let Some(sf) = &self.state_file else { return };
        match persist::restore(&sf.dir, sf.max_age) {
            Ok(None) => {}
            Err((fault, kept)) => {
                self.metrics.state_load_error(fault.reason());
                error!(
                    reason = fault.reason(),
                    error = %fault,
                    set_aside = %kept.as_ref().map_or("no".into(), |p| p.display().to_string()),
                    "saved state not restored: starting from the configured weights"
                );
            }
            Ok(Some(saved)) => {
                let now = Instant::now();
                self.state = ControlState::from_saved(&saved, &self.loaded, now, now_ms());
                info!(
                    age_s = saved.age_ms() / 1000,
                    frozen = self.state.failover.frozen.is_some(),
                    overrides = self.state.drains.overrides.len(),
                    down = ?self.state.failover.down(),
                    steps = self.state.failover.steps.len(),
                    "restored health and failover state"
                );
                self.tick_steps(now);
            }
        }
    }

    /// The snapshot for the current state (also used before the server starts, so that
    /// a restart never serves the configured weights in the middle of a failover).
    pub fn snapshot(&mut self) -> Snapshot {
        let snapshot = self.plan();
        self.update_doc();
        snapshot
    }

    fn plan(&mut self) -> Snapshot {
        let (snapshot, fail_open) = self.state.snapshot(&self.loaded);
        self.note_fail_open(fail_open);
        snapshot
    }

    /// Makes this controller a node of a set: steps, drains and freeze follow etcd.
    pub fn join(&mut self, mut link: ClusterLink) {
        link.audit_rev = self.audit.as_ref().map_or(0, |a| a.start_rev);
        self.metrics.etcd_fail_static(true);
        self.cluster = Some(link);
    }

    /// The document `/v1/state` serves.
    pub fn doc(&self) -> Arc<Mutex<Option<StateDoc>>> {
        self.doc.clone()
    }

    /// The API's scoped tokens, as the policy's reloads swap them.
    pub fn tokens(&self) -> ScopedTokens {
        self.tokens.clone()
    }

    /// Refuses a freeze or resume of a tenant the policy does not have.
    fn known_tenant(&self, lever: &Lever) -> Result<(), DrainError> {
        match &lever.tenant {
            Some(t)
                if !self
                    .loaded
                    .policy
                    .hosts
                    .iter()
                    .any(|h| h.tenant.as_ref() == Some(t)) =>
            {
                Err(DrainError::NoTenant(t.clone()))
            }
            _ => Ok(()),
        }
    }

    /// Appends an entry to the audit log (when there is one); in a set, writes it to
    /// etcd, from where every node appends it.
    fn audit(&mut self, kind: &str, fields: serde_json::Value) {
        let Some(a) = &self.audit else { return };
        match self.cluster.as_mut() {
            Some(c) if c.connected() => {
                let (key, entry) = c.audit_entry(kind, fields);
                tokio::spawn(put_audit(c.etcd.clone(), key, entry));
            }
            _ => a.record(kind, fields),
        }
    }

    /// Runs until `stop`, publishing into `live`.
    pub async fn run(
        mut self,
        live: Arc<Live>,
        mut reloads: mpsc::Receiver<Reloaded>,
        mut commands: mpsc::Receiver<Command>,
        stop: CancellationToken,
    ) {
        self.export();
        self.live = Some(live);
        let (tx, mut rounds) = mpsc::channel(256);
        let mut probing = self.start_probing(&tx, &stop);
        // Without the API (`--api off`) every command sender is gone: stop polling the
        // closed channel, which would otherwise be ready at once, forever.
        let mut api_open = true;
        let mut shared = self.cluster.as_ref().map(|c| c.shared.clone());
        loop {
            let now = Instant::now();
            let next = self
                .state
                .failover
                .next_due(&self.loaded.policy)
                .into_iter()
                .chain(
                    self.state
                        .drains
                        .next_due(&self.loaded.policy, now, now_ms()),
                )
                .min();
            let due = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                round = rounds.recv() => match round {
                    Some(r) => self.on_round(r),
                    None => return,
                },
                reloaded = reloads.recv() => match reloaded {
                    Some(r) => {
                        if self.on_reload(r) {
                            probing.cancel();
                            probing = self.start_probing(&tx, &stop);
                        }
                    }
                    None => return,
                },
                changed = async {
                    match shared.as_mut() {
                        Some(rx) => rx.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                } => {
                    if changed {
                        if let Some(rx) = &shared {
                            let s = rx.borrow().clone();
                            self.on_shared(s);
                        }
                    } else {
                        shared = None;
                    }
                }
                command = commands.recv(), if api_open => match command {
                    Some(c) => self.on_command(c),
                    None => api_open = false,
                },
                _ = due => {
                    let now = Instant::now();
                    let mut changed = self.tick_steps(now);
                    changed |= self.state.drains.tick(&self.loaded.policy, now);
                    changed |= self.state.drains.sync(&self.loaded.policy, now, now_ms());
                    self.state.drains.prune(now_ms());
                    if changed {
                        self.publish();
                    } else {
                        self.persist();
                    }
                }
            }
        }
    }

    fn on_command(&mut self, command: Command) {
        let now = Instant::now();
        if self.cluster.is_some() {
            // Explain is answered here as in a single node.
            match self.on_cluster_command(command) {
                Some(Command::Explain(name, ip, resolver, session, reply)) => {
                    let _ = reply.send(self.explain(&name, ip, resolver, session));
                }
                Some(Command::Audit(after, limit, reply)) => match &self.audit {
                    Some(a) => a.page(after, limit, reply),
                    None => {
                        let _ = reply.send(Err("no audit log".into()));
                    }
                },
                _ => {}
            }
            return;
        }
        match command {
            Command::Drain(token, rule, reply) => {
                let mut drains = self.state.drains.clone();
                let result = admit(&mut drains, &self.loaded.policy, &token, rule, now_ms());
                if let Ok(rules) = &result {
                    self.state.drains = drains;
                    for r in rules {
                        info!(id = %r.id, name = %r.name, cdn = %r.cdn, reason = %r.reason, author = ?r.author, "drain override added over the API");
                        self.audit("drain", audit_rule(r));
                    }
                    self.state.drains.sync(&self.loaded.policy, now, now_ms());
                    self.publish();
                }
                self.reply(reply, result);
            }
            Command::Undrain(token, id, reply) => {
                let found = self.state.drains.overrides.iter().find(|o| o.id == id);
                if let Err(e) = may_undrain(&self.loaded.policy, &token, found) {
                    let _ = reply.send(Err(e));
                    return;
                }
                let result = self
                    .state
                    .drains
                    .remove(&id)
                    .ok_or(DrainError::NoSuchOverride(id));
                if let Ok(r) = &result {
                    info!(id = %r.id, name = %r.name, cdn = %r.cdn, author = %token.name, "drain override removed over the API");
                    self.audit("undrain", undrain_fields(r, &token));
                    self.state.drains.sync(&self.loaded.policy, now, now_ms());
                    self.publish();
                }
                self.reply(reply, result);
            }
            Command::Freeze(lever, reply) => {
                if let Err(e) = self.known_tenant(&lever) {
                    let _ = reply.send(Err(e));
                    return;
                }
                warn!(reason = %lever.reason, author = %lever.author, tenant = ?lever.tenant, "automatic failover frozen: health is tracked, no step is taken");
                self.audit("freeze", lever.fields());
                match lever.tenant {
                    Some(t) => self.state.failover.freeze_tenant(&t, lever.reason),
                    None => self.state.failover.freeze(lever.reason),
                }
                self.persist();
                self.reply(reply, Ok(()));
            }
            Command::Resume(lever, reply) => {
                if let Err(e) = self.known_tenant(&lever) {
                    let _ = reply.send(Err(e));
                    return;
                }
                info!(reason = %lever.reason, author = %lever.author, tenant = ?lever.tenant, "automatic failover resumed");
                self.audit("resume", lever.fields());
                let taken = match &lever.tenant {
                    Some(t) => self
                        .state
                        .failover
                        .resume_tenant(&self.loaded.policy, t, now),
                    None => self.state.failover.resume(&self.loaded.policy, now),
                };
                log_steps(&taken);
                self.publish();
                self.reply(reply, Ok(()));
            }
            Command::Explain(name, ip, resolver, session, reply) => {
                let _ = reply.send(self.explain(&name, ip, resolver, session));
            }
            Command::Audit(after, limit, reply) => match &self.audit {
                Some(a) => a.page(after, limit, reply),
                None => {
                    let _ = reply.send(Err(
                        "no audit log: this server keeps no state directory".into()
                    ));
                }
            },
        }
    }

    /// Explains, for a live query, how `name` is answered to a client at `ip` and why.
    fn explain(
        &self,
        name: &str,
        ip: IpAddr,
        resolver: Option<(IpAddr, u8)>,
        session: Option<u64>,
    ) -> Result<Explanation, ExplainError> {
        let live = self
            .live
            .as_ref()
            .ok_or(ExplainError::NotServing)?
            .load_full();
        let facts = explain::Facts {
            loaded: &self.loaded,
            snapshot: &live,
            health: &self.state.failover.health,
            removed: &self.removed(),
            drains: self.state.drains.report(&self.loaded.policy, now_ms()),
            frozen: self.state.frozen_for(&self.loaded, name),
            state: "live".into(),
        };
        let question = explain::Question {
            name,
            client: ip,
            resolver,
            now: crate::selection::unix_now(),
            session,
        };
        explain::explain(&facts, &question)
    }

    /// Starts the prober and the peer readers for the current probes; the returned
    /// token stops them (on a reload that changes the probes).
    fn start_probing(
        &self,
        rounds: &mpsc::Sender<Round>,
        stop: &CancellationToken,
    ) -> CancellationToken {
        let token = stop.child_token();
        self.peers.clear();
        if self.cluster.is_none() {
            self.peers.spawn(
                self.loaded.probes.vantages.clone(),
                peer_interval(&self.loaded.probes),
                token.clone(),
                Some(self.metrics.clone()),
            );
        } else if !self.loaded.probes.vantages.is_empty() {
            warn!("probes/vantages.yaml is not read in a set (--etcd): observations are shared through etcd only");
        }
        prober::spawn(
            self.loaded.probes.specs.clone(),
            self.vantage.clone(),
            self.local.clone(),
            rounds.clone(),
            token.clone(),
        );
        token
    }

    /// Swaps in a reloaded configuration, or keeps the last good one; returns whether
    /// the probes changed (so the prober must restart).
    fn on_reload(&mut self, reloaded: Reloaded) -> bool {
        let probes_changed = self.apply_reload(reloaded);
        // The load's temporaries, and the configuration replaced, back to the system.
        crate::huge::give_back();
        probes_changed
    }

    fn apply_reload(&mut self, reloaded: Reloaded) -> bool {
        let trigger = reloaded.trigger;
        match reloaded.result {
            Err(issues) => {
                self.metrics.reload(false);
                for issue in issues.errors() {
                    error!(trigger = %trigger, error = %issue, "reload refused: the last good configuration keeps serving");
                }
                self.audit(
                    "reload",
                    serde_json::json!({
                        "trigger": trigger.to_string(),
                        "result": "refused",
                        "serving_version": self.loaded.version,
                        "errors": issues.errors().map(ToString::to_string).collect::<Vec<_>>(),
                    }),
                );
                self.last_reload = Some(ReloadOutcome {
                    trigger: trigger.to_string(),
                    result: "refused",
                    errors: issues.errors().map(ToString::to_string).collect(),
                    serving_version: self.loaded.version.clone(),
                });
                self.update_doc();
                false
            }
            Ok(loaded) => {
                for w in loaded.warnings.warnings() {
                    warn!(warning = %w, "configuration warning");
                }
                let probes_changed = loaded.probes != self.loaded.probes;
                let m = &self.metrics;
                m.reload(true);
                m.config_version(&loaded.version);
                for spec in &loaded.probes.specs {
                    m.cdn_probed(&spec.cdn);
                }
                let from = self.loaded.version.clone();
                let diff = reload_diff(&self.loaded, &loaded);
                self.audit(
                    "reload",
                    serde_json::json!({
                        "trigger": trigger.to_string(),
                        "result": "applied",
                        "from_version": from,
                        "to_version": loaded.version,
                        "diff": diff,
                    }),
                );
                self.tokens.store(Arc::new(loaded.tokens.clone()));
                self.loaded = Arc::new(loaded);
                // Health and failover progress carry over for the CDNs and names that remain.
                self.state
                    .failover
                    .retain_known(&self.loaded.policy, &self.loaded.probes);
                info!(trigger = %trigger, from = %from, to = %self.loaded.version, probes_changed, "configuration reloaded");
                self.last_reload = Some(ReloadOutcome {
                    trigger: trigger.to_string(),
                    result: "applied",
                    errors: Vec::new(),
                    serving_version: self.loaded.version.clone(),
                });
                self.state
                    .drains
                    .sync(&self.loaded.policy, Instant::now(), now_ms());
                self.publish();
                probes_changed
            }
        }
    }

    fn on_round(&mut self, round: Round) {
        let Some(spec) = self.loaded.probes.get(&round.cdn).cloned() else {
            return;
        };
        let latest = self.local.snapshot();
        // Until every CDN has been probed (since this one began failing, if it is), a
        // failure here cannot be told from a failure of this vantage point's network.
        let warming_up = latest.len() < self.loaded.probes.specs.len()
            || !self.local.others_probed_since_failure(&round.cdn);
        let own = VantageView {
            name: self.vantage.clone(),
            latest,
            error: None,
            warming_up,
        };
        // Waiting for the other CDNs' rounds is routine, not worth a log line.
        let unhappy = health::unhappy(&own)
            .filter(|u| *u != health::Unhappy::WarmingUp)
            .map(|u| u.to_string());
        if unhappy != self.own_unhappy {
            self.metrics
                .vantage_unhappy(&self.vantage, unhappy.is_some());
            match &unhappy {
                Some(why) => {
                    warn!(vantage = %self.vantage, reason = %why, "this vantage point is unhappy: its failures do not demote any CDN")
                }
                None => info!(vantage = %self.vantage, "this vantage point is happy again"),
            }
            self.own_unhappy = unhappy;
        }
        let mut views = vec![own];
        if let Some(c) = &self.cluster {
            c.rounds.notify_one();
            if let Some(skew) = c.etcd.skew_ms() {
                self.metrics.etcd_clock_skew(skew);
            }
        }
        let peers = self.peer_views();
        self.note_unhappy_peers(&peers);
        views.extend(peers);
        // Three rounds, plus a second for a peer's reading to travel and a loaded machine.
        let fresh_ms = (spec.interval * 3).as_millis() as u64 + 1000;
        // With fewer vantage points configured than the quorum, all of them must agree.
        // In a set, the quorum counts vantage points of the whole set, as configured.
        let quorum = match &self.cluster {
            Some(_) => spec.quorum,
            None => spec
                .quorum
                .min(1 + self.loaded.probes.vantages.len() as u32),
        };
        let verdict = health::verdict(&round.cdn, &views, quorum, fresh_ms);
        let counts = self.verdict_counts.entry(round.cdn.clone()).or_default();
        match verdict.kind {
            VerdictKind::Down => counts.down += 1,
            VerdictKind::Up => counts.up += 1,
            VerdictKind::Unknown => counts.unknown += 1,
        }
        let changed = match &self.cluster {
            Some(_) => {
                self.state
                    .failover
                    .track(&round.cdn, verdict.kind, spec.down_after, spec.up_after)
            }
            None => self.state.failover.observe(
                &self.loaded.policy,
                &round.cdn,
                verdict.kind,
                spec.down_after,
                spec.up_after,
                Instant::now(),
            ),
        };
        self.verdicts.insert(
            round.cdn.clone(),
            format!("{:?}: {}", verdict.kind, verdict.summary()),
        );
        if let Some(t) = changed {
            self.metrics.transition(&t.cdn, t.to == State::Down);
            info!(cdn = %t.cdn, scope = "global", from = %t.from, to = %t.to, quorum, evidence = %verdict.summary(), "health changed");
            self.audit(
                "health",
                serde_json::json!({
                    "cdn": t.cdn,
                    "from": t.from.to_string(),
                    "to": t.to.to_string(),
                    "evidence": verdict.summary(),
                }),
            );
            if self.state.failover.frozen.is_some() {
                warn!(cdn = %t.cdn, to = %t.to, "failover frozen: not acting on the health change");
                self.persist();
                return;
            }
            if self.cluster.is_some() {
                self.propose(&t.cdn, t.to);
                self.export();
                self.persist();
                return;
            }
            for (name, pct) in &t.steps {
                info!(name = %name, cdn = %t.cdn, removed_percent = pct, "failover step");
            }
            self.publish();
        } else {
            self.persist();
        }
    }

    /// Applies due steps; returns whether any weight changed.
    fn tick_steps(&mut self, now: Instant) -> bool {
        let taken = self.state.failover.tick(&self.loaded.policy, now);
        log_steps(&taken);
        self.note_steps(now);
        !taken.is_empty()
    }

    /// Notes `now` as the time of every failover step taken since the last call.
    fn note_steps(&mut self, now: Instant) {
        let removed = self.removed();
        let mut back = Vec::new();
        self.stepped.retain(|k, _| {
            let keep = removed.get(k).is_some_and(|&p| p > 0);
            if !keep {
                back.push(k.clone());
            }
            keep
        });
        for (name, cdn) in back {
            self.audit(
                "step",
                serde_json::json!({ "name": name, "cdn": cdn, "removed_percent": 0 }),
            );
        }
        for (key, &pct) in removed.iter().filter(|(_, &p)| p > 0) {
            if self.stepped.get(key).is_none_or(|&(was, _)| was != pct) {
                self.stepped.insert(key.clone(), (pct, now));
                self.audit(
                    "step",
                    serde_json::json!({ "name": key.0, "cdn": key.1, "removed_percent": pct }),
                );
            }
        }
    }

    fn removed(&self) -> Removed {
        self.state.removed(&self.loaded)
    }

    /// Serves the current state, saves it, and only then shows it in `/v1/state`: what
    /// an operator (or a test) sees there has been persisted.
    fn publish(&mut self) {
        self.note_steps(Instant::now());
        let snapshot = self.plan();
        self.export();
        if let Some(live) = &self.live {
            let snapshot = Arc::new(snapshot);
            self.metrics.adopt(&snapshot);
            live.store(snapshot);
        }
        self.persist();
    }

    /// Sets the gauges that describe the plan: health, removed percentages, drains.
    /// (`/metrics` reads the effective shares from the plan being served.)
    fn export(&mut self) {
        let m = &self.metrics;
        let removed = self.removed();
        // Every probed CDN, the ones without a verdict yet too (up until shown down):
        // its series exists from the start.
        for spec in &self.loaded.probes.specs {
            let up = self
                .state
                .failover
                .health
                .get(&spec.cdn)
                .is_none_or(|t| t.state == State::Up);
            m.health(&spec.cdn, up);
        }
        for host in &self.loaded.policy.hosts {
            let name = host.name.to_string();
            for cdn in &host.cdns {
                m.removed(
                    &name,
                    &cdn.name,
                    removed
                        .get(&(name.clone(), cdn.name.clone()))
                        .copied()
                        .unwrap_or(0),
                );
            }
        }
        let active: BTreeSet<(String, String)> = self
            .state
            .drains
            .report(&self.loaded.policy, now_ms())
            .into_iter()
            .filter(|d| d.status == DrainState::InForce)
            .map(|d| (d.name, d.cdn))
            .collect();
        for (name, cdn) in self.drain_gauges.difference(&active) {
            m.drain_active(name, cdn, false);
        }
        for (name, cdn) in &active {
            m.drain_active(name, cdn, true);
        }
        self.drain_gauges = active;
    }

    fn note_unhappy_peers(&mut self, views: &[VantageView]) {
        let now: BTreeMap<String, String> = views
            .iter()
            .filter_map(|v| health::unhappy(v).map(|u| (v.name.clone(), u.to_string())))
            .collect();
        let m = &self.metrics;
        for peer in now.keys() {
            m.vantage_unhappy(peer, true);
        }
        // A vantage point no longer unhappy loses its series: names come from peers,
        // and a peer renaming itself each reading must not grow /metrics.
        for peer in self.unhappy_peers.keys().filter(|p| !now.contains_key(*p)) {
            m.forget_vantage(peer);
        }
        for (peer, why) in &now {
            if self.unhappy_peers.get(peer) != Some(why) {
                warn!(peer = %peer, reason = %why, "vantage point unhappy: its failures do not count");
            }
        }
        for peer in self.unhappy_peers.keys().filter(|p| !now.contains_key(*p)) {
            info!(peer = %peer, "vantage point happy again");
        }
        self.unhappy_peers = now;
    }

    fn note_fail_open(&mut self, now: Vec<(String, String)>) {
        for (name, region) in now.iter().filter(|r| !self.fail_open.contains(r)) {
            warn!(name = %name, region = %region, "fail-open: a removed share has no other CDN of the region to go to; the CDN it belongs to keeps serving it");
            self.metrics.fail_open(name, region, true);
        }
        for (name, region) in self.fail_open.iter().filter(|r| !now.contains(r)) {
            info!(name = %name, region = %region, "fail-open over: every removed share of the region has somewhere to go");
            self.metrics.fail_open(name, region, false);
        }
        self.fail_open = now;
    }

    /// Saves the state and then shows it in `/v1/state` (see [`saver`]).
    fn persist(&mut self) {
        let saved = self
            .state_file
            .is_some()
            .then(|| self.state.saved(Instant::now()));
        self.show(saved);
    }

    /// Shows what changed in `/v1/state`, nothing of it saved state.
    fn update_doc(&mut self) {
        self.show(None);
    }

    /// Shows the document now, or through the saver once `saved` is written.
    fn show(&mut self, saved: Option<Saved>) {
        let mut doc = self.doc_now();
        if let Some(saver) = &self.saver {
            match saver.submit(saved, doc) {
                Ok(generation) => {
                    self.handed = Some(generation);
                    return;
                }
                Err(back) => {
                    saver::gone();
                    self.saver = None;
                    doc = *back;
                }
            }
        }
        doc.state_save = self.state_file.as_ref().map(|sf| SaveStatus {
            dir: sf.dir.display().to_string(),
            ok: false,
            error: Some("the state saver thread has stopped".into()),
            failed_saves: None,
        });
        *self.doc.lock().unwrap_or_else(|e| e.into_inner()) = Some(doc);
    }

    /// Answers an API call once what it changed is saved and shown, without holding up
    /// the controller meanwhile, and at the latest after [`REPLY_WAIT`]: on a hung disk
    /// the change serves and is answered, and `/v1/state` shows it once it is saved.
    fn reply<T: Send + 'static>(&mut self, reply: oneshot::Sender<T>, value: T) {
        let (Some(saver), Some(generation)) = (&self.saver, self.handed) else {
            let _ = reply.send(value);
            return;
        };
        let mut written = saver.written();
        tokio::spawn(async move {
            let saved = written.wait_for(|&w| w >= generation);
            let _ = tokio::time::timeout(REPLY_WAIT, saved).await;
            let _ = reply.send(value);
        });
    }

    /// The `/v1/state` document for the state now.
    fn doc_now(&self) -> StateDoc {
        let f = &self.state.failover;
        StateDoc {
            config_version: self.loaded.version.clone(),
            failover_frozen: f.frozen.clone(),
            failover_frozen_tenants: f.frozen_tenants.clone(),
            tenants: self.loaded.policy.tenants(),
            drains: self.state.drains.report(&self.loaded.policy, now_ms()),
            last_reload: self.last_reload.clone(),
            vantage: self.vantage.clone(),
            vantage_unhappy: self.own_unhappy.clone(),
            // Filled in by the saver, which knows how the save went.
            state_save: None,
            health: f
                .health
                .iter()
                .map(|(cdn, t)| {
                    let h = HealthDoc {
                        state: t.state.to_string(),
                        consecutive_down_rounds: t.bad,
                        consecutive_up_rounds: t.good,
                        last_verdict: self.verdicts.get(cdn).cloned(),
                        verdicts: self.verdict_counts.get(cdn).copied(),
                    };
                    (cdn.clone(), h)
                })
                .collect(),
            failover: self
                .removed()
                .into_iter()
                .map(|((name, cdn), pct)| StepDoc {
                    direction: f
                        .steps
                        .get(&(name.clone(), cdn.clone()))
                        .map(|s| s.direction),
                    since_unix_ms: self.stepped.get(&(name.clone(), cdn.clone())).map(
                        |&(_, at)| {
                            let ago = Instant::now().saturating_duration_since(at);
                            now_ms().saturating_sub(ago.as_millis() as u64)
                        },
                    ),
                    name,
                    cdn,
                    removed_percent: pct,
                })
                .collect(),
            fail_open: self
                .fail_open
                .iter()
                .map(|(name, region)| FailOpenDoc {
                    name: name.clone(),
                    region: region.clone(),
                })
                .collect(),
            cluster: self.cluster_doc(),
            peers: self
                .peer_views()
                .iter()
                .map(|v| PeerDoc {
                    name: v.name.clone(),
                    error: v.error.clone(),
                    unhappy: health::unhappy(v).map(|u| u.to_string()),
                })
                .collect(),
        }
    }
}

// === a node of a set (`--etcd`) ===

impl Controller {
    /// The other vantage points now: the set's from etcd, or the HTTP peers'. What a
    /// peer reports of a CDN this policy does not probe counts for nothing, not even
    /// towards "sees every CDN fail".
    fn peer_views(&self) -> Vec<VantageView> {
        let mut peers = self.shared_views().unwrap_or_else(|| self.peers.views());
        for p in &mut peers {
            p.latest
                .retain(|cdn, _| self.loaded.probes.get(cdn).is_some());
        }
        peers
    }

    /// The other vantage points of the set, from etcd (`None` for a single node).
    fn shared_views(&self) -> Option<Vec<VantageView>> {
        let c = self.cluster.as_ref()?;
        let shared = c.latest.as_ref()?;
        let probes = &self.loaded.probes;
        Some(
            shared
                .view
                .vantage_views(&c.node, |cdn| probes.get(cdn).is_some()),
        )
    }

    /// A new view or link state from the session.
    fn on_shared(&mut self, shared: Shared) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        let was_connected = c.connected();
        let connected = shared.link.connected;
        self.metrics.etcd_fail_static(!connected);
        if !connected {
            // Fail static: keep what was applied last; its timelines go on by the clock.
            c.latest = Some(match c.latest.take() {
                Some(mut old) => {
                    old.link = shared.link;
                    old
                }
                None => shared,
            });
            self.update_doc();
            return;
        }
        c.latest = Some(shared.clone());
        if let Some(a) = &self.audit {
            for (rev, entry) in shared.view.audit.range(c.audit_rev + 1..) {
                a.append_shared(*rev, entry.clone());
                c.audit_rev = *rev;
            }
        }
        self.note_refused(&shared.view);
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        let overrides: Applied = (
            shared.view.timelines.clone(),
            shared.view.drains.clone(),
            shared.view.freeze.clone(),
            shared.view.freeze_tenants.clone(),
        );
        if was_connected && c.applied.as_ref() == Some(&overrides) {
            return;
        }
        c.applied = Some(overrides);
        let pending = if was_connected {
            BTreeMap::new()
        } else {
            std::mem::take(&mut c.pending)
        };
        let now = Instant::now();
        let wall = now_ms();
        let view = &shared.view;
        let policy = &self.loaded.policy;
        // The freeze holds every timeline where it stood when it was set.
        let t = match &view.freeze {
            Some(f) => wall.min(f.at_unix_ms),
            None => wall,
        };
        let mut steps = BTreeMap::new();
        for ((name, cdn), (tl, _)) in &view.timelines {
            let Some(host) = policy
                .hosts
                .iter()
                .find(|h| h.name.to_string() == *name && h.cdns.iter().any(|x| x.name == *cdn))
            else {
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
                steps.insert((name.clone(), cdn.clone()), s);
            }
        }
        self.state.failover.steps = steps;
        let frozen = view
            .freeze
            .as_ref()
            .map(|f| format!("{} (by {})", f.reason, f.node));
        if frozen != self.state.failover.frozen {
            match &frozen {
                Some(why) => warn!(reason = %why, "automatic failover frozen for the whole set"),
                None => info!("automatic failover resumed for the whole set"),
            }
        }
        self.state.failover.frozen = frozen;
        self.state.failover.frozen_tenants = view
            .freeze_tenants
            .iter()
            .map(|(t, f)| (t.clone(), format!("{} (by {})", f.reason, f.node)))
            .collect();
        // In the order they were written: past the scope cap, every node refuses the
        // same (later) ones, also a node that reads them all at once.
        let mut written: Vec<&SharedDrain> = view
            .drains
            .values()
            .filter(|d| d.rule.resolve(policy).is_ok())
            .collect();
        written.sort_by_key(|d| (d.at_unix_ms, d.rule.id.clone()));
        self.state.drains.overrides = written.into_iter().map(|d| d.rule.clone()).collect();
        self.state.drains.sync(policy, now, wall);
        self.note_refused(view);
        self.note_steps(now);
        self.publish();
        // Back in touch: what this node's health decided meanwhile is written now.
        for (cdn, state) in pending {
            if self.state.failover.health.get(&cdn).map(|t| t.state) == Some(state) {
                info!(cdn = %cdn, to = %state, "etcd back: writing the health change made while it was unreachable");
                self.propose(&cdn, state);
            }
        }
    }

    /// Counts, logs and shows the keys of `view` that do not count, and the drains
    /// refused for their location scope.
    fn note_refused(&mut self, view: &cluster::SharedView) {
        let refused = refused_keys(view, &self.loaded) + self.state.drains.refused() as u64;
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        if refused == c.refused {
            return;
        }
        c.refused = refused;
        self.metrics.etcd_refused_keys(refused);
        if let Some(why) = &view.last_refused {
            warn!(refused, last = %why, "etcd: keys refused (they do not count)");
        }
        self.update_doc();
    }

    /// This node's health of `cdn` changed: start (or turn around) the shared timeline
    /// of every name that uses it, unless another node did first.
    fn propose(&mut self, cdn: &str, to: State) {
        let frozen = self.state.failover.frozen.is_some();
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        if frozen {
            warn!(cdn = %cdn, to = %to, "failover frozen: not acting on the health change");
            return;
        }
        if !c.connected() {
            warn!(cdn = %cdn, to = %to, "etcd unreachable: failing static, this node starts no failover on its own evidence (written when etcd is back)");
            c.pending.insert(cdn.to_string(), to);
            return;
        }
        let Some(shared) = &c.latest else { return };
        for host in self
            .loaded
            .policy
            .hosts
            .iter()
            .filter(|h| h.cdns.iter().any(|x| x.name == cdn) && !self.state.failover.held(h))
        {
            let name = host.name.to_string();
            let key = (name.clone(), cdn.to_string());
            let level = self.state.failover.steps.get(&key).map_or(0, |s| s.level);
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
            let timeline = Timeline {
                direction,
                from_level: level,
                start_unix_ms: now_ms(),
                node: c.node.clone(),
                reason: format!("{cdn} marked {to} by {}", c.node),
            };
            let (etcd, k) = (c.etcd.clone(), timeline_key(&c.prefix, &name, cdn));
            let value = serde_json::to_vec(&timeline).unwrap_or_default();
            tokio::spawn(async move {
                let r = match compare {
                    None => etcd.create(&k, &value).await,
                    Some(rev) => etcd.replace(&k, rev, &value).await,
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
    }

    /// The API's commands in a set: overrides go to etcd, and apply (here too) from the
    /// watch. Returns the commands answered as in a single node.
    fn on_cluster_command(&mut self, command: Command) -> Option<Command> {
        let policy = self.loaded.policy.clone();
        let known = match &command {
            Command::Freeze(l, _) | Command::Resume(l, _) => self.known_tenant(l),
            _ => Ok(()),
        };
        let c = self.cluster.as_mut()?;
        let connected = c.connected();
        let unreachable = || {
            c.latest
                .as_ref()
                .and_then(|s| s.link.error.clone())
                .unwrap_or_else(|| "not connected".into())
        };
        match command {
            Command::Drain(token, rule, reply) => {
                if !connected {
                    let _ = reply.send(Err(DrainError::Unavailable(unreachable())));
                    return None;
                }
                let mut scratch = self.state.drains.clone();
                let wall = now_ms();
                let rules = match admit(&mut scratch, &policy, &token, rule, wall) {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return None;
                    }
                };
                let mut writes = Vec::new();
                for mut rule in rules {
                    c.next_id += 1;
                    rule.id = format!("api-{}-{}-{}", c.node, wall, c.next_id);
                    rule.written_by = Some(c.node.clone());
                    rule.written_at_unix_ms = Some(wall);
                    // The key ends by itself a little after `until`.
                    let ttl = rule.until_unix_ms.map(|u| {
                        Duration::from_millis(u.saturating_sub(wall)) + Duration::from_secs(10)
                    });
                    let record = SharedDrain {
                        rule,
                        node: c.node.clone(),
                        at_unix_ms: wall,
                    };
                    writes.push((drain_key(&c.prefix, &record.rule.id), ttl, record));
                }
                let audits: Vec<_> = writes
                    .iter()
                    .map(|(_, _, d)| c.audit_entry("drain", audit_rule(&d.rule)))
                    .collect();
                let etcd = c.etcd.clone();
                tokio::spawn(async move {
                    let r = async {
                        for (key, ttl, record) in &writes {
                            let value = serde_json::to_vec(record).unwrap_or_default();
                            let lease = match ttl {
                                Some(t) => Some(etcd.grant(*t).await?),
                                None => None,
                            };
                            etcd.put(key, &value, lease).await?;
                        }
                        Ok::<(), cluster::EtcdError>(())
                    }
                    .await;
                    let _ = reply.send(match r {
                        Ok(()) => {
                            for (_, _, d) in &writes {
                                let rule = &d.rule;
                                info!(id = %rule.id, name = %rule.name, cdn = %rule.cdn, reason = %rule.reason, author = ?rule.author, "drain override written to etcd for the set");
                            }
                            for (key, entry) in audits {
                                put_audit(etcd.clone(), key, entry).await;
                            }
                            Ok(writes.into_iter().map(|(_, _, d)| d.rule).collect())
                        }
                        Err(e) => Err(DrainError::Unavailable(e.to_string())),
                    });
                });
                None
            }
            Command::Undrain(token, id, reply) => {
                let found = c
                    .latest
                    .as_ref()
                    .and_then(|s| s.view.drains.get(&id))
                    .map(|d| d.rule.clone());
                let Some(rule) = found else {
                    let _ = reply.send(Err(DrainError::NoSuchOverride(id)));
                    return None;
                };
                if let Err(e) = may_undrain(&policy, &token, Some(&rule)) {
                    let _ = reply.send(Err(e));
                    return None;
                }
                if !connected {
                    let _ = reply.send(Err(DrainError::Unavailable(unreachable())));
                    return None;
                }
                let (audit_key, entry) = c.audit_entry("undrain", undrain_fields(&rule, &token));
                let (etcd, key) = (c.etcd.clone(), drain_key(&c.prefix, &id));
                tokio::spawn(async move {
                    let r = etcd.delete(&key).await;
                    if r.is_ok() {
                        put_audit(etcd.clone(), audit_key, entry).await;
                    }
                    let _ = reply.send(match r {
                        Ok(()) => {
                            info!(id = %rule.id, name = %rule.name, cdn = %rule.cdn, "drain override removed from etcd for the set");
                            Ok(rule)
                        }
                        Err(e) => Err(DrainError::Unavailable(e.to_string())),
                    });
                });
                None
            }
            Command::Freeze(lever, reply) => {
                if !connected {
                    let _ = reply.send(Err(DrainError::Unavailable(unreachable())));
                    return None;
                }
                if let Err(e) = known {
                    let _ = reply.send(Err(e));
                    return None;
                }
                let (audit_key, entry) = c.audit_entry("freeze", lever.fields());
                let record = Freeze {
                    reason: lever.reason,
                    node: c.node.clone(),
                    at_unix_ms: now_ms(),
                };
                let key = match &lever.tenant {
                    Some(t) => cluster::tenant_freeze_key(&c.prefix, t),
                    None => freeze_key(&c.prefix),
                };
                let etcd = c.etcd.clone();
                tokio::spawn(async move {
                    let value = serde_json::to_vec(&record).unwrap_or_default();
                    let r = etcd.put(&key, &value, None).await;
                    if r.is_ok() {
                        put_audit(etcd.clone(), audit_key, entry).await;
                    }
                    let _ = reply.send(r.map_err(|e| DrainError::Unavailable(e.to_string())));
                });
                None
            }
            Command::Resume(lever, reply) => {
                if !connected {
                    let _ = reply.send(Err(DrainError::Unavailable(unreachable())));
                    return None;
                }
                if let Err(e) = known {
                    let _ = reply.send(Err(e));
                    return None;
                }
                let (audit_key, entry) = c.audit_entry("resume", lever.fields());
                let reason = lever.reason;
                // Every timeline starts again from where the freeze held it, in the
                // direction this node's health says; then the freeze is lifted.
                let wall = now_ms();
                let mut writes = Vec::new();
                let of_tenant = |h: &&crate::config::HostPolicy| {
                    lever.tenant.is_none() || h.tenant == lever.tenant
                };
                for host in policy.hosts.iter().filter(of_tenant) {
                    for cdn in &host.cdns {
                        let key = (host.name.to_string(), cdn.name.clone());
                        let level = self.state.failover.steps.get(&key).map_or(0, |s| s.level);
                        let down = self
                            .state
                            .failover
                            .health
                            .get(&cdn.name)
                            .is_some_and(|t| t.state == State::Down);
                        if level == 0 && !down {
                            continue;
                        }
                        let t = Timeline {
                            direction: if down {
                                Direction::Demote
                            } else {
                                Direction::Promote
                            },
                            from_level: level,
                            start_unix_ms: wall,
                            node: c.node.clone(),
                            reason: format!("resumed: {reason}"),
                        };
                        writes.push((timeline_key(&c.prefix, &key.0, &key.1), t));
                    }
                }
                let freeze = match &lever.tenant {
                    Some(t) => cluster::tenant_freeze_key(&c.prefix, t),
                    None => freeze_key(&c.prefix),
                };
                let etcd = c.etcd.clone();
                tokio::spawn(async move {
                    let r = async {
                        for (k, t) in &writes {
                            etcd.put(k, &serde_json::to_vec(t).unwrap_or_default(), None)
                                .await?;
                        }
                        etcd.delete(&freeze).await
                    }
                    .await;
                    if r.is_ok() {
                        put_audit(etcd.clone(), audit_key, entry).await;
                    }
                    let _ = reply.send(r.map_err(|e| DrainError::Unavailable(e.to_string())));
                });
                None
            }
            answered_here @ (Command::Explain(..) | Command::Audit(..)) => Some(answered_here),
        }
    }

    /// The set, for `/v1/state` (`None` for a single node).
    fn cluster_doc(&self) -> Option<ClusterDoc> {
        let c = self.cluster.as_ref()?;
        let shared = c.latest.as_ref();
        let view = shared.map(|s| s.view.clone()).unwrap_or_default();
        let link = shared.map(|s| s.link.clone());
        Some(ClusterDoc {
            node: c.node.clone(),
            prefix: c.prefix.clone(),
            connected: link.as_ref().is_some_and(|l| l.connected),
            fail_static: !link.as_ref().is_some_and(|l| l.connected),
            since_unix_ms: link.as_ref().map(|l| l.since_unix_ms),
            error: link.as_ref().and_then(|l| l.error.clone()),
            endpoint: link.map(|l| l.endpoint).unwrap_or_default(),
            vantages: view.observations.keys().cloned().collect(),
            timelines: view
                .timelines
                .iter()
                .map(|((name, cdn), (t, _))| TimelineDoc {
                    name: name.clone(),
                    cdn: cdn.clone(),
                    direction: t.direction,
                    from_level: t.from_level,
                    start_unix_ms: t.start_unix_ms,
                    written_by: t.node.clone(),
                    reason: t.reason.clone(),
                })
                .collect(),
            drains: view
                .drains
                .values()
                .map(|d| ClusterDrainDoc {
                    id: d.rule.id.clone(),
                    written_by: d.node.clone(),
                    written_at_unix_ms: d.at_unix_ms,
                    reason: d.rule.reason.clone(),
                })
                .collect(),
            freeze: view.freeze.clone(),
            refused_keys: c.refused,
            last_refused: view.last_refused.clone(),
            members: {
                let mut m: Vec<String> = c.members.clone();
                m.sort();
                m
            },
            clock_skew_ms: c.etcd.skew_ms(),
        })
    }
}

/// Keys of `view` that do not count: of a bad form, observations of CDNs not probed,
/// timelines and drains of names or CDNs outside the policy.
fn refused_keys(view: &cluster::SharedView, loaded: &Loaded) -> u64 {
    let policy = &loaded.policy;
    let cdns = view
        .observations
        .values()
        .flat_map(|cdns| cdns.keys())
        .filter(|cdn| loaded.probes.get(cdn).is_none())
        .count();
    let timelines = view
        .timelines
        .keys()
        .filter(|(name, cdn)| {
            !policy
                .hosts
                .iter()
                .any(|h| h.name.to_string() == *name && h.cdns.iter().any(|x| x.name == *cdn))
        })
        .count();
    let drains = view
        .drains
        .values()
        .filter(|d| d.rule.resolve(policy).is_err())
        .count();
    view.refused + (cdns + timelines + drains) as u64
}

/// What a reload changed: names added, removed and changed, probes, tokens.
fn reload_diff(old: &Loaded, new: &Loaded) -> serde_json::Value {
    let names = |l: &Loaded| -> BTreeMap<String, String> {
        l.policy
            .hosts
            .iter()
            .map(|h| (h.name.to_string(), format!("{h:?}")))
            .collect()
    };
    let (a, b) = (names(old), names(new));
    let added: Vec<&String> = b.keys().filter(|k| !a.contains_key(*k)).collect();
    let removed: Vec<&String> = a.keys().filter(|k| !b.contains_key(*k)).collect();
    let changed: Vec<&String> = b
        .iter()
        .filter(|(k, v)| a.get(*k).is_some_and(|o| o != *v))
        .map(|(k, _)| k)
        .collect();
    serde_json::json!({
        "names_added": added,
        "names_removed": removed,
        "names_changed": changed,
        "probes_changed": old.probes != new.probes,
        "tokens": new.tokens.list.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
    })
}

/// Writes an audit entry to etcd for the set (under a lease: every node has it by then).
async fn put_audit(etcd: Etcd, key: String, entry: serde_json::Value) {
    let value = serde_json::to_vec(&entry).unwrap_or_default();
    let r = async {
        let lease = etcd.grant(cluster::AUDIT_TTL).await?;
        etcd.put(&key, &value, Some(lease)).await
    }
    .await;
    if let Err(e) = r {
        warn!(key = %key, error = %e, "cannot write an audit entry to etcd: the set's log lacks it");
    }
}

/// Logs the steps time took.
fn log_steps(taken: &[Step]) {
    for (name, cdn, pct) in taken {
        info!(name = %name, cdn = %cdn, removed_percent = pct, "failover step");
    }
}

/// Spawns the prober of `probes` alone (for `agent`).
pub fn spawn_prober(
    probes: &Probes,
    vantage: &str,
    local: &Local,
    stop: &CancellationToken,
) -> mpsc::Receiver<Round> {
    let (tx, rx) = mpsc::channel(256);
    prober::spawn(
        probes.specs.clone(),
        vantage.to_string(),
        local.clone(),
        tx,
        stop.clone(),
    );
    rx
}

/// How often peers are read: as often as the most frequent probe.
pub fn peer_interval(probes: &Probes) -> Duration {
    probes
        .specs
        .iter()
        .map(|s| s.interval)
        .min()
        .unwrap_or(Duration::from_secs(10))
}
