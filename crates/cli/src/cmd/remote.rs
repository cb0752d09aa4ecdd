//! `ferry ls`, `ferry get`, `ferry put`, `ferry sync`: the file service from the command line (the client side; `serve` is the server).

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ferry_chunk::ChunkerSpec;
use ferry_fs::{RemoteSpec, Session, Sources};
use ferry_proto::{FileKind, WirePath};
use ferry_store::{LocalStore, Options};
use serde_json::json;

use crate::util::human;

/// What to do, for get, put and sync.
#[derive(clap::Args, Clone)]
pub struct Mode {
    /// Make the destination an exact mirror: remove what the source does not have (never
    /// following a symlink).
    #[arg(long)]
    delete: bool,
    /// Change nothing: print what would be sent, fetched or deleted.
    #[arg(short = 'n', long)]
    dry_run: bool,
    /// Show bytes written as they go (on a terminal).
    #[arg(long)]
    progress: bool,
}

impl Mode {
    fn bar(&self) -> indicatif::ProgressBar {
        if !self.progress {
            return indicatif::ProgressBar::hidden();
        }
        let pb =
            indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {bytes} written, {bytes_per_sec}, {elapsed}",
            )
            .expect("static template"),
        );
        pb.enable_steady_tick(std::time::Duration::from_millis(200));
        pb
    }
}

/// The client's persistent chunk cache (used when fetching).
#[derive(clap::Args, Clone)]
pub struct CacheArgs {
    /// The cache directory [default: $XDG_CACHE_HOME/ferry/chunks or ~/.cache/ferry/chunks].
    #[arg(long)]
    cache: Option<PathBuf>,
    /// Bound on the cache's size; the least recently used data goes first.
    #[arg(long, value_name = "SIZE", default_value = "2G", value_parser = crate::util::parse_size)]
    cache_size: usize,
}

impl CacheArgs {
    fn open(&self) -> Result<LocalStore> {
        let dir = self
            .cache
            .clone()
            .unwrap_or_else(|| cache_root().join("chunks"));
        LocalStore::open_or_create(&dir, cache_options())
            .with_context(|| format!("cannot open the cache {}", dir.display()))
    }

    /// The largest file read by ranges whose chunks are kept: a sixteenth of the bound (a
    /// larger one would push out most of what the cache holds for little gain).
    fn file_max(&self) -> u64 {
        self.cache_size as u64 / 16
    }

    /// Evicts the least recently used data beyond `--cache-size`.
    fn trim(&self, cache: &LocalStore) -> Result<()> {
        let r = cache
            .trim(self.cache_size as u64)
            .with_context(|| format!("cannot trim the cache {}", cache.dir().display()))?;
        if r.packs_evicted > 0 {
            tracing::info!(
                "cache: evicted {} chunks ({} bytes) to stay under {}",
                r.chunks_removed,
                r.chunk_bytes_removed,
                human(self.cache_size as u64)
            );
        }
        Ok(())
    }
}

/// The cache, opened on a thread of its own from the command's start and taken once its session
/// has begun: made the first time, it costs a dozen syncs (15-20 ms on this machine's disk),
/// which went before the remote shell was started.
struct CacheOpening {
    thread: Option<std::thread::JoinHandle<Result<LocalStore>>>,
    opened: std::cell::OnceCell<std::result::Result<LocalStore, String>>,
}

impl CacheOpening {
    fn start(args: &CacheArgs) -> Self {
        let args = args.clone();
        CacheOpening {
            thread: Some(std::thread::spawn(move || args.open())),
            opened: std::cell::OnceCell::new(),
        }
    }

    /// The cache, once open (waiting for it the first time).
    fn get(&mut self) -> Result<&LocalStore> {
        if let Some(t) = self.thread.take() {
            let r = t.join().expect("the cache's opening thread panicked");
            let _ = self.opened.set(r.map_err(|e| format!("{e:#}")));
        }
        match self.opened.get() {
            Some(Ok(cache)) => Ok(cache),
            Some(Err(e)) => bail!("{e}"),
            None => unreachable!("set when the thread was joined"),
        }
    }
}

/// Options for stores bounded by [`LocalStore::trim`] (the client cache, the server's staging
/// stores). Eviction works a pack at a time: smaller packs than a store's, and each run's data
/// in packs of its own.
pub(crate) fn cache_options() -> Options {
    Options {
        pack_target: 16 << 20,
        append_to_last_pack: false,
        ..Options::default()
    }
}

/// How to reach the remote side.
#[derive(clap::Args)]
pub struct Rsh {
    /// Remote shell, as with rsync: Ferry runs `RSH HOST FERRY serve --stdio PATH`.
    #[arg(short = 'e', long = "rsh", default_value = "ssh")]
    rsh: String,
    /// The ferry program on the remote side.
    #[arg(long, default_value = "ferry")]
    remote_ferry: String,
    /// Reconnect and resume up to N times when the connection fails (backoff 1 s, 2 s, 4 s, …
    /// up to 30 s). What arrived before a failure is kept either way.
    #[arg(long, default_value_t = 0, value_name = "N")]
    retry: u32,
    /// zstd level of the session, both ways (passed to the far side's `serve` over a remote
    /// shell): 1-22, or `adapt`: from 9, up to 19 or down to 1 as the link allows, higher while
    /// writes wait on a slow link, lower while the link waits on the compressor [default: adapt].
    #[arg(long, value_name = "LEVEL")]
    zstd_level: Option<ferry_proto::Level>,
    #[command(flatten)]
    chunking: Chunking,
}

impl Rsh {
    /// A remote shell and the ferry it runs there, with every other option at its default.
    pub fn shell(rsh: String, remote_ferry: String) -> Rsh {
        Rsh {
            rsh,
            remote_ferry,
            retry: 0,
            zstd_level: None,
            chunking: Chunking { chunk_size: None },
        }
    }

    /// How files are cut into chunks here (and, told by `serve_args`, there).
    pub fn chunker(&self) -> ChunkerSpec {
        self.chunking.spec()
    }

    /// A session with `ferry serve --stdio --index` on `spec` (a lookaside provider over the
    /// remote shell: its export indexed first, then asked for chunks by id).
    pub fn provider_session(&self, spec: &RemoteSpec) -> Result<Session> {
        let mut args = vec!["--index".to_string()];
        args.extend(self.serve_args());
        let level = self.zstd_level.unwrap_or(ferry_fs::DEFAULT_ZSTD_LEVEL);
        Session::spawn(&self.rsh, &self.remote_ferry, spec, &args, level)
            .with_context(|| format!("cannot start a session with {}", spec.host))
    }

    /// What the far side's `serve` is told, so both sides work alike.
    fn serve_args(&self) -> Vec<String> {
        let mut args = vec![];
        if let Some(level) = self.zstd_level {
            args.push(format!("--zstd-level={level}"));
        }
        if let Some(avg) = self.chunking.chunk_size {
            args.push(format!("--chunk-size={avg}"));
        }
        args
    }
}

/// How files are cut into chunks; both sides must agree for chunks to be shared.
#[derive(clap::Args, Clone, Copy)]
pub(crate) struct Chunking {
    /// Average chunk size in bytes (FastCDC; minimum a quarter, maximum eight times; passed to
    /// the far side) [default: 8192].
    #[arg(long, value_name = "BYTES", value_parser = chunk_size)]
    chunk_size: Option<usize>,
}

impl Chunking {
    pub(crate) fn spec(&self) -> ChunkerSpec {
        match self.chunk_size {
            Some(avg) => ChunkerSpec::fastcdc(avg / 4, avg, avg * 8),
            None => ChunkerSpec::default(),
        }
    }
}

fn chunk_size(s: &str) -> Result<usize, String> {
    let avg: usize = s.parse().map_err(|e| format!("{e}"))?;
    ChunkerSpec::fastcdc(avg / 4, avg, avg * 8)
        .validate()
        .map_err(|e| e.to_string())?;
    Ok(avg)
}

/// Whether `e` is the link failing (worth reconnecting), not a refusal or a local problem.
fn is_connection_error(e: &anyhow::Error) -> bool {
    matches!(
        crate::util::conn_error(e),
        Some(ferry_fs::ConnError::Closed | ferry_fs::ConnError::Io(_))
    )
}

/// Runs `attempt` again while it fails for connection reasons, up to `retries` more times.
fn with_retries<T>(retries: u32, mut attempt: impl FnMut() -> Result<T>) -> Result<T> {
    let mut delay = std::time::Duration::from_secs(1);
    let mut left = retries;
    loop {
        match attempt() {
            Err(e) if left > 0 && is_connection_error(&e) => {
                eprintln!(
                    "ferry: {e:#}; reconnecting in {} s ({left} tries left)",
                    delay.as_secs()
                );
                std::thread::sleep(delay);
                delay = (delay * 2).min(std::time::Duration::from_secs(30));
                left -= 1;
            }
            r => return r,
        }
    }
}

#[derive(clap::Args)]
pub struct LsArgs {
    #[command(flatten)]
    rsh: Rsh,
    /// One JSON object per entry.
    #[arg(long)]
    json: bool,
    /// HOST:PATH (over ssh) or `ferry://HOST[:PORT]/PATH` (the TLS daemon)
    remote: String,
}

#[derive(clap::Args)]
pub struct GetArgs {
    #[command(flatten)]
    rsh: Rsh,
    #[command(flatten)]
    cache: CacheArgs,
    /// Another server holding the same tree (or part of it), HOST:PATH or
    /// `ferry://HOST[:PORT]/PATH`: chunks come from it and the first in parallel, the
    /// listings and recipes from the first. Repeatable.
    #[arg(long, value_name = "REMOTE")]
    mirror: Vec<String>,
    /// Never move requests queued at a slow source to an idle one (DOT's request borrowing):
    /// for experiments (`ferry lab --multipath`).
    #[arg(long, hide = true)]
    no_borrowing: bool,
    #[command(flatten)]
    lookaside: super::lookaside::UseArgs,
    /// Print a JSON summary.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    mode: Mode,
    /// HOST:PATH or `ferry://HOST[:PORT]/PATH`, a file or a directory.
    remote: String,
    /// Where to put it.
    local: PathBuf,
}

#[derive(clap::Args)]
pub struct PutArgs {
    #[command(flatten)]
    rsh: Rsh,
    #[command(flatten)]
    cache: CacheArgs,
    /// Print a JSON summary.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    mode: Mode,
    /// A local file or directory.
    local: PathBuf,
    /// HOST:PATH or `ferry://HOST[:PORT]/PATH` to create or update.
    remote: String,
}

#[derive(clap::Args)]
pub struct SyncArgs {
    #[command(flatten)]
    rsh: Rsh,
    #[command(flatten)]
    cache: CacheArgs,
    /// When fetching: another server holding the same tree (see `ferry get --mirror`).
    #[arg(long, value_name = "REMOTE")]
    mirror: Vec<String>,
    /// When fetching: see `ferry get --no-borrowing`.
    #[arg(long, hide = true)]
    no_borrowing: bool,
    #[command(flatten)]
    lookaside: super::lookaside::UseArgs,
    /// Print a JSON summary.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    mode: Mode,
    /// Source: HOST:PATH, `ferry://HOST[:PORT]/PATH` or a local path.
    src: String,
    /// Destination: a local path or a remote (exactly one side is remote).
    dst: String,
}

/// `sync` is `get` or `put`, by which side is remote.
pub fn sync(a: SyncArgs) -> Result<ExitCode> {
    match (is_remote(&a.src), is_remote(&a.dst)) {
        (true, false) => get(GetArgs {
            rsh: a.rsh,
            cache: a.cache,
            mirror: a.mirror,
            no_borrowing: a.no_borrowing,
            lookaside: a.lookaside,
            json: a.json,
            mode: a.mode,
            remote: a.src,
            local: a.dst.into(),
        }),
        (false, true) if !a.mirror.is_empty() => {
            bail!("--mirror is for fetching: the destination here is the remote")
        }
        (false, true) => put(PutArgs {
            rsh: a.rsh,
            cache: a.cache,
            json: a.json,
            mode: a.mode,
            local: a.src.into(),
            remote: a.dst,
        }),
        (true, true) => bail!("both sides are remote; one must be a local path"),
        (false, false) => {
            bail!("neither side is remote (write HOST:PATH or ferry://HOST/PATH for one of them)")
        }
    }
}

/// Splits a remote path into the directory the server exports and the path inside it.
fn split_remote(spec: &RemoteSpec) -> Result<(RemoteSpec, WirePath)> {
    let p = spec.path.trim_end_matches('/');
    if p.is_empty() {
        return Ok((
            RemoteSpec {
                host: spec.host.clone(),
                path: "/".into(),
            },
            WirePath::default(),
        ));
    }
    let (dir, base) = match p.rsplit_once('/') {
        Some((d, b)) => (if d.is_empty() { "/" } else { d }, b),
        None => (".", p),
    };
    if base == "." || base == ".." {
        return Ok((
            RemoteSpec {
                host: spec.host.clone(),
                path: p.into(),
            },
            WirePath::default(),
        ));
    }
    let wire = WirePath::new(base.as_bytes().to_vec())
        .with_context(|| format!("bad remote path {:?}", spec.path))?;
    Ok((
        RemoteSpec {
            host: spec.host.clone(),
            path: dir.into(),
        },
        wire,
    ))
}

/// Whether `s` names a remote: `ferry://…` or `HOST:PATH`.
fn is_remote(s: &str) -> bool {
    s.starts_with("ferry://") || RemoteSpec::parse(s).is_some()
}

fn connect(remote: &str, rsh: &Rsh) -> Result<(Session, WirePath)> {
    if let Some(ep) = ferry_net::Endpoint::parse(remote) {
        // Once: the daemon's own errors (a changed key, say) keep their exit codes.
        let (ep, wire) = endpoint(ep?)?;
        let (id, known) = identity()?;
        let session = net_session(&ep, &id, &known, 0)
            .with_context(|| format!("cannot start a session with {}", ep.host_port()))?;
        return Ok((session, wire));
    }
    // Its first requests go with its Hello (`get`, `put`, `sync` and `ls` go straight to work).
    let (connect, wire) = connector_for(remote, rsh, 0, true)?;
    Ok((connect()?, wire))
}

fn endpoint(ep: ferry_net::Endpoint) -> Result<(ferry_net::Endpoint, WirePath)> {
    let wire = WirePath::new(ep.path.as_bytes().to_vec())
        .with_context(|| format!("bad remote path {:?}", ep.path))?;
    Ok((ep, wire))
}

/// This user's key for the daemon, and the file of the servers' keys trusted.
fn identity() -> Result<(ferry_net::Identity, PathBuf)> {
    let data = ferry_net::data_dir();
    let (id, _) = ferry_net::Identity::load_or_create(&data)?;
    Ok((id, data.join("known_hosts")))
}

/// A session with the daemon at `ep`, with this user's key, its key checked against (or
/// recorded in) `known_hosts`.
pub fn tls_session(ep: &ferry_net::Endpoint) -> Result<Session> {
    let (id, known) = identity()?;
    Ok(net_session(ep, &id, &known, 0)?)
}

fn net_session(
    ep: &ferry_net::Endpoint,
    id: &ferry_net::Identity,
    known: &Path,
    ask: u64,
) -> Result<Session, ferry_net::NetError> {
    ferry_net::connect_asking(ep, id, known, ask, |fp| {
        eprintln!(
            "ferry: first visit to {}: trusting its key {fp} from now on (recorded in {})",
            ep.host_port(),
            known.display()
        )
    })
}

/// What opens a session with the server named by `remote` (as often as needed: the mount
/// reconnects with it), and the path there; each session asks for the Hello features in `ask`
/// besides the usual ones.
pub fn connector(remote: &str, rsh: &Rsh, ask: u64) -> Result<(ferry_mount::Connector, WirePath)> {
    connector_for(remote, rsh, ask, false)
}

/// Like [`connector`]; with `pipelined`, a session over the remote shell does not wait for
/// the server's Hello before its caller's first requests (`Session::spawn_pipelined`).
fn connector_for(
    remote: &str,
    rsh: &Rsh,
    ask: u64,
    pipelined: bool,
) -> Result<(ferry_mount::Connector, WirePath)> {
    if let Some(ep) = ferry_net::Endpoint::parse(remote) {
        let (ep, wire) = endpoint(ep?)?;
        let (id, known) = identity()?;
        let connect = move || {
            net_session(&ep, &id, &known, ask).map_err(|e| match e {
                ferry_net::NetError::Link(e) => e,
                e => ferry_fs::ConnError::Io(std::io::Error::other(format!(
                    "cannot start a session with {}: {e}",
                    ep.host_port()
                ))),
            })
        };
        return Ok((Box::new(connect), wire));
    }
    let Some(spec) = RemoteSpec::parse(remote) else {
        bail!("{remote:?} is not a remote (write HOST:PATH or `ferry://HOST[:PORT]/PATH`)");
    };
    let (root, wire) = split_remote(&spec)?;
    let (shell, remote_ferry, args) = (rsh.rsh.clone(), rsh.remote_ferry.clone(), rsh.serve_args());
    let level = rsh.zstd_level.unwrap_or(ferry_fs::DEFAULT_ZSTD_LEVEL);
    let open = match pipelined {
        true => Session::spawn_pipelined,
        false => Session::spawn_asking,
    };
    let connect = move || {
        open(&shell, &remote_ferry, &root, &args, level, ask).map_err(|e| match e {
            ferry_fs::ConnError::Io(io) => ferry_fs::ConnError::Io(std::io::Error::new(
                io.kind(),
                format!("cannot start a session with {}: {io}", root.host),
            )),
            e => e,
        })
    };
    Ok((Box::new(connect), wire))
}

/// The path on the server that `remote` names (`HOST:PATH`, `ferry://HOST[:PORT]/PATH`).
fn remote_wire(remote: &str) -> Result<WirePath> {
    if let Some(ep) = ferry_net::Endpoint::parse(remote) {
        return Ok(endpoint(ep?)?.1);
    }
    let Some(spec) = RemoteSpec::parse(remote) else {
        bail!("{remote:?} is not a remote (write HOST:PATH or `ferry://HOST[:PORT]/PATH`)");
    };
    Ok(split_remote(&spec)?.1)
}

/// A session with a mirror of the tree `wire` names on the first server.
fn mirror(remote: &str, rsh: &Rsh, wire: &WirePath) -> Result<ferry_fs::Mirror> {
    let (session, root) =
        connect(remote, rsh).with_context(|| format!("cannot reach the mirror {remote}"))?;
    Ok(ferry_fs::Mirror {
        session,
        root,
        of: wire.clone(),
        name: remote.to_string(),
        by_id: false,
    })
}

pub fn ls(a: LsArgs) -> Result<ExitCode> {
    let (mut s, wire) = connect(&a.remote, &a.rsh)?;
    let (attr, entries) =
        ferry_fs::list(&mut s.conn, &wire).with_context(|| format!("cannot list {}", a.remote))?;
    let mut out = BufWriter::new(io::stdout().lock());
    let kind = |k: FileKind| match k {
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
        _ => "file",
    };
    let rows: Vec<(String, ferry_proto::Attr)> = if attr.kind == FileKind::Dir {
        entries
            .into_iter()
            .map(|e| (String::from_utf8_lossy(&e.name).into_owned(), e.attr))
            .collect()
    } else {
        vec![(String::from_utf8_lossy(wire.as_bytes()).into_owned(), attr)]
    };
    for (name, a2) in rows {
        if a.json {
            writeln!(
                out,
                "{}",
                json!({"name": name, "kind": kind(a2.kind), "size": a2.size, "mode": a2.mode, "mtime_ns": a2.mtime_ns})
            )?;
        } else {
            writeln!(
                out,
                "{:<7} {:>4o} {:>12}  {name}",
                kind(a2.kind),
                a2.mode,
                a2.size
            )?;
        }
    }
    out.flush()?;
    drop(out);
    s.close()?;
    Ok(ExitCode::SUCCESS)
}

/// `$XDG_CACHE_HOME/ferry`, else `~/.cache/ferry`: the client's chunk cache and the server's
/// staging stores live under it.
pub fn cache_root() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("."))
        .join("ferry")
}

pub fn get(a: GetArgs) -> Result<ExitCode> {
    let t = Instant::now();
    let mut cache = CacheOpening::start(&a.cache);
    let bar = a.mode.bar();
    let tick = |n: u64| bar.inc(n);
    let devices = a.lookaside.load(&a.rsh.chunking.spec())?;
    let (stats, traffic) = with_retries(a.rsh.retry, || {
        // The mirrors' sessions start beside the first server's (each an ssh handshake: one
        // after the other, they cost a tenth of a 40 MB fetch over two 20 Mbit/s links);
        // unless a remote shell could ask something on the terminal (a password, a host key):
        // two asking at once would take each other's answers.
        let wire = remote_wire(&a.remote)?;
        let all = || std::iter::once(&a.remote).chain(&a.mirror);
        let daemons = all().all(|r| r.starts_with("ferry://"));
        let together = daemons || std::fs::File::open("/dev/tty").is_err();
        if all().any(|r| r.starts_with("ferry://")) {
            // Made once, before sessions start at once.
            identity()?;
        }
        let (rsh, of) = (&a.rsh, &wire);
        let (first, reached) = std::thread::scope(|sc| {
            let started: Vec<_> = (a.mirror.iter().filter(|_| together))
                .map(|m| sc.spawn(move || mirror(m, rsh, of)))
                .collect();
            let first = connect(&a.remote, rsh);
            let mut reached: Vec<_> = (started.into_iter())
                .map(|h| h.join().expect("a mirror's connecting thread panicked"))
                .collect();
            if !together && first.is_ok() {
                reached.extend(a.mirror.iter().map(|m| mirror(m, rsh, of)));
            }
            (first, reached)
        });
        let (mut s, wire) = first?;
        let cache = cache.get()?;
        // An empty cache can hold none of the chunks: new files come whole, small and large.
        // (Asked again on a retry: what arrived before is in the cache, and found there.)
        // With mirrors, files come by recipe, chunks by full id: a mirror serves those.
        let cold = ferry_store::ChunkStore::is_empty(cache)?;
        // A mirror that cannot be reached is gone without: the first server has it all.
        let mut others = devices.provider_sessions(&a.rsh);
        others.extend(reached.into_iter().filter_map(|m| {
            m.map_err(|e| eprintln!("ferry: {e:#}; going on without it"))
                .ok()
        }));
        // Sources besides the server need chunks named by full id, in recipes.
        let by_recipe = !others.is_empty();
        let mirrors = std::sync::Mutex::new(others);
        let src = Sources {
            cache,
            chunker: a.rsh.chunking.spec(),
            delete: a.mode.delete,
            dry_run: a.mode.dry_run,
            progress: Some(&tick),
            cold: cold && !by_recipe,
            ranges: cold && !by_recipe,
            short_ids: !by_recipe,
            cache_file_max: a.cache.file_max(),
            mirrors: by_recipe.then_some(&mirrors),
            borrowing: !a.no_borrowing,
            lookaside: Some(&*devices.lookaside),
        };
        let mut stats = ferry_fs::GetStats::default();
        ferry_fs::get(&mut s.conn, &wire, &a.local, &src, &mut stats)
            .with_context(|| format!("cannot get {} into {}", a.remote, a.local.display()))?;
        let mut traffic = s.conn.traffic();
        s.close()?;
        for m in mirrors.into_inner().unwrap_or_else(|e| e.into_inner()) {
            let t = m.session.conn.traffic();
            traffic.bytes_sent += t.bytes_sent;
            traffic.bytes_received += t.bytes_received;
            traffic.requests += t.requests;
            // A mirror only served chunks: nothing of its ending matters, and a dead link's
            // orderly ending could take as long as its TCP gives up.
            m.session.abort();
        }
        Ok((stats, traffic))
    })?;
    bar.finish_and_clear();
    devices.count(&stats.sources)?;
    a.cache.trim(cache.get()?)?;
    let secs = t.elapsed().as_secs_f64();
    let mut out = io::stdout().lock();
    if !a.json {
        for line in &stats.planned {
            writeln!(out, "would {line}")?;
        }
    }
    if a.json {
        writeln!(
            out,
            "{}",
            json!({"dry_run": a.mode.dry_run, "planned": stats.planned, "files": stats.files, "unchanged": stats.unchanged, "deleted": stats.deleted, "bytes": stats.bytes, "chunks": stats.chunks,
                   "chunks_from_cache": stats.from_cache, "chunks_from_local": stats.from_local,
                   "chunks_against_old": stats.against_old,
                   "chunks_from_server": stats.from_server, "chunk_bytes_from_server": stats.bytes_from_server,
                   "chunks_from_mirrors": stats.from_mirrors, "chunk_bytes_from_mirrors": stats.bytes_from_mirrors,
                   "chunks_from_lookaside": stats.from_lookaside, "chunk_bytes_from_lookaside": stats.bytes_from_lookaside,
                   "sources": stats.sources.iter().map(|s| json!({"name": s.name, "requests": s.requests, "chunks": s.chunks, "bytes": s.bytes, "misses": s.misses, "rejected": s.rejected, "failed": s.failed})).collect::<Vec<_>>(),
                   "bytes_sent": traffic.bytes_sent, "bytes_received": traffic.bytes_received,
                   "requests": traffic.requests, "round_trips": traffic.round_trips, "seconds": secs})
        )?;
    } else {
        writeln!(
            out,
            "{} files fetched ({}), {} unchanged, {} deleted: {} chunks from the server, {} from the cache, {} from local files{}; {} received, {} sent, {} round trips, {secs:.2} s",
            stats.files,
            human(stats.bytes),
            stats.unchanged,
            stats.deleted,
            stats.from_server,
            stats.from_cache,
            stats.from_local,
            match stats.from_lookaside {
                0 => String::new(),
                n => format!(", {n} from lookaside devices"),
            },
            human(traffic.bytes_received),
            human(traffic.bytes_sent),
            traffic.round_trips
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

pub fn put(a: PutArgs) -> Result<ExitCode> {
    let t = Instant::now();
    if std::fs::symlink_metadata(&a.local).is_err() {
        bail!("cannot read {}", a.local.display());
    }
    let bar = a.mode.bar();
    let tick = |n: u64| bar.inc(n);
    let mut cache = CacheOpening::start(&a.cache);
    let (stats, traffic) = with_retries(a.rsh.retry, || {
        let (mut s, wire) = connect(&a.remote, &a.rsh)?;
        // Old data held here (it came from the server) is what new data compresses against
        // best; a cache another ferry holds is gone without.
        let cache = (cache.get())
            .map_err(|e| tracing::debug!("no cache for this upload: {e:#}"))
            .ok();
        let opts = ferry_fs::PutOptions {
            chunker: a.rsh.chunking.spec(),
            delete: a.mode.delete,
            dry_run: a.mode.dry_run,
            progress: Some(&tick),
            cache: cache.map(|c| c as &dyn ferry_store::ChunkStore),
            fewer_round_trips: false,
            stat_after: None,
            sync_after: false,
        };
        let mut stats = ferry_fs::PutStats::default();
        ferry_fs::put(&mut s.conn, &a.local, &wire, &opts, &mut stats)
            .with_context(|| format!("cannot put {} to {}", a.local.display(), a.remote))?;
        let traffic = s.conn.traffic();
        s.close()?;
        Ok((stats, traffic))
    })?;
    bar.finish_and_clear();
    let secs = t.elapsed().as_secs_f64();
    let mut out = io::stdout().lock();
    if !a.json {
        for line in &stats.planned {
            writeln!(out, "would {line}")?;
        }
    }
    if a.json {
        writeln!(
            out,
            "{}",
            json!({"dry_run": a.mode.dry_run, "planned": stats.planned, "files": stats.files, "unchanged": stats.unchanged, "deleted": stats.deleted, "bytes": stats.bytes, "chunks": stats.chunks,
                   "chunks_sent": stats.chunks_sent, "chunk_bytes_sent": stats.chunk_bytes_sent,
                   "bytes_sent": traffic.bytes_sent, "bytes_received": traffic.bytes_received,
                   "requests": traffic.requests, "round_trips": traffic.round_trips, "seconds": secs})
        )?;
    } else {
        writeln!(
            out,
            "{} files sent ({}), {} unchanged, {} deleted: {} of {} chunks sent; {} sent, {} received, {} round trips, {secs:.2} s",
            stats.files,
            human(stats.bytes),
            stats.unchanged,
            stats.deleted,
            stats.chunks_sent,
            stats.chunks,
            human(traffic.bytes_sent),
            human(traffic.bytes_received),
            traffic.round_trips
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_paths_split_into_root_and_wire_path() {
        let s = |p: &str| {
            let (r, w) = split_remote(&RemoteSpec {
                host: "h".into(),
                path: p.into(),
            })
            .unwrap();
            (r.path, String::from_utf8(w.as_bytes().to_vec()).unwrap())
        };
        assert_eq!(s("src"), (".".into(), "src".into()));
        assert_eq!(s("src/"), (".".into(), "src".into()));
        assert_eq!(s("/a/b/c.txt"), ("/a/b".into(), "c.txt".into()));
        assert_eq!(s("/top"), ("/".into(), "top".into()));
        assert_eq!(s("/"), ("/".into(), "".into()));
        assert_eq!(s("."), (".".into(), "".into()));
        assert_eq!(s("a/.."), ("a/..".into(), "".into()));
        assert!(RemoteSpec::parse("./a:b").is_none());
        assert!(RemoteSpec::parse("/x").is_none());
        assert_eq!(RemoteSpec::parse("h:").unwrap().path, ".");
    }
}
