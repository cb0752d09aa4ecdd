//! Scenarios run on the crash simulator: each crashed at every sync and rename, each state
//! reopened, recovered and checked. `FERRY_LONG=1` checks every crash point with many more
//! random mixes (the full run); `FERRY_CRASH_SEED=N` changes the mixes.

mod commit;
mod store;
mod vault;

use ferry_crashsim::{Plan, Recorder, Report, Trace};

/// Deterministic bytes: `len` of them from `seed`.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    blake3::Hasher::new_derive_key("ferry crash tests")
        .update(&seed.to_le_bytes())
        .finalize_xof()
        .fill(&mut v);
    v
}

/// Mounts a recorder (the tests need root and /dev/fuse, as the mount's do).
pub fn recorder() -> Recorder {
    Recorder::mount().expect("mounting the crash simulator (root and /dev/fuse are needed)")
}

/// Checks every crash state and prints what was tried.
pub fn crash_all(
    name: &str,
    trace: &Trace,
    check: impl FnMut(&ferry_crashsim::Crash<'_>) -> Result<(), String>,
) -> Report {
    let plan = Plan::from_env();
    match trace.check(plan, check) {
        Ok(r) => {
            eprintln!(
                "{name}: {} operations, {} crash points, {} states checked",
                trace.ops.len(),
                r.crash_points,
                r.states
            );
            assert!(r.crash_points > 10, "{name}: too few crash points: {r:?}");
            r
        }
        Err(f) => panic!("{name}: {f}"),
    }
}
