//! Control plane: the audit log, `STATE_DIR/audit.jsonl`. Every mutation over the API,
//! every reload, every health transition and every failover step is one JSON line;
//! each line carries the hash of the line before it (`prev`) and its own (`hash`, the
//! SHA-256 of the line's bytes before `,"hash":`), so that a line removed, changed or
//! reordered breaks the chain where it happened ([`verify`], `steerdns audit verify`).
//!
//! ```text
//! {"at_unix_ms":…,"cdn":"a","kind":"health","node":"ns1","prev":"<64 hex>","seq":7,…,"hash":"<64 hex>"}
//! ```
//!
//! Lines are written by one thread, so that no async worker waits on the disk; the
//! controller hands entries over a channel and goes on. Pages of `GET /v1/audit` are
//! read elsewhere ([`Reader`], on a blocking thread of the runtime), never on the
//! thread that appends: the append thread keeps an [`Index`] as it writes (the place
//! of the first line of each file and of every [`INDEX_EVERY`]th entry), so a page
//! after any seq seeks to at most 256 entries before it instead of reading the whole
//! log (80 MB at most). The log is bounded: past
//! [`MAX_BYTES`] the file becomes `audit.jsonl.1` (older ones `.2` … `.`[`KEEP`], the
//! oldest dropped) and the new file's first line carries the hash of the last line of
//! the old one, so the chain runs on across files.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, RwLock};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};
use tokio::sync::oneshot;
use tracing::{error, warn};

use crate::clock::now_ms;
use crate::config::tokens::{hex, sha256};
use crate::control::disk::writers::{self, Exited};

/// The file's size past which it is rotated.
pub const MAX_BYTES: u64 = 16 * 1024 * 1024;
/// Rotated files kept (`audit.jsonl.1` … `.4`).
pub const KEEP: usize = 4;
/// `prev` of the very first line.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// Entries a page of `GET /v1/audit` holds at most.
pub const MAX_PAGE: usize = 1000;
/// Every this many seqs, the index keeps an entry's place.
pub const INDEX_EVERY: u64 = 256;
const HASH_MARK: &str = ",\"hash\":\"";

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

/// Where the entries are in the files, kept by the append thread as it writes and read
/// by the pages ([`Reader`]) under a lock held only to look and to open the files.
#[derive(Debug, Default)]
pub(crate) struct Index {
    /// The current file `audit.jsonl` is generation `gen`, the rotated `audit.jsonl.k`
    /// generation `gen - k` (it starts at [`KEEP`], so that none is below 0).
    gen: u64,
    /// Bytes of whole lines in the current file: a page reads no further (a line
    /// being appended is not whole yet).
    size: u64,
    /// The place of the first entry of each file and of every entry whose seq is a
    /// multiple of [`INDEX_EVERY`], in order.
    points: Vec<Point>,
    /// The points cannot be trusted (not built yet, or a rotation failed half way):
    /// pages read every file until the append thread has rebuilt them.
    stale: bool,
}

/// Where one entry's line starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Point {
    seq: u64,
    gen: u64,
    offset: u64,
}

/// Just the seq of a line (the rest skipped, not built).
#[derive(serde::Deserialize)]
struct SeqOf {
    seq: u64,
}

impl Index {
    /// The index of the files of the log at `path`, read once (at start, and after a
    /// rotation that failed half way).
    fn build(path: &Path) -> std::io::Result<Index> {
        let gen = KEEP as u64;
        let mut index = Index {
            gen,
            ..Index::default()
        };
        for k in (0..=KEEP).rev() {
            let file = numbered(path, k);
            let f = match File::open(&file) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let (g, mut offset, mut first) = (gen - k as u64, 0u64, true);
            let mut r = BufReader::new(f);
            let mut line = Vec::new();
            loop {
                line.clear();
                let n = r.read_until(b'\n', &mut line)?;
                if n == 0 || line.last() != Some(&b'\n') {
                    break;
                }
                if let Ok(SeqOf { seq }) = serde_json::from_slice(&line) {
                    index.note(seq, g, offset, first);
                    first = false;
                }
                offset += n as u64;
            }
            if k == 0 {
                index.size = offset;
            }
        }
        Ok(index)
    }

    /// Keeps the place of the entry `seq` at `offset` of generation `gen` if it is the
    /// first of its file or its seq is a multiple of [`INDEX_EVERY`].
    fn note(&mut self, seq: u64, gen: u64, offset: u64, first_of_file: bool) {
        if first_of_file || seq.is_multiple_of(INDEX_EVERY) {
            self.points.push(Point { seq, gen, offset });
        }
    }

    /// The files were rotated: the current one is a new generation, and the places in
    /// the file dropped are forgotten.
    fn rotated(&mut self) {
        self.gen += 1;
        self.size = 0;
        let oldest = self.gen - KEEP as u64;
        self.points.retain(|p| p.gen >= oldest);
    }

    /// The place to start reading for the entries after `after`: the last point at or
    /// before `after + 1`, else the first point; `None` for an empty log.
    fn start(&self, after: u64) -> Option<Point> {
        let i = self
            .points
            .partition_point(|p| p.seq <= after.saturating_add(1));
        self.points.get(i.saturating_sub(1)).copied()
    }
}

/// `path` for `k` = 0, else `path.k`.
fn numbered(path: &Path, k: usize) -> PathBuf {
    match k {
        0 => path.to_path_buf(),
        k => PathBuf::from(format!("{}.{k}", path.display())),
    }
}

/// Reads pages of the log through its [`Index`]; cheap to clone.
#[derive(Clone)]
pub(crate) struct Reader {
    path: PathBuf,
    index: Arc<RwLock<Index>>,
}

impl Reader {
    /// Entries with `seq` above `after`, at most `limit` (1 to [`MAX_PAGE`]).
    pub(crate) fn page(&self, after: u64, limit: usize) -> std::io::Result<Page> {
        let limit = limit.clamp(1, MAX_PAGE);
        // Under the lock: where to start, and the files from there opened (a rotation
        // renames them, the open files stay what they were), and where the current one
        // ends. The reading is done without it.
        let (start, files, size) = {
            let index = self.index.read().unwrap_or_else(|e| e.into_inner());
            if index.stale {
                drop(index);
                return page(&self.path, after, limit);
            }
            let Some(start) = index.start(after) else {
                return Ok(Collect::new(after, limit).page());
            };
            let mut files = Vec::new();
            for gen in start.gen..=index.gen {
                match File::open(numbered(&self.path, (index.gen - gen) as usize)) {
                    Ok(f) => files.push((gen == start.gen, gen == index.gen, f)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            (start, files, index.size)
        };
        let mut collected = Collect::new(after, limit);
        for (first, current, mut f) in files {
            let from = if first { start.offset } else { 0 };
            f.seek(SeekFrom::Start(from))?;
            let lines: Box<dyn Read> = match current {
                true => Box::new(f.take(size.saturating_sub(from))),
                false => Box::new(f),
            };
            if collected.lines(BufReader::new(lines))? {
                break;
            }
        }
        Ok(collected.page())
    }
}

/// A page being collected from lines in order.
struct Collect {
    after: u64,
    limit: usize,
    entries: Vec<Value>,
    more: bool,
    lines_read: usize,
}

impl Collect {
    fn new(after: u64, limit: usize) -> Collect {
        Collect {
            after,
            limit: limit.clamp(1, MAX_PAGE),
            entries: Vec::new(),
            more: false,
            lines_read: 0,
        }
    }

    /// Takes the entries of `lines` after `after`; `true` once the page is full and
    /// another entry follows.
    fn lines(&mut self, lines: impl BufRead) -> std::io::Result<bool> {
        for line in lines.lines() {
            self.lines_read += 1;
            let Ok(v) = serde_json::from_str::<Value>(&line?) else {
                continue;
            };
            if v["seq"].as_u64().is_none_or(|s| s <= self.after) {
                continue;
            }
            if self.entries.len() == self.limit {
                self.more = true;
                return Ok(true);
            }
            self.entries.push(v);
        }
        Ok(false)
    }

    fn page(self) -> Page {
        let next_after = self
            .entries
            .last()
            .and_then(|v| v["seq"].as_u64())
            .unwrap_or(self.after);
        Page {
            entries: self.entries,
            next_after,
            more: self.more,
            lines_read: self.lines_read,
        }
    }
}

/// A page of `GET /v1/audit`.
#[derive(Debug, Serialize)]
pub struct Page {
    pub entries: Vec<Value>,
    /// Ask again with `after=` this for the next page.
    pub next_after: u64,
    /// More entries follow.
    pub more: bool,
    /// Lines read to make it (not served): what the index saves.
    #[serde(skip)]
    pub lines_read: usize,
}

/// The file and the end of its chain.
struct Log {
    path: PathBuf,
    node: String,
    max_bytes: u64,
    seq: u64,
    prev: String,
    size: u64,
    /// The places of the entries, for the pages.
    index: Arc<RwLock<Index>>,
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
    pub fn page(&self, after: u64, limit: usize, reply: oneshot::Sender<Result<Page, String>>) {
        let (reader, health) = (self.reader.clone(), self.health.clone());
        let upto = health.handed.load(Ordering::Relaxed);
        let read = move || {
            health.wait_dealt(upto);
            let _ = reply.send(reader.page(after, limit).map_err(|e| e.to_string()));
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

    fn append(&mut self, mut fields: Map<String, Value>) -> std::io::Result<()> {
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

/// The line of `fields` (with its newline) and its hash.
fn seal(fields: &Map<String, Value>) -> (String, String) {
    let body = Value::Object(fields.clone()).to_string();
    let open = &body[..body.len() - 1];
    let hash = hex(&sha256(open.as_bytes()));
    (format!("{open}{HASH_MARK}{hash}\"}}\n"), hash)
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

/// The files of the log, oldest first.
pub fn files(path: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = (1..=KEEP)
        .rev()
        .map(|n| PathBuf::from(format!("{}.{n}", path.display())))
        .filter(|p| p.exists())
        .collect();
    if path.exists() {
        out.push(path.to_path_buf());
    }
    out
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
fn tail_of(path: &Path) -> std::io::Result<(u64, String, i64)> {
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

/// Entries with `seq` above `after`, at most `limit`, read from the first line of the
/// oldest file on (while the index cannot be trusted).
fn page(path: &Path, after: u64, limit: usize) -> std::io::Result<Page> {
    let mut collected = Collect::new(after, limit);
    for file in files(path) {
        if collected.lines(BufReader::new(File::open(file)?))? {
            break;
        }
    }
    Ok(collected.page())
}

/// What a line says of its place in the chain.
#[derive(Debug, PartialEq)]
struct Link {
    seq: u64,
    prev: String,
    hash: String,
    /// The hash matches the line's bytes.
    intact: bool,
    /// The etcd revision of a shared entry (0: none).
    rev: i64,
}

impl Link {
    fn of(line: &str) -> Option<Link> {
        let at = line.rfind(HASH_MARK)?;
        let (open, rest) = line.split_at(at);
        let hash = rest[HASH_MARK.len()..].strip_suffix("\"}")?.to_string();
        let v: Value = serde_json::from_str(line).ok()?;
        Some(Link {
            seq: v["seq"].as_u64()?,
            prev: v["prev"].as_str()?.to_string(),
            intact: hex(&sha256(open.as_bytes())) == hash,
            rev: v["rev"].as_i64().unwrap_or(0),
            hash,
        })
    }
}

/// Whether `files` (an intact chain) hold the entry of the published `head`
/// (`SEQ:HASH`): a copy cut short before it, or rewritten and rehashed from some line
/// on, does not.
pub fn check_head(files: &[PathBuf], head: &str) -> Result<(), String> {
    let (seq, hash) = head
        .split_once(':')
        .and_then(|(s, h)| Some((s.parse::<u64>().ok()?, h)))
        .filter(|(_, h)| h.len() == 64)
        .ok_or_else(|| {
            format!("--expect-head {head}: not SEQ:HASH (a number, a colon, 64 hex digits)")
        })?;
    let mut last = 0;
    for file in files {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        for line in text.lines() {
            let Some(link) = Link::of(line) else { continue };
            last = link.seq;
            if link.seq == seq {
                return if link.hash == hash {
                    Ok(())
                } else {
                    Err(format!(
                        "rewritten: entry {seq} has the hash {}, the head published says {hash}",
                        link.hash
                    ))
                };
            }
        }
    }
    Err(format!(
        "cut short: the head published is entry {seq}, the files end at entry {last}"
    ))
}

/// Where a chain is broken: the file, the line (1-based) and what is wrong there.
#[derive(Debug, PartialEq)]
pub struct Broken {
    pub file: PathBuf,
    pub line: usize,
    pub what: String,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.what)
    }
}

/// What an intact chain holds.
#[derive(Debug, PartialEq)]
pub struct Verified {
    pub entries: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    pub last_hash: String,
}

/// Checks the chain through `files` (oldest first): every line's hash, and each line
/// linking to the one before it with the next `seq`. Names the first line removed,
/// changed or reordered. The chain must start at seq 1, unless the oldest file is the
/// oldest rotation kept (`….jsonl.4`), whose older predecessors were dropped.
pub fn verify(files: &[PathBuf]) -> Result<Verified, Broken> {
    let oldest_kept = files
        .first()
        .is_some_and(|f| f.to_string_lossy().ends_with(&format!(".jsonl.{KEEP}")));
    let mut last: Option<(u64, String)> = None;
    let mut out = Verified {
        entries: 0,
        first_seq: 0,
        last_seq: 0,
        last_hash: GENESIS.into(),
    };
    for file in files {
        let broken = |line: usize, what: String| Broken {
            file: file.clone(),
            line,
            what,
        };
        let text =
            std::fs::read_to_string(file).map_err(|e| broken(0, format!("cannot read: {e}")))?;
        let lines: Vec<&str> = text.lines().collect();
        let seqs: Vec<Option<u64>> = lines.iter().map(|l| Link::of(l).map(|k| k.seq)).collect();
        for (i, line) in lines.iter().enumerate() {
            let n = i + 1;
            let Some(link) = Link::of(line) else {
                return Err(broken(
                    n,
                    "changed: not an audit entry (no seq, prev or hash)".into(),
                ));
            };
            if !link.intact {
                return Err(broken(
                    n,
                    "changed: its hash does not match its content".into(),
                ));
            }
            match &last {
                None => {
                    if link.seq == 1 && link.prev != GENESIS {
                        return Err(broken(
                            n,
                            "changed: the first entry links to another".into(),
                        ));
                    }
                    if link.seq != 1 && !oldest_kept {
                        return Err(broken(n, format!("line(s) removed before this one: seq 1 to {} are missing (a rotated log: give its older files first)", link.seq - 1)));
                    }
                    out.first_seq = link.seq;
                }
                Some((seq, hash)) => {
                    let want = seq + 1;
                    if link.seq != want {
                        let elsewhere = seqs.iter().position(|s| *s == Some(want));
                        return Err(broken(
                            n,
                            match elsewhere {
                                Some(j) => format!("reordered: seq {} where seq {want} belongs (that is on line {})", link.seq, j + 1),
                                None if link.seq > want => format!("line(s) removed before this one: seq {want} to {} are missing", link.seq - 1),
                                None => format!("reordered: seq {} comes after seq {seq}", link.seq),
                            },
                        ));
                    }
                    if link.prev != *hash {
                        return Err(broken(
                            n.saturating_sub(1).max(1),
                            format!(
                                "changed: line {n} records another hash for the line before it"
                            ),
                        ));
                    }
                }
            }
            out.entries += 1;
            out.last_seq = link.seq;
            out.last_hash = link.hash.clone();
            last = Some((link.seq, link.hash));
        }
    }
    Ok(out)
}

/// One entry for a person: time, node, kind and the rest, `key=value`.
pub fn human(line: &str) -> String {
    let Ok(Value::Object(m)) = serde_json::from_str::<Value>(line) else {
        return format!("(not an audit entry) {line}");
    };
    let at = m
        .get("at_unix_ms")
        .and_then(Value::as_u64)
        .map(|ms| {
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
            )
            .to_string()
        })
        .unwrap_or_default();
    let s = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let mut out = format!(
        "{:>6} {at} {} {:<10}",
        m.get("seq").and_then(Value::as_u64).unwrap_or(0),
        s("node"),
        s("kind")
    );
    for (k, v) in &m {
        if matches!(
            k.as_str(),
            "seq" | "at_unix_ms" | "node" | "kind" | "prev" | "hash"
        ) {
            continue;
        }
        match v {
            Value::String(t) => out.push_str(&format!(" {k}={t:?}")),
            other => out.push_str(&format!(" {k}={other}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("steerdns-audit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn write(path: &Path, max: u64, n: u64) -> Reader {
        let index = Arc::new(RwLock::new(Index::build(path).unwrap()));
        let mut log = Log {
            path: path.to_path_buf(),
            node: "t".into(),
            max_bytes: max,
            seq: 0,
            prev: GENESIS.into(),
            size: 0,
            index: index.clone(),
        };
        let (seq, prev, _) = tail_of(path).unwrap();
        (log.seq, log.prev) = (seq, prev);
        log.size = std::fs::metadata(path).map_or(0, |m| m.len());
        for i in 0..n {
            let Value::Object(m) = json!({"kind": "test", "i": i}) else {
                unreachable!()
            };
            log.append(m).unwrap();
        }
        Reader {
            path: path.to_path_buf(),
            index,
        }
    }

    /// The seqs of a page.
    fn seqs(p: &Page) -> Vec<u64> {
        p.entries
            .iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect()
    }

    #[test]
    fn pages_seek_through_the_index_of_a_large_log() {
        // 100,000 entries written as the append thread writes them (sealed, chained),
        // without a sync per line, in one file; then indexed as at start.
        let d = dir("index");
        let path = d.join("audit.jsonl");
        let mut text = String::new();
        let mut prev = GENESIS.to_string();
        for seq in 1..=100_000u64 {
            let Value::Object(mut m) =
                json!({"kind": "test", "node": "t", "at_unix_ms": seq, "seq": seq, "prev": prev})
            else {
                unreachable!()
            };
            m.insert("detail".into(), json!({"seq": 7, "i": seq}));
            let (line, hash) = seal(&m);
            text.push_str(&line);
            prev = hash;
        }
        std::fs::write(&path, &text).unwrap();
        let index = Index::build(&path).unwrap();
        // The first entry, and every 256th: 1 + 390 places.
        assert_eq!(index.points.len(), 1 + 100_000 / INDEX_EVERY as usize);
        assert_eq!(
            index.points[0],
            Point {
                seq: 1,
                gen: KEEP as u64,
                offset: 0
            }
        );
        assert_eq!(index.size, text.len() as u64);
        let reader = Reader {
            path: path.clone(),
            index: Arc::new(RwLock::new(index)),
        };
        for after in [
            0, 1, 254, 255, 256, 257, 511, 512, 767, 1000, 4095, 4096, 50_000, 99_743, 99_744,
            99_999, 100_000, 250_000,
        ] {
            for limit in [1, 100, 256, 257, 1000] {
                let p = reader.page(after, limit).unwrap();
                let want: Vec<u64> = (after + 1..=100_000).take(limit).collect();
                assert_eq!(seqs(&p), want, "after={after} limit={limit}");
                assert_eq!(
                    p.more,
                    after + (limit as u64) < 100_000,
                    "after={after} limit={limit}"
                );
                assert_eq!(p.next_after, want.last().copied().unwrap_or(after));
                // Sought, not scanned: at most the 256 entries before the first one
                // wanted are read, plus the page and the one after it.
                assert!(
                    p.lines_read <= INDEX_EVERY as usize + limit + 1,
                    "after={after} limit={limit}: {} lines read",
                    p.lines_read
                );
                // The same page as a scan of the whole log.
                let scanned = page(&path, after, limit).unwrap();
                assert_eq!(seqs(&scanned), seqs(&p));
            }
        }
        // Following `next_after` from 0 walks every entry once, across the places.
        let (mut after, mut seen) = (0, 0u64);
        loop {
            let p = reader.page(after, 1000).unwrap();
            for s in seqs(&p) {
                seen += 1;
                assert_eq!(s, seen);
            }
            after = p.next_after;
            if !p.more {
                break;
            }
        }
        assert_eq!(seen, 100_000);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_index_kept_while_appending_and_rotating_is_the_index_read_at_start() {
        let d = dir("index-rotate");
        let path = d.join("audit.jsonl");
        // Small files: entries rotate through every file kept and out of the oldest.
        let reader = write(&path, 4_000, 300);
        let kept = reader.index.read().unwrap().points.clone();
        let gen = reader.index.read().unwrap().gen;
        assert!(gen > 2 * KEEP as u64, "rotated {gen} times");
        let built = Index::build(&path).unwrap();
        let shift = gen - built.gen;
        let rebased: Vec<Point> = built
            .points
            .iter()
            .map(|p| Point {
                gen: p.gen + shift,
                ..*p
            })
            .collect();
        assert_eq!(kept, rebased, "kept while appending vs read at start");
        let first = verify(&files(&path)).unwrap().first_seq;
        assert!(first < 256, "seq 256 is in a file kept: {first}");
        assert!(
            kept.iter().any(|p| p.seq == 256 && p.offset > 0),
            "{kept:?}"
        );
        for after in [0, first - 1, first, 255, 256, 257, 280, 299, 300] {
            let p = reader.page(after, 50).unwrap();
            let want: Vec<u64> = (after.max(first - 1) + 1..=300).take(50).collect();
            assert_eq!(seqs(&p), want, "after={after}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn rotation_carries_the_chain_across_files() {
        let d = dir("rotate");
        let path = d.join("audit.jsonl");
        write(&path, 600, 30);
        let all = files(&path);
        assert_eq!(all.len(), KEEP + 1, "{all:?}");
        let v = verify(&all).unwrap();
        assert_eq!(v.last_seq, 30);
        assert!(v.first_seq > 1, "the oldest files were dropped: {v:?}");
        // A restart continues the chain where it ended.
        write(&path, 600, 2);
        assert_eq!(verify(&files(&path)).unwrap().last_seq, 32);
        // Without its predecessors, a file's first line says what is missing.
        let e = verify(std::slice::from_ref(&path)).unwrap_err();
        assert!(e.line == 1 && e.what.contains("removed"), "{e}");
        // Two files out of order break the chain at the first line of the second.
        let mut wrong = files(&path);
        wrong.swap(1, 2);
        let e = verify(&wrong).unwrap_err();
        assert_eq!((e.file.clone(), e.line), (wrong[1].clone(), 1), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_revision_to_go_on_from_is_the_last_shared_entrys() {
        let d = dir("tail-rev");
        let path = d.join("audit.jsonl");
        let index = Arc::new(RwLock::new(Index::default()));
        let mut log = Log {
            path: path.clone(),
            node: "ns1".into(),
            max_bytes: MAX_BYTES,
            seq: 0,
            prev: GENESIS.into(),
            size: 0,
            index,
        };
        let obj = |v: Value| match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        };
        log.append(obj(json!({"kind": "drain", "rev": 41})))
            .unwrap();
        log.append(obj(json!({"kind": "step", "rev": 42}))).unwrap();
        // This node's own entry (an override seen without its writer's entry) last.
        log.append(obj(json!({"kind": "override_seen"}))).unwrap();
        let (seq, hash, rev) = tail_of(&path).unwrap();
        assert_eq!((seq, hash, rev), (3, log.prev.clone(), 42));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_page_starts_after_the_seq_asked() {
        let d = dir("page");
        let path = d.join("audit.jsonl");
        write(&path, 600, 12);
        let p = page(&path, 3, 5).unwrap();
        let seqs: Vec<u64> = p
            .entries
            .iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, vec![4, 5, 6, 7, 8]);
        assert!(p.more);
        assert_eq!(p.next_after, 8);
        let p = page(&path, 8, 100).unwrap();
        assert_eq!(p.entries.len(), 4);
        assert!(!p.more);
        let _ = std::fs::remove_dir_all(&d);
    }
}
