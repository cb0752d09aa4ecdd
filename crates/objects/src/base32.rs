//! The text forms' base32: RFC 4648's alphabet, lower case, unpadded (read in either case).

pub fn encode(b: &[u8]) -> String {
    data_encoding::BASE32_NOPAD.encode(b).to_ascii_lowercase()
}

pub fn decode(s: &str) -> Result<Vec<u8>, String> {
    data_encoding::BASE32_NOPAD
        .decode(s.to_ascii_uppercase().as_bytes())
        .map_err(|e| format!("not base32 ({e})"))
}
