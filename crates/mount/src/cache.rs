//! The whole-file cache (LBFS §2.2): each remote file that was opened here has a copy on the
//! local disk, read and written at local speed, with a small record beside it saying which
//! server version the copy is, or that it holds local changes not yet written back.
//!
//! Layout under the cache directory (mode 0700):
//!
//! ```text
//! files/<k>       the copy (mode 0600), where <k> is 32 hex digits of BLAKE3 over the path
//! files/<k>.meta  its record, JSON: {"path": [bytes], "version": u64 | null, "dirty": bool}
//! trash/<n>       copies and records removed, until deleted (in the background)
//! ```
//!
//! A record saying dirty is replaced atomically (temporary file, rename); others are rewritten
//! in place, where a torn one counts as none (see `set_meta`). A copy is marked dirty before the
//! first byte of a local change reaches it, so a crash can never leave changed bytes labelled
//! as a server version; a fetched copy replaces the old one atomically and only then is its
//! record rewritten, so at worst a record names an older version than the copy holds (server
//! versions never repeat, so that only costs a fetch). Dirty copies survive restarts and are
//! written back when the mount next runs.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use ferry_proto::WirePath;
use serde::{Deserialize, Serialize};

/// What the cache knows of one copy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Meta {
    pub path: Vec<u8>,
    /// The server's version this copy is (clean), or the one its local changes were made
    /// against (dirty; `None`: the file did not exist on the server).
    pub version: Option<u64>,
    pub dirty: bool,
}

/// Records kept in memory at most (a few hundred bytes each): past it they are forgotten, and
/// read from the disk again as they are used.
const KNOWN_RECORDS: usize = 64 << 10;

/// Notes `m` as the record under `key` in `known`, within [`KNOWN_RECORDS`].
fn remember(
    known: &mut std::collections::HashMap<String, Option<Meta>>,
    key: String,
    m: Option<Meta>,
) {
    if known.len() >= KNOWN_RECORDS && !known.contains_key(&key) {
        known.clear();
    }
    known.insert(key, m);
}

/// A removed copy with no more than this allocated is deleted at once, not put in the trash.
const DELETE_AT_ONCE: u64 = 64 << 10;

pub(crate) struct FileCache {
    dir: PathBuf,
    /// The records as this process last read or wrote them, by key (`None`: none there). The
    /// directory is one mount's alone (its chunk store, beside, is locked), so what was written
    /// here is what is there: a record is read from the disk once, and one rewritten as it
    /// already is, is not (each close, chmod and rename of a small file through the mount read
    /// and rewrote records: a sixth of the mount's work in `rsync -a`).
    known: std::sync::Mutex<std::collections::HashMap<String, Option<Meta>>>,
    trash: PathBuf,
    /// Names given in the trash so far, and whether anything was put there since it was last
    /// emptied.
    trashed: std::sync::atomic::AtomicU64,
    full: std::sync::atomic::AtomicBool,
    /// Records written so far.
    written: std::sync::atomic::AtomicU64,
}

impl FileCache {
    pub(crate) fn open(root: &Path) -> io::Result<FileCache> {
        let dir = root.join("files");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        fs::set_permissions(root, fs::Permissions::from_mode(0o700))?;
        let trash = root.join("trash");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&trash)?;
        let cache = FileCache {
            dir,
            known: Default::default(),
            trash,
            trashed: Default::default(),
            full: std::sync::atomic::AtomicBool::new(true),
            written: Default::default(),
        };
        cache.empty_trash();
        Ok(cache)
    }

    fn key(path: &WirePath) -> String {
        let h = blake3::hash(path.as_bytes());
        hex::encode(&h.as_bytes()[..16])
    }

    /// Where the copy of `path` lives (it may not exist).
    pub(crate) fn data(&self, path: &WirePath) -> PathBuf {
        self.dir.join(Self::key(path))
    }

    fn meta_path(&self, path: &WirePath) -> PathBuf {
        self.dir.join(format!("{}.meta", Self::key(path)))
    }

    /// The record of `path`'s copy; `None` when there is none, it cannot be read, or it is
    /// another path's (a key collision).
    pub(crate) fn meta(&self, path: &WirePath) -> Option<Meta> {
        let key = Self::key(path);
        let mut known = self.known();
        let m = match known.get(&key) {
            Some(m) => m.clone(),
            None => {
                let m = fs::read(self.dir.join(format!("{key}.meta")))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Meta>(&b).ok());
                remember(&mut known, key, m.clone());
                m
            }
        };
        m.filter(|m| m.path == path.as_bytes())
    }

    fn known(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Option<Meta>>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes that `path`'s record is now `m` (`None`: gone).
    fn note(&self, path: &WirePath, m: Option<Meta>) {
        remember(&mut self.known(), Self::key(path), m);
    }

    /// How many records were written (a measure of the mount's own work, for tests).
    pub(crate) fn records_written(&self) -> u64 {
        self.written.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records `path`'s copy. A record that says dirty over one that exists is replaced
    /// atomically (temporary file, rename; not fsynced: the record is a hint, and the ordering
    /// rules in the module docs keep every crash outcome safe). Any other is rewritten in place
    /// (a tenth of the time, and no inode made and freed per close): a record torn by a crash
    /// does not parse and counts as none, which for a clean copy costs a fetch, and for a new
    /// dirty one (made before its first change) loses nothing.
    pub(crate) fn set_meta(
        &self,
        path: &WirePath,
        version: Option<u64>,
        dirty: bool,
    ) -> io::Result<()> {
        let m = Meta {
            path: path.as_bytes().to_vec(),
            version,
            dirty,
        };
        // Held while the record is written, so what is noted is what is there.
        let mut known = self.known();
        let key = Self::key(path);
        if known.get(&key) == Some(&Some(m.clone())) {
            return Ok(());
        }
        let r = self.write_meta(path, &m);
        self.written
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match r {
            Ok(()) => remember(&mut known, key, Some(m)),
            // Unknown: a failed write may have left either.
            Err(_) => drop(known.remove(&key)),
        }
        r
    }

    fn write_meta(&self, path: &WirePath, m: &Meta) -> io::Result<()> {
        let dirty = m.dirty;
        let bytes = serde_json::to_vec(m).map_err(io::Error::other)?;
        let target = self.meta_path(path);
        let open = |p: &Path| {
            fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(p)
        };
        if !dirty {
            let f = open(&target)?;
            f.write_all_at(&bytes, 0)?;
            return f.set_len(bytes.len() as u64);
        }
        // A dirty record where there is none (every file made here): made exclusively, in
        // place, with no look first.
        match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&target)
        {
            Ok(f) => return f.write_all_at(&bytes, 0),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let tmp = target.with_extension("meta.tmp");
        let f = open(&tmp)?;
        f.set_len(0)?;
        f.write_all_at(&bytes, 0)?;
        drop(f);
        fs::rename(&tmp, &target)
    }

    /// Makes `path`'s record durable (it, and its name in the directory).
    pub(crate) fn sync_meta(&self, path: &WirePath) -> io::Result<()> {
        File::open(self.meta_path(path))?.sync_all()?;
        File::open(&self.dir)?.sync_all()
    }

    /// Makes `path`'s copy and record durable: local changes kept for a later write-back
    /// survive a crash whole.
    pub(crate) fn keep(&self, path: &WirePath) -> io::Result<()> {
        File::open(self.data(path))?.sync_all()?;
        self.sync_meta(path)
    }

    /// Notes that `path`'s copy was used now (eviction takes the least recently used first).
    pub(crate) fn touch(&self, path: &WirePath) {
        if let Ok(f) = File::options().write(true).open(self.meta_path(path)) {
            let _ = f.set_modified(SystemTime::now());
        }
    }

    /// Removes `path`'s copy and record. The record, and a copy of a few blocks, are deleted
    /// at once; a larger copy is only renamed away, its blocks freed by
    /// [`empty_trash`](Self::empty_trash) (freeing many blocks can wait on the disk: a file
    /// system mounted with `discard` trims each extent as it goes, and `rm -rf` through the
    /// mount waited on it). Renaming every copy cost `rm -rf` of small files twice the work: a
    /// third of the mount's time went to renames into the trash, a sixth to emptying it.
    pub(crate) fn remove(&self, path: &WirePath) {
        use std::os::unix::fs::MetadataExt;
        use std::sync::atomic::Ordering;
        {
            let mut known = self.known();
            let _ = fs::remove_file(self.meta_path(path));
            remember(&mut known, Self::key(path), None);
        }
        let data = self.data(path);
        match fs::symlink_metadata(&data) {
            Ok(m) if m.blocks() * 512 <= DELETE_AT_ONCE => {
                let _ = fs::remove_file(&data);
            }
            Ok(_) => {
                let n = self.trashed.fetch_add(1, Ordering::Relaxed);
                if fs::rename(&data, self.trash.join(n.to_string())).is_ok() {
                    self.full.store(true, Ordering::Release);
                }
            }
            Err(_) => {}
        }
    }

    /// Deletes what [`remove`](Self::remove) put in the trash.
    pub(crate) fn empty_trash(&self) {
        if !self.full.swap(false, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        for e in fs::read_dir(&self.trash).into_iter().flatten().flatten() {
            let _ = fs::remove_file(e.path());
        }
    }

    /// Moves `from`'s copy and record to `to` (when `from` has a copy).
    pub(crate) fn rename(&self, from: &WirePath, to: &WirePath) -> io::Result<()> {
        let Some(m) = self.meta(from) else {
            self.remove(to);
            return Ok(());
        };
        // The record goes last: until it exists, `to` has no copy.
        let _ = fs::remove_file(self.meta_path(to));
        self.note(to, None);
        fs::rename(self.data(from), self.data(to))?;
        self.set_meta(to, m.version, m.dirty)?;
        let _ = fs::remove_file(self.meta_path(from));
        self.note(from, None);
        Ok(())
    }

    /// Every record of a dirty copy: local changes not yet written back.
    pub(crate) fn dirty(&self) -> Vec<Meta> {
        self.records()
            .into_iter()
            .filter_map(|(_, m, _)| m.dirty.then_some(m))
            .collect()
    }

    fn records(&self) -> Vec<(PathBuf, Meta, SystemTime)> {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return vec![];
        };
        let mut out = vec![];
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "meta") {
                let used = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                if let Some(m) = fs::read(&p)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Meta>(&b).ok())
                {
                    out.push((p, m, used));
                }
            }
        }
        out
    }

    /// Bytes of all copies.
    pub(crate) fn size(&self) -> u64 {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return 0;
        };
        rd.flatten()
            .filter(|e| e.path().extension().is_none())
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    }

    /// Evicts clean copies, least recently used first, until the copies take at most `max`
    /// bytes; never one that `busy` says is in use. Returns the bytes evicted.
    pub(crate) fn trim(&self, max: u64, busy: impl Fn(&[u8]) -> bool) -> u64 {
        let mut total = self.size();
        if total <= max {
            return 0;
        }
        let mut recs = self.records();
        recs.sort_by_key(|r| r.2);
        let mut freed = 0;
        for (meta_path, m, _) in recs {
            if total <= max {
                break;
            }
            if m.dirty || busy(&m.path) {
                continue;
            }
            let data = meta_path.with_extension("");
            let len = fs::metadata(&data).map(|m| m.len()).unwrap_or(0);
            let _ = fs::remove_file(&meta_path);
            if let Ok(p) = WirePath::new(m.path.clone()) {
                self.note(&p, None);
            }
            let _ = fs::remove_file(&data);
            total = total.saturating_sub(len);
            freed += len;
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> WirePath {
        WirePath::new(s.as_bytes().to_vec()).unwrap()
    }

    /// A removed copy is gone from its place at once (a new one there is never mistaken for
    /// it). A small one is deleted; a large one's blocks are freed when the trash is emptied,
    /// which leaves the new one be; a trash left by a run that stopped is emptied by the next.
    #[test]
    fn a_removed_copy_goes_at_once_and_a_large_ones_blocks_with_the_trash() {
        let t = tempfile::tempdir().unwrap();
        let c = FileCache::open(t.path()).unwrap();
        let count = |d: &str| fs::read_dir(t.path().join(d)).unwrap().count();
        fs::write(c.data(&p("small")), b"old").unwrap();
        c.set_meta(&p("small"), Some(1), false).unwrap();
        c.remove(&p("small"));
        assert_eq!(c.meta(&p("small")), None);
        assert!(!c.data(&p("small")).exists());
        assert_eq!(count("trash"), 0);
        let large = vec![7u8; DELETE_AT_ONCE as usize + 4096];
        fs::write(c.data(&p("a")), &large).unwrap();
        c.set_meta(&p("a"), Some(1), false).unwrap();
        c.remove(&p("a"));
        assert_eq!(c.meta(&p("a")), None);
        assert!(!c.data(&p("a")).exists());
        assert_eq!(count("trash"), 1);
        fs::write(c.data(&p("a")), b"new").unwrap();
        c.set_meta(&p("a"), Some(2), false).unwrap();
        c.empty_trash();
        assert_eq!(count("trash"), 0);
        assert_eq!(fs::read(c.data(&p("a"))).unwrap(), b"new");
        fs::write(c.data(&p("a")), &large).unwrap();
        c.remove(&p("a"));
        drop(c);
        assert_eq!(count("trash"), 1);
        let _again = FileCache::open(t.path()).unwrap();
        assert_eq!(count("trash"), 0);
    }

    #[test]
    fn records_round_trip_move_and_evict_only_clean_idle_copies() {
        let t = tempfile::tempdir().unwrap();
        let c = FileCache::open(t.path()).unwrap();
        assert_eq!(c.meta(&p("a")), None);
        fs::write(c.data(&p("a")), vec![1u8; 100]).unwrap();
        c.set_meta(&p("a"), Some(7), false).unwrap();
        fs::write(c.data(&p("b")), vec![2u8; 100]).unwrap();
        c.set_meta(&p("b"), Some(8), true).unwrap();
        fs::write(c.data(&p("c")), vec![3u8; 100]).unwrap();
        c.set_meta(&p("c"), Some(9), false).unwrap();
        assert_eq!(c.meta(&p("a")).unwrap().version, Some(7));
        assert_eq!(c.dirty().len(), 1);
        c.rename(&p("a"), &p("d/e")).unwrap();
        assert_eq!(c.meta(&p("a")), None);
        assert_eq!(c.meta(&p("d/e")).unwrap().version, Some(7));
        assert_eq!(fs::read(c.data(&p("d/e"))).unwrap(), vec![1u8; 100]);
        // Over budget: the dirty copy and the busy one stay.
        assert_eq!(c.trim(50, |path| path == b"c"), 100);
        assert_eq!(c.meta(&p("d/e")), None);
        assert!(c.meta(&p("b")).is_some() && c.meta(&p("c")).is_some());
        assert_eq!(c.size(), 200);
    }

    /// A record rewritten in place and torn by a crash counts as none: cut short, or the new
    /// (shorter) record with the old one's tail left behind.
    #[test]
    fn a_torn_record_counts_as_none() {
        let t = tempfile::tempdir().unwrap();
        let c = FileCache::open(t.path()).unwrap();
        let long = p("a/somewhat/longer/path");
        c.set_meta(&long, Some(123_456_789), true).unwrap();
        let whole = fs::read(c.meta_path(&long)).unwrap();
        c.set_meta(&long, Some(7), false).unwrap();
        let new = fs::read(c.meta_path(&long)).unwrap();
        assert!(new.len() < whole.len());
        assert_eq!(c.meta(&long).unwrap().version, Some(7));
        // The write done, the truncation not (read as the next mount, after the crash).
        let mut torn = new.clone();
        torn.extend_from_slice(&whole[new.len()..]);
        fs::write(c.meta_path(&long), &torn).unwrap();
        assert_eq!(FileCache::open(t.path()).unwrap().meta(&long), None);
        // The write cut short.
        fs::write(c.meta_path(&long), &new[..new.len() / 2]).unwrap();
        let c = FileCache::open(t.path()).unwrap();
        assert_eq!(c.meta(&long), None);
        // A dirty record over an existing one goes by rename: never torn.
        c.set_meta(&long, Some(8), true).unwrap();
        assert!(c.meta(&long).unwrap().dirty);
        assert!(!c.meta_path(&long).with_extension("meta.tmp").exists());
    }

    /// A record is read from the disk once and not rewritten as it already is (a dirty one
    /// would go by a rename each time); one changed, moved or removed here is read back as
    /// it is now, by this mount and the next.
    #[test]
    fn records_are_known_without_the_disk_and_written_only_when_changed() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let c = FileCache::open(t.path()).unwrap();
        let a = p("a");
        c.set_meta(&a, Some(1), false).unwrap();
        c.set_meta(&a, Some(1), true).unwrap();
        let ino = fs::metadata(c.meta_path(&a)).unwrap().ino();
        c.set_meta(&a, Some(1), true).unwrap();
        assert_eq!(fs::metadata(c.meta_path(&a)).unwrap().ino(), ino);
        c.set_meta(&a, Some(2), true).unwrap();
        assert_ne!(fs::metadata(c.meta_path(&a)).unwrap().ino(), ino);
        fs::write(c.data(&a), b"x").unwrap();
        c.rename(&a, &p("b")).unwrap();
        c.remove(&p("c"));
        for c in [&c, &FileCache::open(t.path()).unwrap()] {
            assert_eq!(c.meta(&a), None);
            assert_eq!(c.meta(&p("b")).unwrap().version, Some(2));
            assert_eq!(c.meta(&p("c")), None);
        }
        c.remove(&p("b"));
        assert_eq!(c.meta(&p("b")), None);
        assert_eq!(FileCache::open(t.path()).unwrap().meta(&p("b")), None);
    }

    /// The records kept in memory stay within their bound, however many paths are used.
    #[test]
    fn records_kept_in_memory_are_bounded() {
        let mut known = std::collections::HashMap::new();
        for i in 0..KNOWN_RECORDS + 10 {
            remember(&mut known, i.to_string(), None);
            assert!(known.len() <= KNOWN_RECORDS);
        }
        assert!(known.contains_key(&(KNOWN_RECORDS + 9).to_string()));
    }
}
