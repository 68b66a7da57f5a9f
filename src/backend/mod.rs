//! Where the passes over the cube run. A backend prepares a cube (the CUDA backend uploads it, or
//! decides to stream it), then computes the statistics pass, and later the projection and inverse
//! passes with matrices computed on the host. The CPU backend is the reference the GPU is tested against.
//!
//! The interface the pipeline drives ([`Backend`], [`PreparedCube`], [`BackendError`]) belongs to the
//! algorithm layer (`crate::mnf::compute`), which knows nothing of this module; it is re-exported
//! here for the callers that pick a backend.

pub mod cpu;
pub mod cuda;
pub mod devices;
pub mod split;

use std::ops::Range;
use std::sync::Arc;

pub use crate::mnf::compute::{Backend, BackendError, ChunkDone, PreparedCube};

use crate::cube::Cube;
use crate::mnf::stats::StatsSpec;
use crate::mnf::BackendChoice;

/// Checks the noise window of `spec` against the `samples` × `lines` image a statistics pass runs on.
pub(crate) fn check_window(spec: &StatsSpec, samples: usize, lines: usize) -> Result<(), BackendError> {
    match spec.window {
        Some(w) if !w.fits(samples, lines) => Err(BackendError::Invalid(format!(
            "noise window {},{},{},{} lies outside the {samples} x {lines} image",
            w.x0, w.y0, w.x1, w.y1
        ))),
        _ => Ok(()),
    }
}

/// Checks a line range of `cube` given to `prepare_lines`.
pub(crate) fn check_line_range(cube: &Cube, lines: &Range<usize>) -> Result<(), BackendError> {
    if lines.is_empty() || lines.end > cube.lines() {
        return Err(BackendError::Invalid(format!(
            "lines {}..{} are not a non-empty range of the cube's {} lines",
            lines.start,
            lines.end,
            cube.lines()
        )));
    }
    Ok(())
}

/// Creates the backend asked for. `Auto` tries CUDA and falls back to the CPU, logging why.
pub fn select(choice: BackendChoice) -> Result<Arc<dyn Backend>, BackendError> {
    match choice {
        BackendChoice::Cpu => Ok(Arc::new(cpu::CpuBackend::new())),
        BackendChoice::Cuda => Ok(Arc::new(cuda::CudaBackend::new(cuda::Route::Kernels)?)),
        BackendChoice::CudaCublas => Ok(Arc::new(cuda::CudaBackend::new(cuda::Route::Cublas)?)),
        BackendChoice::Auto => match cuda::CudaBackend::new(cuda::Route::Kernels) {
            Ok(b) => {
                tracing::info!(device = %b.device(), "using the CUDA backend");
                Ok(Arc::new(b))
            }
            Err(e) => {
                tracing::info!("no usable CUDA device ({e}); using the CPU backend");
                Ok(Arc::new(cpu::CpuBackend::new()))
            }
        },
    }
}
