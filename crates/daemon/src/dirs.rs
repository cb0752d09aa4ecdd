//! The directory service in the local API (`/v1/dirs`): directories of names bound to tickets,
//! every change a new version committed by compare-and-swap (`ferry-objects`' `dir`).

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferry_objects::{Capability, Entry, Kind, ObjectStore};
use serde::{Deserialize, Serialize};

use crate::api::{
    blocking, body, kind_name, ticket_in, Daemon, DirChange, DirEntry, DirHistory, DirListing,
    DirUpdate, DirVersion, Range, Shared,
};
use crate::ticket::Ticket;
use crate::DaemonError;

/// `POST /v1/dirs`: a new, empty directory's ticket.
#[derive(Debug, Serialize, Deserialize)]
pub struct Made {
    pub ticket: String,
}

/// The daemon's root directory: made on first start, its owner's capability kept in
/// `DATA/root.cap`.
pub(crate) fn root(
    objects: &ObjectStore,
    data: &std::path::Path,
) -> Result<Capability, DaemonError> {
    let path = data.join("root.cap");
    match std::fs::read_to_string(&path) {
        Ok(t) => {
            return t.trim().parse().map_err(|e: ferry_objects::BadCapability| {
                DaemonError::Damaged(format!("{}: {e}", path.display()))
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(DaemonError::file("read", &path)(e)),
    }
    let cap = objects.mkdir()?;
    crate::replace_file(&path, format!("{cap}\n").as_bytes())?;
    Ok(cap)
}

/// A directory's ticket (a directory has no bytes: the OID of none, size 0).
pub(crate) fn directory_ticket(cap: Capability, hints: &[crate::Hint]) -> Ticket {
    Ticket {
        oid: ferry_format::Oid(ferry_format::Id::hash(ferry_format::HashAlg::Blake3, b"")),
        size: 0,
        cap,
        durability: 1,
        hints: hints.to_vec(),
    }
}

pub(crate) async fn mkdir(State(d): Shared) -> Result<Response, DaemonError> {
    let d2 = d.clone();
    let cap = blocking(move || Ok(d2.shelf.objects().mkdir()?)).await?;
    let made = Made {
        ticket: directory_ticket(cap, &d.status.hints).to_string(),
    };
    Ok((StatusCode::CREATED, Json(made)).into_response())
}

pub(crate) async fn list(
    State(d): Shared,
    UrlPath(t): UrlPath<String>,
    Query(r): Query<Range>,
) -> Result<Json<DirListing>, DaemonError> {
    let t = ticket_in(&t)?;
    let l = blocking(move || Ok(d.shelf.objects().list(&t.cap, r.version)?)).await?;
    let mut entries = vec![];
    for (name, e) in l.entries {
        let ticket = Ticket::from_bytes(&e.value)
            .map_err(|e| DaemonError::Damaged(format!("the entry {name:?}: {e}")))?;
        entries.push(DirEntry {
            name,
            kind: kind_name(e.kind).into(),
            ticket: ticket.to_string(),
        });
    }
    Ok(Json(DirListing {
        version: l.version,
        entries,
    }))
}

/// What a change binds: the ticket's bytes, and whether it is one of this daemon's
/// directories.
fn entry(d: &Daemon, c: &DirChange) -> Result<(String, Option<Entry>), DaemonError> {
    let Some(t) = &c.ticket else {
        return Ok((c.name.clone(), None));
    };
    let t = ticket_in(t)?;
    let kind = match d.shelf.objects().stat(&t.cap) {
        Ok(st) => st.kind,
        Err(_) => Kind::Blob,
    };
    Ok((
        c.name.clone(),
        Some(Entry {
            kind,
            value: t.to_bytes(),
        }),
    ))
}

pub(crate) async fn update(
    State(d): Shared,
    UrlPath(t): UrlPath<String>,
    req: Result<Json<DirUpdate>, JsonRejection>,
) -> Result<Response, DaemonError> {
    let t = ticket_in(&t)?;
    let req = body(req)?;
    let d2: Arc<Daemon> = d.clone();
    let version = blocking(move || {
        let changes = req
            .changes
            .iter()
            .map(|c| entry(&d2, c))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(d2.shelf.objects().update(&t.cap, req.base, &changes)?)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(DirVersion { version })).into_response())
}

pub(crate) async fn history(
    State(d): Shared,
    UrlPath(t): UrlPath<String>,
) -> Result<Json<Vec<DirHistory>>, DaemonError> {
    let t = ticket_in(&t)?;
    let h = blocking(move || Ok(d.shelf.objects().history(&t.cap)?)).await?;
    Ok(Json(
        h.into_iter()
            .map(|v| DirHistory {
                version: v.version,
                entries: v.entries,
            })
            .collect(),
    ))
}
