//! The index: redb tables over the packs. Everything here can be rebuilt from the packs.
//!
//! | table | key | value |
//! |---|---|---|
//! | `chunks` | first 16 bytes of the digest | [`Loc`]: pack u32le, offset u32le, stored_len u32le, raw_len u32le |
//! | `objects` | OID digest `[u8; 32]` | seq u64le, pack u32le, total_len u64le, recipe (Recipe v1) |
//! | `tombstones` | OID digest `[u8; 32]` | seq u64le, pack u32le |
//! | `packs` | pack number u32 | (committed length u64, retired u8) |
//! | `damaged` | first 16 bytes of the digest | where and why, text |
//! | `meta` | name | bytes: `format` = "ferry-store-index 1", `hash` = tag, `next_seq` = u64le |

use std::path::Path;

use redb::TableDefinition;

use crate::StoreError;

/// Chunks are keyed by the first 128 bits of their digest: the index is a hint (every read
/// checks the full id in the record header and the hash of the bytes), and 16-byte keys keep it
/// under 64 bytes per chunk on disk. A prefix collision between two honest chunks is about as
/// likely as 2^-128 per pair; one made on purpose needs a 128-bit second preimage. Either way the
/// worst outcome is a chunk reported damaged, never wrong bytes.
pub(crate) const CHUNKS: TableDefinition<&[u8; 16], &[u8; 16]> = TableDefinition::new("chunks");
pub(crate) const OBJECTS: TableDefinition<&[u8; 32], &[u8]> = TableDefinition::new("objects");
pub(crate) const TOMBSTONES: TableDefinition<&[u8; 32], (u64, u32)> =
    TableDefinition::new("tombstones");
pub(crate) const PACKS: TableDefinition<u32, (u64, u8)> = TableDefinition::new("packs");
pub(crate) const DAMAGED: TableDefinition<&[u8; 16], &str> = TableDefinition::new("damaged");

/// The index key of a chunk.
pub(crate) fn ckey(id: &ferry_format::Id) -> [u8; 16] {
    let mut k = [0u8; 16];
    k.copy_from_slice(&id.digest()[..16]);
    k
}
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

pub(crate) const INDEX_FORMAT: &[u8] = b"ferry-store-index 1";

/// Where a chunk's record lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loc {
    pub pack: u32,
    pub offset: u32,
    pub stored_len: u32,
    pub raw_len: u32,
}

impl Loc {
    pub(crate) fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&self.pack.to_le_bytes());
        b[4..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..12].copy_from_slice(&self.stored_len.to_le_bytes());
        b[12..16].copy_from_slice(&self.raw_len.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8; 16]) -> Loc {
        let w = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        Loc {
            pack: w(0),
            offset: w(4),
            stored_len: w(8),
            raw_len: w(12),
        }
    }
}

/// An object's index entry.
pub(crate) struct ObjectEntry {
    pub seq: u64,
    pub pack: u32,
    pub total_len: u64,
    pub recipe: Vec<u8>,
}

impl ObjectEntry {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(20 + self.recipe.len());
        v.extend_from_slice(&self.seq.to_le_bytes());
        v.extend_from_slice(&self.pack.to_le_bytes());
        v.extend_from_slice(&self.total_len.to_le_bytes());
        v.extend_from_slice(&self.recipe);
        v
    }

    pub(crate) fn decode(b: &[u8]) -> Option<ObjectEntry> {
        if b.len() < 20 {
            return None;
        }
        Some(ObjectEntry {
            seq: u64::from_le_bytes(b[0..8].try_into().unwrap()),
            pack: u32::from_le_bytes(b[8..12].try_into().unwrap()),
            total_len: u64::from_le_bytes(b[12..20].try_into().unwrap()),
            recipe: b[20..].to_vec(),
        })
    }
}

/// Wraps any redb error with the index path.
/// Runs a read of the index, turning a panic inside redb (damage its pages' checks do not
/// catch: "entered unreachable code", a slice out of range) into an error that names the cure.
pub(crate) fn guard<T>(
    path: &Path,
    f: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let why = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic in the index".into());
        Err(StoreError::Index {
            path: path.to_path_buf(),
            msg: format!("damaged beyond reading ({why})"),
        })
    })
}

pub(crate) fn db_err<E: Into<redb::Error>>(path: &Path) -> impl FnOnce(E) -> StoreError + '_ {
    move |e| StoreError::Index {
        path: path.to_path_buf(),
        msg: e.into().to_string(),
    }
}

/// The index's database, closed inside a guard: redb writes its allocator state when it
/// closes, and on pages damaged where it does not look that panics; a store dropped after
/// working on a damaged index then ends without taking the program down with it.
pub(crate) struct Db(Option<redb::Database>);

impl Db {
    pub(crate) fn new(db: redb::Database) -> Db {
        Db(Some(db))
    }
}

impl std::ops::Deref for Db {
    type Target = redb::Database;
    fn deref(&self) -> &redb::Database {
        self.0.as_ref().expect("open until dropped")
    }
}

impl std::ops::DerefMut for Db {
    fn deref_mut(&mut self) -> &mut redb::Database {
        self.0.as_mut().expect("open until dropped")
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Some(db) = self.0.take() {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(db))).is_err() {
                tracing::error!("the store's index could not be closed cleanly: it is damaged; run `ferry store rebuild`");
            }
        }
    }
}
