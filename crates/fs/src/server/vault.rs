//! The vault family: a vault's blobs in a directory of the export, and OceanStore's inner
//! ring (tree actions applied here, with no key). The directory is opened beneath the export
//! and every name beneath it with no symlink followed (`ferry_vault::DirBackend`).

use ferry_proto::{ErrorCode, Reply, VaultOp, WirePath, MAX_VAULT_NAMES};
use ferry_vault::{Backend, DirBackend, VaultError};

use super::{error, io_error, Server};

/// About how many bytes one answer to a get of several names carries.
const MANY_BYTES: usize = 2 << 20;

fn vault_error(e: VaultError) -> Reply {
    let code = match &e {
        VaultError::NotAVault(_) | VaultError::Missing(_) | VaultError::NotFound(_) => {
            ErrorCode::NotFound
        }
        VaultError::Damaged { .. } | VaultError::BadRange(_) => ErrorCode::BadRequest,
        _ => ErrorCode::Io,
    };
    error(code, e.to_string())
}

impl Server {
    pub(super) fn vault(&self, path: &WirePath, op: VaultOp, name: &[u8], data: &[u8]) -> Reply {
        if op == VaultOp::Init {
            return match self.make_dirs(path) {
                Ok(()) => Reply::Ok,
                Err(e) => io_error(path, &e),
            };
        }
        let fd = match self.export.open_dir(path) {
            Ok(fd) => fd,
            Err(e) => return io_error(path, &e),
        };
        if op == VaultOp::Flush {
            // Puts were renamed into place by requests of their own: sync the file system.
            return match rustix::fs::syncfs(&fd) {
                Ok(()) => Reply::Ok,
                Err(e) => io_error(path, &e.into()),
            };
        }
        let dir = DirBackend::from_fd(fd, format!("{path:?}"));
        let Ok(name) = std::str::from_utf8(name) else {
            return error(ErrorCode::BadRequest, "a vault name that is not UTF-8");
        };
        let r = match op {
            VaultOp::Get => dir.get(name).map(Reply::VaultData),
            VaultOp::Put => dir.put(name, data).map(|()| Reply::Ok),
            VaultOp::Create => dir
                .create(name, data)
                .map(|made| Reply::VaultData(Some(vec![u8::from(made)]))),
            VaultOp::List => list(&dir, name, data),
            VaultOp::Delete => dir.delete(name).map(|()| Reply::Ok),
            VaultOp::GetMany => {
                let names: Vec<&str> = match std::str::from_utf8(data) {
                    Ok(t) if !t.is_empty() => t.split('\n').collect(),
                    _ => return error(ErrorCode::BadRequest, "get many: no names"),
                };
                ferry_vault::backend::encode_many(&dir, &names, MANY_BYTES)
                    .map(|b| Reply::VaultData(Some(b)))
            }
            VaultOp::PutMany => ferry_vault::backend::decode_puts(data).and_then(|blobs| {
                blobs.iter().try_for_each(|(n, b)| dir.put(n, b))?;
                Ok(Reply::Ok)
            }),
            VaultOp::Apply => {
                ferry_vault::ring::serve_apply(&dir, data).map(|r| Reply::VaultData(Some(r)))
            }
            VaultOp::Init | VaultOp::Flush => unreachable!("handled above"),
        };
        r.unwrap_or_else(vault_error)
    }

    /// Makes the directories of `path` that are missing, beneath the export.
    fn make_dirs(&self, path: &WirePath) -> std::io::Result<()> {
        let bytes = path.as_bytes();
        let mut at = 0;
        while at <= bytes.len() {
            let end = bytes[at..]
                .iter()
                .position(|&b| b == b'/')
                .map_or(bytes.len(), |i| at + i);
            let prefix = WirePath::new(bytes[..end].to_vec()).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string())
            })?;
            if !bytes[..end].is_empty() && self.export.open_dir(&prefix).is_err() {
                let (parent, leaf) = self.export.parent(&prefix)?;
                match rustix::fs::mkdirat(
                    &parent,
                    super::os(&leaf),
                    rustix::fs::Mode::from_raw_mode(0o755),
                ) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                rustix::fs::fsync(&parent)?;
            }
            at = end + 1;
        }
        Ok(())
    }
}

/// The names under `dir` after `after`, one page.
fn list(b: &DirBackend, dir: &str, after: &[u8]) -> Result<Reply, VaultError> {
    let after = std::str::from_utf8(after).unwrap_or("");
    let names: Vec<String> = b
        .list(dir)?
        .into_iter()
        .filter(|n| n.as_str() > after)
        .take(MAX_VAULT_NAMES)
        .collect();
    Ok(Reply::VaultData(Some(names.join("\n").into_bytes())))
}
