//! Data plane: the fast path. Answers the query steerdns exists for (one question for a
//! steered name, class IN, at most an OPT record with at most one well-formed ECS option)
//! straight from the received bytes into a response buffer: no decode into hickory's
//! types, no allocation, no task.
//!
//! It serves UDP (`udp.rs`) and TCP (`tcp.rs`) alike. Everything else (zone data, every
//! error, every unusual form) returns `None` and goes the full way through
//! [`super::Handler`], which would answer these same queries with the same message:
//! `tests/fast_path.rs` sends every form to both and compares, and so does the `request`
//! fuzz target.
//!
//! ```text
//! query:    header | question (copied as received) | [OPT: payload, DO, ECS]
//! response: header (QR AA, RD and CD copied) | question | CNAME, owner = pointer to the
//!           question | [DO=1, signed zone: the CNAME's pre-signed RRSIGs, same owner]
//!           | [OPT: min(payload, 1232), DO copied, ECS echoed with its scope, COOKIE:
//!             the client's and our server cookie (`cookie.rs`)]
//! ```

use std::net::IpAddr;

use rand::Rng;

use super::cookie::{self, Cookie};
use super::edns::{ecs_option, Ecs, Ede, MAX_UDP_PAYLOAD};
use super::Steer;
use crate::plan::{Answer, Asker, Snapshot};

const HEADER: usize = 12;
const TYPE_OPT: u16 = 41;
const TYPE_CNAME: u16 = 5;
const TYPE_TSIG: u16 = 250;
const TYPE_RRSIG: u16 = 46;
const CLASS_IN: u16 = 1;

/// A query in the plain form, as found in the received bytes.
pub(crate) struct Query<'q> {
    pub packet: &'q [u8],
    /// End of the question section (header + name + type + class).
    pub question_end: usize,
    /// The OPT record's fields, when there is one.
    pub opt: Option<Opt<'q>>,
}

pub(crate) struct Opt<'q> {
    pub payload: u16,
    pub dnssec_ok: bool,
    /// The ECS option's data (family, source, scope, address), as received.
    pub ecs: Option<Ecs<'q>>,
    /// Whether there is a COOKIE option (of a valid length, RFC 7873 §5.2.2).
    pub cookie: bool,
}

/// Answers `packet` from `src` into `out` if it is a query for a steered name in its
/// plain form, at `now` (Unix seconds, for the selection window; `rng` draws only for
/// `selection: random`); returns the answer given, for counting. `None`: `out` holds nothing
/// useful and the query goes to the full handler. `cookie`: the answer's COOKIE option
/// data, as judged by the caller (`wire::cookie_of`, the same bytes the full path
/// judges); a query with a COOKIE option and no `cookie` goes to the full handler.
///
/// # Hot path
/// Bounds-checked byte reads, one hash lookup, the steering decision, one pick, and
/// copies into `out` (whose capacity is reused). No allocation once `out` has grown.
pub fn answer<'s, R: Rng + ?Sized>(
    snap: &'s Snapshot,
    packet: &[u8],
    src: IpAddr,
    out: &mut Vec<u8>,
    now: u64,
    rng: &mut R,
    cookie: Option<&[u8; cookie::REPLY_LEN]>,
) -> Option<Steer<'s>> {
    let mut lower = [0u8; 255];
    let (query, name_len) = parse(packet, &mut lower)?;
    let ecs = query.opt.as_ref().and_then(|o| o.ecs.as_ref());
    let asker = Asker::new(src, ecs.map(|e| (e.ip(), e.source)));
    // During a staged rollout, the plan of the asker's cohort.
    let route = snap.route(&asker);
    let steered = route.plan.get_wire(&lower[..name_len])?;
    let cookie = match &query.opt {
        Some(o) if o.cookie => Some(cookie?),
        _ => None,
    };

    let Answer { pick, scope, .. } = steered.answer(&snap.geo, &asker, now, rng);
    let scope = route.scope(scope);

    let h = query.packet;
    // DO=1 in a signed zone: the CNAME's pre-signed RRSIGs follow it.
    let rrsigs = match &query.opt {
        Some(o) if o.dnssec_ok => steered.rrsigs(pick.target),
        _ => &[],
    };
    let answers = 1 + rrsig_count(rrsigs);
    out.clear();
    // Header: id; QR, opcode 0, AA, RD copied; RA 0, AD 0, CD copied, NOERROR.
    out.extend_from_slice(&h[0..2]);
    out.push(0x80 | 0x04 | (h[2] & 0x01));
    out.push(h[3] & 0x10);
    out.extend_from_slice(&[0, 1, 0, answers, 0, 0, 0, u8::from(query.opt.is_some())]);
    out.extend_from_slice(&h[HEADER..query.question_end]);
    // The answer: owner = a pointer to the question's name (offset 12), so its case
    // is the client's (RFC 4343).
    out.extend_from_slice(&[0xc0, HEADER as u8]);
    out.extend_from_slice(&TYPE_CNAME.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out.extend_from_slice(&steered.ttl().to_be_bytes());
    out.extend_from_slice(&(pick.cname_wire.len() as u16).to_be_bytes());
    out.extend_from_slice(pick.cname_wire);
    // Each RRSIG: same owner and TTL (at most its original TTL), RDATA as signed.
    let mut rest = rrsigs;
    while let Some((len, rdata)) = next_rrsig(rest) {
        out.extend_from_slice(&[0xc0, HEADER as u8]);
        out.extend_from_slice(&TYPE_RRSIG.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&steered.ttl().to_be_bytes());
        out.extend_from_slice(&rest[..2]);
        out.extend_from_slice(rdata);
        rest = &rest[2 + len..];
    }
    let limit = match &query.opt {
        None => 512,
        Some(opt) => {
            let payload = opt.payload.clamp(512, MAX_UDP_PAYLOAD);
            out.push(0); // root owner
            out.extend_from_slice(&TYPE_OPT.to_be_bytes());
            out.extend_from_slice(&payload.to_be_bytes());
            // Extended rcode 0, version 0, flags: DO copied, nothing else.
            out.extend_from_slice(&[0, 0, if opt.dnssec_ok { 0x80 } else { 0 }, 0]);
            let ecs_len = opt.ecs.as_ref().map_or(0, Ecs::echo_len);
            out.extend_from_slice(&(ecs_len + cookie_len(cookie)).to_be_bytes());
            if let Some(e) = &opt.ecs {
                e.echo(scope, out);
            }
            if let Some(c) = cookie {
                push_cookie(c, out);
            }
            usize::from(payload)
        }
    };
    // Long names near the limit: the full path truncates as hickory does.
    let steer = Steer {
        pick,
        steered,
        ecs: ecs.map(|e| e.source),
        scope,
    };
    let fits = out.len() <= limit;
    if fits {
        route.count(false);
    }
    fits.then_some(steer)
}

/// The first of a run of pre-signed RRSIGs (`Plan::set_rrsigs`): its RDATA length and
/// RDATA; `None` at the end (or on a cut run, which the planner never builds).
pub(crate) fn next_rrsig(run: &[u8]) -> Option<(usize, &[u8])> {
    let len = usize::from(u16_at(run, 0)?);
    Some((len, run.get(2..2 + len)?))
}

/// How many RRSIGs a run holds.
fn rrsig_count(mut run: &[u8]) -> u8 {
    let mut n = 0;
    while let Some((len, _)) = next_rrsig(run) {
        n += 1;
        run = &run[2 + len..];
    }
    n
}

/// A truncated answer to `packet` for the rate limiter's slip: header (QR, TC; RD and
/// CD copied), the question if it is one plain name, no records but, when the query has
/// an OPT record, an OPT of our own (RFC 6891 §7): the payload size normal answers
/// advertise (the client's, at least 512, at most [`MAX_UDP_PAYLOAD`]), DO copied,
/// version 0, and one option: the Extended DNS Error [`Ede::RATE_LIMITED`] (RFC 8914),
/// so that a resolver's operator sees why. No ECS echo: nothing in the slip depends on the client, no
/// resolver caches an empty TC answer (it retries over TCP, where the ECS is validated
/// and echoed), and nothing of the query's options is checked before a slip. `false`:
/// not a query worth answering (too short, QR=1).
///
/// # Hot path
/// Runs for limited queries during a flood: a bounded walk of the packet, no allocation
/// once `out` has grown.
pub fn truncated(packet: &[u8], out: &mut Vec<u8>) -> bool {
    let Some(h) = packet.get(..HEADER) else {
        return false;
    };
    if h[2] & 0x80 != 0 {
        return false;
    }
    let question = (h[4..6] == [0, 1]).then(|| question_end(packet)).flatten();
    let opt = find_opt(packet);
    out.clear();
    out.extend_from_slice(&h[0..2]);
    out.push(0x80 | (h[2] & 0x79) | 0x02);
    out.push(h[3] & 0x10);
    out.extend_from_slice(&[0, u8::from(question.is_some()), 0, 0, 0, 0, 0]);
    out.push(u8::from(opt.is_some()));
    if let Some(end) = question {
        out.extend_from_slice(&packet[HEADER..end]);
    }
    if let Some(opt) = opt {
        let payload = opt.class.clamp(512, MAX_UDP_PAYLOAD);
        out.push(0); // root owner
        out.extend_from_slice(&TYPE_OPT.to_be_bytes());
        out.extend_from_slice(&payload.to_be_bytes());
        // Extended rcode 0, version 0, flags: DO copied; the EDE.
        out.extend_from_slice(&[0, 0, opt.ttl[2] & 0x80, 0]);
        out.extend_from_slice(&Ede::RATE_LIMITED.wire_len().to_be_bytes());
        Ede::RATE_LIMITED.write(out);
    }
    true
}

/// Bytes of the COOKIE option (code, length, data) an answer carries.
pub(crate) fn cookie_len(cookie: Option<&[u8; cookie::REPLY_LEN]>) -> u16 {
    cookie.map_or(0, |c| 4 + c.len() as u16)
}

/// Appends the COOKIE option (code, length, data) of an answer.
pub(crate) fn push_cookie(cookie: &[u8; cookie::REPLY_LEN], out: &mut Vec<u8>) {
    out.extend_from_slice(&cookie::OPTION_COOKIE.to_be_bytes());
    out.extend_from_slice(&(cookie.len() as u16).to_be_bytes());
    out.extend_from_slice(cookie);
}

/// The rate limiter's answer, in place of its truncated slip, to a query that carried
/// a client cookie without a valid server cookie (RFC 7873 §5.2.3, §5.3; BIND does the
/// same): `BADCOOKIE` (extended rcode 23) with the client cookie and a fresh server
/// cookie, so that the client retries with it and gets the budget of a client with a
/// valid cookie. Header as [`truncated`]'s without TC, the question if it is one plain
/// name, no records, an OPT (payload and DO as in [`truncated`]) with `cookie`.
/// `false`: not a query worth answering (too short, QR=1, no OPT).
///
/// # Hot path
/// Runs for limited queries during a flood: a bounded walk of the packet, no allocation
/// once `out` has grown.
pub fn badcookie(packet: &[u8], cookie: &[u8; cookie::REPLY_LEN], out: &mut Vec<u8>) -> bool {
    let Some(h) = packet.get(..HEADER) else {
        return false;
    };
    if h[2] & 0x80 != 0 {
        return false;
    }
    let Some(opt) = find_opt(packet) else {
        return false;
    };
    let question = (h[4..6] == [0, 1]).then(|| question_end(packet)).flatten();
    out.clear();
    out.extend_from_slice(&h[0..2]);
    out.push(0x80 | (h[2] & 0x79));
    // RCODE: BADCOOKIE's low four bits; the OPT holds the rest.
    out.push((h[3] & 0x10) | (cookie::BADCOOKIE & 0x0f) as u8);
    out.extend_from_slice(&[0, u8::from(question.is_some()), 0, 0, 0, 0, 0, 1]);
    if let Some(end) = question {
        out.extend_from_slice(&packet[HEADER..end]);
    }
    let payload = opt.class.clamp(512, MAX_UDP_PAYLOAD);
    out.push(0); // root owner
    out.extend_from_slice(&TYPE_OPT.to_be_bytes());
    out.extend_from_slice(&payload.to_be_bytes());
    // Extended rcode (BADCOOKIE >> 4), version 0, flags: DO copied.
    out.extend_from_slice(&[(cookie::BADCOOKIE >> 4) as u8, 0, opt.ttl[2] & 0x80, 0]);
    out.extend_from_slice(&cookie_len(Some(cookie)).to_be_bytes());
    push_cookie(cookie, out);
    true
}

/// The cookie of a whole message as received (its first OPT record, in the additional
/// section), judged for a client at `ip` at `now` (Unix seconds).
///
/// # Hot path
/// A walk of the records' lengths, then `cookie::option` and `cookie::judge`; no
/// allocation.
pub fn cookie_of(packet: &[u8], secrets: &cookie::Secrets, ip: IpAddr, now: u64) -> Cookie {
    let Some(opt) = find_opt(packet) else {
        return Cookie::Absent;
    };
    match cookie::option(opt.rdata) {
        Ok(None) => Cookie::Absent,
        Ok(Some(data)) => Cookie::Present(cookie::judge(data, secrets, ip, now as u32)),
        Err(()) => Cookie::Malformed,
    }
}

/// One resource record of a message, as found by [`records`].
pub(crate) struct RawRecord<'p> {
    /// Whether it is in the additional section.
    pub additional: bool,
    pub rtype: u16,
    /// The CLASS field; for an OPT, the requester's UDP payload size.
    pub class: u16,
    /// The TTL field; for an OPT, extended rcode, version, DO and the other flags.
    pub ttl: [u8; 4],
    /// The RDATA as received (for an OPT, its options).
    pub rdata: &'p [u8],
}

/// The records of `packet` after its question section, in order, walked by their
/// lengths (names plain or compressed; pointers are not followed). The walk stops where
/// the message ends early; each step moves forward, so it ends within the packet.
pub(crate) fn records(packet: &[u8]) -> impl Iterator<Item = RawRecord<'_>> + '_ {
    let count = |i: usize| {
        packet
            .get(i..i + 2)
            .map_or(0, |c| usize::from(u16::from_be_bytes([c[0], c[1]])))
    };
    let before = count(6) + count(8);
    let total = before + count(10);
    let mut at = (0..count(4)).try_fold(HEADER, |i, _| Some(skip_name(packet, i)? + 4));
    let mut n = 0;
    std::iter::from_fn(move || {
        if n >= total {
            return None;
        }
        let i = skip_name(packet, at?)?;
        let rdlen = usize::from(u16_at(packet, i + 8)?);
        let ttl = packet.get(i + 4..i + 8)?;
        let record = RawRecord {
            additional: n >= before,
            rtype: u16_at(packet, i)?,
            class: u16_at(packet, i + 2)?,
            ttl: [ttl[0], ttl[1], ttl[2], ttl[3]],
            rdata: packet.get(i + 10..i + 10 + rdlen)?,
        };
        n += 1;
        at = Some(i + 10 + rdlen);
        Some(record)
    })
}

/// The first OPT record of the additional section of `packet`, if any.
pub(crate) fn find_opt(packet: &[u8]) -> Option<RawRecord<'_>> {
    records(packet).find(|r| r.additional && r.rtype == TYPE_OPT)
}

/// Whether the last record of `packet` is a TSIG in the additional section, where
/// RFC 8945 §5.1 wants it.
pub(crate) fn ends_with_tsig(packet: &[u8]) -> bool {
    records(packet)
        .last()
        .is_some_and(|r| r.additional && r.rtype == TYPE_TSIG)
}

/// The offset just past the name at `i`: labels up to the root, or up to a compression
/// pointer (not followed).
fn skip_name(packet: &[u8], mut i: usize) -> Option<usize> {
    loop {
        let len = *packet.get(i)?;
        match len & 0xc0 {
            0 if len == 0 => return Some(i + 1),
            0 => i += 1 + usize::from(len),
            0xc0 => return packet.get(i + 1).map(|_| i + 2),
            _ => return None,
        }
    }
}

/// The end of a question of one uncompressed name at offset 12.
fn question_end(packet: &[u8]) -> Option<usize> {
    let mut i = HEADER;
    loop {
        let len = usize::from(*packet.get(i)?);
        if len == 0 {
            break;
        }
        if len > 63 || i + len + 1 - HEADER >= 255 {
            return None;
        }
        i += 1 + len;
    }
    (packet.len() >= i + 5).then_some(i + 5)
}

/// Reads the plain form of a query; writes the lowercased question name to `lower` and
/// returns its length. Anything else: `None`.
pub(crate) fn parse<'q>(packet: &'q [u8], lower: &mut [u8; 255]) -> Option<(Query<'q>, usize)> {
    let h = packet.get(..HEADER)?;
    // QR 0, opcode QUERY, TC 0 (AA and RD are allowed); rcode 0.
    if h[2] & 0xfa != 0 || h[3] & 0x0f != 0 {
        return None;
    }
    // QDCOUNT 1, ANCOUNT 0, NSCOUNT 0, ARCOUNT 0 or 1.
    if h[4..11] != [0, 1, 0, 0, 0, 0, 0] || h[11] > 1 {
        return None;
    }
    // The name: uncompressed labels of 1 to 63 bytes, at most 255 bytes in all.
    let question_end = question_end(packet)?;
    let i = question_end - 5;
    let name_len = i + 1 - HEADER;
    lower[..name_len].copy_from_slice(packet.get(HEADER..=i)?);
    // Length bytes are below 64, so lowercasing ASCII leaves them alone.
    lower[..name_len].make_ascii_lowercase();
    let qtype = u16_at(packet, i + 1)?;
    let qclass = u16_at(packet, i + 3)?;
    // Zone transfers, OPT and the other meta types: the full path.
    if qclass != CLASS_IN || qtype == TYPE_OPT || qtype >= 128 {
        return None;
    }
    let opt = if h[11] == 1 {
        Some(parse_opt(packet, question_end)?)
    } else if packet.len() == question_end {
        None
    } else {
        return None;
    };
    let query = Query {
        packet,
        question_end,
        opt,
    };
    Some((query, name_len))
}

/// The OPT record at `at`, which must end the packet: root owner, EDNS version 0,
/// well-formed options, at most one ECS option and that one valid (RFC 7871 §6).
fn parse_opt(packet: &[u8], at: usize) -> Option<Opt<'_>> {
    let rr = packet.get(at..at + 11)?;
    if rr[0] != 0 || u16::from_be_bytes([rr[1], rr[2]]) != TYPE_OPT {
        return None;
    }
    // Extended rcode and version 0 (BADVERS is the full path's).
    if rr[5] != 0 || rr[6] != 0 {
        return None;
    }
    let rdlen = usize::from(u16::from_be_bytes([rr[9], rr[10]]));
    if packet.len() != at + 11 + rdlen {
        return None;
    }
    Some(Opt {
        payload: u16::from_be_bytes([rr[3], rr[4]]),
        dnssec_ok: rr[7] & 0x80 != 0,
        // The options by RFC 7871 §6's one rule and RFC 7873 §5.2.2's (what fails
        // them is the full path's FORMERR).
        ecs: ecs_option(packet.get(at + 11..)?).ok()?,
        cookie: cookie::option(packet.get(at + 11..)?).ok()?.is_some(),
    })
}

fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `www.example.com A IN`, then `additional` (ARCOUNT `arcount`).
    fn www(arcount: u8, additional: &[u8]) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x10, 0, 1, 0, 0, 0, 0, 0, arcount];
        q.extend_from_slice(b"\x03www\x07example\x03com\x00\x00\x01\x00\x01");
        q.extend_from_slice(additional);
        q
    }

    #[test]
    fn slips_carry_an_opt_when_the_query_has_one() {
        // OPT: payload 4096, DO, an ECS option.
        let opt = b"\x00\x00\x29\x10\x00\x00\x00\x80\x00\x00\x0b\x00\x08\x00\x07\x00\x01\x18\x00\x51\x02\x45";
        let q = www(1, opt);
        let mut out = Vec::new();
        assert!(truncated(&q, &mut out));
        // QR TC RD, CD; QDCOUNT 1, ARCOUNT 1; the question; OPT 1232, DO, the EDE.
        assert_eq!(out[..12], [0x12, 0x34, 0x83, 0x10, 0, 1, 0, 0, 0, 0, 0, 1]);
        let at = q.len() - opt.len();
        assert_eq!(out[12..at], q[12..at]);
        let ede = Ede::RATE_LIMITED;
        let [l0, l1] = ede.wire_len().to_be_bytes();
        assert_eq!(
            out[at..at + 11],
            [0, 0, 41, 0x04, 0xd0, 0, 0, 0x80, 0, l0, l1]
        );
        // Option 15, INFO-CODE 0 (Other Error), the text.
        assert_eq!(out[at + 11..at + 17], [0, 15, 0, l1 - 4, 0, 0]);
        assert_eq!(&out[at + 17..], ede.text.as_bytes());
        // Payload 100 counts as 512; without an OPT, none.
        let small = www(1, b"\x00\x00\x29\x00\x64\x00\x00\x00\x00\x00\x00");
        assert!(truncated(&small, &mut out));
        let at = small.len() - 11;
        assert_eq!(out[at..at + 9], [0, 0, 41, 2, 0, 0, 0, 0, 0]);
        assert!(truncated(&www(0, &[]), &mut out));
        assert_eq!(out[10..12], [0, 0]);
        // Cut anywhere: no panic.
        for cut in 0..q.len() {
            truncated(&q[..cut], &mut out);
        }
    }

    /// `www.example.com A`, an A record in the answer section (owner: a pointer to the
    /// question), then in the additional section an OPT with one empty option and a TSIG
    /// whose owner is a pointer too.
    fn with_records() -> Vec<u8> {
        let mut rest = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04\xc0\x00\x02\x01".to_vec();
        rest.extend_from_slice(b"\x00\x00\x29\x04\xd0\x00\x00\x00\x00\x00\x04\xfd\xe9\x00\x00");
        rest.extend_from_slice(b"\xc0\x10\x00\xfa\x00\xff\x00\x00\x00\x00\x00\x02\xab\xcd");
        let mut q = www(2, &rest);
        q[7] = 1; // ANCOUNT
        q
    }

    #[test]
    fn records_are_walked_past_compressed_names() {
        let q = with_records();
        let types: Vec<(bool, u16)> = records(&q).map(|r| (r.additional, r.rtype)).collect();
        assert_eq!(types, [(false, 1), (true, 41), (true, 250)]);
        assert_eq!(find_opt(&q).map(|o| o.rdata), Some(&[0xfd, 0xe9, 0, 0][..]));
        // An OPT in the answer section is not the OPT.
        let mut in_answer = www(0, b"\x00\x00\x29\x04\xd0\x00\x00\x00\x00\x00\x00");
        in_answer[7] = 1;
        assert!(find_opt(&in_answer).is_none());
        // A cut message ends the walk (and nothing panics); so do counts far past the
        // bytes present.
        for cut in 0..q.len() {
            assert!(records(&q[..cut]).count() < 3, "cut at {cut}");
        }
        let mut lying = www(0, &[]);
        lying[6..12].copy_from_slice(&[0xff; 6]);
        assert_eq!(records(&lying).count(), 0);
    }

    #[test]
    fn a_tsig_must_be_the_last_record() {
        let q = with_records();
        assert!(ends_with_tsig(&q));
        for cut in 0..q.len() {
            assert!(!ends_with_tsig(&q[..cut]), "cut at {cut}");
        }
        // An OPT after it.
        let mut opt_last = q.clone();
        opt_last[11] = 3;
        opt_last.extend_from_slice(b"\x00\x00\x29\x04\xd0\x00\x00\x00\x00\x00\x00");
        assert!(!ends_with_tsig(&opt_last));
        assert!(!ends_with_tsig(&www(0, &[])));
    }

    #[test]
    fn only_the_plain_form_is_taken() {
        let mut lower = [0u8; 255];
        // www.example.com A IN, no OPT.
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        q.extend_from_slice(b"\x03WWW\x07example\x03com\x00\x00\x01\x00\x01");
        let (query, n) = parse(&q, &mut lower).unwrap();
        assert_eq!(&lower[..n], b"\x03www\x07example\x03com\x00");
        assert!(query.opt.is_none());
        // Trailing garbage, a compression pointer, QR=1, class CH, AXFR: not taken.
        let mut trailing = q.clone();
        trailing.push(0);
        assert!(parse(&trailing, &mut lower).is_none());
        let mut pointer = q[..12].to_vec();
        pointer.extend_from_slice(b"\xc0\x0c\x00\x01\x00\x01");
        assert!(parse(&pointer, &mut lower).is_none());
        let mut response = q.clone();
        response[2] |= 0x80;
        assert!(parse(&response, &mut lower).is_none());
        let mut chaos = q.clone();
        let n = chaos.len();
        chaos[n - 1] = 3;
        assert!(parse(&chaos, &mut lower).is_none());
        let mut axfr = q.clone();
        axfr[n - 3] = 252;
        assert!(parse(&axfr, &mut lower).is_none());
        // Truncated anywhere: not taken (and no panic).
        for cut in 0..q.len() {
            assert!(parse(&q[..cut], &mut lower).is_none(), "cut at {cut}");
        }
    }
}
