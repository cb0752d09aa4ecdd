//! The client's get into a destination on the simulator, with its chunk cache there too:
//! files are installed through temporary files and renames; crashed everywhere, every file in
//! the destination is one whole version (never torn or mixed, never older than the last
//! acknowledged get), and the cache opens and verifies clean.

use ferry_chunk::ChunkerSpec;
use ferry_fs::{GetStats, Sources};
use ferry_store::{LocalStore, Options};

use crate::commit::{connect, same_or_newer, version, write_tree};
use ferry_crashsim::Report;

use crate::{crash_all, recorder, rounds};

fn cache_opts() -> Options {
    Options {
        pack_target: 128 << 10,
        cache_bytes: 1 << 20,
        ..Options::default()
    }
}

#[test]
fn a_get_installs_whole_files_at_any_crash() {
    rounds("get", round);
}

fn round(r: u64) -> Report {
    const VERSIONS: u64 = 3;
    let rec = recorder();
    let dst = rec.path().join("dst");
    let server = tempfile::tempdir().unwrap();
    let export = server.path().join("export");
    for v in 0..VERSIONS {
        write_tree(&export, &version(r, v));
        let cache = LocalStore::open_or_create(rec.path().join("cache"), cache_opts()).unwrap();
        let src = Sources {
            borrowing: true,
            cache: &cache,
            chunker: ChunkerSpec::default(),
            delete: true,
            dry_run: false,
            progress: None,
            lookaside: None,
            cold: v == 0,
            ranges: false,
            short_ids: true,
            cache_file_max: u64::MAX,
            mirrors: None,
        };
        let mut stats = GetStats::default();
        ferry_fs::get(&mut connect(&export), &"".into(), &dst, &src, &mut stats).unwrap();
        drop(cache);
        rec.mark(format!("{v}"));
    }
    let trace = rec.finish();
    let versions: Vec<_> = (0..VERSIONS).map(|v| version(r, v)).collect();
    crash_all("get", &trace, |c| {
        let acked = c.acked.iter().filter_map(|m| m.parse::<usize>().ok()).max();
        same_or_newer(&c.dir.join("dst"), &versions, acked)?;
        let cache = LocalStore::open_or_create(c.dir.join("cache"), cache_opts())
            .map_err(|e| format!("the cache does not open: {e}"))?;
        let v = cache.verify(|_| {}).map_err(|e| format!("verify: {e}"))?;
        if !v.damaged.is_empty() {
            return Err(format!(
                "the cache is damaged after a crash: {:?}",
                v.damaged
            ));
        }
        Ok(())
    })
}
