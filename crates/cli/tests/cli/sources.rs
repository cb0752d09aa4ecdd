//! Where a `get`'s chunks come from: the cache (within its bound), mirrors, lookaside
//! devices, and the link itself when it is fast.

use super::*;

#[test]
fn the_cache_stays_within_its_bound() {
    let t = tempfile::tempdir().unwrap();
    let rsh = local_rsh(t.path(), "fake-ssh");
    let srv = t.path().join("srv");
    std::fs::create_dir(&srv).unwrap();
    // Two trees of 3 MB in files each under a sixteenth of the bound (a larger file read
    // whole is not kept: it would push out everything else).
    for (tree, seed) in [("a", 1), ("b", 2)] {
        std::fs::create_dir(srv.join(tree)).unwrap();
        for i in 0..15u8 {
            let f = srv.join(tree).join(format!("f{i}"));
            std::fs::write(f, data(200_000, seed * 16 + i)).unwrap();
        }
    }
    let cache = t.path().join("cache");
    let get = |name: &str, dst: &str| -> serde_json::Value {
        let remote = format!("h:{}", srv.join(name).display());
        let dst = t.path().join(dst);
        let args = [
            "get",
            "--json",
            "-e",
            s(&rsh),
            "--remote-ferry",
            env!("CARGO_BIN_EXE_ferry"),
            "--cache",
            s(&cache),
            "--cache-size",
            "4M",
            &remote,
            s(&dst),
        ];
        serde_json::from_str(ok(&args).trim()).unwrap()
    };
    let packs = || -> u64 {
        std::fs::read_dir(cache.join("packs"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum()
    };
    get("a", "a1");
    assert!(packs() > 2_900_000, "{}", packs());
    get("b", "b1");
    assert!(packs() <= 4 << 20, "{} bytes of packs", packs());
    // The most recent file is the one kept.
    assert_eq!(get("b", "b2")["chunks_from_server"], 0);
    assert!(get("a", "a2")["chunks_from_server"].as_u64().unwrap() > 0);
}

#[test]
fn get_with_a_mirror_draws_on_both_and_survives_a_dead_one() {
    let t = tempfile::tempdir().unwrap();
    let rsh = local_rsh(t.path(), "fake-ssh");
    let (a, b) = (t.path().join("a/tree"), t.path().join("b/copy"));
    for root in [&a, &b] {
        std::fs::create_dir_all(root).unwrap();
        for i in 0..6u8 {
            std::fs::write(root.join(format!("f{i}")), data(1 << 20, i)).unwrap();
        }
    }
    let get = |mirrors: &[String], dst: &str| -> serde_json::Value {
        let dst = t.path().join(dst);
        let first = format!("h:{}", a.display());
        let mut args: Vec<&str> = vec!["get", "--json", "-e", s(&rsh)];
        args.extend(["--remote-ferry", env!("CARGO_BIN_EXE_ferry")]);
        for m in mirrors {
            args.extend(["--mirror", m]);
        }
        let cache = t
            .path()
            .join(format!("cache-{}", dst.display().to_string().len()));
        args.extend(["--cache", s(&cache), &first, s(&dst)]);
        let out = ok(&args);
        for i in 0..6u8 {
            assert_eq!(
                std::fs::read(dst.join(format!("f{i}"))).unwrap(),
                data(1 << 20, i)
            );
        }
        serde_json::from_str(out.trim()).unwrap()
    };
    let m = format!("h:{}", b.display());
    let j = get(std::slice::from_ref(&m), "d1");
    // Asked from the start (which of the two then answers faster is the machine's business).
    let mirror = &j["sources"][1];
    assert_eq!(mirror["name"], m.as_str(), "{j}");
    assert!(mirror["requests"].as_u64().unwrap() > 0, "{j}");
    // A mirror that cannot be reached: a warning, and the first server gives everything.
    let dead = format!("h:{}", t.path().join("nowhere").display());
    let j = get(&[dead], "d2-longer");
    assert_eq!(j["chunks_from_mirrors"], 0, "{j}");
}

#[test]
fn over_a_fast_link_small_new_files_come_whole_not_from_a_device() {
    // Through a local pipe (a round trip well under 5 ms: a LAN), small files come whole and
    // compressed even with a stick holding them all (a stick's opens of many small files cost
    // more than the link's transfer of them); a large one is still searched for on the stick.
    let t = tempfile::tempdir().unwrap();
    let home = t.path().join("home");
    let rsh = local_rsh(t.path(), "fake-ssh");
    let (export, stick) = (t.path().join("export"), t.path().join("stick"));
    std::fs::create_dir_all(export.join("src")).unwrap();
    std::fs::create_dir_all(&stick).unwrap();
    for i in 0..20u8 {
        let f = data(3_000, i);
        std::fs::write(export.join(format!("src/f{i}")), &f).unwrap();
        std::fs::write(stick.join(format!("f{i}")), &f).unwrap();
    }
    let big = data(400_000, 99);
    std::fs::write(export.join("big"), &big).unwrap();
    std::fs::write(stick.join("big"), &big).unwrap();
    ok_as(&home, &["lookaside", "index", s(&stick)]);
    let (dst, cache) = (t.path().join("dst"), t.path().join("cache"));
    let remote = format!("h:{}", export.display());
    // The link is judged near by its round trips (under 5 ms); on a machine busy enough that
    // none of a fetch's few came back so soon, the fetch is a far link's and takes the small
    // files from the stick too: fetched again, fresh, until one finds the pipe near.
    let mut runs = vec![];
    for _ in 0..30 {
        let _ = std::fs::remove_dir_all(&dst);
        let _ = std::fs::remove_dir_all(&cache);
        let out = ok_as(
            &home,
            &[
                "get",
                "--json",
                "-e",
                s(&rsh),
                "--remote-ferry",
                env!("CARGO_BIN_EXE_ferry"),
                "--cache",
                s(&cache),
                "--lookaside",
                s(&stick),
                "--no-borrowing",
                &remote,
                s(&dst),
            ],
        );
        let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        for i in 0..20u8 {
            let want = std::fs::read(export.join(format!("src/f{i}"))).unwrap();
            assert_eq!(std::fs::read(dst.join(format!("src/f{i}"))).unwrap(), want);
        }
        assert_eq!(std::fs::read(dst.join("big")).unwrap(), big);
        // The stick was asked for the large file's chunks only (without borrowing, its first
        // batch is its own): none of the small files' bytes.
        let stick_bytes = j["chunk_bytes_from_lookaside"].as_u64().unwrap();
        if stick_bytes > 0 && stick_bytes <= 400_000 {
            return;
        }
        runs.push(j);
    }
    panic!("every fetch took the small files from the stick: {runs:?}");
}

#[test]
fn lookaside_devices_supply_chunks_and_stale_ones_cost_only_time() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path().join("home");
    let rsh = local_rsh(t.path(), "fake-ssh");
    // The server holds v2; the stick an older copy, in its own layout.
    let (export, stick) = (t.path().join("export"), t.path().join("stick"));
    std::fs::create_dir_all(export.join("src")).unwrap();
    std::fs::create_dir_all(stick.join("backup-2025")).unwrap();
    for i in 0..8u8 {
        let old = data(100_000, i);
        let mut new = old.clone();
        if i % 2 == 0 {
            new[50_000..50_100].copy_from_slice(&[i; 100]);
        }
        std::fs::write(stick.join(format!("backup-2025/f{i}.old")), &old).unwrap();
        std::fs::write(export.join(format!("src/f{i}")), &new).unwrap();
    }
    let get = |dst: &str, extra: &[&str]| -> serde_json::Value {
        let dst = t.path().join(dst);
        let remote = format!("h:{}", export.display());
        let cache = t
            .path()
            .join(format!("cache-{}", dst.display().to_string().len()));
        let mut args = vec!["get", "--json", "-e", s(&rsh), "--remote-ferry"];
        args.extend([env!("CARGO_BIN_EXE_ferry"), "--cache", s(&cache)]);
        args.extend(extra);
        args.extend([remote.as_str(), s(&dst)]);
        let out = ok_as(&home, &args);
        for i in 0..8u8 {
            let want = std::fs::read(export.join(format!("src/f{i}"))).unwrap();
            assert_eq!(std::fs::read(dst.join(format!("src/f{i}"))).unwrap(), want);
        }
        serde_json::from_str(out.trim()).unwrap()
    };
    let list = || -> Vec<serde_json::Value> {
        ok_as(&home, &["lookaside", "list", "--json"])
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    assert!(ok_as(&home, &["lookaside", "list"]).contains("no lookaside devices"));
    let j: serde_json::Value =
        serde_json::from_str(ok_as(&home, &["lookaside", "index", "--json", s(&stick)]).trim())
            .unwrap();
    assert_eq!(
        (j["files"].as_u64(), j["kept"].as_str()),
        (Some(8), Some("device")),
        "{j}"
    );
    assert!(ok_as(&home, &["lookaside", "add", s(&stick)]).starts_with("added"));
    let l = list();
    assert_eq!(
        (l.len(), l[0]["state"].as_str()),
        (1, Some("ready")),
        "{l:?}"
    );

    // The stick is searched first; the changed chunks come from the server. (How much the
    // server takes besides depends on which of the two proves faster here; without borrowing,
    // the stick's first batch is its own.)
    let j = get("d1", &["--no-borrowing"]);
    let from_stick = j["chunks_from_lookaside"].as_u64().unwrap();
    assert!(from_stick > 0, "{j}");
    let total = j["chunk_bytes_from_lookaside"].as_u64().unwrap()
        + j["chunk_bytes_from_server"].as_u64().unwrap();
    assert_eq!(total, 800_000, "{j}");
    assert_eq!(list()[0]["supplied"]["chunks"].as_u64(), Some(from_stick));
    // Not this time.
    let j = get("d2-x", &["--no-lookaside"]);
    assert_eq!(j["chunks_from_lookaside"], 0, "{j}");

    // The stick changes behind the index's back: verify says so, and a fetch is still right.
    let mut f = std::fs::read(stick.join("backup-2025/f1.old")).unwrap();
    f.extend_from_slice(b"appended");
    std::fs::write(stick.join("backup-2025/f1.old"), f).unwrap();
    let o = ferry_as(&home, &["lookaside", "verify", s(&stick)]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("changed since indexed: backup-2025/f1.old")
    );
    get("d3-xx", &[]);
    assert!(list()[0]["supplied"]["stale_files"].as_u64().unwrap() >= 1);

    // A directory added without an index is indexed in the background.
    let other = t.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("x"), data(10_000, 9)).unwrap();
    assert!(ok_as(&home, &["lookaside", "add", s(&other)]).contains("in the background"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while list()[1]["state"] != "ready" {
        assert!(
            std::time::Instant::now() < deadline,
            "never indexed: {:?}",
            list()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    assert!(ok_as(&home, &["lookaside", "remove", s(&stick)]).starts_with("removed"));
    let o = ferry_as(&home, &["lookaside", "remove", s(&stick)]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is not a lookaside device"));
    let o = ferry_as(&home, &["lookaside", "add", s(&t.path().join("nowhere"))]);
    assert_eq!(o.status.code(), Some(1));
    assert!(ok_as(&home, &["lookaside", "clear"]).contains("removed 1"));
    assert!(list().is_empty());
}
