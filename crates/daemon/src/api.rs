//! The local API: HTTP/1.1 with JSON on a Unix socket, as `docs/daemon-api.json` describes it:
//! its types, handlers and routes. (`serve` runs it, and the peer side beside it.)

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ferry_format::Oid;
use serde::{Deserialize, Serialize};

use crate::devices::{self, Device, Devices, Pushed};
use crate::jobs::{Job, Jobs, Runner};
use crate::shelf::{Put, Shelf};
use crate::ticket::{Hint, Ticket};
use crate::DaemonError;

/// Every route: (method, path as in the OpenAPI document). The test of the document checks
/// that it lists exactly these.
pub const ROUTES: &[(&str, &str)] = &[
    ("get", "/v1/status"),
    ("post", "/v1/objects"),
    ("get", "/v1/objects/{oid}"),
    ("get", "/v1/objects/{oid}/data"),
    ("post", "/v1/fetches"),
    ("get", "/v1/fetches/{id}"),
    ("get", "/v1/fetches/{id}/events"),
    ("get", "/v1/devices"),
    ("post", "/v1/devices"),
    ("post", "/v1/devices/remove"),
];

/// `GET /v1/status`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub pid: u32,
    pub socket: PathBuf,
    pub data: PathBuf,
    /// The daemon's key (peers pin it through the tickets' hints).
    pub key: String,
    /// Where the peer side listens, if it does.
    pub listen: Option<String>,
    /// The hints every ticket this daemon makes carries.
    pub hints: Vec<Hint>,
}

/// `POST /v1/objects`: put the file at `path` (absolute).
#[derive(Debug, Serialize, Deserialize)]
pub struct PutRequest {
    pub path: PathBuf,
}

/// Its answer: the object, and the ticket to pass along.
#[derive(Debug, Serialize, Deserialize)]
pub struct PutReply {
    pub oid: String,
    pub size: u64,
    pub chunks: u64,
    pub new_chunks: u64,
    pub new_bytes: u64,
    pub ticket: String,
    /// What was copied to each device registered for pushing.
    pub pushed: Vec<Pushed>,
}

/// `POST /v1/devices/remove`.
#[derive(Debug, Serialize, Deserialize)]
pub struct RemoveDevice {
    pub path: PathBuf,
}

/// `POST /v1/fetches`: fetch the object of `ticket`, and install it at `path` (absolute) if
/// given.
#[derive(Debug, Serialize, Deserialize)]
pub struct FetchRequest {
    pub ticket: String,
    pub path: Option<PathBuf>,
}

/// `GET /v1/objects/{oid}`: an object the daemon holds whole.
#[derive(Debug, Serialize, Deserialize)]
pub struct ObjectInfo {
    pub oid: String,
    pub size: u64,
    pub chunks: u64,
}

/// An error, as every route answers one.
#[derive(Debug, Serialize, Deserialize)]
pub struct ApiError {
    /// `bad_request`, `not_found`, `unavailable`, `bad_peer` or `internal`.
    pub kind: String,
    pub error: String,
}

/// What the handlers share.
pub(crate) struct Daemon {
    pub(crate) shelf: Arc<Shelf>,
    pub(crate) devices: Arc<Devices>,
    pub(crate) jobs: Arc<Jobs>,
    pub(crate) runner: Runner,
    pub(crate) status: Status,
}

/// `GET /v1/fetches/{id}/events?after=N`.
#[derive(Debug, Deserialize)]
pub struct After {
    #[serde(default)]
    pub after: u64,
}

type Shared = State<Arc<Daemon>>;

impl IntoResponse for DaemonError {
    fn into_response(self) -> Response {
        let (code, kind) = match &self {
            DaemonError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            DaemonError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            DaemonError::Unavailable(_) | DaemonError::Net(_) => {
                (StatusCode::BAD_GATEWAY, "unavailable")
            }
            DaemonError::BadPeer(_) => (StatusCode::BAD_GATEWAY, "bad_peer"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        let body = ApiError {
            kind: kind.into(),
            error: self.to_string(),
        };
        (code, Json(body)).into_response()
    }
}

fn absolute(p: &Path) -> Result<(), DaemonError> {
    if p.is_absolute() {
        Ok(())
    } else {
        Err(DaemonError::BadRequest(format!(
            "{} is not an absolute path (the daemon does not share the caller's directory)",
            p.display()
        )))
    }
}

/// Puts an object from `src` and copies it to the devices registered for pushing.
fn put_object(
    d: &Daemon,
    src: impl std::io::Read + Send,
) -> Result<(Put, Vec<Pushed>), DaemonError> {
    let put = d.shelf.put(src)?;
    let mut pushed = vec![];
    let push: Vec<_> = d.devices.list().into_iter().filter(|x| x.push).collect();
    if !push.is_empty() {
        let recipe = d.shelf.whole(&put.oid)?.ok_or_else(|| {
            DaemonError::Damaged(format!("{} is not whole after its put", put.oid))
        })?;
        for dev in push {
            pushed.push(devices::push(
                &dev.path,
                &**d.shelf.store(),
                &put.oid,
                &recipe,
            ));
        }
    }
    Ok((put, pushed))
}

/// A request's JSON body, or a 400 saying what is wrong with it.
fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, DaemonError> {
    b.map(|Json(t)| t)
        .map_err(|e| DaemonError::BadRequest(format!("the request's body: {}", e.body_text())))
}

/// Runs blocking work off the API's thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DaemonError> + Send + 'static,
) -> Result<T, DaemonError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(DaemonError::Damaged(format!(
            "a request's work failed: {e}"
        )))
    })
}

async fn status(State(d): Shared) -> Json<Status> {
    Json(d.status.clone())
}

/// The most JSON a request body may hold.
const MAX_JSON: usize = 1 << 20;

/// `POST /v1/objects`: a JSON body names a file (`PutRequest`); any other body is the object's
/// bytes, streamed into the store as they come.
async fn put(
    State(d): Shared,
    headers: axum::http::HeaderMap,
    raw: axum::body::Body,
) -> Result<Response, DaemonError> {
    let json = headers
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    let (put, pushed): (Put, Vec<Pushed>) = if json {
        let bytes = axum::body::to_bytes(raw, MAX_JSON)
            .await
            .map_err(|e| DaemonError::BadRequest(format!("the request's body: {e}")))?;
        let req: PutRequest = serde_json::from_slice(&bytes)
            .map_err(|e| DaemonError::BadRequest(format!("the request's body: {e}")))?;
        absolute(&req.path)?;
        let d = d.clone();
        blocking(move || {
            let f = std::fs::File::open(&req.path).map_err(DaemonError::file("open", &req.path))?;
            if f.metadata().is_ok_and(|m| !m.is_file()) {
                return Err(DaemonError::BadRequest(format!(
                    "{} is not a regular file",
                    req.path.display()
                )));
            }
            put_object(&d, f)
        })
        .await?
    } else {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            use http_body_util::BodyExt;
            let mut raw = raw;
            while let Some(frame) = raw.frame().await {
                let item = match frame {
                    Ok(f) => match f.into_data() {
                        Ok(b) => Ok(b),
                        Err(_) => continue,
                    },
                    Err(e) => Err(e.to_string()),
                };
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    return;
                }
            }
        });
        let d = d.clone();
        blocking(move || put_object(&d, crate::stream::ChannelReader::new(rx))).await?
    };
    let ticket = Ticket {
        oid: put.oid,
        size: put.size,
        cap: d.shelf.cap(&put.oid),
        hints: d.status.hints.clone(),
    };
    let reply = PutReply {
        oid: put.oid.to_string(),
        size: put.size,
        chunks: put.chunks,
        new_chunks: put.new_chunks,
        new_bytes: put.new_bytes,
        ticket: ticket.to_string(),
        pushed,
    };
    Ok((StatusCode::CREATED, Json(reply)).into_response())
}

async fn object(
    State(d): Shared,
    UrlPath(oid): UrlPath<String>,
) -> Result<Json<ObjectInfo>, DaemonError> {
    let oid: Oid = oid
        .parse()
        .map_err(|e| DaemonError::BadRequest(format!("{oid:?} is not an object id: {e}")))?;
    let r = blocking(move || d.shelf.whole(&oid)).await?;
    let r = r.ok_or_else(|| DaemonError::NotFound(format!("no whole object {oid} here")))?;
    Ok(Json(ObjectInfo {
        oid: oid.to_string(),
        size: r.total_len(),
        chunks: r.len() as u64,
    }))
}

/// The bytes of an object held whole, in order, each chunk verified as it is read; the
/// stream breaks off (no clean end) if the whole turns out not to be the object.
async fn data(State(d): Shared, UrlPath(oid): UrlPath<String>) -> Result<Response, DaemonError> {
    let oid: Oid = oid
        .parse()
        .map_err(|e| DaemonError::BadRequest(format!("{oid:?} is not an object id: {e}")))?;
    let shelf = d.shelf.clone();
    let recipe = blocking(move || shelf.whole(&oid))
        .await?
        .ok_or_else(|| DaemonError::NotFound(format!("no whole object {oid} here")))?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<hyper::body::Bytes, std::io::Error>>(8);
    let shelf = d.shelf.clone();
    tokio::task::spawn_blocking(move || {
        let mut whole = ferry_format::IdHasher::new(oid.0.alg());
        for c in recipe.chunks() {
            let item = match ferry_store::ChunkStore::get(&**shelf.store(), &c.id) {
                Ok(Some(b)) => {
                    whole.update(&b);
                    Ok(hyper::body::Bytes::from(b))
                }
                Ok(None) => Err(std::io::Error::other(format!("chunk {} is gone", c.id))),
                Err(e) => Err(std::io::Error::other(e.to_string())),
            };
            let failed = item.is_err();
            if tx.blocking_send(item).is_err() || failed {
                return;
            }
        }
        if whole.finish() != oid.0 {
            let _ = tx.blocking_send(Err(std::io::Error::other("not the object")));
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let mut r = axum::body::Body::from_stream(stream).into_response();
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/octet-stream"),
    );
    Ok(r)
}

async fn fetch(
    State(d): Shared,
    req: Result<Json<FetchRequest>, JsonRejection>,
) -> Result<Response, DaemonError> {
    let req = body(req)?;
    req.ticket
        .parse::<Ticket>()
        .map_err(|e| DaemonError::BadRequest(e.to_string()))?;
    if let Some(p) = &req.path {
        absolute(p)?;
    }
    let job = blocking(move || d.jobs.accept(req.ticket, req.path, d.runner.clone())).await?;
    Ok((StatusCode::ACCEPTED, Json(job)).into_response())
}

async fn job(State(d): Shared, UrlPath(id): UrlPath<String>) -> Result<Json<Job>, DaemonError> {
    d.jobs
        .get(&id)
        .map(Json)
        .ok_or_else(|| DaemonError::NotFound(format!("no fetch {id:?}")))
}

/// The job's events after `after`, one JSON object a line, as they happen, until its end.
async fn events(
    State(d): Shared,
    UrlPath(id): UrlPath<String>,
    axum::extract::Query(q): axum::extract::Query<After>,
) -> Result<Response, DaemonError> {
    if d.jobs.get(&id).is_none() {
        return Err(DaemonError::NotFound(format!("no fetch {id:?}")));
    }
    let stream = futures_util::stream::unfold(Some(q.after), move |after| {
        let (d, id) = (d.clone(), id.clone());
        async move {
            let after = after?;
            let ev = d
                .jobs
                .events(&id, after, EVENT_WAIT)
                .await
                .unwrap_or_default();
            let mut lines = String::new();
            let mut next = Some(after);
            for e in &ev {
                lines.push_str(&serde_json::to_string(e).unwrap_or_default());
                lines.push('\n');
                next = if e.what.is_end() { None } else { Some(e.id) };
            }
            Some((Ok::<_, std::convert::Infallible>(lines), next))
        }
    });
    let mut r = axum::body::Body::from_stream(stream).into_response();
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(r)
}

/// How long an event stream waits for an event before it sends an empty chunk (which tells a
/// dead client apart from a quiet job).
const EVENT_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

async fn devices(State(d): Shared) -> Json<Vec<Device>> {
    Json(d.devices.list())
}

async fn add_device(
    State(d): Shared,
    req: Result<Json<Device>, JsonRejection>,
) -> Result<Response, DaemonError> {
    let dev = body(req)?;
    absolute(&dev.path)?;
    let list = blocking(move || {
        d.devices.add(dev)?;
        Ok(d.devices.list())
    })
    .await?;
    Ok((StatusCode::CREATED, Json(list)).into_response())
}

async fn remove_device(
    State(d): Shared,
    req: Result<Json<RemoveDevice>, JsonRejection>,
) -> Result<Json<Vec<Device>>, DaemonError> {
    let req = body(req)?;
    blocking(move || match d.devices.remove(&req.path)? {
        true => Ok(Json(d.devices.list())),
        false => Err(DaemonError::NotFound(format!(
            "{} is not a registered device",
            req.path.display()
        ))),
    })
    .await
}

pub(crate) fn router(d: Arc<Daemon>) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/objects", post(put))
        .route("/v1/objects/{oid}", get(object))
        .route("/v1/objects/{oid}/data", get(data))
        .route("/v1/fetches", post(fetch))
        .route("/v1/fetches/{id}", get(job))
        .route("/v1/fetches/{id}/events", get(events))
        .route("/v1/devices", get(devices).post(add_device))
        .route("/v1/devices/remove", post(remove_device))
        .with_state(d)
}
