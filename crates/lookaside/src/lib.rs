//! Lookaside caching (`../shared/seeds/003_…`): portable and nearby storage — a USB stick, a DVD,
//! an old backup, a copy of a tree — as a source of the chunks a fetch wants, safely.
//!
//! The server names every chunk (and every file) by its hash; a device holding data with that
//! hash can supply it instead of the slow link. A device keeps any layout its user chose: an
//! index ([`DeviceIndex`], kept on the device or, for a read-only one, in the user's cache)
//! says where each chunk of each file lies. The paper matched whole files; here any chunk
//! matches, so a device several versions old still helps ([`Matching`]).
//!
//! Nothing a device holds is trusted: an index is a hint, a file is used only while its
//! identity (size, mtime, inode) is the one indexed, every chunk read is checked against its id
//! before use, and every open is resolved beneath the device's root (no symlink leads out). A
//! stale, wrong or vanished device costs time, never correctness.
//!
//! A device is one more [`Source`](ferry_transfer::Source) of the transfer engine, searched
//! before the network; the engine measures its rate with the others' and lets the network take
//! what a slower device has not reached (the paper's one loss was a device slower than a LAN).

mod index;
mod registry;
mod scan;
mod source;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ferry_chunk::ChunkerSpec;
use ferry_format::HashAlg;
use ferry_transfer::{SourceReport, Want};

pub use index::{ChunkerMark, DeviceIndex, IndexedFile, Location, MAX_INDEX_BYTES, MAX_PATH};
pub use registry::{Entry, Registry, Supplied};
pub use scan::{
    cache_path, load, save, scan, verify, Identity, Kept, ScanReport, Verified, INDEX_NAME,
};
pub use source::{DeviceSource, Matching, Rejections};

/// A device ready for fetches: its root and its index.
struct Device {
    root: PathBuf,
    index: Arc<DeviceIndex>,
    rejections: Arc<Mutex<Rejections>>,
    /// What fetches took from it, as the engine reported.
    supplied: Mutex<Supplied>,
}

/// Why a registered device takes no part in fetches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unusable {
    /// It has no index yet.
    NoIndex,
    /// Its index was cut with another chunker (re-index it).
    OtherChunker(String),
    /// It cannot be read (not mounted, not a directory, a damaged index): the error.
    Failed(String),
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unusable::NoIndex => f.write_str("not indexed yet"),
            Unusable::OtherChunker(c) => write!(f, "indexed with another chunker ({c})"),
            Unusable::Failed(e) => f.write_str(e),
        }
    }
}

/// The devices a fetch may look aside to, in search order, with what each supplied.
#[derive(Default)]
pub struct Lookaside {
    devices: Vec<Device>,
    matching: Matching,
}

impl std::fmt::Debug for Lookaside {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.devices.iter().map(|d| &d.root))
            .finish()
    }
}

impl Lookaside {
    /// Loads the index of each device at `roots` (in search order) cut with `spec`; those that
    /// cannot take part are returned beside, with the reason.
    pub fn load(
        roots: &[PathBuf],
        cache: &Path,
        spec: &ChunkerSpec,
        alg: HashAlg,
        matching: Matching,
    ) -> (Lookaside, Vec<(PathBuf, Unusable)>) {
        let want = ChunkerMark::of(spec);
        let mut devices = vec![];
        let mut unusable = vec![];
        for root in roots {
            match scan::load(root, cache) {
                Ok(Some((index, _))) if index.chunker == want && index.alg == alg => {
                    devices.push((root.clone(), index))
                }
                Ok(Some((index, _))) => unusable.push((
                    root.clone(),
                    Unusable::OtherChunker(index.chunker.describe()),
                )),
                Ok(None) if root.is_dir() => unusable.push((root.clone(), Unusable::NoIndex)),
                Ok(None) => unusable.push((
                    root.clone(),
                    Unusable::Failed("not a directory (not mounted?)".into()),
                )),
                Err(e) => unusable.push((root.clone(), Unusable::Failed(e.to_string()))),
            }
        }
        (Lookaside::new(devices, matching), unusable)
    }

    /// Devices with their indexes, in search order.
    pub fn new(devices: Vec<(PathBuf, DeviceIndex)>, matching: Matching) -> Self {
        Lookaside {
            devices: devices
                .into_iter()
                .map(|(root, index)| Device {
                    root,
                    index: Arc::new(index),
                    rejections: Arc::default(),
                    supplied: Mutex::default(),
                })
                .collect(),
            matching,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// Whether some device may hold `want` (a look at the indexes).
    pub fn may_have(&self, want: &Want) -> bool {
        self.devices
            .iter()
            .any(|d| source::locate(&d.index, self.matching, want).is_some())
    }

    /// A source for each device, in search order (a device that cannot be opened now is left
    /// out, and said so in the log).
    pub fn sources(&self) -> Vec<DeviceSource> {
        self.devices
            .iter()
            .filter_map(|d| {
                DeviceSource::new(
                    &d.root,
                    d.index.clone(),
                    self.matching,
                    d.rejections.clone(),
                )
                .map_err(|e| tracing::warn!("lookaside {}: {e}", d.root.display()))
                .ok()
            })
            .collect()
    }

    /// Counts what a fetch's sources did (the engine's reports; those not of a device are
    /// ignored).
    pub fn record(&self, reports: &[SourceReport]) {
        for r in reports {
            if let Some(d) = self
                .devices
                .iter()
                .find(|d| d.root.display().to_string() == r.name)
            {
                d.supplied
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .add(&Supplied {
                        requests: r.requests,
                        chunks: r.chunks,
                        bytes: r.bytes,
                        misses: r.misses,
                        rejected: r.rejected,
                        rejected_bytes: r.rejected_bytes,
                        stale_files: 0,
                    });
            }
        }
    }

    /// What each device supplied so far, with what it read and rejected.
    pub fn supplied(&self) -> Vec<(PathBuf, Supplied)> {
        self.devices
            .iter()
            .map(|d| {
                let mut s = d.supplied.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let r = d.rejections.lock().unwrap_or_else(|e| e.into_inner());
                s.rejected += r.chunks;
                s.rejected_bytes += r.bytes;
                s.stale_files += r.stale_files;
                (d.root.clone(), s)
            })
            .collect()
    }
}
