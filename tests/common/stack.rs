//! A whole steerdns (`app::serve`: DNS, prober, controller, API, reload) in a scratch
//! directory, with mock CDNs, for the failover and reload tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hickory_proto::rr::RecordType;
use serde_json::Value;
use steerdns::app::{self, Inputs, ServeOptions, Service};
use steerdns::control::controller::StateFile;
pub use steerdns::control::disk::persist::DiskFaults;
use tokio::time::Instant;

use super::mock_cdn::{MockCdn, Mode};
use super::*;

/// Probe timing used throughout: rounds every 60 ms.
pub const INTERVAL: f64 = 0.06;
/// The admin API token of every test stack.
pub const TOKEN: &str = "test-token-0123456789";

pub struct Stack {
    pub dir: PathBuf,
    pub svc: Service,
    pub dns: SocketAddr,
    pub api: SocketAddr,
    /// Content steering (`--steering-http`).
    pub steering: SocketAddr,
    pub http: reqwest::Client,
}

/// The web origin whose pages may post beacons to a stack (`--beacon-origin`).
pub const PLAYER_ORIGIN: &str = "https://player.example.com";

pub fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("steerdns-stack-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("probes")).unwrap();
    std::fs::create_dir_all(dir.join("zones")).unwrap();
    std::fs::copy(
        repo("tests/fixtures/zones/example.com.zone"),
        dir.join("zones/example.com.zone"),
    )
    .unwrap();
    std::fs::copy(repo(TEST_GEO), dir.join("geo.mmdb")).unwrap();
    dir
}

/// The policy: www.example.com between a and b, 50/50, everywhere; other.example.com
/// on c (so that a third CDN can stay healthy while a and b both fail).
pub fn policy(dir: &Path, steps: &str, step_seconds: f64) {
    let text = format!(
        "hostnames:
  www.example.com:
    ttl: 30
    incident_ttl: 5
    cdns:
      a: {{ cname: a.cdn.test. }}
      b: {{ cname: b.cdn.test. }}
    regions:
      - match: [\"*\"]
        weights: {{ a: 50, b: 50 }}
    failover:
      steps: {steps}
      step_interval_seconds: {step_seconds}
  other.example.com:
    cdns:
      c: {{ cname: c.cdn.test. }}
    regions:
      - match: [\"*\"]
        weights: {{ c: 1 }}
"
    );
    std::fs::write(dir.join("steering.yaml"), text).unwrap();
}

pub fn probe(dir: &Path, cdn: &str, url: &str, quorum: u32) {
    probe_every(dir, cdn, url, quorum, INTERVAL)
}

/// A probe file with its own interval (seconds).
pub fn probe_every(dir: &Path, cdn: &str, url: &str, quorum: u32, interval: f64) {
    let text = format!(
        "url: {url}\nexpect_body: healthy-v1\ninterval_seconds: {interval}\ntimeout_ms: 2000\nmax_ttfb_ms: 1500\nquorum: {quorum}\ndown_after: 2\nup_after: 3\n"
    );
    std::fs::write(dir.join("probes").join(format!("{cdn}.yaml")), text).unwrap();
}

pub fn vantages(dir: &Path, urls: &[String]) {
    let text: String = urls.iter().map(|u| format!("- {u}\n")).collect();
    std::fs::write(
        dir.join("probes/vantages.yaml"),
        if text.is_empty() { "[]\n".into() } else { text },
    )
    .unwrap();
}

/// How a stack runs besides its directory: the defaults are the tests' usual ones.
pub struct Options {
    /// Its vantage point's (node's) name.
    pub vantage: String,
    /// A node of a set (`--etcd`).
    pub cluster: Option<steerdns::control::cluster::ClusterOptions>,
    /// How often the inputs are checked for edits.
    pub reload_poll: Duration,
    /// `--usage-url` and how often it is read.
    pub usage: Option<(reqwest::Url, Duration)>,
    /// `--vantage-address`.
    pub vantage_address: Option<std::net::IpAddr>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            vantage: "test".into(),
            cluster: None,
            reload_poll: Duration::from_millis(50),
            usage: None,
            vantage_address: None,
        }
    }
}

impl Stack {
    pub async fn start(dir: &Path) -> Stack {
        Stack::start_with_disk(dir, DiskFaults::default()).await
    }

    /// As [`Stack::start`], saving the state through `disk` (simulated disk faults
    /// the test can switch on and off).
    pub async fn start_with_disk(dir: &Path, disk: DiskFaults) -> Stack {
        Stack::start_with(dir, disk, Options::default()).await
    }

    /// As [`Stack::start`], checking the inputs for edits every `poll` (the tests' 50
    /// ms elsewhere).
    pub async fn start_polling(dir: &Path, poll: Duration) -> Stack {
        let opts = Options {
            reload_poll: poll,
            ..Options::default()
        };
        Stack::start_with(dir, DiskFaults::default(), opts).await
    }

    /// A node `name` of a set sharing one view through etcd (`serve --etcd`).
    pub async fn start_node(
        dir: &Path,
        name: &str,
        cluster: steerdns::control::cluster::ClusterOptions,
    ) -> Stack {
        let opts = Options {
            vantage: name.into(),
            cluster: Some(cluster),
            ..Options::default()
        };
        Stack::start_with(dir, DiskFaults::default(), opts).await
    }

    /// As [`Stack::start`], reading usage records from `url` every `every`
    /// (`--usage-url`).
    pub async fn start_with_usage_url(dir: &Path, url: &str, every: Duration) -> Stack {
        let opts = Options {
            usage: Some((url.parse().unwrap(), every)),
            ..Options::default()
        };
        Stack::start_with(dir, DiskFaults::default(), opts).await
    }

    /// As [`Stack::start`], the prober's rounds counting as performance samples of
    /// a client at `address` (`--vantage-address`).
    pub async fn start_measuring_from(dir: &Path, address: &str) -> Stack {
        let opts = Options {
            vantage_address: Some(address.parse().unwrap()),
            ..Options::default()
        };
        Stack::start_with(dir, DiskFaults::default(), opts).await
    }

    pub async fn start_with(dir: &Path, disk: DiskFaults, o: Options) -> Stack {
        let inputs = Inputs {
            config: dir.join("steering.yaml"),
            zones: dir.join("zones"),
            geo: dir.join("geo.mmdb"),
            probes: dir.join("probes"),
            asn: None,
            api_tokens: Some(dir.join("api-tokens.yaml")).filter(|p| p.exists()),
        };
        let loaded = app::load(&inputs).unwrap_or_else(|e| panic!("{e}"));
        let opts = ServeOptions {
            api_hosts: Vec::new(),
            api_audit_open: steerdns::control::surfaces::api::ApiLimits::default().audit_open,
            book: steerdns::control::surfaces::book::Book::parse("docs/book/book"),
            inputs: inputs.clone(),
            reload_poll: o.reload_poll,
            listen: vec!["127.0.0.1:0".parse().unwrap()],
            dns: app::DnsOptions {
                udp_sockets: 2,
                ..app::DnsOptions::default()
            },
            api: Some("127.0.0.1:0".parse().unwrap()),
            api_token: Some(TOKEN.into()),
            state: Some(StateFile {
                dir: dir.join("state"),
                max_age: Duration::from_secs(60),
                disk: disk.clone(),
            }),
            vantage: o.vantage,
            vantage_address: o.vantage_address,
            cluster: o.cluster,
            // 127.0.0.1 is a trusted proxy: tests place players with X-Forwarded-For;
            // pages of PLAYER_ORIGIN may post beacons.
            steering: Some(steerdns::control::content::SteeringOptions {
                beacon_origins: vec![PLAYER_ORIGIN.into()],
                ..steerdns::control::content::SteeringOptions::new(
                    "127.0.0.1:0".parse().unwrap(),
                    vec!["127.0.0.1/32".parse().unwrap()],
                )
            }),
            usage_poll: o.usage.as_ref().map_or(Duration::from_secs(30), |u| u.1),
            usage_url: o.usage.map(|u| u.0),
        };
        let svc = app::serve(loaded, &opts).await.unwrap();
        Stack {
            dir: dir.to_path_buf(),
            dns: svc.dns.addrs()[0],
            api: svc.api.unwrap(),
            steering: svc.steering.unwrap(),
            svc,
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
        }
    }

    /// Stops the service and waits until its state saver and audit log have written
    /// what they were handed (`Service::stop`): a stack started next on the same
    /// directory has nothing of this one writing behind it.
    /// A beacon ticket for `name` to a client at `client` (placed with
    /// X-Forwarded-For), from `GET /rum/{name}/ticket`.
    pub async fn ticket(&self, name: &str, client: &str) -> String {
        let r = self
            .http
            .get(format!("http://{}/rum/{name}/ticket", self.steering))
            .header("x-forwarded-for", client)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "a ticket for {client}");
        let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
        v["ticket"].as_str().unwrap().to_string()
    }

    pub async fn stop(self) {
        self.svc.stop().await
    }

    pub async fn get(&self, path: &str) -> Value {
        get_json(&self.http, self.api, path).await
    }

    /// The admin API's answer to GET `path` as text (the status page, `/metrics`).
    pub async fn text(&self, path: &str) -> String {
        get_text(&self.http, self.api, path).await
    }

    pub async fn state(&self) -> Value {
        self.get("/v1/state").await
    }

    /// Rewrites `file` of the stack's directory as [`edit`] does, then waits until a
    /// reload applied it (`/v1/state` shows the reload applied and a new configuration
    /// version): the state then.
    pub async fn edit(&self, file: &str, from: &str, to: &str) -> Value {
        let version = self.state().await["config_version"].clone();
        edit(&self.dir.join(file), from, to);
        self.wait_for("the edit applied", |s| {
            last_reload(s).0 == "applied" && s["config_version"] != version
        })
        .await
    }

    /// Polls the JSON of GET `path` until `pred` holds (10 s at most).
    pub async fn wait_for_path(
        &self,
        path: &str,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        wait_json(&self.http, self.api, path, what, pred).await
    }

    /// Polls `/v1/state` until `pred` holds (10 s at most).
    pub async fn wait_for(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        wait_state(&self.http, self.api, what, pred).await
    }

    /// The own round counter of `cdn`.
    pub async fn round(&self, cdn: &str) -> u64 {
        self.get("/v1/observations").await["observations"][cdn]["round"]
            .as_u64()
            .unwrap_or(0)
    }

    /// Waits until `n` more own rounds of `cdn` have completed.
    pub async fn rounds(&self, cdn: &str, n: u64) {
        let start = self.round(cdn).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.round(cdn).await < start + n {
            assert!(Instant::now() < deadline, "{cdn}: rounds stopped");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Answers to `n` queries for www.example.com, each from another resolver: counts
    /// per CDN, and the TTLs seen.
    pub async fn answers(&self, n: usize) -> (HashMap<String, usize>, Vec<u32>) {
        self.answers_to(query("www.example.com.", RecordType::A), n)
            .await
    }

    /// Answers to `n` queries for www.example.com from the ECS client `addr/source`,
    /// each through another resolver.
    pub async fn answers_from(&self, addr: &str, source: u8, n: usize) -> HashMap<String, usize> {
        self.answers_to(
            query_edns("www.example.com.", RecordType::A, Some((addr, source))),
            n,
        )
        .await
        .0
    }

    /// Answers to `n` queries `q`, each from another resolver: counts per CDN (the
    /// CNAME's first label), and the TTLs seen.
    pub async fn answers_to(
        &self,
        q: hickory_proto::op::Message,
        n: usize,
    ) -> (HashMap<String, usize>, Vec<u32>) {
        let mut counts = HashMap::new();
        let mut ttls = Vec::new();
        for i in 0..n {
            let m = ask_from(self.dns, resolver(i), Proto::Udp, &q).await;
            let cdn = cname_of(&m).split('.').next().unwrap().to_string();
            *counts.entry(cdn).or_insert(0) += 1;
            if !ttls.contains(&m.answers[0].ttl) {
                ttls.push(m.answers[0].ttl);
            }
        }
        (counts, ttls)
    }
}

impl Stack {
    /// Ends the drain override `id` (with the token); the status.
    pub async fn undrain(&self, id: &str) -> u16 {
        let path = format!("/v1/drains/{id}");
        self.call(reqwest::Method::DELETE, &path, None, Some(TOKEN))
            .await
            .0
    }

    /// A request to the admin API with `token` (if any); (status, JSON body).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        token: Option<&str>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("http://{}{path}", self.api));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// The value of the first `/metrics` sample whose line starts with `series`
    /// (labels in the order prometheus prints them: sorted by name).
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let text = self
            .http
            .get(format!("http://{}/metrics", self.api))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))?
            .rsplit(' ')
            .next()?
            .parse()
            .ok()
    }

    /// POST with the stack's token.
    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, Some(body), Some(TOKEN))
            .await
    }
}

pub fn removed(s: &Value, cdn: &str) -> Option<u64> {
    s["failover"]
        .as_array()?
        .iter()
        .find(|f| f["cdn"] == cdn && f["name"] == "www.example.com.")?["removed_percent"]
        .as_u64()
}

pub fn health<'a>(s: &'a Value, cdn: &str) -> &'a Value {
    &s["health"][cdn]
}

pub fn up_verdict(s: &Value, cdn: &str) -> bool {
    health(s, cdn)["last_verdict"]
        .as_str()
        .is_some_and(|v| v.starts_with("Up"))
}

pub async fn healthy_stack(
    tag: &str,
    steps: &str,
    step_seconds: f64,
) -> (Stack, MockCdn, MockCdn, MockCdn) {
    healthy_stack_every(tag, steps, step_seconds, INTERVAL).await
}

pub async fn healthy_stack_every(
    tag: &str,
    steps: &str,
    step_seconds: f64,
    interval: f64,
) -> (Stack, MockCdn, MockCdn, MockCdn) {
    healthy_stack_probing(tag, steps, step_seconds, interval, &["a", "b", "c"]).await
}

/// As [`healthy_stack_every`], with probe files for the `probed` CDNs only. With `a`
/// alone probed, each of its rounds is a verdict at once (with other CDNs probed, a
/// first failure waits for their next rounds), so scripted rounds
/// ([`MockCdn::script`]) are verdicts one for one.
pub async fn healthy_stack_probing(
    tag: &str,
    steps: &str,
    step_seconds: f64,
    interval: f64,
    probed: &[&str],
) -> (Stack, MockCdn, MockCdn, MockCdn) {
    let dir = scratch(tag);
    let (a, b, c) = (
        MockCdn::start(Mode::Healthy).await,
        MockCdn::start(Mode::Healthy).await,
        MockCdn::start(Mode::Healthy).await,
    );
    policy(&dir, steps, step_seconds);
    for (cdn, m) in [("a", &a), ("b", &b), ("c", &c)] {
        if probed.contains(&cdn) {
            probe_every(&dir, cdn, &m.url("/_health/v1.txt"), 1, interval);
        }
    }
    let stack = Stack::start(&dir).await;
    stack
        .wait_for("every probed CDN up", |s| {
            probed.iter().all(|c| up_verdict(s, c))
        })
        .await;
    (stack, a, b, c)
}

/// Round verdicts the server has fed `cdn`'s hysteresis since it started: (down, up,
/// unknown).
pub fn verdicts(s: &Value, cdn: &str) -> (u64, u64, u64) {
    let v = &health(s, cdn)["verdicts"];
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    (n("down"), n("up"), n("unknown"))
}

/// When `cdn`'s current failover step of www.example.com was taken, by the server's
/// clock (Unix ms).
pub fn stepped_at(s: &Value, cdn: &str) -> u64 {
    s["failover"]
        .as_array()
        .and_then(|f| {
            f.iter()
                .find(|f| f["cdn"] == cdn && f["name"] == "www.example.com.")
        })
        .and_then(|f| f["since_unix_ms"].as_u64())
        .unwrap_or_else(|| panic!("no failover step of {cdn}: {s:#}"))
}

/// The wall clock in Unix milliseconds, as the server's `*_unix_ms` fields read.
pub fn unix_ms() -> u64 {
    steerdns::clock::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `GET http://{api}{path}`, the body as JSON.
pub async fn get_json(http: &reqwest::Client, api: SocketAddr, path: &str) -> Value {
    let body = http
        .get(format!("http://{api}{path}"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    serde_json::from_slice(&body).unwrap()
}

/// `GET http://{api}{path}`, the body as text (the status page, `/metrics`).
pub async fn get_text(http: &reqwest::Client, api: SocketAddr, path: &str) -> String {
    let r = http
        .get(format!("http://{api}{path}"))
        .send()
        .await
        .unwrap();
    r.text().await.unwrap()
}

/// The last reload's outcome in a `/v1/state` document: its result (`applied`,
/// `refused`; empty before the first reload) and its errors as JSON text.
pub fn last_reload(s: &Value) -> (&str, String) {
    (
        s["last_reload"]["result"].as_str().unwrap_or(""),
        s["last_reload"]["errors"].to_string(),
    )
}

/// Polls `/v1/state` of the API at `api` until `pred` holds (10 s at most).
pub async fn wait_state(
    http: &reqwest::Client,
    api: SocketAddr,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    wait_json(http, api, "/v1/state", what, pred).await
}

/// Polls the JSON of GET `path` until `pred` holds (10 s at most).
pub async fn wait_json(
    http: &reqwest::Client,
    api: SocketAddr,
    path: &str,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = get_json(http, api, path).await;
        if pred(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; state:\n{s:#}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The input flags of a stack's directory `dir` (`--config`, `--zones`, `--geo`,
/// `--probes`, `--state-dir` on its files), for a `steerdns` command run on them.
pub fn stack_inputs(dir: &Path) -> Vec<std::ffi::OsString> {
    let files = [
        ("--config", "steering.yaml"),
        ("--zones", "zones"),
        ("--geo", "geo.mmdb"),
        ("--probes", "probes"),
        ("--state-dir", "state"),
    ];
    files
        .iter()
        .flat_map(|(flag, file)| [flag.into(), dir.join(file).into_os_string()])
        .collect()
}

/// `steerdns explain NAME --client CLIENT` run offline in a stack's directory `dir`,
/// on its files and the state it saved (`--geo geo.mmdb --state-dir state`, the policy,
/// zones and probes by their default names): its output, once it succeeded.
pub fn explain_offline(dir: &Path, name: &str, client: &str) -> String {
    let out = steerdns(&["explain", name, "--client", client])
        .current_dir(dir)
        .args(["--geo", "geo.mmdb", "--state-dir", "state"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "explain: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}
