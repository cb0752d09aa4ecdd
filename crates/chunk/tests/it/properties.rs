//! Properties every chunker keeps.

use ferry_chunk::{cut_lengths, Algorithm, ChunkReader};
use proptest::prelude::*;

use crate::{all_specs, random_bytes};

fn chunks_of(spec: &ferry_chunk::ChunkerSpec, data: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![];
    let mut r = ChunkReader::new(data, spec.build());
    while let Some(c) = r.next_chunk().unwrap() {
        out.push(c.data.to_vec());
    }
    out
}

/// A reader that hands out at most the next of `steps` bytes per read.
struct Trickle<'a> {
    data: &'a [u8],
    steps: &'a [usize],
    k: usize,
}

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.steps[self.k % self.steps.len()]
            .min(buf.len())
            .min(self.data.len());
        self.k += 1;
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// A reader's chunks are the whole buffer's, however its reads are cut and whatever the
    /// length: through the buffer's growth from small and its compaction once full.
    #[test]
    fn a_reader_cuts_as_the_whole_buffer(
        seed in any::<u64>(),
        len in prop_oneof![0usize..40_000, 0usize..3_000_000],
        steps in proptest::collection::vec(1usize..300_000, 1..8),
    ) {
        let data = random_bytes(&seed.to_string(), len);
        for (name, spec) in all_specs() {
            let whole = cut_lengths(&mut *spec.build(), &data);
            let src = Trickle { data: &data, steps: &steps, k: 0 };
            let mut r = ChunkReader::new(src, spec.build());
            let (mut got, mut at) = (vec![], 0u64);
            while let Some(c) = r.next_chunk().unwrap() {
                prop_assert_eq!(c.offset, at, "{}", name);
                prop_assert_eq!(c.data, &data[at as usize..at as usize + c.data.len()], "{}", name);
                at += c.data.len() as u64;
                got.push(c.data.len());
            }
            prop_assert_eq!(&got, &whole, "{}", name);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Cut points do not depend on how the input is split into buffers.
    #[test]
    fn cuts_independent_of_buffer_splits(
        seed in any::<u64>(),
        len in 0usize..400_000,
        splits in proptest::collection::vec(1usize..70_000, 1..40),
    ) {
        let data = random_bytes(&seed.to_string(), len);
        for (name, spec) in all_specs() {
            let whole = cut_lengths(&mut *spec.build(), &data);
            let mut c = spec.build();
            let mut got = vec![];
            let mut cur = 0usize;
            let mut pos = 0usize;
            let mut k = 0;
            while pos < data.len() {
                let step = splits[k % splits.len()].min(data.len() - pos);
                k += 1;
                let mut piece = &data[pos..pos + step];
                while let Some(n) = c.next_cut(piece) {
                    got.push(cur + n);
                    cur = 0;
                    piece = &piece[n..];
                }
                cur += piece.len();
                pos += step;
            }
            if cur > 0 { got.push(cur); }
            prop_assert_eq!(&got, &whole, "{}", name);
            prop_assert_eq!(whole.iter().sum::<usize>(), data.len());
        }
    }

    /// Every chunk but the last is at least `min`; every chunk is at most `max`.
    #[test]
    fn min_and_max_respected(seed in any::<u64>(), len in 1usize..600_000, zeros in 0usize..200_000) {
        let mut data = random_bytes(&seed.to_string(), len);
        data.splice(len / 2..len / 2, std::iter::repeat_n(0u8, zeros));
        for (name, spec) in all_specs() {
            let lens = cut_lengths(&mut *spec.build(), &data);
            let (last, body) = lens.split_last().unwrap();
            prop_assert!(*last <= spec.max && *last > 0, "{}", name);
            for &l in body {
                prop_assert!(l >= spec.min && l <= spec.max, "{}: chunk of {} bytes", name, l);
            }
        }
    }

    /// An insertion or deletion of a few bytes changes only the chunks next to it: every chunk
    /// that ends before the edit is kept, and the chunk streams resynchronise right after it.
    #[test]
    fn edits_stay_local(seed in any::<u64>(), at in 0.0f64..1.0, del in 0usize..40, ins in proptest::collection::vec(any::<u8>(), 0..40)) {
        let data = random_bytes(&seed.to_string(), 1_000_000);
        let at = (at * (data.len() - del) as f64) as usize;
        let mut edited = data.clone();
        edited.splice(at..at + del, ins.iter().copied());
        for (name, spec) in all_specs() {
            if spec.algorithm == Algorithm::Fixed { continue; }
            let old = chunks_of(&spec, &data);
            let new = chunks_of(&spec, &edited);
            let old_set: std::collections::HashSet<&Vec<u8>> = old.iter().collect();
            let fresh: Vec<usize> = new.iter().filter(|c| !old_set.contains(c)).map(|c| c.len()).collect();
            // Chunks ending before the edit are untouched.
            let mut off = 0;
            for (o, n) in old.iter().zip(&new) {
                if off + o.len() > at { break; }
                prop_assert_eq!(o, n, "{}", name);
                off += o.len();
            }
            // The changed region is bounded, not the tail of the file. (Resynchronisation takes a
            // geometric number of chunks; `edits_resynchronise_quickly` checks the typical cost.)
            let fresh_bytes: usize = fresh.iter().sum();
            prop_assert!(fresh_bytes <= 64 * spec.avg + ins.len(), "{}: {} new chunks ({} bytes) after a {}-byte edit", name, fresh.len(), fresh_bytes, del + ins.len());
        }
    }
}

#[test]
fn average_chunk_size_is_near_target() {
    let data = random_bytes("average", 8 << 20);
    for (name, spec) in all_specs() {
        let lens = cut_lengths(&mut *spec.build(), &data);
        let avg = data.len() / lens.len();
        // Content-defined averages land near the target (min-skipping adds about min/2).
        assert!(
            avg > spec.avg * 3 / 4 && avg < spec.avg * 7 / 4,
            "{name}: average {avg} for target {}",
            spec.avg
        );
    }
}

#[test]
fn keyed_cut_points_differ_from_unkeyed_and_between_keys() {
    let data = random_bytes("keyed", 1 << 20);
    for spec in [
        ferry_chunk::ChunkerSpec::lbfs(),
        ferry_chunk::ChunkerSpec::default(),
    ] {
        let plain = cut_lengths(&mut *spec.build(), &data);
        let k1 = cut_lengths(
            &mut *spec.clone().keyed(ferry_chunk::Key([1; 32])).build(),
            &data,
        );
        let k2 = cut_lengths(
            &mut *spec.clone().keyed(ferry_chunk::Key([2; 32])).build(),
            &data,
        );
        assert_ne!(plain, k1);
        assert_ne!(k1, k2);
    }
}

/// Resynchronisation after an edit, measured over 200 fixed edits: the median edit costs at
/// most 3 average chunks and 95 % of edits at most 8 (a chunker that shifts like fixed blocks
/// would cost the whole tail of the buffer).
#[test]
fn edits_resynchronise_quickly() {
    for (name, spec) in all_specs() {
        if spec.algorithm == Algorithm::Fixed {
            continue;
        }
        let mut costs = vec![];
        for seed in 0..200u64 {
            let data = random_bytes(&format!("resync {seed}"), 300_000);
            let at = (seed as usize * 7919) % 290_000;
            let mut edited = data.clone();
            edited.splice(
                at..at + (seed as usize % 40),
                (0..seed % 3).map(|b| b as u8),
            );
            let old = chunks_of(&spec, &data);
            let old_set: std::collections::HashSet<&Vec<u8>> = old.iter().collect();
            let fresh: usize = chunks_of(&spec, &edited)
                .iter()
                .filter(|c| !old_set.contains(c))
                .map(|c| c.len())
                .sum();
            costs.push(fresh as f64 / spec.avg as f64);
        }
        costs.sort_by(f64::total_cmp);
        let (median, p95) = (costs[costs.len() / 2], costs[costs.len() * 95 / 100]);
        assert!(
            median <= 3.0 && p95 <= 8.0,
            "{name}: median {median:.1}, p95 {p95:.1} average chunks per edit"
        );
    }
}
