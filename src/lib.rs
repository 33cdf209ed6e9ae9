//! steerdns: an authoritative DNS server that steers a hostname across several CDNs.
//!
//! A resolver asks for `www.example.com`; steerdns locates the client (EDNS Client
//! Subnet, else the resolver's address), finds the client's region in `steering.yaml`
//! and answers a weighted `CNAME` to one CDN, with a short TTL: a pick that every
//! nameserver of the set makes alike for the same resolver and network
//! ([`selection`]). Every other name
//! in the served zones is answered from the zone files.
//!
//! The code is split along two planes that meet in one type, the [`plan::Plan`]:
//!
//! ```text
//!  data plane (per query, tiny)              control plane (events, may be slow)
//!  ───────────────────────────               ───────────────────────────────────
//!  dns/        handler, EDNS/ECS, geo,        config/     steering.yaml → Policy
//!              sockets                        zones/      zones/ → Catalog
//!       │                                     control/    the set's store → decisions →
//!       │                                                 modifiers → planner: Plan
//!       └──── reads ──▶ plan/:  Snapshot { Plan, GeoDb, Catalog } ◀── publishes ──┘
//! ```
//!
//! - [`dns`]: the query path: [`dns::Handler`], [`dns::edns`], [`place::geo`], sockets.
//! - [`plan`]: the immutable snapshot behind an `ArcSwap`; one atomic load per query.
//! - [`selection`]: the weighted pick (rendezvous hashing) and its consistent key.
//! - [`place`]: where a client is: the geo and ASN databases, countries and
//!   continents, [`place::Match`] (a `match:`/`where:` entry), the widest ECS scope.
//! - [`control`]: the control plane, in rooms: the event loop ([`control::controller`]),
//!   the pure decisions ([`control::decide`]: the state it serves,
//!   [`control::decide::state::ControlState`], and the planner), the modifiers of the
//!   weights ([`control::modifiers`]), the set (of one or of many, [`control::cluster`])
//!   and its store ([`control::store`]: memory or etcd), the admin API
//!   ([`control::surfaces`]).
//! - [`control::content`]: the same plans served to HLS and DASH players as content
//!   steering manifests (`--steering-http`).
//! - [`config`], [`zones`]: inputs, validated with file, line and field.
//! - [`inputs`]: every input loaded at once (start, reload, `check`, `explain`), with
//!   the version of the files.
//! - [`metrics`]: Prometheus families both planes update, served on `/metrics`.
//! - [`net`]: an address cut to a prefix ([`net::cut`]), the one mask both planes use.
//! - [`slots`]: the connection slots (per source prefix, a loopback reserve) of DNS over
//!   TCP and of the HTTP listeners ([`slots::Slots::take`]).
//! - [`clock`]: the wall clock's only door ([`clock::now_ms`]).
//! - [`dnssec`]: the zones' keys, signing and rollover.
//! - [`app`]: lifecycle: load, bind, serve, stop.
//! - [`cli`]: the `steerdns` command line (`serve`, `check`, `diff`, `explain`, `agent`,
//!   `simulate`, `dnssec`, `audit`): loads the inputs, handles the signals.

#![warn(unreachable_pub)]

pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod control;
pub mod dns;
pub mod dnssec;
pub mod error;
pub mod huge;
pub mod inputs;
pub mod metrics;
pub(crate) mod net;
pub mod place;
pub mod plan;
pub(crate) mod secret;
pub mod selection;
pub(crate) mod slots;
pub mod zones;
