//! A real S3 server for tests and the lab: versitygw (a Go gateway; `go install
//! github.com/versity/versitygw/cmd/versitygw@v1.8.0`) on a free loopback port, its posix
//! backend in a directory of the caller's, stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::Resolved;

pub const ACCESS: &str = "ferrytest";
pub const SECRET: &str = "ferrytest-secret";

pub struct Versitygw {
    child: Child,
    pub endpoint: String,
    pub port: u16,
}

impl Drop for Versitygw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

impl Versitygw {
    /// Starts one serving `dir` on `port` (0: a free one).
    pub fn start(dir: &Path, port: u16) -> std::io::Result<Versitygw> {
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
        let mut v = Versitygw {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline || v.child.try_wait()?.is_some() {
                return Err(std::io::Error::other(format!(
                    "versitygw did not listen on {port}"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(v)
    }

    /// For tests: a server, or `None` (with a note on standard error) when versitygw is not
    /// installed, unless `FERRY_REQUIRE_S3` is set (CI sets it), which makes that a failure.
    pub fn for_test(dir: &Path) -> Option<Versitygw> {
        if find().is_none() && std::env::var_os("FERRY_REQUIRE_S3").is_none() {
            eprintln!(
                "SKIPPED: versitygw is not installed (go install \
                 github.com/versity/versitygw/cmd/versitygw@v1.8.0; CI installs it)"
            );
            return None;
        }
        Some(Versitygw::start(dir, 0).expect("start versitygw"))
    }

    /// Endpoint and credentials.
    pub fn resolved(&self) -> Resolved {
        Resolved {
            endpoint: self.endpoint.clone(),
            path_style: true,
            region: "us-east-1".into(),
            access_key: ACCESS.into(),
            secret_key: SECRET.into(),
            token: None,
        }
    }
}
