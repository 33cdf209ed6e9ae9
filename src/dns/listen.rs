//! Data plane: the listening sockets. Each `--listen` address gets a UDP socket and a TCP
//! listener on the same port (with port 0, the kernel picks one free for both). IPv6
//! sockets are v6-only, so `0.0.0.0:53` and `[::]:53` can both be bound.

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, UdpSocket};

/// Sockets bound for one address.
pub struct Bound {
    pub addr: SocketAddr,
    pub udp: UdpSocket,
    pub tcp: TcpListener,
}

/// Binds UDP and TCP on `addr`. Must be called inside the tokio runtime.
pub fn bind(addr: SocketAddr) -> io::Result<Bound> {
    // With port 0 the UDP port is picked first; it may be taken for TCP, so retry.
    let mut last_err = None;
    for _ in 0..16 {
        let udp = udp_socket(addr)?;
        let bound = udp
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("not an IP socket"))?;
        match tcp_listener(bound) {
            Ok(tcp) => {
                return Ok(Bound {
                    addr: bound,
                    udp: UdpSocket::from_std(udp.into())?,
                    tcp: TcpListener::from_std(tcp.into())?,
                })
            }
            Err(e) if addr.port() == 0 && e.kind() == io::ErrorKind::AddrInUse => {
                last_err = Some(e)
            }
            Err(e) => return Err(e),
        }
    }
    Err(last_err.unwrap_or_else(|| io::Error::other("no free port")))
}

fn udp_socket(addr: SocketAddr) -> io::Result<Socket> {
    let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    Ok(sock)
}

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
