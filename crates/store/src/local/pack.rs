//! Pack files: append-only sequences of records (`docs/formats.md`, "Pack v1").
//!
//! ```text
//! pack   = header record*
//! header = "FRPK" version:u8=1 reserved:[u8;3]=0                      (8 bytes)
//! record = kind:u8 codec:u8 reserved:u16=0 stored_len:u32le raw_len:u32le
//!          id:[u8;33] check:[u8;4] payload:[u8; stored_len]           (49 + stored_len)
//! ```
//!
//! `check` is the first 4 bytes of BLAKE3 of the 45 header bytes before it, so a torn or
//! overwritten header is told from a real one without trusting its lengths. The payload of a
//! chunk record is verified by the chunk's id; object and tombstone payloads end in 8 bytes of
//! BLAKE3 of what precedes them.

use ferry_chunk::MAX_CHUNK_LIMIT;
use ferry_format::{Id, TAGGED_ID_BYTES};

pub(crate) const PACK_VERSION: u8 = 1;
pub(crate) const PACK_HEADER: [u8; 8] = [b'F', b'R', b'P', b'K', PACK_VERSION, 0, 0, 0];
pub(crate) const PACK_HEADER_LEN: u64 = 8;
pub(crate) const RECORD_HEADER_LEN: usize = 49;
/// Object records hold recipes: 256 MiB is a recipe of ~8 million chunks (a 60 GiB object at
/// 8 KiB chunks).
pub(crate) const MAX_OBJECT_RECORD: u32 = 256 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Chunk = 1,
    Object = 2,
    Tombstone = 3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Codec {
    Raw = 0,
    Zstd = 1,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    pub kind: Kind,
    pub codec: Codec,
    pub stored_len: u32,
    pub raw_len: u32,
    pub id: Id,
}

fn header_check(b: &[u8]) -> [u8; 4] {
    let h = blake3::hash(&b[..45]);
    let mut c = [0u8; 4];
    c.copy_from_slice(&h.as_bytes()[..4]);
    c
}

/// Upper bound of zstd's output for `n` input bytes (its documented worst case is below this).
fn zstd_bound(n: u32) -> u64 {
    n as u64 + n as u64 / 128 + 1024
}

impl RecordHeader {
    pub(crate) fn encode(&self) -> [u8; RECORD_HEADER_LEN] {
        let mut b = [0u8; RECORD_HEADER_LEN];
        b[0] = self.kind as u8;
        b[1] = self.codec as u8;
        b[4..8].copy_from_slice(&self.stored_len.to_le_bytes());
        b[8..12].copy_from_slice(&self.raw_len.to_le_bytes());
        b[12..12 + TAGGED_ID_BYTES].copy_from_slice(&self.id.to_bytes());
        let c = header_check(&b);
        b[45..49].copy_from_slice(&c);
        b
    }

    /// Parses and bounds a header. Errors are plain text; the caller adds path and offset.
    pub(crate) fn decode(b: &[u8; RECORD_HEADER_LEN]) -> Result<RecordHeader, String> {
        if header_check(b) != b[45..49] {
            return Err("record header checksum mismatch (torn or overwritten)".into());
        }
        let kind = match b[0] {
            1 => Kind::Chunk,
            2 => Kind::Object,
            3 => Kind::Tombstone,
            k => return Err(format!("unknown record kind {k}")),
        };
        let codec = match b[1] {
            0 => Codec::Raw,
            1 => Codec::Zstd,
            c => return Err(format!("unknown codec {c}")),
        };
        if b[2..4] != [0, 0] {
            return Err("reserved header bytes are not zero".into());
        }
        let stored_len = u32::from_le_bytes(b[4..8].try_into().unwrap());
        let raw_len = u32::from_le_bytes(b[8..12].try_into().unwrap());
        let id = Id::from_bytes(&b[12..45]).map_err(|e| e.to_string())?;
        let limit = match kind {
            Kind::Chunk => MAX_CHUNK_LIMIT as u32,
            _ => MAX_OBJECT_RECORD,
        };
        if raw_len > limit {
            return Err(format!(
                "record of {raw_len} bytes exceeds the {limit}-byte limit"
            ));
        }
        let ok = match codec {
            Codec::Raw => stored_len == raw_len,
            Codec::Zstd => (stored_len as u64) <= zstd_bound(raw_len),
        };
        if !ok {
            return Err(format!(
                "stored length {stored_len} impossible for raw length {raw_len}"
            ));
        }
        Ok(RecordHeader {
            kind,
            codec,
            stored_len,
            raw_len,
            id,
        })
    }

    pub(crate) fn record_len(&self) -> u64 {
        RECORD_HEADER_LEN as u64 + self.stored_len as u64
    }
}

/// Builds a whole record (header and payload), compressing when it pays.
pub(crate) fn encode_record(kind: Kind, id: Id, raw: &[u8], level: i32) -> Vec<u8> {
    let compressed = (level > 0).then(|| compress(raw, level)).flatten();
    let (codec, payload) = match &compressed {
        Some(c) => (Codec::Zstd, &c[..]),
        None => (Codec::Raw, raw),
    };
    let h = RecordHeader {
        kind,
        codec,
        stored_len: payload.len() as u32,
        raw_len: raw.len() as u32,
        id,
    };
    let mut out = Vec::with_capacity(RECORD_HEADER_LEN + payload.len());
    out.extend_from_slice(&h.encode());
    out.extend_from_slice(payload);
    out
}

/// Records stored raw, without trying, after one that did not compress (then one is tried
/// again): a run of random data, media or archives costs no compressor time, and a run of
/// text after it loses a few records' savings at most.
const SKIP_AFTER_INCOMPRESSIBLE: u32 = 7;

/// This thread's compressor: records are many and small, and a fresh context per record costs
/// more than compressing a chunk does.
struct Context {
    level: i32,
    z: zstd::bulk::Compressor<'static>,
    /// Records still to store raw without trying.
    skip: u32,
}

/// `raw` compressed at `level`, or `None` when it did not shrink by 1/32 (or was not tried).
pub(crate) fn compress(raw: &[u8], level: i32) -> Option<Vec<u8>> {
    thread_local! {
        static CONTEXT: std::cell::RefCell<Option<Context>> = const { std::cell::RefCell::new(None) };
    }
    CONTEXT.with_borrow_mut(|context| {
        if context.as_ref().is_none_or(|c| c.level != level) {
            *context = Some(Context {
                level,
                z: zstd::bulk::Compressor::new(level).ok()?,
                skip: 0,
            });
        }
        let c = context.as_mut()?;
        if c.skip > 0 {
            c.skip -= 1;
            return None;
        }
        let out =
            c.z.compress(raw)
                .ok()
                .filter(|z| z.len() < raw.len() - raw.len() / 32);
        if out.is_none() {
            c.skip = SKIP_AFTER_INCOMPRESSIBLE;
        }
        out
    })
}

/// Decodes and verifies a record's payload: chunks against their id, other records against
/// their trailing check.
pub(crate) fn decode_payload(h: &RecordHeader, payload: &[u8]) -> Result<Vec<u8>, String> {
    let raw = match h.codec {
        Codec::Raw => payload.to_vec(),
        Codec::Zstd => {
            // This thread's decompressor, as `compress` keeps its compressor: a fresh context
            // (allocated and cleared) per record cost more than decoding a chunk.
            thread_local! {
                static D: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
                    const { std::cell::RefCell::new(None) };
            }
            D.with_borrow_mut(|d| {
                if d.is_none() {
                    *d = Some(zstd::bulk::Decompressor::new().map_err(|e| format!("zstd: {e}"))?);
                }
                let d = d.as_mut().expect("made above");
                d.decompress(payload, h.raw_len as usize)
                    .map_err(|e| format!("zstd: {e}"))
            })?
        }
    };
    if raw.len() != h.raw_len as usize {
        return Err(format!(
            "payload decodes to {} bytes, header says {}",
            raw.len(),
            h.raw_len
        ));
    }
    match h.kind {
        Kind::Chunk if !h.id.matches(&raw) => Err("bytes do not hash to the chunk id".into()),
        Kind::Chunk => Ok(raw),
        Kind::Object | Kind::Tombstone => {
            if raw.len() < 16 {
                return Err("object record too short".into());
            }
            let (body, check) = raw.split_at(raw.len() - 8);
            if blake3::hash(body).as_bytes()[..8] != *check {
                return Err("object record checksum mismatch".into());
            }
            let mut raw = raw;
            raw.truncate(raw.len() - 8);
            Ok(raw)
        }
    }
}

/// The raw payload of an object record (or a tombstone when `recipe` is `None`).
pub(crate) fn object_payload(seq: u64, recipe: Option<&[u8]>) -> Vec<u8> {
    let mut v = seq.to_le_bytes().to_vec();
    if let Some(r) = recipe {
        v.extend_from_slice(r);
    }
    let check = blake3::hash(&v);
    v.extend_from_slice(&check.as_bytes()[..8]);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_format::HashAlg;

    #[test]
    fn header_layout_is_pinned() {
        let id = Id::from_parts(HashAlg::Blake3, [0x11; 32]);
        let h = RecordHeader {
            kind: Kind::Chunk,
            codec: Codec::Zstd,
            stored_len: 0x0102,
            raw_len: 0x2000,
            id,
        };
        let b = h.encode();
        assert_eq!(b[..12], [1, 1, 0, 0, 0x02, 0x01, 0, 0, 0x00, 0x20, 0, 0]);
        assert_eq!(b[12], 1); // blake3 tag
        assert_eq!(b[13..45], [0x11; 32]);
        assert_eq!(b[45..49], blake3::hash(&b[..45]).as_bytes()[..4]);
        assert_eq!(RecordHeader::decode(&b).unwrap(), h);
        let mut torn = b;
        torn[5] ^= 0x40;
        assert!(RecordHeader::decode(&torn).is_err());
    }

    #[test]
    fn a_record_that_does_not_compress_has_the_next_ones_stored_raw() {
        let codec = |data: &[u8]| {
            let rec = encode_record(Kind::Chunk, Id::hash(HashAlg::Blake3, data), data, 3);
            let h = RecordHeader::decode(rec[..RECORD_HEADER_LEN].try_into().unwrap()).unwrap();
            assert_eq!(decode_payload(&h, &rec[RECORD_HEADER_LEN..]).unwrap(), data);
            h.codec
        };
        let text = b"compressible text ".repeat(500);
        let mut noise = vec![0u8; 8192];
        blake3::Hasher::new().finalize_xof().fill(&mut noise);
        assert_eq!(codec(&text), Codec::Zstd);
        assert_eq!(codec(&noise), Codec::Raw);
        for _ in 0..SKIP_AFTER_INCOMPRESSIBLE {
            assert_eq!(codec(&text), Codec::Raw);
        }
        assert_eq!(codec(&text), Codec::Zstd);
    }

    #[test]
    fn records_round_trip_and_detect_damage() {
        let data = vec![b'a'; 10_000];
        let id = Id::hash(HashAlg::Blake3, &data);
        let rec = encode_record(Kind::Chunk, id, &data, 3);
        let h = RecordHeader::decode(rec[..RECORD_HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(h.codec, Codec::Zstd);
        assert_eq!(decode_payload(&h, &rec[RECORD_HEADER_LEN..]).unwrap(), data);
        let mut bad = rec.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(decode_payload(&h, &bad[RECORD_HEADER_LEN..]).is_err());
        // A header claiming a 1 GiB chunk is refused before anything is allocated.
        let mut huge = h;
        huge.raw_len = 1 << 30;
        huge.codec = Codec::Raw;
        huge.stored_len = 1 << 30;
        assert!(RecordHeader::decode(&huge.encode()).is_err());
    }
}
