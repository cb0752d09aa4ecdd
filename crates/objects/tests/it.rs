//! The object store through its public interface: capabilities, durability, contiguous storage,
//! compaction, and crashes at every write and sync of create and delete.

use std::sync::Arc;

use ferry_objects::disk::Sim;
use ferry_objects::{Capability, ObjectStore, ObjectsError, Options, Rights};

const SECRET: [u8; 32] = [3; 32];

fn data(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn small() -> Options {
    Options {
        cache_bytes: 1 << 20,
        cache_max_object: 64 << 10,
        file_max: 4 << 20,
        ..Options::default()
    }
}

fn open(sim: &Sim) -> Arc<ObjectStore> {
    ObjectStore::open(Arc::new(sim.clone()), SECRET, small()).unwrap()
}

fn read(s: &ObjectStore, cap: &Capability) -> Result<Vec<u8>, ObjectsError> {
    let mut out = vec![];
    s.read(cap, 0, u64::MAX, &mut out)?;
    Ok(out)
}

fn put(s: &ObjectStore, b: &[u8], p: u8) -> Capability {
    s.create(b, b.len() as u64, p).unwrap().cap
}

#[test]
fn create_read_stat_delete() {
    let dir = tempfile::tempdir().unwrap();
    let s = ferry_objects::open_dir(dir.path(), SECRET, small()).unwrap();
    for (i, n) in [0usize, 1, 16, 256, 4096, 65536, 1 << 20, 3 << 20]
        .iter()
        .enumerate()
    {
        let b = data(*n, i as u64);
        let c = s.create(&b[..], b.len() as u64, 1).unwrap();
        assert_eq!((c.size, c.durability), (*n as u64, 1));
        assert_eq!(read(&s, &c.cap).unwrap(), b, "{n} bytes");
        let st = s.stat(&c.cap).unwrap();
        assert_eq!(
            (st.size, st.oid, st.rights),
            (*n as u64, c.oid, Rights::ALL)
        );
        // Ranges, across chunk boundaries.
        for (a, z) in [(0u64, 1u64), (3, 10), (*n as u64 / 3, *n as u64 / 2 + 7)] {
            let mut out = vec![];
            s.read(&c.cap, a, z, &mut out).unwrap();
            let (a, z) = (a.min(*n as u64) as usize, z.min(*n as u64) as usize);
            assert_eq!(out, b[a.min(z)..z], "{n} bytes, {a}..{z}");
        }
    }
    let b = data(5000, 99);
    let cap = put(&s, &b, 1);
    let reader = cap.restrict(Rights::READ).unwrap();
    assert_eq!(read(&s, &reader).unwrap(), b);
    assert!(matches!(s.delete(&reader), Err(ObjectsError::Denied)));
    s.delete(&cap).unwrap();
    assert!(matches!(read(&s, &cap), Err(ObjectsError::Denied)));
    assert!(matches!(s.delete(&cap), Err(ObjectsError::Denied)));
    // A short or long input is refused and leaves nothing.
    let before = s.stats();
    assert!(s.create(&b[..100], 200, 1).is_err());
    assert!(s.create(&b[..], 200, 1).is_err());
    assert_eq!(s.stats().objects, before.objects);
}

/// No valid capability, no service: forged, altered, widened, another server's, another
/// object's; every request type answers the same refusal.
#[test]
fn no_valid_capability_no_service() {
    let sim = Sim::new();
    let s = open(&sim);
    let other = ObjectStore::open(Arc::new(Sim::new()), [4; 32], small()).unwrap();
    let cap = put(&s, b"secret bytes", 1);
    let second = put(&s, b"other bytes", 1);
    let mut forged = cap.clone();
    forged.check[0] ^= 1;
    let mut elsewhere = cap.clone();
    elsewhere.number = second.number;
    let mut missing = cap.clone();
    missing.number = 1 << 40;
    let mut widened = cap.restrict(Rights::READ).unwrap();
    widened.masks[0] = Rights::ALL;
    let foreign = put(&other, b"secret bytes", 1);
    let read_only = cap.restrict(Rights::READ).unwrap();
    let no_read = cap.restrict(Rights::DELETE).unwrap();
    type Request = fn(&ObjectStore, &Capability) -> Result<(), ObjectsError>;
    let requests: [(&str, Request); 4] = [
        ("stat", |s, c| s.stat(c).map(|_| ())),
        ("read", |s, c| read(s, c).map(|_| ())),
        ("recipe", |s, c| s.recipe(c).map(|_| ())),
        ("delete", |s, c| s.delete(c)),
    ];
    for (name, req) in requests {
        for (what, bad) in [
            ("forged", &forged),
            ("another object's number", &elsewhere),
            ("no such object", &missing),
            ("widened", &widened),
            ("another server's", &foreign),
        ] {
            let r = req(&s, bad);
            assert!(
                matches!(r, Err(ObjectsError::Denied)),
                "{name} with {what}: {r:?}"
            );
        }
        let needs_delete = name == "delete";
        let r = req(&s, if needs_delete { &read_only } else { &no_read });
        assert!(
            matches!(r, Err(ObjectsError::Denied)),
            "{name} without its right"
        );
    }
    assert_eq!(read(&s, &cap).unwrap(), b"secret bytes");
}

#[test]
fn durability_zero_answers_from_ram_then_writes() {
    let sim = Sim::new();
    let s = open(&sim);
    let b = data(100_000, 1);
    let c = s.create(&b[..], b.len() as u64, 0).unwrap();
    assert_eq!(c.durability, 0);
    assert_eq!(read(&s, &c.cap).unwrap(), b);
    s.flush();
    assert_eq!(s.stat(&c.cap).unwrap().durability, 1);
    drop(s);
    let s = open(&sim);
    assert_eq!(read(&s, &c.cap).unwrap(), b);
    // Past the RAM allowance, a create writes first and says so.
    let s2 = ObjectStore::open(
        Arc::new(Sim::new()),
        SECRET,
        Options {
            ram_bytes: 1000,
            ..small()
        },
    )
    .unwrap();
    assert_eq!(s2.create(&b[..], b.len() as u64, 0).unwrap().durability, 1);
    // Deleted while still in RAM: never appears.
    let c = s.create(&b[..10], 10, 0).unwrap();
    s.delete(&c.cap).unwrap();
    s.flush();
    assert!(matches!(read(&s, &c.cap), Err(ObjectsError::Denied)));
}

#[test]
fn holes_are_reused_and_compacted() {
    let sim = Sim::new();
    let opts = Options {
        file_max: 1 << 20,
        ..small()
    };
    let s = ObjectStore::open(Arc::new(sim.clone()), SECRET, opts.clone()).unwrap();
    let blobs: Vec<Vec<u8>> = (0..12)
        .map(|i| data(250_000 - i * 1000, i as u64))
        .collect();
    let caps: Vec<Capability> = blobs.iter().map(|b| put(&s, b, 1)).collect();
    let full = s.stats();
    assert!(full.files >= 2, "1 MiB files: {full:?}");
    for c in caps.iter().step_by(2) {
        s.delete(c).unwrap();
    }
    let holey = s.stats();
    assert!(holey.holes > 0);
    // A new object goes into the first hole that fits.
    let b = data(150_000, 77);
    let c = put(&s, &b, 1);
    assert!(s.stats().holes < holey.holes);
    let moved = s.compact(u64::MAX).unwrap();
    assert!(moved > 0);
    let packed = s.stats();
    assert!(packed.holes < holey.holes, "{packed:?}");
    assert!(packed.used < holey.used, "{packed:?}");
    assert_eq!(packed.used - packed.holes, packed.bytes);
    for (i, cap) in caps.iter().enumerate().skip(1).step_by(2) {
        assert_eq!(read(&s, cap).unwrap(), blobs[i]);
    }
    assert_eq!(read(&s, &c).unwrap(), b);
    drop(s);
    let s = ObjectStore::open(Arc::new(sim.clone()), SECRET, opts).unwrap();
    assert_eq!(s.stats().used, packed.used);
    assert_eq!(read(&s, &c).unwrap(), b);
}

#[test]
fn damaged_bytes_are_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let s = ferry_objects::open_dir(dir.path(), SECRET, small()).unwrap();
    let small_obj = data(1000, 5);
    let big = data(300_000, 6);
    let (a, b) = (put(&s, &small_obj, 1), put(&s, &big, 1));
    drop(s);
    let path = dir.path().join("data-00000.obj");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[10] ^= 1;
    bytes[1000 + 150_000] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let s = ferry_objects::open_dir(dir.path(), SECRET, small()).unwrap();
    assert!(matches!(read(&s, &a), Err(ObjectsError::Corrupt(_))));
    assert!(matches!(read(&s, &b), Err(ObjectsError::Corrupt(_))));
    // The undamaged start of the large one still reads.
    let mut out = vec![];
    s.read(&b, 0, 1000, &mut out).unwrap();
    assert_eq!(out, big[..1000]);
}

/// Crashes at every write and sync of a create and of a delete: an acknowledged object is
/// there whole after the crash; an unacknowledged create left nothing visible but a whole
/// object; a delete either happened or did not.
#[test]
fn crashes_at_every_write_and_sync_of_create_and_delete() {
    let old = data(70_000, 1);
    let new = data(90_000, 2);
    // How many writes and syncs the scenario takes with no crash.
    let total = {
        let sim = Sim::new();
        let s = open(&sim);
        let cap = put(&s, &old, 1);
        let start = sim.ops();
        put(&s, &new, 1);
        s.delete(&cap).unwrap();
        sim.ops() - start
    };
    assert!(total >= 6, "{total} writes and syncs");
    for k in 0..=total {
        let sim = Sim::new();
        let s = open(&sim);
        let kept = put(&s, &old, 1);
        sim.fail_after(k);
        let created = s.create(&new[..], new.len() as u64, 1).ok();
        let deleted = created.is_some() && s.delete(&kept).is_ok();
        drop(s);
        sim.crash();
        let s = open(&sim);
        match (&created, deleted) {
            (_, false) => assert_eq!(read(&s, &kept).unwrap(), old, "crash at {k}"),
            (_, true) => assert!(matches!(read(&s, &kept), Err(ObjectsError::Denied))),
        }
        if let Some(c) = &created {
            assert_eq!(read(&s, &c.cap).unwrap(), new, "crash at {k}");
        } else if let Some(n) = s
            .by_oid(&ferry_format::Oid(ferry_format::Id::hash(
                ferry_format::HashAlg::Blake3,
                &new,
            )))
            .unwrap()
        {
            let cap = s.owner(n).unwrap();
            assert_eq!(
                read(&s, &cap).unwrap(),
                new,
                "a half object after a crash at {k}"
            );
        }
        // The store stays usable, and its space adds up.
        let c = put(&s, &new, 1);
        assert_eq!(read(&s, &c).unwrap(), new);
        let st = s.stats();
        assert_eq!(st.used - st.holes, st.bytes, "crash at {k}: {st:?}");
    }
}

fn entry(v: &[u8]) -> Option<ferry_objects::Entry> {
    Some(ferry_objects::Entry {
        kind: ferry_objects::Kind::Blob,
        value: v.to_vec(),
    })
}

#[test]
fn directories_are_versioned_and_compare_and_swap() {
    let sim = Sim::new();
    let s = open(&sim);
    let d = s.mkdir().unwrap();
    assert_eq!(s.list(&d, None).unwrap().version, 0);
    let v1 = s.update(&d, 0, &[("a".into(), entry(b"A"))]).unwrap();
    let v2 = s
        .update(&d, v1, &[("b".into(), entry(b"B")), ("a".into(), None)])
        .unwrap();
    assert_eq!((v1, v2), (1, 2));
    // Made against version 1 when 2 is current: refused, nothing changes.
    let r = s.update(&d, 1, &[("c".into(), entry(b"C"))]);
    assert!(matches!(r, Err(ObjectsError::Conflict(_))), "{r:?}");
    let now = s.list(&d, None).unwrap();
    assert_eq!(now.version, 2);
    assert_eq!(now.entries.keys().collect::<Vec<_>>(), ["b"]);
    let old = s.list(&d, Some(1)).unwrap();
    assert_eq!(old.entries["a"].value, b"A");
    let h: Vec<u64> = s.history(&d).unwrap().iter().map(|v| v.version).collect();
    assert_eq!(h, [0, 1, 2]);
    // Rights: a read-only capability lists but does not change; bad names are refused.
    let ro = d.restrict(Rights::READ).unwrap();
    assert_eq!(s.list(&ro, None).unwrap().version, 2);
    assert!(matches!(
        s.update(&ro, 2, &[("x".into(), entry(b"X"))]),
        Err(ObjectsError::Denied)
    ));
    for bad in ["", ".", "..", "a/b", "nul\0"] {
        assert!(
            s.update(&d, 2, &[(bad.into(), entry(b"X"))]).is_err(),
            "{bad:?}"
        );
    }
    // Survives a reopen; a blob's capability is not a directory's.
    drop(s);
    let s = open(&sim);
    assert_eq!(s.list(&d, None).unwrap().entries["b"].value, b"B");
    let blob = put(&s, b"x", 1);
    assert!(s.list(&blob, None).is_err());
    // Deleting the directory deletes its versions.
    let before = s.stats().objects;
    s.delete(&d).unwrap();
    assert_eq!(s.stats().objects, before - 3);
    assert!(matches!(s.list(&d, None), Err(ObjectsError::Denied)));
}

/// Two writers racing on one base: exactly one commits each version.
#[test]
fn racing_updates_commit_one_at_a_time() {
    let sim = Sim::new();
    let s = open(&sim);
    let d = s.mkdir().unwrap();
    let wins: Vec<u64> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let (s, d) = (&s, &d);
                sc.spawn(move || {
                    let mut won = 0;
                    for i in 0..20 {
                        loop {
                            let base = s.list(d, None).unwrap().version;
                            let name = format!("t{t}-{i}");
                            match s.update(d, base, &[(name, entry(b"v"))]) {
                                Ok(_) => break,
                                Err(ObjectsError::Conflict(_)) => continue,
                                Err(e) => panic!("{e}"),
                            }
                        }
                        won += 1;
                    }
                    won
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(wins, [20, 20, 20, 20]);
    let l = s.list(&d, None).unwrap();
    assert_eq!((l.version, l.entries.len()), (80, 80));
}
