//! Data plane: the full path (`Handler`, on hickory): every query the fast path hands
//! over, answered with the rcode, EDE, ECS scope and cookie it calls for.
//! (The main room of its folder; the folder's door, `mod.rs`, says what else lives there.)

use std::iter;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use hickory_proto::op::{Edns, Header, HeaderCounts, MessageType, Metadata, OpCode, ResponseCode};
use hickory_proto::rr::rdata::tsig::TsigError;
use hickory_proto::rr::rdata::{CNAME, TSIG};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{
    BinDecodable, BinDecoder, BinEncodable, BinEncoder, Restrict,
};
use hickory_server::net::runtime::{Time, TokioTime};
use hickory_server::net::xfer::Protocol;
use hickory_server::net::NetError;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::{MessageResponse, MessageResponseBuilder, Queries};
use tokio::time::Instant;

use super::edns::Ede;
use crate::metrics::Metrics;
use crate::plan::{Answer, Asker, Live, Pick, Snapshot, Steered};

/// The request handler registered with hickory's `Server`. It holds the live snapshot,
/// which the control plane replaces; each query reads one snapshot from start to end.
#[derive(Clone)]
pub struct Handler {
    pub(super) live: Arc<Live>,
    /// Answers by name, region, CDN and rcode, and how long they took.
    pub(super) metrics: Metrics,
    /// The DNS cookie secrets (`cookie.rs`), which the control plane replaces.
    pub(super) cookies: Arc<super::cookie::Jar>,
    /// `--dnstap`: where each query and its answer are copied; `None` without.
    pub(super) tap: Option<super::dnstap::Tap>,
}

impl Handler {
    /// A handler with a random cookie secret of its own (see [`Handler::with_cookies`]).
    pub fn new(live: Arc<Live>, metrics: Metrics) -> Handler {
        Handler::with_cookies(live, metrics, Arc::new(super::cookie::random_jar()))
    }

    /// A handler whose cookie secrets are `cookies`.
    pub fn with_cookies(
        live: Arc<Live>,
        metrics: Metrics,
        cookies: Arc<super::cookie::Jar>,
    ) -> Handler {
        Handler {
            live,
            metrics,
            cookies,
            tap: None,
        }
    }

    /// With a dnstap sink (`serve --dnstap`).
    pub fn with_tap(mut self, tap: Option<super::dnstap::Tap>) -> Handler {
        self.tap = tap;
        self
    }

    /// A dnstap tap of its own for a UDP thread or a TCP connection (each keeps its
    /// sampling count); `None` without `--dnstap`.
    pub fn tap(&self) -> Option<super::dnstap::Tap> {
        self.tap.clone()
    }

    pub fn live(&self) -> &Arc<Live> {
        &self.live
    }

    /// The cookie secrets the handler reads.
    pub fn cookies(&self) -> &Arc<super::cookie::Jar> {
        &self.cookies
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Counts a steered answer: one atomic add in the plan (the metrics read it there).
    pub fn count_steered(&self, s: &Steer<'_>) {
        s.pick.count();
    }

    /// The full path: one DNS message in, the response's bytes out (`None`: no answer).
    /// Decodes with hickory as its server does: fewer than 12 bytes and responses
    /// (QR=1) get nothing; a header followed by an undecodable body gets `FORMERR`
    /// (header only, flags as in [`reply_metadata`]).
    /// Over UDP the response fits the client's payload size (else 512), truncated with
    /// TC as hickory does.
    pub async fn respond(
        &self,
        packet: &[u8],
        src: SocketAddr,
        protocol: Protocol,
    ) -> Option<Vec<u8>> {
        self.respond_decided(packet, src, protocol)
            .await
            .map(|(bytes, _)| bytes)
    }

    /// As [`Handler::respond`], with the steering decision of a steered answer (for
    /// dnstap).
    pub async fn respond_decided(
        &self,
        packet: &[u8],
        src: SocketAddr,
        protocol: Protocol,
    ) -> Option<(Vec<u8>, Option<super::dnstap::Decided<Arc<str>>>)> {
        if packet.len() < 12 || packet[2] & 0x80 != 0 {
            return None;
        }
        let capture = Capture {
            protocol,
            out: Arc::default(),
        };
        let mut decided = None;
        match Request::from_bytes(packet.to_vec(), src, protocol) {
            Ok(request) => {
                decided = self
                    .handle_decided::<_, TokioTime>(&request, capture.clone())
                    .await
                    .1;
            }
            Err(_) => {
                let header = Header::read(&mut BinDecoder::new(packet)).ok()?;
                let none = Queries::read(&mut BinDecoder::new(&[]), 0).ok()?;
                let message = MessageResponseBuilder::new(&none, None)
                    .build_no_records(reply_metadata(&header.metadata, ResponseCode::FormErr));
                let _ = message_send(capture.clone(), message).await;
                self.metrics.answered(ResponseCode::FormErr.into());
            }
        }
        let mut out = capture.out.lock().unwrap_or_else(|p| p.into_inner());
        out.take().map(|bytes| (bytes, decided))
    }

    /// [`RequestHandler::handle_request`], with the decision of a steered answer.
    pub(super) async fn handle_decided<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        response: R,
    ) -> (ResponseInfo, Option<super::dnstap::Decided<Arc<str>>>) {
        let started = Instant::now();
        let snap = self.live.load_full();
        let secrets = self.cookies.load();
        let (info, steered) = answer::<R, T>(&snap, &secrets, request, response).await;
        let mut decided = None;
        match steered {
            // A steered answer that could not be sent counts as what hickory was told.
            Some(s) if info.response_code == ResponseCode::NoError => {
                self.count_steered(&s);
                if self.tap.is_some() {
                    let d = s.decided();
                    decided = Some(super::dnstap::Decided {
                        rule: s.steered.why(s.pick.choice).clone(),
                        cdn: s.steered.target(s.pick.target).cdn.clone(),
                        ecs: d.ecs,
                        scope: d.scope,
                        remarkable: d.remarkable,
                    });
                }
            }
            _ => self.metrics.answered(info.response_code.into()),
        }
        self.metrics.observe(started.elapsed());
        (info, decided)
    }
}

/// Keeps the response's bytes, encoded as hickory's `ResponseHandle` does.
#[derive(Clone)]
pub(super) struct Capture {
    pub(super) protocol: Protocol,
    pub(super) out: Arc<Mutex<Option<Vec<u8>>>>,
}

#[async_trait::async_trait]
impl ResponseHandler for Capture {
    async fn send_response<'a>(
        &mut self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> Result<ResponseInfo, NetError> {
        let id = response.metadata().id;
        let mut bytes = Vec::with_capacity(512);
        let mut encoder = BinEncoder::new(&mut bytes);
        encoder.set_max_size(match self.protocol {
            // RFC 1035 §4.2.1: 512 bytes without EDNS.
            Protocol::Udp => response.edns().map_or(512, |e| e.max_payload()),
            _ => u16::MAX,
        });
        let info = match response.destructive_emit(&mut encoder) {
            Ok(info) => info,
            Err(e) => {
                // What hickory does when a response cannot be encoded: a bare SERVFAIL.
                tracing::error!(error = %e, "cannot encode a response; SERVFAIL instead");
                bytes.clear();
                let mut metadata = Metadata::new(id, MessageType::Response, OpCode::Query);
                metadata.response_code = ResponseCode::ServFail;
                let header = Header {
                    metadata,
                    counts: HeaderCounts::default(),
                };
                header.emit(&mut BinEncoder::new(&mut bytes))?;
                ResponseInfo::from(header)
            }
        };
        *self.out.lock().unwrap_or_else(|p| p.into_inner()) = Some(bytes);
        Ok(info)
    }
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    /// Answers one query, then counts the answer (steered ones by name, region and CDN,
    /// the others by rcode) and times it.
    ///
    /// # Hot path
    /// Counting a steered answer is one relaxed atomic add in the plan's choice (the
    /// metrics read the counts at scrape time); other answers count by rcode.
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        response: R,
    ) -> ResponseInfo {
        self.handle_decided::<R, T>(request, response).await.0
    }
}

/// Which steered answer was given, for the metrics and dnstap.
pub struct Steer<'s> {
    pub pick: Pick<'s>,
    pub steered: Steered<'s>,
    /// The ECS source prefix of the query (`None`: no ECS) and the scope echoed.
    pub ecs: Option<u8>,
    pub scope: u8,
}

impl<'s> Steer<'s> {
    /// Whether dnstap always writes this answer: not by the configured weights
    /// (failover, drain, fail-open). The fast path's answers are otherwise plain
    /// NOERROR.
    pub fn remarkable(&self) -> bool {
        self.pick.choice.reason != crate::plan::Reason::Normal
    }

    /// The decision, as dnstap writes it.
    pub fn decided(&self) -> super::dnstap::Decided<&'s str> {
        super::dnstap::Decided {
            rule: self.steered.why(self.pick.choice),
            cdn: &self.steered.target(self.pick.target).cdn,
            ecs: self.ecs,
            scope: self.scope,
            remarkable: self.remarkable(),
        }
    }
}

/// The query pipeline.
///
/// # Hot path
/// One geo lookup, table lookups, one pick; allocations are the response OPT
/// and the answer record (the target name is inline for names up to 32 bytes).
pub(super) async fn answer<'s, R: ResponseHandler, T: Time>(
    snap: &'s Snapshot,
    secrets: &super::cookie::Secrets,
    request: &Request,
    response: R,
) -> (ResponseInfo, Option<Steer<'s>>) {
    // RFC 7873: the COOKIE option judged over the bytes as received, as the fast path's
    // callers do (`super::wire::cookie_of`); every answer with an OPT carries the reply.
    let now = crate::clock::now_secs();
    let cookie = super::wire::cookie_of(request.as_slice(), secrets, request.src().ip(), now);
    let reply = cookie.reply();
    // The OPT of an error answer given before the client is known: no ECS option.
    let bare = |echo| {
        request
            .edns
            .as_ref()
            .map(|e| super::edns::response(e, None, 0, echo))
    };
    // hickory echoes the question as the bytes it received, compression pointers
    // included; a pointer (into the header, say) would then point into *our* answer and
    // make it undecodable. No resolver compresses a lone question: FORMERR, without it.
    if compressed_question(request.queries.as_bytes(), request.queries.len()) {
        let why = (ResponseCode::FormErr, Some(Ede::QUESTION));
        let info = error_answer(request, why, false, bare(reply), response);
        return (info.await, None);
    }
    // RFC 6891 §7: with no OPT in the query there is none in the response.
    // RFC 7871 §6: hickory reads the address octets the source prefix needs and ignores
    // any more, so the ECS option is judged over its bytes as received.
    let options = || super::wire::find_opt(request.as_slice()).map(|o| o.rdata);
    let client = match super::edns::client(request.edns.as_ref(), request.src().ip(), options) {
        Ok(c) => c,
        Err(rcode) => {
            let why = (rcode, (rcode == ResponseCode::FormErr).then_some(Ede::ECS));
            let info = error_answer(request, why, true, bare(reply), response);
            return (info.await, None);
        }
    };
    // RFC 7873 §5.2.2: a malformed COOKIE option is FORMERR (and there is no client
    // cookie to answer with).
    if cookie == super::cookie::Cookie::Malformed {
        let why = (ResponseCode::FormErr, Some(Ede::COOKIE));
        let info = error_answer(request, why, true, bare(None), response);
        return (info.await, None);
    }
    // Answers that do not depend on the client carry ECS scope 0.
    let untailored = request
        .edns
        .as_ref()
        .map(|e| super::edns::response(e, client.ecs, 0, reply));

    // RFC 8945 §5.2: a TSIG under a key the server does not know gets NOTAUTH with
    // TSIG error BADKEY; steerdns is configured with no key at all.
    if let Some(tsig) = tsig_of(request) {
        let (rcode, tsig) = match tsig {
            Ok((key, tsig)) => (ResponseCode::NotAuth, Some(bad_key(key, tsig))),
            Err(rcode) => (rcode, None),
        };
        let info = reply_with(request, rcode, true, untailored.as_ref(), tsig, response);
        return (info.await, None);
    }
    // An error answer says why (RFC 8914) when the query has an OPT.
    if request.metadata.op_code != OpCode::Query
        || request.metadata.message_type != MessageType::Query
    {
        let why = (ResponseCode::NotImp, Some(Ede::OPCODE));
        let info = error_answer(request, why, true, untailored, response);
        return (info.await, None);
    }
    let [query] = request.queries.queries() else {
        let why = (ResponseCode::FormErr, Some(Ede::QUESTION));
        let info = error_answer(request, why, true, untailored, response);
        return (info.await, None);
    };

    // Only the Internet class is served, and zone transfers are not offered.
    let unserved = if matches!(query.query_type(), RecordType::AXFR | RecordType::IXFR) {
        Some(Ede::TRANSFER)
    } else {
        (query.query_class() != DNSClass::IN).then_some(Ede::CLASS)
    };
    if let Some(ede) = unserved {
        let why = (ResponseCode::Refused, Some(ede));
        let info = error_answer(request, why, true, untailored, response);
        return (info.await, None);
    }
    let asker = Asker::new(
        request.src().ip(),
        client.ecs.map(|e| (client.ip, e.source_prefix())),
    );
    // During a staged rollout, the plan of the asker's cohort; a name the other
    // version steers and this one does not answer is counted against this cohort.
    let route = snap.route(&asker);
    let steered = route.plan.get(query.name());
    let Some(steered) = steered else {
        let lost = route.other.is_some_and(|o| o.get(query.name()).is_some());
        // DO=1 for a name missing from a signed zone: the whole denial (both NSEC
        // proofs), which hickory's handler gives only in part (`zones/denial.rs`).
        let dnssec_ok = request.edns.as_ref().is_some_and(|e| e.flags().dnssec_ok);
        let denial = snap.denials.as_ref().filter(|_| dnssec_ok);
        if let Some(authority) = denial.and_then(|d| d.nxdomain(query.name())) {
            let mut metadata = reply_metadata(&request.metadata, ResponseCode::NXDomain);
            metadata.authoritative = true;
            let message = MessageResponseBuilder::new(&request.queries, untailored.as_ref()).build(
                metadata,
                iter::empty(),
                authority.iter(),
                iter::empty(),
                iter::empty(),
            );
            let info = send(request, message_send(response, message).await);
            if lost {
                route.count(true);
            }
            return (info, None);
        }
        // Outside every zone: hickory's catalog answers REFUSED; say why.
        let opt = match snap.zones.find(query.name()) {
            None => untailored.map(|opt| super::edns::with_ede(opt, Ede::NOT_OURS)),
            Some(_) => untailored,
        };
        let info = snap
            .zones
            .lookup(request, opt.as_ref(), T::current_time(), response)
            .await;
        if lost {
            route.count(info.response_code != ResponseCode::NoError);
        }
        return (info, None);
    };

    let Answer { pick, scope, .. } = steered.answer(&snap.geo, &asker, now, &mut rand::rng());
    let scope = route.scope(scope);
    let opt = request
        .edns
        .as_ref()
        .map(|e| super::edns::response(e, client.ecs, scope, reply));
    // The owner is the query name as asked, so its case is preserved (RFC 4343).
    let record = Record::from_rdata(
        query.original().name().clone(),
        steered.ttl(),
        RData::CNAME(CNAME(steered.target(pick.target).cname.clone())),
    );
    // DO=1: the pre-signed RRSIGs, decoded from the bytes the fast path copies.
    let dnssec_ok = request.edns.as_ref().is_some_and(|e| e.flags().dnssec_ok);
    let rrsigs = if dnssec_ok {
        rrsig_records(
            query.original().name(),
            steered.ttl(),
            steered.rrsigs(pick.target),
        )
    } else {
        Vec::new()
    };
    let mut metadata = Metadata::response_from_request(&request.metadata);
    metadata.authoritative = true;
    let message = MessageResponseBuilder::new(&request.queries, opt.as_ref()).build(
        metadata,
        iter::once(&record).chain(&rrsigs),
        iter::empty(),
        iter::empty(),
        iter::empty(),
    );
    let info = send(request, message_send(response, message).await);
    route.count(info.response_code != ResponseCode::NoError);
    let ecs = client.ecs.map(|e| e.source_prefix());
    let steer = Steer {
        pick,
        steered,
        ecs,
        scope,
    };
    (info, Some(steer))
}

/// The RRSIG records of a pre-signed run (`Plan::set_rrsigs`), owned by `owner`.
pub(super) fn rrsig_records(owner: &Name, ttl: u32, mut run: &[u8]) -> Vec<Record> {
    let mut out = Vec::new();
    while let Some((len, rdata)) = super::wire::next_rrsig(run) {
        let mut decoder = BinDecoder::new(rdata);
        let Ok(data) = RData::read(&mut decoder, RecordType::RRSIG, Restrict::new(len as u16))
        else {
            break;
        };
        out.push(Record::from_rdata(owner.clone(), ttl, data));
        run = &run[2 + len..];
    }
    out
}

/// An error answer: [`reply_with`] with no TSIG, `why` its RCODE and, when given, the
/// EDE (RFC 8914) its OPT says it with (`opt`: the response's OPT, when the query has one).
pub(super) async fn error_answer<R: ResponseHandler>(
    request: &Request,
    why: (ResponseCode, Option<Ede>),
    echo_question: bool,
    opt: Option<Edns>,
    response: R,
) -> ResponseInfo {
    let (rcode, ede) = why;
    let opt = match ede {
        Some(ede) => opt.map(|opt| super::edns::with_ede(opt, ede)),
        None => opt,
    };
    reply_with(request, rcode, echo_question, opt.as_ref(), None, response).await
}

/// A response without records: the header of [`reply_metadata`], the question as received
/// when `echo_question` and the opcode is QUERY (none otherwise: a question belongs to
/// a QUERY, and BIND answers other opcodes header only), then `opt`, then `tsig`.
pub(super) async fn reply_with<R: ResponseHandler>(
    request: &Request,
    rcode: ResponseCode,
    echo_question: bool,
    opt: Option<&Edns>,
    tsig: Option<Box<Record<TSIG>>>,
    response: R,
) -> ResponseInfo {
    let none;
    let queries = if echo_question && request.metadata.op_code == OpCode::Query {
        &request.queries
    } else {
        match Queries::read(&mut BinDecoder::new(&[]), 0) {
            Ok(q) => {
                none = q;
                &none
            }
            // Reading no question from no bytes cannot fail; answer nothing if it does.
            Err(_) => return send(request, Err(NetError::from("no empty Queries"))),
        }
    };
    let metadata = reply_metadata(&request.metadata, rcode);
    let mut message = MessageResponseBuilder::new(queries, opt).build_no_records(metadata);
    if let Some(tsig) = tsig {
        message.set_signature(tsig);
    }
    send(request, message_send(response, message).await)
}

/// The header of a response that is not an answer: QR, the id and the opcode copied
/// (RFC 1035 §4.1.1), and for a QUERY, RD and CD copied too. To any other opcode only
/// QR is set, whatever flags the request carried: RD, CD, AD and the others are only
/// defined for QUERY (BIND's answer; ISC genreport's `opcode` and `opcodeflg` checks).
pub(super) fn reply_metadata(request: &Metadata, rcode: ResponseCode) -> Metadata {
    let mut metadata = Metadata::response_from_request(request);
    if request.op_code != OpCode::Query {
        metadata.recursion_desired = false;
        metadata.checking_disabled = false;
    }
    metadata.response_code = rcode;
    metadata
}

/// The request's TSIG record (key name and RDATA); `None` without one, `FORMERR` when it
/// is not the only TSIG or not the message's last record (RFC 8945 §5.1). hickory keeps
/// it apart (`signature`) when built with DNSSEC support, and among the additional
/// records (where it checks neither) without.
pub(super) fn tsig_of(request: &Request) -> Option<Result<(&Name, &TSIG), ResponseCode>> {
    let apart = request.signature.iter().map(|s| (&s.name, &s.data));
    let among = request.additionals.iter().filter_map(|r| match &r.data {
        RData::TSIG(t) => Some((&r.name, t)),
        _ => None,
    });
    let mut found = apart.chain(among);
    let first = found.next()?;
    if found.next().is_some() || !super::wire::ends_with_tsig(request.as_slice()) {
        return Some(Err(ResponseCode::FormErr));
    }
    Some(Ok(first))
}

/// The TSIG of the answer to a request signed with a key we do not know (RFC 8945
/// §5.2): key name, algorithm, time signed, fudge and original id copied from the
/// request's, error BADKEY, and unsigned (§5.3.2: MAC size 0, other len 0).
pub(super) fn bad_key(key: &Name, request: &TSIG) -> Box<Record<TSIG>> {
    let tsig = TSIG::new(
        request.algorithm.clone(),
        request.time,
        request.fudge,
        Vec::new(),
        request.oid,
        Some(TsigError::BadKey),
        Vec::new(),
    );
    // RFC 8945 §4.2: class ANY, TTL 0.
    let mut record = Record::from_rdata(key.clone(), 0, tsig);
    record.dns_class = DNSClass::ANY;
    Box::new(record)
}

/// Whether a name in the raw question section ends in a compression pointer (found by
/// the `request` fuzz target: the echoed pointer made our answers undecodable).
pub(super) fn compressed_question(raw: &[u8], count: usize) -> bool {
    let mut i = 0;
    for _ in 0..count {
        loop {
            match raw.get(i) {
                None => return false,
                Some(0) => break,
                Some(len) if len & 0xc0 != 0 => return true,
                Some(len) => i += 1 + usize::from(*len),
            }
        }
        i += 1 + 4; // the root label, type and class
    }
    false
}

pub(super) type Sent = Result<ResponseInfo, hickory_server::net::NetError>;

pub(super) async fn message_send<'a, R: ResponseHandler>(
    mut response: R,
    message: hickory_server::zone_handler::MessageResponse<
        '_,
        'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
    >,
) -> Sent {
    response.send_response(message).await
}

/// A failed send (the client went away, the socket queue is full) is not ours to log
/// per packet; it is reported to hickory as SERVFAIL.
pub(super) fn send(request: &Request, sent: Sent) -> ResponseInfo {
    sent.unwrap_or_else(|_| {
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.response_code = ResponseCode::ServFail;
        Header {
            metadata,
            counts: HeaderCounts::default(),
        }
        .into()
    })
}
