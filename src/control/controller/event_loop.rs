//! Control plane: the controller's fields, its start (`new`, `join`, `restore`) and its
//! event loop (`run`): the main room of `controller/` (its door, `mod.rs`, says what
//! else lives there).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::clock::now_ms;
use crate::config::probes::Probes;
use crate::control::cluster::node::{Answer, ClusterLink};
use crate::control::cluster::{spawn_session, Shared};
use crate::control::decide::state::ControlState;
use crate::control::disk::audit::{self, Audit};
use crate::control::disk::persist;
use crate::control::disk::persist::Saved;
use crate::control::gauges::Gauges;
use crate::control::levers::command::Command;
use crate::control::modifiers::commit::Commit;
use crate::control::modifiers::perf::{self, Perf};
use crate::control::saver::Saver;
use crate::control::state_doc::{Noted, StateDoc};
use crate::control::store::Store;
use crate::control::surfaces::api::ScopedTokens;
use crate::control::tasks::peers::Peers;
use crate::control::tasks::prober::{self, Local, Round};
use crate::control::tasks::reload::Reloaded;
use crate::inputs::Loaded;
use crate::metrics::Metrics;
use crate::plan::Live;

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
/// answered anyway (see [`Controller::reply`]), and as long for its write to reach
/// this node's view.
pub(super) const REPLY_WAIT: Duration = Duration::from_secs(2);

/// The set a controller joins: its store (memory for a single node, etcd for a set),
/// the key prefix, the members whose observations count, and when to stop reading.
pub struct Joining {
    pub store: Store,
    pub prefix: String,
    pub members: Vec<String>,
    pub stop: CancellationToken,
}

pub struct Controller {
    pub(super) loaded: Arc<Loaded>,
    pub(super) vantage: String,
    pub(super) local: Local,
    pub(super) peers: Peers,
    /// What `/metrics` serves: gauges set on every change, counts of what happened.
    pub(super) metrics: Metrics,
    pub(super) live: Option<Arc<Live>>,
    /// Health, failover steps and freeze, and the drains (pure; see `state.rs`).
    pub(super) state: ControlState,
    /// What the controller notes as it goes (verdicts, steps taken, fail-open,
    /// reloads), for `/v1/state` and for logging changes once.
    pub(super) noted: Noted,
    /// What the gauges were last set to.
    pub(super) gauges: Gauges,
    pub(super) state_file: Option<StateFile>,
    /// The thread that saves the state and then shows `/v1/state` (with a state file).
    pub(super) saver: Option<Saver>,
    /// The generation of the latest hand-over to the saver: an API call is answered
    /// once it is saved and shown.
    pub(super) handed: Option<u64>,
    /// The document `/v1/state` serves.
    pub(super) doc: Arc<Mutex<Option<StateDoc>>>,
    /// The set this node belongs to (of one, its store in memory; or of many, in
    /// etcd): every lever is written there and every decision read from its view.
    pub(super) set: ClusterLink,
    /// API answers waiting until this node's view holds their write (revision, latest
    /// time to answer anyway, the answer).
    pub(super) waiting: Vec<(i64, Instant, Answer)>,
    /// The audit log (with a state file): mutations, reloads, health, steps.
    pub(super) audit: Option<Audit>,
    /// The API's scoped tokens, swapped on every reload.
    pub(super) tokens: ScopedTokens,
    /// The performance modifier of the policy weights (`performance:` blocks).
    pub(super) perf: Perf,
    /// The commit and capacity modifier, after performance (`contract:`,
    /// `capacity_mbps:`, `commit:`).
    pub(super) commit: Commit,
    /// The policy versions: the set's, the file's, one pending or refused.
    pub(super) versions: super::policy::Versions,
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
        joining: Joining,
    ) -> Controller {
        let rounds = Arc::new(tokio::sync::Notify::new());
        let (_, idle) = tokio::sync::watch::channel(Shared::default());
        let set = ClusterLink::new(
            joining.store.clone(),
            joining.prefix.clone(),
            vantage.clone(),
            joining.members.clone(),
            idle,
            rounds,
        );
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
            set,
            waiting: Vec::new(),
            audit: None,
            tokens: ScopedTokens::default(),
            perf: Perf::default(),
            commit: Commit::default(),
            versions: Default::default(),
        };
        let (file, text) = (&c.loaded.policy.version, &c.loaded.policy.source);
        c.versions.file = Some((file.clone(), Arc::from(text.as_str())));
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
            let started = std::fs::create_dir_all(&sf.dir).and_then(|()| {
                let metrics = Some(c.metrics.clone());
                Audit::start(path.clone(), c.vantage.clone(), audit::MAX_BYTES, metrics)
            });
            match started {
                Ok(a) => c.audit = Some(a),
                Err(e) => {
                    c.metrics.audit_failing(true);
                    error!(error = %e, file = %path.display(), "cannot open the audit log: mutations are refused (503) until it is repaired and the server restarted")
                }
            }
        }
        let saved = c.restore();
        c.state
            .drains
            .sync(&c.loaded.policy, Instant::now(), now_ms());
        c.join(joining, saved);
        c
    }

    /// Joins the set: a store that lives with this node (a set of one's) first gets
    /// back what was saved (or, from a state saved before the store, the decisions in
    /// force then), then the session reads and watches the store. Until its first read
    /// the node fails static.
    pub(super) fn join(&mut self, joining: Joining, saved: Option<Saved>) {
        let audit_rev = self.audit.as_ref().map_or(0, |a| a.start_rev);
        let (state, prefix, node) = (&self.state, &joining.prefix, &self.vantage);
        joining.store.restore(audit_rev, || {
            let saved = saved.as_ref()?;
            Some(saved.store.clone().unwrap_or_else(|| {
                super::upgrade::store_of(state, prefix, node, Instant::now(), now_ms())
            }))
        });
        self.metrics.etcd_fail_static(true);
        let (policy, scope) = tokio::sync::watch::channel(self.loaded.clone());
        self.set.policy = Some(policy);
        self.set.shared = spawn_session(
            joining.store,
            &joining.prefix,
            &joining.members,
            &self.vantage,
            scope,
            self.metrics.clone(),
            joining.stop,
        );
        self.set.audit_rev = audit_rev;
    }

    pub(super) fn restore(&mut self) -> Option<Saved> {
        let sf = self.state_file.as_ref()?;
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
                None
            }
            Err((fault, kept)) => {
                self.metrics.state_load_error(fault.reason());
                error!(
                    reason = fault.reason(),
                    error = %fault,
                    set_aside = %kept.as_ref().map_or("no".into(), |p| p.display().to_string()),
                    "saved state not restored: starting from the configured weights"
                );
                None
            }
            Ok(Some(saved)) => {
                let now = Instant::now();
                self.versions.saved = saved.policy.clone();
                if let Some(commit) = &saved.commit {
                    self.commit.restore(commit);
                }
                let shifts = self.perf.restore(&saved.performance, now_ms());
                self.state = saved.state(&self.loaded, now, now_ms());
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
                Some(saved)
            }
        }
    }

    /// Woken after each probe round (the set's publisher of observations waits on it).
    pub fn rounds(&self) -> Arc<tokio::sync::Notify> {
        self.set.rounds.clone()
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
    pub fn perf_store(&self) -> Arc<perf::Samples> {
        self.perf.store()
    }

    /// The audit log's head and health (`None`: no log), for its publisher in a set.
    pub fn audit_watch(&self) -> Option<crate::control::disk::audit::Watch> {
        self.audit.as_ref().map(Audit::watch)
    }

    /// Appends an entry to the audit log (when there is one); in a set, writes it to
    /// etcd, from where every node appends it.
    pub(super) fn audit(&mut self, kind: &str, fields: serde_json::Value) {
        let Some(a) = &self.audit else { return };
        match self.set.connected() {
            true => self.set.audit(kind, fields),
            false => a.record(kind, fields),
        }
    }

    /// The threads writing into the state directory: they return once this
    /// controller is gone and what it handed them is written.
    pub fn writers(&self) -> Vec<crate::control::disk::writers::Exited> {
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
        let mut shared = Some(self.set.shared.clone());
        let mut done = self.set.take_done();
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
                .chain(self.waiting.iter().map(|(_, at, _)| *at))
                .chain(self.set.unaudited_due())
                .chain(
                    self.perf
                        .next_due_ms()
                        .into_iter()
                        .chain(self.commit.next_due_ms())
                        .chain(self.version_due())
                        .chain(self.rollout_due())
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
                written = async {
                    match done.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => match written {
                    Some(d) => self.on_written(d),
                    None => done = None,
                },
                command = commands.recv(), if api_open => match command {
                    Some(c) => self.on_command(c),
                    None => api_open = false,
                },
                _ = due => {
                    if let Some(version) = self.take_due_version() {
                        if self.on_reload(version) {
                            probing.cancel();
                            probing = self.start_probing(&tx, &stop);
                        }
                    }
                    let now = Instant::now();
                    let mut changed = self.tick_steps(now);
                    changed |= self.tick_rollout();
                    changed |= self.state.drains.tick(&self.loaded.policy, now);
                    changed |= self.state.drains.sync(&self.loaded.policy, now, now_ms());
                    changed |= self.resign();
                    changed |= self.evaluate_perf();
                    changed |= self.evaluate_commit();
                    self.state.drains.prune(now_ms());
                    self.set.audit_unaudited(self.audit.as_ref());
                    self.answer_waiting(None);
                    if changed {
                        self.publish();
                    } else {
                        self.persist();
                    }
                }
            }
        }
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
