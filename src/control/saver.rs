//! Control plane: the saver, one thread that writes the state file so that no async
//! worker waits on `fsync` (the controller saves after every probe round, and a slow
//! or failing disk must not hold up the admin API, TCP or the prober).
//!
//! The controller hands over the state to save with the `/v1/state` document that
//! describes it; the saver writes the state ([`persist::save_to`]: temporary file,
//! fsync, rename, fsync of the directory), and only then shows the document, with the
//! outcome of the save in `state_save`. So what `/v1/state` shows has been saved, as
//! before, and an API call that changes the state is answered once it is saved.
//!
//! Saves that queue up while one is written are merged: only the newest state is
//! written. A failed save is counted, logged once per distinct error (and again when it
//! clears), and retried every [`RETRY`] until it succeeds or a newer state replaces it;
//! the state stays in memory meanwhile and serving goes on.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::control::disk::persist::{self, DiskFaults, Saved};
use crate::control::disk::writers::{self, Alive, Exited};
use crate::control::state_doc::{SaveStatus, StateDoc};
use crate::metrics::Metrics;

/// How long after a failed save it is tried again.
pub(crate) const RETRY: Duration = Duration::from_secs(1);

/// The document `/v1/state` serves (shared with the API).
pub(crate) type Doc = Arc<Mutex<Option<StateDoc>>>;

/// The controller's end. Dropping it lets the thread finish what it has and exit.
pub(crate) struct Saver {
    slot: Arc<(Mutex<Slot>, Condvar)>,
    /// The generation last written and shown.
    written: watch::Receiver<u64>,
    thread: JoinHandle<()>,
    /// Resolves once the thread has returned.
    exited: Exited,
}

/// What waits for the thread: only the newest of each, so that a hung disk holds one
/// state and one document, however long it hangs.
#[derive(Default)]
struct Slot {
    /// The newest state to write; `None` when only the document changed since.
    saved: Option<Saved>,
    doc: Option<StateDoc>,
    /// Counts hand-overs; the thread reports the one it has shown.
    generation: u64,
    closed: bool,
}

/// Where the thread writes, what it reports to, and how its last save went.
struct Writer {
    dir: PathBuf,
    disk: DiskFaults,
    metrics: Option<Metrics>,
    doc: Doc,
    slot: Arc<(Mutex<Slot>, Condvar)>,
    written: watch::Sender<u64>,
    /// The newest state not yet written (kept while its save fails).
    unsaved: Option<Saved>,
    /// The error of the latest save and how many saves in a row failed.
    failing: Option<(String, u64)>,
    /// The newest document, shown again with the outcome of each retry.
    latest: Option<StateDoc>,
    /// Dropped when the thread returns.
    _alive: Alive,
}

impl Saver {
    /// Starts the thread that saves into `dir` and shows documents in `doc`.
    pub(crate) fn start(
        dir: PathBuf,
        disk: DiskFaults,
        metrics: Option<Metrics>,
        doc: Doc,
    ) -> std::io::Result<Saver> {
        let slot = Arc::new((Mutex::new(Slot::default()), Condvar::new()));
        let (written_tx, written) = watch::channel(0);
        let (alive, exited) = writers::pair();
        let writer = Writer {
            dir,
            disk,
            metrics,
            doc,
            slot: slot.clone(),
            written: written_tx,
            unsaved: None,
            failing: None,
            latest: None,
            _alive: alive,
        };
        let thread = std::thread::Builder::new()
            .name("steerdns-saver".into())
            .spawn(move || writer.run())?;
        Ok(Saver {
            slot,
            written,
            thread,
            exited,
        })
    }

    /// Hands over `doc`, and `saved` when the state changed; returns the generation to
    /// wait for with [`Saver::written`]. `Err` gives the document back when the thread
    /// has stopped (it never panics on its own; a bug could still stop it).
    pub(crate) fn submit(&self, saved: Option<Saved>, doc: StateDoc) -> Result<u64, Box<StateDoc>> {
        if self.thread.is_finished() {
            return Err(Box::new(doc));
        }
        let (lock, wake) = &*self.slot;
        let mut slot = lock.lock().unwrap_or_else(|e| e.into_inner());
        if saved.is_some() {
            slot.saved = saved;
        }
        slot.doc = Some(doc);
        slot.generation += 1;
        wake.notify_one();
        Ok(slot.generation)
    }

    /// The generation last written and shown.
    pub(crate) fn written(&self) -> watch::Receiver<u64> {
        self.written.clone()
    }

    /// Resolves once the thread has returned: after the saver is dropped, once what it
    /// was handed last has been tried.
    pub(crate) fn exited(&self) -> Exited {
        self.exited.clone()
    }
}

impl Drop for Saver {
    fn drop(&mut self) {
        let (lock, wake) = &*self.slot;
        lock.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
        wake.notify_one();
    }
}

impl Writer {
    fn run(mut self) {
        loop {
            let (saved, doc, generation, closed) = {
                let (lock, wake) = &*self.slot;
                let mut slot = lock.lock().unwrap_or_else(|e| e.into_inner());
                while slot.doc.is_none() && !slot.closed {
                    if self.unsaved.is_none() {
                        slot = wake.wait(slot).unwrap_or_else(|e| e.into_inner());
                    } else {
                        let (s, timeout) = wake
                            .wait_timeout(slot, RETRY)
                            .unwrap_or_else(|e| e.into_inner());
                        slot = s;
                        if timeout.timed_out() {
                            break;
                        }
                    }
                }
                (
                    slot.saved.take(),
                    slot.doc.take(),
                    slot.generation,
                    slot.closed,
                )
            };
            if saved.is_some() {
                self.unsaved = saved;
            }
            if doc.is_some() {
                self.latest = doc;
            }
            self.save();
            self.show();
            self.written.send_replace(generation);
            if closed {
                // The controller is gone; what it handed over last was just tried.
                return;
            }
        }
    }
    fn save(&mut self) {
        let Some(saved) = &self.unsaved else { return };
        let result = persist::save_to(&self.dir, saved, &self.disk);
        if let Some(m) = &self.metrics {
            m.state_saved(result.is_ok());
        }
        let dir = self.dir.display();
        match (result, self.failing.take()) {
            (Ok(()), before) => {
                if let Some((_, failures)) = before {
                    info!(dir = %dir, failed_saves = failures, "state saved again: nothing was lost");
                }
                self.unsaved = None;
            }
            (Err(e), before) => {
                let error = e.to_string();
                let failures = before.as_ref().map_or(0, |(_, n)| *n) + 1;
                if before.as_ref().map(|(e, _)| e) != Some(&error) {
                    warn!(dir = %dir, error = %error, retry_in_ms = RETRY.as_millis() as u64, "cannot save state: serving goes on from memory, the save is retried");
                }
                self.failing = Some((error, failures));
            }
        }
    }

    /// Shows the newest document with the outcome of the latest save.
    fn show(&mut self) {
        let Some(doc) = &mut self.latest else { return };
        doc.state_save = Some(SaveStatus {
            dir: self.dir.display().to_string(),
            ok: self.failing.is_none(),
            error: self.failing.as_ref().map(|(e, _)| e.clone()),
            failed_saves: self.failing.as_ref().map(|(_, n)| *n),
        });
        let mut shown = self.doc.lock().unwrap_or_else(|e| e.into_inner());
        *shown = Some(doc.clone());
    }
}

/// Logs, once, that the saver thread is gone; the controller then shows documents
/// itself and nothing more is saved.
pub(crate) fn gone() {
    error!("the state saver thread has stopped: the state is no longer saved; restart steerdns");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(frozen: &str) -> Saved {
        let now = crate::clock::now().duration_since(std::time::UNIX_EPOCH);
        Saved {
            saved_unix_ms: now.unwrap().as_millis() as u64,
            frozen: Some(frozen.to_string()),
            ..Saved::default()
        }
    }

    fn doc(version: &str) -> StateDoc {
        StateDoc {
            config_version: version.to_string(),
            ..StateDoc::default()
        }
    }

    /// While the disk hangs, hand-overs replace each other (one state and one document
    /// wait, however many rounds go by); once it is back, the newest is written, and
    /// shown with the outcome of its save.
    #[test]
    fn a_hung_disk_holds_only_the_newest_state() {
        let dir = std::env::temp_dir().join(format!("steerdns-saver-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let disk = DiskFaults::default();
        let shown = Doc::default();
        let saver = Saver::start(dir.clone(), disk.clone(), None, shown.clone()).unwrap();
        let mut written = saver.written();

        disk.set_stalled(true);
        let first = saver.submit(Some(state("0")), doc("0")).unwrap();
        // The thread takes the first hand-over and hangs in its save.
        while !dir.read_dir().is_ok_and(|mut d| d.next().is_some()) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut last = first;
        for i in 1..=1000 {
            last = saver
                .submit(Some(state(&i.to_string())), doc(&i.to_string()))
                .unwrap();
        }
        let doc_only = saver.submit(None, doc("doc only")).unwrap();
        {
            let slot = saver.slot.0.lock().unwrap();
            let waiting = slot.saved.as_ref().and_then(|s| s.frozen.as_deref());
            assert_eq!(waiting, Some("1000"));
            assert_eq!(slot.generation, doc_only);
        }
        assert_eq!(*written.borrow(), 0, "nothing is shown before it is saved");
        assert!(shown.lock().unwrap().is_none());

        disk.set_stalled(false);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(10),
                written.wait_for(|&w| w >= doc_only),
            )
            .await
            .expect("written once the disk is back")
            .unwrap();
        });
        assert!(last < doc_only);
        let saved = persist::load(&dir, Duration::from_secs(60))
            .unwrap()
            .unwrap();
        assert_eq!(saved.frozen.as_deref(), Some("1000"));
        let doc = shown.lock().unwrap().clone().unwrap();
        assert_eq!(doc.config_version, "doc only");
        assert!(doc.state_save.unwrap().ok);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
