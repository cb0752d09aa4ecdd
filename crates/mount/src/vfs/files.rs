//! Files: cached copies brought up to date on open, creates, reads and writes.

use super::*;

impl Vfs {
    pub(super) fn sources(&self) -> Sources<'_> {
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
    pub(super) fn open_copy(
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
    pub(super) fn refresh_copy(&self, path: &WirePath, have: Option<u64>) -> Result<u64, Errno> {
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
        if attr.size > writeback::LONG_TRANSFER {
            self.send_puts_first();
        }
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

    pub(super) fn offline_copy(
        &self,
        path: &WirePath,
        have: Option<u64>,
        why: &str,
    ) -> Result<u64, Errno> {
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
    pub(super) fn mark_dirty(
        &self,
        ino: Ino,
        path: &WirePath,
        version: Option<u64>,
    ) -> Result<(), Errno> {
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

    pub(super) fn new_handle(
        &self,
        ino: Ino,
        file: File,
        write: bool,
        version: Option<u64>,
    ) -> Opened {
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
        let opts = self.put_options(&path, false);
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
            let (ino, n) = Self::created(&mut st, &path);
            n.labelled_dirty = Some(a.version);
            ino
        };
        let opened = self.new_handle(ino, file, true, Some(a.version));
        Ok((Self::stat_of(&self.lock(), ino, &a), opened))
    }

    /// Creates and opens a file for `open(O_CREAT)` without `O_EXCL` (a shell's `>` and `>>`,
    /// a compiler's output, SQLite's journal). Where this client's leased listing says the
    /// name is absent, the file is made here only and created on the server by its first
    /// commit (on close or fsync, as close-to-open asks): one round trip for the file, not two.
    /// Had someone made the name meanwhile, unseen yet, the commit replaces it (last close
    /// wins; a truncating open would have too). Elsewhere, as [`create`](Self::create).
    pub fn create_later(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
    ) -> Result<(Stat, Opened), Errno> {
        self.make_here(parent, name, mode, false)
    }

    /// Creates and opens a file for `open(O_CREAT|O_EXCL)` (lock files, `cp`, `tar x`, `git`'s
    /// checkout): as [`create_later`](Self::create_later) where the leased listing says the
    /// name is absent, except that had someone made the name meanwhile, unseen yet (the
    /// server tells such a change within a round trip), the commit leaves their file and the
    /// close fails with `EEXIST`. Elsewhere, as [`create`](Self::create) exclusively.
    pub fn create_excl(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
    ) -> Result<(Stat, Opened), Errno> {
        self.make_here(parent, name, mode, true)
    }

    fn make_here(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        excl: bool,
    ) -> Result<(Stat, Opened), Errno> {
        let (dir, path) = self.child(parent, name)?;
        let listed = self.listed(&dir, name);
        if excl && matches!(listed, Some(Some(_))) {
            return Err(Errno::EEXIST);
        }
        let known = self.lock().ino_of.contains_key(&path);
        if known || listed != Some(None) || self.is_special(&path) {
            return self.create(parent, name, mode, excl);
        }
        let data = self.files.data(&path);
        let _g = self.copies.lock(&[&path]);
        self.files.remove(&path);
        // (Opened as it is made: one open a new file, not two.)
        let file = new_copy(&data)?;
        self.files.set_meta(&path, None, true)?;
        let ino = {
            let mut st = self.lock();
            // The server's directory is as it was: only the listing here changes.
            Self::edit_listing(&mut st, &dir, name, Some(FileKind::File));
            let (ino, n) = Self::created(&mut st, &path);
            n.dirty = true;
            n.pending = true;
            n.exclusive = excl;
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

    /// Whether a file created here and not yet on the server lies below the directory `dir`.
    pub(super) fn pending_below(&self, dir: &WirePath) -> bool {
        let st = self.lock();
        st.inodes
            .values()
            .any(|n| n.pending && !n.unlinked && n.path != *dir && is_below(&n.path, dir))
    }

    /// The inode at `path` if it was created here and is not yet on the server.
    pub(super) fn pending_at(&self, path: &WirePath) -> Option<Ino> {
        let st = self.lock();
        let ino = *st.ino_of.get(path)?;
        st.inodes.get(&ino).filter(|n| n.pending).map(|_| ino)
    }

    /// O_CREAT on a name that exists: open it (O_EXCL: refuse).
    pub(super) fn create_existing(
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

    pub(super) fn handle(&self, fh: u64) -> Result<(Ino, Arc<File>, bool), Errno> {
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
    /// For a change `queued` here (of mode, times or name: see `crate::queued`), whose
    /// attributes were asked for right behind it, the same size and modification time are
    /// taken as the same content when the server does not name the object.
    pub(super) fn follow_own_change(
        &self,
        path: &WirePath,
        before: Option<Attr>,
        after: &Attr,
        queued: bool,
    ) -> Result<(), Errno> {
        let Some(b) = before else {
            return Ok(());
        };
        let same = match (b.oid, after.oid) {
            (Some(x), Some(y)) => x == y,
            // A change of attributes or name this mount queued (its answer right behind it):
            // the same size and time say no one wrote the file meanwhile.
            _ => queued && (b.kind, b.size, b.mtime_ns) == (after.kind, after.size, after.mtime_ns),
        };
        if !same || b.version == after.version {
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
    pub(super) fn ensure_dirty(&self, ino: Ino) -> Result<(), Errno> {
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
}
