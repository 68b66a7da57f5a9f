//! `/v1/jobs`: create (three input forms), get, list, cancel/delete, result and metadata downloads.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path as UrlPath, RawQuery, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::auth::Caller;
use super::error::{ApiResult, Error};
use super::metrics::ApiMetrics;
use super::upload::{self, Budget, Claim};
use super::{params, ApiContext};
pub use super::href::{create_from_href, resolve_href};
use crate::cube::Cube;
use crate::jobs::model::{product, rfc3339};
use crate::jobs::early::EarlyRun;
use crate::jobs::feed::{self, Feed};
use crate::jobs::resident;
use crate::jobs::store::Inserted;
use crate::jobs::{InputKind, InputSummary, Job, JobStatus, NewJob};
use crate::mnf::MnfParams;

use super::upload::SMALL_BODY_MAX;
/// Header a client may send with a `.npy` body: the hex SHA-256 of the body. When this owner already has
/// a live job made from the same bytes and parameters, it is answered at once without reading the body.
/// Checking it costs one serial SHA-256 pass over the body, which bounds the ingest to one core's
/// hashing speed; `X-Cube-Digest` does the same without it.
pub const CONTENT_SHA256: &str = "x-content-sha256";
/// Header a client may send with a `.npy` body: the hex content digest of the cube
/// (`Cube::content_digest`, the tree digest of its canonical `.npy`). When this owner already has a job
/// of the same cube and parameters (queued, running or succeeded), it is answered at once without
/// reading the body; otherwise the digest computed from the body must equal it.
pub const CUBE_DIGEST: &str = "x-cube-digest";

/// A hex digest header, lower-cased: absent, or 64 hex digits (400 otherwise).
fn hex_digest_header(h: &HeaderMap, name: &str, display: &str) -> ApiResult<Option<String>> {
    let Some(v) = h.get(name) else { return Ok(None) };
    let s = v.to_str().unwrap_or("").trim().to_ascii_lowercase();
    if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::bad_request("invalid_digest", format!("{display} must be 64 hex digits")));
    }
    Ok(Some(s))
}

// ---------------------------------------------------------------------------------------------------
// The job document

pub fn job_document(job: &Job, cached: bool) -> Value {
    let base = format!("/v1/jobs/{}", job.id);
    let error = match (&job.error_code, &job.error_message) {
        (Some(c), m) => json!({"code": c, "message": m.clone().unwrap_or_default()}),
        _ => Value::Null,
    };
    json!({
        "id": job.id,
        "status": job.status.as_str(),
        "progress": job.progress,
        "stage": job.stage,
        "created_at": rfc3339(job.created_at),
        "started_at": job.started_at.map(rfc3339),
        "finished_at": job.finished_at.map(rfc3339),
        "params": serde_json::from_str::<Value>(&job.params).unwrap_or(Value::Null),
        "input": job.input,
        "cached": cached,
        "error": error,
        "batch": super::batches::member_of(job),
        "links": {"self": base, "result": format!("{base}/result"), "metadata": format!("{base}/metadata")},
    })
}

/// A job a create request led to: a new one, or the caller's existing job of the same cube and
/// parameters (`cached`). Shared by `/v1/jobs` and the OGC API's execution.
pub struct Created {
    pub job: Job,
    pub cached: bool,
}

impl Created {
    pub(super) fn new(job: Job) -> ApiResult<Created> {
        Ok(Created { job, cached: false })
    }
    pub(super) fn existing(job: Job) -> ApiResult<Created> {
        Ok(Created { job, cached: true })
    }
    /// The `/v1` answer: 202 for a new job, 201 for a new job that already succeeded (run on a cube
    /// resident on a device, `jobs::resident`), 200 with `cached: true` for an existing one.
    fn response(self) -> Response {
        let status = match (self.cached, self.job.status) {
            (true, _) => StatusCode::OK,
            (false, JobStatus::Succeeded) => StatusCode::CREATED,
            (false, _) => StatusCode::ACCEPTED,
        };
        job_response(status, &self.job, self.cached)
    }
}

fn job_response(status: StatusCode, job: &Job, cached: bool) -> Response {
    let mut r = (status, axum::Json(job_document(job, cached))).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/jobs/{}", job.id)) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// The caller's job, or 404 (also for other owners' jobs and for ids that are not job ids at all).
pub async fn owned_job(ctx: &ApiContext, caller: &Caller, id: &str) -> ApiResult<Job> {
    if uuid::Uuid::parse_str(id).is_err() {
        return Err(Error::not_found());
    }
    match ctx.runner.store.get(id).await? {
        Some(j) if j.owner == caller.owner => Ok(j),
        _ => Err(Error::not_found()),
    }
}

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
    let token = format!("upload-{}", uuid::Uuid::now_v7());
    // Removes the upload's scratch files however the request ends (answered, refused, timed out or
    // dropped with its connection); accepted inputs were moved out of scratch before this runs.
    let _scratch = ScratchGuard { storage: ctx.runner.storage.clone(), token: token.clone() };
    match mime.as_str() {
        "application/x-npy" | "application/octet-stream" => create_npy(ctx, caller, query.as_deref(), req, &token).await,
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

struct ScratchGuard {
    storage: crate::storage::Storage,
    token: String,
}

impl Drop for ScratchGuard {
    fn drop(&mut self) {
        self.storage.remove_scratch(&self.token);
    }
}

fn content_length(h: &HeaderMap) -> Option<u64> {
    h.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse().ok())
}

async fn create_npy(ctx: &ApiContext, caller: &Caller, query: Option<&str>, req: Request, token: &str) -> ApiResult<Response> {
    let params = params::from_query(query)?;
    check_backend(ctx, &params)?;
    super::formats::refuse_ortho(&params, "a .npy cube")?;
    let canonical = params::canonical(&params);
    let claimed_sha = hex_digest_header(req.headers(), CONTENT_SHA256, "X-Content-SHA256")?;
    let claimed_cube = hex_digest_header(req.headers(), CUBE_DIGEST, "X-Cube-Digest")?;
    // A job this owner already has for the claimed cube (or body) is answered without the body.
    let cube_key = claimed_cube.as_deref().and_then(|c| hex::decode(c).ok()).and_then(|v| <[u8; 32]>::try_from(v).ok());
    let known = match (&claimed_sha, cube_key) {
        (_, Some(cube)) => existing_job(ctx, &caller.owner, &CubeKey::of_npy(cube).job_digest(&canonical)).await?,
        (Some(sha), None) => ctx.runner.store.find_live_by_upload(&caller.owner, sha, &canonical).await?,
        (None, None) => None,
    };
    let without_body = match (known, cube_key) {
        (Some(job), _) => {
            ApiMetrics::add(&ctx.metrics.cache_hits, 1);
            Some(job_response(StatusCode::OK, &job, true))
        }
        // A new job of a cube this owner sent before, perhaps still on a device here.
        (None, Some(cube)) => run_on_resident(ctx, caller, cube, &params).await?.map(Created::response),
        (None, None) => None,
    };
    if let Some(mut r) = without_body {
        if content_length(req.headers()) != Some(0) {
            // The body is left unread (with `Expect: 100-continue` it is never sent).
            r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        return Ok(r);
    }
    let announced = content_length(req.headers());
    if cube_key.is_some() && axum::body::HttpBody::is_end_stream(req.body()) {
        // A client asking without the body first (the Python client does): it sends it now.
        return Err(Error::new(
            StatusCode::CONFLICT,
            "body_needed",
            "no job of this cube and these parameters, and the cube of X-Cube-Digest is not held here: send it as the .npy body",
        ));
    }
    let stream = req.into_body().into_data_stream();
    let claimed = Claimed { sha256: claimed_sha, cube: claimed_cube };
    let created = npy_job(ctx, caller, params, stream, announced, claimed, token).await?;
    Ok(created.response())
}

/// A job of the cube of content digest `cube`, which the caller sent before (a job of theirs was
/// made from it), run at once on that cube if this instance still holds it on a device
/// (`jobs::resident`): the job, already succeeded; None when the body is needed. Parameters that do
/// not suit the cube are refused here, before the body is sent.
async fn run_on_resident(ctx: &ApiContext, caller: &Caller, cube: [u8; 32], params: &MnfParams) -> ApiResult<Option<Created>> {
    if !resident::possible(&ctx.runner, params.backend) {
        return Ok(None);
    }
    let began = std::time::Instant::now();
    let Some(earlier) = ctx.runner.store.find_by_content(&caller.owner, &hex::encode(cube)).await? else { return Ok(None) };
    tracing::debug!(target: "hypermnf::timing", lookup_ms = began.elapsed().as_secs_f64() * 1e3, "the owner's earlier job of the cube found");
    let i = &earlier.input;
    admit(ctx, params, i.lines, i.samples, i.bands, None)?;
    let params = &super::systems::bind(ctx, &caller.owner, params.clone(), i.bands, None).await?;
    let canonical = &params::canonical(params);
    let id = uuid::Uuid::now_v7().to_string();
    let location = format!("uploads/{id}"); // never written: the job needs no input once it succeeded
    let digest = CubeKey::of_npy(cube).job_digest(canonical);
    let new = new_job(id, caller, canonical.to_string(), digest, cube, None, i.clone(), InputKind::Npy, location);
    match resident::run(&ctx.runner, new, &earlier, params).await {
        None => Ok(None),
        Some(Ok(Inserted::Created(job))) => {
            ApiMetrics::add(&ctx.metrics.jobs_created, 1);
            Created::new(job).map(Some)
        }
        Some(Ok(Inserted::Existing(job))) => {
            ApiMetrics::add(&ctx.metrics.cache_hits, 1);
            Created::existing(job).map(Some)
        }
        Some(Err(e)) => Err(e.into()),
    }
}

/// A job from `.npy` bytes already in memory (the OGC API's inline values), through the same checks
/// and digests as a `.npy` body.
pub async fn create_from_npy_bytes(ctx: &ApiContext, caller: &Caller, bytes: bytes::Bytes, params: MnfParams) -> ApiResult<Created> {
    super::formats::refuse_ortho(&params, "a .npy cube")?;
    if bytes.len() as u64 > ctx.config.max_upload_bytes {
        return Err(Error::too_large(format!(
            "the cube ({} bytes) exceeds the limit of {} bytes; {}",
            bytes.len(),
            ctx.config.max_upload_bytes,
            crate::config::UPLOAD_LIMIT_HINT
        )));
    }
    let token = format!("upload-{}", uuid::Uuid::now_v7());
    let _scratch = ScratchGuard { storage: ctx.runner.storage.clone(), token: token.clone() };
    // In strides, as a body would arrive (slices share the one buffer).
    const STRIDE: usize = 4 << 20;
    let len = bytes.len();
    let chunks: Vec<Result<bytes::Bytes, std::convert::Infallible>> =
        (0..len).step_by(STRIDE).map(|at| Ok(bytes.slice(at..(at + STRIDE).min(len)))).collect();
    npy_job(ctx, caller, params, futures::stream::iter(chunks), Some(len as u64), Claimed::default(), &token).await
}

/// The digests a client sent with a `.npy` body (hex), each checked against the body once received.
#[derive(Default)]
struct Claimed {
    sha256: Option<String>,
    cube: Option<String>,
}

impl Claimed {
    /// Refuses a cube whose content digest is not the one claimed.
    fn check_cube(&self, content: &[u8; 32]) -> ApiResult<()> {
        match &self.cube {
            Some(c) if *c != hex::encode(content) => {
                Err(Error::bad_request("digest_mismatch", "the cube's content digest differs from X-Cube-Digest"))
            }
            _ => Ok(()),
        }
    }
}

/// Receives a `.npy` stream into scratch under `token` (header checked before the bulk is read),
/// and enqueues it.
async fn npy_job<S, E>(
    ctx: &ApiContext,
    caller: &Caller,
    params: MnfParams,
    stream: S,
    announced: Option<u64>,
    claimed: Claimed,
    token: &str,
) -> ApiResult<Created>
where
    S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let dir = ctx.runner.storage.scratch_dir(token)?;
    let limit = ctx.config.max_upload_bytes;
    let claim_seen = std::sync::Mutex::new(None::<Claim>);
    let progress = Arc::new(upload::Progress::default());
    let mut feed = None;
    let path = dir.join("cube.npy");
    let mut check = |prefix: &[u8]| -> ApiResult<Option<Claim>> {
        let claim = upload::npy_claim(prefix, limit)?;
        if let Ok(mut seen) = claim_seen.lock() {
            *seen = claim;
        }
        if let (Some(c), Some(len)) = (claim, announced) {
            if c.total() != len {
                return Err(Error::bad_request(
                    "size_mismatch",
                    format!("the .npy header claims {} bytes in all but the body has {len}", c.total()),
                ));
            }
        }
        // A cube the job can take as it is: sent to the device while it arrives, if that pays.
        if let Some((c, (l, s, b, dtype))) = claim.and_then(|c| c.bip_le.map(|d| (c, d))) {
            let (lines, samples, bands) = (l as usize, s as usize, b as usize);
            if params.validate(lines, samples, bands).is_ok() {
                let claimed = feed::Claimed { lines, samples, bands, dtype, data_offset: c.offset, form: feed::Form::Npy };
                feed = Feed::start(&ctx.runner, params.backend, claimed, path.clone(), progress.clone());
            }
        }
        Ok(claim)
    };
    let mut budget = Budget::new(limit);
    let t = std::time::Instant::now();
    let body_sha256 = claimed.sha256.is_some();
    let received = upload::receive_unsynced(stream, path.clone(), &mut budget, Some(&mut check), None, body_sha256, Some(progress.clone())).await;
    let (got, sync) = received?;
    tracing::debug!(bytes = got.bytes, secs = t.elapsed().as_secs_f64(), "npy upload received and hashed");
    ctx.metrics.uploaded(got.bytes);
    // A little-endian C-order .npy: its header was checked, its size is exact, and its content
    // digest was computed on the way, so it is not decoded here (the worker decodes it).
    let digested = got.content_digest.zip(claim_seen.lock().ok().and_then(|c| c.and_then(|c| c.bip_le)));
    let checked = (|| -> ApiResult<Option<InputSummary>> {
        if let (Some(claimed), Some(sha)) = (&claimed.sha256, got.sha256) {
            if *claimed != hex::encode(sha) {
                return Err(Error::bad_request("digest_mismatch", "the body's SHA-256 differs from X-Content-SHA256"));
            }
        }
        let Some((content, (lines, samples, bands, dtype))) = digested else { return Ok(None) };
        let (lines, samples, bands) = (lines as usize, samples as usize, bands as usize);
        admit(ctx, &params, lines, samples, bands, None)?;
        claimed.check_cube(&content)?;
        Ok(Some(InputSummary { lines, samples, bands, data_type: dtype.name().to_string(), interleave: "bip".into() }))
    })();
    // Recorded only when the client sent it (and it was checked): what a later X-Content-SHA256 finds.
    let sha = claimed.sha256.clone();
    match (checked, digested) {
        (Ok(Some(input)), Some((content, _))) => {
            // A .npy has no wavelengths: its band count is what a given system is checked against.
            let params = match super::systems::bind(ctx, &caller.owner, params, input.bands, None).await {
                Ok(p) => p,
                Err(e) => {
                    let _ = sync.wait().await; // the scratch file is not removed under its sync
                    return Err(e);
                }
            };
            let fed = match feed.take() {
                Some(f) => f.finish().await,
                None => None,
            };
            let upload = Unsynced { token, kind: InputKind::Npy, files: &[got.path.as_path()], sync, fed };
            enqueue_unsynced(ctx, caller, CubeKey::of_npy(content), input, params, sha, upload).await
        }
        (Ok(_), _) => {
            sync.wait().await?;
            let location = format!("scratch/{token}");
            let (cube, params) = decode_and_validate(ctx, &caller.owner, InputKind::Npy, location, params).await?;
            let (digest, input) = digest_and_summary(&cube).await?;
            claimed.check_cube(&digest.content)?;
            enqueue(ctx, caller, digest, input, params, InputKind::Npy, sha, token).await
        }
        (Err(e), _) => {
            let _ = sync.wait().await; // the scratch file is not removed under its sync
            Err(e)
        }
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
    create_from_href(ctx, caller, &request.input.href, params).await
}

/// A job from files already on this instance's disk: a completed resumable upload (`api::tus`), its
/// `.npy` (`InputKind::Npy`), or its ENVI header and data file (`InputKind::Envi`, in that order, and
/// the GLT file of the EMIT granule it was decoded from, if any: `formats::GLT_FILE`). They
/// are linked into scratch under an upload's names (no copy), then checked, digested and enqueued as
/// `create_multipart` does, which moves them into the job's input. The caller removes its own names
/// of the files once this succeeded; a refusal leaves them as they were.
pub(crate) async fn create_from_files(ctx: &ApiContext, caller: &Caller, kind: InputKind, files: &[&Path], params: MnfParams) -> ApiResult<Created> {
    let names: &[&str] = if kind == InputKind::Envi { &["cube.hdr", "cube.img", super::formats::GLT_FILE] } else { &["cube.npy"] };
    let glt = usize::from(kind == InputKind::Envi);
    if !(names.len() - glt..=names.len()).contains(&files.len()) || kind == InputKind::Href {
        return Err(Error::internal(anyhow::anyhow!("create_from_files: {} file(s) for a {kind:?} input", files.len())));
    }
    let token = format!("upload-{}", uuid::Uuid::now_v7());
    let _scratch = ScratchGuard { storage: ctx.runner.storage.clone(), token: token.clone() };
    let dir = ctx.runner.storage.scratch_dir(&token)?;
    for (file, name) in files.iter().zip(names) {
        let to = dir.join(name);
        if std::fs::hard_link(file, &to).is_err() {
            // Another file system than the scratch area's: a copy, synced as an upload is.
            std::fs::copy(file, &to).and_then(|_| std::fs::File::open(&to)?.sync_all()).map_err(Error::disk)?;
        }
    }
    let (cube, params) = decode_and_validate(ctx, &caller.owner, kind, format!("scratch/{token}"), params).await?;
    let (digest, input) = digest_and_summary(&cube).await?;
    enqueue(ctx, caller, digest, input, params, kind, None, &token).await
}

/// Decodes the cube (off the async threads) and checks the parameters against its shape.
pub(super) async fn decode_and_validate(ctx: &ApiContext, owner: &str, kind: InputKind, location: String, params: MnfParams) -> ApiResult<(Arc<Cube>, MnfParams)> {
    let storage = ctx.runner.storage.clone();
    let t = std::time::Instant::now();
    let rt = tokio::runtime::Handle::current();
    let location_of_glt = location.clone();
    let cube = tokio::task::spawn_blocking(move || crate::jobs::input::load_cube(kind, &location, &storage, &rt))
        .await
        .map_err(Error::internal)?
        .map_err(|e| match e {
            // A file the client named (an ENVI header's missing data file, say) is the client's
            // problem; our own upload files failing to read is ours.
            crate::cube::CubeError::Io { .. } if kind == InputKind::Href => Error::bad_request("input_not_found", e.to_string()),
            other => Error::from(other),
        })?;
    tracing::debug!(secs = t.elapsed().as_secs_f64(), "input decoded");
    admit(ctx, &params, cube.lines(), cube.samples(), cube.bands(), cube.meta.bbl.as_deref())?;
    super::formats::check_ortho(ctx, &params, kind, &location_of_glt, &cube.meta).await?;
    let params = super::systems::bind(ctx, owner, params, cube.bands(), cube.meta.wavelength.as_deref()).await?;
    Ok((Arc::new(cube), params))
}

/// Refuses at submit what a job could only fail with: a backend this server does not have (as
/// `/v1/info` lists them), and what the cube's shape and `bbl` already doom (`MnfParams::admit`). The
/// codes are those the job would have failed with.
pub(super) fn admit(ctx: &ApiContext, params: &MnfParams, lines: usize, samples: usize, bands: usize, bbl: Option<&[bool]>) -> ApiResult<()> {
    check_backend(ctx, params)?;
    Ok(params.admit(lines, samples, bands, bbl)?)
}

/// The backend part of [`admit`], which a `.npy` body's parameters meet before its body is read.
fn check_backend(ctx: &ApiContext, params: &MnfParams) -> ApiResult<()> {
    ctx.runner
        .backends
        .available(params.backend)
        .map_err(|e| Error::unprocessable(e.code(), format!("{e} (GET /v1/info lists this server's backends)")))
}

/// What the job cache knows a decoded cube by: its content digest (samples, shape, type, bbl and
/// no-data), and the digest of the metadata its results carry (`CubeMeta::carried_digest`).
#[derive(Clone, Copy)]
pub(super) struct CubeKey {
    pub(super) content: [u8; 32],
    pub(super) carried: Option<[u8; 32]>,
}

impl CubeKey {
    /// A C-order `.npy`: a cube that carries no metadata into its results.
    fn of_npy(content: [u8; 32]) -> CubeKey {
        CubeKey { content, carried: None }
    }

    /// The result level's key: the cube's digests and the canonical parameters. A cube that carries no
    /// metadata has the digest jobs had before the carried metadata was keyed on, so their rows are
    /// still found; one that carries some is a different job from the same pixels under another header.
    pub(super) fn job_digest(&self, canonical_params: &str) -> String {
        let mut h = Sha256::new();
        h.update(b"hypermnf-job-v1");
        h.update(self.content);
        h.update(canonical_params.as_bytes());
        if let Some(carried) = self.carried {
            h.update(b"hypermnf-job-carried-v1");
            h.update(carried);
        }
        hex::encode(h.finalize())
    }
}

/// The cube's digests (off the async threads) and what the API shows about it.
pub(super) async fn digest_and_summary(cube: &Arc<Cube>) -> ApiResult<(CubeKey, InputSummary)> {
    let t = std::time::Instant::now();
    let digest = {
        let cube = cube.clone();
        tokio::task::spawn_blocking(move || cube.content_digest()).await.map_err(Error::internal)?
    };
    tracing::debug!(secs = t.elapsed().as_secs_f64(), "content digest");
    let digest = CubeKey { content: digest, carried: cube.meta.carried_digest() };
    Ok((digest, input_summary(cube)))
}

/// What the API shows about a decoded cube.
pub(super) fn input_summary(cube: &Cube) -> InputSummary {
    InputSummary {
        lines: cube.lines(),
        samples: cube.samples(),
        bands: cube.bands(),
        data_type: cube.dtype().name().to_string(),
        interleave: cube.meta.source_interleave.map(|i| i.name()).unwrap_or("bip").to_string(),
    }
}

/// The owner's job of this job digest, if any: the result level first (a succeeded job, checked against
/// its row), then the job store, which also knows the queued and running jobs the cache does not hold.
pub(super) async fn existing_job(ctx: &ApiContext, owner: &str, digest: &str) -> ApiResult<Option<Job>> {
    if let Some(job) = ctx.runner.cache.find_result(owner, digest).await? {
        return Ok(Some(job));
    }
    Ok(ctx.runner.store.find_live_by_digest(owner, digest).await?)
}

/// Enqueues an upload held in scratch under `token`.
#[allow(clippy::too_many_arguments)]
async fn enqueue(
    ctx: &ApiContext,
    caller: &Caller,
    cube: CubeKey,
    input: InputSummary,
    params: MnfParams,
    kind: InputKind,
    upload_sha256: Option<String>,
    scratch_token: &str,
) -> ApiResult<Created> {
    let id = uuid::Uuid::now_v7().to_string();
    enqueue_at(ctx, caller, cube, input, params, kind, upload_sha256, format!("uploads/{id}"), Some((scratch_token, id))).await
}

/// Answers with the caller's live job of the same digest, or stores the input at `location` (from
/// scratch, for uploads) and inserts a queued job.
#[allow(clippy::too_many_arguments)]
pub(super) async fn enqueue_at(
    ctx: &ApiContext,
    caller: &Caller,
    cube: CubeKey,
    input: InputSummary,
    params: MnfParams,
    kind: InputKind,
    upload_sha256: Option<String>,
    location: String,
    scratch: Option<(&str, String)>,
) -> ApiResult<Created> {
    // Bound already where the cube was decoded; a path that did not is bound here on the band count.
    let params = super::systems::bind(ctx, &caller.owner, params, input.bands, None).await?;
    let canonical = params::canonical(&params);
    let digest = cube.job_digest(&canonical);
    if let Some(job) = existing_job(ctx, &caller.owner, &digest).await? {
        ApiMetrics::add(&ctx.metrics.cache_hits, 1);
        return Created::existing(job);
    }
    let (id, token) = match scratch {
        Some((token, id)) => (id, Some(token)),
        None => (uuid::Uuid::now_v7().to_string(), None),
    };
    let new = new_job(id, caller, canonical, digest, cube.content, upload_sha256, input, kind, location);
    insert_stored(ctx, new, token, None).await
}

/// An upload whose files are in scratch under `token` (`cube.npy`, or `cube.hdr` and `cube.img`) and
/// digested, while `sync` still writes them to the disk.
pub(super) struct Unsynced<'a> {
    pub(super) token: &'a str,
    pub(super) kind: InputKind,
    pub(super) files: &'a [&'a Path],
    pub(super) sync: upload::Unsynced,
    /// The cube, sent to a device while it arrived (`jobs::feed`).
    pub(super) fed: Option<Arc<crate::cache::ResidentCube>>,
}

/// [`enqueue`] for an upload still being synced: when a worker is idle, the job starts computing on
/// the scratch files at once, while the disk catches up (`jobs::early`); the row is inserted, claimed
/// by this instance, once the upload is synced and stored, as always before the 202.
pub(super) async fn enqueue_unsynced(
    ctx: &ApiContext,
    caller: &Caller,
    cube: CubeKey,
    input: InputSummary,
    params: MnfParams,
    upload_sha256: Option<String>,
    upload: Unsynced<'_>,
) -> ApiResult<Created> {
    let (canonical, choice) = (params::canonical(&params), params.backend);
    let digest = cube.job_digest(&canonical);
    if let Some(job) = existing_job(ctx, &caller.owner, &digest).await? {
        let _ = upload.sync.wait().await; // the scratch file is not removed under its sync
        ApiMetrics::add(&ctx.metrics.cache_hits, 1);
        return Created::existing(job);
    }
    let id = uuid::Uuid::now_v7().to_string();
    let location = format!("uploads/{id}");
    let new = new_job(id, caller, canonical, digest, cube.content, upload_sha256, input, upload.kind, location);
    // Dropped (canceled, its scratch removed) if the upload is not accepted after all.
    let early = ctx.runner.start_early(&new, choice, upload.files, upload.fed);
    // The 202 waits for the upload's last bytes and its row to be synced: no result of an earlier
    // job is written back meanwhile (`Storage::pause_syncs`).
    let _quiet = ctx.runner.storage.pause_syncs();
    upload.sync.wait().await?;
    insert_stored(ctx, new, Some(upload.token), early).await
}

#[allow(clippy::too_many_arguments)]
fn new_job(
    id: String,
    caller: &Caller,
    canonical_params: String,
    digest: String,
    cube_digest: [u8; 32],
    upload_sha256: Option<String>,
    input: InputSummary,
    kind: InputKind,
    location: String,
) -> NewJob {
    NewJob {
        id,
        owner: caller.owner.clone(),
        params: canonical_params,
        digest,
        content_digest: Some(hex::encode(cube_digest)),
        upload_sha256,
        input,
        input_kind: kind,
        input_location: location,
    }
}

/// Stores the input from scratch under `token` (if any) at `new.input_location`, then inserts the
/// job: queued, or claimed by this instance when `early` already computes it. A live job of the same
/// owner and digest that was inserted meanwhile is answered instead (and `early` dropped).
pub(super) async fn insert_stored(ctx: &ApiContext, new: NewJob, token: Option<&str>, early: Option<EarlyRun>) -> ApiResult<Created> {
    let (location, new_id) = (new.input_location.clone(), new.id.clone());
    // The input is in its final place before the row exists: a queued job always has its input.
    if let Some(token) = token {
        let dir = ctx.runner.storage.scratch_dir(token)?;
        for name in ["cube.npy", "cube.hdr", "cube.img"] {
            let p = dir.join(name);
            if p.exists() {
                ctx.runner.storage.put_file(&p, &format!("{location}/{name}")).await?;
            }
        }
        // The files were synced where they were written; their new names too before the row, so
        // that an accepted job keeps its input through a power cut.
        ctx.runner.storage.sync_names(&location).await?;
        // An EMIT upload's GLT outlives the upload (removed once the job has run): its COG needs it.
        super::formats::store_glt(ctx, &dir, &new.id).await?;
    }
    let inserted = match &early {
        Some(_) => ctx.runner.store.insert_claimed(new, &ctx.runner.lease).await?,
        None => ctx.runner.store.insert(new).await?,
    };
    match inserted {
        Inserted::Created(job) => {
            ApiMetrics::add(&ctx.metrics.jobs_created, 1);
            match early {
                Some(run) => run.finish(job.clone()),
                None => ctx.runner.notify(),
            }
            Created::new(job)
        }
        Inserted::Existing(job) => {
            if token.is_some() {
                let _ = ctx.runner.storage.delete_prefix(&location).await;
                let _ = ctx.runner.storage.delete_prefix(&super::formats::glt_prefix(&new_id)).await;
            }
            ApiMetrics::add(&ctx.metrics.cache_hits, 1);
            Created::existing(job)
        }
    }
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
    cancel_or_delete(&ctx, job).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// What `cancel_or_delete` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// It was queued or running: now canceled (its row stays, status `canceled`).
    Canceled,
    /// It was finished: its row and files are gone.
    Deleted,
}

/// Cancels a queued or running job, or deletes a finished one with its files (`DELETE /v1/jobs/{id}`
/// and the OGC API's dismiss).
pub async fn cancel_or_delete(ctx: &ApiContext, job: Job) -> ApiResult<Removal> {
    if !job.status.is_finished() && ctx.runner.store.cancel(&job.id).await? {
        ctx.runner.cancel(&job.id);
        return Ok(Removal::Canceled);
    }
    // Finished (or finished in between): remove it and its files.
    ctx.runner.store.delete(&job.id).await?;
    ctx.runner.job_may_have_ended();
    purge_files(ctx, &job).await;
    Ok(Removal::Deleted)
}

/// Removes a job's stored upload and results (its row is already gone or going), and its job cache
/// entries.
pub async fn purge_files(ctx: &ApiContext, job: &Job) {
    ctx.runner.cache.forget_job(&job.id);
    let mut prefixes = vec![format!("results/{}", job.id), super::formats::glt_prefix(&job.id)];
    if job.input_kind != InputKind::Href {
        prefixes.push(job.input_location.clone());
    }
    for p in prefixes {
        if let Err(e) = ctx.runner.storage.delete_prefix(&p).await {
            tracing::warn!(job = %job.id, "cannot delete {p}: {e}");
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Downloads

pub fn require_succeeded(job: &Job) -> ApiResult<()> {
    match job.status {
        JobStatus::Succeeded => Ok(()),
        JobStatus::Queued | JobStatus::Running => {
            Err(Error::new(StatusCode::CONFLICT, "not_ready", format!("the job is {}; its result is not ready", job.status.as_str())))
        }
        s => Err(Error::new(StatusCode::CONFLICT, "no_result", format!("the job {} and has no result", match s {
            JobStatus::Failed => "failed",
            _ => "was canceled",
        }))),
    }
}

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
        // Jobs keep the ENVI header and the .npy; jobs of before 2026-11-25 stored the data file too.
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

/// Where the ENVI data file of a zip comes from.
enum EnviData<'a> {
    /// The stored `.img`.
    Stored(&'a str),
    /// Made from the stored `.npy` of the same values (`envi::write_f32_bsq_data_from_npy`).
    FromNpy(&'a str),
}

/// Zips the ENVI pair once (stored, not deflated: float samples hardly compress) and keeps the zip
/// beside the result; later downloads stream it.
async fn build_zip(ctx: &ApiContext, hdr_key: &str, data: EnviData<'_>, stem: &str, zip_key: &str) -> ApiResult<()> {
    let storage = ctx.runner.storage.clone();
    let token = format!("zip-{}", uuid::Uuid::now_v7());
    let dir = storage.scratch_dir(&token)?;
    let built = zip_in(&storage, hdr_key, data, stem, &dir).await;
    let r = match built {
        Ok(zip_path) => storage.put_file(&zip_path, zip_key).await.map_err(Error::from),
        Err(e) => Err(e),
    };
    storage.remove_scratch(&token);
    r
}

/// Writes the zip of the ENVI pair into `dir`; its path.
async fn zip_in(storage: &crate::storage::Storage, hdr_key: &str, data: EnviData<'_>, stem: &str, dir: &Path) -> ApiResult<PathBuf> {
    // Local files for the zip writer: the stored ones, or copies downloaded from S3 (gone when
    // dropped, after the zip is written).
    let hdr = storage.local_copy(hdr_key).await?;
    let (local, from_npy) = match data {
        EnviData::Stored(k) => (storage.local_copy(k).await?, false),
        EnviData::FromNpy(k) => (storage.local_copy(k).await?, true),
    };
    let stem = stem.to_string();
    let zip_path = dir.join("result.zip");
    let made_img = dir.join("result.img");
    let zp = zip_path.clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let img = if from_npy {
            crate::cube::envi::write_f32_bsq_data_from_npy(local.path(), &made_img)?;
            made_img
        } else {
            local.path().to_path_buf()
        };
        let f = std::fs::File::create(&zp)?;
        let mut z = zip::ZipWriter::new(std::io::BufWriter::new(f));
        for (src, name) in [(hdr.path(), format!("{stem}.hdr")), (img.as_path(), format!("{stem}.img"))] {
            let len = std::fs::metadata(src)?.len();
            let opts = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Stored)
                .large_file(len >= u32::MAX as u64);
            z.start_file(name, opts)?;
            std::io::copy(&mut std::fs::File::open(src)?, &mut z)?;
        }
        // On the disk before it is stored: it is served as it is from then on, unlike the job's
        // own results, which `jobs::result_sync` checks after a crash.
        z.finish()?.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        Ok(())
    })
    .await
    .map_err(Error::internal)?
    .map_err(Error::internal)?;
    Ok(zip_path)
}

pub(super) async fn stream(ctx: &ApiContext, key: &str, content_type: &'static str, filename: &str) -> ApiResult<Response> {
    let dl = ctx.runner.storage.get(key).await?;
    ctx.metrics.downloaded(dl.size);
    let mut r = Response::new(Body::from_stream(dl.stream));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(dl.size));
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{filename}\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(r)
}
