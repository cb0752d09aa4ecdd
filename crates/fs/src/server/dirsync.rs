//! When a session's changes of names become durable: at once (each change fsyncs its
//! directory before the reply), or, for a client that asked for `FEATURE_DEFERRED_SYNC` (a
//! mount), when it sends `Sync` or the session ends. A change is atomic either way; only its
//! durability waits, as on a local file system until its directory is fsynced.

use std::io;
use std::os::fd::OwnedFd;

/// More directories than this waiting are synced at once (a bound on the descriptors kept).
const MAX_WAITING: usize = 256;

#[derive(Default)]
pub(super) struct DirSyncs {
    deferred: bool,
    /// Directories changed since the last sync, by (device, inode), each once.
    waiting: Vec<((u64, u64), OwnedFd)>,
}

impl DirSyncs {
    /// From now on (the client asked), directories are synced when asked, not per change.
    pub(super) fn defer(&mut self) {
        self.deferred = true;
    }

    /// Whether syncs wait to be asked for.
    pub(super) fn deferring(&self) -> bool {
        self.deferred
    }

    /// Back to syncing each change at once (after a group of commits, which the caller syncs).
    pub(super) fn undefer(&mut self) {
        self.deferred = false;
    }

    /// `dir`'s entries changed: fsynced now, or kept for the next [`sync`](Self::sync).
    pub(super) fn changed(&mut self, dir: &OwnedFd) -> io::Result<()> {
        if !self.deferred {
            return rustix::fs::fsync(dir).map_err(Into::into);
        }
        let st = rustix::fs::fstat(dir)?;
        let id = (st.st_dev, st.st_ino);
        if self.waiting.iter().any(|(w, _)| *w == id) {
            return Ok(());
        }
        if self.waiting.len() >= MAX_WAITING {
            self.sync()?;
        }
        self.waiting.push((id, dir.try_clone()?));
        Ok(())
    }

    /// Fsyncs every directory changed since the last sync; the first failure is the answer
    /// (the others are still tried: each is durable or reported).
    pub(super) fn sync(&mut self) -> io::Result<()> {
        let mut first = None;
        for (_, d) in self.waiting.drain(..) {
            if let Err(e) = rustix::fs::fsync(&d) {
                first.get_or_insert(io::Error::from(e));
            }
        }
        first.map_or(Ok(()), Err)
    }
}
