//! `/v1/jobs`: create (the input forms: `npy_upload`, `envi_upload`, `formats`, `href` and `tus`,
//! through `intake`), get (with a long poll), list, cancel/delete, and the result and metadata
//! downloads (`envi_zip` for the ENVI form).

use axum::extract::{Path as UrlPath, RawQuery, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::auth::Caller;
use super::envi_zip::{build_zip, EnviData};
use super::error::{ApiResult, Error};
use super::intake::{content_length, ScratchGuard};
use super::job_view::{job_document, job_response, owned_job, require_succeeded, stream, Created};
use super::metrics::ApiMetrics;
use super::upload::SMALL_BODY_MAX;
use super::{params, ApiContext};
use crate::jobs::{product, Job, JobStatus};

// ---------------------------------------------------------------------------------------------------
// POST /v1/jobs

pub async fn create(State(ctx): State<ApiContext>, caller: Result<Caller, Error>, RawQuery(query): RawQuery, req: Request) -> Response {
    let outcome = match caller {
        Ok(caller) => create_inner(&ctx, &caller, query, req).await,
        Err(e) => Err(e),
    };
    match outcome {
        Ok(r) => r,
        Err(e) => {
            if e.status() != StatusCode::INTERNAL_SERVER_ERROR {
                ApiMetrics::add(&ctx.metrics.uploads_refused, 1);
            }
            // A refused upload is answered before its body was read to the end: the connection cannot
            // carry another request, and saying so keeps clients from reusing it.
            let mut r = e.into_response();
            r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            r
        }
    }
}

async fn create_inner(ctx: &ApiContext, caller: &Caller, query: Option<String>, req: Request) -> ApiResult<Response> {
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let mime = content_type.split(';').next().unwrap_or("").trim().to_string();
    // Content-Length first: a body announced past the limit is refused before a byte is read.
    if let Some(len) = content_length(req.headers()) {
        if len > ctx.config.max_upload_bytes {
            return Err(Error::too_large(format!(
                "the body ({len} bytes) exceeds the limit of {} bytes; {}",
                ctx.config.max_upload_bytes,
                crate::config::UPLOAD_LIMIT_HINT
            )));
        }
    }
    // Removes the upload's scratch files however the request ends (answered, refused, timed out or
    // dropped with its connection); accepted inputs were moved out of scratch before this runs.
    let (token, _scratch) = ScratchGuard::new(ctx);
    match mime.as_str() {
        "application/x-npy" | "application/octet-stream" => super::npy_upload::create(ctx, caller, query.as_deref(), req, &token).await,
        "multipart/form-data" => super::envi_upload::create(ctx, caller, query.as_deref(), req, &token).await.map(Created::response),
        "application/json" => create_href(ctx, caller, query.as_deref(), req).await.map(Created::response),
        // NetCDF, HDF5, GeoTIFF (api::formats; 415 naming the feature on a build without GDAL).
        m if super::formats::upload_format(m).is_some() => {
            let format = super::formats::upload_format(m).expect("matched");
            super::formats::create_upload(ctx, caller, query.as_deref(), req, &token, format).await.map(Created::response)
        }
        _ => Err(Error::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "Content-Type must be application/x-npy, multipart/form-data, application/json, or (NetCDF, HDF5, GeoTIFF) application/x-netcdf, application/x-hdf5 or image/tiff, not {:?}",
                content_type
            ),
        )),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct HrefRequest {
    input: HrefInput,
    #[serde(default)]
    params: Value,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct HrefInput {
    href: String,
}

async fn create_href(ctx: &ApiContext, caller: &Caller, query: Option<&str>, req: Request) -> ApiResult<Created> {
    if query.is_some_and(|q| !q.is_empty()) {
        return Err(Error::unprocessable("invalid_params", "with a JSON body, the parameters go in its `params` member"));
    }
    let body = http_body_util::Limited::new(req.into_body(), SMALL_BODY_MAX);
    let bytes = http_body_util::BodyExt::collect(body)
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                Error::too_large(format!("a JSON request may hold at most {SMALL_BODY_MAX} bytes"))
            } else {
                Error::bad_request("incomplete_body", format!("the request body was interrupted: {e}"))
            }
        })?
        .to_bytes();
    if let Some(request) = super::tus::job_request(&bytes)? {
        return super::tus::create_job(ctx, caller, request).await;
    }
    let request: HrefRequest = serde_json::from_slice(&bytes)
        .map_err(|e| Error::bad_request("invalid_json", format!("expected {{\"input\": {{\"href\": \"file:///...\"}}, \"params\": {{...}}}}: {e}")))?;
    let params = params::from_json(request.params)?;
    super::href::create_from_href(ctx, caller, &request.input.href, params).await
}

// ---------------------------------------------------------------------------------------------------
// GET / DELETE

/// The longest `?wait=` (seconds) a GET of a job may be held: below the idle timeouts of common
/// proxies and load balancers (60 s).
pub const MAX_WAIT_S: f64 = 50.0;
/// How often a held GET reads its job without a wake-up: a job that failed on another instance sends
/// no notification (only successes, cancellations and deletions do).
const WAIT_RECHECK: std::time::Duration = std::time::Duration::from_millis(250);

/// `GET /v1/jobs/{id}`, and with `?wait=S` a long poll: the answer comes as soon as the job has
/// finished (succeeded, failed, canceled), or after S seconds with its state then. A client sees
/// `succeeded` the moment it is recorded instead of at its next poll.
pub async fn get(State(ctx): State<ApiContext>, caller: Caller, UrlPath(id): UrlPath<String>, RawQuery(query): RawQuery) -> ApiResult<Response> {
    let wait = wait_param(query.as_deref())?;
    if wait.is_zero() {
        // The common status read: no waiter registered with the runner.
        return status_read(&ctx, &caller, &id).await.map(|(_, r)| r);
    }
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        // Registered before the read: an end recorded between the read and the await still wakes us.
        let ended = ctx.runner.job_ended();
        tokio::pin!(ended);
        ended.as_mut().enable();
        let (job, response) = status_read(&ctx, &caller, &id).await?;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if job.status.is_finished() || left.is_zero() {
            return Ok(response);
        }
        let _ = tokio::time::timeout(left.min(WAIT_RECHECK), ended).await;
    }
}

/// The header that marks a job document answered from this instance's memory because the database
/// cannot be reached; its value says why (`database_unavailable`).
pub const STALE_HEADER: &str = "x-hypermnf-stale";

/// One status read of the caller's job, and its 200 answer. While the database cannot be reached, a
/// job this instance has seen succeed (the job cache keeps the rows of the newest succeeded jobs) is
/// still answered, from that copy and marked with [`STALE_HEADER`]: a succeeded job's document no
/// longer changes, short of a deletion. Any other job gets the 503.
async fn status_read(ctx: &ApiContext, caller: &Caller, id: &str) -> ApiResult<(Job, Response)> {
    match owned_job(ctx, caller, id).await {
        Ok(job) => {
            ctx.runner.cache.remember_finished(&job);
            let response = job_response(StatusCode::OK, &job, false);
            Ok((job, response))
        }
        Err(e) if e.code() == "database_unavailable" => match ctx.runner.cache.finished_job(id) {
            Some(job) if job.owner == caller.owner => {
                let mut response = job_response(StatusCode::OK, &job, false);
                response.headers_mut().insert(STALE_HEADER, HeaderValue::from_static("database_unavailable"));
                Ok((job, response))
            }
            _ => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// `wait` of a job GET: seconds from 0 to `MAX_WAIT_S` (0 when absent).
fn wait_param(query: Option<&str>) -> ApiResult<std::time::Duration> {
    let bad = |m: String| Error::bad_request("invalid_query", m);
    let mut wait = std::time::Duration::ZERO;
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "wait" => {
                let s = v.trim().parse::<f64>().ok().filter(|s| s.is_finite() && (0.0..=MAX_WAIT_S).contains(s));
                let s = s.ok_or_else(|| bad(format!("wait must be a number of seconds from 0 to {MAX_WAIT_S}, not {v:?}")))?;
                wait = std::time::Duration::from_secs_f64(s);
            }
            other => return Err(bad(format!("unknown query parameter {other:?} (wait)"))),
        }
    }
    Ok(wait)
}

pub async fn list(State(ctx): State<ApiContext>, caller: Caller, RawQuery(query): RawQuery) -> ApiResult<Response> {
    let (mut status, mut limit, mut after) = (None, 50u32, None);
    let bad = |m: String| Error::bad_request("invalid_query", m);
    for (k, v) in form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "status" => {
                status = Some(JobStatus::parse(&v).ok_or_else(|| bad(format!("status must be queued, running, succeeded, failed or canceled, not {v:?}")))?)
            }
            "limit" => {
                limit = v.parse().ok().filter(|n| (1..=1000).contains(n)).ok_or_else(|| bad(format!("limit must be an integer from 1 to 1000, not {v:?}")))?
            }
            "after" => {
                let id = uuid::Uuid::parse_str(&v).map_err(|_| bad(format!("after must be a job id, not {v:?}")))?;
                after = Some(id.to_string());
            }
            other => return Err(bad(format!("unknown query parameter {other:?} (status, limit, after)"))),
        }
    }
    let jobs = ctx.runner.store.list(&caller.owner, status, limit + 1, after.as_deref()).await?;
    let more = jobs.len() > limit as usize;
    let page: Vec<Value> = jobs.iter().take(limit as usize).map(|j| job_document(j, false)).collect();
    let next = if more { jobs.get(limit as usize - 1).map(|j| j.id.clone()) } else { None };
    Ok(axum::Json(json!({"jobs": page, "next": next})).into_response())
}

pub async fn delete(State(ctx): State<ApiContext>, caller: Caller, UrlPath(id): UrlPath<String>) -> ApiResult<Response> {
    let job = owned_job(&ctx, &caller, &id).await?;
    crate::jobs::cancel_or_delete(&ctx.runner, job).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

// ---------------------------------------------------------------------------------------------------
// Downloads

pub async fn metadata(State(ctx): State<ApiContext>, caller: Caller, UrlPath(id): UrlPath<String>) -> ApiResult<Response> {
    let job = owned_job(&ctx, &caller, &id).await?;
    require_succeeded(&job)?;
    let key = job.results.get(product::METADATA).ok_or_else(|| Error::internal(anyhow::anyhow!("job {id} has no metadata")))?;
    let bytes = ctx.runner.storage.get_bytes(key).await?;
    ctx.metrics.downloaded(bytes.len() as u64);
    Ok(([(header::CONTENT_TYPE, "application/json")], bytes).into_response())
}

pub async fn result(State(ctx): State<ApiContext>, caller: Caller, UrlPath(id): UrlPath<String>, RawQuery(query): RawQuery) -> ApiResult<Response> {
    let (mut envi, mut denoised, mut cog) = (false, false, false);
    let bad = |m: String| Error::bad_request("invalid_query", m);
    for (k, v) in form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes()) {
        match (k.as_ref(), v.as_ref()) {
            ("format", "npy") => envi = false,
            ("format", "envi") => envi = true,
            ("format", "cog") => cog = true,
            ("product", "components") => denoised = false,
            ("product", "denoised") => denoised = true,
            ("format", _) => return Err(bad(format!("format must be npy, envi or cog, not {v:?}"))),
            ("product", _) => return Err(bad(format!("product must be components or denoised, not {v:?}"))),
            (other, _) => return Err(bad(format!("unknown query parameter {other:?} (format, product)"))),
        }
    }
    let job = owned_job(&ctx, &caller, &id).await?;
    require_succeeded(&job)?;
    let (npy, hdr, img, stem) = if denoised {
        (product::DENOISED_NPY, product::DENOISED_HDR, product::DENOISED_IMG, format!("{id}-denoised"))
    } else {
        (product::COMPONENTS_NPY, product::COMPONENTS_HDR, product::COMPONENTS_IMG, id.clone())
    };
    if !cog {
        super::formats::refuse_sensor_download(&job)?;
    }
    if denoised && !job.results.contains_key(npy) {
        return Err(Error::new(StatusCode::CONFLICT, "no_denoised", "this job did not compute the inverse (ask with inverse=true)"));
    }
    if cog {
        let key = job.results.get(npy).ok_or_else(|| Error::internal(anyhow::anyhow!("job {id} lacks {npy}")))?;
        return super::formats::cog_result(&ctx, &job, key, denoised, &stem).await;
    }
    if !envi {
        let key = job.results.get(npy).ok_or_else(|| Error::internal(anyhow::anyhow!("job {id} lacks {npy}")))?;
        return stream(&ctx, key, "application/x-npy", &format!("{stem}.npy")).await;
    }
    let zip_key = format!("results/{id}/{stem}.zip");
    if ctx.runner.storage.size(&zip_key).await.is_err() {
        // Jobs keep the ENVI header and the .npy; jobs stored before the data file was made on the first
        // ENVI download (rows with a `components.img` result) have the data file too.
        let lacks = || Error::internal(anyhow::anyhow!("job {id} lacks its ENVI files"));
        let hdr_key = job.results.get(hdr).ok_or_else(lacks)?;
        let data = match (job.results.get(img), job.results.get(npy)) {
            (Some(img_key), _) => EnviData::Stored(img_key),
            (None, Some(npy_key)) => EnviData::FromNpy(npy_key),
            (None, None) => return Err(lacks()),
        };
        build_zip(&ctx, hdr_key, data, &stem, &zip_key).await?;
    }
    stream(&ctx, &zip_key, "application/zip", &format!("{stem}.zip")).await
}
