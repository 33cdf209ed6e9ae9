//! Control plane: the controller, the event loop (`Controller::run`). Each finished
//! probe round becomes a verdict (this vantage point's result plus the peers' fresh
//! ones, by quorum), the verdicts go through hysteresis, and a health change writes the
//! set's failover timelines. An API command is checked once (`on_command`) and written
//! to the set's store (`cluster/node.rs`); every decision is applied from the store's
//! view (`on_shared`), on a single node (a set of one, its store in memory) as in a set
//! (etcd), and each change publishes a new plan. Every state change is logged with its
//! evidence, and the state is saved so that a restart resumes where it was.
//!
//! ```text
//!  prober rounds ─┐                                      ┌─ API levers (checked once)
//!  peers' views ──┴─▶ verdict (quorum) ─▶ Tracker ─▶ store (memory or etcd) ─▶ view
//!        ─▶ timelines, drains, freezes, shifts, biases ─▶ chain ─▶ planner ─▶ Live
//! ```
//!
//! | file | handles |
//! |---|---|
//! | `event_loop.rs` | the controller's fields, its start (`new`, `join`, `restore`) and the loop (`run`) |
//! | `rounds.rs` | probe rounds: `start_probing`, `on_round`, `tick_steps`, `note_steps` |
//! | `commands.rs` | API commands: `on_command`, `explain` |
//! | `reloads.rs` | configuration reloads: `apply_reload`, `refuse_reload`, `reload_diff` |
//! | `policy.rs` | the policy as the set's version: `on_reload` (a file edit proposed, the set's version switched to at its instant or refused), `follow_policy`, `apply_policy` (`POST /v1/policy`) |
//! | `rollout.rs` | a staged rollout: `follow_rollout` (the version before kept in force, the new one loaded beside it), `on_canary`, `canary` (the snapshot's second plan), `tick_rollout` (stages, errors), `halt_rollout`, `halt_policy` (`POST /v1/policy/halt`) |
//! | `modifiers.rs` | what the clock brings due: `resign`, `evaluate_perf`, `evaluate_commit` |
//! | `set.rs` | the set's view: `peer_views`, `on_shared`, `follow_commit`, the answers of writes (`on_written`) |
//! | `publish.rs` | serving and showing: `plan`, `publish`, `persist`, `show`, `answer` |
//! | `upgrade.rs` | a state saved before the store, turned into the store's keys |

mod commands;
mod event_loop;
mod modifiers;
mod policy;
mod publish;
mod reloads;
mod rollout;
mod rounds;
mod set;
mod upgrade;
pub use event_loop::*;
