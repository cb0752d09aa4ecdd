//! What the server tells of changes, taken: lease breaks, names changed in leased listings,
//! and the attributes after changes queued here.

use super::*;

impl Vfs {
    /// Breaks the leases the server broke.
    pub(super) fn apply_invalidations(&self) {
        let _a = self.applying.lock().unwrap_or_else(|e| e.into_inner());
        let paths = self.link.invalidated();
        if paths.is_empty() {
            return;
        }
        let mut own = vec![];
        let mut puts = vec![];
        let mut st = self.lock();
        for b in paths {
            match b {
                Break::Put(ans) => puts.push(ans),
                Break::Lease(p) => Self::lease_broken(&mut st, &p),
                Break::Attr(p, a, at) => {
                    // (Unless removed or moved here since.)
                    if let Some(before) = st.attrs.get(&p).map(|l| l.value.clone()) {
                        self.store_attr(&mut st, &p, a.clone(), at);
                        own.push((p, before, a));
                    }
                }
                // A name this mount changed and the server has not answered for yet: what
                // is told of it may predate that change.
                Break::Entry(p, a) if self.link.queued.involves(&p, false) => {
                    tracing::trace!("{p:?} changed ({a:?}) while a change of it is on its way");
                    if let Some((dir, _)) = p.split_last() {
                        Self::lease_broken(&mut st, &dir);
                    }
                    Self::lease_broken(&mut st, &p);
                }
                Break::Entry(p, a) => self.entry_changed(&mut st, p, a),
            }
        }
        drop(st);
        for ans in puts {
            self.put_answered(ans);
        }
        for (p, before, after) in own {
            if let Err(e) = self.follow_own_change(&p, Some(before), &after, true) {
                tracing::warn!("{p:?}: cannot relabel the cache's copy: {e:?}");
            }
        }
    }

    fn lease_broken(st: &mut State, p: &WirePath) {
        tracing::trace!("lease broken: {p:?}");
        let past = Instant::now() - Duration::from_millis(1);
        // Kept, expired: the last known attributes still serve while offline.
        if let Some(l) = st.attrs.get_mut(p) {
            l.until = past;
        }
        if let Some(l) = st.listings.get_mut(p) {
            l.until = past;
            st.changing.insert(p.clone());
        }
    }

    /// The server told that the name at `path` changed in a listing it keeps leased: what it
    /// is now (`None`: gone). The listing and the name's attributes follow without asking, and
    /// the directory's attributes are asked for again, as they changed too. Unless the name is
    /// already as told: this mount's own change, seen by another of its sessions.
    pub(super) fn entry_changed(&self, st: &mut State, path: WirePath, attr: Option<Attr>) {
        let past = Instant::now() - Duration::from_millis(1);
        let Some((dir, name)) = path.split_last() else {
            // The export's root: its attributes changed.
            if let Some(l) = st.attrs.get_mut(&path) {
                l.until = past;
            }
            return;
        };
        let epoch = self.link.epoch();
        let listing = st
            .listings
            .get(&dir)
            .filter(|l| l.valid(epoch))
            .map(|l| l.until);
        let known = st.attrs.get(&path).map(|l| (l.value.kind, l.value.version));
        let pending = st
            .ino_of
            .get(&path)
            .and_then(|i| st.inodes.get(i))
            .is_some_and(|n| n.pending && !n.unlinked);
        let own = match &attr {
            Some(a) => known == Some((a.kind, a.version)),
            None => {
                known.is_none()
                    && st.listings.get(&dir).is_some_and(|l| {
                        l.value
                            .binary_search_by(|e| e.0.as_slice().cmp(name))
                            .is_err()
                    })
            }
        };
        tracing::trace!("{path:?} changed: {attr:?} (own: {own}, pending: {pending})");
        if own {
            return;
        }
        if let Some(a) = &attr {
            Self::names_changed(st, a);
        }
        if st.recent.contains(&path) {
            // Maybe older than this mount's own change of it: asked for again when wanted.
            tracing::trace!("{path:?} changed here lately: its leases are broken instead");
            Self::lease_broken(st, &dir);
            Self::lease_broken(st, &path);
            return;
        }
        if let Some(a) = st.attrs.get_mut(&dir) {
            a.until = past;
        }
        let Some(until) = listing else {
            // No listing to keep: the name's lease is broken, as by an Invalidate.
            if let Some(l) = st.attrs.get_mut(&path) {
                l.until = past;
            }
            return;
        };
        match attr {
            Some(a) => {
                let until = until.min(Instant::now() + Duration::from_millis(a.lease_ms as u64));
                Self::set_listed(st, &dir, name, Some(a.kind));
                st.attrs.insert(
                    path,
                    Leased {
                        value: a,
                        until,
                        epoch,
                    },
                );
            }
            None => {
                st.attrs.remove(&path);
                st.listings.remove(&path);
                if !pending {
                    // (A file made here and not yet on the server stays.)
                    Self::set_listed(st, &dir, name, None);
                }
            }
        }
    }
}
