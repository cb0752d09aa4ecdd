//! The chunk store's append, flush, object removal and gc, crashed everywhere: whatever was
//! flushed stays readable and whole, nothing wrong is ever read, and the store always opens.

use ferry_chunk::ChunkerSpec;
use ferry_format::Oid;
use ferry_store::{read_object, store_object, ChunkStore, LocalStore, Options};

use ferry_crashsim::Report;

use crate::{bytes, crash_all, recorder, rounds};

fn opts() -> Options {
    Options {
        pack_target: 96 << 10,
        flush_every: 1 << 20,
        cache_bytes: 1 << 20,
        ..Options::default()
    }
}

/// Object `i` of round `r`: half shared with object `i - 1` (dedup across puts), half new;
/// sizes vary with the round.
fn object(r: u64, i: u64) -> Vec<u8> {
    let half = 8_000 + (r * 7_919 + i * 104_729) as usize % 24_000;
    let mut d = bytes(r << 32 | (i.saturating_sub(1) * 2 + 1), half);
    d.extend(bytes(r << 32 | (i * 2), half));
    d
}

fn read(s: &LocalStore, oid: &Oid) -> Result<Option<Vec<u8>>, String> {
    let mut out = vec![];
    read_object(s, oid, &mut out)
        .map(|o| o.map(|_| out))
        .map_err(|e| e.to_string())
}

#[test]
fn the_store_loses_nothing_flushed_at_any_crash() {
    rounds("store", round);
}

fn round(r: u64) -> Report {
    let rec = recorder();
    let spec = ChunkerSpec::default();
    let mut oids = vec![];
    {
        let s = LocalStore::open_or_create(rec.path().join("store"), opts()).unwrap();
        for i in 0..8u64 {
            let (oid, _, _) = store_object(&s, &object(r, i)[..], &spec, |_| {}).unwrap();
            oids.push(oid);
            rec.mark(format!("put {i}"));
            if i % 3 == 2 {
                // From here object i - 2 may be gone; once acknowledged, it must be.
                rec.mark(format!("removing {}", i - 2));
                s.remove_object(&oids[i as usize - 2]).unwrap();
                s.flush().unwrap();
                rec.mark(format!("removed {}", i - 2));
                s.gc(0.9).unwrap();
                rec.mark("gc".to_string());
            }
        }
    }
    let trace = rec.finish();
    crash_all("store", &trace, |c| {
        let s = LocalStore::open_or_create(c.dir.join("store"), opts())
            .map_err(|e| format!("the store does not open: {e}"))?;
        for (i, oid) in oids.iter().enumerate() {
            let acked = c.acked.iter().any(|m| *m == format!("put {i}"));
            let removing = c.acked.iter().any(|m| *m == format!("removing {i}"));
            let removed = c.acked.iter().any(|m| *m == format!("removed {i}"));
            match read(&s, oid) {
                Ok(Some(_)) if removed => {
                    return Err(format!("object {i} was removed (acknowledged) and is back"))
                }
                Ok(Some(d)) if d == object(r, i as u64) => {}
                Ok(Some(_)) => return Err(format!("object {i} read back wrong")),
                Ok(None) if !acked || removing => {}
                Ok(None) => return Err(format!("object {i} was acknowledged and is gone")),
                // An unacknowledged object may be incomplete; it must say so, not read wrong.
                Err(_) if !acked || removing => {}
                Err(e) => return Err(format!("object {i} was acknowledged and fails: {e}")),
            }
        }
        let v = s.verify(|_| {}).map_err(|e| format!("verify: {e}"))?;
        if !v.damaged.is_empty() {
            return Err(format!(
                "verify names damage after a crash: {:?}",
                v.damaged
            ));
        }
        Ok(())
    })
}
