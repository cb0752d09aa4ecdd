//! The transfer daemon's local API (HTTP/1.1 and JSON on its Unix socket) under arbitrary
//! requests: any method on every route it has, with arbitrary path segments and queries, and a
//! body that is the input's bytes (raw, or JSON when they parse).
//!
//! The daemon runs once per process, in a network namespace of its own (tickets and replicas
//! name arbitrary hosts: nothing may leave the machine), and every `path` a JSON body names is
//! moved beneath its temporary directory (a device is written to, a fetch writes its file).
//! The strings `@obj` and `@dir`, anywhere, become tickets of an object and a directory the
//! daemon holds, so that the handlers are reached past the ticket check.
//!
//! Checks: every request gets a whole HTTP response (a handler that panics drops the
//! connection instead), every error is the API's JSON error (`kind`, `error`), the HTTP
//! layer's own (404, 405, a bad path segment) included, and the daemon still answers
//! `GET /v1/status` afterwards. Needs root (for the namespace); elsewhere it does nothing.
//!
//! The input: method, route, path segment (a selector byte, then up to 31 bytes), query (a
//! length byte, then the bytes), content type, and the rest as the body.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use ferry_daemon::api::ROUTES;

struct Daemon {
    socket: PathBuf,
    /// Where JSON bodies' paths are moved to.
    sandbox: PathBuf,
    object: String,
    dir: String,
    _dir: tempfile::TempDir,
}

static DAEMON: OnceLock<Option<Daemon>> = OnceLock::new();

/// Sends one request; the response's status, headers and body, or which step failed and how
/// (with the time it took, and how many descriptors this process, the daemon's, holds).
/// With `whole` false, only until the headers (an event stream does not end).
fn request(
    socket: &Path,
    head: &str,
    body: &[u8],
    whole: bool,
) -> Result<(u16, String, Vec<u8>), String> {
    let began = std::time::Instant::now();
    let failed = |step: &str, e: &dyn std::fmt::Display| {
        let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
        format!(
            "{step} failed after {:.1} s: {e} ({fds} descriptors open)",
            began.elapsed().as_secs_f64()
        )
    };
    let mut s = UnixStream::connect(socket).map_err(|e| failed("connect", &e))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| failed("set_read_timeout", &e))?;
    s.write_all(head.as_bytes())
        .map_err(|e| failed("writing the head", &e))?;
    // The daemon may answer (and close) before it read the whole body.
    let _ = s.write_all(body);
    let mut out = vec![];
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            // libFuzzer's SIGALRM (its timeout timer) interrupts a read: not the daemon's doing.
            // (Both long runs that ended at "no whole response" were this: EINTR after 0.1 s.)
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) if !out.is_empty() => break,
            Err(e) => return Err(failed("reading", &e)),
        }
        if !whole && out.windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let shown = || String::from_utf8_lossy(&out[..out.len().min(200)]).into_owned();
    let end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| failed("finding the head's end", &format!("{:?}", shown())))?;
    let head = String::from_utf8(out[..end].to_vec()).map_err(|e| failed("the head", &e))?;
    let status: Option<u16> = head
        .strip_prefix("HTTP/1.1 ")
        .and_then(|h| h.get(..3))
        .and_then(|c| c.parse().ok());
    let status = status.ok_or_else(|| failed("the status line", &head))?;
    Ok((status, head, out[end + 4..].to_vec()))
}

fn head(method: &str, path: &str, content_type: Option<&str>, len: usize) -> String {
    let ct = content_type.map_or(String::new(), |c| format!("Content-Type: {c}\r\n"));
    format!(
        "{method} {path} HTTP/1.1\r\nHost: fuzz\r\n{ct}Content-Length: {len}\r\nConnection: close\r\n\r\n"
    )
}

/// A JSON POST that must succeed (setting up): the value of `field` in its answer.
fn made(socket: &Path, path: &str, body: &str, field: &str) -> String {
    let (status, _, reply) = request(
        socket,
        &head("POST", path, Some("application/json"), body.len()),
        body.as_bytes(),
        true,
    )
    .unwrap_or_else(|e| panic!("{path}: {e}"));
    assert!(
        status < 300,
        "{path}: {status} {}",
        String::from_utf8_lossy(&reply)
    );
    let v: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    v[field].as_str().unwrap().to_string()
}

fn start() -> Option<Daemon> {
    if !rustix::process::getuid().is_root() {
        eprintln!("skipped: the api target needs root (a network namespace of its own)");
        return None;
    }
    // As in `ferry` itself (Rust's runtime does it before main; libFuzzer's main does not): a
    // write to a peer that hung up is an EPIPE error, not a signal that kills the process
    // before libFuzzer can keep the input.
    // SAFETY: setting a signal's disposition to ignore, before any thread of ours starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    // This thread and every thread it starts from now on (the daemon's) see no network.
    #[allow(deprecated)]
    rustix::thread::unshare(rustix::thread::UnshareFlags::NEWNET).expect("unshare");
    let dir = tempfile::tempdir().unwrap();
    let sandbox = dir.path().join("sandbox");
    std::fs::create_dir(&sandbox).unwrap();
    let cfg = ferry_daemon::Config {
        paths: ferry_daemon::Paths::under(&dir.path().join("daemon")),
        listen: None,
        advertise: None,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = ferry_daemon::run(cfg, |s| tx.send(s.socket.clone()).unwrap());
        panic!("the daemon stopped: {r:?}");
    });
    let socket = rx.recv_timeout(Duration::from_secs(120)).expect("ready");
    let file = sandbox.join("seed");
    std::fs::write(&file, b"an object the fuzzer may name").unwrap();
    let object = made(
        &socket,
        "/v1/objects",
        &serde_json::json!({ "path": file, "durability": 1 }).to_string(),
        "ticket",
    );
    let dir_ticket = made(&socket, "/v1/dirs", "{}", "ticket");
    Some(Daemon {
        socket,
        sandbox,
        object,
        dir: dir_ticket,
        _dir: dir,
    })
}

/// `s` as one path segment or query: unreserved bytes as they are, the rest percent-encoded
/// (`keep` bytes too, as `=` and `&` in a query).
fn escape(s: &[u8], keep: &[u8]) -> String {
    let mut out = String::new();
    for &b in s {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || keep.contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Every `path` beneath the sandbox, and `@obj` / `@dir` as tickets.
fn tame(v: &mut serde_json::Value, d: &Daemon) {
    use serde_json::Value;
    match v {
        Value::String(s) if s == "@obj" => *s = d.object.clone(),
        Value::String(s) if s == "@dir" => *s = d.dir.clone(),
        Value::Array(a) => a.iter_mut().for_each(|x| tame(x, d)),
        Value::Object(o) => {
            for (k, x) in o.iter_mut() {
                match x {
                    Value::String(s) if k == "path" => {
                        let name: String = s
                            .chars()
                            .filter(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '_')
                            .take(32)
                            .collect();
                        let name = if name.is_empty() || name.chars().all(|c| c == '.') {
                            "x".to_string()
                        } else {
                            name
                        };
                        *s = d.sandbox.join(name).to_string_lossy().into_owned();
                    }
                    _ => tame(x, d),
                }
            }
        }
        _ => {}
    }
}

/// One input (see the module's documentation).
pub fn run(data: &[u8]) {
    let Some(d) = DAEMON.get_or_init(start) else {
        return;
    };
    let [m, r, sel, rest @ ..] = data else {
        return;
    };
    let (route_method, template) = ROUTES[*r as usize % ROUTES.len()];
    let own = route_method.to_uppercase();
    let method = match m % 5 {
        0 => "GET",
        1 => "POST",
        2 => "DELETE",
        3 => "PUT",
        _ => &own,
    };
    let (segment, rest) = match sel {
        0..0x40 => (d.object.clone(), rest),
        0x40..0x80 => (d.dir.clone(), rest),
        _ => {
            let n = (*sel as usize & 0x1f).min(rest.len());
            (escape(&rest[..n], b""), &rest[n..])
        }
    };
    let path = template
        .replace("{ticket}", &segment)
        .replace("{id}", &segment);
    let (query, rest) = match rest {
        [q, rest @ ..] => {
            let n = (*q as usize % 32).min(rest.len());
            (escape(&rest[..n], b"=&"), &rest[n..])
        }
        [] => (String::new(), rest),
    };
    let path = if query.is_empty() {
        path
    } else {
        format!("{path}?{query}")
    };
    let (ct, body) = match rest {
        [c, body @ ..] => (c % 3, body),
        [] => (2, rest),
    };
    let mut body = body.to_vec();
    let content_type = match ct {
        0 => {
            if let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&body) {
                tame(&mut v, d);
                body = serde_json::to_vec(&v).unwrap();
            }
            Some("application/json")
        }
        1 => Some("application/octet-stream"),
        _ => None,
    };
    // Objects made of raw bodies stay small (the store lives as long as the process).
    body.truncate(256);
    let events = template.ends_with("/events");
    let what = format!("{method} {path} ({} bytes)", body.len());
    let (status, _, reply) = request(
        &d.socket,
        &head(method, &path, content_type, body.len()),
        &body,
        !events,
    )
    .unwrap_or_else(|e| panic!("{what}: no whole response: {e}"));
    if status >= 400 && !events {
        let v: serde_json::Value = serde_json::from_slice(&reply)
            .unwrap_or_else(|e| panic!("{what}: {status} with a body that is not JSON: {e}"));
        assert!(
            v["error"].is_string() && v["kind"].is_string(),
            "{what}: {status} {v}"
        );
    }
    let alive = request(&d.socket, &head("GET", "/v1/status", None, 0), b"", true);
    match alive {
        Ok((200, _, _)) => {}
        Ok((s, _, _)) => panic!("{what}: then the status is {s}"),
        Err(e) => panic!("{what}: then the daemon no longer answers: {e}"),
    }
}
