//! Garbage collection that is safe with several writers on one bucket: two phases with a grace
//! period between them, as restic's and rustic's lock-free prune (docs/s3.md argues it).
//!
//! Phase one (condemn): with every object listed, a pack none of whose indexed chunks any
//! object uses is condemned (a marker `gc/condemned/<pack>` holding the time); a sparse pack's
//! live chunks are first copied into new packs, then it is condemned. From then on every
//! server treats a condemned pack's chunks as absent when deduplicating (so a writer uploads
//! them again rather than lean on a pack about to go), while still reading from it.
//!
//! Phase two (delete), in a later run once the grace period has passed: the objects are
//! listed again; a condemned pack holding a chunk that some object needs and no other pack
//! holds is pardoned (a writer with an older index used it), the others are deleted, then
//! their markers. One gc at a time: `gc/lock`, taken by a conditional write.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferry_format::Id;
use ferry_store::{ChunkStore, StoreError};

use super::S3Store;
use crate::client::{Cond, Put};
use crate::pack::Builder;

/// What a gc run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Distinct chunks the objects use.
    pub live_chunks: u64,
    /// Packs condemned in this run (deleted by a later run once the grace period is over).
    pub packs_condemned: u64,
    /// Sparse packs whose live chunks were copied into new packs (and which were condemned).
    pub packs_repacked: u64,
    pub chunks_moved: u64,
    /// Condemned packs deleted, and their bytes.
    pub packs_deleted: u64,
    pub bytes_deleted: u64,
    /// Condemned packs found still needed, and kept.
    pub packs_pardoned: u64,
    /// Condemned packs whose grace period is not over yet.
    pub packs_waiting: u64,
}

/// A gc lock older than this is taken over (its holder died).
const STALE_LOCK: Duration = Duration::from_secs(6 * 3600);

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl S3Store {
    /// Whether the server honours conditional writes (`If-None-Match: *` refusing a second
    /// PUT of a key): what makes the gc lock exclusive and the store description first-wins.
    /// Some servers ignore the header (Garage 2.5.0 does); on them the lock is advisory.
    pub fn conditional_writes(&self) -> Result<bool, StoreError> {
        let c = &self.inner.client;
        let key = format!("{}gc/probe-{}", self.inner.prefix, std::process::id());
        c.put(&key, b"1", Cond::Absent)?;
        let second = c.put(&key, b"2", Cond::Absent)?;
        c.delete(&key)?;
        Ok(second == Put::Refused)
    }

    /// Runs both phases: deletes what earlier runs condemned at least `grace` ago (unless
    /// still needed), then condemns what no object uses now, repacking packs whose live share
    /// of bytes is below `min_live`.
    pub fn gc(&self, grace: Duration, min_live: f64) -> Result<GcReport, StoreError> {
        self.flush()?;
        let lock = format!("{}gc/lock", self.inner.prefix);
        self.take_lock(&lock)?;
        let r = self.gc_locked(grace, min_live);
        let released = self.inner.client.delete(&lock);
        let r = r?;
        released?;
        Ok(r)
    }

    fn take_lock(&self, key: &str) -> Result<(), StoreError> {
        let c = &self.inner.client;
        let body = format!("{}\nferry gc, process {}\n", now_secs(), std::process::id());
        if c.put(key, body.as_bytes(), Cond::Absent)? != Put::Refused {
            return Ok(());
        }
        let held = c.get_with_etag(key)?;
        let since = held
            .as_ref()
            .and_then(|h| {
                String::from_utf8_lossy(&h.body)
                    .lines()
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0);
        let stale = now_secs().saturating_sub(since) > STALE_LOCK.as_secs();
        if let (true, Some(h)) = (stale, &held) {
            if let Some(tag) = &h.etag {
                // Taken over only if nobody else took it over first.
                if c.put(key, body.as_bytes(), Cond::Etag(tag))? != Put::Refused {
                    return Ok(());
                }
            }
        }
        Err(StoreError::Remote {
            why: format!(
                "{}: another gc holds {key} (since unix time {since}); if it died, delete that key",
                self.inner.name
            ),
        })
    }

    /// Every chunk some object uses.
    fn live(&self) -> Result<HashSet<Id>, StoreError> {
        let mut live = HashSet::new();
        for (oid, _) in self.objects()? {
            if let Some(r) = self.object(&oid)? {
                live.extend(r.chunks().iter().map(|c| c.id));
            }
        }
        Ok(live)
    }

    fn gc_locked(&self, grace: Duration, min_live: f64) -> Result<GcReport, StoreError> {
        let inner = &self.inner;
        inner.refresh()?;
        let live = self.live()?;
        let mut report = GcReport {
            live_chunks: live.len() as u64,
            ..GcReport::default()
        };
        let packs = inner.index.packs()?;
        let now = now_secs();

        // Phase two: what earlier runs condemned.
        let markers = inner
            .client
            .list(&format!("{}gc/condemned/", inner.prefix))?;
        let mut doomed = HashSet::new();
        for m in markers {
            let Some(name) = m.key.rsplit('/').next().map(str::to_string) else {
                continue;
            };
            doomed.insert(name.clone());
            let since = inner
                .client
                .get(&m.key, None)?
                .and_then(|b| String::from_utf8_lossy(&b).trim().parse::<u64>().ok())
                .unwrap_or(now);
            if now < since.saturating_add(grace.as_secs()) {
                report.packs_waiting += 1;
                continue;
            }
            let Some(&(_, size)) = packs.get(&name) else {
                // The pack is gone already (a run cut between its two deletes).
                inner.client.delete(&m.key)?;
                continue;
            };
            let entries = inner
                .read_tail(&name, size)?
                .map(|t| t.1)
                .unwrap_or_default();
            let mut needed = false;
            for e in &entries {
                if live.contains(&e.id) {
                    let elsewhere = inner.index.get(&e.id)?.is_some_and(|l| {
                        packs.get(&name).is_none_or(|p| p.0 != l.pack) && inner.usable(l.pack)
                    });
                    if !elsewhere {
                        needed = true;
                        break;
                    }
                }
            }
            if needed {
                tracing::info!("{}: pack {name} is needed again; kept", inner.name);
                inner.client.delete(&m.key)?;
                report.packs_pardoned += 1;
            } else {
                inner.client.delete(&inner.pack_key(&name))?;
                inner.client.delete(&m.key)?;
                report.packs_deleted += 1;
                report.bytes_deleted += size;
            }
            doomed.remove(&name);
        }

        // Phase one: condemn packs no object needs, repack sparse ones.
        let mut live_bytes: HashMap<u32, (u64, Vec<crate::index::Loc>)> = HashMap::new();
        for l in inner.index.chunks()? {
            if live.contains(&l.entry.id) {
                let p = live_bytes.entry(l.pack).or_default();
                p.0 += l.entry.stored_len as u64;
                p.1.push(l);
            }
        }
        let mut condemn = vec![];
        let mut sparse = vec![];
        for (name, (num, size)) in &packs {
            if doomed.contains(name) {
                continue;
            }
            match live_bytes.get(num) {
                None => condemn.push(name.clone()),
                Some((bytes, locs)) if (*bytes as f64) < min_live * *size as f64 => {
                    sparse.push((name.clone(), locs))
                }
                Some(_) => {}
            }
        }
        // The live chunks of sparse packs go into new packs before those are condemned.
        let mut b: Option<Builder> = None;
        let mut in_b = 0usize;
        for (name, locs) in &sparse {
            for l in locs.iter() {
                let data = inner.read_loc(l)?.ok_or_else(|| StoreError::Remote {
                    why: format!("{}: pack {name} vanished during gc", inner.name),
                })?;
                let builder = b.get_or_insert_with(|| {
                    Builder::new(inner.alg, inner.pack_target, inner.zstd_level)
                });
                builder.add(&l.entry.id, &data)?;
                in_b += data.len();
                report.chunks_moved += 1;
                if in_b >= inner.pack_target {
                    self.store_repack(b.take().expect("a builder"))?;
                    in_b = 0;
                }
            }
            report.packs_repacked += 1;
            condemn.push(name.clone());
        }
        if let Some(builder) = b {
            self.store_repack(builder)?;
        }
        let stamp = format!("{now}\n");
        for name in &condemn {
            inner
                .client
                .put(&inner.condemned_key(name), stamp.as_bytes(), Cond::None)?;
            report.packs_condemned += 1;
        }
        inner.refresh()?;
        Ok(report)
    }

    /// Uploads a pack of moved chunks and indexes it in their place.
    fn store_repack(&self, b: Builder) -> Result<(), StoreError> {
        let inner = &self.inner;
        let (bytes, name) = b.finish();
        inner
            .client
            .put(&inner.pack_key(&name), &bytes, Cond::Absent)?;
        let entries = crate::pack::parse_tail(inner.alg, &bytes, bytes.len() as u64)?;
        inner
            .index
            .add_pack(&name, bytes.len() as u64, &entries, &|_| true)?;
        Ok(())
    }
}
