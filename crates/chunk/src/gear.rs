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
        }
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
        if self.len < self.min {
            i = (self.min - self.len).min(data.len());
            self.len += i;
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
}
