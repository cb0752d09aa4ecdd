//! Changes of attributes: size, permission bits and modification time (truncate, chmod,
//! utimes), made in a changed copy's commit, queued, or made at once.

use super::*;

impl Vfs {
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
            let (dirty, labelled) = self.lock().inodes.get(&ino).map_or((false, false), |n| {
                (n.dirty, n.labelled_dirty.is_some() && n.writers > 0)
            });
            if labelled {
                // Just created and open for writing (rsync's `fchmod` of its temporary file):
                // its record says dirty already, so the change can go with the commit too.
                self.ensure_dirty(ino)?;
            }
            if dirty || labelled {
                // Goes with the commit of the changed copy. Counted as a write, so a commit
                // under way (a release's, on another thread) leaves the copy dirty: it read
                // the mode and time before this change.
                let data = self.files.data(&path);
                let (closed, writes) = {
                    let mut st = self.lock();
                    let n = st.inodes.get_mut(&ino).expect("open");
                    n.writes += 1;
                    if let Some(m) = mode {
                        n.mode = Some(m & 0o7777);
                    }
                    (n.writers == 0, n.writes)
                };
                if let Some(t) = mtime_ns {
                    File::options()
                        .write(true)
                        .open(&data)?
                        .set_modified(time_of(t))?;
                } else {
                    // The copy's change time is the file's until its commit (see `stat`):
                    // moved as a chmod moves it (the copy's own bits stay private).
                    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o600))?;
                }
                if closed && !self.restamp_queued(ino, mode, mtime_ns, writes) {
                    // No close is coming to commit it.
                    self.write_back(ino)?;
                }
            } else if self.setattr_later(&path, kind, mode, mtime_ns) {
                // Queued: goes with the next operation's round trip.
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
                self.follow_own_change(&path, before, &after, false)?;
                if mtime_ns.is_some() {
                    // The time set is the directory's, whatever changed in it here before.
                    self.lock().dir_times.remove(&path);
                }
            }
        }
        // As made here (a change queued is not waited for).
        self.stat(ino, None, false)
    }

    /// A closed new file whose commit is queued, unsent, takes a change of its mode or time in
    /// that commit (its content is as queued): `rsync -a` chmods and sets the times of each
    /// temporary file after its close, and each once cut and queued the whole file again.
    /// `writes` is the file's count with this change: the commit covers it.
    fn restamp_queued(
        &self,
        ino: Ino,
        mode: Option<u32>,
        mtime_ns: Option<i64>,
        writes: u64,
    ) -> bool {
        let mut st = self.lock();
        let Some(n) = st.inodes.get_mut(&ino) else {
            return false;
        };
        // Covered up to the change before this one: the content queued is the copy's.
        if n.writers > 0 || n.put != Some(writes - 1) {
            return false;
        }
        if !self
            .link
            .queued
            .restamp_put(ino, mode.map(|m| m & 0o7777), mtime_ns, writes)
        {
            return false;
        }
        n.put = Some(writes);
        true
    }

    /// Sets a file's permission bits and/or modification time here at once, and queues the
    /// change for the server (see `Link::queue_change`) when its attributes are leased (the
    /// server has the file as this mount does). `cp -a`, `rsync -a` and `tar x` then set each
    /// file's times in the round trip of the next file's commit, not one of their own. If the
    /// server refuses it after all, the refusal is logged and the file shows as the server has
    /// it. `false` when it must be made at once.
    ///
    /// A directory's likewise (`cp -a` and `tar x` set each one's times and mode once its
    /// files are in), as long as it stays writable by its owner and not sticky: the creations
    /// and removals queued in it after this change go on being ones the server will make.
    fn setattr_later(
        &self,
        path: &WirePath,
        kind: FileKind,
        mode: Option<u32>,
        mtime_ns: Option<i64>,
    ) -> bool {
        let stays_changeable = mode.is_none_or(|m| m & 0o200 != 0 && m & 0o1000 == 0);
        match kind {
            FileKind::File => {}
            FileKind::Dir if stays_changeable && self.changeable_later(path) => {}
            _ => return false,
        }
        if self.leased_attr(path).is_none() {
            return false;
        }
        let mode = mode.map(|m| m & 0o7777);
        let change = Change::SetAttr {
            path: path.clone(),
            mode,
            mtime_ns,
        };
        if !self.queue_change(change) {
            return false;
        }
        let mut st = self.lock();
        if mtime_ns.is_some() {
            // The time set is the directory's, whatever changed in it here before.
            st.dir_times.remove(path);
        }
        if let Some(l) = st.attrs.get_mut(path) {
            let a = &mut l.value;
            a.mode = mode.unwrap_or(a.mode);
            a.mtime_ns = mtime_ns.unwrap_or(a.mtime_ns);
            if let Some(x) = a.extra.as_mut() {
                // As the server will set it, about.
                x.ctime_ns = specials::now_ns();
            }
        }
        st.unsynced.get_or_insert_with(Instant::now);
        true
    }
}
