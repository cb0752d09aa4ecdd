//! The TLS daemon (`ferry serve --listen`): authorized keys, and its own key pinned.

use super::*;

#[test]
fn tls_daemon_serves_authorized_keys_and_pins_its_own() {
    let t = tempfile::tempdir().unwrap();
    let (srv, alice, bob) = (t.path().join("srv"), t.path().join("a"), t.path().join("b"));
    let export = t.path().join("export");
    std::fs::create_dir_all(export.join("sub")).unwrap();
    std::fs::write(export.join("sub/f"), data(200_000, 1)).unwrap();
    std::fs::write(export.join("small"), b"hi\n").unwrap();
    let d = TlsDaemon::start(&srv, &export, 0);

    // Not authorized yet: a clear refusal (not a link failure), and the server's key recorded.
    let o = ferry_as(&alice, &["ls", &d.url("")]);
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("not authorized"), "{e}");
    assert!(e.contains("first visit"), "{e}");
    let known = std::fs::read_to_string(alice.join("data/ferry/known_hosts")).unwrap();
    assert!(known.contains(&d.fingerprint), "{known}");

    let fp = ok_as(&alice, &["key", "show"]).trim().to_string();
    ok_as(&srv, &["key", "authorize", &fp, "alice"]);
    let ls = ok_as(&alice, &["ls", &d.url("")]);
    assert!(ls.contains("small") && ls.contains("sub"), "{ls}");
    let out = t.path().join("out");
    ok_as(&alice, &["get", &d.url("sub"), s(&out)]);
    assert_eq!(std::fs::read(out.join("f")).unwrap(), data(200_000, 1));
    std::fs::write(out.join("f"), data(250_000, 1)).unwrap();
    ok_as(&alice, &["sync", s(&out), &d.url("sub")]);
    assert_eq!(
        std::fs::read(export.join("sub/f")).unwrap(),
        data(250_000, 1)
    );

    // Another daemon with another key on the same address: refused, not trusted.
    let port = d.port;
    drop(d);
    let impostor = TlsDaemon::start(&t.path().join("impostor"), &export, port);
    let o = ferry_as(&alice, &["ls", &impostor.url("")]);
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("presents key") && e.contains(&impostor.fingerprint),
        "{e}"
    );
    drop(impostor);

    // "Have you got this chunk?" answers from the asking client's uploads, never another's.
    let d = TlsDaemon::start(&srv, &export, port);
    let fp_b = ok_as(&bob, &["key", "show"]).trim().to_string();
    ok_as(&srv, &["key", "authorize", &fp_b, "bob"]);
    ok_as(
        &bob,
        &["key", "trust", &format!("127.0.0.1:{port}"), &d.fingerprint],
    );
    let secret = data(5000, 77);
    let id = ferry_format::Id::hash(ferry_format::HashAlg::Blake3, &secret);
    let have = |home: &Path, put: bool| -> bool {
        use ferry_proto::{Reply, Request};
        let data_dir = home.join("data/ferry");
        let (me, _) = ferry_net::Identity::load_or_create(&data_dir).unwrap();
        let ep = ferry_net::Endpoint::parse(&d.url("")).unwrap().unwrap();
        let mut sess = ferry_net::connect(&ep, &me, &data_dir.join("known_hosts"), |_| {}).unwrap();
        if put {
            // The chunk sent as the data of an upload, which is then dropped: it stays staged.
            let create = Request::Create {
                handle: 1,
                path: "upload".into(),
                base: None,
            };
            sess.conn.call(create).unwrap();
            let write = Request::Write {
                handle: 1,
                parts: vec![ferry_proto::WritePart::Data {
                    lens: vec![secret.len() as u32],
                    payload: ferry_proto::Payload::Plain(secret.clone()),
                }],
            };
            sess.conn.call(write).unwrap();
            sess.conn.call(Request::Abort { handle: 1 }).unwrap();
        }
        let ids = ferry_proto::Ids::Full(vec![id]);
        let r = sess.conn.call(Request::Have { ids }).unwrap();
        sess.close().unwrap();
        match &r[..] {
            [Reply::Have(v)] => v[0],
            other => panic!("{other:?}"),
        }
    };
    assert!(!have(&bob, false));
    assert!(have(&alice, true), "the uploader's own chunk");
    assert!(!have(&bob, false), "another client's upload is no oracle");
    // A session that starts while the last one's server still holds the shared staging store
    // gets a private one (docs: a second session at once), so the next session is asked until
    // the last has let go: kept across sessions, however long the letting go takes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !have(&alice, false) {
        assert!(std::time::Instant::now() < deadline, "kept across sessions");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
