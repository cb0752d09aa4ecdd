//! A RAM cache of chunks bounded in bytes (Bullet's whole-object cache, at chunk grain).

use ferry_format::Id;
use lru::LruCache;

pub(crate) struct ByteLru {
    map: LruCache<Id, Vec<u8>>,
    bytes: usize,
    limit: usize,
}

impl ByteLru {
    pub(crate) fn new(limit: usize) -> Self {
        ByteLru {
            map: LruCache::unbounded(),
            bytes: 0,
            limit,
        }
    }

    pub(crate) fn get(&mut self, id: &Id) -> Option<Vec<u8>> {
        self.map.get(id).cloned()
    }

    pub(crate) fn insert(&mut self, id: Id, data: Vec<u8>) {
        // One chunk larger than a quarter of the cache would evict too much to be worth it.
        if data.len() > self.limit / 4 {
            return;
        }
        self.bytes += data.len();
        if let Some(old) = self.map.put(id, data) {
            self.bytes -= old.len();
        }
        while self.bytes > self.limit {
            match self.map.pop_lru() {
                Some((_, v)) => self.bytes -= v.len(),
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_format::HashAlg;

    #[test]
    fn stays_within_its_byte_bound() {
        let mut c = ByteLru::new(10_000);
        for i in 0..100u32 {
            c.insert(Id::hash(HashAlg::Blake3, &i.to_le_bytes()), vec![0; 1000]);
            assert!(c.bytes <= 10_000);
        }
        assert!(c
            .get(&Id::hash(HashAlg::Blake3, &99u32.to_le_bytes()))
            .is_some());
        assert!(c
            .get(&Id::hash(HashAlg::Blake3, &0u32.to_le_bytes()))
            .is_none());
        c.insert(Id::hash(HashAlg::Blake3, b"big"), vec![0; 5000]);
        assert!(c.get(&Id::hash(HashAlg::Blake3, b"big")).is_none());
    }
}
