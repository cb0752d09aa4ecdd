//! Local store throughput and index cost.
//!
//! `cargo bench -p ferry-store --bench store`
//!
//! - `put`: 64 MiB of fresh pseudo-random 8 KiB chunks per iteration (zstd level 3 tried on
//!   each, flushed and fsynced at the end); over the run the store grows past 1 GiB.
//! - `get`: 64 MiB of those chunks read back and verified, in storage order, RAM cache off.
//! - `lookup`: `contains` for present and absent ids in an index of `FERRY_BENCH_INDEX_N`
//!   (default 10 million) chunks; the index is built once under `target/ferry-bench-index` and
//!   reused. Its size per chunk is printed.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferry_format::{HashAlg, Id};
use ferry_store::{ChunkStore, LocalStore, Options, VerifiedChunk};

const CHUNK: usize = 8192;
const PER_ITER: usize = 64 << 20;

fn fill(seed: u64, buf: &mut [u8]) {
    blake3::Hasher::new_derive_key("ferry store bench v1")
        .update(&seed.to_le_bytes())
        .finalize_xof()
        .fill(buf);
}

fn put_get(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let opts = Options {
        cache_bytes: 0,
        ..Options::default()
    };
    let store = LocalStore::create(dir.path().join("s"), opts).unwrap();
    let mut g = c.benchmark_group("store");
    g.throughput(Throughput::Bytes(PER_ITER as u64));
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(100));
    let mut seed = 0u64;
    let mut buf = vec![0u8; PER_ITER];
    let mut written: Vec<Vec<Id>> = vec![];
    g.bench_function("put 64 MiB fresh 8 KiB chunks", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                seed += 1;
                fill(seed, &mut buf);
                let t = Instant::now();
                let mut ids = Vec::with_capacity(PER_ITER / CHUNK);
                for chunk in buf.chunks(CHUNK) {
                    let v = VerifiedChunk::hash(HashAlg::Blake3, chunk);
                    store.put(&v).unwrap();
                    ids.push(*v.id());
                }
                store.flush().unwrap();
                total += t.elapsed();
                written.push(ids);
            }
            total
        })
    });
    let mut which = 0;
    g.bench_function("get 64 MiB (verified, cache off)", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                let ids = &written[which % written.len()];
                which += 1;
                for id in ids {
                    std::hint::black_box(store.get(id).unwrap().unwrap());
                }
            }
            t.elapsed()
        })
    });
    g.finish();
    let st = store.stats().unwrap();
    eprintln!(
        "store after the run: {} chunks, {} MiB stored, index {} bytes = {:.1} bytes/chunk",
        st.chunks,
        st.stored_bytes >> 20,
        st.index_bytes,
        st.index_bytes as f64 / st.chunks as f64
    );
}

fn tiny(i: u64) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[..8].copy_from_slice(&i.to_le_bytes());
    b
}

fn lookups(c: &mut Criterion) {
    let n: u64 = std::env::var("FERRY_BENCH_INDEX_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let dir =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ferry-bench-index-{n}"));
    let opts = Options {
        zstd_level: 0,
        cache_bytes: 0,
        ..Options::default()
    };
    if !dir.join("ferry-store").exists() || !dir.join("complete").exists() {
        let _ = std::fs::remove_dir_all(&dir);
        let s = LocalStore::create(&dir, opts.clone()).unwrap();
        let t = Instant::now();
        for i in 0..n {
            s.put(&VerifiedChunk::hash(HashAlg::Blake3, &tiny(i)))
                .unwrap();
            if i % 1_000_000 == 999_999 {
                eprintln!(
                    "  indexed {} M chunks in {:.0?}",
                    (i + 1) / 1_000_000,
                    t.elapsed()
                );
            }
        }
        s.flush().unwrap();
        drop(s);
        std::fs::write(dir.join("complete"), b"").unwrap();
    }
    let mut s = LocalStore::open(&dir, opts).unwrap();
    let (before, after) = s.compact_index().unwrap();
    eprintln!("index file {before} bytes as built, {after} bytes after compact_index");
    let st = s.stats().unwrap();
    eprintln!(
        "index of {} chunks: {} bytes on disk = {:.1} bytes/chunk",
        st.chunks,
        st.index_bytes,
        st.index_bytes as f64 / st.chunks as f64
    );
    let mut g = c.benchmark_group("index");
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    g.bench_function(BenchmarkId::new("contains present", n), |b| {
        b.iter_batched(
            || Id::hash(HashAlg::Blake3, &tiny(next() % n)),
            |id| assert!(s.contains(&id).unwrap()),
            criterion::BatchSize::SmallInput,
        )
    });
    g.bench_function(BenchmarkId::new("contains absent", n), |b| {
        b.iter_batched(
            || Id::hash(HashAlg::Blake3, &tiny(n + next() % n)),
            |id| assert!(!s.contains(&id).unwrap()),
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, put_get, lookups);
criterion_main!(benches);
