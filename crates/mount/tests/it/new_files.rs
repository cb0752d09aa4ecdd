//! What a new file costs to write back.

use std::time::Duration;

use ferry_mount::{Errno, Vfs, ROOT};

use super::{bytes, one_client};

fn rt(v: &Vfs) -> u64 {
    v.traffic().unwrap().round_trips
}

/// A new file of new data under 32 KiB made where the leased listing says its name is free is
/// committed without waiting: its close queues the create, data and commit, which go with the
/// next operation's requests (here: `send_changes`, the mount's thread's call) in one round
/// trip. Meanwhile it is this mount's, read and stat'ed here with no wait (`make` stats each
/// object file it made), and the change time seen then stays the file's once the server has
/// it. One whose data came from the server (a copy of a file read here) asks what the server
/// holds first, at its close.
#[test]
fn a_new_small_file_goes_with_its_commit() {
    let (_t, root, _remote, v) = one_client();
    let data = bytes(1, 20_000);
    // The listing, leased: the create is made here, and by its commit on the server.
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    let r0 = rt(&v);
    super::make(&v, ROOT, b"journal", &data, false);
    assert_eq!(rt(&v), r0, "queued");
    assert!(!root.join("journal").exists());
    // A look at it after the close shows the copy: nothing is sent for it.
    let j = v.lookup(ROOT, b"journal").unwrap();
    let a = v.getattr(j.ino).unwrap();
    assert_eq!((j.size, a.size, a.ctime_ns), (20_000, 20_000, j.ctime_ns));
    assert_eq!(super::read(&v, "journal").unwrap(), data);
    assert_eq!(rt(&v), r0, "still queued");
    assert!(!root.join("journal").exists());
    v.send_changes(Duration::ZERO);
    assert_eq!(rt(&v) - r0, 1, "the commit, with the data");
    assert_eq!(std::fs::read(root.join("journal")).unwrap(), data);
    // The server's change time is its rename's, later than the copy's: the one shown stays.
    let m = std::fs::metadata(root.join("journal")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert!(m.ctime() * 1_000_000_000 + m.ctime_nsec() >= a.ctime_ns);
    let after = v.getattr(j.ino).unwrap();
    assert_eq!(
        (after.size, after.mtime_ns, after.ctime_ns),
        (a.size, a.mtime_ns, a.ctime_ns)
    );
    // A change on the server moves it.
    std::fs::set_permissions(
        root.join("journal"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    v.expire_leases();
    let changed = v.getattr(j.ino).unwrap();
    let m = std::fs::metadata(root.join("journal")).unwrap();
    assert_eq!(changed.mode, 0o600);
    assert_eq!(changed.ctime_ns, m.ctime() * 1_000_000_000 + m.ctime_nsec());
    // A copy: its chunks are in the cache (read from the server).
    std::fs::write(root.join("orig"), bytes(2, 20_000)).unwrap();
    v.expire_leases();
    let copy = super::read(&v, "orig").unwrap();
    let r1 = rt(&v);
    super::make(&v, ROOT, b"copy", &copy, false);
    assert_eq!(rt(&v) - r1, 2, "what the server holds, then the commit");
    assert_eq!(std::fs::read(root.join("copy")).unwrap(), copy);
}

/// A chmod of a new file whose commit is still queued goes with that commit, and moves the
/// change time shown, as on any file (the POSIX suite's `chmod::update_ctime`).
#[test]
fn a_chmod_of_a_queued_new_file_moves_its_change_time() {
    let (_t, root, _remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    let r0 = rt(&v);
    super::make(&v, ROOT, b"f", b"made here", false);
    let f = v.lookup(ROOT, b"f").unwrap();
    // (Past the coarse clock's tick, at most 10 ms, that file times are taken from.)
    std::thread::sleep(Duration::from_millis(20));
    let s = v.setattr(f.ino, Some(0o600), None, None).unwrap();
    assert_eq!(s.mode, 0o600);
    assert!(
        s.ctime_ns > f.ctime_ns,
        "{} after {}",
        s.ctime_ns,
        f.ctime_ns
    );
    assert_eq!(v.getattr(f.ino).unwrap().ctime_ns, s.ctime_ns);
    assert_eq!(rt(&v), r0, "all queued");
    v.send_changes(Duration::ZERO);
    assert_eq!(rt(&v) - r0, 1);
    use std::os::unix::fs::PermissionsExt;
    let m = std::fs::metadata(root.join("f")).unwrap();
    assert_eq!(m.permissions().mode() & 0o7777, 0o600);
    assert_eq!(v.getattr(f.ino).unwrap().ctime_ns, s.ctime_ns);
}

/// `make`: each object file's commit is queued at its close, and the fetch of the next source
/// takes it along, in the fetch's round trip (a fetch of a file over 1 MiB sends it first, on
/// its own, so that its answer is not held behind a long transfer).
#[test]
fn a_small_fetch_takes_the_queued_commits_along() {
    let (_t, root, _remote, v) = one_client();
    std::fs::write(root.join("m01.c"), bytes(3, 5_000)).unwrap();
    assert!(v.lookup(ROOT, b"m01.c").is_ok());
    let r0 = rt(&v);
    super::make(&v, ROOT, b"m00.o", b"object code", false);
    assert_eq!(rt(&v), r0, "queued");
    assert_eq!(super::read(&v, "m01.c").unwrap(), bytes(3, 5_000));
    assert_eq!(rt(&v) - r0, 1, "the commit and the fetch together");
    assert_eq!(std::fs::read(root.join("m00.o")).unwrap(), b"object code");
}

/// A script's way (`> f.tmp && mv f.tmp f`): a new file renamed over the file (or onto a
/// free name) before its queued commit went. The commit is made under the new name, replacing
/// what was there: no round trip of the rename's own, one for all; the temporary name never
/// reaches the server. (One made with `O_EXCL` waits for its commit's answer: see
/// `a_queued_exclusive_create_that_lost_the_race_leaves_their_file`.)
#[test]
fn a_new_file_renamed_before_its_commit_went_is_committed_under_its_new_name() {
    let (_t, root, _remote, v) = one_client();
    std::fs::write(root.join("f"), b"the old version").unwrap();
    assert!(v.lookup(ROOT, b"f").is_ok());
    let r0 = rt(&v);
    let (t, o) = v.create_later(ROOT, b".f.XXXX", 0o600).unwrap();
    v.write(o.fh, 0, b"the new version").unwrap();
    v.setattr(t.ino, Some(0o644), None, Some(1_500_000_000_000_000_000))
        .unwrap();
    v.flush(o.fh).unwrap();
    v.release(o.fh).unwrap();
    v.rename(ROOT, b".f.XXXX", ROOT, b"f", false).unwrap();
    // GNU mv's way onto a free name: renameat2 with RENAME_NOREPLACE.
    super::make(&v, ROOT, b".g.XXXX", b"a new file", false);
    v.rename(ROOT, b".g.XXXX", ROOT, b"g", true).unwrap();
    assert_eq!(rt(&v), r0, "all queued");
    assert_eq!(super::read(&v, "f").unwrap(), b"the new version");
    assert_eq!(v.lookup(ROOT, b".f.XXXX").unwrap_err(), Errno::ENOENT);
    v.send_changes(Duration::ZERO);
    assert_eq!(rt(&v) - r0, 1, "one for all");
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"the new version");
    assert_eq!(std::fs::read(root.join("g")).unwrap(), b"a new file");
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(root.join("f")).unwrap();
    assert_eq!(
        (m.mode() & 0o7777, m.mtime()),
        (0o644, 1_500_000_000),
        "its mode and time"
    );
    for tmp in [".f.XXXX", ".g.XXXX"] {
        assert!(!root.join(tmp).exists(), "{tmp}");
    }
    // Known here as the server has it: read with no round trip, written again against it.
    assert_eq!(super::read(&v, "f").unwrap(), b"the new version");
    assert_eq!(rt(&v) - r0, 1);
}

/// A file the leases do not vouch for (changed on the server since it was looked up) is not
/// replaced blindly: the commit that was to replace it is refused, and the file written
/// again over the server's (the last rename wins), its content the one renamed here.
#[test]
fn a_rename_over_a_file_changed_meanwhile_ends_with_the_renamed_file() {
    let (_t, root, _remote, v) = one_client();
    std::fs::write(root.join("f"), b"old").unwrap();
    assert!(v.lookup(ROOT, b"f").is_ok());
    super::make(&v, ROOT, b".f.tmp", b"renamed here", false);
    let r0 = rt(&v);
    v.rename(ROOT, b".f.tmp", ROOT, b"f", false).unwrap();
    assert_eq!(rt(&v), r0, "queued");
    // Someone else's change, not yet seen here.
    std::fs::write(root.join("f"), b"theirs, longer than the old").unwrap();
    v.send_changes(Duration::ZERO);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::fs::read(root.join("f")).unwrap() != b"renamed here" {
        assert!(std::time::Instant::now() < deadline, "never written again");
        v.tick();
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(super::read(&v, "f").unwrap(), b"renamed here");
    assert!(!root.join(".f.tmp").exists());
}

/// GNU mv's way: `renameat2(RENAME_NOREPLACE)` first. Onto a name the leased listing holds it
/// fails at once (mv then renames over it: that goes with the commit); onto a name the
/// listing says is free it goes with the commit too, and if someone else made the name
/// meanwhile the file is written again over theirs (the last rename wins).
#[test]
fn a_noreplace_rename_of_a_queued_new_file() {
    let (_t, root, _remote, v) = one_client();
    std::fs::write(root.join("taken"), b"known here").unwrap();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    super::make(&v, ROOT, b"a.tmp", b"mine", false);
    let r0 = rt(&v);
    assert_eq!(
        v.rename(ROOT, b"a.tmp", ROOT, b"taken", true).unwrap_err(),
        Errno::EEXIST
    );
    v.rename(ROOT, b"a.tmp", ROOT, b"taken", false).unwrap();
    super::make(&v, ROOT, b"b.tmp", b"mine too", false);
    v.rename(ROOT, b"b.tmp", ROOT, b"b", true).unwrap();
    assert_eq!(rt(&v), r0, "all queued");
    std::fs::write(root.join("b"), b"theirs").unwrap();
    v.send_changes(Duration::ZERO);
    assert_eq!(std::fs::read(root.join("taken")).unwrap(), b"mine");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::fs::read(root.join("b")).unwrap() != b"mine too" {
        assert!(std::time::Instant::now() < deadline, "never written again");
        v.tick();
        std::thread::sleep(Duration::from_millis(10));
    }
    for tmp in ["a.tmp", "b.tmp"] {
        assert!(!root.join(tmp).exists(), "{tmp}");
    }
}

/// Changes queued before the rename go first: a removal of the name (`rm x; mv x.tmp x`), and
/// a file renamed twice before the queue went ends under its last name only, the file its
/// first rename replaced gone too.
#[test]
fn a_queued_new_file_renamed_keeps_the_order_of_changes() {
    let (_t, root, _remote, v) = one_client();
    for f in ["x", "b"] {
        std::fs::write(root.join(f), b"old").unwrap();
    }
    assert!(v.lookup(ROOT, b"x").is_ok() && v.lookup(ROOT, b"b").is_ok());
    super::make(&v, ROOT, b"x.tmp", b"new x", false);
    v.unlink(ROOT, b"x").unwrap();
    v.rename(ROOT, b"x.tmp", ROOT, b"x", true).unwrap();
    super::make(&v, ROOT, b"a.tmp", b"moved twice", false);
    v.rename(ROOT, b"a.tmp", ROOT, b"b", false).unwrap();
    v.rename(ROOT, b"b", ROOT, b"c", false).unwrap();
    v.send_changes(Duration::ZERO);
    assert_eq!(std::fs::read(root.join("x")).unwrap(), b"new x");
    assert_eq!(std::fs::read(root.join("c")).unwrap(), b"moved twice");
    for gone in ["x.tmp", "a.tmp", "b"] {
        assert!(!root.join(gone).exists(), "{gone}");
    }
    assert_eq!(super::read(&v, "c").unwrap(), b"moved twice");
    assert_eq!(v.lookup(ROOT, b"b").unwrap_err(), Errno::ENOENT);
}

/// With `strict_close`, nothing is queued: the close returns once the server has the file,
/// and a removal once the server made it.
#[test]
fn with_strict_close_the_close_waits_for_the_commit() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("export");
    std::fs::create_dir(&root).unwrap();
    let remote = super::Remote::new(&root, 60_000);
    let v = super::client_with(&remote, &t.path().join("c"), Duration::from_secs(5), true);
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    let r0 = rt(&v);
    super::make(&v, ROOT, b"f", b"at once", true);
    assert_eq!(rt(&v) - r0, 1, "the commit, waited for");
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"at once");
    v.unlink(ROOT, b"f").unwrap();
    assert_eq!(rt(&v) - r0, 2, "the removal, waited for");
    assert!(!root.join("f").exists());
}

/// `tar x` of many small files, each's time and mode set before its close (on the open file,
/// as GNU tar and `cp -a` do): the files and their attributes go to the server together, in
/// one round trip. A look at one after sends the queue first (`ls -l`: one round trip for all).
#[test]
fn new_files_and_their_attributes_go_together() {
    use std::os::unix::fs::MetadataExt;
    let (_t, root, _remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    let d = v.mkdir(ROOT, b"d", 0o755).unwrap();
    let r0 = rt(&v);
    let when = 1_400_000_000 * 1_000_000_000i64;
    for i in 0..50u64 {
        let name = format!("f{i:02}");
        let (f, o) = v.create_excl(d.ino, name.as_bytes(), 0o644).unwrap();
        v.write(o.fh, 0, &bytes(i, 100 + i as usize * 50)).unwrap();
        let s = v
            .setattr(f.ino, Some(0o600), None, Some(when + i as i64))
            .unwrap();
        assert_eq!((s.mode, s.mtime_ns), (0o600, when + i as i64));
        v.flush(o.fh).unwrap();
        v.release(o.fh).unwrap();
    }
    assert_eq!(rt(&v), r0, "all queued");
    v.send_changes(Duration::ZERO);
    assert_eq!(rt(&v) - r0, 1, "one round trip for all");
    for i in 0..50u64 {
        let p = root.join(format!("d/f{i:02}"));
        assert_eq!(std::fs::read(&p).unwrap(), bytes(i, 100 + i as usize * 50));
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o600);
        assert_eq!(m.mtime() * 1_000_000_000 + m.mtime_nsec(), when + i as i64);
    }
    // Known here as the server has them: nothing asked.
    let f = v.lookup(d.ino, b"f07").unwrap();
    assert_eq!(v.getattr(f.ino).unwrap().mtime_ns, when + 7);
    let o = v.open(f.ino, false, false).unwrap();
    assert_eq!(v.read(o.fh, 0, 1000).unwrap(), bytes(7, 450));
    v.release(o.fh).unwrap();
    assert_eq!(rt(&v) - r0, 1);
}

/// A new file removed before its queued commit went (a scratch file, a lock taken and let go)
/// never reaches the server; one renamed, or fsync'ed, is committed first.
#[test]
fn a_new_file_removed_before_its_commit_went_never_reaches_the_server() {
    let (_t, root, remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    let n0 = super::requests(&v);
    super::make(&v, ROOT, b"scratch", b"gone soon", true);
    v.unlink(ROOT, b"scratch").unwrap();
    v.send_changes(Duration::ZERO);
    assert_eq!(super::requests(&v), n0, "nothing sent");
    assert_eq!(v.lookup(ROOT, b"scratch").unwrap_err(), Errno::ENOENT);
    assert!(!root.join("scratch").exists());
    // Renamed: committed, then renamed (queued).
    super::make(&v, ROOT, b"a.tmp", b"renamed", true);
    v.rename(ROOT, b"a.tmp", ROOT, b"a", false).unwrap();
    v.send_changes(Duration::ZERO);
    assert_eq!(std::fs::read(root.join("a")).unwrap(), b"renamed");
    assert!(!root.join("a.tmp").exists());
    // fsync'ed: committed and made durable on the server before it returns.
    let (_, o) = v.create_excl(ROOT, b"synced", 0o644).unwrap();
    v.write(o.fh, 0, b"durable").unwrap();
    v.flush(o.fh).unwrap();
    let s0 = remote.syncs(0);
    v.fsync(o.fh).unwrap();
    assert_eq!(std::fs::read(root.join("synced")).unwrap(), b"durable");
    assert!(remote.syncs(0) > s0, "a Sync went");
    v.release(o.fh).unwrap();
}

/// A new file removed while its queued commit is on its way (`rm -rf` right after `tar x`):
/// the removal waits for the commit's answer, then removes it on the server too. (It once
/// took the file for one never sent, and removed it here only.)
#[test]
fn a_new_file_removed_while_its_commit_is_on_its_way_goes_on_the_server_too() {
    let (_t, root, remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    super::make(&v, ROOT, b"f", b"soon gone", true);
    remote.hold(0);
    std::thread::scope(|s| {
        let sender = s.spawn(|| v.send_changes(Duration::ZERO));
        remote.wait_held();
        let rm = s.spawn(|| v.unlink(ROOT, b"f"));
        // The removal waits for the commit on its way, over a second session.
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while remote.sessions_made() < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the removal never waited"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        remote.free();
        sender.join().unwrap();
        rm.join().unwrap().unwrap();
    });
    v.send_changes(Duration::ZERO);
    assert!(!root.join("f").exists());
    assert_eq!(v.lookup(ROOT, b"f").unwrap_err(), Errno::ENOENT);
}

/// A new file written again and closed while its queued commit is on its way (mkstemp, write,
/// close, reopen, append): the second commit waits for the first's answer and goes against
/// the version it made. (It could go as a second create when the first answer had arrived but
/// was not yet applied, and the exclusive create's conflict with its own first commit dropped
/// the file.)
#[test]
fn a_new_file_written_again_while_its_commit_is_on_its_way_keeps_both_writes() {
    let (_t, root, remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    let (f, o) = v.create_excl(ROOT, b"f", 0o600).unwrap();
    v.write(o.fh, 0, b"first").unwrap();
    v.flush(o.fh).unwrap();
    remote.hold(0);
    std::thread::scope(|s| {
        let sender = s.spawn(|| v.send_changes(Duration::ZERO));
        remote.wait_held();
        let again = s.spawn(|| {
            v.write(o.fh, 5, b", second").unwrap();
            v.flush(o.fh)
        });
        // The second close waits for the first commit, over a second session.
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while remote.sessions_made() < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the close never waited"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        remote.free();
        sender.join().unwrap();
        again.join().unwrap().unwrap();
    });
    v.release(o.fh).unwrap();
    v.send_changes(Duration::ZERO);
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"first, second");
    assert_eq!(v.getattr(f.ino).unwrap().size, 13);
}

/// An exclusive create (`cp`, `tar x`, `git`'s checkout and lock files) where the leased
/// listing says the name is absent is made by its commit: no round trip of its own.
#[test]
fn an_exclusive_create_is_made_by_its_commit() {
    let (_t, root, _remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    let r0 = rt(&v);
    super::make(&v, ROOT, b"index.lock", b"locked", true);
    v.send_changes(Duration::ZERO);
    assert_eq!(rt(&v) - r0, 1, "the commit, with the data");
    assert_eq!(std::fs::read(root.join("index.lock")).unwrap(), b"locked");
    // The name is taken now: another exclusive create of it is refused, here.
    let r1 = rt(&v);
    assert_eq!(
        v.create_excl(ROOT, b"index.lock", 0o644).unwrap_err(),
        Errno::EEXIST
    );
    assert_eq!(rt(&v), r1);
}

/// Someone else made the name after the listing was leased, and the server's word of it has
/// not been taken yet: the exclusive create succeeds here, but its commit leaves their file.
/// Committed at the close (a file too large to queue), the close fails with EEXIST; queued
/// (the next test), the data is dropped (said in the log), and a rename of it fails. Either
/// way the name is theirs here too afterwards.
#[test]
fn an_exclusive_create_that_lost_the_race_leaves_their_file() {
    let (_t, root, _remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    std::fs::write(root.join("lock"), b"theirs").unwrap();
    let (_, o) = v.create_excl(ROOT, b"lock", 0o644).unwrap();
    v.write(o.fh, 0, &bytes(3, 40_000)).unwrap();
    assert_eq!(v.flush(o.fh).unwrap_err(), Errno::EEXIST);
    v.release(o.fh).unwrap();
    assert_eq!(std::fs::read(root.join("lock")).unwrap(), b"theirs");
    assert_eq!(super::read(&v, "lock").unwrap(), b"theirs");
}

/// Likewise for a queued commit.
#[test]
fn a_queued_exclusive_create_that_lost_the_race_leaves_their_file() {
    let (_t, root, _remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    std::fs::write(root.join("lock2"), b"theirs too").unwrap();
    super::make(&v, ROOT, b"lock2", b"mine", true);
    assert_eq!(
        v.rename(ROOT, b"lock2", ROOT, b"taken", false).unwrap_err(),
        Errno::ENOENT
    );
    assert_eq!(std::fs::read(root.join("lock2")).unwrap(), b"theirs too");
    assert!(!root.join("taken").exists());
    assert_eq!(super::read(&v, "lock2").unwrap(), b"theirs too");
}

/// A directory made in a leased directory is made here at once, its (empty) listing leased,
/// and its making queued: the files made in it next are looked up and created there without
/// asking, and the directory, the file and its commit reach the server in one round trip.
/// (The first directory is made at once: what an empty one's size is on the server is learnt
/// from it.) It shows what the server then says, but for its times.
#[test]
fn a_new_directory_is_made_with_its_files_in_one_round_trip() {
    let (_t, root, _remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    let r0 = rt(&v);
    v.mkdir(ROOT, b"first", 0o755).unwrap();
    assert_eq!(rt(&v) - r0, 1, "the first mkdir, at once");
    let r0 = rt(&v);
    let d = v.mkdir(ROOT, b"d", 0o750).unwrap();
    let e = v.mkdir(d.ino, b"e", 0o700).unwrap();
    assert_eq!(rt(&v) - r0, 0, "the mkdirs are queued");
    let here = v.getattr(d.ino).unwrap();
    assert_eq!((here.mode, here.nlink), (0o750, 3));
    let shown = |s: &ferry_mount::Stat| (s.ino, s.kind, s.mode, s.nlink, s.size, s.blocks);
    let e_here = v.getattr(e.ino).unwrap();
    assert_eq!(v.lookup(d.ino, b"a.rs").unwrap_err(), Errno::ENOENT);
    super::make(&v, d.ino, b"a.rs", b"fn main() {}", true);
    super::make(&v, e.ino, b"b.rs", b"fn b() {}", true);
    assert_eq!(
        v.readdir(d.ino).unwrap().len(),
        2,
        "a.rs and e, listed here"
    );
    assert!(!root.join("d").exists(), "not sent yet");
    v.send_changes(Duration::ZERO);
    assert_eq!(rt(&v) - r0, 1, "the mkdirs and the files' commits together");
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| {
        std::fs::metadata(root.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!((mode("d"), mode("d/e")), (0o750, 0o700));
    assert_eq!(std::fs::read(root.join("d/a.rs")).unwrap(), b"fn main() {}");
    assert_eq!(std::fs::read(root.join("d/e/b.rs")).unwrap(), b"fn b() {}");
    // The server's attributes came with the answer: all as shown before but the times.
    let a = v.getattr(d.ino).unwrap();
    assert_eq!((a.mode, a.nlink), (0o750, 3));
    assert_eq!(shown(&v.getattr(e.ino).unwrap()), shown(&e_here));
    assert_eq!(rt(&v) - r0, 1);
}

/// A directory whose making was refused (someone made the name meanwhile, unseen here) shows
/// as the server has it once the answer comes: theirs.
#[test]
fn a_queued_directory_that_lost_the_race_is_theirs() {
    let (_t, root, _remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    v.mkdir(ROOT, b"first", 0o755).unwrap();
    std::fs::write(root.join("taken"), b"a file of theirs").unwrap();
    v.mkdir(ROOT, b"taken", 0o755).unwrap();
    v.send_changes(Duration::ZERO);
    assert_eq!(
        std::fs::read(root.join("taken")).unwrap(),
        b"a file of theirs"
    );
    assert_eq!(super::read(&v, "taken").unwrap(), b"a file of theirs");
}

/// A file this mount committed, written again (SQLite's database, a log, an editor's in-place
/// save): the next commit names the chunks it keeps of the version committed here, with
/// nothing asked first: one round trip, not two. Its chunks were kept in the cache as it was
/// committed, so what changed goes compressed against its old version: a few bytes.
#[test]
fn a_file_committed_here_is_committed_again_in_one_round_trip() {
    let (_t, root, _remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    let mut data = bytes(9, 200_000);
    super::make(&v, ROOT, b"db", &data, false);
    let f = v.lookup(ROOT, b"db").unwrap();
    for round in 0..3u8 {
        data[50_000 + round as usize * 1000] ^= 0xff;
        let o = v.open(f.ino, true, false).unwrap();
        let (r0, b0) = (rt(&v), v.traffic().unwrap().bytes_sent);
        v.write(o.fh, 50_000, &data[50_000..53_000]).unwrap();
        v.flush(o.fh).unwrap();
        assert_eq!(rt(&v) - r0, 1, "round {round}");
        let sent = v.traffic().unwrap().bytes_sent - b0;
        assert!(sent < 2_000, "{sent} bytes for a byte changed");
        v.release(o.fh).unwrap();
        assert_eq!(std::fs::read(root.join("db")).unwrap(), data);
    }
}

/// An fsync of a file still open for writing (SQLite's, each transaction) writes its copy's
/// record once: dirty at the version committed, not clean and then dirty again.
#[test]
fn an_fsync_while_open_writes_one_record() {
    let (_t, root, _remote, v) = one_client();
    let mut data = bytes(4, 100_000);
    super::make(&v, ROOT, b"db", &data, false);
    let f = v.lookup(ROOT, b"db").unwrap();
    let o = v.open(f.ino, true, false).unwrap();
    for round in 0..3u8 {
        data[4096 * round as usize] ^= 0xff;
        let at = 4096 * round as u64;
        v.write(o.fh, at, &data[at as usize..at as usize + 4096])
            .unwrap();
        let before = v.records_written();
        v.fsync(o.fh).unwrap();
        assert_eq!(v.records_written() - before, 1, "round {round}");
        assert_eq!(std::fs::read(root.join("db")).unwrap(), data);
    }
    // Closed unwritten since: labelled clean.
    let before = v.records_written();
    v.release(o.fh).unwrap();
    assert_eq!(v.records_written() - before, 1);
}

/// A directory's mode and time set once its files are in (`cp -a`, `tar x`) go with the queue
/// too, in the round trip that takes the files; one made unwritable by its owner is changed at
/// once (the creations queued after it could not be made).
#[test]
fn a_directorys_times_go_with_its_files() {
    use std::os::unix::fs::MetadataExt;
    let (_t, root, _remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    let d = v.mkdir(ROOT, b"d", 0o755).unwrap();
    let r0 = rt(&v);
    let when = 1_400_000_000 * 1_000_000_000i64;
    for i in 0..5u64 {
        super::make(&v, d.ino, format!("f{i}").as_bytes(), &bytes(i, 200), true);
    }
    let s = v.setattr(d.ino, Some(0o750), None, Some(when)).unwrap();
    assert_eq!((s.mode, s.mtime_ns), (0o750, when));
    assert_eq!(rt(&v), r0, "all queued");
    v.send_changes(Duration::ZERO);
    assert_eq!(rt(&v) - r0, 1, "one round trip for all");
    let m = std::fs::metadata(root.join("d")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o750);
    assert_eq!(m.mtime() * 1_000_000_000 + m.mtime_nsec(), when);
    assert_eq!(v.getattr(d.ino).unwrap().mtime_ns, when);
    // Made unwritable: at once.
    v.setattr(d.ino, Some(0o555), None, None).unwrap();
    assert_eq!(rt(&v) - r0, 2);
    let m = std::fs::metadata(root.join("d")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o555);
}

/// A file made here whose directory the server lacks when its commit comes (the directory's
/// queued making lost with the link or a crash, or someone removed it meanwhile) is not left
/// behind: the next write-back makes the directory again and the file in it.
#[test]
fn a_new_file_whose_directory_is_gone_makes_it_again() {
    let (_t, root, _remote, v) = one_client();
    std::fs::create_dir(root.join("d")).unwrap();
    let d = v.lookup(ROOT, b"d").unwrap();
    assert_eq!(v.lookup(d.ino, b"none").unwrap_err(), Errno::ENOENT);
    super::make(&v, d.ino, b"f", b"kept", false);
    std::fs::remove_dir(root.join("d")).unwrap();
    v.send_changes(Duration::ZERO);
    assert!(!root.join("d").exists(), "refused: no directory");
    assert_eq!(v.write_back_all(), 0);
    assert_eq!(std::fs::read(root.join("d/f")).unwrap(), b"kept");
}
