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
//! - on a build without GDAL, both answer 415 naming the feature.

use axum::extract::Request;
use axum::response::Response;

use super::error::{ApiResult, Error};
use super::ApiContext;
use crate::cube::sniff::GdalFormat;
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
    let (hdr, img) = (dir.join("decoded.hdr"), dir.join("decoded.img"));
    decode_to_envi(upload, hdr.clone(), limit, format).await?;
    super::intake::create_from_files(ctx, caller, crate::jobs::InputKind::Envi, &[&hdr, &img], params).await
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

#[cfg(feature = "gdal")]
async fn decode_to_envi(upload: std::path::PathBuf, hdr: std::path::PathBuf, limit: u64, format: GdalFormat) -> ApiResult<()> {
    tokio::task::spawn_blocking(move || -> ApiResult<()> {
        // The reader's messages name the file: the client's upload, not this server's scratch path.
        let scrub = |e: crate::cube::CubeError| Error::from(scrubbed(e, &upload.display().to_string()));
        let claimed = crate::cube::gdal::claimed_bytes(&upload).map_err(scrub)?;
        if claimed > limit {
            return Err(Error::too_large(format!("the file's arrays hold up to {claimed} bytes of samples, beyond this server's limit of {limit} bytes")));
        }
        let cube = crate::cube::gdal::read(&upload, format).map_err(scrub)?;
        let order = cube.byte_order();
        crate::cube::envi::write_cube(&hdr, &cube, crate::cube::Interleave::Bip, order).map_err(Error::internal)?;
        // The decoded pair is what the job keeps; the upload itself is not needed any more.
        let _ = std::fs::remove_file(&upload);
        Ok(())
    })
    .await
    .map_err(Error::internal)?
}

/// `e` with `path` replaced by "the upload" in its message.
#[cfg(feature = "gdal")]
fn scrubbed(e: crate::cube::CubeError, path: &str) -> crate::cube::CubeError {
    use crate::cube::CubeError as E;
    let s = |m: String| m.replace(path, "the upload");
    match e {
        E::Io { path: p, source } => E::Io { path: s(p), source },
        E::Header(m) => E::Header(s(m)),
        E::Unsupported(m) => E::Unsupported(s(m)),
        E::SizeMismatch(m) => E::SizeMismatch(s(m)),
        E::TooLarge(m) => E::TooLarge(s(m)),
        E::Npy(m) => E::Npy(s(m)),
        E::NeedsGdal(m) => E::NeedsGdal(s(m)),
    }
}

#[cfg(not(feature = "gdal"))]
async fn decode_to_envi(upload: std::path::PathBuf, _: std::path::PathBuf, _: u64, format: GdalFormat) -> ApiResult<()> {
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
    use crate::jobs::model::product;
    let storage = ctx.runner.storage.clone();
    let md_key = job.results.get(product::METADATA).ok_or_else(|| Error::internal(anyhow::anyhow!("job {} has no metadata", job.id)))?;
    let md_bytes = storage.get_bytes(md_key).await?;
    let md: crate::mnf::result::Metadata = serde_json::from_slice(&md_bytes).map_err(Error::internal)?;
    let npy = storage.local_copy(npy_key).await?;
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
        crate::output::cog::write(&o, &values, cube.lines(), cube.samples(), cube.bands(), meta, &source, &crate::output::cog::Grid::Source)
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

#[cfg(not(feature = "gdal"))]
async fn build_cog(_: &ApiContext, _: &Job, _: &str, _: bool, cog_key: &str) -> ApiResult<()> {
    Err(Error::from(crate::cube::needs_gdal(std::path::Path::new(cog_key), GdalFormat::Tiff)))
}
