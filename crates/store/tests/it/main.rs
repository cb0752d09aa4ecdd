//! Integration tests of the chunk stores.

mod conformance;
mod faults;
mod s3;

use ferry_format::HashAlg;
use ferry_store::{LocalStore, Options};

/// Pseudo-random bytes, deterministic per seed.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    blake3::Hasher::new_derive_key("ferry store tests")
        .update(&seed.to_le_bytes())
        .finalize_xof()
        .fill(&mut v);
    v
}

/// Small packs so tests cross pack boundaries.
pub fn small_opts() -> Options {
    Options {
        hash_alg: HashAlg::Blake3,
        cache_bytes: 1 << 20,
        pack_target: 256 << 10,
        zstd_level: 3,
        flush_every: 1 << 20,
        append_to_last_pack: true,
        // Smaller than a pack: records reach the file before a flush, a few at a time.
        write_buffer: 64 << 10,
        wait_for_lock: true,
    }
}

pub fn new_local(dir: &std::path::Path) -> LocalStore {
    LocalStore::open_or_create(dir.join("store"), small_opts()).unwrap()
}

pub fn reopen(dir: &std::path::Path) -> LocalStore {
    LocalStore::open(dir.join("store"), small_opts()).unwrap()
}

/// A store asked to prefer speed keeps chunks as they are (no compression), and compresses
/// again once asked not to; either way every chunk reads back whole.
#[test]
fn a_store_preferring_speed_keeps_chunks_uncompressed() {
    use ferry_store::{ChunkStore, VerifiedChunk};
    let t = tempfile::tempdir().unwrap();
    let s = new_local(t.path());
    let text = |seed: u64| -> Vec<u8> { format!("line {seed}\n").repeat(2000).into_bytes() };
    let put = |seed: u64| {
        let data = text(seed);
        let c = VerifiedChunk::hash(HashAlg::Blake3, &data);
        assert!(s.put(&c).unwrap());
        s.flush().unwrap();
        (*c.id(), data)
    };
    let stored = || s.stats().unwrap().stored_bytes;
    let (a, da) = put(1);
    let compressed = stored();
    assert!(
        compressed < da.len() as u64 / 4,
        "compressed at first: {compressed}"
    );
    s.prefer_speed(true);
    let (b, db) = put(2);
    let raw = stored() - compressed;
    assert!(
        raw >= db.len() as u64,
        "kept as it is: {raw} of {}",
        db.len()
    );
    s.prefer_speed(false);
    let (c, dc) = put(3);
    assert!(
        stored() - compressed - raw < dc.len() as u64 / 4,
        "compressed again"
    );
    for (id, data) in [(a, da), (b, db), (c, dc)] {
        assert_eq!(s.get(&id).unwrap().unwrap(), data);
    }
}

/// Two processes creating one store at once (two servers started together on one staging
/// directory): both open it. Each creation's marker went through one temporary name, and the
/// second rename found it gone ("write …/ferry-store: No such file or directory").
#[test]
fn two_creations_of_one_store_at_once_both_open_it() {
    for _ in 0..40 {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("store");
        let start = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            let open = || {
                start.wait();
                LocalStore::open_or_create(&dir, small_opts()).map(drop)
            };
            let (a, b) = (s.spawn(open), s.spawn(open));
            a.join().unwrap().unwrap();
            b.join().unwrap().unwrap();
        });
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
    }
}
