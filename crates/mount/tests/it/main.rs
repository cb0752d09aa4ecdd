//! The mount's file system logic against real servers on threads (no kernel, no mount): two
//! clients of one export, the round-trip budget, last close wins, offline use and recovery,
//! and a model-based test of operation sequences.

mod attrs;
mod durability;
mod harness;
mod links;
mod listings;
mod model;
mod new_files;
mod removals;
mod sessions;

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_fs::{ConnError, Export, Server, ServerOptions, Session};
use ferry_mount::{Errno, Options, Vfs, ROOT};
use ferry_proto::WirePath;
pub use harness::*;

#[test]
fn close_to_open_between_two_clients_with_leases() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("export");
    std::fs::create_dir(&root).unwrap();
    let remote = Remote::new(&root, 60_000);
    let a = client(&remote, &t.path().join("a"), Duration::from_secs(5));
    let b = client(&remote, &t.path().join("b"), Duration::from_secs(5));
    let v1 = bytes(1, 300_000);
    write(&a, "doc", &v1).unwrap();
    assert_eq!(
        std::fs::read(root.join("doc")).unwrap(),
        v1,
        "on the server after close"
    );
    // A's own close does not break the lease its commit returned: reading back costs nothing.
    settle(&[&a]);
    let n = requests(&a);
    assert_eq!(read(&a, "doc").unwrap(), v1);
    assert_eq!(
        requests(&a),
        n,
        "the writer's lease survives its own commit"
    );
    assert_eq!(read(&b, "doc").unwrap(), v1);
    // B edits the middle; A, told by its lease break, sees B's close at its next open.
    let mut v2 = v1.clone();
    v2[150_000..150_010].copy_from_slice(b"0123456789");
    write(&b, "doc", &v2).unwrap();
    settle(&[&a, &b]);
    let before = a.traffic().unwrap();
    assert_eq!(read(&a, "doc").unwrap(), v2);
    let after = a.traffic().unwrap();
    // The changed version costs its recipe and the changed chunk, not the file.
    assert!(
        after.bytes_received - before.bytes_received < 40_000,
        "{} bytes for a 10-byte edit",
        after.bytes_received - before.bytes_received
    );
    // Opening again while the lease holds costs nothing at all.
    let n = requests(&a);
    assert_eq!(read(&a, "doc").unwrap(), v2);
    assert_eq!(requests(&a), n, "no message while the lease holds");
    assert!(a.counters.opens_cached.load(Ordering::Relaxed) >= 1);
}

#[test]
fn opens_read_from_a_lookaside_device_first() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("export");
    std::fs::create_dir(&root).unwrap();
    let doc = bytes(7, 400_000);
    std::fs::write(root.join("doc"), &doc).unwrap();
    // A stick holding an older copy under another name: all but the edited part matches.
    let stick = t.path().join("stick");
    std::fs::create_dir(&stick).unwrap();
    let mut old = doc.clone();
    old[200_000..200_100].fill(0);
    std::fs::write(stick.join("doc-backup"), &old).unwrap();
    let spec = ferry_chunk::ChunkerSpec::default();
    let (index, _) =
        ferry_lookaside::scan(&stick, &spec, ferry_format::HashAlg::Blake3, None, &|_| {}).unwrap();
    let devices = Arc::new(ferry_lookaside::Lookaside::new(
        vec![(stick.clone(), index)],
        ferry_lookaside::Matching::Chunks,
    ));
    let remote = Remote::new(&root, 60_000);
    let opts = Options {
        cache_dir: t.path().join("c"),
        cache_size: 1 << 30,
        timeout: Duration::from_secs(5),
        chunker: spec,
        lookaside: Some(devices.clone()),
        providers: Default::default(),
        strict_close: false,
    };
    let c = Vfs::new(remote.connector(), WirePath::default(), opts).unwrap();
    assert_eq!(read(&c, "doc").unwrap(), doc);
    // Asked first (who then answers first is the machine's business: the server here is as
    // fast as the stick).
    let supplied = &devices.supplied()[0].1;
    assert!(supplied.requests > 0, "{supplied:?}");
}

#[test]
fn round_trips_of_the_lbfs_budget() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("export");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f"), bytes(2, 100_000)).unwrap();
    // Leases longer than any run; their expiry is brought about (`expire_leases`).
    let remote = Remote::new(&root, 60_000);
    let c = client(&remote, &t.path().join("c"), Duration::from_secs(5));
    let rt = |c: &Vfs| c.traffic().unwrap().round_trips;

    // An uncached file: its attributes, its recipe, its chunks.
    let s = c.lookup(ROOT, b"f").unwrap();
    let r0 = rt(&c);
    let o = c.open(s.ino, false, false).unwrap();
    assert!(
        rt(&c) - r0 <= 2,
        "lookup left the attributes leased: recipe + chunks"
    );
    c.release(o.fh).unwrap();

    // Cached, lease valid: nothing.
    let r0 = rt(&c);
    let o = c.open(s.ino, false, false).unwrap();
    assert!(o.keep_cache, "same version: the kernel keeps its pages");
    assert_eq!(rt(&c), r0);
    c.release(o.fh).unwrap();

    // Cached, lease expired, unchanged: one round trip.
    c.expire_leases();
    let r0 = rt(&c);
    let o = c.open(s.ino, false, false).unwrap();
    assert_eq!(rt(&c) - r0, 1);
    assert_eq!(c.counters.opens_revalidated.load(Ordering::Relaxed), 1);
    c.release(o.fh).unwrap();

    // A small file written on close: one round trip (its chunks travel with the commit).
    let (_, o) = c.create(ROOT, b"small", 0o644, true).unwrap();
    c.write(o.fh, 0, &bytes(3, 5000)).unwrap();
    let r0 = rt(&c);
    c.flush(o.fh).unwrap();
    assert_eq!(rt(&c) - r0, 1);
    c.release(o.fh).unwrap();

    // A new file larger than that: the version it replaces is the empty one its create made,
    // of which nothing is asked (no GetRecipe, no GetKeys): which chunks the server holds
    // already, then the chunks and the commit.
    let (_, o) = c.create(ROOT, b"new", 0o644, true).unwrap();
    c.write(o.fh, 0, &bytes(5, 100_000)).unwrap();
    let (r0, q0) = (rt(&c), c.traffic().unwrap().requests);
    c.flush(o.fh).unwrap();
    assert_eq!(rt(&c) - r0, 2);
    // Have; Create, Write, Commit, and the directory's attributes after it.
    assert_eq!(c.traffic().unwrap().requests - q0, 5);
    c.release(o.fh).unwrap();
    assert_eq!(std::fs::read(root.join("new")).unwrap(), bytes(5, 100_000));

    // A larger one: which chunks the server lacks, then those chunks and the commit.
    let o = c.open(s.ino, true, false).unwrap();
    c.write(o.fh, 50_000, b"changed").unwrap();
    let (r0, sent0) = (rt(&c), c.traffic().unwrap().bytes_sent);
    c.flush(o.fh).unwrap();
    assert!(rt(&c) - r0 <= 2, "{} round trips", rt(&c) - r0);
    assert!(
        c.traffic().unwrap().bytes_sent - sent0 < 30_000,
        "only the changed chunk"
    );
    c.release(o.fh).unwrap();
    let mut want = bytes(2, 100_000);
    want[50_000..50_007].copy_from_slice(b"changed");
    assert_eq!(std::fs::read(root.join("f")).unwrap(), want);
}

/// Filling a directory, as `cp -r` or `tar x` do: each new file costs its create and its
/// commit, one round trip each. The kernel's lookup of the new name and its look at the
/// directory (whose attributes it drops after each change) are answered here: the listing stays
/// leased through this client's own changes, and the directory's attributes come back with
/// each change.
#[test]
fn a_new_file_costs_two_round_trips() {
    let (_t, root, _remote, c) = one_client();
    let rt = |c: &Vfs| c.traffic().unwrap().round_trips;
    let d = c.mkdir(ROOT, b"d", 0o755).unwrap();
    assert_eq!(c.lookup(d.ino, b"first").unwrap_err(), Errno::ENOENT);
    for i in 0..5u64 {
        let name = format!("f{i}");
        let r0 = rt(&c);
        let before = c.getattr(d.ino).unwrap();
        assert_eq!(c.lookup(d.ino, name.as_bytes()).unwrap_err(), Errno::ENOENT);
        assert_eq!(rt(&c), r0, "lookup and the directory's attributes: none");
        let (_, o) = c.create(d.ino, name.as_bytes(), 0o644, false).unwrap();
        c.write(o.fh, 0, &bytes(i, 100)).unwrap();
        c.flush(o.fh).unwrap();
        c.release(o.fh).unwrap();
        assert_eq!(rt(&c) - r0, 2, "create and commit");
        let after = c.getattr(d.ino).unwrap();
        assert_eq!(rt(&c) - r0, 2);
        let server = std::fs::metadata(root.join("d")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            after.mtime_ns,
            server.mtime_nsec() + server.mtime() * 1_000_000_000
        );
        assert!(after.mtime_ns >= before.mtime_ns);
        assert_eq!(
            std::fs::read(root.join("d").join(&name)).unwrap(),
            bytes(i, 100)
        );
    }
    let names: Vec<Vec<u8>> = c.readdir(d.ino).unwrap().into_iter().map(|e| e.2).collect();
    assert_eq!(
        names.len(),
        5,
        "listed from the cache, kept up to date here"
    );
}

/// A truncating create (a shell's `>`, a compiler's output) in a directory whose listing is
/// leased is made here and created on the server by its commit: one round trip for the whole
/// file. Meanwhile the name is this client's (looked up, listed, removed here); elsewhere the
/// create goes to the server at once, as an exclusive one always does.
#[test]
fn a_truncating_create_is_made_on_the_server_by_its_commit() {
    let (_t, root, remote, c) = one_client();
    let rt = |c: &Vfs| c.traffic().unwrap().round_trips;
    let d = c.mkdir(ROOT, b"d", 0o755).unwrap();
    assert_eq!(c.lookup(d.ino, b"none").unwrap_err(), Errno::ENOENT);

    let r0 = rt(&c);
    let (f, o) = c.create_later(d.ino, b"out.o", 0o640).unwrap();
    c.write(o.fh, 0, b"object code").unwrap();
    assert!(
        !root.join("d/out.o").exists(),
        "not on the server before the close"
    );
    assert_eq!(c.lookup(d.ino, b"out.o").unwrap().ino, f.ino);
    assert_eq!(c.getattr(f.ino).unwrap().size, 11);
    let names =
        |c: &Vfs| -> Vec<Vec<u8>> { c.readdir(d.ino).unwrap().into_iter().map(|e| e.2).collect() };
    assert_eq!(names(&c), vec![b"out.o".to_vec()]);
    assert_eq!(rt(&c), r0, "nothing asked yet");
    c.flush(o.fh).unwrap();
    c.release(o.fh).unwrap();
    assert_eq!(rt(&c), r0, "the commit queued");
    c.send_changes(Duration::ZERO);
    assert_eq!(rt(&c) - r0, 1, "the commit, which creates it");
    assert_eq!(std::fs::read(root.join("d/out.o")).unwrap(), b"object code");
    use std::os::unix::fs::PermissionsExt;
    let m = std::fs::metadata(root.join("d/out.o")).unwrap();
    assert_eq!(m.permissions().mode() & 0o7777, 0o640);

    // Removed before its close: the server never hears of it.
    let r0 = rt(&c);
    let (_, o) = c.create_later(d.ino, b"tmp", 0o644).unwrap();
    c.write(o.fh, 0, b"scratch").unwrap();
    c.unlink(d.ino, b"tmp").unwrap();
    assert_eq!(c.lookup(d.ino, b"tmp").unwrap_err(), Errno::ENOENT);
    assert_eq!(
        c.read(o.fh, 0, 100).unwrap(),
        b"scratch",
        "the descriptor keeps it"
    );
    c.flush(o.fh).unwrap();
    c.release(o.fh).unwrap();
    assert_eq!(rt(&c), r0);
    assert!(!root.join("d/tmp").exists());
    assert_eq!(names(&c), vec![b"out.o".to_vec()]);

    // Someone else made the name meanwhile, unseen yet: the commit replaces it, as the
    // truncating open would have.
    let (_, o) = c.create_later(d.ino, b"both", 0o644).unwrap();
    let other = client(
        &remote,
        &root.parent().unwrap().join("other"),
        Duration::from_secs(5),
    );
    let od = other.lookup(ROOT, b"d").unwrap();
    let (_, oo) = other.create(od.ino, b"both", 0o644, true).unwrap();
    other.write(oo.fh, 0, b"theirs").unwrap();
    other.flush(oo.fh).unwrap();
    other.release(oo.fh).unwrap();
    c.write(o.fh, 0, b"mine").unwrap();
    c.flush(o.fh).unwrap();
    c.release(o.fh).unwrap();
    // Its queued commit is refused (the name is taken), and written back again by upkeep.
    c.send_changes(Duration::ZERO);
    c.tick();
    assert_eq!(std::fs::read(root.join("d/both")).unwrap(), b"mine");

    // A directory holding only such a file is empty on the server, not here.
    let e = c.mkdir(d.ino, b"e", 0o755).unwrap();
    assert_eq!(c.lookup(e.ino, b"x").unwrap_err(), Errno::ENOENT);
    let (_, o) = c.create_later(e.ino, b"x", 0o644).unwrap();
    assert_eq!(c.rmdir(d.ino, b"e").unwrap_err(), Errno::ENOTEMPTY);
    let f = c.mkdir(d.ino, b"f", 0o755).unwrap();
    assert_eq!(
        c.rename(d.ino, b"f", d.ino, b"e", false).unwrap_err(),
        Errno::ENOTEMPTY
    );
    c.release(o.fh).unwrap();
    c.send_changes(Duration::ZERO);
    assert!(root.join("d/e/x").exists());
    c.rename(d.ino, b"f", d.ino, b"g", false).unwrap();
    let _ = f;

    // A directory whose listing is not leased: created on the server at once.
    let (_, o) = c.create_later(ROOT, b"top", 0o644).unwrap();
    assert!(root.join("top").exists());
    c.release(o.fh).unwrap();
}

#[test]
fn the_last_close_wins_whole() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("export");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f"), bytes(4, 50_000)).unwrap();
    let remote = Remote::new(&root, 60_000);
    let a = client(&remote, &t.path().join("a"), Duration::from_secs(5));
    let b = client(&remote, &t.path().join("b"), Duration::from_secs(5));
    let sa = a.lookup(ROOT, b"f").unwrap();
    let sb = b.lookup(ROOT, b"f").unwrap();
    let oa = a.open(sa.ino, true, true).unwrap();
    let ob = b.open(sb.ino, true, true).unwrap();
    a.write(oa.fh, 0, b"AAAAAAAA").unwrap();
    b.write(ob.fh, 0, b"BB").unwrap();
    a.flush(oa.fh).unwrap();
    a.release(oa.fh).unwrap();
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"AAAAAAAA");
    b.flush(ob.fh).unwrap();
    b.release(ob.fh).unwrap();
    assert_eq!(
        std::fs::read(root.join("f")).unwrap(),
        b"BB",
        "exactly B's version"
    );
    assert_eq!(b.counters.last_close_wins.load(Ordering::Relaxed), 1);
    settle(&[&a]);
    assert_eq!(read(&a, "f").unwrap(), b"BB");
}

#[test]
fn offline_cached_files_read_and_changes_wait_for_the_server() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("export");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("cached"), bytes(5, 20_000)).unwrap();
    std::fs::write(root.join("uncached"), bytes(6, 20_000)).unwrap();
    let remote = Remote::new(&root, 60_000);
    let timeout = Duration::from_secs(2);
    let cache = t.path().join("c");
    let c = client(&remote, &cache, timeout);
    assert_eq!(read(&c, "cached").unwrap(), bytes(5, 20_000));
    // The link fails: lease breaks can no longer arrive, so every lease is void.
    remote.stop();
    settle(&[&c]);

    // Operations that need the server fail with a clear error, never hang: bounded by the
    // timeout (given ten times over here, so that a slow run cannot fail it).
    let t0 = Instant::now();
    assert_eq!(c.mkdir(ROOT, b"d", 0o755).unwrap_err(), Errno::EHOSTDOWN);
    assert!(t0.elapsed() < timeout * 10);
    let t0 = Instant::now();
    assert_eq!(read(&c, "uncached").unwrap_err(), Errno::EHOSTDOWN);
    assert!(t0.elapsed() < timeout * 10);
    // The cached file still reads, and a change to it is kept.
    assert_eq!(read(&c, "cached").unwrap(), bytes(5, 20_000));
    assert!(c.counters.opens_offline.load(Ordering::Relaxed) >= 1);
    assert_eq!(
        write(&c, "cached", b"changed offline").unwrap_err(),
        Errno::EHOSTDOWN
    );
    assert_eq!(read(&c, "cached").unwrap(), b"changed offline");
    assert_eq!(
        std::fs::read(root.join("cached")).unwrap(),
        bytes(5, 20_000)
    );

    // The server is back: the change goes up by itself.
    remote.start();
    let t0 = Instant::now();
    while std::fs::read(root.join("cached")).unwrap() != b"changed offline" {
        assert!(t0.elapsed() < Duration::from_secs(20), "never written back");
        c.tick();
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A truncating create whose close finds the server gone: the file is kept (still this
/// mount's, looked up here) and created on the server when it is back; across a restart too.
#[test]
fn a_file_made_here_while_the_server_is_gone_is_created_when_it_returns() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("export");
    std::fs::create_dir_all(root.join("d")).unwrap();
    let remote = Remote::new(&root, 60_000);
    let cache = t.path().join("c");
    {
        let c = client(&remote, &cache, Duration::from_secs(1));
        let d = c.lookup(ROOT, b"d").unwrap();
        assert_eq!(c.lookup(d.ino, b"x").unwrap_err(), Errno::ENOENT);
        let (f, o) = c.create_later(d.ino, b"kept", 0o644).unwrap();
        c.write(o.fh, 0, b"made offline").unwrap();
        let (_, o2) = c.create_later(d.ino, b"later", 0o644).unwrap();
        c.write(o2.fh, 0, b"after a restart").unwrap();
        remote.stop();
        // Refused at once if the link knows the server is gone; else queued, its sending
        // failing later.
        let closed = c.flush(o.fh).and_then(|()| c.release(o.fh));
        assert!(
            matches!(closed, Ok(()) | Err(Errno::EHOSTDOWN)),
            "{closed:?}"
        );
        c.send_changes(Duration::ZERO);
        assert_eq!(c.lookup(d.ino, b"kept").unwrap().ino, f.ino);
        assert!(!root.join("d/kept").exists());
        remote.start();
        let t0 = Instant::now();
        while !root.join("d/kept").exists() {
            assert!(t0.elapsed() < Duration::from_secs(20), "never created");
            c.tick();
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(std::fs::read(root.join("d/kept")).unwrap(), b"made offline");
        remote.stop();
        let closed = c.flush(o2.fh).and_then(|()| c.release(o2.fh));
        assert!(
            matches!(closed, Ok(()) | Err(Errno::EHOSTDOWN)),
            "{closed:?}"
        );
        c.shutdown();
    }
    assert!(!root.join("d/later").exists());
    remote.start();
    let c = client(&remote, &cache, Duration::from_secs(1));
    assert_eq!(c.write_back_all(), 0);
    assert_eq!(
        std::fs::read(root.join("d/later")).unwrap(),
        b"after a restart"
    );
}

#[test]
fn changes_kept_across_a_restart_are_written_back_by_the_next_mount() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("export");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f"), b"old").unwrap();
    let remote = Remote::new(&root, 60_000);
    let cache = t.path().join("c");
    {
        let c = client(&remote, &cache, Duration::from_secs(1));
        assert_eq!(read(&c, "f").unwrap(), b"old");
        remote.stop();
        assert_eq!(write(&c, "f", b"new").unwrap_err(), Errno::EHOSTDOWN);
        c.shutdown();
    }
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"old");
    remote.start();
    let c = client(&remote, &cache, Duration::from_secs(1));
    assert_eq!(c.write_back_all(), 0);
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"new");
    assert_eq!(read(&c, "f").unwrap(), b"new");
}

#[test]
fn editors_save_by_rename_and_a_removed_open_file_is_not_written_back() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("export");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("doc"), b"version 1").unwrap();
    let remote = Remote::new(&root, 60_000);
    let c = client(&remote, &t.path().join("c"), Duration::from_secs(5));
    assert_eq!(read(&c, "doc").unwrap(), b"version 1");
    // vim: write a new file, rename it over the old one.
    write(&c, ".doc.swp", b"version 2").unwrap();
    c.rename(ROOT, b".doc.swp", ROOT, b"doc", false).unwrap();
    // (Queued: the mount's thread sends it within a round trip or two.)
    c.send_changes(Duration::ZERO);
    assert_eq!(std::fs::read(root.join("doc")).unwrap(), b"version 2");
    assert!(!root.join(".doc.swp").exists());
    assert_eq!(read(&c, "doc").unwrap(), b"version 2");
    // emacs: the old version becomes doc~ by rename, the new one is written.
    c.rename(ROOT, b"doc", ROOT, b"doc~", false).unwrap();
    write(&c, "doc", b"version 3").unwrap();
    assert_eq!(std::fs::read(root.join("doc~")).unwrap(), b"version 2");
    assert_eq!(read(&c, "doc").unwrap(), b"version 3");
    // A file removed while open: its changes go nowhere, and nothing fails.
    let s = c.lookup(ROOT, b"doc~").unwrap();
    let o = c.open(s.ino, true, false).unwrap();
    c.unlink(ROOT, b"doc~").unwrap();
    c.write(o.fh, 0, b"lost").unwrap();
    c.flush(o.fh).unwrap();
    c.release(o.fh).unwrap();
    // The removal reaches the server before the next request (or by the mount's thread).
    c.send_changes(Duration::ZERO);
    assert!(!root.join("doc~").exists());
    // Names: create exclusively, mkdir, rename a directory with a file open inside.
    assert_eq!(
        c.create(ROOT, b"doc", 0o644, true).unwrap_err(),
        Errno::EEXIST
    );
    let d = c.mkdir(ROOT, b"dir", 0o755).unwrap();
    let (f, o) = c.create(d.ino, b"inner", 0o600, true).unwrap();
    c.write(o.fh, 0, b"inside").unwrap();
    c.rename(ROOT, b"dir", ROOT, b"moved", false).unwrap();
    c.flush(o.fh).unwrap();
    c.release(o.fh).unwrap();
    assert_eq!(std::fs::read(root.join("moved/inner")).unwrap(), b"inside");
    assert_eq!(c.getattr(f.ino).unwrap().mode, 0o600);
    assert_eq!(c.rmdir(ROOT, b"moved").unwrap_err(), Errno::ENOTEMPTY);
}

#[test]
fn a_large_listing_costs_one_round_trip() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("export");
    std::fs::create_dir_all(root.join("big")).unwrap();
    for i in 0..5000 {
        std::fs::write(root.join(format!("big/file{i:05}")), i.to_string()).unwrap();
    }
    let remote = Remote::new(&root, 60_000);
    let c = client(&remote, &t.path().join("c"), Duration::from_secs(5));
    let dir = c.lookup(ROOT, b"big").unwrap();
    let r0 = c.traffic().unwrap().round_trips;
    // `ls -l`: the listing, then every entry's attributes.
    let entries = c.readdir(dir.ino).unwrap();
    assert_eq!(entries.len(), 5000);
    for (_, _, name) in &entries {
        let s = c.lookup(dir.ino, name).unwrap();
        assert_eq!(c.getattr(s.ino).unwrap().size, s.size);
    }
    assert_eq!(c.traffic().unwrap().round_trips - r0, 1);
    // A name that is not there is known not to be, without asking.
    assert_eq!(c.lookup(dir.ino, b"nope").unwrap_err(), Errno::ENOENT);
    assert_eq!(c.traffic().unwrap().round_trips - r0, 1);
}

/// A path too long for the server is ENAMETOOLONG (as on a local file system), not EINVAL.
#[test]
fn a_path_too_long_is_enametoolong() {
    let (_t, _root, _remote, v) = one_client();
    let mut dir = ROOT;
    for _ in 0..16 {
        dir = v.mkdir(dir, &[b'd'; 250], 0o755).unwrap().ino;
    }
    // 16 × 251 bytes so far: one more such name passes 4,096.
    assert_eq!(
        v.mkdir(dir, &[b'd'; 250], 0o755).unwrap_err(),
        Errno::ENAMETOOLONG
    );
    assert_eq!(
        v.create(dir, &[b'f'; 300], 0o644, false).unwrap_err(),
        Errno::ENAMETOOLONG
    );
}

/// A file being written while its directory is renamed is written back at its new path (its
/// copy was looked for under the old one: the write-back failed for ever).
#[test]
fn a_file_open_for_writing_follows_its_directory_renamed() {
    let (_t, root, _remote, v) = one_client();
    let d = v.mkdir(ROOT, b"d", 0o755).unwrap();
    let (_, o) = v.create(d.ino, b"f", 0o644, false).unwrap();
    v.write(o.fh, 0, b"written before the rename").unwrap();
    v.rename(ROOT, b"d", ROOT, b"e", false).unwrap();
    v.write(o.fh, 25, b", and after").unwrap();
    v.flush(o.fh).unwrap();
    v.release(o.fh).unwrap();
    assert_eq!(
        std::fs::read(root.join("e/f")).unwrap(),
        b"written before the rename, and after"
    );
    assert_eq!(v.write_back_all(), 0);
}

/// A changed file whose local copy is gone (removed from the cache by hand, say) is dropped
/// from the write-back once, said so, instead of being tried again at every retry for ever.
#[test]
fn a_changed_file_whose_copy_is_gone_is_not_retried_for_ever() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("export");
    std::fs::create_dir(&root).unwrap();
    let remote = Remote::new(&root, 60_000);
    let cache = t.path().join("c");
    let v = client(&remote, &cache, Duration::from_secs(2));
    write(&v, "f", b"first").unwrap();
    remote.stop();
    // The server is gone: the change stays in the cache, dirty.
    let _ = write(&v, "f", b"second version");
    remote.start();
    for e in std::fs::read_dir(cache.join("files")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none() {
            std::fs::remove_file(p).unwrap();
        }
    }
    v.write_back_all();
    assert_eq!(
        v.write_back_all(),
        0,
        "the record without a copy is dropped"
    );
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"first");
}

#[test]
fn statfs_is_the_servers_file_system_and_its_last_answer_offline() {
    let (_t, root, remote, v) = one_client();
    let want = rustix::fs::statvfs(&root).unwrap();
    let f = v.statfs();
    assert_eq!(
        (f.block_size as u64, f.blocks, f.files, f.name_max as u64),
        (want.f_frsize, want.f_blocks, want.f_files, want.f_namemax)
    );
    assert!(
        f.blocks_avail <= f.blocks_free && f.blocks_free <= f.blocks,
        "{f:?}"
    );
    remote.stop();
    settle(&[&v]);
    assert_eq!(v.statfs(), f);
}

/// A file being written is looked up with its local size and time, not the server's (the
/// empty version its create made): the kernel takes a lookup's size as the file's, and reads
/// past it end early (`git clone` into a mount: "premature end of pack file").
#[test]
fn a_file_being_written_is_looked_up_with_its_local_size() {
    let (_t, _root, _remote, v) = one_client();
    let (f, o) = v.create(ROOT, b"pack", 0o644, false).unwrap();
    v.write(o.fh, 0, &[7u8; 5000]).unwrap();
    v.setattr(f.ino, None, None, Some(1_000_000_000)).unwrap();
    let s = v.lookup(ROOT, b"pack").unwrap();
    assert_eq!((s.ino, s.size, s.mtime_ns), (f.ino, 5000, 1_000_000_000));
    v.forget(f.ino, 1);
    v.release(o.fh).unwrap();
    let s = v.lookup(ROOT, b"pack").unwrap();
    assert_eq!((s.size, s.mtime_ns), (5000, 1_000_000_000));
}

/// A create labels its empty copy dirty (its first write then syncs no record); closed
/// unwritten, the copy is clean again: a later run does not write the empty file back over
/// what another client wrote meanwhile.
#[test]
fn a_file_created_and_closed_unwritten_is_not_written_back_later() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("export");
    std::fs::create_dir(&root).unwrap();
    let remote = Remote::new(&root, 60_000);
    let cache = t.path().join("c");
    {
        let v = client(&remote, &cache, Duration::from_secs(5));
        let (_, o) = v.create(ROOT, b"f", 0o644, true).unwrap();
        v.release(o.fh).unwrap();
        v.shutdown();
    }
    std::fs::write(root.join("f"), b"another client's").unwrap();
    let v = client(&remote, &cache, Duration::from_secs(5));
    assert_eq!(v.write_back_all(), 0);
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"another client's");
}

/// FIFOs, sockets and device nodes live in the mount only: made, listed with their type,
/// looked up, chmod-ed, renamed (over a server file, which goes), removed; never on the server,
/// and never over a name that exists. A directory holding one is not empty.
#[test]
fn special_files_live_in_the_mount_only() {
    use ferry_mount::SpecialKind;
    let (_t, root, _remote, v) = one_client();
    let d = v.mkdir(ROOT, b"d", 0o755).unwrap();
    let p = v
        .mknod(d.ino, b"pipe", SpecialKind::Fifo, 0o640, 0)
        .unwrap();
    assert_eq!(p.special, Some((SpecialKind::Fifo, 0)));
    assert_eq!(p.mode, 0o640);
    // Its directory's times move, here (the server never hears of it).
    let dir = v.getattr(d.ino).unwrap();
    assert!(
        dir.mtime_ns > d.mtime_ns && dir.ctime_ns > d.ctime_ns,
        "{dir:?} {d:?}"
    );
    let c = v
        .mknod(ROOT, b"null", SpecialKind::CharDevice, 0o666, 0x0103)
        .unwrap();
    assert_eq!(c.special, Some((SpecialKind::CharDevice, 0x0103)));
    assert!(!root.join("d/pipe").exists() && !root.join("null").exists());
    // Taken names: a special file's, and the server's.
    assert_eq!(
        v.mknod(d.ino, b"pipe", SpecialKind::Socket, 0o600, 0)
            .unwrap_err(),
        Errno::EEXIST
    );
    std::fs::write(root.join("d/f"), b"server").unwrap();
    assert_eq!(
        v.mknod(d.ino, b"f", SpecialKind::Fifo, 0o600, 0)
            .unwrap_err(),
        Errno::EEXIST
    );
    // Listed with the server's names, and looked up.
    let names: Vec<Vec<u8>> = v.readdir(d.ino).unwrap().into_iter().map(|e| e.2).collect();
    assert_eq!(names, vec![b"f".to_vec(), b"pipe".to_vec()]);
    let found = v.lookup(d.ino, b"pipe").unwrap();
    assert_eq!(found.ino, p.ino);
    assert_eq!(v.special_of(p.ino), Some(SpecialKind::Fifo));
    // chmod and times here; a size is refused.
    let s = v
        .setattr(p.ino, Some(0o600), None, Some(1_000_000_000))
        .unwrap();
    assert_eq!((s.mode, s.mtime_ns), (0o600, 1_000_000_000));
    assert!(s.ctime_ns > 1_000_000_000);
    assert_eq!(
        v.setattr(p.ino, None, Some(0), None).unwrap_err(),
        Errno::EINVAL
    );
    // Not empty, for rmdir; not a directory, for rmdir of itself.
    assert_eq!(v.rmdir(ROOT, b"d").unwrap_err(), Errno::ENOTEMPTY);
    assert_eq!(v.rmdir(d.ino, b"pipe").unwrap_err(), Errno::ENOTDIR);
    // Renamed over the server's file: that one goes, on the server too.
    v.rename(d.ino, b"pipe", d.ino, b"f", false).unwrap();
    assert!(!root.join("d/f").exists());
    assert_eq!(
        v.getattr(p.ino).unwrap().special,
        Some((SpecialKind::Fifo, 0))
    );
    assert_eq!(v.lookup(d.ino, b"pipe").unwrap_err(), Errno::ENOENT);
    // The directory moves on the server, the special file with it.
    v.rename(ROOT, b"d", ROOT, b"e", false).unwrap();
    let e = v.lookup(ROOT, b"e").unwrap();
    assert_eq!(
        v.lookup(e.ino, b"f").unwrap().special,
        Some((SpecialKind::Fifo, 0))
    );
    // Removed here; then the directory is empty, and changed again.
    let before = v.getattr(e.ino).unwrap().mtime_ns;
    v.unlink(e.ino, b"f").unwrap();
    assert!(v.getattr(e.ino).unwrap().mtime_ns > before);
    assert_eq!(v.lookup(e.ino, b"f").unwrap_err(), Errno::ENOENT);
    v.rmdir(ROOT, b"e").unwrap();
    assert!(!root.join("e").exists());
}
