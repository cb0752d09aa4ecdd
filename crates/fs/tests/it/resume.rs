//! Cut links: a large file's fetch or upload goes on from what arrived, and nothing damaged
//! is ever installed.

use super::*;

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
