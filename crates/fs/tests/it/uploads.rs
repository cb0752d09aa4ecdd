//! Uploads and commits: only what the server lacks goes, and each file is committed
//! atomically, in order, under the directory's lock.

use super::*;

#[test]
fn put_a_tree_then_only_what_changed() {
    let t = tempfile::tempdir().unwrap();
    let (src, srv) = (t.path().join("src"), t.path().join("srv"));
    tree(&src);
    std::os::unix::fs::symlink("src/a.bin", src.join("link")).unwrap();
    fs::create_dir(&srv).unwrap();
    let mut c = connect(&srv);
    let first = put(&mut c, &src, "up").unwrap();
    assert_eq!(first.files, 6);
    same_tree(&src, &srv.join("up"));
    assert_eq!(
        fs::read_link(srv.join("up/link")).unwrap(),
        Path::new("src/a.bin")
    );

    // Edit 10 bytes of the big file and upload again: one or two chunks travel.
    let mut big = fs::read(src.join("src/deep/big")).unwrap();
    big[300_000..300_010].copy_from_slice(b"0123456789");
    fs::write(src.join("src/deep/big"), &big).unwrap();
    let before = c.traffic();
    let second = put(&mut c, &src, "up").unwrap();
    same_tree(&src, &srv.join("up"));
    assert!(second.chunks_sent <= 2 + 2, "{second:?}"); // the edit, plus the two small files resent whole
    assert!(c.traffic().bytes_sent - before.bytes_sent < 64 * 1024);
    // No temporary files left behind.
    assert!(walkdir(&srv)
        .iter()
        .all(|p| !p.to_string_lossy().ends_with(".tmp")));
}

#[test]
fn a_small_file_is_one_round_trip_after_its_getattr() {
    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("small"), b"tiny").unwrap();
    let srv = t.path().join("srv");
    fs::create_dir(&srv).unwrap();
    let mut c = connect(&srv);
    let before = c.traffic().round_trips;
    put(&mut c, &t.path().join("small"), "small").unwrap();
    // GetAttr, then PutChunks + Commit together.
    assert_eq!(c.traffic().round_trips - before, 2);
    assert_eq!(fs::read(srv.join("small")).unwrap(), b"tiny");
}

#[test]
fn a_stale_update_is_refused_not_merged() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir(&srv).unwrap();
    fs::write(srv.join("f"), b"version 1").unwrap();
    let mut c = connect(&srv);
    let v1 = version(&mut c, "f");
    // Someone else changes the file on the server.
    std::thread::sleep(std::time::Duration::from_millis(10));
    fs::write(srv.join("f"), b"version 2 by a local program").unwrap();
    // Refused at once: the upload names a version that is gone.
    let r = upload(&mut c, 1, "f", Some(v1), b"my edit");
    assert!(is_code(&r, ErrorCode::Conflict), "{r:?}");
    // And at the commit, when the change comes while the new version is being written.
    let v2 = version(&mut c, "f");
    upload(&mut c, 2, "f", Some(v2), b"my edit").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(10));
    fs::write(srv.join("f"), b"version 3 by a local program").unwrap();
    let r = commit(&mut c, 2, b"my edit");
    assert!(is_code(&r, ErrorCode::Conflict), "{r:?}");
    assert_eq!(
        fs::read(srv.join("f")).unwrap(),
        b"version 3 by a local program"
    );
    // A file created meanwhile where there was none is not overwritten either.
    upload(&mut c, 3, "g", None, b"mine").unwrap();
    fs::write(srv.join("g"), b"theirs").unwrap();
    let r = commit(&mut c, 3, b"mine");
    assert!(is_code(&r, ErrorCode::Conflict), "{r:?}");
    assert_eq!(fs::read(srv.join("g")).unwrap(), b"theirs");
    // A write naming chunks nobody sent is refused, and the upload is gone.
    c.call(Request::Create {
        handle: 4,
        path: "h".into(),
        base: None,
    })
    .unwrap();
    let ghost = ferry_format::ChunkRef {
        id: ferry_format::Id::hash(ferry_format::HashAlg::Blake3, b"ghost"),
        len: 5,
    };
    let r = c.call(Request::Write {
        handle: 4,
        parts: vec![ferry_proto::WritePart::Chunks(vec![ghost])],
    });
    assert!(is_code(&r, ErrorCode::MissingChunks), "{r:?}");
    assert!(is_code(&commit(&mut c, 4, b"ghost"), ErrorCode::BadRequest));
    assert!(!srv.join("h").exists());
    // What was written must be what the commit names.
    upload(&mut c, 5, "i", None, b"these bytes").unwrap();
    let r = commit(&mut c, 5, b"other bytes");
    assert!(is_code(&r, ErrorCode::BadRequest), "{r:?}");
    assert!(!srv.join("i").exists());
    // Writes cannot leave the export either.
    std::os::unix::fs::symlink(t.path(), srv.join("out")).unwrap();
    let r = upload(&mut c, 6, "out/pwned", None, b"x");
    assert!(is_code(&r, ErrorCode::Escape), "{r:?}");
    assert!(!t.path().join("pwned").exists());
    // Nothing left behind: every failed upload's temporary file is gone.
    assert!(walkdir(&srv)
        .iter()
        .all(|p| !p.to_string_lossy().ends_with(".tmp")));
}

/// Two sessions committing into one directory take turns on its lock: a change made by whoever
/// holds it (here the test, as another session would) is seen by a commit that comes after, so
/// a stale update cannot slip in between another's check and its rename.
#[test]
fn a_commit_checks_and_renames_under_the_directorys_lock() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir(&srv).unwrap();
    fs::write(srv.join("f"), b"version 1").unwrap();
    let mut c = connect(&srv);
    let v1 = version(&mut c, "f");
    upload(&mut c, 1, "f", Some(v1), b"my edit").unwrap();
    let dir = fs::File::open(&srv).unwrap();
    rustix::fs::flock(&dir, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let waiter = std::thread::spawn(move || commit(&mut c, 1, b"my edit"));
    // Whether or not the commit is already waiting for the lock, it cannot have checked yet.
    fs::write(srv.join("f"), b"version 2 by another session").unwrap();
    rustix::fs::flock(&dir, rustix::fs::FlockOperation::Unlock).unwrap();
    let r = waiter.join().unwrap();
    assert!(is_code(&r, ErrorCode::Conflict), "{r:?}");
    assert_eq!(
        fs::read(srv.join("f")).unwrap(),
        b"version 2 by another session"
    );
}

/// A user's own files named like Ferry's temporaries are neither hidden nor removed.
#[test]
fn files_named_like_temporaries_are_user_data() {
    let t = tempfile::tempdir().unwrap();
    let (src, srv) = (t.path().join("src"), t.path().join("srv"));
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(srv.join("up")).unwrap();
    fs::write(srv.join("up/.ferry-notes.tmp"), b"notes").unwrap();
    fs::write(src.join(".ferry-data.tmp"), b"data").unwrap();
    fs::write(src.join("a"), b"a").unwrap();
    let mut c = connect(&srv);
    put(&mut c, &src, "up").unwrap();
    assert_eq!(fs::read(srv.join("up/.ferry-notes.tmp")).unwrap(), b"notes");
    assert_eq!(fs::read(srv.join("up/.ferry-data.tmp")).unwrap(), b"data");
    let (_, entries) = ferry_fs::list(&mut c, &"up".into()).unwrap();
    let names: Vec<_> = entries.iter().map(|e| e.name.clone()).collect();
    assert!(names.contains(&b".ferry-notes.tmp".to_vec()), "{names:?}");
}

/// A new server session knows nothing of a file's chunks until it reads the file; put makes it
/// read the version being replaced, and the trash keeps that version findable after it is gone.
#[test]
fn put_finds_chunks_of_the_replaced_version_and_the_trash() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir(&srv).unwrap();
    let v1 = bytes(31, 3_000_000);
    let v2 = bytes(32, 3_000_000);
    // v1 is on the server already (not put there by Ferry).
    fs::write(srv.join("f"), &v1).unwrap();
    let local = t.path().join("f");
    let mut edited = v1.clone();
    edited[1_000_000..1_000_004].copy_from_slice(b"edit");
    fs::write(&local, &edited).unwrap();
    // Both writes may fall in one clock tick: make sure the quick check sees a change.
    let then = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    fs::File::open(&local).unwrap().set_modified(then).unwrap();
    let s1 = put(&mut connect(&srv), &local, "f").unwrap();
    assert!(s1.chunk_bytes_sent < 100_000, "{s1:?}");
    assert!(fs::read(srv.join("f")).unwrap() == edited);
    // Replace with unrelated content, then go back: the old version comes from the trash.
    let mut c = connect(&srv);
    fs::write(&local, &v2).unwrap();
    put(&mut c, &local, "f").unwrap();
    fs::write(&local, &edited).unwrap();
    fs::File::open(&local)
        .unwrap()
        .set_modified(then - std::time::Duration::from_secs(60))
        .unwrap();
    let s3 = put(&mut c, &local, "f").unwrap();
    assert!(s3.chunk_bytes_sent < 100_000, "{s3:?}");
    assert!(fs::read(srv.join("f")).unwrap() == edited);
    // The trash is hidden from listings.
    let (_, entries) = ferry_fs::list(&mut c, &WirePath::default()).unwrap();
    assert!(
        entries.iter().all(|e| e.name != b".ferry-trash"),
        "{entries:?}"
    );
    assert!(srv.join(".ferry-trash").is_dir());
}

/// Commits sent together (grouped by the server: their files synced side by side) are each
/// answered as alone: one refused among them (its Create named a stale version) is refused
/// alone, and a request after them sees them made.
#[test]
fn commits_sent_together_are_answered_each_and_seen_by_the_next_request() {
    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("old"), b"v0").unwrap();
    let mut c = connect(t.path());
    let base = version(&mut c, "old");
    fs::write(t.path().join("old"), b"changed on the server since").unwrap();
    let mut commits = vec![];
    for (h, (name, base)) in [("f1", None), ("old", Some(base)), ("d/f3", None)]
        .into_iter()
        .enumerate()
    {
        if name == "d/f3" {
            fs::create_dir(t.path().join("d")).unwrap();
        }
        let data = format!("content of {name}").into_bytes();
        let h = h as u32 + 1;
        c.send(Request::Create {
            handle: h,
            path: name.into(),
            base,
        })
        .unwrap();
        c.send(Request::Write {
            handle: h,
            parts: vec![ferry_proto::WritePart::Data {
                lens: vec![data.len() as u32],
                payload: ferry_proto::Payload::Plain(data.clone()),
            }],
        })
        .unwrap();
        let id = c
            .send(Request::Commit {
                handle: h,
                mode: 0o640,
                mtime_ns: 0,
                size: data.len() as u64,
                oid: ferry_format::Id::hash(ferry_format::HashAlg::Blake3, &data),
            })
            .unwrap();
        commits.push((name, id, data));
    }
    let look = c.send(Request::GetAttr { path: "f1".into() }).unwrap();
    let mut f1_version = 0;
    for (name, id, data) in commits {
        let r = c.replies(id);
        if name == "old" {
            assert!(r.is_err(), "{r:?}");
            assert_eq!(
                fs::read(t.path().join("old")).unwrap(),
                b"changed on the server since"
            );
            continue;
        }
        let Some(Reply::Attr(a)) = r.unwrap().pop() else {
            panic!("{name}: no attributes")
        };
        assert_eq!(fs::read(t.path().join(name)).unwrap(), data);
        assert_eq!(a.mode & 0o7777, 0o640);
        if name == "f1" {
            f1_version = a.version;
        }
    }
    match c.replies(look).unwrap().pop() {
        Some(Reply::Attr(a)) => assert_eq!(a.version, f1_version),
        r => panic!("{r:?}"),
    }
}

/// The server's own names (the trash, the redo records of in-place commits, commits'
/// temporary files) are refused to every request that makes, changes, moves or removes a
/// name; a user's own file named like them is not.
#[test]
fn no_request_changes_the_servers_own_names() {
    let t = tempfile::tempdir().unwrap();
    for d in [".ferry-trash", ".ferry-redo"] {
        fs::create_dir(t.path().join(d)).unwrap();
        fs::write(t.path().join(d).join("x"), b"kept").unwrap();
    }
    let temp = ".ferry-1-00000000000000ab-1.tmp";
    fs::write(t.path().join(temp), b"a commit's").unwrap();
    fs::write(t.path().join("f"), b"user's").unwrap();
    let mut c = connect(t.path());
    let own = [".ferry-trash/x", ".ferry-redo/x", ".ferry-redo/y.new", temp];
    for p in own {
        let requests = [
            Request::Create {
                handle: 1,
                path: p.into(),
                base: None,
            },
            Request::Mkdir {
                path: format!("{p}/d").as_str().into(),
                mode: 0o755,
            },
            Request::Unlink { path: p.into() },
            Request::Rmdir { path: p.into() },
            Request::Symlink {
                path: p.into(),
                target: b"f".to_vec(),
            },
            Request::SetAttr {
                path: p.into(),
                mode: Some(0o600),
                mtime_ns: None,
            },
            Request::Rename {
                from: "f".into(),
                to: p.into(),
            },
            Request::Rename {
                from: p.into(),
                to: "g".into(),
            },
            Request::Link {
                from: p.into(),
                to: "h".into(),
            },
        ];
        for r in requests {
            let what = format!("{r:?}");
            let got = c.call(r);
            assert!(is_code(&got, ErrorCode::Permission), "{what}: {got:?}");
        }
    }
    assert_eq!(fs::read(t.path().join(".ferry-trash/x")).unwrap(), b"kept");
    assert_eq!(fs::read(t.path().join(".ferry-redo/x")).unwrap(), b"kept");
    assert_eq!(fs::read(t.path().join(temp)).unwrap(), b"a commit's");
    assert_eq!(fs::read(t.path().join("f")).unwrap(), b"user's");
    // A user's file named like them is the user's.
    c.call(Request::Rename {
        from: "f".into(),
        to: ".ferry-notes.tmp".into(),
    })
    .unwrap();
    assert!(t.path().join(".ferry-notes.tmp").exists());
}
