//! The read path: a chunk from the window of its pack (loaded here, or by a download thread
//! that verified it already), verified against its id.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use ferry_format::Id;
use ferry_store::StoreError;

use super::{next, Download, Inner};
use crate::index::Loc;
use crate::pack::{self, Entry};
use crate::read::{Key, Slot};
use crate::S3Error;

/// Starts loading the windows of `locs` (in reading order) that nobody has or is loading; the
/// records wholly inside a window claimed here are verified by its download thread. Whether
/// the download threads still run.
pub(super) fn claim_windows(inner: &Inner, tx: &SyncSender<Download>, locs: &[Loc]) -> bool {
    // The window being gathered: its key, its slot if claimed here, its records.
    let mut current: Option<(Key, Option<Arc<Slot>>, Vec<Entry>)> = None;
    let send = |c: Option<(Key, Option<Arc<Slot>>, Vec<Entry>)>| match c {
        Some((k, Some(slot), entries)) => tx.send((k, slot, entries)).is_ok(),
        _ => true,
    };
    for l in locs {
        let keys: Vec<Key> = inner.windows_of(l).collect();
        for (i, k) in keys.iter().enumerate() {
            if current.as_ref().is_none_or(|c| c.0 != *k) {
                if !send(current.take()) {
                    return false;
                }
                current = Some((*k, inner.windows.claim(*k), vec![]));
            }
            if keys.len() == 1 && i == 0 {
                if let Some(c) = current.as_mut() {
                    c.2.push(l.entry);
                }
            }
        }
    }
    send(current)
}

pub(super) fn downloader(inner: &Inner, rx: &Mutex<Receiver<Download>>) {
    while let Some((k, slot, entries)) = next(rx) {
        let r = inner.fetch_window(k);
        if let Ok(win) = &r {
            // Verified here, in parallel, rather than on the reader's thread.
            let base = k.1 * inner.window;
            for e in entries {
                let a = (e.offset - base) as usize;
                let Some(stored) = win.get(a..a + e.stored_len as usize) else {
                    continue;
                };
                if let Ok(d) = pack::open_record(&e, stored.to_vec(), "") {
                    inner.ready.put(e.id, d);
                }
            }
        }
        inner.windows.fill(k, &slot, r);
    }
}

impl Inner {
    /// The windows a record spans.
    pub(super) fn windows_of(&self, l: &Loc) -> impl Iterator<Item = Key> {
        let start = l.entry.offset;
        let end = start + (l.entry.stored_len as u64).max(1);
        let (a, b) = (start / self.window, (end - 1) / self.window);
        let pack = l.pack;
        (a..=b).map(move |w| (pack, w))
    }

    fn fetch_window(&self, (pack, w): Key) -> Result<Vec<u8>, S3Error> {
        let (name, size) = self
            .index
            .pack(pack)
            .map_err(|e| S3Error::Damaged(e.to_string()))?
            .ok_or_else(|| S3Error::Gone(format!("pack number {pack}")))?;
        let start = w * self.window;
        let end = (start + self.window).min(size);
        self.client
            .get(&self.pack_key(&name), Some((start, end)))?
            .ok_or_else(|| S3Error::Gone(format!("pack {name}")))
    }

    /// The stored bytes of a record, through the window cache.
    fn stored(&self, l: &Loc) -> Result<Vec<u8>, S3Error> {
        let (start, len) = (l.entry.offset, l.entry.stored_len as usize);
        let mut out = Vec::with_capacity(len);
        for k in self.windows_of(l) {
            let win = self.windows.get(k, || self.fetch_window(k))?;
            let base = k.1 * self.window;
            let a = (start.max(base) - base) as usize;
            let b = ((start + len as u64).min(base + win.len() as u64) - base) as usize;
            if a > b || b > win.len() {
                return Err(S3Error::Damaged(format!(
                    "pack number {}: shorter than its index",
                    k.0
                )));
            }
            out.extend_from_slice(&win[a..b]);
        }
        if out.len() != len {
            return Err(S3Error::Damaged(format!(
                "pack number {}: shorter than its index",
                l.pack
            )));
        }
        Ok(out)
    }

    /// A record's chunk, verified (`None` if its pack is gone from the bucket); a record that
    /// fails is read once more on its own (a window may have been damaged on the way), then
    /// reported.
    pub(super) fn read_loc(&self, l: &Loc) -> Result<Option<Vec<u8>>, StoreError> {
        let where_ = format!(
            "{} pack number {} offset {}",
            self.name, l.pack, l.entry.offset
        );
        match self.stored(l) {
            Err(S3Error::Gone(_)) => return Ok(None),
            Ok(s) => {
                if let Ok(d) = pack::open_record(&l.entry, s, &where_) {
                    return Ok(Some(d));
                }
            }
            Err(_) => {}
        }
        for k in self.windows_of(l) {
            self.windows.drop_window(k);
        }
        let again = match self.stored(l) {
            Err(S3Error::Gone(_)) => return Ok(None),
            r => r?,
        };
        let r = pack::open_record(&l.entry, again, &where_);
        if r.as_ref().is_err_and(|e| e.is_corrupt()) {
            self.damaged.fetch_add(1, Ordering::Relaxed);
        }
        r.map(Some)
    }

    pub(super) fn get(&self, id: &Id) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(d) = self.state.lock().unwrap().pending.get(id) {
            return Ok(Some(d.to_vec()));
        }
        if let Some(d) = self.ready.take(id) {
            return Ok(Some(d));
        }
        for attempt in 0..2 {
            let loc = match self.index.get(id)? {
                Some(l) => l,
                None => {
                    // Another server may have flushed it since: look again once.
                    self.refresh()?;
                    match self.index.get(id)? {
                        Some(l) => l,
                        None => return Ok(None),
                    }
                }
            };
            // A download thread loading this chunk's window verifies the chunk as well:
            // wait for it rather than do it twice.
            if let Some(k) = self.windows_of(&loc).next() {
                if self.windows.wait_loaded(k) {
                    if let Some(d) = self.ready.take(id) {
                        return Ok(Some(d));
                    }
                }
            }
            match self.read_loc(&loc)? {
                Some(d) => return Ok(Some(d)),
                // Deleted by another server's gc: its chunks may live in a newer pack.
                None if attempt == 0 => self.refresh()?,
                None => {}
            }
        }
        Ok(None)
    }
}
