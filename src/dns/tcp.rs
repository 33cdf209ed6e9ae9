//! Data plane: DNS over TCP (RFC 7766). One task per connection. A resolver pipelines
//! its queries (§6.2.1.1), so the task reads whatever has arrived, answers every whole
//! message in it (steered names by the fast path of `wire.rs`, the rest by the full
//! handler), in order, and writes the answers back in one write: one read and one write
//! per batch, as `udp.rs` does with `recvmmsg`/`sendmmsg`. A batch's answers are
//! written as soon as they pass `OUTPUT_BUDGET` (64 KiB), and the rest of it is answered
//! only once those are taken: a client that pipelines thousands of queries for large
//! answers and reads none holds 64 KiB of answers, not all of them. Buffers grown by a
//! large frame shrink back once it is answered.
//!
//! Limits, each counted in `steerdns_tcp_closed_total{reason}`:
//! - at most `max_connections` open at once, and at most `max_per_source` from one
//!   source prefix (`source_prefix_v4`/`_v6`, [`crate::slots`]); a connection past either is closed as
//!   soon as it is accepted (the client retries, possibly elsewhere) instead of waiting
//!   in the backlog, so that one host cannot hold every slot;
//! - a connection that sends no whole message for `idle_timeout` (idle, or trickling a
//!   byte a second), or that does not read its answers for as long, is closed;
//! - every frame counts, answered or not: a frame that gets no answer (empty, shorter
//!   than a header, a response) closes the connection, so nothing but real queries keeps
//!   a connection open;
//! - after `max_queries` frames (0, the default: no limit, as NSD and Knot) steerdns
//!   reads no more, answers every message it has already read, then closes: the
//!   graceful close of RFC 7766 §6.2.3 (FIN after the last answer, no reset that could
//!   destroy answers in flight).
//!
//! UDP is served by other threads on other sockets, so none of this can starve it.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_server::net::xfer::Protocol;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::{timeout, timeout_at, Instant};
use tokio_util::sync::CancellationToken;

use super::dnstap::{self, Event};
use super::{wire, Handler};
use crate::slots::{Refused, Slot, Slots};

/// How TCP clients are bounded (`--tcp-*` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpLimits {
    pub max_connections: usize,
    /// Open connections from one source prefix at most; 0: no per-source limit.
    pub max_per_source: usize,
    /// The IPv4 prefix `max_per_source` counts by.
    pub source_prefix_v4: u8,
    /// The IPv6 prefix `max_per_source` counts by.
    pub source_prefix_v6: u8,
    /// Longest wait for the next whole message, or for the client to take an answer.
    pub idle_timeout: Duration,
    /// Frames read per connection before steerdns closes it; 0: no limit.
    pub max_queries: u32,
}

impl Default for TcpLimits {
    /// As NSD, Knot and BIND ship: a few hundred connections, seconds of idleness, no
    /// cap on queries per connection (resolvers keep their connections, RFC 7766 §6.2.1);
    /// one /24 or /56 may hold an eighth of the connections.
    fn default() -> Self {
        TcpLimits {
            max_connections: 256,
            max_per_source: 32,
            source_prefix_v4: 24,
            source_prefix_v6: 56,
            idle_timeout: Duration::from_secs(10),
            max_queries: 0,
        }
    }
}

/// The largest read per system call; a resolver's 200 pipelined queries fit.
const READ_CHUNK: usize = 16 * 1024;
/// Answers waiting past this many bytes are written before more queries are answered.
const OUTPUT_BUDGET: usize = 64 * 1024;
/// A buffer grown past this (by a large frame or answer) shrinks back once drained.
const KEEP_CAPACITY: usize = 2 * READ_CHUNK;
/// How long a closing connection may keep sending before it is dropped (its pending
/// queries are discarded meanwhile, so that our FIN is not turned into a reset).
const LINGER: Duration = Duration::from_secs(2);

/// Serves `listener` until `shutdown` is cancelled; open connections are then dropped.
pub async fn serve(
    listener: TcpListener,
    handler: Handler,
    limits: TcpLimits,
    shutdown: CancellationToken,
) {
    // No reserve: a connection past either limit is closed, loopback or not.
    let slots = Slots::new(
        limits.max_connections,
        0,
        limits.source_prefix_v4,
        limits.source_prefix_v6,
    );
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match slots.take(peer.ip(), limits.max_per_source) {
                    Ok(slot) => {
                        conns.spawn(connection(stream, peer, handler.clone(), limits, slot));
                    }
                    Err(refused) => {
                        handler.metrics().tcp_closed(match refused {
                            Refused::Source => "over-source-limit",
                            Refused::Connections => "over-connection-limit",
                        });
                        drop(stream);
                    }
                },
                Err(e) => {
                    // Out of file descriptors, typically: let some connections end.
                    tracing::warn!(error = %e, "cannot accept a TCP connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    handler: Handler,
    limits: TcpLimits,
    _slot: Slot,
) {
    handler.metrics().tcp_connections(1);
    let reason = answer_all(stream, peer, &handler, limits).await;
    handler.metrics().tcp_connections(-1);
    handler.metrics().tcp_closed(reason);
}

/// Answers queries until the connection ends; returns why it ended.
async fn answer_all(
    mut stream: TcpStream,
    peer: SocketAddr,
    handler: &Handler,
    limits: TcpLimits,
) -> &'static str {
    let _ = stream.set_nodelay(true);
    let mut tap = handler.tap();
    let server = stream
        .local_addr()
        .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
    let mut rng = SmallRng::seed_from_u64(rand::rng().random());
    let mut input: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut output: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut reply = Vec::with_capacity(512);
    let mut frames = 0u32;
    // The next whole message must have arrived by then.
    let mut deadline = Instant::now() + limits.idle_timeout;
    loop {
        if input.capacity() - input.len() < READ_CHUNK / 2 {
            input.reserve(READ_CHUNK);
        }
        match timeout_at(deadline, stream.read_buf(&mut input)).await {
            Err(_) => return "idle",
            Ok(Ok(0)) => return "client",
            Ok(Err(_)) => return "error",
            Ok(Ok(_)) => {}
        }
        // Every whole message read so far, answered in order.
        let mut snap = handler.live().load_full();
        let secrets = handler.cookies().load_full();
        let now = crate::clock::now_secs();
        let received = match tap {
            Some(_) => dnstap::now(),
            None => (0, 0),
        };
        let mut at = 0;
        let mut end = None;
        while let Some(message) = frame(&input[at..]) {
            at += 2 + message.len();
            frames = frames.saturating_add(1);
            // Cookies are echoed over TCP, never required (RFC 7873 §5.2.3).
            let judged = wire::cookie_of(message, &secrets, peer.ip(), now);
            handler.metrics().cookie(judged.label());
            let cookie = judged.reply();
            let event = Event::new(true, peer, server, received, message);
            if let Some(steer) =
                wire::answer(&snap, message, peer.ip(), &mut reply, now, &mut rng, cookie)
            {
                handler.count_steered(&steer);
                // The decision's text is looked up only for answers written.
                if let Some(tap) = &mut tap {
                    if tap.keep(steer.remarkable()) {
                        tap.write(&event.answer(&reply).decided(steer.decided()));
                    }
                }
            } else if let Some((full, decided)) =
                handler.respond_decided(message, peer, Protocol::Tcp).await
            {
                reply = full;
                if let Some(tap) = &mut tap {
                    let event = event.answer(&reply);
                    match &decided {
                        Some(d) => tap.log(&event.decided(d.as_ref())),
                        None => tap.log(&event),
                    }
                }
            } else {
                if let Some(tap) = &mut tap {
                    tap.log(&event);
                }
                end = Some("no-answer");
                break;
            }
            let Ok(len) = u16::try_from(reply.len()) else {
                end = Some("error");
                break;
            };
            if output.len() + 2 + reply.len() > OUTPUT_BUDGET {
                // Taken by the client before more is answered; a client that reads slowly
                // must not hold a replaced snapshot (a whole plan) alive meanwhile, so the
                // rest is answered from the one live after the wait.
                drop(snap);
                if let Err(reason) = flush(&mut stream, &mut output, limits.idle_timeout).await {
                    return reason;
                }
                snap = handler.live().load_full();
            }
            output.extend_from_slice(&len.to_be_bytes());
            output.extend_from_slice(&reply);
            if limits.max_queries > 0 && frames >= limits.max_queries {
                // Read no more; what is already read is still answered.
                end.get_or_insert("query-limit");
            }
        }
        drop(snap);
        if at > 0 {
            input.drain(..at);
            deadline = Instant::now() + limits.idle_timeout;
        }
        if let Err(reason) = flush(&mut stream, &mut output, limits.idle_timeout).await {
            return reason;
        }
        shrink(&mut input);
        shrink(&mut reply);
        if let Some(reason) = end {
            close(stream, limits.idle_timeout.min(LINGER)).await;
            return reason;
        }
    }
}

/// Writes `output` (within `wait`) and empties it; why the connection ends if it fails.
async fn flush(
    stream: &mut TcpStream,
    output: &mut Vec<u8>,
    wait: Duration,
) -> Result<(), &'static str> {
    if output.is_empty() {
        return Ok(());
    }
    let wrote = timeout(wait, stream.write_all(output)).await;
    output.clear();
    shrink(output);
    match wrote {
        Err(_) => Err("idle"),
        Ok(Err(_)) => Err("error"),
        Ok(Ok(())) => Ok(()),
    }
}

/// Gives back what a large frame or answer made `buf` grow by, once it is drained.
fn shrink(buf: &mut Vec<u8>) {
    if buf.capacity() > KEEP_CAPACITY && buf.len() < READ_CHUNK {
        buf.shrink_to(READ_CHUNK);
    }
}

/// The message of the first frame of `buf` if it is whole.
fn frame(buf: &[u8]) -> Option<&[u8]> {
    let len = usize::from(u16::from_be_bytes([*buf.first()?, *buf.get(1)?]));
    buf.get(2..2 + len)
}

/// Closes gracefully: FIN after the answers written, then reads and discards until the
/// client closes its side (or `linger` passes), so that no unread query turns the close
/// into a reset that would destroy answers still in flight.
async fn close(mut stream: TcpStream, linger: Duration) {
    if stream.shutdown().await.is_err() {
        return;
    }
    let mut sink = [0u8; 4096];
    let _ = timeout(linger, async {
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_taken_whole() {
        assert_eq!(frame(&[]), None);
        assert_eq!(frame(&[0]), None);
        assert_eq!(frame(&[0, 0]), Some(&[][..]));
        assert_eq!(frame(&[0, 2, 7]), None);
        assert_eq!(frame(&[0, 2, 7, 8, 9]), Some(&[7, 8][..]));
    }
}
