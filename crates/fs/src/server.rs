//! The file server's request handling, free of sockets: frames in, frames out.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::FileExt;

use ferry_chunk::ChunkerSpec;
use ferry_format::{chunk_object, HashAlg, Id, Oid, Recipe};
use ferry_proto::{
    Attr, Context, DirEntry, ErrorCode, FileKind, Frame, Hello, Message, OldIds, RecipeDelta,
    RecipePage, RecipePart, Reply, Request, WirePath, FEATURES, FLAG_MORE, VERSION,
};

use crate::export::{os, stat_at, Export, FileId};
use ferry_store::{ChunkStore, VerifiedChunk};
use std::os::fd::OwnedFd;

/// Chunks per recipe page.
const RECIPE_PAGE: usize = 4096;
/// Directory entries per page.
const DIR_PAGE: usize = 1024;
/// Chunk bytes per reply frame.
const CHUNKS_FRAME_BYTES: usize = 1 << 20;
/// Recipes kept in memory before the cache is cleared (each costs ~36 bytes per chunk).
const RECIPE_CACHE_ENTRIES: usize = 100_000;
/// How long a computed tree digest is reused: long enough for one walk of a tree over a slow
/// link (a level's listings arrive together), short enough that a later command sees changes.
const TREE_DIGEST_TTL: std::time::Duration = std::time::Duration::from_secs(10);
/// Tree digests remembered before the memo is cleared.
const TREE_MEMO_ENTRIES: usize = 200_000;

/// How the server behaves.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub chunker: ChunkerSpec,
    pub hash: HashAlg,
    /// Attribute lease handed to clients.
    pub lease_ms: u32,
    /// Bytes of replaced file versions kept in the trash as chunk sources (0: no trash).
    pub trash_bytes: u64,
    /// zstd level of the session stream this side sends, when the client speaks it.
    pub zstd_level: ferry_proto::Level,
    /// Hello feature bits this server offers (all it knows by default; fewer to answer as an
    /// older server would).
    pub features: u64,
}

/// Where chunks a client sends (PutChunks) wait for the commit that uses them. A persistent
/// store lets a cut upload resume: what arrived stays.
pub type Staging = std::sync::Arc<dyn ChunkStore>;

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            chunker: ChunkerSpec::default(),
            hash: HashAlg::Blake3,
            lease_ms: 60_000,
            trash_bytes: 256 << 20,
            zstd_level: crate::conn::DEFAULT_ZSTD_LEVEL,
            features: FEATURES,
        }
    }
}

/// The answer to a request for chunks against the client's old data: the chunks found
/// (indices into the request, in order), plainly or as one zstd frame against a prefix.
enum Against {
    Plain(Vec<(usize, Vec<u8>)>),
    Frame {
        found: Vec<usize>,
        /// Whether the request's context heads the prefix.
        context: bool,
        olds: Vec<u32>,
        refs: Vec<u32>,
        data: Vec<u8>,
    },
}

/// Old chunks named by short ids that a request may have looked up in the history.
const MAX_OLDS: usize = 8192;

/// Where a chunk was last seen: a hint, verified before use.
#[derive(Clone, Debug)]
struct Hint {
    path: WirePath,
    offset: u64,
    len: u32,
}

/// Serves one client session over an [`Export`].
pub struct Server {
    export: Export,
    opts: ServerOptions,
    staging: Staging,
    recipes: HashMap<FileId, (Recipe, Oid)>,
    hints: HashMap<Id, Hint>,
    /// The first 8 bytes of each hinted chunk's hash (little-endian), for GetChunksShort.
    short_ids: HashMap<u64, Id>,
    greeted: bool,
    /// Features both sides agreed on in the Hellos.
    features: u64,
    /// The client's piece keys (GetChunksAgainst), by index, kept for the requests after.
    piece_keys: crate::delta::Keys,
    /// The level of large frames against old data.
    frame_level: crate::delta::FrameLevel,
    /// The old chunks the client last named (GetChunksAgainst), kept likewise; `None` for a
    /// short id the history knows no chunk by.
    olds: Vec<Option<Id>>,
    /// Every chunk this server has cut, kept (bounded) as what clients may hold old versions
    /// of: the whole old version becomes the prefix of a delta.
    history: Option<Staging>,
    /// Tree digests of directories, with when they were computed.
    trees: HashMap<WirePath, (std::time::Instant, [u8; 32])>,
    tmp_counter: u64,
    /// `None` when change notification is unavailable: then no leases are granted.
    leases: Option<crate::leases::Leases>,
    /// Leases broken by changes seen while handling a request, sent before its reply.
    broken: Vec<WirePath>,
}

fn error(code: ErrorCode, message: impl Into<String>) -> Reply {
    Reply::Error {
        code,
        message: message.into(),
    }
}

fn io_error(path: &WirePath, e: &io::Error) -> Reply {
    use io::ErrorKind as K;
    let code = match e.kind() {
        K::NotFound => ErrorCode::NotFound,
        K::NotADirectory => ErrorCode::NotDir,
        K::IsADirectory => ErrorCode::IsDir,
        K::PermissionDenied => ErrorCode::Permission,
        // openat2 with RESOLVE_BENEATH answers EXDEV for a path that leaves the root.
        K::CrossesDevices => ErrorCode::Escape,
        K::StorageFull => ErrorCode::NoSpace,
        K::AlreadyExists => ErrorCode::Exists,
        K::DirectoryNotEmpty => ErrorCode::NotEmpty,
        _ => ErrorCode::Io,
    };
    error(code, format!("{path:?}: {e}"))
}

impl Server {
    pub fn new(export: Export, opts: ServerOptions, staging: Staging) -> Self {
        let frame_level = crate::delta::FrameLevel::new(opts.zstd_level.start());
        Server {
            frame_level,
            export,
            opts,
            staging,
            recipes: HashMap::new(),
            hints: HashMap::new(),
            short_ids: HashMap::new(),
            greeted: false,
            features: 0,
            trees: HashMap::new(),
            piece_keys: crate::delta::Keys::default(),
            olds: vec![],
            history: None,
            tmp_counter: 0,
            leases: match crate::leases::Leases::new() {
                Ok(l) => Some(l),
                Err(e) => {
                    tracing::warn!("no change notification ({e}); granting no leases");
                    None
                }
            },
            broken: vec![],
        }
    }

    /// Keeps every chunk this server cuts in `history`, and offers the client to compress
    /// against old chunks found there (FEATURE_HISTORY).
    pub fn with_history(mut self, history: Staging) -> Self {
        self.history = Some(history);
        self
    }

    /// The zstd level of the session stream once the Hellos agreed on one: from the reply to
    /// the Hello on, both directions are one zstd stream each.
    pub fn stream_level(&self) -> Option<ferry_proto::Level> {
        (self.features & ferry_proto::FEATURE_ZSTD_STREAM != 0).then_some(self.opts.zstd_level)
    }

    /// Writing replies out waited `waited` on the transport: large frames against old data
    /// follow the link by it.
    pub fn wrote(&mut self, waited: std::time::Duration) {
        self.frame_level.wrote(waited);
    }

    /// Whether a large frame against old data went into a reply and has not been written out
    /// since: the loop writes it at once, so the next one's level knows how the link took it.
    pub fn frame_unwritten(&self) -> bool {
        self.frame_level.unwritten()
    }

    /// The entries of the directory at `path`, with leases and (for directories) tree digests.
    fn listing(&mut self, path: &WirePath) -> io::Result<Vec<DirEntry>> {
        let entries = self.export.read_dir(path)?;
        let listing_lease = self.lease(path, true);
        Ok(entries
            .into_iter()
            .map(|(name, attr)| {
                let child = path.join(&name).ok();
                let lease_ms = match &child {
                    Some(child) if listing_lease > 0 => self.lease(child, false),
                    _ => 0,
                };
                let oid = match &child {
                    Some(child) if attr.kind == FileKind::Dir => self.tree_id(child),
                    _ => attr.oid,
                };
                DirEntry {
                    name,
                    attr: Attr {
                        lease_ms,
                        oid,
                        ..attr
                    },
                }
            })
            .collect())
    }

    /// An entry's key (`ferry_proto::entry_key`), when it can be computed: a directory needs
    /// its tree digest, a symlink its target.
    fn entry_key(&self, dir: &WirePath, e: &DirEntry) -> Option<u32> {
        use ferry_proto::TreeItem;
        let a = &e.attr;
        let item = match a.kind {
            FileKind::Dir => TreeItem::Dir {
                mode: a.mode,
                mtime_ns: a.mtime_ns,
                digest: *a.oid?.digest(),
            },
            FileKind::Symlink => TreeItem::Symlink {
                target: self.export.read_link(&dir.join(&e.name).ok()?).ok()?,
            },
            _ => TreeItem::File {
                mode: a.mode,
                size: a.size,
                mtime_ns: a.mtime_ns,
            },
        };
        Some(ferry_proto::entry_key(&e.name, &item))
    }

    /// The tree digest of the directory at `path` as an id, when the client asked for tree
    /// digests and the whole subtree could be read.
    fn tree_id(&mut self, path: &WirePath) -> Option<Id> {
        if self.features & ferry_proto::FEATURE_TREE_DIGEST == 0 {
            return None;
        }
        match self.tree_digest(path) {
            Ok(d) => Some(Id::from_parts(HashAlg::Blake3, d)),
            Err(e) => {
                tracing::debug!("no tree digest for {path:?}: {e}");
                None
            }
        }
    }

    /// `ferry_proto::tree_digest` of a directory, computed bottom-up, each subtree's digest
    /// remembered for [`TREE_DIGEST_TTL`].
    fn tree_digest(&mut self, path: &WirePath) -> io::Result<[u8; 32]> {
        use ferry_proto::TreeItem;
        if let Some((at, d)) = self.trees.get(path) {
            if at.elapsed() < TREE_DIGEST_TTL {
                return Ok(*d);
            }
        }
        let mut items = vec![];
        for (name, attr) in self.export.read_dir(path)? {
            let child = path.join(&name).map_err(io::Error::other)?;
            let item = match attr.kind {
                FileKind::Symlink => TreeItem::Symlink {
                    target: self.export.read_link(&child)?,
                },
                FileKind::Dir => TreeItem::Dir {
                    mode: attr.mode,
                    mtime_ns: attr.mtime_ns,
                    digest: self.tree_digest(&child)?,
                },
                _ => TreeItem::File {
                    mode: attr.mode,
                    size: attr.size,
                    mtime_ns: attr.mtime_ns,
                },
            };
            items.push((name, item));
        }
        let d = ferry_proto::tree_digest(&mut items);
        if self.trees.len() >= TREE_MEMO_ENTRIES {
            self.trees.clear();
        }
        self.trees
            .insert(path.clone(), (std::time::Instant::now(), d));
        Ok(d)
    }

    /// A descriptor that becomes readable when a leased path may have changed; then call
    /// [`invalidations`](Self::invalidations).
    pub fn watch_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.leases.as_ref().map(|l| l.fd())
    }

    /// Invalidate frames for every lease that changes broke.
    pub fn invalidations(&mut self) -> Vec<Frame> {
        self.take_broken();
        self.broken
            .drain(..)
            .map(|p| Message::Invalidate(p).to_frame(0))
            .collect()
    }

    fn lease(&mut self, path: &WirePath, listing: bool) -> u32 {
        match self.leases.as_mut() {
            Some(l) => l.grant(&self.export, path, listing, self.opts.lease_ms),
            None => 0,
        }
    }

    /// Handles one frame from the client; returns the frames to send back, in order.
    pub fn handle(&mut self, frame: &Frame) -> Vec<Frame> {
        let id = frame.request_id;
        let one = |r: Reply| vec![Message::Reply(r).to_frame(id)];
        let msg = match Message::decode(frame) {
            Ok(m) => m,
            Err(e) => return one(error(ErrorCode::BadRequest, e.to_string())),
        };
        match msg {
            Message::Hello(h) => {
                if h.version != VERSION {
                    return one(error(
                        ErrorCode::Unsupported,
                        format!("client speaks protocol {}, server {VERSION}", h.version),
                    ));
                }
                self.greeted = true;
                self.features = h.features & FEATURES & self.opts.features;
                if self.history.is_none() {
                    self.features &=
                        !(ferry_proto::FEATURE_HISTORY | ferry_proto::FEATURE_SHORT_OLDS);
                }
                let agent = format!("ferry {}", env!("CARGO_PKG_VERSION"));
                vec![Message::Hello(Hello {
                    version: VERSION,
                    features: self.features,
                    agent,
                })
                .to_frame(id)]
            }
            _ if !self.greeted => one(error(ErrorCode::BadRequest, "hello first")),
            Message::Request(r) => self.request(id, r),
            Message::Reply(_) | Message::Invalidate(_) => {
                one(error(ErrorCode::BadRequest, "servers take requests"))
            }
        }
    }

    fn request(&mut self, id: u32, r: Request) -> Vec<Frame> {
        // Changes made before this request break the leases they break now, before anything
        // is read for the reply: a lease granted below is broken only by later changes.
        self.take_broken();
        let mut out = self.request_inner(id, r);
        if !self.broken.is_empty() {
            let breaks = self
                .broken
                .drain(..)
                .map(|p| Message::Invalidate(p).to_frame(0));
            out.splice(0..0, breaks);
        }
        out
    }

    /// Notes the leases that changes so far broke (to be sent with the next reply).
    fn take_broken(&mut self) {
        if let Some(l) = self.leases.as_mut() {
            let b = l.broken();
            if !b.is_empty() {
                self.trees.clear();
                self.broken.extend(b);
            }
        }
    }

    fn request_inner(&mut self, id: u32, r: Request) -> Vec<Frame> {
        let one = |r: Reply| vec![Message::Reply(r).to_frame(id)];
        if matches!(
            r,
            Request::Commit { .. }
                | Request::Mkdir { .. }
                | Request::Unlink { .. }
                | Request::Rmdir { .. }
                | Request::Rename { .. }
                | Request::Symlink { .. }
                | Request::SetAttr { .. }
        ) {
            // The tree changes: digests computed before no longer hold.
            self.trees.clear();
        }
        match r {
            Request::GetAttr { path } => match self.export.stat(&path) {
                Ok((mut attr, fid)) => {
                    attr.lease_ms = self.lease(&path, false);
                    attr.oid = match attr.kind {
                        FileKind::Dir => self.tree_id(&path),
                        _ => self.recipes.get(&fid).map(|(_, o)| o.id()),
                    };
                    one(Reply::Attr(attr))
                }
                Err(e) => one(io_error(&path, &e)),
            },
            Request::ReadDir { path } => match self.listing(&path) {
                Ok(entries) => paged(id, entries, DIR_PAGE, Reply::DirEntries),
                Err(e) => one(io_error(&path, &e)),
            },
            Request::ReadDirAgainst { path, keys } => match self.listing(&path) {
                Ok(entries) => {
                    let named: std::collections::HashSet<u32> = keys.iter().copied().collect();
                    let mut here = std::collections::HashSet::new();
                    let mut send = vec![];
                    let mut unkeyed = false;
                    for e in &entries {
                        match self.entry_key(&path, e) {
                            Some(k) if named.contains(&k) => {
                                here.insert(k);
                            }
                            k => {
                                // The client checks what it rebuilt against the tree digest,
                                // which it cannot compute over a symlink it has not read.
                                unkeyed |= k.is_none() || e.attr.kind == FileKind::Symlink;
                                send.push(e.clone());
                            }
                        }
                    }
                    if unkeyed {
                        // Then the whole listing, none of the client's entries taken as known.
                        here.clear();
                        send = entries;
                    }
                    let mut present = Some(keys.iter().map(|k| here.contains(k)).collect());
                    paged(id, send, DIR_PAGE, |entries| Reply::DirDelta {
                        present: present.take().unwrap_or_default(),
                        entries,
                    })
                }
                Err(e) => one(io_error(&path, &e)),
            },
            Request::GetRecipe { path, from } => match self.recipe(&path) {
                Ok((recipe, version)) => {
                    let total = recipe.len() as u64;
                    let start = from.min(total) as usize;
                    let mut first = start as u64;
                    paged(
                        id,
                        recipe.chunks()[start..].to_vec(),
                        RECIPE_PAGE,
                        |chunks| {
                            let page = RecipePage {
                                version,
                                total_chunks: total,
                                first,
                                chunks,
                            };
                            first += page.chunks.len() as u64;
                            Reply::Recipe(page)
                        },
                    )
                }
                Err(e) => one(io_error(&path, &e)),
            },
            Request::GetRecipeDelta { path, known } => match self.recipe(&path) {
                Ok((recipe, version)) => recipe_delta(id, &recipe, version, &known, false),
                Err(e) => one(io_error(&path, &e)),
            },
            Request::GetRecipeShort { path, known } => match self.recipe(&path) {
                Ok((recipe, version)) => recipe_delta(id, &recipe, version, &known, true),
                Err(e) => one(io_error(&path, &e)),
            },
            Request::GetChunks { ids } => {
                let mut frames = vec![];
                let mut batch = vec![];
                let mut bytes = 0;
                for cid in ids {
                    if let Some(data) = self.chunk(&cid) {
                        bytes += data.len();
                        batch.push((cid, data));
                        if bytes >= CHUNKS_FRAME_BYTES {
                            let mut f = Message::Reply(Reply::Chunks(std::mem::take(&mut batch)))
                                .to_frame(id);
                            f.flags |= FLAG_MORE;
                            frames.push(f);
                            bytes = 0;
                        }
                    }
                }
                frames.push(Message::Reply(Reply::Chunks(batch)).to_frame(id));
                frames
            }
            Request::GetChunksAgainst { ids, keys, olds } => {
                let asked: Vec<Option<Id>> = ids.iter().copied().map(Some).collect();
                let fixed_keys = |k| {
                    let cut = crate::delta::Cut::FastCdc;
                    crate::delta::Keys::new(k, ferry_proto::PIECE_KEY_BYTES, false, cut)
                };
                let olds = olds.map(|o| o.into_iter().map(Some).collect());
                match self.chunks_against(&asked, keys.map(fixed_keys), olds, vec![]) {
                    Ok(Against::Plain(found)) => one(Reply::Chunks(
                        found.into_iter().map(|(i, d)| (ids[i], d)).collect(),
                    )),
                    Ok(Against::Frame {
                        found,
                        olds,
                        refs,
                        data,
                        ..
                    }) => one(Reply::ChunksAgainst {
                        ids: found.into_iter().map(|i| ids[i]).collect(),
                        olds,
                        refs,
                        data,
                    }),
                    Err(e) => one(error(ErrorCode::Io, format!("compressing: {e}"))),
                }
            }
            Request::GetChunksShort {
                ids,
                key_bytes,
                runs,
                keys,
                olds,
                context,
            } => {
                let asked: Vec<Option<Id>> =
                    ids.iter().map(|s| self.short_ids.get(s).copied()).collect();
                let cut = crate::delta::Cut::of(self.features);
                if runs && cut != crate::delta::Cut::Lbfs {
                    return one(error(
                        ErrorCode::BadRequest,
                        "keys that count in runs need the PIECES_2 feature",
                    ));
                }
                let three = key_bytes < *ferry_proto::SHORT_KEY_BYTES.start() && !runs;
                if three && keys.is_some() && self.features & ferry_proto::FEATURE_KEYS_3 == 0 {
                    return one(error(
                        ErrorCode::BadRequest,
                        "3-byte keys need the KEYS_3 feature unless they count in runs",
                    ));
                }
                if context.is_some() && self.features & ferry_proto::FEATURE_CONTEXT == 0 {
                    return one(error(
                        ErrorCode::BadRequest,
                        "a context needs the CONTEXT feature",
                    ));
                }
                // What the file holds there now; if it cannot be read, no context.
                let context = context
                    .and_then(|c| self.read_context(&c))
                    .unwrap_or_default();
                let short_keys = |k| crate::delta::Keys::new(k, key_bytes as usize, runs, cut);
                let mut budget = MAX_OLDS;
                let olds = olds.map(|o| match o {
                    OldIds::Whole(ids) => ids.into_iter().map(Some).collect(),
                    OldIds::Short(ids) => self.find_olds(&ids, &mut budget),
                });
                one(
                    match self.chunks_against(&asked, keys.map(short_keys), olds, context) {
                        Ok(Against::Plain(found)) => Reply::ChunksShort {
                            found: found.iter().map(|(i, _)| *i as u32).collect(),
                            zstd: false,
                            context: false,
                            olds: vec![],
                            refs: vec![],
                            data: found.into_iter().flat_map(|(_, d)| d).collect(),
                        },
                        Ok(Against::Frame {
                            found,
                            context,
                            olds,
                            refs,
                            data,
                        }) => Reply::ChunksShort {
                            found: found.into_iter().map(|i| i as u32).collect(),
                            zstd: true,
                            context,
                            olds,
                            refs,
                            data,
                        },
                        Err(e) => error(ErrorCode::Io, format!("compressing: {e}")),
                    },
                )
            }
            Request::Have { ids } => {
                let flags = ids
                    .iter()
                    .map(|i| self.staging.contains(i).unwrap_or(false) || self.chunk(i).is_some())
                    .collect();
                one(Reply::Have(flags))
            }
            Request::PutChunks { chunks } => {
                for (cid, data) in &chunks {
                    let Ok(v) = VerifiedChunk::check(*cid, data) else {
                        return one(error(
                            ErrorCode::BadRequest,
                            format!("chunk {cid} does not match its id"),
                        ));
                    };
                    if let Err(e) = self.staging.put(&v) {
                        let code = if e.is_disk_full() {
                            ErrorCode::NoSpace
                        } else {
                            ErrorCode::Io
                        };
                        return one(error(code, format!("storing chunk {cid}: {e}")));
                    }
                }
                one(Reply::Ok)
            }
            Request::Commit {
                path,
                if_version,
                recipe,
                mode,
                mtime_ns,
            } => one(self
                .commit(&path, if_version, &recipe, mode, mtime_ns)
                .unwrap_or_else(|r| r)),
            Request::Mkdir { path, mode } => one(self.at(&path, |dir, name| {
                rustix::fs::mkdirat(
                    dir,
                    os(name),
                    rustix::fs::Mode::from_raw_mode(mode & 0o7777),
                )?;
                Ok(())
            })),
            Request::Unlink { path } => one(self.at(&path, |dir, name| {
                rustix::fs::unlinkat(dir, os(name), rustix::fs::AtFlags::empty())?;
                Ok(())
            })),
            Request::Rmdir { path } => one(self.at(&path, |dir, name| {
                rustix::fs::unlinkat(dir, os(name), rustix::fs::AtFlags::REMOVEDIR)?;
                Ok(())
            })),
            Request::Symlink { path, target } => one(self.at(&path, |dir, name| {
                rustix::fs::symlinkat(os(&target), dir, os(name))?;
                Ok(())
            })),
            Request::Rename { from, to } => {
                let r = (|| -> io::Result<()> {
                    let (fd, fname) = self.export.parent(&from)?;
                    let (td, tname) = self.export.parent(&to)?;
                    rustix::fs::renameat(&fd, os(&fname), &td, os(&tname))?;
                    rustix::fs::fsync(&td)?;
                    rustix::fs::fsync(&fd)?;
                    Ok(())
                })();
                one(match r {
                    Ok(()) => Reply::Ok,
                    Err(e) => io_error(&from, &e),
                })
            }
            Request::SetAttr {
                path,
                mode,
                mtime_ns,
                size,
            } => one(if size.is_some() {
                error(
                    ErrorCode::Unsupported,
                    "SetAttr does not change sizes: commit a new version",
                )
            } else {
                match self.export.set_attr(&path, mode, mtime_ns) {
                    Ok(()) => Reply::Ok,
                    Err(e) => io_error(&path, &e),
                }
            }),
            Request::ReadFile { path } => one(match self.read_small(&path) {
                Ok(data) => Reply::Data(data),
                Err(e) => io_error(&path, &e),
            }),
            Request::ReadRange { path, offset, len } => {
                one(match self.read_range(&path, offset, len) {
                    Ok((oid, data)) => Reply::Range { oid, data },
                    Err(e) => io_error(&path, &e),
                })
            }
            Request::GetFilesShort { files } => {
                let mut budget = MAX_OLDS;
                let files = files
                    .into_iter()
                    .map(|(path, olds)| (path, self.find_olds(&olds, &mut budget)))
                    .collect();
                one(self.files_against(files))
            }
            Request::GetFilesAgainst { files } => {
                let whole = |olds: Vec<Id>| olds.into_iter().map(Some).collect();
                let files = files
                    .into_iter()
                    .map(|(p, olds)| (p, whole(olds)))
                    .collect();
                one(self.files_against(files))
            }
            Request::ReadLink { path } => match self.export.read_link(&path) {
                Ok(target) => one(Reply::Link(target)),
                Err(e) => one(io_error(&path, &e)),
            },
        }
    }

    /// Runs `op` on the parent directory of `path` and its last component, then fsyncs the
    /// directory so the change is durable before the reply.
    fn at(&self, path: &WirePath, op: impl FnOnce(&OwnedFd, &[u8]) -> io::Result<()>) -> Reply {
        let r = (|| {
            let (dir, name) = self.export.parent(path)?;
            op(&dir, &name)?;
            rustix::fs::fsync(&dir)?;
            Ok::<_, io::Error>(())
        })();
        match r {
            Ok(()) => Reply::Ok,
            Err(e) => io_error(path, &e),
        }
    }

    /// MKTMPFILE + COMMITTMP: assembles the file `recipe` describes in a temporary file in the
    /// same directory, fsyncs it, and renames it over `path` if `path` is still at `if_version`
    /// (or still absent), then fsyncs the directory. A reader sees the old file or the new one;
    /// a crash at any point leaves one of them (and perhaps a `.ferry-*.tmp` file).
    fn commit(
        &mut self,
        path: &WirePath,
        if_version: Option<u64>,
        recipe: &Recipe,
        mode: u32,
        mtime_ns: i64,
    ) -> Result<Reply, Reply> {
        let ioe = |e: io::Error| io_error(path, &e);
        let (dir, name) = self.export.parent(path).map_err(ioe)?;
        let check = |dir: &OwnedFd| -> Result<(), Reply> {
            let cur = stat_at(dir, &name).map_err(ioe)?;
            match (cur, if_version) {
                (Some((a, _)), _) if a.kind == FileKind::Dir => {
                    Err(error(ErrorCode::IsDir, format!("{path:?} is a directory")))
                }
                (Some((a, _)), Some(v)) if a.version == v => Ok(()),
                (None, None) => Ok(()),
                (Some(_), None) => Err(error(
                    ErrorCode::Conflict,
                    format!("{path:?} was created since"),
                )),
                (Some(_), Some(v)) => Err(error(
                    ErrorCode::Conflict,
                    format!("{path:?} changed since version {v}"),
                )),
                (None, Some(v)) => Err(error(
                    ErrorCode::Conflict,
                    format!("{path:?} was removed since version {v}"),
                )),
            }
        };
        check(&dir)?;
        let missing = recipe
            .chunks()
            .iter()
            .filter(|c| {
                !self.staging.contains(&c.id).unwrap_or(false) && !self.hints.contains_key(&c.id)
            })
            .count();
        if missing > 0 {
            return Err(error(
                ErrorCode::MissingChunks,
                format!("{missing} chunks of {path:?} are neither sent nor found"),
            ));
        }
        crate::export::remove_stale_temps(&dir);
        let tmp_name = crate::export::commit_temp_name(self.next_tmp());
        let fd = rustix::fs::openat(
            &dir,
            os(tmp_name.as_bytes()),
            rustix::fs::OFlags::CREATE
                | rustix::fs::OFlags::EXCL
                | rustix::fs::OFlags::WRONLY
                | rustix::fs::OFlags::CLOEXEC
                | rustix::fs::OFlags::NOFOLLOW,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .map_err(|e| ioe(e.into()))?;
        let file = std::fs::File::from(fd);
        let written = self.write_recipe(&file, recipe).and_then(|oid| {
            rustix::fs::fchmod(&file, rustix::fs::Mode::from_raw_mode(mode & 0o7777))?;
            let t = rustix::fs::Timespec {
                tv_sec: mtime_ns.div_euclid(1_000_000_000),
                tv_nsec: mtime_ns.rem_euclid(1_000_000_000) as _,
            };
            rustix::fs::futimens(
                &file,
                &rustix::fs::Timestamps {
                    last_access: t,
                    last_modification: t,
                },
            )?;
            file.sync_all()?;
            Ok(oid)
        });
        let discard = || {
            let _ =
                rustix::fs::unlinkat(&dir, os(tmp_name.as_bytes()), rustix::fs::AtFlags::empty());
        };
        let oid = match written {
            Ok(Some(oid)) => oid,
            Ok(None) => {
                discard();
                return Err(error(
                    ErrorCode::MissingChunks,
                    format!("a chunk of {path:?} went missing during the commit"),
                ));
            }
            Err(e) => {
                discard();
                return Err(ioe(e));
            }
        };
        // Narrow the race with local writers: check again right before the rename.
        if let Err(r) = check(&dir) {
            discard();
            return Err(r);
        }
        // The version being replaced goes to the trash, where its chunks stay findable.
        if if_version.is_some() {
            self.keep_in_trash(&dir, &name);
        }
        if let Err(e) = rustix::fs::renameat(&dir, os(tmp_name.as_bytes()), &dir, os(&name)) {
            discard();
            return Err(ioe(e.into()));
        }
        rustix::fs::fsync(&dir).map_err(|e| ioe(e.into()))?;
        // This commit's own change breaks the leases granted before it (sent ahead of the
        // reply), not the one the reply carries; and that one is granted only if the name
        // still holds what was written.
        let st = rustix::fs::fstat(&file).map_err(|e| ioe(e.into()))?;
        // Closing it is a change too (IN_CLOSE_WRITE under the new name).
        drop(file);
        self.take_broken();
        let (mut attr, fid) = crate::export::attr_of(&st);
        self.remember(path, fid, recipe.clone(), oid);
        attr.oid = Some(oid.id());
        let still = stat_at(&dir, &name).ok().flatten();
        if still.is_some_and(|(a, _)| a.version == attr.version) {
            attr.lease_ms = self.lease(path, false);
        }
        Ok(Reply::Attr(attr))
    }

    /// Hard-links `name` in `dir` into the trash and points the hints of its chunks there, then
    /// trims the trash to its bound. Best effort: a trash that cannot be kept costs only bytes.
    fn keep_in_trash(&mut self, dir: &OwnedFd, name: &[u8]) {
        if self.opts.trash_bytes == 0 {
            return;
        }
        let r = (|| -> io::Result<()> {
            let Some((_, fid)) = stat_at(dir, name)? else {
                return Ok(());
            };
            let trash = self.export.trash_dir()?;
            let entry = format!("{}-{}-{}", fid.ino, fid.mtime_ns, self.next_tmp());
            rustix::fs::linkat(
                dir,
                os(name),
                &trash,
                entry.as_str(),
                rustix::fs::AtFlags::empty(),
            )?;
            if let Some((recipe, _)) = self.recipes.get(&fid).cloned() {
                let path = WirePath::new(format!("{}/{entry}", crate::export::TRASH).into_bytes())
                    .map_err(io::Error::other)?;
                self.hint_all(&path, &recipe);
            }
            trim_trash(&trash, self.opts.trash_bytes)
        })();
        if let Err(e) = r {
            tracing::warn!("keeping the replaced version in the trash: {e}");
        }
    }

    fn next_tmp(&mut self) -> u64 {
        self.tmp_counter += 1;
        self.tmp_counter
    }

    /// Writes the chunks of `recipe` to `file` from the staging store or verified hints.
    /// `Ok(None)` if a chunk could not be found after all.
    fn write_recipe(&mut self, file: &std::fs::File, recipe: &Recipe) -> io::Result<Option<Oid>> {
        use std::io::Write;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        let mut whole = ferry_format::IdHasher::new(recipe.alg());
        for c in recipe.chunks() {
            let data = match self.staging.get(&c.id) {
                Ok(Some(d)) => Some(d),
                _ => self.chunk(&c.id),
            };
            let Some(data) = data else {
                return Ok(None);
            };
            whole.update(&data);
            out.write_all(&data)?;
        }
        out.flush()?;
        Ok(Some(Oid(whole.finish())))
    }

    /// Notes that the chunks of `recipe` lie in the file at `path` (hints, verified on use).
    fn hint_all(&mut self, path: &WirePath, recipe: &Recipe) {
        for (offset, c) in recipe.with_offsets() {
            self.short_ids.insert(ferry_proto::short_id(&c.id), c.id);
            self.hints.insert(
                c.id,
                Hint {
                    path: path.clone(),
                    offset,
                    len: c.len,
                },
            );
        }
    }

    /// Records a file's recipe (keyed by its identity) and where each of its chunks lies.
    fn remember(&mut self, path: &WirePath, fid: FileId, recipe: Recipe, oid: Oid) {
        self.hint_all(path, &recipe);
        if self.recipes.len() >= RECIPE_CACHE_ENTRIES {
            self.recipes.clear();
        }
        self.recipes.insert(fid, (recipe, oid));
    }

    /// The recipe of a file and its version, from the cache when the file has not changed.
    fn recipe(&mut self, path: &WirePath) -> io::Result<(Recipe, u64)> {
        for _ in 0..3 {
            let file = self.export.open_file(path)?;
            let st = rustix::fs::fstat(&file)?;
            let (attr, fid) = crate::export::attr_of(&st);
            if attr.kind != FileKind::File {
                return Err(io::Error::from(io::ErrorKind::IsADirectory));
            }
            if let Some((r, _)) = self.recipes.get(&fid) {
                return Ok((r.clone(), attr.version));
            }
            let history = self.history.clone();
            let (recipe, oid) = chunk_object(&file, &self.opts.chunker, self.opts.hash, |c, d| {
                keep(&history, c.id, d);
                Ok::<_, io::Error>(())
            })?;
            // A file that changed while it was read gives a recipe of neither version: again.
            let (_, after) = crate::export::attr_of(&rustix::fs::fstat(&file)?);
            if after != fid {
                continue;
            }
            self.remember(path, fid, recipe.clone(), oid);
            return Ok((recipe, attr.version));
        }
        Err(io::Error::other("the file keeps changing while it is read"))
    }

    /// Files whole (GetFilesAgainst), compressed together against the old chunks the
    /// history holds; each file is cut (and kept in the history) so its id goes along. A file
    /// that cannot be read, or would pass the reply's bound, is left out (`None`).
    fn files_against(&mut self, files: Vec<(WirePath, Vec<Option<Id>>)>) -> Reply {
        self.files_frame(files)
            .unwrap_or_else(|e| error(ErrorCode::Io, format!("compressing: {e}")))
    }

    fn files_frame(&mut self, files: Vec<(WirePath, Vec<Option<Id>>)>) -> io::Result<Reply> {
        let mut sent = Vec::with_capacity(files.len());
        let mut data = vec![];
        let history = self.history.clone();
        for (path, _) in &files {
            let left = ferry_proto::MAX_FILES_AGAINST - data.len() as u64;
            let Ok(bytes) = self.read_whole(path, left) else {
                sent.push(None);
                continue;
            };
            let (_, oid) = chunk_object(&bytes[..], &self.opts.chunker, self.opts.hash, |c, d| {
                keep(&history, c.id, d);
                Ok::<_, io::Error>(())
            })?;
            sent.push(Some((bytes.len() as u64, oid.id())));
            data.extend_from_slice(&bytes);
        }
        let olds: Vec<Option<Id>> = files.into_iter().flat_map(|(_, olds)| olds).collect();
        let (used, prefix, _) = self.olds_in_history(&olds);
        let frame = self.frame_level.timed(data.len(), &data, |level| {
            crate::delta::encode(&data, &prefix, level)
        })?;
        Ok(Reply::FilesAgainst {
            files: sent,
            olds: used,
            data: frame,
        })
    }

    /// The chunks `asked` this server holds (a reply's worth, in the order asked; `None` is
    /// one it cannot name), compressed against the client's old data when that pays:
    /// GetChunksAgainst and GetChunksShort.
    fn chunks_against(
        &mut self,
        asked: &[Option<Id>],
        keys: Option<crate::delta::Keys>,
        olds: Option<Vec<Option<Id>>>,
        context: Vec<u8>,
    ) -> io::Result<Against> {
        let mut found = vec![];
        let mut bytes = 0;
        for (i, cid) in asked.iter().enumerate() {
            if let Some(d) = cid.and_then(|c| self.chunk(&c)) {
                if !found.is_empty() && bytes + d.len() > crate::delta::MAX_REPLY_DATA {
                    break;
                }
                bytes += d.len();
                found.push((i, d));
            }
        }
        let data: Vec<u8> = found.iter().flat_map(|(_, d)| d.iter().copied()).collect();
        // Each list, when sent, replaces the one kept from the previous request.
        if let Some(keys) = keys {
            self.piece_keys = keys;
        }
        if let Some(olds) = olds {
            self.olds = olds;
        }
        // The old chunks the history still holds, whole, head the prefix.
        let (old_refs, mut prefix, every_old) = self.olds_in_history(&self.olds);
        // Pieces of what the history lacks. Cut as one run: the client asks for a file's
        // missing chunks in file order, mostly side by side, and measured on the public
        // workloads one run matches more than cutting each chunk alone.
        let mut refs = vec![];
        if !every_old && !self.piece_keys.is_empty() {
            let (r, pieces) = crate::delta::find([&data[..]], &self.piece_keys);
            if prefix.len() + pieces.len() <= crate::delta::MAX_PREFIX {
                refs = r;
                prefix.extend_from_slice(&pieces);
            }
        }
        // Bytes of the file the client holds (GetChunksShort's context) head it all. They
        // count with the data toward a large frame (whose level follows the link): the
        // higher levels take time in proportion to the prefix too (mbox-append, 247 KB
        // against 4 MiB of context: level 19 in ~1 s, level 9 in ~0.1 s).
        let with_context = !context.is_empty();
        let work = data.len() + context.len();
        if with_context {
            prefix.splice(0..0, context);
        }
        if prefix.is_empty() {
            return Ok(Against::Plain(found));
        }
        // Plain chunks compress in the session's stream with the context of all sent before
        // (other files like this one): when they compress at all, send them so unless the old
        // data is clearly worth more, judged against compressing them alone (a large frame's
        // at the session's level: quicker, and what the stream would mostly do).
        let floor = self.frame_level.floor();
        let (against, alone) = self.frame_level.timed(work, &data, |level| {
            let alone_level = if data.len() <= crate::delta::SMALL_FRAME {
                level
            } else {
                floor
            };
            let alone =
                crate::delta::encode(&data, &[], alone_level).map_or(usize::MAX, |f| f.len());
            (crate::delta::encode(&data, &prefix, level), alone)
        });
        let against = against?;
        let compressible = alone * 10 < data.len() * 9;
        let worth = if compressible {
            against.len() * 10 < alone * 9
        } else {
            against.len() < alone
        };
        if !worth {
            return Ok(Against::Plain(found));
        }
        Ok(Against::Frame {
            found: found.into_iter().map(|(i, _)| i).collect(),
            context: with_context,
            olds: old_refs,
            refs,
            data: against,
        })
    }

    /// The old chunks `olds` that the history holds (each once, at most
    /// [`crate::delta::MAX_PREFIX`] bytes in all): their indices, their bytes concatenated,
    /// and whether that is every one of them.
    fn olds_in_history(&self, olds: &[Option<Id>]) -> (Vec<u32>, Vec<u8>, bool) {
        let (mut used, mut prefix) = (vec![], vec![]);
        let Some(h) = &self.history else {
            return (used, prefix, false);
        };
        let mut every = !olds.is_empty();
        let mut seen = std::collections::HashSet::new();
        for (i, old) in olds.iter().enumerate() {
            let Some(old) = old else {
                every = false;
                continue;
            };
            if !seen.insert(*old) {
                continue;
            }
            match h.get(old) {
                Ok(Some(d)) if prefix.len() + d.len() <= crate::delta::MAX_PREFIX => {
                    used.push(i as u32);
                    prefix.extend_from_slice(&d);
                }
                _ => every = false,
            }
        }
        (used, prefix, every)
    }

    /// The chunks of the history that short ids name (FEATURE_SHORT_OLDS), by place. Each
    /// lookup reads a record's header, so a request looks up at most [`MAX_OLDS`] (`budget`,
    /// what is left of them): more than a prefix can hold (a client names at most 8 MiB of
    /// old chunks, of 2 KiB at least); the rest are `None`.
    fn find_olds(&self, short: &[u64], budget: &mut usize) -> Vec<Option<Id>> {
        let Some(h) = &self.history else {
            return vec![None; short.len()];
        };
        short
            .iter()
            .map(|&p| {
                *budget = budget.checked_sub(1)?;
                h.find_prefix(p).ok().flatten()
            })
            .collect()
    }

    /// The bytes a context names, read from the file as it is now; `None` if they cannot all
    /// be read (no context, then, and the reply says so). The decoder bounds their total.
    fn read_context(&self, c: &Context) -> Option<Vec<u8>> {
        let f = self.export.open_file(&c.path).ok()?;
        let mut out = vec![];
        for &(offset, len) in &c.ranges {
            let at = out.len();
            out.resize(at + len as usize, 0);
            f.read_exact_at(&mut out[at..], offset).ok()?;
        }
        Some(out)
    }

    /// A small file's bytes, whole (ReadFile): at most [`ferry_proto::MAX_READ_FILE`].
    fn read_small(&self, path: &WirePath) -> io::Result<Vec<u8>> {
        let data = self.read_whole(path, ferry_proto::MAX_READ_FILE as u64)?;
        if self.history.is_some() {
            // The client will hold this version: cut it as a recipe would.
            chunk_object(&data[..], &self.opts.chunker, self.opts.hash, |c, d| {
                keep(&self.history, c.id, d);
                Ok::<_, io::Error>(())
            })?;
        }
        Ok(data)
    }

    /// Bytes `offset..offset + len` of a file (fewer at its end), with the object id of the
    /// whole version they were read from (ReadRange). The id comes with the file's recipe, cut
    /// (and kept in the history) once per version, as for GetRecipe.
    fn read_range(&mut self, path: &WirePath, offset: u64, len: u32) -> io::Result<(Id, Vec<u8>)> {
        let file = self.export.open_file(path)?;
        let (attr, fid) = crate::export::attr_of(&rustix::fs::fstat(&file)?);
        if attr.kind != FileKind::File {
            return Err(io::Error::from(io::ErrorKind::IsADirectory));
        }
        if !self.recipes.contains_key(&fid) {
            self.recipe(path)?;
        }
        let changed = || io::Error::other("the file changed while it was read; fetch it again");
        let oid = self.recipes.get(&fid).ok_or_else(changed)?.1.id();
        let mut data = vec![0u8; (len as u64).min(attr.size.saturating_sub(offset)) as usize];
        file.read_exact_at(&mut data, offset)
            .map_err(|_| changed())?;
        if crate::export::attr_of(&rustix::fs::fstat(&file)?).1 != fid {
            return Err(changed());
        }
        Ok((oid, data))
    }

    /// A regular file's bytes, whole, if it is at most `limit` bytes long.
    fn read_whole(&self, path: &WirePath, limit: u64) -> io::Result<Vec<u8>> {
        use std::io::Read;
        let file = self.export.open_file(path)?;
        let st = rustix::fs::fstat(&file)?;
        if crate::export::attr_of(&st).0.kind != FileKind::File {
            return Err(io::Error::from(io::ErrorKind::IsADirectory));
        }
        let mut data = Vec::with_capacity((st.st_size as u64).min(limit) as usize);
        file.take(limit + 1).read_to_end(&mut data)?;
        if data.len() as u64 > limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("over {limit} bytes: fetch it by recipe"),
            ));
        }
        Ok(data)
    }

    /// A chunk's bytes from wherever it was seen, verified; `None` if no valid copy is known.
    fn chunk(&mut self, id: &Id) -> Option<Vec<u8>> {
        let hint = self.hints.get(id)?.clone();
        let read = || -> io::Result<Vec<u8>> {
            let f = self.export.open_file(&hint.path)?;
            let mut buf = vec![0u8; hint.len as usize];
            f.read_exact_at(&mut buf, hint.offset)?;
            Ok(buf)
        };
        match read() {
            Ok(buf) if id.matches(&buf) => Some(buf),
            _ => {
                // The file changed or went away: the hint was wrong, which costs only this.
                self.hints.remove(id);
                let short = ferry_proto::short_id(id);
                if self.short_ids.get(&short) == Some(id) {
                    self.short_ids.remove(&short);
                }
                None
            }
        }
    }
}

/// Puts a chunk just cut (and hashed) into the history, if there is one. A history that cannot
/// grow costs deltas later, not the answer now.
fn keep(history: &Option<Staging>, id: Id, data: &[u8]) {
    if let Some(h) = history {
        if let Err(e) = h.put(&VerifiedChunk::assume_verified(id, data)) {
            tracing::debug!("history: {e}");
        }
    }
}

/// Deletes the oldest trash entries until the rest fit in `limit` bytes.
fn trim_trash(trash: &OwnedFd, limit: u64) -> io::Result<()> {
    let mut entries = vec![];
    for e in rustix::fs::Dir::read_from(trash)? {
        let e = e?;
        let name = e.file_name().to_owned();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        let st = rustix::fs::statat(trash, &*name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?;
        entries.push((st.st_ctime, st.st_size as u64, name));
    }
    entries.sort();
    let mut total: u64 = entries.iter().map(|e| e.1).sum();
    for (_, size, name) in entries {
        if total <= limit {
            break;
        }
        rustix::fs::unlinkat(trash, &*name, rustix::fs::AtFlags::empty())?;
        total -= size;
    }
    Ok(())
}

/// A recipe as parts against the pages the client named: the pages it holds go as their
/// index in `known`, the rest in full, at most [`RECIPE_PAGE`] chunks a frame.
fn recipe_delta(id: u32, recipe: &Recipe, version: u64, known: &[u64], short: bool) -> Vec<Frame> {
    let mut index = HashMap::with_capacity(known.len());
    for (i, k) in known.iter().enumerate() {
        index.entry(*k).or_insert(i as u32);
    }
    let mut frames: Vec<Vec<RecipePart>> = vec![vec![]];
    let mut in_frame = 0;
    for page in recipe.pages() {
        if in_frame + page.len() > RECIPE_PAGE {
            frames.push(vec![]);
            in_frame = 0;
        }
        let parts = frames.last_mut().expect("non-empty");
        let page_len = page.len();
        in_frame += match index.get(&ferry_format::page_key(page)) {
            Some(&i) => {
                parts.push(RecipePart::Known(i));
                1
            }
            None if short => {
                let page = page.iter().map(|c| (c.len, ferry_proto::short_id(&c.id)));
                match parts.last_mut() {
                    Some(RecipePart::Short(cs)) => cs.extend(page),
                    _ => parts.push(RecipePart::Short(page.collect())),
                }
                page_len
            }
            None => {
                match parts.last_mut() {
                    Some(RecipePart::Chunks(cs)) => cs.extend_from_slice(page),
                    _ => parts.push(RecipePart::Chunks(page.to_vec())),
                }
                page_len
            }
        };
    }
    let check = recipe.check();
    let n = frames.len();
    frames
        .into_iter()
        .enumerate()
        .map(|(i, parts)| {
            let mut f = Message::Reply(Reply::RecipeDelta(RecipeDelta {
                version,
                total_chunks: recipe.len() as u64,
                check,
                alg: recipe.alg(),
                parts,
            }))
            .to_frame(id);
            if i + 1 < n {
                f.flags |= FLAG_MORE;
            }
            f
        })
        .collect()
}

/// Splits `items` into reply frames of `page` items, all but the last flagged MORE.
fn paged<T: Clone>(
    id: u32,
    items: Vec<T>,
    page: usize,
    mut wrap: impl FnMut(Vec<T>) -> Reply,
) -> Vec<Frame> {
    let mut frames: Vec<Frame> = items
        .chunks(page)
        .map(|p| Message::Reply(wrap(p.to_vec())).to_frame(id))
        .collect();
    if frames.is_empty() {
        frames.push(Message::Reply(wrap(vec![])).to_frame(id));
    }
    let n = frames.len();
    for f in &mut frames[..n - 1] {
        f.flags |= FLAG_MORE;
    }
    frames
}
