//! A validating Unbound on a free loopback port in front of a steerdns under test:
//! `example.com` is a stub zone pointing at it, the trust anchors are the DS records
//! given. Started with its own configuration in the test's directory, stopped (by its
//! PID) when dropped.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub struct Unbound {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
    conf: PathBuf,
}

/// How Unbound asks.
pub enum Mode {
    /// `subnetcache validator iterator`: clients' ECS passed on, answers cached per
    /// subnet.
    Subnet,
    /// `validator iterator` with `aggressive-nsec: yes`: no ECS, denials synthesized
    /// from cached NSEC records (RFC 8198).
    Aggressive,
}

impl Unbound {
    /// Unbound in `dir` (its configuration, log and control socket there) asking
    /// `node` for example.com, trusting `anchors` (`example.com. IN DS …` lines).
    pub fn start(dir: &Path, node: SocketAddr, anchors: &[String], mode: Mode) -> Unbound {
        std::fs::create_dir_all(dir).unwrap();
        let port = super::etcd::free_port();
        let trust: String = anchors
            .iter()
            .map(|ds| format!("    trust-anchor: \"{ds}\"\n"))
            .collect();
        let modules = match mode {
            Mode::Subnet => {
                "    module-config: \"subnetcache validator iterator\"\n    send-client-subnet: 127.0.0.1\n"
            }
            Mode::Aggressive => "    module-config: \"validator iterator\"\n",
        };
        let conf = format!(
            "server:
    interface: 127.0.0.1
    port: {port}
    do-daemonize: no
    username: \"\"
    chroot: \"\"
    directory: \"{dir}\"
    pidfile: \"\"
    use-syslog: no
    logfile: \"{dir}/unbound.log\"
    verbosity: 1
    val-log-level: 2
    do-not-query-localhost: no
{modules}    qname-minimisation: no
    aggressive-nsec: yes
    prefetch: no
    num-threads: 1
    extended-statistics: yes
{trust}
remote-control:
    control-enable: yes
    control-interface: \"{dir}/control.sock\"
    control-use-cert: no

stub-zone:
    name: \"example.com.\"
    stub-addr: 127.0.0.1@{node_port}
",
            dir = dir.display(),
            node_port = node.port()
        );
        let file = dir.join("unbound.conf");
        std::fs::write(&file, conf).unwrap();
        let child = Command::new("unbound")
            .arg("-d")
            .arg("-c")
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("unbound starts");
        let unbound = Unbound {
            child,
            port,
            dir: dir.to_path_buf(),
            conf: file,
        };
        // Ready once it accepts a TCP connection (it binds UDP and TCP together).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "unbound did not start:\n{}",
                unbound.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        unbound
    }

    /// `dig` through this Unbound: (status, AD set, the last answer record's data).
    pub fn ask(&self, name: &str, qtype: &str, subnet: Option<&str>) -> (String, bool, String) {
        let out = Command::new("dig")
            .args(["@127.0.0.1", "-p", &self.port.to_string()])
            .args([name, qtype, "+dnssec", "+time=2", "+tries=1"])
            .args(subnet.map(|s| format!("+subnet={s}")))
            .output()
            .expect("dig runs");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let status = text
            .split("status: ")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .unwrap_or("no answer")
            .to_string();
        let ad = text
            .lines()
            .find(|l| l.contains(";; flags:"))
            .is_some_and(|l| l.split(';').nth(2).is_some_and(|f| f.contains(" ad")));
        let data = text
            .lines()
            .rfind(|l| l.contains(&format!("\t{qtype}\t")) && !l.starts_with(';'))
            .and_then(|l| l.split_whitespace().last())
            .unwrap_or("")
            .to_string();
        (status, ad, data)
    }

    /// A counter of `unbound-control stats_noreset` (0 when absent).
    pub fn stat(&self, name: &str) -> u64 {
        let out = Command::new("unbound-control")
            .arg("-c")
            .arg(&self.conf)
            .arg("stats_noreset")
            .output()
            .expect("unbound-control runs");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("unbound.log")).unwrap_or_default()
    }
}

impl Drop for Unbound {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
