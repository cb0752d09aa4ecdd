//! Put and get of fresh chunks through the S3 store against a plain parallel S3 client, on one
//! versitygw server on loopback, in one run:
//!
//! ```sh
//! cargo run --release -p ferry-s3 --example throughput -- [SIZE_MIB] [RUNS]
//! ```
//!
//! The plain client PUTs and GETs 8 MiB objects of the same kind of bytes (random: nothing
//! compresses or deduplicates) from 8 threads; Ferry chunks, hashes, tries zstd on, packs and
//! uploads them, then reads them back into a fresh cache (the index rebuilt from the pack
//! tails first, in the time), every chunk verified. Prints each run and the median ratios.

use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use ferry_chunk::ChunkerSpec;
use ferry_s3::testing::S3Server;
use ferry_s3::{Client, ClientOptions, Cond, Locator, Options, S3Store};
use ferry_store::{read_object, store_object};

const OBJECT: usize = 8 << 20;
const THREADS: usize = 8;

fn random(seed: u64) -> blake3::OutputReader {
    let mut h = blake3::Hasher::new();
    h.update(&seed.to_le_bytes());
    h.finalize_xof()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1024);
    let runs: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(3);
    let size = mib << 20;
    let dir =
        tempfile::tempdir_in(std::env::var_os("TMPDIR").unwrap_or("/var/tmp".into())).unwrap();
    let gw = S3Server::start(&dir.path().join("s3"), 0).expect("versitygw");
    let r = gw.resolved();
    let plain = Client::new(&r, "bench", ClientOptions::default()).unwrap();
    plain.create_bucket().unwrap();
    let mb = |secs: f64| size as f64 / secs / 1e6;
    let (mut put_ratio, mut get_ratio) = (vec![], vec![]);
    println!("{mib} MiB of random bytes, versitygw v1.8.0 on loopback, {runs} runs");
    // What verifying costs one core here (each chunk's id, then the whole object's): the
    // reader's floor, which the plain client does not pay.
    {
        let mut buf = vec![0u8; 64 << 20];
        random(7).read_exact(&mut buf).unwrap();
        let t = Instant::now();
        let mut whole = blake3::Hasher::new();
        for c in buf.chunks(8192) {
            std::hint::black_box(blake3::hash(c));
            whole.update(c);
        }
        std::hint::black_box(whole.finalize());
        let rate = buf.len() as f64 / t.elapsed().as_secs_f64() / 1e6;
        println!("one core verifies 8 KiB chunks and the whole at {rate:.0} MB/s");
    }
    println!("run  plain PUT MB/s  ferry put MB/s  ratio   plain GET MB/s  ferry get MB/s  ratio");
    for run in 0..runs {
        // The plain client: 8 threads, 8 MiB objects.
        let n = size.div_ceil(OBJECT);
        let next = AtomicUsize::new(0);
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    let mut buf = vec![0u8; OBJECT];
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return;
                        }
                        random((run * 100_000 + i) as u64)
                            .read_exact(&mut buf)
                            .unwrap();
                        plain
                            .put(&format!("plain{run}/{i}"), &buf, Cond::None)
                            .unwrap();
                    }
                });
            }
        });
        let plain_put = t.elapsed().as_secs_f64();
        let next = AtomicUsize::new(0);
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    let b = plain
                        .get(&format!("plain{run}/{i}"), None)
                        .unwrap()
                        .unwrap();
                    assert_eq!(b.len(), OBJECT);
                });
            }
        });
        let plain_get = t.elapsed().as_secs_f64();
        // The same bytes by 4 MiB ranges, as the store reads its packs.
        let next = AtomicUsize::new(0);
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= 2 * n {
                        return;
                    }
                    let half = (OBJECT / 2) as u64;
                    let a = (i % 2) as u64 * half;
                    let b = plain
                        .get(&format!("plain{run}/{}", i / 2), Some((a, a + half)))
                        .unwrap()
                        .unwrap();
                    assert_eq!(b.len() as u64, half);
                });
            }
        });
        let plain_ranges = t.elapsed().as_secs_f64();

        // Ferry: a fresh store per run, so every chunk is new.
        let loc = Locator::parse(&format!("s3://bench/ferry{run}")).unwrap();
        let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
        let opts = |c: &str| {
            let mut o = Options {
                create: true,
                ..Options::new(dir.path().join(format!("{c}{run}")))
            };
            // Knobs for experiments.
            o.zstd_level = env("ZSTD").map_or(o.zstd_level, |v| v as i32);
            o.uploads = env("UPLOADS").unwrap_or(o.uploads);
            o.downloads = env("DOWNLOADS").unwrap_or(o.downloads);
            o.window = env("WINDOW_MIB").map_or(o.window, |v| (v as u64) << 20);
            o.cache_windows = env("CACHE_WINDOWS").unwrap_or(o.cache_windows);
            o
        };
        let t = Instant::now();
        let (oid, _, st) = {
            let s = S3Store::open(&loc, &r, opts("writer")).unwrap();
            let src = random(1_000_000 + run as u64).take(size as u64);
            store_object(&s, src, &ChunkerSpec::default(), |_| {}).unwrap()
        };
        let ferry_put = t.elapsed().as_secs_f64();
        assert_eq!(st.new_bytes, size as u64);
        let t = Instant::now();
        let s = S3Store::open(&loc, &r, opts("reader")).unwrap();
        let opened = t.elapsed().as_secs_f64();
        let got = read_object(&s, &oid, std::io::sink()).unwrap().unwrap();
        let ferry_get = t.elapsed().as_secs_f64();
        assert_eq!(got, size as u64);
        drop(s);
        if std::env::var_os("VERBOSE").is_some() {
            eprintln!(
                "open (index from pack tails) {opened:.3} s of {ferry_get:.3} s; plain GET by \
                 4 MiB ranges {:.0} MB/s",
                mb(plain_ranges)
            );
        }
        println!(
            "{run:>3}  {:>14.0}  {:>14.0}  {:>5.2}   {:>14.0}  {:>14.0}  {:>5.2}",
            mb(plain_put),
            mb(ferry_put),
            plain_put / ferry_put,
            mb(plain_get),
            mb(ferry_get),
            plain_get / ferry_get
        );
        put_ratio.push(plain_put / ferry_put);
        get_ratio.push(plain_get / ferry_get);
    }
    println!(
        "median ratio ferry/plain: put {:.2}, get {:.2}",
        median(put_ratio),
        median(get_ratio)
    );
}
