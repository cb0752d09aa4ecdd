//! The S3 store's decoders from arbitrary bytes: a pack's tail (as a hostile or damaged bucket
//! may hand it over, for any claimed pack size) and `s3://` locators. No panic, bounded
//! allocation, and every entry that parses lies inside the pack.

use ferry_format::HashAlg;
use ferry_s3::pack::{parse_tail, tail_len, FOOTER, HEADER};

/// One input.
pub fn run(data: &[u8]) {
    let _ = ferry_s3::Locator::parse(&String::from_utf8_lossy(data));
    if data.len() < 8 {
        return;
    }
    // The first 8 bytes claim a pack size; the rest is the tail the bucket sent.
    let claimed = u64::from_le_bytes(data[..8].try_into().unwrap()) % (1 << 34);
    let tail = &data[8..];
    for (alg, size) in [
        (HashAlg::Blake3, claimed),
        (HashAlg::Sha256, claimed),
        (HashAlg::Blake3, tail.len() as u64),
    ] {
        if let Ok(n) = tail_len(tail, size) {
            assert!(n <= size && n >= FOOTER as u64);
        }
        if let Ok(entries) = parse_tail(alg, tail, size) {
            let mut end = HEADER as u64;
            for e in &entries {
                assert_eq!(e.offset, end);
                end += e.stored_len as u64;
                assert!(end <= size);
                assert_eq!(e.id.alg(), alg);
            }
        }
    }
}
