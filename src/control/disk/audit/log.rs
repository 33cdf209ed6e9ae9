//! Control plane, the audit log: appending. One thread writes the lines (the
//! controller hands entries over a channel and goes on), keeps the [`Index`] of their
//! places as it writes, rotates the file past its size carrying the chain, and keeps
//! entries the disk refuses in order until it takes them again.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, RwLock};
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::oneshot;
use tracing::{error, warn};

use super::chain::{seal, Link};
use super::index::{Index, Page, PageError, Reader};
use super::{files, numbered, GENESIS, KEEP};
use crate::clock::now_ms;
use crate::control::disk::writers::{self, Exited};

/// The controller's end of the audit thread.
#[derive(Clone)]
pub struct Audit {
    tx: mpsc::Sender<Job>,
    /// Resolves once the thread has returned (every sender dropped, all appended).
    exited: Exited,
    /// The etcd revision of the last entry of the log when it was opened (a set).
    pub start_rev: i64,
    /// Whether the latest append reached the disk, the head of the chain, and why not.
    health: Arc<Health>,
    /// Reads pages, off the append thread.
    reader: Reader,
}

/// What the audit thread last managed (shared with the controller).
struct Health {
    failing: AtomicBool,
    /// (seq, hash) of the last line written, and the last error.
    head: Mutex<(u64, String, Option<String>)>,
    /// `steerdns_audit_failing` and `steerdns_audit_head_seq`.
    metrics: Option<crate::metrics::Metrics>,
    /// Entries handed to the thread so far.
    handed: AtomicU64,
    /// Entries the thread has dealt with (appended, or dropped past [`MAX_PENDING`]):
    /// a page waits for those handed before it was asked.
    dealt: Mutex<u64>,
    more_dealt: Condvar,
}

/// How long a page waits for the entries handed before it was asked (while the log
/// takes entries; not at all while it fails).
const PAGE_WAIT: Duration = Duration::from_secs(2);

impl Health {
    fn handed(&self) {
        self.handed.fetch_add(1, Ordering::Relaxed);
    }

    fn dealt(&self) {
        *self.dealt.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.more_dealt.notify_all();
    }

    /// Waits until the thread has dealt with `upto` entries, or the log fails, or
    /// [`PAGE_WAIT`] has passed: a client reads the entries of what it just did.
    fn wait_dealt(&self, upto: u64) {
        let deadline = std::time::Instant::now() + PAGE_WAIT;
        let mut dealt = self.dealt.lock().unwrap_or_else(|e| e.into_inner());
        while *dealt < upto && !self.failing.load(Ordering::Relaxed) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return;
            }
            dealt = match self.more_dealt.wait_timeout(dealt, left) {
                Ok((d, _)) => d,
                Err(e) => e.into_inner().0,
            };
        }
    }
}

/// Entries kept in memory while the disk refuses them (appended in order once it
/// takes them again); past it the oldest are dropped, with an error line.
const MAX_PENDING: usize = 10_000;

enum Job {
    Append(Map<String, Value>),
}

/// The file and the end of its chain.
pub(super) struct Log {
    pub(super) path: PathBuf,
    pub(super) node: String,
    pub(super) max_bytes: u64,
    pub(super) seq: u64,
    pub(super) prev: String,
    pub(super) size: u64,
    /// The places of the entries, for the pages.
    pub(super) index: Arc<RwLock<Index>>,
}

impl Audit {
    /// Starts the thread that appends to `path` (creating it), continuing the chain
    /// of what is there; entries are stamped with `node`.
    pub fn start(
        path: PathBuf,
        node: String,
        max_bytes: u64,
        metrics: Option<crate::metrics::Metrics>,
    ) -> std::io::Result<Audit> {
        cut_torn_tail(&path)?;
        let (seq, prev, start_rev) = tail_of(&path)?;
        let size = std::fs::metadata(&path).map_or(0, |m| m.len());
        let health = Arc::new(Health {
            failing: AtomicBool::new(false),
            head: Mutex::new((seq, prev.clone(), None)),
            metrics,
            handed: AtomicU64::new(0),
            dealt: Mutex::new(0),
            more_dealt: Condvar::new(),
        });
        if let Some(m) = &health.metrics {
            m.audit_failing(false);
            m.audit_head(seq);
        }
        // Built by the thread before it appends anything; pages read every file
        // until then.
        let index = Arc::new(RwLock::new(Index {
            stale: true,
            ..Index::default()
        }));
        let reader = Reader {
            path: path.clone(),
            index: index.clone(),
        };
        let mut log = Log {
            path,
            node,
            max_bytes,
            seq,
            prev,
            size,
            index,
        };
        let (tx, rx) = mpsc::channel::<Job>();
        let (alive, exited) = writers::pair();
        let shared = health.clone();
        std::thread::Builder::new()
            .name("audit".into())
            .spawn(move || {
                let _alive = alive;
                log.reindex();
                let mut pending = std::collections::VecDeque::new();
                loop {
                    // While failing, the disk is tried again every second.
                    let job = match rx.recv_timeout(Duration::from_secs(1)) {
                        Ok(job) => Some(job),
                        Err(mpsc::RecvTimeoutError::Timeout) => None,
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    };
                    match job {
                        Some(Job::Append(fields)) => {
                            if pending.len() == MAX_PENDING {
                                pending.pop_front();
                                shared.dealt();
                                error!(file = %log.path.display(), "the audit log has refused {MAX_PENDING} entries: the oldest is dropped");
                            }
                            pending.push_back(fields);
                        }
                        None if pending.is_empty() && shared.failing.load(Ordering::Relaxed) => {
                            // Nothing to append: see whether the file takes writes again.
                            let r = OpenOptions::new().create(true).append(true).open(&log.path).and_then(|f| f.sync_data());
                            log.noted(&shared, r.err());
                        }
                        None => {}
                    }
                    while let Some(fields) = pending.front() {
                        match log.append(fields.clone()) {
                            Ok(()) => {
                                pending.pop_front();
                                log.noted(&shared, None);
                                log.reindex();
                                shared.dealt();
                            }
                            Err(e) => {
                                log.noted(&shared, Some(e));
                                break;
                            }
                        }
                    }
                }
                // Entries the disk never took: said, not silently dropped.
                if !pending.is_empty() {
                    error!(lost = pending.len(), file = %log.path.display(), "audit entries never written: the disk refused them until the end");
                }
            })?;
        Ok(Audit {
            tx,
            exited,
            start_rev,
            health,
            reader,
        })
    }

    /// `None` while the log takes entries; else why not (mutations are refused then:
    /// nothing changes unaudited).
    pub fn failing(&self) -> Option<String> {
        self.watch().failing()
    }

    /// What the log managed last, to show (without keeping the thread alive).
    pub fn watch(&self) -> Watch {
        Watch(self.health.clone())
    }
}

/// The audit thread's health and head, as last written.
#[derive(Clone)]
pub struct Watch(Arc<Health>);

impl Watch {
    /// `None` while the log takes entries; else why not.
    pub fn failing(&self) -> Option<String> {
        if !self.0.failing.load(Ordering::Relaxed) {
            return None;
        }
        let head = self.0.head.lock().unwrap_or_else(|e| e.into_inner());
        Some(head.2.clone().unwrap_or_else(|| "cannot append".into()))
    }

    /// The head of the chain: the seq and hash of the last line written (`audit
    /// verify --expect-head SEQ:HASH` checks a copy against it).
    pub fn head(&self) -> (u64, String) {
        let head = self.0.head.lock().unwrap_or_else(|e| e.into_inner());
        (head.0, head.1.clone())
    }
}

impl Audit {
    /// Resolves once the thread has returned: after every clone of this is dropped,
    /// once what was handed over is appended.
    pub fn exited(&self) -> Exited {
        self.exited.clone()
    }

    /// Appends an entry shared through etcd at revision `rev` (a set): its fields are
    /// the same on every node, and so is the chain.
    pub fn append_shared(&self, rev: i64, entry: Value) {
        let Value::Object(mut map) = entry else {
            return;
        };
        map.insert("rev".into(), Value::from(rev));
        match self.tx.send(Job::Append(map)) {
            Ok(()) => self.health.handed(),
            Err(_) => warn!(rev, "the audit thread is gone: an entry is lost"),
        }
    }

    /// An entry of `kind` as it is shared (stamped with time and node here).
    pub fn entry(kind: &str, node: &str, fields: Value) -> Value {
        let mut map = match fields {
            Value::Object(m) => m,
            other => Map::from_iter([("detail".to_string(), other)]),
        };
        map.insert("kind".into(), Value::from(kind));
        map.insert("node".into(), Value::from(node));
        map.insert("at_unix_ms".into(), Value::from(now_ms()));
        Value::Object(map)
    }

    /// Records an event of `kind` with `fields` (an object); never waits on the disk.
    pub fn record(&self, kind: &str, fields: Value) {
        let mut map = match fields {
            Value::Object(m) => m,
            other => Map::from_iter([("detail".to_string(), other)]),
        };
        map.insert("kind".into(), Value::from(kind));
        match self.tx.send(Job::Append(map)) {
            Ok(()) => self.health.handed(),
            Err(_) => warn!(kind, "the audit thread is gone: an entry is lost"),
        }
    }

    /// Reads a page of entries with `seq` above `after` on a blocking thread of the
    /// runtime (never the append thread's, which goes on appending), and sends it. The
    /// entries handed over before it was asked are in it (it waits for them, while the
    /// log takes entries, at most 2 s): a client reads the entry of what it just did.
    pub fn page(&self, after: u64, limit: usize, reply: oneshot::Sender<Result<Page, PageError>>) {
        let (reader, health) = (self.reader.clone(), self.health.clone());
        let upto = health.handed.load(Ordering::Relaxed);
        let read = move || {
            health.wait_dealt(upto);
            let _ = reply.send(reader.page(after, limit).map_err(PageError::Read));
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(read)),
            Err(_) => read(),
        }
    }
}

impl Log {
    /// Builds the index again when it cannot be trusted (at start, after a rotation
    /// that failed half way); until it is, pages read every file.
    fn reindex(&self) {
        if !self.index.read().unwrap_or_else(|e| e.into_inner()).stale {
            return;
        }
        match Index::build(&self.path) {
            Ok(built) => *self.index.write().unwrap_or_else(|e| e.into_inner()) = built,
            Err(e) => {
                warn!(error = %e, file = %self.path.display(), "cannot index the audit log: its pages read every file")
            }
        }
    }

    /// Shares the outcome of a write: the head, and whether (and why) it failed; the
    /// change is logged once.
    fn noted(&self, health: &Health, error: Option<std::io::Error>) {
        let failing = error.is_some();
        let was = health.failing.swap(failing, Ordering::Relaxed);
        if let Some(m) = &health.metrics {
            m.audit_failing(failing);
            m.audit_head(self.seq);
        }
        let mut head = health.head.lock().unwrap_or_else(|e| e.into_inner());
        *head = (
            self.seq,
            self.prev.clone(),
            error
                .as_ref()
                .map(|e| format!("{}: {e}", self.path.display())),
        );
        match (&error, was) {
            (Some(e), false) => {
                error!(error = %e, file = %self.path.display(), "cannot append to the audit log: mutations are refused (503) until it can")
            }
            (None, true) => {
                tracing::info!(file = %self.path.display(), "the audit log takes entries again")
            }
            _ => {}
        }
    }

    pub(super) fn append(&mut self, mut fields: Map<String, Value>) -> std::io::Result<()> {
        fields.insert("seq".into(), Value::from(self.seq + 1));
        fields.insert("prev".into(), Value::from(self.prev.clone()));
        fields
            .entry("at_unix_ms")
            .or_insert_with(|| Value::from(now_ms()));
        fields
            .entry("node")
            .or_insert_with(|| Value::from(self.node.clone()));
        let (line, hash) = seal(&fields);
        if self.size > 0 && self.size + line.len() as u64 > self.max_bytes {
            // Renamed under the index's lock: a page opens the files of one generation.
            let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = rotate(&self.path) {
                index.stale = true;
                return Err(e);
            }
            index.rotated();
            self.size = 0;
        }
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        // Where the line starts: the file's end (a line cut short by a failed write
        // before it is not the previous size).
        let offset = f.metadata()?.len();
        f.write_all(line.as_bytes())?;
        f.sync_data()?;
        self.size = offset + line.len() as u64;
        self.seq += 1;
        self.prev = hash;
        let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
        let gen = index.gen;
        index.note(self.seq, gen, offset, offset == 0);
        index.size = self.size;
        Ok(())
    }
}

/// `audit.jsonl` → `audit.jsonl.1` → … → `.KEEP` (dropped past it).
fn rotate(path: &Path) -> std::io::Result<()> {
    let numbered = |n: usize| numbered(path, n);
    let _ = std::fs::remove_file(numbered(KEEP));
    for n in (1..KEEP).rev() {
        if numbered(n).exists() {
            std::fs::rename(numbered(n), numbered(n + 1))?;
        }
    }
    std::fs::rename(path, numbered(1))
}

/// A last line cut short (a crash while it was written: no newline ends it) is moved
/// to `audit.jsonl.torn-<ms>` and cut from the file, so the chain goes on from the
/// last whole line; logged.
fn cut_torn_tail(path: &Path) -> std::io::Result<()> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    if whole == bytes.len() {
        return Ok(());
    }
    let aside = PathBuf::from(format!("{}.torn-{}", path.display(), now_ms()));
    std::fs::write(&aside, &bytes[whole..])?;
    let f = OpenOptions::new().write(true).open(path)?;
    f.set_len(whole as u64)?;
    f.sync_all()?;
    warn!(file = %path.display(), cut_bytes = bytes.len() - whole, kept_in = %aside.display(), "the audit log's last line was cut short (a crash while it was written): cut, the chain goes on from the last whole line");
    Ok(())
}

/// The seq and hash of the last line of the log, and the etcd revision of its last
/// shared entry (a node's own entries carry none: one appended last must not make a
/// restarted node append the set's entries again); 0, [`GENESIS`], 0 when empty.
pub(super) fn tail_of(path: &Path) -> std::io::Result<(u64, String, i64)> {
    let mut head: Option<(u64, String)> = None;
    for file in files(path).iter().rev() {
        let (mut last, mut rev) = (None, 0);
        for line in BufReader::new(File::open(file)?).lines() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let link = Link::of(&line);
            if let Some(r) = link.as_ref().map(|l| l.rev).filter(|r| *r != 0) {
                rev = r;
            }
            last = Some(link);
        }
        let Some(link) = last else { continue };
        if head.is_none() {
            let Some(link) = link else {
                return Err(std::io::Error::other(format!(
                    "{}: the last line is not an audit entry: not continuing a broken chain (move the file aside)",
                    file.display()
                )));
            };
            head = Some((link.seq, link.hash));
        }
        if rev != 0 {
            let (seq, hash) = head.unwrap_or((0, GENESIS.to_string()));
            return Ok((seq, hash, rev));
        }
    }
    let (seq, hash) = head.unwrap_or((0, GENESIS.to_string()));
    Ok((seq, hash, 0))
}
