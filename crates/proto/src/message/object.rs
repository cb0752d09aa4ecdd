//! The object family: DOT's object-level requests, between transfer daemons. An object is named
//! by its OID (the id of its whole content); the capability that came with the OID (the
//! serving daemon's, `docs/formats.md` "Capability v1", opaque here) is what lets a peer read
//! it: knowing an OID is not enough. A daemon answers a wrong capability and an object it does
//! not hold alike (`NotFound`).
//!
//! | type | request | reply |
//! |---|---|---|
//! | 0x38 | ObjectRecipe: object *id* · capability *bytes* (at most 255) · from varint | Object |
//! | 0x39 | ObjectChunks: object *id* · capability *bytes* (at most 255) · ids | Chunks |
//! | 0x3a | ObjectRead: capability *bytes* · offset varint · length varint | Range × n |
//! | 0x3b | ObjectCreate: durability u8 · size varint · data *bytes* (the first bytes) | Created, or Ok when more follow |
//! | 0x3e | ObjectAppend: data *bytes* (the next bytes) | Ok, Created after the last |
//! | 0x3c | ObjectDelete: capability *bytes* | Ok |
//! | 0x3d | ObjectReplicate: durability u8 · ticket *bytes* | Created |
//! | 0x4b | Object: object *id* · size varint · total varint · from varint · chunk refs (the object id's hash) | |
//! | 0x4c | Created: durability u8 · ticket *bytes* (Ticket v2) | |

use ferry_format::ChunkRef;

use super::types::*;
use super::{code, Reply, Request};
use crate::codec::{Reader, Writer};
use crate::ProtoError;

/// Bytes of a capability at most.
pub const MAX_CAP_BYTES: usize = 255;
/// The most chunk refs one Object reply carries (37 bytes at most each: well inside a frame).
pub const MAX_OBJECT_REFS: usize = 64 << 10;

pub(super) fn put_request(q: &Request, w: &mut Writer) -> Option<u8> {
    Some(match q {
        Request::ObjectRecipe { oid, cap, from } => {
            w.id(oid);
            w.bytes(cap);
            w.varint(*from);
            code::OBJECT_RECIPE
        }
        Request::ObjectChunks { oid, cap, ids } => {
            w.id(oid);
            w.bytes(cap);
            put_id_list(w, ids);
            code::OBJECT_CHUNKS
        }
        Request::ObjectRead { cap, offset, len } => {
            w.bytes(cap);
            w.varint(*offset);
            w.varint(*len);
            code::OBJECT_READ
        }
        Request::ObjectCreate {
            durability,
            size,
            data,
        } => {
            w.u8(*durability);
            w.varint(*size);
            w.bytes(data);
            code::OBJECT_CREATE
        }
        Request::ObjectAppend { data } => {
            w.bytes(data);
            code::OBJECT_APPEND
        }
        Request::ObjectDelete { cap } => {
            w.bytes(cap);
            code::OBJECT_DELETE
        }
        Request::ObjectReplicate { durability, ticket } => {
            w.u8(*durability);
            w.bytes(ticket);
            code::OBJECT_REPLICATE
        }
        _ => return None,
    })
}

fn get_cap(r: &mut Reader<'_>) -> Result<Vec<u8>, ProtoError> {
    let cap = r.bytes()?;
    if cap.len() > MAX_CAP_BYTES {
        return Err(ProtoError::Invalid {
            what: "capability",
            why: format!("{} bytes (at most {MAX_CAP_BYTES})", cap.len()),
        });
    }
    Ok(cap.to_vec())
}

pub(super) fn get_request(t: u8, r: &mut Reader<'_>) -> Result<Option<Request>, ProtoError> {
    Ok(Some(match t {
        code::OBJECT_RECIPE => Request::ObjectRecipe {
            oid: r.id()?,
            cap: get_cap(r)?,
            from: r.varint()?,
        },
        code::OBJECT_CHUNKS => Request::ObjectChunks {
            oid: r.id()?,
            cap: get_cap(r)?,
            ids: get_id_list(r)?,
        },
        code::OBJECT_READ => Request::ObjectRead {
            cap: get_cap(r)?,
            offset: r.varint()?,
            len: r.varint()?,
        },
        code::OBJECT_CREATE => Request::ObjectCreate {
            durability: r.u8()?,
            size: r.varint()?,
            data: r.bytes()?.to_vec(),
        },
        code::OBJECT_APPEND => Request::ObjectAppend {
            data: r.bytes()?.to_vec(),
        },
        code::OBJECT_DELETE => Request::ObjectDelete { cap: get_cap(r)? },
        code::OBJECT_REPLICATE => Request::ObjectReplicate {
            durability: r.u8()?,
            ticket: r.bytes()?.to_vec(),
        },
        _ => return Ok(None),
    }))
}

pub(super) fn put_reply(reply: &Reply, w: &mut Writer) -> Option<u8> {
    Some(match reply {
        Reply::Object {
            oid,
            size,
            total,
            from,
            chunks,
        } => {
            w.id(oid);
            w.varint(*size);
            w.varint(*total);
            w.varint(*from);
            put_chunk_refs(w, chunks);
            code::R_OBJECT
        }
        Reply::Created { durability, ticket } => {
            w.u8(*durability);
            w.bytes(ticket);
            code::R_CREATED
        }
        _ => return None,
    })
}

pub(super) fn get_reply(t: u8, r: &mut Reader<'_>) -> Result<Option<Reply>, ProtoError> {
    Ok(Some(match t {
        code::R_OBJECT => {
            let oid = r.id()?;
            let size = r.varint()?;
            let total = r.varint()?;
            let from = r.varint()?;
            let chunks: Vec<ChunkRef> = get_chunk_refs(r, oid.alg(), "object")?;
            if chunks.len() > MAX_OBJECT_REFS {
                return Err(ProtoError::Invalid {
                    what: "object",
                    why: format!("{} chunk refs in one reply", chunks.len()),
                });
            }
            Reply::Object {
                oid,
                size,
                total,
                from,
                chunks,
            }
        }
        code::R_CREATED => Reply::Created {
            durability: r.u8()?,
            ticket: r.bytes()?.to_vec(),
        },
        _ => return Ok(None),
    }))
}
