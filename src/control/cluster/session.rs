//! Control plane, a set: the session with etcd (read, watch, check liveness, fail
//! static) and the publisher of this vantage point's observations under a lease.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::view::Mirror;
use super::{
    freeze_key, obs_key, EtcdError, Link, Shared, SharedObservation, SharedView, Store,
    FAIL_STATIC_AFTER, LIVENESS, LIVENESS_TIMEOUT, MAX_KEYS, MAX_REASON,
};
use crate::clock::now_ms;
use crate::control::tasks::prober::Local;

/// Starts the session with etcd: the controller reads [`Shared`] from the returned
/// receiver (the first value says "not yet connected").
pub fn spawn_session(
    store: Store,
    prefix: &str,
    members: &[String],
    node: &str,
    stop: CancellationToken,
) -> watch::Receiver<Shared> {
    let (tx, rx) = watch::channel(Shared {
        view: Arc::new(SharedView::default()),
        revision: 0,
        link: Link {
            connected: false,
            since_unix_ms: now_ms(),
            error: Some("not connected yet".into()),
            endpoint: store.endpoint_url(store.current()),
        },
    });
    let mirror = Mirror::new(prefix, members, node);
    let prefix = prefix.to_string();
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = session(store, prefix, mirror, tx) => {}
        }
    });
    rx
}

fn set_link(tx: &watch::Sender<Shared>, endpoint: String, error: Option<String>) {
    tx.send_if_modified(|s| {
        let connected = error.is_none();
        if s.link.connected == connected && s.link.error == error && s.link.endpoint == endpoint {
            return false;
        }
        if s.link.connected != connected {
            s.link.since_unix_ms = now_ms();
            match &error {
                None => info!(endpoint = %endpoint, "etcd: connected, following the shared state"),
                Some(e) => warn!(error = %e, "etcd unreachable: failing static (serving the last shared state, starting no demotion)"),
            }
        } else if connected {
            info!(endpoint = %endpoint, was = %s.link.endpoint, "etcd: following the shared state through another member");
        }
        s.link.connected = connected;
        s.link.error = error;
        s.link.endpoint = endpoint;
        true
    });
}

async fn session(store: Store, prefix: String, mut mirror: Mirror, tx: watch::Sender<Shared>) {
    loop {
        // Read everything from the first member that answers; when none has within
        // FAIL_STATIC_AFTER, say so (fail static) and keep trying.
        let read = store.range_prefix(&prefix, MAX_KEYS);
        tokio::pin!(read);
        let read = tokio::select! {
            r = &mut read => r,
            _ = tokio::time::sleep(FAIL_STATIC_AFTER) => {
                set_link(&tx, store.endpoint_url(store.current()), Some(format!("no etcd member answered within {} ms", FAIL_STATIC_AFTER.as_millis())));
                read.await
            }
        };
        let range = match read {
            Ok(r) => r,
            Err(e) => {
                set_link(
                    &tx,
                    store.endpoint_url(store.current()),
                    Some(e.to_string()),
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let member = range.member;
        if range.capped {
            warn!(
                max = MAX_KEYS,
                "etcd: more keys under the prefix than a node reads: the rest are ignored"
            );
        }
        mirror.replace(range.kvs, range.capped, Instant::now());
        release_memory();
        let view = Arc::new(mirror.view.clone());
        tx.send_modify(|s| {
            s.view = view;
            s.revision = range.revision;
        });
        set_link(&tx, store.endpoint_url(member), None);

        let watched_since = Instant::now();
        let (events_tx, mut events) = tokio::sync::mpsc::channel(64);
        let watching = store.watch(member, &prefix, range.revision + 1, &events_tx);
        tokio::pin!(watching);
        let mut alive = Box::pin(liveness(store.clone(), member, prefix.clone()));
        let error = loop {
            tokio::select! {
                e = &mut watching => break e,
                batch = events.recv() => {
                    let Some((batch, rev)) = batch else { continue };
                    mirror.apply(batch, Instant::now());
                    let view = Arc::new(mirror.view.clone());
                    tx.send_modify(|s| {
                        s.view = view;
                        s.revision = rev;
                    });
                }
                r = &mut alive => match r {
                    Ok(()) => alive = Box::pin(liveness(store.clone(), member, prefix.clone())),
                    Err(e) => break e,
                },
            }
        };
        // The member watched stopped answering (or lost its quorum): the read above,
        // from the next one, says whether this node is still in touch.
        warn!(error = %error, endpoint = %store.endpoint_url(member), "etcd: the member watched failed its check, moving to another");
        store.skip(member);
        if watched_since.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Gives back to the system the memory a full read used for a while (glibc keeps
/// freed memory in its arenas otherwise: refused values of many keys would stay in the
/// node's RSS).
fn release_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// After [`LIVENESS`], a linearizable read on the member watched: it fails on a member
/// without a quorum, and on one that does not answer within [`LIVENESS_TIMEOUT`].
async fn liveness(store: Store, member: usize, prefix: String) -> Result<(), EtcdError> {
    tokio::time::sleep(LIVENESS).await;
    match tokio::time::timeout(LIVENESS_TIMEOUT, store.check(member, &freeze_key(&prefix))).await {
        Ok(r) => r,
        Err(_) => Err(EtcdError::Unreachable(format!(
            "no answer within {} ms",
            LIVENESS_TIMEOUT.as_millis()
        ))),
    }
}

// === the publisher: this vantage point's observations, under a lease ===

/// This vantage point's observations, written to etcd under a lease.
pub struct Publisher {
    pub store: Store,
    pub prefix: String,
    pub vantage: String,
    /// Where the prober records its rounds.
    pub local: Local,
    /// How many CDNs this vantage point probes (until each is probed once, its
    /// failures do not count).
    pub probed: usize,
    /// The lease: about three probe intervals.
    pub ttl: Duration,
}

impl Publisher {
    /// Writes the observations each time `rounds` says a round ended, under a lease
    /// kept alive meanwhile: when this process dies or loses etcd, its observations
    /// vanish with the lease.
    pub fn spawn(self, rounds: Arc<tokio::sync::Notify>, stop: CancellationToken) {
        tokio::spawn(async move {
            let p = self;
            let mut lease: Option<i64> = None;
            // The round last written per CDN.
            let mut written: BTreeMap<String, u64> = BTreeMap::new();
            let mut keepalive = tokio::time::interval((p.ttl / 3).max(Duration::from_millis(300)));
            let mut failing = false;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = rounds.notified() => {}
                    _ = keepalive.tick() => {
                        if let Some(id) = lease {
                            if !matches!(p.store.keepalive(id).await, Ok(true)) {
                                lease = None;
                                written.clear();
                            }
                        }
                    }
                }
                let result = publish(
                    &p.store,
                    &p.prefix,
                    &p.vantage,
                    &p.local,
                    p.probed,
                    p.ttl,
                    &mut lease,
                    &mut written,
                )
                .await;
                match (result, failing) {
                    (Ok(()), true) => {
                        info!(vantage = %p.vantage, "etcd: observations published again");
                        failing = false;
                    }
                    (Ok(()), false) => {}
                    (Err(e), was) => {
                        if !was {
                            warn!(vantage = %p.vantage, error = %e, "etcd: cannot publish this vantage point's observations");
                        }
                        failing = true;
                        lease = None;
                        written.clear();
                    }
                }
            }
        });
    }
}

#[allow(clippy::too_many_arguments)]
async fn publish(
    store: &Store,
    prefix: &str,
    vantage: &str,
    local: &Local,
    probed: usize,
    ttl: Duration,
    lease: &mut Option<i64>,
    written: &mut BTreeMap<String, u64>,
) -> Result<(), EtcdError> {
    let latest = local.snapshot();
    if latest.is_empty() {
        return Ok(());
    }
    let id = match *lease {
        Some(id) => id,
        None => {
            let id = store.grant(ttl).await?;
            *lease = Some(id);
            id
        }
    };
    let all_probed = latest.len() >= probed;
    for (cdn, o) in &latest {
        if written.get(cdn) == Some(&o.round) {
            continue;
        }
        let record = SharedObservation {
            round: o.round,
            ok: o.ok,
            reason: o.reason.chars().take(MAX_REASON / 4).collect(),
            settled: all_probed && local.others_probed_since_failure(cdn),
        };
        let value = serde_json::to_vec(&record).unwrap_or_default();
        store
            .put(&obs_key(prefix, vantage, cdn), &value, Some(id))
            .await?;
        written.insert(cdn.clone(), o.round);
    }
    Ok(())
}
