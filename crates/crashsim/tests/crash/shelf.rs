//! The transfer daemon's shelf (`ferry_daemon::shelf::Shelf`) on the simulator: its secret,
//! made at the first open, signs every capability the daemon hands out, so a crash must never
//! lose or change a secret once a capability was made with it; objects put through it at
//! durability 1 read back whole by their capabilities after any crash; and a shelf whose first
//! open was cut short opens.

use ferry_crashsim::Report;
use ferry_daemon::shelf::Shelf;

use crate::{bytes, crash_some, recorder, rounds};

#[test]
fn the_daemons_shelf_keeps_its_secret_and_objects_at_any_crash() {
    rounds("shelf", round);
}

fn object(r: u64, i: u64) -> Vec<u8> {
    bytes(
        r << 32 | (500 + i),
        1_000 + (r * 6_007 + i * 2_999) as usize % 30_000,
    )
}

fn round(r: u64) -> Report {
    const N: u64 = 3;
    let rec = recorder();
    let dir = rec.path().join("shelf");
    let mut caps = vec![];
    {
        let shelf = Shelf::open(&dir).unwrap();
        rec.mark("open");
        for i in 0..N {
            let d = object(r, i);
            let made = shelf.objects().create(&d[..], d.len() as u64, 1).unwrap();
            caps.push(made.cap);
            rec.mark(format!("{i}"));
        }
    }
    let trace = rec.finish();
    // Each check opens a whole shelf (an object store and a chunk store: about 0.1 s here):
    // outside the long mode, a few crash points spread over the run.
    let mut plan = ferry_crashsim::Plan::from_env();
    if plan.max_points != 0 {
        plan.max_points = 16;
    }
    crash_some("shelf", &trace, plan, |c| {
        let shelf = Shelf::open(&c.dir.join("shelf"))
            .map_err(|e| format!("the shelf does not open: {e}"))?;
        for (i, cap) in caps.iter().enumerate() {
            if !c.acked.contains(&format!("{i}")) {
                continue;
            }
            let mut got = vec![];
            shelf
                .objects()
                .read(cap, 0, u64::MAX, &mut got)
                .map_err(|e| format!("object {i}, acknowledged: {e}"))?;
            if got != object(r, i as u64) {
                return Err(format!("object {i} reads {} wrong bytes", got.len()));
            }
        }
        Ok(())
    })
}
