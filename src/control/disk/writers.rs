//! Control plane: the threads that write into the state directory (the saver and the
//! audit log), and waiting until they have finished.
//!
//! Each such thread holds an [`Alive`] until it returns, after the last write it was
//! handed; [`Exited::wait`] resolves then. A service stopped with `Service::stop` waits
//! for every one of them, so that a service started next on the same directory never
//! has an old thread writing behind it.

use tokio::sync::watch;

/// Held by a writing thread for as long as it runs.
pub(crate) struct Alive {
    /// Dropped when the thread returns, which wakes [`Exited::wait`].
    _held: watch::Sender<()>,
}

/// The other end: resolves once the thread holding the [`Alive`] has returned.
#[derive(Clone)]
pub struct Exited(watch::Receiver<()>);

/// A pair for one thread: it keeps the [`Alive`], the owner the [`Exited`].
pub(crate) fn pair() -> (Alive, Exited) {
    let (tx, rx) = watch::channel(());
    (Alive { _held: tx }, Exited(rx))
}

impl Exited {
    /// Resolves when the thread has returned (at once if it already has).
    pub async fn wait(mut self) {
        // Nothing is ever sent: `changed` fails only once the sender is dropped.
        while self.0.changed().await.is_ok() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn waits_for_the_thread_to_return() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let (alive, exited) = pair();
        let (go, gate) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let _alive = alive;
            gate.recv().unwrap();
        });
        rt.block_on(async {
            let early = tokio::time::timeout(Duration::from_millis(50), exited.clone().wait());
            assert!(early.await.is_err(), "resolved while the thread runs");
            go.send(()).unwrap();
            tokio::time::timeout(Duration::from_secs(10), exited.wait())
                .await
                .expect("resolved once the thread returned");
        });
        thread.join().unwrap();
    }
}
