//! The command-line client: reach a server, list, fetch.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ferry_chunk::{ChunkReader, ChunkerSpec};
use ferry_format::{ChunkRef, HashAlg, Id, Recipe};
use ferry_proto::{
    short_id, Attr, Context, DirEntry, FileKind, OldIds, RecipePart, Reply, Request, TreeItem,
    WirePath,
};
use ferry_store::{ChunkStore, VerifiedChunk};

use crate::conn::{ConnError, Connection};

/// `host:path`, as rsync and scp write it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteSpec {
    pub host: String,
    pub path: String,
}

impl RemoteSpec {
    /// Parses `host:path`; `None` if `s` is not a remote (a local path, or `./a:b`).
    pub fn parse(s: &str) -> Option<RemoteSpec> {
        let (host, path) = s.split_once(':')?;
        if host.is_empty() || host.contains('/') {
            return None;
        }
        Some(RemoteSpec {
            host: host.to_string(),
            path: if path.is_empty() {
                ".".into()
            } else {
                path.to_string()
            },
        })
    }
}

/// One `ls` entry.
pub type Listing = Vec<DirEntry>;

/// Attributes of `path`, and its entries when it is a directory.
pub fn list<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    path: &WirePath,
) -> Result<(Attr, Listing), ConnError> {
    let attr = get_attr(conn, path)?;
    if attr.kind != FileKind::Dir {
        return Ok((attr, vec![]));
    }
    let mut out = vec![];
    for r in conn.call(Request::ReadDir { path: path.clone() })? {
        match r {
            Reply::DirEntries(es) => out.extend(es),
            other => return Err(ConnError::Unexpected(format!("{other:?}"))),
        }
    }
    Ok((attr, out))
}

fn get_attr<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    path: &WirePath,
) -> Result<Attr, ConnError> {
    match conn.call(Request::GetAttr { path: path.clone() })?.pop() {
        Some(Reply::Attr(a)) => Ok(a),
        other => Err(ConnError::Unexpected(format!("{other:?}"))),
    }
}

/// What a fetch cost and where its chunks came from.
#[derive(Clone, Debug, Default)]
pub struct GetStats {
    /// Files fetched.
    pub files: u64,
    /// Files skipped because size, mtime and mode already matched.
    pub unchanged: u64,
    /// Entries removed from the destination (with `delete`).
    pub deleted: u64,
    /// With `dry_run`: what would be done, one line each (`fetch PATH`, `delete PATH`, …).
    pub planned: Vec<String>,
    pub bytes: u64,
    pub chunks: u64,
    pub from_cache: u64,
    pub from_local: u64,
    pub from_server: u64,
    pub bytes_from_server: u64,
    /// Of the chunks from the server, those sent compressed against the old local file.
    pub against_old: u64,
}

/// Chunk sources on the receiving side, tried before the server.
pub struct Sources<'a> {
    /// The persistent client cache.
    pub cache: &'a dyn ChunkStore,
    pub chunker: ChunkerSpec,
    /// Also remove what the destination has and the server does not (rsync's `--delete`).
    pub delete: bool,
    /// Change nothing locally: list what would be fetched and deleted in `GetStats::planned`.
    pub dry_run: bool,
    /// The cache held nothing when the transfer began: small new files are read whole.
    pub cold: bool,
    /// Nothing in the cache could hold chunks of new files (it was empty when the transfer
    /// began): large new files are read whole too, by ranges, with no recipe.
    pub ranges: bool,
    /// Told the bytes of each chunk written (for progress bars).
    pub progress: Option<&'a dyn Fn(u64)>,
}

/// How to upload.
pub struct PutOptions<'a> {
    pub chunker: ChunkerSpec,
    /// Also remove what the server has and the local tree does not.
    pub delete: bool,
    /// Change nothing on the server: list what would be sent and deleted in `PutStats::planned`.
    pub dry_run: bool,
    /// Told the bytes of each file committed (for progress bars).
    pub progress: Option<&'a dyn Fn(u64)>,
}

/// Removes a local file, symlink or whole directory (never following a symlink).
fn remove_local(p: &Path) -> io::Result<()> {
    if fs::symlink_metadata(p)?.is_dir() {
        fs::remove_dir_all(p)
    } else {
        fs::remove_file(p)
    }
}

/// A local file chunked as a source.
#[derive(Default)]
struct LocalIndex {
    /// Its chunks in order: the recipe of the old version, whose pages the server can refer to.
    order: Vec<ChunkRef>,
    /// id → (offset, length): hints, verified before use.
    at: HashMap<Id, (u64, u32)>,
}

/// Chunks a local file as a source (nothing if it is not a regular file).
fn index_local(path: &Path, spec: &ChunkerSpec, alg: HashAlg) -> io::Result<LocalIndex> {
    let mut map = LocalIndex::default();
    // Only a regular file at the destination is a source: a symlink there is not followed.
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(map),
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
            return Ok(map)
        }
        Err(e) => return Err(e),
    };
    if !f.metadata()?.is_file() {
        return Ok(map);
    }
    let mut r = ChunkReader::new(f, spec.build());
    while let Some(c) = r.next_chunk()? {
        let id = Id::hash(alg, c.data);
        let len = c.data.len() as u32;
        map.order.push(ChunkRef { id, len });
        map.at.insert(id, (c.offset, len));
    }
    Ok(map)
}

/// Chunks asked for per GetChunks request, and requests kept in flight.
const CHUNKS_PER_REQUEST: usize = 256;
const REQUESTS_IN_FLIGHT: usize = 4;
/// Fetched chunk bytes between cache flushes (each flush is an fsync).
const RESUME_FLUSH_BYTES: usize = 16 << 20;
/// Files fetched together: their recipes are asked for at once, then all their missing chunks,
/// so a batch costs about two round trips however many files it holds.
const BATCH_FILES: usize = 1024;
/// Bytes of files per batch (bounding the recipes held in memory at once).
const BATCH_BYTES: u64 = 256 << 20;

/// Fetches the file or tree at `remote` into `local`.
///
/// First a walk of the listings (prefetched a level ahead, so about one round trip per level)
/// creates directories, applies `--delete` and notes which files differ; then the files are
/// fetched in batches, each costing about two round trips (recipes, then the chunks not found
/// locally); last, symlinks, and directories' modes and times.
pub fn get<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    remote: &WirePath,
    local: &Path,
    src: &Sources<'_>,
    stats: &mut GetStats,
) -> Result<(), GetError> {
    let attr = get_attr(conn, remote)?;
    // With tree digests from the server, every subtree already the same here is skipped.
    let mut trees = LocalTrees::new();
    if attr.oid.is_some() && fs::symlink_metadata(local).is_ok_and(|m| m.is_dir()) {
        if let Err(e) = local_tree(local, &mut trees) {
            tracing::debug!("no tree digests for {}: {e}", local.display());
            trees.clear();
        }
    }
    if let Some(files) = same_tree(local, &attr, &trees) {
        stats.unchanged += files;
        return Ok(());
    }
    let mut plan = Plan::default();
    walk(conn, remote, &attr, local, src, &trees, stats, &mut plan)?;
    choose_bases(&mut plan.files, &plan.gone, local);
    let mut batch = vec![];
    let mut bytes = 0;
    for job in plan.files {
        if !batch.is_empty() && (batch.len() >= BATCH_FILES || bytes + job.attr.size > BATCH_BYTES)
        {
            fetch_files(conn, std::mem::take(&mut batch), src, stats, true)?;
            bytes = 0;
        }
        bytes += job.attr.size;
        batch.push(job);
    }
    if !batch.is_empty() {
        fetch_files(conn, batch, src, stats, true)?;
    }
    for p in plan.deletes {
        remove_local(&p).map_err(GetError::local("delete", &p))?;
    }
    fetch_links(conn, plan.links, stats)?;
    // Children before parents: a directory's mtime is set after its contents changed, and a
    // read-only mode only once nothing more is written into it.
    for (dir, attr) in plan.dirs.iter().rev() {
        let d = File::open(dir).map_err(GetError::local("open", dir))?;
        d.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(
            attr.mode & 0o7777,
        ))
        .map_err(GetError::local("chmod", dir))?;
        d.set_modified(mtime(attr))
            .map_err(GetError::local("set mtime of", dir))?;
    }
    Ok(())
}

/// Fetches the file at `remote`, whose attributes the caller already has, into `local`: the
/// version already there (if any) is a chunk source and the base the server sends changes
/// against; the new version replaces it atomically. Costs about two round trips (the recipe,
/// then the chunks not found locally).
pub fn fetch_file<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    remote: &WirePath,
    attr: &Attr,
    local: &Path,
    src: &Sources<'_>,
    stats: &mut GetStats,
) -> Result<(), GetError> {
    let job = FileJob {
        remote: remote.clone(),
        attr: attr.clone(),
        local: local.to_path_buf(),
        basis: None,
    };
    fetch_files(conn, vec![job], src, stats, true)
}

/// A remote file that differs from its local copy.
#[derive(Clone)]
struct FileJob {
    remote: WirePath,
    attr: Attr,
    local: PathBuf,
    /// For a file new here: a local file that left the tree and looks like its old version
    /// (the same name elsewhere, `wasi.rs` for `wasi/mod.rs`), read in its place.
    basis: Option<PathBuf>,
}

impl FileJob {
    /// The file the new version is built against: the one at the destination, or the basis.
    fn old(&self) -> &Path {
        self.basis.as_deref().unwrap_or(&self.local)
    }
}

/// What the walk leaves to fetch.
#[derive(Default)]
struct Plan {
    files: Vec<FileJob>,
    links: Vec<(WirePath, PathBuf)>,
    /// Directories, parents first, whose mode and mtime are set at the end.
    dirs: Vec<(PathBuf, Attr)>,
    /// Regular files here that the server's tree lacks (bases for new files), at most
    /// [`GONE_FILES`] of them.
    gone: Vec<PathBuf>,
    /// What `--delete` removes once the files are in (they may be bases).
    deletes: Vec<PathBuf>,
}

/// Files that left the tree, kept as bases for new ones, at most.
const GONE_FILES: usize = 10_000;

/// Walks `remote`, whose attributes the caller already has, breadth first: every listing of a
/// level is asked for before the first of them is waited on, so a tree's listings cost one
/// round trip per level.
#[allow(clippy::too_many_arguments)]
fn walk<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    remote: &WirePath,
    attr: &Attr,
    local: &Path,
    src: &Sources<'_>,
    trees: &LocalTrees,
    stats: &mut GetStats,
    plan: &mut Plan,
) -> Result<(), GetError> {
    if attr.kind != FileKind::Dir {
        return note(remote, attr, local, src, stats, plan);
    }
    let first = ask_listing(conn, remote, attr, local, trees)?;
    let mut queue = std::collections::VecDeque::from([(
        remote.clone(),
        attr.clone(),
        local.to_path_buf(),
        first,
    )]);
    while let Some((remote, attr, local, asked)) = queue.pop_front() {
        make_dir(&local, src, stats)?;
        conn.flush()?;
        let (entries, known) = take_listing(conn, &remote, &attr, asked)?;
        let mut keep = std::collections::HashSet::new();
        // Entries the server has exactly as they are here.
        for (name, item) in known {
            stats.unchanged += match item {
                TreeItem::File { .. } => 1,
                TreeItem::Dir { .. } => trees
                    .get(&local.join(std::ffi::OsStr::from_bytes(&name)))
                    .map_or(0, |t| t.1),
                TreeItem::Symlink { .. } => 0,
            };
            keep.insert(name);
        }
        for e in entries {
            // One component: a name with `/` or `..` from the server is refused.
            let child = remote.join(&e.name)?;
            let dest = local.join(std::ffi::OsStr::from_bytes(&e.name));
            if let Some(files) = same_tree(&dest, &e.attr, trees) {
                stats.unchanged += files;
            } else if e.attr.kind == FileKind::Dir {
                let asked = ask_listing(conn, &child, &e.attr, &dest, trees)?;
                queue.push_back((child, e.attr, dest, asked));
            } else {
                note(&child, &e.attr, &dest, src, stats, plan)?;
            }
            keep.insert(e.name);
        }
        if local.is_dir() {
            for e in fs::read_dir(&local).map_err(GetError::local("read directory", &local))? {
                let e = e.map_err(GetError::local("read directory", &local))?;
                if keep.contains(e.file_name().as_bytes()) {
                    continue;
                }
                let p = e.path();
                gone_files(&p, &mut plan.gone);
                if src.delete {
                    if src.dry_run {
                        stats.planned.push(format!("delete {}", p.display()));
                    } else {
                        plan.deletes.push(p);
                    }
                    stats.deleted += 1;
                }
            }
        }
        if !src.dry_run {
            plan.dirs.push((local, attr));
        }
    }
    Ok(())
}

/// The regular files at or below `path` (never through a symlink), into `out` until it holds
/// [`GONE_FILES`].
fn gone_files(path: &Path, out: &mut Vec<PathBuf>) {
    if out.len() >= GONE_FILES {
        return;
    }
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => out.push(path.to_path_buf()),
        Ok(m) if m.is_dir() => {
            let Ok(entries) = fs::read_dir(path) else {
                return;
            };
            let mut names: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            names.sort();
            for p in names {
                gone_files(&p, out);
            }
        }
        _ => {}
    }
}

/// Gives each job with no file at its destination a basis among the files that left the tree
/// (`gone`, below `root`), as rsync's `--fuzzy` does within a directory: a file of the same
/// name (a moved file; a versioned directory renamed, `numpy-2.1.1.dist-info/RECORD` for
/// `numpy-2.1.2.dist-info/RECORD`), or else one named after a directory above the new file
/// (`wasi.rs` for `wasi/mod.rs`). Among several, the one whose path has most in common.
fn choose_bases(jobs: &mut [FileJob], gone: &[PathBuf], root: &Path) {
    if gone.is_empty() {
        return;
    }
    let rel = |p: &Path| p.strip_prefix(root).unwrap_or(p).to_path_buf();
    let mut by_name: HashMap<&std::ffi::OsStr, Vec<&PathBuf>> = HashMap::new();
    let mut by_stem: HashMap<&std::ffi::OsStr, Vec<&PathBuf>> = HashMap::new();
    for g in gone {
        if let (Some(name), Some(stem)) = (g.file_name(), g.file_stem()) {
            by_name.entry(name).or_default().push(g);
            by_stem.entry(stem).or_default().push(g);
        }
    }
    // Leading components in common, then characters in common at the start of the names of
    // the parent directories.
    let likeness = |a: &Path, b: &Path| {
        let (a, b) = (rel(a), rel(b));
        let common = a
            .components()
            .zip(b.components())
            .take_while(|(x, y)| x == y)
            .count();
        let parent = |p: &Path| {
            p.parent()
                .and_then(|d| d.file_name())
                .map(|n| n.as_bytes().to_vec())
        };
        let (pa, pb) = (
            parent(&a).unwrap_or_default(),
            parent(&b).unwrap_or_default(),
        );
        let prefix = pa.iter().zip(&pb).take_while(|(x, y)| x == y).count();
        (common, prefix)
    };
    for j in jobs.iter_mut() {
        if fs::symlink_metadata(&j.local).is_ok() {
            continue;
        }
        let Some(name) = j.local.file_name() else {
            continue;
        };
        let mut candidates: Vec<&PathBuf> = by_name.get(name).cloned().unwrap_or_default();
        if candidates.is_empty() {
            for dir in rel(&j.local).parent().into_iter().flat_map(|p| p.iter()) {
                candidates.extend(by_stem.get(dir).into_iter().flatten());
            }
        }
        j.basis = candidates
            .into_iter()
            .max_by_key(|g| likeness(&j.local, g))
            .cloned();
    }
}

/// Tree digests of local directories, with the files below each.
type LocalTrees = HashMap<PathBuf, ([u8; 32], u64)>;

/// `ferry_proto::tree_digest` of a local directory, remembering every subtree's in `trees`.
/// Never follows a symlink.
fn local_tree(dir: &Path, trees: &mut LocalTrees) -> io::Result<[u8; 32]> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            local_tree(&e.path(), trees)?;
        }
    }
    let mut items = local_items(dir, trees)?;
    let files = items
        .iter()
        .map(|(name, item)| match item {
            TreeItem::File { .. } => 1,
            TreeItem::Dir { .. } => trees
                .get(&dir.join(std::ffi::OsStr::from_bytes(name)))
                .map_or(0, |t| t.1),
            TreeItem::Symlink { .. } => 0,
        })
        .sum();
    let d = ferry_proto::tree_digest(&mut items);
    trees.insert(dir.to_path_buf(), (d, files));
    Ok(d)
}

/// What the tree digest records of each entry of a local directory, sorted by name; the
/// digests of subdirectories come from `trees`.
fn local_items(dir: &Path, trees: &LocalTrees) -> io::Result<Items> {
    use std::os::unix::ffi::OsStringExt;
    use std::os::unix::fs::MetadataExt;
    let mut items = vec![];
    for e in fs::read_dir(dir)? {
        let e = e?;
        let m = e.metadata()?;
        let (mode, mtime_ns) = (
            m.mode() & 0o7777,
            m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        );
        let item = if m.is_dir() {
            let digest = trees
                .get(&e.path())
                .ok_or_else(|| io::Error::other("a directory appeared during the walk"))?
                .0;
            TreeItem::Dir {
                mode,
                mtime_ns,
                digest,
            }
        } else if m.file_type().is_symlink() {
            TreeItem::Symlink {
                target: fs::read_link(e.path())?.into_os_string().into_vec(),
            }
        } else {
            TreeItem::File {
                mode,
                size: m.len(),
                mtime_ns,
            }
        };
        items.push((e.file_name().into_vec(), item));
    }
    items.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(items)
}

/// What a remote entry records in its directory's tree digest; `None` for a symlink (its
/// target is not in its attributes) or a directory without a digest.
fn remote_item(attr: &Attr) -> Option<TreeItem> {
    match attr.kind {
        FileKind::Dir => Some(TreeItem::Dir {
            mode: attr.mode,
            mtime_ns: attr.mtime_ns,
            digest: *attr.oid?.digest(),
        }),
        FileKind::Symlink => None,
        _ => Some(TreeItem::File {
            mode: attr.mode,
            size: attr.size,
            mtime_ns: attr.mtime_ns,
        }),
    }
}

/// Entries of a local directory as its tree digest records them, sorted by name.
type Items = Vec<(Vec<u8>, TreeItem)>;

/// Asks for the listing of `remote`: against the entries of `local` when both sides have tree
/// digests (only what differs travels), else whole. Returns the request and, for the former,
/// the local entries named.
fn ask_listing<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    remote: &WirePath,
    attr: &Attr,
    local: &Path,
    trees: &LocalTrees,
) -> Result<(u32, Option<Items>), GetError> {
    let items = attr
        .oid
        .filter(|_| trees.contains_key(local))
        .and_then(|_| local_items(local, trees).ok())
        .filter(|items| !items.is_empty());
    let r = match &items {
        Some(items) => Request::ReadDirAgainst {
            path: remote.clone(),
            keys: items
                .iter()
                .map(|(n, i)| ferry_proto::entry_key(n, i))
                .collect(),
        },
        None => Request::ReadDir {
            path: remote.clone(),
        },
    };
    Ok((conn.send(r)?, items))
}

/// A listing asked for by [`ask_listing`]: the entries that differ from the local ones, and
/// the local entries the server has too (exactly: checked against the directory's tree
/// digest, with a whole listing asked for when the check fails).
fn take_listing<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    remote: &WirePath,
    attr: &Attr,
    (id, items): (u32, Option<Items>),
) -> Result<(Vec<DirEntry>, Items), GetError> {
    let mut entries = vec![];
    let mut present = None;
    for r in conn.replies(id)? {
        match r {
            Reply::DirEntries(es) => entries.extend(es),
            Reply::DirDelta {
                present: p,
                entries: es,
            } if items.is_some() => {
                present.get_or_insert(p);
                entries.extend(es);
            }
            other => return Err(ConnError::Unexpected(format!("{other:?}")).into()),
        }
    }
    let (Some(items), Some(present)) = (items, present) else {
        return Ok((entries, vec![]));
    };
    if present.len() != items.len() {
        return Err(ConnError::Unexpected("a listing delta of the wrong length".into()).into());
    }
    let known: Vec<_> = items
        .into_iter()
        .zip(present)
        .filter_map(|(item, p)| p.then_some(item))
        .collect();
    if known.is_empty() {
        return Ok((entries, known));
    }
    let mut all: Items = known.clone();
    let mut complete = true;
    for e in &entries {
        match remote_item(&e.attr) {
            Some(i) => all.push((e.name.clone(), i)),
            None => complete = false,
        }
    }
    let names: std::collections::HashSet<&[u8]> = all.iter().map(|(n, _)| &n[..]).collect();
    if complete
        && names.len() == all.len()
        && attr
            .oid
            .is_some_and(|d| *d.digest() == ferry_proto::tree_digest(&mut all))
    {
        return Ok((entries, known));
    }
    // Two entries with one key: what was rebuilt is not the server's directory.
    tracing::debug!("listing delta of {remote:?} does not add up; asking for all of it");
    let mut entries = vec![];
    for r in conn.call(Request::ReadDir {
        path: remote.clone(),
    })? {
        match r {
            Reply::DirEntries(es) => entries.extend(es),
            other => return Err(ConnError::Unexpected(format!("{other:?}")).into()),
        }
    }
    Ok((entries, vec![]))
}

/// The number of files below `local` if it is a directory the same as the remote one `attr`
/// describes: same tree digest, mode and modification time.
fn same_tree(local: &Path, attr: &Attr, trees: &LocalTrees) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let remote = attr.oid.filter(|_| attr.kind == FileKind::Dir)?;
    let (digest, files) = trees.get(local)?;
    let m = fs::symlink_metadata(local).ok()?;
    (remote.digest() == digest
        && m.is_dir()
        && m.mode() & 0o7777 == attr.mode & 0o7777
        && m.mtime() * 1_000_000_000 + m.mtime_nsec() == attr.mtime_ns)
        .then_some(*files)
}

/// Notes a file or symlink that the walk found.
fn note(
    remote: &WirePath,
    attr: &Attr,
    local: &Path,
    src: &Sources<'_>,
    stats: &mut GetStats,
    plan: &mut Plan,
) -> Result<(), GetError> {
    match attr.kind {
        FileKind::File if unchanged(local, attr) => stats.unchanged += 1,
        FileKind::File if src.dry_run => {
            stats
                .planned
                .push(format!("fetch {} ({} bytes)", local.display(), attr.size));
            stats.files += 1;
        }
        FileKind::File => plan.files.push(FileJob {
            remote: remote.clone(),
            attr: attr.clone(),
            local: local.to_path_buf(),
            basis: None,
        }),
        FileKind::Symlink if src.dry_run => stats.planned.push(format!("link {}", local.display())),
        FileKind::Symlink => plan.links.push((remote.clone(), local.to_path_buf())),
        _ => {
            return Err(ConnError::Unexpected(format!(
                "{remote:?} has a kind this client does not know"
            ))
            .into())
        }
    }
    Ok(())
}

/// Makes sure `local` is a directory of ours to write into. Never through a symlink at the
/// destination, whoever made it (a hostile server can list a name twice: first as a symlink
/// to /etc, then as a directory).
fn make_dir(local: &Path, src: &Sources<'_>, stats: &mut GetStats) -> Result<(), GetError> {
    match fs::symlink_metadata(local) {
        Ok(m) if m.file_type().is_symlink() => Err(GetError::Local {
            op: "refusing to write through the symlink",
            path: local.to_path_buf(),
            error: io::Error::from(io::ErrorKind::AlreadyExists),
        }),
        Ok(m) if !m.is_dir() => Err(GetError::Local {
            op: "a file is in the way of directory",
            path: local.to_path_buf(),
            error: io::Error::from(io::ErrorKind::AlreadyExists),
        }),
        Ok(_) => Ok(()),
        Err(_) if src.dry_run => {
            stats.planned.push(format!("mkdir {}", local.display()));
            Ok(())
        }
        Err(_) => fs::create_dir(local).map_err(GetError::local("create directory", local)),
    }
}

/// rsync's quick check: same size, modification time and mode means unchanged.
fn unchanged(local: &Path, attr: &Attr) -> bool {
    use std::os::unix::fs::MetadataExt;
    fs::symlink_metadata(local).is_ok_and(|m| {
        m.is_file()
            && m.len() == attr.size
            && m.mtime() * 1_000_000_000 + m.mtime_nsec() == attr.mtime_ns
            && m.mode() & 0o7777 == attr.mode & 0o7777
    })
}

fn mtime(attr: &Attr) -> std::time::SystemTime {
    if attr.mtime_ns >= 0 {
        std::time::UNIX_EPOCH + std::time::Duration::from_nanos(attr.mtime_ns as u64)
    } else {
        std::time::UNIX_EPOCH - std::time::Duration::from_nanos(attr.mtime_ns.unsigned_abs())
    }
}

/// Recreates symlinks as they are on the server, all targets asked for at once. A target is
/// stored, never followed.
fn fetch_links<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    links: Vec<(WirePath, PathBuf)>,
    stats: &mut GetStats,
) -> Result<(), GetError> {
    for batch in links.chunks(BATCH_FILES) {
        let mut ids = Vec::with_capacity(batch.len());
        for (remote, _) in batch {
            ids.push(conn.send(Request::ReadLink {
                path: remote.clone(),
            })?);
        }
        conn.flush()?;
        for (id, (_, local)) in ids.into_iter().zip(batch) {
            let target = match conn.replies(id)?.pop() {
                Some(Reply::Link(t)) => t,
                other => return Err(ConnError::Unexpected(format!("{other:?}")).into()),
            };
            make_symlink(std::ffi::OsStr::from_bytes(&target), local)?;
            stats.files += 1;
        }
    }
    Ok(())
}

fn make_symlink(target: &std::ffi::OsStr, local: &Path) -> Result<(), GetError> {
    match fs::symlink_metadata(local) {
        Ok(m)
            if m.file_type().is_symlink()
                && fs::read_link(local).is_ok_and(|t| t == Path::new(target)) =>
        {
            return Ok(())
        }
        Ok(m) if m.is_dir() => {
            return Err(GetError::Local {
                op: "a directory is in the way of symlink",
                path: local.to_path_buf(),
                error: io::Error::from(io::ErrorKind::AlreadyExists),
            })
        }
        _ => {}
    }
    // Create beside it and rename over, so the name is never missing.
    let dir = local
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".ferry-link-{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).map_err(GetError::local("create symlink", &tmp))?;
    fs::rename(&tmp, local).map_err(GetError::local("rename into", local))?;
    Ok(())
}

/// Errors of a fetch: the connection, or the local side.
#[derive(Debug, thiserror::Error)]
pub enum GetError {
    #[error(transparent)]
    Conn(#[from] ConnError),
    /// The OS error is part of the message (not a separate source, which would print twice).
    #[error("{op} {}: {error}", path.display())]
    Local {
        op: &'static str,
        path: PathBuf,
        error: io::Error,
    },
    #[error(transparent)]
    Store(#[from] ferry_store::StoreError),
    #[error(transparent)]
    Proto(#[from] ferry_proto::ProtoError),
    #[error("server sent chunk {0} that does not match its id, or a recipe it cannot serve")]
    BadData(Id),
    #[error("a recipe rebuilt from the pages held here does not match the server's check")]
    RecipeCheck,
}

impl GetError {
    fn local(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> GetError {
        let path = path.to_path_buf();
        move |error| GetError::Local { op, path, error }
    }
}

/// Puts the pages of a GetRecipe, GetRecipeDelta or GetRecipeShort reply together; `known` are
/// the pages the delta may refer to. A recipe rebuilt from references must match the server's
/// check. `size` is the file's size as listed: a recipe of more chunks than a file of (at
/// least 64 MiB, or) that size could have is refused, so page references cannot blow up
/// memory. Chunks named by short ids (only with `shorts`) get the ids `shorts` finds for them
/// (placeholders for those held nowhere here); their recipe is checked only once they are all
/// known, so the check comes back with it.
fn recipe_from(
    replies: Vec<Reply>,
    known: &[&[ChunkRef]],
    size: u64,
    mut shorts: Option<&mut Shorts>,
    find: &dyn Fn(u64) -> Result<Option<Id>, GetError>,
) -> Result<(Recipe, Option<[u8; 32]>), GetError> {
    let max_chunks = size.max(64 << 20) / ferry_chunk::MIN_CHUNK_LIMIT as u64;
    let mut chunks: Vec<ChunkRef> = vec![];
    let mut alg = HashAlg::Blake3;
    let mut check = None;
    let mut deferred = false;
    for r in replies {
        match r {
            Reply::RecipeDelta(d) => {
                if d.total_chunks > max_chunks {
                    return Err(ConnError::Unexpected(
                        "a recipe of more chunks than the file's size allows".into(),
                    )
                    .into());
                }
                alg = d.alg;
                check = Some(d.check);
                for p in d.parts {
                    match p {
                        RecipePart::Known(i) => {
                            chunks.extend_from_slice(known.get(i as usize).ok_or_else(|| {
                                ConnError::Unexpected(format!("recipe page {i} was never named"))
                            })?)
                        }
                        RecipePart::Chunks(cs) => chunks.extend(cs),
                        RecipePart::Short(cs) => {
                            let shorts = shorts.as_deref_mut().ok_or_else(|| {
                                ConnError::Unexpected("short ids in a recipe not asked so".into())
                            })?;
                            deferred = true;
                            for (len, short) in cs {
                                let id = shorts.id(alg, len, short, find)?;
                                chunks.push(ChunkRef { id, len });
                                if chunks.len() as u64 > d.total_chunks {
                                    break;
                                }
                            }
                        }
                    }
                    if chunks.len() as u64 > d.total_chunks {
                        return Err(
                            ConnError::Unexpected("recipe longer than announced".into()).into()
                        );
                    }
                }
            }
            Reply::Recipe(p) => {
                if p.first != chunks.len() as u64 || p.total_chunks > max_chunks {
                    return Err(ConnError::Unexpected("recipe pages out of order".into()).into());
                }
                if let Some(c) = p.chunks.first() {
                    alg = c.id.alg();
                }
                chunks.extend(p.chunks);
                if chunks.len() as u64 > p.total_chunks {
                    return Err(ConnError::Unexpected("recipe longer than announced".into()).into());
                }
            }
            other => return Err(ConnError::Unexpected(format!("{other:?}")).into()),
        }
    }
    let recipe = Recipe::from_chunks(alg, chunks).map_err(ferry_proto::ProtoError::from)?;
    if deferred {
        return Ok((recipe, check));
    }
    if check.is_some_and(|c| c != recipe.check()) {
        return Err(GetError::RecipeCheck);
    }
    Ok((recipe, None))
}

/// Chunks named by short ids in recipes (GetRecipeShort) and held nowhere here: each stands in
/// its recipe under a placeholder id (the short id, then zeros) until it arrives and its real
/// id is known.
#[derive(Default)]
struct Shorts {
    /// Placeholders, with their chunks' lengths.
    open: HashMap<Id, u32>,
    /// Placeholders whose chunks arrived, and their real ids.
    found: HashMap<Id, Id>,
}

impl Shorts {
    /// The id of a chunk named by `short`: one held here with that prefix (`find`), else a
    /// placeholder.
    fn id(
        &mut self,
        alg: HashAlg,
        len: u32,
        short: u64,
        find: &dyn Fn(u64) -> Result<Option<Id>, GetError>,
    ) -> Result<Id, GetError> {
        if let Some(id) = find(short)?.filter(|id| id.alg() == alg) {
            return Ok(id);
        }
        let mut d = [0u8; 32];
        d[..8].copy_from_slice(&short.to_le_bytes());
        let id = Id::from_parts(alg, d);
        self.open.insert(id, len);
        Ok(id)
    }

    /// Bytes that arrived for `asked`: when it is a placeholder and they have its short id,
    /// the chunk they are (verified: its id is their hash).
    fn arrived<'a>(&mut self, asked: Id, bytes: &'a [u8]) -> Option<VerifiedChunk<'a>> {
        self.open.get(&asked)?;
        let v = VerifiedChunk::hash(asked.alg(), bytes);
        (short_id(v.id()) == short_id(&asked)).then(|| {
            self.found.insert(asked, *v.id());
            v
        })
    }

    /// A recipe with every placeholder replaced by the real id; `None` if some chunk never
    /// arrived.
    fn resolve(&self, recipe: &Recipe) -> Option<Recipe> {
        let chunks = recipe.chunks().iter().map(|c| {
            if self.open.contains_key(&c.id) {
                self.found.get(&c.id).map(|&id| ChunkRef { id, len: c.len })
            } else {
                Some(*c)
            }
        });
        Recipe::from_chunks(recipe.alg(), chunks.collect::<Option<_>>()?).ok()
    }
}

/// Fetches a batch of files: every recipe asked for at once, then every chunk that neither
/// the cache nor the files already at the destination hold, then each file assembled.
///
/// With `shortcuts` (and a server that offers them), recipes name chunks by short ids and a
/// receiver with nothing reads large files by ranges; a file they misled (a short id that led
/// to the wrong chunk, a file that changed between ranges) is fetched again without them.
fn fetch_files<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    mut jobs: Vec<FileJob>,
    src: &Sources<'_>,
    stats: &mut GetStats,
    shortcuts: bool,
) -> Result<(), GetError> {
    // The file already at the destination is a chunk source (rsync's basis file,
    // generalised), and its recipe's pages let the server send only the pages that changed.
    let mut ids = Vec::with_capacity(jobs.len());
    let mut olds = Vec::with_capacity(jobs.len());
    // A receiver with nothing cached reads small new files whole: their recipes and chunk ids
    // would only add to the bytes. With a cache, recipes let it find what it already holds.
    let read_file = offers(conn, ferry_proto::FEATURE_READ_FILE) && src.cold;
    // Larger ones likewise, a range at a time.
    let read_range = shortcuts && offers(conn, ferry_proto::FEATURE_READ_RANGE) && src.ranges;
    let mut ranged = vec![];
    let history = offers(conn, ferry_proto::FEATURE_HISTORY);
    let keys = KeyKind::of(conn);
    let context = keys != KeyKind::Fixed && offers(conn, ferry_proto::FEATURE_CONTEXT);
    // Chunks named by short ids in recipes: those held nowhere here are fetched by them.
    let short =
        shortcuts && keys != KeyKind::Fixed && offers(conn, ferry_proto::FEATURE_SHORT_RECIPES);
    // Files that come whole against their old versions, in batches: (job indices, new bytes).
    let mut batches: Vec<(Vec<usize>, u64)> = vec![];
    for i in 0..jobs.len() {
        let old = match index_local(jobs[i].old(), &src.chunker, HashAlg::Blake3) {
            Ok(old) => old,
            // A basis that cannot be read is no basis.
            Err(e) if jobs[i].basis.is_some() => {
                tracing::debug!("basis {:?}: {e}", jobs[i].basis);
                jobs[i].basis = None;
                LocalIndex::default()
            }
            Err(e) => return Err(GetError::local("read", jobs[i].old())(e)),
        };
        let j = &jobs[i];
        let path = j.remote.clone();
        // An old version this client fetched (its chunks are in the cache) is in the server's
        // history: a small file comes whole against it, with no recipe or chunk ids.
        let against = history
            && !old.order.is_empty()
            && j.attr.size <= FILE_AGAINST
            && old.order.iter().map(|c| c.len as u64).sum::<u64>() <= FILE_AGAINST
            && old
                .order
                .iter()
                .all(|c| src.cache.contains(&c.id).unwrap_or(false));
        let pages = ferry_format::pages(&old.order).len();
        olds.push(old);
        if against {
            match batches.last_mut() {
                Some((b, bytes)) if *bytes + j.attr.size <= FILES_AGAINST_BATCH => {
                    b.push(i);
                    *bytes += j.attr.size;
                }
                _ => batches.push((vec![i], j.attr.size)),
            }
            ids.push(None);
            continue;
        }
        if read_range && olds[i].order.is_empty() && j.attr.size > WHOLE_FILE {
            ranged.push(i);
            ids.push(None);
            continue;
        }
        ids.push(Some(conn.send(
            if read_file && olds[i].order.is_empty() && j.attr.size <= WHOLE_FILE {
                // Nothing old here to build on: a small file's bytes cost less than its recipe
                // and chunk ids would.
                Request::ReadFile { path }
            } else if pages >= 2 || short {
                // A one-page old version is no page of a changed file's new one.
                let known = match pages {
                    0 | 1 => vec![],
                    _ => ferry_format::pages(&olds[i].order)
                        .iter()
                        .map(|p| ferry_format::page_key(p))
                        .collect(),
                };
                match short {
                    true => Request::GetRecipeShort { path, known },
                    false => Request::GetRecipeDelta { path, known },
                }
            } else {
                Request::GetRecipe { path, from: 0 }
            },
        )?));
    }
    // Old chunks named by short ids where the server finds them so.
    let short_olds = offers(conn, ferry_proto::FEATURE_SHORT_OLDS);
    let batches: Vec<_> = batches
        .into_iter()
        .map(|(b, _)| {
            let path = |i: usize| jobs[i].remote.clone();
            let order = |i: usize| olds[i].order.iter();
            let request = if short_olds {
                let files = b
                    .iter()
                    .map(|&i| (path(i), order(i).map(|c| short_id(&c.id)).collect()));
                Request::GetFilesShort {
                    files: files.collect(),
                }
            } else {
                let files = b
                    .iter()
                    .map(|&i| (path(i), order(i).map(|c| c.id).collect()));
                Request::GetFilesAgainst {
                    files: files.collect(),
                }
            };
            Ok((conn.send(request)?, b))
        })
        .collect::<Result<_, GetError>>()?;
    // The first ranges go with the recipe requests: no round trip of their own.
    let mut ranges = Ranges::new(&jobs, &ranged);
    ranges.send(conn, &jobs)?;
    conn.flush()?;
    let mut fetched = std::collections::HashSet::new();
    let mut whole: HashMap<usize, Recipe> = HashMap::new();
    for (id, b) in batches {
        for (i, recipe) in files_against(conn, id, &b, &jobs, &olds, src, stats, &mut fetched)? {
            match recipe {
                Some(r) => {
                    whole.insert(i, r);
                }
                // Not sent, or not what the server named (the old version here changed
                // meanwhile, say): by recipe, then.
                None => {
                    ids[i] = Some(conn.send(Request::GetRecipe {
                        path: jobs[i].remote.clone(),
                        from: 0,
                    })?)
                }
            }
        }
    }
    conn.flush()?;
    let mut recipes = Vec::with_capacity(jobs.len());
    let mut missing: Vec<Id> = vec![];
    let mut seen = std::collections::HashSet::new();
    let mut against = vec![];
    let mut shorts = Shorts::default();
    // The checks of recipes with chunks named by short ids, for once those have arrived.
    let mut checks = HashMap::new();
    for (i, ((id, j), old)) in ids.into_iter().zip(&jobs).zip(olds).enumerate() {
        if let Some(recipe) = whole.remove(&i) {
            recipes.push((i, recipe, old.at));
            continue;
        }
        let Some(id) = id else {
            // Read by ranges.
            continue;
        };
        let mut replies = conn.replies(id)?;
        if let [Reply::Data(data)] = &mut replies[..] {
            let data = std::mem::take(data);
            let (recipe, _) = whole_file(&data, src, stats, &mut fetched)?;
            recipes.push((i, recipe, old.at));
            continue;
        }
        let by_short: HashMap<u64, Id> = match short {
            true => old.order.iter().map(|c| (short_id(&c.id), c.id)).collect(),
            false => HashMap::new(),
        };
        let find = |s: u64| -> Result<Option<Id>, GetError> {
            match by_short.get(&s) {
                Some(&id) => Ok(Some(id)),
                None => Ok(src.cache.find_prefix(s)?),
            }
        };
        let pages = ferry_format::pages(&old.order);
        let with_shorts = short.then_some(&mut shorts);
        let recipe = match recipe_from(replies, &pages, j.attr.size, with_shorts, &find) {
            Err(GetError::RecipeCheck) => {
                // Two pages with one key (a 2^-64 chance): the whole recipe, then.
                tracing::warn!(
                    "{:?}: rebuilt recipe failed its check; fetching it whole",
                    j.remote
                );
                let r = conn.call(Request::GetRecipe {
                    path: j.remote.clone(),
                    from: 0,
                })?;
                recipe_from(r, &[], j.attr.size, None, &find)?
            }
            r => r?,
        };
        let (recipe, check) = recipe;
        if let Some(check) = check {
            checks.insert(i, check);
        }
        let old = if recipe.alg() == HashAlg::Blake3 {
            old
        } else {
            index_local(j.old(), &src.chunker, recipe.alg())
                .map_err(GetError::local("read", j.old()))?
        };
        let mut file_missing = vec![];
        for c in recipe.chunks() {
            // Held here or not, each chunk once (one file's old version holding it says
            // nothing of another's).
            if !old.at.contains_key(&c.id) && !src.cache.contains(&c.id)? && seen.insert(c.id) {
                file_missing.push(*c);
            }
        }
        let history = history.then_some(src.cache);
        // A server that takes a context gets the parts of the new version held here.
        let remote = context.then(|| j.remote.clone());
        match AgainstOld::new(
            j.old(),
            &old,
            &recipe,
            &file_missing,
            history,
            keys,
            remote,
            src.cache,
        ) {
            Some(a) => against.push((a, file_missing)),
            None => missing.extend(file_missing.iter().map(|c| c.id)),
        }
        recipes.push((i, recipe, old.at));
    }
    missing.extend(fetch_against(
        conn,
        against,
        src,
        stats,
        &mut fetched,
        &mut shorts,
    )?);
    let (by_short, missing): (Vec<Id>, Vec<Id>) = missing
        .into_iter()
        .partition(|c| shorts.open.contains_key(c));
    fetch_short(conn, &by_short, src, stats, &mut fetched, &mut shorts)?;
    fetched.extend(fetch_chunks(conn, &missing, src, stats)?);
    let mut again = vec![];
    for (i, recipe, here) in recipes {
        let recipe = match checks.get(&i) {
            None => recipe,
            Some(check) => match shorts.resolve(&recipe) {
                None => return Err(changed_while_fetched()),
                Some(r) if r.check() == *check => r,
                Some(_) => {
                    // A chunk held here has the short id of another (a 2^-64 chance), or the
                    // server lied: by full ids, then.
                    tracing::warn!(
                        "{:?}: short ids misled; fetching by full ids",
                        jobs[i].remote
                    );
                    again.push(jobs[i].clone());
                    continue;
                }
            },
        };
        assemble(&jobs[i], &recipe, &here, &fetched, src, stats)?;
    }
    for i in ranges.fetch(conn, &jobs, src, stats)? {
        tracing::warn!(
            "{:?} changed while read by ranges; fetching it by recipe",
            jobs[i].remote
        );
        again.push(jobs[i].clone());
    }
    if again.is_empty() {
        return Ok(());
    }
    fetch_files(conn, again, src, stats, false)
}

/// Fetches chunks of short recipes held nowhere here (`by_short`: placeholders), plainly, by
/// their short ids; each is verified by its own hash and its short id.
fn fetch_short<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    by_short: &[Id],
    src: &Sources<'_>,
    stats: &mut GetStats,
    fetched: &mut std::collections::HashSet<Id>,
    shorts: &mut Shorts,
) -> Result<(), GetError> {
    let wanted: Vec<ChunkRef> = by_short
        .iter()
        .map(|&id| ChunkRef {
            id,
            len: shorts.open[&id],
        })
        .collect();
    let olds = match offers(conn, ferry_proto::FEATURE_SHORT_OLDS) {
        true => OldIds::Short(vec![]),
        false => OldIds::Whole(vec![]),
    };
    let history = offers(conn, ferry_proto::FEATURE_HISTORY);
    let mut sent = vec![];
    for group in groups(&wanted, crate::delta::MAX_DATA) {
        // No keys and no olds: the chunks come plainly.
        let id = conn.send(Request::GetChunksShort {
            ids: group.iter().map(|c| short_id(&c.id)).collect(),
            key_bytes: 8,
            runs: false,
            keys: Some(vec![]),
            olds: history.then(|| olds.clone()),
            context: None,
        })?;
        sent.push((id, group));
    }
    conn.flush()?;
    for (id, asked) in sent {
        let Some(Reply::ChunksShort {
            found,
            zstd: false,
            data,
            ..
        }) = conn.replies(id)?.pop()
        else {
            return Err(ConnError::Unexpected("chunks by short id, not plainly".into()).into());
        };
        if found.len() != asked.len() {
            return Err(changed_while_fetched());
        }
        let mut at = 0;
        for (n, c) in asked.iter().enumerate() {
            let len = c.len as usize;
            let bytes = data.get(at..at + len);
            let v = bytes
                .filter(|_| found[n] as usize == n)
                .and_then(|b| shorts.arrived(c.id, b))
                .ok_or(GetError::BadData(c.id))?;
            src.cache.put(&v)?;
            fetched.insert(*v.id());
            stats.from_server += 1;
            stats.bytes_from_server += len as u64;
            at += len;
        }
        if at != data.len() {
            return Err(GetError::BadData(asked[0].id));
        }
    }
    src.cache.flush()?;
    Ok(())
}

/// Whether the server offers `feature` (a Hello feature bit).
fn offers<R, W>(conn: &Connection<R, W>, feature: u64) -> bool {
    conn.server
        .as_ref()
        .is_some_and(|h| h.features & feature != 0)
}

/// The piece keys a server reads.
#[derive(Clone, Copy, PartialEq)]
enum KeyKind {
    /// 5 bytes each (GetChunksAgainst).
    Fixed,
    /// As short as the pieces at hand allow (GetChunksShort).
    Short,
    /// The same, pieces cut the second way, and keys shorter still where they count only in
    /// runs (FEATURE_PIECES_2).
    Pieces2,
    /// The same, and keys from 3 bytes even where they count alone (FEATURE_KEYS_3).
    Keys3,
}

impl KeyKind {
    fn of<R, W>(conn: &Connection<R, W>) -> Self {
        match (
            offers(conn, ferry_proto::FEATURE_SHORT_IDS),
            offers(conn, ferry_proto::FEATURE_PIECES_2),
            offers(conn, ferry_proto::FEATURE_KEYS_3),
        ) {
            (false, _, _) => KeyKind::Fixed,
            (true, false, _) => KeyKind::Short,
            (true, true, false) => KeyKind::Pieces2,
            (true, true, true) => KeyKind::Keys3,
        }
    }

    /// Whether keys may count only in runs.
    fn runs(self) -> bool {
        matches!(self, KeyKind::Pieces2 | KeyKind::Keys3)
    }

    /// How the pieces are cut.
    fn cut(self) -> crate::delta::Cut {
        match self {
            KeyKind::Pieces2 | KeyKind::Keys3 => crate::delta::Cut::Lbfs,
            KeyKind::Fixed | KeyKind::Short => crate::delta::Cut::FastCdc,
        }
    }
}

/// Files at most this large, with no old version at the destination, are read whole.
const WHOLE_FILE: u64 = ferry_proto::MAX_READ_FILE as u64;

/// Files at most this large, with an old version here that came from the server, come whole
/// against it (GetFilesAgainst), as many together as fit in [`FILES_AGAINST_BATCH`] bytes.
const FILE_AGAINST: u64 = 256 << 10;
const FILES_AGAINST_BATCH: u64 = 2 << 20;

/// The reply to GetFilesAgainst `id` for the jobs `batch`: each job's recipe, or `None` for
/// those to fetch by recipe instead. The files sent go into the cache like fetched chunks.
#[allow(clippy::too_many_arguments)]
fn files_against<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    id: u32,
    batch: &[usize],
    jobs: &[FileJob],
    olds: &[LocalIndex],
    src: &Sources<'_>,
    stats: &mut GetStats,
    fetched: &mut std::collections::HashSet<Id>,
) -> Result<Vec<(usize, Option<Recipe>)>, GetError> {
    let none = || batch.iter().map(|&i| (i, None)).collect();
    let (files, used, data) = match conn.replies(id)?.pop() {
        Some(Reply::FilesAgainst { files, olds, data }) if files.len() == batch.len() => {
            (files, olds, data)
        }
        other => return Err(ConnError::Unexpected(format!("{other:?}")).into()),
    };
    let total: u64 = files.iter().flatten().map(|(len, _)| len).sum();
    if total > ferry_proto::MAX_FILES_AGAINST {
        return Err(ConnError::Unexpected("more file bytes than a reply may carry".into()).into());
    }
    let decoded = prefix_of(batch, jobs, olds, &used)
        .and_then(|prefix| crate::delta::decode(&data, &prefix, total as usize));
    let decoded = match decoded {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!("files against their old versions: {e}; fetching them by recipe");
            return Ok(none());
        }
    };
    let mut out = vec![];
    let mut at = 0;
    for (&i, f) in batch.iter().zip(files) {
        let Some((len, oid)) = f else {
            out.push((i, None));
            continue;
        };
        let bytes = &decoded[at..at + len as usize];
        at += len as usize;
        let (recipe, got) = whole_file(bytes, src, stats, fetched)?;
        if got.id() == oid {
            stats.against_old += recipe.len() as u64;
            out.push((i, Some(recipe)));
        } else {
            tracing::warn!("{:?}: not the file the server named", jobs[i].remote);
            out.push((i, None));
        }
    }
    Ok(out)
}

/// The old chunks `used` names (indices into the batch's old chunk lists, concatenated), read
/// from the old files at the destination and concatenated: the prefix the server used.
fn prefix_of(
    batch: &[usize],
    jobs: &[FileJob],
    olds: &[LocalIndex],
    used: &[u32],
) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    // (job, offset, length) of each old chunk, in the order the request named them.
    let mut all = vec![];
    for &i in batch {
        let mut at = 0u64;
        for c in &olds[i].order {
            all.push((i, at, c.len));
            at += c.len as u64;
        }
    }
    let mut open: HashMap<usize, File> = HashMap::new();
    let mut prefix = vec![];
    for &u in used {
        let &(i, off, n) = all
            .get(u as usize)
            .ok_or_else(|| bad("no such old chunk"))?;
        if prefix.len() + n as usize > crate::delta::MAX_PREFIX {
            return Err(bad("prefix too long"));
        }
        let file = match open.entry(i) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(File::open(jobs[i].old())?),
        };
        let start = prefix.len();
        prefix.resize(start + n as usize, 0);
        file.read_exact_at(&mut prefix[start..], off)?;
    }
    Ok(prefix)
}

/// A file read whole (ReadFile, GetFileAgainst): its chunks go into the cache like fetched
/// ones; returns its recipe and object id.
fn whole_file(
    data: &[u8],
    src: &Sources<'_>,
    stats: &mut GetStats,
    fetched: &mut std::collections::HashSet<Id>,
) -> Result<(Recipe, ferry_format::Oid), GetError> {
    let mut chunks = vec![];
    let (recipe, oid) = ferry_format::chunk_object(data, &src.chunker, HashAlg::Blake3, |c, b| {
        chunks.push((c.id, b.to_vec()));
        Ok::<_, io::Error>(())
    })
    .map_err(ConnError::Io)?;
    for (id, bytes) in chunks {
        let v = VerifiedChunk::check(id, &bytes).map_err(|_| GetError::BadData(id))?;
        src.cache.put(&v)?;
        if fetched.insert(id) {
            stats.from_server += 1;
            stats.bytes_from_server += bytes.len() as u64;
        }
    }
    Ok((recipe, oid))
}

/// The old version of a file at the destination, cut into pieces that new chunks can be
/// compressed against (`crate::delta`): the parts of it the new recipe no longer uses.
struct AgainstOld {
    file: File,
    path: PathBuf,
    /// (offset, length) of each piece a key names.
    pieces: Vec<(u64, u32)>,
    keys: Vec<u64>,
    /// Bytes of each key on the wire.
    key_bytes: u8,
    /// Whether the keys count only in runs.
    runs: bool,
    /// The old chunks the new recipe dropped, in file order, with their offsets.
    olds: Vec<(ChunkRef, u64)>,
    /// The file's path on the server, when it takes a context (FEATURE_CONTEXT).
    remote: Option<WirePath>,
    /// The chunks of the new version held here: (offset in the new version, chunk, offset in
    /// the old file or `None` for one in the cache).
    held: Vec<Held>,
    /// Where each missing chunk first comes in the new version.
    missing_at: HashMap<Id, u64>,
    /// The most bytes of context a request names.
    context_budget: u64,
}

/// Bytes of context a file's requests may name whatever it holds (at level 19, ~20 ms).
const CONTEXT_FLOOR: u64 = 64 << 10;

/// A chunk of the new version held here: its offset there, itself, and its offset in the old
/// file (`None`: in the cache).
type Held = (u64, ChunkRef, Option<u64>);

impl AgainstOld {
    /// `None` when there is nothing old to compress against: no pieces or old chunks worth
    /// naming (naming them costs more than they could save), and no context (`remote`, the
    /// file's path on a server that takes one: the parts of the new version held here, in the
    /// old file or `cache`).
    #[allow(clippy::too_many_arguments)]
    fn new(
        path: &Path,
        old: &LocalIndex,
        recipe: &Recipe,
        missing: &[ChunkRef],
        history: Option<&dyn ChunkStore>,
        kind: KeyKind,
        remote: Option<WirePath>,
        cache: &dyn ChunkStore,
    ) -> Option<Self> {
        use std::os::unix::fs::FileExt;
        if missing.is_empty() || old.order.is_empty() {
            return None;
        }
        let used: std::collections::HashSet<Id> = recipe.chunks().iter().map(|c| c.id).collect();
        let file = File::open(path).ok()?;
        let mut a = AgainstOld {
            file,
            path: path.to_path_buf(),
            pieces: vec![],
            keys: vec![],
            key_bytes: ferry_proto::PIECE_KEY_BYTES as u8,
            runs: false,
            olds: vec![],
            remote,
            held: vec![],
            missing_at: HashMap::new(),
            context_budget: 0,
        };
        if a.remote.is_some() {
            let missing: std::collections::HashSet<Id> = missing.iter().map(|c| c.id).collect();
            let mut at = 0;
            for c in recipe.chunks() {
                if missing.contains(&c.id) {
                    a.missing_at.entry(c.id).or_insert(at);
                } else if let Some(&(off, _)) = old.at.get(&c.id) {
                    a.held.push((at, *c, Some(off)));
                } else if cache.contains(&c.id).unwrap_or(false) {
                    a.held.push((at, *c, None));
                }
                at += c.len as u64;
            }
        }
        // Old chunks this client fetched (they are in its cache) are in the server's history
        // unless it was trimmed since: those are named by id. The rest are cut into pieces,
        // each run of adjacent ones on its own, as the server cuts each run of new ones.
        let mut runs: Vec<(u64, u64)> = vec![];
        let (mut offset, mut dropped) = (0u64, 0u64);
        for c in &old.order {
            if !used.contains(&c.id) {
                dropped += c.len as u64;
                if history.is_some_and(|cache| cache.contains(&c.id).unwrap_or(false)) {
                    a.olds.push((*c, offset));
                } else {
                    match runs.last_mut() {
                        Some(r) if r.1 == offset => r.1 += c.len as u64,
                        _ => runs.push((offset, offset + c.len as u64)),
                    }
                }
            }
            offset += c.len as u64;
        }
        let mut buf = vec![];
        let mut sample = crate::delta::Compressibility::default();
        let cut = kind.cut();
        for (start, end) in runs {
            buf.resize((end - start) as usize, 0);
            a.file.read_exact_at(&mut buf, start).ok()?;
            if kind.runs() {
                sample.sample(&buf);
            }
            for r in crate::delta::pieces(&buf, cut) {
                a.keys.push(crate::delta::piece_key(&buf[r.clone()], 8));
                a.pieces.push((start + r.start as u64, r.len() as u32));
            }
        }
        let bytes: u64 = missing.iter().map(|c| c.len as u64).sum();
        // A context pays for data with no old counterpart (appended, inserted: what the
        // missing chunks hold beyond the dropped old ones); for data edited in place, the
        // old pieces already give the text around it, and a large context would only cost
        // the server time (measured: mbox-append 66,983 → 45,076 bytes; the trees of code
        // within 0.5 %, numpy-whl-tree's machine code 0.1 %). A little always helps a little.
        let net = bytes.saturating_sub(dropped);
        a.context_budget = (net * 16 + CONTEXT_FLOOR).min(ferry_proto::MAX_CONTEXT);
        // Keys as short as the pieces at hand allow (the new ones counted as one per 256 bytes
        // of a request; pieces cut the second way average ~220, so the odds of a false match
        // are ~1.15 in 1,000 rather than 1), or as the server reads them. Old data that hardly
        // compresses meets new data in long runs or not at all: there, keys count only in
        // runs, and are shorter.
        if kind != KeyKind::Fixed {
            a.runs = kind.runs() && sample.incompressible();
            let new = bytes.min(crate::delta::MAX_DATA as u64) as usize / 256;
            let shortest = if kind == KeyKind::Keys3 { 3 } else { 4 };
            a.key_bytes = crate::delta::key_bytes(a.keys.len(), new, a.runs, shortest);
        }
        let mask = u64::MAX >> (64 - 8 * a.key_bytes as u32);
        a.keys.iter_mut().for_each(|k| *k &= mask);
        // Keys cost their bytes and old ids 33 bytes a chunk, once: worth it unless the old
        // data dwarfs the new.
        let cost = a.keys.len() as u64 * a.key_bytes as u64 + a.olds.len() as u64 * 33;
        let worth = !(a.keys.is_empty() && a.olds.is_empty()) && cost <= bytes / 16;
        if !worth {
            (a.keys, a.pieces, a.olds) = (vec![], vec![], vec![]);
        }
        (worth || !a.held.is_empty()).then_some(a)
    }

    /// The held chunks to name as the context of the request for `group`: the nearest to it
    /// in the new version, up to 16 times its bytes and the file's budget, in file order (none
    /// when the server takes no context: then nothing is held).
    fn context_for(&self, group: &[ChunkRef]) -> Vec<Held> {
        let spans = group.iter().filter_map(|c| {
            let at = *self.missing_at.get(&c.id)?;
            Some((at, at + c.len as u64))
        });
        let (start, end) = spans.fold((u64::MAX, 0), |(s, e), (a, b)| (s.min(a), e.max(b)));
        let bytes: u64 = group.iter().map(|c| c.len as u64).sum();
        let budget = (bytes * 16).min(self.context_budget);
        let distance = |&(at, c, _): &Held| {
            if at + c.len as u64 <= start {
                start - at - c.len as u64
            } else {
                at.saturating_sub(end)
            }
        };
        let mut near = self.held.clone();
        near.sort_by_key(distance);
        let mut total = 0;
        near.retain(|(_, c, _)| {
            total += c.len as u64;
            total <= budget
        });
        near.sort_by_key(|h| h.0);
        near
    }

    /// The context that names the held chunks `held` (in file order), as merged ranges;
    /// `None` when there are none.
    fn context(&self, held: &[Held]) -> Option<Context> {
        let path = self.remote.as_ref().filter(|_| !held.is_empty())?;
        let mut ranges: Vec<(u64, u64)> = vec![];
        for (at, c, _) in held {
            match ranges.last_mut() {
                Some(r) if r.0 + r.1 == *at => r.1 += c.len as u64,
                _ => ranges.push((*at, c.len as u64)),
            }
        }
        Some(Context {
            path: path.clone(),
            ranges,
        })
    }

    /// The bytes of the held chunks `held`, concatenated, from the old file or the cache.
    fn held_bytes(&self, held: &[Held], cache: &dyn ChunkStore) -> io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut out = vec![];
        for (_, c, old) in held {
            match old {
                Some(off) => {
                    let at = out.len();
                    out.resize(at + c.len as usize, 0);
                    self.file.read_exact_at(&mut out[at..], *off)?;
                }
                None => match cache.get(&c.id) {
                    Ok(Some(d)) => out.extend_from_slice(&d),
                    _ => return Err(io::Error::other(format!("chunk {} left the cache", c.id))),
                },
            }
        }
        Ok(out)
    }

    /// The old chunks to name with the request for `group` (the missing chunks from index
    /// `at` on): those around the same place in the old file, at most `OLDS_BYTES` of them
    /// (all of them for most files).
    fn olds_for(&self, missing: &[ChunkRef], at: usize, group: usize) -> &[(ChunkRef, u64)] {
        const OLDS_BYTES: u64 = 8 << 20;
        let total: u64 = self.olds.iter().map(|(c, _)| c.len as u64).sum();
        if total <= OLDS_BYTES {
            return &self.olds;
        }
        let before: u64 = missing[..at].iter().map(|c| c.len as u64).sum();
        let new_total: u64 = missing.iter().map(|c| c.len as u64).sum::<u64>().max(1);
        let middle = before
            + missing[at..at + group]
                .iter()
                .map(|c| c.len as u64)
                .sum::<u64>()
                / 2;
        // The same fraction of the way through the old data, with OLDS_BYTES around it.
        let centre = (middle as u128 * total as u128 / new_total as u128) as u64;
        let lo = centre
            .saturating_sub(OLDS_BYTES / 2)
            .min(total - OLDS_BYTES);
        let (mut start, mut end, mut acc) = (self.olds.len(), self.olds.len(), 0u64);
        for (i, (c, _)) in self.olds.iter().enumerate() {
            if acc >= lo && start == self.olds.len() {
                start = i;
            }
            acc += c.len as u64;
            if acc > lo + OLDS_BYTES {
                end = i;
                break;
            }
        }
        &self.olds[start.min(end)..end]
    }

    /// The old chunks `olds` names (indices into `sent`) followed by the pieces `refs` names,
    /// concatenated: the prefix the server compressed against.
    fn prefix(&self, sent: &[(ChunkRef, u64)], olds: &[u32], refs: &[u32]) -> io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        let olds = olds.iter().map(|&i| {
            sent.get(i as usize)
                .map(|(c, off)| (*off, c.len))
                .ok_or_else(|| bad("no such old chunk"))
        });
        let pieces = refs.iter().map(|&i| {
            self.pieces
                .get(i as usize)
                .copied()
                .ok_or_else(|| bad("no such piece"))
        });
        let mut out = vec![];
        for range in olds.chain(pieces) {
            let (off, len) = range?;
            let at = out.len();
            // A server naming pieces over and over cannot make this grow without bound.
            if at + len as usize > crate::delta::MAX_PREFIX {
                return Err(bad("prefix too long"));
            }
            out.resize(at + len as usize, 0);
            self.file.read_exact_at(&mut out[at..], off)?;
        }
        Ok(out)
    }
}

/// Splits `chunks` into runs of at most `max` bytes (or one chunk).
fn groups(chunks: &[ChunkRef], max: usize) -> Vec<&[ChunkRef]> {
    let mut out = vec![];
    let (mut start, mut bytes) = (0, 0);
    for (i, c) in chunks.iter().enumerate() {
        if i > start && bytes + c.len as usize > max {
            out.push(&chunks[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += c.len as usize;
    }
    if start < chunks.len() {
        out.push(&chunks[start..]);
    }
    out
}

/// Fetches the missing chunks of files with an old version here, compressed against it, all
/// requests of the batch at once. Returns the chunks that did not arrive that way (to fetch
/// plainly): none, unless the server lacked some or a piece's key collided.
fn fetch_against<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    files: Vec<(AgainstOld, Vec<ChunkRef>)>,
    src: &Sources<'_>,
    stats: &mut GetStats,
    fetched: &mut std::collections::HashSet<Id>,
    shorts: &mut Shorts,
) -> Result<Vec<Id>, GetError> {
    let short = offers(conn, ferry_proto::FEATURE_SHORT_IDS);
    let short_olds = offers(conn, ferry_proto::FEATURE_SHORT_OLDS);
    let history = offers(conn, ferry_proto::FEATURE_HISTORY);
    let mut sent = vec![];
    for (i, (a, missing)) in files.iter().enumerate() {
        let mut at = 0;
        for (n, group) in groups(missing, crate::delta::MAX_DATA)
            .into_iter()
            .enumerate()
        {
            // A file's keys travel once: the server keeps them for the requests that follow.
            let keys = (n == 0).then(|| a.keys.clone());
            let olds = a.olds_for(missing, at, group.len());
            at += group.len();
            // Olds are named even when empty when the server keeps a history: a list left out
            // is the previous request's.
            let whole = || olds.iter().map(|(c, _)| c.id).collect();
            let held = a.context_for(group);
            let id = conn.send(if short {
                Request::GetChunksShort {
                    ids: group.iter().map(|c| short_id(&c.id)).collect(),
                    key_bytes: a.key_bytes,
                    runs: a.runs,
                    keys,
                    olds: history.then(|| match short_olds {
                        true => OldIds::Short(olds.iter().map(|(c, _)| short_id(&c.id)).collect()),
                        false => OldIds::Whole(whole()),
                    }),
                    context: a.context(&held),
                }
            } else {
                Request::GetChunksAgainst {
                    ids: group.iter().map(|c| c.id).collect(),
                    keys,
                    olds: history.then(whole),
                }
            })?;
            sent.push((id, i, group, olds, held));
        }
    }
    conn.flush()?;
    let mut plain = vec![];
    for (id, i, asked, sent_olds, held) in sent {
        let a = &files[i].0;
        let mut stored = std::collections::HashSet::new();
        let mut store = |cid: Id, bytes: &[u8], against: bool| -> Result<(), GetError> {
            // A chunk the server did not ask about is a lie; wrong bytes from a collided
            // piece key are not (those chunks are fetched plainly).
            if !asked.iter().any(|c| c.id == cid) {
                return Err(GetError::BadData(cid));
            }
            // A placeholder's chunk is what has its short id.
            let v = match shorts.open.contains_key(&cid) {
                true => shorts.arrived(cid, bytes),
                false => VerifiedChunk::check(cid, bytes).ok(),
            };
            if let Some(v) = v {
                src.cache.put(&v)?;
                stored.insert(cid);
                fetched.insert(*v.id());
                stats.from_server += 1;
                stats.against_old += against as u64;
                stats.bytes_from_server += bytes.len() as u64;
            }
            Ok(())
        };
        // The chunks named (by their places in the request), their bytes concatenated:
        // plainly, or as one frame against the old data (olds, refs).
        let (places, frame, data) = match conn.replies(id)?.pop() {
            // Nothing old worth compressing against, says the server: plain chunks.
            Some(Reply::Chunks(cs)) => {
                for (cid, data) in cs {
                    store(cid, &data, false)?;
                }
                (vec![], None, vec![])
            }
            Some(Reply::ChunksAgainst {
                ids,
                olds,
                refs,
                data,
            }) => {
                let places = ids
                    .iter()
                    .map(|cid| {
                        asked
                            .iter()
                            .position(|c| c.id == *cid)
                            .ok_or(GetError::BadData(*cid))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                (places, Some((olds, refs, false)), data)
            }
            Some(Reply::ChunksShort {
                found,
                zstd,
                context,
                olds,
                refs,
                data,
            }) => {
                // Places in the request, in the order asked.
                let increasing = found.windows(2).all(|w| w[0] < w[1]);
                if !increasing || found.last().is_some_and(|&i| i as usize >= asked.len()) {
                    return Err(GetError::BadData(asked[0].id));
                }
                let places = found.into_iter().map(|i| i as usize).collect();
                (places, zstd.then_some((olds, refs, context)), data)
            }
            other => return Err(ConnError::Unexpected(format!("{other:?}")).into()),
        };
        if !places.is_empty() {
            // Each chunk asked for at most once: what is decompressed stays within what was
            // asked (a request's worth).
            let distinct: std::collections::HashSet<usize> = places.iter().copied().collect();
            if distinct.len() != places.len() {
                return Err(GetError::BadData(asked[places[0]].id));
            }
            let total = places.iter().map(|&p| asked[p].len as usize).sum();
            let against = frame.is_some();
            let bytes = match frame {
                Some((olds, refs, context)) => {
                    let head = match context {
                        true => a.held_bytes(&held, src.cache),
                        false => Ok(vec![]),
                    };
                    head.and_then(|mut prefix| {
                        prefix.extend(a.prefix(sent_olds, &olds, &refs)?);
                        crate::delta::decode(&data, &prefix, total)
                    })
                }
                None if data.len() == total => Ok(data),
                None => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} bytes where {total} were expected", data.len()),
                )),
            };
            match bytes {
                Ok(data) => {
                    let mut at = 0;
                    for p in places {
                        let len = asked[p].len as usize;
                        store(asked[p].id, &data[at..at + len], against)?;
                        at += len;
                    }
                }
                Err(e) => tracing::warn!(
                    "chunks of {} compressed against the old file: {e}; fetching them plainly",
                    a.path.display()
                ),
            }
        }
        plain.extend(asked.iter().map(|c| c.id).filter(|c| !stored.contains(c)));
    }
    src.cache.flush()?;
    Ok(plain)
}

/// Fetches `missing` into the cache, pipelined; returns what arrived.
fn fetch_chunks<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    missing: &[Id],
    src: &Sources<'_>,
    stats: &mut GetStats,
) -> Result<std::collections::HashSet<Id>, GetError> {
    let batches: Vec<&[Id]> = missing.chunks(CHUNKS_PER_REQUEST).collect();
    let mut next = 0;
    let mut waiting = std::collections::VecDeque::new();
    let mut fetched = std::collections::HashSet::new();
    let mut unflushed = 0usize;
    while next < batches.len() || !waiting.is_empty() {
        while next < batches.len() && waiting.len() < REQUESTS_IN_FLIGHT {
            let r = Request::GetChunks {
                ids: batches[next].to_vec(),
            };
            // The first window costs a round trip; refills only keep the stream going.
            let id = if next < REQUESTS_IN_FLIGHT {
                conn.send(r)?
            } else {
                conn.send_paced(r)?
            };
            waiting.push_back((id, batches[next]));
            next += 1;
        }
        conn.flush()?;
        let (id, asked) = waiting.pop_front().expect("non-empty");
        let mut got = 0;
        for r in conn.replies(id)? {
            let Reply::Chunks(cs) = r else {
                return Err(ConnError::Unexpected(format!("{r:?}")).into());
            };
            for (cid, data) in cs {
                if !asked.contains(&cid) {
                    return Err(GetError::BadData(cid));
                }
                let v = VerifiedChunk::check(cid, &data).map_err(|_| GetError::BadData(cid))?;
                src.cache.put(&v)?;
                fetched.insert(cid);
                stats.from_server += 1;
                stats.bytes_from_server += data.len() as u64;
                unflushed += data.len();
                got += 1;
            }
        }
        // What arrived is kept: a cut connection, or a killed client, resumes from here.
        if unflushed >= RESUME_FLUSH_BYTES {
            src.cache.flush()?;
            unflushed = 0;
        }
        if got < asked.len() {
            // The server no longer has some chunk of a recipe it sent (the file changed).
            return Err(changed_while_fetched());
        }
    }
    src.cache.flush()?;
    Ok(fetched)
}

/// Bytes asked for per ReadRange, and ReadRange requests kept in flight.
const RANGE_BYTES: u32 = 2 << 20;
const RANGES_IN_FLIGHT: usize = 4;

/// Large new files that a receiver with nothing reads whole (ReadRange), a range at a time, in
/// order: no recipe and no chunk ids travel, only the files' bytes in the session stream.
struct Ranges {
    /// (job, offset, length) of every range to ask for, files one after another.
    all: Vec<(usize, u64, u32)>,
    /// How many of them were asked for, and the request ids of those not yet taken.
    sent: usize,
    waiting: std::collections::VecDeque<u32>,
}

impl Ranges {
    fn new(jobs: &[FileJob], files: &[usize]) -> Self {
        let mut all = vec![];
        for &i in files {
            let size = jobs[i].attr.size;
            all.extend((0..size.div_ceil(RANGE_BYTES as u64)).map(|k| {
                let offset = k * RANGE_BYTES as u64;
                (i, offset, (size - offset).min(RANGE_BYTES as u64) as u32)
            }));
        }
        Ranges {
            all,
            sent: 0,
            waiting: Default::default(),
        }
    }

    /// Asks for ranges until [`RANGES_IN_FLIGHT`] are on their way: the first window costs a
    /// round trip, refills only keep the stream going.
    fn send<R: io::Read, W: Write>(
        &mut self,
        conn: &mut Connection<R, W>,
        jobs: &[FileJob],
    ) -> Result<(), GetError> {
        while self.sent < self.all.len() && self.waiting.len() < RANGES_IN_FLIGHT {
            let (job, offset, len) = self.all[self.sent];
            let r = Request::ReadRange {
                path: jobs[job].remote.clone(),
                offset,
                len,
            };
            let id = if self.sent < RANGES_IN_FLIGHT {
                conn.send(r)?
            } else {
                conn.send_paced(r)?
            };
            self.waiting.push_back(id);
            self.sent += 1;
        }
        Ok(())
    }

    /// Takes every range, writing each file beside its destination and cutting it into the
    /// cache as it arrives (a cut transfer resumes from what arrived). A file whose bytes do
    /// not hash to the object id the server named for them all (it changed meanwhile) never
    /// replaces anything: returns those, to fetch by recipe.
    fn fetch<R: io::Read, W: Write>(
        mut self,
        conn: &mut Connection<R, W>,
        jobs: &[FileJob],
        src: &Sources<'_>,
        stats: &mut GetStats,
    ) -> Result<Vec<usize>, GetError> {
        let mut file: Option<RangeFile> = None;
        let mut changed = vec![];
        let mut unflushed = 0;
        for k in 0..self.all.len() {
            self.send(conn, jobs)?;
            let (job, _, len) = self.all[k];
            let id = self.waiting.pop_front().expect("asked");
            let mut replies = conn.replies(id)?;
            let [Reply::Range { oid, data }] = &mut replies[..] else {
                return Err(ConnError::Unexpected(format!("{replies:?}")).into());
            };
            if changed.last() == Some(&job) {
                continue;
            }
            let f = match &mut file {
                Some(f) if f.job == job => f,
                f => f.insert(RangeFile::new(job, *oid, &jobs[job].local, &src.chunker)?),
            };
            if f.oid != *oid || data.len() > len as usize {
                file = None;
                changed.push(job);
                continue;
            }
            f.write(data, &jobs[job].local, src, stats)?;
            unflushed += data.len();
            if unflushed >= RESUME_FLUSH_BYTES {
                src.cache.flush()?;
                unflushed = 0;
            }
            if self.all.get(k + 1).is_none_or(|n| n.0 != job) {
                let f = file.take().expect("a file");
                if !f.finish(&jobs[job], src, stats)? {
                    changed.push(job);
                }
            }
        }
        src.cache.flush()?;
        Ok(changed)
    }
}

fn changed_while_fetched() -> GetError {
    ConnError::Unexpected(
        "a file changed on the server while it was fetched; run the command again".into(),
    )
    .into()
}

/// A file being read by ranges: the temporary file it goes into, and its chunking so far.
struct RangeFile {
    job: usize,
    oid: Id,
    tmp: tempfile::NamedTempFile,
    cutter: Box<dyn ferry_chunk::Cutter>,
    /// The bytes of the chunk not yet cut off.
    pending: Vec<u8>,
    whole: ferry_format::IdHasher,
}

impl RangeFile {
    fn new(job: usize, oid: Id, local: &Path, chunker: &ChunkerSpec) -> Result<Self, GetError> {
        Ok(RangeFile {
            job,
            oid,
            tmp: temp_beside(local)?,
            cutter: chunker.try_build().map_err(|e| GetError::Local {
                op: "chunk",
                path: local.to_path_buf(),
                error: io::Error::new(io::ErrorKind::InvalidInput, e),
            })?,
            pending: vec![],
            whole: ferry_format::IdHasher::new(oid.alg()),
        })
    }

    fn write(
        &mut self,
        mut data: &[u8],
        local: &Path,
        src: &Sources<'_>,
        stats: &mut GetStats,
    ) -> Result<(), GetError> {
        self.tmp
            .as_file()
            .write_all(data)
            .map_err(GetError::local("write", local))?;
        self.whole.update(data);
        while let Some(n) = self.cutter.next_cut(data) {
            self.pending.extend_from_slice(&data[..n]);
            self.cut(src, stats)?;
            data = &data[n..];
        }
        self.pending.extend_from_slice(data);
        Ok(())
    }

    /// The pending bytes are a chunk: into the cache.
    fn cut(&mut self, src: &Sources<'_>, stats: &mut GetStats) -> Result<(), GetError> {
        let len = self.pending.len() as u64;
        src.cache
            .put(&VerifiedChunk::hash(HashAlg::Blake3, &self.pending))?;
        self.pending.clear();
        stats.from_server += 1;
        stats.bytes_from_server += len;
        stats.chunks += 1;
        stats.bytes += len;
        if let Some(p) = src.progress {
            p(len);
        }
        Ok(())
    }

    /// Installs the file if its bytes hash to the object id named; says whether they did.
    fn finish(
        mut self,
        j: &FileJob,
        src: &Sources<'_>,
        stats: &mut GetStats,
    ) -> Result<bool, GetError> {
        if !self.pending.is_empty() {
            self.cut(src, stats)?;
        }
        if self.whole.finish() != self.oid {
            return Ok(false);
        }
        install(self.tmp, j, stats)?;
        Ok(true)
    }
}

/// Writes a file from its recipe into a temporary file beside the destination, then renames it
/// over the destination.
fn assemble(
    j: &FileJob,
    recipe: &Recipe,
    here: &HashMap<Id, (u64, u32)>,
    fetched: &std::collections::HashSet<Id>,
    src: &Sources<'_>,
    stats: &mut GetStats,
) -> Result<(), GetError> {
    let local = &j.local;
    let existing = if here.is_empty() {
        None
    } else {
        File::open(j.old()).ok()
    };
    let mut tmp = temp_beside(local)?;
    {
        let mut out = BufWriter::with_capacity(1 << 20, tmp.as_file_mut());
        let mut buf = vec![];
        for c in recipe.chunks() {
            let data = match here.get(&c.id) {
                Some(&(off, len)) => {
                    buf.resize(len as usize, 0);
                    let ok = existing.as_ref().is_some_and(|f| {
                        std::os::unix::fs::FileExt::read_exact_at(f, &mut buf, off).is_ok()
                    });
                    if ok && c.id.matches(&buf) {
                        stats.from_local += 1;
                        buf.clone()
                    } else {
                        src.cache.get(&c.id)?.ok_or(GetError::BadData(c.id))?
                    }
                }
                None => {
                    if !fetched.contains(&c.id) {
                        stats.from_cache += 1;
                    }
                    src.cache.get(&c.id)?.ok_or(GetError::BadData(c.id))?
                }
            };
            if let Some(p) = src.progress {
                p(data.len() as u64);
            }
            out.write_all(&data)
                .map_err(GetError::local("write", local))?;
            stats.chunks += 1;
            stats.bytes += data.len() as u64;
        }
        out.flush().map_err(GetError::local("write", local))?;
    }
    install(tmp, j, stats)
}

/// The directory a file goes into (made if need be).
fn parent_dir(local: &Path) -> &Path {
    local
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// A temporary file beside `local`, to be renamed over it once whole.
fn temp_beside(local: &Path) -> Result<tempfile::NamedTempFile, GetError> {
    let dir = parent_dir(local);
    fs::create_dir_all(dir).map_err(GetError::local("create directory", dir))?;
    tempfile::NamedTempFile::new_in(dir).map_err(GetError::local("create a temporary file in", dir))
}

/// Gives a file written in full to `tmp` its mode and mtime, and renames it over its
/// destination, durably.
fn install(
    tmp: tempfile::NamedTempFile,
    j: &FileJob,
    stats: &mut GetStats,
) -> Result<(), GetError> {
    let (local, dir) = (&j.local, parent_dir(&j.local));
    let f = tmp.as_file();
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(
        j.attr.mode & 0o7777,
    ))
    .map_err(GetError::local("chmod", local))?;
    f.set_modified(mtime(&j.attr))
        .map_err(GetError::local("set mtime of", local))?;
    f.sync_all().map_err(GetError::local("fsync", local))?;
    tmp.persist(local).map_err(|e| GetError::Local {
        op: "rename into",
        path: local.to_path_buf(),
        error: e.error,
    })?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(GetError::local("fsync", dir))?;
    stats.files += 1;
    Ok(())
}

/// What an upload cost.
#[derive(Clone, Debug, Default)]
pub struct PutStats {
    pub files: u64,
    pub bytes: u64,
    pub chunks: u64,
    /// Entries removed from the server (with `delete`).
    pub deleted: u64,
    /// Files skipped because size, mtime and mode already matched.
    pub unchanged: u64,
    /// With `dry_run`: what would be done, one line each.
    pub planned: Vec<String>,
    /// Chunks the server lacked, and their bytes: what had to travel.
    pub chunks_sent: u64,
    pub chunk_bytes_sent: u64,
}

/// Files smaller than this travel whole with their commit, in one round trip (LBFS §3.3).
const SMALL_FILE: u64 = 8 * 1024;
/// Chunk bytes per PutChunks request, and PutChunks requests kept in flight.
const PUT_BATCH_BYTES: usize = 1 << 20;
const PUTS_IN_FLIGHT: usize = 16;
/// Bytes of files per upload batch (each batch is about two round trips).
const PUT_BATCH_FILE_BYTES: u64 = 64 << 20;

fn remote_attr<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    path: &WirePath,
) -> Result<Option<Attr>, ConnError> {
    match conn.call(Request::GetAttr { path: path.clone() }) {
        Ok(mut r) => match r.pop() {
            Some(Reply::Attr(a)) => Ok(Some(a)),
            other => Err(ConnError::Unexpected(format!("{other:?}"))),
        },
        Err(ConnError::Remote {
            code: ferry_proto::ErrorCode::NotFound,
            ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A local file to upload, and what the server has at its path.
struct PutJob {
    local: PathBuf,
    meta: fs::Metadata,
    /// The permission bits to give the file on the server.
    mode: u32,
    remote: WirePath,
    /// The version of the file being replaced (`None`: there is none).
    if_version: Option<u64>,
}

/// What the walk of an upload leaves to do.
#[derive(Default)]
struct PutPlan {
    files: Vec<PutJob>,
    /// Symlinks: the local target, the server path, what the server has there.
    links: Vec<(Vec<u8>, WirePath, Option<Attr>)>,
    deletes: Vec<(WirePath, FileKind)>,
    /// Requests sent and not yet checked (Mkdir): their replies are read with the next batch.
    pending: Vec<u32>,
    /// Directories walked, parents first: their modes and times are set on the server last.
    dirs: Vec<(PathBuf, WirePath)>,
}

/// Uploads the file or tree at `local` to `remote`, sending only chunks the server lacks, and
/// committing each file atomically against the version it had when the upload began. With
/// `delete`, entries of the server's directories that `local` lacks are removed.
///
/// A walk compares the local tree with the server's listings (breadth first, one round trip
/// per level); then files go up in batches of about two round trips each (which chunks the
/// server has; the missing chunks and the commits), files under 8 KiB in one.
pub fn put<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    local: &Path,
    remote: &WirePath,
    opts: &PutOptions<'_>,
    stats: &mut PutStats,
) -> Result<(), GetError> {
    let meta = fs::symlink_metadata(local).map_err(GetError::local("read", local))?;
    let current = remote_attr(conn, remote)?;
    // With tree digests from the server, every subtree already the same there is skipped.
    let mut trees = LocalTrees::new();
    if let Some(cur) = current
        .as_ref()
        .filter(|a| a.oid.is_some() && meta.is_dir())
    {
        if let Err(e) = local_tree(local, &mut trees) {
            tracing::debug!("no tree digests for {}: {e}", local.display());
            trees.clear();
        }
        if let Some(files) = same_tree(local, cur, &trees) {
            stats.unchanged += files;
            return Ok(());
        }
    }
    let mut plan = PutPlan::default();
    put_walk(
        conn, local, meta, remote, current, &trees, opts, stats, &mut plan,
    )?;
    let mut batch = vec![];
    let mut bytes = 0;
    for job in std::mem::take(&mut plan.files) {
        if !batch.is_empty()
            && (batch.len() >= BATCH_FILES || bytes + job.meta.len() > PUT_BATCH_FILE_BYTES)
        {
            put_files(
                conn,
                std::mem::take(&mut batch),
                &mut plan.pending,
                opts,
                stats,
            )?;
            bytes = 0;
        }
        bytes += job.meta.len();
        batch.push(job);
    }
    if !batch.is_empty() {
        put_files(conn, batch, &mut plan.pending, opts, stats)?;
    }
    put_links(
        conn,
        std::mem::take(&mut plan.links),
        &mut plan.pending,
        opts,
        stats,
    )?;
    for (path, kind) in std::mem::take(&mut plan.deletes) {
        if opts.dry_run {
            stats.planned.push(format!("delete {path:?}"));
        } else if kind == FileKind::Dir {
            remove_remote(conn, &path, kind)?;
        } else {
            plan.pending.push(conn.send(Request::Unlink { path })?);
        }
        stats.deleted += 1;
    }
    // Children before parents, after everything that changes them: directories end with the
    // local modes and times, so the next sync finds their digests equal.
    if !opts.dry_run {
        for (local, remote) in plan.dirs.iter().rev() {
            use std::os::unix::fs::MetadataExt;
            let m = fs::symlink_metadata(local).map_err(GetError::local("read", local))?;
            plan.pending.push(conn.send(Request::SetAttr {
                path: remote.clone(),
                mode: Some(m.mode() & 0o7777),
                mtime_ns: Some(m.mtime() * 1_000_000_000 + m.mtime_nsec()),
                size: None,
            })?);
        }
    }
    check(conn, &mut plan.pending)
}

/// Uploads the local file `local` to `remote` as one new version, committed against
/// `if_version` (the server refuses it with a conflict if the file is no longer at that
/// version; `None`: if anything is there), with permission bits `mode`. Only the chunks the server lacks
/// travel. Returns the server's attributes of the new version.
pub fn put_file<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    local: &Path,
    remote: &WirePath,
    if_version: Option<u64>,
    mode: u32,
    opts: &PutOptions<'_>,
    stats: &mut PutStats,
) -> Result<Attr, GetError> {
    let meta = fs::metadata(local).map_err(GetError::local("read", local))?;
    let job = PutJob {
        local: local.to_path_buf(),
        meta,
        mode: mode & 0o7777,
        remote: remote.clone(),
        if_version,
    };
    let mut attrs = put_files(conn, vec![job], &mut vec![], opts, stats)?;
    attrs
        .pop()
        .ok_or_else(|| ConnError::Unexpected("no commit reply".into()).into())
}

/// Reads the replies of requests sent earlier; the first error wins.
fn check<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    pending: &mut Vec<u32>,
) -> Result<(), GetError> {
    conn.flush()?;
    for id in pending.drain(..) {
        conn.replies(id)?;
    }
    Ok(())
}

/// Compares `local` with the server, breadth first, noting what to upload and delete.
#[allow(clippy::too_many_arguments)]
fn put_walk<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    local: &Path,
    meta: fs::Metadata,
    remote: &WirePath,
    current: Option<Attr>,
    trees: &LocalTrees,
    opts: &PutOptions<'_>,
    stats: &mut PutStats,
    plan: &mut PutPlan,
) -> Result<(), GetError> {
    if !meta.is_dir() {
        return put_note(local, meta, remote, current, opts, stats, plan);
    }
    // (local directory, server directory, its listing if it exists there)
    let mut queue = std::collections::VecDeque::new();
    match &current {
        Some(a) if a.kind == FileKind::Dir => {
            let id = conn.send(Request::ReadDir {
                path: remote.clone(),
            })?;
            queue.push_back((local.to_path_buf(), remote.clone(), Some(id)));
        }
        Some(_) => {
            return Err(ConnError::Unexpected(format!(
                "{remote:?} exists on the server and is not a directory"
            ))
            .into())
        }
        None => {
            put_mkdir(conn, remote, &meta, opts, stats, plan)?;
            queue.push_back((local.to_path_buf(), remote.clone(), None));
        }
    }
    while let Some((local, remote, listing)) = queue.pop_front() {
        plan.dirs.push((local.clone(), remote.clone()));
        let mut there: HashMap<Vec<u8>, Attr> = HashMap::new();
        if let Some(id) = listing {
            conn.flush()?;
            for r in conn.replies(id)? {
                match r {
                    Reply::DirEntries(es) => there.extend(es.into_iter().map(|e| (e.name, e.attr))),
                    other => return Err(ConnError::Unexpected(format!("{other:?}")).into()),
                }
            }
        }
        let mut names: Vec<_> = fs::read_dir(&local)
            .map_err(GetError::local("read directory", &local))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(GetError::local("read directory", &local))?;
        names.sort();
        for name in &names {
            let (child_local, child) = (local.join(name), remote.join(name.as_bytes())?);
            let m = fs::symlink_metadata(&child_local)
                .map_err(GetError::local("read", &child_local))?;
            let cur = there.remove(name.as_bytes());
            if !m.is_dir() {
                put_note(&child_local, m, &child, cur, opts, stats, plan)?;
                continue;
            }
            match cur {
                Some(a) if a.kind == FileKind::Dir => {
                    if let Some(files) = same_tree(&child_local, &a, trees) {
                        stats.unchanged += files;
                        continue;
                    }
                    let id = conn.send(Request::ReadDir {
                        path: child.clone(),
                    })?;
                    queue.push_back((child_local, child, Some(id)));
                }
                Some(_) => {
                    return Err(ConnError::Unexpected(format!(
                        "{child:?} exists on the server and is not a directory"
                    ))
                    .into())
                }
                None => {
                    put_mkdir(conn, &child, &m, opts, stats, plan)?;
                    queue.push_back((child_local, child, None));
                }
            }
        }
        if opts.delete {
            // What is left of the listing, the local tree lacks.
            let mut extra: Vec<_> = there.into_iter().collect();
            extra.sort_by(|a, b| a.0.cmp(&b.0));
            for (name, attr) in extra {
                plan.deletes.push((remote.join(&name)?, attr.kind));
            }
        }
    }
    Ok(())
}

fn put_mkdir<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    remote: &WirePath,
    meta: &fs::Metadata,
    opts: &PutOptions<'_>,
    stats: &mut PutStats,
    plan: &mut PutPlan,
) -> Result<(), GetError> {
    if opts.dry_run {
        stats.planned.push(format!("mkdir {remote:?}"));
        return Ok(());
    }
    // Not waited for: the server handles requests in order, so what goes into the directory
    // comes after it; the reply is checked with the next batch.
    let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions());
    plan.pending.push(conn.send(Request::Mkdir {
        path: remote.clone(),
        mode: mode & 0o7777,
    })?);
    Ok(())
}

/// Notes a file or symlink the walk found.
fn put_note(
    local: &Path,
    meta: fs::Metadata,
    remote: &WirePath,
    current: Option<Attr>,
    opts: &PutOptions<'_>,
    stats: &mut PutStats,
    plan: &mut PutPlan,
) -> Result<(), GetError> {
    use std::os::unix::fs::MetadataExt;
    let ft = meta.file_type();
    if ft.is_symlink() {
        let target = fs::read_link(local).map_err(GetError::local("read symlink", local))?;
        plan.links.push((
            target.as_os_str().as_bytes().to_vec(),
            remote.clone(),
            current,
        ));
    } else if ft.is_file() {
        let mtime_ns = meta.mtime() * 1_000_000_000 + meta.mtime_nsec();
        // The quick check, as for get: same size, mtime and mode means unchanged.
        if current.as_ref().is_some_and(|a| {
            a.kind == FileKind::File
                && a.size == meta.len()
                && a.mtime_ns == mtime_ns
                && a.mode & 0o7777 == meta.mode() & 0o7777
        }) {
            stats.unchanged += 1;
        } else if current.as_ref().is_some_and(|a| a.kind == FileKind::Dir) {
            return Err(
                ConnError::Unexpected(format!("a directory is in the way of {remote:?}")).into(),
            );
        } else if opts.dry_run {
            stats
                .planned
                .push(format!("send {} ({} bytes)", local.display(), meta.len()));
            stats.files += 1;
        } else {
            plan.files.push(PutJob {
                local: local.to_path_buf(),
                mode: meta.mode() & 0o7777,
                meta,
                remote: remote.clone(),
                if_version: current.map(|a| a.version),
            });
        }
    } else {
        tracing::warn!(
            "skipping {}: not a regular file, directory or symlink",
            local.display()
        );
    }
    Ok(())
}

/// Makes the server's symlinks match: targets of the ones there asked for at once, then the
/// changes sent together.
fn put_links<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    links: Vec<(Vec<u8>, WirePath, Option<Attr>)>,
    pending: &mut Vec<u32>,
    opts: &PutOptions<'_>,
    stats: &mut PutStats,
) -> Result<(), GetError> {
    let mut asks = vec![];
    for (_, remote, cur) in &links {
        asks.push(match cur {
            Some(a) if a.kind == FileKind::Symlink => Some(conn.send(Request::ReadLink {
                path: remote.clone(),
            })?),
            _ => None,
        });
    }
    conn.flush()?;
    for ((target, remote, cur), ask) in links.into_iter().zip(asks) {
        if let Some(id) = ask {
            if let Some(Reply::Link(t)) = conn.replies(id)?.pop() {
                if t == target {
                    continue;
                }
            }
        }
        if cur.as_ref().is_some_and(|a| a.kind == FileKind::Dir) {
            return Err(ConnError::Unexpected(format!(
                "a directory is in the way of symlink {remote:?}"
            ))
            .into());
        }
        if opts.dry_run {
            stats.planned.push(format!("link {remote:?}"));
            continue;
        }
        if cur.is_some() {
            pending.push(conn.send(Request::Unlink {
                path: remote.clone(),
            })?);
        }
        pending.push(conn.send(Request::Symlink {
            path: remote,
            target,
        })?);
        stats.files += 1;
    }
    Ok(())
}

/// A file of a batch, chunked.
struct Chunked {
    file: File,
    recipe: Recipe,
    /// A small file's chunks, sent whole with its commit.
    small: Option<Vec<(Id, Vec<u8>)>>,
    /// For a larger file: its distinct chunks (id, offset, length), and the request asking
    /// which of them the server has.
    unique: Vec<(Id, u64, u32)>,
    have: Option<u32>,
    old_recipe: Option<u32>,
}

/// Uploads a batch of files: one round trip asks which chunks the server lacks (for every
/// file of 8 KiB or more at once), one sends those chunks and all the commits. Returns the
/// server's attributes of each file committed.
fn put_files<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    jobs: Vec<PutJob>,
    pending: &mut Vec<u32>,
    opts: &PutOptions<'_>,
    stats: &mut PutStats,
) -> Result<Vec<Attr>, GetError> {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let mut chunked = Vec::with_capacity(jobs.len());
    for j in &jobs {
        let file = File::open(&j.local).map_err(GetError::local("open", &j.local))?;
        let small = j.meta.len() < SMALL_FILE;
        let mut small_chunks = vec![];
        let (recipe, _) =
            ferry_format::chunk_object(&file, &opts.chunker, HashAlg::Blake3, |c, data| {
                if small {
                    small_chunks.push((c.id, data.to_vec()));
                }
                Ok::<_, io::Error>(())
            })
            .map_err(GetError::local("read", &j.local))?;
        let mut c = Chunked {
            file,
            small: small.then_some(small_chunks),
            unique: vec![],
            have: None,
            old_recipe: None,
            recipe,
        };
        if !small {
            // CONDWRITE: which chunks does the server already have?
            let mut seen = std::collections::HashSet::new();
            for (off, r) in c.recipe.with_offsets() {
                if seen.insert(r.id) {
                    c.unique.push((r.id, off, r.len));
                }
            }
            // The version being replaced is the likeliest source: asking for its recipe first
            // makes the server index it (and the trash keep it findable), in the same round
            // trip as Have.
            if j.if_version.is_some() {
                c.old_recipe = Some(conn.send(Request::GetRecipe {
                    path: j.remote.clone(),
                    from: 0,
                })?);
            }
            let ids = c.unique.iter().map(|u| u.0).collect();
            c.have = Some(conn.send(Request::Have { ids })?);
        }
        chunked.push(c);
    }
    let mut sent = std::collections::HashSet::new();
    let mut puts = std::collections::VecDeque::new();
    let mut commits = vec![];
    let mut batch = vec![];
    let mut bytes = 0usize;
    for (j, c) in jobs.iter().zip(&mut chunked) {
        if let Some(id) = c.old_recipe {
            conn.replies(id)?;
        }
        let mut missing = vec![];
        if let Some(small) = c.small.take() {
            missing = small;
        } else if let Some(id) = c.have {
            let have = match conn.replies(id)?.pop() {
                Some(Reply::Have(flags)) if flags.len() == c.unique.len() => flags,
                other => return Err(ConnError::Unexpected(format!("{other:?}")).into()),
            };
            for (&(id, off, len), have) in c.unique.iter().zip(have) {
                if have || sent.contains(&id) {
                    continue;
                }
                let mut buf = vec![0u8; len as usize];
                c.file
                    .read_exact_at(&mut buf, off)
                    .map_err(GetError::local("read", &j.local))?;
                if !id.matches(&buf) {
                    return Err(GetError::Local {
                        op: "file changed while it was uploaded",
                        path: j.local.clone(),
                        error: io::Error::from(io::ErrorKind::InvalidData),
                    });
                }
                missing.push((id, buf));
            }
        }
        for (id, data) in missing {
            if !sent.insert(id) {
                continue;
            }
            stats.chunks_sent += 1;
            stats.chunk_bytes_sent += data.len() as u64;
            bytes += data.len();
            batch.push((id, data));
            if bytes >= PUT_BATCH_BYTES {
                send_chunks(conn, std::mem::take(&mut batch), &mut puts)?;
                bytes = 0;
            }
        }
        if !batch.is_empty() {
            send_chunks(conn, std::mem::take(&mut batch), &mut puts)?;
            bytes = 0;
        }
        commits.push(conn.send(Request::Commit {
            path: j.remote.clone(),
            if_version: j.if_version,
            recipe: c.recipe.clone(),
            mode: j.mode,
            mtime_ns: j.meta.mtime() * 1_000_000_000 + j.meta.mtime_nsec(),
        })?);
    }
    // Directories made earlier come first: a failed one explains the commits that follow.
    check(conn, pending)?;
    for id in puts {
        conn.replies(id)?;
    }
    let mut attrs = Vec::with_capacity(commits.len());
    for (id, c) in commits.into_iter().zip(&chunked) {
        match conn.replies(id)?.pop() {
            Some(Reply::Attr(a)) => attrs.push(a),
            other => return Err(ConnError::Unexpected(format!("{other:?}")).into()),
        }
        stats.files += 1;
        stats.bytes += c.recipe.total_len();
        stats.chunks += c.recipe.len() as u64;
        if let Some(p) = opts.progress {
            p(c.recipe.total_len());
        }
    }
    Ok(attrs)
}

/// Sends one PutChunks, keeping at most [`PUTS_IN_FLIGHT`] unanswered: memory stays bounded
/// however much is sent, and the link stays full.
fn send_chunks<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    chunks: Vec<(Id, Vec<u8>)>,
    puts: &mut std::collections::VecDeque<u32>,
) -> Result<(), GetError> {
    if puts.len() >= PUTS_IN_FLIGHT {
        let oldest = puts.pop_front().expect("non-empty");
        conn.replies(oldest)?;
    }
    puts.push_back(conn.send_paced(Request::PutChunks { chunks })?);
    Ok(())
}

/// Removes a server entry, a directory with everything below it.
fn remove_remote<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    path: &WirePath,
    kind: FileKind,
) -> Result<(), GetError> {
    if kind == FileKind::Dir {
        let mut entries = vec![];
        for r in conn.call(Request::ReadDir { path: path.clone() })? {
            if let Reply::DirEntries(es) = r {
                entries.extend(es);
            }
        }
        for e in entries {
            remove_remote(conn, &path.join(&e.name)?, e.attr.kind)?;
        }
        conn.call(Request::Rmdir { path: path.clone() })?;
    } else {
        conn.call(Request::Unlink { path: path.clone() })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_of_repeated_pieces_is_bounded() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("old");
        fs::write(&path, vec![7u8; 8192]).unwrap();
        let a = AgainstOld {
            file: File::open(&path).unwrap(),
            path,
            pieces: vec![(0, 8192)],
            keys: vec![1],
            key_bytes: 5,
            runs: false,
            olds: vec![],
            remote: None,
            held: vec![],
            missing_at: HashMap::new(),
            context_budget: 0,
        };
        assert_eq!(a.prefix(&[], &[], &[0, 0]).unwrap().len(), 16384);
        // A million references to one 8 KiB piece would be 8 GiB: refused instead.
        assert!(a.prefix(&[], &[], &vec![0; 1 << 20]).is_err());
        assert!(a.prefix(&[], &[], &[1]).is_err(), "no such piece");
        // Likewise old chunks named over and over, or ones never sent.
        let old = ChunkRef {
            id: Id::from_parts(HashAlg::Blake3, [1; 32]),
            len: 8192,
        };
        assert_eq!(a.prefix(&[(old, 0)], &[0], &[0]).unwrap().len(), 16384);
        assert!(a.prefix(&[(old, 0)], &vec![0; 1 << 20], &[]).is_err());
        assert!(
            a.prefix(&[(old, 0)], &[1], &[]).is_err(),
            "no such old chunk"
        );
    }
}
