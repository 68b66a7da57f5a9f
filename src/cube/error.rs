//! The cube layer's one error type.

use std::path::Path;

/// Errors of the cube layer: reading, validating and writing cubes.
#[derive(Debug, thiserror::Error)]
pub enum CubeError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("invalid header: {0}")]
    Header(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("data does not match header: {0}")]
    SizeMismatch(String),
    #[error("cube too large: {0}")]
    TooLarge(String),
    #[error("invalid .npy: {0}")]
    Npy(String),
    /// A NetCDF, HDF5 or GeoTIFF input on a build without the `gdal` feature (the service's 415).
    #[error("{0}")]
    NeedsGdal(String),
}

impl CubeError {
    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        CubeError::Io { path: path.as_ref().display().to_string(), source }
    }
    /// A stable, machine-readable code for the API and the CLI.
    pub fn code(&self) -> &'static str {
        match self {
            CubeError::Io { .. } => "io_error",
            CubeError::Header(_) => "invalid_header",
            CubeError::Unsupported(_) => "unsupported",
            CubeError::SizeMismatch(_) => "size_mismatch",
            CubeError::TooLarge(_) => "too_large",
            CubeError::Npy(_) => "invalid_npy",
            CubeError::NeedsGdal(_) => "needs_gdal_feature",
        }
    }
}
