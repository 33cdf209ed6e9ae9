//! Control plane, the audit log: reading pages of `GET /v1/audit`. The append thread
//! keeps an [`Index`] as it writes (the place of the first line of each file and of
//! every [`INDEX_EVERY`]th entry), so a page after any seq seeks to at most 256 entries
//! before it instead of reading the whole log; [`Reader`] reads them off the append
//! thread.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde::Serialize;
use serde_json::Value;

use super::{files, numbered, INDEX_EVERY, KEEP, MAX_PAGE};

/// Where the entries are in the files, kept by the append thread as it writes and read
/// by the pages ([`Reader`]) under a lock held only to look and to open the files.
#[derive(Debug, Default)]
pub(super) struct Index {
    /// The current file `audit.jsonl` is generation `gen`, the rotated `audit.jsonl.k`
    /// generation `gen - k` (it starts at [`KEEP`], so that none is below 0).
    pub(super) gen: u64,
    /// Bytes of whole lines in the current file: a page reads no further (a line
    /// being appended is not whole yet).
    pub(super) size: u64,
    /// The place of the first entry of each file and of every entry whose seq is a
    /// multiple of [`INDEX_EVERY`], in order.
    pub(super) points: Vec<Point>,
    /// The points cannot be trusted (not built yet, or a rotation failed half way):
    /// pages read every file until the append thread has rebuilt them.
    pub(super) stale: bool,
}

/// Where one entry's line starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Point {
    pub(super) seq: u64,
    pub(super) gen: u64,
    pub(super) offset: u64,
}

/// Just the seq of a line (the rest skipped, not built).
#[derive(serde::Deserialize)]
struct SeqOf {
    seq: u64,
}

impl Index {
    /// The index of the files of the log at `path`, read once (at start, and after a
    /// rotation that failed half way).
    pub(super) fn build(path: &Path) -> std::io::Result<Index> {
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
    pub(super) fn note(&mut self, seq: u64, gen: u64, offset: u64, first_of_file: bool) {
        if first_of_file || seq.is_multiple_of(INDEX_EVERY) {
            self.points.push(Point { seq, gen, offset });
        }
    }

    /// The files were rotated: the current one is a new generation, and the places in
    /// the file dropped are forgotten.
    pub(super) fn rotated(&mut self) {
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

/// Reads pages of the log through its [`Index`]; cheap to clone.
#[derive(Clone)]
pub(super) struct Reader {
    pub(super) path: PathBuf,
    pub(super) index: Arc<RwLock<Index>>,
}

impl Reader {
    /// Entries with `seq` above `after`, at most `limit` (1 to [`MAX_PAGE`]).
    pub(super) fn page(&self, after: u64, limit: usize) -> std::io::Result<Page> {
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

/// Why a page of `GET /v1/audit` cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error("no audit log: this server keeps no state directory")]
    NoLog,
    #[error(transparent)]
    Read(#[from] std::io::Error),
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

/// Entries with `seq` above `after`, at most `limit`, read from the first line of the
/// oldest file on (while the index cannot be trusted).
pub(super) fn page(path: &Path, after: u64, limit: usize) -> std::io::Result<Page> {
    let mut collected = Collect::new(after, limit);
    for file in files(path) {
        if collected.lines(BufReader::new(File::open(file)?))? {
            break;
        }
    }
    Ok(collected.page())
}
