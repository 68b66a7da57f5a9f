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
    /// No-data value (overrides the header's `data ignore value`).
    pub ignore_value: Option<f64>,
    /// Compute the noise statistics inside this rectangle only.
    pub noise_window: Option<Window>,
    pub backend: BackendChoice,
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
        if let Some(v) = self.ignore_value {
            if v.is_nan() {
                return Err(MnfError::InvalidParams("ignore value must be a number, not NaN".into()));
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

#[cfg(test)]
mod tests {
    use super::*;

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
