//! What a user asks for: the MNF parameters shared by `hypermnf run`, the HTTP API and the cache key.

use serde::{Deserialize, Serialize};

use super::MnfError;

/// How the noise is estimated from the image itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NoiseEstimator {
    /// x − mean of the 8 neighbours (the published design's improved filter). Under white noise of
    /// variance σ² the residual has variance 9/8 σ².
    #[default]
    MeanFilter,
    /// x[i,j] − x[i+1,j+1] (Spectral Python's `noise_from_diffs`). Variance 2σ².
    ShiftDifference,
}

impl NoiseEstimator {
    /// Variance of the residual over σ² under white noise: the noise covariance is divided by this so that
    /// an eigenvalue of 1 means "noise only" whatever the estimator.
    pub fn scale(self) -> f64 {
        match self {
            NoiseEstimator::MeanFilter => 9.0 / 8.0,
            NoiseEstimator::ShiftDifference => 2.0,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            NoiseEstimator::MeanFilter => "mean-filter",
            NoiseEstimator::ShiftDifference => "shift-difference",
        }
    }
}

impl std::str::FromStr for NoiseEstimator {
    type Err = MnfError;
    fn from_str(s: &str) -> Result<Self, MnfError> {
        match s {
            "mean-filter" => Ok(NoiseEstimator::MeanFilter),
            "shift-difference" => Ok(NoiseEstimator::ShiftDifference),
            other => Err(MnfError::InvalidParams(format!(
                "noise estimator must be mean-filter or shift-difference, not {other:?}"
            ))),
        }
    }
}

/// Where the pipeline runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendChoice {
    /// CUDA when a device and driver are found, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// The custom kernels (kernels/*.cu).
    Cuda,
    /// The cuBLAS route (SYRK / GEMM), for comparison.
    CudaCublas,
}

impl BackendChoice {
    pub fn name(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Cpu => "cpu",
            BackendChoice::Cuda => "cuda",
            BackendChoice::CudaCublas => "cuda-cublas",
        }
    }
}

impl std::str::FromStr for BackendChoice {
    type Err = MnfError;
    fn from_str(s: &str) -> Result<Self, MnfError> {
        match s {
            "auto" => Ok(BackendChoice::Auto),
            "cpu" => Ok(BackendChoice::Cpu),
            "cuda" => Ok(BackendChoice::Cuda),
            "cuda-cublas" => Ok(BackendChoice::CudaCublas),
            other => Err(MnfError::InvalidParams(format!(
                "backend must be auto, cpu, cuda or cuda-cublas, not {other:?}"
            ))),
        }
    }
}

/// A rectangle of pixels, `x` along samples and `y` along lines, half-open like a NumPy slice:
/// columns x0..x1 and rows y0..y1 (x1, y1 excluded). Serialised as `[x0, y0, x1, y1]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "[usize; 4]", into = "[usize; 4]")]
pub struct Window {
    pub x0: usize,
    pub y0: usize,
    pub x1: usize,
    pub y1: usize,
}

impl From<[usize; 4]> for Window {
    fn from(v: [usize; 4]) -> Self {
        Window { x0: v[0], y0: v[1], x1: v[2], y1: v[3] }
    }
}
impl From<Window> for [usize; 4] {
    fn from(w: Window) -> Self {
        [w.x0, w.y0, w.x1, w.y1]
    }
}

impl std::str::FromStr for Window {
    type Err = MnfError;
    /// Parses `x0,y0,x1,y1`.
    fn from_str(s: &str) -> Result<Self, MnfError> {
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        let bad = || MnfError::InvalidParams(format!("noise window must be x0,y0,x1,y1 (non-negative integers), not {s:?}"));
        if parts.len() != 4 {
            return Err(bad());
        }
        let mut v = [0usize; 4];
        for (slot, p) in v.iter_mut().zip(&parts) {
            *slot = p.parse().map_err(|_| bad())?;
        }
        Ok(Window::from(v))
    }
}

impl Window {
    pub fn contains(&self, line: usize, sample: usize) -> bool {
        sample >= self.x0 && sample < self.x1 && line >= self.y0 && line < self.y1
    }

    /// Whether the window is a non-empty rectangle inside a `samples` × `lines` image.
    pub fn fits(&self, samples: usize, lines: usize) -> bool {
        self.x0 < self.x1 && self.y0 < self.y1 && self.x1 <= samples && self.y1 <= lines
    }
}

/// The MNF parameters. Defaults: 10 components (capped at the bands used), mean-filter noise.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MnfParams {
    /// Number of components to keep. Exclusive with `snr`.
    pub components: Option<usize>,
    /// Keep the components whose eigenvalue is at least 1 + snr. Exclusive with `components`.
    pub snr: Option<f64>,
    pub noise: NoiseEstimator,
    /// Also produce the inverse transform (denoised cube in the input band space).
    pub inverse: bool,
    /// 0-based band indices to exclude, in addition to the header's `bbl` and constant bands.
    pub bad_bands: Vec<usize>,
    /// No-data value (overrides the header's `data ignore value`). NaN is allowed (`"nan"` in JSON):
    /// in float cubes NaN and ±Inf are no-data whatever this says, so NaN here only sets aside the
    /// header's value.
    #[serde(with = "nodata_json")]
    pub ignore_value: Option<f64>,
    /// Compute the noise statistics inside this rectangle only.
    pub noise_window: Option<Window>,
    pub backend: BackendChoice,
    /// The service only: project with the eigen system of this job, or of this imported system (an
    /// id of the caller's), instead of computing one (`jobs::systems`). The command line and the
    /// library take a system file instead (`--system`, `MnfFit::from_system`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub statistics_from: Option<String>,
    /// The identity (`SystemFile::identity`) of the system `statistics_from` named when the job was
    /// created: set by the service (a request that gives it is refused), and so part of the job's
    /// cache digest: a job with a system never shares a cache entry with one without, or with
    /// another system.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub statistics_sha256: Option<String>,
    /// The service only: the COG result of an EMIT granule on its GLT's north-up grid (`ortho=true`,
    /// as `hypermnf run --ortho` writes it). The MNF is the same; the result file is not, so it is part
    /// of the job's identity (its canonical text, and so its cache digest). Left out of the canonical
    /// text when false, so that the digests of jobs without it are unchanged.
    #[serde(skip_serializing_if = "is_false")]
    pub ortho: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A no-data value in JSON: a number, or the string `"nan"` (any case) for NaN, which JSON numbers
/// cannot hold (serde_json would write it as null, which reads back as "no value").
pub mod nodata_json {
    use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(x) if x.is_nan() => s.serialize_some("nan"),
            Some(x) => s.serialize_some(x),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Value {
            Number(f64),
            Text(String),
        }
        match Option::<Value>::deserialize(d)? {
            None => Ok(None),
            Some(Value::Number(x)) => Ok(Some(x)),
            Some(Value::Text(t)) if t.eq_ignore_ascii_case("nan") => Ok(Some(f64::NAN)),
            Some(Value::Text(t)) => Err(D::Error::custom(format!("ignore_value must be a number or \"nan\", not {t:?}"))),
        }
    }
}

/// Components kept when neither `components` nor `snr` is given.
pub const DEFAULT_COMPONENTS: usize = 10;

impl MnfParams {
    /// Checks the parameters against the cube's shape; every violation is an `InvalidParams` error.
    pub fn validate(&self, lines: usize, samples: usize, bands: usize) -> Result<(), MnfError> {
        if self.components.is_some() && self.snr.is_some() {
            return Err(MnfError::InvalidParams("give either components or snr, not both".into()));
        }
        if self.components == Some(0) {
            return Err(MnfError::InvalidParams("components must be at least 1".into()));
        }
        if let Some(k) = self.components {
            if k > bands {
                return Err(MnfError::InvalidParams(format!(
                    "components ({k}) exceeds the number of bands ({bands})"
                )));
            }
        }
        if let Some(s) = self.snr {
            if !s.is_finite() || s < 0.0 {
                return Err(MnfError::InvalidParams(format!("snr must be a finite number >= 0, not {s}")));
            }
        }
        if let Some(&b) = self.bad_bands.iter().find(|&&b| b >= bands) {
            return Err(MnfError::InvalidParams(format!(
                "bad band {b} is out of range: the cube has bands 0..{}",
                bands - 1
            )));
        }
        if let Some(w) = self.noise_window {
            if !w.fits(samples, lines) {
                return Err(MnfError::InvalidParams(format!(
                    "noise window {},{},{},{} must satisfy x0 < x1 <= samples ({samples}) and y0 < y1 <= lines ({lines})",
                    w.x0, w.y0, w.x1, w.y1
                )));
            }
        }
        Ok(())
    }
}

/// Why an image of `pixels` pixels gives no MNF (fewer than 2).
pub(crate) fn few_pixels_message(pixels: u64) -> String {
    format!("the image has {pixels} pixel(s): MNF needs at least 2 (and the noise estimate a few more)")
}

/// Why `residuals` (fewer than 2) noise residuals give no noise estimate.
pub(crate) fn few_residuals_message(params: &MnfParams, residuals: u64) -> String {
    let need = match params.noise {
        NoiseEstimator::MeanFilter => "the mean-filter estimator needs 3 × 3 neighbourhoods of valid pixels (at least 3 lines and 3 samples)",
        NoiseEstimator::ShiftDifference => "the shift-difference estimator needs pairs of valid diagonal neighbours (at least 2 lines and 2 samples)",
    };
    let window = if params.noise_window.is_some() { " inside the noise window" } else { "" };
    format!("only {residuals} noise residual(s) in the image{window}: {need}")
}

impl MnfParams {
    /// [`validate`](Self::validate), and what else the shape and the header's `bbl` tell before any
    /// sample is read: the errors a job of these parameters could only end in (the service refuses
    /// them at submit, with the codes the job would have failed with).
    ///
    /// * every band excluded by `bbl` and `bad_bands` (`invalid_params`);
    /// * too few pixels, or noise residuals (inside the noise window, if any), for the bands left
    ///   (`degenerate_input`): a covariance of B bands needs at least B + 1 samples. The counts here
    ///   are upper bounds (no-data pixels only lower them), so nothing that could succeed is refused;
    ///   the pipeline checks the real counts again.
    pub fn admit(&self, lines: usize, samples: usize, bands: usize, bbl: Option<&[bool]>) -> Result<(), MnfError> {
        self.validate(lines, samples, bands)?;
        if self.statistics_from.is_some() {
            // Only the projection runs: no statistics, so no count of pixels or residuals to reach
            // (the system's bands are checked against the cube by `jobs::systems`).
            return Ok(());
        }
        let used = super::bands::preselect(bands, bbl, &self.bad_bands).used.len();
        if used == 0 {
            return Err(MnfError::InvalidParams("every band is excluded (bbl and bad bands)".into()));
        }
        let pixels = lines as u64 * samples as u64;
        let residuals = self.max_noise_residuals(lines, samples);
        if pixels < 2 {
            return Err(MnfError::Degenerate(few_pixels_message(pixels)));
        }
        if residuals < 2 {
            return Err(MnfError::Degenerate(few_residuals_message(self, residuals)));
        }
        let need = used as u64 + 1;
        if pixels < need || residuals < need {
            let window = if self.noise_window.is_some() { " inside the noise window" } else { "" };
            return Err(MnfError::Degenerate(format!(
                "too few pixels for the number of bands: {lines} × {samples} = {pixels} pixel(s) give at most {residuals} \
                 {} noise residual(s){window} for {used} band(s) after bad bands; each covariance of {used} bands needs \
                 at least {need} samples. Use a larger cube{}, or fewer bands (bad_bands)",
                self.noise.name(),
                if self.noise_window.is_some() { " or noise window" } else { "" }
            )));
        }
        Ok(())
    }

    /// The most noise residuals the estimator can form on a `lines` × `samples` image (every pixel
    /// valid), counting only residuals centred inside the noise window when there is one.
    pub fn max_noise_residuals(&self, lines: usize, samples: usize) -> u64 {
        // The pixels a residual may be centred on: the mean filter needs all 8 neighbours inside the
        // image, the shift difference its lower-right neighbour.
        let (ys, xs) = match self.noise {
            NoiseEstimator::MeanFilter => (1..lines.saturating_sub(1), 1..samples.saturating_sub(1)),
            NoiseEstimator::ShiftDifference => (0..lines.saturating_sub(1), 0..samples.saturating_sub(1)),
        };
        let (ys, xs) = match self.noise_window {
            Some(w) => (ys.start.max(w.y0)..ys.end.min(w.y1), xs.start.max(w.x0)..xs.end.min(w.x1)),
            None => (ys, xs),
        };
        ys.len() as u64 * xs.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admit_refuses_what_the_shape_already_dooms() {
        let p = |json: &str| -> MnfParams { serde_json::from_str(json).unwrap() };
        // 10 x 10 pixels: 64 mean-filter residuals, 81 shift differences.
        assert_eq!(p("{}").max_noise_residuals(10, 10), 64);
        assert_eq!(p(r#"{"noise": "shift-difference"}"#).max_noise_residuals(10, 10), 81);
        assert_eq!(p(r#"{"noise_window": [0, 0, 3, 10]}"#).max_noise_residuals(10, 10), 2 * 8);
        assert!(p("{}").admit(10, 10, 63, None).is_ok());
        let e = p("{}").admit(10, 10, 425, None).unwrap_err();
        assert_eq!(e.code(), "degenerate_input");
        let msg = e.to_string();
        assert!(msg.contains("100 pixel") && msg.contains("64") && msg.contains("425 band"), "{msg}");
        assert!(!msg.contains("linear combination"), "{msg}");
        // Bad bands lower the band count: 425 bands, 400 of them bad, fit.
        let bad: Vec<usize> = (0..400).collect();
        let q = MnfParams { bad_bands: bad, ..MnfParams::default() };
        assert!(q.admit(10, 10, 425, None).is_ok());
        // bbl too.
        let bbl: Vec<bool> = (0..425).map(|b| b >= 400).collect();
        assert!(p("{}").admit(10, 10, 425, Some(&bbl)).is_ok());
        // Every band excluded.
        let e = MnfParams { bad_bands: vec![0, 1], ..MnfParams::default() }.admit(5, 5, 2, None).unwrap_err();
        assert_eq!(e.code(), "invalid_params");
        let e = MnfParams { bad_bands: vec![0], ..MnfParams::default() }.admit(5, 5, 2, Some(&[true, false])).unwrap_err();
        assert_eq!(e.code(), "invalid_params");
        // A noise window with too few residuals for 3 bands: it covers two of them.
        let e = p(r#"{"noise_window": [0, 0, 3, 2]}"#).admit(20, 20, 3, None).unwrap_err();
        assert!(e.to_string().contains("noise window"), "{e}");
        assert!(p(r#"{"noise_window": [0, 0, 4, 4]}"#).admit(20, 20, 3, None).is_ok());
    }

    #[test]
    fn a_window_fits_when_it_is_a_non_empty_rectangle_inside_the_image() {
        let w = |x0, y0, x1, y1| Window { x0, y0, x1, y1 };
        assert!(w(0, 0, 4, 3).fits(4, 3));
        assert!(w(3, 2, 4, 3).fits(4, 3));
        assert!(!w(0, 0, 5, 3).fits(4, 3), "past the last sample");
        assert!(!w(0, 0, 4, 4).fits(4, 3), "past the last line");
        assert!(!w(2, 0, 2, 3).fits(4, 3), "empty");
        assert!(!w(0, 3, 4, 1).fits(4, 3), "inverted");
    }
}
