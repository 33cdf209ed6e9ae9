//! Input plane: the book's generated reference pages, `steerdns reference cli` (every
//! command and flag, from the clap definition, as the manual pages are) and `steerdns
//! reference metrics` (every metric family with its type and labels, from the
//! registry). CI regenerates both and compares them with the committed pages
//! (`docs/book/src/reference/cli.md` and `metrics.md`, `tests/book.rs`), so a flag or a
//! metric cannot be added without its reference.

use std::fmt::Write;

use clap::{ArgAction, CommandFactory};

use super::Cli;
use crate::metrics::Metrics;

/// Which page `steerdns reference` prints.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Page {
    /// Every command and flag (docs/book/src/reference/cli.md).
    Cli,
    /// Every metric family (docs/book/src/reference/metrics.md).
    Metrics,
}

/// The page, in Markdown.
pub(super) fn page(page: Page) -> String {
    match page {
        Page::Cli => cli(),
        Page::Metrics => metrics(),
    }
}

/// A generated page's title and the comment that says how it is made.
fn header(out: &mut String, title: &str, page: &str) {
    let _ = writeln!(
        out,
        "# {title}\n\n<!-- Generated: `steerdns reference {page} > \
         docs/book/src/reference/{page}.md` writes this page and tests/book.rs checks that it \
         matches. Do not edit it by hand. -->\n"
    );
}

fn cli() -> String {
    let mut root = Cli::command();
    root.build();
    let mut out = String::new();
    header(&mut out, "Command line reference", "cli");
    let _ = writeln!(
        out,
        "Every command of `steerdns` and every flag, with its value, default and \
         environment variable. Every command also takes `--help`; `steerdns --version` \
         prints the version and the commit built. The [command-line guide](command-line.md) \
         says how the flags work together.\n"
    );
    let _ = writeln!(out, "| command | what |\n|---|---|");
    let mut commands = Vec::new();
    walk(&root, &mut Vec::new(), &mut commands);
    for (path, cmd) in &commands {
        let _ = writeln!(
            out,
            "| [`steerdns {}`](#steerdns-{}) | {} |",
            path.join(" "),
            path.join("-"),
            cell(&cmd.get_about().map(|a| a.to_string()).unwrap_or_default())
        );
    }
    for (path, cmd) in &commands {
        command(&mut out, path, cmd);
    }
    out
}

/// Every visible command with a body (leaves and commands with flags), depth first.
fn walk<'c>(
    cmd: &'c clap::Command,
    path: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, &'c clap::Command)>,
) {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        path.push(sub.get_name().to_string());
        if sub.has_subcommands() {
            walk(sub, path, out);
        } else {
            out.push((path.clone(), sub));
        }
        path.pop();
    }
}

fn command(out: &mut String, path: &[String], cmd: &clap::Command) {
    let _ = writeln!(out, "\n## steerdns {}\n", path.join(" "));
    let about = cmd
        .get_long_about()
        .or(cmd.get_about())
        .map(|a| a.to_string())
        .unwrap_or_default();
    let _ = writeln!(out, "{}\n", about.trim());
    let mut usage = cmd.clone().bin_name(format!("steerdns {}", path.join(" ")));
    let usage = usage.render_usage().to_string();
    let _ = writeln!(out, "```text\n{}\n```\n", usage.trim());
    let args: Vec<_> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter(|a| {
            !matches!(
                a.get_action(),
                ArgAction::Help | ArgAction::HelpLong | ArgAction::Version
            )
        })
        .collect();
    if args.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "| argument | value | default | what |\n|---|---|---|---|"
    );
    for arg in args {
        let id = format!(
            "{}-{}",
            path.join("-"),
            arg.get_id().as_str().replace('_', "-")
        );
        let name = match (arg.get_long(), arg.get_short()) {
            (Some(l), Some(s)) => format!("`-{s}`, `--{l}`"),
            (Some(l), None) => format!("`--{l}`"),
            (None, Some(s)) => format!("`-{s}`"),
            (None, None) => format!("`{}`", names(arg).join(" ")),
        };
        let takes_value = !matches!(
            arg.get_action(),
            ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count
        );
        let mut value = String::new();
        if takes_value && !arg.is_positional() {
            let possible: Vec<_> = arg
                .get_possible_values()
                .iter()
                .filter(|p| !p.is_hide_set())
                .map(|p| p.get_name().to_string())
                .collect();
            value = if possible.is_empty() {
                format!("`{}`", names(arg).join(" "))
            } else {
                format!("`{}`", possible.join("\\|"))
            };
        }
        let mut notes = Vec::new();
        if arg.is_required_set() {
            notes.push("required".to_string());
        }
        if matches!(arg.get_action(), ArgAction::Append) {
            notes.push("repeatable".to_string());
        }
        if let Some(env) = arg.get_env() {
            notes.push(format!("env `{}`", env.to_string_lossy()));
        }
        let default = if takes_value {
            arg.get_default_values()
                .iter()
                .map(|d| format!("`{}`", d.to_string_lossy()))
                .collect::<Vec<_>>()
                .join(", ")
        } else {
            String::new()
        };
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        let notes = if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join("; "))
        };
        let _ = writeln!(
            out,
            "| <a id=\"{id}\"></a>{name} | {value} | {default} | {}{notes} |",
            cell(&help)
        );
    }
}

fn names(arg: &clap::Arg) -> Vec<String> {
    match arg.get_value_names() {
        Some(v) => v.iter().map(|n| n.to_string()).collect(),
        None => vec![arg.get_id().as_str().to_uppercase()],
    }
}

/// One line of a Markdown table cell: no newline, no unescaped `|`.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn metrics() -> String {
    let families = Metrics::new().catalogue();
    let mut out = String::new();
    header(&mut out, "Metrics reference", "metrics");
    let _ = writeln!(
        out,
        "`/metrics` on `--api` serves these {} families in the Prometheus text format, \
         each whether or not it has a series yet. Label values are bounded by the \
         configuration (names, regions, CDNs, vantage points, fixed sets of reasons); a \
         client address is never a label. The [alerts](alerts.md) are written on them.\n",
        families.len()
    );
    let _ = writeln!(out, "| family | type | labels |\n|---|---|---|");
    for f in &families {
        let _ = writeln!(
            out,
            "| [`{0}`](#{0}) | {1} | {2} |",
            f.name,
            f.kind,
            f.labels.join(", ")
        );
    }
    for f in &families {
        let _ = writeln!(out, "\n## {}\n", f.name);
        let labels = if f.labels.is_empty() {
            "no labels".to_string()
        } else {
            format!(
                "labels {}",
                f.labels
                    .iter()
                    .map(|l| format!("`{l}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let _ = writeln!(out, "{}, {labels}.\n\n{}", f.kind, cell(&f.help));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cli_page_has_every_visible_command_and_flag() {
        let text = page(Page::Cli);
        assert!(text.contains("## steerdns serve"));
        assert!(text.contains("## steerdns dnssec keygen"));
        assert!(text.contains("<a id=\"serve-listen\"></a>`--listen`"));
        assert!(
            !text.contains("## steerdns man"),
            "hidden commands stay out"
        );
    }

    #[test]
    fn the_metrics_page_has_a_section_per_family() {
        let text = page(Page::Metrics);
        assert!(text.contains("\n## steerdns_drains_active\n\ngauge, labels `name`, `cdn`."));
    }
}
