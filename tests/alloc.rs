//! "No allocation on the fast path once buffers have grown" (ARCHITECTURE), counted: a
//! global allocator that counts the allocations of the thread that asks, around the
//! UDP data plane's per-query steps called in-process on the bytes a client sends:
//! response rate limiting, judging a DNS cookie (`dns::wire::cookie_of`), the fast
//! path (`dns::wire::answer`, every ECS shape, both families, with and without a cookie)
//! and a hit of the answer cache (`dns::cache::AnswerCache::lookup`, with a cookie too);
//! and the fast path with a dnstap sink attached (`dns::dnstap::Tap::log`, to a collector
//! in the test that reads everything).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use common::*;
use hickory_proto::rr::RecordType;
use hickory_server::net::xfer::Protocol;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use steerdns::control::decide::planner;
use steerdns::dns::cache::{AnswerCache, Lookup};
use steerdns::dns::cookie::{self, Secrets};
use steerdns::dns::rrl::{self, Rrl, RrlConfig, Verdict};
use steerdns::dns::{wire, Handler};
use steerdns::metrics::Metrics;

/// Counts allocations (and reallocations) made by threads that set `COUNTING`.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: the allocator also runs while thread locals are torn down.
    let _ = COUNTING.try_with(|c| {
        if c.get() {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

// SAFETY: every call is passed to the system allocator unchanged; counting touches
// only const-initialised thread locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.with(|n| n.get())
}

/// The plain forms of a steered query the fast path answers.
fn steered_queries() -> Vec<(&'static str, Vec<u8>)> {
    let q = |ecs: Option<(&str, u8)>| {
        query_edns("www.example.com.", RecordType::A, ecs)
            .to_vec()
            .unwrap()
    };
    vec![
        (
            "no EDNS",
            query("www.example.com.", RecordType::A).to_vec().unwrap(),
        ),
        ("EDNS", q(None)),
        ("ECS GB /24", q(Some(("81.2.69.0", 24)))),
        ("ECS US /27", q(Some(("216.160.83.32", 27)))),
        ("ECS JP /48", q(Some(("2001:218::", 48)))),
        ("ECS unknown /24", q(Some(("100.64.0.0", 24)))),
        ("ECS opt-out", q(Some(("0.0.0.0", 0)))),
        ("client cookie", with_cookie(q(None), &[7; 8])),
        (
            "ECS and a foreign server cookie",
            with_cookie(q(Some(("81.2.69.0", 24))), &[9; 24]),
        ),
    ]
}

/// `packet` (a query with an OPT) with a COOKIE option `data` added to its OPT.
fn with_cookie(packet: Vec<u8>, data: &[u8]) -> Vec<u8> {
    let mut m = hickory_proto::op::Message::from_vec(&packet).unwrap();
    let opt = m.edns.as_mut().expect("an OPT").options_mut();
    opt.insert(hickory_proto::rr::rdata::opt::EdnsOption::Unknown(
        10,
        data.to_vec(),
    ));
    m.to_vec().unwrap()
}

/// Secrets with a previous one, so that an invalid cookie is tried under both.
fn secrets() -> Secrets {
    Secrets {
        current: [1; 16],
        previous: Some([2; 16]),
    }
}

#[test]
fn the_fast_path_allocates_nothing_once_its_buffers_have_grown() {
    let snap = planner::snapshot(&load_fixture(DEMO_POLICY, TEST_ZONES, TEST_GEO));
    let rrl = Rrl::new(RrlConfig::default()).unwrap();
    // Loopback is exempt by default: a limiter that exempts nothing, for the charge of
    // a large answer to take its path.
    let charged = Rrl::new(RrlConfig {
        rate: 65_535,
        exempt: Vec::new(),
        ..RrlConfig::default()
    })
    .unwrap();
    let mut rng = SmallRng::seed_from_u64(7);
    let mut out = Vec::new();
    let sources: Vec<IpAddr> = (0..64).map(resolver).collect();
    let now = 1_800_000_000;
    let secrets = secrets();
    for (what, packet) in steered_queries() {
        // Grow the buffer (and whatever else starts lazily) first.
        let judged = wire::cookie_of(&packet, &secrets, sources[0], now);
        let first = wire::answer(
            &snap,
            &packet,
            sources[0],
            &mut out,
            now,
            &mut rng,
            judged.reply(),
        );
        assert!(first.is_some());
        let n = allocations(|| {
            for (i, src) in sources.iter().enumerate() {
                // As the UDP thread does: the cookie, the limiter, the answer.
                let now = now + i as u64;
                let judged = wire::cookie_of(&packet, &secrets, *src, now);
                assert_eq!(rrl.check(*src), Verdict::Answer);
                let steer = wire::answer(
                    &snap,
                    &packet,
                    *src,
                    &mut out,
                    now,
                    &mut rng,
                    judged.reply(),
                );
                assert!(steer.is_some(), "{what}: not taken by the fast path");
                // A steered answer costs the limiter exactly the one unit it counted;
                // a large answer's charge allocates nothing either.
                assert!(out.len() <= rrl::UNIT, "{what}: {} bytes", out.len());
                rrl.charge(*src, false, out.len());
                charged.charge(*src, false, 1400);
            }
        });
        assert_eq!(n, 0, "{what}: {n} allocations in 64 answers");
    }
    // A valid server cookie, echoed, on the client's own budget.
    let client = [5u8; 8];
    let made = cookie::server_cookie(&secrets.current, &client, now as u32, sources[0]);
    let valid = [&client[..], &made].concat();
    let edns = query_edns("www.example.com.", RecordType::A, None)
        .to_vec()
        .unwrap();
    let packet = with_cookie(edns, &valid);
    let n = allocations(|| {
        for _ in 0..64 {
            let judged = wire::cookie_of(&packet, &secrets, sources[0], now);
            assert!(judged.is_valid());
            assert_eq!(rrl.check_own(sources[0]), Verdict::Answer);
            let steer = wire::answer(
                &snap,
                &packet,
                sources[0],
                &mut out,
                now,
                &mut rng,
                judged.reply(),
            );
            assert!(steer.is_some(), "valid cookie: not taken by the fast path");
            charged.charge(sources[0], true, 1400);
        }
    });
    assert_eq!(n, 0, "valid cookie: {n} allocations in 64 answers");
}

/// A Frame Streams collector on `sock` that accepts one writer, shakes hands and reads
/// everything; the number of data frames read so far.
fn collector(sock: &std::path::Path) -> Arc<std::sync::atomic::AtomicUsize> {
    use std::io::{Read, Write};
    let listener = std::os::unix::net::UnixListener::bind(sock).unwrap();
    let frames = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = frames.clone();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let word = |s: &mut std::os::unix::net::UnixStream| {
            let mut w = [0u8; 4];
            s.read_exact(&mut w).map(|_| u32::from_be_bytes(w) as usize)
        };
        let ct = b"protobuf:dnstap.Dnstap";
        let mut accept = vec![
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            12 + ct.len() as u8,
            0,
            0,
            0,
            1,
            0,
            0,
            0,
            1,
        ];
        accept.extend_from_slice(&(ct.len() as u32).to_be_bytes());
        accept.extend_from_slice(ct);
        let mut accepted = false;
        while let Ok(first) = word(&mut s) {
            // A control frame: an escape (0), then its length.
            let control = first == 0;
            let len = if control {
                word(&mut s).unwrap_or(0)
            } else {
                first
            };
            let mut frame = vec![0u8; len];
            if s.read_exact(&mut frame).is_err() {
                return;
            }
            if control && !accepted {
                // READY: answer ACCEPT; START follows, then data frames.
                s.write_all(&accept).unwrap();
                accepted = true;
            } else if !control {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
    frames
}

#[test]
fn the_fast_path_with_dnstap_allocates_nothing_either() {
    use steerdns::dns::dnstap::{self, Config, Dnstap, Endpoint, Event};
    let dir = std::env::temp_dir().join(format!("steerdns-alloc-tap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("tap.sock");
    let read = collector(&sock);
    let config = Config {
        endpoint: Endpoint::Unix(sock.clone()),
        sample: 1,
        identity: "alloc".into(),
    };
    let metrics = Metrics::new();
    let counters = metrics.dnstap_counters();
    let sink = Dnstap::start(config, counters.clone()).unwrap();
    let mut tap = sink.tap();
    let snap = planner::snapshot(&load_fixture(DEMO_POLICY, TEST_ZONES, TEST_GEO));
    let mut rng = SmallRng::seed_from_u64(7);
    let mut out = Vec::new();
    let server: SocketAddr = "127.0.0.1:53".parse().unwrap();
    let sources: Vec<SocketAddr> = (0..64)
        .map(|i| SocketAddr::new(resolver(i), 5353))
        .collect();
    let now = 1_800_000_000;
    let mut logged = 0;
    // Cookies judged as the UDP thread does.
    let secrets = secrets();
    for (what, packet) in steered_queries() {
        let src = sources[0];
        let cookie = wire::cookie_of(&packet, &secrets, src.ip(), now);
        let steer = wire::answer(
            &snap,
            &packet,
            src.ip(),
            &mut out,
            now,
            &mut rng,
            cookie.reply(),
        )
        .unwrap_or_else(|| panic!("{what}: not taken by the fast path"));
        let received = dnstap::now();
        tap.log(
            &Event::new(false, src, server, received, &packet)
                .answer(&out)
                .decided(steer.decided()),
        );
        logged += 1;
        let n = allocations(|| {
            for (i, src) in sources.iter().enumerate() {
                let received = dnstap::now();
                let now = now + i as u64;
                let cookie = wire::cookie_of(&packet, &secrets, src.ip(), now);
                let steer = wire::answer(
                    &snap,
                    &packet,
                    src.ip(),
                    &mut out,
                    now,
                    &mut rng,
                    cookie.reply(),
                );
                let steer = steer.expect("the fast path");
                // As the UDP thread does.
                if tap.keep(steer.remarkable()) {
                    let event = Event::new(false, *src, server, received, &packet);
                    tap.write(&event.answer(&out).decided(steer.decided()));
                }
            }
        });
        logged += sources.len();
        assert_eq!(n, 0, "{what}: {n} allocations in 64 answers with dnstap");
    }
    // What was logged reached the collector (two frames an answer), none dropped.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while read.load(std::sync::atomic::Ordering::Relaxed) < 2 * logged {
        assert!(std::time::Instant::now() < deadline, "frames not read");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(counters.dropped.get(), 0);
    drop(sink);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "current_thread")]
async fn a_hit_of_the_answer_cache_allocates_nothing() {
    let live = Arc::new(steerdns::plan::Live::from_pointee(planner::snapshot(
        &load_fixture(DEMO_POLICY, TEST_ZONES, TEST_GEO),
    )));
    let handler = Handler::new(live.clone(), Metrics::new());
    let snap = live.load_full();
    let src: SocketAddr = "127.0.0.1:5353".parse().unwrap();
    let mut cache = AnswerCache::default();
    let (mut out, mut stripped) = (Vec::new(), Vec::new());
    let zone = [
        ("SOA", query("example.com.", RecordType::SOA)),
        ("A", query_edns("mail.example.com.", RecordType::A, None)),
        (
            "NXDOMAIN with ECS",
            query_edns("nope.example.com.", RecordType::A, Some(("81.2.69.0", 24))),
        ),
    ];
    let with_a_cookie = query_edns("gone.example.com.", RecordType::A, Some(("81.2.69.0", 24)));
    let with_a_cookie = with_cookie(with_a_cookie.to_vec().unwrap(), &[3; 8]);
    let zone = zone
        .into_iter()
        .map(|(what, q)| (what, q.to_vec().unwrap()))
        .chain([("NXDOMAIN with ECS and a cookie", with_a_cookie)]);
    let secrets = secrets();
    let now = steerdns::clock::now_secs();
    for (what, packet) in zone {
        let judged = wire::cookie_of(&packet, &secrets, src.ip(), now);
        let reply = judged.reply();
        assert_eq!(reply.is_some(), what.contains("cookie"), "{what}");
        match cache.lookup(&snap, &packet, &mut out, &mut stripped, reply) {
            Lookup::Miss(miss) => {
                let answer = handler
                    .respond(&stripped, src, Protocol::Udp)
                    .await
                    .expect("a full path answer");
                assert!(cache.store(miss, &answer, &mut out), "{what}: not stored");
            }
            _ => panic!("{what}: the first lookup must miss"),
        }
        // Once more to grow the output buffer, then counted.
        assert!(matches!(
            cache.lookup(&snap, &packet, &mut out, &mut stripped, reply),
            Lookup::Hit(_)
        ));
        let n = allocations(|| {
            for _ in 0..64 {
                let judged = wire::cookie_of(&packet, &secrets, src.ip(), now);
                let hit = cache.lookup(&snap, &packet, &mut out, &mut stripped, judged.reply());
                assert!(
                    matches!(hit, Lookup::Hit(_)),
                    "{what}: a stored answer must hit"
                );
            }
        });
        assert_eq!(n, 0, "{what}: {n} allocations in 64 cache hits");
    }
}
