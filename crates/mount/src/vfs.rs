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
//!   so names behave as on a local disk; its contents follow on close. (A create without
//!   `O_EXCL` in a directory whose listing is leased is the exception: its first commit
//!   creates it.)
//! - **Offline**: when the server cannot be reached, cached copies still open (the log says
//!   so), local changes stay in the cache marked dirty and are written back when the link
//!   returns (a restarted mount too); operations that need the server fail with `EHOSTDOWN`
//!   after at most the timeout, never hang.
//! - **Removals** of files whose leased listing and directory say the server will make them,
//!   and **attribute changes** (mode, times) of files whose attributes are leased, are
//!   acknowledged at once and sent together before the next request of any kind (so in
//!   order): `rm -rf` costs a round trip a directory, and `cp -a` none for the times it sets.
//!   One the server refuses after all is logged and the name shows as the server has it; one
//!   the link's failure leaves unanswered may not have been made (as a local file system's
//!   unsynced change may not survive a crash).
//! - **Creates** in a leased directory, exclusive or not, are made here and on the server by
//!   their commit; **listings** stay leased through others' changes, told name by name
//!   (`FEATURE_ENTRY_CHANGES`).
//!
//! The methods are grouped by what they serve: `attrs` (attributes and leases), `names`
//! (lookups, listings, inodes), `files` (copies, creates, reads, writes), `writeback` (commits
//! on close, fsync), `changes` (changes of names and attributes on the server), `breaks` (what
//! the server tells of changes: lease breaks, names changed, answers to queued changes),
//! `specials` (FIFOs, sockets, device nodes); upkeep and what they share stay here.
//!
//! Locks: `state` is held only briefly and never across a message; `copies` serialises, per
//! path, the decision to fetch a copy with opening it (so a copy being written is never
//! replaced, and an open of one file never waits for another's fetch); the link serialises
//! messages.

mod attrs;
mod breaks;
mod changes;
mod files;
mod links;
mod names;
mod paths;
mod providers;
mod puts;
mod setattr;
mod specials;

pub use providers::Providers;
mod writeback;
pub use specials::SpecialKind;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferry_chunk::ChunkerSpec;
use ferry_fs::{ConnError, GetError, GetStats, PutOptions, PutStats, Sources};
use ferry_proto::{Attr, DirEntry, ErrorCode, FileKind, FsStats, Reply, Request, WirePath};
use ferry_store::LocalStore;

use crate::cache::FileCache;
use crate::link::{Break, Conn, Connector, Failure, Link};
use crate::queued::Change;
use paths::{entries_below, is_below, rebase, remove_below, remove_below_in_set};

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
    /// Nothing is acknowledged before the server has it: every close, removal, rename and
    /// change of attributes waits for its answer (see `crate::queued`).
    pub strict_close: bool,
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
    /// Created here and not yet on the server (in a directory whose listing is leased): its
    /// first commit creates it.
    pending: bool,
    /// Created here exclusively (`O_EXCL`) and not yet on the server: its commit does not
    /// replace a file someone else made under its name meanwhile.
    exclusive: bool,
    /// The count of writes whose data a queued commit carries (see `puts`).
    put: Option<u64>,
    /// Given another name here (a hard link): its names are the paths `ino_of` maps to it,
    /// and `path` is one of them.
    linked: bool,
    /// The server's change time of the version committed from here, and the one shown for it
    /// while it was written here (its copy's): shown still, while the server's is that one
    /// (see `attrs::shown_ctime`).
    ctime_shown: Option<(i64, i64)>,
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
    // Maps by path are ordered, so what lies below a directory is a range (`below`), not a
    // scan of every path known (which made `rm -rf` of n files cost n² comparisons).
    attrs: BTreeMap<WirePath, Leased<Attr>>,
    listings: BTreeMap<WirePath, Leased<Listing>>,
    /// Directories whose listing a lease break dropped: a lookup there asks for its one name,
    /// not the whole listing again (a directory being filled or emptied would be listed again
    /// at every step, the work and bytes growing with its size). Listing it again ends this.
    changing: BTreeSet<WirePath>,
    /// Symlink targets by path, with the version they were read at.
    links: BTreeMap<WirePath, (u64, Vec<u8>)>,
    inodes: HashMap<Ino, Inode>,
    ino_of: BTreeMap<WirePath, Ino>,
    next_ino: Ino,
    handles: HashMap<u64, Handle>,
    next_fh: u64,
    /// FIFOs, sockets and device nodes made here (never on the server).
    specials: specials::Specials,
    /// Directories whose special files changed here, or a file of which was removed without
    /// waiting for the server, with the time of the last such change: a directory's
    /// modification and change times while later than the server's (which never hears of
    /// the former, and makes the latter a little later).
    dir_times: HashMap<WirePath, i64>,
    /// When the oldest change made here that the server has not made durable yet was made
    /// (`FEATURE_DEFERRED_SYNC`: see [`Vfs::sync_server`]).
    unsynced: Option<Instant>,
    /// Names this mount changed lately (see [`names::Recent`]).
    recent: names::Recent,
    /// The size and blocks of an empty directory on the server, as its first one made here
    /// showed (a directory made later with its making queued shows them: see
    /// `Vfs::mkdir_later`).
    empty_dir: Option<(u64, u64)>,
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
    /// New files' commits queued (each reads and cuts the whole file).
    pub commits_queued: AtomicU64,
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
    /// Held while the server's breaks and answers taken are applied: whoever applies them
    /// next finds those taken before applied.
    applying: Mutex<()>,
    /// The recipes of versions committed here (see `crate::recipes`).
    recipes: crate::recipes::Recipes,
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
            applying: Mutex::new(()),
            recipes: Default::default(),
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

    // ------------------------------------------------------------------ upkeep

    /// Treats every lease held as expired: the next use of each attribute or listing asks the
    /// server again. The state a lease's end leaves, without waiting for it (tests use it
    /// instead of short leases, which a slow run would see expire early).
    pub fn expire_leases(&self) {
        let gone = Instant::now() - Duration::from_millis(1);
        let mut st = self.lock();
        for l in st.attrs.values_mut() {
            l.until = l.until.min(gone);
        }
        for l in st.listings.values_mut() {
            l.until = l.until.min(gone);
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
            // Not waiting for sessions in use: those are left for the next round.
            if let Err(e) = self.sync_sessions(false) {
                let e = std::io::Error::from_raw_os_error(e.0);
                tracing::debug!("making the changes durable on the server: {e}");
            }
        }
    }

    /// Waits at most `timeout` for changes made here (removals, renames, attributes) to be queued for
    /// the server, and sends them (with those queued meanwhile) when some are, waiting for the
    /// answers: a thread of the mount does this in a loop, so the server has a change within a
    /// round trip or two of its acknowledgement, for every other client to see (see
    /// `Link::queue_change`).
    pub fn send_changes(&self, timeout: Duration) {
        if !self.link.queued.wait(timeout, self.link.is_near()) {
            // Idle: the cached copies of files removed go now.
            self.files.empty_trash();
            return;
        }
        self.send_queued();
    }

    /// Writes back every dirty copy that nobody is writing: open inodes' and those a previous
    /// run left. Returns the number that could not be (yet).
    pub fn write_back_all(&self) -> usize {
        self.retry_dirty.store(false, Ordering::Release);
        // The cache's dirty copies are listed before the inodes are looked at: a file made
        // while the list is read (its record dirty, its inode new) is then among the inodes,
        // and left to them. Listed after, it was written back here beside its own queued
        // commit (`cp -a` or a loop of `echo > f` right after mounting), and a removal could
        // then find the file back on the server.
        let dirty = self.files.dirty();
        let (inodes, busy): (Vec<Ino>, std::collections::HashSet<WirePath>) = {
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
            if self.link.queued.has_put(i) {
                // The queue's: the mount's thread sends it (not yet, while the server is
                // unreachable: counted as left, its copy kept dirty for the next mount).
                left += usize::from(!self.link.is_up());
                continue;
            }
            if self.write_back_now(i).is_err() {
                left += 1;
            }
        }
        for m in dirty {
            let Ok(path) = WirePath::new(m.path) else {
                continue;
            };
            if busy.contains(&path) {
                continue;
            }
            let _w = self.writing.lock().unwrap_or_else(|e| e.into_inner());
            // An inode made for it since, or a change of it queued or on its way (a new
            // file's commit, a removal), decides; or it was written back or removed since.
            let taken = self.lock().inodes.values().any(|n| n.path == path);
            if taken
                || self.link.queued.involves(&path, false)
                || !self.files.meta(&path).is_some_and(|m| m.dirty)
            {
                continue;
            }
            let mode = self.lock().attrs.get(&path).map_or(0o644, |l| l.value.mode);
            match self.commit(&path, mode, false, false, None) {
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
        self.send_changes(Duration::ZERO);
        self.files.empty_trash();
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

    /// Whether `ino` shows its local copy's attributes, changed here and not yet written back
    /// (see `Vfs::local_stat`): its commit takes them along, and the file keeps its change
    /// time then (see `Vfs::keep_ctime_shown`).
    pub fn shows_its_copy(&self, ino: Ino) -> bool {
        self.lock().inodes.get(&ino).is_some_and(|n| n.dirty)
    }

    /// What the current session with the server has carried.
    pub fn traffic(&self) -> Option<ferry_fs::Traffic> {
        self.link.traffic()
    }

    /// How many records of cached copies this mount has written (its own work a change).
    pub fn records_written(&self) -> u64 {
        self.files.records_written()
    }

    /// Whether the server can be reached now.
    pub fn is_online(&self) -> bool {
        self.link.is_up()
    }

    /// How many syncs wait for sessions in use by other operations (for tests).
    #[doc(hidden)]
    pub fn syncs_waiting(&self) -> usize {
        self.link.owed_waits.load(Ordering::Acquire)
    }

    /// How many operations wait for a session in use to come back (for tests).
    #[doc(hidden)]
    pub fn session_waiters(&self) -> usize {
        self.link.session_waits.load(Ordering::Acquire)
    }

    /// How long an operation waits for a session in use before it opens another (tests
    /// lengthen it, so that a slow run does not open one early).
    #[doc(hidden)]
    pub fn set_session_patience(&self, d: Duration) {
        self.link
            .patience_ms
            .store(d.as_millis() as u64, Ordering::Relaxed);
    }
}

impl Inode {
    /// The server holds this file's copy at `version`, committed with its writes up to now
    /// (`clean`) or fewer: the version the kernel's pages are of, on the server, and (clean)
    /// nothing left to write back; still open for writing, its record is labelled dirty at that
    /// version (as a create labels its copy: the next write syncs no record).
    fn committed(&mut self, version: u64, clean: bool) {
        self.kernel_version = Some(version);
        self.pending = false;
        self.exclusive = false;
        if clean {
            self.dirty = false;
            self.mode = None;
            if self.writers > 0 {
                self.labelled_dirty = Some(version);
            }
        }
    }

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
            exclusive: false,
            put: None,
            linked: false,
            ctime_shown: None,
        }
    }
}

/// Makes `data` an empty copy (private to this user).
fn empty_copy(data: &std::path::Path) -> io::Result<()> {
    new_copy(data).map(drop)
}

/// An empty copy at `data` (made, or emptied), open to read and write.
fn new_copy(data: &std::path::Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(data)
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

pub(crate) fn time_of(ns: i64) -> std::time::SystemTime {
    if ns >= 0 {
        std::time::UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        std::time::UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}
