//! The local-directory store: append-only pack files and a redb index.
//!
//! ```text
//! DIR/ferry-store        marker: "ferry-store 1\nhash blake3\n"
//! DIR/lock               held (flock) by the process that has the store open
//! DIR/index.redb         the index (a cache of the packs: `rebuild` recreates it)
//! DIR/packs/NNNNNNNN.pack
//! ```
//!
//! **Writing.** A chunk is compressed (zstd, kept raw when that does not pay), appended to the
//! current pack with one positional write, and remembered as *pending*. [`flush`] fsyncs the
//! pack (and, for a new pack, its directory) and then commits the pending entries to the index
//! in one redb transaction, recording how long the pack is known good (`committed`). A failed
//! write truncates the pack back to where the record began; a failed fsync or commit *poisons*
//! the store for writing, because after a failed fsync the kernel may have dropped the data and
//! retrying would acknowledge bytes that are gone.
//!
//! **Crashes.** Bytes past a pack's committed length are a crash's leftovers: on open they are
//! scanned, every whole and valid record is indexed, and the pack is truncated at the first torn
//! one. Nothing the index refers to is ever rewritten in place.
//!
//! **Reading.** Every read recomputes the chunk's hash; a mismatch is recorded in the `damaged`
//! table and returned as [`StoreError::Corrupt`]. Putting the chunk again repairs it.
//!
//! **Garbage.** Objects (recipes) are the roots. [`LocalStore::gc`] drops chunks no recipe
//! names, then rewrites packs whose live fraction fell below a threshold and deletes them only
//! after the copies and the new index are durable.
//!
//! [`flush`]: crate::ChunkStore::flush

mod gc;
mod index;
mod open;
pub(crate) mod pack;
mod scan;
mod writer;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use ferry_format::{HashAlg, Id, Oid, Recipe};
use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata};

use crate::cache::ByteLru;
use crate::{ChunkStore, StoreError, StoreStats, VerifiedChunk};
pub(crate) use index::db_err;
use index::{ckey, Loc, ObjectEntry, CHUNKS, DAMAGED, META, OBJECTS, PACKS, TOMBSTONES};
use pack::{
    encode_record, object_payload, Kind, RecordHeader, PACK_HEADER, PACK_HEADER_LEN,
    RECORD_HEADER_LEN,
};
pub use scan::RebuildReport;
use writer::Writer;

type ChunkTable = redb::ReadOnlyTable<&'static [u8; 16], &'static [u8; 16]>;

const MARKER: &str = "ferry-store";
/// Chunks put and not yet flushed that `find_prefix` scans, at most.
const PENDING_SCAN: usize = 4096;
const MARKER_VERSION: &str = "ferry-store 1";

/// Tuning for a [`LocalStore`].
#[derive(Clone, Debug)]
pub struct Options {
    /// Hash algorithm for a new store (an existing store keeps its own).
    pub hash_alg: HashAlg,
    /// RAM cache of recently read chunks, in bytes.
    pub cache_bytes: usize,
    /// A pack is closed and a new one started past this size.
    pub pack_target: u64,
    /// zstd level for chunk payloads; 0 stores them uncompressed.
    pub zstd_level: i32,
    /// Flush by itself after this many bytes were appended, bounding what a crash can lose.
    pub flush_every: u64,
    /// Go on appending to the last pack when the store is opened again (fewer, fuller packs).
    /// A cache turns this off: its packs are the unit [`LocalStore::trim`] evicts, so each
    /// session's data should start a pack of its own.
    pub append_to_last_pack: bool,
    /// Appended records gather in a buffer of this many bytes before they are written to the
    /// pack file (a flush, and a read of one, write them out sooner); a crash loses what is
    /// buffered, as it loses anything not flushed.
    pub write_buffer: usize,
    /// A store another process holds is waited for a moment (up to a second) before
    /// [`StoreError::Locked`]; without this, refused at once (for a caller with somewhere else
    /// to go, such as a server's staging store).
    pub wait_for_lock: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            hash_alg: HashAlg::Blake3,
            cache_bytes: 64 << 20,
            pack_target: 64 << 20,
            zstd_level: 3,
            flush_every: 256 << 20,
            append_to_last_pack: true,
            write_buffer: 1 << 20,
            wait_for_lock: true,
        }
    }
}

/// What [`LocalStore::verify`] found.
#[derive(Clone, Debug, Default)]
pub struct VerifyReport {
    pub chunks_checked: u64,
    pub bytes_checked: u64,
    /// Chunks whose bytes are unreadable or do not match their id: (id, or `prefix:` and the
    /// indexed 16-byte prefix when even the record header is unreadable; what went wrong); and
    /// objects whose recipe in the index is unreadable (their object id; why).
    pub damaged: Vec<(String, String)>,
    /// Chunks a recipe names that the store does not have.
    pub missing: Vec<(Oid, Id)>,
}

/// What [`LocalStore::gc`] did.
#[derive(Clone, Debug, Default)]
pub struct GcReport {
    pub chunks_removed: u64,
    pub chunk_bytes_removed: u64,
    pub packs_rewritten: u64,
    pub pack_bytes_before: u64,
    pub pack_bytes_after: u64,
}

/// What [`LocalStore::trim`] did.
#[derive(Clone, Debug, Default)]
pub struct TrimReport {
    pub packs_evicted: u64,
    pub chunks_removed: u64,
    pub chunk_bytes_removed: u64,
    pub pack_bytes_before: u64,
    pub pack_bytes_after: u64,
}

enum PendingObject {
    Put(Oid, ObjectEntry),
    Remove(Oid, u64, u32),
}

struct State {
    writer: Option<Writer>,
    pending: HashMap<Id, Loc>,
    pending_objects: Vec<PendingObject>,
    retire: Vec<u32>,
    unflushed: u64,
    next_pack: u32,
    next_seq: u64,
    damaged: HashSet<[u8; 16]>,
    poisoned: bool,
}

/// A chunk store in a local directory. See the module documentation.
pub struct LocalStore {
    dir: PathBuf,
    packs_dir: PathBuf,
    index_path: PathBuf,
    alg: HashAlg,
    opts: Options,
    db: index::Db,
    state: Mutex<State>,
    cache: Mutex<ByteLru>,
    readers: Mutex<HashMap<u32, Arc<File>>>,
    /// When each pack's modification time (its last use, for [`LocalStore::trim`]) was last
    /// refreshed by this process.
    touched: Mutex<HashMap<u32, std::time::Instant>>,
    /// Read while reading a pack, written while deleting packs.
    packs_lock: RwLock<()>,
    /// A read snapshot of the chunk table, so lookups skip opening a transaction. Replaced after
    /// each commit that changes the table (lookups of pending chunks go to `State::pending`).
    chunk_table: Mutex<Option<Arc<ChunkTable>>>,
    /// The zstd level chunks are put at now: `Options::zstd_level`, or 0 while the store was
    /// asked to prefer speed ([`ChunkStore::prefer_speed`]).
    level: std::sync::atomic::AtomicI32,
    recovery: RebuildReport,
    _lock: File,
}

fn pack_name(num: u32) -> String {
    format!("{num:08}.pack")
}

fn fsync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(StoreError::io("fsync directory", dir))
}

/// Creates an empty redb index at `path` through a synced temporary file and a rename.
fn new_index(dir: &Path, path: &Path) -> Result<(), StoreError> {
    let tmp = path.with_extension("redb.tmp");
    match fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(StoreError::io("remove", &tmp)(e))
        }
        _ => {}
    }
    drop(crate::index_builder().create(&tmp).map_err(db_err(&tmp))?);
    File::open(&tmp)
        .and_then(|f| f.sync_all())
        .and_then(|()| fs::rename(&tmp, path))
        .map_err(StoreError::io("write", path))?;
    fsync_dir(dir)
}

/// Whether an entry of a store's directory is one a [`LocalStore::create`] cut short leaves (an
/// empty `packs`, the marker's temporary file): such a directory is made a store again.
fn unborn_entry(dir: &Path, name: &std::ffi::OsStr) -> bool {
    let b = name.as_encoded_bytes();
    if (b.starts_with(MARKER.as_bytes()) && b.ends_with(b".tmp")) || name == "index.redb.tmp" {
        return true;
    }
    name == "packs" && fs::read_dir(dir.join(name)).is_ok_and(|mut it| it.next().is_none())
}

impl LocalStore {
    /// Opens the store in `dir`, creating it if `dir` does not exist or is empty (or holds only
    /// what a creation cut short by a crash leaves).
    pub fn open_or_create(dir: impl AsRef<Path>, opts: Options) -> Result<Self, StoreError> {
        let dir = dir.as_ref();
        let unborn = match fs::read_dir(dir) {
            Ok(it) => it
                .map(|e| e.map(|e| unborn_entry(dir, &e.file_name())))
                .collect::<Result<Vec<bool>, _>>()
                .map_err(StoreError::io("read directory", dir))?
                .into_iter()
                .all(|u| u),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => return Err(StoreError::io("read directory", dir)(e)),
        };
        if unborn {
            Self::create(dir, opts)
        } else {
            Self::open(dir, opts)
        }
    }

    /// Creates a new store in `dir` (which may exist, but must be empty).
    pub fn create(dir: impl AsRef<Path>, opts: Options) -> Result<Self, StoreError> {
        let dir = dir.as_ref();
        fs::create_dir_all(dir.join("packs")).map_err(StoreError::io("create directory", dir))?;
        let marker = format!("{MARKER_VERSION}\nhash {}\n", opts.hash_alg.name());
        // A name of this creation's own: two processes creating the store at once (two
        // servers started together) each rename theirs into place, and both open it.
        static CREATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = CREATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!("{MARKER}.{}.{n}.tmp", std::process::id()));
        fs::write(&tmp, marker)
            .and_then(|_| File::open(&tmp)?.sync_all())
            .and_then(|_| fs::rename(&tmp, dir.join(MARKER)))
            .map_err(StoreError::io("write", dir.join(MARKER)))?;
        fsync_dir(dir)?;
        Self::open(dir, opts)
    }

    /// Opens an existing store, recovering from a crash if there was one.
    pub fn open(dir: impl AsRef<Path>, opts: Options) -> Result<Self, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        if opts.pack_target > (2 << 30) {
            return Err(StoreError::NotAStore {
                path: dir,
                why: "pack target over 2 GiB (offsets are 32-bit)".into(),
            });
        }
        let alg = read_marker(&dir)?;
        let lock = lock_store(&dir, opts.wait_for_lock)?;
        let index_path = dir.join("index.redb");
        let packs_dir = dir.join("packs");
        let fresh_index = !index_path.exists();
        if fresh_index {
            // Made whole beside, then renamed: a crash while redb writes its first pages must
            // not leave an index that is "not a redb database".
            new_index(&dir, &index_path)?;
        }
        // redb trusts its own pages: damage past its header checks can panic inside it
        // ("unreachable"). Opening is where a damaged index is met; it is an error to repair,
        // not a crash.
        let at = index_path.clone();
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            Self::open_index(dir, packs_dir, index_path, alg, opts, lock, fresh_index)
        }));
        opened.unwrap_or_else(|panic| {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic in the index".into());
            Err(StoreError::Index {
                path: at,
                msg: format!("damaged beyond reading ({why})"),
            })
        })
    }

    fn open_index(
        dir: PathBuf,
        packs_dir: PathBuf,
        index_path: PathBuf,
        alg: HashAlg,
        opts: Options,
        lock: File,
        fresh_index: bool,
    ) -> Result<Self, StoreError> {
        let db = crate::index_builder()
            .create(&index_path)
            .map_err(db_err(&index_path))?;
        let level = opts.zstd_level;
        let mut store = LocalStore {
            dir,
            packs_dir,
            index_path,
            alg,
            cache: Mutex::new(ByteLru::new(opts.cache_bytes)),
            opts,
            db: index::Db::new(db),
            state: Mutex::new(State {
                writer: None,
                pending: HashMap::new(),
                pending_objects: vec![],
                retire: vec![],
                unflushed: 0,
                next_pack: 1,
                next_seq: 1,
                damaged: HashSet::new(),
                poisoned: false,
            }),
            readers: Mutex::new(HashMap::new()),
            touched: Mutex::new(HashMap::new()),
            packs_lock: RwLock::new(()),
            chunk_table: Mutex::new(None),
            level: std::sync::atomic::AtomicI32::new(level),
            recovery: RebuildReport::default(),
            _lock: lock,
        };
        store.init_index(fresh_index)?;
        store.recover()?;
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Rewrites the index file without its free pages (redb grows by copy-on-write and reuses
    /// space only later). Returns the file size before and after. Run after bulk work such as
    /// `gc` or `rebuild`; it takes about a second per million chunks.
    pub fn compact_index(&mut self) -> Result<(u64, u64), StoreError> {
        self.flush()?;
        let size = |p: &Path| fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        let before = size(&self.index_path);
        self.forget_snapshot();
        while self.db.compact().map_err(db_err(&self.index_path))? {}
        Ok((before, size(&self.index_path)))
    }

    /// What opening the store had to recover (all zero after a clean shutdown).
    pub fn recovery(&self) -> &RebuildReport {
        &self.recovery
    }

    fn reader(&self, num: u32) -> Result<Arc<File>, std::io::Error> {
        let mut r = self.readers.lock().unwrap();
        if let Some(f) = r.get(&num) {
            return Ok(f.clone());
        }
        if r.len() >= 64 {
            r.clear();
        }
        let f = Arc::new(File::open(self.packs_dir.join(pack_name(num)))?);
        r.insert(num, f.clone());
        Ok(f)
    }

    /// Reads the chunk record at `loc` and verifies it against the id in its header; returns
    /// that id and the chunk's bytes. An error carries the id too when the header was readable.
    fn read_record(&self, key: &[u8; 16], loc: Loc) -> Result<(Id, Vec<u8>), (Option<Id>, String)> {
        match self.read_record_once(key, loc) {
            // Perhaps not in the file yet: still in the pack writer's buffer.
            Err((None, _)) if self.write_out(loc.pack).is_ok() => self.read_record_once(key, loc),
            r => r,
        }
    }

    /// [`read_record`](Self::read_record) for a caller that holds the state lock.
    fn read_record_locked(
        &self,
        st: &mut State,
        key: &[u8; 16],
        loc: Loc,
    ) -> Result<(Id, Vec<u8>), (Option<Id>, String)> {
        match self.read_record_once(key, loc) {
            Err((None, _)) if self.write_out_locked(st, loc.pack).is_ok() => {
                self.read_record_once(key, loc)
            }
            r => r,
        }
    }

    fn read_record_once(
        &self,
        key: &[u8; 16],
        loc: Loc,
    ) -> Result<(Id, Vec<u8>), (Option<Id>, String)> {
        let _g = self.packs_lock.read().unwrap();
        if loc.stored_len as u64 > pack::MAX_OBJECT_RECORD as u64 {
            return Err((
                None,
                format!("index claims a {}-byte record", loc.stored_len),
            ));
        }
        let f = self
            .reader(loc.pack)
            .map_err(|e| (None, format!("open pack: {e}")))?;
        let mut buf = vec![0u8; RECORD_HEADER_LEN + loc.stored_len as usize];
        f.read_exact_at(&mut buf, loc.offset as u64)
            .map_err(|e| (None, format!("read: {e}")))?;
        let h = RecordHeader::decode(buf[..RECORD_HEADER_LEN].try_into().unwrap())
            .map_err(|e| (None, e))?;
        if !Self::header_matches(&h, key, loc) {
            return Err((None, "record does not match its index entry".into()));
        }
        match pack::decode_payload(&h, &buf[RECORD_HEADER_LEN..]) {
            Ok(data) => Ok((h.id, data)),
            Err(why) => Err((Some(h.id), why)),
        }
    }

    /// The id in the header of the chunk record at `loc`, if it matches its index entry: a
    /// hint, read without the payload (a read of the chunk verifies it).
    fn record_id(&self, key: &[u8; 16], loc: Loc) -> Option<Id> {
        self.record_id_once(key, loc).or_else(|| {
            // Perhaps not in the file yet: still in the pack writer's buffer.
            self.write_out(loc.pack).ok()?;
            self.record_id_once(key, loc)
        })
    }

    fn record_id_once(&self, key: &[u8; 16], loc: Loc) -> Option<Id> {
        let _g = self.packs_lock.read().unwrap();
        let mut buf = [0u8; RECORD_HEADER_LEN];
        self.reader(loc.pack)
            .ok()?
            .read_exact_at(&mut buf, loc.offset as u64)
            .ok()?;
        let h = RecordHeader::decode(&buf).ok()?;
        Self::header_matches(&h, key, loc).then_some(h.id)
    }

    fn header_matches(h: &RecordHeader, key: &[u8; 16], loc: Loc) -> bool {
        h.kind == Kind::Chunk
            && ckey(&h.id) == *key
            && h.stored_len == loc.stored_len
            && h.raw_len == loc.raw_len
    }

    /// Records a use of pack `num` in its modification time, at most once a minute.
    fn touch(&self, num: u32) {
        let now = std::time::Instant::now();
        {
            let mut t = self.touched.lock().unwrap();
            if t.get(&num)
                .is_some_and(|&last| now.duration_since(last) < std::time::Duration::from_secs(60))
            {
                return;
            }
            t.insert(num, now);
        }
        if let Ok(f) = self.reader(num) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
    }

    /// Reads and verifies chunk `id` at `loc`.
    fn read_chunk(&self, id: &Id, loc: Loc) -> Result<Vec<u8>, String> {
        match self.read_record(&ckey(id), loc) {
            Ok((found, data)) if found == *id => Ok(data),
            Ok((found, _)) => Err(format!(
                "index entry leads to chunk {found} (a 128-bit prefix collision)"
            )),
            Err((_, why)) => Err(why),
        }
    }

    fn location(&self, id: &Id) -> Result<Option<Loc>, StoreError> {
        if let Some(l) = self.state.lock().unwrap().pending.get(id) {
            return Ok(Some(*l));
        }
        let table = self.chunk_table()?;
        index::guard(&self.index_path, || {
            Ok(table
                .get(&ckey(id))
                .map_err(db_err(&self.index_path))?
                .map(|v| Loc::decode(v.value())))
        })
    }

    /// The chunk table as of the last commit, opened once per commit.
    fn chunk_table(&self) -> Result<Arc<ChunkTable>, StoreError> {
        index::guard(&self.index_path, || {
            let mut cached = self.chunk_table.lock().unwrap();
            if let Some(t) = &*cached {
                return Ok(t.clone());
            }
            let p = &self.index_path;
            let tx = self.db.begin_read().map_err(db_err(p))?;
            let t = Arc::new(tx.open_table(CHUNKS).map_err(db_err(p))?);
            *cached = Some(t.clone());
            Ok(t)
        })
    }

    /// Where a record is, for messages: `PACK-PATH offset N`.
    fn describe(&self, loc: Loc) -> String {
        format!(
            "{} offset {}",
            self.packs_dir.join(pack_name(loc.pack)).display(),
            loc.offset
        )
    }

    /// Calls `f` with every indexed chunk (key and location), in key order.
    fn for_each_chunk(&self, mut f: impl FnMut([u8; 16], Loc)) -> Result<(), StoreError> {
        index::guard(&self.index_path, || {
            let p = &self.index_path;
            let tx = self.db.begin_read().map_err(db_err(p))?;
            for r in tx
                .open_table(CHUNKS)
                .map_err(db_err(p))?
                .iter()
                .map_err(db_err(p))?
            {
                let (k, v) = r.map_err(db_err(p))?;
                f(*k.value(), Loc::decode(v.value()));
            }
            Ok(())
        })
    }

    /// Calls `f` with every flushed object and its index entry.
    fn for_each_object(
        &self,
        mut f: impl FnMut(Oid, ObjectEntry) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        index::guard(&self.index_path, || {
            let p = &self.index_path;
            let tx = self.db.begin_read().map_err(db_err(p))?;
            for r in tx
                .open_table(OBJECTS)
                .map_err(db_err(p))?
                .iter()
                .map_err(db_err(p))?
            {
                let (k, v) = r.map_err(db_err(p))?;
                let oid = Oid(Id::from_parts(self.alg, *k.value()));
                let e = ObjectEntry::decode(v.value()).ok_or_else(|| StoreError::Index {
                    path: p.clone(),
                    msg: format!("object entry of {oid} is truncated"),
                })?;
                f(oid, e)?;
            }
            Ok(())
        })
    }

    /// Drops the cached read snapshot of the chunk table; call after every commit that changes it.
    fn forget_snapshot(&self) {
        *self.chunk_table.lock().unwrap() = None;
    }

    fn mark_damaged(&self, id: &Id, where_: &str) {
        self.state.lock().unwrap().damaged.insert(ckey(id));
        self.record_damage(&ckey(id), where_);
        tracing::error!(%id, "damaged chunk: {where_}");
    }

    /// Notes damage in the index, so `stats` and later sessions see it.
    fn record_damage(&self, key: &[u8; 16], where_: &str) {
        let r = (|| -> Result<(), redb::Error> {
            let tx = self.db.begin_write()?;
            tx.open_table(DAMAGED)?.insert(key, where_)?;
            tx.commit()?;
            Ok(())
        })();
        if let Err(e) = r {
            tracing::error!("could not record damage: {e}");
        }
    }

    fn check_alg(&self, got: HashAlg) -> Result<(), StoreError> {
        if got != self.alg {
            return Err(StoreError::WrongHashAlg {
                store: self.alg,
                got,
            });
        }
        Ok(())
    }

    /// Appends a whole record to the current pack, rotating packs as needed.
    fn append(&self, st: &mut State, rec: &[u8]) -> Result<(u32, u32), StoreError> {
        if st.poisoned {
            return Err(StoreError::Poisoned {
                path: self.dir.clone(),
            });
        }
        let full = st.writer.as_ref().is_some_and(|w| {
            w.len > PACK_HEADER_LEN && w.len + rec.len() as u64 > self.opts.pack_target
        });
        if full {
            self.flush_locked(st)?;
            self.close_writer(st)?;
        }
        if st.writer.is_none() {
            st.writer = Some(self.new_pack(st)?);
        }
        let w = st.writer.as_mut().unwrap();
        let at = w.append(rec);
        let num = w.num;
        let at = self.written(st, at)?;
        st.unflushed += rec.len() as u64;
        Ok((num, at as u32))
    }

    /// Takes the outcome of writing buffered records of the current pack: records the index
    /// already points at are lost when it failed, so the store is poisoned (nothing more is
    /// committed; reopening it recovers from what the packs hold).
    fn written<T>(&self, st: &mut State, r: std::io::Result<T>) -> Result<T, StoreError> {
        r.map_err(|e| {
            st.poisoned = true;
            let num = st.writer.as_ref().map_or(0, |w| w.num);
            StoreError::io("append to", self.packs_dir.join(pack_name(num)))(e)
        })
    }

    /// Writes out the current pack's buffered records, and appends go to a new pack from now on.
    fn close_writer(&self, st: &mut State) -> Result<(), StoreError> {
        if let Some(w) = st.writer.as_mut() {
            let r = w.write_out();
            self.written(st, r)?;
        }
        st.writer = None;
        Ok(())
    }

    /// Writes out the current pack's buffered records if it is pack `num`, so reads find them.
    fn write_out(&self, num: u32) -> Result<(), StoreError> {
        let mut st = self.state.lock().unwrap();
        self.write_out_locked(&mut st, num)
    }

    fn write_out_locked(&self, st: &mut State, num: u32) -> Result<(), StoreError> {
        match st.writer.as_mut() {
            Some(w) if w.num == num => {
                let r = w.write_out();
                self.written(st, r)
            }
            _ => Ok(()),
        }
    }

    fn new_pack(&self, st: &mut State) -> Result<Writer, StoreError> {
        let num = st.next_pack;
        st.next_pack += 1;
        let path = self.packs_dir.join(pack_name(num));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(StoreError::io("create", &path))?;
        file.write_all_at(&PACK_HEADER, 0).map_err(|e| {
            let _ = fs::remove_file(&path);
            StoreError::io("write", &path)(e)
        })?;
        Ok(Writer::new(
            num,
            file,
            PACK_HEADER_LEN,
            0,
            false,
            self.opts.write_buffer,
        ))
    }

    fn flush_locked(&self, st: &mut State) -> Result<(), StoreError> {
        if st.poisoned {
            return Err(StoreError::Poisoned {
                path: self.dir.clone(),
            });
        }
        let dirty = st.writer.as_ref().is_some_and(|w| w.len != w.committed);
        if !dirty && st.pending.is_empty() && st.pending_objects.is_empty() && st.retire.is_empty()
        {
            return Ok(());
        }
        if let Some(w) = st.writer.as_mut() {
            let path = self.packs_dir.join(pack_name(w.num));
            if let Err(e) = w.sync() {
                st.poisoned = true;
                return Err(StoreError::io("fsync", path)(e));
            }
            if !w.dir_synced {
                if let Err(e) = fsync_dir(&self.packs_dir) {
                    st.poisoned = true;
                    return Err(e);
                }
                w.dir_synced = true;
            }
        }
        let committed = self.commit_pending(st);
        self.forget_snapshot();
        if let Err(e) = committed {
            st.poisoned = true;
            return Err(e);
        }
        st.pending.clear();
        st.pending_objects.clear();
        st.retire.clear();
        st.unflushed = 0;
        if let Some(w) = st.writer.as_mut() {
            w.committed = w.len;
        }
        Ok(())
    }

    fn commit_pending(&self, st: &State) -> Result<(), StoreError> {
        let p = &self.index_path;
        let tx = self.db.begin_write().map_err(db_err(p))?;
        {
            let mut chunks = tx.open_table(CHUNKS).map_err(db_err(p))?;
            let mut damaged = tx.open_table(DAMAGED).map_err(db_err(p))?;
            for (id, loc) in &st.pending {
                chunks.insert(&ckey(id), &loc.encode()).map_err(db_err(p))?;
                damaged.remove(&ckey(id)).map_err(db_err(p))?;
            }
            let mut objects = tx.open_table(OBJECTS).map_err(db_err(p))?;
            let mut tombs = tx.open_table(TOMBSTONES).map_err(db_err(p))?;
            for po in &st.pending_objects {
                match po {
                    PendingObject::Put(oid, e) => scan::apply_object(
                        &mut objects,
                        &mut tombs,
                        oid.id().digest(),
                        e.seq,
                        e.pack,
                        Some(e),
                    ),
                    PendingObject::Remove(oid, seq, pack) => scan::apply_object(
                        &mut objects,
                        &mut tombs,
                        oid.id().digest(),
                        *seq,
                        *pack,
                        None,
                    ),
                }
                .map_err(db_err(p))?;
            }
            let mut packs = tx.open_table(PACKS).map_err(db_err(p))?;
            if let Some(w) = &st.writer {
                packs.insert(w.num, (w.len, 0u8)).map_err(db_err(p))?;
            }
            for r in &st.retire {
                packs.insert(*r, (0u64, 1u8)).map_err(db_err(p))?;
            }
            let mut meta = tx.open_table(META).map_err(db_err(p))?;
            meta.insert("next_seq", &st.next_seq.to_le_bytes()[..])
                .map_err(db_err(p))?;
        }
        tx.commit().map_err(db_err(p))
    }
}

/// Takes the store's lock. With `wait`, a lock seen held is retried for a moment: a process
/// that forked while holding the descriptor (to run a child) keeps it until the child execs.
pub(super) fn lock_store(dir: &Path, wait: bool) -> Result<File, StoreError> {
    let path = dir.join("lock");
    let lock = File::create(&path).map_err(StoreError::io("create", &path))?;
    let attempts = if wait { 50 } else { 1 };
    for attempt in 0..attempts {
        match lock.try_lock() {
            Ok(()) => return Ok(lock),
            Err(std::fs::TryLockError::WouldBlock) if attempt + 1 < attempts => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            Err(std::fs::TryLockError::WouldBlock) => break,
            Err(std::fs::TryLockError::Error(e)) => return Err(StoreError::io("lock", &path)(e)),
        }
    }
    Err(StoreError::Locked {
        path: dir.to_path_buf(),
    })
}

fn read_marker(dir: &Path) -> Result<HashAlg, StoreError> {
    let path = dir.join(MARKER);
    let text = fs::read_to_string(&path).map_err(|e| StoreError::NotAStore {
        path: dir.to_path_buf(),
        why: format!("cannot read {}: {e}", path.display()),
    })?;
    let mut lines = text.lines();
    if lines.next() != Some(MARKER_VERSION) {
        return Err(StoreError::NotAStore {
            path: dir.to_path_buf(),
            why: format!("{} does not start with {MARKER_VERSION:?}", path.display()),
        });
    }
    let alg = lines
        .find_map(|l| l.strip_prefix("hash "))
        .ok_or_else(|| StoreError::NotAStore {
            path: dir.to_path_buf(),
            why: "marker names no hash algorithm".into(),
        })?;
    Ok(alg.parse()?)
}

impl LocalStore {
    /// A chunk, verified; kept in the RAM cache with `keep`.
    fn get_kept(&self, id: &Id, keep: bool) -> Result<Option<Vec<u8>>, StoreError> {
        if id.alg() != self.alg {
            return Ok(None);
        }
        if let Some(v) = self.cache.lock().unwrap().get(id) {
            return Ok(Some(v));
        }
        let Some(loc) = self.location(id)? else {
            return Ok(None);
        };
        match self.read_chunk(id, loc) {
            Ok(data) => {
                self.touch(loc.pack);
                if keep {
                    self.cache.lock().unwrap().insert(*id, data.clone());
                }
                Ok(Some(data))
            }
            Err(why) => {
                let location = self.describe(loc);
                self.mark_damaged(id, &format!("{location}: {why}"));
                Err(StoreError::Corrupt {
                    id: *id,
                    location,
                    why,
                })
            }
        }
    }
}

impl ChunkStore for LocalStore {
    fn hash_alg(&self) -> HashAlg {
        self.alg
    }

    fn contains(&self, id: &Id) -> Result<bool, StoreError> {
        Ok(id.alg() == self.alg && self.location(id)?.is_some())
    }

    fn get(&self, id: &Id) -> Result<Option<Vec<u8>>, StoreError> {
        self.get_kept(id, true)
    }

    fn get_passing(&self, id: &Id) -> Result<Option<Vec<u8>>, StoreError> {
        self.get_kept(id, false)
    }

    fn find_prefix(&self, prefix: u64) -> Result<Option<Id>, StoreError> {
        let prefix = prefix.to_le_bytes();
        let (mut lo, mut hi) = ([0u8; 16], [0xffu8; 16]);
        lo[..8].copy_from_slice(&prefix);
        hi[..8].copy_from_slice(&prefix);
        let table = self.chunk_table()?;
        let first = index::guard(&self.index_path, || {
            Ok(table
                .range::<&[u8; 16]>(&lo..=&hi)
                .map_err(db_err(&self.index_path))?
                .next()
                .transpose()
                .map_err(db_err(&self.index_path))?
                .map(|(k, v)| (*k.value(), Loc::decode(v.value()))))
        })?;
        // The index holds 16 bytes of the digest; the record's header holds the whole id.
        if let Some(id) = first.and_then(|(key, loc)| self.record_id(&key, loc)) {
            return Ok(Some(id));
        }
        // Chunks put since the last flush are not in the table: scanned, while they are few
        // (a hint may miss; the lookup must stay cheap).
        let st = self.state.lock().unwrap();
        if st.pending.len() > PENDING_SCAN {
            return Ok(None);
        }
        Ok(st
            .pending
            .keys()
            .find(|id| id.digest()[..8] == prefix)
            .copied())
    }

    fn put(&self, chunk: &VerifiedChunk<'_>) -> Result<bool, StoreError> {
        let id = *chunk.id();
        self.check_alg(id.alg())?;
        let damaged = self.state.lock().unwrap().damaged.contains(&ckey(&id));
        if !damaged {
            if let Some(loc) = self.location(&id)? {
                self.touch(loc.pack);
                return Ok(false);
            }
        }
        // Compress before taking the lock, so other threads can append meanwhile.
        let level = self.level.load(std::sync::atomic::Ordering::Relaxed);
        let rec = encode_record(Kind::Chunk, id, chunk.data(), level);
        let mut st = self.state.lock().unwrap();
        if !damaged && st.pending.contains_key(&id) {
            return Ok(false);
        }
        let (pack, offset) = self.append(&mut st, &rec)?;
        st.pending.insert(
            id,
            Loc {
                pack,
                offset,
                stored_len: (rec.len() - RECORD_HEADER_LEN) as u32,
                raw_len: chunk.data().len() as u32,
            },
        );
        st.damaged.remove(&ckey(&id));
        if st.unflushed >= self.opts.flush_every {
            self.flush_locked(&mut st)?;
        }
        Ok(true)
    }

    fn flush(&self) -> Result<(), StoreError> {
        let mut st = self.state.lock().unwrap();
        self.flush_locked(&mut st)
    }

    fn prefer_speed(&self, yes: bool) {
        let level = if yes { 0 } else { self.opts.zstd_level };
        self.level
            .store(level, std::sync::atomic::Ordering::Relaxed);
    }

    fn put_object(&self, oid: &Oid, recipe: &Recipe) -> Result<(), StoreError> {
        self.check_alg(recipe.alg())?;
        self.check_alg(oid.id().alg())?;
        let enc = recipe.encode();
        if enc.len() as u64 + 16 > pack::MAX_OBJECT_RECORD as u64 {
            return Err(StoreError::TooLarge {
                what: format!("recipe of {oid}"),
                len: enc.len() as u64,
                limit: pack::MAX_OBJECT_RECORD as u64 - 16,
            });
        }
        let mut st = self.state.lock().unwrap();
        let seq = st.next_seq;
        let rec = encode_record(
            Kind::Object,
            oid.id(),
            &object_payload(seq, Some(&enc)),
            self.opts.zstd_level,
        );
        let (pack, _) = self.append(&mut st, &rec)?;
        st.next_seq += 1;
        st.pending_objects.push(PendingObject::Put(
            *oid,
            ObjectEntry {
                seq,
                pack,
                total_len: recipe.total_len(),
                recipe: enc,
            },
        ));
        Ok(())
    }

    fn object(&self, oid: &Oid) -> Result<Option<Recipe>, StoreError> {
        index::guard(&self.index_path, || {
            {
                let st = self.state.lock().unwrap();
                for po in st.pending_objects.iter().rev() {
                    match po {
                        PendingObject::Put(o, e) if o == oid => {
                            return Ok(Some(Recipe::decode(&e.recipe)?))
                        }
                        PendingObject::Remove(o, ..) if o == oid => return Ok(None),
                        _ => {}
                    }
                }
            }
            let p = &self.index_path;
            let tx = self.db.begin_read().map_err(db_err(p))?;
            let t = tx.open_table(OBJECTS).map_err(db_err(p))?;
            let Some(v) = t.get(oid.id().digest()).map_err(db_err(p))? else {
                return Ok(None);
            };
            let e = ObjectEntry::decode(v.value()).ok_or_else(|| StoreError::Index {
                path: p.clone(),
                msg: format!("object entry of {oid} is truncated"),
            })?;
            Ok(Some(Recipe::decode(&e.recipe)?))
        })
    }

    fn remove_object(&self, oid: &Oid) -> Result<bool, StoreError> {
        if self.object(oid)?.is_none() {
            return Ok(false);
        }
        let mut st = self.state.lock().unwrap();
        let seq = st.next_seq;
        let rec = encode_record(Kind::Tombstone, oid.id(), &object_payload(seq, None), 0);
        let (pack, _) = self.append(&mut st, &rec)?;
        st.next_seq += 1;
        st.pending_objects
            .push(PendingObject::Remove(*oid, seq, pack));
        Ok(true)
    }

    fn objects(&self) -> Result<Vec<(Oid, u64)>, StoreError> {
        let mut all = BTreeMap::new();
        self.for_each_object(|oid, e| {
            all.insert(oid, e.total_len);
            Ok(())
        })?;
        let st = self.state.lock().unwrap();
        for po in &st.pending_objects {
            match po {
                PendingObject::Put(o, e) => {
                    all.insert(*o, e.total_len);
                }
                PendingObject::Remove(o, ..) => {
                    all.remove(o);
                }
            }
        }
        Ok(all.into_iter().collect())
    }

    fn is_empty(&self) -> Result<bool, StoreError> {
        index::guard(&self.index_path, || {
            if !self.state.lock().unwrap().pending.is_empty() {
                return Ok(false);
            }
            let p = &self.index_path;
            let tx = self.db.begin_read().map_err(db_err(p))?;
            let chunks = tx.open_table(CHUNKS).map_err(db_err(p))?;
            chunks.is_empty().map_err(db_err(p))
        })
    }

    fn stats(&self) -> Result<StoreStats, StoreError> {
        index::guard(&self.index_path, || {
            let p = &self.index_path;
            let mut s = StoreStats::default();
            self.for_each_chunk(|_, l| {
                s.chunks += 1;
                s.chunk_bytes += l.raw_len as u64;
                s.stored_bytes += l.stored_len as u64 + RECORD_HEADER_LEN as u64;
            })?;
            self.for_each_object(|_, e| {
                s.objects += 1;
                s.object_bytes += e.total_len;
                Ok(())
            })?;
            let tx = self.db.begin_read().map_err(db_err(p))?;
            s.packs = tx
                .open_table(PACKS)
                .map_err(db_err(p))?
                .len()
                .map_err(db_err(p))?;
            s.damaged = tx
                .open_table(DAMAGED)
                .map_err(db_err(p))?
                .len()
                .map_err(db_err(p))?;
            s.index_bytes = fs::metadata(p).map(|m| m.len()).unwrap_or(0);
            Ok(s)
        })
    }
}

impl LocalStore {
    /// Closes the store as a crash would: nothing pending is flushed. For crash tests.
    #[doc(hidden)]
    pub fn simulate_crash(self) {
        self.state.lock().unwrap().poisoned = true;
    }
}

impl Drop for LocalStore {
    fn drop(&mut self) {
        match self.flush() {
            Ok(()) | Err(StoreError::Poisoned { .. }) => {}
            Err(e) => tracing::error!("flushing {} on close: {e}", self.dir.display()),
        }
    }
}
