//! Hrefs: a cube named instead of sent. `file://` paths under an `--input-root` are read and
//! digested at submit, as an upload is; `s3://` and `https://` references (`crate::reference`) are
//! checked against the operator's allow-lists, and only their headers are read at submit (a ranged GET
//! or two): the worker reads the cube (`jobs::remote_input`).

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use axum::http::StatusCode;
use sha2::{Digest, Sha256};

use super::auth::Caller;
use super::error::{ApiResult, Error};
use super::intake::{admit, answer, decode_and_validate, digest_and_summary, enqueue_at, ScratchGuard};
use super::job_view::Created;
use crate::jobs::submit::{self, CubeKey};
use super::metrics::ApiMetrics;
use super::upload::{self, SMALL_BODY_MAX};
use super::{params, ApiContext};
use crate::cube::Cube;
use crate::jobs::{InputKind, InputSummary, NewJob};
use crate::mnf::MnfParams;
use crate::reference::fetch::Format;
use crate::reference::{envi_data_names, Object, ObjectVersion, RefError, Reference, Stored};

/// The API's answer for a reference that cannot be used.
pub fn refused(e: RefError) -> Error {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
    Error::new(status, e.code(), e.to_string())
}

/// A job from an href (`/v1/jobs`' JSON body, the OGC API's href inputs, batches): a `file://` URL
/// under an input root, or an `s3://` or `https://` reference the operator allows.
pub async fn create_from_href(ctx: &ApiContext, caller: &Caller, href: &str, params: MnfParams) -> ApiResult<Created> {
    match Reference::parse(href).map_err(refused)? {
        Some(r) => create_from_reference(ctx, caller, &r, params).await,
        None => create_from_file(ctx, caller, href, params).await,
    }
}

/// A job from a `file://` href under an input root.
async fn create_from_file(ctx: &ApiContext, caller: &Caller, href: &str, params: MnfParams) -> ApiResult<Created> {
    let path = resolve_href(href, &ctx.input_roots)?;
    let limit = ctx.config.max_upload_bytes;
    precheck_file(&path, limit)?;
    let location = path.to_str().ok_or_else(|| Error::bad_request("invalid_href", "the path is not UTF-8"))?.to_string();
    let (cube, params) = decode_and_validate(ctx, &caller.owner, InputKind::Href, location.clone(), params).await?;
    let (digest, input) = digest_and_summary(&cube).await?;
    enqueue_at(ctx, caller, digest, input, params, InputKind::Href, None, location, None).await
}

/// Checks a `file://` href: an absolute path without `..`, existing, and (after resolving symlinks)
/// inside one of the input roots, and so is every other file reading it opens (an ENVI header's data
/// file). Outside every root (or with no root configured) it is 403.
pub fn resolve_href(href: &str, roots: &[PathBuf]) -> ApiResult<PathBuf> {
    let bad = |m: &str| Error::bad_request("invalid_href", m.to_string());
    let rest = href.strip_prefix("file://").ok_or_else(|| bad("href must be file:///path (under an --input-root), s3://bucket/key or https://host/path"))?;
    let rest = rest.strip_prefix("localhost").unwrap_or(rest);
    if !rest.starts_with('/') {
        return Err(bad("href must be file:///absolute/path"));
    }
    let decoded = percent_encoding::percent_decode_str(rest).decode_utf8().map_err(|_| bad("href is not valid UTF-8 once decoded"))?;
    let path = PathBuf::from(decoded.as_ref());
    if path.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(bad("href must not contain `..`"));
    }
    if roots.is_empty() {
        return Err(Error::new(StatusCode::FORBIDDEN, "forbidden_path", "this server reads no files: it was started without --input-root"));
    }
    let canonical = path.canonicalize().map_err(|_| Error::bad_request("input_not_found", format!("{} does not exist or cannot be read", path.display())))?;
    if !roots.iter().any(|r| canonical.starts_with(r)) {
        return Err(Error::new(StatusCode::FORBIDDEN, "forbidden_path", "the file is outside every input root"));
    }
    if !canonical.is_file() {
        return Err(Error::bad_request("input_not_found", format!("{} is not a file", path.display())));
    }
    // Every other file reading the cube opens must be inside a root too, once its symlinks are
    // resolved: an ENVI header's data file is found beside the (resolved) header, under any of the
    // names the reader tries, and may be a symlink of its own. The reader itself says which file.
    let files = crate::cube::input_files(&canonical).map_err(|e| match e {
        crate::cube::CubeError::Io { .. } => Error::bad_request("input_not_found", e.to_string()),
        other => Error::from(other),
    })?;
    for file in files.iter().filter(|f| **f != canonical) {
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let resolved = file.canonicalize().map_err(|_| Error::bad_request("input_not_found", format!("{name} (beside the header) cannot be read")))?;
        if !roots.iter().any(|r| resolved.starts_with(r)) {
            return Err(Error::new(StatusCode::FORBIDDEN, "forbidden_path", format!("the data file {name} beside the header leads outside every input root")));
        }
    }
    Ok(canonical)
}

/// For a file on disk: the size its header claims must fit the limit before it is read.
pub(super) fn precheck_file(path: &Path, limit: u64) -> ApiResult<()> {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("npy") => {
            use std::io::Read;
            let mut f = std::fs::File::open(path).map_err(Error::internal)?;
            let mut head = Vec::new();
            f.by_ref().take(1 << 20).read_to_end(&mut head).map_err(Error::internal)?;
            upload::npy_claim(&head, limit)?;
        }
        Some("hdr") => {
            let meta = std::fs::metadata(path).map_err(Error::internal)?;
            if meta.len() > SMALL_BODY_MAX as u64 {
                return Err(Error::bad_request("invalid_header", "the ENVI header is larger than 1 MiB"));
            }
            // Lossily, as the ENVI reader itself reads it (a description in Latin-1 is no reason to refuse).
            let text = String::from_utf8_lossy(&std::fs::read(path).map_err(Error::internal)?).into_owned();
            upload::envi_claim(&text, limit)?;
        }
        _ => {
            if let Some(checked) = super::formats::precheck_href(path, limit) {
                return checked;
            }
            return Err(Error::unprocessable("unsupported", "the href must name an ENVI header (.hdr), a NumPy array (.npy), or NetCDF, HDF5 or GeoTIFF"));
        }
    }
    Ok(())
}

/// The first read of a referenced `.npy`: numpy's headers are a few hundred bytes.
const NPY_FIRST_READ: u64 = 4096;
/// The longest `.npy` header the reader takes, with its preamble.
const NPY_HEADER_MAX: u64 = (1 << 20) + 12;

/// A reference checked at submit: its objects and versions, the cube's shape, its header's wavelengths,
/// and the parameters validated and bound to it (`statistics_from`).
pub(crate) struct Checked {
    pub stored: Stored,
    pub input: InputSummary,
    pub wavelength: Option<Vec<f64>>,
    pub params: MnfParams,
}

/// What checking a reference came to: done from its header, or a GDAL format, which is read whole.
pub(crate) enum Checking {
    Done(Checked),
    Gdal(Object, ObjectVersion, MnfParams),
}

/// Checks an `s3://` or `https://` reference: the policy, the header (a ranged GET or two), the
/// parameters against it. Shared by single jobs and batches.
pub(crate) async fn check_reference(ctx: &ApiContext, owner: &str, r: &Reference, params: MnfParams) -> ApiResult<Checking> {
    // The COG of an ortho job is made from the GLT where the job's input is; a reference's is not
    // read again after the job (a granule is gigabytes).
    super::ortho::refuse_ortho(&params, "an s3:// or https:// reference")?;
    let name = r.file_name();
    let format = Format::of_name(&name)
        .ok_or_else(|| Error::unprocessable("unsupported", "the href must name an ENVI header (.hdr), a NumPy array (.npy), or NetCDF, HDF5 or GeoTIFF"))?;
    if let Format::Gdal(ext) = format {
        if !cfg!(feature = "gdal") {
            let kind =
                crate::cube::sniff::gdal_format(Path::new(&format!("x.{ext}"))).ok_or_else(|| Error::internal(anyhow::anyhow!("{ext} is no GDAL format")))?;
            return Err(crate::cube::needs_gdal(Path::new(&r.href()), kind).into());
        }
    }
    let refs = &ctx.runner.references;
    let object = refs.open(r).await.map_err(refused)?;
    let version = object.head().await.map_err(refused)?;
    let limit = ctx.config.max_upload_bytes;
    if version.size > limit.saturating_add(NPY_HEADER_MAX) {
        return Err(Error::too_large(format!(
            "{} holds {} bytes, past the limit of {limit} bytes; {}",
            version.href,
            version.size,
            crate::config::UPLOAD_LIMIT_HINT
        )));
    }
    let (stored, input, bbl, wavelength) = match format {
        Format::Npy => npy_reference(&object, version, limit).await?,
        Format::EnviHeader => envi_reference(ctx, r, &object, version, limit).await?,
        Format::Gdal(_) => return Ok(Checking::Gdal(object, version, params)),
    };
    admit(ctx, &params, input.lines, input.samples, input.bands, bbl.as_deref())?;
    let params = super::systems::bind(ctx, owner, params, input.bands, wavelength.as_deref()).await?;
    Ok(Checking::Done(Checked { stored, input, wavelength, params }))
}

/// A job from an `s3://` or `https://` reference: the policy is checked, the header read and the
/// parameters validated against it; the objects' sizes and versions are recorded with the job. A job
/// of the same objects (at the same versions) and parameters, or, once a worker has read them
/// (`reference_digests`), of the same cube, is answered instead. Nothing is written before the row.
async fn create_from_reference(ctx: &ApiContext, caller: &Caller, r: &Reference, params: MnfParams) -> ApiResult<Created> {
    let Checked { stored, input, params, .. } = match check_reference(ctx, &caller.owner, r, params).await? {
        Checking::Done(c) => c,
        Checking::Gdal(object, version, params) => return gdal_reference(ctx, caller, &object, version, params).await,
    };
    let canonical = params::canonical(&params);
    let key = stored.memo_key();
    let memo = ctx.runner.store.find_reference(&key).await?;
    let cube = memo.and_then(|m| {
        let content = crate::job_cache::keys::parse_hex(&m.content)?;
        let carried = match m.carried {
            Some(c) => Some(crate::job_cache::keys::parse_hex(&c)?),
            None => None,
        };
        Some(CubeKey { content, carried })
    });
    // The owner's job of this cube (as an upload's would be found), then of these objects.
    let by_objects = reference_job_digest(&key, &canonical);
    let digests = cube.map(|c| c.job_digest(&canonical)).into_iter().chain([by_objects.clone()]);
    for digest in digests {
        if let Some(job) = submit::existing_job(&ctx.runner, &caller.owner, &digest).await? {
            ApiMetrics::add(&ctx.metrics.cache_hits, 1);
            return Created::existing(job);
        }
    }
    let new = NewJob {
        id: uuid::Uuid::now_v7().to_string(),
        owner: caller.owner.clone(),
        params: canonical.clone(),
        digest: cube.map(|c| c.job_digest(&canonical)).unwrap_or(by_objects),
        content_digest: cube.map(|c| hex::encode(c.content)),
        upload_sha256: None,
        input,
        input_kind: InputKind::Href,
        input_location: stored.to_location(),
    };
    Ok(answer(ctx, submit::insert_stored(&ctx.runner, new, None, None).await?))
}

/// The job digest of a reference whose cube is not known yet: its objects and versions, and the
/// parameters.
fn reference_job_digest(memo_key: &str, canonical_params: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"hypermnf-reference-job-v1");
    h.update((memo_key.len() as u64).to_le_bytes());
    h.update(memo_key.as_bytes());
    h.update(canonical_params.as_bytes());
    hex::encode(h.finalize())
}

/// What a reference's header says: its objects, the cube's shape, `bbl` and wavelengths.
type ReferenceHeader = (Stored, InputSummary, Option<Vec<bool>>, Option<Vec<f64>>);

/// A `.npy` object: its header (one ranged GET, two for a long header) must describe a cube of
/// exactly the object's size.
async fn npy_reference(object: &Object, version: ObjectVersion, limit: u64) -> ApiResult<ReferenceHeader> {
    let mut head = object.get_range(0..version.size.min(NPY_FIRST_READ), &version).await.map_err(refused)?;
    if crate::cube::npy::read_header(&mut &head[..]).is_err() && head.len() as u64 == NPY_FIRST_READ {
        head = object.get_range(0..version.size.min(NPY_HEADER_MAX), &version).await.map_err(refused)?;
    }
    let claim = upload::npy_claim(&head, limit)?.ok_or_else(|| Error::bad_request("invalid_npy", "not a .npy header"))?;
    if claim.total() != version.size {
        return Err(Error::bad_request(
            "size_mismatch",
            format!("the .npy header claims {} bytes in all but {} holds {}", claim.total(), version.href, version.size),
        ));
    }
    let h = crate::cube::npy::read_header(&mut &head[..])?;
    let [lines, samples, bands] = h.cube_shape()?;
    let input = InputSummary {
        lines: lines as usize,
        samples: samples as usize,
        bands: bands as usize,
        data_type: h.dtype.name().to_string(),
        interleave: "bip".into(),
    };
    Ok((Stored { object: version, data: None }, input, None, None))
}

/// An ENVI header object: read whole (at most 1 MiB) and parsed; its data object is the first of
/// the names the local reader tries that exists beside it, and must hold what the header claims.
async fn envi_reference(
    ctx: &ApiContext,
    r: &Reference,
    object: &Object,
    version: ObjectVersion,
    limit: u64,
) -> ApiResult<ReferenceHeader> {
    if version.size > SMALL_BODY_MAX as u64 {
        return Err(Error::bad_request("invalid_header", "the ENVI header is larger than 1 MiB"));
    }
    let bytes = object.get_range(0..version.size, &version).await.map_err(refused)?;
    // Lossily, as the ENVI reader itself reads it.
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let claim = upload::envi_claim(&text, limit)?.ok_or_else(|| Error::bad_request("invalid_header", "not an ENVI header"))?;
    let h = crate::cube::envi::parse_header(&text)?;
    let names = envi_data_names(&r.file_name());
    let mut data = None;
    for name in &names {
        let candidate = ctx.runner.references.open(&r.sibling(name)).await.map_err(refused)?;
        match candidate.head().await {
            Ok(v) => {
                data = Some(v);
                break;
            }
            Err(RefError::NotFound(_)) => continue,
            Err(e) => return Err(refused(e)),
        }
    }
    let data =
        data.ok_or_else(|| Error::new(StatusCode::NOT_FOUND, "input_not_found", format!("no data object beside the header (tried {})", names.join(", "))))?;
    if data.size < claim.total() {
        return Err(Error::bad_request("size_mismatch", format!("the header claims {} bytes of data but {} holds {}", claim.total(), data.href, data.size)));
    }
    let input = InputSummary {
        lines: h.lines,
        samples: h.samples,
        bands: h.bands,
        data_type: h.data_type.name().to_string(),
        interleave: h.interleave.name().to_string(),
    };
    Ok((Stored { object: version, data: Some(data) }, input, h.meta.bbl.clone(), h.meta.wavelength.clone()))
}

/// A NetCDF, HDF5 or GeoTIFF object (a `gdal` build) as a single job: decoded at submit
/// ([`decode_gdal_object`]) and digested as a `file://` href's file is, its digest remembered (a later
/// request of the same objects finds the cube's jobs, as an upload's would); the worker reads it again.
async fn gdal_reference(ctx: &ApiContext, caller: &Caller, object: &Object, version: ObjectVersion, params: MnfParams) -> ApiResult<Created> {
    let (cube, params, stored) = decode_gdal_object(ctx, &caller.owner, object, version, params).await?;
    let (key, input) = digest_and_summary(&cube).await?;
    let carried = key.carried.map(hex::encode);
    ctx.runner.store.remember_reference(&stored.memo_key(), &hex::encode(key.content), carried.as_deref()).await?;
    enqueue_at(ctx, caller, key, input, params, InputKind::Href, None, stored.to_location(), None).await
}

/// Reads a NetCDF, HDF5 or GeoTIFF object whole into scratch (GDAL needs the whole file to say what it
/// holds), decodes it and checks the parameters against it as a `file://` href's file is checked. The
/// scratch is removed before this returns, however it ends: GDAL's readers hold the decoded cube in
/// memory. Returns the cube, the bound parameters and the object as the job records it. Shared by
/// single jobs and batches.
pub(crate) async fn decode_gdal_object(
    ctx: &ApiContext,
    owner: &str,
    object: &Object,
    version: ObjectVersion,
    params: MnfParams,
) -> ApiResult<(Arc<Cube>, MnfParams, Stored)> {
    let name = match Format::of_name(&object.href()) {
        Some(Format::Gdal(ext)) => format!("cube.{ext}"),
        _ => return Err(Error::internal(anyhow::anyhow!("{} is not a GDAL format", object.href()))),
    };
    // The guard also covers a request dropped mid-way (its client gone), not only a refusal.
    let (token, _scratch) = ScratchGuard::with_prefix(ctx, "ref");
    let dir = ctx.runner.storage.scratch_dir(&token)?;
    let path = crate::reference::fetch::download(object, &version, dir.join(name)).await.map_err(|e| match e {
        crate::reference::fetch::LoadError::Reference(r) => refused(r),
        crate::reference::fetch::LoadError::Cube(c) => Error::from(c),
    })?;
    let location = path.to_str().ok_or_else(|| Error::internal(anyhow::anyhow!("scratch path is not UTF-8")))?.to_string();
    // The reader's messages name the file: the client's reference, not this server's scratch path.
    let (cube, params) = decode_and_validate(ctx, owner, InputKind::Href, location.clone(), params).await.map_err(|e| e.naming(&location, &version.href))?;
    Ok((cube, params, Stored { object: version, data: None }))
}
