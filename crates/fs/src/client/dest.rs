//! The destination of a fetch, written only beneath its root.
//!
//! Another process may change the destination while a fetch writes into it, and swap a
//! directory for a symlink leading elsewhere between a check and the write that trusted it. So
//! nothing below the root is reached by path: every directory a fetch makes, file it creates,
//! renames, reads as an old version or removes, and symlink it makes, is reached through a
//! descriptor of its parent opened beneath the root with no symlink on the way (`openat2(2)`
//! with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), and the final name is used relative to that
//! descriptor, never followed. A swap makes the operation fail; it never lands outside. The
//! root itself is what the user named, followed if it is a symlink.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};

use crate::writeback::Writeback;

fn no_symlinks() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS
}

/// `p` relative to `root`: an error if it is not beneath it. A bare relative name (`out`) is
/// beneath `.`, the directory `install::parent_dir` gives it.
fn relative<'a>(root: &Path, p: &'a Path) -> io::Result<&'a Path> {
    match p.strip_prefix(root) {
        Ok(rel) => Ok(rel),
        Err(_) if root == Path::new(".") && p.is_relative() => Ok(p),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not beneath the destination",
        )),
    }
}

/// The directory `dir` at or beneath `root`, opened for reading (and fsync, fchmod, futimens).
pub(crate) fn open_dir(root: &Path, dir: &Path) -> io::Result<OwnedFd> {
    let rel = relative(root, dir)?;
    let top = rustix::fs::open(
        root,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if rel.as_os_str().is_empty() {
        return Ok(top);
    }
    // No `..` here (names are single components), but the same retrying call as the server's.
    Ok(ferry_transfer::openat2_beneath(
        &top,
        rel,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        no_symlinks(),
    )?)
}

/// The parent of `p` (opened beneath `root`) and `p`'s last component.
pub(crate) fn open_parent<'a>(root: &Path, p: &'a Path) -> io::Result<(OwnedFd, &'a OsStr)> {
    let rel = relative(root, p)?;
    let name = rel.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the destination itself has no parent here",
        )
    })?;
    let parent = p.parent().unwrap_or(root);
    Ok((open_dir(root, parent)?, name))
}

/// The directory `dir` beneath `root`, made (with those above it) if missing; the root must
/// exist.
pub(crate) fn make_dirs(root: &Path, dir: &Path) -> io::Result<OwnedFd> {
    match open_dir(root, dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        r => return r,
    }
    let mut at = open_dir(root, root)?;
    for part in relative(root, dir)?.iter() {
        match rustix::fs::mkdirat(&at, part, Mode::from_raw_mode(0o777)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        at = rustix::fs::openat(
            &at,
            part,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
    }
    Ok(at)
}

/// The regular file `p` beneath `root`, opened for reading; `None` if there is none (missing,
/// or a symlink, directory or anything else in its place: no source of data).
pub(crate) fn open_file(root: &Path, p: &Path) -> io::Result<Option<File>> {
    let (dir, name) = match open_parent(root, p) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    // Non-blocking, so that a FIFO in its place cannot hang the fetch before the check.
    let fd = match rustix::fs::openat(
        &dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::LOOP) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let regular = rustix::fs::FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode)
        == rustix::fs::FileType::RegularFile;
    if !regular {
        return Ok(None);
    }
    rustix::fs::fcntl_setfl(&fd, OFlags::empty())?;
    Ok(Some(File::from(fd)))
}

/// Removes the file, symlink or whole directory `p` beneath `root`, never following a symlink
/// on the way: a directory is emptied through descriptors. A directory of the destination
/// swapped for a symlink leading elsewhere meanwhile makes the removal fail; it never removes
/// what the symlink leads to.
pub(crate) fn remove(root: &Path, p: &Path) -> io::Result<()> {
    let (dir, name) = open_parent(root, p)?;
    remove_at(&dir, name)
}

/// Removes `name` in `dir`: a file or symlink itself, or a directory and all it holds.
fn remove_at(dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Err(rustix::io::Errno::ISDIR) => {}
        r => return Ok(r?),
    }
    let sub = rustix::fs::openat(
        dir,
        name,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut names = vec![];
    for e in rustix::fs::Dir::read_from(&sub)? {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(OsStr::from_bytes(n).to_owned());
        }
    }
    for n in names {
        remove_at(&sub, &n)?;
    }
    Ok(rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?)
}

/// A name for a temporary entry in a directory: `prefix` and six random characters.
fn temp_name(prefix: &str) -> OsString {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut name = prefix.as_bytes().to_vec();
    name.extend(
        rand::random::<[u8; 6]>()
            .iter()
            .map(|&b| CHARS[b as usize % CHARS.len()]),
    );
    OsStr::from_bytes(&name).to_owned()
}

/// A file being written in a directory of the destination, under a temporary name, to be
/// renamed over its final name once whole; removed if dropped before.
pub(crate) struct Temp {
    dir: OwnedFd,
    name: OsString,
    file: File,
    kept: bool,
    /// Bytes written through [`Write`] go to the disk early.
    writeback: Writeback,
}

impl Temp {
    /// A new empty file in `dir`, named `prefix` and six random characters, readable and
    /// writable by its owner only until its mode is set.
    pub(crate) fn new_in(dir: OwnedFd, prefix: &str) -> io::Result<Temp> {
        loop {
            let name = temp_name(prefix);
            match rustix::fs::openat(
                &dir,
                &name,
                OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            ) {
                Ok(fd) => {
                    return Ok(Temp {
                        dir,
                        name,
                        file: File::from(fd),
                        kept: false,
                        writeback: Writeback::default(),
                    })
                }
                Err(rustix::io::Errno::EXIST) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Takes over the file `name` in `dir` (already open as `file`), to be renamed as a temporary
    /// would be; it is not removed if dropped.
    pub(crate) fn existing(dir: OwnedFd, name: OsString, file: File) -> Temp {
        Temp {
            dir,
            name,
            file,
            kept: true,
            writeback: Writeback::default(),
        }
    }

    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// Waits for the early syncs of what was written (see [`Writeback`]); the first error.
    pub(crate) fn synced_early(&mut self) -> io::Result<()> {
        self.writeback.finish()
    }

    /// Renames the file over `name` in its directory and makes the rename durable (the
    /// directory fsynced).
    #[cfg(test)]
    pub(crate) fn rename_to(self, name: &OsStr) -> io::Result<()> {
        let dir = self.rename_unsynced(name)?;
        rustix::fs::fsync(&dir)?;
        Ok(())
    }

    /// Renames the file over `name` in its directory; the directory, for the caller to sync.
    pub(crate) fn rename_unsynced(mut self, name: &OsStr) -> io::Result<OwnedFd> {
        rustix::fs::renameat(&self.dir, &self.name, &self.dir, name)?;
        self.kept = true;
        self.dir.try_clone()
    }
}

/// Writes to the file, its bytes synced early (the file's own position, as `File` writes).
impl io::Write for Temp {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.writeback.wrote(&self.file, n);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if !self.kept {
            let _ = rustix::fs::unlinkat(&self.dir, &self.name, AtFlags::empty());
        }
    }
}

/// Makes `p` (beneath `root`) a symlink to `target`: made beside it under a temporary name and
/// renamed over, so the name is never missing. Not fsynced (a symlink lost in a crash is made
/// again by the next fetch).
pub(crate) fn make_symlink(root: &Path, p: &Path, target: &OsStr) -> io::Result<()> {
    let (dir, name) = open_parent(root, p)?;
    match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir() => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a directory is in the way",
            ))
        }
        Ok(_) => {
            if let Ok(now) = rustix::fs::readlinkat(&dir, name, Vec::new()) {
                if now.as_bytes() == target.as_bytes() {
                    return Ok(());
                }
            }
        }
        Err(_) => {}
    }
    loop {
        let tmp = temp_name(".ferry-link-");
        match rustix::fs::symlinkat(target, &dir, &tmp) {
            Ok(()) => {}
            Err(rustix::io::Errno::EXIST) => continue,
            Err(e) => return Err(e.into()),
        }
        return match rustix::fs::renameat(&dir, &tmp, &dir, name) {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = rustix::fs::unlinkat(&dir, &tmp, AtFlags::empty());
                Err(e.into())
            }
        };
    }
}

/// Sets the mode and modification time of directory `dir` beneath `root`.
pub(crate) fn set_dir_attr(root: &Path, dir: &Path, mode: u32, mtime_ns: i64) -> io::Result<()> {
    let fd = open_dir(root, dir)?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & 0o7777))?;
    let t = rustix::fs::Timespec {
        tv_sec: mtime_ns.div_euclid(1_000_000_000),
        tv_nsec: mtime_ns.rem_euclid(1_000_000_000) as _,
    };
    let omit = rustix::fs::Timespec {
        tv_sec: 0,
        tv_nsec: rustix::fs::UTIME_OMIT,
    };
    rustix::fs::futimens(
        &fd,
        &rustix::fs::Timestamps {
            last_access: omit,
            last_modification: t,
        },
    )?;
    Ok(())
}

/// Makes `p` (beneath `root`) a directory if nothing is there. Never through a symlink: one in
/// its place is an error, as is anything else not a directory.
pub(crate) fn make_dir(root: &Path, p: &Path) -> io::Result<()> {
    let (dir, name) = open_parent(root, p)?;
    match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => match rustix::fs::FileType::from_raw_mode(st.st_mode) {
            rustix::fs::FileType::Directory => Ok(()),
            rustix::fs::FileType::Symlink => Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a symlink is in the way (never written through)",
            )),
            _ => Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a file is in the way",
            )),
        },
        Err(rustix::io::Errno::NOENT) => {
            Ok(rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o777))?)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A destination `dst` with a real directory, and a symlink `d` leading to `outside`.
    fn setup() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let (dst, out) = (t.path().join("dst"), t.path().join("outside"));
        std::fs::create_dir_all(dst.join("real/sub")).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join("x"), b"keep").unwrap();
        std::fs::write(dst.join("real/sub/y"), b"y").unwrap();
        std::os::unix::fs::symlink("../outside", dst.join("d")).unwrap();
        (t, dst, out)
    }

    fn outside_names(out: &Path) -> Vec<OsString> {
        let mut v: Vec<_> = std::fs::read_dir(out)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_removal_never_follows_a_symlink_out_of_the_destination() {
        let (_t, dst, out) = setup();
        assert!(remove(&dst, &dst.join("d/x")).is_err());
        assert_eq!(std::fs::read(out.join("x")).unwrap(), b"keep");
        // The symlink itself goes, not what it leads to.
        remove(&dst, &dst.join("d")).unwrap();
        assert!(out.join("x").exists());
        remove(&dst, &dst.join("real")).unwrap();
        assert!(!dst.join("real").exists());
        // Nothing outside the destination is removed at all.
        assert!(remove(&dst, &out.join("x")).is_err());
        assert!(out.join("x").exists());
    }

    #[test]
    fn nothing_is_made_read_or_set_through_a_symlink() {
        let (_t, dst, out) = setup();
        let x = out.join("x");
        let before = std::fs::metadata(&x).unwrap();
        assert!(make_dirs(&dst, &dst.join("d/new")).is_err());
        assert!(make_dir(&dst, &dst.join("d/new")).is_err());
        assert!(make_dir(&dst, &dst.join("d")).is_err());
        assert!(open_parent(&dst, &dst.join("d/x")).is_err());
        assert!(open_file(&dst, &dst.join("d/x")).is_err());
        assert!(make_symlink(&dst, &dst.join("d/l"), OsStr::new("t")).is_err());
        assert!(set_dir_attr(&dst, &dst.join("d"), 0o700, 0).is_err());
        assert!(open_dir(&dst, &dst.join("d")).is_err());
        // A symlink as the last component is no old version to read either.
        std::os::unix::fs::symlink("../outside/x", dst.join("l")).unwrap();
        assert!(open_file(&dst, &dst.join("l")).unwrap().is_none());
        assert_eq!(outside_names(&out), vec![OsString::from("x")]);
        let after = std::fs::metadata(&x).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            (before.mode(), before.mtime(), before.len()),
            (after.mode(), after.mtime(), after.len())
        );
    }

    #[test]
    fn a_bare_relative_name_is_beneath_the_current_directory() {
        let dot = Path::new(".");
        assert_eq!(relative(dot, Path::new("out")).unwrap(), Path::new("out"));
        assert_eq!(relative(dot, Path::new("./out")).unwrap(), Path::new("out"));
        assert_eq!(
            relative(dot, Path::new("d/out")).unwrap(),
            Path::new("d/out")
        );
        assert!(relative(dot, Path::new("/etc/passwd")).is_err());
        assert!(relative(Path::new("dst"), Path::new("out")).is_err());
    }

    #[test]
    fn files_dirs_and_links_are_made_beneath_the_root() {
        let (_t, dst, _out) = setup();
        let dir = make_dirs(&dst, &dst.join("a/b/c")).unwrap();
        let mut t = Temp::new_in(dir, ".ferry-tmp-").unwrap();
        std::io::Write::write_all(&mut t, b"hello").unwrap();
        t.rename_to(OsStr::new("f")).unwrap();
        assert_eq!(std::fs::read(dst.join("a/b/c/f")).unwrap(), b"hello");
        assert_eq!(
            std::fs::read_dir(dst.join("a/b/c")).unwrap().count(),
            1,
            "no temporary left"
        );
        // A temporary dropped before its rename is removed.
        drop(Temp::new_in(open_dir(&dst, &dst.join("a")).unwrap(), ".ferry-tmp-").unwrap());
        assert_eq!(std::fs::read_dir(dst.join("a")).unwrap().count(), 1);
        make_symlink(&dst, &dst.join("a/l"), OsStr::new("b/c/f")).unwrap();
        make_symlink(&dst, &dst.join("a/l"), OsStr::new("b/c/f")).unwrap();
        assert_eq!(std::fs::read(dst.join("a/l")).unwrap(), b"hello");
        make_dir(&dst, &dst.join("a/e")).unwrap();
        set_dir_attr(&dst, &dst.join("a/e"), 0o750, 1_000_000_000_123).unwrap();
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(dst.join("a/e")).unwrap();
        assert_eq!(
            (m.mode() & 0o7777, m.mtime(), m.mtime_nsec()),
            (0o750, 1000, 123)
        );
        let mut read = String::new();
        std::io::Read::read_to_string(
            &mut open_file(&dst, &dst.join("a/b/c/f")).unwrap().unwrap(),
            &mut read,
        )
        .unwrap();
        assert_eq!(read, "hello");
    }
}
