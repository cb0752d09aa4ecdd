//! Special files (FIFOs, sockets, character and block devices) as objects of this mount only.
//!
//! The server stores regular files, directories and symlinks. A FIFO or a socket is a meeting
//! point of local processes, and the kernel carries their data itself: all a file system gives
//! them is a name and attributes. So a special file made in the mount lives in the mount's
//! memory: listed, looked up, chmod-ed, renamed and removed like any other name here, never
//! sent to the server, and gone at unmount. Another client does not see it; a name the server
//! has is never shadowed by one (making one on a name that exists is `EEXIST`). Device nodes
//! are never opened: the mount is `nodev`.

use std::collections::HashMap;

use ferry_proto::{ErrorCode, FileKind, Request, WirePath};

use super::{errno_of, is_below, rebase, Errno, Failure, Ino, Stat, State, Vfs};

/// What a special file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecialKind {
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl SpecialKind {
    /// The kind a mode's file type bits name; `None` for a regular file, a directory or a
    /// symlink.
    pub fn of_mode(mode: u32) -> Option<SpecialKind> {
        match mode & 0o170_000 {
            0o010_000 => Some(SpecialKind::Fifo),
            0o140_000 => Some(SpecialKind::Socket),
            0o020_000 => Some(SpecialKind::CharDevice),
            0o060_000 => Some(SpecialKind::BlockDevice),
            _ => None,
        }
    }
}

/// One special file's attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Special {
    pub kind: SpecialKind,
    /// Permission bits.
    pub mode: u32,
    /// A device's number (0 for the others).
    pub rdev: u32,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl Special {
    pub fn new(kind: SpecialKind, mode: u32, rdev: u32) -> Special {
        let now = now_ns();
        Special {
            kind,
            mode: mode & 0o7777,
            rdev,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
        }
    }
}

/// The special files of the mount, by path: each name leads to a record, which hard links
/// share (one record, several names).
#[derive(Default)]
pub(crate) struct Specials {
    paths: HashMap<WirePath, u64>,
    /// Each record, with its count of names.
    records: HashMap<u64, (Special, u32)>,
    next: u64,
}

impl Specials {
    pub fn get(&self, p: &WirePath) -> Option<&Special> {
        self.records.get(self.paths.get(p)?).map(|r| &r.0)
    }

    pub fn get_mut(&mut self, p: &WirePath) -> Option<&mut Special> {
        self.records.get_mut(self.paths.get(p)?).map(|r| &mut r.0)
    }

    /// How many names the special file at `p` has (0: none there).
    pub fn names(&self, p: &WirePath) -> u32 {
        self.paths
            .get(p)
            .and_then(|r| self.records.get(r))
            .map_or(0, |r| r.1)
    }

    pub fn insert(&mut self, p: WirePath, s: Special) {
        self.remove(&p);
        self.next += 1;
        self.records.insert(self.next, (s, 1));
        self.paths.insert(p, self.next);
    }

    /// Removes the name `p`; the file goes with its last name (until then, its change time
    /// is now).
    pub fn remove(&mut self, p: &WirePath) -> Option<Special> {
        let r = self.paths.remove(p)?;
        let rec = self.records.get_mut(&r)?;
        rec.1 -= 1;
        let s = rec.0.clone();
        match rec.1 {
            0 => {
                self.records.remove(&r);
            }
            _ => rec.0.ctime_ns = now_ns(),
        }
        Some(s)
    }

    /// Makes `to` another name of the special file at `from` (`false`: none there).
    pub fn link(&mut self, from: &WirePath, to: WirePath) -> bool {
        let Some(&r) = self.paths.get(from) else {
            return false;
        };
        self.remove(&to);
        if let Some(rec) = self.records.get_mut(&r) {
            rec.1 += 1;
        }
        self.paths.insert(to, r);
        true
    }

    /// Moves the name `from` to `to` (what `to` named loses that name).
    pub fn rename(&mut self, from: &WirePath, to: WirePath) {
        if let Some(r) = self.paths.remove(from) {
            self.remove(&to);
            self.paths.insert(to, r);
        }
    }

    /// Those directly in `dir`, by name.
    pub fn children(&self, dir: &WirePath) -> Vec<Vec<u8>> {
        self.paths
            .keys()
            .filter_map(|p| match p.split_last() {
                Some((d, name)) if &d == dir => Some(name.to_vec()),
                _ => None,
            })
            .collect()
    }

    /// Every path that is `dir` or below it.
    pub fn below(&self, dir: &WirePath) -> Vec<WirePath> {
        self.paths
            .keys()
            .filter(|p| is_below(p, dir))
            .cloned()
            .collect()
    }
}

/// Now, in nanoseconds since the epoch.
pub(crate) fn now_ns() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    d.as_nanos().min(i64::MAX as u128) as i64
}

impl Vfs {
    /// `mknod` of a FIFO, socket or device: made here only (see the module docs).
    pub fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        kind: SpecialKind,
        mode: u32,
        rdev: u32,
    ) -> Result<Stat, Errno> {
        let (_, path) = self.child(parent, name)?;
        if self.lock().specials.get(&path).is_some() {
            return Err(Errno::EEXIST);
        }
        match self.fresh_attr(&path) {
            Ok(_) => return Err(Errno::EEXIST),
            Err(Failure::Remote(ErrorCode::NotFound, _)) => {}
            Err(f) => return Err(errno_of(&f)),
        }
        let mut st = self.lock();
        if st.specials.get(&path).is_some() {
            return Err(Errno::EEXIST);
        }
        st.specials
            .insert(path.clone(), Special::new(kind, mode, rdev));
        changed_in(&mut st, &path);
        let ino = Self::ino_for(&mut st, &path, FileKind::File);
        let n = st.inodes.get_mut(&ino).expect("made");
        n.lookups += 1;
        n.unlinked = false;
        Ok(special_stat(&st, ino, &path).expect("made"))
    }

    /// A lookup of a special file here: its inode, with one more reference for the kernel.
    pub(super) fn lookup_special(&self, path: &WirePath) -> Option<Stat> {
        let mut st = self.lock();
        st.specials.get(path)?;
        let ino = Self::ino_for(&mut st, path, FileKind::File);
        st.inodes.get_mut(&ino).expect("made").lookups += 1;
        special_stat(&st, ino, path)
    }

    /// Whether `path` names a special file here (no reference taken, unlike
    /// [`lookup_special`](Self::lookup_special)).
    pub(super) fn is_special(&self, path: &WirePath) -> bool {
        self.lock().specials.get(path).is_some()
    }

    /// The attributes of `ino` if it is a special file here.
    pub(super) fn getattr_special(&self, ino: Ino) -> Option<Stat> {
        let st = self.lock();
        let n = st.inodes.get(&ino).filter(|n| !n.unlinked)?;
        special_stat(&st, ino, &n.path.clone())
    }

    /// What `ino` is, if a special file (for a listing's entry types).
    pub fn special_of(&self, ino: Ino) -> Option<SpecialKind> {
        let st = self.lock();
        let n = st.inodes.get(&ino).filter(|n| !n.unlinked)?;
        st.specials.get(&n.path).map(|s| s.kind)
    }

    /// `setattr` of a special file: permission bits and times change here; a size is
    /// `EINVAL`, as for a FIFO on a local file system. `None` if `ino` is not one.
    pub(super) fn setattr_special(
        &self,
        ino: Ino,
        mode: Option<u32>,
        size: Option<u64>,
        mtime_ns: Option<i64>,
    ) -> Option<Result<Stat, Errno>> {
        let mut st = self.lock();
        let path = st.inodes.get(&ino).filter(|n| !n.unlinked)?.path.clone();
        let s = st.specials.get_mut(&path)?;
        if size.is_some() {
            return Some(Err(Errno::EINVAL));
        }
        if let Some(m) = mode {
            s.mode = m & 0o7777;
        }
        if let Some(t) = mtime_ns {
            s.mtime_ns = t;
        }
        s.ctime_ns = now_ns();
        Some(Ok(special_stat(&st, ino, &path).expect("there")))
    }

    /// `unlink` or `rmdir` where special files are concerned: `None` to go on to the server.
    pub(super) fn remove_special(&self, path: &WirePath, rmdir: bool) -> Option<Result<(), Errno>> {
        let mut st = self.lock();
        if st.specials.get(path).is_some() {
            if rmdir {
                return Some(Err(Errno::ENOTDIR));
            }
            st.specials.remove(path);
            changed_in(&mut st, path);
            self.unlinked(&mut st, path);
            return Some(Ok(()));
        }
        // A directory whose only entries are special files is empty on the server, not here.
        if rmdir && st.specials.below(path).iter().any(|p| p != path) {
            return Some(Err(Errno::ENOTEMPTY));
        }
        None
    }

    /// `rename` where special files are concerned: a special file moves here (what the new
    /// name held on the server is removed there first); `None` to go on to the server (which
    /// [`Self::moved_specials`] follows).
    pub(super) fn rename_special(
        &self,
        from: &WirePath,
        to: &WirePath,
        noreplace: bool,
    ) -> Option<Result<(), Errno>> {
        let (from_s, to_s, to_full) = {
            let st = self.lock();
            (
                st.specials.get(from).is_some(),
                st.specials.get(to).is_some(),
                st.specials.below(to).iter().any(|p| p != to),
            )
        };
        if !from_s {
            let from_dir = self.lock().attrs.get(from).map(|l| l.value.kind) == Some(FileKind::Dir);
            return match () {
                _ if to_s && noreplace => Some(Err(Errno::EEXIST)),
                _ if to_s && from_dir => Some(Err(Errno::ENOTDIR)),
                _ if to_full => Some(Err(Errno::ENOTEMPTY)),
                _ => None,
            };
        }
        if to_s && noreplace {
            return Some(Err(Errno::EEXIST));
        }
        if !to_s {
            match self.fresh_attr(to) {
                Ok(_) if noreplace => return Some(Err(Errno::EEXIST)),
                Ok(a) if a.kind == FileKind::Dir => return Some(Err(Errno::EISDIR)),
                Ok(_) => {
                    let r = self.link.run(|c| {
                        c.call(Request::Unlink { path: to.clone() })
                            .map(drop)
                            .map_err(Into::into)
                    });
                    self.apply_invalidations();
                    if let Err(f) = r {
                        return Some(Err(errno_of(&f)));
                    }
                    if let Some((d, n)) = to.split_last() {
                        Self::relist(&mut self.lock(), &d, n, None);
                    }
                }
                Err(Failure::Remote(ErrorCode::NotFound, _)) => {}
                Err(f) => return Some(Err(errno_of(&f))),
            }
        }
        let mut st = self.lock();
        if Self::same_file(&st, from, to) {
            return Some(Ok(()));
        }
        self.unlinked(&mut st, to);
        st.specials.rename(from, to.clone());
        if let Some(m) = st.specials.get_mut(to) {
            m.ctime_ns = now_ns();
        }
        changed_in(&mut st, from);
        changed_in(&mut st, to);
        if let Some(i) = st.ino_of.remove(from) {
            if let Some(n) = st.inodes.get_mut(&i) {
                n.path = to.clone();
            }
            st.ino_of.insert(to.clone(), i);
        }
        Some(Ok(()))
    }

    /// `link` of a special file `ino` to `to`: a second name here. `None` if `ino` is not one.
    pub(super) fn link_special(&self, ino: Ino, to: &WirePath) -> Option<Result<Stat, Errno>> {
        let from = {
            let st = self.lock();
            let n = st.inodes.get(&ino).filter(|n| !n.unlinked)?;
            st.specials.get(&n.path)?;
            n.path.clone()
        };
        if self.lock().specials.get(to).is_some() {
            return Some(Err(Errno::EEXIST));
        }
        match self.fresh_attr(to) {
            Ok(_) => return Some(Err(Errno::EEXIST)),
            Err(Failure::Remote(ErrorCode::NotFound, _)) => {}
            Err(f) => return Some(Err(errno_of(&f))),
        }
        let mut st = self.lock();
        if !st.specials.link(&from, to.clone()) {
            return Some(Err(Errno::ENOENT));
        }
        if let Some(s) = st.specials.get_mut(to) {
            s.ctime_ns = now_ns();
        }
        changed_in(&mut st, to);
        st.ino_of.insert(to.clone(), ino);
        if let Some(n) = st.inodes.get_mut(&ino) {
            n.lookups += 1;
            n.linked = true;
        }
        Some(Ok(special_stat(&st, ino, to).expect("made")))
    }

    /// After the server renamed `from` to `to`: special files below `from` move too, and one
    /// at `to` was replaced.
    pub(super) fn moved_specials(st: &mut State, from: &WirePath, to: &WirePath) {
        st.specials.remove(to);
        for p in st.specials.below(from) {
            match rebase(&p, from, to) {
                Some(np) => st.specials.rename(&p, np),
                None => {
                    st.specials.remove(&p);
                }
            }
        }
    }
}

/// The kernel's view of special file `path` as inode `ino`.
fn special_stat(st: &State, ino: Ino, path: &WirePath) -> Option<Stat> {
    let s = st.specials.get(path)?;
    Some(Stat {
        ino,
        kind: FileKind::File,
        size: 0,
        mode: s.mode,
        mtime_ns: s.mtime_ns,
        atime_ns: s.atime_ns,
        ctime_ns: s.ctime_ns,
        blocks: 0,
        nlink: st.specials.names(path),
        special: Some((s.kind, s.rdev)),
    })
}

/// A special file at `path` was made, removed or moved: its directory's times are now.
fn changed_in(st: &mut State, path: &WirePath) {
    if let Some((dir, _)) = path.split_last() {
        st.dir_times.insert(dir, now_ns());
    }
}
