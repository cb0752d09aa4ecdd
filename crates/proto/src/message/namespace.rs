//! The namespace family: attributes, listings, links, and the changes that need no data
//! (LBFS's NFS-like calls).
//!
//! | type | request | body | reply |
//! |---|---|---|---|
//! | 0x10 | GetAttr | path | Attr |
//! | 0x11 | ReadDir | path · count varint · entry key (3 bytes LE) × count | Entries, `MORE` |
//! | 0x12 | ReadLink | path | Link |
//! | 0x13 | Mkdir | path · mode u32 | Ok |
//! | 0x14 | Rename | from path · to path | Ok |
//! | 0x15 | Unlink | path | Ok |
//! | 0x16 | Rmdir | path | Ok |
//! | 0x17 | Symlink | path · target *bytes* | Ok |
//! | 0x18 | SetAttr | path · mode *option* u32 · mtime_ns *option* i64 | Ok |
//! | 0x19 | StatFs | path | FsStats |
//! | 0x1a | Sync | (nothing) | Ok |
//! | 0x1b | Link | from path · to path | Ok |
//! | 0x1d | Ping | (nothing) | Ok |
//! | 0x1c | ReadTree | path · hashes u8 · filter *bytes* (see `KnownEntries`) | Tree, `MORE` |
//!
//! Tree (0x4f): count varint · path × count (relative to the path asked for).

use super::types::{get_attr, get_bits, get_path, put_attr, put_bits, put_opt, put_path};
use super::types::{get_opt, DirEntry, FsStats};
use super::{code, Reply, Request};
use crate::codec::{Reader, Writer};
use crate::ProtoError;

/// Encodes a namespace request; `None` if `q` is of another family.
pub(super) fn put_request(q: &Request, w: &mut Writer) -> Option<u8> {
    Some(match q {
        Request::GetAttr { path } => {
            put_path(w, path);
            code::GET_ATTR
        }
        Request::ReadDir { path, keys } => {
            put_path(w, path);
            w.varint(keys.len() as u64);
            for k in keys {
                w.0.extend_from_slice(&k.to_le_bytes()[..3]);
            }
            code::READ_DIR
        }
        Request::ReadLink { path } => {
            put_path(w, path);
            code::READ_LINK
        }
        Request::Mkdir { path, mode } => {
            put_path(w, path);
            w.u32(*mode);
            code::MKDIR
        }
        Request::Rename { from, to } => {
            put_path(w, from);
            put_path(w, to);
            code::RENAME
        }
        Request::Unlink { path } => {
            put_path(w, path);
            code::UNLINK
        }
        Request::Rmdir { path } => {
            put_path(w, path);
            code::RMDIR
        }
        Request::Symlink { path, target } => {
            put_path(w, path);
            w.bytes(target);
            code::SYMLINK
        }
        Request::SetAttr {
            path,
            mode,
            mtime_ns,
        } => {
            put_path(w, path);
            put_opt(w, *mode, |w, v| w.u32(v));
            put_opt(w, *mtime_ns, |w, v| w.i64(v));
            code::SET_ATTR
        }
        Request::StatFs { path } => {
            put_path(w, path);
            code::STAT_FS
        }
        Request::Sync => code::SYNC,
        Request::Ping => code::PING,
        Request::Link { from, to } => {
            put_path(w, from);
            put_path(w, to);
            code::LINK
        }
        Request::ReadTree { path, known } => {
            put_path(w, path);
            w.u8(known.hashes);
            w.bytes(&known.bits);
            code::READ_TREE
        }
        _ => return None,
    })
}

pub(super) fn get_request(t: u8, r: &mut Reader<'_>) -> Result<Option<Request>, ProtoError> {
    let path = |r: &mut Reader<'_>| get_path(r);
    Ok(Some(match t {
        code::GET_ATTR => Request::GetAttr { path: path(r)? },
        code::READ_DIR => {
            let path = path(r)?;
            let n = r.count(3)?;
            let keys = (0..n)
                .map(|_| {
                    let k = r.take_exact(3)?;
                    Ok(u32::from_le_bytes([k[0], k[1], k[2], 0]))
                })
                .collect::<Result<_, ProtoError>>()?;
            Request::ReadDir { path, keys }
        }
        code::READ_LINK => Request::ReadLink { path: path(r)? },
        code::MKDIR => Request::Mkdir {
            path: path(r)?,
            mode: r.u32()?,
        },
        code::RENAME => Request::Rename {
            from: path(r)?,
            to: path(r)?,
        },
        code::UNLINK => Request::Unlink { path: path(r)? },
        code::RMDIR => Request::Rmdir { path: path(r)? },
        code::SYMLINK => Request::Symlink {
            path: path(r)?,
            target: r.bytes()?.to_vec(),
        },
        code::SET_ATTR => Request::SetAttr {
            path: path(r)?,
            mode: get_opt(r, |r| r.u32())?,
            mtime_ns: get_opt(r, |r| r.i64())?,
        },
        code::STAT_FS => Request::StatFs { path: path(r)? },
        code::SYNC => Request::Sync,
        code::PING => Request::Ping,
        code::LINK => Request::Link {
            from: path(r)?,
            to: path(r)?,
        },
        code::READ_TREE => {
            let path = path(r)?;
            let hashes = r.u8()?;
            if hashes > crate::MAX_FILTER_HASHES {
                return Err(ProtoError::Invalid {
                    what: "filter",
                    why: format!("{hashes} hashes an entry"),
                });
            }
            let bits = r.bytes()?.to_vec();
            Request::ReadTree {
                path,
                known: crate::KnownEntries { hashes, bits },
            }
        }
        _ => return Ok(None),
    }))
}

/// Encodes a namespace reply (Attr, Entries, Link, FsStats); `None` for another family's.
pub(super) fn put_reply(reply: &Reply, w: &mut Writer) -> Option<u8> {
    Some(match reply {
        Reply::Attr(a) => {
            put_attr(w, a);
            code::R_ATTR
        }
        Reply::Entries { present, entries } => {
            put_bits(w, present);
            put_entries(w, entries);
            code::R_ENTRIES
        }
        Reply::Link(target) => {
            w.bytes(target);
            code::R_LINK
        }
        Reply::Tree(dirs) => {
            w.varint(dirs.len() as u64);
            for d in dirs {
                put_path(w, d);
            }
            code::R_TREE
        }
        Reply::FsStats(f) => {
            w.u32(f.block_size);
            for n in [
                f.blocks,
                f.blocks_free,
                f.blocks_avail,
                f.files,
                f.files_free,
            ] {
                w.u64(n);
            }
            w.u32(f.name_max);
            code::R_FS_STATS
        }
        _ => return None,
    })
}

pub(super) fn get_reply(t: u8, r: &mut Reader<'_>) -> Result<Option<Reply>, ProtoError> {
    Ok(Some(match t {
        code::R_ATTR => Reply::Attr(get_attr(r)?),
        code::R_ENTRIES => Reply::Entries {
            present: get_bits(r, "entries")?,
            entries: get_entries(r)?,
        },
        code::R_LINK => Reply::Link(r.bytes()?.to_vec()),
        code::R_TREE => Reply::Tree(
            (0..r.count(1)?)
                .map(|_| get_path(r))
                .collect::<Result<_, _>>()?,
        ),
        code::R_FS_STATS => Reply::FsStats(FsStats {
            block_size: r.u32()?,
            blocks: r.u64()?,
            blocks_free: r.u64()?,
            blocks_avail: r.u64()?,
            files: r.u64()?,
            files_free: r.u64()?,
            name_max: r.u32()?,
        }),
        _ => return Ok(None),
    }))
}

fn put_entries(w: &mut Writer, es: &[DirEntry]) {
    w.varint(es.len() as u64);
    for e in es {
        w.bytes(&e.name);
        put_attr(w, &e.attr);
    }
}

fn get_entries(r: &mut Reader<'_>) -> Result<Vec<DirEntry>, ProtoError> {
    // An entry is at least a name length byte and 34 bytes of attributes.
    let n = r.count(35)?;
    (0..n)
        .map(|_| {
            Ok(DirEntry {
                name: r.bytes()?.to_vec(),
                attr: get_attr(r)?,
            })
        })
        .collect()
}
