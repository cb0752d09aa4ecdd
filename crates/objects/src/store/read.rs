//! Reading: whole objects from the RAM cache, ranges in windows of whole chunks (each verified
//! where it lies), and chunks by id for transfers.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ferry_format::{Id, IdHasher};
use redb::ReadableDatabase;

use super::{data_name, dberr, io, ObjectStore, CHUNKS, READ_WINDOW};
use crate::caps::{Capability, Rights};
use crate::inode::Inode;
use crate::ObjectsError;

impl ObjectStore {
    /// Writes bytes `start..end` of the object `cap` reads to `out` (clamped to its size), every
    /// chunk they touch verified. Returns the bytes written.
    pub fn read(
        &self,
        cap: &Capability,
        start: u64,
        end: u64,
        out: &mut dyn Write,
    ) -> Result<u64, ObjectsError> {
        let (number, inode) = self.check(cap, Rights::READ)?;
        self.read_checked(number, &inode, start, end, out)
    }

    /// As [`ObjectStore::read`], and the object's id and size with it (one capability check
    /// for both).
    pub fn read_with_size(
        &self,
        cap: &Capability,
        start: u64,
        end: u64,
        out: &mut dyn Write,
    ) -> Result<(ferry_format::Oid, u64), ObjectsError> {
        let (number, inode) = self.check(cap, Rights::READ)?;
        self.read_checked(number, &inode, start, end, out)?;
        Ok((inode.oid, inode.size()))
    }

    fn read_checked(
        &self,
        number: u64,
        inode: &Inode,
        start: u64,
        end: u64,
        out: &mut dyn Write,
    ) -> Result<u64, ObjectsError> {
        let end = end.min(inode.size());
        if start >= end {
            return Ok(0);
        }
        let w = |out: &mut dyn Write, b: &[u8]| {
            out.write_all(b).map_err(io("write", "the output".into()))
        };
        if let Some(data) = self.whole_cached(number, inode)? {
            w(out, &data[start as usize..end as usize])?;
            return Ok(end - start);
        }
        let recipe = self.recipe_of(number)?;
        // The chunks the range touches, with where each begins.
        let mut at = 0u64;
        let touched: Vec<(u64, &ferry_format::ChunkRef)> = recipe
            .chunks()
            .iter()
            .map(|c| {
                at += c.len as u64;
                (at - c.len as u64, c)
            })
            .filter(|(c_start, c)| c_start + c.len as u64 > start && *c_start < end)
            .collect();
        // A window of up to READ_WINDOW bytes of them at a time: one positioned read, then each
        // chunk verified where it lies and its part of the range written out.
        let mut buf = vec![];
        let mut rest = &touched[..];
        while !rest.is_empty() {
            let mut n = 0;
            let mut bytes = 0u64;
            while n < rest.len() && (n == 0 || bytes + rest[n].1.len as u64 <= READ_WINDOW) {
                bytes += rest[n].1.len as u64;
                n += 1;
            }
            let (window, later) = rest.split_at(n);
            rest = later;
            let first = window[0].0;
            buf.resize(bytes as usize, 0);
            self.read_at(number, first, &mut buf)?;
            for (c_start, c) in window {
                let from = (c_start - first) as usize;
                let piece = &buf[from..from + c.len as usize];
                verify(&c.id, piece, number)?;
                let a = start.saturating_sub(*c_start) as usize;
                let z = (end.min(c_start + c.len as u64) - c_start) as usize;
                w(out, &piece[a..z])?;
            }
        }
        Ok(end - start)
    }

    /// The whole of a small object, verified, from the cache or read in one positioned read
    /// (and cached). `None` for an object too large to cache.
    fn whole_cached(
        &self,
        number: u64,
        inode: &Inode,
    ) -> Result<Option<Arc<Vec<u8>>>, ObjectsError> {
        if let Some(p) = self.pending.lock().expect("pending").get(&number) {
            return Ok(Some(p.data.clone()));
        }
        if inode.size() > self.opts.cache_max_object {
            return Ok(None);
        }
        if let Some(d) = self.cache.lock().expect("cache").get(&number) {
            return Ok(Some(d.clone()));
        }
        let mut data = vec![0; inode.size() as usize];
        self.read_at(number, 0, &mut data)?;
        let mut h = IdHasher::new(inode.oid.0.alg());
        h.update(&data);
        if h.finish() != inode.oid.0 {
            return Err(ObjectsError::Corrupt(format!(
                "object {number}'s bytes on disk are not its OID's"
            )));
        }
        let data = Arc::new(data);
        self.cache_put(number, data.clone());
        Ok(Some(data))
    }

    fn cache_put(&self, number: u64, data: Arc<Vec<u8>>) {
        let mut c = self.cache.lock().expect("cache");
        let mut total = self.cached.load(Ordering::Relaxed) + data.len() as u64;
        while total > self.opts.cache_bytes as u64 {
            match c.pop_lru() {
                Some((_, d)) => total -= d.len() as u64,
                None => break,
            }
        }
        if let Some(old) = c.put(number, data) {
            total -= old.len() as u64;
        }
        self.cached.store(total, Ordering::Relaxed);
    }

    pub(super) fn cache_drop(&self, number: u64) {
        if let Some(d) = self.cache.lock().expect("cache").pop(&number) {
            self.cached.fetch_sub(d.len() as u64, Ordering::Relaxed);
        }
    }

    /// `buf.len()` bytes at `offset` of object `number`: one positioned read, under the state
    /// lock so the extent cannot move or be reused meanwhile.
    pub(super) fn read_at(
        &self,
        number: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), ObjectsError> {
        let state = self.state.read().expect("state");
        let inode = state.inodes.get(&number).ok_or(ObjectsError::Denied)?;
        let e = inode.extent;
        if offset + buf.len() as u64 > e.len {
            return Err(ObjectsError::Corrupt(format!(
                "a read past the end of object {number}"
            )));
        }
        let file = self
            .files
            .read()
            .expect("files")
            .get(e.file as usize)
            .cloned();
        let file = file.ok_or_else(|| {
            ObjectsError::Corrupt(format!("object {number} lies in a missing data file"))
        })?;
        file.read_at(buf, e.offset + offset)
            .map_err(io("read", data_name(e.file)))
    }

    /// A chunk by id, from whichever object holds it, verified; `None` if none does (or its
    /// bytes are damaged).
    pub fn chunk(&self, id: &Id) -> Result<Option<Vec<u8>>, ObjectsError> {
        let Some((number, offset, len)) = self.chunk_place(id)? else {
            return Ok(None);
        };
        let mut buf = vec![0; len as usize];
        if let Some(p) = self.pending.lock().expect("pending").get(&number) {
            buf.copy_from_slice(&p.data[offset as usize..(offset + len as u64) as usize]);
        } else if self.read_at(number, offset, &mut buf).is_err() {
            return Ok(None);
        }
        Ok(verify(id, &buf, number).is_ok().then_some(buf))
    }

    fn chunk_place(&self, id: &Id) -> Result<Option<(u64, u64, u32)>, ObjectsError> {
        let tx = self.db.begin_read().map_err(dberr)?;
        let t = tx.open_table(CHUNKS).map_err(dberr)?;
        let Some(v) = t.get(&id.to_bytes()[..]).map_err(dberr)? else {
            return Ok(None);
        };
        let v = v.value();
        if v.len() != 20 {
            return Err(ObjectsError::Corrupt(format!("the place of chunk {id}")));
        }
        Ok(Some((
            u64::from_le_bytes(v[..8].try_into().expect("8")),
            u64::from_le_bytes(v[8..16].try_into().expect("8")),
            u32::from_le_bytes(v[16..].try_into().expect("4")),
        )))
    }

    pub fn contains_chunk(&self, id: &Id) -> Result<bool, ObjectsError> {
        Ok(self.chunk_place(id)?.is_some())
    }
}

fn verify(id: &Id, data: &[u8], number: u64) -> Result<(), ObjectsError> {
    let mut h = IdHasher::new(id.alg());
    h.update(data);
    match h.finish() == *id {
        true => Ok(()),
        false => Err(ObjectsError::Corrupt(format!(
            "a chunk of object {number} on disk is not {id}"
        ))),
    }
}
