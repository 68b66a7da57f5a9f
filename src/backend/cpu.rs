//! CPU backend. (stub: being written)
use super::{Backend, BackendError, PreparedCube};
use crate::cube::Cube;
use crate::mnf::Monitor;

pub struct CpuBackend;
impl CpuBackend {
    pub fn new() -> Self { CpuBackend }
}
impl Default for CpuBackend { fn default() -> Self { Self::new() } }
impl Backend for CpuBackend {
    fn name(&self) -> &'static str { "cpu" }
    fn device(&self) -> String { format!("CPU ({} threads)", rayon::current_num_threads()) }
    fn prepare<'c>(&'c self, _cube: &'c Cube, _m: &Monitor) -> Result<Box<dyn PreparedCube + 'c>, BackendError> {
        Err(BackendError::Unavailable("CPU backend not written yet".into()))
    }
}
