//! Typed messages. Type codes and body layouts are listed in `docs/protocol.md`.

use ferry_chunk::MAX_CHUNK_LIMIT;
use ferry_format::{ChunkRef, HashAlg, Id, Recipe};

use crate::codec::{Reader, Writer};
use crate::{Frame, ProtoError};

/// `"FERRY"`, the first bytes of every Hello body.
pub const MAGIC: &[u8; 5] = b"FERRY";
/// The protocol version this build speaks.
pub const VERSION: u16 = 1;
/// Feature bits this build understands: [`FEATURE_ZSTD_STREAM`](crate::FEATURE_ZSTD_STREAM),
/// [`FEATURE_TREE_DIGEST`](crate::FEATURE_TREE_DIGEST), [`FEATURE_READ_FILE`],
/// [`FEATURE_HISTORY`], [`FEATURE_SHORT_IDS`], [`FEATURE_PIECES_2`], [`FEATURE_SHORT_OLDS`],
/// [`FEATURE_CONTEXT`], [`FEATURE_KEYS_3`], [`FEATURE_READ_RANGE`] and
/// [`FEATURE_SHORT_RECIPES`].
pub const FEATURES: u64 = crate::FEATURE_ZSTD_STREAM
    | crate::FEATURE_TREE_DIGEST
    | FEATURE_READ_FILE
    | FEATURE_HISTORY
    | FEATURE_SHORT_IDS
    | FEATURE_PIECES_2
    | FEATURE_SHORT_OLDS
    | FEATURE_CONTEXT
    | FEATURE_KEYS_3
    | FEATURE_READ_RANGE
    | FEATURE_SHORT_RECIPES;
/// Hello feature bit: the server answers ReadFile.
pub const FEATURE_READ_FILE: u64 = 4;
/// The server keeps a history of the data it has served (chunks by id): a client names the
/// old chunks it holds in GetChunksAgainst (`olds`), and those the server still has become the
/// prefix whole. Offered by a server only when it has a history.
pub const FEATURE_HISTORY: u64 = 8;
/// The server answers GetChunksShort: chunks named by the first 8 bytes of their hash, piece
/// keys as long as the client needs, and a reply that names the chunks sent by their place
/// in the request.
pub const FEATURE_SHORT_IDS: u64 = 16;
/// The second piece scheme of GetChunksShort: pieces cut by the LBFS chunker (96 B / 128 B /
/// 2 KiB) instead of FastCDC, and keys that may count only in runs (`runs`: a key matches only
/// where a piece next to it matches the key next to it too, so keys can be shorter).
pub const FEATURE_PIECES_2: u64 = 32;
/// Old chunks named by the first 8 bytes of their digest, like new ones (with
/// [`FEATURE_HISTORY`]): in GetChunksShort ([`OldIds::Short`]) and GetFilesShort. The server
/// finds them in its history by that prefix; the client verifies every chunk the frame gives
/// it, so a prefix that led to the wrong old chunk costs a plain fetch, never wrong data.
pub const FEATURE_SHORT_OLDS: u64 = 64;
/// GetChunksShort may name a [`Context`]: bytes of the file being fetched that the client
/// already holds, which head the prefix of the reply's frame (kind 2 of [`Reply::ChunksShort`]).
pub const FEATURE_CONTEXT: u64 = 128;
/// GetChunksShort's keys may be 3 bytes long even when they do not count only in runs (for a
/// small file's pieces, 3 bytes keep the odds of a false match under 1 in 1,000).
pub const FEATURE_KEYS_3: u64 = 256;
/// The server answers ReadRange: a receiver with nothing reads large new files whole, a range
/// at a time, each reply naming the file's object id, instead of a recipe and chunk ids.
pub const FEATURE_READ_RANGE: u64 = 512;
/// The server answers GetRecipeShort: a recipe delta whose chunks are named by short ids
/// ([`RecipePart::Short`]); the client finds those it holds by prefix, fetches the rest by
/// short id, and checks the recipe it puts together against the delta's `check`.
pub const FEATURE_SHORT_RECIPES: u64 = 1024;
/// The most bytes one ReadRange asks for.
pub const MAX_READ_RANGE: u32 = 4 << 20;
/// The most bytes a [`Context`] names.
pub const MAX_CONTEXT: u64 = 4 << 20;
/// A chunk's short id in GetChunksShort: the first 8 bytes of its digest, little-endian.
pub fn short_id(id: &Id) -> u64 {
    u64::from_le_bytes(id.digest()[..8].try_into().expect("8 bytes"))
}

/// Shortest and longest piece keys GetChunksShort carries, in bytes.
pub const SHORT_KEY_BYTES: std::ops::RangeInclusive<u8> = 4..=8;
/// The same for keys that count only in runs (GetChunksShort with `runs`), and for any keys
/// with [`FEATURE_KEYS_3`]: what a GetChunksShort may carry.
pub const RUN_KEY_BYTES: std::ops::RangeInclusive<u8> = 3..=8;
/// Bit of GetChunksShort's key length byte that says the keys count only in runs.
const RUNS_BIT: u8 = 0x80;
/// Bit of GetChunksShort's key length byte that says `olds` are short ids.
const SHORT_OLDS_BIT: u8 = 0x40;
/// Bit of GetChunksShort's key length byte that says a context follows.
const CONTEXT_BIT: u8 = 0x20;
/// Largest file ReadFile returns whole.
pub const MAX_READ_FILE: usize = 64 << 10;
/// Bytes of a piece key on the wire (GetChunksAgainst): keys are 40-bit numbers.
pub const PIECE_KEY_BYTES: usize = 5;
/// The most file bytes one FilesAgainst reply carries.
pub const MAX_FILES_AGAINST: u64 = 4 << 20;
/// Longest path on the wire, in bytes.
const MAX_PATH: usize = 4096;

/// A path relative to the export root: `/`-separated components, none empty, `.` or `..`, no NUL
/// bytes, no leading `/`. The empty path is the root. Bytes, not text: Unix names need not be
/// UTF-8. Validated when decoded, so nothing downstream sees `..` (the server still resolves
/// beneath its root, because symlinks can escape too).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct WirePath(Vec<u8>);

impl WirePath {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, ProtoError> {
        let b = bytes.into();
        let bad = |why: &str| {
            Err(ProtoError::Invalid {
                what: "path",
                why: why.into(),
            })
        };
        if b.len() > MAX_PATH {
            return bad("longer than 4096 bytes");
        }
        if b.contains(&0) {
            return bad("contains a NUL byte");
        }
        if !b.is_empty() {
            for c in b.split(|&x| x == b'/') {
                if c.is_empty() || c == b"." || c == b".." {
                    return bad(
                        "has an empty, `.` or `..` component, or a leading or trailing `/`",
                    );
                }
            }
        }
        Ok(WirePath(b))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// `self/name`. `name` must be one component: a name with a `/` (which a hostile peer could
    /// use to reach through a symlink) is refused.
    pub fn join(&self, name: &[u8]) -> Result<WirePath, ProtoError> {
        if name.contains(&b'/') {
            return Err(ProtoError::Invalid {
                what: "path",
                why: "a name contains `/`".into(),
            });
        }
        let mut p = self.0.clone();
        if !p.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(name);
        WirePath::new(p)
    }

    /// The parent path and the last component; `None` for the root.
    pub fn split_last(&self) -> Option<(WirePath, &[u8])> {
        match self.0.iter().rposition(|&b| b == b'/') {
            Some(i) => Some((WirePath(self.0[..i].to_vec()), &self.0[i + 1..])),
            None if self.0.is_empty() => None,
            None => Some((WirePath::default(), &self.0)),
        }
    }

    pub fn components(&self) -> impl Iterator<Item = &[u8]> {
        self.0.split(|&x| x == b'/').filter(|c| !c.is_empty())
    }
}

impl std::fmt::Debug for WirePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

/// For literals in tests and examples. Panics on an invalid path.
impl From<&str> for WirePath {
    fn from(s: &str) -> Self {
        WirePath::new(s.as_bytes().to_vec()).expect("invalid wire path")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileKind {
    File = 1,
    Dir = 2,
    Symlink = 3,
}

/// Attributes of a file, directory or symlink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub kind: FileKind,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    pub size: u64,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
    /// Changes whenever the content or attributes change; updates name the version they were
    /// made against.
    pub version: u64,
    /// The content id of a file, when the server knows it (used by lookaside caches).
    pub oid: Option<Id>,
    /// How long the client may trust these attributes without asking again, in milliseconds.
    pub lease_ms: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub attr: Attr,
}

/// The opening message of each side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub version: u16,
    pub features: u64,
    /// Free text for logs and error messages ("ferry 0.1.0").
    pub agent: String,
}

/// One page of a file's recipe (GETHASH).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecipePage {
    /// The version of the file the recipe describes.
    pub version: u64,
    pub total_chunks: u64,
    /// Index of the first chunk in this page.
    pub first: u64,
    pub chunks: Vec<ChunkRef>,
}

/// A piece of a recipe sent against pages the client named (GetRecipeDelta).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecipePart {
    /// The page at this index of the client's `known` list.
    Known(u32),
    /// Chunks given in full.
    Chunks(Vec<ChunkRef>),
    /// Chunks given by length and short id ([`short_id`]): only in replies to GetRecipeShort.
    Short(Vec<(u32, u64)>),
}

/// Part of a file's recipe, sent against pages the client already holds; the frame's MORE
/// flag says whether parts follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecipeDelta {
    /// The version of the file the recipe describes.
    pub version: u64,
    pub total_chunks: u64,
    /// `Recipe::check` of the whole recipe: what the client verifies its rebuilt copy against.
    pub check: [u8; 32],
    pub alg: HashAlg,
    pub parts: Vec<RecipePart>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCode {
    NotFound = 1,
    Exists = 2,
    NotDir = 3,
    IsDir = 4,
    NotEmpty = 5,
    Permission = 6,
    /// The file moved on since the version the update names.
    Conflict = 7,
    /// The path leads outside the export.
    Escape = 8,
    NoSpace = 9,
    Io = 10,
    BadRequest = 11,
    Unsupported = 12,
    /// A commit names chunks the server has neither received nor can find.
    MissingChunks = 13,
}

impl ErrorCode {
    fn from_u16(v: u16) -> Result<Self, ProtoError> {
        use ErrorCode::*;
        Ok(match v {
            1 => NotFound,
            2 => Exists,
            3 => NotDir,
            4 => IsDir,
            5 => NotEmpty,
            6 => Permission,
            7 => Conflict,
            8 => Escape,
            9 => NoSpace,
            10 => Io,
            11 => BadRequest,
            12 => Unsupported,
            13 => MissingChunks,
            v => {
                return Err(ProtoError::Invalid {
                    what: "error",
                    why: format!("unknown code {v}"),
                })
            }
        })
    }
}

/// Requests, from the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    GetAttr {
        path: WirePath,
    },
    ReadDir {
        path: WirePath,
    },
    /// GETHASH, from chunk index `from` on.
    GetRecipe {
        path: WirePath,
        from: u64,
    },
    /// GETHASH against the recipe pages the client holds (`ferry_format::pages`), named by
    /// their keys: pages the server's recipe shares with them come back as references.
    GetRecipeDelta {
        path: WirePath,
        known: Vec<u64>,
    },
    /// GetRecipeDelta, the chunks not in known pages named by short ids
    /// ([`FEATURE_SHORT_RECIPES`]).
    GetRecipeShort {
        path: WirePath,
        known: Vec<u64>,
    },
    GetChunks {
        ids: Vec<Id>,
    },
    /// READ, compressed against data the client holds: `keys` name the pieces of the client's
    /// old data (`ferry_fs` cuts them: content-defined, ~256 bytes) by 40-bit keys; the server
    /// compresses the chunks `ids` together with the pieces it finds among them as a zstd
    /// prefix. `olds` (with [`FEATURE_HISTORY`]) name old chunks the client holds whole: those
    /// in the server's history head the prefix. A list left out (`None`) is the one of the
    /// previous GetChunksAgainst of the session.
    GetChunksAgainst {
        ids: Vec<Id>,
        keys: Option<Vec<u64>>,
        olds: Option<Vec<Id>>,
    },
    /// GetChunksAgainst with less on the wire (with [`FEATURE_SHORT_IDS`]): the chunks named by
    /// the first 8 bytes of their hash (little-endian; the client verifies every chunk against
    /// its whole id), the pieces by keys of `key_bytes` bytes (4 to 8: the client picks them
    /// long enough that a false match is unlikely among the pieces at hand). With `runs` (and
    /// [`FEATURE_PIECES_2`]), a piece matches a key only where the piece before or after it
    /// matches the key before or after that key, so keys may be 3 bytes long. Answered by
    /// [`Reply::ChunksShort`].
    GetChunksShort {
        ids: Vec<u64>,
        key_bytes: u8,
        runs: bool,
        keys: Option<Vec<u64>>,
        olds: Option<OldIds>,
        /// With [`FEATURE_CONTEXT`]: bytes of the file that the client holds, for the prefix.
        context: Option<Context>,
    },
    /// CONDWRITE: which of these can the server use (answered only from data this client may read)?
    Have {
        ids: Vec<Id>,
    },
    /// TMPWRITE: chunks for a commit to come. The server verifies each against its id.
    PutChunks {
        chunks: Vec<(Id, Vec<u8>)>,
    },
    /// MKTMPFILE + COMMITTMP: make `path` the object `recipe` describes, atomically, if the file
    /// is still at `if_version` (`None`: it must not exist).
    Commit {
        path: WirePath,
        if_version: Option<u64>,
        recipe: Recipe,
        mode: u32,
        mtime_ns: i64,
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
        size: Option<u64>,
    },
    /// The target of a symlink.
    ReadLink {
        path: WirePath,
    },
    /// A small file's bytes, whole (at most 64 KiB): for a receiver with no old version of it,
    /// where a recipe and chunk ids would only add to the bytes.
    ReadFile {
        path: WirePath,
    },
    /// Bytes `offset..offset + len` of a file (fewer at its end; `len` at most
    /// [`MAX_READ_RANGE`]), with the object id of the whole file as it is now
    /// ([`FEATURE_READ_RANGE`]).
    ReadRange {
        path: WirePath,
        offset: u64,
        len: u32,
    },
    /// READDIR against the entries the client holds, named by their 24-bit keys
    /// (`entry_key`): the server sends only the entries whose keys were not named.
    ReadDirAgainst {
        path: WirePath,
        keys: Vec<u32>,
    },
    /// Files, whole, compressed together against the client's old versions of them, each
    /// named by its chunks (with [`FEATURE_HISTORY`]: those the server's history holds become
    /// the prefix). No recipes and no chunk ids travel.
    GetFilesAgainst {
        files: Vec<(WirePath, Vec<Id>)>,
    },
    /// GetFilesAgainst with the old chunks named by the first 8 bytes of their digest (with
    /// [`FEATURE_SHORT_OLDS`]).
    GetFilesShort {
        files: Vec<(WirePath, Vec<u64>)>,
    },
}

/// Bytes of the file at `path` (as the server serves it) that the client already holds:
/// `(offset, length)` ranges, in order and apart, at most [`MAX_CONTEXT`] bytes in all. Both
/// sides read them, the server from the file and the client from the chunks it holds, as the
/// head of a frame's prefix; the client verifies every chunk the frame gives, so a file that
/// changed in between costs a plain fetch, never wrong data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Context {
    pub path: WirePath,
    pub ranges: Vec<(u64, u64)>,
}

/// Old chunks a client names in GetChunksShort: by whole id, or (with [`FEATURE_SHORT_OLDS`])
/// by the first 8 bytes of the digest, little-endian, as [`short_id`] gives them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OldIds {
    Whole(Vec<Id>),
    Short(Vec<u64>),
}

/// Replies, from the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Attr(Attr),
    /// One page of entries; the frame's MORE flag says whether pages follow.
    DirEntries(Vec<DirEntry>),
    Recipe(RecipePage),
    RecipeDelta(RecipeDelta),
    /// Some of the chunks asked for; MORE says whether more follow. Absent ones are omitted.
    Chunks(Vec<(Id, Vec<u8>)>),
    /// One flag per id asked about, in order.
    Have(Vec<bool>),
    /// The chunks `ids` (those found, in the order asked), concatenated and compressed as one
    /// zstd frame whose prefix is the client's old chunks `olds` (indices into its `olds`)
    /// followed by its pieces `refs` (indices into its `keys`), each list concatenated in order.
    ChunksAgainst {
        ids: Vec<Id>,
        olds: Vec<u32>,
        refs: Vec<u32>,
        data: Vec<u8>,
    },
    /// The answer to GetChunksShort: the chunks `found` (indices into the request's ids, in
    /// the order asked), concatenated in `data`: plainly when `zstd` is false (the session's
    /// stream compresses them), else as one zstd frame whose prefix is as in
    /// [`Reply::ChunksAgainst`], headed by the request's context when `context` is true (kind 2;
    /// only with `zstd`).
    ChunksShort {
        found: Vec<u32>,
        zstd: bool,
        context: bool,
        olds: Vec<u32>,
        refs: Vec<u32>,
        data: Vec<u8>,
    },
    Ok,
    Error {
        code: ErrorCode,
        message: String,
    },
    /// A symlink's target, as stored (bytes; may be absolute or contain `..`: the receiver must
    /// never write through it).
    Link(Vec<u8>),
    /// A file's bytes (ReadFile).
    Data(Vec<u8>),
    /// A range of a file's bytes (ReadRange), and the object id of the whole file they were
    /// read from: the receiver checks the file it puts together against it.
    Range {
        oid: Id,
        data: Vec<u8>,
    },
    /// A listing against the client's entries (ReadDirAgainst): which of the keys named are
    /// keys of entries here (one flag per key, in the first frame only; empty in the rest),
    /// and the entries whose keys were not named. MORE says whether frames follow.
    DirDelta {
        present: Vec<bool>,
        entries: Vec<DirEntry>,
    },
    /// Files (GetFilesAgainst): for each file asked for, its length and object id, or `None`
    /// (not sent: fetch it by recipe); then the files sent, concatenated, as one zstd frame
    /// whose prefix is the client's old chunks `olds` (indices into all the files' lists of
    /// old chunks, concatenated in order) concatenated.
    FilesAgainst {
        files: Vec<Option<(u64, Id)>>,
        olds: Vec<u32>,
        data: Vec<u8>,
    },
}

/// Everything that travels in a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Hello(Hello),
    Request(Request),
    Reply(Reply),
    /// Server → client, request id 0: the lease on `path` is broken.
    Invalidate(WirePath),
}

mod code {
    pub const HELLO: u8 = 0x01;
    pub const GET_ATTR: u8 = 0x10;
    pub const READ_DIR: u8 = 0x11;
    pub const GET_RECIPE: u8 = 0x12;
    pub const GET_CHUNKS: u8 = 0x13;
    pub const HAVE: u8 = 0x14;
    pub const PUT_CHUNKS: u8 = 0x15;
    pub const COMMIT: u8 = 0x16;
    pub const MKDIR: u8 = 0x17;
    pub const RENAME: u8 = 0x18;
    pub const UNLINK: u8 = 0x19;
    pub const RMDIR: u8 = 0x1a;
    pub const SYMLINK: u8 = 0x1b;
    pub const SET_ATTR: u8 = 0x1c;
    pub const READ_LINK: u8 = 0x1d;
    pub const GET_RECIPE_DELTA: u8 = 0x1e;
    pub const GET_CHUNKS_AGAINST: u8 = 0x1f;
    pub const READ_FILE: u8 = 0x20;
    pub const READ_DIR_AGAINST: u8 = 0x21;
    pub const GET_FILES_AGAINST: u8 = 0x22;
    pub const GET_CHUNKS_SHORT: u8 = 0x23;
    pub const GET_FILES_SHORT: u8 = 0x24;
    pub const READ_RANGE: u8 = 0x25;
    pub const GET_RECIPE_SHORT: u8 = 0x26;
    pub const R_ATTR: u8 = 0x40;
    pub const R_DIR_ENTRIES: u8 = 0x41;
    pub const R_RECIPE: u8 = 0x42;
    pub const R_CHUNKS: u8 = 0x43;
    pub const R_HAVE: u8 = 0x44;
    pub const R_OK: u8 = 0x45;
    pub const R_ERROR: u8 = 0x46;
    pub const R_LINK: u8 = 0x47;
    pub const R_RECIPE_DELTA: u8 = 0x48;
    pub const R_CHUNKS_AGAINST: u8 = 0x49;
    pub const R_DATA: u8 = 0x4a;
    pub const R_DIR_DELTA: u8 = 0x4b;
    pub const R_FILES_AGAINST: u8 = 0x4c;
    pub const R_CHUNKS_SHORT: u8 = 0x4d;
    pub const R_RANGE: u8 = 0x4e;
    pub const INVALIDATE: u8 = 0x60;
}

fn put_path(w: &mut Writer, p: &WirePath) {
    w.bytes(&p.0);
}

fn get_path(r: &mut Reader<'_>) -> Result<WirePath, ProtoError> {
    WirePath::new(r.bytes()?.to_vec())
}

/// count · (length varint · digest)*, as in a recipe page.
fn put_chunk_refs(w: &mut Writer, cs: &[ChunkRef]) {
    w.varint(cs.len() as u64);
    for c in cs {
        w.varint(c.len as u64);
        w.0.extend_from_slice(c.id.digest());
    }
}

/// path · count varint · page key u64 × count (GetRecipeDelta, GetRecipeShort).
fn put_known(w: &mut Writer, path: &WirePath, known: &[u64]) {
    put_path(w, path);
    w.varint(known.len() as u64);
    for k in known {
        w.u64(*k);
    }
}

/// A chunk length from a recipe: 1 to `MAX_CHUNK_LIMIT`.
fn chunk_len(len: u64) -> Result<u32, ProtoError> {
    if len == 0 || len > MAX_CHUNK_LIMIT as u64 {
        return Err(ProtoError::Invalid {
            what: "recipe page",
            why: format!("chunk length {len}"),
        });
    }
    Ok(len as u32)
}

fn get_chunk_refs(r: &mut Reader<'_>, alg: HashAlg) -> Result<Vec<ChunkRef>, ProtoError> {
    let n = r.count(33)?;
    let mut chunks = Vec::with_capacity(n);
    for _ in 0..n {
        let len = chunk_len(r.varint()?)?;
        let mut d = [0u8; 32];
        d.copy_from_slice(r.take_exact(32)?);
        chunks.push(ChunkRef {
            id: Id::from_parts(alg, d),
            len,
        });
    }
    Ok(chunks)
}

fn put_attr(w: &mut Writer, a: &Attr) {
    w.u8(a.kind as u8);
    w.u32(a.mode);
    w.u64(a.size);
    w.i64(a.mtime_ns);
    w.u64(a.version);
    w.opt_id(a.oid.as_ref());
    w.u32(a.lease_ms);
}

fn get_attr(r: &mut Reader<'_>) -> Result<Attr, ProtoError> {
    let kind = match r.u8()? {
        1 => FileKind::File,
        2 => FileKind::Dir,
        3 => FileKind::Symlink,
        k => {
            return Err(ProtoError::Invalid {
                what: "attributes",
                why: format!("file kind {k}"),
            })
        }
    };
    Ok(Attr {
        kind,
        mode: r.u32()?,
        size: r.u64()?,
        mtime_ns: r.i64()?,
        version: r.u64()?,
        oid: r.opt_id()?,
        lease_ms: r.u32()?,
    })
}

fn put_ids(w: &mut Writer, ids: &[Id]) {
    w.varint(ids.len() as u64);
    for id in ids {
        w.id(id);
    }
}

fn get_ids(r: &mut Reader<'_>) -> Result<Vec<Id>, ProtoError> {
    let n = r.count(ferry_format::TAGGED_ID_BYTES)?;
    (0..n).map(|_| r.id()).collect()
}

/// path · count varint · (gap varint · length varint) × count, each gap from the end of the
/// range before (from 0 for the first).
fn get_context(r: &mut Reader<'_>) -> Result<Context, ProtoError> {
    let path = get_path(r)?;
    let n = r.count(2)?;
    let bad = |why: &str| ProtoError::Invalid {
        what: "context",
        why: why.into(),
    };
    let (mut end, mut total) = (0u64, 0u64);
    let mut ranges = Vec::with_capacity(n);
    for _ in 0..n {
        let offset = end.checked_add(r.varint()?).ok_or_else(|| bad("offset"))?;
        let len = r.varint()?;
        total = total.saturating_add(len);
        if total > MAX_CONTEXT {
            return Err(bad("more bytes than MAX_CONTEXT"));
        }
        end = offset.checked_add(len).ok_or_else(|| bad("offset"))?;
        ranges.push((offset, len));
    }
    Ok(Context { path, ranges })
}

/// count varint · short id (u64le) × count.
fn put_short_ids(w: &mut Writer, ids: &[u64]) {
    w.varint(ids.len() as u64);
    for id in ids {
        w.u64(*id);
    }
}

fn get_short_ids(r: &mut Reader<'_>) -> Result<Vec<u64>, ProtoError> {
    let n = r.count(8)?;
    (0..n).map(|_| r.u64()).collect()
}

/// count varint · key × count, each key its first `bytes` bytes, little-endian.
fn put_keys(w: &mut Writer, keys: &[u64], bytes: usize) {
    w.varint(keys.len() as u64);
    for k in keys {
        w.0.extend_from_slice(&k.to_le_bytes()[..bytes]);
    }
}

fn get_keys(r: &mut Reader<'_>, bytes: usize) -> Result<Vec<u64>, ProtoError> {
    let n = r.count(bytes)?;
    (0..n)
        .map(|_| {
            let mut k = [0u8; 8];
            k[..bytes].copy_from_slice(r.take_exact(bytes)?);
            Ok(u64::from_le_bytes(k))
        })
        .collect()
}

fn put_chunks(w: &mut Writer, cs: &[(Id, Vec<u8>)]) {
    w.varint(cs.len() as u64);
    for (id, data) in cs {
        w.id(id);
        w.bytes(data);
    }
}

fn get_chunks(r: &mut Reader<'_>) -> Result<Vec<(Id, Vec<u8>)>, ProtoError> {
    let n = r.count(ferry_format::TAGGED_ID_BYTES + 1)?;
    (0..n).map(|_| Ok((r.id()?, r.bytes()?.to_vec()))).collect()
}

/// count varint · index varint × count.
fn put_indices(w: &mut Writer, list: &[u32]) {
    w.varint(list.len() as u64);
    for i in list {
        w.varint(*i as u64);
    }
}

fn get_indices(r: &mut Reader<'_>) -> Result<Vec<u32>, ProtoError> {
    let n = r.count(1)?;
    (0..n)
        .map(|_| {
            u32::try_from(r.varint()?).map_err(|_| ProtoError::Invalid {
                what: "index list",
                why: "index over 2^32".into(),
            })
        })
        .collect()
}

/// count varint · bitmap, bit i of byte i/8 for flag i.
fn put_bits(w: &mut Writer, flags: &[bool]) {
    w.varint(flags.len() as u64);
    let mut bits = vec![0u8; flags.len().div_ceil(8)];
    for (i, &f) in flags.iter().enumerate() {
        if f {
            bits[i / 8] |= 1 << (i % 8);
        }
    }
    w.0.extend_from_slice(&bits);
}

fn get_bits(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<bool>, ProtoError> {
    let n = r.varint()?;
    if n > r.rest_len() as u64 * 8 {
        return Err(ProtoError::CountTooLarge {
            what,
            count: n,
            available: r.rest_len(),
        });
    }
    let n = n as usize;
    let bits = r.take_exact(n.div_ceil(8))?;
    Ok((0..n).map(|i| bits[i / 8] >> (i % 8) & 1 == 1).collect())
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

fn put_opt<T>(w: &mut Writer, v: Option<T>, f: impl FnOnce(&mut Writer, T)) {
    match v {
        None => w.u8(0),
        Some(v) => {
            w.u8(1);
            f(w, v);
        }
    }
}

fn get_opt<T>(
    r: &mut Reader<'_>,
    f: impl FnOnce(&mut Reader<'_>) -> Result<T, ProtoError>,
) -> Result<Option<T>, ProtoError> {
    match r.u8()? {
        0 => Ok(None),
        1 => f(r).map(Some),
        t => Err(ProtoError::Invalid {
            what: "option",
            why: format!("tag {t}"),
        }),
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
                put_path(&mut w, p);
                code::INVALIDATE
            }
            Message::Request(q) => match q {
                Request::GetAttr { path } => {
                    put_path(&mut w, path);
                    code::GET_ATTR
                }
                Request::ReadDir { path } => {
                    put_path(&mut w, path);
                    code::READ_DIR
                }
                Request::GetRecipe { path, from } => {
                    put_path(&mut w, path);
                    w.varint(*from);
                    code::GET_RECIPE
                }
                Request::GetRecipeDelta { path, known } => {
                    put_known(&mut w, path, known);
                    code::GET_RECIPE_DELTA
                }
                Request::GetRecipeShort { path, known } => {
                    put_known(&mut w, path, known);
                    code::GET_RECIPE_SHORT
                }
                Request::GetChunks { ids } => {
                    put_ids(&mut w, ids);
                    code::GET_CHUNKS
                }
                Request::GetChunksAgainst { ids, keys, olds } => {
                    put_ids(&mut w, ids);
                    put_opt(&mut w, keys.as_ref(), |w, k| {
                        put_keys(w, k, PIECE_KEY_BYTES)
                    });
                    put_opt(&mut w, olds.as_ref(), |w, olds| put_ids(w, olds));
                    code::GET_CHUNKS_AGAINST
                }
                Request::GetChunksShort {
                    ids,
                    key_bytes,
                    runs,
                    keys,
                    olds,
                    context,
                } => {
                    put_short_ids(&mut w, ids);
                    let short = matches!(olds, Some(OldIds::Short(_)));
                    let flags = [
                        (*runs, RUNS_BIT),
                        (short, SHORT_OLDS_BIT),
                        (context.is_some(), CONTEXT_BIT),
                    ];
                    w.u8(flags
                        .iter()
                        .filter(|f| f.0)
                        .fold(*key_bytes, |b, f| b | f.1));
                    let n = (*key_bytes as usize).min(8);
                    put_opt(&mut w, keys.as_ref(), |w, k| put_keys(w, k, n));
                    put_opt(&mut w, olds.as_ref(), |w, olds| match olds {
                        OldIds::Whole(ids) => put_ids(w, ids),
                        OldIds::Short(ids) => put_short_ids(w, ids),
                    });
                    if let Some(c) = context {
                        put_path(&mut w, &c.path);
                        w.varint(c.ranges.len() as u64);
                        let mut end = 0;
                        for &(offset, len) in &c.ranges {
                            w.varint(offset - end);
                            w.varint(len);
                            end = offset + len;
                        }
                    }
                    code::GET_CHUNKS_SHORT
                }
                Request::Have { ids } => {
                    put_ids(&mut w, ids);
                    code::HAVE
                }
                Request::PutChunks { chunks } => {
                    put_chunks(&mut w, chunks);
                    code::PUT_CHUNKS
                }
                Request::Commit {
                    path,
                    if_version,
                    recipe,
                    mode,
                    mtime_ns,
                } => {
                    put_path(&mut w, path);
                    put_opt(&mut w, *if_version, |w, v| w.u64(v));
                    w.u32(*mode);
                    w.i64(*mtime_ns);
                    w.0.extend_from_slice(&recipe.encode());
                    code::COMMIT
                }
                Request::Mkdir { path, mode } => {
                    put_path(&mut w, path);
                    w.u32(*mode);
                    code::MKDIR
                }
                Request::Rename { from, to } => {
                    put_path(&mut w, from);
                    put_path(&mut w, to);
                    code::RENAME
                }
                Request::Unlink { path } => {
                    put_path(&mut w, path);
                    code::UNLINK
                }
                Request::Rmdir { path } => {
                    put_path(&mut w, path);
                    code::RMDIR
                }
                Request::Symlink { path, target } => {
                    put_path(&mut w, path);
                    w.bytes(target);
                    code::SYMLINK
                }
                Request::SetAttr {
                    path,
                    mode,
                    mtime_ns,
                    size,
                } => {
                    put_path(&mut w, path);
                    put_opt(&mut w, *mode, |w, v| w.u32(v));
                    put_opt(&mut w, *mtime_ns, |w, v| w.i64(v));
                    put_opt(&mut w, *size, |w, v| w.u64(v));
                    code::SET_ATTR
                }
                Request::ReadLink { path } => {
                    put_path(&mut w, path);
                    code::READ_LINK
                }
                Request::ReadFile { path } => {
                    put_path(&mut w, path);
                    code::READ_FILE
                }
                Request::ReadRange { path, offset, len } => {
                    put_path(&mut w, path);
                    w.varint(*offset);
                    w.varint(*len as u64);
                    code::READ_RANGE
                }
                Request::ReadDirAgainst { path, keys } => {
                    put_path(&mut w, path);
                    w.varint(keys.len() as u64);
                    for k in keys {
                        w.0.extend_from_slice(&k.to_le_bytes()[..3]);
                    }
                    code::READ_DIR_AGAINST
                }
                Request::GetFilesAgainst { files } => {
                    w.varint(files.len() as u64);
                    for (path, olds) in files {
                        put_path(&mut w, path);
                        put_ids(&mut w, olds);
                    }
                    code::GET_FILES_AGAINST
                }
                Request::GetFilesShort { files } => {
                    w.varint(files.len() as u64);
                    for (path, olds) in files {
                        put_path(&mut w, path);
                        put_short_ids(&mut w, olds);
                    }
                    code::GET_FILES_SHORT
                }
            },
            Message::Reply(r) => match r {
                Reply::Attr(a) => {
                    put_attr(&mut w, a);
                    code::R_ATTR
                }
                Reply::DirEntries(es) => {
                    put_entries(&mut w, es);
                    code::R_DIR_ENTRIES
                }
                Reply::Recipe(p) => {
                    w.u64(p.version);
                    w.u64(p.total_chunks);
                    w.u64(p.first);
                    let alg = p.chunks.first().map_or(HashAlg::Blake3, |c| c.id.alg());
                    w.u8(alg.tag());
                    put_chunk_refs(&mut w, &p.chunks);
                    code::R_RECIPE
                }
                Reply::RecipeDelta(d) => {
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
                                put_chunk_refs(&mut w, cs);
                            }
                            RecipePart::Short(cs) => {
                                w.u8(2);
                                w.varint(cs.len() as u64);
                                for (len, short) in cs {
                                    w.varint(*len as u64);
                                    w.u64(*short);
                                }
                            }
                        }
                    }
                    code::R_RECIPE_DELTA
                }
                Reply::Chunks(cs) => {
                    put_chunks(&mut w, cs);
                    code::R_CHUNKS
                }
                Reply::ChunksAgainst {
                    ids,
                    olds,
                    refs,
                    data,
                } => {
                    put_ids(&mut w, ids);
                    put_indices(&mut w, olds);
                    put_indices(&mut w, refs);
                    w.bytes(data);
                    code::R_CHUNKS_AGAINST
                }
                Reply::ChunksShort {
                    found,
                    zstd,
                    context,
                    olds,
                    refs,
                    data,
                } => {
                    put_indices(&mut w, found);
                    w.u8(if *context { 2 } else { *zstd as u8 });
                    put_indices(&mut w, olds);
                    put_indices(&mut w, refs);
                    w.bytes(data);
                    code::R_CHUNKS_SHORT
                }
                Reply::Have(flags) => {
                    put_bits(&mut w, flags);
                    code::R_HAVE
                }
                Reply::DirDelta { present, entries } => {
                    put_bits(&mut w, present);
                    put_entries(&mut w, entries);
                    code::R_DIR_DELTA
                }
                Reply::FilesAgainst { files, olds, data } => {
                    w.varint(files.len() as u64);
                    for f in files {
                        put_opt(&mut w, f.as_ref(), |w, (len, oid)| {
                            w.u64(*len);
                            w.id(oid);
                        });
                    }
                    put_indices(&mut w, olds);
                    w.bytes(data);
                    code::R_FILES_AGAINST
                }
                Reply::Ok => code::R_OK,
                Reply::Error { code: c, message } => {
                    w.u16(*c as u16);
                    w.bytes(message.as_bytes());
                    code::R_ERROR
                }
                Reply::Link(target) => {
                    w.bytes(target);
                    code::R_LINK
                }
                Reply::Data(d) => {
                    w.bytes(d);
                    code::R_DATA
                }
                Reply::Range { oid, data } => {
                    w.id(oid);
                    w.bytes(data);
                    code::R_RANGE
                }
            },
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
            code::INVALIDATE => Message::Invalidate(get_path(&mut r)?),
            code::GET_ATTR => Message::Request(Request::GetAttr {
                path: get_path(&mut r)?,
            }),
            code::READ_DIR => Message::Request(Request::ReadDir {
                path: get_path(&mut r)?,
            }),
            code::GET_RECIPE => Message::Request(Request::GetRecipe {
                path: get_path(&mut r)?,
                from: r.varint()?,
            }),
            code::GET_RECIPE_DELTA | code::GET_RECIPE_SHORT => {
                let path = get_path(&mut r)?;
                let n = r.count(8)?;
                let known = (0..n).map(|_| r.u64()).collect::<Result<_, _>>()?;
                Message::Request(match f.msg_type {
                    code::GET_RECIPE_SHORT => Request::GetRecipeShort { path, known },
                    _ => Request::GetRecipeDelta { path, known },
                })
            }
            code::GET_CHUNKS => Message::Request(Request::GetChunks {
                ids: get_ids(&mut r)?,
            }),
            code::GET_CHUNKS_AGAINST => {
                let ids = get_ids(&mut r)?;
                let keys = get_opt(&mut r, |r| get_keys(r, PIECE_KEY_BYTES))?;
                let olds = get_opt(&mut r, get_ids)?;
                Message::Request(Request::GetChunksAgainst { ids, keys, olds })
            }
            code::GET_CHUNKS_SHORT => {
                let ids = get_short_ids(&mut r)?;
                let b = r.u8()?;
                let (runs, short) = (b & RUNS_BIT != 0, b & SHORT_OLDS_BIT != 0);
                let key_bytes = b & !(RUNS_BIT | SHORT_OLDS_BIT | CONTEXT_BIT);
                // Whether 3 bytes without runs may be used is the server's to judge (it needs
                // FEATURE_KEYS_3).
                if !RUN_KEY_BYTES.contains(&key_bytes) {
                    return Err(ProtoError::Invalid {
                        what: "piece keys",
                        why: format!("{key_bytes} bytes a key (runs: {runs})"),
                    });
                }
                let keys = get_opt(&mut r, |r| get_keys(r, key_bytes as usize))?;
                let olds = get_opt(&mut r, |r| {
                    Ok(if short {
                        OldIds::Short(get_short_ids(r)?)
                    } else {
                        OldIds::Whole(get_ids(r)?)
                    })
                })?;
                let context = if b & CONTEXT_BIT != 0 {
                    Some(get_context(&mut r)?)
                } else {
                    None
                };
                Message::Request(Request::GetChunksShort {
                    ids,
                    key_bytes,
                    runs,
                    keys,
                    olds,
                    context,
                })
            }
            code::HAVE => Message::Request(Request::Have {
                ids: get_ids(&mut r)?,
            }),
            code::PUT_CHUNKS => Message::Request(Request::PutChunks {
                chunks: get_chunks(&mut r)?,
            }),
            code::COMMIT => {
                let path = get_path(&mut r)?;
                let if_version = get_opt(&mut r, |r| r.u64())?;
                let mode = r.u32()?;
                let mtime_ns = r.i64()?;
                let recipe = Recipe::decode(r.rest())?;
                Message::Request(Request::Commit {
                    path,
                    if_version,
                    recipe,
                    mode,
                    mtime_ns,
                })
            }
            code::MKDIR => Message::Request(Request::Mkdir {
                path: get_path(&mut r)?,
                mode: r.u32()?,
            }),
            code::RENAME => Message::Request(Request::Rename {
                from: get_path(&mut r)?,
                to: get_path(&mut r)?,
            }),
            code::UNLINK => Message::Request(Request::Unlink {
                path: get_path(&mut r)?,
            }),
            code::RMDIR => Message::Request(Request::Rmdir {
                path: get_path(&mut r)?,
            }),
            code::SYMLINK => Message::Request(Request::Symlink {
                path: get_path(&mut r)?,
                target: r.bytes()?.to_vec(),
            }),
            code::SET_ATTR => Message::Request(Request::SetAttr {
                path: get_path(&mut r)?,
                mode: get_opt(&mut r, |r| r.u32())?,
                mtime_ns: get_opt(&mut r, |r| r.i64())?,
                size: get_opt(&mut r, |r| r.u64())?,
            }),
            code::READ_LINK => Message::Request(Request::ReadLink {
                path: get_path(&mut r)?,
            }),
            code::R_LINK => Message::Reply(Reply::Link(r.bytes()?.to_vec())),
            code::R_DATA => Message::Reply(Reply::Data(r.bytes()?.to_vec())),
            code::READ_FILE => Message::Request(Request::ReadFile {
                path: get_path(&mut r)?,
            }),
            code::READ_RANGE => Message::Request(Request::ReadRange {
                path: get_path(&mut r)?,
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
            }),
            code::R_RANGE => Message::Reply(Reply::Range {
                oid: r.id()?,
                data: r.bytes()?.to_vec(),
            }),
            code::R_ATTR => Message::Reply(Reply::Attr(get_attr(&mut r)?)),
            code::R_DIR_ENTRIES => Message::Reply(Reply::DirEntries(get_entries(&mut r)?)),
            code::R_DIR_DELTA => Message::Reply(Reply::DirDelta {
                present: get_bits(&mut r, "dir delta")?,
                entries: get_entries(&mut r)?,
            }),
            code::GET_FILES_AGAINST => {
                // A file is at least a path length byte and an id count byte.
                let n = r.count(2)?;
                let files = (0..n)
                    .map(|_| Ok((get_path(&mut r)?, get_ids(&mut r)?)))
                    .collect::<Result<_, ProtoError>>()?;
                Message::Request(Request::GetFilesAgainst { files })
            }
            code::GET_FILES_SHORT => {
                let n = r.count(2)?;
                let files = (0..n)
                    .map(|_| Ok((get_path(&mut r)?, get_short_ids(&mut r)?)))
                    .collect::<Result<_, ProtoError>>()?;
                Message::Request(Request::GetFilesShort { files })
            }
            code::R_FILES_AGAINST => {
                let n = r.count(1)?;
                let files = (0..n)
                    .map(|_| get_opt(&mut r, |r| Ok((r.u64()?, r.id()?))))
                    .collect::<Result<_, ProtoError>>()?;
                Message::Reply(Reply::FilesAgainst {
                    files,
                    olds: get_indices(&mut r)?,
                    data: r.bytes()?.to_vec(),
                })
            }
            code::READ_DIR_AGAINST => {
                let path = get_path(&mut r)?;
                let n = r.count(3)?;
                let keys = (0..n)
                    .map(|_| {
                        let k = r.take_exact(3)?;
                        Ok(u32::from_le_bytes([k[0], k[1], k[2], 0]))
                    })
                    .collect::<Result<_, ProtoError>>()?;
                Message::Request(Request::ReadDirAgainst { path, keys })
            }
            code::R_RECIPE => {
                let (version, total_chunks, first) = (r.u64()?, r.u64()?, r.u64()?);
                let alg = HashAlg::from_tag(r.u8()?)?;
                let chunks = get_chunk_refs(&mut r, alg)?;
                Message::Reply(Reply::Recipe(RecipePage {
                    version,
                    total_chunks,
                    first,
                    chunks,
                }))
            }
            code::R_RECIPE_DELTA => {
                let (version, total_chunks) = (r.u64()?, r.u64()?);
                let check: [u8; 32] = r.take_exact(32)?.try_into().unwrap();
                let alg = HashAlg::from_tag(r.u8()?)?;
                let n = r.count(2)?;
                let mut parts = Vec::with_capacity(n);
                for _ in 0..n {
                    parts.push(match r.u8()? {
                        0 => RecipePart::Known(u32::try_from(r.varint()?).map_err(|_| {
                            ProtoError::Invalid {
                                what: "recipe delta",
                                why: "page index over 2^32".into(),
                            }
                        })?),
                        1 => RecipePart::Chunks(get_chunk_refs(&mut r, alg)?),
                        2 => {
                            let n = r.count(9)?;
                            let mut cs = Vec::with_capacity(n);
                            for _ in 0..n {
                                cs.push((chunk_len(r.varint()?)?, r.u64()?));
                            }
                            RecipePart::Short(cs)
                        }
                        t => {
                            return Err(ProtoError::Invalid {
                                what: "recipe delta",
                                why: format!("unknown part {t}"),
                            })
                        }
                    });
                }
                Message::Reply(Reply::RecipeDelta(RecipeDelta {
                    version,
                    total_chunks,
                    check,
                    alg,
                    parts,
                }))
            }
            code::R_CHUNKS => Message::Reply(Reply::Chunks(get_chunks(&mut r)?)),
            code::R_CHUNKS_AGAINST => {
                let ids = get_ids(&mut r)?;
                let olds = get_indices(&mut r)?;
                let refs = get_indices(&mut r)?;
                let data = r.bytes()?.to_vec();
                Message::Reply(Reply::ChunksAgainst {
                    ids,
                    olds,
                    refs,
                    data,
                })
            }
            code::R_CHUNKS_SHORT => {
                let found = get_indices(&mut r)?;
                let (zstd, context) = match r.u8()? {
                    0 => (false, false),
                    1 => (true, false),
                    2 => (true, true),
                    t => {
                        return Err(ProtoError::Invalid {
                            what: "chunks reply",
                            why: format!("data kind {t}"),
                        })
                    }
                };
                let olds = get_indices(&mut r)?;
                let refs = get_indices(&mut r)?;
                let data = r.bytes()?.to_vec();
                Message::Reply(Reply::ChunksShort {
                    found,
                    zstd,
                    context,
                    olds,
                    refs,
                    data,
                })
            }
            code::R_HAVE => Message::Reply(Reply::Have(get_bits(&mut r, "have reply")?)),
            code::R_OK => Message::Reply(Reply::Ok),
            code::R_ERROR => Message::Reply(Reply::Error {
                code: ErrorCode::from_u16(r.u16()?)?,
                message: String::from_utf8_lossy(r.bytes()?).into_owned(),
            }),
            t => return Err(ProtoError::UnknownType(t)),
        };
        r.finish()?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FrameDecoder;
    use proptest::prelude::*;

    fn id(n: u8) -> Id {
        Id::from_parts(HashAlg::Blake3, [n; 32])
    }

    fn attr() -> Attr {
        Attr {
            kind: FileKind::File,
            mode: 0o644,
            size: 12345,
            mtime_ns: -5,
            version: 9,
            oid: Some(id(3)),
            lease_ms: 60_000,
        }
    }

    /// One of every message.
    pub(crate) fn samples() -> Vec<Message> {
        let recipe = Recipe::from_chunks(
            HashAlg::Blake3,
            vec![
                ChunkRef {
                    id: id(1),
                    len: 8192,
                },
                ChunkRef { id: id(2), len: 7 },
            ],
        )
        .unwrap();
        vec![
            Message::Hello(Hello {
                version: VERSION,
                features: FEATURES,
                agent: "ferry test".into(),
            }),
            Message::Invalidate("a/b".into()),
            Message::Request(Request::GetAttr { path: "".into() }),
            Message::Request(Request::ReadDir { path: "src".into() }),
            Message::Request(Request::GetRecipe {
                path: "big.iso".into(),
                from: 1000,
            }),
            Message::Request(Request::GetRecipeDelta {
                path: "big.iso".into(),
                known: vec![1, u64::MAX],
            }),
            Message::Request(Request::GetChunks {
                ids: vec![id(1), id(2)],
            }),
            Message::Request(Request::Have { ids: vec![id(4)] }),
            Message::Request(Request::PutChunks {
                chunks: vec![(id(5), b"hello".to_vec()), (id(6), vec![])],
            }),
            Message::Request(Request::Commit {
                path: "f".into(),
                if_version: Some(3),
                recipe: recipe.clone(),
                mode: 0o600,
                mtime_ns: 1,
            }),
            Message::Request(Request::Commit {
                path: "g".into(),
                if_version: None,
                recipe: Recipe::new(HashAlg::Blake3),
                mode: 0o600,
                mtime_ns: 1,
            }),
            Message::Request(Request::Mkdir {
                path: "d".into(),
                mode: 0o755,
            }),
            Message::Request(Request::Rename {
                from: "a".into(),
                to: "b/c".into(),
            }),
            Message::Request(Request::Unlink { path: "a".into() }),
            Message::Request(Request::Rmdir { path: "d".into() }),
            Message::Request(Request::Symlink {
                path: "l".into(),
                target: b"../x".to_vec(),
            }),
            Message::Request(Request::SetAttr {
                path: "f".into(),
                mode: Some(0o700),
                mtime_ns: None,
                size: Some(0),
            }),
            Message::Reply(Reply::Attr(attr())),
            Message::Reply(Reply::DirEntries(vec![
                DirEntry {
                    name: b"x".to_vec(),
                    attr: attr(),
                },
                DirEntry {
                    name: vec![0xff, 0xfe],
                    attr: Attr {
                        kind: FileKind::Dir,
                        oid: None,
                        ..attr()
                    },
                },
            ])),
            Message::Reply(Reply::Recipe(RecipePage {
                version: 9,
                total_chunks: 2,
                first: 0,
                chunks: recipe.chunks().to_vec(),
            })),
            Message::Reply(Reply::RecipeDelta(RecipeDelta {
                version: 9,
                total_chunks: 40,
                check: [7; 32],
                alg: HashAlg::Blake3,
                parts: vec![
                    RecipePart::Known(3),
                    RecipePart::Chunks(recipe.chunks().to_vec()),
                    RecipePart::Known(0),
                ],
            })),
            Message::Reply(Reply::Chunks(vec![(id(1), vec![1, 2, 3])])),
            Message::Request(Request::GetChunksAgainst {
                ids: vec![id(1), id(2)],
                keys: Some(vec![0, (1 << 40) - 1]),
                olds: None,
            }),
            Message::Request(Request::GetChunksAgainst {
                ids: vec![id(1)],
                keys: Some(vec![]),
                olds: Some(vec![id(3)]),
            }),
            Message::Reply(Reply::ChunksAgainst {
                ids: vec![id(2)],
                olds: vec![0],
                refs: vec![1, 0, 300],
                data: vec![0x28, 0xb5, 0x2f, 0xfd],
            }),
            Message::Request(Request::GetChunksShort {
                ids: vec![1],
                key_bytes: 3,
                runs: true,
                keys: Some(vec![0xff_ffff, 0]),
                olds: None,
                context: None,
            }),
            Message::Request(Request::GetChunksShort {
                ids: vec![0, u64::MAX],
                key_bytes: 4,
                runs: false,
                keys: Some(vec![0, (1 << 32) - 1]),
                olds: Some(OldIds::Whole(vec![id(3)])),
                context: None,
            }),
            Message::Request(Request::GetChunksShort {
                ids: vec![0],
                key_bytes: 3,
                runs: true,
                keys: None,
                olds: Some(OldIds::Short(vec![5, u64::MAX])),
                context: None,
            }),
            Message::Request(Request::GetFilesShort {
                files: vec![("f".into(), vec![1, 2]), ("g".into(), vec![])],
            }),
            Message::Request(Request::GetChunksShort {
                ids: vec![3],
                key_bytes: 4,
                runs: false,
                keys: Some(vec![]),
                olds: None,
                context: Some(Context {
                    path: "d/f".into(),
                    ranges: vec![(0, 10), (20, 5), (MAX_CONTEXT, MAX_CONTEXT - 15)],
                }),
            }),
            Message::Reply(Reply::ChunksShort {
                found: vec![0],
                zstd: true,
                context: true,
                olds: vec![],
                refs: vec![],
                data: vec![1],
            }),
            Message::Request(Request::GetChunksShort {
                ids: vec![7],
                key_bytes: 8,
                runs: false,
                keys: Some(vec![u64::MAX]),
                olds: None,
                context: None,
            }),
            Message::Request(Request::GetChunksShort {
                ids: vec![7],
                key_bytes: 6,
                runs: false,
                keys: None,
                olds: None,
                context: None,
            }),
            Message::Reply(Reply::ChunksShort {
                found: vec![0, 2],
                zstd: true,
                context: false,
                olds: vec![1],
                refs: vec![1, 0, 300],
                data: vec![0x28, 0xb5, 0x2f, 0xfd],
            }),
            Message::Reply(Reply::ChunksShort {
                found: vec![],
                zstd: false,
                context: false,
                olds: vec![],
                refs: vec![],
                data: vec![],
            }),
            Message::Reply(Reply::Have(vec![
                true, false, true, true, false, false, false, false, true,
            ])),
            Message::Reply(Reply::Ok),
            Message::Request(Request::ReadLink { path: "l".into() }),
            Message::Reply(Reply::Link(b"../target".to_vec())),
            Message::Request(Request::ReadFile { path: "s".into() }),
            Message::Request(Request::ReadDirAgainst {
                path: "d".into(),
                keys: vec![0, 0xff_ffff, 0x12_3456],
            }),
            Message::Reply(Reply::DirDelta {
                present: vec![true, false, true],
                entries: vec![],
            }),
            Message::Request(Request::GetFilesAgainst {
                files: vec![("f".into(), vec![id(1)]), ("g".into(), vec![])],
            }),
            Message::Reply(Reply::FilesAgainst {
                files: vec![Some((5, id(2))), None],
                olds: vec![0, 2],
                data: vec![0x28, 0xb5, 0x2f, 0xfd],
            }),
            Message::Reply(Reply::Data(b"small".to_vec())),
            Message::Request(Request::GetRecipeShort {
                path: "f".into(),
                known: vec![1, u64::MAX],
            }),
            Message::Reply(Reply::RecipeDelta(RecipeDelta {
                version: 3,
                total_chunks: 4,
                check: [7; 32],
                alg: HashAlg::Blake3,
                parts: vec![
                    RecipePart::Known(0),
                    RecipePart::Short(vec![(8192, 0x0807_0605_0403_0201), (1, 0)]),
                ],
            })),
            Message::Request(Request::ReadRange {
                path: "big".into(),
                offset: 4 << 20,
                len: MAX_READ_RANGE,
            }),
            Message::Reply(Reply::Range {
                oid: id(3),
                data: b"part".to_vec(),
            }),
            Message::Reply(Reply::Error {
                code: ErrorCode::Conflict,
                message: "changed since version 3".into(),
            }),
        ]
    }

    #[test]
    fn every_message_round_trips() {
        for (i, m) in samples().into_iter().enumerate() {
            let bytes = m.encode(i as u32 + 1, true).unwrap();
            let mut d = FrameDecoder::new();
            d.feed(&bytes);
            let f = d.next_frame().unwrap().unwrap();
            assert_eq!(f.request_id, i as u32 + 1);
            assert_eq!(Message::decode(&f).unwrap(), m);
        }
    }

    #[test]
    fn truncated_bodies_are_errors() {
        for m in samples() {
            let f = m.to_frame(1);
            for cut in 0..f.body.len() {
                let short = Frame {
                    body: f.body[..cut].to_vec(),
                    ..f.clone()
                };
                // Some prefixes of variable-length lists are themselves valid; none may panic,
                // and none may decode to the original message.
                if let Ok(d) = Message::decode(&short) {
                    assert_ne!(d, m);
                }
            }
        }
    }

    #[test]
    fn exact_bytes_of_a_request_and_a_reply() {
        let b = Message::Request(Request::GetAttr { path: "ab".into() })
            .encode(5, false)
            .unwrap();
        assert_eq!(b, [9, 0, 0, 0, 0x10, 0, 5, 0, 0, 0, 2, b'a', b'b']);
        let b = Message::Reply(Reply::Have(vec![true, false, true]))
            .encode(5, false)
            .unwrap();
        assert_eq!(b, [8, 0, 0, 0, 0x44, 0, 5, 0, 0, 0, 3, 0b101]);
        let b = Message::Hello(Hello {
            version: 1,
            features: 0,
            agent: "x".into(),
        })
        .encode(0, false)
        .unwrap();
        let mut want = vec![23, 0, 0, 0, 0x01, 0, 0, 0, 0, 0];
        want.extend_from_slice(b"FERRY");
        want.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, b'x']);
        assert_eq!(b, want);
        let b = Message::Request(Request::GetRecipeDelta {
            path: "f".into(),
            known: vec![0x0102],
        })
        .encode(2, false)
        .unwrap();
        assert_eq!(
            b,
            [17, 0, 0, 0, 0x1e, 0, 2, 0, 0, 0, 1, b'f', 1, 2, 1, 0, 0, 0, 0, 0, 0]
        );
        let b = Message::Reply(Reply::RecipeDelta(RecipeDelta {
            version: 1,
            total_chunks: 2,
            check: [0xcc; 32],
            alg: HashAlg::Blake3,
            parts: vec![
                RecipePart::Known(5),
                RecipePart::Chunks(vec![ChunkRef {
                    id: Id::from_parts(HashAlg::Blake3, [0xdd; 32]),
                    len: 300,
                }]),
            ],
        }))
        .encode(2, false)
        .unwrap();
        let mut want = vec![94, 0, 0, 0, 0x48, 0, 2, 0, 0, 0];
        want.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
        want.extend_from_slice(&[0xcc; 32]);
        want.extend_from_slice(&[HashAlg::Blake3.tag(), 2, 0, 5, 1, 1, 0xac, 0x02]);
        want.extend_from_slice(&[0xdd; 32]);
        assert_eq!(b, want);
        let id = |b| Id::from_parts(HashAlg::Blake3, [b; 32]);
        let b = Message::Request(Request::GetChunksAgainst {
            ids: vec![id(0xaa)],
            keys: Some(vec![0x05_0403_0201]),
            olds: Some(vec![id(0xbb)]),
        })
        .encode(3, false)
        .unwrap();
        let mut want = vec![82, 0, 0, 0, 0x1f, 0, 3, 0, 0, 0, 1, HashAlg::Blake3.tag()];
        want.extend_from_slice(&[0xaa; 32]);
        want.extend_from_slice(&[1, 1, 1, 2, 3, 4, 5, 1, 1, HashAlg::Blake3.tag()]);
        want.extend_from_slice(&[0xbb; 32]);
        assert_eq!(b, want);
        let b = Message::Reply(Reply::ChunksAgainst {
            ids: vec![id(0xaa)],
            olds: vec![0],
            refs: vec![300],
            data: vec![9],
        })
        .encode(3, false)
        .unwrap();
        let mut want = vec![47, 0, 0, 0, 0x49, 0, 3, 0, 0, 0, 1, HashAlg::Blake3.tag()];
        want.extend_from_slice(&[0xaa; 32]);
        want.extend_from_slice(&[1, 0, 1, 0xac, 0x02, 1, 9]);
        assert_eq!(b, want);
        let b = Message::Request(Request::GetChunksShort {
            ids: vec![0x0807_0605_0403_0201],
            key_bytes: 4,
            runs: false,
            keys: Some(vec![0x0403_0201]),
            olds: None,
            context: None,
        })
        .encode(3, false)
        .unwrap();
        let want = [
            23, 0, 0, 0, 0x23, 0, 3, 0, 0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 4, 1, 1, 1, 2, 3, 4, 0,
        ];
        assert_eq!(b, want);
        // A key length out of range is refused: 3 to 8 bytes.
        for n in [2, 9] {
            let mut bad = b.clone();
            bad[19] = n;
            let mut d = FrameDecoder::new();
            d.feed(&bad);
            assert!(Message::decode(&d.next_frame().unwrap().unwrap()).is_err());
        }
        let b = Message::Request(Request::GetChunksShort {
            ids: vec![],
            key_bytes: 3,
            runs: true,
            keys: Some(vec![0x03_0201]),
            olds: None,
            context: None,
        })
        .encode(3, false)
        .unwrap();
        assert_eq!(
            b,
            [14, 0, 0, 0, 0x23, 0, 3, 0, 0, 0, 0, 0x83, 1, 1, 1, 2, 3, 0]
        );
        let mut bad = b.clone();
        bad[11] = 0x82;
        let mut d = FrameDecoder::new();
        d.feed(&bad);
        assert!(Message::decode(&d.next_frame().unwrap().unwrap()).is_err());
        // A context: bit 5, then the path and the ranges, each from the end of the one before.
        let b = Message::Request(Request::GetChunksShort {
            ids: vec![],
            key_bytes: 4,
            runs: false,
            keys: None,
            olds: None,
            context: Some(Context {
                path: "f".into(),
                ranges: vec![(1, 2), (5, 3)],
            }),
        })
        .encode(3, false)
        .unwrap();
        assert_eq!(
            b,
            [17, 0, 0, 0, 0x23, 0, 3, 0, 0, 0, 0, 0x24, 0, 0, 1, b'f', 2, 1, 2, 2, 3]
        );
        // More than MAX_CONTEXT bytes is refused.
        let mut bad = b.clone();
        bad[20] = 0x80;
        bad.extend_from_slice(&[0x80, 0x80, 0x02]);
        bad[0] += 3;
        let mut d = FrameDecoder::new();
        d.feed(&bad);
        let f = d.next_frame().unwrap().unwrap();
        assert!(Message::decode(&f).is_err(), "{:?}", Message::decode(&f));
        // Short olds: bit 6 of the key length byte.
        let b = Message::Request(Request::GetChunksShort {
            ids: vec![],
            key_bytes: 4,
            runs: false,
            keys: None,
            olds: Some(OldIds::Short(vec![0x0807_0605_0403_0201])),
            context: None,
        })
        .encode(3, false)
        .unwrap();
        assert_eq!(
            b,
            [19, 0, 0, 0, 0x23, 0, 3, 0, 0, 0, 0, 0x44, 0, 1, 1, 1, 2, 3, 4, 5, 6, 7, 8]
        );
        let b = Message::Request(Request::GetFilesShort {
            files: vec![("f".into(), vec![0x0807_0605_0403_0201])],
        })
        .encode(5, false)
        .unwrap();
        assert_eq!(
            b,
            [18, 0, 0, 0, 0x24, 0, 5, 0, 0, 0, 1, 1, b'f', 1, 1, 2, 3, 4, 5, 6, 7, 8]
        );
        let b = Message::Reply(Reply::ChunksShort {
            found: vec![0, 2],
            zstd: true,
            context: false,
            olds: vec![],
            refs: vec![300],
            data: vec![9],
        })
        .encode(3, false)
        .unwrap();
        let want = [
            16, 0, 0, 0, 0x4d, 0, 3, 0, 0, 0, 2, 0, 2, 1, 0, 1, 0xac, 0x02, 1, 9,
        ];
        assert_eq!(b, want);
        let b = Message::Request(Request::ReadDirAgainst {
            path: "d".into(),
            keys: vec![0x03_0201],
        })
        .encode(4, false)
        .unwrap();
        assert_eq!(b, [12, 0, 0, 0, 0x21, 0, 4, 0, 0, 0, 1, b'd', 1, 1, 2, 3]);
        let b = Message::Reply(Reply::DirDelta {
            present: vec![false, true],
            entries: vec![],
        })
        .encode(4, false)
        .unwrap();
        assert_eq!(b, [9, 0, 0, 0, 0x4b, 0, 4, 0, 0, 0, 2, 0b10, 0]);
        let b = Message::Request(Request::GetFilesAgainst {
            files: vec![("f".into(), vec![id(0xbb)])],
        })
        .encode(5, false)
        .unwrap();
        let mut want = vec![43, 0, 0, 0, 0x22, 0, 5, 0, 0, 0, 1, 1, b'f', 1];
        want.push(HashAlg::Blake3.tag());
        want.extend_from_slice(&[0xbb; 32]);
        assert_eq!(b, want);
        let b = Message::Reply(Reply::FilesAgainst {
            files: vec![Some((2, id(0xcc))), None],
            olds: vec![1],
            data: vec![7],
        })
        .encode(5, false)
        .unwrap();
        let mut want = vec![
            54, 0, 0, 0, 0x4c, 0, 5, 0, 0, 0, 2, 1, 2, 0, 0, 0, 0, 0, 0, 0,
        ];
        want.push(HashAlg::Blake3.tag());
        want.extend_from_slice(&[0xcc; 32]);
        want.extend_from_slice(&[0, 1, 1, 1, 7]);
        assert_eq!(b, want);
    }

    #[test]
    fn short_recipe_golden() {
        let b = Message::Request(Request::GetRecipeShort {
            path: "f".into(),
            known: vec![0x0807_0605_0403_0201],
        })
        .encode(2, false)
        .unwrap();
        assert_eq!(
            b,
            [17, 0, 0, 0, 0x26, 0, 2, 0, 0, 0, 1, b'f', 1, 1, 2, 3, 4, 5, 6, 7, 8]
        );
        let b = Message::Reply(Reply::RecipeDelta(RecipeDelta {
            version: 1,
            total_chunks: 2,
            check: [0xcc; 32],
            alg: HashAlg::Blake3,
            parts: vec![RecipePart::Short(vec![(300, 0x0807_0605_0403_0201)])],
        }))
        .encode(2, false)
        .unwrap();
        let mut want = vec![68, 0, 0, 0, 0x48, 0, 2, 0, 0, 0];
        want.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
        want.extend_from_slice(&[0xcc; 32]);
        want.extend_from_slice(&[HashAlg::Blake3.tag(), 1, 2, 1, 0xac, 0x02]);
        want.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(b, want);
    }

    #[test]
    fn read_range_golden() {
        let b = Message::Request(Request::ReadRange {
            path: "f".into(),
            offset: 300,
            len: 2,
        })
        .encode(7, false)
        .unwrap();
        assert_eq!(
            b,
            [11, 0, 0, 0, 0x25, 0, 7, 0, 0, 0, 1, b'f', 0xac, 0x02, 2]
        );
        let b = Message::Reply(Reply::Range {
            oid: id(0xcc),
            data: b"ab".to_vec(),
        })
        .encode(7, false)
        .unwrap();
        let mut want = vec![42, 0, 0, 0, 0x4e, 0, 7, 0, 0, 0, HashAlg::Blake3.tag()];
        want.extend_from_slice(&[0xcc; 32]);
        want.extend_from_slice(&[2, b'a', b'b']);
        assert_eq!(b, want);
        // More than MAX_READ_RANGE at once is refused at decode.
        let mut b = Message::Request(Request::ReadRange {
            path: "f".into(),
            offset: 0,
            len: MAX_READ_RANGE,
        })
        .encode(7, false)
        .unwrap();
        let n = b.len();
        b[n - 4] += 1;
        let mut d = FrameDecoder::new();
        d.feed(&b);
        let f = d.next_frame().unwrap().unwrap();
        assert!(Message::decode(&f).is_err());
    }

    #[test]
    fn paths_cannot_climb() {
        for bad in ["..", "a/../b", "/etc", "a//b", "a/", ".", "a/./b"] {
            assert!(WirePath::new(bad.as_bytes().to_vec()).is_err(), "{bad}");
            let f = Frame {
                msg_type: 0x10,
                flags: 0,
                request_id: 1,
                body: {
                    let mut w = Writer::default();
                    w.bytes(bad.as_bytes());
                    w.0
                },
            };
            assert!(
                matches!(
                    Message::decode(&f),
                    Err(ProtoError::Invalid { what: "path", .. })
                ),
                "{bad}"
            );
        }
        assert!(WirePath::new(vec![b'a', 0, b'b']).is_err());
        let d = WirePath::from("d");
        assert_eq!(d.join(b"x").unwrap(), WirePath::from("d/x"));
        assert_eq!(WirePath::default().join(b"x").unwrap(), WirePath::from("x"));
        assert!(d.join(b"x/y").is_err(), "a name is one component");
        assert!(d.join(b"..").is_err());
        assert_eq!(
            WirePath::from("a/b/c").split_last(),
            Some((WirePath::from("a/b"), &b"c"[..]))
        );
        assert_eq!(WirePath::default().split_last(), None);
        assert!(WirePath::new(vec![b'a'; 5000]).is_err());
    }

    #[test]
    fn hostile_counts_do_not_allocate() {
        for t in [
            0x13u8, 0x14, 0x15, 0x1e, 0x1f, 0x22, 0x23, 0x24, 0x41, 0x42, 0x43, 0x44, 0x48, 0x49,
        ] {
            let mut w = Writer::default();
            if t == 0x42 {
                w.u64(0);
                w.u64(0);
                w.u64(0);
                w.u8(1);
            }
            if t == 0x1e {
                w.bytes(b"p");
            }
            if t == 0x48 {
                w.u64(0);
                w.u64(0);
                w.0.extend_from_slice(&[0; 32]);
                w.u8(1);
            }
            w.varint(u64::MAX >> 1);
            let f = Frame {
                msg_type: t,
                flags: 0,
                request_id: 1,
                body: w.0,
            };
            assert!(
                matches!(Message::decode(&f), Err(ProtoError::CountTooLarge { .. })),
                "type {t:#x}"
            );
        }
        let f = Frame {
            msg_type: 0x7e,
            flags: 0,
            request_id: 1,
            body: vec![],
        };
        assert_eq!(Message::decode(&f), Err(ProtoError::UnknownType(0x7e)));
    }

    proptest! {
        /// Arbitrary bodies never panic the decoder.
        #[test]
        fn arbitrary_bodies_never_panic(t in any::<u8>(), body in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Message::decode(&Frame { msg_type: t, flags: 0, request_id: 1, body });
        }

        /// Mutating a valid message's body never panics the decoder.
        #[test]
        fn mutated_messages_never_panic(which in 0usize..25, at in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let m = &samples()[which % samples().len()];
            let mut f = m.to_frame(1);
            if !f.body.is_empty() {
                let i = at.index(f.body.len());
                f.body[i] = byte;
            }
            let _ = Message::decode(&f);
        }
    }
}
