//! The history of served data, written by a thread of its own. Every chunk the server cuts
//! goes into it (compressed, at some 200 MB/s, a quarter of the speed of cutting): on the
//! session's thread that was half of a first fetch's server time (an 11 MB file over a LAN).
//! Reads of the history wait until what was kept before them is in, so a session sees what it
//! kept.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use ferry_format::Id;
use ferry_store::VerifiedChunk;

use super::Staging;

/// Bytes waiting for the thread at most; keeping more waits. Room for a whole file of a few
/// tens of MB, so its recipe goes out at the speed of cutting while the thread catches up.
const QUEUED: usize = 32 << 20;

pub(crate) struct History {
    store: Staging,
    tx: Option<Sender<(Id, Vec<u8>)>>,
    /// Chunks sent to the thread and not yet put (how many, how many bytes), and a signal
    /// whenever some are.
    pending: Pending,
    thread: Option<JoinHandle<()>>,
}

impl History {
    pub(crate) fn new(store: Staging) -> Self {
        let (tx, rx) = channel::<(Id, Vec<u8>)>();
        let pending = Arc::new((Mutex::new((0, 0)), Condvar::new()));
        let (s, p) = (store.clone(), pending.clone());
        let put = move || {
            // However the thread ends (a panic in the store too), nothing is left waiting on
            // it: what it did not put is lost, and later chunks are put as they are cut.
            let _gone = Gone(p.clone());
            for (id, data) in rx {
                // A history that cannot grow costs deltas later, not the answer now.
                if let Err(e) = s.put(&VerifiedChunk::assume_verified(id, &data)) {
                    tracing::debug!("history: {e}");
                }
                let mut n = lock(&p.0);
                n.0 -= 1;
                n.1 -= data.len();
                p.1.notify_all();
            }
        };
        let thread = std::thread::Builder::new()
            .name("ferry-history".into())
            .spawn(put)
            .map_err(|e| tracing::warn!("history: no thread ({e}): chunks are kept as cut"))
            .ok();
        History {
            store,
            tx: thread.is_some().then_some(tx),
            pending,
            thread,
        }
    }

    /// Puts a chunk just cut (and hashed) into the history, soon.
    pub(crate) fn keep(&self, id: Id, data: &[u8]) {
        if let Some(tx) = &self.tx {
            let (n, done) = &*self.pending;
            let mut n = lock(n);
            while n.1 >= QUEUED {
                n = done.wait(n).unwrap_or_else(|e| e.into_inner());
            }
            if tx.send((id, data.to_vec())).is_ok() {
                n.0 += 1;
                n.1 += data.len();
                return;
            }
        }
        if let Err(e) = self.store.put(&VerifiedChunk::assume_verified(id, data)) {
            tracing::debug!("history: {e}");
        }
    }

    /// The store, once every chunk kept so far is in it.
    pub(crate) fn settled(&self) -> &Staging {
        let (n, done) = &*self.pending;
        let mut n = lock(n);
        while n.0 > 0 {
            n = done.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        &self.store
    }
}

type Pending = Arc<(Mutex<(usize, usize)>, Condvar)>;

fn lock(m: &Mutex<(usize, usize)>) -> std::sync::MutexGuard<'_, (usize, usize)> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Ends the thread's part: nothing pending any more.
struct Gone(Pending);

impl Drop for Gone {
    fn drop(&mut self) {
        *lock(&self.0 .0) = (0, 0);
        self.0 .1.notify_all();
    }
}

impl Drop for History {
    /// Every chunk kept is in the store when the session ends.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_format::{HashAlg, Oid, Recipe};
    use ferry_store::{ChunkStore, MemStore, StoreError, StoreStats};
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A store whose first put panics.
    struct Breaks(MemStore, AtomicBool);

    impl ChunkStore for Breaks {
        fn hash_alg(&self) -> HashAlg {
            self.0.hash_alg()
        }
        fn contains(&self, id: &Id) -> Result<bool, StoreError> {
            self.0.contains(id)
        }
        fn get(&self, id: &Id) -> Result<Option<Vec<u8>>, StoreError> {
            self.0.get(id)
        }
        fn put(&self, chunk: &VerifiedChunk<'_>) -> Result<bool, StoreError> {
            assert!(self.1.swap(true, Ordering::SeqCst), "the store broke");
            self.0.put(chunk)
        }
        fn flush(&self) -> Result<(), StoreError> {
            self.0.flush()
        }
        fn put_object(&self, oid: &Oid, recipe: &Recipe) -> Result<(), StoreError> {
            self.0.put_object(oid, recipe)
        }
        fn object(&self, oid: &Oid) -> Result<Option<Recipe>, StoreError> {
            self.0.object(oid)
        }
        fn remove_object(&self, oid: &Oid) -> Result<bool, StoreError> {
            self.0.remove_object(oid)
        }
        fn objects(&self) -> Result<Vec<(Oid, u64)>, StoreError> {
            self.0.objects()
        }
        fn stats(&self) -> Result<StoreStats, StoreError> {
            self.0.stats()
        }
    }

    /// `n` distinct chunks of 200 bytes, and their ids.
    fn chunks(n: u32) -> (Vec<Vec<u8>>, Vec<Id>) {
        let chunks: Vec<Vec<u8>> = (0..n).map(|i| i.to_le_bytes().repeat(50)).collect();
        let ids = chunks
            .iter()
            .map(|c| Id::hash(HashAlg::Blake3, c))
            .collect();
        (chunks, ids)
    }

    #[test]
    fn a_thread_that_died_leaves_nothing_waiting() {
        let store: Staging = Arc::new(Breaks(MemStore::new(HashAlg::Blake3), false.into()));
        let h = History::new(store.clone());
        let (chunks, ids) = chunks(100);
        for (id, c) in ids.iter().zip(&chunks) {
            h.keep(*id, c);
        }
        // The first chunk's put panicked on the thread: what it held is lost, nothing hangs.
        h.settled();
        h.keep(ids[0], &chunks[0]);
        assert!(h.settled().contains(&ids[0]).unwrap(), "kept as cut");
        drop(h);
    }

    #[test]
    fn what_was_kept_is_there_for_the_next_read_and_at_the_end() {
        let store: Staging = Arc::new(MemStore::new(HashAlg::Blake3));
        let h = History::new(store.clone());
        let (chunks, ids) = chunks(1000);
        for (id, c) in ids.iter().zip(&chunks).take(500) {
            h.keep(*id, c);
        }
        let s = h.settled();
        assert!(ids[..500].iter().all(|id| s.contains(id).unwrap()));
        for (id, c) in ids.iter().zip(&chunks).skip(500) {
            h.keep(*id, c);
        }
        drop(h);
        assert!(ids.iter().all(|id| store.contains(id).unwrap()));
        assert_eq!(store.get(&ids[999]).unwrap().unwrap(), chunks[999]);
    }
}
