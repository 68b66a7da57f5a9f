//! The MNF algorithm, independent of where it runs: parameters, statistics and their merge, band
//! selection, the generalized eigenproblem (float64, host), the result and its metadata, and the
//! pipeline that drives a compute backend through the statistics and projection passes. What the
//! pipeline needs from a backend is defined here (`compute`); the backends implement it, and
//! nothing here depends on them.

pub mod bands;
pub mod compute;
pub mod eigen;
pub mod params;
pub mod pipeline;
pub mod pooled;
pub mod result;
pub mod stats;
pub mod system_file;

pub use params::{BackendChoice, MnfParams, NoiseEstimator, Window};
pub use pipeline::{run, MnfOutput};
pub use result::{Metadata, ReuseSource, StatisticsReuse};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use compute::BackendError;

/// Errors of the MNF layer.
#[derive(Debug, thiserror::Error)]
pub enum MnfError {
    #[error("invalid parameters: {0}")]
    InvalidParams(String),
    #[error("cannot estimate: {0}")]
    Degenerate(String),
    #[error("backend: {0}")]
    Backend(#[from] BackendError),
    #[error("canceled")]
    Canceled,
}

impl MnfError {
    pub fn code(&self) -> &'static str {
        match self {
            MnfError::InvalidParams(_) => "invalid_params",
            MnfError::Degenerate(_) => "degenerate_input",
            MnfError::Backend(e) => e.code(),
            MnfError::Canceled => "canceled",
        }
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
