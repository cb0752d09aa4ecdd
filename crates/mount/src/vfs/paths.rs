//! Paths below others: what a removal or a rename of a directory carries with it, found in the
//! mount's ordered maps by range rather than by a look at every path.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use ferry_proto::WirePath;

/// Whether `p` is `dir` or below it.
pub(super) fn is_below(p: &WirePath, dir: &WirePath) -> bool {
    let (p, d) = (p.as_bytes(), dir.as_bytes());
    d.is_empty() || p == d || (p.len() > d.len() && p.starts_with(d) && p[d.len()] == b'/')
}

/// A range of byte strings, as an ordered map of paths is searched by.
type ByteRange = (Bound<Vec<u8>>, Bound<Vec<u8>>);

/// The ranges of paths that are `dir` or below it ([`is_below`]) in byte order: `dir` itself,
/// and from `dir/` up to `dir0` (`'0'` follows `'/'`); every path for the root.
fn ranges(dir: &WirePath) -> Vec<ByteRange> {
    let d = dir.as_bytes();
    if d.is_empty() {
        return vec![(Bound::Unbounded, Bound::Unbounded)];
    }
    let with = |b: u8| [d, &[b]].concat();
    vec![
        (Bound::Included(d.to_vec()), Bound::Included(d.to_vec())),
        (Bound::Included(with(b'/')), Bound::Excluded(with(b'0'))),
    ]
}

fn borrowed(r: &ByteRange) -> (Bound<&[u8]>, Bound<&[u8]>) {
    (
        r.0.as_ref().map(Vec::as_slice),
        r.1.as_ref().map(Vec::as_slice),
    )
}

/// The entries of `m` whose paths are `dir` or below it.
pub(super) fn entries_below<'a, V>(
    m: &'a BTreeMap<WirePath, V>,
    dir: &WirePath,
) -> impl Iterator<Item = (&'a WirePath, &'a V)> {
    ranges(dir)
        .into_iter()
        .flat_map(move |r| m.range::<[u8], _>(borrowed(&r)))
}

/// The paths of `m` that are `dir` or below it.
fn keys_below<V>(m: &BTreeMap<WirePath, V>, dir: &WirePath) -> Vec<WirePath> {
    entries_below(m, dir).map(|(k, _)| k.clone()).collect()
}

/// Removes from `m` what is `dir` or below it.
pub(super) fn remove_below<V>(m: &mut BTreeMap<WirePath, V>, dir: &WirePath) {
    for k in keys_below(m, dir) {
        m.remove(&k);
    }
}

/// Removes from `s` what is `dir` or below it.
pub(super) fn remove_below_in_set(s: &mut BTreeSet<WirePath>, dir: &WirePath) {
    let gone: Vec<WirePath> = ranges(dir)
        .iter()
        .flat_map(|r| s.range::<[u8], _>(borrowed(r)))
        .cloned()
        .collect();
    for k in gone {
        s.remove(&k);
    }
}

/// `p` (below `from`) moved below `to`; `None` if that path would be too long to name.
pub(super) fn rebase(p: &WirePath, from: &WirePath, to: &WirePath) -> Option<WirePath> {
    let rest = &p.as_bytes()[from.as_bytes().len()..];
    let mut v = to.as_bytes().to_vec();
    v.extend_from_slice(rest);
    WirePath::new(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> WirePath {
        WirePath::new(s.as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn paths_below_and_rebased() {
        assert!(is_below(&p("a/b"), &p("a")));
        assert!(is_below(&p("a"), &p("a")));
        assert!(!is_below(&p("ab"), &p("a")));
        assert!(is_below(&p("x"), &p("")));
        assert_eq!(rebase(&p("a/b/c"), &p("a/b"), &p("d")), Some(p("d/c")));
        assert_eq!(rebase(&p("a"), &p("a"), &p("z/y")), Some(p("z/y")));
        // A path that would pass 4096 bytes under the new name has none (no panic).
        let deep = p(&format!("a/{}", "x".repeat(4000)));
        assert_eq!(rebase(&deep, &p("a"), &p(&"b".repeat(200))), None);
    }

    /// The ranges find exactly what `is_below` says, in a map holding the neighbours that
    /// sort between and around them (`a.b`, `a-`, `a0`, `ab`: '-' and '.' sort before '/').
    #[test]
    fn the_paths_below_a_directory_are_found_by_range() {
        let all = [
            "a", "a-", "a.b", "a/b", "a/b/c", "a/z", "a0", "ab", "b", "b/a", "a/b-", "a/b0",
        ];
        let mut m: BTreeMap<WirePath, u8> = all.iter().map(|s| (p(s), 0)).collect();
        for dir in ["", "a", "a/b", "b", "a.b", "c"] {
            let want: Vec<WirePath> = m.keys().filter(|k| is_below(k, &p(dir))).cloned().collect();
            let mut got = keys_below(&m, &p(dir));
            got.sort();
            assert_eq!(got, want, "below {dir:?}");
        }
        let mut set: BTreeSet<WirePath> = m.keys().cloned().collect();
        remove_below(&mut m, &p("a"));
        remove_below_in_set(&mut set, &p("a"));
        let left: Vec<WirePath> = m.keys().cloned().collect();
        assert_eq!(left, ["a-", "a.b", "a0", "ab", "b", "b/a"].map(p));
        assert!(set.iter().eq(left.iter()));
    }
}
