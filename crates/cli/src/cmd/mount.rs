//! `ferry mount` and `ferry umount`.
//!
//! By default the mount goes to the background the way sshfs does: this process starts itself
//! again with `--foreground` (in a process group of its own, logging to a file), waits until
//! the mount is in place or has failed, says which, and exits. `--foreground` keeps it here,
//! logging to standard error; Ctrl-C (or SIGTERM, SIGHUP) unmounts.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::remote::{cache_root, connector, Rsh};

/// Set in the environment of the background child: it reports readiness on standard output.
const DAEMON_ENV: &str = "FERRY_MOUNT_DAEMON";

#[derive(clap::Args)]
pub struct MountArgs {
    /// The remote directory: `HOST:PATH` (over ssh, like rsync and sshfs) or
    /// `ferry://HOST[:PORT]/PATH` (Ferry's TLS daemon).
    remote: String,
    /// Where to mount it: an existing directory.
    mountpoint: PathBuf,
    /// Stay in the foreground, logging to standard error; Ctrl-C unmounts.
    #[arg(short, long)]
    foreground: bool,
    #[command(flatten)]
    rsh: Rsh,
    /// The cache of whole files and chunks, kept between mounts [default:
    /// `$XDG_CACHE_HOME/ferry/mount/REMOTE`].
    #[arg(long, value_name = "DIR")]
    cache: Option<PathBuf>,
    /// Bound on the cached copies of files (the least recently used go first; files with
    /// changes not yet written back never); the chunk cache takes up to half as much again.
    #[arg(long, value_name = "SIZE", default_value = "2G", value_parser = crate::util::parse_size)]
    cache_size: usize,
    /// Seconds without a word from the server before it counts as unreachable: operations that
    /// need it then fail (EHOSTDOWN) while cached files still open.
    #[arg(long, value_name = "SECONDS", default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout: u64,
    /// Let other users use the mount (root, or user_allow_other in /etc/fuse.conf).
    #[arg(long)]
    allow_other: bool,
    /// Every close, removal, rename and chmod waits for the server, so another machine sees
    /// it as soon as the call returns. By default those the leases vouch for (a small new
    /// file's commit among them) return at once and reach the server together within
    /// 10-100 ms: `tar x`, `git clone` and `rm -rf` then cost a round trip for many files,
    /// not one a file.
    #[arg(long)]
    strict_close: bool,
    /// The background mount's log [default: mount.log in the cache directory].
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
    #[command(flatten)]
    lookaside: super::lookaside::UseArgs,
}

#[derive(clap::Args)]
pub struct UmountArgs {
    /// The mount point of a `ferry mount`.
    mountpoint: PathBuf,
}

/// The default cache directory of a remote: one per remote, named so a person can tell.
fn cache_dir(remote: &str) -> PathBuf {
    let name: String = remote
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    let h = blake3::hash(remote.as_bytes()).to_hex();
    cache_root()
        .join("mount")
        .join(format!("{name}-{}", &h[..12]))
}

pub fn mount(a: MountArgs) -> Result<ExitCode> {
    let meta = std::fs::metadata(&a.mountpoint)
        .with_context(|| format!("mount point {}", a.mountpoint.display()))?;
    if !meta.is_dir() {
        bail!("mount point {} is not a directory", a.mountpoint.display());
    }
    let cache = a.cache.clone().unwrap_or_else(|| cache_dir(&a.remote));
    if !a.foreground {
        return background(&a, &cache);
    }
    let daemon = std::env::var_os(DAEMON_ENV).is_some();
    match run(&a, &cache, daemon) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if daemon => {
            // The parent is waiting for a line: it prints the error (if it is still there).
            let _ = writeln!(std::io::stdout(), "error: {e:#}");
            Ok(ExitCode::FAILURE)
        }
        Err(e) => Err(e),
    }
}

fn run(a: &MountArgs, cache: &Path, daemon: bool) -> Result<()> {
    let (connect, root) = connector(&a.remote, &a.rsh, ferry_mount::FEATURES)?;
    let devices = a.lookaside.load(&a.rsh.chunker())?;
    let providers = ferry_mount::Providers::new(devices.provider_sessions(&a.rsh));
    let opts = ferry_mount::Options {
        cache_dir: cache.to_path_buf(),
        cache_size: a.cache_size as u64,
        timeout: Duration::from_secs(a.timeout),
        chunker: a.rsh.chunker(),
        lookaside: Some(devices.lookaside.clone()),
        providers: providers.clone(),
        strict_close: a.strict_close,
    };
    let vfs = ferry_mount::Vfs::new(connect, root, opts)
        .with_context(|| format!("cannot mount {}", a.remote))?;
    let mopts = ferry_mount::MountOptions {
        fsname: a.remote.clone(),
        allow_other: a.allow_other,
        ..Default::default()
    };
    let unmounter: Arc<Mutex<Option<ferry_mount::Unmounter>>> = Arc::default();
    {
        let u = unmounter.clone();
        ctrlc::set_handler(move || {
            if let Some(u) = u.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                if let Err(e) = u.unmount() {
                    tracing::warn!("cannot unmount: {e}");
                }
            }
        })
        .context("cannot handle signals")?;
    }
    let mountpoint = a.mountpoint.clone();
    let remote = a.remote.clone();
    // Noted until this process is done with the mount: `ferry umount` waits for it.
    let _serving = super::mount_pid::Serving::note(&a.mountpoint);
    ferry_mount::serve(vfs, &a.mountpoint, &mopts, move |u| {
        *unmounter.lock().unwrap_or_else(|e| e.into_inner()) = Some(u);
        tracing::info!("{remote} mounted at {}", mountpoint.display());
        if daemon {
            // A parent gone meanwhile is no reason to stop serving.
            let _ = writeln!(std::io::stdout(), "ready");
            let _ = std::io::stdout().flush();
            // The parent reads until the end of this pipe: close it.
            if let Ok(null) = std::fs::File::open("/dev/null") {
                let _ = rustix::stdio::dup2_stdout(&null);
            }
        }
    })
    .with_context(|| format!("cannot mount at {}", a.mountpoint.display()))?;
    devices.count(&providers.supplied())
}

/// Starts the mount in the background and reports how that went.
fn background(a: &MountArgs, cache: &Path) -> Result<ExitCode> {
    std::fs::create_dir_all(cache).with_context(|| format!("cannot create {}", cache.display()))?;
    let log_path = a.log.clone().unwrap_or_else(|| cache.join("mount.log"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open the log {}", log_path.display()))?;
    let child = crate::util::start_background(&log, &log_path, DAEMON_ENV, "the mount")?;
    eprintln!(
        "ferry: {} mounted at {} (process {}; log {}; `ferry umount {}` to unmount)",
        a.remote,
        a.mountpoint.display(),
        child.id(),
        log_path.display(),
        a.mountpoint.display()
    );
    Ok(ExitCode::SUCCESS)
}

pub fn umount(a: UmountArgs) -> Result<ExitCode> {
    // Removals the mount acknowledged and has not sent yet, and changes not yet durable on the
    // server, get there before this returns: an fsync of the mount's root sends both.
    if let Err(e) = std::fs::File::open(&a.mountpoint).and_then(|root| root.sync_all()) {
        tracing::warn!(
            "cannot make the mount's last changes durable before unmounting ({e}); its process tries again as it ends"
        );
    }
    let serving = super::mount_pid::serving(&a.mountpoint);
    ferry_mount::unmount(&a.mountpoint)
        .with_context(|| format!("cannot unmount {}", a.mountpoint.display()))?;
    // Returns once the mount's process has ended: its last write-backs sent (or kept in its
    // cache), its cache closed, so a mount again (or a removal of the cache) can follow.
    if let Some((pid, fd)) = serving {
        super::mount_pid::wait_for(pid, &fd, Duration::from_secs(1))
            .with_context(|| format!("cannot wait for the mount's process ({pid})"))?;
    }
    Ok(ExitCode::SUCCESS)
}
