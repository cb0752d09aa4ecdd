//! Files and trees here as the protocol sees them: a file's chunks (a source, and the recipe
//! of the old version the server sends changes against), and tree digests.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use ferry_chunk::{ChunkReader, ChunkerSpec};
use ferry_format::{ChunkRef, HashAlg, Id};
use ferry_proto::{Attr, FileKind, TreeItem};

#[derive(Default)]
pub(crate) struct LocalIndex {
    /// Its chunks in order: the recipe of the old version, whose pages the server can refer to.
    pub(crate) order: Vec<ChunkRef>,
    /// id → (offset, length): hints, verified before use.
    pub(crate) at: HashMap<Id, (u64, u32)>,
}

/// Chunks an old version (opened by `FileJob::open_old`: `None` if there is none) as a source.
pub(crate) fn index_local(
    f: io::Result<Option<fs::File>>,
    spec: &ChunkerSpec,
    alg: HashAlg,
) -> io::Result<LocalIndex> {
    let mut map = LocalIndex::default();
    let Some(f) = f? else {
        return Ok(map);
    };
    let mut r = ChunkReader::new(f, spec.build());
    while let Some(c) = r.next_chunk()? {
        let id = Id::hash(alg, c.data);
        let len = c.data.len() as u32;
        map.order.push(ChunkRef { id, len });
        map.at.insert(id, (c.offset, len));
    }
    Ok(map)
}

pub(crate) type LocalTrees = HashMap<PathBuf, ([u8; 32], u64)>;

/// `ferry_proto::tree_digest` of a local directory `dir` (`root` or below it), remembering
/// every subtree's in `trees`, and adding the hash (`ferry_proto::entry_hash`, placed relative
/// to `root`) of every directory below `dir` to `hashes`. Never follows a symlink.
pub(crate) fn local_tree_hashing(
    root: &Path,
    dir: &Path,
    trees: &mut LocalTrees,
    hashes: &mut Vec<u64>,
) -> io::Result<[u8; 32]> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            local_tree_hashing(root, &e.path(), trees, hashes)?;
        }
    }
    let mut items = local_items(dir, trees)?;
    let rel = dir.strip_prefix(root).unwrap_or(dir).as_os_str().as_bytes();
    hashes.extend(
        items
            .iter()
            .filter(|(_, i)| matches!(i, TreeItem::Dir { .. }))
            .map(|(n, i)| ferry_proto::entry_hash(rel, n, i)),
    );
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
pub(crate) fn local_items(dir: &Path, trees: &LocalTrees) -> io::Result<Items> {
    use std::os::unix::ffi::OsStringExt;
    use std::os::unix::fs::MetadataExt;
    let mut items = vec![];
    for e in fs::read_dir(dir)? {
        let e = e?;
        if crate::export::is_partial(e.file_name().as_bytes()) {
            continue;
        }
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
pub(crate) fn remote_item(attr: &Attr) -> Option<TreeItem> {
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
pub(crate) type Items = Vec<(Vec<u8>, TreeItem)>;

/// The number of files below `local` if it is a directory the same as the remote one `attr`
/// describes: same tree digest, mode and modification time.
pub(crate) fn same_tree(local: &Path, attr: &Attr, trees: &LocalTrees) -> Option<u64> {
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

/// rsync's quick check: same size, modification time and mode means unchanged.
pub(crate) fn unchanged(local: &Path, attr: &Attr) -> bool {
    use std::os::unix::fs::MetadataExt;
    fs::symlink_metadata(local).is_ok_and(|m| {
        m.is_file()
            && m.len() == attr.size
            && m.mtime() * 1_000_000_000 + m.mtime_nsec() == attr.mtime_ns
            && m.mode() & 0o7777 == attr.mode & 0o7777
    })
}
