//! The daemon's accept path under clients that are not let in, or stall.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto::Request;
use tokio::io::AsyncReadExt;

use super::*;

struct Setup {
    _dir: tempfile::TempDir,
    port: u16,
    known: PathBuf,
    allowed: Identity,
    stranger: Identity,
}

/// A daemon on a thread of its own serving an empty export, one session at a time, hanging
/// up on a client that has not said Hello after `hello`.
fn daemon(hello: Duration) -> Setup {
    daemon_with(hello, HANDSHAKE_TIMEOUT)
}

/// Likewise, dropping connections whose TLS handshake is not done after `handshake`.
fn daemon_with(hello: Duration, handshake: Duration) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = Identity::load_or_create(&dir.path().join("server")).unwrap();
    let (allowed, _) = Identity::load_or_create(&dir.path().join("allowed")).unwrap();
    let (stranger, _) = Identity::load_or_create(&dir.path().join("stranger")).unwrap();
    let keys = dir.path().join("authorized_keys");
    std::fs::write(&keys, format!("{} allowed\n", allowed.fingerprint())).unwrap();
    let export = dir.path().join("export");
    std::fs::create_dir(&export).unwrap();
    // A deep accept queue: a thousand connections at once on a busy machine must wait there
    // for the daemon, not be dropped half open by the kernel (which the client never hears).
    let listener = {
        use rustix::net::{AddressFamily, SocketType};
        let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
        let addr = std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 0);
        rustix::net::bind(&fd, &addr).unwrap();
        rustix::net::listen(&fd, 4096).unwrap();
        TcpListener::from(fd)
    };
    let port = listener.local_addr().unwrap().port();
    let handler: Handler = Arc::new(move |_peer, stream, hello| {
        let opts = ferry_fs::ServerOptions {
            hello_timeout: Some(hello),
            ..Default::default()
        };
        let staging = Arc::new(ferry_store::MemStore::new(ferry_format::HashAlg::Blake3));
        let mut s = ferry_fs::Server::new(ferry_fs::Export::open(&export).unwrap(), opts, staging);
        let input = stream.try_clone().unwrap();
        let _ = ferry_fs::serve(&mut s, input, stream);
    });
    let d = Daemon {
        listener,
        identity: server,
        authorized_keys: keys,
        max_sessions: 1,
        guests: 0,
        hello_timeout: hello,
        handshake_timeout: handshake,
    };
    std::thread::spawn(move || d.run(handler));
    Setup {
        known: dir.path().join("known_hosts"),
        _dir: dir,
        port,
        allowed,
        stranger,
    }
}

impl Setup {
    fn endpoint(&self) -> Endpoint {
        Endpoint::parse(&format!("ferry://127.0.0.1:{}/", self.port))
            .unwrap()
            .unwrap()
    }

    /// A session as `who`, and one request through it.
    fn ask(&self, who: &Identity) -> Result<(), String> {
        let mut s =
            connect(&self.endpoint(), who, &self.known, |_| {}).map_err(|e| e.to_string())?;
        let r = s.conn.call(Request::GetAttr { path: "".into() });
        let _ = s.close();
        r.map(drop).map_err(|e| e.to_string())
    }

    /// A TLS connection as `who` that says nothing: (the runtime, the stream).
    fn stall(
        &self,
        who: &Identity,
    ) -> (
        tokio::runtime::Runtime,
        tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    ) {
        let (cfg, _) = tls::client_config(who, None).unwrap();
        let rt = runtime().unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1".to_string()).unwrap();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
        let port = self.port;
        let tls = rt.block_on(async move {
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap();
            connector.connect(name, tcp).await.unwrap()
        });
        (rt, tls)
    }
}

#[test]
fn strangers_take_no_session_slots_and_a_silent_client_is_dropped() {
    let d = daemon(Duration::from_millis(300));
    // Trust the server's key once.
    d.ask(&d.allowed).unwrap();
    // Strangers that finished their handshakes and say nothing hold no slot (there is one).
    let strangers: Vec<_> = (0..20).map(|_| d.stall(&d.stranger)).collect();
    d.ask(&d.allowed).unwrap();
    // A stranger that speaks is told why, without the path of the server's files.
    let e = d.ask(&d.stranger).unwrap_err();
    assert!(e.contains("is not authorized"), "{e}");
    assert!(!e.contains("authorized_keys"), "{e}");
    // An authorized client that says nothing holds the slot until its Hello is due, then it
    // is hung up on and the slot is free again.
    let (rt, mut silent) = d.stall(&d.allowed);
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(e) = d.ask(&d.allowed) {
        assert!(e.contains("busy"), "{e}");
        assert!(Instant::now() < deadline, "the silent client kept its slot");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut buf = [0u8; 16];
    let read = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), silent.read(&mut buf)).await
    });
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the silent client is hung up on"
    );
    drop(strangers);
}

/// Threads, descriptors and resident bytes of this process.
fn usage() -> (usize, usize, u64) {
    let count = |d: &str| std::fs::read_dir(d).map(|r| r.count()).unwrap_or(0);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    (
        count("/proc/self/task"),
        count("/proc/self/fd"),
        rss_kb << 10,
    )
}

/// What each hostile connection does.
#[derive(Clone, Copy)]
enum Hostile {
    /// Not TLS at all: 64 KiB of garbage.
    Garbage,
    /// Connects and says nothing, not even a TLS hello.
    Mute,
    /// Finishes the handshake as a stranger and says nothing.
    Silent,
    /// Finishes the handshake as a stranger and starts a 4 MiB frame it never finishes.
    Partial,
}

/// One hostile connection: opens, misbehaves as `kind` says, and waits to be hung up on.
async fn hostile(
    port: u16,
    kind: Hostile,
    connector: tokio_rustls::TlsConnector,
    opened: Arc<std::sync::atomic::AtomicUsize>,
    dropped: Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::Ordering;
    use tokio::io::AsyncWriteExt;
    let mut buf = vec![0u8; 4096];
    let Ok(mut tcp) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        panic!("cannot connect");
    };
    match kind {
        Hostile::Garbage | Hostile::Mute => {
            if let Hostile::Garbage = kind {
                let _ = tcp.write_all(&[0x55; 64 << 10]).await;
            }
            opened.fetch_add(1, Ordering::SeqCst);
            while let Ok(1..) = tcp.read(&mut buf).await {}
        }
        Hostile::Silent | Hostile::Partial => {
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            match connector.connect(name, tcp).await {
                Ok(mut tls) => {
                    if let Hostile::Partial = kind {
                        // A frame header that claims 4 MiB, and 1 MiB of it.
                        let mut head = vec![0u8; ferry_proto::FRAME_HEADER_LEN];
                        head[..4].copy_from_slice(&(4u32 << 20).to_le_bytes());
                        let _ = tls.write_all(&head).await;
                        let _ = tls.write_all(&vec![7u8; 1 << 20]).await;
                    }
                    opened.fetch_add(1, Ordering::SeqCst);
                    while let Ok(1..) = tls.read(&mut buf).await {}
                }
                Err(_) => {
                    opened.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }
    dropped.fetch_add(1, Ordering::SeqCst);
}

/// 1,000 hostile connections at once (garbage, mute, silent strangers, strangers stalled in a
/// 4 MiB frame) while an authorized client keeps working: no thread per connection, memory
/// bounded, and every one of them hung up on by the daemon within its timeouts.
#[test]
fn a_thousand_hostile_connections_leave_authorized_clients_working() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const N: usize = 1000;
    let d = daemon_with(Duration::from_secs(2), Duration::from_secs(2));
    d.ask(&d.allowed).unwrap();
    let before = usage();
    let (stranger, _) = tls::client_config(&d.stranger, None).unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(stranger));
    let opened = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicUsize::new(0));
    let port = d.port;
    // The hostile side: one thread, one runtime, every connection a task.
    let hostile = {
        let (opened, dropped) = (opened.clone(), dropped.clone());
        std::thread::spawn(move || {
            runtime().unwrap().block_on(async move {
                let tasks: Vec<_> = (0..N)
                    .map(|i| {
                        let kind = [
                            Hostile::Garbage,
                            Hostile::Mute,
                            Hostile::Silent,
                            Hostile::Partial,
                        ][i % 4];
                        let (c, o, d) = (connector.clone(), opened.clone(), dropped.clone());
                        tokio::spawn(hostile(port, kind, c, o, d))
                    })
                    .collect();
                for t in tasks {
                    let _ = t.await;
                }
            })
        })
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    while opened.load(Ordering::SeqCst) < N {
        assert!(
            Instant::now() < deadline,
            "the hostile connections did not all open"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let held = usage();
    // The authorized client works while they are held (one session slot, and it is free).
    for _ in 0..5 {
        d.ask(&d.allowed).unwrap();
    }
    // Bounds: threads do not grow with connections (the daemon's runtime and one thread per
    // session: here one); memory stays under 256 KiB a connection, all sides of it counted.
    let threads = held.0.saturating_sub(before.0);
    assert!(threads < 64, "{threads} more threads for {N} connections");
    let rss = held.2.saturating_sub(before.2);
    assert!(
        rss < (N as u64) << 18,
        "{} MiB more for {N} connections",
        rss >> 20
    );
    eprintln!(
        "{N} hostile connections held: +{threads} threads, +{} descriptors (both ends), +{} MiB",
        held.1.saturating_sub(before.1),
        rss >> 20
    );
    // Every one is hung up on (handshake, refusal and Hello timeouts).
    while dropped.load(Ordering::SeqCst) < N {
        assert!(
            Instant::now() < deadline,
            "{} of {N} hostile connections still held",
            N - dropped.load(Ordering::SeqCst)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    hostile.join().unwrap();
    d.ask(&d.allowed).unwrap();
}
