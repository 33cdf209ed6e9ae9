//! The `steerdns` binary: logging setup and the command line; see `cli/`.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    // Before the runtime starts its threads: see `huge::tune_allocator`.
    steerdns::huge::tune_allocator();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("steerdns: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run())
}

async fn run() -> ExitCode {
    // hickory logs every request at INFO, which costs a quarter of the throughput; and
    // its Catalog warns on every signed positive answer ("unexpected lookup skip": it
    // looks for a wildcard proof that NSEC zones need only for wildcard answers).
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new("info,hickory_server=warn,hickory_server::zone_handler::catalog=error")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    steerdns::cli::run(steerdns::cli::Cli::parse()).await
}
