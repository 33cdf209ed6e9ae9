//! Control plane: everything that waits, polls or reloads, and builds new plans. Never
//! on the query path. Each room below is a folder with a door (`mod.rs`: what lives
//! there); the rooms import one another downwards only, in this order (top first:
//! `scripts/check-layers.py` fails on a circle):
//!
//! | room | holds |
//! |---|---|
//! | `controller/` | the event loop: rounds, commands, reloads, the set's view, publishing |
//! | `surfaces/` | the admin API, the status page and the manual, on `--api` |
//! | `content/` | content steering for HLS and DASH players, on `--steering-http` |
//! | `cluster/` | the set (of one, or of many): its view of the store, the writers of every lever, the session |
//! | `tasks/` | the background tasks that feed the controller: prober, peers, reload, usage feed |
//! | `levers/` | each API command checked once (`admit`), and `explain` |
//! | `disk/` | the state directory: the saved state and the audit log |
//! | `modifiers/` | the modifiers of the weights and their one order: performance, then commit |
//! | `store/` | the set's store of decisions (memory or etcd) and its key schema |
//! | `decide/` | the pure decisions: health, failover steps, drains, the planner (no I/O) |
//!
//! Beside them, used by several rooms: `state_doc` (the `/v1/state` document),
//! `saver` (the thread that saves the state, then shows it), `gauges` (the metrics of the
//! state), `cookies` (the DNS cookie secret, kept in the state directory or the set's
//! store) and `http` (the HTTP server the API and content steering share).

pub mod cluster;
pub mod content;
pub mod controller;
pub(crate) mod cookies;
pub mod decide;
pub mod disk;
pub(crate) mod gauges;
pub(crate) mod http;
pub mod levers;
pub mod modifiers;
pub(crate) mod saver;
pub(crate) mod state_doc;
pub mod store;
pub mod surfaces;
pub mod tasks;
