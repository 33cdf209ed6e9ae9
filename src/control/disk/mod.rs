//! Control plane, the state directory: what is saved across restarts, and the audit log.
//!
//! | room | holds |
//! |---|---|
//! | `persist` | `Saved`: the state file, written atomically and durably, restored at start |
//! | `traffic` | the recorded traffic `steerdns-traffic.json`: beacon samples by source network, for `diff` |
//! | `audit/` | the hash-chained audit log `audit.jsonl`: appending (`log`), pages (`index`), the chain and `verify` (`chain`) |
//! | `writers` | the threads that write here, and waiting until they finish |

pub mod audit;
pub mod persist;
pub mod traffic;
pub(crate) mod writers;
