//! The vault's records, byte for byte (docs/formats.md, "Vault records v1"). Integers are
//! little-endian; names are UTF-8 with a u16 length.
//!
//! - **Config** (`config`, the one plaintext record): magic `FVCF`, version 1, the vault's
//!   random id (16), the keyed chunker's minimum, average and maximum block sizes (u32 each),
//!   the tree's entries per node (u16). 35 bytes.
//! - **Commit** (sealed as `heads/N`): magic `FVCM`, version 1, seq (u64), the BLAKE3 of the
//!   previous head's sealed bytes (32; zeros for the first), time (i64 ns since the epoch), the
//!   catalog's size (u64) and tree root (32), the number of changes (u32), then per change: op
//!   (u8: 1 put, 2 remove), name, size (u64), root (32).
//! - **Catalog** (a file of the vault itself, so it too is updated by small diffs): magic
//!   `FVCT`, version 1, the number of entries (u32), then per entry, sorted by name: name, kind
//!   (u8: 0 file, 1 symlink, whose content is its target), mode (u32), mtime (i64 ns), size
//!   (u64), root (32; zeros when the size is 0).

use crate::tree::{Child, NodeId};
use crate::VaultError;

const VERSION: u8 = 1;
pub const CONFIG_BYTES: usize = 35;
/// Longest name (bytes): Linux's PATH_MAX.
pub const MAX_NAME: usize = 4096;

fn damaged(what: &str, why: impl Into<String>) -> VaultError {
    VaultError::Damaged {
        id: what.to_string(),
        why: why.into(),
    }
}

/// A cursor over a record that refuses to read past its end.
pub(crate) struct Reader<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) what: &'static str,
}

impl<'a> Reader<'a> {
    /// A count of items of at least `each` bytes, checked against what is left (so a hostile
    /// count allocates nothing).
    pub(crate) fn count(&mut self, each: usize) -> Result<usize, VaultError> {
        let n = self.u32()? as usize;
        if n > self.buf.len() / each {
            return Err(damaged(self.what, "a count beyond its bytes"));
        }
        Ok(n)
    }
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], VaultError> {
        if self.buf.len() < n {
            return Err(damaged(self.what, "it ends early"));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }
    pub(crate) fn arr<const N: usize>(&mut self) -> Result<[u8; N], VaultError> {
        Ok(self.take(N)?.try_into().expect("length"))
    }
    pub(crate) fn u8(&mut self) -> Result<u8, VaultError> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, VaultError> {
        Ok(u16::from_le_bytes(self.arr()?))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, VaultError> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, VaultError> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    pub(crate) fn i64(&mut self) -> Result<i64, VaultError> {
        Ok(i64::from_le_bytes(self.arr()?))
    }
    pub(crate) fn header(&mut self, magic: &[u8; 4]) -> Result<(), VaultError> {
        if self.take(4)? != magic {
            return Err(damaged(self.what, "wrong magic"));
        }
        match self.u8()? {
            VERSION => Ok(()),
            v => Err(damaged(self.what, format!("unknown version {v}"))),
        }
    }
    pub(crate) fn name(&mut self) -> Result<String, VaultError> {
        let n = self.u16()? as usize;
        let s = std::str::from_utf8(self.take(n)?)
            .map_err(|_| damaged(self.what, "a name that is not UTF-8"))?;
        check_name(s).map_err(|why| damaged(self.what, why))?;
        Ok(s.to_string())
    }
    pub(crate) fn end(&self) -> Result<(), VaultError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(damaged(self.what, "bytes after its end"))
        }
    }
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(name.as_bytes());
}

/// Whether `name` can name a file in a vault: relative, `/`-separated, no empty, `.` or `..`
/// part, no NUL, at most [`MAX_NAME`] bytes.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!("a name must be 1 to {MAX_NAME} bytes"));
    }
    if name
        .split('/')
        .any(|p| p.is_empty() || p == "." || p == ".." || p.contains('\0'))
    {
        return Err(format!(
            "{name:?}: a name may not have an empty, `.` or `..` part"
        ));
    }
    Ok(())
}

/// The one plaintext record: what the vault is and how it cuts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub id: [u8; 16],
    pub min: u32,
    pub avg: u32,
    pub max: u32,
    pub fanout: u16,
}

impl Config {
    /// A new vault's: blocks of 2–64 KiB around 8 KiB, 32 entries per node.
    pub fn new() -> Config {
        Config {
            id: rand::random(),
            min: 2 << 10,
            avg: 8 << 10,
            max: 64 << 10,
            fanout: 32,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(CONFIG_BYTES);
        out.extend_from_slice(b"FVCF");
        out.push(VERSION);
        out.extend_from_slice(&self.id);
        for v in [self.min, self.avg, self.max] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.fanout.to_le_bytes());
        out
    }

    pub fn decode(b: &[u8]) -> Result<Config, VaultError> {
        let mut r = Reader {
            buf: b,
            what: "config",
        };
        r.header(b"FVCF")?;
        let c = Config {
            id: r.arr()?,
            min: r.u32()?,
            avg: r.u32()?,
            max: r.u32()?,
            fanout: r.u16()?,
        };
        r.end()?;
        let sizes_ok = 64 <= c.min && c.min <= c.avg && c.avg <= c.max && c.max <= 4 << 20;
        if !sizes_ok || !(4..=crate::tree::MAX_ENTRIES as u16).contains(&c.fanout) {
            return Err(damaged("config", "parameters out of range"));
        }
        Ok(c)
    }

    /// The vault's id in hex (for the client's own files about it).
    pub fn id_hex(&self) -> String {
        self.id.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::new()
    }
}

pub(crate) fn put_root(out: &mut Vec<u8>, size: u64, root: Option<NodeId>) {
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&root.unwrap_or([0; 32]));
}

pub(crate) fn get_root(r: &mut Reader<'_>) -> Result<(u64, Option<NodeId>), VaultError> {
    let size = r.u64()?;
    let root: NodeId = r.arr()?;
    match (size, root == [0; 32]) {
        (0, true) => Ok((0, None)),
        (s, false) if s > 0 => Ok((s, Some(root))),
        _ => Err(damaged(r.what, "a size that disagrees with its root")),
    }
}

/// A tree root as the tree module takes it.
pub fn child(size: u64, root: Option<NodeId>) -> Option<Child> {
    root.map(|node| Child { bytes: size, node })
}

/// What a commit did to one name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub removed: bool,
    pub name: String,
    pub size: u64,
    pub root: Option<NodeId>,
}

/// One version of the vault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commit {
    pub seq: u64,
    pub parent: [u8; 32],
    pub time_ns: i64,
    pub catalog_size: u64,
    pub catalog_root: Option<NodeId>,
    pub changes: Vec<Change>,
}

impl Commit {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"FVCM");
        out.push(VERSION);
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.parent);
        out.extend_from_slice(&self.time_ns.to_le_bytes());
        put_root(&mut out, self.catalog_size, self.catalog_root);
        out.extend_from_slice(&(self.changes.len() as u32).to_le_bytes());
        for c in &self.changes {
            out.push(if c.removed { 2 } else { 1 });
            put_name(&mut out, &c.name);
            put_root(&mut out, c.size, c.root);
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<Commit, VaultError> {
        let mut r = Reader {
            buf: b,
            what: "commit",
        };
        r.header(b"FVCM")?;
        let seq = r.u64()?;
        let parent = r.arr()?;
        let time_ns = r.i64()?;
        let (catalog_size, catalog_root) = get_root(&mut r)?;
        let n = r.u32()? as usize;
        let mut changes = Vec::with_capacity(n.min(r.buf.len() / 43));
        for _ in 0..n {
            let removed = match r.u8()? {
                1 => false,
                2 => true,
                k => return Err(damaged("commit", format!("unknown change {k}"))),
            };
            let name = r.name()?;
            let (size, root) = get_root(&mut r)?;
            changes.push(Change {
                removed,
                name,
                size,
                root,
            });
        }
        r.end()?;
        Ok(Commit {
            seq,
            parent,
            time_ns,
            catalog_size,
            catalog_root,
            changes,
        })
    }
}

/// What a name holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    /// Its content is the link's target.
    Symlink,
}

/// One file of a version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub kind: Kind,
    pub mode: u32,
    pub mtime_ns: i64,
    pub size: u64,
    pub root: Option<NodeId>,
}

/// Every file of a version, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Catalog {
    pub entries: std::collections::BTreeMap<String, Entry>,
}

impl Catalog {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"FVCT");
        out.push(VERSION);
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for e in self.entries.values() {
            put_name(&mut out, &e.name);
            out.push(match e.kind {
                Kind::File => 0,
                Kind::Symlink => 1,
            });
            out.extend_from_slice(&e.mode.to_le_bytes());
            out.extend_from_slice(&e.mtime_ns.to_le_bytes());
            put_root(&mut out, e.size, e.root);
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<Catalog, VaultError> {
        let mut r = Reader {
            buf: b,
            what: "catalog",
        };
        r.header(b"FVCT")?;
        let n = r.u32()?;
        let mut entries = std::collections::BTreeMap::new();
        let mut last: Option<String> = None;
        for _ in 0..n {
            let name = r.name()?;
            if last.as_ref().is_some_and(|l| *l >= name) {
                return Err(damaged("catalog", "names out of order"));
            }
            let kind = match r.u8()? {
                0 => Kind::File,
                1 => Kind::Symlink,
                k => return Err(damaged("catalog", format!("unknown kind {k}"))),
            };
            let mode = r.u32()?;
            let mtime_ns = r.i64()?;
            let (size, root) = get_root(&mut r)?;
            last = Some(name.clone());
            entries.insert(
                name.clone(),
                Entry {
                    name,
                    kind,
                    mode,
                    mtime_ns,
                    size,
                    root,
                },
            );
        }
        r.end()?;
        Ok(Catalog { entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn config_golden_bytes() {
        let c = Config {
            id: [0x11; 16],
            min: 2048,
            avg: 8192,
            max: 65536,
            fanout: 32,
        };
        let want = format!(
            "4656434601{}{}{}{}{}",
            "11".repeat(16),
            "00080000",
            "00200000",
            "00000100",
            "2000"
        );
        assert_eq!(hex(&c.encode()), want);
        assert_eq!(c.encode().len(), CONFIG_BYTES);
        assert_eq!(Config::decode(&c.encode()).unwrap(), c);
        // Sizes out of order, a fan-out too small: refused.
        for bad in [
            Config {
                min: 9000,
                ..c.clone()
            },
            Config {
                fanout: 3,
                ..c.clone()
            },
            Config {
                max: 8 << 20,
                ..c.clone()
            },
        ] {
            assert!(Config::decode(&bad.encode()).is_err());
        }
    }

    #[test]
    fn commit_and_catalog_golden_bytes() {
        let c = Commit {
            seq: 2,
            parent: [0xaa; 32],
            time_ns: 1,
            catalog_size: 5,
            catalog_root: Some([0xbb; 32]),
            changes: vec![Change {
                removed: true,
                name: "a/b".into(),
                size: 0,
                root: None,
            }],
        };
        let want = format!(
            "46564 34d01 0200000000000000 {} 0100000000000000 0500000000000000 {} 01000000 02 0300 612f62 0000000000000000 {}",
            "aa".repeat(32),
            "bb".repeat(32),
            "00".repeat(32)
        )
        .replace(' ', "");
        assert_eq!(hex(&c.encode()), want);
        assert_eq!(Commit::decode(&c.encode()).unwrap(), c);

        let mut cat = Catalog::default();
        cat.entries.insert(
            "x".into(),
            Entry {
                name: "x".into(),
                kind: Kind::Symlink,
                mode: 0o777,
                mtime_ns: -1,
                size: 3,
                root: Some([0xcc; 32]),
            },
        );
        let want = format!(
            "4656435401 01000000 0100 78 01 ff010000 ffffffffffffffff 0300000000000000 {}",
            "cc".repeat(32)
        )
        .replace(' ', "");
        assert_eq!(hex(&cat.encode()), want);
        assert_eq!(Catalog::decode(&cat.encode()).unwrap(), cat);
    }

    #[test]
    fn hostile_records_are_refused() {
        let c = Commit {
            seq: 1,
            parent: [0; 32],
            time_ns: 0,
            catalog_size: 0,
            catalog_root: None,
            changes: vec![],
        };
        let good = c.encode();
        for cut in 0..good.len() {
            assert!(Commit::decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = good.clone();
        extra.push(0);
        assert!(Commit::decode(&extra).is_err());
        // A size without a root, a name with `..`, names out of order.
        let mut bad = good.clone();
        bad[53] = 1;
        assert!(Commit::decode(&bad).is_err());
        let mut cat = b"FVCT\x01\x02\x00\x00\x00".to_vec();
        for n in ["b", "a"] {
            cat.extend_from_slice(&[1, 0]);
            cat.extend_from_slice(n.as_bytes());
            cat.push(0);
            cat.extend_from_slice(&[0; 4 + 8 + 8 + 32]);
        }
        assert!(Catalog::decode(&cat).is_err());
        assert!(check_name("a/../b").is_err() && check_name("/a").is_err());
        // A count far beyond the bytes does not allocate for it.
        let mut huge = b"FVCM\x01".to_vec();
        huge.extend_from_slice(&[0; 8 + 32 + 8 + 8 + 32]);
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Commit::decode(&huge).is_err());
    }
}
