//! Control plane, the audit log: the hash chain. Each line carries the hash of the
//! line before it (`prev`) and its own (`hash`, the SHA-256 of the line's bytes before
//! `,"hash":`): a line is sealed so ([`seal`]), and a chain is checked line by line
//! ([`verify`]) and against a published head ([`check_head`]).

use std::path::PathBuf;

use serde_json::{Map, Value};

use super::{GENESIS, KEEP};
use crate::config::tokens::{hex, sha256};

const HASH_MARK: &str = ",\"hash\":\"";

/// The line of `fields` (with its newline) and its hash.
pub(super) fn seal(fields: &Map<String, Value>) -> (String, String) {
    let body = Value::Object(fields.clone()).to_string();
    let open = &body[..body.len() - 1];
    let hash = hex(&sha256(open.as_bytes()));
    (format!("{open}{HASH_MARK}{hash}\"}}\n"), hash)
}

/// What a line says of its place in the chain.
#[derive(Debug, PartialEq)]
pub(super) struct Link {
    pub(super) seq: u64,
    prev: String,
    pub(super) hash: String,
    /// The hash matches the line's bytes.
    intact: bool,
    /// The etcd revision of a shared entry (0: none).
    pub(super) rev: i64,
}

impl Link {
    pub(super) fn of(line: &str) -> Option<Link> {
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
pub fn check_head(files: &[PathBuf], head: &str) -> Result<(), HeadMissing> {
    let (seq, hash) = head
        .split_once(':')
        .and_then(|(s, h)| Some((s.parse::<u64>().ok()?, h)))
        .filter(|(_, h)| h.len() == 64)
        .ok_or_else(|| HeadMissing::NotSeqHash(head.to_string()))?;
    let mut last = 0;
    for file in files {
        let text = std::fs::read_to_string(file).map_err(|error| HeadMissing::Read {
            file: file.clone(),
            error,
        })?;
        for line in text.lines() {
            let Some(link) = Link::of(line) else { continue };
            last = link.seq;
            if link.seq == seq {
                return if link.hash == hash {
                    Ok(())
                } else {
                    Err(HeadMissing::Rewritten {
                        seq,
                        found: link.hash,
                        published: hash.to_string(),
                    })
                };
            }
        }
    }
    Err(HeadMissing::CutShort { seq, last })
}

/// Why the files do not hold the head published ([`check_head`]).
#[derive(Debug, thiserror::Error)]
pub enum HeadMissing {
    #[error("--expect-head {0}: not SEQ:HASH (a number, a colon, 64 hex digits)")]
    NotSeqHash(String),
    #[error("{}: {error}", file.display())]
    Read {
        file: PathBuf,
        error: std::io::Error,
    },
    #[error("rewritten: entry {seq} has the hash {found}, the head published says {published}")]
    Rewritten {
        seq: u64,
        found: String,
        published: String,
    },
    #[error("cut short: the head published is entry {seq}, the files end at entry {last}")]
    CutShort { seq: u64, last: u64 },
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
