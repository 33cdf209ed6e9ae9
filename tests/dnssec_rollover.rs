//! A complete CSK rollover at an accelerated schedule, on two nodes of a set (a real
//! etcd) sharing one key directory, watched by real validators: `steerdns dnssec rollover --now` writes the
//! successor and the old key's retirement; both nodes take the files (the key
//! directory is watched) and re-sign at each of the key's times. Throughout, every
//! 250 ms:
//!
//! - a validating Unbound in front of each node (`subnetcache validator iterator`,
//!   both DS as trust anchor, as a parent holding both) answers the steered CNAME for
//!   clients of two regions with AD set, and never SERVFAIL;
//! - `delv` against each node validates it with the old key's DS alone (the parent
//!   before the change) until the old key is withdrawn, and with the new key's DS alone
//!   (the parent after it) from the new key's activation.
//!
//! The DNSKEY set is seen with both keys, CDS names the new key at the end, and the
//! old key is gone from every node.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::dnssec::delv;
use common::etcd::{have, require_etcd, EtcdSet};
use common::stack::{scratch, Options, Stack};
use common::unbound::{Mode, Unbound};
use common::{printed, steerdns};
use serde_json::Value;
use tokio::time::Instant;

/// www.example.com with TTLs of a second, signed, the rollover timed in seconds.
fn policy(dir: &Path, keys: &Path) {
    let text = format!(
        "hostname: www.example.com
ttl: 1
cdns:
  fastly: {{ cname: fastly.cdn.test. }}
  cloudflare: {{ cname: cloudflare.cdn.test. }}
regions:
  - match: [GB, 100.64.0.0/10]
    weights: {{ fastly: 100 }}
  - match: [\"*\"]
    weights: {{ cloudflare: 100 }}
dnssec:
  keys: {}
  validity: 10m
  refresh: 5m
  dnskey_ttl: 1
  rollover:
    every: 1h
    propagation: 3s
    ds_ttl: 1s
    parent_delay: 1s
",
        keys.display()
    );
    std::fs::write(dir.join("steering.yaml"), text).unwrap();
    // The zone's TTLs (and negative TTL) of a second too: they time the withdrawal.
    let zone = std::fs::read_to_string(dir.join("zones/example.com.zone")).unwrap();
    let zone = zone.replace("$TTL 3600", "$TTL 1").replace("300 )", "1 )");
    std::fs::write(dir.join("zones/example.com.zone"), zone).unwrap();
}

/// `steerdns ARGS`, which must succeed: what it printed.
fn succeeds(args: &[&str]) -> String {
    let out = steerdns(args).output().expect("steerdns runs");
    let text = printed(&out);
    assert!(out.status.success(), "steerdns {args:?}: {text}");
    text
}

/// The DS line (`example.com. IN DS …`) of key `tag`.
fn ds_of(keys: &Path, tag: u16) -> String {
    let now = steerdns::clock::now_secs();
    steerdns::dnssec::ds(keys, "example.com", now)
        .unwrap()
        .into_iter()
        .find(|l| l.split_whitespace().nth(3) == Some(&tag.to_string()))
        .unwrap_or_else(|| panic!("no DS for key {tag}"))
}

/// A delv trust anchor holding `ds`.
fn anchor(dir: &Path, name: &str, ds: &str) -> PathBuf {
    let f: Vec<&str> = ds.split_whitespace().collect();
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "trust-anchors {{ {} static-ds {} {} {} \"{}\"; }};\n",
            f[0], f[3], f[4], f[5], f[6]
        ),
    )
    .unwrap();
    path
}

/// `dig +short` of `qtype` at `node`.
fn short(node: SocketAddr, qtype: &str) -> Vec<String> {
    let out = Command::new("dig")
        .args(["@127.0.0.1", "-p", &node.port().to_string()])
        .args(["example.com", qtype, "+short", "+time=2", "+tries=1"])
        .output()
        .expect("dig runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect()
}

/// Key `tag`'s times in a node's `/v1/state`.
fn times(state: &Value, tag: u16) -> Value {
    state["dnssec"]["keys"]
        .as_array()
        .and_then(|k| k.iter().find(|k| k["tag"] == tag))
        .map(|k| k["times"].clone())
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csk_rollover_keeps_validators_at_zero_servfail_on_both_nodes() {
    if !require_etcd("a_csk_rollover_keeps_validators_at_zero_servfail_on_both_nodes") {
        return;
    }
    for tool in ["unbound", "delv", "dig"] {
        if !have(tool) {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{tool} is required in CI (.ci/run installs it)");
            }
            eprintln!("SKIPPED: {tool} not installed");
            return;
        }
    }
    let keys = scratch("roll-keys").join("keys");
    let now = steerdns::clock::now_secs();
    let first = steerdns::dnssec::keygen(&keys, "example.com", 13, now - 60).unwrap();
    let old = steerdns::dnssec::keys::load(&first).unwrap().tag;
    // Two nodes of a set (a real etcd): the keys are the same files on both, and each
    // computes what to serve from them and the clock.
    let etcd = EtcdSet::start("roll").await;
    let mut nodes = Vec::new();
    let mut dirs = Vec::new();
    for i in 1..=2 {
        let dir = scratch(&format!("roll-ns{i}"));
        policy(&dir, &keys);
        let cluster = etcd.node_options(&format!("ns{i}"), &["ns1", "ns2"]);
        let opts = Options {
            vantage: format!("ns{i}"),
            cluster: Some(cluster),
            ..Options::default()
        };
        nodes.push(Stack::start_with(&dir, Default::default(), opts).await);
        dirs.push(dir);
    }
    for n in &nodes {
        n.wait_for("connected to etcd", |s| s["cluster"]["connected"] == true)
            .await;
    }

    // The rollover, as an operator starts it.
    let config = dirs[0].join("steering.yaml");
    let zones = dirs[0].join("zones");
    let said = succeeds(&[
        "dnssec",
        "rollover",
        "example.com",
        "--now",
        "--config",
        config.to_str().unwrap(),
        "--zones",
        zones.to_str().unwrap(),
    ]);
    let all = steerdns::dnssec::keys::load_dir(&keys).unwrap();
    let old_times = all.iter().find(|k| k.tag == old).unwrap().times;
    let successor = all.iter().find(|k| k.tag != old).expect("a successor");
    let (new, new_times) = (successor.tag, successor.times);
    eprintln!("{said}\nold {old_times:?}\nnew {new_times:?}");
    let status = succeeds(&[
        "dnssec",
        "status",
        "--config",
        config.to_str().unwrap(),
        "--zones",
        zones.to_str().unwrap(),
    ]);
    assert!(status.contains("rollover under way"), "{status}");
    // Run again (from cron, say), it schedules nothing more.
    let again = succeeds(&[
        "dnssec",
        "rollover",
        "example.com",
        "--config",
        config.to_str().unwrap(),
        "--zones",
        zones.to_str().unwrap(),
    ]);
    assert!(again.contains("nothing to do"), "{again}");
    assert_eq!(steerdns::dnssec::keys::load_dir(&keys).unwrap().len(), 2);
    let remove = old_times.remove.expect("the old key is withdrawn");
    assert!(
        new_times.publish > steerdns::clock::now_secs(),
        "published ahead"
    );

    let (ds_old, ds_new) = (ds_of(&keys, old), ds_of(&keys, new));
    let anchor_old = anchor(&dirs[0], "anchor-old.conf", &ds_old);
    let anchor_new = anchor(&dirs[0], "anchor-new.conf", &ds_new);
    let unbounds: Vec<Unbound> = nodes
        .iter()
        .zip(&dirs)
        .map(|(n, d)| {
            let anchors = [ds_old.clone(), ds_new.clone()];
            Unbound::start(&d.join("unbound"), n.dns, &anchors, Mode::Subnet)
        })
        .collect();

    let (mut asked, mut servfail, mut most_keys) = (0, Vec::new(), 0);
    let mut validated = [0u32; 2];
    let end = remove + 3;
    loop {
        let t = steerdns::clock::now_secs();
        if t > end {
            break;
        }
        let started = Instant::now();
        for (i, (n, u)) in nodes.iter().zip(&unbounds).enumerate() {
            for (subnet, cname) in [
                ("100.64.7.0/24", "fastly.cdn.test."),
                ("216.160.83.0/24", "cloudflare.cdn.test."),
            ] {
                let (status, ad, got) = u.ask("www.example.com", "CNAME", Some(subnet));
                asked += 1;
                if status != "NOERROR" || !ad || got != cname {
                    servfail.push(format!("ns{} {t} {subnet}: {status} ad={ad} {got}", i + 1));
                }
            }
            // The parent's DS before the change, and after it.
            if t + 1 < remove {
                let out = delv(&anchor_old, n.dns, false, "www.example.com", "CNAME");
                assert!(
                    out.contains("; fully validated"),
                    "ns{} at {t} with the old DS:\n{out}",
                    i + 1
                );
                validated[0] += 1;
            }
            // A second after the activation at least: every node has signed again.
            if t > new_times.activate + 1 {
                let out = delv(&anchor_new, n.dns, false, "www.example.com", "CNAME");
                assert!(
                    out.contains("; fully validated"),
                    "ns{} at {t} with the new DS:\n{out}",
                    i + 1
                );
                validated[1] += 1;
            }
            most_keys = most_keys.max(short(n.dns, "DNSKEY").len());
        }
        let spent = started.elapsed();
        tokio::time::sleep(Duration::from_millis(250).saturating_sub(spent)).await;
    }
    let logs: String = unbounds.iter().map(Unbound::log).collect();
    assert!(
        servfail.is_empty(),
        "{} of {asked} validated answers failed: {servfail:#?}\n{logs}",
        servfail.len()
    );
    eprintln!("{asked} answers through Unbound, all AD; delv validated {validated:?} times (old DS, new DS)");
    assert!(validated[0] >= 8 && validated[1] >= 8, "{validated:?}");
    assert_eq!(
        most_keys, 2,
        "the DNSKEY set held both keys during the rollover"
    );
    for n in &nodes {
        let keys = short(n.dns, "DNSKEY");
        assert_eq!(keys.len(), 1, "only the new key is left: {keys:?}");
        let cds = short(n.dns, "CDS");
        assert_eq!(cds.len(), 1, "{cds:?}");
        assert!(
            cds[0].starts_with(&format!("{new} 13 2 ")),
            "CDS names the new key: {cds:?}"
        );
        let st = n.state().await;
        assert_eq!(times(&st, old)["remove"], remove, "{:#}", st["dnssec"]);
        let phases: Vec<&str> = st["dnssec"]["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["phase"].as_str().unwrap())
            .collect();
        assert!(
            phases.contains(&"removed") && phases.contains(&"active"),
            "{phases:?}"
        );
    }
    drop(unbounds);
    for n in nodes {
        n.stop().await;
    }
}
