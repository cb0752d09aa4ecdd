//! A vault's keys. One random master key; every other key is derived from it (BLAKE3's key
//! derivation, a context string each), so a passphrase change rewraps 32 bytes and nothing
//! else. The master key is kept only wrapped: by a key derived from a passphrase with Argon2id
//! (memory-hard), under XChaCha20-Poly1305 (RustCrypto; 24-byte random nonces, so random nonces
//! never repeat in practice).
//!
//! - Blocks are sealed with XChaCha20-Poly1305 under the block key: `nonce (24) ‖ ciphertext ‖
//!   tag (16)`, the caller's associated data binding them to their place.
//! - Block ids are keyed BLAKE3 MACs of the plaintext: equal blocks in one vault share an id
//!   (deduplication), and nobody without the key learns anything from an id.
//!
//! Key slot v1 (docs/formats.md, "Vault key slot v1"), 105 bytes, integers little-endian:
//! magic `FVKS`, version 1, Argon2id memory KiB u32, passes u32, lanes u32, salt (16), nonce
//! (24), the wrapped master key (32 + 16 tag). The first 33 bytes are the wrapping's associated
//! data: the parameters cannot be changed without the passphrase failing.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::XChaCha20Poly1305;

use crate::VaultError;

const MAGIC: &[u8; 4] = b"FVKS";
const VERSION: u8 = 1;
pub const SLOT_BYTES: usize = 105;
const NONCE: usize = 24;
const TAG: usize = 16;

/// Argon2id's cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KdfParams {
    pub memory_kib: u32,
    pub passes: u32,
    pub lanes: u32,
}

impl Default for KdfParams {
    /// 64 MiB and 3 passes, as RFC 9106's second recommendation, in one lane.
    fn default() -> Self {
        KdfParams {
            memory_kib: 64 << 10,
            passes: 3,
            lanes: 1,
        }
    }
}

/// The keys of one vault.
pub struct VaultKeys {
    master: [u8; 32],
}

impl std::fmt::Debug for VaultKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("VaultKeys(..)")
    }
}

fn sealer(key: &[u8; 32]) -> XChaCha20Poly1305 {
    XChaCha20Poly1305::new_from_slice(key).expect("32-byte key")
}

fn seal_with(key: &[u8; 32], nonce: [u8; NONCE], plaintext: &[u8], aad: &[u8]) -> Vec<u8> {
    let ct = sealer(key)
        .encrypt(
            &nonce.into(),
            Payload {
                msg: plaintext,
                aad,
            },
        )
        .expect("XChaCha20-Poly1305 encrypts any length a Vec holds");
    let mut out = Vec::with_capacity(NONCE + ct.len());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&ct);
    out
}

fn open_with(key: &[u8; 32], sealed: &[u8], aad: &[u8]) -> Option<Vec<u8>> {
    if sealed.len() < NONCE + TAG {
        return None;
    }
    let nonce: [u8; NONCE] = sealed[..NONCE].try_into().ok()?;
    sealer(key)
        .decrypt(
            &nonce.into(),
            Payload {
                msg: &sealed[NONCE..],
                aad,
            },
        )
        .ok()
}

/// The key derivation's parameters of a slot (`None`: not a slot v1).
pub fn slot_params(slot: &[u8]) -> Option<KdfParams> {
    if slot.len() != SLOT_BYTES || &slot[..4] != MAGIC || slot[4] != VERSION {
        return None;
    }
    let u = |i: usize| u32::from_le_bytes(slot[i..i + 4].try_into().unwrap());
    Some(KdfParams {
        memory_kib: u(5),
        passes: u(9),
        lanes: u(13),
    })
}

impl VaultKeys {
    /// New random keys.
    pub fn generate() -> VaultKeys {
        VaultKeys {
            master: rand::random(),
        }
    }

    fn derive(&self, context: &str) -> [u8; 32] {
        blake3::derive_key(context, &self.master)
    }

    /// The id of a block: a keyed MAC of its plaintext.
    pub fn block_id(&self, plaintext: &[u8]) -> [u8; 32] {
        *blake3::keyed_hash(&self.derive("ferry vault v1 block id"), plaintext).as_bytes()
    }

    /// The key of the vault's keyed chunker (cut points that do not fingerprint content).
    pub fn chunker_key(&self) -> [u8; 32] {
        self.derive("ferry vault v1 chunker")
    }

    /// The keys of the fine summaries: the sub-block chunker's, and the fingerprints'.
    pub(crate) fn fine_keys(&self) -> ([u8; 32], [u8; 32]) {
        (
            self.derive("ferry vault v1 fine chunker"),
            self.derive("ferry vault v1 fine fingerprint"),
        )
    }

    /// `plaintext` sealed (a fresh random nonce each time), bound to `aad`.
    pub fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Vec<u8> {
        seal_with(
            &self.derive("ferry vault v1 block encryption"),
            rand::random(),
            plaintext,
            aad,
        )
    }

    /// What [`seal`](Self::seal) sealed with the same `aad`; an error for anything else.
    pub fn open(&self, sealed: &[u8], aad: &[u8], what: &str) -> Result<Vec<u8>, VaultError> {
        open_with(&self.derive("ferry vault v1 block encryption"), sealed, aad).ok_or_else(|| {
            VaultError::Damaged {
                id: what.to_string(),
                why: "it does not decrypt: altered, moved, or sealed under another key".into(),
            }
        })
    }

    /// The master key wrapped under `passphrase`: a key slot.
    pub fn wrap(&self, passphrase: &[u8], params: KdfParams) -> Result<Vec<u8>, VaultError> {
        self.wrap_with(passphrase, params, rand::random(), rand::random())
    }

    fn wrap_with(
        &self,
        passphrase: &[u8],
        params: KdfParams,
        salt: [u8; 16],
        nonce: [u8; NONCE],
    ) -> Result<Vec<u8>, VaultError> {
        let mut slot = Vec::with_capacity(SLOT_BYTES);
        slot.extend_from_slice(MAGIC);
        slot.push(VERSION);
        for v in [params.memory_kib, params.passes, params.lanes] {
            slot.extend_from_slice(&v.to_le_bytes());
        }
        slot.extend_from_slice(&salt);
        let kek = kdf(passphrase, &salt, params)?;
        let wrapped = seal_with(&kek, nonce, &self.master, &slot[..33]);
        slot.extend_from_slice(&wrapped);
        debug_assert_eq!(slot.len(), SLOT_BYTES);
        Ok(slot)
    }

    /// The keys a key slot holds, unlocked by `passphrase`.
    pub fn unwrap(slot: &[u8], passphrase: &[u8]) -> Result<VaultKeys, VaultError> {
        let bad = |why: &str| VaultError::Damaged {
            id: "key slot".into(),
            why: why.into(),
        };
        if slot.len() != SLOT_BYTES || &slot[..4] != MAGIC {
            return Err(bad("not a vault key slot"));
        }
        if slot[4] != VERSION {
            return Err(bad("a key slot of another version"));
        }
        let params = slot_params(slot).expect("checked above");
        // Bounds a hostile slot cannot push past: 4 GiB of memory, 64 passes, 64 lanes.
        if params.memory_kib > 4 << 20 || params.passes > 64 || params.lanes > 64 {
            return Err(bad("key derivation costs beyond any this Ferry makes"));
        }
        let salt: [u8; 16] = slot[17..33].try_into().unwrap();
        let kek = kdf(passphrase, &salt, params)?;
        let master =
            open_with(&kek, &slot[33..], &slot[..33]).ok_or(VaultError::WrongPassphrase)?;
        Ok(VaultKeys {
            master: master
                .try_into()
                .map_err(|_| bad("a master key of the wrong size"))?,
        })
    }
}

fn kdf(passphrase: &[u8], salt: &[u8; 16], p: KdfParams) -> Result<[u8; 32], VaultError> {
    let params = argon2::Params::new(p.memory_kib, p.passes, p.lanes, Some(32)).map_err(|e| {
        VaultError::Damaged {
            id: "key slot".into(),
            why: format!("key derivation parameters: {e}"),
        }
    })?;
    let a = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let mut out = [0u8; 32];
    a.hash_password_into(passphrase, salt, &mut out)
        .map_err(|e| VaultError::Damaged {
            id: "key slot".into(),
            why: format!("key derivation: {e}"),
        })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cheap parameters: tests check the format and the logic, not the cost.
    const CHEAP: KdfParams = KdfParams {
        memory_kib: 64,
        passes: 1,
        lanes: 1,
    };

    #[test]
    fn a_passphrase_unlocks_its_slot_and_nothing_else() {
        let k = VaultKeys::generate();
        let slot = k.wrap(b"correct horse", CHEAP).unwrap();
        assert_eq!(slot.len(), SLOT_BYTES);
        let again = VaultKeys::unwrap(&slot, b"correct horse").unwrap();
        assert_eq!(again.master, k.master);
        assert_eq!(
            VaultKeys::unwrap(&slot, b"battery staple").unwrap_err(),
            VaultError::WrongPassphrase
        );
        // Every byte of the slot matters: the parameters are bound to the wrapping.
        for i in 0..slot.len() {
            let mut s = slot.clone();
            s[i] ^= 1;
            assert!(VaultKeys::unwrap(&s, b"correct horse").is_err(), "byte {i}");
        }
        assert!(VaultKeys::unwrap(&slot[..50], b"correct horse").is_err());
    }

    #[test]
    fn key_slot_golden_bytes() {
        let k = VaultKeys { master: [7; 32] };
        let slot = k.wrap_with(b"pw", CHEAP, [1; 16], [2; NONCE]).unwrap();
        assert_eq!(&slot[..5], b"FVKS\x01");
        assert_eq!(&slot[5..17], &[64, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(&slot[17..33], &[1; 16]);
        assert_eq!(&slot[33..57], &[2; NONCE]);
        // The wrapped key and tag, computed independently with the reference Argon2
        // (argon2-cffi's `hash_secret_raw`, Argon2id v19, t=1, m=64 KiB, p=1) and
        // pycryptodome's XChaCha20-Poly1305 (the 24-byte nonce), the first 33 bytes as
        // associated data.
        let want = "f170ec8c02816c4122a3ca553fe2338a1238fd9c8754b989148b99178f19fdf2\
                    2f624e56af39e77d08f38ae36f93dbfb";
        let got: String = slot[57..].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got, want.replace(' ', ""));
    }

    #[test]
    fn sealed_blocks_open_only_as_sealed() {
        let k = VaultKeys::generate();
        let s = k.seal(b"secret block", b"file 1 block 3");
        assert_eq!(s.len(), NONCE + 12 + TAG);
        assert_eq!(k.open(&s, b"file 1 block 3", "b").unwrap(), b"secret block");
        // Moved elsewhere, altered, cut, or under another vault's key: refused.
        assert!(k.open(&s, b"file 1 block 4", "b").is_err());
        let mut t = s.clone();
        t[30] ^= 1;
        assert!(k.open(&t, b"file 1 block 3", "b").is_err());
        assert!(k.open(&s[..20], b"file 1 block 3", "b").is_err());
        assert!(VaultKeys::generate()
            .open(&s, b"file 1 block 3", "b")
            .is_err());
        // A fresh nonce each time; no plaintext in the output.
        assert_ne!(k.seal(b"secret block", b"x"), k.seal(b"secret block", b"x"));
        assert!(!s.windows(6).any(|w| w == b"secret"));
        // Block ids: the same for the same bytes in one vault, unrelated across vaults.
        assert_eq!(k.block_id(b"abc"), k.block_id(b"abc"));
        assert_ne!(k.block_id(b"abc"), VaultKeys::generate().block_id(b"abc"));
        assert_ne!(k.block_id(b"abc"), *blake3::hash(b"abc").as_bytes());
    }
}
