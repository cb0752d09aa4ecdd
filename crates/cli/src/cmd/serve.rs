//! `ferry serve`: the file service's server side, over a remote shell (`--stdio`) or as a TLS
//! daemon, with the history of data served and the export's chunk index.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use ferry_format::{HashAlg, Id};
use ferry_fs::{Export, Server, ServerOptions};
use ferry_store::LocalStore;

use super::remote::{cache_options, cache_root, Chunking};
use crate::cmd::staging::StagingStore;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("how").required(true).args(["stdio", "listen"])))]
pub struct ServeArgs {
    /// Speak the protocol on standard input and output (how `ssh host ferry serve --stdio DIR`
    /// is used by `ferry get`).
    #[arg(long)]
    stdio: bool,
    /// Run the TLS daemon on ADDRESS (`PORT`, `HOST:PORT`; port 0 picks a free one) for
    /// `ferry://host[:port]/path` clients whose keys are authorized.
    #[arg(long, value_name = "ADDRESS", num_args = 0..=1, default_missing_value = "0.0.0.0:7330")]
    listen: Option<String>,
    /// Client keys the daemon lets in [default: authorized_keys in the data directory].
    #[arg(long, value_name = "FILE")]
    authorized_keys: Option<PathBuf>,
    /// Daemon sessions at once; more clients are told the server is busy.
    #[arg(long, default_value_t = 64)]
    max_sessions: usize,
    #[command(flatten)]
    chunking: Chunking,
    /// zstd level of what the server sends: 1-22 (higher spends CPU to save bytes; 19 is
    /// about `zstd -19`, a few MB/s, and ~100 MB of memory a session), or `adapt`: from 9, up to
    /// 19 or down to 1 as the link allows, higher while writes wait on a slow link, lower while the link
    /// waits on the compressor.
    #[arg(long, value_name = "LEVEL", default_value_t = ferry_fs::DEFAULT_ZSTD_LEVEL)]
    zstd_level: ferry_proto::Level,
    /// Bound on the history of served data (every chunk the server has cut, kept so that a
    /// client's old version can be the reference of a delta); 0 keeps none.
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = crate::util::parse_size)]
    history_size: usize,
    /// Keep the chunks clients upload in this S3 store (`s3://BUCKET/PREFIX`; credentials the
    /// AWS way), shared by every server on it: what one server received, another does not ask
    /// for again. Without it, each client's uploads wait in a local staging store of its own.
    #[arg(long, value_name = "s3://BUCKET/PREFIX")]
    store: Option<String>,
    /// Before serving, record every file of DIR in the export's chunk index (only files new or
    /// changed since are read), so that any of their chunks can be asked for by id: how a
    /// lookaside provider over ssh serves (`ferry lookaside add HOST:PATH`).
    #[arg(long, requires = "stdio")]
    index: bool,
    /// The directory to export.
    dir: PathBuf,
}

pub fn serve(a: ServeArgs) -> Result<ExitCode> {
    let export =
        Export::open(&a.dir).with_context(|| format!("cannot export {}", a.dir.display()))?;
    if !std::fs::metadata(&a.dir)?.is_dir() {
        bail!("{} is not a directory", a.dir.display());
    }
    let opts = ServerOptions {
        zstd_level: a.zstd_level,
        chunker: a.chunking.spec(),
        ..ServerOptions::default()
    };
    let shared = match &a.store {
        Some(s) if ferry_s3::Locator::is_s3(s) => {
            let st: std::sync::Arc<dyn ferry_store::ChunkStore> =
                std::sync::Arc::new(crate::cmd::s3::open(s, true)?);
            Some(st)
        }
        Some(s) => bail!("--store {s}: a shared store is an S3 store (s3://BUCKET/PREFIX)"),
        None => None,
    };
    // A shared store serves what one server's clients sent to the others: every write goes
    // there. A local staging store only waits for cut uploads to resume.
    let opts = ServerOptions {
        stage_writes: shared.is_some(),
        ..opts
    };
    let Some(listen) = a.listen else {
        let history = History {
            dir: cache_root().join("server-history"),
            bytes: a.history_size as u64,
        };
        let staging = StagingStore::new(shared, &cache_root().join("server-staging"));
        let mut server = Server::new(export, opts, staging.store());
        // The history and the index open side by side: made the first time, each costs a
        // dozen syncs, all before the client's Hello is read.
        let (kept, index) = std::thread::scope(|s| {
            let index = s.spawn(|| export_index(&a.dir));
            let kept = history.open();
            (kept, index.join().expect("opening the index panicked"))
        });
        if let Some(h) = &kept {
            server = server.with_history(h.clone(), history.bytes);
        }
        match index {
            Some(i) => server = server.with_index(i),
            None if a.index => {
                eprintln!("ferry: no chunk index for {} now (another session holds it): its chunks are not found by id this time", a.dir.display());
            }
            None => {}
        }
        if a.index {
            let s = server
                .index_export()
                .with_context(|| format!("cannot index {}", a.dir.display()))?;
            tracing::info!(
                "indexed {}: {} files, {} read ({} bytes), {} unreadable",
                a.dir.display(),
                s.files,
                s.cut,
                s.bytes,
                s.unreadable
            );
        }
        let stdin = io::stdin().lock();
        let stdout = BufWriter::with_capacity(256 * 1024, io::stdout().lock());
        let served = ferry_fs::serve(&mut server, stdin, stdout);
        // Uploads the session left open (a cut link) are staged as the server goes.
        drop(server);
        staging.trim()?;
        served?;
        history.trim(kept)?;
        return Ok(ExitCode::SUCCESS);
    };
    let addr = if listen.parse::<u16>().is_ok() {
        format!("0.0.0.0:{listen}")
    } else {
        listen
    };
    let listener =
        std::net::TcpListener::bind(&addr).with_context(|| format!("cannot listen on {addr}"))?;
    let data = ferry_net::data_dir();
    let (identity, _) = ferry_net::Identity::load_or_create(&data)?;
    let keys = a
        .authorized_keys
        .unwrap_or_else(|| data.join("authorized_keys"));
    let n = ferry_net::read_authorized(&keys)?.len();
    // The banner is for whoever started the daemon; a closed standard output is no error.
    let banner = format!(
        "ferry: serving {} on {}\nferry: server key {}\nferry: {n} authorized client key(s) in {}{}\n",
        a.dir.display(),
        listener.local_addr()?,
        identity.fingerprint(),
        keys.display(),
        if n == 0 { " (add one with `ferry key authorize FINGERPRINT`)" } else { "" }
    );
    let _ = io::stdout()
        .write_all(banner.as_bytes())
        .and_then(|_| io::stdout().flush());
    let history = History {
        dir: history_dir(&a.dir)?,
        bytes: a.history_size as u64,
    };
    let dir = a.dir.clone();
    // One index for every session of the daemon.
    let index = export_index(&a.dir);
    let handler: ferry_net::Handler = std::sync::Arc::new(move |peer, stream, hello| {
        let opts = ServerOptions {
            hello_timeout: Some(hello),
            ..opts.clone()
        };
        let session = SessionSetup {
            dir: &dir,
            opts: &opts,
            history: &history,
            index: index.clone(),
            shared: shared.clone(),
        };
        if let Err(e) = daemon_session(session, peer, stream) {
            tracing::warn!("session for {} ({}): {e:#}", peer.name, peer.fingerprint);
        }
    });
    ferry_net::Daemon {
        listener,
        identity,
        authorized_keys: keys,
        max_sessions: a.max_sessions.max(1),
        guests: 0,
        hello_timeout: ferry_net::HELLO_TIMEOUT,
        handshake_timeout: ferry_net::HANDSHAKE_TIMEOUT,
    }
    .run(handler)?;
    Ok(ExitCode::SUCCESS)
}

/// One daemon session. Chunks a client sends wait in a staging store of that client's own, so
/// "have you got this chunk?" never answers from another client's uploads.
fn daemon_session(
    s: SessionSetup<'_>,
    peer: &ferry_net::Peer,
    stream: std::os::unix::net::UnixStream,
) -> Result<()> {
    let SessionSetup {
        dir,
        opts,
        history,
        index,
        shared,
    } = s;
    let export = Export::open(dir)?;
    let who = &peer.fingerprint.to_string()["blake3:".len()..][..32];
    let staging = StagingStore::new(shared, &cache_root().join("server-staging").join(who));
    let mut server = Server::new(export, opts.clone(), staging.store());
    let kept = history.open();
    if let Some(h) = &kept {
        server = server.with_history(h.clone(), history.bytes);
    }
    if let Some(i) = index {
        server = server.with_index(i);
    }
    let input = stream.try_clone()?;
    let output = BufWriter::with_capacity(256 * 1024, stream);
    let served = ferry_fs::serve(&mut server, input, output);
    drop(server);
    staging.trim()?;
    served?;
    history.trim(kept)?;
    Ok(())
}

/// What a daemon session serves with.
struct SessionSetup<'a> {
    dir: &'a Path,
    opts: &'a ServerOptions,
    history: &'a History,
    index: Option<std::sync::Arc<ferry_store::PathIndex>>,
    /// The store `--store` names, shared by every session and server on it.
    shared: Option<std::sync::Arc<dyn ferry_store::ChunkStore>>,
}

/// The history of data served: over a remote shell, one store for all the user's sessions (they
/// all run as the user); a daemon, one store for its export. Sessions use it one at a time (a
/// session that finds it busy goes without).
struct History {
    dir: PathBuf,
    bytes: u64,
}

/// The zstd level of the history's chunks: its thread compresses every byte the server cuts,
/// on the cores the session's own work (and, often, the client) needs.
const HISTORY_LEVEL: i32 = 1;

impl History {
    fn open(&self) -> Option<std::sync::Arc<LocalStore>> {
        if self.bytes == 0 {
            return None;
        }
        // Not waited for: a session alongside another (a mount's second, for a second program
        // at work in it) went without after a second's wait, and the program waited with it.
        let opts = ferry_store::Options {
            wait_for_lock: false,
            zstd_level: HISTORY_LEVEL,
            ..cache_options()
        };
        match LocalStore::open_or_create(&self.dir, opts) {
            Ok(s) => Some(std::sync::Arc::new(s)),
            Err(e) => {
                tracing::info!("no history this session ({}): {e}", self.dir.display());
                None
            }
        }
    }

    /// Evicts the least recently used data beyond the bound.
    fn trim(&self, store: Option<std::sync::Arc<LocalStore>>) -> Result<()> {
        if let Some(s) = store {
            ferry_store::ChunkStore::flush(&*s)?;
            s.trim(self.bytes)
                .with_context(|| format!("cannot trim the history {}", self.dir.display()))?;
        }
        Ok(())
    }
}

/// Where a daemon keeps the history of the export `dir`.
fn history_dir(dir: &Path) -> Result<PathBuf> {
    Ok(cache_root().join("daemon-history").join(export_name(dir)?))
}

/// A name for the export `dir`: a hash of its canonical path.
fn export_name(dir: &Path) -> Result<String> {
    use std::os::unix::ffi::OsStrExt;
    let canonical = dir
        .canonicalize()
        .with_context(|| format!("cannot export {}", dir.display()))?;
    let id = Id::hash(HashAlg::Blake3, canonical.as_os_str().as_bytes());
    Ok(id.digest()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// The export's chunk index (where chunks, recipes and objects were seen, across sessions), if
/// it can be had: a second session over ssh at the same time goes without.
fn export_index(dir: &Path) -> Option<std::sync::Arc<ferry_store::PathIndex>> {
    let name = export_name(dir).ok()?;
    let path = cache_root()
        .join("export-index")
        .join(format!("{name}.redb"));
    match ferry_store::PathIndex::open(&path, HashAlg::Blake3) {
        Ok(i) => Some(std::sync::Arc::new(i)),
        Err(e) => {
            tracing::info!("no chunk index this session ({}): {e}", path.display());
            None
        }
    }
}
