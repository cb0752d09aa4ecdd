//! The file server's commit (upload to a temporary file, fsync, keep the old version in the
//! trash, rename, fsync the directory), driven by the real client over an in-process socket and
//! crashed everywhere: every file on the server is whole (one version someone put, never torn
//! or mixed), every acknowledged put is there, and no acknowledged deletion comes back.

use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;
use std::path::Path;

use ferry_chunk::ChunkerSpec;
use ferry_fs::{Connection, Export, Server, ServerOptions};
use ferry_store::MemStore;

use crate::{bytes, crash_all, recorder};

/// The tree of version `v`: name → content (a file absent from a version is deleted by it).
fn version(v: u64) -> BTreeMap<String, Vec<u8>> {
    let mut t = BTreeMap::new();
    t.insert("small".into(), bytes(10 + v, 700));
    let mut big = bytes(1, 90_000);
    big.splice(
        v as usize * 10_000..v as usize * 10_000 + 50,
        bytes(20 + v, 400),
    );
    t.insert("dir/big".into(), big);
    if v != 2 {
        t.insert(format!("dir/only{}", v % 2), bytes(30 + v, 5_000));
    }
    if v < 2 {
        t.insert("gone".into(), bytes(40, 3_000));
    }
    t
}

fn connect(root: &Path) -> Connection<UnixStream, UnixStream> {
    let (a, b) = UnixStream::pair().unwrap();
    let export = Export::open(root).unwrap();
    std::thread::spawn(move || {
        let staging = std::sync::Arc::new(MemStore::new(ferry_format::HashAlg::Blake3));
        let mut server = Server::new(export, ServerOptions::default(), staging);
        let _ = ferry_fs::serve(&mut server, a.try_clone().unwrap(), a);
    });
    Connection::open(b.try_clone().unwrap(), b).unwrap()
}

fn write_tree(dir: &Path, t: &BTreeMap<String, Vec<u8>>) {
    let _ = std::fs::remove_dir_all(dir);
    for (name, data) in t {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
}

/// The regular files beneath `root`, by path, without the server's own (trash, temporaries).
fn files(root: &Path) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| e.to_string())? {
            let e = e.map_err(|e| e.to_string())?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(".ferry-") {
                continue;
            }
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.insert(rel, std::fs::read(&p).map_err(|e| e.to_string())?);
            }
        }
    }
    Ok(out)
}

#[test]
fn a_server_commit_is_whole_and_durable_at_any_crash() {
    const VERSIONS: u64 = 3;
    let rec = recorder();
    let export = rec.path().join("export");
    std::fs::create_dir(&export).unwrap();
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("src");
    for v in 0..VERSIONS {
        write_tree(&src, &version(v));
        let opts = ferry_fs::PutOptions {
            chunker: ChunkerSpec::default(),
            delete: true,
            dry_run: false,
            progress: None,
            cache: None,
            fewer_round_trips: false,
        };
        let mut stats = ferry_fs::PutStats::default();
        ferry_fs::put(&mut connect(&export), &src, &"".into(), &opts, &mut stats).unwrap();
        rec.mark(format!("{v}"));
    }
    let trace = rec.finish();
    let versions: Vec<_> = (0..VERSIONS).map(version).collect();
    crash_all("commit", &trace, |c| {
        let acked = c.acked.iter().filter_map(|m| m.parse::<usize>().ok()).max();
        let root = c.dir.join("export");
        let have = if root.exists() {
            files(&root)?
        } else {
            BTreeMap::new()
        };
        // Each file is one whole version someone put, never older than the last acknowledged.
        for (name, data) in &have {
            let from = acked.unwrap_or(0);
            if !versions[from..].iter().any(|t| t.get(name) == Some(data)) {
                return Err(format!(
                    "{name} is not a version put since the last acknowledged"
                ));
            }
        }
        let Some(acked) = acked else { return Ok(()) };
        // What the last acknowledged version holds is there (or a later version's), and what it
        // deleted stays deleted unless a later, unacknowledged put brought it back.
        for name in versions[acked].keys() {
            if !have.contains_key(name) && versions[acked..].iter().all(|t| t.contains_key(name)) {
                return Err(format!("{name} was acknowledged and is gone"));
            }
        }
        for name in have.keys() {
            if !versions[acked..].iter().any(|t| t.contains_key(name)) {
                return Err(format!(
                    "{name} was deleted by an acknowledged put and is back"
                ));
            }
        }
        Ok(())
    });
}
