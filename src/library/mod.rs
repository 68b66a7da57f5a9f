//! The MNF as a Rust library on `ndarray`, without a server or files: [`Mnf`] takes a cube as an
//! `ArrayView3<T>` of shape `(lines, samples, bands)` and gives back an [`MnfFit`] with the components
//! as an `Array3<f32>` and the eigen system as `Array1<f64>` / `Array2<f64>`.
//!
//! It runs the same pipeline as `hypermnf run` and the service (`crate::mnf::pipeline`, on the backend
//! chosen), so it gives the same numbers, bit for bit on the CPU backend: the covariances and the
//! projection on the backend, the generalized eigenproblem in float64 (faer on the host, or cuSOLVER on
//! the device with the CUDA backend; see `crate::mnf::eigen`).
//!
//! A view in standard layout (C-contiguous, the default for arrays built by `ndarray`) is read in
//! place; any other view (sliced along samples or bands, permuted axes, reversed, Fortran order) is
//! copied once into standard layout first (`sample.rs` says why).
//!
//! ```
//! use hypermnf::cube::synthetic::{generate, SyntheticSpec};
//! use hypermnf::library::cube_to_array;
//! use hypermnf::{Backend, Mnf, NoiseEstimator};
//!
//! // A 32 × 32 × 16 int16 cube with a 5-dimensional signal plus white noise.
//! let cube: ndarray::Array3<i16> = cube_to_array(&generate(&SyntheticSpec::small(32, 32, 16))).unwrap();
//! let fit = Mnf::new()
//!     .components(5)
//!     .noise(NoiseEstimator::ShiftDifference)
//!     .backend(Backend::Cpu)
//!     .fit(cube.view())
//!     .unwrap();
//! assert_eq!(fit.components().dim(), (32, 32, 5));
//! // The leading components carry the signal (SNR far above 0), the last ones noise only (SNR near 0).
//! assert!(fit.snr()[0] > 100.0, "SNR {}", fit.snr());
//! assert!(fit.snr().iter().rev().take(5).all(|s| s.abs() < 1.0), "SNR {}", fit.snr());
//! ```

mod error;
mod fit;
mod sample;

pub use error::Error;
pub use fit::MnfFit;
pub use sample::{cube_to_array, Sample};

pub use crate::mnf::bands::{DropReason, DroppedBand};
/// Where the MNF runs: `Auto` (CUDA when a device and driver are found, else the CPU), `Cpu`, `Cuda`
/// (the custom kernels), `CudaCublas` (cuBLAS). The same choice as `hypermnf run --backend`.
pub use crate::mnf::BackendChoice as Backend;
pub use crate::mnf::{NoiseEstimator, Window};

use std::collections::BTreeMap;

use ndarray::ArrayView3;

use crate::cube::Cube;
use crate::mnf::{pipeline, MnfParams, Monitor};
use sample::{checked_dim, with_cube};

/// The MNF options, set one by one, then [`fit`](Mnf::fit) to a cube. The options and their defaults
/// are those of `hypermnf run` (`hypermnf run --help`): 10 components (at most the bands used), the
/// mean-filter noise estimator, the `Auto` backend, no bad bands, no no-data value, the noise from the
/// whole image. `components` and `snr` exclude each other.
///
/// ```
/// use hypermnf::{Backend, Mnf, NoiseEstimator, Window};
///
/// let mnf = Mnf::new()
///     .snr(2.0)                                   // keep the components of SNR >= 2
///     .noise(NoiseEstimator::MeanFilter)
///     .bad_bands([0, 1])                          // 0-based
///     .ignore_value(-9999.0)                      // a pixel holding it in any band is no-data
///     .noise_window(Window::from([0, 0, 20, 10])) // noise from columns 0..20, rows 0..10
///     .backend(Backend::Auto);
/// assert_eq!(mnf.params().snr, Some(2.0));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mnf {
    params: MnfParams,
}

impl Mnf {
    /// The defaults (see the type's doc).
    pub fn new() -> Self {
        Mnf::default()
    }

    /// Keep `k` components (`hypermnf run --components`). Exclusive with [`snr`](Self::snr).
    pub fn components(mut self, k: usize) -> Self {
        self.params.components = Some(k);
        self
    }

    /// Keep the components whose eigenvalue is at least 1 + `snr` (`--snr`). Exclusive with
    /// [`components`](Self::components).
    pub fn snr(mut self, snr: f64) -> Self {
        self.params.snr = Some(snr);
        self
    }

    /// How the noise is estimated from the image (`--noise`).
    pub fn noise(mut self, estimator: NoiseEstimator) -> Self {
        self.params.noise = estimator;
        self
    }

    /// Where it runs (`--backend`).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.params.backend = backend;
        self
    }

    /// Also compute the denoised cube during `fit` (`--inverse`), for [`MnfFit::inverse`].
    pub fn inverse(mut self, inverse: bool) -> Self {
        self.params.inverse = inverse;
        self
    }

    /// 0-based bands to exclude (`--bad-bands`), besides the constant and noise-free bands found.
    pub fn bad_bands(mut self, bands: impl IntoIterator<Item = usize>) -> Self {
        self.params.bad_bands = bands.into_iter().collect();
        self
    }

    /// The no-data value (`--ignore-value`): pixels holding it in any used band are left out of the
    /// statistics and are NaN in the outputs. In float cubes NaN and ±Inf are no-data without it
    /// (`f64::NAN` here only sets aside a value the cube's metadata gave).
    pub fn ignore_value(mut self, value: f64) -> Self {
        self.params.ignore_value = Some(value);
        self
    }

    /// Estimate the noise inside this rectangle only (`--noise-window`; `x` along samples, `y` along
    /// lines, ends excluded).
    pub fn noise_window(mut self, window: impl Into<Window>) -> Self {
        self.params.noise_window = Some(window.into());
        self
    }

    /// The options as the pipeline takes them (`hypermnf::mnf::MnfParams`, as in the metadata).
    pub fn params(&self) -> &MnfParams {
        &self.params
    }

    /// Fits the MNF to `cube`, `(lines, samples, bands)`, and projects it onto the components kept.
    ///
    /// Errors, never panics: [`Error::EmptyAxis`], [`Error::TooManyComponents`] (checked before the
    /// work where the count of bands already tells, after the statistics where constant bands are
    /// found), [`Error::InvalidOptions`], [`Error::Degenerate`] (a cube with too few pixels or no noise to
    /// estimate), [`Error::Backend`] (`Backend::Cuda` without a device).
    pub fn fit<T: Sample>(&self, cube: ArrayView3<'_, T>) -> Result<MnfFit, Error> {
        let dim = checked_dim(&cube)?;
        self.check_components(dim.2, None)?;
        self.params.validate(dim.0, dim.1, dim.2)?;
        let backend = crate::backend::select(self.params.backend)?;
        with_cube(cube, |c| self.fit_cube(c, backend))?
    }

    /// [`Error::TooManyComponents`] when more components are asked for than `used` bands (or, before
    /// the statistics, than the cube's bands less the bad bands).
    fn check_components(&self, bands: usize, used: Option<usize>) -> Result<(), Error> {
        let Some(requested) = self.params.components else { return Ok(()) };
        let available = used.unwrap_or_else(|| (0..bands).filter(|b| !self.params.bad_bands.contains(b)).count());
        if requested > available && self.params.snr.is_none() {
            return Err(Error::TooManyComponents { requested, available });
        }
        Ok(())
    }

    /// `pipeline::run`'s steps (prepare, `analyse_on`, `apply_on` on one prepared cube), keeping the
    /// eigen system that `run` drops, for `MnfFit::transform`.
    fn fit_cube(&self, cube: &Cube, backend: std::sync::Arc<dyn crate::backend::Backend>) -> Result<MnfFit, Error> {
        let monitor = Monitor::silent();
        let (out, system) = {
            let mut prepared = backend.prepare(cube, &monitor)?;
            let mut timings = BTreeMap::new();
            let system = pipeline::analyse_on(cube, &self.params, prepared.as_mut(), &monitor, &mut timings)?;
            self.check_components(cube.bands(), Some(system.used()))?;
            let out = pipeline::apply_on(cube, &self.params, &system, backend.as_ref(), prepared.as_mut(), &monitor, timings)?;
            (out, system)
        };
        Ok(MnfFit::new(out, system, &self.params, backend, (cube.lines(), cube.samples(), cube.bands())))
    }
}
