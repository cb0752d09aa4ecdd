//! An object's row in the inode table (`docs/formats.md`, "Object inode v1"): where its bytes
//! lie, its size, its random value, its OID, its kind and the durability its create met.

use ferry_format::{Id, Oid};

use crate::caps::RANDOM_BYTES;
use crate::space::Extent;

/// What an object is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Bytes.
    Blob = 0,
    /// A directory of the directory service (its bytes: the current version's listing).
    Directory = 1,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    pub kind: Kind,
    pub extent: Extent,
    pub random: [u8; RANDOM_BYTES],
    pub oid: Oid,
    pub durability: u8,
}

const VERSION: u8 = 1;
/// Bytes of an encoded inode.
pub const INODE_BYTES: usize = 1 + 1 + 4 + 8 + 8 + RANDOM_BYTES + 33 + 1;

impl Inode {
    pub fn size(&self) -> u64 {
        self.extent.len
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(INODE_BYTES);
        b.push(VERSION);
        b.push(self.kind as u8);
        b.extend_from_slice(&self.extent.file.to_le_bytes());
        b.extend_from_slice(&self.extent.offset.to_le_bytes());
        b.extend_from_slice(&self.extent.len.to_le_bytes());
        b.extend_from_slice(&self.random);
        b.extend_from_slice(&self.oid.0.to_bytes());
        b.push(self.durability);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Inode, String> {
        if b.len() != INODE_BYTES || b[0] != VERSION {
            return Err(format!(
                "an inode of {} bytes, version {:?}",
                b.len(),
                b.first()
            ));
        }
        let kind = match b[1] {
            0 => Kind::Blob,
            1 => Kind::Directory,
            k => return Err(format!("an inode of kind {k}")),
        };
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
        Ok(Inode {
            kind,
            extent: Extent {
                file: u32::from_le_bytes(b[2..6].try_into().expect("4")),
                offset: u64_at(6),
                len: u64_at(14),
            },
            random: b[22..38].try_into().expect("16"),
            oid: Oid(Id::from_bytes(&b[38..71]).map_err(|e| e.to_string())?),
            durability: b[71],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_format::HashAlg;

    #[test]
    fn encoding_is_pinned() {
        let i = Inode {
            kind: Kind::Directory,
            extent: Extent {
                file: 2,
                offset: 0x1000,
                len: 300,
            },
            random: [0xab; 16],
            oid: Oid(Id::from_parts(HashAlg::Blake3, [0xcd; 32])),
            durability: 1,
        };
        let b = i.encode();
        let want = format!(
            "01 01 02000000 0010000000000000 2c01000000000000 {} 01{} 01",
            "ab".repeat(16),
            "cd".repeat(32)
        )
        .replace(' ', "");
        assert_eq!(hex::encode(&b), want);
        assert_eq!(Inode::decode(&b).unwrap(), i);
        for n in 0..b.len() {
            assert!(Inode::decode(&b[..n]).is_err());
        }
    }
}
