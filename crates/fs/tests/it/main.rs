//! The file service end to end over in-process sockets, and its confinement.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

use ferry_chunk::ChunkerSpec;
use ferry_fs::{Connection, Export, GetError, GetStats, Server, ServerOptions, Sources};
use ferry_proto::{ErrorCode, Frame, FrameDecoder, Hello, Message, Reply, Request, WirePath};
use ferry_store::{LocalStore, MemStore, Options};

mod breaks;
mod escapes;
mod indexing;
mod links;
mod mirrors;
mod ranges;
mod replace;
mod session;
mod trees;

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    blake3::Hasher::new_derive_key("ferry fs tests")
        .update(&seed.to_le_bytes())
        .finalize_xof()
        .fill(&mut v);
    v
}

/// The ids of the chunks `data` is cut into (the default chunker, BLAKE3), and its object id.
fn chunk_ids(data: &[u8]) -> (Vec<ferry_format::Id>, ferry_format::Oid) {
    let (recipe, oid) = ferry_format::chunk_object(
        data,
        &ChunkerSpec::default(),
        ferry_format::HashAlg::Blake3,
        |_, _| Ok::<_, std::io::Error>(()),
    )
    .unwrap();
    (recipe.chunks().iter().map(|c| c.id).collect(), oid)
}

/// A server on a thread, serving `root`, and a connected client.
fn connect(root: &Path) -> Connection<UnixStream, UnixStream> {
    connect_with(root, None)
}

/// Likewise, asking for the Hello features in `ask` besides the usual ones.
fn connect_asking(root: &Path, ask: u64) -> Connection<UnixStream, UnixStream> {
    let b = serving(root);
    Connection::open_asking(b.try_clone().unwrap(), b, ferry_fs::DEFAULT_ZSTD_LEVEL, ask).unwrap()
}

/// A reader that waits 15 ms before each read: a link whose round trip is longer than a near
/// one's 8 ms, however loaded the machine.
struct Far(UnixStream);

impl std::io::Read for Far {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        std::thread::sleep(std::time::Duration::from_millis(15));
        std::io::Read::read(&mut self.0, buf)
    }
}

/// The client's end of a socket to a server on a thread serving `root`.
fn serving(root: &Path) -> UnixStream {
    serving_with(root, |s| s)
}

/// Likewise, the server made by `with` from the usual one.
fn serving_with(root: &Path, with: impl FnOnce(Server) -> Server + Send + 'static) -> UnixStream {
    let (a, b) = UnixStream::pair().unwrap();
    let export = Export::open(root).unwrap();
    std::thread::spawn(move || {
        let mut server = with(Server::new(export, grouping(), staging()));
        let _ = ferry_fs::serve(&mut server, a.try_clone().unwrap(), a);
    });
    b
}

/// A client of a server on a thread serving `root`, keeping a history of what it cuts in
/// `history`.
fn connect_with(
    root: &Path,
    history: Option<ferry_fs::Staging>,
) -> Connection<UnixStream, UnixStream> {
    let b = serving_with(root, move |s| match history {
        Some(h) => s.with_history(h, u64::MAX),
        None => s,
    });
    Connection::open(b.try_clone().unwrap(), b).unwrap()
}

fn opts(delete: bool) -> ferry_fs::PutOptions<'static> {
    ferry_fs::PutOptions {
        chunker: ChunkerSpec::default(),
        delete,
        dry_run: false,
        progress: None,
        cache: None,
        fewer_round_trips: false,
        stat_after: None,
        sync_after: false,
    }
}

fn staging() -> ferry_fs::Staging {
    std::sync::Arc::new(MemStore::new(ferry_format::HashAlg::Blake3))
}

fn tree(root: &Path) {
    fs::create_dir_all(root.join("src/deep")).unwrap();
    for (name, seed, len) in [
        ("empty", 0, 0),
        ("one", 1, 1),
        ("src/a.bin", 2, 8191),
        ("src/b.bin", 3, 100_000),
        ("src/deep/big", 4, 1_000_000),
    ] {
        fs::write(root.join(name), bytes(seed, len)).unwrap();
    }
    fs::set_permissions(root.join("one"), fs::Permissions::from_mode(0o600)).unwrap();
}

fn same_tree(a: &Path, b: &Path) {
    for e in walkdir(a) {
        let rel = e.strip_prefix(a).unwrap();
        let (ma, mb) = (
            fs::metadata(&e).unwrap(),
            fs::metadata(b.join(rel)).unwrap(),
        );
        if ma.is_file() {
            assert_eq!(
                fs::read(&e).unwrap(),
                fs::read(b.join(rel)).unwrap(),
                "{}",
                rel.display()
            );
            assert_eq!(
                ma.permissions().mode() & 0o7777,
                mb.permissions().mode() & 0o7777,
                "{}",
                rel.display()
            );
            assert_eq!(
                ma.modified().unwrap(),
                mb.modified().unwrap(),
                "{}",
                rel.display()
            );
        }
    }
}

fn walkdir(p: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for e in fs::read_dir(p).unwrap() {
        let e = e.unwrap().path();
        if e.is_dir() {
            out.extend(walkdir(&e));
        }
        out.push(e);
    }
    out
}

fn get(
    conn: &mut Connection<UnixStream, UnixStream>,
    path: &str,
    dest: &Path,
    cache: &dyn ferry_store::ChunkStore,
) -> Result<GetStats, GetError> {
    get_deleting(conn, path, dest, cache, false)
}

/// [`get`], and with `delete` an exact mirror.
fn get_deleting(
    conn: &mut Connection<UnixStream, UnixStream>,
    path: &str,
    dest: &Path,
    cache: &dyn ferry_store::ChunkStore,
    delete: bool,
) -> Result<GetStats, GetError> {
    let cold = cache.is_empty().unwrap();
    get_with(conn, path, dest, cache, delete, cold, true)
}

/// [`get`], choosing whether an empty cache reads large files by ranges and recipes name
/// chunks by short ids.
fn get_with<R: std::io::Read + Send, W: std::io::Write>(
    conn: &mut Connection<R, W>,
    path: &str,
    dest: &Path,
    cache: &dyn ferry_store::ChunkStore,
    delete: bool,
    ranges: bool,
    short_ids: bool,
) -> Result<GetStats, GetError> {
    let mut stats = GetStats::default();
    let src = Sources {
        borrowing: true,
        cache,
        chunker: ChunkerSpec::default(),
        delete,
        dry_run: false,
        progress: None,
        lookaside: None,
        cold: cache.is_empty().unwrap(),
        ranges: ranges && cache.is_empty().unwrap(),
        short_ids,
        cache_file_max: u64::MAX,
        mirrors: None,
    };
    ferry_fs::get(
        conn,
        &WirePath::new(path.as_bytes().to_vec()).unwrap(),
        dest,
        &src,
        &mut stats,
    )?;
    Ok(stats)
}

#[test]
fn get_a_tree_then_only_what_changed() {
    let t = tempfile::tempdir().unwrap();
    let (srv, dst) = (t.path().join("srv"), t.path().join("dst"));
    tree(&srv);
    let cache = LocalStore::open_or_create(t.path().join("cache"), Options::default()).unwrap();
    let mut c = connect(&srv);
    let first = get(&mut c, "", &dst, &cache).unwrap();
    same_tree(&srv, &dst);
    assert_eq!(first.files, 5);
    assert!(first.bytes_from_server >= 1_100_000);

    // Change 100 bytes in the middle of the big file on the server.
    let mut big = fs::read(srv.join("src/deep/big")).unwrap();
    big[500_000..500_100].copy_from_slice(&[7; 100]);
    fs::write(srv.join("src/deep/big"), &big).unwrap();
    let before = c.traffic();
    let second = get(&mut c, "", &dst, &cache).unwrap();
    same_tree(&srv, &dst);
    let received = c.traffic().bytes_received - before.bytes_received;
    assert!(second.from_server <= 3, "{second:?}");
    assert!(
        received < 64 * 1024,
        "received {received} bytes for a 100-byte change"
    );

    // A fresh destination is filled from the cache alone.
    let third = get(&mut c, "src", &t.path().join("copy"), &cache).unwrap();
    assert_eq!(third.from_server, 0, "{third:?}");
    assert_eq!(fs::read(t.path().join("copy/deep/big")).unwrap(), big);
}

#[test]
fn a_chunk_one_files_old_version_holds_is_fetched_for_another_that_lacks_it() {
    // `a`'s old version here holds `shared`; `b`'s does not, and the new `b` needs it too.
    // Each file is built from its own old version, the cache and what is fetched, so `shared`
    // travels for `b`, although `a` finds it here. With full ids in recipes (a server without
    // short ones) both files name the same chunks.
    let shared = bytes(41, 200_000);
    let cat = |parts: &[&[u8]]| parts.concat();
    for short_ids in [true, false] {
        let t = tempfile::tempdir().unwrap();
        let (srv, dst) = (t.path().join("srv"), t.path().join("dst"));
        fs::create_dir(&srv).unwrap();
        fs::create_dir(&dst).unwrap();
        fs::write(dst.join("a"), cat(&[&shared, &bytes(42, 100_000)])).unwrap();
        fs::write(dst.join("b"), bytes(43, 150_000)).unwrap();
        // Older than the server's (a file of the same size and mtime is taken as current).
        let then = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30);
        for f in ["a", "b"] {
            fs::File::open(dst.join(f))
                .unwrap()
                .set_modified(then)
                .unwrap();
        }
        fs::write(srv.join("a"), cat(&[&shared, &bytes(44, 100_000)])).unwrap();
        fs::write(srv.join("b"), cat(&[&bytes(43, 150_000), &shared])).unwrap();
        let mut c = connect(&srv);
        let cache = MemStore::new(ferry_format::HashAlg::Blake3);
        let s = get_with(&mut c, "", &dst, &cache, false, true, short_ids).unwrap();
        same_tree(&srv, &dst);
        assert!(s.from_local > 20, "{s:?}");
    }
}

#[test]
fn the_old_local_file_is_a_chunk_source() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir(&srv).unwrap();
    let mut old = bytes(9, 2_000_000);
    fs::write(t.path().join("local"), &old).unwrap();
    old.splice(1000..1000, b"inserted near the front".iter().copied());
    fs::write(srv.join("f"), &old).unwrap();
    let mut c = connect(&srv);
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    let s = get(&mut c, "f", &t.path().join("local"), &cache).unwrap();
    assert_eq!(fs::read(t.path().join("local")).unwrap(), old);
    assert!(s.from_local > 150, "{s:?}");
    assert!(s.bytes_from_server < 40_000, "{s:?}");
}

#[test]
fn a_server_that_served_the_old_version_sends_about_the_edit() {
    // Bytes received to bring `local` from the old version to the new, with and without a
    // history on the server, which served the old version in an earlier session.
    let received = |history: Option<ferry_fs::Staging>| {
        let t = tempfile::tempdir().unwrap();
        let srv = t.path().join("srv");
        fs::create_dir(&srv).unwrap();
        let old = bytes(12, 300_000);
        fs::write(srv.join("f"), &old).unwrap();
        let local = t.path().join("local");
        let cache = MemStore::new(ferry_format::HashAlg::Blake3);
        get(
            &mut connect_with(&srv, history.clone()),
            "f",
            &local,
            &cache,
        )
        .unwrap();
        // A byte changed every 500 in 60 KB: few ~256-byte pieces of those chunks survive.
        let mut new = old.clone();
        for at in (100_000..160_000).step_by(500) {
            new[at] ^= 0xff;
        }
        fs::write(srv.join("f"), &new).unwrap();
        // The same client, its cache holding what it fetched: it names those old chunks.
        let mut c = connect_with(&srv, history);
        let s = get(&mut c, "f", &local, &cache).unwrap();
        assert_eq!(fs::read(&local).unwrap(), new);
        (c.traffic().bytes_received, s)
    };
    let (without, _) = received(None);
    let history: ferry_fs::Staging =
        std::sync::Arc::new(MemStore::new(ferry_format::HashAlg::Blake3));
    let (with, s) = received(Some(history));
    // Random data: without the old chunks, most of the changed ones (~70 KB) travel.
    assert!(without > 40_000, "{without} bytes without a history");
    // With them as the prefix, 120 one-byte edits cost a few bytes each.
    assert!(with < 4_000, "{with} bytes with a history; {s:?}");
    assert!(s.against_old >= 6, "{s:?}");
}

#[test]
fn changed_chunks_travel_compressed_against_the_old_file() {
    // The old data does not compress, so keys count only in runs: 3 bytes each for the ~1,800
    // pieces of the ~20 changed chunks, and the frame carries about the 20 changed bytes.
    let total = changed_chunks_against_the_old_file();
    assert!(total < 12_000, "{total} bytes both ways");
}

#[test]
fn appended_data_comes_against_the_part_of_the_file_held_here() {
    // A log-like file: 900 KB of random records, then 100 KB appended, each record a copy of
    // one far back. Only the file's held part can tell the server so; the old chunk that the
    // append replaced, and the session's stream, cannot. Over a far link: a near one names
    // little of it (there, the time it costs counts for more than the bytes it saves).
    let record = |i: u64| {
        let r = bytes(1000 + i, 600);
        let mut v = format!("record {i}: ").into_bytes();
        v.extend(r.iter().map(|b| b'a' + b % 26));
        v.push(b'\n');
        v
    };
    let old: Vec<u8> = (0..1500).flat_map(record).collect();
    let mut new = old.clone();
    for i in 0..165u64 {
        new.extend(record(i * 7 % 1500));
    }
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir(&srv).unwrap();
    fs::write(t.path().join("local"), &old).unwrap();
    fs::write(srv.join("f"), &new).unwrap();
    let b = serving(&srv);
    let mut c = Connection::open(Far(b.try_clone().unwrap()), b).unwrap();
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    get_with(
        &mut c,
        "f",
        &t.path().join("local"),
        &cache,
        false,
        true,
        true,
    )
    .unwrap();
    assert_eq!(fs::read(t.path().join("local")).unwrap(), new);
    let with = c.traffic().bytes_received;
    // ~100 KB of letters: ~60 KB compressed alone (as without the context they would go); a few
    // bytes a record against the context.
    let without = zstd::bulk::compress(&new[old.len()..], 19).unwrap().len() as u64;
    assert!(without > 50_000, "{without} bytes without a context");
    assert!(
        with * 10 < without,
        "{with} bytes with a context, {without} without"
    );
}

#[test]
fn a_new_file_is_built_against_the_one_it_replaced() {
    // Moved and renamed files: `b/de/format.rs` moved up to `b/format.rs`, `a/wasi.rs` became
    // `a/wasi/mod.rs`, a versioned directory renamed; each new version has one byte changed.
    // Random letters of 16: data that compresses to about half alone, so a frame against the
    // old file is judged by its bytes, not by how fast the link measured against how long
    // compressing took (frames of incompressible data that save too little link time to pay
    // for themselves stop being tried: this pipe is fast, and a busy machine slow).
    let t = tempfile::tempdir().unwrap();
    let (srv, dst) = (t.path().join("srv"), t.path().join("dst"));
    let moves = [
        ("b/de/format.rs", "b/format.rs"),
        ("a/wasi.rs", "a/wasi/mod.rs"),
        ("pkg-1.0.dist-info/RECORD", "pkg-1.1.dist-info/RECORD"),
    ];
    for (i, (old, new)) in moves.iter().enumerate() {
        let data: Vec<u8> = bytes(200 + i as u64, 40_000)
            .iter()
            .map(|b| b'a' + (b & 15))
            .collect();
        for (root, path) in [(&dst, old), (&srv, new)] {
            let p = root.join(path);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, &data).unwrap();
        }
        let mut edited = data.clone();
        edited[20_000] ^= 1;
        fs::write(srv.join(new), edited).unwrap();
    }
    // Another file of the same name, farther away, is not the one taken.
    fs::create_dir_all(dst.join("c")).unwrap();
    fs::write(dst.join("c/RECORD"), bytes(300, 40_000)).unwrap();
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    let mut c = connect(&srv);
    let stats = get_deleting(&mut c, "", &dst, &cache, true).unwrap();
    // The old files were read before `--delete` removed them.
    same_tree(&srv, &dst);
    same_tree(&dst, &srv);
    assert_eq!(stats.deleted, 4, "{stats:?}");
    let received = c.traffic().bytes_received;
    // Alone, the three changed chunks would be ~5 KB each.
    assert!(received < 5_000, "{received} bytes received; {stats:?}");
    assert_eq!(stats.against_old, 3, "{stats:?}");
}

#[test]
fn a_small_files_keys_are_three_bytes() {
    // Text (so keys count alone, not only in runs), 40 KB, one line edited: the old chunk's
    // ~37 pieces need only 3-byte keys for odds under 1 in 1,000.
    let text: Vec<u8> = (0..4000u32)
        .flat_map(|i| format!("line {i}: the quick brown fox {}\n", i * 7919 % 1000).into_bytes())
        .collect();
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir(&srv).unwrap();
    let mut new = text.clone();
    new[20_000] = b'#';
    fs::write(t.path().join("local"), &text).unwrap();
    fs::write(srv.join("f"), &new).unwrap();
    // Same size: an older mtime says it changed.
    let yesterday = std::time::SystemTime::now() - std::time::Duration::from_secs(86_400);
    let local = fs::File::options().write(true).open(t.path().join("local"));
    local.unwrap().set_modified(yesterday).unwrap();
    let mut c = connect(&srv);
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    let before = c.traffic().bytes_sent;
    let s = get(&mut c, "f", &t.path().join("local"), &cache).unwrap();
    assert!(fs::read(t.path().join("local")).unwrap() == new);
    assert!(s.against_old >= 1, "{s:?}");
    // The requests: GetAttr, the recipe against the old pages, and one GetChunks with the
    // keys (with it, when the client has a measure of the link, one Rate of at most 20
    // bytes); 4-byte keys alone would be ~150 bytes more.
    let sent = c.traffic().bytes_sent - before;
    assert!(sent < 280, "{sent} bytes sent");
}

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

/// Fetches a changed file; returns the bytes both ways.
fn changed_chunks_against_the_old_file() -> u64 {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir(&srv).unwrap();
    // Incompressible data: whatever is saved comes from the old file alone.
    let old = bytes(11, 400_000);
    fs::write(t.path().join("local"), &old).unwrap();
    // Same size: only a different mtime tells rsync's quick check that it changed.
    let yesterday = std::time::SystemTime::now() - std::time::Duration::from_secs(86_400);
    fs::File::options()
        .write(true)
        .open(t.path().join("local"))
        .unwrap()
        .set_modified(yesterday)
        .unwrap();
    let mut new = old.clone();
    // An edited region: 20 bytes changed, 4 KiB apart.
    for at in (100_000..180_000).step_by(4_000) {
        new[at] ^= 0xff;
    }
    fs::write(srv.join("f"), &new).unwrap();
    let mut c = connect(&srv);
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    let before = c.traffic();
    let s = get(&mut c, "f", &t.path().join("local"), &cache).unwrap();
    let received = c.traffic().bytes_received - before.bytes_received;
    assert_eq!(fs::read(t.path().join("local")).unwrap(), new);
    // About 80 KiB of chunks changed, a byte in every 4 KiB: they do not travel, only what
    // differs from the pieces of the old chunks they replaced.
    assert!(s.against_old >= 8, "{s:?}");
    assert!(s.bytes_from_server > 70_000, "{s:?}");
    // Incompressible alone, so without the old file all of it would travel.
    assert!(
        received * 2 < s.bytes_from_server,
        "{received} bytes received; {s:?}"
    );
    let t = c.traffic();
    t.bytes_received + t.bytes_sent - before.bytes_received - before.bytes_sent
}

#[test]
fn round_trips_of_a_small_file() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir(&srv).unwrap();
    fs::write(srv.join("f"), b"hello").unwrap();
    let mut c = connect(&srv);
    let hello_trips = c.traffic().round_trips;
    get(
        &mut c,
        "f",
        &t.path().join("out"),
        &MemStore::new(ferry_format::HashAlg::Blake3),
    )
    .unwrap();
    // GetAttr, ReadFile: nothing cached, so the small file comes whole.
    assert_eq!(c.traffic().round_trips - hello_trips, 2);
    // With a cache to look in: GetAttr, GetRecipe, GetChunks.
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    let other = ferry_store::VerifiedChunk::hash(ferry_format::HashAlg::Blake3, b"other");
    ferry_store::ChunkStore::put(&cache, &other).unwrap();
    let before = c.traffic().round_trips;
    get(&mut c, "f", &t.path().join("out2"), &cache).unwrap();
    assert_eq!(c.traffic().round_trips - before, 3);
    assert_eq!(fs::read(t.path().join("out2")).unwrap(), b"hello");
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

/// A tree of 300 files in 3 levels of directories, and links.
fn wide_tree(root: &Path) {
    for d in 0..3 {
        let dir = root.join(format!("d{d}/sub"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..50 {
            fs::write(dir.join(format!("f{f}")), bytes(d * 100 + f, 3000)).unwrap();
            fs::write(dir.join(format!("../g{f}")), bytes(d * 100 + f + 50, 100)).unwrap();
        }
        std::os::unix::fs::symlink("sub/f1", root.join(format!("d{d}/link"))).unwrap();
    }
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

/// A scripted server (no session stream): answers each request with what `respond` returns.
fn fake_server(
    respond: impl Fn(Request) -> Reply + Send + 'static,
) -> Connection<UnixStream, UnixStream> {
    fake_server_telling(move |q| (vec![], respond(q)))
}

/// Like [`fake_server`], sending what `respond` gives unasked (request id 0: lease breaks)
/// ahead of each reply.
pub(crate) fn fake_server_telling(
    respond: impl Fn(Request) -> (Vec<Message>, Reply) + Send + 'static,
) -> Connection<UnixStream, UnixStream> {
    let (a, b) = UnixStream::pair().unwrap();
    fake_server_on(a, respond);
    Connection::open(b.try_clone().unwrap(), b).unwrap()
}

/// Serves [`fake_server_telling`]'s script on `a`, from a thread of its own.
fn fake_server_on(
    a: UnixStream,
    respond: impl Fn(Request) -> (Vec<Message>, Reply) + Send + 'static,
) {
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut r, mut w) = (a.try_clone().unwrap(), std::io::BufWriter::new(a));
        let mut dec = FrameDecoder::new();
        let mut buf = [0u8; 65536];
        loop {
            while let Some(f) = dec.next_frame().unwrap() {
                let (told, reply) = match Message::decode(&f).unwrap() {
                    // A plain server: no session compression.
                    Message::Hello(h) => (vec![], Message::Hello(Hello { features: 0, ..h })),
                    Message::Request(q) => {
                        let (told, reply) = respond(q);
                        (told, Message::Reply(reply))
                    }
                    _ => return,
                };
                let frames = told.iter().map(|m| (m, 0)).chain([(&reply, f.request_id)]);
                for (m, id) in frames {
                    if w.write_all(&m.encode(id, false).unwrap()).is_err() {
                        return;
                    }
                }
                if w.flush().is_err() {
                    return;
                }
            }
            match r.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => dec.feed(&buf[..n]),
            }
        }
    });
}

/// `--chunk-size 524288` (chunks up to 4 MiB, each near the frame limit alone): batches of
/// chunks, recipes and uploads stay within the frame limit, both ways.
#[test]
fn the_largest_chunk_size_moves_files_both_ways() {
    let spec = ChunkerSpec::fastcdc(128 << 10, 512 << 10, 4 << 20);
    spec.validate().unwrap();
    let t = tempfile::tempdir().unwrap();
    let (srv, dst, up) = (
        t.path().join("srv"),
        t.path().join("dst"),
        t.path().join("up"),
    );
    fs::create_dir(&srv).unwrap();
    // Random bytes, and a run of one byte (cut only at the maximum size).
    let mut data = bytes(90, 24 << 20);
    data.extend(vec![0u8; 12 << 20]);
    fs::write(srv.join("f"), &data).unwrap();
    let serve = |root: &Path| {
        let (a, b) = UnixStream::pair().unwrap();
        let export = Export::open(root).unwrap();
        let options = ServerOptions {
            chunker: spec.clone(),
            ..ServerOptions::default()
        };
        std::thread::spawn(move || {
            let mut server = Server::new(export, options, staging());
            let _ = ferry_fs::serve(&mut server, a.try_clone().unwrap(), a);
        });
        Connection::open(b.try_clone().unwrap(), b).unwrap()
    };
    // By recipe and GetChunks (not by ranges): the batches are what is tested.
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    let src = Sources {
        borrowing: true,
        cache: &cache,
        chunker: spec.clone(),
        delete: false,
        dry_run: false,
        progress: None,
        lookaside: None,
        cold: false,
        ranges: false,
        short_ids: true,
        cache_file_max: u64::MAX,
        mirrors: None,
    };
    let mut stats = GetStats::default();
    ferry_fs::get(&mut serve(&srv), &"".into(), &dst, &src, &mut stats).unwrap();
    assert_eq!(fs::read(dst.join("f")).unwrap(), data);
    // Up, to a server holding nothing, then a changed version against the first.
    fs::create_dir(&up).unwrap();
    let put_opts = ferry_fs::PutOptions {
        chunker: spec.clone(),
        ..opts(false)
    };
    let mut ps = ferry_fs::PutStats::default();
    ferry_fs::put(&mut serve(&up), &dst, &"".into(), &put_opts, &mut ps).unwrap();
    assert_eq!(fs::read(up.join("f")).unwrap(), data);
    data[5 << 20] ^= 1;
    fs::write(dst.join("f"), &data).unwrap();
    let mut ps = ferry_fs::PutStats::default();
    ferry_fs::put(&mut serve(&up), &dst, &"".into(), &put_opts, &mut ps).unwrap();
    assert_eq!(fs::read(up.join("f")).unwrap(), data);
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

/// A whole recipe, as a server sends it to a client that named no pages.
fn recipe_reply(chunks: Vec<ferry_format::ChunkRef>) -> Reply {
    let recipe =
        ferry_format::Recipe::from_chunks(ferry_format::HashAlg::Blake3, chunks.clone()).unwrap();
    Reply::Recipe(ferry_proto::RecipeDelta {
        version: 1,
        total_chunks: chunks.len() as u64,
        check: recipe.check(),
        alg: ferry_format::HashAlg::Blake3,
        parts: vec![ferry_proto::RecipePart::Chunks(chunks)],
    })
}

/// Chunks plainly, each found at its place in the request.
fn chunks_reply(found: Vec<(u32, Vec<u8>)>) -> Reply {
    Reply::Chunks(ferry_proto::Chunks {
        found: found.iter().map(|f| f.0).collect(),
        payload: ferry_proto::Payload::Plain(found.into_iter().flat_map(|f| f.1).collect()),
    })
}

fn attr(kind: ferry_proto::FileKind, size: u64) -> ferry_proto::Attr {
    ferry_proto::Attr {
        kind,
        mode: 0o755,
        size,
        mtime_ns: 0,
        version: 1,
        oid: None,
        lease_ms: 0,
        extra: None,
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

fn put(
    conn: &mut Connection<UnixStream, UnixStream>,
    local: &Path,
    path: &str,
) -> Result<ferry_fs::PutStats, GetError> {
    let mut stats = ferry_fs::PutStats::default();
    ferry_fs::put(
        conn,
        local,
        &WirePath::new(path.as_bytes().to_vec()).unwrap(),
        &opts(false),
        &mut stats,
    )?;
    Ok(stats)
}

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

/// An upload of `data` as one chunk of new data, against version `base` of `path`.
fn upload(
    c: &mut Connection<UnixStream, UnixStream>,
    handle: u32,
    path: &str,
    base: Option<u64>,
    data: &[u8],
) -> Result<(), ferry_fs::ConnError> {
    c.call(Request::Create {
        handle,
        path: path.into(),
        base,
    })?;
    c.call(Request::Write {
        handle,
        parts: vec![ferry_proto::WritePart::Data {
            lens: vec![data.len() as u32],
            payload: ferry_proto::Payload::Plain(data.to_vec()),
        }],
    })?;
    Ok(())
}

fn commit(
    c: &mut Connection<UnixStream, UnixStream>,
    handle: u32,
    data: &[u8],
) -> Result<Vec<Reply>, ferry_fs::ConnError> {
    c.call(Request::Commit {
        handle,
        mode: 0o644,
        mtime_ns: 0,
        size: data.len() as u64,
        oid: ferry_format::Id::hash(ferry_format::HashAlg::Blake3, data),
    })
}

/// The server's attributes of `path`.
fn attr_of(c: &mut Connection<UnixStream, UnixStream>, path: &str) -> ferry_proto::Attr {
    match c
        .call(Request::GetAttr { path: path.into() })
        .unwrap()
        .pop()
    {
        Some(Reply::Attr(a)) => a,
        other => panic!("{other:?}"),
    }
}

fn version(c: &mut Connection<UnixStream, UnixStream>, path: &str) -> u64 {
    attr_of(c, path).version
}

fn is_code<T: std::fmt::Debug>(r: &Result<T, ferry_fs::ConnError>, want: ErrorCode) -> bool {
    matches!(r, Err(ferry_fs::ConnError::Remote { code, .. }) if *code == want)
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

/// A connection cut in the middle of a large file loses nothing received: the next run fetches
/// only the rest.
#[test]
fn a_receiver_with_nothing_reads_large_files_without_recipes() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir(&srv).unwrap();
    fs::write(srv.join("big"), bytes(31, 5 << 20)).unwrap();
    fs::write(srv.join("mid"), bytes(32, 300_000)).unwrap();
    let cost = |ranges: bool, short_ids: bool, dest: &str| {
        let mut c = connect(&srv);
        let cache = MemStore::new(ferry_format::HashAlg::Blake3);
        let s = get_with(
            &mut c,
            "",
            &t.path().join(dest),
            &cache,
            false,
            ranges,
            short_ids,
        );
        let s = s.unwrap();
        same_tree(&srv, &t.path().join(dest));
        // Cut into the cache either way: a later fetch, or a resumed one, finds them.
        assert!(
            s.from_server >= 600 && ferry_store::ChunkStore::stats(&cache).unwrap().chunks >= 600,
            "{s:?}"
        );
        let tr = c.traffic();
        tr.bytes_received + tr.bytes_sent
    };
    let ranges = cost(true, true, "a");
    let recipes = cost(false, false, "b");
    let short = cost(false, true, "c");
    // ~650 chunks: a recipe's id down and a GetChunks id up for each, saved; with short ids
    // in the recipe, 8 bytes each way.
    assert!(
        ranges + 30_000 < recipes,
        "{ranges} by ranges, {recipes} by recipes"
    );
    assert!(
        ranges + 8_000 < short,
        "{ranges} by ranges, {short} by short recipes"
    );
    assert!(
        short + 20_000 < recipes,
        "{short} by short recipes, {recipes} by recipes"
    );
}

/// A session with the server over `srv` whose link the server's side hangs up after `bytes`.
fn cut_after(srv: &Path, bytes: usize) -> Connection<UnixStream, UnixStream> {
    let c = relay_cut(serving(srv), bytes);
    Connection::open(c.try_clone().unwrap(), c).unwrap()
}

/// The client's end of a relay to `server` (a socket to a serving thread) that hangs up after
/// `cut` bytes of the server's replies.
fn relay_cut(server: UnixStream, cut: usize) -> UnixStream {
    use std::io::{Read, Write};
    let (c, d) = UnixStream::pair().unwrap();
    let (mut b_read, mut d_write) = (server.try_clone().unwrap(), d.try_clone().unwrap());
    std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        let mut total = 0;
        while total < cut {
            let Ok(n) = b_read.read(&mut buf) else { break };
            if n == 0 || d_write.write_all(&buf[..n]).is_err() {
                break;
            }
            total += n;
        }
        let _ = d_write.shutdown(std::net::Shutdown::Both);
    });
    let (mut d_read, mut b_write) = (d, server);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut d_read, &mut b_write);
    });
    c
}

/// Gets `path` into `dest` as `ferry get` does with an empty cache bounded so that files over
/// `cache_file_max` bytes are not kept in it.
fn get_large(
    conn: &mut Connection<UnixStream, UnixStream>,
    path: &str,
    dest: &Path,
    cache: &dyn ferry_store::ChunkStore,
    cache_file_max: u64,
) -> Result<GetStats, GetError> {
    let mut stats = GetStats::default();
    let cold = cache.is_empty().unwrap();
    let src = Sources {
        borrowing: true,
        cache,
        chunker: ChunkerSpec::default(),
        delete: true,
        dry_run: false,
        progress: None,
        lookaside: None,
        cold,
        ranges: cold,
        short_ids: true,
        cache_file_max,
        mirrors: None,
    };
    let wire = WirePath::new(path.as_bytes().to_vec()).unwrap();
    ferry_fs::get(conn, &wire, dest, &src, &mut stats)?;
    Ok(stats)
}

#[test]
fn a_cut_connection_resumes_inside_a_large_file() {
    // Cut into the cache as it arrives, or too large for it: either way the partial file
    // beside the destination holds what arrived, and the next run fetches only the rest.
    for cache_file_max in [u64::MAX, 1 << 20] {
        let t = tempfile::tempdir().unwrap();
        let srv = t.path().join("srv");
        fs::create_dir(&srv).unwrap();
        let big = bytes(77, 40 << 20);
        fs::write(srv.join("big"), &big).unwrap();
        let cache = LocalStore::open_or_create(t.path().join("cache"), Options::default()).unwrap();
        let dest = t.path().join("dest");
        let mut cut = cut_after(&srv, 25 << 20);
        assert!(
            get_large(&mut cut, "", &dest, &cache, cache_file_max).is_err(),
            "the cut must be noticed"
        );
        assert!(
            !dest.join("big").exists(),
            "nothing half made at the destination"
        );
        // A second cut run, then a whole one (with --delete: the partial is not the tree's).
        let mut cut = cut_after(&srv, 5 << 20);
        assert!(get_large(&mut cut, "", &dest, &cache, cache_file_max).is_err());
        let mut whole = connect(&srv);
        let s = get_large(&mut whole, "", &dest, &cache, cache_file_max).unwrap();
        assert_eq!(fs::read(dest.join("big")).unwrap(), big);
        assert!(
            s.bytes_from_server < (15 << 20),
            "{cache_file_max}: refetched {} bytes",
            s.bytes_from_server
        );
        let left: Vec<_> = fs::read_dir(&dest)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, ["big"], "no partial left behind");
    }
}

/// A partial file whose bytes are not what the server has (damaged, or of a version that
/// happens to share the name) costs a fetch by recipe, never a wrong file.
#[test]
fn a_damaged_partial_file_is_never_installed() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir(&srv).unwrap();
    let big = bytes(78, 12 << 20);
    fs::write(srv.join("big"), &big).unwrap();
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    let dest = t.path().join("dest");
    let mut cut = cut_after(&srv, 6 << 20);
    assert!(get_large(&mut cut, "", &dest, &cache, 0).is_err());
    let partial = fs::read_dir(&dest)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let mut damaged = fs::read(&partial).unwrap();
    assert!(damaged.len() > 1 << 20, "{} bytes arrived", damaged.len());
    damaged[1000] ^= 1;
    fs::write(&partial, &damaged).unwrap();
    let mut c = connect(&srv);
    get_large(&mut c, "", &dest, &cache, 0).unwrap();
    assert_eq!(fs::read(dest.join("big")).unwrap(), big);
    assert!(!partial.exists());
}

/// An upload cut after `cut` bytes of the client's requests, to a server on a thread staging in
/// `staging` (every write as it comes, or only what a cut upload received): the connection and
/// the server's thread, which ends with the session.
fn cut_upload(
    srv: &Path,
    staging: ferry_fs::Staging,
    stage_writes: bool,
    cut: usize,
) -> (
    Connection<UnixStream, UnixStream>,
    std::thread::JoinHandle<()>,
) {
    use std::io::{Read, Write};
    let (a, b) = UnixStream::pair().unwrap();
    let export = Export::open(srv).unwrap();
    let server = std::thread::spawn(move || {
        let opts = ServerOptions {
            stage_writes,
            ..ServerOptions::default()
        };
        let mut server = Server::new(export, opts, staging);
        let _ = ferry_fs::serve(&mut server, a.try_clone().unwrap(), a);
    });
    let (c, d) = UnixStream::pair().unwrap();
    let (mut d_read, mut b_write) = (d.try_clone().unwrap(), b.try_clone().unwrap());
    std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        let mut total = 0;
        while total < cut {
            let Ok(n) = d_read.read(&mut buf) else { break };
            if n == 0 || b_write.write_all(&buf[..n]).is_err() {
                break;
            }
            total += n;
        }
        let _ = b_write.shutdown(std::net::Shutdown::Both);
        let _ = d_read.shutdown(std::net::Shutdown::Both);
    });
    let (mut b_read, mut d_write) = (b, d);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut b_read, &mut d_write);
    });
    (Connection::open(c.try_clone().unwrap(), c).unwrap(), server)
}

#[test]
fn a_cut_upload_resumes_from_what_arrived() {
    // Staged as every write came, or only when the session ended with the upload cut (read
    // back from its temporary file): either way the next put sends only the rest.
    for stage_writes in [true, false] {
        let t = tempfile::tempdir().unwrap();
        let (src, srv) = (t.path().join("src"), t.path().join("srv"));
        fs::create_dir_all(&src).unwrap();
        fs::create_dir_all(&srv).unwrap();
        let big = bytes(79, 24 << 20);
        fs::write(src.join("big"), &big).unwrap();
        let staging = staging();
        let (mut c, server) = cut_upload(&srv, staging.clone(), stage_writes, 12 << 20);
        assert!(
            put(&mut c, &src.join("big"), "big").is_err(),
            "the cut is noticed"
        );
        drop(c);
        server.join().unwrap();
        assert!(!srv.join("big").exists(), "nothing committed");
        let (mut c, _) = cut_upload(&srv, staging.clone(), stage_writes, usize::MAX);
        let s = put(&mut c, &src.join("big"), "big").unwrap();
        assert_eq!(fs::read(srv.join("big")).unwrap(), big);
        assert!(
            s.chunk_bytes_sent < 16 << 20,
            "stage_writes {stage_writes}: sent {} bytes again",
            s.chunk_bytes_sent
        );
        let left: Vec<_> = fs::read_dir(&srv)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, ["big"], "no temporary left behind");
    }
}

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

/// Small files with an old version that came from the server come whole, together, against
/// it: no recipes, no chunk ids. A server whose history lost them still sends them right.
#[test]
fn small_files_come_together_against_their_old_versions() {
    let run = |same_history: bool| {
        let t = tempfile::tempdir().unwrap();
        let srv = t.path().join("srv");
        fs::create_dir(&srv).unwrap();
        for i in 0..20u64 {
            fs::write(srv.join(format!("f{i}")), bytes(100 + i, 10_000)).unwrap();
        }
        let history = || -> ferry_fs::Staging {
            std::sync::Arc::new(MemStore::new(ferry_format::HashAlg::Blake3))
        };
        let first = history();
        let dest = t.path().join("dest");
        let cache = MemStore::new(ferry_format::HashAlg::Blake3);
        get(
            &mut connect_with(&srv, Some(first.clone())),
            "",
            &dest,
            &cache,
        )
        .unwrap();
        for i in 0..20u64 {
            let mut d = fs::read(srv.join(format!("f{i}"))).unwrap();
            d[5_000] ^= 1;
            fs::write(srv.join(format!("f{i}")), d).unwrap();
        }
        let h = if same_history { first } else { history() };
        let mut c = connect_with(&srv, Some(h));
        let s = get(&mut c, "", &dest, &cache).unwrap();
        same_tree(&srv, &dest);
        (c.traffic(), s)
    };
    let (tr, s) = run(true);
    // 20 one-byte edits; the files are random, so without their old versions 200 KB.
    assert!(tr.bytes_received < 3_000, "{tr:?} {s:?}");
    assert_eq!(s.against_old, s.from_server, "{s:?}");
    let (tr, s) = run(false);
    assert!(tr.bytes_received > 150_000, "{tr:?} {s:?}");
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

/// A server's options with commits always grouped (see `ServerOptions::group_sync_min`), so
/// the sessions of these tests take that path whatever the disk's speed.
fn grouping() -> ServerOptions {
    ServerOptions {
        group_sync_min: std::time::Duration::ZERO,
        ..ServerOptions::default()
    }
}
