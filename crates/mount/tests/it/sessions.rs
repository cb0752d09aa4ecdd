//! The mount's sessions with the server: made again after the link fails, as many as
//! operations need at once.

use std::sync::atomic::Ordering;

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
