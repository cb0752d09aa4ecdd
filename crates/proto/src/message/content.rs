//! The content family: what a receiver asks of a sender (recipes, chunks, whole files, ranges),
//! and the payload every piece of data travels in, in both directions.
//!
//! | type | request | reply |
//! |---|---|---|
//! | 0x20 | GetRecipe: target · flags u8 (bit 0 `SHORT`) · count varint · page key u64 × count | Recipe, `MORE` |
//! | 0x21 | GetChunks: ids · at *option* · against *option* | Chunks, `MORE` |
//! | 0x22 | ReadFiles: count varint · (path · old short ids) × count | Files |
//! | 0x23 | ReadRange: target · offset varint · length varint | Range |

use ferry_format::{ChunkRef, HashAlg};

use super::types::*;
use super::{code, Reply, Request};
use crate::codec::{Reader, Writer};
use crate::ProtoError;

/// The most bytes one ReadRange asks for.
pub const MAX_READ_RANGE: u32 = 4 << 20;
/// The most bytes a [`Context`] names.
pub const MAX_CONTEXT: u64 = 4 << 20;
/// The most file bytes one Files reply carries.
pub const MAX_FILES_DATA: u64 = 4 << 20;
/// Shortest and longest piece keys, in bytes.
pub const KEY_BYTES: std::ops::RangeInclusive<u8> = 3..=8;

/// Bit of GetRecipe's flags: chunks outside the known pages by length and short id.
const RECIPE_SHORT: u8 = 1;
/// Bits of an [`Against`]'s first byte: the keys count only in runs, a context follows.
const RUNS_BIT: u8 = 0x80;
const CONTEXT_BIT: u8 = 0x20;
const KEY_LEN_BITS: u8 = 0x0f;

/// A piece of a recipe sent against pages the receiver named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecipePart {
    /// The page at this index of the request's `known` list.
    Known(u32),
    /// Chunks given in full.
    Chunks(Vec<ChunkRef>),
    /// Chunks given by length and short id ([`short_id`]): only when asked with `short`.
    Short(Vec<(u32, u64)>),
}

/// One frame of a recipe reply; `MORE` says whether parts follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecipeDelta {
    /// The version of the file the recipe describes.
    pub version: u64,
    pub total_chunks: u64,
    /// `Recipe::check` of the whole recipe: what the receiver verifies its rebuilt copy against.
    pub check: [u8; 32],
    pub alg: HashAlg,
    pub parts: Vec<RecipePart>,
}

/// GetChunks: chunks by id, optionally where the asker believes they lie, optionally to be
/// compressed against data the asker holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GetChunks {
    pub ids: Ids,
    /// Where each chunk lies in one file or object of the sender's: hints a server without an
    /// index entry for a chunk reads and verifies (a mirror that never cut the file).
    pub at: Option<Located>,
    pub against: Option<Against>,
}

/// Where the chunks of a GetChunks lie, one place per id, in the order of the ids: a run of
/// them in one target, then a run in the next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    /// (target, (offset, length) of each chunk of the run).
    pub runs: Vec<(Target, Vec<(u64, u32)>)>,
}

impl Located {
    /// How many chunks it places.
    pub fn len(&self) -> usize {
        self.runs.iter().map(|r| r.1.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What the asker holds that the chunks may be compressed against (see `docs/protocol.md`,
/// "Chunks against old data").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Against {
    /// Bytes of each piece key, 3 to 8.
    pub key_bytes: u8,
    /// The keys count only in runs.
    pub runs: bool,
    /// Keys of the pieces the asker holds; `None`: those of the session's previous GetChunks.
    pub keys: Option<Vec<u64>>,
    /// Old chunks the asker holds, by short id, that the sender may find in its history;
    /// `None`: those of the previous GetChunks.
    pub olds: Option<Vec<u64>>,
    /// Byte ranges of the file being fetched that the asker holds.
    pub context: Option<Context>,
}

/// Byte ranges of a file, as the sender has it now, that the asker holds: they head the prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Context {
    pub path: WirePath,
    /// (offset, length), increasing and apart; at most [`MAX_CONTEXT`] bytes in all.
    pub ranges: Vec<(u64, u64)>,
}

/// Data in flight: plainly, or as one zstd frame whose prefix both sides can build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// The bytes, concatenated (the session's stream compresses them).
    Plain(Vec<u8>),
    /// One zstd frame. Its prefix: the context's bytes when `context`, then the old chunks
    /// `olds` names, then the pieces `refs` names, each in the order listed.
    Frame {
        context: bool,
        olds: Vec<u32>,
        refs: Vec<u32>,
        data: Vec<u8>,
    },
}

impl Payload {
    /// The bytes carried (compressed, for a frame).
    pub fn data(&self) -> &[u8] {
        match self {
            Payload::Plain(d) | Payload::Frame { data: d, .. } => d,
        }
    }
}

/// A Chunks reply: the chunks found, by their places in the request, in increasing order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunks {
    pub found: Vec<u32>,
    pub payload: Payload,
}

pub(super) fn put_request(q: &Request, w: &mut Writer) -> Option<u8> {
    Some(match q {
        Request::GetRecipe {
            target,
            short,
            known,
        } => {
            put_target(w, target);
            w.u8(if *short { RECIPE_SHORT } else { 0 });
            w.varint(known.len() as u64);
            for k in known {
                w.u64(*k);
            }
            code::GET_RECIPE
        }
        Request::GetChunks(g) => {
            put_id_list(w, &g.ids);
            put_opt(w, g.at.as_ref(), |w, at| {
                w.varint(at.runs.len() as u64);
                for (target, places) in &at.runs {
                    put_target(w, target);
                    w.varint(places.len() as u64);
                    for &(offset, len) in places {
                        w.varint(offset);
                        w.varint(len as u64);
                    }
                }
            });
            put_opt(w, g.against.as_ref(), put_against);
            code::GET_CHUNKS
        }
        Request::ReadFiles { files } => {
            w.varint(files.len() as u64);
            for (path, olds) in files {
                put_path(w, path);
                put_short_ids(w, olds);
            }
            code::READ_FILES
        }
        Request::ReadRange {
            target,
            offset,
            len,
        } => {
            put_target(w, target);
            w.varint(*offset);
            w.varint(*len as u64);
            code::READ_RANGE
        }
        _ => return None,
    })
}

fn put_against(w: &mut Writer, a: &Against) {
    let mut b = a.key_bytes & KEY_LEN_BITS;
    if a.runs {
        b |= RUNS_BIT;
    }
    if a.context.is_some() {
        b |= CONTEXT_BIT;
    }
    w.u8(b);
    let n = (a.key_bytes as usize).min(8);
    put_opt(w, a.keys.as_ref(), |w, k| put_keys(w, k, n));
    put_opt(w, a.olds.as_ref(), |w, o| put_short_ids(w, o));
    if let Some(c) = &a.context {
        put_path(w, &c.path);
        put_ranges(w, &c.ranges);
    }
}

fn get_against(r: &mut Reader<'_>) -> Result<Against, ProtoError> {
    let b = r.u8()?;
    let key_bytes = b & KEY_LEN_BITS;
    if !KEY_BYTES.contains(&key_bytes) || b & !(KEY_LEN_BITS | RUNS_BIT | CONTEXT_BIT) != 0 {
        return Err(ProtoError::Invalid {
            what: "piece keys",
            why: format!("key byte {b:#04x}"),
        });
    }
    let keys = get_opt(r, |r| get_keys(r, key_bytes as usize))?;
    let olds = get_opt(r, get_short_ids)?;
    let context = if b & CONTEXT_BIT != 0 {
        Some(Context {
            path: get_path(r)?,
            ranges: get_ranges(r, "context", MAX_CONTEXT)?,
        })
    } else {
        None
    };
    Ok(Against {
        key_bytes,
        runs: b & RUNS_BIT != 0,
        keys,
        olds,
        context,
    })
}

pub(super) fn get_request(t: u8, r: &mut Reader<'_>) -> Result<Option<Request>, ProtoError> {
    Ok(Some(match t {
        code::GET_RECIPE => {
            let target = get_target(r)?;
            let flags = r.u8()?;
            if flags & !RECIPE_SHORT != 0 {
                return Err(ProtoError::Invalid {
                    what: "GetRecipe",
                    why: format!("flags {flags:#04x}"),
                });
            }
            let n = r.count(8)?;
            let known = (0..n).map(|_| r.u64()).collect::<Result<_, _>>()?;
            Request::GetRecipe {
                target,
                short: flags & RECIPE_SHORT != 0,
                known,
            }
        }
        code::GET_CHUNKS => {
            let ids = get_id_list(r)?;
            let at = get_opt(r, |r| {
                // A run is at least a target (2 bytes) and a count.
                let n = r.count(3)?;
                let mut runs = Vec::with_capacity(n);
                for _ in 0..n {
                    let target = get_target(r)?;
                    let m = r.count(2)?;
                    let places = (0..m)
                        .map(|_| Ok((r.varint()?, chunk_len(r.varint()?, "chunk places")?)))
                        .collect::<Result<Vec<_>, ProtoError>>()?;
                    runs.push((target, places));
                }
                Ok(Located { runs })
            })?;
            if at.as_ref().is_some_and(|a| a.len() != ids.len()) {
                return Err(ProtoError::Invalid {
                    what: "GetChunks",
                    why: "locations do not match the ids".into(),
                });
            }
            let against = get_opt(r, get_against)?;
            Request::GetChunks(GetChunks { ids, at, against })
        }
        code::READ_FILES => {
            // A file is at least a path length byte and an id count byte.
            let n = r.count(2)?;
            let files = (0..n)
                .map(|_| Ok((get_path(r)?, get_short_ids(r)?)))
                .collect::<Result<_, ProtoError>>()?;
            Request::ReadFiles { files }
        }
        code::READ_RANGE => Request::ReadRange {
            target: get_target(r)?,
            offset: r.varint()?,
            len: match r.varint()? {
                n if n <= MAX_READ_RANGE as u64 => n as u32,
                _ => {
                    return Err(ProtoError::Invalid {
                        what: "ReadRange",
                        why: "more bytes than MAX_READ_RANGE".into(),
                    })
                }
            },
        },
        _ => return Ok(None),
    }))
}

/// kind u8 (`00` plain, `01` frame, `02` frame headed by the context) · for a frame, olds
/// indices · refs indices · then data *bytes*.
pub(super) fn put_payload(w: &mut Writer, p: &Payload) {
    match p {
        Payload::Plain(d) => {
            w.u8(0);
            w.bytes(d);
        }
        Payload::Frame {
            context,
            olds,
            refs,
            data,
        } => {
            w.u8(if *context { 2 } else { 1 });
            put_indices(w, olds);
            put_indices(w, refs);
            w.bytes(data);
        }
    }
}

pub(super) fn get_payload(r: &mut Reader<'_>) -> Result<Payload, ProtoError> {
    Ok(match r.u8()? {
        0 => Payload::Plain(r.bytes()?.to_vec()),
        k @ (1 | 2) => Payload::Frame {
            context: k == 2,
            olds: get_indices(r)?,
            refs: get_indices(r)?,
            data: r.bytes()?.to_vec(),
        },
        k => {
            return Err(ProtoError::Invalid {
                what: "payload",
                why: format!("kind {k}"),
            })
        }
    })
}

pub(super) fn put_reply(reply: &Reply, w: &mut Writer) -> Option<u8> {
    Some(match reply {
        Reply::Recipe(d) => {
            w.u64(d.version);
            w.u64(d.total_chunks);
            w.0.extend_from_slice(&d.check);
            w.u8(d.alg.tag());
            w.varint(d.parts.len() as u64);
            for p in &d.parts {
                match p {
                    RecipePart::Known(i) => {
                        w.u8(0);
                        w.varint(*i as u64);
                    }
                    RecipePart::Chunks(cs) => {
                        w.u8(1);
                        put_chunk_refs(w, cs);
                    }
                    RecipePart::Short(cs) => {
                        w.u8(2);
                        put_short_refs(w, cs);
                    }
                }
            }
            code::R_RECIPE
        }
        Reply::Chunks(c) => {
            put_indices(w, &c.found);
            put_payload(w, &c.payload);
            code::R_CHUNKS
        }
        Reply::Files { files, payload } => {
            w.varint(files.len() as u64);
            for f in files {
                match f {
                    None => w.u8(0),
                    Some((len, None)) => {
                        w.u8(1);
                        w.varint(*len);
                    }
                    Some((len, Some(oid))) => {
                        w.u8(2);
                        w.varint(*len);
                        w.id(oid);
                    }
                }
            }
            put_payload(w, payload);
            code::R_FILES
        }
        Reply::Range { version, oid, data } => {
            w.u64(*version);
            w.opt_id(oid.as_ref());
            w.bytes(data);
            code::R_RANGE
        }
        _ => return None,
    })
}

pub(super) fn get_reply(t: u8, r: &mut Reader<'_>) -> Result<Option<Reply>, ProtoError> {
    Ok(Some(match t {
        code::R_RECIPE => {
            let (version, total_chunks) = (r.u64()?, r.u64()?);
            let check: [u8; 32] = r.take_exact(32)?.try_into().expect("32 bytes");
            let alg = HashAlg::from_tag(r.u8()?)?;
            let n = r.count(2)?;
            let mut parts = Vec::with_capacity(n);
            for _ in 0..n {
                parts.push(match r.u8()? {
                    0 => RecipePart::Known(get_u32(r, "recipe")?),
                    1 => RecipePart::Chunks(get_chunk_refs(r, alg, "recipe")?),
                    2 => RecipePart::Short(get_short_refs(r, "recipe")?),
                    t => {
                        return Err(ProtoError::Invalid {
                            what: "recipe",
                            why: format!("unknown part {t}"),
                        })
                    }
                });
            }
            Reply::Recipe(RecipeDelta {
                version,
                total_chunks,
                check,
                alg,
                parts,
            })
        }
        code::R_CHUNKS => Reply::Chunks(Chunks {
            found: get_indices(r)?,
            payload: get_payload(r)?,
        }),
        code::R_FILES => {
            let n = r.count(1)?;
            let files = (0..n)
                .map(|_| match r.u8()? {
                    0 => Ok(None),
                    1 => Ok(Some((r.varint()?, None))),
                    2 => Ok(Some((r.varint()?, Some(r.id()?)))),
                    t => Err(ProtoError::Invalid {
                        what: "files",
                        why: format!("file kind {t}"),
                    }),
                })
                .collect::<Result<_, ProtoError>>()?;
            Reply::Files {
                files,
                payload: get_payload(r)?,
            }
        }
        code::R_RANGE => Reply::Range {
            version: r.u64()?,
            oid: r.opt_id()?,
            data: r.bytes()?.to_vec(),
        },
        _ => return Ok(None),
    }))
}
