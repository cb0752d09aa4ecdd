//! The S3 backend against a real S3 server (versitygw on loopback): several servers on one
//! store, resumed uploads, and a server that fails.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use ferry_chunk::ChunkerSpec;
use ferry_store::{read_object, store_object, ChunkStore};

use ferry_format::HashAlg;
use ferry_s3::testing::S3Server;
use ferry_s3::{Locator, Options, S3Store};
use ferry_store::StoreError;

use crate::bytes;

/// Small packs and windows, so tests cross their boundaries.
pub fn options(cache: &Path, create: bool) -> Options {
    Options {
        create,
        create_bucket: create,
        pack_target: 256 << 10,
        window: 128 << 10,
        cache_windows: 8,
        ..Options::new(cache)
    }
}

pub fn open(
    gw: &S3Server,
    loc: &Locator,
    cache: &Path,
    create: bool,
) -> Result<S3Store, StoreError> {
    S3Store::open(loc, &gw.resolved(), options(cache, create))
}

pub fn open_alg(
    gw: &S3Server,
    loc: &Locator,
    cache: &Path,
    alg: HashAlg,
) -> Result<S3Store, StoreError> {
    S3Store::open(
        loc,
        &gw.resolved(),
        Options {
            hash_alg: alg,
            ..options(cache, true)
        },
    )
}

fn loc(gw: &S3Server, s: &str) -> Locator {
    Locator::parse(&gw.locator(s)).unwrap()
}

#[test]
fn what_one_server_flushed_another_serves() {
    let t = tempfile::tempdir().unwrap();
    let Some(gw) = S3Server::for_test(&t.path().join("s3")) else {
        return;
    };
    let l = loc(&gw, "s3://shared/store");
    let a = open(&gw, &l, &t.path().join("a"), true).unwrap();
    // B opens first: its index knows nothing of what A writes next.
    let b = open(&gw, &l, &t.path().join("b"), false).unwrap();
    let data = bytes(1, 3_000_000);
    let (oid, recipe, _) = store_object(&a, &data[..], &ChunkerSpec::default(), |_| {}).unwrap();
    let mut out = vec![];
    assert_eq!(
        read_object(&b, &oid, &mut out).unwrap(),
        Some(data.len() as u64)
    );
    assert_eq!(out, data);
    assert!(b.contains(&recipe.chunks()[0].id).unwrap());
    assert_eq!(b.objects().unwrap(), vec![(oid, data.len() as u64)]);
    // B's own object, stored against what A already has: only new chunks go up.
    let mut more = data.clone();
    more.extend_from_slice(&bytes(2, 100_000));
    let (_, _, st) = store_object(&b, &more[..], &ChunkerSpec::default(), |_| {}).unwrap();
    assert!(st.new_bytes < 300_000, "{st:?}");
    assert_eq!(a.objects().unwrap().len(), 2);
}

#[test]
fn an_interrupted_upload_resumes_without_resending_stored_packs() {
    let t = tempfile::tempdir().unwrap();
    let Some(gw) = S3Server::for_test(&t.path().join("s3")) else {
        return;
    };
    let l = loc(&gw, "s3://resume/x");
    let data = bytes(3, 4_000_000);
    let spec = ChunkerSpec::default();
    let half = {
        let a = open(&gw, &l, &t.path().join("a"), true).unwrap();
        // The first half goes up in full packs; the process is then cut (dropped unflushed).
        let _: (ferry_format::Recipe, ferry_format::Oid) =
            ferry_format::chunk_object(&data[..2_000_000], &spec, a.hash_alg(), |c, d| {
                a.put(&ferry_store::VerifiedChunk::assume_verified(c.id, d))
                    .map(|_| ())
                    .map_err(std::io::Error::other)
            })
            .unwrap();
        drop(a);
        // What reached the bucket, as a server with an empty cache sees it.
        open(&gw, &l, &t.path().join("probe"), false)
            .unwrap()
            .stats()
            .unwrap()
    };
    assert!(half.packs >= 5 && half.chunk_bytes > 1_000_000, "{half:?}");
    let a = open(&gw, &l, &t.path().join("a2"), false).unwrap();
    let (oid, _, st) = store_object(&a, &data[..], &spec, |_| {}).unwrap();
    // What reached the bucket is not sent again.
    assert!(
        st.new_bytes <= data.len() as u64 - half.chunk_bytes + 200_000,
        "{st:?} after {half:?}"
    );
    let mut out = vec![];
    read_object(&a, &oid, &mut out).unwrap();
    assert_eq!(out, data);
}

#[test]
fn bad_credentials_and_missing_buckets_are_one_clear_line() {
    let t = tempfile::tempdir().unwrap();
    let Some(gw) = S3Server::for_test(&t.path().join("s3")) else {
        return;
    };
    let mut r = gw.resolved();
    r.secret_key = "wrong".into();
    let e = S3Store::open(
        &loc(&gw, "s3://bkt/x"),
        &r,
        options(&t.path().join("c"), true),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("AWS_SECRET_ACCESS_KEY") && !e.contains('\n'),
        "{e}"
    );
    let e = open(
        &gw,
        &loc(&gw, "s3://no-such-bucket/x"),
        &t.path().join("c"),
        false,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("no-such-bucket") && e.contains("does not exist"),
        "{e}"
    );
    // A bucket without a store.
    open(&gw, &loc(&gw, "s3://bkt/x"), &t.path().join("c1"), true).unwrap();
    let e = open(&gw, &loc(&gw, "s3://bkt/y"), &t.path().join("c2"), false)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains(&format!("no Ferry store at {}", gw.locator("s3://bkt/y/"))),
        "{e}"
    );
}

/// What the fault proxy does to the next requests.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    None,
    /// Every other request gets a 500 (or a 503 SlowDown).
    Flaky,
    /// Responses to GETs of packs have a byte flipped.
    Flip,
    /// Responses to GETs are cut halfway (the connection then closes).
    Cut,
    /// Requests are read and never answered.
    Silent,
}

/// An HTTP/1.1 proxy in front of the S3 server that injects faults.
struct Proxy {
    port: u16,
    fault: Arc<Mutex<Fault>>,
}

impl Proxy {
    fn start(upstream: u16) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let fault = Arc::new(Mutex::new(Fault::None));
        let f = fault.clone();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let f = f.clone();
                std::thread::spawn(move || {
                    let _ = proxy_conn(c, upstream, &f);
                });
            }
        });
        Proxy { port, fault }
    }

    fn set(&self, f: Fault) {
        *self.fault.lock().unwrap() = f;
    }
}

/// Reads one HTTP message head and its body (by Content-Length).
fn read_message(r: &mut impl BufRead) -> std::io::Result<Option<(String, Vec<u8>)>> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    Ok(Some((head, body)))
}

fn proxy_conn(c: TcpStream, upstream: u16, fault: &Mutex<Fault>) -> std::io::Result<()> {
    let mut client = BufReader::new(c.try_clone()?);
    let mut out = c;
    let mut n = 0u64;
    while let Some((head, body)) = read_message(&mut client)? {
        n += 1;
        let f = *fault.lock().unwrap();
        let is_get = head.starts_with("GET ");
        let is_pack_get = is_get && head.contains("/packs/");
        if f == Fault::Silent {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
        if f == Fault::Flaky && n % 2 == 1 {
            let status = if n % 4 == 1 {
                "500 Internal Server Error"
            } else {
                "503 Slow Down"
            };
            write!(out, "HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n")?;
            continue;
        }
        // One upstream connection per request: simple, and the proxy is for faults, not speed.
        let mut up = TcpStream::connect(("127.0.0.1", upstream))?;
        let head = head.replacen("\r\n\r\n", "\r\nConnection: close\r\n\r\n", 1);
        up.write_all(head.as_bytes())?;
        up.write_all(&body)?;
        let mut upr = BufReader::new(up);
        let Some((rhead, mut rbody)) = read_message(&mut upr)? else {
            return Ok(());
        };
        let ok = rhead.starts_with("HTTP/1.1 2");
        match f {
            Fault::Flip if is_pack_get && ok && !rbody.is_empty() => {
                let i = rbody.len() / 2;
                rbody[i] ^= 0x40;
            }
            Fault::Cut if is_get && ok && rbody.len() > 1 => {
                out.write_all(rhead.as_bytes())?;
                out.write_all(&rbody[..rbody.len() / 2])?;
                return Ok(());
            }
            _ => {}
        }
        out.write_all(rhead.as_bytes())?;
        out.write_all(&rbody)?;
    }
    Ok(())
}

#[test]
fn a_failing_server_costs_retries_or_errors_never_wrong_chunks() {
    let t = tempfile::tempdir().unwrap();
    let Some(gw) = S3Server::for_test(&t.path().join("s3")) else {
        return;
    };
    let proxy = Proxy::start(gw.port);
    let mut r = gw.resolved();
    r.endpoint = format!("http://127.0.0.1:{}", proxy.port);
    let l = loc(&gw, "s3://faults/x");
    let mut opts = options(&t.path().join("a"), true);
    opts.client.backoff = std::time::Duration::from_millis(1);
    opts.client.timeout = std::time::Duration::from_secs(2);
    let data = bytes(4, 2_000_000);
    let spec = ChunkerSpec::default();

    // 500s and 503s on every other request: everything works, through retries.
    proxy.set(Fault::Flaky);
    let a = S3Store::open(&l, &r, opts.clone()).unwrap();
    let (oid, recipe, _) = store_object(&a, &data[..], &spec, |_| {}).unwrap();
    drop(a);
    let b = S3Store::open(
        &l,
        &r,
        Options {
            cache_dir: t.path().join("b"),
            ..opts.clone()
        },
    )
    .unwrap();
    let mut out = vec![];
    read_object(&b, &oid, &mut out).unwrap();
    assert_eq!(out, data);
    assert!(b.retries() > 0);

    // Altered bytes: an error naming the chunk, never the altered bytes.
    let c = S3Store::open(
        &l,
        &r,
        Options {
            cache_dir: t.path().join("c"),
            ..opts.clone()
        },
    )
    .unwrap();
    proxy.set(Fault::Flip);
    let e = read_object(&c, &oid, std::io::sink()).unwrap_err();
    assert!(e.is_corrupt(), "{e}");
    assert!(c.stats().unwrap().damaged > 0);
    // Once the server heals, the same store reads it right.
    proxy.set(Fault::None);
    let mut out = vec![];
    read_object(&c, &oid, &mut out).unwrap();
    assert_eq!(out, data);

    // Cut replies: an error (or a retry), never a short chunk.
    let d = S3Store::open(
        &l,
        &r,
        Options {
            cache_dir: t.path().join("d"),
            ..opts.clone()
        },
    )
    .unwrap();
    proxy.set(Fault::Cut);
    for id in recipe.chunks().iter().map(|c| c.id).take(3) {
        match d.get(&id) {
            Ok(Some(bytes)) => assert!(id.matches(&bytes)),
            Ok(None) => panic!("a chunk the store holds reported absent"),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
    proxy.set(Fault::None);

    // A pack listed, then deleted behind the store's back: an error, never wrong bytes, and
    // the store still answers for the chunks of the other packs.
    let e = S3Store::open(
        &l,
        &r,
        Options {
            cache_dir: t.path().join("e"),
            ..opts.clone()
        },
    )
    .unwrap();
    let client = ferry_s3::Client::new(&gw.resolved(), "faults", Default::default()).unwrap();
    let victim = client.list(&gw.key("x/packs/")).unwrap().remove(0);
    client.delete(&victim.key).unwrap();
    assert!(read_object(&e, &oid, std::io::sink()).is_err());
    let survivors = recipe
        .chunks()
        .iter()
        .filter(|c| matches!(e.get(&c.id), Ok(Some(_))))
        .count();
    assert!(survivors > 0 && survivors < recipe.len(), "{survivors}");

    // A server that never answers: a clear error after the timeouts, not a hang.
    let mut quick = opts.clone();
    quick.client.attempts = 2;
    quick.cache_dir = t.path().join("f");
    proxy.set(Fault::Silent);
    let err = S3Store::open(&l, &r, quick).err().unwrap().to_string();
    assert!(err.contains("cannot be reached"), "{err}");
}

fn read_all(s: &S3Store, oid: &ferry_format::Oid) -> Vec<u8> {
    let mut out = vec![];
    read_object(s, oid, &mut out)
        .unwrap()
        .expect("the object is there");
    out
}

#[test]
fn gc_condemns_then_deletes_and_spares_what_a_late_writer_used() {
    use std::time::Duration;
    let t = tempfile::tempdir().unwrap();
    let Some(gw) = S3Server::for_test(&t.path().join("s3")) else {
        return;
    };
    let l = loc(&gw, "s3://gcb/x");
    let spec = ChunkerSpec::default();
    let a = open(&gw, &l, &t.path().join("a"), true).unwrap();
    let keep = bytes(10, 1_500_000);
    let gone = bytes(11, 2_000_000);
    let (keep_oid, _, _) = store_object(&a, &keep[..], &spec, |_| {}).unwrap();
    let (gone_oid, _, _) = store_object(&a, &gone[..], &spec, |_| {}).unwrap();
    // A second server, whose index is from before any gc.
    let late = open(&gw, &l, &t.path().join("late"), false).unwrap();
    assert!(a.remove_object(&gone_oid).unwrap());

    // Phase one: the dead packs are condemned; with an hour of grace nothing is deleted.
    let r1 = a.gc(Duration::from_secs(3600), 0.5).unwrap();
    assert!(r1.packs_condemned >= 4 && r1.packs_deleted == 0, "{r1:?}");
    let r = a.gc(Duration::from_secs(3600), 0.5).unwrap();
    assert_eq!(
        (r.packs_waiting, r.packs_deleted, r.packs_condemned),
        (r1.packs_condemned, 0, 0),
        "{r:?}"
    );
    // A server that refreshed does not deduplicate against condemned packs.
    let fresh = open(&gw, &l, &t.path().join("fresh"), false).unwrap();
    let first = ferry_format::chunk_object::<_, std::io::Error, _>(
        &gone[..200_000],
        &spec,
        fresh.hash_alg(),
        |_, _| Ok(()),
    )
    .unwrap()
    .0;
    assert!(!fresh.contains(&first.chunks()[0].id).unwrap());
    drop(fresh);

    // The late server stores half of the deleted object, leaning on the condemned packs.
    let (half_oid, _, st) = store_object(&late, &gone[..1_000_000], &spec, |_| {}).unwrap();
    assert!(
        st.new_bytes < 200_000,
        "the late writer deduplicated: {st:?}"
    );

    // Phase two: the packs it used are pardoned, the others deleted.
    let r2 = a.gc(Duration::ZERO, 0.5).unwrap();
    assert!(r2.packs_pardoned >= 1 && r2.packs_deleted >= 1, "{r2:?}");
    let c = open(&gw, &l, &t.path().join("c"), false).unwrap();
    assert_eq!(read_all(&c, &keep_oid), keep);
    assert_eq!(read_all(&c, &half_oid), &gone[..1_000_000]);
    // The late server reads through its stale index too (a vanished pack: it looks again).
    assert_eq!(read_all(&late, &keep_oid), keep);
    assert_eq!(read_all(&late, &half_oid), &gone[..1_000_000]);

    // With everything of it removed, two runs leave only what `keep` needs.
    assert!(c.remove_object(&half_oid).unwrap());
    a.gc(Duration::ZERO, 0.5).unwrap();
    let r = a.gc(Duration::ZERO, 0.5).unwrap();
    assert!(r.packs_deleted >= 1, "{r:?}");
    let d = open(&gw, &l, &t.path().join("d"), false).unwrap();
    assert_eq!(read_all(&d, &keep_oid), keep);
    let st = d.stats().unwrap();
    assert!(st.chunk_bytes <= keep.len() as u64 + 300_000, "{st:?}");
    let v = d.verify(|_| {}).unwrap();
    assert!(v.damaged.is_empty() && v.missing.is_empty(), "{v:?}");

    // One gc at a time (where the server honours conditional writes).
    if !a.conditional_writes().unwrap() {
        eprintln!("NOTE: this server ignores If-None-Match on PUT: the gc lock is advisory");
        return;
    }
    let client = ferry_s3::Client::new(&gw.resolved(), "gcb", Default::default()).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let lock = gw.key("x/gc/lock");
    let held = format!("{now}\nsomeone else\n");
    client
        .put(&lock, held.as_bytes(), ferry_s3::Cond::None)
        .unwrap();
    let e = a.gc(Duration::ZERO, 0.5).unwrap_err().to_string();
    assert!(e.contains("another gc holds"), "{e}");
    // A lock left by a gc that died hours ago is taken over.
    let old = format!("{}\na gc that died\n", now - 7 * 3600);
    client
        .put(&lock, old.as_bytes(), ferry_s3::Cond::None)
        .unwrap();
    a.gc(Duration::ZERO, 0.5).unwrap();
    assert!(client.get(&lock, None).unwrap().is_none(), "released");
}

#[test]
fn gc_repacks_sparse_packs() {
    use std::time::Duration;
    let t = tempfile::tempdir().unwrap();
    let Some(gw) = S3Server::for_test(&t.path().join("s3")) else {
        return;
    };
    let l = loc(&gw, "s3://gcb/sparse");
    let spec = ChunkerSpec::default();
    let a = open(&gw, &l, &t.path().join("a"), true).unwrap();
    // One object's chunks, then another's, in the same packs (one flush for both).
    let (k, m) = (bytes(20, 700_000), bytes(21, 700_000));
    let mut oids = vec![];
    for d in [&k, &m] {
        let (recipe, oid) = ferry_format::chunk_object::<_, StoreError, _>(
            &d[..],
            &spec,
            a.hash_alg(),
            |c, data| {
                a.put(&ferry_store::VerifiedChunk::assume_verified(c.id, data))
                    .map(|_| ())
            },
        )
        .unwrap();
        a.put_object(&oid, &recipe).unwrap();
        oids.push(oid);
    }
    a.flush().unwrap();
    assert!(a.remove_object(&oids[1]).unwrap());
    let r = a.gc(Duration::ZERO, 1.0).unwrap();
    assert!(r.packs_repacked >= 1 && r.chunks_moved >= 1, "{r:?}");
    let r = a.gc(Duration::ZERO, 1.0).unwrap();
    assert!(r.packs_deleted >= 1, "{r:?}");
    let b = open(&gw, &l, &t.path().join("b"), false).unwrap();
    assert_eq!(read_all(&b, &oids[0]), k);
    assert!(b.stats().unwrap().chunk_bytes < 900_000);
}

/// A corruption campaign on the bucket: random bit flips, zeroed 4 KiB sectors and truncations
/// of random packs, each followed by reads through a store with a fresh cache. Never wrong
/// bytes with success; every damaged chunk is named; what the damage did not touch stays
/// readable.
#[test]
fn corrupted_packs_are_never_read_as_good() {
    let t = tempfile::tempdir().unwrap();
    let Some(gw) = S3Server::for_test(&t.path().join("s3")) else {
        return;
    };
    let l = loc(&gw, "s3://campaign/x");
    let spec = ChunkerSpec::default();
    let a = open(&gw, &l, &t.path().join("a"), true).unwrap();
    let objects: Vec<(ferry_format::Oid, Vec<u8>)> = (0..4)
        .map(|i| {
            let d = bytes(100 + i, 300_000);
            let (oid, _, _) = store_object(&a, &d[..], &spec, |_| {}).unwrap();
            (oid, d)
        })
        .collect();
    drop(a);
    let client = ferry_s3::Client::new(&gw.resolved(), "campaign", Default::default()).unwrap();
    let packs = client.list(&gw.key("x/packs/")).unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n.max(1)
    };
    let rounds = if std::env::var_os("FERRY_LONG").is_some() {
        2000
    } else {
        60
    };
    let (mut detected, mut intact) = (0, 0);
    for round in 0..rounds {
        let p = &packs[next(packs.len() as u64) as usize];
        let good = client.get(&p.key, None).unwrap().unwrap();
        let mut bad = good.clone();
        match round % 3 {
            0 => {
                let i = next(bad.len() as u64) as usize;
                bad[i] ^= 1 << next(8);
            }
            1 => {
                let s = next(bad.len() as u64 / 4096 + 1) as usize * 4096;
                let e = (s + 4096).min(bad.len());
                bad[s.min(e)..e].iter_mut().for_each(|b| *b = 0);
            }
            _ => bad.truncate(next(bad.len() as u64) as usize),
        }
        client.put(&p.key, &bad, ferry_s3::Cond::None).unwrap();
        let s = open(&gw, &l, &t.path().join(format!("r{round}")), false).unwrap();
        let mut refused = false;
        for (oid, data) in &objects {
            let mut out = vec![];
            match read_object(&s, oid, &mut out) {
                Ok(Some(n)) => {
                    assert_eq!(n, data.len() as u64);
                    assert_eq!(&out, data, "wrong bytes read as good (round {round})");
                    intact += 1;
                }
                Ok(None) => panic!("object {oid} vanished (round {round})"),
                Err(_) => {
                    detected += 1;
                    refused = true;
                }
            }
        }
        // What a read refused, verify names: a damaged chunk, or one an object misses.
        let v = s.verify(|_| {}).unwrap();
        assert_eq!(
            refused,
            !(v.damaged.is_empty() && v.missing.is_empty()),
            "round {round}: {v:?}"
        );
        drop(s);
        client.put(&p.key, &good, ferry_s3::Cond::None).unwrap();
        let _ = std::fs::remove_dir_all(t.path().join(format!("r{round}")));
    }
    eprintln!("{rounds} corruptions: {detected} reads refused, {intact} intact objects read right");
    assert!(detected > 0 && intact > 0);
}
