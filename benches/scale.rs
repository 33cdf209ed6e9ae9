//! Scale benchmarks (issue 5, item 4): the demo policy against one with 1,000 steered
//! names × 20 regions (`benches/scale_policy.py`), both with the full-Internet geo
//! database `geo/country.mmdb`.
//!
//!   cargo bench --bench scale
//!
//! - `plan_build/*`: building a plan snapshot as the control plane does on every change
//!   (`planner::plan`; `planner::snapshot_with`, which wraps it with the geo database and
//!   zones; and that adopted by the metrics, as the controller publishes it: adopting
//!   also folds the answer counts of the plan replaced before into the totals).
//! - `decision/*`: name lookup, geo lookup, region match and weighted pick.
//! - `query/*`: a whole UDP query on the fast path (`dns::wire::answer`, from the query's
//!   bytes to the answer's) with the answer counted, as `serve` runs it. The demo asks for
//!   `www.example.com`; the scale policy for a random one of its 1,000 names. Both use the
//!   same 4,096 random client subnets as ECS.
//!
//! Resident memory of a server for each policy: `benches/scale.sh`.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use arc_swap::ArcSwap;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::rdata::opt::{ClientSubnet, EdnsOption};
use hickory_proto::rr::{LowerName, Name, RecordType};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use steerdns::app::{self, Inputs, Loaded};
use steerdns::control::decide::planner::{self, Removed};
use steerdns::dns::{wire, Handler};
use steerdns::metrics::Metrics;
use steerdns::plan::Snapshot;

const REQUESTS: usize = 4096;

fn repo(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(p)
}

fn load(config: &Path, zones: &Path) -> Loaded {
    let inputs = Inputs {
        config: config.to_path_buf(),
        zones: zones.to_path_buf(),
        geo: repo("geo/country.mmdb"),
        probes: repo("tests/fixtures/no-probes"),
        asn: None,
        api_tokens: None,
    };
    app::load(&inputs).unwrap_or_else(|e| panic!("{e}"))
}

fn demo() -> Loaded {
    load(&repo("steering.yaml"), &repo("zones"))
}

/// Writes the 1,000 × 20 policy with `benches/scale_policy.py` and loads it.
fn scale() -> (Loaded, Vec<Name>) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("scale-policy");
    let status = Command::new("python3")
        .arg(repo("benches/scale_policy.py"))
        .arg(&dir)
        .status()
        .expect("python3 runs benches/scale_policy.py");
    assert!(status.success(), "benches/scale_policy.py failed");
    let loaded = load(&dir.join("steering.yaml"), &dir.join("zones"));
    let names = loaded.policy.hosts.iter().map(|h| h.name.clone()).collect();
    (loaded, names)
}

/// The snapshot `serve` publishes: adopted by the metrics, which read its answer counts.
fn served(loaded: &Loaded, metrics: &Metrics) -> Arc<Snapshot> {
    let snap = Arc::new(planner::snapshot(loaded));
    metrics.adopt(&snap);
    snap
}

fn plan_build(c: &mut Criterion) {
    let (scale, _) = scale();
    let demo = demo();
    let mut g = c.benchmark_group("plan_build");
    g.sample_size(20);
    for (label, loaded) in [("demo", &demo), ("1000x20", &scale)] {
        g.bench_function(format!("{label}/plan"), |b| {
            b.iter(|| {
                planner::plan(
                    black_box(&loaded.policy),
                    &Removed::new(),
                    &[],
                    loaded.geo.places(),
                )
            })
        });
        g.bench_function(format!("{label}/snapshot"), |b| {
            b.iter(|| planner::snapshot_with(loaded, &Removed::new(), &[]))
        });
        let metrics = Metrics::new();
        g.bench_function(format!("{label}/snapshot_adopted"), |b| {
            b.iter(|| served(loaded, &metrics))
        });
    }
    g.finish();
}

fn random_subnets(rng: &mut SmallRng) -> Vec<IpAddr> {
    (0..REQUESTS)
        .map(|_| {
            let o = Ipv4Addr::from(rng.random::<u32>()).octets();
            IpAddr::V4(Ipv4Addr::new(o[0], o[1], o[2], 0))
        })
        .collect()
}

fn decision(c: &mut Criterion) {
    let (scale, names) = scale();
    let demo = demo();
    let mut rng = SmallRng::seed_from_u64(5);
    let ips = random_subnets(&mut rng);
    let www = vec![LowerName::from(Name::from_ascii("www.example.com.").unwrap()); REQUESTS];
    let many: Vec<LowerName> = (0..REQUESTS)
        .map(|_| LowerName::from(names[rng.random_range(0..names.len())].clone()))
        .collect();
    // One name of the 1,000 only: the policy's shape (20 regions, CIDR entries) without
    // the spread over many names.
    let one = vec![LowerName::from(names[0].clone()); REQUESTS];
    let mut g = c.benchmark_group("decision");
    g.throughput(Throughput::Elements(1));
    for (label, loaded, qnames) in [
        ("demo", &demo, &www),
        ("1000x20", &scale, &many),
        ("1000x20_one_name", &scale, &one),
    ] {
        let snap = planner::snapshot(loaded);
        let mut i = 0usize;
        g.bench_function(label, |b| {
            b.iter(|| {
                i = (i + 1) % REQUESTS;
                let steered = snap.plan.get(black_box(&qnames[i])).expect("steered");
                let ip = black_box(ips[i]);
                let at = steered.situate(&snap.geo, ip, true);
                let key =
                    steered.pick_key(ip, ip, at.decision.scope.min(24), 1_800_000_000, &mut rng);
                black_box(steered.pick(at.choice, key).cname_wire.len())
            })
        });
    }
    g.finish();
}

/// The bytes of an `A` query for `name` with an ECS option for `ecs`.
fn request(name: &Name, ecs: IpAddr) -> Vec<u8> {
    let mut m = Message::new(4242, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(name.clone(), RecordType::A));
    let mut edns = Edns::new();
    edns.set_max_payload(1232);
    edns.options_mut()
        .insert(EdnsOption::Subnet(ClientSubnet::new(ecs, 24, 0)));
    m.set_edns(edns);
    m.to_vec().unwrap()
}

/// A whole UDP query on the fast path, from its bytes to the answer's, counted.
fn query(c: &mut Criterion) {
    let (scale, names) = scale();
    let demo = demo();
    let mut rng = SmallRng::seed_from_u64(7);
    let ips = random_subnets(&mut rng);
    let www = Name::from_ascii("www.example.com.").unwrap();
    let demo_requests: Vec<Vec<u8>> = ips.iter().map(|&ip| request(&www, ip)).collect();
    let scale_requests: Vec<Vec<u8>> = ips
        .iter()
        .map(|&ip| request(&names[rng.random_range(0..names.len())], ip))
        .collect();
    let src: IpAddr = "192.0.2.1".parse().unwrap();

    let mut g = c.benchmark_group("query");
    g.throughput(Throughput::Elements(1));
    for (label, loaded, requests) in [
        ("demo", &demo, &demo_requests),
        ("1000x20", &scale, &scale_requests),
    ] {
        let metrics = Metrics::new();
        let handler = Handler::new(Arc::new(ArcSwap::new(served(loaded, &metrics))), metrics);
        let snap = handler.live().load_full();
        let mut out = Vec::with_capacity(512);
        let mut i = 0usize;
        g.bench_function(label, |b| {
            b.iter(|| {
                i = (i + 1) % REQUESTS;
                let steer = wire::answer(
                    &snap,
                    &requests[i],
                    src,
                    &mut out,
                    1_800_000_000,
                    &mut rng,
                    None,
                );
                if let Some(s) = steer {
                    handler.count_steered(&s);
                }
                black_box(out.len())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, plan_build, decision, query);
criterion_main!(benches);
