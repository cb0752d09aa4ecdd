//! The object service's formats from arbitrary bytes: capabilities (binary and text), directory
//! listings and inodes. No panic, bounded allocation, and what decodes re-encodes to the same
//! bytes (all three are canonical).

use ferry_objects::inode::Inode;
use ferry_objects::{Capability, Listing};

/// One input.
pub fn run(data: &[u8]) {
    if let Ok(c) = Capability::from_bytes(data) {
        assert_eq!(c.to_bytes(), data);
        assert_eq!(c.to_string().parse::<Capability>().unwrap(), c);
    }
    let _ = String::from_utf8_lossy(data).parse::<Capability>();
    if let Ok(l) = Listing::decode(data) {
        assert_eq!(l.encode(), data);
    }
    if let Ok(i) = Inode::decode(data) {
        assert_eq!(i.encode(), data);
    }
}
