//! Changes of names on the server: mkdir, symlink, removal, rename,
//! each with the new attributes in its round trip.

use super::*;
use crate::queued::PutState;

impl Vfs {
    /// Sends `r` and asks for the attributes of `paths` in the same round trip (what the change
    /// made of them): each, or the error the server answered.
    pub(super) fn change_then_stat(
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
    pub(super) fn store_dir(
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
    pub(super) fn change_and_stat(&self, r: Request, path: &WirePath) -> Result<Attr, Errno> {
        let asked = Instant::now();
        let parent = path.split_last();
        let mut paths = vec![path];
        paths.extend(parent.as_ref().map(|(d, _)| d));
        let mut got = self
            .change_then_stat(r, &paths)
            .map_err(|f| errno_of(&f))?
            .into_iter();
        let a = got.next().expect("asked").map_err(errno_of_reply)?;
        let mut st = self.lock();
        self.store_attr(&mut st, path, a.clone(), asked);
        if let Some((dir, name)) = parent {
            Self::relist(&mut st, &dir, name, Some(a.kind));
            self.store_dir(&mut st, &dir, got.next(), asked);
        }
        Ok(a)
    }

    pub(super) fn entry(&self, path: &WirePath, a: &Attr) -> Stat {
        let mut st = self.lock();
        let ino = Self::ino_for(&mut st, path, a.kind);
        let n = st.inodes.get_mut(&ino).expect("made");
        n.lookups += 1;
        n.unlinked = false;
        Self::stat_of(&st, ino, a)
    }

    /// Makes a directory, and leases its listing (empty) in the same round trip: the files
    /// made in it next (`tar x`, `git clone`, `cp -r`) are looked up and created there without
    /// asking.
    pub fn mkdir(&self, parent: Ino, name: &[u8], mode: u32) -> Result<Stat, Errno> {
        let (dir, path) = self.child(parent, name)?;
        if let Some(s) = self.mkdir_later(&dir, &path, name, mode & 0o7777) {
            return Ok(s);
        }
        let asked = Instant::now();
        let r = self.link.run(|c| {
            let mut rs = vec![Request::Mkdir {
                path: path.clone(),
                mode: mode & 0o7777,
            }];
            rs.extend(names::listing_requests(&path));
            rs.push(Request::GetAttr { path: dir.clone() });
            let mut out = batch(c, rs)?.into_iter();
            out.next().expect("asked")?;
            let listing = names::listing_of(&mut out);
            Ok((listing, out.next().expect("asked")))
        });
        self.apply_invalidations();
        let (listing, dir_attr) = r.map_err(|f| errno_of(&f))?;
        // (An error: removed again by someone else already.)
        let (entries, a) = listing.map_err(errno_of_reply)?;
        if entries.is_empty() {
            self.lock().empty_dir = a.extra.map(|x| (a.size, x.blocks));
        }
        self.store_listing(&path, entries, a.clone(), asked);
        let mut st = self.lock();
        Self::relist(&mut st, &dir, name, Some(FileKind::Dir));
        self.store_dir(&mut st, &dir, Some(dir_attr.and_then(attr_of)), asked);
        drop(st);
        Ok(self.entry(&path, &a))
    }

    /// Makes the directory `path` (`name` in `dir`) here at once and queues its making on the
    /// server (see `Link::queue_change`) when the leases say the server will make it: the
    /// leased listing of `dir` lacks the name, and `dir` is writable by its owner, not sticky
    /// and not setgid (whose new directories inherit its group and the bit). Its listing
    /// (empty) and attributes are leased here no longer than `dir`'s listing; the server's
    /// attributes come with the answer, and its leases run from then (asked for in the same
    /// round trip). Its size and blocks are those of the first directory made at once (an
    /// empty directory's, on the server's file system); its times are about the server's (a
    /// few milliseconds early) until the answer. A synchronous mkdir waits for the server to
    /// make everything queued before it: 5 ms a directory in `cp -a` of the headers, and
    /// 167 ms of a `git clone`'s 0.77 s for its 105 directories, and a round trip each over a
    /// long link. `None`: it must be made at once.
    fn mkdir_later(&self, dir: &WirePath, path: &WirePath, name: &[u8], mode: u32) -> Option<Stat> {
        let (size, blocks) = self.lock().empty_dir?;
        if self.listed(dir, name) != Some(None)
            || !self.changeable_later(dir)
            || self.leased_attr(dir).is_none_or(|a| a.mode & 0o2000 != 0)
            || self.lock().ino_of.contains_key(path)
            || self.is_special(path)
        {
            return None;
        }
        let now = specials::now_ns();
        let a = Attr {
            kind: FileKind::Dir,
            mode,
            size,
            mtime_ns: now,
            version: 0,
            oid: None,
            lease_ms: 0,
            extra: Some(ferry_proto::StatExtra {
                atime_ns: now,
                ctime_ns: now,
                blocks,
                nlink: 2,
                id: None,
            }),
        };
        {
            // In place before the change is queued: its answer, taken as soon as it comes,
            // finds the attributes to replace. Leased as the parent's listing is, and no longer.
            let mut st = self.lock();
            let (until, epoch) = st.listings.get(dir).map(|l| (l.until, l.epoch))?;
            let attr = Leased {
                value: a.clone(),
                until,
                epoch,
            };
            let listing = Leased {
                value: vec![],
                until,
                epoch,
            };
            st.attrs.insert(path.clone(), attr);
            st.listings.insert(path.clone(), listing);
            st.changing.remove(path);
        }
        if !self.queue_change(Change::Mkdir {
            path: path.clone(),
            mode,
        }) {
            let mut st = self.lock();
            st.attrs.remove(path);
            st.listings.remove(path);
            return None;
        }
        let mut st = self.lock();
        Self::edit_listing(&mut st, dir, name, Some(FileKind::Dir));
        // The parent's times as the server will set them, about.
        st.dir_times.insert(dir.clone(), now);
        st.unsynced.get_or_insert_with(Instant::now);
        drop(st);
        Some(self.entry(path, &a))
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
    pub(super) fn drop_below(st: &mut State, path: &WirePath) {
        remove_below(&mut st.attrs, path);
        remove_below(&mut st.listings, path);
        remove_below(&mut st.links, path);
        remove_below_in_set(&mut st.changing, path);
    }

    pub(super) fn unlinked(&self, st: &mut State, path: &WirePath) {
        let gone: Vec<(WirePath, Ino)> = entries_below(&st.ino_of, path)
            .map(|(p, &i)| (p.clone(), i))
            .collect();
        // The copy of `path` itself goes below when it has an inode (once: each removal is
        // file operations under the state's lock).
        let had_inode = gone.iter().any(|(p, _)| p == path);
        for (p, i) in gone {
            st.ino_of.remove(&p);
            // A file with another name here lives on under it, with its copy (which may hold
            // writes not yet committed).
            let other = Self::other_name(st, i, path);
            match (st.inodes.get_mut(&i), other) {
                (Some(n), Some(o)) if n.path == p => {
                    if let Err(e) = self.files.rename(&p, &o) {
                        tracing::debug!("moving the cached copy of {p:?}: {e}");
                    }
                    n.path = o;
                }
                (Some(_), Some(_)) => self.files.remove(&p),
                (Some(n), None) => {
                    n.unlinked = true;
                    self.files.remove(&p);
                }
                (None, _) => self.files.remove(&p),
            }
        }
        if !had_inode {
            self.files.remove(path);
        }
        Self::drop_below(st, path);
    }

    pub(super) fn remove(&self, parent: Ino, name: &[u8], dir: bool) -> Result<(), Errno> {
        let (parent_path, path) = self.child(parent, name)?;
        if let Some(r) = self.remove_special(&path, dir) {
            return r;
        }
        if dir && self.pending_below(&path) {
            // Empty on the server, not here: its files made here are not there yet.
            return Err(Errno::ENOTEMPTY);
        }
        while let (false, Some(ino)) = (dir, self.pending_at(&path)) {
            // A commit of it queued is taken back (it never reaches the server), one on its
            // way waited for. Refused, someone else's file holding the name: this one is gone
            // already.
            if self.settle_put(ino, true) == Err(Errno::EEXIST) {
                return Ok(());
            }
            // Never on the server: removed here only (an open descriptor keeps its copy). A
            // commit queued meanwhile (a close on another descriptor) is taken back, and one
            // sent meanwhile waited for: the writer's lock keeps new ones out.
            let _w = self.writing.lock().unwrap_or_else(|e| e.into_inner());
            if self.link.queued.cancel_put(ino) == PutState::InFlight {
                continue;
            }
            self.put_answer_taken(ino);
            if self.pending_at(&path) == Some(ino) {
                let mut st = self.lock();
                if let Some(n) = st.inodes.get_mut(&ino) {
                    n.put = None;
                }
                self.unlinked(&mut st, &path);
                Self::edit_listing(&mut st, &parent_path, name, None);
                return Ok(());
            }
            break;
        }
        if !dir && self.remove_later(&parent_path, &path, name) {
            return Ok(());
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

    /// Whether the server will surely let this mount change names in `dir`, as far as its
    /// lease shows: writable by its owner (the mount's user) and not sticky.
    pub(super) fn changeable_later(&self, dir: &WirePath) -> bool {
        self.leased_attr(dir)
            .is_some_and(|a| a.mode & 0o200 != 0 && a.mode & 0o1000 == 0)
    }

    /// Queues a change acknowledged before the server makes it (see `Link::queue_change`);
    /// `false` when it must be made at once (as every one is with `strict_close`).
    pub(super) fn queue_change(&self, change: Change) -> bool {
        !self.opts.strict_close && self.link.queue_change(change)
    }

    /// Removes the file `path` (`name` in `dir`) here and queues its removal on the server
    /// (see `Link::queue_change`) when the leases say the server will make it: the leased
    /// listing names it, not as a directory, and the leased directory is writable by its owner
    /// and not sticky. `rm -rf` then costs a round trip a directory, not one a file. `false`
    /// when it must be removed at once.
    fn remove_later(&self, dir: &WirePath, path: &WirePath, name: &[u8]) -> bool {
        let kind = self.listed(dir, name).flatten();
        if !self.changeable_later(dir)
            || kind.is_none_or(|k| k == FileKind::Dir)
            || !self.queue_change(Change::Unlink(path.clone()))
        {
            return false;
        }
        let mut st = self.lock();
        self.unlinked(&mut st, path);
        Self::edit_listing(&mut st, dir, name, None);
        // The directory's times as the server will set them, about.
        st.dir_times.insert(dir.clone(), specials::now_ns());
        st.unsynced.get_or_insert_with(Instant::now);
        true
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
        if Self::same_file(&self.lock(), &from, &to) || self.same_file_there(&from, &to) {
            return Ok(());
        }
        let onto_dir = self
            .lock()
            .attrs
            .get(&to)
            .is_some_and(|l| l.value.kind == FileKind::Dir);
        if onto_dir && self.pending_below(&to) {
            // A directory empty on the server, not here (see `remove`).
            return Err(Errno::ENOTEMPTY);
        }
        if noreplace && self.listed(&to_dir, new_name).is_some_and(|k| k.is_some()) {
            // The leased listing names it (GNU mv asks so first, then renames over it).
            return Err(Errno::EEXIST);
        }
        if self.rename_queued_new((&from_dir, &from, name), (&to_dir, &to, new_name)) {
            return Ok(());
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
            entries_below(&st.ino_of, &from)
                .map(|(_, &i)| i)
                .filter(|i| st.inodes.get(i).is_some_and(|n| n.dirty))
                .collect()
        };
        let from_ino = self.lock().ino_of.get(&from).copied();
        if self.lock().inodes.values().any(|n| n.put.is_some()) {
            // New files' commits queued go first, together (one round trip, not one a file).
            self.send_queued();
        }
        for i in moving {
            match self.write_back_now(i) {
                // A new file whose exclusive commit found the name someone else's: gone, and
                // theirs moves with its directory (`from` itself is checked below).
                Err(Errno::EEXIST) => {}
                r => r?,
            }
        }
        if from_ino.is_some_and(|i| self.lock().inodes.get(&i).is_none_or(|n| n.unlinked)) {
            // A new file whose commit found someone else's file holding its name: gone.
            return Err(Errno::ENOENT);
        }
        let kind = self.lock().attrs.get(&from).map(|l| l.value.kind);
        if !noreplace && self.rename_later(&from_dir, &from, name, &to_dir, &to, new_name) {
            return Ok(());
        }
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
        self.renamed(&mut st, &from, &to);
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

    /// What a rename of `from` to `to` (made, or queued) changes here: what was at `to` is
    /// gone; the inodes and cached copies below `from` move with it; what was known of both
    /// names is dropped.
    fn renamed(&self, st: &mut State, from: &WirePath, to: &WirePath) {
        if st.ino_of.get(to) != st.ino_of.get(from) {
            self.unlinked(st, to);
        }
        // Inodes below the old name move with it, and so do their copies (whose versions
        // are checked on the next open, the rename having changed them on the server).
        let moved: Vec<(WirePath, Ino)> = entries_below(&st.ino_of, from)
            .map(|(p, &i)| (p.clone(), i))
            .collect();
        for (p, _) in &moved {
            st.ino_of.remove(p);
        }
        let copy_moved = moved.iter().any(|(p, _)| p == from);
        for (p, i) in moved {
            let Some(np) = rebase(&p, from, to) else {
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
            // (An inode of several names keeps its own name when another of them moves.)
            if let Some(n) = st.inodes.get_mut(&i).filter(|n| n.path == p) {
                n.path = np.clone();
            }
            st.ino_of.insert(np, i);
        }
        if !copy_moved {
            if let Err(e) = self.files.rename(from, to) {
                tracing::debug!("moving the cached copy of {from:?}: {e}");
            }
        }
        Self::moved_specials(st, from, to);
        Self::drop_below(st, from);
        Self::drop_below(st, to);
    }

    /// Renames the file `from` (`name` in `from_dir`) to `to` (`new_name` in `to_dir`) here at
    /// once and queues the rename for the server (see `Link::queue_change`) when the leases
    /// say the server will make it: both leased listings hold the names as this mount does
    /// (`from` a file or symlink; `to` absent, or a file or symlink), and both leased
    /// directories are writable by their owner and not sticky. An editor's save by rename, or
    /// rsync's of each temporary file, then costs no round trip of its own; the server's
    /// attributes of the file come back with it. `false` when it must be made at once.
    fn rename_later(
        &self,
        from_dir: &WirePath,
        from: &WirePath,
        name: &[u8],
        to_dir: &WirePath,
        to: &WirePath,
        new_name: &[u8],
    ) -> bool {
        let file = |k: Option<FileKind>| k.is_some_and(|k| k != FileKind::Dir);
        let from_kind = self.listed(from_dir, name).flatten();
        let to_listed = self.listed(to_dir, new_name);
        let before = self.leased_attr(from);
        let (Some(before), Some(to_kind)) = (before, to_listed) else {
            return false;
        };
        if !file(from_kind)
            || to_kind.is_some_and(|k| k == FileKind::Dir)
            || self.pending_at(from).is_some()
            || !self.changeable_later(from_dir)
            || !self.changeable_later(to_dir)
        {
            return false;
        }
        let change = Change::Rename {
            from: from.clone(),
            to: to.clone(),
        };
        if !self.queue_change(change) {
            return false;
        }
        let _g = self.copies.lock(&[from, to]);
        let mut st = self.lock();
        let lease = st.attrs.get(from).map(|l| (l.until, l.epoch));
        self.renamed(&mut st, from, to);
        if let Some((until, epoch)) = lease {
            // As the server will have them, about (its attributes come back with the answer).
            let value = before;
            st.attrs.insert(
                to.clone(),
                Leased {
                    value,
                    until,
                    epoch,
                },
            );
        }
        Self::edit_listing(&mut st, from_dir, name, None);
        Self::edit_listing(&mut st, to_dir, new_name, from_kind);
        let now = specials::now_ns();
        st.dir_times.insert(from_dir.clone(), now);
        st.dir_times.insert(to_dir.clone(), now);
        st.unsynced.get_or_insert_with(Instant::now);
        true
    }

    /// Renames a new file whose commit is still queued (a script's `> f.tmp && mv f.tmp f`)
    /// here at once, its commit then made under the new name, replacing what the leases say
    /// is there (see `Queue::retarget_put`): one round trip for both, and none of its own,
    /// where the rename otherwise waits for the commit's answer. Only where a rename could be
    /// queued (`rename_later`): both leased listings hold the names as this mount does, `to`
    /// absent or a file of one name and at most 1 MiB whose attributes are leased (its
    /// version is what the commit replaces: the server reads its recipe), with no change of
    /// it queued. If `to` changed on the server meanwhile, or was made there by someone else
    /// (even for a `RENAME_NOREPLACE`, which the leased listing said was free), the file is
    /// written again over theirs: the last rename wins, as the last close does. Not a file
    /// made with `O_EXCL` (a lock file, rsync's and mkstemp's temporaries): that its name was
    /// free on the server is known only from its commit's answer, and a rename of it waits
    /// for that. Nor one whose commit already replaces another file (renamed twice). `false`:
    /// it must be made otherwise.
    fn rename_queued_new(
        &self,
        (from_dir, from, name): (&WirePath, &WirePath, &[u8]),
        (to_dir, to, new_name): (&WirePath, &WirePath, &[u8]),
    ) -> bool {
        let Some(ino) = self.pending_at(from) else {
            return false;
        };
        let closed = self
            .lock()
            .inodes
            .get(&ino)
            .is_some_and(|n| n.put.is_some() && n.writers == 0 && !n.linked && !n.exclusive);
        let replaces = match self.listed(to_dir, new_name) {
            Some(None) => None,
            Some(Some(FileKind::File)) => match self.leased_attr(to) {
                Some(a) if a.kind == FileKind::File && a.size <= writeback::LONG_TRANSFER => {
                    Some(a.version)
                }
                _ => return false,
            },
            _ => return false,
        };
        if !closed
            || self.listed(from_dir, name) != Some(Some(FileKind::File))
            || self.pending_at(to).is_some()
            || self.is_special(to)
            || self.link.queued.touches(to)
            || !self.changeable_later(from_dir)
            || !self.changeable_later(to_dir)
        {
            return false;
        }
        let _g = self.copies.lock(&[from, to]);
        // Under the state's lock, so the commit's answer, whenever it comes, finds the file
        // under its new name.
        let mut st = self.lock();
        if !self.link.queued.retarget_put(ino, to, replaces) {
            return false;
        }
        self.renamed(&mut st, from, to);
        st.attrs.remove(from);
        st.attrs.remove(to);
        Self::edit_listing(&mut st, from_dir, name, None);
        Self::edit_listing(&mut st, to_dir, new_name, Some(FileKind::File));
        let now = specials::now_ns();
        st.dir_times.insert(from_dir.clone(), now);
        st.dir_times.insert(to_dir.clone(), now);
        st.unsynced.get_or_insert_with(Instant::now);
        true
    }
}
