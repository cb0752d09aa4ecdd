//! Early write-back: a large file's bytes go to the disk while the rest of it still arrives, so
//! the fsync that makes it durable before its rename waits only for the last of them.
//!
//! Every [`EVERY`] bytes written, a thread of the file's own runs `fdatasync` on it (one at a
//! time: when one is still running, the next request waits for the next mark). The disk then
//! works while the network and the page cache do, instead of after them: a 1 GiB file's final
//! fsync took 0.5–0.65 s of a 2–3 s fetch through a local pipe. An error of an early sync is
//! kept and given to [`Writeback::finish`] (after a failed fsync the kernel may report the
//! next one clean, so an error seen here must not be lost).

use std::fs::File;
use std::io;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Bytes written between early syncs. 8 MiB, not 64: a 20 MB file (mbox-append's) had none,
/// and its final fsync took 43 ms of a fetch of 0.4 s through a local pipe (the fetch's
/// median 253 -> 237 ms with them; a 512 MiB file's 1.60 -> 1.48 s: the syncs queue behind
/// each other, one at a time, as before).
const EVERY: u64 = 8 << 20;

/// The early syncs of one file being written.
#[derive(Default)]
pub(crate) struct Writeback {
    /// Bytes written since the last mark.
    since: u64,
    /// Started at the first mark (small files never start one).
    worker: Option<Worker>,
}

struct Worker {
    tx: SyncSender<()>,
    thread: JoinHandle<()>,
    failed: Arc<Mutex<Option<io::Error>>>,
}

impl Writeback {
    /// Notes that `n` more bytes of `file` were written.
    pub(crate) fn wrote(&mut self, file: &File, n: usize) {
        self.since += n as u64;
        if self.since < EVERY {
            return;
        }
        self.since = 0;
        if self.worker.is_none() {
            // Without a second handle (no descriptors left) the file is synced at the end only.
            self.worker = file.try_clone().ok().and_then(Worker::start);
        }
        if let Some(w) = &self.worker {
            // Full: a sync is due already, and it takes these bytes too. Gone: a sync failed,
            // and `finish` says so.
            let _ = w.tx.try_send(());
        }
    }

    /// Waits for the early sync under way, if any; the first error any of them met.
    pub(crate) fn finish(&mut self) -> io::Result<()> {
        let Some(w) = self.worker.take() else {
            return Ok(());
        };
        drop(w.tx);
        let _ = w.thread.join();
        let failed = w.failed.lock().unwrap_or_else(|e| e.into_inner()).take();
        failed.map_or(Ok(()), Err)
    }
}

impl Drop for Writeback {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

impl Worker {
    fn start(file: File) -> Option<Worker> {
        let (tx, rx) = sync_channel::<()>(1);
        let failed = Arc::new(Mutex::new(None));
        let seen = failed.clone();
        let thread = std::thread::Builder::new()
            .name("ferry-writeback".into())
            .spawn(move || {
                for () in rx {
                    if let Err(e) = file.sync_data() {
                        seen.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_or_insert(e);
                        return;
                    }
                }
            })
            .ok()?;
        Some(Worker { tx, thread, failed })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_small_file_starts_no_thread_and_a_large_one_syncs_and_finishes_clean() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = File::create(dir.path().join("f")).unwrap();
        let mut wb = Writeback::default();
        f.write_all(&[7u8; 4096]).unwrap();
        wb.wrote(&f, 4096);
        assert!(wb.worker.is_none());
        let block = vec![1u8; 1 << 20];
        for _ in 0..(EVERY >> 20) + 1 {
            f.write_all(&block).unwrap();
            wb.wrote(&f, block.len());
        }
        assert!(wb.worker.is_some());
        wb.finish().unwrap();
        assert!(wb.worker.is_none());
        assert_eq!(f.metadata().unwrap().len(), 4096 + (EVERY + (1 << 20)));
    }

    /// A file of tens of MB (a mailbox) is synced early too, not only at its end.
    #[test]
    fn a_file_of_9_mib_starts_its_early_syncs() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = File::create(dir.path().join("f")).unwrap();
        let mut wb = Writeback::default();
        let block = vec![1u8; 1 << 20];
        for _ in 0..9 {
            f.write_all(&block).unwrap();
            wb.wrote(&f, block.len());
        }
        assert!(wb.worker.is_some());
        wb.finish().unwrap();
    }

    #[test]
    fn an_early_sync_that_failed_fails_the_finish() {
        // fdatasync of a pipe fails (EINVAL): what a failing disk does to a file.
        let (_r, w) = std::io::pipe().unwrap();
        let f = File::from(std::os::fd::OwnedFd::from(w));
        let mut wb = Writeback::default();
        wb.wrote(&f, EVERY as usize);
        assert!(wb.finish().is_err(), "the early sync's error is kept");
        assert!(wb.finish().is_ok(), "and given once");
    }
}
