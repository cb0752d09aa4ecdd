//! Chunking with hashing (and compression), on 64 MiB of deterministic pseudo-random bytes,
//! beside the `fastcdc` crate's v2020 chunker alone on the same input in the same run.
//!
//! `cargo bench -p ferry-format --bench pipeline`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ferry_chunk::{cut_lengths, ChunkerSpec};
use ferry_format::{chunk_object, chunk_object_parallel, HashAlg, Id};

fn input() -> Vec<u8> {
    let mut v = vec![0u8; 64 << 20];
    blake3::Hasher::new_derive_key("ferry bench input v1")
        .finalize_xof()
        .fill(&mut v);
    v
}

fn pipeline(c: &mut Criterion) {
    let data = input();
    let spec = ChunkerSpec::default();
    let mut g = c.benchmark_group("pipeline");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.sample_size(10);
    g.bench_function("fastcdc-crate-v2020", |b| {
        b.iter(|| fastcdc::v2020::FastCDC::new(&data, 2048, 8192, 65536).count())
    });
    g.bench_function("blake3-whole", |b| b.iter(|| blake3::hash(&data)));
    let mut cutter = spec.build();
    g.bench_function("fastcdc+blake3", |b| {
        b.iter(|| {
            let mut off = 0;
            let mut last = Id::hash(HashAlg::Blake3, b"");
            for len in cut_lengths(&mut *cutter, &data) {
                last = Id::hash(HashAlg::Blake3, &data[off..off + len]);
                off += len;
            }
            last
        })
    });
    g.bench_function("fastcdc+blake3+zstd3", |b| {
        b.iter(|| {
            let mut off = 0;
            let mut out = 0;
            for len in cut_lengths(&mut *cutter, &data) {
                let chunk = &data[off..off + len];
                let _ = Id::hash(HashAlg::Blake3, chunk);
                out += zstd::bulk::compress(chunk, 3).unwrap().len();
                off += len;
            }
            out
        })
    });
    g.bench_function("chunk_object (1 thread, chunk ids + OID)", |b| {
        b.iter(|| {
            chunk_object::<_, std::io::Error, _>(&data[..], &spec, HashAlg::Blake3, |_, _| Ok(()))
                .unwrap()
        })
    });
    g.bench_function("chunk_object_parallel (2 threads, chunk ids + OID)", |b| {
        b.iter(|| {
            chunk_object_parallel::<_, std::io::Error, _>(
                &data[..],
                &spec,
                HashAlg::Blake3,
                |_, _| Ok(()),
            )
            .unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, pipeline);
criterion_main!(benches);
