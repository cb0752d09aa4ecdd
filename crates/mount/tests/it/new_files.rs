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
