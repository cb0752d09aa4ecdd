//! Where a daemon keeps its state and its socket: one daemon per user and environment, found
//! by the same environment variables by the daemon and the commands that call it.

use std::path::{Path, PathBuf};

/// A daemon's places.
#[derive(Clone, Debug)]
pub struct Paths {
    /// `$XDG_DATA_HOME/ferry/daemon`: the object store, the secret, the transfers accepted.
    pub data: PathBuf,
    /// `$XDG_RUNTIME_DIR/ferry/daemon.sock` (else `/tmp/ferry-UID/daemon.sock`): the local API.
    pub socket: PathBuf,
    /// `$XDG_DATA_HOME/ferry`: the user's key (`identity.pem`, the one `ferry serve --listen`
    /// and `ferry key` use) and `authorized_keys`.
    pub keys: PathBuf,
    /// `$XDG_CACHE_HOME/ferry` (else `~/.cache/ferry`): indexes of lookaside devices that
    /// cannot hold their own.
    pub cache: PathBuf,
}

impl Paths {
    /// The places the environment names: `FERRY_DAEMON_DIR` (as [`Paths::under`]) when set,
    /// else the XDG directories.
    pub fn from_env() -> Paths {
        if let Some(d) = std::env::var_os("FERRY_DAEMON_DIR").filter(|d| !d.is_empty()) {
            return Paths::under(Path::new(&d));
        }
        Paths {
            data: ferry_net::data_dir().join("daemon"),
            socket: runtime_dir().join("daemon.sock"),
            keys: ferry_net::data_dir(),
            cache: std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
                .unwrap_or_else(|| PathBuf::from("."))
                .join("ferry"),
        }
    }

    /// Places under one directory (tests, labs).
    pub fn under(dir: &Path) -> Paths {
        Paths {
            data: dir.join("data"),
            socket: dir.join("daemon.sock"),
            keys: dir.to_path_buf(),
            cache: dir.join("cache"),
        }
    }
}

fn runtime_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("ferry"),
        _ => std::env::temp_dir().join(format!("ferry-{}", rustix::process::getuid().as_raw())),
    }
}
