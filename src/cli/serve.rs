//! The commands that run: `serve` (the nameserver) and `agent` (a probe agent of a
//! set), until a signal ends them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use tracing::{info, warn};

use super::args::api_exposure;
use crate::app::{self, Inputs, Loaded, ServeOptions};
use crate::control::cluster::ClusterOptions;

pub(super) fn load_or_report(inputs: &Inputs) -> Option<Loaded> {
    match app::load(inputs) {
        Ok(loaded) => {
            for w in loaded.warnings.warnings() {
                eprintln!("{w}");
            }
            Some(loaded)
        }
        Err(issues) => {
            for w in issues.warnings() {
                eprintln!("{w}");
            }
            eprint!("{issues}");
            None
        }
    }
}

pub(super) async fn serve(inputs: Inputs, opts: ServeOptions) -> ExitCode {
    let Some(loaded) = load_or_report(&inputs) else {
        eprintln!("steerdns: not starting: fix the errors above (`steerdns check` lists them)");
        return ExitCode::FAILURE;
    };
    let names: Vec<String> = loaded
        .policy
        .hosts
        .iter()
        .map(|h| h.name.to_string())
        .collect();
    let zones: Vec<String> = loaded.zones.origins().map(ToString::to_string).collect();
    info!(
        steered = %names.join(" "),
        zones = %zones.join(" "),
        geo = %loaded.geo.path().display(),
        geo_networks = loaded.geo.networks(),
        asn_networks = loaded.geo.asn().map(|a| a.networks()),
        "loaded"
    );
    let probed: Vec<&str> = loaded.probes.specs.iter().map(|s| s.cdn.as_str()).collect();
    info!(probed = %probed.join(" "), vantages = loaded.probes.vantages.len(), vantage = %opts.vantage, "health checks");
    let mut service = match app::serve(loaded, &opts).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("steerdns: {e}");
            return ExitCode::FAILURE;
        }
    };
    crate::huge::give_back();
    for addr in service.dns.addrs() {
        info!(%addr, udp_sockets = opts.dns.udp_sockets, "listening (udp, tcp)");
    }
    if let Some(addr) = service.steering {
        info!(%addr, "content steering listening (http): /steer/hls/{{name}}, /steer/dash/{{name}}");
    }
    if let Some(addr) = service.api {
        info!(%addr, "api listening (http)");
        if let Some(why) = api_exposure(addr, opts.api_token.is_some()) {
            warn!(%addr, "{why}");
        }
    }

    let token = service.shutdown_token();
    tokio::spawn(async move {
        shutdown_signal().await;
        info!("shutting down");
        token.cancel();
    });
    match service.wait().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            warn!(error = %e, "server stopped with an error");
            ExitCode::FAILURE
        }
    }
}

pub(super) async fn agent(
    dir: PathBuf,
    api: SocketAddr,
    vantage: String,
    cluster: Option<ClusterOptions>,
) -> ExitCode {
    let probes = match crate::config::probes::load_dir(&dir, None) {
        Ok((p, warnings)) => {
            for w in warnings.warnings() {
                eprintln!("{w}");
            }
            p
        }
        Err(issues) => {
            eprint!("{issues}");
            return ExitCode::FAILURE;
        }
    };
    let agent = match app::agent_with(probes, api, vantage.clone(), cluster).await {
        Ok(a) => a,
        Err(e) => {
            eprintln!("steerdns: agent on {api}: {e}");
            return ExitCode::FAILURE;
        }
    };
    info!(addr = %agent.api, vantage = %vantage, "agent: probing, observations on /v1/observations");
    shutdown_signal().await;
    info!("shutting down");
    drop(agent);
    ExitCode::SUCCESS
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
