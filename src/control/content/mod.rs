//! Content steering for HLS and DASH players: the same plan snapshot the DNS answers
//! from (region, health, failover steps, drains), served to players as steering
//! manifests on `--steering-http` (default `127.0.0.1:8053`).
//!
//! ```text
//! player ── GET /steer/hls/{name}?session=…&_HLS_pathway=a&_HLS_throughput=… ──▶ server.rs
//!    limits (http.rs accept loop), CORS, methods, client address (X-Forwarded-For from
//!    --trusted-proxies only)
//!      ─▶ manifest.rs: parse the query ─▶ where the client lands (Steered::situate, as DNS)
//!      ─▶ weighted order of the pathways for the session ─▶ demotions ─▶ JSON
//! ◀── {"VERSION":1,"TTL":15,"RELOAD-URI":"www.example.com?session=…&ticket=…",
//!      "STEERDNS-TICKET":"…","PATHWAY-PRIORITY":["a","b"]}
//!
//! player ── POST /rum/{name} {"ticket":"…","samples":[…]} (application/json) ──▶ server.rs
//!    CORS for --beacon-origin only, rate per network, the ticket checked for the name and
//!    the client's region (ticket.rs) ─▶ control/modifiers/perf/ (Samples::record)
//! ```
//!
//! - [`manifest`]: pure: the request's parameters, the order of the pathways and the
//!   manifest's bytes. `explain` uses it too, so that it says what a player gets.
//! - [`server`]: the HTTP server: routes, CORS, `Cache-Control`, errors, metrics.
//! - [`ticket`]: beacon tickets, the HMAC that makes a beacon count.
//!
//! A DASH manifest carries its list under both `SERVICE-LOCATION-PRIORITY` (DASH-IF)
//! and `PATHWAY-PRIORITY`, which is the key dash.js reads for DASH.
//!
//! Specifications: HLS Content Steering (Apple, `EXT-X-CONTENT-STEERING`,
//! `PATHWAY-PRIORITY`, `_HLS_pathway`, `_HLS_throughput`), DASH-IF Content Steering
//! (`<ContentSteering>`, `SERVICE-LOCATION-PRIORITY`, `_DASH_pathway`,
//! `_DASH_throughput`), and their common draft, draft-pantos-content-steering.

pub(crate) mod manifest;
pub mod server;
pub mod ticket;

pub use manifest::{Format, Order, Params};
pub use server::{spawn, SteeringOptions};
