//! What the MNF pipeline needs from a compute device: a [`Backend`] prepares a cube (a GPU backend
//! uploads it, or decides to stream it), then the [`PreparedCube`] computes the statistics pass, and
//! later the projection and inverse passes with matrices computed on the host. The algorithm layer
//! defines this interface and knows no implementation of it; the backends (the CPU, CUDA, a cube
//! split over several devices, in the `backend` module) implement it, so that the dependency goes
//! one way, from the backends to the algorithm.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::eigen::{EarlySolution, GeneralizedEigenSolver};
use super::stats::{Denoise, Moments, Projection, Statistics, StatsSpec};
pub use super::error::BackendError;
use crate::cube::Cube;


/// A compute backend, created once and shared (the CUDA one holds a context and compiled kernels).
pub trait Backend: Send + Sync {
    /// `cpu`, `cuda` or `cuda-cublas`.
    fn name(&self) -> &'static str;
    /// Human-readable device, e.g. "NVIDIA H100 80GB HBM3" or "CPU (2 threads)".
    fn device(&self) -> String;
    /// Device memory in use and in total, in bytes (`/metrics`); None where there is no device memory.
    fn memory_in_use(&self) -> Option<(u64, u64)> {
        None
    }
    /// Gets ready to run passes over `cube` (the CUDA backend uploads it here when it fits). `Send`, so
    /// that the job cache can keep a prepared cube between jobs run on different threads.
    fn prepare<'c>(&'c self, cube: &'c Cube, monitor: &Monitor) -> Result<Box<dyn PreparedCube + Send + 'c>, BackendError>;
    /// Like `prepare`, for lines `lines` of the cube only, which the passes then see as a cube of its
    /// own: the image ends at the range's ends (no noise residual reaches past them), a noise window is
    /// in the range's coordinates, and the outputs hold the range's pixels only. The shares of a cube
    /// split over several devices (the backends' `split` module). Backends that cannot say so.
    fn prepare_lines<'c>(
        &'c self,
        _cube: &'c Cube,
        _lines: Range<usize>,
        _monitor: &Monitor,
    ) -> Result<Box<dyn PreparedCube + Send + 'c>, BackendError> {
        Err(BackendError::Unavailable(format!("the {} backend cannot prepare a share of a cube", self.name())))
    }
    /// The CUDA device ordinal the backend runs on; None for the CPU (the job cache keeps one device
    /// level per ordinal).
    fn ordinal(&self) -> Option<usize> {
        None
    }
    /// Returns device memory the backend keeps idle for reuse (its buffer pool) to the device: the job
    /// cache calls it after evicting device-resident cubes, so that eviction really frees memory.
    /// Nothing to do where there is no device memory.
    fn release_idle_memory(&self) {}
    /// The solver its prepared cubes solve the eigenproblem with (`PreparedCube::eigen_solver`), for an
    /// eigenproblem of no one cube (pooled statistics): the same solver gives the same bits. None where
    /// the eigen step runs on the host.
    fn eigen_solver(&self) -> Option<&dyn GeneralizedEigenSolver> {
        None
    }
}

/// Takes a run of finished output values: its first element, the values ([`PreparedCube::project_streamed`]).
pub type ChunkDone<'a> = dyn FnMut(usize, &[f32]) -> Result<(), BackendError> + 'a;

/// One cube made ready by a backend; the passes run in the order statistics → project → denoise.
pub trait PreparedCube {
    /// Data and noise moments over all bands. `on_noise` is called with the noise moments as soon as they
    /// are known, before the data moments are finished, so the host can start the noise
    /// eigen-decomposition while the device computes the data covariance.
    fn statistics(
        &mut self,
        spec: &StatsSpec,
        on_noise: &mut dyn FnMut(&Moments),
        monitor: &Monitor,
    ) -> Result<Statistics, BackendError>;

    /// Z = Tᵀ(x − μ) into `out` (lines × samples × k, BIP); masked pixels NaN.
    fn project(
        &mut self,
        projection: &Projection,
        out: &mut [f32],
        monitor: &Monitor,
    ) -> Result<(), BackendError>;

    /// The projection, handing each run of the output to `done` (its first element, its values) as
    /// soon as those values are final, so that the caller can write them while the rest is computed.
    /// The runs are disjoint and cover the output. `out` may be left unwritten (the CUDA backend hands
    /// its pinned chunks over instead): the values are `done`'s. A backend that has the whole output
    /// only at the end hands it over once then.
    fn project_streamed(
        &mut self,
        projection: &Projection,
        out: &mut [f32],
        done: &mut ChunkDone,
        monitor: &Monitor,
    ) -> Result<(), BackendError> {
        self.project(projection, out, monitor)?;
        done(0, out)
    }

    /// The inverse MNF into `out` (lines × samples × bands, BIP).
    fn denoise(&mut self, denoise: &Denoise, out: &mut [f32], monitor: &Monitor) -> Result<(), BackendError>;

    /// Device bytes this prepared cube holds between passes: the whole cube when it is resident on the
    /// device, 0 when nothing stays there (the CPU, or a cube streamed in chunks). The job cache keeps
    /// only resident cubes, and counts these bytes against its budget.
    fn resident_bytes(&self) -> u64 {
        0
    }
    /// Where the generalized eigenproblem of the MNF (the Cholesky factor of C_N included) is solved
    /// when not in faer on the host (the CUDA backend: cuSOLVER and cuBLAS on the device); `None`: on
    /// the host. The pipeline asks before the statistics pass: with a solver, its `on_noise` callback
    /// leaves C_N unfactored (`NoiseWhitening::deferred`).
    fn eigen_solver(&self) -> Option<&dyn GeneralizedEigenSolver> {
        None
    }
    /// For backends that form the statistics from values shifted by a per-band value near the mean
    /// (the CUDA one): use these shifts (data, noise) instead of sampling the prepared lines. The
    /// shares of a split cube all take the whole cube's, so that they form exactly the float32 values
    /// one device would. Nothing to do elsewhere.
    fn use_shifts(&mut self, _data: &[f64], _noise: &[f64]) {}
    /// For a cube whose bytes are still arriving (an upload being written to the file the cube maps):
    /// starts copying to the device what the passes will need of its first `lines` lines, so that
    /// little is left to copy once the last byte is there (`jobs::upload_to_device`). Nothing to do where nothing
    /// stays on a device between passes.
    fn upload_arrived(&mut self, _lines: usize) -> Result<(), BackendError> {
        Ok(())
    }
    /// Told when the eigen step starts, after the statistics: a backend that keeps a timeline of its
    /// passes (the CUDA one) marks it there, so that the time from the last upload to the eigen step
    /// (the statistics' tail, with the host's part) can be measured on one clock.
    fn eigen_starts(&mut self) {}
    /// Asks the next statistics pass to solve the eigenproblem of `bands` (C_N divided by
    /// `noise_scale`) on the device as soon as its sums are finished, from those sums, while the host
    /// forms the moments: the answer is [`PreparedCube::early_solution`]'s. Where the host then selects
    /// exactly these bands, it has the bits the host's C_N and C_D would have given (the CUDA backend
    /// forms them with the host's arithmetic), without their round trip through the host. False where
    /// the backend does not (the default).
    fn solve_early(&mut self, _bands: &[usize], _noise_scale: f64) -> bool {
        false
    }
    /// The answer of the early solve of the last statistics pass, once (None where none ran).
    fn early_solution(&mut self) -> Option<EarlySolution> {
        None
    }
}

/// Stages a job goes through, reported with progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    Read,
    Statistics,
    Eigen,
    Projection,
    Inverse,
    Write,
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::Read => "read",
            Stage::Statistics => "statistics",
            Stage::Eigen => "eigen",
            Stage::Projection => "projection",
            Stage::Inverse => "inverse",
            Stage::Write => "write",
        }
    }
}

type ProgressFn = dyn Fn(Stage, f64) + Send + Sync;

/// Progress reporting and cancellation, passed down to the backends, which call `tick` once per chunk.
#[derive(Clone, Default)]
pub struct Monitor {
    progress: Option<Arc<ProgressFn>>,
    cancel: Arc<AtomicBool>,
}

impl Monitor {
    pub fn new(progress: impl Fn(Stage, f64) + Send + Sync + 'static) -> Self {
        Monitor { progress: Some(Arc::new(progress)), cancel: Arc::new(AtomicBool::new(false)) }
    }
    /// A monitor that reports nothing and is never canceled.
    pub fn silent() -> Self {
        Monitor::default()
    }
    /// The flag that cancels the work at its next chunk.
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }
    pub fn with_cancel_flag(mut self, flag: Arc<AtomicBool>) -> Self {
        self.cancel = flag;
        self
    }
    pub fn is_canceled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
    /// Reports `fraction` (0..1) of `stage` done; Err(Canceled) once cancellation was asked for.
    pub fn tick(&self, stage: Stage, fraction: f64) -> Result<(), BackendError> {
        if let Some(p) = &self.progress {
            p(stage, fraction.clamp(0.0, 1.0));
        }
        if self.is_canceled() {
            return Err(BackendError::Canceled);
        }
        Ok(())
    }
}
