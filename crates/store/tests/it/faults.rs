//! Crashes, damage and full disks against the local store. Nothing acknowledged is lost, nothing
//! wrong is returned, nothing panics.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use ferry_chunk::ChunkerSpec;
use ferry_format::{chunk_object, HashAlg, Oid};
use ferry_store::{read_object, store_object, ChunkStore, LocalStore, StoreError, VerifiedChunk};
use proptest::prelude::*;

use crate::{bytes, new_local, reopen, small_opts};

fn packs(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir.join("store/packs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pack"))
        .collect();
    v.sort();
    v
}

fn read_back(s: &dyn ChunkStore, oid: &Oid) -> Result<Option<Vec<u8>>, StoreError> {
    let mut out = vec![];
    Ok(read_object(s, oid, &mut out)?.map(|_| out))
}

/// Puts an object's chunks and recipe without flushing.
fn put_unflushed(s: &LocalStore, data: &[u8]) -> Oid {
    let (recipe, oid) = chunk_object(data, &ChunkerSpec::default(), HashAlg::Blake3, |c, d| {
        s.put(&VerifiedChunk::assume_verified(c.id, d)).map(|_| ())
    })
    .unwrap();
    s.put_object(&oid, &recipe).unwrap();
    oid
}

#[test]
fn whole_records_written_before_a_crash_are_recovered() {
    let t = tempfile::tempdir().unwrap();
    let s = new_local(t.path());
    let a = bytes(1, 100_000);
    let (oa, _, _) = store_object(&s, &a[..], &ChunkerSpec::default(), |_| {}).unwrap();
    // More than the write buffer holds, and less than fills the pack (a new pack would flush):
    // the first records reach the file before the crash.
    let b = bytes(2, 140_000);
    let ob = put_unflushed(&s, &b);
    s.simulate_crash();
    let s = reopen(t.path());
    assert!(s.recovery().records > 0);
    assert_eq!(read_back(&s, &oa).unwrap().unwrap(), a);
    // What reached the file is back and whole; what was still buffered is gone, and the
    // object is whole or absent.
    let mut back = 0;
    chunk_object(&b[..], &ChunkerSpec::default(), HashAlg::Blake3, |c, d| {
        if let Some(got) = s.get(&c.id).unwrap() {
            assert_eq!(got, d);
            back += d.len();
        }
        Ok::<_, std::io::Error>(())
    })
    .unwrap();
    assert!(back >= 60_000, "{back} bytes back");
    if let Some(got) = read_back(&s, &ob).unwrap() {
        assert_eq!(got, b);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// A pack tail torn anywhere (and followed by any garbage) after the last flush: the store
    /// opens, keeps everything flushed, and works on.
    #[test]
    fn torn_tail_is_cut_and_flushed_data_survives(cut in 0.0f64..1.0, garbage in proptest::collection::vec(any::<u8>(), 0..300)) {
        let t = tempfile::tempdir().unwrap();
        let s = new_local(t.path());
        let a = bytes(1, 150_000);
        let (oa, _, _) = store_object(&s, &a[..], &ChunkerSpec::default(), |_| {}).unwrap();
        let pack = packs(t.path()).pop().unwrap();
        let committed = fs::metadata(&pack).unwrap().len();
        // Small enough to stay in the same pack: a pack rotation would flush.
        let b = bytes(2, 80_000);
        put_unflushed(&s, &b);
        s.simulate_crash();
        let end = fs::metadata(&pack).unwrap().len();
        let at = committed + ((end - committed) as f64 * cut) as u64;
        let mut f = OpenOptions::new().write(true).open(&pack).unwrap();
        f.set_len(at).unwrap();
        use std::io::Seek;
        f.seek(std::io::SeekFrom::End(0)).unwrap();
        f.write_all(&garbage).unwrap();
        drop(f);

        let s = reopen(t.path());
        prop_assert_eq!(&read_back(&s, &oa).unwrap().unwrap(), &a);
        let rep = s.verify(|_| {}).unwrap();
        prop_assert!(rep.damaged.is_empty(), "{:?}", rep.damaged);
        prop_assert!(rep.missing.is_empty());
        // The store still takes writes and serves them after another reopen.
        let c = bytes(3, 50_000);
        let (oc, _, _) = store_object(&s, &c[..], &ChunkerSpec::default(), |_| {}).unwrap();
        drop(s);
        let s = reopen(t.path());
        prop_assert_eq!(read_back(&s, &oc).unwrap().unwrap(), c);
        prop_assert_eq!(&read_back(&s, &oa).unwrap().unwrap(), &a);
    }
}

#[test]
fn a_flipped_byte_is_detected_recorded_and_repairable() {
    let t = tempfile::tempdir().unwrap();
    let s = new_local(t.path());
    let a = bytes(7, 60_000);
    let (oa, recipe, _) = store_object(&s, &a[..], &ChunkerSpec::fixed(4096), |_| {}).unwrap();
    drop(s);
    let pack = packs(t.path()).pop().unwrap();
    let mut raw = fs::read(&pack).unwrap();
    // Random data does not compress, so payloads are stored raw: flip a byte inside the first.
    raw[8 + 49 + 100] ^= 0x20;
    fs::write(&pack, &raw).unwrap();

    let s = reopen(t.path());
    let first = recipe.chunks()[0].id;
    match s.get(&first) {
        Err(StoreError::Corrupt { id, .. }) => assert_eq!(id, first),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(matches!(
        read_back(&s, &oa),
        Err(StoreError::Corrupt { .. })
    ));
    assert_eq!(s.stats().unwrap().damaged, 1);
    let rep = s.verify(|_| {}).unwrap();
    assert_eq!(rep.damaged.len(), 1);
    assert!(rep.damaged[0].1.contains("offset"), "{:?}", rep.damaged);
    assert!(first
        .to_string()
        .contains(&rep.damaged[0].0["prefix:".len()..]));
    // Putting the good chunk again repairs the store.
    assert!(s
        .put(&VerifiedChunk::hash(HashAlg::Blake3, &a[..4096]))
        .unwrap());
    s.flush().unwrap();
    assert_eq!(read_back(&s, &oa).unwrap().unwrap(), a);
    assert!(s.verify(|_| {}).unwrap().damaged.is_empty());
    assert_eq!(s.stats().unwrap().damaged, 0);
}

/// One flipped byte in a record's header, then a rebuild: only that record is lost; the scan
/// resyncs on the next whole record, nothing is cut off later, and verify does not say ok.
#[test]
fn a_damaged_record_header_costs_that_record_only() {
    for flip in [28usize, 8 + 49 + 9000, 40_000] {
        let t = tempfile::tempdir().unwrap();
        let s = new_local(t.path());
        let mut objects = vec![];
        for i in 0..5 {
            let d = bytes(40 + i, 30_000);
            let (oid, _, _) = store_object(&s, &d[..], &ChunkerSpec::fixed(4096), |_| {}).unwrap();
            objects.push((oid, d));
        }
        s.flush().unwrap();
        drop(s);
        let pack = packs(t.path()).remove(0);
        let mut raw = fs::read(&pack).unwrap();
        let len = raw.len();
        raw[flip] ^= 0x04;
        fs::write(&pack, &raw).unwrap();
        fs::remove_file(t.path().join("store/index.redb")).unwrap();
        let (s, rep) = LocalStore::rebuild(t.path().join("store"), small_opts()).unwrap();
        assert!(
            rep.unreadable_bytes + rep.damaged_records > 0,
            "{flip}: {rep:?}"
        );
        let readable = |s: &LocalStore| {
            objects
                .iter()
                .filter(|(oid, d)| match read_back(s, oid) {
                    Ok(Some(got)) => {
                        assert_eq!(&got, d, "wrong bytes returned");
                        true
                    }
                    _ => false,
                })
                .count()
        };
        assert!(readable(&s) >= 4, "{flip}: {rep:?}");
        let v = s.verify(|_| {}).unwrap();
        assert!(
            !v.damaged.is_empty() || !v.missing.is_empty() || readable(&s) == 5,
            "{flip}: verify says ok with an object unreadable"
        );
        drop(s);
        // The next open cuts nothing it could not read.
        let s = reopen(t.path());
        assert_eq!(fs::metadata(&pack).unwrap().len() as usize, len);
        assert!(readable(&s) >= 4, "{flip}: lost after reopening");
    }
}

/// Random bytes over the index (all of it, or all but its header): a clear error naming the fix,
/// never a panic; `rebuild` recovers every object.
#[test]
fn random_bytes_in_the_index_are_an_error_not_a_panic() {
    for seed in 0..6u64 {
        let t = tempfile::tempdir().unwrap();
        let s = new_local(t.path());
        let d = bytes(50 + seed, 100_000);
        let (oid, _, _) = store_object(&s, &d[..], &ChunkerSpec::default(), |_| {}).unwrap();
        s.flush().unwrap();
        drop(s);
        let index = t.path().join("store/index.redb");
        let mut raw = fs::read(&index).unwrap();
        // Whole, or past the header (redb's own checks pass it then).
        let from = if seed % 2 == 0 {
            0
        } else {
            4096.min(raw.len())
        };
        let len = raw.len();
        raw[from..].copy_from_slice(&bytes(900 + seed, len - from));
        fs::write(&index, raw).unwrap();
        let opened = std::panic::catch_unwind(|| {
            LocalStore::open(t.path().join("store"), small_opts()).map(|_| ())
        });
        match opened {
            Ok(Err(e)) => assert!(e.to_string().contains("ferry store rebuild"), "{e}"),
            Ok(Ok(())) => panic!("{seed}: random bytes taken for an index"),
            Err(_) => panic!("{seed}: opening panicked"),
        }
        let (s, _) = LocalStore::rebuild(t.path().join("store"), small_opts()).unwrap();
        assert_eq!(read_back(&s, &oid).unwrap().unwrap(), d);
    }
}

#[test]
fn a_pack_truncated_behind_our_back_gives_errors_not_panics() {
    let t = tempfile::tempdir().unwrap();
    let s = new_local(t.path());
    let a = bytes(8, 200_000);
    let (oa, _, _) = store_object(&s, &a[..], &ChunkerSpec::default(), |_| {}).unwrap();
    drop(s);
    let pack = packs(t.path()).pop().unwrap();
    let len = fs::metadata(&pack).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&pack)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let s = reopen(t.path());
    assert!(matches!(
        read_back(&s, &oa),
        Err(StoreError::Corrupt { .. })
    ));
    assert!(!s.verify(|_| {}).unwrap().damaged.is_empty());
}

#[test]
fn a_lost_index_is_rebuilt_from_the_packs() {
    let t = tempfile::tempdir().unwrap();
    let s = new_local(t.path());
    let mut oids = vec![];
    for i in 0..6 {
        let d = bytes(10 + i, 120_000);
        oids.push((
            store_object(&s, &d[..], &ChunkerSpec::default(), |_| {})
                .unwrap()
                .0,
            d,
        ));
    }
    // Remove one object, and remove-then-re-add another: sequence numbers must order them.
    assert!(s.remove_object(&oids[0].0).unwrap());
    let recipe = s.object(&oids[1].0).unwrap().unwrap();
    assert!(s.remove_object(&oids[1].0).unwrap());
    s.put_object(&oids[1].0, &recipe).unwrap();
    s.flush().unwrap();
    let before = s.stats().unwrap();
    assert!(before.packs > 1);
    drop(s);

    fs::remove_file(t.path().join("store/index.redb")).unwrap();
    let s = reopen(t.path());
    assert_eq!(s.stats().unwrap().chunks, before.chunks);
    assert!(
        s.object(&oids[0].0).unwrap().is_none(),
        "removed object resurrected"
    );
    for (oid, d) in &oids[1..] {
        assert_eq!(&read_back(&s, oid).unwrap().unwrap(), d);
    }
    drop(s);

    // A damaged index: a clear error that names the fix, then `rebuild` repairs it.
    fs::write(t.path().join("store/index.redb"), b"definitely not redb").unwrap();
    let err = LocalStore::open(t.path().join("store"), small_opts())
        .err()
        .expect("must fail");
    assert!(err.to_string().contains("ferry store rebuild"), "{err}");
    let (s, rep) = LocalStore::rebuild(t.path().join("store"), small_opts()).unwrap();
    assert!(rep.records > 0);
    assert_eq!(s.stats().unwrap().objects, 5);
    assert!(s.verify(|_| {}).unwrap().damaged.is_empty());
}

/// Compaction that meets a live chunk whose record header is damaged stops with an error and
/// leaves the pack as it was (it once hung: reading the record took the lock compaction held).
#[test]
fn compaction_stops_at_a_damaged_live_record() {
    let t = tempfile::tempdir().unwrap();
    let s = new_local(t.path());
    let live = bytes(60, 16 << 10);
    let mut dead = live.clone();
    dead.extend(bytes(61, 100 << 10));
    let spec = ChunkerSpec::fixed(4096);
    let (od, _, _) = store_object(&s, &dead[..], &spec, |_| {}).unwrap();
    let (ol, _, _) = store_object(&s, &live[..], &spec, |_| {}).unwrap();
    s.remove_object(&od).unwrap();
    s.flush().unwrap();
    drop(s);
    let pack = packs(t.path()).remove(0);
    let mut raw = fs::read(&pack).unwrap();
    // The first record (the live data's first chunk): a byte of its header's id.
    raw[8 + 20] ^= 0x01;
    fs::write(&pack, &raw).unwrap();
    let s = reopen(t.path());
    assert!(matches!(s.gc(0.9), Err(StoreError::Damaged { .. })));
    assert_eq!(fs::read(&pack).unwrap(), raw, "the pack is left as it was");
    assert!(read_back(&s, &ol).is_err());
}

#[test]
fn gc_drops_unreferenced_chunks_and_compacts() {
    let t = tempfile::tempdir().unwrap();
    let s = new_local(t.path());
    let shared = bytes(20, 300_000);
    let mut a = shared.clone();
    a.extend(bytes(21, 300_000));
    let mut b = shared.clone();
    b.extend(bytes(22, 300_000));
    let (oa, _, _) = store_object(&s, &a[..], &ChunkerSpec::default(), |_| {}).unwrap();
    let (ob, _, _) = store_object(&s, &b[..], &ChunkerSpec::default(), |_| {}).unwrap();
    let loose = VerifiedChunk::hash(HashAlg::Blake3, b"referenced by nothing");
    s.put(&loose).unwrap();
    s.remove_object(&oa).unwrap();
    let before = s.stats().unwrap();
    let rep = s.gc(0.9).unwrap();
    let mut s = s;
    let (big, small) = s.compact_index().unwrap();
    assert!(small <= big);
    let after = s.stats().unwrap();
    assert!(rep.chunks_removed > 10, "{rep:?}");
    assert!(rep.packs_rewritten > 0);
    assert!(after.chunks < before.chunks);
    assert!(!s.contains(loose.id()).unwrap());
    assert!(rep.pack_bytes_after < rep.pack_bytes_before, "{rep:?}");
    assert_eq!(read_back(&s, &ob).unwrap().unwrap(), b);
    assert!(s.verify(|_| {}).unwrap().damaged.is_empty());
    drop(s);
    // Rebuilding after compaction neither loses b nor resurrects a.
    let (s, _) = LocalStore::rebuild(t.path().join("store"), small_opts()).unwrap();
    assert_eq!(read_back(&s, &ob).unwrap().unwrap(), b);
    assert!(s.object(&oa).unwrap().is_none());
}

#[test]
fn one_process_at_a_time_and_only_real_stores() {
    let t = tempfile::tempdir().unwrap();
    let s = new_local(t.path());
    assert!(matches!(
        LocalStore::open(t.path().join("store"), small_opts()),
        Err(StoreError::Locked { .. })
    ));
    drop(s);
    fs::create_dir(t.path().join("other")).unwrap();
    fs::write(t.path().join("other/file"), b"x").unwrap();
    let e = LocalStore::open_or_create(t.path().join("other"), small_opts())
        .err()
        .unwrap();
    assert!(matches!(e, StoreError::NotAStore { .. }), "{e}");
}

/// A full disk fails the write with a clear error, and everything flushed before stays.
/// Needs root (it mounts a 3 MiB tmpfs); CI runs as root.
#[test]
fn full_disk_loses_nothing_acknowledged() {
    if !nix_is_root() {
        eprintln!("SKIPPED full_disk_loses_nothing_acknowledged: needs root to mount a tmpfs");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let mnt = t.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=3m", "tmpfs"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success(), "mount tmpfs");
    struct Umount(PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _u = Umount(mnt.clone());
    let opts = ferry_store::Options {
        zstd_level: 0,
        ..small_opts()
    };
    let s = LocalStore::open_or_create(mnt.join("store"), opts.clone()).unwrap();
    let mut kept = vec![];
    let mut err = None;
    for i in 0..100 {
        let d = bytes(100 + i, 200_000);
        match store_object(&s, &d[..], &ChunkerSpec::default(), |_| {}) {
            Ok((oid, _, _)) => kept.push((oid, d)),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    let err = err.expect("a 3 MiB disk must fill up");
    let msg = err.to_string();
    assert!(
        err.is_disk_full() || msg.contains("No space") || msg.contains("poison"),
        "{msg}"
    );
    assert!(!kept.is_empty());
    drop(s);
    // Make room, reopen: all acknowledged objects are intact.
    let st = std::process::Command::new("mount")
        .args(["-o", "remount,size=64m"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success());
    let s = LocalStore::open(mnt.join("store"), opts).unwrap();
    for (oid, d) in &kept {
        assert_eq!(&read_back(&s, oid).unwrap().unwrap(), d);
    }
    assert!(s.verify(|_| {}).unwrap().damaged.is_empty());
}

fn nix_is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

#[test]
fn trim_evicts_least_recently_used_packs_and_keeps_objects() {
    let t = tempfile::tempdir().unwrap();
    let s = new_local(t.path());
    let object = bytes(40, 50_000);
    let (oid, _, _) = store_object(&s, &object[..], &ChunkerSpec::default(), |_| {}).unwrap();
    let chunks: Vec<Vec<u8>> = (0..12).map(|i| bytes(50 + i, 100_000)).collect();
    for c in &chunks {
        s.put(&VerifiedChunk::hash(HashAlg::Blake3, c)).unwrap();
    }
    s.flush().unwrap();
    drop(s);
    // Pack n was last used at n thousand seconds after the epoch.
    let all = packs(t.path());
    assert!(all.len() >= 5, "{all:?}");
    for (i, p) in all.iter().enumerate() {
        let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1000 * (i as u64 + 1));
        fs::File::open(p).unwrap().set_modified(when).unwrap();
    }
    let s = reopen(t.path());
    let id = |c: &Vec<u8>| *VerifiedChunk::hash(HashAlg::Blake3, c).id();
    let where_ = |s: &LocalStore| -> Vec<bool> {
        chunks.iter().map(|c| s.contains(&id(c)).unwrap()).collect()
    };
    // Reading the first chunk makes its pack the most recently used.
    assert_eq!(s.get(&id(&chunks[0])).unwrap().unwrap(), chunks[0]);
    let before: u64 = all.iter().map(|p| fs::metadata(p).unwrap().len()).sum();
    let rep = s.trim(before / 2).unwrap();
    assert!(rep.pack_bytes_after <= before / 2, "{rep:?}");
    assert!(rep.packs_evicted >= 2 && rep.chunks_removed >= 4, "{rep:?}");
    let kept = where_(&s);
    assert!(kept[0], "the chunk just used stays: {kept:?}");
    assert!(kept[11], "the newest chunks stay: {kept:?}");
    assert!(!kept[2], "old, unused chunks go: {kept:?}");
    assert_eq!(
        read_back(&s, &oid).unwrap().unwrap(),
        object,
        "objects are kept"
    );
    assert!(s.verify(|_| {}).unwrap().damaged.is_empty());
    drop(s);
    let s = reopen(t.path());
    assert_eq!(where_(&s), kept, "durable");
    assert_eq!(read_back(&s, &oid).unwrap().unwrap(), object);
    // Under the limit already: nothing to do.
    assert_eq!(s.trim(u64::MAX).unwrap().packs_evicted, 0);
}

#[test]
fn a_record_still_in_the_write_buffer_is_read_back() {
    let t = tempfile::tempdir().unwrap();
    // The default buffer (a megabyte): these records are all still in it when read.
    let s = LocalStore::open_or_create(
        t.path().join("store"),
        ferry_store::Options {
            cache_bytes: 0,
            ..Default::default()
        },
    )
    .unwrap();
    let d = bytes(40, 100_000);
    let mut ids = vec![];
    chunk_object(
        &d[..],
        &ChunkerSpec::default(),
        HashAlg::Blake3,
        |c, data| {
            ids.push((c.id, data.to_vec()));
            s.put(&VerifiedChunk::assume_verified(c.id, data))
                .map(|_| ())
        },
    )
    .unwrap();
    let pack = packs(t.path()).pop().unwrap();
    assert!(fs::metadata(&pack).unwrap().len() < 100_000, "buffered");
    for (id, data) in &ids {
        assert_eq!(s.get(id).unwrap().as_ref(), Some(data));
        let short = u64::from_le_bytes(id.digest()[..8].try_into().unwrap());
        assert_eq!(s.find_prefix(short).unwrap(), Some(*id));
    }
}
