//! The file server's request handling, free of sockets: frames in, frames out.
//!
//! - `listing`: attributes, listings (against the client's entry keys) and tree digests.
//! - `content`: recipes, chunks (plainly, at the places a client names, or compressed against
//!   what it holds), whole files and ranges; where chunks are found (hints, verified on use).
//! - `upload`: Have, GetKeys and the streamed upload (Create, Write, Abort); `commit`: the
//!   commit under the directory's lock, and the trash.
//! - `names`: changes of names and attributes (create, remove, rename, link, set attributes).

use std::collections::HashMap;
use std::io;

use ferry_chunk::ChunkerSpec;
use ferry_format::{HashAlg, Id, Oid, Recipe};
use ferry_proto::{
    ErrorCode, Frame, Hello, Message, Reply, Request, WirePath, FEATURES, FEATURE_ENTRY_CHANGES,
    FEATURE_HISTORY, FEATURE_OWN_CHANGES, FEATURE_RATE, VERSION,
};
use ferry_store::ChunkStore;

use crate::export::{os, Export, FileId};

mod commit;
mod content;
mod dirsync;
mod frames;
mod group;
mod hints;
mod history;
mod indexing;
mod listing;
mod names;
mod objects;
mod ranges;
mod trash;
mod upload;
mod vault;

pub use indexing::IndexStats;
pub use objects::{ObjectShelf, ShelfError, MAX_OBJECT_READ};

/// How the server behaves.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub chunker: ChunkerSpec,
    pub hash: HashAlg,
    /// Attribute lease handed to clients.
    pub lease_ms: u32,
    /// Bytes of replaced file versions kept in the trash as chunk sources (0: no trash).
    pub trash_bytes: u64,
    /// Entries the trash keeps at most (16,384 by default), whatever their bytes: many small
    /// files replaced must not make every later scan of it long.
    pub trash_entries: usize,
    /// zstd level of the session stream this side sends, when the client speaks it.
    pub zstd_level: ferry_proto::Level,
    /// Hello feature bits this server offers (all it knows by default; fewer to answer as a
    /// server without them would).
    pub features: u64,
    /// A client that has not said Hello this long after the session began is hung up on
    /// (the daemon's; a remote shell's sessions wait as long as it takes).
    pub hello_timeout: Option<std::time::Duration>,
    /// Every chunk a client sends goes into the staging store as it arrives (a store other
    /// servers serve from, or the transfer daemon's). Off, only the chunks of an upload cut
    /// short are staged, when its session ends or the client aborts it (read back from its
    /// temporary file): a committed file's chunks are found in it through the index, and a
    /// second copy of every byte uploaded cost a quarter of an upload's time.
    pub stage_writes: bool,
    /// Commits are synced in groups (see `group`) only while syncing a file takes the session
    /// this long or longer, as measured on its last ones (a journaled disk: 0.7 ms a small
    /// file); where it costs nothing (a tmpfs), holding answers back would only keep the
    /// client waiting. Zero: always.
    pub group_sync_min: std::time::Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            chunker: ChunkerSpec::default(),
            hash: HashAlg::Blake3,
            lease_ms: 60_000,
            trash_bytes: 256 << 20,
            trash_entries: 16_384,
            zstd_level: crate::conn::DEFAULT_ZSTD_LEVEL,
            features: FEATURES,
            hello_timeout: None,
            stage_writes: true,
            group_sync_min: std::time::Duration::from_micros(200),
        }
    }
}

/// Where chunks a client sends wait for the commit that uses them, and stay for a while after:
/// a cut upload resumes from them (Have finds them). A persistent store keeps them across
/// sessions.
pub type Staging = std::sync::Arc<dyn ChunkStore>;

/// Where a chunk was last seen: a hint, verified before use.
#[derive(Clone, Copy, Debug)]
struct Hint {
    /// Index into [`Server::hint_paths`].
    file: u32,
    offset: u64,
    len: u32,
}

/// Files recorded in the index in one transaction at most.
const RECORD_AT_ONCE: usize = 256;
/// How long the client is quiet before the server does its idle work ([`Server::idle`]).
pub const QUIET: std::time::Duration = std::time::Duration::from_millis(50);
/// Stale chunk hints forgotten after a request at most (a removal from the index costs about
/// 10 µs): a file gone since it was indexed is forgotten over several requests or sessions, or
/// in one stroke when its content is recorded again, while each request that meets the rest
/// costs a lookup each.
const FORGET_AT_ONCE: usize = 4096;
/// Files the index placed chunks in kept open during a request at most.
const INDEX_FILES_OPEN: usize = 64;
/// Chunk hints kept per session at most; past this they are forgotten and found again through
/// the persistent index or by recipes. Each costs ~300 bytes with its short id (measured with
/// heaptrack: ~195 for the hint, ~110 for the short id), so this bounds them near 80 MB.
const MAX_HINTS: usize = 256 << 10;
/// Recipes kept in memory before the cache is cleared (each costs ~36 bytes per chunk).
const RECIPE_CACHE_ENTRIES: usize = 100_000;

/// A file kept in the history is at most this fraction of its bound.
const HISTORY_SHARE: u64 = 16;

/// Serves one client session over an [`Export`].
pub struct Server {
    export: Export,
    opts: ServerOptions,
    staging: Staging,
    /// Recipes of file versions this session has cut, by identity.
    recipes: HashMap<FileId, (Recipe, Oid)>,
    /// Where each object id was last seen (a hint: the file may have changed since).
    objects: HashMap<Id, WirePath>,
    hints: HashMap<Id, Hint>,
    hint_paths: Vec<WirePath>,
    hint_files: HashMap<WirePath, u32>,
    /// The first 8 bytes of each hinted chunk's hash (little-endian), for short ids.
    short_ids: HashMap<u64, Id>,
    greeted: bool,
    /// Features both sides agreed on in the Hellos.
    features: u64,
    /// Directories whose changes are not yet durable (`FEATURE_DEFERRED_SYNC`).
    dir_syncs: dirsync::DirSyncs,
    /// The state of chunk requests against old data, kept between requests.
    against: content::AgainstState,
    /// Every chunk this server has cut, kept (bounded) as what clients may hold old versions
    /// of: the whole old version becomes the prefix of a delta.
    history: Option<history::History>,
    /// Files larger than this are not kept in the history (one would push out most of it).
    history_file_max: u64,
    /// Object ids of files read by ranges, hashed as the ranges go by.
    ranges: ranges::RangeHashes,
    /// Tree digests of directories, with when they were computed.
    trees: HashMap<WirePath, (std::time::Instant, [u8; 32])>,
    /// Uploads in progress, by the client's handle.
    uploads: upload::Uploads,
    /// Commits waiting to be synced together.
    group: group::Group,
    /// Where chunks, recipes and objects were seen, across sessions (LBFS's database).
    index: Option<std::sync::Arc<ferry_store::PathIndex>>,
    /// The client measured the link fast (see [`fast_link`](Self::fast_link)).
    fast_link: bool,
    /// The client's replies came within a few milliseconds (see [`Server::near_link`]).
    near_link: bool,
    /// Replies in order, some with large frames being compressed beside the session's thread
    /// (see [`frames_aside`](Self::frames_aside)).
    frames: frames::Frames,
    /// Files to record in the index ([`remember`](Self::remember)), written together when the
    /// session goes quiet ([`idle`](Self::idle)) or [`RECORD_AT_ONCE`] are waiting: the index
    /// is a hint, which this session's own hints cover meanwhile.
    to_record: Vec<(Vec<u8>, ferry_store::Stamp, Recipe, Oid)>,
    /// Chunks the index placed where they no longer are, forgotten together after the request
    /// (the first [`FORGET_AT_ONCE`]).
    stale: Vec<Id>,
    /// The files the index placed chunks in, opened (or not there) during this request: a
    /// `Have` of a large file's chunks opened it once a chunk.
    index_files: HashMap<Vec<u8>, Result<std::fs::File, io::ErrorKind>>,
    /// `None` when change notification is unavailable: then no leases are granted.
    leases: Option<crate::leases::Leases>,
    /// Leases broken by changes seen while handling a request, sent before its reply.
    broken: Vec<WirePath>,
    /// Names changed in leased listings (`FEATURE_ENTRY_CHANGES`), told with the next reply.
    changed: Vec<WirePath>,
    /// A transfer daemon's objects, served by capability.
    shelf: Option<std::sync::Arc<dyn ObjectShelf>>,
    /// Only objects are served (the client's key is not authorized for the export).
    objects_only: bool,
    opened: Option<objects::Opened>,
    creating: Option<objects::Creating>,
}

pub(crate) fn error(code: ErrorCode, message: impl Into<String>) -> Reply {
    Reply::Error {
        code,
        message: message.into(),
    }
}

pub(crate) fn io_error(path: &WirePath, e: &io::Error) -> Reply {
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
    /// A session serving `export`. Commits written in place that a crashed or killed server
    /// left part-done are finished first (see `crate::inplace`).
    pub fn new(export: Export, opts: ServerOptions, staging: Staging) -> Self {
        match crate::inplace::finish_interrupted(&export) {
            Ok(0) => {}
            Ok(n) => tracing::info!("finished {n} interrupted in-place commits"),
            Err(e) => tracing::warn!("finishing interrupted in-place commits: {e}"),
        }
        Server {
            against: content::AgainstState::new(crate::delta::frame_floor(opts.zstd_level)),
            export,
            opts,
            staging,
            recipes: HashMap::new(),
            objects: HashMap::new(),
            hints: HashMap::new(),
            hint_paths: vec![],
            hint_files: HashMap::new(),
            short_ids: HashMap::new(),
            greeted: false,
            features: 0,
            dir_syncs: Default::default(),
            trees: HashMap::new(),
            history: None,
            history_file_max: 0,
            ranges: Default::default(),
            uploads: upload::Uploads::default(),
            group: Default::default(),
            index: None,
            stale: vec![],
            index_files: HashMap::new(),
            to_record: vec![],
            fast_link: false,
            near_link: false,
            frames: Default::default(),
            leases: match crate::leases::Leases::new() {
                Ok(l) => Some(l),
                Err(e) => {
                    tracing::warn!("no change notification ({e}); granting no leases");
                    None
                }
            },
            broken: vec![],
            changed: vec![],
            shelf: None,
            objects_only: false,
            opened: None,
            creating: None,
        }
    }

    /// Keeps the chunks this server cuts in `history`, a store bounded to `bytes`, and offers
    /// the client to compress against old chunks found there (FEATURE_HISTORY). A file larger
    /// than a sixteenth of the bound is not kept: it would push out most of what is there
    /// (a changed version of it still travels as the chunks not found, only without a delta
    /// against the old ones).
    pub fn with_history(mut self, history: Staging, bytes: u64) -> Self {
        self.history = Some(history::History::new(history));
        self.history_file_max = bytes / HISTORY_SHARE;
        self
    }

    /// Keeps where chunks, recipes and objects are seen in `index` (shared by sessions over one
    /// export, kept across them), and finds them there: any chunk of the export, the trash or
    /// an earlier upload can be asked for by id, and an unchanged file is not cut again.
    pub fn with_index(mut self, index: std::sync::Arc<ferry_store::PathIndex>) -> Self {
        self.index = Some(index);
        self
    }

    /// The zstd level of this side's stream once the client's Hello offered one: it starts
    /// right after the reply to the Hello (and the client's after its `Compressed`).
    pub fn stream_level(&self) -> Option<ferry_proto::Level> {
        (self.features & ferry_proto::FEATURE_ZSTD_STREAM != 0).then_some(self.opts.zstd_level)
    }

    /// Whether there is work for when the client goes quiet ([`idle`](Self::idle)).
    pub fn idle_work(&self) -> bool {
        !self.to_record.is_empty() || self.index.as_ref().is_some_and(|i| i.unsynced())
    }

    /// The client has been quiet for a while ([`QUIET`]): what the session kept for the index
    /// is written now, off the path of its requests. (A mount's commits had each paid a
    /// transaction of the index, a fifth of the server's work in SQLite's transactions.)
    pub fn idle(&mut self) {
        self.record_now();
        // And made durable: the session's end (often just after: a fetch's client installs
        // its files, then hangs up and waits for the server to exit) has nothing left to sync.
        if let Some(i) = &self.index {
            if let Err(e) = i.sync() {
                tracing::debug!("index: {e}");
            }
        }
    }

    /// How long the loop may wait for the client now: until its Hello is due, or for ever.
    pub fn wait_limit(&self) -> Option<std::time::Duration> {
        self.opts.hello_timeout.filter(|_| !self.greeted)
    }

    /// Whether the client measured the link fast (a LAN): the session's stream may then go
    /// below its starting level where the compressor holds the link up.
    pub fn fast_link(&self) -> bool {
        self.fast_link
    }

    /// Whether the client's replies came within a few milliseconds (a LAN, or this
    /// machine): the session's stream then starts low (`Outflow::near_link`).
    pub fn near_link(&self) -> bool {
        self.near_link
    }

    /// Whether large frames against old data are compressed beside the session's thread: where
    /// compressing is what the client waits for (a link it measured fast or near), on a
    /// machine of more than one core.
    fn frames_aside(&self) -> bool {
        (self.fast_link || self.near_link) && frames::cores_to_spare()
    }

    /// Writing replies out waited `waited` on the transport: large frames against old data
    /// follow the link by it.
    pub fn wrote(&mut self, waited: std::time::Duration) {
        self.against.level.wrote(waited);
    }

    /// Whether a large frame against old data went into a reply and has not been written out
    /// since: the loop writes it at once, so the next one's level knows how the link took it.
    pub fn frame_unwritten(&self) -> bool {
        self.against.level.unwritten()
    }

    /// A descriptor that becomes readable when a leased path may have changed; then call
    /// [`invalidations`](Self::invalidations).
    pub fn watch_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.leases.as_ref().map(|l| l.fd())
    }

    /// Invalidate frames for every lease that changes broke (and Changed frames for the names
    /// changed in leased listings).
    pub fn invalidations(&mut self) -> Vec<Frame> {
        self.take_broken();
        self.unasked()
    }

    /// What the session tells unasked, taken: an `Invalidate` for each lease broken, then a
    /// `Changed` for each name changed in a leased listing, with what the name is now.
    fn unasked(&mut self) -> Vec<Frame> {
        let mut out: Vec<Frame> = self
            .broken
            .drain(..)
            .map(|p| Message::Invalidate(p).to_frame(0))
            .collect();
        for path in std::mem::take(&mut self.changed) {
            let m = match self.entry_now(&path) {
                Some(attr) => Message::Changed { path, attr },
                None => Message::Invalidate(path),
            };
            out.push(m.to_frame(0));
        }
        out
    }

    fn lease(&mut self, path: &WirePath, listing: bool) -> u32 {
        match self.leases.as_mut() {
            Some(l) => l.grant(&self.export, path, listing, self.opts.lease_ms),
            None => 0,
        }
    }

    /// Handles one frame from the client; returns the frames to send back, in order: those
    /// that can go now (a reply whose frame is still being compressed holds back the replies
    /// after it; [`finish_frames`](Self::finish_frames) waits for them).
    pub fn handle(&mut self, frame: &Frame) -> Vec<Frame> {
        let out = self.handle_now(frame);
        if self.frames.is_empty() {
            return out;
        }
        self.frames.push(out);
        self.frames.take(&mut self.against.level, false)
    }

    /// Every reply still held back, once its frame is compressed.
    pub fn finish_frames(&mut self) -> Vec<Frame> {
        self.frames.take(&mut self.against.level, true)
    }

    fn handle_now(&mut self, frame: &Frame) -> Vec<Frame> {
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
                        format!(
                            "the client ({}) speaks protocol {}, this server (ferry {}) speaks \
                             protocol {VERSION}: install the same version of ferry on both sides",
                            h.agent,
                            h.version,
                            env!("CARGO_PKG_VERSION")
                        ),
                    ));
                }
                self.greeted = true;
                self.features = h.features & FEATURES & self.opts.features;
                if self.features & ferry_proto::FEATURE_DEFERRED_SYNC != 0 {
                    self.dir_syncs.defer();
                }
                if let Some(l) = self.leases.as_mut() {
                    l.entry_changes = self.features & FEATURE_ENTRY_CHANGES != 0;
                }
                if self.history.is_none() {
                    self.features &= !FEATURE_HISTORY;
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
            // A measure, not a request: nothing is answered, even when it is not taken.
            Message::Rate {
                rate,
                sample,
                round_trip,
            } => {
                if self.features & FEATURE_RATE != 0 {
                    tracing::debug!(
                        "the client measures the link at {rate} bytes/s or more, replies after \
                         {round_trip} µs"
                    );
                    let round_trip =
                        (round_trip > 0).then(|| std::time::Duration::from_micros(round_trip));
                    self.against.level.link_rate(rate, sample, round_trip);
                    self.fast_link |= crate::delta::fast_link(rate, round_trip);
                    self.near_link |= crate::delta::near_link(round_trip);
                }
                vec![]
            }
            Message::Reply(_) | Message::Invalidate(_) | Message::Changed { .. } => {
                one(error(ErrorCode::BadRequest, "servers take requests"))
            }
            // The stream's own (taken by `serve` before it gets here).
            Message::Compressed => one(error(ErrorCode::BadRequest, "Compressed out of place")),
        }
    }

    fn request(&mut self, id: u32, r: Request) -> Vec<Frame> {
        // Commits parked so far are installed before any request that could see them.
        let settled = if self.may_pass_parked(&r) {
            vec![]
        } else {
            self.settle_parked()
        };
        // Changes made before this request break the leases they break now, before anything
        // is read for the reply: a lease granted below is broken only by later changes.
        self.take_broken();
        let mut out = settled;
        out.extend(self.dispatch(id, r));
        self.index_files.clear();
        // Stale hints go before new ones are recorded: a chunk found gone from where it was
        // may have been recorded where it is now.
        if let (Some(i), false) = (&self.index, self.stale.is_empty()) {
            let stale = std::mem::take(&mut self.stale);
            if let Err(e) = i.forget(&stale[..stale.len().min(FORGET_AT_ONCE)]) {
                tracing::debug!("forgetting stale chunk hints: {e}");
            }
        }
        if !self.broken.is_empty() || !self.changed.is_empty() {
            let breaks = self.unasked();
            out.splice(0..0, breaks);
        }
        out
    }

    /// Notes the leases that changes so far broke (to be sent with the next reply).
    fn take_broken(&mut self) {
        self.take_broken_own(&[]);
    }

    /// Like [`take_broken`](Self::take_broken), right after this session changed `paths`: for
    /// a client that asked for `FEATURE_OWN_CHANGES`, those changes do not break its leases on
    /// the listings of their directories (it changes its copies itself).
    pub(super) fn take_broken_own(&mut self, paths: &[&WirePath]) {
        let own: Vec<(WirePath, Vec<u8>)> = if self.features & FEATURE_OWN_CHANGES != 0 {
            paths
                .iter()
                .filter_map(|p| p.split_last())
                .map(|(d, n)| (d, n.to_vec()))
                .collect()
        } else {
            vec![]
        };
        if let Some(l) = self.leases.as_mut() {
            let b = l.broken(&own);
            if !b.leases.is_empty() || !b.entries.is_empty() {
                self.trees.clear();
                self.broken.extend(b.leases);
                for p in b.entries {
                    if !self.changed.contains(&p) {
                        self.changed.push(p);
                    }
                }
            }
        }
    }

    fn dispatch(&mut self, id: u32, r: Request) -> Vec<Frame> {
        let one = |r: Reply| vec![Message::Reply(r).to_frame(id)];
        if r == Request::Ping {
            // Anyone may time the link.
            return one(Reply::Ok);
        }
        // What a capability is the authority for: any key may ask.
        let object = matches!(
            r,
            Request::ObjectRecipe { .. }
                | Request::ObjectChunks { .. }
                | Request::ObjectRead { .. }
                | Request::ObjectDelete { .. }
        );
        if self.objects_only && !object {
            return one(error(
                ErrorCode::Permission,
                "this client's key is not authorized on the server: it may only read objects \
                 it holds capabilities for",
            ));
        }
        // A transfer daemon serves objects, and chunks by id to the keys it authorizes; its
        // (empty) export is neither listed nor written.
        let owners = matches!(
            r,
            Request::GetChunks(_)
                | Request::ObjectCreate { .. }
                | Request::ObjectAppend { .. }
                | Request::ObjectReplicate { .. }
        );
        if self.shelf.is_some() && !object && !owners {
            return one(error(
                ErrorCode::Unsupported,
                "a transfer daemon serves objects and chunks, not files",
            ));
        }
        if matches!(
            r,
            Request::Commit { .. }
                | Request::Mkdir { .. }
                | Request::Unlink { .. }
                | Request::Rmdir { .. }
                | Request::Rename { .. }
                | Request::Link { .. }
                | Request::Symlink { .. }
                | Request::SetAttr { .. }
                | Request::Vault { .. }
        ) {
            // The tree changes: digests computed before no longer hold.
            self.trees.clear();
        }
        // Names are never made, changed or removed among the server's own (the trash, the
        // redo records, commits' temporary files).
        let named: &[&WirePath] = match &r {
            Request::Create { path, .. }
            | Request::Mkdir { path, .. }
            | Request::Unlink { path }
            | Request::Rmdir { path }
            | Request::Symlink { path, .. }
            | Request::SetAttr { path, .. } => &[path],
            Request::Rename { from, to } | Request::Link { from, to } => &[from, to],
            _ => &[],
        };
        if let Some(p) = named.iter().find(|p| crate::export::is_internal(p)) {
            return one(error(
                ErrorCode::Permission,
                format!("{p:?}: the server's own"),
            ));
        }
        match r {
            Request::GetAttr { path } => one(self.get_attr(&path)),
            Request::ReadDir { path, keys } => self.read_dir(id, &path, &keys),
            Request::ReadTree { path, known } => self.read_tree(id, &path, &known),
            Request::StatFs { path } => one(match self.export.statfs(&path) {
                Ok(f) => Reply::FsStats(f),
                Err(e) => io_error(&path, &e),
            }),
            Request::ReadLink { path } => one(match self.export.read_link(&path) {
                Ok(target) => Reply::Link(target),
                Err(e) => io_error(&path, &e),
            }),
            Request::Mkdir { path, mode } => one(self.at(&path, |dir, name| {
                let mode = rustix::fs::Mode::from_raw_mode(mode & 0o7777);
                rustix::fs::mkdirat(dir, os(name), mode)?;
                // The mode asked for, not the server's umask of it (the client applied its own),
                // and the sticky and set-group-id bits, which mkdir may drop.
                let made = rustix::fs::openat(
                    dir,
                    os(name),
                    rustix::fs::OFlags::DIRECTORY
                        | rustix::fs::OFlags::NOFOLLOW
                        | rustix::fs::OFlags::RDONLY
                        | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )?;
                if rustix::fs::fstat(&made)?.st_mode & 0o7777 != mode.bits() {
                    rustix::fs::fchmod(&made, mode)?;
                }
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
            Request::Rename { from, to } => one(self.rename(&from, &to)),
            Request::Link { from, to } => one(self.link(&from, &to)),
            Request::Ping => one(Reply::Ok),
            Request::Sync => one(match self.dir_syncs.sync() {
                Ok(()) => Reply::Ok,
                Err(e) => error(ErrorCode::Io, format!("syncing the changes: {e}")),
            }),
            Request::SetAttr {
                path,
                mode,
                mtime_ns,
            } => one(self.set_attr(&path, mode, mtime_ns)),
            Request::GetRecipe {
                target,
                short,
                known,
            } => self.get_recipe(id, &target, short, &known),
            Request::GetChunks(g) => self.get_chunks(id, g),
            Request::ReadFiles { files } => one(self.read_files(files)),
            Request::ReadRange {
                target,
                offset,
                len,
            } => one(self.read_range(&target, offset, len)),
            Request::Have { ids } => one(self.have(&ids)),
            Request::GetKeys {
                path,
                version,
                olds,
                new_bytes,
            } => one(self.get_keys(&path, version, &olds, new_bytes)),
            Request::Create { handle, path, base } => one(self.create(handle, &path, base)),
            Request::Write { handle, parts } => one(self.write(handle, parts)),
            Request::Commit {
                handle,
                mode,
                mtime_ns,
                size,
                oid,
            } => self
                .commit(id, handle, mode, mtime_ns, size, oid)
                .map_or_else(Vec::new, one),
            Request::Abort { handle } => one(self.abort(handle)),
            Request::ObjectRecipe { oid, cap, from } => one(self.object_recipe(&oid, &cap, from)),
            Request::ObjectChunks { oid, cap, ids } => self.object_chunks(id, &oid, &cap, &ids),
            Request::ObjectRead { cap, offset, len } => self.object_read(id, &cap, offset, len),
            Request::ObjectCreate {
                durability,
                size,
                data,
            } => one(self.object_create(durability, size, data)),
            Request::ObjectAppend { data } => one(self.object_append(data)),
            Request::ObjectDelete { cap } => one(self.object_delete(&cap)),
            Request::ObjectReplicate { durability, ticket } => {
                one(self.object_replicate(durability, &ticket))
            }
            Request::Vault {
                path,
                op,
                name,
                data,
            } => one(self.vault(&path, op, &name, &data)),
        }
    }
}

/// A file identity as the index records it.
fn stamp(fid: &FileId) -> ferry_store::Stamp {
    ferry_store::Stamp {
        dev: fid.dev,
        ino: fid.ino,
        size: fid.size,
        mtime_ns: fid.mtime_ns,
        ctime_ns: fid.ctime_ns,
    }
}

impl Drop for Server {
    /// What the session recorded in the index becomes durable; a create left unfinished is
    /// abandoned.
    fn drop(&mut self) {
        self.abandon_create();
        // Commits asked for are made, even with no one left to answer.
        self.settle_parked();
        self.abandon_uploads();
        if let Err(e) = self.dir_syncs.sync() {
            tracing::warn!("making the session's last changes durable: {e}");
        }
        self.idle();
    }
}

impl Server {
    /// The history, if it keeps files of `size` bytes.
    fn history_for(&self, size: u64) -> Option<&history::History> {
        self.history
            .as_ref()
            .filter(|_| size <= self.history_file_max)
    }
}

/// Puts a chunk just cut (and hashed) into the history, if there is one.
fn keep(history: Option<&history::History>, id: Id, data: &[u8]) {
    if let Some(h) = history {
        h.keep(id, data);
    }
}
