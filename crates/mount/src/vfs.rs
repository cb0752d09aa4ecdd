//! The file system of `ferry mount`, free of FUSE: inodes, leases, the whole-file cache and
//! write-back on close, driven by the FUSE adapter (`fuse.rs`) or directly by tests.
//!
//! LBFS's consistency model, on Ferry's file service:
//!
//! - **Attributes and listings** are cached under the server's leases. While a lease holds
//!   nothing is asked; the server breaks it (Invalidate) when anyone changes the file. Leases
//!   of an earlier session are void (invalidations may have been missed while disconnected).
//! - **Open** brings the cached copy up to date: no message while the attributes' lease holds
//!   and the copy is that version; one round trip (GetAttr) when the lease expired and nothing
//!   changed; otherwise the recipe and the chunks not found locally (the old copy and the
//!   chunk cache are sources, and the server sends changes against the old version).
//! - **Reads and writes** go to the local copy at local speed.
//! - **Close** (and fsync) after a write commits the copy atomically on the server, sending
//!   only the chunks it lacks, against the version the changes were made on. If another
//!   client's close came first, the last close wins: the file becomes exactly this client's
//!   version (logged), never a mix. A file created here exists on the server at once (empty),
//!   so names behave as on a local disk; its contents follow on close.
//! - **Offline**: when the server cannot be reached, cached copies still open (the log says
//!   so), local changes stay in the cache marked dirty and are written back when the link
//!   returns (a restarted mount too); operations that need the server fail with `EHOSTDOWN`
//!   after at most the timeout, never hang.
//!
//! Locks: `state` is held only briefly and never across a message; `copies` serialises, per
//! path, the decision to fetch a copy with opening it (so a copy being written is never
//! replaced, and an open of one file never waits for another's fetch); the link serialises
//! messages.

mod specials;
pub use specials::SpecialKind;

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferry_chunk::ChunkerSpec;
use ferry_fs::{ConnError, GetError, GetStats, PutOptions, PutStats, Sources};
use ferry_proto::{Attr, ErrorCode, FileKind, FsStats, Reply, Request, WirePath};
use ferry_store::LocalStore;

use crate::cache::FileCache;
use crate::link::{Conn, Connector, Failure, Link};

/// An inode number; [`ROOT`] is the mounted directory.
pub type Ino = u64;
pub const ROOT: Ino = 1;

/// An error number for the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub i32);

macro_rules! errnos {
    ($($name:ident = $e:ident),* $(,)?) => {
        impl Errno {
            $(pub const $name: Errno = Errno(rustix::io::Errno::$e.raw_os_error());)*
        }
    };
}
errnos!(
    ENOENT = NOENT,
    EEXIST = EXIST,
    ENOTDIR = NOTDIR,
    EISDIR = ISDIR,
    ENOTEMPTY = NOTEMPTY,
    EACCES = ACCESS,
    EPERM = PERM,
    ENOSPC = NOSPC,
    EIO = IO,
    EINVAL = INVAL,
    ENOTSUP = NOTSUP,
    EHOSTDOWN = HOSTDOWN,
    EBADF = BADF,
    ENAMETOOLONG = NAMETOOLONG,
);

impl From<io::Error> for Errno {
    fn from(e: io::Error) -> Errno {
        Errno(e.raw_os_error().unwrap_or(Errno::EIO.0))
    }
}

fn errno_of(f: &Failure) -> Errno {
    match f {
        Failure::Offline(_) => Errno::EHOSTDOWN,
        Failure::Remote(code, _) => match code {
            ErrorCode::NotFound => Errno::ENOENT,
            ErrorCode::Exists | ErrorCode::Conflict => Errno::EEXIST,
            ErrorCode::NotDir => Errno::ENOTDIR,
            ErrorCode::IsDir => Errno::EISDIR,
            ErrorCode::NotEmpty => Errno::ENOTEMPTY,
            ErrorCode::Permission | ErrorCode::Escape => Errno::EACCES,
            ErrorCode::NoSpace => Errno::ENOSPC,
            ErrorCode::BadRequest => Errno::EINVAL,
            ErrorCode::Unsupported => Errno::ENOTSUP,
            _ => Errno::EIO,
        },
        Failure::Failed(GetError::Local { error, .. }) => {
            Errno(error.raw_os_error().unwrap_or(Errno::EIO.0))
        }
        Failure::Failed(_) => Errno::EIO,
    }
}

/// The error number for the server's answer to one request of a batch.
fn errno_of_reply(e: ConnError) -> Errno {
    match e {
        ConnError::Remote { code, message } => errno_of(&Failure::Remote(code, message)),
        _ => Errno::EIO,
    }
}

/// What the kernel is told about a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    pub ino: Ino,
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    pub mtime_ns: i64,
    /// Last access and last change, as the server says (or the copy being written here);
    /// from a server that does not say, the modification time.
    pub atime_ns: i64,
    pub ctime_ns: i64,
    /// Space allocated, in 512-byte units (from a server that does not say, the size's).
    pub blocks: u64,
    /// Links: a file's, the server's count (1 from a server that does not say; none for one
    /// removed while open); a directory's, 2 and one for each subdirectory its listing here
    /// names (the server's count when no listing is here).
    pub nlink: u32,
    /// A special file of this mount only, and its device number (see `specials`).
    pub special: Option<(SpecialKind, u32)>,
}

/// An open file.
#[derive(Clone, Copy, Debug)]
pub struct Opened {
    pub fh: u64,
    /// The kernel may keep the pages it cached of this file: the contents are the version it
    /// saw at the last open.
    pub keep_cache: bool,
}

/// How to mount.
#[derive(Clone, Debug)]
pub struct Options {
    /// The cache directory (whole files and chunks), kept between mounts.
    pub cache_dir: PathBuf,
    /// Bound on the cached copies' bytes (the chunk cache gets half as much again).
    pub cache_size: u64,
    /// How long a wait for the server may last before it counts as unreachable.
    pub timeout: Duration,
    pub chunker: ChunkerSpec,
    /// Devices searched for chunks before the server (lookaside caching).
    pub lookaside: Option<std::sync::Arc<ferry_lookaside::Lookaside>>,
    /// Lookaside providers (daemons of the user's on the LAN), asked for chunks by id beside
    /// the server.
    pub providers: Providers,
}

/// Sessions with lookaside providers (`ferry lookaside add ferry://…`), and what each supplied
/// so far. One that fails is left out of later fetches by the engine's handling of a failed
/// source; the mount goes on with the server.
#[derive(Clone, Default)]
pub struct Providers {
    pub sessions: std::sync::Arc<std::sync::Mutex<Vec<ferry_fs::Mirror>>>,
    supplied: std::sync::Arc<std::sync::Mutex<Vec<ferry_fs::SourceStats>>>,
}

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_list()
            .entries(list.iter().map(|m| &m.name))
            .finish()
    }
}

impl Providers {
    pub fn new(sessions: Vec<ferry_fs::Mirror>) -> Self {
        Providers {
            sessions: std::sync::Arc::new(std::sync::Mutex::new(sessions)),
            supplied: Default::default(),
        }
    }

    fn is_empty(&self) -> bool {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// Adds what a fetch's sources did to the providers' counts.
    fn note(&self, sources: &[ferry_fs::SourceStats]) {
        let names: Vec<String> = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|m| m.name.clone())
            .collect();
        let mut sum = self.supplied.lock().unwrap_or_else(|e| e.into_inner());
        for s in sources.iter().filter(|s| names.contains(&s.name)) {
            match sum.iter_mut().find(|t| t.name == s.name) {
                Some(t) => {
                    t.requests += s.requests;
                    t.chunks += s.chunks;
                    t.bytes += s.bytes;
                    t.misses += s.misses;
                    t.rejected += s.rejected;
                }
                None => sum.push(s.clone()),
            }
        }
    }

    /// What each provider supplied since the mount began.
    pub fn supplied(&self) -> Vec<ferry_fs::SourceStats> {
        self.supplied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Errors of mounting (once mounted, operations return an [`Errno`]).
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("cannot reach the server")]
    Connect(#[from] ConnError),
    /// The server's answer about the directory to mount.
    #[error("{0}")]
    Remote(String),
    #[error("the cache {}: {}", .0.display(), .1)]
    Cache(PathBuf, String),
}

/// Something cached under a lease.
struct Leased<T> {
    value: T,
    until: Instant,
    epoch: u64,
}

impl<T> Leased<T> {
    fn valid(&self, epoch: u64) -> bool {
        self.epoch == epoch && Instant::now() < self.until
    }
}

struct Inode {
    path: WirePath,
    kind: FileKind,
    /// References the kernel holds (lookups not yet forgotten).
    lookups: u64,
    open: u32,
    writers: u32,
    /// The cached copy holds changes not yet on the server.
    dirty: bool,
    /// Writes so far: a write-back commits what was there when it began, and the copy stays
    /// dirty if more came meanwhile.
    writes: u64,
    /// Removed or replaced on the server by this client while open: nothing to write back.
    unlinked: bool,
    /// The version whose pages the kernel may hold.
    kernel_version: Option<u64>,
    /// Permission bits set here while the copy was dirty: they go with the commit.
    mode: Option<u32>,
    /// The record says dirty while the copy is still this server version: a create labels its
    /// empty copy so, and its first write then needs no sync of the record. Made clean again
    /// when the file is closed unwritten.
    labelled_dirty: Option<u64>,
    /// Created here and not yet on the server (a truncating create in a directory whose
    /// listing is leased): its first commit creates it.
    pending: bool,
}

struct Handle {
    ino: Ino,
    file: Arc<File>,
    write: bool,
}

/// A directory listing: names and kinds, sorted by name.
type Listing = Vec<(Vec<u8>, FileKind)>;

#[derive(Default)]
struct State {
    attrs: HashMap<WirePath, Leased<Attr>>,
    listings: HashMap<WirePath, Leased<Listing>>,
    /// Directories whose listing a lease break dropped: a lookup there asks for its one name,
    /// not the whole listing again (a directory being filled or emptied would be listed again
    /// at every step, the work and bytes growing with its size). Listing it again ends this.
    changing: std::collections::HashSet<WirePath>,
    /// Symlink targets by path, with the version they were read at.
    links: HashMap<WirePath, (u64, Vec<u8>)>,
    inodes: HashMap<Ino, Inode>,
    ino_of: HashMap<WirePath, Ino>,
    next_ino: Ino,
    handles: HashMap<u64, Handle>,
    next_fh: u64,
    /// FIFOs, sockets and device nodes made here (never on the server).
    specials: specials::Specials,
    /// Directories whose special files changed here, with the time of the last such change: a
    /// directory's modification and change times while later than the server's (which never
    /// hears of them).
    dir_times: HashMap<WirePath, i64>,
    /// When the oldest change made here that the server has not made durable yet was made
    /// (`FEATURE_DEFERRED_SYNC`: see [`Vfs::sync_server`]).
    unsynced: Option<Instant>,
}

/// Paths whose cached copies are being decided on, fetched or moved: one holder per path.
#[derive(Default)]
struct PathLocks {
    busy: Mutex<std::collections::HashSet<WirePath>>,
    freed: std::sync::Condvar,
}

struct PathGuard<'a> {
    locks: &'a PathLocks,
    paths: Vec<WirePath>,
}

impl PathLocks {
    /// Waits until none of `paths` is held, then holds them all.
    fn lock(&self, paths: &[&WirePath]) -> PathGuard<'_> {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        while paths.iter().any(|p| busy.contains(*p)) {
            busy = self.freed.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        let paths: Vec<WirePath> = paths.iter().map(|p| (*p).clone()).collect();
        busy.extend(paths.iter().cloned());
        PathGuard { locks: self, paths }
    }
}

impl Drop for PathGuard<'_> {
    fn drop(&mut self) {
        let mut busy = self.locks.busy.lock().unwrap_or_else(|e| e.into_inner());
        for p in &self.paths {
            busy.remove(p);
        }
        self.locks.freed.notify_all();
    }
}

/// Counters of what the mount did, for logs and tests.
#[derive(Default, Debug)]
pub struct Counters {
    /// Opens answered from the cache without a message.
    pub opens_cached: AtomicU64,
    /// Opens that revalidated with one GetAttr and found the copy current.
    pub opens_revalidated: AtomicU64,
    /// Opens that fetched the file (wholly or its changes).
    pub opens_fetched: AtomicU64,
    /// Opens served from a copy while the server was unreachable.
    pub opens_offline: AtomicU64,
    pub commits: AtomicU64,
    /// Commits that replaced a version another client had committed since (last close wins).
    pub last_close_wins: AtomicU64,
}

/// The file system.
pub struct Vfs {
    link: Link,
    files: FileCache,
    chunks: LocalStore,
    opts: Options,
    state: Mutex<State>,
    copies: PathLocks,
    writing: Mutex<()>,
    /// The link epoch whose leases and dirty copies were last dealt with.
    seen_epoch: AtomicU64,
    /// A write-back failed for want of the server: retry when it is back.
    retry_dirty: AtomicBool,
    /// Fetches so far: the cache is trimmed every so many (each trim lists the cache).
    fetches: AtomicU64,
    /// The server's file system as last asked (what statfs answers while it is unreachable).
    fs_stats: Mutex<Option<FsStats>>,
    pub counters: Counters,
}

/// Directories listed whole on a lookup miss up to this size (a listing costs one round trip
/// and answers every later lookup in the directory); larger ones are asked name by name.
const LIST_ON_LOOKUP: u64 = 1 << 20;

/// How long a change made here waits, at most, before upkeep asks the server to make it
/// durable (when nothing asked sooner: `fsync`, unmount).
const SYNC_AFTER: Duration = Duration::from_secs(1);

impl Vfs {
    /// Connects and checks that `root` is a directory on the server.
    pub fn new(connect: Connector, root: WirePath, opts: Options) -> Result<Vfs, MountError> {
        let cache_err =
            |e: &dyn std::fmt::Display| MountError::Cache(opts.cache_dir.clone(), e.to_string());
        let files = FileCache::open(&opts.cache_dir).map_err(|e| cache_err(&e))?;
        let chunks = LocalStore::open_or_create(
            opts.cache_dir.join("chunks"),
            ferry_store::Options {
                pack_target: 16 << 20,
                append_to_last_pack: false,
                ..ferry_store::Options::default()
            },
        )
        .map_err(|e| cache_err(&e))?;
        let link = Link::open(connect, opts.timeout)?;
        let vfs = Vfs {
            link,
            files,
            chunks,
            opts,
            state: Mutex::new(State {
                next_ino: ROOT + 1,
                next_fh: 1,
                ..State::default()
            }),
            copies: PathLocks::default(),
            writing: Mutex::new(()),
            seen_epoch: AtomicU64::new(0),
            retry_dirty: AtomicBool::new(true),
            fetches: AtomicU64::new(0),
            fs_stats: Mutex::new(None),
            counters: Counters::default(),
        };
        let attr = vfs
            .fresh_attr(&root)
            .map_err(|e| MountError::Remote(e.to_string()))?;
        if attr.kind != FileKind::Dir {
            return Err(MountError::Remote(format!("{root:?} is not a directory")));
        }
        {
            let mut st = vfs.lock();
            st.inodes
                .insert(ROOT, Inode::new(root.clone(), FileKind::Dir));
            st.ino_of.insert(root, ROOT);
        }
        vfs.seen_epoch.store(vfs.link.epoch(), Ordering::Release);
        vfs.trim();
        Ok(vfs)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn path_of(&self, ino: Ino) -> Result<(WirePath, FileKind), Errno> {
        let st = self.lock();
        let n = st.inodes.get(&ino).ok_or(Errno::ENOENT)?;
        if n.unlinked {
            return Err(Errno::ENOENT);
        }
        Ok((n.path.clone(), n.kind))
    }

    fn child(&self, parent: Ino, name: &[u8]) -> Result<(WirePath, WirePath), Errno> {
        if name.len() > 255 {
            return Err(Errno::ENAMETOOLONG);
        }
        let (dir, kind) = self.path_of(parent)?;
        if kind != FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        // Too long with the mount's own root in front (the server resolves no longer paths):
        // ENAMETOOLONG, as a local file system says, not EINVAL.
        let p = dir.join(name).map_err(|_| {
            if dir.as_bytes().len() + 1 + name.len() > ferry_proto::MAX_PATH {
                Errno::ENAMETOOLONG
            } else {
                Errno::EINVAL
            }
        })?;
        Ok((dir, p))
    }

    // ------------------------------------------------------------------ attributes

    /// Caches `a` as `path`'s attributes under its lease, counted from `asked` (when the
    /// request left, so the lease never outlives the server's grant).
    fn store_attr(&self, st: &mut State, path: &WirePath, a: Attr, asked: Instant) {
        let until = asked + Duration::from_millis(a.lease_ms as u64);
        st.attrs.insert(
            path.clone(),
            Leased {
                value: a,
                until,
                epoch: self.link.epoch(),
            },
        );
    }

    /// The attributes of `path` under a valid lease, if cached.
    fn leased_attr(&self, path: &WirePath) -> Option<Attr> {
        let epoch = self.link.epoch();
        let st = self.lock();
        st.attrs
            .get(path)
            .filter(|l| l.valid(epoch))
            .map(|l| l.value.clone())
    }

    /// Forgets `path` after the server said it does not exist.
    fn gone(&self, path: &WirePath) {
        let mut st = self.lock();
        st.attrs.remove(path);
        st.listings.remove(path);
        st.changing.remove(path);
        if let Some((dir, name)) = path.split_last() {
            if let Some(l) = st.listings.get_mut(&dir) {
                if let Ok(i) = l.value.binary_search_by(|e| e.0.as_slice().cmp(name)) {
                    l.value.remove(i);
                }
            }
        }
    }

    /// Asks the server for `path`'s attributes (one round trip).
    fn fresh_attr(&self, path: &WirePath) -> Result<Attr, Failure> {
        tracing::trace!("{path:?}: GetAttr");
        let asked = Instant::now();
        let a = self.link.run(|c| get_attr(c, path));
        self.apply_invalidations();
        match a {
            Ok(a) => {
                let mut st = self.lock();
                self.store_attr(&mut st, path, a.clone(), asked);
                Ok(a)
            }
            Err(f) => {
                if matches!(f, Failure::Remote(ErrorCode::NotFound, _)) {
                    self.gone(path);
                }
                Err(f)
            }
        }
    }

    /// `path`'s attributes: leased, else asked for; while the server is unreachable, the last
    /// ones known.
    fn attr(&self, path: &WirePath) -> Result<Attr, Errno> {
        if let Some(a) = self.leased_attr(path) {
            return Ok(a);
        }
        match self.fresh_attr(path) {
            Ok(a) => Ok(a),
            Err(Failure::Offline(why)) => {
                let st = self.lock();
                match st.attrs.get(path) {
                    Some(l) => {
                        tracing::debug!(
                            "{path:?}: server unreachable ({why}); last known attributes"
                        );
                        Ok(l.value.clone())
                    }
                    None => Err(Errno::EHOSTDOWN),
                }
            }
            Err(f) => Err(errno_of(&f)),
        }
    }

    fn stat_of(st: &State, ino: Ino, a: &Attr) -> Stat {
        let n = st.inodes.get(&ino);
        let extra = a.extra.as_ref();
        let nlink = match a.kind {
            // Counted from the listing here, which this client's own mkdir, rmdir and rename
            // keep up to date (the server's count, cached, may predate them).
            FileKind::Dir => match n.and_then(|n| st.listings.get(&n.path)) {
                Some(l) => 2 + l.value.iter().filter(|e| e.1 == FileKind::Dir).count() as u32,
                None => extra.map_or(2, |x| x.nlink),
            },
            _ if n.is_some_and(|n| n.unlinked) => 0,
            _ => extra.map_or(1, |x| x.nlink),
        };
        let local = n
            .filter(|_| a.kind == FileKind::Dir)
            .and_then(|n| st.dir_times.get(&n.path))
            .copied()
            .unwrap_or(i64::MIN);
        Stat {
            ino,
            kind: a.kind,
            size: a.size,
            mode: a.mode & 0o7777,
            mtime_ns: a.mtime_ns.max(local),
            atime_ns: extra.map_or(a.mtime_ns, |x| x.atime_ns),
            ctime_ns: extra.map_or(a.mtime_ns, |x| x.ctime_ns).max(local),
            blocks: extra.map_or(a.size.div_ceil(512), |x| x.blocks),
            nlink,
            special: None,
        }
    }

    /// The attributes of an inode as the kernel should see them.
    pub fn getattr(&self, ino: Ino) -> Result<Stat, Errno> {
        self.getattr_open(ino, None)
    }

    /// Likewise, asked through the open file `fh` if given: a copy being written (or changed
    /// and not yet written back, or removed while open) has the local copy's size and time.
    pub fn getattr_open(&self, ino: Ino, fh: Option<u64>) -> Result<Stat, Errno> {
        if let Some(s) = self.getattr_special(ino) {
            return Ok(s);
        }
        if let Some(s) = self.local_stat(ino, fh)? {
            return Ok(s);
        }
        let path = self
            .lock()
            .inodes
            .get(&ino)
            .ok_or(Errno::ENOENT)?
            .path
            .clone();
        let a = self.attr(&path)?;
        Ok(Self::stat_of(&self.lock(), ino, &a))
    }

    /// The attributes of a file whose local copy is newer than the server's version (being
    /// written, changed and not yet written back, or removed while open); `None` for others.
    fn local_stat(&self, ino: Ino, fh: Option<u64>) -> Result<Option<Stat>, Errno> {
        let (path, file, mode, nlink) = {
            let st = self.lock();
            let n = st.inodes.get(&ino).ok_or(Errno::ENOENT)?;
            if !(n.writers > 0 || n.dirty || n.unlinked) {
                return Ok(None);
            }
            // The copy through an open handle: a file removed while open has no other.
            let file = fh
                .and_then(|fh| st.handles.get(&fh))
                .filter(|h| h.ino == ino)
                .or_else(|| st.handles.values().find(|h| h.ino == ino))
                .map(|h| h.file.clone());
            let known = st.attrs.get(&n.path).map(|l| l.value.mode);
            (
                n.path.clone(),
                file,
                n.mode.or(known).unwrap_or(0o644),
                !n.unlinked as u32,
            )
        };
        use std::os::unix::fs::MetadataExt;
        let m = match file {
            Some(f) => f.metadata()?,
            None => std::fs::metadata(self.files.data(&path))?,
        };
        Ok(Some(Stat {
            ino,
            kind: FileKind::File,
            size: m.len(),
            mode: mode & 0o7777,
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            atime_ns: m.atime() * 1_000_000_000 + m.atime_nsec(),
            ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
            blocks: m.blocks(),
            nlink,
            special: None,
        }))
    }

    // ------------------------------------------------------------------ names

    fn ino_for(st: &mut State, path: &WirePath, kind: FileKind) -> Ino {
        if let Some(&i) = st.ino_of.get(path) {
            if let Some(n) = st.inodes.get_mut(&i) {
                n.kind = kind;
            }
            return i;
        }
        let i = st.next_ino;
        st.next_ino += 1;
        st.inodes.insert(i, Inode::new(path.clone(), kind));
        st.ino_of.insert(path.clone(), i);
        i
    }

    /// Looks `name` up in directory `parent`; the kernel holds one more reference to the inode
    /// returned.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Stat, Errno> {
        let (dir, path) = self.child(parent, name)?;
        if let Some(s) = self.lookup_special(&path) {
            return Ok(s);
        }
        if let Some(ino) = self.pending_at(&path) {
            if let Ok(Some(s)) = self.local_stat(ino, None) {
                if let Some(n) = self.lock().inodes.get_mut(&ino) {
                    n.lookups += 1;
                }
                return Ok(s);
            }
        }
        let a = match self.leased_attr(&path) {
            Some(a) => a,
            None => match self.listed(&dir, name) {
                Some(false) => return Err(Errno::ENOENT),
                Some(true) => self.attr(&path)?,
                None if self.lock().changing.contains(&dir) => self.attr(&path)?,
                None => {
                    // A listing answers this lookup and every later one in the directory.
                    let small = self
                        .leased_attr(&dir)
                        .is_none_or(|d| d.size <= LIST_ON_LOOKUP);
                    match small.then(|| self.list(&dir)) {
                        Some(Ok(entries)) => {
                            match entries.binary_search_by(|e| e.0.as_slice().cmp(name)) {
                                Ok(i) => entries[i].1.clone(),
                                Err(_) => return Err(Errno::ENOENT),
                            }
                        }
                        _ => self.attr(&path)?,
                    }
                }
            },
        };
        let ino = {
            let mut st = self.lock();
            let ino = Self::ino_for(&mut st, &path, a.kind);
            st.inodes.get_mut(&ino).expect("made").lookups += 1;
            ino
        };
        // The kernel takes a lookup's size as the file's: a copy being written has its own.
        match self.local_stat(ino, None) {
            Ok(Some(s)) => Ok(s),
            _ => Ok(Self::stat_of(&self.lock(), ino, &a)),
        }
    }

    /// Whether a valid listing of `dir` has `name`; `None` without one.
    fn listed(&self, dir: &WirePath, name: &[u8]) -> Option<bool> {
        let epoch = self.link.epoch();
        let st = self.lock();
        st.listings.get(dir).filter(|l| l.valid(epoch)).map(|l| {
            l.value
                .binary_search_by(|e| e.0.as_slice().cmp(name))
                .is_ok()
        })
    }

    /// The kernel dropped `n` references to `ino`.
    pub fn forget(&self, ino: Ino, n: u64) {
        let mut st = self.lock();
        let Some(node) = st.inodes.get_mut(&ino) else {
            return;
        };
        node.lookups = node.lookups.saturating_sub(n);
        if ino != ROOT && node.lookups == 0 && node.open == 0 && !node.dirty {
            let path = node.path.clone();
            let unlinked = node.unlinked;
            st.inodes.remove(&ino);
            if !unlinked && st.ino_of.get(&path) == Some(&ino) {
                st.ino_of.remove(&path);
            }
        }
    }

    /// Reads `dir`'s listing from the server (one round trip), caching the entries' attributes;
    /// returns the entries, sorted by name.
    fn list(&self, dir: &WirePath) -> Result<Vec<(Vec<u8>, Attr)>, Failure> {
        tracing::trace!("{dir:?}: ReadDir");
        let asked = Instant::now();
        let r = self.link.run(|c| {
            // The directory's own attributes in the same round trip: their lease is the
            // listing's too (the server keys both by the directory), so an empty listing is
            // leased as well.
            let mut rs = batch(
                c,
                vec![
                    Request::ReadDir {
                        path: dir.clone(),
                        keys: vec![],
                    },
                    Request::GetAttr { path: dir.clone() },
                ],
            )?
            .into_iter();
            let mut out = vec![];
            for r in rs.next().expect("asked")? {
                match r {
                    Reply::Entries { entries, .. } => out.extend(entries),
                    other => return Err(ConnError::Unexpected(format!("{other:?}")).into()),
                }
            }
            Ok((out, attr_of(rs.next().expect("asked")?)?))
        });
        self.apply_invalidations();
        let (entries, dir_attr) = match r {
            Ok(e) => e,
            Err(f) => {
                if matches!(f, Failure::Remote(ErrorCode::NotFound, _)) {
                    self.gone(dir);
                }
                return Err(f);
            }
        };
        let mut entries: Vec<(Vec<u8>, Attr)> =
            entries.into_iter().map(|e| (e.name, e.attr)).collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|a, b| a.0 == b.0);
        // The listing's lease is its entries' and the directory's (the server grants them
        // together).
        let lease = entries
            .iter()
            .map(|e| e.1.lease_ms)
            .chain([dir_attr.lease_ms])
            .min()
            .unwrap_or(0);
        let mut st = self.lock();
        self.store_attr(&mut st, dir, dir_attr, asked);
        for (name, attr) in &entries {
            if let Ok(p) = dir.join(name) {
                self.store_attr(&mut st, &p, attr.clone(), asked);
            }
        }
        st.changing.remove(dir);
        st.listings.insert(
            dir.clone(),
            Leased {
                value: entries.iter().map(|(n, a)| (n.clone(), a.kind)).collect(),
                until: asked + Duration::from_millis(lease as u64),
                epoch: self.link.epoch(),
            },
        );
        Ok(entries)
    }

    /// The entries of directory `ino` (without `.` and `..`): name, kind and an inode number.
    pub fn readdir(&self, ino: Ino) -> Result<Vec<(Ino, FileKind, Vec<u8>)>, Errno> {
        let (dir, kind) = self.path_of(ino)?;
        if kind != FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        let epoch = self.link.epoch();
        let cached = self
            .lock()
            .listings
            .get(&dir)
            .filter(|l| l.valid(epoch))
            .map(|l| l.value.clone());
        let names = match cached {
            Some(n) => n,
            None => match self.list(&dir) {
                Ok(e) => e.into_iter().map(|(n, a)| (n, a.kind)).collect(),
                Err(Failure::Offline(why)) => match self.lock().listings.get(&dir) {
                    Some(l) => {
                        tracing::info!("{dir:?}: server unreachable ({why}); listing as last seen");
                        l.value.clone()
                    }
                    None => return Err(Errno::EHOSTDOWN),
                },
                Err(f) => return Err(errno_of(&f)),
            },
        };
        let st = self.lock();
        let mut names = names;
        let pending = st
            .inodes
            .values()
            .filter(|n| n.pending && !n.unlinked)
            .filter_map(|n| {
                n.path
                    .split_last()
                    .filter(|(d, _)| *d == dir)
                    .map(|(_, m)| m.to_vec())
            });
        for name in st.specials.children(&dir).into_iter().chain(pending) {
            if let Err(i) = names.binary_search_by(|e| e.0.as_slice().cmp(&name)) {
                names.insert(i, (name, FileKind::File));
            }
        }
        Ok(names
            .into_iter()
            .map(|(name, kind)| {
                // Entries not looked up get a number of their own (the kernel does not use
                // it for lookups); high bit set so it never collides with a real inode.
                let ino = dir
                    .join(&name)
                    .ok()
                    .and_then(|p| st.ino_of.get(&p).copied())
                    .unwrap_or_else(|| {
                        let h = blake3::hash(&[dir.as_bytes(), b"/", &name].concat());
                        (1 << 63) | u64::from_le_bytes(h.as_bytes()[..8].try_into().unwrap()) >> 1
                    });
                (ino, kind, name)
            })
            .collect())
    }

    /// Adds or removes a name in a cached listing after a change made here.
    fn relist(st: &mut State, dir: &WirePath, name: &[u8], kind: Option<FileKind>) {
        st.unsynced.get_or_insert_with(Instant::now);
        // The directory's own times changed on the server too: asked for again when next
        // wanted (the server's lease break comes only with a later reply).
        if let Some(a) = st.attrs.get_mut(dir) {
            a.until = Instant::now() - Duration::from_millis(1);
        }
        if let Some(l) = st.listings.get_mut(dir) {
            match (l.value.binary_search_by(|e| e.0.as_slice().cmp(name)), kind) {
                (Ok(i), Some(k)) => l.value[i].1 = k,
                (Ok(i), None) => {
                    l.value.remove(i);
                }
                (Err(i), Some(k)) => l.value.insert(i, (name.to_vec(), k)),
                (Err(_), None) => {}
            }
        }
    }

    // ------------------------------------------------------------------ files

    fn sources(&self) -> Sources<'_> {
        Sources {
            borrowing: true,
            cache: &self.chunks,
            chunker: self.opts.chunker.clone(),
            delete: false,
            dry_run: false,
            // Small files with no copy here come whole (one round trip, no recipe).
            cold: true,
            // Large ones by recipe: the chunk cache outlives the copies, and may hold chunks
            // of a file evicted, renamed or copied on the server.
            ranges: false,
            // Providers need recipes with full ids.
            short_ids: self.opts.providers.is_empty(),
            cache_file_max: u64::MAX,
            mirrors: (!self.opts.providers.is_empty()).then_some(&*self.opts.providers.sessions),
            progress: None,
            lookaside: self.opts.lookaside.as_deref(),
        }
    }

    /// Brings the cached copy of `ino` up to date (unless it holds local changes, which win)
    /// and opens it, in one step under its path's lock so a copy open for writing is never
    /// replaced.
    /// With `truncate`, the old contents are not fetched at all.
    fn open_copy(
        &self,
        ino: Ino,
        write: bool,
        truncate: bool,
    ) -> Result<(File, Option<u64>), Errno> {
        let (path, _) = self.path_of(ino)?;
        let _g = self.copies.lock(&[&path]);
        let (kind, local) = {
            let st = self.lock();
            let n = st.inodes.get(&ino).ok_or(Errno::ENOENT)?;
            if n.unlinked {
                return Err(Errno::ENOENT);
            }
            if n.path != path {
                // Renamed meanwhile: again, under its new name.
                drop((st, _g));
                return self.open_copy(ino, write, truncate);
            }
            (n.kind, n.writers > 0 || n.dirty)
        };
        if kind == FileKind::Dir {
            return Err(Errno::EISDIR);
        }
        let data = self.files.data(&path);
        let meta = self.files.meta(&path);
        let local = local || meta.as_ref().is_some_and(|m| m.dirty);
        let mut version = meta.as_ref().and_then(|m| m.version);
        if truncate && write {
            if !local {
                let a = self.attr(&path)?;
                version = Some(a.version);
            }
            self.mark_dirty(ino, &path, version)?;
            empty_copy(&data)?;
        } else if !local {
            version = Some(self.refresh_copy(&path, meta.and_then(|m| m.version))?);
        }
        let file = OpenOptions::new().read(true).write(write).open(&data)?;
        let mut st = self.lock();
        let n = st.inodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
        n.open += 1;
        if write {
            n.writers += 1;
        }
        Ok((file, version))
    }

    /// Makes the copy of `path` the server's current version (it is `have` now); returns the
    /// version it holds.
    fn refresh_copy(&self, path: &WirePath, have: Option<u64>) -> Result<u64, Errno> {
        let data = self.files.data(path);
        let leased = self.leased_attr(path);
        let fresh = leased.is_none();
        let attr = match leased.map(Ok).unwrap_or_else(|| self.fresh_attr(path)) {
            Ok(a) => a,
            Err(Failure::Offline(why)) => return self.offline_copy(path, have, &why),
            Err(f) => return Err(errno_of(&f)),
        };
        if attr.kind != FileKind::File {
            return Err(if attr.kind == FileKind::Dir {
                Errno::EISDIR
            } else {
                Errno::EINVAL
            });
        }
        if have == Some(attr.version) && data.exists() {
            self.files.touch(path);
            let c = if fresh {
                &self.counters.opens_revalidated
            } else {
                &self.counters.opens_cached
            };
            c.fetch_add(1, Ordering::Relaxed);
            return Ok(attr.version);
        }
        let mut stats = GetStats::default();
        let src = self.sources();
        let r = self
            .link
            .run(|c| ferry_fs::fetch_file(c, path, &attr, &data, &src, &mut stats));
        self.apply_invalidations();
        self.opts.providers.note(&stats.sources);
        match r {
            Ok(()) => {}
            Err(Failure::Offline(why)) => return self.offline_copy(path, have, &why),
            Err(f) => {
                if matches!(f, Failure::Remote(ErrorCode::NotFound, _)) {
                    self.gone(path);
                }
                tracing::warn!("{path:?}: cannot fetch: {f}");
                return Err(errno_of(&f));
            }
        }
        self.counters.opens_fetched.fetch_add(1, Ordering::Relaxed);
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o600))?;
        self.files.set_meta(path, Some(attr.version), false)?;
        tracing::debug!(
            "{path:?}: fetched version {:x} ({} bytes; {} chunks from the server, {} here)",
            attr.version,
            stats.bytes,
            stats.from_server,
            stats.from_cache + stats.from_local
        );
        if self.fetches.fetch_add(1, Ordering::Relaxed) % 32 == 31 {
            self.trim();
        }
        Ok(attr.version)
    }

    fn offline_copy(&self, path: &WirePath, have: Option<u64>, why: &str) -> Result<u64, Errno> {
        match have {
            Some(v) if self.files.data(path).exists() => {
                tracing::warn!(
                    "{path:?}: server unreachable ({why}); opening the cached copy (version {v:x}), which may be out of date"
                );
                self.counters.opens_offline.fetch_add(1, Ordering::Relaxed);
                Ok(v)
            }
            _ => Err(Errno::EHOSTDOWN),
        }
    }

    /// Marks `ino`'s copy as holding local changes made against `version`: on disk first, so
    /// no crash can leave changed bytes labelled as a server version.
    fn mark_dirty(&self, ino: Ino, path: &WirePath, version: Option<u64>) -> Result<(), Errno> {
        let first = {
            let st = self.lock();
            st.inodes.get(&ino).is_some_and(|n| !n.dirty)
        };
        if first {
            let had = self.files.meta(path);
            if !had.as_ref().is_some_and(|m| m.dirty) {
                self.files.set_meta(path, version, true)?;
                // A copy labelled as a server version is about to change: its new label must
                // be on disk before any changed byte can be.
                if had.is_some_and(|m| m.version.is_some()) {
                    self.files.sync_meta(path)?;
                }
            }
        }
        let mut st = self.lock();
        if let Some(n) = st.inodes.get_mut(&ino) {
            n.dirty = true;
            n.writes += 1;
        }
        Ok(())
    }

    fn new_handle(&self, ino: Ino, file: File, write: bool, version: Option<u64>) -> Opened {
        let mut st = self.lock();
        let fh = st.next_fh;
        st.next_fh += 1;
        st.handles.insert(
            fh,
            Handle {
                ino,
                file: Arc::new(file),
                write,
            },
        );
        let n = st.inodes.get_mut(&ino).expect("open");
        let keep_cache = version.is_some() && n.kernel_version == version;
        n.kernel_version = version;
        Opened { fh, keep_cache }
    }

    /// Opens a file for reading and/or writing (`truncate`: its contents are discarded).
    pub fn open(&self, ino: Ino, write: bool, truncate: bool) -> Result<Opened, Errno> {
        let (file, version) = self.open_copy(ino, write, truncate)?;
        Ok(self.new_handle(ino, file, write, version))
    }

    /// Creates (exclusively with `excl`) and opens a file: it exists on the server at once,
    /// empty; its contents follow on close.
    pub fn create(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        excl: bool,
    ) -> Result<(Stat, Opened), Errno> {
        let (dir, path) = self.child(parent, name)?;
        let data = self.files.data(&path);
        {
            // A stale copy under this name must not be mistaken for the new file.
            let st = self.lock();
            if let Some(&i) = st.ino_of.get(&path) {
                if st.inodes.get(&i).is_some_and(|n| n.open > 0 && !n.unlinked) {
                    drop(st);
                    return self.create_existing(parent, name, excl);
                }
            }
        }
        let _g = self.copies.lock(&[&path]);
        self.files.remove(&path);
        empty_copy(&data)?;
        let asked = Instant::now();
        let mut stats = PutStats::default();
        let opts = self.put_options(&path);
        let r = self
            .link
            .run(|c| ferry_fs::put_file(c, &data, &path, None, mode & 0o7777, &opts, &mut stats));
        self.apply_invalidations();
        let a = match r {
            Ok(a) => a,
            Err(Failure::Remote(ErrorCode::Conflict, _)) => {
                drop(_g);
                return self.create_existing(parent, name, excl);
            }
            Err(f) => return Err(errno_of(&f)),
        };
        // Labelled dirty at once (the copy is empty, as the version is): its first write needs
        // no sync of the record, and a crash before the close writes back an empty file, the
        // version's own content.
        self.files.set_meta(&path, Some(a.version), true)?;
        let file = OpenOptions::new().read(true).write(true).open(&data)?;
        let ino = {
            let mut st = self.lock();
            self.store_attr(&mut st, &path, a.clone(), asked);
            Self::relist(&mut st, &dir, name, Some(FileKind::File));
            self.store_dir(&mut st, &dir, stats.stat_after.take().map(Ok), asked);
            let ino = Self::ino_for(&mut st, &path, FileKind::File);
            let n = st.inodes.get_mut(&ino).expect("made");
            n.lookups += 1;
            n.open += 1;
            n.writers += 1;
            n.unlinked = false;
            n.labelled_dirty = Some(a.version);
            ino
        };
        let opened = self.new_handle(ino, file, true, Some(a.version));
        Ok((Self::stat_of(&self.lock(), ino, &a), opened))
    }

    /// Creates and opens a file for `open(O_CREAT | O_TRUNC)` without `O_EXCL` (a shell's `>`,
    /// a compiler's output). Where this client's leased listing says the name is absent, the
    /// file is made here only and created on the server by its first commit (on close, as
    /// close-to-open asks): one round trip for the file, not two. Had someone made the name
    /// meanwhile, unseen yet, the commit replaces it, as the truncating open would have.
    /// Elsewhere, as [`create`](Self::create).
    pub fn create_truncating(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
    ) -> Result<(Stat, Opened), Errno> {
        let (dir, path) = self.child(parent, name)?;
        let known = self.lock().ino_of.contains_key(&path);
        if known || self.listed(&dir, name) != Some(false) || self.lookup_special(&path).is_some() {
            return self.create(parent, name, mode, false);
        }
        let data = self.files.data(&path);
        let _g = self.copies.lock(&[&path]);
        self.files.remove(&path);
        empty_copy(&data)?;
        self.files.set_meta(&path, None, true)?;
        let file = OpenOptions::new().read(true).write(true).open(&data)?;
        let ino = {
            let mut st = self.lock();
            // The server's directory is as it was: only the listing here changes.
            if let Some(l) = st.listings.get_mut(&dir) {
                if let Err(i) = l.value.binary_search_by(|e| e.0.as_slice().cmp(name)) {
                    l.value.insert(i, (name.to_vec(), FileKind::File));
                }
            }
            let ino = Self::ino_for(&mut st, &path, FileKind::File);
            let n = st.inodes.get_mut(&ino).expect("made");
            n.lookups += 1;
            n.open += 1;
            n.writers += 1;
            n.unlinked = false;
            n.dirty = true;
            n.pending = true;
            n.mode = Some(mode & 0o7777);
            ino
        };
        let opened = self.new_handle(ino, file, true, None);
        match self.local_stat(ino, Some(opened.fh)) {
            Ok(Some(s)) => Ok((s, opened)),
            Ok(None) => Err(Errno::EIO),
            Err(e) => Err(e),
        }
    }

    /// The inode at `path` if it was created here and is not yet on the server.
    fn pending_at(&self, path: &WirePath) -> Option<Ino> {
        let st = self.lock();
        let ino = *st.ino_of.get(path)?;
        st.inodes.get(&ino).filter(|n| n.pending).map(|_| ino)
    }

    /// O_CREAT on a name that exists: open it (O_EXCL: refuse).
    fn create_existing(
        &self,
        parent: Ino,
        name: &[u8],
        excl: bool,
    ) -> Result<(Stat, Opened), Errno> {
        if excl {
            return Err(Errno::EEXIST);
        }
        let (_, path) = self.child(parent, name)?;
        {
            // What we knew was stale: ask again.
            let mut st = self.lock();
            st.attrs.remove(&path);
        }
        let s = self.lookup(parent, name)?;
        match self.open(s.ino, true, false) {
            Ok(o) => Ok((self.getattr(s.ino)?, o)),
            Err(e) => {
                self.forget(s.ino, 1);
                Err(e)
            }
        }
    }

    fn handle(&self, fh: u64) -> Result<(Ino, Arc<File>, bool), Errno> {
        let st = self.lock();
        let h = st.handles.get(&fh).ok_or(Errno::EBADF)?;
        Ok((h.ino, h.file.clone(), h.write))
    }

    /// Reads from an open file (at local speed: the cached copy).
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let (_, file, _) = self.handle(fh)?;
        let mut buf = vec![0u8; size as usize];
        let mut got = 0;
        while got < buf.len() {
            match file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        buf.truncate(got);
        Ok(buf)
    }

    /// Writes to an open file's copy; the server sees it on close.
    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let (ino, file, write) = self.handle(fh)?;
        if !write {
            return Err(Errno::EBADF);
        }
        self.ensure_dirty(ino)?;
        file.write_all_at(data, offset)?;
        // Counted after the bytes are in: a write-back that began before sees the count move
        // and leaves the copy dirty; one that cleaned it meanwhile is undone.
        let still = {
            let mut st = self.lock();
            let n = st.inodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
            n.writes += 1;
            n.dirty
        };
        if !still {
            self.ensure_dirty(ino)?;
        }
        Ok(data.len() as u32)
    }

    /// After this client's own change of a file's mode: the server says the content is the
    /// same object as before (it carries what it knows of a file over its own chmod), so the
    /// local copy of the old version is the new version too. A later write-back is then made
    /// against the version the chmod made, not reported as a conflict with itself
    /// (`open(O_CREAT|O_EXCL)`, `fchmod`, write, close: every lock file rsync and git make).
    fn follow_own_change(
        &self,
        path: &WirePath,
        before: Option<Attr>,
        after: &Attr,
    ) -> Result<(), Errno> {
        let Some(b) = before else {
            return Ok(());
        };
        if b.oid.is_none() || b.oid != after.oid || b.version == after.version {
            return Ok(());
        }
        // The same content at a new version (the own change was of attributes only): a copy
        // of the old one is a copy of the new one; one labelled dirty (a create's, a kept
        // change's) keeps its label, against the new version.
        if let Some(m) = self.files.meta(path) {
            if m.version == Some(b.version) {
                self.files.set_meta(path, Some(after.version), m.dirty)?;
                let mut st = self.lock();
                if let Some(&ino) = st.ino_of.get(path) {
                    if let Some(n) = st.inodes.get_mut(&ino) {
                        if n.labelled_dirty == Some(b.version) {
                            n.labelled_dirty = Some(after.version);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Marks `ino`'s copy dirty unless it is, against the version its record names.
    fn ensure_dirty(&self, ino: Ino) -> Result<(), Errno> {
        let path = {
            let mut st = self.lock();
            let n = st.inodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
            if n.dirty {
                return Ok(());
            }
            if n.labelled_dirty.is_some() {
                // Its record says dirty already (a create's): nothing to read or write.
                n.dirty = true;
                n.writes += 1;
                return Ok(());
            }
            n.path.clone()
        };
        let base = self.files.meta(&path).and_then(|m| m.version);
        self.mark_dirty(ino, &path, base)
    }

    /// A file descriptor of `fh` was closed (close-to-open: local changes are committed now,
    /// and an error here is what `close` returns).
    pub fn flush(&self, fh: u64) -> Result<(), Errno> {
        let (ino, _, write) = self.handle(fh)?;
        // A reader's close publishes nothing (changes left by an earlier writer whose
        // write-back failed go up with upkeep).
        if !write {
            return Ok(());
        }
        self.write_back(ino)
    }

    /// fsync: the changes reach the server and are durable there.
    pub fn fsync(&self, fh: u64) -> Result<(), Errno> {
        self.flush(fh)?;
        self.sync_server()
    }

    /// fsync of a directory: every change of names made here is durable on the server.
    pub fn fsyncdir(&self) -> Result<(), Errno> {
        self.sync_server()
    }

    /// Makes the changes made here durable on the server. The mount asks for
    /// `FEATURE_DEFERRED_SYNC`: a close, create, rename or removal is atomic and visible on the
    /// server at once, and durable there at the next Sync: at `fsync`, about a second later
    /// (upkeep), or at unmount, a local file system's terms for a change not yet fsynced.
    fn sync_server(&self) -> Result<(), Errno> {
        let Some(since) = self.lock().unsynced.take() else {
            return Ok(());
        };
        let r = self.link.run(|c| {
            if c.offers(ferry_proto::FEATURE_DEFERRED_SYNC) {
                c.call(Request::Sync)?;
            }
            Ok(())
        });
        if let Err(f) = r {
            tracing::debug!("sync: {f}");
            let mut st = self.lock();
            let at = st.unsynced.get_or_insert(since);
            *at = (*at).min(since);
            return Err(errno_of(&f));
        }
        Ok(())
    }

    /// The size and free space of the server's file system under the mount (the last answer
    /// while the server is unreachable).
    pub fn statfs(&self) -> FsStats {
        let root = match self.path_of(ROOT) {
            Ok((p, _)) => p,
            Err(_) => return UNKNOWN_FS,
        };
        let asked = self.link.run(|c| {
            if !c.offers(ferry_proto::FEATURE_STATFS) {
                return Ok(None);
            }
            match c.call(Request::StatFs { path: root })?.pop() {
                Some(Reply::FsStats(f)) => Ok(Some(f)),
                other => Err(ConnError::Unexpected(format!("{other:?}")).into()),
            }
        });
        let mut last = self.fs_stats.lock().unwrap_or_else(|e| e.into_inner());
        match asked {
            Ok(Some(f)) => *last = Some(f),
            Ok(None) => {}
            Err(f) => tracing::debug!("statfs: {f}"),
        }
        last.unwrap_or(UNKNOWN_FS)
    }

    /// The last reference to `fh` is gone.
    pub fn release(&self, fh: u64) -> Result<(), Errno> {
        let h = self.lock().handles.remove(&fh).ok_or(Errno::EBADF)?;
        // Writes through a shared mapping can arrive after the last flush.
        let r = if h.write {
            self.write_back(h.ino)
        } else {
            Ok(())
        };
        let mut st = self.lock();
        if let Some(n) = st.inodes.get_mut(&h.ino) {
            n.open = n.open.saturating_sub(1);
            if h.write {
                n.writers = n.writers.saturating_sub(1);
            }
            if n.writers == 0 && !n.dirty {
                if let Some(v) = n.labelled_dirty.take() {
                    // Closed unwritten: the copy is the version it was made as.
                    let path = n.path.clone();
                    if let Err(e) = self.files.set_meta(&path, Some(v), false) {
                        tracing::warn!("{path:?}: cannot label the cache's copy clean: {e}");
                    }
                }
            }
            if n.open == 0 && n.lookups == 0 && !n.dirty && h.ino != ROOT {
                let (path, unlinked) = (n.path.clone(), n.unlinked);
                st.inodes.remove(&h.ino);
                if !unlinked && st.ino_of.get(&path) == Some(&h.ino) {
                    st.ino_of.remove(&path);
                }
            }
        }
        r
    }

    /// How a file is written back: also asking for the attributes of the directory holding
    /// `path` (which the commit changes), in the same round trip.
    fn put_options(&self, path: &WirePath) -> PutOptions<'_> {
        PutOptions {
            chunker: self.opts.chunker.clone(),
            delete: false,
            dry_run: false,
            progress: None,
            cache: Some(&self.chunks),
            fewer_round_trips: true,
            stat_after: path.split_last().map(|(d, _)| d),
        }
    }

    /// Commits `ino`'s copy if it holds local changes.
    fn write_back(&self, ino: Ino) -> Result<(), Errno> {
        let _w = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let (path, writes, mode) = {
            let mut st = self.lock();
            let Some(n) = st.inodes.get_mut(&ino) else {
                return Ok(());
            };
            if !n.dirty {
                return Ok(());
            }
            n.labelled_dirty = None;
            if n.unlinked {
                // Removed or replaced while open: there is nothing left to write it to.
                n.dirty = false;
                return Ok(());
            }
            let (path, writes, mode) = (n.path.clone(), n.writes, n.mode);
            let known = st.attrs.get(&path).map(|l| l.value.mode);
            (path, writes, mode.or(known).unwrap_or(0o644))
        };
        match self.commit(&path, mode) {
            Ok(a) => {
                let mut st = self.lock();
                let clean = st.inodes.get(&ino).is_some_and(|n| n.writes == writes);
                if !clean {
                    // More was written meanwhile: still dirty, now against what was committed.
                    self.files.set_meta(&path, Some(a.version), true)?;
                }
                if let Some(n) = st.inodes.get_mut(&ino) {
                    n.kernel_version = Some(a.version);
                    n.pending = false;
                    if clean {
                        n.dirty = false;
                        n.mode = None;
                    }
                }
                Ok(())
            }
            Err(e) => {
                if e == Errno::EHOSTDOWN {
                    self.retry_dirty.store(true, Ordering::Release);
                    // Kept: whole on disk before the close returns, whatever happens next.
                    if let Err(e) = self.files.keep(&path) {
                        tracing::warn!("{path:?}: cannot make the kept changes durable: {e}");
                    }
                    tracing::warn!(
                        "{path:?}: server unreachable; the changes are kept in the cache and written back when it is reachable again"
                    );
                }
                if e == Errno::ENOENT && self.files.meta(&path).is_none() {
                    // Its copy was gone (said by `commit`): nothing is left to write back.
                    if let Some(n) = self.lock().inodes.get_mut(&ino) {
                        n.dirty = false;
                    }
                }
                Err(e)
            }
        }
    }

    /// Commits the copy of `path` (dirty, made against the version its record names) with
    /// permission bits `mode`; the record becomes the new version, clean. If the file moved
    /// on meanwhile, the last close wins: it is committed again over the current version.
    fn commit(&self, path: &WirePath, mode: u32) -> Result<Attr, Errno> {
        let meta = self.files.meta(path).ok_or(Errno::EIO)?;
        let data = self.files.data(path);
        if !data.exists() {
            // A record whose copy is gone has nothing left to write back: it is dropped (once,
            // said so) instead of being tried again at every retry of the others.
            tracing::warn!(
                "{path:?}: the local copy of a changed file is gone; nothing to write back"
            );
            self.files.remove(path);
            return Err(Errno::ENOENT);
        }
        let mut base = meta.version;
        let opts = self.put_options(path);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let asked = Instant::now();
            let mut stats = PutStats::default();
            // A version known to be empty (this client's create made it) is not asked for.
            let replacing = base.map(|version| ferry_fs::Replacing {
                version,
                empty: self
                    .lock()
                    .attrs
                    .get(path)
                    .is_some_and(|l| l.value.version == version && l.value.size == 0),
            });
            let r = self
                .link
                .run(|c| ferry_fs::put_file(c, &data, path, replacing, mode, &opts, &mut stats));
            self.apply_invalidations();
            match r {
                Ok(a) => {
                    self.files.set_meta(path, Some(a.version), false)?;
                    let mut st = self.lock();
                    self.store_attr(&mut st, path, a.clone(), asked);
                    if let Some((dir, name)) = path.split_last() {
                        Self::relist(&mut st, &dir, name, Some(FileKind::File));
                        self.store_dir(&mut st, &dir, stats.stat_after.take().map(Ok), asked);
                    }
                    self.counters.commits.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(
                        "{path:?}: committed version {:x} ({} bytes, {} chunks sent)",
                        a.version,
                        stats.bytes,
                        stats.chunks_sent
                    );
                    return Ok(a);
                }
                Err(Failure::Remote(ErrorCode::Conflict, m)) if attempt < 4 => {
                    tracing::warn!("{path:?}: {m}; the last close wins: replacing it with this client's version");
                    self.counters
                        .last_close_wins
                        .fetch_add(1, Ordering::Relaxed);
                    base = match self.fresh_attr(path) {
                        Ok(a) if a.kind == FileKind::File => Some(a.version),
                        Ok(_) => return Err(Errno::EISDIR),
                        Err(Failure::Remote(ErrorCode::NotFound, _)) => None,
                        Err(f) => return Err(errno_of(&f)),
                    };
                }
                Err(Failure::Failed(GetError::LocalChanged(_))) if attempt < 4 => {}
                Err(f) => {
                    tracing::warn!("{path:?}: cannot write back: {f}");
                    return Err(errno_of(&f));
                }
            }
        }
    }

    // ------------------------------------------------------------------ changes to names

    /// Sends `r` and asks for the attributes of `paths` in the same round trip (what the change
    /// made of them): each, or the error the server answered.
    fn change_then_stat(
        &self,
        r: Request,
        paths: &[&WirePath],
    ) -> Result<Vec<Result<Attr, ConnError>>, Failure> {
        let res = self.link.run(|c| {
            let mut rs = vec![r];
            rs.extend(
                paths
                    .iter()
                    .map(|p| Request::GetAttr { path: (*p).clone() }),
            );
            let mut out = batch(c, rs)?.into_iter();
            out.next().expect("asked")?;
            Ok(out.map(|r| r.and_then(attr_of)).collect())
        });
        self.apply_invalidations();
        res
    }

    /// Keeps the attributes of a directory this client just changed, asked for after the change
    /// (else they are asked for again when next wanted).
    fn store_dir(
        &self,
        st: &mut State,
        dir: &WirePath,
        a: Option<Result<Attr, ConnError>>,
        asked: Instant,
    ) {
        if let Some(Ok(a)) = a {
            self.store_attr(st, dir, a, asked);
        }
    }

    /// Sends `r` and asks for `path`'s attributes, and its directory's, in the same round trip.
    fn change_and_stat(&self, r: Request, path: &WirePath) -> Result<Attr, Errno> {
        let asked = Instant::now();
        let parent = path.split_last().map(|(d, _)| d);
        let mut paths = vec![path];
        paths.extend(parent.as_ref());
        let mut got = self
            .change_then_stat(r, &paths)
            .map_err(|f| errno_of(&f))?
            .into_iter();
        let a = got.next().expect("asked").map_err(errno_of_reply)?;
        let mut st = self.lock();
        self.store_attr(&mut st, path, a.clone(), asked);
        if let Some((dir, name)) = path.split_last() {
            Self::relist(&mut st, &dir, name, Some(a.kind));
            self.store_dir(&mut st, &dir, got.next(), asked);
        }
        Ok(a)
    }

    fn entry(&self, path: &WirePath, a: &Attr) -> Stat {
        let mut st = self.lock();
        let ino = Self::ino_for(&mut st, path, a.kind);
        let n = st.inodes.get_mut(&ino).expect("made");
        n.lookups += 1;
        n.unlinked = false;
        Self::stat_of(&st, ino, a)
    }

    pub fn mkdir(&self, parent: Ino, name: &[u8], mode: u32) -> Result<Stat, Errno> {
        let (_, path) = self.child(parent, name)?;
        let a = self.change_and_stat(
            Request::Mkdir {
                path: path.clone(),
                mode: mode & 0o7777,
            },
            &path,
        )?;
        Ok(self.entry(&path, &a))
    }

    pub fn symlink(&self, parent: Ino, name: &[u8], target: &[u8]) -> Result<Stat, Errno> {
        let (_, path) = self.child(parent, name)?;
        let a = self.change_and_stat(
            Request::Symlink {
                path: path.clone(),
                target: target.to_vec(),
            },
            &path,
        )?;
        self.lock()
            .links
            .insert(path.clone(), (a.version, target.to_vec()));
        Ok(self.entry(&path, &a))
    }

    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>, Errno> {
        let (path, _) = self.path_of(ino)?;
        let a = self.attr(&path)?;
        if let Some((v, t)) = self.lock().links.get(&path) {
            if *v == a.version {
                return Ok(t.clone());
            }
        }
        let r = self.link.run(
            |c| match c.call(Request::ReadLink { path: path.clone() })?.pop() {
                Some(Reply::Link(t)) => Ok(t),
                other => Err(ConnError::Unexpected(format!("{other:?}")).into()),
            },
        );
        self.apply_invalidations();
        let t = r.map_err(|f| errno_of(&f))?;
        self.lock().links.insert(path, (a.version, t.clone()));
        Ok(t)
    }

    /// Forgets what was cached of `path` and everything below it, after it was removed or
    /// renamed here; open inodes there are marked unlinked (`unlink`) or keep their number.
    fn drop_below(st: &mut State, path: &WirePath) {
        let below = |p: &WirePath| is_below(p, path);
        st.attrs.retain(|p, _| !below(p));
        st.listings.retain(|p, _| !below(p));
        st.links.retain(|p, _| !below(p));
        st.changing.retain(|p| !below(p));
    }

    fn unlinked(&self, st: &mut State, path: &WirePath) {
        let gone: Vec<(WirePath, Ino)> = st
            .ino_of
            .iter()
            .filter(|(p, _)| is_below(p, path))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        for (p, i) in gone {
            st.ino_of.remove(&p);
            if let Some(n) = st.inodes.get_mut(&i) {
                n.unlinked = true;
            }
            self.files.remove(&p);
        }
        self.files.remove(path);
        Self::drop_below(st, path);
    }

    fn remove(&self, parent: Ino, name: &[u8], dir: bool) -> Result<(), Errno> {
        let (parent_path, path) = self.child(parent, name)?;
        if let Some(r) = self.remove_special(&path, dir) {
            return r;
        }
        if let (false, Some(_)) = (dir, self.pending_at(&path)) {
            // Never on the server: removed here only (an open descriptor keeps its copy).
            let _w = self.writing.lock().unwrap_or_else(|e| e.into_inner());
            if self.pending_at(&path).is_some() {
                let mut st = self.lock();
                self.unlinked(&mut st, &path);
                if let Some(l) = st.listings.get_mut(&parent_path) {
                    if let Ok(i) = l.value.binary_search_by(|e| e.0.as_slice().cmp(name)) {
                        l.value.remove(i);
                    }
                }
                return Ok(());
            }
        }
        let asked = Instant::now();
        let r = if dir {
            Request::Rmdir { path: path.clone() }
        } else {
            Request::Unlink { path: path.clone() }
        };
        let mut got = self
            .change_then_stat(r, &[&parent_path])
            .map_err(|f| errno_of(&f))?;
        let mut st = self.lock();
        self.unlinked(&mut st, &path);
        Self::relist(&mut st, &parent_path, name, None);
        self.store_dir(&mut st, &parent_path, got.pop(), asked);
        Ok(())
    }

    pub fn unlink(&self, parent: Ino, name: &[u8]) -> Result<(), Errno> {
        self.remove(parent, name, false)
    }

    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<(), Errno> {
        self.remove(parent, name, true)
    }

    /// Renames (replacing what is at the new name; `noreplace`: unless something is).
    pub fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        noreplace: bool,
    ) -> Result<(), Errno> {
        let (from_dir, from) = self.child(parent, name)?;
        let (to_dir, to) = self.child(new_parent, new_name)?;
        if from == to {
            if self.lock().specials.get(&from).is_some() {
                return Ok(());
            }
            return self.attr(&from).map(drop);
        }
        if is_below(&to, &from) {
            return Err(Errno::EINVAL);
        }
        if let Some(r) = self.rename_special(&from, &to, noreplace) {
            return r;
        }
        if noreplace {
            match self.fresh_attr(&to) {
                Ok(_) => return Err(Errno::EEXIST),
                Err(Failure::Remote(ErrorCode::NotFound, _)) => {}
                Err(f) => return Err(errno_of(&f)),
            }
        }
        // Local changes of files being moved are written back under their old names first,
        // so nothing pending refers to a name that no longer exists.
        let moving: Vec<Ino> = {
            let st = self.lock();
            st.ino_of
                .iter()
                .filter(|(p, i)| is_below(p, &from) && st.inodes.get(i).is_some_and(|n| n.dirty))
                .map(|(_, i)| *i)
                .collect()
        };
        for i in moving {
            self.write_back(i)?;
        }
        let kind = self.lock().attrs.get(&from).map(|l| l.value.kind);
        let asked = Instant::now();
        let mut dirs = vec![&from_dir];
        if to_dir != from_dir {
            dirs.push(&to_dir);
        }
        let mut got = self
            .change_then_stat(
                Request::Rename {
                    from: from.clone(),
                    to: to.clone(),
                },
                &dirs,
            )
            .map_err(|f| errno_of(&f))?
            .into_iter();
        let _g = self.copies.lock(&[&from, &to]);
        let mut st = self.lock();
        // What was at the new name is gone.
        if st.ino_of.get(&to) != st.ino_of.get(&from) {
            self.unlinked(&mut st, &to);
        }
        // Inodes below the old name move with it, and so do their copies (whose versions
        // are checked on the next open, the rename having changed them on the server).
        let moved: Vec<(WirePath, Ino)> = st
            .ino_of
            .iter()
            .filter(|(p, _)| is_below(p, &from))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        for (p, _) in &moved {
            st.ino_of.remove(p);
        }
        let copy_moved = moved.iter().any(|(p, _)| p == &from);
        for (p, i) in moved {
            let Some(np) = rebase(&p, &from, &to) else {
                // Too long a path under the new name (past 4096 bytes): the file is out of
                // this mount's reach, as if removed; its cached copy goes.
                self.files.remove(&p);
                if let Some(n) = st.inodes.get_mut(&i) {
                    n.unlinked = true;
                }
                continue;
            };
            if let Err(e) = self.files.rename(&p, &np) {
                tracing::debug!("moving the cached copy of {p:?}: {e}");
            }
            if let Some(n) = st.inodes.get_mut(&i) {
                n.path = np.clone();
            }
            st.ino_of.insert(np, i);
        }
        if !copy_moved {
            if let Err(e) = self.files.rename(&from, &to) {
                tracing::debug!("moving the cached copy of {from:?}: {e}");
            }
        }
        Self::moved_specials(&mut st, &from, &to);
        Self::drop_below(&mut st, &from);
        Self::drop_below(&mut st, &to);
        Self::relist(&mut st, &from_dir, name, None);
        match kind {
            Some(k) => Self::relist(&mut st, &to_dir, new_name, Some(k)),
            None => {
                st.listings.remove(&to_dir);
            }
        }
        self.store_dir(&mut st, &from_dir, got.next(), asked);
        if to_dir != from_dir {
            self.store_dir(&mut st, &to_dir, got.next(), asked);
        }
        Ok(())
    }

    /// Changes attributes: size (through the copy: the new contents are committed on close,
    /// or now if the file is not open), permission bits and modification time.
    pub fn setattr(
        &self,
        ino: Ino,
        mode: Option<u32>,
        size: Option<u64>,
        mtime_ns: Option<i64>,
    ) -> Result<Stat, Errno> {
        if let Some(r) = self.setattr_special(ino, mode, size, mtime_ns) {
            return r;
        }
        let (path, kind) = self.path_of(ino)?;
        if let Some(size) = size {
            if kind == FileKind::Dir {
                return Err(Errno::EISDIR);
            }
            let (file, version) = self.open_copy(ino, true, size == 0)?;
            self.mark_dirty(ino, &path, version)?;
            file.set_len(size)?;
            let opened = {
                let mut st = self.lock();
                let n = st.inodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
                n.open -= 1;
                n.writers -= 1;
                n.open > 0
            };
            if !opened {
                self.write_back(ino)?;
            }
        }
        if mode.is_some() || mtime_ns.is_some() {
            let dirty = self.lock().inodes.get(&ino).is_some_and(|n| n.dirty);
            if dirty {
                // Goes with the commit of the changed copy.
                let data = self.files.data(&path);
                if let Some(m) = mode {
                    self.lock().inodes.get_mut(&ino).expect("open").mode = Some(m & 0o7777);
                }
                if let Some(t) = mtime_ns {
                    File::options()
                        .write(true)
                        .open(&data)?
                        .set_modified(time_of(t))?;
                }
            } else {
                let before = self.lock().attrs.get(&path).map(|l| l.value.clone());
                let after = self.change_and_stat(
                    Request::SetAttr {
                        path: path.clone(),
                        mode: mode.map(|m| m & 0o7777),
                        mtime_ns,
                    },
                    &path,
                )?;
                self.follow_own_change(&path, before, &after)?;
            }
        }
        self.getattr(ino)
    }

    // ------------------------------------------------------------------ upkeep

    /// Breaks the leases the server broke.
    fn apply_invalidations(&self) {
        let paths = self.link.invalidated();
        if paths.is_empty() {
            return;
        }
        let mut st = self.lock();
        let past = Instant::now() - Duration::from_millis(1);
        for p in paths {
            tracing::trace!("lease broken: {p:?}");
            // Kept, expired: the last known attributes still serve while offline.
            if let Some(l) = st.attrs.get_mut(&p) {
                l.until = past;
            }
            if let Some(l) = st.listings.get_mut(&p) {
                l.until = past;
                st.changing.insert(p);
            }
        }
    }

    /// Housekeeping, every few hundred milliseconds: takes lease breaks the server sent while
    /// idle, reconnects, and writes back changes kept while the server was unreachable.
    pub fn tick(&self) {
        self.link.poll();
        self.apply_invalidations();
        let epoch = self.link.epoch();
        let new_session = self.seen_epoch.swap(epoch, Ordering::AcqRel) != epoch;
        if (new_session || self.retry_dirty.load(Ordering::Acquire)) && self.link.is_up() {
            self.write_back_all();
        }
        let due = self
            .lock()
            .unsynced
            .is_some_and(|t| t.elapsed() >= SYNC_AFTER);
        if due && self.link.is_up() {
            if let Err(e) = self.sync_server() {
                let e = std::io::Error::from_raw_os_error(e.0);
                tracing::debug!("making the changes durable on the server: {e}");
            }
        }
    }

    /// Writes back every dirty copy that nobody is writing: open inodes' and those a previous
    /// run left. Returns the number that could not be (yet).
    pub fn write_back_all(&self) -> usize {
        self.retry_dirty.store(false, Ordering::Release);
        let (inodes, busy): (Vec<Ino>, Vec<WirePath>) = {
            let st = self.lock();
            let inodes = st
                .inodes
                .iter()
                .filter(|(_, n)| n.dirty && n.writers == 0)
                .map(|(i, _)| *i)
                .collect();
            let busy = st.inodes.values().map(|n| n.path.clone()).collect();
            (inodes, busy)
        };
        let mut left = 0;
        for i in inodes {
            if self.write_back(i).is_err() {
                left += 1;
            }
        }
        for m in self.files.dirty() {
            let Ok(path) = WirePath::new(m.path) else {
                continue;
            };
            if busy.contains(&path) {
                continue;
            }
            let _w = self.writing.lock().unwrap_or_else(|e| e.into_inner());
            let mode = self.lock().attrs.get(&path).map_or(0o644, |l| l.value.mode);
            match self.commit(&path, mode) {
                Ok(_) => tracing::info!("{path:?}: changes kept from before written back"),
                Err(e) => {
                    if e == Errno::EHOSTDOWN {
                        self.retry_dirty.store(true, Ordering::Release);
                    }
                    left += 1;
                }
            }
        }
        left
    }

    /// Keeps the cache within its bounds.
    fn trim(&self) {
        let busy: Vec<Vec<u8>> = {
            let st = self.lock();
            st.inodes
                .values()
                .filter(|n| n.open > 0 || n.dirty)
                .map(|n| n.path.as_bytes().to_vec())
                .collect()
        };
        let freed = self
            .files
            .trim(self.opts.cache_size, |p| busy.iter().any(|b| b == p));
        if freed > 0 {
            tracing::debug!("cache: evicted {freed} bytes of copies");
        }
        if let Err(e) = self.chunks.trim(self.opts.cache_size / 2) {
            tracing::warn!("cache: cannot trim the chunk cache: {e}");
        }
    }

    /// At unmount: writes back what can be, then hangs up.
    pub fn shutdown(&self) {
        let left = self.write_back_all();
        if left > 0 {
            tracing::warn!(
                "{left} changed files could not be written back; they are kept in the cache and written back by the next mount"
            );
        }
        if let Err(e) = self.sync_server() {
            let e = std::io::Error::from_raw_os_error(e.0);
            tracing::warn!("cannot make the last changes durable on the server: {e}");
        }
        self.link.close();
    }

    /// What the current session with the server has carried.
    pub fn traffic(&self) -> Option<ferry_fs::Traffic> {
        self.link.traffic()
    }

    /// Whether the server can be reached now.
    pub fn is_online(&self) -> bool {
        self.link.is_up()
    }
}

impl Inode {
    fn new(path: WirePath, kind: FileKind) -> Inode {
        Inode {
            path,
            kind,
            lookups: 0,
            open: 0,
            writers: 0,
            dirty: false,
            writes: 0,
            unlinked: false,
            kernel_version: None,
            mode: None,
            labelled_dirty: None,
            pending: false,
        }
    }
}

/// Makes `data` an empty copy (private to this user).
fn empty_copy(data: &std::path::Path) -> io::Result<()> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(data)
        .map(drop)
}

/// What statfs answers when the server does not say (an older server, or none reachable and
/// none asked before): plenty, so programs go on; a full disk fails the commit with ENOSPC.
const UNKNOWN_FS: FsStats = FsStats {
    block_size: 4096,
    blocks: 1 << 32,
    blocks_free: 1 << 31,
    blocks_avail: 1 << 31,
    files: 1 << 24,
    files_free: 1 << 23,
    name_max: 255,
};

/// Sends `requests` together (one round trip) and reads every reply: each request's replies,
/// or the error the server answered it with. Only a failure of the link is an `Err`.
fn batch(
    c: &mut Conn,
    requests: Vec<Request>,
) -> Result<Vec<Result<Vec<Reply>, ConnError>>, GetError> {
    let ids = requests
        .into_iter()
        .map(|r| c.send(r))
        .collect::<Result<Vec<_>, _>>()?;
    c.flush()?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        match c.replies(id) {
            Err(e @ ConnError::Remote { .. }) => out.push(Err(e)),
            Err(e) => return Err(e.into()),
            Ok(r) => out.push(Ok(r)),
        }
    }
    Ok(out)
}

/// The attributes an `Attr` reply carries.
fn attr_of(mut replies: Vec<Reply>) -> Result<Attr, ConnError> {
    match replies.pop() {
        Some(Reply::Attr(a)) => Ok(a),
        other => Err(ConnError::Unexpected(format!("{other:?}"))),
    }
}

fn get_attr(c: &mut Conn, path: &WirePath) -> Result<Attr, GetError> {
    Ok(attr_of(c.call(Request::GetAttr { path: path.clone() })?)?)
}

/// Whether `p` is `dir` or below it.
fn is_below(p: &WirePath, dir: &WirePath) -> bool {
    let (p, d) = (p.as_bytes(), dir.as_bytes());
    d.is_empty() || p == d || (p.len() > d.len() && p.starts_with(d) && p[d.len()] == b'/')
}

/// `p` (below `from`) moved to below `to`.
/// `p` (below `from`) moved below `to`; `None` if that path would be too long to name.
fn rebase(p: &WirePath, from: &WirePath, to: &WirePath) -> Option<WirePath> {
    let rest = &p.as_bytes()[from.as_bytes().len()..];
    let mut v = to.as_bytes().to_vec();
    v.extend_from_slice(rest);
    WirePath::new(v).ok()
}

pub(crate) fn time_of(ns: i64) -> std::time::SystemTime {
    if ns >= 0 {
        std::time::UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        std::time::UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> WirePath {
        WirePath::new(s.as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn paths_below_and_rebased() {
        assert!(is_below(&p("a/b"), &p("a")));
        assert!(is_below(&p("a"), &p("a")));
        assert!(!is_below(&p("ab"), &p("a")));
        assert!(is_below(&p("x"), &p("")));
        assert_eq!(rebase(&p("a/b/c"), &p("a/b"), &p("d")), Some(p("d/c")));
        assert_eq!(rebase(&p("a"), &p("a"), &p("z/y")), Some(p("z/y")));
        // A path that would pass 4096 bytes under the new name has none (no panic).
        let deep = p(&format!("a/{}", "x".repeat(4000)));
        assert_eq!(rebase(&deep, &p("a"), &p(&"b".repeat(200))), None);
    }
}
