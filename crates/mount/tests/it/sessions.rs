//! The mount's sessions with the server: made again after the link fails, as many as
//! operations need at once.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ferry_mount::{Errno, ROOT};

use super::one_client;

/// Two operations that both need a new session while one is being made (the link came back,
/// and making a session takes a while): one takes the session made, the other has one made
/// for it, and neither fails. (The second once failed at once with EHOSTDOWN: `make -j2` on
/// cable.)
#[test]
fn operations_waiting_together_for_a_session_each_get_one() {
    let (_t, _root, remote, v) = one_client();
    v.readdir(ROOT).unwrap();
    remote.stop();
    v.expire_leases();
    assert_eq!(v.mkdir(ROOT, b"d", 0o755).unwrap_err(), Errno::EHOSTDOWN);
    remote.start();
    remote.connect_ms.store(300, Ordering::Release);
    std::thread::scope(|s| {
        let both: Vec<_> = [b"a", b"b"]
            .into_iter()
            .map(|name| s.spawn(|| v.mkdir(ROOT, name, 0o755).map(drop)))
            .collect();
        for t in both {
            assert_eq!(t.join().unwrap(), Ok(()));
        }
    });
}

/// Operations waiting together for the one session, busy for a moment, take turns on it: one
/// that finds it taken again by another waits on, and no second session is opened (each costs
/// the mount its leases: once a second was opened 50 ms into `rsync -a` by a waiter woken and
/// beaten to the session, `rsync` through the mount took twice as long).
#[test]
fn operations_waiting_for_a_busy_session_take_turns_on_it() {
    let (_t, _root, remote, v) = one_client();
    v.readdir(ROOT).unwrap();
    // However slow the run, no wait here outlasts the patience.
    v.set_session_patience(Duration::from_secs(120));
    v.expire_leases();
    remote.hold(0);
    std::thread::scope(|s| {
        let first = s.spawn(|| v.mkdir(ROOT, b"a", 0o755).map(drop));
        remote.wait_held();
        let others: Vec<_> = [b"b", b"c"]
            .into_iter()
            .map(|name| s.spawn(|| v.mkdir(ROOT, name, 0o755).map(drop)))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(120);
        while v.session_waiters() < 2 {
            assert!(Instant::now() < deadline, "the operations never waited");
            std::thread::yield_now();
        }
        remote.free();
        assert_eq!(first.join().unwrap(), Ok(()));
        for t in others {
            assert_eq!(t.join().unwrap(), Ok(()));
        }
    });
    assert_eq!(remote.sessions_made(), 1);
}
