//! Files written whole beside their destination, then renamed over it, durably.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use ferry_format::{Id, Recipe};

use super::dest::{self, Temp};
use super::walk::FileJob;
use super::{mtime, GetError, GetStats, Sources};

/// Writes a file from its recipe (each chunk from the old version here while it still holds
/// it, else from the cache, where everything fetched went) into a temporary file beside the
/// destination, to be installed over it ([`install_all`]).
pub(crate) fn assemble(
    j: &FileJob,
    recipe: &Recipe,
    here: &HashMap<Id, (u64, u32)>,
    fetched: &HashSet<Id>,
    src: &Sources<'_>,
    stats: &mut GetStats,
) -> Result<Temp, GetError> {
    let local = &j.local;
    let existing = if here.is_empty() {
        None
    } else {
        j.open_old().ok().flatten()
    };
    let mut tmp = temp_beside(j)?;
    {
        let mut out = BufWriter::with_capacity(1 << 20, &mut tmp);
        // Chunks read from the old version, verified, are written from here (not copied).
        let mut old = OldRuns::new(existing.as_ref(), here, recipe.chunks());
        let mut cached;
        for (i, c) in recipe.chunks().iter().enumerate() {
            let data: &[u8] = if let Some(data) = old.chunk(i) {
                stats.from_local += 1;
                data
            } else {
                if !here.contains_key(&c.id) && !fetched.contains(&c.id) {
                    stats.from_cache += 1;
                }
                cached = src
                    .cache
                    .get_passing(&c.id)?
                    .ok_or(GetError::BadData(c.id))?;
                &cached
            };
            if let Some(p) = src.progress {
                p(data.len() as u64);
            }
            out.write_all(data)
                .map_err(GetError::local("write", local))?;
            stats.chunks += 1;
            stats.bytes += data.len() as u64;
        }
        out.flush().map_err(GetError::local("write", local))?;
    }
    tmp.synced_early()
        .map_err(GetError::local("fsync", &j.local))?;
    Ok(tmp)
}

/// Bytes of the old version read at once at most: a run of chunks the new version keeps in
/// the old order is one read, not one a chunk (numpy-whl-tree: 5,000 reads of 8 KiB).
const OLD_RUN: u64 = 1 << 20;

/// The chunks a recipe takes from the old version here, read a run at a time (chunks next to
/// each other there, in the recipe's order) and each verified.
struct OldRuns<'a> {
    file: Option<&'a File>,
    here: &'a HashMap<Id, (u64, u32)>,
    chunks: &'a [ferry_format::ChunkRef],
    /// The run read: the recipe's chunks `first..end`, from offset `at` of the old file.
    buf: Vec<u8>,
    first: usize,
    end: usize,
    at: u64,
}

impl<'a> OldRuns<'a> {
    fn new(
        file: Option<&'a File>,
        here: &'a HashMap<Id, (u64, u32)>,
        chunks: &'a [ferry_format::ChunkRef],
    ) -> Self {
        OldRuns {
            file,
            here,
            chunks,
            buf: vec![],
            first: 0,
            end: 0,
            at: 0,
        }
    }

    /// The recipe's chunk `i` from the old version, if it holds it there (read and hashed
    /// again: a file changed since it was cut holds other bytes). Asked in increasing order.
    fn chunk(&mut self, i: usize) -> Option<&[u8]> {
        let c = &self.chunks[i];
        let &(off, len) = self.here.get(&c.id)?;
        // A chunk of the run read is where the run put it (it was taken in by its offset).
        if !(self.first..self.end).contains(&i) {
            self.read_run(i, off).ok()?;
        }
        let from = (off - self.at) as usize;
        let data = self.buf.get(from..from + len as usize)?;
        c.id.matches(data).then_some(data)
    }

    /// Reads the run of chunks from `i` (at `off` in the old file) that follow each other
    /// there, up to [`OLD_RUN`] bytes.
    fn read_run(&mut self, i: usize, off: u64) -> std::io::Result<()> {
        let (mut end, mut next, mut bytes) = (i, off, 0u64);
        while let Some(c) = self.chunks.get(end) {
            match self.here.get(&c.id) {
                Some(&(o, l)) if o == next && (bytes == 0 || bytes + l as u64 <= OLD_RUN) => {
                    next += l as u64;
                    bytes += l as u64;
                    end += 1;
                }
                _ => break,
            }
        }
        (self.first, self.end, self.at) = (i, end, off);
        self.buf.resize(bytes as usize, 0);
        let file = self
            .file
            .ok_or_else(|| std::io::Error::other("no old version"))?;
        std::os::unix::fs::FileExt::read_exact_at(file, &mut self.buf, off).inspect_err(|_| {
            self.end = self.first;
        })
    }
}

/// The directory a file goes into (made if need be).
pub(crate) fn parent_dir(local: &Path) -> &Path {
    local
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// A temporary file beside the job's destination (its directory made if need be), to be
/// renamed over it once whole: `.ferry-tmp-` and six random characters, so that what a crash
/// (or kill -9) leaves is plainly Ferry's.
pub(crate) fn temp_beside(j: &FileJob) -> Result<Temp, GetError> {
    let dir = parent_dir(&j.local);
    let fd = dest::make_dirs(&j.root, dir).map_err(GetError::local("create directory", dir))?;
    Temp::new_in(fd, ".ferry-tmp-").map_err(GetError::local("create a temporary file in", dir))
}

/// Gives a file written in full to `tmp` (a temporary, or a partial file taken over) its mode
/// and mtime, and renames it over its destination, durably.
pub(crate) fn install(mut tmp: Temp, j: &FileJob, stats: &mut GetStats) -> Result<(), GetError> {
    tmp.synced_early()
        .map_err(GetError::local("fsync", &j.local))?;
    install_all(vec![(tmp, j)], stats)
}

/// Files written in full wait to be installed together, this many at most.
pub(crate) const INSTALL_BATCH: usize = 64;

/// Threads that make a batch of files durable.
const SYNC_THREADS: usize = 8;

/// Installs files written in full (each early sync waited for): gives each its mode and
/// mtime and makes it durable, then renames each over its destination, then syncs each
/// directory once. Each file is still renamed only once its bytes are on disk, and the call
/// returns once every rename is. The files are synced by threads at once, so that one
/// journal commit serves many: 126 files of 30 KB, on this machine's ext4, took 81-109 ms
/// one at a time (a sync of the file and of its directory each), 30-53 ms so.
pub(crate) fn install_all(
    files: Vec<(Temp, &FileJob)>,
    stats: &mut GetStats,
) -> Result<(), GetError> {
    if files.len() == 1 {
        settle(files[0].0.file(), files[0].1)?;
    } else {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed = std::sync::Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..SYNC_THREADS.min(files.len()) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((tmp, j)) = files.get(i) else { break };
                    if let Err(e) = settle(tmp.file(), j) {
                        failed
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_or_insert(e);
                        break;
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
    }
    let mut dirs = HashMap::new();
    for (tmp, j) in files {
        let name = j.local.file_name().ok_or_else(|| GetError::Local {
            op: "install",
            path: j.local.clone(),
            error: std::io::Error::other("no file name"),
        })?;
        let dir = tmp
            .rename_unsynced(name)
            .map_err(GetError::local("rename into", &j.local))?;
        dirs.entry(parent_dir(&j.local).to_path_buf())
            .or_insert(dir);
        stats.files += 1;
    }
    for (path, dir) in dirs {
        rustix::fs::fsync(&dir).map_err(|e| GetError::local("fsync", &path)(e.into()))?;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_format::{ChunkRef, HashAlg};

    fn chunk(fill: u8, len: usize) -> (Vec<u8>, ChunkRef) {
        let data = vec![fill; len];
        let id = Id::hash(HashAlg::Blake3, &data);
        (
            data,
            ChunkRef {
                id,
                len: len as u32,
            },
        )
    }

    /// Chunks next to each other in the old version come in one read, each verified: one
    /// changed there since it was cut is not taken, and its neighbours still are; chunks out
    /// of the old order, and one the old version never held, are found as well or not at all.
    #[test]
    fn old_chunks_come_a_run_at_a_time_each_verified() {
        let t = tempfile::tempdir().unwrap();
        let parts: Vec<_> = (1..=5u8).map(|i| chunk(i, 1000 + i as usize)).collect();
        let mut bytes: Vec<u8> = parts.iter().flat_map(|(d, _)| d.clone()).collect();
        let mut here = HashMap::new();
        let mut off = 0u64;
        for (d, c) in &parts {
            here.insert(c.id, (off, c.len));
            off += d.len() as u64;
        }
        // The third chunk changed in the file after it was cut.
        let third = here[&parts[2].1.id].0 as usize;
        bytes[third + 10] ^= 1;
        let path = t.path().join("old");
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        let (_, absent) = chunk(9, 500);
        // In the old order, then the second again (before the run read), then one never held.
        let refs: Vec<ChunkRef> = [0, 1, 2, 3, 4, 1]
            .iter()
            .map(|&k| parts[k].1)
            .chain([absent])
            .collect();
        let mut old = OldRuns::new(Some(&file), &here, &refs);
        let got: Vec<Option<Vec<u8>>> = (0..refs.len())
            .map(|i| old.chunk(i).map(|d| d.to_vec()))
            .collect();
        assert_eq!(got[0].as_deref(), Some(&parts[0].0[..]));
        assert_eq!(got[1].as_deref(), Some(&parts[1].0[..]));
        assert_eq!(got[2], None, "a changed chunk is not taken");
        assert_eq!(got[3].as_deref(), Some(&parts[3].0[..]));
        assert_eq!(got[4].as_deref(), Some(&parts[4].0[..]));
        assert_eq!(got[5].as_deref(), Some(&parts[1].0[..]));
        assert_eq!(got[6], None);
        // The first five came in one read: the run covers them all.
        let mut one = OldRuns::new(Some(&file), &here, &refs);
        one.chunk(0).unwrap();
        assert_eq!((one.first, one.end), (0, 5));
        // No old file: nothing from it.
        let mut none = OldRuns::new(None, &here, &refs);
        assert!(none.chunk(0).is_none());
    }
}
