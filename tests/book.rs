//! The book (`docs/book/src`) is tested, so that it cannot drift from the code:
//!
//! - the generated reference pages (`reference/cli.md`, `reference/metrics.md`) equal
//!   what `steerdns reference cli|metrics` prints now: a flag or a metric added without
//!   its page, or a page edited by hand, fails;
//! - every ` ```yaml ` block is a policy that passes `steerdns check` beside the demo's
//!   zones, probes and geo database; ` ```yaml,fragment ` is a part of one (its top-level
//!   keys replace the demo policy's, and the result must pass); ` ```yaml,other ` must
//!   only parse as YAML;
//! - every ` ```console ` / ` ```sh ` / ` ```bash ` / ` ```shell ` block that runs
//!   `steerdns`, `curl`, `dig` or `cargo run` is run, in book order, in a copy of the demo
//!   directory against one demo server (unless it is marked `,norun`): a console block's
//!   `$ ` commands must exit 0 (`steerdns` may exit 1: how `check` reports findings), a
//!   script block must exit 0. The documented addresses and the token file are rewritten to the test
//!   server's; `curl` fails on a 400, 404, 405 or 5xx reply (a refusal an example means
//!   to show is a 401, 403, 409, 412, 413 or 429).
//!
//! `docs/book/src/dev/testing.md` (the book's chapter on testing) documents these rules
//! for writers.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::demo::Demo;
use common::*;
use serde::Deserialize as _;

const BOOK: &str = "docs/book/src";

/// A fenced code block of the book.
#[derive(Debug)]
struct Block {
    /// The page, relative to the book's `src`.
    page: String,
    /// The line of the opening fence (1-based).
    line: usize,
    /// The language of the info string (`yaml`, `console`, ...).
    lang: String,
    /// The attributes after it (`fragment`, `other`, `norun`).
    attrs: Vec<String>,
    /// The text, with `{{#include FILE}}` lines replaced by the file.
    text: String,
}

impl Block {
    fn at(&self) -> String {
        format!("{BOOK}/{}:{}", self.page, self.line)
    }

    fn has(&self, attr: &str) -> bool {
        self.attrs.iter().any(|a| a == attr)
    }
}

/// Every page under `docs/book/src`, sorted by path.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "md") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo(BOOK), &mut out);
    assert!(!out.is_empty(), "no page under {BOOK}");
    out
}

/// The fenced blocks of every page, in page order.
fn blocks() -> Vec<Block> {
    let root = repo(BOOK);
    let mut out = Vec::new();
    for path in pages() {
        let page = path.strip_prefix(&root).unwrap().display().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        out.extend(fenced(&page, path.parent().unwrap(), &text));
    }
    out
}

/// The fenced blocks of one page (``` or longer fences; an inner shorter fence is text).
fn fenced(page: &str, dir: &Path, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    // The block being read, and its fence.
    let mut open: Option<(Block, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let ticks = trimmed.chars().take_while(|&c| c == '`').count();
        match open.take() {
            None if ticks >= 3 => {
                let info = trimmed[ticks..].trim();
                let mut parts = info.split([',', ' ']).filter(|s| !s.is_empty());
                let block = Block {
                    page: page.to_string(),
                    line: i + 1,
                    lang: parts.next().unwrap_or("").to_string(),
                    attrs: parts.map(str::to_string).collect(),
                    text: String::new(),
                };
                open = Some((block, "`".repeat(ticks)));
            }
            None => {}
            Some((block, fence)) if ticks >= fence.len() && trimmed[ticks..].trim().is_empty() => {
                out.push(block);
            }
            Some((mut block, fence)) => {
                let include = trimmed
                    .strip_prefix("{{#include ")
                    .and_then(|r| r.trim_end().strip_suffix("}}"));
                match include {
                    Some(file) => {
                        let file = dir.join(file.trim());
                        let included = std::fs::read_to_string(&file).unwrap_or_else(|e| {
                            panic!("{page}:{}: include {}: {e}", i + 1, file.display())
                        });
                        block.text.push_str(&included);
                    }
                    None => {
                        block.text.push_str(line);
                        block.text.push('\n');
                    }
                }
                open = Some((block, fence));
            }
        }
    }
    assert!(open.is_none(), "{page}: a code block is never closed");
    out
}

// === the generated reference pages ===

#[test]
fn the_generated_reference_pages_match_the_binary() {
    let mut stale = Vec::new();
    for page in ["cli", "metrics"] {
        let out = steerdns(&["reference", page]).output().unwrap();
        assert!(
            out.status.success(),
            "steerdns reference {page}: {}",
            printed(&out)
        );
        let now = String::from_utf8(out.stdout).unwrap();
        let path = repo(&format!("{BOOK}/reference/{page}.md"));
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != now {
            let first = now
                .lines()
                .zip(committed.lines().chain(std::iter::repeat("<end of page>")))
                .enumerate()
                .find(|(_, (a, b))| a != b)
                .map(|(i, (a, b))| format!("line {}: generated {a:?}, committed {b:?}", i + 1))
                .unwrap_or_else(|| "the committed page is longer".into());
            stale.push(format!(
                "{} is not what `steerdns reference {page}` prints ({first}); regenerate it: \
                 cargo run --release -- reference {page} > {}",
                path.display(),
                path.display()
            ));
        }
    }
    assert!(stale.is_empty(), "{}", stale.join("\n"));
}

// === policies ===

/// Runs `steerdns check` on `policy` beside the demo's zones, probes and geo database.
fn check(dir: &Path, n: usize, policy: &str) -> Result<(), String> {
    let file = dir.join(format!("policy-{n}.yaml"));
    std::fs::write(&file, policy).unwrap();
    let out = steerdns(&["check", "--config"])
        .arg(&file)
        .args(["--zones", repo("zones").to_str().unwrap()])
        .args(["--probes", repo("probes").to_str().unwrap()])
        .args(["--geo", repo("geo/country.mmdb").to_str().unwrap()])
        .output()
        .unwrap();
    match out.status.success() {
        true => Ok(()),
        false => Err(printed(&out)),
    }
}

/// The demo policy with the fragment's top-level keys in place of its own.
fn merged(fragment: &str) -> Result<String, String> {
    let demo = std::fs::read_to_string(repo(DEMO_POLICY)).unwrap();
    let mut policy: serde_yaml::Mapping = serde_yaml::from_str(&demo).unwrap();
    let part: serde_yaml::Mapping =
        serde_yaml::from_str(fragment).map_err(|e| format!("not a YAML mapping: {e}"))?;
    for (k, v) in part {
        policy.insert(k, v);
    }
    Ok(serde_yaml::to_string(&policy).unwrap())
}

#[test]
fn every_policy_in_the_book_passes_check() {
    let dir = std::env::temp_dir().join(format!("steerdns-book-policies-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A key for the demo zone beside the policies, for the blocks with a `dnssec:`
    // block (`keys: keys/`, relative to the policy).
    let keygen = steerdns(&["dnssec", "keygen", "example.com", "--keys"])
        .arg(dir.join("keys"))
        .output()
        .unwrap();
    assert!(
        keygen.status.success(),
        "dnssec keygen: {}",
        printed(&keygen)
    );
    let yaml: Vec<Block> = blocks().into_iter().filter(|b| b.lang == "yaml").collect();
    let mut failures = Vec::new();
    let mut checked = 0;
    for (n, b) in yaml.iter().enumerate() {
        let result = if b.has("other") {
            serde_yaml::Deserializer::from_str(&b.text)
                .map(|doc| serde_yaml::Value::deserialize(doc).map(|_| ()))
                .collect::<Result<Vec<()>, _>>()
                .map(|_| ())
                .map_err(|e| format!("not YAML: {e}"))
        } else if b.has("fragment") {
            checked += 1;
            merged(&b.text).and_then(|p| check(&dir, n, &p))
        } else {
            checked += 1;
            check(&dir, n, &b.text)
        };
        if let Err(e) = result {
            failures.push(format!("{}: {e}", b.at()));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(checked > 0, "no policy block in the book");
    assert!(
        failures.is_empty(),
        "{} of {} yaml blocks fail:\n{}",
        failures.len(),
        yaml.len(),
        failures.join("\n")
    );
}

// === commands ===

/// The words that make a shell block one the harness runs.
const RUN: [&str; 4] = ["steerdns", "curl", "dig", "target/release/steerdns"];
/// The words after which a word is in command position.
const BEFORE_COMMAND: [&str; 12] = [
    "|", ";", "&&", "||", "(", "$(", "do", "then", "sudo", "time", "xargs", "!",
];

/// Whether `script` runs one of [`RUN`] (or `cargo run`) as a command.
fn runs_ours(script: &str) -> bool {
    script.lines().any(|line| {
        let line = line.trim_start().trim_start_matches("$ ");
        if line.starts_with('#') {
            return false;
        }
        let spaced = line
            .replace("$(", " $( ")
            .replace(['(', ';', '|'], " | ")
            .replace("&&", " && ");
        let words: Vec<&str> = spaced.split_whitespace().collect();
        words.windows(2).any(|w| w == ["cargo", "run"])
            || words.iter().enumerate().any(|(i, w)| {
                RUN.contains(w)
                    && (i == 0
                        || BEFORE_COMMAND.contains(&words[i - 1])
                        || (words[i - 1].contains('=') && !words[i - 1].starts_with('-')))
            })
    })
}

/// A console block as a script: each `$ ` command (with its `\` continuations) runs in
/// one shell and must exit 0, or 1 when it is `steerdns` (how `check` reports
/// findings); `dig` and `curl` say 1 for a usage error, so they get no such leeway.
fn console_script(text: &str) -> String {
    let mut script = String::from("set +e\n");
    let mut command: Option<String> = None;
    for line in text.lines() {
        if let Some(c) = &mut command {
            c.push('\n');
            c.push_str(line);
        } else if let Some(c) = line.strip_prefix("$ ") {
            command = Some(c.to_string());
        } else {
            continue;
        }
        if !line.trim_end().ends_with('\\') {
            let c = command.take().unwrap();
            let first = c
                .split_whitespace()
                .find(|w| !w.contains('='))
                .unwrap_or("");
            let most = if first == "steerdns" || c.starts_with("cargo run") {
                1
            } else {
                0
            };
            script.push_str(&format!(
                "{c}\nrc=$?\nif [ $rc -gt {most} ]; then echo \"exit status $rc: \"{} >&2; exit $rc; fi\n",
                shell_quote(&c)
            ));
        }
    }
    script
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The documented addresses and files, rewritten to the test server's.
fn rewrite(script: &str, dns: u16, api: u16, steering: u16, token: &Path) -> String {
    script
        .replace("cargo run --release -- ", "steerdns ")
        .replace("cargo run --release --", "steerdns")
        .replace("target/release/steerdns", "steerdns")
        .replace("127.0.0.1:5353", &format!("127.0.0.1:{dns}"))
        .replace("-p 5353", &format!("-p {dns}"))
        .replace("127.0.0.1:9153", &format!("127.0.0.1:{api}"))
        .replace("localhost:9153", &format!("127.0.0.1:{api}"))
        .replace("127.0.0.1:8053", &format!("127.0.0.1:{steering}"))
        .replace("/etc/steerdns/api-token", token.to_str().unwrap())
}

/// `curl` for the book: the real one, failing on a reply no example means to show.
const CURL: &str = r#"#!/bin/bash
headers=$(mktemp)
trap 'rm -f "$headers"' EXIT
REAL "$@" -D "$headers"
rc=$?
[ $rc -ne 0 ] && exit $rc
code=$(awk 'toupper($1) ~ /^HTTP\// { c = $2 } END { print c }' "$headers")
case "$code" in
400|404|405|5??) echo "curl (book test): HTTP $code for: curl $*" >&2; exit 22 ;;
esac
exit 0
"#;

/// Where `tool` is on the PATH.
fn which(tool: &str) -> Option<PathBuf> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .ok()?;
    let path = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && path.starts_with('/')).then(|| PathBuf::from(path))
}

/// A demo server ([`Demo`]) for the book's blocks: the geo database in `geo/` as the
/// demo has it (the offline commands read it there), and `bin/` with `steerdns` and the
/// checking `curl` first on the blocks' PATH.
fn demo(tag: &str) -> Demo {
    Demo::start(tag, &repo("geo/country.mmdb"), &[], |dir| {
        for sub in ["geo", "bin"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        std::os::unix::fs::symlink(repo("geo/country.mmdb"), dir.join("geo/country.mmdb")).unwrap();
        std::os::unix::fs::symlink(BIN, dir.join("bin/steerdns")).unwrap();
        let real = which("curl").expect("curl");
        let wrapper = dir.join("bin/curl");
        std::fs::write(&wrapper, CURL.replace("REAL", real.to_str().unwrap())).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    })
}

/// Runs one block against `demo`; the error says what failed.
fn run(demo: &Demo, b: &Block) -> Result<(), String> {
    let body = match b.lang.as_str() {
        "console" => console_script(&b.text),
        _ => format!("set -e -o pipefail\n{}", b.text),
    };
    let script = rewrite(&body, demo.dns, demo.api, demo.steering, &demo.token);
    let path = format!(
        "{}:{}",
        demo.dir.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("timeout")
        .args(["60", "bash", "-c", &script])
        .current_dir(&demo.dir)
        .env("PATH", path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    match out.status.code() {
        Some(0) => Ok(()),
        Some(124) => Err(format!(
            "did not finish within 60 s (mark it `,norun` if it serves):\n{script}"
        )),
        code => Err(format!(
            "exit status {code:?}\n--- script\n{script}\n--- output\n{}",
            printed(&out)
        )),
    }
}

#[test]
fn every_command_in_the_book_runs_against_a_demo_server() {
    for tool in ["dig", "curl", "jq"] {
        if which(tool).is_none() {
            assert!(
                std::env::var("CI").is_err(),
                "{tool} is missing (.ci/run installs it)"
            );
            eprintln!("skipped: {tool} is not installed");
            return;
        }
    }
    let shells = ["console", "sh", "bash", "shell"];
    let runnable: Vec<Block> = blocks()
        .into_iter()
        .filter(|b| shells.contains(&b.lang.as_str()) && !b.has("norun") && runs_ours(&b.text))
        .collect();
    assert!(!runnable.is_empty(), "no runnable command in the book");
    let demo = demo("commands");
    let mut failures = BTreeMap::new();
    for b in &runnable {
        if let Err(e) = run(&demo, b) {
            failures.insert(b.at(), e);
        }
    }
    let report: Vec<String> = failures
        .iter()
        .map(|(at, e)| format!("{at}: {e}"))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} runnable blocks fail:\n{}",
        failures.len(),
        runnable.len(),
        report.join("\n\n")
    );
    eprintln!("{} blocks ran", runnable.len());
}

#[test]
fn the_harness_sees_what_it_must_run() {
    assert!(runs_ours("$ dig @127.0.0.1 -p 5353 www.example.com"));
    assert!(runs_ours("for i in 1 2; do dig +short x; done | sort"));
    assert!(runs_ours("TOKEN=x curl -sS http://127.0.0.1:9153/"));
    assert!(runs_ours("id=$(curl -sS x | jq -r .id)"));
    assert!(runs_ours("cargo run --release -- check"));
    assert!(!runs_ours("sudo systemctl restart steerdns"));
    assert!(!runs_ours("journalctl -u steerdns # steerdns logs"));
    assert!(!runs_ours("ls /etc/steerdns/"));
    let s = console_script("$ steerdns check \\\n  --config x\nok: 1 name\n$ echo hi\nhi\n");
    assert!(
        s.contains("steerdns check \\\n  --config x\nrc=$?\nif [ $rc -gt 1 ]"),
        "{s}"
    );
    assert!(s.contains("echo hi\nrc=$?\nif [ $rc -gt 0 ]"), "{s}");
    assert!(!s.contains("ok: 1 name"));
    let b = fenced(
        "p.md",
        Path::new("."),
        "a\n```yaml,fragment\nx: 1\n```\n````md\n```sh\n````\n",
    );
    assert_eq!(b.len(), 2);
    assert_eq!(
        (b[0].line, b[0].lang.as_str(), b[0].has("fragment")),
        (2, "yaml", true)
    );
    assert_eq!(b[1].text, "```sh\n");
}

// === links into the book from --help and the status page ===

/// The ids of the headings of a book page (mdBook's: lowercase, letters, digits, `-`
/// and `_` kept, spaces made `-`, the rest dropped) and of its `<a id>` elements.
fn anchors(page: &str) -> Vec<String> {
    let text = std::fs::read_to_string(repo(&format!("{BOOK}/{page}")))
        .unwrap_or_else(|e| panic!("{BOOK}/{page}: {e}"));
    let mut ids = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        }
        if let Some(heading) = line.strip_prefix('#').filter(|_| !in_code) {
            let heading = heading.trim_start_matches('#').trim();
            let id: String = heading
                .chars()
                .filter_map(|c| match c {
                    c if c.is_alphanumeric() || c == '_' || c == '-' => {
                        Some(c.to_ascii_lowercase())
                    }
                    c if c.is_whitespace() => Some('-'),
                    _ => None,
                })
                .collect();
            ids.push(id);
        }
        for part in line.split("<a id=\"").skip(1) {
            ids.push(part.split('"').next().unwrap_or("").to_string());
        }
    }
    ids
}

/// Each `PREFIX PAGE.EXT[#ANCHOR]` in `text` that names no page of the book or no
/// heading of it.
fn dead_links(text: &str, prefix: &str, ext: &str) -> (usize, Vec<String>) {
    let mut dead = Vec::new();
    let mut seen = 0;
    for part in text.split(prefix).skip(1) {
        let link: String = part
            .chars()
            .take_while(|c| c.is_alphanumeric() || "/_-.#".contains(*c))
            .collect();
        let Some((page, anchor)) = link
            .split_once(ext)
            .map(|(p, rest)| (format!("{p}.md"), rest))
        else {
            dead.push(format!("{prefix}{link}: not a page"));
            continue;
        };
        seen += 1;
        if !repo(&format!("{BOOK}/{page}")).is_file() {
            dead.push(format!("{prefix}{link}: no page {BOOK}/{page}"));
        } else if let Some(id) = anchor.strip_prefix('#') {
            if !anchors(&page).iter().any(|a| a == id) {
                dead.push(format!("{prefix}{link}: no heading #{id} in {BOOK}/{page}"));
            }
        }
    }
    (seen, dead)
}

#[test]
fn the_help_links_to_pages_of_the_book_that_exist() {
    let mut help = String::new();
    let commands: &[&[&str]] = &[
        &[],
        &["serve"],
        &["agent"],
        &["check"],
        &["simulate"],
        &["explain"],
        &["audit"],
        &["dnssec"],
        &["reference"],
    ];
    for args in commands {
        let out = steerdns(args).arg("--help").output().unwrap();
        assert!(out.status.success(), "steerdns {args:?} --help");
        help.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    let (seen, dead) = dead_links(&help, "docs/book/src/", ".md");
    assert!(
        seen >= commands.len(),
        "only {seen} links to the book in --help"
    );
    assert!(dead.is_empty(), "{}", dead.join("\n"));
}

#[test]
fn the_status_page_links_to_pages_of_the_book_that_exist() {
    let demo = demo("status");
    let mut page = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !page.contains("</html>") {
        assert!(Instant::now() < deadline, "no status page");
        let out = Command::new("curl")
            .args(["-sS", &format!("http://127.0.0.1:{}/", demo.api)])
            .output()
            .unwrap();
        page = String::from_utf8_lossy(&out.stdout).to_string();
    }
    let (seen, dead) = dead_links(&page, "href=\"/book/", ".html");
    assert!(
        seen >= 5,
        "only {seen} links to the book on the status page:\n{page}"
    );
    assert!(dead.is_empty(), "{}", dead.join("\n"));
}

#[test]
fn every_family_a_live_server_serves_is_in_the_metrics_reference() {
    let demo = demo("metrics");
    // A query, so that the steered series exist too.
    let _ = Command::new("dig")
        .args([
            "+short",
            "-p",
            &demo.dns.to_string(),
            "@127.0.0.1",
            "www.example.com",
        ])
        .output();
    let out = Command::new("curl")
        .args(["-sS", &format!("http://127.0.0.1:{}/metrics", demo.api)])
        .output()
        .unwrap();
    let served = String::from_utf8_lossy(&out.stdout).to_string();
    let reference = std::fs::read_to_string(repo(&format!("{BOOK}/reference/metrics.md"))).unwrap();
    let mut missing = Vec::new();
    let mut seen = 0;
    for line in served.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        seen += 1;
        if !reference.contains(&format!("\n## {name}\n\n{kind}, ")) {
            missing.push(format!("{name} ({kind})"));
        }
    }
    assert!(seen > 20, "only {seen} families served:\n{served}");
    assert!(
        missing.is_empty(),
        "served but not in {BOOK}/reference/metrics.md: {}",
        missing.join(", ")
    );
}
