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
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = Identity::load_or_create(&dir.path().join("server")).unwrap();
    let (allowed, _) = Identity::load_or_create(&dir.path().join("allowed")).unwrap();
    let (stranger, _) = Identity::load_or_create(&dir.path().join("stranger")).unwrap();
    let keys = dir.path().join("authorized_keys");
    std::fs::write(&keys, format!("{} allowed\n", allowed.fingerprint())).unwrap();
    let export = dir.path().join("export");
    std::fs::create_dir(&export).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
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
