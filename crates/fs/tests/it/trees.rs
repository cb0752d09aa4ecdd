//! ReadTree: which directories of a tree differ from the client's, in one exchange, so a walk
//! costs the same round trips however deep the tree.

use super::*;
use ferry_proto::{entry_hash, KnownEntries, TreeItem, FEATURES, FEATURE_TREE_LISTINGS};

fn attr(c: &mut Connection<UnixStream, UnixStream>, path: &str) -> ferry_proto::Attr {
    match c
        .call(Request::GetAttr { path: path.into() })
        .unwrap()
        .pop()
    {
        Some(Reply::Attr(a)) => a,
        r => panic!("{r:?}"),
    }
}

/// The hash the client names the directory `rel` of the tree at `tree` by (its place below
/// that tree, its mode, time and tree digest).
fn dir_hash(c: &mut Connection<UnixStream, UnixStream>, tree: &str, rel: &str) -> u64 {
    let a = attr(c, &format!("{tree}/{rel}"));
    let item = TreeItem::Dir {
        mode: a.mode,
        mtime_ns: a.mtime_ns,
        digest: *a.oid.expect("a tree digest").digest(),
    };
    let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
    entry_hash(dir.as_bytes(), name.as_bytes(), &item)
}

/// The client's end of a socket to a server on a thread serving `root` with `opts`.
fn serving_opts(root: &Path, opts: ServerOptions) -> UnixStream {
    let (a, b) = UnixStream::pair().unwrap();
    let export = Export::open(root).unwrap();
    std::thread::spawn(move || {
        let mut server = Server::new(export, opts, staging());
        let _ = ferry_fs::serve(&mut server, a.try_clone().unwrap(), a);
    });
    b
}

fn read_tree(
    c: &mut Connection<UnixStream, UnixStream>,
    path: &str,
    known: &[u64],
) -> Result<Vec<String>, String> {
    let mut filter = KnownEntries::for_entries(known.len());
    for h in known {
        filter.insert(*h);
    }
    let replies = c
        .call(Request::ReadTree {
            path: path.into(),
            known: filter,
        })
        .map_err(|e| e.to_string())?;
    let mut dirs = vec![];
    for r in replies {
        match r {
            Reply::Tree(d) => dirs.extend(
                d.iter()
                    .map(|p| String::from_utf8(p.as_bytes().to_vec()).unwrap()),
            ),
            r => panic!("{r:?}"),
        }
    }
    Ok(dirs)
}

#[test]
fn the_server_names_the_directories_that_differ_breadth_first() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    for d in ["t/a/b/c", "t/x/y"] {
        fs::create_dir_all(srv.join(d)).unwrap();
    }
    fs::write(srv.join("t/a/b/f"), b"f").unwrap();
    fs::write(srv.join("t/z"), b"z").unwrap();
    let mut c = connect(&srv);
    let mut all = read_tree(&mut c, "t", &[]).unwrap();
    // Breadth first: each level after the one above it.
    assert_eq!(all[0], "");
    let depth = |p: &String| p.matches('/').count() + usize::from(!p.is_empty());
    assert!(
        all.windows(2).all(|w| depth(&w[0]) <= depth(&w[1])),
        "{all:?}"
    );
    all.sort();
    assert_eq!(all, ["", "a", "a/b", "a/b/c", "x", "x/y"]);
    // A directory the client holds as it is, and all below it, are left out.
    let a = dir_hash(&mut c, "t", "a");
    let mut got = read_tree(&mut c, "t", &[a]).unwrap();
    got.sort();
    assert_eq!(got, ["", "x", "x/y"]);
    // Named by its place below the tree asked for: held elsewhere, it is not held.
    let b = dir_hash(&mut c, "t", "a/b");
    let a_b_as_b = {
        let at = attr(&mut c, "t/a/b");
        let item = TreeItem::Dir {
            mode: at.mode,
            mtime_ns: at.mtime_ns,
            digest: *at.oid.unwrap().digest(),
        };
        entry_hash(b"", b"b", &item)
    };
    let mut got = read_tree(&mut c, "t", &[a_b_as_b]).unwrap();
    got.sort();
    assert_eq!(got, ["", "a", "a/b", "a/b/c", "x", "x/y"]);
    // A deeper one the client holds: its parent is still named, it is not.
    let mut got = read_tree(&mut c, "t", &[b]).unwrap();
    got.sort();
    assert_eq!(got, ["", "a", "x", "x/y"]);
    // A change below `a/b` changes its digest: held no longer (seen by a new session: one
    // reuses the digests it computed for a few seconds).
    fs::write(srv.join("t/a/b/c/new"), b"n").unwrap();
    let mut c = connect(&srv);
    let mut got = read_tree(&mut c, "t", &[b]).unwrap();
    got.sort();
    assert_eq!(got, ["", "a", "a/b", "a/b/c", "x", "x/y"]);
    // Everything held: the root alone.
    let every: Vec<u64> = ["a", "a/b", "a/b/c", "x", "x/y"]
        .iter()
        .map(|p| dir_hash(&mut c, "t", p))
        .collect();
    assert_eq!(read_tree(&mut c, "t", &every).unwrap(), [""]);
    // The export's root is a tree too; what is no directory is refused as such.
    assert!(read_tree(&mut c, "", &[])
        .unwrap()
        .contains(&"t/a/b/c".to_string()));
    let e = read_tree(&mut c, "t/z", &[]).unwrap_err();
    assert!(e.contains("directory"), "{e}");
    let e = read_tree(&mut c, "t/missing", &[]).unwrap_err();
    assert!(e.contains("No such file") || e.contains("not found"), "{e}");
}

/// A tree `depth` directories deep, a file at each level.
fn deep_tree(root: &Path, depth: usize) {
    let mut dir = root.to_path_buf();
    for i in 0..depth {
        dir = dir.join(format!("l{i}"));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("f"), bytes(i as u64, 2000)).unwrap();
        fs::write(root.join(format!("side{i}")), bytes(100 + i as u64, 50)).unwrap();
    }
}

#[test]
fn a_deep_tree_costs_the_round_trips_of_a_shallow_one() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    deep_tree(&srv.join("up"), 12);
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    let trips = |features: u64, down: &Path, cache: &MemStore| {
        let b = serving_opts(
            &srv,
            ServerOptions {
                features,
                ..grouping()
            },
        );
        let mut c = Connection::open(b.try_clone().unwrap(), b).unwrap();
        let before = c.traffic().round_trips;
        get(&mut c, "up", down, cache).unwrap();
        same_tree(&srv.join("up"), down);
        c.traffic().round_trips - before
    };
    // Cold: GetAttr with the tree and the root's listing; the other listings; the files whole
    // (small ones come in one request, ReadFiles) and the rest of the chunks.
    let down = t.path().join("down");
    let cold = trips(FEATURES, &down, &cache);
    assert!(cold <= 4, "{cold} round trips");
    // A file grows at the bottom, and a new one comes halfway down (too large to come whole:
    // its chunks come plainly, after those of the grown file against its old version): the
    // same, however deep they lie.
    let deepest = srv.join("up/l0/l1/l2/l3/l4/l5/l6/l7/l8/l9/l10/l11/f");
    let mut grown = fs::read(&deepest).unwrap();
    grown.extend(bytes(7, 1 << 20));
    fs::write(&deepest, &grown).unwrap();
    fs::write(srv.join("up/l0/l1/l2/l3/l4/l5/new"), bytes(8, 1 << 20)).unwrap();
    let warm = trips(FEATURES, &down, &cache);
    assert!(warm <= 5, "{warm} round trips");
    // Without ReadTree, a round trip a level.
    fs::write(
        srv.join("up/l0/l1/l2/l3/l4/l5/l6/l7/l8/l9/l10/l11/f"),
        b"newer",
    )
    .unwrap();
    let level = trips(FEATURES & !FEATURE_TREE_LISTINGS, &down, &cache);
    assert!(level >= 13, "{level} round trips");
}

#[test]
fn an_upload_into_a_deep_tree_costs_the_round_trips_of_a_shallow_one() {
    let t = tempfile::tempdir().unwrap();
    let (srv, src) = (t.path().join("srv"), t.path().join("src"));
    fs::create_dir(&srv).unwrap();
    deep_tree(&src, 12);
    let trips = |features: u64| {
        let b = serving_opts(
            &srv,
            ServerOptions {
                features,
                ..grouping()
            },
        );
        let mut c = Connection::open(b.try_clone().unwrap(), b).unwrap();
        let before = c.traffic().round_trips;
        put(&mut c, &src, "up").unwrap();
        same_tree(&src, &srv.join("up"));
        c.traffic().round_trips - before
    };
    trips(FEATURES);
    // A file changes at the bottom: the walk costs two round trips however deep it lies
    // (GetAttr; ReadTree with the root's listing; the other listings), then the upload's own.
    let deepest = src.join("l0/l1/l2/l3/l4/l5/l6/l7/l8/l9/l10/l11/f");
    fs::write(&deepest, b"new").unwrap();
    let tree = trips(FEATURES);
    fs::write(&deepest, b"newer").unwrap();
    let level = trips(FEATURES & !FEATURE_TREE_LISTINGS);
    assert!(
        tree + 10 <= level,
        "{tree} round trips, {level} a level at a time"
    );
    assert!(tree <= 6, "{tree} round trips");
}
