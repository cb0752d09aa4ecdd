//! The upload family: the same exchange as a fetch, pointed the other way. The receiver (the
//! server) names what it holds — the recipe of the version being replaced (GetRecipe), chunks
//! anywhere in its store (Have), keys of pieces of the old data (GetKeys) — and the sender
//! writes the new version into a temporary file as a sequence of references to that and of
//! new data compressed against it (LBFS's MKTMPFILE, TMPWRITE and COMMITTMP, streamed so that
//! no message grows with the file).
//!
//! | type | request | reply |
//! |---|---|---|
//! | 0x30 | Have: ids | Have |
//! | 0x31 | GetKeys: path · version *option* u64 · old chunks (`00` indices, increasing; `01` all but these short ids) · new bytes varint | Keys |
//! | 0x32 | Create: handle u32 · path · base *option* u64 | Ok |
//! | 0x33 | Write: handle u32 · count varint · part × count | Ok |
//! | 0x34 | Commit: handle u32 · mode u32 · mtime_ns i64 · size u64 · object *id* | Attr |
//! | 0x35 | Abort: handle u32 | Ok |

use ferry_format::{ChunkRef, HashAlg};

use super::content::{get_payload, put_payload, Payload, KEY_BYTES};
use super::types::*;
use super::{code, Reply, Request};
use crate::codec::{Reader, Writer};
use crate::ProtoError;

/// The most chunk bytes one Write's data parts carry in all.
pub const MAX_WRITE_DATA: u64 = 4 << 20;

/// One step of a Write: what comes next in the new version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WritePart {
    /// Chunks `start..start + count` of the base version's recipe (adjacent in its file).
    Base { start: u32, count: u32 },
    /// Chunks the server holds (in the base version, or anywhere, as Have said).
    Chunks(Vec<ChunkRef>),
    /// New chunks, with their lengths; the payload's prefix names the base version's chunks by
    /// their index in its recipe (`olds`) and the pieces of the session's last Keys (`refs`).
    Data { lens: Vec<u32>, payload: Payload },
}

/// The old chunks GetKeys asks keys for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyOlds {
    /// These, by index in the file's recipe (increasing).
    Indices(Vec<u32>),
    /// Every chunk whose short id is not one of these (the new version's: what it dropped).
    Except(Vec<u64>),
}

/// The keys of pieces of old data a receiver holds (GetKeys' reply).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    pub key_bytes: u8,
    /// The keys count only in runs.
    pub runs: bool,
    pub keys: Vec<u64>,
}

const RUNS_BIT: u8 = 0x80;

pub(super) fn put_request(q: &Request, w: &mut Writer) -> Option<u8> {
    Some(match q {
        Request::Have { ids } => {
            put_id_list(w, ids);
            code::HAVE
        }
        Request::GetKeys {
            path,
            version,
            olds,
            new_bytes,
        } => {
            put_path(w, path);
            put_opt(w, *version, |w, v| w.u64(v));
            match olds {
                KeyOlds::Indices(olds) => {
                    w.u8(0);
                    w.varint(olds.len() as u64);
                    let mut prev = 0;
                    for &i in olds {
                        w.varint((i - prev) as u64);
                        prev = i;
                    }
                }
                KeyOlds::Except(shorts) => {
                    w.u8(1);
                    put_short_ids(w, shorts);
                }
            }
            w.varint(*new_bytes);
            code::GET_KEYS
        }
        Request::Create { handle, path, base } => {
            w.u32(*handle);
            put_path(w, path);
            put_opt(w, *base, |w, v| w.u64(v));
            code::CREATE
        }
        Request::Write { handle, parts } => {
            w.u32(*handle);
            w.varint(parts.len() as u64);
            for p in parts {
                put_part(w, p);
            }
            code::WRITE
        }
        Request::Commit {
            handle,
            mode,
            mtime_ns,
            size,
            oid,
        } => {
            w.u32(*handle);
            w.u32(*mode);
            w.i64(*mtime_ns);
            w.u64(*size);
            w.id(oid);
            code::COMMIT
        }
        Request::Abort { handle } => {
            w.u32(*handle);
            code::ABORT
        }
        _ => return None,
    })
}

fn put_part(w: &mut Writer, p: &WritePart) {
    match p {
        WritePart::Base { start, count } => {
            w.u8(0);
            w.varint(*start as u64);
            w.varint(*count as u64);
        }
        WritePart::Chunks(cs) => {
            w.u8(1);
            w.u8(cs.first().map_or(HashAlg::Blake3, |c| c.id.alg()).tag());
            put_chunk_refs(w, cs);
        }
        WritePart::Data { lens, payload } => {
            w.u8(2);
            w.varint(lens.len() as u64);
            for l in lens {
                w.varint(*l as u64);
            }
            put_payload(w, payload);
        }
    }
}

fn get_part(r: &mut Reader<'_>, data: &mut u64) -> Result<WritePart, ProtoError> {
    Ok(match r.u8()? {
        0 => WritePart::Base {
            start: get_u32(r, "write")?,
            count: get_u32(r, "write")?,
        },
        1 => {
            let alg = HashAlg::from_tag(r.u8()?)?;
            WritePart::Chunks(get_chunk_refs(r, alg, "write")?)
        }
        2 => {
            let n = r.count(1)?;
            let mut lens = Vec::with_capacity(n);
            for _ in 0..n {
                let len = chunk_len(r.varint()?, "write")?;
                *data += len as u64;
                if *data > MAX_WRITE_DATA {
                    return Err(ProtoError::Invalid {
                        what: "write",
                        why: "more data than MAX_WRITE_DATA".into(),
                    });
                }
                lens.push(len);
            }
            WritePart::Data {
                lens,
                payload: get_payload(r)?,
            }
        }
        t => {
            return Err(ProtoError::Invalid {
                what: "write",
                why: format!("unknown part {t}"),
            })
        }
    })
}

pub(super) fn get_request(t: u8, r: &mut Reader<'_>) -> Result<Option<Request>, ProtoError> {
    Ok(Some(match t {
        code::HAVE => Request::Have {
            ids: get_id_list(r)?,
        },
        code::GET_KEYS => {
            let path = get_path(r)?;
            let version = get_opt(r, |r| r.u64())?;
            let olds = match r.u8()? {
                0 => KeyOlds::Indices(get_increasing(r)?),
                1 => KeyOlds::Except(get_short_ids(r)?),
                t => {
                    return Err(ProtoError::Invalid {
                        what: "GetKeys",
                        why: format!("kind {t}"),
                    })
                }
            };
            Request::GetKeys {
                path,
                version,
                olds,
                new_bytes: r.varint()?,
            }
        }
        code::CREATE => Request::Create {
            handle: r.u32()?,
            path: get_path(r)?,
            base: get_opt(r, |r| r.u64())?,
        },
        code::WRITE => {
            let handle = r.u32()?;
            let n = r.count(2)?;
            let mut data = 0;
            let parts = (0..n)
                .map(|_| get_part(r, &mut data))
                .collect::<Result<_, _>>()?;
            Request::Write { handle, parts }
        }
        code::COMMIT => Request::Commit {
            handle: r.u32()?,
            mode: r.u32()?,
            mtime_ns: r.i64()?,
            size: r.u64()?,
            oid: r.id()?,
        },
        code::ABORT => Request::Abort { handle: r.u32()? },
        _ => return Ok(None),
    }))
}

/// count varint · index × count, each as the gap from the one before (from 0 for the first),
/// strictly increasing.
fn get_increasing(r: &mut Reader<'_>) -> Result<Vec<u32>, ProtoError> {
    let n = r.count(1)?;
    let mut out = Vec::with_capacity(n);
    let mut prev: u32 = 0;
    for k in 0..n {
        let gap = get_u32(r, "GetKeys")?;
        let i = prev.checked_add(gap).filter(|_| k == 0 || gap > 0);
        prev = i.ok_or_else(|| ProtoError::Invalid {
            what: "GetKeys",
            why: "old chunk indices not increasing".into(),
        })?;
        out.push(prev);
    }
    Ok(out)
}

pub(super) fn put_reply(reply: &Reply, w: &mut Writer) -> Option<u8> {
    Some(match reply {
        Reply::Have(flags) => {
            put_bits(w, flags);
            code::R_HAVE
        }
        Reply::Keys(k) => {
            w.u8(k.key_bytes | if k.runs { RUNS_BIT } else { 0 });
            put_keys(w, &k.keys, k.key_bytes as usize);
            code::R_KEYS
        }
        _ => return None,
    })
}

pub(super) fn get_reply(t: u8, r: &mut Reader<'_>) -> Result<Option<Reply>, ProtoError> {
    Ok(Some(match t {
        code::R_HAVE => Reply::Have(get_bits(r, "have")?),
        code::R_KEYS => {
            let b = r.u8()?;
            let key_bytes = b & !RUNS_BIT;
            if !KEY_BYTES.contains(&key_bytes) {
                return Err(ProtoError::Invalid {
                    what: "keys",
                    why: format!("key byte {b:#04x}"),
                });
            }
            Reply::Keys(Keys {
                key_bytes,
                runs: b & RUNS_BIT != 0,
                keys: get_keys(r, key_bytes as usize)?,
            })
        }
        _ => return Ok(None),
    }))
}
