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
//! | 7871 §6 | more ADDRESS octets than SOURCE PREFIX-LENGTH needs (e.g. 4 for a /24, any for a /0): `FORMERR`, counted in the option as received ([`check_address_octets`]); too few: `FORMERR` (hickory's decoder refuses the packet) |
//! | 7871 §7.1.1 | SOURCE 0: the client opted out; locate by the packet source, answer SCOPE 0 |
//! | 7871 §7.2.1 | echo FAMILY, SOURCE and ADDRESS; SCOPE = the prefix the answer depends on |
//! | 6891 §7 | the rate limiter's truncated answer (slip) to a query with an OPT carries one: payload and DO as above, version 0, no ECS (`wire::truncated`) |
//! | 8945 §5.2, §5.3.2 | a TSIG-signed request (no key is configured, so every key is unknown): `NOTAUTH` with an unsigned TSIG, error `BADKEY` (`Handler`'s `bad_key`) |
//! | 1035 §4.1.1 | an opcode other than QUERY: `NOTIMP`, header only (no question), id and opcode copied, no flag but QR; the OPT as above (RFC 6891 §7) |
//!
//! Pure functions; unit-tested here, and over sockets in `tests/ecs.rs`.

use std::net::IpAddr;

use hickory_proto::op::{Edns, ResponseCode};
use hickory_proto::rr::rdata::opt::{ClientSubnet, EdnsCode, EdnsOption};

/// The largest UDP payload we advertise and send, as NSD, Knot and BIND do since DNS
/// Flag Day 2020: larger answers risk IP fragmentation, and go over TCP instead.
pub const MAX_UDP_PAYLOAD: u16 = 1232;

/// Who asked, as far as steering cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Client {
    /// The address to locate: the ECS address, else the packet's source.
    pub ip: IpAddr,
    /// The query's ECS option, to echo.
    pub ecs: Option<ClientSubnet>,
}

impl Client {
    /// Whether the client sent an ECS option that asks for a tailored answer
    /// (a SOURCE of 0 means "do not use my address").
    pub fn wants_tailoring(&self) -> bool {
        self.ecs.is_some_and(|e| e.source_prefix() > 0)
    }
}

/// Reads the request's EDNS: the client to locate, or the error rcode to answer with.
pub fn client(edns: Option<&Edns>, src: IpAddr) -> Result<Client, ResponseCode> {
    let Some(edns) = edns else {
        return Ok(Client { ip: src, ecs: None });
    };
    if edns.version() > 0 {
        return Err(ResponseCode::BADVERS);
    }
    let mut ecs = None;
    for (_, option) in &edns.options().options {
        if let EdnsOption::Subnet(cs) = option {
            if ecs.is_some() {
                // Two ECS options: there is no way to tell which client is meant.
                return Err(ResponseCode::FormErr);
            }
            ecs = Some(check_subnet(cs)?);
        }
    }
    let ip = match ecs {
        Some(cs) if cs.source_prefix() > 0 => cs.addr(),
        _ => src,
    };
    Ok(Client { ip, ecs })
}

/// RFC 7871 §6 checks hickory's decoder leaves to us.
fn check_subnet(cs: &ClientSubnet) -> Result<ClientSubnet, ResponseCode> {
    if cs.scope_prefix() != 0 {
        return Err(ResponseCode::FormErr);
    }
    let p = u32::from(cs.source_prefix());
    let host_bits_clear = match cs.addr() {
        IpAddr::V4(a) => p <= 32 && u32::from(a).checked_shl(p).unwrap_or(0) == 0,
        IpAddr::V6(a) => p <= 128 && u128::from(a).checked_shl(p).unwrap_or(0) == 0,
    };
    if !host_bits_clear {
        return Err(ResponseCode::FormErr);
    }
    Ok(*cs)
}

/// RFC 7871 §6: every ECS option in `opt_rdata` (the OPT's options as received) holds
/// exactly the ADDRESS octets its SOURCE PREFIX-LENGTH needs. hickory's decoder reads
/// that many and ignores the rest, so this looks at the bytes. `None` (no OPT found
/// where hickory found an ECS option) cannot be checked: `FORMERR` too.
pub fn check_address_octets(opt_rdata: Option<&[u8]>) -> Result<(), ResponseCode> {
    let mut rest = opt_rdata.ok_or(ResponseCode::FormErr)?;
    while let [c0, c1, l0, l1, tail @ ..] = rest {
        let len = usize::from(u16::from_be_bytes([*l0, *l1]));
        let (data, after) = tail.split_at_checked(len).ok_or(ResponseCode::FormErr)?;
        if u16::from_be_bytes([*c0, *c1]) == u16::from(EdnsCode::Subnet) {
            // FAMILY (2), SOURCE (1), SCOPE (1), ADDRESS.
            let needed = data.get(2).map(|s| 4 + usize::from(*s).div_ceil(8));
            if needed != Some(data.len()) {
                return Err(ResponseCode::FormErr);
            }
        }
        rest = after;
    }
    Ok(())
}

/// The response OPT for a request that had one: our version, the payload size, DO, and
/// the ECS option echoed with `scope` (forced to 0 when the client opted out).
pub fn response(req: &Edns, ecs: Option<ClientSubnet>, scope: u8) -> Edns {
    let mut out = Edns::new();
    out.set_max_payload(req.max_payload().clamp(512, MAX_UDP_PAYLOAD));
    out.set_version(0);
    out.set_dnssec_ok(req.flags().dnssec_ok);
    if let Some(mut cs) = ecs {
        cs.set_scope_prefix(if cs.source_prefix() == 0 { 0 } else { scope });
        out.options_mut().insert(EdnsOption::Subnet(cs));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edns_with(cs: ClientSubnet) -> Edns {
        let mut e = Edns::new();
        e.options_mut().insert(EdnsOption::Subnet(cs));
        e
    }

    fn src() -> IpAddr {
        "192.0.2.7".parse().unwrap()
    }

    #[test]
    fn no_edns_locates_the_source() {
        assert_eq!(
            client(None, src()).unwrap(),
            Client {
                ip: src(),
                ecs: None
            }
        );
    }

    #[test]
    fn ecs_address_is_located() {
        let cs = ClientSubnet::new("81.2.69.0".parse().unwrap(), 24, 0);
        let c = client(Some(&edns_with(cs)), src()).unwrap();
        assert_eq!(c.ip, "81.2.69.0".parse::<IpAddr>().unwrap());
        assert!(c.wants_tailoring());
    }

    #[test]
    fn source_zero_is_an_opt_out() {
        let cs = ClientSubnet::new("0.0.0.0".parse().unwrap(), 0, 0);
        let c = client(Some(&edns_with(cs)), src()).unwrap();
        assert_eq!(c.ip, src());
        let resp = response(&edns_with(cs), c.ecs, 24);
        match resp.option(EdnsCode::Subnet) {
            Some(EdnsOption::Subnet(out)) => assert_eq!(out.scope_prefix(), 0),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_subnets_are_formerr() {
        let host_bits = ClientSubnet::new("81.2.77.0".parse().unwrap(), 22, 0);
        assert_eq!(
            client(Some(&edns_with(host_bits)), src()),
            Err(ResponseCode::FormErr)
        );
        let scope = ClientSubnet::new("81.2.69.0".parse().unwrap(), 24, 8);
        assert_eq!(
            client(Some(&edns_with(scope)), src()),
            Err(ResponseCode::FormErr)
        );
        let v6 = ClientSubnet::new("2001:db8::1".parse().unwrap(), 48, 0);
        assert_eq!(
            client(Some(&edns_with(v6)), src()),
            Err(ResponseCode::FormErr)
        );
        let mut two = edns_with(ClientSubnet::new("81.2.69.0".parse().unwrap(), 24, 0));
        two.options_mut()
            .insert(EdnsOption::Subnet(ClientSubnet::new(
                "81.2.70.0".parse().unwrap(),
                24,
                0,
            )));
        assert_eq!(client(Some(&two), src()), Err(ResponseCode::FormErr));
    }

    #[test]
    fn address_octets_must_be_exactly_what_the_source_needs() {
        let ecs = |data: &[u8]| {
            let mut o = vec![0, 8, 0, data.len() as u8];
            o.extend_from_slice(data);
            o
        };
        let ok = |o: &[u8]| check_address_octets(Some(o));
        // 81.2.69.0/24 with 3 octets; /0 with none; /25 with 4; IPv6 /56 with 7.
        assert_eq!(ok(&ecs(&[0, 1, 24, 0, 81, 2, 69])), Ok(()));
        assert_eq!(ok(&ecs(&[0, 1, 0, 0])), Ok(()));
        assert_eq!(ok(&ecs(&[0, 1, 25, 0, 81, 2, 69, 128])), Ok(()));
        assert_eq!(ok(&ecs(&[0, 2, 56, 0, 0x20, 1, 2, 0x18, 0, 0, 0])), Ok(()));
        // Other options around it are skipped.
        let mut around = vec![0xfd, 0xe9, 0, 3, 1, 2, 3];
        around.extend(ecs(&[0, 1, 24, 0, 81, 2, 69]));
        around.extend([0, 10, 0, 0]);
        assert_eq!(ok(&around), Ok(()));
        assert_eq!(ok(&[]), Ok(()));
        // One octet too many: /24 with 4, /0 with 1, IPv6 /56 with 8; and too few.
        let formerr = Err(ResponseCode::FormErr);
        assert_eq!(ok(&ecs(&[0, 1, 24, 0, 81, 2, 69, 0])), formerr);
        assert_eq!(ok(&ecs(&[0, 1, 0, 0, 0])), formerr);
        assert_eq!(
            ok(&ecs(&[0, 2, 56, 0, 0x20, 1, 2, 0x18, 0, 0, 0, 0])),
            formerr
        );
        assert_eq!(ok(&ecs(&[0, 1, 24, 0, 81, 2])), formerr);
        assert_eq!(ok(&ecs(&[0, 1])), formerr);
        // An option longer than what is left; no OPT at all.
        assert_eq!(ok(&[0, 8, 0, 9, 0, 1, 24, 0]), formerr);
        assert_eq!(check_address_octets(None), formerr);
    }

    #[test]
    fn badvers() {
        let mut e = Edns::new();
        e.set_version(1);
        assert_eq!(client(Some(&e), src()), Err(ResponseCode::BADVERS));
    }

    #[test]
    fn payload_is_clamped() {
        let mut e = Edns::new();
        e.set_max_payload(4096);
        assert_eq!(response(&e, None, 0).max_payload(), MAX_UDP_PAYLOAD);
        e.set_max_payload(700);
        assert_eq!(response(&e, None, 0).max_payload(), 700);
    }
}
