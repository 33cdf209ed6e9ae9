//! Data plane: DNS cookies (RFC 7873), with the interoperable server cookie of RFC 9018
//! (version 1, SipHash-2-4), so that every node of a set holding the same secret makes
//! and accepts the same cookies.
//!
//! ```text
//! COOKIE option (code 10): client cookie (8) | server cookie (8 to 32, ours: 16)
//! server cookie, version 1:  Version=1 | Reserved (3) | Timestamp (4, serial seconds)
//!                            | Hash = SipHash-2-4(secret; client cookie | Version
//!                              | Reserved | Timestamp | client IP (4 or 16 bytes))
//! ```
//!
//! - Lengths: 8 (client cookie only) or 16 to 40; anything else is malformed and the
//!   query gets `FORMERR` (RFC 7873 §5.2.2). Two COOKIE options: `FORMERR` too (there is
//!   no telling which one the client meant).
//! - A server cookie is valid when it is version 1 of 16 bytes, its hash matches under
//!   the current or the previous secret (the Reserved bytes as received, RFC 9018
//!   Appendix A.3), and its timestamp is at most [`MAX_AGE`] old and at most [`MAX_AHEAD`]
//!   in the future (RFC 9018 §4.3).
//! - The answer's cookie: the client cookie and, when the presented server cookie is
//!   valid and younger than [`REISSUE_AFTER`], that one echoed; else a fresh one made
//!   with the current secret (RFC 9018 §4.3: a fresh one at least every half hour).
//! - Cookies are never required: a query with an invalid server cookie (or none) is
//!   answered as usual, with a fresh cookie. `BADCOOKIE` is only the rate limiter's
//!   answer, in place of its truncated slip, to a client that sent a cookie (`udp.rs`).
//!
//! Judging a query's cookie is one walk of the OPT's options and one or two SipHash
//! runs over at most 32 bytes: no allocation. The secrets are read lock-free ([`Jar`]).
//! A whole message's cookie is found by `wire::cookie_of` (this module imports none of
//! its siblings).

use std::net::IpAddr;

use arc_swap::ArcSwap;

/// The EDNS option code of COOKIE (RFC 7873 §4).
pub const OPTION_COOKIE: u16 = 10;
/// The extended rcode BADCOOKIE (RFC 7873 §8).
pub const BADCOOKIE: u16 = 23;
/// A server cookie older than this (seconds) is not valid (RFC 9018 §4.3: one hour).
pub const MAX_AGE: u32 = 3600;
/// A server cookie this far (seconds) in the future is still valid (RFC 9018 §4.3).
pub const MAX_AHEAD: u32 = 300;
/// A valid server cookie older than this (seconds) is replaced by a fresh one.
pub const REISSUE_AFTER: u32 = 1800;
/// The length of the COOKIE option data we answer with: client cookie and our server
/// cookie.
pub const REPLY_LEN: usize = 24;

/// The server secrets: cookies are made with `current`, and accepted under `current`
/// or `previous` (the one before the last rotation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Secrets {
    pub current: [u8; 16],
    pub previous: Option<[u8; 16]>,
}

impl Secrets {
    /// A random current secret and no previous one.
    pub fn random() -> Secrets {
        Secrets {
            current: rand::random(),
            previous: None,
        }
    }
}

/// The secrets as the data plane reads them: replaced whole by the control plane.
pub type Jar = ArcSwap<Secrets>;

/// A fresh jar with a random secret (until the control plane puts the kept one in).
pub fn random_jar() -> Jar {
    ArcSwap::from_pointee(Secrets::random())
}

/// What a query's COOKIE option was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// A client cookie alone (a first contact, or a client that forgot ours).
    ClientOnly,
    /// A server cookie of ours, under either secret, within its lifetime.
    Valid,
    /// A server cookie that is not ours, expired, from the future, or of another
    /// version.
    Invalid,
}

impl Seen {
    /// The `result` label of `steerdns_cookies_total`.
    pub fn label(self) -> &'static str {
        match self {
            Seen::ClientOnly => "client_only",
            Seen::Valid => "valid",
            Seen::Invalid => "invalid",
        }
    }
}

/// A query's cookie as judged, and the COOKIE option data of the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Judged {
    pub seen: Seen,
    pub reply: [u8; REPLY_LEN],
}

/// The COOKIE option of a query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cookie {
    /// No OPT, or no COOKIE option in it.
    Absent,
    /// A COOKIE option of a wrong length, two of them, or options that do not fill the
    /// OPT: `FORMERR`.
    Malformed,
    Present(Judged),
}

impl Cookie {
    /// The answer's COOKIE option data, when the query had a well-formed one.
    pub fn reply(&self) -> Option<&[u8; REPLY_LEN]> {
        match self {
            Cookie::Present(j) => Some(&j.reply),
            _ => None,
        }
    }

    /// Whether the query presented a valid server cookie of ours.
    pub fn is_valid(&self) -> bool {
        matches!(self, Cookie::Present(j) if j.seen == Seen::Valid)
    }

    /// The `result` label of `steerdns_cookies_total`; `None` without a cookie.
    pub fn label(&self) -> Option<&'static str> {
        match self {
            Cookie::Absent => None,
            Cookie::Malformed => Some("malformed"),
            Cookie::Present(j) => Some(j.seen.label()),
        }
    }
}

/// The COOKIE option data of an OPT's options as received (its RDATA): `Ok(None)` for
/// none, `Err(())` when malformed (a wrong length, two COOKIE options, options that do
/// not fill the bytes).
///
/// # Hot path
/// A walk of the options' bytes; no allocation.
#[allow(clippy::result_unit_err)]
pub fn option(options: &[u8]) -> Result<Option<&[u8]>, ()> {
    let mut found = None;
    let mut rest = options;
    while !rest.is_empty() {
        let [c0, c1, l0, l1, tail @ ..] = rest else {
            return Err(());
        };
        let len = usize::from(u16::from_be_bytes([*l0, *l1]));
        let (data, after) = tail.split_at_checked(len).ok_or(())?;
        if u16::from_be_bytes([*c0, *c1]) == OPTION_COOKIE {
            if found.is_some() || !(data.len() == 8 || (16..=40).contains(&data.len())) {
                return Err(());
            }
            found = Some(data);
        }
        rest = after;
    }
    Ok(found)
}

/// Judges a well-formed COOKIE option's `data` (8, or 16 to 40 bytes) from a client at
/// `ip` at `now` (serial seconds), and makes the answer's option data.
pub fn judge(data: &[u8], secrets: &Secrets, ip: IpAddr, now: u32) -> Judged {
    let mut client = [0u8; 8];
    client.copy_from_slice(&data[..8]);
    let server = &data[8..];
    let seen = if server.is_empty() {
        Seen::ClientOnly
    } else {
        match valid_age(&client, server, secrets, ip, now) {
            Some(age) if age <= REISSUE_AFTER => {
                // Valid and young: echoed as it came.
                let mut reply = [0u8; REPLY_LEN];
                reply.copy_from_slice(&data[..REPLY_LEN]);
                return Judged {
                    seen: Seen::Valid,
                    reply,
                };
            }
            Some(_) => Seen::Valid,
            None => Seen::Invalid,
        }
    };
    let mut reply = [0u8; REPLY_LEN];
    reply[..8].copy_from_slice(&client);
    reply[8..].copy_from_slice(&server_cookie(&secrets.current, &client, now, ip));
    Judged { seen, reply }
}

/// The age in seconds (0 when ahead) of `server` if it is a valid server cookie of ours
/// for `client` at `ip` at `now`.
fn valid_age(
    client: &[u8; 8],
    server: &[u8],
    secrets: &Secrets,
    ip: IpAddr,
    now: u32,
) -> Option<u32> {
    if server.len() != 16 || server[0] != 1 {
        return None;
    }
    let stamp = u32::from_be_bytes([server[4], server[5], server[6], server[7]]);
    // Serial number arithmetic (RFC 1982): a difference, either way.
    let age = now.wrapping_sub(stamp);
    let ahead = stamp.wrapping_sub(now);
    let age = if age <= MAX_AGE {
        age
    } else if ahead <= MAX_AHEAD {
        0
    } else {
        return None;
    };
    let mut head = [0u8; 8];
    head.copy_from_slice(&server[..8]);
    let ours = |secret: &[u8; 16]| hash(secret, client, &head, ip) == server[8..16];
    (ours(&secrets.current) || secrets.previous.as_ref().is_some_and(ours)).then_some(age)
}

/// A version 1 server cookie (RFC 9018 §4.2) for `client` at `ip`, stamped `now`.
pub fn server_cookie(secret: &[u8; 16], client: &[u8; 8], now: u32, ip: IpAddr) -> [u8; 16] {
    let mut head = [1u8, 0, 0, 0, 0, 0, 0, 0];
    head[4..].copy_from_slice(&now.to_be_bytes());
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&head);
    out[8..].copy_from_slice(&hash(secret, client, &head, ip));
    out
}

/// SipHash-2-4 of client cookie | version, reserved, timestamp | client IP.
fn hash(secret: &[u8; 16], client: &[u8; 8], head: &[u8; 8], ip: IpAddr) -> [u8; 8] {
    let mut input = [0u8; 32];
    input[..8].copy_from_slice(client);
    input[8..16].copy_from_slice(head);
    let len = match ip {
        IpAddr::V4(a) => {
            input[16..20].copy_from_slice(&a.octets());
            20
        }
        IpAddr::V6(a) => {
            input[16..32].copy_from_slice(&a.octets());
            32
        }
    };
    siphash24(secret, &input[..len]).to_le_bytes()
}

/// SipHash-2-4 (Aumasson and Bernstein, 2012) of `data` under `key`, written here
/// rather than taken from a crate: thirty lines, checked against the paper's vector and
/// RFC 9018's, and no new dependency in the data plane.
pub fn siphash24(key: &[u8; 16], data: &[u8]) -> u64 {
    let k0 = u64::from_le_bytes(key[..8].try_into().unwrap_or([0; 8]));
    let k1 = u64::from_le_bytes(key[8..].try_into().unwrap_or([0; 8]));
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    fn round(v: &mut [u64; 4]) {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }
    let compress = |m: u64, v: &mut [u64; 4]| {
        v[3] ^= m;
        round(v);
        round(v);
        v[0] ^= m;
    };
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(c);
        compress(u64::from_le_bytes(word), &mut v);
    }
    // The last word: the remaining bytes, and the length's low byte on top.
    let mut last = [0u8; 8];
    let rest = chunks.remainder();
    last[..rest.len()].copy_from_slice(rest);
    last[7] = data.len() as u8;
    compress(u64::from_le_bytes(last), &mut v);
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn key(s: &str) -> [u8; 16] {
        hex(s).try_into().unwrap()
    }

    fn client(s: &str) -> [u8; 8] {
        hex(s).try_into().unwrap()
    }

    fn only(secret: &str) -> Secrets {
        Secrets {
            current: key(secret),
            previous: None,
        }
    }

    #[test]
    fn siphash_paper_vector() {
        // The SipHash paper's Appendix A: key 00..0f, message 00..0e.
        let k: [u8; 16] = std::array::from_fn(|i| i as u8);
        let m: Vec<u8> = (0..15).collect();
        assert_eq!(siphash24(&k, &m), 0xa129_ca61_49be_45e5);
    }

    #[test]
    fn rfc9018_a1_learning_a_new_server_cookie() {
        let ip: IpAddr = "198.51.100.100".parse().unwrap();
        let s = only("e5e973e5a6b2a43f48e7dc849e37bfcf");
        let j = judge(&hex("2464c4abcf10c957"), &s, ip, 1559731985);
        assert_eq!(j.seen, Seen::ClientOnly);
        assert_eq!(
            j.reply.to_vec(),
            hex("2464c4abcf10c957010000005cf79f111f8130c3eee29480")
        );
    }

    #[test]
    fn rfc9018_a2_a_renewed_cookie() {
        // 40 minutes later: still valid, but past half an hour, so renewed.
        let ip: IpAddr = "198.51.100.100".parse().unwrap();
        let s = only("e5e973e5a6b2a43f48e7dc849e37bfcf");
        let sent = hex("2464c4abcf10c957010000005cf79f111f8130c3eee29480");
        let j = judge(&sent, &s, ip, 1559734385);
        assert_eq!(j.seen, Seen::Valid);
        assert_eq!(
            j.reply.to_vec(),
            hex("2464c4abcf10c957010000005cf7a871d4a564a1442aca77")
        );
        // Ten minutes after it was made: valid and echoed as it came.
        let j = judge(&sent, &s, ip, 1559731985 + 600);
        assert_eq!((j.seen, j.reply.to_vec()), (Seen::Valid, sent.clone()));
        // From another address, or under another secret: not ours.
        let other: IpAddr = "198.51.100.101".parse().unwrap();
        assert_eq!(judge(&sent, &s, other, 1559731985).seen, Seen::Invalid);
        let wrong = only("e5e973e5a6b2a43f48e7dc849e37bfce");
        assert_eq!(judge(&sent, &wrong, ip, 1559731985).seen, Seen::Invalid);
    }

    #[test]
    fn rfc9018_a3_reserved_bytes_count_in_the_hash() {
        let ip: IpAddr = "203.0.113.203".parse().unwrap();
        let s = only("e5e973e5a6b2a43f48e7dc849e37bfcf");
        let sent = hex("fc93fc62807ddb8601abcdef5cf78f71a314227b6679ebf5");
        // Made at 1559727985 with Reserved set: valid within its hour (the RFC's
        // reply comes 1 h 52 min later, past the lifetime we keep).
        let j = judge(&sent, &s, ip, 1559727985 + 60);
        assert_eq!((j.seen, j.reply.to_vec()), (Seen::Valid, sent.clone()));
        assert_eq!(judge(&sent, &s, ip, 1559734700).seen, Seen::Invalid);
        // The fresh cookie of the RFC's reply, Reserved zero.
        assert_eq!(
            server_cookie(&s.current, &client("fc93fc62807ddb86"), 1559734700, ip).to_vec(),
            hex("010000005cf7a9acf73a7810aca2381e")
        );
    }

    #[test]
    fn rfc9018_a4_ipv6_under_the_previous_secret() {
        let ip: IpAddr = "2001:db8:220:1:59de:d0f4:8769:82b8".parse().unwrap();
        let sent = hex("22681ab97d52c298010000005cf7c57926556bd0934c72f8");
        let rolled = Secrets {
            current: key("445536bcd2513298075a5d379663c962"),
            previous: Some(key("dd3bdf9344b678b185a6f5cb60fca715")),
        };
        let j = judge(&sent, &rolled, ip, 1559741961);
        assert_eq!(j.seen, Seen::Valid, "accepted under the previous secret");
        assert_eq!(
            server_cookie(&rolled.current, &client("22681ab97d52c298"), 1559741961, ip).to_vec(),
            hex("010000005cf7c609a6bb79d16625507a")
        );
        // Without the previous secret it is not ours.
        let forgotten = Secrets {
            previous: None,
            ..rolled
        };
        assert_eq!(judge(&sent, &forgotten, ip, 1559741961).seen, Seen::Invalid);
    }

    #[test]
    fn the_window_is_an_hour_back_and_five_minutes_ahead() {
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let s = Secrets::random();
        let c = client("0102030405060708");
        let made = 1_000_000u32;
        let mut data = c.to_vec();
        data.extend(server_cookie(&s.current, &c, made, ip));
        let at = |now: u32| judge(&data, &s, ip, now);
        assert_eq!(at(made).seen, Seen::Valid);
        assert_eq!(at(made).reply.to_vec(), data, "echoed while young");
        assert_eq!(at(made + REISSUE_AFTER).reply.to_vec(), data);
        let renewed = at(made + REISSUE_AFTER + 1);
        assert_eq!(renewed.seen, Seen::Valid);
        assert_ne!(renewed.reply.to_vec(), data, "renewed past half an hour");
        assert_eq!(at(made + MAX_AGE).seen, Seen::Valid);
        assert_eq!(at(made + MAX_AGE + 1).seen, Seen::Invalid);
        assert_eq!(at(made - MAX_AHEAD).seen, Seen::Valid);
        assert_eq!(at(made - MAX_AHEAD - 1).seen, Seen::Invalid);
        // Across the wrap of the 32-bit serial.
        let wrapped = u32::MAX - 10;
        let mut data = c.to_vec();
        data.extend(server_cookie(&s.current, &c, wrapped, ip));
        assert_eq!(
            judge(&data, &s, ip, wrapped.wrapping_add(100)).seen,
            Seen::Valid
        );
        // A fresh cookie is always made with the current secret.
        let fresh = judge(&c, &s, ip, made);
        assert_eq!(fresh.seen, Seen::ClientOnly);
        assert_eq!(&fresh.reply[..8], &c);
        assert_eq!(&fresh.reply[8..12], &[1, 0, 0, 0]);
        assert_eq!(&fresh.reply[12..16], &made.to_be_bytes());
    }

    #[test]
    fn other_versions_and_lengths_are_not_ours() {
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let s = Secrets::random();
        let c = client("0102030405060708");
        let mut data = c.to_vec();
        data.extend(server_cookie(&s.current, &c, 7, ip));
        let mut v2 = data.clone();
        v2[8] = 2;
        assert_eq!(judge(&v2, &s, ip, 7).seen, Seen::Invalid);
        // A valid cookie with a byte more is another server's format.
        let mut longer = data.clone();
        longer.push(0);
        assert_eq!(judge(&longer, &s, ip, 7).seen, Seen::Invalid);
        // 8 to 32 bytes of someone else's server cookie: a fresh one of ours.
        let foreign = [c.to_vec(), vec![0xaa; 8]].concat();
        let j = judge(&foreign, &s, ip, 7);
        assert_eq!(j.seen, Seen::Invalid);
        assert_eq!(&j.reply[..8], &c);
    }

    /// A COOKIE option (code, length, data).
    fn opt(data: &[u8]) -> Vec<u8> {
        let mut o = vec![0, 10, 0, data.len() as u8];
        o.extend_from_slice(data);
        o
    }

    #[test]
    fn lengths() {
        for len in [8, 16, 24, 40] {
            let o = opt(&vec![1; len]);
            assert_eq!(option(&o).unwrap().map(<[u8]>::len), Some(len), "{len}");
        }
        for len in (0..8).chain(9..16).chain(41..50) {
            assert_eq!(option(&opt(&vec![1; len])), Err(()), "{len}");
        }
        // Around other options; none; two; options that do not fill the bytes.
        let mut around = vec![0, 8, 0, 4, 0, 1, 0, 0];
        around.extend(opt(&[7; 8]));
        around.extend([0xfd, 0xe9, 0, 0]);
        assert_eq!(option(&around), Ok(Some(&[7u8; 8][..])));
        assert_eq!(option(&[]), Ok(None));
        assert_eq!(option(&[0, 100, 0, 0]), Ok(None));
        let two = [opt(&[7; 8]), opt(&[7; 8])].concat();
        assert_eq!(option(&two), Err(()));
        assert_eq!(option(&[0, 10, 0, 9, 1, 2, 3]), Err(()));
        assert_eq!(option(&[0, 100, 0]), Err(()));
    }
}
