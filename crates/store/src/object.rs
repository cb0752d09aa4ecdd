//! Whole objects in and out of a store.

use std::io::{Read, Write};

use ferry_chunk::ChunkerSpec;
use ferry_format::{chunk_object_parallel, IdHasher, Oid, Recipe};

use crate::{ChunkStore, StoreError, VerifiedChunk};

/// What storing an object cost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stored {
    /// Chunks the store did not have.
    pub new_chunks: u64,
    /// Their bytes.
    pub new_bytes: u64,
}

/// Chunks `src` (cutting on a second thread), puts every chunk the store lacks, records the
/// object and flushes.
/// `progress` is told the bytes consumed after each chunk.
pub fn store_object<S: ChunkStore + ?Sized>(
    store: &S,
    src: impl Read + Send,
    spec: &ChunkerSpec,
    mut progress: impl FnMut(u64),
) -> Result<(Oid, Recipe, Stored), StoreError> {
    let mut stored = Stored::default();
    let (recipe, oid) = chunk_object_parallel(src, spec, store.hash_alg(), |c, data| {
        if store.put(&VerifiedChunk::assume_verified(c.id, data))? {
            stored.new_chunks += 1;
            stored.new_bytes += data.len() as u64;
        }
        progress(data.len() as u64);
        Ok::<_, StoreError>(())
    })?;
    store.put_object(&oid, &recipe)?;
    store.flush()?;
    Ok((oid, recipe, stored))
}

/// Errors reading the caller's input stream (the caller knows its name and adds it).
impl From<std::io::Error> for StoreError {
    fn from(source: std::io::Error) -> Self {
        StoreError::Io {
            op: "read",
            path: "input".into(),
            source,
        }
    }
}

/// Writes object `oid` to `out`, every chunk verified on read and the whole checked against the
/// OID at the end. Returns the bytes written, or `None` if the store has no such object.
pub fn read_object<S: ChunkStore + ?Sized>(
    store: &S,
    oid: &Oid,
    out: impl Write,
) -> Result<Option<u64>, StoreError> {
    let Some(recipe) = store.object(oid)? else {
        return Ok(None);
    };
    read_recipe(store, oid, &recipe, out).map(Some)
}

/// How far ahead of the reader [`read_recipe`] asks the store for chunks.
const PREFETCH_BYTES: u64 = 32 << 20;

/// How many bytes of chunks the fetching thread hands over at once.
const BATCH_BYTES: usize = 1 << 20;

/// Objects of more chunks than this are read on two threads.
const PIPELINE_CHUNKS: usize = 64;

/// Writes the chunks `recipe` lists to `out`, every chunk verified on read, and checks that
/// they make object `oid` (an error once they do not: what was written is then not it).
/// Returns the bytes written.
///
/// A large object is read on two threads: one gets the chunks from the store (each verified
/// there), the caller's hashes the whole and writes it.
pub fn read_recipe<S: ChunkStore + ?Sized>(
    store: &S,
    oid: &Oid,
    recipe: &Recipe,
    mut out: impl Write,
) -> Result<u64, StoreError> {
    let mut whole = IdHasher::new(oid.id().alg());
    let mut n = 0u64;
    let mut take = |data: Vec<u8>| -> Result<(), StoreError> {
        whole.update(&data);
        out.write_all(&data)
            .map_err(StoreError::io("write", "output"))?;
        n += data.len() as u64;
        Ok(())
    };
    if recipe.len() <= PIPELINE_CHUNKS {
        let mut failed = None;
        fetch_chunks(store, oid, recipe, |d| match take(d) {
            Ok(()) => true,
            Err(e) => {
                failed = Some(e);
                false
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
    } else {
        std::thread::scope(|s| {
            // Chunks go across in batches of about a MiB: a wake-up per chunk would cost more
            // than the chunk.
            let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Vec<u8>>>(16);
            let fetcher = s.spawn(move || {
                let mut batch = vec![];
                let mut bytes = 0;
                fetch_chunks(store, oid, recipe, |d| {
                    bytes += d.len();
                    batch.push(d);
                    if bytes < BATCH_BYTES {
                        return true;
                    }
                    bytes = 0;
                    tx.send(std::mem::take(&mut batch)).is_ok()
                })?;
                let _ = tx.send(batch);
                Ok::<(), StoreError>(())
            });
            for batch in rx {
                for d in batch {
                    take(d)?;
                }
            }
            fetcher.join().expect("the chunk fetcher does not panic")
        })?;
    }
    let got = whole.finish();
    if got != oid.id() {
        return Err(StoreError::Corrupt {
            id: oid.id(),
            location: "reassembled object".into(),
            why: format!("content hashes to {got}"),
        });
    }
    Ok(n)
}

/// Gets `recipe`'s chunks in order, asking the store for those ahead, and hands each to
/// `give` until it says stop.
fn fetch_chunks<S: ChunkStore + ?Sized>(
    store: &S,
    oid: &Oid,
    recipe: &Recipe,
    mut give: impl FnMut(Vec<u8>) -> bool,
) -> Result<(), StoreError> {
    let chunks = recipe.chunks();
    // Chunks asked for ahead: up to PREFETCH_BYTES past the one being read.
    let (mut ahead, mut ahead_bytes, mut read_bytes) = (0usize, 0u64, 0u64);
    for c in chunks {
        if ahead_bytes < read_bytes + PREFETCH_BYTES / 2 && ahead < chunks.len() {
            let from = ahead;
            while ahead < chunks.len() && ahead_bytes < read_bytes + PREFETCH_BYTES {
                ahead_bytes += chunks[ahead].len as u64;
                ahead += 1;
            }
            let ids: Vec<_> = chunks[from..ahead].iter().map(|c| c.id).collect();
            store.prefetch(&ids);
        }
        read_bytes += c.len as u64;
        let data = store.get(&c.id)?.ok_or_else(|| StoreError::Corrupt {
            id: c.id,
            location: format!("object {oid}"),
            why: "chunk is missing from the store".into(),
        })?;
        if !give(data) {
            break;
        }
    }
    Ok(())
}
