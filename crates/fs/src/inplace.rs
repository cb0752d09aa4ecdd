//! Commits to a file of several names (hard links), written into the file in place so that
//! every name keeps the new content, and made whole at any crash by a redo record.
//!
//! A rename can replace only one name, so such a commit copies the new content over the old.
//! Before the copy, the synced new content and a second name of the target are put in the
//! export's `.ferry-redo` directory, under one id, and that directory is synced:
//!
//! - `ID.target`: a hard link to the file being written (found by it whatever its names become);
//! - `ID.new`: the new content, its mode and modification time set (the commit's temporary file,
//!   renamed).
//!
//! After the copy (the file synced), `ID.new` goes, then `ID.target`, and the directory is
//! synced. A crash in between leaves both: the next server session into the export copies
//! `ID.new` over the target again (the copy is idempotent), so a crash leaves the old version
//! (the record not yet durable, the target untouched) or, once the next session starts, the
//! whole new one. A record being written by a live session is told apart by the target's lock
//! (`flock`, held by the writer throughout). Readers of a file of several names take that lock
//! shared and finish a pending redo first, so no reader is served the part-written file.

use std::fs::File;
use std::io::{self, Seek};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags};

use crate::export::{os, Export};

/// How long a reader waits for a writer's lock on a file of several names before reading
/// anyway (its version is checked again after the read, so a copy still going on is caught),
/// and a writer for readers' before giving up with a conflict.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// One commit written in place: what it writes over and with.
pub(crate) struct InPlace<'a> {
    /// The directory holding the target and the commit's temporary file.
    pub dir: &'a OwnedFd,
    pub name: &'a [u8],
    /// The temporary file's name in `dir`, and the file (synced, mode and time set).
    pub tmp: &'a str,
    pub new: &'a File,
    /// Unique among the server's records (the temporary's name is).
    pub id: &'a str,
}

/// Why an in-place write did not happen.
pub(crate) enum Refused {
    /// Another writer holds the file's lock.
    Locked,
    /// The file is no longer the version the commit was made against (or not a file).
    Changed,
    Io(io::Error),
}

impl From<io::Error> for Refused {
    fn from(e: io::Error) -> Self {
        Refused::Io(e)
    }
}

impl From<rustix::io::Errno> for Refused {
    fn from(e: rustix::io::Errno) -> Self {
        Refused::Io(e.into())
    }
}

/// Writes `w.new` over the file `w.name` in `w.dir` if that is still `version` (checked through
/// the descriptor written, under its lock), with a redo record around the copy; returns the
/// file, synced. The caller holds the directory's lock. The temporary file is gone after (it
/// became the record's `ID.new`), whatever the outcome, except when the version check fails.
pub(crate) fn write(
    export: &Export,
    w: &InPlace<'_>,
    version: impl Fn(&rustix::fs::Stat) -> bool,
) -> Result<File, Refused> {
    let target = open_writable(w.dir, w.name)?;
    // Readers hold the lock shared for a read's time: waited out. Another writer's copy too,
    // after which the version no longer matches.
    if !wait_for_lock(&target, FlockOperation::NonBlockingLockExclusive)? {
        return Err(Refused::Locked);
    }
    if !version(&rustix::fs::fstat(&target)?) {
        return Err(Refused::Changed);
    }
    let redo = match export.redo_dir() {
        Ok(d) => Some(d),
        Err(e) => {
            tracing::warn!(
                "no redo record for an in-place commit (a crash may leave it part-written): {e}"
            );
            None
        }
    };
    let (t, n) = (format!("{}.target", w.id), format!("{}.new", w.id));
    let recorded = match &redo {
        Some(redo) => record(w, redo, &t, &n)?,
        None => false,
    };
    copy_over(w.new, &target)?;
    if let (true, Some(redo)) = (recorded, &redo) {
        rustix::fs::unlinkat(redo, n.as_str(), AtFlags::empty())?;
        rustix::fs::unlinkat(redo, t.as_str(), AtFlags::empty())?;
        rustix::fs::fsync(redo)?;
    } else {
        let _ = rustix::fs::unlinkat(w.dir, os(w.tmp.as_bytes()), AtFlags::empty());
    }
    Ok(target)
}

/// Makes the redo record of `w` durable: `t` names the target, `n` the new content. False if
/// the export's redo directory is on another file system than the file (no record: the write
/// goes on without one, as any in-place write does).
fn record(w: &InPlace<'_>, redo: &OwnedFd, t: &str, n: &str) -> Result<bool, Refused> {
    // The target's name first and gone last: a live record always has it, so a session
    // finishing records takes an `ID.new` alone for a dead one's.
    match rustix::fs::linkat(w.dir, os(w.name), redo, t, AtFlags::empty()) {
        Ok(()) => {}
        Err(rustix::io::Errno::XDEV) => {
            tracing::warn!("the export's redo directory is on another file system: an in-place commit without a record");
            return Ok(false);
        }
        Err(e) => return Err(e.into()),
    }
    if let Err(e) = rustix::fs::renameat(w.dir, os(w.tmp.as_bytes()), redo, n) {
        let _ = rustix::fs::unlinkat(redo, t, AtFlags::empty());
        return Err(e.into());
    }
    rustix::fs::fsync(redo)?;
    // The temporary's name is gone from the directory the commit's rename would have synced.
    rustix::fs::fsync(w.dir)?;
    Ok(true)
}

/// Copies `new` over `target` from offset 0, sets its length, mode and times to `new`'s, and
/// syncs it (the bytes first written over the old, so never emptied on the way).
fn copy_over(new: &File, target: &File) -> io::Result<()> {
    let mut from = new;
    from.seek(io::SeekFrom::Start(0))?;
    let mut to = target;
    to.seek(io::SeekFrom::Start(0))?;
    let len = io::copy(&mut from, &mut to)?;
    target.set_len(len)?;
    let st = rustix::fs::fstat(new)?;
    rustix::fs::fchmod(target, Mode::from_raw_mode(st.st_mode & 0o7777))?;
    let mtime = rustix::fs::Timespec {
        tv_sec: st.st_mtime,
        tv_nsec: st.st_mtime_nsec as _,
    };
    rustix::fs::futimens(
        target,
        &rustix::fs::Timestamps {
            last_access: mtime,
            last_modification: mtime,
        },
    )?;
    target.sync_all()
}

/// Opens `name` in `dir` for writing, not following a symlink nor blocking on a FIFO. A file
/// its owner may not write (mode 0444, the server not root) is made writable first: its mode
/// is set by the copy anyway.
fn open_writable(dir: &impl AsFd, name: &[u8]) -> io::Result<File> {
    let flags = OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    match rustix::fs::openat(dir, os(name), flags, Mode::empty()) {
        Ok(fd) => Ok(File::from(fd)),
        Err(rustix::io::Errno::ACCESS) => {
            let st = rustix::fs::statat(dir, os(name), AtFlags::SYMLINK_NOFOLLOW)?;
            let mode = Mode::from_raw_mode((st.st_mode & 0o7777) | 0o600);
            rustix::fs::chmodat(dir, os(name), mode, AtFlags::empty())?;
            Ok(File::from(rustix::fs::openat(
                dir,
                os(name),
                flags,
                Mode::empty(),
            )?))
        }
        Err(e) => Err(e.into()),
    }
}

/// Opens `name` in `dir` for reading, likewise.
fn open_readable(dir: &impl AsFd, name: &str) -> io::Result<File> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    match rustix::fs::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => Ok(File::from(fd)),
        Err(rustix::io::Errno::ACCESS) => {
            let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
            let mode = Mode::from_raw_mode((st.st_mode & 0o7777) | 0o400);
            rustix::fs::chmodat(dir, name, mode, AtFlags::empty())?;
            Ok(File::from(rustix::fs::openat(
                dir,
                name,
                flags,
                Mode::empty(),
            )?))
        }
        Err(e) => Err(e.into()),
    }
}

/// Finishes the in-place commits that a crashed or killed server left recorded in `export`
/// (skipping those whose writer still runs) and drops incomplete records; returns how many it
/// finished. Cheap when there are none (the directory does not exist).
pub fn finish_interrupted(export: &Export) -> io::Result<usize> {
    let Some(redo) = export.existing_redo_dir()? else {
        return Ok(0);
    };
    let mut names = vec![];
    for e in rustix::fs::Dir::read_from(&redo)? {
        let name = e?.file_name().to_string_lossy().into_owned();
        if name != "." && name != ".." {
            names.push(name);
        }
    }
    let mut finished = 0;
    let mut changed = false;
    for name in &names {
        if let Some(id) = name.strip_suffix(".target") {
            match finish_one(&redo, id) {
                Ok(Some(done)) => {
                    finished += usize::from(done);
                    changed = true;
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("finishing the in-place commit {id}: {e}"),
            }
        } else if let Some(id) = name.strip_suffix(".new") {
            // Its record lost the target's name: the copy never began. (A live writer's record
            // has it until after the new content is gone.)
            let target = format!("{id}.target");
            if rustix::fs::statat(&redo, target.as_str(), AtFlags::SYMLINK_NOFOLLOW).is_err() {
                let _ = rustix::fs::unlinkat(&redo, name.as_str(), AtFlags::empty());
                changed = true;
            }
        }
    }
    if changed {
        rustix::fs::fsync(&redo)?;
    }
    Ok(finished)
}

/// Finishes the record `id`: `Some(true)` copied, `Some(false)` dropped (nothing to copy),
/// `None` left to its live writer.
fn finish_one(redo: &OwnedFd, id: &str) -> io::Result<Option<bool>> {
    let t = format!("{id}.target");
    let n = format!("{id}.new");
    let target = match open_writable(redo, t.as_bytes()) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match rustix::fs::flock(&target, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let copied = match open_readable(redo, &n) {
        Ok(new) => {
            copy_over(&new, &target)?;
            rustix::fs::unlinkat(redo, n.as_str(), AtFlags::empty())?;
            true
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(e),
    };
    match rustix::fs::unlinkat(redo, t.as_str(), AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Some(copied))
}

/// Before a file is read: if it has several names, a pending redo is finished and the file's
/// lock taken shared (waiting out a writer for a while), so the read sees a whole version.
/// The lock is held until the returned guard is dropped.
pub(crate) fn read_guard(export: &Export, file: &File) -> io::Result<Option<ReadGuard>> {
    let st = rustix::fs::fstat(file)?;
    if st.st_nlink <= 1 || rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir() {
        return Ok(None);
    }
    let fd = file.try_clone()?;
    if !wait_for_lock(&fd, FlockOperation::NonBlockingLockShared)? {
        tracing::warn!("a file of several names stays locked; reading it anyway");
        return Ok(None);
    }
    // A writer killed mid-copy left the file part-written and its record: finish it first.
    if export.redo_pending()? {
        rustix::fs::flock(&fd, FlockOperation::Unlock)?;
        finish_interrupted(export)?;
        if !wait_for_lock(&fd, FlockOperation::NonBlockingLockShared)? {
            return Ok(None);
        }
    }
    Ok(Some(ReadGuard(fd)))
}

/// Takes lock `op` (non-blocking) on `fd`, trying again for up to [`LOCK_WAIT`]; false if it
/// stayed held.
fn wait_for_lock(fd: &impl AsFd, op: FlockOperation) -> io::Result<bool> {
    let give_up = Instant::now() + LOCK_WAIT;
    let mut pause = Duration::from_millis(1);
    loop {
        match rustix::fs::flock(fd, op) {
            Ok(()) => return Ok(true),
            Err(rustix::io::Errno::WOULDBLOCK) if Instant::now() < give_up => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
}

/// A shared lock on a file being read, released when dropped.
pub(crate) struct ReadGuard(File);

impl Drop for ReadGuard {
    fn drop(&mut self) {
        let _ = rustix::fs::flock(&self.0, FlockOperation::Unlock);
    }
}
