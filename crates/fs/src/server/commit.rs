//! Commits: what an upload wrote installed atomically over its file, once it is the object
//! the commit names and the file is still the version it was written against.
//!
//! A commit holds an exclusive `flock` on the directory while it checks the version, keeps the
//! replaced one in the trash and renames: two sessions (processes of their own over ssh,
//! threads of the daemon) committing into one directory take turns, so a stale update cannot
//! win between another's check and its rename.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::fd::OwnedFd;

use ferry_format::{Id, Oid, Recipe};
use ferry_proto::{ErrorCode, FileKind, Reply};

use super::upload::{discard, Upload};
use super::{error, io_error, Server};
use crate::export::{os, stat_at};

impl Server {
    /// COMMITTMP: installs what upload `handle` wrote, if it is `size` bytes hashing to `oid`
    /// and the file is still the version it was written against. A reader sees the old file or
    /// the new one; a crash at any point leaves one of them (and perhaps a temporary file,
    /// which the next upload into the directory removes once its process is gone). `None`: the
    /// commit waits with others for their temporary files to be synced together (request `id`
    /// is answered when they are: see `group`).
    pub(super) fn commit(
        &mut self,
        id: u32,
        handle: u32,
        mode: u32,
        mtime_ns: i64,
        size: u64,
        oid: ferry_format::Id,
    ) -> Option<Reply> {
        let Some(u) = self.uploads.take(handle) else {
            return Some(error(ErrorCode::BadRequest, format!("no upload {handle}")));
        };
        let u = match self.prepare(u, mode, mtime_ns, size, oid) {
            Ok(u) => u,
            Err(r) => return Some(r),
        };
        // Parked: answered with the others of its group.
        let u = self.park(id, u)?;
        let synced = if u.size > 0 {
            let started = std::time::Instant::now();
            let r = u.out.get_ref().sync_all();
            self.synced_in(started.elapsed());
            r
        } else {
            Ok(())
        };
        Some(match synced {
            Ok(()) => self.finish(u),
            Err(e) => {
                let r = io_error(&u.path, &e);
                discard(u);
                r
            }
        })
    }

    /// Checks what upload `u` wrote against the commit's size and object id, and gives the
    /// temporary file the mode and time asked for; the upload is dropped if that fails.
    fn prepare(
        &mut self,
        mut u: Upload,
        mode: u32,
        mtime_ns: i64,
        size: u64,
        oid: Id,
    ) -> Result<Upload, Reply> {
        let path = u.path.clone();
        let ioe = |e: io::Error| io_error(&path, &e);
        if let Err(e) = u.out.flush().and_then(|()| u.writeback.finish()) {
            discard(u);
            return Err(ioe(e));
        }
        // Its write buffer goes (flushed above, so empty): a commit parked with others keeps
        // only its file.
        u.out = BufWriter::with_capacity(0, u.out.into_parts().0);
        let got = Oid(u.whole.finish());
        if u.size != size || got.id() != oid {
            // Data written against a base that changed in place gives other bytes: say so.
            let r = match self.check_version(&u) {
                Err(r) => r,
                Ok(_) => error(
                    ErrorCode::BadRequest,
                    format!("{path:?}: what was written is not the object the commit names"),
                ),
            };
            discard(u);
            return Err(r);
        }
        u.oid = Some(oid);
        if let Err(e) = set_mode_and_time(u.out.get_ref(), mode, mtime_ns) {
            discard(u);
            return Err(ioe(e));
        }
        Ok(u)
    }

    /// Installs upload `u`, prepared and its temporary file synced (an empty one is not: its
    /// inode is made durable with the directory's entry by the fsync after the rename, and a
    /// create through the mount commits one before every first write-back).
    pub(super) fn finish(&mut self, u: Upload) -> Reply {
        match self.install(u) {
            Ok(r) | Err(r) => r,
        }
    }

    fn install(&mut self, u: Upload) -> Result<Reply, Reply> {
        let path = u.path.clone();
        let ioe = |e: io::Error| io_error(&path, &e);
        let Some(oid) = u.oid else {
            discard(u);
            return Err(error(ErrorCode::Io, format!("{path:?}: not prepared")));
        };
        // Check, keep the old version, rename: one at a time per directory. A file of several
        // names is written in place instead, so that every name keeps it.
        let installed = (|| -> Result<Option<File>, Reply> {
            let _lock = DirLock::new(&u.dir).map_err(ioe)?;
            if self.check_version(&u)? {
                return self.write_in_place(&u).map(Some);
            }
            if u.base.is_some() {
                self.keep_in_trash(&u.dir, &u.name);
            }
            rustix::fs::renameat(&u.dir, os(u.tmp.as_bytes()), &u.dir, os(&u.name))
                .map_err(|e| ioe(e.into()))?;
            self.dir_syncs.changed(&u.dir).map_err(ioe)?;
            Ok(None)
        })();
        let in_place = match installed {
            Ok(f) => f,
            Err(r) => {
                discard(u);
                return Err(r);
            }
        };
        // This commit's own change breaks the leases granted before it (sent ahead of the
        // reply), not the one the reply carries; and that one is granted only if the name
        // still holds what was written.
        let st = match &in_place {
            Some(f) => rustix::fs::fstat(f),
            None => rustix::fs::fstat(u.out.get_ref()),
        }
        .map_err(|e| ioe(e.into()))?;
        drop(in_place);
        let Upload {
            dir,
            name,
            chunks,
            out,
            ..
        } = u;
        // Closing it is a change too (IN_CLOSE_WRITE under the new name), seen before the
        // lease below is granted.
        drop(out);
        self.take_broken_own(&[&path]);
        let (mut attr, fid) = crate::export::attr_of(&st);
        let recipe = Recipe::from_chunks(self.opts.hash, chunks)
            .map_err(|e| error(ErrorCode::Io, format!("{path:?}: {e}")))?;
        self.remember(&path, fid, recipe, Oid(oid));
        attr.oid = Some(oid);
        self.keep_extra(&mut attr);
        let still = stat_at(&dir, &name).ok().flatten();
        if still.is_some_and(|(a, _)| a.version == attr.version) {
            attr.lease_ms = self.lease(&path, false);
        }
        Ok(Reply::Attr(attr))
    }

    /// Writes what upload `u` wrote (synced, its mode and time set) into the file it replaces,
    /// in place: a file of several names, each of which keeps the new content, as when a local
    /// program writes it. Made whole at any crash by a redo record (see `crate::inplace`).
    /// Returns the file written.
    fn write_in_place(&self, u: &Upload) -> Result<File, Reply> {
        let path = &u.path;
        let version = u.base.as_ref().map_or(0, |b| b.version);
        let w = crate::inplace::InPlace {
            dir: &u.dir,
            name: &u.name,
            tmp: &u.tmp,
            new: u.out.get_ref(),
            id: u.tmp.trim_start_matches('.').trim_end_matches(".tmp"),
        };
        let same = |st: &rustix::fs::Stat| {
            let (now, _) = crate::export::attr_of(st);
            now.kind == FileKind::File && now.version == version
        };
        let conflict = |why: &str| error(ErrorCode::Conflict, format!("{path:?}: {why}"));
        crate::inplace::write(&self.export, &w, same).map_err(|e| match e {
            crate::inplace::Refused::Locked => conflict("locked by another writer"),
            crate::inplace::Refused::Changed => {
                conflict(&format!("changed since version {version}"))
            }
            crate::inplace::Refused::Io(e) => io_error(path, &e),
        })
    }

    /// Whether the file an upload replaces is still the version it was written against (or
    /// still absent); if so, whether it has other names (hard links).
    fn check_version(&self, u: &Upload) -> Result<bool, Reply> {
        let path = &u.path;
        let cur = stat_at(&u.dir, &u.name).map_err(|e| io_error(path, &e))?;
        match (cur, u.base.as_ref().map(|b| b.version)) {
            (Some((a, _)), _) if a.kind == FileKind::Dir => {
                Err(error(ErrorCode::IsDir, format!("{path:?} is a directory")))
            }
            (Some((a, _)), Some(v)) if a.version == v => {
                Ok(a.kind == FileKind::File && a.extra.is_some_and(|x| x.nlink > 1))
            }
            (None, None) => Ok(false),
            (Some(_), None) => Err(error(
                ErrorCode::Conflict,
                format!("{path:?} was created since"),
            )),
            (Some(_), Some(v)) => Err(error(
                ErrorCode::Conflict,
                format!("{path:?} changed since version {v}"),
            )),
            (None, Some(v)) => Err(error(
                ErrorCode::Conflict,
                format!("{path:?} was removed since version {v}"),
            )),
        }
    }
}

/// Gives a committed file the mode and modification time asked for (its access time too).
fn set_mode_and_time(file: &File, mode: u32, mtime_ns: i64) -> io::Result<()> {
    rustix::fs::fchmod(file, rustix::fs::Mode::from_raw_mode(mode & 0o7777))?;
    let t = rustix::fs::Timespec {
        tv_sec: mtime_ns.div_euclid(1_000_000_000),
        tv_nsec: mtime_ns.rem_euclid(1_000_000_000) as _,
    };
    rustix::fs::futimens(
        file,
        &rustix::fs::Timestamps {
            last_access: t,
            last_modification: t,
        },
    )?;
    Ok(())
}

/// An exclusive `flock` on a directory, released when dropped.
struct DirLock<'a>(&'a OwnedFd);

impl<'a> DirLock<'a> {
    fn new(dir: &'a OwnedFd) -> io::Result<Self> {
        rustix::fs::flock(dir, rustix::fs::FlockOperation::LockExclusive)?;
        Ok(DirLock(dir))
    }
}

impl Drop for DirLock<'_> {
    fn drop(&mut self) {
        let _ = rustix::fs::flock(self.0, rustix::fs::FlockOperation::Unlock);
    }
}
