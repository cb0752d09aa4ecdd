//! Algorithm-tagged content ids.

use std::fmt;
use std::str::FromStr;

use sha2::Digest as _;

use crate::FormatError;

/// Digest length of every supported algorithm.
pub const ID_BYTES: usize = 32;
/// Length of the binary tagged form: one algorithm byte, then the digest.
pub const TAGGED_ID_BYTES: usize = 1 + ID_BYTES;

/// A content hash algorithm. The numeric tag is part of every binary format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[non_exhaustive]
pub enum HashAlg {
    /// BLAKE3-256, the default: fast, and parallel within large chunks.
    #[default]
    Blake3,
    /// SHA-256, for interoperating with systems that require it.
    Sha256,
}

impl HashAlg {
    pub fn tag(self) -> u8 {
        match self {
            HashAlg::Blake3 => 1,
            HashAlg::Sha256 => 2,
        }
    }

    pub fn from_tag(tag: u8) -> Result<Self, FormatError> {
        match tag {
            1 => Ok(HashAlg::Blake3),
            2 => Ok(HashAlg::Sha256),
            t => Err(FormatError::UnknownHashAlg(t)),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            HashAlg::Blake3 => "blake3",
            HashAlg::Sha256 => "sha256",
        }
    }
}

impl fmt::Display for HashAlg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for HashAlg {
    type Err = FormatError;
    fn from_str(s: &str) -> Result<Self, FormatError> {
        match s {
            "blake3" => Ok(HashAlg::Blake3),
            "sha256" => Ok(HashAlg::Sha256),
            o => Err(FormatError::UnknownHashName(o.to_string())),
        }
    }
}

/// A content id: the digest of some bytes, tagged with the algorithm that made it.
///
/// Text form `blake3:<64 hex digits>`; binary form one tag byte then 32 digest bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id {
    alg: HashAlg,
    digest: [u8; ID_BYTES],
}

impl Id {
    /// Hashes `data`.
    pub fn hash(alg: HashAlg, data: &[u8]) -> Id {
        let mut h = IdHasher::new(alg);
        h.update(data);
        h.finish()
    }

    /// An id from its parts (for decoders that already know the algorithm).
    pub fn from_parts(alg: HashAlg, digest: [u8; ID_BYTES]) -> Id {
        Id { alg, digest }
    }

    pub fn alg(&self) -> HashAlg {
        self.alg
    }

    pub fn digest(&self) -> &[u8; ID_BYTES] {
        &self.digest
    }

    /// Whether `data` hashes to this id: the check every chunk passes before it is used.
    pub fn matches(&self, data: &[u8]) -> bool {
        Id::hash(self.alg, data) == *self
    }

    /// The binary tagged form.
    pub fn to_bytes(&self) -> [u8; TAGGED_ID_BYTES] {
        let mut b = [0u8; TAGGED_ID_BYTES];
        b[0] = self.alg.tag();
        b[1..].copy_from_slice(&self.digest);
        b
    }

    /// Parses the binary tagged form; `bytes` must be exactly [`TAGGED_ID_BYTES`] long.
    pub fn from_bytes(bytes: &[u8]) -> Result<Id, FormatError> {
        if bytes.len() < TAGGED_ID_BYTES {
            return Err(FormatError::Truncated { what: "id" });
        }
        if bytes.len() > TAGGED_ID_BYTES {
            return Err(FormatError::Trailing {
                what: "id",
                extra: bytes.len() - TAGGED_ID_BYTES,
            });
        }
        let alg = HashAlg::from_tag(bytes[0])?;
        let mut digest = [0u8; ID_BYTES];
        digest.copy_from_slice(&bytes[1..]);
        Ok(Id { alg, digest })
    }

    /// The first 8 hex digits, for humans.
    pub fn short(&self) -> String {
        hex::encode(&self.digest[..4])
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.alg.name(), hex::encode(self.digest))
    }
}

impl fmt::Debug for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.alg.name(), self.short())
    }
}

impl FromStr for Id {
    type Err = FormatError;
    fn from_str(s: &str) -> Result<Self, FormatError> {
        let bad = |why| FormatError::BadIdText {
            text: s.chars().take(80).collect(),
            why,
        };
        let (alg, hexpart) = s
            .split_once(':')
            .ok_or_else(|| bad("missing \"alg:\" prefix"))?;
        let alg = alg.parse::<HashAlg>()?;
        if hexpart.len() != 2 * ID_BYTES {
            return Err(bad("digest must be 64 hex digits"));
        }
        let mut digest = [0u8; ID_BYTES];
        hex::decode_to_slice(hexpart, &mut digest).map_err(|_| bad("digest is not hex"))?;
        Ok(Id { alg, digest })
    }
}

/// An object id: the id of an object's whole content.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct Oid(pub Id);

impl Oid {
    pub fn id(&self) -> Id {
        self.0
    }
}

impl fmt::Display for Oid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for Oid {
    type Err = FormatError;
    fn from_str(s: &str) -> Result<Self, FormatError> {
        s.parse().map(Oid)
    }
}

/// Incremental hashing, for objects that arrive in pieces.
#[derive(Clone)]
pub enum IdHasher {
    Blake3(Box<blake3::Hasher>),
    Sha256(sha2::Sha256),
}

impl IdHasher {
    pub fn new(alg: HashAlg) -> Self {
        match alg {
            HashAlg::Blake3 => IdHasher::Blake3(Box::default()),
            HashAlg::Sha256 => IdHasher::Sha256(sha2::Sha256::new()),
        }
    }

    pub fn update(&mut self, data: &[u8]) {
        match self {
            IdHasher::Blake3(h) => {
                h.update(data);
            }
            IdHasher::Sha256(h) => h.update(data),
        }
    }

    pub fn finish(self) -> Id {
        match self {
            IdHasher::Blake3(h) => Id::from_parts(HashAlg::Blake3, *h.finalize().as_bytes()),
            IdHasher::Sha256(h) => Id::from_parts(HashAlg::Sha256, h.finalize().into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digests() {
        // BLAKE3 and SHA-256 of the empty string, from their specifications.
        assert_eq!(
            Id::hash(HashAlg::Blake3, b"").to_string(),
            "blake3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        assert_eq!(
            Id::hash(HashAlg::Sha256, b"").to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn text_and_binary_round_trip() {
        for alg in [HashAlg::Blake3, HashAlg::Sha256] {
            let id = Id::hash(alg, b"ferry");
            assert_eq!(id.to_string().parse::<Id>().unwrap(), id);
            assert_eq!(Id::from_bytes(&id.to_bytes()).unwrap(), id);
            assert!(id.matches(b"ferry"));
            assert!(!id.matches(b"ferrz"));
        }
        assert!("md5:00".parse::<Id>().is_err());
        assert!("blake3:zz".parse::<Id>().is_err());
        assert!("blake3".parse::<Id>().is_err());
        let mut b = Id::hash(HashAlg::Blake3, b"x").to_bytes();
        b[0] = 9;
        assert_eq!(Id::from_bytes(&b), Err(FormatError::UnknownHashAlg(9)));
        assert!(Id::from_bytes(&b[..5]).is_err());
    }

    #[test]
    fn incremental_equals_one_shot() {
        let data: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
        for alg in [HashAlg::Blake3, HashAlg::Sha256] {
            let mut h = IdHasher::new(alg);
            for piece in data.chunks(77_777) {
                h.update(piece);
            }
            assert_eq!(h.finish(), Id::hash(alg, &data));
        }
    }
}
