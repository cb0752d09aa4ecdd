//! Devices against the transfer engine, as a fetch uses them: real directories, indexed, then
//! changed, replaced, emptied or laced with symlinks; the server's part played by a store of
//! the latest versions. Whatever a device holds, a fetch brings the latest content.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ferry_chunk::ChunkerSpec;
use ferry_format::{chunk_object, HashAlg, Recipe};
use ferry_lookaside::{
    scan, DeviceIndex, DeviceSource, Lookaside, Matching, Rejections, INDEX_NAME,
};
use ferry_store::{ChunkStore, MemStore, VerifiedChunk};
use ferry_transfer::{fetch, Options, Place, Source, StoreSource, Want};
use proptest::prelude::*;

/// Small chunks, so small files have several.
fn spec() -> ChunkerSpec {
    ChunkerSpec::fastcdc(256, 1024, 8192)
}

fn recipe_of(data: &[u8]) -> Recipe {
    chunk_object(data, &spec(), HashAlg::Blake3, |_, _| {
        Ok::<_, std::io::Error>(())
    })
    .unwrap()
    .0
}

fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    blake3::Hasher::new_derive_key("ferry lookaside tests")
        .update(&seed.to_le_bytes())
        .finalize_xof()
        .fill(&mut v);
    v
}

fn index_of(root: &Path) -> DeviceIndex {
    scan(root, &spec(), HashAlg::Blake3, None, &|_| {})
        .unwrap()
        .0
}

/// The server: every chunk of the latest versions.
fn server_of(files: &[(&str, Vec<u8>)]) -> MemStore {
    let s = MemStore::new(HashAlg::Blake3);
    for (_, data) in files {
        chunk_object(&data[..], &spec(), HashAlg::Blake3, |_, b| {
            s.put(&VerifiedChunk::hash(HashAlg::Blake3, b)).map(drop)
        })
        .unwrap();
    }
    s
}

/// Fetches `files` (their latest versions, known to `server`) with `device` searched first, and
/// rebuilds each from what arrived: returns the files rebuilt and the engine's report.
/// What fetching `files` wants (each chunk once, with its place), and their recipes.
fn wants_of(files: &[(&str, Vec<u8>)]) -> (Vec<Want>, Vec<Recipe>) {
    let mut wants = vec![];
    let mut recipes = vec![];
    for (name, data) in files {
        let r = recipe_of(data);
        for (offset, c) in r.with_offsets() {
            wants.push(Want {
                id: c.id,
                len: c.len,
                place: Some(Place {
                    path: Arc::from(name.as_bytes()),
                    offset,
                    recipe: Some(r.check()),
                }),
            });
        }
        recipes.push(r);
    }
    wants.sort_by_key(|w| *w.id.digest());
    wants.dedup_by_key(|w| w.id);
    (wants, recipes)
}

/// The bytes `device` serves of what fetching `files` wants, asked for it all at once.
fn served(device: &mut DeviceSource, files: &[(&str, Vec<u8>)]) -> u64 {
    let (wants, _) = wants_of(files);
    device.request(&wants).unwrap();
    let answers = device.receive().unwrap();
    for (w, a) in wants.iter().zip(&answers) {
        assert!(
            a.as_ref().is_none_or(|d| w.id.matches(d)),
            "wrong bytes served"
        );
    }
    answers.iter().flatten().map(|d| d.len() as u64).sum()
}

fn fetch_with(
    device: Option<&mut DeviceSource>,
    server: &MemStore,
    files: &[(&str, Vec<u8>)],
) -> (Vec<Vec<u8>>, ferry_transfer::Report) {
    let (wants, recipes) = wants_of(files);
    let sink = MemStore::new(HashAlg::Blake3);
    let mut far = Far(StoreSource::new("server", server));
    let report = {
        let mut sources: Vec<&mut (dyn Source + Send)> = vec![];
        if let Some(d) = device {
            sources.push(d);
        }
        sources.push(&mut far);
        fetch(&mut sources, &wants, &sink, &Options::default()).unwrap()
    };
    let rebuilt = recipes
        .iter()
        .map(|r| {
            r.chunks()
                .iter()
                .flat_map(|c| sink.get(&c.id).unwrap().expect("fetched"))
                .collect()
        })
        .collect();
    (rebuilt, report)
}

/// The server across a link (not local): it takes what a device ahead of it may have only to
/// measure itself, or once it proves the faster.
struct Far<'a>(StoreSource<'a>);

impl Source for Far<'_> {
    fn name(&self) -> String {
        self.0.name()
    }
    fn may_have(&mut self, want: &Want) -> bool {
        self.0.may_have(want)
    }
    fn request(&mut self, wants: &[Want]) -> Result<(), ferry_transfer::SourceError> {
        self.0.request(wants)
    }
    fn receive(&mut self) -> Result<Vec<Option<Vec<u8>>>, ferry_transfer::SourceError> {
        self.0.receive()
    }
}

fn device(root: &Path, index: DeviceIndex) -> (DeviceSource, Arc<Mutex<Rejections>>) {
    let rej = Arc::new(Mutex::new(Rejections::default()));
    let d = DeviceSource::new(root, Arc::new(index), Matching::Chunks, rej.clone()).unwrap();
    (d, rej)
}

fn write(root: &Path, name: &str, data: &[u8]) {
    let p = root.join(name);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

#[test]
fn a_device_several_versions_old_still_supplies_what_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let old = noise(1, 200_000);
    write(dir.path(), "backup/old-name.bin", &old);
    let index = index_of(dir.path());
    // Two edits since: a few KB inserted, some removed.
    let mut new = old[..50_000].to_vec();
    new.extend_from_slice(&noise(2, 3000));
    new.extend_from_slice(&old[50_000..120_000]);
    new.extend_from_slice(&old[125_000..]);
    let files = [("tree/new.bin", new)];
    let (mut d, _) = device(dir.path(), index);
    assert!(served(&mut d, &files) > 180_000);
    let (got, _) = fetch_with(Some(&mut d), &server_of(&files), &files);
    assert_eq!(got[0], files[0].1);
}

#[test]
fn changed_files_are_never_served_and_a_hidden_change_is_caught_by_the_hash() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (a, b, c) = (noise(1, 30_000), noise(2, 30_000), noise(3, 30_000));
    write(root, "a", &a);
    write(root, "b", &b);
    write(root, "c", &c);
    let index = index_of(root);
    // b grows (its identity changes); c is rewritten in place with its size and times kept
    // (only the hash can tell).
    let mut b2 = b.clone();
    b2.extend_from_slice(b"more");
    write(root, "b", &b2);
    let times = std::fs::metadata(root.join("c"))
        .unwrap()
        .modified()
        .unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(root.join("c"))
            .unwrap();
        f.write_all_at(&noise(4, 30_000), 0).unwrap();
        f.set_modified(times).unwrap();
    }
    // The server's versions are the indexed ones: b and c must come from the server.
    let files = [("a", a), ("b", b), ("c", c)];
    let (mut d, rej) = device(root, index);
    assert_eq!(served(&mut d, &files), 30_000, "only a");
    let rej = rej.lock().unwrap().clone();
    assert_eq!(rej.stale_files, 2, "{rej:?}");
    assert_eq!(
        rej.chunks, 1,
        "one chunk of c read, then c left alone: {rej:?}"
    );
    let (got, r) = fetch_with(Some(&mut d), &server_of(&files), &files);
    for (g, (_, want)) in got.iter().zip(&files) {
        assert_eq!(g, want);
    }
    assert_eq!(
        r.sources[0].rejected, 0,
        "the source checks before handing over"
    );
}

#[test]
fn nothing_is_read_outside_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("secret");
    let secret = noise(9, 20_000);
    std::fs::write(&outside, &secret).unwrap();
    let root = dir.path().join("dev");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("abs")).unwrap();
    std::os::unix::fs::symlink("../secret", root.join("rel")).unwrap();
    std::os::unix::fs::symlink("../../secret", root.join("sub/up")).unwrap();
    std::os::unix::fs::symlink(dir.path(), root.join("dirlink")).unwrap();
    // Scanning follows no symlink: nothing of the secret is indexed.
    let (index, report) = scan(&root, &spec(), HashAlg::Blake3, None, &|_| {}).unwrap();
    assert!(index.files.is_empty(), "{:?}", index.files);
    assert_eq!(report.skipped, 4, "{report:?}");
    // An index written by someone else, naming the links as files holding the secret's
    // chunks, gets nothing read through them either.
    let r = recipe_of(&secret);
    let id = ferry_format::Id::hash(HashAlg::Blake3, &secret);
    let files = ["abs", "rel", "sub/up", "dirlink/secret"]
        .iter()
        .map(|p| ferry_lookaside::IndexedFile {
            path: p.as_bytes().to_vec(),
            size: secret.len() as u64,
            mtime_ns: 0,
            ino: 0,
            oid: id,
            chunks: r.chunks().to_vec(),
        })
        .collect();
    let forged = DeviceIndex::new(
        ferry_lookaside::ChunkerMark::of(&spec()),
        HashAlg::Blake3,
        files,
    );
    let server = server_of(&[("s", secret.clone())]);
    let (mut d, _) = device(&root, forged);
    let (got, r) = fetch_with(Some(&mut d), &server, &[("s", secret.clone())]);
    assert_eq!(got[0], secret);
    assert_eq!(r.sources[0].chunks, 0, "{r:?}");
    assert!(r.sources[0].failed.is_none(), "{r:?}");
}

#[test]
fn a_device_that_vanishes_costs_time_only() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("stick");
    let files: Vec<(&str, Vec<u8>)> = (0..5).map(|i| ("f", noise(i, 40_000))).collect();
    for (i, (_, d)) in files.iter().enumerate() {
        write(&root, &format!("f{i}"), d);
    }
    let index = index_of(&root);
    let (mut d, _) = device(&root, index);
    // Unplugged between the fetch's start and its reads: every file is gone.
    std::fs::remove_dir_all(&root).unwrap();
    let server = server_of(&files);
    let (got, r) = fetch_with(Some(&mut d), &server, &files);
    for (g, (_, want)) in got.iter().zip(&files) {
        assert_eq!(g, want);
    }
    assert_eq!(r.sources[0].chunks, 0, "{r:?}");
    // Missing from the registry's point of view too: a device not there is left out.
    let (l, unusable) = Lookaside::load(
        std::slice::from_ref(&root),
        &dir.path().join("cache"),
        &spec(),
        HashAlg::Blake3,
        Matching::Chunks,
    );
    assert!(l.is_empty());
    assert_eq!(unusable.len(), 1, "{unusable:?}");
}

#[test]
fn whole_file_matching_takes_only_identical_files() {
    let dir = tempfile::tempdir().unwrap();
    let same = noise(1, 50_000);
    let old = noise(2, 50_000);
    write(dir.path(), "same", &same);
    write(dir.path(), "old", &old);
    let index = Arc::new(index_of(dir.path()));
    let mut edited = old.clone();
    edited[25_000] ^= 1;
    let files = [("same", same), ("old", edited)];
    let server = server_of(&files);
    let rej = Arc::new(Mutex::new(Rejections::default()));
    let mut whole =
        DeviceSource::new(dir.path(), index.clone(), Matching::WholeFiles, rej.clone()).unwrap();
    assert_eq!(served(&mut whole, &files), 50_000);
    let mut chunks = DeviceSource::new(dir.path(), index, Matching::Chunks, rej).unwrap();
    assert!(served(&mut chunks, &files) > 90_000);
    let (got, _) = fetch_with(Some(&mut chunks), &server, &files);
    assert_eq!(got[1], files[1].1);
}

#[test]
fn indexing_again_reads_only_what_changed_and_the_index_is_kept_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("dev");
    let cache = dir.path().join("cache");
    for i in 0..4 {
        write(&root, &format!("d/{i}"), &noise(i, 10_000));
    }
    let (first, r1) = scan(&root, &spec(), HashAlg::Blake3, None, &|_| {}).unwrap();
    assert_eq!((r1.files, r1.reused, r1.hashed), (4, 0, 40_000));
    let kept = ferry_lookaside::save(&root, &cache, &first, false).unwrap();
    assert_eq!(kept.path(), root.join(INDEX_NAME));
    write(&root, "d/2", &noise(7, 12_000));
    let (old, _) = ferry_lookaside::load(&root, &cache).unwrap().unwrap();
    let (second, r2) = scan(&root, &spec(), HashAlg::Blake3, Some(&old), &|_| {}).unwrap();
    assert_eq!(
        (r2.files, r2.reused, r2.hashed),
        (4, 3, 12_000),
        "the index file is not indexed"
    );
    // Kept in the cache instead: that copy is found, the device's removed from the search.
    let kept = ferry_lookaside::save(&root, &cache, &second, true).unwrap();
    assert!(kept.path().starts_with(&cache));
    std::fs::remove_file(root.join(INDEX_NAME)).unwrap();
    let (back, _) = ferry_lookaside::load(&root, &cache).unwrap().unwrap();
    assert_eq!(back, second);
    let leftovers: Vec<PathBuf> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_none_or(|e| e != "idx"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// What happens to one file of the device between its indexing and the fetch.
#[derive(Clone, Debug)]
enum Later {
    Kept,
    Gone,
    /// Bytes appended.
    Grown(u8),
    /// Bytes overwritten in place, size and times kept (only the hash can tell).
    Hidden(usize),
    /// Replaced by a symlink to the latest version, outside the device.
    Link,
}

/// A file's versions: each an edit of the one before (an insert, a delete, a change).
fn versions(seed: u64, edits: &[(u8, usize, usize)]) -> Vec<Vec<u8>> {
    let mut v = vec![noise(seed, 6_000 + (seed as usize % 5) * 3_000)];
    for (i, &(kind, at, n)) in edits.iter().enumerate() {
        let mut d = v.last().unwrap().clone();
        let at = at % (d.len() + 1);
        let n = n % 2_000 + 1;
        match kind % 3 {
            0 => {
                let ins = noise(seed * 1000 + i as u64, n);
                d.splice(at..at, ins);
            }
            1 => {
                d.drain(at..(at + n).min(d.len()));
            }
            _ => {
                for b in d.iter_mut().skip(at).take(n) {
                    *b ^= 0x5a;
                }
            }
        }
        v.push(d);
    }
    v
}

fn cases() -> u32 {
    // `FERRY_LONG=1 cargo test` runs the long mode.
    match std::env::var_os("FERRY_LONG") {
        Some(_) => 100_000,
        None => 48,
    }
}

/// A scratch directory in memory when the machine has one (the long mode makes 100,000).
fn scratch() -> tempfile::TempDir {
    match Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm").unwrap(),
        false => tempfile::tempdir().unwrap(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Stale data is harmless: files with random histories on the server, a device holding
    /// random older versions (or none), changed after it was indexed in every way a device
    /// can be; a fetch always brings the latest version.
    #[test]
    fn whatever_the_device_holds_a_fetch_brings_the_latest(
        histories in prop::collection::vec(
            (prop::collection::vec((any::<u8>(), any::<usize>(), any::<usize>()), 0..4),
             any::<prop::sample::Index>(),
             prop_oneof![Just(Later::Kept), Just(Later::Gone), (1u8..200).prop_map(Later::Grown),
                         any::<usize>().prop_map(Later::Hidden), Just(Later::Link)],
             any::<bool>()),
            1..5),
        whole in any::<bool>(),
    ) {
        let dir = scratch();
        let root = dir.path().join("dev");
        std::fs::create_dir_all(&root).unwrap();
        let names: Vec<String> = (0..histories.len()).map(|i| format!("f{i}")).collect();
        let mut latest = vec![];
        let mut laters = vec![];
        for (i, (edits, pick, later, on_device)) in histories.iter().enumerate() {
            let v = versions(i as u64 + 1, edits);
            if *on_device {
                // Any version, under another name (the device keeps its own layout).
                write(&root, &format!("copy/{}", names[i]), &v[pick.index(v.len())]);
                laters.push((format!("copy/{}", names[i]), later.clone()));
            }
            latest.push(v.last().unwrap().clone());
        }
        let index = index_of(&root);
        for (name, later) in &laters {
            let p = root.join(name);
            match later {
                Later::Kept => {}
                Later::Gone => std::fs::remove_file(&p).unwrap(),
                Later::Grown(n) => {
                    let mut d = std::fs::read(&p).unwrap();
                    d.extend(std::iter::repeat_n(7u8, *n as usize));
                    std::fs::write(&p, d).unwrap();
                }
                Later::Hidden(at) => {
                    use std::os::unix::fs::FileExt;
                    let len = std::fs::metadata(&p).unwrap().len() as usize;
                    let t = std::fs::metadata(&p).unwrap().modified().unwrap();
                    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
                    f.write_all_at(&[0xee; 16], (at % len.max(1)) as u64).unwrap();
                    f.set_modified(t).unwrap();
                }
                Later::Link => {
                    let target = dir.path().join(format!("out-{}", name.replace('/', "-")));
                    std::fs::write(&target, &latest[0]).unwrap();
                    std::fs::remove_file(&p).unwrap();
                    std::os::unix::fs::symlink(&target, &p).unwrap();
                }
            }
        }
        let files: Vec<(&str, Vec<u8>)> =
            names.iter().map(|n| n.as_str()).zip(latest.iter().cloned()).collect();
        let server = server_of(&files);
        let matching = if whole { Matching::WholeFiles } else { Matching::Chunks };
        let rej = Arc::new(Mutex::new(Rejections::default()));
        let mut d = DeviceSource::new(&root, Arc::new(index), matching, rej).unwrap();
        // The device itself never hands over wrong bytes (the engine checks them again).
        served(&mut d, &files);
        let (got, _) = fetch_with(Some(&mut d), &server, &files);
        for (g, want) in got.iter().zip(&latest) {
            prop_assert_eq!(g, want);
        }
    }
}
