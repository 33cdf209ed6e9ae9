//! The bounded queue between the data plane and the one writer thread.
//!
//! A fixed pool of [`Record`]s, allocated at start, circulates through two bounded
//! lock-free channels: `free` (empty records) and `full` (records to write). The data
//! plane ([`Tap::log`]) takes a free record (none free: the frames are dropped and
//! counted), copies the query, the response and the decision into its buffers, and
//! pushes it; it never waits and, once the buffers have grown, never allocates. The
//! writer encodes each record (AUTH_QUERY, then AUTH_RESPONSE when one was sent) into
//! its own buffer, gives the record back, and writes, reconnecting with backoff when the
//! collector goes away. Memory is bounded by the pool: [`POOL`] records of
//! [`BASE_BYTES`], plus at most [`GROWN_LIMIT`] bytes for larger (TCP) messages.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, UNIX_EPOCH};

use crossbeam_channel::{bounded, Receiver, Sender, TryRecvError};

use super::frames::{self, ACCEPT, CONTENT_TYPE, FINISH, READY, START, STOP};
use super::message::{self, Record, CDN_CAPACITY, RULE_CAPACITY};
use crate::dns::retry::{self, Failure};

/// Records in the pool: the frames (two a record) that may wait for the writer.
pub(super) const POOL: usize = 2048;
/// Bytes of query and response a record holds without growing.
pub(super) const BASE_BYTES: usize = 2048;
/// Bytes that records may grow by in all (long TCP answers), kept once grown; past
/// it, a message that does not fit its record is dropped.
pub(super) const GROWN_LIMIT: usize = 4 << 20;
/// The writer's reconnection backoff: from the first to the last, doubling.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How long a connection attempt and the handshake's reads may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// One write's timeout; a collector that takes nothing for [`STALL_LIMIT`] is
/// dropped and reconnected to.
const WRITE_TIMEOUT: Duration = Duration::from_millis(200);
const STALL_LIMIT: Duration = Duration::from_secs(30);
/// How long the writer sleeps when the queue is empty: the most a frame waits, and
/// how often an idle writer looks whether its collector closed.
const TICK: Duration = Duration::from_millis(10);
/// Bytes written at once (many frames a write).
const BATCH_BYTES: usize = 64 << 10;

/// Where the frames go: `unix:PATH` or `tcp:HOST:PORT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(String),
}

/// Why a `--dnstap` value is not an endpoint.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// `tcp:` without a host and a port.
    #[error("{0}: tcp:HOST:PORT expected")]
    Tcp(String),
    /// Neither `unix:` nor `tcp:`.
    #[error("{0}: unix:PATH or tcp:HOST:PORT expected")]
    Scheme(String),
}

impl std::str::FromStr for Endpoint {
    type Err = EndpointError;

    fn from_str(s: &str) -> Result<Endpoint, EndpointError> {
        if let Some(path) = s.strip_prefix("unix:").filter(|p| !p.is_empty()) {
            Ok(Endpoint::Unix(PathBuf::from(path)))
        } else if let Some(addr) = s.strip_prefix("tcp:") {
            match addr.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                    Ok(Endpoint::Tcp(addr.to_string()))
                }
                _ => Err(EndpointError::Tcp(s.to_string())),
            }
        } else {
            Err(EndpointError::Scheme(s.to_string()))
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// `serve --dnstap`: where, how often, and who we are.
#[derive(Clone, Debug)]
pub struct Config {
    pub endpoint: Endpoint,
    /// One in `sample` unremarkable answers is written (1: every one).
    pub sample: u32,
    /// The node name (`identity` of every frame).
    pub identity: String,
}

/// The counters the writer and the data plane keep (`steerdns_dnstap_*`).
pub use crate::metrics::DnstapCounters as Counters;

struct Shared {
    free: (Sender<Box<Record>>, Receiver<Box<Record>>),
    full: (Sender<Box<Record>>, Receiver<Box<Record>>),
    sample: u32,
    /// Bytes the records have grown by past [`BASE_BYTES`].
    grown: AtomicUsize,
    stop: AtomicBool,
    counters: Counters,
}

/// The running writer; [`Dnstap::finish`] stops it after it wrote what is queued.
pub struct Dnstap {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
}

/// The data plane's end: one per UDP thread and per TCP connection (it keeps the
/// sampling count).
#[derive(Clone)]
pub struct Tap {
    shared: Arc<Shared>,
    countdown: u32,
}

/// Why a steered answer is what it is, as the data plane has it.
#[derive(Clone, Copy, Debug)]
pub struct Decided<S> {
    /// The planner's line (`Steered::why`).
    pub rule: S,
    pub cdn: S,
    /// The query's ECS source prefix (`None`: no ECS), and the scope echoed.
    pub ecs: Option<u8>,
    pub scope: u8,
    /// Not by the configured weights (failover, drain, fail-open): always written.
    pub remarkable: bool,
}

impl Decided<Arc<str>> {
    pub fn as_ref(&self) -> Decided<&str> {
        Decided {
            rule: &self.rule,
            cdn: &self.cdn,
            ecs: self.ecs,
            scope: self.scope,
            remarkable: self.remarkable,
        }
    }
}

/// One query and what became of it.
#[derive(Clone, Copy)]
pub struct Event<'a> {
    pub tcp: bool,
    pub client: SocketAddr,
    pub server: SocketAddr,
    /// When it was received (Unix seconds, nanoseconds: [`now`]).
    pub received: (u64, u32),
    pub query: &'a [u8],
    /// `None`: no response was sent (dropped by the rate limiter, or unanswerable).
    pub response: Option<&'a [u8]>,
    pub decision: Option<Decided<&'a str>>,
    /// Rate limited (slipped or dropped).
    pub limited: bool,
}

impl<'a> Event<'a> {
    /// `query` from `client` to `server` over TCP or UDP, received at `received`; not
    /// (yet) answered.
    pub fn new(
        tcp: bool,
        client: SocketAddr,
        server: SocketAddr,
        received: (u64, u32),
        query: &'a [u8],
    ) -> Event<'a> {
        Event {
            tcp,
            client,
            server,
            received,
            query,
            response: None,
            decision: None,
            limited: false,
        }
    }

    /// Answered with `response`.
    pub fn answer(self, response: &'a [u8]) -> Event<'a> {
        Event {
            response: Some(response),
            ..self
        }
    }

    /// A steered answer, for this reason.
    pub fn decided(self, decision: Decided<&'a str>) -> Event<'a> {
        Event {
            decision: Some(decision),
            ..self
        }
    }

    /// Rate limited: dropped, or slipped (with the truncated answer).
    pub fn limited(self) -> Event<'a> {
        Event {
            limited: true,
            ..self
        }
    }
}

/// The time now, as dnstap counts it.
pub fn now() -> (u64, u32) {
    let d = crate::clock::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs(), d.subsec_nanos())
}

/// Whether an answer must be written whatever the sampling: rate limited, not sent,
/// not steered by the configured weights, truncated, or an rcode other than NOERROR and
/// NXDOMAIN (REFUSED, SERVFAIL, FORMERR, NOTIMP, …).
pub fn remarkable(e: &Event<'_>) -> bool {
    let Some(r) = e.response else {
        return true;
    };
    let (Some(&flags), Some(&rcode)) = (r.get(2), r.get(3)) else {
        return true;
    };
    e.limited
        || flags & 0x02 != 0
        || !matches!(rcode & 0x0f, 0 | 3)
        || e.decision.as_ref().is_some_and(|d| d.remarkable)
}

impl Dnstap {
    /// Allocates the pool and starts the writer thread (it connects on its own, and
    /// again whenever the collector goes away).
    pub fn start(config: Config, counters: Counters) -> io::Result<Dnstap> {
        let free = bounded(POOL);
        let full = bounded(POOL);
        for _ in 0..POOL {
            let _ = free.0.try_send(Box::new(Record::new(BASE_BYTES)));
        }
        let shared = Arc::new(Shared {
            free,
            full,
            sample: config.sample.max(1),
            grown: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            counters,
        });
        let theirs = shared.clone();
        let writer = std::thread::Builder::new()
            .name("steerdns-dnstap".into())
            .spawn(move || run(&theirs, &config))?;
        Ok(Dnstap {
            shared,
            writer: Some(writer),
        })
    }

    pub fn tap(&self) -> Tap {
        Tap {
            shared: self.shared.clone(),
            countdown: 1,
        }
    }

    /// Asks the writer to write what is queued, send STOP and end; returns when it has
    /// (within a few seconds: a collector that does not read is left).
    pub async fn finish(mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(writer) = self.writer.take() {
            let joined = tokio::task::spawn_blocking(move || writer.join());
            let _ = tokio::time::timeout(Duration::from_secs(5), joined).await;
        }
    }
}

impl Drop for Dnstap {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

impl Tap {
    /// Hands one query and its answer to the writer, unless sampled out.
    ///
    /// # Hot path
    /// A branch for sampling; when written, one channel receive, copies into the
    /// record's buffers, one channel send. No allocation once the buffers have grown;
    /// never waits: without a free record the frames are dropped and counted.
    pub fn log(&mut self, e: &Event<'_>) {
        if self.keep(remarkable(e)) {
            self.write(e);
        }
    }

    /// Whether an answer is written: always when `remarkable`, else one in N
    /// (`--dnstap-sample`); each call counts. For the fast path, which then builds the
    /// event (the decision's text) only for answers written, and calls [`Tap::write`].
    #[inline]
    pub fn keep(&mut self, remarkable: bool) -> bool {
        if self.shared.sample > 1 && !remarkable {
            if self.countdown > 1 {
                self.countdown -= 1;
                return false;
            }
            self.countdown = self.shared.sample;
        }
        true
    }

    /// Hands `e` to the writer, whatever the sampling ([`Tap::keep`] decided).
    pub fn write(&mut self, e: &Event<'_>) {
        let s = &*self.shared;
        let frames = if e.response.is_some() { 2 } else { 1 };
        let Ok(mut r) = s.free.1.try_recv() else {
            s.counters.dropped.inc_by(frames);
            return;
        };
        let response = e.response.unwrap_or_default();
        let need = e.query.len() + response.len();
        if need > r.bytes.capacity() {
            // Grown records stay grown (no allocation once warmed, even for long
            // messages), within GROWN_LIMIT for the whole pool.
            let more = need - r.bytes.capacity();
            if s.grown.fetch_add(more, Ordering::Relaxed) + more > GROWN_LIMIT {
                s.grown.fetch_sub(more, Ordering::Relaxed);
                s.counters.dropped.inc_by(frames);
                let _ = s.free.0.try_send(r);
                return;
            }
            r.bytes.clear();
            r.bytes.reserve_exact(need);
        }
        r.tcp = e.tcp;
        r.client = e.client;
        r.server = e.server;
        r.query_time = e.received;
        r.response_time = now();
        r.bytes.clear();
        r.bytes.extend_from_slice(e.query);
        r.split = e.query.len();
        r.bytes.extend_from_slice(response);
        r.answered = e.response.is_some();
        r.rule.clear();
        r.cdn.clear();
        r.ecs = None;
        r.scope = 0;
        if let Some(d) = &e.decision {
            let rule = d.rule.as_bytes();
            let cdn = d.cdn.as_bytes();
            r.rule
                .extend_from_slice(&rule[..rule.len().min(RULE_CAPACITY)]);
            r.cdn.extend_from_slice(&cdn[..cdn.len().min(CDN_CAPACITY)]);
            r.ecs = d.ecs;
            r.scope = d.scope;
        }
        if let Err(e) = s.full.0.try_send(r) {
            // Cannot happen (the pool is no larger than the queue); counted anyway.
            s.counters.dropped.inc_by(frames);
            give_back(s, e.into_inner());
        }
    }
}

/// Returns a written (or dropped) record to the pool.
fn give_back(s: &Shared, r: Box<Record>) {
    let _ = s.free.0.try_send(r);
}

/// A connection to the collector.
enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.read(buf),
            Conn::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.write(buf),
            Conn::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Conn {
    /// Whether the collector closed (or wrote something, which a collector does only
    /// to finish): a write into a closed socket may still succeed once, losing its
    /// frames, so an idle writer looks before it writes.
    fn closed(&mut self) -> bool {
        let set = |conn: &Conn, on: bool| match conn {
            Conn::Unix(s) => s.set_nonblocking(on),
            Conn::Tcp(s) => s.set_nonblocking(on),
        };
        if set(self, true).is_err() {
            return true;
        }
        let mut buf = [0u8; 64];
        let closed = match self.read(&mut buf) {
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
            Ok(_) => true,
        };
        set(self, false).is_err() || closed
    }

    fn set_timeouts(&self, read: Duration, write: Duration) -> io::Result<()> {
        match self {
            Conn::Unix(s) => {
                s.set_read_timeout(Some(read))?;
                s.set_write_timeout(Some(write))
            }
            Conn::Tcp(s) => {
                s.set_read_timeout(Some(read))?;
                s.set_write_timeout(Some(write))
            }
        }
    }
}

/// The writer thread: connects, writes until the collector goes away, waits (100 ms
/// doubling to 5 s) and connects again, until [`Dnstap::finish`].
fn run(s: &Shared, config: &Config) {
    let version = format!("steerdns {}", env!("CARGO_PKG_VERSION"));
    let mut backoff = BACKOFF_MIN;
    let mut complained = false;
    while !s.stop.load(Ordering::Relaxed) {
        match connect(&config.endpoint) {
            Ok(conn) => {
                tracing::info!(to = %config.endpoint, "dnstap: connected");
                s.counters.connected.set(1);
                backoff = BACKOFF_MIN;
                complained = false;
                let ended = session(s, conn, config.identity.as_bytes(), version.as_bytes());
                s.counters.connected.set(0);
                match ended {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::warn!(to = %config.endpoint, error = %e, "dnstap: collector lost; reconnecting")
                    }
                }
            }
            Err(e) if !complained => {
                complained = true;
                tracing::warn!(to = %config.endpoint, error = %e, "dnstap: cannot connect; retrying");
            }
            Err(_) => {}
        }
        let until = Instant::now() + backoff;
        while Instant::now() < until && !s.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Connects and shakes hands: READY, the collector's ACCEPT, START.
fn connect(to: &Endpoint) -> io::Result<Conn> {
    let mut conn = match to {
        Endpoint::Unix(path) => Conn::Unix(UnixStream::connect(path)?),
        Endpoint::Tcp(addr) => {
            let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
            let mut found = None;
            for a in addr.to_socket_addrs()? {
                match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
                    Ok(s) => {
                        found = Some(s);
                        break;
                    }
                    Err(e) => last = e,
                }
            }
            let s = found.ok_or(last)?;
            let _ = s.set_nodelay(true);
            Conn::Tcp(s)
        }
    };
    conn.set_timeouts(CONNECT_TIMEOUT, CONNECT_TIMEOUT)?;
    let mut out = Vec::with_capacity(64);
    frames::control(READY, Some(CONTENT_TYPE), &mut out);
    conn.write_all(&out)?;
    match frames::read_control(&mut conn)? {
        (ACCEPT, true) => {}
        (ACCEPT, false) => {
            return Err(io::Error::other(
                "the collector does not accept protobuf:dnstap.Dnstap",
            ))
        }
        (other, _) => {
            return Err(io::Error::other(format!(
                "control frame {other} instead of ACCEPT"
            )))
        }
    }
    out.clear();
    frames::control(START, Some(CONTENT_TYPE), &mut out);
    conn.write_all(&out)?;
    conn.set_timeouts(CONNECT_TIMEOUT, WRITE_TIMEOUT)?;
    Ok(conn)
}

/// Writes queued records until stopped (`Ok`: STOP sent) or the connection fails.
fn session(s: &Shared, mut conn: Conn, identity: &[u8], version: &[u8]) -> io::Result<()> {
    let mut out = Vec::with_capacity(BATCH_BYTES + 8192);
    let (mut payload, mut scratch, mut line) = (Vec::new(), Vec::new(), Vec::new());
    loop {
        // Polled, not waited on: a writer blocked on the queue would have to be woken
        // (a system call on the query path) for each record queued while it sleeps.
        let first = match s.full.1.try_recv() {
            Ok(r) => r,
            Err(TryRecvError::Empty) if s.stop.load(Ordering::Relaxed) => {
                out.clear();
                frames::control(STOP, None, &mut out);
                conn.write_all(&out)?;
                // The collector's FINISH, if it sends one soon.
                let _ = frames::read_control(&mut conn).map(|(kind, _)| kind == FINISH);
                return Ok(());
            }
            Err(TryRecvError::Empty) if conn.closed() => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "the collector closed the connection",
                ))
            }
            Err(TryRecvError::Empty) => {
                std::thread::sleep(TICK);
                continue;
            }
            Err(TryRecvError::Disconnected) => return Ok(()),
        };
        out.clear();
        let mut n = 0;
        let mut next = Some(first);
        while let Some(r) = next {
            for response in [false, true] {
                if response && !r.answered {
                    continue;
                }
                payload.clear();
                message::encode(
                    &r,
                    response,
                    identity,
                    version,
                    &mut scratch,
                    &mut line,
                    &mut payload,
                );
                frames::data(&payload, &mut out);
                n += 1;
            }
            give_back(s, r);
            if out.len() >= BATCH_BYTES {
                break;
            }
            next = s.full.1.try_recv().ok();
        }
        if let Err(e) = write_patiently(&mut conn, &out, &s.stop) {
            s.counters.dropped.inc_by(n);
            return Err(e);
        }
        s.counters.frames.inc_by(n);
    }
}

/// Writes all of `buf`, waiting out a collector that is slow to read for up to
/// [`STALL_LIMIT`] without progress (less once stopping).
fn write_patiently(conn: &mut Conn, buf: &[u8], stop: &AtomicBool) -> io::Result<()> {
    let mut at = 0;
    let mut progress = Instant::now();
    while at < buf.len() {
        match conn.write(&buf[at..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(k) => {
                at += k;
                progress = Instant::now();
            }
            Err(e) => match retry::failure(&e) {
                Failure::Interrupted => {}
                Failure::TimedOut => {
                    let limit = if stop.load(Ordering::Relaxed) {
                        Duration::from_secs(2)
                    } else {
                        STALL_LIMIT
                    };
                    if progress.elapsed() > limit {
                        return Err(e);
                    }
                }
                Failure::Failed => return Err(e),
            },
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{IntCounter, IntGauge};

    #[test]
    fn endpoints_are_unix_paths_or_tcp_addresses() {
        assert_eq!(
            "unix:/run/tap.sock".parse(),
            Ok(Endpoint::Unix("/run/tap.sock".into()))
        );
        assert_eq!(
            "tcp:collector.example:6000".parse(),
            Ok(Endpoint::Tcp("collector.example:6000".into()))
        );
        assert_eq!(
            "tcp:[::1]:6000".parse(),
            Ok(Endpoint::Tcp("[::1]:6000".into()))
        );
        for bad in [
            "unix:",
            "tcp:host",
            "tcp::53",
            "tcp:h:99999",
            "/run/tap.sock",
            "udp:h:1",
        ] {
            assert!(bad.parse::<Endpoint>().is_err(), "{bad}");
        }
    }

    fn event<'a>(response: Option<&'a [u8]>, remarkable: bool) -> Event<'a> {
        Event {
            tcp: false,
            client: "192.0.2.1:1000".parse().unwrap(),
            server: "127.0.0.1:53".parse().unwrap(),
            received: (1, 2),
            query: b"0123456789ab",
            response,
            decision: Some(Decided {
                rule: "www.example.com. region=gb reason=normal",
                cdn: "fastly",
                ecs: None,
                scope: 0,
                remarkable,
            }),
            limited: false,
        }
    }

    #[test]
    fn what_is_remarkable_is_never_sampled_out() {
        let ok = [0, 0, 0x84, 0x00];
        assert!(!remarkable(&event(Some(&ok), false)));
        assert!(
            remarkable(&event(Some(&ok), true)),
            "failover, drain, fail-open"
        );
        assert!(remarkable(&event(None, false)), "no response");
        assert!(remarkable(&event(Some(&[0, 0, 0x86, 0x00]), false)), "TC");
        assert!(
            !remarkable(&event(Some(&[0, 0, 0x84, 0x03]), false)),
            "NXDOMAIN"
        );
        for rcode in [1, 2, 4, 5] {
            assert!(
                remarkable(&event(Some(&[0, 0, 0x84, rcode]), false)),
                "{rcode}"
            );
        }
        let mut limited = event(Some(&ok), false);
        limited.limited = true;
        assert!(remarkable(&limited));
    }

    fn counters() -> Counters {
        Counters {
            frames: IntCounter::new("f", "f").unwrap(),
            dropped: IntCounter::new("d", "d").unwrap(),
            connected: IntGauge::new("c", "c").unwrap(),
        }
    }

    #[test]
    fn one_in_n_unremarkable_answers_every_remarkable_one_and_a_full_pool_drops() {
        // Nobody listens: the records stay queued.
        let dir = std::env::temp_dir().join(format!("steerdns-tap-{}", std::process::id()));
        let config = Config {
            endpoint: Endpoint::Unix(dir.join("none.sock")),
            sample: 10,
            identity: "n".into(),
        };
        let c = counters();
        let dnstap = Dnstap::start(config, c.clone()).unwrap();
        let mut tap = dnstap.tap();
        let ok = [0, 0, 0x84, 0x00];
        for _ in 0..100 {
            tap.log(&event(Some(&ok), false));
        }
        assert_eq!(dnstap.shared.full.1.len(), 10);
        for _ in 0..5 {
            tap.log(&event(Some(&ok), true));
        }
        assert_eq!(dnstap.shared.full.1.len(), 15);
        for _ in 0..POOL {
            tap.log(&event(None, false));
        }
        assert_eq!(dnstap.shared.full.1.len(), POOL);
        assert_eq!(c.dropped.get(), 15, "one frame each, no response");
        assert_eq!(c.frames.get(), 0);
    }

    #[test]
    fn records_grow_for_long_messages_within_a_budget_and_stay_grown() {
        let dir = std::env::temp_dir().join(format!("steerdns-tap-grow-{}", std::process::id()));
        let config = Config {
            endpoint: Endpoint::Unix(dir.join("none.sock")),
            sample: 1,
            identity: "n".into(),
        };
        let c = counters();
        let dnstap = Dnstap::start(config, c.clone()).unwrap();
        let mut tap = dnstap.tap();
        // As many 64 KiB answers as the budget holds are queued; the rest are dropped.
        let long = vec![0u8; 65_535];
        let fit = GROWN_LIMIT / (65_535 + 12 - BASE_BYTES);
        for _ in 0..fit + 10 {
            tap.log(&event(Some(&long), false));
        }
        assert_eq!(dnstap.shared.full.1.len(), fit);
        assert_eq!(c.dropped.get(), 20);
        assert!(dnstap.shared.grown.load(Ordering::Relaxed) <= GROWN_LIMIT);
        // Given back, a grown record keeps its size.
        let r = dnstap.shared.full.1.try_recv().unwrap();
        assert!(r.bytes.capacity() >= 65_535 + 12);
        give_back(&dnstap.shared, r);
        assert_eq!(dnstap.shared.free.1.len(), POOL - fit + 1);
    }
}
