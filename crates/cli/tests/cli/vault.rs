//! `ferry vault` as a user runs it: a directory vault and an S3 one, passphrases from the
//! environment and from files, rollback noticed by the client's memory, clear errors.

use std::path::Path;
use std::process::{Command, Output};

fn vault(home: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferry"));
    c.arg("vault")
        .args(args)
        .env_remove("FERRY_VAULT")
        .env_remove("FERRY_VAULT_PASSPHRASE")
        .env("HOME", home)
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("XDG_DATA_HOME", home.join("data"));
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn fails(o: Output, want: &str) {
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let e = String::from_utf8(o.stderr).unwrap();
    assert!(e.contains(want) && e.trim().lines().count() == 1, "{e}");
}

const FAST: [&str; 4] = ["--kdf-memory", "1", "--kdf-passes", "1"];

#[test]
fn a_directory_vault_from_init_to_rollback() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path().join("home");
    let v = t.path().join("usb/vault");
    let vs = v.to_str().unwrap();
    let env = [("FERRY_VAULT", vs), ("FERRY_VAULT_PASSPHRASE", "pw one")];
    fails(vault(&home, &env, &["ls"]), "not a vault");
    let mut init = vec!["init", vs];
    init.extend(FAST);
    ok(vault(&home, &env, &init));
    fails(vault(&home, &env, &init), "a vault exists there already");

    let src = t.path().join("project");
    std::fs::create_dir_all(src.join("docs")).unwrap();
    let text: String = (0..100_000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(src.join("docs/notes.txt"), &text).unwrap();
    std::fs::write(src.join("README"), "read me\n").unwrap();
    let src_s = src.to_str().unwrap();
    let put = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["put", src_s, "--json"];
        args.extend(extra);
        serde_json::from_str(&ok(vault(&home, &env, &args))).unwrap()
    };
    let first = put(&[]);
    assert_eq!(
        (first["version"].as_u64(), first["changed"].as_u64()),
        (Some(1), Some(2))
    );
    std::fs::write(
        src.join("docs/notes.txt"),
        text.replace("line 10000\n", "line ten thousand\n"),
    )
    .unwrap();
    let second = put(&[]);
    assert_eq!(second["version"].as_u64(), Some(2));
    // A few blocks around the edit and the catalog's: a small part of the 1 MB file.
    assert!(second["blocks_sent"].as_u64().unwrap() <= 8, "{second}");
    assert!(second["bytes_up"].as_u64().unwrap() < 200_000, "{second}");
    assert_eq!(put(&[])["changed"].as_u64(), Some(0));

    let ls = ok(vault(&home, &env, &["ls", "project"]));
    assert!(
        ls.contains("project/docs/notes.txt") && ls.contains("project/README"),
        "{ls}"
    );
    let log = ok(vault(&home, &env, &["log", "project/docs/notes.txt"]));
    assert_eq!(log.lines().count(), 2, "{log}");
    let out = t.path().join("restored");
    ok(vault(
        &home,
        &env,
        &["get", "project", out.to_str().unwrap()],
    ));
    assert_eq!(
        std::fs::read_to_string(out.join("docs/notes.txt")).unwrap(),
        text.replace("line 10000\n", "line ten thousand\n")
    );
    let old = t.path().join("old.txt");
    ok(vault(
        &home,
        &env,
        &[
            "get",
            "project/docs/notes.txt",
            old.to_str().unwrap(),
            "--version",
            "1",
        ],
    ));
    assert_eq!(std::fs::read_to_string(&old).unwrap(), text);
    assert!(ok(vault(&home, &env, &["check", "--all"])).contains("0 problems"));

    // Another passphrase, from a file; the old one still works until removed.
    let pf = t.path().join("pass2");
    std::fs::write(&pf, "pw two\n").unwrap();
    let mut passwd = vec![
        "key",
        "passwd",
        "--new-passphrase-file",
        pf.to_str().unwrap(),
    ];
    passwd.extend(FAST);
    ok(vault(&home, &env, &passwd));
    fails(vault(&home, &env, &["ls"]), "wrong passphrase");
    let by_file = [("FERRY_VAULT", vs)];
    let ls2 = ok(vault(
        &home,
        &by_file,
        &["ls", "--passphrase-file", pf.to_str().unwrap()],
    ));
    assert_eq!(ls2, ls);
    let env = [("FERRY_VAULT", vs), ("FERRY_VAULT_PASSPHRASE", "pw two")];

    // The blocks of the versions kept below (version 3's go with its head).
    let mut blocks: Vec<_> = std::fs::read_dir(v.join("blocks"))
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|e| e.unwrap().path())
        .collect();
    blocks.sort();
    // The storage loses the newest version: this client remembers it and refuses.
    ok(vault(&home, &env, &["rm", "project/README"]));
    std::fs::remove_file(v.join("heads/00000000000000000003")).unwrap();
    fails(vault(&home, &env, &["ls"]), "rollback detected");
    // Damage is found by check (exit 1) and by get: a block of a version still there (one only
    // the lost version named went unread, and the check passed, as the order of a directory's
    // names picked it or not).
    let block = &blocks[0];
    let mut b = std::fs::read(block).unwrap();
    b[40] ^= 0x40;
    std::fs::write(block, b).unwrap();
    let fresh = t.path().join("other-home");
    let c = vault(&fresh, &env, &["check", "--all"]);
    assert_eq!(c.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&c.stdout).contains("damaged:"));
    fails(
        vault(&home, &[("FERRY_VAULT_PASSPHRASE", "x")], &["ls"]),
        "--vault",
    );
}

#[test]
fn a_vault_in_a_bucket() {
    let t = tempfile::tempdir().unwrap();
    let Some(gw) = ferry_s3::testing::S3Server::for_test(&t.path().join("s3")) else {
        return;
    };
    let home = t.path().join("home");
    let target = gw.locator("s3://ferry-vault-cli/mine");
    let env = [
        ("FERRY_VAULT", target.as_str()),
        ("FERRY_VAULT_PASSPHRASE", "s3 pw"),
        ("AWS_ACCESS_KEY_ID", gw.access.as_str()),
        ("AWS_SECRET_ACCESS_KEY", gw.secret.as_str()),
        ("AWS_ENDPOINT_URL", gw.endpoint.as_str()),
        ("AWS_REGION", gw.region.as_str()),
    ];
    let mut init = vec!["init", target.as_str()];
    init.extend(FAST);
    ok(vault(&home, &env, &init));
    let f = t.path().join("mbox");
    let mail: String = (0..3000)
        .map(|i| format!("From: a{i}@example.org\n\nbody {i}\n\n"))
        .collect();
    std::fs::write(&f, &mail).unwrap();
    ok(vault(&home, &env, &["put", f.to_str().unwrap()]));
    std::fs::write(&f, format!("{mail}From: new@example.org\n\nnew mail\n")).unwrap();
    let r: serde_json::Value = serde_json::from_str(&ok(vault(
        &home,
        &env,
        &["put", f.to_str().unwrap(), "--json"],
    )))
    .unwrap();
    assert!(r["blocks_sent"].as_u64().unwrap() <= 8, "{r}");
    let back = t.path().join("back");
    ok(vault(
        &t.path().join("second-machine"),
        &env,
        &["get", "mbox", back.to_str().unwrap()],
    ));
    assert_eq!(std::fs::read(&back).unwrap(), std::fs::read(&f).unwrap());
    assert!(ok(vault(&home, &env, &["check"])).contains("0 problems"));
}

#[test]
fn a_vault_on_a_ferry_server_applies_updates_there() {
    let t = tempfile::tempdir().unwrap();
    let rsh = super::local_rsh(t.path(), "fake-ssh");
    let srv = t.path().join("srv");
    std::fs::create_dir_all(&srv).unwrap();
    let home = t.path().join("home");
    let target = format!("somehost:{}/mine", srv.display());
    let ferry_bin = env!("CARGO_BIN_EXE_ferry");
    let env = [
        ("FERRY_VAULT", target.as_str()),
        ("FERRY_VAULT_PASSPHRASE", "server pw"),
    ];
    let remote = ["-e", rsh.to_str().unwrap(), "--remote-ferry", ferry_bin];
    let run = |args: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(remote);
        vault(&home, &env, &all)
    };
    let mut init = vec!["init", target.as_str()];
    init.extend(FAST);
    ok(run(&init));
    let f = t.path().join("report.txt");
    let text: String = (0..60_000).map(|i| format!("paragraph {i}\n")).collect();
    std::fs::write(&f, &text).unwrap();
    let fs = f.to_str().unwrap();
    ok(run(&["put", fs]));
    std::fs::write(&f, text.replace("paragraph 30000\n", "a new paragraph\n")).unwrap();
    let r: serde_json::Value = serde_json::from_str(&ok(run(&["put", fs, "--json"]))).unwrap();
    assert_eq!(r["applied_by_server"], true, "{r}");
    assert_eq!(r["nodes_sent"], 0, "{r}");
    let back = t.path().join("back.txt");
    ok(run(&["get", "report.txt", back.to_str().unwrap()]));
    assert_eq!(std::fs::read(&back).unwrap(), std::fs::read(&f).unwrap());
    // What the server made, read as a plain directory vault by another client: the same.
    let dir = srv.join("mine");
    let plain = [
        ("FERRY_VAULT", dir.to_str().unwrap()),
        ("FERRY_VAULT_PASSPHRASE", "server pw"),
    ];
    assert!(ok(vault(&t.path().join("h2"), &plain, &["check", "--all"])).contains("0 problems"));
    // A vault directory that is a symlink out of the export is refused.
    let outside = t.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, srv.join("link")).unwrap();
    let escape = format!("somehost:{}/link", srv.display());
    let mut init = vec!["init", escape.as_str()];
    init.extend(FAST);
    assert!(!run(&init).status.success());
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
}

#[test]
fn a_vault_on_the_tls_daemon() {
    let t = tempfile::tempdir().unwrap();
    let (srv, home) = (t.path().join("srv"), t.path().join("home"));
    let export = t.path().join("export");
    std::fs::create_dir_all(&export).unwrap();
    let d = super::TlsDaemon::start(&srv, &export, 0);
    let fp = super::ok_as(&home, &["key", "show"]).trim().to_string();
    super::ok_as(&srv, &["key", "authorize", &fp, "me"]);
    let pass = t.path().join("pass");
    std::fs::write(&pass, "tls pw\n").unwrap();
    let url = d.url("vaults/mine");
    let args = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["vault", "--vault", url.as_str()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v.extend(["--passphrase-file".to_string(), pass.display().to_string()]);
        v
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        super::ok_as(&home, &a)
    };
    let mut init = vec!["init", url.as_str()];
    init.extend(FAST);
    run(&init);
    let f = t.path().join("notes.txt");
    let text: String = (0..50_000).map(|i| format!("note {i}\n")).collect();
    std::fs::write(&f, &text).unwrap();
    run(&["put", f.to_str().unwrap()]);
    std::fs::write(&f, format!("{text}one more note\n")).unwrap();
    let r: serde_json::Value =
        serde_json::from_str(&run(&["put", f.to_str().unwrap(), "--json"])).unwrap();
    assert_eq!(r["applied_by_server"], true, "{r}");
    let back = t.path().join("back");
    run(&["get", "notes.txt", back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), std::fs::read(&f).unwrap());
    assert!(run(&["check"]).contains("0 problems"));
    // The server holds the vault in its export, sealed.
    assert!(export.join("vaults/mine/config").is_file());
}
