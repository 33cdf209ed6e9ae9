//! A TCP relay on loopback that a test can cut: the way one node loses etcd while the
//! others keep it. Cutting closes every relayed connection and refuses new ones (they
//! are accepted and closed at once); joining relays again.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct Relay {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Bumped at each cut: every relayed connection ends.
    generation: watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl Relay {
    /// Relays `127.0.0.1:0` to `target`.
    pub async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let (c, g) = (cut.clone(), generation.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                if c.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let mut ended = g.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = ended.changed() => {}
                    }
                });
            }
        });
        Relay {
            addr,
            cut,
            generation,
            task,
        }
    }

    /// Cuts: relayed connections close, new ones are refused.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Relays again.
    pub fn join(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}
