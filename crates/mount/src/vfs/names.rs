//! Names: lookups, listings and the inodes the kernel holds.

use super::*;

impl Vfs {
    pub(super) fn ino_for(st: &mut State, path: &WirePath, kind: FileKind) -> Ino {
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
        self.settle_queued(&path);
        let a = match self.leased_attr(&path) {
            Some(a) => a,
            None => match self.listed(&dir, name) {
                Some(None) => return Err(Errno::ENOENT),
                Some(Some(_)) => self.attr(&path)?,
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

    /// What a valid listing of `dir` says of `name`: its kind, or `Some(None)` if it lacks it;
    /// `None` without one.
    pub(super) fn listed(&self, dir: &WirePath, name: &[u8]) -> Option<Option<FileKind>> {
        let epoch = self.link.epoch();
        let st = self.lock();
        st.listings.get(dir).filter(|l| l.valid(epoch)).map(|l| {
            let i = l.value.binary_search_by(|e| e.0.as_slice().cmp(name));
            i.ok().map(|i| l.value[i].1)
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
            Self::drop_inode(&mut st, ino);
        }
    }

    /// Reads `dir`'s listing from the server (one round trip), caching the entries' attributes;
    /// returns the entries, sorted by name.
    pub(super) fn list(&self, dir: &WirePath) -> Result<Vec<(Vec<u8>, Attr)>, Failure> {
        tracing::trace!("{dir:?}: ReadDir");
        let asked = Instant::now();
        let r = self.link.run(|c| {
            let mut rs = batch(c, listing_requests(dir))?.into_iter();
            Ok(listing_of(&mut rs)?)
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
        Ok(self.store_listing(dir, entries, dir_attr, asked))
    }

    /// Caches the listing of `dir` the server gave (asked for at `asked`) and its entries'
    /// attributes; returns the entries, sorted by name.
    pub(super) fn store_listing(
        &self,
        dir: &WirePath,
        entries: Vec<DirEntry>,
        dir_attr: Attr,
        asked: Instant,
    ) -> Vec<(Vec<u8>, Attr)> {
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
        entries
    }

    /// Makes sure the attributes of every entry of directory `ino` are leased here, with one
    /// listing if some are not (a lease of one broken, or expired): each entry can then be
    /// looked up without a round trip of its own (the FUSE layer's `readdirplus` does).
    pub fn lease_entries(&self, ino: Ino) -> Result<(), Errno> {
        let (dir, _) = self.path_of(ino)?;
        let epoch = self.link.epoch();
        let stale = {
            let st = self.lock();
            let pending = |p: &WirePath| {
                st.ino_of
                    .get(p)
                    .and_then(|i| st.inodes.get(i))
                    .is_some_and(|n| n.pending)
            };
            match st.listings.get(&dir).filter(|l| l.valid(epoch)) {
                None => true,
                Some(l) => l.value.iter().any(|(name, _)| {
                    dir.join(name).is_ok_and(|p| {
                        !pending(&p) && st.attrs.get(&p).is_none_or(|a| !a.valid(epoch))
                    })
                }),
            }
        };
        if stale {
            // (What cannot be listed is told by the lookups that follow.)
            let _ = self.list(&dir);
        }
        Ok(())
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
    pub(super) fn relist(st: &mut State, dir: &WirePath, name: &[u8], kind: Option<FileKind>) {
        st.unsynced.get_or_insert_with(Instant::now);
        // The directory's own times changed on the server too: asked for again when next
        // wanted (the server's lease break comes only with a later reply).
        if let Some(a) = st.attrs.get_mut(dir) {
            a.until = Instant::now() - Duration::from_millis(1);
        }
        Self::edit_listing(st, dir, name, kind);
    }

    /// Adds `name` (of `kind`) to the cached listing of `dir`, or removes it (`None`), after a
    /// change made here (kept among the [`Recent`] names); nothing without a listing.
    pub(super) fn edit_listing(
        st: &mut State,
        dir: &WirePath,
        name: &[u8],
        kind: Option<FileKind>,
    ) {
        if let Ok(path) = dir.join(name) {
            st.recent.note(path);
        }
        Self::set_listed(st, dir, name, kind);
    }

    /// As [`edit_listing`](Self::edit_listing), for what the server told.
    pub(super) fn set_listed(st: &mut State, dir: &WirePath, name: &[u8], kind: Option<FileKind>) {
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

    /// The inode of a file just made at `path`, looked up and opened for writing by the
    /// kernel's create.
    pub(super) fn created<'a>(st: &'a mut State, path: &WirePath) -> (Ino, &'a mut Inode) {
        let ino = Self::ino_for(st, path, FileKind::File);
        let n = st.inodes.get_mut(&ino).expect("made");
        n.lookups += 1;
        n.open += 1;
        n.writers += 1;
        n.unlinked = false;
        (ino, n)
    }
}

/// What asks for the listing of `dir` and its own attributes, in one round trip: their lease
/// is the listing's too (the server keys both by the directory), so an empty listing is leased
/// as well.
pub(super) fn listing_requests(dir: &WirePath) -> Vec<Request> {
    vec![
        Request::ReadDir {
            path: dir.clone(),
            keys: vec![],
        },
        Request::GetAttr { path: dir.clone() },
    ]
}

/// The listing and the directory's attributes, from the answers to [`listing_requests`].
pub(super) fn listing_of(
    rs: &mut impl Iterator<Item = Result<Vec<Reply>, ConnError>>,
) -> Result<(Vec<DirEntry>, Attr), ConnError> {
    let mut out = vec![];
    for r in rs.next().expect("asked")? {
        match r {
            Reply::Entries { entries, .. } => out.extend(entries),
            other => return Err(ConnError::Unexpected(format!("{other:?}"))),
        }
    }
    Ok((out, attr_of(rs.next().expect("asked")?)?))
}

/// The names this mount changed lately (made, removed, renamed from or to), the latest
/// [`Recent::KEPT`]. What another of its sessions tells of such a name may predate the change:
/// that session's server looked before the change was made, and its message waited in the
/// pipe while the change went over another session (`git`'s `index.lock`, made, renamed to
/// `index` and made again, was told as still there after the rename, and the next exclusive
/// create failed). Such news breaks the leases instead of being taken.
#[derive(Default)]
pub(super) struct Recent {
    order: std::collections::VecDeque<WirePath>,
    counts: HashMap<WirePath, u32>,
}

impl Recent {
    /// How many changes are remembered: far more than the messages any session can hold back
    /// between two of its replies.
    pub(super) const KEPT: usize = 4096;

    pub(super) fn note(&mut self, path: WirePath) {
        *self.counts.entry(path.clone()).or_default() += 1;
        self.order.push_back(path);
        if self.order.len() > Self::KEPT {
            let old = self.order.pop_front().expect("longer than KEPT");
            if let std::collections::hash_map::Entry::Occupied(mut e) = self.counts.entry(old) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
    }

    pub(super) fn contains(&self, path: &WirePath) -> bool {
        self.counts.contains_key(path)
    }
}
