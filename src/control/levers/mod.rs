//! Control plane, the levers as the API hands them to the controller: each command checked once
//! (`admit`), and `explain`, why a client gets the answer it gets.
//!
//! | room | holds |
//! |---|---|
//! | `command` | `Command`, what the API asks the controller, and the checks each lever passes |
//! | `explain` | `explain`: one typed explanation for the API and the command line |
//! | `stages` | `Stages`, a staged policy rollout's stages, and where it is at an instant |

pub mod command;
pub(crate) mod explain;
pub mod stages;
