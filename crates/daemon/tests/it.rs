//! Daemons on loopback, each with its own directory (its own key, store and socket),
//! exchanging objects by ticket through the local API, as `ferry object` does.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use ferry_daemon::api::{FetchRequest, ObjectInfo, PutReply, PutRequest, Status, ROUTES};
use ferry_daemon::client::Client;
use ferry_daemon::fetch::Fetched;
use ferry_daemon::jobs::{Job, State, What};
use ferry_daemon::{Config, DaemonError, Paths, Ticket};

struct Daemon {
    client: Client,
    status: Status,
    dir: PathBuf,
}

/// Starts a daemon under `dir` (listening on a loopback port) and waits until it is ready.
fn start(dir: &Path) -> Daemon {
    let cfg = Config {
        paths: Paths::under(dir),
        listen: Some("127.0.0.1:0".parse().unwrap()),
        advertise: None,
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = ferry_daemon::run(cfg, |s| tx.send(s.clone()).unwrap());
        panic!("the daemon stopped: {r:?}");
    });
    let status = rx.recv_timeout(Duration::from_secs(120)).expect("ready");
    Daemon {
        client: Client::new(&status.socket).unwrap(),
        status,
        dir: dir.to_path_buf(),
    }
}

fn data(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn put_file(d: &Daemon, name: &str, bytes: &[u8]) -> PutReply {
    let path = d.dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let req = PutRequest {
        path,
        durability: 1,
    };
    d.client.post("/v1/objects", &req).unwrap()
}

/// How many objects the daemon holds.
fn objects(d: &Daemon) -> u64 {
    d.client
        .get::<ferry_daemon::api::StoreInfo>("/v1/store")
        .unwrap()
        .objects
}

/// Fetches by ticket as `ferry object get` does: the daemon accepts the fetch, the client
/// follows its events to the end.
fn get(d: &Daemon, ticket: &str, out: &Path) -> Result<Fetched, DaemonError> {
    let job: Job = d.client.post(
        "/v1/fetches",
        &FetchRequest {
            ticket: ticket.to_string(),
            path: Some(out.to_path_buf()),
        },
    )?;
    let mut events = vec![];
    let end = d
        .client
        .follow(&job.id, 0, PATIENCE, |e| events.push(e.clone()))?;
    assert!(matches!(events[0].what, What::Started { .. }), "{events:?}");
    assert!(events.windows(2).all(|w| w[0].id < w[1].id), "{events:?}");
    assert!(events.last().unwrap().what.is_end());
    match (end.state, end.report) {
        (State::Done, Some(r)) => Ok(r),
        _ => Err(DaemonError::Unavailable(end.error.unwrap_or_default())),
    }
}

const PATIENCE: Duration = Duration::from_secs(120);

#[test]
fn two_daemons_exchange_an_object_by_ticket() {
    let tmp = tempfile::tempdir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));
    assert_ne!(a.status.key, b.status.key);
    let bytes = data(3 << 20, 1);
    let put = put_file(&a, "in", &bytes);
    assert_eq!(put.size, bytes.len() as u64);
    let out = tmp.path().join("out");
    let got = get(&b, &put.ticket, &out).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), bytes);
    let fetched: u64 = got.sources.iter().map(|s| s.bytes).sum();
    assert_eq!(
        (got.bytes_held, fetched),
        (0, bytes.len() as u64),
        "{got:?}"
    );
    // B now holds it whole: a second get fetches nothing.
    let again = get(&b, &put.ticket, &tmp.path().join("out2")).unwrap();
    assert_eq!(again.bytes_held, bytes.len() as u64);
    assert!(again.sources.is_empty());
    let local = again.local.as_deref().unwrap();
    let info: ObjectInfo = b.client.get(&format!("/v1/objects/{local}")).unwrap();
    assert_eq!((info.size, info.oid), (bytes.len() as u64, put.oid.clone()));
    // A's ticket is A's capability: it reads nothing at B.
    let e = b
        .client
        .get::<ObjectInfo>(&format!("/v1/objects/{}", put.ticket))
        .unwrap_err();
    assert!(matches!(e, DaemonError::NotFound(_)), "{e}");
    // A changed version costs only its new chunks: B's store is a source.
    let mut changed = bytes.clone();
    changed.splice(1 << 20..1 << 20, data(5000, 2));
    let put2 = put_file(&a, "in2", &changed);
    let got = get(&b, &put2.ticket, &out).unwrap();
    let fetched: u64 = got.sources.iter().map(|s| s.bytes).sum();
    assert!(fetched < 100_000, "{got:?}");
    assert_eq!(std::fs::read(&out).unwrap(), changed);
}

#[test]
fn a_forged_or_altered_capability_reads_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));
    let bytes = data(100_000, 3);
    let put = put_file(&a, "in", &bytes);
    let other: Ticket = put_file(&a, "other", &data(50_000, 4))
        .ticket
        .parse()
        .unwrap();
    let t: Ticket = put.ticket.parse().unwrap();
    let out = tmp.path().join("out");
    let mut forged = t.clone();
    forged.cap.check[7] ^= 1;
    // Another object's capability does not read this one either.
    let mut swapped = t.clone();
    swapped.cap = other.cap;
    // Nor does this one's capability read another object (same answer as no such object).
    let mut absent = t.clone();
    absent.oid = ferry_format::Oid(ferry_format::Id::hash(ferry_format::HashAlg::Blake3, b"x"));
    absent.cap = t.cap;
    for bad in [forged, swapped, absent] {
        let e = get(&b, &bad.to_string(), &out).unwrap_err();
        assert!(matches!(e, DaemonError::Unavailable(_)), "{e}");
        assert!(e.to_string().contains("no such object"), "{e}");
        assert!(!out.exists());
    }
    get(&b, &put.ticket, &out).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), bytes);
}

#[test]
fn two_paths_and_a_dead_hint() {
    let tmp = tempfile::tempdir().unwrap();
    let a = start(&tmp.path().join("a"));
    let c = start(&tmp.path().join("c"));
    let bytes = data(2 << 20, 5);
    let put = put_file(&a, "in", &bytes);
    let mut t: Ticket = put.ticket.parse().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = closed.local_addr().unwrap();
    drop(closed);
    // A hint tried first that leads nowhere, and a second path to A.
    t.hints.push(ferry_daemon::Hint::new(
        format!("ferry://{dead}?key={}", a.status.key),
        0,
        1,
    ));
    t.hints.push(t.hints[0].clone());
    let out = tmp.path().join("c-out");
    let got = get(&c, &t.to_string(), &out).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), bytes);
    assert_eq!(got.failed_hints.len(), 1, "{got:?}");
    assert!(got.failed_hints[0].contains(&dead.to_string()), "{got:?}");
    let fetched: u64 = got.sources.iter().map(|s| s.bytes).sum();
    assert!(fetched >= bytes.len() as u64, "{got:?}");
}

#[test]
fn bad_requests_get_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let a = start(&tmp.path().join("a"));
    let e = a
        .client
        .post::<_, PutReply>(
            "/v1/objects",
            &PutRequest {
                path: "rel".into(),
                durability: 1,
            },
        )
        .unwrap_err();
    assert!(matches!(e, DaemonError::BadRequest(_)), "{e}");
    // A durability no store here can meet.
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    let e = a
        .client
        .post::<_, PutReply>(
            "/v1/objects",
            &PutRequest {
                path: tmp.path().join("f"),
                durability: 3,
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("replicas"), "{e}");
    let e = a
        .client
        .post::<_, PutReply>(
            "/v1/objects",
            &PutRequest {
                path: tmp.path().join("missing"),
                durability: 1,
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
    let e = get(&a, "ferry1zzzz", &tmp.path().join("o")).unwrap_err();
    assert!(matches!(e, DaemonError::BadRequest(_)), "{e}");
    let e = a.client.get::<Job>("/v1/fetches/nope").unwrap_err();
    assert!(matches!(e, DaemonError::NotFound(_)), "{e}");
    let e = a
        .client
        .get::<ObjectInfo>("/v1/objects/ferry2aaaa")
        .unwrap_err();
    assert!(matches!(e, DaemonError::BadRequest(_)), "{e}");
    // Junk on the socket: the daemon answers or hangs up, and goes on serving.
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(&a.status.socket).unwrap();
    s.write_all(b"\x00\xffGARBAGE\r\n\r\n").unwrap();
    let mut junk = vec![];
    let _ = s.read_to_end(&mut junk);
    let st: Status = a.client.get("/v1/status").unwrap();
    assert_eq!(st.pid, std::process::id());
    // A second daemon on the same directory is refused while the first runs.
    let cfg = Config {
        paths: Paths::under(&tmp.path().join("a")),
        listen: None,
        advertise: None,
    };
    let e = ferry_daemon::run(cfg, |_| panic!("a second daemon started")).unwrap_err();
    assert!(e.to_string().contains("already runs"), "{e}");
}

#[test]
fn the_socket_is_the_owners_only() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let a = start(&tmp.path().join("a"));
    let mode = std::fs::metadata(&a.status.socket)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

/// The OpenAPI document lists exactly the routes the server has, and each answers there.
#[test]
fn the_openapi_document_matches_the_server() {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/daemon-api.json"),
    )
    .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    assert_eq!(
        doc["openapi"].as_str().unwrap().split('.').next(),
        Some("3")
    );
    let mut listed = vec![];
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            assert!(
                op["responses"].is_object(),
                "{method} {path} has no responses"
            );
            listed.push((method.clone(), path.clone()));
        }
    }
    listed.sort();
    let mut served: Vec<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    served.sort();
    assert_eq!(listed, served);
    // Every schema a route names exists.
    let text = doc.to_string();
    for r in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
        let name = &r[..r.find('"').unwrap()];
        assert!(
            doc["components"]["schemas"][name].is_object(),
            "no schema {name}"
        );
    }
    // And the server answers each route (an error for a bad request is still an answer,
    // a 404 for an unknown route or a 405 would not be).
    let tmp = tempfile::tempdir().unwrap();
    let a = start(&tmp.path().join("a"));
    for (method, path) in ROUTES {
        let path = path.replace("{ticket}", "ferry2aa").replace("{id}", "nope");
        let r = if *method == "get" {
            a.client.get::<serde_json::Value>(&path)
        } else if *method == "delete" {
            a.client.delete(&path).map(|_| serde_json::Value::Null)
        } else {
            a.client
                .post::<_, serde_json::Value>(&path, &serde_json::json!({}))
        };
        if let Err(e) = r {
            // Ours, not the router's "no such route".
            assert!(
                matches!(e, DaemonError::BadRequest(_) | DaemonError::NotFound(_)),
                "{method} {path}: {e}"
            );
            assert!(!e.to_string().contains("404"), "{method} {path}: {e}");
        }
    }
}

/// A guest (a key the daemon does not authorize) reads an object's chunks with its capability,
/// and nothing else: not another object's chunks by id, not the export.
#[test]
fn a_capability_reads_its_own_chunks_only() {
    use ferry_proto::{ErrorCode, Ids, Reply, Request};
    let tmp = tempfile::tempdir().unwrap();
    let a = start(&tmp.path().join("a"));
    let mine: Ticket = put_file(&a, "mine", &data(300_000, 6))
        .ticket
        .parse()
        .unwrap();
    let other: Ticket = put_file(&a, "other", &data(300_000, 7))
        .ticket
        .parse()
        .unwrap();
    let guest_dir = tmp.path().join("guest");
    std::fs::create_dir_all(&guest_dir).unwrap();
    let (me, _) = ferry_net::Identity::load_or_create(&guest_dir).unwrap();
    let (ep, key) = ferry_daemon::fetch::parse_peer(&mine.hints[0].uri).unwrap();
    let mut s = ferry_net::connect_pinned(&ep, &me, key).unwrap();
    let recipe = |s: &mut ferry_fs::Session, t: &Ticket| match s
        .conn
        .call(Request::ObjectRecipe {
            oid: t.oid.0,
            cap: t.cap.to_bytes(),
            from: 0,
        })
        .unwrap()
        .remove(0)
    {
        Reply::Object { chunks, .. } => chunks,
        r => panic!("{r:?}"),
    };
    let my_chunks = recipe(&mut s, &mine);
    let other_chunks = recipe(&mut s, &other);
    let ask = |s: &mut ferry_fs::Session, ids: Vec<ferry_format::Id>| {
        s.conn.call(Request::ObjectChunks {
            oid: mine.oid.0,
            cap: mine.cap.to_bytes(),
            ids: Ids::Full(ids),
        })
    };
    let got = ask(&mut s, vec![my_chunks[0].id]).unwrap();
    assert!(
        matches!(&got[0], Reply::Chunks(c) if c.found == [0]),
        "{got:?}"
    );
    let refused = |r: Result<Vec<Reply>, ferry_fs::ConnError>, want: ErrorCode| match r {
        Err(ferry_fs::ConnError::Remote { code, .. }) => assert_eq!(code, want),
        r => panic!("{r:?}"),
    };
    refused(
        ask(&mut s, vec![my_chunks[0].id, other_chunks[0].id]),
        ErrorCode::NotFound,
    );
    refused(
        s.conn.call(Request::GetAttr { path: "".into() }),
        ErrorCode::Permission,
    );
    // An authorized key reads chunks by id (a lookaside provider), and still nothing else:
    // no file of the daemon's is listed or written.
    std::fs::write(
        tmp.path().join("a/authorized_keys"),
        format!("{} me\n", me.fingerprint()),
    )
    .unwrap();
    let mut s = ferry_net::connect_pinned(&ep, &me, key).unwrap();
    let got = s
        .conn
        .call(Request::GetChunks(ferry_proto::GetChunks {
            ids: Ids::Full(vec![other_chunks[0].id]),
            at: None,
            against: None,
        }))
        .unwrap();
    assert!(
        matches!(&got[0], Reply::Chunks(c) if c.found == [0]),
        "{got:?}"
    );
    refused(
        s.conn.call(Request::GetAttr { path: "".into() }),
        ErrorCode::Unsupported,
    );
    refused(
        s.conn.call(Request::Mkdir {
            path: "x".into(),
            mode: 0o755,
        }),
        ErrorCode::Unsupported,
    );
}

/// A daemon killed while fetching takes the fetch up again when it starts: the job was
/// recorded when accepted. (The kill is the record of a job still running, as a crash leaves
/// it; the daemon that wrote it is gone.)
#[test]
fn a_restarted_daemon_takes_up_the_fetches_it_had_accepted() {
    let tmp = tempfile::tempdir().unwrap();
    let a = start(&tmp.path().join("a"));
    let bytes = data(700_000, 8);
    let put = put_file(&a, "in", &bytes);
    let b_dir = tmp.path().join("b");
    let jobs = b_dir.join("data/jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    let out = tmp.path().join("out");
    let record = Job {
        id: "0123456789abcdef".into(),
        ticket: put.ticket.clone(),
        path: Some(out.clone()),
        state: State::Running,
        restarts: 0,
        error: None,
        report: None,
    };
    std::fs::write(
        jobs.join("0123456789abcdef.json"),
        serde_json::to_vec(&record).unwrap(),
    )
    .unwrap();
    std::fs::write(jobs.join("junk.json"), b"{not json").unwrap();
    // An ended job of long ago is forgotten.
    let ended = Job {
        id: "00000000000000ee".into(),
        state: State::Done,
        ..record.clone()
    };
    let old = jobs.join("00000000000000ee.json");
    std::fs::write(&old, serde_json::to_vec(&ended).unwrap()).unwrap();
    let long_ago = std::time::SystemTime::now() - Duration::from_secs(8 * 24 * 3600);
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(long_ago)
        .unwrap();
    let b = start(&b_dir);
    assert!(!old.exists());
    let e = b
        .client
        .get::<Job>("/v1/fetches/00000000000000ee")
        .unwrap_err();
    assert!(matches!(e, DaemonError::NotFound(_)), "{e}");
    let mut events = vec![];
    let end = b
        .client
        .follow("0123456789abcdef", 0, PATIENCE, |e| events.push(e.clone()))
        .unwrap();
    assert_eq!((end.state, end.restarts), (State::Done, 1), "{end:?}");
    assert_eq!(std::fs::read(&out).unwrap(), bytes);
    // Its events are numbered after any the first run could have sent.
    assert!(events[0].id > 1 << 32, "{events:?}");
    // Resumed from the last id seen, the stream sends only what came after it.
    let last = events.last().unwrap().id;
    let mut later = vec![];
    let again = b
        .client
        .follow("0123456789abcdef", last - 1, PATIENCE, |e| {
            later.push(e.clone())
        })
        .unwrap();
    assert_eq!(again.state, State::Done);
    assert_eq!(later.len(), 1, "{later:?}");
    assert!(later[0].what.is_end());
    // From the end itself (a client that saw it, then lost its answer): the end again, and
    // the stream ends (it never did: empty chunks forever).
    let mut after_end = vec![];
    b.client
        .follow("0123456789abcdef", last, PATIENCE, |e| {
            after_end.push(e.clone())
        })
        .unwrap();
    assert_eq!(after_end.len(), 1, "{after_end:?}");
    assert_eq!(after_end[0].id, last);
    // The record says it is done: a third start leaves it be.
    let saved: Job =
        serde_json::from_slice(&std::fs::read(jobs.join("0123456789abcdef.json")).unwrap())
            .unwrap();
    assert_eq!(saved.state, State::Done);
}

fn add_device(d: &Daemon, path: &Path, push: bool) {
    let _: Vec<ferry_daemon::devices::Device> = d
        .client
        .post(
            "/v1/devices",
            &ferry_daemon::devices::Device {
                path: path.to_path_buf(),
                push,
            },
        )
        .unwrap();
}

/// DOT's portable storage: a device A pushes objects to carries one to B with no network at
/// all (the ticket's only hint leads nowhere): chunks and recipe come off the device.
#[test]
fn a_pushed_device_carries_an_object_with_no_network() {
    let tmp = tempfile::tempdir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));
    let stick = tmp.path().join("stick");
    std::fs::create_dir_all(&stick).unwrap();
    add_device(&a, &stick, true);
    let bytes = data(1 << 20, 10);
    let put = put_file(&a, "in", &bytes);
    assert_eq!(put.pushed.len(), 1, "{:?}", put.pushed);
    assert!(put.pushed[0].error.is_none(), "{:?}", put.pushed);
    assert!(put.pushed[0].bytes >= bytes.len() as u64);
    add_device(&b, &stick, false);
    let mut t: Ticket = put.ticket.parse().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = closed.local_addr().unwrap();
    drop(closed);
    t.hints = vec![ferry_daemon::Hint::new(
        format!("ferry://{dead}?key={}", a.status.key),
        0,
        0,
    )];
    let out = tmp.path().join("out");
    let got = get(&b, &t.to_string(), &out).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), bytes);
    assert_eq!(got.sources.len(), 1, "{got:?}");
    assert_eq!(got.sources[0].name, stick.display().to_string());
    assert_eq!(got.sources[0].bytes, bytes.len() as u64);
}

/// A device whose files were damaged, cut, or replaced by links out of it costs only time:
/// what it cannot give comes from the peer, and the object is right.
#[test]
fn a_damaged_device_costs_only_time() {
    let tmp = tempfile::tempdir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));
    let stick = tmp.path().join("stick");
    std::fs::create_dir_all(&stick).unwrap();
    add_device(&a, &stick, true);
    let bytes = data(1 << 20, 11);
    let put = put_file(&a, "in", &bytes);
    let mut files: Vec<PathBuf> = walk(&stick.join(".ferry-dot/chunks"));
    files.sort();
    assert!(files.len() > 10);
    let secret = tmp.path().join("secret");
    std::fs::write(&secret, b"not for the device").unwrap();
    for (i, f) in files.iter().enumerate().take(6) {
        match i % 3 {
            0 => {
                let mut b = std::fs::read(f).unwrap();
                b[0] ^= 0xff;
                std::fs::write(f, b).unwrap();
            }
            1 => std::fs::write(f, b"short").unwrap(),
            _ => {
                std::fs::remove_file(f).unwrap();
                std::os::unix::fs::symlink(&secret, f).unwrap();
            }
        }
    }
    add_device(&b, &stick, false);
    let out = tmp.path().join("out");
    let got = get(&b, &put.ticket, &out).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), bytes);
    let from_a: u64 = got
        .sources
        .iter()
        .filter(|s| s.name.starts_with("ferry://"))
        .map(|s| s.chunks)
        .sum();
    assert!(from_a >= 6, "{got:?}");
}

/// A device that lies about an object (a recipe of another size), with no peer: a clear
/// failure, nothing installed.
#[test]
fn a_lying_device_recipe_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));
    let stick = tmp.path().join("stick");
    std::fs::create_dir_all(&stick).unwrap();
    add_device(&a, &stick, true);
    let put = put_file(&a, "in", &data(200_000, 12));
    add_device(&b, &stick, false);
    let mut t: Ticket = put.ticket.parse().unwrap();
    t.hints.clear();
    t.size += 1;
    let out = tmp.path().join("out");
    let e = get(&b, &t.to_string(), &out).unwrap_err();
    assert!(e.to_string().contains("no source"), "{e}");
    assert!(!out.exists());
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A peer that lies, in one of several ways.
#[derive(Clone, Copy, Debug)]
enum Lie {
    /// Right recipe, wrong bytes for every chunk.
    WrongBytes,
    /// A recipe that does not add up to the object's size.
    WrongSize,
    /// A recipe claiming more chunks than the size allows.
    EndlessRecipe,
}

struct Liar {
    lie: Lie,
    recipe: ferry_format::Recipe,
}

impl ferry_fs::ObjectShelf for Liar {
    fn open(
        &self,
        _: &ferry_format::Id,
        _: &[u8],
    ) -> Option<(u64, std::sync::Arc<ferry_format::Recipe>)> {
        let size = self.recipe.total_len();
        let chunks = self.recipe.chunks();
        let alg = self.recipe.alg();
        let r = match self.lie {
            Lie::WrongBytes => self.recipe.clone(),
            Lie::WrongSize => {
                ferry_format::Recipe::from_chunks(alg, chunks[..chunks.len() - 1].to_vec()).unwrap()
            }
            Lie::EndlessRecipe => {
                ferry_format::Recipe::from_chunks(alg, vec![chunks[0]; 200_000]).unwrap()
            }
        };
        Some((size, std::sync::Arc::new(r)))
    }

    fn chunk(&self, id: &ferry_format::Id) -> Option<Vec<u8>> {
        let c = self.recipe.chunks().iter().find(|c| c.id == *id)?;
        Some(vec![0x55; c.len as usize])
    }
}

/// Starts a TLS daemon serving `shelf` to any key; returns its hint.
fn liar(dir: &Path, shelf: Liar) -> ferry_daemon::Hint {
    std::fs::create_dir_all(dir.join("export")).unwrap();
    let (id, _) = ferry_net::Identity::load_or_create(dir).unwrap();
    let key = id.fingerprint();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let shelf: std::sync::Arc<dyn ferry_fs::ObjectShelf> = std::sync::Arc::new(shelf);
    let export = dir.join("export");
    let handler: ferry_net::Handler = std::sync::Arc::new(move |_, stream, _| {
        let staging: ferry_fs::Staging =
            std::sync::Arc::new(ferry_store::MemStore::new(ferry_format::HashAlg::Blake3));
        let mut server = ferry_fs::Server::new(
            ferry_fs::Export::open(&export).unwrap(),
            Default::default(),
            staging,
        )
        .with_objects(shelf.clone(), true);
        let input = stream.try_clone().unwrap();
        let _ = ferry_fs::serve(&mut server, input, stream);
    });
    let daemon = ferry_net::Daemon {
        listener,
        identity: id,
        authorized_keys: dir.join("authorized_keys"),
        max_sessions: 4,
        guests: 4,
        hello_timeout: ferry_net::HELLO_TIMEOUT,
        handshake_timeout: ferry_net::HANDSHAKE_TIMEOUT,
    };
    std::thread::spawn(move || daemon.run(handler));
    ferry_daemon::Hint::new(format!("ferry://{addr}?key={key}"), 0, 0)
}

/// A peer that sends wrong chunks, or a recipe of the wrong size, or an endless one: a clear
/// error, nothing installed, nothing recorded as the object.
#[test]
fn a_lying_peer_gets_nothing_installed() {
    let tmp = tempfile::tempdir().unwrap();
    let b = start(&tmp.path().join("b"));
    let bytes = data(600_000, 13);
    let store = ferry_store::MemStore::new(ferry_format::HashAlg::Blake3);
    let (oid, recipe, _) = ferry_store::store_object(
        &store,
        &bytes[..],
        &ferry_chunk::ChunkerSpec::default(),
        |_| {},
    )
    .unwrap();
    for (i, lie) in [Lie::WrongBytes, Lie::WrongSize, Lie::EndlessRecipe]
        .into_iter()
        .enumerate()
    {
        let hint = liar(
            &tmp.path().join(format!("liar{i}")),
            Liar {
                lie,
                recipe: recipe.clone(),
            },
        );
        let t = Ticket {
            oid,
            size: bytes.len() as u64,
            cap: ferry_daemon::Capability::mint(&[1; 32], [2; 16], 1, &[3; 16]),
            durability: 1,
            hints: vec![hint],
        };
        let out = tmp.path().join("out");
        let e = get(&b, &t.to_string(), &out).unwrap_err();
        let why = e.to_string();
        match lie {
            Lie::WrongBytes => assert!(why.contains("wrong bytes"), "{lie:?}: {why}"),
            _ => assert!(why.contains("answered wrongly"), "{lie:?}: {why}"),
        }
        assert!(!out.exists(), "{lie:?}");
        assert_eq!(objects(&b), 1, "{lie:?}: only the root directory");
    }
}

/// A put from a stream gives the object the same OID as from a file; a stream that breaks
/// half way records nothing.
#[test]
fn a_put_from_a_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let a = start(&tmp.path().join("a"));
    let bytes = data(5 << 20, 14);
    let streamed: PutReply = a
        .client
        .post_stream("/v1/objects", std::io::Cursor::new(bytes.clone()))
        .unwrap();
    let from_file = put_file(&a, "in", &bytes);
    assert_eq!(streamed.oid, from_file.oid);
    assert_eq!(streamed.size, bytes.len() as u64);
    assert_eq!(from_file.durability, 1);
    struct Breaks(usize);
    impl std::io::Read for Breaks {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            if self.0 == 0 {
                return Err(std::io::Error::other("cut"));
            }
            let n = out.len().min(self.0);
            out[..n].fill(7);
            self.0 -= n;
            Ok(n)
        }
    }
    // The daemon sees the body end before its end: no ticket, and no object recorded.
    let before = objects(&a);
    a.client
        .post_stream::<PutReply>("/v1/objects", Breaks(3 << 20))
        .unwrap_err();
    assert_eq!(objects(&a), before);
}

/// A lookaside provider (a daemon of the user's that authorizes this daemon's key, registered
/// with `ferry lookaside add ferry://…`) serves this daemon's fetches chunks by id, beside the
/// peers; without the key authorized it serves nothing. The peer here gives the right recipe
/// and wrong bytes for every chunk, so what the provider supplies is all there is.
#[test]
fn a_lookaside_provider_serves_the_daemons_fetches() {
    let tmp = tempfile::tempdir().unwrap();
    let p = start(&tmp.path().join("p"));
    let bytes = data(3 << 20, 15);
    put_file(&p, "in", &bytes);
    let store = ferry_store::MemStore::new(ferry_format::HashAlg::Blake3);
    let spec = ferry_chunk::ChunkerSpec::default();
    let (oid, recipe, _) = ferry_store::store_object(&store, &bytes[..], &spec, |_| {}).unwrap();
    let lie = Liar {
        lie: Lie::WrongBytes,
        recipe,
    };
    let ticket = Ticket {
        oid,
        size: bytes.len() as u64,
        cap: ferry_daemon::Capability::mint(&[1; 32], [2; 16], 1, &[3; 16]),
        durability: 1,
        hints: vec![liar(&tmp.path().join("liar"), lie)],
    }
    .to_string();
    let provider = format!("ferry://{}", p.status.listen.as_deref().unwrap());
    let from = |got: &Fetched| {
        got.sources
            .iter()
            .find(|s| s.name == provider)
            .map_or(0, |s| s.bytes)
    };
    // B's key is not authorized at P: nothing from it, and the fetch fails.
    let b_dir = tmp.path().join("b");
    let b = start(&b_dir);
    ferry_lookaside::Registry::new(&b_dir)
        .add(Path::new(&provider))
        .unwrap();
    let e = get(&b, &ticket, &tmp.path().join("out1")).unwrap_err();
    assert!(e.to_string().contains("wrong bytes"), "{e}");
    // C's is.
    let c_dir = tmp.path().join("c");
    let c = start(&c_dir);
    ferry_lookaside::Registry::new(&c_dir)
        .add(Path::new(&provider))
        .unwrap();
    let (c_id, _) = ferry_net::Identity::load_or_create(&c_dir).unwrap();
    std::fs::write(
        tmp.path().join("p/authorized_keys"),
        format!("{} c\n", c_id.fingerprint()),
    )
    .unwrap();
    let out = tmp.path().join("out2");
    let got = get(&c, &ticket, &out).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), bytes);
    assert_eq!(from(&got), bytes.len() as u64, "{got:?}");
    let counted = ferry_lookaside::Registry::new(&c_dir).list().unwrap();
    assert_eq!(counted[0].supplied.bytes, from(&got), "{counted:?}");
}

/// An object held whole streams out of the daemon in order, as it is (`ferry object get -o -`).
#[test]
fn an_object_streams_out_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let a = start(&tmp.path().join("a"));
    let bytes = data(3 << 20, 16);
    let put = put_file(&a, "in", &bytes);
    let mut got = vec![];
    a.client
        .get_bytes(&format!("/v1/objects/{}/data", put.ticket), |d| {
            got.extend_from_slice(d);
            Ok(())
        })
        .unwrap();
    assert!(got == bytes);
    let e = a
        .client
        .get_bytes("/v1/objects/ferry2aaaa/data", |_| Ok(()))
        .unwrap_err();
    assert!(matches!(e, DaemonError::BadRequest(_)), "{e}");
}

/// A destination on a full disk: the fetch fails saying so, nothing (not even a temporary
/// file) is left there, and the object is still fetched into the store (a second get to
/// another place needs no network). Needs root to mount a tmpfs; CI runs as root.
#[test]
fn a_full_disk_fails_the_install_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let full = tmp.path().join("full");
    std::fs::create_dir_all(&full).unwrap();
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if !root {
        eprintln!("SKIPPED a_full_disk_fails_the_install_cleanly: needs root to mount a tmpfs");
        return;
    }
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&full)
        .status()
        .unwrap();
    assert!(st.success());
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(self.0)
                .status();
        }
    }
    let _unmount = Unmount(&full);
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));
    let bytes = data(3 << 20, 17);
    let put = put_file(&a, "in", &bytes);
    let e = get(&b, &put.ticket, &full.join("out")).unwrap_err();
    assert!(e.to_string().contains("No space left"), "{e}");
    assert_eq!(std::fs::read_dir(&full).unwrap().count(), 0);
    let elsewhere = tmp.path().join("out");
    let again = get(&b, &put.ticket, &elsewhere).unwrap();
    assert!(again.sources.is_empty(), "{again:?}");
    assert!(std::fs::read(&elsewhere).unwrap() == bytes);
}

/// Bullet through the API: durability, SIZE, READ of a range, DELETE, and every request type
/// refusing every capability that is not valid for it, with one answer.
#[test]
fn no_valid_capability_no_service_through_the_api() {
    use ferry_daemon::api::{DirListing, DirUpdate, DirVersion};
    let tmp = tempfile::tempdir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));
    let bytes = data(200_000, 21);
    let put = put_file(&a, "in", &bytes);
    assert_eq!(
        (put.durability, put.rights.as_str()),
        (1, "read,delete,restrict,modify")
    );
    let t: Ticket = put.ticket.parse().unwrap();
    let info: ObjectInfo = a.client.get(&format!("/v1/objects/{t}")).unwrap();
    assert_eq!(
        (info.size, info.kind.as_str()),
        (bytes.len() as u64, "object")
    );
    let mut part = vec![];
    a.client
        .get_bytes(&format!("/v1/objects/{t}/data?start=1000&end=70000"), |d| {
            part.extend_from_slice(d);
            Ok(())
        })
        .unwrap();
    assert!(part == bytes[1000..70000]);
    // At durability 0 the answer says so.
    let streamed: PutReply = a
        .client
        .post_stream(
            "/v1/objects?durability=0",
            std::io::Cursor::new(data(1000, 22)),
        )
        .unwrap();
    assert_eq!(streamed.durability, 0);
    let dir: ferry_daemon::dirs::Made = a.client.post("/v1/dirs", &()).unwrap();
    let d: Ticket = dir.ticket.parse().unwrap();
    // Capabilities that must get nothing.
    let mut forged = t.clone();
    forged.cap.check[0] ^= 1;
    let mut other_number = t.clone();
    other_number.cap.number += 1000;
    let foreign: Ticket = put_file(&b, "in", &bytes).ticket.parse().unwrap();
    let mut widened = t.restrict(ferry_daemon::Rights::READ).unwrap();
    widened.cap.masks[0] = ferry_daemon::Rights::ALL;
    let read_only = t.restrict(ferry_daemon::Rights::READ).unwrap();
    let dir_read_only = d.restrict(ferry_daemon::Rights::READ).unwrap();
    let bad = [
        ("forged", forged),
        ("another number", other_number),
        ("another daemon's", foreign),
        ("widened", widened),
    ];
    type Call = fn(&Daemon, &Ticket) -> Result<(), DaemonError>;
    let calls: [(&str, Call); 7] = [
        ("stat", |d, t| {
            d.client
                .get::<ObjectInfo>(&format!("/v1/objects/{t}"))
                .map(|_| ())
        }),
        ("read", |d, t| {
            d.client
                .get_bytes(&format!("/v1/objects/{t}/data"), |_| Ok(()))
        }),
        ("delete", |d, t| {
            d.client.delete(&format!("/v1/objects/{t}"))
        }),
        ("list", |d, t| {
            d.client
                .get::<DirListing>(&format!("/v1/dirs/{t}"))
                .map(|_| ())
        }),
        ("history", |d, t| {
            let p = format!("/v1/dirs/{t}/history");
            d.client.get::<serde_json::Value>(&p).map(|_| ())
        }),
        ("update", |d, t| {
            let u = DirUpdate {
                base: 0,
                changes: vec![],
            };
            d.client
                .post::<_, DirVersion>(&format!("/v1/dirs/{t}"), &u)
                .map(|_| ())
        }),
        ("dir delete", |d, t| {
            d.client.delete(&format!("/v1/objects/{t}"))
        }),
    ];
    for (name, call) in calls {
        let dir_call = matches!(name, "list" | "history" | "update" | "dir delete");
        for (what, bad) in &bad {
            let mut bad = bad.clone();
            if dir_call {
                bad.cap.server = if *what == "another daemon's" {
                    bad.cap.server
                } else {
                    d.cap.server
                };
                bad.cap.number = if *what == "another number" {
                    d.cap.number + 1000
                } else {
                    d.cap.number
                };
            }
            let e = call(&a, &bad).unwrap_err();
            assert!(
                matches!(e, DaemonError::NotFound(_)),
                "{name} with {what}: {e}"
            );
            assert!(e
                .to_string()
                .contains("no such object, or not with this capability"));
        }
        // Lacking the right the request needs.
        let weak = match name {
            "delete" => Some(&read_only),
            "update" | "dir delete" => Some(&dir_read_only),
            _ => None,
        };
        if let Some(w) = weak {
            let e = call(&a, w).unwrap_err();
            assert!(
                matches!(e, DaemonError::NotFound(_)),
                "{name} without its right: {e}"
            );
        }
    }
    // The valid ones still work, and a delete is final.
    assert_eq!(
        a.client
            .get::<DirListing>(&format!("/v1/dirs/{d}"))
            .unwrap()
            .version,
        0
    );
    a.client.delete(&format!("/v1/objects/{t}")).unwrap();
    let e = a
        .client
        .get::<ObjectInfo>(&format!("/v1/objects/{t}"))
        .unwrap_err();
    assert!(matches!(e, DaemonError::NotFound(_)), "{e}");
}

/// Directories through the API: names bound to tickets, versions committed by
/// compare-and-swap (409 on a stale base), old versions listable.
#[test]
fn directories_through_the_api() {
    use ferry_daemon::api::{DirChange, DirListing, DirUpdate, DirVersion};
    let tmp = tempfile::tempdir().unwrap();
    let a = start(&tmp.path().join("a"));
    let root: Ticket = a.status.root.parse().unwrap();
    let put = put_file(&a, "in", b"hello");
    let set = |base, name: &str, ticket: Option<String>| {
        a.client.post::<_, DirVersion>(
            &format!("/v1/dirs/{root}"),
            &DirUpdate {
                base,
                changes: vec![DirChange {
                    name: name.into(),
                    ticket,
                }],
            },
        )
    };
    assert_eq!(
        set(0, "hello.txt", Some(put.ticket.clone()))
            .unwrap()
            .version,
        1
    );
    let sub: ferry_daemon::dirs::Made = a.client.post("/v1/dirs", &()).unwrap();
    assert_eq!(set(1, "sub", Some(sub.ticket)).unwrap().version, 2);
    let e = set(1, "late", Some(put.ticket.clone())).unwrap_err();
    assert!(matches!(e, DaemonError::Conflict(_)), "{e}");
    let l: DirListing = a.client.get(&format!("/v1/dirs/{root}")).unwrap();
    assert_eq!(l.version, 2);
    let kinds: Vec<(&str, &str)> = l
        .entries
        .iter()
        .map(|e| (e.name.as_str(), e.kind.as_str()))
        .collect();
    assert_eq!(kinds, [("hello.txt", "object"), ("sub", "directory")]);
    assert_eq!(l.entries[0].ticket, put.ticket);
    let old: DirListing = a.client.get(&format!("/v1/dirs/{root}?version=1")).unwrap();
    assert_eq!(old.entries.len(), 1);
    let e = set(2, "a/b", Some(put.ticket.clone())).unwrap_err();
    assert!(matches!(e, DaemonError::BadRequest(_)), "{e}");
    // The root survives a restart (its capability is kept in the data directory).
    let again: Status = a.client.get("/v1/status").unwrap();
    assert_eq!(again.root, a.status.root);
}

/// Durability 2: the create answers once a replica holds a copy too; the ticket names the
/// copy (with its own capability), which serves a fetch alone; a delete removes both; a
/// durability no replica set can meet leaves nothing anywhere.
#[test]
fn durability_two_keeps_a_copy_at_a_replica() {
    use ferry_daemon::api::ReplicaRequest;
    let tmp = tempfile::tempdir().unwrap();
    let a = start(&tmp.path().join("a"));
    let r = start(&tmp.path().join("r"));
    let b = start(&tmp.path().join("b"));
    let uri = format!("ferry://{}", r.status.listen.as_deref().unwrap());
    // Until R authorizes A's key, R refuses to keep copies for it.
    let _: Vec<String> = a
        .client
        .post("/v1/replicas", &ReplicaRequest { uri: uri.clone() })
        .unwrap();
    let bytes = data(400_000, 31);
    std::fs::write(a.dir.join("in"), &bytes).unwrap();
    let put = |p: u8| {
        a.client.post::<_, PutReply>(
            "/v1/objects",
            &PutRequest {
                path: a.dir.join("in"),
                durability: p,
            },
        )
    };
    let e = put(2).unwrap_err();
    assert!(e.to_string().contains("authorize"), "{e}");
    assert_eq!(
        (objects(&a), objects(&r)),
        (1, 1),
        "only the root directories"
    );
    std::fs::write(
        tmp.path().join("r/authorized_keys"),
        format!("{} a\n", a.status.key),
    )
    .unwrap();
    let made = put(2).unwrap();
    assert_eq!(made.durability, 2, "{made:?}");
    assert_eq!(objects(&r), 2);
    let t: Ticket = made.ticket.parse().unwrap();
    assert_eq!(t.hints.len(), 2);
    // The replica's hint alone serves a fetch.
    let mut only_replica = t.clone();
    only_replica.hints.remove(0);
    let out = tmp.path().join("out");
    let got = get(&b, &only_replica.to_string(), &out).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), bytes);
    assert!(got.sources[0].name.starts_with(&uri), "{got:?}");
    // A read-only ticket deletes nothing; the owner's deletes both copies.
    let reader = t.restrict(ferry_daemon::Rights::READ).unwrap();
    assert!(a.client.delete(&format!("/v1/objects/{reader}")).is_err());
    a.client.delete(&format!("/v1/objects/{t}")).unwrap();
    assert_eq!((objects(&a), objects(&r)), (1, 1));
    // Three stores with one replica: refused, nothing made.
    let e = put(3).unwrap_err();
    assert!(e.to_string().contains("needs 2 replicas"), "{e}");
    assert_eq!((objects(&a), objects(&r)), (1, 1));
}

/// Bullet's requests over the wire: CREATE by an authorized key only, READ and DELETE by
/// capability from any key.
#[test]
fn objects_over_the_wire() {
    use ferry_proto::{ErrorCode, Reply, Request};
    let tmp = tempfile::tempdir().unwrap();
    let a = start(&tmp.path().join("a"));
    let (ep, key) = ferry_daemon::fetch::parse_peer(&a.status.hints[0].uri).unwrap();
    let client_dir = tmp.path().join("client");
    std::fs::create_dir_all(&client_dir).unwrap();
    let (me, _) = ferry_net::Identity::load_or_create(&client_dir).unwrap();
    let mut s = ferry_net::connect_pinned(&ep, &me, key).unwrap();
    let bytes = data(3 << 20, 41);
    let create = |s: &mut ferry_fs::Session| {
        // 3 MiB in one request, then the same in three pieces.
        s.conn.call(Request::ObjectCreate {
            durability: 1,
            size: bytes.len() as u64,
            data: bytes.clone(),
        })
    };
    match create(&mut s) {
        Err(ferry_fs::ConnError::Remote { code, .. }) => assert_eq!(code, ErrorCode::Permission),
        r => panic!("a guest created an object: {r:?}"),
    }
    std::fs::write(
        tmp.path().join("a/authorized_keys"),
        format!("{} me\n", me.fingerprint()),
    )
    .unwrap();
    let mut s = ferry_net::connect_pinned(&ep, &me, key).unwrap();
    let cap = match create(&mut s).unwrap().remove(0) {
        Reply::Created {
            durability: 1,
            ticket,
        } => Ticket::from_bytes(&ticket).unwrap().cap.to_bytes(),
        r => panic!("{r:?}"),
    };
    let read = |s: &mut ferry_fs::Session, cap: &[u8], offset, len| {
        let replies = s.conn.call(Request::ObjectRead {
            cap: cap.to_vec(),
            offset,
            len,
        })?;
        let mut out = vec![];
        for r in replies {
            match r {
                Reply::Range { data, .. } => out.extend_from_slice(&data),
                r => panic!("{r:?}"),
            }
        }
        Ok::<_, ferry_fs::ConnError>(out)
    };
    assert!(read(&mut s, &cap, 0, 3 << 20).unwrap() == bytes);
    let first = s
        .conn
        .call(Request::ObjectCreate {
            durability: 0,
            size: bytes.len() as u64,
            data: bytes[..1 << 20].to_vec(),
        })
        .unwrap();
    assert_eq!(first, [Reply::Ok]);
    s.conn
        .call(Request::ObjectAppend {
            data: bytes[1 << 20..2 << 20].to_vec(),
        })
        .unwrap();
    let piecewise = match s
        .conn
        .call(Request::ObjectAppend {
            data: bytes[2 << 20..].to_vec(),
        })
        .unwrap()
        .remove(0)
    {
        Reply::Created { ticket, .. } => Ticket::from_bytes(&ticket).unwrap().cap.to_bytes(),
        r => panic!("{r:?}"),
    };
    assert!(read(&mut s, &piecewise, 0, 3 << 20).unwrap() == bytes);
    // Too many bytes are refused; an append with no create too.
    let e = s.conn.call(Request::ObjectAppend { data: vec![1] });
    assert!(e.is_err(), "{e:?}");
    assert!(read(&mut s, &cap, 1000, 10).unwrap() == bytes[1000..1010]);
    // A guest holding the capability reads it; a forged one reads nothing.
    let (guest, _) = ferry_net::Identity::load_or_create(&tmp.path().join("guest")).unwrap();
    let mut g = ferry_net::connect_pinned(&ep, &guest, key).unwrap();
    assert_eq!(read(&mut g, &cap, 0, 5).unwrap(), bytes[..5]);
    let mut forged = cap.clone();
    *forged.last_mut().unwrap() ^= 1;
    assert!(matches!(
        read(&mut g, &forged, 0, 5),
        Err(ferry_fs::ConnError::Remote {
            code: ErrorCode::NotFound,
            ..
        })
    ));
    let del = |s: &mut ferry_fs::Session, cap: &[u8]| {
        s.conn.call(Request::ObjectDelete { cap: cap.to_vec() })
    };
    assert!(del(&mut g, &forged).is_err());
    assert_eq!(del(&mut g, &cap).unwrap(), [Reply::Ok]);
    assert!(read(&mut s, &cap, 0, 5).is_err());
}

/// One of every request the protocol has, with `cap` where a capability goes. The match in
/// `kind` has no wildcard: a new request type does not compile until it is in this table.
fn every_request(oid: ferry_format::Id, cap: &[u8], ticket: &[u8]) -> Vec<ferry_proto::Request> {
    use ferry_proto::{GetChunks, Ids, KeyOlds, Request, Target, VaultOp, WritePart};
    let p = || ferry_proto::WirePath::from("f");
    vec![
        Request::GetAttr { path: p() },
        Request::ReadDir {
            path: p(),
            keys: vec![],
        },
        Request::ReadLink { path: p() },
        Request::ReadTree {
            path: p(),
            known: Default::default(),
        },
        Request::Mkdir {
            path: p(),
            mode: 0o755,
        },
        Request::Rename {
            from: p(),
            to: "g".into(),
        },
        Request::Unlink { path: p() },
        Request::Link {
            from: p(),
            to: "h".into(),
        },
        Request::Rmdir { path: p() },
        Request::Symlink {
            path: p(),
            target: b"x".to_vec(),
        },
        Request::SetAttr {
            path: p(),
            mode: Some(0o600),
            mtime_ns: None,
        },
        Request::StatFs { path: p() },
        Request::GetRecipe {
            target: Target::Path(p()),
            short: false,
            known: vec![],
        },
        Request::GetChunks(GetChunks {
            ids: Ids::Full(vec![oid]),
            at: None,
            against: None,
        }),
        Request::ReadFiles {
            files: vec![(p(), vec![])],
        },
        Request::ReadRange {
            target: Target::Path(p()),
            offset: 0,
            len: 10,
        },
        Request::Have {
            ids: Ids::Full(vec![oid]),
        },
        Request::GetKeys {
            path: p(),
            version: None,
            olds: KeyOlds::Indices(vec![]),
            new_bytes: 1,
        },
        Request::Create {
            handle: 1,
            path: p(),
            base: None,
        },
        Request::Write {
            handle: 1,
            parts: vec![WritePart::Base { start: 0, count: 1 }],
        },
        Request::Commit {
            handle: 1,
            mode: 0o644,
            mtime_ns: 0,
            size: 0,
            oid,
        },
        Request::Abort { handle: 1 },
        Request::ObjectRecipe {
            oid,
            cap: cap.to_vec(),
            from: 0,
        },
        Request::ObjectChunks {
            oid,
            cap: cap.to_vec(),
            ids: Ids::Full(vec![oid]),
        },
        Request::ObjectRead {
            cap: cap.to_vec(),
            offset: 0,
            len: 10,
        },
        Request::ObjectCreate {
            durability: 1,
            size: 3,
            data: b"abc".to_vec(),
        },
        Request::ObjectAppend {
            data: b"abc".to_vec(),
        },
        Request::ObjectDelete { cap: cap.to_vec() },
        Request::ObjectReplicate {
            durability: 1,
            ticket: ticket.to_vec(),
        },
        Request::Vault {
            path: p(),
            op: VaultOp::List,
            name: b"heads".to_vec(),
            data: vec![],
        },
        Request::Sync,
        Request::Ping,
    ]
}

/// What a request is the authority of: a capability's, an owner's (an authorized key's), or the
/// export's; or none (anyone may ask). Exhaustive on purpose.
fn kind(r: &ferry_proto::Request) -> &'static str {
    use ferry_proto::Request as R;
    match r {
        R::Ping => "anyone",
        R::ObjectRecipe { .. }
        | R::ObjectChunks { .. }
        | R::ObjectRead { .. }
        | R::ObjectDelete { .. } => "capability",
        R::GetChunks(_)
        | R::ObjectCreate { .. }
        | R::ObjectAppend { .. }
        | R::ObjectReplicate { .. } => "owner",
        R::GetAttr { .. }
        | R::ReadDir { .. }
        | R::ReadTree { .. }
        | R::ReadLink { .. }
        | R::Mkdir { .. }
        | R::Rename { .. }
        | R::Unlink { .. }
        | R::Link { .. }
        | R::Rmdir { .. }
        | R::Symlink { .. }
        | R::SetAttr { .. }
        | R::StatFs { .. }
        | R::Sync
        | R::GetRecipe { .. }
        | R::ReadFiles { .. }
        | R::ReadRange { .. }
        | R::Have { .. }
        | R::GetKeys { .. }
        | R::Create { .. }
        | R::Write { .. }
        | R::Commit { .. }
        | R::Abort { .. }
        | R::Vault { .. } => "export",
    }
}

/// Every request type, over TLS to a transfer daemon, from a key it does not know (a guest):
/// with no capability, a forged one, and a valid one too weak for the request. A guest gets only
/// what a capability is the authority for, and every capability that does not allow the request
/// gets one and the same answer ("no such object, or not with this capability"), whether the
/// object exists or not. An authorized key gets objects and chunks, never the daemon's files.
#[test]
fn every_request_type_refused_without_its_authority() {
    use ferry_proto::{ErrorCode, Reply};
    let tmp = tempfile::tempdir().unwrap();
    let a = start(&tmp.path().join("a"));
    let t: Ticket = put_file(&a, "in", &data(100_000, 31))
        .ticket
        .parse()
        .unwrap();
    let read_only = t.restrict(ferry_daemon::Rights::READ).unwrap();
    let mut forged = t.clone();
    forged.cap.check[0] ^= 1;
    let guest_dir = tmp.path().join("guest");
    std::fs::create_dir_all(&guest_dir).unwrap();
    let (me, _) = ferry_net::Identity::load_or_create(&guest_dir).unwrap();
    let (ep, key) = ferry_daemon::fetch::parse_peer(&t.hints[0].uri).unwrap();
    let ticket = t.to_string().into_bytes();
    let code = |r: Result<Vec<Reply>, ferry_fs::ConnError>| match r {
        Err(ferry_fs::ConnError::Remote { code, message }) => (code, message),
        r => panic!("not refused: {r:?}"),
    };
    let caps: [(&str, Vec<u8>); 3] = [
        ("no capability", vec![]),
        ("a forged capability", forged.cap.to_bytes()),
        ("a capability without the right", read_only.cap.to_bytes()),
    ];
    let mut tried = 0;
    for (what, cap) in &caps {
        // A fresh session each time: a refused request may end the session's state.
        for r in every_request(t.oid.0, cap, &ticket) {
            // A read-only capability does allow the reads: only the delete is too weak for it.
            if *what == "a capability without the right"
                && !matches!(r, ferry_proto::Request::ObjectDelete { .. })
            {
                continue;
            }
            let mut s = ferry_net::connect_pinned(&ep, &me, key).unwrap();
            if kind(&r) == "anyone" {
                assert_eq!(
                    s.conn.call(r.clone()).unwrap(),
                    [Reply::Ok],
                    "{r:?} as a guest"
                );
                continue;
            }
            let (c, m) = code(s.conn.call(r.clone()));
            match kind(&r) {
                "capability" => {
                    assert_eq!(c, ErrorCode::NotFound, "{r:?} with {what}: {m}");
                    assert!(
                        m.contains("no such object, or not with this capability"),
                        "{m}"
                    );
                }
                _ => assert_eq!(c, ErrorCode::Permission, "{r:?} as a guest: {m}"),
            }
            tried += 1;
        }
    }
    // An authorized key: the daemon's files are neither listed nor written.
    std::fs::write(
        tmp.path().join("a/authorized_keys"),
        format!("{} me\n", me.fingerprint()),
    )
    .unwrap();
    for r in every_request(t.oid.0, &forged.cap.to_bytes(), &ticket) {
        if kind(&r) != "export" {
            continue;
        }
        let mut s = ferry_net::connect_pinned(&ep, &me, key).unwrap();
        let (c, m) = code(s.conn.call(r.clone()));
        assert_eq!(
            c,
            ErrorCode::Unsupported,
            "{r:?} with an authorized key: {m}"
        );
        tried += 1;
    }
    assert!(tried >= 27 + 4 + 1 + 19, "{tried}");
}
