//! `steerdns serve` on the demo policy (`steering.yaml`, `zones/`, `probes/`) in a
//! scratch directory, on free loopback ports below the ephemeral range, with an API
//! token of every right in an owner-only file; killed by its PID and its directory
//! removed when dropped. The book's and the OpenAPI tests run against it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::etcd::free_port;
use super::stack::TOKEN;
use super::{repo, steerdns};

pub struct Demo {
    child: Child,
    /// The geo database and the arguments after the addresses, to start it again.
    geo: PathBuf,
    args: Vec<String>,
    /// The scratch directory, the server's working directory (`server.log` in it).
    pub dir: PathBuf,
    pub dns: u16,
    pub api: u16,
    pub steering: u16,
    /// The file holding [`TOKEN`] (`--api-token-file`).
    pub token: PathBuf,
}

impl Demo {
    /// Starts it in `steerdns-demo-{tag}-{pid}` with the geo database `geo` and `args`
    /// after the addresses; `prepare` may add files to the directory first. Returns once
    /// both HTTP servers accept and the API serves its first state document.
    pub fn start(tag: &str, geo: &Path, args: &[&str], prepare: impl FnOnce(&Path)) -> Demo {
        let dir = std::env::temp_dir().join(format!("steerdns-demo-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["zones", "probes", "state"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        std::fs::copy(repo("steering.yaml"), dir.join("steering.yaml")).unwrap();
        // The demo's probes aim at a loopback port where nothing listens.
        for sub in ["zones", "probes"] {
            for f in std::fs::read_dir(repo(sub)).unwrap() {
                let f = f.unwrap().path();
                if f.is_file() && f.extension().is_some_and(|e| e == "zone" || e == "yaml") {
                    std::fs::copy(&f, dir.join(sub).join(f.file_name().unwrap())).unwrap();
                }
            }
        }
        let token = dir.join("api-token");
        std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
        // `serve` refuses a token file that others may read.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
        prepare(&dir);
        let (dns, api, steering) = (free_port(), free_port(), free_port());
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let child = spawn(&dir, geo, &token, (dns, api, steering), &args);
        let demo = Demo {
            child,
            geo: geo.to_path_buf(),
            args,
            dir,
            dns,
            api,
            steering,
            token,
        };
        demo.wait_ready();
        demo
    }

    /// Kills it (SIGKILL, by its PID) and starts it again in the same directory, on
    /// the same ports, with the same arguments; returns once it serves again.
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let ports = (self.dns, self.api, self.steering);
        self.child = spawn(&self.dir, &self.geo, &self.token, ports, &self.args);
        self.wait_ready();
    }

    /// `GET /metrics`, whole response (headers included).
    pub fn metrics(&self) -> String {
        self.get("/metrics")
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(TcpStream::connect(("127.0.0.1", self.steering)).is_ok()
            && self.state().contains("config_version"))
        {
            assert!(
                Instant::now() < deadline,
                "steerdns does not serve; its log:\n{}",
                std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `GET /v1/state`, whole response, or empty while the API does not answer.
    fn state(&self) -> String {
        self.get("/v1/state")
    }

    fn get(&self, path: &str) -> String {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.api)) else {
            return String::new();
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        let mut out = String::new();
        if s.write_all(request.as_bytes()).is_ok() {
            let _ = s.read_to_string(&mut out);
        }
        out
    }
}

/// `steerdns serve` in `dir` on the ports (DNS, API, steering), logging to
/// `server.log` (appended to, across restarts).
fn spawn(dir: &Path, geo: &Path, token: &Path, ports: (u16, u16, u16), args: &[String]) -> Child {
    let (dns, api, steering) = ports;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("server.log"))
        .unwrap();
    steerdns(&["serve", "--state-dir", "state"])
        .current_dir(dir)
        .arg("--geo")
        .arg(geo)
        .arg("--api-token-file")
        .arg(token)
        .args(["--listen", &format!("127.0.0.1:{dns}")])
        .args(["--api", &format!("127.0.0.1:{api}")])
        .args(["--steering-http", &format!("127.0.0.1:{steering}")])
        .args(args)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("steerdns serve")
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
