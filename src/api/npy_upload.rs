//! A job from a `.npy` body (`POST /v1/jobs` with `application/x-npy`), or from `.npy` bytes already
//! in memory (the OGC API's inline values). The header is checked before the bulk is read, the
//! content digest computed while the body arrives, and a body whose cube this owner already has a job
//! of (`X-Cube-Digest`, `X-Content-SHA256`) is not read at all.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;

use super::auth::Caller;
use super::error::{ApiResult, Error};
use super::intake::{admit, answer, check_backend, content_length, decode_and_validate, digest_and_summary, enqueue_at, enqueue_unsynced, new_job, upload_place, ScratchGuard, Unsynced};
use super::job_view::{job_response, Created};
use super::metrics::ApiMetrics;
use super::upload::{self, Budget, Claim};
use super::{params, ApiContext};
use crate::jobs::submit::{self, CubeKey};
use crate::jobs::upload_to_device::{self, Feed};
use crate::jobs::{InputKind, InputSummary};
use crate::mnf::MnfParams;

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

pub(super) async fn create(ctx: &ApiContext, caller: &Caller, query: Option<&str>, req: Request, token: &str) -> ApiResult<Response> {
    let params = params::from_query(query)?;
    check_backend(ctx, &params)?;
    super::ortho::refuse_ortho(&params, "a .npy cube")?;
    let canonical = params::canonical(&params);
    let claimed_sha = hex_digest_header(req.headers(), CONTENT_SHA256, "X-Content-SHA256")?;
    let claimed_cube = hex_digest_header(req.headers(), CUBE_DIGEST, "X-Cube-Digest")?;
    // A job this owner already has for the claimed cube (or body) is answered without the body.
    let cube_key = claimed_cube.as_deref().and_then(|c| hex::decode(c).ok()).and_then(|v| <[u8; 32]>::try_from(v).ok());
    let known = match (&claimed_sha, cube_key) {
        (_, Some(cube)) => submit::existing_job(&ctx.runner, &caller.owner, &CubeKey::of_npy(cube).job_digest(&canonical)).await?,
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
/// (`jobs::resident_run`): the job, already succeeded; None when the body is needed. Parameters that do
/// not suit the cube are refused here, before the body is sent.
async fn run_on_resident(ctx: &ApiContext, caller: &Caller, cube: [u8; 32], params: &MnfParams) -> ApiResult<Option<Created>> {
    if !crate::jobs::can_run_resident(&ctx.runner, params.backend) {
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
    match crate::jobs::run_resident(&ctx.runner, new, &earlier, params).await {
        None => Ok(None),
        Some(inserted) => {
            let mut created = answer(ctx, inserted?);
            created.ran_at_once = !created.cached;
            Ok(Some(created))
        }
    }
}

/// A job from `.npy` bytes already in memory (the OGC API's inline values), through the same checks
/// and digests as a `.npy` body.
pub async fn create_from_npy_bytes(ctx: &ApiContext, caller: &Caller, bytes: bytes::Bytes, params: MnfParams) -> ApiResult<Created> {
    super::ortho::refuse_ortho(&params, "a .npy cube")?;
    if bytes.len() as u64 > ctx.config.max_upload_bytes {
        return Err(Error::too_large(format!(
            "the cube ({} bytes) exceeds the limit of {} bytes; {}",
            bytes.len(),
            ctx.config.max_upload_bytes,
            crate::config::UPLOAD_LIMIT_HINT
        )));
    }
    let (token, _scratch) = ScratchGuard::new(ctx);
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
                let claimed = upload_to_device::Claimed { lines, samples, bands, dtype, data_offset: c.offset, form: upload_to_device::Form::Npy };
                feed = Feed::start(&ctx.runner, params.backend, claimed, path.clone(), progress.clone());
            }
        }
        Ok(claim)
    };
    let mut budget = Budget::new(limit);
    let t = std::time::Instant::now();
    let body_sha256 = claimed.sha256.is_some();
    let alongside = upload::Alongside { body_sha256, progress: Some(progress.clone()), content: None };
    let received = upload::receive_unsynced(stream, path.clone(), &mut budget, Some(&mut check), None, alongside).await;
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
            let (location, scratch) = upload_place(token);
            enqueue_at(ctx, caller, digest, input, params, InputKind::Npy, sha, location, scratch).await
        }
        (Err(e), _) => {
            let _ = sync.wait().await; // the scratch file is not removed under its sync
            Err(e)
        }
    }
}
