//! What every way of creating a job shares once its input is in hand (an upload in scratch, files
//! on this instance's disk, a reference): the cube decoded and digested, the parameters admitted and
//! bound, and the job handed to `jobs::submit`, whose outcome is answered as a [`Created`].

use std::path::Path;
use std::sync::Arc;

use axum::http::{header, HeaderMap};

use super::auth::Caller;
use super::error::{ApiResult, Error};
use super::job_view::Created;
use super::metrics::ApiMetrics;
use super::upload;
use super::{params, ApiContext};
use crate::cube::Cube;
use crate::jobs::submit::{self, CubeKey};
use crate::jobs::{Inserted, InputKind, InputSummary, NewJob};
use crate::mnf::MnfParams;

/// Removes an upload's scratch files (under its token) however its request ends: answered, refused,
/// timed out or dropped with its connection. Accepted inputs were moved out of scratch before.
pub(super) struct ScratchGuard {
    storage: crate::storage::Storage,
    token: String,
}

impl ScratchGuard {
    /// A fresh upload token, and its guard.
    pub(super) fn new(ctx: &ApiContext) -> (String, ScratchGuard) {
        Self::with_prefix(ctx, "upload")
    }

    /// A fresh token `<prefix>-<uuid>` (what the scratch holds it for), and its guard.
    pub(super) fn with_prefix(ctx: &ApiContext, prefix: &str) -> (String, ScratchGuard) {
        let token = format!("{prefix}-{}", uuid::Uuid::now_v7());
        (token.clone(), ScratchGuard { storage: ctx.runner.storage.clone(), token })
    }
}

impl Drop for ScratchGuard {
    fn drop(&mut self) {
        self.storage.remove_scratch(&self.token);
    }
}

/// The request's `Content-Length`, when it has a valid one.
pub(super) fn content_length(h: &HeaderMap) -> Option<u64> {
    h.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse().ok())
}

/// A job from files already on this instance's disk: a completed resumable upload (`api::tus`), its
/// `.npy` (`InputKind::Npy`), or its ENVI header and data file (`InputKind::Envi`, in that order, and
/// the GLT file of the EMIT granule it was decoded from, if any: `jobs::geometry::GLT_FILE`). They
/// are linked into scratch under an upload's names (no copy), then checked, digested and enqueued as
/// a multipart upload is (`envi_upload`), which moves them into the job's input. The caller removes its own names
/// of the files once this succeeded; a refusal leaves them as they were.
pub(crate) async fn create_from_files(ctx: &ApiContext, caller: &Caller, kind: InputKind, files: &[&Path], params: MnfParams) -> ApiResult<Created> {
    let names: &[&str] = if kind == InputKind::Envi { &["cube.hdr", "cube.img", crate::jobs::GLT_FILE] } else { &["cube.npy"] };
    let glt = usize::from(kind == InputKind::Envi);
    if !(names.len() - glt..=names.len()).contains(&files.len()) || kind == InputKind::Href {
        return Err(Error::internal(anyhow::anyhow!("create_from_files: {} file(s) for a {kind:?} input", files.len())));
    }
    let (token, _scratch) = ScratchGuard::new(ctx);
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
    let (location, scratch) = upload_place(&token);
    enqueue_at(ctx, caller, digest, input, params, kind, None, location, scratch).await
}

/// Decodes the cube (off the async threads) and checks the parameters against its shape.
pub(super) async fn decode_and_validate(ctx: &ApiContext, owner: &str, kind: InputKind, location: String, params: MnfParams) -> ApiResult<(Arc<Cube>, MnfParams)> {
    let storage = ctx.runner.storage.clone();
    let t = std::time::Instant::now();
    let rt = tokio::runtime::Handle::current();
    let location_of_glt = location.clone();
    let cube = tokio::task::spawn_blocking(move || crate::jobs::load_cube(kind, &location, &storage, &rt))
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
    super::ortho::check_ortho(ctx, &params, kind, &location_of_glt, &cube.meta).await?;
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
pub(super) fn check_backend(ctx: &ApiContext, params: &MnfParams) -> ApiResult<()> {
    ctx.runner
        .backends
        .available(params.backend)
        .map_err(|e| Error::unprocessable(e.code(), format!("{e} (GET /v1/info lists this server's backends)")))
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

/// Where an upload held in scratch under `scratch_token` is stored, and its job's id: the `location`
/// and `scratch` of [`enqueue_at`] for an upload.
pub(super) fn upload_place(scratch_token: &str) -> (String, Option<(&str, String)>) {
    let id = uuid::Uuid::now_v7().to_string();
    (format!("uploads/{id}"), Some((scratch_token, id)))
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
    let (id, token) = match scratch {
        Some((token, id)) => (id, Some(token)),
        None => (uuid::Uuid::now_v7().to_string(), None),
    };
    let new = new_job(id, caller, canonical, digest, cube.content, upload_sha256, input, kind, location);
    Ok(answer(ctx, submit::enqueue(&ctx.runner, new, token).await?))
}

/// An upload whose files are in scratch under `token` (`cube.npy`, or `cube.hdr` and `cube.img`) and
/// digested, while `sync` still writes them to the disk.
pub(super) struct Unsynced<'a> {
    pub(super) token: &'a str,
    pub(super) kind: InputKind,
    pub(super) files: &'a [&'a Path],
    pub(super) sync: upload::Unsynced,
    /// The cube, sent to a device while it arrived (`jobs::upload_to_device`).
    pub(super) fed: Option<Arc<crate::job_cache::ResidentCube>>,
}

/// [`enqueue_at`] for an upload still being synced: when a worker is idle, the job starts computing on
/// the scratch files at once, while the disk catches up (`jobs::early_start`); the row is inserted, claimed
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
    if let Some(job) = submit::existing_job(&ctx.runner, &caller.owner, &digest).await? {
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
    Ok(answer(ctx, submit::insert_stored(&ctx.runner, new, Some(upload.token), early).await?))
}

/// The row of a job about to be created.
#[allow(clippy::too_many_arguments)]
pub(super) fn new_job(
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

/// The answer to an insert: the new job (counted as created), or the owner's live job of the same
/// digest found instead (a cache hit).
pub(super) fn answer(ctx: &ApiContext, inserted: Inserted) -> Created {
    match inserted {
        Inserted::Created(job) => {
            ApiMetrics::add(&ctx.metrics.jobs_created, 1);
            Created { job, cached: false, ran_at_once: false }
        }
        Inserted::Existing(job) => {
            ApiMetrics::add(&ctx.metrics.cache_hits, 1);
            Created { job, cached: true, ran_at_once: false }
        }
    }
}
