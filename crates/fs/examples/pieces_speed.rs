//! How long cutting pieces (docs/protocol.md, "Chunks against old data") and keying them take,
//! beside cutting and hashing the same bytes into chunks: the files named, read whole, three
//! times each.
//!
//!     cargo run --release -p ferry-fs --example pieces_speed -- FILE...
use std::time::Instant;

fn main() {
    let mut data = vec![];
    for p in std::env::args().skip(1) {
        data.extend(std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}")));
    }
    let spec = ferry_chunk::ChunkerSpec::default();
    for _ in 0..3 {
        let t = Instant::now();
        let pieces = ferry_fs::delta::pieces(&data);
        let cut = t.elapsed();
        let t = Instant::now();
        let keys: Vec<u64> = pieces
            .iter()
            .map(|r| ferry_fs::delta::piece_key(&data[r.clone()], 8))
            .collect();
        let keyed = t.elapsed();
        let t = Instant::now();
        let chunked = ferry_format::chunk_object::<_, std::io::Error, _>(
            &data[..],
            &spec,
            ferry_format::HashAlg::Blake3,
            |_, _| Ok(()),
        );
        let chunks = chunked.map_or(0, |(r, _)| r.chunks().len());
        println!(
            "{} bytes: {} pieces cut in {cut:?}, keyed in {keyed:?} ({} keys); \
             {chunks} chunks cut and hashed in {:?}",
            data.len(),
            pieces.len(),
            keys.len(),
            t.elapsed()
        );
    }
}
