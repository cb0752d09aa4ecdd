//! The chunk store: packs, the redb index and the marker damaged at random.

use std::path::Path;

use ferry_chunk::ChunkerSpec;
use ferry_crashsim::corrupt::{campaign, Outcome};
use ferry_format::Oid;
use ferry_store::{read_object, store_object, LocalStore, Options, StoreError};

use crate::{bytes, report, seed, trials};

fn opts() -> Options {
    Options {
        pack_target: 64 << 10,
        cache_bytes: 0,
        ..Options::default()
    }
}

fn object(i: u64) -> Vec<u8> {
    let mut d = bytes(i, 6_000 + i as usize * 1_500);
    d.extend(bytes(1000, 5_000)); // shared by all: one damaged chunk can fail many
    d
}

/// Every object: right, or a failure (never wrong bytes); how many failed, and the first why.
fn read_all(s: &LocalStore, oids: &[Oid]) -> Result<(usize, String), String> {
    let (mut failed, mut why) = (0, String::new());
    for (i, oid) in oids.iter().enumerate() {
        let mut out = vec![];
        match read_object(s, oid, &mut out) {
            Ok(Some(_)) if out == object(i as u64) => continue,
            Ok(Some(_)) => return Err(format!("object {i} read back WRONG with success")),
            Ok(None) if why.is_empty() => why = format!("object {i}: not found"),
            Err(e) if why.is_empty() => why = format!("object {i}: {e}"),
            _ => {}
        }
        failed += 1;
    }
    Ok((failed, why))
}

fn check(dir: &Path, rel: &Path, oids: &[Oid]) -> Result<Outcome, String> {
    let index_hit = rel.starts_with("index.redb");
    let s = match LocalStore::open(dir, opts()) {
        Ok(s) => s,
        // Refused with a reason; the user's next step is a rebuild from the packs.
        Err(_) => match LocalStore::rebuild(dir, opts()) {
            Ok((s, _)) => {
                let (failed, why) = read_all(&s, oids)?;
                if index_hit && failed > 0 {
                    return Err(format!(
                        "{failed} objects lost to damage in the index alone, after a refused open and a rebuild ({why})"
                    ));
                }
                return Ok(Outcome::Caught);
            }
            // The marker itself: nothing is read, the store is named not a store.
            Err(_) => return Ok(Outcome::Caught),
        },
    };
    let (failed, why) = read_all(&s, oids)?;
    // Verify names what is damaged, or refuses with an error that names the index (and the
    // rebuild that cures it).
    let named = match s.verify(|_| {}) {
        Ok(v) => !v.damaged.is_empty() || !v.missing.is_empty(),
        Err(StoreError::Index { .. }) => true,
        Err(e) => return Err(format!("verify fails without naming the damage: {e}")),
    };
    if failed > 0 && !named {
        return Err(format!(
            "{failed} objects fail ({why}) and verify names nothing"
        ));
    }
    if (failed > 0 || named) && index_hit {
        // An index that lies is repaired by a rebuild: the packs hold everything.
        drop(s);
        let (s, _) = LocalStore::rebuild(dir, opts()).map_err(|e| format!("rebuild: {e}"))?;
        let (again, why) = read_all(&s, oids)?;
        if again > 0 {
            return Err(format!(
                "{again} objects lost to damage in the index alone, after a rebuild ({why})"
            ));
        }
    }
    Ok(if named || failed > 0 {
        Outcome::Caught
    } else {
        Outcome::Harmless
    })
}

#[test]
fn a_damaged_store_never_reads_wrong_and_names_the_damage() {
    let t = tempfile::tempdir().unwrap();
    let pristine = t.path().join("store");
    let oids: Vec<Oid> = {
        let s = LocalStore::open_or_create(&pristine, opts()).unwrap();
        (0..10)
            .map(|i| {
                store_object(&s, &object(i)[..], &ChunkerSpec::default(), |_| {})
                    .unwrap()
                    .0
            })
            .collect()
    };
    report(
        "store",
        campaign(&pristine, trials(), seed(), |dir, rel, _| {
            check(dir, rel, &oids)
        }),
    );
}
