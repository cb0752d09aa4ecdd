//! Portable storage (DOT's plugin): directories on devices that carry objects between
//! machines. On put, the daemon copies each new object to every device registered for pushing;
//! on get, every registered device that is present (looked at again every few seconds, so one
//! plugged in mid-transfer speeds that transfer up) is a source of chunks, and of the recipe when
//! no peer answers. Layout on the device, under `DIR/.ferry-dot/` (DOT's naive one: a file per
//! chunk, named by its id):
//!
//! - `chunks/XX/HEX`: a chunk's bytes, HEX its BLAKE3 digest (64 digits), XX the first two;
//! - `objects/HEX`: an object's recipe (Recipe v1, `docs/formats.md`), HEX its OID's digest.
//!
//! Nothing on a device is trusted: every chunk is checked against its id, a recipe against the
//! ticket's size (and the whole object against its OID), and every file is opened beneath the
//! device's root.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use ferry_format::{Id, Oid, Recipe};
use ferry_transfer::ChunkLookup;
use ferry_transfer::{open_beneath, Source, SourceError, Want};
use serde::{Deserialize, Serialize};

use crate::DaemonError;

/// The directory on a device that holds what Ferry put there.
const TOP: &str = ".ferry-dot";
/// Recipes read from a device are at most this long (a recipe of 2^20 chunks).
const MAX_RECIPE: u64 = 40 << 20;

/// A registered device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    pub path: PathBuf,
    /// Objects put are copied to it.
    pub push: bool,
}

/// The registered devices, kept in `DATA/devices.json`.
pub struct Devices {
    file: PathBuf,
    list: std::sync::Mutex<Vec<Device>>,
}

impl Devices {
    pub fn open(file: &Path) -> Result<Devices, DaemonError> {
        let list = match std::fs::read(file) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                DaemonError::Damaged(format!("{} is not a device list: {e}", file.display()))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![],
            Err(e) => return Err(DaemonError::file("read", file)(e)),
        };
        Ok(Devices {
            file: file.to_path_buf(),
            list: std::sync::Mutex::new(list),
        })
    }

    pub fn list(&self) -> Vec<Device> {
        self.list.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Adds (or changes) a device; its path must be an absolute directory.
    pub fn add(&self, d: Device) -> Result<(), DaemonError> {
        if !d.path.is_absolute() || !d.path.is_dir() {
            return Err(DaemonError::BadRequest(format!(
                "{} is not an absolute path to a directory",
                d.path.display()
            )));
        }
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let mut new = list.clone();
        new.retain(|o| o.path != d.path);
        new.push(d);
        self.save(&new)?;
        *list = new;
        Ok(())
    }

    /// Removes a device; whether it was registered.
    pub fn remove(&self, path: &Path) -> Result<bool, DaemonError> {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let mut new = list.clone();
        new.retain(|o| o.path != path);
        if new.len() == list.len() {
            return Ok(false);
        }
        self.save(&new)?;
        *list = new;
        Ok(true)
    }

    fn save(&self, list: &[Device]) -> Result<(), DaemonError> {
        let bytes = serde_json::to_vec_pretty(list).expect("a list serializes");
        crate::replace_file(&self.file, &bytes)
    }

    /// The registered devices present now (their directory can be opened).
    pub fn present(&self) -> Vec<PathBuf> {
        self.list()
            .into_iter()
            .filter(|d| d.path.join(TOP).is_dir())
            .map(|d| d.path)
            .collect()
    }
}

fn chunk_path(id: &Id) -> PathBuf {
    let h = hex::encode(id.digest());
    Path::new(TOP).join("chunks").join(&h[..2]).join(h)
}

fn object_path(oid: &Oid) -> PathBuf {
    Path::new(TOP)
        .join("objects")
        .join(hex::encode(oid.0.digest()))
}

/// What copying an object to a device did.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Pushed {
    pub device: PathBuf,
    pub chunks: u64,
    pub bytes: u64,
    pub error: Option<String>,
}

/// Copies object `oid` (recipe and every chunk the device lacks) to the device at `root`,
/// each file written beside its name and renamed into place, the device synced at the end.
pub fn push(root: &Path, store: &dyn ChunkLookup, oid: &Oid, recipe: &Recipe) -> Pushed {
    let mut p = Pushed {
        device: root.to_path_buf(),
        ..Pushed::default()
    };
    if let Err(e) = push_into(root, store, oid, recipe, &mut p) {
        p.error = Some(e.to_string());
    }
    p
}

fn push_into(
    root: &Path,
    store: &dyn ChunkLookup,
    oid: &Oid,
    recipe: &Recipe,
    p: &mut Pushed,
) -> Result<(), DaemonError> {
    let write = |rel: &Path, data: &[u8]| -> Result<(), DaemonError> {
        let path = root.join(rel);
        let dir = path.parent().expect("in a directory");
        std::fs::create_dir_all(dir).map_err(DaemonError::file("create", dir))?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".part")
            .tempfile_in(dir)
            .map_err(DaemonError::file("create a file in", dir))?;
        tmp.write_all(data)
            .map_err(DaemonError::file("write", &path))?;
        tmp.persist(&path)
            .map_err(|e| DaemonError::file("write", &path)(e.error))?;
        Ok(())
    };
    let mut seen = std::collections::HashSet::new();
    for c in recipe.chunks() {
        let rel = chunk_path(&c.id);
        if !seen.insert(c.id) || root.join(&rel).is_file() {
            continue;
        }
        let data = store
            .chunk(&c.id)
            .map_err(DaemonError::Damaged)?
            .ok_or_else(|| {
                DaemonError::Damaged(format!("chunk {} of {oid} is not in the store", c.id))
            })?;
        write(&rel, &data)?;
        p.chunks += 1;
        p.bytes += data.len() as u64;
    }
    // The recipe last: a device that has it has every chunk.
    write(&object_path(oid), &recipe.encode())?;
    let fd = std::fs::File::open(root).map_err(DaemonError::file("open", root))?;
    rustix::fs::syncfs(&fd).map_err(|e| DaemonError::file("sync", root)(e.into()))?;
    Ok(())
}

/// Object `oid`'s recipe from the device at `root`, if it holds one that adds up to `size`.
pub fn recipe(root: &Path, oid: &Oid, size: u64) -> Option<Recipe> {
    let fd = open_root(root).ok()?;
    let f = open_beneath(&fd, &object_path(oid)).ok()?;
    let mut b = vec![];
    f.take(MAX_RECIPE).read_to_end(&mut b).ok()?;
    let r = Recipe::decode(&b).ok()?;
    (r.total_len() == size && r.alg() == oid.0.alg()).then_some(r)
}

fn open_root(root: &Path) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    Ok(rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// A device as a source of chunks.
pub struct DeviceSource {
    name: String,
    root: OwnedFd,
    pending: VecDeque<Vec<Want>>,
}

impl DeviceSource {
    pub fn open(root: &Path) -> std::io::Result<DeviceSource> {
        Ok(DeviceSource {
            name: root.display().to_string(),
            root: open_root(root)?,
            pending: VecDeque::new(),
        })
    }

    fn read(&self, w: &Want) -> Option<Vec<u8>> {
        let f = open_beneath(&self.root, &chunk_path(&w.id)).ok()?;
        let mut b = Vec::with_capacity(w.len as usize);
        f.take(w.len as u64 + 1).read_to_end(&mut b).ok()?;
        (b.len() == w.len as usize).then_some(b)
    }
}

impl Source for DeviceSource {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn may_have(&mut self, want: &Want) -> bool {
        rustix::fs::statat(
            &self.root,
            chunk_path(&want.id),
            rustix::fs::AtFlags::empty(),
        )
        .is_ok()
    }

    fn local(&self) -> bool {
        true
    }

    fn depth(&self) -> usize {
        1
    }

    fn request(&mut self, wants: &[Want]) -> Result<(), SourceError> {
        self.pending.push_back(wants.to_vec());
        Ok(())
    }

    fn receive(&mut self) -> Result<Vec<Option<Vec<u8>>>, SourceError> {
        let wants = self.pending.pop_front().unwrap_or_default();
        Ok(wants.iter().map(|w| self.read(w)).collect())
    }
}
