//! What a NetCDF, HDF5 or GeoTIFF file claims to hold, from its headers alone: the service refuses a
//! file whose samples exceed its limit before decoding any (a few MB of compressed NetCDF may claim
//! hundreds of GB).

use std::path::Path;

use gdal::raster::Group;

use super::md;
use super::sniff_format;
use crate::cube::sniff::GdalFormat;
use crate::cube::CubeError;

/// Groups deeper than this are not walked (no product nests its arrays deeper than HDF-EOS5's 4).
const MAX_DEPTH: usize = 8;

/// An upper bound of the cube bytes reading `path` may allocate: for NetCDF/HDF5 the elements of every
/// 3-D numeric array (at 8 bytes each when a scale could make float64 of them, else at least 4: float32),
/// for a raster its width × height × bands at its type's size (float32 at least).
pub fn claimed_bytes(path: &Path) -> Result<u64, CubeError> {
    let _library = super::library::library();
    match sniff_format(path)? {
        GdalFormat::Tiff => {
            let ds = super::geotiff::open(path)?;
            let (x, y) = ds.raster_size();
            let size = ds.rasterband(1).map(|b| b.band_type().bytes() as u64).unwrap_or(4).max(4);
            Ok((x as u64).saturating_mul(y as u64).saturating_mul(ds.raster_count() as u64).saturating_mul(size))
        }
        GdalFormat::NetCdf | GdalFormat::Hdf5 => {
            let ds = md::open(path, &["netCDF", "HDF5"], "NetCDF/HDF5")?;
            let root = ds.root_group().map_err(md::gdal_error(path, "root group"))?;
            Ok(walk(&root, 0))
        }
    }
}

fn walk(g: &Group, depth: usize) -> u64 {
    let mut total = 0u64;
    for name in g.array_names(md::no_options()) {
        if let Some(a) = md::array(g, &name) {
            if a.num_dimensions() == 3 && a.datatype().class().is_numeric() {
                let size = gdal_size(a.datatype().numeric_datatype()).max(4);
                total = total.saturating_add(a.num_elements().saturating_mul(size));
            }
        }
    }
    if depth < MAX_DEPTH {
        for name in g.group_names(md::no_options()) {
            if let Some(sub) = md::group(g, &name) {
                total = total.saturating_add(walk(&sub, depth + 1));
            }
        }
    }
    total
}

fn gdal_size(t: gdal_sys::GDALDataType::Type) -> u64 {
    // SAFETY: GDALGetDataTypeSizeBytes only reads its argument.
    (unsafe { gdal_sys::GDALGetDataTypeSizeBytes(t) }).max(1) as u64
}
