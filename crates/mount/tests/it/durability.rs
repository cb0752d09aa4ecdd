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

/// Each session's server syncs only the directories that session changed, so a directory's
/// fsync must reach every session: one in use by another operation gets its Sync when it
/// comes back, and the fsync waits for that.
#[test]
fn fsyncdir_reaches_the_sessions_in_use() {
    let (_t, root, remote, v) = one_client();
    let v = std::sync::Arc::new(v);
    super::write(&v, "a", b"over session 0").unwrap();
    remote.hold(0);
    let busy = {
        let v = v.clone();
        std::thread::spawn(move || super::write(&v, "b", b"held at the server").unwrap())
    };
    remote.wait_held();
    let syncing = {
        let v = v.clone();
        std::thread::spawn(move || v.fsyncdir())
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while v.syncs_waiting() == 0 && !syncing.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "the fsync neither waited nor ended"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(
        !syncing.is_finished(),
        "returned while the session that made `a` was still in use, unsynced"
    );
    assert_eq!(remote.syncs(0), 0);
    remote.free();
    busy.join().unwrap();
    syncing.join().unwrap().unwrap();
    assert_eq!(
        remote.syncs(0),
        1,
        "the session in use got its Sync as it came back"
    );
    assert!(root.join("b").exists());
}
