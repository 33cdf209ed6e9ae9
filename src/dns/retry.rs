//! What a failed socket call means to a loop that calls it again: the one reading of an
//! `io::Error` that the UDP loop (receive and send) and dnstap's writer share. Each loop
//! keeps its own budget for how long it goes on (`SEND_TIMEOUT` and the batch deadline
//! in `udp.rs`, `STALL_LIMIT` in `dnstap/sink.rs`).

use std::io;

/// How a socket call failed, as a retrying loop sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Failure {
    /// A signal came first (`EINTR`): call again at once.
    Interrupted,
    /// The socket's timeout passed with nothing done (`EAGAIN`, `ETIMEDOUT`): call again
    /// while the loop's budget lasts.
    TimedOut,
    /// Anything else: the call failed.
    Failed,
}

/// How `e` failed.
///
/// # Hot path
/// A match on the error's kind; no allocation.
#[inline]
pub(super) fn failure(e: &io::Error) -> Failure {
    match e.kind() {
        io::ErrorKind::Interrupted => Failure::Interrupted,
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Failure::TimedOut,
        _ => Failure::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_reads_as_its_failure() {
        let of = |k: io::ErrorKind| failure(&io::Error::from(k));
        assert_eq!(of(io::ErrorKind::Interrupted), Failure::Interrupted);
        assert_eq!(of(io::ErrorKind::WouldBlock), Failure::TimedOut);
        assert_eq!(of(io::ErrorKind::TimedOut), Failure::TimedOut);
        assert_eq!(of(io::ErrorKind::ConnectionRefused), Failure::Failed);
        assert_eq!(of(io::ErrorKind::WriteZero), Failure::Failed);
    }
}
