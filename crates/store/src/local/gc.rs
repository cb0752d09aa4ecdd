//! Verification and garbage collection of a local store.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;

use ferry_format::{Id, Oid, Recipe};

fn hex_prefix(k: &[u8; 16]) -> String {
    k.iter().map(|b| format!("{b:02x}")).collect()
}
use redb::{ReadableDatabase, ReadableTable};

use super::index::{ckey, db_err, Loc, ObjectEntry, CHUNKS, DAMAGED, PACKS, TOMBSTONES};
use super::pack::{encode_record, object_payload, Kind, PACK_HEADER_LEN, RECORD_HEADER_LEN};
use super::{pack_name, GcReport, LocalStore, PendingObject, State, TrimReport, VerifyReport};
use crate::{ChunkStore, StoreError};

impl LocalStore {
    /// Reads and verifies every chunk, in pack order, and checks that every recipe's chunks are
    /// present. `progress` is told the bytes of each chunk checked.
    pub fn verify(&self, mut progress: impl FnMut(u64)) -> Result<VerifyReport, StoreError> {
        self.flush()?;
        let p = &self.index_path;
        let mut locs: Vec<(Loc, [u8; 16])> = Vec::new();
        self.for_each_chunk(|k, l| locs.push((l, k)))?;
        let mut recipes = Vec::new();
        self.for_each_object(|oid, e| {
            recipes.push((oid, e.recipe));
            Ok(())
        })?;
        locs.sort_unstable_by_key(|(l, _)| (l.pack, l.offset));
        let mut rep = VerifyReport::default();
        let mut healed = vec![];
        let was_damaged = self.state.lock().unwrap().damaged.clone();
        // The full id each indexed chunk turned out to have (the index keys are prefixes).
        let mut full: HashMap<[u8; 16], Id> = HashMap::with_capacity(locs.len());
        for (loc, key) in &locs {
            let location = self.describe(*loc);
            match self.read_record(key, *loc) {
                Ok((id, _)) => {
                    full.insert(*key, id);
                    if was_damaged.contains(key) {
                        healed.push(*key);
                    }
                }
                Err((id, why)) => {
                    let why = format!("{location}: {why}");
                    self.state.lock().unwrap().damaged.insert(*key);
                    self.record_damage(key, &why);
                    let name = id.map_or_else(
                        || format!("prefix:{}", hex_prefix(key)),
                        |id| id.to_string(),
                    );
                    rep.damaged.push((name, why));
                }
            }
            rep.chunks_checked += 1;
            rep.bytes_checked += loc.raw_len as u64;
            progress(loc.raw_len as u64);
        }
        let present: HashSet<[u8; 16]> = locs.iter().map(|(_, k)| *k).collect();
        for (oid, enc) in recipes {
            // A recipe the index holds damaged is named, not the end of the check.
            let recipe = match Recipe::decode(&enc) {
                Ok(r) => r,
                Err(e) => {
                    rep.damaged.push((
                        oid.to_string(),
                        format!("its recipe in the index is unreadable ({e}); `ferry store rebuild` restores it from the packs"),
                    ));
                    continue;
                }
            };
            for c in recipe.chunks() {
                match full.get(&ckey(&c.id)) {
                    Some(id) if *id == c.id => {}
                    // Another chunk under its prefix: the recipe names an id that was altered.
                    Some(id) => rep.damaged.push((
                        oid.to_string(),
                        format!("its recipe names chunk {}, which the store does not hold ({id} shares its prefix): the recipe in the index is damaged; `ferry store rebuild` restores it from the packs", c.id),
                    )),
                    None if present.contains(&ckey(&c.id)) => {}
                    None => rep.missing.push((oid, c.id)),
                }
            }
        }
        rep.damaged.extend(self.unindexed()?);
        if !healed.is_empty() {
            let tx = self.db.begin_write().map_err(db_err(p))?;
            {
                let mut t = tx.open_table(DAMAGED).map_err(db_err(p))?;
                for id in &healed {
                    t.remove(id).map_err(db_err(p))?;
                }
            }
            tx.commit().map_err(db_err(p))?;
            let mut st = self.state.lock().unwrap();
            for id in &healed {
                st.damaged.remove(id);
            }
        }
        Ok(rep)
    }

    /// Drops chunks that no object names, then rewrites every pack whose live bytes fell below
    /// `min_live` (0.0–1.0) of its size and deletes it once the copies are durable.
    pub fn gc(&self, min_live: f64) -> Result<GcReport, StoreError> {
        let mut st = self.state.lock().unwrap();
        self.flush_locked(&mut st)?;
        let mut rep = GcReport::default();

        // 1. Live set: every chunk some recipe names.
        let live = self.live_chunks()?;
        let mut records = self.records_by_pack()?;

        // 2. Drop dead chunks from the index; tally what stays in each pack.
        let mut live_in: BTreeMap<u32, Vec<([u8; 16], Loc)>> = BTreeMap::new();
        let (n, bytes) = self.drop_chunks(|k, loc| {
            if live.contains(k) {
                live_in.entry(loc.pack).or_default().push((*k, loc));
                false
            } else {
                true
            }
        })?;
        rep.chunks_removed = n;
        rep.chunk_bytes_removed = bytes;

        // 3. Compact sparse packs into a fresh one.
        // Appends below go to a new pack, never into one being compacted.
        self.close_writer(&mut st)?;
        for (num, size, _) in self.live_packs()? {
            rep.pack_bytes_before += size;
            let chunks = live_in.remove(&num).unwrap_or_default();
            let live_bytes: u64 = chunks
                .iter()
                .map(|(_, l)| RECORD_HEADER_LEN as u64 + l.stored_len as u64)
                .sum();
            let body = size.saturating_sub(PACK_HEADER_LEN);
            if body > 0 && (live_bytes as f64) >= min_live * body as f64 {
                rep.pack_bytes_after += size;
                continue;
            }
            self.move_pack(&mut st, num, chunks, records.remove(&num))?;
            rep.packs_rewritten += 1;
        }
        self.delete_retired(&mut st)?;
        if let Some(w) = &st.writer {
            rep.pack_bytes_after += w.len;
        }
        Ok(rep)
    }

    /// Evicts whole packs, least recently used first, until the packs take at most `limit`
    /// bytes: the bound of a cache. A pack's use time is its modification time, refreshed
    /// (at most once a minute) whenever one of its chunks is read or added again. Chunks that
    /// objects name, and the object records, are copied forward out of an evicted pack; the
    /// other chunks are forgotten.
    pub fn trim(&self, limit: u64) -> Result<TrimReport, StoreError> {
        let mut st = self.state.lock().unwrap();
        self.flush_locked(&mut st)?;
        let mut rep = TrimReport::default();
        let mut packs = self.live_packs()?;
        rep.pack_bytes_before = packs.iter().map(|(_, size, _)| size).sum();
        rep.pack_bytes_after = rep.pack_bytes_before;
        if rep.pack_bytes_before <= limit {
            return Ok(rep);
        }
        packs.sort_by_key(|&(num, _, used)| (used, num));
        let mut victims = HashSet::new();
        for (num, size, _) in packs {
            if rep.pack_bytes_after <= limit {
                break;
            }
            victims.insert(num);
            rep.pack_bytes_after -= size;
        }
        let live = self.live_chunks()?;
        let mut records = self.records_by_pack()?;
        let mut keep: HashMap<u32, Vec<([u8; 16], Loc)>> = HashMap::new();
        let (n, bytes) = self.drop_chunks(|k, loc| {
            if !victims.contains(&loc.pack) {
                return false;
            }
            if live.contains(k) {
                keep.entry(loc.pack).or_default().push((*k, loc));
                return false;
            }
            true
        })?;
        rep.chunks_removed = n;
        rep.chunk_bytes_removed = bytes;
        self.close_writer(&mut st)?;
        for num in victims {
            let chunks = keep.remove(&num).unwrap_or_default();
            self.move_pack(&mut st, num, chunks, records.remove(&num))?;
            rep.packs_evicted += 1;
        }
        self.delete_retired(&mut st)?;
        if let Some(w) = &st.writer {
            rep.pack_bytes_after += w.len;
        }
        Ok(rep)
    }

    /// Every chunk some object's recipe names.
    fn live_chunks(&self) -> Result<HashSet<[u8; 16]>, StoreError> {
        let mut live = HashSet::new();
        self.for_each_object(|_, e| {
            for c in Recipe::decode(&e.recipe)?.chunks() {
                live.insert(ckey(&c.id));
            }
            Ok(())
        })?;
        Ok(live)
    }

    /// Packs in use: number, size in bytes and last use.
    pub(super) fn live_packs(&self) -> Result<Vec<(u32, u64, std::time::SystemTime)>, StoreError> {
        super::index::guard(&self.index_path, || {
            let p = &self.index_path;
            let tx = self.db.begin_read().map_err(db_err(p))?;
            let t = tx.open_table(PACKS).map_err(db_err(p))?;
            let mut out = vec![];
            for r in t.iter().map_err(db_err(p))? {
                let (k, v) = r.map_err(db_err(p))?;
                if v.value().1 != 0 {
                    continue; // retired
                }
                let num = k.value();
                let meta = fs::metadata(self.packs_dir.join(pack_name(num))).ok();
                out.push((
                    num,
                    meta.as_ref().map_or(0, |m| m.len()),
                    meta.and_then(|m| m.modified().ok())
                        .unwrap_or(std::time::UNIX_EPOCH),
                ));
            }
            Ok(out)
        })
    }

    /// The object records and tombstones each pack holds.
    fn records_by_pack(&self) -> Result<HashMap<u32, PackRecords>, StoreError> {
        super::index::guard(&self.index_path, || {
            let p = &self.index_path;
            let mut out: HashMap<u32, PackRecords> = HashMap::new();
            self.for_each_object(|oid, e| {
                out.entry(e.pack).or_default().objects.push((oid, e));
                Ok(())
            })?;
            let tx = self.db.begin_read().map_err(db_err(p))?;
            for r in tx
                .open_table(TOMBSTONES)
                .map_err(db_err(p))?
                .iter()
                .map_err(db_err(p))?
            {
                let (k, v) = r.map_err(db_err(p))?;
                let (seq, pack) = v.value();
                out.entry(pack)
                    .or_default()
                    .tombstones
                    .push((Oid(Id::from_parts(self.alg, *k.value())), seq));
            }
            Ok(out)
        })
    }

    /// Removes from the index every chunk `dead` picks; returns how many and their bytes.
    fn drop_chunks(
        &self,
        mut dead: impl FnMut(&[u8; 16], Loc) -> bool,
    ) -> Result<(u64, u64), StoreError> {
        let p = &self.index_path;
        let (mut n, mut bytes) = (0, 0);
        let tx = self.db.begin_write().map_err(db_err(p))?;
        {
            let mut chunks = tx.open_table(CHUNKS).map_err(db_err(p))?;
            let mut damaged = tx.open_table(DAMAGED).map_err(db_err(p))?;
            let mut gone = vec![];
            for r in chunks.iter().map_err(db_err(p))? {
                let (k, v) = r.map_err(db_err(p))?;
                let loc = Loc::decode(v.value());
                if dead(k.value(), loc) {
                    gone.push(*k.value());
                    n += 1;
                    bytes += loc.raw_len as u64;
                }
            }
            for k in &gone {
                chunks.remove(k).map_err(db_err(p))?;
                damaged.remove(k).map_err(db_err(p))?;
            }
        }
        tx.commit().map_err(db_err(p))?;
        self.forget_snapshot();
        Ok((n, bytes))
    }

    /// Copies `chunks` and the pack's object records forward into the current pack and marks
    /// pack `num` for deletion once the copies are durable.
    fn move_pack(
        &self,
        st: &mut State,
        num: u32,
        chunks: Vec<([u8; 16], Loc)>,
        records: Option<PackRecords>,
    ) -> Result<(), StoreError> {
        for (key, loc) in chunks {
            // The state lock is held: reading must not take it again.
            match self.read_record_locked(st, &key, loc) {
                Ok((id, data)) => {
                    let rec = encode_record(Kind::Chunk, id, &data, self.opts.zstd_level);
                    let (pack, offset) = self.append(st, &rec)?;
                    st.pending.insert(
                        id,
                        Loc {
                            pack,
                            offset,
                            stored_len: (rec.len() - RECORD_HEADER_LEN) as u32,
                            raw_len: loc.raw_len,
                        },
                    );
                }
                Err((_, why)) => {
                    // Copying damage forward would hide it; stop with the pack intact.
                    let why = format!("{}: {why}", self.describe(loc));
                    st.damaged.insert(key);
                    self.record_damage(&key, &why);
                    return Err(StoreError::Damaged {
                        what: format!("chunk with id prefix {}", hex_prefix(&key)),
                        why: format!("{why}; compaction stopped (add the original data again, or remove the objects that use it)"),
                    });
                }
            }
        }
        let records = records.unwrap_or_default();
        for (oid, e) in records.objects {
            let rec = encode_record(
                Kind::Object,
                oid.id(),
                &object_payload(e.seq, Some(&e.recipe)),
                self.opts.zstd_level,
            );
            let (pack, _) = self.append(st, &rec)?;
            st.pending_objects
                .push(PendingObject::Put(oid, ObjectEntry { pack, ..e }));
        }
        for (oid, seq) in records.tombstones {
            let rec = encode_record(Kind::Tombstone, oid.id(), &object_payload(seq, None), 0);
            let (pack, _) = self.append(st, &rec)?;
            st.pending_objects
                .push(PendingObject::Remove(oid, seq, pack));
        }
        st.retire.push(num);
        Ok(())
    }

    /// Makes the copies and the index durable, then deletes the packs marked for retirement.
    fn delete_retired(&self, st: &mut State) -> Result<(), StoreError> {
        let p = &self.index_path;
        let retired = st.retire.clone();
        self.flush_locked(st)?;
        {
            let _g = self.packs_lock.write().unwrap();
            let mut readers = self.readers.lock().unwrap();
            for num in &retired {
                readers.remove(num);
                let path = self.packs_dir.join(pack_name(*num));
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(StoreError::io("delete", path)(e)),
                }
            }
        }
        let tx = self.db.begin_write().map_err(db_err(p))?;
        {
            let mut t = tx.open_table(PACKS).map_err(db_err(p))?;
            for num in &retired {
                t.remove(*num).map_err(db_err(p))?;
            }
        }
        tx.commit().map_err(db_err(p))?;
        Ok(())
    }
}

#[derive(Default)]
struct PackRecords {
    objects: Vec<(Oid, ObjectEntry)>,
    tombstones: Vec<(Oid, u64)>,
}
