//! The local cache of a bucket's index: which pack holds each chunk, and the recipes of the
//! objects seen. Everything here is rebuilt from the bucket (pack tails, `objects/` keys); it
//! only saves requests. One redb file per store and cache directory.
//!
//! | table | key | value |
//! |---|---|---|
//! | `chunks` | first 16 bytes of the digest | last 16 bytes of the digest, pack u32, offset u32, stored length u32, raw length u32 with the record kind in bit 31 |
//! | `packs` | pack number u32 | name (64 hex), size u64 |
//! | `pack_numbers` | name | pack number u32 |
//! | `objects` | OID digest | total length u64le ‖ recipe (Recipe v1) |
//! | `meta` | name | `next_pack` u32le |

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use ferry_format::{HashAlg, Id, Oid, Recipe};
use ferry_store::StoreError;
use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::pack::{Entry, ZSTD};

const CHUNKS: TableDefinition<&[u8; 16], &[u8; 32]> = TableDefinition::new("chunks");
const PACKS: TableDefinition<u32, (&str, u64)> = TableDefinition::new("packs");
const PACK_NUMBERS: TableDefinition<&str, u32> = TableDefinition::new("pack_numbers");
const OBJECTS: TableDefinition<&[u8; 32], &[u8]> = TableDefinition::new("objects");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// Where a chunk is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loc {
    pub pack: u32,
    pub entry: Entry,
}

pub struct Index {
    db: redb::Database,
    path: PathBuf,
    alg: HashAlg,
}

fn key(id: &Id) -> [u8; 16] {
    id.digest()[..16].try_into().unwrap()
}

fn encode(e: &Entry, pack: u32) -> [u8; 32] {
    let mut v = [0u8; 32];
    v[..16].copy_from_slice(&e.id.digest()[16..]);
    v[16..20].copy_from_slice(&pack.to_le_bytes());
    v[20..24].copy_from_slice(&(e.offset as u32).to_le_bytes());
    v[24..28].copy_from_slice(&e.stored_len.to_le_bytes());
    let kind = if e.kind == ZSTD { 1 << 31 } else { 0 };
    v[28..32].copy_from_slice(&(e.raw_len | kind).to_le_bytes());
    v
}

fn decode(alg: HashAlg, k: &[u8; 16], v: &[u8; 32]) -> Loc {
    let mut d = [0u8; 32];
    d[..16].copy_from_slice(k);
    d[16..].copy_from_slice(&v[..16]);
    let w = |i: usize| u32::from_le_bytes(v[i..i + 4].try_into().unwrap());
    let raw = w(28);
    Loc {
        pack: w(16),
        entry: Entry {
            id: Id::from_parts(alg, d),
            kind: (raw >> 31) as u8,
            offset: w(20) as u64,
            stored_len: w(24),
            raw_len: raw & !(1 << 31),
        },
    }
}

impl Index {
    pub fn open(dir: &Path, alg: HashAlg) -> Result<Index, StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
            op: "create",
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join("index.redb");
        let db = match redb::Database::create(&path) {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                return Err(StoreError::Locked {
                    path: dir.to_path_buf(),
                })
            }
            // A damaged cache is only a cache: start it again.
            Err(e) => {
                tracing::warn!("{}: {e}; rebuilding it from the bucket", path.display());
                let _ = std::fs::remove_file(&path);
                redb::Database::create(&path).map_err(|e| err(&path, e))?
            }
        };
        let ix = Index { db, path, alg };
        let w = ix.db.begin_write().map_err(|e| err(&ix.path, e))?;
        for t in [
            w.open_table(CHUNKS).map(|_| ()),
            w.open_table(OBJECTS).map(|_| ()),
        ] {
            t.map_err(|e| err(&ix.path, e))?;
        }
        w.open_table(PACKS).map_err(|e| err(&ix.path, e))?;
        w.open_table(PACK_NUMBERS).map_err(|e| err(&ix.path, e))?;
        w.open_table(META).map_err(|e| err(&ix.path, e))?;
        w.commit().map_err(|e| err(&ix.path, e))?;
        Ok(ix)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn read<T>(
        &self,
        f: impl FnOnce(&redb::ReadTransaction) -> Result<T, redb::Error>,
    ) -> Result<T, StoreError> {
        let r = self.db.begin_read().map_err(|e| err(&self.path, e))?;
        f(&r).map_err(|e| err(&self.path, e))
    }

    fn write(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> Result<(), StoreError> {
        let mut w = self.db.begin_write().map_err(|e| err(&self.path, e))?;
        // A cache: losing the last commits to a crash costs requests, not data.
        w.set_durability(redb::Durability::None)
            .map_err(|e| err(&self.path, e))?;
        f(&w).map_err(|e| err(&self.path, e))?;
        w.commit().map_err(|e| err(&self.path, e))
    }

    pub fn get(&self, id: &Id) -> Result<Option<Loc>, StoreError> {
        let alg = self.alg;
        self.read(|r| {
            let t = r.open_table(CHUNKS)?;
            let k = key(id);
            Ok(t.get(&k)?
                .map(|v| decode(alg, &k, v.value()))
                .filter(|l| l.entry.id == *id))
        })
    }

    /// A chunk whose digest starts with `prefix` (8 bytes, little-endian).
    pub fn find_prefix(&self, prefix: u64) -> Result<Option<Id>, StoreError> {
        let (mut lo, mut hi) = ([0u8; 16], [0xffu8; 16]);
        lo[..8].copy_from_slice(&prefix.to_le_bytes());
        hi[..8].copy_from_slice(&prefix.to_le_bytes());
        let alg = self.alg;
        self.read(|r| {
            let t = r.open_table(CHUNKS)?;
            let first = t.range::<&[u8; 16]>(&lo..=&hi)?.next().transpose()?;
            Ok(first.map(|(k, v)| decode(alg, k.value(), v.value()).entry.id))
        })
    }

    /// The name and size of pack `n`.
    pub fn pack(&self, n: u32) -> Result<Option<(String, u64)>, StoreError> {
        self.read(|r| {
            let t = r.open_table(PACKS)?;
            Ok(t.get(n)?.map(|v| {
                let (name, size) = v.value();
                (name.to_string(), size)
            }))
        })
    }

    /// Every pack known: name → (number, size).
    pub fn packs(&self) -> Result<HashMap<String, (u32, u64)>, StoreError> {
        self.read(|r| {
            let t = r.open_table(PACKS)?;
            let mut m = HashMap::new();
            for row in t.iter()? {
                let (k, v) = row?;
                let (name, size) = v.value();
                m.insert(name.to_string(), (k.value(), size));
            }
            Ok(m)
        })
    }

    /// Records pack `name` and its entries; returns its number. A chunk already indexed keeps
    /// its place unless that place is in a pack of `displace` (condemned by gc, or being
    /// replaced by a repack).
    pub fn add_pack(
        &self,
        name: &str,
        size: u64,
        entries: &[Entry],
        displace: &dyn Fn(u32) -> bool,
    ) -> Result<u32, StoreError> {
        Ok(self.add_packs(&[(name, size, entries)], displace)?[0])
    }

    /// [`add_pack`](Self::add_pack) for several packs, in order, in one transaction; returns
    /// their numbers.
    pub fn add_packs(
        &self,
        packs: &[(&str, u64, &[Entry])],
        displace: &dyn Fn(u32) -> bool,
    ) -> Result<Vec<u32>, StoreError> {
        let alg = self.alg;
        let mut numbers_out = Vec::with_capacity(packs.len());
        self.write(|w| {
            let mut numbers = w.open_table(PACK_NUMBERS)?;
            let mut meta = w.open_table(META)?;
            let mut packs_t = w.open_table(PACKS)?;
            let mut chunks = w.open_table(CHUNKS)?;
            for (name, size, entries) in packs {
                if let Some(n) = numbers.get(*name)? {
                    numbers_out.push(n.value());
                    continue;
                }
                let number = meta
                    .get("next_pack")?
                    .map(|v| u32::from_le_bytes(v.value().try_into().unwrap_or_default()))
                    .unwrap_or(0);
                meta.insert("next_pack", &(number + 1).to_le_bytes()[..])?;
                numbers.insert(*name, number)?;
                packs_t.insert(number, (*name, *size))?;
                for e in entries.iter() {
                    // The first copy of a chunk wins (its pack was there first), unless it is
                    // to go.
                    let k = key(&e.id);
                    let keep = chunks
                        .get(&k)?
                        .is_some_and(|v| !displace(decode(alg, &k, v.value()).pack));
                    if !keep {
                        chunks.insert(&k, &encode(e, number))?;
                    }
                }
                numbers_out.push(number);
            }
            Ok(())
        })?;
        Ok(numbers_out)
    }

    /// Forgets packs that are gone from the bucket, with every chunk they held (a chunk also
    /// held by a pack that stays is found again when that pack's tail is re-read: the caller
    /// re-adds the packs it keeps).
    pub fn drop_packs(&self, gone: &HashSet<u32>) -> Result<(), StoreError> {
        if gone.is_empty() {
            return Ok(());
        }
        let alg = self.alg;
        self.write(|w| {
            let mut chunks = w.open_table(CHUNKS)?;
            let mut dead = vec![];
            for row in chunks.iter()? {
                let (k, v) = row?;
                if gone.contains(&decode(alg, k.value(), v.value()).pack) {
                    dead.push(*k.value());
                }
            }
            for k in dead {
                chunks.remove(&k)?;
            }
            let mut packs = w.open_table(PACKS)?;
            let mut numbers = w.open_table(PACK_NUMBERS)?;
            for n in gone {
                if let Some(v) = packs.remove(*n)? {
                    numbers.remove(v.value().0)?;
                }
            }
            Ok(())
        })
    }

    /// Every chunk: (id, pack, stored length, raw length).
    pub fn chunks(&self) -> Result<Vec<Loc>, StoreError> {
        let alg = self.alg;
        self.read(|r| {
            let t = r.open_table(CHUNKS)?;
            let mut v = Vec::with_capacity(t.len()? as usize);
            for row in t.iter()? {
                let (k, val) = row?;
                v.push(decode(alg, k.value(), val.value()));
            }
            Ok(v)
        })
    }

    pub fn is_empty(&self) -> Result<bool, StoreError> {
        self.read(|r| Ok(r.open_table(CHUNKS)?.is_empty()?))
    }

    pub fn object(&self, oid: &Oid) -> Result<Option<Recipe>, StoreError> {
        let bytes = self.read(|r| {
            let t = r.open_table(OBJECTS)?;
            Ok(t.get(oid.id().digest())?.map(|v| v.value().to_vec()))
        })?;
        match bytes {
            Some(b) if b.len() >= 8 => Ok(Some(Recipe::decode(&b[8..])?)),
            _ => Ok(None),
        }
    }

    pub fn put_object(&self, oid: &Oid, recipe: &Recipe) -> Result<(), StoreError> {
        let mut v = recipe.total_len().to_le_bytes().to_vec();
        v.extend_from_slice(&recipe.encode());
        self.write(|w| {
            w.open_table(OBJECTS)?.insert(oid.id().digest(), &v[..])?;
            Ok(())
        })
    }

    pub fn remove_object(&self, oid: &Oid) -> Result<bool, StoreError> {
        let mut was = false;
        self.write(|w| {
            was = w.open_table(OBJECTS)?.remove(oid.id().digest())?.is_some();
            Ok(())
        })?;
        Ok(was)
    }

    /// Every object known: digest → total length.
    pub fn objects(&self) -> Result<HashMap<[u8; 32], u64>, StoreError> {
        self.read(|r| {
            let t = r.open_table(OBJECTS)?;
            let mut m = HashMap::new();
            for row in t.iter()? {
                let (k, v) = row?;
                let len = v
                    .value()
                    .get(..8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap()));
                m.insert(*k.value(), len.unwrap_or(0));
            }
            Ok(m)
        })
    }
}

fn err(path: &Path, e: impl Into<redb::Error>) -> StoreError {
    StoreError::Index {
        path: path.to_path_buf(),
        msg: e.into().to_string(),
    }
}
