//! Where the passes over the cube run. A backend prepares a cube (the CUDA backend uploads it, or
//! decides to stream it), then computes the statistics pass, and later the projection and inverse
//! passes with matrices computed on the host. The CPU backend is the reference the GPU is tested against.
//!
//! The interface the pipeline drives ([`Backend`], [`PreparedCube`], [`BackendError`]) belongs to the
//! algorithm layer (`crate::mnf::compute`), which knows nothing of this module; it is re-exported
//! here for the callers that pick a backend.

mod checks;
pub mod cpu;
pub mod cuda;
pub mod devices;
pub mod split;

use std::sync::Arc;

pub use crate::mnf::compute::{Backend, BackendError, ChunkDone, PreparedCube};
pub(crate) use checks::{check_line_range, check_window};

use crate::mnf::BackendChoice;

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

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine (and CI) has no GPU: `--backend auto` falls back to the CPU, and `cuda` is a clean
    /// Unavailable. Skipped where a driver is present.
    #[test]
    fn auto_selection_falls_back_to_the_cpu_without_a_driver() {
        // SAFETY: only tries to dlopen libcuda.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            return;
        }
        let b = select(BackendChoice::Auto).expect("auto must fall back");
        assert_eq!(b.name(), "cpu");
        let e = select(BackendChoice::Cuda).err().expect("cuda must fail here");
        assert_eq!(e.code(), "backend_unavailable");
    }
}
