//! A fetch's plan: the walk of the server's listings (breadth first, against the entries held
//! here), the files that differ, bases for new files; then the batches, the symlinks, and the
//! directories' modes and times.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use ferry_proto::{Attr, DirEntry, FileKind, Reply, Request, TreeItem, WirePath};

use super::dest;
use super::fetch::fetch_files;
use super::local::{
    local_items, local_tree_hashing, remote_item, same_tree, unchanged, Items, LocalTrees,
};
use super::tree::{
    ask_tree, finish_tree, start_tree, tree_waste, Asked, Started, FILTER_DIRS, SPECULATE_BYTES,
};
use super::{GetError, GetStats, Sources};
use crate::conn::{ConnError, Connection};

/// Files fetched together: their recipes are asked for at once, then all their missing chunks,
/// so a batch costs about two round trips however many files it holds.
const BATCH_FILES: usize = 1024;
/// Bytes of files per batch (bounding the recipes held in memory at once).
const BATCH_BYTES: u64 = 256 << 20;

/// Fetches the file or tree at `remote` into `local`.
///
/// First a walk of the listings (two round trips with a server that names the directories
/// that differ, else one a level) creates directories, applies `--delete` and notes which
/// files differ; then the files are fetched in batches, each costing about two round trips
/// (recipes, then the chunks not found locally); last, symlinks, and directories' modes and
/// times.
pub fn get<R: io::Read + Send, W: Write>(
    conn: &mut Connection<R, W>,
    remote: &WirePath,
    local: &Path,
    src: &Sources<'_>,
    stats: &mut GetStats,
) -> Result<(), GetError> {
    // With tree digests from the server, every subtree already the same here is skipped.
    let mut trees = LocalTrees::new();
    // Every local directory's hash, for a ReadTree's filter.
    let mut hashes = vec![];
    let local_kind = fs::symlink_metadata(local).map(|m| m.is_dir());
    if local_kind.as_ref().is_ok_and(|dir| *dir) {
        if let Err(e) = local_tree_hashing(local, local, &mut trees, &mut hashes) {
            tracing::debug!("no tree digests for {}: {e}", local.display());
            trees.clear();
            hashes.clear();
        }
    }
    let ping = super::ping(conn)?;
    let attr_id = conn.send(Request::GetAttr {
        path: remote.clone(),
    })?;
    // Where a tree may come (a directory here, or nothing yet), it is asked for with the
    // attributes, not a round trip after them, if that wastes little when the tree turns out
    // the same (its filter and the keys of the root's entries, sent for nothing).
    let mut started = None;
    let waste = match local_kind {
        Ok(true) => tree_waste(local, &hashes),
        Ok(false) => usize::MAX,
        Err(_) => 0,
    };
    if conn.may_offer(ferry_proto::FEATURE_TREE_LISTINGS) && waste <= SPECULATE_BYTES {
        started = Some(start_tree(conn, remote, local, true, (&trees, &hashes))?);
    }
    super::take_ping(conn, ping)?;
    let attr = match conn.replies(attr_id)?.pop() {
        Some(Reply::Attr(a)) => a,
        other => return Err(ConnError::Unexpected(format!("{other:?}")).into()),
    };
    if attr.oid.is_none() {
        trees.clear();
    }
    let unchanged = same_tree(local, &attr, &trees);
    if attr.kind != FileKind::Dir || unchanged.is_some() {
        if let Some(s) = started.take() {
            s.forget(conn);
        }
    }
    if let Some(files) = unchanged {
        stats.unchanged += files;
        return Ok(());
    }
    // What is written goes beneath `root`: the destination directory, or a file's own.
    let root: std::sync::Arc<Path> = match attr.kind {
        FileKind::Dir => local.into(),
        _ => super::install::parent_dir(local).into(),
    };
    if !src.dry_run {
        // The root is the user's to name: made by path, followed if a symlink.
        fs::create_dir_all(&root).map_err(GetError::local("create directory", &root))?;
    }
    let mut plan = Plan {
        root: root.clone(),
        files: vec![],
        links: vec![],
        dirs: vec![],
        gone: vec![],
        deletes: vec![],
    };
    let here = Local {
        path: local,
        trees: &trees,
        hashes: &hashes,
        started,
    };
    walk(conn, remote, &attr, here, src, stats, &mut plan)?;
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
    let mut emptied = std::collections::BTreeSet::new();
    for p in plan.deletes {
        dest::remove(&root, &p).map_err(GetError::local("delete", &p))?;
        emptied.insert(super::install::parent_dir(&p).to_path_buf());
    }
    // Deletions made durable before the get says it is done, as installs are.
    for dir in emptied {
        dest::open_dir(&root, &dir)
            .and_then(|d| Ok(rustix::fs::fsync(&d)?))
            .map_err(GetError::local("fsync", &dir))?;
    }
    fetch_links(conn, &root, plan.links, stats)?;
    // Children before parents: a directory's mtime is set after its contents changed, and a
    // read-only mode only once nothing more is written into it.
    for (dir, attr) in plan.dirs.iter().rev() {
        dest::set_dir_attr(&root, dir, attr.mode, attr.mtime_ns)
            .map_err(GetError::local("set the mode and mtime of", dir))?;
    }
    Ok(())
}

/// Fetches the file at `remote`, whose attributes the caller already has, into `local`: the
/// version already there (if any) is a chunk source and the base the server sends changes
/// against; the new version replaces it atomically. Costs about two round trips (the recipe,
/// then the chunks not found locally).
pub fn fetch_file<R: io::Read + Send, W: Write>(
    conn: &mut Connection<R, W>,
    remote: &WirePath,
    attr: &Attr,
    local: &Path,
    src: &Sources<'_>,
    stats: &mut GetStats,
) -> Result<(), GetError> {
    let root = super::install::parent_dir(local);
    fs::create_dir_all(root).map_err(GetError::local("create directory", root))?;
    let job = FileJob {
        remote: remote.clone(),
        attr: attr.clone(),
        local: local.to_path_buf(),
        root: root.into(),
        basis: None,
    };
    fetch_files(conn, vec![job], src, stats, true)
}

/// A remote file that differs from its local copy.
#[derive(Clone)]
pub(crate) struct FileJob {
    pub(crate) remote: WirePath,
    pub(crate) attr: Attr,
    pub(crate) local: PathBuf,
    /// What the fetch writes beneath (see `dest`): `local` is below it.
    pub(crate) root: std::sync::Arc<Path>,
    /// For a file new here: a local file that left the tree and looks like its old version
    /// (the same name elsewhere, `wasi.rs` for `wasi/mod.rs`), read in its place.
    pub(crate) basis: Option<PathBuf>,
}

impl FileJob {
    /// The file the new version is built against: the one at the destination, or the basis.
    pub(crate) fn old(&self) -> &Path {
        self.basis.as_deref().unwrap_or(&self.local)
    }

    /// The old version (see [`old`](Self::old)), opened beneath the root; `None` if it is no
    /// regular file.
    pub(crate) fn open_old(&self) -> io::Result<Option<File>> {
        dest::open_file(&self.root, self.old())
    }
}

/// What the walk leaves to fetch.
struct Plan {
    /// What the fetch writes beneath (see `dest`).
    root: std::sync::Arc<Path>,
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

/// The local copy a walk compares against: its tree digests and its directories' hashes; and
/// the ReadTree sent for it, if one was.
struct Local<'a> {
    path: &'a Path,
    trees: &'a LocalTrees,
    hashes: &'a [u64],
    started: Option<Started>,
}

/// Walks `remote`, whose attributes the caller already has, breadth first. With a server that
/// names the directories that differ (ReadTree), all their listings are asked for at once;
/// else every listing of a level is asked for before the first of them is waited on, so a
/// tree's listings cost one round trip per level.
fn walk<R: io::Read + Send, W: Write>(
    conn: &mut Connection<R, W>,
    remote: &WirePath,
    attr: &Attr,
    here: Local<'_>,
    src: &Sources<'_>,
    stats: &mut GetStats,
    plan: &mut Plan,
) -> Result<(), GetError> {
    let (local, trees) = (here.path, here.trees);
    if attr.kind != FileKind::Dir {
        return note(remote, attr, local, src, stats, plan);
    }
    let digests = attr.oid.is_some();
    let mut ahead = match here.started {
        Some(s) => finish_tree(conn, s, remote, local, digests, trees)?,
        None if conn.offers(ferry_proto::FEATURE_TREE_LISTINGS)?
            && here.hashes.len() <= FILTER_DIRS =>
        {
            ask_tree(conn, remote, local, digests, (trees, here.hashes))?
        }
        None => Asked::new(),
    };
    let first = match ahead.remove(&WirePath::default()) {
        Some(asked) => asked,
        None => ask_listing(conn, remote, digests, local, trees)?,
    };
    let mut queue = std::collections::VecDeque::from([(
        remote.clone(),
        WirePath::default(),
        attr.clone(),
        local.to_path_buf(),
        first,
    )]);
    while let Some((remote, rel, attr, local, asked)) = queue.pop_front() {
        make_dir(&plan.root, &local, src, stats)?;
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
                let rel = rel.join(&e.name)?;
                let asked = match ahead.remove(&rel) {
                    Some(asked) => asked,
                    None => ask_listing(conn, &child, e.attr.oid.is_some(), &dest, trees)?,
                };
                queue.push_back((child, rel, e.attr, dest, asked));
            } else {
                note(&child, &e.attr, &dest, src, stats, plan)?;
            }
            keep.insert(e.name);
        }
        if local.is_dir() {
            for e in fs::read_dir(&local).map_err(GetError::local("read directory", &local))? {
                let e = e.map_err(GetError::local("read directory", &local))?;
                // A partial file is not the tree's: a later fetch goes on from it.
                if keep.contains(e.file_name().as_bytes())
                    || crate::export::is_partial(e.file_name().as_bytes())
                {
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
    // Listings asked for that no listing led to (a server naming directories it does not
    // list): their replies are dropped as they come, not kept.
    for (_, (id, _)) in ahead {
        conn.forget(id);
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

/// Asks for the listing of `remote`: against the entries of `local` when both sides have tree
/// digests (only what differs travels), else whole. Returns the request and, for the former,
/// the local entries named.
pub(crate) fn ask_listing<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    remote: &WirePath,
    digests: bool,
    local: &Path,
    trees: &LocalTrees,
) -> Result<(u32, Option<Items>), GetError> {
    let (r, items) = listing_request(remote, digests, local, trees);
    Ok((conn.send(r)?, items))
}

/// The request of [`ask_listing`], and the local entries it names.
pub(crate) fn listing_request(
    remote: &WirePath,
    digests: bool,
    local: &Path,
    trees: &LocalTrees,
) -> (Request, Option<Items>) {
    let items = (digests && trees.contains_key(local))
        .then(|| local_items(local, trees).ok())
        .flatten()
        .filter(|items| !items.is_empty());
    let keys = match &items {
        Some(items) => items
            .iter()
            .map(|(n, i)| ferry_proto::entry_key(n, i))
            .collect(),
        None => vec![],
    };
    let r = Request::ReadDir {
        path: remote.clone(),
        keys,
    };
    (r, items)
}

/// A listing asked for by [`ask_listing`]: the entries that differ from the local ones, and
/// the local entries the server has too (exactly: checked against the directory's tree
/// digest, with a whole listing asked for when the check fails).
pub(crate) fn take_listing<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    remote: &WirePath,
    attr: &Attr,
    (id, items): (u32, Option<Items>),
) -> Result<(Vec<DirEntry>, Items), GetError> {
    let mut entries = vec![];
    let mut present = None;
    for r in conn.replies(id)? {
        match r {
            Reply::Entries {
                present: p,
                entries: es,
            } => {
                if items.is_some() {
                    present.get_or_insert(p);
                }
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
        keys: vec![],
    })? {
        match r {
            Reply::Entries { entries: es, .. } => entries.extend(es),
            other => return Err(ConnError::Unexpected(format!("{other:?}")).into()),
        }
    }
    Ok((entries, vec![]))
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
            root: plan.root.clone(),
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
fn make_dir(
    root: &Path,
    local: &Path,
    src: &Sources<'_>,
    stats: &mut GetStats,
) -> Result<(), GetError> {
    if src.dry_run {
        if fs::symlink_metadata(local).is_err() {
            stats.planned.push(format!("mkdir {}", local.display()));
        }
        return Ok(());
    }
    if local == root {
        return Ok(());
    }
    dest::make_dir(root, local).map_err(GetError::local("create directory", local))
}

/// Recreates symlinks as they are on the server, all targets asked for at once. A target is
/// stored, never followed.
fn fetch_links<R: io::Read, W: Write>(
    conn: &mut Connection<R, W>,
    root: &Path,
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
            dest::make_symlink(root, local, std::ffi::OsStr::from_bytes(&target))
                .map_err(GetError::local("create symlink", local))?;
            stats.files += 1;
        }
    }
    Ok(())
}
