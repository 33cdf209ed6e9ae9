//! dnstap out (`serve --dnstap unix:PATH|tcp:HOST:PORT`): every query and its response
//! as `AUTH_QUERY` and `AUTH_RESPONSE` frames, the steering decision of each steered
//! response in its `Policy` (and, in one line, in `extra`), to a collector such as
//! `fstrm_capture`, over Frame Streams.
//!
//! | file | what |
//! |---|---|
//! | `sink.rs` | the data plane's [`Tap`], sampling, the bounded pool of records, the writer thread (reconnects with backoff) |
//! | `message.rs` | dnstap's protobuf, encoded by hand, and the decision's one line |
//! | `frames.rs` | Frame Streams: data frames, the READY/ACCEPT/START/STOP/FINISH control frames |
//!
//! The data plane calls [`Tap::log`] once per query, after answering it (a rate-limited
//! query dropped unanswered gets an `AUTH_QUERY` only); a server without `--dnstap` has
//! no tap, and pays one branch.

mod frames;
mod message;
mod sink;

pub use message::Record;
pub use sink::{now, remarkable, Config, Counters, Decided, Dnstap, Endpoint, Event, Tap};
