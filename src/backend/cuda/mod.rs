//! CUDA backend through cudarc. (stub: being written)
use super::{Backend, BackendError, PreparedCube};
use crate::cube::Cube;
use crate::mnf::Monitor;

/// Which GPU implementation runs the passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The custom kernels of kernels/*.cu (the published MNF-C design).
    Kernels,
    /// cuBLAS SYRK / GEMM (the published MNF-L design).
    Cublas,
}

pub struct CudaBackend { route: Route }
impl CudaBackend {
    pub fn new(route: Route) -> Result<Self, BackendError> {
        let _ = CudaBackend { route };
        Err(BackendError::Unavailable("CUDA backend not written yet".into()))
    }
}
impl Backend for CudaBackend {
    fn name(&self) -> &'static str { match self.route { Route::Kernels => "cuda", Route::Cublas => "cuda-cublas" } }
    fn device(&self) -> String { String::new() }
    fn prepare<'c>(&'c self, _cube: &'c Cube, _m: &Monitor) -> Result<Box<dyn PreparedCube + 'c>, BackendError> {
        Err(BackendError::Unavailable("CUDA backend not written yet".into()))
    }
}
