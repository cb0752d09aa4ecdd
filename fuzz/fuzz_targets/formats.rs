//! Recipes and recipe diffs from arbitrary bytes: no panic, bounded allocation, and a decoded
//! value re-encodes to the same bytes (encodings are canonical).
#![no_main]

use ferry_format::{Recipe, RecipeDiff};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = Recipe::decode(data) {
        assert_eq!(r.encode(), data);
    }
    if let Ok(d) = RecipeDiff::decode(data) {
        assert_eq!(d.encode(), data);
        let _ = d.apply(&Recipe::new(d.alg));
    }
});
