//! `/v1/batches`: several cubes, given by reference, submitted together. Each cube is a job of its own
//! (listed by `/v1/jobs` too, its document naming its batch); with `"statistics": "pooled"` one eigen
//! system is computed from all of them and every cube is projected with it (`jobs::batch`), with
//! `"each"` the jobs are independent.

use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::auth::Caller;
use super::error::{ApiResult, Error};
use super::href;
use super::intake;
use super::{params, ApiContext};
use crate::jobs::batch;
use crate::jobs::{rfc3339, BatchPhase, BatchRow, InputKind, InputSummary, Job, JobStatus, NewBatch, NewJob};
use crate::mnf::MnfParams;
use crate::reference::Reference;

/// The most cubes one batch may hold: a campaign of a few hundred flight lines, with room.
pub const MAX_INPUTS: usize = 1000;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchRequest {
    inputs: Vec<BatchInput>,
    #[serde(default)]
    statistics: Option<String>,
    #[serde(default)]
    params: Value,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchInput {
    href: String,
}

/// One input, checked and decoded as far as the job needs before it runs.
struct Prepared {
    /// The params as bound to this input (`statistics_from` resolved and checked against its bands).
    params: MnfParams,
    kind: InputKind,
    location: String,
    input: InputSummary,
    /// The header's wavelengths, if it gives them (a pooled batch's cubes must agree).
    wavelength: Option<Vec<f64>>,
}

// ---------------------------------------------------------------------------------------------------
// POST /v1/batches

pub async fn create(State(ctx): State<ApiContext>, caller: Caller, RawQuery(query): RawQuery, body: axum::body::Bytes) -> ApiResult<Response> {
    if query.is_some_and(|q| !q.is_empty()) {
        return Err(Error::unprocessable("invalid_params", "a batch's parameters go in its `params` member"));
    }
    let request: BatchRequest = serde_json::from_slice(&body).map_err(|e| {
        Error::bad_request(
            "invalid_json",
            format!("expected {{\"inputs\": [{{\"href\": ...}}, ...], \"statistics\": \"pooled\" | \"each\", \"params\": {{...}}}}: {e}"),
        )
    })?;
    let pooled = match request.statistics.as_deref() {
        None | Some("each") => false,
        Some("pooled") => true,
        Some(other) => return Err(Error::unprocessable("invalid_params", format!("statistics must be \"pooled\" or \"each\", not {other:?}"))),
    };
    let params = params::from_json(request.params)?;
    let hrefs: Vec<String> = request.inputs.into_iter().map(|i| i.href).collect();
    let (row, jobs) = create_batch(&ctx, &caller, &hrefs, pooled, params).await?;
    let mut r = (StatusCode::CREATED, Json(batch_document(&row, &jobs, Some(&hrefs)))).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/batches/{}", row.id)) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    Ok(r)
}

/// Creates a batch of the cubes `hrefs` (each checked as `POST /v1/jobs` checks an href; a refusal
/// names its input's index, and creates nothing): its row and member jobs, in the inputs' order.
/// Shared by `/v1/batches` and the OGC API's execution of several cubes.
pub async fn create_batch(ctx: &ApiContext, caller: &Caller, hrefs: &[String], pooled: bool, params: MnfParams) -> ApiResult<(BatchRow, Vec<Job>)> {
    if hrefs.is_empty() || hrefs.len() > MAX_INPUTS {
        return Err(Error::unprocessable("invalid_params", format!("a batch holds 1 to {MAX_INPUTS} inputs, not {}", hrefs.len())));
    }
    if pooled && params.statistics_from.is_some() {
        return Err(Error::unprocessable(
            "invalid_params",
            "a pooled batch computes its own system: statistics_from applies to a batch of \"each\" (or to single jobs)",
        ));
    }
    let mut prepared = Vec::with_capacity(hrefs.len());
    for (i, href) in hrefs.iter().enumerate() {
        let p = prepare(ctx, caller, href, &params).await.map_err(|e| e.prefixed(&format!("input {i}: ")))?;
        prepared.push(p);
    }
    if pooled {
        check_same_bands(&prepared)?;
    }
    let id = uuid::Uuid::now_v7().to_string();
    // Every input binds the same system (its identity is in the params), or none.
    let canonical = params::canonical(&prepared[0].params);
    let members: Vec<NewJob> = prepared
        .iter()
        .enumerate()
        .map(|(position, p)| NewJob {
            id: uuid::Uuid::now_v7().to_string(),
            owner: caller.owner.clone(),
            params: canonical.clone(),
            // A batch's jobs are its own: never answered by, nor answering, another request's job
            // (a cube's statistics and device-resident copy are still shared through the job cache,
            // which keys on the content read at run time).
            digest: hex::encode(Sha256::digest(format!("batch-member\n{id}\n{position}\n{canonical}"))),
            content_digest: None,
            upload_sha256: None,
            input: p.input.clone(),
            input_kind: p.kind,
            input_location: p.location.clone(),
        })
        .collect();
    let new = NewBatch { id: id.clone(), owner: caller.owner.clone(), pooled, params: canonical };
    let row = ctx.runner.store.insert_batch(&new, &members).await?;
    ctx.runner.notify();
    tracing::info!(batch = %id, inputs = members.len(), pooled, "batch created");
    let jobs = ctx.runner.store.batch_jobs(&id).await?;
    Ok((row, jobs))
}

/// Checks one input as `POST /v1/jobs` checks an href, without digesting its samples (a member's
/// digest is taken from what its run reads): a `file://` cube is decoded (mapped), an `s3://` or
/// `https://` one has its header read, or, a NetCDF, HDF5 or GeoTIFF object, is read whole into
/// scratch and decoded (the scratch removed again before the next input).
async fn prepare(ctx: &ApiContext, caller: &Caller, href: &str, params: &MnfParams) -> ApiResult<Prepared> {
    if let Some(r) = Reference::parse(href).map_err(href::refused)? {
        return match href::check_reference(ctx, &caller.owner, &r, params.clone()).await? {
            href::Checking::Done(c) => {
                Ok(Prepared { params: c.params, kind: InputKind::Href, location: c.stored.to_location(), input: c.input, wavelength: c.wavelength })
            }
            // GDAL needs the whole file to say what it holds: it is read and decoded here, as for a
            // single job, and read again by the member's run. Its digest is not taken here (the
            // member's is its batch's own); the run remembers it for later requests, as a single
            // job's run does.
            href::Checking::Gdal(object, version, params) => {
                let (cube, params, stored) = href::decode_gdal_object(ctx, &caller.owner, &object, version, params).await?;
                Ok(Prepared {
                    params,
                    kind: InputKind::Href,
                    location: stored.to_location(),
                    input: intake::input_summary(&cube),
                    wavelength: cube.meta.wavelength.clone(),
                })
            }
        };
    }
    let path = href::resolve_href(href, &ctx.input_roots)?;
    href::precheck_file(&path, ctx.config.max_upload_bytes)?;
    let location = path.to_str().ok_or_else(|| Error::bad_request("invalid_href", "the path is not UTF-8"))?.to_string();
    let (cube, params) = intake::decode_and_validate(ctx, &caller.owner, InputKind::Href, location.clone(), params.clone()).await?;
    Ok(Prepared { params, kind: InputKind::Href, location, input: intake::input_summary(&cube), wavelength: cube.meta.wavelength.clone() })
}

/// A pooled batch needs cubes of the same bands: the same count, and the same wavelengths where the
/// headers give them (to a millionth of the value: headers print them with varying digits).
fn check_same_bands(inputs: &[Prepared]) -> ApiResult<()> {
    let first = &inputs[0];
    for (i, p) in inputs.iter().enumerate().skip(1) {
        if p.input.bands != first.input.bands {
            return Err(Error::unprocessable(
                "batch_mismatch",
                format!("input {i} has {} bands and input 0 has {}: pooled statistics need cubes of the same bands", p.input.bands, first.input.bands),
            ));
        }
        if let (Some(a), Some(b)) = (&first.wavelength, &p.wavelength) {
            if let Some(band) = a.iter().zip(b).position(|(x, y)| (x - y).abs() > 1e-6 * x.abs().max(y.abs()).max(1.0)) {
                return Err(Error::unprocessable(
                    "batch_mismatch",
                    format!(
                        "input {i}'s wavelength of band {band} is {} and input 0's is {}: pooled statistics need cubes of the same bands",
                        b[band], a[band]
                    ),
                ));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// The batch document

/// The batch's status from its members': failed or canceled as soon as one is (a pooled batch then
/// has no system), succeeded when all are, running once any has started, else queued.
fn overall_status(row: &BatchRow, jobs: &[Job]) -> &'static str {
    if row.error_code.is_some() || jobs.iter().any(|j| j.status == JobStatus::Failed) {
        return "failed";
    }
    if jobs.iter().any(|j| j.status == JobStatus::Canceled) {
        return "canceled";
    }
    if !jobs.is_empty() && jobs.iter().all(|j| j.status == JobStatus::Succeeded) {
        return "succeeded";
    }
    let started = |j: &Job| j.status != JobStatus::Queued || j.batch.as_ref().is_some_and(|b| b.phase == Some(BatchPhase::Project));
    if jobs.iter().any(started) {
        "running"
    } else {
        "queued"
    }
}

/// A member's share of the work done: a pooled member's statistics run is its first half.
fn member_progress(j: &Job) -> f64 {
    match j.status {
        JobStatus::Succeeded | JobStatus::Failed | JobStatus::Canceled => 1.0,
        _ => match j.batch.as_ref().and_then(|b| b.phase) {
            Some(BatchPhase::Statistics) => 0.5 * j.progress,
            Some(BatchPhase::Project) if j.status == JobStatus::Queued => 0.5,
            Some(BatchPhase::Project) => 0.5 + 0.5 * j.progress,
            None => j.progress,
        },
    }
}

pub fn batch_document(row: &BatchRow, jobs: &[Job], hrefs: Option<&[String]>) -> Value {
    let base = format!("/v1/batches/{}", row.id);
    let progress = if jobs.is_empty() { 0.0 } else { jobs.iter().map(member_progress).sum::<f64>() / jobs.len() as f64 };
    let count = |s: JobStatus| jobs.iter().filter(|j| j.status == s).count();
    let members: Vec<Value> = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| {
            let mut m = json!({
                "id": j.id,
                "status": j.status.as_str(),
                "stage": j.stage,
                "progress": j.progress,
                "links": {"self": format!("/v1/jobs/{}", j.id)},
            });
            if let Some(h) = hrefs.and_then(|h| h.get(i)) {
                m["href"] = json!(h);
            }
            if let Some(code) = &j.error_code {
                m["error"] = json!({"code": code, "message": j.error_message.clone().unwrap_or_default()});
            }
            m
        })
        .collect();
    let error = match (&row.error_code, &row.error_message) {
        (Some(c), m) => json!({"code": c, "message": m.clone().unwrap_or_default()}),
        _ => Value::Null,
    };
    json!({
        "id": row.id,
        "status": overall_status(row, jobs),
        "statistics": if row.pooled { "pooled" } else { "each" },
        "progress": progress,
        "counts": {
            "queued": count(JobStatus::Queued), "running": count(JobStatus::Running),
            "succeeded": count(JobStatus::Succeeded), "failed": count(JobStatus::Failed), "canceled": count(JobStatus::Canceled),
        },
        "system_ready": row.system_key.is_some(),
        "params": serde_json::from_str::<Value>(&row.params).unwrap_or(Value::Null),
        "created_at": rfc3339(row.created_at),
        "error": error,
        "jobs": members,
        "links": {"self": base.clone(), "system": format!("{base}/system")},
    })
}

pub async fn owned_batch(ctx: &ApiContext, caller: &Caller, id: &str) -> ApiResult<BatchRow> {
    if uuid::Uuid::parse_str(id).is_err() {
        return Err(Error::not_found());
    }
    match ctx.runner.store.get_batch(id).await? {
        Some(b) if b.owner == caller.owner => Ok(b),
        _ => Err(Error::not_found()),
    }
}

// ---------------------------------------------------------------------------------------------------
// GET, list, DELETE

pub async fn get(State(ctx): State<ApiContext>, caller: Caller, UrlPath(id): UrlPath<String>) -> ApiResult<Response> {
    let row = owned_batch(&ctx, &caller, &id).await?;
    let jobs = ctx.runner.store.batch_jobs(&row.id).await?;
    Ok(Json(batch_document(&row, &jobs, None)).into_response())
}

pub async fn list(State(ctx): State<ApiContext>, caller: Caller, RawQuery(query): RawQuery) -> ApiResult<Response> {
    let (mut limit, mut after) = (50u32, None);
    let bad = |m: String| Error::bad_request("invalid_query", m);
    for (k, v) in form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "limit" => {
                limit = v.parse().ok().filter(|n| (1..=1000).contains(n)).ok_or_else(|| bad(format!("limit must be an integer from 1 to 1000, not {v:?}")))?
            }
            "after" => {
                uuid::Uuid::parse_str(&v).map_err(|_| bad(format!("after must be a batch id, not {v:?}")))?;
                after = Some(v.into_owned());
            }
            other => return Err(bad(format!("unknown query parameter {other:?} (limit, after)"))),
        }
    }
    let rows = ctx.runner.store.list_batches(&caller.owner, limit, after.as_deref()).await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let jobs = ctx.runner.store.batch_jobs(&row.id).await?;
        out.push(batch_document(row, &jobs, None));
    }
    let next = (rows.len() == limit as usize).then(|| rows.last().map(|r| format!("/v1/batches?limit={limit}&after={}", r.id))).flatten();
    Ok(Json(json!({"batches": out, "next": next})).into_response())
}

/// Cancels the batch's running and queued jobs and removes the batch, its jobs and every file they
/// and the batch stored.
pub async fn delete(State(ctx): State<ApiContext>, caller: Caller, UrlPath(id): UrlPath<String>) -> ApiResult<Response> {
    let row = owned_batch(&ctx, &caller, &id).await?;
    crate::jobs::upkeep::delete_batch(&ctx.runner, &row.id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /v1/batches/{id}/system`: a pooled batch's system file, with its pooled statistics as
/// extra arrays (`jobs::batch::pooled_file`); 409 until it is computed, and for a batch of
/// independent jobs, which has none.
pub async fn system(State(ctx): State<ApiContext>, caller: Caller, UrlPath(id): UrlPath<String>) -> ApiResult<Response> {
    let row = owned_batch(&ctx, &caller, &id).await?;
    if !row.pooled {
        return Err(Error::new(
            StatusCode::CONFLICT,
            "no_system",
            "a batch of independent jobs (\"each\") has no pooled system: each of its jobs has its own (GET /v1/jobs/{id}/system)",
        ));
    }
    let file = batch::stored_system(&ctx.runner.store, &ctx.runner.storage, &row.id)
        .await
        .map_err(|f| match f.code.as_str() {
            "canceled" => Error::not_found(),
            _ => Error::internal(anyhow::anyhow!("batch {}: {}", row.id, f.message)),
        })?
        .ok_or_else(|| match &row.error_code {
            Some(code) => Error::new(StatusCode::CONFLICT, "no_system", format!("the batch failed ({code}) before its pooled system was computed")),
            None => Error::new(StatusCode::CONFLICT, "system_not_ready", "the batch's pooled statistics are still being computed"),
        })?;
    Ok(super::systems::file_response(&file, &row.id))
}
