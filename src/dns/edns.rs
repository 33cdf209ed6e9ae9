//! Data plane: EDNS(0) and EDNS Client Subnet, request side and response side.
//!
//! | RFC | what we do |
//! |---|---|
//! | 6891 §6.1.3 | EDNS version > 0: `BADVERS`, answered with our version 0 |
//! | 6891 §6.2.5 | response UDP size = the requester's, at least 512; we advertise at most 1232 (DNS Flag Day 2020) |
//! | 6891 §7 | no OPT in the query: none in the response |
//! | 3225 §3 | the DO bit is copied into the response |
//! | 7871 §6 | ECS with address bits set past SOURCE PREFIX-LENGTH: `FORMERR` |
//! | 7871 §6 | ECS with a non-zero SCOPE PREFIX-LENGTH in a query: `FORMERR` |
//! | 7871 §6 | unknown FAMILY, SOURCE past the address length: `FORMERR` (hickory's decoder already refuses the packet) |
//! | 7871 §6 | more ADDRESS octets than SOURCE PREFIX-LENGTH needs (e.g. 4 for a /24, any for a /0): `FORMERR`; too few: `FORMERR` (hickory's decoder refuses the packet) |
//! | 7871 §6 | two ECS options: `FORMERR` (there is no telling which client is meant) |
//! | 7871 §7.1.1 | SOURCE 0: the client opted out; locate by the packet source, answer SCOPE 0 |
//! | 7871 §7.2.1 | echo FAMILY, SOURCE and ADDRESS; SCOPE = the prefix the answer depends on |
//! | 6891 §7 | the rate limiter's truncated answer (slip) to a query with an OPT carries one: payload and DO as above, version 0, no ECS (`wire::truncated`) |
//! | 8945 §5.2, §5.3.2 | a TSIG-signed request (no key is configured, so every key is unknown): `NOTAUTH` with an unsigned TSIG, error `BADKEY` (`Handler`'s `bad_key`) |
//! | 1035 §4.1.1 | an opcode other than QUERY: `NOTIMP`, header only (no question), id and opcode copied, no flag but QR; the OPT as above (RFC 6891 §7) |
//! | 7873 §5.2.2 | a COOKIE option of a length other than 8 or 16 to 40 (or two of them): `FORMERR`, OPT without a cookie |
//! | 7873 §5.2.3, 9018 §4.3 | a client cookie, alone or with a server cookie that is not ours, expired (> 1 h) or from the future (> 5 min): answered as usual with a fresh server cookie (cookies are never required) |
//! | 7873 §5.2.4, 9018 §4.3 | a valid server cookie (under the current or the previous secret): echoed, or renewed when older than 30 min |
//! | 7873 §5.4 | every answer to a query with a well-formed COOKIE option carries one (errors, BADVERS, NOTIMP included), over UDP and TCP; over TCP cookies are echoed, never required |
//! | 7873 §5.2.3, §5.3 | a query with a client cookie but no valid server cookie that the rate limiter would slip (TC) gets `BADCOOKIE` (extended rcode 23) with a fresh server cookie instead (`wire::badcookie`); a valid server cookie gets the client its own rate budget, never slipped (`rrl.rs`) |
//! | 8914 | an error answer to a query with an OPT says why in an Extended DNS Error ([`Ede`]: the table there); none without an OPT |
//!
//! Every ECS rule of RFC 7871 §6 is one function over the option's bytes as received,
//! [`ecs_option`]: the fast path (`wire.rs`) takes a query only when it passes, the full
//! path answers `FORMERR` when it fails ([`client`]), so the two cannot disagree.
//!
//! Pure functions; unit-tested here, and over sockets in `tests/ecs.rs`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hickory_proto::op::{Edns, ResponseCode};
use hickory_proto::rr::rdata::opt::{ClientSubnet, EdnsOption};

/// The largest UDP payload we advertise and send, as NSD, Knot and BIND do since DNS
/// Flag Day 2020: larger answers risk IP fragmentation, and go over TCP instead.
pub(crate) const MAX_UDP_PAYLOAD: u16 = 1232;

/// The EDNS option code of Client Subnet (RFC 7871 §6).
const OPTION_ECS: u16 = 8;
/// The EDNS option code of Extended DNS Error (RFC 8914 §2).
const OPTION_EDE: u16 = 15;

/// An Extended DNS Error (RFC 8914): the INFO-CODE and the EXTRA-TEXT steerdns gives in
/// the OPT of an error answer, so that a resolver's operator sees why without asking us.
/// Only to a query that carried an OPT (RFC 6891 §7); the EDE option comes before the ECS
/// echo.
///
/// | answer | rcode | INFO-CODE | EXTRA-TEXT |
/// |---|---|---|---|
/// | a name outside every zone served here | `REFUSED` | 20 Not Authoritative | [`Ede::NOT_OURS`] |
/// | a zone transfer (AXFR, IXFR) | `REFUSED` | 21 Not Supported | [`Ede::TRANSFER`] |
/// | a class other than IN | `REFUSED` | 21 Not Supported | [`Ede::CLASS`] |
/// | an opcode other than QUERY | `NOTIMP` | 21 Not Supported | [`Ede::OPCODE`] |
/// | a malformed ECS option (RFC 7871 §6) | `FORMERR` | 0 Other Error | [`Ede::ECS`] |
/// | a question that is compressed, or not one question | `FORMERR` | 0 Other Error | [`Ede::QUESTION`] |
/// | a malformed COOKIE option (RFC 7873 §5.2.2) | `FORMERR` | 0 Other Error | [`Ede::COOKIE`] |
/// | the rate limiter's truncated answer (slip) | `NOERROR`, TC | 0 Other Error | [`Ede::RATE_LIMITED`] |
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ede {
    pub code: u16,
    pub text: &'static str,
}

impl Ede {
    const fn new(code: u16, text: &'static str) -> Ede {
        Ede { code, text }
    }

    pub(crate) const NOT_OURS: Ede = Ede::new(20, "not in a zone served here");
    pub(crate) const TRANSFER: Ede = Ede::new(21, "zone transfers are not offered");
    pub(crate) const CLASS: Ede = Ede::new(21, "only class IN is served");
    pub(crate) const OPCODE: Ede = Ede::new(21, "only opcode QUERY is served");
    pub(crate) const ECS: Ede = Ede::new(0, "malformed ECS option (RFC 7871 section 6)");
    pub(crate) const QUESTION: Ede = Ede::new(0, "one uncompressed question is served");
    pub(crate) const COOKIE: Ede = Ede::new(0, "malformed COOKIE option (RFC 7873 section 5.2.2)");
    pub(crate) const RATE_LIMITED: Ede = Ede::new(0, "rate limited: retry over TCP");

    /// Bytes of the option (code, length, INFO-CODE, EXTRA-TEXT).
    pub(crate) fn wire_len(&self) -> u16 {
        6 + self.text.len() as u16
    }

    /// Appends the option as the wire carries it.
    ///
    /// # Hot path
    /// Copies into `out`; no allocation once `out` has grown.
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&OPTION_EDE.to_be_bytes());
        out.extend_from_slice(&(2 + self.text.len() as u16).to_be_bytes());
        out.extend_from_slice(&self.code.to_be_bytes());
        out.extend_from_slice(self.text.as_bytes());
    }

    /// Puts the option first among `opt`'s options (before the ECS echo, where the answer
    /// cache expects it).
    pub(crate) fn add_to(&self, opt: &mut Edns) {
        let mut data = self.code.to_be_bytes().to_vec();
        data.extend_from_slice(self.text.as_bytes());
        let option = EdnsOption::Unknown(OPTION_EDE, data);
        opt.options_mut()
            .options
            .insert(0, ((&option).into(), option));
    }
}

/// `opt` with `ede` added ([`Ede::add_to`]).
pub(crate) fn with_ede(mut opt: Edns, ede: Ede) -> Edns {
    ede.add_to(&mut opt);
    opt
}

/// Who asked, as far as steering cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Client {
    /// The address to locate: the ECS address, else the packet's source.
    pub ip: IpAddr,
    /// The query's ECS option, to echo.
    pub ecs: Option<ClientSubnet>,
}

/// Reads the request's EDNS: the client to locate, or the error rcode to answer with.
/// `options` gives the OPT's options as received, read only when hickory found an ECS
/// option among them: [`ecs_option`] judges it over those bytes.
///
/// hickory's decoder refuses an ECS option it cannot read (unknown family, too few
/// address octets), and keeps no option at all of an OPT whose options do not fill its
/// length; so the options it read fill the bytes, and hold as many ECS options.
pub(crate) fn client<'p>(
    edns: Option<&Edns>,
    src: IpAddr,
    options: impl FnOnce() -> Option<&'p [u8]>,
) -> Result<Client, ResponseCode> {
    let Some(edns) = edns else {
        return Ok(Client { ip: src, ecs: None });
    };
    if edns.version() > 0 {
        return Err(ResponseCode::BADVERS);
    }
    let subnet = edns.options().options.iter().find_map(|(_, o)| match o {
        EdnsOption::Subnet(cs) => Some(*cs),
        _ => None,
    });
    let Some(cs) = subnet else {
        return Ok(Client { ip: src, ecs: None });
    };
    // No OPT found in the bytes where hickory found an ECS option: not checkable.
    ecs_option(options().ok_or(ResponseCode::FormErr)?)?;
    let ip = if cs.source_prefix() > 0 {
        cs.addr()
    } else {
        src
    };
    Ok(Client { ip, ecs: Some(cs) })
}

/// An ECS option of a query as received, valid ([`ecs_option`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ecs<'q> {
    /// FAMILY: 1 (IPv4) or 2 (IPv6).
    pub family: u16,
    /// SOURCE PREFIX-LENGTH (0: the client opted out).
    pub source: u8,
    /// ADDRESS: exactly the octets `source` needs.
    pub address: &'q [u8],
}

/// RFC 7871 §6 over the OPT's options as received (`options`: its RDATA), the one ECS
/// rule both paths use. The options must be well formed (each within the bytes, none
/// left over), with at most one ECS option, and that one valid: FAMILY 1 or 2, SOURCE
/// within the address length, SCOPE 0, exactly the ADDRESS octets SOURCE needs and no
/// bit set past SOURCE. `Ok(None)`: no ECS option; `Err`: `FORMERR`.
///
/// # Hot path
/// A walk of the options' bytes; no allocation.
pub(crate) fn ecs_option(options: &[u8]) -> Result<Option<Ecs<'_>>, ResponseCode> {
    let mut found = None;
    let mut rest = options;
    while !rest.is_empty() {
        let [c0, c1, l0, l1, tail @ ..] = rest else {
            return Err(ResponseCode::FormErr);
        };
        let len = usize::from(u16::from_be_bytes([*l0, *l1]));
        let (data, after) = tail.split_at_checked(len).ok_or(ResponseCode::FormErr)?;
        if u16::from_be_bytes([*c0, *c1]) == OPTION_ECS {
            if found.is_some() {
                return Err(ResponseCode::FormErr);
            }
            found = Some(subnet(data).ok_or(ResponseCode::FormErr)?);
        }
        rest = after;
    }
    Ok(found)
}

/// One ECS option's data (FAMILY, SOURCE, SCOPE, ADDRESS), if valid ([`ecs_option`]).
fn subnet(data: &[u8]) -> Option<Ecs<'_>> {
    let [f0, f1, source, scope, ref address @ ..] = *data else {
        return None;
    };
    let family = u16::from_be_bytes([f0, f1]);
    let max = match family {
        1 => 32,
        2 => 128,
        _ => return None,
    };
    if scope != 0 || source > max || address.len() != usize::from(source).div_ceil(8) {
        return None;
    }
    // The bits of the last octet past SOURCE are zero.
    let spare = (8 - source % 8) % 8;
    if address
        .last()
        .is_some_and(|&last| last & ((1u8 << spare) - 1) != 0)
    {
        return None;
    }
    Some(Ecs {
        family,
        source,
        address,
    })
}

impl Ecs<'_> {
    /// Bytes of the echoed option (code, length, data).
    pub(crate) fn echo_len(&self) -> u16 {
        8 + self.address.len() as u16
    }

    /// Appends the option as echoed (RFC 7871 §7.2.1): family, source and address as
    /// received, `scope` (0 when the client opted out with source 0).
    pub(crate) fn echo(&self, scope: u8, out: &mut Vec<u8>) {
        out.extend_from_slice(&OPTION_ECS.to_be_bytes());
        out.extend_from_slice(&(4 + self.address.len() as u16).to_be_bytes());
        out.extend_from_slice(&self.family.to_be_bytes());
        out.push(self.source);
        out.push(if self.source == 0 { 0 } else { scope });
        out.extend_from_slice(self.address);
    }

    /// The address, the octets past ADDRESS zero.
    pub(crate) fn ip(&self) -> IpAddr {
        if self.family == 1 {
            let mut octets = [0u8; 4];
            octets[..self.address.len()].copy_from_slice(self.address);
            IpAddr::V4(Ipv4Addr::from(octets))
        } else {
            let mut octets = [0u8; 16];
            octets[..self.address.len()].copy_from_slice(self.address);
            IpAddr::V6(Ipv6Addr::from(octets))
        }
    }
}

/// The response OPT for a request that had one: our version, the payload size, DO, the
/// ECS option echoed with `scope` (forced to 0 when the client opted out), then the
/// COOKIE option `cookie` (client cookie and ours, `cookie.rs`).
pub(crate) fn response(
    req: &Edns,
    ecs: Option<ClientSubnet>,
    scope: u8,
    cookie: Option<&[u8; super::cookie::REPLY_LEN]>,
) -> Edns {
    let mut out = Edns::new();
    out.set_max_payload(req.max_payload().clamp(512, MAX_UDP_PAYLOAD));
    out.set_version(0);
    out.set_dnssec_ok(req.flags().dnssec_ok);
    if let Some(mut cs) = ecs {
        cs.set_scope_prefix(if cs.source_prefix() == 0 { 0 } else { scope });
        out.options_mut().insert(EdnsOption::Subnet(cs));
    }
    if let Some(c) = cookie {
        out.options_mut().insert(EdnsOption::Unknown(
            super::cookie::OPTION_COOKIE,
            c.to_vec(),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::rdata::opt::EdnsCode;

    /// An ECS option (code, length, data) from its data.
    fn option(data: &[u8]) -> Vec<u8> {
        let mut o = vec![0, 8, 0, data.len() as u8];
        o.extend_from_slice(data);
        o
    }

    /// `client` for a query whose OPT holds these ECS options' data, read as hickory
    /// reads them and as received.
    fn ask(options: &[&[u8]]) -> Result<Client, ResponseCode> {
        let mut e = Edns::new();
        let mut bytes = Vec::new();
        for data in options {
            let cs = ClientSubnet::try_from(*data).unwrap();
            e.options_mut().insert(EdnsOption::Subnet(cs));
            bytes.extend(option(data));
        }
        client(Some(&e), src(), || Some(&bytes))
    }

    fn src() -> IpAddr {
        "192.0.2.7".parse().unwrap()
    }

    #[test]
    fn no_edns_locates_the_source() {
        let none = || -> Option<&[u8]> { panic!("no ECS option: the bytes are not read") };
        let plain = Client {
            ip: src(),
            ecs: None,
        };
        assert_eq!(client(None, src(), none).unwrap(), plain);
        assert_eq!(client(Some(&Edns::new()), src(), none).unwrap(), plain);
    }

    #[test]
    fn ecs_address_is_located() {
        let c = ask(&[&[0, 1, 24, 0, 81, 2, 69]]).unwrap();
        assert_eq!(c.ip, "81.2.69.0".parse::<IpAddr>().unwrap());
        assert!(
            c.ecs.is_some_and(|e| e.source_prefix() > 0),
            "a SOURCE over 0 asks for a tailored answer"
        );
        let c = ask(&[&[0, 2, 44, 0, 0x20, 1, 0x0d, 0xb8, 0, 0x10]]).unwrap();
        assert_eq!(c.ip, "2001:db8:10::".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn source_zero_is_an_opt_out() {
        let c = ask(&[&[0, 1, 0, 0]]).unwrap();
        assert_eq!(c.ip, src());
        let mut req = Edns::new();
        req.options_mut().insert(EdnsOption::Subnet(c.ecs.unwrap()));
        let resp = response(&req, c.ecs, 24, None);
        match resp.option(EdnsCode::Subnet) {
            Some(EdnsOption::Subnet(out)) => assert_eq!(out.scope_prefix(), 0),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_subnets_are_formerr() {
        let formerr = Err(ResponseCode::FormErr);
        // 81.2.77.0/22: a bit set past the prefix; 81.2.69.0/24 with scope 8.
        assert_eq!(ask(&[&[0, 1, 22, 0, 81, 2, 77]]), formerr);
        assert_eq!(ask(&[&[0, 1, 24, 8, 81, 2, 69]]), formerr);
        // 2001:db8:8::/44: a bit set past the prefix.
        assert_eq!(
            ask(&[&[0, 2, 44, 0, 0x20, 1, 0x0d, 0xb8, 0, 0x08]]),
            formerr
        );
        // Two ECS options, each valid.
        let (a, b): (&[u8], &[u8]) = (&[0, 1, 24, 0, 81, 2, 69], &[0, 1, 24, 0, 81, 2, 70]);
        assert_eq!(ask(&[a, b]), formerr);
        // No OPT found in the bytes where hickory found one.
        let mut e = Edns::new();
        e.options_mut()
            .insert(EdnsOption::Subnet(ClientSubnet::try_from(a).unwrap()));
        assert_eq!(client(Some(&e), src(), || None), formerr);
    }

    #[test]
    fn one_rule_over_the_bytes() {
        let ok = |o: &[u8]| ecs_option(o).map(|e| e.map(|e| (e.family, e.source, e.address.len())));
        // 81.2.69.0/24 with 3 octets; /0 with none; /25 with 4; IPv6 /56 with 7.
        assert_eq!(ok(&option(&[0, 1, 24, 0, 81, 2, 69])), Ok(Some((1, 24, 3))));
        assert_eq!(ok(&option(&[0, 1, 0, 0])), Ok(Some((1, 0, 0))));
        assert_eq!(
            ok(&option(&[0, 1, 25, 0, 81, 2, 69, 128])),
            Ok(Some((1, 25, 4)))
        );
        let v6 = [0, 2, 56, 0, 0x20, 1, 2, 0x18, 0, 0, 0];
        assert_eq!(ok(&option(&v6)), Ok(Some((2, 56, 7))));
        assert_eq!(
            ok(&option(&[0, 1, 32, 0, 81, 2, 69, 161])),
            Ok(Some((1, 32, 4)))
        );
        // Other options around it are skipped; no option at all.
        let mut around = vec![0xfd, 0xe9, 0, 3, 1, 2, 3];
        around.extend(option(&[0, 1, 24, 0, 81, 2, 69]));
        around.extend([0, 10, 0, 0]);
        assert_eq!(ok(&around), Ok(Some((1, 24, 3))));
        assert_eq!(ok(&[]), Ok(None));
        assert_eq!(ok(&[0, 10, 0, 0]), Ok(None));
        let formerr = Err(ResponseCode::FormErr);
        // One octet too many: /24 with 4, /0 with 1, IPv6 /56 with 8; and too few.
        assert_eq!(ok(&option(&[0, 1, 24, 0, 81, 2, 69, 0])), formerr);
        assert_eq!(ok(&option(&[0, 1, 0, 0, 0])), formerr);
        assert_eq!(
            ok(&option(&[0, 2, 56, 0, 0x20, 1, 2, 0x18, 0, 0, 0, 0])),
            formerr
        );
        assert_eq!(ok(&option(&[0, 1, 24, 0, 81, 2])), formerr);
        assert_eq!(ok(&option(&[0, 1])), formerr);
        assert_eq!(ok(&option(&[])), formerr);
        // A bit past the source, a scope, an unknown family, a source past the family.
        assert_eq!(ok(&option(&[0, 1, 23, 0, 81, 2, 69])), formerr);
        assert_eq!(ok(&option(&[0, 1, 22, 0, 81, 2, 77])), formerr);
        assert_eq!(ok(&option(&[0, 1, 24, 24, 81, 2, 69])), formerr);
        assert_eq!(ok(&option(&[0, 3, 24, 0, 81, 2, 69])), formerr);
        assert_eq!(ok(&option(&[0, 1, 33, 0, 81, 2, 69, 161, 0])), formerr);
        // Two ECS options.
        let mut two = option(&[0, 1, 24, 0, 81, 2, 69]);
        two.extend(option(&[0, 1, 0, 0]));
        assert_eq!(ok(&two), formerr);
        // An option longer than what is left; bytes left over after the last.
        assert_eq!(ok(&[0, 8, 0, 9, 0, 1, 24, 0]), formerr);
        assert_eq!(ok(&[0, 10, 0, 0, 0]), formerr);
        assert_eq!(ok(&[0, 10, 0, 0, 0, 8, 0]), formerr);
    }

    #[test]
    fn the_address_is_the_octets_padded() {
        let ip = |data: &[u8]| ecs_option(&option(data)).unwrap().unwrap().ip();
        assert_eq!(
            ip(&[0, 1, 20, 0, 81, 2, 64]),
            "81.2.64.0".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            ip(&[0, 2, 16, 0, 0x20, 0x01]),
            "2001::".parse::<IpAddr>().unwrap()
        );
        let v6 = [0, 2, 48, 0, 0x20, 0x01, 0x02, 0x18, 0, 0];
        assert_eq!(ip(&v6), "2001:218::".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn badvers() {
        let mut e = Edns::new();
        e.set_version(1);
        assert_eq!(client(Some(&e), src(), || None), Err(ResponseCode::BADVERS));
    }

    #[test]
    fn payload_is_clamped() {
        let mut e = Edns::new();
        e.set_max_payload(4096);
        assert_eq!(response(&e, None, 0, None).max_payload(), MAX_UDP_PAYLOAD);
        e.set_max_payload(700);
        assert_eq!(response(&e, None, 0, None).max_payload(), 700);
    }
}
