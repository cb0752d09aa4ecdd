//! Capabilities (Amoeba's, as the Bullet server used them, made restrictable offline the way
//! macaroons are): the server's id, the object's number, a list of rights masks, and a check
//! field nobody without the server's secret can forge. Format: `docs/formats.md`,
//! "Capability v1".
//!
//! The owner's capability has no mask and every right; its check is a keyed MAC, under the
//! server's secret, of the server id, the object number and the object's own random value.
//! Anyone holding a capability with the `RESTRICT` right can derive a weaker one without the
//! server: append a mask, and replace the check by a keyed MAC of the mask under the old check
//! (one way: the old check cannot be recovered from the new). The server recomputes the chain
//! from its secret and the object's random value and compares in constant time.

use std::fmt;
use std::str::FromStr;

/// Rights bits. Bits not named here are reserved: masks may carry them, no request needs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rights(pub u16);

impl Rights {
    /// Read the object (size, bytes, chunks); list or look up a directory.
    pub const READ: Rights = Rights(1);
    /// Delete the object or the directory.
    pub const DELETE: Rights = Rights(2);
    /// Derive weaker capabilities from this one.
    pub const RESTRICT: Rights = Rights(4);
    /// Change a directory (make a new version of it).
    pub const MODIFY: Rights = Rights(8);
    /// What an owner's capability carries.
    pub const ALL: Rights = Rights(0xf);
    pub const NONE: Rights = Rights(0);

    const NAMES: [(&'static str, Rights); 4] = [
        ("read", Rights::READ),
        ("delete", Rights::DELETE),
        ("restrict", Rights::RESTRICT),
        ("modify", Rights::MODIFY),
    ];

    pub fn contains(self, other: Rights) -> bool {
        self.0 & other.0 == other.0
    }

    pub fn and(self, other: Rights) -> Rights {
        Rights(self.0 & other.0)
    }
}

impl fmt::Display for Rights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Rights::NAMES
            .iter()
            .filter(|(_, r)| self.contains(*r))
            .map(|(n, _)| *n)
            .collect();
        match names.is_empty() {
            true => f.write_str("none"),
            false => f.write_str(&names.join(",")),
        }
    }
}

impl FromStr for Rights {
    type Err = BadCapability;

    /// A comma-separated list of right names (`read,delete`), or `none`.
    fn from_str(s: &str) -> Result<Rights, BadCapability> {
        let mut r = Rights::NONE;
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "none" {
                continue;
            }
            let (_, bit) = Rights::NAMES
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| {
                    BadCapability(format!(
                        "no right called {name:?} (rights: read, delete, restrict, modify)"
                    ))
                })?;
            r = Rights(r.0 | bit.0);
        }
        Ok(r)
    }
}

impl std::ops::BitOr for Rights {
    type Output = Rights;
    fn bitor(self, o: Rights) -> Rights {
        Rights(self.0 | o.0)
    }
}

/// Bytes of a server id.
pub const SERVER_ID_BYTES: usize = 16;
/// Bytes of an object's random value (Amoeba's per-object random number).
pub const RANDOM_BYTES: usize = 16;
/// Bytes of the check field.
pub const CHECK_BYTES: usize = 32;
/// The most masks one capability carries.
pub const MAX_MASKS: usize = 8;
/// The most bytes of an encoded capability.
pub const MAX_CAP_BYTES: usize = 1 + SERVER_ID_BYTES + 8 + 1 + 2 * MAX_MASKS + CHECK_BYTES;

const VERSION: u8 = 1;
const MINT_CONTEXT: &[u8] = b"ferry capability v1\0";
const RESTRICT_CONTEXT: &[u8] = b"ferry restrict v1\0";
/// What the text form of a capability begins with.
pub const TEXT_PREFIX: &str = "fcap1";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a capability: {0}")]
pub struct BadCapability(pub String);

/// A capability.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Capability {
    pub server: [u8; SERVER_ID_BYTES],
    pub number: u64,
    /// Rights masks, oldest first; the rights are every right all of them keep.
    pub masks: Vec<Rights>,
    pub check: [u8; CHECK_BYTES],
}

impl fmt::Debug for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The check field is the secret part: never in logs.
        write!(
            f,
            "Capability({}, #{}, {})",
            hex::encode(self.server),
            self.number,
            self.rights()
        )
    }
}

/// The check of an owner's capability: what only the server can compute.
pub fn mint_check(
    secret: &[u8; 32],
    server: &[u8; SERVER_ID_BYTES],
    number: u64,
    random: &[u8; RANDOM_BYTES],
) -> [u8; CHECK_BYTES] {
    let mut h = blake3::Hasher::new_keyed(secret);
    h.update(MINT_CONTEXT);
    h.update(server);
    h.update(&number.to_le_bytes());
    h.update(random);
    *h.finalize().as_bytes()
}

/// One step of the chain: the check after `mask` is appended to a capability checked by
/// `check`.
fn step(check: &[u8; CHECK_BYTES], mask: Rights) -> [u8; CHECK_BYTES] {
    let mut h = blake3::Hasher::new_keyed(check);
    h.update(RESTRICT_CONTEXT);
    h.update(&mask.0.to_le_bytes());
    *h.finalize().as_bytes()
}

impl Capability {
    /// The owner's capability of object `number` (every right).
    pub fn mint(
        secret: &[u8; 32],
        server: [u8; SERVER_ID_BYTES],
        number: u64,
        random: &[u8; RANDOM_BYTES],
    ) -> Capability {
        Capability {
            server,
            number,
            masks: vec![],
            check: mint_check(secret, &server, number, random),
        }
    }

    /// The rights this capability carries.
    pub fn rights(&self) -> Rights {
        self.masks.iter().fold(Rights::ALL, |r, m| r.and(*m))
    }

    /// A capability with at most `keep` of this one's rights, derived without the server.
    /// Needs the `RESTRICT` right (a holder without it could compute the chain, but the
    /// server refuses what it makes).
    pub fn restrict(&self, keep: Rights) -> Result<Capability, BadCapability> {
        if !self.rights().contains(Rights::RESTRICT) {
            return Err(BadCapability(
                "this capability lacks the restrict right".into(),
            ));
        }
        if self.masks.len() >= MAX_MASKS {
            return Err(BadCapability(format!(
                "already restricted {MAX_MASKS} times, the most a capability records"
            )));
        }
        let mut c = self.clone();
        c.masks.push(keep);
        c.check = step(&self.check, keep);
        Ok(c)
    }

    /// Whether this capability is one the server made (or derived by the rules) for an object
    /// whose owner's check is `owner` (computed by the server with [`mint_check`]), compared
    /// in constant time. It does not say which rights it carries: [`Capability::rights`].
    pub fn verify(&self, owner: &[u8; CHECK_BYTES]) -> bool {
        let mut check = *owner;
        let mut rights = Rights::ALL;
        let mut lawful = true;
        for m in &self.masks {
            // A mask added after the restrict right was dropped is not lawful: computed all
            // the same, so the time taken does not tell.
            lawful &= rights.contains(Rights::RESTRICT);
            check = step(&check, *m);
            rights = rights.and(*m);
        }
        let same = blake3::Hash::from_bytes(check) == blake3::Hash::from_bytes(self.check);
        same & lawful
    }

    /// The binary form (`docs/formats.md`).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(MAX_CAP_BYTES);
        b.push(VERSION);
        b.extend_from_slice(&self.server);
        b.extend_from_slice(&self.number.to_le_bytes());
        b.push(self.masks.len() as u8);
        for m in &self.masks {
            b.extend_from_slice(&m.0.to_le_bytes());
        }
        b.extend_from_slice(&self.check);
        b
    }

    pub fn from_bytes(b: &[u8]) -> Result<Capability, BadCapability> {
        let bad = |why: String| BadCapability(why);
        let Some((&version, rest)) = b.split_first() else {
            return Err(bad("empty".into()));
        };
        if version != VERSION {
            return Err(bad(format!("version {version} (this Ferry reads 1)")));
        }
        if rest.len() < SERVER_ID_BYTES + 8 + 1 {
            return Err(bad(format!("{} bytes: cut short", b.len())));
        }
        let (server, rest) = rest.split_at(SERVER_ID_BYTES);
        let (number, rest) = rest.split_at(8);
        let (n, rest) = (rest[0] as usize, &rest[1..]);
        if n > MAX_MASKS {
            return Err(bad(format!("{n} masks (at most {MAX_MASKS})")));
        }
        if rest.len() != 2 * n + CHECK_BYTES {
            return Err(bad(format!(
                "{} bytes where {n} masks and a check take {}",
                rest.len(),
                2 * n + CHECK_BYTES
            )));
        }
        let (masks, check) = rest.split_at(2 * n);
        Ok(Capability {
            server: server.try_into().expect("sized above"),
            number: u64::from_le_bytes(number.try_into().expect("sized above")),
            masks: masks
                .chunks_exact(2)
                .map(|m| Rights(u16::from_le_bytes([m[0], m[1]])))
                .collect(),
            check: check.try_into().expect("sized above"),
        })
    }
}

/// The text form: `fcap1` and the binary form in lower-case base32, unpadded.
impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(TEXT_PREFIX)?;
        f.write_str(&crate::base32::encode(&self.to_bytes()))
    }
}

impl FromStr for Capability {
    type Err = BadCapability;

    fn from_str(s: &str) -> Result<Capability, BadCapability> {
        let body = s
            .trim()
            .strip_prefix(TEXT_PREFIX)
            .ok_or_else(|| BadCapability(format!("it does not begin with {TEXT_PREFIX}")))?;
        let b = crate::base32::decode(body).map_err(BadCapability)?;
        Capability::from_bytes(&b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: [u8; 32] = [7; 32];
    const SERVER: [u8; 16] = [1; 16];
    const RANDOM: [u8; 16] = [9; 16];

    fn owner() -> Capability {
        Capability::mint(&SECRET, SERVER, 42, &RANDOM)
    }

    fn check() -> [u8; 32] {
        mint_check(&SECRET, &SERVER, 42, &RANDOM)
    }

    #[test]
    fn owner_restricted_and_forged() {
        let o = owner();
        assert!(o.verify(&check()));
        assert_eq!(o.rights(), Rights::ALL);
        let r = o.restrict(Rights::READ | Rights::RESTRICT).unwrap();
        assert!(r.verify(&check()));
        assert_eq!(r.rights(), Rights::READ | Rights::RESTRICT);
        let rr = r.restrict(Rights::READ).unwrap();
        assert!(rr.verify(&check()));
        assert_eq!(rr.rights(), Rights::READ);
        // Cannot restrict further: the right is gone.
        assert!(rr.restrict(Rights::READ).is_err());
        // Widening: change a mask back and keep the check.
        let mut wide = rr.clone();
        wide.masks[1] = Rights::ALL;
        assert!(!wide.verify(&check()));
        // Dropping the last mask keeps the newer check: refused.
        let mut dropped = rr.clone();
        dropped.masks.pop();
        assert!(!dropped.verify(&check()));
        // Another object's number or another server's id.
        let mut other = o.clone();
        other.number = 43;
        assert!(!other.verify(&mint_check(&SECRET, &SERVER, 43, &RANDOM)) || other == o);
        assert!(!o.verify(&mint_check(&SECRET, &SERVER, 42, &[8; 16])));
        assert!(!o.verify(&mint_check(&[6; 32], &SERVER, 42, &RANDOM)));
        // Every flipped bit of the check.
        for i in 0..32 * 8 {
            let mut f = r.clone();
            f.check[i / 8] ^= 1 << (i % 8);
            assert!(!f.verify(&check()), "bit {i}");
        }
    }

    #[test]
    fn a_mask_after_the_restrict_right_is_gone_is_refused() {
        let r = owner().restrict(Rights::READ).unwrap();
        // Computed by hand, the way a holder without the right could.
        let mut forged = r.clone();
        forged.masks.push(Rights::READ);
        forged.check = step(&r.check, Rights::READ);
        assert!(!forged.verify(&check()));
    }

    #[test]
    fn text_and_bytes_round_trip() {
        let r = owner().restrict(Rights::READ | Rights::DELETE).unwrap();
        let t = r.to_string();
        assert!(t.starts_with("fcap1"));
        assert_eq!(t.parse::<Capability>().unwrap(), r);
        assert_eq!(Capability::from_bytes(&r.to_bytes()).unwrap(), r);
        let b = r.to_bytes();
        for n in 0..b.len() {
            assert!(Capability::from_bytes(&b[..n]).is_err(), "cut at {n}");
        }
        let mut long = b.clone();
        long.push(0);
        assert!(Capability::from_bytes(&long).is_err());
        assert!(format!("{r:?}").find(&hex::encode(r.check)).is_none());
    }

    /// Capability v1, byte for byte (`docs/formats.md`).
    #[test]
    fn encoding_is_pinned() {
        let r = owner().restrict(Rights::READ).unwrap();
        let b = r.to_bytes();
        assert_eq!(b.len(), 60);
        assert_eq!(
            hex::encode(&b[..28]),
            "0101010101010101010101010101010101\
             2a000000000000000101 00"
                .replace(' ', "")
        );
        assert_eq!(
            hex::encode(mint_check(&SECRET, &SERVER, 42, &RANDOM)),
            GOLDEN_OWNER_CHECK
        );
        assert_eq!(hex::encode(&b[28..]), GOLDEN_RESTRICTED_CHECK);
    }

    const GOLDEN_OWNER_CHECK: &str =
        "115b2c5e294aec716bbce8ccdd16fcddd10d8376c8e57f4493680a6cfdd6ec19";
    const GOLDEN_RESTRICTED_CHECK: &str =
        "7ada4683edc19bba771900a9995b29d98b7414f4435a7cf7ac596f716053ba9c";

    #[test]
    fn rights_parse_and_print() {
        assert_eq!("read,delete".parse::<Rights>().unwrap(), Rights(3));
        assert_eq!(Rights(3).to_string(), "read,delete");
        assert_eq!(Rights::NONE.to_string(), "none");
        assert!("write".parse::<Rights>().is_err());
    }
}
