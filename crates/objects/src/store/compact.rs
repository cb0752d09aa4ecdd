//! Compaction: objects moved down into holes below them (never overlapping their old place,
//! so a crash leaves each where its committed inode says), and the files' free tails cut.

use super::{data_name, dberr, io, ObjectStore, INODES};
use crate::inode::Inode;
use crate::ObjectsError;

impl ObjectStore {
    /// Moves objects down into holes, one at a time, until none fits lower or `budget` bytes
    /// have moved; then gives the files' free tails back. Returns the bytes moved.
    pub fn compact(&self, budget: u64) -> Result<u64, ObjectsError> {
        let mut moved = 0;
        while moved < budget {
            let Some(n) = self.compact_one()? else { break };
            moved += n;
        }
        self.trim_files()?;
        Ok(moved)
    }

    fn compact_one(&self) -> Result<Option<u64>, ObjectsError> {
        let _moving = self.mover.lock().expect("mover");
        let plan = {
            let mut state = self.state.write().expect("state");
            let mut by_place: Vec<(u64, Inode)> = state
                .inodes
                .iter()
                .filter(|(_, i)| i.extent.len > 0)
                .map(|(n, i)| (*n, i.clone()))
                .collect();
            by_place.sort_by_key(|(_, i)| std::cmp::Reverse(i.extent));
            let found = by_place
                .into_iter()
                .find_map(|(n, i)| Some((n, i.clone(), state.space.lower_fit(&i.extent)?)));
            if let Some((_, _, to)) = &found {
                state.space.take(to);
            }
            found
        };
        let Some((number, inode, to)) = plan else {
            return Ok(None);
        };
        let r = (|| {
            let mut buf = vec![0; inode.extent.len.min(4 << 20) as usize];
            let from = self.file_for(inode.extent.file)?;
            let dest = self.file_for(to.file)?;
            let mut at = 0;
            while at < inode.extent.len {
                let n = (inode.extent.len - at).min(buf.len() as u64) as usize;
                from.read_at(&mut buf[..n], inode.extent.offset + at)
                    .map_err(io("read", data_name(inode.extent.file)))?;
                dest.write_at(&buf[..n], to.offset + at)
                    .map_err(io("write", data_name(to.file)))?;
                at += n as u64;
            }
            dest.sync().map_err(io("sync", data_name(to.file)))?;
            let moved = Inode {
                extent: to,
                ..inode.clone()
            };
            let tx = self.db.begin_write().map_err(dberr)?;
            tx.open_table(INODES)
                .map_err(dberr)?
                .insert(number, &moved.encode()[..])
                .map_err(dberr)?;
            tx.commit().map_err(dberr)?;
            Ok(moved)
        })();
        let mut state = self.state.write().expect("state");
        match r {
            Ok(moved) => {
                state.inodes.insert(number, moved);
                state.space.free(inode.extent);
                Ok(Some(inode.extent.len))
            }
            Err(e) => {
                state.space.free(to);
                Err(e)
            }
        }
    }

    /// Cuts each data file to the end of its last object.
    pub(super) fn trim_files(&self) -> Result<(), ObjectsError> {
        let state = self.state.write().expect("state");
        let files = self.files.read().expect("files");
        for (n, f) in files.iter().enumerate() {
            let end = state.space.end(n as u32);
            let len = f.len().map_err(io("stat", data_name(n as u32)))?;
            if len > end {
                f.set_len(end)
                    .and_then(|_| f.sync())
                    .map_err(io("truncate", data_name(n as u32)))?;
            }
        }
        Ok(())
    }
}
