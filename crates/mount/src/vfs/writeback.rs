//! Write-back: close-to-open commits of changed copies, fsync and the server's Sync, statfs,
//! release.

use super::*;
use crate::queued::PutState;

/// A commit or fetch of a file of more than this may take long on a slow link: new files'
/// commits queued go ahead of it on their own (see `send_puts_first`). Those queued before a
/// smaller one go in its round trip (`make` fetches each source after committing the object
/// file before it).
pub(super) const LONG_TRANSFER: u64 = 1 << 20;

/// How a write-back is made.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Back {
    /// At a close: a small new file's commit may be queued.
    Close,
    /// Committed before it returns.
    Now,
    /// Committed and made durable on the server before it returns.
    Sync,
}

impl Vfs {
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

    /// fsync: the changes reach the server and are durable there. A commit takes the `Sync`
    /// along, in its round trip.
    pub fn fsync(&self, fh: u64) -> Result<(), Errno> {
        let (ino, _, write) = self.handle(fh)?;
        let began = Instant::now();
        if write && self.write_back_with(ino, Back::Sync)? {
            // With one session, every change made before this one went over it: all durable
            // now. (Others' are left to the directory's fsync, which reaches every session.)
            let mut st = self.lock();
            if st.unsynced.is_some_and(|t| t <= began) && self.link.sessions_open() == 1 {
                st.unsynced = None;
            }
            return Ok(());
        }
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
    pub(super) fn sync_server(&self) -> Result<(), Errno> {
        self.sync_sessions(true)
    }

    /// Like [`sync_server`](Self::sync_server); without `wait`, the sessions in use by other
    /// operations sync as they come back, unwaited for (upkeep must not wait behind a long
    /// fetch).
    pub(super) fn sync_sessions(&self, wait: bool) -> Result<(), Errno> {
        let Some(since) = self.lock().unsynced.take() else {
            return Ok(());
        };
        // Each session's server syncs the directories that session changed: every session
        // gets a Sync, those in use by other operations when they come back.
        if let Err(f) = self.link.sync_all(wait) {
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
            if !c.offers(ferry_proto::FEATURE_STATFS)? {
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
        let h = {
            let mut st = self.lock();
            let h = st.handles.remove(&fh).ok_or(Errno::EBADF)?;
            // No longer a writer before its last commit: a change of attributes made while
            // that commit is under way commits again itself (see `setattr`).
            if let Some(n) = st.inodes.get_mut(&h.ino).filter(|_| h.write) {
                n.writers = n.writers.saturating_sub(1);
            }
            h
        };
        // Writes through a shared mapping can arrive after the last flush.
        let r = if h.write {
            self.write_back(h.ino)
        } else {
            Ok(())
        };
        let mut st = self.lock();
        if let Some(n) = st.inodes.get_mut(&h.ino) {
            n.open = n.open.saturating_sub(1);
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
                Self::drop_inode(&mut st, h.ino);
            }
        }
        r
    }

    /// How a file is written back: also asking for the attributes of the directory holding
    /// `path` (which the commit changes), in the same round trip.
    pub(super) fn put_options(&self, path: &WirePath, sync_after: bool) -> PutOptions<'_> {
        PutOptions {
            chunker: self.opts.chunker.clone(),
            delete: false,
            dry_run: false,
            progress: None,
            cache: Some(&self.chunks),
            fewer_round_trips: true,
            stat_after: path.split_last().map(|(d, _)| d),
            sync_after,
        }
    }

    /// Commits `ino`'s copy if it holds local changes (a small new file's commit may be
    /// queued: see `puts`).
    pub(super) fn write_back(&self, ino: Ino) -> Result<(), Errno> {
        self.write_back_with(ino, Back::Close).map(drop)
    }

    /// Likewise, the server holding the changes when it returns (no commit left queued).
    pub(super) fn write_back_now(&self, ino: Ino) -> Result<(), Errno> {
        self.write_back_with(ino, Back::Now).map(drop)
    }

    /// Commits `ino`'s copy if it holds local changes, as `how` says; whether the commit was
    /// made durable on the server in its round trip (`false`: nothing to commit, or not asked).
    fn write_back_with(&self, ino: Ino, how: Back) -> Result<bool, Errno> {
        let covered = |v: &Vfs| {
            let n = v.lock().inodes.get(&ino).map(|n| (n.put, n.writes));
            n.is_some_and(|(put, writes)| put == Some(writes)) && v.link.queued.has_put(ino)
        };
        let (_w, path, writes, mode, again) = loop {
            // A close whose changes a queued commit carries has nothing to add.
            if how == Back::Close && covered(self) {
                return Ok(false);
            }
            // A commit of it on its way moves its version: waited for, and its answer applied.
            if self.link.queued.put_of(ino) == PutState::InFlight {
                self.settle_put(ino, false)?;
            }
            self.put_answer_taken(ino);
            let w = self.writing.lock().unwrap_or_else(|e| e.into_inner());
            if how == Back::Close && covered(self) {
                return Ok(false);
            }
            // One still queued carries older changes, or must go now: taken back (a close
            // queues the file again). One sent meanwhile: waited for, as above.
            let again = match self.link.queued.cancel_put(ino) {
                PutState::InFlight => continue,
                PutState::Queued => true,
                PutState::None => false,
            };
            let mut st = self.lock();
            let Some(n) = st.inodes.get_mut(&ino) else {
                return Ok(false);
            };
            if again {
                n.put = None;
            }
            if !n.dirty {
                return Ok(false);
            }
            n.labelled_dirty = None;
            if n.unlinked {
                // Removed or replaced while open: there is nothing left to write it to.
                n.dirty = false;
                return Ok(false);
            }
            let (path, writes, mode) = (n.path.clone(), n.writes, n.mode);
            let known = st.attrs.get(&path).map(|l| l.value.mode);
            break (w, path, writes, mode.or(known).unwrap_or(0o644), again);
        };
        if how == Back::Close && self.queue_put(ino, &path, writes, mode, again)? {
            return Ok(false);
        }
        let exclusive = self.lock().inodes.get(&ino).is_some_and(|n| n.exclusive);
        match self.commit(
            &path,
            mode,
            how == Back::Sync,
            exclusive,
            Some((ino, writes)),
        ) {
            Ok((a, synced)) => {
                let mut st = self.lock();
                let clean = st.inodes.get(&ino).is_some_and(|n| n.writes == writes);
                let writing = st.inodes.get(&ino).is_some_and(|n| n.writers > 0);
                // The commit labelled the record so already (nothing is written again), unless
                // the last writer closed or wrote while it was on its way.
                self.files
                    .set_meta(&path, Some(a.version), !clean || writing)?;
                if let Some(n) = st.inodes.get_mut(&ino) {
                    n.committed(a.version, clean);
                }
                if clean {
                    self.keep_ctime_shown(&mut st, ino, &path, &a);
                }
                Ok(synced)
            }
            Err(e) => {
                if e == Errno::EEXIST && exclusive {
                    // Someone else's file holds the name: this one is gone, as if replaced.
                    let mut st = self.lock();
                    self.unlinked(&mut st, &path);
                    if let Some(n) = st.inodes.get_mut(&ino) {
                        n.dirty = false;
                    }
                    if let Some((dir, name)) = path.split_last() {
                        Self::relist(&mut st, &dir, name, Some(FileKind::File));
                    }
                    return Err(e);
                }
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
    /// An `exclusive` create made here (no version yet) that finds the name taken is not
    /// committed: `EEXIST`. With `open`, an inode and its count of writes when its copy was
    /// taken: if it is written since or still open for writing, the record says dirty at the
    /// version committed instead (more was written, or will be: against what was committed),
    /// as a create labels its copy, so the next write syncs no record (made clean again if it
    /// is closed unwritten). One record written a commit, not two.
    pub(super) fn commit(
        &self,
        path: &WirePath,
        mode: u32,
        sync: bool,
        exclusive: bool,
        open: Option<(Ino, u64)>,
    ) -> Result<(Attr, bool), Errno> {
        // A change of its attributes or name made here and not yet answered moves its version
        // on the server: the commit is made against the version after it.
        self.settle_queued(path);
        let meta = self.files.meta(path).ok_or(Errno::EIO)?;
        let data = self.files.data(path);
        let Ok(size) = std::fs::metadata(&data).map(|m| m.len()) else {
            // A record whose copy is gone has nothing left to write back: it is dropped (once,
            // said so) instead of being tried again at every retry of the others.
            tracing::warn!(
                "{path:?}: the local copy of a changed file is gone; nothing to write back"
            );
            self.files.remove(path);
            return Err(Errno::ENOENT);
        };
        let mut base = meta.version;
        let opts = self.put_options(path, sync);
        let mut attempt = 0;
        let mut known = true;
        loop {
            attempt += 1;
            let asked = Instant::now();
            let mut stats = PutStats::default();
            // A version known to be empty (this client's create made it) is not asked for,
            // nor one whose recipe is known (this client committed it).
            let replacing = base.map(|version| ferry_fs::Replacing {
                version,
                empty: self
                    .lock()
                    .attrs
                    .get(path)
                    .is_some_and(|l| l.value.version == version && l.value.size == 0),
                recipe: known.then(|| self.recipes.get(path, version)).flatten(),
            });
            let with_recipe = replacing.as_ref().is_some_and(|r| r.recipe.is_some());
            if size > LONG_TRANSFER {
                self.send_puts_first();
            }
            let r = self
                .link
                .run(|c| ferry_fs::put_file(c, &data, path, replacing, mode, &opts, &mut stats));
            self.apply_invalidations();
            match r {
                Ok(a) => {
                    if let Some(r) = stats.last_recipe.take() {
                        self.recipes.put(path, a.version, r);
                    }
                    let dirty = open.is_some_and(|(ino, writes)| {
                        let st = self.lock();
                        let n = st.inodes.get(&ino);
                        n.is_some_and(|n| n.writes != writes || n.writers > 0)
                    });
                    self.files.set_meta(path, Some(a.version), dirty)?;
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
                    return Ok((a, stats.synced));
                }
                Err(Failure::Remote(code, m)) if with_recipe && code != ErrorCode::Conflict => {
                    // The base's recipe named is not the server's: asked for after all.
                    tracing::debug!(
                        "{path:?}: committed against a known recipe, refused ({m}); again, asking"
                    );
                    self.recipes.forget(path);
                    known = false;
                }
                Err(Failure::Remote(ErrorCode::Conflict, m)) if exclusive && base.is_none() => {
                    tracing::warn!(
                        "{path:?}: created here exclusively, but someone else made it meanwhile ({m}); theirs is kept, and this close fails (EEXIST)"
                    );
                    return Err(Errno::EEXIST);
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
                Err(Failure::Remote(ErrorCode::NotFound, m)) if base.is_none() && attempt < 4 => {
                    // A file made here whose directory the server lacks: one made here whose
                    // queued making was lost with the link or a crash, or one removed
                    // meanwhile by someone else. Made again, so the file is not left behind
                    // (the last close wins, as over someone else's file).
                    tracing::warn!(
                        "{path:?}: {m}; its directory is missing on the server: made again"
                    );
                    self.make_parents(path)?;
                }
                Err(f) => {
                    tracing::warn!("{path:?}: cannot write back: {f}");
                    return Err(errno_of(&f));
                }
            }
        }
    }

    /// Makes every directory above `path` that the server lacks (mode 0755; those there are
    /// left as they are), in one round trip.
    fn make_parents(&self, path: &WirePath) -> Result<(), Errno> {
        let mut dirs = vec![];
        let mut at = path.split_last().map(|(d, _)| d);
        while let Some(d) = at.filter(|d| !d.as_bytes().is_empty()) {
            at = d.split_last().map(|(up, _)| up);
            dirs.push(d);
        }
        dirs.reverse();
        let r = self.link.run(|c| {
            let made = dirs.iter().map(|d| Request::Mkdir {
                path: d.clone(),
                mode: 0o755,
            });
            for r in batch(c, made.collect())? {
                match r {
                    Ok(_)
                    | Err(ConnError::Remote {
                        code: ErrorCode::Exists,
                        ..
                    }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(())
        });
        self.apply_invalidations();
        r.map_err(|f| errno_of(&f))
    }
}
