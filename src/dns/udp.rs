//! Data plane: one thread per UDP socket, as gdnsd, NSD and Knot do. It waits in a
//! blocking `recvmmsg` (woken by the first datagram, it takes up to [`BATCH`] that are
//! queued), answers each one (the fast path in `wire.rs`, else the answer cache of
//! `cache.rs`, else the full handler), and
//! sends the answers back in one `sendmmsg`. No event loop sits between the socket and
//! the answer: at low rates that is one wakeup per query, at high rates one pair of
//! system calls per batch.
//!
//! A panic in a thread (a bug) must not leave its socket in the `SO_REUSEPORT` group
//! with nobody reading it, silently dropping the share of the flows the kernel hashes to
//! it: each thread's loop is supervised, and a panic is logged, counted in
//! `steerdns_udp_thread_restarts_total`, and the loop restarted on the same socket (the
//! batch being answered is lost).
//!
//! Per datagram the thread drops what must not be answered (sources with port 0, an
//! unspecified or broadcast address; datagrams larger than [`RECV_BUF`]), judges its DNS
//! cookie (`cookie.rs`), then asks the rate limiter (a valid cookie: the client's own
//! budget; a limited client that sent a cookie: `BADCOOKIE` instead of the slip), then
//! answers. Nothing here allocates once the buffers have grown, unless
//! the query takes the full path, which runs on the tokio runtime's handle.

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use super::cache::{AnswerCache, Lookup};
use super::dnstap::{self, Event};
use super::retry::{self, Failure};
use super::rrl::{Rrl, Verdict};
use super::{wire, Handler};
use hickory_server::net::xfer::Protocol;

/// Datagrams per system call, as gdnsd and the floor program in `../shared/peers` use.
pub(crate) const BATCH: usize = 64;
/// The largest query read; longer datagrams are dropped (no DNS query is near it).
pub(crate) const RECV_BUF: usize = 4096;
/// How long one send may wait for room in a full send buffer (the socket's
/// `SO_SNDTIMEO`); a send that times out drops the rest of its batch.
const SEND_TIMEOUT: Duration = Duration::from_millis(100);
/// How long sending one batch may take in all, retries after errors included; what is
/// left then is dropped and counted, so that a thread is never held for long by egress.
const SEND_BUDGET: Duration = Duration::from_millis(200);

/// A running UDP thread.
pub(crate) struct UdpThread {
    socket: Arc<UdpSocket>,
    ended: tokio::sync::oneshot::Receiver<()>,
}

/// A fault injected for tests: a UDP thread that receives a query for this name (in
/// wire form, as sent) panics. `None` in every real configuration.
pub(crate) type PanicOn = Option<Arc<[u8]>>;

/// Starts the thread serving `socket` until `shutdown` is cancelled and
/// [`UdpThread::wake`] called. `runtime` runs the full path.
pub(crate) fn spawn(
    socket: UdpSocket,
    handler: Handler,
    rrl: Option<Arc<Rrl>>,
    shutdown: CancellationToken,
    runtime: Handle,
    panic_on: PanicOn,
    cache_bytes: usize,
) -> io::Result<UdpThread> {
    socket.set_nonblocking(false)?;
    mmsg::dont_fragment(&socket)?;
    // No receive timeout: a sleep with a timer arms it each time (a VM exit on KVM
    // guests); the thread is woken for shutdown by `wake` instead.
    socket.set_write_timeout(Some(SEND_TIMEOUT))?;
    let socket = Arc::new(socket);
    let (done, ended) = tokio::sync::oneshot::channel();
    let theirs = socket.clone();
    std::thread::Builder::new()
        .name("steerdns-udp".into())
        .spawn(move || {
            supervise(
                &theirs,
                &handler,
                rrl.as_deref(),
                &shutdown,
                &runtime,
                &panic_on,
                cache_bytes,
            );
            let _ = done.send(());
        })?;
    Ok(UdpThread { socket, ended })
}

impl UdpThread {
    /// Wakes the thread from its receive so that it sees the cancelled token: shutting
    /// down the socket's read side makes a waiting `recvmmsg` return (the call reports
    /// ENOTCONN for an unconnected socket, and wakes the waiter all the same).
    pub(crate) fn wake(&self) {
        let _ = socket2::SockRef::from(&*self.socket).shutdown(std::net::Shutdown::Read);
    }

    /// Returns when the thread has ended; an error if it panicked.
    pub(crate) async fn ended(self) -> io::Result<()> {
        self.ended
            .await
            .map_err(|_| io::Error::other("a UDP thread panicked"))
    }
}

/// Runs [`serve`] until shutdown, restarting it on the same socket after a panic.
fn supervise(
    socket: &UdpSocket,
    handler: &Handler,
    rrl: Option<&Rrl>,
    shutdown: &CancellationToken,
    runtime: &Handle,
    panic_on: &PanicOn,
    cache_bytes: usize,
) {
    while !shutdown.is_cancelled() {
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            serve(
                socket,
                handler,
                rrl,
                shutdown,
                runtime,
                panic_on.as_deref(),
                cache_bytes,
            )
        }));
        let Err(panic) = served else {
            return;
        };
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!(panic = %what, "a UDP thread panicked; restarting it on its socket");
        handler.metrics().udp_thread_restarted();
        // A panic on every batch must not spin a CPU.
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn serve(
    socket: &UdpSocket,
    handler: &Handler,
    rrl: Option<&Rrl>,
    shutdown: &CancellationToken,
    runtime: &Handle,
    panic_on: Option<&[u8]>,
    cache_bytes: usize,
) {
    let mut rng = SmallRng::seed_from_u64(rand::rng().random());
    let mut batch = mmsg::Batch::new();
    let mut out: Vec<Vec<u8>> = (0..BATCH).map(|_| Vec::with_capacity(512)).collect();
    let mut replies: Vec<usize> = Vec::with_capacity(BATCH);
    let mut cache = AnswerCache::new(cache_bytes);
    let mut stripped = Vec::with_capacity(512);
    let mut tap = handler.tap();
    let server = socket
        .local_addr()
        .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
    while !shutdown.is_cancelled() {
        let n = match batch.recv(socket) {
            // Woken by `UdpThread::wake`.
            Ok(0) => continue,
            Ok(n) => n,
            // Interrupted, or the read timeout passed with nothing received.
            Err(e) if retry::failure(&e) != Failure::Failed => continue,
            Err(e) => {
                tracing::warn!(error = %e, "UDP receive error");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        // Woken for shutdown, `recvmmsg` may report empty datagrams from stale sources.
        if shutdown.is_cancelled() {
            break;
        }
        let started = Instant::now();
        // dnstap's query time: once per batch (the batch was read at once).
        let received = match tap {
            Some(_) => dnstap::now(),
            None => (0, 0),
        };
        let snap = handler.live().load();
        let secrets = handler.cookies().load();
        // Seconds are all the selection window and cookies need: once per batch.
        let now = crate::clock::now_secs();
        replies.clear();
        // The full path times its own queries; the fast path's share is the rest.
        let (mut fast, mut full_time) = (0, Duration::ZERO);
        for (i, reply) in out.iter_mut().enumerate().take(n) {
            let Some((packet, src)) = batch.get(i) else {
                handler.metrics().dropped("oversized");
                continue;
            };
            if !answerable(src) {
                handler.metrics().dropped("bad-source");
                continue;
            }
            if let Some(name) = panic_on {
                if packet.get(12..12 + name.len()) == Some(name) {
                    panic!("injected UDP thread panic (a test's panic_on name)");
                }
            }
            // The COOKIE option, judged once for the rate limiter and the answer.
            let judged = wire::cookie_of(packet, &secrets, src.ip(), now);
            handler.metrics().cookie(judged.label());
            let cookie = judged.reply();
            let event = Event::new(false, src, server, received, packet);
            // A valid server cookie: the client's own budget, never a slip.
            let own = judged.is_valid();
            if let Some(rrl) = rrl {
                let verdict = if own {
                    rrl.check_own(src.ip())
                } else {
                    rrl.check(src.ip())
                };
                match verdict {
                    Verdict::Answer => {}
                    Verdict::Drop => {
                        handler.metrics().rate_limited(false);
                        // Nothing was sent: the query alone.
                        if let Some(tap) = &mut tap {
                            tap.log(&event.limited());
                        }
                        continue;
                    }
                    // A client cookie without a valid server cookie: BADCOOKIE with a
                    // fresh one instead of the slip (RFC 7873 §5.3), so that it retries
                    // with it and gets its own budget.
                    Verdict::Slip => {
                        let sent = match cookie {
                            Some(c) => {
                                handler.metrics().rate_limited_badcookie();
                                wire::badcookie(packet, c, reply)
                            }
                            None => {
                                handler.metrics().rate_limited(true);
                                wire::truncated(packet, reply)
                            }
                        };
                        if sent {
                            replies.push(i);
                            if let Some(tap) = &mut tap {
                                tap.log(&event.limited().answer(reply));
                            }
                        }
                        continue;
                    }
                }
            }
            if let Some(steer) = wire::answer(&snap, packet, src.ip(), reply, now, &mut rng, cookie)
            {
                handler.count_steered(&steer);
                charge(rrl, src.ip(), own, reply);
                replies.push(i);
                fast += 1;
                // The decision's text is looked up only for answers written.
                if let Some(tap) = &mut tap {
                    if tap.keep(steer.remarkable()) {
                        tap.write(&event.answer(reply).decided(steer.decided()));
                    }
                }
                continue;
            }
            let full_started = Instant::now();
            let cached = match cache.lookup(&snap, packet, reply, &mut stripped, cookie) {
                Lookup::Hit(rcode) => {
                    handler.metrics().answered(rcode.into());
                    charge(rrl, src.ip(), own, reply);
                    replies.push(i);
                    fast += 1;
                    if let Some(tap) = &mut tap {
                        tap.log(&event.answer(reply));
                    }
                    continue;
                }
                Lookup::Miss(miss) => runtime
                    .block_on(handler.respond(&stripped, src, Protocol::Udp))
                    .is_some_and(|answer| cache.store(miss, &answer, reply)),
                Lookup::Bypass => false,
            };
            // Not cacheable (or, rarely, an answer of another shape, then counted twice):
            // the full path answers the query as received.
            if cached {
                charge(rrl, src.ip(), own, reply);
                replies.push(i);
                if let Some(tap) = &mut tap {
                    tap.log(&event.answer(reply));
                }
            } else if let Some((bytes, decided)) =
                runtime.block_on(handler.respond_decided(packet, src, Protocol::Udp))
            {
                *reply = bytes;
                charge(rrl, src.ip(), own, reply);
                replies.push(i);
                if let Some(tap) = &mut tap {
                    let event = event.answer(reply);
                    match &decided {
                        Some(d) => tap.log(&event.decided(d.as_ref())),
                        None => tap.log(&event),
                    }
                }
            } else if let Some(tap) = &mut tap {
                tap.log(&event);
            }
            full_time += full_started.elapsed();
        }
        drop(snap);
        drop(secrets);
        let fast_time = started.elapsed().saturating_sub(full_time);
        handler.metrics().observe_batch(fast_time, fast);
        send_all(socket, &mut batch, &out, &replies, handler);
    }
}

/// Charges the rate limiter for an answer larger than the unit its check counted
/// (`Rrl::charge`: a DNSSEC answer, an NXDOMAIN with its proofs).
///
/// # Hot path
/// Nothing for an answer of at most 512 bytes.
#[inline]
fn charge(rrl: Option<&Rrl>, ip: IpAddr, own: bool, reply: &[u8]) {
    if let Some(rrl) = rrl {
        rrl.charge(ip, own, reply.len());
    }
}

/// Sends every reply; a reply that cannot go is dropped and counted: an unroutable
/// source (`send-error`, the others are still sent), a send buffer full for
/// [`SEND_TIMEOUT`] or a batch past [`SEND_BUDGET`] (`send-timeout`, the rest of the
/// batch with it).
fn send_all(
    socket: &UdpSocket,
    batch: &mut mmsg::Batch,
    out: &[Vec<u8>],
    replies: &[usize],
    handler: &Handler,
) {
    let deadline = Instant::now() + SEND_BUDGET;
    let sent = send_batch(
        |from| batch.send(socket, out, &replies[from..]),
        replies.len(),
        deadline,
        Instant::now,
    );
    for _ in 0..sent.failed {
        handler.metrics().dropped("send-error");
    }
    for _ in 0..sent.timed_out {
        handler.metrics().dropped("send-timeout");
    }
}

/// What became of a batch of replies.
#[derive(Debug, Default, PartialEq, Eq)]
struct Sent {
    sent: usize,
    /// Refused one by one (an unroutable source, say).
    failed: usize,
    /// Dropped unsent: the send buffer stayed full, or the batch took too long.
    timed_out: usize,
}

/// Sends `n` replies with `send(first)` (one `sendmmsg` from reply `first` on: how many
/// went), until all are sent or `now()` passes `deadline`.
fn send_batch(
    mut send: impl FnMut(usize) -> io::Result<usize>,
    n: usize,
    deadline: Instant,
    mut now: impl FnMut() -> Instant,
) -> Sent {
    let mut r = Sent::default();
    let mut done = 0;
    while done < n {
        match send(done) {
            Ok(k) => {
                let k = k.clamp(1, n - done);
                r.sent += k;
                done += k;
            }
            Err(e) => match retry::failure(&e) {
                Failure::Interrupted => {}
                Failure::TimedOut => {
                    // The buffer stayed full for SEND_TIMEOUT: the next ones would wait as long.
                    r.timed_out += n - done;
                    return r;
                }
                Failure::Failed => {
                    tracing::debug!(error = %e, "UDP send error");
                    r.failed += 1;
                    done += 1;
                }
            },
        }
        if done < n && now() >= deadline {
            r.timed_out += n - done;
            return r;
        }
    }
    r
}

/// Whether a reply may be sent to `src` (hickory's rule): not port 0, not the
/// unspecified address, not IPv4 broadcast.
fn answerable(src: SocketAddr) -> bool {
    src.port() != 0
        && !src.ip().is_unspecified()
        && !matches!(src, SocketAddr::V4(a) if a.ip().is_broadcast())
}

#[cfg(target_os = "linux")]
use linux as mmsg;
#[cfg(not(target_os = "linux"))]
use portable as mmsg;

#[cfg(target_os = "linux")]
mod linux {
    //! `recvmmsg`/`sendmmsg` over reused buffers. The only `unsafe` of the data plane:
    //! the kernel writes into buffers we own for the duration of each call.

    use std::io;
    use std::mem;
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
    use std::os::fd::AsRawFd;

    use std::net::UdpSocket;

    use super::{BATCH, RECV_BUF};

    pub(super) struct Batch {
        bufs: Box<[[u8; RECV_BUF]]>,
        /// Per datagram: its length (`None`: truncated by the kernel) and source.
        got: Vec<(Option<usize>, SocketAddr)>,
        names: Box<[libc::sockaddr_storage]>,
        name_lens: Box<[libc::socklen_t]>,
    }

    impl Batch {
        pub(super) fn new() -> Batch {
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
        pub(super) fn get(&self, i: usize) -> Option<(&[u8], SocketAddr)> {
            let (len, src) = self.got[i];
            Some((&self.bufs[i][..len?], src))
        }

        /// One `recvmmsg`: waits for the first datagram (up to the socket's receive
        /// timeout), then takes the others already queued; the number received.
        pub(super) fn recv(&mut self, socket: &UdpSocket) -> io::Result<usize> {
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
                    libc::MSG_WAITFORONE,
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

        /// One `sendmmsg` of `out[slot]` to the source of datagram `slot`, for each
        /// `slot` of `replies`: the number sent (at least 1), or the error of the first.
        pub(super) fn send(
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
                libc::sendmmsg(socket.as_raw_fd(), msgs.as_mut_ptr(), n as libc::c_uint, 0)
            };
            if sent < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(sent as usize)
        }
    }

    /// Answers go out with DF set, sized by the interface's MTU, ignoring ICMP "packet
    /// too big" (IP_PMTUDISC_PROBE): our answers are at most 1,232 bytes (DNS Flag Day
    /// 2020), a forged ICMP can neither make us fragment them nor fail them, and the
    /// kernel skips the IP ID hash that fragmentable packets need (3 % of the CPU
    /// under load).
    pub(super) fn dont_fragment(socket: &UdpSocket) -> io::Result<()> {
        let (level, name, value) = match socket.local_addr()? {
            SocketAddr::V4(_) => (
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_PROBE,
            ),
            SocketAddr::V6(_) => (
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_PROBE,
            ),
        };
        // SAFETY: `value` is a c_int that outlives the call, and its size is passed.
        let r = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                level,
                name,
                (&value as *const libc::c_int).cast(),
                mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
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

/// One datagram per system call, where `recvmmsg` is not available. Compiled on every
/// platform (and tested on Linux, where [`linux`] serves instead), so that it cannot
/// rot unseen.
#[cfg_attr(target_os = "linux", allow(dead_code))]
mod portable {
    use std::io;
    use std::net::{SocketAddr, UdpSocket};

    use super::RECV_BUF;

    pub(super) fn dont_fragment(_socket: &UdpSocket) -> io::Result<()> {
        Ok(())
    }

    pub(super) struct Batch {
        /// One byte more than [`RECV_BUF`]: a datagram that fills it was longer.
        buf: Box<[u8]>,
        got: (usize, SocketAddr),
    }

    impl Batch {
        pub(super) fn new() -> Batch {
            Batch {
                buf: vec![0u8; RECV_BUF + 1].into_boxed_slice(),
                got: (0, SocketAddr::from(([0, 0, 0, 0], 0))),
            }
        }

        /// The datagram of the last receive and its source; `None` if it was too long.
        pub(super) fn get(&self, _i: usize) -> Option<(&[u8], SocketAddr)> {
            let (len, src) = self.got;
            (len <= RECV_BUF).then(|| (&self.buf[..len], src))
        }

        /// One `recv_from`: waits for one datagram.
        pub(super) fn recv(&mut self, socket: &UdpSocket) -> io::Result<usize> {
            self.got = socket.recv_from(&mut self.buf)?;
            Ok(1)
        }

        /// Sends the first reply of `replies` (there is one datagram per batch) to the
        /// source of the last datagram: the number sent.
        pub(super) fn send(
            &mut self,
            socket: &UdpSocket,
            out: &[Vec<u8>],
            replies: &[usize],
        ) -> io::Result<usize> {
            let Some(&slot) = replies.first() else {
                return Ok(0);
            };
            socket.send_to(&out[slot], self.got.1)?;
            Ok(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_blocked_send_drops_the_rest_of_the_batch_at_once() {
        // Before, each reply of the batch was retried alone, each waiting SEND_TIMEOUT:
        // 64 blocked sends, a thread stalled for 64 timeouts.
        let calls = Cell::new(0);
        let start = Instant::now();
        let sent = send_batch(
            |from| {
                calls.set(calls.get() + 1);
                if from < 10 {
                    Ok(10)
                } else {
                    Err(io::Error::from(io::ErrorKind::WouldBlock))
                }
            },
            BATCH,
            start + SEND_BUDGET,
            || start,
        );
        assert_eq!(calls.get(), 2);
        let want = Sent {
            sent: 10,
            failed: 0,
            timed_out: BATCH - 10,
        };
        assert_eq!(sent, want);
    }

    #[test]
    fn errors_one_by_one_stop_at_the_budget() {
        // Every reply refused, each refusal taking 30 ms: past the 200 ms budget the rest
        // of the batch is dropped instead of trying all 64.
        let start = Instant::now();
        let clock = Cell::new(start);
        let calls = Cell::new(0);
        let sent = send_batch(
            |_| {
                calls.set(calls.get() + 1);
                clock.set(clock.get() + Duration::from_millis(30));
                Err(io::Error::from(io::ErrorKind::PermissionDenied))
            },
            BATCH,
            start + SEND_BUDGET,
            || clock.get(),
        );
        assert_eq!(calls.get(), 7);
        assert_eq!((sent.failed, sent.timed_out), (7, BATCH - 7));
        // Quick refusals do not stop the others.
        let mut n = 0;
        let sent = send_batch(
            |_| {
                n += 1;
                if n % 2 == 0 {
                    Err(io::Error::from(io::ErrorKind::PermissionDenied))
                } else {
                    Ok(1)
                }
            },
            BATCH,
            start + SEND_BUDGET,
            || start,
        );
        assert_eq!((sent.sent, sent.failed, sent.timed_out), (32, 32, 0));
    }

    #[test]
    fn the_portable_batch_answers_one_datagram_at_a_time() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        portable::dont_fragment(&server).unwrap();
        let mut batch = portable::Batch::new();
        client
            .send_to(b"query", server.local_addr().unwrap())
            .unwrap();
        assert_eq!(batch.recv(&server).unwrap(), 1);
        let (packet, src) = batch.get(0).expect("a datagram");
        assert_eq!((packet, src), (&b"query"[..], client.local_addr().unwrap()));
        let out = vec![b"answer".to_vec()];
        assert_eq!(batch.send(&server, &out, &[0]).unwrap(), 1);
        assert_eq!(batch.send(&server, &out, &[]).unwrap(), 0);
        let mut buf = [0u8; 16];
        let (n, from) = client.recv_from(&mut buf).unwrap();
        assert_eq!(
            (&buf[..n], from),
            (&b"answer"[..], server.local_addr().unwrap())
        );
        // Longer than RECV_BUF: dropped, as the recvmmsg batch does.
        client
            .send_to(&[0u8; RECV_BUF + 10], server.local_addr().unwrap())
            .unwrap();
        assert_eq!(batch.recv(&server).unwrap(), 1);
        assert!(batch.get(0).is_none());
    }
}
