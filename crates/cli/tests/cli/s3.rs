//! `ferry store --store s3://…` against a real S3 server (versitygw on loopback), as a user
//! with AWS-style environment variables runs it; two "machines" (two cache directories) on
//! one bucket.

use std::path::Path;
use std::process::{Command, Output};

use ferry_s3::testing::S3Server;

fn run(gw: &S3Server, cache: &Path, secret: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .env_remove("FERRY_STORE")
        .env_remove("AWS_PROFILE")
        .env("HOME", cache)
        .env("XDG_CACHE_HOME", cache.join("cache"))
        .env("AWS_ACCESS_KEY_ID", &gw.access)
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env("AWS_ENDPOINT_URL", &gw.endpoint)
        .env("AWS_REGION", &gw.region)
        .output()
        .unwrap()
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn one_line_failure(o: Output, want: &str) {
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8(o.stderr).unwrap();
    assert!(e.contains(want) && e.trim().lines().count() == 1, "{e}");
}

#[test]
fn a_store_in_a_bucket_shared_by_two_machines() {
    let t = tempfile::tempdir().unwrap();
    let Some(gw) = S3Server::for_test(&t.path().join("s3")) else {
        return;
    };
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let store = &gw.locator("s3://ferry-cli/team/store");
    // Not there yet: one clear line, exit 1.
    one_line_failure(
        run(&gw, &a, &gw.secret, &["store", "--store", store, "ls"]),
        "ferry store init",
    );
    ok(run(
        &gw,
        &a,
        &gw.secret,
        &["store", "--store", store, "init"],
    ));
    let f = t.path().join("f");
    let content = crate::data(3_000_000, 7);
    std::fs::write(&f, &content).unwrap();
    let added: serde_json::Value = serde_json::from_str(
        ok(run(
            &gw,
            &a,
            &gw.secret,
            &[
                "store",
                "--store",
                store,
                "add",
                "--json",
                f.to_str().unwrap(),
            ],
        ))
        .trim(),
    )
    .unwrap();
    let oid = added["oid"].as_str().unwrap();
    // The other machine lists it and reads it back, verified.
    assert!(ok(run(&gw, &b, &gw.secret, &["store", "--store", store, "ls"])).contains(oid));
    let out = t.path().join("out");
    ok(run(
        &gw,
        &b,
        &gw.secret,
        &[
            "store",
            "--store",
            store,
            "cat",
            oid,
            "-o",
            out.to_str().unwrap(),
        ],
    ));
    assert_eq!(std::fs::read(&out).unwrap(), content);
    let st: serde_json::Value = serde_json::from_str(
        ok(run(
            &gw,
            &b,
            &gw.secret,
            &["store", "--store", store, "stats", "--json"],
        ))
        .trim(),
    )
    .unwrap();
    assert_eq!(st["objects"], 1);
    assert!(ok(run(
        &gw,
        &b,
        &gw.secret,
        &["store", "--store", store, "verify"]
    ))
    .contains("ok"));
    // Adding it again from B sends nothing new.
    let again: serde_json::Value = serde_json::from_str(
        ok(run(
            &gw,
            &b,
            &gw.secret,
            &[
                "store",
                "--store",
                store,
                "add",
                "--json",
                f.to_str().unwrap(),
            ],
        ))
        .trim(),
    )
    .unwrap();
    assert_eq!(again["new_bytes"], 0);
    ok(run(
        &gw,
        &b,
        &gw.secret,
        &["store", "--store", store, "rm", oid],
    ));
    assert!(!ok(run(&gw, &a, &gw.secret, &["store", "--store", store, "ls"])).contains(oid));
    // Wrong credentials: one clear line, exit 1.
    one_line_failure(
        run(&gw, &a, "wrong", &["store", "--store", store, "ls"]),
        "AWS_SECRET_ACCESS_KEY",
    );
    one_line_failure(
        run(
            &gw,
            &a,
            &gw.secret,
            &["store", "--store", "s3://Bad_Name/x", "ls"],
        ),
        "bucket name",
    );
}

fn in_home(gw: &S3Server, home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .env_remove("FERRY_DAEMON_DIR")
        .env_remove("AWS_PROFILE")
        .env("HOME", home)
        .env("XDG_DATA_HOME", home.join("data"))
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("XDG_RUNTIME_DIR", home.join("run"))
        .env("AWS_ACCESS_KEY_ID", &gw.access)
        .env("AWS_SECRET_ACCESS_KEY", &gw.secret)
        .env("AWS_ENDPOINT_URL", &gw.endpoint)
        .env("AWS_REGION", &gw.region)
        .output()
        .unwrap()
}

/// Stops a home's daemon when the test ends, however it ends.
struct Daemon<'a>(&'a S3Server, &'a Path);

impl Drop for Daemon<'_> {
    fn drop(&mut self) {
        let _ = in_home(self.0, self.1, &["daemon", "stop"]);
    }
}

/// An S3 store as one of a create's N stores; a second daemon fetches from it alone.
#[test]
fn a_daemon_fetches_from_the_s3_store_another_copied_to() {
    let t = tempfile::tempdir().unwrap();
    let Some(gw) = S3Server::for_test(&t.path().join("s3")) else {
        return;
    };
    let (alice, bob) = (t.path().join("alice"), t.path().join("bob"));
    // The bucket (a store of its own beside the daemons').
    let other = gw.locator("s3://daemons/other");
    ok(in_home(&gw, &alice, &["store", "--store", &other, "init"]));
    let shared = gw.locator("s3://daemons/shared");
    let mut up = vec![];
    for home in [&alice, &bob] {
        ok(in_home(
            &gw,
            home,
            &["daemon", "--detach", "--listen", "127.0.0.1:0"],
        ));
        up.push(Daemon(&gw, home));
    }
    // Durability 2 needs a second store.
    let src = t.path().join("f");
    let content = crate::data(2_000_000, 3);
    std::fs::write(&src, &content).unwrap();
    let o = in_home(
        &gw,
        &alice,
        &["object", "put", "-P", "2", src.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(1));
    ok(in_home(&gw, &alice, &["daemon", "replica", "add", &shared]));
    let listed = ok(in_home(&gw, &alice, &["daemon", "replica", "list"]));
    let entry = format!("{}?endpoint={}", shared.trim_end_matches('/'), gw.endpoint);
    assert!(listed.contains(&entry), "{listed}");
    let ticket = ok(in_home(
        &gw,
        &alice,
        &["object", "put", "-P", "2", src.to_str().unwrap()],
    ));
    let ticket = ticket.trim();
    // Alice's daemon is gone: Bob's fetches from the bucket.
    drop(up.remove(0));
    let out = t.path().join("got");
    let r: serde_json::Value = serde_json::from_str(&ok(in_home(
        &gw,
        &bob,
        &[
            "object",
            "get",
            ticket,
            "-o",
            out.to_str().unwrap(),
            "--json",
        ],
    )))
    .unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), content);
    let sources = r["report"]["sources"].as_array().unwrap();
    assert_eq!(sources.len(), 1, "{r}");
    assert!(
        sources[0]["name"]
            .as_str()
            .unwrap()
            .starts_with(shared.trim_end_matches('/')),
        "{r}"
    );
    assert_eq!(sources[0]["bytes"], 2_000_000);
    // Its store lists the object; `ferry store` reads it too.
    let oid = r["report"]["oid"].as_str().unwrap();
    assert!(ok(in_home(&gw, &bob, &["store", "--store", &shared, "ls"])).contains(oid));
}

/// A remote shell that runs the command here, and a `ferry` for it that serves with the
/// shared store `store` and the cache of `home` (one "server machine" per home).
fn server_on(t: &Path, gw: &S3Server, home: &Path, store: &str) -> (String, String) {
    let rsh = super::local_rsh(t, "ssh-here");
    std::fs::create_dir_all(home).unwrap();
    let bin = super::script(
        home,
        "remote-ferry",
        &format!(
            "#!/bin/sh\nexport XDG_CACHE_HOME={h}/cache HOME={h} AWS_ACCESS_KEY_ID={a} \
             AWS_SECRET_ACCESS_KEY={s} AWS_ENDPOINT_URL={e} AWS_REGION={r}\nsub=$1\nshift\n\
             exec {f} \"$sub\" --store {store} \"$@\"\n",
            h = home.display(),
            a = gw.access,
            s = gw.secret,
            e = gw.endpoint,
            r = gw.region,
            f = env!("CARGO_BIN_EXE_ferry"),
        ),
    );
    (rsh.display().to_string(), bin.display().to_string())
}

/// Two file servers on one S3 store: a file uploaded through one costs nothing through the
/// other.
#[test]
fn two_file_servers_share_what_clients_uploaded() {
    let t = tempfile::tempdir().unwrap();
    let Some(gw) = S3Server::for_test(&t.path().join("s3")) else {
        return;
    };
    let store = gw.locator("s3://servers/uploads");
    let client = t.path().join("client");
    ok(run(
        &gw,
        &client,
        &gw.secret,
        &["store", "--store", &store, "init"],
    ));
    let f = t.path().join("big.bin");
    std::fs::write(&f, crate::data(3_000_000, 5)).unwrap();
    let mut sent = vec![];
    for (i, name) in ["one", "two"].into_iter().enumerate() {
        let export = t.path().join(format!("export-{name}"));
        std::fs::create_dir_all(&export).unwrap();
        let (rsh, bin) = server_on(
            t.path(),
            &gw,
            &t.path().join(format!("server-{name}")),
            &store,
        );
        let dest = format!("somehost:{}", export.join("big.bin").display());
        let out = ok(run(
            &gw,
            &client,
            &gw.secret,
            &[
                "put",
                "-e",
                &rsh,
                "--remote-ferry",
                &bin,
                "--json",
                f.to_str().unwrap(),
                &dest,
            ],
        ));
        let put: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(
            std::fs::read(export.join("big.bin")).unwrap(),
            std::fs::read(&f).unwrap()
        );
        sent.push(put["chunks_sent"].as_u64().unwrap());
        assert!(
            i == 0 || sent[1] == 0,
            "the second server asked for chunks again: {put}"
        );
    }
    assert!(sent[0] > 100, "{sent:?}");
    // A directory is not a shared store.
    let o = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args([
            "serve",
            "--stdio",
            "--store",
            "/tmp",
            t.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
}
