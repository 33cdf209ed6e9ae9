//! The commands that read files and print, then exit: `check`, `diff` (two policies
//! compared), `explain` (from the saved state), `dnssec` and `audit` (`verify_report`
//! behind `audit verify`), and the hidden `man`.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::CommandFactory;

use super::args::{AuditCommand, ContextArgs, DnssecCommand};
use super::serve::load_or_report;
use super::Cli;
use crate::app::Inputs;
use crate::control::decide::diff::{Traffic, TrafficFrom};
use crate::control::decide::state::ControlState;
use std::collections::HashMap;

/// Prints what `audit verify` found; the exit code.
pub(super) fn verify_report(files: &[PathBuf]) -> ExitCode {
    match crate::control::disk::audit::verify(files) {
        Ok(v) => {
            println!(
                "ok: {} entries, seq {} to {}, last hash {}",
                v.entries, v.first_seq, v.last_seq, v.last_hash
            );
            ExitCode::SUCCESS
        }
        Err(broken) => {
            eprintln!("{broken}");
            ExitCode::FAILURE
        }
    }
}

/// `dnssec rollover` and `dnssec status`.
pub(super) fn dnssec(command: DnssecCommand) -> ExitCode {
    let now = crate::clock::now_secs();
    let done = match command {
        DnssecCommand::Keygen {
            zone,
            algorithm,
            keys,
        } => crate::dnssec::keygen(&keys, &zone, algorithm, now)
            .map(|path| println!("{}", path.display())),
        DnssecCommand::Rollover {
            zone,
            now: start_now,
            config,
            zones,
        } => crate::dnssec::rollover_command(&config, &zones, &zone, now, start_now)
            .map(|text| println!("{text}")),
        DnssecCommand::Status { config, zones } => {
            crate::dnssec::status_command(&config, &zones, now).map(|text| print!("{text}"))
        }
        DnssecCommand::Ds { zone, keys } => crate::dnssec::ds(&keys, &zone, now).map(|lines| {
            for l in lines {
                println!("{l}");
            }
        }),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("steerdns: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `audit verify` and `audit tail`.
pub(super) fn audit(command: AuditCommand) -> ExitCode {
    use crate::control::disk::audit;
    match command {
        AuditCommand::Verify {
            mut files,
            expect_head,
        } => {
            // The live log alone: with its rotated files, oldest first.
            if let [one] = files.as_slice() {
                let all = audit::files(one);
                if all.len() > 1 && all.last() == Some(one) {
                    files = all;
                }
            }
            let verified = verify_report(&files);
            match expect_head {
                Some(head) if verified == ExitCode::SUCCESS => {
                    match audit::check_head(&files, &head) {
                        Ok(()) => {
                            println!("ok: the head {head} is in the files");
                            ExitCode::SUCCESS
                        }
                        Err(e) => {
                            eprintln!("{e}");
                            ExitCode::FAILURE
                        }
                    }
                }
                _ => verified,
            }
        }
        AuditCommand::Tail { state_dir, lines } => {
            let files = audit::files(&state_dir.join("audit.jsonl"));
            if files.is_empty() {
                eprintln!(
                    "steerdns: no audit log in {} (serve --state-dir)",
                    state_dir.display()
                );
                return ExitCode::FAILURE;
            }
            let mut last: std::collections::VecDeque<String> = Default::default();
            for f in &files {
                let Ok(text) = std::fs::read_to_string(f) else {
                    eprintln!("steerdns: cannot read {}", f.display());
                    return ExitCode::FAILURE;
                };
                for line in text.lines().filter(|l| !l.trim().is_empty()) {
                    if last.len() == lines {
                        last.pop_front();
                    }
                    last.push_back(line.to_string());
                }
            }
            for line in last.iter().filter(|_| lines > 0) {
                println!("{}", audit::human(line));
            }
            ExitCode::SUCCESS
        }
    }
}

/// The manual pages, from the command-line definition: every visible subcommand gets
/// its own page in `dir`; without `dir`, the main page goes to standard output.
pub(super) fn man(dir: Option<&std::path::Path>) -> ExitCode {
    let written = match dir {
        Some(dir) => clap_mangen::generate_to(Cli::command(), dir)
            .with_context(|| format!("cannot write the manual pages into {}", dir.display())),
        None => clap_mangen::Man::new(Cli::command())
            .render(&mut std::io::stdout())
            .context("cannot write the manual page"),
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("steerdns: {e:#}");
            ExitCode::FAILURE
        }
    }
}

pub(super) fn check(inputs: Inputs) -> ExitCode {
    let Some(loaded) = load_or_report(&inputs) else {
        return ExitCode::FAILURE;
    };
    println!(
        "ok: {} steered name(s) [{}], {} zone(s) [{}], geo database {} ({}, {} networks)",
        loaded.policy.hosts.len(),
        loaded
            .policy
            .hosts
            .iter()
            .map(|h| h.name.to_string())
            .collect::<Vec<_>>()
            .join(" "),
        loaded.zones.origins().count(),
        loaded
            .zones
            .origins()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" "),
        loaded.geo.path().display(),
        loaded.geo.database_type(),
        loaded.geo.networks(),
    );
    for (tenant, names) in loaded.policy.tenants() {
        println!("tenant {tenant}: {}", names.join(" "));
    }
    if inputs.api_tokens.is_some() {
        for t in &loaded.tokens.list {
            println!("{}", token_line(t));
        }
    }
    ExitCode::SUCCESS
}

/// `diff OLD NEW`: both policies loaded against one set of files (one geo database
/// read once), compared, printed; 0 when every answer is alike, 1 when one changes, 2
/// when either does not load. The recorded traffic in `state_dir`, if any, weighs the
/// networks a second time.
pub(super) fn diff(
    context: &ContextArgs,
    old: PathBuf,
    new: PathBuf,
    resolver: IpAddr,
    json: bool,
    state_dir: Option<&std::path::Path>,
) -> ExitCode {
    const ERROR: u8 = 2;
    let mut cache = crate::app::GeoCache::default();
    let mut shown = std::collections::HashSet::new();
    let mut load = |config: PathBuf| {
        let loaded = crate::app::load_cached(&context.with_policy(config), &mut cache);
        let issues = match &loaded {
            Ok(l) => &l.warnings,
            Err(issues) => issues,
        };
        // The zones' and probes' warnings once, not once per policy.
        for w in issues.warnings() {
            if shown.insert(w.to_string()) {
                eprintln!("{w}");
            }
        }
        // As `check` prints them; the same errors (of the zones, say) once.
        if let Err(issues) = &loaded {
            let text = issues.to_string();
            if shown.insert(text.clone()) {
                eprint!("{text}");
            }
        }
        loaded.ok()
    };
    let (old, new) = (load(old), load(new));
    let (Some(old), Some(new)) = (old, new) else {
        eprintln!("steerdns: cannot compare: fix the errors above (`steerdns check` lists them)");
        return ExitCode::from(ERROR);
    };
    let traffic = match state_dir {
        Some(dir) => recorded_traffic(dir),
        None => Traffic {
            from: TrafficFrom {
                note: "no state directory given".into(),
                ..TrafficFrom::default()
            },
            ..Traffic::default()
        },
    };
    let d = crate::control::decide::diff::diff(
        &old,
        &new,
        resolver,
        tokio::time::Instant::now(),
        crate::clock::now_ms(),
        &traffic,
    );
    if json {
        match serde_json::to_string_pretty(&d) {
            Ok(text) => println!("{text}"),
            Err(err) => {
                eprintln!("steerdns: cannot write the comparison as JSON: {err}");
                return ExitCode::from(ERROR);
            }
        }
    } else {
        print!("{d}");
    }
    ExitCode::from(u8::from(d.changes_answers))
}

/// The beacon samples `serve` saved in `dir` by source network (`steerdns-traffic.json`),
/// for `diff` to weigh networks by; none (and why) when there are none. Usage records
/// are per CDN and interval, so they cannot weigh networks: said when `dir` has some.
fn recorded_traffic(dir: &std::path::Path) -> Traffic {
    use crate::control::disk::traffic;
    let usage = crate::control::disk::persist::saved_usage(dir)
        .is_some_and(|l| l.cdns.values().any(|r| !r.is_empty()));
    let usage_note = if usage {
        "; the usage records there are per CDN, not per network, and weigh nothing"
    } else {
        ""
    };
    let none = |why: String| Traffic {
        from: TrafficFrom {
            note: format!("{why}{usage_note}"),
            ..TrafficFrom::default()
        },
        ..Traffic::default()
    };
    let saved = match traffic::load(dir) {
        Ok(Some(saved)) if saved.samples() > 0 => saved,
        Ok(Some(_)) => return none(format!("{} holds no samples", traffic::path(dir).display())),
        Ok(None) => {
            return none(format!(
                "no beacon samples saved in {} (serve --state-dir; regions with a `performance:` block)",
                dir.display()
            ))
        }
        Err(e) => {
            eprintln!("warning: {e}: weighing by address space alone");
            return none(format!("{e} cannot be read"));
        }
    };
    let mut names: HashMap<String, Vec<(IpAddr, u64)>> = HashMap::new();
    let mut unreadable = 0;
    for r in &saved.regions {
        let list = names.entry(r.name.clone()).or_default();
        for (net, n) in &r.networks {
            match net.parse::<ipnet::IpNet>() {
                Ok(net) => list.push((net.network(), *n)),
                Err(_) => unreadable += 1,
            }
        }
    }
    if unreadable > 0 {
        eprintln!(
            "warning: {}: {unreadable} network(s) that are not prefixes left out",
            traffic::path(dir).display()
        );
    }
    let windows: std::collections::BTreeSet<String> = saved
        .regions
        .iter()
        .map(|r| format!("{} s", r.window_seconds))
        .collect();
    Traffic {
        from: TrafficFrom {
            file: Some(traffic::path(dir).display().to_string()),
            saved_unix_ms: Some(saved.saved_unix_ms),
            samples: saved.samples(),
            note: format!(
                "beacon samples of {} region(s) with a `performance:` block, over a window of {}{usage_note}",
                saved.regions.len(),
                windows.into_iter().collect::<Vec<_>>().join(", "),
            ),
        },
        names,
    }
}

/// One token of `--api-tokens` as `check` lists it.
fn token_line(t: &crate::config::tokens::Token) -> String {
    let verbs: Vec<&str> = t.verbs.iter().map(|v| v.as_str()).collect();
    // Names and tenants limit together: one of them given, the other adds nothing.
    let limited = t.names.is_some() || t.tenants.is_some();
    let list = |l: &Option<Vec<String>>, none: &str| {
        l.as_ref().map_or_else(|| none.to_string(), |v| v.join(","))
    };
    let by_name = if limited { "none" } else { "any" };
    format!(
        "token {}: {}; names {}; tenants {}; regions {}{}",
        t.name,
        verbs.join(","),
        list(&t.names, by_name),
        list(&t.tenants, by_name),
        list(&t.regions, "any"),
        if t.require_ticket {
            "; ticket required"
        } else {
            ""
        },
    )
}

pub(super) fn explain(
    inputs: Inputs,
    name: &str,
    client: IpAddr,
    resolver: Option<(IpAddr, u8)>,
    session: Option<u64>,
    state_dir: &std::path::Path,
    json: bool,
) -> ExitCode {
    let Some(loaded) = load_or_report(&inputs) else {
        return ExitCode::FAILURE;
    };
    // The failover state `serve` saved, if recent: explain what is served now.
    let max_age = crate::control::decide::state::SAVED_MAX_AGE;
    let saved = match crate::control::disk::persist::load(state_dir, max_age) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("warning: {e}: showing configured weights");
            None
        }
    };
    let (now, now_ms) = (tokio::time::Instant::now(), crate::clock::now_ms());
    let state = match &saved {
        Some(s) => s.state(&loaded, now, now_ms),
        None => {
            let mut state = ControlState::default();
            state.drains.sync(&loaded.policy, now, now_ms);
            state
        }
    };
    // The performance shifts and commit biases saved with it, applied as `serve`
    // applies them: perf, then commit, then failover and drains.
    let mut perf = crate::control::modifiers::perf::Perf::default();
    perf.configure(&loaded.policy, now_ms);
    if let Some(s) = &saved {
        perf.restore(&s.performance, now_ms);
    }
    let mut commit = crate::control::modifiers::commit::Commit::default();
    commit.configure(&loaded.policy, now_ms);
    match saved.as_ref().and_then(|s| s.commit.as_ref()) {
        Some(c) => commit.restore(c),
        None => {
            commit.ledger =
                crate::control::disk::persist::saved_usage(state_dir).unwrap_or_default()
        }
    }
    let (snapshot, _) =
        crate::control::modifiers::chain::Chain::new(&perf).snapshot(&commit, &state, &loaded);
    let facts = crate::control::levers::explain::Facts {
        loaded: &loaded,
        snapshot: &snapshot,
        health: &state.failover.health,
        removed: &state.removed(&loaded),
        drains: state.drains.report(&loaded.policy, now_ms),
        frozen: state.frozen_for(&loaded, name),
        canary: None,
        state: match &saved {
            Some(s) => format!(
                "saved by `serve` {} s ago in {}",
                s.age_ms() / 1000,
                state_dir.display()
            ),
            None => format!(
                "none saved by `serve` (or older than {} min): no failover in progress",
                max_age.as_secs() / 60
            ),
        },
    };
    let question = crate::control::levers::explain::Question {
        name,
        client,
        resolver,
        now: crate::clock::now_secs(),
        session,
    };
    let explained = crate::control::levers::explain::explain(&facts, &question).map(|mut e| {
        e.commit = commit.name_view(&e.name, now_ms);
        e.performance = perf.region_view(&e.name, e.region.index);
        e
    });
    match explained {
        Ok(e) if json => match serde_json::to_string_pretty(&e) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("steerdns: cannot write the explanation as JSON: {err}");
                ExitCode::FAILURE
            }
        },
        Ok(e) => {
            print!("{e}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("steerdns: {e}");
            ExitCode::FAILURE
        }
    }
}
