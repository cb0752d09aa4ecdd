//! The vault's update on a plain directory (blocks, nodes, catalog and the head created last
//! with link(2)), by a writer diffing with its fine summaries, crashed everywhere: every acknowledged version opens whole, the newest
//! version is never older than the last acknowledged one, and `check` finds nothing wrong.

use ferry_vault::{Config, DirBackend, Edit, KdfParams, Kind, Source, Vault};

use ferry_crashsim::Report;

use crate::{bytes, crash_all, recorder, rounds};

const FAST: KdfParams = KdfParams {
    memory_kib: 64,
    passes: 1,
    lanes: 1,
};
const PASS: &[u8] = b"crash";

/// The content of file `a` in version `v` (1-based): an edit in the middle of the last one.
fn content(r: u64, v: u64) -> Vec<u8> {
    let mut d = bytes(r << 32 | 100, 20_000 + (r * 7_919) as usize % 60_000);
    for i in 1..=v {
        let at = ((r + i) as usize * 7_919) % (d.len() - 200);
        d.splice(at..at + 100, bytes(r << 32 | (200 + i), 300));
    }
    d
}

fn put(name: &str, data: Vec<u8>) -> Edit {
    Edit::Put {
        name: name.into(),
        kind: Kind::File,
        mode: 0o644,
        mtime_ns: 1_700_000_000_000_000_000,
        source: Source::Bytes(data),
    }
}

fn open(dir: &std::path::Path) -> Result<Vault, String> {
    let b = DirBackend::open(dir, false).map_err(|e| e.to_string())?;
    Vault::open(Box::new(b), PASS).map_err(|e| e.to_string())
}

fn read(v: &Vault, seq: u64, name: &str) -> Result<Vec<u8>, String> {
    let snap = v.snapshot(seq).map_err(|e| format!("version {seq}: {e}"))?;
    let e = snap
        .catalog
        .entries
        .get(name)
        .ok_or_else(|| format!("version {seq} lacks {name}"))?;
    let mut out = vec![];
    v.read_content(ferry_vault::records::child(e.size, e.root), &mut out)
        .map_err(|e| format!("version {seq}, {name}: {e}"))?;
    Ok(out)
}

#[test]
fn the_vault_keeps_every_acknowledged_version_at_any_crash() {
    rounds("vault", round);
}

fn round(r: u64) -> Report {
    const VERSIONS: u64 = 4;
    let rec = recorder();
    let root = rec.path().join("vault");
    // The writer keeps its node cache and fine summaries apart from the traced directory, so
    // its updates after the first are fine diffs (pieces of old blocks around new ones).
    let cache = tempfile::tempdir().unwrap();
    {
        let b = DirBackend::open(&root, true).unwrap();
        let v = Vault::init(Box::new(b), PASS, FAST, Config::new())
            .unwrap()
            .with_node_cache(cache.path().join("nodes"));
        rec.mark("init");
        for seq in 1..=VERSIONS {
            let mut edits = vec![
                put("a", content(r, seq)),
                put(&format!("f{seq}"), bytes(seq, 900)),
            ];
            if seq == 3 {
                edits.push(Edit::Remove("f1".into()));
            }
            v.update(&edits).unwrap();
            rec.mark(format!("{seq}"));
        }
    }
    let trace = rec.finish();
    crash_all("vault", &trace, |c| {
        if !c.acked.iter().any(|m| m == "init") {
            // A vault not yet made may or may not open; if it opens, it must be empty.
            return match open(&c.dir.join("vault")) {
                Ok(v) => match v.latest() {
                    Ok(s) if s.seq == 0 => Ok(()),
                    Ok(s) => Err(format!("an unmade vault has version {}", s.seq)),
                    Err(e) => Err(format!("an unmade vault that opens fails: {e}")),
                },
                Err(_) => Ok(()),
            };
        }
        let acked = c
            .acked
            .iter()
            .filter_map(|m| m.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        let v = open(&c.dir.join("vault")).map_err(|e| format!("the vault does not open: {e}"))?;
        let latest = v.latest().map_err(|e| format!("latest: {e}"))?;
        if latest.seq < acked {
            return Err(format!(
                "version {acked} was acknowledged; the newest is {}",
                latest.seq
            ));
        }
        for seq in 1..=latest.seq {
            if read(&v, seq, "a")? != content(r, seq) {
                return Err(format!("version {seq} of a reads back wrong"));
            }
        }
        let r = v.check(true, &|_| {}).map_err(|e| format!("check: {e}"))?;
        if !r.problems.is_empty() {
            return Err(format!("check: {:?}", r.problems));
        }
        Ok(())
    })
}
