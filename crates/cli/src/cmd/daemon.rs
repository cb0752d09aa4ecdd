//! `ferry daemon`: the transfer daemon (DOT) of this user, serving the local API on a Unix
//! socket and other daemons over TLS. Foreground by default; `--detach` starts it in the
//! background the way `ferry mount` does and returns once it is ready.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use ferry_daemon::{Config, Paths};

/// Set in the environment of the background child: it reports readiness on standard output.
const DETACHED_ENV: &str = "FERRY_DAEMON_DETACHED";
/// The peer side's port when `--listen` names none.
pub const DEFAULT_PEER_PORT: u16 = 7331;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DaemonArgs {
    #[command(subcommand)]
    cmd: Option<DaemonCmd>,
    /// Where other daemons reach this one (TLS, this user's key): ADDR:PORT [default:
    /// 0.0.0.0:7331, or any free port when that one is taken].
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Serve no other daemon (objects put here are fetched only from this machine's API).
    #[arg(long, conflicts_with = "listen")]
    no_listen: bool,
    /// The host name (or HOST:PORT, when something forwards to this daemon) other daemons
    /// reach this one at, put in the tickets' hints [default: the address listened on, or this
    /// machine's name].
    #[arg(long, value_name = "HOST")]
    advertise: Option<String>,
    /// Where its state and socket are: DIR/data and DIR/daemon.sock [default:
    /// $XDG_DATA_HOME/ferry/daemon and $XDG_RUNTIME_DIR/ferry/daemon.sock].
    #[arg(long, value_name = "DIR", env = "FERRY_DAEMON_DIR")]
    dir: Option<PathBuf>,
    /// Go to the background once ready (logging to DATA/daemon.log).
    #[arg(long)]
    detach: bool,
    /// Print what it serves as JSON once ready.
    #[arg(long)]
    json: bool,
    #[arg(long, hide = true)]
    foreground: bool,
}

#[derive(clap::Subcommand)]
enum DaemonCmd {
    /// Whether a daemon runs, and what it serves.
    Status {
        #[arg(long, value_name = "DIR", env = "FERRY_DAEMON_DIR")]
        dir: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Stop the running daemon (SIGTERM); the fetches it accepted are taken up again when it
    /// starts.
    Stop {
        #[arg(long, value_name = "DIR", env = "FERRY_DAEMON_DIR")]
        dir: Option<PathBuf>,
    },
    /// Portable storage (DOT): directories on devices that carry objects between machines.
    Device {
        #[command(subcommand)]
        cmd: DeviceCmd,
        #[arg(long, global = true, value_name = "DIR", env = "FERRY_DAEMON_DIR")]
        dir: Option<PathBuf>,
        #[arg(long, global = true)]
        json: bool,
    },
    /// Other daemons (or S3 stores) that keep copies of this one's objects, so that `ferry
    /// object put -P N` answers once N stores hold them (each daemon must authorize this
    /// daemon's key; an S3 store is reached with the daemon's AWS credentials).
    Replica {
        #[command(subcommand)]
        cmd: ReplicaCmd,
        #[arg(long, global = true, value_name = "DIR", env = "FERRY_DAEMON_DIR")]
        dir: Option<PathBuf>,
        #[arg(long, global = true)]
        json: bool,
    },
}

#[derive(clap::Subcommand)]
enum ReplicaCmd {
    /// Add the daemon at `ferry://HOST[:PORT]` (reached now; its key recorded on first use and
    /// pinned), or the S3 store at `s3://BUCKET/PREFIX` (created if missing; any daemon with
    /// credentials for it can then fetch the objects copied there, without this one).
    Add { uri: String },
    /// Stop asking it for copies (those it keeps stay).
    Remove { uri: String },
    /// The replicas, in the order they are asked.
    List,
}

#[derive(clap::Subcommand)]
enum DeviceCmd {
    /// Register a device directory: fetches take chunks from it whenever it is present (looked
    /// at every 5 s); with --push, every object put is also copied to it.
    Add {
        path: PathBuf,
        #[arg(long)]
        push: bool,
    },
    /// Forget a device directory (what is on it stays).
    Remove { path: PathBuf },
    /// The registered devices.
    List,
}

/// What every client of a daemon's API takes (`ferry object`, `ferry dir`).
#[derive(clap::Args)]
pub struct ClientOpts {
    /// The daemon's directory, as given to `ferry daemon --dir` [default: the environment's].
    #[arg(long, global = true, value_name = "DIR", env = "FERRY_DAEMON_DIR")]
    pub dir: Option<PathBuf>,
    /// Answer in JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

/// The daemon's places: `--dir` (or `FERRY_DAEMON_DIR`), else the environment's.
pub fn paths(dir: Option<&PathBuf>) -> Paths {
    match dir {
        Some(d) => Paths::under(d),
        None => Paths::from_env(),
    }
}

pub fn run(a: DaemonArgs) -> Result<ExitCode> {
    match a.cmd {
        Some(DaemonCmd::Status { dir, json }) => return status(&paths(dir.as_ref()), json),
        Some(DaemonCmd::Stop { dir }) => return stop(&paths(dir.as_ref())),
        Some(DaemonCmd::Device { cmd, dir, json }) => {
            return device(&paths(dir.as_ref()), cmd, json)
        }
        Some(DaemonCmd::Replica { cmd, dir, json }) => {
            return replica(&paths(dir.as_ref()), cmd, json)
        }
        None => {}
    }
    let paths = paths(a.dir.as_ref());
    if a.detach && !a.foreground {
        return detach(&paths);
    }
    let detached = std::env::var_os(DETACHED_ENV).is_some();
    let listen = match (a.no_listen, a.listen) {
        (true, _) => None,
        (false, Some(l)) => Some(l),
        (false, None) => Some(default_listen()),
    };
    let cfg = Config {
        paths,
        listen,
        advertise: a.advertise.clone(),
    };
    let json = a.json;
    let r = ferry_daemon::run(cfg, |s| {
        if json {
            println!("{}", serde_json::to_string(s).unwrap_or_default());
        } else {
            eprintln!(
                "ferry daemon {} (process {}): API on {}, peers on {}, key {}",
                s.version,
                s.pid,
                s.socket.display(),
                s.listen.as_deref().unwrap_or("nothing (--no-listen)"),
                s.key
            );
        }
        if detached {
            let _ = writeln!(std::io::stdout(), "ready");
            let _ = std::io::stdout().flush();
            if let Ok(null) = std::fs::File::open("/dev/null") {
                let _ = rustix::stdio::dup2_stdout(&null);
            }
        }
    });
    match r {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if detached => {
            let _ = writeln!(std::io::stdout(), "error: {e:#}");
            Ok(ExitCode::FAILURE)
        }
        Err(e) => Err(e.into()),
    }
}

/// 0.0.0.0:7331 when free, else a port the system picks.
fn default_listen() -> SocketAddr {
    let fixed = SocketAddr::from(([0, 0, 0, 0], DEFAULT_PEER_PORT));
    match std::net::TcpListener::bind(fixed) {
        Ok(_) => fixed,
        Err(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
    }
}

fn detach(paths: &Paths) -> Result<ExitCode> {
    std::fs::create_dir_all(&paths.data)
        .with_context(|| format!("cannot create {}", paths.data.display()))?;
    let log_path = paths.data.join("daemon.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open the log {}", log_path.display()))?;
    let child = crate::util::start_background(&log, &log_path, DETACHED_ENV, "the daemon")?;
    eprintln!(
        "ferry: daemon running (process {}; API {}; log {})",
        child.id(),
        paths.socket.display(),
        log_path.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn running(paths: &Paths) -> Result<ferry_daemon::api::Status> {
    let client = ferry_daemon::client::Client::new(&paths.socket)?;
    Ok(client.get("/v1/status")?)
}

fn status(paths: &Paths, json: bool) -> Result<ExitCode> {
    let s = running(paths)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        println!(
            "process {}\nversion {}\napi     {}\ndata    {}\nkey     {}\npeers   {}",
            s.pid,
            s.version,
            s.socket.display(),
            s.data.display(),
            s.key,
            s.listen.as_deref().unwrap_or("-")
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn stop(paths: &Paths) -> Result<ExitCode> {
    let s = running(paths)?;
    let pid =
        rustix::process::Pid::from_raw(s.pid as i32).context("the daemon reports no process id")?;
    rustix::process::kill_process(pid, rustix::process::Signal::TERM)
        .with_context(|| format!("cannot stop process {}", s.pid))?;
    eprintln!("ferry: stopped the daemon (process {})", s.pid);
    Ok(ExitCode::SUCCESS)
}

fn replica(paths: &Paths, cmd: ReplicaCmd, json: bool) -> Result<ExitCode> {
    use ferry_daemon::api::ReplicaRequest;
    let client = ferry_daemon::client::Client::new(&paths.socket)?;
    let list: Vec<String> = match cmd {
        ReplicaCmd::Add { uri } => client.post("/v1/replicas", &ReplicaRequest { uri })?,
        ReplicaCmd::Remove { uri } => {
            client.post("/v1/replicas/remove", &ReplicaRequest { uri })?
        }
        ReplicaCmd::List => client.get("/v1/replicas")?,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        for r in list {
            println!("{r}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn device(paths: &Paths, cmd: DeviceCmd, json: bool) -> Result<ExitCode> {
    use ferry_daemon::api::RemoveDevice;
    use ferry_daemon::devices::Device;
    let client = ferry_daemon::client::Client::new(&paths.socket)?;
    let list: Vec<Device> = match cmd {
        DeviceCmd::Add { path, push } => {
            let path = std::fs::canonicalize(&path)
                .with_context(|| format!("cannot use {}", path.display()))?;
            client.post("/v1/devices", &Device { path, push })?
        }
        DeviceCmd::Remove { path } => {
            let path = std::path::absolute(&path)?;
            client.post("/v1/devices/remove", &RemoveDevice { path })?
        }
        DeviceCmd::List => client.get("/v1/devices")?,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        for d in list {
            let present = d.path.is_dir();
            println!(
                "{}{}{}",
                d.path.display(),
                if d.push { "  (push)" } else { "" },
                if present { "" } else { "  (not present)" }
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
