//! Input: signing. RRSIGs over RRsets for a signature window, the zone's NSEC chain
//! (which lists every steered name), and the pre-signed steered CNAMEs in wire form.
//!
//! Signatures carry the window's times, not the moment of signing: every node of a set
//! computes the same window at the same moment ([`Window::at`]), so Ed25519 signatures
//! (deterministic) are byte-identical across nodes; ECDSA's differ (each signature
//! draws a random nonce) and every one of them validates.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hickory_proto::dnssec::rdata::sig::SigInput;
use hickory_proto::dnssec::rdata::{DNSSECRData, NSEC, RRSIG};
use hickory_proto::dnssec::TBS;
use hickory_proto::rr::rdata::CNAME;
use hickory_proto::rr::{
    DNSClass, LowerName, Name, RData, Record, RecordSet, RecordType, RrKey, SerialNumber,
};
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder};

use super::keys::Key;
use super::DnssecError;
use crate::config::dnssec::DnssecSettings;

/// How far a signature's inception is set back, for clocks running behind.
pub(crate) const BACKDATE: u64 = 3600;

/// The validity of every signature made during one window of time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Unix seconds.
    pub inception: u64,
    pub expiration: u64,
    /// When the next window starts: signatures are replaced then, with `refresh` left.
    pub next: u64,
}

impl Window {
    /// The window `now` falls in: windows start every `validity − refresh` seconds
    /// (counted from the epoch, so every node agrees); a signature made in one is valid
    /// from an hour before its start until `validity` after it, so at least `refresh`
    /// remains while it is served.
    pub fn at(now: u64, s: &DnssecSettings) -> Window {
        let step = s.validity.saturating_sub(s.refresh).as_secs().max(1);
        let start = now / step * step;
        Window {
            inception: start.saturating_sub(BACKDATE),
            expiration: start + s.validity.as_secs(),
            next: start + step,
        }
    }
}

/// The RRSIG of `rrset` by `key` for window `w`.
pub(crate) fn rrsig(rrset: &RecordSet, key: &Key, w: Window) -> Result<RRSIG, DnssecError> {
    let input = SigInput {
        type_covered: rrset.record_type(),
        algorithm: key.algorithm,
        num_labels: rrset.name().num_labels(),
        original_ttl: rrset.ttl(),
        sig_expiration: SerialNumber::new(w.expiration as u32),
        sig_inception: SerialNumber::new(w.inception as u32),
        key_tag: key.tag,
        signer_name: key.zone.clone(),
    };
    let tbs = TBS::from_input(
        rrset.name(),
        DNSClass::IN,
        &input,
        rrset.records_without_rrsigs(),
    )
    .map_err(|e| DnssecError::Sign {
        what: format!("{} {}", rrset.name(), rrset.record_type()),
        error: e.to_string(),
    })?;
    let sig = key.signing().sign(&tbs).map_err(|e| DnssecError::Sign {
        what: format!("signing {} {}", rrset.name(), rrset.record_type()),
        error: e.to_string(),
    })?;
    Ok(RRSIG::from_sig(input, sig))
}

/// The RRSIGs of `owner CNAME target` (original TTL `ttl`) by each key, as the answer
/// section carries them after the owner, type, class and TTL: for each, RDLENGTH and
/// RDATA (the signer's name uncompressed, RFC 4034 §3.1.7).
pub(crate) fn cname_rrsigs(
    owner: &Name,
    target: &Name,
    ttl: u32,
    keys: &[&Key],
    w: Window,
) -> Result<Box<[u8]>, DnssecError> {
    let mut set = RecordSet::with_ttl(owner.clone(), RecordType::CNAME, ttl);
    set.add_rdata(RData::CNAME(CNAME(target.clone())));
    let mut out = Vec::new();
    for key in keys {
        let sig = rrsig(&set, key, w)?;
        let mut rdata = Vec::new();
        sig.emit(&mut BinEncoder::new(&mut rdata))
            .map_err(|e| DnssecError::Encode(e.to_string()))?;
        out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        out.extend_from_slice(&rdata);
    }
    Ok(out.into_boxed_slice())
}

/// Which keys of a zone do what at one moment (see `keys::Times`).
pub(crate) struct ZoneKeys<'k> {
    /// In the DNSKEY set.
    pub published: Vec<&'k Key>,
    /// Sign the DNSKEY set: the active ones and the retired ones not yet removed.
    pub key_signers: Vec<&'k Key>,
    /// Sign everything else; their DS is the one the parent should hold (CDS,
    /// CDNSKEY).
    pub active: Vec<&'k Key>,
}

/// The zone `origin` signed: its records, the DNSKEY set of the published keys with
/// CDS and CDNSKEY of the active ones (RFC 7344: the DS the parent should hold), an
/// NSEC chain over every name (the `steered` names among them, typed CNAME: a denial
/// never covers one), the DNSKEY set signed by every key signer and each other RRset
/// by every active key. Delegations: the NS set and the glue below it stay unsigned,
/// as RFC 4035 §2.2 wants.
pub(crate) fn sign_zone(
    origin: &Name,
    records: &BTreeMap<RrKey, RecordSet>,
    steered: &[Name],
    keys: &ZoneKeys<'_>,
    settings: &DnssecSettings,
    w: Window,
) -> Result<BTreeMap<RrKey, RecordSet>, DnssecError> {
    let mut out = records.clone();
    let apex = LowerName::new(origin);
    let ttl = settings.dnskey_ttl;
    let mut dnskeys = RecordSet::with_ttl(origin.clone(), RecordType::DNSKEY, ttl);
    for k in &keys.published {
        dnskeys.add_rdata(RData::DNSSEC(DNSSECRData::DNSKEY(k.dnskey.clone())));
    }
    out.insert(RrKey::new(apex.clone(), RecordType::DNSKEY), dnskeys);
    let mut cds = RecordSet::with_ttl(origin.clone(), RecordType::CDS, ttl);
    let mut cdnskey = RecordSet::with_ttl(origin.clone(), RecordType::CDNSKEY, ttl);
    for k in &keys.active {
        cds.add_rdata(RData::DNSSEC(DNSSECRData::CDS(k.cds()?)));
        cdnskey.add_rdata(RData::DNSSEC(DNSSECRData::CDNSKEY(k.cdnskey())));
    }
    out.insert(RrKey::new(apex.clone(), RecordType::CDS), cds);
    out.insert(RrKey::new(apex.clone(), RecordType::CDNSKEY), cdnskey);

    let soa = records
        .get(&RrKey::new(apex.clone(), RecordType::SOA))
        .and_then(|s| Some((s.ttl(), s.records_without_rrsigs().next()?)))
        .and_then(|(ttl, r)| match &r.data {
            RData::SOA(soa) => Some(ttl.min(soa.minimum)),
            _ => None,
        })
        .ok_or_else(|| DnssecError::NoSoa {
            zone: origin.clone(),
        })?;

    // Zone cuts below the apex; what lies under one belongs to the child.
    let cuts: BTreeSet<LowerName> = out
        .keys()
        .filter(|k| k.record_type == RecordType::NS && k.name != apex)
        .map(|k| k.name.clone())
        .collect();
    let under_cut = |n: &LowerName| {
        let mut up = n.base_name();
        while up.num_labels() > apex.num_labels() {
            if cuts.contains(&up) {
                return true;
            }
            up = up.base_name();
        }
        false
    };

    let mut types: BTreeMap<LowerName, BTreeSet<RecordType>> = BTreeMap::new();
    for k in out.keys().filter(|k| !under_cut(&k.name)) {
        types
            .entry(k.name.clone())
            .or_default()
            .insert(k.record_type);
    }
    for s in steered {
        let n = LowerName::new(s);
        if apex.zone_of(&n) && !under_cut(&n) {
            types.entry(n).or_default().insert(RecordType::CNAME);
        }
    }
    let names: Vec<&LowerName> = types.keys().collect();
    for (i, name) in names.iter().enumerate() {
        let next = names[(i + 1) % names.len()];
        let mut set = RecordSet::with_ttl(Name::from(*name), RecordType::NSEC, soa);
        set.add_rdata(RData::DNSSEC(DNSSECRData::NSEC(NSEC::new_cover_self(
            Name::from(next),
            types[*name].iter().copied(),
        ))));
        out.insert(RrKey::new((*name).clone(), RecordType::NSEC), set);
    }

    for (key, set) in out.iter_mut() {
        let delegation = cuts.contains(&key.name)
            && !matches!(key.record_type, RecordType::DS | RecordType::NSEC);
        if delegation || under_cut(&key.name) {
            continue;
        }
        set.clear_rrsigs();
        let signers = if key.record_type == RecordType::DNSKEY {
            &keys.key_signers
        } else {
            &keys.active
        };
        for k in signers {
            let sig = rrsig(set, k, w)?;
            let record = Record::from_rdata(
                set.name().clone(),
                set.ttl(),
                RData::DNSSEC(DNSSECRData::RRSIG(sig)),
            );
            set.insert_rrsig(record);
        }
    }
    Ok(out)
}

/// The records of a signed zone as a zone handler keeps them.
pub(crate) fn shared(records: BTreeMap<RrKey, RecordSet>) -> BTreeMap<RrKey, Arc<RecordSet>> {
    records.into_iter().map(|(k, v)| (k, Arc::new(v))).collect()
}
