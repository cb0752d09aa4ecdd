//! The history of served data, written by a thread of its own. Every chunk the server cuts
//! goes into it (compressed, at some 200 MB/s, a quarter of the speed of cutting): on the
//! session's thread that was half of a first fetch's server time (an 11 MB file over a LAN).
//! A read of the history waits until what was kept before it is in, but only when it asks for
//! a chunk still on its way (the ids on their way are known): a session sees what it kept,
//! and a request for old chunks kept long before (the usual case: the client's old version)
//! does not wait for the thread to compress the file just cut.

use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
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
    /// Chunks sent to the thread and not yet put, and a signal whenever some are.
    pending: Pending,
    thread: Option<JoinHandle<()>>,
}

impl History {
    pub(crate) fn new(store: Staging) -> Self {
        let (tx, rx) = channel::<(Id, Vec<u8>)>();
        let pending: Pending = Arc::default();
        let (s, p) = (store.clone(), pending.clone());
        let put = move || {
            // However the thread ends (a panic in the store too), nothing is left waiting on
            // it: what it did not put is lost, and later chunks are put as they are cut.
            let _gone = Gone(p.clone());
            // Dropped before `_gone`, however the thread ends: a chunk sent after the reset
            // would be counted as on its way for ever; once this is gone, sends fail (and the
            // session puts the chunk itself).
            let rx = rx;
            // Behind the session's own work for the cores (the client often shares the
            // machine): what it has not put when the session ends goes in uncompressed.
            let me = rustix::thread::gettid();
            let _ = rustix::process::setpriority_process(Some(me), 10);
            let mut unflushed = false;
            loop {
                // Once nothing has come for a moment (`QUIET`), what was put is made durable:
                // the session's end (often just after a fetch's last reply) has nothing to sync.
                let next = if unflushed {
                    rx.recv_timeout(super::QUIET)
                } else {
                    rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
                };
                let (id, data) = match next {
                    Ok(c) => c,
                    Err(RecvTimeoutError::Timeout) => {
                        if let Err(e) = s.flush() {
                            tracing::debug!("history: {e}");
                        }
                        unflushed = false;
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                };
                // A history that cannot grow costs deltas later, not the answer now.
                if let Err(e) = s.put(&VerifiedChunk::assume_verified(id, &data)) {
                    tracing::debug!("history: {e}");
                }
                unflushed = true;
                lock(&p.0).put(&id, data.len());
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
            while n.bytes >= QUEUED {
                n = done.wait(n).unwrap_or_else(|e| e.into_inner());
            }
            if tx.send((id, data.to_vec())).is_ok() {
                n.sent(id, data.len());
                return;
            }
        }
        if let Err(e) = self.store.put(&VerifiedChunk::assume_verified(id, data)) {
            tracing::debug!("history: {e}");
        }
    }

    /// The store, once every chunk kept so far is in it.
    #[cfg(test)]
    pub(crate) fn settled(&self) -> &Staging {
        self.settled_when(|_| true)
    }

    /// The store, once none of the chunks `ids` is still on its way to it.
    pub(crate) fn settled_for<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a Id> + Clone,
    ) -> &Staging {
        self.settled_when(|q| ids.clone().into_iter().any(|id| q.ids.contains_key(id)))
    }

    /// The store, once no chunk whose short id (the digest's first 8 bytes, little-endian) is
    /// among `short` is still on its way to it.
    pub(crate) fn settled_for_short(&self, short: &[u64]) -> &Staging {
        self.settled_when(|q| {
            q.ids
                .keys()
                .any(|id| short.contains(&ferry_proto::short_id(id)))
        })
    }

    /// The store, once `waiting` no longer holds of what is on its way.
    fn settled_when(&self, waiting: impl Fn(&Queued) -> bool) -> &Staging {
        let (n, done) = &*self.pending;
        let mut n = lock(n);
        while n.count > 0 && waiting(&n) {
            n = done.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        &self.store
    }
}

/// What is on its way to the thread.
#[derive(Default)]
struct Queued {
    count: usize,
    bytes: usize,
    /// Each id on its way, with how many times.
    ids: std::collections::HashMap<Id, u32>,
}

impl Queued {
    fn sent(&mut self, id: Id, len: usize) {
        self.count += 1;
        self.bytes += len;
        *self.ids.entry(id).or_default() += 1;
    }

    fn put(&mut self, id: &Id, len: usize) {
        self.count -= 1;
        self.bytes -= len;
        if let Some(n) = self.ids.get_mut(id) {
            *n -= 1;
            if *n == 0 {
                self.ids.remove(id);
            }
        }
    }
}

type Pending = Arc<(Mutex<Queued>, Condvar)>;

fn lock(m: &Mutex<Queued>) -> std::sync::MutexGuard<'_, Queued> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Ends the thread's part: nothing pending any more.
struct Gone(Pending);

impl Drop for Gone {
    fn drop(&mut self) {
        *lock(&self.0 .0) = Queued::default();
        self.0 .1.notify_all();
    }
}

impl Drop for History {
    /// Every chunk kept is in the store when the session ends. What is still queued then goes
    /// in as it is, not compressed: a client over a fast link is done before the thread
    /// catches up (an 11 MB file's fetch through a local pipe waited 60 ms for it, 40 % of
    /// the fetch), and the session's end waits for the thread.
    fn drop(&mut self) {
        drop(self.tx.take());
        let behind = lock(&self.pending.0).count > 0;
        if behind {
            self.store.prefer_speed(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if behind {
            self.store.prefer_speed(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_format::{HashAlg, Oid, Recipe};
    use ferry_store::{ChunkStore, MemStore, StoreError, StoreStats};
    use std::sync::atomic::{AtomicBool, Ordering};

    type Hook = Box<dyn Fn() + Send + Sync>;

    /// A store that runs a hook before each put (which may panic, or wait), and another before
    /// each flush.
    struct Hooked(MemStore, Hook, Hook);

    impl Hooked {
        fn on_put(hook: impl Fn() + Send + Sync + 'static) -> Self {
            Hooked(
                MemStore::new(HashAlg::Blake3),
                Box::new(hook),
                Box::new(|| {}),
            )
        }

        fn on_flush(hook: impl Fn() + Send + Sync + 'static) -> Self {
            Hooked(
                MemStore::new(HashAlg::Blake3),
                Box::new(|| {}),
                Box::new(hook),
            )
        }
    }

    impl ChunkStore for Hooked {
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
            (self.1)();
            self.0.put(chunk)
        }
        fn flush(&self) -> Result<(), StoreError> {
            (self.2)();
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
        let broke = AtomicBool::new(false);
        let store: Staging = Arc::new(Hooked::on_put(move || {
            assert!(broke.swap(true, Ordering::SeqCst), "the store broke")
        }));
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

    /// A read of old chunks does not wait for the chunks on their way (the file just cut):
    /// here their puts cannot finish until the read is done.
    #[test]
    fn a_read_of_old_chunks_does_not_wait_for_those_on_their_way() {
        // The puts wait while the gate is shut.
        let gate = Arc::new((Mutex::new(true), Condvar::new()));
        let g = gate.clone();
        let store: Staging = Arc::new(Hooked::on_put(move || {
            let mut open = g.0.lock().unwrap();
            while !*open {
                open = g.1.wait(open).unwrap();
            }
        }));
        let h = Arc::new(History::new(store));
        let (chunks, ids) = chunks(3);
        h.keep(ids[0], &chunks[0]);
        assert!(h.settled().contains(&ids[0]).unwrap());
        *gate.0.lock().unwrap() = false;
        h.keep(ids[1], &chunks[1]);
        h.keep(ids[2], &chunks[2]);
        let (tx, rx) = std::sync::mpsc::channel();
        let (h2, old) = (h.clone(), ids[0]);
        std::thread::spawn(move || {
            let held = h2.settled_for([&old]).contains(&old).unwrap();
            let short = ferry_proto::short_id(&old);
            let found = h2.settled_for_short(&[short]).find_prefix(short).unwrap();
            let _ = tx.send((held, found));
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(120));
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        let (held, _) = got.expect("the read waited for the chunks on their way");
        assert!(held);
        // A read of a chunk on its way waits for it, and finds it.
        assert!(h.settled_for([&ids[2]]).contains(&ids[2]).unwrap());
    }

    /// Once nothing more comes for a moment, the thread makes what it put durable while the
    /// session goes on: its end has nothing left to sync.
    #[test]
    fn what_was_kept_is_flushed_once_the_thread_goes_quiet() {
        let (tx, flushed) = std::sync::mpsc::channel();
        let tx = Mutex::new(tx);
        let store: Staging = Arc::new(Hooked::on_flush(move || {
            let _ = tx.lock().unwrap().send(());
        }));
        let h = History::new(store);
        let (chunks, ids) = chunks(10);
        for (id, c) in ids.iter().zip(&chunks) {
            h.keep(*id, c);
        }
        let wait = std::time::Duration::from_secs(120);
        flushed
            .recv_timeout(wait)
            .expect("no flush while the session lasts");
        h.keep(ids[0], &chunks[0]);
        flushed.recv_timeout(wait).expect("no flush after more");
        // The history stays alive here: each flush came from the thread's quiet, not its end.
        assert!(h.settled().contains(&ids[9]).unwrap());
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
