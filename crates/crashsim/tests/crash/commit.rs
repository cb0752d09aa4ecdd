//! The file server's commit (upload to a temporary file, fsync, keep the old version in the
//! trash, rename, fsync the directory), driven by the real client over an in-process socket and
//! crashed everywhere: every file on the server is whole (one version someone put, never torn
//! or mixed), every acknowledged put is there, and no acknowledged deletion comes back.

use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;
use std::path::Path;

use ferry_chunk::ChunkerSpec;
use ferry_fs::{Connection, Export, Server, ServerOptions};
use ferry_store::MemStore;

use ferry_crashsim::Report;

use crate::{bytes, crash_all, crash_some, recorder, rounds};

/// The tree of version `v` in round `r`: name → content (a file absent from a version is
/// deleted by it).
pub fn version(r: u64, v: u64) -> BTreeMap<String, Vec<u8>> {
    let s = r << 32;
    let mut t = BTreeMap::new();
    t.insert(
        "small".into(),
        bytes(s | (10 + v), 100 + (r as usize * 331) % 8_000),
    );
    let mut big = bytes(s | 1, 30_000 + (r as usize * 7_919) % 90_000);
    let at = ((r + v) as usize * 10_007) % (big.len() - 100);
    big.splice(at..at + 50, bytes(s | (20 + v), 400));
    t.insert("dir/big".into(), big);
    if v != 2 {
        t.insert(format!("dir/only{}", v % 2), bytes(s | (30 + v), 5_000));
    }
    if v < 2 {
        t.insert("gone".into(), bytes(s | 40, 3_000));
    }
    t
}

pub fn connect(root: &Path) -> Connection<UnixStream, UnixStream> {
    connect_asking(root, 0)
}

/// A session that asks for the optional features `ask` (a mount's: `FEATURE_DEFERRED_SYNC`).
pub fn connect_asking(root: &Path, ask: u64) -> Connection<UnixStream, UnixStream> {
    connect_with(root, ask, grouping())
}

/// A session asking for `ask`, its server with options `opts`.
fn connect_with(root: &Path, ask: u64, opts: ServerOptions) -> Connection<UnixStream, UnixStream> {
    let (a, b) = UnixStream::pair().unwrap();
    let export = Export::open(root).unwrap();
    std::thread::spawn(move || {
        let staging = std::sync::Arc::new(MemStore::new(ferry_format::HashAlg::Blake3));
        let mut server = Server::new(export, opts, staging);
        let _ = ferry_fs::serve(&mut server, a.try_clone().unwrap(), a);
    });
    Connection::open_asking(b.try_clone().unwrap(), b, ferry_fs::DEFAULT_ZSTD_LEVEL, ask).unwrap()
}

pub fn write_tree(dir: &Path, t: &BTreeMap<String, Vec<u8>>) {
    let _ = std::fs::remove_dir_all(dir);
    for (name, data) in t {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
}

/// The regular files beneath `root`, by path, without the server's own (trash, temporaries).
pub fn files_of(root: &Path) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| e.to_string())? {
            let e = e.map_err(|e| e.to_string())?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(".ferry-") {
                continue;
            }
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.insert(rel, std::fs::read(&p).map_err(|e| e.to_string())?);
            }
        }
    }
    Ok(out)
}

#[test]
fn a_server_commit_is_whole_and_durable_at_any_crash() {
    rounds("commit", round);
}

/// A mount's session (`FEATURE_DEFERRED_SYNC`): each commit, creation and removal is whole at
/// any crash, and what was put is durable once a Sync is answered, not before it is asked.
#[test]
fn a_deferred_sync_session_is_whole_at_any_crash_and_durable_after_sync() {
    rounds("deferred-sync", |r| {
        deferred_round(r, true, ferry_crashsim::Plan::from_env()).unwrap_or_else(|f| panic!("{f}"))
    });
}

/// The check above can fail: the same session acknowledging each version without its Sync
/// loses one at some crash.
#[test]
fn a_deferred_sync_session_without_its_sync_is_caught() {
    if !crate::can_mount() {
        return;
    }
    let plan = ferry_crashsim::Plan {
        random: 4,
        max_points: 0,
        seed: 1,
    };
    let f = deferred_round(1, false, plan).expect_err("an unsynced version must be lost somewhere");
    assert!(f.message.contains("acknowledged"), "{f}");
}

/// The mount's fsync: a commit that takes its Sync along (`PutOptions::sync_after`, one round
/// trip) is durable once answered, the file's first version (a new name) as well as the next.
#[test]
fn a_commit_with_its_sync_is_durable_once_answered() {
    rounds("commit-sync", |r| {
        let rec = recorder();
        let export = rec.path().join("export");
        std::fs::create_dir(&export).unwrap();
        let local = tempfile::tempdir().unwrap();
        let src = local.path().join("f");
        let mut c = connect_asking(&export, ferry_proto::FEATURE_DEFERRED_SYNC);
        let versions: Vec<BTreeMap<String, Vec<u8>>> = (0..3)
            .map(|v| BTreeMap::from([("f".to_string(), version(r, v)["dir/big"].clone())]))
            .collect();
        let mut replacing = None;
        for (v, t) in versions.iter().enumerate() {
            std::fs::write(&src, &t["f"]).unwrap();
            let opts = ferry_fs::PutOptions {
                sync_after: true,
                ..put_options(true)
            };
            let mut stats = ferry_fs::PutStats::default();
            let remote = "f".into();
            let a = ferry_fs::put_file(
                &mut c,
                &src,
                &remote,
                replacing.clone(),
                0o644,
                &opts,
                &mut stats,
            )
            .unwrap();
            assert!(stats.synced);
            replacing = Some(ferry_fs::Replacing {
                version: a.version,
                empty: false,
                recipe: None,
            });
            rec.mark(format!("{v}"));
        }
        drop(c);
        crash_all("commit-sync", &rec.finish(), export_holds(&versions))
    });
}

/// Small files whose Create, Write and Commit go together, as a mount's queue sends them: the
/// server syncs their temporary files as a group before it renames each, and at any crash
/// every file is absent or whole; once their answers came, all are there (a session that
/// does not defer its syncs), or once a Sync is answered (one that does).
#[test]
fn commits_sent_together_are_synced_as_a_group_and_whole_at_any_crash() {
    for deferred in [false, true] {
        rounds("group", |r| {
            group_round(r, deferred, grouping(), 2..=usize::MAX)
        })
    }
}

/// The same commits to a server whose syncs cost less than grouping is worth
/// (`ServerOptions::group_sync_min`, set here past any disk's): each installed at once.
#[test]
fn commits_are_not_grouped_where_syncs_cost_nothing() {
    let opts = ServerOptions {
        group_sync_min: std::time::Duration::from_secs(3600),
        ..ServerOptions::default()
    };
    rounds("ungrouped", |r| group_round(r, false, opts.clone(), 1..=1))
}

/// A round of [`commits_sent_together_are_synced_as_a_group_and_whole_at_any_crash`]: the
/// syncs before the first rename must be `syncs_before` many.
fn group_round(
    r: u64,
    deferred: bool,
    opts: ServerOptions,
    syncs_before: std::ops::RangeInclusive<usize>,
) -> Report {
    let rec = recorder();
    let export = rec.path().join("export");
    std::fs::create_dir(&export).unwrap();
    let ask = if deferred {
        ferry_proto::FEATURE_DEFERRED_SYNC
    } else {
        0
    };
    let mut c = connect_with(&export, ask, opts);
    let files: BTreeMap<String, Vec<u8>> = (0..12u64)
        .map(|i| {
            (
                format!("f{i}"),
                bytes((r << 32) | i, 200 + (i as usize * 997) % 5_000),
            )
        })
        .collect();
    let mut ids = vec![];
    for (h, (name, data)) in files.iter().enumerate() {
        let h = h as u32 + 1;
        c.send(ferry_proto::Request::Create {
            handle: h,
            path: name.as_str().into(),
            base: None,
        })
        .unwrap();
        c.send(ferry_proto::Request::Write {
            handle: h,
            parts: vec![ferry_proto::WritePart::Data {
                lens: vec![data.len() as u32],
                payload: ferry_proto::Payload::Plain(data.clone()),
            }],
        })
        .unwrap();
        ids.push(
            c.send(ferry_proto::Request::Commit {
                handle: h,
                mode: 0o644,
                mtime_ns: 0,
                size: data.len() as u64,
                oid: ferry_format::Id::hash(ferry_format::HashAlg::Blake3, data),
            })
            .unwrap(),
        );
    }
    for id in ids {
        let replies = c.replies(id).unwrap();
        assert!(
            matches!(replies.last(), Some(ferry_proto::Reply::Attr(_))),
            "{replies:?}"
        );
    }
    if deferred {
        c.call(ferry_proto::Request::Sync).unwrap();
    }
    rec.mark("all");
    drop(c);
    let trace = rec.finish();
    // Grouped: temporary files synced one after another before the first rename (not
    // grouped: one).
    let first_rename = trace
        .ops
        .iter()
        .position(|o| matches!(o, ferry_crashsim::model::Op::Rename { .. }))
        .unwrap();
    let synced_first = trace.ops[..first_rename]
        .iter()
        .filter(|o| matches!(o, ferry_crashsim::model::Op::Fsync { .. }))
        .count();
    assert!(
        syncs_before.contains(&synced_first),
        "{synced_first} syncs before the first rename, {syncs_before:?} wanted"
    );
    crash_all("group", &trace, |c| {
        let export = c.dir.join("export");
        let have = if export.exists() {
            files_of(&export)?
        } else {
            BTreeMap::new()
        };
        for (name, data) in &have {
            if files.get(name) != Some(data) {
                return Err(format!("{name} is not whole"));
            }
        }
        if !c.acked.is_empty() && have.len() != files.len() {
            return Err(format!(
                "{} of {} files after their answers",
                have.len(),
                files.len()
            ));
        }
        Ok(())
    })
}

/// A file of two names (`f` and `g`, one inode) committed to in place: at any crash, once the
/// next session has started, both names are one file holding one whole version put since the
/// last acknowledged (the old one, or the new one finished from its redo record), never a mix.
#[test]
fn an_in_place_commit_to_a_linked_file_is_whole_at_any_crash() {
    rounds("in-place", |r| {
        let rec = recorder();
        let export = rec.path().join("export");
        std::fs::create_dir(&export).unwrap();
        let local = tempfile::tempdir().unwrap();
        let src = local.path().join("f");
        let mut c = connect_asking(&export, ferry_proto::FEATURE_HARD_LINKS);
        let versions: Vec<Vec<u8>> = (0..3).map(|v| version(r, v)["dir/big"].clone()).collect();
        let mut replacing = None;
        for (v, data) in versions.iter().enumerate() {
            std::fs::write(&src, data).unwrap();
            let mut stats = ferry_fs::PutStats::default();
            let opts = put_options(false);
            ferry_fs::put_file(
                &mut c,
                &src,
                &"f".into(),
                replacing,
                0o644,
                &opts,
                &mut stats,
            )
            .unwrap();
            if v == 0 {
                c.call(ferry_proto::Request::Link {
                    from: "f".into(),
                    to: "g".into(),
                })
                .unwrap();
            }
            // (A link changes the file's version.)
            let version = match c.call(ferry_proto::Request::GetAttr { path: "f".into() }) {
                Ok(mut r) => match r.pop() {
                    Some(ferry_proto::Reply::Attr(a)) => a.version,
                    r => panic!("{r:?}"),
                },
                Err(e) => panic!("{e}"),
            };
            replacing = Some(ferry_fs::Replacing {
                version,
                empty: false,
                recipe: None,
            });
            rec.mark(format!("{v}"));
        }
        drop(c);
        // Cheap to check: many mixes even outside the long mode (two miss a torn copy).
        let plan = ferry_crashsim::Plan {
            random: 24,
            ..ferry_crashsim::Plan::from_env()
        };
        crash_some("in-place", &rec.finish(), plan, |c| {
            let export = c.dir.join("export");
            let acked = c.acked.iter().filter_map(|m| m.parse::<usize>().ok()).max();
            linked_holds(&export, &versions, acked)
        })
    });
}

/// The check of [`an_in_place_commit_to_a_linked_file_is_whole_at_any_crash`]: a session's
/// start finishes what was recorded, then `f` and `g` are checked.
fn linked_holds(export: &Path, versions: &[Vec<u8>], acked: Option<usize>) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    if !export.exists() {
        return if acked.is_none() {
            Ok(())
        } else {
            Err("the export is gone".into())
        };
    }
    let e = Export::open(export).map_err(|e| e.to_string())?;
    ferry_fs::inplace::finish_interrupted(&e).map_err(|e| format!("finishing: {e}"))?;
    let read = |n: &str| std::fs::read(export.join(n)).ok();
    let (f, g) = (read("f"), read("g"));
    let from = acked.unwrap_or(0);
    for (name, data) in [("f", &f), ("g", &g)] {
        if let Some(d) = data {
            if !versions[from..].contains(d) {
                return Err(format!(
                    "{name} is not a whole version put since the last acknowledged"
                ));
            }
        }
    }
    if acked.is_some() {
        let ino = |n: &str| std::fs::metadata(export.join(n)).map(|m| m.ino()).ok();
        if f.is_none() || g.is_none() || ino("f") != ino("g") {
            return Err("f and g are no longer one acknowledged file".into());
        }
    }
    Ok(())
}

fn deferred_round(
    r: u64,
    sync: bool,
    plan: ferry_crashsim::Plan,
) -> Result<Report, ferry_crashsim::Failure> {
    const VERSIONS: u64 = 3;
    let rec = recorder();
    let export = rec.path().join("export");
    std::fs::create_dir(&export).unwrap();
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("src");
    let mut c = connect_asking(&export, ferry_proto::FEATURE_DEFERRED_SYNC);
    for v in 0..VERSIONS {
        write_tree(&src, &version(r, v));
        let opts = put_options(true);
        let mut stats = ferry_fs::PutStats::default();
        ferry_fs::put(&mut c, &src, &"".into(), &opts, &mut stats).unwrap();
        if sync {
            c.call(ferry_proto::Request::Sync).unwrap();
        }
        rec.mark(format!("{v}"));
    }
    drop(c);
    let trace = rec.finish();
    let versions: Vec<_> = (0..VERSIONS).map(|v| version(r, v)).collect();
    trace.check(plan, export_holds(&versions))
}

/// `ferry put --delete`'s options, with or without the mount's fewer round trips.
fn put_options(fewer_round_trips: bool) -> ferry_fs::PutOptions<'static> {
    ferry_fs::PutOptions {
        chunker: ChunkerSpec::default(),
        delete: true,
        dry_run: false,
        progress: None,
        cache: None,
        fewer_round_trips,
        stat_after: None,
        sync_after: false,
    }
}

fn round(r: u64) -> Report {
    const VERSIONS: u64 = 3;
    let rec = recorder();
    let export = rec.path().join("export");
    std::fs::create_dir(&export).unwrap();
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("src");
    for v in 0..VERSIONS {
        write_tree(&src, &version(r, v));
        let opts = put_options(false);
        let mut stats = ferry_fs::PutStats::default();
        ferry_fs::put(&mut connect(&export), &src, &"".into(), &opts, &mut stats).unwrap();
        rec.mark(format!("{v}"));
    }
    let trace = rec.finish();
    let versions: Vec<_> = (0..VERSIONS).map(|v| version(r, v)).collect();
    crash_all("commit", &trace, export_holds(&versions))
}

/// The check of a crash state of a run that put `versions` into `export`, each marked with its
/// index once acknowledged: see [`same_or_newer`].
fn export_holds(
    versions: &[BTreeMap<String, Vec<u8>>],
) -> impl FnMut(&ferry_crashsim::Crash<'_>) -> Result<(), String> + '_ {
    |c| {
        let acked = c.acked.iter().filter_map(|m| m.parse::<usize>().ok()).max();
        same_or_newer(&c.dir.join("export"), versions, acked)
    }
}

/// Every file beneath `root` is one whole version put since the last acknowledged (`acked`),
/// what that version holds is there (or a later one's), and what it deleted stays deleted
/// unless a later, unacknowledged version brought it back.
pub fn same_or_newer(
    root: &Path,
    versions: &[BTreeMap<String, Vec<u8>>],
    acked: Option<usize>,
) -> Result<(), String> {
    let have = if root.exists() {
        files_of(root)?
    } else {
        BTreeMap::new()
    };
    for (name, data) in &have {
        let from = acked.unwrap_or(0);
        if !versions[from..].iter().any(|t| t.get(name) == Some(data)) {
            return Err(format!(
                "{name} is not a version put since the last acknowledged"
            ));
        }
    }
    let Some(acked) = acked else { return Ok(()) };
    for name in versions[acked].keys() {
        if !have.contains_key(name) && versions[acked..].iter().all(|t| t.contains_key(name)) {
            return Err(format!("{name} was acknowledged and is gone"));
        }
    }
    for name in have.keys() {
        if !versions[acked..].iter().any(|t| t.contains_key(name)) {
            return Err(format!(
                "{name} was deleted by an acknowledged version and is back"
            ));
        }
    }
    Ok(())
}

/// A server's options with commits always grouped (see `ServerOptions::group_sync_min`), so
/// the sessions of these tests take that path whatever the disk's speed.
fn grouping() -> ServerOptions {
    ServerOptions {
        group_sync_min: std::time::Duration::ZERO,
        ..ServerOptions::default()
    }
}
