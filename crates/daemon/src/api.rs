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
use serde::{Deserialize, Serialize};

use crate::devices::{self, Device, Devices, Pushed};
use crate::jobs::{Job, Jobs, Runner};
use crate::shelf::Shelf;
use crate::ticket::{Hint, Ticket};
use crate::DaemonError;
use std::io::Write;

/// Every route: (method, path as in the OpenAPI document). The test of the document checks
/// that it lists exactly these.
pub const ROUTES: &[(&str, &str)] = &[
    ("get", "/v1/status"),
    ("get", "/v1/store"),
    ("post", "/v1/objects"),
    ("get", "/v1/objects/{ticket}"),
    ("delete", "/v1/objects/{ticket}"),
    ("get", "/v1/objects/{ticket}/data"),
    ("post", "/v1/dirs"),
    ("get", "/v1/dirs/{ticket}"),
    ("post", "/v1/dirs/{ticket}"),
    ("get", "/v1/dirs/{ticket}/history"),
    ("post", "/v1/fetches"),
    ("get", "/v1/fetches/{id}"),
    ("get", "/v1/fetches/{id}/events"),
    ("get", "/v1/devices"),
    ("post", "/v1/devices"),
    ("post", "/v1/devices/remove"),
    ("get", "/v1/replicas"),
    ("post", "/v1/replicas"),
    ("post", "/v1/replicas/remove"),
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
    /// The ticket of the daemon's root directory (`ferry dir` resolves names from it).
    pub root: String,
}

/// `POST /v1/objects`: put the file at `path` (absolute).
#[derive(Debug, Serialize, Deserialize)]
pub struct PutRequest {
    pub path: PathBuf,
    /// Bullet's paranoia factor: 0 answers once the object is in RAM, 1 once it is on disk.
    #[serde(default = "one")]
    pub durability: u8,
}

fn one() -> u8 {
    1
}

/// `?durability=P` of a put from a stream.
#[derive(Debug, Deserialize)]
pub struct PutQuery {
    #[serde(default = "one")]
    pub durability: u8,
}

/// Its answer: the object, and the ticket to pass along.
#[derive(Debug, Serialize, Deserialize)]
pub struct PutReply {
    pub oid: String,
    pub size: u64,
    pub chunks: u64,
    /// The durability met (at least the one asked for).
    pub durability: u8,
    pub rights: String,
    pub ticket: String,
    /// What was copied to each device registered for pushing.
    pub pushed: Vec<Pushed>,
}

/// `GET /v1/dirs/{ticket}?version=N`, and `GET /v1/objects/{ticket}/data?start=A&end=B`.
#[derive(Debug, Deserialize)]
pub struct Range {
    pub start: Option<u64>,
    pub end: Option<u64>,
    pub version: Option<u64>,
}

/// One name of a directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    /// `object` or `directory`.
    pub kind: String,
    pub ticket: String,
}

/// A version of a directory.
#[derive(Debug, Serialize, Deserialize)]
pub struct DirListing {
    pub version: u64,
    pub entries: Vec<DirEntry>,
}

/// `POST /v1/dirs/{ticket}`: changes made against version `base`.
#[derive(Debug, Serialize, Deserialize)]
pub struct DirUpdate {
    pub base: u64,
    pub changes: Vec<DirChange>,
}

/// Bind `name` to `ticket`, or unbind it (`ticket` null).
#[derive(Debug, Serialize, Deserialize)]
pub struct DirChange {
    pub name: String,
    pub ticket: Option<String>,
}

/// The version a change made.
#[derive(Debug, Serialize, Deserialize)]
pub struct DirVersion {
    pub version: u64,
}

/// One version in a directory's history.
#[derive(Debug, Serialize, Deserialize)]
pub struct DirHistory {
    pub version: u64,
    pub entries: u64,
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

/// `GET /v1/objects/{ticket}`: an object of this daemon's (Bullet's SIZE).
#[derive(Debug, Serialize, Deserialize)]
pub struct ObjectInfo {
    pub oid: String,
    pub size: u64,
    /// `object` or `directory`.
    pub kind: String,
    /// 0 while it waits in RAM to be written, then 1.
    pub durability: u8,
    /// The rights of the capability asked with.
    pub rights: String,
}

/// An error, as every route answers one.
#[derive(Debug, Serialize, Deserialize)]
pub struct ApiError {
    /// `bad_request`, `not_found`, `conflict`, `unavailable`, `bad_peer` or `internal`.
    pub kind: String,
    pub error: String,
}

/// What the handlers share.
pub struct Daemon {
    pub(crate) shelf: Arc<Shelf>,
    pub(crate) replicas: Arc<crate::replicas::Replicas>,
    pub(crate) identity: Arc<ferry_net::Identity>,
    pub(crate) known_hosts: PathBuf,
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

pub(crate) type Shared = State<Arc<Daemon>>;

impl IntoResponse for DaemonError {
    fn into_response(self) -> Response {
        let (code, kind) = match &self {
            DaemonError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            DaemonError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            DaemonError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
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

/// Puts an object of `size` bytes from `src` and copies it to the devices registered for
/// pushing.
fn put_object(
    d: &Daemon,
    src: impl std::io::Read + Send,
    size: u64,
    durability: u8,
) -> Result<PutReply, DaemonError> {
    let (made, ticket) = crate::replicas::create(
        &d.shelf,
        &d.replicas,
        &d.identity,
        &d.status.hints,
        src,
        size,
        durability,
    )?;
    let mut pushed = vec![];
    let push: Vec<_> = d.devices.list().into_iter().filter(|x| x.push).collect();
    if !push.is_empty() {
        let (_, recipe) = d.shelf.objects().recipe(&made.cap)?;
        let held = crate::shelf::HeldChunks(d.shelf.objects());
        for dev in push {
            pushed.push(devices::push(&dev.path, &held, &made.oid, &recipe));
        }
    }
    Ok(PutReply {
        oid: made.oid.to_string(),
        size: made.size,
        chunks: made.chunks,
        durability: ticket.durability,
        rights: made.cap.rights().to_string(),
        ticket: ticket.to_string(),
        pushed,
    })
}

/// The ticket in a request's path.
pub(crate) fn ticket_in(t: &str) -> Result<Ticket, DaemonError> {
    t.parse::<Ticket>()
        .map_err(|e| DaemonError::BadRequest(e.to_string()))
}

/// A request's JSON body, or a 400 saying what is wrong with it.
pub(crate) fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, DaemonError> {
    b.map(|Json(t)| t)
        .map_err(|e| DaemonError::BadRequest(format!("the request's body: {}", e.body_text())))
}

/// Runs blocking work off the API's thread.
pub(crate) async fn blocking<T: Send + 'static>(
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

/// `GET /v1/store`: the object store's figures.
#[derive(Debug, Serialize, Deserialize)]
pub struct StoreInfo {
    pub objects: u64,
    pub bytes: u64,
    pub data_files: u32,
    /// Bytes of the data files up to their last object, and of the holes below it.
    pub used: u64,
    pub holes: u64,
    /// Objects created at durability 0 not yet on disk.
    pub pending: u64,
}

async fn store(State(d): Shared) -> Json<StoreInfo> {
    let s = d.shelf.objects().stats();
    Json(StoreInfo {
        objects: s.objects,
        bytes: s.bytes,
        data_files: s.files,
        used: s.used,
        holes: s.holes,
        pending: s.pending,
    })
}

/// The most JSON a request body may hold.
const MAX_JSON: usize = 1 << 20;

/// `POST /v1/objects`: a JSON body names a file (`PutRequest`); any other body is the object's
/// bytes, streamed into the store as they come (spooled first when no length is given).
async fn put(
    State(d): Shared,
    headers: axum::http::HeaderMap,
    axum::extract::Query(q): axum::extract::Query<PutQuery>,
    raw: axum::body::Body,
) -> Result<Response, DaemonError> {
    let json = headers
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    let reply = if json {
        let bytes = axum::body::to_bytes(raw, MAX_JSON)
            .await
            .map_err(|e| DaemonError::BadRequest(format!("the request's body: {e}")))?;
        let req: PutRequest = serde_json::from_slice(&bytes)
            .map_err(|e| DaemonError::BadRequest(format!("the request's body: {e}")))?;
        absolute(&req.path)?;
        let d = d.clone();
        blocking(move || {
            let f = std::fs::File::open(&req.path).map_err(DaemonError::file("open", &req.path))?;
            let meta = f.metadata().map_err(DaemonError::file("stat", &req.path))?;
            if !meta.is_file() {
                return Err(DaemonError::BadRequest(format!(
                    "{} is not a regular file",
                    req.path.display()
                )));
            }
            put_object(&d, f, meta.len(), req.durability)
        })
        .await?
    } else {
        let length = headers
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
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
        blocking(move || {
            let src = crate::stream::ChannelReader::new(rx);
            match length {
                Some(n) => put_object(&d, src, n, q.durability),
                None => {
                    let (spool, n) = spool(&d.status.data, src)?;
                    put_object(&d, spool, n, q.durability)
                }
            }
        })
        .await?
    };
    Ok((StatusCode::CREATED, Json(reply)).into_response())
}

/// A stream of unknown length, written to an unnamed file in the data directory first.
fn spool(dir: &Path, mut src: impl std::io::Read) -> Result<(std::fs::File, u64), DaemonError> {
    use std::io::Seek;
    let mut f = tempfile::tempfile_in(dir).map_err(DaemonError::file("create a file in", dir))?;
    let n = std::io::copy(&mut src, &mut f).map_err(|e| DaemonError::BadRequest(e.to_string()))?;
    f.rewind().map_err(DaemonError::file("read", dir))?;
    Ok((f, n))
}

pub(crate) fn kind_name(k: ferry_objects::Kind) -> &'static str {
    match k {
        ferry_objects::Kind::Blob => "object",
        ferry_objects::Kind::Directory => "directory",
    }
}

/// `GET /v1/objects/{ticket}`: Bullet's SIZE.
async fn object(
    State(d): Shared,
    UrlPath(t): UrlPath<String>,
) -> Result<Json<ObjectInfo>, DaemonError> {
    let t = ticket_in(&t)?;
    let st = blocking(move || Ok(d.shelf.objects().stat(&t.cap)?)).await?;
    Ok(Json(ObjectInfo {
        oid: st.oid.to_string(),
        size: st.size,
        kind: kind_name(st.kind).into(),
        durability: st.durability,
        rights: st.rights.to_string(),
    }))
}

/// `DELETE /v1/objects/{ticket}`: needs the delete right; the copies the ticket's replica
/// hints name go too.
async fn delete(State(d): Shared, UrlPath(t): UrlPath<String>) -> Result<StatusCode, DaemonError> {
    let t = ticket_in(&t)?;
    blocking(move || {
        d.shelf.objects().delete(&t.cap)?;
        let left = crate::replicas::delete_copies(&d.identity, d.replicas.s3(), &t);
        match left.is_empty() {
            true => Ok(()),
            false => Err(DaemonError::Unavailable(format!(
                "deleted here; copies left at replicas: {}",
                left.join("; ")
            ))),
        }
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/replicas` and `/v1/replicas/remove`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ReplicaRequest {
    /// `ferry://HOST[:PORT]`: a daemon that authorizes this one's key; or `s3://BUCKET/PREFIX`:
    /// an S3 store (the daemon's AWS credentials).
    pub uri: String,
}

async fn replicas(State(d): Shared) -> Result<Json<Vec<String>>, DaemonError> {
    blocking(move || d.replicas.list()).await.map(Json)
}

async fn add_replica(
    State(d): Shared,
    req: Result<Json<ReplicaRequest>, JsonRejection>,
) -> Result<Response, DaemonError> {
    let req = body(req)?;
    let list = blocking(move || {
        d.replicas.add(&req.uri, &d.identity, &d.known_hosts)?;
        d.replicas.list()
    })
    .await?;
    Ok((StatusCode::CREATED, Json(list)).into_response())
}

async fn remove_replica(
    State(d): Shared,
    req: Result<Json<ReplicaRequest>, JsonRejection>,
) -> Result<Json<Vec<String>>, DaemonError> {
    let req = body(req)?;
    blocking(move || match d.replicas.remove(&req.uri)? {
        true => Ok(Json(d.replicas.list()?)),
        false => Err(DaemonError::NotFound(format!(
            "{} is not a replica",
            req.uri
        ))),
    })
    .await
}

/// `GET /v1/objects/{ticket}/data?start=A&end=B`: the bytes (all, or `A..B`), every chunk
/// verified as it is read; the stream breaks off (no clean end) if one is damaged.
async fn data(
    State(d): Shared,
    UrlPath(t): UrlPath<String>,
    axum::extract::Query(r): axum::extract::Query<Range>,
) -> Result<Response, DaemonError> {
    let t = ticket_in(&t)?;
    let shelf = d.shelf.clone();
    let cap = t.cap.clone();
    // Refused before the answer begins: a capability that does not read the object.
    let st = blocking(move || Ok(shelf.objects().stat(&cap)?)).await?;
    let (start, end) = (r.start.unwrap_or(0), r.end.unwrap_or(u64::MAX).min(st.size));
    if start > end {
        return Err(DaemonError::BadRequest(format!(
            "the range {start}..{end} is backwards"
        )));
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<hyper::body::Bytes, std::io::Error>>(8);
    let shelf = d.shelf.clone();
    tokio::task::spawn_blocking(move || {
        let mut out = std::io::BufWriter::with_capacity(
            256 << 10,
            crate::stream::ChannelWriter { tx: tx.clone() },
        );
        let r = shelf.read(&t.cap, start, end, &mut out);
        let r = r.and_then(|_| {
            out.flush()
                .map_err(|e| DaemonError::Unavailable(e.to_string()))
        });
        if let Err(e) = r {
            let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let mut resp = axum::body::Body::from_stream(stream).into_response();
    let h = resp.headers_mut();
    h.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(axum::http::header::CONTENT_LENGTH, (end - start).into());
    Ok(resp)
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
        .route("/v1/store", get(store))
        .route("/v1/objects", post(put))
        .route("/v1/objects/{ticket}", get(object).delete(delete))
        .route("/v1/objects/{ticket}/data", get(data))
        .route("/v1/dirs", post(crate::dirs::mkdir))
        .route(
            "/v1/dirs/{ticket}",
            get(crate::dirs::list).post(crate::dirs::update),
        )
        .route("/v1/dirs/{ticket}/history", get(crate::dirs::history))
        .route("/v1/fetches", post(fetch))
        .route("/v1/fetches/{id}", get(job))
        .route("/v1/fetches/{id}/events", get(events))
        .route("/v1/devices", get(devices).post(add_device))
        .route("/v1/devices/remove", post(remove_device))
        .route("/v1/replicas", get(replicas).post(add_replica))
        .route("/v1/replicas/remove", post(remove_replica))
        .with_state(d)
        .layer(axum::middleware::map_response(json_errors))
}

/// Every error as the API's JSON error (`ApiError`), including those the HTTP layer makes
/// itself: an unknown route (404), a method a route does not take (405, its `Allow` header
/// kept), a path segment that is not UTF-8 (400). Their text becomes `error`.
async fn json_errors(r: Response) -> Response {
    let status = r.status();
    let json = r
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || json {
        return r;
    }
    let (mut parts, body) = r.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let kind = match status {
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        s if s.is_server_error() => "internal",
        _ => "bad_request",
    };
    let error = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    let body = serde_json::to_vec(&ApiError {
        kind: kind.into(),
        error,
    })
    .unwrap_or_default();
    parts.headers.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(body))
}
