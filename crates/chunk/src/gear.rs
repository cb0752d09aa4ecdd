//! `fastcdc2020-v1`: FastCDC as published in 2020 (Xia et al., "The Design of Fast
//! Content-Defined Chunking for Data Deduplication Based Storage Systems", IEEE TPDS).
//!
//! A gear hash `fp = (fp << 1) + GEAR[byte]` rolls over the data; since each step shifts one bit
//! out, `fp` depends on the last 64 bytes only. The first `min` bytes of a chunk are skipped
//! unhashed (cut-point skipping). Normalized chunking (level 2): until the chunk reaches `avg`
//! a cut needs `log2(avg) + 2` mask bits to be zero, after it `log2(avg) - 2`, which pulls chunk
//! sizes toward the average. The 2020 refinement rolls two bytes per step
//! (`fp = (fp << 2) + (GEAR[a] << 1)`, test against `mask << 1`, then `fp += GEAR[b]`, test
//! against `mask`), which gives the same cut points as one byte per step because no mask uses
//! bit 63.
//!
//! Ferry's constants (fixed forever for `fastcdc2020-v1`):
//! - the gear table is 256 little-endian `u64` read from the BLAKE3 XOF of
//!   `derive_key("ferry chunk fastcdc2020-v1 gear", "")`; the keyed variant reads it from the
//!   key's sub-key for context `"ferry chunk fastcdc2020-v1 keyed gear"` instead;
//! - a mask of `n` bits sets bits `62 - floor(k * 47 / n)` for `k = 0..n`: spread over the top
//!   of the word so that every cut depends on a window of about 64 bytes.
//!
//! Cut points therefore differ from other FastCDC implementations (which use other gear
//! tables), but the algorithm is the published one.

use crate::{ChunkerSpec, Cutter};

/// Normalization level: mask bits added before the average and removed after it.
const NORMALIZATION: u32 = 2;

/// A FastCDC 2020 cutter. See the module documentation.
pub struct GearCutter {
    gear: Box<[u64; 256]>,
    gear_ls: Box<[u64; 256]>,
    mask_s: u64,
    mask_s_ls: u64,
    mask_l: u64,
    mask_l_ls: u64,
    min: usize,
    avg: usize,
    max: usize,
    fp: u64,
    len: usize,
    /// Bytes before `min` rolled into the fingerprint without a test (0 in FastCDC as
    /// published, which skips all of them; an unnormalized cutter's window): with as many as
    /// the mask's highest bit needs, every test depends on the bytes just before it only, not
    /// on where the chunk began.
    warm: usize,
}

/// The gear table: 256 little-endian u64s, the first 2,048 bytes of `xof`.
fn gear_table(mut xof: blake3::OutputReader) -> [u64; 256] {
    let mut bytes = [0u8; 256 * 8];
    xof.fill(&mut bytes);
    std::array::from_fn(|i| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8")))
}

pub(crate) fn spread_mask(bits: u32) -> u64 {
    (0..bits as u64).fold(0, |m, k| m | 1 << (62 - k * 47 / bits as u64))
}

/// The mask of an [unnormalized](GearCutter::unnormalized) cutter: `bits` bits spread over
/// three quarters of the window's, from bit `window - 2` down (bit `window − 2 − ⌊k × ⌊3 ×
/// window / 4⌋ / bits⌋` for `k = 0..bits`). Bit `b` of the fingerprint depends on the last
/// `b + 1` bytes only, so a test depends on the last `window - 1` at most; bit 63 stays clear.
pub fn window_mask(bits: u32, window: u32) -> u64 {
    let (bits, window) = (bits as u64, window as u64);
    (0..bits).fold(0, |m, k| {
        m | 1 << (window - 2 - k * (window * 3 / 4) / bits)
    })
}

impl GearCutter {
    pub(crate) fn new(spec: &ChunkerSpec) -> Self {
        // The unkeyed table is the same for every cutter: made once. (A cutter is made per
        // file; making the table took 256 BLAKE3 blocks, a tenth of a tree's transfer.)
        static UNKEYED: std::sync::OnceLock<[u64; 256]> = std::sync::OnceLock::new();
        let table = match &spec.key {
            None => *UNKEYED.get_or_init(|| {
                let k = blake3::derive_key("ferry chunk fastcdc2020-v1 gear", b"");
                gear_table(blake3::Hasher::new_keyed(&k).finalize_xof())
            }),
            Some(key) => gear_table(key.derive("ferry chunk fastcdc2020-v1 keyed gear")),
        };
        let gear = Box::new(table);
        let gear_ls = Box::new(table.map(|g| g << 1));
        let bits = spec.avg.trailing_zeros();
        let mask_s = spread_mask(bits + NORMALIZATION);
        let mask_l = spread_mask(bits - NORMALIZATION);
        GearCutter {
            gear,
            gear_ls,
            mask_s,
            mask_s_ls: mask_s << 1,
            mask_l,
            mask_l_ls: mask_l << 1,
            min: spec.min,
            avg: spec.avg,
            max: spec.max,
            fp: 0,
            len: 0,
            warm: 0,
        }
    }

    /// A cutter without normalization, whose cut points depend on the `window` bytes before
    /// them only (8 to 64): after `min` bytes (the `window` before them rolled into the
    /// fingerprint, the rest skipped), a cut where the `bits` bits of
    /// [`window_mask`]`(bits, window)` are all zero in the fingerprint (one chance in 2^`bits`
    /// a byte), at `max` bytes at the latest. Sizes spread geometrically above `min`, and an
    /// edit moves only the cuts within `window` bytes after it, as with LBFS's Rabin cutter,
    /// at the gear's speed. The gear table is `fastcdc2020-v1`'s unkeyed one.
    pub fn unnormalized(min: usize, bits: u32, window: u32, max: usize) -> Self {
        assert!(
            (8..=64).contains(&window)
                && (window as usize..=max).contains(&min)
                && (1..=window * 3 / 4).contains(&bits),
            "bad unnormalized gear"
        );
        let mut g = GearCutter::new(&ChunkerSpec::default());
        let mask = window_mask(bits, window);
        (g.mask_s, g.mask_s_ls, g.mask_l, g.mask_l_ls) = (mask, mask << 1, mask, mask << 1);
        // One mask from `min` on: no stricter one up to an average.
        (g.min, g.avg, g.max) = (min, min, max);
        g.warm = window as usize;
        g
    }

    /// Rolls over `data[start..end]` testing `mask`; returns the index just past a cut.
    #[inline(always)]
    fn scan(
        &mut self,
        data: &[u8],
        start: usize,
        end: usize,
        mask: u64,
        mask_ls: u64,
    ) -> Option<usize> {
        let mut fp = self.fp;
        let mut i = start;
        while i + 2 <= end {
            fp = (fp << 2).wrapping_add(self.gear_ls[data[i] as usize]);
            if fp & mask_ls == 0 {
                return Some(i + 1);
            }
            fp = fp.wrapping_add(self.gear[data[i + 1] as usize]);
            if fp & mask == 0 {
                return Some(i + 2);
            }
            i += 2;
        }
        if i < end {
            fp = (fp << 1).wrapping_add(self.gear[data[i] as usize]);
            if fp & mask == 0 {
                return Some(i + 1);
            }
        }
        self.fp = fp;
        None
    }

    fn cut(&mut self, at: usize) -> Option<usize> {
        self.fp = 0;
        self.len = 0;
        Some(at)
    }
}

impl Cutter for GearCutter {
    fn next_cut(&mut self, data: &[u8]) -> Option<usize> {
        let mut i = 0;
        let skip = self.min - self.warm;
        if self.len < skip {
            i = (skip - self.len).min(data.len());
            self.len += i;
        }
        if self.len < self.min {
            let end = data.len().min(i + (self.min - self.len));
            for &b in &data[i..end] {
                self.fp = (self.fp << 1).wrapping_add(self.gear[b as usize]);
            }
            self.len += end - i;
            i = end;
        }
        if self.len < self.avg {
            let end = data.len().min(i + (self.avg - self.len));
            if let Some(at) = self.scan(data, i, end, self.mask_s, self.mask_s_ls) {
                return self.cut(at);
            }
            self.len += end - i;
            i = end;
        }
        let end = data.len().min(i + (self.max - self.len));
        if let Some(at) = self.scan(data, i, end, self.mask_l, self.mask_l_ls) {
            return self.cut(at);
        }
        self.len += end - i;
        if self.len == self.max {
            return self.cut(end);
        }
        None
    }

    fn reset(&mut self) {
        self.fp = 0;
        self.len = 0;
    }

    fn max_size(&self) -> usize {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_have_the_right_bits_and_spare_bit_63() {
        for bits in 6..=24 {
            let m = spread_mask(bits);
            assert_eq!(m.count_ones(), bits);
            assert_eq!(m >> 63, 0);
        }
    }

    #[test]
    fn two_bytes_per_step_equals_one() {
        // Reference: the plain one-byte-per-step FastCDC loop over the whole buffer.
        let spec = ChunkerSpec::default();
        let g = GearCutter::new(&spec);
        let data: Vec<u8> = (0..300_000u32)
            .map(|i| (i.wrapping_mul(2654435761).rotate_left(7) >> 11) as u8)
            .collect();
        let mut expect = vec![];
        let (mut start, mut fp) = (0usize, 0u64);
        let mut i = 0;
        while i < data.len() {
            let len = i - start;
            if len >= spec.min {
                fp = (fp << 1).wrapping_add(g.gear[data[i] as usize]);
                let mask = if len < spec.avg { g.mask_s } else { g.mask_l };
                if fp & mask == 0 || len + 1 == spec.max {
                    expect.push(i + 1 - start);
                    start = i + 1;
                    fp = 0;
                }
            }
            i += 1;
        }
        let mut got = vec![];
        let mut c = GearCutter::new(&spec);
        let mut rest = &data[..];
        while let Some(n) = c.next_cut(rest) {
            got.push(n);
            rest = &rest[n..];
        }
        assert_eq!(got, expect);
    }

    /// Pseudo-random bytes (xorshift64*).
    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
            })
            .collect()
    }

    /// Cuts `data` fed in pieces of `step` bytes.
    fn cuts(c: &mut GearCutter, data: &[u8], step: usize) -> Vec<usize> {
        let (mut out, mut from) = (vec![], 0);
        while from < data.len() {
            let end = (from + step).min(data.len());
            match c.next_cut(&data[from..end]) {
                Some(n) => {
                    from += n;
                    out.push(from);
                }
                None => from = end,
            }
        }
        out
    }

    #[test]
    fn the_unnormalized_mask_is_pinned() {
        assert_eq!(window_mask(7, 32), 0x4912_2400);
        for (bits, window) in [(7, 64), (12, 48), (24, 32), (6, 8)] {
            let m = window_mask(bits, window);
            assert_eq!(m.count_ones(), bits, "{bits} {window}");
            assert!(m < 1 << (window - 1), "{bits} {window}");
        }
    }

    /// docs/protocol.md's words for pieces, one byte at a time: skip 64, roll 32, then test
    /// after each byte; end at 2,048 bytes. (With no bytes rolled before the tests, as
    /// FastCDC's skipping does, the cuts differ.)
    #[test]
    fn unnormalized_cuts_are_the_documented_loop_fed_any_way() {
        let data = noise(200_000, 3);
        let g = GearCutter::new(&ChunkerSpec::default());
        let mask = 0x4912_2400u64;
        let (mut expect, mut start, mut fp) = (vec![], 0usize, 0u64);
        for (i, &b) in data.iter().enumerate() {
            let len = i - start + 1; // bytes of the piece so far, this one included
            if len > 64 {
                fp = (fp << 1).wrapping_add(g.gear[b as usize]);
            }
            if (len > 96 && fp & mask == 0) || len == 2048 {
                expect.push(i + 1);
                (start, fp) = (i + 1, 0);
            }
        }
        assert!(expect.len() > 700, "{}", expect.len());
        for step in [1, 7, 100, 4096, data.len()] {
            let mut c = GearCutter::unnormalized(96, 7, 32, 2048);
            assert_eq!(cuts(&mut c, &data, step), expect, "fed {step} at a time");
        }
    }
}
