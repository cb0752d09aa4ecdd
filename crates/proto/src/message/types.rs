//! The values messages carry: paths, attributes, targets, id lists, error codes, and the codecs
//! of the small ones every family shares.

use ferry_chunk::MAX_CHUNK_LIMIT;
use ferry_format::{ChunkRef, HashAlg, Id};

use crate::codec::{Reader, Writer};
use crate::ProtoError;

/// Longest path on the wire, in bytes.
/// The longest path a message carries, in bytes (the kernel's PATH_MAX).
pub const MAX_PATH: usize = 4096;

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

    /// `self/rel`, for a relative path of any number of components.
    pub fn join_path(&self, rel: &WirePath) -> Result<WirePath, ProtoError> {
        if rel.0.is_empty() {
            return Ok(self.clone());
        }
        if self.0.is_empty() {
            return Ok(rel.clone());
        }
        let mut p = self.0.clone();
        p.push(b'/');
        p.extend_from_slice(&rel.0);
        WirePath::new(p)
    }

    /// The rest of this path below `base`, if it lies at or below it.
    pub fn strip_prefix(&self, base: &WirePath) -> Option<WirePath> {
        if base.0.is_empty() {
            return Some(self.clone());
        }
        if self.0 == base.0 {
            return Some(WirePath::default());
        }
        let rest = self.0.strip_prefix(base.0.as_slice())?.strip_prefix(b"/")?;
        Some(WirePath(rest.to_vec()))
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

/// A path is its bytes: ordered, compared and hashed as them (so ordered maps of paths can be
/// searched by byte ranges, such as everything below a directory).
impl std::borrow::Borrow<[u8]> for WirePath {
    fn borrow(&self) -> &[u8] {
        &self.0
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
    /// A file's object id (BLAKE3 of its bytes) when the server knows it; a directory's tree
    /// digest.
    pub oid: Option<Id>,
    /// How long the client may trust these attributes without asking again, in milliseconds.
    pub lease_ms: u32,
    /// The rest of what stat(2) says, for a session that asked for it
    /// ([`crate::FEATURE_STAT_EXTRA`]).
    pub extra: Option<StatExtra>,
}

/// The rest of stat(2) (a mount shows it): what a session asking for
/// [`crate::FEATURE_STAT_EXTRA`] gets in every attributes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatExtra {
    /// Last access, nanoseconds since the Unix epoch.
    pub atime_ns: i64,
    /// Last change of the inode (content or attributes).
    pub ctime_ns: i64,
    /// Space allocated, in 512-byte units.
    pub blocks: u64,
    /// Hard links (a directory: 2 and one per subdirectory, on most file systems).
    pub nlink: u32,
    /// The file's identity on the server, with [`crate::FEATURE_HARD_LINKS`]: the same for
    /// every name of one file, different for different files of the export (a hash of its
    /// device and inode numbers).
    pub id: Option<u64>,
}

/// The size and use of the file system holding the export, as statvfs(3) gives them (block
/// counts in units of `block_size`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsStats {
    pub block_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    /// Free blocks an unprivileged user may use.
    pub blocks_avail: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
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

/// What a request about a file's content names: a path in the export, or an object by its id
/// (BLAKE3 of its bytes: the transfer daemon's and its peers' way of naming what they move).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    Path(WirePath),
    Object(Id),
}

impl From<WirePath> for Target {
    fn from(p: WirePath) -> Self {
        Target::Path(p)
    }
}

/// Chunks named in full, or by short ids ([`short_id`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ids {
    Full(Vec<Id>),
    Short(Vec<u64>),
}

impl Ids {
    pub fn len(&self) -> usize {
        match self {
            Ids::Full(v) => v.len(),
            Ids::Short(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The short id of the `i`th chunk named.
    pub fn short(&self, i: usize) -> u64 {
        match self {
            Ids::Full(v) => short_id(&v[i]),
            Ids::Short(v) => v[i],
        }
    }
}

/// A chunk's short id: the first 8 bytes of its digest, little-endian.
pub fn short_id(id: &Id) -> u64 {
    u64::from_le_bytes(id.digest()[..8].try_into().expect("8 bytes"))
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
    /// A write names chunks the server has neither received nor can find.
    MissingChunks = 13,
    /// The server is at its bound of something (sessions, open uploads): try again later.
    Busy = 14,
}

impl ErrorCode {
    pub(crate) fn from_u16(v: u16) -> Result<Self, ProtoError> {
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
            14 => Busy,
            v => {
                return Err(ProtoError::Invalid {
                    what: "error",
                    why: format!("unknown code {v}"),
                })
            }
        })
    }
}

pub(crate) fn put_path(w: &mut Writer, p: &WirePath) {
    w.bytes(&p.0);
}

pub(crate) fn get_path(r: &mut Reader<'_>) -> Result<WirePath, ProtoError> {
    WirePath::new(r.bytes()?.to_vec())
}

/// `00` path, or `01` object id.
pub(crate) fn put_target(w: &mut Writer, t: &Target) {
    match t {
        Target::Path(p) => {
            w.u8(0);
            put_path(w, p);
        }
        Target::Object(id) => {
            w.u8(1);
            w.id(id);
        }
    }
}

pub(crate) fn get_target(r: &mut Reader<'_>) -> Result<Target, ProtoError> {
    match r.u8()? {
        0 => Ok(Target::Path(get_path(r)?)),
        1 => Ok(Target::Object(r.id()?)),
        t => Err(ProtoError::Invalid {
            what: "target",
            why: format!("kind {t}"),
        }),
    }
}

/// `00` count · *id* × count, or `01` count · short id u64 × count.
pub(crate) fn put_id_list(w: &mut Writer, ids: &Ids) {
    match ids {
        Ids::Full(v) => {
            w.u8(0);
            put_ids(w, v);
        }
        Ids::Short(v) => {
            w.u8(1);
            put_short_ids(w, v);
        }
    }
}

pub(crate) fn get_id_list(r: &mut Reader<'_>) -> Result<Ids, ProtoError> {
    match r.u8()? {
        0 => Ok(Ids::Full(get_ids(r)?)),
        1 => Ok(Ids::Short(get_short_ids(r)?)),
        t => Err(ProtoError::Invalid {
            what: "id list",
            why: format!("kind {t}"),
        }),
    }
}

pub(crate) fn put_ids(w: &mut Writer, ids: &[Id]) {
    w.varint(ids.len() as u64);
    for id in ids {
        w.id(id);
    }
}

pub(crate) fn get_ids(r: &mut Reader<'_>) -> Result<Vec<Id>, ProtoError> {
    let n = r.count(ferry_format::TAGGED_ID_BYTES)?;
    (0..n).map(|_| r.id()).collect()
}

/// count varint · short id (u64le) × count.
pub(crate) fn put_short_ids(w: &mut Writer, ids: &[u64]) {
    w.varint(ids.len() as u64);
    for id in ids {
        w.u64(*id);
    }
}

pub(crate) fn get_short_ids(r: &mut Reader<'_>) -> Result<Vec<u64>, ProtoError> {
    let n = r.count(8)?;
    (0..n).map(|_| r.u64()).collect()
}

/// A chunk length: 1 to `MAX_CHUNK_LIMIT`.
pub(crate) fn chunk_len(len: u64, what: &'static str) -> Result<u32, ProtoError> {
    if len == 0 || len > MAX_CHUNK_LIMIT as u64 {
        return Err(ProtoError::Invalid {
            what,
            why: format!("chunk length {len}"),
        });
    }
    Ok(len as u32)
}

/// count varint · (length varint · digest 32) × count; the ids take `alg`.
pub(crate) fn put_chunk_refs(w: &mut Writer, cs: &[ChunkRef]) {
    w.varint(cs.len() as u64);
    for c in cs {
        w.varint(c.len as u64);
        w.0.extend_from_slice(c.id.digest());
    }
}

pub(crate) fn get_chunk_refs(
    r: &mut Reader<'_>,
    alg: HashAlg,
    what: &'static str,
) -> Result<Vec<ChunkRef>, ProtoError> {
    let n = r.count(33)?;
    let mut chunks = Vec::with_capacity(n);
    for _ in 0..n {
        let len = chunk_len(r.varint()?, what)?;
        let mut d = [0u8; 32];
        d.copy_from_slice(r.take_exact(32)?);
        chunks.push(ChunkRef {
            id: Id::from_parts(alg, d),
            len,
        });
    }
    Ok(chunks)
}

/// count varint · (length varint · short id u64) × count.
pub(crate) fn put_short_refs(w: &mut Writer, cs: &[(u32, u64)]) {
    w.varint(cs.len() as u64);
    for (len, short) in cs {
        w.varint(*len as u64);
        w.u64(*short);
    }
}

pub(crate) fn get_short_refs(
    r: &mut Reader<'_>,
    what: &'static str,
) -> Result<Vec<(u32, u64)>, ProtoError> {
    let n = r.count(9)?;
    let mut cs = Vec::with_capacity(n);
    for _ in 0..n {
        cs.push((chunk_len(r.varint()?, what)?, r.u64()?));
    }
    Ok(cs)
}

/// Set in an attributes' kind byte when [`StatExtra`] follows them.
const KIND_EXTRA: u8 = 0x80;
/// Set in an attributes' kind byte (with [`KIND_EXTRA`]) when the file's identity follows the
/// [`StatExtra`] ([`StatExtra::id`]).
const KIND_ID: u8 = 0x40;

pub(crate) fn put_attr(w: &mut Writer, a: &Attr) {
    let flags = match &a.extra {
        Some(x) if x.id.is_some() => KIND_EXTRA | KIND_ID,
        Some(_) => KIND_EXTRA,
        None => 0,
    };
    w.u8(a.kind as u8 | flags);
    w.u32(a.mode);
    w.u64(a.size);
    w.i64(a.mtime_ns);
    w.u64(a.version);
    w.opt_id(a.oid.as_ref());
    w.u32(a.lease_ms);
    if let Some(x) = &a.extra {
        w.i64(x.atime_ns);
        w.i64(x.ctime_ns);
        w.u64(x.blocks);
        w.u32(x.nlink);
        if let Some(id) = x.id {
            w.u64(id);
        }
    }
}

pub(crate) fn get_attr(r: &mut Reader<'_>) -> Result<Attr, ProtoError> {
    let byte = r.u8()?;
    if byte & (KIND_EXTRA | KIND_ID) == KIND_ID {
        return Err(ProtoError::Invalid {
            what: "attributes",
            why: "a file identity without the rest of stat".into(),
        });
    }
    let kind = match byte & !(KIND_EXTRA | KIND_ID) {
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
        extra: if byte & KIND_EXTRA != 0 {
            Some(StatExtra {
                atime_ns: r.i64()?,
                ctime_ns: r.i64()?,
                blocks: r.u64()?,
                nlink: r.u32()?,
                id: match byte & KIND_ID {
                    0 => None,
                    _ => Some(r.u64()?),
                },
            })
        } else {
            None
        },
    })
}

/// count varint · index varint × count.
pub(crate) fn put_indices(w: &mut Writer, list: &[u32]) {
    w.varint(list.len() as u64);
    for i in list {
        w.varint(*i as u64);
    }
}

pub(crate) fn get_indices(r: &mut Reader<'_>) -> Result<Vec<u32>, ProtoError> {
    let n = r.count(1)?;
    (0..n).map(|_| get_u32(r, "index list")).collect()
}

/// A varint that must fit in 32 bits.
pub(crate) fn get_u32(r: &mut Reader<'_>, what: &'static str) -> Result<u32, ProtoError> {
    u32::try_from(r.varint()?).map_err(|_| ProtoError::Invalid {
        what,
        why: "a number over 2^32".into(),
    })
}

/// count varint · bitmap, bit i of byte i/8 for flag i.
pub(crate) fn put_bits(w: &mut Writer, flags: &[bool]) {
    w.varint(flags.len() as u64);
    let mut bits = vec![0u8; flags.len().div_ceil(8)];
    for (i, &f) in flags.iter().enumerate() {
        if f {
            bits[i / 8] |= 1 << (i % 8);
        }
    }
    w.0.extend_from_slice(&bits);
}

pub(crate) fn get_bits(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<bool>, ProtoError> {
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

/// count varint · key × count, each key its first `bytes` bytes, little-endian.
pub(crate) fn put_keys(w: &mut Writer, keys: &[u64], bytes: usize) {
    w.varint(keys.len() as u64);
    for k in keys {
        w.0.extend_from_slice(&k.to_le_bytes()[..bytes]);
    }
}

pub(crate) fn get_keys(r: &mut Reader<'_>, bytes: usize) -> Result<Vec<u64>, ProtoError> {
    let n = r.count(bytes)?;
    (0..n)
        .map(|_| {
            let mut k = [0u8; 8];
            k[..bytes].copy_from_slice(r.take_exact(bytes)?);
            Ok(u64::from_le_bytes(k))
        })
        .collect()
}

pub(crate) fn put_opt<T>(w: &mut Writer, v: Option<T>, f: impl FnOnce(&mut Writer, T)) {
    match v {
        None => w.u8(0),
        Some(v) => {
            w.u8(1);
            f(w, v);
        }
    }
}

pub(crate) fn get_opt<T>(
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

/// Byte ranges as count varint · (gap varint · length varint) × count, each range starting
/// `gap` bytes after the end of the one before (the first after offset 0). `max` bounds the
/// total length.
pub(crate) fn put_ranges(w: &mut Writer, ranges: &[(u64, u64)]) {
    w.varint(ranges.len() as u64);
    let mut end = 0;
    for &(offset, len) in ranges {
        w.varint(offset - end);
        w.varint(len);
        end = offset + len;
    }
}

pub(crate) fn get_ranges(
    r: &mut Reader<'_>,
    what: &'static str,
    max: u64,
) -> Result<Vec<(u64, u64)>, ProtoError> {
    let n = r.count(2)?;
    let bad = |why: &str| ProtoError::Invalid {
        what,
        why: why.into(),
    };
    let (mut end, mut total) = (0u64, 0u64);
    let mut ranges = Vec::with_capacity(n);
    for _ in 0..n {
        let offset = end.checked_add(r.varint()?).ok_or_else(|| bad("offset"))?;
        let len = r.varint()?;
        total = total.saturating_add(len);
        if total > max {
            return Err(bad("more bytes than allowed"));
        }
        end = offset.checked_add(len).ok_or_else(|| bad("offset"))?;
        ranges.push((offset, len));
    }
    Ok(ranges)
}
