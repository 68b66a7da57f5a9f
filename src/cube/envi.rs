//! ENVI header (.hdr) + raw data file. (stub: being written)
use std::path::Path;
use super::{Cube, CubeError, CubeMeta};

/// What an ENVI float32 BSQ output header carries besides the geometry.
#[derive(Debug, Clone, Default)]
pub struct OutputHeader {
    pub description: String,
    pub band_names: Vec<String>,
    /// Written as `mnf eigenvalues = {...}` when present.
    pub eigenvalues: Option<Vec<f64>>,
    /// Source metadata carried over (map info, extra keys; wavelength/fwhm only when `keep_spectral`).
    pub source: CubeMeta,
    pub keep_spectral: bool,
}

pub fn read(hdr: &Path) -> Result<Cube, CubeError> {
    Err(CubeError::Unsupported(format!("{}: ENVI reader not written yet", hdr.display())))
}

pub fn read_parts(header_text: &str, data: &Path) -> Result<Cube, CubeError> {
    let _ = (header_text, data);
    Err(CubeError::Unsupported("ENVI reader not written yet".into()))
}

pub fn write_f32_bsq(hdr: &Path, lines: usize, samples: usize, bands: usize, values_bip: &[f32], header: &OutputHeader) -> Result<(), CubeError> {
    let _ = (hdr, lines, samples, bands, values_bip, header);
    Err(CubeError::Unsupported("ENVI writer not written yet".into()))
}
