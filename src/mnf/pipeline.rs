//! The MNF pipeline: statistics pass on a backend → band selection and the generalized eigenproblem on
//! the host (float64) → projection pass (and the inverse, if asked) on the same backend.
//!
//! `analyse` stops after the eigen system (what the statistics-level cache keeps); `apply` projects with
//! an eigen system; `run` is both. `analyse_on` and `apply_on` do the same on a cube a backend has
//! already prepared (the job cache keeps prepared cubes on the device between jobs); `analyse_on`
//! followed by `apply_on` on one prepared cube is exactly `run`.

use std::collections::BTreeMap;
use std::time::Instant;

use super::bands::{self, BandSelection};
use super::compute::{Backend, BackendError, PreparedCube};
use super::eigen::{self, NoiseWhitening};
use super::params::{MnfParams, DEFAULT_COMPONENTS};
use super::result::{EigenSystem, InputInfo, Metadata, NoiseInfo, PixelInfo, SourceInfo};
use super::stats::{self, Denoise, Moments, Projection, Statistics, StatsSpec};
use super::{MnfError, Monitor, Stage};
use crate::cube::Cube;

/// What one MNF run produces.
#[derive(Debug, Clone)]
pub struct MnfOutput {
    /// lines × samples × k, BIP (C-order (lines, samples, k)); NaN at no-data pixels. Empty when they
    /// went to a [`ComponentSink`] instead ([`apply_on_to`]).
    pub components: Vec<f32>,
    pub k: usize,
    /// lines × samples × bands when the inverse was asked for.
    pub denoised: Option<Vec<f32>>,
    pub metadata: Metadata,
}

/// Runs the whole pipeline on `backend`.
pub fn run(cube: &Cube, params: &MnfParams, backend: &dyn Backend, monitor: &Monitor) -> Result<MnfOutput, MnfError> {
    let mut timings = BTreeMap::new();
    let mut prepared = backend.prepare(cube, monitor)?;
    let system = analyse_on(cube, params, prepared.as_mut(), monitor, &mut timings)?;
    apply_on(cube, params, &system, backend, prepared.as_mut(), monitor, timings)
}

/// The statistics pass and the eigen system, without projecting.
pub fn analyse(cube: &Cube, params: &MnfParams, backend: &dyn Backend, monitor: &Monitor) -> Result<EigenSystem, MnfError> {
    let mut prepared = backend.prepare(cube, monitor)?;
    analyse_on(cube, params, prepared.as_mut(), monitor, &mut BTreeMap::new())
}

/// Projects (and inverts, if asked) with an eigen system computed earlier: for the same cube and noise
/// model, or for another cube of the same bands (a system file, `mnf::system_file`). Only
/// `components`, `snr` and `inverse` of `params` matter here, and the per-pixel no-data checks
/// (`bad_bands`, `ignore_value`).
pub fn apply(
    cube: &Cube,
    params: &MnfParams,
    system: &EigenSystem,
    backend: &dyn Backend,
    monitor: &Monitor,
) -> Result<MnfOutput, MnfError> {
    let mut prepared = backend.prepare(cube, monitor)?;
    apply_on(cube, params, system, backend, prepared.as_mut(), monitor, BTreeMap::new())
}

/// The no-data value given: the request's, else the header's (what the metadata reports).
fn ignore_value(cube: &Cube, params: &MnfParams) -> Option<f64> {
    params.ignore_value.or(cube.meta.ignore_value)
}

/// The no-data value the passes compare with ([`crate::mnf::stats::is_masked`]). NaN and ±Inf are
/// no-data in float cubes (the no-data of float products written by GDAL, xarray and rasterio), so a
/// float cube without a value gets NaN, which turns masking on and equals nothing: exactly the
/// pixels holding a non-finite value in a band checked are left out, as an ignore value would leave
/// them out. An integer cube cannot hold NaN, and keeps the passes without a mask.
pub(crate) fn nodata(cube: &Cube, params: &MnfParams) -> Option<f64> {
    ignore_value(cube, params).or_else(|| cube.dtype().is_float().then_some(f64::NAN))
}

/// `analyse` on a prepared cube; adds the statistics and eigen times (ms) to `timings`.
pub fn analyse_on(
    cube: &Cube,
    params: &MnfParams,
    prepared: &mut dyn PreparedCube,
    monitor: &Monitor,
    timings: &mut BTreeMap<String, f64>,
) -> Result<EigenSystem, MnfError> {
    params.admit(cube.lines(), cube.samples(), cube.bands(), cube.meta.bbl.as_deref())?;
    let pre = bands::preselect(cube.bands(), cube.meta.bbl.as_deref(), &params.bad_bands);
    if pre.used.is_empty() {
        return Err(MnfError::InvalidParams("every band is excluded (bbl and bad bands)".into()));
    }
    let spec = StatsSpec {
        noise: params.noise,
        window: params.noise_window,
        ignore_value: nodata(cube, params),
        mask_bands: pre.used.clone(),
    };
    let scale = params.noise.scale();

    // Band selection and the noise half of the eigenproblem run as soon as the noise moments exist
    // (on the GPU, while the data covariance is still being computed). Where the backend solves the
    // eigenproblem on its device, it factors C_N there too, and the host only selects bands and scales
    // C_N here (the callback is on the critical path: the device is about to finish C_D).
    let defer = prepared.eigen_solver().is_some();
    ask_early_solve(prepared, &pre.used, scale);
    let t0 = Instant::now();
    let mut early: Option<(Whitened, f64)> = None;
    let stats = prepared.statistics(
        &spec,
        &mut |noise: &Moments| {
            let t = Instant::now();
            early = Some((whiten(&pre, noise, None, scale, defer), t.elapsed().as_secs_f64() * 1e3));
        },
        monitor,
    )?;
    let mut stats_ms = t0.elapsed().as_secs_f64() * 1e3;
    let early_solution = prepared.early_solution();
    check_statistics(&stats, &pre, params)?;

    // The eigen stage, for the job's progress and /metrics (without it the service's stage clock
    // counted the eigenproblem into the statistics stage).
    monitor.tick(Stage::Eigen, 0.0)?;
    let t1 = Instant::now();
    let (mut noise_ms, mut sel_whitening) = match early {
        Some((r, ms)) => (ms, Some(r?)),
        None => (0.0, None),
    };
    // The early selection could only tell "no noise"; with the data moments, say whether it was constant.
    let sel = stats::drop_noiseless(&pre, &stats.noise, Some(&stats.data));
    if sel_whitening.as_ref().is_none_or(|(s, _)| s.used != sel.used) {
        let t = Instant::now();
        sel_whitening = Some(whiten(&pre, &stats.noise, Some(&stats.data), scale, defer)?);
        noise_ms += t.elapsed().as_secs_f64() * 1e3;
    }
    let (_, whitening) = sel_whitening.expect("set above");
    if sel.used.is_empty() {
        return Err(MnfError::Degenerate("every band is constant or noise-free".into()));
    }
    let t_solve = Instant::now();
    let (pairs, waited_ms) = solve_after_statistics(prepared, early_solution, &sel.used, &whitening, &stats.data)?;
    // The statistics pass waited for the early solve: eigen-step time.
    stats_ms -= waited_ms.min(stats_ms);
    let eigen_ms = t1.elapsed().as_secs_f64() * 1e3 + noise_ms + waited_ms;
    tracing::debug!(
        target: "hypermnf::timing",
        bands = sel.used.len(),
        deferred = defer,
        early_solve_waited_ms = waited_ms,
        on_noise_ms = noise_ms,
        selection_ms = (t_solve - t1).as_secs_f64() * 1e3,
        solve_ms = t_solve.elapsed().as_secs_f64() * 1e3,
        eigen_ms,
        "eigen phase"
    );
    timings.insert("statistics".into(), stats_ms - noise_ms.min(stats_ms));
    timings.insert("eigen".into(), eigen_ms);

    Ok(system_from(sel, whitening, pairs, &stats))
}

/// Asks `prepared` to start the eigen step from its own sums in the next statistics pass, where its
/// device takes the eigen step at this size: for the bands used before any is dropped as noise-free
/// (nearly always the bands the job ends up with), so that the host's part of the statistics' tail
/// (its moments, band selection, C_N and C_D) overlaps the solve. Whether it will.
pub fn ask_early_solve(prepared: &mut dyn PreparedCube, bands: &[usize], noise_scale: f64) -> bool {
    prepared.eigen_solver().is_some_and(|d| d.takes(bands.len())) && prepared.solve_early(bands, noise_scale)
}

/// The eigen pairs of the bands `used` once the statistics are in: the early solve's answer where it
/// was for these bands and is usable, else the solve from the host's C_D (of `data`) and `whitening`.
/// Also the time the statistics pass waited for the early solve (ms, 0 without one).
pub fn solve_after_statistics(
    prepared: &mut dyn PreparedCube,
    early: Option<eigen::EarlySolution>,
    used: &[usize],
    whitening: &NoiseWhitening,
    data: &Moments,
) -> Result<(eigen::EigenPairs, f64), MnfError> {
    let waited_ms = early.as_ref().map_or(0.0, |e| e.wait_ms);
    let from_early = early.filter(|e| e.bands == used).and_then(|e| eigen::pairs_from_device(e.answer, used.len(), e.solver));
    let pairs = match from_early {
        Some(pairs) => pairs?,
        None => {
            let cd = data
                .covariance_of(used, 1.0)
                .ok_or_else(|| MnfError::Degenerate("too few pixels for the data covariance".into()))?;
            prepared.eigen_starts();
            eigen::solve_with(whitening, &cd, prepared.eigen_solver())?
        }
    };
    Ok((pairs, waited_ms))
}

/// What the moments of a statistics pass must satisfy before band selection: enough pixels and
/// residuals, for the bands used, and finite values in those bands.
pub(super) fn check_statistics(stats: &Statistics, pre: &BandSelection, params: &MnfParams) -> Result<(), MnfError> {
    check_counts(&stats.data, &stats.noise, stats.masked_pixels, params)?;
    check_enough_for_bands(&stats.data, &stats.noise, stats.masked_pixels, pre.used.len(), params)?;
    check_finite(&stats.data, &stats.noise, &pre.used)
}

/// The eigen system of the bands selected, from the solved pairs and the statistics they came from.
pub(super) fn system_from(sel: BandSelection, whitening: NoiseWhitening, pairs: eigen::EigenPairs, stats: &Statistics) -> EigenSystem {
    EigenSystem {
        means: sel.used.iter().map(|&b| stats.data.mean[b]).collect(),
        bands_used: sel.used,
        dropped_bands: sel.dropped,
        eigenvalues: pairs.eigenvalues,
        transform: pairs.transform,
        noise_covariance: whitening.into_noise_covariance(),
        noise_samples: stats.noise.n,
        pixels_used: stats.data.n,
        pixels_masked: stats.masked_pixels,
    }
}

/// The band selection and the noise half of the eigenproblem, or why there is none.
pub(super) type Whitened = Result<(BandSelection, NoiseWhitening), MnfError>;

/// Band selection from the noise moments and the scaled noise covariance C_N of the bands used, with
/// its Cholesky factor computed now, or left to the device solver when `defer` (see
/// [`NoiseWhitening::deferred`]).
pub(super) fn whiten(
    pre: &BandSelection,
    noise: &Moments,
    data: Option<&Moments>,
    scale: f64,
    defer: bool,
) -> Whitened {
    let sel = stats::drop_noiseless(pre, noise, data);
    let cn = noise
        .covariance_of(&sel.used, scale)
        .ok_or_else(|| MnfError::Degenerate("too few pixels for the noise estimate".into()))?;
    let n = sel.used.len();
    let w = if defer { NoiseWhitening::deferred(cn, n) } else { NoiseWhitening::new(cn, n)? };
    Ok((sel, w))
}

fn check_counts(data: &Moments, noise: &Moments, masked: u64, params: &MnfParams) -> Result<(), MnfError> {
    if data.n < 2 && masked == 0 {
        return Err(MnfError::Degenerate(super::params::few_pixels_message(data.n)));
    }
    if data.n < 2 {
        return Err(MnfError::Degenerate(format!(
            "only {} valid pixel(s): every other pixel is no-data (it holds the no-data value, or NaN or ±Inf)",
            data.n
        )));
    }
    if noise.n < 2 {
        return Err(MnfError::Degenerate(super::params::few_residuals_message(params, noise.n)));
    }
    Ok(())
}

/// Refuses a cube with fewer pixels (or noise residuals) than it has bands, plus one. A covariance of
/// `bands` bands formed from n samples has rank at most n − 1: with fewer, the noise covariance is
/// singular and its Cholesky factor fails, which would be reported as bands that are linear
/// combinations of others (a 10 × 10 tile of a 425-band AVIRIS-NG line is the usual case). Said here
/// with the counts, before any factorisation.
fn check_enough_for_bands(data: &Moments, noise: &Moments, masked: u64, bands: usize, params: &MnfParams) -> Result<(), MnfError> {
    let need = bands as u64 + 1;
    if data.n >= need && noise.n >= need {
        return Ok(());
    }
    let residuals = match params.noise {
        super::NoiseEstimator::MeanFilter => "mean-filter residuals (one per valid pixel whose 3 × 3 neighbourhood is valid)",
        super::NoiseEstimator::ShiftDifference => "shift-difference residuals (one per pair of valid diagonal neighbours)",
    };
    let window = if params.noise_window.is_some() { " inside the noise window" } else { "" };
    Err(MnfError::Degenerate(format!(
        "too few pixels for the number of bands: {} valid pixel(s) ({masked} no-data) and {} noise residual(s){window} for \
         {bands} band(s) after bad bands; each covariance of {bands} bands needs at least {need} samples ({residuals}). \
         Use a larger cube, or fewer bands (bad_bands)",
        data.n, noise.n
    )))
}

/// Refuses bands whose statistics are not finite numbers: values whose squares overflow float64
/// (NaN and ±Inf samples are no-data in float cubes, so they never reach the statistics). Unchecked,
/// such a band passes for constant (NaN compares false, so every band is dropped) or poisons the
/// eigenproblem, and the job fails with a reason that points elsewhere.
fn check_finite(data: &Moments, noise: &Moments, used: &[usize]) -> Result<(), MnfError> {
    let bad: Vec<usize> = used
        .iter()
        .copied()
        .filter(|&b| !(data.mean[b].is_finite() && data.variance(b).is_finite() && noise.variance(b).is_finite()))
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    let shown: Vec<String> = bad.iter().take(10).map(usize::to_string).collect();
    Err(MnfError::Degenerate(format!(
        "{} band(s) have statistics that are not finite (bands {}{}): the cube holds values too large to \
         square in float64 there; give such pixels an ignore value, or list the bands in bad_bands",
        bad.len(),
        shown.join(", "),
        if bad.len() > 10 { ", ..." } else { "" }
    )))
}

/// How many components to keep.
pub(crate) fn choose_k(params: &MnfParams, eigenvalues: &[f64]) -> Result<usize, MnfError> {
    let u = eigenvalues.len();
    if let Some(k) = params.components {
        if k > u {
            return Err(MnfError::InvalidParams(format!(
                "components ({k}) exceeds the {u} bands left after excluding bad and constant bands"
            )));
        }
        return Ok(k);
    }
    if let Some(s) = params.snr {
        let k = eigenvalues.iter().filter(|&&l| l >= 1.0 + s).count();
        if k == 0 {
            return Err(MnfError::InvalidParams(format!(
                "no component has an SNR of at least {s} (the largest eigenvalue is {:.4}, SNR {:.4})",
                eigenvalues[0],
                eigenvalues[0] - 1.0
            )));
        }
        return Ok(k);
    }
    Ok(DEFAULT_COMPONENTS.min(u))
}

/// Where the components go while the projection computes them, besides the output: the service
/// writes them into its result file then, so that the write overlaps the projection.
pub trait ComponentSink {
    /// The components' shape (lines, samples, k), before any of their values (again if the projection
    /// is run again).
    fn begin(&mut self, shape: [usize; 3]) -> Result<(), BackendError>;
    /// Values `first..first + values.len()` of the C-order components, final.
    fn put(&mut self, first: usize, values: &[f32]) -> Result<(), BackendError>;
    /// The eigen system just computed for this run (not one that was known), before the projection:
    /// the service starts storing it then, beside the projection. Nothing to do by default.
    fn fresh_system(&mut self, _system: &EigenSystem) {}
}

/// The projection `apply` runs for `system` on `cube`: the k components `params` ask for (or the SNR
/// rule picks), the no-data value and the bands its mask checks. For callers that project into an
/// output of their own (the several-device benchmark's page-locked components).
pub fn projection_of(cube: &Cube, params: &MnfParams, system: &EigenSystem) -> Result<Projection, MnfError> {
    let k = choose_k(params, &system.eigenvalues)?;
    Ok(Projection {
        bands_used: system.bands_used.clone(),
        means: system.means.clone(),
        transform: system.transform_k(k),
        k,
        ignore_value: nodata(cube, params),
        mask_bands: bands::preselect(cube.bands(), cube.meta.bbl.as_deref(), &params.bad_bands).used,
    })
}

/// `apply` on a prepared cube; `timings` (from `analyse_on`, or empty) go into the metadata with the
/// projection and inverse times.
pub fn apply_on(
    cube: &Cube,
    params: &MnfParams,
    system: &EigenSystem,
    backend: &dyn Backend,
    prepared: &mut dyn PreparedCube,
    monitor: &Monitor,
    timings: BTreeMap<String, f64>,
) -> Result<MnfOutput, MnfError> {
    apply_on_to(cube, params, system, backend, prepared, monitor, timings, None)
}

/// [`apply_on`], the components also handed to `sink` (if any) as they become final.
#[allow(clippy::too_many_arguments)]
pub fn apply_on_to(
    cube: &Cube,
    params: &MnfParams,
    system: &EigenSystem,
    backend: &dyn Backend,
    prepared: &mut dyn PreparedCube,
    monitor: &Monitor,
    mut timings: BTreeMap<String, f64>,
    sink: Option<&mut dyn ComponentSink>,
) -> Result<MnfOutput, MnfError> {
    let projection = projection_of(cube, params, system)?;
    let (k, ignore, mask_bands) = (projection.k, projection.ignore_value, projection.mask_bands.clone());

    let t = Instant::now();
    // Zeroed (lazily mapped) rather than filled: every backend writes every element, masked ones as NaN.
    let mut components = vec![0.0f32; cube.pixels() * k];
    match sink {
        Some(sink) => {
            sink.begin([cube.lines(), cube.samples(), k])?;
            prepared.project_streamed(&projection, &mut components, &mut |first, values| sink.put(first, values), monitor)?;
            // The values are the sink's; what `components` holds is not to be read.
            components = Vec::new();
        }
        None => prepared.project(&projection, &mut components, monitor)?,
    }
    timings.insert("projection".into(), t.elapsed().as_secs_f64() * 1e3);

    let denoised = if params.inverse {
        let t = Instant::now();
        let d = Denoise {
            bands_used: system.bands_used.clone(),
            means: system.means.clone(),
            matrix: system.denoise_matrix(k),
            ignore_value: ignore,
            mask_bands,
        };
        let mut out = vec![0.0f32; cube.pixels() * cube.bands()];
        prepared.denoise(&d, &mut out, monitor)?;
        timings.insert("inverse".into(), t.elapsed().as_secs_f64() * 1e3);
        Some(out)
    } else {
        None
    };

    let u = system.used();
    let metadata = Metadata {
        hypermnf_version: env!("CARGO_PKG_VERSION").to_string(),
        input: InputInfo {
            lines: cube.lines(),
            samples: cube.samples(),
            bands: cube.bands(),
            data_type: cube.dtype().name().to_string(),
            byte_order: match cube.byte_order() {
                crate::cube::ByteOrder::Little => "little".into(),
                crate::cube::ByteOrder::Big => "big".into(),
            },
            interleave: cube.meta.source_interleave.map(|i| i.name().to_string()),
        },
        params: params.clone(),
        backend: backend.name().to_string(),
        device: backend.device(),
        components: k,
        snr: system.eigenvalues.iter().map(|l| l - 1.0).collect(),
        eigenvalues: system.eigenvalues.clone(),
        bands_used: system.bands_used.clone(),
        dropped_bands: system.dropped_bands.clone(),
        noise: NoiseInfo {
            estimator: params.noise.name().to_string(),
            scale: params.noise.scale(),
            samples: system.noise_samples,
            window: params.noise_window,
        },
        pixels: PixelInfo {
            total: cube.pixels() as u64,
            used: system.pixels_used,
            masked: system.pixels_masked,
            ignore_value: ignore_value(cube, params),
        },
        means: system.means.clone(),
        transform: (0..u).map(|r| system.transform[r * u..r * u + k].to_vec()).collect(),
        inverse: params.inverse,
        timings_ms: timings,
        statistics: None,
        batch: None,
        source: SourceInfo::of(&cube.meta),
    };
    Ok(MnfOutput { components, k, denoised, metadata })
}
