//! Which inputs go through GDAL: NetCDF (EMIT), HDF5 / HDF-EOS5 (NEON, PRISMA) and TIFF (EnMAP, DESIS,
//! any multi-band GeoTIFF), told by their extension or, for a file named otherwise (a stored upload), by
//! the signature of their first bytes. Compiled without the `gdal` feature too, so that such a file is
//! refused with an error that names the feature instead of "not an ENVI header".

use std::io::Read;
use std::path::Path;

/// A file format read through GDAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GdalFormat {
    /// NetCDF classic or NetCDF-4 (EMIT granules).
    NetCdf,
    /// HDF5, HDF-EOS5 included (NEON AOP, PRISMA).
    Hdf5,
    /// TIFF / GeoTIFF, BigTIFF included.
    Tiff,
}

impl GdalFormat {
    pub fn name(self) -> &'static str {
        match self {
            GdalFormat::NetCdf => "NetCDF",
            GdalFormat::Hdf5 => "HDF5",
            GdalFormat::Tiff => "GeoTIFF",
        }
    }

    /// The media type of an upload in this format.
    pub fn media_type(self) -> &'static str {
        match self {
            GdalFormat::NetCdf => "application/x-netcdf",
            GdalFormat::Hdf5 => "application/x-hdf5",
            GdalFormat::Tiff => "image/tiff",
        }
    }
}

/// The GDAL format of `path` by its extension, else by its first bytes; None for anything else (ENVI,
/// `.npy`, a missing file).
pub fn gdal_format(path: &Path) -> Option<GdalFormat> {
    by_extension(path).or_else(|| by_signature(path))
}

fn by_extension(path: &Path) -> Option<GdalFormat> {
    match path.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase()).as_deref() {
        Some("nc" | "nc4" | "netcdf") => Some(GdalFormat::NetCdf),
        Some("h5" | "hdf5" | "he5" | "hdf") => Some(GdalFormat::Hdf5),
        Some("tif" | "tiff" | "gtif") => Some(GdalFormat::Tiff),
        _ => None,
    }
}

/// NetCDF-4 files are HDF5 files: both start with the HDF5 signature, so the difference is told by the
/// reader (a NetCDF-4 file opened as HDF5 by GDAL still shows its variables).
pub fn signature_format(head: &[u8]) -> Option<GdalFormat> {
    if head.starts_with(b"\x89HDF\r\n\x1a\n") {
        Some(GdalFormat::Hdf5)
    } else if head.starts_with(b"CDF\x01") || head.starts_with(b"CDF\x02") || head.starts_with(b"CDF\x05") {
        Some(GdalFormat::NetCdf)
    } else if head.starts_with(b"II*\0") || head.starts_with(b"MM\0*") || head.starts_with(b"II+\0") || head.starts_with(b"MM\0+") {
        Some(GdalFormat::Tiff)
    } else {
        None
    }
}

fn by_signature(path: &Path) -> Option<GdalFormat> {
    let mut head = [0u8; 8];
    let mut f = std::fs::File::open(path).ok()?;
    let n = f.read(&mut head).ok()?;
    signature_format(&head[..n])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures() {
        assert_eq!(signature_format(b"\x89HDF\r\n\x1a\nxx"), Some(GdalFormat::Hdf5));
        assert_eq!(signature_format(b"CDF\x01\0\0"), Some(GdalFormat::NetCdf));
        assert_eq!(signature_format(b"II*\0abcd"), Some(GdalFormat::Tiff));
        assert_eq!(signature_format(b"\x93NUMPY"), None);
        assert_eq!(signature_format(b"ENVI\n"), None);
    }
}
