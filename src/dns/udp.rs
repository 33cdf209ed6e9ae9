//! Data plane: one task per UDP socket. It takes datagrams in batches (`recvmmsg`, up to
//! [`BATCH`] per system call), answers each one (the fast path in `wire.rs`, else the
//! full handler), and sends the answers back in one `sendmmsg`.
//!
//! Per datagram the task drops what must not be answered (sources with port 0, an
//! unspecified or broadcast address; datagrams larger than [`RECV_BUF`]), then asks the
//! rate limiter, then answers. Nothing here allocates once the buffers have grown, unless
//! the query takes the full path.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::rrl::{Rrl, Verdict};
use super::{wire, Handler};
use hickory_server::net::xfer::Protocol;

/// Datagrams per system call, as gdnsd and the floor program in `../shared/peers` use.
pub const BATCH: usize = 64;
/// The largest query read; longer datagrams are dropped (no DNS query is near it).
pub const RECV_BUF: usize = 4096;

/// Serves `socket` until `shutdown` is cancelled.
pub async fn serve(
    socket: UdpSocket,
    handler: Handler,
    rrl: Option<Arc<Rrl>>,
    shutdown: CancellationToken,
) {
    let mut rng = SmallRng::seed_from_u64(rand::rng().random());
    let mut batch = mmsg::Batch::new();
    let mut out: Vec<Vec<u8>> = (0..BATCH).map(|_| Vec::with_capacity(512)).collect();
    let mut replies: Vec<usize> = Vec::with_capacity(BATCH);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            ready = socket.readable() => {
                if let Err(e) = ready {
                    tracing::error!(error = %e, "UDP socket failed; this socket stops answering");
                    return;
                }
            }
        }
        // Drain the socket, batch by batch, until it would block.
        loop {
            let n = match socket.try_io(Interest::READABLE, || batch.recv(&socket)) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::debug!(error = %e, "UDP receive error");
                    break;
                }
            };
            let started = Instant::now();
            let snap = handler.live().load_full();
            replies.clear();
            // The full path times its own queries; the fast path's share is the rest.
            let (mut fast, mut full_time) = (0, Duration::ZERO);
            for (i, reply) in out.iter_mut().enumerate().take(n) {
                let (packet, src) = match batch.get(i) {
                    Some(p) => p,
                    None => {
                        handler.metrics().dropped("oversized");
                        continue;
                    }
                };
                if !answerable(src) {
                    handler.metrics().dropped("bad-source");
                    continue;
                }
                if let Some(rrl) = &rrl {
                    match rrl.check(src.ip()) {
                        Verdict::Answer => {}
                        Verdict::Drop => {
                            handler.metrics().rate_limited(false);
                            continue;
                        }
                        Verdict::Slip => {
                            handler.metrics().rate_limited(true);
                            if wire::truncated(packet, reply) {
                                replies.push(i);
                            }
                            continue;
                        }
                    }
                }
                if let Some(steer) = wire::answer(&snap, packet, src.ip(), reply, &mut rng) {
                    handler.count_steered(&steer);
                    replies.push(i);
                    fast += 1;
                    continue;
                }
                let full_started = Instant::now();
                if let Some(bytes) = handler.respond(packet, src, Protocol::Udp).await {
                    *reply = bytes;
                    replies.push(i);
                }
                full_time += full_started.elapsed();
            }
            drop(snap);
            let fast_time = started.elapsed().saturating_sub(full_time);
            handler.metrics().observe_batch(fast_time, fast);
            send_all(&socket, &mut batch, &out, &replies, &handler, &shutdown).await;
            // Let the other tasks of this worker run under a sustained flood.
            tokio::task::consume_budget().await;
        }
    }
}

/// Sends every reply; waits while the socket's send buffer is full.
async fn send_all(
    socket: &UdpSocket,
    batch: &mut mmsg::Batch,
    out: &[Vec<u8>],
    replies: &[usize],
    handler: &Handler,
    shutdown: &CancellationToken,
) {
    let mut done = 0;
    while done < replies.len() {
        match socket.try_io(Interest::WRITABLE, || {
            batch.send(socket, out, &replies[done..])
        }) {
            Ok(sent) => done += sent,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    r = socket.writable() => if r.is_err() { return },
                }
            }
            Err(e) => {
                // This one reply cannot go (an unroutable source, say): skip it.
                tracing::debug!(error = %e, "UDP send error");
                handler.metrics().dropped("send-error");
                done += 1;
            }
        }
    }
}

/// Whether a reply may be sent to `src` (hickory's rule): not port 0, not the
/// unspecified address, not IPv4 broadcast.
fn answerable(src: SocketAddr) -> bool {
    src.port() != 0
        && !src.ip().is_unspecified()
        && !matches!(src, SocketAddr::V4(a) if a.ip().is_broadcast())
}

#[cfg(target_os = "linux")]
mod mmsg {
    //! `recvmmsg`/`sendmmsg` over reused buffers. The only `unsafe` of the data plane:
    //! the kernel writes into buffers we own for the duration of each call.

    use std::io;
    use std::mem;
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
    use std::os::fd::AsRawFd;

    use tokio::net::UdpSocket;

    use super::{BATCH, RECV_BUF};

    pub struct Batch {
        bufs: Box<[[u8; RECV_BUF]]>,
        /// Per datagram: its length (`None`: truncated by the kernel) and source.
        got: Vec<(Option<usize>, SocketAddr)>,
        names: Box<[libc::sockaddr_storage]>,
        name_lens: Box<[libc::socklen_t]>,
    }

    impl Batch {
        pub fn new() -> Batch {
            // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
            let zero: libc::sockaddr_storage = unsafe { mem::zeroed() };
            Batch {
                bufs: vec![[0u8; RECV_BUF]; BATCH].into_boxed_slice(),
                got: Vec::with_capacity(BATCH),
                names: vec![zero; BATCH].into_boxed_slice(),
                name_lens: vec![0; BATCH].into_boxed_slice(),
            }
        }

        /// Datagram `i` of the last receive and its source; `None` if it was too long.
        pub fn get(&self, i: usize) -> Option<(&[u8], SocketAddr)> {
            let (len, src) = self.got[i];
            Some((&self.bufs[i][..len?], src))
        }

        /// One `recvmmsg` without blocking: the number of datagrams received.
        pub fn recv(&mut self, socket: &UdpSocket) -> io::Result<usize> {
            // SAFETY: all-zero iovec and mmsghdr are valid (null pointers, zero lengths).
            let mut iovs: [libc::iovec; BATCH] = unsafe { mem::zeroed() };
            let mut msgs: [libc::mmsghdr; BATCH] = unsafe { mem::zeroed() };
            for i in 0..BATCH {
                iovs[i].iov_base = self.bufs[i].as_mut_ptr().cast();
                iovs[i].iov_len = RECV_BUF;
                let h = &mut msgs[i].msg_hdr;
                h.msg_name = (&mut self.names[i] as *mut libc::sockaddr_storage).cast();
                h.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                h.msg_iov = &mut iovs[i];
                h.msg_iovlen = 1;
            }
            // SAFETY: every pointer in `msgs` points into `self` or `iovs`, which outlive
            // the call; the kernel writes at most the lengths given.
            let n = unsafe {
                libc::recvmmsg(
                    socket.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    BATCH as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = n as usize;
            self.got.clear();
            for (i, m) in msgs.iter().enumerate().take(n) {
                self.name_lens[i] = m.msg_hdr.msg_namelen;
                let truncated = m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
                let len = (!truncated).then_some(m.msg_len as usize);
                let src = to_socket_addr(&self.names[i])
                    .unwrap_or(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)));
                self.got.push((len, src));
            }
            Ok(n)
        }

        /// One `sendmmsg` without blocking of `out[slot]` to the source of datagram
        /// `slot`, for each `(slot, buf)`: the number sent (at least 1), or the error
        /// of the first.
        pub fn send(
            &mut self,
            socket: &UdpSocket,
            out: &[Vec<u8>],
            replies: &[usize],
        ) -> io::Result<usize> {
            // SAFETY: as in `recv`.
            let mut iovs: [libc::iovec; BATCH] = unsafe { mem::zeroed() };
            let mut msgs: [libc::mmsghdr; BATCH] = unsafe { mem::zeroed() };
            let n = replies.len().min(BATCH);
            for (j, &slot) in replies.iter().take(n).enumerate() {
                iovs[j].iov_base = out[slot].as_ptr() as *mut libc::c_void;
                iovs[j].iov_len = out[slot].len();
                let h = &mut msgs[j].msg_hdr;
                h.msg_name = (&mut self.names[slot] as *mut libc::sockaddr_storage).cast();
                h.msg_namelen = self.name_lens[slot];
                h.msg_iov = &mut iovs[j];
                h.msg_iovlen = 1;
            }
            // SAFETY: the kernel only reads through these pointers, which outlive the call.
            let sent = unsafe {
                libc::sendmmsg(
                    socket.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    n as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if sent < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(sent as usize)
        }
    }

    fn to_socket_addr(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
        match i32::from(s.ss_family) {
            libc::AF_INET => {
                // SAFETY: the kernel wrote a sockaddr_in for this family.
                let a: &libc::sockaddr_in = unsafe { &*(s as *const _ as *const _) };
                let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
                Some(SocketAddr::V4(SocketAddrV4::new(
                    ip,
                    u16::from_be(a.sin_port),
                )))
            }
            libc::AF_INET6 => {
                // SAFETY: the kernel wrote a sockaddr_in6 for this family.
                let a: &libc::sockaddr_in6 = unsafe { &*(s as *const _ as *const _) };
                let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
                Some(SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    u16::from_be(a.sin6_port),
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod mmsg {
    //! One datagram per system call, where `recvmmsg` is not available.

    use std::io;
    use std::net::SocketAddr;

    use tokio::net::UdpSocket;

    use super::RECV_BUF;

    pub struct Batch {
        buf: Box<[u8; RECV_BUF]>,
        got: (usize, SocketAddr),
    }

    impl Batch {
        pub fn new() -> Batch {
            Batch {
                buf: Box::new([0u8; RECV_BUF]),
                got: (0, SocketAddr::from(([0, 0, 0, 0], 0))),
            }
        }

        pub fn get(&self, _i: usize) -> Option<(&[u8], SocketAddr)> {
            Some((&self.buf[..self.got.0], self.got.1))
        }

        pub fn recv(&mut self, socket: &UdpSocket) -> io::Result<usize> {
            self.got = socket.try_recv_from(&mut self.buf[..])?;
            Ok(1)
        }

        pub fn send(
            &mut self,
            socket: &UdpSocket,
            out: &[Vec<u8>],
            replies: &[usize],
        ) -> io::Result<usize> {
            let (_, buf) = replies[0];
            socket.try_send_to(&out[slot], self.got.1)?;
            Ok(1)
        }
    }
}
