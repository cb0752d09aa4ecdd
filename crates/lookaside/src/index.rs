//! A device's index (`docs/formats.md`, "Lookaside index v1"): every regular file under the
//! device's root with its identity when indexed (size, mtime, inode), its object id and its
//! chunks, as cut by one chunker. Read back, it says where each chunk lies; it is a hint, and
//! every use of it is checked (the file's identity when opened, the chunk's hash when read).

use std::collections::HashMap;

use ferry_chunk::{Algorithm, ChunkerSpec};
use ferry_format::{varint, ChunkRef, FormatError, HashAlg, Id, Recipe, ID_BYTES};

const MAGIC: &[u8; 4] = b"FLKA";
const VERSION: u8 = 1;
/// The longest path an index may name, in bytes.
pub const MAX_PATH: usize = 4096;
/// The largest index read: a bound on what a hostile device can make us allocate (the decoded
/// index takes about 2.5 times its size). 256 MiB is some 7 million chunks: 60 GB of files.
pub const MAX_INDEX_BYTES: u64 = 256 << 20;
/// What a file entry takes at least: path length and one byte, size, mtime, inode, object
/// digest, chunk count.
const MIN_FILE_BYTES: usize = 1 + 1 + 1 + 8 + 1 + ID_BYTES + 1;
/// What a chunk entry takes at least: its length and digest.
const MIN_CHUNK_BYTES: usize = 1 + ID_BYTES;
const WHAT: &str = "lookaside index";

/// The chunker an index was cut with, as the format records it: its algorithm, sizes, and for a
/// keyed chunker a fingerprint of the key (not the key). Chunks of a device are found by id
/// only when the index was cut with the chunker the fetch uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkerMark {
    pub algorithm: u8,
    pub min: u64,
    pub avg: u64,
    pub max: u64,
    pub key: Option<[u8; 32]>,
}

impl ChunkerMark {
    pub fn of(spec: &ChunkerSpec) -> Self {
        ChunkerMark {
            algorithm: spec.algorithm.tag(),
            min: spec.min as u64,
            avg: spec.avg as u64,
            max: spec.max as u64,
            key: spec
                .key
                .as_ref()
                .map(|k| blake3::derive_key("ferry lookaside index v1 chunker key", &k.0)),
        }
    }

    /// For humans: `fastcdc2020-v1:2048:8192:65536`.
    pub fn describe(&self) -> String {
        let name = Algorithm::from_tag(self.algorithm).map_or("unknown", |a| a.name());
        let keyed = if self.key.is_some() { "+keyed" } else { "" };
        format!("{name}:{}:{}:{}{keyed}", self.min, self.avg, self.max)
    }
}

/// One file of a device as indexed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexedFile {
    /// Relative to the device's root, `/`-separated.
    pub path: Vec<u8>,
    pub size: u64,
    pub mtime_ns: i64,
    pub ino: u64,
    /// The whole file's id.
    pub oid: Id,
    pub chunks: Vec<ChunkRef>,
}

/// See the module documentation.
#[derive(Debug, PartialEq, Eq)]
pub struct DeviceIndex {
    pub chunker: ChunkerMark,
    pub alg: HashAlg,
    pub files: Vec<IndexedFile>,
    /// Digest → (file, offset, length): the first place each chunk was seen.
    by_chunk: HashMap<[u8; ID_BYTES], (u32, u64, u32)>,
    /// Object digest → file.
    by_oid: HashMap<[u8; ID_BYTES], u32>,
    /// Check of the file's recipe (`Recipe::check`) → file.
    by_recipe: HashMap<[u8; 32], u32>,
}

/// Where an index says a chunk lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub file: u32,
    pub offset: u64,
    pub len: u32,
}

impl DeviceIndex {
    pub fn new(chunker: ChunkerMark, alg: HashAlg, files: Vec<IndexedFile>) -> Self {
        let mut by_chunk = HashMap::new();
        let mut by_oid = HashMap::new();
        let mut by_recipe = HashMap::new();
        for (f, file) in files.iter().enumerate() {
            let f = f as u32;
            by_oid.entry(*file.oid.digest()).or_insert(f);
            if let Ok(r) = Recipe::from_chunks(alg, file.chunks.clone()) {
                by_recipe.entry(r.check()).or_insert(f);
            }
            let mut offset = 0;
            for c in &file.chunks {
                by_chunk.entry(*c.id.digest()).or_insert((f, offset, c.len));
                offset += c.len as u64;
            }
        }
        DeviceIndex {
            chunker,
            alg,
            files,
            by_chunk,
            by_oid,
            by_recipe,
        }
    }

    /// Where chunk `id` lies, if the index has it.
    pub fn chunk(&self, id: &Id) -> Option<Location> {
        if id.alg() != self.alg {
            return None;
        }
        let &(file, offset, len) = self.by_chunk.get(id.digest())?;
        Some(Location { file, offset, len })
    }

    /// The file whose whole content is object `oid`, if the index has one.
    pub fn object(&self, oid: &Id) -> Option<u32> {
        if oid.alg() != self.alg {
            return None;
        }
        self.by_oid.get(oid.digest()).copied()
    }

    /// The file whose recipe has check `check` (`Recipe::check`): the same content.
    pub fn recipe(&self, check: &[u8; 32]) -> Option<u32> {
        self.by_recipe.get(check).copied()
    }

    /// Distinct chunks, and the bytes of the files.
    pub fn chunks(&self) -> usize {
        self.by_chunk.len()
    }

    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// The format's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.files.len() * 64 + self.chunks() * 34);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(self.alg.tag());
        let m = &self.chunker;
        out.push(m.algorithm);
        varint::put(&mut out, m.min);
        varint::put(&mut out, m.avg);
        varint::put(&mut out, m.max);
        match &m.key {
            None => out.push(0),
            Some(k) => {
                out.push(1);
                out.extend_from_slice(k);
            }
        }
        varint::put(&mut out, self.files.len() as u64);
        for f in &self.files {
            varint::put(&mut out, f.path.len() as u64);
            out.extend_from_slice(&f.path);
            varint::put(&mut out, f.size);
            out.extend_from_slice(&f.mtime_ns.to_le_bytes());
            varint::put(&mut out, f.ino);
            out.extend_from_slice(f.oid.digest());
            varint::put(&mut out, f.chunks.len() as u64);
            for c in &f.chunks {
                varint::put(&mut out, c.len as u64);
                out.extend_from_slice(c.id.digest());
            }
        }
        let check = blake3::hash(&out);
        out.extend_from_slice(check.as_bytes());
        out
    }

    /// Reads the format's bytes, checking every length against what remains before allocating.
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        if bytes.len() < MAGIC.len() + 2 + ID_BYTES {
            return Err(FormatError::Truncated { what: WHAT });
        }
        if &bytes[..4] != MAGIC {
            return Err(FormatError::BadMagic { what: WHAT });
        }
        if bytes[4] != VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: WHAT,
                version: bytes[4],
                supported: VERSION,
            });
        }
        let (body, check) = bytes.split_at(bytes.len() - ID_BYTES);
        if blake3::hash(body).as_bytes() != check {
            return Err(invalid("its check does not match (damaged or cut short)"));
        }
        let alg = HashAlg::from_tag(body[5])?;
        let mut buf = &body[6..];
        let algorithm = take(&mut buf, 1)?[0];
        let min = varint::get(&mut buf, WHAT)?;
        let avg = varint::get(&mut buf, WHAT)?;
        let max = varint::get(&mut buf, WHAT)?;
        let key = match take(&mut buf, 1)?[0] {
            0 => None,
            1 => Some(digest(&mut buf)?),
            _ => return Err(invalid("bad key flag")),
        };
        let chunker = ChunkerMark {
            algorithm,
            min,
            avg,
            max,
            key,
        };
        let n = count(&mut buf, MIN_FILE_BYTES)?;
        let mut files = Vec::with_capacity(n);
        for _ in 0..n {
            files.push(file(&mut buf, alg)?);
        }
        if !buf.is_empty() {
            return Err(FormatError::Trailing {
                what: WHAT,
                extra: buf.len(),
            });
        }
        Ok(DeviceIndex::new(chunker, alg, files))
    }
}

fn file(buf: &mut &[u8], alg: HashAlg) -> Result<IndexedFile, FormatError> {
    let len = varint::get(buf, WHAT)?;
    if len == 0 || len > MAX_PATH as u64 {
        return Err(invalid("a path is empty or too long"));
    }
    let path = take(buf, len as usize)?.to_vec();
    if !valid_path(&path) {
        return Err(invalid("a path is not relative or climbs out"));
    }
    let size = varint::get(buf, WHAT)?;
    let mtime_ns = i64::from_le_bytes(take(buf, 8)?.try_into().expect("8 bytes"));
    let ino = varint::get(buf, WHAT)?;
    let oid = Id::from_parts(alg, digest(buf)?);
    let n = count(buf, MIN_CHUNK_BYTES)?;
    let mut chunks = Vec::with_capacity(n);
    let mut total: u64 = 0;
    for _ in 0..n {
        let len = varint::get(buf, WHAT)?;
        if len == 0 || len > ferry_chunk::MAX_CHUNK_LIMIT as u64 {
            return Err(FormatError::BadChunkLength(len));
        }
        total += len;
        chunks.push(ChunkRef {
            id: Id::from_parts(alg, digest(buf)?),
            len: len as u32,
        });
    }
    if total != size {
        return Err(invalid("a file's chunks do not add up to its size"));
    }
    Ok(IndexedFile {
        path,
        size,
        mtime_ns,
        ino,
        oid,
        chunks,
    })
}

/// A path an index may name: relative, `/`-separated, no empty, `.` or `..` component, no NUL.
pub fn valid_path(p: &[u8]) -> bool {
    !p.is_empty()
        && !p.contains(&0)
        && p.split(|&b| b == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b"..")
}

fn invalid(why: &'static str) -> FormatError {
    FormatError::Invalid { what: WHAT, why }
}

fn take<'a>(buf: &mut &'a [u8], n: usize) -> Result<&'a [u8], FormatError> {
    if buf.len() < n {
        return Err(FormatError::Truncated { what: WHAT });
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

fn digest(buf: &mut &[u8]) -> Result<[u8; ID_BYTES], FormatError> {
    Ok(take(buf, ID_BYTES)?.try_into().expect("32 bytes"))
}

/// A count of entries of at least `each` bytes, checked against the bytes left.
fn count(buf: &mut &[u8], each: usize) -> Result<usize, FormatError> {
    let n = varint::get(buf, WHAT)?;
    if n > (buf.len() / each) as u64 {
        return Err(FormatError::CountTooLarge {
            what: WHAT,
            count: n,
            available: buf.len(),
        });
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> DeviceIndex {
        let id = |b: u8| Id::from_parts(HashAlg::Blake3, [b; 32]);
        DeviceIndex::new(
            ChunkerMark::of(&ChunkerSpec::default()),
            HashAlg::Blake3,
            vec![IndexedFile {
                path: b"a/b".to_vec(),
                size: 8197,
                mtime_ns: 1,
                ino: 2,
                oid: id(0xcc),
                chunks: vec![
                    ChunkRef {
                        id: id(0xaa),
                        len: 8192,
                    },
                    ChunkRef {
                        id: id(0xbb),
                        len: 5,
                    },
                ],
            }],
        )
    }

    #[test]
    fn encoding_is_pinned() {
        let bytes = sample().encode();
        let mut want = vec![];
        want.extend_from_slice(b"FLKA\x01\x01\x02\x80\x10\x80\x40\x80\x80\x04\x00\x01");
        want.extend_from_slice(b"\x03a/b\x85\x40");
        want.extend_from_slice(&1i64.to_le_bytes());
        want.push(2);
        want.extend_from_slice(&[0xcc; 32]);
        want.extend_from_slice(b"\x02\x80\x40");
        want.extend_from_slice(&[0xaa; 32]);
        want.push(5);
        want.extend_from_slice(&[0xbb; 32]);
        want.extend_from_slice(blake3::hash(&want).as_bytes());
        assert_eq!(bytes, want);
        let back = DeviceIndex::decode(&bytes).unwrap();
        assert_eq!(back, sample());
        let at = back
            .chunk(&Id::from_parts(HashAlg::Blake3, [0xbb; 32]))
            .unwrap();
        assert_eq!((at.file, at.offset, at.len), (0, 8192, 5));
        assert_eq!(
            back.object(&Id::from_parts(HashAlg::Blake3, [0xcc; 32])),
            Some(0)
        );
    }

    #[test]
    fn damage_is_refused() {
        let bytes = sample().encode();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x01;
            assert!(DeviceIndex::decode(&b).is_err(), "flip at {i}");
        }
        for n in 0..bytes.len() {
            assert!(DeviceIndex::decode(&bytes[..n]).is_err(), "cut at {n}");
        }
    }

    /// A valid check over hostile contents (a device can write its own index): lengths and
    /// counts are bounded by what remains, paths cannot climb.
    #[test]
    fn hostile_contents_are_refused() {
        let seal = |mut body: Vec<u8>| {
            let c = blake3::hash(&body);
            body.extend_from_slice(c.as_bytes());
            body
        };
        let head = b"FLKA\x01\x01\x02\x80\x10\x80\x40\x80\x80\x04\x00".to_vec();
        let mut huge = head.clone();
        huge.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert!(matches!(
            DeviceIndex::decode(&seal(huge)),
            Err(FormatError::CountTooLarge { .. })
        ));
        for path in [&b"../x"[..], b"/etc/passwd", b"a//b", b"a/./b", b"a\0b"] {
            let mut i = sample();
            i.files[0].path = path.to_vec();
            assert!(DeviceIndex::decode(&i.encode()).is_err(), "{path:?}");
        }
        let mut i = sample();
        i.files[0].size += 1;
        assert!(DeviceIndex::decode(&i.encode()).is_err());
    }
}
