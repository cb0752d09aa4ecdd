//! Indexing a device: every regular file under its root cut and hashed (a file unchanged since
//! an earlier index, by its identity, is taken from that index without reading it), and where
//! the index is kept.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use ferry_chunk::ChunkerSpec;
use ferry_format::{chunk_object_parallel, HashAlg};

use crate::index::{valid_path, ChunkerMark, DeviceIndex, IndexedFile, MAX_INDEX_BYTES};

/// The index's name on the device, at its root.
pub const INDEX_NAME: &str = ".ferry-lookaside";

/// A file's identity, as the index records it and as it is checked before the file is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub size: u64,
    pub mtime_ns: i64,
    pub ino: u64,
}

impl Identity {
    pub fn of(fd: &impl std::os::fd::AsFd) -> io::Result<Self> {
        let st = rustix::fs::fstat(fd)?;
        Ok(Identity {
            size: st.st_size as u64,
            // Saturating: a hostile mtime far in the future must not overflow.
            mtime_ns: (st.st_mtime as i64)
                .saturating_mul(1_000_000_000)
                .saturating_add(st.st_mtime_nsec as i64),
            ino: st.st_ino as u64,
        })
    }

    /// Whether a file with this identity is still the one indexed as `f`. Inode numbers count
    /// only on file systems that keep them across mounts (FAT and exFAT make them up at each
    /// mount, so there size and mtime decide; the chunk's hash is checked in any case).
    pub fn matches(&self, f: &IndexedFile, stable_ino: bool) -> bool {
        self.size == f.size && self.mtime_ns == f.mtime_ns && (!stable_ino || self.ino == f.ino)
    }
}

/// Whether the file system holding `root` keeps inode numbers across mounts.
pub fn stable_inodes(root: &OwnedFd) -> bool {
    const MSDOS: i64 = 0x4d44;
    const EXFAT: i64 = 0x2011_bab0;
    const FUSEBLK: i64 = 0x6573_5546;
    match rustix::fs::fstatfs(root) {
        // f_type's width differs between architectures.
        #[allow(clippy::unnecessary_cast)]
        Ok(s) => !matches!(s.f_type as i64, MSDOS | EXFAT | FUSEBLK),
        Err(_) => true,
    }
}

/// What an indexing did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    pub files: u64,
    pub bytes: u64,
    /// Files taken from the earlier index, unchanged.
    pub reused: u64,
    /// Bytes read and hashed.
    pub hashed: u64,
    /// Files that could not be read (permissions, gone meanwhile), and other entries that are
    /// not regular files (symlinks are never followed).
    pub unreadable: u64,
    pub skipped: u64,
}

/// Indexes every regular file under `root` with `spec`; files whose identity matches their
/// entry in `old` (cut with the same chunker) are taken from it. `progress` is told the bytes
/// of each file done.
pub fn scan(
    root: &Path,
    spec: &ChunkerSpec,
    alg: HashAlg,
    old: Option<&DeviceIndex>,
    progress: &dyn Fn(u64),
) -> io::Result<(DeviceIndex, ScanReport)> {
    let chunker = ChunkerMark::of(spec);
    let root_fd = open_root(root)?;
    let stable = stable_inodes(&root_fd);
    let old = old.filter(|o| o.chunker == chunker && o.alg == alg);
    let earlier: std::collections::HashMap<&[u8], &IndexedFile> = old
        .map(|o| o.files.iter().map(|f| (&f.path[..], f)).collect())
        .unwrap_or_default();
    let mut files = vec![];
    let mut report = ScanReport::default();
    let walk = walkdir::WalkDir::new(root)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| !(e.depth() == 1 && is_ours(e.file_name().as_bytes())));
    for entry in walk {
        let entry = match entry {
            Ok(e) => e,
            // The root itself unreadable is an error; below it, one entry is not.
            Err(e) if e.depth() == 0 => return Err(e.into()),
            Err(_) => {
                report.unreadable += 1;
                continue;
            }
        };
        if entry.file_type().is_dir() {
            continue;
        }
        if !entry.file_type().is_file() {
            report.skipped += 1;
            continue;
        }
        let rel = entry.path().strip_prefix(root).expect("beneath the root");
        let path = rel.as_os_str().as_bytes().to_vec();
        if !valid_path(&path) || path.len() > crate::index::MAX_PATH {
            report.skipped += 1;
            continue;
        }
        let file = match ferry_transfer::open_beneath(&root_fd, rel) {
            Ok(f) => f,
            Err(e) if unusable_file(&e) => {
                report.unreadable += 1;
                continue;
            }
            Err(e) => return Err(e),
        };
        let id = Identity::of(&file)?;
        let f = match earlier.get(&path[..]).filter(|f| id.matches(f, stable)) {
            Some(f) => {
                report.reused += 1;
                (*f).clone()
            }
            None => match cut(file, path, id, spec, alg) {
                Ok(f) => {
                    report.hashed += f.size;
                    f
                }
                Err(e) if unusable_file(&e) => {
                    report.unreadable += 1;
                    continue;
                }
                Err(e) => return Err(e),
            },
        };
        report.files += 1;
        report.bytes += f.size;
        progress(f.size);
        files.push(f);
    }
    Ok((DeviceIndex::new(chunker, alg, files), report))
}

/// The index itself and its temporary files: never indexed.
fn is_ours(name: &[u8]) -> bool {
    name.starts_with(INDEX_NAME.as_bytes())
}

/// Errors that make one file of a device unusable without saying anything of the device:
/// gone, not readable, no longer a regular file, or a symlink now (never followed).
pub(crate) fn unusable_file(e: &io::Error) -> bool {
    use rustix::io::Errno;
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied | io::ErrorKind::InvalidInput
    ) || [Errno::LOOP, Errno::XDEV, Errno::NOTDIR]
        .iter()
        .any(|n| e.raw_os_error() == Some(n.raw_os_error()))
}

/// Cuts and hashes one file. A file that changed while it was read is indexed as read (its
/// identity checked before each use says it changed).
fn cut(
    file: File,
    path: Vec<u8>,
    id: Identity,
    spec: &ChunkerSpec,
    alg: HashAlg,
) -> io::Result<IndexedFile> {
    let (recipe, oid) =
        chunk_object_parallel(file.take(id.size), spec, alg, |_, _| Ok::<_, io::Error>(()))?;
    let size = recipe.total_len();
    Ok(IndexedFile {
        path,
        size,
        mtime_ns: id.mtime_ns,
        ino: id.ino,
        oid: oid.id(),
        chunks: recipe.chunks().to_vec(),
    })
}

/// The device's root, opened as a directory (the base every read is resolved beneath).
pub fn open_root(root: &Path) -> io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    Ok(rustix::fs::open(
        root,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Where a device's index is kept when the device cannot take it: in `cache`, under a name
/// made of the device root's canonical path and its file system's id (another stick mounted
/// at the same place is another device).
pub fn cache_path(root: &Path, cache: &Path) -> io::Result<PathBuf> {
    let canon = std::fs::canonicalize(root)?;
    let fsid = rustix::fs::statvfs(&canon)?.f_fsid;
    let mut h = blake3::Hasher::new();
    h.update(canon.as_os_str().as_bytes());
    h.update(&fsid.to_le_bytes());
    let key = hex::encode(&h.finalize().as_bytes()[..16]);
    Ok(cache.join(format!("{key}.idx")))
}

/// Where an index was found or put.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kept {
    OnDevice(PathBuf),
    InCache(PathBuf),
}

impl Kept {
    pub fn path(&self) -> &Path {
        match self {
            Kept::OnDevice(p) | Kept::InCache(p) => p,
        }
    }
}

/// Reads the index of the device at `root`: the newer of the one on the device and the one in
/// `cache`. `Ok(None)` when it has none; an index that cannot be read is an error naming it.
pub fn load(root: &Path, cache: &Path) -> io::Result<Option<(DeviceIndex, Kept)>> {
    // The device's own index is opened beneath its root (never through a symlink there).
    let on_device = open_root(root)
        .and_then(|fd| ferry_transfer::open_beneath(&fd, Path::new(INDEX_NAME)))
        .ok();
    let mut found: Vec<(std::time::SystemTime, File, Kept)> = vec![];
    if let Some(f) = on_device {
        found.push((
            f.metadata()?.modified()?,
            f,
            Kept::OnDevice(root.join(INDEX_NAME)),
        ));
    }
    if let Ok(p) = cache_path(root, cache) {
        if let Ok(f) = File::open(&p) {
            found.push((f.metadata()?.modified()?, f, Kept::InCache(p)));
        }
    }
    let Some((_, f, kept)) = found.into_iter().max_by_key(|(t, _, _)| *t) else {
        return Ok(None);
    };
    let invalid = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {why}", kept.path().display()),
        )
    };
    if f.metadata()?.len() > MAX_INDEX_BYTES {
        return Err(invalid(format!(
            "larger than the {} MiB an index may take",
            MAX_INDEX_BYTES >> 20
        )));
    }
    let mut bytes = vec![];
    f.take(MAX_INDEX_BYTES).read_to_end(&mut bytes)?;
    let index = DeviceIndex::decode(&bytes).map_err(|e| invalid(e.to_string()))?;
    Ok(Some((index, kept)))
}

/// Writes `index` for the device at `root`: onto the device, or when it cannot be written
/// (read-only, full, not ours to write) into `cache`. Atomic: a temporary file synced, then
/// renamed over the old index. The other copy, if any, is removed so it cannot shadow this one.
pub fn save(root: &Path, cache: &Path, index: &DeviceIndex, to_cache: bool) -> io::Result<Kept> {
    let bytes = index.encode();
    let cached = cache_path(root, cache)?;
    if !to_cache {
        match write_atomic(&root.join(INDEX_NAME), &bytes) {
            Ok(()) => {
                let _ = std::fs::remove_file(&cached);
                return Ok(Kept::OnDevice(root.join(INDEX_NAME)));
            }
            Err(e) => tracing::info!("{}: cannot write the index there ({e})", root.display()),
        }
    }
    std::fs::create_dir_all(cache)?;
    write_atomic(&cached, &bytes)?;
    Ok(Kept::InCache(cached))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let dir = path.parent().expect("a file in a directory");
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!("{INDEX_NAME}.tmp"))
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    File::open(dir)?.sync_all()
}

/// What reading a device's files again found of its index's claims.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verified {
    /// Files as indexed.
    pub ok: u64,
    /// Files gone.
    pub missing: Vec<Vec<u8>>,
    /// Files whose identity changed since indexing (they are not used until indexed again).
    pub changed: Vec<Vec<u8>>,
    /// Files with their indexed identity but other content (each chunk read from them fails
    /// its check, and is not used).
    pub wrong: Vec<Vec<u8>>,
}

/// Reads every file `index` names under `root` again and compares.
pub fn verify(root: &Path, index: &DeviceIndex) -> io::Result<Verified> {
    let root_fd = open_root(root)?;
    let stable = stable_inodes(&root_fd);
    let spec = index_spec(index)?;
    let mut v = Verified::default();
    for f in &index.files {
        let rel = Path::new(std::ffi::OsStr::from_bytes(&f.path));
        let file = match ferry_transfer::open_beneath(&root_fd, rel) {
            Ok(file) => file,
            Err(e) if unusable_file(&e) => {
                v.missing.push(f.path.clone());
                continue;
            }
            Err(e) => return Err(e),
        };
        let id = Identity::of(&file)?;
        if !id.matches(f, stable) {
            v.changed.push(f.path.clone());
            continue;
        }
        let now = cut(file, f.path.clone(), id, &spec, index.alg)?;
        if now.oid == f.oid && now.chunks == f.chunks {
            v.ok += 1;
        } else {
            v.wrong.push(f.path.clone());
        }
    }
    Ok(v)
}

/// The chunker an index was cut with, to cut again with it (a keyed one cannot be: only its
/// fingerprint is recorded).
fn index_spec(index: &DeviceIndex) -> io::Result<ChunkerSpec> {
    let m = &index.chunker;
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
    if m.key.is_some() {
        return Err(bad("the index was cut with a keyed chunker"));
    }
    let alg =
        ferry_chunk::Algorithm::from_tag(m.algorithm).ok_or_else(|| bad("unknown chunker"))?;
    let spec = ChunkerSpec {
        algorithm: alg,
        min: m.min as usize,
        avg: m.avg as usize,
        max: m.max as usize,
        key: None,
    };
    spec.validate().map_err(|e| bad(&e.0))?;
    Ok(spec)
}
