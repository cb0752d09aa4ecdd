//! Lease breaks a server sends unasked, as the client keeps them.

use super::*;

/// A server that sends `breaks` names changed unasked ahead of each answer (but a Ping's: the
/// client times its link with one).
fn flooding_server(breaks: usize) -> Connection<UnixStream, UnixStream> {
    crate::fake_server_telling(move |m| {
        if m == Request::Ping {
            return (vec![], Reply::Ok);
        }
        let told = (0..breaks)
            .map(|i| Message::Changed {
                path: WirePath::new(format!("d/{i}").into_bytes()).unwrap(),
                attr: None,
            })
            .collect();
        (told, Reply::Ok)
    })
}

/// Breaks past what the client keeps are never dropped silently: the client is told breaks
/// were lost (the mount then voids every lease).
#[test]
fn breaks_past_the_bound_are_never_dropped_silently() {
    let max = ferry_fs::conn::MAX_BREAKS;
    let path = || WirePath::new(b"d".to_vec()).unwrap();
    let mut c = flooding_server(max);
    let id = c.send(Request::GetAttr { path: path() }).unwrap();
    c.replies(id).unwrap();
    assert_eq!(c.changed.len(), max);
    assert!(!c.breaks_lost, "all kept");

    let mut c = flooding_server(max + 1);
    let id = c.send(Request::GetAttr { path: path() }).unwrap();
    c.replies(id).unwrap();
    assert!(c.breaks_lost, "one more than kept");
}

/// A leased file changed by a local program on the server: the client is told (Invalidate),
/// without asking.
#[test]
fn changes_behind_the_servers_back_break_leases() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir_all(srv.join("d")).unwrap();
    fs::write(srv.join("d/f"), b"one").unwrap();
    fs::write(srv.join("other"), b"x").unwrap();
    let mut c = connect(&srv);
    let lease = match c
        .call(Request::GetAttr { path: "d/f".into() })
        .unwrap()
        .pop()
    {
        Some(Reply::Attr(a)) => a.lease_ms,
        other => panic!("{other:?}"),
    };
    assert!(lease > 0, "a lease is granted");
    c.call(Request::ReadDir {
        path: "d".into(),
        keys: vec![],
    })
    .unwrap();
    // A local program rewrites the file.
    fs::write(srv.join("d/f"), b"two").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while c.invalidated.len() < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        // Any exchange reads what the server pushed meanwhile.
        c.call(Request::GetAttr {
            path: "other".into(),
        })
        .unwrap();
    }
    let got: Vec<String> = c
        .invalidated
        .iter()
        .map(|p| String::from_utf8_lossy(p.as_bytes()).into_owned())
        .collect();
    assert!(got.contains(&"d/f".to_string()), "{got:?}");
    assert!(
        got.contains(&"d".to_string()),
        "the listing lease too: {got:?}"
    );
    // Each lease breaks once: further changes without a new lease send nothing more for it.
    let n = c
        .invalidated
        .iter()
        .filter(|p| p.as_bytes() == b"d/f")
        .count();
    fs::write(srv.join("d/f"), b"three").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    c.call(Request::GetAttr {
        path: "other".into(),
    })
    .unwrap();
    assert_eq!(
        c.invalidated
            .iter()
            .filter(|p| p.as_bytes() == b"d/f")
            .count(),
        n
    );
}

/// A session that asked for `FEATURE_OWN_CHANGES` keeps its lease on a listing through its own
/// changes there (it changes its copy itself); anyone else's change breaks it, as does a
/// session's own change when it did not ask.
#[test]
fn own_changes_keep_the_listing_lease_when_asked() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir_all(srv.join("d")).unwrap();
    fs::write(srv.join("d/f"), b"one").unwrap();
    fs::write(srv.join("other"), b"x").unwrap();
    let session = |ask: u64| connect_asking(&srv, ask);
    let names = |c: &Connection<UnixStream, UnixStream>| -> Vec<String> {
        c.invalidated
            .iter()
            .map(|p| String::from_utf8_lossy(p.as_bytes()).into_owned())
            .collect()
    };
    let lease = |c: &mut Connection<UnixStream, UnixStream>| {
        c.call(Request::ReadDir {
            path: "d".into(),
            keys: vec![],
        })
        .unwrap();
    };
    let mut own = session(ferry_proto::FEATURE_OWN_CHANGES);
    let mut plain = session(0);
    lease(&mut own);
    lease(&mut plain);

    // Its own changes, each answered only after the server took their events.
    own.call(Request::Mkdir {
        path: "d/new".into(),
        mode: 0o755,
    })
    .unwrap();
    own.call(Request::Rename {
        from: "d/f".into(),
        to: "d/g".into(),
    })
    .unwrap();
    own.call(Request::SetAttr {
        path: "d/g".into(),
        mode: Some(0o600),
        mtime_ns: None,
    })
    .unwrap();
    own.call(Request::Unlink { path: "d/g".into() }).unwrap();
    own.call(Request::GetAttr {
        path: "other".into(),
    })
    .unwrap();
    assert!(!names(&own).contains(&"d".to_string()), "{:?}", names(&own));

    // The same changes are another session's: its lease is broken.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !names(&plain).contains(&"d".to_string()) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        plain
            .call(Request::GetAttr {
                path: "other".into(),
            })
            .unwrap();
    }
    assert!(names(&plain).contains(&"d".to_string()));

    // A session that did not ask: its own change breaks its lease (sent with the reply).
    lease(&mut plain);
    plain.invalidated.clear();
    plain
        .call(Request::Mkdir {
            path: "d/mine".into(),
            mode: 0o755,
        })
        .unwrap();
    assert!(
        names(&plain).contains(&"d".to_string()),
        "{:?}",
        names(&plain)
    );

    // Anyone else's change breaks the lease of the session that asked (leased again: the
    // other session's change above broke it once already, told with this reply at the latest).
    lease(&mut own);
    own.invalidated.clear();
    fs::write(srv.join("d/local"), b"a local program").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !names(&own).contains(&"d".to_string()) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        own.call(Request::GetAttr {
            path: "other".into(),
        })
        .unwrap();
    }
    assert!(names(&own).contains(&"d".to_string()), "{:?}", names(&own));
}
