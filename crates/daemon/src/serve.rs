//! The daemon's process: the local API on a Unix socket (mode 0600, and only the socket owner's
//! connections are served) and the peer side beside it: the TLS daemon of `ferry-net`, serving
//! the shelf's objects by capability, and chunks by id to the keys it authorizes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use ferry_net::Identity;

use crate::api::{router, Daemon, Status};
use crate::devices::Devices;
use crate::fetch;
use crate::jobs::{Job, Jobs, Runner};
use crate::shelf::Shelf;
use crate::ticket::{Hint, Ticket};
use crate::{Config, DaemonError};

/// See [`crate::run`].
pub(crate) fn run(cfg: Config, ready: impl FnOnce(&Status)) -> Result<(), DaemonError> {
    let paths = cfg.paths.clone();
    // First: a daemon already running here is the clearest reason not to start.
    let socket = bind_socket(&paths.socket)?;
    let shelf = Arc::new(Shelf::open(&paths.data)?);
    std::fs::create_dir_all(&paths.keys).map_err(DaemonError::file("create", &paths.keys))?;
    let (identity, _) = Identity::load_or_create(&paths.keys)?;
    let key = identity.fingerprint();
    let identity = Arc::new(identity);
    let devices = Arc::new(Devices::open(&paths.data.join("devices.json"))?);
    // One handle per S3 store for the whole daemon (each keeps a local index, one process's).
    let s3 = Arc::new(crate::s3::S3Stores::new(paths.data.join("s3")));
    let fetch_by = fetcher(&paths, &shelf, &identity, &devices, &s3);
    let replicas = Arc::new(crate::replicas::Replicas::new(
        &paths.data.join("replicas.json"),
        s3,
    ));
    let mut hints = vec![];
    let listen = match cfg.listen {
        None => None,
        Some(addr) => {
            let l = std::net::TcpListener::bind(addr)
                .map_err(|e| DaemonError::Unavailable(format!("cannot listen on {addr}: {e}")))?;
            let bound = l
                .local_addr()
                .map_err(DaemonError::file("bind", &paths.socket))?;
            hints.push(Hint::new(
                format!("ferry://{}?key={key}", advertised(&cfg, bound)),
                10,
                100,
            ));
            let peer_shelf = crate::replicas::PeerShelf {
                shelf: shelf.clone(),
                fetch: fetch_by.clone(),
                replicas: replicas.clone(),
                identity: identity.clone(),
                hints: hints.clone(),
            };
            peer_side(l, &paths, Arc::new(peer_shelf))?;
            Some(bound.to_string())
        }
    };
    let mut status = Status {
        version: env!("CARGO_PKG_VERSION").into(),
        pid: std::process::id(),
        socket: paths.socket.clone(),
        data: paths.data.clone(),
        key: key.to_string(),
        listen,
        root: String::new(),
        hints,
    };
    let runner: Runner = {
        let (fetch_by, hints) = (fetch_by.clone(), status.hints.clone());
        let shelf = shelf.clone();
        Arc::new(move |job: &Job, progress: &(dyn Fn(u64) + Sync)| {
            let ticket: Ticket = job
                .ticket
                .parse()
                .map_err(|e: crate::ticket::BadTicket| DaemonError::BadRequest(e.to_string()))?;
            let (cap, mut report) = fetch_by(&ticket, progress, false)?;
            if let Some(p) = &job.path {
                fetch::install(&shelf, &cap, p)?;
            }
            let local = Ticket {
                cap,
                hints: hints.clone(),
                ..ticket
            };
            report.local = Some(local.to_string());
            Ok(report)
        })
    };
    let jobs = Jobs::open(&paths.data.join("jobs"), runner.clone())?;
    compactor(shelf.objects().clone());
    let root = crate::dirs::root(shelf.objects(), &paths.data)?;
    status.root = crate::dirs::directory_ticket(root, &status.hints).to_string();
    ready(&status);
    let daemon = Arc::new(Daemon {
        shelf,
        replicas,
        identity,
        known_hosts: paths.keys.join("known_hosts"),
        devices,
        jobs,
        runner,
        status,
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| DaemonError::Unavailable(format!("cannot start the API's runtime: {e}")))?;
    rt.block_on(serve(socket, router(daemon)))
}

/// Fetches an object by ticket into the shelf (a job's work, and a replica's): the owner's
/// capability of the copy, and what the fetch did. With `fresh`, a new object even when one
/// holds the same bytes already.
pub(crate) type FetchBy = Arc<
    dyn Fn(
            &Ticket,
            &(dyn Fn(u64) + Sync),
            bool,
        ) -> Result<(ferry_objects::Capability, fetch::Fetched), DaemonError>
        + Send
        + Sync,
>;

fn fetcher(
    paths: &crate::Paths,
    shelf: &Arc<Shelf>,
    identity: &Arc<Identity>,
    devices: &Arc<Devices>,
    s3: &Arc<crate::s3::S3Stores>,
) -> FetchBy {
    let (shelf, identity, devices) = (shelf.clone(), identity.clone(), devices.clone());
    let s3 = s3.clone();
    let paths = paths.clone();
    Arc::new(
        move |ticket: &Ticket, progress: &(dyn Fn(u64) + Sync), fresh: bool| {
            let lookaside = lookaside(&paths);
            let f = fetch::Fetcher {
                shelf: &shelf,
                identity: &identity,
                devices: &devices,
                lookaside: lookaside.as_ref(),
                registry: &paths.keys,
                providers: registered(&paths)
                    .into_iter()
                    .map(|p| p.to_string_lossy().into_owned())
                    .filter(|p| p.starts_with("ferry://"))
                    .collect(),
                known_hosts: paths.keys.join("known_hosts"),
                s3: &s3,
            };
            fetch::fetch(&f, ticket, progress, fresh)
        },
    )
}

/// How often the object store's holes are looked at, and when they are worth compacting: more
/// than this many bytes, and more than a quarter of the data files.
const COMPACT_EVERY: std::time::Duration = std::time::Duration::from_secs(60);
const COMPACT_HOLES: u64 = 64 << 20;
/// Bytes moved per round at most, so a round never holds the disk long.
const COMPACT_BUDGET: u64 = 256 << 20;

/// Compacts the object store in the background (Bullet's holes, filled as creates come and
/// compacted when they grow).
fn compactor(objects: Arc<ferry_objects::ObjectStore>) {
    let weak = Arc::downgrade(&objects);
    drop(objects);
    let spawned = std::thread::Builder::new()
        .name("ferry-compact".into())
        .spawn(move || loop {
            std::thread::sleep(COMPACT_EVERY);
            let Some(o) = weak.upgrade() else { return };
            let st = o.stats();
            if st.holes > COMPACT_HOLES && st.holes * 4 > st.used {
                match o.compact(COMPACT_BUDGET) {
                    Ok(n) => tracing::info!("compacted the object store: {n} bytes moved"),
                    Err(e) => tracing::warn!("compacting the object store: {e}"),
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("no background compaction: {e}");
    }
}

/// What the user's lookaside registry names: devices and providers.
fn registered(paths: &crate::Paths) -> Vec<PathBuf> {
    ferry_lookaside::Registry::new(&paths.keys)
        .list()
        .map_err(|e| tracing::warn!("the lookaside registry: {e}"))
        .unwrap_or_default()
        .into_iter()
        .map(|e| e.path)
        .collect()
}

/// The user's lookaside devices (`ferry lookaside add`) that are indexed with the daemon's
/// chunker, if any.
fn lookaside(paths: &crate::Paths) -> Option<ferry_lookaside::Lookaside> {
    let roots: Vec<PathBuf> = registered(paths)
        .into_iter()
        // Devices are absolute paths; providers (`ferry://…`, `HOST:PATH`) are not.
        .filter(|p| p.is_absolute())
        .collect();
    if roots.is_empty() {
        return None;
    }
    let (l, unusable) = ferry_lookaside::Lookaside::load(
        &roots,
        &paths.cache.join("lookaside"),
        &ferry_chunk::ChunkerSpec::default(),
        ferry_format::HashAlg::Blake3,
        ferry_lookaside::Matching::Chunks,
    );
    for (root, why) in unusable {
        tracing::info!("lookaside {}: {why}", root.display());
    }
    (!l.is_empty()).then_some(l)
}

/// The host and port peers reach the daemon at: `--advertise` (a host, or a host and port
/// when something in between forwards to the daemon), else the address bound.
fn advertised(cfg: &Config, bound: SocketAddr) -> String {
    if let Some(a) = &cfg.advertise {
        if a.parse::<SocketAddr>().is_ok() {
            return a.clone();
        }
        if let Some((h, p)) = a.rsplit_once(':') {
            if !h.contains(':') && p.parse::<u16>().is_ok() {
                return a.clone();
            }
        }
    }
    let host = match &cfg.advertise {
        Some(h) => h.clone(),
        None if bound.ip().is_unspecified() => rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned(),
        None => bound.ip().to_string(),
    };
    if host.contains(':') {
        format!("[{host}]:{}", bound.port())
    } else {
        format!("{host}:{}", bound.port())
    }
}

/// The peer side: other daemons (any key) read objects by capability; clients whose keys are
/// authorized see an empty export besides.
fn peer_side(
    listener: std::net::TcpListener,
    paths: &crate::Paths,
    shelf: Arc<crate::replicas::PeerShelf>,
) -> Result<(), DaemonError> {
    let (identity, _) = Identity::load_or_create(&paths.keys)?;
    let export_dir = paths.data.join("export");
    std::fs::create_dir_all(&export_dir).map_err(DaemonError::file("create", &export_dir))?;
    let handler: ferry_net::Handler = Arc::new(move |peer, stream, hello| {
        let session = || -> Result<(), Box<dyn std::error::Error>> {
            let export = ferry_fs::Export::open(&export_dir)?;
            let opts = ferry_fs::ServerOptions {
                hello_timeout: Some(hello),
                trash_bytes: 0,
                ..Default::default()
            };
            let staging: ferry_fs::Staging = shelf.shelf.staging().clone();
            let mut server = ferry_fs::Server::new(export, opts, staging)
                .with_objects(shelf.clone(), !peer.authorized);
            let input = stream.try_clone()?;
            let output = std::io::BufWriter::with_capacity(256 << 10, stream);
            ferry_fs::serve(&mut server, input, output)?;
            Ok(())
        };
        if let Err(e) = session() {
            tracing::info!("peer session with {}: {e}", peer.addr);
        }
    });
    let daemon = ferry_net::Daemon {
        listener,
        identity,
        authorized_keys: paths.keys.join("authorized_keys"),
        max_sessions: 16,
        guests: 64,
        hello_timeout: ferry_net::HELLO_TIMEOUT,
        handshake_timeout: ferry_net::HANDSHAKE_TIMEOUT,
    };
    std::thread::Builder::new()
        .name("ferry-peers".into())
        .spawn(move || {
            if let Err(e) = daemon.run(handler) {
                tracing::error!("the peer side stopped: {e}");
            }
        })
        .map_err(|e| DaemonError::Unavailable(format!("cannot start the peer side: {e}")))?;
    Ok(())
}

/// Binds the API socket, mode 0600 in a directory of mode 0700; a socket left by a daemon that
/// died is replaced, one a live daemon answers on is not.
fn bind_socket(path: &Path) -> Result<std::os::unix::net::UnixListener, DaemonError> {
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().expect("a socket in a directory");
    std::fs::create_dir_all(dir).map_err(DaemonError::file("create", dir))?;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(DaemonError::Unavailable(format!(
            "a daemon already runs on {} (one per user and data directory)",
            path.display()
        )));
    }
    let _ = std::fs::remove_file(path);
    let l =
        std::os::unix::net::UnixListener::bind(path).map_err(DaemonError::file("bind", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(DaemonError::file("set the mode of", path))?;
    Ok(l)
}

/// Serves HTTP/1.1 on the socket to connections from its owner's processes only.
async fn serve(socket: std::os::unix::net::UnixListener, app: Router) -> Result<(), DaemonError> {
    let me = rustix::process::getuid();
    socket
        .set_nonblocking(true)
        .map_err(|e| DaemonError::Unavailable(e.to_string()))?;
    let listener = tokio::net::UnixListener::from_std(socket)
        .map_err(|e| DaemonError::Unavailable(e.to_string()))?;
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("API accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                continue;
            }
        };
        match stream.peer_cred() {
            Ok(c) if c.uid() == me.as_raw() => {}
            Ok(c) => {
                tracing::warn!("API: refused a connection from uid {}", c.uid());
                continue;
            }
            Err(e) => {
                tracing::warn!("API: no peer credentials: {e}");
                continue;
            }
        }
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await
            {
                tracing::debug!("API connection: {e}");
            }
        });
    }
}
