//! Opening a cube by its file name: which reader (ENVI, `.npy`, GDAL) a path goes to, and the files
//! it reads.

use std::path::Path;

#[cfg(feature = "gdal")]
use super::gdal;
use super::{envi, npy, sniff, Cube, CubeError};

/// Every file `open(path)` reads: `path`, and for an ENVI header the data file `envi::read` finds
/// beside it (so that the service can hold each of them to its input roots).
pub fn input_files(path: &Path) -> Result<Vec<std::path::PathBuf>, CubeError> {
    match path.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase()).as_deref() {
        Some("hdr") => Ok(vec![path.to_path_buf(), envi::data_file(path)?]),
        Some("npy") => Ok(vec![path.to_path_buf()]),
        // A GeoTIFF's reader also reads the ENVI header beside it, if any (DESIS products keep their
        // spectral metadata there).
        _ if sniff::gdal_format(path) == Some(sniff::GdalFormat::Tiff) => {
            let beside = ["hdr", "HDR"].into_iter().map(|e| path.with_extension(e)).filter(|p| p.is_file());
            Ok(std::iter::once(path.to_path_buf()).chain(beside.take(1)).collect())
        }
        _ if sniff::gdal_format(path).is_some() => Ok(vec![path.to_path_buf()]),
        _ => Err(not_a_cube_file(path)),
    }
}

/// Opens a cube by its file name: `.hdr` (ENVI header; the data file beside it) or `.npy`; NetCDF,
/// HDF5 and GeoTIFF (by extension or signature, [`sniff`]) through GDAL.
pub fn open(path: &Path) -> Result<Cube, CubeError> {
    match path.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase()).as_deref() {
        Some("hdr") => envi::read(path),
        Some("npy") => npy::read(path),
        _ => open_through_gdal(path),
    }
}

/// Opens a cube by its file name as [`open`] does, but mapped instead of read: an ENVI file in the
/// layout it is stored in (BIL and BSQ are never transposed on the host, see
/// [`Cube::storage`]), a C-order `.npy` as it is. What `hypermnf run` and the
/// service's jobs read: a flight line of many GB then holds no memory of its own.
pub fn map(path: &Path) -> Result<Cube, CubeError> {
    match path.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase()).as_deref() {
        Some("hdr") => envi::map(path),
        Some("npy") => npy::map(path),
        // GDAL decodes (decompresses, scales) into memory of the cube's own: nothing to map.
        _ => open_through_gdal(path),
    }
}

/// A NetCDF, HDF5 or TIFF file read through GDAL, or on a build without it an error naming the feature.
fn open_through_gdal(path: &Path) -> Result<Cube, CubeError> {
    let Some(format) = sniff::gdal_format(path) else {
        return Err(not_a_cube_file(path));
    };
    #[cfg(feature = "gdal")]
    {
        gdal::read(path, format)
    }
    #[cfg(not(feature = "gdal"))]
    {
        Err(needs_gdal(path, format))
    }
}

/// The error for a GDAL-only format on a build without GDAL.
pub fn needs_gdal(path: &Path, format: sniff::GdalFormat) -> CubeError {
    CubeError::NeedsGdal(format!(
        "{}: {} files are read and written through GDAL, and this hypermnf was built without it: rebuild with \
         `cargo build --features gdal` (needs libgdal-dev), or use the container image",
        path.display(),
        format.name()
    ))
}

fn not_a_cube_file(path: &Path) -> CubeError {
    CubeError::Unsupported(format!("{}: input must be an ENVI header (.hdr), a NumPy array (.npy), or NetCDF, HDF5 or GeoTIFF (feature `gdal`)", path.display()))
}
