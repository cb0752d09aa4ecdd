//! The client: list, fetch and upload files and trees, sending only what the other side
//! cannot find.
//!
//! - `walk`: a fetch's plan (listings breadth first, against the entries held here; bases for
//!   new files) and its symlinks and directories.
//! - `fetch`: a batch of files: recipes, whole small files, ranges, then the chunks not found
//!   here; `against`: chunks compressed against the old version held here.
//! - `recipes`: recipes put together from pages and short ids, checked.
//! - `install`: files assembled beside their destination and renamed over it; `dest`: every
//!   write, rename and removal at the destination made beneath its root, never through a
//!   symlink.
//! - `upload`: the same exchange pointed the other way.
//! - `local`: files and trees here as the protocol sees them (chunk indexes, tree digests).

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use ferry_chunk::ChunkerSpec;
use ferry_format::Id;
use ferry_proto::{Attr, DirEntry, FileKind, Reply, Request, WirePath};
use ferry_store::ChunkStore;

use crate::conn::{ConnError, Connection};

mod against;
mod dest;
mod fetch;
mod install;
mod local;
mod partial;
mod plain;
mod push;
mod ranged;
mod recipes;
mod source;
mod tree;
mod upload;
mod walk;

pub use source::{Mirror, SessionSource};
pub use upload::{put, put_file, Replacing};
pub use walk::{fetch_file, get};

/// `host:path`, as rsync and scp write it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteSpec {
    pub host: String,
    pub path: String,
}

impl RemoteSpec {
    /// Parses `host:path`; `None` if `s` is not a remote (a local path, or `./a:b`).
    pub fn parse(s: &str) -> Option<RemoteSpec> {
        let (host, path) = s.split_once(':')?;
        if host.is_empty() || host.contains('/') {
            return None;
        }
        Some(RemoteSpec {
            host: host.to_string(),
            path: if path.is_empty() {
                ".".into()
            } else {
                path.to_string()
            },
        })
    }
}

/// One `ls` entry.
pub type Listing = Vec<DirEntry>;

/// Attributes of `path`, and its entries when it is a directory.
pub fn list<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    path: &WirePath,
) -> Result<(Attr, Listing), ConnError> {
    let attr = get_attr(conn, path)?;
    if attr.kind != FileKind::Dir {
        return Ok((attr, vec![]));
    }
    let mut out = vec![];
    for r in conn.call(Request::ReadDir {
        path: path.clone(),
        keys: vec![],
    })? {
        match r {
            Reply::Entries { entries, .. } => out.extend(entries),
            other => return Err(ConnError::Unexpected(format!("{other:?}"))),
        }
    }
    Ok((attr, out))
}

/// Sends a Ping, the first request of a batch: its reply, which holds no work of the
/// server's, times the link ([`Connection::round_trip`]; the server sends its first reply to
/// what it reads at once). [`take_ping`] takes it.
pub(crate) fn ping<R: io::Read, W: Write>(conn: &mut Connection<R, W>) -> Result<u32, ConnError> {
    conn.send(Request::Ping)
}

/// Takes the reply to a [`ping`]; a server that refuses it refuses nothing else for it.
pub(crate) fn take_ping<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    id: u32,
) -> Result<(), ConnError> {
    match conn.replies(id) {
        Ok(_) | Err(ConnError::Remote { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

pub(crate) fn get_attr<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    path: &WirePath,
) -> Result<Attr, ConnError> {
    match conn.call(Request::GetAttr { path: path.clone() })?.pop() {
        Some(Reply::Attr(a)) => Ok(a),
        other => Err(ConnError::Unexpected(format!("{other:?}"))),
    }
}

/// What a fetch cost and where its chunks came from.
#[derive(Clone, Debug, Default)]
pub struct GetStats {
    /// Files fetched.
    pub files: u64,
    /// Files skipped because size, mtime and mode already matched.
    pub unchanged: u64,
    /// Entries removed from the destination (with `delete`).
    pub deleted: u64,
    /// With `dry_run`: what would be done, one line each (`fetch PATH`, `delete PATH`, …).
    pub planned: Vec<String>,
    pub bytes: u64,
    pub chunks: u64,
    pub from_cache: u64,
    pub from_local: u64,
    pub from_server: u64,
    pub bytes_from_server: u64,
    /// Of those, the chunks (and bytes) that came from mirrors.
    pub from_mirrors: u64,
    pub bytes_from_mirrors: u64,
    /// Chunks (and bytes) read from lookaside devices instead: not counted as from the server.
    pub from_lookaside: u64,
    pub bytes_from_lookaside: u64,
    /// What each source of the plain fetches did (the server, then each mirror), by name.
    pub sources: Vec<SourceStats>,
    /// Of the chunks from the server, those sent compressed against the old local file.
    pub against_old: u64,
}

/// What one source of a fetch did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceStats {
    pub name: String,
    pub requests: u64,
    /// Chunks it delivered first, and their bytes.
    pub chunks: u64,
    pub bytes: u64,
    /// Chunks it did not have, or sent wrong.
    pub misses: u64,
    pub rejected: u64,
    /// Why it stopped, if it failed.
    pub failed: Option<String>,
}

/// Chunk sources on the receiving side, tried before the server.
pub struct Sources<'a> {
    /// The persistent client cache.
    pub cache: &'a dyn ChunkStore,
    pub chunker: ChunkerSpec,
    /// Also remove what the destination has and the server does not (rsync's `--delete`).
    pub delete: bool,
    /// Change nothing locally: list what would be fetched and deleted in `GetStats::planned`.
    pub dry_run: bool,
    /// The cache held nothing when the transfer began: small new files are read whole.
    pub cold: bool,
    /// Nothing in the cache could hold chunks of new files (it was empty when the transfer
    /// began): large new files are read whole too, by ranges, with no recipe.
    pub ranges: bool,
    /// Files larger than this read by ranges are not cut into the cache (they would only push
    /// the rest out); a cut transfer of one goes on from its partial file instead.
    pub cache_file_max: u64,
    /// Other servers holding the same tree, asked for chunks in parallel with the first
    /// (listings and recipes come from the first). They need full ids: `short_ids` off.
    pub mirrors: Option<&'a std::sync::Mutex<Vec<Mirror>>>,
    /// Requests queued at a slow or failed source move to an idle one (DOT's request
    /// borrowing); off only for experiments.
    pub borrowing: bool,
    /// Recipes name the chunks held nowhere here by 8-byte short ids (the client finds what it
    /// holds by prefix, checks the whole recipe once the rest arrived). Off, they come with full
    /// ids: what other sources than the server (mirrors) need to serve them.
    pub short_ids: bool,
    /// Told the bytes of each chunk written (for progress bars).
    pub progress: Option<&'a dyn Fn(u64)>,
    /// Devices searched for chunks before the network (lookaside caching). With any, files are
    /// fetched by recipe with full ids (what a device is searched by): `cold`, `ranges` and
    /// `short_ids` do not apply.
    pub lookaside: Option<&'a ferry_lookaside::Lookaside>,
}

impl Sources<'_> {
    /// The devices to look aside to, if there are any.
    pub(crate) fn devices(&self) -> Option<&ferry_lookaside::Lookaside> {
        self.lookaside.filter(|l| !l.is_empty())
    }
}

/// How to upload.
pub struct PutOptions<'a> {
    pub chunker: ChunkerSpec,
    /// Also remove what the server has and the local tree does not.
    pub delete: bool,
    /// Change nothing on the server: list what would be sent and deleted in `PutStats::planned`.
    pub dry_run: bool,
    /// Told the bytes of each file committed (for progress bars).
    pub progress: Option<&'a dyn Fn(u64)>,
    /// The client's chunk cache, if any: old data held here (it came from the server) that new
    /// data is compressed against without asking the server for keys.
    pub cache: Option<&'a dyn ChunkStore>,
    /// Ask what a changed file of few chunks needs in one round trip, naming all its chunks
    /// (the mount's write-back on close: LBFS's two round trips), rather than in two with
    /// fewer bytes (a tree's upload, where a round trip is paid once per batch).
    pub fewer_round_trips: bool,
    /// Also ask for the attributes of this path, in the round trip of the commits (as they are
    /// after them): [`PutStats::stat_after`]. The mount's write-back asks for the directory it
    /// changed.
    pub stat_after: Option<ferry_proto::WirePath>,
    /// Also make the commits durable (`Sync`, from a session that asked for
    /// `FEATURE_DEFERRED_SYNC`), in their round trip: [`PutStats::synced`]. The mount's fsync.
    pub sync_after: bool,
}

pub(crate) fn mtime(attr: &Attr) -> std::time::SystemTime {
    if attr.mtime_ns >= 0 {
        std::time::UNIX_EPOCH + std::time::Duration::from_nanos(attr.mtime_ns as u64)
    } else {
        std::time::UNIX_EPOCH - std::time::Duration::from_nanos(attr.mtime_ns.unsigned_abs())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GetError {
    #[error(transparent)]
    Conn(#[from] ConnError),
    /// The OS error is part of the message (not a separate source, which would print twice).
    #[error("{op} {}: {error}", path.display())]
    Local {
        op: &'static str,
        path: PathBuf,
        error: io::Error,
    },
    #[error(transparent)]
    Store(#[from] ferry_store::StoreError),
    #[error(transparent)]
    Proto(#[from] ferry_proto::ProtoError),
    #[error("server sent chunk {0} that does not match its id, or a recipe it cannot serve")]
    BadData(Id),
    #[error("a recipe rebuilt from the pages held here does not match the server's check")]
    RecipeCheck,
    /// Not the link failing: asking again gets the new version.
    #[error("a file changed on the server while it was fetched; run the command again")]
    Changed,
    /// A local file changed while it was uploaded: reading it again gets the new version.
    #[error("{} changed while it was uploaded", .0.display())]
    LocalChanged(PathBuf),
}

impl GetError {
    pub(crate) fn local(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> GetError {
        let path = path.to_path_buf();
        move |error| GetError::Local { op, path, error }
    }
}

/// What an upload cost.
#[derive(Clone, Debug, Default)]
pub struct PutStats {
    pub files: u64,
    pub bytes: u64,
    pub chunks: u64,
    /// Entries removed from the server (with `delete`).
    pub deleted: u64,
    /// Files skipped because size, mtime and mode already matched.
    pub unchanged: u64,
    /// With `dry_run`: what would be done, one line each.
    pub planned: Vec<String>,
    /// Chunks the server lacked, and their bytes: what had to travel.
    pub chunks_sent: u64,
    pub chunk_bytes_sent: u64,
    /// The attributes of [`PutOptions::stat_after`] after the commits, if the server gave them.
    pub stat_after: Option<Attr>,
    /// The commits are durable on the server, and so is every change of names this session
    /// made before them (asked by [`PutOptions::sync_after`]).
    pub synced: bool,
    /// With [`PutOptions::fewer_round_trips`], the recipe of the last file committed (as the
    /// server keeps it: a later upload replacing that version can name it, see
    /// [`Replacing::recipe`](crate::Replacing)).
    pub last_recipe: Option<std::sync::Arc<ferry_format::Recipe>>,
}
