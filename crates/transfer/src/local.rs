//! Sources on this machine: a chunk store (the cache of earlier transfers), and ordinary files
//! (a copy of the tree on a device, an old backup) read where an index or the tree's own
//! layout says a chunk lies. Both are hints: the engine checks every chunk.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use ferry_format::{Id, Recipe};
use ferry_store::ChunkStore;

use crate::{Source, SourceError, Want};

/// Chunks by id, wherever they are kept (a chunk store; the objects of an object store).
pub trait ChunkLookup: Sync {
    /// Whether a chunk is here (a hint).
    fn has_chunk(&self, id: &Id) -> bool;
    /// The chunk's bytes; `None` when it is not here or damaged; an error when the store
    /// itself fails.
    fn chunk(&self, id: &Id) -> Result<Option<Vec<u8>>, String>;
    /// A hint that these chunks will be asked for soon (a store whose reads cost a round trip
    /// starts fetching them).
    fn prefetch(&self, ids: &[Id]) {
        let _ = ids;
    }
}

impl<T: ChunkStore + ?Sized> ChunkLookup for T {
    fn has_chunk(&self, id: &Id) -> bool {
        self.contains(id).unwrap_or(false)
    }

    fn chunk(&self, id: &Id) -> Result<Option<Vec<u8>>, String> {
        // A damaged chunk is not here (the store records the damage).
        match self.get(id) {
            Ok(d) => Ok(d),
            Err(e) if e.is_corrupt() => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    fn prefetch(&self, ids: &[Id]) {
        ChunkStore::prefetch(self, ids)
    }
}

/// A chunk store as a source: chunks earlier transfers brought are never fetched again.
pub struct StoreSource<'a> {
    name: String,
    store: &'a dyn ChunkLookup,
    pending: VecDeque<Vec<Want>>,
}

impl<'a> StoreSource<'a> {
    pub fn new(name: impl Into<String>, store: &'a dyn ChunkLookup) -> Self {
        StoreSource {
            name: name.into(),
            store,
            pending: VecDeque::new(),
        }
    }
}

impl Source for StoreSource<'_> {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn may_have(&mut self, want: &Want) -> bool {
        self.store.has_chunk(&want.id)
    }

    fn local(&self) -> bool {
        true
    }

    fn depth(&self) -> usize {
        1
    }

    fn request(&mut self, wants: &[Want]) -> Result<(), SourceError> {
        let ids: Vec<Id> = wants.iter().map(|w| w.id).collect();
        self.store.prefetch(&ids);
        self.pending.push_back(wants.to_vec());
        Ok(())
    }

    fn receive(&mut self) -> Result<Vec<Option<Vec<u8>>>, SourceError> {
        let wants = self.pending.pop_front().unwrap_or_default();
        // The store failing is this source failing.
        wants
            .iter()
            .map(|w| self.store.chunk(&w.id).map_err(SourceError::new))
            .collect()
    }
}

/// Where chunks lie in a set of files: id → (file, offset, length). Hints: a file may have
/// changed since.
#[derive(Default)]
pub struct FileIndex {
    files: Vec<PathBuf>,
    at: HashMap<Id, (u32, u64, u32)>,
}

impl FileIndex {
    /// Notes that the chunks of `recipe` lie one after another in `file` (a path relative to
    /// the source's root).
    pub fn add(&mut self, file: impl Into<PathBuf>, recipe: &Recipe) {
        let f = self.files.len() as u32;
        self.files.push(file.into());
        for (offset, c) in recipe.with_offsets() {
            self.at.entry(c.id).or_insert((f, offset, c.len));
        }
    }

    pub fn len(&self) -> usize {
        self.at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    fn locate(&self, id: &Id) -> Option<(&Path, u64, u32)> {
        let &(f, off, len) = self.at.get(id)?;
        Some((&self.files[f as usize], off, len))
    }
}

/// Ordinary files under a root as a source: a chunk is read where the index says it lies, or
/// where the want's place says (the same file of the same tree: a mirror's copy, a stick
/// holding an older version). Nothing is read outside the root: every open is resolved
/// beneath it (`openat2(RESOLVE_BENEATH)`), so a symlink on the device cannot lead out.
pub struct FilesSource {
    name: String,
    root: std::os::fd::OwnedFd,
    index: FileIndex,
    /// Whether to try the wants' places (the root holds a copy of the tree being moved).
    by_place: bool,
    pending: VecDeque<Vec<Want>>,
    open: HashMap<PathBuf, Option<File>>,
}

impl FilesSource {
    /// Files under `root`, found by `index` and, with `by_place`, by the wants' places.
    pub fn new(root: &Path, index: FileIndex, by_place: bool) -> std::io::Result<Self> {
        let fd = rustix::fs::open(
            root,
            rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        Ok(FilesSource {
            name: root.display().to_string(),
            root: fd,
            index,
            by_place,
            pending: VecDeque::new(),
            open: HashMap::new(),
        })
    }

    /// `len` bytes at `offset` of `file` (relative to the root), if they can be read.
    fn read(&mut self, file: &Path, offset: u64, len: u32) -> Option<Vec<u8>> {
        let root = &self.root;
        let f = self
            .open
            .entry(file.to_path_buf())
            .or_insert_with(|| open_beneath(root, file).ok())
            .as_ref()?;
        let mut buf = vec![0u8; len as usize];
        f.read_exact_at(&mut buf, offset).ok()?;
        Some(buf)
    }

    fn find(&mut self, want: &Want) -> Option<Vec<u8>> {
        if let Some((file, off, len)) = self.index.locate(&want.id) {
            let file = file.to_path_buf();
            if let Some(d) = self.read(&file, off, len).filter(|d| want.id.matches(d)) {
                return Some(d);
            }
        }
        let place = want.place.as_ref().filter(|_| self.by_place)?;
        let rel = Path::new(std::ffi::OsStr::from_bytes(&place.path));
        self.read(rel, place.offset, want.len)
            .filter(|d| want.id.matches(d))
    }
}

use std::os::unix::ffi::OsStrExt;

/// `openat2(2)`, tried again while the kernel answers EAGAIN. With `RESOLVE_BENEATH` it does so
/// for a path that goes through `..` (a symlink's relative target) whenever a rename anywhere on
/// the machine raced the lookup, asking the caller to retry: a busy server's other sessions
/// would otherwise fail opens at random.
pub fn openat2_beneath(
    dir: &std::os::fd::OwnedFd,
    path: &Path,
    flags: rustix::fs::OFlags,
    mode: rustix::fs::Mode,
    resolve: rustix::fs::ResolveFlags,
) -> rustix::io::Result<std::os::fd::OwnedFd> {
    let mut tries = 0;
    loop {
        match rustix::fs::openat2(dir, path, flags, mode, resolve) {
            Err(rustix::io::Errno::AGAIN) if tries < 1_000 => {
                tries += 1;
                std::thread::yield_now();
            }
            r => return r,
        }
    }
}

/// Opens a regular file `rel` beneath `root`, never through a symlink out of it (nor through
/// `..`, nor a magic link): a device's files cannot lead a source anywhere else.
pub fn open_beneath(root: &std::os::fd::OwnedFd, rel: &Path) -> std::io::Result<File> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let fd = openat2_beneath(
        root,
        rel,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
    )?;
    let st = rustix::fs::fstat(&fd)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(File::from(fd))
}

impl Source for FilesSource {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn may_have(&mut self, want: &Want) -> bool {
        self.index.at.contains_key(&want.id) || (self.by_place && want.place.is_some())
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
        Ok(wants.iter().map(|w| self.find(w)).collect())
    }
}
