//! `ferry get`, `put` and `sync` over a remote shell as a user runs them: a bare destination,
//! a server killed mid-commit, a link that fails and is retried.

use super::*;

/// `ferry get HOST:FILE out`: a file fetched to a bare relative name, in the current directory
/// (the destination's writes are made beneath `.`; they once refused such a name as "not
/// beneath the destination").
#[test]
fn a_file_is_fetched_to_a_bare_relative_name() {
    let t = tempfile::tempdir().unwrap();
    let rsh = local_rsh(t.path(), "fake-ssh");
    let srv = t.path().join("srv");
    std::fs::create_dir_all(&srv).unwrap();
    std::fs::write(srv.join("f"), b"hello\n").unwrap();
    let here = t.path().join("here");
    std::fs::create_dir_all(&here).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args([
            "get",
            "-e",
            s(&rsh),
            "--remote-ferry",
            env!("CARGO_BIN_EXE_ferry"),
        ])
        .args(["--cache", s(&t.path().join("cache"))])
        .arg(format!("somehost:{}", srv.join("f").display()))
        .arg("out")
        .current_dir(&here)
        .env("XDG_CACHE_HOME", test_cache())
        .env("XDG_DATA_HOME", test_cache().join("data"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read(here.join("out")).unwrap(), b"hello\n");
}

/// `ferry get` through a real child process, the way ssh would run the far side: the "remote
/// shell" here drops the host name and runs the rest locally.
#[test]
fn get_over_a_remote_shell() {
    let t = tempfile::tempdir().unwrap();
    let rsh = local_rsh(t.path(), "fake-ssh");
    let srv = t.path().join("srv");
    std::fs::create_dir_all(srv.join("docs")).unwrap();
    let mut doc = data(3_000_000, 7);
    std::fs::write(srv.join("docs/report.bin"), &doc).unwrap();
    std::fs::write(srv.join("notes.txt"), b"hello\n").unwrap();
    let cache = t.path().join("cache");
    let dst = t.path().join("dst");
    let ferry_bin = env!("CARGO_BIN_EXE_ferry");
    let remote = format!("somehost:{}", srv.display());
    let args = |json: bool| {
        let mut v = vec![
            "get",
            "-e",
            s(&rsh),
            "--remote-ferry",
            ferry_bin,
            "--cache",
            s(&cache),
        ];
        if json {
            v.push("--json");
        }
        v
    };
    let mut a = args(true);
    a.extend([remote.as_str(), s(&dst)]);
    let first: serde_json::Value = serde_json::from_str(ok(&a).trim()).unwrap();
    assert_eq!(first["files"], 2);
    assert_eq!(std::fs::read(dst.join("docs/report.bin")).unwrap(), doc);
    assert_eq!(std::fs::read(dst.join("notes.txt")).unwrap(), b"hello\n");

    // Edit the server's copy near the front; fetch again: only the edit travels.
    doc.splice(100..100, b"a new paragraph".iter().copied());
    std::fs::write(srv.join("docs/report.bin"), &doc).unwrap();
    let second: serde_json::Value = serde_json::from_str(ok(&a).trim()).unwrap();
    assert_eq!(std::fs::read(dst.join("docs/report.bin")).unwrap(), doc);
    let received = second["bytes_received"].as_u64().unwrap();
    assert!(received < 60_000, "{second}");

    let listing = ok(&["ls", "-e", s(&rsh), "--remote-ferry", ferry_bin, &remote]);
    assert!(
        listing.contains("docs") && listing.contains("notes.txt"),
        "{listing}"
    );
    let o = ferry(&[
        "get",
        "-e",
        s(&rsh),
        "--remote-ferry",
        "/nonexistent/ferry",
        "--cache",
        s(&cache),
        &remote,
        s(&dst),
    ]);
    assert_eq!(
        o.status.code(),
        Some(4),
        "an unreachable far side is a link failure"
    );
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(e.contains("remote side exited"), "{e}");
    let e = fails(&["get", "--cache", s(&cache), s(&srv), s(&dst)]);
    assert!(e.contains("not a remote"), "{e}");

    // sync in both directions, with --delete.
    std::fs::write(dst.join("local-only"), b"x").unwrap();
    let v: serde_json::Value = serde_json::from_str(
        ok(&[
            "sync",
            "-e",
            s(&rsh),
            "--remote-ferry",
            ferry_bin,
            "--cache",
            s(&cache),
            "--delete",
            "--json",
            &remote,
            s(&dst),
        ])
        .trim(),
    )
    .unwrap();
    assert_eq!(v["deleted"], 1, "{v}");
    assert!(!dst.join("local-only").exists());
    std::fs::write(srv.join("server-only"), b"x").unwrap();
    let v: serde_json::Value = serde_json::from_str(
        ok(&[
            "sync",
            "-e",
            s(&rsh),
            "--remote-ferry",
            ferry_bin,
            "--delete",
            "--json",
            s(&dst),
            &remote,
        ])
        .trim(),
    )
    .unwrap();
    assert_eq!(v["deleted"], 1, "{v}");
    assert!(!srv.join("server-only").exists());
    assert!(fails(&["sync", s(&dst), s(&srv)]).contains("neither side is remote"));
    // --dry-run says what it would do and does nothing.
    std::fs::write(dst.join("new-here"), b"x").unwrap();
    let plan = ok(&[
        "sync",
        "-n",
        "--delete",
        "-e",
        s(&rsh),
        "--remote-ferry",
        ferry_bin,
        s(&dst),
        &remote,
    ]);
    assert!(
        plan.contains("would send") && plan.contains("new-here"),
        "{plan}"
    );
    assert!(!srv.join("new-here").exists());

    // And back: edit locally, put, and only the edit travels up.
    let mut mine = std::fs::read(dst.join("docs/report.bin")).unwrap();
    mine.extend_from_slice(b"appended locally");
    std::fs::write(dst.join("docs/report.bin"), &mine).unwrap();
    let up = format!("somehost:{}", srv.join("docs").display());
    let put: serde_json::Value = serde_json::from_str(
        ok(&[
            "put",
            "-e",
            s(&rsh),
            "--remote-ferry",
            ferry_bin,
            "--json",
            s(&dst.join("docs")),
            &up,
        ])
        .trim(),
    )
    .unwrap();
    assert_eq!(std::fs::read(srv.join("docs/report.bin")).unwrap(), mine);
    assert!(put["chunks_sent"].as_u64().unwrap() <= 2, "{put}");
    let put2: serde_json::Value = serde_json::from_str(
        ok(&[
            "put",
            "-e",
            s(&rsh),
            "--remote-ferry",
            ferry_bin,
            "--json",
            s(&dst.join("docs/report.bin")),
            &format!("somehost:{}", srv.join("docs/report.bin").display()),
        ])
        .trim(),
    )
    .unwrap();
    assert_eq!(std::fs::read(srv.join("docs/report.bin")).unwrap(), mine);
    assert!(put2["bytes_sent"].as_u64().unwrap() < 60_000, "{put2}");
}

/// The server killed at any moment of a commit leaves the file whole: the old version or the
/// new one, never a mix, and nothing half-written under the file's name.
#[test]
fn a_server_killed_during_commit_leaves_old_or_new() {
    use ferry_format::{chunk_object, HashAlg};
    use ferry_proto::{Hello, Message, Payload, Request, WritePart};
    use std::io::Write;
    use std::process::{Command, Stdio};

    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    std::fs::create_dir(&srv).unwrap();
    let old = data(8 << 20, 1);
    let new = data(8 << 20, 2);
    let mut chunks = vec![];
    let (_, oid) = chunk_object(
        &new[..],
        &ferry_chunk::ChunkerSpec::default(),
        HashAlg::Blake3,
        |c, d| {
            chunks.push((c.id, d.to_vec()));
            Ok::<_, std::io::Error>(())
        },
    )
    .unwrap();
    let mut outcomes = [0usize; 2];
    for delay_ms in [0u64, 5, 10, 20, 40, 60, 80, 120, 160, 240, 400] {
        std::fs::write(srv.join("f"), &old).unwrap();
        let staging = t.path().join(format!("cache-{delay_ms}"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["serve", "--stdio", s(&srv)])
            .env("XDG_CACHE_HOME", &staging)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut bytes = Message::Hello(Hello {
            version: ferry_proto::VERSION,
            features: 0,
            agent: "test".into(),
        })
        .encode(0, false)
        .unwrap();
        // Any version: the test commits against whatever is there (it reads the stat first).
        let version = {
            let export = ferry_fs::Export::open(&srv).unwrap();
            export.stat(&"f".into()).unwrap().0.version
        };
        bytes.extend(
            Message::Request(Request::Create {
                handle: 1,
                path: "f".into(),
                base: Some(version),
            })
            .encode(1, false)
            .unwrap(),
        );
        for (i, batch) in chunks.chunks(64).enumerate() {
            let lens = batch.iter().map(|(_, d)| d.len() as u32).collect();
            let data = batch.iter().flat_map(|(_, d)| d.iter().copied()).collect();
            bytes.extend(
                Message::Request(Request::Write {
                    handle: 1,
                    parts: vec![WritePart::Data {
                        lens,
                        payload: Payload::Plain(data),
                    }],
                })
                .encode(i as u32 + 2, false)
                .unwrap(),
            );
        }
        bytes.extend(
            Message::Request(Request::Commit {
                handle: 1,
                mode: 0o644,
                mtime_ns: 0,
                size: new.len() as u64,
                oid: oid.id(),
            })
            .encode(1000, false)
            .unwrap(),
        );
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&bytes);
            stdin
        });
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        let _ = child.kill();
        let _ = child.wait();
        drop(writer.join());
        let now = std::fs::read(srv.join("f")).unwrap();
        assert!(
            now == old || now == new,
            "delay {delay_ms} ms: the file is neither version"
        );
        outcomes[(now == new) as usize] += 1;
    }
    // Over the range of delays both outcomes should occur; if the machine is very fast or very
    // slow one may not, which is not a failure of atomicity.
    eprintln!(
        "old kept {} times, new committed {} times",
        outcomes[0], outcomes[1]
    );
    // Leftover temporaries of the killed servers are hidden from listings and removed by the
    // next commit in that directory.
    let temps = |dir: &Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                let n = e.as_ref().unwrap().file_name();
                let n = n.to_string_lossy();
                n.starts_with(".ferry-") && n.ends_with(".tmp")
            })
            .count()
    };
    eprintln!("{} temporaries left by killed servers", temps(&srv));
    // And one certainly left by a process that is gone (pid 4194303 is past Linux's default
    // pid_max of 4194304 only on the largest systems; check it is not running).
    if !Path::new("/proc/4194303").exists() {
        std::fs::write(
            srv.join(".ferry-4194303-00000000000000ff-1.tmp"),
            b"half a commit",
        )
        .unwrap();
    }
    assert!(temps(&srv) > 0);
    let rsh = local_rsh(t.path(), "fake-ssh");
    let remote = format!("h:{}", srv.display());
    let ferry = env!("CARGO_BIN_EXE_ferry");
    let listing = ok(&["ls", "-e", s(&rsh), "--remote-ferry", ferry, &remote]);
    assert!(!listing.contains(".ferry-"), "{listing}");
    std::fs::write(t.path().join("g"), b"another commit").unwrap();
    let g = format!("{remote}/g");
    ok(&[
        "put",
        "-e",
        s(&rsh),
        "--remote-ferry",
        ferry,
        s(&t.path().join("g")),
        &g,
    ]);
    assert_eq!(temps(&srv), 0);
}

/// `--retry` reconnects when the link fails, and only then.
#[test]
fn retry_reconnects_after_a_failed_link() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    std::fs::create_dir(&srv).unwrap();
    std::fs::write(srv.join("f"), data(100_000, 9)).unwrap();
    let mark = t.path().join("failed-once");
    let body = format!(
        "#!/bin/sh\nif [ ! -e '{}' ]; then touch '{}'; exit 255; fi\nshift\nexec \"$@\"\n",
        mark.display(),
        mark.display()
    );
    let rsh = script(t.path(), "flaky-ssh", &body);
    let bin = env!("CARGO_BIN_EXE_ferry");
    let remote = format!("h:{}", srv.join("f").display());
    let cache = t.path().join("cache");
    let out = t.path().join("out");
    let o = ferry(&[
        "get",
        "-e",
        s(&rsh),
        "--remote-ferry",
        bin,
        "--cache",
        s(&cache),
        &remote,
        s(&out),
    ]);
    assert_eq!(o.status.code(), Some(4), "a failed link exits 4");
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(
        e.matches("before the session began").count(),
        1,
        "said once: {e}"
    );
    std::fs::remove_file(&mark).unwrap();
    ok(&[
        "get",
        "--retry",
        "2",
        "-e",
        s(&rsh),
        "--remote-ferry",
        bin,
        "--cache",
        s(&cache),
        &remote,
        s(&out),
    ]);
    assert_eq!(std::fs::read(&out).unwrap(), data(100_000, 9));
}
