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
//! whole new one. A record being written by a live session is told apart by the lock its writer
//! holds on `ID.new` (`flock`, from before the record is made until the commit is done or
//! dropped); the target's own lock is taken by writers exclusively and by readers shared, so a
//! session finishing a dead writer's record waits for the target's readers first. Readers of a
//! file of several names take its lock shared and finish a pending record first, so no reader
//! is served the part-written file. Only names of the record's pattern are acted on, and the
//! directory is used only if it is a real directory of the server's (mode 0700, its owner).

use std::fs::File;
use std::io::{self, Seek};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags, CWD};

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
/// file, synced. The caller holds the directory's lock and keeps `w.new` open until the commit
/// is answered (its lock marks the record live). After a failed copy the record stays, so the
/// file is finished whole later; the temporary file is gone either way once recorded.
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
    let st = rustix::fs::fstat(&target)?;
    if !version(&st) {
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
        Some(redo) => {
            // A dead writer's record of this file is superseded: the whole file is written now.
            // One whose mark is held while this writer holds the file's lock is being finished
            // by another session, which waits for that lock to copy it: refused (the client
            // tries again, against what that copy leaves), or the copy would undo this commit.
            if !drop_records_of(redo, (st.st_dev, st.st_ino)) {
                return Err(Refused::Locked);
            }
            record(w, &target, redo, &t, &n)?
        }
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

/// Makes the redo record of `w` durable: `t` names `target` (linked through its descriptor, so
/// the very file locked and checked), `n` the new content. False if the export's redo
/// directory is on another file system than the file (no record: the write goes on without
/// one, as any in-place write does). Undone if it cannot be made whole.
fn record(
    w: &InPlace<'_>,
    target: &File,
    redo: &OwnedFd,
    t: &str,
    n: &str,
) -> Result<bool, Refused> {
    // The writer's mark, held until its upload is dropped: with it, a record being made or
    // copied is told from a dead writer's. The new content goes in first, so a record is never
    // without it while the mark can be seen.
    rustix::fs::flock(w.new, FlockOperation::NonBlockingLockExclusive)?;
    match rustix::fs::renameat(w.dir, os(w.tmp.as_bytes()), redo, n) {
        Ok(()) => {}
        Err(rustix::io::Errno::XDEV) => {
            tracing::warn!("the export's redo directory is on another file system: an in-place commit without a record");
            return Ok(false);
        }
        Err(e) => return Err(e.into()),
    }
    let undo = || {
        // Not durable, and nothing copied yet: no record at all.
        let _ = rustix::fs::unlinkat(redo, t, AtFlags::empty());
        let _ = rustix::fs::renameat(redo, n, w.dir, os(w.tmp.as_bytes()));
        let _ = rustix::fs::fsync(redo);
    };
    let by_fd = crate::export::fd_path(target);
    match rustix::fs::linkat(CWD, by_fd.as_str(), redo, t, AtFlags::SYMLINK_FOLLOW) {
        Ok(()) => {}
        Err(e) => {
            undo();
            return Err(e.into());
        }
    }
    let made = rustix::fs::fsync(redo).and_then(|()| rustix::fs::fsync(w.dir));
    if let Err(e) = made {
        undo();
        return Err(e.into());
    }
    Ok(true)
}

/// Whether a record of `export` has the file `(dev, ino)` as its target.
fn record_of(export: &Export, file: (u64, u64)) -> io::Result<bool> {
    let Some(redo) = export.existing_redo_dir()? else {
        return Ok(false);
    };
    Ok(!records_of(&redo, file).is_empty())
}

/// The ids of the records in `redo` whose target is the file `(dev, ino)`.
fn records_of(redo: &OwnedFd, file: (u64, u64)) -> Vec<String> {
    let target_is = |id: &String| {
        let t = format!("{id}.target");
        rustix::fs::statat(redo, t.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| (st.st_dev, st.st_ino) == file)
    };
    record_ids(redo).into_iter().filter(target_is).collect()
}

/// Removes the records of dead writers whose target is the file `(dev, ino)`; false if one
/// was left because its mark is held (another session is finishing it).
fn drop_records_of(redo: &OwnedFd, file: (u64, u64)) -> bool {
    let mut all = true;
    for id in records_of(redo, file) {
        let (t, n) = (format!("{id}.target"), format!("{id}.new"));
        if let Ok(new) = open_readable(redo, &n) {
            if rustix::fs::flock(&new, FlockOperation::NonBlockingLockExclusive).is_err() {
                all = false;
                continue;
            }
        }
        let _ = rustix::fs::unlinkat(redo, n.as_str(), AtFlags::empty());
        let _ = rustix::fs::unlinkat(redo, t.as_str(), AtFlags::empty());
    }
    all
}

/// The ids of the records in `redo`: names of the record's pattern only (a commit's temporary
/// name, without its dot and `.tmp`, then `.target` or `.new`), each id once.
fn record_ids(redo: &OwnedFd) -> Vec<String> {
    let mut ids = vec![];
    let Ok(dir) = rustix::fs::Dir::read_from(redo) else {
        return ids;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let id = name
            .strip_suffix(".target")
            .or_else(|| name.strip_suffix(".new"));
        if let Some(id) = id {
            if crate::export::is_commit_temp(format!(".{id}.tmp").as_bytes())
                && !ids.iter().any(|i| i == id)
            {
                ids.push(id.to_string());
            }
        }
    }
    ids
}

/// Copies `new` over `target` from offset 0, sets its length, mode and times to `new`'s, and
/// syncs it (the bytes first written over the old, so never emptied on the way). A mode or
/// time the server may not set (the file is another user's, writable by the server's group)
/// is left as it is.
fn copy_over(new: &File, target: &File) -> io::Result<()> {
    let mut from = new;
    from.seek(io::SeekFrom::Start(0))?;
    let mut to = target;
    to.seek(io::SeekFrom::Start(0))?;
    let len = io::copy(&mut from, &mut to)?;
    target.set_len(len)?;
    let st = rustix::fs::fstat(new)?;
    let mtime = rustix::fs::Timespec {
        tv_sec: st.st_mtime,
        tv_nsec: st.st_mtime_nsec as _,
    };
    let times = rustix::fs::Timestamps {
        last_access: mtime,
        last_modification: mtime,
    };
    let attrs = rustix::fs::fchmod(target, Mode::from_raw_mode(st.st_mode & 0o7777))
        .and_then(|()| rustix::fs::futimens(target, &times));
    match attrs {
        Ok(()) | Err(rustix::io::Errno::PERM) => {}
        Err(e) => return Err(e.into()),
    }
    target.sync_all()
}

/// Opens `name` in `dir` for writing, not following a symlink nor blocking on a FIFO. A file
/// its owner may not write (mode 0444, the server not root) is made writable first (its mode
/// is set by the copy anyway), through a descriptor of that very file: never a symlink's
/// target, whatever is renamed meanwhile.
fn open_writable(dir: &impl AsFd, name: &[u8]) -> io::Result<File> {
    open_forcing(dir, os(name), OFlags::WRONLY, 0o600)
}

/// Opens `name` in `dir` for reading, likewise.
fn open_readable(dir: &impl AsFd, name: &str) -> io::Result<File> {
    open_forcing(dir, std::ffi::OsStr::new(name), OFlags::RDONLY, 0o400)
}

fn open_forcing(
    dir: &impl AsFd,
    name: &std::ffi::OsStr,
    access: OFlags,
    bits: u32,
) -> io::Result<File> {
    let flags = access | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    match rustix::fs::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => Ok(File::from(fd)),
        Err(rustix::io::Errno::ACCESS) => {
            let path = rustix::fs::openat(
                dir,
                name,
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            let st = rustix::fs::fstat(&path)?;
            if !rustix::fs::FileType::from_raw_mode(st.st_mode).is_file() {
                return Err(io::Error::from(io::ErrorKind::PermissionDenied));
            }
            let by_fd = crate::export::fd_path(&path);
            rustix::fs::chmod(
                by_fd.as_str(),
                Mode::from_raw_mode((st.st_mode & 0o7777) | bits),
            )?;
            let flags = access | OFlags::NONBLOCK | OFlags::CLOEXEC;
            Ok(File::from(rustix::fs::open(
                by_fd.as_str(),
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
    finish_all(export).map(|(n, _)| n)
}

/// [`finish_interrupted`], and the files (device, inode) whose record could not be finished
/// for an error (a full disk, say: tried again later).
fn finish_all(export: &Export) -> io::Result<(usize, Vec<(u64, u64)>)> {
    let Some(redo) = export.existing_redo_dir()? else {
        return Ok((0, vec![]));
    };
    let mut finished = 0;
    let mut failed = vec![];
    let mut changed = false;
    for id in record_ids(&redo) {
        match finish_one(&redo, &id) {
            Ok(Some(done)) => {
                finished += usize::from(done);
                changed = true;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!("finishing the in-place commit {id}: {e}");
                let t = format!("{id}.target");
                if let Ok(st) = rustix::fs::statat(&redo, t.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                    failed.push((st.st_dev, st.st_ino));
                }
            }
        }
    }
    if changed {
        rustix::fs::fsync(&redo)?;
    }
    Ok((finished, failed))
}

/// Finishes the record `id`: `Some(true)` copied, `Some(false)` dropped (incomplete: the copy
/// never began), `None` left as it is (its writer still runs, or the file's readers held it
/// too long: tried again later).
fn finish_one(redo: &OwnedFd, id: &str) -> io::Result<Option<bool>> {
    let t = format!("{id}.target");
    let n = format!("{id}.new");
    let new = match open_readable(redo, &n) {
        Ok(f) => Some(f),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    if let Some(new) = &new {
        match rustix::fs::flock(new, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            // Its writer's mark (or another session finishing it now).
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
    // (Only opened, and so perhaps made writable, when there is something to copy.)
    let target = match new.as_ref().map(|_| open_writable(redo, t.as_bytes())) {
        Some(Ok(f)) => Some(f),
        None => None,
        Some(Err(e)) if e.kind() == io::ErrorKind::NotFound => None,
        Some(Err(e)) => return Err(e),
    };
    let copied = match (&new, &target) {
        (Some(new), Some(target)) => {
            // The file's readers let go first.
            if !wait_for_lock(target, FlockOperation::NonBlockingLockExclusive)? {
                return Ok(None);
            }
            copy_over(new, target)?;
            true
        }
        // Without the target's name the copy never began, or was done (the new content goes
        // first when it is); without the new content, it never began.
        _ => false,
    };
    for name in [&n, &t] {
        match rustix::fs::unlinkat(redo, name.as_str(), AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
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
    let me = (st.st_dev, st.st_ino);
    let give_up = Instant::now() + LOCK_WAIT;
    let mut pause = Duration::from_millis(1);
    loop {
        if !wait_for_lock(&fd, FlockOperation::NonBlockingLockShared)? {
            tracing::warn!("a file of several names stays locked; reading it anyway");
            return Ok(None);
        }
        // A writer killed mid-copy left the file part-written and its record: finished first
        // (here, or by whoever is finishing it now, waited for without holding the lock).
        if !record_of(export, me)? {
            break;
        }
        rustix::fs::flock(&fd, FlockOperation::Unlock)?;
        let (_, failed) = finish_all(export)?;
        if failed.contains(&me) || Instant::now() >= give_up {
            tracing::warn!("a file of several names keeps a redo record; reading it anyway");
            return Ok(None);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
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
