//! The vault on a directory: every blob (config, key slots, heads, nodes, blocks) damaged at
//! random; the vault opens or refuses, reads right or fails, and `check` names the damage.

use std::collections::BTreeMap;
use std::path::Path;

use ferry_crashsim::corrupt::{campaign, Outcome};
use ferry_vault::{Config, DirBackend, Edit, KdfParams, Kind, Source, Vault};

use crate::{bytes, report, seed, trials};

const FAST: KdfParams = KdfParams {
    memory_kib: 64,
    passes: 1,
    lanes: 1,
};
const PASS: &[u8] = b"campaign";

fn versions() -> Vec<BTreeMap<String, Vec<u8>>> {
    (0..3u64)
        .map(|v| {
            let mut t = BTreeMap::new();
            let mut a = bytes(1, 40_000);
            a.splice(
                v as usize * 9_000..v as usize * 9_000 + 10,
                bytes(10 + v, 200),
            );
            t.insert("a".to_string(), a);
            t.insert(format!("small{v}"), bytes(20 + v, 300));
            t.insert("same".to_string(), bytes(30, 5_000));
            t
        })
        .collect()
}

fn read_all(v: &Vault, want: &[BTreeMap<String, Vec<u8>>]) -> Result<usize, String> {
    let mut failed = 0;
    for (i, files) in want.iter().enumerate() {
        let snap = match v.snapshot(i as u64 + 1) {
            Ok(s) => s,
            Err(_) => {
                failed += files.len();
                continue;
            }
        };
        for (name, data) in files {
            let Some(e) = snap.catalog.entries.get(name) else {
                // A catalog that decrypted and verified names what was put: a missing name
                // would be a wrong answer, not a refusal.
                return Err(format!("version {} lacks {name} WRONGLY", i + 1));
            };
            let mut out = vec![];
            match v.read_content(ferry_vault::records::child(e.size, e.root), &mut out) {
                Ok(_) if out == *data => {}
                Ok(_) => return Err(format!("version {}, {name} read back WRONG", i + 1)),
                Err(_) => failed += 1,
            }
        }
    }
    Ok(failed)
}

fn check(dir: &Path, want: &[BTreeMap<String, Vec<u8>>]) -> Result<Outcome, String> {
    let v = match DirBackend::open(dir, false).and_then(|b| Vault::open(Box::new(b), PASS)) {
        Ok(v) => v,
        Err(_) => return Ok(Outcome::Caught),
    };
    let latest = match v.latest() {
        Ok(s) => s.seq,
        Err(_) => return Ok(Outcome::Caught),
    };
    let failed = read_all(&v, want)?;
    let r = v.check(true, &|_| {});
    let named = match &r {
        Ok(r) => !r.problems.is_empty(),
        Err(_) => true,
    };
    if failed > 0 && !named {
        return Err(format!("{failed} files fail and check names nothing"));
    }
    if latest != want.len() as u64 && !named {
        return Err(format!(
            "the newest version is {latest} and check names nothing"
        ));
    }
    Ok(if named || failed > 0 {
        Outcome::Caught
    } else {
        Outcome::Harmless
    })
}

#[test]
fn a_damaged_vault_never_reads_wrong_and_names_the_damage() {
    let t = tempfile::tempdir().unwrap();
    let pristine = t.path().join("vault");
    let want = versions();
    {
        let b = DirBackend::open(&pristine, true).unwrap();
        let v = Vault::init(Box::new(b), PASS, FAST, Config::new()).unwrap();
        for files in &want {
            let edits: Vec<Edit> = files
                .iter()
                .map(|(n, d)| Edit::Put {
                    name: n.clone(),
                    kind: Kind::File,
                    mode: 0o644,
                    mtime_ns: 0,
                    source: Source::Bytes(d.clone()),
                })
                .collect();
            v.update(&edits).unwrap();
        }
    }
    report(
        "vault",
        campaign(&pristine, trials(), seed(), |dir, _, _| check(dir, &want)),
    );
}
