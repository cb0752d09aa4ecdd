//! The `ferry` commands' side of the local API: one request, one JSON answer, over the Unix
//! socket.

use std::path::{Path, PathBuf};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::api::ApiError;
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

    fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, DaemonError> {
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
            let status = res.status();
            let bytes = res.into_body().collect().await.map_err(api)?.to_bytes();
            Ok::<_, DaemonError>((status, bytes))
        })?;
        if !status.is_success() {
            let why = serde_json::from_slice::<ApiError>(&bytes)
                .map(|e| e.error)
                .unwrap_or_else(|_| format!("{status}: {}", String::from_utf8_lossy(&bytes)));
            return Err(match status.as_u16() {
                400 => DaemonError::BadRequest(why),
                404 => DaemonError::NotFound(why),
                502 => DaemonError::Unavailable(why),
                _ => DaemonError::Api(why),
            });
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| DaemonError::Api(format!("the daemon's answer is not understood: {e}")))
    }
}

fn api(e: hyper::Error) -> DaemonError {
    DaemonError::Api(format!("the daemon's API: {e}"))
}
