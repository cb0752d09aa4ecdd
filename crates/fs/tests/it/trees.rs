//! Walks of a tree: unchanged subtrees skipped by their digests, and ReadTree (which
//! directories of a tree differ from the client's, in one exchange), so a walk costs the same
//! round trips however deep the tree.

use super::*;
use ferry_proto::{entry_hash, KnownEntries, TreeItem, FEATURES, FEATURE_TREE_LISTINGS};

/// The hash the client names the directory `rel` of the tree at `tree` by (its place below
/// that tree, its mode, time and tree digest).
fn dir_hash(c: &mut Connection<UnixStream, UnixStream>, tree: &str, rel: &str) -> u64 {
    let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
    hash_as(c, &format!("{tree}/{rel}"), dir, name)
}

/// The hash of the server's directory at `path` as if it were `name` in `dir` of a tree.
fn hash_as(c: &mut Connection<UnixStream, UnixStream>, path: &str, dir: &str, name: &str) -> u64 {
    let a = attr_of(c, path);
    let item = TreeItem::Dir {
        mode: a.mode,
        mtime_ns: a.mtime_ns,
        digest: *a.oid.expect("a tree digest").digest(),
    };
    entry_hash(dir.as_bytes(), name.as_bytes(), &item)
}

/// A client of a server on a thread serving `root` that offers only `features`.
fn connect_offering(root: &Path, features: u64) -> Connection<UnixStream, UnixStream> {
    let (a, b) = UnixStream::pair().unwrap();
    let export = Export::open(root).unwrap();
    let opts = ServerOptions {
        features,
        ..grouping()
    };
    std::thread::spawn(move || {
        let mut server = Server::new(export, opts, staging());
        let _ = ferry_fs::serve(&mut server, a.try_clone().unwrap(), a);
    });
    Connection::open(b.try_clone().unwrap(), b).unwrap()
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
    let a_b_as_b = hash_as(&mut c, "t/a/b", "", "b");
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

/// Sets the modification time of everything under `root`, and of `root`, to one instant: the
/// directories' hashes (which hold their times) are then the same in every run, and so is
/// whether the filter takes one for another (about 1 in 2,000).
fn pin_times(root: &Path) {
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    for e in fs::read_dir(root).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            pin_times(&e.path());
        } else {
            fs::File::options()
                .write(true)
                .open(e.path())
                .unwrap()
                .set_modified(when)
                .unwrap();
        }
    }
    fs::File::open(root).unwrap().set_modified(when).unwrap();
}

#[test]
fn a_deep_tree_costs_the_round_trips_of_a_shallow_one() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    deep_tree(&srv.join("up"), 12);
    pin_times(&srv);
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    let trips = |features: u64, down: &Path, cache: &MemStore| {
        let mut c = connect_offering(&srv, features);
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
    pin_times(&srv);
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

/// The round trips of a get of `up` into `down` over `c`.
fn get_trips<R: std::io::Read + Send>(
    mut c: Connection<R, UnixStream>,
    down: &Path,
    cache: &MemStore,
) -> u64 {
    let before = c.traffic().round_trips;
    get_with(&mut c, "up", down, cache, false, true, true).unwrap();
    c.traffic().round_trips - before
}

/// On a far link the chunks that come plainly are asked for with those against old data, not
/// a round trip after them (crates-vendor over the lab's DSL spent its last round trip on 4 KB
/// of them); on a near one after them, as before.
#[test]
fn on_a_far_link_plain_chunks_come_with_those_against_old_data() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    deep_tree(&srv.join("up"), 6);
    pin_times(&srv);
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    let down = t.path().join("down");
    get(&mut connect(&srv), "up", &down, &cache).unwrap();
    // Each time a file grows (its new chunks come against its old version) and a new one
    // comes (its chunks plainly).
    let trips = |far: bool, seed: u64| {
        let grown = srv.join("up/l0/l1/l2/l3/l4/l5/f");
        let mut data = fs::read(&grown).unwrap();
        data.extend(bytes(seed, 200 << 10));
        fs::write(&grown, &data).unwrap();
        let new = srv.join(format!("up/l0/l1/new{seed}"));
        fs::write(new, bytes(seed + 1, 300 << 10)).unwrap();
        pin_times(&srv);
        let (a, b) = UnixStream::pair().unwrap();
        let export = Export::open(&srv).unwrap();
        std::thread::spawn(move || {
            let mut server = Server::new(export, grouping(), staging());
            let _ = ferry_fs::serve(&mut server, a.try_clone().unwrap(), a);
        });
        let reader = b.try_clone().unwrap();
        let n = match far {
            true => get_trips(Connection::open(Far(reader), b).unwrap(), &down, &cache),
            false => get_trips(Connection::open(reader, b).unwrap(), &down, &cache),
        };
        same_tree(&srv.join("up"), &down);
        n
    };
    let near = trips(false, 10);
    let far = trips(true, 20);
    assert_eq!(
        far + 1,
        near,
        "{far} round trips on a far link, {near} on a near one"
    );
}

/// Relays a session between a client and `server`, the stream uncompressed (the client asks
/// for none), passing every frame as it is but ReadTree's replies, to which `lie` adds paths
/// (counted in `told`).
fn lying_about_trees(
    server: UnixStream,
    lie: Vec<WirePath>,
    told: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> UnixStream {
    use std::io::{Read, Write};
    let (client, relay) = UnixStream::pair().unwrap();
    let (mut up_in, mut up_out) = (relay.try_clone().unwrap(), server.try_clone().unwrap());
    std::thread::spawn(move || std::io::copy(&mut up_in, &mut up_out));
    let (mut down_in, mut down_out) = (server, relay);
    std::thread::spawn(move || {
        let mut dec = FrameDecoder::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match down_in.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            dec.feed(&buf[..n]);
            while let Ok(Some(mut f)) = dec.next_frame() {
                if let Ok(Message::Reply(Reply::Tree(mut dirs))) = Message::decode(&f) {
                    dirs.extend(lie.iter().cloned());
                    told.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let more = f.flags;
                    f = Message::Reply(Reply::Tree(dirs)).to_frame(f.request_id);
                    f.flags = more;
                }
                if down_out.write_all(&f.encode(false).unwrap()).is_err() {
                    return;
                }
            }
        }
    });
    client
}

/// A server that names directories its tree does not have (gone, never there, or below a
/// file) costs the client listings it asks for and drops, never a wrong tree nor a failed get.
#[test]
fn directories_a_server_names_that_are_not_there_change_nothing() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    deep_tree(&srv.join("up"), 4);
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    let down = t.path().join("down");
    let lie: Vec<WirePath> = [
        "ghost",
        "l0/ghost/deeper",
        "l0/f",
        "l0/l1/l2/l3/f/x",
        "side0",
    ]
    .into_iter()
    .map(WirePath::from)
    .collect();
    for round in 0..3 {
        if round > 0 {
            // A change at the bottom: the server's tree differs from the copy here.
            let f = srv.join("up/l0/l1/l2/l3/f");
            fs::write(&f, bytes(round, 3000)).unwrap();
        }
        let told = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let b = lying_about_trees(serving(&srv), lie.clone(), told.clone());
        let reader = b.try_clone().unwrap();
        let mut c = Connection::open_with(reader, b, ferry_proto::Level::Fixed(0)).unwrap();
        get_with(&mut c, "up", &down, &cache, false, true, true).unwrap();
        same_tree(&srv.join("up"), &down);
        assert!(!down.join("ghost").exists() && !down.join("l0/ghost").exists());
        // The first get is cold and the others find a change: each asks which directories
        // differ, and is lied to.
        assert_eq!(
            told.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "round {round}"
        );
    }
}

#[test]
fn an_upload_into_a_deep_tree_costs_the_round_trips_of_a_shallow_one() {
    let t = tempfile::tempdir().unwrap();
    let (srv, src) = (t.path().join("srv"), t.path().join("src"));
    fs::create_dir(&srv).unwrap();
    deep_tree(&src, 12);
    let trips = |features: u64| {
        pin_times(&src);
        let mut c = connect_offering(&srv, features);
        let before = c.traffic().round_trips;
        put(&mut c, &src, "up").unwrap();
        same_tree(&src, &srv.join("up"));
        pin_times(&srv);
        c.traffic().round_trips - before
    };
    trips(FEATURES);
    // A file changes at the bottom: the walk costs two round trips however deep it lies
    // (GetAttr with ReadTree and the root's listing; the other listings), then the upload's own.
    let deepest = src.join("l0/l1/l2/l3/l4/l5/l6/l7/l8/l9/l10/l11/f");
    fs::write(&deepest, b"new").unwrap();
    let tree = trips(FEATURES);
    fs::write(&deepest, b"newer").unwrap();
    let level = trips(FEATURES & !FEATURE_TREE_LISTINGS);
    assert!(
        tree + 10 <= level,
        "{tree} round trips, {level} a level at a time"
    );
    // ReadTree and the root's listing go with the GetAttr, and the directories' times with
    // the commits (5 round trips before either).
    assert!(tree <= 3, "{tree} round trips");
}

#[test]
fn a_tree_costs_round_trips_per_level_not_per_file() {
    let t = tempfile::tempdir().unwrap();
    let (srv, src) = (t.path().join("srv"), t.path().join("src"));
    fs::create_dir(&srv).unwrap();
    wide_tree(&src);
    let mut c = connect(&srv);
    let before = c.traffic().round_trips;
    put(&mut c, &src, "up").unwrap();
    let put_trips = c.traffic().round_trips - before;
    let before = c.traffic().round_trips;
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    get(&mut c, "up", &t.path().join("down"), &cache).unwrap();
    let get_trips = c.traffic().round_trips - before;
    same_tree(&src, &t.path().join("down"));
    // GetAttr, a listing per level (3), the recipes, the chunks, the links.
    assert!(
        get_trips <= 8,
        "get of 303 entries took {get_trips} round trips"
    );
    assert!(
        put_trips <= 12,
        "put of 303 entries took {put_trips} round trips"
    );
}

#[test]
fn an_unchanged_subtree_costs_nothing_beyond_its_digest() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    wide_tree(&srv.join("up"));
    let down = t.path().join("down");
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    let mut c = connect(&srv);
    get(&mut c, "up", &down, &cache).unwrap();
    // Again, nothing changed: one round trip, whose GetAttr's digest covers all 300 files and
    // 3 links (a Ping went with it, and the tree and its root's listing, on the chance that it
    // changed: a few bytes each way in a tree this small).
    let before = c.traffic();
    let stats = get(&mut c, "up", &down, &cache).unwrap();
    let after = c.traffic();
    assert!(after.requests - before.requests <= 4);
    assert_eq!(after.round_trips - before.round_trips, 1);
    let (down_bytes, up_bytes) = (
        after.bytes_received - before.bytes_received,
        after.bytes_sent - before.bytes_sent,
    );
    assert!(
        down_bytes < 300 && up_bytes < 200,
        "{down_bytes} {up_bytes}"
    );
    assert_eq!(stats.unchanged, 300);
    // One file changes two levels down: only the directories on its path are listed, not
    // their unchanged siblings.
    fs::write(srv.join("up/d1/sub/f7"), b"changed").unwrap();
    let before = c.traffic();
    let stats = get(&mut c, "up", &down, &cache).unwrap();
    let after = c.traffic();
    // The file, and the symlink beside its directory (links are always read again).
    assert_eq!((stats.chunks, stats.bytes), (1, 7), "{stats:?}");
    assert_eq!(fs::read(down.join("d1/sub/f7")).unwrap(), b"changed");
    // Ping, GetAttr and ReadTree; ReadDir of up, d1 and d1/sub (not of d0, d2 and their
    // subs); the file, whole; d1/link's target.
    assert!(
        after.requests - before.requests <= 8,
        "{} requests",
        after.requests - before.requests
    );
    same_tree(&srv.join("up"), &down);
    // A local change the server lacks: that subtree is walked again, and mended.
    fs::write(down.join("d2/g3"), b"local edit").unwrap();
    get(&mut c, "up", &down, &cache).unwrap();
    same_tree(&srv.join("up"), &down);
}

#[test]
fn an_upload_skips_unchanged_subtrees_and_leaves_directory_times_equal() {
    let t = tempfile::tempdir().unwrap();
    let (src, srv) = (t.path().join("src"), t.path().join("srv"));
    fs::create_dir(&srv).unwrap();
    wide_tree(&src);
    let mut c = connect(&srv);
    put(&mut c, &src, "up").unwrap();
    // The server's directories took the local modes and times, so nothing differs now.
    let m = |p: &Path| fs::metadata(p).unwrap().modified().unwrap();
    assert_eq!(m(&src.join("d1/sub")), m(&srv.join("up/d1/sub")));
    assert_eq!(m(&src), m(&srv.join("up")));
    let before = c.traffic();
    let s = put(&mut c, &src, "up").unwrap();
    // One round trip: a Ping (which times the link) and the GetAttr whose digest covers the
    // tree, with ReadTree and the root's listing asked for on the chance that it differs
    // (a small tree's: they waste little).
    let after = c.traffic();
    assert_eq!(after.round_trips - before.round_trips, 1, "{s:?}");
    assert_eq!(after.requests - before.requests, 4, "{s:?}");
    assert_eq!(s.unchanged, 300);
    // One local edit: the directories on its path are compared, not their siblings.
    fs::write(src.join("d0/sub/f9"), b"edited").unwrap();
    let before = c.traffic();
    put(&mut c, &src, "up").unwrap();
    let requests = c.traffic().requests - before.requests;
    // Ping, GetAttr and ReadTree; ReadDir of up, d0, d0/sub; the small file's Create, Write
    // and Commit; d0/link's target; SetAttr of the three directories (not the 7 listings and
    // 300 files of a full walk).
    assert!(requests <= 13, "{requests} requests");
    same_tree(&src, &srv.join("up"));
    // Unchanged again: one round trip.
    let before = c.traffic();
    put(&mut c, &src, "up").unwrap();
    assert_eq!(c.traffic().round_trips - before.round_trips, 1);
    assert_eq!(c.traffic().requests - before.requests, 4);
}
