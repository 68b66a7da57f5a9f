//! What the GPU test binaries share (tests/gpu.rs, tests/gpu_split.rs, tests/gpu_ht_designs.rs): the
//! CUDA backend on each route, random and real cubes, and the comparisons with the CPU backend (the
//! float64 reference). Random seeds are printed, so a failure can be replayed with HYPERMNF_TEST_SEED.

use std::path::{Path, PathBuf};

use hypermnf::backend::cpu::CpuBackend;
use hypermnf::backend::cuda::{CudaBackend, Route};
use hypermnf::backend::Backend;
use hypermnf::cube::synthetic::{self, SyntheticSpec};
use hypermnf::cube::{ByteOrder, Cube, CubeMeta, DataType};
use hypermnf::mnf::stats::{Moments, Statistics, StatsSpec};
use hypermnf::mnf::{self, MnfParams, Monitor, NoiseEstimator};
use rand::Rng;

pub const ROUTES: [Route; 2] = [Route::Kernels, Route::Cublas];

/// tests/data relative to the current directory first (the GPU host runs from a copy of the tree),
/// then the crate's own.
pub fn data_dir() -> PathBuf {
    let here = Path::new("tests/data");
    if here.join("README.md").exists() {
        return here.to_path_buf();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

pub fn seed() -> u64 {
    let s = std::env::var("HYPERMNF_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_nanos() as u64
        });
    eprintln!("seed {s}");
    s
}

pub fn gpu(route: Route) -> CudaBackend {
    CudaBackend::new(route).unwrap_or_else(|e| panic!("CUDA backend {route:?}: {e}"))
}

pub fn rel_fro(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

pub fn stats_of(backend: &dyn Backend, cube: &Cube, spec: &StatsSpec) -> (Statistics, Option<Moments>) {
    let mut prepared = backend.prepare(cube, &Monitor::silent()).expect("prepare");
    let mut early = None;
    let s = prepared
        .statistics(
            spec,
            &mut |m: &Moments| early = Some(m.clone()),
            &Monitor::silent(),
        )
        .expect("statistics");
    (s, early)
}

/// Both covariances within 1e-5 (relative Frobenius), identical counts, means close.
pub fn assert_stats_match(what: &str, gpu: &Statistics, cpu: &Statistics) {
    assert_eq!(
        gpu.masked_pixels, cpu.masked_pixels,
        "{what}: masked pixels"
    );
    for (name, g, c) in [
        ("data", &gpu.data, &cpu.data),
        ("noise", &gpu.noise, &cpu.noise),
    ] {
        assert_eq!(g.n, c.n, "{what}: {name} count");
        if c.n < 2 {
            continue;
        }
        let e = rel_fro(&g.covariance().unwrap(), &c.covariance().unwrap());
        eprintln!("{what}: {name} covariance rel. error {e:.2e}");
        assert!(
            e <= 1e-5,
            "{what}: {name} covariance rel. error {e:.3e} > 1e-5"
        );
        // Means: within 1e-6 standard deviations (what a projection centred on them would notice).
        for i in 0..c.bands {
            let sd = c.variance(i).sqrt();
            let d = (g.mean[i] - c.mean[i]).abs();
            assert!(
                d <= 1e-6 * sd + 1e-12 * c.mean[i].abs(),
                "{what}: {name} mean of band {i}: GPU {} CPU {} (sd {sd})",
                g.mean[i],
                c.mean[i]
            );
        }
    }
}

pub fn spec(noise: NoiseEstimator, cube: &Cube) -> StatsSpec {
    StatsSpec {
        noise,
        window: None,
        ignore_value: None,
        mask_bands: (0..cube.bands()).collect(),
    }
}

/// A synthetic cube (`SyntheticSpec::small`: a known low-dimensional signal plus noise, int16) with
/// a seed drawn from `rng`.
pub fn synthetic_cube(rng: &mut rand::rngs::StdRng, lines: usize, samples: usize, bands: usize) -> Cube {
    let mut sp = SyntheticSpec::small(lines, samples, bands);
    sp.seed = rng.random();
    synthetic::generate(&sp)
}

/// A cube of `dtype` with random values: a smooth random field plus noise, so that both covariances
/// are well conditioned; never all zeros.
pub fn random_cube(
    rng: &mut rand::rngs::StdRng,
    lines: usize,
    samples: usize,
    bands: usize,
    dtype: DataType,
    order: ByteOrder,
) -> Cube {
    let (lo, hi): (f64, f64) = match dtype {
        DataType::U8 => (0.0, 255.0),
        DataType::I16 => (-3000.0, 12000.0),
        DataType::U16 => (0.0, 60000.0),
        DataType::I32 => (-100000.0, 1000000.0),
        DataType::U32 | DataType::U64 => (0.0, 1000000.0),
        DataType::I64 => (-1000000.0, 1000000.0),
        DataType::F32 | DataType::F64 => (-50.0, 150.0),
    };
    let mid = (lo + hi) / 2.0;
    let amp = (hi - lo) / 6.0;
    let phases: Vec<f64> = (0..bands * 2)
        .map(|_| rng.random_range(0.0..std::f64::consts::TAU))
        .collect();
    let mut data = Vec::with_capacity(lines * samples * bands * dtype.size());
    for l in 0..lines {
        for s in 0..samples {
            for b in 0..bands {
                let smooth = (l as f64 * 0.07 + phases[2 * b]).sin()
                    * (s as f64 * 0.05 + phases[2 * b + 1]).cos();
                let x =
                    (mid + amp * smooth + amp * 0.3 * rng.random_range(-1.0..1.0)).clamp(lo, hi);
                macro_rules! put {
                    ($v:expr) => {
                        match order {
                            ByteOrder::Little => data.extend_from_slice(&$v.to_le_bytes()),
                            ByteOrder::Big => data.extend_from_slice(&$v.to_be_bytes()),
                        }
                    };
                }
                match dtype {
                    DataType::U8 => data.push(x.round() as u8),
                    DataType::I16 => put!(x.round() as i16),
                    DataType::U16 => put!(x.round() as u16),
                    DataType::I32 => put!(x.round() as i32),
                    DataType::U32 => put!(x.round() as u32),
                    DataType::I64 => put!(x.round() as i64),
                    DataType::U64 => put!(x.round() as u64),
                    DataType::F32 => put!(x as f32),
                    DataType::F64 => put!(x),
                }
            }
        }
    }
    Cube::from_raw(
        lines,
        samples,
        bands,
        dtype,
        order,
        data,
        CubeMeta::default(),
    )
    .expect("consistent sizes")
}


/// A projection on the device against the CPU's: NaN at the same places, at least one (the no-data
/// pixel), and the other values within 1e-5 (relative Frobenius).
pub fn assert_projection_close(what: &str, got: &[f32], want: &[f32]) {
    assert!(got.iter().zip(want).all(|(a, w)| a.is_nan() == w.is_nan()), "{what}: NaN pattern");
    assert!(got.iter().any(|v| v.is_nan()), "{what}: the no-data pixel must be NaN");
    let (a, w): (Vec<f64>, Vec<f64>) =
        got.iter().zip(want).filter(|(x, _)| !x.is_nan()).map(|(x, y)| (*x as f64, *y as f64)).unzip();
    let e = rel_fro(&a, &w);
    eprintln!("{what}: projection rel. error {e:.2e}");
    assert!(e <= 1e-5, "{what}: projection rel. error {e:.3e}");
}

/// Pearson correlation of two components over the pixels where both are finite.
pub fn correlation(a: &[f32], b: &[f32], k: usize, c: usize) -> f64 {
    let pairs: Vec<(f64, f64)> = a
        .chunks_exact(k)
        .zip(b.chunks_exact(k))
        .map(|(x, y)| (x[c] as f64, y[c] as f64))
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    let n = pairs.len() as f64;
    let (mx, my) = pairs
        .iter()
        .fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x / n, sy + y / n));
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (x, y) in &pairs {
        sxy += (x - mx) * (y - my);
        sxx += (x - mx) * (x - mx);
        syy += (y - my) * (y - my);
    }
    sxy / (sxx * syy).sqrt()
}

/// The whole pipeline on both backends: the same bands, top-10 eigenvalues within 1e-4, components
/// correlated ≥ 0.9999, NaN at the same pixels, and the inverse close.
pub fn assert_pipeline_matches(what: &str, cube: &Cube, params: &MnfParams, g: &dyn Backend) {
    let c = mnf::run(cube, params, &CpuBackend::new(), &Monitor::silent());
    let r = mnf::run(cube, params, g, &Monitor::silent());
    let (c, r) = match (c, r) {
        (Ok(c), Ok(r)) => (c, r),
        (Err(ce), Err(ge)) => {
            assert_eq!(
                ce.code(),
                ge.code(),
                "{what}: both fail, with different errors: {ce} / {ge}"
            );
            eprintln!("{what}: both fail alike: {ce}");
            return;
        }
        (c, r) => panic!(
            "{what}: CPU {:?} vs GPU {:?}",
            c.map(|_| "ok"),
            r.map(|_| "ok")
        ),
    };
    assert_eq!(r.k, c.k, "{what}: k");
    assert_eq!(
        r.metadata.bands_used, c.metadata.bands_used,
        "{what}: bands used"
    );
    let top = c.metadata.eigenvalues.len().min(10);
    for i in 0..top {
        let (x, y) = (r.metadata.eigenvalues[i], c.metadata.eigenvalues[i]);
        assert!(
            (x - y).abs() <= 1e-4 * y.abs(),
            "{what}: eigenvalue {i}: GPU {x} CPU {y}"
        );
    }
    for (i, (x, y)) in r.components.iter().zip(&c.components).enumerate() {
        assert_eq!(x.is_nan(), y.is_nan(), "{what}: NaN mismatch at {i}");
    }
    for comp in 0..c.k {
        // Components past the top ten can have eigenvalues too close for a stable direction.
        if comp >= 10 {
            break;
        }
        let ev = &c.metadata.eigenvalues;
        if comp + 1 < ev.len() && (ev[comp] - ev[comp + 1]).abs() < 1e-3 * ev[comp] {
            continue;
        }
        let rho = correlation(&r.components, &c.components, c.k, comp);
        assert!(rho >= 0.9999, "{what}: component {comp} correlation {rho}");
    }
    if let (Some(dg), Some(dc)) = (&r.denoised, &c.denoised) {
        let (a, b): (Vec<f64>, Vec<f64>) = dg
            .iter()
            .zip(dc)
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|(x, y)| (*x as f64, *y as f64))
            .unzip();
        let e = rel_fro(&a, &b);
        assert!(e <= 1e-4, "{what}: inverse rel. error {e:.3e}");
    }
}

pub fn real_cubes() -> Vec<(String, Cube)> {
    let dir = data_dir();
    [
        "salinasA_224_bip_be",
        "jasper_ridge_r198_bil",
        "abu_beach1_cat_island_bsq",
    ]
    .iter()
    .map(|n| {
        (
            n.to_string(),
            hypermnf::cube::open(&dir.join(format!("{n}.hdr"))).expect("real cube"),
        )
    })
    .collect()
}


/// Both noise estimators, in the order the tests run them.
pub const ESTIMATORS: [NoiseEstimator; 2] = [NoiseEstimator::MeanFilter, NoiseEstimator::ShiftDifference];

/// For each noise estimator, `g` against the CPU backend: the statistics of [`spec`] for that
/// estimator (changed by `adjust`), then the whole pipeline with `params` and that estimator.
/// `what` names the case; the estimator's name is added to it.
pub fn assert_stats_and_pipeline_match_cpu(
    what: &str,
    cube: &Cube,
    g: &dyn Backend,
    params: &MnfParams,
    adjust: impl Fn(&mut StatsSpec),
) {
    for noise in ESTIMATORS {
        let what = format!("{what} {noise:?}");
        let mut sp = spec(noise, cube);
        adjust(&mut sp);
        let (c, _) = stats_of(&CpuBackend::new(), cube, &sp);
        let (s, _) = stats_of(g, cube, &sp);
        assert_stats_match(&what, &s, &c);
        let params = MnfParams { noise, ..params.clone() };
        assert_pipeline_matches(&what, cube, &params, g);
    }
}
