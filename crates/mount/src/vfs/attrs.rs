//! Attributes: cached under the server's leases, asked for when not, and the stat(2) the kernel
//! is told.

use super::*;

impl Vfs {
    /// Caches `a` as `path`'s attributes under its lease, counted from `asked` (when the
    /// request left, so the lease never outlives the server's grant).
    pub(super) fn store_attr(&self, st: &mut State, path: &WirePath, a: Attr, asked: Instant) {
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

    /// The attributes of `path` under a valid lease, if cached (never a file of several names:
    /// see `links`).
    pub(super) fn leased_attr(&self, path: &WirePath) -> Option<Attr> {
        let epoch = self.link.epoch();
        let st = self.lock();
        st.attrs
            .get(path)
            .filter(|l| l.valid(epoch) && !links::several_names(&l.value))
            .map(|l| l.value.clone())
    }

    /// Forgets `path` after the server said it does not exist.
    pub(super) fn gone(&self, path: &WirePath) {
        let mut st = self.lock();
        st.attrs.remove(path);
        st.listings.remove(path);
        st.changing.remove(path);
        if let Some((dir, name)) = path.split_last() {
            Self::set_listed(&mut st, &dir, name, None);
        }
    }

    /// Asks the server for `path`'s attributes (one round trip).
    pub(super) fn fresh_attr(&self, path: &WirePath) -> Result<Attr, Failure> {
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
    pub(super) fn attr(&self, path: &WirePath) -> Result<Attr, Errno> {
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

    pub(super) fn stat_of(st: &State, ino: Ino, a: &Attr) -> Stat {
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
            ctime_ns: Self::shown_ctime(n, extra.map_or(a.mtime_ns, |x| x.ctime_ns)).max(local),
            blocks: extra.map_or(a.size.div_ceil(512), |x| x.blocks),
            nlink,
            special: None,
        }
    }

    /// The change time shown for `n` when the server's is `ctime`: a version committed from
    /// here keeps the time its copy showed while it was written (the kernel, and programs that
    /// compare change times, such as git's index, saw that one; the server's rename came a
    /// moment later). Any later change on the server moves its time, and shows it.
    fn shown_ctime(n: Option<&Inode>, ctime: i64) -> i64 {
        match n.and_then(|n| n.ctime_shown) {
            Some((server, shown)) if server == ctime => shown,
            _ => ctime,
        }
    }

    /// After a commit from the copy of `ino` at `path` whose answer is `a`, the copy clean:
    /// keeps the copy's change time as the one shown for the version (see `shown_ctime`).
    pub(super) fn keep_ctime_shown(&self, st: &mut State, ino: Ino, path: &WirePath, a: &Attr) {
        use std::os::unix::fs::MetadataExt;
        let (Some(x), Ok(m)) = (a.extra, std::fs::metadata(self.files.data(path))) else {
            return;
        };
        if let Some(n) = st.inodes.get_mut(&ino) {
            n.ctime_shown = Some((x.ctime_ns, m.ctime() * 1_000_000_000 + m.ctime_nsec()));
        }
    }

    /// The attributes of an inode as the kernel should see them.
    pub fn getattr(&self, ino: Ino) -> Result<Stat, Errno> {
        self.getattr_open(ino, None)
    }

    /// Likewise, asked through the open file `fh` if given: a copy being written (or changed
    /// and not yet written back, or removed while open) has the local copy's size and time.
    pub fn getattr_open(&self, ino: Ino, fh: Option<u64>) -> Result<Stat, Errno> {
        self.stat(ino, fh, true)
    }

    /// The attributes of `ino`; with `settle`, a change queued for it is sent first (see
    /// [`settle_queued`](Self::settle_queued)), else it shows as made here.
    pub(super) fn stat(&self, ino: Ino, fh: Option<u64>, settle: bool) -> Result<Stat, Errno> {
        if let Some(s) = self.getattr_special(ino) {
            return Ok(s);
        }
        // (A new file whose commit is queued is a copy being written back: shown as it is
        // here, with no wait. Refused, its name someone else's, it is gone here once the
        // answer comes, as the copy is.)
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
        if settle {
            // What a change queued here makes of it is the server's to say (its change time).
            self.settle_queued(&path);
        }
        let a = self.attr(&path)?;
        Ok(Self::stat_of(&self.lock(), ino, &a))
    }

    /// Sends the changes queued here (see `crate::queued`) and takes the answers, if one
    /// moves the version of `path`: one round trip then, none otherwise.
    pub(super) fn settle_queued(&self, path: &WirePath) {
        if self.link.queued.touches(path) {
            self.send_queued();
        }
    }

    /// Before an operation that may take long (a fetch or commit of over 1 MiB): new files'
    /// commits queued go first, on their own, so their answers are applied here at once, not
    /// when that operation ends (a rename, fsync or removal of one of them waits for its
    /// answer).
    pub(super) fn send_puts_first(&self) {
        if self.link.queued.holds_puts() {
            self.send_queued();
        }
    }

    /// Sends the changes queued here and takes the answers.
    pub(super) fn send_queued(&self) {
        if let Err(f) = self.link.run(|_| Ok(())) {
            tracing::debug!("sending the changes queued: {f}");
        }
        self.apply_invalidations();
    }

    /// The attributes of a file whose local copy is newer than the server's version (being
    /// written, changed and not yet written back, or removed while open); `None` for others.
    pub(super) fn local_stat(&self, ino: Ino, fh: Option<u64>) -> Result<Option<Stat>, Errno> {
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
            let known = st.attrs.get(&n.path).map(|l| &l.value);
            // A file of several names shows them all (and so is kept no time by the kernel).
            let names = known.and_then(|a| a.extra).map_or(1, |x| x.nlink.max(1));
            (
                n.path.clone(),
                file,
                n.mode.or(known.map(|a| a.mode)).unwrap_or(0o644),
                if n.unlinked { 0 } else { names },
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
}
