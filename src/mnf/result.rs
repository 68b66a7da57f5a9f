//! What a run reports: the JSON metadata written next to every result (`OUT-stem.json`) and served by
//! `GET /v1/jobs/{id}/metadata`, and the eigen system it is computed from.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::bands::DroppedBand;
use super::params::{MnfParams, Window};

/// The shape and encoding of the input cube.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputInfo {
    pub lines: usize,
    pub samples: usize,
    pub bands: usize,
    pub data_type: String,
    pub byte_order: String,
    /// Layout of the source file (bsq, bil, bip), when known.
    pub interleave: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NoiseInfo {
    /// `mean-filter` or `shift-difference`.
    pub estimator: String,
    /// The residual covariance was divided by this (9/8 or 2) so that an eigenvalue of 1 means noise only.
    pub scale: f64,
    /// Residuals that entered the noise covariance.
    pub samples: u64,
    pub window: Option<Window>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PixelInfo {
    pub total: u64,
    /// Pixels that entered the data statistics.
    pub used: u64,
    /// No-data pixels (excluded, NaN in the output): those holding the no-data value, and in float
    /// cubes those holding NaN or ±Inf, in any band checked.
    pub masked: u64,
    /// The no-data value given (by the request, else the header): a number, or NaN (`"nan"` in JSON).
    #[serde(default, with = "super::params::nodata_json")]
    pub ignore_value: Option<f64>,
}

/// The metadata of one result. `transform` rows follow `bands_used`, columns the kept components;
/// components are Z = transformᵀ (x − means) per pixel, centred on the band means.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    pub hypermnf_version: String,
    pub input: InputInfo,
    pub params: MnfParams,
    pub backend: String,
    pub device: String,
    /// Number of components kept (k).
    pub components: usize,
    /// All eigenvalues, descending (λ = 1 + SNR; ≈ 1 means noise only).
    pub eigenvalues: Vec<f64>,
    /// λ − 1 for every eigenvalue.
    pub snr: Vec<f64>,
    /// 0-based input bands used, ascending.
    pub bands_used: Vec<usize>,
    pub dropped_bands: Vec<DroppedBand>,
    pub noise: NoiseInfo,
    pub pixels: PixelInfo,
    /// Mean of each used band.
    pub means: Vec<f64>,
    /// bands_used.len() rows × components columns.
    pub transform: Vec<Vec<f64>>,
    /// Whether the denoised cube (inverse MNF) was produced.
    pub inverse: bool,
    /// Wall-clock milliseconds per stage (read, statistics, eigen, projection, inverse, write).
    pub timings_ms: BTreeMap<String, f64>,
    /// Set by the service when the eigen system was not computed by this job but taken from the job
    /// cache (only the projection ran); absent otherwise, and always absent from `hypermnf run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statistics: Option<StatisticsReuse>,
    /// Set by the service for a job of a batch (`POST /v1/batches`): the batch's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
    /// What the input's header said about its bands and its place on the ground: this request's own
    /// header, never another one's (the job cache keys on it).
    #[serde(default)]
    pub source: SourceInfo,
}

/// The input's band and georeferencing metadata, as its header gave it (all null for a `.npy`).
/// `wavelength`, `fwhm` and `band_names` have one entry per input band: index them with
/// `bands_used` for the bands the transform uses.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SourceInfo {
    pub wavelength: Option<Vec<f64>>,
    /// As the header wrote it (`Nanometers`, `Micrometers`, ...).
    pub wavelength_units: Option<String>,
    pub fwhm: Option<Vec<f64>>,
    pub band_names: Option<Vec<String>>,
    pub description: Option<String>,
    /// ENVI `map info`, verbatim.
    pub map_info: Option<String>,
    /// ENVI `coordinate system string` (WKT), verbatim.
    pub coordinate_system_string: Option<String>,
    /// An EMIT granule's GLT grid (`{rows, cols}`, its `emit glt` key): the input is in sensor
    /// geometry, which a COG made later from the stored result says (`output::cog::source_meta`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emit_glt: Option<String>,
}

impl SourceInfo {
    pub fn of(meta: &crate::cube::CubeMeta) -> SourceInfo {
        SourceInfo {
            wavelength: meta.wavelength.clone(),
            wavelength_units: meta.wavelength_units.clone(),
            fwhm: meta.fwhm.clone(),
            band_names: meta.band_names.clone(),
            description: meta.description.clone(),
            map_info: meta.map_info.clone(),
            coordinate_system_string: meta.extra_value("coordinate system string").filter(|v| !v.is_empty()).map(str::to_string),
            // `cube::gdal::emit::GLT_KEY` (read from a granule, or from the ENVI header of one decoded).
            emit_glt: meta.extra_value("emit glt").filter(|v| !v.is_empty()).map(str::to_string),
        }
    }
}

/// Where a reused eigen system came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatisticsReuse {
    /// Always true: the statistics passes and the eigen decomposition were skipped.
    pub reused: bool,
    /// The job that computed them, when it belongs to the same owner (null otherwise: another
    /// owner's job id is not disclosed). Null with `statistics_from` (see `from`).
    pub from_job: Option<String>,
    /// `device`: the cube and its eigen system were still in GPU memory (nothing was read or
    /// uploaded); `storage`: the eigen system was read from the data dir; `statistics_from`: the
    /// request named the system (`from`); `pooled`: the pooled system of the job's batch (the
    /// statistics of all its cubes).
    pub source: ReuseSource,
    /// With `statistics_from`: the job, imported system or batch id the request named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// With `statistics_from`: the system's identity (`SystemFile::identity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_sha256: Option<String>,
    /// The batch whose pooled system this job was projected with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReuseSource {
    Device,
    Storage,
    /// The job's `statistics_from` named the system.
    #[serde(rename = "statistics_from")]
    StatisticsFrom,
    /// The job is a member of a pooled batch.
    Pooled,
}

/// The full eigen system of one cube and noise model: enough to project with any k, or to invert.
#[derive(Debug, Clone, PartialEq)]
pub struct EigenSystem {
    pub bands_used: Vec<usize>,
    pub dropped_bands: Vec<DroppedBand>,
    pub means: Vec<f64>,
    /// Descending.
    pub eigenvalues: Vec<f64>,
    /// u × u row-major (u = bands_used.len()); column c is component c.
    pub transform: Vec<f64>,
    /// The scaled noise covariance of the used bands, u × u row-major (for the inverse transform).
    pub noise_covariance: Vec<f64>,
    pub noise_samples: u64,
    pub pixels_used: u64,
    pub pixels_masked: u64,
}

impl EigenSystem {
    pub fn used(&self) -> usize {
        self.bands_used.len()
    }

    /// The first k columns of the transform, u × k row-major.
    pub fn transform_k(&self, k: usize) -> Vec<f64> {
        let u = self.used();
        let mut t = Vec::with_capacity(u * k);
        for r in 0..u {
            t.extend_from_slice(&self.transform[r * u..r * u + k]);
        }
        t
    }

    /// A = C_N T_k T_kᵀ (u × u row-major): the inverse MNF keeping k components, x̂ = μ + A (x − μ).
    ///
    /// Why this order: z = Tᵀ(x − μ) and Tᵀ C_N T = I give (Tᵀ)⁻¹ = C_N T, so x − μ = C_N T z, and
    /// keeping k components gives C_N T_k T_kᵀ (x − μ). (Spectral Python writes the same map for row
    /// vectors: (x − μ)ᵀ T_k T_kᵀ C_N.)
    pub fn denoise_matrix(&self, k: usize) -> Vec<f64> {
        let u = self.used();
        let t = self.transform_k(k);
        // G = C_N T_k (u × k), then A = G T_kᵀ.
        let mut g = vec![0.0; u * k];
        for r in 0..u {
            for c in 0..k {
                let mut s = 0.0;
                for i in 0..u {
                    s += self.noise_covariance[r * u + i] * t[i * k + c];
                }
                g[r * k + c] = s;
            }
        }
        let mut a = vec![0.0; u * u];
        for r in 0..u {
            for j in 0..u {
                let mut s = 0.0;
                for c in 0..k {
                    s += g[r * k + c] * t[j * k + c];
                }
                a[r * u + j] = s;
            }
        }
        a
    }
}
