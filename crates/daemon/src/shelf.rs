//! The daemon's objects: the object store (Bullet's: contiguous objects, capabilities,
//! durability, directories) holding every object put or fetched, and a chunk store where
//! fetches gather chunks (so a fetch cut off resumes where it stopped) before the whole is
//! verified and created as an object.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferry_format::{Id, Oid, Recipe};
use ferry_objects::{Capability, ObjectStore, ObjectsError};
use ferry_store::{ChunkStore, LocalStore};

use crate::DaemonError;

/// Objects, who may read them, and the chunks of fetches.
pub struct Shelf {
    objects: Arc<ObjectStore>,
    staging: Arc<LocalStore>,
}

impl From<ObjectsError> for DaemonError {
    fn from(e: ObjectsError) -> Self {
        match e {
            ObjectsError::Denied => DaemonError::NotFound(e.to_string()),
            ObjectsError::BadInput(m) => DaemonError::BadRequest(m),
            ObjectsError::Conflict(m) => DaemonError::Conflict(m),
            e => DaemonError::Damaged(e.to_string()),
        }
    }
}

impl Shelf {
    /// Opens (or makes) the shelf in `dir`: `dir/objects`, `dir/store` (fetches' chunks) and
    /// `dir/secret`.
    pub fn open(dir: &Path) -> Result<Shelf, DaemonError> {
        std::fs::create_dir_all(dir).map_err(DaemonError::file("create", dir))?;
        let staging =
            LocalStore::open_or_create(dir.join("store"), ferry_store::Options::default())?;
        let secret = load_secret(&dir.join("secret"))?;
        let objects = ferry_objects::open_dir(
            &dir.join("objects"),
            secret,
            ferry_objects::Options::default(),
        )?;
        Ok(Shelf {
            objects,
            staging: Arc::new(staging),
        })
    }

    pub fn objects(&self) -> &Arc<ObjectStore> {
        &self.objects
    }

    /// Where fetches gather chunks.
    pub fn staging(&self) -> &Arc<LocalStore> {
        &self.staging
    }

    /// An object held whole, by OID: its owner's capability and recipe.
    pub fn whole(&self, oid: &Oid) -> Result<Option<(Capability, Arc<Recipe>)>, DaemonError> {
        let Some(n) = self.objects.by_oid(oid)? else {
            return Ok(None);
        };
        let Some(cap) = self.objects.owner(n) else {
            return Ok(None);
        };
        let (_, recipe) = self.objects.recipe(&cap)?;
        Ok(Some((cap, recipe)))
    }

    /// Writes bytes `start..end` of the object `cap` reads to `out`, verified.
    pub fn read(
        &self,
        cap: &Capability,
        start: u64,
        end: u64,
        out: &mut dyn Write,
    ) -> Result<u64, DaemonError> {
        Ok(self.objects.read(cap, start, end, out)?)
    }
}

impl ferry_fs::ObjectShelf for Shelf {
    fn open(&self, oid: &Id, cap: &[u8]) -> Option<(u64, Arc<Recipe>)> {
        let cap = Capability::from_bytes(cap).ok()?;
        let (stat, recipe) = self.objects.recipe(&cap).ok()?;
        (stat.oid.0 == *oid).then_some((stat.size, recipe))
    }

    fn chunk(&self, id: &Id) -> Option<Vec<u8>> {
        match self.objects.chunk(id) {
            Ok(Some(c)) => Some(c),
            _ => self.staging.get(id).ok()?,
        }
    }

    fn read(&self, cap: &[u8], offset: u64, len: u64) -> Option<(Id, u64, Vec<u8>)> {
        let cap = Capability::from_bytes(cap).ok()?;
        // `len` is the peer's, bounded by the protocol's largest read.
        let mut out = Vec::with_capacity(len.min(ferry_fs::MAX_OBJECT_READ) as usize);
        let end = offset.saturating_add(len);
        let (oid, size) = self
            .objects
            .read_with_size(&cap, offset, end, &mut out)
            .ok()?;
        Some((oid.0, size, out))
    }

    fn delete(&self, cap: &[u8]) -> Result<(), ferry_fs::ShelfError> {
        use ferry_proto::ErrorCode;
        let denied = || (ErrorCode::NotFound, ObjectsError::Denied.to_string());
        let cap = Capability::from_bytes(cap).map_err(|_| denied())?;
        match self.objects.delete(&cap) {
            Ok(()) => Ok(()),
            Err(ObjectsError::Denied) => Err(denied()),
            Err(e) => Err((ErrorCode::Io, e.to_string())),
        }
    }
}

/// The chunks of the daemon's objects, as the transfer engine's source: what the daemon holds
/// is never fetched again.
pub struct HeldChunks<'a>(pub &'a ObjectStore);

impl ferry_transfer::ChunkLookup for HeldChunks<'_> {
    fn has_chunk(&self, id: &Id) -> bool {
        self.0.contains_chunk(id).unwrap_or(false)
    }

    fn chunk(&self, id: &Id) -> Result<Option<Vec<u8>>, String> {
        self.0.chunk(id).map_err(|e| e.to_string())
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
