//! The daemon's objects (DOT's storage plugin): a chunk store holding every object put or
//! fetched, and the secret its read capabilities are made with.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferry_chunk::ChunkerSpec;
use ferry_format::{Id, Oid, Recipe};
use ferry_proto::CAP_BYTES;
use ferry_store::{ChunkStore, LocalStore};

use crate::DaemonError;

/// What capabilities are made of, so a capability is never another MAC of the same secret.
const CAP_CONTEXT: &[u8] = b"ferry read capability v1\0";

/// Objects, and who may read them.
pub struct Shelf {
    store: Arc<LocalStore>,
    secret: [u8; 32],
}

/// An object just put.
#[derive(Clone, Debug)]
pub struct Put {
    pub oid: Oid,
    pub size: u64,
    pub chunks: u64,
    /// Chunks the store did not hold before, and their bytes.
    pub new_chunks: u64,
    pub new_bytes: u64,
}

impl Shelf {
    /// Opens (or makes) the shelf in `dir`: `dir/store` and `dir/secret`.
    pub fn open(dir: &Path) -> Result<Shelf, DaemonError> {
        std::fs::create_dir_all(dir).map_err(DaemonError::file("create", dir))?;
        let store = LocalStore::open_or_create(dir.join("store"), ferry_store::Options::default())?;
        Ok(Shelf {
            store: Arc::new(store),
            secret: load_secret(&dir.join("secret"))?,
        })
    }

    pub fn store(&self) -> &Arc<LocalStore> {
        &self.store
    }

    /// The read capability of object `oid`: a keyed MAC of it under the daemon's secret.
    pub fn cap(&self, oid: &Oid) -> [u8; CAP_BYTES] {
        let mut h = blake3::Hasher::new_keyed(&self.secret);
        h.update(CAP_CONTEXT);
        h.update(&oid.0.to_bytes());
        *h.finalize().as_bytes()
    }

    /// Whether `cap` reads `oid`, compared in constant time.
    pub fn grants(&self, oid: &Oid, cap: &[u8; CAP_BYTES]) -> bool {
        blake3::Hash::from_bytes(self.cap(oid)) == blake3::Hash::from_bytes(*cap)
    }

    /// Puts the bytes `src` gives as an object: its chunks into the store, its recipe as an
    /// object, all durable before this returns.
    pub fn put(&self, src: impl std::io::Read + Send) -> Result<Put, DaemonError> {
        let (oid, recipe, stored) =
            ferry_store::store_object(&*self.store, src, &ChunkerSpec::default(), |_| {})?;
        Ok(Put {
            oid,
            size: recipe.total_len(),
            chunks: recipe.len() as u64,
            new_chunks: stored.new_chunks,
            new_bytes: stored.new_bytes,
        })
    }

    /// The recipe of an object held whole (every chunk in the store).
    pub fn whole(&self, oid: &Oid) -> Result<Option<Recipe>, DaemonError> {
        let Some(r) = self.store.object(oid)? else {
            return Ok(None);
        };
        for c in r.chunks() {
            if !self.store.contains(&c.id)? {
                return Ok(None);
            }
        }
        Ok(Some(r))
    }

    /// Writes object `oid` (verified, chunk by chunk and whole) to `out`.
    pub fn read(&self, oid: &Oid, recipe: &Recipe, out: impl Write) -> Result<u64, DaemonError> {
        Ok(ferry_store::read_recipe(&*self.store, oid, recipe, out)?)
    }
}

impl ferry_fs::ObjectShelf for Shelf {
    fn open(&self, oid: &Id, cap: &[u8; CAP_BYTES]) -> Option<(u64, Arc<Recipe>)> {
        let oid = Oid(*oid);
        if !self.grants(&oid, cap) {
            return None;
        }
        let r = self.store.object(&oid).ok()??;
        Some((r.total_len(), Arc::new(r)))
    }

    fn chunk(&self, id: &Id) -> Option<Vec<u8>> {
        self.store.get(id).ok()?
    }
}

/// The daemon's secret: made once (32 random bytes, mode 0600, written whole before it is
/// named), then read.
fn load_secret(path: &PathBuf) -> Result<[u8; 32], DaemonError> {
    match std::fs::read(path) {
        Ok(b) if b.len() == 32 => return Ok(b.try_into().expect("32 bytes")),
        Ok(b) => {
            return Err(DaemonError::Damaged(format!(
                "{} holds {} bytes, not a 32-byte secret",
                path.display(),
                b.len()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(DaemonError::file("read", path)(e)),
    }
    let secret: [u8; 32] = rand::random();
    let dir = path.parent().expect("a file in a directory");
    let mut tmp = tempfile::Builder::new()
        .prefix(".secret")
        .tempfile_in(dir)
        .map_err(DaemonError::file("create", dir))?;
    tmp.write_all(&secret)
        .and_then(|_| tmp.as_file().sync_all())
        .map_err(DaemonError::file("write", path))?;
    // Another daemon starting at the same moment may have won: then its secret stands.
    match tmp.persist_noclobber(path) {
        Ok(_) => {
            crate::sync_dir(dir);
            Ok(secret)
        }
        Err(_) => load_secret(path),
    }
}
