//! Eigen systems over HTTP (issue 32, "Reuse a system"): `GET /v1/jobs/{id}/system` exports a
//! succeeded job's system as a system file (`mnf::system_file`), `POST /v1/systems` imports one,
//! `GET`/`DELETE /v1/systems/{id}` and `GET /v1/systems` serve the caller's imported systems, and
//! [`bind`] checks a job request's `statistics_from` against its cube and keys the job on the system.

use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};

use super::auth::Caller;
use super::error::{ApiResult, Error};
use super::ApiContext;
use crate::jobs::systems::{self, ResolveError};
use crate::jobs::{now_ms, rfc3339, SystemRow};
use crate::mnf::system_file::{Source, SystemFile, MAX_FILE_BYTES};
use crate::mnf::MnfParams;

/// The routes under `/v1`.
pub fn routes() -> Router<ApiContext> {
    Router::new()
        .route("/jobs/{id}/system", get(job_system))
        .route("/systems", get(list).post(create))
        .route("/systems/{id}", get(get_one).delete(delete))
}

impl From<ResolveError> for Error {
    fn from(e: ResolveError) -> Error {
        match e {
            ResolveError::NotFound(_) => Error::new(StatusCode::NOT_FOUND, "system_not_found", e.to_string()),
            ResolveError::NotReady { .. } | ResolveError::BatchNotReady(_) => Error::new(StatusCode::CONFLICT, "system_not_ready", e.to_string()),
            ResolveError::NoSystem(_) => Error::new(StatusCode::CONFLICT, "no_system", e.to_string()),
            ResolveError::Store(s) => Error::from(s),
            ResolveError::Storage(s) => Error::from(s),
            ResolveError::Unreadable { .. } => Error::internal(e),
        }
    }
}

/// A job request's parameters with its `statistics_from` (if any) bound to the system it names: the
/// system must be the caller's, and suit a cube of `bands` bands (and `wavelengths`, when the cube's
/// header gives them) and the components asked for; `statistics_sha256` is set to the system's
/// identity, so that the job's canonical parameters, and so its cache digest, name the system. Called
/// wherever a job request meets its cube; a request already bound (the sha is only ever set here) is
/// returned as it is.
pub async fn bind(ctx: &ApiContext, owner: &str, mut params: MnfParams, bands: usize, wavelengths: Option<&[f64]>) -> ApiResult<MnfParams> {
    let Some(id) = params.statistics_from.clone() else { return Ok(params) };
    if params.statistics_sha256.is_some() {
        return Ok(params);
    }
    let found = systems::resolve(&ctx.runner.store, &ctx.runner.storage, owner, &id).await?;
    if let Some(why) = found.file.mismatch(bands, wavelengths, params.components) {
        return Err(Error::unprocessable("system_mismatch", format!("statistics_from {id}: {why}")));
    }
    params.statistics_sha256 = Some(found.identity);
    Ok(params)
}

/// A system file as a download.
pub(super) fn file_response(file: &SystemFile, name: &str) -> Response {
    let mut r = (StatusCode::OK, file.to_json()).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}-system.json\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    r
}

/// `GET /v1/jobs/{id}/system`: the eigen system the job projected with.
pub async fn job_system(State(ctx): State<ApiContext>, caller: Caller, UrlPath(id): UrlPath<String>) -> ApiResult<Response> {
    let job = super::job_view::owned_job(&ctx, &caller, &id).await?;
    super::job_view::require_succeeded(&job)?;
    let file = systems::of_job(&ctx.runner.storage, &job).await?;
    Ok(file_response(&file, &id))
}

/// What the API shows of an imported system.
fn summary(row: &SystemRow, file: Option<&SystemFile>) -> Value {
    let mut v = json!({
        "id": row.id,
        "bands": row.bands,
        "bands_used": row.bands_used,
        "identity": row.identity,
        "bytes": row.bytes,
        "created_at": rfc3339(row.created_at),
    });
    if let Some(f) = file {
        v["source"] = json!(f.source);
        v["wavelengths"] = json!(f.input.wavelengths.is_some());
        v["eigenvalues"] = json!(f.system.eigenvalues.iter().take(10).collect::<Vec<_>>());
    }
    v
}

/// The caller's imported system `id`, or 404 `system_not_found`.
async fn owned_system(ctx: &ApiContext, caller: &Caller, id: &str) -> ApiResult<SystemRow> {
    let not_found = || Error::new(StatusCode::NOT_FOUND, "system_not_found", format!("no system {id:?} of yours"));
    if uuid::Uuid::parse_str(id).is_err() {
        return Err(not_found());
    }
    match ctx.runner.store.get_system(id).await? {
        Some(row) if row.owner == caller.owner => Ok(row),
        _ => Err(not_found()),
    }
}

/// `POST /v1/systems`: imports a system file (the body); 201 with its summary. The file is checked
/// completely (`SystemFile::from_json`) and stored as this service writes it, with its source now
/// `{"system": id}`: what `GET /v1/systems/{id}` returns.
pub async fn create(State(ctx): State<ApiContext>, caller: Caller, req: Request) -> ApiResult<Response> {
    let body = http_body_util::Limited::new(req.into_body(), MAX_FILE_BYTES);
    let bytes = http_body_util::BodyExt::collect(body)
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                Error::too_large(format!("a system file may hold at most {MAX_FILE_BYTES} bytes"))
            } else {
                Error::bad_request("incomplete_body", format!("the request body was interrupted: {e}"))
            }
        })?
        .to_bytes();
    let parsed = tokio::task::spawn_blocking(move || SystemFile::from_json(&bytes)).await.map_err(Error::internal)?;
    let mut file = parsed.map_err(|e| Error::unprocessable("invalid_system", e.to_string()))?;
    let id = uuid::Uuid::now_v7().to_string();
    file.source = Source::System(id.clone());
    let json = file.to_json();
    let row = SystemRow {
        id: id.clone(),
        owner: caller.owner.clone(),
        identity: file.identity(),
        bands: file.input.bands as i64,
        bands_used: file.used() as i64,
        storage_key: format!("systems/{id}/system.json"),
        bytes: json.len() as i64,
        created_at: now_ms(),
    };
    systems::store_imported(&ctx.runner.store, &ctx.runner.storage, &row, json).await?;
    let mut r = (StatusCode::CREATED, axum::Json(summary(&row, Some(&file)))).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/systems/{id}")) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    Ok(r)
}

/// `GET /v1/systems/{id}`: the system file.
pub async fn get_one(State(ctx): State<ApiContext>, caller: Caller, UrlPath(id): UrlPath<String>) -> ApiResult<Response> {
    let row = owned_system(&ctx, &caller, &id).await?;
    let file = systems::of_imported(&ctx.runner.storage, &row).await?;
    Ok(file_response(&file, &id))
}

/// `GET /v1/systems`: the caller's imported systems, newest first (summaries, at most 1000).
pub async fn list(State(ctx): State<ApiContext>, caller: Caller) -> ApiResult<Response> {
    let rows = ctx.runner.store.list_systems(&caller.owner, 1000).await?;
    let page: Vec<Value> = rows.iter().map(|r| summary(r, None)).collect();
    Ok(axum::Json(json!({ "systems": page })).into_response())
}

/// `DELETE /v1/systems/{id}`: 204. Jobs that were created with it keep their results; one still
/// queued fails with `system_not_found`.
pub async fn delete(State(ctx): State<ApiContext>, caller: Caller, UrlPath(id): UrlPath<String>) -> ApiResult<Response> {
    let row = owned_system(&ctx, &caller, &id).await?;
    systems::delete_imported(&ctx.runner.store, &ctx.runner.storage, &row.id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
