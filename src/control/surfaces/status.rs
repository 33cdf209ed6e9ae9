//! Control plane: the status page, `GET /` on the API: what is happening now, for a
//! person in an incident, in one self-contained HTML page (no script, no external
//! asset; it reloads itself every [`REFRESH_SECONDS`]).
//!
//! For each steered name and region: each CDN's share now, why (normal, failover,
//! drain, fail-open), and the last hour of shares as an inline SVG chart. Then the
//! health of each CDN with the last round's evidence, the failover steps with when they
//! were taken, the drains with their reason and expiry, the regions failing open, and
//! the last reload. The numbers are those of `/v1/state` ([`StateDoc`]) and of the plan
//! being served; everything that comes from the configuration or from an API call
//! (names, regions, CDNs, reasons) is HTML-escaped.
//!
//! The chart's history ([`History`]) is kept in memory: a sampler ([`spawn_sampler`])
//! looks at the live snapshot every second and, when a new one is served, records each
//! (name, region, CDN) share that changed. So a series holds one point per change, not
//! per sample: exact step edges at a second's resolution, and nothing stored while
//! nothing changes. Bounded: points older than an hour go (the last one before the hour
//! is kept, as the value the chart starts from), at most [`MAX_POINTS`](super::history::MAX_POINTS) per series, and
//! charts for the first [`MAX_CHARTED_REGIONS`] (name, region) pairs only; the page
//! still shows the shares of every region.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use crate::control::decide::times;
use crate::control::http::esc;
use crate::control::state_doc::StateDoc;
use crate::plan::{Live, Plan};

use super::history::shares;
pub(crate) use super::history::{spawn_sampler, History, MAX_CHARTED_REGIONS, WINDOW};

/// How often the page reloads itself.
pub(crate) const REFRESH_SECONDS: u32 = 5;
/// What the API needs to draw the page.
#[derive(Clone)]
pub struct StatusSource {
    pub live: Arc<Live>,
    pub history: Arc<Mutex<History>>,
    /// Where `/book/` (the page's links to the manual) leads: `serve --book`.
    pub book: crate::control::surfaces::book::Book,
}

/// The page for the state `doc` and the plan being served.
pub(crate) fn page(doc: &StateDoc, plan: &Plan, history: &History, now_ms: u64) -> String {
    let mut h = String::with_capacity(16 * 1024);
    let _ = write_page(&mut h, doc, plan, history, now_ms);
    h
}

/// The page of a process that serves no DNS (`agent`).
pub(crate) fn agent_page(vantage: &str) -> String {
    format!(
        "{}<h1>steerdns agent {}</h1><p>A probe-only vantage point: its observations are at \
         <a href=\"/v1/observations\">/v1/observations</a>, its metrics at \
         <a href=\"/metrics\">/metrics</a>.</p></body></html>\n",
        head(&format!("steerdns agent {vantage}")),
        esc(vantage)
    )
}

/// The CDN colours, in policy order (repeating).
const COLOURS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1em 2em;color:#222}\
h1{font-size:20px;margin:0}h2{font-size:16px;margin:1.2em 0 .4em}.manual{font-size:11px;font-weight:normal;color:#666}\
.meta{color:#666}table{border-collapse:collapse;margin:.3em 0}\
td,th{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:middle}\
th{background:#f4f4f4}.banner{padding:6px 10px;margin:6px 0;border-radius:4px}\
.warn{background:#fff3cd}.bad{background:#f8d7da}.ok{color:#1a7f37}.down{color:#c62828;font-weight:bold}\
.bar{display:flex;width:240px;height:14px;background:#eee}.bar span{display:block;height:14px}\
.sw{display:inline-block;width:10px;height:10px;margin-right:4px}\
ul.shares{list-style:none;margin:2px 0;padding:0}ul.shares li{display:inline;margin-right:10px}\
.reason-normal{color:#666}.reason-failover,.reason-drain{color:#b26a00;font-weight:bold}\
.reason-fail-open{color:#c62828;font-weight:bold}svg.chart{background:#fafafa}";

fn head(title: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\">\
         <title>{}</title><style>{STYLE}</style></head><body>\n",
        esc(title)
    )
}

fn write_page(
    h: &mut String,
    doc: &StateDoc,
    plan: &Plan,
    history: &History,
    now: u64,
) -> std::fmt::Result {
    h.push_str(&head(&format!("steerdns {}", doc.vantage)));
    writeln!(
        h,
        "<header><h1>steerdns: {}</h1><p class=\"meta\">policy <code>{}</code>{} · configuration <code>{}</code> · \
         {} UTC · refreshes every {REFRESH_SECONDS} s · <a href=\"/v1/state\">/v1/state</a> · \
         <a href=\"/metrics\">/metrics</a> · \
         <a href=\"/book/user/operating.html#status-page\">the manual</a></p></header>",
        esc(&doc.vantage),
        esc(&doc.policy_version),
        match doc.policy.as_ref() {
            Some(p) if p.file_differs => format!(
                " <strong>(the policy file differs from the version in force: {})</strong>",
                esc(p.file_version.as_deref().unwrap_or("unreadable"))
            ),
            _ => String::new(),
        },
        esc(&doc.config_version),
        time(now),
    )?;
    banners(h, doc)?;

    h.push_str("<section id=\"names\">\n");
    let mut charted = 0;
    for steered in plan.names() {
        let name = &**steered.text();
        let tenant = doc
            .tenants
            .iter()
            .find(|(_, names)| names.iter().any(|n| n == name))
            .map_or(String::new(), |(t, _)| {
                format!(" <span class=\"tenant\">tenant {}</span>", esc(t))
            });
        writeln!(
            h,
            "<h2 class=\"name\">{}{tenant}</h2>\n<table class=\"regions\"><tr><th>region</th>\
             <th>why <a class=\"manual\" href=\"/book/runbooks/read-explain.html\">manual</a></th><th>shares now</th><th>last hour (or since start)</th></tr>",
            esc(name)
        )?;
        for r in 0..steered.regions() {
            let region = steered.region_name(r);
            let reason = steered.choice(r).reason.to_string();
            let shares = shares(steered, r);
            write!(
                h,
                "<tr class=\"region\" data-name=\"{}\" data-region=\"{}\" data-reason=\"{reason}\">\
                 <td>{}</td><td class=\"reason-{reason}\">{reason}</td><td><div class=\"bar\">",
                esc(name),
                esc(region),
                esc(region),
            )?;
            for (i, (_, tenths)) in shares.iter().enumerate() {
                if *tenths > 0 {
                    write!(
                        h,
                        "<span style=\"width:{}%;background:{}\"></span>",
                        f64::from(*tenths) / 10.0,
                        COLOURS[i % COLOURS.len()]
                    )?;
                }
            }
            h.push_str("</div><ul class=\"shares\">");
            for (i, (cdn, tenths)) in shares.iter().enumerate() {
                let pct = f64::from(*tenths) / 10.0;
                write!(
                    h,
                    "<li class=\"share\" data-cdn=\"{}\" data-share=\"{pct}\">\
                     <span class=\"sw\" style=\"background:{}\"></span>{} {pct} %</li>",
                    esc(cdn),
                    COLOURS[i % COLOURS.len()],
                    esc(cdn),
                )?;
            }
            h.push_str("</ul></td><td>");
            if charted < MAX_CHARTED_REGIONS {
                chart(h, history, name, region, &shares, now)?;
            } else {
                write!(
                    h,
                    "(no chart: only the first {MAX_CHARTED_REGIONS} regions are charted)"
                )?;
            }
            charted += 1;
            h.push_str("</td></tr>\n");
        }
        h.push_str("</table>\n");
    }
    h.push_str("</section>\n");

    health(h, doc)?;
    failover(h, doc, now)?;
    drains(h, doc, now)?;
    fail_open(h, doc)?;
    dnssec(h, doc, now)?;
    crate::control::modifiers::perf::page::section(h, &doc.performance)?;
    crate::control::modifiers::commit::page::section(h, &doc.commit)?;
    reload(h, doc)?;
    h.push_str("</body></html>\n");
    Ok(())
}

fn banners(h: &mut String, doc: &StateDoc) -> std::fmt::Result {
    for (tenant, why) in &doc.failover_frozen_tenants {
        writeln!(
            h,
            "<p class=\"banner warn\" id=\"frozen-{}\">Automatic failover is frozen for tenant {}: {}</p>",
            esc(tenant),
            esc(tenant),
            esc(why)
        )?;
    }
    if let Some(why) = &doc.failover_frozen {
        writeln!(
            h,
            "<p class=\"banner warn\" id=\"frozen\">Automatic failover is frozen: {}</p>",
            esc(why)
        )?;
    }
    if !doc.fail_open.is_empty() {
        writeln!(
            h,
            "<p class=\"banner bad\">{} region(s) failing open: every CDN is out, the \
             configured weights answer (see below).</p>",
            doc.fail_open.len()
        )?;
    }
    if let Some(why) = &doc.vantage_unhappy {
        writeln!(
            h,
            "<p class=\"banner warn\" id=\"unhappy\">This vantage point is unhappy (its \
             failures do not count): {}</p>",
            esc(why)
        )?;
    }
    if let Some(save) = doc.state_save.as_ref().filter(|s| !s.ok) {
        writeln!(
            h,
            "<p class=\"banner warn\">Saving the state in {} fails: {}</p>",
            esc(&save.dir),
            esc(save.error.as_deref().unwrap_or(""))
        )?;
    }
    if let Some(c) = doc.cluster.as_ref().filter(|c| c.fail_static) {
        writeln!(
            h,
            "<p class=\"banner bad\">Failing static: etcd is out of reach ({}); the last \
             shared state is served and nothing is demoted.</p>",
            esc(c.error.as_deref().unwrap_or(""))
        )?;
    }
    Ok(())
}

/// The last hour of a region's shares (since the first record, if that is less than
/// an hour ago, but a minute at least): one step line per CDN, 0 to 100 %.
fn chart(
    h: &mut String,
    history: &History,
    name: &str,
    region: &str,
    now_shares: &[(&str, u16)],
    now: u64,
) -> std::fmt::Result {
    const W: f64 = 360.0;
    const H: f64 = 60.0;
    let hour = WINDOW.as_millis() as u64;
    let start = now
        .saturating_sub(hour)
        .max(history.since.unwrap_or(0))
        .min(now.saturating_sub(60_000));
    let window = (now - start).max(1);
    let x = |t: u64| (t.max(start) - start) as f64 * W / window as f64;
    let y = |tenths: u16| H - f64::from(tenths) * H / 1000.0;
    write!(
        h,
        "<svg class=\"chart\" width=\"{W}\" height=\"{}\" viewBox=\"0 -4 {W} {}\" role=\"img\">\
         <title>shares of {} in {} over the last hour (or since start)</title>\
         <line x1=\"0\" y1=\"{}\" x2=\"{W}\" y2=\"{}\" stroke=\"#ddd\"/>",
        H + 8.0,
        H + 8.0,
        esc(name),
        esc(region),
        H / 2.0,
        H / 2.0,
    )?;
    for (i, (cdn, now_tenths)) in now_shares.iter().enumerate() {
        let Some(points) = history.points(name, region, cdn).filter(|p| !p.is_empty()) else {
            continue;
        };
        let mut path = String::new();
        let mut prev = None;
        for &(t, v) in points {
            let px = x(t);
            match prev {
                None => write!(path, "{px:.1},{:.1}", y(v))?,
                Some(p) => write!(path, " {px:.1},{:.1} {px:.1},{:.1}", y(p), y(v))?,
            }
            prev = Some(v);
        }
        // To now, at the share served now (the sampler may be a second behind).
        if let Some(p) = prev {
            write!(path, " {W:.1},{:.1} {W:.1},{:.1}", y(p), y(*now_tenths))?;
        }
        write!(
            h,
            "<polyline class=\"series\" data-cdn=\"{}\" fill=\"none\" stroke=\"{}\" \
             stroke-width=\"2\" points=\"{path}\"/>",
            esc(cdn),
            COLOURS[i % COLOURS.len()]
        )?;
    }
    write!(
        h,
        "<text x=\"2\" y=\"{}\" font-size=\"9\" fill=\"#999\">-{}</text>\
         <text x=\"{}\" y=\"{}\" font-size=\"9\" fill=\"#999\">now</text></svg>",
        H + 3.0,
        human(window.div_ceil(1000)),
        W - 20.0,
        H + 3.0
    )
}

fn health(h: &mut String, doc: &StateDoc) -> std::fmt::Result {
    h.push_str(
        "<h2>Health <a class=\"manual\" href=\"/book/user/failover.html\">manual</a></h2>\n<table id=\"health\"><tr><th>CDN</th><th>state</th>\
         <th>bad rounds in a row</th><th>good rounds in a row</th><th>last round (evidence)</th>\
         <th>rounds down / up / unknown</th></tr>\n",
    );
    if doc.health.is_empty() {
        h.push_str("<tr><td colspan=\"6\">No CDN is probed (no files in probes/).</td></tr>\n");
    }
    for (cdn, health) in &doc.health {
        let class = if health.state == "up" { "ok" } else { "down" };
        let counts = health
            .verdicts
            .map(|v| format!("{} / {} / {}", v.down, v.up, v.unknown))
            .unwrap_or_default();
        writeln!(
            h,
            "<tr class=\"cdn\" data-cdn=\"{}\" data-state=\"{}\"><td>{}</td>\
             <td class=\"{class}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{counts}</td></tr>",
            esc(cdn),
            esc(&health.state),
            esc(cdn),
            esc(&health.state),
            health.consecutive_down_rounds,
            health.consecutive_up_rounds,
            esc(health.last_verdict.as_deref().unwrap_or("(none yet)")),
        )?;
    }
    h.push_str("</table>\n");
    Ok(())
}

fn failover(h: &mut String, doc: &StateDoc, now: u64) -> std::fmt::Result {
    h.push_str(
        "<h2>Failover steps <a class=\"manual\" href=\"/book/user/failover.html#hysteresis-and-steps\">manual</a></h2>\n<table id=\"failover\"><tr><th>name</th><th>CDN</th>\
         <th>share removed</th><th>direction</th><th>since</th></tr>\n",
    );
    if doc.failover.is_empty() {
        h.push_str("<tr><td colspan=\"5\">Every CDN is at its configured weight.</td></tr>\n");
    }
    for step in &doc.failover {
        let direction = match step.direction {
            Some(d) => serde_json::to_value(d)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default(),
            None => String::new(),
        };
        writeln!(
            h,
            "<tr class=\"step\" data-name=\"{}\" data-cdn=\"{}\" data-removed=\"{}\">\
             <td>{}</td><td>{}</td><td>{} %</td><td>{direction}</td><td>{}</td></tr>",
            esc(&step.name),
            esc(&step.cdn),
            step.removed_percent,
            esc(&step.name),
            esc(&step.cdn),
            step.removed_percent,
            step.since_unix_ms.map_or(String::new(), |t| when(t, now)),
        )?;
    }
    h.push_str("</table>\n");
    Ok(())
}

/// Who made a drain: its author, ticket and tenant, as far as known.
fn by(d: &crate::control::decide::drains::DrainStatus) -> String {
    let mut out = d.author.clone().unwrap_or_else(|| "policy".into());
    if let Some(t) = &d.ticket {
        out.push_str(&format!(", ticket {t}"));
    }
    if let Some(t) = &d.tenant {
        out.push_str(&format!(", tenant {t}"));
    }
    out
}

fn drains(h: &mut String, doc: &StateDoc, now: u64) -> std::fmt::Result {
    h.push_str(
        "<h2>Drains <a class=\"manual\" href=\"/book/user/operating.html#drains\">manual</a></h2>\n<table id=\"drains\"><tr><th>name</th><th>CDN</th><th>where</th>\
         <th>reason</th><th>until</th><th>status</th><th>share removed</th><th>by</th></tr>\n",
    );
    if doc.drains.is_empty() {
        h.push_str("<tr><td colspan=\"8\">No drain.</td></tr>\n");
    }
    for d in &doc.drains {
        let scope = if d.scope.is_empty() {
            "everywhere".to_string()
        } else {
            d.scope.join(", ")
        };
        writeln!(
            h,
            "<tr class=\"drain\" data-name=\"{}\" data-cdn=\"{}\" data-removed=\"{}\">\
             <td>{}</td><td>{}</td><td>{}</td><td class=\"why\">{}</td><td>{}</td><td>{}</td>\
             <td>{} %{}</td><td class=\"by\">{}</td></tr>",
            esc(&d.name),
            esc(&d.cdn),
            d.removed_percent,
            esc(&d.name),
            esc(&d.cdn),
            esc(&scope),
            esc(&d.reason),
            d.until_unix_ms
                .map_or("no expiry".to_string(), |t| when(t, now)),
            esc(&d.status.to_string()),
            d.removed_percent,
            if d.immediate { " (immediate)" } else { "" },
            esc(&by(d)),
        )?;
    }
    h.push_str("</table>\n");
    Ok(())
}

fn fail_open(h: &mut String, doc: &StateDoc) -> std::fmt::Result {
    h.push_str(
        "<h2>Fail-open <a class=\"manual\" href=\"/book/user/failover.html#fail-open\">manual</a></h2>\n<table id=\"fail-open\"><tr><th>name</th><th>region</th></tr>\n",
    );
    if doc.fail_open.is_empty() {
        h.push_str("<tr><td colspan=\"2\">No region fails open.</td></tr>\n");
    }
    for f in &doc.fail_open {
        writeln!(
            h,
            "<tr class=\"fail-open\" data-name=\"{}\" data-region=\"{}\"><td>{}</td><td>{}</td></tr>",
            esc(&f.name),
            esc(&f.region),
            esc(&f.name),
            esc(&f.region),
        )?;
    }
    h.push_str("</table>\n");
    Ok(())
}

/// Signing, when the zones are signed: the signatures' expiry and each key's phase.
fn dnssec(h: &mut String, doc: &StateDoc, now: u64) -> std::fmt::Result {
    let Some(d) = &doc.dnssec else {
        return Ok(());
    };
    writeln!(
        h,
        "<h2>DNSSEC <a class=\"manual\" href=\"/book/user/dnssec.html\">manual</a></h2>\n<p id=\"dnssec\">Signatures valid until {}, replaced {}.</p>",
        when(d.signed_until_unix.saturating_mul(1000), now),
        when(d.resign_at_unix.saturating_mul(1000), now)
    )?;
    h.push_str("<table id=\"dnssec-keys\"><tr><th>zone</th><th>key tag</th><th>algorithm</th><th>phase</th></tr>\n");
    for k in &d.keys {
        writeln!(
            h,
            "<tr class=\"key\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&k.zone),
            k.tag,
            k.algorithm,
            k.phase
        )?;
    }
    h.push_str("</table>\n");
    Ok(())
}

fn reload(h: &mut String, doc: &StateDoc) -> std::fmt::Result {
    h.push_str("<h2>Last reload <a class=\"manual\" href=\"/book/user/operating.html#reload\">manual</a></h2>\n<p id=\"reload\">");
    match &doc.last_reload {
        None => h.push_str("None since start."),
        Some(r) => {
            write!(
                h,
                "{} on {}: serving <code>{}</code>",
                esc(r.result),
                esc(&r.trigger),
                esc(&r.serving_version)
            )?;
            if !r.errors.is_empty() {
                h.push_str("</p><ul class=\"errors\">");
                for e in &r.errors {
                    write!(h, "<li><code>{}</code></li>", esc(e))?;
                }
                h.push_str("</ul><p>");
            }
        }
    }
    h.push_str("</p>\n");
    Ok(())
}

/// A Unix time in ms as UTC, with how long ago or ahead it is.
fn when(t: u64, now: u64) -> String {
    let secs = |ms: u64| ms.div_ceil(1000);
    let rel = if t <= now {
        format!("{} ago", human(secs(now - t)))
    } else {
        format!("in {}", human(secs(t - now)))
    };
    format!("{} ({rel})", time(t))
}

fn human(s: u64) -> String {
    match s {
        0..120 => format!("{s} s"),
        120..7200 => format!("{} min", s / 60),
        _ => format!("{} h", s / 3600),
    }
}

fn time(ms: u64) -> String {
    times::rfc3339(ms)
        .replace('T', " ")
        .trim_end_matches('Z')
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::decide::drains::{DrainState, DrainStatus};
    use crate::control::decide::planner;
    use crate::control::state_doc::{FailOpenDoc, HealthDoc, StepDoc};
    use crate::control::surfaces::history::MAX_POINTS;

    fn loaded() -> crate::inputs::Loaded {
        crate::inputs::demo()
    }

    #[test]
    fn history_keeps_changes_only_and_an_hour_of_them() {
        let loaded = loaded();
        let normal = planner::snapshot(&loaded);
        let name = normal.plan.names().next().unwrap();
        let (n, region) = (name.text().to_string(), name.region_name(0).to_string());
        let mut h = History::default();
        let t0 = 1_000_000_000_000;
        h.record(&normal.plan, t0);
        h.record(&normal.plan, t0 + 1000);
        let p = h.points(&n, &region, "fastly").unwrap();
        assert_eq!(p.iter().copied().collect::<Vec<_>>(), vec![(t0, 900)]);

        let removed = [(
            crate::control::decide::keys::NameCdn::new(n.clone(), "fastly"),
            50,
        )]
        .into();
        let stepped = planner::snapshot_with(&loaded, &removed, &[]).0;
        h.record(&stepped.plan, t0 + 2000);
        let p = h.points(&n, &region, "fastly").unwrap();
        assert_eq!(
            p.iter().copied().collect::<Vec<_>>(),
            vec![(t0, 900), (t0 + 2000, 450)]
        );
        let c = h.points(&n, &region, "cloudflare").unwrap();
        assert_eq!(c.back(), Some(&(t0 + 2000, 550)));

        // Two hours later: the older points go but the one the window starts from.
        let later = t0 + 2 * 3600 * 1000;
        h.record(&normal.plan, later);
        let p = h.points(&n, &region, "fastly").unwrap();
        assert_eq!(
            p.iter().copied().collect::<Vec<_>>(),
            vec![(t0 + 2000, 450), (later, 900)]
        );

        // Flapping every second: at most MAX_POINTS per series.
        for i in 0..(2 * MAX_POINTS as u64) {
            let plan = if i % 2 == 0 {
                &stepped.plan
            } else {
                &normal.plan
            };
            h.record(plan, later + 1000 * (i + 1));
        }
        assert_eq!(h.points(&n, &region, "fastly").unwrap().len(), MAX_POINTS);
        let series = normal
            .plan
            .names()
            .map(|s| s.regions() * s.targets().len())
            .sum::<usize>();
        assert!(h.len() <= series * MAX_POINTS);
    }

    #[test]
    fn the_page_shows_shares_health_steps_drains_and_escapes_everything() {
        let loaded = loaded();
        let n = planner::snapshot(&loaded)
            .plan
            .names()
            .next()
            .unwrap()
            .text()
            .to_string();
        let removed = [(
            crate::control::decide::keys::NameCdn::new(n.clone(), "fastly"),
            50,
        )]
        .into();
        let stepped = planner::snapshot_with(&loaded, &removed, &[]).0;
        let mut history = History::default();
        let now = 1_000_000_000_000;
        history.record(&planner::snapshot(&loaded).plan, now - 60_000);
        history.record(&stepped.plan, now - 1000);
        let doc = StateDoc {
            vantage: "ns1<b>".into(),
            config_version: "abc".into(),
            health: [(
                "fastly".to_string(),
                HealthDoc {
                    state: "down".into(),
                    consecutive_down_rounds: 3,
                    consecutive_up_rounds: 0,
                    last_verdict: Some("Down: status 503 (expected 200) <from ns1>".into()),
                    verdicts: None,
                },
            )]
            .into(),
            failover: vec![StepDoc {
                name: n.clone(),
                cdn: "fastly".into(),
                removed_percent: 50,
                since_unix_ms: Some(now - 5000),
                direction: Some(crate::control::decide::stepper::Direction::Demote),
            }],
            drains: vec![DrainStatus {
                id: "d1".into(),
                name: n.clone(),
                cdn: "cloudflare".into(),
                scope: vec!["GB".into()],
                reason: "INC-1 <script>alert(1)</script>".into(),
                until_unix_ms: Some(now + 600_000),
                immediate: false,
                written_by: None,
                written_at_unix_ms: None,
                tenant: None,
                author: None,
                ticket: None,
                status: DrainState::InForce,
                removed_percent: 100,
            }],
            fail_open: vec![FailOpenDoc {
                name: n.clone(),
                region: "*".into(),
            }],
            ..StateDoc::default()
        };
        let html = page(&doc, &stepped.plan, &history, now);
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("<meta http-equiv=\"refresh\" content=\"5\">"));
        // No script and nothing fetched from elsewhere.
        assert!(!html.contains("<script"), "{html}");
        assert!(!html.contains("src="));
        assert!(html.contains("INC-1 &lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("ns1&lt;b&gt;"));
        assert!(html.contains("&lt;from ns1&gt;"));
        assert!(
            html.contains("data-cdn=\"fastly\" data-share=\"45\""),
            "{html}"
        );
        assert!(html.contains("data-reason=\"failover\""));
        assert!(html.contains(
            "class=\"step\" data-name=\"www.example.com.\" data-cdn=\"fastly\" data-removed=\"50\""
        ));
        assert!(html.contains("(5 s ago)") && html.contains("(in 10 min)"));
        assert!(html.contains("class=\"fail-open\""));
        // A chart per region, with a line per CDN that has history.
        let regions = stepped.plan.names().map(|s| s.regions()).sum::<usize>();
        assert_eq!(html.matches("<svg class=\"chart\"").count(), regions);
        assert!(html.matches("<polyline class=\"series\"").count() >= 2);
    }
}
