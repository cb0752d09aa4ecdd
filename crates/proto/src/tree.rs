//! Tree digests: a Merkle hash over a directory's entries and, recursively, the subtrees below
//! it, so two sides can agree that a whole subtree is unchanged in one exchange.
//!
//! The server gives every directory it reports (in `Attr` and in listings) its tree digest in
//! the `oid` field, as a BLAKE3 id. A
//! client that computes the same digest over its own copy skips every subtree whose digest,
//! mode and modification time match: an unchanged tree costs one `GetAttr`.
//!
//! The digest covers what a mirror preserves (rsync's quick check, applied to every entry):
//!
//! ```text
//! BLAKE3( "ferry-tree-v1\0" ·
//!         for each entry, in increasing byte order of names:
//!           varint(len name) · name · kind u8 ·
//!           file:    mode u32 le · size u64 le · mtime_ns i64 le
//!           symlink: varint(len target) · target
//!           dir:     mode u32 le · mtime_ns i64 le · tree digest of the directory (32 bytes) )
//! ```
//!
//! A directory's own mode and time are in its parent's record, not in its own digest.
//!
//! An entry's key (ReadDir with keys) is the first 3 bytes, little endian, of
//! `BLAKE3("ferry-entry-v1\0" · the entry's record as above)`: a client names the entries it
//! holds by these keys and the server sends only the entries whose keys it did not name. Keys
//! may collide; the client checks what it rebuilt against the directory's tree digest.
//!
//! An entry's *hash* names it with its place in a tree: the first 8 bytes, little endian, of
//! `BLAKE3("ferry-tree-entry-v1\0" · varint(len dir) · dir · the entry's record)`, where `dir`
//! is the path of its directory relative to the tree's root (`a/b`; empty for the root). (Not
//! by record alone: unpacked archives give many files in many directories one name, size and
//! time.) A client names every directory of its tree at once (ReadTree) in a [`KnownEntries`]
//! filter of their hashes:
//!
//! ```text
//! hashes u8 (k, 1–16) · bits: ⌈m/8⌉ bytes (m = 8 × their count; bit j is bit j mod 8 of
//! byte j / 8)
//! an entry of hash h is in the filter when, with a = h mod 2^32 and b = (h >> 32) | 1,
//! bit (a + i·b) mod m is set for every i in 0..k (computed without overflow, in 64 bits)
//! ```
//!
//! A Bloom filter: an entry the client holds is always found; one it does not hold is found by
//! mistake with a probability of about 1 in 2,000 at 16 bits an entry and k = 11
//! ([`KnownEntries::for_entries`]). A mistake costs round trips, never a wrong result: the
//! server leaves out a directory that differs, and the client, seeing its digest differ in its
//! parent's listing, asks for it then.

use crate::FileKind;

const DOMAIN: &[u8] = b"ferry-tree-v1\0";

/// What the digest records of one entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TreeItem {
    File {
        mode: u32,
        size: u64,
        mtime_ns: i64,
    },
    Symlink {
        target: Vec<u8>,
    },
    Dir {
        mode: u32,
        mtime_ns: i64,
        digest: [u8; 32],
    },
}

impl TreeItem {
    pub fn kind(&self) -> FileKind {
        match self {
            TreeItem::File { .. } => FileKind::File,
            TreeItem::Symlink { .. } => FileKind::Symlink,
            TreeItem::Dir { .. } => FileKind::Dir,
        }
    }
}

/// The tree digest of a directory holding `entries` (in any order; names are unique).
pub fn tree_digest(entries: &mut [(Vec<u8>, TreeItem)]) -> [u8; 32] {
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let mut h = blake3::Hasher::new();
    h.update(DOMAIN);
    let mut buf = Vec::with_capacity(64);
    for (name, item) in entries.iter() {
        record(&mut buf, name, item);
        h.update(&buf);
    }
    *h.finalize().as_bytes()
}

/// An entry's 24-bit key (module docs).
pub fn entry_key(name: &[u8], item: &TreeItem) -> u32 {
    let mut buf = Vec::with_capacity(64);
    record(&mut buf, name, item);
    let h = blake3::Hasher::new()
        .update(b"ferry-entry-v1\0")
        .update(&buf)
        .finalize();
    let b = h.as_bytes();
    u32::from_le_bytes([b[0], b[1], b[2], 0])
}

/// The 64-bit hash of an entry of the directory `dir` (a path relative to the tree's root,
/// empty for the root itself), as a ReadTree's filter names it (module docs).
pub fn entry_hash(dir: &[u8], name: &[u8], item: &TreeItem) -> u64 {
    let mut buf = Vec::with_capacity(64);
    varint(&mut buf, dir.len() as u64);
    buf.extend_from_slice(dir);
    let mut rec = Vec::with_capacity(64);
    record(&mut rec, name, item);
    buf.extend_from_slice(&rec);
    let h = blake3::Hasher::new()
        .update(b"ferry-tree-entry-v1\0")
        .update(&buf)
        .finalize();
    u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// A Bloom filter of entry hashes (module docs): the entries a client holds, named at once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KnownEntries {
    /// Bit positions an entry sets (k); 0 with no bits: nothing known.
    pub hashes: u8,
    pub bits: Vec<u8>,
}

/// Most positions an entry sets.
pub const MAX_FILTER_HASHES: u8 = 16;

impl KnownEntries {
    /// An empty filter sized for `n` entries: 16 bits each (at least 64), 11 positions.
    pub fn for_entries(n: usize) -> KnownEntries {
        let bytes = n.saturating_mul(2).max(8);
        KnownEntries {
            hashes: 11,
            bits: vec![0; bytes],
        }
    }

    /// The bits entry `h` sets: the first *k* outputs of SplitMix64 seeded with `h`, each
    /// modulo *m*. (Not *a* + *i*·*b* of one hash's halves: in a small filter two such runs
    /// with one step overlap, and a 12-directory filter took about 1 in 230 directories for
    /// held, not 1 in 2,000.)
    fn positions(&self, h: u64) -> impl Iterator<Item = usize> {
        let m = self.bits.len() as u64 * 8;
        (1..=u64::from(self.hashes))
            .map(move |i| (splitmix64(h.wrapping_add(i.wrapping_mul(GOLDEN))) % m) as usize)
    }

    pub fn insert(&mut self, h: u64) {
        if self.bits.is_empty() {
            return;
        }
        let ps: Vec<usize> = self.positions(h).collect();
        for p in ps {
            self.bits[p / 8] |= 1 << (p % 8);
        }
    }

    /// Whether an entry of hash `h` may be among those inserted (always, if it was).
    pub fn contains(&self, h: u64) -> bool {
        !self.bits.is_empty()
            && self.hashes > 0
            && self
                .positions(h)
                .all(|p| self.bits[p / 8] >> (p % 8) & 1 == 1)
    }
}

/// SplitMix64's increment (2^64 / φ, odd).
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64's output for the state `z` (Steele, Lea and Flood, 2014).
fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One entry's record in a tree digest, in `buf` (cleared first).
fn record(buf: &mut Vec<u8>, name: &[u8], item: &TreeItem) {
    {
        buf.clear();
        varint(buf, name.len() as u64);
        buf.extend_from_slice(name);
        buf.push(item.kind() as u8);
        match item {
            TreeItem::File {
                mode,
                size,
                mtime_ns,
            } => {
                buf.extend_from_slice(&(mode & 0o7777).to_le_bytes());
                buf.extend_from_slice(&size.to_le_bytes());
                buf.extend_from_slice(&mtime_ns.to_le_bytes());
            }
            TreeItem::Symlink { target } => {
                varint(buf, target.len() as u64);
                buf.extend_from_slice(target);
            }
            TreeItem::Dir {
                mode,
                mtime_ns,
                digest,
            } => {
                buf.extend_from_slice(&(mode & 0o7777).to_le_bytes());
                buf.extend_from_slice(&mtime_ns.to_le_bytes());
                buf.extend_from_slice(digest);
            }
        }
    }
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_pinned_and_order_free() {
        let mut a = vec![
            (
                b"b".to_vec(),
                TreeItem::Symlink {
                    target: b"../x".to_vec(),
                },
            ),
            (
                b"a".to_vec(),
                TreeItem::File {
                    mode: 0o644,
                    size: 3,
                    mtime_ns: 1,
                },
            ),
            (
                b"c".to_vec(),
                TreeItem::Dir {
                    mode: 0o755,
                    mtime_ns: -1,
                    digest: [9; 32],
                },
            ),
        ];
        let d = tree_digest(&mut a.clone());
        a.reverse();
        assert_eq!(tree_digest(&mut a), d);
        // Recomputed independently (Python's blake3 over the layout in the module docs).
        assert_eq!(d[..8], [144, 151, 201, 99, 87, 6, 50, 33]);
        // Any change to a recorded field changes it.
        for i in 0..3 {
            let mut b = a.clone();
            match &mut b[i].1 {
                TreeItem::File { mtime_ns, .. } => *mtime_ns += 1,
                TreeItem::Symlink { target } => target.push(b'y'),
                TreeItem::Dir { digest, .. } => digest[0] ^= 1,
            }
            assert_ne!(tree_digest(&mut b), d);
        }
    }

    #[test]
    fn entry_keys_are_pinned() {
        let item = TreeItem::File {
            mode: 0o644,
            size: 3,
            mtime_ns: 1,
        };
        let k = entry_key(b"a", &item);
        assert!(k < 1 << 24);
        // Recomputed independently (Python's blake3 over the layout in the module docs).
        assert_eq!(k, 14_117_546);
        assert_ne!(entry_key(b"b", &item), k);
        // Recomputed independently (Python's blake3 over the layout in the module docs).
        assert_eq!(entry_hash(b"d/e", b"a", &item), HASH_A);
        assert_ne!(entry_hash(b"d", b"a", &item), HASH_A);
        assert_ne!(entry_hash(b"", b"a", &item), HASH_A);
    }

    /// `entry_hash(b"d/e", b"a", File { 0o644, 3, 1 })`.
    const HASH_A: u64 = 0xa6c6_bcf7_e231_4c4e;

    #[test]
    fn the_filter_finds_every_entry_put_in_and_its_bits_are_pinned() {
        let mut f = KnownEntries::for_entries(1);
        assert_eq!((f.hashes, f.bits.len()), (11, 8));
        assert!(!f.contains(HASH_A));
        f.insert(HASH_A);
        assert!(f.contains(HASH_A));
        // The eleven positions of protocol.md's rule: SplitMix64's first outputs from the
        // hash, mod 64 (PINNED_BITS computed apart, in Python).
        assert_eq!(f.bits, PINNED_BITS);
        // About 1 in 2,000 entries never put in is found by mistake, at 16 bits an entry, in
        // a large filter and a small one alike (hashes: any 64 bits unlike each other).
        let hash = |i: u64| splitmix64(i.wrapping_mul(GOLDEN));
        for (n, trials) in [(10_000, 1), (12, 1_000)] {
            let mut wrong = 0;
            for t in 0..trials {
                let mut f = KnownEntries::for_entries(n as usize);
                let first = t * 1_000_000;
                for i in first..first + n {
                    f.insert(hash(i));
                }
                for i in first..first + n {
                    assert!(f.contains(hash(i)));
                }
                let others = first + n..first + n + 100_000 / trials;
                wrong += others.filter(|&i| f.contains(hash(i))).count();
            }
            assert!(
                wrong < 200,
                "{n} entries: {wrong} of 100,000 found by mistake"
            );
        }
        // An empty filter holds nothing.
        assert!(!KnownEntries::default().contains(HASH_A));
    }

    const PINNED_BITS: [u8; 8] = [0, 8, 0, 34, 4, 0, 16, 56];
}
