//! Opening a store's index: its format checked, and what the store keeps in memory taken from
//! it.

use redb::{ReadableDatabase, ReadableTable};

use super::index::{db_err, CHUNKS, DAMAGED, META, OBJECTS, PACKS, TOMBSTONES};
use super::{index, LocalStore};
use crate::StoreError;

impl LocalStore {
    pub(super) fn init_index(&mut self, fresh: bool) -> Result<(), StoreError> {
        if !fresh && self.init_index_read()? {
            return Ok(());
        }
        let path = self.index_path.clone();
        let p = &path;
        let tx = self.db.begin_write().map_err(db_err(p))?;
        {
            let mut meta = tx.open_table(META).map_err(db_err(p))?;
            let format = meta
                .get("format")
                .map_err(db_err(p))?
                .map(|v| v.value().to_vec());
            match format {
                None => {
                    meta.insert("format", index::INDEX_FORMAT)
                        .map_err(db_err(p))?;
                    meta.insert("hash", &[self.alg.tag()][..])
                        .map_err(db_err(p))?;
                }
                Some(f) if f == index::INDEX_FORMAT => {}
                Some(f) => {
                    return Err(StoreError::Index {
                        path: p.clone(),
                        msg: format!("unknown index format {:?}", String::from_utf8_lossy(&f)),
                    })
                }
            }
            tx.open_table(CHUNKS).map_err(db_err(p))?;
            tx.open_table(OBJECTS).map_err(db_err(p))?;
            tx.open_table(TOMBSTONES).map_err(db_err(p))?;
            tx.open_table(PACKS).map_err(db_err(p))?;
            let damaged = tx.open_table(DAMAGED).map_err(db_err(p))?;
            self.take_state(&meta, &damaged)?;
        }
        tx.commit().map_err(db_err(p))?;
        if fresh {
            // A store whose index was lost: every pack is unindexed and recovery scans them all.
            tracing::info!(dir = %self.dir.display(), "new index; indexing existing packs");
        }
        Ok(())
    }

    /// [`init_index`](Self::init_index) for an index of this format whose tables all exist,
    /// reading only: its write transaction, committed at every open, cost the disk its syncs
    /// (a `ferry get` opens four indexes: 28 `fdatasync`s in all, each a few milliseconds on a
    /// laptop's disk). `false`: the index needs the writing path.
    fn init_index_read(&mut self) -> Result<bool, StoreError> {
        use redb::TableError;
        let path = self.index_path.clone();
        let p = &path;
        let tx = self.db.begin_read().map_err(db_err(p))?;
        let missing = |e: &TableError| matches!(e, TableError::TableDoesNotExist(_));
        let meta = match tx.open_table(META) {
            Ok(t) => t,
            Err(e) if missing(&e) => return Ok(false),
            Err(e) => return Err(db_err(p)(e)),
        };
        let format = meta.get("format").map_err(db_err(p))?;
        if format.is_none_or(|f| f.value() != index::INDEX_FORMAT) {
            return Ok(false);
        }
        let tables = [
            tx.open_table(CHUNKS).map(drop),
            tx.open_table(OBJECTS).map(drop),
            tx.open_table(TOMBSTONES).map(drop),
            tx.open_table(PACKS).map(drop),
        ];
        for t in tables {
            match t {
                Ok(()) => {}
                Err(e) if missing(&e) => return Ok(false),
                Err(e) => return Err(db_err(p)(e)),
            }
        }
        let damaged = match tx.open_table(DAMAGED) {
            Ok(t) => t,
            Err(e) if missing(&e) => return Ok(false),
            Err(e) => return Err(db_err(p)(e)),
        };
        self.take_state(&meta, &damaged)?;
        Ok(true)
    }

    /// Takes from the index what the store keeps in memory: the next object sequence number
    /// and the chunks recorded as damaged.
    fn take_state(
        &mut self,
        meta: &impl ReadableTable<&'static str, &'static [u8]>,
        damaged: &impl ReadableTable<&'static [u8; 16], &'static str>,
    ) -> Result<(), StoreError> {
        let p = &self.index_path;
        let st = self.state.get_mut().unwrap();
        if let Some(v) = meta.get("next_seq").map_err(db_err(p))? {
            let b: [u8; 8] = v.value().try_into().unwrap_or_default();
            st.next_seq = u64::from_le_bytes(b).max(1);
        }
        for r in damaged.iter().map_err(db_err(p))? {
            let (k, _) = r.map_err(db_err(p))?;
            st.damaged.insert(*k.value());
        }
        Ok(())
    }
}
