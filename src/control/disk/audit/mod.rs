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
//! read elsewhere (`Reader`, on a blocking thread of the runtime), never on the
//! thread that appends: the append thread keeps an `Index` as it writes (the place
//! of the first line of each file and of every [`INDEX_EVERY`]th entry), so a page
//! after any seq seeks to at most 256 entries before it instead of reading the whole
//! log (80 MB at most). The log is bounded: past
//! [`MAX_BYTES`] the file becomes `audit.jsonl.1` (older ones `.2` … `.`[`KEEP`], the
//! oldest dropped) and the new file's first line carries the hash of the last line of
//! the old one, so the chain runs on across files.
//!
//! | room | holds |
//! |---|---|
//! | `log` | appending: the thread that writes the lines ([`Audit::start`], `record`, `append_shared`), rotation, a torn last line cut at start, the head ([`Watch`]) |
//! | `index` | reading pages: the `Index` of places kept while appending, `Reader` and [`Page`] (`GET /v1/audit`) |
//! | `chain` | the hash chain: a line sealed with its hash, [`verify`] and [`check_head`] (`steerdns audit verify`), [`human`] |
//! | `tests` | unit tests: the index against a scan, rotation, the revision to go on from |

use std::path::{Path, PathBuf};

mod chain;
mod index;
mod log;
#[cfg(test)]
mod tests;

pub use chain::{check_head, human, verify, Broken, HeadMissing, Verified};
pub use index::{Page, PageError};
pub use log::{Audit, Watch};

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

/// `path` for `k` = 0, else `path.k`.
fn numbered(path: &Path, k: usize) -> PathBuf {
    match k {
        0 => path.to_path_buf(),
        k => PathBuf::from(format!("{}.{k}", path.display())),
    }
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
