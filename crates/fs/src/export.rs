//! An exported directory tree, with every path resolved beneath its root.
//!
//! Paths come from the network. They are already free of `..` (see `ferry_proto::WirePath`),
//! but a symlink inside the export can still point anywhere, and a check followed by an open
//! races with a rename. So every open goes through `openat2(2)` with `RESOLVE_BENEATH` (and
//! `RESOLVE_NO_MAGICLINKS`) relative to a descriptor of the root, which the kernel enforces
//! atomically: no check-then-use gap (the class of rsync CVE-2024-12086/12087/12088).

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use ferry_proto::{Attr, FileKind, WirePath};
use ferry_transfer::openat2_beneath as openat2;
use rustix::fs::{Mode, OFlags, ResolveFlags};

/// The exported root.
pub struct Export {
    root: OwnedFd,
    path: PathBuf,
}

/// What `stat` says about a file, with the identity used to cache its recipe.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

fn wire_to_rel(p: &WirePath) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    if p.as_bytes().is_empty() {
        PathBuf::from(".")
    } else {
        PathBuf::from(std::ffi::OsStr::from_bytes(p.as_bytes()))
    }
}

/// The trash: replaced versions of files, kept (hard-linked, so on the same file system and
/// costing no copy) as chunk sources for later updates, oldest removed past a size bound.
/// Hidden from listings (at any level: the export root depends on how a client names a path).
pub const TRASH: &str = ".ferry-trash";

/// The records of commits written in place (see `inplace`), at the export's root. Hidden and
/// refused like the trash.
pub const REDO: &str = ".ferry-redo";

/// Whether `name` is one of the server's own directories (the trash, the redo records).
pub(crate) fn is_server_dir(name: &[u8]) -> bool {
    name == TRASH.as_bytes() || name == REDO.as_bytes()
}

/// The name of an upload's temporary file: `.ferry-<pid>-<tag>-<n>.tmp`, `tag` 16 hex digits
/// of the session's own (sessions of one daemon share its pid). Not user data: hidden from
/// listings, and removed once the process that made it is gone. The pattern is strict, so a
/// user's own `.ferry-notes.tmp` is neither hidden nor removed.
pub(crate) fn commit_temp_name(tag: u64, n: u64) -> String {
    format!(".ferry-{}-{tag:016x}-{n}.tmp", std::process::id())
}

/// The pid of the process that made commit temporary `name`, if that is what it is.
fn commit_temp_pid(name: &[u8]) -> Option<u32> {
    let rest = name.strip_prefix(b".ferry-")?.strip_suffix(b".tmp")?;
    let mut parts = rest.split(|&b| b == b'-');
    let (pid, tag, n) = (parts.next()?, parts.next()?, parts.next()?);
    let digits = |p: &[u8]| !p.is_empty() && p.iter().all(u8::is_ascii_digit);
    let hex = tag.len() == 16
        && tag
            .iter()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
    (parts.next().is_none() && digits(pid) && hex && digits(n))
        .then(|| std::str::from_utf8(pid).ok()?.parse().ok())
        .flatten()
}

/// Whether `p` is the server's own: the trash or the redo records or beneath them, or a
/// commit's temporary file. Requests that make or move names refuse such paths.
pub(crate) fn is_internal(p: &WirePath) -> bool {
    let mut parts = p.components();
    parts.next().is_some_and(is_server_dir) || p.components().any(is_commit_temp)
}

pub(crate) fn is_commit_temp(name: &[u8]) -> bool {
    commit_temp_pid(name).is_some()
}

/// The prefix of a client's partial file: `.ferry-partial-<key>-<version>`, each 16 lowercase
/// hex digits (see `client::partial`).
pub(crate) const PARTIAL_PREFIX: &str = ".ferry-partial-";

/// Whether `name` is a client's partial file (a large file still arriving): not user data,
/// never listed, uploaded or deleted as if it were. The pattern is strict, as for commit
/// temporaries.
pub fn is_partial(name: &[u8]) -> bool {
    let hex16 = |p: &[u8]| {
        p.len() == 16
            && p.iter()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    name.strip_prefix(PARTIAL_PREFIX.as_bytes())
        .filter(|rest| rest.len() == 33 && rest[16] == b'-')
        .is_some_and(|rest| hex16(&rest[..16]) && hex16(&rest[17..]))
}

/// Removes commit temporaries in `dir` left by server processes that no longer run (a crash
/// mid-commit leaves one; the committed file itself is always whole).
pub(crate) fn remove_stale_temps(dir: &OwnedFd) {
    let Ok(entries) = rustix::fs::Dir::read_from(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Some(pid) = commit_temp_pid(e.file_name().to_bytes()) else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = rustix::fs::unlinkat(dir, e.file_name(), rustix::fs::AtFlags::empty());
        }
    }
}

/// The path that names the file open as `fd` itself, whatever is renamed meanwhile: for the
/// calls that take a path only (chmod, utimes of a symlink, linkat, inotify).
pub(crate) fn fd_path(fd: &impl std::os::fd::AsRawFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// A single path component as an `OsStr` (for the `*at` calls on a parent descriptor).
pub(crate) fn os(name: &[u8]) -> &std::ffi::OsStr {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::OsStr::from_bytes(name)
}

/// Attributes of `name` in `dir`, not following a symlink; `None` if it does not exist.
pub(crate) fn stat_at(dir: &OwnedFd, name: &[u8]) -> io::Result<Option<(Attr, FileId)>> {
    match rustix::fs::statat(dir, os(name), rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(attr_of(&st))),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn beneath() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS
}

impl Export {
    pub fn open(path: impl AsRef<Path>) -> io::Result<Export> {
        let path = path.as_ref().to_path_buf();
        let root = rustix::fs::open(
            &path,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Export { root, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens a regular file for reading, beneath the root. Symlinks inside the export are
    /// followed as long as they stay inside it. Anything else is an error: a directory, and a
    /// FIFO, socket or device, whose reads could block or never end.
    pub fn open_file(&self, p: &WirePath) -> io::Result<File> {
        // Non-blocking, so that opening a FIFO cannot hang the session before the check
        // (reads of a regular file are unaffected).
        let fd = openat2(
            &self.root,
            &wire_to_rel(p),
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
            beneath(),
        )?;
        match rustix::fs::FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode) {
            rustix::fs::FileType::RegularFile => Ok(File::from(fd)),
            rustix::fs::FileType::Directory => Err(io::ErrorKind::IsADirectory.into()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            )),
        }
    }

    /// Opens a directory beneath the root.
    pub fn open_dir(&self, p: &WirePath) -> io::Result<OwnedFd> {
        Ok(openat2(
            &self.root,
            &wire_to_rel(p),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            beneath(),
        )?)
    }

    /// Sets the mode and modification time of the file or directory `p` (never through a
    /// symlink: one there is an error). Not fsynced: an attribute lost in a crash costs a
    /// later sync a second look, nothing more.
    pub fn set_attr(
        &self,
        p: &WirePath,
        mode: Option<u32>,
        mtime_ns: Option<i64>,
    ) -> io::Result<()> {
        // Opened for its inode only (O_PATH): neither read nor write permission is needed, so
        // an owner who took them away can give them back (`chmod 000 f; chmod 644 f`), and a
        // symlink is opened itself, never followed.
        let fd = openat2(
            &self.root,
            &wire_to_rel(p),
            OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
            beneath(),
        )?;
        let link = rustix::fs::FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode)
            == rustix::fs::FileType::Symlink;
        // The inode just opened, through its descriptor (no name to be swapped meanwhile).
        let this = fd_path(&fd);
        // A symlink has no mode of its own on Linux: a mode asked for it is ignored.
        if let (Some(mode), false) = (mode, link) {
            rustix::fs::chmod(&this, Mode::from_raw_mode(mode & 0o7777))?;
        }
        if let Some(ns) = mtime_ns {
            let t = rustix::fs::Timespec {
                tv_sec: ns.div_euclid(1_000_000_000),
                tv_nsec: ns.rem_euclid(1_000_000_000) as _,
            };
            let times = rustix::fs::Timestamps {
                last_access: t,
                last_modification: t,
            };
            if link {
                // A symlink's own times (`touch -h`), by its name in its parent, not followed.
                let (dir, name) = self.parent(p)?;
                let now =
                    rustix::fs::statat(&dir, os(&name), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?;
                let same = |st: &rustix::fs::Stat| (st.st_dev, st.st_ino);
                if same(&now) != same(&rustix::fs::fstat(&fd)?) {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        "the symlink was replaced meanwhile",
                    ));
                }
                rustix::fs::utimensat(
                    &dir,
                    os(&name),
                    &times,
                    rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                )?;
            } else {
                rustix::fs::utimensat(
                    rustix::fs::CWD,
                    this.as_str(),
                    &times,
                    rustix::fs::AtFlags::empty(),
                )?;
            }
        }
        Ok(())
    }

    /// Attributes of `p` itself (a symlink is reported as a symlink, not followed).
    pub fn stat(&self, p: &WirePath) -> io::Result<(Attr, FileId)> {
        Ok(attr_of(&rustix::fs::fstat(self.open_path(p)?)?))
    }

    /// `p` opened beneath the root as a path only (`O_PATH`; a symlink itself, not followed).
    fn open_path(&self, p: &WirePath) -> io::Result<OwnedFd> {
        Ok(openat2(
            &self.root,
            &wire_to_rel(p),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            beneath(),
        )?)
    }

    /// The size and free space of the file system holding `p`.
    pub fn statfs(&self, p: &WirePath) -> io::Result<ferry_proto::FsStats> {
        let v = rustix::fs::fstatvfs(self.open_path(p)?)?;
        // statvfs counts blocks in fragments (f_frsize), which is what df multiplies by.
        Ok(ferry_proto::FsStats {
            block_size: v.f_frsize.min(u32::MAX as u64) as u32,
            blocks: v.f_blocks,
            blocks_free: v.f_bfree,
            blocks_avail: v.f_bavail,
            files: v.f_files,
            files_free: v.f_ffree,
            name_max: v.f_namemax.min(u32::MAX as u64) as u32,
        })
    }

    /// The target of symlink `p` (not followed).
    pub fn read_link(&self, p: &WirePath) -> io::Result<Vec<u8>> {
        let (dir, name) = self.parent(p)?;
        Ok(rustix::fs::readlinkat(&dir, os(&name), Vec::new())?.into_bytes())
    }

    /// The parent directory of `p` (opened beneath the root) and `p`'s last component.
    pub fn parent(&self, p: &WirePath) -> io::Result<(OwnedFd, Vec<u8>)> {
        let (parent, name) = p.split_last().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "the export root has no parent")
        })?;
        Ok((self.open_dir(&parent)?, name.to_vec()))
    }

    /// The trash directory, created on first use.
    pub fn trash_dir(&self) -> io::Result<OwnedFd> {
        match rustix::fs::mkdirat(&self.root, TRASH, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        self.open_dir(&WirePath::new(TRASH.as_bytes().to_vec()).map_err(io::Error::other)?)
    }

    /// The redo records' directory, created on first use.
    pub(crate) fn redo_dir(&self) -> io::Result<OwnedFd> {
        match rustix::fs::mkdirat(&self.root, REDO, Mode::from_raw_mode(0o700)) {
            Ok(()) => rustix::fs::fsync(&self.root)?,
            Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        self.existing_redo_dir()?
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    /// The redo records' directory, if it exists and is the server's: a directory itself (not
    /// a symlink to one), of this process's user, mode 0700. Anything else of that name is not
    /// used (its files are never taken for records).
    pub(crate) fn existing_redo_dir(&self) -> io::Result<Option<OwnedFd>> {
        let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC;
        let dir = match rustix::fs::openat(&self.root, REDO, flags, Mode::empty()) {
            Ok(d) => d,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
                tracing::warn!("{REDO} in the export is not a directory: no redo records");
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        let st = rustix::fs::fstat(&dir)?;
        if st.st_uid != rustix::process::geteuid().as_raw() || st.st_mode & 0o777 != 0o700 {
            tracing::warn!("{REDO} in the export is not the server's (owner or mode): not used");
            return Ok(None);
        }
        Ok(Some(dir))
    }

    /// Entries of directory `p` with their attributes, sorted by name.
    pub fn read_dir(&self, p: &WirePath) -> io::Result<Vec<(Vec<u8>, Attr)>> {
        let dir = self.open_dir(p)?;
        let mut out = vec![];
        for e in rustix::fs::Dir::read_from(&dir)? {
            let e = e?;
            let name = e.file_name().to_bytes();
            if name == b"."
                || name == b".."
                || is_commit_temp(name)
                || is_partial(name)
                || is_server_dir(name)
            {
                continue;
            }
            // A single component relative to a descriptor of the directory: it cannot escape.
            let st =
                rustix::fs::statat(&dir, e.file_name(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?;
            // FIFOs, sockets and devices are not served (no file could hold what they give).
            use rustix::fs::FileType as T;
            let served = [T::RegularFile, T::Directory, T::Symlink];
            if !served.contains(&T::from_raw_mode(st.st_mode)) {
                continue;
            }
            let (attr, _) = attr_of(&st);
            out.push((name.to_vec(), attr));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

/// A file's identity as a client sees it (`StatExtra::id`): its device and inode numbers,
/// hashed (the same for every name of one file).
fn identity(dev: u64, ino: u64) -> u64 {
    let mut h = [0u8; 16];
    h[..8].copy_from_slice(&dev.to_le_bytes());
    h[8..].copy_from_slice(&ino.to_le_bytes());
    let d = ferry_format::Id::hash(ferry_format::HashAlg::Blake3, &h);
    u64::from_le_bytes(d.digest()[..8].try_into().unwrap())
}

/// Attributes from a stat. The version is derived from identity, size and both times, so any
/// change to the file (by Ferry or by a local program) gives a new version.
#[allow(clippy::unnecessary_cast)] // stat field types differ between platforms
pub fn attr_of(st: &rustix::fs::Stat) -> (Attr, FileId) {
    let ft = rustix::fs::FileType::from_raw_mode(st.st_mode);
    let kind = match ft {
        rustix::fs::FileType::Directory => FileKind::Dir,
        rustix::fs::FileType::Symlink => FileKind::Symlink,
        _ => FileKind::File,
    };
    let mtime_ns = st.st_mtime as i64 * 1_000_000_000 + st.st_mtime_nsec as i64;
    let ctime_ns = st.st_ctime as i64 * 1_000_000_000 + st.st_ctime_nsec as i64;
    let id = FileId {
        dev: st.st_dev,
        ino: st.st_ino,
        size: st.st_size as u64,
        mtime_ns,
        ctime_ns,
    };
    let mut h = [0u8; 40];
    h[..8].copy_from_slice(&id.dev.to_le_bytes());
    h[8..16].copy_from_slice(&id.ino.to_le_bytes());
    h[16..24].copy_from_slice(&id.size.to_le_bytes());
    h[24..32].copy_from_slice(&mtime_ns.to_le_bytes());
    h[32..40].copy_from_slice(&ctime_ns.to_le_bytes());
    let d = ferry_format::Id::hash(ferry_format::HashAlg::Blake3, &h);
    let version = u64::from_le_bytes(d.digest()[..8].try_into().unwrap());
    let attr = Attr {
        kind,
        mode: st.st_mode & 0o7777,
        size: st.st_size as u64,
        mtime_ns,
        version,
        oid: None,
        lease_ms: 0,
        extra: Some(ferry_proto::StatExtra {
            atime_ns: st.st_atime as i64 * 1_000_000_000 + st.st_atime_nsec as i64,
            ctime_ns,
            blocks: st.st_blocks as u64,
            nlink: st.st_nlink as u32,
            id: Some(identity(st.st_dev as u64, st.st_ino as u64)),
        }),
    };
    (attr, id)
}
