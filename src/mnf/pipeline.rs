//! The pipeline. (stub: being written)
use super::{Metadata, MnfError, MnfParams, Monitor};
use crate::backend::Backend;
use crate::cube::Cube;

/// What one MNF run produces.
#[derive(Debug, Clone)]
pub struct MnfOutput {
    /// lines × samples × k, BIP (C-order (lines, samples, k)); NaN at no-data pixels.
    pub components: Vec<f32>,
    pub k: usize,
    /// lines × samples × bands when the inverse was asked for.
    pub denoised: Option<Vec<f32>>,
    pub metadata: Metadata,
}

pub fn run(cube: &Cube, params: &MnfParams, backend: &dyn Backend, monitor: &Monitor) -> Result<MnfOutput, MnfError> {
    let _ = (cube, params, backend, monitor);
    Err(MnfError::InvalidParams("pipeline not written yet".into()))
}
