//! Cubes: the data model (`model`), the ENVI format (`envi`), NumPy `.npy` (`npy`) and synthetic
//! cubes with a known signal subspace (`synthetic`).

mod bytes;
pub mod digest;
pub mod envi;
pub mod layout;
pub mod model;
pub mod npy;
pub mod synthetic;

pub use model::{ByteOrder, Cube, CubeMeta, DataType, Interleave};

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
        }
    }
}

/// Every file `open(path)` reads: `path`, and for an ENVI header the data file `envi::read` finds
/// beside it (so that the service can hold each of them to its input roots).
pub fn input_files(path: &Path) -> Result<Vec<std::path::PathBuf>, CubeError> {
    match path.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase()).as_deref() {
        Some("hdr") => Ok(vec![path.to_path_buf(), envi::data_file(path)?]),
        Some("npy") => Ok(vec![path.to_path_buf()]),
        _ => Err(not_a_cube_file(path)),
    }
}

/// Opens a cube by its file name: `.hdr` (ENVI header; the data file beside it) or `.npy`.
pub fn open(path: &Path) -> Result<Cube, CubeError> {
    match path.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase()).as_deref() {
        Some("hdr") => envi::read(path),
        Some("npy") => npy::read(path),
        _ => Err(not_a_cube_file(path)),
    }
}

/// Opens a cube by its file name as [`open`] does, but mapped instead of read: an ENVI file in the
/// layout it is stored in (BIL and BSQ are never transposed on the host, see
/// [`Cube::storage`](model::Cube::storage)), a C-order `.npy` as it is. What `hypermnf run` and the
/// service's jobs read: a flight line of many GB then holds no memory of its own.
pub fn map(path: &Path) -> Result<Cube, CubeError> {
    match path.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase()).as_deref() {
        Some("hdr") => envi::map(path),
        Some("npy") => npy::map(path),
        _ => Err(not_a_cube_file(path)),
    }
}

fn not_a_cube_file(path: &Path) -> CubeError {
    CubeError::Unsupported(format!("{}: input must be an ENVI header (.hdr) or a NumPy array (.npy)", path.display()))
}
