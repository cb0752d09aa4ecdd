//! Keeping the local index in step with the bucket: listing packs, reading the tables of
//! contents of new ones, forgetting vanished ones, and knowing which packs gc condemned.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use ferry_store::StoreError;

use super::Inner;
use crate::pack::{self, Entry};
use crate::S3Error;

impl Inner {
    pub(super) fn condemned_key(&self, name: &str) -> String {
        format!("{}gc/condemned/{name}", self.prefix)
    }

    /// Indexes a pack; a chunk whose indexed copy is in a condemned pack moves to this one.
    pub(super) fn add_pack(
        &self,
        name: &str,
        size: u64,
        entries: &[Entry],
    ) -> Result<u32, StoreError> {
        let condemned = self.condemned.lock().unwrap().clone();
        self.index
            .add_pack(name, size, entries, &|p| condemned.contains(&p))
    }

    /// Whether the indexed copy of a chunk is one to deduplicate against (not in a condemned
    /// pack).
    pub(super) fn usable(&self, pack: u32) -> bool {
        !self.condemned.lock().unwrap().contains(&pack)
    }

    /// Lists the packs and indexes the new ones (and, if any vanished, indexes all again).
    pub(super) fn refresh(&self) -> Result<(), StoreError> {
        let _one = self.refreshing.lock().unwrap();
        let listed = self.client.list(&format!("{}packs/", self.prefix))?;
        let listed: HashMap<String, u64> = listed
            .into_iter()
            .filter_map(|l| {
                let name = l.key.rsplit('/').next()?.to_string();
                (name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()))
                    .then_some((name, l.size))
            })
            .collect();
        let known = self.index.packs()?;
        let gone: HashSet<u32> = known
            .iter()
            .filter(|(n, _)| !listed.contains_key(*n))
            .map(|(_, (num, _))| *num)
            .collect();
        if !gone.is_empty() {
            // A chunk of a vanished pack may also be in one that stays, unindexed (the first
            // copy won): index every pack again.
            let all: HashSet<u32> = known.values().map(|v| v.0).collect();
            self.index.drop_packs(&all)?;
        }
        let doomed: HashSet<String> = self
            .client
            .list(&format!("{}gc/condemned/", self.prefix))?
            .into_iter()
            .filter_map(|l| Some(l.key.rsplit('/').next()?.to_string()))
            .collect();
        let known = self.index.packs()?;
        *self.condemned.lock().unwrap() = known
            .iter()
            .filter(|(n, _)| doomed.contains(*n))
            .map(|(_, v)| v.0)
            .collect();
        let mut new: Vec<(&String, &u64)> = listed
            .iter()
            .filter(|(n, _)| !known.contains_key(*n))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        // Live packs first, so that their copies of a chunk are the ones indexed.
        new.sort_by_key(|(n, _)| doomed.contains(*n));
        tracing::debug!("{}: indexing {} new packs", self.name, new.len());
        let next = AtomicU64::new(0);
        let found: Mutex<Vec<(String, u64, Vec<Entry>)>> = Mutex::default();
        std::thread::scope(|s| {
            for _ in 0..8.min(new.len()) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some((name, size)) = new.get(i) else {
                        return;
                    };
                    match self.read_tail(name, **size) {
                        Ok(Some((size, e))) => {
                            found.lock().unwrap().push(((*name).clone(), size, e))
                        }
                        Ok(None) => {}
                        Err(e) => tracing::warn!("{}: pack {name} skipped: {e}", self.name),
                    }
                });
            }
        });
        let mut found = found.into_inner().unwrap();
        // Live packs first: their copies of a chunk are the ones indexed. One transaction.
        found.sort_by_key(|(n, _, _)| doomed.contains(n));
        let batch: Vec<(&str, u64, &[Entry])> = found
            .iter()
            .map(|(n, size, e)| (n.as_str(), *size, &e[..]))
            .collect();
        let condemned = self.condemned.lock().unwrap().clone();
        let numbers = self.index.add_packs(&batch, &|p| condemned.contains(&p))?;
        let mut c = self.condemned.lock().unwrap();
        for ((name, _, _), n) in found.iter().zip(numbers) {
            if doomed.contains(name) {
                c.insert(n);
            }
        }
        Ok(())
    }

    /// A pack's entries from its tail, and its size (`None` if it is gone).
    pub(super) fn read_tail(
        &self,
        name: &str,
        listed: u64,
    ) -> Result<Option<(u64, Vec<Entry>)>, S3Error> {
        let key = self.pack_key(name);
        let Some((mut tail, size)) = self.client.get_tail(&key, pack::FIRST_TAIL)? else {
            return Ok(None);
        };
        if size != listed {
            tracing::debug!(
                "{}: pack {name} listed as {listed} bytes, is {size}",
                self.name
            );
        }
        let need = pack::tail_len(&tail, size)?;
        if need > tail.len() as u64 {
            match self.client.get(&key, Some((size - need, size)))? {
                Some(t) => tail = t,
                None => return Ok(None),
            }
        }
        Ok(Some((size, pack::parse_tail(self.alg, &tail, size)?)))
    }
}
