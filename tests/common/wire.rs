//! Test harness, DNS messages on the wire: queries built with hickory-proto or byte by
//! byte (headers, names, questions, OPT records, ECS options, TCP framing, for inputs
//! hickory's encoder would not produce), and the fields read back from answers.
#![allow(dead_code)]

use std::net::IpAddr;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::rdata::opt::{ClientSubnet, EdnsOption};
use hickory_proto::rr::{Name, RData, RecordType};

// === Queries built with hickory-proto ===

/// A query without EDNS.
pub fn query(name: &str, qtype: RecordType) -> Message {
    let mut m = Message::new(rand_id(), MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    m
}

/// A query with EDNS (UDP size 1232) and, optionally, an ECS option `addr/source`.
pub fn query_edns(name: &str, qtype: RecordType, ecs: Option<(&str, u8)>) -> Message {
    let mut m = query(name, qtype);
    let mut edns = Edns::new();
    edns.set_max_payload(1232);
    if let Some((addr, source)) = ecs {
        let ip: IpAddr = addr.parse().unwrap();
        edns.options_mut()
            .insert(EdnsOption::Subnet(ClientSubnet::new(ip, source, 0)));
    }
    m.set_edns(edns);
    m
}

/// [`query`] with the id `id`, encoded.
pub fn encoded(name: &str, qtype: RecordType, id: u16) -> Vec<u8> {
    let mut m = query(name, qtype);
    m.metadata.id = id;
    m.to_vec().unwrap()
}

fn rand_id() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(4242);
    NEXT.fetch_add(7, Ordering::Relaxed)
}

// === Messages byte by byte ===

/// RD set, opcode QUERY: the flags word of an ordinary query.
pub const RD: u16 = 0x0100;

/// A header: id, flags word, and the four counts (QD, AN, NS, AR).
pub fn header(id: u16, flags: u16, counts: [u16; 4]) -> Vec<u8> {
    let mut p = Vec::with_capacity(64);
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(&flags.to_be_bytes());
    for c in counts {
        p.extend_from_slice(&c.to_be_bytes());
    }
    p
}

/// A wire name, uncompressed, its labels as given (so case is kept).
pub fn name(n: &str) -> Vec<u8> {
    let mut p = Vec::new();
    for label in n.split('.').filter(|l| !l.is_empty()) {
        p.push(label.len() as u8);
        p.extend_from_slice(label.as_bytes());
    }
    p.push(0);
    p
}

/// A question: name, type, class.
pub fn question(n: &str, qtype: u16, qclass: u16) -> Vec<u8> {
    let mut p = name(n);
    p.extend_from_slice(&qtype.to_be_bytes());
    p.extend_from_slice(&qclass.to_be_bytes());
    p
}

/// `www.example.com A IN`, the question of most raw queries.
pub fn www_a() -> Vec<u8> {
    question("www.example.com", 1, 1)
}

/// A header with the given flags and counts, then `rest` as it is.
pub fn packet(id: u16, flags: u16, counts: [u16; 4], rest: &[&[u8]]) -> Vec<u8> {
    let mut p = header(id, flags, counts);
    for r in rest {
        p.extend_from_slice(r);
    }
    p
}

/// A raw query for `www.example.com A` carrying one EDNS option with raw bytes, for
/// malformed options hickory's encoder would not produce.
pub fn raw_query_with_option(id: u16, code: u16, data: &[u8]) -> Vec<u8> {
    let opt = opt_record(1232, false, &[(code, data)]);
    packet(id, RD, [1, 0, 0, 1], &[&www_a(), &opt])
}

/// An OPT record (root owner, EDNS version 0) with UDP size `payload`, the DO bit, and
/// the options `(code, data)` written raw, so that malformed ones can be sent too.
pub fn opt_record(payload: u16, dnssec_ok: bool, options: &[(u16, &[u8])]) -> Vec<u8> {
    let mut rdata = Vec::new();
    for (code, data) in options {
        rdata.extend_from_slice(&code.to_be_bytes());
        rdata.extend_from_slice(&(data.len() as u16).to_be_bytes());
        rdata.extend_from_slice(data);
    }
    let mut o = vec![0, 0, 41];
    o.extend_from_slice(&payload.to_be_bytes());
    o.extend_from_slice(&[0, 0, if dnssec_ok { 0x80 } else { 0 }, 0]);
    o.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
    o.extend_from_slice(&rdata);
    o
}

/// An ECS option (code 8): family, source prefix, scope 0, the address bytes as given.
pub fn ecs(family: u16, source: u8, address: &[u8]) -> (u16, Vec<u8>) {
    let mut d = family.to_be_bytes().to_vec();
    d.push(source);
    d.push(0);
    d.extend_from_slice(address);
    (8, d)
}

/// A message with its two-byte length before it, as DNS over TCP sends it.
pub fn framed(msg: &[u8]) -> Vec<u8> {
    let mut f = (msg.len() as u16).to_be_bytes().to_vec();
    f.extend_from_slice(msg);
    f
}

// === Answers ===

/// The id of a raw answer.
pub fn id_of(answer: &[u8]) -> u16 {
    u16::from_be_bytes([answer[0], answer[1]])
}

/// The four counts (QD, AN, NS, AR) of a raw answer.
pub fn counts_of(answer: &[u8]) -> [u16; 4] {
    let c = |i: usize| u16::from_be_bytes([answer[4 + 2 * i], answer[5 + 2 * i]]);
    [c(0), c(1), c(2), c(3)]
}

/// RCODE (low four bits) of a raw answer.
pub fn raw_rcode(answer: &[u8]) -> u8 {
    answer[3] & 0x0f
}

/// The single CNAME target of an answer.
pub fn cname_of(m: &Message) -> String {
    assert_eq!(
        m.answers.len(),
        1,
        "expected one CNAME, got {:?}",
        m.answers
    );
    match &m.answers[0].data {
        RData::CNAME(c) => c.0.to_string(),
        other => panic!("expected a CNAME, got {other:?}"),
    }
}

/// The options of an answer's OPT other than ECS, as (code, data); `None` without an
/// OPT.
pub fn other_options(m: &Message) -> Option<Vec<(u16, Vec<u8>)>> {
    let opt = m.edns.as_ref()?;
    Some(
        opt.options()
            .options
            .iter()
            .filter_map(|(_, o)| match o {
                EdnsOption::Subnet(_) => None,
                EdnsOption::Unknown(code, data) => Some((*code, data.clone())),
                other => Some((0xffff, format!("{other:?}").into_bytes())),
            })
            .collect(),
    )
}

/// The Extended DNS Error (RFC 8914) of an answer: INFO-CODE and EXTRA-TEXT; `None`
/// without one. Panics on two, or on one that is not well formed.
pub fn ede_of(m: &Message) -> Option<(u16, String)> {
    let edes: Vec<_> = other_options(m)?
        .into_iter()
        .filter(|(code, _)| *code == 15)
        .collect();
    assert!(edes.len() <= 1, "two EDE options: {edes:?}");
    let (_, data) = edes.into_iter().next()?;
    assert!(data.len() >= 2, "EDE of {} bytes", data.len());
    let text = String::from_utf8(data[2..].to_vec()).expect("EXTRA-TEXT is UTF-8");
    Some((u16::from_be_bytes([data[0], data[1]]), text))
}

/// The ECS option of an answer.
pub fn ecs_of(m: &Message) -> Option<ClientSubnet> {
    m.edns
        .as_ref()?
        .options()
        .options
        .iter()
        .find_map(|(_, o)| match o {
            EdnsOption::Subnet(cs) => Some(*cs),
            _ => None,
        })
}
