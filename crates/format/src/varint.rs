//! Unsigned LEB128 (`docs/formats.md`, "Varint"), minimal encodings only (so every value has
//! exactly one encoding and golden bytes stay golden).

use crate::FormatError;

/// Appends `v`.
pub fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads a varint from the front of `buf`, advancing it.
pub fn get(buf: &mut &[u8], what: &'static str) -> Result<u64, FormatError> {
    let mut v: u64 = 0;
    for i in 0..10 {
        let Some((&b, rest)) = buf.split_first() else {
            return Err(FormatError::Truncated { what });
        };
        *buf = rest;
        let low = (b & 0x7f) as u64;
        if i == 9 && b > 1 {
            return Err(FormatError::BadVarint);
        }
        v |= low << (7 * i);
        if b & 0x80 == 0 {
            if b == 0 && i > 0 {
                return Err(FormatError::BadVarint);
            }
            return Ok(v);
        }
    }
    Err(FormatError::BadVarint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_reject_overlong() {
        for v in [0, 1, 127, 128, 300, 16383, 16384, u32::MAX as u64, u64::MAX] {
            let mut b = vec![];
            put(&mut b, v);
            let mut s = &b[..];
            assert_eq!(get(&mut s, "t").unwrap(), v);
            assert!(s.is_empty());
        }
        let mut b = vec![0x80, 0x00];
        assert_eq!(get(&mut &b[..], "t"), Err(FormatError::BadVarint));
        b = vec![0xff; 10];
        assert_eq!(get(&mut &b[..], "t"), Err(FormatError::BadVarint));
        b = vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert_eq!(get(&mut &b[..], "t"), Err(FormatError::BadVarint));
        assert!(matches!(
            get(&mut &[0x80u8][..], "t"),
            Err(FormatError::Truncated { .. })
        ));
    }
}
