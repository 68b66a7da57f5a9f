//! The library's one error type: everything [`Mnf::fit`](super::Mnf::fit) and the methods of
//! [`MnfFit`](super::MnfFit) can refuse, typed so that a caller can match on it; none of them panics.

use crate::backend::BackendError;
use crate::cube::{CubeError, DataType};
use crate::mnf::MnfError;

/// Why the library refused a cube or could not fit it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An axis of the `(lines, samples, bands)` view has length 0.
    #[error("the cube has a zero-sized axis: {lines} lines x {samples} samples x {bands} bands (each needs at least 1)")]
    EmptyAxis { lines: usize, samples: usize, bands: usize },
    /// More components asked for than there are bands to make them from: the cube's bands less the
    /// `bad_bands`, or (found while fitting) less the constant and noise-free bands too.
    #[error("components ({requested}) exceeds the {available} bands left after excluding bad and constant bands")]
    TooManyComponents { requested: usize, available: usize },
    /// `transform` or `denoise` of a cube whose band count is not the fitted cube's.
    #[error("the cube has {got} bands, but the MNF was fitted on a cube of {expected} bands")]
    BandCountMismatch { expected: usize, got: usize },
    /// [`cube_to_array`](super::cube_to_array) asked for another sample type than the cube's.
    #[error("the cube holds {got:?} samples, not {expected:?}")]
    DataTypeMismatch { expected: DataType, got: DataType },
    /// [`MnfFit::inverse`](super::MnfFit::inverse) of a fit made without `Mnf::inverse(true)`.
    #[error("the inverse (denoised cube) was not computed: ask for it with Mnf::inverse(true) before fit, or call denoise(cube)")]
    InverseNotRequested,
    /// An option out of range or in conflict with another (components and snr both set, a bad band or
    /// noise window outside the cube, a negative snr, ...).
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    /// The cube cannot give an MNF: too few valid pixels for the noise estimate, every band constant,
    /// a singular noise covariance (duplicated bands), values too large to square in float64.
    #[error("cannot fit: {0}")]
    Degenerate(String),
    /// The cube is larger than the crate accepts (`cube::sample_type::MAX_CUBE_BYTES`).
    #[error(transparent)]
    Cube(#[from] CubeError),
    /// The backend cannot run (`Backend::Cuda` without a device or driver) or failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl Error {
    /// A stable, machine-readable code, as the service and the CLI use.
    pub fn code(&self) -> &'static str {
        match self {
            Error::EmptyAxis { .. } => "empty_axis",
            Error::TooManyComponents { .. } => "too_many_components",
            Error::BandCountMismatch { .. } => "band_count_mismatch",
            Error::DataTypeMismatch { .. } => "data_type_mismatch",
            Error::InverseNotRequested => "inverse_not_requested",
            Error::InvalidOptions(_) => "invalid_params",
            Error::Degenerate(_) => "degenerate_input",
            Error::Cube(e) => e.code(),
            Error::Backend(e) => e.code(),
        }
    }
}

impl From<MnfError> for Error {
    fn from(e: MnfError) -> Self {
        match e {
            MnfError::InvalidParams(m) => Error::InvalidOptions(m),
            MnfError::Degenerate(m) => Error::Degenerate(m),
            MnfError::Backend(b) => Error::Backend(b),
            // The library's monitor is never canceled; kept as the backend's own variant regardless.
            MnfError::Canceled => Error::Backend(BackendError::Canceled),
        }
    }
}
