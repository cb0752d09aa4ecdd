//! The trash: a replaced version is hard-linked into `.ferry-trash` (no copy), its chunks'
//! hints pointed there, so a later update can be built against it; the oldest go past a bound
//! in bytes and entries.

use std::io;
use std::os::fd::OwnedFd;

use ferry_proto::WirePath;

use super::Server;
use crate::export::{os, stat_at};

impl Server {
    /// Hard-links `name` in `dir` into the trash and points the hints of its chunks there, then
    /// trims the trash to its bound. Best effort: a trash that cannot be kept costs only bytes.
    pub(super) fn keep_in_trash(&mut self, dir: &OwnedFd, name: &[u8]) {
        if self.opts.trash_bytes == 0 {
            return;
        }
        let r = (|| -> io::Result<()> {
            let Some((attr, fid)) = stat_at(dir, name)? else {
                return Ok(());
            };
            // An empty file is not worth keeping (a create commits one before every first
            // write-back through the mount).
            if attr.size == 0 {
                return Ok(());
            }
            let trash = self.export.trash_dir()?;
            let n = self.uploads.next();
            let entry = format!(
                "{}-{}-{}-{:016x}-{n}",
                fid.ino,
                fid.mtime_ns,
                std::process::id(),
                self.uploads.tag
            );
            rustix::fs::linkat(
                dir,
                os(name),
                &trash,
                entry.as_str(),
                rustix::fs::AtFlags::empty(),
            )?;
            if let Some((recipe, oid)) = self.recipes.get(&fid).cloned() {
                let path = WirePath::new(format!("{}/{entry}", crate::export::TRASH).into_bytes())
                    .map_err(io::Error::other)?;
                // Linked, it has a new ctime: that is the identity it is found by.
                match stat_at(&trash, entry.as_bytes())? {
                    Some((_, now)) => self.remember(&path, now, recipe, oid),
                    None => self.hint_all(&path, &recipe),
                }
            }
            // Trimmed at a session's first entry, then only once it has added a sixteenth of
            // either bound: a commit costs a scan of the trash once in many, not each time.
            let (limit, max) = (self.opts.trash_bytes, self.opts.trash_entries);
            let (bytes, entries) = self.uploads.trashed.get_or_insert((limit, max));
            *bytes += attr.size;
            *entries += 1;
            if *bytes >= limit / 16 || *entries >= max / 16 {
                self.uploads.trashed = Some((0, 0));
                trim_trash(&trash, limit, max)?;
            }
            Ok(())
        })();
        if let Err(e) = r {
            tracing::warn!("keeping the replaced version in the trash: {e}");
        }
    }
}

/// Deletes the oldest trash entries until the rest fit in `limit` bytes and `max` entries.
fn trim_trash(trash: &OwnedFd, limit: u64, max: usize) -> io::Result<()> {
    let mut entries = vec![];
    for e in rustix::fs::Dir::read_from(trash)? {
        let e = e?;
        let name = e.file_name().to_owned();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        let st = rustix::fs::statat(trash, &*name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?;
        entries.push((st.st_ctime, st.st_size as u64, name));
    }
    entries.sort();
    let mut total: u64 = entries.iter().map(|e| e.1).sum();
    let mut left = entries.len();
    for (_, size, name) in entries {
        if total <= limit && left <= max {
            break;
        }
        rustix::fs::unlinkat(trash, &*name, rustix::fs::AtFlags::empty())?;
        total -= size;
        left -= 1;
    }
    Ok(())
}
