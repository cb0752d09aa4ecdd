//! What a frame against old data costs to make (`ferry_fs::delta::encode`) at the sizes a
//! mount's commit and a fetch meet: a few changed pages against the rest of a small file, and
//! a chunk against megabytes of old data.
//!
//! `cargo bench -p ferry-fs --bench delta`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferry_fs::delta::encode;

/// Text-like bytes with repeats (what a database page or a source file holds).
fn text(seed: u64, n: usize) -> Vec<u8> {
    let words = [
        &b"ferry "[..],
        b"chunk ",
        b"link ",
        b"slow ",
        b"byte ",
        b"delta\n",
    ];
    let mut x = seed;
    let mut out = Vec::with_capacity(n + 32);
    while out.len() < n {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.extend_from_slice(words[(x >> 33) as usize % words.len()]);
        out.extend_from_slice((x >> 50).to_string().as_bytes());
    }
    out.truncate(n);
    out
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("encode");
    g.sample_size(20);
    // (changed bytes, old bytes): a page or two of a small database; a chunk of a large file.
    for (data, prefix) in [
        (8 << 10, 40 << 10),
        (64 << 10, 1 << 20),
        (64 << 10, 8 << 20),
    ] {
        let old = text(1, prefix);
        // The new data: the old data's start, edited every 100 bytes.
        let mut new = old[..data.min(prefix)].to_vec();
        for i in (0..new.len()).step_by(100) {
            new[i] ^= 0x55;
        }
        g.throughput(Throughput::Bytes(data as u64));
        for level in [3, 9] {
            let id = BenchmarkId::new(format!("level {level}"), format!("{data} against {prefix}"));
            g.bench_function(id, |b| b.iter(|| encode(&new, &old, level).unwrap()));
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
