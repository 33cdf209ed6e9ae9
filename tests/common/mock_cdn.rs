//! A mock CDN edge for integration tests: an HTTP/1.1 server on `127.0.0.1` (ephemeral
//! port) whose behaviour a test switches at any time with [`MockCdn::set`].
//!
//! Every response carries `Content-Length` and `Connection: close`; each connection
//! serves one request. Any path is served with the current [`Mode`].
//!
//! [`MockCdn::set`] acts synchronously on the listening socket, so a connection made
//! right after `set(Mode::Refused)` is refused, and one made right after switching back
//! reaches the re-bound listener on the same port. The server task (and every
//! connection task it spawned) stops when the `MockCdn` is dropped.
#![allow(dead_code)]

use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::rustls::crypto::aws_lc_rs;
use tokio_rustls::rustls::pki_types::PrivateKeyDer;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

/// Largest request head (request line + headers) the server reads.
const MAX_HEAD: usize = 16 * 1024;
/// A client that sends no complete request head within this time is dropped.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

pub const HEALTHY_BODY: &str = "healthy-v1\n";
pub const ERROR_BODY: &str = "error\n";
pub const ERROR_PAGE_BODY: &str = "<html>Service Unavailable</html>";

/// What the mock CDN does with the next connection / request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// 200, body "healthy-v1\n".
    Healthy,
    /// That status (e.g. 503), body "error\n".
    Status(u16),
    /// 200 but body "<html>Service Unavailable</html>".
    ErrorPage,
    /// Waits that long before sending the response headers, then the healthy answer.
    Slow(Duration),
    /// The listener is closed: connections are refused. Switching to any other mode
    /// binds the same port again.
    Refused,
    /// The port speaks TLS with a self-signed certificate for localhost/127.0.0.1 and
    /// serves the healthy answer once the handshake succeeds.
    BadTls,
}

struct State {
    mode: Mode,
    /// Responses for the next requests, one each, before `mode` applies again.
    script: std::collections::VecDeque<Mode>,
    /// A duplicate of the listening socket while one exists (i.e. not `Refused`);
    /// shutting it down stops the listener at once, whatever the server task is doing.
    listener: Option<Socket>,
    /// While `Refused`: a socket bound to the port and not listening, so that the port
    /// stays ours (connections to it are refused) and no other listener on the machine
    /// (another test, another test run) can take it meanwhile.
    placeholder: Option<Socket>,
}

struct Shared {
    state: Mutex<State>,
    hits: AtomicU64,
    last_request: Mutex<Option<String>>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub struct MockCdn {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// `Some(listener)`: serve on it from now on; `None`: drop the current listener.
    listeners: mpsc::UnboundedSender<Option<std::net::TcpListener>>,
    task: JoinHandle<()>,
}

impl MockCdn {
    /// Starts a mock CDN on `127.0.0.1:0` in the given mode.
    pub async fn start(mode: Mode) -> MockCdn {
        let (socket, listener) = bind("127.0.0.1:0".parse().unwrap())
            .unwrap_or_else(|e| panic!("mock CDN: cannot bind 127.0.0.1:0: {e}"));
        let addr = listener.local_addr().expect("mock CDN: local_addr");
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                mode: Mode::Healthy,
                script: Default::default(),
                listener: Some(socket),
                placeholder: None,
            }),
            hits: AtomicU64::new(0),
            last_request: Mutex::new(None),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(Some(listener)).expect("receiver alive");
        let task = tokio::spawn(run(rx, Arc::clone(&shared), tls_acceptor()));
        let cdn = MockCdn {
            addr,
            shared,
            listeners: tx,
            task,
        };
        cdn.set(mode);
        cdn
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Switches the behaviour; it applies to the next connection (plain vs TLS,
    /// refused) and the next request (the response).
    pub fn set(&self, mode: Mode) {
        let mut state = self.shared.state();
        match (mode == Mode::Refused, state.listener.take()) {
            (true, Some(socket)) => {
                // Stops the listen at once (pending connections are reset); the server
                // task then drops its handle, and the placeholder keeps the port.
                let _ = socket.shutdown(Shutdown::Both);
                let _ = self.listeners.send(None);
                state.placeholder = placeholder(self.addr).ok();
            }
            (false, None) => {
                let (socket, listener) = bind(self.addr)
                    .unwrap_or_else(|e| panic!("mock CDN: cannot re-bind {}: {e}", self.addr));
                state.listener = Some(socket);
                state.placeholder = None;
                let _ = self.listeners.send(Some(listener));
            }
            (_, kept) => state.listener = kept,
        }
        state.mode = mode;
        state.script.clear();
    }

    /// The next requests get `modes`, one each and in order, then the current mode
    /// again: rounds of a prober fail or succeed exactly as scripted, whatever the
    /// timing. Only modes that shape a response (not `Refused` or `BadTls`, which act
    /// on connections).
    pub fn script(&self, modes: &[Mode]) {
        assert!(
            !modes
                .iter()
                .any(|m| matches!(m, Mode::Refused | Mode::BadTls)),
            "a script shapes responses: {modes:?}"
        );
        self.shared.state().script.extend(modes.iter().copied());
    }

    /// Scripted responses not served yet.
    pub fn scripted(&self) -> usize {
        self.shared.state().script.len()
    }

    /// Number of HTTP requests received (complete request heads, plain or over TLS).
    pub fn hits(&self) -> u64 {
        self.shared.hits.load(Ordering::SeqCst)
    }

    /// The raw head (request line + headers, without the final blank line) of the
    /// last request received.
    pub fn last_request(&self) -> Option<String> {
        self.shared
            .last_request
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for MockCdn {
    fn drop(&mut self) {
        if let Some(socket) = self.shared.state().listener.take() {
            let _ = socket.shutdown(Shutdown::Both);
        }
        self.task.abort();
    }
}

/// A socket bound to `addr` with SO_REUSEADDR and not listening: it holds the port
/// (connections are refused) and lets [`bind`] take it again.
fn placeholder(addr: SocketAddr) -> std::io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// A listening socket with SO_REUSEADDR (so the same port can be bound again after
/// `Refused`), plus a duplicate handle for shutting it down from [`MockCdn::set`].
fn bind(addr: SocketAddr) -> std::io::Result<(Socket, std::net::TcpListener)> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    let control = socket.try_clone()?;
    Ok((control, socket.into()))
}

/// TLS acceptor with a freshly generated self-signed certificate (aws-lc-rs provider).
fn tls_acceptor() -> TlsAcceptor {
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let certified = rcgen::generate_simple_self_signed(names).expect("mock CDN: rcgen");
    let mut config = ServerConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("mock CDN: TLS versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![certified.cert.der().clone()],
            PrivateKeyDer::from(certified.signing_key),
        )
        .expect("mock CDN: TLS certificate");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    TlsAcceptor::from(Arc::new(config))
}

/// The server task: owns the current listener and every connection task.
async fn run(
    mut listeners: mpsc::UnboundedReceiver<Option<std::net::TcpListener>>,
    shared: Arc<Shared>,
    tls: TlsAcceptor,
) {
    let mut listener: Option<TcpListener> = None;
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            msg = listeners.recv() => match msg {
                Some(next) => listener = next.and_then(|l| TcpListener::from_std(l).ok()),
                None => return, // the MockCdn is gone
            },
            accepted = accept(&listener) => match accepted {
                Ok((stream, _)) => {
                    let tls = (shared.state().mode == Mode::BadTls).then(|| tls.clone());
                    let shared = Arc::clone(&shared);
                    conns.spawn(async move {
                        match tls {
                            Some(tls) => {
                                if let Ok(stream) = tls.accept(stream).await {
                                    serve(stream, &shared).await;
                                }
                            }
                            None => serve(stream, &shared).await,
                        }
                    });
                }
                // A listener being shut down, or a transient error (e.g. EMFILE).
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn accept(
    listener: &Option<TcpListener>,
) -> std::io::Result<(tokio::net::TcpStream, SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// Serves one request on a connection, then closes it. I/O errors just end it.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, shared: &Shared) {
    let head = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream)).await {
        Ok(Some(head)) => head,
        _ => return,
    };
    shared.hits.fetch_add(1, Ordering::SeqCst);
    *shared
        .last_request
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = Some(head);

    let mode = {
        let mut state = shared.state();
        let current = state.mode;
        state.script.pop_front().unwrap_or(current)
    };
    let (status, body) = match mode {
        Mode::Healthy | Mode::BadTls => (200, HEALTHY_BODY),
        Mode::Status(code) => (code, ERROR_BODY),
        Mode::ErrorPage => (200, ERROR_PAGE_BODY),
        Mode::Slow(delay) => {
            tokio::time::sleep(delay).await;
            (200, HEALTHY_BODY)
        }
        Mode::Refused => return, // a request on a connection accepted before the switch
    };
    let response = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        reason(status),
        body.len(),
    );
    if stream.write_all(response.as_bytes()).await.is_ok() {
        let _ = stream.flush().await;
        let _ = stream.shutdown().await;
    }
}

/// Reads up to the blank line ending the request head; `None` on EOF, error or a head
/// larger than [`MAX_HEAD`].
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> Option<String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(String::from_utf8_lossy(&buf[..end]).into_owned());
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}
