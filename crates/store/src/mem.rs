//! An in-memory store: for tests, and as the reference every other backend is checked against.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use ferry_format::{HashAlg, Id, Oid, Recipe};

use crate::{ChunkStore, StoreError, StoreStats, VerifiedChunk};

#[derive(Default)]
struct Inner {
    chunks: HashMap<Id, Vec<u8>>,
    objects: HashMap<Oid, Recipe>,
    damaged: HashSet<Id>,
}

/// Chunks and objects in RAM. Verifies on read like every store, so tests can damage a chunk
/// with [`MemStore::damage`] and watch the error surface.
pub struct MemStore {
    alg: HashAlg,
    inner: Mutex<Inner>,
}

impl MemStore {
    pub fn new(alg: HashAlg) -> Self {
        MemStore {
            alg,
            inner: Mutex::default(),
        }
    }

    /// Flips a bit of a stored chunk (fault injection for tests). Returns whether it was there.
    pub fn damage(&self, id: &Id) -> bool {
        let mut g = self.inner.lock().unwrap();
        match g.chunks.get_mut(id) {
            Some(v) if !v.is_empty() => {
                v[0] ^= 1;
                true
            }
            _ => false,
        }
    }
}

impl ChunkStore for MemStore {
    fn hash_alg(&self) -> HashAlg {
        self.alg
    }

    fn contains(&self, id: &Id) -> Result<bool, StoreError> {
        Ok(self.inner.lock().unwrap().chunks.contains_key(id))
    }

    fn get(&self, id: &Id) -> Result<Option<Vec<u8>>, StoreError> {
        let mut g = self.inner.lock().unwrap();
        let Some(v) = g.chunks.get(id) else {
            return Ok(None);
        };
        if id.matches(v) {
            return Ok(Some(v.clone()));
        }
        g.damaged.insert(*id);
        Err(StoreError::Corrupt {
            id: *id,
            location: "memory store".into(),
            why: "bytes do not hash to the id".into(),
        })
    }

    fn find_prefix(&self, prefix: u64) -> Result<Option<Id>, StoreError> {
        let g = self.inner.lock().unwrap();
        Ok(g.chunks
            .keys()
            .find(|id| id.digest()[..8] == prefix.to_le_bytes())
            .copied())
    }

    fn put(&self, chunk: &VerifiedChunk<'_>) -> Result<bool, StoreError> {
        if chunk.id().alg() != self.alg {
            return Err(StoreError::WrongHashAlg {
                store: self.alg,
                got: chunk.id().alg(),
            });
        }
        let mut g = self.inner.lock().unwrap();
        if g.chunks
            .get(chunk.id())
            .is_some_and(|v| chunk.id().matches(v))
        {
            return Ok(false);
        }
        g.damaged.remove(chunk.id());
        g.chunks.insert(*chunk.id(), chunk.data().to_vec());
        Ok(true)
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn put_object(&self, oid: &Oid, recipe: &Recipe) -> Result<(), StoreError> {
        if recipe.alg() != self.alg {
            return Err(StoreError::WrongHashAlg {
                store: self.alg,
                got: recipe.alg(),
            });
        }
        self.inner
            .lock()
            .unwrap()
            .objects
            .insert(*oid, recipe.clone());
        Ok(())
    }

    fn object(&self, oid: &Oid) -> Result<Option<Recipe>, StoreError> {
        Ok(self.inner.lock().unwrap().objects.get(oid).cloned())
    }

    fn remove_object(&self, oid: &Oid) -> Result<bool, StoreError> {
        Ok(self.inner.lock().unwrap().objects.remove(oid).is_some())
    }

    fn objects(&self) -> Result<Vec<(Oid, u64)>, StoreError> {
        let g = self.inner.lock().unwrap();
        let mut v: Vec<_> = g.objects.iter().map(|(o, r)| (*o, r.total_len())).collect();
        v.sort();
        Ok(v)
    }

    fn stats(&self) -> Result<StoreStats, StoreError> {
        let g = self.inner.lock().unwrap();
        let bytes: u64 = g.chunks.values().map(|v| v.len() as u64).sum();
        Ok(StoreStats {
            chunks: g.chunks.len() as u64,
            chunk_bytes: bytes,
            stored_bytes: bytes,
            objects: g.objects.len() as u64,
            object_bytes: g.objects.values().map(|r| r.total_len()).sum(),
            damaged: g.damaged.len() as u64,
            ..StoreStats::default()
        })
    }
}
