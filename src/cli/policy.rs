//! `steerdns policy status|diff|apply|rollback|halt`: the policy versions of a running server
//! (and its set), over its admin API (`--api`, the token of `--api-token-file` or
//! STEERDNS_API_TOKEN). Exit 0 when done, 1 when the server refused (a stale version,
//! a policy that does not load, nothing to halt), 2 when it could not be asked.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use serde_json::Value;

/// `steerdns policy …`.
#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// The version in force, this node's file, and the set's history.
    Status {
        /// Print `GET /v1/policy` as it is (JSON).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiClient,
    },
    /// Make FILE the set's policy version: based on the version in force (read first,
    /// or --if-match), checked by the server against its inputs, served by every node
    /// from the same instant.
    Apply {
        /// The policy (YAML).
        file: PathBuf,
        /// The version this change is based on (default: the one in force now; a
        /// change based on another is refused).
        #[arg(long, value_name = "VERSION")]
        if_match: Option<String>,
        /// The ticket of the change, recorded in the history and the audit log.
        #[arg(long)]
        ticket: Option<String>,
        /// A staged rollout's stages, in percent of client networks (e.g. 5,25,100).
        #[arg(long, value_name = "PERCENTS")]
        stages: Option<String>,
        /// Seconds per stage (with --stages; default 300).
        #[arg(long, value_name = "SECONDS", requires = "stages")]
        stage_seconds: Option<u64>,
        #[command(flatten)]
        api: ApiClient,
    },
    /// Roll the set back to VERSION (one of the history), by default to the version
    /// before the one in force.
    Rollback {
        version: Option<String>,
        #[arg(long)]
        ticket: Option<String>,
        #[command(flatten)]
        api: ApiClient,
    },
    /// What FILE would change against the version in force (read from the server):
    /// `steerdns diff` of the two, with this host's zones, geo database and probes.
    Diff {
        /// The policy to compare (YAML).
        file: PathBuf,
        /// Print the comparison as JSON.
        #[arg(long)]
        json: bool,
        /// The resolver the networks are asked through (part of the selection key).
        #[arg(long, value_name = "IP", default_value = "127.0.0.1")]
        resolver: std::net::IpAddr,
        #[command(flatten)]
        inputs: super::ContextArgs,
        /// This host's state directory: the beacon samples saved there weigh the
        /// networks by traffic too (as `steerdns diff --state-dir`).
        #[arg(long, value_name = "DIR", default_value = "state/")]
        state_dir: PathBuf,
        #[command(flatten)]
        api: ApiClient,
    },
    /// Halt a staged rollout: every client network back to the version before it.
    Halt {
        /// The ticket of the halt, recorded in the history and the audit log.
        #[arg(long)]
        ticket: Option<String>,
        #[command(flatten)]
        api: ApiClient,
    },
}

/// Where the server's admin API is, and the token for a change.
#[derive(clap::Args, Debug)]
pub struct ApiClient {
    /// The server's admin API (`serve --api`).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9153")]
    api: SocketAddr,
    /// File holding the bearer token (a token with the `policy` verb); or set
    /// STEERDNS_API_TOKEN.
    #[arg(long, value_name = "FILE")]
    api_token_file: Option<PathBuf>,
}

/// What a call gave: its status and JSON body.
struct Answer {
    status: u16,
    body: Value,
}

impl ApiClient {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<(&'static str, Vec<u8>)>,
        if_match: Option<&str>,
    ) -> Result<Answer, String> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .map_err(|e| e.to_string())?;
        let mut req = http.request(method.clone(), format!("http://{}{path}", self.api));
        if method != reqwest::Method::GET {
            let token = super::args::api_token(self.api_token_file.as_deref())
                .map_err(|e| e.to_string())?
                .ok_or("no token: give --api-token-file FILE or set STEERDNS_API_TOKEN")?;
            req = req.bearer_auth(token);
        }
        if let Some((kind, bytes)) = body {
            req = req.header("content-type", kind).body(bytes);
        }
        if let Some(v) = if_match {
            req = req.header("if-match", format!("\"{v}\""));
        }
        let resp = req
            .send()
            .await
            .map_err(|e| format!("cannot reach the API at {}: {e}", self.api))?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Ok(Answer { status, body })
    }
}

/// Runs `steerdns policy …`.
pub(super) async fn run(command: PolicyCommand) -> ExitCode {
    if let PolicyCommand::Diff {
        file,
        json,
        resolver,
        inputs,
        state_dir,
        api,
    } = command
    {
        return diff(file, json, resolver, &inputs, &state_dir, &api).await;
    }
    match ask(command).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// `policy diff FILE`: the version in force, read from the server, against FILE; the
/// exit codes of `steerdns diff`.
async fn diff(
    file: PathBuf,
    json: bool,
    resolver: std::net::IpAddr,
    inputs: &super::ContextArgs,
    state_dir: &std::path::Path,
    api: &ApiClient,
) -> ExitCode {
    let a = match api
        .call(reqwest::Method::GET, "/v1/policy", None, None)
        .await
    {
        Ok(a) if a.status == 200 => a,
        Ok(a) => {
            eprintln!("error: GET /v1/policy answered {}: {}", a.status, a.body);
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let (Some(version), Some(yaml)) = (a.body["version"].as_str(), a.body["yaml"].as_str()) else {
        eprintln!("error: GET /v1/policy has no version and YAML");
        return ExitCode::from(2);
    };
    let old = std::env::temp_dir().join(format!(
        "steerdns-policy-{version}-{}.yaml",
        std::process::id()
    ));
    if let Err(e) = std::fs::write(&old, yaml) {
        eprintln!("error: {}: {e}", old.display());
        return ExitCode::from(2);
    }
    let code = super::offline::diff(inputs, old.clone(), file, resolver, json, Some(state_dir));
    let _ = std::fs::remove_file(&old);
    code
}

/// Whether the server did it (`Err`: it could not be asked).
async fn ask(command: PolicyCommand) -> Result<bool, String> {
    use reqwest::Method;
    match command {
        PolicyCommand::Status { json, api } => {
            let a = api.call(Method::GET, "/v1/policy", None, None).await?;
            if a.status != 200 {
                return refused(&a);
            }
            if json {
                println!("{:#}", a.body);
            } else {
                print!("{}", status_text(&a.body));
            }
            Ok(true)
        }
        PolicyCommand::Apply {
            file,
            if_match,
            ticket,
            stages,
            stage_seconds,
            api,
        } => {
            let yaml = std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            let based_on = match if_match {
                Some(v) => v,
                None => {
                    let a = api.call(Method::GET, "/v1/policy", None, None).await?;
                    match a.body["version"].as_str() {
                        Some(v) if a.status == 200 => v.to_string(),
                        _ => return refused(&a),
                    }
                }
            };
            let mut query = Vec::new();
            if let Some(t) = ticket {
                query.push(format!("ticket={}", encode(&t)));
            }
            if let Some(s) = stages {
                query.push(format!("stages={}", encode(&s)));
                query.push(format!("stage_seconds={}", stage_seconds.unwrap_or(300)));
            }
            let path = match query.is_empty() {
                true => "/v1/policy".to_string(),
                false => format!("/v1/policy?{}", query.join("&")),
            };
            let body = Some(("application/yaml", yaml));
            let a = api.call(Method::POST, &path, body, Some(&based_on)).await?;
            written(&a, &format!("based on {based_on}"))
        }
        PolicyCommand::Rollback {
            version,
            ticket,
            api,
        } => {
            let body = serde_json::json!({ "version": version, "ticket": ticket });
            let body = Some(("application/json", body.to_string().into_bytes()));
            let a = api
                .call(Method::POST, "/v1/policy/rollback", body, None)
                .await?;
            written(&a, "rolled back")
        }
        PolicyCommand::Diff { .. } => Err("`policy diff` is answered by `run`".into()),
        PolicyCommand::Halt { ticket, api } => {
            let body = serde_json::json!({ "ticket": ticket });
            let body = Some(("application/json", body.to_string().into_bytes()));
            let a = api
                .call(Method::POST, "/v1/policy/halt", body, None)
                .await?;
            written(&a, "halted: back to the version before the rollout")
        }
    }
}

/// A new version accepted (printed), or refused.
fn written(a: &Answer, how: &str) -> Result<bool, String> {
    if a.status != 202 {
        return refused(a);
    }
    let version = a.body["version"].as_str().unwrap_or("?");
    if a.body["unchanged"] == true {
        println!("version {version} is in force already: nothing changed");
    } else {
        println!(
            "version {version} accepted ({how}): every node serves it from {}",
            a.body["activate_at"].as_str().unwrap_or("?")
        );
    }
    Ok(true)
}

/// The server's refusal, printed; an unexpected answer is an error.
fn refused(a: &Answer) -> Result<bool, String> {
    let error = a.body["error"]
        .as_str()
        .map(String::from)
        .unwrap_or_else(|| a.body.to_string());
    match a.status {
        400 | 403 | 409 | 412 | 501 => {
            eprintln!("refused ({}): {error}", a.status);
            for e in a.body["errors"].as_array().into_iter().flatten() {
                eprintln!("  {}", e.as_str().unwrap_or_default());
            }
            Ok(false)
        }
        s => Err(format!("the API answered {s}: {error}")),
    }
}

/// `GET /v1/policy` for a person.
fn status_text(p: &Value) -> String {
    let s = |v: &Value| v.as_str().unwrap_or("-").to_string();
    let mut out = format!("version in force: {}\n", s(&p["version"]));
    let node = &p["node"];
    if node["file_differs"] == true {
        out += &format!(
            "this node's policy file: {} (differs from the version in force{})\n",
            s(&node["file_version"]),
            node["file_error"]
                .as_str()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        );
    }
    if let Some(r) = node["refused"].as_object() {
        out += &format!(
            "this node refuses version {}: {}\n",
            s(&r["version"]),
            r["errors"]
                .as_array()
                .map(|e| e.iter().map(s).collect::<Vec<_>>().join("; "))
                .unwrap_or_default()
        );
    }
    if let Some(pending) = node["pending"].as_object() {
        out += &format!(
            "pending: version {} from {}\n",
            s(&pending["version"]),
            crate::clock::rfc3339(pending["activate_at_unix_ms"].as_u64().unwrap_or(0))
        );
    }
    if let Some(r) = p["rollout"].as_object() {
        let counts = |c: &Value| {
            format!(
                "{} answers, {} errors",
                c["answers"].as_u64().unwrap_or(0),
                c["errors"].as_u64().unwrap_or(0)
            )
        };
        out += &format!(
            "staged rollout: {} (from {}), stages {} of {} s, stage {} now: {}% of client networks; ends {}\n  new version: {}; version before: {}\n",
            s(&r["version"]),
            s(&r["from"]),
            r["stages"],
            r["stage_seconds"],
            r["stage"],
            r["share_percent"],
            crate::clock::rfc3339(r["end_unix_ms"].as_u64().unwrap_or(0)),
            counts(&r["canary"]),
            counts(&r["control"]),
        );
    }
    out += "history (newest first):\n";
    for a in p["history"].as_array().into_iter().flatten() {
        out += &format!(
            "  {}  {:<8}  {}  by {}{}{}\n",
            s(&a["version"]),
            s(&a["how"]),
            crate::clock::rfc3339(a["activate_at_unix_ms"].as_u64().unwrap_or(0)),
            s(&a["author"]),
            a["ticket"]
                .as_str()
                .map(|t| format!(" (ticket {t})"))
                .unwrap_or_default(),
            a["based_on"]
                .as_str()
                .map(|b| format!(", after {b}"))
                .unwrap_or_default(),
        );
        if let Some(why) = a["why"].as_str() {
            out += &format!("      why: {why}\n");
        }
    }
    out
}

/// A query value, percent-encoded.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b',' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
