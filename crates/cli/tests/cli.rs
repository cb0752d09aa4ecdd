//! The `ferry` binary as a user runs it.

use std::path::Path;
use std::process::{Command, Output};

#[path = "cli/daemon.rs"]
mod daemon;
#[path = "cli/mount.rs"]
mod mount;
#[path = "cli/remote.rs"]
mod remote;
#[path = "cli/s3.rs"]
mod s3;
#[path = "cli/sources.rs"]
mod sources;
#[path = "cli/tls.rs"]
mod tls;
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

/// An executable shell script `name` in `dir` with `body`.
fn script(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

/// A remote shell that drops the host and runs the command here (`ferry -e`).
fn local_rsh(dir: &Path, name: &str) -> std::path::PathBuf {
    script(dir, name, "#!/bin/sh\nshift\nexec \"$@\"\n")
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
