//! The formats of today's missions, read through GDAL (feature `gdal`): EMIT NetCDF-4 granules
//! ([`emit`]), NEON AOP reflectance HDF5 ([`neon`]), PRISMA HDF-EOS5 ([`prisma`]), EnMAP / DESIS and any
//! multi-band GeoTIFF ([`geotiff`]); and Cloud-Optimized GeoTIFF results ([`cog`]).
//!
//! Each reader gives the [`Cube`] and [`CubeMeta`](crate::cube::CubeMeta) the ENVI reader gives: BIP
//! samples in the file's own type (float32 when the product defines a scale or offset, applied as it
//! defines them, its fill value kept as the no-data value), wavelengths in nm, fwhm, bad bands, and the
//! georeferencing as ENVI's `map info` + `coordinate system string` ([`georef`]).
//!
//! GDAL parses the files: nothing here reads NetCDF, HDF5 or TIFF bytes by hand.

pub mod cog;
pub mod emit;
pub mod georef;
mod geotiff;
mod hdf5_chunks;
mod library;
mod md;
mod neon;
mod prisma;
mod probe;
mod samples;

use std::path::Path;

use library::library;
pub use hdf5_chunks::{last_read_path, ReadPath};
pub use probe::claimed_bytes;

use super::sniff::GdalFormat;
use super::{Cube, CubeError};

/// Reads the cube in `path`, a file of `format` (by its extension or signature): the product is told by
/// its layout (EMIT's root variables, NEON's site group, PRISMA's swath), else any multi-band raster.
pub fn read(path: &Path, format: GdalFormat) -> Result<Cube, CubeError> {
    let mut library = library();
    if !path.is_file() {
        return Err(CubeError::io(path, std::io::Error::new(std::io::ErrorKind::NotFound, "no such file")));
    }
    match format {
        GdalFormat::NetCdf => {
            if emit::looks_like(path)? {
                emit::read(path, &mut library)
            } else {
                Err(CubeError::Unsupported(format!(
                    "{}: a NetCDF file without EMIT's layout (a root variable radiance, reflectance, obs or mask \
                     with dims downtrack, crosstrack, bands)",
                    path.display()
                )))
            }
        }
        GdalFormat::Hdf5 => {
            if neon::looks_like(path) {
                neon::read(path, &mut library)
            } else if prisma::looks_like(path) {
                prisma::read(path, &mut library)
            } else if emit::looks_like(path).unwrap_or(false) {
                // A NetCDF-4 granule stored without its extension (an upload) is HDF5 by its signature.
                emit::read(path, &mut library)
            } else {
                // Opening it at all tells a truncated or foreign file from a valid HDF5 of another layout.
                md::open(path, &["HDF5", "netCDF"], "HDF5")?;
                Err(CubeError::Unsupported(format!(
                    "{}: an HDF5 file in none of the layouts hypermnf reads (NEON SITE/Reflectance/Reflectance_Data, \
                     PRISMA HDFEOS/SWATHS/PRS_*_HCO, EMIT NetCDF-4)",
                    path.display()
                )))
            }
        }
        GdalFormat::Tiff => geotiff::read(path),
    }
}

/// The GDAL format of `path` (extension or signature), or an error saying it is none.
fn sniff_format(path: &Path) -> Result<GdalFormat, CubeError> {
    super::sniff::gdal_format(path)
        .ok_or_else(|| CubeError::Unsupported(format!("{}: not a NetCDF, HDF5 or TIFF file", path.display())))
}
