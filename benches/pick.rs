//! Micro-benchmarks of the query path (issue 5, item 3): geo lookup, where a client
//! lands (geo lookup, region match, choice: `situate`), weighted pick, the three
//! together (the steering decision), and a whole query from
//! its bytes to the response's bytes, on the UDP fast path and on the full path.
//!
//!   cargo bench --bench pick
//!
//! Inputs: the demo policy (`steering.yaml`), `zones/` and the NRO database
//! `geo/country.mmdb` (the whole Internet), queried with random IPv4 addresses.

use std::future::Future;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use arc_swap::ArcSwap;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::rdata::opt::{ClientSubnet, EdnsOption};
use hickory_proto::rr::{LowerName, Name, RecordType};
use hickory_server::net::xfer::Protocol;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use steerdns::app::{self, Inputs};
use steerdns::control::decide::planner;
use steerdns::dns::{wire, Handler};
use steerdns::metrics::Metrics;
use steerdns::place::asn::AsnDb;
use steerdns::plan::Asker;

const ADDRS: usize = 4096;

fn repo(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(p)
}

fn loaded() -> app::Loaded {
    let inputs = Inputs {
        config: repo("steering.yaml"),
        zones: repo("zones"),
        geo: repo("geo/country.mmdb"),
        probes: repo("tests/fixtures/no-probes"),
        asn: None,
        api_tokens: None,
    };
    app::load(&inputs).unwrap_or_else(|e| panic!("{e}"))
}

fn random_v4(rng: &mut SmallRng) -> Vec<IpAddr> {
    (0..ADDRS)
        .map(|_| IpAddr::V4(Ipv4Addr::from(rng.random::<u32>())))
        .collect()
}

fn steering(c: &mut Criterion) {
    let loaded = loaded();
    let snap = planner::snapshot(&loaded);
    let www = LowerName::from(Name::from_ascii("www.example.com.").unwrap());
    let steered = snap.plan.get(&www).expect("www.example.com is steered");
    let mut rng = SmallRng::seed_from_u64(5);
    let ips = random_v4(&mut rng);
    let resolver: IpAddr = Ipv4Addr::new(192, 0, 2, 53).into();

    let mut g = c.benchmark_group("steering");
    g.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    g.bench_function("geo_locate", |b| {
        b.iter(|| {
            i = (i + 1) % ADDRS;
            black_box(snap.geo.locate(black_box(ips[i])))
        })
    });
    // The ASN database (the test one: the shipped tree is the geo database only), on
    // addresses half of which fall in its 1.0.0.0/8 networks.
    let asn = AsnDb::open(&repo("tests/fixtures/geo/GeoLite2-ASN-Test.mmdb")).unwrap();
    let in_asn: Vec<IpAddr> = (ips.iter().enumerate())
        .map(|(k, &ip)| match ip {
            IpAddr::V4(a) if k % 2 == 0 => {
                Ipv4Addr::from(u32::from(a) & 0x00ff_ffff | 1 << 24).into()
            }
            _ => ip,
        })
        .collect();
    g.bench_function("asn_origin", |b| {
        b.iter(|| {
            i = (i + 1) % ADDRS;
            black_box(asn.origin(black_box(in_asn[i])))
        })
    });
    // Where a client lands: the geo lookup, the region match (tailored: the steps up
    // the tree followed) and the choice. The region match alone is this less
    // `geo_locate`.
    g.bench_function("situate", |b| {
        b.iter(|| {
            i = (i + 1) % ADDRS;
            let at = steered.situate(&snap.geo, black_box(ips[i]), true);
            black_box(at.decision)
        })
    });
    let choice = steered.choice(0);
    g.bench_function("weighted_pick", |b| {
        b.iter(|| {
            let key = rng.random::<u64>();
            black_box(steered.pick(black_box(choice), key).cname_wire.len())
        })
    });
    g.bench_function("decision", |b| {
        b.iter(|| {
            i = (i + 1) % ADDRS;
            // As a query with ECS /24 from one resolver: locate, decide, choose and the
            // consistent pick, as the fast path does.
            let asker = Asker::new(resolver, Some((black_box(ips[i]), 24)));
            let a = steered.answer(&snap.geo, &asker, 1_800_000_000, &mut rng);
            black_box(a.pick.cname_wire.len())
        })
    });
    g.finish();
}

/// Polls a future that never waits (the full path answers without I/O) to completion.
fn run<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..16 {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
    panic!("the handler waited");
}

/// A query's bytes, with an ECS option for `ecs` when given.
fn request(name: &str, qtype: RecordType, ecs: Option<IpAddr>) -> Vec<u8> {
    let mut m = Message::new(4242, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    if let Some(ip) = ecs {
        let mut edns = Edns::new();
        edns.set_max_payload(1232);
        edns.options_mut()
            .insert(EdnsOption::Subnet(ClientSubnet::new(ip, 24, 0)));
        m.set_edns(edns);
    }
    m.to_vec().unwrap()
}

fn handler(c: &mut Criterion) {
    let loaded = loaded();
    let live = Arc::new(ArcSwap::from_pointee(planner::snapshot(&loaded)));
    let handler = Handler::new(live.clone(), Metrics::new());
    let mut rng = SmallRng::seed_from_u64(7);
    let ecs: Vec<Vec<u8>> = random_v4(&mut rng)
        .into_iter()
        .take(256)
        .map(|ip| {
            let IpAddr::V4(v4) = ip else { unreachable!() };
            let o = v4.octets();
            let net = IpAddr::V4(Ipv4Addr::new(o[0], o[1], o[2], 0));
            request("www.example.com.", RecordType::A, Some(net))
        })
        .collect();
    let plain = request("www.example.com.", RecordType::A, None);
    let soa = request("example.com.", RecordType::SOA, None);
    let src: SocketAddr = "192.0.2.1:53000".parse().unwrap();
    let snap = live.load_full();
    let mut out = Vec::with_capacity(512);

    // Bytes in, bytes out: the UDP fast path, and the full path (hickory decode,
    // handler, encode) that TCP and every other query take.
    let mut g = c.benchmark_group("handler");
    g.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    g.bench_function("fast_path_ecs", |b| {
        b.iter(|| {
            i = (i + 1) % ecs.len();
            black_box(
                wire::answer(
                    &snap,
                    &ecs[i],
                    src.ip(),
                    &mut out,
                    1_800_000_000,
                    &mut rng,
                    None,
                )
                .is_some(),
            )
        })
    });
    g.bench_function("fast_path_plain", |b| {
        b.iter(|| {
            black_box(
                wire::answer(
                    &snap,
                    &plain,
                    src.ip(),
                    &mut out,
                    1_800_000_000,
                    &mut rng,
                    None,
                )
                .is_some(),
            )
        })
    });
    g.bench_function("full_path_ecs", |b| {
        b.iter(|| {
            i = (i + 1) % ecs.len();
            black_box(run(handler.respond(&ecs[i], src, Protocol::Udp)))
        })
    });
    g.bench_function("full_path_zone_soa", |b| {
        b.iter(|| black_box(run(handler.respond(&soa, src, Protocol::Udp))))
    });
    g.finish();
}

criterion_group!(benches, steering, handler);
criterion_main!(benches);
