//! What a new file costs to write back.

use ferry_mount::{Errno, Vfs, ROOT};

use super::{bytes, one_client};

fn rt(v: &Vfs) -> u64 {
    v.traffic().unwrap().round_trips
}

/// A new file of new data under 32 KiB goes whole with its commit: one round trip, as one
/// under 8 KiB does (SQLite's journal is just over 8 KiB). One whose data came from the server
/// (a copy of a file read here) asks what the server holds first.
#[test]
fn a_new_small_file_goes_with_its_commit() {
    let (_t, root, _remote, v) = one_client();
    let data = bytes(1, 20_000);
    // The listing, leased: the create is made here, and by its commit on the server.
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    let r0 = rt(&v);
    super::make(&v, ROOT, b"journal", &data, false);
    assert_eq!(rt(&v) - r0, 1, "the commit, with the data");
    assert_eq!(std::fs::read(root.join("journal")).unwrap(), data);
    // A copy: its chunks are in the cache (read from the server).
    std::fs::write(root.join("orig"), bytes(2, 20_000)).unwrap();
    v.expire_leases();
    let copy = super::read(&v, "orig").unwrap();
    let r1 = rt(&v);
    super::make(&v, ROOT, b"copy", &copy, false);
    assert_eq!(rt(&v) - r1, 2, "what the server holds, then the commit");
    assert_eq!(std::fs::read(root.join("copy")).unwrap(), copy);
}

/// An exclusive create (`cp`, `tar x`, `git`'s checkout and lock files) where the leased
/// listing says the name is absent is made by its commit too: one round trip for the file,
/// not two.
#[test]
fn an_exclusive_create_is_made_by_its_commit() {
    let (_t, root, _remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    let r0 = rt(&v);
    super::make(&v, ROOT, b"index.lock", b"locked", true);
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
/// not been taken yet: the exclusive create succeeds here, but its commit leaves their file
/// and the close fails with EEXIST. The name is theirs here too afterwards.
#[test]
fn an_exclusive_create_that_lost_the_race_fails_at_close() {
    let (_t, root, _remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    std::fs::write(root.join("lock"), b"theirs").unwrap();
    let (_, o) = v.create_excl(ROOT, b"lock", 0o644).unwrap();
    v.write(o.fh, 0, b"mine").unwrap();
    assert_eq!(v.flush(o.fh).unwrap_err(), Errno::EEXIST);
    v.release(o.fh).unwrap();
    assert_eq!(std::fs::read(root.join("lock")).unwrap(), b"theirs");
    assert_eq!(super::read(&v, "lock").unwrap(), b"theirs");
}

/// A directory made here comes with its (empty) listing leased, in the mkdir's round trip:
/// the files made in it next are looked up and created there without asking.
#[test]
fn a_new_directory_is_listed_in_its_round_trip() {
    let (_t, root, _remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
    let r0 = rt(&v);
    let d = v.mkdir(ROOT, b"d", 0o755).unwrap();
    assert_eq!(rt(&v) - r0, 1, "the mkdir");
    assert_eq!(v.lookup(d.ino, b"a.rs").unwrap_err(), Errno::ENOENT);
    super::make(&v, d.ino, b"a.rs", b"fn main() {}", true);
    assert_eq!(rt(&v) - r0, 2, "the mkdir, then the file's commit");
    assert_eq!(std::fs::read(root.join("d/a.rs")).unwrap(), b"fn main() {}");
}
