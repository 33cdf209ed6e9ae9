//! A long-distance link in front of a server, for the Rust tests: `tests/wan-relay.py`
//! (the relay the shell drills use) in its own process, started and stopped by PID,
//! adding a one-way delay and jitter to everything from and to loopback clients.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct WanRelay {
    pub addr: SocketAddr,
    profile: PathBuf,
    child: Child,
}

impl WanRelay {
    /// Relays `127.0.0.1:<free port>` to `target`, `delay_ms` one way each direction
    /// (jitter a tenth of it).
    pub fn start(target: SocketAddr, delay_ms: u64) -> WanRelay {
        let port = super::etcd::free_port();
        let profile =
            std::env::temp_dir().join(format!("steerdns-wan-{}-{port}.json", std::process::id()));
        WanRelay::write(&profile, delay_ms);
        let child = Command::new("python3")
            .arg(super::repo("tests/wan-relay.py"))
            .arg("--profile")
            .arg(&profile)
            .arg(format!("tcp:127.0.0.1:{port}={target}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 tests/wan-relay.py");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let wan = WanRelay {
            addr,
            profile,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "wan-relay on {addr} did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        wan
    }

    /// Changes the delay (the relay reads its profile again within 100 ms).
    pub fn set_delay(&self, delay_ms: u64) {
        WanRelay::write(&self.profile, delay_ms);
    }

    fn write(profile: &std::path::Path, delay_ms: u64) {
        let doc = serde_json::json!({
            "from": {"127.0.0.1": {"delay_ms": delay_ms, "jitter_ms": delay_ms / 10}}
        });
        let tmp = profile.with_extension("tmp");
        std::fs::write(&tmp, doc.to_string()).unwrap();
        std::fs::rename(&tmp, profile).unwrap();
    }
}

impl Drop for WanRelay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.profile);
    }
}
