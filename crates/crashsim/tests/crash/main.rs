//! Scenarios run on the crash simulator: each crashed at every sync and rename, each state
//! reopened, recovered and checked. `FERRY_LONG=1` checks every crash point with many more
//! random mixes (the full run); `FERRY_CRASH_SEED=N` changes the mixes.

mod commit;
mod get;
mod mount;
mod objects;
mod shelf;
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

/// Mounts a recorder (the tests need root and /dev/fuse, as the real mount's do).
pub fn recorder() -> Recorder {
    Recorder::mount().expect("mounting the crash simulator (root and /dev/fuse are needed)")
}

/// Whether a recorder can be mounted here; says why not when it cannot (as the real mount's
/// tests do), so that a machine without FUSE skips these loudly instead of failing.
pub fn can_mount() -> bool {
    let root = rustix::process::getuid().is_root();
    let fuse = std::path::Path::new("/dev/fuse").exists();
    if !(root && fuse) {
        eprintln!("skipped: the crash simulator needs root and /dev/fuse (root: {root}, /dev/fuse: {fuse})");
    }
    root && fuse
}

/// Runs a scenario once (in CI) or over many rounds of varied sizes and edits (`FERRY_LONG=1`:
/// `FERRY_CRASH_ROUNDS`, 25 by default), and prints the totals.
pub fn rounds(name: &str, round: impl Fn(u64) -> Report) {
    if !can_mount() {
        return;
    }
    let long = std::env::var_os("FERRY_LONG").is_some_and(|v| v != "0");
    let n = match std::env::var("FERRY_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(n) => n,
        None if long => 25,
        None => 1,
    };
    let mut total = Report::default();
    for r in 0..n {
        let rep = round(r);
        total.crash_points += rep.crash_points;
        total.states += rep.states;
    }
    eprintln!(
        "{name} total: {n} rounds, {} crash points, {} states checked",
        total.crash_points, total.states
    );
}

/// Checks every crash state and prints what was tried.
pub fn crash_all(
    name: &str,
    trace: &Trace,
    check: impl FnMut(&ferry_crashsim::Crash<'_>) -> Result<(), String>,
) -> Report {
    crash_some(name, trace, Plan::from_env(), check)
}

/// Like [`crash_all`] with the given plan (a scenario whose checks are slow caps its crash
/// points outside the long mode).
pub fn crash_some(
    name: &str,
    trace: &Trace,
    plan: Plan,
    check: impl FnMut(&ferry_crashsim::Crash<'_>) -> Result<(), String>,
) -> Report {
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

/// Writes `data` to `path` as a careful program does (or, with `sync` false, as a careless one
/// does: no fsync before the rename).
fn commit_file(path: &std::path::Path, data: &[u8], sync: bool) {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).unwrap();
    f.write_all(data).unwrap();
    if sync {
        f.sync_all().unwrap();
    }
    std::fs::rename(&tmp, path).unwrap();
    std::fs::File::open(path.parent().unwrap())
        .unwrap()
        .sync_all()
        .unwrap();
}

fn careful_or_not(sync: bool) -> Result<Report, ferry_crashsim::Failure> {
    let rec = recorder();
    let f = rec.path().join("f");
    for (i, data) in [&b"old version"[..], b"new version"].iter().enumerate() {
        commit_file(&f, data, sync || i == 0);
        rec.mark(format!("{i}"));
    }
    let trace = rec.finish();
    let plan = Plan {
        random: 4,
        max_points: 0,
        seed: 1,
    };
    trace.check(plan, |c| {
        let got = std::fs::read(c.dir.join("f")).unwrap_or_default();
        match c.acked.len() {
            2 if got != b"new version" => Err(format!("f holds {got:?} after the new one")),
            1 if got != b"old version" && got != b"new version" => Err(format!("f holds {got:?}")),
            _ => Ok(()),
        }
    })
}

/// The checks can fail: a commit that renames before its data is synced is caught (the file
/// the rename made durable is empty), and the same commit with its fsync passes.
#[test]
fn a_commit_that_skips_its_fsync_is_caught() {
    if !can_mount() {
        return;
    }
    let f = careful_or_not(false).expect_err("the lost data must be found");
    assert!(f.message.contains("f holds []"), "{f}");
    let r = careful_or_not(true).unwrap();
    assert!(r.crash_points >= 8, "{r:?}");
}
