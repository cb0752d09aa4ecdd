//! A vault on a Ferry server, from the client's side: the vault family's requests over a
//! session (ssh stdio or TLS), as a `ferry_vault::Backend` whose `apply` has the server play
//! OceanStore's inner ring. A link that fails is reopened and the request sent again: every
//! operation is idempotent, and a create whose answer was lost reads as "taken", after which
//! the update finds its own head and has nothing left to do.

use std::sync::Mutex;

use ferry_proto::{ErrorCode, Reply, Request, VaultOp, WirePath};
use ferry_vault::{Backend, VaultError};

use crate::{ConnError, Session};

/// Opens a session with the server (again, after a failed link).
pub type Connect = Box<dyn Fn() -> Result<Session, ConnError> + Send + Sync>;

/// Times a request is tried over a failing link.
const ATTEMPTS: usize = 3;

pub struct RemoteVault {
    connect: Connect,
    session: Mutex<Option<Session>>,
    path: WirePath,
    name: String,
}

impl RemoteVault {
    /// The vault in the directory `path` of the server `connect` reaches (`name` for messages).
    pub fn new(connect: Connect, path: WirePath, name: String) -> RemoteVault {
        RemoteVault {
            connect,
            session: Mutex::new(None),
            path,
            name,
        }
    }

    fn call(&self, op: VaultOp, name: &str, data: &[u8]) -> Result<Reply, VaultError> {
        let mut last = None;
        for _ in 0..ATTEMPTS {
            let mut s = self.session.lock().unwrap();
            if s.is_none() {
                // A session that cannot start is not a link that failed mid-way: no retry.
                let new = (self.connect)()
                    .map_err(|e| VaultError::Backend(format!("{}: {e}", self.name)))?;
                *s = Some(new);
            }
            let session = s.as_mut().expect("connected");
            let q = Request::Vault {
                path: self.path.clone(),
                op,
                name: name.as_bytes().to_vec(),
                data: data.to_vec(),
            };
            match session.conn.call(q) {
                Ok(mut replies) if replies.len() == 1 => return Ok(replies.remove(0)),
                Ok(r) => {
                    return Err(VaultError::Backend(format!(
                        "{}: an unexpected answer {r:?}",
                        self.name
                    )))
                }
                Err(ConnError::Remote { code, message }) => {
                    return Err(match code {
                        ErrorCode::NotFound => {
                            VaultError::NotAVault(format!("{} ({message})", self.name))
                        }
                        _ => VaultError::Backend(format!("{}: {message}", self.name)),
                    })
                }
                Err(e @ (ConnError::Closed | ConnError::Io(_))) => {
                    *s = None;
                    last = Some(e);
                }
                Err(e) => return Err(VaultError::Backend(format!("{}: {e}", self.name))),
            }
        }
        Err(VaultError::Backend(format!(
            "{}: the link failed: {}",
            self.name,
            last.map_or("no session".into(), |e| e.to_string())
        )))
    }

    fn data(&self, r: Reply) -> Result<Option<Vec<u8>>, VaultError> {
        match r {
            Reply::VaultData(d) => Ok(d),
            r => Err(VaultError::Backend(format!(
                "{}: an unexpected answer {r:?}",
                self.name
            ))),
        }
    }

    fn ok(&self, r: Reply) -> Result<(), VaultError> {
        match r {
            Reply::Ok => Ok(()),
            r => Err(VaultError::Backend(format!(
                "{}: an unexpected answer {r:?}",
                self.name
            ))),
        }
    }

    /// Makes the vault's directory on the server (for `init`).
    pub fn make_dir(&self) -> Result<(), VaultError> {
        let r = self.call(VaultOp::Init, "", &[])?;
        self.ok(r)
    }
}

impl Backend for RemoteVault {
    fn get(&self, name: &str) -> Result<Option<Vec<u8>>, VaultError> {
        let r = self.call(VaultOp::Get, name, &[])?;
        self.data(r)
    }

    fn get_many(&self, names: &[String]) -> Result<Vec<Option<Vec<u8>>>, VaultError> {
        let mut out = Vec::with_capacity(names.len());
        while out.len() < names.len() {
            let rest = &names[out.len()..];
            let r = self.call(VaultOp::GetMany, "", rest.join("\n").as_bytes())?;
            let got =
                ferry_vault::backend::decode_many(&self.data(r)?.unwrap_or_default(), rest.len())?;
            if got.is_empty() {
                return Err(VaultError::Backend(format!(
                    "{}: a get of several names answered none",
                    self.name
                )));
            }
            out.extend(got);
        }
        Ok(out)
    }

    fn put(&self, name: &str, bytes: &[u8]) -> Result<(), VaultError> {
        let r = self.call(VaultOp::Put, name, bytes)?;
        self.ok(r)
    }

    fn put_many(&self, blobs: &[(String, Vec<u8>)]) -> Result<(), VaultError> {
        let r = self.call(
            VaultOp::PutMany,
            "",
            &ferry_vault::backend::encode_puts(blobs),
        )?;
        self.ok(r)
    }

    fn create(&self, name: &str, bytes: &[u8]) -> Result<bool, VaultError> {
        let r = self.call(VaultOp::Create, name, bytes)?;
        match self.data(r)?.as_deref() {
            Some([1]) => Ok(true),
            Some([0]) => Ok(false),
            _ => Err(VaultError::Backend(format!(
                "{}: a create answered neither made nor taken",
                self.name
            ))),
        }
    }

    fn list(&self, dir: &str) -> Result<Vec<String>, VaultError> {
        self.list_after(dir, "")
    }

    fn list_after(&self, dir: &str, from: &str) -> Result<Vec<String>, VaultError> {
        let mut out: Vec<String> = vec![];
        loop {
            let after = out.last().cloned().unwrap_or_else(|| from.to_string());
            let r = self.call(VaultOp::List, dir, after.as_bytes())?;
            let page = self.data(r)?.unwrap_or_default();
            if page.is_empty() {
                return Ok(out);
            }
            let text = String::from_utf8(page).map_err(|_| {
                VaultError::Backend(format!("{}: a listing that is not UTF-8", self.name))
            })?;
            let before = out.len();
            out.extend(text.split('\n').map(str::to_string));
            if out[before..].iter().any(|n| *n <= after) {
                return Err(VaultError::Backend(format!(
                    "{}: a listing out of order",
                    self.name
                )));
            }
        }
    }

    fn delete(&self, name: &str) -> Result<(), VaultError> {
        let r = self.call(VaultOp::Delete, name, &[])?;
        self.ok(r)
    }

    fn flush(&self) -> Result<(), VaultError> {
        let r = self.call(VaultOp::Flush, "", &[])?;
        self.ok(r)
    }

    fn apply(&self, actions: &[u8]) -> Result<Option<Vec<u8>>, VaultError> {
        let r = self.call(VaultOp::Apply, "", actions)?;
        match self.data(r)? {
            Some(roots) => Ok(Some(roots)),
            None => Err(VaultError::Backend(format!(
                "{}: an apply answered nothing",
                self.name
            ))),
        }
    }

    fn describe(&self) -> String {
        self.name.clone()
    }
}
