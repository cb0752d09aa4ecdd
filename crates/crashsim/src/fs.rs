//! The recording file system: a FUSE file system in memory that logs every change and sync in
//! the order the kernel sent them (writes are synchronous without a write-back cache, so the
//! log's order is the order the program's system calls returned in).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};

use crate::model::{NewNode, Node, Op, Refused, Tree};

const TTL: Duration = Duration::from_secs(1);

/// The live tree, the log, and what the kernel sees of each inode that the tree does not keep.
#[derive(Default)]
pub(crate) struct Live {
    pub(crate) tree: Tree,
    pub(crate) log: Vec<Op>,
    next_ino: u64,
    times: HashMap<u64, SystemTime>,
}

impl Live {
    fn new() -> Live {
        Live {
            next_ino: 2,
            ..Live::default()
        }
    }

    /// Applies and logs a change the live system accepts.
    fn change(&mut self, op: Op) -> Result<(), Errno> {
        self.tree.apply(&op).map_err(errno)?;
        for ino in touched_inodes(&op) {
            self.times.insert(ino, SystemTime::now());
        }
        self.log.push(op);
        Ok(())
    }

    fn attr(&self, ino: u64) -> Result<FileAttr, Errno> {
        let node = self.tree.nodes.get(&ino).ok_or(Errno::ENOENT)?;
        let (kind, perm, size) = match node {
            Node::File { data, mode } => (FileType::RegularFile, *mode, data.len() as u64),
            Node::Dir { entries, mode } => (FileType::Directory, *mode, entries.len() as u64),
            Node::Symlink { target } => (FileType::Symlink, 0o777, target.len() as u64),
        };
        let t = self
            .times
            .get(&ino)
            .copied()
            .unwrap_or(SystemTime::UNIX_EPOCH);
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind,
            perm: (perm & 0o7777) as u16,
            nlink: match node {
                Node::File { .. } => self.tree.links(ino),
                _ => 1,
            },
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn create(&mut self, parent: u64, name: &OsStr, node: NewNode) -> Result<FileAttr, Errno> {
        let ino = self.next_ino;
        self.change(Op::Create {
            parent,
            name: name.as_bytes().to_vec(),
            ino,
            node,
        })?;
        self.next_ino += 1;
        self.attr(ino)
    }
}

fn touched_inodes(op: &Op) -> Vec<u64> {
    match op {
        Op::Create { parent, ino, .. } => vec![*parent, *ino],
        Op::Link { parent, ino, .. } => vec![*parent, *ino],
        Op::Remove { parent, .. } => vec![*parent],
        Op::Rename {
            parent, to_parent, ..
        } => vec![*parent, *to_parent],
        Op::Chmod { ino, .. } | Op::Write { ino, .. } | Op::SetLen { ino, .. } => vec![*ino],
        _ => vec![],
    }
}

fn errno(r: Refused) -> Errno {
    match r {
        Refused::NotFound => Errno::ENOENT,
        Refused::NotDir => Errno::ENOTDIR,
        Refused::IsDir => Errno::EISDIR,
        Refused::Exists => Errno::EEXIST,
        Refused::NotEmpty => Errno::ENOTEMPTY,
    }
}

pub(crate) struct Recording(pub(crate) Arc<Mutex<Live>>);

impl Recording {
    pub(crate) fn new() -> (Recording, Arc<Mutex<Live>>) {
        let live = Arc::new(Mutex::new(Live::new()));
        (Recording(live.clone()), live)
    }

    fn live(&self) -> MutexGuard<'_, Live> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn entry(r: Result<FileAttr, Errno>, reply: ReplyEntry) {
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    /// unlink (`dir` false) or rmdir (`dir` true) of `name`, which must be of that kind.
    fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool, reply: ReplyEmpty) {
        let mut live = self.live();
        let r = match live.tree.lookup(parent.0, name.as_bytes()) {
            Ok(ino) if live.tree.entries(ino).is_ok() != dir => Err(match dir {
                true => Errno::ENOTDIR,
                false => Errno::EISDIR,
            }),
            Ok(_) => live.change(Op::Remove {
                parent: parent.0,
                name: name.as_bytes().to_vec(),
            }),
            Err(e) => Err(errno(e)),
        };
        Self::empty(r, reply);
    }

    fn empty(r: Result<(), Errno>, reply: ReplyEmpty) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

fn nanos_time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

impl Filesystem for Recording {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let live = self.live();
        let r = live
            .tree
            .lookup(parent.0, name.as_bytes())
            .map_err(errno)
            .and_then(|ino| live.attr(ino));
        Self::entry(r, reply);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.live().attr(ino.0) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
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
        let mut live = self.live();
        let mut r = Ok(());
        if let Some(mode) = mode {
            r = r.and_then(|()| {
                live.change(Op::Chmod {
                    ino: ino.0,
                    mode: mode & 0o7777,
                })
            });
        }
        if let Some(len) = size {
            r = r.and_then(|()| live.change(Op::SetLen { ino: ino.0, len }));
        }
        if let (Ok(()), Some(t)) = (&r, mtime) {
            live.times.insert(ino.0, nanos_time(t));
        }
        match r.and_then(|()| live.attr(ino.0)) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.live().tree.nodes.get(&ino.0) {
            Some(Node::Symlink { target }) => reply.data(target),
            Some(_) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & 0o170000 != 0o100000 {
            return reply.error(Errno::EPERM);
        }
        let node = NewNode::File {
            mode: mode & !umask & 0o7777,
        };
        Self::entry(self.live().create(parent.0, name, node), reply);
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
        let node = NewNode::Dir {
            mode: mode & !umask & 0o7777,
        };
        Self::entry(self.live().create(parent.0, name, node), reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, false, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, true, reply);
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let node = NewNode::Symlink {
            target: target.as_os_str().as_bytes().to_vec(),
        };
        Self::entry(self.live().create(parent.0, link_name, node), reply);
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
        let mut live = self.live();
        if flags.contains(RenameFlags::RENAME_EXCHANGE)
            || flags.contains(RenameFlags::RENAME_WHITEOUT)
        {
            return reply.error(Errno::EINVAL);
        }
        if flags.contains(RenameFlags::RENAME_NOREPLACE)
            && live.tree.lookup(newparent.0, newname.as_bytes()).is_ok()
        {
            return reply.error(Errno::EEXIST);
        }
        let r = live.change(Op::Rename {
            parent: parent.0,
            name: name.as_bytes().to_vec(),
            to_parent: newparent.0,
            to_name: newname.as_bytes().to_vec(),
        });
        Self::empty(r, reply);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut live = self.live();
        if live.tree.entries(ino.0).is_ok() {
            return reply.error(Errno::EPERM);
        }
        let r = live
            .change(Op::Link {
                parent: newparent.0,
                name: newname.as_bytes().to_vec(),
                ino: ino.0,
            })
            .and_then(|()| live.attr(ino.0));
        Self::entry(r, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.live().tree.nodes.get(&ino.0) {
            Some(_) => reply.opened(FileHandle(ino.0), FopenFlags::empty()),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.live().tree.nodes.get(&ino.0) {
            Some(Node::File { data, .. }) => {
                let start = (offset as usize).min(data.len());
                let end = (start + size as usize).min(data.len());
                reply.data(&data[start..end]);
            }
            Some(_) => reply.error(Errno::EISDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let r = self.live().change(Op::Write {
            ino: ino.0,
            off: offset,
            data: data.to_vec(),
        });
        match r {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.live().log.push(Op::Fsync { ino: ino.0 });
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.live().tree.entries(ino.0) {
            Ok(_) => reply.opened(FileHandle(ino.0), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let live = self.live();
        let entries = match live.tree.entries(ino.0) {
            Ok(e) => e,
            Err(e) => return reply.error(errno(e)),
        };
        let dots = [
            (ino.0, FileType::Directory, b".".to_vec()),
            (ino.0, FileType::Directory, b"..".to_vec()),
        ];
        let rest = entries.iter().map(|(name, &i)| {
            let kind = match live.tree.nodes.get(&i) {
                Some(Node::Dir { .. }) => FileType::Directory,
                Some(Node::Symlink { .. }) => FileType::Symlink,
                _ => FileType::RegularFile,
            };
            (i, kind, name.clone())
        });
        for (n, (i, kind, name)) in dots.into_iter().chain(rest).enumerate() {
            if (n as u64) < offset {
                continue;
            }
            if reply.add(INodeNo(i), n as u64 + 1, kind, OsStr::from_bytes(&name)) {
                break;
            }
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
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.live().log.push(Op::FsyncDir { ino: ino.0 });
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 24, 1 << 23, 1 << 23, 1 << 20, 1 << 19, 4096, 255, 4096);
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENODATA);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let node = NewNode::File {
            mode: mode & !umask & 0o7777,
        };
        match self.live().create(parent.0, name, node) {
            Ok(a) => reply.created(
                &TTL,
                &a,
                Generation(0),
                FileHandle(a.ino.0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }
}
