//! The user's list of lookaside devices, in the order added (the order they are searched), with
//! what each has supplied so far: `lookaside.json` in Ferry's data directory, changed only
//! under a lock and replaced atomically, so two commands finishing at once both count.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

const FILE: &str = "lookaside.json";
const LOCK: &str = "lookaside.lock";
const VERSION: u32 = 1;

/// What a device has supplied, over every fetch since it was added.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Supplied {
    /// Requests a fetch made of it.
    #[serde(default)]
    pub requests: u64,
    /// Chunks it delivered, and their bytes.
    pub chunks: u64,
    pub bytes: u64,
    /// Chunks asked of it that it did not have (or had only in a changed file).
    pub misses: u64,
    /// Chunks it read that did not match their id, and their bytes.
    pub rejected: u64,
    pub rejected_bytes: u64,
    /// Files found changed since they were indexed.
    pub stale_files: u64,
}

impl Supplied {
    pub fn add(&mut self, o: &Supplied) {
        self.requests += o.requests;
        self.chunks += o.chunks;
        self.bytes += o.bytes;
        self.misses += o.misses;
        self.rejected += o.rejected;
        self.rejected_bytes += o.rejected_bytes;
        self.stale_files += o.stale_files;
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The device's root: an absolute path.
    pub path: PathBuf,
    #[serde(default)]
    pub supplied: Supplied,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Doc {
    version: u32,
    devices: Vec<Entry>,
}

/// See the module documentation.
pub struct Registry {
    dir: PathBuf,
}

impl Registry {
    /// The registry kept in `dir` (Ferry's data directory).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Registry { dir: dir.into() }
    }

    /// The devices, in search order.
    pub fn list(&self) -> io::Result<Vec<Entry>> {
        Ok(self.read()?.devices)
    }

    /// Adds a device at the end; false if it was there already.
    pub fn add(&self, path: &Path) -> io::Result<bool> {
        self.change(|d| {
            if d.devices.iter().any(|e| e.path == path) {
                return false;
            }
            d.devices.push(Entry {
                path: path.to_path_buf(),
                supplied: Supplied::default(),
            });
            true
        })
    }

    /// Removes a device; false if it was not there.
    pub fn remove(&self, path: &Path) -> io::Result<bool> {
        self.change(|d| {
            let before = d.devices.len();
            d.devices.retain(|e| e.path != path);
            d.devices.len() != before
        })
    }

    /// Removes every device; returns how many there were.
    pub fn clear(&self) -> io::Result<usize> {
        self.change(|d| std::mem::take(&mut d.devices).len())
    }

    /// Adds what a fetch had from each device (by path; devices removed meanwhile are skipped).
    pub fn count(&self, supplied: &[(PathBuf, Supplied)]) -> io::Result<()> {
        if supplied.is_empty() {
            return Ok(());
        }
        self.change(|d| {
            for (path, s) in supplied {
                if let Some(e) = d.devices.iter_mut().find(|e| &e.path == path) {
                    e.supplied.add(s);
                }
            }
        })
    }

    fn read(&self) -> io::Result<Doc> {
        let path = self.dir.join(FILE);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Doc {
                    version: VERSION,
                    devices: vec![],
                })
            }
            Err(e) => return Err(e),
        };
        let doc: Doc = serde_json::from_slice(&bytes).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })?;
        if doc.version != VERSION {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: version {} (this build reads {VERSION})",
                    path.display(),
                    doc.version
                ),
            ));
        }
        Ok(doc)
    }

    /// Reads, changes and writes back the registry under its lock.
    fn change<T>(&self, f: impl FnOnce(&mut Doc) -> T) -> io::Result<T> {
        std::fs::create_dir_all(&self.dir)?;
        let lock = File::create(self.dir.join(LOCK))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)?;
        let mut doc = self.read()?;
        let out = f(&mut doc);
        let mut tmp = tempfile::Builder::new()
            .prefix(".lookaside.tmp")
            .tempfile_in(&self.dir)?;
        serde_json::to_writer_pretty(&mut tmp, &doc)?;
        tmp.write_all(b"\n")?;
        tmp.as_file().sync_all()?;
        tmp.persist(self.dir.join(FILE)).map_err(|e| e.error)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_remove_clear_count() {
        let dir = tempfile::tempdir().unwrap();
        let r = Registry::new(dir.path());
        assert!(r.list().unwrap().is_empty());
        assert!(r.add(Path::new("/a")).unwrap());
        assert!(r.add(Path::new("/b")).unwrap());
        assert!(!r.add(Path::new("/a")).unwrap());
        let one = Supplied {
            chunks: 2,
            bytes: 10,
            ..Supplied::default()
        };
        r.count(&[(PathBuf::from("/b"), one.clone())]).unwrap();
        r.count(&[(PathBuf::from("/b"), one)]).unwrap();
        let l = r.list().unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].path, Path::new("/a"));
        assert_eq!((l[1].supplied.chunks, l[1].supplied.bytes), (4, 20));
        assert!(r.remove(Path::new("/a")).unwrap());
        assert!(!r.remove(Path::new("/a")).unwrap());
        assert_eq!(r.clear().unwrap(), 1);
        assert!(r.list().unwrap().is_empty());
    }
}
