//! The directory service (Bullet's companion): names bound to capabilities, in directories
//! that are themselves objects. A directory's every version is an immutable object (its
//! listing, format "Directory listing v1" in `docs/formats.md`); a change makes a new version
//! and is committed only if it was made against the current one (compare-and-swap). Old
//! versions stay listable.

use std::collections::BTreeMap;

use ferry_format::varint;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use crate::caps::{Capability, Rights};
use crate::inode::Kind;
use crate::store::{dberr, ObjectStore};
use crate::ObjectsError;

/// (directory number, version) → the number of the object holding that version's listing.
pub(crate) const VERSIONS: TableDefinition<(u64, u64), u64> = TableDefinition::new("dir versions");

const MAGIC: &[u8; 4] = b"FDIR";
const VERSION: u8 = 1;
/// Bytes of a name at most.
pub const MAX_NAME: usize = 255;
/// Bytes of an entry's value at most (a ticket: a capability and its hints).
pub const MAX_VALUE: usize = 32 << 10;
/// Entries of one directory at most.
pub const MAX_ENTRIES: usize = 1 << 20;

/// What a name is bound to: opaque bytes to the store (the daemon keeps tickets there), and
/// whether they name a directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    pub value: Vec<u8>,
}

/// One version of a directory.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Listing {
    pub version: u64,
    pub entries: BTreeMap<String, Entry>,
}

/// A change to make: bind `name` to an entry, or unbind it (`None`).
pub type Change = (String, Option<Entry>);

/// One version in a directory's history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    pub version: u64,
    pub entries: u64,
    pub bytes: u64,
}

/// Whether `name` can name an entry: not empty, not `.` or `..`, no `/` or NUL, at most
/// [`MAX_NAME`] bytes.
pub fn check_name(name: &str) -> Result<(), ObjectsError> {
    let bad = |why: &str| Err(ObjectsError::BadInput(format!("the name {name:?} {why}")));
    if name.is_empty() || name == "." || name == ".." {
        return bad("is not a name");
    }
    if name.contains('/') || name.contains('\0') {
        return bad("holds / or NUL");
    }
    if name.len() > MAX_NAME {
        return bad(&format!("is longer than {MAX_NAME} bytes"));
    }
    Ok(())
}

impl Listing {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC);
        b.push(VERSION);
        varint::put(&mut b, self.version);
        varint::put(&mut b, self.entries.len() as u64);
        for (name, e) in &self.entries {
            varint::put(&mut b, name.len() as u64);
            b.extend_from_slice(name.as_bytes());
            b.push(e.kind as u8);
            varint::put(&mut b, e.value.len() as u64);
            b.extend_from_slice(&e.value);
        }
        b
    }

    pub fn decode(mut b: &[u8]) -> Result<Listing, ObjectsError> {
        let bad = |why: String| ObjectsError::Corrupt(format!("a directory listing: {why}"));
        if b.len() < 5 || &b[..4] != MAGIC || b[4] != VERSION {
            return Err(bad("no FDIR v1 header".into()));
        }
        b = &b[5..];
        let num = |b: &mut &[u8], what| varint::get(b, what).map_err(|e| bad(e.to_string()));
        let take = |b: &mut &[u8], n: u64| -> Result<Vec<u8>, ObjectsError> {
            if (b.len() as u64) < n {
                return Err(bad("cut short".into()));
            }
            let (h, t) = b.split_at(n as usize);
            *b = t;
            Ok(h.to_vec())
        };
        let version = num(&mut b, "version")?;
        let n = num(&mut b, "entries")?;
        if n > MAX_ENTRIES as u64 {
            return Err(bad(format!("{n} entries")));
        }
        let mut entries = BTreeMap::new();
        for _ in 0..n {
            let len = num(&mut b, "name")?;
            if len > MAX_NAME as u64 {
                return Err(bad(format!("a name of {len} bytes")));
            }
            let name = String::from_utf8(take(&mut b, len)?)
                .map_err(|_| bad("a name is not UTF-8".into()))?;
            check_name(&name).map_err(|e| bad(e.to_string()))?;
            let kind = match take(&mut b, 1)?[0] {
                0 => Kind::Blob,
                1 => Kind::Directory,
                k => return Err(bad(format!("an entry of kind {k}"))),
            };
            let len = num(&mut b, "value")?;
            if len > MAX_VALUE as u64 {
                return Err(bad(format!("a value of {len} bytes")));
            }
            let value = take(&mut b, len)?;
            // Sorted and each name once: one listing has one encoding.
            if entries
                .last_key_value()
                .is_some_and(|(last, _)| *last >= name)
            {
                return Err(bad("names out of order, or one twice".into()));
            }
            entries.insert(name, Entry { kind, value });
        }
        if !b.is_empty() {
            return Err(bad(format!("{} bytes after its end", b.len())));
        }
        Ok(Listing { version, entries })
    }
}

impl ObjectStore {
    /// Makes an empty directory (version 0, no listing object) and returns its owner's
    /// capability.
    pub fn mkdir(&self) -> Result<Capability, ObjectsError> {
        Ok(self.create_kind(&b""[..], 0, 1, Kind::Directory)?.cap)
    }

    /// The directory `cap` names, checked for `need`.
    fn directory(&self, cap: &Capability, need: Rights) -> Result<u64, ObjectsError> {
        let (number, inode) = self.check(cap, need)?;
        match inode.kind {
            Kind::Directory => Ok(number),
            Kind::Blob => Err(ObjectsError::BadInput("not a directory".into())),
        }
    }

    /// The current version's number and its listing object, if any version was made.
    fn current(&self, dir: u64) -> Result<Option<(u64, u64)>, ObjectsError> {
        let tx = self.db.begin_read().map_err(dberr)?;
        let t = tx.open_table(VERSIONS).map_err(dberr)?;
        let last = t
            .range((dir, 0)..=(dir, u64::MAX))
            .map_err(dberr)?
            .next_back();
        match last {
            Some(row) => {
                let (k, v) = row.map_err(dberr)?;
                Ok(Some((k.value().1, v.value())))
            }
            None => Ok(None),
        }
    }

    fn load(&self, version: u64, object: u64) -> Result<Listing, ObjectsError> {
        let cap = self
            .owner(object)
            .ok_or_else(|| ObjectsError::Corrupt(format!("version {version}'s listing is gone")))?;
        let mut b = vec![];
        self.read(&cap, 0, u64::MAX, &mut b)?;
        let l = Listing::decode(&b)?;
        if l.version != version {
            return Err(ObjectsError::Corrupt(format!(
                "version {version}'s listing says it is version {}",
                l.version
            )));
        }
        Ok(l)
    }

    /// A version of the directory (`None`: the current one). Needs the read right.
    pub fn list(&self, cap: &Capability, version: Option<u64>) -> Result<Listing, ObjectsError> {
        let dir = self.directory(cap, Rights::READ)?;
        let found = match version {
            None => self.current(dir)?,
            Some(0) => None,
            Some(v) => {
                let tx = self.db.begin_read().map_err(dberr)?;
                let t = tx.open_table(VERSIONS).map_err(dberr)?;
                let object = t.get((dir, v)).map_err(dberr)?.map(|x| x.value());
                match object {
                    Some(o) => Some((v, o)),
                    None => {
                        return Err(ObjectsError::BadInput(format!(
                            "the directory has no version {v}"
                        )))
                    }
                }
            }
        };
        match found {
            Some((v, object)) => self.load(v, object),
            None => Ok(Listing::default()),
        }
    }

    /// Applies `changes` to version `base` of the directory, making version `base + 1`,
    /// committed only if `base` is still the current version ([`ObjectsError::Conflict`]
    /// otherwise). Needs the modify right. Returns the new version.
    pub fn update(
        &self,
        cap: &Capability,
        base: u64,
        changes: &[Change],
    ) -> Result<u64, ObjectsError> {
        let dir = self.directory(cap, Rights::MODIFY | Rights::READ)?;
        let mut listing = self.list(cap, None)?;
        if listing.version != base {
            return Err(conflict(listing.version, base));
        }
        for (name, entry) in changes {
            check_name(name)?;
            match entry {
                Some(e) if e.value.len() > MAX_VALUE => {
                    return Err(ObjectsError::BadInput(format!(
                        "a value of {} bytes (at most {MAX_VALUE})",
                        e.value.len()
                    )))
                }
                Some(e) => {
                    listing.entries.insert(name.clone(), e.clone());
                }
                None => {
                    listing.entries.remove(name);
                }
            }
        }
        if listing.entries.len() > MAX_ENTRIES {
            return Err(ObjectsError::BadInput(format!(
                "more than {MAX_ENTRIES} entries"
            )));
        }
        listing.version = base + 1;
        let bytes = listing.encode();
        let made = self.create_kind(&bytes[..], bytes.len() as u64, 1, Kind::Blob)?;
        // The compare-and-swap: redb's write transactions are one at a time.
        let tx = self.db.begin_write().map_err(dberr)?;
        let committed = {
            let mut t = tx.open_table(VERSIONS).map_err(dberr)?;
            let now = t
                .range((dir, 0)..=(dir, u64::MAX))
                .map_err(dberr)?
                .next_back()
                .transpose()
                .map_err(dberr)?
                .map_or(0, |(k, _)| k.value().1);
            if now == base {
                t.insert((dir, base + 1), made.cap.number).map_err(dberr)?;
                Ok(())
            } else {
                Err(conflict(now, base))
            }
        };
        match committed {
            Ok(()) => {
                tx.commit().map_err(dberr)?;
                Ok(base + 1)
            }
            Err(e) => {
                drop(tx);
                self.delete(&made.cap)?;
                Err(e)
            }
        }
    }

    /// Every version of the directory, oldest first. Needs the read right.
    pub fn history(&self, cap: &Capability) -> Result<Vec<Version>, ObjectsError> {
        let dir = self.directory(cap, Rights::READ)?;
        let rows: Vec<(u64, u64)> = {
            let tx = self.db.begin_read().map_err(dberr)?;
            let t = tx.open_table(VERSIONS).map_err(dberr)?;
            t.range((dir, 0)..=(dir, u64::MAX))
                .map_err(dberr)?
                .map(|r| r.map(|(k, v)| (k.value().1, v.value())))
                .collect::<Result<_, _>>()
                .map_err(dberr)?
        };
        let mut out = vec![Version {
            version: 0,
            entries: 0,
            bytes: 0,
        }];
        for (version, object) in rows {
            let l = self.load(version, object)?;
            out.push(Version {
                version,
                entries: l.entries.len() as u64,
                bytes: l.entries.values().map(|e| e.value.len() as u64).sum(),
            });
        }
        Ok(out)
    }

    /// Removes directory `number` and every version of it (`delete` of a directory's
    /// capability). What its entries name is not touched.
    pub(crate) fn remove_dir(&self, dir: u64) -> Result<(), ObjectsError> {
        let tx = self.db.begin_write().map_err(dberr)?;
        let objects: Vec<u64> = {
            let mut t = tx.open_table(VERSIONS).map_err(dberr)?;
            let rows: Vec<(u64, u64)> = t
                .range((dir, 0)..=(dir, u64::MAX))
                .map_err(dberr)?
                .map(|r| r.map(|(k, v)| (k.value().1, v.value())))
                .collect::<Result<_, _>>()
                .map_err(dberr)?;
            for (v, _) in &rows {
                t.remove((dir, *v)).map_err(dberr)?;
            }
            rows.into_iter().map(|(_, o)| o).collect()
        };
        tx.commit().map_err(dberr)?;
        self.remove(dir)?;
        for o in objects {
            self.remove(o)?;
        }
        Ok(())
    }
}

fn conflict(now: u64, base: u64) -> ObjectsError {
    ObjectsError::Conflict(format!(
        "the directory is at version {now}, not {base}: made against an old version, the change is not committed"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_encoding_is_pinned() {
        let mut l = Listing {
            version: 3,
            ..Listing::default()
        };
        l.entries.insert(
            "b".into(),
            Entry {
                kind: Kind::Directory,
                value: vec![9, 9],
            },
        );
        l.entries.insert(
            "a".into(),
            Entry {
                kind: Kind::Blob,
                value: vec![7],
            },
        );
        let b = l.encode();
        assert_eq!(
            hex::encode(&b),
            "4644495201030201610001070162010209 09".replace(' ', "")
        );
        assert_eq!(Listing::decode(&b).unwrap(), l);
        for n in 0..b.len() {
            assert!(Listing::decode(&b[..n]).is_err(), "cut at {n}");
        }
        // A name twice, names out of order (found by fuzzing: it decoded and re-encoded
        // sorted), a bad name.
        let mut twice = b.clone();
        twice[8] = b'b';
        let e = Listing::decode(&twice).unwrap_err().to_string();
        assert!(e.contains("out of order, or one twice"), "{e}");
        let mut swapped = b.clone();
        (swapped[8], swapped[13]) = (b'b', b'a');
        let e = Listing::decode(&swapped).unwrap_err().to_string();
        assert!(e.contains("out of order, or one twice"), "{e}");
        let mut slash = b.clone();
        slash[8] = b'/';
        assert!(Listing::decode(&slash).is_err());
    }
}
