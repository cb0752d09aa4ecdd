//! The whole export recorded in the chunk index at once (`ferry serve --stdio --index`): a
//! lookaside provider reached over ssh is asked for chunks by id, and a chunk is found by id
//! only in a file the index has seen. Files whose identity the index already holds are not read
//! again, so a second pass costs a walk of the tree.

use std::io;

use ferry_format::chunk_object;
use ferry_proto::{FileKind, WirePath};

use super::{stamp, Server};
use crate::export::attr_of;

/// What [`Server::index_export`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Regular files found.
    pub files: u64,
    /// Of those, the files read and cut (new or changed since last recorded).
    pub cut: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Files or directories that could not be read (skipped, and said so in the log).
    pub unreadable: u64,
}

impl Server {
    /// Records every regular file of the export (never through a symlink, never the trash) in
    /// the chunk index this server was given (`with_index`); without one, does nothing.
    pub fn index_export(&mut self) -> io::Result<IndexStats> {
        let mut stats = IndexStats::default();
        let Some(index) = self.index.clone() else {
            return Ok(stats);
        };
        let mut dirs = vec![WirePath::default()];
        while let Some(dir) = dirs.pop() {
            let entries = match self.export.read_dir(&dir) {
                Ok(e) => e,
                Err(e) => {
                    tracing::info!("index: cannot list {dir:?}: {e}");
                    stats.unreadable += 1;
                    continue;
                }
            };
            for (name, attr) in entries {
                let Ok(path) = dir.join(&name) else {
                    continue;
                };
                match attr.kind {
                    FileKind::Dir => dirs.push(path),
                    FileKind::File => {
                        stats.files += 1;
                        match self.index_file(&index, &path) {
                            Ok(Some(bytes)) => {
                                stats.cut += 1;
                                stats.bytes += bytes;
                            }
                            Ok(None) => {}
                            Err(e) => {
                                tracing::info!("index: cannot read {path:?}: {e}");
                                stats.unreadable += 1;
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        index
            .sync()
            .map_err(|e| io::Error::other(format!("the chunk index: {e}")))?;
        Ok(stats)
    }

    /// Records the file at `path` unless the index holds it as it is; its bytes when read.
    fn index_file(
        &self,
        index: &ferry_store::PathIndex,
        path: &WirePath,
    ) -> io::Result<Option<u64>> {
        let file = self.export.open_file(path)?;
        let (attr, fid) = attr_of(&rustix::fs::fstat(&file)?);
        if self.indexed(path, &fid).is_some() {
            return Ok(None);
        }
        let (recipe, oid) = chunk_object(&file, &self.opts.chunker, self.opts.hash, |_, _| {
            Ok::<_, io::Error>(())
        })?;
        // Changed while it was read: neither version's recipe; the next pass records it.
        if attr_of(&rustix::fs::fstat(&file)?).1 != fid {
            return Ok(None);
        }
        index
            .record(path.as_bytes(), &stamp(&fid), &recipe, &oid)
            .map_err(|e| io::Error::other(format!("the chunk index: {e}")))?;
        Ok(Some(attr.size))
    }
}
