//! Listings kept up to date name by name (`FEATURE_ENTRY_CHANGES`): another program's changes
//! in a leased directory, and this mount's own changes made over another of its sessions, leave
//! the listing leased, so lookups of every other name still cost nothing.

use std::time::{Duration, Instant};

use ferry_mount::{Errno, Vfs, ROOT};

use super::{make, one_client, requests, settle};

/// Takes what the servers sent until `done` holds (at most two minutes).
fn until(v: &Vfs, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < deadline, "still not {what}");
        v.tick();
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Files made, renamed and removed on the server by another program: the mount learns each
/// name's new state with the change, and asks for nothing to look any name up. A file changed
/// in place has its own lease broken: its attributes are asked for again.
#[test]
fn others_changes_are_followed_name_by_name() {
    let (_t, root, _remote, v) = one_client();
    std::fs::write(root.join("kept"), b"1").unwrap();
    std::fs::write(root.join("old name"), b"moved").unwrap();
    // The lookup of a missing name lists the directory (leased).
    assert_eq!(v.lookup(ROOT, b"absent").unwrap_err(), Errno::ENOENT);
    let n = requests(&v);
    // Written outside and moved in, as a whole: one event (a file written in place might be
    // told as made, empty, and then have its lease broken by its writes).
    let outside = root.parent().unwrap().join("made");
    std::fs::write(&outside, b"new file").unwrap();
    std::fs::rename(&outside, root.join("made")).unwrap();
    std::fs::rename(root.join("old name"), root.join("new name")).unwrap();
    let size = |name: &[u8]| v.lookup(ROOT, name).map(|s| s.size);
    until(&v, "told of the changes", || {
        size(b"made") == Ok(8) && size(b"new name") == Ok(5)
    });
    assert_eq!(size(b"old name"), Err(Errno::ENOENT));
    std::fs::remove_file(root.join("made")).unwrap();
    until(&v, "told of the removal", || {
        size(b"made") == Err(Errno::ENOENT)
    });
    assert_eq!(v.lookup(ROOT, b"absent").unwrap_err(), Errno::ENOENT);
    assert_eq!(
        requests(&v),
        n,
        "every lookup answered from the listing and what the server told"
    );
    std::fs::write(root.join("kept"), b"22").unwrap();
    until(&v, "told of the change in place", || size(b"kept") == Ok(2));
    assert_eq!(super::read(&v, "kept").unwrap(), b"22");
    assert_eq!(super::read(&v, "new name").unwrap(), b"moved");
}

/// A file made by this mount over a second session (the first is busy) is seen by the first
/// session's server as anyone's change. The mount knows the name as told already: its listing
/// and the directory's attributes stay leased. (`make -j2` once lost them at every compile,
/// and then paid a round trip for each lookup and an extra one for each create.)
#[test]
fn a_change_made_over_another_session_keeps_the_listing() {
    let (_t, root, remote, v) = one_client();
    std::fs::write(root.join("old"), b"x").unwrap();
    assert_eq!(v.lookup(ROOT, b"absent").unwrap_err(), Errno::ENOENT);
    remote.hold(0);
    std::thread::scope(|s| {
        let busy = s.spawn(|| v.statfs());
        remote.wait_held();
        make(&v, ROOT, b"new", b"made over the second session", false);
        // (Its commit queued, sent now: over a second session.)
        v.send_changes(std::time::Duration::ZERO);
        remote.free();
        busy.join().unwrap();
    });
    assert!(root.join("new").exists());
    // The first session's server told of the new file with the statfs's answer.
    settle(&[&v]);
    let n = requests(&v);
    assert_eq!(v.lookup(ROOT, b"absent").unwrap_err(), Errno::ENOENT);
    for name in [&b"new"[..], b"old"] {
        let s = v.lookup(ROOT, name).unwrap();
        v.forget(s.ino, 1);
    }
    v.getattr(ROOT).unwrap();
    assert_eq!(requests(&v), n, "the listing and the directory stay leased");
}

/// News of a name this mount changed lately, told by another of its sessions late, is not
/// taken as it stands: it may predate the change. `git` makes `index.lock` (over one session),
/// renames it to `index`, and makes `index.lock` again; the other session's server had told of
/// the first `index.lock`, and its message, read after the rename, once put the name back in
/// the listing: the next exclusive create failed with `EEXIST` (`git commit`: "Unable to
/// create 'index.lock': File exists").
#[test]
fn news_older_than_a_change_made_here_does_not_bring_a_name_back() {
    let (_t, root, remote, v) = one_client();
    // Session 1's server lists the directory (leased) while session 0 is busy; the changes
    // below then go over session 0, the one idle on top.
    remote.hold(0);
    std::thread::scope(|s| {
        let busy = s.spawn(|| v.statfs());
        remote.wait_held();
        assert_eq!(v.lookup(ROOT, b"none").unwrap_err(), Errno::ENOENT);
        remote.free();
        busy.join().unwrap();
    });
    assert_eq!(remote.sessions_made(), 2);
    remote.hold_output(1);
    make(&v, ROOT, b"index.lock", b"first", true);
    v.send_changes(std::time::Duration::ZERO);
    let lock = ferry_proto::WirePath::new(b"index.lock".to_vec()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !remote.output_told(1).contains(&lock) {
        assert!(
            Instant::now() < deadline,
            "session 1's server never told of it"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let told = remote.output_held(1);
    v.rename(ROOT, b"index.lock", ROOT, b"index", false)
        .unwrap();
    v.send_changes(std::time::Duration::ZERO);
    assert!(!root.join("index.lock").exists());
    // What session 1's server told before the rename arrives now; what it told after, later.
    remote.pass_output_upto(told);
    v.tick();
    remote.pass_output();
    make(&v, ROOT, b"index.lock", b"second", true);
    v.send_changes(std::time::Duration::ZERO);
    assert_eq!(std::fs::read(root.join("index")).unwrap(), b"first");
    assert_eq!(std::fs::read(root.join("index.lock")).unwrap(), b"second");
}

/// A directory made here with its making queued is leased from the server once made there:
/// what another program then makes in it is told, and found by the next lookup.
#[test]
fn a_directory_made_here_is_followed_once_on_the_server() {
    let (_t, root, _remote, v) = one_client();
    assert_eq!(v.lookup(ROOT, b"absent").unwrap_err(), Errno::ENOENT);
    v.mkdir(ROOT, b"first", 0o755).unwrap();
    let d = v.mkdir(ROOT, b"d", 0o755).unwrap();
    assert_eq!(v.lookup(d.ino, b"theirs").unwrap_err(), Errno::ENOENT);
    v.send_changes(Duration::ZERO);
    let outside = root.join("outside");
    std::fs::write(&outside, b"made by another").unwrap();
    std::fs::rename(&outside, root.join("d/theirs")).unwrap();
    until(&v, "told of their file", || {
        v.lookup(d.ino, b"theirs").map(|s| s.size) == Ok(15)
    });
}
