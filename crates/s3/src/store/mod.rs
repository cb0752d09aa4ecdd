//! [`S3Store`]: the chunk store on a bucket.
//!
//! Writing: chunks gather in an open pack in RAM; a full pack (or a flush) is sealed and handed
//! to a bounded pool of upload threads, which compress its records, PUT it under its hash and
//! index it; a flush waits for every sealed pack, then writes the recipes of the objects put
//! since the last one. So memory stays under (uploads + 2) packs, uploads run in parallel,
//! and an object is never visible in the bucket before its chunks are.
//!
//! Reading: the local index says which pack and where; the chunk comes from the window cache
//! ([`crate::read`]) and is verified against its id. A chunk the index does not know makes the
//! store list the bucket's packs again (another server may have added it) before answering
//! that it is absent.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use ferry_format::{HashAlg, Id, Oid, Recipe};
use ferry_store::{ChunkStore, StoreError, StoreStats, VerifiedChunk, VerifyReport};

use crate::client::{Client, ClientOptions, Cond};
use crate::config::{Locator, Resolved};
use crate::index::{Index, Loc};
use crate::pack::{self, Builder, Entry};
use crate::read::{Key, Ready, Slot, Windows};
use crate::S3Error;

mod gc;
mod reading;
mod sync;

use reading::{claim_windows, downloader};

pub use gc::GcReport;

/// How a store is opened.
#[derive(Clone, Debug)]
pub struct Options {
    /// The local cache of the index (rebuilt from the bucket when lost).
    pub cache_dir: PathBuf,
    /// Create the store under the prefix if there is none.
    pub create: bool,
    /// Create the bucket too if it does not exist.
    pub create_bucket: bool,
    /// Hash algorithm of a store created here.
    pub hash_alg: HashAlg,
    /// A pack is sealed once its chunks reach this many bytes.
    pub pack_target: usize,
    /// Packs uploaded at once.
    pub uploads: usize,
    /// Windows downloaded at once ahead of a reader.
    pub downloads: usize,
    /// Bytes of a pack read at once.
    pub window: u64,
    /// Windows kept in RAM.
    pub cache_windows: usize,
    /// zstd level of records (0: none).
    pub zstd_level: i32,
    pub client: ClientOptions,
}

impl Options {
    /// Defaults, with the index cached in `cache_dir`.
    pub fn new(cache_dir: impl Into<PathBuf>) -> Options {
        Options {
            cache_dir: cache_dir.into(),
            create: false,
            create_bucket: false,
            hash_alg: HashAlg::Blake3,
            pack_target: 8 << 20,
            uploads: 4,
            downloads: 8,
            window: 4 << 20,
            cache_windows: 16,
            zstd_level: 3,
            client: ClientOptions::default(),
        }
    }
}

/// The store's description, at `PREFIX/ferry-store`.
const CONFIG_KEY: &str = "ferry-store";
const CONFIG_MAGIC: &str = "ferry-s3-store 1";

/// A window for a download thread to load, and the records wholly inside it to verify.
type Download = (Key, Arc<Slot>, Vec<Entry>);

struct Sealed {
    chunks: Vec<(Id, Arc<[u8]>)>,
}

#[derive(Default)]
struct State {
    /// Chunks put and not yet in the bucket: in the open pack or in one being uploaded.
    pending: HashMap<Id, Arc<[u8]>>,
    open: Vec<(Id, Arc<[u8]>)>,
    open_bytes: usize,
    in_flight: usize,
    /// The first upload that failed (after its retries): the store refuses writes from then on.
    failed: Option<String>,
    /// Objects put since the last flush.
    objects: HashMap<Oid, Recipe>,
}

struct Inner {
    client: Client,
    prefix: String,
    name: String,
    alg: HashAlg,
    index: Index,
    pack_target: usize,
    window: u64,
    zstd_level: i32,
    state: Mutex<State>,
    cv: Condvar,
    windows: Windows,
    ready: Ready,
    damaged: AtomicU64,
    refreshing: Mutex<()>,
    /// Packs gc condemned: read from, never deduplicated against.
    condemned: Mutex<HashSet<u32>>,
}

/// A chunk store on S3. See the crate documentation.
pub struct S3Store {
    inner: Arc<Inner>,
    uploads: Mutex<Option<SyncSender<Sealed>>>,
    downloads: Mutex<Option<SyncSender<Download>>>,
    prefetches: Mutex<Option<std::sync::mpsc::Sender<Vec<Id>>>>,
    threads: Vec<JoinHandle<()>>,
}

impl S3Store {
    /// Opens the store at `loc`, reached as `r` says.
    pub fn open(loc: &Locator, r: &Resolved, opts: Options) -> Result<S3Store, StoreError> {
        let client = Client::new(r, &loc.bucket, opts.client.clone())?;
        let name = loc.display();
        let alg = read_config(&client, &loc.prefix, &name, &opts)?;
        let index = Index::open(&opts.cache_dir, alg)?;
        let inner = Arc::new(Inner {
            client,
            prefix: loc.prefix.clone(),
            name,
            alg,
            index,
            pack_target: opts.pack_target.max(1),
            window: opts.window.max(64 << 10),
            zstd_level: opts.zstd_level,
            state: Mutex::default(),
            cv: Condvar::new(),
            windows: Windows::new(opts.cache_windows),
            ready: Ready::new(opts.cache_windows * opts.window as usize),
            damaged: AtomicU64::new(0),
            refreshing: Mutex::new(()),
            condemned: Mutex::default(),
        });
        inner.refresh()?;
        let mut threads = vec![];
        let (utx, urx) = sync_channel::<Sealed>(1);
        let urx = Arc::new(Mutex::new(urx));
        for _ in 0..opts.uploads.max(1) {
            let (inner, rx) = (inner.clone(), urx.clone());
            threads.push(std::thread::spawn(move || uploader(&inner, &rx)));
        }
        let (dtx, drx) = sync_channel::<Download>(opts.cache_windows.max(opts.downloads * 2));
        let drx = Arc::new(Mutex::new(drx));
        for _ in 0..opts.downloads.max(1) {
            let (inner, rx) = (inner.clone(), drx.clone());
            threads.push(std::thread::spawn(move || downloader(&inner, &rx)));
        }
        // Prefetch hints are looked up and turned into downloads off the reader's thread.
        let (ptx, prx) = std::sync::mpsc::channel::<Vec<Id>>();
        {
            let (inner, dtx) = (inner.clone(), dtx.clone());
            threads.push(std::thread::spawn(move || {
                for ids in prx {
                    let locs: Vec<Loc> = ids
                        .iter()
                        .filter_map(|id| inner.index.get(id).ok().flatten())
                        .collect();
                    if !claim_windows(&inner, &dtx, &locs) {
                        return;
                    }
                }
            }));
        }
        Ok(S3Store {
            inner,
            uploads: Mutex::new(Some(utx)),
            downloads: Mutex::new(Some(dtx)),
            prefetches: Mutex::new(Some(ptx)),
            threads,
        })
    }

    /// Opens the store an `s3://BUCKET/PREFIX[?OPTIONS]` locator names, reached as the
    /// process environment says (the AWS way), its index cached under `cache_root` in a
    /// directory of its endpoint, bucket and prefix. `create` makes the store if it is missing;
    /// `create_bucket`, its bucket too.
    pub fn open_locator(
        locator: &str,
        cache_root: &std::path::Path,
        create: bool,
        create_bucket: bool,
    ) -> Result<S3Store, StoreError> {
        let loc = Locator::parse(locator)?;
        let r = crate::config::resolve(&loc, &crate::config::ProcessEnv)?;
        let key =
            blake3::hash(format!("{}\n{}\n{}", r.endpoint, loc.bucket, loc.prefix).as_bytes());
        let opts = Options {
            create,
            create_bucket,
            ..Options::new(cache_root.join(&key.to_hex()[..16]))
        };
        S3Store::open(&loc, &r, opts)
    }

    /// `s3://BUCKET/PREFIX`.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Requests the client retried so far.
    pub fn retries(&self) -> u64 {
        self.inner.client.retries()
    }

    /// Lists the bucket's packs again: what other servers flushed becomes readable here.
    pub fn refresh(&self) -> Result<(), StoreError> {
        self.inner.refresh()
    }

    /// Reads and checks every chunk the index lists, and that every object's chunks are there.
    pub fn verify(&self, mut progress: impl FnMut(u64)) -> Result<VerifyReport, StoreError> {
        self.inner.refresh()?;
        let mut chunks = self.inner.index.chunks()?;
        chunks.sort_by_key(|l| (l.pack, l.entry.offset));
        let mut r = VerifyReport::default();
        for (i, l) in chunks.iter().enumerate() {
            if i % 256 == 0 {
                self.prefetch_locs(&chunks[i..chunks.len().min(i + 1024)]);
            }
            let id = l.entry.id.to_string();
            match self.inner.read_loc(l) {
                Ok(Some(_)) => {}
                Ok(None) => r
                    .damaged
                    .push((id, "its pack is gone from the bucket".into())),
                Err(e) => r.damaged.push((id, e.to_string())),
            }
            r.chunks_checked += 1;
            r.bytes_checked += l.entry.raw_len as u64;
            progress(l.entry.raw_len as u64);
        }
        for (oid, _) in self.objects()? {
            if let Some(recipe) = self.object(&oid)? {
                for c in recipe.chunks() {
                    if !self.contains(&c.id)? {
                        r.missing.push((oid, c.id));
                    }
                }
            }
        }
        Ok(r)
    }

    /// Forgets the local index and reads every pack's table of contents again; returns the
    /// packs indexed.
    pub fn rebuild(&self) -> Result<u64, StoreError> {
        let all = self.inner.index.packs()?.values().map(|v| v.0).collect();
        self.inner.index.drop_packs(&all)?;
        self.inner.refresh()?;
        Ok(self.inner.index.packs()?.len() as u64)
    }

    fn seal(&self, st: &mut State) -> Option<Sealed> {
        if st.open.is_empty() {
            return None;
        }
        st.open_bytes = 0;
        st.in_flight += 1;
        Some(Sealed {
            chunks: std::mem::take(&mut st.open),
        })
    }

    fn send(&self, s: Sealed) -> Result<(), StoreError> {
        let tx = self.uploads.lock().unwrap().clone();
        match tx.map(|tx| tx.send(s)) {
            Some(Ok(())) => Ok(()),
            _ => Err(StoreError::Remote {
                why: format!("{}: the upload threads have stopped", self.inner.name),
            }),
        }
    }

    fn prefetch_locs(&self, locs: &[Loc]) {
        if let Some(tx) = self.downloads.lock().unwrap().clone() {
            claim_windows(&self.inner, &tx, locs);
        }
    }
}

impl Drop for S3Store {
    fn drop(&mut self) {
        self.uploads.lock().unwrap().take();
        self.prefetches.lock().unwrap().take();
        self.downloads.lock().unwrap().take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn next<T>(rx: &Mutex<Receiver<T>>) -> Option<T> {
    rx.lock().unwrap().recv().ok()
}

fn uploader(inner: &Inner, rx: &Mutex<Receiver<Sealed>>) {
    while let Some(sealed) = next(rx) {
        let r = inner.upload(&sealed);
        let mut st = inner.state.lock().unwrap();
        match r {
            Ok(()) => {
                for (id, _) in &sealed.chunks {
                    st.pending.remove(id);
                }
            }
            Err(e) => {
                tracing::error!("{}: {e}", inner.name);
                st.failed.get_or_insert_with(|| e.to_string());
            }
        }
        st.in_flight -= 1;
        inner.cv.notify_all();
    }
}

/// Reads (or, when allowed, writes) the store's description; returns its hash algorithm.
fn read_config(
    client: &Client,
    prefix: &str,
    name: &str,
    opts: &Options,
) -> Result<HashAlg, StoreError> {
    let key = format!("{prefix}{CONFIG_KEY}");
    let got = match client.get(&key, None) {
        Err(S3Error::NoBucket(_)) if opts.create_bucket => {
            client.create_bucket()?;
            None
        }
        r => r?,
    };
    let text = match got {
        Some(t) => t,
        None if opts.create => {
            let body = format!("{CONFIG_MAGIC}\nhash {}\n", opts.hash_alg.name());
            // If another server created it first, its description is the store's.
            client.put(&key, body.as_bytes(), Cond::Absent)?;
            client.get(&key, None)?.ok_or_else(|| StoreError::Remote {
                why: format!("{name}: the store description vanished just after it was written"),
            })?
        }
        None => {
            return Err(StoreError::Remote {
                why: format!(
                    "no Ferry store at {name} (create one with `ferry store init --store {name}`)"
                ),
            })
        }
    };
    let text = String::from_utf8_lossy(&text);
    let mut lines = text.lines();
    let bad = |why: &str| StoreError::Remote {
        why: format!("{name}/{CONFIG_KEY}: {why}"),
    };
    if lines.next() != Some(CONFIG_MAGIC) {
        return Err(bad("not a Ferry S3 store description (or a newer format)"));
    }
    let alg = lines
        .find_map(|l| l.strip_prefix("hash "))
        .ok_or_else(|| bad("no hash algorithm"))?;
    alg.parse::<HashAlg>()
        .map_err(|_| bad(&format!("unknown hash algorithm {alg}")))
}

impl Inner {
    fn pack_key(&self, name: &str) -> String {
        format!("{}packs/{name}", self.prefix)
    }

    fn object_key(&self, oid: &Oid) -> String {
        format!("{}objects/{}", self.prefix, hex::encode(oid.id().digest()))
    }

    /// Builds, uploads and indexes one sealed pack.
    fn upload(&self, s: &Sealed) -> Result<(), StoreError> {
        let bytes: usize = s.chunks.iter().map(|c| c.1.len()).sum();
        let mut b = Builder::new(self.alg, bytes, self.zstd_level);
        for (id, data) in &s.chunks {
            b.add(id, data)?;
        }
        let (pack, name) = b.finish();
        // A pack of the same name is the same bytes: a refused write means it is there.
        self.client
            .put(&self.pack_key(&name), &pack, Cond::Absent)?;
        let entries = pack::parse_tail(self.alg, &pack, pack.len() as u64)?;
        self.add_pack(&name, pack.len() as u64, &entries)?;
        Ok(())
    }
}

impl ChunkStore for S3Store {
    fn hash_alg(&self) -> HashAlg {
        self.inner.alg
    }

    fn contains(&self, id: &Id) -> Result<bool, StoreError> {
        if self.inner.state.lock().unwrap().pending.contains_key(id) {
            return Ok(true);
        }
        Ok(self
            .inner
            .index
            .get(id)?
            .is_some_and(|l| self.inner.usable(l.pack)))
    }

    fn get(&self, id: &Id) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(id)
    }

    fn prefetch(&self, ids: &[Id]) {
        if let Some(tx) = &*self.prefetches.lock().unwrap() {
            let _ = tx.send(ids.to_vec());
        }
    }

    fn find_prefix(&self, prefix: u64) -> Result<Option<Id>, StoreError> {
        let want = prefix.to_le_bytes();
        {
            let st = self.inner.state.lock().unwrap();
            if let Some(id) = st.pending.keys().find(|id| id.digest()[..8] == want) {
                return Ok(Some(*id));
            }
        }
        self.inner.index.find_prefix(prefix)
    }

    fn put(&self, chunk: &VerifiedChunk<'_>) -> Result<bool, StoreError> {
        let id = *chunk.id();
        if id.alg() != self.inner.alg {
            return Err(StoreError::WrongHashAlg {
                store: self.inner.alg,
                got: id.alg(),
            });
        }
        if self
            .inner
            .index
            .get(&id)?
            .is_some_and(|l| self.inner.usable(l.pack))
        {
            return Ok(false);
        }
        let sealed = {
            let mut st = self.inner.state.lock().unwrap();
            if let Some(f) = &st.failed {
                return Err(StoreError::Remote {
                    why: format!(
                        "{}: an earlier upload failed ({f}); open the store again",
                        self.inner.name
                    ),
                });
            }
            if st.pending.contains_key(&id) {
                return Ok(false);
            }
            let data: Arc<[u8]> = Arc::from(chunk.data());
            st.pending.insert(id, data.clone());
            st.open.push((id, data));
            st.open_bytes += chunk.data().len();
            if st.open_bytes >= self.inner.pack_target {
                self.seal(&mut st)
            } else {
                None
            }
        };
        if let Some(s) = sealed {
            self.send(s)?;
        }
        Ok(true)
    }

    fn flush(&self) -> Result<(), StoreError> {
        let sealed = self.seal(&mut self.inner.state.lock().unwrap());
        if let Some(s) = sealed {
            self.send(s)?;
        }
        let objects = {
            let mut st = self.inner.state.lock().unwrap();
            while st.in_flight > 0 {
                st = self.inner.cv.wait(st).unwrap();
            }
            if let Some(f) = &st.failed {
                return Err(StoreError::Remote {
                    why: format!("{}: an upload failed: {f}", self.inner.name),
                });
            }
            std::mem::take(&mut st.objects)
        };
        // Recipes after their chunks: an object in the bucket always has its chunks there.
        let mut left = objects.into_iter();
        while let Some((oid, recipe)) = left.next() {
            let r = self
                .inner
                .client
                .put(&self.inner.object_key(&oid), &recipe.encode(), Cond::None)
                .map_err(StoreError::from)
                .and_then(|_| self.inner.index.put_object(&oid, &recipe));
            if let Err(e) = r {
                let mut st = self.inner.state.lock().unwrap();
                st.objects.insert(oid, recipe);
                st.objects.extend(left);
                return Err(e);
            }
        }
        Ok(())
    }

    fn put_object(&self, oid: &Oid, recipe: &Recipe) -> Result<(), StoreError> {
        self.inner
            .state
            .lock()
            .unwrap()
            .objects
            .insert(*oid, recipe.clone());
        Ok(())
    }

    fn object(&self, oid: &Oid) -> Result<Option<Recipe>, StoreError> {
        if let Some(r) = self.inner.state.lock().unwrap().objects.get(oid) {
            return Ok(Some(r.clone()));
        }
        if let Some(r) = self.inner.index.object(oid)? {
            return Ok(Some(r));
        }
        let Some(bytes) = self.inner.client.get(&self.inner.object_key(oid), None)? else {
            return Ok(None);
        };
        let recipe = Recipe::decode(&bytes)?;
        self.inner.index.put_object(oid, &recipe)?;
        Ok(Some(recipe))
    }

    fn remove_object(&self, oid: &Oid) -> Result<bool, StoreError> {
        let was_pending = self
            .inner
            .state
            .lock()
            .unwrap()
            .objects
            .remove(oid)
            .is_some();
        let existed = was_pending || self.object(oid)?.is_some();
        self.inner.client.delete(&self.inner.object_key(oid))?;
        self.inner.index.remove_object(oid)?;
        Ok(existed)
    }

    fn objects(&self) -> Result<Vec<(Oid, u64)>, StoreError> {
        let listed = self
            .inner
            .client
            .list(&format!("{}objects/", self.inner.prefix))?;
        let mut digests = HashSet::new();
        for l in listed {
            let Some(hex) = l.key.rsplit('/').next() else {
                continue;
            };
            let mut d = [0u8; 32];
            if hex::decode_to_slice(hex, &mut d).is_ok() {
                digests.insert(d);
            }
        }
        let known = self.inner.index.objects()?;
        let mut out = vec![];
        for d in &digests {
            let oid = Oid(Id::from_parts(self.inner.alg, *d));
            match known.get(d) {
                Some(len) => out.push((oid, *len)),
                None => {
                    if let Some(r) = self.object(&oid)? {
                        out.push((oid, r.total_len()));
                    }
                }
            }
        }
        for d in known.keys().filter(|d| !digests.contains(*d)) {
            self.inner
                .index
                .remove_object(&Oid(Id::from_parts(self.inner.alg, *d)))?;
        }
        for (oid, r) in &self.inner.state.lock().unwrap().objects {
            if !digests.contains(oid.id().digest()) {
                out.push((*oid, r.total_len()));
            }
        }
        out.sort_by_key(|o| *o.0.id().digest());
        Ok(out)
    }

    fn stats(&self) -> Result<StoreStats, StoreError> {
        let objects = self.objects()?;
        let chunks = self.inner.index.chunks()?;
        let index_bytes = std::fs::metadata(self.inner.index.path())
            .map(|m| m.len())
            .unwrap_or(0);
        Ok(StoreStats {
            chunks: chunks.len() as u64,
            chunk_bytes: chunks.iter().map(|l| l.entry.raw_len as u64).sum(),
            stored_bytes: chunks.iter().map(|l| l.entry.stored_len as u64).sum(),
            objects: objects.len() as u64,
            object_bytes: objects.iter().map(|o| o.1).sum(),
            packs: self.inner.index.packs()?.len() as u64,
            index_bytes,
            damaged: self.inner.damaged.load(Ordering::Relaxed),
        })
    }

    fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.inner.state.lock().unwrap().pending.is_empty() && self.inner.index.is_empty()?)
    }
}
