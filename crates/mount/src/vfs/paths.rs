//! Paths below others: what a removal or a rename of a directory carries with it, found in the
//! mount's ordered maps by range rather than by a look at every path.

use std::collections::BTreeMap;
use std::ops::Bound;

use ferry_proto::WirePath;

/// Whether `p` is `dir` or below it.
pub(super) fn is_below(p: &WirePath, dir: &WirePath) -> bool {
    let (p, d) = (p.as_bytes(), dir.as_bytes());
    d.is_empty() || p == d || (p.len() > d.len() && p.starts_with(d) && p[d.len()] == b'/')
}

/// The paths of `keys` that are `dir` or below it ([`is_below`]), found as ranges of an
/// ordered map or set: `dir` itself, and from `dir/` up to `dir0` (`'0'` follows `'/'`).
pub(super) fn below<'a, I: Iterator<Item = &'a WirePath>>(
    keys: impl Fn((Bound<&[u8]>, Bound<&[u8]>)) -> I,
    dir: &WirePath,
) -> Vec<WirePath> {
    let d = dir.as_bytes();
    if d.is_empty() {
        return keys((Bound::Unbounded, Bound::Unbounded))
            .cloned()
            .collect();
    }
    let with = |b: u8| [d, &[b]].concat();
    let (from, to) = (with(b'/'), with(b'0'));
    let mut out: Vec<WirePath> = keys((Bound::Included(d), Bound::Included(d)))
        .cloned()
        .collect();
    out.extend(
        keys((
            Bound::Included(from.as_slice()),
            Bound::Excluded(to.as_slice()),
        ))
        .cloned(),
    );
    out
}

/// The paths of `m` that are `dir` or below it.
pub(super) fn keys_below<V>(m: &BTreeMap<WirePath, V>, dir: &WirePath) -> Vec<WirePath> {
    below(|r| m.range::<[u8], _>(r).map(|(k, _)| k), dir)
}

/// Removes from `m` what is `dir` or below it.
pub(super) fn remove_below<V>(m: &mut BTreeMap<WirePath, V>, dir: &WirePath) {
    for k in keys_below(m, dir) {
        m.remove(&k);
    }
}

/// `p` (below `from`) moved to below `to`.
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
        remove_below(&mut m, &p("a"));
        let left: Vec<WirePath> = m.keys().cloned().collect();
        assert_eq!(left, ["a-", "a.b", "a0", "ab", "b", "b/a"].map(p));
    }
}
