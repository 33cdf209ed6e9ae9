//! Data plane: the listening sockets. Each `--listen` address gets `udp_sockets` UDP
//! sockets bound to the same port with `SO_REUSEPORT` (the kernel spreads datagrams over
//! them by flow hash, so each worker thread can drain its own socket) and one TCP listener
//! on that port. With port 0 the kernel picks the port for the first UDP socket; the
//! others and the TCP listener take the same one. IPv6 sockets are v6-only, so
//! `0.0.0.0:53` and `[::]:53` can both be bound.
//!
//! `SO_REUSEPORT` would let a second server of the same user share the UDP port silently;
//! the TCP listener is bound without it, so a second instance on the same address fails
//! to start (address in use) instead of stealing part of the queries.

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, Socket, Type};
use std::net::UdpSocket;

use tokio::net::TcpListener;

/// Sockets bound for one address.
pub(crate) struct Bound {
    pub addr: SocketAddr,
    /// At least one; all on `addr`.
    pub udp: Vec<UdpSocket>,
    pub tcp: TcpListener,
}

/// The default number of UDP sockets per address: one per CPU this process may run on.
pub(crate) fn default_udp_sockets() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Binds `udp_sockets` (at least 1) UDP sockets (blocking, for `dns::udp`'s threads) and
/// a TCP listener on `addr`. Must be called inside the tokio runtime.
pub(crate) fn bind(addr: SocketAddr, udp_sockets: usize) -> io::Result<Bound> {
    let udp_sockets = udp_sockets.max(1);
    // With port 0 the UDP port is picked first; it may be taken for TCP, so retry.
    let mut last_err = None;
    for _ in 0..16 {
        let first = udp_socket(addr)?;
        let bound = first
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("not an IP socket"))?;
        let tcp = match tcp_listener(bound) {
            Ok(tcp) => tcp,
            Err(e) if addr.port() == 0 && e.kind() == io::ErrorKind::AddrInUse => {
                last_err = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut udp = Vec::with_capacity(udp_sockets);
        udp.push(first.into());
        for _ in 1..udp_sockets {
            udp.push(udp_socket(bound)?.into());
        }
        return Ok(Bound {
            addr: bound,
            udp,
            tcp: TcpListener::from_std(tcp.into())?,
        });
    }
    Err(last_err.unwrap_or_else(|| io::Error::other("no free port")))
}

fn udp_socket(addr: SocketAddr) -> io::Result<Socket> {
    let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    sock.set_reuse_port(true)?;
    // Room for a burst while the thread is busy or descheduled; the kernel caps it at
    // net.core.rmem_max (raise that for production, as for any DNS server).
    let _ = sock.set_recv_buffer_size(UDP_RECV_BUFFER);
    sock.bind(&addr.into())?;
    Ok(sock)
}

/// The receive buffer asked for each UDP socket.
const UDP_RECV_BUFFER: usize = 4 << 20;

fn tcp_listener(addr: SocketAddr) -> io::Result<Socket> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    sock.set_reuse_address(true)?;
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    sock.listen(1024)?;
    Ok(sock)
}
