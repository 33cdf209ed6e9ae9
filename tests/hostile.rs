//! Malformed and abusive packets over real sockets (issue 6, item 2). After every hostile
//! input the server must still answer a normal query with its CNAME, over UDP and TCP.
//!
//! Several reactions are decided before the handler runs (`Handler::respond`, which
//! decodes with hickory-proto):
//!
//! | input | who decides | reaction |
//! |---|---|---|
//! | fewer than 12 bytes | `respond` | dropped, no answer |
//! | QR=1, well-formed or not | `respond` | dropped, no answer (anti-reflection) |
//! | UDP datagram over 4,096 bytes | `dns::udp` | dropped, counted |
//! | header parses, body does not (truncated question or record, pointer loop, two OPT, OPT outside the additional section, QDCOUNT larger than the questions present) | `respond` (hickory's `Request::from_bytes` fails) | `FORMERR`, no OPT, no question |
//! | opcode other than QUERY | our handler | `NOTIMP`, header only: id and opcode copied, no flag but QR, no question, an OPT only if the query had one |
//! | QDCOUNT 0 or 2 (both present) | our handler | `FORMERR` |
//! | a compressed question (e.g. a pointer into the header) | our handler | `FORMERR`, no question (hickory would echo the pointer) |
//! | class other than IN | our handler | `REFUSED` |
//! | oversized unknown EDNS option | our handler | ignored, normal answer, not echoed |
//!
//! Every malformed ECS form is covered in `tests/ecs.rs`
//! (`malformed_client_subnets_get_formerr`), not repeated here.

mod common;

use std::time::Duration;

use common::*;
use hickory_proto::rr::RecordType;
use steerdns::app::DnsOptions;
use steerdns::dns::tcp::TcpLimits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

// ---------------------------------------------------------------------------------------
// Raw packet building (headers, names, questions, whole packets: `common::wire`).

/// An OPT record (root owner) with UDP size 1232 and the given options.
fn opt(options: &[(u16, &[u8])]) -> Vec<u8> {
    opt_record(1232, false, options)
}

// ---------------------------------------------------------------------------------------
// Sending.

const SILENCE: Duration = Duration::from_millis(300);

/// The answer to `bytes`, which must come.
async fn answer(srv: &TestServer, proto: Proto, bytes: &[u8], what: &str) -> Vec<u8> {
    raw(srv.addr, proto, bytes)
        .await
        .unwrap_or_else(|| panic!("{what}: no answer over {proto:?}"))
}

/// Asserts that `bytes` gets no answer.
async fn silence(srv: &TestServer, proto: Proto, bytes: &[u8], what: &str) {
    let got = raw_within(srv.addr, proto, bytes, SILENCE).await;
    assert!(got.is_none(), "{what} over {proto:?} was answered: {got:?}");
}

/// A normal query still gets its CNAME, over both transports.
async fn still_answers(srv: &TestServer, after: &str) {
    for proto in BOTH {
        let m = srv
            .ask(proto, &query("www.example.com.", RecordType::A))
            .await;
        let target = cname_of(&m);
        assert!(
            target == FASTLY || target == CLOUDFLARE,
            "after {after}, over {proto:?}: {target}"
        );
    }
}

/// Asserts a FORMERR answer to `id`.
fn assert_formerr(a: &[u8], id: u16, what: &str) {
    assert_eq!(id_of(a), id, "{what}: id");
    assert_eq!(a[2] & 0x80, 0x80, "{what}: QR must be set");
    assert_eq!(
        raw_rcode(a),
        1,
        "{what}: FORMERR expected, got {}",
        raw_rcode(a)
    );
}

/// Asserts the FORMERR of an undecodable body: no question, no OPT, nothing else.
fn assert_bare_formerr(a: &[u8], id: u16, what: &str) {
    assert_formerr(a, id, what);
    assert_eq!(counts_of(a), [0; 4], "{what}: no question, no OPT");
    assert_eq!(a.len(), 12, "{what}: a header alone");
}

// ---------------------------------------------------------------------------------------
// The cases.

#[tokio::test]
async fn headers_shorter_than_twelve_bytes_are_dropped() {
    let srv = TestServer::demo().await;
    let full = packet(0x1111, RD, [1, 0, 0, 0], &[&www_a()]);
    for proto in BOTH {
        for len in [1, 2, 5, 11] {
            silence(&srv, proto, &full[..len], &format!("{len}-byte header")).await;
        }
    }
    // A zero-length TCP frame is a message of zero bytes.
    silence(&srv, Proto::Tcp, &[], "empty TCP frame").await;
    still_answers(&srv, "short headers").await;
}

#[tokio::test]
async fn truncated_questions_and_records_get_formerr() {
    let srv = TestServer::demo().await;
    let q = www_a();
    let with_opt = [q.clone(), opt(&[])].concat();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "name cut in a label",
            packet(1, RD, [1, 0, 0, 0], &[&q[..6]]),
        ),
        (
            "name without its root label",
            packet(2, RD, [1, 0, 0, 0], &[&q[..16]]),
        ),
        (
            "no type and class",
            packet(3, RD, [1, 0, 0, 0], &[&q[..17]]),
        ),
        (
            "class cut in half",
            packet(4, RD, [1, 0, 0, 0], &[&q[..q.len() - 1]]),
        ),
        (
            "QDCOUNT 2, one question",
            packet(5, RD, [1 + 1, 0, 0, 0], &[&q]),
        ),
        ("ARCOUNT 1, no record", packet(6, RD, [1, 0, 0, 1], &[&q])),
        (
            "OPT cut in its rdata",
            packet(
                7,
                RD,
                [1, 0, 0, 1],
                &[&[q.clone(), opt(&[(65001, b"abcdef")])].concat()[..q.len() + 14]],
            ),
        ),
        (
            "OPT rdlength past the end",
            packet(
                8,
                RD,
                [1, 0, 0, 1],
                &[&with_opt[..with_opt.len() - 2], &[0, 40]],
            ),
        ),
        (
            "label length 64 (a reserved label type)",
            packet(9, RD, [1, 0, 0, 0], &[&[64], &[b'a'; 64], &[0, 0, 1, 0, 1]]),
        ),
    ];
    for proto in BOTH {
        for (what, bytes) in &cases {
            let a = answer(&srv, proto, bytes, what).await;
            assert_bare_formerr(&a, id_of(bytes), what);
        }
    }
    still_answers(&srv, "truncated questions").await;
}

#[tokio::test]
async fn compression_pointer_loops_get_formerr() {
    let srv = TestServer::demo().await;
    let tail = [0u8, 1, 0, 1];
    let cases: Vec<(&str, Vec<u8>)> = vec![
        // The question name starts at offset 12.
        (
            "pointer to itself",
            packet(1, RD, [1, 0, 0, 0], &[&[0xc0, 12], &tail]),
        ),
        (
            "two pointers to each other",
            packet(2, RD, [1, 0, 0, 0], &[&[0xc0, 14, 0xc0, 12], &tail]),
        ),
        (
            "a label, then a pointer back to it",
            packet(
                3,
                RD,
                [1, 0, 0, 0],
                &[&[3, b'w', b'w', b'w', 0xc0, 12], &tail],
            ),
        ),
        (
            "forward pointer past the end",
            packet(4, RD, [1, 0, 0, 0], &[&[0xc0, 0xff], &tail]),
        ),
    ];
    for proto in BOTH {
        for (what, bytes) in &cases {
            let a = answer(&srv, proto, bytes, what).await;
            assert_bare_formerr(&a, id_of(bytes), what);
        }
        // A pointer into the header points backwards, so hickory decodes it (here as
        // the name `\000.`), and it used to echo the pointer in the question of its
        // REFUSED, where it pointed into our own header: an answer no client could
        // decode (found by the `request` fuzz target). Our handler now answers FORMERR
        // without a question to any compressed question (no resolver compresses it).
        for (id, name) in [
            (5u16, vec![0xc0, 2]),
            (6, vec![3, b'w', b'w', b'w', 0xc0, 2]),
        ] {
            let bytes = packet(id, RD, [1, 0, 0, 0], &[&name, &tail]);
            let a = answer(&srv, proto, &bytes, "pointer into the header").await;
            assert_formerr(&a, id, "pointer into the header");
            let m = hickory_proto::op::Message::from_vec(&a).expect("the answer decodes");
            assert!(m.queries.is_empty());
            // With an OPT, the FORMERR carries one, which says why (RFC 8914, EDE 0).
            let bytes = packet(id, RD, [1, 0, 0, 1], &[&name, &tail, &opt(&[])]);
            let a = answer(&srv, proto, &bytes, "pointer into the header, OPT").await;
            let m = hickory_proto::op::Message::from_vec(&a).expect("the answer decodes");
            assert_eq!(
                m.metadata.response_code,
                hickory_proto::op::ResponseCode::FormErr
            );
            assert!(m.edns.is_some());
            let (code, text) = ede_of(&m).expect("an EDE");
            assert_eq!(code, 0);
            assert!(text.contains("question"), "{text}");
        }
    }
    still_answers(&srv, "pointer loops").await;
}

#[tokio::test]
async fn a_question_count_other_than_one_gets_formerr() {
    let srv = TestServer::demo().await;
    let q = www_a();
    let two = [q.clone(), question("example.com", 6, 1)].concat();
    for proto in BOTH {
        let a = answer(&srv, proto, &packet(10, RD, [0, 0, 0, 0], &[]), "QDCOUNT 0").await;
        assert_formerr(&a, 10, "QDCOUNT 0");
        let a = answer(
            &srv,
            proto,
            &packet(11, RD, [2, 0, 0, 0], &[&two]),
            "QDCOUNT 2",
        )
        .await;
        assert_formerr(&a, 11, "QDCOUNT 2");
        assert_eq!(counts_of(&a)[1], 0, "no answers to QDCOUNT 2");
        // With an OPT, the FORMERR from our handler carries one back (RFC 6891 §7).
        let a = answer(
            &srv,
            proto,
            &packet(12, RD, [0, 0, 0, 1], &[&opt(&[])]),
            "QDCOUNT 0 with OPT",
        )
        .await;
        assert_formerr(&a, 12, "QDCOUNT 0 with OPT");
        assert_eq!(counts_of(&a)[3], 1, "OPT in the FORMERR");
    }
    still_answers(&srv, "QDCOUNT != 1").await;
}

#[tokio::test]
async fn responses_sent_to_the_server_are_dropped() {
    let srv = TestServer::demo().await;
    let qr = 0x8000 | 0x0400 | RD; // QR, AA, RD
    let a_record = [
        vec![0xc0, 12], // owner: the question name
        vec![0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 192, 0, 2, 1],
    ]
    .concat();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "a well-formed response",
            packet(20, qr, [1, 1, 0, 0], &[&www_a(), &a_record]),
        ),
        (
            "a response without question",
            packet(21, qr, [0, 0, 0, 0], &[]),
        ),
        (
            "a NOTIFY response",
            packet(22, qr | (4 << 11), [1, 0, 0, 0], &[&www_a()]),
        ),
        (
            "a response with an OPT",
            packet(23, qr, [1, 0, 0, 1], &[&www_a(), &opt(&[])]),
        ),
    ];
    for proto in BOTH {
        for (what, bytes) in &cases {
            silence(&srv, proto, bytes, what).await;
        }
    }
    still_answers(&srv, "responses").await;
}

/// A *malformed* message with QR=1 is not answered either: a response is never answered,
/// whatever it holds (hickory's own server decoded first and sent FORMERR).
#[tokio::test]
async fn malformed_responses_get_no_answer() {
    let srv = TestServer::demo().await;
    let bytes = packet(24, 0x8000, [1, 0, 0, 0], &[&[0xc0, 12, 0, 1, 0, 1]]);
    for proto in BOTH {
        silence(&srv, proto, &bytes, "malformed response").await;
    }
    still_answers(&srv, "malformed responses").await;
}

/// Every header flag a query can carry: AA, TC, RD, RA, Z, AD and CD.
const EVERY_FLAG: u16 = 0x0400 | 0x0200 | RD | 0x0080 | 0x0040 | 0x0020 | 0x0010;

/// The NOTIMP answer to a request with opcode `op` and id `id`: QR, the opcode and
/// NOTIMP, nothing else set; no question, no records; `opt` as the only record if given.
fn bare_notimp(id: u16, op: u16, opt: Option<&[u8]>) -> Vec<u8> {
    let mut a = header(
        id,
        0x8000 | (op << 11) | 4,
        [0, 0, 0, u16::from(opt.is_some())],
    );
    a.extend_from_slice(opt.unwrap_or_default());
    a
}

#[tokio::test]
async fn opcode_15_with_every_flag_set_gets_a_header_only_notimp() {
    // ISC genreport's `opcodeflg`: `dig +noedns +header-only +opcode=15 +tcflag +rec
    // +raflag +cd +ad +aaflag +zflag`. BIND answers 12 bytes: NOTIMP, opcode 15, QR and
    // no other flag (RD and CD belong to a QUERY), no question.
    let srv = TestServer::demo().await;
    let bytes = header(0x0f0f, (15 << 11) | EVERY_FLAG, [0, 0, 0, 0]);
    for proto in BOTH {
        let a = answer(&srv, proto, &bytes, "opcodeflg").await;
        assert_eq!(
            a,
            bare_notimp(0x0f0f, 15, None),
            "opcodeflg over {proto:?}: {a:02x?}"
        );
    }
    still_answers(&srv, "opcodeflg").await;
}

#[tokio::test]
async fn opcodes_other_than_query_get_notimp() {
    // Every opcode but QUERY, with a question or header only, every flag or only RD,
    // with and without EDNS: the same bare NOTIMP over UDP (which the fast path and the
    // answer cache leave to the full path) and TCP. With an OPT in the query the answer
    // has one (RFC 6891 §7): our version 0, the payload size, nothing echoed, and the
    // Extended DNS Error 21 (Not Supported, RFC 8914).
    let srv = TestServer::demo().await;
    // The query's OPT: root, UDP size 1232, version 0, no flags, no options; ours the
    // same with the EDE.
    let edns_opt = opt(&[]);
    let mut ede = vec![0, 21];
    ede.extend_from_slice(b"only opcode QUERY is served");
    let answer_opt = opt(&[(15, &ede)]);
    for proto in BOTH {
        for op in 1u16..16 {
            for (flags, question, edns) in [
                (RD, true, false),
                (EVERY_FLAG, true, false),
                (EVERY_FLAG, false, false),
                (EVERY_FLAG, true, true),
                (RD, false, true),
            ] {
                let id = 30 + op;
                let q: &[u8] = if question { &www_a() } else { &[] };
                let o: &[u8] = if edns { &edns_opt } else { &[] };
                let counts = [u16::from(question), 0, 0, u16::from(edns)];
                let bytes = packet(id, flags | (op << 11), counts, &[q, o]);
                let what =
                    format!("opcode {op}, flags {flags:#06x}, question {question}, EDNS {edns}");
                let a = answer(&srv, proto, &bytes, &what).await;
                let want = bare_notimp(id, op, edns.then_some(answer_opt.as_slice()));
                assert_eq!(a, want, "{what} over {proto:?}");
            }
        }
    }
    still_answers(&srv, "unknown opcodes").await;
}

#[tokio::test]
async fn classes_other_than_in_are_refused() {
    let srv = TestServer::demo().await;
    // CH, HS, NONE, ANY and unassigned ones.
    for proto in BOTH {
        for class in [3u16, 4, 254, 255, 2, 1234, 65280, 65535] {
            let id = 50 + class % 100;
            let bytes = packet(
                id,
                RD,
                [1, 0, 0, 0],
                &[&question("www.example.com", 1, class)],
            );
            let a = answer(&srv, proto, &bytes, &format!("class {class}")).await;
            assert_eq!(id_of(&a), id);
            assert_eq!(
                raw_rcode(&a),
                5,
                "class {class} over {proto:?}: REFUSED expected"
            );
            assert_eq!(counts_of(&a)[1], 0);
        }
    }
    still_answers(&srv, "unknown classes").await;
}

#[tokio::test]
async fn two_opt_records_get_formerr() {
    // RFC 6891 §6.1.1: "If a query message with more than one OPT RR is received, a
    // FORMERR (RCODE=1) MUST be returned." hickory's decoder refuses the message
    // (`DecodeError::DuplicateEdns`), so the FORMERR comes from hickory, without an OPT.
    let srv = TestServer::demo().await;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "two identical OPTs",
            packet(60, RD, [1, 0, 0, 2], &[&www_a(), &opt(&[]), &opt(&[])]),
        ),
        (
            "two OPTs, one with ECS",
            packet(
                61,
                RD,
                [1, 0, 0, 2],
                &[&www_a(), &opt(&[(8, &[0, 1, 24, 0, 81, 2, 69])]), &opt(&[])],
            ),
        ),
    ];
    for proto in BOTH {
        for (what, bytes) in &cases {
            let a = answer(&srv, proto, bytes, what).await;
            assert_bare_formerr(&a, id_of(bytes), what);
            assert_eq!(counts_of(&a)[1], 0, "{what}: no answers");
        }
    }
    still_answers(&srv, "two OPTs").await;
}

#[tokio::test]
async fn an_opt_outside_the_additional_section_gets_formerr() {
    // RFC 6891 §6.1.1: the OPT "MAY be placed anywhere within the additional data
    // section"; hickory refuses OPT, SIG and TSIG in the answer and authority sections
    // (`DecodeError::RecordNotInAdditionalSection`).
    let srv = TestServer::demo().await;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "OPT in the answer section",
            packet(70, RD, [1, 1, 0, 0], &[&www_a(), &opt(&[])]),
        ),
        (
            "OPT in the authority section",
            packet(71, RD, [1, 0, 1, 0], &[&www_a(), &opt(&[])]),
        ),
    ];
    for proto in BOTH {
        for (what, bytes) in &cases {
            let a = answer(&srv, proto, bytes, what).await;
            assert_bare_formerr(&a, id_of(bytes), what);
        }
    }
    still_answers(&srv, "OPT outside the additional section").await;
}

#[tokio::test]
async fn oversized_edns_options_are_ignored() {
    let srv = TestServer::demo().await;
    // 60,000 bytes of an unknown option: only TCP can carry it.
    let big = vec![0xa5u8; 60_000];
    let bytes = packet(80, RD, [1, 0, 0, 1], &[&www_a(), &opt(&[(65001, &big)])]);
    let a = answer(&srv, Proto::Tcp, &bytes, "60,000-byte option").await;
    let m = hickory_proto::op::Message::from_vec(&a).unwrap();
    assert_eq!(m.metadata.id, 80);
    cname_of(&m);
    let echoed = m.edns.expect("OPT in the answer");
    assert!(echoed.options().options.is_empty(), "option echoed");
    assert!(a.len() < 200, "answer of {} bytes", a.len());

    // Over UDP, 4,000 bytes fits the 4,096-byte receive buffer and is ignored.
    let mid = vec![0x5au8; 4_000];
    let bytes = packet(81, RD, [1, 0, 0, 1], &[&www_a(), &opt(&[(65001, &mid)])]);
    let a = answer(&srv, Proto::Udp, &bytes, "4,000-byte option").await;
    assert_eq!(raw_rcode(&a), 0);
    assert!(a.len() < 200);

    // A datagram larger than the 4,096-byte receive buffer is dropped (and counted in
    // steerdns_udp_dropped_total{reason="oversized"}): no query needs that much.
    let bytes = packet(
        82,
        RD,
        [1, 0, 0, 1],
        &[&www_a(), &opt(&[(65001, &big[..8_000])])],
    );
    silence(&srv, Proto::Udp, &bytes, "8,000-byte datagram").await;

    still_answers(&srv, "oversized options").await;
}

// ---------------------------------------------------------------------------------------
// TCP framing and slow clients.

/// Whether the server closed `s` (EOF or reset) within `within`.
async fn closed_by_server(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 512];
    let deadline = Instant::now() + within;
    loop {
        match timeout(
            deadline.saturating_duration_since(Instant::now()),
            s.read(&mut buf),
        )
        .await
        {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test]
async fn a_tcp_length_prefix_that_lies() {
    let srv = TestServer::demo().await;
    let q = packet(90, RD, [1, 0, 0, 0], &[&www_a()]);

    // Longer than what is sent, then the client closes its side: nothing to answer, and
    // the server closes too.
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(&((q.len() + 100) as u16).to_be_bytes())
        .await
        .unwrap();
    s.write_all(&q).await.unwrap();
    s.shutdown().await.unwrap();
    assert!(
        closed_by_server(&mut s, Duration::from_secs(2)).await,
        "server kept a half-closed connection open"
    );
    still_answers(&srv, "a long prefix").await;

    // Longer than what is sent, and the client stays: the server waits for the rest but
    // answers everybody else meanwhile.
    let mut waiting = TcpStream::connect(srv.addr).await.unwrap();
    waiting
        .write_all(&((q.len() + 100) as u16).to_be_bytes())
        .await
        .unwrap();
    waiting.write_all(&q).await.unwrap();
    still_answers(&srv, "a long prefix, client waiting").await;

    // Shorter: the server reads a cut message and says FORMERR; the bytes left over are
    // read as the next frame.
    let cut = 20; // header + "\x03www\x07exa"
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(&(cut as u16).to_be_bytes()).await.unwrap();
    s.write_all(&q).await.unwrap();
    let a = timeout(Duration::from_secs(2), read_frame(&mut s))
        .await
        .expect("an answer to the cut message")
        .expect("a frame");
    assert_formerr(&a, 90, "short prefix");
    // The rest of the query (13 bytes) starts with "mp", read as a length of 0x6d70:
    // incomplete, so nothing more comes back.
    assert!(timeout(SILENCE, read_frame(&mut s)).await.is_err());
    drop(s);
    still_answers(&srv, "a short prefix").await;

    // A short prefix followed by a valid frame on the same connection: both answered
    // in order (FORMERR, then the CNAME).
    let good = query("www.example.com.", RecordType::A).to_vec().unwrap();
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    let bytes = [framed(&q[..12]), framed(&good)].concat();
    s.write_all(&bytes).await.unwrap();
    let a = read_frame(&mut s).await.unwrap();
    assert_formerr(&a, 90, "header only (QDCOUNT 1, no question)");
    let b = read_frame(&mut s).await.unwrap();
    cname_of(&hickory_proto::op::Message::from_vec(&b).unwrap());
    drop(waiting);
}

/// Short enough for a test, long enough for a loaded CI machine to answer a query.
const TEST_IDLE: Duration = Duration::from_millis(500);

#[tokio::test]
async fn silent_and_trickling_tcp_clients_are_closed_and_starve_no_one() {
    // All from 127.0.0.1, as the client that must still be answered: no per-source cap
    // (`tests/limits.rs` tests that one).
    let srv = TestServer::demo_with(&DnsOptions {
        tcp: TcpLimits {
            idle_timeout: TEST_IDLE,
            max_per_source: 0,
            ..TcpLimits::default()
        },
        ..DnsOptions::default()
    })
    .await;
    let opened = Instant::now();
    // Many silent connections, and one that sends a byte every 50 ms (a whole query would
    // take ~1.7 s, over three idle timeouts).
    let mut silent = Vec::new();
    for _ in 0..200 {
        silent.push(TcpStream::connect(srv.addr).await.unwrap());
    }
    let framed = framed(&query("www.example.com.", RecordType::A).to_vec().unwrap());
    let trickle = TcpStream::connect(srv.addr).await.unwrap();
    let trickler = tokio::spawn(async move {
        let mut s = trickle;
        for b in framed {
            if s.write_all(&[b]).await.is_err() {
                return (s, true);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (s, false)
    });

    // Meanwhile everybody else is answered, over UDP and TCP.
    for _ in 0..5 {
        still_answers(&srv, "200 silent connections and a trickling one").await;
    }

    // The server closes them all after its idle timeout.
    let limit = TEST_IDLE * 4;
    for (i, s) in silent.iter_mut().enumerate() {
        let left = limit.saturating_sub(opened.elapsed()) + Duration::from_millis(100);
        assert!(
            closed_by_server(s, left).await,
            "silent connection {i} still open"
        );
    }
    let (mut s, write_failed) = trickler.await.unwrap();
    assert!(
        write_failed || closed_by_server(&mut s, Duration::from_millis(100)).await,
        "the trickling connection was not closed"
    );
    let mut buf = [0u8; 2];
    let got = timeout(Duration::from_millis(100), s.read(&mut buf)).await;
    assert!(
        !matches!(got, Ok(Ok(n)) if n > 0),
        "the trickling client got an answer"
    );
    still_answers(&srv, "idle connections closed").await;
}

#[tokio::test]
async fn the_idle_timeout_does_not_cut_an_active_connection() {
    let srv = TestServer::demo_with(&DnsOptions {
        tcp: TcpLimits {
            idle_timeout: TEST_IDLE,
            ..TcpLimits::default()
        },
        ..DnsOptions::default()
    })
    .await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    // Queries every 200 ms for twice the idle timeout: the timer restarts per query.
    let started = Instant::now();
    while started.elapsed() < TEST_IDLE * 2 {
        let q = query("www.example.com.", RecordType::A);
        s.write_all(&framed(&q.to_vec().unwrap())).await.unwrap();
        let a = read_frame(&mut s)
            .await
            .expect("answer on a live connection");
        cname_of(&hickory_proto::op::Message::from_vec(&a).unwrap());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
