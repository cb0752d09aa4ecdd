//! Content-addressed chunk stores.
//!
//! Every layer above keeps chunks through the [`ChunkStore`] trait, so the transfer engine, the
//! file server and the client cache neither know nor care whether chunks live in pack files on
//! a local disk ([`LocalStore`]), in memory ([`MemStore`], for tests), or (later) on a portable
//! device or an S3 bucket.
//!
//! The contract every backend keeps (and `tests/it/conformance.rs` checks):
//!
//! - **Verify on read.** [`ChunkStore::get`] recomputes the hash of what it read; bytes that do
//!   not match their id are never returned: the caller gets [`StoreError::Corrupt`] and the
//!   store records the damage.
//! - **Only verified chunks go in.** [`ChunkStore::put`] takes a [`VerifiedChunk`], which can
//!   only be made by hashing bytes (or checking them against an id).
//! - **Durable after flush.** What [`ChunkStore::flush`] acknowledged survives a crash; what was
//!   put after the last flush may be lost, but never half-present or wrong.
//! - **Idempotent.** Putting a chunk twice stores it once.
//!
//! ```
//! use ferry_store::{ChunkStore, MemStore, VerifiedChunk};
//! use ferry_format::HashAlg;
//!
//! let store = MemStore::new(HashAlg::Blake3);
//! let chunk = VerifiedChunk::hash(HashAlg::Blake3, b"hello");
//! assert!(store.put(&chunk).unwrap());
//! assert_eq!(store.get(chunk.id()).unwrap().as_deref(), Some(&b"hello"[..]));
//! ```

mod cache;
mod error;
mod local;
mod mem;
mod object;
mod paths;

use ferry_format::{HashAlg, Id, Oid, Recipe};

pub use error::StoreError;
pub use local::{GcReport, LocalStore, Options, TrimReport, VerifyReport};
pub use mem::MemStore;
pub use object::{read_object, read_recipe, store_object};
pub use paths::{PathIndex, Stamp};

/// `raw` compressed with zstd at `level` when that saves at least 1/32, else `None`: what every
/// backend stores. On each thread, after a record that did not compress the next few are not
/// tried (a run of random data or media costs no compressor time), and one compressor context
/// is reused.
pub fn compress_if_it_pays(raw: &[u8], level: i32) -> Option<Vec<u8>> {
    if level <= 0 {
        return None;
    }
    local::pack::compress(raw, level)
}

/// A chunk whose id is known to be the hash of its bytes.
#[derive(Clone, Copy, Debug)]
pub struct VerifiedChunk<'a> {
    id: Id,
    data: &'a [u8],
}

impl<'a> VerifiedChunk<'a> {
    /// Hashes `data`.
    pub fn hash(alg: HashAlg, data: &'a [u8]) -> Self {
        VerifiedChunk {
            id: Id::hash(alg, data),
            data,
        }
    }

    /// Checks `data` against `id`: the step every chunk from outside (a peer, a lookaside
    /// device, a cached hint) passes before it is used.
    pub fn check(id: Id, data: &'a [u8]) -> Result<Self, StoreError> {
        if id.matches(data) {
            Ok(VerifiedChunk { id, data })
        } else {
            Err(StoreError::Corrupt {
                id,
                location: "supplied chunk".into(),
                why: "bytes do not hash to the id".into(),
            })
        }
    }

    /// For an `id` this process has just computed from `data` (as [`ferry_format::chunk_object`]
    /// does), to avoid hashing twice.
    pub fn assume_verified(id: Id, data: &'a [u8]) -> Self {
        debug_assert!(id.matches(data));
        VerifiedChunk { id, data }
    }

    pub fn id(&self) -> &Id {
        &self.id
    }

    pub fn data(&self) -> &'a [u8] {
        self.data
    }
}

/// Counts a store reports about itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Distinct chunks.
    pub chunks: u64,
    /// Their total size before compression.
    pub chunk_bytes: u64,
    /// What they occupy (compressed, with record headers).
    pub stored_bytes: u64,
    /// Objects (recipes) kept as roots.
    pub objects: u64,
    /// The total size of those objects: what a copy without deduplication would hold.
    pub object_bytes: u64,
    /// Pack files (0 for stores without packs).
    pub packs: u64,
    /// The size of the on-disk index (0 for stores without one).
    pub index_bytes: u64,
    /// Chunks found damaged so far.
    pub damaged: u64,
}

impl StoreStats {
    /// Logical object bytes per unique chunk byte (1.0 when nothing deduplicates).
    pub fn dedup_ratio(&self) -> f64 {
        if self.chunk_bytes == 0 {
            1.0
        } else {
            self.object_bytes as f64 / self.chunk_bytes as f64
        }
    }
}

/// A content-addressed chunk store. See the crate documentation for the contract.
///
/// Methods take `&self`: stores are shared between threads and synchronise inside.
pub trait ChunkStore: Send + Sync {
    /// The hash algorithm of every id in this store.
    fn hash_alg(&self) -> HashAlg;

    /// Whether the store holds `id`. A hint: the chunk may still turn out damaged on read.
    fn contains(&self, id: &Id) -> Result<bool, StoreError>;

    /// The chunk's bytes, verified against `id`; `None` if absent.
    fn get(&self, id: &Id) -> Result<Option<Vec<u8>>, StoreError>;

    /// Like [`get`](Self::get), for a bulk read that will not come back soon (a large file
    /// assembled once): a store that keeps chunks in RAM does not keep this one (a copy of
    /// every chunk of a 1 GiB file, each pushing out another, cost 10 % of its assembly).
    fn get_passing(&self, id: &Id) -> Result<Option<Vec<u8>>, StoreError> {
        self.get(id)
    }

    /// The id of a chunk the store holds whose digest begins with the 8 bytes `prefix`
    /// (little-endian, as a protocol's short id), if any: any one of them when several do. A
    /// hint like [`contains`](Self::contains); the chunk itself comes from [`get`](Self::get),
    /// verified. Stores that cannot look up by prefix answer `None`.
    fn find_prefix(&self, prefix: u64) -> Result<Option<Id>, StoreError> {
        let _ = prefix;
        Ok(None)
    }

    /// A hint that these chunks will be read soon, in this order: a store whose reads cost a
    /// round trip (S3) starts fetching them. Others ignore it.
    fn prefetch(&self, ids: &[Id]) {
        let _ = ids;
    }

    /// A hint that what is put from now on arrives faster than compressing it would go (a
    /// transfer over a fast link, where a compressor on the receiving end would be its
    /// bottleneck): a store that compresses what it keeps keeps it as it is instead (`false`:
    /// compressing again). Others ignore it.
    fn prefer_speed(&self, yes: bool) {
        let _ = yes;
    }

    /// Stores a chunk; returns whether it was new. May be called any number of times with the
    /// same chunk.
    fn put(&self, chunk: &VerifiedChunk<'_>) -> Result<bool, StoreError>;

    /// Makes everything put so far durable.
    fn flush(&self) -> Result<(), StoreError>;

    /// Records `recipe` as the object `oid`, a root that keeps its chunks alive. Durable after
    /// the next flush.
    fn put_object(&self, oid: &Oid, recipe: &Recipe) -> Result<(), StoreError>;

    /// The recipe of object `oid`.
    fn object(&self, oid: &Oid) -> Result<Option<Recipe>, StoreError>;

    /// Forgets object `oid` (its chunks stay until garbage collection). Returns whether it existed.
    fn remove_object(&self, oid: &Oid) -> Result<bool, StoreError>;

    /// Every object with its size.
    fn objects(&self) -> Result<Vec<(Oid, u64)>, StoreError>;

    /// Counts (may scan the whole index).
    fn stats(&self) -> Result<StoreStats, StoreError>;

    /// Whether the store holds no chunk at all (stores override the scan with something cheap).
    fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.stats()?.chunks == 0)
    }
}

/// Page cache of each redb index. redb's default is 1 GiB per database, a ceiling that a
/// long transfer reaches (every chunk looked up touches its leaf pages): a 10 GiB upload held
/// ~190 MB of index pages on the server. The interior levels of a million-chunk index fit in a
/// few MiB; the kernel's page cache keeps the rest of the file warm anyway.
const INDEX_CACHE_BYTES: usize = 16 << 20;

/// How every redb index of the store is opened.
pub(crate) fn index_builder() -> redb::Builder {
    let mut b = redb::Builder::new();
    b.set_cache_size(INDEX_CACHE_BYTES);
    b
}
