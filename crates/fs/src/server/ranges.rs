//! Files read by ranges (ReadRange). A file too large for the history is not cut before its
//! first range leaves: its object id is hashed as the ranges go by, in order, and named on the
//! reply that reaches its end. The first bytes leave at once, and the file is read once.

use std::collections::VecDeque;
use std::io;
use std::os::unix::fs::FileExt;

use ferry_format::{Id, IdHasher};
use ferry_proto::{FileKind, Reply, Target, WirePath};

use super::{io_error, Server};
use crate::export::FileId;

/// Files followed at once (a client reads them one after another; a few spare).
const FOLLOWED: usize = 4;
/// Object ids of files hashed so, remembered by version.
const HASHED: usize = 256;

/// The object ids of files being read in order, hashed so far, and of those read to the end.
#[derive(Default)]
pub(super) struct RangeHashes {
    files: VecDeque<Following>,
    hashed: VecDeque<(FileId, Id)>,
}

struct Following {
    fid: FileId,
    /// The offset the next range must start at to be followed.
    next: u64,
    hasher: IdHasher,
}

impl RangeHashes {
    /// Whether the file `fid` is followed up to `offset` (or `offset` starts it).
    fn follows(&self, fid: &FileId, offset: u64) -> bool {
        offset == 0 || self.files.iter().any(|f| f.fid == *fid && f.next == offset)
    }

    /// Takes `data`, read at `offset` from version `fid` of a file of `size` bytes; returns
    /// the object id when it ends the file.
    fn follow(
        &mut self,
        fid: FileId,
        offset: u64,
        data: &[u8],
        alg: ferry_format::HashAlg,
    ) -> Option<Id> {
        let i = match self.files.iter().position(|f| f.fid == fid) {
            Some(i) if self.files[i].next == offset => i,
            found => {
                if let Some(i) = found {
                    self.files.remove(i);
                }
                if offset != 0 {
                    return None;
                }
                if self.files.len() == FOLLOWED {
                    self.files.pop_front();
                }
                self.files.push_back(Following {
                    fid,
                    next: 0,
                    hasher: IdHasher::new(alg),
                });
                self.files.len() - 1
            }
        };
        let f = &mut self.files[i];
        f.hasher.update(data);
        f.next += data.len() as u64;
        if f.next < f.fid.size {
            return None;
        }
        let f = self.files.remove(i).expect("found");
        let oid = f.hasher.finish();
        self.remember(f.fid, oid);
        Some(oid)
    }

    /// Notes that version `fid` is object `oid`.
    fn remember(&mut self, fid: FileId, oid: Id) {
        if self.hashed.len() == HASHED {
            self.hashed.pop_front();
        }
        self.hashed.push_back((fid, oid));
    }

    /// The object id of version `fid`, if it was read to the end.
    fn hashed(&self, fid: &FileId) -> Option<Id> {
        self.hashed
            .iter()
            .find(|(f, _)| f == fid)
            .map(|(_, id)| *id)
    }
}

impl Server {
    /// Bytes `offset..offset + len` of a file (fewer at its end), with its version, and its
    /// object id when known: a file the history keeps is cut (once per version) before its
    /// first range, a larger one is hashed as its ranges go by.
    pub(super) fn read_range(&mut self, target: &Target, offset: u64, len: u32) -> Reply {
        let r = self.resolve(target).and_then(|path| {
            let (version, oid, data) = self.range_of(&path, offset, len, target)?;
            match target {
                // Checked before any byte leaves: a file that is not (or no longer known to
                // be) the object asked for serves none of it.
                Target::Object(want) if oid != Some(*want) => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("object {want} is gone"),
                )),
                _ => Ok((version, oid, data)),
            }
        });
        match r {
            Ok((version, oid, data)) => Reply::Range { version, oid, data },
            Err(e) => io_error(&target_path(target), &e),
        }
    }

    fn range_of(
        &mut self,
        path: &WirePath,
        offset: u64,
        len: u32,
        target: &Target,
    ) -> io::Result<(u64, Option<Id>, Vec<u8>)> {
        let file = self.export.open_file(path)?;
        let _lock = crate::inplace::read_guard(&self.export, &file)?;
        let (attr, fid) = crate::export::attr_of(&rustix::fs::fstat(&file)?);
        if attr.kind != FileKind::File {
            return Err(io::Error::from(io::ErrorKind::IsADirectory));
        }
        let mut known = self.known_oid(path, &fid);
        // Cut first: a file the history keeps, one not read in order, or an object asked for
        // by id (the id is checked before any byte leaves).
        let cut_first = attr.size <= self.history_file_max
            || !self.ranges.follows(&fid, offset)
            || matches!(target, Target::Object(_));
        if known.is_none() && cut_first {
            self.recipe(path)?;
            known = self.recipes.get(&fid).map(|(_, oid)| oid.id());
        }
        let changed = || io::Error::other("the file changed while it was read; fetch it again");
        let mut data = vec![0u8; (len as u64).min(attr.size.saturating_sub(offset)) as usize];
        file.read_exact_at(&mut data, offset)
            .map_err(|_| changed())?;
        if crate::export::attr_of(&rustix::fs::fstat(&file)?).1 != fid {
            return Err(changed());
        }
        let oid = match known {
            Some(oid) => Some(oid),
            None => {
                let oid = self.ranges.follow(fid, offset, &data, self.opts.hash);
                if let Some(oid) = oid {
                    self.objects.insert(oid, path.clone());
                }
                oid
            }
        };
        Ok((attr.version, oid, data))
    }

    /// The object id of version `fid` of the file at `path`, if this session or the index
    /// knows it (what the index knows is remembered: it is read once per version, not per
    /// range).
    fn known_oid(&mut self, path: &WirePath, fid: &FileId) -> Option<Id> {
        if let Some((_, oid)) = self.recipes.get(fid) {
            return Some(oid.id());
        }
        if let Some(oid) = self.ranges.hashed(fid) {
            return Some(oid);
        }
        let oid = self.indexed(path, fid).map(|(_, oid)| oid.id())?;
        self.ranges.remember(fid.clone(), oid);
        Some(oid)
    }
}

/// For error messages: the path a target names, or the object id as one.
pub(super) fn target_path(t: &Target) -> WirePath {
    match t {
        Target::Path(p) => p.clone(),
        Target::Object(id) => {
            WirePath::new(id.to_string().replace(':', "-").into_bytes()).unwrap_or_default()
        }
    }
}
