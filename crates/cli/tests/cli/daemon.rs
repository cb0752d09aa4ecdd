//! `ferry daemon` and `ferry object` as a user runs them: two users' daemons (two homes,
//! found through XDG_DATA_HOME and XDG_RUNTIME_DIR alone) exchanging a file by ticket.

use std::path::Path;
use std::process::{Command, Output};

fn ferry_in(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .env_remove("FERRY_DAEMON_DIR")
        .env("XDG_DATA_HOME", home.join("data"))
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("XDG_RUNTIME_DIR", home.join("run"))
        .output()
        .unwrap()
}

fn ok_in(home: &Path, args: &[&str]) -> String {
    let o = ferry_in(home, args);
    assert!(
        o.status.success(),
        "ferry {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Stops the daemon of a home when the test ends, however it ends.
struct Running<'a>(&'a Path);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let _ = ferry_in(self.0, &["daemon", "stop"]);
    }
}

#[test]
fn objects_move_between_two_users_daemons_by_ticket() {
    let t = tempfile::tempdir().unwrap();
    let (alice, bob) = (t.path().join("alice"), t.path().join("bob"));
    let none = ferry_in(&alice, &["object", "put", "/etc/hostname"]);
    assert_eq!(none.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&none.stderr).contains("ferry daemon"));
    let mut running = vec![];
    for home in [&alice, &bob] {
        ok_in(home, &["daemon", "--detach", "--listen", "127.0.0.1:0"]);
        running.push(Running(home));
    }
    let status: serde_json::Value =
        serde_json::from_str(&ok_in(&alice, &["daemon", "status", "--json"])).unwrap();
    assert!(status["socket"]
        .as_str()
        .unwrap()
        .starts_with(alice.to_str().unwrap()));
    let src = t.path().join("report.bin");
    let bytes = super::data(1_500_000, 9);
    std::fs::write(&src, &bytes).unwrap();
    let ticket = ok_in(&alice, &["object", "put", src.to_str().unwrap()]);
    let ticket = ticket.trim();
    assert!(ticket.starts_with("ferry2"), "{ticket}");
    let out = t.path().join("got.bin");
    let json = ok_in(
        &bob,
        &[
            "object",
            "get",
            ticket,
            "-o",
            out.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(std::fs::read(&out).unwrap(), bytes);
    let r: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(r["state"], "done");
    assert_eq!(r["report"]["size"], 1_500_000);
    assert_eq!(r["report"]["sources"][0]["bytes"], 1_500_000);
    let streamed = ferry_in(&bob, &["object", "get", ticket, "-o", "-"]);
    assert!(streamed.status.success());
    assert!(streamed.stdout == bytes);
    let stat = ok_in(&bob, &["object", "stat", ticket, "--json"]);
    let stat: serde_json::Value = serde_json::from_str(&stat).unwrap();
    // Alice's ticket names Alice's object: Bob's daemon holds a copy of its own.
    assert_eq!(
        (stat["here"].clone(), stat["size"].clone()),
        (false.into(), 1_500_000.into())
    );
    // A damaged ticket is refused before anything is asked.
    let mut bad = ticket.to_string();
    bad.truncate(bad.len() - 3);
    let o = ferry_in(&bob, &["object", "get", &bad, "-o", "x"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("ticket"));
}

/// Bullet's interface as a user types it: create at a durability, SIZE, READ of a range,
/// restrict offline, DELETE with and without the right; names in versioned directories.
#[test]
fn objects_capabilities_and_directories_from_the_command_line() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path().join("h");
    ok_in(&home, &["daemon", "--detach", "--no-listen"]);
    let _running = Running(&home);
    let src = t.path().join("f");
    let bytes = super::data(300_000, 3);
    std::fs::write(&src, &bytes).unwrap();
    let put = ok_in(
        &home,
        &["object", "put", "-P", "0", "--json", src.to_str().unwrap()],
    );
    let put: serde_json::Value = serde_json::from_str(&put).unwrap();
    assert_eq!(put["durability"], 0);
    let ticket = put["ticket"].as_str().unwrap();
    let stat = ok_in(&home, &["object", "stat", ticket, "--json"]);
    let stat: serde_json::Value = serde_json::from_str(&stat).unwrap();
    assert_eq!(
        (stat["here"].clone(), stat["size"].clone()),
        (true.into(), 300_000.into())
    );
    let range = ferry_in(&home, &["object", "get", ticket, "--range", "1000-1100"]);
    assert!(range.status.success());
    assert!(range.stdout == bytes[1000..1100]);
    let out = t.path().join("out");
    ok_in(
        &home,
        &["object", "get", ticket, "-o", out.to_str().unwrap()],
    );
    assert!(std::fs::read(&out).unwrap() == bytes);
    let reader = ok_in(&home, &["object", "restrict", ticket, "--rights", "read"]);
    let reader = reader.trim();
    let o = ferry_in(&home, &["object", "rm", reader]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not with this capability"));
    let o = ferry_in(&home, &["object", "restrict", reader, "--rights", "read"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("restrict right"));
    // Names.
    ok_in(&home, &["dir", "mkdir", "docs"]);
    ok_in(&home, &["dir", "set", "docs/report", reader]);
    assert_eq!(ok_in(&home, &["dir", "get", "docs/report"]).trim(), reader);
    let o = ferry_in(
        &home,
        &["dir", "set", "--if-version", "0", "docs/late", ticket],
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "made against version 0 when 1 is current"
    );
    ok_in(&home, &["dir", "rm", "docs/report"]);
    let h = ok_in(&home, &["dir", "history", "docs/report", "--json"]);
    let h: serde_json::Value = serde_json::from_str(&h).unwrap();
    assert_eq!(h[0]["ticket"], reader);
    assert!(h[1]["ticket"].is_null());
    let ls = ok_in(&home, &["dir", "ls", "docs", "--version", "1", "--json"]);
    let ls: serde_json::Value = serde_json::from_str(&ls).unwrap();
    assert_eq!(ls["entries"][0]["name"], "report");
    // Deleted with the owner's ticket: gone for every capability.
    ok_in(&home, &["object", "rm", ticket]);
    let o = ferry_in(&home, &["object", "get", reader, "--range", "0-10"]);
    assert_eq!(o.status.code(), Some(1));
}

/// Authorizes the key of the user whose home is `me` at the daemon of the home `lan`.
fn authorize(me: &Path, lan: &Path) {
    let me_key = ok_in(me, &["key", "show"]);
    let fp = me_key
        .split_whitespace()
        .find(|w| w.starts_with("blake3:"))
        .unwrap();
    std::fs::write(lan.join("data/ferry/authorized_keys"), format!("{fp} me\n")).unwrap();
}

/// A remote shell that runs the command here, as this user, in `dir/ssh-here`.
fn ssh_here(dir: &Path) -> std::path::PathBuf {
    super::local_rsh(dir, "ssh-here")
}

/// `ferry get --json` of `remote` into `dst` over `rsh`, as the user whose home is `home`: its
/// summary.
fn get_json(home: &Path, rsh: &Path, remote: &str, dst: &Path) -> serde_json::Value {
    let out = ok_in(
        home,
        &[
            "get",
            "--json",
            "-e",
            rsh.to_str().unwrap(),
            "--remote-ferry",
            env!("CARGO_BIN_EXE_ferry"),
            remote,
            dst.to_str().unwrap(),
        ],
    );
    serde_json::from_str(out.lines().last().unwrap()).unwrap()
}

/// What the source named `name` did in a `get --json` summary, if it took part.
fn source(summary: &serde_json::Value, name: &str) -> Option<serde_json::Value> {
    summary["sources"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == name)
        .cloned()
}

/// A remote shell that runs the command here, as the user whose home is `home`.
fn fake_ssh(dir: &Path, home: &Path) -> std::path::PathBuf {
    let name = format!("ssh-as-{}", home.file_name().unwrap().to_string_lossy());
    let h = home.display();
    let body = format!(
        "#!/bin/sh\nshift\nexport XDG_DATA_HOME={h}/data XDG_CACHE_HOME={h}/cache \
         XDG_RUNTIME_DIR={h}/run\nexec \"$@\"\n"
    );
    super::script(dir, &name, &body)
}

fn tree(root: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
    std::fs::write(root.join("a.bin"), super::data(300_000, 1)).unwrap();
    std::fs::write(root.join("sub/b.txt"), b"hello\n").unwrap();
    std::fs::write(root.join("sub/deeper/empty"), b"").unwrap();
    std::fs::set_permissions(
        root.join("sub/b.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    std::fs::File::open(root.join("a.bin"))
        .unwrap()
        .set_modified(old)
        .unwrap();
}

/// `ferry cp --json SRC DST` as the user of `home`, over the remote shell `rsh`.
fn cp(home: &Path, rsh: &Path, src: &str, dst: &str) -> serde_json::Value {
    let ferry = env!("CARGO_BIN_EXE_ferry");
    let rsh = rsh.to_str().unwrap();
    let args = ["cp", "-e", rsh, "--remote-ferry", ferry, "--json", src, dst];
    serde_json::from_str(&ok_in(home, &args)).unwrap()
}

/// Every file of `a` is in `b` with the same bytes, mode and mtime.
fn same_tree(a: &Path, b: &Path) {
    use std::os::unix::fs::MetadataExt;
    for rel in ["a.bin", "sub/b.txt", "sub/deeper/empty"] {
        let (x, y) = (a.join(rel), b.join(rel));
        assert_eq!(
            std::fs::read(&x).unwrap(),
            std::fs::read(&y).unwrap(),
            "{rel}"
        );
        let (mx, my) = (x.metadata().unwrap(), y.metadata().unwrap());
        assert_eq!(mx.mode(), my.mode(), "{rel}");
        assert_eq!(mx.mtime(), my.mtime(), "{rel}");
    }
}

#[test]
fn cp_copies_trees_daemon_to_daemon_and_falls_back_without_one() {
    let t = tempfile::tempdir().unwrap();
    let (alice, bob, carol) = (
        t.path().join("alice"),
        t.path().join("bob"),
        t.path().join("carol"),
    );
    let mut running = vec![];
    for home in [&alice, &bob] {
        ok_in(home, &["daemon", "--detach", "--listen", "127.0.0.1:0"]);
        running.push(Running(home));
    }
    let src = t.path().join("project");
    tree(&src);
    let to_bob = fake_ssh(t.path(), &bob);
    let dest = t.path().join("bob-files");
    std::fs::create_dir_all(&dest).unwrap();
    let to = |d: &Path| format!("bob:{}", d.display());
    let r = cp(&alice, &to_bob, src.to_str().unwrap(), &to(&dest));
    assert_eq!(r["via"], "daemon", "{r}");
    assert_eq!(r["files"], 3, "{r}");
    same_tree(&src, &dest.join("project"));
    // And back: Bob's daemon sends, Alice's fetches (what Alice holds is not fetched again).
    let back = t.path().join("back");
    let r = cp(
        &alice,
        &to_bob,
        &to(&dest.join("project")),
        back.to_str().unwrap(),
    );
    assert_eq!(
        (r["via"].as_str(), r["fetched"].as_u64()),
        (Some("daemon"), Some(0)),
        "{r}"
    );
    same_tree(&src, &back);
    // One file, into a directory and to a new name.
    let one = src.join("sub/b.txt");
    for (dest, lands) in [
        (t.path().join("bob-files"), t.path().join("bob-files/b.txt")),
        (t.path().join("renamed"), t.path().join("renamed")),
    ] {
        cp(&alice, &to_bob, one.to_str().unwrap(), &to(&dest));
        assert_eq!(std::fs::read(&lands).unwrap(), b"hello\n");
    }
    // Carol runs no daemon: the copy goes through the file service, and still arrives.
    let to_carol = fake_ssh(t.path(), &carol);
    let carol_dest = t.path().join("carol-files");
    let r = cp(
        &alice,
        &to_carol,
        src.to_str().unwrap(),
        &format!("carol:{}", carol_dest.display()),
    );
    assert_eq!(r["via"], "file service", "{r}");
    for rel in ["a.bin", "sub/b.txt", "sub/deeper/empty"] {
        assert_eq!(
            std::fs::read(src.join(rel)).unwrap(),
            std::fs::read(carol_dest.join(rel)).unwrap()
        );
    }
}

/// `ferry lookaside add ferry://HOST:PORT`: a daemon of the user's on the LAN serves chunks by
/// id to `ferry get` (before the server) once it authorizes this machine's key; and to this
/// machine's own daemon.
#[test]
fn a_daemon_on_the_lan_is_a_lookaside_provider() {
    let t = tempfile::tempdir().unwrap();
    let (lan, me) = (t.path().join("lan"), t.path().join("me"));
    ok_in(&lan, &["daemon", "--detach", "--listen", "127.0.0.1:0"]);
    let _lan_running = Running(&lan);
    let status: serde_json::Value =
        serde_json::from_str(&ok_in(&lan, &["daemon", "status", "--json"])).unwrap();
    let addr = status["listen"].as_str().unwrap().to_string();
    // The LAN daemon holds a big file; the server exports it too.
    let export = t.path().join("export");
    std::fs::create_dir_all(&export).unwrap();
    let bytes = super::data(2_000_000, 5);
    std::fs::write(export.join("big"), &bytes).unwrap();
    ok_in(
        &lan,
        &["object", "put", export.join("big").to_str().unwrap()],
    );
    let provider = format!("ferry://{addr}");
    ok_in(&me, &["lookaside", "add", &provider]);
    let listed = ok_in(&me, &["lookaside", "list", "--json"]);
    assert!(listed.contains("provider"), "{listed}");
    let rsh = ssh_here(t.path());
    let remote = format!("host:{}", export.join("big").display());
    let get = |dst: &Path| {
        let v = get_json(&me, &rsh, &remote, dst);
        assert_eq!(std::fs::read(dst).unwrap(), bytes);
        source(&v, &provider).map(|s| {
            (
                s["requests"].as_u64().unwrap(),
                s["bytes"].as_u64().unwrap(),
            )
        })
    };
    // Not authorized there yet: the fetch goes on without it.
    assert_eq!(get(&t.path().join("first")).map_or(0, |(_, b)| b), 0);
    authorize(&me, &lan);
    // A new cache, so nothing is held here: the provider is asked for chunks, beside the
    // server (both are kept busy, each given work by its measured rate: how much each brings
    // depends on the links, here two local pipes, and on the machine's load; the daemon's
    // tests show a provider bringing everything when it is the only source).
    let second = t.path().join("second");
    std::fs::remove_dir_all(me.join("cache")).unwrap();
    let (asked, from_provider) = get(&second).unwrap();
    assert!(asked > 0, "the provider was not asked");
    // `ferry lookaside list` counts what it supplied.
    let listed = ok_in(&me, &["lookaside", "list", "--json"]);
    let entry: serde_json::Value = serde_json::from_str(listed.lines().next().unwrap()).unwrap();
    assert_eq!(entry["supplied"]["bytes"], from_provider, "{listed}");
}

/// `ferry lookaside add HOST:PATH`: a tree on a machine with ferry but no daemon, reached with
/// the remote shell, holding an older version of what is fetched. It is indexed there when
/// added; `ferry get` asks it for chunks by id beside the server (its session brings the index
/// up to date first), and `list` shows it and counts what it supplied.
#[test]
fn a_tree_over_the_remote_shell_is_a_lookaside_provider() {
    let t = tempfile::tempdir().unwrap();
    let me = t.path().join("me");
    let export = t.path().join("export");
    let old_tree = t.path().join("old-tree");
    std::fs::create_dir_all(&export).unwrap();
    std::fs::create_dir_all(old_tree.join("deep")).unwrap();
    let old = super::data(2_000_000, 9);
    let mut new = old.clone();
    new[1_000_000..1_000_100].copy_from_slice(&[7u8; 100]);
    std::fs::write(export.join("big"), &new).unwrap();
    std::fs::write(old_tree.join("deep/big.old"), &old).unwrap();
    let rsh = ssh_here(t.path());
    let ferry = env!("CARGO_BIN_EXE_ferry");
    let provider = format!("lan:{}/", old_tree.display());
    let added = ok_in(
        &me,
        &[
            "lookaside",
            "add",
            "-e",
            rsh.to_str().unwrap(),
            "--remote-ferry",
            ferry,
            &provider,
        ],
    );
    let name = format!("lan:{}", old_tree.display());
    assert!(added.contains(&format!("added {name}")), "{added}");
    let listed = ok_in(&me, &["lookaside", "list"]);
    assert!(listed.contains("remote shell"), "{listed}");
    let got = t.path().join("got");
    let v = get_json(
        &me,
        &rsh,
        &format!("host:{}", export.join("big").display()),
        &got,
    );
    assert_eq!(std::fs::read(&got).unwrap(), new);
    let source = source(&v, &name).unwrap_or_else(|| panic!("the provider was not used: {v}"));
    // Both are kept busy, each by its measured rate (two local pipes here): that it was asked,
    // and that what it brought is counted, is what holds on any machine.
    assert!(source["requests"].as_u64().unwrap() > 0, "{source}");
    let listed = ok_in(&me, &["lookaside", "list", "--json"]);
    let entry: serde_json::Value = serde_json::from_str(listed.lines().next().unwrap()).unwrap();
    assert_eq!(entry["supplied"]["bytes"], source["bytes"], "{listed}");
    ok_in(&me, &["lookaside", "remove", &name]);
    assert!(!ok_in(&me, &["lookaside", "list"]).contains("lan:"));
}

/// The mount's opens ask a provider too, and what it supplied is counted when the mount ends.
/// Needs root and /dev/fuse (CI has both).
#[test]
fn the_mount_asks_a_lookaside_provider() {
    let root = rustix::process::getuid().is_root();
    if !(root && Path::new("/dev/fuse").exists()) {
        eprintln!("skipped: mounting needs root and /dev/fuse");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (lan, me) = (t.path().join("lan"), t.path().join("me"));
    ok_in(&lan, &["daemon", "--detach", "--listen", "127.0.0.1:0"]);
    let _lan_running = Running(&lan);
    let status: serde_json::Value =
        serde_json::from_str(&ok_in(&lan, &["daemon", "status", "--json"])).unwrap();
    let provider = format!("ferry://{}", status["listen"].as_str().unwrap());
    let export = t.path().join("export");
    std::fs::create_dir_all(&export).unwrap();
    let bytes = super::data(3_000_000, 6);
    std::fs::write(export.join("big"), &bytes).unwrap();
    ok_in(
        &lan,
        &["object", "put", export.join("big").to_str().unwrap()],
    );
    ok_in(&me, &["lookaside", "add", &provider]);
    authorize(&me, &lan);
    let rsh = ssh_here(t.path());
    let at = t.path().join("mnt");
    std::fs::create_dir_all(&at).unwrap();
    let ferry = env!("CARGO_BIN_EXE_ferry");
    ok_in(
        &me,
        &[
            "mount",
            "-e",
            rsh.to_str().unwrap(),
            "--remote-ferry",
            ferry,
            &format!("host:{}", export.display()),
            at.to_str().unwrap(),
        ],
    );
    let read = std::fs::read(at.join("big"));
    ok_in(&me, &["umount", at.to_str().unwrap()]);
    assert!(read.unwrap() == bytes);
    // The mount process counts what the provider was asked and supplied as it ends (how
    // much it brought beside the server depends on the machine's load).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let listed = ok_in(&me, &["lookaside", "list", "--json"]);
        let entry: serde_json::Value =
            serde_json::from_str(listed.lines().next().unwrap()).unwrap();
        if entry["supplied"]["requests"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the provider was not asked: {listed}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
