//! The object service (Bullet) on real files: creates at durability 1, deletes, and a versioned
//! directory updated by compare-and-swap, crashed everywhere: an acknowledged object reads back
//! whole, an acknowledged delete stays done, no half object is ever visible, and the
//! directory's newest version is never older than the last acknowledged update.

use ferry_format::{HashAlg, Id, Oid};
use ferry_objects::{Capability, Entry, Kind, ObjectStore, ObjectsError, Options};

use ferry_crashsim::Report;

use crate::{bytes, crash_all, recorder, rounds};

const SECRET: [u8; 32] = [9; 32];

fn opts() -> Options {
    Options {
        cache_bytes: 0,
        cache_max_object: 0,
        file_max: 1 << 20,
        ..Options::default()
    }
}

fn object(r: u64, i: u64) -> Vec<u8> {
    bytes(
        r << 32 | (300 + i),
        2_000 + (r * 7_919 + i * 3_001) as usize % 40_000,
    )
}

fn read(s: &ObjectStore, cap: &Capability) -> Result<Vec<u8>, ObjectsError> {
    let mut out = vec![];
    s.read(cap, 0, u64::MAX, &mut out)?;
    Ok(out)
}

fn entry(i: u64) -> Option<Entry> {
    Some(Entry {
        kind: Kind::Blob,
        value: i.to_le_bytes().to_vec(),
    })
}

#[test]
fn the_object_service_keeps_what_it_acknowledged_at_any_crash() {
    rounds("objects", round);
}

fn round(r: u64) -> Report {
    const N: u64 = 6;
    let rec = recorder();
    let root = rec.path().join("objects");
    let mut caps = vec![];
    let dir;
    {
        let s = ferry_objects::open_dir(&root, SECRET, opts()).unwrap();
        dir = s.mkdir().unwrap();
        rec.mark("open");
        let mut version = 0;
        for i in 0..N {
            let d = object(r, i);
            caps.push(s.create(&d[..], d.len() as u64, 1).unwrap().cap);
            rec.mark(format!("create {i}"));
            version = s
                .update(&dir, version, &[(format!("o{i}"), entry(i))])
                .unwrap();
            rec.mark(format!("version {version}"));
            if i % 2 == 1 {
                rec.mark(format!("deleting {}", i - 1));
                s.delete(&caps[i as usize - 1]).unwrap();
                rec.mark(format!("deleted {}", i - 1));
            }
        }
    }
    let trace = rec.finish();
    let has = |acked: &[String], m: String| acked.contains(&m);
    crash_all("objects", &trace, |c| {
        let s = match ferry_objects::open_dir(&c.dir.join("objects"), SECRET, opts()) {
            Ok(s) => s,
            Err(e) if !has(c.acked, "open".into()) => {
                let _ = e;
                return Ok(());
            }
            Err(e) => return Err(format!("the store does not open: {e}")),
        };
        if !has(c.acked, "open".into()) {
            return Ok(());
        }
        for i in 0..N {
            let acked = has(c.acked, format!("create {i}"));
            let deleting = has(c.acked, format!("deleting {i}"));
            let deleted = has(c.acked, format!("deleted {i}"));
            if let Some(cap) = caps.get(i as usize).filter(|_| acked) {
                match read(&s, cap) {
                    Ok(d) if deleted => {
                        return Err(format!(
                            "object {i} was deleted and is back ({} bytes)",
                            d.len()
                        ))
                    }
                    Ok(d) if d == object(r, i) => {}
                    Ok(_) => return Err(format!("object {i} reads back wrong")),
                    Err(ObjectsError::Denied) if deleting => {}
                    Err(e) => return Err(format!("object {i} was acknowledged and fails: {e}")),
                }
            } else {
                // Not acknowledged: absent, or whole.
                let oid = Oid(Id::hash(HashAlg::Blake3, &object(r, i)));
                if let Some(n) = s.by_oid(&oid).map_err(|e| e.to_string())? {
                    let cap = s.owner(n).ok_or("an object without an owner")?;
                    if read(&s, &cap).map_err(|e| format!("object {i}: {e}"))? != object(r, i) {
                        return Err(format!("a half object {i} after the crash"));
                    }
                }
            }
        }
        let acked_version = c
            .acked
            .iter()
            .filter_map(|m| m.strip_prefix("version ")?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        let l = s.list(&dir, None).map_err(|e| format!("list: {e}"))?;
        if l.version < acked_version {
            return Err(format!(
                "directory version {} < acknowledged {acked_version}",
                l.version
            ));
        }
        if l.entries.len() as u64 != l.version {
            return Err(format!(
                "directory version {} has {} entries",
                l.version,
                l.entries.len()
            ));
        }
        let st = s.stats();
        if st.used - st.holes != st.bytes {
            return Err(format!("space does not add up: {st:?}"));
        }
        Ok(())
    })
}
