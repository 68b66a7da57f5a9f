//! The errors of the MNF layer and of the compute backends it drives.

/// Errors of a compute backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The requested backend cannot run here (no device, no driver, no NVRTC).
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// A CUDA driver, NVRTC or cuBLAS call failed.
    #[error("CUDA: {0}")]
    Cuda(String),
    #[error("canceled")]
    Canceled,
    /// The inputs cannot be processed (e.g. too few pixels for the noise estimate).
    #[error("{0}")]
    Invalid(String),
}

impl BackendError {
    pub fn code(&self) -> &'static str {
        match self {
            BackendError::Unavailable(_) => "backend_unavailable",
            BackendError::Cuda(_) => "cuda_error",
            BackendError::Canceled => "canceled",
            BackendError::Invalid(_) => "invalid_input",
        }
    }
}

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
