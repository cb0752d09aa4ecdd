//! Uploads: what the server holds (Have, GetKeys), and the new version written into a
//! temporary file as it arrives (Create, Write), to be installed (Commit: `commit.rs`) or
//! dropped (Abort, or the session's end).

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;

use ferry_format::{ChunkRef, Id, Recipe, SpareHasher};
use ferry_proto::{ErrorCode, Ids, KeyOlds, Keys, Payload, Reply, WirePath, WritePart};
use ferry_store::VerifiedChunk;

use super::{error, io_error, Server};
use crate::export::os;

/// Bytes of an upload whose object id is hashed on the session's thread; past that, on a
/// thread of its own.
const WHOLE_INLINE: u64 = 8 << 20;
/// Bytes of a base run read at once.
const BASE_SLICE: usize = 4 << 20;
/// Uploads open at once in a session; a client writes one file at a time, so a few suffice.
const MAX_UPLOADS: usize = 16;
/// Bytes of old data one GetKeys keys at most (a prefix holds no more).
const MAX_KEYED: u64 = crate::delta::MAX_PREFIX as u64;
/// Pieces kept for the Writes to come, at most (12 bytes each); the oldest files' go first.
const MAX_KEPT_PIECES: usize = 4 << 20;

/// The uploads of a session.
pub(crate) struct Uploads {
    open: HashMap<u32, Upload>,
    /// The pieces of each file's last GetKeys, which its Writes' data parts name by index;
    /// oldest first.
    keyed: std::collections::VecDeque<Keyed>,
    kept_pieces: usize,
    /// Makes this session's temporary names its own (sessions of one daemon share a pid).
    pub(super) tag: u64,
    counter: u64,
    /// Bytes and entries this session put in the trash since it last trimmed it; `None` until
    /// its first trim.
    pub(super) trashed: Option<(u64, usize)>,
    /// Directories (device, inode) this session cleared of stale temporaries: once each, not at
    /// every upload (a scan of the directory each time made a `cp -a` into a large one grow
    /// with the square of its size).
    swept: std::collections::HashSet<(u64, u64)>,
}

impl Default for Uploads {
    fn default() -> Self {
        Uploads {
            open: HashMap::new(),
            keyed: Default::default(),
            kept_pieces: 0,
            tag: rand::random(),
            counter: 0,
            trashed: None,
            swept: Default::default(),
        }
    }
}

impl Uploads {
    /// Takes upload `handle` out of the open ones (to commit or drop it).
    pub(super) fn take(&mut self, handle: u32) -> Option<Upload> {
        self.open.remove(&handle)
    }

    pub(super) fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    /// Keeps `k` (in place of keys of the same file), dropping the oldest past the bound.
    fn keep(&mut self, k: Keyed) {
        if let Some(i) = self.keyed.iter().position(|o| o.path == k.path) {
            let old = self.keyed.remove(i).expect("found");
            self.kept_pieces -= old.pieces.len();
        }
        self.kept_pieces += k.pieces.len();
        self.keyed.push_back(k);
        while self.kept_pieces > MAX_KEPT_PIECES && self.keyed.len() > 1 {
            let old = self.keyed.pop_front().expect("non-empty");
            self.kept_pieces -= old.pieces.len();
        }
    }

    fn keys_for(&self, path: &WirePath, version: u64) -> Option<&Keyed> {
        self.keyed
            .iter()
            .rev()
            .find(|k| k.path == *path && k.version == version)
    }
}

/// Pieces of a version of a file, keyed for a client.
struct Keyed {
    path: WirePath,
    version: u64,
    /// (offset, length) of each piece in that version.
    pieces: Vec<(u64, u32)>,
}

/// A new version being written.
pub(super) struct Upload {
    pub(super) path: WirePath,
    pub(super) dir: OwnedFd,
    pub(super) name: Vec<u8>,
    pub(super) tmp: String,
    pub(super) out: BufWriter<File>,
    /// The object id of what was written, each part given after it is written.
    pub(super) whole: SpareHasher,
    /// A large upload's bytes go to the disk as they arrive: the sync before its rename then
    /// waits for the last of them only.
    pub(super) writeback: crate::writeback::Writeback,
    pub(super) size: u64,
    /// The new version's recipe so far.
    pub(super) chunks: Vec<ChunkRef>,
    /// Which of them came as data (not yet staged, unless every write is).
    pub(super) sent: Vec<bool>,
    pub(super) base: Option<Base>,
    /// The object id the commit named, once checked (`prepare`).
    pub(super) oid: Option<Id>,
}

/// The version an upload is written against.
pub(super) struct Base {
    pub(super) version: u64,
    /// Opened at Create: the bytes referred to are those of this version even if the name
    /// changes meanwhile (and if the file itself is changed in place, the commit's check of
    /// the whole object id catches it).
    file: File,
    recipe: Recipe,
    offsets: Vec<u64>,
    /// (short id, chunk index), sorted.
    by_short: Vec<(u64, u32)>,
}

impl Base {
    fn new(version: u64, file: File, recipe: Recipe) -> Base {
        let offsets: Vec<u64> = recipe.with_offsets().map(|(o, _)| o).collect();
        let mut by_short: Vec<(u64, u32)> = recipe
            .chunks()
            .iter()
            .enumerate()
            .map(|(i, c)| (ferry_proto::short_id(&c.id), i as u32))
            .collect();
        by_short.sort_unstable();
        Base {
            version,
            file,
            recipe,
            offsets,
            by_short,
        }
    }

    fn by_short(&self, short: u64) -> Option<usize> {
        let i = self.by_short.partition_point(|&(s, _)| s < short);
        self.by_short
            .get(i)
            .filter(|(s, _)| *s == short)
            .map(|&(_, c)| c as usize)
    }

    /// The bytes of chunks `first..first + n` (adjacent in the file).
    fn read(&self, first: usize, n: usize) -> io::Result<Vec<u8>> {
        let chunks = self.recipe.chunks().get(first..first + n).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "no such chunks in the base")
        })?;
        let len: u64 = chunks.iter().map(|c| c.len as u64).sum();
        let mut buf = vec![0u8; len as usize];
        self.file.read_exact_at(&mut buf, self.offsets[first])?;
        Ok(buf)
    }
}

/// Why a Write failed: a request to refuse, or chunks the server cannot find.
enum WriteError {
    Bad(String),
    Missing(String),
    Io(io::Error),
}

impl From<io::Error> for WriteError {
    fn from(e: io::Error) -> Self {
        WriteError::Io(e)
    }
}

impl Server {
    /// CONDWRITE: which of the chunks the server holds for this client (its staging store,
    /// and what it can find in the export and the trash).
    pub(super) fn have(&mut self, ids: &Ids) -> Reply {
        let flags = (0..ids.len())
            .map(|i| {
                let id = match ids {
                    Ids::Full(v) => Some(v[i]),
                    Ids::Short(v) => self
                        .by_short(v[i])
                        .or_else(|| self.staging.find_prefix(v[i]).ok().flatten()),
                };
                id.is_some_and(|id| {
                    self.staging.contains(&id).unwrap_or(false) || self.chunk(&id).is_some()
                })
            })
            .collect();
        Reply::Have(flags)
    }

    /// Keys of pieces of the chunks `olds` of the file at `path` (which must be at `version`),
    /// for a client to compress `new_bytes` of new data against. Remembered for the Writes
    /// that follow.
    pub(super) fn get_keys(
        &mut self,
        path: &WirePath,
        version: Option<u64>,
        olds: &KeyOlds,
        new_bytes: u64,
    ) -> Reply {
        match self.keys_of(path, version, olds, new_bytes) {
            Ok(k) => Reply::Keys(k),
            Err(r) => r,
        }
    }

    fn keys_of(
        &mut self,
        path: &WirePath,
        version: Option<u64>,
        olds: &KeyOlds,
        new_bytes: u64,
    ) -> Result<Keys, Reply> {
        let (recipe, v, _) = self.recipe(path).map_err(|e| io_error(path, &e))?;
        if let Some(version) = version.filter(|&want| want != v) {
            return Err(error(
                ErrorCode::Conflict,
                format!("{path:?} changed since version {version}"),
            ));
        }
        let olds: Vec<u32> = match olds {
            KeyOlds::Indices(i) => i.clone(),
            KeyOlds::Except(keep) => {
                let keep: std::collections::HashSet<u64> = keep.iter().copied().collect();
                let dropped = recipe.chunks().iter().enumerate();
                dropped
                    .filter(|(_, c)| !keep.contains(&ferry_proto::short_id(&c.id)))
                    .map(|(i, _)| i as u32)
                    .collect()
            }
        };
        let file = self
            .export
            .open_file(path)
            .map_err(|e| io_error(path, &e))?;
        // Runs of adjacent old chunks, each cut on its own, as the client cuts runs of new ones.
        let offsets: Vec<(u64, u32)> = recipe.with_offsets().map(|(o, c)| (o, c.len)).collect();
        let mut runs: Vec<(u64, u64)> = vec![];
        let mut total = 0;
        for &i in &olds {
            let Some(&(off, len)) = offsets.get(i as usize) else {
                return Err(error(ErrorCode::BadRequest, format!("no old chunk {i}")));
            };
            if total + len as u64 > MAX_KEYED {
                break;
            }
            total += len as u64;
            match runs.last_mut() {
                Some(r) if r.1 == off => r.1 += len as u64,
                _ => runs.push((off, off + len as u64)),
            }
        }
        let mut pieces = vec![];
        let mut keys = vec![];
        let mut sample = crate::delta::Compressibility::default();
        let mut buf = vec![];
        for (start, end) in runs {
            buf.resize((end - start) as usize, 0);
            file.read_exact_at(&mut buf, start)
                .map_err(|e| io_error(path, &e))?;
            sample.sample(&buf);
            for r in crate::delta::pieces(&buf) {
                keys.push(crate::delta::piece_key(&buf[r.clone()], 8));
                pieces.push((start + r.start as u64, r.len() as u32));
            }
        }
        let runs = sample.incompressible();
        let new = new_bytes.min(crate::delta::MAX_DATA as u64) as usize / 256;
        let key_bytes = crate::delta::key_bytes(keys.len(), new, runs);
        let mask = u64::MAX >> (64 - 8 * key_bytes as u32);
        keys.iter_mut().for_each(|k| *k &= mask);
        self.uploads.keep(Keyed {
            path: path.clone(),
            version: v,
            pieces,
        });
        Ok(Keys {
            key_bytes,
            runs,
            keys,
        })
    }

    /// MKTMPFILE: a temporary file beside `path`, written against version `base` of the file
    /// there (or against nothing: then nothing may be there at commit).
    pub(super) fn create(&mut self, handle: u32, path: &WirePath, base: Option<u64>) -> Reply {
        if self.uploads.open.contains_key(&handle) {
            return error(ErrorCode::BadRequest, format!("upload {handle} is open"));
        }
        if self.uploads.open.len() >= MAX_UPLOADS {
            return error(ErrorCode::Busy, "too many uploads open in this session");
        }
        match self.open_upload(path, base) {
            Ok(u) => {
                self.uploads.open.insert(handle, u);
                Reply::Ok
            }
            Err(r) => r,
        }
    }

    fn open_upload(&mut self, path: &WirePath, base: Option<u64>) -> Result<Upload, Reply> {
        let ioe = |e: io::Error| io_error(path, &e);
        let (dir, name) = self.export.parent(path).map_err(ioe)?;
        let base = match base {
            None => None,
            Some(v) => {
                let (recipe, version, _) = self.recipe(path).map_err(ioe)?;
                if version != v {
                    return Err(error(
                        ErrorCode::Conflict,
                        format!("{path:?} changed since version {v}"),
                    ));
                }
                let file = self.export.open_file(path).map_err(ioe)?;
                Some(Base::new(v, file, recipe))
            }
        };
        let id = rustix::fs::fstat(&dir).map(|st| (st.st_dev, st.st_ino));
        if id.is_ok_and(|id| self.uploads.swept.insert(id)) {
            crate::export::remove_stale_temps(&dir);
        }
        let n = self.uploads.next();
        let tmp = crate::export::commit_temp_name(self.uploads.tag, n);
        let fd = rustix::fs::openat(
            &dir,
            os(tmp.as_bytes()),
            rustix::fs::OFlags::CREATE
                | rustix::fs::OFlags::EXCL
                | rustix::fs::OFlags::RDWR
                | rustix::fs::OFlags::CLOEXEC
                | rustix::fs::OFlags::NOFOLLOW,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .map_err(|e| ioe(e.into()))?;
        Ok(Upload {
            path: path.clone(),
            dir,
            name,
            tmp,
            out: BufWriter::with_capacity(1 << 20, File::from(fd)),
            whole: SpareHasher::new(self.opts.hash, WHOLE_INLINE),
            writeback: Default::default(),
            size: 0,
            chunks: vec![],
            sent: vec![],
            base,
            oid: None,
        })
    }

    /// TMPWRITE: appends what the parts name. Any failure drops the upload.
    pub(super) fn write(&mut self, handle: u32, parts: Vec<WritePart>) -> Reply {
        let Some(mut u) = self.uploads.open.remove(&handle) else {
            return error(ErrorCode::BadRequest, format!("no upload {handle}"));
        };
        for part in parts {
            if let Err(e) = self.write_part(&mut u, part) {
                let path = u.path.clone();
                discard(u);
                return match e {
                    WriteError::Bad(m) => error(ErrorCode::BadRequest, format!("{path:?}: {m}")),
                    WriteError::Missing(m) => {
                        error(ErrorCode::MissingChunks, format!("{path:?}: {m}"))
                    }
                    WriteError::Io(e) => io_error(&path, &e),
                };
            }
        }
        self.uploads.open.insert(handle, u);
        Reply::Ok
    }

    fn write_part(&mut self, u: &mut Upload, part: WritePart) -> Result<(), WriteError> {
        let no_base = || WriteError::Bad("a reference to the base of an upload without one".into());
        match part {
            WritePart::Base { start, count } => {
                let (start, count) = (start as usize, count as usize);
                let len = u.base.as_ref().ok_or_else(no_base)?.recipe.len();
                let end = start.checked_add(count).filter(|&e| e <= len);
                let end = end.ok_or_else(|| {
                    WriteError::Bad(format!("chunks {start}+{count} of a base of fewer"))
                })?;
                // In slices, so a run of a large file is not read into memory at once.
                let mut at = start;
                while at < end {
                    let base = u.base.as_ref().ok_or_else(no_base)?;
                    let mut n = 0;
                    let mut bytes = 0usize;
                    while at + n < end && (n == 0 || bytes < BASE_SLICE) {
                        bytes += base.recipe.chunks()[at + n].len as usize;
                        n += 1;
                    }
                    let data = base.read(at, n)?;
                    let chunks = base.recipe.chunks()[at..at + n].to_vec();
                    u.append(&data, &chunks, false)?;
                    u.whole.update(data);
                    at += n;
                }
            }
            WritePart::Chunks(refs) => {
                for c in refs {
                    let bytes = self.find(u, &c)?;
                    u.append(&bytes, &[c], false)?;
                    u.whole.update(bytes);
                }
            }
            WritePart::Data { lens, payload } => {
                let total: usize = lens.iter().map(|&l| l as usize).sum();
                let bytes = match payload {
                    Payload::Plain(d) if d.len() == total => d,
                    Payload::Plain(d) => {
                        return Err(WriteError::Bad(format!(
                            "{} bytes of data for {total}",
                            d.len()
                        )))
                    }
                    Payload::Frame { context: true, .. } => {
                        return Err(WriteError::Bad("a context in a write".into()))
                    }
                    Payload::Frame {
                        olds, refs, data, ..
                    } => {
                        let prefix = self.upload_prefix(u, &olds, &refs)?;
                        crate::delta::decode(&data, &prefix, total)
                            .map_err(|e| WriteError::Bad(format!("a frame that fails: {e}")))?
                    }
                };
                let mut at = 0;
                for len in lens {
                    let chunk = &bytes[at..at + len as usize];
                    at += len as usize;
                    let v = VerifiedChunk::hash(self.opts.hash, chunk);
                    // Staged too (or, if the upload is cut, at the end of the session): a cut
                    // upload finds it again (Have) when it resumes.
                    if self.opts.stage_writes {
                        if let Err(e) = self.staging.put(&v) {
                            if e.is_disk_full() {
                                return Err(WriteError::Io(io::ErrorKind::StorageFull.into()));
                            }
                            tracing::debug!("staging: {e}");
                        }
                    }
                    u.append(chunk, &[ChunkRef { id: *v.id(), len }], true)?;
                }
                u.whole.update(bytes);
            }
        }
        Ok(())
    }

    /// A chunk a Write names by id: from the base, the staging store, or where it was seen.
    fn find(&mut self, u: &Upload, c: &ChunkRef) -> Result<Vec<u8>, WriteError> {
        if let Some(base) = &u.base {
            let i = base.by_short(ferry_proto::short_id(&c.id));
            if let Some(i) = i.filter(|&i| base.recipe.chunks()[i] == *c) {
                return Ok(base.read(i, 1)?);
            }
        }
        if let Ok(Some(d)) = self.staging.get(&c.id) {
            return Ok(d);
        }
        self.chunk(&c.id)
            .filter(|d| d.len() == c.len as usize)
            .ok_or_else(|| WriteError::Missing(format!("chunk {} is neither sent nor found", c.id)))
    }

    /// The prefix a Write's frame names: chunks of the base by index, then pieces of the last
    /// GetKeys (which must have keyed the same base).
    fn upload_prefix(&self, u: &Upload, olds: &[u32], refs: &[u32]) -> Result<Vec<u8>, WriteError> {
        let mut prefix = vec![];
        let too_long = || WriteError::Bad("a prefix too long".into());
        if !olds.is_empty() {
            let base = u.base.as_ref().ok_or_else(|| {
                WriteError::Bad("old chunks named in an upload without a base".into())
            })?;
            for &i in olds {
                let c = base
                    .recipe
                    .chunks()
                    .get(i as usize)
                    .ok_or_else(|| WriteError::Bad(format!("no old chunk {i}")))?;
                if prefix.len() + c.len as usize > crate::delta::MAX_PREFIX {
                    return Err(too_long());
                }
                prefix.extend_from_slice(&base.read(i as usize, 1)?);
            }
        }
        if !refs.is_empty() {
            let Some(base) = &u.base else {
                return Err(WriteError::Bad("pieces named without a base".into()));
            };
            // Keys dropped since (a batch of many files) are no reason to refuse the file:
            // the client sends its data again, plainly.
            let k = self
                .uploads
                .keys_for(&u.path, base.version)
                .ok_or_else(|| WriteError::Missing("pieces of keys no longer kept".into()))?;
            for &r in refs {
                let &(off, len) = k
                    .pieces
                    .get(r as usize)
                    .ok_or_else(|| WriteError::Bad(format!("no piece {r}")))?;
                if prefix.len() + len as usize > crate::delta::MAX_PREFIX {
                    return Err(too_long());
                }
                let at = prefix.len();
                prefix.resize(at + len as usize, 0);
                base.file.read_exact_at(&mut prefix[at..], off)?;
            }
        }
        Ok(prefix)
    }

    pub(super) fn abort(&mut self, handle: u32) -> Reply {
        if let Some(u) = self.uploads.take(handle) {
            self.stage_cut(u);
        }
        Reply::Ok
    }

    /// The uploads still open when the session ends (its link was cut): their chunks staged,
    /// their temporaries removed.
    pub(super) fn abandon_uploads(&mut self) {
        let open: Vec<Upload> = self.uploads.open.drain().map(|(_, u)| u).collect();
        for u in open {
            self.stage_cut(u);
        }
    }

    /// Drops an upload cut short, staging the chunks it received as data (unless every write
    /// was staged as it came): read back from its temporary file and checked against their ids,
    /// so a resumed upload finds them (Have) without sending them again.
    fn stage_cut(&mut self, mut u: Upload) {
        if !self.opts.stage_writes && u.out.flush().is_ok() {
            let file = u.out.get_ref();
            let mut at = 0u64;
            for (c, &sent) in u.chunks.iter().zip(&u.sent) {
                let offset = at;
                at += c.len as u64;
                if !sent {
                    continue;
                }
                let mut buf = vec![0u8; c.len as usize];
                if file.read_exact_at(&mut buf, offset).is_err() {
                    break;
                }
                let v = VerifiedChunk::hash(self.opts.hash, &buf);
                if v.id() != &c.id {
                    break;
                }
                if let Err(e) = self.staging.put(&v) {
                    tracing::debug!("staging a cut upload: {e}");
                    break;
                }
            }
            if let Err(e) = self.staging.flush() {
                tracing::debug!("staging a cut upload: {e}");
            }
        }
        discard(u);
    }
}

impl Upload {
    pub(super) fn size(&self) -> u64 {
        self.size
    }

    pub(super) fn path(&self) -> &WirePath {
        &self.path
    }

    /// The temporary file written.
    pub(super) fn file(&self) -> &File {
        self.out.get_ref()
    }

    /// Appends `bytes`, made of `chunks`; `sent`: they came as data. (The caller gives them
    /// to `whole` after.)
    fn append(&mut self, bytes: &[u8], chunks: &[ChunkRef], sent: bool) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.writeback.wrote(self.out.get_ref(), bytes.len());
        self.size += bytes.len() as u64;
        self.chunks.extend_from_slice(chunks);
        self.sent.resize(self.chunks.len(), sent);
        Ok(())
    }
}

/// Drops an upload: its temporary file goes.
pub(super) fn discard(u: Upload) {
    let _ = rustix::fs::unlinkat(&u.dir, os(u.tmp.as_bytes()), rustix::fs::AtFlags::empty());
}
