//! fsync and fsyncdir: what they cost, and that each leaves nothing behind to make durable.

use ferry_mount::{Vfs, ROOT};

use super::one_client;

fn rt(v: &Vfs) -> u64 {
    v.traffic().unwrap().round_trips
}

/// SQLite's journal and database: written, then fsynced. The commit takes the server's Sync
/// along in its round trip; a second fsync, or one of the directory, has nothing left to do.
#[test]
fn fsync_commits_and_syncs_in_one_round_trip() {
    let (_t, root, _remote, v) = one_client();
    let (_, o) = v.create(ROOT, b"db", 0o644, true).unwrap();
    let r0 = rt(&v);
    v.write(o.fh, 0, b"page one").unwrap();
    v.fsync(o.fh).unwrap();
    assert_eq!(rt(&v) - r0, 1, "the commit and its Sync");
    assert_eq!(std::fs::read(root.join("db")).unwrap(), b"page one");
    v.fsync(o.fh).unwrap();
    v.fsyncdir().unwrap();
    assert_eq!(rt(&v) - r0, 1, "nothing left to make durable");
    // A change of names: the directory's fsync sends a Sync of its own.
    v.rename(ROOT, b"db", ROOT, b"db.old", false).unwrap();
    let r1 = rt(&v);
    v.fsyncdir().unwrap();
    assert_eq!(rt(&v) - r1, 1);
    v.fsyncdir().unwrap();
    assert_eq!(rt(&v) - r1, 1);
    v.flush(o.fh).unwrap();
    v.release(o.fh).unwrap();
    assert!(root.join("db.old").exists());
}
