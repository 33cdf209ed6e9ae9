//! Control plane, commit steering: its section of the status page.

use std::fmt::Write;

use super::CdnView;
use crate::control::http::esc;

/// The "Commits and capacity" section: per CDN with a contract or a capacity, the
/// month to date, the projection, the burst budget left, the bias and its reason.
/// Nothing without such a CDN.
pub(crate) fn section(h: &mut String, cdns: &[CdnView]) -> std::fmt::Result {
    if cdns.is_empty() {
        return Ok(());
    }
    h.push_str(
        "<h2>Commits and capacity</h2>\n<table id=\"commit\"><tr><th>name</th><th>CDN</th>\
         <th>contract</th><th>month to date (GB)</th><th>projection (GB)</th>\
         <th>p95 (Mbit/s)</th><th>burst budget left</th><th>now (Mbit/s)</th>\
         <th>share %</th><th>bias (points)</th><th>why</th></tr>\n",
    );
    let opt = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.1}"));
    for c in cdns {
        let contract = match (c.billing, c.commit, c.cap) {
            (Some(b), Some(commit), Some(cap)) => format!("{b}: commit {commit}, cap {cap}"),
            _ => "none".to_string(),
        };
        let contract = match c.capacity_mbps {
            Some(cap) => format!("{contract}; capacity {cap} Mbit/s"),
            None => contract,
        };
        writeln!(
            h,
            "<tr class=\"commit\" data-name=\"{}\" data-cdn=\"{}\" data-reason=\"{}\"><td>{}</td>\
             <td>{}</td><td>{}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{} (before the bias {})</td><td>{:+.2}{}</td><td>{}</td></tr>",
            esc(&c.name),
            esc(&c.cdn),
            c.reason,
            esc(&c.name),
            esc(&c.cdn),
            esc(&contract),
            c.month_to_date_bytes / 1e9,
            opt(c.projection_bytes.map(|b| b / 1e9)),
            opt(c.p95_mbps),
            c.burst_budget_left
                .map_or("–".to_string(), |l| l.to_string()),
            opt(c.rate_mbps),
            c.share,
            c.base_share,
            c.bias_points,
            if c.floored { " (floor)" } else { "" },
            c.reason,
        )?;
    }
    h.push_str("</table>\n");
    Ok(())
}
