//! The file service end to end over in-process sockets, and its confinement: the shared
//! helpers here, each subject in a module of its own.

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
mod fetch;
mod hostile;
mod indexing;
mod links;
mod metadata;
mod mirrors;
mod ranges;
mod replace;
mod resume;
mod session;
mod trees;
mod uploads;

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

/// A server's options with commits always grouped (see `ServerOptions::group_sync_min`), so
/// the sessions of these tests take that path whatever the disk's speed.
fn grouping() -> ServerOptions {
    ServerOptions {
        group_sync_min: std::time::Duration::ZERO,
        ..ServerOptions::default()
    }
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
