//! Control plane, the background tasks that feed the controller: probes, peers, reloads and the
//! usage feed. Each runs on its own and sends what it found.
//!
//! | room | holds |
//! |---|---|
//! | `prober` | probes each CDN through its real path |
//! | `peers` | reads other vantage points over HTTP (a set of one) |
//! | `reload` | watches the inputs and reloads them |
//! | `feed` | pulls usage records from `--usage-url` |

pub(crate) mod feed;
pub(crate) mod peers;
pub mod prober;
pub(crate) mod reload;
