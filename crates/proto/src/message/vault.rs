//! The vault family (issue 22, OceanStore's design): a Ferry server keeps a vault's sealed
//! blobs in a directory of its export and applies tree actions to it, holding no key. One
//! request type carries every operation; the blobs and actions are opaque here (their formats:
//! `docs/formats.md`, "Vault records v1" and "Vault actions v1").
//!
//! | type | request | reply |
//! |---|---|---|
//! | 0x3f | Vault: path (the vault's directory) · op u8 · name *bytes* · data *bytes* | VaultData |
//! | 0x4d | VaultData: present u8 (0 or 1) · data *bytes* (when present) | |
//!
//! Operations: 1 get (name → its bytes, or absent), 2 put (name, data: stored unless the name
//! exists), 3 create (name, data: stored only if the name is free; answers 1 made, 0 taken),
//! 4 list (name: a directory such as `heads/`, data: the last name of the previous page or
//! empty → the next names after it, `\n`-separated, at most [`MAX_VAULT_NAMES`]), 5 delete
//! (name), 6 apply (data: actions v1 → roots v1), 7 init (makes the directory), 8 flush
//! (everything put so far is made durable: before a head names it), 9 get many (data: names,
//! `\n`-separated → per name answered, in order, `00` absent or `01` · length u32 · bytes,
//! stopping short of about 2 MiB; the asker asks again for the rest), 10 put many (data: per
//! blob, name (u16 length, bytes), length u32, bytes; each stored as by put).

use super::types::*;
use super::{code, Reply, Request};
use crate::codec::{Reader, Writer};
use crate::ProtoError;

/// Names one list reply carries at most.
pub const MAX_VAULT_NAMES: usize = 16 << 10;

/// What a Vault request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VaultOp {
    Get = 1,
    Put = 2,
    Create = 3,
    List = 4,
    Delete = 5,
    Apply = 6,
    Init = 7,
    Flush = 8,
    GetMany = 9,
    PutMany = 10,
}

impl VaultOp {
    fn from_u8(v: u8) -> Result<VaultOp, ProtoError> {
        Ok(match v {
            1 => VaultOp::Get,
            2 => VaultOp::Put,
            3 => VaultOp::Create,
            4 => VaultOp::List,
            5 => VaultOp::Delete,
            6 => VaultOp::Apply,
            7 => VaultOp::Init,
            8 => VaultOp::Flush,
            9 => VaultOp::GetMany,
            10 => VaultOp::PutMany,
            v => {
                return Err(ProtoError::Invalid {
                    what: "vault op",
                    why: format!("unknown op {v}"),
                })
            }
        })
    }
}

pub(super) fn put_request(q: &Request, w: &mut Writer) -> Option<u8> {
    match q {
        Request::Vault {
            path,
            op,
            name,
            data,
        } => {
            put_path(w, path);
            w.u8(*op as u8);
            w.bytes(name);
            w.bytes(data);
            Some(code::VAULT)
        }
        _ => None,
    }
}

pub(super) fn get_request(t: u8, r: &mut Reader<'_>) -> Result<Option<Request>, ProtoError> {
    if t != code::VAULT {
        return Ok(None);
    }
    Ok(Some(Request::Vault {
        path: get_path(r)?,
        op: VaultOp::from_u8(r.u8()?)?,
        name: r.bytes()?.to_vec(),
        data: r.bytes()?.to_vec(),
    }))
}

pub(super) fn put_reply(reply: &Reply, w: &mut Writer) -> Option<u8> {
    match reply {
        Reply::VaultData(d) => {
            w.u8(u8::from(d.is_some()));
            if let Some(d) = d {
                w.bytes(d);
            }
            Some(code::R_VAULT)
        }
        _ => None,
    }
}

pub(super) fn get_reply(t: u8, r: &mut Reader<'_>) -> Result<Option<Reply>, ProtoError> {
    if t != code::R_VAULT {
        return Ok(None);
    }
    Ok(Some(Reply::VaultData(match r.u8()? {
        0 => None,
        1 => Some(r.bytes()?.to_vec()),
        v => {
            return Err(ProtoError::Invalid {
                what: "vault data",
                why: format!("presence {v}"),
            })
        }
    })))
}
