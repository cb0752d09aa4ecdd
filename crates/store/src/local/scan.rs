//! Reading packs front to back: crash recovery on open, and rebuilding a lost index.

use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use ferry_format::{Oid, Recipe};
use redb::{ReadableTable, Table};

use super::index::{ckey, db_err, Loc, ObjectEntry, CHUNKS, META, OBJECTS, PACKS, TOMBSTONES};
use super::pack::{self, Kind, RecordHeader, PACK_HEADER, PACK_HEADER_LEN, RECORD_HEADER_LEN};
use super::{pack_name, LocalStore, Writer};
use crate::StoreError;

/// What recovery or a rebuild found in the packs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RebuildReport {
    /// Packs read (only those with unindexed bytes, on a normal open).
    pub packs_scanned: u64,
    /// Whole, valid records indexed.
    pub records: u64,
    /// Records whose payload failed verification (skipped).
    pub damaged_records: u64,
    /// Bytes of torn crash leftovers cut off pack tails.
    pub torn_bytes_truncated: u64,
    /// Bytes after damage that could not be parsed (left in place, not indexed).
    pub unreadable_bytes: u64,
}

/// Applies an object put (`entry`) or removal (`None`) of sequence number `seq` unless the index
/// already holds a newer one. Equal sequence numbers overwrite (a record moved by compaction).
pub(crate) fn apply_object(
    objects: &mut Table<&[u8; 32], &[u8]>,
    tombs: &mut Table<&[u8; 32], (u64, u32)>,
    key: &[u8; 32],
    seq: u64,
    pack: u32,
    entry: Option<&ObjectEntry>,
) -> Result<(), redb::Error> {
    let cur_obj = objects
        .get(key)?
        .map(|v| u64::from_le_bytes(v.value()[..8].try_into().unwrap_or_default()))
        .unwrap_or(0);
    let cur_tomb = tombs.get(key)?.map(|v| v.value().0).unwrap_or(0);
    if seq < cur_obj.max(cur_tomb) {
        return Ok(());
    }
    match entry {
        Some(e) => {
            objects.insert(key, &e.encode()[..])?;
            tombs.remove(key)?;
        }
        None => {
            objects.remove(key)?;
            tombs.insert(key, (seq, pack))?;
        }
    }
    Ok(())
}

pub(super) struct ScanEnd {
    /// Offset just past the last whole record read.
    end: u64,
    /// Why scanning stopped before the end of the file, if it did.
    stopped: Option<String>,
}

/// Reads records of the pack at `path` from `from` on, calling `f` for each valid one.
/// With `skip_damage` (a rebuild), damage costs only what it hit: a record whose payload fails
/// verification is skipped, and after a header that cannot be read the scan resyncs on the
/// next offset holding a whole valid record (header checksum and payload hash), counting the
/// bytes between as unreadable. Without it (a crash tail) the first bad record ends the scan.
pub(super) fn scan_pack(
    path: &Path,
    from: u64,
    skip_damage: bool,
    report: &mut RebuildReport,
    mut f: impl FnMut(u64, &RecordHeader, Vec<u8>) -> Result<(), StoreError>,
) -> Result<ScanEnd, StoreError> {
    let file = File::open(path).map_err(StoreError::io("open", path))?;
    let len = file.metadata().map_err(StoreError::io("stat", path))?.len();
    let mut r = BufReader::with_capacity(1 << 20, file);
    r.seek(SeekFrom::Start(from))
        .map_err(StoreError::io("seek", path))?;
    let mut off = from;
    // Just past the last whole record (or where the scan began).
    let mut end = from;
    let mut stopped = None;
    let mut payload = Vec::new();
    while off < len {
        let bad = match next_record(&mut r, off, len, &mut payload)
            .map_err(StoreError::io("read", path))?
        {
            Ok(h) => match pack::decode_payload(&h, &payload) {
                Ok(raw) => {
                    report.records += 1;
                    f(off, &h, raw)?;
                    off += h.record_len();
                    end = off;
                    stopped = None;
                    continue;
                }
                Err(why) if skip_damage => {
                    report.damaged_records += 1;
                    tracing::error!(
                        "{} offset {off}: skipping damaged record {}: {why}",
                        path.display(),
                        h.id
                    );
                    off += h.record_len();
                    end = off;
                    continue;
                }
                Err(why) => why,
            },
            Err(why) => why,
        };
        if !skip_damage {
            return Ok(ScanEnd {
                end: off,
                stopped: Some(bad),
            });
        }
        let next = resync(r.get_ref(), off + 1, len).map_err(StoreError::io("read", path))?;
        let skipped = next.unwrap_or(len) - off;
        report.unreadable_bytes += skipped;
        tracing::error!(
            "{}: {skipped} bytes at offset {off} cannot be read ({bad}){}",
            path.display(),
            if next.is_some() {
                "; the records after them are"
            } else {
                ""
            }
        );
        stopped = Some(bad);
        match next {
            Some(q) => {
                r.seek(SeekFrom::Start(q))
                    .map_err(StoreError::io("seek", path))?;
                off = q;
            }
            None => break,
        }
    }
    Ok(ScanEnd { end, stopped })
}

/// Reads the record at `off` (its payload into `payload`): its header, or why there is none.
fn next_record(
    r: &mut impl Read,
    off: u64,
    len: u64,
    payload: &mut Vec<u8>,
) -> std::io::Result<Result<RecordHeader, String>> {
    if len - off < RECORD_HEADER_LEN as u64 {
        return Ok(Err("torn record header".into()));
    }
    let mut hb = [0u8; RECORD_HEADER_LEN];
    r.read_exact(&mut hb)?;
    let h = match RecordHeader::decode(&hb) {
        Ok(h) => h,
        Err(why) => return Ok(Err(why)),
    };
    if len - off - (RECORD_HEADER_LEN as u64) < h.stored_len as u64 {
        return Ok(Err("torn record payload".into()));
    }
    payload.resize(h.stored_len as usize, 0);
    r.read_exact(payload)?;
    Ok(Ok(h))
}

/// The first offset at or after `from` where a whole, valid record starts (its header's
/// checksum and its payload's hash both hold), if any.
fn resync(file: &File, from: u64, len: u64) -> std::io::Result<Option<u64>> {
    use std::os::unix::fs::FileExt;
    const WINDOW: usize = 1 << 20;
    let mut buf = vec![0u8; WINDOW + RECORD_HEADER_LEN];
    let mut payload = vec![];
    let mut at = from;
    while at + RECORD_HEADER_LEN as u64 <= len {
        let n = ((len - at) as usize).min(buf.len());
        file.read_exact_at(&mut buf[..n], at)?;
        for i in 0..=(n - RECORD_HEADER_LEN).min(WINDOW - 1) {
            let hb: &[u8; RECORD_HEADER_LEN] =
                buf[i..i + RECORD_HEADER_LEN].try_into().expect("sized");
            let Ok(h) = RecordHeader::decode(hb) else {
                continue;
            };
            let q = at + i as u64;
            if q + h.record_len() > len {
                continue;
            }
            payload.resize(h.stored_len as usize, 0);
            file.read_exact_at(&mut payload, q + RECORD_HEADER_LEN as u64)?;
            if pack::decode_payload(&h, &payload).is_ok() {
                return Ok(Some(q));
            }
        }
        at += WINDOW as u64;
    }
    Ok(None)
}

impl LocalStore {
    /// Moves the index aside and indexes every pack from scratch. For a lost or damaged index.
    pub fn rebuild(
        dir: impl AsRef<Path>,
        opts: super::Options,
    ) -> Result<(LocalStore, RebuildReport), StoreError> {
        let dir = dir.as_ref();
        super::read_marker(dir)?;
        {
            let _lock = super::lock_store(dir, true)?;
            let index = dir.join("index.redb");
            if index.exists() {
                let old = dir.join("index.redb.old");
                fs::rename(&index, &old).map_err(StoreError::io("rename", &index))?;
                tracing::info!("moved the old index to {}", old.display());
            }
        }
        let store = LocalStore::open(dir, opts)?;
        let report = store.recovery.clone();
        Ok((store, report))
    }

    /// Brings the index up to date with the packs after a crash (or a lost index), deletes
    /// packs retired by a finished compaction, and resumes the newest pack for appending.
    pub(super) fn recover(&mut self) -> Result<(), StoreError> {
        let p = self.index_path.clone();
        let mut nums: Vec<u32> = fs::read_dir(&self.packs_dir)
            .map_err(StoreError::io("read directory", &self.packs_dir))?
            .filter_map(|e| {
                e.ok()?
                    .file_name()
                    .to_str()?
                    .strip_suffix(".pack")?
                    .parse()
                    .ok()
            })
            .collect();
        nums.sort_unstable();
        let mut report = super::RebuildReport::default();
        let tx = self.db.begin_write().map_err(db_err(&p))?;
        let mut next_seq = self.state.get_mut().unwrap().next_seq;
        // Whether anything was found to record: a store closed cleanly has nothing, and its
        // transaction is dropped, not committed (which syncs the disk).
        let mut changed = false;
        let mut max_num = 0;
        let mut resumable = None;
        {
            let mut packs = tx.open_table(PACKS).map_err(db_err(&p))?;
            let mut chunks = tx.open_table(CHUNKS).map_err(db_err(&p))?;
            let mut objects = tx.open_table(OBJECTS).map_err(db_err(&p))?;
            let mut tombs = tx.open_table(TOMBSTONES).map_err(db_err(&p))?;
            let known: Vec<(u32, (u64, u8))> = packs
                .iter()
                .map_err(db_err(&p))?
                .map(|r| r.map(|(k, v)| (k.value(), v.value())))
                .collect::<Result<_, _>>()
                .map_err(db_err(&p))?;
            for &(num, (_, retired)) in &known {
                max_num = max_num.max(num);
                if retired == 1 {
                    changed = true;
                    let path = self.packs_dir.join(pack_name(num));
                    match fs::remove_file(&path) {
                        Ok(()) => tracing::info!("deleted retired pack {}", path.display()),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(StoreError::io("delete", path)(e)),
                    }
                    packs.remove(num).map_err(db_err(&p))?;
                } else if !nums.contains(&num) {
                    tracing::error!(
                        "pack {} is missing: its chunks are lost (run `ferry store verify`)",
                        self.packs_dir.join(pack_name(num)).display()
                    );
                }
            }
            for &num in &nums {
                max_num = max_num.max(num);
                let entry = known.iter().find(|(n, _)| *n == num).map(|(_, v)| *v);
                if entry.is_some_and(|(_, r)| r == 1) {
                    continue;
                }
                let committed = entry.map(|(c, _)| c).unwrap_or(0);
                let path = self.packs_dir.join(pack_name(num));
                let file_len = fs::metadata(&path)
                    .map_err(StoreError::io("stat", &path))?
                    .len();
                if committed == 0 {
                    let mut head = [0u8; PACK_HEADER_LEN as usize];
                    let ok = File::open(&path)
                        .and_then(|mut f| f.read_exact(&mut head))
                        .is_ok_and(|_| head == PACK_HEADER);
                    if !ok {
                        if file_len <= PACK_HEADER_LEN {
                            // Created, then a crash before anything reached it.
                            fs::remove_file(&path).map_err(StoreError::io("delete", &path))?;
                        } else {
                            report.unreadable_bytes += file_len;
                            tracing::error!(
                                "{} has no valid pack header; left alone",
                                path.display()
                            );
                        }
                        continue;
                    }
                }
                if file_len < committed {
                    tracing::error!(
                        "{} is shorter ({file_len} bytes) than recorded ({committed}); chunks past its end are lost",
                        path.display()
                    );
                    continue;
                }
                let from = committed.max(PACK_HEADER_LEN);
                if file_len > from || committed == 0 {
                    report.packs_scanned += 1;
                    changed = true;
                    // A tail past a committed length is a crash's leftover: stop at the first bad
                    // record and cut it off. A pack never indexed is read whole, skipping damage.
                    let crash_tail = committed != 0;
                    // Damage is skipped either way: only unreadable bytes after the last whole
                    // record (no valid record follows them) are a torn tail to cut. A committed
                    // length that lies (a damaged index) must never cut whole records off.
                    let unreadable_before = report.unreadable_bytes;
                    let end = scan_pack(&path, from, true, &mut report, |off, h, raw| {
                        let key = h.id.digest();
                        match h.kind {
                            Kind::Chunk => {
                                if h.id.alg() != self.alg {
                                    return Ok(());
                                }
                                if chunks.get(&ckey(&h.id)).map_err(db_err(&p))?.is_none() {
                                    let loc = Loc {
                                        pack: num,
                                        offset: off as u32,
                                        stored_len: h.stored_len,
                                        raw_len: h.raw_len,
                                    };
                                    chunks
                                        .insert(&ckey(&h.id), &loc.encode())
                                        .map_err(db_err(&p))?;
                                }
                            }
                            Kind::Object | Kind::Tombstone => {
                                let seq = u64::from_le_bytes(raw[..8].try_into().unwrap());
                                next_seq = next_seq.max(seq + 1);
                                let entry = if h.kind == Kind::Object {
                                    let recipe = Recipe::decode(&raw[8..])?;
                                    Some(ObjectEntry {
                                        seq,
                                        pack: num,
                                        total_len: recipe.total_len(),
                                        recipe: raw[8..].to_vec(),
                                    })
                                } else {
                                    None
                                };
                                let _ = Oid(h.id);
                                apply_object(
                                    &mut objects,
                                    &mut tombs,
                                    key,
                                    seq,
                                    num,
                                    entry.as_ref(),
                                )
                                .map_err(db_err(&p))?;
                            }
                        }
                        Ok(())
                    })?;
                    if let (Some(why), true) = (&end.stopped, crash_tail) {
                        let lost = file_len - end.end;
                        // Counted as cut, not as unreadable.
                        report.unreadable_bytes = report
                            .unreadable_bytes
                            .saturating_sub(lost)
                            .max(unreadable_before);
                        tracing::warn!(
                            "{}: cutting {lost} torn bytes at offset {} ({why})",
                            path.display(),
                            end.end
                        );
                        let f = OpenOptions::new()
                            .write(true)
                            .open(&path)
                            .map_err(StoreError::io("open", &path))?;
                        f.set_len(end.end)
                            .and_then(|_| f.sync_all())
                            .map_err(StoreError::io("truncate", &path))?;
                        report.torn_bytes_truncated += lost;
                    }
                    // What a rebuild could not read stays, and is never taken for a crash's
                    // tail later: the pack is indexed to its end.
                    let indexed = if crash_tail { end.end } else { file_len };
                    packs.insert(num, (indexed, 0u8)).map_err(db_err(&p))?;
                    if end.stopped.is_none() || crash_tail {
                        resumable = Some((num, end.end));
                    } else {
                        resumable = None;
                    }
                } else {
                    resumable = Some((num, committed));
                }
            }
            if changed {
                tx.open_table(META)
                    .map_err(db_err(&p))?
                    .insert("next_seq", &next_seq.to_le_bytes()[..])
                    .map_err(db_err(&p))?;
            }
        }
        if changed {
            tx.commit().map_err(db_err(&p))?;
        } else {
            tx.abort().map_err(db_err(&p))?;
        }
        if report.records > 0 || report.torn_bytes_truncated > 0 {
            tracing::info!(?report, "recovered {}", self.dir.display());
        }
        let st = self.state.get_mut().unwrap();
        st.next_seq = next_seq;
        st.next_pack = max_num + 1;
        if let Some((num, len)) = resumable.filter(|&(n, l)| {
            self.opts.append_to_last_pack && n == max_num && l < self.opts.pack_target
        }) {
            let path = self.packs_dir.join(pack_name(num));
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(StoreError::io("open", &path))?;
            st.writer = Some(Writer::new(
                num,
                file,
                len,
                len,
                true,
                self.opts.write_buffer,
            ));
        }
        self.recovery = report;
        Ok(())
    }
}

impl LocalStore {
    /// Objects the packs hold that the index does not name (verify's second half): every live
    /// pack read whole, skipping damage, and its object records (puts and removals, the newest
    /// of each) compared with the index. An index that lost an object (damage redb does not
    /// see) would otherwise read as "no such object" with nothing said. Chunks are not compared:
    /// gc drops unused ones from the index before their packs are rewritten.
    pub(super) fn unindexed(&self) -> Result<Vec<(String, String)>, StoreError> {
        let mut latest: std::collections::HashMap<[u8; 32], (u64, bool, Oid)> =
            std::collections::HashMap::new();
        let mut report = super::RebuildReport::default();
        for (num, _, _) in self.live_packs()? {
            let path = self.packs_dir.join(pack_name(num));
            if !path.exists() {
                continue;
            }
            scan_pack(&path, PACK_HEADER_LEN, true, &mut report, |_, h, raw| {
                match h.kind {
                    Kind::Chunk => {}
                    Kind::Object | Kind::Tombstone => {
                        let seq = u64::from_le_bytes(raw[..8].try_into().unwrap_or_default());
                        let e = latest
                            .entry(*h.id.digest())
                            .or_insert((0, false, Oid(h.id)));
                        if seq >= e.0 {
                            *e = (seq, h.kind == Kind::Object, Oid(h.id));
                        }
                    }
                }
                Ok(())
            })?;
        }
        let mut out = vec![];
        let mut listed = std::collections::HashSet::new();
        self.for_each_object(|oid, _| {
            listed.insert(*oid.id().digest());
            Ok(())
        })?;
        let cure = "`ferry store rebuild` restores it from the packs";
        for (key, (_, live, oid)) in latest {
            if live && !listed.contains(&key) {
                out.push((
                    oid.to_string(),
                    format!("in the packs but missing from the index; {cure}"),
                ));
            }
        }
        Ok(out)
    }
}
