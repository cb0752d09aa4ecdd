//! Keys and the two trust files: `authorized_keys` (server side) and `known_hosts` (client
//! side). Every key is a self-signed certificate made on first run; it is named by the BLAKE3
//! hash of its DER bytes, written `blake3:` and 64 hex digits.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::NetError;

/// The name of a key: BLAKE3 of its certificate's DER encoding.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    pub fn of(cert: &[u8]) -> Self {
        Fingerprint(*blake3::hash(cert).as_bytes())
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "blake3:{}", hex::encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Fingerprint {
    type Err = NetError;
    fn from_str(s: &str) -> Result<Self, NetError> {
        let bad = || {
            NetError::BadKey(format!(
                "{s:?} is not a key fingerprint (blake3: and 64 hex digits)"
            ))
        };
        let hexpart = s.strip_prefix("blake3:").ok_or_else(bad)?;
        let mut out = [0u8; 32];
        hex::decode_to_slice(hexpart, &mut out).map_err(|_| bad())?;
        Ok(Fingerprint(out))
    }
}

/// Where keys and trust files live: `$XDG_DATA_HOME/ferry`, else `~/.local/share/ferry`.
pub fn data_dir() -> PathBuf {
    std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."))
        .join("ferry")
}

/// This user's key: the private key and its self-signed certificate, used both to run a daemon
/// and to connect to one.
pub struct Identity {
    pub cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
    pub path: PathBuf,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Identity {
            cert: self.cert.clone(),
            key: self.key.clone_key(),
            path: self.path.clone(),
        }
    }
}

impl Identity {
    /// Loads `dir/identity.pem`, making a new Ed25519 key there on first use (readable by the
    /// owner only; two first runs at once end up with the same key).
    pub fn load_or_create(dir: &Path) -> Result<(Identity, bool), NetError> {
        let path = dir.join("identity.pem");
        match fs::read(&path) {
            Ok(pem) => return Ok((Self::parse(&pem, &path)?, false)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(NetError::file("read", &path, e)),
        }
        fs::create_dir_all(dir).map_err(|e| NetError::file("create", dir, e))?;
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519)
            .map_err(|e| NetError::BadKey(format!("cannot make a key: {e}")))?;
        let mut params = rcgen::CertificateParams::new(vec!["ferry".to_string()])
            .map_err(|e| NetError::BadKey(e.to_string()))?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "ferry");
        let cert = params
            .self_signed(&key)
            .map_err(|e| NetError::BadKey(format!("cannot make a certificate: {e}")))?;
        let pem = format!("{}{}", key.serialize_pem(), cert.pem());
        let tmp = dir.join(format!("identity.pem.{}.tmp", std::process::id()));
        let write = || -> io::Result<()> {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(pem.as_bytes())?;
            f.sync_all()?;
            // A hard link never replaces: if another first run won, its key stays.
            let r = fs::hard_link(&tmp, &path);
            fs::remove_file(&tmp)?;
            match r {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
                _ => File::open(dir)?.sync_all(),
            }
        };
        write().map_err(|e| NetError::file("write", &path, e))?;
        let pem = fs::read(&path).map_err(|e| NetError::file("read", &path, e))?;
        Ok((Self::parse(&pem, &path)?, true))
    }

    fn parse(pem: &[u8], path: &Path) -> Result<Identity, NetError> {
        let bad = |what: &str| NetError::BadKey(format!("{}: {what}", path.display()));
        let cert = CertificateDer::from_pem_slice(pem).map_err(|_| bad("no certificate"))?;
        let key = PrivateKeyDer::from_pem_slice(pem).map_err(|_| bad("no private key"))?;
        Ok(Identity {
            cert,
            key,
            path: path.to_path_buf(),
        })
    }

    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of(&self.cert)
    }

    pub(crate) fn key(&self) -> PrivateKeyDer<'static> {
        self.key.clone_key()
    }
}

/// One line of `authorized_keys`: a fingerprint and the name it goes by in logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthorizedKey {
    pub fingerprint: Fingerprint,
    pub name: String,
}

/// Reads `authorized_keys`: one `blake3:HEX [name…]` per line; `#` starts a comment. A missing
/// file authorizes nobody.
pub fn read_authorized(path: &Path) -> Result<Vec<AuthorizedKey>, NetError> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(NetError::file("read", path, e)),
    };
    let mut out = vec![];
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (fp, name) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let fingerprint = fp.parse().map_err(|e: NetError| {
            NetError::BadKey(format!("{}:{}: {e}", path.display(), n + 1))
        })?;
        out.push(AuthorizedKey {
            fingerprint,
            name: name.trim().to_string(),
        });
    }
    Ok(out)
}

/// Appends a line to a trust file (made readable by its owner only), creating it if needed.
pub fn append_line(path: &Path, line: &str) -> Result<(), NetError> {
    if let Some(d) = path.parent() {
        fs::create_dir_all(d).map_err(|e| NetError::file("create", d, e))?;
    }
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| NetError::file("open", path, e))?;
    f.write_all(format!("{line}\n").as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| NetError::file("write", path, e))
}

/// The key recorded for `host_port` in `known_hosts` (`HOST:PORT blake3:HEX` per line; the
/// last line for a host wins).
pub fn known_host(path: &Path, host_port: &str) -> Result<Option<Fingerprint>, NetError> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(NetError::file("read", path, e)),
    };
    let mut found = None;
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut words = line.split_whitespace();
        if let (Some(h), Some(fp)) = (words.next(), words.next()) {
            if h == host_port {
                found = Some(fp.parse().map_err(|e: NetError| {
                    NetError::BadKey(format!("{}:{}: {e}", path.display(), n + 1))
                })?);
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_made_once_and_reloaded() {
        let d = tempfile::tempdir().unwrap();
        let (a, new) = Identity::load_or_create(d.path()).unwrap();
        assert!(new);
        let (b, new) = Identity::load_or_create(d.path()).unwrap();
        assert!(!new);
        assert_eq!(a.fingerprint(), b.fingerprint());
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(d.path().join("identity.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let fp = a.fingerprint();
        assert_eq!(fp.to_string().parse::<Fingerprint>().unwrap(), fp);
    }

    #[test]
    fn trust_files_parse_and_refuse_garbage() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("authorized_keys");
        assert!(read_authorized(&p).unwrap().is_empty());
        let fp = Fingerprint([7; 32]);
        append_line(&p, &format!("# laptops\n{fp} alice laptop")).unwrap();
        let keys = read_authorized(&p).unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].fingerprint, fp);
        assert_eq!(keys[0].name, "alice laptop");
        append_line(&p, "blake3:zz").unwrap();
        let e = read_authorized(&p).unwrap_err().to_string();
        assert!(e.contains(":3:"), "{e}");

        let k = d.path().join("known_hosts");
        assert_eq!(known_host(&k, "h:1").unwrap(), None);
        append_line(&k, &format!("h:1 {fp}")).unwrap();
        append_line(&k, &format!("h:2 {}", Fingerprint([1; 32]))).unwrap();
        assert_eq!(known_host(&k, "h:1").unwrap(), Some(fp));
        assert_eq!(known_host(&k, "h:3").unwrap(), None);
    }
}
