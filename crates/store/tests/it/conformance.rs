//! The contract of `ChunkStore`, run against every backend.

use ferry_chunk::ChunkerSpec;
use ferry_format::{HashAlg, Id, Oid};
use ferry_store::{read_object, store_object, ChunkStore, MemStore, StoreError, VerifiedChunk};

use crate::{bytes, new_local};

fn suite(store: &dyn ChunkStore) {
    let alg = store.hash_alg();
    assert!(store.is_empty().unwrap(), "a new store is empty");
    let probe = VerifiedChunk::hash(alg, b"is_empty probe");
    store.put(&probe).unwrap();
    assert!(
        !store.is_empty().unwrap(),
        "not empty once a chunk is put, before a flush"
    );
    store.flush().unwrap();
    assert!(!store.is_empty().unwrap(), "nor after");
    // Interesting sizes: empty, one byte, around one chunk, many chunks.
    for (i, len) in [0usize, 1, 2047, 8192, 65535, 65536, 65537, 1_000_003]
        .into_iter()
        .enumerate()
    {
        let data = bytes(i as u64, len);
        let (oid, recipe, stored) =
            store_object(store, &data[..], &ChunkerSpec::default(), |_| {}).unwrap();
        assert_eq!(oid.id(), Id::hash(alg, &data));
        assert_eq!(recipe.total_len(), len as u64);
        assert_eq!(stored.new_bytes, len as u64, "fresh data is all new");
        let mut out = vec![];
        assert_eq!(
            read_object(store, &oid, &mut out).unwrap(),
            Some(len as u64)
        );
        assert_eq!(out, data);
        // Storing it again stores nothing new.
        let (_, _, again) =
            store_object(store, &data[..], &ChunkerSpec::default(), |_| {}).unwrap();
        assert_eq!(again.new_chunks, 0);
    }
    let c = VerifiedChunk::hash(alg, b"one chunk");
    assert!(store.put(&c).unwrap());
    assert!(!store.put(&c).unwrap());
    assert!(store.contains(c.id()).unwrap());
    assert_eq!(store.get(c.id()).unwrap().unwrap(), b"one chunk");
    let absent = Id::hash(alg, b"never stored");
    assert!(!store.contains(&absent).unwrap());
    // By the first 8 bytes of the digest: put and not flushed, flushed, absent.
    let short = |id: &Id| u64::from_le_bytes(id.digest()[..8].try_into().unwrap());
    let unflushed = VerifiedChunk::hash(alg, b"not flushed yet");
    store.put(&unflushed).unwrap();
    assert_eq!(
        store.find_prefix(short(unflushed.id())).unwrap(),
        Some(*unflushed.id())
    );
    store.flush().unwrap();
    for id in [c.id(), unflushed.id()] {
        assert_eq!(store.find_prefix(short(id)).unwrap(), Some(*id));
    }
    assert_eq!(store.find_prefix(short(&absent)).unwrap(), None);
    assert!(store.get(&absent).unwrap().is_none());
    assert!(read_object(store, &Oid(absent), std::io::sink())
        .unwrap()
        .is_none());
    // A chunk of another algorithm is refused, not silently stored.
    let other = VerifiedChunk::hash(HashAlg::Sha256, b"x");
    assert!(matches!(
        store.put(&other),
        Err(StoreError::WrongHashAlg { .. })
    ));
    // Objects: list, remove.
    let objs = store.objects().unwrap();
    assert_eq!(objs.len(), 8);
    assert!(store.remove_object(&objs[0].0).unwrap());
    assert!(!store.remove_object(&objs[0].0).unwrap());
    assert!(store.object(&objs[0].0).unwrap().is_none());
    store.flush().unwrap();
    let s = store.stats().unwrap();
    assert_eq!(s.objects, 7);
    assert!(s.chunks > 100);
    assert_eq!(s.damaged, 0);
}

#[test]
fn mem_store_keeps_the_contract() {
    suite(&MemStore::new(HashAlg::Blake3));
}

#[test]
fn local_store_keeps_the_contract() {
    let t = tempfile::tempdir().unwrap();
    let s = new_local(t.path());
    suite(&s);
    drop(s);
    // And everything is still there after reopening.
    let s = crate::reopen(t.path());
    assert_eq!(s.objects().unwrap().len(), 7);
    assert!(s.verify(|_| {}).unwrap().damaged.is_empty());
}

fn st_packs(s: &dyn ChunkStore) -> u64 {
    s.stats().unwrap().packs
}

#[test]
fn s3_store_keeps_the_contract() {
    let t = tempfile::tempdir().unwrap();
    let Some(gw) = ferry_s3::testing::S3Server::for_test(&t.path().join("s3")) else {
        return;
    };
    let loc = ferry_s3::Locator::parse(&gw.locator("s3://conformance/a/store")).unwrap();
    let s = crate::s3::open(&gw, &loc, &t.path().join("cache"), true).unwrap();
    suite(&s);
    drop(s);
    // Everything is there for a second server with a cache of its own, and for the first
    // again with its cache lost.
    for cache in ["cache2", "cache"] {
        let _ = std::fs::remove_dir_all(t.path().join("cache"));
        let s = crate::s3::open(&gw, &loc, &t.path().join(cache), false).unwrap();
        assert_eq!(s.objects().unwrap().len(), 7);
        let v = s.verify(|_| {}).unwrap();
        assert!(v.damaged.is_empty() && v.missing.is_empty(), "{v:?}");
        assert_eq!(s.rebuild().unwrap(), st_packs(&s));
        let st = s.stats().unwrap();
        assert!(st.packs > 3, "small packs: {st:?}");
    }
    // SHA-256 ids in a store of their own beside it.
    let loc = ferry_s3::Locator::parse(&gw.locator("s3://conformance/sha")).unwrap();
    let s = crate::s3::open_alg(&gw, &loc, &t.path().join("cache-sha"), HashAlg::Sha256).unwrap();
    suite_small(&s, HashAlg::Sha256);
}

#[test]
fn sha256_local_store() {
    let t = tempfile::tempdir().unwrap();
    let opts = ferry_store::Options {
        hash_alg: HashAlg::Sha256,
        ..crate::small_opts()
    };
    let s = ferry_store::LocalStore::open_or_create(t.path().join("s"), opts).unwrap();
    suite_small(&s, HashAlg::Sha256);
}

fn suite_small(store: &dyn ChunkStore, alg: HashAlg) {
    let data = bytes(9, 300_000);
    let (oid, _, _) = store_object(store, &data[..], &ChunkerSpec::default(), |_| {}).unwrap();
    assert_eq!(oid.id().alg(), alg);
    let mut out = vec![];
    read_object(store, &oid, &mut out).unwrap();
    assert_eq!(out, data);
}

#[test]
fn damage_is_an_error_never_wrong_bytes() {
    let m = MemStore::new(HashAlg::Blake3);
    let c = VerifiedChunk::hash(HashAlg::Blake3, b"precious");
    m.put(&c).unwrap();
    assert!(m.damage(c.id()));
    assert!(matches!(m.get(c.id()), Err(StoreError::Corrupt { .. })));
    assert_eq!(m.stats().unwrap().damaged, 1);
    // Putting the chunk again repairs it.
    assert!(m.put(&c).unwrap());
    assert_eq!(m.get(c.id()).unwrap().unwrap(), b"precious");
    assert!(VerifiedChunk::check(*c.id(), b"impostor").is_err());
}
