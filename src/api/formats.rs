//! The service's side of the formats read and written through GDAL (feature `gdal`):
//! - `GET /v1/jobs/{id}/result?format=cog` (and `&product=denoised`): the result as a Cloud-Optimized
//!   GeoTIFF, made once from the stored `.npy` and metadata JSON (whose `source` keeps the input's
//!   `map info` and WKT) and kept beside them, as the ENVI zip is;
//! - `href` inputs in NetCDF, HDF5 or GeoTIFF: the size their header claims is checked before the file
//!   is read, as for ENVI and `.npy`;
//! - a single-file upload to `POST /v1/jobs` with its media type (`application/x-netcdf`,
//!   `application/x-hdf5`, `image/tiff`): decoded once into an ENVI pair (BIP, every piece of metadata the
//!   reader gave, as the ENVI writer carries it) and submitted as a multipart ENVI upload is
//!   (`intake::create_from_files`): from there on it is an ordinary stored input, digested, cached and read
//!   by the workers without GDAL;
//! - `ortho=true` (an EMIT granule): the COG result on the granule's north-up grid, its GLT applied as
//!   `hypermnf run --ortho` applies it. The GLT is read from the file of a `file://` href; an upload's
//!   is written beside the decoded pair (`GLT_FILE`) and kept with the job (`jobs::geometry`), since the
//!   upload is removed once the job has run. Refused (422), never ignored, where there is no GLT or the
//!   result is asked for in another format;
//! - on a build without GDAL, both answer 415 naming the feature.

use axum::extract::Request;
use axum::response::Response;

use super::error::{ApiResult, Error};
use super::ApiContext;
use crate::cube::sniff::GdalFormat;
use crate::jobs::GLT_FILE;
use crate::jobs::Job;

/// The GDAL format of an upload's media type (its parameters ignored), if it is one.
pub(super) fn upload_format(mime: &str) -> Option<GdalFormat> {
    match mime.split(';').next().unwrap_or("").trim() {
        "application/x-netcdf" | "application/netcdf" | "application/x-netcdf4" => Some(GdalFormat::NetCdf),
        "application/x-hdf5" | "application/x-hdf" | "application/x-hdf-eos5" => Some(GdalFormat::Hdf5),
        "image/tiff" | "image/geotiff" => Some(GdalFormat::Tiff),
        _ => None,
    }
}

/// `POST /v1/jobs` with a NetCDF, HDF5 or GeoTIFF body: see the module doc. The body goes to scratch
/// under `token` (removed by the caller however the request ends).
pub(super) async fn create_upload(
    ctx: &ApiContext,
    caller: &super::auth::Caller,
    query: Option<&str>,
    req: Request,
    token: &str,
    format: GdalFormat,
) -> ApiResult<super::job_view::Created> {
    if !cfg!(feature = "gdal") {
        // Refused before the body is read.
        return Err(Error::from(crate::cube::needs_gdal(std::path::Path::new("the upload"), format)));
    }
    let params = super::params::from_query(query)?;
    if params.ortho && format != GdalFormat::NetCdf {
        return Err(super::ortho::no_glt("a HDF5 or GeoTIFF upload"));
    }
    let dir = ctx.runner.storage.scratch_dir(token)?;
    let ext = match format {
        GdalFormat::NetCdf => "nc",
        GdalFormat::Hdf5 => "h5",
        GdalFormat::Tiff => "tif",
    };
    let upload = dir.join(format!("upload.{ext}"));
    let limit = ctx.config.max_upload_bytes;
    let received = receive(req, &upload, limit).await?;
    super::metrics::ApiMetrics::add(&ctx.metrics.bytes_in, received);
    let (hdr, img, glt) = (dir.join("decoded.hdr"), dir.join("decoded.img"), dir.join(GLT_FILE));
    let glt = decode_to_envi(upload, hdr.clone(), limit, format, params.ortho.then_some(glt)).await?;
    let mut files = vec![hdr.as_path(), img.as_path()];
    files.extend(glt.as_deref());
    super::intake::create_from_files(ctx, caller, crate::jobs::InputKind::Envi, &files, params).await
}

/// The parameters a job was made with.
fn job_params(job: &Job) -> ApiResult<crate::mnf::MnfParams> {
    serde_json::from_str(&job.params).map_err(|e| Error::internal(anyhow::anyhow!("job {}: its params do not parse: {e}", job.id)))
}

/// An `ortho=true` job's result is the orthorectified COG: its `.npy` or ENVI download (in sensor
/// geometry) is refused rather than given as if it were that.
pub(super) fn refuse_sensor_download(job: &Job) -> ApiResult<()> {
    if job_params(job)?.ortho {
        return Err(Error::unprocessable(
            "ortho_needs_cog",
            "this job was made with ortho=true, whose result is a GeoTIFF on the granule's north-up grid: ask format=cog",
        ));
    }
    Ok(())
}

/// Streams the body into `path`, at most `limit` bytes.
async fn receive(req: Request, path: &std::path::Path, limit: u64) -> ApiResult<u64> {
    use futures::StreamExt as _;
    use tokio::io::AsyncWriteExt as _;
    let mut file = tokio::fs::File::create(path).await.map_err(Error::disk)?;
    let mut body = req.into_body().into_data_stream();
    let mut n = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| Error::bad_request("incomplete_body", format!("the request body was interrupted: {e}")))?;
        n += chunk.len() as u64;
        if n > limit {
            return Err(Error::too_large(format!("the body exceeds the limit of {limit} bytes; {}", crate::config::UPLOAD_LIMIT_HINT)));
        }
        file.write_all(&chunk).await.map_err(Error::disk)?;
    }
    file.flush().await.map_err(Error::disk)?;
    if n == 0 {
        return Err(Error::bad_request("empty_body", "the upload is empty"));
    }
    Ok(n)
}

/// Decodes the upload into the ENVI pair at `hdr`, and, with `glt`, the EMIT granule's GLT into that
/// file (None when the upload has none: `ortho::check_ortho` refuses the job then). Returns the GLT file.
#[cfg(feature = "gdal")]
async fn decode_to_envi(
    upload: std::path::PathBuf,
    hdr: std::path::PathBuf,
    limit: u64,
    format: GdalFormat,
    glt: Option<std::path::PathBuf>,
) -> ApiResult<Option<std::path::PathBuf>> {
    tokio::task::spawn_blocking(move || -> ApiResult<Option<std::path::PathBuf>> {
        // The reader's messages name the file: the client's upload, not this server's scratch path.
        let scrub = |e: crate::cube::CubeError| Error::from(e).naming(&upload.display().to_string(), "the upload");
        let claimed = crate::cube::gdal::claimed_bytes(&upload).map_err(scrub)?;
        if claimed > limit {
            return Err(Error::too_large(format!("the file's arrays hold up to {claimed} bytes of samples, beyond this server's limit of {limit} bytes")));
        }
        let cube = crate::cube::gdal::read(&upload, format).map_err(scrub)?;
        let order = cube.byte_order();
        crate::cube::envi::write_cube(&hdr, &cube, crate::cube::Interleave::Bip, order).map_err(Error::internal)?;
        let glt = match glt {
            Some(path) if cube.meta.extra_value(super::ortho::GLT_KEY).is_some() => {
                let table = crate::cube::gdal::emit::read_glt(&upload, cube.lines(), cube.samples()).map_err(scrub)?;
                crate::cube::gdal::emit::write_glt_file(&table, &path).map_err(Error::internal)?;
                Some(path)
            }
            _ => None,
        };
        // The decoded pair is what the job keeps; the upload itself is not needed any more.
        let _ = std::fs::remove_file(&upload);
        Ok(glt)
    })
    .await
    .map_err(Error::internal)?
}

#[cfg(not(feature = "gdal"))]
async fn decode_to_envi(
    upload: std::path::PathBuf,
    _: std::path::PathBuf,
    _: u64,
    format: GdalFormat,
    _: Option<std::path::PathBuf>,
) -> ApiResult<Option<std::path::PathBuf>> {
    Err(Error::from(crate::cube::needs_gdal(&upload, format)))
}

/// The media type of a COG result (as the OGC process advertises it).
pub const COG_MEDIA_TYPE: &str = "image/tiff; application=geotiff; profile=cloud-optimized";

/// For an `href` in a GDAL format: the cube its header claims must fit `limit` before it is read.
/// None when `path` is not in such a format (the caller goes on with its own checks).
pub(super) fn precheck_href(path: &std::path::Path, limit: u64) -> Option<ApiResult<()>> {
    let format = crate::cube::sniff::gdal_format(path)?;
    Some(precheck(path, format, limit))
}

#[cfg(feature = "gdal")]
fn precheck(path: &std::path::Path, _format: GdalFormat, limit: u64) -> ApiResult<()> {
    let claimed = crate::cube::gdal::claimed_bytes(path).map_err(Error::from)?;
    if claimed > limit {
        return Err(Error::too_large(format!(
            "{}: its arrays hold up to {claimed} bytes of samples, beyond this server's limit of {limit} bytes",
            path.display()
        )));
    }
    Ok(())
}

#[cfg(not(feature = "gdal"))]
fn precheck(path: &std::path::Path, format: GdalFormat, _limit: u64) -> ApiResult<()> {
    Err(Error::from(crate::cube::needs_gdal(path, format)))
}

/// Streams the COG of `job`'s components (or denoised cube), making it first if it is not stored yet.
/// `npy_key` is the stored result it is made from; `stem` names the download.
pub(super) async fn cog_result(ctx: &ApiContext, job: &Job, npy_key: &str, denoised: bool, stem: &str) -> ApiResult<Response> {
    let cog_key = format!("results/{}/{stem}.tif", job.id);
    if ctx.runner.storage.size(&cog_key).await.is_err() {
        build_cog(ctx, job, npy_key, denoised, &cog_key).await?;
    }
    super::job_view::stream(ctx, &cog_key, COG_MEDIA_TYPE, &format!("{stem}.tif")).await
}

#[cfg(feature = "gdal")]
async fn build_cog(ctx: &ApiContext, job: &Job, npy_key: &str, denoised: bool, cog_key: &str) -> ApiResult<()> {
    use crate::jobs::product;
    let storage = ctx.runner.storage.clone();
    let md_key = job.results.get(product::METADATA).ok_or_else(|| Error::internal(anyhow::anyhow!("job {} has no metadata", job.id)))?;
    let md_bytes = storage.get_bytes(md_key).await?;
    let md: crate::mnf::result::Metadata = serde_json::from_slice(&md_bytes).map_err(Error::internal)?;
    let npy = storage.local_copy(npy_key).await?;
    let ortho = match job_params(job)?.ortho {
        true => Some(glt_source(ctx, job).await?),
        false => None,
    };
    let token = format!("cog-{}", uuid::Uuid::now_v7());
    let dir = storage.scratch_dir(&token)?;
    let out = dir.join("result.tif");
    let o = out.clone();
    let made = tokio::task::spawn_blocking(move || -> Result<(), crate::cube::CubeError> {
        let cube = crate::cube::npy::read(npy.path())?;
        let values: Vec<f32> = cube.to_f64().into_iter().map(|v| v as f32).collect();
        let source = crate::output::cog::source_meta(&md);
        let k = md.components;
        let meta = if denoised { crate::output::cog::denoised_meta(&md, k, &source) } else { crate::output::cog::components_meta(&md, k) };
        let glt = match &ortho {
            Some(GltSource::Granule(p)) => Some(crate::cube::gdal::emit::read_glt(p, cube.lines(), cube.samples())?),
            Some(GltSource::Stored(f)) => Some(crate::cube::gdal::emit::read_glt_file(f.path(), cube.lines(), cube.samples())?),
            None => None,
        };
        let grid = match &glt {
            Some(glt) => crate::output::cog::Grid::Ortho(glt),
            None => crate::output::cog::Grid::Source,
        };
        crate::output::cog::write(&o, &values, cube.lines(), cube.samples(), cube.bands(), meta, &source, &grid)
    })
    .await
    .map_err(Error::internal)?
    .map_err(Error::internal);
    let r = match made {
        Ok(()) => storage.put_file(&out, cog_key).await.map_err(Error::from),
        Err(e) => Err(e),
    };
    storage.remove_scratch(&token);
    r
}

/// Where an `ortho=true` job's GLT is read from.
#[cfg(feature = "gdal")]
enum GltSource {
    /// The EMIT granule a `file://` href named.
    Granule(std::path::PathBuf),
    /// The GLT file kept with the job (an upload).
    Stored(crate::storage::LocalFile),
}

#[cfg(feature = "gdal")]
async fn glt_source(ctx: &ApiContext, job: &Job) -> ApiResult<GltSource> {
    match job.input_kind {
        crate::jobs::InputKind::Href => Ok(GltSource::Granule(job.input_location.clone().into())),
        _ => Ok(GltSource::Stored(crate::jobs::kept_glt(&ctx.runner.storage, &job.id).await?)),
    }
}

#[cfg(not(feature = "gdal"))]
async fn build_cog(_: &ApiContext, _: &Job, _: &str, _: bool, cog_key: &str) -> ApiResult<()> {
    Err(Error::from(crate::cube::needs_gdal(std::path::Path::new(cog_key), GdalFormat::Tiff)))
}
