//! Recipe diffs: OceanStore's file-summary diff.
//!
//! When an object changes, its new recipe mostly repeats the old one. A [`RecipeDiff`] says how
//! to get from old to new as runs of *keep n*, *delete n* and *insert these chunks*, so an update
//! costs in proportion to the change, not to the object. It is computed with Myers' O(ND)
//! algorithm on the chunk sequences after stripping their common prefix and suffix; when the
//! middle differs in more than [`MAX_EDIT_DISTANCE`] places (a rewrite, not an edit) it falls
//! back to replacing the middle whole, which is correct and costs no more than sending the new
//! recipe.

use crate::recipe::read_entry;
use crate::{varint, ChunkRef, FormatError, HashAlg, Recipe};

const DIFF_MAGIC: &[u8; 4] = b"FRDF";
const DIFF_VERSION: u8 = 1;
/// Beyond this many single-chunk edits Myers' trace (O(D²) memory) is not worth keeping.
pub const MAX_EDIT_DISTANCE: usize = 2048;

/// One run of a diff.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiffOp {
    /// The next `n` chunks of the old recipe stay.
    Keep(u64),
    /// The next `n` chunks of the old recipe go.
    Delete(u64),
    /// These chunks are inserted here.
    Insert(Vec<ChunkRef>),
}

/// Runs that turn one recipe into another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecipeDiff {
    pub alg: HashAlg,
    pub ops: Vec<DiffOp>,
}

impl RecipeDiff {
    /// The diff from `old` to `new` (which must use the same hash algorithm).
    pub fn between(old: &Recipe, new: &Recipe) -> Result<RecipeDiff, FormatError> {
        if old.alg() != new.alg() {
            return Err(FormatError::MixedHashAlgs(
                old.alg().name(),
                new.alg().name(),
            ));
        }
        let (a, b) = (old.chunks(), new.chunks());
        let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
        let (a2, b2) = (&a[prefix..], &b[prefix..]);
        let suffix = a2
            .iter()
            .rev()
            .zip(b2.iter().rev())
            .take_while(|(x, y)| x == y)
            .count();
        let (am, bm) = (&a2[..a2.len() - suffix], &b2[..b2.len() - suffix]);

        let mut ops = Ops::default();
        ops.keep(prefix as u64);
        match myers(am, bm) {
            Some(edits) => {
                for e in edits {
                    match e {
                        Edit::Keep => ops.keep(1),
                        Edit::Delete => ops.delete(1),
                        Edit::Insert(i) => ops.insert(bm[i]),
                    }
                }
            }
            None => {
                ops.delete(am.len() as u64);
                for c in bm {
                    ops.insert(*c);
                }
            }
        }
        ops.keep(suffix as u64);
        Ok(RecipeDiff {
            alg: old.alg(),
            ops: ops.0,
        })
    }

    /// Applies the diff to `old`. Fails if the diff does not fit `old` exactly (it keeps or
    /// deletes more chunks than there are, or leaves some unaccounted for).
    pub fn apply(&self, old: &Recipe) -> Result<Recipe, FormatError> {
        if old.alg() != self.alg {
            return Err(FormatError::MixedHashAlgs(
                old.alg().name(),
                self.alg.name(),
            ));
        }
        let src = old.chunks();
        let mut pos = 0usize;
        let mut out = Recipe::new(self.alg);
        for op in &self.ops {
            match op {
                DiffOp::Keep(n) | DiffOp::Delete(n) => {
                    let end = usize::try_from(*n)
                        .ok()
                        .and_then(|n| pos.checked_add(n))
                        .filter(|&e| e <= src.len())
                        .ok_or(FormatError::DiffMismatch(
                            "runs past the end of the old recipe",
                        ))?;
                    if matches!(op, DiffOp::Keep(_)) {
                        for c in &src[pos..end] {
                            out.push(*c)?;
                        }
                    }
                    pos = end;
                }
                DiffOp::Insert(cs) => {
                    for c in cs {
                        out.push(*c)?;
                    }
                }
            }
        }
        if pos != src.len() {
            return Err(FormatError::DiffMismatch(
                "leaves chunks of the old recipe unaccounted for",
            ));
        }
        Ok(out)
    }

    /// Chunks inserted by the diff.
    pub fn inserted(&self) -> impl Iterator<Item = &ChunkRef> {
        self.ops.iter().flat_map(|op| match op {
            DiffOp::Insert(cs) => cs.as_slice(),
            _ => &[],
        })
    }

    /// The binary encoding (`docs/formats.md`, "Recipe diff v1").
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(DIFF_MAGIC);
        out.push(DIFF_VERSION);
        out.push(self.alg.tag());
        varint::put(&mut out, self.ops.len() as u64);
        for op in &self.ops {
            match op {
                DiffOp::Keep(n) => {
                    out.push(1);
                    varint::put(&mut out, *n);
                }
                DiffOp::Delete(n) => {
                    out.push(2);
                    varint::put(&mut out, *n);
                }
                DiffOp::Insert(cs) => {
                    out.push(3);
                    varint::put(&mut out, cs.len() as u64);
                    for c in cs {
                        varint::put(&mut out, c.len as u64);
                        out.extend_from_slice(c.id.digest());
                    }
                }
            }
        }
        out
    }

    /// Parses the binary encoding, bounding every count by the bytes that remain.
    pub fn decode(mut buf: &[u8]) -> Result<RecipeDiff, FormatError> {
        const WHAT: &str = "recipe diff";
        if buf.len() < 6 {
            return Err(FormatError::Truncated { what: WHAT });
        }
        if &buf[..4] != DIFF_MAGIC {
            return Err(FormatError::BadMagic { what: WHAT });
        }
        if buf[4] != DIFF_VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: WHAT,
                version: buf[4],
                supported: DIFF_VERSION,
            });
        }
        let alg = HashAlg::from_tag(buf[5])?;
        buf = &buf[6..];
        let count = varint::get(&mut buf, WHAT)?;
        let bound = |count: u64, per: usize, buf: &[u8]| {
            if count > (buf.len() / per) as u64 {
                Err(FormatError::CountTooLarge {
                    what: WHAT,
                    count,
                    available: buf.len(),
                })
            } else {
                Ok(count as usize)
            }
        };
        let count = bound(count, 2, buf)?;
        let mut ops = Vec::with_capacity(count);
        for _ in 0..count {
            let Some((&tag, rest)) = buf.split_first() else {
                return Err(FormatError::Truncated { what: WHAT });
            };
            buf = rest;
            let n = varint::get(&mut buf, WHAT)?;
            ops.push(match tag {
                1 => DiffOp::Keep(n),
                2 => DiffOp::Delete(n),
                3 => {
                    let n = bound(n, crate::ID_BYTES + 1, buf)?;
                    let mut cs = Vec::with_capacity(n);
                    for _ in 0..n {
                        let (id, len) = read_entry(&mut buf, alg, WHAT)?;
                        cs.push(ChunkRef { id, len });
                    }
                    DiffOp::Insert(cs)
                }
                t => return Err(FormatError::UnknownDiffOp(t)),
            });
        }
        if !buf.is_empty() {
            return Err(FormatError::Trailing {
                what: WHAT,
                extra: buf.len(),
            });
        }
        Ok(RecipeDiff { alg, ops })
    }
}

/// Builds coalesced runs.
#[derive(Default)]
struct Ops(Vec<DiffOp>);

impl Ops {
    fn keep(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        if let Some(DiffOp::Keep(m)) = self.0.last_mut() {
            *m += n;
        } else {
            self.0.push(DiffOp::Keep(n));
        }
    }

    fn delete(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        if let Some(DiffOp::Delete(m)) = self.0.last_mut() {
            *m += n;
        } else {
            self.0.push(DiffOp::Delete(n));
        }
    }

    fn insert(&mut self, c: ChunkRef) {
        if let Some(DiffOp::Insert(cs)) = self.0.last_mut() {
            cs.push(c);
        } else {
            self.0.push(DiffOp::Insert(vec![c]));
        }
    }
}

#[derive(Debug, PartialEq)]
enum Edit {
    Keep,
    Delete,
    /// Insert `b[i]`.
    Insert(usize),
}

/// Myers' greedy shortest edit script, or `None` if it needs more than [`MAX_EDIT_DISTANCE`]
/// edits.
fn myers(a: &[ChunkRef], b: &[ChunkRef]) -> Option<Vec<Edit>> {
    let (n, m) = (a.len() as isize, b.len() as isize);
    let max = (n + m) as usize;
    if max == 0 {
        return Some(vec![]);
    }
    let limit = max.min(MAX_EDIT_DISTANCE) as isize;
    let off = limit + 1;
    let mut v = vec![0isize; 2 * limit as usize + 3];
    // trace[d] is v[k] for k in -d..=d as it was before step d.
    let mut trace: Vec<Vec<isize>> = Vec::new();
    let mut found = None;
    'outer: for d in 0..=limit {
        trace.push(v[(off - d) as usize..=(off + d) as usize].to_vec());
        let mut k = -d;
        while k <= d {
            let mut x =
                if k == -d || (k != d && v[(off + k - 1) as usize] < v[(off + k + 1) as usize]) {
                    v[(off + k + 1) as usize]
                } else {
                    v[(off + k - 1) as usize] + 1
                };
            let mut y = x - k;
            while x < n && y < m && a[x as usize] == b[y as usize] {
                x += 1;
                y += 1;
            }
            v[(off + k) as usize] = x;
            if x >= n && y >= m {
                found = Some(d);
                break 'outer;
            }
            k += 2;
        }
    }
    let dmax = found?;
    let mut edits = Vec::with_capacity((n + m) as usize);
    let (mut x, mut y) = (n, m);
    for d in (1..=dmax).rev() {
        let vd = &trace[d as usize];
        let at = |k: isize| vd[(k + d) as usize];
        let k = x - y;
        let prev_k = if k == -d || (k != d && at(k - 1) < at(k + 1)) {
            k + 1
        } else {
            k - 1
        };
        let prev_x = at(prev_k);
        let prev_y = prev_x - prev_k;
        while x > prev_x && y > prev_y {
            edits.push(Edit::Keep);
            x -= 1;
            y -= 1;
        }
        if x == prev_x {
            edits.push(Edit::Insert(prev_y as usize));
        } else {
            edits.push(Edit::Delete);
        }
        x = prev_x;
        y = prev_y;
    }
    while x > 0 && y > 0 {
        edits.push(Edit::Keep);
        x -= 1;
        y -= 1;
    }
    edits.reverse();
    Some(edits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Id, ID_BYTES};
    use proptest::prelude::*;

    fn r(ns: &[u8]) -> Recipe {
        Recipe::from_chunks(
            HashAlg::Blake3,
            ns.iter()
                .map(|&n| ChunkRef {
                    id: Id::from_parts(HashAlg::Blake3, [n; ID_BYTES]),
                    len: 100 + n as u32,
                })
                .collect(),
        )
        .unwrap()
    }

    fn edit_count(d: &RecipeDiff) -> u64 {
        d.ops
            .iter()
            .map(|op| match op {
                DiffOp::Keep(_) => 0,
                DiffOp::Delete(n) => *n,
                DiffOp::Insert(cs) => cs.len() as u64,
            })
            .sum()
    }

    #[test]
    fn small_cases() {
        let d = RecipeDiff::between(&r(&[1, 2, 3, 4, 5]), &r(&[1, 2, 9, 4, 5, 6])).unwrap();
        assert_eq!(d.ops.len(), 5);
        assert_eq!(edit_count(&d), 3);
        assert_eq!(
            d.apply(&r(&[1, 2, 3, 4, 5])).unwrap(),
            r(&[1, 2, 9, 4, 5, 6])
        );
        let same = RecipeDiff::between(&r(&[1, 2]), &r(&[1, 2])).unwrap();
        assert_eq!(same.ops, vec![DiffOp::Keep(2)]);
        let empty = RecipeDiff::between(&r(&[]), &r(&[])).unwrap();
        assert!(empty.ops.is_empty());
        // Middle edits (not only prefix/suffix) go through Myers.
        let d = RecipeDiff::between(&r(&[1, 7, 2, 3, 8, 4]), &r(&[1, 2, 3, 9, 4])).unwrap();
        assert_eq!(edit_count(&d), 3); // delete 7, delete 8, insert 9
    }

    #[test]
    fn apply_rejects_diffs_that_do_not_fit() {
        let d = RecipeDiff {
            alg: HashAlg::Blake3,
            ops: vec![DiffOp::Keep(3)],
        };
        assert!(d.apply(&r(&[1, 2])).is_err());
        assert!(d.apply(&r(&[1, 2, 3, 4])).is_err());
        let d = RecipeDiff {
            alg: HashAlg::Blake3,
            ops: vec![DiffOp::Delete(u64::MAX)],
        };
        assert!(d.apply(&r(&[1])).is_err());
    }

    #[test]
    fn encoding_is_pinned() {
        let d = RecipeDiff::between(&r(&[1, 2, 3]), &r(&[1, 4, 3])).unwrap();
        let mut want = b"FRDF\x01\x01\x04".to_vec(); // magic, version, blake3, 4 ops
        want.extend_from_slice(&[1, 1]); // keep 1
        want.extend_from_slice(&[2, 1]); // delete 1
        want.extend_from_slice(&[3, 1, 104]); // insert 1 chunk of 104 bytes
        want.extend_from_slice(&[4; 32]);
        want.extend_from_slice(&[1, 1]); // keep 1
        assert_eq!(d.encode(), want);
        assert_eq!(RecipeDiff::decode(&want).unwrap(), d);
        let mut bad = b"FRDF\x01\x01\x01\x03".to_vec();
        varint::put(&mut bad, u64::MAX);
        assert!(matches!(
            RecipeDiff::decode(&bad),
            Err(FormatError::CountTooLarge { .. })
        ));
        assert_eq!(
            RecipeDiff::decode(b"FRDF\x01\x01\x01\x07\x00"),
            Err(FormatError::UnknownDiffOp(7))
        );
    }

    #[test]
    fn rewrites_fall_back_to_replacement() {
        let old: Vec<u8> = (0..=255).cycle().take(3000).map(|x: u16| x as u8).collect();
        let new: Vec<u8> = old.iter().map(|x| x.wrapping_add(1)).rev().collect();
        let (a, b) = (r(&old), r(&new));
        let d = RecipeDiff::between(&a, &b).unwrap();
        assert_eq!(d.apply(&a).unwrap(), b);
    }

    proptest! {
        #[test]
        fn apply_inverts_between(old in proptest::collection::vec(0u8..20, 0..200),
                                 edits in proptest::collection::vec((any::<prop::sample::Index>(), 0usize..4, proptest::collection::vec(0u8..30, 0..4)), 0..6)) {
            let mut new = old.clone();
            let mut budget = 0u64;
            for (at, del, ins) in &edits {
                let at = at.index(new.len() + 1);
                let del = del.min(&(new.len() - at)).to_owned();
                new.splice(at..at + del, ins.iter().copied());
                budget += (del + ins.len()) as u64;
            }
            let (a, b) = (r(&old), r(&new));
            let d = RecipeDiff::between(&a, &b).unwrap();
            prop_assert_eq!(d.apply(&a).unwrap(), b);
            // Myers is minimal, so never worse than the edits that were made.
            prop_assert!(edit_count(&d) <= budget);
            prop_assert_eq!(RecipeDiff::decode(&d.encode()).unwrap(), d);
        }
    }
}
