//! Writing a result to disk, the same way for `hypermnf run` and the service (so both give the same bytes).
//! (stub: the lead is writing it; the signature is fixed)

use std::path::{Path, PathBuf};

use crate::cube::{CubeError, CubeMeta};
use crate::mnf::MnfOutput;

/// The files one result was written to.
#[derive(Debug, Clone)]
pub struct WrittenFiles {
    /// OUT itself (.npy, or the ENVI .hdr)
    pub components: PathBuf,
    /// The ENVI .img beside OUT when OUT is .hdr.
    pub components_data: Option<PathBuf>,
    /// OUT-stem.json
    pub metadata: PathBuf,
    /// OUT-stem-denoised.npy (or .hdr) when the inverse was computed.
    pub denoised: Option<PathBuf>,
    pub denoised_data: Option<PathBuf>,
}

/// Writes `result` to `out` (.npy: float32 (lines, samples, k) C order; .hdr: ENVI float32 BSQ + .img),
/// its metadata to OUT-stem.json, and the denoised cube (if any) to OUT-stem-denoised.(npy|hdr).
pub fn write_result(out: &Path, result: &MnfOutput, source: &CubeMeta) -> Result<WrittenFiles, CubeError> {
    let _ = (out, result, source);
    Err(CubeError::Unsupported("output writer not written yet".into()))
}
