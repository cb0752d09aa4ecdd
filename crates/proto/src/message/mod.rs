//! Typed messages, one module per family. Type codes and body layouts are listed in
//! `docs/protocol.md` and pinned by the exact-bytes tests in `tests.rs`.
//!
//! - [`namespace`]: attributes, listings, links and changes that carry no data.
//! - [`content`]: what a receiver asks of a sender — recipes, chunks, whole files, ranges —
//!   and the [`Payload`] all data travels in.
//! - [`upload`]: the same exchange pointed the other way: the server names what it holds and
//!   the client writes the new version as references to it and new data against it.

use ferry_format::Id;

use crate::codec::{Reader, Writer};
use crate::{Frame, ProtoError};

mod content;
mod namespace;
mod object;
mod types;
mod upload;
mod vault;

pub use content::{
    Against, Chunks, Context, GetChunks, Located, Payload, RecipeDelta, RecipePart, KEY_BYTES,
    MAX_CONTEXT, MAX_FILES_DATA, MAX_READ_RANGE,
};
pub use object::{MAX_CAP_BYTES, MAX_OBJECT_REFS};
pub use types::{
    short_id, Attr, DirEntry, ErrorCode, FileKind, FsStats, Hello, Ids, StatExtra, Target,
    WirePath, MAX_PATH,
};
pub use upload::{KeyOlds, Keys, WritePart, MAX_WRITE_DATA};
pub use vault::{VaultOp, MAX_VAULT_NAMES};

/// `"FERRY"`, the first bytes of every Hello body.
pub const MAGIC: &[u8; 5] = b"FERRY";
/// The protocol version this build speaks. Earlier ones are refused with a message saying so:
/// version 1 (one request family per technique, behind eleven feature bits) and version 2
/// (each stream compressed from right after the Hellos, so a client waited for the server's
/// before sending anything more) and version 3 (pieces of old data cut by LBFS's Rabin
/// chunker and keyed by BLAKE3).
pub const VERSION: u16 = 4;
/// Hello feature bit: the server keeps a history of the data it has served, so a client can
/// name old chunks by short id in GetChunks and ReadFiles and have them found there. Offered
/// by a server only when it has a history.
pub const FEATURE_HISTORY: u64 = 2;
/// Hello feature bit: the server takes [`Message::Rate`], the client's measure of how fast the
/// link brings it the server's bytes (the server picks the level of its frames against old data
/// by it). A client sends it only to a server that offers it.
pub const FEATURE_RATE: u64 = 4;
/// Hello feature bit: the server answers [`Request::StatFs`] (the size and free space of the
/// file system holding the export). A client asks only a server that offers it.
pub const FEATURE_STATFS: u64 = 8;
/// Hello feature bit, asked for by a client that never compares trees by digest (a mount):
/// directories' attributes come without their tree digest (`oid` is `None`), in `Attr` and in
/// listings. A digest costs a read of the whole subtree after any change beneath it; the
/// kernel asks for a directory's attributes after each step of a bulk change (`cp -a`,
/// `rm -rf`), so a mount paid a read of the directory per file. Not in a client's Hello unless
/// asked for ([`Hello`] of [`FEATURES`] leaves it out).
pub const FEATURE_NO_TREE_DIGESTS: u64 = 16;
/// Hello feature bit, asked for by a client that shows all of stat(2) (a mount): every
/// attributes the server sends carry [`StatExtra`] (access and change times, blocks allocated,
/// link count), flagged in their kind byte. Not in a client's Hello unless asked for: other
/// clients do not pay its 28 bytes an entry.
pub const FEATURE_STAT_EXTRA: u64 = 32;
/// Hello feature bit, asked for by a client that makes changes durable when its user asks (a
/// mount: `fsync`, and about a second after a change): the session's changes of names
/// (commits, creates, renames, removals) are atomic at once but their directories are not
/// fsynced before the reply; [`Request::Sync`] fsyncs every directory changed since the last.
/// A local file system's own terms (a rename is durable once its directory is fsynced); a
/// commit still fsyncs its file before the rename, so a crash leaves the old version or the
/// new one, never a torn one. Not in a client's Hello unless asked for.
pub const FEATURE_DEFERRED_SYNC: u64 = 64;
/// Hello feature bit, asked for by a client that keeps its own copy of a listing up to date
/// after each change it makes there (a mount): the session's own change of a name breaks its
/// lease on that name but not on the listing of the directory holding it (whose entries the
/// client changes itself, and whose attributes it asks for again). Changes by anyone else
/// break both, as always. Not in a client's Hello unless asked for.
pub const FEATURE_OWN_CHANGES: u64 = 128;
/// Hello feature bit, asked for by a client that keeps listings name by name (a mount): a
/// change of a name in a directory whose listing the session leased, by anyone but the session
/// itself, is told as [`Message::Changed`] (the name's attributes now, or its absence) and
/// leaves the listing's lease standing, where an [`Message::Invalidate`] of the directory
/// would void the whole listing. So a busy directory (another client's or another session's
/// work) keeps answering lookups of every other name. Not in a client's Hello unless asked for.
pub const FEATURE_ENTRY_CHANGES: u64 = 256;
/// Hello feature bit, asked for by a client that shows hard links (a mount): the server takes
/// [`Request::Link`], and every [`StatExtra`] it sends carries the file's identity
/// ([`StatExtra::id`]: equal for two names of one file). Not in a client's Hello unless asked
/// for.
pub const FEATURE_HARD_LINKS: u64 = 512;
/// Hello feature bit: the server answers [`Request::ReadTree`] (which directories of a tree
/// differ from the client's, in one exchange). A client asks only a server that offers it.
pub const FEATURE_TREE_LISTINGS: u64 = 1024;
/// Feature bits this build understands: [`crate::FEATURE_ZSTD_STREAM`], [`FEATURE_HISTORY`],
/// [`FEATURE_RATE`], [`FEATURE_STATFS`], [`FEATURE_NO_TREE_DIGESTS`],
/// [`FEATURE_STAT_EXTRA`], [`FEATURE_DEFERRED_SYNC`], [`FEATURE_OWN_CHANGES`],
/// [`FEATURE_ENTRY_CHANGES`], [`FEATURE_HARD_LINKS`] and [`FEATURE_TREE_LISTINGS`].
/// Everything else of version 4 is always there.
pub const FEATURES: u64 = crate::FEATURE_ZSTD_STREAM
    | FEATURE_HISTORY
    | FEATURE_RATE
    | FEATURE_STATFS
    | FEATURE_NO_TREE_DIGESTS
    | FEATURE_STAT_EXTRA
    | FEATURE_DEFERRED_SYNC
    | FEATURE_OWN_CHANGES
    | FEATURE_ENTRY_CHANGES
    | FEATURE_HARD_LINKS
    | FEATURE_TREE_LISTINGS;
/// Feature bits a client sends only when asked to ([`FEATURES`] minus these is its default).
pub const ASKED_FEATURES: u64 = FEATURE_NO_TREE_DIGESTS
    | FEATURE_STAT_EXTRA
    | FEATURE_DEFERRED_SYNC
    | FEATURE_OWN_CHANGES
    | FEATURE_ENTRY_CHANGES
    | FEATURE_HARD_LINKS;
/// Largest file a client reads whole with no old version (ReadFiles with no olds) rather than
/// by recipe.
pub const MAX_READ_FILE: usize = 64 << 10;

/// Requests, from the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    GetAttr {
        path: WirePath,
    },
    /// A listing; against the entries the client holds when `keys` names them (only the entries
    /// whose keys it did not name come back).
    ReadDir {
        path: WirePath,
        keys: Vec<u32>,
    },
    ReadLink {
        path: WirePath,
    },
    Mkdir {
        path: WirePath,
        mode: u32,
    },
    Rename {
        from: WirePath,
        to: WirePath,
    },
    Unlink {
        path: WirePath,
    },
    /// Makes `to` a new name of the file or symlink `from` (a hard link; with
    /// [`FEATURE_HARD_LINKS`]).
    Link {
        from: WirePath,
        to: WirePath,
    },
    Rmdir {
        path: WirePath,
    },
    Symlink {
        path: WirePath,
        target: Vec<u8>,
    },
    SetAttr {
        path: WirePath,
        mode: Option<u32>,
        mtime_ns: Option<i64>,
    },
    /// Which directories of the tree at `path` differ from the client's (only with
    /// [`FEATURE_TREE_LISTINGS`]): `path` itself and, breadth first, every directory below it
    /// whose entry (`crate::entry_hash`) `known` does not hold, each below one that differs.
    ReadTree {
        path: WirePath,
        known: crate::KnownEntries,
    },
    /// The size and free space of the file system holding `path` (only with
    /// [`FEATURE_STATFS`]).
    StatFs {
        path: WirePath,
    },
    /// Makes the session's changes of names durable: fsyncs every directory it changed since
    /// the last Sync (with [`FEATURE_DEFERRED_SYNC`]; without, there is nothing to do).
    Sync,
    /// Nothing to do: answered `Ok` at once. A client times its link by it (the first request
    /// of a session's first batch), where any other request's reply would hold the server's
    /// work too (a tree's digest, a file to cut).
    Ping,
    /// A recipe, sent against the pages (content-defined runs of chunks) whose keys `known`
    /// lists; with `short`, chunks outside them by length and short id.
    GetRecipe {
        target: Target,
        short: bool,
        known: Vec<u64>,
    },
    GetChunks(GetChunks),
    /// Files whole, each against the old chunks (short ids) the client holds of it.
    ReadFiles {
        files: Vec<(WirePath, Vec<u64>)>,
    },
    ReadRange {
        target: Target,
        offset: u64,
        len: u32,
    },
    /// CONDWRITE: which of these chunks the server holds (and this client may use).
    Have {
        ids: Ids,
    },
    /// Keys of pieces of old chunks of the file at `path` (which must be at `version`, if
    /// named), for `new_bytes` of new data to be compressed against them.
    GetKeys {
        path: WirePath,
        version: Option<u64>,
        olds: KeyOlds,
        new_bytes: u64,
    },
    /// Opens upload `handle`: a temporary file beside `path`, written against the version
    /// `base` of the file there (`None`: nothing there).
    Create {
        handle: u32,
        path: WirePath,
        base: Option<u64>,
    },
    Write {
        handle: u32,
        parts: Vec<WritePart>,
    },
    /// Installs upload `handle` if what was written has `size` bytes hashing to `oid` and the
    /// file is still at the base version.
    Commit {
        handle: u32,
        mode: u32,
        mtime_ns: i64,
        size: u64,
        oid: Id,
    },
    Abort {
        handle: u32,
    },
    /// An object's size and chunks, from chunk `from` on (DOT's object-level request between
    /// daemons), if `cap` lets this peer read it.
    ObjectRecipe {
        oid: Id,
        cap: Vec<u8>,
        from: u64,
    },
    /// Chunks of an object, by id; every id must be one of the object's.
    ObjectChunks {
        oid: Id,
        cap: Vec<u8>,
        ids: Ids,
    },
    /// Bytes `offset..offset + len` of the object `cap` reads (Bullet's READ), answered as
    /// `Range` replies of at most 1 MiB each, the last one with the object's id.
    ObjectRead {
        cap: Vec<u8>,
        offset: u64,
        len: u64,
    },
    /// A new object of `size` bytes (Bullet's CREATE), `data` its first bytes: answered
    /// `Created` once `durability` is met when they are all of it, else `Ok` (the rest follows
    /// in ObjectAppend requests, the last answered `Created`).
    ObjectCreate {
        durability: u8,
        size: u64,
        data: Vec<u8>,
    },
    /// The next bytes of the object this session is creating.
    ObjectAppend {
        data: Vec<u8>,
    },
    /// Delete the object `cap` names (needs the delete right).
    ObjectDelete {
        cap: Vec<u8>,
    },
    /// Fetch the object of `ticket` (a Ticket v2) and keep a copy of it, answered once
    /// `durability` is met: what makes the asker's durability factor count this store.
    ObjectReplicate {
        durability: u8,
        ticket: Vec<u8>,
    },
    /// An operation on the vault kept in the directory `path` (see the vault family).
    Vault {
        path: WirePath,
        op: VaultOp,
        name: Vec<u8>,
        data: Vec<u8>,
    },
}

/// Replies, from the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Attr(Attr),
    /// Listed entries; `present` (first frame only) says which of the keys the request named
    /// are entries here.
    Entries {
        present: Vec<bool>,
        entries: Vec<DirEntry>,
    },
    Link(Vec<u8>),
    /// Directories of a tree (ReadTree), relative to the path asked for, breadth first.
    Tree(Vec<WirePath>),
    FsStats(FsStats),
    Recipe(RecipeDelta),
    Chunks(Chunks),
    /// One per file asked for: its length, and its object id when the payload is a frame
    /// (what the receiver rebuilt against its old data is checked by it), or `None` (not
    /// sent: fetch it by recipe); the files sent are the payload's bytes, concatenated.
    Files {
        files: Vec<Option<(u64, Option<Id>)>>,
        payload: Payload,
    },
    /// Bytes of a file or object, read from its version `version`; with the object id of that
    /// whole version when the server knows it, always on the reply that reaches the end.
    Range {
        version: u64,
        oid: Option<Id>,
        data: Vec<u8>,
    },
    Have(Vec<bool>),
    Keys(Keys),
    /// An object's size and its chunks `from..from + chunks.len()` of `total`.
    Object {
        oid: Id,
        size: u64,
        total: u64,
        from: u64,
        chunks: Vec<ferry_format::ChunkRef>,
    },
    /// An object made: the durability met and its ticket (Ticket v2: the owner's capability,
    /// hints, replicas').
    Created {
        durability: u8,
        ticket: Vec<u8>,
    },
    /// A vault operation's answer (absent: no such blob).
    VaultData(Option<Vec<u8>>),
    Ok,
    Error {
        code: ErrorCode,
        message: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Hello(Hello),
    Request(Request),
    Reply(Reply),
    /// A lease broken (server → client, request id 0).
    Invalidate(WirePath),
    /// A name changed in a directory whose listing the session leased (server → client,
    /// request id 0; only with [`FEATURE_ENTRY_CHANGES`]): its attributes now (the listing's
    /// lease covers them), or `None` when the name is gone. The listing's lease stands.
    Changed {
        path: WirePath,
        attr: Option<Attr>,
    },
    /// How fast the link brings the client the server's bytes (client → server, request id 0,
    /// no reply; only to a server offering [`FEATURE_RATE`]): at least `rate` bytes per second,
    /// measured over waits for replies the largest of which brought `sample` bytes; the first
    /// bytes of a reply came `round_trip` microseconds after its request at the quickest (0:
    /// not timed).
    Rate {
        rate: u64,
        sample: u64,
        round_trip: u64,
    },
    /// The sender's next byte starts its zstd stream (request id 0, either way, at most once;
    /// only to a peer whose Hello offered [`crate::FEATURE_ZSTD_STREAM`]).
    Compressed,
}

/// Message type codes.
pub(crate) mod code {
    pub const HELLO: u8 = 0x01;
    pub const COMPRESSED: u8 = crate::stream::COMPRESSED;
    pub const GET_ATTR: u8 = 0x10;
    pub const READ_DIR: u8 = 0x11;
    pub const READ_LINK: u8 = 0x12;
    pub const MKDIR: u8 = 0x13;
    pub const RENAME: u8 = 0x14;
    pub const UNLINK: u8 = 0x15;
    pub const RMDIR: u8 = 0x16;
    pub const SYMLINK: u8 = 0x17;
    pub const SET_ATTR: u8 = 0x18;
    pub const STAT_FS: u8 = 0x19;
    pub const SYNC: u8 = 0x1a;
    pub const LINK: u8 = 0x1b;
    pub const READ_TREE: u8 = 0x1c;
    pub const PING: u8 = 0x1d;
    pub const GET_RECIPE: u8 = 0x20;
    pub const GET_CHUNKS: u8 = 0x21;
    pub const READ_FILES: u8 = 0x22;
    pub const READ_RANGE: u8 = 0x23;
    pub const HAVE: u8 = 0x30;
    pub const GET_KEYS: u8 = 0x31;
    pub const CREATE: u8 = 0x32;
    pub const WRITE: u8 = 0x33;
    pub const COMMIT: u8 = 0x34;
    pub const ABORT: u8 = 0x35;
    pub const OBJECT_RECIPE: u8 = 0x38;
    pub const OBJECT_CHUNKS: u8 = 0x39;
    pub const OBJECT_READ: u8 = 0x3a;
    pub const OBJECT_CREATE: u8 = 0x3b;
    pub const OBJECT_DELETE: u8 = 0x3c;
    pub const OBJECT_REPLICATE: u8 = 0x3d;
    pub const OBJECT_APPEND: u8 = 0x3e;
    pub const VAULT: u8 = 0x3f;
    pub const R_ATTR: u8 = 0x40;
    pub const R_ENTRIES: u8 = 0x41;
    pub const R_RECIPE: u8 = 0x42;
    pub const R_CHUNKS: u8 = 0x43;
    pub const R_HAVE: u8 = 0x44;
    /// Ok and Error keep their version-1 codes, so a version-1 peer can read the refusal.
    pub const R_OK: u8 = 0x45;
    pub const R_ERROR: u8 = 0x46;
    pub const R_LINK: u8 = 0x47;
    pub const R_FILES: u8 = 0x48;
    pub const R_RANGE: u8 = 0x49;
    pub const R_KEYS: u8 = 0x4a;
    pub const R_OBJECT: u8 = 0x4b;
    pub const R_CREATED: u8 = 0x4c;
    pub const R_VAULT: u8 = 0x4d;
    pub const R_FS_STATS: u8 = 0x4e;
    pub const R_TREE: u8 = 0x4f;
    pub const INVALIDATE: u8 = 0x60;
    pub const RATE: u8 = 0x61;
    pub const CHANGED: u8 = 0x62;
}

impl Request {
    fn encode(&self, w: &mut Writer) -> u8 {
        namespace::put_request(self, w)
            .or_else(|| content::put_request(self, w))
            .or_else(|| upload::put_request(self, w))
            .or_else(|| object::put_request(self, w))
            .or_else(|| vault::put_request(self, w))
            .expect("every request belongs to a family")
    }

    fn decode(t: u8, r: &mut Reader<'_>) -> Result<Option<Request>, ProtoError> {
        if let Some(q) = namespace::get_request(t, r)? {
            return Ok(Some(q));
        }
        if let Some(q) = content::get_request(t, r)? {
            return Ok(Some(q));
        }
        if let Some(q) = upload::get_request(t, r)? {
            return Ok(Some(q));
        }
        if let Some(q) = vault::get_request(t, r)? {
            return Ok(Some(q));
        }
        object::get_request(t, r)
    }
}

impl Reply {
    fn encode(&self, w: &mut Writer) -> u8 {
        match self {
            Reply::Ok => code::R_OK,
            Reply::Error { code: c, message } => {
                w.u16(*c as u16);
                w.bytes(message.as_bytes());
                code::R_ERROR
            }
            r => namespace::put_reply(r, w)
                .or_else(|| content::put_reply(r, w))
                .or_else(|| upload::put_reply(r, w))
                .or_else(|| object::put_reply(r, w))
                .or_else(|| vault::put_reply(r, w))
                .expect("every reply belongs to a family"),
        }
    }

    fn decode(t: u8, r: &mut Reader<'_>) -> Result<Option<Reply>, ProtoError> {
        match t {
            code::R_OK => return Ok(Some(Reply::Ok)),
            code::R_ERROR => {
                return Ok(Some(Reply::Error {
                    code: ErrorCode::from_u16(r.u16()?)?,
                    message: String::from_utf8_lossy(r.bytes()?).into_owned(),
                }))
            }
            _ => {}
        }
        if let Some(x) = namespace::get_reply(t, r)? {
            return Ok(Some(x));
        }
        if let Some(x) = content::get_reply(t, r)? {
            return Ok(Some(x));
        }
        if let Some(x) = upload::get_reply(t, r)? {
            return Ok(Some(x));
        }
        if let Some(x) = vault::get_reply(t, r)? {
            return Ok(Some(x));
        }
        object::get_reply(t, r)
    }
}

impl Message {
    /// The frame carrying this message (flags 0; set [`crate::FLAG_MORE`] on streamed replies).
    pub fn to_frame(&self, request_id: u32) -> Frame {
        let mut w = Writer::default();
        let t = match self {
            Message::Hello(h) => {
                w.0.extend_from_slice(MAGIC);
                w.u16(h.version);
                w.u64(h.features);
                w.bytes(h.agent.as_bytes());
                code::HELLO
            }
            Message::Invalidate(p) => {
                types::put_path(&mut w, p);
                code::INVALIDATE
            }
            Message::Changed { path, attr } => {
                types::put_path(&mut w, path);
                types::put_opt(&mut w, attr.as_ref(), types::put_attr);
                code::CHANGED
            }
            Message::Rate {
                rate,
                sample,
                round_trip,
            } => {
                w.varint(*rate);
                w.varint(*sample);
                w.varint(*round_trip);
                code::RATE
            }
            Message::Compressed => code::COMPRESSED,
            Message::Request(q) => q.encode(&mut w),
            Message::Reply(r) => r.encode(&mut w),
        };
        Frame {
            msg_type: t,
            flags: 0,
            request_id,
            body: w.0,
        }
    }

    /// The bytes of this message in one frame.
    pub fn encode(&self, request_id: u32, compress: bool) -> Result<Vec<u8>, ProtoError> {
        self.to_frame(request_id).encode(compress)
    }

    /// Parses a frame's body. Every count is bounded by the bytes that remain.
    pub fn decode(f: &Frame) -> Result<Message, ProtoError> {
        let mut r = Reader::new(&f.body, "message body");
        let m = match f.msg_type {
            code::HELLO => {
                if r.rest_len() < MAGIC.len() || &f.body[..MAGIC.len()] != MAGIC {
                    return Err(ProtoError::BadMagic);
                }
                r = Reader::new(&f.body[MAGIC.len()..], "hello");
                let version = r.u16()?;
                let features = r.u64()?;
                let agent = String::from_utf8_lossy(r.bytes()?).into_owned();
                Message::Hello(Hello {
                    version,
                    features,
                    agent,
                })
            }
            code::INVALIDATE => Message::Invalidate(types::get_path(&mut r)?),
            code::CHANGED => Message::Changed {
                path: types::get_path(&mut r)?,
                attr: types::get_opt(&mut r, types::get_attr)?,
            },
            code::RATE => Message::Rate {
                rate: r.varint()?,
                sample: r.varint()?,
                round_trip: r.varint()?,
            },
            code::COMPRESSED => Message::Compressed,
            t @ 0x10..=0x3f => match Request::decode(t, &mut r)? {
                Some(q) => Message::Request(q),
                None => return Err(ProtoError::UnknownType(t)),
            },
            t @ 0x40..=0x5f => match Reply::decode(t, &mut r)? {
                Some(x) => Message::Reply(x),
                None => return Err(ProtoError::UnknownType(t)),
            },
            t => return Err(ProtoError::UnknownType(t)),
        };
        r.finish()?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests;
