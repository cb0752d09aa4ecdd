//! Recipes and recipe diffs from arbitrary bytes: no panic, bounded allocation, and a decoded
//! value re-encodes to the same bytes (encodings are canonical).

use ferry_format::{Recipe, RecipeDiff};

/// One input.
pub fn run(data: &[u8]) {
    if let Ok(r) = Recipe::decode(data) {
        assert_eq!(r.encode(), data);
    }
    if let Ok(d) = RecipeDiff::decode(data) {
        assert_eq!(d.encode(), data);
        let _ = d.apply(&Recipe::new(d.alg));
    }
}
