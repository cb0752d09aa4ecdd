//! The S3 pack: an immutable object of several MiB holding chunks back to back, with its own
//! table of contents at the end, so that a store's index is rebuilt from a ranged GET of each
//! pack's tail. Named by the BLAKE3 of its bytes (`packs/<64 hex>`), so a pack is never
//! overwritten and a second writer of the same pack writes the same bytes.
//!
//! Layout (docs/formats.md, "S3 pack v1"), integers little-endian:
//!
//! | bytes | what |
//! |---|---|
//! | 8 | magic `FERRYS3P` |
//! | 1 | version, 1 |
//! | 1 | hash algorithm tag of every id |
//! | 2 | zero |
//! | … | each record's stored bytes, in entry order |
//! | 42 × N | entries: tagged id (33), kind (1: 0 raw, 1 zstd), stored length u32, raw length u32 |
//! | 4 | N |
//! | 4 | 42 × N, the entries' length |
//! | 16 | the first 16 bytes of BLAKE3(the 12 header bytes ‖ the entries) |
//! | 8 | magic `FERRYS3E` |
//!
//! A record's offset is the sum of the stored lengths before it, from byte 12. Every count is
//! checked against the pack's size before anything is allocated; the entries' check catches a
//! damaged or foreign tail; each chunk is still verified against its id on every read.

use ferry_format::{HashAlg, Id};

use crate::S3Error;

pub const MAGIC: &[u8; 8] = b"FERRYS3P";
pub const END_MAGIC: &[u8; 8] = b"FERRYS3E";
pub const VERSION: u8 = 1;
pub const HEADER: usize = 12;
pub const ENTRY: usize = 42;
pub const FOOTER: usize = 32;
/// Kinds of record.
pub const RAW: u8 = 0;
pub const ZSTD: u8 = 1;

/// One chunk's place in a pack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub id: Id,
    pub kind: u8,
    /// From the start of the pack.
    pub offset: u64,
    pub stored_len: u32,
    pub raw_len: u32,
}

fn header(alg: HashAlg) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(MAGIC);
    h[8] = VERSION;
    h[9] = alg.tag();
    h
}

fn check(header: &[u8], entries: &[u8]) -> [u8; 16] {
    let mut h = blake3::Hasher::new();
    h.update(header);
    h.update(entries);
    let mut c = [0u8; 16];
    c.copy_from_slice(&h.finalize().as_bytes()[..16]);
    c
}

/// Builds a pack from chunks: each compressed with zstd when that pays
/// ([`ferry_store::compress_if_it_pays`]).
pub struct Builder {
    bytes: Vec<u8>,
    entries: Vec<u8>,
    n: u32,
    level: i32,
}

impl Builder {
    pub fn new(alg: HashAlg, capacity: usize, level: i32) -> Builder {
        let mut bytes = Vec::with_capacity(capacity + capacity / 64 + 4096);
        bytes.extend_from_slice(&header(alg));
        Builder {
            bytes,
            entries: vec![],
            n: 0,
            level,
        }
    }

    pub fn add(&mut self, id: &Id, data: &[u8]) -> Result<(), S3Error> {
        let raw_len = u32::try_from(data.len())
            .map_err(|_| S3Error::Config(format!("chunk {id} is over 4 GiB")))?;
        let packed = if data.len() >= 64 {
            ferry_store::compress_if_it_pays(data, self.level)
        } else {
            None
        };
        let (kind, body) = match &packed {
            Some(c) => (ZSTD, &c[..]),
            None => (RAW, data),
        };
        self.bytes.extend_from_slice(body);
        self.entries.extend_from_slice(&id.to_bytes());
        self.entries.push(kind);
        self.entries
            .extend_from_slice(&(body.len() as u32).to_le_bytes());
        self.entries.extend_from_slice(&raw_len.to_le_bytes());
        self.n += 1;
        Ok(())
    }

    /// The finished pack and its name (the hex BLAKE3 of its bytes).
    pub fn finish(mut self) -> (Vec<u8>, String) {
        let c = check(&self.bytes[..HEADER], &self.entries);
        self.bytes.extend_from_slice(&self.entries);
        self.bytes.extend_from_slice(&self.n.to_le_bytes());
        self.bytes
            .extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(&c);
        self.bytes.extend_from_slice(END_MAGIC);
        let name = blake3::hash(&self.bytes).to_hex().to_string();
        (self.bytes, name)
    }
}

/// How many tail bytes to fetch first: the footer and the entries of a pack of ~1,500 chunks.
pub const FIRST_TAIL: u64 = 64 << 10;

/// How many tail bytes hold the entries, from the footer (the last 32 bytes of `tail`).
pub fn tail_len(tail: &[u8], pack_size: u64) -> Result<u64, S3Error> {
    let bad = |why: &str| S3Error::Damaged(format!("pack tail: {why}"));
    if tail.len() < FOOTER || pack_size < (HEADER + FOOTER) as u64 {
        return Err(bad("shorter than a footer"));
    }
    let f = &tail[tail.len() - FOOTER..];
    if &f[24..32] != END_MAGIC {
        return Err(bad("no end magic (not a Ferry pack, or cut)"));
    }
    let n = u32::from_le_bytes(f[0..4].try_into().unwrap()) as u64;
    let len = u32::from_le_bytes(f[4..8].try_into().unwrap()) as u64;
    if len != n * ENTRY as u64 || len + (HEADER + FOOTER) as u64 > pack_size {
        return Err(bad("the entry count does not fit the pack"));
    }
    Ok(len + FOOTER as u64)
}

/// Parses a pack's entries from its tail (at least [`tail_len`] bytes) and its header.
pub fn parse_tail(alg: HashAlg, tail: &[u8], pack_size: u64) -> Result<Vec<Entry>, S3Error> {
    let bad = |why: String| S3Error::Damaged(format!("pack tail: {why}"));
    let need = tail_len(tail, pack_size)? as usize;
    if tail.len() < need {
        return Err(bad(format!("{} tail bytes, {need} needed", tail.len())));
    }
    let t = &tail[tail.len() - need..];
    let (entries, footer) = t.split_at(need - FOOTER);
    if check(&header(alg), entries) != footer[8..24] {
        return Err(bad(
            "the entries' check does not match (damaged, or another hash algorithm)".into(),
        ));
    }
    let mut out = Vec::with_capacity(entries.len() / ENTRY);
    let mut offset = HEADER as u64;
    for e in entries.chunks_exact(ENTRY) {
        let id = Id::from_bytes(&e[..33]).map_err(|e| bad(e.to_string()))?;
        let kind = e[33];
        let stored_len = u32::from_le_bytes(e[34..38].try_into().unwrap());
        let raw_len = u32::from_le_bytes(e[38..42].try_into().unwrap());
        if kind > ZSTD || (kind == RAW && stored_len != raw_len) || id.alg() != alg {
            return Err(bad(format!("entry for {id} is inconsistent")));
        }
        out.push(Entry {
            id,
            kind,
            offset,
            stored_len,
            raw_len,
        });
        offset += stored_len as u64;
    }
    if offset + need as u64 != pack_size {
        return Err(bad(format!(
            "records end at {offset} and the tail is {need} bytes, but the pack is {pack_size}"
        )));
    }
    Ok(out)
}

/// A record's chunk bytes from its stored bytes, verified against its id.
pub fn open_record(
    e: &Entry,
    stored: Vec<u8>,
    where_: &str,
) -> Result<Vec<u8>, ferry_store::StoreError> {
    let corrupt = |why: String| ferry_store::StoreError::Corrupt {
        id: e.id,
        location: where_.to_string(),
        why,
    };
    let data = match e.kind {
        ZSTD => zstd::bulk::decompress(&stored, e.raw_len as usize)
            .map_err(|x| corrupt(format!("cannot decompress: {x}")))?,
        _ => stored,
    };
    if data.len() != e.raw_len as usize || !e.id.matches(&data) {
        return Err(corrupt("bytes do not hash to the id".into()));
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Vec<u8>, String, Vec<Id>) {
        let mut b = Builder::new(HashAlg::Blake3, 1 << 16, 3);
        let chunks: Vec<Vec<u8>> = vec![b"hello".to_vec(), vec![7u8; 5000], vec![]];
        let ids: Vec<Id> = chunks
            .iter()
            .map(|c| Id::hash(HashAlg::Blake3, c))
            .collect();
        for (id, c) in ids.iter().zip(&chunks) {
            b.add(id, c).unwrap();
        }
        let (bytes, name) = b.finish();
        (bytes, name, ids)
    }

    #[test]
    fn exact_bytes() {
        let (bytes, name, ids) = sample();
        assert_eq!(&bytes[..12], b"FERRYS3P\x01\x01\x00\x00");
        assert_eq!(&bytes[bytes.len() - 8..], b"FERRYS3E");
        assert_eq!(name, blake3::hash(&bytes).to_hex().to_string());
        let entries = parse_tail(HashAlg::Blake3, &bytes, bytes.len() as u64).unwrap();
        assert_eq!(entries.iter().map(|e| e.id).collect::<Vec<_>>(), ids);
        // "hello" is too short to compress; 5000 sevens compress; the empty chunk is raw.
        assert_eq!(entries[0].offset, 12);
        assert_eq!((entries[0].kind, entries[0].stored_len), (RAW, 5));
        assert_eq!(entries[1].offset, 17);
        assert_eq!(entries[1].kind, ZSTD);
        assert_eq!(entries[2].raw_len, 0);
        let n = bytes.len();
        assert_eq!(&bytes[n - 32..n - 28], &3u32.to_le_bytes());
        assert_eq!(&bytes[n - 28..n - 24], &126u32.to_le_bytes());
        for e in &entries {
            let s = &bytes[e.offset as usize..(e.offset + e.stored_len as u64) as usize];
            assert!(open_record(e, s.to_vec(), "test").is_ok());
        }
        // Pinned: the name of this exact pack (any change to the format changes it).
        assert_eq!(
            name,
            "b23262bde9e950e720d121048659c8626c35831e0de0d52577af824f374f671b"
        );
    }

    #[test]
    fn every_flip_and_cut_of_the_tail_is_refused() {
        let (bytes, _, _) = sample();
        let n = bytes.len();
        let tail_start = n - tail_len(&bytes, n as u64).unwrap() as usize;
        for i in tail_start..n {
            let mut b = bytes.clone();
            b[i] ^= 0x20;
            assert!(
                parse_tail(HashAlg::Blake3, &b, n as u64).is_err(),
                "flip at {i}"
            );
        }
        for cut in 0..n {
            // A tail that claims a pack of the wrong size, or is cut short.
            assert!(
                parse_tail(HashAlg::Blake3, &bytes[..cut], cut as u64).is_err(),
                "cut {cut}"
            );
        }
        // Another algorithm's reader refuses it.
        assert!(parse_tail(HashAlg::Sha256, &bytes, n as u64).is_err());
        // A hostile footer claiming 2^32 entries allocates nothing.
        let mut b = bytes.clone();
        b[n - 32..n - 28].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(tail_len(&b, n as u64).is_err());
    }

    #[test]
    fn a_damaged_record_is_an_error() {
        let (mut bytes, _, _) = sample();
        let entries = parse_tail(HashAlg::Blake3, &bytes, bytes.len() as u64).unwrap();
        bytes[13] ^= 1;
        let e = entries[0];
        let s = &bytes[e.offset as usize..(e.offset + e.stored_len as u64) as usize];
        assert!(open_record(&e, s.to_vec(), "test")
            .unwrap_err()
            .is_corrupt());
    }
}
