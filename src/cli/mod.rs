//! The command line: `serve`, `check`, `diff`, `explain`, `agent`, `simulate`, `dnssec`, `audit`, `policy`. Parsing with clap; each command
//! returns an exit code, and problems are printed for a person to read. Two hidden
//! commands write the manual pages and the shell completions from this definition
//! (`steerdns man DIR`, `steerdns completions SHELL`), for packages.
//!
//! This file holds the definition (`Cli`, `Command`) and `run`, which dispatches;
//! `args.rs` the shared groups of flags, `serve.rs` the commands that run (`serve`,
//! `agent`), `offline.rs` those that read files and print (`check`, `diff`, `explain`,
//! `dnssec`, `audit`, `man`), `policy.rs` the one that asks a running server over its
//! admin API (`policy`).

mod args;
mod offline;
mod policy;
mod reference;
mod serve;
pub use args::{
    api_exposure, ApiAddr, AuditCommand, ContextArgs, DnsArgs, DnssecCommand, EtcdArgs, InputArgs,
};
mod define;
pub use define::*;
