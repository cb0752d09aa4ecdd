//! Changes of names and attributes in the export: a directory's entry made or removed, a
//! rename, a hard link, a mode or time set. Each directory changed is fsynced before the reply,
//! or kept for the next Sync (`FEATURE_DEFERRED_SYNC`).

use std::io;
use std::os::fd::OwnedFd;

use ferry_proto::{Reply, WirePath};

use super::{io_error, Server};
use crate::export::os;

/// Largest file whose content is read again after a client sets its time (see `set_attr`).
const RECUT_AFTER_TOUCH: u64 = 1 << 20;

impl Server {
    /// Runs `op` on the parent directory of `path` and its last component; the directory is
    /// fsynced before the reply, or kept for the next Sync (`FEATURE_DEFERRED_SYNC`).
    pub(super) fn at(
        &mut self,
        path: &WirePath,
        op: impl FnOnce(&OwnedFd, &[u8]) -> io::Result<()>,
    ) -> Reply {
        let r = (|| {
            let (dir, name) = self.export.parent(path)?;
            op(&dir, &name)?;
            self.dir_syncs.changed(&dir)?;
            Ok::<_, io::Error>(())
        })();
        match r {
            Ok(()) => {
                self.take_broken_own(&[path]);
                Reply::Ok
            }
            Err(e) => io_error(path, &e),
        }
    }

    pub(super) fn rename(&mut self, from: &WirePath, to: &WirePath) -> Reply {
        self.between(from, to, true, |fd, fname, td, tname| {
            Ok(rustix::fs::renameat(fd, os(fname), td, os(tname))?)
        })
    }

    /// Makes `to` a new name of the file or symlink `from` (not following it). (Never of the
    /// server's own files, nor as one: refused before.)
    pub(super) fn link(&mut self, from: &WirePath, to: &WirePath) -> Reply {
        self.between(from, to, false, |fd, fname, td, tname| {
            rustix::fs::linkat(fd, os(fname), td, os(tname), rustix::fs::AtFlags::empty())?;
            // The file's link count changed, which those watching `from`'s directory do not
            // see (the kernel tells it to the new name's directory only): a change of mode to
            // the same mode tells them, so their leases on `from` break.
            // (Best effort: the link is made.)
            let st = rustix::fs::statat(fd, os(fname), rustix::fs::AtFlags::SYMLINK_NOFOLLOW);
            if let Some(st) = st.ok().filter(|st| {
                rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile
            }) {
                let mode = rustix::fs::Mode::from_raw_mode(st.st_mode & 0o7777);
                let _ = rustix::fs::chmodat(fd, os(fname), mode, rustix::fs::AtFlags::empty());
            }
            Ok(())
        })
    }

    /// Runs `op` on the parent directories of `from` and `to` and their last components: the
    /// directory of `to` is synced (or kept for the next Sync), and with `from_changed` that of
    /// `from` too.
    fn between(
        &mut self,
        from: &WirePath,
        to: &WirePath,
        from_changed: bool,
        op: impl FnOnce(&OwnedFd, &[u8], &OwnedFd, &[u8]) -> io::Result<()>,
    ) -> Reply {
        let r = (|| -> io::Result<()> {
            let (fd, fname) = self.export.parent(from)?;
            let (td, tname) = self.export.parent(to)?;
            op(&fd, &fname, &td, &tname)?;
            self.dir_syncs.changed(&td)?;
            if from_changed {
                self.dir_syncs.changed(&fd)?;
            }
            Ok(())
        })();
        match r {
            Ok(()) => {
                self.take_broken_own(&[from, to]);
                Reply::Ok
            }
            Err(e) => io_error(from, &e),
        }
    }

    /// Sets a mode and time; what is known of a file's content follows its own change of mode
    /// (same inode, size and mtime before and after: the new ctime alone made it unknown), and
    /// a small file's is read again after a change of time.
    pub(super) fn set_attr(
        &mut self,
        path: &WirePath,
        mode: Option<u32>,
        mtime_ns: Option<i64>,
    ) -> Reply {
        let before = self.export.stat(path).ok().map(|(_, fid)| fid);
        if let Err(e) = self.export.set_attr(path, mode, mtime_ns) {
            return io_error(path, &e);
        }
        self.take_broken_own(&[path]);
        if let (Some(b), Ok((_, a))) = (before, self.export.stat(path)) {
            let same = (b.dev, b.ino, b.size, b.mtime_ns) == (a.dev, a.ino, a.size, a.mtime_ns);
            let known = self.recipes.get(&b);
            match known {
                Some((recipe, oid)) if same && mtime_ns.is_none() => {
                    let (recipe, oid) = (recipe.clone(), *oid);
                    self.remember(path, a, recipe, oid)
                }
                // A new time (`touch`, `rsync`, `tar x`): a small file known before is read
                // again, so that its attributes name the same object at the new version and a
                // client's copy of it stays good (the content is checked, not assumed).
                Some(_) if mtime_ns.is_some() && a.size <= RECUT_AFTER_TOUCH => {
                    if let Err(e) = self.recipe(path) {
                        tracing::debug!("{path:?}: {e}");
                    }
                }
                _ => {}
            }
        }
        Reply::Ok
    }
}
