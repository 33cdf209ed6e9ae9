//! Control plane, performance steering: its section of the status page.

use std::fmt::Write;

use super::RegionView;
use crate::control::http::esc;

/// The "Performance steering" section: per region with a `performance:` block, each
/// CDN's measured figure, samples and networks, its shares (policy, now, target) and
/// the reason. Nothing without such a region.
pub(crate) fn section(h: &mut String, regions: &[RegionView]) -> std::fmt::Result {
    if regions.is_empty() {
        return Ok(());
    }
    h.push_str(
        "<h2>Performance steering</h2>\n<table id=\"performance\"><tr><th>name</th>\
         <th>region</th><th>CDN</th><th>measured</th><th>samples (networks)</th>\
         <th>policy %</th><th>now %</th><th>target %</th><th>why</th></tr>\n",
    );
    for r in regions {
        for c in &r.cdns {
            let measured = c.measured.map_or("not enough data".to_string(), |v| {
                format!("{} {v}", r.metric)
            });
            writeln!(
                h,
                "<tr class=\"perf\" data-name=\"{}\" data-region=\"{}\" data-cdn=\"{}\" \
                 data-reason=\"{}\"><td>{}</td><td>{} (band {} %, floor {} %, {} points per {} s{})</td>\
                 <td>{}</td><td>{}</td><td>{} ({})</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&r.name),
                esc(&r.region),
                esc(&c.cdn),
                c.reason.as_str(),
                esc(&r.name),
                esc(&r.region),
                r.band_percent,
                r.floor_percent,
                r.max_shift_points,
                r.shift_period_seconds,
                if r.shifting { ", shifting" } else { "" },
                esc(&c.cdn),
                esc(&measured),
                c.window.samples,
                c.window.networks,
                c.policy_share,
                c.share,
                c.target_share,
                c.reason.as_str(),
            )?;
        }
    }
    h.push_str("</table>\n");
    Ok(())
}

/// The lines `explain` prints for a region with a `performance:` block.
pub(crate) fn explain(f: &mut std::fmt::Formatter<'_>, r: &RegionView) -> std::fmt::Result {
    writeln!(
        f,
        "perf:    {} within {} % of the best keeps its share; floor {} %; {} points per {} s{}",
        r.metric,
        r.band_percent,
        r.floor_percent,
        r.max_shift_points,
        r.shift_period_seconds,
        if r.shifting { "; shifting" } else { "" }
    )?;
    if let Some(at) = &r.vantage_address {
        writeln!(
            f,
            "perf:    this node's prober measures here (--vantage-address {at})"
        )?;
    }
    for c in &r.cdns {
        let measured = c
            .measured
            .map_or("not enough data".to_string(), |v| v.to_string());
        writeln!(
            f,
            "perf:    {} {}: {measured} ({} samples, {} networks); policy {} %, now {} %, target {} %",
            c.cdn,
            c.reason.as_str(),
            c.window.samples,
            c.window.networks,
            c.policy_share,
            c.share,
            c.target_share
        )?;
    }
    Ok(())
}
