//! Attributes: modes, times, link counts, as set here and as the server has them.

use super::*;

/// rsync sets a new file's time, then its mode, right after its close, while the kernel's
/// release (on another thread) commits the time: a mode set while that commit is under way is
/// committed after it, not lost (it was, 1 file in 200 of an `rsync -a` on a busy machine).
/// (A file too large for its commit to be queued.)
#[test]
fn a_mode_set_while_the_release_commits_is_not_lost() {
    use std::os::unix::fs::MetadataExt;
    let (_t, root, remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    let (f, o) = v.create_excl(ROOT, b"f", 0o600).unwrap();
    v.write(o.fh, 0, &super::bytes(5, 40_000)).unwrap();
    v.flush(o.fh).unwrap();
    let when = 1_500_000_000 * 1_000_000_000i64;
    v.setattr(f.ino, None, None, Some(when)).unwrap();
    remote.hold(0);
    std::thread::scope(|s| {
        let release = s.spawn(|| v.release(o.fh));
        remote.wait_held();
        let chmod = s.spawn(|| v.setattr(f.ino, Some(0o644), None, None));
        let deadline = Instant::now() + Duration::from_secs(120);
        while v.getattr(f.ino).unwrap().mode != 0o644 {
            assert!(Instant::now() < deadline, "the chmod was not made here");
            std::thread::sleep(Duration::from_millis(5));
        }
        remote.free();
        release.join().unwrap().unwrap();
        chmod.join().unwrap().unwrap();
    });
    v.send_changes(Duration::ZERO);
    let m = std::fs::metadata(root.join("f")).unwrap();
    assert_eq!((m.mode() & 0o7777, m.mtime()), (0o644, 1_500_000_000));
}

/// `rsync` and `tar x` set a file's time after its close: the copy here stays the file's (the
/// server reads a small file again and names the same object at the new version), so the next
/// open asks nothing.
#[test]
fn setting_a_time_keeps_the_copy() {
    let (_t, root, _remote, c) = one_client();
    let rt = |c: &Vfs| c.traffic().unwrap().round_trips;
    let (f, o) = c.create(ROOT, b"f", 0o600, true).unwrap();
    c.write(o.fh, 0, b"some content").unwrap();
    c.flush(o.fh).unwrap();
    c.release(o.fh).unwrap();
    let when = 1_600_000_000 * 1_000_000_000i64;
    c.setattr(f.ino, None, None, Some(when)).unwrap();
    // (Queued: sent with the next operation, or by the mount's thread.)
    c.send_changes(Duration::ZERO);
    let r0 = rt(&c);
    let o = c.open(f.ino, false, false).unwrap();
    assert_eq!(rt(&c), r0, "the copy is the new version's");
    assert_eq!(c.read(o.fh, 0, 100).unwrap(), b"some content");
    c.release(o.fh).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(root.join("f")).unwrap().mtime(),
        1_600_000_000
    );

    // A mode set on a file just created, still open for writing (rsync's temporary file):
    // it goes with the commit.
    let (g, o) = c.create(ROOT, b"g", 0o600, true).unwrap();
    let r0 = rt(&c);
    c.setattr(g.ino, Some(0o640), None, None).unwrap();
    assert_eq!(rt(&c), r0);
    c.write(o.fh, 0, b"more").unwrap();
    c.flush(o.fh).unwrap();
    c.release(o.fh).unwrap();
    assert_eq!(rt(&c) - r0, 1, "the commit");
    let m = std::fs::metadata(root.join("g")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o640);
    assert_eq!(std::fs::read(root.join("g")).unwrap(), b"more");
}

/// `touch -h` on a symlink in the mount sets the symlink's own time (it failed with EIO), and
/// leaves its target alone.
#[test]
fn a_symlink_takes_its_own_times() {
    use std::os::unix::fs::MetadataExt;
    let (_t, root, _remote, v) = one_client();
    write(&v, "target", b"x").unwrap();
    let target_mtime = std::fs::metadata(root.join("target")).unwrap().mtime();
    let l = v.symlink(ROOT, b"l", b"target").unwrap();
    let s = v
        .setattr(l.ino, None, None, Some(1_500_000_000_000_000_000))
        .unwrap();
    assert_eq!(s.mtime_ns, 1_500_000_000_000_000_000);
    assert_eq!(
        std::fs::symlink_metadata(root.join("l")).unwrap().mtime(),
        1_500_000_000
    );
    assert_eq!(
        std::fs::metadata(root.join("target")).unwrap().mtime(),
        target_mtime
    );
}

/// Link counts: a directory has 2 and one per subdirectory (`find` and `ls` rely on it); a
/// file removed while open has none.
#[test]
fn link_counts_of_directories_and_of_files_removed_while_open() {
    let (_t, _root, _remote, v) = one_client();
    let d = v.mkdir(ROOT, b"d", 0o755).unwrap();
    v.mkdir(d.ino, b"a", 0o755).unwrap();
    v.mkdir(d.ino, b"b", 0o755).unwrap();
    v.readdir(d.ino).unwrap();
    assert_eq!(v.getattr(d.ino).unwrap().nlink, 4);
    let (f, o) = v.create(ROOT, b"f", 0o644, false).unwrap();
    assert_eq!(f.nlink, 1);
    v.write(o.fh, 0, b"data").unwrap();
    v.unlink(ROOT, b"f").unwrap();
    assert_eq!(v.getattr_open(f.ino, Some(o.fh)).unwrap().nlink, 0);
    v.release(o.fh).unwrap();
}

/// `open(O_CREAT|O_EXCL)`, `fchmod`, write, close (every lock file rsync and git make): the
/// write-back is made against the version the chmod made, not a conflict with itself.
#[test]
fn a_chmod_before_the_first_write_is_no_conflict() {
    use std::sync::atomic::Ordering;
    let (_t, root, _remote, v) = one_client();
    for i in 0..3 {
        let name = format!("lock{i}");
        let (s, o) = v.create(ROOT, name.as_bytes(), 0o600, true).unwrap();
        v.setattr(s.ino, Some(0o644), None, None).unwrap();
        v.write(o.fh, 0, b"pid 1234\n").unwrap();
        v.flush(o.fh).unwrap();
        v.release(o.fh).unwrap();
        assert_eq!(std::fs::read(root.join(&name)).unwrap(), b"pid 1234\n");
    }
    assert_eq!(v.counters.last_close_wins.load(Ordering::Relaxed), 0);
}

/// All of stat(2) as the server has it (issue 24, defect 6 and `st_blocks`): access and change
/// times apart from the modification time, the blocks allocated, and a change time that a
/// chmod moves.
#[test]
fn access_and_change_times_and_blocks_are_the_servers() {
    use std::os::unix::fs::MetadataExt;
    let (_t, root, _remote, v) = one_client();
    let f = std::fs::File::create(root.join("f")).unwrap();
    f.set_len(4097).unwrap();
    let at = std::time::UNIX_EPOCH + Duration::from_secs(978_307_200); // 2001-01-01
    let mt = std::time::UNIX_EPOCH + Duration::from_secs(1_009_843_200); // 2002-01-01
    f.set_times(std::fs::FileTimes::new().set_accessed(at).set_modified(mt))
        .unwrap();
    drop(f);
    let m = std::fs::metadata(root.join("f")).unwrap();
    let s = v.lookup(ROOT, b"f").unwrap();
    assert_eq!(s.atime_ns, 978_307_200 * 1_000_000_000);
    assert_eq!(s.mtime_ns, 1_009_843_200 * 1_000_000_000);
    assert_eq!(s.ctime_ns, m.ctime() * 1_000_000_000 + m.ctime_nsec());
    assert_ne!(s.ctime_ns, s.mtime_ns);
    assert_eq!(s.blocks, m.blocks());
    let before = s.ctime_ns;
    let s = v.setattr(s.ino, Some(0o600), None, None).unwrap();
    assert!(
        s.ctime_ns > before,
        "a chmod moves the change time here at once"
    );
    // Once the server made it, its change time is the server's.
    v.send_changes(Duration::ZERO);
    let s = v.getattr(s.ino).unwrap();
    let m = std::fs::metadata(root.join("f")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o600);
    assert_eq!(s.ctime_ns, m.ctime() * 1_000_000_000 + m.ctime_nsec());
    assert_eq!(s.mtime_ns, 1_009_843_200 * 1_000_000_000);
}

/// After a change made here (unlink, create, rename, mkdir), a directory's own times are the
/// server's new ones at once, not the leased ones from before (the server's lease break
/// arrives only with a later reply: `rm`, then `stat` of the directory, read the old mtime
/// for a second; pjdfstest unlink::update_mtime_ctime_success_folder).
#[test]
fn a_directorys_times_after_a_change_made_here_are_the_new_ones() {
    let (_t, root, _remote, v) = one_client();
    let d = v.mkdir(ROOT, b"d", 0o755).unwrap();
    let (_, o) = v.create(d.ino, b"f", 0o644, false).unwrap();
    v.release(o.fh).unwrap();
    let old = std::time::UNIX_EPOCH + Duration::from_secs(978_307_200);
    std::fs::File::open(root.join("d"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    // Asked for (the lease of before the set was broken), then leased.
    let wait = Instant::now() + Duration::from_secs(60);
    while v.getattr(d.ino).unwrap().mtime_ns != 978_307_200 * 1_000_000_000 {
        assert!(Instant::now() < wait, "the server's new time never came");
        v.tick();
        std::thread::sleep(Duration::from_millis(20));
    }
    v.unlink(d.ino, b"f").unwrap();
    assert_ne!(
        v.getattr(d.ino).unwrap().mtime_ns,
        978_307_200 * 1_000_000_000
    );
}

/// A new file's time and mode set after its close, its commit still queued (`rsync -a` sets
/// both on each temporary file), go in that commit as it is: the file is read and cut once,
/// not once more for each change, and the server has both.
#[test]
fn a_time_and_mode_set_after_the_close_go_in_the_queued_commit() {
    use std::os::unix::fs::MetadataExt;
    let (_t, root, _remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    let (f, o) = v.create_excl(ROOT, b".f.XyZ123", 0o600).unwrap();
    v.write(o.fh, 0, b"rsync's temporary file").unwrap();
    v.flush(o.fh).unwrap();
    v.release(o.fh).unwrap();
    let when = 1_500_000_000 * 1_000_000_000i64;
    v.setattr(f.ino, None, None, Some(when)).unwrap();
    let s = v.setattr(f.ino, Some(0o644), None, None).unwrap();
    assert_eq!((s.mode, s.mtime_ns), (0o644, when), "made here at once");
    assert_eq!(v.counters.commits_queued.load(Ordering::Relaxed), 1);
    v.send_changes(Duration::ZERO);
    let m = std::fs::metadata(root.join(".f.XyZ123")).unwrap();
    assert_eq!((m.mode() & 0o7777, m.mtime()), (0o644, 1_500_000_000));
    assert_eq!(
        std::fs::read(root.join(".f.XyZ123")).unwrap(),
        b"rsync's temporary file"
    );
    // Committed as it is here: nothing left to write back.
    let r0 = v.traffic().unwrap().round_trips;
    assert_eq!(v.write_back_all(), 0);
    assert_eq!(v.traffic().unwrap().round_trips, r0);
}
