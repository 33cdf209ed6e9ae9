//! Lifecycle: load every input (refusing to start on any error), bind the sockets, run
//! the DNS tasks (`dns::udp`, `dns::tcp`) and the control plane, stop on SIGINT/SIGTERM.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::probes::Probes;
use crate::control::cluster::{self, ClusterOptions, Etcd};
use crate::control::content::{self, SteeringOptions};
use crate::control::controller::Joining;
use crate::control::controller::{self, Controller, StateFile};
use crate::control::disk::writers::Exited;
use crate::control::store::{Memory, Store};
use crate::control::surfaces::api::{self, ApiLimits, ApiState};
use crate::control::surfaces::book::Book;
use crate::control::surfaces::status::{self, History, StatusSource};
use crate::control::tasks::peers::Peers;
use crate::control::tasks::prober::Local;
use crate::control::tasks::reload;
use crate::dns::rrl::{Rrl, RrlConfig};
use crate::dns::tcp::{self, TcpLimits};
use crate::dns::{listen, udp, Handler};
use crate::metrics::Metrics;
use crate::plan::{Live, Snapshot};

pub use crate::inputs::{load, load_cached, GeoCache, Inputs, Loaded};

/// A running DNS server: one thread per UDP socket, one task per TCP listener. Dropping it
/// stops it.
pub struct Running {
    tasks: JoinSet<()>,
    udp_threads: Vec<udp::UdpThread>,
    shutdown: CancellationToken,
    addrs: Vec<SocketAddr>,
    live: Arc<Live>,
    cookies: Arc<crate::dns::cookie::Jar>,
    /// The dnstap writer (`--dnstap`), finished after the sockets have stopped.
    dnstap: Option<crate::dns::dnstap::Dnstap>,
}

/// Binds every address (UDP and TCP, the default number of UDP sockets) and starts
/// answering from `snapshot`, with metrics nobody reads (see [`start_with`]).
pub async fn start(snapshot: Snapshot, listen: &[SocketAddr]) -> io::Result<Running> {
    start_with_options(snapshot, listen, Metrics::new(), &DnsOptions::default()).await
}

/// How the DNS listeners treat their clients.
#[derive(Clone, Debug)]
pub struct DnsOptions {
    /// UDP sockets per address, sharing the port with SO_REUSEPORT.
    pub udp_sockets: usize,
    pub tcp: TcpLimits,
    pub rrl: RrlConfig,
    /// Bytes of cached full-path answers for the whole process, split evenly between
    /// the UDP threads (`--answer-cache-bytes`).
    pub answer_cache_bytes: usize,
    /// How often the DNS cookie secret is rotated (`--cookie-rotation-seconds`).
    pub cookie_rotation: Duration,
    /// Tests only (no flag sets it): a UDP thread receiving a query for this name
    /// (e.g. `panic.example.com.`) panics, to show that threads are supervised.
    #[doc(hidden)]
    pub udp_panic_on: Option<String>,
    /// `--dnstap` (with `--dnstap-sample` and the node name); `None`: no dnstap.
    pub dnstap: Option<crate::dns::dnstap::Config>,
}

impl Default for DnsOptions {
    fn default() -> Self {
        DnsOptions {
            udp_sockets: listen::default_udp_sockets(),
            tcp: TcpLimits::default(),
            rrl: RrlConfig::default(),
            answer_cache_bytes: crate::dns::cache::DEFAULT_BUDGET,
            cookie_rotation: crate::control::cookies::DEFAULT_ROTATION,
            udp_panic_on: None,
            dnstap: None,
        }
    }
}

/// Binds every address (`udp_sockets` UDP sockets sharing the port with SO_REUSEPORT,
/// and a TCP listener) and starts answering from `snapshot`, counting answers into
/// `metrics`.
pub async fn start_with(
    snapshot: Snapshot,
    listen: &[SocketAddr],
    udp_sockets: usize,
    metrics: Metrics,
) -> io::Result<Running> {
    let opts = DnsOptions {
        udp_sockets,
        ..DnsOptions::default()
    };
    start_with_options(snapshot, listen, metrics, &opts).await
}

/// As [`start_with`], with listener options other than the defaults.
pub async fn start_with_options(
    snapshot: Snapshot,
    listen: &[SocketAddr],
    metrics: Metrics,
    opts: &DnsOptions,
) -> io::Result<Running> {
    let snapshot = Arc::new(snapshot);
    metrics.adopt(&snapshot);
    let live = Arc::new(ArcSwap::new(snapshot));
    let dnstap = match &opts.dnstap {
        Some(config) => Some(crate::dns::dnstap::Dnstap::start(
            config.clone(),
            metrics.dnstap_counters(),
        )?),
        None => None,
    };
    let handler = Handler::new(live.clone(), metrics).with_tap(dnstap.as_ref().map(|d| d.tap()));
    let cookies = handler.cookies().clone();
    let rrl = Rrl::new(opts.rrl.clone()).map(Arc::new);
    let panic_on: udp::PanicOn = opts.udp_panic_on.as_deref().and_then(|name| {
        let name = hickory_proto::rr::Name::from_ascii(name).ok()?;
        let mut buf = [0; 255];
        let wire: Option<Arc<[u8]>> = crate::plan::wire_name(&name, &mut buf).map(Into::into);
        wire
    });
    let shutdown = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let mut udp_threads = Vec::new();
    let mut addrs = Vec::new();
    let threads = (listen.len() * opts.udp_sockets).max(1);
    let cache_bytes = opts.answer_cache_bytes / threads;
    for &addr in listen {
        let bound = listen::bind(addr, opts.udp_sockets)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
        for udp in bound.udp {
            udp_threads.push(udp::spawn(
                udp,
                handler.clone(),
                rrl.clone(),
                shutdown.clone(),
                tokio::runtime::Handle::current(),
                panic_on.clone(),
                cache_bytes,
            )?);
        }
        tasks.spawn(tcp::serve(
            bound.tcp,
            handler.clone(),
            opts.tcp,
            shutdown.clone(),
        ));
        addrs.push(bound.addr);
    }
    Ok(Running {
        tasks,
        udp_threads,
        shutdown,
        addrs,
        live,
        cookies,
        dnstap,
    })
}

impl Running {
    /// The bound addresses (UDP and TCP share each), in `--listen` order.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The live snapshot, for the control plane to replace.
    pub fn live(&self) -> &Arc<Live> {
        &self.live
    }

    /// The DNS cookie secrets the data plane reads, for the control plane to replace
    /// (`control::cookies`).
    pub fn cookies(&self) -> &Arc<crate::dns::cookie::Jar> {
        &self.cookies
    }

    /// A token that stops the server when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Stops the sockets, and returns when every socket task has ended.
    pub async fn stop(mut self) -> io::Result<()> {
        self.shutdown.cancel();
        self.wait().await
    }

    /// Runs until the shutdown token is cancelled and every socket task and thread has
    /// ended.
    pub async fn wait(&mut self) -> io::Result<()> {
        while let Some(ended) = self.tasks.join_next().await {
            if let Err(e) = ended {
                if e.is_panic() {
                    return Err(io::Error::other(format!("a DNS socket task panicked: {e}")));
                }
            }
        }
        self.shutdown.cancelled().await;
        for thread in &self.udp_threads {
            thread.wake();
        }
        for thread in self.udp_threads.drain(..) {
            thread.ended().await?;
        }
        // Every query answered has been handed over: write them, then STOP.
        if let Some(dnstap) = self.dnstap.take() {
            dnstap.finish().await;
        }
        Ok(())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.cancel();
        for thread in &self.udp_threads {
            thread.wake();
        }
    }
}

/// `--reload-poll-ms` unless given: how often `serve` checks its inputs for edits.
pub const DEFAULT_RELOAD_POLL_MS: u64 = 250;

/// How `serve` runs besides the DNS sockets.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Where the inputs are, to reload them.
    pub inputs: Inputs,
    /// How often the inputs are checked for changes (zero: only on SIGHUP).
    pub reload_poll: Duration,
    pub listen: Vec<SocketAddr>,
    /// UDP sockets, TCP limits, rate limiting.
    pub dns: DnsOptions,
    /// The HTTP API (observations for peers, state); `None` to run without.
    pub api: Option<SocketAddr>,
    /// Bearer token for the API's mutations; `None` refuses them.
    pub api_token: Option<String>,
    /// Names a read's `Host` may carry besides the API's address and `localhost`
    /// (`--api-host`).
    pub api_hosts: Vec<String>,
    /// Sources that read `GET /v1/audit` without a token (`--api-audit-open`).
    pub api_audit_open: Vec<ipnet::IpNet>,
    /// Where the status page's links to the manual lead (`--book`).
    pub book: Book,
    /// Where health and failover progress are saved; `None` to keep nothing.
    pub state: Option<StateFile>,
    /// This vantage point's name (in observations, logs and the probe User-Agent).
    pub vantage: String,
    /// This vantage point's public address (`--vantage-address`): the prober's rounds
    /// are performance samples of the region a client there gets; `None`: not used.
    pub vantage_address: Option<std::net::IpAddr>,
    /// A node of a set sharing observations, timelines and overrides through etcd
    /// (`--etcd`); `None` for a single node.
    pub cluster: Option<ClusterOptions>,
    /// Content steering for HLS and DASH players (`--steering-http`); `None` to run
    /// without.
    pub steering: Option<SteeringOptions>,
    /// Usage records for commit steering pulled from this URL (`--usage-url`), every
    /// `usage_poll`.
    pub usage_url: Option<reqwest::Url>,
    pub usage_poll: Duration,
}

/// How often `--usage-url` is read by default.
pub const DEFAULT_USAGE_POLL: Duration = Duration::from_secs(30);

/// The etcd client of a set, or why it cannot be made.
fn etcd_client(c: &ClusterOptions) -> io::Result<Etcd> {
    c.check().map_err(io::Error::other)?;
    if c.etcd.insecure && c.etcd.user.is_none() && c.etcd.cert_file.is_none() {
        tracing::warn!("--etcd-insecure: etcd without authentication, whoever reaches etcd can write observations and overrides");
    }
    Etcd::new(&c.etcd, cluster::CALL_TIMEOUT).map_err(|e| io::Error::other(format!("--etcd: {e}")))
}

/// How long a vantage point's observations outlive it: three of its probe intervals
/// (etcd lengthens a lease under about two seconds).
fn observation_ttl(probes: &Probes) -> Duration {
    (controller::peer_interval(probes) * 3).max(Duration::from_secs(2))
}

/// The whole server: DNS, prober, peers, controller and API. Dropping it stops it.
pub struct Service {
    pub dns: Running,
    pub api: Option<SocketAddr>,
    /// Where content steering manifests are served (`--steering-http`).
    pub steering: Option<SocketAddr>,
    /// What `/metrics` serves; the DNS handler and the prober count into it.
    pub metrics: Metrics,
    stop: CancellationToken,
    /// The threads writing into the state directory (see [`Service::stop`]).
    writers: Vec<Exited>,
}

/// Starts everything `serve` runs.
pub async fn serve(loaded: Loaded, opts: &ServeOptions) -> io::Result<Service> {
    let stop = CancellationToken::new();
    let metrics = Metrics::new();
    metrics.config_version(&loaded.version);
    metrics.policy_version(&loaded.policy.version);
    // This vantage point's series exists from the start (0: happy), for dashboards.
    metrics.vantage_unhappy(&opts.vantage, false);
    for spec in &loaded.probes.specs {
        metrics.cdn_probed(&spec.cdn);
    }
    let loaded = Arc::new(loaded);
    // The prober counts its rounds through `Local` (the controller spawns it).
    let (local, peers) = (Local::with_metrics(metrics.clone()), Peers::default());
    let mut cookie_set = None;
    let joining = match &opts.cluster {
        Some(c) => {
            if c.members.is_empty() {
                return Err(io::Error::other(
                    "--etcd needs --members: the names of the set's nodes and agents, the only vantage points that count",
                ));
            }
            let etcd = etcd_client(c)?;
            cookie_set = Some((etcd.clone(), cluster::cookie_key(&c.prefix)));
            Joining {
                store: Store::Etcd(etcd),
                prefix: c.prefix.clone(),
                members: c.members.clone(),
                stop: stop.clone(),
            }
        }
        // A single node is a set of one: its store is in memory, saved with the state.
        None => Joining {
            store: Store::Memory(Memory::new()),
            prefix: cluster::DEFAULT_PREFIX.into(),
            members: vec![opts.vantage.clone()],
            stop: stop.clone(),
        },
    };
    let store = joining.store.clone();
    let prefix = joining.prefix.clone();
    let mut controller = Controller::new(
        loaded.clone(),
        opts.vantage.clone(),
        local.clone(),
        peers.clone(),
        metrics.clone(),
        opts.state.clone(),
        joining,
    );
    if let Some(address) = opts.vantage_address {
        controller.measure_from(address);
    }
    if let Store::Etcd(_) = &store {
        cluster::Publisher {
            store: store.clone(),
            prefix: prefix.clone(),
            vantage: opts.vantage.clone(),
            local: local.clone(),
            probed: loaded.probes.specs.len(),
            ttl: observation_ttl(&loaded.probes),
        }
        .spawn(controller.rounds(), stop.clone());
        if let Some(audit) = controller.audit_watch() {
            cluster::heads::HeadPublisher {
                store: store.clone(),
                prefix: prefix.clone(),
                node: opts.vantage.clone(),
                audit,
            }
            .spawn(stop.clone());
        }
        cluster::performance::CellsPublisher {
            store: store.clone(),
            prefix,
            node: opts.vantage.clone(),
            samples: controller.perf_store(),
        }
        .spawn(stop.clone());
    }
    // The beacon samples by source network, for `steerdns diff` to weigh by.
    if let Some(state) = &opts.state {
        crate::control::disk::traffic::spawn(
            state.dir.clone(),
            controller.perf_store(),
            stop.clone(),
        );
    }
    let dns = start_with_options(
        controller.snapshot(),
        &opts.listen,
        metrics.clone(),
        &opts.dns,
    )
    .await?;
    crate::control::cookies::Keeper {
        jar: dns.cookies().clone(),
        dir: opts.state.as_ref().map(|s| s.dir.clone()),
        set: cookie_set,
        rotation: opts.dns.cookie_rotation,
    }
    .start(stop.clone())
    .map_err(|e| io::Error::other(format!("the DNS cookie secret: {e}")))?;
    let (command_tx, command_rx) = tokio::sync::mpsc::channel(16);
    let api = match opts.api {
        Some(addr) => {
            let history = Arc::new(std::sync::Mutex::new(History::default()));
            status::spawn_sampler(dns.live().clone(), history.clone(), stop.clone());
            let state = ApiState {
                vantage: opts.vantage.clone(),
                local: local.clone(),
                state: controller.doc(),
                commands: Some(command_tx.clone()),
                token: opts.api_token.clone(),
                tokens: controller.tokens(),
                metrics: metrics.clone(),
                status: Some(StatusSource {
                    live: dns.live().clone(),
                    history,
                    book: opts.book.clone(),
                }),
            };
            let limits = ApiLimits {
                hosts: opts.api_hosts.clone(),
                audit_open: opts.api_audit_open.clone(),
                ..ApiLimits::default()
            };
            Some(
                api::spawn_with(addr, state, limits, stop.clone())
                    .await
                    .map_err(|e| {
                        io::Error::new(e.kind(), format!("cannot listen on {addr} (--api): {e}"))
                    })?,
            )
        }
        None => None,
    };
    let steering = match &opts.steering {
        Some(s) => Some(
            content::spawn(
                content::SteeringOptions {
                    perf: controller.perf_store(),
                    // Tickets are signed with the kept (or the set's) cookie secret.
                    secrets: dns.cookies().clone(),
                    ..s.clone()
                },
                dns.live().clone(),
                metrics.clone(),
                stop.clone(),
            )
            .await
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot listen on {} (--steering-http): {e}", s.addr),
                )
            })?,
        ),
        None => None,
    };
    if let Some(url) = &opts.usage_url {
        crate::control::tasks::feed::spawn(
            url.clone(),
            opts.usage_poll,
            command_tx.clone(),
            stop.clone(),
        );
    }
    let (reload_tx, reload_rx) = tokio::sync::mpsc::channel(4);
    // The reload task loads the set's policy versions too, and the API's are checked
    // with the same inputs.
    let checker = crate::inputs::Checker::new(opts.inputs.clone(), loaded.geo_cache.clone())
        .in_a_set(opts.cluster.is_some());
    let (versions_tx, versions_rx) = tokio::sync::watch::channel(None);
    controller.load_versions_with(versions_tx, checker.clone(), reload_tx.clone());
    reload::spawn(
        checker,
        opts.reload_poll,
        reload_tx,
        stop.clone(),
        versions_rx,
        loaded.policy.dnssec.as_ref().map(|d| d.keys.clone()),
    );
    let writers = controller.writers();
    tokio::spawn(controller.run(dns.live().clone(), reload_rx, command_rx, stop.clone()));
    Ok(Service {
        dns,
        api,
        steering,
        metrics,
        stop,
        writers,
    })
}

impl Service {
    /// A token that stops everything when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.dns.shutdown_token()
    }

    /// Runs until the DNS server stops.
    pub async fn wait(&mut self) -> io::Result<()> {
        let r = self.dns.wait().await;
        self.stop.cancel();
        r
    }

    /// Stops everything (as dropping it does), then waits until the threads writing
    /// into the state directory (the saver, the audit log) have written what they were
    /// handed and returned: a service started next on the same directory has nothing
    /// of this one writing behind it. On a hung disk this waits for the disk.
    pub async fn stop(mut self) {
        let writers = std::mem::take(&mut self.writers);
        drop(self);
        for w in writers {
            w.wait().await;
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A running `agent`: the prober and the API, no DNS. Dropping it stops it.
pub struct Agent {
    pub api: SocketAddr,
    /// What `/metrics` serves: the prober's rounds.
    pub metrics: Metrics,
    stop: CancellationToken,
}

/// Starts a prober-only vantage point publishing on `api`.
pub async fn agent(probes: Probes, api_addr: SocketAddr, vantage: String) -> io::Result<Agent> {
    agent_with(probes, api_addr, vantage, None).await
}

/// As [`agent`], also writing the observations to etcd for a set (`agent --etcd`).
pub async fn agent_with(
    probes: Probes,
    api_addr: SocketAddr,
    vantage: String,
    cluster: Option<ClusterOptions>,
) -> io::Result<Agent> {
    let stop = CancellationToken::new();
    let metrics = Metrics::new();
    let local = Local::with_metrics(metrics.clone());
    let state = ApiState {
        vantage: vantage.clone(),
        local: local.clone(),
        state: Default::default(),
        commands: None,
        token: None,
        tokens: Default::default(),
        metrics: metrics.clone(),
        status: None,
    };
    let api = api::spawn(api_addr, state, stop.clone()).await?;
    let mut rounds = controller::spawn_prober(&probes, &vantage, &local, &stop);
    let notify = match &cluster {
        Some(c) => {
            let etcd = etcd_client(c)?;
            let notify = Arc::new(tokio::sync::Notify::new());
            cluster::Publisher {
                store: Store::Etcd(etcd),
                prefix: c.prefix.clone(),
                vantage: vantage.clone(),
                local: local.clone(),
                probed: probes.specs.len(),
                ttl: observation_ttl(&probes),
            }
            .spawn(notify.clone(), stop.clone());
            Some(notify)
        }
        None => None,
    };
    // Nothing decides here; keep the channel drained (and tell the publisher).
    tokio::spawn(async move {
        while rounds.recv().await.is_some() {
            if let Some(n) = &notify {
                n.notify_one();
            }
        }
    });
    Ok(Agent { api, metrics, stop })
}

impl Agent {
    pub fn shutdown_token(&self) -> CancellationToken {
        self.stop.clone()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
