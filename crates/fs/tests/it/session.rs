//! A session's start: the client's first requests go with its Hello, and each side's stream is
//! compressed from its `Compressed` frame on.

use std::os::unix::net::UnixStream;
use std::path::Path;

use ferry_fs::{ConnError, Connection};
use ferry_proto::{FrameDecoder, Level, Message, Reply, Request};
use ferry_store::MemStore;

use super::{fake_server_on, get, serving};

fn pipelined(root: &Path, level: Level) -> Connection<UnixStream, UnixStream> {
    let b = serving(root);
    Connection::open_pipelined(b.try_clone().unwrap(), b, level, 0).unwrap()
}

/// A server on a thread that answers each message the client sends as `answer` says (`None`:
/// nothing), plainly; the client's end of its socket.
fn fake_server(answer: impl Fn(Message) -> Option<Message> + Send + 'static) -> UnixStream {
    let (a, b) = UnixStream::pair().unwrap();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut r, mut w) = (a.try_clone().unwrap(), a);
        let mut dec = FrameDecoder::new();
        let mut buf = [0u8; 4096];
        loop {
            while let Some(f) = dec.next_frame().unwrap() {
                let Some(m) = answer(Message::decode(&f).unwrap()) else {
                    continue;
                };
                if w.write_all(&m.encode(f.request_id, false).unwrap())
                    .is_err()
                {
                    return;
                }
            }
            match r.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => dec.feed(&buf[..n]),
            }
        }
    });
    b
}

fn tree(root: &Path, seed: u8) {
    for d in ["a", "a/b", "c"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
        for f in 0..5u8 {
            let data: Vec<u8> = (0..20_000u32)
                .map(|i| (i as u8).wrapping_mul(f + 1) ^ seed)
                .collect();
            std::fs::write(root.join(d).join(format!("f{f}")), data).unwrap();
        }
    }
}

/// Nothing waits for the server's Hello: re-syncing an unchanged tree over a new session is
/// one round trip in all (its Hello, Ping, GetAttr and the tree's requests together), where a
/// session that waits for the Hello first takes two. Both sides' streams then run compressed
/// (from their `Compressed` frames), and a changed tree comes over them intact.
#[test]
fn a_sessions_first_requests_go_with_its_hello() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    tree(&srv.join("up"), 0);
    let down = t.path().join("down");
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    get(&mut super::connect(&srv), "up", &down, &cache).unwrap();
    let mut waits = super::connect(&srv);
    get(&mut waits, "up", &down, &cache).unwrap();
    assert_eq!(
        waits.traffic().round_trips,
        2,
        "the Hello's, then the tree's"
    );
    let mut c = pipelined(&srv, ferry_fs::DEFAULT_ZSTD_LEVEL);
    get(&mut c, "up", &down, &cache).unwrap();
    assert_eq!(c.traffic().round_trips, 1, "one for all");
    assert!(c.offers(ferry_proto::FEATURE_ZSTD_STREAM).unwrap());
    // Changed, over the same session: its streams both compressed now.
    std::fs::remove_dir_all(srv.join("up")).unwrap();
    tree(&srv.join("up"), 9);
    get(&mut c, "up", &down, &cache).unwrap();
    for d in ["a", "a/b", "c"] {
        for f in 0..5 {
            let p = Path::new(d).join(format!("f{f}"));
            assert_eq!(
                std::fs::read(down.join(&p)).unwrap(),
                std::fs::read(srv.join("up").join(&p)).unwrap()
            );
        }
    }
}

/// A client that asks for no stream compression sends no `Compressed`, and neither does the
/// server: both streams stay plain (a peer reading frames as they come understands them).
#[test]
fn without_stream_compression_the_session_stays_plain() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    tree(&srv.join("up"), 1);
    let mut c = pipelined(&srv, Level::Fixed(0));
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    let down = t.path().join("down");
    get(&mut c, "up", &down, &cache).unwrap();
    assert!(!c.offers(ferry_proto::FEATURE_ZSTD_STREAM).unwrap());
    let p = Path::new("a/b/f3");
    assert_eq!(
        std::fs::read(down.join(p)).unwrap(),
        std::fs::read(srv.join("up").join(p)).unwrap()
    );
}

/// A server of another version answers the Hello with its own; the client, which sent its
/// first requests meanwhile, fails at its first wait, saying which versions met (and the
/// replies the server sent to those requests are not taken for anything).
#[test]
fn a_server_of_another_version_is_refused_at_the_first_wait() {
    let b = fake_server(|m| {
        Some(match m {
            Message::Hello(h) => Message::Hello(ferry_proto::Hello {
                version: ferry_proto::VERSION - 1,
                features: 0,
                ..h
            }),
            _ => Message::Reply(Reply::Ok),
        })
    });
    let mut c =
        Connection::open_pipelined(b.try_clone().unwrap(), b, ferry_fs::DEFAULT_ZSTD_LEVEL, 0)
            .unwrap();
    let e = c.call(Request::GetAttr { path: "".into() }).unwrap_err();
    assert!(
        matches!(&e, ConnError::Unexpected(m)
            if m.contains(&format!("speaks protocol {}", ferry_proto::VERSION - 1))),
        "{e:?}"
    );
}

/// A link that fails before the server's Hello came is said so by the account given
/// (`before_hello`: a remote shell's exit), at whichever wait finds it.
#[test]
fn a_link_that_fails_before_the_hello_is_said_so() {
    let (a, b) = UnixStream::pair().unwrap();
    drop(a);
    let mut c =
        Connection::open_pipelined(b.try_clone().unwrap(), b, ferry_fs::DEFAULT_ZSTD_LEVEL, 0)
            .unwrap();
    c.before_hello(Box::new(|e| {
        ConnError::Unexpected(format!("before the session began: {e}"))
    }));
    let e = c.call(Request::GetAttr { path: "".into() }).unwrap_err();
    assert!(
        matches!(&e, ConnError::Unexpected(m) if m.starts_with("before the session began")),
        "{e:?}"
    );
}

/// A client that finds its server near tells it so at once, whatever it asks next (the
/// server's stream then starts low): a mount that only writes back never asks for bulk, and
/// its server compressed every small reply at level 9.
#[test]
fn a_near_link_is_told_to_the_server_without_bulk() {
    use std::sync::{Arc, Mutex};
    let rates = Arc::new(Mutex::new(0usize));
    let seen = rates.clone();
    let b = fake_server(move |m| match m {
        Message::Hello(h) => Some(Message::Hello(ferry_proto::Hello {
            features: ferry_proto::FEATURE_RATE,
            ..h
        })),
        Message::Rate { .. } => {
            *seen.lock().unwrap() += 1;
            None
        }
        _ => Some(Message::Reply(Reply::Ok)),
    });
    let mut c = Connection::open_asking(b.try_clone().unwrap(), b, Level::Fixed(0), 0).unwrap();
    // Until a round trip comes back within 8 ms (at once, on all but the busiest machine).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while *rates.lock().unwrap() == 0 {
        assert!(std::time::Instant::now() < deadline, "no Rate was sent");
        c.call(Request::Ping).unwrap();
    }
    // Told once: the measure is news no more.
    for _ in 0..10 {
        c.call(Request::Ping).unwrap();
    }
    assert_eq!(*rates.lock().unwrap(), 1);
}

/// Before its first choice a fetch settles how near the link is. The Ping that went as the
/// Hello came may be held behind the server's start: when it has not come back in time, one
/// more goes, and the wait ends however long the first takes (here it never comes back).
#[test]
fn a_late_ping_is_followed_by_one_more_and_not_waited_for() {
    use std::sync::{Arc, Mutex};
    let pings = Arc::new(Mutex::new(0usize));
    let seen = pings.clone();
    let b = fake_server(move |m| match m {
        Message::Hello(h) => Some(Message::Hello(ferry_proto::Hello { features: 0, ..h })),
        Message::Request(Request::Ping) => {
            let mut n = seen.lock().unwrap();
            *n += 1;
            (*n > 1).then_some(Message::Reply(Reply::Ok))
        }
        _ => Some(Message::Reply(Reply::Ok)),
    });
    let r = b.try_clone().unwrap();
    let mut s = ferry_fs::Session::over(r, Box::new(b), Box::new(|| Ok(()))).unwrap();
    s.conn.settle_probe().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while *pings.lock().unwrap() < 2 {
        assert!(std::time::Instant::now() < deadline, "no second Ping went");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // Two in all, as ever: settling again sends no third.
    s.conn.settle_probe().unwrap();
    s.conn.call(Request::GetAttr { path: "".into() }).unwrap();
    assert_eq!(*pings.lock().unwrap(), 2);
}

/// As the server's Hello comes, the client sends a Ping it does not wait for: its reply times
/// the link, not the server's work on the first requests (once the only round trips timed, and
/// a fetch through a local pipe took its link for a far one). Here the server holds its answer
/// to the GetAttr until the client has timed a round trip: only the Ping can time it.
#[test]
fn the_link_is_timed_by_a_ping_not_by_the_servers_work() {
    use std::sync::{mpsc, Mutex};
    let (go, gate) = mpsc::channel::<()>();
    let gate = Mutex::new(gate);
    let (a, b) = UnixStream::pair().unwrap();
    fake_server_on(a, move |q| {
        if q != Request::Ping {
            gate.lock().unwrap().recv().unwrap();
        }
        (vec![], Reply::Ok)
    });
    let mut c = Connection::open(b.try_clone().unwrap(), b.try_clone().unwrap()).unwrap();
    let before = c.traffic().round_trips;
    let id = c.send(Request::GetAttr { path: "".into() }).unwrap();
    c.flush().unwrap();
    // Replies taken as they come, without waiting for the GetAttr's (which does not come).
    b.set_read_timeout(Some(std::time::Duration::from_millis(10)))
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while c.round_trip().is_none() {
        assert!(std::time::Instant::now() < deadline, "no round trip timed");
        c.poll().unwrap();
    }
    b.set_read_timeout(None).unwrap();
    go.send(()).unwrap();
    c.replies(id).unwrap();
    let trips = c.traffic().round_trips - before;
    assert_eq!(trips, 1, "the Ping is not waited for");
}
