//! Control plane: the controller, the event loop (`Controller::run`). Each finished
//! probe round becomes a verdict (this vantage point's result plus the peers' fresh
//! ones, by quorum), the verdicts go through hysteresis, health changes start failover
//! steps, and every change of the steps publishes a new plan. An API command is checked
//! once (`on_command`), then applied here or, in a set, handed to the set's writer
//! (`cluster/node.rs`). Every state change is logged with its evidence, and the state
//! (`state.rs`) is saved so that a restart resumes where it was.
//!
//! ```text
//!  prober rounds ─┐
//!  peers' views ──┴─▶ verdict (quorum) ─▶ Tracker (hysteresis) ─▶ Stepper ─▶ planner ─▶ Live
//! ```
//!
//! This file holds the controller's fields, its start (`new`, `restore`) and the loop;
//! each kind of event is handled in its own file:
//!
//! | file | handles |
//! |---|---|
//! | `rounds.rs` | probe rounds: `start_probing`, `on_round`, `tick_steps`, `note_steps` |
//! | `commands.rs` | API commands: `on_command`, `explain` |
//! | `reloads.rs` | configuration reloads: `on_reload`, `reload_diff` |
//! | `modifiers.rs` | what the clock brings due: `resign`, `evaluate_perf`, `evaluate_commit` |
//! | `set.rs` | a node of a set: `peer_views`, `on_shared`, `follow_commit` |
//! | `publish.rs` | serving and showing: `plan`, `publish`, `persist`, `show`, `reply` |

mod commands;
mod event_loop;
mod modifiers;
mod publish;
mod reloads;
mod rounds;
mod set;
mod upgrade;
pub use event_loop::*;
