//! A fitted MNF: the components of the cube it was fitted on, its eigen system, and that system applied
//! to other cubes (`transform`, `denoise`).

use std::sync::Arc;

use ndarray::{Array1, Array2, Array3, ArrayView3};

use super::sample::{checked_dim, with_cube, Sample};
use super::Error;
use crate::backend::Backend as ComputeBackend;
use crate::mnf::bands::DroppedBand;
use crate::mnf::result::EigenSystem;
use crate::mnf::result::{InputInfo, NoiseInfo, PixelInfo, SourceInfo};
use crate::mnf::system_file::SystemFile;
use crate::mnf::{pipeline, Metadata, MnfOutput, MnfParams, Monitor};

/// The result of [`Mnf::fit`](super::Mnf::fit). Eigenvalues, SNR, the transform and the means are
/// float64 (the eigen system is solved in float64); components and the denoised cube are float32, as
/// `hypermnf run` writes them, with NaN at no-data pixels.
///
/// ```
/// use hypermnf::cube::synthetic::{generate, SyntheticSpec};
/// use hypermnf::library::cube_to_array;
/// use hypermnf::{Backend, Mnf};
///
/// let cube = cube_to_array::<i16>(&generate(&SyntheticSpec::small(24, 24, 12))).unwrap();
/// let fit = Mnf::new().components(3).inverse(true).backend(Backend::Cpu).fit(cube.view()).unwrap();
/// assert_eq!(fit.components().dim(), (24, 24, 3));
/// assert_eq!(fit.transform_matrix().dim(), (12, 3)); // bands used × components
/// assert_eq!(fit.bands_used().len(), 12);
/// // The same system applied to the same cube gives the same components, bit for bit.
/// assert_eq!(&fit.transform(cube.view()).unwrap(), fit.components());
/// // The denoised cube: in the input's band space, within about the noise (σ = 10) of the input.
/// let denoised = fit.inverse().unwrap();
/// assert_eq!(denoised.dim(), (24, 24, 12));
/// let mean_square: f64 =
///     denoised.iter().zip(&cube).map(|(d, &x)| (*d as f64 - x as f64).powi(2)).sum::<f64>() / cube.len() as f64;
/// assert!(mean_square.sqrt() < 15.0, "RMS change {}", mean_square.sqrt());
/// ```
pub struct MnfFit {
    components: Array3<f32>,
    denoised: Option<Array3<f32>>,
    eigenvalues: Array1<f64>,
    snr: Array1<f64>,
    transform: Array2<f64>,
    means: Array1<f64>,
    system: EigenSystem,
    /// What `transform` and `denoise` apply: the fit's options with the number of components kept.
    apply_params: MnfParams,
    metadata: Metadata,
    /// The backend that fitted, kept to apply the system with (`Auto` is not probed again).
    backend: Arc<dyn ComputeBackend>,
    bands: usize,
}

impl std::fmt::Debug for MnfFit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MnfFit")
            .field("components", &self.components.dim())
            .field("bands_used", &self.system.bands_used.len())
            .field("eigenvalues", &self.eigenvalues)
            .field("backend", &self.backend.name())
            .field("denoised", &self.denoised.is_some())
            .finish_non_exhaustive()
    }
}

/// `lines × samples × n` float32 values as an array (a move, not a copy).
fn array3(values: Vec<f32>, lines: usize, samples: usize, n: usize) -> Array3<f32> {
    Array3::from_shape_vec((lines, samples, n), values).expect("the backends write lines x samples x n values")
}

impl MnfFit {
    /// From the pipeline's output for a `lines × samples × bands` cube, with the system it was projected
    /// with.
    pub(super) fn new(
        out: MnfOutput,
        system: EigenSystem,
        fit_params: &MnfParams,
        backend: Arc<dyn ComputeBackend>,
        (lines, samples, bands): (usize, usize, usize),
    ) -> Self {
        let k = out.k;
        let u = system.used();
        let transform = Array2::from_shape_vec((u, k), system.transform_k(k)).expect("transform_k is u x k");
        let apply_params = MnfParams { components: Some(k), snr: None, inverse: false, ..fit_params.clone() };
        MnfFit {
            components: array3(out.components, lines, samples, k),
            denoised: out.denoised.map(|d| array3(d, lines, samples, bands)),
            eigenvalues: Array1::from(system.eigenvalues.clone()),
            snr: system.eigenvalues.iter().map(|l| l - 1.0).collect(),
            transform,
            means: Array1::from(system.means.clone()),
            system,
            apply_params,
            metadata: out.metadata,
            backend,
            bands,
        }
    }

    /// A fit from a system file (`GET /v1/jobs/{id}/system`, `hypermnf run --export-system`; see
    /// [`SystemFile`]), to apply that system with [`transform`](Self::transform) and
    /// [`denoise`](Self::denoise), bit for bit as `hypermnf run --system` and a service job with
    /// `statistics_from` apply it on the same backend.
    ///
    /// `options` says what acts per pixel, as for a fit: the components kept (`components`, `snr`, or
    /// the default 10, at most the system's bands used), `bad_bands`, `ignore_value`, and the
    /// backend. The statistics options (`noise`, `noise_window`) are the system's, whatever
    /// `options` says.
    ///
    /// Such a fit has no fitted cube: [`components`](Self::components) is an empty
    /// `(0, 0, k)` array, [`inverse`](Self::inverse) is [`Error::InverseNotRequested`], and the
    /// [`metadata`](Self::metadata) has 0 lines and 0 samples. Everything about the system
    /// (eigenvalues, transform, means, bands used and dropped) is the file's.
    ///
    /// ```
    /// use hypermnf::cube::synthetic::{generate, SyntheticSpec};
    /// use hypermnf::library::cube_to_array;
    /// use hypermnf::mnf::system_file::{Source, SystemFile};
    /// use hypermnf::{Backend, Mnf, MnfFit};
    ///
    /// let cube = cube_to_array::<i16>(&generate(&SyntheticSpec::small(24, 24, 12))).unwrap();
    /// let mnf = Mnf::new().components(3).backend(Backend::Cpu);
    /// let fit = mnf.fit(cube.view()).unwrap();
    /// let file = SystemFile::of_run(Source::Run("cube.npy".into()), fit.metadata(), fit.eigen_system());
    /// let json = file.to_json(); // what `--export-system` writes
    /// let again = MnfFit::from_system(&SystemFile::from_json(&json).unwrap(), &mnf).unwrap();
    /// assert_eq!(again.transform(cube.view()).unwrap(), fit.components());
    /// ```
    pub fn from_system(file: &SystemFile, options: &super::Mnf) -> Result<MnfFit, Error> {
        let params = file.apply_params(options.params());
        if params.components.is_some() && params.snr.is_some() {
            return Err(Error::InvalidOptions("give either components or snr, not both".into()));
        }
        let system = file.system.clone();
        if params.components == Some(0) {
            return Err(Error::InvalidOptions("components must be at least 1".into()));
        }
        if let Some(requested) = params.components {
            if requested > system.used() {
                return Err(Error::TooManyComponents { requested, available: system.used() });
            }
        }
        let k = pipeline::choose_k(&params, &system.eigenvalues)?;
        let backend = crate::backend::select(params.backend)?;
        let u = system.used();
        let metadata = Metadata {
            hypermnf_version: env!("CARGO_PKG_VERSION").to_string(),
            input: InputInfo { lines: 0, samples: 0, bands: file.input.bands, data_type: String::new(), byte_order: String::new(), interleave: None },
            params: params.clone(),
            backend: backend.name().to_string(),
            device: backend.device(),
            components: k,
            eigenvalues: system.eigenvalues.clone(),
            snr: system.eigenvalues.iter().map(|l| l - 1.0).collect(),
            bands_used: system.bands_used.clone(),
            dropped_bands: system.dropped_bands.clone(),
            noise: NoiseInfo { estimator: file.noise.estimator.name().to_string(), scale: file.noise.scale, samples: system.noise_samples, window: file.noise.window },
            pixels: PixelInfo {
                total: system.pixels_used + system.pixels_masked,
                used: system.pixels_used,
                masked: system.pixels_masked,
                ignore_value: file.ignore_value,
            },
            means: system.means.clone(),
            transform: (0..u).map(|r| system.transform[r * u..r * u + k].to_vec()).collect(),
            inverse: false,
            timings_ms: Default::default(),
            statistics: None,
        batch: None,
            source: SourceInfo {
                wavelength: file.input.wavelengths.clone(),
                wavelength_units: file.input.wavelength_units.clone(),
                fwhm: file.input.fwhm.clone(),
                ..SourceInfo::default()
            },
        };
        let out = MnfOutput { components: Vec::new(), k, denoised: None, metadata };
        Ok(MnfFit::new(out, system, &params, backend, (0, 0, file.input.bands)))
    }

    /// The components kept, `(lines, samples, k)`: Z = Tᵀ(x − μ) per pixel, NaN at no-data pixels.
    pub fn components(&self) -> &Array3<f32> {
        &self.components
    }

    /// The components, taken out of the fit.
    pub fn into_components(self) -> Array3<f32> {
        self.components
    }

    /// The number of components kept (k).
    pub fn k(&self) -> usize {
        self.components.dim().2
    }

    /// Every eigenvalue of the generalized problem C_D w = λ C_N w, descending, one per band used
    /// (λ = 1 + SNR: about 1 means noise only).
    pub fn eigenvalues(&self) -> &Array1<f64> {
        &self.eigenvalues
    }

    /// λ − 1 for every eigenvalue: the signal-to-noise ratio of each component.
    pub fn snr(&self) -> &Array1<f64> {
        &self.snr
    }

    /// The transform T of the kept components, `(bands used, k)`: column c holds the weights of
    /// component c over [`bands_used`](Self::bands_used). (Not to be confused with
    /// [`transform`](Self::transform), which applies it to a cube.)
    pub fn transform_matrix(&self) -> &Array2<f64> {
        &self.transform
    }

    /// The mean of each band used, what the components are centred on.
    pub fn means(&self) -> &Array1<f64> {
        &self.means
    }

    /// The 0-based input bands the MNF was computed on, ascending.
    pub fn bands_used(&self) -> &[usize] {
        &self.system.bands_used
    }

    /// The bands left out, each with its reason (bad band list, `bad_bands`, constant, noise-free).
    pub fn dropped_bands(&self) -> &[DroppedBand] {
        &self.system.dropped_bands
    }

    /// The whole eigen system: all components (not only the kept ones), the noise covariance, pixel
    /// and noise sample counts.
    pub fn eigen_system(&self) -> &EigenSystem {
        &self.system
    }

    /// The metadata `hypermnf run` writes next to its output (`OUT-stem.json`), for this fit (without
    /// the read and write times, which the library does not have).
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The backend that fitted: `cpu`, `cuda` or `cuda-cublas`.
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// The denoised cube (the inverse MNF keeping k components), `(lines, samples, bands)`, computed
    /// during `fit` when it was asked for with [`Mnf::inverse`](super::Mnf::inverse); the bands not used
    /// pass through unchanged. [`Error::InverseNotRequested`] otherwise; [`denoise`](Self::denoise)
    /// computes it afterwards.
    pub fn inverse(&self) -> Result<&Array3<f32>, Error> {
        self.denoised.as_ref().ok_or(Error::InverseNotRequested)
    }

    /// The fitted system applied to `cube` (another scene of the same sensor, or the same cube): its
    /// k components, `(lines, samples, k)`, centred on the fitted means. The options of the fit that
    /// apply per pixel (`bad_bands`, `ignore_value`) apply here too. Copies `cube` first when it is
    /// not in standard layout, as `fit` does. A pixel with a non-finite sample in a used band is no-data:
    /// its components are NaN (pixels are projected one by one; nothing else is affected).
    pub fn transform<T: Sample>(&self, cube: ArrayView3<'_, T>) -> Result<Array3<f32>, Error> {
        let (lines, samples, _) = self.check_bands(&cube)?;
        let out = self.apply(cube, &self.apply_params)?;
        Ok(array3(out.components, lines, samples, self.k()))
    }

    /// The inverse MNF of `cube` with the fitted system: `cube` denoised, `(lines, samples, bands)`.
    /// On the fitted cube it equals [`inverse`](Self::inverse). It runs the projection too (the pipeline
    /// does both in one call), so ask for `Mnf::inverse(true)` when the fitted cube's is all you need.
    pub fn denoise<T: Sample>(&self, cube: ArrayView3<'_, T>) -> Result<Array3<f32>, Error> {
        let (lines, samples, bands) = self.check_bands(&cube)?;
        let params = MnfParams { inverse: true, ..self.apply_params.clone() };
        let out = self.apply(cube, &params)?;
        let denoised = out.denoised.ok_or_else(|| Error::Degenerate("the backend produced no inverse".into()))?;
        Ok(array3(denoised, lines, samples, bands))
    }

    fn check_bands<T>(&self, cube: &ArrayView3<'_, T>) -> Result<(usize, usize, usize), Error> {
        let dim = checked_dim(cube)?;
        if dim.2 != self.bands {
            return Err(Error::BandCountMismatch { expected: self.bands, got: dim.2 });
        }
        Ok(dim)
    }

    /// The pipeline's projection (and inverse, if `params` asks) of `cube` with the fitted system.
    fn apply<T: Sample>(&self, cube: ArrayView3<'_, T>, params: &MnfParams) -> Result<MnfOutput, Error> {
        let backend = self.backend.as_ref();
        with_cube(cube, |c| pipeline::apply(c, params, &self.system, backend, &Monitor::silent()))?.map_err(Error::from)
    }
}
