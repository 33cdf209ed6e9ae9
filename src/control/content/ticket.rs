//! Control plane, content steering: beacon tickets. A beacon (`POST /rum/{name}`) and
//! the throughput a steering poll reports count only with a ticket this server (or
//! another node of its set) issued: a short-lived HMAC-SHA256 of the session, the
//! name, the client's region and the expiry.
//!
//! ```text
//! ticket = SESSION "." EXPIRES "." MAC
//!   SESSION  16 hex digits (the content steering session key)
//!   EXPIRES  Unix seconds, decimal
//!   MAC      base64url (no padding) of HMAC-SHA256(K, SESSION (8 bytes, big-endian)
//!            | EXPIRES (8) | len(name) (2) | name | len(region) (2) | region)
//!   K        HMAC-SHA256(DNS cookie secret, "steerdns beacon ticket v1")
//! ```
//!
//! - The key is derived from the DNS cookie secret (`control/cookies.rs`, read from
//!   the same lock-free [`Jar`]) with a label of its own, so the two never share a key
//!   while sharing how it is kept: a single node's in `STATE_DIR/cookie-secret`, a
//!   set's in etcd under `cookie`, so every node of a set accepts every other's
//!   tickets. A ticket is accepted under the current secret or the previous one (the
//!   secret rotates at least an hour apart; a ticket lives at most an hour).
//! - `name` is the steered name (fully qualified, lowercase, as the plan writes it),
//!   `region` the name of the region the client is located in when it gets the ticket
//!   and when it uses it: a client cannot speak for another region than its own.
//! - Issued by every steering manifest (`STEERDNS-TICKET` and `ticket=` in
//!   `RELOAD-URI`) and by `GET /rum/{name}/ticket` for players that use DNS steering
//!   alone; valid for [`lifetime`].

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use ring::hmac;

use crate::dns::cookie::{Jar, Secrets};

/// The label the ticket key is derived with from the DNS cookie secret.
const LABEL: &[u8] = b"steerdns beacon ticket v1";
/// How long a ticket is valid at least.
pub const MIN_LIFETIME: Duration = Duration::from_secs(600);
/// How long a ticket is valid at most (the shortest rotation of the secret).
pub const MAX_LIFETIME: Duration = Duration::from_secs(3600);
/// The longest text taken as a ticket (ours are 16 + 1 + up to 20 + 1 + 43).
const MAX_LEN: usize = 96;

/// How long a ticket issued with a manifest of `ttl` seconds lives: two of the
/// player's polls, within [`MIN_LIFETIME`] and [`MAX_LIFETIME`], so a player that
/// polls gets a fresh one before its last one expires.
pub fn lifetime(ttl: u32) -> Duration {
    Duration::from_secs(u64::from(ttl) * 2).clamp(MIN_LIFETIME, MAX_LIFETIME)
}

/// Why a ticket is refused: the 403's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("no ticket: ask a steering manifest or GET /rum/{{name}}/ticket for one")]
    Missing,
    #[error("not a ticket")]
    Malformed,
    #[error("the ticket has expired: ask for a new one")]
    Expired,
    #[error("the ticket is not valid for this name and this client's region")]
    Invalid,
}

fn key(secret: &[u8; 16]) -> hmac::Key {
    let outer = hmac::Key::new(hmac::HMAC_SHA256, secret);
    hmac::Key::new(hmac::HMAC_SHA256, hmac::sign(&outer, LABEL).as_ref())
}

fn message(session: u64, expires: u64, name: &str, region: &str) -> Vec<u8> {
    let mut m = Vec::with_capacity(20 + name.len() + region.len());
    m.extend_from_slice(&session.to_be_bytes());
    m.extend_from_slice(&expires.to_be_bytes());
    for part in [name, region] {
        let len = u16::try_from(part.len()).unwrap_or(u16::MAX);
        m.extend_from_slice(&len.to_be_bytes());
        m.extend_from_slice(&part.as_bytes()[..usize::from(len)]);
    }
    m
}

/// A ticket for `session`, `name` and `region`, valid until `expires` (Unix seconds),
/// signed with `secret` (a DNS cookie secret).
pub fn issue(secret: &[u8; 16], session: u64, name: &str, region: &str, expires: u64) -> String {
    let tag = hmac::sign(&key(secret), &message(session, expires, name, region));
    format!("{session:016x}.{expires}.{}", B64.encode(tag.as_ref()))
}

/// The session of `ticket` when it is valid at `now` (Unix seconds) for `name` and
/// `region` under the current or the previous secret.
pub fn check(
    secrets: &Secrets,
    ticket: &str,
    name: &str,
    region: &str,
    now: u64,
) -> Result<u64, Refused> {
    if ticket.is_empty() {
        return Err(Refused::Missing);
    }
    if ticket.len() > MAX_LEN {
        return Err(Refused::Malformed);
    }
    let mut parts = ticket.split('.');
    let (Some(session), Some(expires), Some(mac), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refused::Malformed);
    };
    let session = (session.len() == 16)
        .then(|| u64::from_str_radix(session, 16).ok())
        .flatten()
        .ok_or(Refused::Malformed)?;
    let expires: u64 = expires.parse().map_err(|_| Refused::Malformed)?;
    let mac = B64.decode(mac).map_err(|_| Refused::Malformed)?;
    if expires < now {
        return Err(Refused::Expired);
    }
    let m = message(session, expires, name, region);
    let valid = std::iter::once(&secrets.current)
        .chain(secrets.previous.as_ref())
        .any(|s| hmac::verify(&key(s), &m, &mac).is_ok());
    if valid {
        Ok(session)
    } else {
        Err(Refused::Invalid)
    }
}

/// The ticket maker of a steering server: the DNS cookie secrets it reads.
#[derive(Clone)]
pub struct Tickets {
    jar: std::sync::Arc<Jar>,
}

impl Tickets {
    pub fn new(jar: std::sync::Arc<Jar>) -> Tickets {
        Tickets { jar }
    }

    /// A ticket valid for `lifetime` from `now`.
    pub fn issue(
        &self,
        session: u64,
        name: &str,
        region: &str,
        now: u64,
        lifetime: Duration,
    ) -> (String, u64) {
        let expires = now + lifetime.as_secs();
        let secrets = self.jar.load();
        (
            issue(&secrets.current, session, name, region, expires),
            expires,
        )
    }

    /// [`check`] against the secrets in force.
    pub fn check(&self, ticket: &str, name: &str, region: &str, now: u64) -> Result<u64, Refused> {
        check(&self.jar.load(), ticket, name, region, now)
    }
}

impl std::fmt::Debug for Tickets {
    /// Never the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tickets")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAME: &str = "www.example.com.";

    fn secrets() -> Secrets {
        Secrets {
            current: [7; 16],
            previous: Some([6; 16]),
        }
    }

    #[test]
    fn a_ticket_is_valid_for_its_name_region_and_time_only() {
        let s = secrets();
        let t = issue(&s.current, 0xc0ffee, NAME, "gb", 1_000);
        assert!(t.starts_with("0000000000c0ffee.1000."), "{t}");
        assert!(t.len() <= MAX_LEN);
        assert_eq!(check(&s, &t, NAME, "gb", 1_000), Ok(0xc0ffee));
        assert_eq!(check(&s, &t, NAME, "gb", 1_001), Err(Refused::Expired));
        assert_eq!(
            check(&s, &t, "dl.example.com.", "gb", 900),
            Err(Refused::Invalid)
        );
        assert_eq!(check(&s, &t, NAME, "us", 900), Err(Refused::Invalid));
        // Another session or expiry with the same MAC: forged.
        let mac = t.rsplit('.').next().unwrap();
        for forged in [
            format!("0000000000c0ffef.1000.{mac}"),
            format!("0000000000c0ffee.9999.{mac}"),
        ] {
            assert_eq!(
                check(&s, &forged, NAME, "gb", 900),
                Err(Refused::Invalid),
                "{forged}"
            );
        }
        // Name and region cannot slide into each other.
        let t2 = issue(&s.current, 1, "ab", "c", 1_000);
        assert_eq!(check(&s, &t2, "a", "bc", 900), Err(Refused::Invalid));
        // Under the previous secret: still valid; under neither: not.
        let old = issue(&[6; 16], 1, NAME, "gb", 1_000);
        assert_eq!(check(&s, &old, NAME, "gb", 900), Ok(1));
        let other = issue(&[5; 16], 1, NAME, "gb", 1_000);
        assert_eq!(check(&s, &other, NAME, "gb", 900), Err(Refused::Invalid));
        // The ticket key is not the cookie secret itself.
        assert_ne!(
            issue(&s.current, 1, NAME, "gb", 1_000),
            format!(
                "0000000000000001.1000.{}",
                B64.encode(
                    hmac::sign(
                        &hmac::Key::new(hmac::HMAC_SHA256, &s.current),
                        &message(1, 1_000, NAME, "gb")
                    )
                    .as_ref()
                )
            )
        );
    }

    #[test]
    fn malformed_tickets_are_refused() {
        let s = secrets();
        assert_eq!(check(&s, "", NAME, "gb", 0), Err(Refused::Missing));
        for bad in [
            "x",
            "0000000000c0ffee.1000",
            "0000000000c0ffee.1000.AAAA.x",
            "c0ffee.1000.AAAA",
            "000000000zc0ffee.1000.AAAA",
            "0000000000c0ffee.-1.AAAA",
            "0000000000c0ffee.1000.*",
            &"a".repeat(200),
        ] {
            assert_eq!(
                check(&s, bad, NAME, "gb", 0),
                Err(Refused::Malformed),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_ticket_lives_two_polls_within_bounds() {
        assert_eq!(lifetime(1), MIN_LIFETIME);
        assert_eq!(lifetime(900), Duration::from_secs(1800));
        assert_eq!(lifetime(86_400), MAX_LIFETIME);
    }
}
