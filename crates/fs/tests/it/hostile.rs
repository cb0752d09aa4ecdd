//! Hostile peers, odd files and bounds: what a lying server or client, a FIFO, a symlink
//! race or a reply without end can and cannot do.

use super::*;

#[test]
fn a_fifo_in_the_export_cannot_hang_the_session() {
    // Opening a FIFO for reading blocks until a writer comes, unless it is non-blocking; and
    // read, it gives whatever a writer puts in (or nothing), no file's content.
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir(&srv).unwrap();
    let mode = rustix::fs::Mode::from_raw_mode(0o644);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        srv.join("p"),
        rustix::fs::FileType::Fifo,
        mode,
        0,
    )
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut c = connect(&srv);
        let list = c.call(Request::ReadDir {
            path: WirePath::default(),
            keys: vec![],
        });
        let read = c.call(Request::ReadRange {
            target: ferry_proto::Target::Path("p".into()),
            offset: 0,
            len: 100,
        });
        let recipe = c.call(Request::GetRecipe {
            target: ferry_proto::Target::Path("p".into()),
            short: false,
            known: vec![],
        });
        tx.send((format!("{list:?}"), format!("{read:?} {recipe:?}")))
            .unwrap();
    });
    let (list, answers) = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the session hung on a FIFO");
    // Not listed, and not read when named.
    assert_eq!(list, "Ok([Entries { present: [], entries: [] }])");
    assert_eq!(
        answers.matches("not a regular file").count(),
        2,
        "{answers}"
    );
}

#[test]
fn a_forgotten_reply_is_dropped_as_it_comes_and_the_session_goes_on() {
    let t = tempfile::tempdir().unwrap();
    let data = bytes(7, 3 << 20);
    fs::write(t.path().join("big"), &data).unwrap();
    fs::write(t.path().join("small"), b"hello").unwrap();
    let mut c = connect(t.path());
    let range = |offset: u64, len: u32| Request::ReadRange {
        target: ferry_proto::Target::Path("big".into()),
        offset,
        len,
    };
    // A 2 MiB range (several frames) not wanted once asked for, and a reply after it.
    let unwanted = c.send(range(0, 2 << 20)).unwrap();
    let wanted = c
        .send(Request::GetAttr {
            path: "small".into(),
        })
        .unwrap();
    c.forget(unwanted);
    match &c.replies(wanted).unwrap()[..] {
        [Reply::Attr(a)] => assert_eq!(a.size, 5),
        other => panic!("{other:?}"),
    }
    // The session goes on: the next reply is the next request's.
    let got: Vec<u8> = c
        .call(range(1 << 20, 1 << 20))
        .unwrap()
        .into_iter()
        .flat_map(|r| match r {
            Reply::Range { data, .. } => data,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(got, data[1 << 20..2 << 20]);
}

/// A symlink inside the export whose target goes through `..` opens while renames run
/// elsewhere: `openat2(RESOLVE_BENEATH)` answers EAGAIN when one races the lookup, and the
/// export tries again (before, opens failed at random under a busy server's other commits).
#[test]
fn a_symlink_through_dotdot_opens_while_renames_race() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir_all(srv.join("sub")).unwrap();
    fs::write(srv.join("f"), b"inside").unwrap();
    std::os::unix::fs::symlink("../f", srv.join("sub/l")).unwrap();
    let e = Export::open(&srv).unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let renamer = {
        let (dir, stop) = (t.path().join("elsewhere"), stop.clone());
        fs::create_dir_all(dir.join("a")).unwrap();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                fs::rename(dir.join("a"), dir.join("b")).unwrap();
                fs::rename(dir.join("b"), dir.join("a")).unwrap();
            }
        })
    };
    let opened: Vec<_> = (0..20_000)
        .map(|_| e.open_file(&"sub/l".into()).map(drop))
        .collect();
    stop.store(true, Ordering::Relaxed);
    renamer.join().unwrap();
    for r in opened {
        r.unwrap();
    }
}

#[test]
fn no_path_leaves_the_export() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir_all(srv.join("sub")).unwrap();
    fs::write(t.path().join("secret"), b"outside").unwrap();
    fs::write(srv.join("sub/inside"), b"inside").unwrap();
    std::os::unix::fs::symlink("/etc", srv.join("etc")).unwrap();
    std::os::unix::fs::symlink("../secret", srv.join("up")).unwrap();
    std::os::unix::fs::symlink("sub/inside", srv.join("ok")).unwrap();
    std::os::unix::fs::symlink("../../secret", srv.join("sub/upup")).unwrap();
    let e = Export::open(&srv).unwrap();
    assert!(
        e.open_file(&"ok".into()).is_ok(),
        "a symlink inside the export is fine"
    );
    for bad in ["etc/passwd", "up", "sub/upup"] {
        let err = e.open_file(&bad.into()).expect_err(bad);
        assert_eq!(err.raw_os_error(), Some(18), "{bad}: {err}"); // EXDEV from RESOLVE_BENEATH
    }
    assert!(e.open_dir(&"etc".into()).is_err());
    // Through the protocol: a clear error code, and nothing read.
    let mut c = connect(&srv);
    for bad in ["up", "etc/passwd"] {
        match c.call(Request::GetRecipe {
            target: ferry_proto::Target::Path(bad.into()),
            short: false,
            known: vec![],
        }) {
            Err(ferry_fs::ConnError::Remote { code, .. }) => {
                assert_eq!(code, ErrorCode::Escape, "{bad}")
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    // Nor is a file system reached through a symlink out described (a symlink as the last
    // component is not followed: it is the export's own).
    match c.call(Request::StatFs {
        path: "etc/passwd".into(),
    }) {
        Err(ferry_fs::ConnError::Remote { code, .. }) => assert_eq!(code, ErrorCode::Escape),
        other => panic!("statfs: {other:?}"),
    }
    match c
        .call(Request::StatFs { path: "sub".into() })
        .unwrap()
        .pop()
    {
        Some(Reply::FsStats(f)) => assert!(f.blocks > 0 && f.block_size > 0, "{f:?}"),
        other => panic!("{other:?}"),
    }
    // Paths with `..` do not even decode.
    let mut w = vec![];
    w.push(5u8);
    w.extend_from_slice(b"../..");
    let f = Frame {
        msg_type: 0x10,
        flags: 0,
        request_id: 1,
        body: w,
    };
    let export = Export::open(&srv).unwrap();
    let mut server = Server::new(export, grouping(), staging());
    server.handle(
        &Message::Hello(Hello {
            version: ferry_proto::VERSION,
            features: 0,
            agent: "t".into(),
        })
        .to_frame(0),
    );
    let reply = Message::decode(&server.handle(&f)[0]).unwrap();
    assert!(
        matches!(
            reply,
            Message::Reply(Reply::Error {
                code: ErrorCode::BadRequest,
                ..
            })
        ),
        "{reply:?}"
    );
}

#[test]
fn requests_before_hello_and_garbage_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let mut server = Server::new(
        Export::open(t.path()).unwrap(),
        ServerOptions::default(),
        staging(),
    );
    let r = server.handle(&Message::Request(Request::GetAttr { path: "".into() }).to_frame(3));
    assert!(matches!(
        Message::decode(&r[0]).unwrap(),
        Message::Reply(Reply::Error {
            code: ErrorCode::BadRequest,
            ..
        })
    ));
    // A framing error ends the session with an error, not a panic.
    let (a, mut b) = UnixStream::pair().unwrap();
    let h = std::thread::spawn(move || ferry_fs::serve(&mut server, a.try_clone().unwrap(), a));
    use std::io::Write;
    b.write_all(&u32::MAX.to_le_bytes()).unwrap();
    assert!(h.join().unwrap().is_err());
}

/// A hostile server answering requests with `MORE` frames that never end: the client refuses
/// the reply at its bound (`MAX_REPLY`), never holding more. The reply to a request the client
/// waits for, and to the Ping it sends unwaited for to time the link (once dropped without end).
#[test]
fn a_reply_that_never_ends_is_refused_at_its_bound() {
    for endless_ping in [false, true] {
        let (a, b) = UnixStream::pair().unwrap();
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            let (mut r, mut w) = (a.try_clone().unwrap(), a);
            let mut dec = FrameDecoder::new();
            let mut buf = [0u8; 65536];
            loop {
                while let Some(f) = dec.next_frame().unwrap() {
                    match Message::decode(&f).unwrap() {
                        Message::Hello(h) => {
                            let hello = Message::Hello(ferry_proto::Hello { features: 0, ..h });
                            w.write_all(&hello.encode(f.request_id, false).unwrap())
                                .unwrap();
                        }
                        Message::Request(Request::Ping) if !endless_ping => {
                            let ok = Message::Reply(Reply::Ok);
                            w.write_all(&ok.encode(f.request_id, false).unwrap())
                                .unwrap();
                        }
                        _ => loop {
                            let mut more = Message::Reply(Reply::Range {
                                version: 1,
                                oid: None,
                                data: vec![7; 4 << 20],
                            })
                            .to_frame(f.request_id);
                            more.flags |= ferry_proto::FLAG_MORE;
                            if w.write_all(&more.encode(false).unwrap()).is_err() {
                                return;
                            }
                        },
                    }
                }
                match r.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => dec.feed(&buf[..n]),
                }
            }
        });
        let mut c = Connection::open(b.try_clone().unwrap(), b).unwrap();
        let id = c.send(Request::GetAttr { path: "".into() }).unwrap();
        let e = c.replies(id).unwrap_err();
        assert!(
            matches!(&e, ferry_fs::ConnError::Unexpected(m) if m.contains("a reply of over")),
            "{e:?}"
        );
        // The Ping sent as the Hello came is request 1.
        let refused = if endless_ping { 1 } else { id };
        assert!(
            e.to_string().ends_with(&format!("request {refused}")),
            "{e}"
        );
        assert!(
            c.traffic().bytes_received <= ferry_fs::conn::MAX_REPLY as u64 + (9 << 20),
            "{} bytes taken",
            c.traffic().bytes_received
        );
    }
}

/// A server that lies: its chunk does not match the id in its recipe.
#[test]
fn page_references_cannot_blow_up_a_recipe() {
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("f");
    // An old version of many pages at the destination, so the client names its pages.
    fs::write(&dest, bytes(3, 4 << 20)).unwrap();
    let mut c = fake_server(move |q| match q {
        Request::GetAttr { .. } => Reply::Attr(attr(ferry_proto::FileKind::File, 100)),
        // 300,000 references to one page: tens of millions of chunks from a 600 KB reply.
        Request::GetRecipe { .. } => Reply::Recipe(ferry_proto::RecipeDelta {
            version: 1,
            total_chunks: 1 << 32,
            check: [0; 32],
            alg: ferry_format::HashAlg::Blake3,
            parts: vec![ferry_proto::RecipePart::Known(0); 300_000],
        }),
        _ => Reply::Ok,
    });
    let err = get(
        &mut c,
        "f",
        &dest,
        &MemStore::new(ferry_format::HashAlg::Blake3),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("than the file's size allows"),
        "{err}"
    );
}

#[test]
fn a_lying_server_cannot_plant_data() {
    let t = tempfile::tempdir().unwrap();
    let good = b"the real content".to_vec();
    let id = ferry_format::Id::hash(ferry_format::HashAlg::Blake3, &good);
    let mut c = fake_server(move |q| match q {
        Request::GetAttr { .. } => Reply::Attr(attr(ferry_proto::FileKind::File, 16)),
        Request::GetRecipe { .. } => recipe_reply(vec![ferry_format::ChunkRef { id, len: 16 }]),
        Request::GetChunks(_) => chunks_reply(vec![(0, b"planted content!".to_vec())]),
        _ => Reply::Ok,
    });
    let dest = t.path().join("f");
    // A cache holding something: the file comes by recipe, not whole.
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    let other = ferry_store::VerifiedChunk::hash(ferry_format::HashAlg::Blake3, b"other");
    ferry_store::ChunkStore::put(&cache, &other).unwrap();
    let err = get(&mut c, "f", &dest, &cache).unwrap_err();
    assert!(matches!(err, GetError::BadData(_)), "{err}");
    assert!(!dest.exists(), "nothing written");
}

/// A file whose ranges do not hash to the object id they named (it changed meanwhile, or the
/// server lies), or that never named one, never lands: it is fetched again by recipe.
#[test]
fn bytes_by_ranges_that_miss_their_id_are_fetched_again_by_recipe() {
    let oid = ferry_format::Id::hash(ferry_format::HashAlg::Blake3, &bytes(5, 100_000));
    ranges_named(Some(oid));
    ranges_named(None);
}

fn ranges_named(oid: Option<ferry_format::Id>) {
    use ferry_format::{ChunkRef, HashAlg};
    let t = tempfile::tempdir().unwrap();
    let good = bytes(5, 100_000);
    let chunks: Vec<(ChunkRef, Vec<u8>)> = {
        let mut out = vec![];
        ferry_format::chunk_object(
            &good[..],
            &ChunkerSpec::default(),
            HashAlg::Blake3,
            |c, d| {
                out.push((*c, d.to_vec()));
                Ok::<_, std::io::Error>(())
            },
        )
        .unwrap();
        out
    };
    let mut c = fake_server(move |q| match q {
        Request::GetAttr { .. } => Reply::Attr(attr(ferry_proto::FileKind::File, 100_000)),
        Request::ReadRange { offset, len, .. } => Reply::Range {
            version: 1,
            oid,
            data: bytes(6, 100_000)[offset as usize..][..len as usize].to_vec(),
        },
        Request::GetRecipe { .. } => recipe_reply(chunks.iter().map(|(c, _)| *c).collect()),
        Request::GetChunks(ferry_proto::GetChunks {
            ids: ferry_proto::Ids::Full(ids),
            ..
        }) => chunks_reply(
            ids.iter()
                .enumerate()
                .filter_map(|(i, id)| {
                    let (_, d) = chunks.iter().find(|(c, _)| c.id == *id)?;
                    Some((i as u32, d.clone()))
                })
                .collect(),
        ),
        _ => Reply::Ok,
    });
    let dest = t.path().join("f");
    let cache = MemStore::new(HashAlg::Blake3);
    get(&mut c, "f", &dest, &cache).unwrap();
    assert_eq!(fs::read(&dest).unwrap(), bytes(5, 100_000));
}

/// CVE-2024-12087 class: a server lists a name as a symlink to a directory outside the
/// destination, then again as a directory, hoping the client writes through the link.
#[test]
fn a_hostile_server_cannot_write_through_a_symlink() {
    let t = tempfile::tempdir().unwrap();
    let victim = t.path().join("victim");
    fs::create_dir(&victim).unwrap();
    let victim_s = victim.to_str().unwrap().as_bytes().to_vec();
    let content = b"pwned".to_vec();
    let id = ferry_format::Id::hash(ferry_format::HashAlg::Blake3, &content);
    let asked = std::sync::atomic::AtomicUsize::new(0);
    let mut c = fake_server(move |q| match q {
        Request::GetAttr { path } => match path.as_bytes() {
            b"" => Reply::Attr(attr(ferry_proto::FileKind::Dir, 0)),
            // First a symlink, then a directory.
            b"d" if asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 => {
                Reply::Attr(attr(ferry_proto::FileKind::Symlink, 0))
            }
            b"d" => Reply::Attr(attr(ferry_proto::FileKind::Dir, 0)),
            b"d/x" => Reply::Attr(attr(ferry_proto::FileKind::File, 5)),
            _ => Reply::Attr(attr(ferry_proto::FileKind::Symlink, 0)),
        },
        Request::ReadDir { path, .. } if path.as_bytes().is_empty() => Reply::Entries {
            present: vec![],
            entries: vec![
                ferry_proto::DirEntry {
                    name: b"d".to_vec(),
                    attr: attr(ferry_proto::FileKind::Symlink, 0),
                },
                ferry_proto::DirEntry {
                    name: b"d".to_vec(),
                    attr: attr(ferry_proto::FileKind::Dir, 0),
                },
            ],
        },
        Request::ReadDir { .. } => Reply::Entries {
            present: vec![],
            entries: vec![ferry_proto::DirEntry {
                name: b"x".to_vec(),
                attr: attr(ferry_proto::FileKind::File, 5),
            }],
        },
        Request::ReadLink { .. } => Reply::Link(victim_s.clone()),
        Request::ReadFiles { files } => Reply::Files {
            files: files.iter().map(|_| Some((5, None))).collect(),
            payload: ferry_proto::Payload::Plain(content.repeat(files.len())),
        },
        Request::GetRecipe { .. } => recipe_reply(vec![ferry_format::ChunkRef { id, len: 5 }]),
        Request::GetChunks(_) => chunks_reply(vec![(0, content.clone())]),
        _ => Reply::Ok,
    });
    let err = get(
        &mut c,
        "",
        &t.path().join("dst"),
        &MemStore::new(ferry_format::HashAlg::Blake3),
    );
    assert!(
        fs::read_dir(&victim).unwrap().next().is_none(),
        "wrote through the symlink: {err:?}"
    );
    // Refused either way round: the directory is made first (symlinks are made last), so the
    // symlink finds a directory in its way.
    let msg = err.unwrap_err().to_string();
    assert!(
        msg.contains("a symlink is in the way (never written through)")
            || msg.contains("a directory is in the way"),
        "{msg}"
    );
}

#[test]
fn symlinks_are_recreated_not_followed() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    tree(&srv);
    std::os::unix::fs::symlink("src/a.bin", srv.join("rel")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", srv.join("abs")).unwrap();
    let mut c = connect(&srv);
    let dst = t.path().join("dst");
    get(
        &mut c,
        "",
        &dst,
        &MemStore::new(ferry_format::HashAlg::Blake3),
    )
    .unwrap();
    assert_eq!(
        fs::read_link(dst.join("rel")).unwrap(),
        Path::new("src/a.bin")
    );
    assert_eq!(
        fs::read_link(dst.join("abs")).unwrap(),
        Path::new("/etc/passwd")
    );
    same_tree(&srv.join("src"), &dst.join("src"));
    // Again, over the existing tree: nothing changes, nothing breaks.
    get(
        &mut c,
        "",
        &dst,
        &MemStore::new(ferry_format::HashAlg::Blake3),
    )
    .unwrap();
    assert_eq!(
        fs::read_link(dst.join("abs")).unwrap(),
        Path::new("/etc/passwd")
    );
}

/// Entry keys are short and may collide: a listing delta that does not add up to the
/// directory's tree digest is not trusted, the whole listing is asked for instead.
#[test]
fn a_listing_delta_that_does_not_add_up_is_not_trusted() {
    use ferry_proto::{DirEntry, FileKind, TreeItem};
    use std::os::unix::fs::MetadataExt;
    use std::sync::{Arc, Mutex};
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("dest");
    fs::create_dir(&dest).unwrap();
    let mut entries = vec![];
    for name in ["a", "b"] {
        fs::write(dest.join(name), name).unwrap();
        let m = fs::metadata(dest.join(name)).unwrap();
        entries.push(DirEntry {
            name: name.as_bytes().to_vec(),
            attr: ferry_proto::Attr {
                mode: m.mode() & 0o7777,
                mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
                ..attr(FileKind::File, 1)
            },
        });
    }
    // The server also has an empty file `c`, which its delta leaves out.
    entries.push(DirEntry {
        name: b"c".to_vec(),
        attr: attr(FileKind::File, 0),
    });
    let mut items: Vec<_> = entries
        .iter()
        .map(|e| {
            let item = TreeItem::File {
                mode: e.attr.mode,
                size: e.attr.size,
                mtime_ns: e.attr.mtime_ns,
            };
            (e.name.clone(), item)
        })
        .collect();
    let digest = ferry_proto::tree_digest(&mut items);
    let asked = Arc::new(Mutex::new(vec![]));
    let log = asked.clone();
    let mut c = fake_server(move |q| {
        log.lock()
            .unwrap()
            .push(format!("{q:?}").chars().take(12).collect::<String>());
        match q {
            Request::GetAttr { .. } => Reply::Attr(ferry_proto::Attr {
                oid: Some(ferry_format::Id::from_parts(
                    ferry_format::HashAlg::Blake3,
                    digest,
                )),
                ..attr(FileKind::Dir, 0)
            }),
            Request::ReadDir { keys, .. } if !keys.is_empty() => Reply::Entries {
                present: vec![true; keys.len()],
                entries: vec![],
            },
            Request::ReadDir { .. } => Reply::Entries {
                present: vec![],
                entries: entries.clone(),
            },
            Request::ReadFiles { files } => Reply::Files {
                files: files.iter().map(|_| Some((0, None))).collect(),
                payload: ferry_proto::Payload::Plain(vec![]),
            },
            Request::GetRecipe { .. } => recipe_reply(vec![]),
            _ => Reply::Ok,
        }
    });
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    let s = get(&mut c, "d", &dest, &cache).unwrap();
    let asked = asked.lock().unwrap().clone();
    // Against the entries held here first, then whole.
    let listings: Vec<_> = asked.iter().filter(|q| q.starts_with("ReadDir")).collect();
    assert_eq!(listings.len(), 2, "{asked:?}");
    assert!(dest.join("c").is_file(), "the entry the delta left out");
    assert_eq!(s.unchanged, 2, "{s:?}");
}

/// One GetChunks naming one 64 KiB chunk 16,000 times (a 528 KB request; once 1 GB of reply
/// built in memory): the reply is bounded, plainly and against old data alike.
#[test]
fn a_chunk_asked_for_many_times_is_sent_within_a_bound() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir(&srv).unwrap();
    // One byte repeated: a single chunk of the chunker's maximum.
    let content = vec![9u8; 64 << 10];
    fs::write(srv.join("f"), &content).unwrap();
    let id = chunk_ids(&content).0[0];
    let mut c = connect(&srv);
    // The server cuts the file (and so knows its chunks) for its recipe.
    c.call(Request::GetRecipe {
        target: ferry_proto::Target::Path("f".into()),
        short: false,
        known: vec![],
    })
    .unwrap();
    let against = ferry_proto::Against {
        key_bytes: 4,
        runs: false,
        keys: Some(vec![]),
        olds: Some(vec![]),
        context: None,
    };
    for against in [None, Some(against)] {
        let before = c.traffic().bytes_received;
        let r = c
            .call(Request::GetChunks(ferry_proto::GetChunks {
                ids: ferry_proto::Ids::Full(vec![id; 16_000]),
                at: None,
                against,
            }))
            .unwrap();
        let found: usize = r
            .iter()
            .map(|r| match r {
                Reply::Chunks(c) => c.found.len(),
                other => panic!("{other:?}"),
            })
            .sum();
        assert!(found >= 1);
        let got = c.traffic().bytes_received - before;
        assert!(
            got < 20 << 20,
            "{got} bytes for one chunk asked 16,000 times"
        );
    }
}
