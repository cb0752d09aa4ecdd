//! Which process serves a mount point: the mount notes itself while it serves, so that
//! `ferry umount` can wait for it to end (its last write-backs sent, its cache closed) before
//! it returns, as `umount` of a local file system returns with the data on its way to disk.
//!
//! The note is a file under the cache root, `mounts/` and the first 16 hex digits of the
//! BLAKE3 hash of the mount point's canonical path, holding `PID START` (decimal; START is the
//! process's start time, field 22 of `/proc/PID/stat`, so a process id used again by another
//! process is not taken for the mount's).

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fd::OwnedFd;

use super::remote::cache_root;

/// The note of the mount at `mountpoint` (canonical, or as given when it cannot be resolved).
fn note_path(mountpoint: &Path) -> PathBuf {
    let canon = std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let h = blake3::hash(canon.as_os_str().as_bytes()).to_hex();
    cache_root().join("mounts").join(&h[..16])
}

/// The start time of process `pid` (clock ticks after boot), if it is alive.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after its end.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// This process serves the mount at `mountpoint`: noted until the returned guard drops.
pub(super) struct Serving(PathBuf, String);

impl Serving {
    /// Notes this process for `mountpoint` (before it is mounted over: its path resolves the
    /// same either way). A note that cannot be written costs only `ferry umount`'s wait.
    pub(super) fn note(mountpoint: &Path) -> Option<Serving> {
        let pid = std::process::id();
        let body = format!("{pid} {}\n", start_time(pid)?);
        let path = note_path(mountpoint);
        let dir = path.parent()?;
        let written = std::fs::create_dir_all(dir).and_then(|()| {
            let tmp = dir.join(format!(".{pid}.tmp"));
            std::fs::write(&tmp, &body)?;
            std::fs::rename(&tmp, &path)
        });
        match written {
            Ok(()) => Some(Serving(path, body)),
            Err(e) => {
                tracing::warn!("cannot note the mount's process in {}: {e}", dir.display());
                None
            }
        }
    }
}

impl Drop for Serving {
    /// Removes the note, unless another mount at the same point replaced it.
    fn drop(&mut self) {
        if std::fs::read_to_string(&self.0).is_ok_and(|b| b == self.1) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// The process noted as serving `mountpoint`, still alive, as a descriptor to wait on.
pub(super) fn serving(mountpoint: &Path) -> Option<(u32, OwnedFd)> {
    let body = std::fs::read_to_string(note_path(mountpoint)).ok()?;
    let mut words = body.split_whitespace().map(|w| w.parse::<u64>().ok());
    let (pid, start) = (words.next()??, words.next()??);
    let pid = u32::try_from(pid).ok()?;
    let fd = rustix::process::pidfd_open(
        rustix::process::Pid::from_raw(pid as i32)?,
        rustix::process::PidfdFlags::empty(),
    )
    .ok()?;
    // Opened first, checked after: the descriptor holds that very process.
    (start_time(pid) == Some(start)).then_some((pid, fd))
}

/// Waits for the process behind `fd` to end; after `patience`, says once what it waits for.
pub(super) fn wait_for(pid: u32, fd: &OwnedFd, patience: Duration) -> std::io::Result<()> {
    let mut told = false;
    loop {
        let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
        let wait = (!told).then(|| rustix::event::Timespec {
            tv_sec: patience.as_secs() as i64,
            tv_nsec: patience.subsec_nanos() as i64,
        });
        match rustix::event::poll(&mut fds, wait.as_ref()) {
            Ok(0) => {
                eprintln!(
                    "ferry: waiting for the mount's process ({pid}) to send its last changes and end…"
                );
                told = true;
            }
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_process_has_a_start_time_and_a_gone_one_none() {
        assert!(start_time(std::process::id()).is_some());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(start_time(pid), None);
    }
}
