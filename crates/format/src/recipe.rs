//! Recipes: the ordered chunk list of an object.

use std::io::Read;

use ferry_chunk::{ChunkReader, ChunkerSpec, MAX_CHUNK_LIMIT};

use crate::{varint, FormatError, HashAlg, Id, IdHasher, Oid, ID_BYTES};

pub(crate) const RECIPE_MAGIC: &[u8; 4] = b"FRCP";
pub(crate) const RECIPE_VERSION: u8 = 1;

/// One chunk of an object: its id and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChunkRef {
    pub id: Id,
    pub len: u32,
}

/// The ordered list of chunks an object is made of. All ids use one hash algorithm.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Recipe {
    alg: HashAlg,
    chunks: Vec<ChunkRef>,
}

impl Recipe {
    /// An empty recipe (the recipe of an empty object) for ids of `alg`.
    pub fn new(alg: HashAlg) -> Self {
        Recipe {
            alg,
            chunks: vec![],
        }
    }

    /// A recipe from chunks, which must all use `alg`.
    pub fn from_chunks(alg: HashAlg, chunks: Vec<ChunkRef>) -> Result<Self, FormatError> {
        let mut r = Recipe::new(alg);
        for c in chunks {
            r.push(c)?;
        }
        Ok(r)
    }

    /// Appends a chunk.
    pub fn push(&mut self, c: ChunkRef) -> Result<(), FormatError> {
        if c.id.alg() != self.alg {
            return Err(FormatError::MixedHashAlgs(
                self.alg.name(),
                c.id.alg().name(),
            ));
        }
        if c.len == 0 || c.len as usize > MAX_CHUNK_LIMIT {
            return Err(FormatError::BadChunkLength(c.len as u64));
        }
        self.chunks.push(c);
        Ok(())
    }

    pub fn alg(&self) -> HashAlg {
        self.alg
    }

    pub fn chunks(&self) -> &[ChunkRef] {
        &self.chunks
    }

    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// The object's length: the sum of its chunks' lengths.
    pub fn total_len(&self) -> u64 {
        self.chunks.iter().map(|c| c.len as u64).sum()
    }

    /// Each chunk with its offset in the object.
    pub fn with_offsets(&self) -> impl Iterator<Item = (u64, &ChunkRef)> {
        self.chunks.iter().scan(0u64, |off, c| {
            let o = *off;
            *off += c.len as u64;
            Some((o, c))
        })
    }

    /// The recipe's pages: content-defined runs of chunks ([`pages`]).
    pub fn pages(&self) -> Vec<&[ChunkRef]> {
        pages(&self.chunks)
    }

    /// BLAKE3 of [`encode`](Self::encode): what a receiver that rebuilt the recipe from pieces
    /// checks it against.
    pub fn check(&self) -> [u8; 32] {
        *blake3::hash(&self.encode()).as_bytes()
    }

    /// The binary encoding (`docs/formats.md`, "Recipe v1").
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.chunks.len() * (ID_BYTES + 3));
        out.extend_from_slice(RECIPE_MAGIC);
        out.push(RECIPE_VERSION);
        out.push(self.alg.tag());
        varint::put(&mut out, self.chunks.len() as u64);
        for c in &self.chunks {
            varint::put(&mut out, c.len as u64);
            out.extend_from_slice(c.id.digest());
        }
        out
    }

    /// Parses the binary encoding. Bounded: the entry count is checked against the input size
    /// before anything is allocated.
    pub fn decode(mut buf: &[u8]) -> Result<Recipe, FormatError> {
        const WHAT: &str = "recipe";
        if buf.len() < 6 {
            return Err(FormatError::Truncated { what: WHAT });
        }
        if &buf[..4] != RECIPE_MAGIC {
            return Err(FormatError::BadMagic { what: WHAT });
        }
        if buf[4] != RECIPE_VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: WHAT,
                version: buf[4],
                supported: RECIPE_VERSION,
            });
        }
        let alg = HashAlg::from_tag(buf[5])?;
        buf = &buf[6..];
        let count = varint::get(&mut buf, WHAT)?;
        // Each entry takes at least one length byte and a digest.
        if count > (buf.len() / (ID_BYTES + 1)) as u64 {
            return Err(FormatError::CountTooLarge {
                what: WHAT,
                count,
                available: buf.len(),
            });
        }
        let mut r = Recipe {
            alg,
            chunks: Vec::with_capacity(count as usize),
        };
        for _ in 0..count {
            let (id, len) = read_entry(&mut buf, alg, WHAT)?;
            r.chunks.push(ChunkRef { id, len });
        }
        if !buf.is_empty() {
            return Err(FormatError::Trailing {
                what: WHAT,
                extra: buf.len(),
            });
        }
        Ok(r)
    }
}

/// Reads one `varint length, digest` entry (shared by recipes and diffs).
pub(crate) fn read_entry(
    buf: &mut &[u8],
    alg: HashAlg,
    what: &'static str,
) -> Result<(Id, u32), FormatError> {
    let len = varint::get(buf, what)?;
    if len == 0 || len > MAX_CHUNK_LIMIT as u64 {
        return Err(FormatError::BadChunkLength(len));
    }
    if buf.len() < ID_BYTES {
        return Err(FormatError::Truncated { what });
    }
    let mut d = [0u8; ID_BYTES];
    d.copy_from_slice(&buf[..ID_BYTES]);
    *buf = &buf[ID_BYTES..];
    Ok((Id::from_parts(alg, d), len as u32))
}

/// Cuts `src` into chunks and hashes them, in one pass with bounded memory.
///
/// `on_chunk` sees every chunk with its bytes (to store or send it) in order; an error from it
/// stops the work. Returns the recipe and the OID of the whole stream.
pub fn chunk_object<R, E, F>(
    src: R,
    spec: &ChunkerSpec,
    alg: HashAlg,
    mut on_chunk: F,
) -> Result<(Recipe, Oid), E>
where
    R: Read,
    E: From<std::io::Error>,
    F: FnMut(&ChunkRef, &[u8]) -> Result<(), E>,
{
    let cutter = spec
        .try_build()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut reader = ChunkReader::new(src, cutter);
    let mut whole = IdHasher::new(alg);
    let mut recipe = Recipe::new(alg);
    while let Some(chunk) = reader.next_chunk()? {
        whole.update(chunk.data);
        let c = ChunkRef {
            id: Id::hash(alg, chunk.data),
            len: chunk.data.len() as u32,
        };
        on_chunk(&c, chunk.data)?;
        recipe.chunks.push(c);
    }
    Ok((recipe, Oid(whole.finish())))
}

/// Bytes of whole chunks handed from the cutting thread to the hashing thread at a time.
const BATCH_BYTES: usize = 1 << 20;

/// A run of whole chunks cut by the producer thread of [`chunk_object_parallel`].
struct Batch {
    data: Vec<u8>,
    lens: Vec<u32>,
    /// Set on the last batch.
    last: bool,
}

/// [`chunk_object`] on two threads: one reads and cuts; the caller's thread hashes each chunk and
/// the whole stream and runs `on_chunk`. Same result, same order of calls; memory stays
/// bounded (at most four 1 MiB batches in flight plus the reader's buffer).
pub fn chunk_object_parallel<R, E, F>(
    src: R,
    spec: &ChunkerSpec,
    alg: HashAlg,
    mut on_chunk: F,
) -> Result<(Recipe, Oid), E>
where
    R: Read + Send,
    E: From<std::io::Error>,
    F: FnMut(&ChunkRef, &[u8]) -> Result<(), E>,
{
    let cutter = spec
        .try_build()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<std::io::Result<Batch>>(2);
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let mut reader = ChunkReader::new(src, cutter);
            let new_batch = || Batch {
                data: Vec::with_capacity(BATCH_BYTES + MAX_CHUNK_LIMIT),
                lens: vec![],
                last: false,
            };
            let mut batch = new_batch();
            loop {
                match reader.next_chunk() {
                    Ok(Some(c)) => {
                        batch.data.extend_from_slice(c.data);
                        batch.lens.push(c.data.len() as u32);
                        if batch.data.len() >= BATCH_BYTES
                            && tx
                                .send(Ok(std::mem::replace(&mut batch, new_batch())))
                                .is_err()
                        {
                            return; // the consumer stopped
                        }
                    }
                    Ok(None) => {
                        batch.last = true;
                        let _ = tx.send(Ok(batch));
                        return;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                }
            }
        });
        let mut recipe = Recipe::new(alg);
        let mut whole = IdHasher::new(alg);
        for batch in rx {
            let batch = batch?;
            whole.update(&batch.data);
            let mut off = 0;
            for &len in &batch.lens {
                let data = &batch.data[off..off + len as usize];
                off += len as usize;
                let c = ChunkRef {
                    id: Id::hash(alg, data),
                    len,
                };
                on_chunk(&c, data)?;
                recipe.chunks.push(c);
            }
            if batch.last {
                return Ok((recipe, Oid(whole.finish())));
            }
        }
        Err(std::io::Error::other("chunking thread ended without a result").into())
    })
}

/// A page ends after a chunk whose digest's first two bytes (little endian) are 0 modulo this:
/// 32 chunks a page on average.
pub const PAGE_DIVISOR: u16 = 32;
/// Longest page, in chunks.
pub const PAGE_MAX: usize = 256;

/// Splits a chunk list into pages at content-defined boundaries (`docs/formats.md`, "Recipe
/// pages"): a page ends after a chunk whose digest starts with two bytes that are 0 modulo
/// [`PAGE_DIVISOR`], or after [`PAGE_MAX`] chunks. Boundaries depend on the chunks alone, so an
/// edit changes the pages around it and no others, and two sides holding versions of a file
/// agree on the unchanged pages without sending them.
pub fn pages(chunks: &[ChunkRef]) -> Vec<&[ChunkRef]> {
    let mut out = vec![];
    let mut start = 0;
    for (i, c) in chunks.iter().enumerate() {
        let d = c.id.digest();
        let ends = u16::from_le_bytes([d[0], d[1]]) % PAGE_DIVISOR == 0;
        if ends || i + 1 - start == PAGE_MAX {
            out.push(&chunks[start..=i]);
            start = i + 1;
        }
    }
    if start < chunks.len() {
        out.push(&chunks[start..]);
    }
    out
}

/// A page's key: the first 8 bytes (little endian) of BLAKE3 over, for each chunk, its length
/// as a varint and its digest. A short key names a page the peer holds; whatever is rebuilt
/// from keys is checked against the whole recipe's [`Recipe::check`] before use.
pub fn page_key(page: &[ChunkRef]) -> u64 {
    let mut h = blake3::Hasher::new();
    let mut buf = Vec::with_capacity(48);
    for c in page {
        buf.clear();
        varint::put(&mut buf, c.len as u64);
        buf.extend_from_slice(c.id.digest());
        h.update(&buf);
    }
    u64::from_le_bytes(h.finalize().as_bytes()[..8].try_into().unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn id(n: u8) -> Id {
        Id::from_parts(HashAlg::Blake3, [n; ID_BYTES])
    }

    /// The exact bytes of a two-chunk recipe, annotated (see docs/formats.md).
    #[test]
    fn encoding_is_pinned() {
        let r = Recipe::from_chunks(
            HashAlg::Blake3,
            vec![
                ChunkRef {
                    id: id(0xaa),
                    len: 8192,
                },
                ChunkRef {
                    id: id(0xbb),
                    len: 5,
                },
            ],
        )
        .unwrap();
        let mut want = vec![];
        want.extend_from_slice(b"FRCP"); // magic
        want.push(1); // version
        want.push(1); // hash algorithm: blake3
        want.push(2); // count
        want.extend_from_slice(&[0x80, 0x40]); // 8192 as LEB128
        want.extend_from_slice(&[0xaa; 32]);
        want.push(5);
        want.extend_from_slice(&[0xbb; 32]);
        assert_eq!(r.encode(), want);
        assert_eq!(Recipe::decode(&want).unwrap(), r);
    }

    #[test]
    fn hostile_input_is_rejected_without_allocation() {
        // A count of 2^63 in a 20-byte buffer must not reserve memory.
        let mut b = b"FRCP\x01\x01".to_vec();
        varint::put(&mut b, 1 << 63);
        assert!(matches!(
            Recipe::decode(&b),
            Err(FormatError::CountTooLarge { .. })
        ));
        assert!(matches!(
            Recipe::decode(b"FRCX\x01\x01\x00"),
            Err(FormatError::BadMagic { .. })
        ));
        assert!(matches!(
            Recipe::decode(b"FRCP\x09\x01\x00"),
            Err(FormatError::UnsupportedVersion { version: 9, .. })
        ));
        let mut b = b"FRCP\x01\x01\x01".to_vec();
        b.push(0); // zero-length chunk
        b.extend_from_slice(&[1; 32]);
        assert_eq!(Recipe::decode(&b), Err(FormatError::BadChunkLength(0)));
        let mut ok = Recipe::new(HashAlg::Blake3).encode();
        ok.push(0);
        assert!(matches!(
            Recipe::decode(&ok),
            Err(FormatError::Trailing { .. })
        ));
        let mixed = Recipe::new(HashAlg::Sha256).push(ChunkRef { id: id(1), len: 1 });
        assert!(matches!(mixed, Err(FormatError::MixedHashAlgs(..))));
    }

    #[test]
    fn chunk_object_matches_whole_hash_and_offsets() {
        let data: Vec<u8> = (0..500_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 9) as u8)
            .collect();
        let mut seen = vec![];
        let (r, oid) = chunk_object::<_, std::io::Error, _>(
            &data[..],
            &ChunkerSpec::default(),
            HashAlg::Blake3,
            |c, bytes| {
                assert!(c.id.matches(bytes));
                seen.push(bytes.len());
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(oid.id(), Id::hash(HashAlg::Blake3, &data));
        assert_eq!(r.total_len(), data.len() as u64);
        assert_eq!(
            seen,
            r.chunks()
                .iter()
                .map(|c| c.len as usize)
                .collect::<Vec<_>>()
        );
        for (off, c) in r.with_offsets() {
            assert!(c
                .id
                .matches(&data[off as usize..off as usize + c.len as usize]));
        }
    }

    #[test]
    fn parallel_chunking_gives_the_same_result_in_the_same_order() {
        let data: Vec<u8> = (0..3_000_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 9) as u8)
            .collect();
        let spec = ChunkerSpec::default();
        let mut order = vec![];
        let serial =
            chunk_object::<_, std::io::Error, _>(&data[..], &spec, HashAlg::Blake3, |_, _| Ok(()))
                .unwrap();
        let parallel = chunk_object_parallel::<_, std::io::Error, _>(
            &data[..],
            &spec,
            HashAlg::Blake3,
            |c, bytes| {
                assert!(c.id.matches(bytes));
                order.push(c.id);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(parallel, serial);
        assert_eq!(
            order,
            serial.0.chunks().iter().map(|c| c.id).collect::<Vec<_>>()
        );
        let empty = chunk_object_parallel::<_, std::io::Error, _>(
            &b""[..],
            &spec,
            HashAlg::Sha256,
            |_, _| Ok(()),
        )
        .unwrap();
        assert!(empty.0.is_empty());
        assert_eq!(empty.1.id(), Id::hash(HashAlg::Sha256, b""));
    }

    #[test]
    fn parallel_chunking_stops_on_the_first_error() {
        let data = vec![1u8; 5 << 20];
        let mut calls = 0;
        let r = chunk_object_parallel::<_, std::io::Error, _>(
            &data[..],
            &ChunkerSpec::fixed(4096),
            HashAlg::Blake3,
            |_, _| {
                calls += 1;
                if calls == 3 {
                    Err(std::io::Error::other("disk full"))
                } else {
                    Ok(())
                }
            },
        );
        assert_eq!(r.unwrap_err().to_string(), "disk full");
        assert_eq!(calls, 3);
    }

    #[test]
    fn pages_are_content_defined_and_keys_are_pinned() {
        let chunk = |i: u32| ChunkRef {
            id: Id::hash(HashAlg::Blake3, &i.to_le_bytes()),
            len: 1000 + i,
        };
        let old: Vec<ChunkRef> = (0..2000).map(chunk).collect();
        let old_pages = pages(&old);
        assert_eq!(old_pages.concat(), old);
        assert!(old_pages.iter().all(|p| p.len() <= PAGE_MAX));
        assert!(
            (40..=90).contains(&old_pages.len()),
            "{} pages",
            old_pages.len()
        );
        // Insert one chunk in the middle: every page but the one around it is unchanged.
        let mut new = old.clone();
        new.insert(1000, chunk(5000));
        let keys: std::collections::HashSet<u64> = old_pages.iter().map(|p| page_key(p)).collect();
        let changed = pages(&new)
            .iter()
            .filter(|p| !keys.contains(&page_key(p)))
            .count();
        assert!(changed <= 2, "{changed} pages changed");
        // The key's definition, pinned (recomputed independently with Python's blake3).
        assert_eq!(page_key(&old[..3]), 0x68e4_c5c4_d20e_bbdd);
    }
}
