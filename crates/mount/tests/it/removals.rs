//! Removals acknowledged before the server makes them: a file whose leased listing and
//! directory say the server will remove it is removed here at once, and the removals go to the
//! server together before the next request of any kind (the mount's own thread sends them
//! within a round trip or two; these tests call `send_changes` themselves, or nothing, so what
//! is asserted never depends on a thread's timing).

use std::time::Duration;

use ferry_mount::{Errno, Vfs, ROOT};

use super::{bytes, make, one_client};

fn rt(v: &Vfs) -> u64 {
    v.traffic().unwrap().round_trips
}

fn names(v: &Vfs, dir: u64) -> Vec<Vec<u8>> {
    v.readdir(dir).unwrap().into_iter().map(|e| e.2).collect()
}

/// `rm -rf` of a directory of files: the files' removals cost no round trip of their own; they
/// go in the directory's removal's round trip, right before it.
#[test]
fn removals_of_a_directory_go_together_with_its_own() {
    let (_t, root, _remote, v) = one_client();
    std::fs::create_dir(root.join("d")).unwrap();
    for i in 0..20 {
        std::fs::write(root.join(format!("d/f{i:02}")), bytes(i, 100)).unwrap();
    }
    std::os::unix::fs::symlink("f00", root.join("d/link")).unwrap();
    let d = v.lookup(ROOT, b"d").unwrap();
    assert_eq!(names(&v, d.ino).len(), 21, "listed, and leased");
    let before = v.getattr(d.ino).unwrap();
    let r0 = rt(&v);
    for n in names(&v, d.ino) {
        v.unlink(d.ino, &n).unwrap();
    }
    assert_eq!(rt(&v), r0, "nothing waited on");
    // Gone here at once: looked up, listed, and the directory's times moved.
    assert_eq!(v.lookup(d.ino, b"f07").unwrap_err(), Errno::ENOENT);
    assert!(names(&v, d.ino).is_empty());
    let after = v.getattr(d.ino).unwrap();
    assert!(after.mtime_ns > before.mtime_ns && after.ctime_ns > before.ctime_ns);
    assert_eq!(rt(&v), r0);
    // Nothing was sent yet: the server still has them.
    assert_eq!(std::fs::read_dir(root.join("d")).unwrap().count(), 21);
    v.rmdir(ROOT, b"d").unwrap();
    assert_eq!(rt(&v) - r0, 1, "the removals and the directory's, together");
    assert!(!root.join("d").exists());
}

/// A name removed and made again at once (a save that deletes first, `rm f; cp g f`): the new
/// file is never removed by the queued removal, whichever way it is made.
#[test]
fn a_name_removed_and_made_again_keeps_the_new_file() {
    let (_t, root, _remote, v) = one_client();
    std::fs::create_dir(root.join("d")).unwrap();
    for name in ["a", "b"] {
        std::fs::write(root.join("d").join(name), b"old").unwrap();
    }
    let d = v.lookup(ROOT, b"d").unwrap();
    assert_eq!(names(&v, d.ino).len(), 2);
    v.unlink(d.ino, b"a").unwrap();
    v.unlink(d.ino, b"b").unwrap();
    // An exclusive create goes to the server at once; a truncating one with its commit.
    make(&v, d.ino, b"a", b"new a", true);
    make(&v, d.ino, b"b", b"new b", false);
    v.send_changes(Duration::ZERO);
    assert_eq!(std::fs::read(root.join("d/a")).unwrap(), b"new a");
    assert_eq!(std::fs::read(root.join("d/b")).unwrap(), b"new b");
}

/// A removal the server refuses after all (another program made the name a directory, and the
/// lease break had not been read here yet): the name shows again, as the server has it.
#[test]
fn a_removal_the_server_refuses_shows_the_name_again() {
    let (_t, root, _remote, v) = one_client();
    std::fs::write(root.join("x"), b"file").unwrap();
    assert_eq!(names(&v, ROOT), vec![b"x".to_vec()]);
    std::fs::remove_file(root.join("x")).unwrap();
    std::fs::create_dir(root.join("x")).unwrap();
    std::fs::write(root.join("x/kept"), b"kept").unwrap();
    v.unlink(ROOT, b"x").unwrap();
    v.send_changes(Duration::ZERO);
    let x = v.lookup(ROOT, b"x").unwrap();
    assert_eq!(x.kind, ferry_proto::FileKind::Dir);
    assert_eq!(names(&v, x.ino), vec![b"kept".to_vec()]);
    assert_eq!(std::fs::read(root.join("x/kept")).unwrap(), b"kept");
}

/// Removals the link's failure leaves unanswered: nothing is lost, and the names are what the
/// server has once it is back (here, never removed: the link was cut before they went).
#[test]
fn removals_cut_by_the_link_are_what_the_server_says() {
    let (_t, root, remote, v) = one_client();
    std::fs::write(root.join("x"), b"file").unwrap();
    assert_eq!(names(&v, ROOT), vec![b"x".to_vec()]);
    v.unlink(ROOT, b"x").unwrap();
    remote.stop();
    v.send_changes(Duration::ZERO);
    remote.start();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let x = loop {
        v.tick();
        match v.lookup(ROOT, b"x") {
            Ok(x) => break x,
            Err(e) => assert!(
                std::time::Instant::now() < deadline,
                "the server's file never showed again: {e:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(x.size, 4);
    assert_eq!(std::fs::read(root.join("x")).unwrap(), b"file");
}

/// Only what the leases vouch for is removed later: a name the listing here does not have, and
/// a directory, are the server's to judge at once.
#[test]
fn removals_without_a_lease_are_made_at_once() {
    let (_t, root, _remote, v) = one_client();
    std::fs::create_dir(root.join("d")).unwrap();
    std::fs::write(root.join("f"), b"f").unwrap();
    assert_eq!(names(&v, ROOT).len(), 2);
    assert_eq!(v.unlink(ROOT, b"d").unwrap_err(), Errno::EISDIR);
    assert_eq!(v.unlink(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    v.expire_leases();
    v.unlink(ROOT, b"f").unwrap();
    assert!(
        !root.join("f").exists(),
        "removed before the unlink returned"
    );
}

/// Any operation carries the queued removals ahead of its own requests, in its round trip: a
/// save that removes the old file and writes a new one costs the new file's round trip only.
#[test]
fn the_next_operation_carries_the_removals_in_its_round_trip() {
    let (_t, root, _remote, v) = one_client();
    std::fs::write(root.join("old"), b"old").unwrap();
    assert_eq!(names(&v, ROOT), vec![b"old".to_vec()]);
    let r0 = rt(&v);
    v.unlink(ROOT, b"old").unwrap();
    make(&v, ROOT, b"new", b"new", false);
    assert_eq!(rt(&v), r0, "both queued");
    assert!(root.join("old").exists());
    v.send_changes(Duration::ZERO);
    assert_eq!(rt(&v) - r0, 1, "the removal and the commit, together");
    assert!(!root.join("old").exists());
    assert_eq!(std::fs::read(root.join("new")).unwrap(), b"new");
}

/// `cp -a`, `rsync -a` and `tar x` set each file's mode and times after its close: with the
/// file's attributes leased, that is made here at once and queued, and goes in the round trip
/// of the next file's commit. The server's attributes come back with it.
#[test]
fn attribute_changes_go_with_the_next_operation() {
    use std::os::unix::fs::MetadataExt;
    let (_t, root, _remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    let r0 = rt(&v);
    make(&v, ROOT, b"a", b"first", true);
    v.send_changes(Duration::ZERO);
    let a = v.lookup(ROOT, b"a").unwrap();
    let when = 1_500_000_000 * 1_000_000_000i64;
    let s = v.setattr(a.ino, Some(0o640), None, Some(when)).unwrap();
    assert_eq!((s.mode, s.mtime_ns), (0o640, when), "made here at once");
    assert_eq!(rt(&v) - r0, 1, "the commit only");
    assert_eq!(
        std::fs::metadata(root.join("a")).unwrap().mode() & 0o7777,
        0o644
    );
    make(&v, ROOT, b"b", b"second", true);
    v.send_changes(Duration::ZERO);
    assert_eq!(
        rt(&v) - r0,
        2,
        "the second commit carried the first's attributes"
    );
    let m = std::fs::metadata(root.join("a")).unwrap();
    assert_eq!((m.mode() & 0o7777, m.mtime()), (0o640, 1_500_000_000));
    let s = v.getattr(a.ino).unwrap();
    assert_eq!(
        s.ctime_ns,
        m.ctime() * 1_000_000_000 + m.ctime_nsec(),
        "the server's attributes came back"
    );
}

/// An attribute change the server refuses after all (the file went, unseen here yet): logged,
/// and the name shows as the server has it.
#[test]
fn an_attribute_change_the_server_refuses_shows_what_it_has() {
    let (_t, root, _remote, v) = one_client();
    std::fs::write(root.join("x"), b"file").unwrap();
    assert_eq!(names(&v, ROOT), vec![b"x".to_vec()]);
    let x = v.lookup(ROOT, b"x").unwrap();
    std::fs::remove_file(root.join("x")).unwrap();
    v.setattr(x.ino, Some(0o600), None, None).unwrap();
    v.send_changes(Duration::ZERO);
    assert_eq!(v.lookup(ROOT, b"x").unwrap_err(), Errno::ENOENT);
    assert!(!root.join("x").exists());
}

/// A rename the leases vouch for (an editor's save, rsync's temporary file put in place) is
/// made here at once and goes in the next operation's round trip; the file's attributes come
/// back with it.
#[test]
fn a_rename_goes_with_the_next_operation() {
    let (_t, root, _remote, v) = one_client();
    std::fs::write(root.join("doc"), b"old").unwrap();
    assert_eq!(names(&v, ROOT), vec![b"doc".to_vec()]);
    let r0 = rt(&v);
    make(&v, ROOT, b".doc.tmp", b"new", true);
    v.rename(ROOT, b".doc.tmp", ROOT, b"doc", false).unwrap();
    assert_eq!(rt(&v) - r0, 1, "the commit only");
    assert_eq!(std::fs::read(root.join("doc")).unwrap(), b"old");
    make(&v, ROOT, b"other", b"x", true);
    v.send_changes(Duration::ZERO);
    assert_eq!(rt(&v) - r0, 2, "the next commit carried the rename");
    assert_eq!(v.lookup(ROOT, b".doc.tmp").unwrap_err(), Errno::ENOENT);
    assert_eq!(std::fs::read(root.join("doc")).unwrap(), b"new");
    assert!(!root.join(".doc.tmp").exists());
    assert_eq!(super::read(&v, "doc").unwrap(), b"new");
    assert_eq!(
        rt(&v) - r0,
        2,
        "read from the copy here, at the version the rename made"
    );
    assert_eq!(names(&v, ROOT), vec![b"doc".to_vec(), b"other".to_vec()]);
}

/// A file written right after a change of its attributes or name made here and not yet
/// answered is committed against the version that change made: no conflict, and nothing
/// replaced as "the last close wins".
#[test]
fn a_commit_after_a_queued_change_of_its_file_is_no_conflict() {
    use std::sync::atomic::Ordering;
    let (_t, root, _remote, v) = one_client();
    std::fs::write(root.join("f"), b"1").unwrap();
    assert_eq!(super::read(&v, "f").unwrap(), b"1");
    let f = v.lookup(ROOT, b"f").unwrap();
    v.setattr(f.ino, Some(0o600), None, None).unwrap();
    super::write(&v, "f", b"2").unwrap();
    v.rename(ROOT, b"f", ROOT, b"g", false).unwrap();
    super::write(&v, "g", b"3").unwrap();
    assert_eq!(v.counters.last_close_wins.load(Ordering::Relaxed), 0);
    assert_eq!(std::fs::read(root.join("g")).unwrap(), b"3");
    assert!(!root.join("f").exists());
}

/// A look at a file whose change is queued (`stat` after `chmod`, as the POSIX suite makes)
/// sends the queue first: the change time is the server's, not a guess.
#[test]
fn a_look_at_a_file_with_a_change_queued_is_the_servers() {
    use std::os::unix::fs::MetadataExt;
    let (_t, root, _remote, v) = one_client();
    std::fs::write(root.join("f"), b"1").unwrap();
    let f = v.lookup(ROOT, b"f").unwrap();
    let r0 = rt(&v);
    v.setattr(f.ino, Some(0o600), None, None).unwrap();
    assert_eq!(rt(&v), r0);
    let s = v.getattr(f.ino).unwrap();
    assert_eq!(rt(&v) - r0, 1, "the queue, and the attributes after");
    let m = std::fs::metadata(root.join("f")).unwrap();
    assert_eq!(s.ctime_ns, m.ctime() * 1_000_000_000 + m.ctime_nsec());
    assert_eq!(s.mode, 0o600);
}
