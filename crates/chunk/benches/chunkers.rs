//! Chunker throughput on 64 MiB of deterministic pseudo-random bytes, beside the `fastcdc`
//! crate's v2020 chunker on the same input in the same run.
//!
//! `cargo bench -p ferry-chunk --bench chunkers`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ferry_chunk::{cut_lengths, ChunkerSpec, Key};

fn input() -> Vec<u8> {
    let mut v = vec![0u8; 64 << 20];
    blake3::Hasher::new_derive_key("ferry bench input v1")
        .finalize_xof()
        .fill(&mut v);
    v
}

fn chunkers(c: &mut Criterion) {
    let data = input();
    let mut g = c.benchmark_group("chunk");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.sample_size(10);
    g.bench_function("fastcdc-crate-v2020", |b| {
        b.iter(|| fastcdc::v2020::FastCDC::new(&data, 2048, 8192, 65536).count())
    });
    for (name, spec) in [
        ("ferry-fastcdc", ChunkerSpec::default()),
        (
            "ferry-fastcdc-keyed",
            ChunkerSpec::default().keyed(Key([7; 32])),
        ),
        ("ferry-lbfs", ChunkerSpec::lbfs()),
        ("ferry-lbfs-keyed", ChunkerSpec::lbfs().keyed(Key([7; 32]))),
        ("ferry-fixed", ChunkerSpec::fixed(8192)),
    ] {
        let mut cutter = spec.build();
        g.bench_function(name, |b| b.iter(|| cut_lengths(&mut *cutter, &data).len()));
    }
    g.finish();
}

criterion_group!(benches, chunkers);
criterion_main!(benches);
