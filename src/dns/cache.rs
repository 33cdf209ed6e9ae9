//! Data plane: the UDP answer cache of the full path. Zone data, NXDOMAIN and the other
//! answers for names that are not steered depend only on the question and the snapshot,
//! never on the client: each UDP thread keeps the full path's answers to the plain form
//! of such queries and replays them, as PowerDNS's packet cache does.
//!
//! - Key: the header's flag bytes, the question as received (so the client's case comes
//!   back), whether there is an OPT, the payload size as the answer uses it, and DO.
//! - Value: the full path's answer to the query rebuilt without its EDNS options (but
//!   the Extended DNS Error it gives, which depends on the question alone); the client's
//!   ECS option, whose echo in these answers always has scope 0, and the answer's COOKIE
//!   option (the client's cookie and ours, judged per query by the caller) are appended
//!   on the way out after them (what the full path does for the original query).
//! - Dropped whole when the snapshot changes (any reload, health change or drain), and
//!   when it reaches its byte budget: the process's budget (`--answer-cache-bytes`,
//!   [`DEFAULT_BUDGET`]) split evenly between the UDP threads, so that neither a flood
//!   of unique names nor many `--udp-sockets` can grow the caches past it, and no
//!   thread waits for another.
//!
//! Steered names never enter it (their answers are drawn per query). `tests/fast_path.rs`
//! compares cached answers with the full path's (called in-process).

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use super::cookie;
use super::edns::MAX_UDP_PAYLOAD;
use super::wire::{self, Query};
use crate::plan::Snapshot;

/// Bytes of cached answers for the whole process by default (`--answer-cache-bytes`).
pub const DEFAULT_BUDGET: usize = 16 << 20;

/// What an entry costs beyond its key and answer: the table's slot, two boxes' heap
/// headers.
const ENTRY_OVERHEAD: usize = 64;

pub struct AnswerCache {
    /// The snapshot the entries were answered from, held weakly: its allocation (not
    /// its plan and zones) stays, so that its address cannot be reused by a newer one
    /// while the entries live. A strong hold kept every idle thread's last snapshot
    /// alive, one plan each, long after a reload had replaced it.
    snapshot: Option<Weak<Snapshot>>,
    entries: HashMap<Box<[u8]>, Entry>,
    key: Vec<u8>,
    /// Bytes the entries may take ([`AnswerCache::cost`]); the cache starts over past it.
    budget: usize,
    /// Bytes the entries take.
    bytes: usize,
}

impl Default for AnswerCache {
    /// A cache with the whole default budget (one UDP thread).
    fn default() -> Self {
        AnswerCache::new(DEFAULT_BUDGET)
    }
}

/// A cached answer, and where its OPT's RDLENGTH is (0: no OPT).
struct Entry {
    rdlen_at: usize,
    answer: Box<[u8]>,
}

/// What to do with a query the fast path did not take.
pub enum Lookup<'q> {
    /// Not cacheable: the full path answers the query itself.
    Bypass,
    /// Answered from the cache into `out`; the rcode, for counting.
    Hit(u8),
    /// Cacheable, not cached: answer `stripped` (the query without EDNS options) with
    /// the full path, then give the answer to [`AnswerCache::store`].
    Miss(Miss<'q>),
}

pub struct Miss<'q> {
    query: Query<'q>,
    cookie: Option<[u8; cookie::REPLY_LEN]>,
}

impl AnswerCache {
    /// An empty cache whose entries take at most `budget` bytes (0: caches nothing).
    pub fn new(budget: usize) -> AnswerCache {
        AnswerCache {
            snapshot: None,
            entries: HashMap::new(),
            key: Vec::new(),
            budget,
            bytes: 0,
        }
    }

    /// Bytes the entries take, as counted against the budget.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Drops every entry and gives their memory back.
    fn start_over(&mut self) {
        self.entries = HashMap::new();
        self.bytes = 0;
    }

    /// Looks `packet` up; on a hit the answer is in `out`, on a miss the query to ask the
    /// full path is in `stripped`. `cookie`: the answer's COOKIE option data, judged by
    /// the caller (`wire::cookie_of`); a query with a COOKIE option and no `cookie` is
    /// bypassed.
    ///
    /// # Hot path
    /// A key built in a reused buffer, one hash lookup, a copy; no allocation on a hit.
    pub fn lookup<'q>(
        &mut self,
        snap: &Arc<Snapshot>,
        packet: &'q [u8],
        out: &mut Vec<u8>,
        stripped: &mut Vec<u8>,
        cookie: Option<&[u8; cookie::REPLY_LEN]>,
    ) -> Lookup<'q> {
        if !self
            .snapshot
            .as_ref()
            .is_some_and(|s| std::ptr::eq(s.as_ptr(), Arc::as_ptr(snap)))
        {
            self.start_over();
            self.snapshot = Some(Arc::downgrade(snap));
        }
        let mut lower = [0u8; 255];
        let Some((query, name_len)) = wire::parse(packet, &mut lower) else {
            return Lookup::Bypass;
        };
        if snap.steers_wire(&lower[..name_len]) {
            return Lookup::Bypass;
        }
        let cookie = match &query.opt {
            Some(o) if o.cookie => match cookie {
                Some(c) => Some(c),
                None => return Lookup::Bypass,
            },
            _ => None,
        };
        self.key.clear();
        self.key.extend_from_slice(&packet[2..4]);
        self.key.extend_from_slice(&packet[12..query.question_end]);
        if let Some(opt) = &query.opt {
            let payload = opt.payload.clamp(512, MAX_UDP_PAYLOAD);
            self.key.push(1 + u8::from(opt.dnssec_ok));
            self.key.extend_from_slice(&payload.to_be_bytes());
        }
        if let Some(cached) = self.entries.get(self.key.as_slice()) {
            return match finish(&query, &cached.answer, cached.rdlen_at, out, cookie) {
                true => Lookup::Hit(cached.answer[3] & 0x0f),
                false => Lookup::Bypass,
            };
        }
        strip(&query, stripped);
        Lookup::Miss(Miss {
            query,
            cookie: cookie.copied(),
        })
    }

    /// Keeps the full path's `answer` to a miss's stripped query and writes the answer
    /// to the original query into `out`; `false` if that answer cannot be built from it
    /// (the full path then answers the original query itself).
    pub fn store(&mut self, miss: Miss<'_>, answer: &[u8], out: &mut Vec<u8>) -> bool {
        let Some(rdlen_at) = replayable(&miss.query, answer) else {
            return false;
        };
        let cost = self.key.len() + answer.len() + ENTRY_OVERHEAD;
        if self.bytes + cost > self.budget {
            self.start_over();
        }
        if cost <= self.budget {
            let old = self.entries.insert(
                Box::from(self.key.as_slice()),
                Entry {
                    rdlen_at,
                    answer: Box::from(answer),
                },
            );
            self.bytes += cost;
            if let Some(old) = old {
                self.bytes -= self.key.len() + old.answer.len() + ENTRY_OVERHEAD;
            }
        }
        finish(&miss.query, answer, rdlen_at, out, miss.cookie.as_ref())
    }
}

/// The query with its OPT reduced to payload size and DO (the full path ignores every
/// other option and flag, and ECS does not change an answer that is not steered).
fn strip(query: &Query<'_>, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&query.packet[..query.question_end]);
    if let Some(opt) = &query.opt {
        out.extend_from_slice(&[0, 0, 41]);
        out.extend_from_slice(&opt.payload.to_be_bytes());
        out.extend_from_slice(&[0, 0, if opt.dnssec_ok { 0x80 } else { 0 }, 0, 0, 0]);
    }
}

/// Whether `answer` (to the stripped query) has the shape `finish` relies on: the same
/// question echoed, and with an OPT in the query, an OPT as its last record, holding no
/// option but an Extended DNS Error. `Some`: where that OPT's RDLENGTH is (0 without an
/// OPT).
fn replayable(query: &Query<'_>, answer: &[u8]) -> Option<usize> {
    let q = &query.packet[12..query.question_end];
    if answer.len() < query.question_end || answer.get(4..6) != Some(&[0, 1]) {
        return None;
    }
    if &answer[12..query.question_end] != q {
        return None;
    }
    if query.opt.is_none() {
        return Some(0);
    }
    let opt = wire::records(answer).last()?;
    let rdlen_at = answer.len().checked_sub(opt.rdata.len() + 2)?;
    // The OPT's RDATA ends the answer.
    let last = std::ptr::eq(opt.rdata.as_ptr(), answer[rdlen_at + 2..].as_ptr());
    let one_ede = |d: &[u8]| match d {
        [0, 15, l0, l1, rest @ ..] => usize::from(u16::from_be_bytes([*l0, *l1])) == rest.len(),
        _ => false,
    };
    let options = opt.rdata.is_empty() || one_ede(opt.rdata);
    (last && opt.additional && opt.rtype == 41 && options).then_some(rdlen_at)
}

/// The answer to `query` from a cached one (whose OPT's RDLENGTH is at `rdlen_at`): the
/// query's id, and its ECS option echoed with scope 0 and `cookie` at the end of the OPT.
/// `false` if that does not fit the client's UDP size.
fn finish(
    query: &Query<'_>,
    cached: &[u8],
    rdlen_at: usize,
    out: &mut Vec<u8>,
    cookie: Option<&[u8; cookie::REPLY_LEN]>,
) -> bool {
    out.clear();
    out.extend_from_slice(cached);
    out[0..2].copy_from_slice(&query.packet[0..2]);
    let Some(opt) = &query.opt else {
        return out.len() <= 512;
    };
    let ecs_len = opt.ecs.as_ref().map_or(0, |e| e.echo_len());
    let rdlen = u16::from_be_bytes([out[rdlen_at], out[rdlen_at + 1]]);
    let rdlen = rdlen + ecs_len + wire::cookie_len(cookie);
    out[rdlen_at..rdlen_at + 2].copy_from_slice(&rdlen.to_be_bytes());
    if let Some(ecs) = &opt.ecs {
        ecs.echo(0, out);
    }
    if let Some(c) = cookie {
        wire::push_cookie(c, out);
    }
    out.len() <= usize::from(opt.payload.clamp(512, MAX_UDP_PAYLOAD))
}
