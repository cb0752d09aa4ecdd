//! Golden vectors: the offset, length and BLAKE3 of every chunk of a fixed input, for every
//! published chunker. Cut points are a format; if this test fails, a published algorithm
//! changed, which is never allowed (add a new version instead).
//!
//! To write the fixtures for a *new* algorithm: `FERRY_BLESS=1 cargo test -p ferry-chunk golden`.

use std::fmt::Write;
use std::path::PathBuf;

use ferry_chunk::ChunkReader;

use crate::{all_specs, random_bytes};

/// The golden input: 1 MiB of pseudo-random bytes, 200 KiB of zeros (no content-defined cut
/// can occur there, so the maximum must), then 300 KiB of repetitive text.
pub fn golden_input() -> Vec<u8> {
    let mut v = random_bytes("golden input v1", 1 << 20);
    v.extend(std::iter::repeat_n(0u8, 200 * 1024));
    let mut n = 0;
    while v.len() < (1 << 20) + 500 * 1024 {
        n += 1;
        v.extend_from_slice(
            format!(
                "line {n}: the quick brown fox jumps over {} lazy dogs\n",
                n * 7 % 1000
            )
            .as_bytes(),
        );
    }
    v
}

#[test]
fn golden_vectors() {
    let input = golden_input();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for (name, spec) in all_specs() {
        let mut text = format!("# {}\n# offset length blake3\n", spec.describe());
        // Read in odd-sized pieces to exercise the streaming path as well.
        let src = ReadInPieces(&input[..], 77_777);
        let mut r = ChunkReader::new(src, spec.build());
        while let Some(c) = r.next_chunk().unwrap() {
            writeln!(
                text,
                "{} {} {}",
                c.offset,
                c.data.len(),
                blake3::hash(c.data).to_hex()
            )
            .unwrap();
        }
        let path = dir.join(format!("golden-{name}.txt"));
        if std::env::var_os("FERRY_BLESS").is_some() && !path.exists() {
            std::fs::write(&path, &text).unwrap();
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (new algorithm? see module docs)", path.display()));
        assert!(
            want == text,
            "cut points of published chunker {name} changed ({})",
            path.display()
        );
    }
}

/// A reader that returns at most `n` bytes per read.
struct ReadInPieces<'a>(&'a [u8], usize);

impl std::io::Read for ReadInPieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.0.len().min(buf.len()).min(self.1);
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}
