//! dnstap's protobuf (`dnstap.proto` of dnstap/dnstap.pb), encoded by hand: varints and
//! length-delimited fields, the few this server writes.
//!
//! ```text
//! Dnstap  { identity=1 bytes, version=2 bytes, extra=3 bytes, message=14, type=15 (MESSAGE=1) }
//! Message { type=1 (AUTH_QUERY=1, AUTH_RESPONSE=2), socket_family=2 (INET=1, INET6=2),
//!           socket_protocol=3 (UDP=1, TCP=2), query_address=4, response_address=5,
//!           query_port=6, response_port=7, query_time_sec=8, query_time_nsec=9 (fixed32),
//!           query_message=10, response_time_sec=12, response_time_nsec=13 (fixed32),
//!           response_message=14, policy=15 }
//! Policy  { type=1 string, rule=2 bytes, action=3 (LOCAL_DATA=6), match=4 (QNAME=1),
//!           value=5 bytes }
//! ```

use std::net::{IpAddr, SocketAddr};

/// One query as the data plane hands it over: the AUTH_QUERY frame, and the
/// AUTH_RESPONSE frame when it was answered. Its buffers are reused (`sink.rs`).
#[derive(Debug)]
pub struct Record {
    pub tcp: bool,
    pub client: SocketAddr,
    pub server: SocketAddr,
    /// Unix seconds and nanoseconds.
    pub query_time: (u64, u32),
    pub response_time: (u64, u32),
    /// The query's bytes, then the response's (from `split` on).
    pub bytes: Vec<u8>,
    pub split: usize,
    /// Whether a response was sent (`false`: dropped by the rate limiter, or not
    /// answerable).
    pub answered: bool,
    /// The steering decision (`Steered::why`); empty for answers that are not steered.
    pub rule: Vec<u8>,
    /// The CDN picked.
    pub cdn: Vec<u8>,
    /// The ECS source prefix of the query (`None`: no ECS) and the scope echoed.
    pub ecs: Option<u8>,
    pub scope: u8,
}

impl Record {
    pub fn new(capacity: usize) -> Record {
        Record {
            tcp: false,
            client: SocketAddr::from(([0, 0, 0, 0], 0)),
            server: SocketAddr::from(([0, 0, 0, 0], 0)),
            query_time: (0, 0),
            response_time: (0, 0),
            bytes: Vec::with_capacity(capacity),
            split: 0,
            answered: false,
            rule: Vec::with_capacity(RULE_CAPACITY),
            cdn: Vec::with_capacity(CDN_CAPACITY),
            ecs: None,
            scope: 0,
        }
    }

    pub fn query(&self) -> &[u8] {
        &self.bytes[..self.split]
    }

    pub fn response(&self) -> &[u8] {
        &self.bytes[self.split..]
    }
}

/// Bytes of a decision's line and CDN name kept; longer ones are cut (never reached by
/// a validated policy's names).
pub(super) const RULE_CAPACITY: usize = 512;
pub(super) const CDN_CAPACITY: usize = 64;

const AUTH_QUERY: u64 = 1;
const AUTH_RESPONSE: u64 = 2;
const LOCAL_DATA: u64 = 6;
const QNAME: u64 = 1;

/// The text of a decision: the planner's line, then the CDN and the ECS prefixes:
/// `www.example.com. region=gb reason=drain drain=api-1:fastly:-100% policy=… cdn=cloudflare
/// ecs=24 scope=24`. What `extra` and the policy's `rule` carry.
pub(super) fn decision_line(r: &Record, out: &mut Vec<u8>) {
    use std::io::Write as _;
    out.extend_from_slice(&r.rule);
    out.extend_from_slice(b" cdn=");
    out.extend_from_slice(&r.cdn);
    match r.ecs {
        Some(source) => {
            let _ = write!(out, " ecs={source} scope={}", r.scope);
        }
        None => out.extend_from_slice(b" ecs=none"),
    }
}

/// Appends the dnstap payload of `r`'s query (`response`: of its response) to `out`;
/// `scratch` and `line` are reused buffers.
pub(super) fn encode(
    r: &Record,
    response: bool,
    identity: &[u8],
    version: &[u8],
    scratch: &mut Vec<u8>,
    line: &mut Vec<u8>,
    out: &mut Vec<u8>,
) {
    let steered = response && !r.rule.is_empty();
    line.clear();
    if steered {
        decision_line(r, line);
    }
    // The message, then the envelope around it.
    let msg = scratch;
    msg.clear();
    varint_field(1, if response { AUTH_RESPONSE } else { AUTH_QUERY }, msg);
    let family = match r.client.ip() {
        IpAddr::V4(_) => 1,
        IpAddr::V6(_) => 2,
    };
    varint_field(2, family, msg);
    varint_field(3, if r.tcp { 2 } else { 1 }, msg);
    bytes_field(4, &ip_bytes(r.client.ip()), msg);
    bytes_field(5, &ip_bytes(r.server.ip()), msg);
    varint_field(6, u64::from(r.client.port()), msg);
    varint_field(7, u64::from(r.server.port()), msg);
    varint_field(8, r.query_time.0, msg);
    fixed32_field(9, r.query_time.1, msg);
    if !response {
        bytes_field(10, r.query(), msg);
    } else {
        varint_field(12, r.response_time.0, msg);
        fixed32_field(13, r.response_time.1, msg);
        bytes_field(14, r.response(), msg);
    }
    if steered {
        // Policy, nested: its length first.
        // Two length-delimited fields, two one-byte varints, one more field.
        let policy_len =
            field_len(b"steerdns".len()) + field_len(line.len()) + 2 + 2 + field_len(r.cdn.len());
        key(15, 2, msg);
        varint(policy_len as u64, msg);
        bytes_field(1, b"steerdns", msg);
        bytes_field(2, line, msg);
        varint_field(3, LOCAL_DATA, msg);
        varint_field(4, QNAME, msg);
        bytes_field(5, &r.cdn, msg);
    }
    bytes_field(1, identity, out);
    bytes_field(2, version, out);
    if steered {
        bytes_field(3, line, out);
    }
    bytes_field(14, msg, out);
    varint_field(15, 1, out);
}

fn ip_bytes(ip: IpAddr) -> IpBytes {
    match ip {
        IpAddr::V4(a) => {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&a.octets());
            IpBytes(b, 4)
        }
        IpAddr::V6(a) => IpBytes(a.octets(), 16),
    }
}

/// An address's octets, without allocating.
struct IpBytes([u8; 16], usize);

impl std::ops::Deref for IpBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0[..self.1]
    }
}

fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push(n as u8 | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn varint_len(mut n: u64) -> usize {
    let mut len = 1;
    while n >= 0x80 {
        n >>= 7;
        len += 1;
    }
    len
}

fn key(field: u32, wire_type: u8, out: &mut Vec<u8>) {
    varint(u64::from(field) << 3 | u64::from(wire_type), out);
}

fn varint_field(field: u32, n: u64, out: &mut Vec<u8>) {
    key(field, 0, out);
    varint(n, out);
}

fn fixed32_field(field: u32, n: u32, out: &mut Vec<u8>) {
    key(field, 5, out);
    out.extend_from_slice(&n.to_le_bytes());
}

fn bytes_field(field: u32, b: &[u8], out: &mut Vec<u8>) {
    key(field, 2, out);
    varint(b.len() as u64, out);
    out.extend_from_slice(b);
}

/// The encoded size of a length-delimited field of `len` bytes (fields below 16).
fn field_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_little_endian_groups_of_seven_bits() {
        let mut out = Vec::new();
        for (n, want) in [
            (0u64, &[0u8][..]),
            (1, &[1]),
            (127, &[0x7f]),
            (128, &[0x80, 0x01]),
            (300, &[0xac, 0x02]),
            (
                u64::MAX,
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
            ),
        ] {
            out.clear();
            varint(n, &mut out);
            assert_eq!(out, want, "{n}");
            assert_eq!(varint_len(n), want.len(), "{n}");
        }
        out.clear();
        fixed32_field(9, 5, &mut out);
        assert_eq!(out, [0x4d, 5, 0, 0, 0]);
        out.clear();
        bytes_field(14, b"ab", &mut out);
        assert_eq!(out, [0x72, 2, b'a', b'b']);
    }

    fn record(rule: &str) -> Record {
        let mut r = Record::new(64);
        r.client = "192.0.2.1:5353".parse().unwrap();
        r.server = "[2001:db8::53]:53".parse().unwrap();
        r.query_time = (1_700_000_000, 5);
        r.response_time = (1_700_000_000, 7);
        r.bytes.extend_from_slice(b"QQ");
        r.split = 2;
        r.bytes.extend_from_slice(b"RRR");
        r.answered = true;
        r.rule.extend_from_slice(rule.as_bytes());
        r.cdn.extend_from_slice(b"fastly");
        r.ecs = Some(24);
        r.scope = 20;
        r
    }

    /// The top-level fields of a protobuf message: (field, wire type, value or bytes).
    fn fields(mut b: &[u8]) -> Vec<(u64, u8, u64, Vec<u8>)> {
        let read = |b: &mut &[u8]| {
            let (mut n, mut shift) = (0u64, 0);
            loop {
                let byte = b[0];
                *b = &b[1..];
                n |= u64::from(byte & 0x7f) << shift;
                shift += 7;
                if byte < 0x80 {
                    return n;
                }
            }
        };
        let mut out = Vec::new();
        while !b.is_empty() {
            let k = read(&mut b);
            let (field, wt) = (k >> 3, (k & 7) as u8);
            match wt {
                0 => out.push((field, wt, read(&mut b), Vec::new())),
                5 => {
                    let v = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    b = &b[4..];
                    out.push((field, wt, u64::from(v), Vec::new()));
                }
                2 => {
                    let len = read(&mut b) as usize;
                    out.push((field, wt, 0, b[..len].to_vec()));
                    b = &b[len..];
                }
                _ => panic!("wire type {wt}"),
            }
        }
        out
    }

    fn get(f: &[(u64, u8, u64, Vec<u8>)], field: u64) -> Option<&(u64, u8, u64, Vec<u8>)> {
        f.iter().find(|x| x.0 == field)
    }

    #[test]
    fn a_steered_response_carries_its_decision_in_policy_and_extra() {
        let r = record("www.example.com. region=gb reason=normal policy=0123456789ab");
        let (mut scratch, mut line, mut out) = (Vec::new(), Vec::new(), Vec::new());
        encode(
            &r,
            true,
            b"node1",
            b"steerdns 1.0.0",
            &mut scratch,
            &mut line,
            &mut out,
        );
        let top = fields(&out);
        assert_eq!(get(&top, 1).unwrap().3, b"node1");
        assert_eq!(get(&top, 2).unwrap().3, b"steerdns 1.0.0");
        let want = "www.example.com. region=gb reason=normal policy=0123456789ab cdn=fastly ecs=24 scope=20";
        assert_eq!(get(&top, 3).unwrap().3, want.as_bytes());
        assert_eq!(get(&top, 15).unwrap().2, 1);
        let msg = fields(&get(&top, 14).unwrap().3);
        let v = |f| get(&msg, f).unwrap().2;
        assert_eq!((v(1), v(2), v(3)), (2, 1, 1), "AUTH_RESPONSE, INET, UDP");
        assert_eq!(get(&msg, 4).unwrap().3, [192, 0, 2, 1]);
        assert_eq!(get(&msg, 5).unwrap().3.len(), 16);
        assert_eq!(
            (v(6), v(7), v(8), v(9), v(12), v(13)),
            (5353, 53, 1_700_000_000, 5, 1_700_000_000, 7)
        );
        assert_eq!(get(&msg, 14).unwrap().3, b"RRR");
        assert!(get(&msg, 10).is_none(), "the query is in the AUTH_QUERY");
        let policy = fields(&get(&msg, 15).unwrap().3);
        assert_eq!(get(&policy, 1).unwrap().3, b"steerdns");
        assert_eq!(get(&policy, 2).unwrap().3, want.as_bytes());
        assert_eq!(
            (get(&policy, 3).unwrap().2, get(&policy, 4).unwrap().2),
            (6, 1)
        );
        assert_eq!(get(&policy, 5).unwrap().3, b"fastly");
    }

    #[test]
    fn a_query_frame_has_no_decision_and_the_query_bytes() {
        let mut r = record("x");
        r.tcp = true;
        r.ecs = None;
        let (mut scratch, mut line, mut out) = (Vec::new(), Vec::new(), Vec::new());
        encode(&r, false, b"n", b"v", &mut scratch, &mut line, &mut out);
        let top = fields(&out);
        assert!(get(&top, 3).is_none());
        let msg = fields(&get(&top, 14).unwrap().3);
        assert_eq!((get(&msg, 1).unwrap().2, get(&msg, 3).unwrap().2), (1, 2));
        assert_eq!(get(&msg, 10).unwrap().3, b"QQ");
        assert!(get(&msg, 15).is_none() && get(&msg, 14).is_none());
        // Not steered: no policy in the response either.
        r.rule.clear();
        out.clear();
        encode(&r, true, b"n", b"v", &mut scratch, &mut line, &mut out);
        let msg = fields(&get(&fields(&out), 14).unwrap().3);
        assert!(get(&msg, 15).is_none());
        line.clear();
        r.rule.extend_from_slice(b"a");
        decision_line(&r, &mut line);
        assert_eq!(line, b"a cdn=fastly ecs=none");
    }
}
