//! Files written whole beside their destination, then renamed over it, durably.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::Path;

use ferry_format::{Id, Recipe};

use super::walk::FileJob;
use super::{mtime, GetError, GetStats, Sources};

/// over the destination.
pub(crate) fn assemble(
    j: &FileJob,
    recipe: &Recipe,
    here: &HashMap<Id, (u64, u32)>,
    fetched: &HashSet<Id>,
    src: &Sources<'_>,
    stats: &mut GetStats,
) -> Result<(), GetError> {
    let local = &j.local;
    let existing = if here.is_empty() {
        None
    } else {
        File::open(j.old()).ok()
    };
    let mut tmp = temp_beside(local)?;
    {
        let mut out = BufWriter::with_capacity(1 << 20, tmp.as_file_mut());
        let mut buf = vec![];
        for c in recipe.chunks() {
            let data = match here.get(&c.id) {
                Some(&(off, len)) => {
                    buf.resize(len as usize, 0);
                    let ok = existing.as_ref().is_some_and(|f| {
                        std::os::unix::fs::FileExt::read_exact_at(f, &mut buf, off).is_ok()
                    });
                    if ok && c.id.matches(&buf) {
                        stats.from_local += 1;
                        buf.clone()
                    } else {
                        src.cache.get(&c.id)?.ok_or(GetError::BadData(c.id))?
                    }
                }
                None => {
                    if !fetched.contains(&c.id) {
                        stats.from_cache += 1;
                    }
                    src.cache.get(&c.id)?.ok_or(GetError::BadData(c.id))?
                }
            };
            if let Some(p) = src.progress {
                p(data.len() as u64);
            }
            out.write_all(&data)
                .map_err(GetError::local("write", local))?;
            stats.chunks += 1;
            stats.bytes += data.len() as u64;
        }
        out.flush().map_err(GetError::local("write", local))?;
    }
    install(tmp, j, stats)
}

/// The directory a file goes into (made if need be).
pub(crate) fn parent_dir(local: &Path) -> &Path {
    local
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// A temporary file beside `local`, to be renamed over it once whole: `.ferry-tmp-` and six
/// random characters, so that what a crash (or kill -9) leaves is plainly Ferry's.
pub(crate) fn temp_beside(local: &Path) -> Result<tempfile::NamedTempFile, GetError> {
    let dir = parent_dir(local);
    fs::create_dir_all(dir).map_err(GetError::local("create directory", dir))?;
    tempfile::Builder::new()
        .prefix(".ferry-tmp-")
        .tempfile_in(dir)
        .map_err(GetError::local("create a temporary file in", dir))
}

/// Gives a file written in full to `tmp` its mode and mtime, and renames it over its
/// destination, durably.
pub(crate) fn install(
    tmp: tempfile::NamedTempFile,
    j: &FileJob,
    stats: &mut GetStats,
) -> Result<(), GetError> {
    settle(tmp.as_file(), j)?;
    tmp.persist(&j.local).map_err(|e| GetError::Local {
        op: "rename into",
        path: j.local.clone(),
        error: e.error,
    })?;
    installed(j, stats)
}

/// Like [`install`] for a file written in full at `path` (a partial file).
pub(crate) fn install_path(
    f: &File,
    path: &Path,
    j: &FileJob,
    stats: &mut GetStats,
) -> Result<(), GetError> {
    settle(f, j)?;
    fs::rename(path, &j.local).map_err(GetError::local("rename into", &j.local))?;
    installed(j, stats)
}

/// The file's mode and mtime, and its bytes on disk.
fn settle(f: &File, j: &FileJob) -> Result<(), GetError> {
    let local = &j.local;
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(
        j.attr.mode & 0o7777,
    ))
    .map_err(GetError::local("chmod", local))?;
    f.set_modified(mtime(&j.attr))
        .map_err(GetError::local("set mtime of", local))?;
    f.sync_all().map_err(GetError::local("fsync", local))
}

/// The rename made durable.
fn installed(j: &FileJob, stats: &mut GetStats) -> Result<(), GetError> {
    let dir = parent_dir(&j.local);
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(GetError::local("fsync", dir))?;
    stats.files += 1;
    Ok(())
}
