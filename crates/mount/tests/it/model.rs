//! Sequences of opens, writes, closes, renames, hard links and removals from two clients of one
//! export, checked against a reference model: a map from names to files, and from files to
//! contents. Close-to-open means each operation, once its close returned, is what every later
//! open sees, whichever client and whichever name.

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_mount::{Errno, ROOT};
use proptest::prelude::*;

use super::{client, read, write, Remote};

#[derive(Clone, Debug)]
enum Op {
    Write {
        client: usize,
        file: u8,
        seed: u8,
        len: usize,
    },
    Read {
        client: usize,
        file: u8,
    },
    Rename {
        client: usize,
        from: u8,
        to: u8,
    },
    Unlink {
        client: usize,
        file: u8,
    },
    Link {
        client: usize,
        from: u8,
        to: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let c = 0..2usize;
    let f = 0..3u8;
    prop_oneof![
        3 => (c.clone(), f.clone(), any::<u8>(), prop_oneof![0..100usize, 7000..40_000usize])
            .prop_map(|(client, file, seed, len)| Op::Write { client, file, seed, len }),
        4 => (c.clone(), f.clone()).prop_map(|(client, file)| Op::Read { client, file }),
        1 => (c.clone(), f.clone(), f.clone()).prop_map(|(client, from, to)| Op::Rename { client, from, to }),
        1 => (c.clone(), f.clone(), f.clone()).prop_map(|(client, from, to)| Op::Link { client, from, to }),
        1 => (c, f).prop_map(|(client, file)| Op::Unlink { client, file }),
    ]
}

fn name(f: u8) -> String {
    format!("f{f}")
}

fn content(seed: u8, len: usize) -> Vec<u8> {
    // Mostly shared between seeds, so chunks are found again.
    let mut v = super::bytes(7, len);
    for (i, b) in v.iter_mut().enumerate().step_by(997) {
        *b = seed.wrapping_add(i as u8);
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn two_clients_agree_with_the_model(ops in proptest::collection::vec(op(), 1..24)) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("export");
        std::fs::create_dir(&root).unwrap();
        // No leases: every open revalidates, so the test needs no waiting for lease breaks.
        let remote = Remote::new(&root, 0);
        let clients = [
            client(&remote, &t.path().join("a"), Duration::from_secs(5)),
            client(&remote, &t.path().join("b"), Duration::from_secs(5)),
        ];
        // Names to files, files to contents.
        let mut names: BTreeMap<u8, usize> = BTreeMap::new();
        let mut files: Vec<Vec<u8>> = vec![];
        for op in ops {
            match op {
                Op::Write { client, file, seed, len } => {
                    let data = content(seed, len);
                    write(&clients[client], &name(file), &data).unwrap();
                    match names.get(&file) {
                        Some(&i) => files[i] = data,
                        None => {
                            files.push(data);
                            names.insert(file, files.len() - 1);
                        }
                    }
                }
                Op::Read { client, file } => {
                    let got = read(&clients[client], &name(file));
                    match names.get(&file) {
                        Some(&i) => prop_assert_eq!(&got.unwrap(), &files[i]),
                        None => prop_assert_eq!(got.unwrap_err(), Errno::ENOENT),
                    }
                }
                Op::Rename { client, from, to } => {
                    let r = clients[client].rename(ROOT, name(from).as_bytes(), ROOT, name(to).as_bytes(), false);
                    match names.get(&from).copied() {
                        // Two names of one file: nothing happens (rename(2)).
                        Some(i) if names.get(&to) == Some(&i) => r.unwrap(),
                        Some(i) => {
                            r.unwrap();
                            names.remove(&from);
                            names.insert(to, i);
                        }
                        None => prop_assert_eq!(r.unwrap_err(), Errno::ENOENT),
                    }
                }
                Op::Link { client, from, to } => {
                    let v = &clients[client];
                    let r = v.lookup(ROOT, name(from).as_bytes()).and_then(|s| {
                        let r = v.link(s.ino, ROOT, name(to).as_bytes());
                        v.forget(s.ino, 1);
                        r.map(|made| v.forget(made.ino, 1))
                    });
                    match (names.get(&from).copied(), names.contains_key(&to)) {
                        (None, _) => prop_assert_eq!(r.unwrap_err(), Errno::ENOENT),
                        (Some(_), true) => prop_assert_eq!(r.unwrap_err(), Errno::EEXIST),
                        (Some(i), false) => {
                            r.unwrap();
                            names.insert(to, i);
                        }
                    }
                }
                Op::Unlink { client, file } => {
                    let r = clients[client].unlink(ROOT, name(file).as_bytes());
                    match names.remove(&file) {
                        Some(_) => r.unwrap(),
                        None => prop_assert_eq!(r.unwrap_err(), Errno::ENOENT),
                    }
                }
            }
            // The server holds exactly the model.
            for f in 0..3u8 {
                let on_server = std::fs::read(root.join(name(f))).ok();
                prop_assert_eq!(on_server.as_ref(), names.get(&f).map(|&i| &files[i]));
            }
            // And its names of one file are one file there.
            for (a, i) in &names {
                for (b, j) in &names {
                    use std::os::unix::fs::MetadataExt;
                    let ino = |f: &u8| std::fs::metadata(root.join(name(*f))).unwrap().ino();
                    prop_assert_eq!(i == j, ino(a) == ino(b), "{} and {}", a, b);
                }
            }
        }
    }
}
