//! A real etcd for the tests of a set of nameservers: three members on loopback ports,
//! data in a temporary directory, each started and stopped by PID (also when a test
//! fails: `Drop`). Needs `etcd` and `etcdctl` (Debian `etcd-server`, `etcd-client`);
//! without them a test skips with a message, except under CI (`CI=true`), where it
//! fails.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

/// Whether `program` runs (is on PATH).
pub fn have(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// `None` (and a message) when `etcd` is missing here; a failure under CI.
pub fn require_etcd(test: &str) -> bool {
    if have("etcd") && have("etcdctl") {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: etcd and etcdctl are required in CI (apt-get install -y etcd-server etcd-client)");
    }
    eprintln!(
        "SKIPPED {test}: etcd/etcdctl not installed (apt-get install -y etcd-server etcd-client)"
    );
    false
}

/// A free loopback port (bound, then released).
/// A port free now on 127.0.0.1, from 20000-31999: below the kernel's ephemeral range
/// (32768 and up by default), so that no outgoing connection (of this suite, or of a
/// second suite run beside it) takes it before the process meant for it binds it. With
/// `bind(0)`, an etcd member once found its port taken and never started (two suites
/// at once, 2026-12-02). Each process walks the range from its own point.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7919);
    for _ in 0..12_000 {
        let n = start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed));
        let port = 20_000 + (n % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 20000-31999")
}

struct Member {
    name: String,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

/// Three etcd members on loopback.
pub struct EtcdSet {
    dir: PathBuf,
    members: Vec<Member>,
    cluster: String,
    /// `root`'s password once authentication is on.
    pub root_password: Option<String>,
}

impl EtcdSet {
    /// Starts three members and waits until every one answers with a leader; a member
    /// that exits meanwhile (its port taken after all) has the set started again on
    /// other ports, up to three times.
    pub async fn start(tag: &str) -> EtcdSet {
        for attempt in 1..=3 {
            let mut set = EtcdSet::start_once(tag);
            match set.wait_all(Duration::from_secs(30)).await {
                Ok(()) => return set,
                Err(why) if attempt < 3 => eprintln!("etcd: {why}; starting again on other ports"),
                Err(why) => panic!("etcd did not start: {why}; logs in {}", set.dir.display()),
            }
        }
        unreachable!()
    }

    fn start_once(tag: &str) -> EtcdSet {
        let dir = std::env::temp_dir().join(format!("steerdns-etcd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let members: Vec<Member> = (1..=3)
            .map(|i| Member {
                name: format!("m{i}"),
                client: free_port(),
                peer: free_port(),
                child: None,
            })
            .collect();
        let cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut set = EtcdSet {
            dir,
            members,
            cluster,
            root_password: None,
        };
        for i in 0..3 {
            set.spawn(i);
        }
        set
    }

    /// Waits until every member answers a linearizable read; `Err` when one exits
    /// first (or the time is up), with its log's last line.
    async fn wait_all(&mut self, within: Duration) -> Result<(), String> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let deadline = Instant::now() + within;
        let mut ready = [false; 3];
        while ready.iter().any(|r| !r) {
            for (i, done) in ready.iter_mut().enumerate() {
                if *done {
                    continue;
                }
                let m = &mut self.members[i];
                if let Some(Ok(Some(status))) = m.child.as_mut().map(|c| c.try_wait()) {
                    let log = std::fs::read_to_string(self.dir.join(format!("{}.log", m.name)))
                        .unwrap_or_default();
                    let last = log.lines().last().unwrap_or("").to_string();
                    return Err(format!("member {} exited ({status}): {last}", m.name));
                }
                let e = format!("http://127.0.0.1:{}", m.client);
                if let Ok(r) = http
                    .post(format!("{e}/v3/kv/range"))
                    .body(r#"{"key":"AA=="}"#)
                    .send()
                    .await
                {
                    *done = r.text().await.is_ok_and(|t| t.contains("\"header\""));
                }
            }
            if Instant::now() > deadline {
                return Err(format!("members ready after {within:?}: {ready:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    fn spawn(&mut self, i: usize) {
        let m = &self.members[i];
        let log = std::fs::File::create(self.dir.join(format!("{}.log", m.name))).unwrap();
        let child = Command::new("etcd")
            .args([
                "--name",
                &m.name,
                "--data-dir",
                &self.dir.join(&m.name).display().to_string(),
                "--listen-client-urls",
                &format!("http://127.0.0.1:{}", m.client),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{}", m.client),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{}", m.peer),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{}", m.peer),
                "--initial-cluster",
                &self.cluster,
                "--initial-cluster-state",
                "new",
                // Fast elections on loopback; generous enough for a loaded machine.
                "--heartbeat-interval",
                "100",
                "--election-timeout",
                "1000",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd starts");
        self.members[i].child = Some(child);
    }

    /// The client URLs of the members.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client))
            .collect()
    }

    /// How node `node` of a set of `members` joins this etcd directly, without
    /// authentication (`--etcd-insecure`), under `/steerdns/`.
    pub fn node_options(
        &self,
        node: &str,
        members: &[&str],
    ) -> steerdns::control::cluster::ClusterOptions {
        steerdns::control::cluster::ClusterOptions {
            etcd: steerdns::control::cluster::EtcdOptions {
                endpoints: self
                    .endpoints()
                    .iter()
                    .map(|e| e.parse().unwrap())
                    .collect(),
                insecure: true,
                ..Default::default()
            },
            node: node.into(),
            prefix: "/steerdns/".into(),
            members: members.iter().map(|m| m.to_string()).collect(),
        }
    }

    pub fn client_addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.members[i].client))
    }

    /// Kills member `i` (by PID, SIGKILL) and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Freezes member `i` (SIGSTOP by its PID): it holds connections and answers
    /// nothing, a hung member.
    pub fn stop(&self, i: usize) {
        self.signal(i, "-STOP");
    }

    /// Lets member `i` run again (SIGCONT).
    pub fn cont(&self, i: usize) {
        self.signal(i, "-CONT");
    }

    fn signal(&self, i: usize, sig: &str) {
        let pid = self.members[i].child.as_ref().expect("member running").id();
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill {sig} {pid}");
    }

    /// Starts member `i` again on its data directory.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
    }

    /// Waits until a linearizable read succeeds on some member.
    pub async fn wait_healthy(&self, within: Duration) {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let deadline = Instant::now() + within;
        loop {
            for e in self.endpoints() {
                let r = http
                    .post(format!("{e}/v3/kv/range"))
                    .body(r#"{"key":"AA=="}"#)
                    .send()
                    .await;
                if let Ok(r) = r {
                    if let Ok(t) = r.text().await {
                        if t.contains("\"header\"") {
                            return;
                        }
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not become healthy; logs in {}",
                self.dir.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Turns authentication on with one user per member of the set, each with the
    /// role the book gives it: a node (`nodes`) reads the prefix and writes its own
    /// observations, its own audit entries and audit head, and the shared keys; an agent (`agents`) writes its own
    /// observations only. Passwords are `pw-{name}`.
    pub fn enable_member_roles(&mut self, prefix: &str, nodes: &[&str], agents: &[&str]) {
        let root = self.add_root();
        for (name, node) in nodes
            .iter()
            .map(|n| (n, true))
            .chain(agents.iter().map(|a| (a, false)))
        {
            let role = format!("steerdns-{name}");
            self.etcdctl(&["role", "add", &role]);
            let grant = |perm: &str, key: &str| {
                let args = [
                    "role",
                    "grant-permission",
                    &role,
                    "--prefix=true",
                    perm,
                    key,
                ];
                self.etcdctl(&args);
            };
            grant("readwrite", &format!("{prefix}obs/{name}/"));
            if node {
                grant("read", prefix);
                grant("readwrite", &format!("{prefix}timeline/"));
                grant("readwrite", &format!("{prefix}drain/"));
                // `freeze` and the tenants' `freeze/{tenant}`.
                grant("readwrite", &format!("{prefix}freeze"));
                grant("readwrite", &format!("{prefix}audit/{name}/"));
                grant("readwrite", &format!("{prefix}usage/"));
                grant("readwrite", &format!("{prefix}commit/"));
                grant("readwrite", &format!("{prefix}perf/{name}/"));
                grant("readwrite", &format!("{prefix}shift/"));
                grant("readwrite", &format!("{prefix}cookie"));
                grant("readwrite", &format!("{prefix}policy"));
                grant("readwrite", &format!("{prefix}versions/"));
                // Its audit head: that one key (not a prefix: `ns1` would cover `ns10`).
                let head = format!("{prefix}audit-head/{name}");
                self.etcdctl(&["role", "grant-permission", &role, "readwrite", &head]);
            }
            self.etcdctl(&[
                "user",
                "add",
                &format!("{name}:pw-{name}"),
                "--interactive=false",
            ]);
            self.etcdctl(&["user", "grant-role", name, &role]);
        }
        self.etcdctl(&["auth", "enable"]);
        self.root_password = Some(root.into());
    }

    /// `etcdctl put KEY VALUE` as `user` (`None`: root once authentication is on);
    /// whether etcd took it, and what etcdctl said.
    pub fn put_as(&self, user: Option<(&str, &str)>, key: &str, value: &str) -> (bool, String) {
        self.ctl_as(user, &["put", key, value])
    }

    /// Writes `kvs` as `user` (`None`: root once authentication is on), 128 to a
    /// transaction through etcd's JSON gateway: thousands of keys in a few seconds, as
    /// a hostile member holding that user's password could. Panics when etcd refuses.
    pub async fn put_many_as(&self, user: Option<(&str, &str)>, kvs: &[(String, String)]) {
        self.put_many_in(user, kvs, 128).await
    }

    /// As [`EtcdSet::put_many_as`], `per_txn` puts to a transaction (1: every put its own
    /// revision, as a member rewriting one key over and over would).
    pub async fn put_many_in(
        &self,
        user: Option<(&str, &str)>,
        kvs: &[(String, String)],
        per_txn: usize,
    ) {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let http = reqwest::Client::new();
        let base = format!("http://{}", self.client_addr(0));
        let login = match (user, &self.root_password) {
            (Some((u, pw)), _) => Some((u.to_string(), pw.to_string())),
            (None, Some(pw)) => Some(("root".to_string(), pw.clone())),
            (None, None) => None,
        };
        let token = match login {
            Some((name, password)) => {
                let body = serde_json::json!({ "name": name, "password": password });
                let r = http
                    .post(format!("{base}/v3/auth/authenticate"))
                    .body(body.to_string())
                    .send()
                    .await
                    .unwrap();
                let v: serde_json::Value =
                    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
                v["token"].as_str().map(String::from)
            }
            None => None,
        };
        for chunk in kvs.chunks(per_txn.max(1)) {
            let ops: Vec<serde_json::Value> = chunk
                .iter()
                .map(|(k, v)| serde_json::json!({"request_put": {"key": b64(k), "value": b64(v)}}))
                .collect();
            let mut req = http
                .post(format!("{base}/v3/kv/txn"))
                .body(serde_json::json!({ "success": ops }).to_string());
            if let Some(t) = &token {
                req = req.header("Authorization", t);
            }
            let r = req.send().await.unwrap();
            let status = r.status();
            let text = r.text().await.unwrap();
            assert!(
                status.is_success(),
                "txn of {} puts: {status} {text}",
                chunk.len()
            );
        }
    }

    /// Deletes every key under `prefix` as root (or anonymously without
    /// authentication).
    pub fn delete_prefix(&self, prefix: &str) {
        let (ok, said) = self.ctl_as(None, &["del", "--prefix", prefix]);
        assert!(ok, "del --prefix {prefix}: {said}");
    }

    /// `etcdctl del KEY` as root (or anonymously without authentication).
    pub fn delete(&self, key: &str) {
        let (ok, said) = self.ctl_as(None, &["del", key]);
        assert!(ok, "del {key}: {said}");
    }

    fn ctl_as(&self, user: Option<(&str, &str)>, args: &[&str]) -> (bool, String) {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoints().join(",")));
        match (user, &self.root_password) {
            (Some((u, pw)), _) => {
                cmd.arg(format!("--user={u}:{pw}"));
            }
            (None, Some(pw)) => {
                cmd.arg(format!("--user=root:{pw}"));
            }
            (None, None) => {}
        }
        let out = cmd.args(args).output().expect("etcdctl runs");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), said)
    }

    fn etcdctl(&self, args: &[&str]) {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoints().join(",")));
        if let Some(pw) = &self.root_password {
            cmd.arg(format!("--user=root:{pw}"));
        }
        let out = cmd.args(args).output().expect("etcdctl runs");
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Adds `root` (for after authentication is on); its password.
    fn add_root(&self) -> &'static str {
        let root = "root-pw-0123";
        self.etcdctl(&[
            "user",
            "add",
            &format!("root:{root}"),
            "--interactive=false",
        ]);
        self.etcdctl(&["user", "grant-role", "root", "root"]);
        root
    }

    /// Turns authentication on: `root`, and `user` with read-write on `prefix` only.
    pub fn enable_auth(&mut self, user: &str, password: &str, prefix: &str) {
        let root = self.add_root();
        self.etcdctl(&["role", "add", "steerdns"]);
        self.etcdctl(&[
            "role",
            "grant-permission",
            "steerdns",
            "--prefix=true",
            "readwrite",
            prefix,
        ]);
        self.etcdctl(&[
            "user",
            "add",
            &format!("{user}:{password}"),
            "--interactive=false",
        ]);
        self.etcdctl(&["user", "grant-role", user, "steerdns"]);
        self.etcdctl(&["auth", "enable"]);
        self.root_password = Some(root.into());
    }
}

impl Drop for EtcdSet {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
