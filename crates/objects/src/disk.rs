//! Where the store's bytes go: real files, or (for crash tests) a simulated disk that loses
//! every write not yet synced when it "crashes", the way LazyFS does, and can be told to crash
//! at its N-th write or sync.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io;
use std::ops::Bound;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A file of the store: positioned reads and writes, and a sync that makes them durable.
#[allow(clippy::len_without_is_empty)]
pub trait DiskFile: Send + Sync + fmt::Debug {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()>;
    fn len(&self) -> io::Result<u64>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    fn sync(&self) -> io::Result<()>;
}

/// A directory of such files (and the index's backend).
pub trait Disk: Send + Sync + fmt::Debug {
    /// Opens (creating if need be) the file `name`; a new file is durable in the directory
    /// before this returns.
    fn open(&self, name: &str) -> io::Result<Arc<dyn DiskFile>>;
    /// Whether `name` exists.
    fn exists(&self, name: &str) -> bool;
    /// The redb backend for the index file `name`.
    fn backend(&self, name: &str) -> io::Result<Box<dyn redb::StorageBackend>>;
}

/// Real files in a directory.
#[derive(Debug)]
pub struct Dir(pub PathBuf);

#[derive(Debug)]
struct Real(File);

impl DiskFile for Real {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(data, offset)
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn sync(&self) -> io::Result<()> {
        self.0.sync_data()
    }
}

impl Disk for Dir {
    fn open(&self, name: &str) -> io::Result<Arc<dyn DiskFile>> {
        let path = self.0.join(name);
        let existed = path.exists();
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        if !existed {
            File::open(&self.0)?.sync_all()?;
        }
        Ok(Arc::new(Real(f)))
    }

    fn exists(&self, name: &str) -> bool {
        self.0.join(name).exists()
    }

    fn backend(&self, name: &str) -> io::Result<Box<dyn redb::StorageBackend>> {
        let path = self.0.join(name);
        if !path.exists() {
            // Made whole beside, then renamed: a crash while redb writes a new index's first
            // pages must not leave one that is "not a redb database" (the store would never
            // open again).
            let tmp = self.0.join(format!("{name}.tmp"));
            match std::fs::remove_file(&tmp) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            drop(
                redb::Database::builder()
                    .create(&tmp)
                    .map_err(io::Error::other)?,
            );
            File::open(&tmp)?.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            File::open(&self.0)?.sync_all()?;
        }
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let b = redb::backends::FileBackend::new(f).map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Box::new(b))
    }
}

impl Dir {
    pub fn path(&self) -> &Path {
        &self.0
    }
}

/// A simulated disk: each file has a durable image and the writes since its last sync. A crash
/// ([`Sim::crash`]) drops those writes; [`Sim::fail_after`] makes the N-th write or sync from
/// now on fail, and every one after it (the machine has stopped).
#[derive(Debug, Clone, Default)]
pub struct Sim(Arc<Mutex<SimState>>);

#[derive(Debug, Default)]
struct SimState {
    files: HashMap<String, SimFile>,
    /// Writes and syncs left before the crash; `None`: no crash planned.
    left: Option<u64>,
    /// Writes and syncs done, counted for planning crashes.
    ops: u64,
}

#[derive(Debug, Default, Clone)]
struct SimFile {
    durable: Vec<u8>,
    /// Durable plus the writes not yet synced.
    current: Vec<u8>,
}

impl Sim {
    pub fn new() -> Sim {
        Sim::default()
    }

    /// Writes and syncs so far.
    pub fn ops(&self) -> u64 {
        self.0.lock().expect("sim").ops
    }

    /// The `n`-th write or sync from now (0: the next) fails, and all after it.
    pub fn fail_after(&self, n: u64) {
        self.0.lock().expect("sim").left = Some(n);
    }

    /// The power goes: every file goes back to what was synced; nothing fails any more.
    pub fn crash(&self) {
        let mut s = self.0.lock().expect("sim");
        for f in s.files.values_mut() {
            f.current = f.durable.clone();
        }
        s.left = None;
    }

    fn op(&self, name: &str, f: impl FnOnce(&mut SimFile)) -> io::Result<()> {
        let mut s = self.0.lock().expect("sim");
        s.ops += 1;
        match &mut s.left {
            Some(0) => return Err(io::Error::other("the simulated machine has crashed")),
            Some(n) => *n -= 1,
            None => {}
        }
        f(s.files.entry(name.to_string()).or_default());
        Ok(())
    }

    fn with<T>(&self, name: &str, f: impl FnOnce(&SimFile) -> T) -> T {
        let s = self.0.lock().expect("sim");
        f(s.files.get(name).unwrap_or(&SimFile::default()))
    }
}

#[derive(Debug)]
struct SimHandle {
    sim: Sim,
    name: String,
}

impl DiskFile for SimHandle {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.sim.with(&self.name, |f| {
            let end = offset as usize + buf.len();
            if end > f.current.len() {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "past the end"));
            }
            buf.copy_from_slice(&f.current[offset as usize..end]);
            Ok(())
        })
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.sim.op(&self.name, |f| {
            let end = offset as usize + data.len();
            if f.current.len() < end {
                f.current.resize(end, 0);
            }
            f.current[offset as usize..end].copy_from_slice(data);
        })
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.sim.with(&self.name, |f| f.current.len() as u64))
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.sim
            .op(&self.name, |f| f.current.resize(len as usize, 0))
    }
    fn sync(&self) -> io::Result<()> {
        self.sim.op(&self.name, |f| f.durable = f.current.clone())
    }
}

impl redb::StorageBackend for SimHandle {
    fn len(&self) -> Result<u64, io::Error> {
        DiskFile::len(self)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.read_at(out, offset)
    }
    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        DiskFile::set_len(self, len)
    }
    fn sync_data(&self) -> Result<(), io::Error> {
        self.sync()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.write_at(data, offset)
    }
}

impl Disk for Sim {
    fn open(&self, name: &str) -> io::Result<Arc<dyn DiskFile>> {
        // A new file's name is durable at once (the real one syncs its directory).
        self.0
            .lock()
            .expect("sim")
            .files
            .entry(name.to_string())
            .or_default();
        Ok(Arc::new(SimHandle {
            sim: self.clone(),
            name: name.to_string(),
        }))
    }

    fn exists(&self, name: &str) -> bool {
        self.0.lock().expect("sim").files.contains_key(name)
    }

    fn backend(&self, name: &str) -> io::Result<Box<dyn redb::StorageBackend>> {
        self.open(name)?;
        Ok(Box::new(SimHandle {
            sim: self.clone(),
            name: name.to_string(),
        }))
    }
}

/// Any backend, as redb takes one.
#[derive(Debug)]
pub struct Backend(pub Box<dyn redb::StorageBackend>);

impl redb::StorageBackend for Backend {
    fn len(&self) -> Result<u64, io::Error> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.0.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> Result<(), io::Error> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.0.write(offset, data)
    }
    fn close(&self) -> Result<(), io::Error> {
        self.0.close()
    }
    fn try_lock_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.0.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.0.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), redb::BackendError> {
        self.0.lock_range(start, end)
    }
    fn lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.0.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), redb::BackendError> {
        self.0.unlock_range(start, end)
    }
    fn query_lock_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.0.query_lock_range(start, end)
    }
}
