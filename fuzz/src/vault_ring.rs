//! A Ferry server's inner ring under hostile actions: arbitrary bytes (and well-formed batches
//! of arbitrary inserts and deletes) applied to a small vault's trees, as `serve_apply` does
//! for a client's Vault apply request. No panic, no unbounded work: anything is applied or
//! refused with an error.

use std::sync::OnceLock;

use ferry_vault::ring::{self, Action, FileActions};
use ferry_vault::tree::Piece;
use ferry_vault::{Backend, Config, DirBackend, Edit, KdfParams, Kind, Source, Vault};

/// A vault with one file, made once: its directory and the file's root.
fn vault() -> &'static (tempfile::TempDir, Option<ferry_vault::tree::Child>) {
    static V: OnceLock<(tempfile::TempDir, Option<ferry_vault::tree::Child>)> = OnceLock::new();
    V.get_or_init(|| {
        let t = tempfile::tempdir().unwrap();
        let kdf = KdfParams {
            memory_kib: 64,
            passes: 1,
            lanes: 1,
        };
        let v = Vault::init(
            Box::new(DirBackend::open(t.path(), true).unwrap()),
            b"fuzz",
            kdf,
            Config::new(),
        )
        .unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        v.update(&[Edit::Put {
            name: "f".into(),
            kind: Kind::File,
            mode: 0o644,
            mtime_ns: 0,
            source: Source::Bytes(data),
        }])
        .unwrap();
        let e = v.latest().unwrap().catalog.entries["f"].clone();
        (t, ferry_vault::records::child(e.size, e.root))
    })
}

/// One input.
pub fn run(data: &[u8]) {
    let (dir, root) = vault();
    let backend = DirBackend::open(dir.path(), false).unwrap();
    // Half the inputs raw; the rest read as actions on the real file's tree.
    let body = match data.split_first() {
        Some((0, raw)) => raw.to_vec(),
        _ => {
            let mut actions = vec![];
            for c in data.chunks(12) {
                let at = u64::from(u32::from_le_bytes([
                    c[0],
                    *c.get(1).unwrap_or(&0),
                    *c.get(2).unwrap_or(&0),
                    0,
                ]));
                let len = u32::from(*c.get(3).unwrap_or(&1)) << (c.get(4).unwrap_or(&0) % 16);
                actions.push(match c.get(5).map_or(0, |b| b % 2) {
                    0 => Action::Delete {
                        at,
                        len: len.into(),
                    },
                    _ => Action::Insert {
                        at,
                        pieces: vec![Piece {
                            block: [c.get(6).copied().unwrap_or(0); 32],
                            offset: u32::from(*c.get(7).unwrap_or(&0)),
                            len,
                        }],
                    },
                });
            }
            ring::encode_actions(&[FileActions {
                old: *root,
                actions,
            }])
        }
    };
    if let Ok(roots) = ring::serve_apply(&backend, &body) {
        ring::decode_roots(&roots).expect("the server's own answer decodes");
    }
    let _ = backend.flush();
}
