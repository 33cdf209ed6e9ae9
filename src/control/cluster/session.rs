//! Control plane, a set: the session with etcd (read, watch, check liveness, fail
//! static) and the publisher of this vantage point's observations under a lease.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::scope::Scope;
use super::view::Mirror;
use super::{
    freeze_key, obs_key, EtcdError, Key, Link, Shared, SharedObservation, SharedView, Store,
    FAIL_STATIC_AFTER, LIVENESS, LIVENESS_TIMEOUT, MAX_AUDIT_PER_MEMBER, MAX_KIND_KEYS,
    MAX_MEMBER_KEYS, MAX_REASON,
};
use crate::clock::now_ms;
use crate::control::tasks::prober::Local;
use crate::inputs::Loaded;

/// Starts the session with the store: the controller reads [`Shared`] from the
/// returned receiver (the first value says "not yet connected"), and sends the policy
/// in force on `policy` (every key is checked against it: a new one is read anew).
pub fn spawn_session(
    store: Store,
    prefix: &str,
    members: &[String],
    node: &str,
    policy: watch::Receiver<Arc<Loaded>>,
    metrics: crate::metrics::Metrics,
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
    let scope = Scope::new(policy.borrow().clone(), members, node);
    let mirror = Mirror::new(prefix, scope);
    let prefix = prefix.to_string();
    let (members, node) = (members.to_vec(), node.to_string());
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = session(store, prefix, mirror, tx, policy, (members, node), metrics) => {}
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

/// Why a whole read gave no view.
enum ReadFailed {
    Store(EtcdError),
    /// More keys of one kind of the set's decisions than a read takes: a part of them
    /// is not a view.
    NotWhole(String),
}

/// What a part's reader hands the mirror.
enum Read {
    /// A page of keys (the part's cap not passed).
    Page(Vec<super::etcd::Kv>),
    /// A member's own keys past its cap: the rest were not read.
    Capped { under: String, why: String },
    /// The read gives no view.
    Failed(ReadFailed),
}

/// Reads every part of the store (`Key::parts`) into `mirror`: the first page gives
/// the revision and the member, then every part is paged at that revision from that
/// member, the parts side by side (a read costs a few round trips, not one per part),
/// each page going into the mirror as it comes (a refused value is dropped with its
/// page; at most a few pages are held). A part of the set's decisions past
/// [`MAX_KIND_KEYS`] fails the read; a member's own keys past its cap are refused
/// (its oldest audit entries, the last of its others). The store's revision and
/// the member.
async fn read_whole(
    store: &Store,
    prefix: &str,
    mirror: &mut Mirror,
) -> Result<(i64, usize), ReadFailed> {
    let members: Vec<String> = mirror.scope.members.iter().cloned().collect();
    let parts = Key::parts(members.iter().map(String::as_str));
    // The revision and the member: the first page of the first part.
    let first = store
        .range_page(&format!("{prefix}{}", parts[0].under), None, None, false)
        .await
        .map_err(ReadFailed::Store)?;
    let at = (first.revision, first.member);
    mirror.begin_read();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Read>(8);
    let mut readers = tokio::task::JoinSet::new();
    for (i, part) in parts.into_iter().enumerate() {
        let start = (i == 0).then(|| (first.kvs.clone(), first.more));
        let (store, prefix, tx) = (store.clone(), prefix.to_string(), tx.clone());
        readers.spawn(read_part(store, prefix, part, at, start, tx));
    }
    drop(tx);
    while let Some(read) = rx.recv().await {
        match read {
            Read::Page(kvs) => {
                let now = Instant::now();
                for kv in kvs {
                    mirror.read(kv, now);
                }
            }
            Read::Capped { under, why } => mirror.not_read(&under, why),
            // Dropping `readers` stops the others.
            Read::Failed(f) => return Err(f),
        }
    }
    mirror.end_read();
    Ok(at)
}

/// Pages one part at `at` into `tx` (`start`: its first page, already read).
async fn read_part(
    store: Store,
    prefix: String,
    part: crate::control::store::Part,
    at: (i64, usize),
    start: Option<(Vec<super::etcd::Kv>, bool)>,
    tx: tokio::sync::mpsc::Sender<Read>,
) {
    let under = format!("{prefix}{}", part.under);
    let cap = match (&part.member, part.newest_first) {
        (None, _) => MAX_KIND_KEYS,
        (Some(_), true) => MAX_AUDIT_PER_MEMBER,
        (Some(_), false) => MAX_MEMBER_KEYS,
    };
    let mut taken = 0;
    let mut page = start;
    let mut after: Option<String> = None;
    loop {
        let (mut kvs, more) = match page.take() {
            Some(p) => p,
            None => match store
                .range_page(&under, after.as_deref(), Some(at), part.newest_first)
                .await
            {
                Ok(p) => (p.kvs, p.more),
                Err(e) => {
                    let _ = tx.send(Read::Failed(ReadFailed::Store(e))).await;
                    return;
                }
            },
        };
        after = kvs.last().map(|kv| kv.key.clone()).or(after);
        let room = cap - taken;
        let past = kvs.len() > room || (kvs.len() == room && more);
        kvs.truncate(room);
        taken += kvs.len();
        if !kvs.is_empty() && tx.send(Read::Page(kvs)).await.is_err() {
            return;
        }
        if past {
            let read = match &part.member {
                None => Read::Failed(ReadFailed::NotWhole(format!(
                    "more than {cap} keys under {under}: the set's decisions were not read whole"
                ))),
                Some(m) => {
                    let which = if part.newest_first { "oldest" } else { "last" };
                    Read::Capped {
                        under: part.under.clone(),
                        why: format!(
                            "more than {cap} keys of member `{m}`: the {which} were not read"
                        ),
                    }
                }
            };
            let _ = tx.send(read).await;
            return;
        }
        if !more {
            return;
        }
    }
}

/// Why the session reads everything anew.
enum Again {
    /// The member watched failed: another one next.
    Member(EtcdError),
    /// A new policy: every key is checked against it.
    Policy,
}

async fn session(
    store: Store,
    prefix: String,
    mut mirror: Mirror,
    tx: watch::Sender<Shared>,
    mut policy: watch::Receiver<Arc<Loaded>>,
    (members, node): (Vec<String>, String),
    metrics: crate::metrics::Metrics,
) {
    let mut policy_open = true;
    loop {
        // Under the policy in force (a new one: every key is checked again).
        if policy.has_changed().unwrap_or(false) {
            let loaded = policy.borrow_and_update().clone();
            mirror.rescope(Scope::new(loaded, &members, &node));
        }
        // Read everything from the first member that answers; when none has within
        // FAIL_STATIC_AFTER, say so (fail static) and keep trying.
        let read = {
            let read = read_whole(&store, &prefix, &mut mirror);
            tokio::pin!(read);
            tokio::select! {
                r = &mut read => r,
                _ = tokio::time::sleep(FAIL_STATIC_AFTER) => {
                    set_link(&tx, store.endpoint_url(store.current()), Some(format!("no etcd member answered within {} ms", FAIL_STATIC_AFTER.as_millis())));
                    read.await
                }
            }
        };
        let (revision, member) = match read {
            Ok(r) => r,
            Err(ReadFailed::Store(e)) => {
                set_link(
                    &tx,
                    store.endpoint_url(store.current()),
                    Some(e.to_string()),
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(ReadFailed::NotWhole(why)) => {
                // Failing static, loudly, until the writer's junk is gone: the
                // decisions of a partial read could lack a drain or a freeze.
                set_link(&tx, store.endpoint_url(store.current()), Some(why));
                tokio::time::sleep(Duration::from_secs(2)).await;
                continue;
            }
        };
        release_memory();
        let view = Arc::new(mirror.view.clone());
        tx.send_modify(|s| {
            s.view = view;
            s.revision = revision;
        });
        set_link(&tx, store.endpoint_url(member), None);

        let watched_since = Instant::now();
        let (events_tx, mut events) = tokio::sync::mpsc::channel(64);
        let watching = store.watch(member, &prefix, revision + 1, &events_tx);
        tokio::pin!(watching);
        let mut alive = Box::pin(liveness(store.clone(), member, prefix.clone()));
        let again = loop {
            tokio::select! {
                e = &mut watching => break Again::Member(e),
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
                    Ok(()) => {
                        // Each check dates etcd's clock against this one's.
                        if let Some(skew) = store.skew_ms() {
                            metrics.etcd_clock_skew(skew);
                        }
                        alive = Box::pin(liveness(store.clone(), member, prefix.clone()));
                    }
                    Err(e) => break Again::Member(e),
                },
                changed = policy.changed(), if policy_open => {
                    if changed.is_ok() {
                        break Again::Policy;
                    }
                    policy_open = false;
                }
            }
        };
        let Again::Member(error) = again else {
            continue;
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
