//! The FUSE adapter: kernel requests in, [`Vfs`] calls, replies out. Nothing here decides
//! anything about caching or consistency; `errno` is the one mapping of errors.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferry_proto::FileKind;
use fuser::{
    Errno as KErrno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::vfs::{Errno, Stat, Vfs};

/// How long the kernel may keep names and attributes without asking: short, because the
/// leases live in the [`Vfs`], which answers from them without a message.
const TTL: Duration = Duration::from_secs(1);

/// How long the kernel may keep `s`: no time for a file of several names (changed through
/// another name, on the server or here, it is not told; see `vfs::links`).
fn ttl(s: &Stat) -> Duration {
    match s.nlink > 1 && s.kind == FileKind::File {
        true => Duration::ZERO,
        false => TTL,
    }
}

pub(crate) struct FerryFs {
    pub(crate) vfs: Arc<Vfs>,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// The errno a program gets, logged when it is one a user would want explained: an I/O error
/// (the server refused or the link failed: the reason was logged where it was met, this says
/// what the program saw) or a permission refused.
fn errno(op: &str, e: Errno) -> KErrno {
    match e {
        Errno::EIO => tracing::warn!("{op}: EIO returned to a program"),
        Errno::EACCES | Errno::EPERM => tracing::info!("{op}: {e:?} returned to a program"),
        _ => {}
    }
    KErrno::from_i32(e.0)
}

fn nanos(t: TimeOrNow) -> i64 {
    let t = match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    };
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        _ => FileType::RegularFile,
    }
}

fn special_type(k: crate::vfs::SpecialKind) -> FileType {
    use crate::vfs::SpecialKind as S;
    match k {
        S::Fifo => FileType::NamedPipe,
        S::Socket => FileType::Socket,
        S::CharDevice => FileType::CharDevice,
        S::BlockDevice => FileType::BlockDevice,
    }
}

fn has(flags: i32, f: rustix::fs::OFlags) -> bool {
    flags & f.bits() as i32 != 0
}

impl FerryFs {
    fn attr(&self, s: &Stat) -> FileAttr {
        let t = crate::vfs::time_of(s.mtime_ns);
        FileAttr {
            ino: INodeNo(s.ino),
            size: s.size,
            blocks: s.blocks,
            atime: crate::vfs::time_of(s.atime_ns),
            mtime: t,
            ctime: crate::vfs::time_of(s.ctime_ns),
            crtime: t,
            kind: match s.special {
                Some((k, _)) => special_type(k),
                None => kind(s.kind),
            },
            perm: (s.mode & 0o7777) as u16,
            nlink: s.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: s.special.map_or(0, |(_, r)| r),
            blksize: 4096,
            flags: 0,
        }
    }

    fn entry(&self, op: &str, r: Result<Stat, Errno>, reply: ReplyEntry) {
        match r {
            Ok(s) => reply.entry(&ttl(&s), &self.attr(&s), Generation(0)),
            Err(e) => reply.error(errno(op, e)),
        }
    }

    fn empty(op: &str, r: Result<(), Errno>, reply: ReplyEmpty) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(op, e)),
        }
    }
}

impl Filesystem for FerryFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // O_TRUNC comes with open, so a file about to be overwritten is not fetched first.
        if config
            .add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC)
            .is_err()
        {
            tracing::debug!("the kernel has no atomic O_TRUNC");
        }
        // Listings with attributes where names are looked up after them (see `readdirplus`).
        if config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO)
            .is_err()
        {
            tracing::debug!("the kernel has no READDIRPLUS");
        }
        Ok(())
    }

    fn destroy(&mut self) {
        self.vfs.shutdown();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.entry("lookup", self.vfs.lookup(parent.0, name.as_bytes()), reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.vfs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.vfs.getattr_open(ino.0, fh.map(|f| f.0)) {
            Ok(s) => reply.attr(&ttl(&s), &self.attr(&s)),
            Err(e) => reply.error(errno("getattr", e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // Every file belongs to the user who mounted: other owners cannot be stored.
        if uid.is_some_and(|u| u != self.uid) || gid.is_some_and(|g| g != self.gid) {
            return reply.error(KErrno::EPERM);
        }
        match self.vfs.setattr(ino.0, mode, size, mtime.map(nanos)) {
            // A change made to a copy that its commit takes along (a file being written, or
            // made here) shows the copy's change time, which the file keeps: kept by the
            // kernel as any attributes. Any other is not: a change queued for the server (see
            // `Vfs::setattr`) has its change time said by the server, asked for at the next
            // look.
            Ok(s) => {
                let ttl = match self.vfs.shows_its_copy(ino.0) {
                    true => ttl(&s),
                    false => Duration::ZERO,
                };
                reply.attr(&ttl, &self.attr(&s))
            }
            Err(e) => reply.error(errno("setattr", e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.vfs.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno("readlink", e)),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        // Regular files on the server; FIFOs, sockets and devices here only.
        if let Some(k) = crate::vfs::SpecialKind::of_mode(mode) {
            let r = self
                .vfs
                .mknod(parent.0, name.as_bytes(), k, mode & !umask, rdev);
            return self.entry("mknod", r, reply);
        }
        if rustix::fs::FileType::from_raw_mode(mode) == rustix::fs::FileType::RegularFile {
            let r = self
                .vfs
                .create(parent.0, name.as_bytes(), mode & !umask, true)
                .and_then(|(s, o)| self.vfs.release(o.fh).map(|()| s));
            return self.entry("mknod", r, reply);
        }
        reply.error(KErrno::EPERM);
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.entry(
            "mkdir",
            self.vfs.mkdir(parent.0, name.as_bytes(), mode & !umask),
            reply,
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty("unlink", self.vfs.unlink(parent.0, name.as_bytes()), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty("rmdir", self.vfs.rmdir(parent.0, name.as_bytes()), reply);
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let r = self.vfs.symlink(
            parent.0,
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
        );
        self.entry("symlink", r, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_EXCHANGE)
            || flags.contains(RenameFlags::RENAME_WHITEOUT)
        {
            return reply.error(KErrno::EINVAL);
        }
        let r = self.vfs.rename(
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            flags.contains(RenameFlags::RENAME_NOREPLACE),
        );
        Self::empty("rename", r, reply);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = self.vfs.link(ino.0, newparent.0, newname.as_bytes());
        self.entry("link", r, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write = !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY);
        let truncate = has(flags.0, rustix::fs::OFlags::TRUNC);
        match self.vfs.open(ino.0, write, truncate) {
            Ok(o) => reply.opened(
                FileHandle(o.fh),
                if o.keep_cache {
                    FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                },
            ),
            Err(e) => reply.error(errno("open", e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.vfs.read(fh.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno("read", e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.vfs.write(fh.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno("write", e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        Self::empty("flush", self.vfs.flush(fh.0), reply);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        Self::empty("release", self.vfs.release(fh.0), reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        Self::empty("fsync", self.vfs.fsync(fh.0), reply);
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.vfs.readdir(ino.0) {
            Ok(e) => e,
            Err(e) => return reply.error(errno("readdir", e)),
        };
        let dots = [
            (ino.0, FileKind::Dir, b".".to_vec()),
            (ino.0, FileKind::Dir, b"..".to_vec()),
        ];
        for (i, (e_ino, k, name)) in dots
            .into_iter()
            .chain(entries)
            .enumerate()
            .skip(offset as usize)
        {
            let t = match self.vfs.special_of(e_ino) {
                Some(sk) => special_type(sk),
                None => kind(k),
            };
            if reply.add(INodeNo(e_ino), i as u64 + 1, t, OsStr::from_bytes(&name)) {
                break;
            }
        }
        reply.ok();
    }

    /// A listing with each entry's attributes (`FUSE_DO_READDIRPLUS`): every entry is looked
    /// up here as the kernel's `LOOKUP` would be, and the kernel counts it as one. `rm -rf`,
    /// `ls -l` and `find` then ask nothing more of a name before using it. The entries'
    /// attributes are leased first, with one listing if some are not, so the lookups cost no
    /// round trip each. With `FUSE_READDIRPLUS_AUTO` the kernel asks for this for a listing's
    /// first part, and for the rest only where names were looked up after a part.
    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: fuser::ReplyDirectoryPlus,
    ) {
        let entries = match self.vfs.readdir(ino.0) {
            Ok(e) => e,
            Err(e) => return reply.error(errno("readdirplus", e)),
        };
        let here = match self.vfs.getattr(ino.0) {
            Ok(s) => self.attr(&s),
            Err(e) => return reply.error(errno("readdirplus", e)),
        };
        if let Err(e) = self.vfs.lease_entries(ino.0) {
            return reply.error(errno("readdirplus", e));
        }
        let dots = [b".".to_vec(), b"..".to_vec()];
        let names = dots.into_iter().chain(entries.into_iter().map(|e| e.2));
        let mut added = false;
        for (i, name) in names.enumerate().skip(offset as usize) {
            let off = i as u64 + 1;
            let (at, ttl, attr) = if i < 2 {
                // (The kernel links no dentry for these, and counts no lookup.)
                (ino, Duration::ZERO, here)
            } else {
                match self.vfs.lookup(ino.0, &name) {
                    Ok(s) => (INodeNo(s.ino), ttl(&s), self.attr(&s)),
                    // Gone since it was listed: left out.
                    Err(Errno::ENOENT) => continue,
                    // Not left out silently: the listing ends before it, and the kernel's
                    // next call, from here, is told the error.
                    Err(e) if added => {
                        tracing::debug!("readdirplus: {:?}: {e:?}", String::from_utf8_lossy(&name));
                        break;
                    }
                    Err(e) => return reply.error(errno("readdirplus", e)),
                }
            };
            if reply.add(
                at,
                off,
                OsStr::from_bytes(&name),
                &ttl,
                &attr,
                Generation(0),
            ) {
                if i >= 2 {
                    // Not sent: the kernel holds no reference for it.
                    self.vfs.forget(at.0, 1);
                }
                break;
            }
            added = true;
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        Self::empty("fsyncdir", self.vfs.fsyncdir(), reply);
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        // Extended attributes are not stored on the server. ENOSYS tells the kernel so once,
        // for good (it answers EOPNOTSUPP itself from then on): else it asks for
        // "security.capability" before every write.
        reply.error(KErrno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        // Not stored (the kernel answers EOPNOTSUPP itself from then on: `cp -a` tries an
        // ACL on every file).
        reply.error(KErrno::ENOSYS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(KErrno::ENOSYS);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // The kernel checks permissions itself (default_permissions).
        reply.ok();
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(KErrno::ENOTTY);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let f = self.vfs.statfs();
        let bsize = f.block_size.max(1);
        reply.statfs(
            f.blocks,
            f.blocks_free,
            f.blocks_avail,
            f.files,
            f.files_free,
            bsize,
            f.name_max,
            bsize,
        );
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let (name, mode) = (name.as_bytes(), mode & !umask);
        let made = match has(flags, rustix::fs::OFlags::EXCL) {
            true => self.vfs.create_excl(parent.0, name, mode),
            false => self.vfs.create_later(parent.0, name, mode),
        };
        // A file made here shows its copy's times, and keeps its change time once the server
        // has it (see `Vfs::stat`): the kernel may keep them as any others (`cp`'s fstat of
        // the file it just made asked the mount again).
        match made {
            Ok((s, o)) => reply.created(
                &ttl(&s),
                &self.attr(&s),
                Generation(0),
                FileHandle(o.fh),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(errno("create", e)),
        }
    }
}
