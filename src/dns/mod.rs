//! Data plane: one DNS query in, one response out.
//!
//! ```text
//! UDP socket ─▶ udp.rs: batches of datagrams (recvmmsg/sendmmsg), rate limit (rrl.rs)
//!    ├─ steered name, plain form ─▶ wire.rs: answered from the bytes (the fast path)
//!    ├─ other name, plain form ─▶ cache.rs: the full path's answer, replayed
//!    └─ anything else (and cache misses) ─┐
//! TCP listener ─▶ tcp.rs ─┴▶ Handler::respond: hickory decode ─▶ Handler::handle_request
//!    EDNS/ECS checks ─▶ TSIG? (NOTAUTH) ─▶ opcode (NOTIMP) ─▶ one question, class IN
//!    ─▶ steered name? ──no──▶ zones (hickory Catalog), ECS scope 0
//!                            │yes
//!    client location (ECS | source) ─▶ geo lookup ─▶ region ─▶ weighted pick ─▶ CNAME + ECS scope
//!                                     (key: resolver, network within the scope, window)
//! every answer (and every RRL drop) ─▶ dnstap/ (--dnstap): sampled, copied into a pooled
//!    record (never waits) ─▶ writer thread ─▶ Frame Streams collector
//! ```
//!
//! No locks and no I/O besides the sockets; everything expensive was done by the
//! planner. The DNS message format is known here (through hickory), in `wire.rs` (the
//! fast path's reading and writing, the slip), in `cache.rs` (a cached answer's OPT
//! and ECS echo), and in `edns.rs` (the layout of an ECS option).

pub mod cache;
pub mod cookie;
pub mod dnstap;
pub(crate) mod edns;
mod handler;
pub(crate) mod listen;
mod retry;
pub mod rrl;
pub mod tcp;
pub(crate) mod udp;
pub mod wire;
pub use handler::*;
