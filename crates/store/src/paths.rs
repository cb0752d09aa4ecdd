//! An index of chunks that live inside ordinary files (LBFS's chunk database): which file, at
//! which offset, each chunk was last seen in, the recipe of each file version cut, and which
//! file holds each object. A server keeps one per export, so any chunk of the export, its trash
//! or an earlier upload can be asked for by id, and an unchanged file is not cut again, across
//! sessions and restarts.
//!
//! Everything here is a hint: a file may have changed since it was indexed. A recipe is used
//! only while the file's identity (device, inode, size, both times) is the one recorded; a
//! chunk's location only once the bytes read there hash to its id (the caller checks, and
//! [`PathIndex::forget`]s a wrong one). Writes are not synced one by one (a crash loses recent
//! hints, which costs a file being cut again); [`PathIndex::sync`] makes them durable.
//!
//! | table | key | value |
//! |---|---|---|
//! | `files` | path bytes | stamp (dev u64, ino u64, size u64, mtime_ns i64, ctime_ns i64; LE) · object digest (32) · Recipe v1 |
//! | `chunks` | chunk digest (32) | offset u64le · length u32le · path bytes |
//! | `objects` | object digest (32) | path bytes |

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use ferry_format::{HashAlg, Id, Oid, Recipe};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::local::db_err;
use crate::StoreError;

const FILES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("files");
const CHUNKS: TableDefinition<&[u8; 32], &[u8]> = TableDefinition::new("chunks");
const OBJECTS: TableDefinition<&[u8; 32], &[u8]> = TableDefinition::new("objects");

/// The index's three tables, open for writing.
type Tables<'t> = (
    redb::Table<'t, &'static [u8], &'static [u8]>,
    redb::Table<'t, &'static [u8; 32], &'static [u8]>,
    redb::Table<'t, &'static [u8; 32], &'static [u8]>,
);

/// A file version's identity: any change to the file (through Ferry or not) changes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl Stamp {
    fn encode(&self) -> [u8; 40] {
        let mut b = [0u8; 40];
        b[..8].copy_from_slice(&self.dev.to_le_bytes());
        b[8..16].copy_from_slice(&self.ino.to_le_bytes());
        b[16..24].copy_from_slice(&self.size.to_le_bytes());
        b[24..32].copy_from_slice(&self.mtime_ns.to_le_bytes());
        b[32..40].copy_from_slice(&self.ctime_ns.to_le_bytes());
        b
    }
}

/// See the module documentation.
pub struct PathIndex {
    db: Database,
    path: PathBuf,
    alg: HashAlg,
    /// Something was committed and not yet made durable: [`sync`](PathIndex::sync) has work.
    unsynced: AtomicBool,
}

impl PathIndex {
    /// Opens the index in file `path`, creating it (and its directory) if need be. Fails with
    /// [`StoreError::Locked`] when another process has it open.
    pub fn open(path: &Path, alg: HashAlg) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(StoreError::io("create directory", dir))?;
        }
        let db = crate::index_builder().create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Locked {
                path: path.to_path_buf(),
            },
            e => db_err(path)(e),
        })?;
        // Made once: a write transaction at every open cost the disk its syncs.
        let r = db.begin_read().map_err(db_err(path))?;
        let made = r.open_table(FILES).is_ok()
            && r.open_table(CHUNKS).is_ok()
            && r.open_table(OBJECTS).is_ok();
        drop(r);
        if !made {
            let w = db.begin_write().map_err(db_err(path))?;
            {
                w.open_table(FILES).map_err(db_err(path))?;
                w.open_table(CHUNKS).map_err(db_err(path))?;
                w.open_table(OBJECTS).map_err(db_err(path))?;
            }
            w.commit().map_err(db_err(path))?;
        }
        Ok(PathIndex {
            db,
            path: path.to_path_buf(),
            alg,
            unsynced: AtomicBool::new(false),
        })
    }

    /// The recipe and object of the file at `path`, if it was cut while it had `stamp`.
    pub fn recipe(&self, path: &[u8], stamp: &Stamp) -> Result<Option<(Recipe, Oid)>, StoreError> {
        let r = self.db.begin_read().map_err(db_err(&self.path))?;
        let t = r.open_table(FILES).map_err(db_err(&self.path))?;
        let Some(v) = t.get(path).map_err(db_err(&self.path))? else {
            return Ok(None);
        };
        let v = v.value();
        if v.len() < 72 || v[..40] != stamp.encode() {
            return Ok(None);
        }
        let oid = Oid(Id::from_parts(
            self.alg,
            v[40..72].try_into().expect("32 bytes"),
        ));
        // A damaged entry is no entry: the file is cut again.
        Ok(Recipe::decode(&v[72..]).ok().map(|r| (r, oid)))
    }

    /// Records that the file at `path`, while it has `stamp`, is `recipe` (object `oid`): its
    /// chunks lie there, one after another. The chunks of the version it had before are
    /// forgotten where they pointed here (they are found again where they are now).
    pub fn record(
        &self,
        path: &[u8],
        stamp: &Stamp,
        recipe: &Recipe,
        oid: &Oid,
    ) -> Result<(), StoreError> {
        self.record_all(&[(path, stamp, recipe, oid)])
    }

    /// [`record`](Self::record)s each file, in order, in one transaction (a commit each cost
    /// a server about 40 µs a file of a tree put).
    pub fn record_all(&self, files: &[(&[u8], &Stamp, &Recipe, &Oid)]) -> Result<(), StoreError> {
        if files.is_empty() {
            return Ok(());
        }
        let e = db_err(&self.path);
        let mut w = self.db.begin_write().map_err(db_err(&self.path))?;
        w.set_durability(redb::Durability::None)
            .map_err(|x| StoreError::Index {
                path: self.path.clone(),
                msg: x.to_string(),
            })?;
        {
            let mut tables = (
                w.open_table(FILES).map_err(db_err(&self.path))?,
                w.open_table(CHUNKS).map_err(db_err(&self.path))?,
                w.open_table(OBJECTS).map_err(db_err(&self.path))?,
            );
            for &(path, stamp, recipe, oid) in files {
                self.record_in(&mut tables, path, stamp, recipe, oid)?;
            }
        }
        w.commit().map_err(e)?;
        self.committed_lazily();
        Ok(())
    }

    /// A commit not made durable was made. Marked after it: a [`sync`](Self::sync) that
    /// cleared the mark before it began waited for this commit and made it durable too.
    fn committed_lazily(&self) {
        self.unsynced.store(true, Ordering::SeqCst);
    }

    fn record_in(
        &self,
        (files, chunks, objects): &mut Tables<'_>,
        path: &[u8],
        stamp: &Stamp,
        recipe: &Recipe,
        oid: &Oid,
    ) -> Result<(), StoreError> {
        let old = files
            .get(path)
            .map_err(db_err(&self.path))?
            .and_then(|v| Recipe::decode(v.value().get(72..)?).ok());
        if let Some(old) = old {
            for c in old.chunks() {
                let here = chunks
                    .get(c.id.digest())
                    .map_err(db_err(&self.path))?
                    .is_some_and(|v| v.value().get(12..) == Some(path));
                if here {
                    chunks.remove(c.id.digest()).map_err(db_err(&self.path))?;
                }
            }
        }
        let mut value = Vec::with_capacity(72 + recipe.len() * 36);
        value.extend_from_slice(&stamp.encode());
        value.extend_from_slice(oid.id().digest());
        value.extend_from_slice(&recipe.encode());
        files.insert(path, &value[..]).map_err(db_err(&self.path))?;
        let mut loc = Vec::with_capacity(12 + path.len());
        for (offset, c) in recipe.with_offsets() {
            loc.clear();
            loc.extend_from_slice(&offset.to_le_bytes());
            loc.extend_from_slice(&c.len.to_le_bytes());
            loc.extend_from_slice(path);
            chunks
                .insert(c.id.digest(), &loc[..])
                .map_err(db_err(&self.path))?;
        }
        objects
            .insert(oid.id().digest(), path)
            .map_err(db_err(&self.path))?;
        Ok(())
    }

    /// Where chunk `id` was last seen: (path, offset, length).
    pub fn locate(&self, id: &Id) -> Result<Option<(Vec<u8>, u64, u32)>, StoreError> {
        let r = self.db.begin_read().map_err(db_err(&self.path))?;
        let t = r.open_table(CHUNKS).map_err(db_err(&self.path))?;
        let Some(v) = t.get(id.digest()).map_err(db_err(&self.path))? else {
            return Ok(None);
        };
        let v = v.value();
        if v.len() < 12 {
            return Ok(None);
        }
        let offset = u64::from_le_bytes(v[..8].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(v[8..12].try_into().expect("4 bytes"));
        Ok(Some((v[12..].to_vec(), offset, len)))
    }

    /// A chunk whose digest begins with the 8 bytes `short` (little-endian), if any is known.
    pub fn find_prefix(&self, short: u64) -> Result<Option<Id>, StoreError> {
        let r = self.db.begin_read().map_err(db_err(&self.path))?;
        let t = r.open_table(CHUNKS).map_err(db_err(&self.path))?;
        let mut lo = [0u8; 32];
        lo[..8].copy_from_slice(&short.to_le_bytes());
        let mut hi = [0xffu8; 32];
        hi[..8].copy_from_slice(&short.to_le_bytes());
        let mut range = t
            .range::<&[u8; 32]>(&lo..=&hi)
            .map_err(db_err(&self.path))?;
        let first = range.next().transpose().map_err(db_err(&self.path))?;
        Ok(first.map(|(k, _)| Id::from_parts(self.alg, *k.value())))
    }

    /// Where object `oid` was last seen.
    pub fn object(&self, oid: &Id) -> Result<Option<Vec<u8>>, StoreError> {
        let r = self.db.begin_read().map_err(db_err(&self.path))?;
        let t = r.open_table(OBJECTS).map_err(db_err(&self.path))?;
        Ok(t.get(oid.digest())
            .map_err(db_err(&self.path))?
            .map(|v| v.value().to_vec()))
    }

    /// Forgets where chunks `ids` were seen (the bytes there were not them), in one
    /// transaction: a file gone since it was indexed makes every one of its chunks stale at
    /// once, and a transaction each made a `Have` of 115,000 of them take 1.5 s.
    pub fn forget(&self, ids: &[Id]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut w = self.db.begin_write().map_err(db_err(&self.path))?;
        let _ = w.set_durability(redb::Durability::None);
        {
            let mut t = w.open_table(CHUNKS).map_err(db_err(&self.path))?;
            for id in ids {
                t.remove(id.digest()).map_err(db_err(&self.path))?;
            }
        }
        w.commit().map_err(db_err(&self.path))?;
        self.committed_lazily();
        Ok(())
    }

    /// Makes everything recorded so far durable: a durable commit, unless nothing was
    /// recorded since the last one (a session's end after its quiet moment synced it).
    pub fn sync(&self) -> Result<(), StoreError> {
        // Cleared before the commit: what another thread records meanwhile is either in it
        // or marks the index again.
        if !self.unsynced.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        let done = match self.db.begin_write() {
            Ok(w) => w.commit().map_err(db_err(&self.path)),
            Err(e) => Err(db_err(&self.path)(e)),
        };
        if done.is_err() {
            self.unsynced.store(true, Ordering::SeqCst);
        }
        done
    }

    /// Whether something recorded is not yet durable ([`sync`](Self::sync) has work).
    pub fn unsynced(&self) -> bool {
        self.unsynced.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_format::ChunkRef;

    fn recipe(seeds: &[u8]) -> Recipe {
        let chunks = seeds
            .iter()
            .map(|&s| ChunkRef {
                id: Id::hash(HashAlg::Blake3, &[s; 100]),
                len: 100,
            })
            .collect();
        Recipe::from_chunks(HashAlg::Blake3, chunks).unwrap()
    }

    fn stamp(ino: u64) -> Stamp {
        Stamp {
            dev: 1,
            ino,
            size: 300,
            mtime_ns: 5,
            ctime_ns: 6,
        }
    }

    #[test]
    fn recipes_chunks_and_objects_survive_a_reopen() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("index.redb");
        let r = recipe(&[1, 2, 3]);
        let oid = Oid(Id::hash(HashAlg::Blake3, b"the file"));
        {
            let i = PathIndex::open(&p, HashAlg::Blake3).unwrap();
            i.record(b"d/f", &stamp(7), &r, &oid).unwrap();
            i.sync().unwrap();
            // One process at a time.
            assert!(matches!(
                PathIndex::open(&p, HashAlg::Blake3),
                Err(StoreError::Locked { .. })
            ));
        }
        let i = PathIndex::open(&p, HashAlg::Blake3).unwrap();
        assert_eq!(i.recipe(b"d/f", &stamp(7)).unwrap(), Some((r.clone(), oid)));
        // Another identity: the file changed; no recipe.
        assert_eq!(i.recipe(b"d/f", &stamp(8)).unwrap(), None);
        let c = r.chunks()[1];
        assert_eq!(i.locate(&c.id).unwrap(), Some((b"d/f".to_vec(), 100, 100)));
        let short = u64::from_le_bytes(c.id.digest()[..8].try_into().unwrap());
        assert_eq!(i.find_prefix(short).unwrap(), Some(c.id));
        assert_eq!(i.object(&oid.id()).unwrap(), Some(b"d/f".to_vec()));
        i.forget(&[c.id]).unwrap();
        assert_eq!(i.locate(&c.id).unwrap(), None);
        // A new version of the file: what only the old one had is forgotten there.
        i.record(b"d/f", &stamp(9), &recipe(&[1, 4]), &oid).unwrap();
        assert_eq!(i.locate(&r.chunks()[2].id).unwrap(), None);
        assert!(i.locate(&r.chunks()[0].id).unwrap().is_some());
    }

    /// A sync has work exactly while something committed lazily is not yet durable: a
    /// session's end after a quiet moment's sync makes no commit of its own.
    #[test]
    fn a_sync_has_work_only_after_a_lazy_commit() {
        let t = tempfile::tempdir().unwrap();
        let i = PathIndex::open(&t.path().join("index.redb"), HashAlg::Blake3).unwrap();
        assert!(!i.unsynced(), "a new index has nothing to sync");
        let r = recipe(&[1, 2]);
        let oid = Oid(Id::hash(HashAlg::Blake3, b"f"));
        i.record(b"f", &stamp(1), &r, &oid).unwrap();
        assert!(i.unsynced());
        i.sync().unwrap();
        assert!(!i.unsynced());
        i.forget(&[r.chunks()[0].id]).unwrap();
        assert!(i.unsynced(), "a forget is lazy too");
        i.sync().unwrap();
        assert!(!i.unsynced());
        // Nothing to forget commits nothing.
        i.forget(&[]).unwrap();
        assert!(!i.unsynced());
    }
}
