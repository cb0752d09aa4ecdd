//! Every fuzz target's body on the stable toolchain, over generated inputs: random bytes of
//! many lengths, and for the targets that take frames, valid frames with bytes flipped (so
//! that the handlers, not only the decoders, are reached). The short mode of the fuzzing, run
//! in CI; `FERRY_FUZZ_SMOKE=N` sets the inputs per target (2,000 by default). Inputs that
//! once failed are kept in `regressions/TARGET/` and run first.

use ferry_proto::{
    Attr, FileKind, GetChunks, Ids, Message, Reply, Request, Target, WirePath, FEATURES,
};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn runs() -> usize {
    std::env::var("FERRY_FUZZ_SMOKE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000)
}

/// Flips, inserts or removes a few bytes.
fn mutate(rng: &mut Rng, mut v: Vec<u8>) -> Vec<u8> {
    for _ in 0..rng.below(4) {
        match rng.below(3) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len() as u64) as usize;
                v[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(v.len() as u64 + 1) as usize;
                v.insert(i, rng.next() as u8);
            }
            _ if !v.is_empty() => {
                let i = rng.below(v.len() as u64) as usize;
                v.remove(i);
            }
            _ => {}
        }
    }
    v
}

fn run(name: &str, target: fn(&[u8]), structured: impl Fn(&mut Rng) -> Vec<u8>) {
    run_n(name, target, structured, runs())
}

fn run_n(name: &str, target: fn(&[u8]), structured: impl Fn(&mut Rng) -> Vec<u8>, n: usize) {
    // Every input that once failed (fuzz/regressions/NAME/), first.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("regressions")
        .join(name);
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries {
            target(&std::fs::read(e.unwrap().path()).unwrap());
        }
    }
    let mut rng = Rng(0x5eed ^ (name.len() as u64 * 0x9e37_79b9));
    for i in 0..n {
        let input = match i % 3 {
            0 => {
                let len = [0, 1, 4, 16, 64, 300, 4096][i % 7];
                rng.bytes(len)
            }
            _ => {
                let s = structured(&mut rng);
                mutate(&mut rng, s)
            }
        };
        target(&input);
    }
}

fn random(rng: &mut Rng) -> Vec<u8> {
    let n = rng.below(600) as usize;
    rng.bytes(n)
}

fn path(rng: &mut Rng) -> WirePath {
    [
        "a",
        "d",
        "d/b",
        "d/e/c",
        "link",
        "escape",
        "escape/secret",
        "abs",
        "new",
    ][rng.below(9) as usize]
        .into()
}

fn request(rng: &mut Rng) -> Request {
    let p = path(rng);
    match rng.below(11) {
        0 => Request::GetAttr { path: p },
        1 => Request::ReadDir {
            path: p,
            keys: vec![],
        },
        2 => Request::ReadFiles {
            files: vec![(p, vec![])],
        },
        3 => Request::ReadRange {
            target: Target::Path(p),
            offset: rng.below(6000),
            len: 4096,
        },
        4 => Request::GetRecipe {
            target: Target::Path(p),
            short: rng.below(2) == 0,
            known: vec![],
        },
        5 => Request::Mkdir {
            path: p,
            mode: 0o755,
        },
        6 => Request::Rename {
            from: p,
            to: path(rng),
        },
        7 => Request::Unlink { path: p },
        8 => Request::Create {
            handle: rng.below(3) as u32,
            path: p,
            base: None,
        },
        9 => Request::Link {
            from: p,
            to: path(rng),
        },
        _ => Request::GetChunks(GetChunks {
            ids: Ids::Short(vec![rng.next(), rng.next()]),
            at: None,
            against: None,
        }),
    }
}

/// Frames as the `server` target reads them: type, flags, 16-bit length, body.
fn server_input(rng: &mut Rng) -> Vec<u8> {
    let mut out = vec![];
    for _ in 0..1 + rng.below(6) {
        let f = Message::Request(request(rng)).to_frame(1);
        out.push(f.msg_type);
        out.push(f.flags);
        out.extend((f.body.len() as u16).to_le_bytes());
        out.extend(&f.body);
    }
    out
}

/// Frames as the `client` target reads them: an operation byte, then type, flags, request id,
/// 16-bit length, body; replies a server might send, to the ids a client would use.
fn client_input(rng: &mut Rng) -> Vec<u8> {
    let mut out = vec![rng.next() as u8];
    for id in 1..2 + rng.below(5) {
        let attr = Attr {
            kind: [FileKind::Dir, FileKind::File, FileKind::Symlink][rng.below(3) as usize],
            mode: 0o644,
            size: rng.below(1 << 20),
            mtime_ns: 0,
            version: rng.below(4),
            oid: None,
            lease_ms: 0,
            extra: None,
        };
        let reply = match rng.below(3) {
            0 => Reply::Attr(attr),
            1 => Reply::Entries {
                present: vec![],
                entries: vec![],
            },
            _ => Reply::Error {
                code: ferry_proto::ErrorCode::NotFound,
                message: "x".into(),
            },
        };
        let f = Message::Reply(reply).to_frame(id as u32);
        out.push(f.msg_type);
        out.push(f.flags);
        out.push(id as u8);
        out.extend((f.body.len() as u16).to_le_bytes());
        out.extend(&f.body);
    }
    out
}

/// Whole encoded frames (the `frames` target's input).
fn frames_input(rng: &mut Rng) -> Vec<u8> {
    let mut out = vec![];
    for _ in 0..1 + rng.below(4) {
        let m = if rng.below(2) == 0 {
            Message::Request(request(rng))
        } else {
            Message::Hello(ferry_proto::Hello {
                version: 1,
                features: FEATURES,
                agent: "x".into(),
            })
        };
        out.extend(
            m.to_frame(rng.below(9) as u32)
                .encode(rng.below(2) == 0)
                .unwrap(),
        );
    }
    out
}

#[test]
fn frames() {
    run("frames", ferry_fuzz::frames::run, frames_input);
}
#[test]
fn formats() {
    run("formats", ferry_fuzz::formats::run, random);
}
#[test]
fn stream() {
    run("stream", ferry_fuzz::stream::run, frames_input);
}
#[test]
fn tickets() {
    run("tickets", ferry_fuzz::tickets::run, random);
}
#[test]
fn objects() {
    run("objects", ferry_fuzz::objects::run, random);
}
#[test]
fn s3() {
    run("s3", ferry_fuzz::s3::run, random);
}
#[test]
fn vault() {
    run("vault", ferry_fuzz::vault::run, random);
}
#[test]
fn vault_ring() {
    run("vault_ring", ferry_fuzz::vault_ring::run, random);
}
#[test]
fn server() {
    run("server", ferry_fuzz::server::run, server_input);
}
#[test]
fn client() {
    run("client", ferry_fuzz::client::run, client_input);
}
/// Every input a run of whole operations (each costs round trips to a server): a tenth as many.
#[test]
fn vfs() {
    let ops = |rng: &mut Rng| {
        let n = 5 * (1 + rng.below(32) as usize);
        rng.bytes(n)
    };
    run_n("vfs", ferry_fuzz::vfs::run, ops, runs() / 10);
}
/// Requests on every route, JSON bodies the handlers take (with the target's `@obj` and
/// `@dir` tickets), and raw bytes.
#[test]
fn api() {
    let requests = |rng: &mut Rng| {
        let bodies = [
            r#"{"path":"f","durability":1}"#,
            r#"{"ticket":"@obj","path":"out"}"#,
            r#"{"ticket":"@obj"}"#,
            r#"{"path":"dev","push":true}"#,
            r#"{"path":"dev"}"#,
            r#"{"uri":"ferry://10.0.0.1:9"}"#,
            r#"{"uri":"s3://bucket/prefix"}"#,
            r#"{"base":0,"changes":[{"name":"a","ticket":"@obj"}]}"#,
            r#"{"base":1,"changes":[{"name":"a","ticket":null}]}"#,
            "{}",
        ];
        let sel = [0x10, 0x50, 0x85][rng.below(3) as usize];
        let mut out = vec![rng.next() as u8, rng.next() as u8, sel];
        if sel == 0x85 {
            out.extend(rng.bytes(5));
        }
        let q = rng.below(3) as u8;
        out.push(q * 4);
        out.extend(&b"after=3&end=9"[..(q * 4) as usize]);
        // Mostly JSON.
        out.push([0, 0, 0, 1, 2][rng.below(5) as usize]);
        out.extend(bodies[rng.below(bodies.len() as u64) as usize].as_bytes());
        out
    };
    run_n("api", ferry_fuzz::api::run, requests, runs() / 4);
}
