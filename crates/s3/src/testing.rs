//! A real S3 server for tests and the lab: versitygw (a Go gateway; `go install
//! github.com/versity/versitygw/cmd/versitygw@v1.8.0`) on a free loopback port, its posix
//! backend in a directory of the caller's, stopped when dropped; or, for tests, any S3 server
//! the environment names (`FERRY_TEST_S3_ENDPOINT`, `FERRY_TEST_S3_ACCESS_KEY`,
//! `FERRY_TEST_S3_SECRET_KEY`, `FERRY_TEST_S3_REGION`), as `scripts/garage-cluster.sh` does
//! for a three-node Garage cluster.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::Resolved;

pub const ACCESS: &str = "ferrytest";
pub const SECRET: &str = "ferrytest-secret";

pub struct S3Server {
    /// The versitygw process started here (none for a server the environment names).
    child: Option<Child>,
    pub endpoint: String,
    pub port: u16,
    pub access: String,
    pub secret: String,
    pub region: String,
    /// Put before every test prefix on a server the environment names, so runs never meet.
    tag: String,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `versitygw` on `PATH`, in `$GOBIN`, or in `~/go/bin`.
pub fn find() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(|h| Path::new(&h).join("go/bin"));
    let gobin = std::env::var_os("GOBIN").map(PathBuf::from);
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(gobin)
        .chain(home)
        .map(|d| d.join("versitygw"))
        .find(|p| p.is_file())
}

impl S3Server {
    /// Starts versitygw serving `dir` on `port` (0: a free one).
    pub fn start(dir: &Path, port: u16) -> std::io::Result<S3Server> {
        let program = find().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "versitygw not found (go install github.com/versity/versitygw/cmd/versitygw@v1.8.0)",
            )
        })?;
        std::fs::create_dir_all(dir)?;
        let port = if port == 0 {
            std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port()
        } else {
            port
        };
        let child = Command::new(program)
            .args(["--access", ACCESS, "--secret", SECRET])
            .args(["--port", &format!("127.0.0.1:{port}"), "posix"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let mut v = S3Server {
            child: Some(child),
            endpoint: format!("http://127.0.0.1:{port}"),
            port,
            access: ACCESS.into(),
            secret: SECRET.into(),
            region: "us-east-1".into(),
            tag: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            let exited = match &mut v.child {
                Some(c) => c.try_wait()?.is_some(),
                None => false,
            };
            if Instant::now() > deadline || exited {
                return Err(std::io::Error::other(format!(
                    "versitygw did not listen on {port}"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(v)
    }

    /// For tests: the server the environment names, else versitygw started here, or `None`
    /// (with a note on standard error) when versitygw is not installed, unless
    /// `FERRY_REQUIRE_S3` is set (CI sets it), which makes that a failure.
    pub fn for_test(dir: &Path) -> Option<S3Server> {
        if let Ok(endpoint) = std::env::var("FERRY_TEST_S3_ENDPOINT") {
            let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
            let port = endpoint
                .rsplit(':')
                .next()
                .and_then(|p| p.trim_end_matches('/').parse().ok())
                .expect("FERRY_TEST_S3_ENDPOINT is http://HOST:PORT");
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            return Some(S3Server {
                child: None,
                endpoint,
                port,
                access: var("FERRY_TEST_S3_ACCESS_KEY"),
                secret: var("FERRY_TEST_S3_SECRET_KEY"),
                region: std::env::var("FERRY_TEST_S3_REGION")
                    .unwrap_or_else(|_| "us-east-1".into()),
                tag: format!("run-{nanos:x}-{}", std::process::id()),
            });
        }
        if find().is_none() && std::env::var_os("FERRY_REQUIRE_S3").is_none() {
            eprintln!(
                "SKIPPED: versitygw is not installed (go install \
                 github.com/versity/versitygw/cmd/versitygw@v1.8.0; CI installs it)"
            );
            return None;
        }
        Some(S3Server::start(dir, 0).expect("start versitygw"))
    }

    /// `s3://BUCKET/PREFIX…` for this server: on one the environment names, the prefix starts
    /// with this run's tag.
    pub fn locator(&self, s: &str) -> String {
        match (self.tag.is_empty(), s.strip_prefix("s3://")) {
            (false, Some(rest)) => {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                format!("s3://{bucket}/{}/{prefix}", self.tag)
            }
            _ => s.to_string(),
        }
    }

    /// The key prefix [`locator`](Self::locator) gives `prefix` in a bucket.
    pub fn key(&self, prefix: &str) -> String {
        match self.tag.is_empty() {
            true => prefix.to_string(),
            false => format!("{}/{prefix}", self.tag),
        }
    }

    /// Endpoint and credentials.
    pub fn resolved(&self) -> Resolved {
        Resolved {
            endpoint: self.endpoint.clone(),
            path_style: true,
            region: self.region.clone(),
            access_key: self.access.clone(),
            secret_key: self.secret.clone(),
            token: None,
        }
    }
}
