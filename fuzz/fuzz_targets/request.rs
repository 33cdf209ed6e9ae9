//! Raw bytes through both request paths the server has, with the multi-name test
//! policy (every region pinned to one CDN), the test zone and the test geo database:
//! - the full path, `Handler::respond` (hickory decode, our handler, encode as hickory's
//!   `ResponseHandle` does): its response must decode, answer the same id with QR=1, and
//!   fit the UDP limit;
//! - the UDP fast path, `wire::answer`: whenever it answers, the full path must give the
//!   same message;
//! - the UDP answer cache, `cache::AnswerCache`: its answers (on the miss and on the hit)
//!   must be the full path's.
//!
//! The first input byte chooses the transport and the client's source address; the
//! rest is the DNS message.
#![no_main]

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use hickory_proto::op::{Message, MessageType};
use hickory_server::net::xfer::Protocol;
use libfuzzer_sys::fuzz_target;
use steerdns::app::{self, Inputs};
use steerdns::control::decide::planner;
use steerdns::dns::cache::{AnswerCache, Lookup};
use steerdns::dns::{wire, Handler};
use steerdns::metrics::Metrics;

struct Fixture {
    rt: tokio::runtime::Runtime,
    handler: Handler,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let inputs = Inputs {
            config: repo.join("tests/fixtures/steering-multi.yaml"),
            zones: repo.join("tests/fixtures/zones"),
            geo: repo.join("tests/fixtures/geo/GeoIP2-Country-Test.mmdb"),
            probes: repo.join("tests/fixtures/no-probes"),
            asn: None,
            api_tokens: None,
        };
        let loaded = app::load(&inputs).unwrap_or_else(|e| panic!("fixture: {e}"));
        let live = Arc::new(arc_swap_new(planner::snapshot(&loaded)));
        Fixture {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap(),
            handler: Handler::new(live, Metrics::new()),
        }
    })
}

fn arc_swap_new(s: steerdns::plan::Snapshot) -> steerdns::plan::Live {
    steerdns::plan::Live::from_pointee(s)
}

const SOURCES: [&str; 4] = [
    "81.2.69.160:5353",   // GB in the test database
    "216.160.83.56:5353", // US
    "[2001:218::1]:5353", // JP
    "127.0.0.1:5353",     // not in the database
];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, msg)) = data.split_first() else {
        return;
    };
    let protocol = if sel & 1 == 0 {
        Protocol::Udp
    } else {
        Protocol::Tcp
    };
    let src: SocketAddr = SOURCES[usize::from(sel >> 1) % SOURCES.len()]
        .parse()
        .unwrap();
    let f = fixture();
    let full = f.rt.block_on(f.handler.respond(msg, src, protocol));

    // The UDP fast path, on the same bytes: when it answers, the full path must give
    // the same message (the policy pins every region to one CDN).
    let mut fast = Vec::new();
    let snap = f.handler.live().load_full();
    let mut rng = rand::rng();
    if wire::answer(&snap, msg, src.ip(), &mut fast, steerdns::clock::now_secs(), &mut rng, None).is_some() {
        same_as_full(&fast, full.as_deref(), "the fast path");
    }

    // The UDP answer cache, on the same bytes: a miss answered through it, then a hit,
    // must both give the full path's answer.
    if protocol == Protocol::Udp {
        let mut cache = AnswerCache::default();
        for round in ["miss", "hit"] {
            let (mut out, mut stripped) = (Vec::new(), Vec::new());
            let replayed = match cache.lookup(&snap, msg, &mut out, &mut stripped, None) {
                Lookup::Bypass => break,
                Lookup::Hit(_) => true,
                Lookup::Miss(miss) => {
                    match f.rt.block_on(f.handler.respond(&stripped, src, protocol)) {
                        Some(answer) => cache.store(miss, &answer, &mut out),
                        None => false,
                    }
                }
            };
            if replayed {
                same_as_full(&out, full.as_deref(), &format!("the cache ({round})"));
            }
        }
    }

    let Some(bytes) = full else {
        return;
    };
    let query = Message::from_vec(msg).ok();
    if protocol == Protocol::Udp {
        let limit = query
            .as_ref()
            .and_then(|q| q.edns.as_ref())
            .map_or(512, |e| e.max_payload().clamp(512, 1232));
        assert!(
            bytes.len() <= usize::from(limit),
            "{} > {limit}",
            bytes.len()
        );
    }
    let answer = Message::from_vec(&bytes).expect("our response decodes");
    assert_eq!(answer.metadata.id, u16::from_be_bytes([msg[0], msg[1]]));
    assert_eq!(answer.metadata.message_type, MessageType::Response);
    if let Some(q) = query {
        if answer.metadata.response_code != hickory_proto::op::ResponseCode::FormErr {
            assert_eq!(answer.edns.is_some(), q.edns.is_some(), "OPT iff OPT");
        }
    }
});

/// Asserts that `answer`, given by `path`, is the full path's answer as a message.
fn same_as_full(answer: &[u8], full: Option<&[u8]>, path: &str) {
    let full = full.unwrap_or_else(|| panic!("the full path answers what {path} does"));
    let a = Message::from_vec(answer).unwrap_or_else(|e| panic!("{path}'s answer: {e}"));
    let b = Message::from_vec(full).expect("the full path's answer decodes");
    assert_eq!(a, b, "{path} and the full path differ");
}
