//! Hard links: a second name of a file, made on the server at once (`Link`). Here both names
//! are one inode, as there: the kernel shows one inode number and one set of attributes for
//! both, and the inode keeps its other names when one goes.
//!
//! The server's leases are kept by name: a change made through one name breaks the leases of
//! that name only. So the attributes of a file of several names are never taken from a lease
//! (each look asks the server: a round trip), and the kernel is told to keep them no time. A
//! commit to such a file is written into it in place on the server, so every name keeps it.

use super::*;

/// Whether `a` is a file with more than one name on the server.
pub(super) fn several_names(a: &Attr) -> bool {
    a.kind == FileKind::File && a.extra.is_some_and(|x| x.nlink > 1)
}

impl Vfs {
    /// Makes `new_name` in `new_parent` another name of the file `ino` (`link(2)`).
    pub fn link(&self, ino: Ino, new_parent: Ino, new_name: &[u8]) -> Result<Stat, Errno> {
        let (to_dir, to) = self.child(new_parent, new_name)?;
        if let Some(r) = self.link_special(ino, &to) {
            return r;
        }
        let (from, kind) = {
            let st = self.lock();
            let n = st.inodes.get(&ino).ok_or(Errno::ENOENT)?;
            if n.unlinked {
                return Err(Errno::ENOENT);
            }
            (n.path.clone(), n.kind)
        };
        if kind == FileKind::Dir {
            return Err(Errno::EPERM);
        }
        if self.listed(&to_dir, new_name).flatten().is_some()
            || self.lock().specials.get(&to).is_some()
        {
            return Err(Errno::EEXIST);
        }
        // The server's file must be this one: a new file made here goes first, and local
        // changes are written back.
        if self.lock().inodes.values().any(|n| n.put.is_some()) {
            self.send_queued();
        }
        self.settle_queued(&from);
        self.settle_queued(&to);
        if self.lock().inodes.get(&ino).is_some_and(|n| n.dirty) {
            match self.write_back_now(ino) {
                Err(Errno::EEXIST) => return Err(Errno::ENOENT),
                r => r?,
            }
        }
        let asked = Instant::now();
        let mut got = self
            .change_then_stat(
                Request::Link {
                    from: from.clone(),
                    to: to.clone(),
                },
                &[&from, &to_dir],
            )
            .map_err(|f| errno_of(&f))?
            .into_iter();
        {
            let mut st = self.lock();
            st.ino_of.insert(to.clone(), ino);
            if let Some(n) = st.inodes.get_mut(&ino) {
                n.linked = true;
            }
            Self::relist(&mut st, &to_dir, new_name, Some(kind));
            if let Some(Ok(a)) = got.next() {
                self.store_attr(&mut st, &to, a.clone(), asked);
                self.store_attr(&mut st, &from, a, asked);
            }
            self.store_dir(&mut st, &to_dir, got.next(), asked);
        }
        // As the server answered with the link (no round trip more).
        let told = {
            let st = self.lock();
            let a = st.attrs.get(&from).map(|l| l.value.clone());
            a.map(|a| Self::stat_of(&st, ino, &a))
        };
        let s = match told {
            Some(s) => s,
            None => self.stat(ino, None, false)?,
        };
        // The kernel holds one more reference to the inode once the link is answered.
        if let Some(n) = self.lock().inodes.get_mut(&ino) {
            n.lookups += 1;
        }
        Ok(s)
    }

    /// Another name of the inode `ino` than `except` (and than the names below it), if it has
    /// one here.
    pub(super) fn other_name(st: &State, ino: Ino, except: &WirePath) -> Option<WirePath> {
        if !st.inodes.get(&ino).is_some_and(|n| n.linked) {
            return None;
        }
        st.ino_of
            .iter()
            .find(|(p, i)| **i == ino && !is_below(p, except))
            .map(|(p, _)| p.clone())
    }

    /// Whether `a` and `b` are two names of one file here (a rename of one onto the other does
    /// nothing: rename(2)).
    pub(super) fn same_file(st: &State, a: &WirePath, b: &WirePath) -> bool {
        st.ino_of
            .get(a)
            .is_some_and(|i| st.ino_of.get(b) == Some(i))
    }

    /// Whether `a` and `b` are two names of one file on the server, as far as can be told
    /// without a round trip unless `a` has several names (then both are asked for).
    pub(super) fn same_file_there(&self, a: &WirePath, b: &WirePath) -> bool {
        let linked = self
            .lock()
            .attrs
            .get(a)
            .is_some_and(|l| several_names(&l.value));
        if !linked {
            return false;
        }
        let id = |p: &WirePath| self.fresh_attr(p).ok().and_then(|a| a.extra?.id);
        id(a).is_some_and(|i| id(b) == Some(i))
    }

    /// Told that a name of the file `a` describes, a file of several names, was made or
    /// changed: the leases of its other names known here are broken. (A new name changes the
    /// file's link count, which the server, watching directories, sees only under the new
    /// name.)
    pub(super) fn names_changed(st: &mut State, a: &Attr) {
        let Some(id) = a.extra.and_then(|x| x.id).filter(|_| several_names(a)) else {
            return;
        };
        let past = Instant::now() - Duration::from_millis(1);
        for l in st.attrs.values_mut() {
            if l.value.extra.and_then(|x| x.id) == Some(id) {
                l.until = past;
            }
        }
    }

    /// Drops the inode `ino` (nothing refers to it any more) and the names that lead to it.
    pub(super) fn drop_inode(st: &mut State, ino: Ino) {
        let Some(n) = st.inodes.remove(&ino) else {
            return;
        };
        if n.linked {
            st.ino_of.retain(|_, i| *i != ino);
        } else if !n.unlinked && st.ino_of.get(&n.path) == Some(&ino) {
            st.ino_of.remove(&n.path);
        }
    }
}
