//! Fetching: only what changed, against what the receiver already holds (its old files,
//! its cache, the server's history), in few round trips.

use super::*;

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
    // keys: 251-261 bytes here. With them, as the machine's load has it, one Rate and a
    // second Ping (when the first came back late) of some 20 bytes each; 4-byte keys alone
    // would be ~150 bytes more.
    let sent = c.traffic().bytes_sent - before;
    assert!(sent < 330, "{sent} bytes sent");
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

#[test]
fn large_frames_compressed_beside_the_session_come_back_in_order() {
    // Over a near link (this one, unless the machine is very busy) the server compresses
    // large frames on threads beside the session's, two at once, while it answers the
    // requests after them. Four files, each with a byte changed every 4 KiB of 1.5 MB of
    // random data: every chunk changed, each file's new chunks a frame of over 256 KiB against
    // the pieces of the old one. Their replies must come back in the order asked, each to its
    // own file.
    let t = tempfile::tempdir().unwrap();
    let (srv, dst) = (t.path().join("srv"), t.path().join("dst"));
    fs::create_dir(&srv).unwrap();
    fs::create_dir(&dst).unwrap();
    let then = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30);
    let mut news = vec![];
    for n in 0..4u64 {
        let old = bytes(60 + n, 1_500_000);
        let mut new = old.clone();
        for at in (1_000..new.len()).step_by(4_096) {
            new[at] ^= 0x5a;
        }
        let name = format!("f{n}");
        fs::write(dst.join(&name), &old).unwrap();
        let f = fs::File::open(dst.join(&name)).unwrap();
        f.set_modified(then).unwrap();
        fs::write(srv.join(&name), &new).unwrap();
        news.push((name, new));
    }
    let mut c = connect(&srv);
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    let s = get(&mut c, "", &dst, &cache).unwrap();
    for (name, new) in &news {
        assert!(fs::read(dst.join(name)).unwrap() == *new, "{name} differs");
    }
    // Random data: only the old files' pieces make it small.
    assert!(s.against_old >= 4, "{s:?}");
    let received = c.traffic().bytes_received;
    assert!(
        received * 4 < s.bytes_from_server,
        "{received} bytes; {s:?}"
    );
}
