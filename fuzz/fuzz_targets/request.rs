//! Raw bytes through the request path the server uses: hickory's decode
//! (`Request::from_bytes` is `MessageRequest::read` after `Header::read`, as in hickory's
//! `ServerContext::handle_request`), its QR=1 drop, then our `Handler` with the demo
//! policy, the test zone and the test geo database. The response is encoded as hickory's
//! `ResponseHandle` does (UDP capped at the response OPT's size, else 512) and checked:
//! it decodes, answers the same id with QR=1, and fits the UDP limit.
//!
//! The first input byte chooses the transport and the client's source address; the
//! rest is the DNS message.
#![no_main]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

use hickory_proto::op::{Message, MessageType};
use hickory_proto::rr::Record;
use hickory_proto::serialize::binary::BinEncoder;
use hickory_server::net::runtime::TokioTime;
use hickory_server::net::xfer::Protocol;
use hickory_server::net::NetError;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponse;
use libfuzzer_sys::fuzz_target;
use steerdns::app::{self, Inputs};
use steerdns::dns::Handler;
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
            config: repo.join("steering.yaml"),
            zones: repo.join("tests/fixtures/zones"),
            geo: repo.join("tests/fixtures/geo/GeoIP2-Country-Test.mmdb"),
            probes: repo.join("tests/fixtures/no-probes"),
        };
        let loaded = app::load(&inputs).unwrap_or_else(|e| panic!("fixture: {e}"));
        let live = Arc::new(arc_swap_new(loaded.snapshot()));
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

/// Encodes the response into a shared buffer, as hickory's `ResponseHandle` would send it.
#[derive(Clone)]
struct Capture {
    protocol: Protocol,
    out: Arc<Mutex<Vec<Vec<u8>>>>,
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
        let mut bytes = Vec::with_capacity(512);
        let mut encoder = BinEncoder::new(&mut bytes);
        encoder.set_max_size(match self.protocol {
            Protocol::Udp => response.edns().map_or(512, |e| e.max_payload()),
            _ => u16::MAX,
        });
        let info = response.destructive_emit(&mut encoder)?;
        self.out.lock().unwrap().push(bytes);
        Ok(info)
    }
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
    // hickory drops what does not decode (after a FORMERR of its own) and what has QR=1.
    let Ok(request) = Request::from_bytes(msg.to_vec(), src, protocol) else {
        return;
    };
    if request.metadata.message_type == MessageType::Response {
        return;
    }
    let f = fixture();
    let capture = Capture {
        protocol,
        out: Arc::default(),
    };
    f.rt.block_on(
        f.handler
            .handle_request::<_, TokioTime>(&request, capture.clone()),
    );
    let out = capture.out.lock().unwrap();
    assert!(out.len() <= 1, "{} responses to one request", out.len());
    let Some(bytes) = out.first() else {
        return;
    };
    if protocol == Protocol::Udp {
        let limit = request
            .edns
            .as_ref()
            .map_or(512, |e| e.max_payload().clamp(512, 1232));
        assert!(
            bytes.len() <= usize::from(limit),
            "{} > {limit}",
            bytes.len()
        );
    }
    let answer = Message::from_vec(bytes).expect("our response decodes");
    assert_eq!(answer.metadata.id, request.metadata.id);
    assert_eq!(answer.metadata.message_type, MessageType::Response);
    assert_eq!(answer.edns.is_some(), request.edns.is_some(), "OPT iff OPT");
});
