//! `ortho=true` at submit: refused (422) for an input that has no GLT to orthorectify with, and
//! checked where a GLT can be (an EMIT granule by `file://` href, or the GLT decoded beside an
//! upload, `jobs::geometry`). Shared by every input form, below them.

use super::error::{ApiResult, Error};
use super::ApiContext;
use crate::cube::sniff::GdalFormat;

/// The 422 of `ortho=true` on `what`, which has no GLT.
pub(super) fn no_glt(what: &str) -> Error {
    Error::unprocessable(
        "ortho_needs_glt",
        format!(
            "ortho=true applies an EMIT granule's geometry lookup table (location/glt_x, glt_y) to the COG result, \
             and {what} has none: give an EMIT NetCDF granule by file:// href or upload it as application/x-netcdf"
        ),
    )
}

/// Refuses `ortho=true` for an input that cannot have a GLT (`what` names it).
pub(super) fn refuse_ortho(params: &crate::mnf::MnfParams, what: &str) -> ApiResult<()> {
    match params.ortho {
        true => Err(no_glt(what)),
        false => Ok(()),
    }
}

/// `ortho=true` needs the GLT where the COG will be made from: the EMIT granule of a `file://` href
/// (its metadata names the GLT the file holds), or the GLT file decoded beside an upload at `location`.
pub(super) async fn check_ortho(
    ctx: &ApiContext,
    params: &crate::mnf::MnfParams,
    kind: crate::jobs::InputKind,
    location: &str,
    meta: &crate::cube::CubeMeta,
) -> ApiResult<()> {
    use crate::jobs::InputKind;
    if !params.ortho {
        return Ok(());
    }
    if !cfg!(feature = "gdal") {
        return Err(Error::from(crate::cube::needs_gdal(std::path::Path::new("ortho=true"), GdalFormat::Tiff)));
    }
    let granule = meta.extra_value(GLT_KEY).is_some();
    let has = match kind {
        InputKind::Href => granule && !location.starts_with('{'),
        InputKind::Envi => granule && crate::jobs::upload_has_glt(&ctx.runner.storage, location).await,
        InputKind::Npy => false,
    };
    match has {
        true => Ok(()),
        false => Err(no_glt("this input")),
    }
}

/// The metadata key of a cube read from an EMIT granule with a GLT.
#[cfg(feature = "gdal")]
pub(super) const GLT_KEY: &str = crate::cube::gdal::emit::GLT_KEY;
#[cfg(not(feature = "gdal"))]
pub(super) const GLT_KEY: &str = "emit glt";
