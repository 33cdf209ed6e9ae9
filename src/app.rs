//! Lifecycle: load every input (refusing to start on any error), bind the sockets, run
//! hickory's server with our handler, stop on SIGINT/SIGTERM.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hickory_server::Server;
use tokio_util::sync::CancellationToken;

use crate::config::{self, Policy};
use crate::control::planner;
use crate::dns::geo::GeoDb;
use crate::dns::{listen, Handler};
use crate::error::{ConfigIssue, Issues};
use crate::plan::{Live, Snapshot};
use crate::zones::Zones;

/// Idle timeout of a TCP connection.
const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Responses queued per TCP connection before back-pressure (hickory's bin uses 32).
const TCP_RESPONSE_BUFFER: usize = 32;

/// Where the inputs are; the defaults are relative to the working directory, so a fresh
/// checkout serves its demo policy.
#[derive(Clone, Debug)]
pub struct Inputs {
    pub config: PathBuf,
    pub zones: PathBuf,
    pub geo: PathBuf,
}

impl Default for Inputs {
    fn default() -> Self {
        Inputs {
            config: "steering.yaml".into(),
            zones: "zones".into(),
            geo: "geo/country.mmdb".into(),
        }
    }
}

/// All inputs, loaded and validated together.
pub struct Loaded {
    pub policy: Policy,
    pub zones: Zones,
    pub geo: Arc<GeoDb>,
    /// Warnings from every file (the load succeeded).
    pub warnings: Issues,
}

/// Loads and validates the policy, the zones and the geo database; reports the problems
/// of all three at once.
pub fn load(inputs: &Inputs) -> Result<Loaded, Issues> {
    let mut issues = Issues::default();
    let policy = config::load(&inputs.config)
        .map_err(|e| issues.extend(e))
        .ok();
    let zones = Zones::load(&inputs.zones)
        .map_err(|e| issues.extend(e))
        .ok();
    let geo = GeoDb::open(&inputs.geo)
        .map_err(|e| issues.push(ConfigIssue::error(&e.path, None, "", e.reason)))
        .ok();
    let (Some((policy, warnings)), Some((zones, zone_warnings)), Some(geo)) = (policy, zones, geo)
    else {
        return Err(issues);
    };
    issues.extend(warnings);
    issues.extend(zone_warnings);
    issues.extend(config::check_against_zones(&policy, &zones));
    if issues.has_errors() {
        return Err(issues);
    }
    Ok(Loaded {
        policy,
        zones,
        geo: Arc::new(geo),
        warnings: issues,
    })
}

impl Loaded {
    /// The snapshot the data plane serves from.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            plan: planner::plan(&self.policy),
            geo: self.geo.clone(),
            zones: self.zones.catalog().clone(),
        }
    }
}

/// A running DNS server. Dropping it stops it.
pub struct Running {
    server: Server<Handler>,
    addrs: Vec<SocketAddr>,
    live: Arc<Live>,
}

/// Binds every address (UDP and TCP) and starts answering from `snapshot`.
pub async fn start(snapshot: Snapshot, listen: &[SocketAddr]) -> io::Result<Running> {
    let live = Arc::new(ArcSwap::from_pointee(snapshot));
    let mut server = Server::new(Handler::new(live.clone()));
    let mut addrs = Vec::new();
    for &addr in listen {
        let bound = listen::bind(addr)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
        server.register_socket(bound.udp);
        server.register_listener(bound.tcp, TCP_IDLE_TIMEOUT, TCP_RESPONSE_BUFFER);
        addrs.push(bound.addr);
    }
    Ok(Running {
        server,
        addrs,
        live,
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

    /// A token that stops the server when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.server.shutdown_token().clone()
    }

    /// Stops accepting, and returns when every socket task has ended.
    pub async fn stop(mut self) -> io::Result<()> {
        self.server
            .shutdown_gracefully()
            .await
            .map_err(io::Error::other)
    }

    /// Runs until the shutdown token is cancelled (or a socket fails).
    pub async fn wait(&mut self) -> io::Result<()> {
        self.server
            .block_until_done()
            .await
            .map_err(io::Error::other)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.server.shutdown_token().cancel();
    }
}
