//! The object store (Bullet's): every object's bytes in one extent of a large data file, an
//! inode table in redb, a RAM cache of whole objects, and a recipe per object so transfers and
//! dedup still go by chunk. Layout and tables: `docs/objects.md`.
//!
//! A create writes the bytes into a free extent, syncs the data file (durability 1), then
//! commits the inode, the recipe and the chunk index in one redb transaction: a crash before the
//! commit leaves no object, and its extent is free again because free space is never stored,
//! only derived from the inodes when the store opens. A create at durability 0 answers once the
//! object is in RAM and leaves the writing to a background thread.

use std::collections::HashMap;
use std::io::Read;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, RwLock};

use ferry_chunk::ChunkerSpec;
use ferry_format::{chunk_object_parallel, HashAlg, Oid, Recipe};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::caps::{mint_check, Capability, Rights, RANDOM_BYTES, SERVER_ID_BYTES};
use crate::disk::{Disk, DiskFile};
use crate::inode::{Inode, Kind};
use crate::space::{Extent, Space};
use crate::ObjectsError;

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
const RECIPES: TableDefinition<u64, &[u8]> = TableDefinition::new("recipes");
/// Chunk id → (object number, offset in it, length): where a transfer finds a chunk.
const CHUNKS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("chunks");
/// OID → an object holding it.
const OIDS: TableDefinition<&[u8], u64> = TableDefinition::new("oids");

mod compact;
mod read;

const INDEX: &str = "index.redb";
/// Recipes kept decoded.
const RECENT_RECIPES: NonZeroUsize = NonZeroUsize::new(16).expect("non-zero");
/// Bytes of whole chunks a read takes from the disk at once.
const READ_WINDOW: u64 = 4 << 20;

fn data_name(file: u32) -> String {
    format!("data-{file:05}.obj")
}

/// How the store behaves.
#[derive(Clone, Debug)]
pub struct Options {
    /// Bytes of whole objects the RAM cache keeps.
    pub cache_bytes: usize,
    /// Objects larger than this are not cached.
    pub cache_max_object: u64,
    /// Bytes of durability-0 objects waiting in RAM for the writer at most; a create past it
    /// waits for its own write (and says it met durability 1).
    pub ram_bytes: u64,
    /// A data file grows to this at most.
    pub file_max: u64,
    pub chunker: ChunkerSpec,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cache_bytes: 64 << 20,
            cache_max_object: 1 << 20,
            ram_bytes: 256 << 20,
            file_max: 4 << 30,
            chunker: ChunkerSpec::default(),
        }
    }
}

/// An object just created.
#[derive(Clone, Debug)]
pub struct Created {
    pub cap: Capability,
    pub oid: Oid,
    pub size: u64,
    pub chunks: u64,
    /// The durability met: 0 (in RAM) or 1 (on disk).
    pub durability: u8,
}

/// What `stat` tells.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    pub number: u64,
    pub kind: Kind,
    pub size: u64,
    pub oid: Oid,
    /// 0 while the object waits in RAM for its write; then 1.
    pub durability: u8,
    /// The rights of the capability asked with.
    pub rights: Rights,
}

/// The store's figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub objects: u64,
    pub bytes: u64,
    pub files: u32,
    /// Bytes of the data files up to their last extent, and of the free holes below.
    pub used: u64,
    pub holes: u64,
    /// Objects in RAM waiting for their write.
    pub pending: u64,
}

/// An object created at durability 0, held in RAM until the writer commits it.
struct Pending {
    inode: Inode,
    data: Arc<Vec<u8>>,
    recipe: Arc<Recipe>,
    deleted: bool,
}

struct State {
    inodes: HashMap<u64, Inode>,
    space: Space,
}

pub struct ObjectStore {
    disk: Arc<dyn Disk>,
    pub(crate) db: Database,
    secret: [u8; 32],
    server: [u8; SERVER_ID_BYTES],
    opts: Options,
    next: AtomicU64,
    state: RwLock<State>,
    files: RwLock<Vec<Arc<dyn DiskFile>>>,
    cache: Mutex<lru::LruCache<u64, Arc<Vec<u8>>>>,
    /// Recipes of objects read lately (a recipe's number is never reused, so never stale).
    recipes: Mutex<lru::LruCache<u64, Arc<Recipe>>>,
    cached: AtomicU64,
    pending: Mutex<HashMap<u64, Pending>>,
    pending_bytes: AtomicU64,
    /// Durability-0 objects not yet written (or deleted once written), for [`Self::flush`].
    in_flight: Mutex<u64>,
    drained: Condvar,
    writer: Mutex<Option<mpsc::Sender<u64>>>,
    /// Held by whatever moves or deletes an object's extent, so the two never race.
    mover: Mutex<()>,
}

pub(crate) fn dberr<E: Into<redb::Error>>(e: E) -> ObjectsError {
    ObjectsError::Index(e.into().to_string())
}

fn io(op: &'static str, what: String) -> impl FnOnce(std::io::Error) -> ObjectsError {
    move |source| ObjectsError::Io { op, what, source }
}

impl ObjectStore {
    /// Opens (or makes) the store on `disk`, its capabilities made with `secret`. Starts the
    /// writer of durability-0 objects.
    pub fn open(
        disk: Arc<dyn Disk>,
        secret: [u8; 32],
        opts: Options,
    ) -> Result<Arc<ObjectStore>, ObjectsError> {
        let backend = disk.backend(INDEX).map_err(io("open", INDEX.into()))?;
        let db = Database::builder()
            .create_with_backend(crate::disk::Backend(backend))
            .map_err(dberr)?;
        let tx = db.begin_write().map_err(dberr)?;
        let server: [u8; SERVER_ID_BYTES];
        let next;
        let mut inodes = HashMap::new();
        {
            let mut meta = tx.open_table(META).map_err(dberr)?;
            let known = meta
                .get("server")
                .map_err(dberr)?
                .map(|v| v.value().to_vec());
            server = match known {
                Some(v) => v
                    .try_into()
                    .map_err(|_| ObjectsError::Corrupt("the server id is not 16 bytes".into()))?,
                None => {
                    let s: [u8; SERVER_ID_BYTES] = rand::random();
                    meta.insert("server", &s[..]).map_err(dberr)?;
                    s
                }
            };
            next = match meta.get("next").map_err(dberr)? {
                Some(v) => u64::from_le_bytes(v.value().try_into().map_err(|_| {
                    ObjectsError::Corrupt("the next object number is not 8 bytes".into())
                })?),
                None => 1,
            };
            tx.open_table(RECIPES).map_err(dberr)?;
            tx.open_table(CHUNKS).map_err(dberr)?;
            tx.open_table(OIDS).map_err(dberr)?;
            tx.open_table(crate::dir::VERSIONS).map_err(dberr)?;
            let table = tx.open_table(INODES).map_err(dberr)?;
            for row in table.iter().map_err(dberr)? {
                let (k, v) = row.map_err(dberr)?;
                let inode = Inode::decode(v.value())
                    .map_err(|e| ObjectsError::Corrupt(format!("object {}: {e}", k.value())))?;
                inodes.insert(k.value(), inode);
            }
        }
        tx.commit().map_err(dberr)?;
        let mut files = vec![];
        let mut n = 0;
        while disk.exists(&data_name(n)) {
            files.push(disk.open(&data_name(n)).map_err(io("open", data_name(n)))?);
            n += 1;
        }
        let space = Space::rebuild(
            n,
            inodes.values().map(|i| i.extent).collect(),
            opts.file_max,
        );
        // The cache is bounded in bytes (`cache_put`); its slots (which the map allocates up
        // front) only bound how many tiny objects it holds: one per KiB of the byte bound. One
        // per byte allocated 2.3 GB at every open with the default 64 MiB (found by the api
        // fuzz target).
        let cache_slots = NonZeroUsize::new((opts.cache_bytes / 1024).max(1)).expect("non-zero");
        let store = Arc::new(ObjectStore {
            disk,
            db,
            secret,
            server,
            next: AtomicU64::new(next),
            state: RwLock::new(State { inodes, space }),
            files: RwLock::new(files),
            cache: Mutex::new(lru::LruCache::new(cache_slots)),
            recipes: Mutex::new(lru::LruCache::new(RECENT_RECIPES)),
            cached: AtomicU64::new(0),
            pending: Mutex::new(HashMap::new()),
            pending_bytes: AtomicU64::new(0),
            in_flight: Mutex::new(0),
            drained: Condvar::new(),
            writer: Mutex::new(None),
            mover: Mutex::new(()),
            opts,
        });
        store.trim_files()?;
        let (tx, rx) = mpsc::channel::<u64>();
        let weak = Arc::downgrade(&store);
        std::thread::Builder::new()
            .name("ferry-objects-writer".into())
            .spawn(move || {
                for number in rx {
                    let Some(s) = weak.upgrade() else { return };
                    if let Err(e) = s.write_pending(number) {
                        tracing::error!("object {number} could not be written: {e}");
                        s.drop_pending(number);
                    }
                }
            })
            .map_err(io("start", "the writer thread".into()))?;
        *store.writer.lock().expect("writer") = Some(tx);
        Ok(store)
    }

    /// The id capabilities name this store by.
    pub fn server_id(&self) -> [u8; SERVER_ID_BYTES] {
        self.server
    }

    pub fn hash_alg(&self) -> HashAlg {
        HashAlg::Blake3
    }

    /// Creates an object of `size` bytes read from `src`; `durability` 0 answers once it is in
    /// RAM (if it fits the RAM allowance), anything more once it is durable on disk.
    pub fn create(
        &self,
        src: impl Read + Send,
        size: u64,
        durability: u8,
    ) -> Result<Created, ObjectsError> {
        self.create_kind(src, size, durability, Kind::Blob)
    }

    pub(crate) fn create_kind(
        &self,
        mut src: impl Read + Send,
        size: u64,
        durability: u8,
        kind: Kind,
    ) -> Result<Created, ObjectsError> {
        if durability == 0 && self.reserve_ram(size) {
            let mut data = Vec::with_capacity(size as usize);
            let r = (&mut src)
                .take(size + 1)
                .read_to_end(&mut data)
                .map_err(io("read", "the object's input".into()));
            let r = r.and_then(|_| check_len(data.len() as u64, size));
            if let Err(e) = r {
                self.pending_bytes.fetch_sub(size, Ordering::SeqCst);
                return Err(e);
            }
            return self.create_in_ram(data, kind);
        }
        let extent = self.state.write().expect("state").space.allocate(size);
        let r = self.write_extent(src, extent, size);
        let (recipe, oid) = match r {
            Ok(x) => x,
            Err(e) => {
                self.state.write().expect("state").space.free(extent);
                return Err(e);
            }
        };
        let number = self.next.fetch_add(1, Ordering::SeqCst);
        let inode = Inode {
            kind,
            extent,
            random: rand::random(),
            oid,
            durability: 1,
        };
        if let Err(e) = self.commit(number, &inode, &recipe) {
            self.state.write().expect("state").space.free(extent);
            return Err(e);
        }
        Ok(self.created(number, &inode, recipe.len() as u64))
    }

    fn created(&self, number: u64, inode: &Inode, chunks: u64) -> Created {
        Created {
            cap: Capability::mint(&self.secret, self.server, number, &inode.random),
            oid: inode.oid,
            size: inode.size(),
            chunks,
            durability: inode.durability,
        }
    }

    /// Durability 0: the object is answered for now and written by the writer thread.
    fn create_in_ram(&self, data: Vec<u8>, kind: Kind) -> Result<Created, ObjectsError> {
        let (recipe, oid) =
            chunk_object_parallel(&data[..], &self.opts.chunker, self.hash_alg(), |_, _| {
                Ok::<_, std::io::Error>(())
            })
            .map_err(io("chunk", "the object".into()))?;
        let number = self.next.fetch_add(1, Ordering::SeqCst);
        let inode = Inode {
            kind,
            extent: Extent {
                file: 0,
                offset: 0,
                len: data.len() as u64,
            },
            random: rand::random(),
            oid,
            durability: 0,
        };
        let created = self.created(number, &inode, recipe.len() as u64);
        let data = Arc::new(data);
        *self.in_flight.lock().expect("in flight") += 1;
        self.pending.lock().expect("pending").insert(
            number,
            Pending {
                inode,
                data,
                recipe: Arc::new(recipe),
                deleted: false,
            },
        );
        let sent = match &*self.writer.lock().expect("writer") {
            Some(w) => w.send(number).is_ok(),
            None => false,
        };
        if !sent {
            if let Err(e) = self.write_pending(number) {
                self.drop_pending(number);
                return Err(e);
            }
        }
        Ok(created)
    }

    /// The writer's work: one durability-0 object to disk.
    fn write_pending(&self, number: u64) -> Result<(), ObjectsError> {
        let (mut inode, data, recipe) = {
            let p = self.pending.lock().expect("pending");
            let Some(p) = p.get(&number) else {
                return Ok(());
            };
            (p.inode.clone(), p.data.clone(), p.recipe.clone())
        };
        let len = data.len() as u64;
        let extent = self.state.write().expect("state").space.allocate(len);
        let written = self
            .file_for(extent.file)
            .and_then(|f| {
                f.write_at(&data, extent.offset)
                    .and_then(|_| f.sync())
                    .map_err(io("write", data_name(extent.file)))
            })
            .and_then(|_| {
                inode.extent = extent;
                inode.durability = 1;
                self.commit(number, &inode, &recipe)
            });
        if let Err(e) = written {
            self.state.write().expect("state").space.free(extent);
            return Err(e);
        }
        // From here on the object is an ordinary one: a delete arriving now finds it so.
        let deleted = self
            .pending
            .lock()
            .expect("pending")
            .remove(&number)
            .is_none_or(|p| p.deleted);
        self.pending_bytes.fetch_sub(len, Ordering::SeqCst);
        let r = match deleted {
            true => self.remove(number),
            false => Ok(()),
        };
        self.done_one();
        r
    }

    /// Takes `size` bytes of the RAM allowance for durability-0 objects, if they fit (a size
    /// announced by a peer may be anything: the sum never overflows).
    fn reserve_ram(&self, size: u64) -> bool {
        let limit = self.opts.ram_bytes;
        self.pending_bytes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                held.checked_add(size).filter(|total| *total <= limit)
            })
            .is_ok()
    }

    fn done_one(&self) {
        *self.in_flight.lock().expect("in flight") -= 1;
        self.drained.notify_all();
    }

    fn drop_pending(&self, number: u64) {
        if let Some(p) = self.pending.lock().expect("pending").remove(&number) {
            self.pending_bytes
                .fetch_sub(p.data.len() as u64, Ordering::SeqCst);
            self.done_one();
        }
    }

    /// Waits until every durability-0 object created so far is on disk (or failed to be).
    pub fn flush(&self) {
        let mut n = self.in_flight.lock().expect("in flight");
        while *n > 0 {
            n = self.drained.wait(n).expect("in flight");
        }
    }

    fn file_for(&self, file: u32) -> Result<Arc<dyn DiskFile>, ObjectsError> {
        if let Some(f) = self.files.read().expect("files").get(file as usize) {
            return Ok(f.clone());
        }
        let mut files = self.files.write().expect("files");
        while files.len() <= file as usize {
            let name = data_name(files.len() as u32);
            files.push(self.disk.open(&name).map_err(io("create", name))?);
        }
        Ok(files[file as usize].clone())
    }

    /// Streams `size` bytes of `src` into `extent`, chunking as they go; syncs the data file.
    fn write_extent(
        &self,
        src: impl Read + Send,
        extent: Extent,
        size: u64,
    ) -> Result<(Recipe, Oid), ObjectsError> {
        let file = self.file_for(extent.file)?;
        let name = data_name(extent.file);
        let mut at = 0u64;
        let mut failed = None;
        let mut src = src.take(size + 1);
        let r = chunk_object_parallel(&mut src, &self.opts.chunker, self.hash_alg(), |_, data| {
            let n = data.len() as u64;
            if at + n > size {
                at += n;
                return Ok(());
            }
            if let Err(e) = file.write_at(data, extent.offset + at) {
                failed = Some(e);
                return Err(std::io::Error::other("the data file failed"));
            }
            at += n;
            Ok::<_, std::io::Error>(())
        });
        if let Some(e) = failed {
            return Err(io("write", name)(e));
        }
        let (recipe, oid) = r.map_err(io("read", "the object's input".into()))?;
        check_len(at, size)?;
        file.sync().map_err(io("sync", name))?;
        Ok((recipe, oid))
    }

    /// Records a written object: inode, recipe, chunk index and OID in one transaction.
    fn commit(&self, number: u64, inode: &Inode, recipe: &Recipe) -> Result<(), ObjectsError> {
        let tx = self.db.begin_write().map_err(dberr)?;
        {
            tx.open_table(INODES)
                .map_err(dberr)?
                .insert(number, &inode.encode()[..])
                .map_err(dberr)?;
            tx.open_table(RECIPES)
                .map_err(dberr)?
                .insert(number, &recipe.encode()[..])
                .map_err(dberr)?;
            let mut chunks = tx.open_table(CHUNKS).map_err(dberr)?;
            let mut at = 0u64;
            for c in recipe.chunks() {
                let key = c.id.to_bytes();
                if chunks.get(&key[..]).map_err(dberr)?.is_none() {
                    let mut v = Vec::with_capacity(20);
                    v.extend_from_slice(&number.to_le_bytes());
                    v.extend_from_slice(&at.to_le_bytes());
                    v.extend_from_slice(&c.len.to_le_bytes());
                    chunks.insert(&key[..], &v[..]).map_err(dberr)?;
                }
                at += c.len as u64;
            }
            if inode.kind == Kind::Blob {
                tx.open_table(OIDS)
                    .map_err(dberr)?
                    .insert(&inode.oid.0.to_bytes()[..], number)
                    .map_err(dberr)?;
            }
            let mut meta = tx.open_table(META).map_err(dberr)?;
            let next = self.next.load(Ordering::SeqCst).max(number + 1);
            meta.insert("next", &next.to_le_bytes()[..])
                .map_err(dberr)?;
        }
        tx.commit().map_err(dberr)?;
        self.state
            .write()
            .expect("state")
            .inodes
            .insert(number, inode.clone());
        Ok(())
    }

    /// The inode of object `number`, from the table or from RAM (durability 0).
    fn inode(&self, number: u64) -> Option<Inode> {
        if let Some(p) = self.pending.lock().expect("pending").get(&number) {
            return (!p.deleted).then(|| p.inode.clone());
        }
        self.state
            .read()
            .expect("state")
            .inodes
            .get(&number)
            .cloned()
    }

    /// The object `cap` names, if it is this store's, exists and `cap` carries `need`. Every
    /// refusal is the same [`ObjectsError::Denied`]: it does not tell whether the object exists.
    pub fn check(&self, cap: &Capability, need: Rights) -> Result<(u64, Inode), ObjectsError> {
        let inode = self.inode(cap.number);
        // Computed even when there is no such object, so the time taken does not tell.
        let random = inode.as_ref().map_or([0; RANDOM_BYTES], |i| i.random);
        let owner = mint_check(&self.secret, &self.server, cap.number, &random);
        let valid = cap.verify(&owner) & (cap.server == self.server);
        match inode {
            Some(i) if valid && cap.rights().contains(need) => Ok((cap.number, i)),
            _ => Err(ObjectsError::Denied),
        }
    }

    /// The owner's capability of object `number` (for the daemon's own bookkeeping).
    pub fn owner(&self, number: u64) -> Option<Capability> {
        let i = self.inode(number)?;
        Some(Capability::mint(
            &self.secret,
            self.server,
            number,
            &i.random,
        ))
    }

    pub fn stat(&self, cap: &Capability) -> Result<Stat, ObjectsError> {
        let (number, i) = self.check(cap, Rights::READ)?;
        Ok(Stat {
            number,
            kind: i.kind,
            size: i.size(),
            oid: i.oid,
            durability: i.durability,
            rights: cap.rights(),
        })
    }

    /// The recipe of the object `cap` reads.
    pub fn recipe(&self, cap: &Capability) -> Result<(Stat, Arc<Recipe>), ObjectsError> {
        let stat = self.stat(cap)?;
        Ok((stat.clone(), self.recipe_of(stat.number)?))
    }

    /// An object's recipe: from RAM (durability 0), the recent ones kept, else the table. A
    /// large object read in many requests decodes its recipe once.
    fn recipe_of(&self, number: u64) -> Result<Arc<Recipe>, ObjectsError> {
        if let Some(p) = self.pending.lock().expect("pending").get(&number) {
            return Ok(p.recipe.clone());
        }
        if let Some(r) = self.recipes.lock().expect("recipes").get(&number) {
            return Ok(r.clone());
        }
        let tx = self.db.begin_read().map_err(dberr)?;
        let t = tx.open_table(RECIPES).map_err(dberr)?;
        let v = t.get(number).map_err(dberr)?.ok_or(ObjectsError::Denied)?;
        let r = Recipe::decode(v.value())
            .map(Arc::new)
            .map_err(|e| ObjectsError::Corrupt(format!("the recipe of object {number}: {e}")))?;
        self.recipes.lock().expect("recipes").put(number, r.clone());
        Ok(r)
    }

    /// An object holding `oid`, by number (the daemon's: whether it already has an object).
    pub fn by_oid(&self, oid: &Oid) -> Result<Option<u64>, ObjectsError> {
        let tx = self.db.begin_read().map_err(dberr)?;
        let t = tx.open_table(OIDS).map_err(dberr)?;
        Ok(t.get(&oid.0.to_bytes()[..])
            .map_err(dberr)?
            .map(|v| v.value()))
    }

    /// Deletes the object `cap` names (it needs the delete right); a directory goes with
    /// every version of it (not what its entries name).
    pub fn delete(&self, cap: &Capability) -> Result<(), ObjectsError> {
        let (number, inode) = self.check(cap, Rights::DELETE)?;
        if inode.kind == Kind::Directory {
            return self.remove_dir(number);
        }
        {
            let mut p = self.pending.lock().expect("pending");
            if let Some(p) = p.get_mut(&number) {
                // The writer deletes it once written.
                p.deleted = true;
                return Ok(());
            }
        }
        self.remove(number)
    }

    /// Removes object `number` from the tables, then frees its extent.
    pub(crate) fn remove(&self, number: u64) -> Result<(), ObjectsError> {
        let _moving = self.mover.lock().expect("mover");
        let recipe = self.recipe_of(number)?;
        let tx = self.db.begin_write().map_err(dberr)?;
        let inode = {
            let mut inodes = tx.open_table(INODES).map_err(dberr)?;
            let Some(v) = inodes.remove(number).map_err(dberr)? else {
                return Err(ObjectsError::Denied);
            };
            let inode = Inode::decode(v.value()).map_err(ObjectsError::Corrupt)?;
            drop(v);
            tx.open_table(RECIPES)
                .map_err(dberr)?
                .remove(number)
                .map_err(dberr)?;
            let mut chunks = tx.open_table(CHUNKS).map_err(dberr)?;
            for c in recipe.chunks() {
                let key = c.id.to_bytes();
                let mine = chunks
                    .get(&key[..])
                    .map_err(dberr)?
                    .is_some_and(|v| v.value()[..8] == number.to_le_bytes());
                if mine {
                    chunks.remove(&key[..]).map_err(dberr)?;
                }
            }
            let mut oids = tx.open_table(OIDS).map_err(dberr)?;
            let key = inode.oid.0.to_bytes();
            if oids
                .get(&key[..])
                .map_err(dberr)?
                .is_some_and(|v| v.value() == number)
            {
                oids.remove(&key[..]).map_err(dberr)?;
            }
            inode
        };
        tx.commit().map_err(dberr)?;
        let mut state = self.state.write().expect("state");
        state.inodes.remove(&number);
        state.space.free(inode.extent);
        drop(state);
        self.cache_drop(number);
        self.recipes.lock().expect("recipes").pop(&number);
        Ok(())
    }

    pub fn stats(&self) -> Stats {
        let state = self.state.read().expect("state");
        Stats {
            objects: state.inodes.len() as u64,
            bytes: state.inodes.values().map(|i| i.size()).sum(),
            files: state.space.files(),
            used: state.space.used_bytes(),
            holes: state.space.hole_bytes(),
            pending: self.pending.lock().expect("pending").len() as u64,
        }
    }
}

impl Drop for ObjectStore {
    fn drop(&mut self) {
        self.writer.lock().map(|mut w| w.take()).ok();
    }
}

fn check_len(got: u64, want: u64) -> Result<(), ObjectsError> {
    match got.cmp(&want) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Less => Err(ObjectsError::BadInput(format!(
            "the input ended after {got} of the {want} bytes announced"
        ))),
        std::cmp::Ordering::Greater => Err(ObjectsError::BadInput(format!(
            "the input is longer than the {want} bytes announced"
        ))),
    }
}
