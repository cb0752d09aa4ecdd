//! `lbfs-v1`: the LBFS chunker (LBFS §3.1).
//!
//! A Rabin fingerprint is the value of a byte string read as a polynomial over GF(2), modulo a
//! fixed irreducible polynomial. Over a sliding 48-byte window it is updated in O(1) per byte
//! with two table lookups: one removes the byte leaving the window, one reduces after the new
//! byte is shifted in. A chunk ends after a window whose fingerprint's low 13 bits equal
//! [`MAGIC`], provided the chunk is at least 2 KiB; a chunk that reaches 64 KiB is cut anyway.
//!
//! The fingerprint is a function of the window's 48 bytes alone, so the bytes of a chunk before
//! `min - 48` can never influence a cut: the cutter skips them without hashing and starts from
//! an empty (all-zero) window there. This gives exactly the cut points of a fingerprint rolled
//! continuously over the file, at a fraction of the cost.
//!
//! The polynomial is [`LBFS_POLYNOMIAL`], of degree 53: the first irreducible polynomial of
//! degree 53 found by taking the little-endian first 8 bytes of
//! `SHA-256("ferry lbfs rabin polynomial " + decimal i)` for i = 0, 1, …, keeping the low 53
//! bits and setting bits 0 and 53 (it is i = 12). The unit tests re-prove its irreducibility.

use crate::{ChunkerSpec, Cutter};

/// The sliding window, in bytes (LBFS §3.1).
pub(crate) const WINDOW: usize = 48;
/// The irreducible polynomial of degree 53 used by `lbfs-v1` (see the module docs).
pub const LBFS_POLYNOMIAL: u64 = 0x2a_ab18_4c7d_eb0f;
const DEGREE: u32 = 53;
const SHIFT: u32 = DEGREE - 8;
const LOW53: u64 = (1 << DEGREE) - 1;
/// A window is a breakpoint when `fingerprint & (avg - 1) == MAGIC & (avg - 1)`. Any non-zero
/// value works (zero would make long runs of zero bytes cut at every minimum); this one is
/// fixed forever for `lbfs-v1`.
const MAGIC: u64 = 0x0b4d_5a3c;

/// The tables of one polynomial.
struct Tables {
    /// `b·x^(8·47) mod P`: a byte's weight when it is the oldest in the window.
    out: [u64; 256],
    /// `out[b]·x^8 mod P`.
    out8: [u64; 256],
    /// `t·x^53 mod P` and `t·x^61 mod P`: reduce the top byte after a shift by 8 or 16.
    r53: [u64; 256],
    r61: [u64; 256],
}

impl Tables {
    fn of(pol: u64) -> Box<Tables> {
        let mut t = Box::new(Tables {
            out: [0; 256],
            out8: [0; 256],
            r53: [0; 256],
            r61: [0; 256],
        });
        for b in 0..256u64 {
            let mut h = append_byte(0, b as u8, pol);
            for _ in 0..WINDOW - 1 {
                h = append_byte(h, 0, pol);
            }
            t.out[b as usize] = h;
            t.out8[b as usize] = append_byte(h, 0, pol);
            t.r53[b as usize] = poly_mod((b as u128) << DEGREE, pol);
            t.r61[b as usize] = poly_mod((b as u128) << (DEGREE + 8), pol);
        }
        t
    }
}

/// The tables of [`LBFS_POLYNOMIAL`], made once: a cutter per file (a server cutting a tree of
/// small files) would otherwise spend more on them than on the files.
static LBFS_TABLES: std::sync::OnceLock<Box<Tables>> = std::sync::OnceLock::new();

/// A cutter's tables: the shared ones, or its key's own.
enum TablesRef {
    Shared(&'static Tables),
    Own(Box<Tables>),
}

impl std::ops::Deref for TablesRef {
    type Target = Tables;
    fn deref(&self) -> &Tables {
        match self {
            TablesRef::Shared(t) => t,
            TablesRef::Own(t) => t,
        }
    }
}

/// The Rabin-fingerprint cutter. See the module documentation.
pub struct RabinCutter {
    tables: TablesRef,
    subst: [u8; 256],
    keyed: bool,
    mask: u64,
    magic: u64,
    min: usize,
    max: usize,
    window: [u8; WINDOW],
    wpos: usize,
    digest: u64,
    len: usize,
}

impl RabinCutter {
    pub(crate) fn new(spec: &ChunkerSpec) -> Self {
        let mask = spec.avg as u64 - 1;
        let (pol, subst, magic) = match &spec.key {
            None => {
                let mut id = [0u8; 256];
                for (i, v) in id.iter_mut().enumerate() {
                    *v = i as u8;
                }
                (LBFS_POLYNOMIAL, id, MAGIC)
            }
            Some(key) => keyed_params(key),
        };
        let tables = match pol {
            LBFS_POLYNOMIAL => TablesRef::Shared(LBFS_TABLES.get_or_init(|| Tables::of(pol))),
            _ => TablesRef::Own(Tables::of(pol)),
        };
        RabinCutter {
            tables,
            subst,
            keyed: spec.key.is_some(),
            mask,
            magic: magic & mask,
            min: spec.min,
            max: spec.max,
            window: [0; WINDOW],
            wpos: 0,
            digest: 0,
            len: 0,
        }
    }

    fn start_chunk(&mut self) {
        self.window = [0; WINDOW];
        self.wpos = 0;
        self.digest = 0;
        self.len = 0;
    }
}

impl RabinCutter {
    /// One byte through the ring-buffer window (the general path).
    #[inline(always)]
    fn slide(&mut self, digest: u64, wpos: &mut usize, b: u8) -> u64 {
        let leaving = self.window[*wpos];
        self.window[*wpos] = b;
        *wpos += 1;
        if *wpos == WINDOW {
            *wpos = 0;
        }
        let d = digest ^ self.tables.out[leaving as usize];
        (((d << 8) & LOW53) | b as u64) ^ self.tables.r53[(d >> SHIFT) as usize & 0xff]
    }
}

impl RabinCutter {
    /// Rolls two bytes per step over `data[i..end]` (`i >= WINDOW`, window full of `data`).
    /// `Ok(n)`: a chunk ends after `data[..n]`. `Err((n, digest))`: no cut before `n`, which is
    /// `end` or `end - 1`.
    #[inline(always)]
    fn fast<const KEYED: bool>(
        &self,
        data: &[u8],
        mut i: usize,
        end: usize,
        mut digest: u64,
    ) -> Result<usize, (usize, u64)> {
        let t = &*self.tables;
        let (out, out8, r53, r61) = (&t.out, &t.out8, &t.r53, &t.r61);
        let sub = |b: u8| if KEYED { self.subst[b as usize] } else { b };
        let pairs = (end - i) / 2;
        let cur = data[i..i + 2 * pairs].chunks_exact(2);
        let old = data[i - WINDOW..i + 2 * pairs - WINDOW].chunks_exact(2);
        for (c, o) in cur.zip(old) {
            let (b1, b2) = (sub(c[0]) as u64, sub(c[1]) as u64);
            let (l1, l2) = (sub(o[0]) as usize, sub(o[1]) as usize);
            let d1 = digest ^ out[l1];
            let first = (((d1 << 8) & LOW53) | b1) ^ r53[(d1 >> SHIFT) as usize & 0xff];
            let v = out8[l1] ^ b1 ^ out[l2];
            let w = ((v << 8) & LOW53) ^ r53[(v >> SHIFT) as usize & 0xff] ^ b2;
            digest = ((digest << 16) & LOW53)
                ^ r61[(digest >> SHIFT) as usize & 0xff]
                ^ r53[(digest >> (SHIFT - 8)) as usize & 0xff]
                ^ w;
            if first & self.mask == self.magic {
                return Ok(i + 1);
            }
            i += 2;
            if digest & self.mask == self.magic {
                return Ok(i);
            }
        }
        Err((i, digest))
    }
}

impl Cutter for RabinCutter {
    fn next_cut(&mut self, data: &[u8]) -> Option<usize> {
        let mut i = 0;
        let skip_to = self.min - WINDOW;
        if self.len < skip_to {
            let n = (skip_to - self.len).min(data.len());
            self.len += n;
            i = n;
        }
        // Bytes this call may hash before the maximum forces a cut.
        let end = data.len().min(i + (self.max - self.len));
        let (mut digest, mut wpos, mut len) = (self.digest, self.wpos, self.len);
        // General path, until the window holds only bytes of `data` hashed in this chunk.
        while i < end && (i < WINDOW || len < self.min) {
            let b = self.subst[data[i] as usize];
            digest = self.slide(digest, &mut wpos, b);
            len += 1;
            i += 1;
            if digest & self.mask == self.magic && len >= self.min {
                self.start_chunk();
                return Some(i);
            }
        }
        // Fast path: the leaving bytes are read from `data`, and two bytes are rolled per step
        // with a dependency chain of one table lookup (see `docs/chunking.md`).
        if i < end {
            let fast = if self.keyed {
                Self::fast::<true>
            } else {
                Self::fast::<false>
            };
            match fast(self, data, i, end, digest) {
                Ok(at) => {
                    self.start_chunk();
                    return Some(at);
                }
                Err((at, d)) => {
                    len += at - i;
                    i = at;
                    digest = d;
                }
            }
            // The ring again holds the last window, oldest first.
            for (w, &b) in self.window.iter_mut().zip(&data[i - WINDOW..i]) {
                *w = self.subst[b as usize];
            }
            wpos = 0;
            if i < end {
                let b = self.subst[data[i] as usize];
                digest = self.slide(digest, &mut wpos, b);
                len += 1;
                i += 1;
                if digest & self.mask == self.magic {
                    self.start_chunk();
                    return Some(i);
                }
            }
        }
        if len == self.max {
            self.start_chunk();
            return Some(i);
        }
        self.digest = digest;
        self.wpos = wpos;
        self.len = len;
        None
    }

    fn reset(&mut self) {
        self.start_chunk();
    }

    fn max_size(&self) -> usize {
        self.max
    }
}

/// Degree of a non-zero polynomial.
fn degree(p: u128) -> u32 {
    127 - p.leading_zeros()
}

/// `a mod p` over GF(2).
fn poly_mod(mut a: u128, p: u64) -> u64 {
    let p = p as u128;
    let dp = degree(p);
    while a != 0 && degree(a) >= dp {
        a ^= p << (degree(a) - dp);
    }
    a as u64
}

/// `(h * x^8 + b) mod p`.
fn append_byte(h: u64, b: u8, p: u64) -> u64 {
    poly_mod(((h as u128) << 8) | b as u128, p)
}

/// `a * b mod p` over GF(2), for `a, b` reduced mod `p` (degree < 64).
fn mul_mod(a: u64, b: u64, p: u64) -> u64 {
    let mut r: u128 = 0;
    for i in 0..64 {
        if (b >> i) & 1 == 1 {
            r ^= (a as u128) << i;
        }
    }
    poly_mod(r, p)
}

fn poly_gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let r = poly_mod(a as u128, b);
        a = b;
        b = r;
    }
    a
}

/// Rabin's irreducibility test for a polynomial of prime degree 53: `x^(2^53) = x (mod p)` and
/// `gcd(x^2 - x, p) = 1`.
pub(crate) fn is_irreducible_deg53(p: u64) -> bool {
    if degree(p as u128) != DEGREE {
        return false;
    }
    let x = 2u64;
    let mut t = x;
    for _ in 0..DEGREE {
        t = mul_mod(t, t, p);
    }
    if t != x {
        return false;
    }
    poly_gcd(p, mul_mod(x, x, p) ^ x) == 1
}

/// The keyed variant's secrets: a polynomial, a byte permutation applied before hashing, and the
/// magic value, all derived from the key.
fn keyed_params(key: &crate::Key) -> (u64, [u8; 256], u64) {
    let mut xof = key.derive("ferry chunk lbfs-v1 keyed polynomial");
    let pol = loop {
        let mut b = [0u8; 8];
        xof.fill(&mut b);
        let cand = (u64::from_le_bytes(b) & ((1 << DEGREE) - 1)) | (1 << DEGREE) | 1;
        if is_irreducible_deg53(cand) {
            break cand;
        }
    };
    let mut xof = key.derive("ferry chunk lbfs-v1 keyed substitution");
    let mut subst = [0u8; 256];
    for (i, v) in subst.iter_mut().enumerate() {
        *v = i as u8;
    }
    // Fisher–Yates with rejection sampling, so the permutation is uniform.
    for i in (1..256usize).rev() {
        let j = loop {
            let mut b = [0u8; 1];
            xof.fill(&mut b);
            let limit = 256 - 256 % (i + 1);
            if (b[0] as usize) < limit {
                break b[0] as usize % (i + 1);
            }
        };
        subst.swap(i, j);
    }
    let mut b = [0u8; 8];
    key.derive("ferry chunk lbfs-v1 keyed magic").fill(&mut b);
    (pol, subst, u64::from_le_bytes(b) | 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polynomial_is_irreducible_and_as_documented() {
        assert!(is_irreducible_deg53(LBFS_POLYNOMIAL));
        // x^53 + 1 = (x + 1)(...) is reducible; the test must be able to say no.
        assert!(!is_irreducible_deg53((1 << 53) | 1));
    }

    #[test]
    fn fingerprint_depends_on_window_only() {
        let spec = ChunkerSpec::lbfs();
        let mut a = RabinCutter::new(&spec);
        let mut b = RabinCutter::new(&spec);
        // Feed a different prefix to each, then the same 48 bytes; the digests must agree.
        for c in [&mut a, &mut b] {
            c.min = WINDOW; // hash from the first byte
            c.max = usize::MAX;
            c.magic = u64::MAX; // never cut
        }
        a.next_cut(&[7u8; 1000]);
        b.next_cut(&[9u8; 333]);
        let tail: Vec<u8> = (0..48u8).map(|i| i.wrapping_mul(37)).collect();
        a.next_cut(&tail);
        b.next_cut(&tail);
        assert_eq!(a.digest, b.digest);
        assert_ne!(a.digest, 0);
    }

    #[test]
    fn keyed_polynomials_are_irreducible_and_differ() {
        let k1 = keyed_params(&crate::Key([1; 32]));
        let k2 = keyed_params(&crate::Key([2; 32]));
        assert!(is_irreducible_deg53(k1.0));
        assert!(is_irreducible_deg53(k2.0));
        assert_ne!(k1.0, k2.0);
        let mut seen = k1.1.to_vec();
        seen.sort_unstable();
        assert!(seen.iter().enumerate().all(|(i, &v)| v as usize == i));
    }
}
