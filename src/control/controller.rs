//! Control plane: the controller, the event loop (`Controller::run`). Each finished
//! probe round becomes a verdict (this vantage point's result plus the peers' fresh
//! ones, by quorum), the verdicts go through hysteresis, health changes start failover
//! steps, and every change of the steps publishes a new plan. An API command is checked
//! once (`on_command`), then applied here or, in a set, handed to the set's writer
//! (`cluster/node.rs`). Every state change is logged with its evidence, and the state
//! (`state.rs`) is saved so that a restart resumes where it was.
//!
//! ```text
//!  prober rounds ─┐
//!  peers' views ──┴─▶ verdict (quorum) ─▶ Tracker (hysteresis) ─▶ Stepper ─▶ planner ─▶ Live
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::net::IpAddr;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::clock::now_ms;
use crate::config::probes::Probes;
use crate::control::api::ScopedTokens;
use crate::control::audit::{self, Audit};
use crate::control::cluster::node::{ClusterLink, Followed};
use crate::control::cluster::Shared;
use crate::control::command::{
    admit, admit_usage, audit_rule, may_undrain, undrain_fields, Command, Lever, UsageRefused,
    UsageTaken,
};
use crate::control::commit::ledger::Taken;
use crate::control::commit::Commit;
use crate::control::drains::DrainError;
use crate::control::explain::{self, ExplainError, Explanation};
use crate::control::failover::Step;
use crate::control::gauges::{self, Gauges};
use crate::control::health::{self, State, VantageView, VerdictKind};
use crate::control::peers::Peers;
use crate::control::perf::{self, Perf};
use crate::control::persist::{self, Saved};
use crate::control::planner::Removed;
use crate::control::prober::{self, Local, Round};
use crate::control::reload::Reloaded;
use crate::control::saver::{self, Saver};
use crate::control::state::ControlState;
use crate::control::state_doc::{self, Noted, ReloadOutcome, SaveStatus, StateDoc};
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
    /// What the controller notes as it goes (verdicts, steps taken, fail-open,
    /// reloads), for `/v1/state` and for logging changes once.
    noted: Noted,
    /// What the gauges were last set to.
    gauges: Gauges,
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
    /// The performance modifier of the policy weights (`performance:` blocks).
    perf: Perf,
    /// The commit and capacity modifier, after performance (`contract:`,
    /// `capacity_mbps:`, `commit:`).
    commit: Commit,
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
            noted: Noted::default(),
            gauges: Gauges::default(),
            state_file,
            saver: None,
            handed: None,
            doc: Arc::new(Mutex::new(None)),
            cluster: None,
            audit: None,
            tokens: ScopedTokens::default(),
            perf: Perf::default(),
            commit: Commit::default(),
        };
        c.perf.configure(&c.loaded.policy, now_ms());
        c.commit.configure(&c.loaded.policy, now_ms());
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
            Ok(None) => {
                // Too old for health and steps, not for the month's usage.
                if let Some(ledger) = persist::saved_usage(&sf.dir) {
                    info!(
                        cdns = ledger.cdns.len(),
                        "restored the usage ledger of an old saved state"
                    );
                    self.commit.ledger = ledger;
                }
            }
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
                if let Some(commit) = &saved.commit {
                    self.commit.restore(commit);
                }
                let shifts = self.perf.restore(&saved.performance, now_ms());
                self.state = ControlState::from_saved(&saved, &self.loaded, now, now_ms());
                info!(
                    age_s = saved.age_ms() / 1000,
                    frozen = self.state.failover.frozen.is_some(),
                    overrides = self.state.drains.overrides.len(),
                    down = ?self.state.failover.down(),
                    steps = self.state.failover.steps.len(),
                    performance_shifts = shifts,
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
        // Modifiers change the policy weights; failover and drains apply after them.
        // perf.apply → commit.apply → failover and drains.
        let modified = self.perf.apply(&self.loaded.policy);
        let base = modified.as_ref().unwrap_or(&self.loaded.policy);
        let perf = &self.perf;
        let outside = |n: &str, r: usize, c: usize| perf.outside(n, r, c);
        let committed = self.commit.apply(base, &outside);
        let policy = committed.as_ref().unwrap_or(base);
        let (snapshot, fail_open) = self.state.snapshot_for(&self.loaded, policy);
        self.note_fail_open(fail_open);
        snapshot
    }

    /// When the DNSSEC signatures are to be replaced, if the zones are signed.
    fn resign_due(&self) -> Option<Instant> {
        let at_ms = self.loaded.dnssec.as_ref()?.due().saturating_mul(1000);
        // In ms: counted in whole seconds, a key's time could be acted on up to a second
        // late (now 12.9 s, due at 13 s: a wait of 1 s).
        let wait = at_ms.saturating_sub(now_ms());
        Some(Instant::now() + Duration::from_millis(wait))
    }

    /// Signs again when the signature window has moved on; a failure is logged and the
    /// last signatures keep serving. Whether there are new ones to publish.
    fn resign(&mut self) -> bool {
        let Some(d) = &self.loaded.dnssec else {
            return false;
        };
        let now = crate::clock::now_secs();
        match d.refresh(&self.loaded.policy, &self.loaded.zones, now) {
            Ok(changed) => {
                if changed {
                    let signed = d.signed();
                    let keys: Vec<String> = signed
                        .zones
                        .iter()
                        .map(|(z, published, active)| {
                            format!("{z} published {published:?} signing {active:?}")
                        })
                        .collect();
                    let until = signed.window.expiration;
                    info!(until = %crate::control::times::rfc3339(until * 1000), keys = %keys.join("; "), "DNSSEC: signed again");
                }
                changed
            }
            Err(e) => {
                error!(error = %e, "DNSSEC: signing failed; the last signatures keep serving");
                false
            }
        }
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

    /// Makes this node's prober a source of performance samples, located as a client
    /// at `address` is (`--vantage-address`).
    pub fn measure_from(&mut self, address: std::net::IpAddr) {
        self.perf.measure_from(address);
    }

    /// The store of performance samples (beacons, steering polls).
    pub fn perf_store(&self) -> Arc<perf::Store> {
        self.perf.store()
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
            Some(c) if c.connected() => c.audit(kind, fields),
            _ => a.record(kind, fields),
        }
    }

    /// The threads writing into the state directory: they return once this
    /// controller is gone and what it handed them is written.
    pub fn writers(&self) -> Vec<crate::control::writers::Exited> {
        let saver = self.saver.as_ref().map(Saver::exited);
        saver
            .into_iter()
            .chain(self.audit.as_ref().map(Audit::exited))
            .collect()
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
        self.perf.locate(&live.load());
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
                .chain(self.resign_due())
                .chain(
                    self.perf
                        .next_due_ms()
                        .into_iter()
                        .chain(self.commit.next_due_ms())
                        .map(|due| now + Duration::from_millis(due.saturating_sub(now_ms()))),
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
                    changed |= self.resign();
                    changed |= self.evaluate_perf();
                    changed |= self.evaluate_commit();
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

    /// An API command: checked once, then applied here and saved (a single node), or
    /// written to etcd and applied from the watch like any other node's (a set).
    fn on_command(&mut self, command: Command) {
        let now = Instant::now();
        let loaded = self.loaded.clone();
        let policy = &loaded.policy;
        match command {
            Command::Drain(token, rule, reply) => {
                let mut drains = self.state.drains.clone();
                let admitted = self
                    .writable()
                    .and_then(|()| admit(&mut drains, policy, &token, rule, now_ms()));
                let rules = match admitted {
                    Ok(rules) => rules,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                };
                if let Some(c) = self.cluster.as_mut() {
                    return c.write_drains(rules, reply);
                }
                self.state.drains = drains;
                for r in &rules {
                    info!(id = %r.id, name = %r.name, cdn = %r.cdn, reason = %r.reason, author = ?r.author, "drain override added over the API");
                    self.audit("drain", audit_rule(r));
                }
                self.state.drains.sync(policy, now, now_ms());
                self.publish();
                self.reply(reply, Ok(rules));
            }
            Command::Undrain(token, id, reply) => {
                let found = match &self.cluster {
                    Some(c) => c.written_drain(&id),
                    None => self
                        .state
                        .drains
                        .overrides
                        .iter()
                        .find(|o| o.id == id)
                        .cloned(),
                };
                let Some(rule) = found else {
                    let _ = reply.send(Err(DrainError::NoSuchOverride(id)));
                    return;
                };
                if let Err(e) = may_undrain(policy, &token, &rule) {
                    let _ = reply.send(Err(e));
                    return;
                }
                if let Some(c) = self.cluster.as_mut() {
                    return c.write_undrain(rule, &token, reply);
                }
                self.state.drains.remove(&id);
                info!(id = %rule.id, name = %rule.name, cdn = %rule.cdn, author = %token.name, "drain override removed over the API");
                self.audit("undrain", undrain_fields(&rule, &token));
                self.state.drains.sync(policy, now, now_ms());
                self.publish();
                self.reply(reply, Ok(rule));
            }
            Command::Freeze(lever, reply) => {
                if let Err(e) = self.writable().and_then(|()| self.known_tenant(&lever)) {
                    let _ = reply.send(Err(e));
                    return;
                }
                if let Some(c) = self.cluster.as_mut() {
                    return c.write_freeze(lever, reply);
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
                if let Err(e) = self.writable().and_then(|()| self.known_tenant(&lever)) {
                    let _ = reply.send(Err(e));
                    return;
                }
                if let Some(c) = self.cluster.as_mut() {
                    let turns = self.state.failover.turns(policy, lever.tenant.as_deref());
                    return c.write_resume(lever, &turns, reply);
                }
                info!(reason = %lever.reason, author = %lever.author, tenant = ?lever.tenant, "automatic failover resumed");
                self.audit("resume", lever.fields());
                let taken = match &lever.tenant {
                    Some(t) => self.state.failover.resume_tenant(policy, t, now),
                    None => self.state.failover.resume(policy, now),
                };
                log_steps(&taken);
                self.publish();
                self.reply(reply, Ok(()));
            }
            Command::Usage(records, strict, reply) => {
                let (records, skipped) = match admit_usage(policy, records, strict, now_ms()) {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = reply.send(Err(UsageRefused::Bad(e)));
                        return;
                    }
                };
                if let Some(c) = self.cluster.as_mut() {
                    return c.write_usage(records, skipped, reply);
                }
                let mut taken = UsageTaken {
                    skipped,
                    ..UsageTaken::default()
                };
                for (cdn, start, r) in records {
                    match self.commit.record(policy, &cdn, start, r) {
                        Ok(Taken::Added) => taken.added += 1,
                        Ok(Taken::Replaced) => taken.replaced += 1,
                        Ok(Taken::Same) => taken.unchanged += 1,
                        Err(_) => taken.skipped += 1,
                    }
                }
                self.commit.export(&self.metrics, now_ms());
                self.persist();
                self.reply(reply, Ok(taken));
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

    /// Whether a change can be made now: in a set, only while etcd answers (a node
    /// failing static refuses a change before looking at it).
    fn writable(&self) -> Result<(), DrainError> {
        self.cluster.as_ref().map_or(Ok(()), ClusterLink::writable)
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
            now: crate::clock::now_secs(),
            session,
        };
        let mut e = explain::explain(&facts, &question)?;
        e.performance = self.perf.region_view(&e.name, e.region.index);
        e.commit = self.commit.name_view(&e.name, now_ms());
        Ok(e)
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
                self.noted.last_reload = Some(ReloadOutcome {
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
                self.noted.last_reload = Some(ReloadOutcome {
                    trigger: trigger.to_string(),
                    result: "applied",
                    errors: Vec::new(),
                    serving_version: self.loaded.version.clone(),
                });
                self.state
                    .drains
                    .sync(&self.loaded.policy, Instant::now(), now_ms());
                self.perf.configure(&self.loaded.policy, now_ms());
                self.commit.configure(&self.loaded.policy, now_ms());
                self.publish();
                if let Some(live) = &self.live {
                    self.perf.locate(&live.load());
                }
                probes_changed
            }
        }
    }

    fn on_round(&mut self, round: Round) {
        let Some(spec) = self.loaded.probes.get(&round.cdn).cloned() else {
            return;
        };
        let taken = self
            .perf
            .probed(&round.cdn, round.ok, round.ttfb_ms, now_ms());
        self.metrics.rum_samples("probe", taken);
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
        if unhappy != self.noted.own_unhappy {
            self.metrics
                .vantage_unhappy(&self.vantage, unhappy.is_some());
            match &unhappy {
                Some(why) => {
                    warn!(vantage = %self.vantage, reason = %why, "this vantage point is unhappy: its failures do not demote any CDN")
                }
                None => info!(vantage = %self.vantage, "this vantage point is happy again"),
            }
            self.noted.own_unhappy = unhappy;
        }
        let mut views = vec![own];
        if let Some(c) = &self.cluster {
            c.rounds.notify_one();
            if let Some(skew) = c.etcd.skew_ms() {
                self.metrics.etcd_clock_skew(skew);
            }
        }
        let peers = self.peer_views();
        self.gauges.unhappy_peers(&self.metrics, &peers);
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
        let counts = self
            .noted
            .verdict_counts
            .entry(round.cdn.clone())
            .or_default();
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
        self.noted.verdicts.insert(
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
            if let Some(c) = self.cluster.as_mut() {
                c.propose(&self.state, &self.loaded, &t.cdn, t.to);
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
        self.noted.stepped.retain(|k, _| {
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
            if self
                .noted
                .stepped
                .get(key)
                .is_none_or(|&(was, _)| was != pct)
            {
                self.noted.stepped.insert(key.clone(), (pct, now));
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
    fn export(&mut self) {
        self.gauges.export(&self.metrics, &self.loaded, &self.state);
    }

    fn note_fail_open(&mut self, now: Vec<(String, String)>) {
        gauges::fail_open(&self.metrics, &self.noted.fail_open, &now);
        self.noted.fail_open = now;
    }

    /// Saves the state and then shows it in `/v1/state` (see [`saver`]).
    fn persist(&mut self) {
        let saved = self.state_file.is_some().then(|| {
            let mut saved = self.state.saved(Instant::now());
            saved.commit = Some(self.commit.saved());
            saved.performance = self.perf.saved();
            saved
        });
        self.show(saved);
    }

    /// Shows what changed in `/v1/state`, nothing of it saved state.
    fn update_doc(&mut self) {
        self.show(None);
    }

    /// Shows the document now, or through the saver once `saved` is written. The first
    /// document shows at once: the API never answers `null` while the saver is busy or
    /// the disk hangs at start (seen: `/v1/state` was `null` right after `serve`
    /// returned, on a machine running two test suites at once).
    fn show(&mut self, saved: Option<Saved>) {
        let mut doc = self.doc_now();
        {
            let mut shown = self.doc.lock().unwrap_or_else(|e| e.into_inner());
            if shown.is_none() {
                *shown = Some(doc.clone());
            }
        }
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

    /// Evaluates the performance shifts due now: put in force here, or in a set
    /// proposed and put in force from etcd. True when weights changed.
    fn evaluate_perf(&mut self) -> bool {
        let changed = match self.cluster.as_mut() {
            Some(c) => {
                c.propose_perf(&mut self.perf, now_ms());
                false
            }
            None => self.perf.tick(now_ms()),
        };
        self.perf.export(&self.metrics);
        changed
    }

    /// Evaluates the commit biases due now, against the policy after performance
    /// steering. True when a bias changed.
    fn evaluate_commit(&mut self) -> bool {
        let now = now_ms();
        if self.commit.next_due_ms().is_none_or(|d| d > now) {
            return false;
        }
        let modified = self.perf.apply(&self.loaded.policy);
        let base = modified.as_ref().unwrap_or(&self.loaded.policy);
        let perf = &self.perf;
        let outside = |n: &str, r: usize, c: usize| perf.outside(n, r, c);
        // In a set the biases are the set's: proposed here, put in force from etcd.
        let changed = match self.cluster.as_mut() {
            Some(c) => {
                c.propose_commit(&mut self.commit, base, &outside, now);
                false
            }
            None => self.commit.evaluate(base, &outside, now),
        };
        self.commit.export(&self.metrics, now);
        changed
    }

    /// In a set: the usage records and commit biases the set holds, taken into the
    /// ledger and put in force. `(a bias in force changed, anything new)`.
    fn follow_commit(&mut self) -> (bool, bool) {
        let Some(c) = self.cluster.as_mut() else {
            return (false, false);
        };
        let took = c.follow_usage(&mut self.commit, &self.loaded.policy);
        let newer = c.newer_biases(&self.commit, now_ms());
        let mut changed = false;
        if !newer.is_empty() {
            let modified = self.perf.apply(&self.loaded.policy);
            let base = modified.as_ref().unwrap_or(&self.loaded.policy);
            let perf = &self.perf;
            let outside = |n: &str, r: usize, c: usize| perf.outside(n, r, c);
            for (name, b) in &newer {
                let biases: Vec<_> = b.biases.iter().map(|(k, v)| (k.clone(), *v)).collect();
                changed |=
                    self.commit
                        .adopt(base, &outside, name, b.at_unix_ms, Some(&b.node), &biases);
            }
        }
        let new = took || !newer.is_empty();
        if new {
            self.commit.export(&self.metrics, now_ms());
        }
        (changed, new)
    }

    /// The `/v1/state` document for the state now.
    fn doc_now(&self) -> StateDoc {
        let doc = state_doc::Parts {
            loaded: &self.loaded,
            state: &self.state,
            vantage: &self.vantage,
            noted: &self.noted,
            cluster: self.cluster.as_ref(),
            peers: &self.peer_views(),
            performance: self.perf.view(),
            commit: self.commit.view(now_ms()),
        };
        doc.assemble()
    }
}

// === a node of a set (`--etcd`) ===

impl Controller {
    /// The other vantage points now: the set's from etcd, or the HTTP peers'. What a
    /// peer reports of a CDN this policy does not probe counts for nothing, not even
    /// towards "sees every CDN fail".
    fn peer_views(&self) -> Vec<VantageView> {
        let mut peers = match &self.cluster {
            Some(c) => c.vantage_views(&self.loaded),
            None => self.peers.views(),
        };
        for p in &mut peers {
            p.latest
                .retain(|cdn, _| self.loaded.probes.get(cdn).is_some());
        }
        peers
    }

    /// A new view or link state from the session: applied, then shown or published.
    fn on_shared(&mut self, shared: Shared) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        let audit = self.audit.as_ref();
        let followed = c.on_shared(shared, &mut self.state, &self.loaded, &self.metrics, audit);
        let shifted = c.follow_perf(&mut self.perf, now_ms());
        let (biased, new) = self.follow_commit();
        match followed {
            Followed::Nothing | Followed::Shown if biased || shifted => self.publish(),
            // New usage or an evaluation: saved (the ledger) and shown.
            Followed::Nothing | Followed::Shown if new => self.persist(),
            Followed::Nothing => {}
            Followed::Shown => self.update_doc(),
            Followed::Applied(pending) => {
                self.note_steps(Instant::now());
                self.publish();
                if let Some(c) = self.cluster.as_mut() {
                    c.catch_up(pending, &self.state, &self.loaded);
                }
            }
        }
    }
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
