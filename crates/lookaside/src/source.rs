//! A device as a source of the transfer engine: each chunk read where the device's index says
//! it lies, from a file whose identity is still the one indexed, and checked against its id
//! before it is handed over. A stale file, a wrong byte or a missing file is "not here"; a
//! device that fails (unplugged mid-read) fails the source, and the engine asks the others.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use ferry_transfer::{Batch, Source, SourceError, Want};

use crate::index::DeviceIndex;
use crate::scan::{stable_inodes, Identity};

/// How a device is matched against what a fetch wants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Matching {
    /// Any chunk the device holds, wherever it lies (a device several versions old helps).
    #[default]
    Chunks,
    /// Only files whose whole content is the file wanted (the paper's design, for comparison).
    WholeFiles,
}

/// What a device did that the engine does not see: chunks it read and found wrong (a file
/// changed in place without its identity changing), and files found changed since indexing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rejections {
    pub chunks: u64,
    pub bytes: u64,
    pub stale_files: u64,
    /// The files counted in `stale_files` (each once, however many fetches find it).
    stale: std::collections::HashSet<u32>,
}

/// See the module documentation.
pub struct DeviceSource {
    name: String,
    root: OwnedFd,
    index: Arc<DeviceIndex>,
    matching: Matching,
    stable_ino: bool,
    pending: VecDeque<Vec<Want>>,
    /// Files opened so far, by index entry: `None` when unusable (gone, or changed).
    open: HashMap<u32, Option<File>>,
    rejections: Arc<Mutex<Rejections>>,
}

impl DeviceSource {
    /// The device at `root` with its `index`; what it rejects is added to `rejections`.
    pub fn new(
        root: &Path,
        index: Arc<DeviceIndex>,
        matching: Matching,
        rejections: Arc<Mutex<Rejections>>,
    ) -> io::Result<Self> {
        let fd = crate::scan::open_root(root)?;
        Ok(DeviceSource {
            name: root.display().to_string(),
            stable_ino: stable_inodes(&fd),
            root: fd,
            index,
            matching,
            pending: VecDeque::new(),
            open: HashMap::new(),
            rejections,
        })
    }

    /// The file of index entry `f`, opened (beneath the root) if it is still the one indexed.
    fn file(&mut self, f: u32) -> Result<Option<&File>, SourceError> {
        if !self.open.contains_key(&f) && self.known_stale(f) {
            self.open.insert(f, None);
        }
        if !self.open.contains_key(&f) {
            let entry = &self.index.files[f as usize];
            let rel = Path::new(std::ffi::OsStr::from_bytes(&entry.path));
            let file = match ferry_transfer::open_beneath(&self.root, rel) {
                Ok(file) => Some(file),
                Err(e) if crate::scan::unusable_file(&e) => None,
                Err(e) => return Err(self.failed(e)),
            };
            let file = match file {
                Some(file) => match Identity::of(&file) {
                    Ok(id) if id.matches(entry, self.stable_ino) => Some(file),
                    Ok(_) => {
                        self.reject(f, 0);
                        None
                    }
                    Err(e) => return Err(self.failed(e)),
                },
                None => None,
            };
            self.open.insert(f, file);
        }
        Ok(self.open[&f].as_ref())
    }

    fn find(&mut self, want: &Want) -> Result<Option<Vec<u8>>, SourceError> {
        let Some((f, offset, len)) = locate(&self.index, self.matching, want) else {
            return Ok(None);
        };
        if len != want.len {
            return Ok(None);
        }
        let Some(file) = self.file(f)? else {
            return Ok(None);
        };
        let mut buf = vec![0u8; len as usize];
        match file.read_exact_at(&mut buf, offset) {
            Ok(()) => {}
            // Cut short since it was opened: changed.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                self.open.insert(f, None);
                self.reject(f, 0);
                return Ok(None);
            }
            Err(e) => return Err(self.failed(e)),
        }
        if !want.id.matches(&buf) {
            // Changed in place with its identity kept: nothing more is taken from it.
            self.open.insert(f, None);
            self.reject(f, len as u64);
            return Ok(None);
        }
        Ok(Some(buf))
    }

    /// Whether an earlier source of this device found file `f` changed.
    fn known_stale(&self, f: u32) -> bool {
        let r = self.rejections.lock().unwrap_or_else(|e| e.into_inner());
        r.stale.contains(&f)
    }

    /// File `f` is not what was indexed; `bytes` of a chunk read from it were wrong.
    fn reject(&self, f: u32, bytes: u64) {
        let mut r = self.rejections.lock().unwrap_or_else(|e| e.into_inner());
        if bytes > 0 {
            r.chunks += 1;
            r.bytes += bytes;
        }
        if r.stale.insert(f) {
            r.stale_files += 1;
        }
    }

    fn failed(&self, e: io::Error) -> SourceError {
        SourceError(format!("{}: {e}", self.name))
    }
}

/// Where `want` lies on a device with `index`: (file, offset, length).
pub(crate) fn locate(
    index: &DeviceIndex,
    matching: Matching,
    want: &Want,
) -> Option<(u32, u64, u32)> {
    match matching {
        Matching::Chunks => {
            let at = index.chunk(&want.id)?;
            Some((at.file, at.offset, at.len))
        }
        Matching::WholeFiles => {
            let place = want.place.as_ref()?;
            let f = index.recipe(place.recipe.as_ref()?)?;
            let end = place.offset.checked_add(want.len as u64)?;
            let fits = end <= index.files[f as usize].size;
            fits.then_some((f, place.offset, want.len))
        }
    }
}

use std::os::unix::ffi::OsStrExt;

impl Source for DeviceSource {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn may_have(&mut self, want: &Want) -> bool {
        locate(&self.index, self.matching, want).is_some()
    }

    fn local(&self) -> bool {
        true
    }

    fn depth(&self) -> usize {
        1
    }

    /// Small enough that a device slower than the network hands little over at a time.
    fn batch(&self) -> Batch {
        Batch {
            chunks: 64,
            bytes: 1 << 20,
        }
    }

    fn request(&mut self, wants: &[Want]) -> Result<(), SourceError> {
        self.pending.push_back(wants.to_vec());
        Ok(())
    }

    fn receive(&mut self) -> Result<Vec<Option<Vec<u8>>>, SourceError> {
        let wants = self.pending.pop_front().unwrap_or_default();
        wants.iter().map(|w| self.find(w)).collect()
    }
}
