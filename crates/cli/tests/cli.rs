//! The `ferry` binary as a user runs it.

use std::path::Path;
use std::process::{Command, Output};

#[path = "cli/daemon.rs"]
mod daemon;
#[path = "cli/mount.rs"]
mod mount;
#[path = "cli/s3.rs"]
mod s3;
#[path = "cli/vault.rs"]
mod vault;

fn ferry(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .env_remove("FERRY_STORE")
        .env("XDG_CACHE_HOME", test_cache())
        .env("XDG_DATA_HOME", test_cache().join("data"))
        .output()
        .unwrap()
}

/// Where the servers these tests start keep their staging and history: not the user's cache,
/// and one place for every run (under the build's own temporary directory), not one left in
/// `/tmp` by each.
fn test_cache() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache")
}

fn ok(args: &[&str]) -> String {
    let o = ferry(args);
    assert!(
        o.status.success(),
        "ferry {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn fails(args: &[&str]) -> String {
    let o = ferry(args);
    assert_eq!(
        o.status.code(),
        Some(1),
        "ferry {args:?} should fail: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8(o.stderr).unwrap()
}

fn data(len: usize, seed: u8) -> Vec<u8> {
    let mut x = seed as u64 + 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn chunk_json_lines_cover_the_file() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("f");
    std::fs::write(&f, data(300_000, 1)).unwrap();
    for chunker in ["fastcdc", "lbfs", "fixed"] {
        let out = ok(&["chunk", "--json", "--chunker", chunker, s(&f)]);
        let mut next = 0u64;
        for line in out.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["offset"].as_u64().unwrap(), next);
            assert!(v["id"].as_str().unwrap().starts_with("blake3:"));
            next += v["length"].as_u64().unwrap();
        }
        assert_eq!(next, 300_000);
    }
    let text = ok(&[
        "chunk",
        "--hash",
        "sha256",
        "--avg",
        "4k",
        "--min",
        "1k",
        "--max",
        "16k",
        s(&f),
    ]);
    assert!(text.contains("sha256:") && text.contains("fastcdc2020-v1:1024:4096:16384"));
}

#[test]
fn bad_input_gives_clear_errors() {
    let t = tempfile::tempdir().unwrap();
    let missing = t.path().join("nope");
    assert!(fails(&["chunk", s(&missing)]).contains("nope"));
    assert!(fails(&["chunk", s(t.path())]).contains("not a regular file"));
    assert!(fails(&["chunk", "--avg", "3000", s(&missing)]).contains("power of two"));
    assert!(fails(&["chunk", "--chunker", "fixed", "--min", "4k", s(&missing)]).contains("fixed"));
    assert_eq!(
        ferry(&["chunk", "--chunker", "rabin", "x"]).status.code(),
        Some(2)
    );
    assert!(fails(&["similarity", s(&missing), s(t.path())]).contains("nope"));
    assert!(fails(&["store", "--store", s(&t.path().join("nostore")), "ls"]).contains("no store"));
    if Path::new("/proc/self/mem").exists() {
        // A regular file whose read fails (EIO): the error names it.
        assert!(fails(&["chunk", "/proc/self/mem"]).contains("/proc/self/mem"));
    }
}

#[test]
fn similarity_finds_the_shared_part() {
    let out = ok(&["similarity", "--example", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let (cdc, fixed) = (&v[0], &v[2]);
    assert!(cdc["overlap_pct"].as_f64().unwrap() > 85.0, "{cdc}");
    assert!(fixed["overlap_pct"].as_f64().unwrap() < 30.0, "{fixed}");
    assert!(ok(&["similarity", "--example"]).contains("lbfs-v1"));

    let t = tempfile::tempdir().unwrap();
    let (old, new) = (t.path().join("old"), t.path().join("new"));
    std::fs::create_dir_all(old.join("sub")).unwrap();
    std::fs::create_dir_all(new.join("moved")).unwrap();
    let a = data(200_000, 3);
    std::fs::write(old.join("sub/a"), &a).unwrap();
    std::fs::write(new.join("moved/renamed"), &a).unwrap(); // a rename costs nothing
    std::fs::write(new.join("fresh"), data(50_000, 4)).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&ok(&["similarity", "--json", s(&old), s(&new)])).unwrap();
    assert_eq!(v["new_files"], 2);
    let new_data = v["new_data"].as_u64().unwrap();
    assert!((50_000..60_000).contains(&new_data), "{v}");
}

#[test]
fn store_round_trip_damage_and_repair() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    let f = t.path().join("f");
    let content = data(500_000, 5);
    std::fs::write(&f, &content).unwrap();
    let added: serde_json::Value =
        serde_json::from_str(ok(&["store", "--store", s(&st), "add", "--json", s(&f)]).trim())
            .unwrap();
    let oid = added["oid"].as_str().unwrap().to_string();
    assert_eq!(added["new_bytes"], 500_000);
    let again: serde_json::Value =
        serde_json::from_str(ok(&["store", "--store", s(&st), "add", "--json", s(&f)]).trim())
            .unwrap();
    assert_eq!(again["new_bytes"], 0);
    assert!(ok(&["store", "--store", s(&st), "ls"]).contains(&oid));
    let out = t.path().join("out");
    ok(&["store", "--store", s(&st), "cat", &oid, "-o", s(&out)]);
    assert_eq!(std::fs::read(&out).unwrap(), content);
    let o = ferry(&["store", "--store", s(&st), "cat", &oid]);
    assert_eq!(o.stdout, content);
    assert!(ok(&["store", "--store", s(&st), "verify"]).contains("ok"));

    // Damage a pack: verify fails and names the chunk; re-adding repairs.
    let pack = std::fs::read_dir(st.join("packs"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut raw = std::fs::read(&pack).unwrap();
    raw[8 + 49 + 10] ^= 1;
    std::fs::write(&pack, raw).unwrap();
    let o = ferry(&["store", "--store", s(&st), "verify"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("DAMAGED blake3:"));
    assert!(fails(&[
        "store",
        "--store",
        s(&st),
        "cat",
        &oid,
        "-o",
        s(&t.path().join("bad"))
    ])
    .contains("damaged"));
    assert!(!t.path().join("bad").exists(), "no partial output file");
    ok(&["store", "--store", s(&st), "add", s(&f)]);
    assert!(ok(&["store", "--store", s(&st), "verify"]).contains("ok"));

    // Lose the index; rebuild it.
    std::fs::remove_file(st.join("index.redb")).unwrap();
    ok(&["store", "--store", s(&st), "rebuild"]);
    assert!(ok(&["store", "--store", s(&st), "ls"]).contains(&oid));

    // Remove, collect.
    ok(&["store", "--store", s(&st), "rm", &oid]);
    let gc: serde_json::Value =
        serde_json::from_str(ok(&["store", "--store", s(&st), "--json", "gc"]).trim()).unwrap();
    assert!(gc["chunks_removed"].as_u64().unwrap() > 10);
    let stats: serde_json::Value =
        serde_json::from_str(ok(&["store", "--store", s(&st), "stats", "--json"]).trim()).unwrap();
    assert_eq!(stats["chunks"], 0);
    assert!(fails(&["store", "--store", s(&st), "cat", &oid]).contains("no object"));
    assert_eq!(
        ferry(&["store", "--store", s(&st), "cat", "blake3:xyz"])
            .status
            .code(),
        Some(2)
    );
}

/// `ferry get HOST:FILE out`: a file fetched to a bare relative name, in the current directory
/// (the destination's writes are made beneath `.`; they once refused such a name as "not
/// beneath the destination").
#[test]
fn a_file_is_fetched_to_a_bare_relative_name() {
    let t = tempfile::tempdir().unwrap();
    let rsh = t.path().join("fake-ssh");
    std::fs::write(&rsh, "#!/bin/sh\nshift\nexec \"$@\"\n").unwrap();
    std::fs::set_permissions(&rsh, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
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
    let rsh = t.path().join("fake-ssh");
    std::fs::write(&rsh, "#!/bin/sh\nshift\nexec \"$@\"\n").unwrap();
    std::fs::set_permissions(&rsh, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
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
    let rsh = t.path().join("fake-ssh");
    std::fs::write(&rsh, "#!/bin/sh\nshift\nexec \"$@\"\n").unwrap();
    std::fs::set_permissions(&rsh, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
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
    let rsh = t.path().join("flaky-ssh");
    std::fs::write(
        &rsh,
        format!(
            "#!/bin/sh\nif [ ! -e '{}' ]; then touch '{}'; exit 255; fi\nshift\nexec \"$@\"\n",
            mark.display(),
            mark.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&rsh, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
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

/// A `ferry serve --listen` process with its own data and cache directories, killed on drop.
struct TlsDaemon {
    child: std::process::Child,
    port: u16,
    fingerprint: String,
}

impl TlsDaemon {
    fn start(home: &Path, export: &Path, port: u16) -> TlsDaemon {
        use std::io::BufRead;
        let mut child = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), s(export)])
            .env("XDG_DATA_HOME", home.join("data"))
            .env("XDG_CACHE_HOME", home.join("cache"))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        let port = first.rsplit(':').next().unwrap().parse().unwrap();
        let second = lines.next().unwrap().unwrap();
        let fingerprint = second.rsplit(' ').next().unwrap().to_string();
        let third = lines.next().unwrap().unwrap();
        assert!(third.contains("authorized client key"), "{third}");
        assert!(fingerprint.starts_with("blake3:"), "{second}");
        TlsDaemon {
            child,
            port,
            fingerprint,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("ferry://127.0.0.1:{}/{path}", self.port)
    }
}

impl Drop for TlsDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `ferry` as the user whose data and cache live under `home`.
fn ferry_as(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .env("XDG_DATA_HOME", home.join("data"))
        .env("XDG_CACHE_HOME", home.join("cache"))
        .output()
        .unwrap()
}

fn ok_as(home: &Path, args: &[&str]) -> String {
    let o = ferry_as(home, args);
    assert!(
        o.status.success(),
        "ferry {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn tls_daemon_serves_authorized_keys_and_pins_its_own() {
    let t = tempfile::tempdir().unwrap();
    let (srv, alice, bob) = (t.path().join("srv"), t.path().join("a"), t.path().join("b"));
    let export = t.path().join("export");
    std::fs::create_dir_all(export.join("sub")).unwrap();
    std::fs::write(export.join("sub/f"), data(200_000, 1)).unwrap();
    std::fs::write(export.join("small"), b"hi\n").unwrap();
    let d = TlsDaemon::start(&srv, &export, 0);

    // Not authorized yet: a clear refusal (not a link failure), and the server's key recorded.
    let o = ferry_as(&alice, &["ls", &d.url("")]);
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("not authorized"), "{e}");
    assert!(e.contains("first visit"), "{e}");
    let known = std::fs::read_to_string(alice.join("data/ferry/known_hosts")).unwrap();
    assert!(known.contains(&d.fingerprint), "{known}");

    let fp = ok_as(&alice, &["key", "show"]).trim().to_string();
    ok_as(&srv, &["key", "authorize", &fp, "alice"]);
    let ls = ok_as(&alice, &["ls", &d.url("")]);
    assert!(ls.contains("small") && ls.contains("sub"), "{ls}");
    let out = t.path().join("out");
    ok_as(&alice, &["get", &d.url("sub"), s(&out)]);
    assert_eq!(std::fs::read(out.join("f")).unwrap(), data(200_000, 1));
    std::fs::write(out.join("f"), data(250_000, 1)).unwrap();
    ok_as(&alice, &["sync", s(&out), &d.url("sub")]);
    assert_eq!(
        std::fs::read(export.join("sub/f")).unwrap(),
        data(250_000, 1)
    );

    // Another daemon with another key on the same address: refused, not trusted.
    let port = d.port;
    drop(d);
    let impostor = TlsDaemon::start(&t.path().join("impostor"), &export, port);
    let o = ferry_as(&alice, &["ls", &impostor.url("")]);
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("presents key") && e.contains(&impostor.fingerprint),
        "{e}"
    );
    drop(impostor);

    // "Have you got this chunk?" answers from the asking client's uploads, never another's.
    let d = TlsDaemon::start(&srv, &export, port);
    let fp_b = ok_as(&bob, &["key", "show"]).trim().to_string();
    ok_as(&srv, &["key", "authorize", &fp_b, "bob"]);
    ok_as(
        &bob,
        &["key", "trust", &format!("127.0.0.1:{port}"), &d.fingerprint],
    );
    let secret = data(5000, 77);
    let id = ferry_format::Id::hash(ferry_format::HashAlg::Blake3, &secret);
    let have = |home: &Path, put: bool| -> bool {
        use ferry_proto::{Reply, Request};
        let data_dir = home.join("data/ferry");
        let (me, _) = ferry_net::Identity::load_or_create(&data_dir).unwrap();
        let ep = ferry_net::Endpoint::parse(&d.url("")).unwrap().unwrap();
        let mut sess = ferry_net::connect(&ep, &me, &data_dir.join("known_hosts"), |_| {}).unwrap();
        if put {
            // The chunk sent as the data of an upload, which is then dropped: it stays staged.
            let create = Request::Create {
                handle: 1,
                path: "upload".into(),
                base: None,
            };
            sess.conn.call(create).unwrap();
            let write = Request::Write {
                handle: 1,
                parts: vec![ferry_proto::WritePart::Data {
                    lens: vec![secret.len() as u32],
                    payload: ferry_proto::Payload::Plain(secret.clone()),
                }],
            };
            sess.conn.call(write).unwrap();
            sess.conn.call(Request::Abort { handle: 1 }).unwrap();
        }
        let ids = ferry_proto::Ids::Full(vec![id]);
        let r = sess.conn.call(Request::Have { ids }).unwrap();
        sess.close().unwrap();
        match &r[..] {
            [Reply::Have(v)] => v[0],
            other => panic!("{other:?}"),
        }
    };
    assert!(!have(&bob, false));
    assert!(have(&alice, true), "the uploader's own chunk");
    assert!(!have(&bob, false), "another client's upload is no oracle");
    // A session that starts while the last one's server still holds the shared staging store
    // gets a private one (docs: a second session at once), so the next session is asked until
    // the last has let go: kept across sessions, however long the letting go takes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !have(&alice, false) {
        assert!(std::time::Instant::now() < deadline, "kept across sessions");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn the_cache_stays_within_its_bound() {
    let t = tempfile::tempdir().unwrap();
    let rsh = t.path().join("fake-ssh");
    std::fs::write(&rsh, "#!/bin/sh\nshift\nexec \"$@\"\n").unwrap();
    std::fs::set_permissions(&rsh, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
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
    let rsh = t.path().join("fake-ssh");
    std::fs::write(&rsh, "#!/bin/sh\nshift\nexec \"$@\"\n").unwrap();
    std::fs::set_permissions(&rsh, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
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
    let rsh = t.path().join("fake-ssh");
    std::fs::write(&rsh, "#!/bin/sh\nshift\nexec \"$@\"\n").unwrap();
    std::fs::set_permissions(&rsh, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
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
    let rsh = t.path().join("fake-ssh");
    std::fs::write(&rsh, "#!/bin/sh\nshift\nexec \"$@\"\n").unwrap();
    std::fs::set_permissions(&rsh, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
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
