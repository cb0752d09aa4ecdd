//! Reading packs by windows: a chunk is read with the aligned window of its pack around it
//! (a few MiB, one ranged GET), kept in a small LRU, so a reader walking an object's chunks
//! in order makes one request per window rather than one per chunk. Windows asked for ahead
//! ([`ferry_store::ChunkStore::prefetch`]) load on background threads, several at once; a
//! reader that needs a window being loaded waits for it rather than asking again.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};

use crate::S3Error;

pub(crate) type Key = (u32, u64);

enum State {
    Loading,
    Ready(Arc<Vec<u8>>),
    Failed(String),
}

/// A window loading or loaded.
pub(crate) struct Slot {
    state: Mutex<State>,
    cv: Condvar,
}

impl Slot {
    fn set(&self, r: Result<Vec<u8>, S3Error>) -> Result<Arc<Vec<u8>>, S3Error> {
        let mut g = self.state.lock().unwrap();
        let out = match r {
            Ok(b) => {
                let b = Arc::new(b);
                *g = State::Ready(b.clone());
                Ok(b)
            }
            Err(e) => {
                *g = State::Failed(e.to_string());
                Err(e)
            }
        };
        self.cv.notify_all();
        out
    }
}

#[derive(Default)]
struct Map {
    slots: HashMap<Key, Arc<Slot>>,
    order: VecDeque<Key>,
}

/// The window cache.
pub(crate) struct Windows {
    map: Mutex<Map>,
    /// Windows kept.
    max: usize,
}

impl Windows {
    pub(crate) fn new(max: usize) -> Windows {
        Windows {
            map: Mutex::default(),
            max: max.max(2),
        }
    }

    /// The slot for `k`, and whether this call made it (and must load it).
    fn slot(&self, k: Key) -> (Arc<Slot>, bool) {
        let mut m = self.map.lock().unwrap();
        if let Some(s) = m.slots.get(&k) {
            let s = s.clone();
            // Most recently used last.
            if let Some(i) = m.order.iter().position(|x| *x == k) {
                m.order.remove(i);
            }
            m.order.push_back(k);
            return (s, false);
        }
        let s = Arc::new(Slot {
            state: Mutex::new(State::Loading),
            cv: Condvar::new(),
        });
        m.slots.insert(k, s.clone());
        m.order.push_back(k);
        while m.order.len() > self.max {
            if let Some(old) = m.order.pop_front() {
                m.slots.remove(&old);
            }
        }
        (s, true)
    }

    fn forget(&self, k: Key) {
        let mut m = self.map.lock().unwrap();
        m.slots.remove(&k);
        m.order.retain(|x| *x != k);
    }

    /// Window `k`, loaded by `load` here if nobody has it or is loading it.
    pub(crate) fn get(
        &self,
        k: Key,
        load: impl FnOnce() -> Result<Vec<u8>, S3Error>,
    ) -> Result<Arc<Vec<u8>>, S3Error> {
        let (slot, mine) = self.slot(k);
        if mine {
            let r = slot.set(load());
            if r.is_err() {
                self.forget(k);
            }
            return r;
        }
        let mut g = slot.state.lock().unwrap();
        loop {
            match &*g {
                State::Ready(b) => return Ok(b.clone()),
                State::Failed(e) => {
                    let e = S3Error::Damaged(e.clone());
                    drop(g);
                    self.forget(k);
                    return Err(e);
                }
                State::Loading => g = slot.cv.wait(g).unwrap(),
            }
        }
    }

    /// Marks `k` as being loaded by a background thread, unless it is there or on its way:
    /// the slot to [`fill`](Self::fill).
    pub(crate) fn claim(&self, k: Key) -> Option<Arc<Slot>> {
        let (slot, mine) = self.slot(k);
        mine.then_some(slot)
    }

    /// What a background thread loaded for [`claim`](Self::claim) (waiters hold the slot even
    /// when the window was pushed out of the cache meanwhile).
    pub(crate) fn fill(&self, k: Key, slot: &Slot, r: Result<Vec<u8>, S3Error>) {
        if slot.set(r).is_err() {
            self.forget(k);
        }
    }

    /// Waits while window `k` is being loaded; whether it is (or was being) loaded here.
    pub(crate) fn wait_loaded(&self, k: Key) -> bool {
        let Some(slot) = self.map.lock().unwrap().slots.get(&k).cloned() else {
            return false;
        };
        let mut g = slot.state.lock().unwrap();
        while matches!(*g, State::Loading) {
            g = slot.cv.wait(g).unwrap();
        }
        true
    }

    /// Drops a window found damaged, so the next read fetches it again.
    pub(crate) fn drop_window(&self, k: Key) {
        self.forget(k);
    }
}

/// Chunks the download threads verified ahead of the reader, waiting to be taken (bounded in
/// bytes: the oldest go first when a reader does not come for them).
pub(crate) struct Ready {
    inner: Mutex<ReadyInner>,
    max_bytes: usize,
}

#[derive(Default)]
struct ReadyInner {
    map: HashMap<ferry_format::Id, Vec<u8>>,
    order: VecDeque<ferry_format::Id>,
    bytes: usize,
}

impl Ready {
    pub(crate) fn new(max_bytes: usize) -> Ready {
        Ready {
            inner: Mutex::default(),
            max_bytes,
        }
    }

    pub(crate) fn put(&self, id: ferry_format::Id, data: Vec<u8>) {
        let mut g = self.inner.lock().unwrap();
        g.bytes += data.len();
        if let Some(old) = g.map.insert(id, data) {
            g.bytes -= old.len();
        }
        g.order.push_back(id);
        while g.bytes > self.max_bytes {
            let Some(old) = g.order.pop_front() else {
                break;
            };
            if let Some(d) = g.map.remove(&old) {
                g.bytes -= d.len();
            }
        }
        // Ids taken leave stale entries in the order: sweep them now and then.
        if g.order.len() > 2 * g.map.len() + 1024 {
            let ReadyInner { map, order, .. } = &mut *g;
            order.retain(|id| map.contains_key(id));
        }
    }

    pub(crate) fn take(&self, id: &ferry_format::Id) -> Option<Vec<u8>> {
        let mut g = self.inner.lock().unwrap();
        let d = g.map.remove(id)?;
        g.bytes -= d.len();
        Some(d)
    }
}
