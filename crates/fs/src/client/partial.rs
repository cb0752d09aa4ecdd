//! Partial files: a large file read by ranges arrives in `.ferry-partial-<key>-<version>` beside
//! its destination (`key`: 8 bytes of BLAKE3 of the file's name; `version`: the server's version
//! of the file as listed; each 16 lowercase hex digits). A transfer cut short leaves it there, and
//! the next fetch of that version goes on from its end instead of starting again; a partial of
//! another version of the same name is removed. What a partial holds is only a hint: the whole
//! file is checked against the object id the server names before it is installed, so a partial
//! damaged by a crash costs a fetch by recipe, never a wrong file.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags};

use super::dest;
use crate::export::{is_partial, PARTIAL_PREFIX};

/// The key of a destination's partials: its name, hashed.
fn key(local: &Path) -> String {
    let name = local.file_name().map_or(&[][..], |n| n.as_bytes());
    let h = blake3::hash(name);
    format!(
        "{:016x}",
        u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"))
    )
}

/// The name of the partial file of `local` at `version`, in `local`'s directory.
pub(crate) fn name_for(local: &Path, version: u64) -> OsString {
    format!("{PARTIAL_PREFIX}{}-{version:016x}", key(local)).into()
}

/// Removes the partial file of `local` (beneath `root`) at `version` (what it holds is not that
/// version).
pub(crate) fn remove(root: &Path, local: &Path, version: u64) {
    let name = name_for(local, version);
    let r = dest::open_parent(root, local)
        .and_then(|(dir, _)| Ok(rustix::fs::unlinkat(&dir, &name, AtFlags::empty())?));
    match r {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("cannot remove {name:?} beside {}: {e}", local.display()),
    }
}

/// Where a fetch of `local` (beneath `root`) at `version` (`size` bytes) may go on from: the
/// length of its partial file, short of the last byte (the range that names the object id must
/// still come); 0 without one. Partials of other versions of `local` are removed.
pub(crate) fn resume_point(root: &Path, local: &Path, version: u64, size: u64) -> u64 {
    let Ok((dir, _)) = dest::open_parent(root, local) else {
        return 0;
    };
    let Ok(entries) = rustix::fs::Dir::read_from(&dir) else {
        return 0;
    };
    let ours = format!("{PARTIAL_PREFIX}{}-", key(local));
    let want = name_for(local, version);
    let mut at = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_bytes();
        if !is_partial(name) || !name.starts_with(ours.as_bytes()) {
            continue;
        }
        if name == want.as_bytes() {
            at = rustix::fs::statat(&dir, OsStr::from_bytes(name), AtFlags::SYMLINK_NOFOLLOW)
                .map_or(0, |st| st.st_size as u64);
        } else if let Err(err) = rustix::fs::unlinkat(&dir, e.file_name(), AtFlags::empty()) {
            tracing::debug!("{}: {err}", OsStr::from_bytes(name).to_string_lossy());
        }
    }
    at.min(size.saturating_sub(1))
}

/// Opens (or makes) the partial `name` in `dir` to go on at `start`: the bytes before it are
/// fed to `prefix` (to hash them again), the rest cut off. `None` if it holds fewer than
/// `start` bytes (changed behind this fetch's back).
pub(crate) fn open(
    dir: &OwnedFd,
    name: &OsStr,
    start: u64,
    mut prefix: impl FnMut(&[u8]),
) -> io::Result<Option<File>> {
    let mut f = File::from(rustix::fs::openat(
        dir,
        name,
        OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?);
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    if meta.len() < start {
        return Ok(None);
    }
    f.set_len(start)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = start;
    while left > 0 {
        let n = f.read(&mut buf[..left.min(1 << 20) as usize])?;
        if n == 0 {
            return Ok(None);
        }
        prefix(&buf[..n]);
        left -= n as u64;
    }
    Ok(Some(f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn names_are_strict_and_each_version_has_its_own() {
        let local = Path::new("/d/big.iso");
        let n = name_for(local, 0xabc);
        let name = n.to_str().unwrap();
        assert!(name.starts_with(".ferry-partial-"), "{name}");
        assert!(name.ends_with("-0000000000000abc"), "{name}");
        assert!(is_partial(name.as_bytes()));
        assert_ne!(name_for(local, 1), name_for(local, 2));
        assert_ne!(name_for(local, 1), name_for(Path::new("/d/other"), 1));
        // A user's own files that look alike are not partials.
        for other in [
            ".ferry-partial-",
            ".ferry-partial-notes",
            ".ferry-partial-0123456789abcdef-0123456789abcdeF",
            ".ferry-partial-0123456789abcdef-0123456789abcdef.txt",
            ".ferry-partial-0123456789abcde-0123456789abcdef0",
        ] {
            assert!(!is_partial(other.as_bytes()), "{other}");
        }
    }

    #[test]
    fn a_partial_resumes_its_version_and_others_are_removed() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        let local = root.join("f");
        let at = |v| root.join(name_for(&local, v));
        assert_eq!(resume_point(root, &local, 7, 100), 0);
        fs::write(at(7), vec![1u8; 40]).unwrap();
        fs::write(at(6), vec![1u8; 10]).unwrap();
        fs::write(root.join("g"), b"a user's file").unwrap();
        assert_eq!(resume_point(root, &local, 7, 100), 40);
        assert!(!at(6).exists());
        assert!(root.join("g").exists());
        // Never the whole file: the last range names the object.
        assert_eq!(resume_point(root, &local, 7, 40), 39);
        let dir = dest::open_dir(root, root).unwrap();
        let mut seen = vec![];
        let f = open(&dir, &name_for(&local, 7), 39, |b| {
            seen.extend_from_slice(b)
        })
        .unwrap();
        assert!(f.is_some());
        assert_eq!(seen, vec![1u8; 39]);
        assert_eq!(fs::metadata(at(7)).unwrap().len(), 39);
        // Shorter than where it was to go on: not to be trusted.
        assert!(open(&dir, &name_for(&local, 7), 50, |_| {})
            .unwrap()
            .is_none());
        // Another version: gone.
        assert_eq!(resume_point(root, &local, 8, 100), 0);
        assert!(!at(7).exists());
        // A symlink in a partial's place is never opened through.
        std::os::unix::fs::symlink("g", at(9)).unwrap();
        assert!(open(&dir, &name_for(&local, 9), 0, |_| {}).is_err());
        assert_eq!(fs::read(root.join("g")).unwrap(), b"a user's file");
        remove(root, &local, 9);
        assert!(fs::symlink_metadata(at(9)).is_err());
    }
}
