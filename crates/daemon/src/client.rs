//! The `ferry` commands' side of the local API: one request, one JSON answer, over the Unix
//! socket.

use std::path::{Path, PathBuf};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::api::ApiError;
use crate::jobs::{Event, Job};
use crate::DaemonError;

/// A connection to the daemon's API.
pub struct Client {
    socket: PathBuf,
    rt: tokio::runtime::Runtime,
}

impl Client {
    /// A client of the daemon listening on `socket` (not contacted until the first call).
    pub fn new(socket: &Path) -> Result<Client, DaemonError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| DaemonError::Api(format!("cannot start a runtime: {e}")))?;
        Ok(Client {
            socket: socket.to_path_buf(),
            rt,
        })
    }

    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, DaemonError> {
        self.call("GET", path, None::<&()>)
    }

    pub fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, DaemonError> {
        self.call("POST", path, Some(body))
    }

    /// DELETEs `path` (an answer without a body).
    pub fn delete(&self, path: &str) -> Result<(), DaemonError> {
        self.call_raw("DELETE", path, None::<&()>).map(|_| ())
    }

    fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, DaemonError> {
        let bytes = self.call_raw(method, path, body)?;
        serde_json::from_slice(&bytes)
            .map_err(|e| DaemonError::Api(format!("the daemon's answer is not understood: {e}")))
    }

    fn call_raw<B: Serialize>(
        &self,
        method: &str,
        path: &str,
        body: Option<&B>,
    ) -> Result<Bytes, DaemonError> {
        let body = match body {
            Some(b) => serde_json::to_vec(b).map_err(|e| DaemonError::Api(e.to_string()))?,
            None => vec![],
        };
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "ferry-daemon")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| DaemonError::Api(e.to_string()))?;
        let (status, bytes) = self.rt.block_on(async {
            let (status, body) = self.send(req).await?;
            let bytes = body.collect().await.map_err(api)?.to_bytes();
            Ok::<_, DaemonError>((status, bytes))
        })?;
        if !status.is_success() {
            return Err(error_of(status, &bytes));
        }
        Ok(bytes)
    }
}

impl Client {
    /// POSTs the bytes `src` gives as the body (streamed as they are read, on a thread of
    /// their own) and returns the JSON answer.
    pub fn post_stream<T: DeserializeOwned>(
        &self,
        path: &str,
        mut src: impl std::io::Read + Send + 'static,
    ) -> Result<T, DaemonError> {
        type Item = Result<hyper::body::Frame<Bytes>, std::io::Error>;
        let (tx, rx) = tokio::sync::mpsc::channel::<Item>(16);
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 256 << 10];
            loop {
                let item = match src.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => Ok(hyper::body::Frame::data(Bytes::copy_from_slice(&buf[..n]))),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => Err(e),
                };
                let failed = item.is_err();
                if tx.blocking_send(item).is_err() || failed {
                    return;
                }
            }
        });
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let req = hyper::Request::builder()
            .method("POST")
            .uri(path)
            .header("host", "ferry-daemon")
            .header("content-type", "application/octet-stream")
            .body(http_body_util::StreamBody::new(stream))
            .map_err(|e| DaemonError::Api(e.to_string()))?;
        let r = self.rt.block_on(async {
            let (status, body) = self.send(req).await?;
            let bytes = body.collect().await.map_err(api)?.to_bytes();
            Ok::<_, DaemonError>((status, bytes))
        });
        let _ = reader.join();
        let (status, bytes) = r?;
        if !status.is_success() {
            return Err(error_of(status, &bytes));
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| DaemonError::Api(format!("the daemon's answer is not understood: {e}")))
    }

    /// Follows fetch `id`'s events from after `after` until its end, calling `on_event` with
    /// each; reconnects (from the last event seen) when the stream breaks, as when the daemon
    /// restarts, for as long as `patience` allows without an answer. Returns the job's end.
    pub fn follow(
        &self,
        id: &str,
        mut after: u64,
        patience: std::time::Duration,
        mut on_event: impl FnMut(&Event),
    ) -> Result<Job, DaemonError> {
        let mut last_answer = std::time::Instant::now();
        loop {
            let path = format!("/v1/fetches/{id}/events?after={after}");
            let mut ended = false;
            let r = self.stream(&path, |line| {
                let e: Event = serde_json::from_slice(line)
                    .map_err(|e| DaemonError::Api(format!("an event not understood: {e}")))?;
                after = e.id;
                ended |= e.what.is_end();
                on_event(&e);
                Ok(())
            });
            match r {
                Ok(()) if ended => return self.get(&format!("/v1/fetches/{id}")),
                Ok(()) => last_answer = std::time::Instant::now(),
                Err(DaemonError::Api(why)) if last_answer.elapsed() < patience => {
                    tracing::info!("the daemon's event stream broke ({why}); again");
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// GETs `path` and calls `on_line` with each line of the answer as it comes.
    /// GETs `path` and calls `on_data` with the answer's bytes as they come.
    pub fn get_bytes(
        &self,
        path: &str,
        mut on_data: impl FnMut(&[u8]) -> Result<(), DaemonError>,
    ) -> Result<(), DaemonError> {
        let req = hyper::Request::builder()
            .method("GET")
            .uri(path)
            .header("host", "ferry-daemon")
            .body(Full::new(Bytes::new()))
            .map_err(|e| DaemonError::Api(e.to_string()))?;
        self.rt.block_on(async {
            let (status, mut body) = self.send(req).await?;
            if !status.is_success() {
                let bytes = body.collect().await.map_err(api)?.to_bytes();
                return Err(error_of(status, &bytes));
            }
            while let Some(frame) = body.frame().await {
                if let Some(d) = frame.map_err(api)?.data_ref() {
                    on_data(d)?;
                }
            }
            Ok(())
        })
    }

    /// GETs `path` and calls `on_line` with each line of the answer as it comes.
    fn stream(
        &self,
        path: &str,
        mut on_line: impl FnMut(&[u8]) -> Result<(), DaemonError>,
    ) -> Result<(), DaemonError> {
        let mut buf: Vec<u8> = vec![];
        self.get_bytes(path, |d| {
            buf.extend_from_slice(d);
            while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                if line.len() > 1 {
                    on_line(&line[..line.len() - 1])?;
                }
            }
            if buf.len() > 1 << 20 {
                return Err(DaemonError::Api("an event of over a MiB".into()));
            }
            Ok(())
        })
    }

    async fn send<B>(
        &self,
        req: hyper::Request<B>,
    ) -> Result<(hyper::StatusCode, hyper::body::Incoming), DaemonError>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|e| {
                DaemonError::Api(format!(
                    "no daemon answers on {} ({e}); start one with `ferry daemon`",
                    self.socket.display()
                ))
            })?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(api)?;
        tokio::spawn(conn);
        let res = send.send_request(req).await.map_err(api)?;
        Ok((res.status(), res.into_body()))
    }
}

/// The error an answer that is not a success stands for.
fn error_of(status: hyper::StatusCode, bytes: &[u8]) -> DaemonError {
    let why = serde_json::from_slice::<ApiError>(bytes)
        .map(|e| e.error)
        .unwrap_or_else(|_| format!("{status}: {}", String::from_utf8_lossy(bytes)));
    match status.as_u16() {
        400 => DaemonError::BadRequest(why),
        404 => DaemonError::NotFound(why),
        409 => DaemonError::Conflict(why),
        502 => DaemonError::Unavailable(why),
        _ => DaemonError::Api(why),
    }
}

fn api(e: hyper::Error) -> DaemonError {
    DaemonError::Api(format!("the daemon's API: {e}"))
}
