//! Partial files: a large file read by ranges arrives in `.ferry-partial-<key>-<version>` beside
//! its destination (`key`: 8 bytes of BLAKE3 of the file's name; `version`: the server's version
//! of the file as listed; each 16 lowercase hex digits). A transfer cut short leaves it there, and
//! the next fetch of that version goes on from its end instead of starting again; a partial of
//! another version of the same name is removed. What a partial holds is only a hint: the whole
//! file is checked against the object id the server names before it is installed, so a partial
//! damaged by a crash costs a fetch by recipe, never a wrong file.

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::export::{is_partial, PARTIAL_PREFIX};

/// The key of a destination's partials: its name, hashed.
fn key(local: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let name = local.file_name().map_or(&[][..], |n| n.as_bytes());
    let h = blake3::hash(name);
    format!(
        "{:016x}",
        u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"))
    )
}

/// The partial file of `local` at `version`.
pub(crate) fn path_for(local: &Path, version: u64) -> PathBuf {
    super::install::parent_dir(local).join(format!("{PARTIAL_PREFIX}{}-{version:016x}", key(local)))
}

/// Removes the partial file of `local` at `version` (what it holds is not that version).
pub(crate) fn remove(local: &Path, version: u64) {
    let p = path_for(local, version);
    match fs::remove_file(&p) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("cannot remove {}: {e}", p.display()),
    }
}

/// Where a fetch of `local` at `version` (`size` bytes) may go on from: the length of its
/// partial file, short of the last byte (the range that names the object id must still come);
/// 0 without one. Partials of other versions of `local` are removed.
pub(crate) fn resume_point(local: &Path, version: u64, size: u64) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let dir = super::install::parent_dir(local);
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let ours = format!("{PARTIAL_PREFIX}{}-", key(local));
    let want = path_for(local, version);
    let mut at = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        if !is_partial(name.as_bytes()) || !name.as_bytes().starts_with(ours.as_bytes()) {
            continue;
        }
        let p = e.path();
        if p == want {
            at = e.metadata().map_or(0, |m| m.len());
        } else if let Err(err) = fs::remove_file(&p) {
            tracing::debug!("{}: {err}", p.display());
        }
    }
    at.min(size.saturating_sub(1))
}

/// Opens (or makes) the partial at `path` to go on at `start`: the bytes before it are fed to
/// `prefix` (to hash them again), the rest cut off. `None` if it holds fewer than `start`
/// bytes (changed behind this fetch's back).
pub(crate) fn open(
    path: &Path,
    start: u64,
    mut prefix: impl FnMut(&[u8]),
) -> io::Result<Option<File>> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    if f.metadata()?.len() < start {
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

    #[test]
    fn names_are_strict_and_each_version_has_its_own() {
        let local = Path::new("/d/big.iso");
        let p = path_for(local, 0xabc);
        let name = p.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with(".ferry-partial-"), "{name}");
        assert!(name.ends_with("-0000000000000abc"), "{name}");
        assert!(is_partial(name.as_bytes()));
        assert_eq!(p.parent(), Some(Path::new("/d")));
        assert_ne!(path_for(local, 1), path_for(local, 2));
        assert_ne!(path_for(local, 1), path_for(Path::new("/d/other"), 1));
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
        let local = t.path().join("f");
        assert_eq!(resume_point(&local, 7, 100), 0);
        fs::write(path_for(&local, 7), vec![1u8; 40]).unwrap();
        fs::write(path_for(&local, 6), vec![1u8; 10]).unwrap();
        fs::write(t.path().join("g"), b"a user's file").unwrap();
        assert_eq!(resume_point(&local, 7, 100), 40);
        assert!(!path_for(&local, 6).exists());
        assert!(t.path().join("g").exists());
        // Never the whole file: the last range names the object.
        assert_eq!(resume_point(&local, 7, 40), 39);
        let mut seen = vec![];
        let f = open(&path_for(&local, 7), 39, |b| seen.extend_from_slice(b)).unwrap();
        assert!(f.is_some());
        assert_eq!(seen, vec![1u8; 39]);
        assert_eq!(fs::metadata(path_for(&local, 7)).unwrap().len(), 39);
        // Shorter than where it was to go on: not to be trusted.
        assert!(open(&path_for(&local, 7), 50, |_| {}).unwrap().is_none());
        // Another version: gone.
        assert_eq!(resume_point(&local, 8, 100), 0);
        assert!(!path_for(&local, 7).exists());
    }
}
