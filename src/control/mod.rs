//! Control plane: everything that waits, polls or reloads, and builds new plans. Never
//! on the query path.

pub mod planner;
