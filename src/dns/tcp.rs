//! Data plane: DNS over TCP (RFC 7766). One task per connection; queries on a connection
//! are answered in order, so pipelined queries all get their answers.
//!
//! Limits, each counted in `steerdns_tcp_closed_total{reason}`:
//! - at most `max_connections` open at once; a connection past that is closed as soon
//!   as it is accepted (the client retries, possibly elsewhere) instead of waiting in the
//!   backlog;
//! - a connection that is idle, or that takes longer than `idle_timeout` to send one
//!   message (one byte a second, say), or to read one answer, is closed;
//! - after `max_queries` answers a connection is closed (RFC 7766 §6.2.3 lets servers
//!   close connections; clients reconnect).
//!
//! UDP is served by other tasks on other sockets, so none of this can starve it.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_server::net::xfer::Protocol;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

use super::Handler;

/// How TCP clients are bounded (`--tcp-*` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpLimits {
    pub max_connections: usize,
    /// Longest wait for the next message, or for one message to arrive whole.
    pub idle_timeout: Duration,
    /// Answers per connection before steerdns closes it; 0: no limit.
    pub max_queries: u32,
}

impl Default for TcpLimits {
    /// As NSD, Knot and BIND ship: a few hundred connections, seconds of idleness.
    fn default() -> Self {
        TcpLimits {
            max_connections: 256,
            idle_timeout: Duration::from_secs(10),
            max_queries: 1000,
        }
    }
}

/// Serves `listener` until `shutdown` is cancelled; open connections are then dropped.
pub async fn serve(
    listener: TcpListener,
    handler: Handler,
    limits: TcpLimits,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match slots.clone().try_acquire_owned() {
                    Ok(slot) => {
                        conns.spawn(connection(stream, peer, handler.clone(), limits, slot));
                    }
                    Err(_) => {
                        handler.metrics().tcp_closed("over-connection-limit");
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
    _slot: OwnedSemaphorePermit,
) {
    handler.metrics().tcp_connections(1);
    let reason = answer_all(stream, peer, &handler, limits).await;
    handler.metrics().tcp_connections(-1);
    handler.metrics().tcp_closed(reason);
}

/// Answers queries until the connection ends; returns why it ended.
async fn answer_all(
    stream: TcpStream,
    peer: SocketAddr,
    handler: &Handler,
    limits: TcpLimits,
) -> &'static str {
    let _ = stream.set_nodelay(true);
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let mut message = Vec::new();
    let mut frame = Vec::new();
    let mut answered = 0u32;
    loop {
        let mut len = [0u8; 2];
        if let Err(reason) = within(limits.idle_timeout, rd.read_exact(&mut len)).await {
            return reason;
        }
        message.resize(usize::from(u16::from_be_bytes(len)), 0);
        if let Err(reason) = within(limits.idle_timeout, rd.read_exact(&mut message)).await {
            return reason;
        }
        let Some(response) = handler.respond(&message, peer, Protocol::Tcp).await else {
            continue;
        };
        let Ok(len) = u16::try_from(response.len()) else {
            return "error";
        };
        frame.clear();
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend_from_slice(&response);
        if let Err(reason) = within(limits.idle_timeout, wr.write_all(&frame)).await {
            return reason;
        }
        answered += 1;
        if limits.max_queries > 0 && answered >= limits.max_queries {
            return "query-limit";
        }
    }
}

/// Runs one read or write with the idle timeout; the error is the close reason.
async fn within<T>(
    limit: Duration,
    io: impl std::future::Future<Output = io::Result<T>>,
) -> Result<T, &'static str> {
    match timeout(limit, io).await {
        Err(_) => Err("idle"),
        Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => Err("client"),
        Ok(Err(_)) => Err("error"),
        Ok(Ok(v)) => Ok(v),
    }
}
