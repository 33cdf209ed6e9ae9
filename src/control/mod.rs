//! Control plane: everything that waits, polls or reloads, and builds new plans. Never
//! on the query path.

pub mod api;
pub mod audit;
pub mod book;
pub mod chain;
pub mod cluster;
pub mod command;
pub mod commit;
pub mod content;
pub mod controller;
pub mod cookies;
pub mod drains;
pub mod explain;
pub mod failover;
pub mod feed;
pub mod gauges;
pub mod health;
pub mod http;
pub mod keys;
pub mod peers;
pub mod perf;
pub mod persist;
pub mod planner;
pub mod prober;
pub mod reload;
pub mod saver;
pub mod state;
pub mod state_doc;
pub mod status;
pub mod stepper;
pub mod store;
pub mod times;
pub mod writers;
