//! Whether the mount at a path is still this process's. An unmount goes by path, so a mount
//! ending after `ferry umount` (its last changes still being sent) would otherwise unmount
//! whatever is at the path by then: the next mount made there. Neither the device number nor
//! the mount id tell them apart (the kernel gives the next mount the ones just freed); the
//! FUSE connection does: it is cut when its mount goes.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The mount this process made at a path, and its FUSE connection.
#[derive(Debug)]
pub(crate) struct Owner {
    path: PathBuf,
    fuse: OwnedFd,
}

impl Owner {
    /// The mount just made at `mountpoint`, served through `fuse` (the session's /dev/fuse).
    pub(crate) fn new(mountpoint: &Path, fuse: impl AsFd) -> std::io::Result<Owner> {
        Ok(Owner {
            path: std::path::absolute(mountpoint)?,
            fuse: fuse.as_fd().try_clone_to_owned()?,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this mount's connection still stands (the kernel has not cut it: it is
    /// mounted, wherever it is).
    pub(crate) fn connected(&self) -> bool {
        connected(&self.fuse)
    }

    /// What is to be unmounted once this mount's session has ended: the path, if this mount
    /// is still connected (the session ended by an error of its own) or a dead FUSE mount is
    /// there (its connection aborted); nothing if the path holds no mount of this process any
    /// more (unmounted, perhaps with another mount made there since).
    pub(crate) fn left_behind(&self) -> Option<&Path> {
        if self.connected() {
            return Some(&self.path);
        }
        match rustix::fs::stat(&self.path) {
            Err(rustix::io::Errno::NOTCONN) => Some(&self.path),
            _ => None,
        }
    }
}

/// Whether the FUSE connection of `fuse` stands: polled, a cut one reports an error.
fn connected(fuse: &impl AsFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        fuse,
        rustix::event::PollFlags::empty(),
    )];
    match rustix::event::poll(&mut fds, Some(&rustix::event::Timespec::default())) {
        Ok(0) => true,
        Ok(_) => !fds[0]
            .revents()
            .intersects(rustix::event::PollFlags::ERR | rustix::event::PollFlags::HUP),
        Err(_) => false,
    }
}
