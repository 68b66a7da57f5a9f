//! The service's side of the formats read and written through GDAL (feature `gdal`):
//! - `GET /v1/jobs/{id}/result?format=cog` (and `&product=denoised`): the result as a Cloud-Optimized
//!   GeoTIFF, made once from the stored `.npy` and metadata JSON (whose `source` keeps the input's
//!   `map info` and WKT) and kept beside them, as the ENVI zip is;
//! - `href` inputs in NetCDF, HDF5 or GeoTIFF: the size their header claims is checked before the file
//!   is read, as for ENVI and `.npy`;
//! - on a build without GDAL, both answer 415 naming the feature.

use axum::response::Response;

use super::error::{ApiResult, Error};
use super::ApiContext;
use crate::cube::sniff::GdalFormat;
use crate::jobs::Job;

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
    super::jobs::stream(ctx, &cog_key, COG_MEDIA_TYPE, &format!("{stem}.tif")).await
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
        let source = crate::output_cog::source_meta(&md);
        let k = md.components;
        let meta = if denoised { crate::output_cog::denoised_meta(&md, k, &source) } else { crate::output_cog::components_meta(&md, k) };
        crate::output_cog::write(&o, &values, cube.lines(), cube.samples(), cube.bands(), meta, &source, &crate::output_cog::Grid::Source)
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
