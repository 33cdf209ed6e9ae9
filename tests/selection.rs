//! Consistent selection: the answer is a function of the resolver, the client network
//! within the ECS scope and a staggered hourly window, the same on every node.
//!
//! - Two servers on the same files answer 200 ECS subnets alike, over real sockets, and
//!   a resolver asking twice (in another letter case, as Zonemaster does) gets the same.
//! - A failover step moves only clients of the failing CDN, and failback returns
//!   exactly them (in-process, over the plans the planner builds).
//! - Over a simulated day, a skewed population of resolvers and networks drawn from the
//!   shipped database sees every region's shares within 2 points of its weights.

mod common;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use common::*;
use hickory_proto::rr::RecordType;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use steerdns::app::Loaded;
use steerdns::control::decide::keys::NameCdn;
use steerdns::control::decide::planner::{self, Removed};
use steerdns::plan::{Asker, Snapshot};
use steerdns::selection;

const SHIPPED_GEO: &str = "geo/country.mmdb";
/// A fixed day (2027-01-15, UTC): the results do not depend on when the test runs.
const DAY: u64 = 1_800_000_000 - 1_800_000_000 % 86_400;

fn demo() -> Loaded {
    load_fixture(DEMO_POLICY, "zones", SHIPPED_GEO)
}

/// `n` addresses the shipped database places in a country, drawn at random.
fn located(loaded: &Loaded, rng: &mut SmallRng, n: usize) -> Vec<IpAddr> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let ip = IpAddr::V4(Ipv4Addr::from(rng.random::<u32>() & 0xffff_ff00));
        if loaded.geo.locate(ip).country.is_some() {
            out.push(ip);
        }
    }
    out
}

/// The CDN a query from `resolver` with ECS `client/24` gets at `now`, the region, and
/// the prefix of the network the key holds (as the server computes them).
fn answer(snap: &Snapshot, resolver: IpAddr, client: IpAddr, now: u64) -> (String, usize, u8) {
    let steered = snap.plan.names().next().unwrap();
    let asker = Asker::new(resolver, Some((client, 24)));
    let a = steered.answer(&snap.geo, &asker, now, &mut rand::rng());
    let cdn = steered.target(a.pick.target).cdn.to_string();
    (cdn, a.decision.region, a.scope.min(24))
}

#[tokio::test]
async fn two_servers_on_the_same_files_answer_alike() {
    let ns1 = TestServer::start(DEMO_POLICY, "zones", SHIPPED_GEO, "127.0.0.1:0").await;
    let ns2 = TestServer::start(DEMO_POLICY, "zones", SHIPPED_GEO, "127.0.0.1:0").await;
    let loaded = demo();
    let mut rng = SmallRng::seed_from_u64(11);
    let one_resolver: IpAddr = "127.64.0.53".parse().unwrap();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for client in located(&loaded, &mut rng, 200) {
        let q = query_edns(
            "www.example.com.",
            RecordType::A,
            Some((&client.to_string(), 24)),
        );
        let upper = query_edns(
            "WWW.Example.COM.",
            RecordType::A,
            Some((&client.to_string(), 24)),
        );
        let one = cname_of(&ns1.ask_from(one_resolver, Proto::Udp, &q).await);
        let two = cname_of(&ns2.ask_from(one_resolver, Proto::Udp, &q).await);
        assert_eq!(one, two, "{client}/24: ns1 and ns2 differ");
        let again = cname_of(&ns1.ask_from(one_resolver, Proto::Tcp, &upper).await);
        assert_eq!(one, again, "{client}/24: asked again (TCP, other case)");
        *seen.entry(one).or_default() += 1;
    }
    // Not one answer for everybody: both CDNs are given.
    assert!(
        seen.len() == 2 && seen.values().all(|&n| n >= 10),
        "{seen:?}"
    );
    // Without ECS the resolver is the client: one answer per resolver, on both nodes.
    for i in 0..50 {
        let q = query("www.example.com.", RecordType::AAAA);
        let one = cname_of(&ns1.ask_from(resolver(i), Proto::Udp, &q).await);
        let two = cname_of(&ns2.ask_from(resolver(i), Proto::Udp, &q).await);
        assert_eq!(one, two, "resolver {}", resolver(i));
    }
}

#[test]
fn a_step_moves_only_the_failing_cdns_clients_and_failback_returns_them() {
    let loaded = demo();
    let fastly_half: Removed = [(NameCdn::new("www.example.com.", "fastly"), 50)]
        .into_iter()
        .collect();
    let normal = planner::snapshot(&loaded);
    let (step, _) = planner::snapshot_with(&loaded, &fastly_half, &[]);
    let (back, _) = planner::snapshot_with(&loaded, &Removed::new(), &[]);
    let mut rng = SmallRng::seed_from_u64(12);
    let clients = located(&loaded, &mut rng, 4000);
    let (mut on_fastly, mut moved) = (0, 0);
    for (i, &client) in clients.iter().enumerate() {
        let r = resolver(i);
        let now = DAY + 600;
        let (before, ..) = answer(&normal, r, client, now);
        let (during, ..) = answer(&step, r, client, now);
        let (after, ..) = answer(&back, r, client, now);
        if before != during {
            assert_eq!(
                (before.as_str(), during.as_str()),
                ("fastly", "cloudflare"),
                "{client} moved between CDNs that did not change"
            );
            moved += 1;
        }
        on_fastly += usize::from(before == "fastly");
        assert_eq!(before, after, "{client}: failback returns the same clients");
    }
    // Half of fastly's clients leave, not more.
    let half = moved as f64 / on_fastly as f64;
    assert!((half - 0.5).abs() < 0.05, "{moved} of {on_fastly} moved");
}

/// A day of a skewed population: 3,000 resolvers whose traffic falls as 1/rank, the
/// larger ones serving more client networks (500/√rank, /24s the shipped database
/// places), each pair asking at its rate all day long and getting, window after
/// window, its consistent answer. Every region's shares are within 2 points of its
/// effective weights: with the configured weights, and during a 50 % failover step.
#[test]
fn a_day_of_a_skewed_population_follows_the_weights() {
    let loaded = demo();
    let mut rng = SmallRng::seed_from_u64(13);
    let mut pairs: Vec<(IpAddr, IpAddr, f64)> = Vec::new();
    for rank in 1..=3000usize {
        let networks = (500.0 / (rank as f64).sqrt()).ceil() as usize;
        let traffic = 1.0 / rank as f64 / networks as f64;
        for client in located(&loaded, &mut rng, networks) {
            pairs.push((resolver(rank), client, traffic));
        }
    }
    let fastly_half: Removed = [(NameCdn::new("www.example.com.", "fastly"), 50)]
        .into_iter()
        .collect();
    for removed in [Removed::new(), fastly_half] {
        let (snap, _) = planner::snapshot_with(&loaded, &removed, &[]);
        let steered = snap.plan.names().next().unwrap();
        // (region, cdn) -> traffic, and the region's total.
        let mut got: HashMap<(usize, String), f64> = HashMap::new();
        let mut total: HashMap<usize, f64> = HashMap::new();
        for &(r, client, traffic) in &pairs {
            let mut t = DAY;
            while t < DAY + 86_400 {
                let (cdn, region, within) = answer(&snap, r, client, t);
                let end = selection::window_end(r, client, within, t).min(DAY + 86_400);
                let amount = traffic * (end - t) as f64;
                *got.entry((region, cdn)).or_default() += amount;
                *total.entry(region).or_default() += amount;
                t = end;
            }
        }
        for (region, sum) in &total {
            let choice = steered.choice(*region);
            let weights: Vec<(String, u64)> = steered
                .weights(choice)
                .map(|(t, w)| (t.cdn.to_string(), w))
                .collect();
            let all: u64 = weights.iter().map(|(_, w)| w).sum();
            for (cdn, w) in &weights {
                let want = *w as f64 / all as f64;
                let share = got.get(&(*region, cdn.clone())).copied().unwrap_or(0.0) / sum;
                assert!(
                    (share - want).abs() <= 0.02,
                    "region {} ({removed:?}): {cdn} at {:.1} %, weight says {:.1} %",
                    steered.region_name(*region),
                    share * 100.0,
                    want * 100.0
                );
            }
        }
        assert!(total.len() >= 4, "every region was asked: {total:?}");
    }
}
