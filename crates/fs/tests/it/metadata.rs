//! Mirrors, dry runs, a full disk, and the server's metadata requests (attributes,
//! directories, the trash, tree digests).

use super::*;

#[test]
fn delete_mirrors_both_ways_without_following_symlinks() {
    let t = tempfile::tempdir().unwrap();
    let (srv, dst, outside) = (
        t.path().join("srv"),
        t.path().join("dst"),
        t.path().join("outside"),
    );
    tree(&srv);
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("precious"), b"keep me").unwrap();
    let mut c = connect(&srv);
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    get(&mut c, "", &dst, &cache).unwrap();
    // Extra things at the destination: a file, a directory tree, a symlink to a directory outside.
    fs::write(dst.join("extra"), b"x").unwrap();
    fs::create_dir_all(dst.join("src/old/deeper")).unwrap();
    fs::write(dst.join("src/old/deeper/f"), b"y").unwrap();
    std::os::unix::fs::symlink(&outside, dst.join("src/link-out")).unwrap();
    let stats = get_deleting(&mut c, "", &dst, &cache, true).unwrap();
    assert_eq!(stats.deleted, 3, "{stats:?}");
    assert!(!dst.join("extra").exists() && !dst.join("src/old").exists());
    assert!(fs::symlink_metadata(dst.join("src/link-out")).is_err());
    assert_eq!(
        fs::read(outside.join("precious")).unwrap(),
        b"keep me",
        "deleting a symlink never follows it"
    );
    same_tree(&srv, &dst);

    // The other way: the server has extras; put --delete removes them, directories included.
    fs::create_dir_all(srv.join("src/stale/sub")).unwrap();
    fs::write(srv.join("src/stale/sub/f"), b"z").unwrap();
    fs::write(srv.join("stale-file"), b"z").unwrap();
    let mut ps = ferry_fs::PutStats::default();
    ferry_fs::put(&mut c, &dst, &WirePath::default(), &opts(true), &mut ps).unwrap();
    assert_eq!(ps.deleted, 2, "{ps:?}");
    assert!(!srv.join("src/stale").exists() && !srv.join("stale-file").exists());
    same_tree(&dst, &srv);
}

#[test]
fn dry_run_changes_nothing_and_says_what_it_would_do() {
    let t = tempfile::tempdir().unwrap();
    let (srv, dst) = (t.path().join("srv"), t.path().join("dst"));
    tree(&srv);
    let mut c = connect(&srv);
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    get(&mut c, "", &dst, &cache).unwrap();
    fs::write(srv.join("one"), b"changed on the server").unwrap();
    fs::write(dst.join("extra"), b"only here").unwrap();
    let before = fs::read(dst.join("one")).unwrap();
    let src = Sources {
        borrowing: true,
        cache: &cache,
        chunker: ChunkerSpec::default(),
        delete: true,
        dry_run: true,
        progress: None,
        lookaside: None,
        cold: false,
        ranges: false,
        short_ids: true,
        cache_file_max: u64::MAX,
        mirrors: None,
    };
    let mut stats = GetStats::default();
    ferry_fs::get(&mut c, &WirePath::default(), &dst, &src, &mut stats).unwrap();
    assert_eq!(fs::read(dst.join("one")).unwrap(), before);
    assert!(dst.join("extra").exists());
    assert_eq!(stats.planned.len(), 2, "{:?}", stats.planned);
    assert!(stats
        .planned
        .iter()
        .any(|l| l.starts_with("fetch") && l.contains("one")));
    assert!(stats
        .planned
        .iter()
        .any(|l| l.starts_with("delete") && l.contains("extra")));

    let dry = ferry_fs::PutOptions {
        chunker: ChunkerSpec::default(),
        delete: true,
        dry_run: true,
        progress: None,
        cache: None,
        fewer_round_trips: false,
        stat_after: None,
        sync_after: false,
    };
    let mut ps = ferry_fs::PutStats::default();
    ferry_fs::put(&mut c, &dst, &WirePath::default(), &dry, &mut ps).unwrap();
    assert_eq!(fs::read(srv.join("one")).unwrap(), b"changed on the server");
    assert!(!srv.join("extra").exists());
    assert!(
        ps.planned
            .iter()
            .any(|l| l.starts_with("send") && l.contains("extra")),
        "{:?}",
        ps.planned
    );
    assert!(
        ps.planned
            .iter()
            .any(|l| l.starts_with("send") && l.contains("one")),
        "{:?}",
        ps.planned
    );
}

/// A tmpfs of `size` mounted for the life of the guard (tests that need one run as root).
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        let root = std::process::Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        if !root {
            return None;
        }
        fs::create_dir_all(at).unwrap();
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs");
        Some(Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: a server thread may still hold the export's directory for a moment after
        // its client hung up.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_full_disk_on_either_side_fails_cleanly_and_keeps_the_old_file() {
    let t = tempfile::tempdir().unwrap();
    let Some(_srv_fs) = Tmpfs::mount(&t.path().join("srv"), "2m") else {
        eprintln!("SKIPPED a_full_disk_on_either_side…: needs root to mount a tmpfs");
        return;
    };
    let srv = t.path().join("srv");
    let old = bytes(60, 500_000);
    fs::write(srv.join("f"), &old).unwrap();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("f"), bytes(61, 3_000_000)).unwrap();

    // Server side: the commit cannot fit; the client hears "no space", the old file stays.
    let mut c = connect(&srv);
    match put(&mut c, &src.join("f"), "f") {
        Err(GetError::Conn(ferry_fs::ConnError::Remote { code, message })) => {
            assert_eq!(code, ErrorCode::NoSpace, "{message}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fs::read(srv.join("f")).unwrap(), old);
    let left: Vec<_> = fs::read_dir(&srv)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("f")],
        "no temporary left"
    );
    // The session is still usable.
    fs::write(src.join("g"), b"small").unwrap();
    put(&mut c, &src.join("g"), "g").unwrap();
    assert_eq!(fs::read(srv.join("g")).unwrap(), b"small");

    // Client side: fetching into a full disk fails with a clear error; the old copy stays.
    let Some(_dst_fs) = Tmpfs::mount(&t.path().join("dst"), "1m") else {
        unreachable!()
    };
    let dst = t.path().join("dst");
    fs::write(srv.join("f"), bytes(62, 1_500_000)).unwrap();
    let small_old = bytes(63, 100_000);
    fs::write(dst.join("f"), &small_old).unwrap();
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    let mut c = connect(&srv);
    let e = get(&mut c, "f", &dst.join("f"), &cache).unwrap_err();
    assert!(e.to_string().contains("No space"), "{e}");
    assert_eq!(fs::read(dst.join("f")).unwrap(), small_old);
}

#[test]
fn a_changed_directory_costs_its_changed_entries() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir_all(srv.join("d")).unwrap();
    // 2,000 files with names that do not compress: a whole listing is over 50 KB.
    for i in 0..2000u64 {
        let name = blake3::hash(&i.to_le_bytes()).to_hex()[..16].to_string();
        fs::write(srv.join("d").join(name), i.to_le_bytes()).unwrap();
    }
    let dest = t.path().join("dest");
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    get(&mut connect(&srv), "d", &dest, &cache).unwrap();
    fs::write(srv.join("d/new"), b"one new file").unwrap();
    let mut c = connect(&srv);
    let s = get(&mut c, "d", &dest, &cache).unwrap();
    same_tree(&srv.join("d"), &dest);
    assert_eq!(s.unchanged, 2000, "{s:?}");
    let tr = c.traffic();
    // Keys of 3 bytes go up; only the new entry comes down.
    assert!(tr.bytes_sent < 8_000, "{tr:?}");
    assert!(tr.bytes_received < 2_000, "{tr:?}");
}

/// SetAttr on a symlink sets the symlink's own times (`touch -h`, which failed with ELOOP: `cp
/// -a` and `rsync -a` of any tree with symlinks exited with errors through the mount), never
/// its target's; and a file's owner gives back the permissions he took away (the file is not
/// opened for reading to change them).
#[test]
fn set_attr_touches_a_symlink_itself_and_needs_no_access_to_the_file() {
    use std::os::unix::fs::MetadataExt;
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    fs::write(root.join("f"), b"x").unwrap();
    std::os::unix::fs::symlink("f", root.join("l")).unwrap();
    let before = fs::metadata(root.join("f")).unwrap().mtime();
    let mut c = connect(root);
    c.call(Request::SetAttr {
        path: "l".into(),
        mode: Some(0o600),
        mtime_ns: Some(1_000_000_000_000_000_000),
    })
    .unwrap();
    assert_eq!(
        fs::symlink_metadata(root.join("l")).unwrap().mtime(),
        1_000_000_000
    );
    let f = fs::metadata(root.join("f")).unwrap();
    assert_eq!((f.mtime(), f.mode() & 0o777), (before, 0o644));
    for mode in [0, 0o200, 0o644] {
        c.call(Request::SetAttr {
            path: "f".into(),
            mode: Some(mode),
            mtime_ns: Some(2_000_000_000_000_000_000),
        })
        .unwrap();
        let f = fs::metadata(root.join("f")).unwrap();
        assert_eq!((f.mode() & 0o777, f.mtime()), (mode, 2_000_000_000));
    }
}

/// Mkdir makes the mode asked for: not the server's umask of it, and with the sticky bit
/// (`(umask 0; mkdir d)` in the mount gave 755, `mkdir -m 1777` gave 1755).
#[test]
fn mkdir_makes_the_mode_asked_for() {
    use std::os::unix::fs::MetadataExt;
    let t = tempfile::tempdir().unwrap();
    let mut c = connect(t.path());
    // The test process's umask (022 as a rule) strips what mkdir(2) alone would.
    let made: Vec<u32> = [0o777, 0o1777, 0o2750, 0o700]
        .iter()
        .map(|&mode| {
            let name = format!("d{mode:o}");
            c.call(Request::Mkdir {
                path: name.as_str().into(),
                mode,
            })
            .unwrap();
            fs::metadata(t.path().join(&name)).unwrap().mode() & 0o7777
        })
        .collect();
    assert_eq!(made, [0o777, 0o1777, 0o2750, 0o700]);
}

/// The trash is bounded in entries as well as bytes, and trimmed once in many commits (each
/// commit scanned it whole: bulk copies through the mount were quadratic); an empty version is
/// not kept at all (every create through the mount replaces one).
#[test]
fn the_trash_keeps_few_entries_and_no_empty_versions() {
    let t = tempfile::tempdir().unwrap();
    let (src, srv) = (t.path().join("src"), t.path().join("srv"));
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(&srv).unwrap();
    let (a, b) = UnixStream::pair().unwrap();
    let export = Export::open(&srv).unwrap();
    std::thread::spawn(move || {
        let opts = ServerOptions {
            trash_entries: 32,
            ..ServerOptions::default()
        };
        let mut server = Server::new(export, opts, staging());
        let _ = ferry_fs::serve(&mut server, a.try_clone().unwrap(), a);
    });
    let mut c = Connection::open(b.try_clone().unwrap(), b).unwrap();
    for i in 0..100u64 {
        fs::write(src.join("f"), bytes(i, 100)).unwrap();
        fs::write(src.join("empty"), if i % 2 == 0 { vec![] } else { vec![1] }).unwrap();
        let mut ps = ferry_fs::PutStats::default();
        ferry_fs::put(&mut c, &src, &"".into(), &opts(false), &mut ps).unwrap();
    }
    let trash: Vec<_> = fs::read_dir(srv.join(".ferry-trash"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .collect();
    // At most the bound and a sixteenth of it added since the last trim.
    assert!(trash.len() <= 32 + 2, "{} entries", trash.len());
    assert!(trash.iter().all(|&len| len > 0), "an empty version kept");
}

/// A client that asks for no tree digests (a mount) gets directories' attributes without one,
/// in GetAttr and in listings: the server reads no subtree for them. Others get them.
#[test]
fn a_client_asking_for_no_tree_digests_gets_none() {
    use ferry_proto::{Reply, Request, FEATURE_NO_TREE_DIGESTS};
    let t = tempfile::tempdir().unwrap();
    wide_tree(&t.path().join("up"));
    let open = |ask: u64| connect_asking(t.path(), ask);
    let digests = |c: &mut Connection<UnixStream, UnixStream>| {
        let attr = match c
            .call(Request::GetAttr { path: "up".into() })
            .unwrap()
            .pop()
        {
            Some(Reply::Attr(a)) => a,
            other => panic!("{other:?}"),
        };
        let mut listed = vec![];
        for r in c
            .call(Request::ReadDir {
                path: "up".into(),
                keys: vec![],
            })
            .unwrap()
        {
            let Reply::Entries { entries, .. } = r else {
                panic!("{r:?}")
            };
            listed.extend(
                entries
                    .into_iter()
                    .filter(|e| e.attr.kind == ferry_proto::FileKind::Dir)
                    .map(|e| e.attr.oid.is_some()),
            );
        }
        assert!(!listed.is_empty());
        (attr.oid.is_some(), listed)
    };
    let mut plain = open(0);
    let (root, subdirs) = digests(&mut plain);
    assert!(root && subdirs.iter().all(|&d| d));
    // Nor does it get the rest of stat(2) unless it asks.
    let stat = |c: &mut Connection<UnixStream, UnixStream>| match c
        .call(Request::GetAttr { path: "up".into() })
        .unwrap()
        .pop()
    {
        Some(Reply::Attr(a)) => a.extra,
        other => panic!("{other:?}"),
    };
    assert_eq!(stat(&mut plain), None);
    let nlink = stat(&mut open(ferry_proto::FEATURE_STAT_EXTRA))
        .unwrap()
        .nlink;
    assert_eq!(nlink, 2 + 3, "up holds d0, d1 and d2");
    let mut lean = open(FEATURE_NO_TREE_DIGESTS);
    let (root, subdirs) = digests(&mut lean);
    assert!(!root && subdirs.iter().all(|&d| !d));
}

/// A hook on a request's answer runs as soon as that answer arrives, while the reader waits for
/// a later one (the mount's removals: other sessions go on once they are answered); at once for
/// one answered already.
#[test]
fn a_hook_runs_when_its_answer_arrives() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("f"), b"x").unwrap();
    let mut c = connect(t.path());
    let fired = Arc::new(AtomicU32::new(0));
    let path = |s: &str| WirePath::new(s.as_bytes().to_vec()).unwrap();
    let first = c.send(Request::GetAttr { path: path("f") }).unwrap();
    let second = c.send(Request::GetAttr { path: path("") }).unwrap();
    let f = fired.clone();
    c.on_answered(
        first,
        Box::new(move || {
            f.fetch_add(1, Ordering::SeqCst);
        }),
    );
    assert_eq!(
        fired.load(Ordering::SeqCst),
        0,
        "not answered before it is read"
    );
    c.replies(second).unwrap();
    assert_eq!(
        fired.load(Ordering::SeqCst),
        1,
        "run while the later answer was read"
    );
    c.replies(first).unwrap();
    let f = fired.clone();
    c.on_answered(
        first,
        Box::new(move || {
            f.fetch_add(1, Ordering::SeqCst);
        }),
    );
    assert_eq!(fired.load(Ordering::SeqCst), 2, "answered already: at once");
}
