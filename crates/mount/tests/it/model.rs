//! Sequences of opens, writes, closes, renames and removals from two clients of one export,
//! checked against a reference model: a map from names to contents. Close-to-open means each
//! operation, once its close returned, is what every later open sees, whichever client.

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
}

fn op() -> impl Strategy<Value = Op> {
    let c = 0..2usize;
    let f = 0..3u8;
    prop_oneof![
        3 => (c.clone(), f.clone(), any::<u8>(), prop_oneof![0..100usize, 7000..40_000usize])
            .prop_map(|(client, file, seed, len)| Op::Write { client, file, seed, len }),
        4 => (c.clone(), f.clone()).prop_map(|(client, file)| Op::Read { client, file }),
        1 => (c.clone(), f.clone(), f.clone()).prop_map(|(client, from, to)| Op::Rename { client, from, to }),
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
        let mut model: BTreeMap<u8, Vec<u8>> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Write { client, file, seed, len } => {
                    let data = content(seed, len);
                    write(&clients[client], &name(file), &data).unwrap();
                    model.insert(file, data);
                }
                Op::Read { client, file } => {
                    let got = read(&clients[client], &name(file));
                    match model.get(&file) {
                        Some(want) => prop_assert_eq!(&got.unwrap(), want),
                        None => prop_assert_eq!(got.unwrap_err(), Errno::ENOENT),
                    }
                }
                Op::Rename { client, from, to } => {
                    let r = clients[client].rename(ROOT, name(from).as_bytes(), ROOT, name(to).as_bytes(), false);
                    match model.remove(&from) {
                        Some(data) => {
                            r.unwrap();
                            model.insert(to, data);
                        }
                        None => prop_assert_eq!(r.unwrap_err(), Errno::ENOENT),
                    }
                }
                Op::Unlink { client, file } => {
                    let r = clients[client].unlink(ROOT, name(file).as_bytes());
                    match model.remove(&file) {
                        Some(_) => r.unwrap(),
                        None => prop_assert_eq!(r.unwrap_err(), Errno::ENOENT),
                    }
                }
            }
            // The server holds exactly the model.
            for f in 0..3u8 {
                let on_server = std::fs::read(root.join(name(f))).ok();
                prop_assert_eq!(on_server.as_ref(), model.get(&f));
            }
        }
    }
}
