//! A signed copy of the multi-name policy: a scratch directory with the policy plus a
//! `dnssec:` block and one fresh key for example.com (keys are made per run: a key file
//! must be owner-only, which git does not keep).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use steerdns::app::Inputs;

use super::{repo, MULTI_POLICY, TEST_GEO, TEST_ZONES};

pub struct SignedDir {
    pub dir: PathBuf,
    /// `trust-anchors { … static-ds … };` for delv.
    pub anchor: PathBuf,
    /// `trust-anchor: "… DS …"` lines for Unbound.
    pub unbound_anchor: String,
}

impl Drop for SignedDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The multi-name policy signed with a new key of `algorithm` (13 or 15), in a scratch
/// directory named after `tag`; `extra` is appended to the `dnssec:` block.
pub fn signed_dir(tag: &str, algorithm: u8, extra: &str) -> SignedDir {
    let dir = std::env::temp_dir().join(format!("steerdns-dnssec-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let now = steerdns::clock::now_secs();
    steerdns::dnssec::keygen(&dir.join("keys"), "example.com", algorithm, now).unwrap();
    let policy = std::fs::read_to_string(repo(MULTI_POLICY)).unwrap();
    std::fs::write(
        dir.join("steering.yaml"),
        format!("{policy}\ndnssec:\n  keys: keys\n{extra}"),
    )
    .unwrap();
    let ds = steerdns::dnssec::ds(&dir.join("keys"), "example.com", now).unwrap();
    let fields: Vec<Vec<String>> = ds
        .iter()
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect();
    let anchors: String = fields
        .iter()
        .map(|f| {
            format!(
                "trust-anchors {{ {} static-ds {} {} {} \"{}\"; }};\n",
                f[0], f[3], f[4], f[5], f[6]
            )
        })
        .collect();
    let anchor = dir.join("anchor.conf");
    std::fs::write(&anchor, anchors).unwrap();
    let unbound_anchor = ds
        .iter()
        .map(|l| format!("    trust-anchor: \"{l}\"\n"))
        .collect();
    SignedDir {
        dir,
        anchor,
        unbound_anchor,
    }
}

/// The inputs of a signed directory: its policy, the test zones and geo database.
pub fn signed_inputs(dir: &Path) -> Inputs {
    Inputs {
        config: dir.join("steering.yaml"),
        zones: repo(TEST_ZONES),
        geo: repo(TEST_GEO),
        probes: repo("tests/fixtures/no-probes"),
        asn: None,
        api_tokens: None,
    }
}

/// `delv` against `server` with the trust anchor file `anchor`, over UDP (delv's own
/// choice: TCP only on truncation) or TCP: its whole output.
pub fn delv(
    anchor: &Path,
    server: std::net::SocketAddr,
    tcp: bool,
    name: &str,
    qtype: &str,
) -> String {
    let out = std::process::Command::new("delv")
        .arg("-a")
        .arg(anchor)
        .arg("+root=example.com")
        .args(tcp.then_some("+tcp"))
        .arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string(), name, qtype])
        .output()
        .expect("delv (bind9-dnsutils) must be installed: .ci/run installs it");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
