//! The widest correct ECS scope, over the whole shipped database.
//!
//! For every network of `geo/country.mmdb` (IPv4 and IPv6, with data or empty) and
//! every steered name, the scope steerdns echoes is checked against the truth computed
//! here independently: the address space cut at every network and CIDR edge into
//! intervals, each labelled with the answer it gets (region and drain mask), and runs
//! of equal labels merged. A scope is correct when its block lies inside the run of the
//! address; the widest correct scope is the widest block that does.
//!
//! - No echoed block is ever wider than correct (demo policy; a policy with CIDR,
//!   country and continent regions, with and without location-scoped drains).
//! - On the demo policy, answers cover at least 95 % (IPv4 and IPv6) of the addresses the widest
//!   correct scopes cover (the measure: mean addresses per answer over the
//!   networks with data).

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use common::*;
use hickory_proto::rr::RecordType;
use ipnet::IpNet;
use maxminddb::{Reader, WithinOptions};
use steerdns::config::DrainScope;
use steerdns::control::decide::planner::{self, DrainCut, Removed};
use steerdns::place::countries::{Continent, Country};
use steerdns::place::Match;
use steerdns::plan::{Asker, Snapshot, Steered};

const SHIPPED_GEO: &str = "geo/country.mmdb";

/// One address family's networks as the search tree has them: (first, last, has data).
struct Family {
    bits: u32,
    networks: Vec<(u128, u128, bool)>,
}

fn families() -> [Family; 2] {
    let bytes = std::fs::read(repo(SHIPPED_GEO)).unwrap();
    let reader = Reader::from_source(bytes).unwrap();
    let mut v4 = Family {
        bits: 32,
        networks: Vec::new(),
    };
    let mut v6 = Family {
        bits: 128,
        networks: Vec::new(),
    };
    let opts = WithinOptions::default().include_networks_without_data();
    for item in reader.networks(opts).unwrap() {
        let item = item.unwrap();
        let net = item.network().unwrap();
        let (family, first) = match net.network() {
            IpAddr::V4(a) => (&mut v4, u128::from(u32::from(a))),
            IpAddr::V6(a) => (&mut v6, u128::from(a)),
        };
        let last = first | host_mask(family.bits, net.prefix());
        family.networks.push((first, last, item.has_data()));
    }
    for f in [&mut v4, &mut v6] {
        f.networks.sort_unstable();
    }
    assert!(v4.networks.len() > 400_000, "the whole IPv4 tree");
    assert!(v6.networks.len() > 100_000, "the whole IPv6 tree");
    [v4, v6]
}

fn host_mask(bits: u32, prefix: u8) -> u128 {
    if u32::from(prefix) >= bits {
        0
    } else {
        (u128::MAX >> (128 - bits)) >> prefix
    }
}

fn ip(bits: u32, a: u128) -> IpAddr {
    if bits == 32 {
        IpAddr::V4(Ipv4Addr::from(a as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(a))
    }
}

/// What an answer depends on: the region and the location-scoped drains.
fn label(snap: &Snapshot, name: Steered, a: IpAddr) -> (usize, usize) {
    let d = name.situate(&snap.geo, a, true).decision;
    (d.region, d.mask)
}

/// How one name's scopes compare with the widest correct ones.
#[derive(Debug, Default)]
struct Tally {
    answers: u64,
    wider: u64,
    narrower: u64,
    /// Addresses per answer, summed (as f64: IPv6 blocks overflow anything else).
    covered: f64,
    possible: f64,
    first_wrong: Option<String>,
    /// Every 499th network with data: (its first address, its prefix, the widest
    /// correct scope).
    samples: Vec<(IpAddr, u8, u8)>,
}

/// Checks every network of `family` for `name`; `edges` are the CIDR blocks of the
/// policy and drains (where the answer may change inside a network).
fn tally(snap: &Snapshot, name: Steered, family: &Family, edges: &[IpNet]) -> Tally {
    let bits = family.bits;
    let top = u128::MAX >> (128 - bits);
    // Interval starts: every network's first address and the address after it, every
    // CIDR block's first address and the address after it.
    let mut cuts: Vec<u128> = vec![0];
    for &(first, last, _) in &family.networks {
        cuts.push(first);
        if last < top {
            cuts.push(last + 1);
        }
    }
    for net in edges {
        let (first, last) = match (net.network(), net.broadcast()) {
            (IpAddr::V4(f), IpAddr::V4(l)) if bits == 32 => {
                (u128::from(u32::from(f)), u128::from(u32::from(l)))
            }
            (IpAddr::V6(f), IpAddr::V6(l)) if bits == 128 => (u128::from(f), u128::from(l)),
            _ => continue,
        };
        cuts.push(first);
        if last < top {
            cuts.push(last + 1);
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    // Space no network describes (the IPv4 aliases in IPv6) is never merged into: each
    // such interval gets a label of its own.
    let described = |c: u128| {
        let i = family.networks.partition_point(|n| n.0 <= c);
        i > 0 && family.networks[i - 1].1 >= c
    };
    let mut labels: Vec<Option<(usize, usize)>> = cuts
        .iter()
        .map(|&c| described(c).then(|| label(snap, name, ip(bits, c))))
        .collect();
    // ... unless the answer depends on no place at all.
    let anywhere = labels.iter().flatten().next().copied();
    let constant = labels.iter().flatten().all(|l| Some(*l) == anywhere);
    let labels: Vec<(usize, usize)> = labels
        .iter_mut()
        .enumerate()
        .map(|(k, l)| match l {
            Some(l) => *l,
            None if constant => anywhere.unwrap_or_default(),
            None => (usize::MAX, k),
        })
        .collect();
    // Runs of equal labels: for each interval, the first and last address of its run.
    let n = cuts.len();
    let mut run_first = vec![0u128; n];
    let mut run_last = vec![top; n];
    for k in 1..n {
        run_first[k] = if labels[k] == labels[k - 1] {
            run_first[k - 1]
        } else {
            cuts[k]
        };
    }
    for k in (0..n - 1).rev() {
        run_last[k] = if labels[k] == labels[k + 1] {
            run_last[k + 1]
        } else {
            cuts[k + 1] - 1
        };
    }
    let mut t = Tally::default();
    for &(first, last, data) in &family.networks {
        let a = ip(bits, first);
        let k = cuts.partition_point(|&c| c <= first) - 1;
        let (lo, hi) = (run_first[k], run_last[k]);
        let scope = name.situate(&snap.geo, a, true).decision.scope;
        // The widest block around `first` inside its run.
        let mut best = bits as u8;
        while best > 0 {
            let mask = host_mask(bits, best - 1);
            if first & !mask < lo || (first | mask) > hi {
                break;
            }
            best -= 1;
        }
        let mask = host_mask(bits, scope);
        if first & !mask < lo || (first | mask) > hi {
            t.wider += 1;
            t.first_wrong.get_or_insert_with(|| {
                format!("{a}: scope /{scope}, but /{best} is the widest correct")
            });
        }
        // The measure: networks with data, one answer each.
        if !data {
            continue;
        }
        t.answers += 1;
        if t.answers % 499 == 0 {
            let prefix = bits as u8 - (last - first).count_ones() as u8;
            t.samples.push((a, prefix, best));
        }
        if scope > best {
            t.narrower += 1;
        }
        t.covered += 2f64.powi((bits - u32::from(scope.min(bits as u8))) as i32);
        t.possible += 2f64.powi((bits - u32::from(best)) as i32);
    }
    t
}

fn check(snap: &Snapshot, edges: &[IpNet], min_cover: f64) {
    let fams = families();
    for name in snap.plan.names() {
        for family in &fams {
            let t = tally(snap, name, family, edges);
            let cover = t.covered / t.possible;
            eprintln!(
                "{} IPv{}: {} answers, {} wider, {:.1} % narrower, {:.1} % of the addresses covered",
                name.name(),
                if family.bits == 32 { 4 } else { 6 },
                t.answers,
                t.wider,
                100.0 * t.narrower as f64 / t.answers as f64,
                100.0 * cover
            );
            assert_eq!(t.wider, 0, "{}: {:?}", name.name(), t.first_wrong);
            assert!(
                cover >= min_cover,
                "{}: answers cover {:.1} % of what the widest correct scopes would",
                name.name(),
                100.0 * cover
            );
        }
    }
}

#[test]
fn demo_policy_scopes_are_never_wider_than_correct_and_nearly_the_widest() {
    let loaded = load_fixture(DEMO_POLICY, "zones", SHIPPED_GEO);
    let snap = planner::snapshot(&loaded);
    check(&snap, &[], 0.95);
}

#[test]
fn cidr_continent_and_drain_scopes_are_never_wider_than_correct() {
    let loaded = load_fixture(MULTI_POLICY, "zones", SHIPPED_GEO);
    let nets: Vec<IpNet> = [
        "81.2.69.128/25",
        "175.16.199.64/26",
        "127.0.0.0/8",
        "::1/128",
        "5.0.0.0/9",
        "2a00::/13",
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect();
    let plain = planner::snapshot(&loaded);
    check(&plain, &nets, 0.0);
    // Location-scoped drains split regions further: a country, a continent, a CIDR
    // block of each family, and a region.
    let cut = |cdn: &str, scope: Vec<DrainScope>| DrainCut {
        id: format!("test-{cdn}"),
        name: "pinned.example.com.".into(),
        cdn: cdn.into(),
        scope,
        percent: 100,
    };
    let country = |cc: &str| DrainScope::Match(Match::Country(Country::parse(cc).unwrap()));
    let drains = [
        cut("europe", vec![country("FR"), country("DE")]),
        cut(
            "world",
            vec![
                DrainScope::Match(Match::Continent(Continent::from_code("SA").unwrap())),
                DrainScope::Match(Match::Net(nets[4])),
                DrainScope::Match(Match::Net(nets[5])),
            ],
        ),
        cut("asia", vec![DrainScope::Region(4)]),
    ];
    let (drained, _) = planner::snapshot_with(&loaded, &Removed::new(), &drains);
    let pinned = drained
        .plan
        .names()
        .find(|n| n.name().to_string() == "pinned.example.com.")
        .unwrap();
    assert!(pinned.drain_scopes() > 0, "the drains are location-scoped");
    check(&drained, &nets, 0.0);
}

/// The scope on the wire, over UDP (the fast path) and TCP (the full path), is the
/// widest correct one, for networks of both families across the whole database.
#[tokio::test]
async fn the_scope_on_the_wire_is_the_widest_correct_one() {
    let loaded = load_fixture(DEMO_POLICY, "zones", SHIPPED_GEO);
    let snap = planner::snapshot(&loaded);
    let name = snap.plan.names().next().unwrap();
    let srv = TestServer::start(DEMO_POLICY, "zones", SHIPPED_GEO, "127.0.0.1:0").await;
    let (mut asked, mut wider_than_network) = (0, 0);
    for family in &families() {
        let t = tally(&snap, name, family, &[]);
        assert!(t.samples.len() > 200, "{} samples", t.samples.len());
        for (i, &(addr, prefix, best)) in t.samples.iter().enumerate() {
            // The network itself as the client subnet (sources past /24 and /56 are
            // rarely sent, and then the subnet is not the network).
            if prefix > if addr.is_ipv4() { 24 } else { 56 } {
                continue;
            }
            let proto = if i % 4 == 0 { Proto::Tcp } else { Proto::Udp };
            let q = query_edns(
                "www.example.com.",
                RecordType::A,
                Some((&addr.to_string(), prefix)),
            );
            let m = srv.ask(proto, &q).await;
            let ecs = ecs_of(&m).expect("an ECS answer");
            assert_eq!(ecs.scope_prefix(), best, "{addr}/{prefix} over {proto:?}");
            asked += 1;
            wider_than_network += usize::from(best < prefix);
        }
    }
    assert!(asked > 500, "{asked} asked");
    assert!(
        wider_than_network * 4 > asked,
        "{wider_than_network} of {asked} answers reach past their network"
    );
}

/// A query without ECS (or with source /0) echoes no scope, so its decision follows
/// no steps up the tree: the decision's scope is 0, where the same client with ECS
/// gets the widest block of its region.
#[test]
fn without_ecs_the_decision_widens_nothing() {
    let loaded = load_fixture(DEMO_POLICY, "zones", SHIPPED_GEO);
    let snap = planner::snapshot(&loaded);
    let name = snap.plan.names().next().unwrap();
    // GB (region of the first entry) and an address in the default region.
    for client in ["81.2.69.160", "216.160.83.56", "2a02:c7f::1"] {
        let ip: IpAddr = client.parse().unwrap();
        let mut rng = rand::rng();
        let tailored = name.answer(&snap.geo, &Asker::new(ip, Some((ip, 24))), 0, &mut rng);
        assert!(tailored.decision.scope > 0, "{client}: with ECS");
        for asker in [Asker::new(ip, None), Asker::new(ip, Some((ip, 0)))] {
            let a = name.answer(&snap.geo, &asker, 0, &mut rng);
            assert_eq!((a.scope, a.decision.scope), (0, 0), "{client}: {asker:?}");
            assert_eq!(a.decision.region, tailored.decision.region, "{client}");
        }
    }
}
