//! Quick min-of-N throughput of each chunker (robust to a noisy machine):
//! `cargo run --release -p ferry-chunk --example speed`
use std::time::Instant;

use ferry_chunk::{cut_lengths, ChunkerSpec, Key};

fn main() {
    let mut data = vec![0u8; 32 << 20];
    blake3::Hasher::new_derive_key("ferry bench input v1")
        .finalize_xof()
        .fill(&mut data);
    let best = |f: &mut dyn FnMut() -> usize| {
        (0..15)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(f());
                t.elapsed().as_secs_f64()
            })
            .fold(f64::MAX, f64::min)
    };
    let base = best(&mut || fastcdc::v2020::FastCDC::new(&data, 2048, 8192, 65536).count());
    let mb = data.len() as f64 / 1e6;
    println!(
        "{:<24} {:>8.0} MB/s  1.00x",
        "fastcdc-crate-v2020",
        mb / base
    );
    for (name, spec) in [
        ("ferry-fastcdc", ChunkerSpec::default()),
        (
            "ferry-fastcdc-keyed",
            ChunkerSpec::default().keyed(Key([7; 32])),
        ),
        ("ferry-lbfs", ChunkerSpec::lbfs()),
        ("ferry-lbfs-keyed", ChunkerSpec::lbfs().keyed(Key([7; 32]))),
    ] {
        let mut c = spec.build();
        let t = best(&mut || cut_lengths(&mut *c, &data).len());
        println!("{name:<24} {:>8.0} MB/s  {:.2}x", mb / t, base / t);
    }
}
