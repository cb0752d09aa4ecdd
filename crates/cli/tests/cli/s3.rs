//! `ferry store --store s3://…` against a real S3 server (versitygw on loopback), as a user
//! with AWS-style environment variables runs it; two "machines" (two cache directories) on
//! one bucket.

use std::path::Path;
use std::process::{Command, Output};

use ferry_s3::testing::{Versitygw, ACCESS, SECRET};

fn run(gw: &Versitygw, cache: &Path, secret: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .env_remove("FERRY_STORE")
        .env_remove("AWS_PROFILE")
        .env("HOME", cache)
        .env("XDG_CACHE_HOME", cache.join("cache"))
        .env("AWS_ACCESS_KEY_ID", ACCESS)
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env("AWS_ENDPOINT_URL", &gw.endpoint)
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
    let Some(gw) = Versitygw::for_test(&t.path().join("s3")) else {
        return;
    };
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let store = "s3://ferry-cli/team/store";
    // Not there yet: one clear line, exit 1.
    one_line_failure(
        run(&gw, &a, SECRET, &["store", "--store", store, "ls"]),
        "does not exist",
    );
    ok(run(&gw, &a, SECRET, &["store", "--store", store, "init"]));
    let f = t.path().join("f");
    let content = crate::data(3_000_000, 7);
    std::fs::write(&f, &content).unwrap();
    let added: serde_json::Value = serde_json::from_str(
        ok(run(
            &gw,
            &a,
            SECRET,
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
    assert!(ok(run(&gw, &b, SECRET, &["store", "--store", store, "ls"])).contains(oid));
    let out = t.path().join("out");
    ok(run(
        &gw,
        &b,
        SECRET,
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
            SECRET,
            &["store", "--store", store, "stats", "--json"],
        ))
        .trim(),
    )
    .unwrap();
    assert_eq!(st["objects"], 1);
    assert!(ok(run(&gw, &b, SECRET, &["store", "--store", store, "verify"])).contains("ok"));
    // Adding it again from B sends nothing new.
    let again: serde_json::Value = serde_json::from_str(
        ok(run(
            &gw,
            &b,
            SECRET,
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
        SECRET,
        &["store", "--store", store, "rm", oid],
    ));
    assert!(!ok(run(&gw, &a, SECRET, &["store", "--store", store, "ls"])).contains(oid));
    // Wrong credentials: one clear line, exit 1.
    one_line_failure(
        run(&gw, &a, "wrong", &["store", "--store", store, "ls"]),
        "AWS_SECRET_ACCESS_KEY",
    );
    one_line_failure(
        run(
            &gw,
            &a,
            SECRET,
            &["store", "--store", "s3://Bad_Name/x", "ls"],
        ),
        "bucket name",
    );
}
