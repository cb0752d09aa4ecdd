//! No path escapes the export, over many random requests (names, `..`, symlinks, renames,
//! creates) while another thread swaps a directory of the export with a symlink to a directory
//! outside it, as fast as it can: nothing outside is read, listed, written or removed.
//! `FERRY_LONG=1` sends 1,000,000 requests; CI 20,000.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ferry_fs::{Export, Server, ServerOptions};
use ferry_proto::{Hello, Message, Request, Target, WirePath, FEATURES, VERSION};
use ferry_store::MemStore;

/// A name only the outside directory holds, and bytes only its file holds.
const OUTSIDE_NAME: &str = "outside-only-name";
const OUTSIDE_BYTES: &[u8] = b"bytes that live outside the export: 8c41f0d2";

/// Names the requests use (a path with an empty, `.` or `..` component cannot be sent: the
/// message decoder refuses it, and the fuzz target `server` sends such bytes).
const NAMES: &[&str] = &[
    "d",
    "d/f",
    "d/g",
    "d/sub",
    "d/sub/h",
    "e",
    "e/f",
    "abs",
    "abs/f",
    "swap",
    "swap/f",
    "new",
    "d/new",
    "e/new",
    "swap/sub",
    "swap/sub/h",
    "lnk",
    "lnk/f",
    "d/sub/lnk",
    "d/sub/lnk/f",
];

fn setup(root: &Path) {
    let ex = root.join("export");
    std::fs::create_dir_all(ex.join("d/sub")).unwrap();
    std::fs::write(ex.join("d/f"), b"inside f").unwrap();
    let out = root.join("outside");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join(OUTSIDE_NAME), OUTSIDE_BYTES).unwrap();
    std::fs::write(out.join("f"), OUTSIDE_BYTES).unwrap();
    std::os::unix::fs::symlink("../outside", ex.join("e")).unwrap();
    std::os::unix::fs::symlink(&out, ex.join("abs")).unwrap();
    std::os::unix::fs::symlink("../outside", ex.join("swap")).unwrap();
}

/// The modes of the outside directory and its files.
fn modes(root: &Path) -> Vec<u32> {
    use std::os::unix::fs::PermissionsExt;
    let out = root.join("outside");
    ["", "f", OUTSIDE_NAME]
        .iter()
        .map(|n| {
            std::fs::symlink_metadata(out.join(n))
                .unwrap()
                .permissions()
                .mode()
        })
        .collect()
}

fn outside_intact(root: &Path, modes_before: &[u32]) {
    assert_eq!(
        modes(root),
        modes_before,
        "a mode outside the export changed"
    );
    let out = root.join("outside");
    let mut names: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["f", OUTSIDE_NAME], "the outside directory changed");
    for n in &names {
        assert_eq!(
            std::fs::read(out.join(n)).unwrap(),
            OUTSIDE_BYTES,
            "{n} changed"
        );
        // No name of it inside the export (a hard link).
        use std::os::unix::fs::MetadataExt;
        let links = std::fs::symlink_metadata(out.join(n)).unwrap().nlink();
        assert!(links == 1 || n != "f", "{n} has {links} names");
    }
}

fn request(rng: &mut u64, handle: &mut u32) -> Request {
    let mut next = || {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng
    };
    let mut name = || -> WirePath { NAMES[(next() % NAMES.len() as u64) as usize].into() };
    let (a, b) = (name(), name());
    match next() % 13 {
        0 => Request::GetAttr { path: a },
        1 => Request::ReadDir {
            path: a,
            keys: vec![],
        },
        2 => Request::ReadLink { path: a },
        3 => Request::ReadFiles {
            files: vec![(a, vec![]), (b, vec![])],
        },
        4 => Request::ReadRange {
            target: Target::Path(a),
            offset: 0,
            len: 1 << 16,
        },
        5 => Request::Mkdir {
            path: a,
            mode: 0o755,
        },
        6 => Request::Rename { from: a, to: b },
        7 => Request::Unlink { path: a },
        8 => Request::Rmdir { path: a },
        9 => Request::Symlink {
            path: a,
            target: b"../outside".to_vec(),
        },
        10 => Request::SetAttr {
            path: a,
            mode: Some(0o777),
            mtime_ns: Some(0),
        },
        11 => Request::Link { from: a, to: b },
        _ => {
            *handle += 1;
            Request::Create {
                handle: *handle,
                path: a,
                base: None,
            }
        }
    }
}

#[test]
fn no_request_escapes_the_export_while_a_racer_swaps_symlinks() {
    let long = std::env::var_os("FERRY_LONG").is_some_and(|v| v != "0");
    let n: u64 = if long { 1_000_000 } else { 20_000 };
    let t = tempfile::tempdir().unwrap();
    setup(t.path());
    let before = modes(t.path());
    let ex = t.path().join("export");
    let stop = Arc::new(AtomicBool::new(false));
    // The racer: `d` and `swap` exchange places (a directory and a symlink leading outside),
    // again and again, whatever the requests do meanwhile.
    let racer = {
        let (ex, stop) = (ex.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    ex.join("d"),
                    rustix::fs::CWD,
                    ex.join("swap"),
                    rustix::fs::RenameFlags::EXCHANGE,
                );
                swaps += 1;
            }
            swaps
        })
    };
    let staging = Arc::new(MemStore::new(ferry_format::HashAlg::Blake3));
    let opts = ServerOptions {
        lease_ms: 0,
        ..ServerOptions::default()
    };
    let mut server = Server::new(Export::open(&ex).unwrap(), opts, staging);
    let hello = Message::Hello(Hello {
        version: VERSION,
        features: FEATURES,
        agent: "escapes".into(),
    });
    server.handle(&hello.to_frame(0));
    let (mut rng, mut handle) = (0x9e37_79b9_7f4a_7c15u64, 0u32);
    for i in 0..n {
        let r = request(&mut rng, &mut handle);
        for f in server.handle(&Message::Request(r.clone()).to_frame(i as u32 + 1)) {
            let body = &f.body;
            let leaked = |m: &[u8]| body.windows(m.len()).any(|w| w == m);
            assert!(
                !leaked(OUTSIDE_BYTES),
                "request {i} ({r:?}) read outside the export"
            );
            assert!(
                !leaked(OUTSIDE_NAME.as_bytes()),
                "request {i} ({r:?}) listed outside the export"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = racer.join().unwrap();
    outside_intact(t.path(), &before);
    eprintln!("{n} requests, {swaps} swaps, nothing outside the export touched");
}

/// The client's side: gets (mirroring, with deletes) into a destination where a racer
/// exchanges a directory with a symlink leading outside, again and again. A get may fail; it
/// must never write, remove or chmod anything outside the destination. (Before every write
/// was made beneath the destination's root, 1,000 gets found a directory made outside within
/// seconds.) `FERRY_LONG=1`: 10,000 gets; CI 300.
#[test]
fn no_get_escapes_the_destination_while_a_racer_swaps_symlinks() {
    let long = std::env::var_os("FERRY_LONG").is_some_and(|v| v != "0");
    let gets = if long { 10_000 } else { 300 };
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("d/sub")).unwrap();
    for (name, len) in [
        ("d/f", 100),
        ("d/sub/h", 20_000),
        ("d/sub/i", 5_000),
        ("x", 10),
    ] {
        std::fs::write(src.join(name), crate::bytes(len as u64, len)).unwrap();
    }
    // The destination is beside the outside directory, as `export` is in `setup`.
    setup(t.path());
    let before = modes(t.path());
    let dst = t.path().join("export");
    let stop = Arc::new(AtomicBool::new(false));
    let racer = {
        let (dst, stop) = (dst.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let r = rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    dst.join("d"),
                    rustix::fs::CWD,
                    dst.join("swap"),
                    rustix::fs::RenameFlags::EXCHANGE,
                );
                if r.is_err() {
                    // The get removed or replaced one: a symlink leading outside again.
                    let _ = std::os::unix::fs::symlink("../outside", dst.join("swap"));
                    let _ = std::os::unix::fs::symlink("../outside", dst.join("d"));
                }
                // One of the two stays a real directory (the get may have removed it), so
                // that gets also find `d` one and write into it.
                let dir =
                    |n: &str| std::fs::symlink_metadata(dst.join(n)).is_ok_and(|m| m.is_dir());
                if !dir("d") && !dir("swap") {
                    let _ = std::fs::remove_file(dst.join("swap"));
                    let _ = std::fs::create_dir(dst.join("swap"));
                }
                swaps += 1;
                // Pauses of random length after a random number of swaps (not a fixed one: the
                // same side would be in place at every pause), so that gets reach every step
                // (and some run whole) between swaps.
                if rand::random_range(0..4) == 0 {
                    let us = rand::random_range(0..3_000);
                    std::thread::sleep(std::time::Duration::from_micros(us));
                }
            }
            swaps
        })
    };
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    let mut ok = 0;
    // How the others failed: the operation refused, by count.
    let mut failed = std::collections::BTreeMap::<String, u32>::new();
    for i in 0..gets {
        match crate::get_deleting(&mut crate::connect(&src), "", &dst, &cache, i % 2 == 0) {
            Ok(_) => ok += 1,
            Err(e) => {
                let e = e.to_string();
                let op = e.split(" /").next().unwrap_or(&e).to_string();
                if !failed.contains_key(&op) && std::env::var_os("SHOW").is_some() {
                    eprintln!("{e}");
                }
                *failed.entry(op).or_default() += 1;
            }
        }
    }
    eprintln!("failed gets by operation: {failed:?}");
    stop.store(true, Ordering::Relaxed);
    let swaps = racer.join().unwrap();
    outside_intact(t.path(), &before);
    eprintln!("{gets} gets ({ok} whole), {swaps} swaps, nothing outside the destination touched");
}
