//! `ferry mount`: the low-bandwidth network file system of LBFS on Ferry's file service.
//!
//! Editors and compilers run locally on files that live on a distant server: a file opened
//! here is brought up to date in a whole-file cache (nothing is sent while its lease holds;
//! one round trip when the lease expired and it did not change; otherwise only the chunks not
//! found locally), read and written at local speed, and committed atomically on close with
//! only the chunks the server lacks (close-to-open consistency; the last close wins).
//!
//! - [`vfs`]: the file system logic, free of FUSE (tests drive it directly).
//! - `fuse`: the thin adapter to the kernel (the `fuser` crate; as root it mounts without
//!   libfuse).
//! - `link`: one session with the server, reconnected in the background, every wait bounded.
//! - `cache`: the whole-file cache on disk.
//!
//! ```no_run
//! use std::time::Duration;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let connect: ferry_mount::Connector = Box::new(|| {
//!     let mut cmd = std::process::Command::new("ssh");
//!     cmd.args(["build-server", "ferry", "serve", "--stdio", "src"]);
//!     ferry_fs::Session::command(cmd)
//! });
//! let opts = ferry_mount::Options {
//!     cache_dir: "/home/me/.cache/ferry/mount/src".into(),
//!     cache_size: 2 << 30,
//!     timeout: Duration::from_secs(15),
//!     chunker: Default::default(),
//!     lookaside: None,
//!     providers: Default::default(),
//!     strict_close: false,
//! };
//! let vfs = ferry_mount::Vfs::new(connect, ferry_proto::WirePath::default(), opts)?;
//! ferry_mount::serve(vfs, "/home/me/src".as_ref(), &ferry_mount::MountOptions::default(), |_| {})?;
//! # Ok(()) }
//! ```

mod cache;
mod fuse;
mod link;
mod owner;
mod queued;
mod recipes;
pub mod vfs;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use link::Connector;

/// The optional features a mount's sessions ask for (the [`Connector`] passes them on): a
/// mount never compares trees by digest, shows all of stat(2), makes changes durable at
/// `fsync` or about a second later, keeps its own listings up to date after its changes,
/// follows others' changes in them name by name, and shows hard links.
pub const FEATURES: u64 = ferry_proto::FEATURE_NO_TREE_DIGESTS
    | ferry_proto::FEATURE_STAT_EXTRA
    | ferry_proto::FEATURE_DEFERRED_SYNC
    | ferry_proto::FEATURE_OWN_CHANGES
    | ferry_proto::FEATURE_ENTRY_CHANGES
    | ferry_proto::FEATURE_HARD_LINKS;
pub use vfs::{Errno, Ino, MountError, Options, Providers, SpecialKind, Stat, Vfs, ROOT};

/// How the kernel side is set up.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Shown as the mount's source (`mount`, `df`).
    pub fsname: String,
    /// Let other users reach the mount (root only, or `user_allow_other` in /etc/fuse.conf).
    pub allow_other: bool,
    /// Threads serving the kernel: cached files are read while another thread waits for the
    /// server.
    pub threads: usize,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            fsname: "ferry".into(),
            allow_other: false,
            threads: 4,
        }
    }
}

/// Unmounts a running [`serve`] from another thread (a signal handler's, say); nothing once
/// its mount is gone (another mount may be at the path by then).
pub struct Unmounter(Arc<owner::Owner>);

impl Unmounter {
    pub fn unmount(&mut self) -> std::io::Result<()> {
        if !self.0.connected() {
            return Ok(());
        }
        unmount(self.0.path())
    }
}

/// How often idle upkeep runs: lease breaks taken, reconnection, deferred write-backs.
const TICK: Duration = Duration::from_millis(200);

/// Mounts `vfs` at `mountpoint` and serves it until it is unmounted; `ready` is called once
/// the mount is in place. At the end, changes not yet written back are written (or kept in the
/// cache for the next mount, when the server cannot be reached).
pub fn serve(
    vfs: Vfs,
    mountpoint: &Path,
    opts: &MountOptions,
    ready: impl FnOnce(Unmounter),
) -> std::io::Result<()> {
    let vfs = Arc::new(vfs);
    // SAFETY-free identity: the caller's ids own every file.
    let (uid, gid) = (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(opts.fsname.clone()),
        fuser::MountOption::Subtype("ferry".into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoAtime,
        fuser::MountOption::NoDev,
        fuser::MountOption::NoSuid,
    ];
    if opts.allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(opts.threads.max(1));
    let fs = fuse::FerryFs {
        vfs: vfs.clone(),
        uid,
        gid,
    };
    let session = fuser::Session::new(fs, mountpoint, &config)?;
    let owner = Arc::new(owner::Owner::new(mountpoint, &session)?);
    let stop = Arc::new(AtomicBool::new(false));
    // Upkeep, and the sending of changes queued (which waits for them itself).
    let keeper = until_stopped("ferry-upkeep", &stop, {
        let vfs = vfs.clone();
        move || {
            std::thread::sleep(TICK);
            vfs.tick();
        }
    })?;
    let sender = until_stopped("ferry-changes", &stop, {
        let vfs = vfs.clone();
        move || vfs.send_changes(TICK)
    })?;
    ready(Unmounter(owner.clone()));
    // Run on a thread of fuser's that does not unmount at its end: fuser unmounts by path,
    // which, once `ferry umount` has ended this mount, would unmount the next one made there
    // (`ferry umount M; ferry mount … M` while this one still finishes its last requests).
    let mut running = match session.spawn() {
        Ok(r) => r,
        Err(e) => {
            stop.store(true, Ordering::Release);
            return Err(e);
        }
    };
    let panicked = |_| Err(std::io::Error::other("the mount's thread panicked"));
    let r = match std::thread::Builder::new().spawn(|| Ok(())) {
        Ok(stand_in) => {
            let r = std::mem::replace(&mut running.guard, stand_in)
                .join()
                .unwrap_or_else(panicked);
            // (fuser's own unmount of the path is never run.)
            std::mem::forget(running);
            r
        }
        // No thread for a stand-in: fuser's join, whose end unmounts by path as before.
        Err(_) => running.join(),
    };
    if let Some(path) = owner.left_behind() {
        if let Err(e) = unmount(path) {
            tracing::warn!(
                "cannot unmount {} after the session ended: {e}",
                path.display()
            );
        }
    }
    stop.store(true, Ordering::Release);
    let _ = keeper.join();
    let _ = sender.join();
    r
}

/// A thread named `name` that runs `step` again and again until `stop` is set.
fn until_stopped(
    name: &str,
    stop: &Arc<AtomicBool>,
    mut step: impl FnMut() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let stop = stop.clone();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            while !stop.load(Ordering::Acquire) {
                step();
            }
        })
}

/// Unmounts the file system at `mountpoint` (as root directly, else with fusermount).
pub fn unmount(mountpoint: &Path) -> std::io::Result<()> {
    match rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::empty()) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::PERM) => {
            let mut last = None;
            for prog in ["fusermount3", "fusermount"] {
                match std::process::Command::new(prog)
                    .arg("-u")
                    .arg(mountpoint)
                    .status()
                {
                    Ok(s) if s.success() => return Ok(()),
                    Ok(s) => last = Some(std::io::Error::other(format!("{prog} -u failed ({s})"))),
                    Err(e) => last = Some(e),
                }
            }
            Err(last.unwrap_or_else(|| std::io::Error::other("cannot unmount")))
        }
        Err(rustix::io::Errno::INVAL) => Err(std::io::Error::other(format!(
            "{} is not a mount point",
            mountpoint.display()
        ))),
        Err(e) => Err(e.into()),
    }
}
