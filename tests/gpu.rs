//! The CUDA backend against the CPU backend (the float64 reference), on fresh random cubes and on the
//! three real AVIRIS chips. Every test needs a CUDA device: they are ignored elsewhere and run on the
//! GPU host with `--include-ignored` (see .gpu/run). Random seeds are printed, so a failure can be
//! replayed with HYPERMNF_TEST_SEED.

/// The in-process server of the service tests, here on the CUDA backend.
mod common;
/// The GPU hash table of the job cache against its CPU twin (issue 5).
mod gpu_cache;
mod gpu_hashtable;
/// The published designs the hash-table benchmark compares (hopscotch after GLHT, SlabHash), issue 19.
mod gpu_ht_designs;

use std::path::{Path, PathBuf};

use hypermnf::backend::cpu::CpuBackend;
use hypermnf::backend::cuda::{CudaBackend, Route};
use hypermnf::backend::Backend;
use hypermnf::cube::synthetic::{self, SyntheticSpec};
use hypermnf::cube::{ByteOrder, Cube, CubeMeta, DataType};
use hypermnf::mnf::stats::{Moments, Projection, Statistics, StatsSpec};
use hypermnf::mnf::{self, MnfParams, Monitor, NoiseEstimator, Window};
use rand::{Rng, SeedableRng};

const ROUTES: [Route; 2] = [Route::Kernels, Route::Cublas];

/// tests/data relative to the current directory first (the GPU host runs from a copy of the tree),
/// then the crate's own.
fn data_dir() -> PathBuf {
    let here = Path::new("tests/data");
    if here.join("README.md").exists() {
        return here.to_path_buf();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn seed() -> u64 {
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

fn gpu(route: Route) -> CudaBackend {
    CudaBackend::new(route).unwrap_or_else(|e| panic!("CUDA backend {route:?}: {e}"))
}

fn rel_fro(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

fn stats_of(backend: &dyn Backend, cube: &Cube, spec: &StatsSpec) -> (Statistics, Option<Moments>) {
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
fn assert_stats_match(what: &str, gpu: &Statistics, cpu: &Statistics) {
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

fn spec(noise: NoiseEstimator, cube: &Cube) -> StatsSpec {
    StatsSpec {
        noise,
        window: None,
        ignore_value: None,
        mask_bands: (0..cube.bands()).collect(),
    }
}

/// A cube of `dtype` with random values: a smooth random field plus noise, so that both covariances
/// are well conditioned; never all zeros.
fn random_cube(
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

#[test]
#[ignore = "needs a CUDA device"]
fn statistics_match_cpu_for_every_data_type_and_byte_order() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let cpu = CpuBackend::new();
    let backends: Vec<CudaBackend> = ROUTES.iter().map(|&r| gpu(r)).collect();
    for dtype in DataType::ALL {
        for order in [ByteOrder::Little, ByteOrder::Big] {
            // Odd sizes: not a multiple of the 16-pixel noise tile or the 64-band covariance tile.
            let (l, s, b) = (
                rng.random_range(19..41),
                rng.random_range(17..53),
                rng.random_range(3..70),
            );
            let cube = random_cube(&mut rng, l, s, b, dtype, order);
            for noise in [NoiseEstimator::MeanFilter, NoiseEstimator::ShiftDifference] {
                let sp = spec(noise, &cube);
                let (c, _) = stats_of(&cpu, &cube, &sp);
                for g in &backends {
                    let what = format!("{} {dtype:?} {order:?} {l}x{s}x{b} {noise:?}", g.name());
                    let (gs, early) = stats_of(g, &cube, &sp);
                    assert_stats_match(&what, &gs, &c);
                    assert_eq!(
                        early.as_ref(),
                        Some(&gs.noise),
                        "{what}: on_noise got other moments"
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn statistics_match_cpu_with_no_data_and_noise_window() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let cpu = CpuBackend::new();
    for route in ROUTES {
        let g = gpu(route);
        let mut sp = SyntheticSpec::small(61, 45, 37);
        sp.seed = rng.random();
        let cube = synthetic::generate(&sp);
        // Punch no-data holes: a pixel holding -9999 in one (random) band.
        let mut raw = cube.raw().to_vec();
        for _ in 0..150 {
            let (l, s, b) = (
                rng.random_range(0..61),
                rng.random_range(0..45),
                rng.random_range(0..37),
            );
            let at = ((l * 45 + s) * 37 + b) * 2;
            raw[at..at + 2].copy_from_slice(&(-9999i16).to_le_bytes());
        }
        let cube = Cube::from_raw(
            61,
            45,
            37,
            DataType::I16,
            ByteOrder::Little,
            raw,
            CubeMeta::default(),
        )
        .unwrap();
        for noise in [NoiseEstimator::MeanFilter, NoiseEstimator::ShiftDifference] {
            for window in [
                None,
                Some(Window {
                    x0: 3,
                    y0: 5,
                    x1: 40,
                    y1: 52,
                }),
            ] {
                let mut st = spec(noise, &cube);
                st.ignore_value = Some(-9999.0);
                st.mask_bands = (0..37).filter(|b| b % 5 != 3).collect();
                st.window = window;
                let (c, _) = stats_of(&cpu, &cube, &st);
                assert!(c.masked_pixels > 50, "the holes must matter");
                let (gs, _) = stats_of(&g, &cube, &st);
                assert_stats_match(&format!("{route:?} no-data {noise:?} {window:?}"), &gs, &c);
            }
        }
    }
}

/// The fallback covariance kernels (float64 FMAs; the sm_80 tensor-core kernel, mma.m8n8k4) on the real
/// cubes and a random one; the default (sm_90 mma.m16n8k4 on an H100) is exercised by every other test.
#[test]
#[ignore = "needs a CUDA device"]
fn both_covariance_kernels_match_cpu() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let cpu = CpuBackend::new();
    let default_kernel = gpu(Route::Kernels).covariance_kernel();
    eprintln!("default covariance kernel: {default_kernel}");
    for fallback in [
        gpu(Route::Kernels).with_fma_covariance(),
        gpu(Route::Kernels).with_m8_covariance(),
    ] {
        let fma = fallback;
        let which = fma.covariance_kernel();
        let mut cubes = real_cubes();
        cubes.push((
            "random f32".into(),
            random_cube(&mut rng, 57, 71, 133, DataType::F32, ByteOrder::Little),
        ));
        for (name, cube) in cubes {
            for noise in [NoiseEstimator::MeanFilter, NoiseEstimator::ShiftDifference] {
                let sp = spec(noise, &cube);
                let (c, _) = stats_of(&cpu, &cube, &sp);
                let (g, _) = stats_of(&fma, &cube, &sp);
                assert_stats_match(&format!("{which} {name} {noise:?}"), &g, &c);
                let params = MnfParams {
                    components: Some(10),
                    noise,
                    ..Default::default()
                };
                assert_pipeline_matches(&format!("{which} {name} {noise:?}"), &cube, &params, &fma);
            }
        }
    }
}

/// The sums must not lose digits over ten million pixels, far from zero.
#[test]
#[ignore = "needs a CUDA device"]
fn statistics_stay_accurate_over_ten_million_pixels() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let mut sp = SyntheticSpec::small(2500, 4100, 12);
    sp.seed = rng.random();
    sp.offset = 3000.0; // far from zero: cancellation would show
    let cube = synthetic::generate(&sp);
    let sp2 = spec(NoiseEstimator::MeanFilter, &cube);
    let (c, _) = stats_of(&CpuBackend::new(), &cube, &sp2);
    for route in ROUTES {
        let (g, _) = stats_of(&gpu(route), &cube, &sp2);
        assert_stats_match(&format!("{route:?} 10^7 pixels"), &g, &c);
    }
}

/// Pearson correlation of two components over the pixels where both are finite.
fn correlation(a: &[f32], b: &[f32], k: usize, c: usize) -> f64 {
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
fn assert_pipeline_matches(what: &str, cube: &Cube, params: &MnfParams, g: &dyn Backend) {
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

fn real_cubes() -> Vec<(String, Cube)> {
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

#[test]
#[ignore = "needs a CUDA device"]
fn real_cubes_statistics_and_pipeline_match_cpu() {
    let cpu = CpuBackend::new();
    for route in ROUTES {
        let g = gpu(route);
        for (name, cube) in real_cubes() {
            for noise in [NoiseEstimator::MeanFilter, NoiseEstimator::ShiftDifference] {
                let sp = spec(noise, &cube);
                let (c, _) = stats_of(&cpu, &cube, &sp);
                let (gs, _) = stats_of(&g, &cube, &sp);
                assert_stats_match(&format!("{route:?} {name} {noise:?}"), &gs, &c);
                let params = MnfParams {
                    components: Some(10),
                    noise,
                    inverse: true,
                    ..Default::default()
                };
                assert_pipeline_matches(&format!("{route:?} {name} {noise:?}"), &cube, &params, &g);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn pipeline_matches_cpu_on_edge_cases() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    for route in ROUTES {
        let g = gpu(route);
        // 1 and 2 lines: the mean filter has no interior pixel; both backends must say the same.
        for lines in [1, 2, 3] {
            let cube = random_cube(&mut rng, lines, 40, 12, DataType::I16, ByteOrder::Little);
            for noise in [NoiseEstimator::MeanFilter, NoiseEstimator::ShiftDifference] {
                let params = MnfParams {
                    components: Some(3),
                    noise,
                    ..Default::default()
                };
                assert_pipeline_matches(
                    &format!("{route:?} {lines} lines {noise:?}"),
                    &cube,
                    &params,
                    &g,
                );
            }
        }
        // Width not a multiple of any tile, k = 1 and k = bands, with the inverse.
        let mut sp = SyntheticSpec::small(45, 37, 29);
        sp.seed = rng.random();
        let cube = synthetic::generate(&sp);
        for k in [1, 29] {
            let params = MnfParams {
                components: Some(k),
                inverse: true,
                ..Default::default()
            };
            assert_pipeline_matches(&format!("{route:?} k={k}"), &cube, &params, &g);
        }
        // 425 bands (AVIRIS-NG): k = 10 uses constant memory, k = 40 (425·40 > 16320 floats) global.
        let mut sp = SyntheticSpec::small(33, 31, 425);
        sp.seed = rng.random();
        sp.dtype = DataType::F32;
        let cube = synthetic::generate(&sp);
        for k in [10, 40] {
            let params = MnfParams {
                components: Some(k),
                ..Default::default()
            };
            assert_pipeline_matches(&format!("{route:?} 425 bands k={k}"), &cube, &params, &g);
        }
    }
}

/// The projection and inverse kernels alone, given the CPU's own matrices: relative error ≤ 1e-5.
/// The streamed projection (the service writes the components while they are computed) hands over
/// every value exactly once, in chunks, with the bits of the plain projection, on every route.
#[test]
#[ignore = "needs a CUDA device"]
fn a_streamed_projection_hands_over_every_value_once() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    // 224 bands: chunks of ~370 lines, so three or more pieces.
    let (lines, samples, bands, k) = (1000, 200, 224, 30);
    let cube = random_cube(&mut rng, lines, samples, bands, DataType::I16, ByteOrder::Little);
    let used: Vec<usize> = (0..bands).collect();
    let proj = Projection {
        bands_used: used.clone(),
        means: (0..bands).map(|_| rng.random_range(-100.0..100.0)).collect(),
        transform: (0..bands * k).map(|_| rng.random_range(-1.0..1.0)).collect(),
        k,
        ignore_value: None,
        mask_bands: vec![],
    };
    let n = lines * samples * k;
    for route in ROUTES {
        let g = gpu(route);
        let mut prepared = g.prepare(&cube, &Monitor::silent()).unwrap();
        let mut want = vec![f32::INFINITY; n];
        prepared.project(&proj, &mut want, &Monitor::silent()).unwrap();
        let mut got = vec![f32::INFINITY; n];
        let mut seen = vec![0u8; n];
        let mut pieces = 0;
        let mut scratch = vec![0f32; n];
        prepared
            .project_streamed(
                &proj,
                &mut scratch,
                &mut |first, values| {
                    pieces += 1;
                    got[first..first + values.len()].copy_from_slice(values);
                    seen[first..first + values.len()].iter_mut().for_each(|s| *s += 1);
                    Ok(())
                },
                &Monitor::silent(),
            )
            .unwrap();
        assert!(seen.iter().all(|&s| s == 1), "{route:?}: every value handed over once");
        assert!(pieces > 1, "{route:?}: handed over in chunks ({pieces})");
        assert!(
            got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{route:?}: the streamed values differ from the plain projection"
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn projection_kernels_match_cpu() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let cube = random_cube(&mut rng, 50, 43, 70, DataType::U16, ByteOrder::Big);
    let used: Vec<usize> = (0..70).filter(|b| b % 7 != 2).collect();
    let u = used.len();
    for k in [1, 7, 64, 65, 240] {
        let proj = Projection {
            bands_used: used.clone(),
            means: (0..u).map(|_| rng.random_range(0.0..60000.0)).collect(),
            transform: (0..u * k).map(|_| rng.random_range(-1.0..1.0)).collect(),
            k,
            ignore_value: Some(cube.to_f64()[5]),
            mask_bands: vec![5],
        };
        let mut want = vec![0f32; 50 * 43 * k];
        let cpu = CpuBackend::new();
        cpu.prepare(&cube, &Monitor::silent())
            .unwrap()
            .project(&proj, &mut want, &Monitor::silent())
            .unwrap();
        let variants = ROUTES.iter().map(|&r| (format!("{r:?}"), gpu(r))).chain([(
            "Kernels, T in constant memory".to_string(),
            gpu(Route::Kernels).with_constant_projection(),
        )]);
        for (route, g) in variants {
            let mut got = vec![f32::INFINITY; 50 * 43 * k];
            g.prepare(&cube, &Monitor::silent())
                .unwrap()
                .project(&proj, &mut got, &Monitor::silent())
                .unwrap();
            assert!(
                got.iter().zip(&want).all(|(a, b)| a.is_nan() == b.is_nan()),
                "{route} k={k}: NaN pattern"
            );
            assert!(
                got.iter().any(|v| v.is_nan()),
                "the masked pixel must be NaN"
            );
            let (a, b): (Vec<f64>, Vec<f64>) = got
                .iter()
                .zip(&want)
                .filter(|(x, _)| !x.is_nan())
                .map(|(x, y)| (*x as f64, *y as f64))
                .unzip();
            let e = rel_fro(&a, &b);
            eprintln!("{route} projection k={k}: rel. error {e:.2e}");
            assert!(e <= 1e-5, "{route} projection k={k}: rel. error {e:.3e}");
        }
    }
}

/// A cube larger than the memory budget is streamed (both passes) and gives the same answers.
#[test]
#[ignore = "needs a CUDA device"]
fn streamed_cube_matches_resident_and_cpu() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let mut sp = SyntheticSpec::small(97, 53, 31);
    sp.seed = rng.random();
    let cube = synthetic::generate(&sp);
    for route in ROUTES {
        let small = gpu(route).with_memory_budget(cube.raw().len() / 5);
        assert!(
            !small.prepare_cuda(&cube).unwrap().is_resident(),
            "the budget must force streaming"
        );
        assert!(gpu(route).prepare_cuda(&cube).unwrap().is_resident());
        for noise in [NoiseEstimator::MeanFilter, NoiseEstimator::ShiftDifference] {
            let mut st = spec(noise, &cube);
            st.ignore_value = Some(cube.to_f64()[31 * 200]);
            let (c, _) = stats_of(&CpuBackend::new(), &cube, &st);
            let (s, _) = stats_of(&small, &cube, &st);
            assert_stats_match(&format!("{route:?} streamed {noise:?}"), &s, &c);
            let params = MnfParams {
                components: Some(6),
                noise,
                inverse: true,
                ..Default::default()
            };
            assert_pipeline_matches(
                &format!("{route:?} streamed {noise:?}"),
                &cube,
                &params,
                &small,
            );
        }
    }
}

/// Small and quick: the case compute-sanitizer runs (memcheck and racecheck) in .gpu/run.
#[test]
#[ignore = "needs a CUDA device"]
fn sanitizer_small_case() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    // 67 bands: the generic kernels; 64: the int16 fast paths (noise_mean_filter_w16, project_w16).
    for bands in [67, 64] {
    let cube = random_cube(&mut rng, 21, 19, bands, DataType::I16, ByteOrder::Big);
    for route in ROUTES {
        let g = gpu(route);
        for noise in [NoiseEstimator::MeanFilter, NoiseEstimator::ShiftDifference] {
            let mut st = spec(noise, &cube);
            st.ignore_value = Some(cube.to_f64()[bands * 30 + 4]);
            st.window = Some(Window {
                x0: 2,
                y0: 1,
                x1: 18,
                y1: 20,
            });
            let (c, _) = stats_of(&CpuBackend::new(), &cube, &st);
            let (s, _) = stats_of(&g, &cube, &st);
            assert_stats_match(&format!("sanitizer {route:?} {noise:?}"), &s, &c);
        }
        let params = MnfParams {
            components: Some(5),
            inverse: true,
            ..Default::default()
        };
        assert_pipeline_matches(&format!("sanitizer {route:?}"), &cube, &params, &g);
        let streamed = gpu(route).with_memory_budget(cube.raw().len() / 4);
        assert_pipeline_matches(
            &format!("sanitizer streamed {route:?}"),
            &cube,
            &params,
            &streamed,
        );
    }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn device_name_and_backend_names() {
    let g = gpu(Route::Kernels);
    assert!(!g.device().is_empty());
    assert_eq!(g.name(), "cuda");
    assert_eq!(gpu(Route::Cublas).name(), "cuda-cublas");
    let auto = hypermnf::backend::select(hypermnf::mnf::BackendChoice::Auto).unwrap();
    assert_eq!(
        auto.name(),
        "cuda",
        "auto must pick the GPU where there is one"
    );
    // /metrics reports the device memory in use: a context and the loaded kernels take some.
    let (used, total) = g
        .memory_in_use()
        .expect("a CUDA backend knows its device memory");
    assert!(used > 0 && used <= total, "used {used} of {total}");
    assert!(hypermnf::backend::cpu::CpuBackend::new()
        .memory_in_use()
        .is_none());
}

/// The eigen step on the device (cuSOLVER potrf + syevd, cuBLAS trsm) against the host (faer) and the
/// CPU backend, on the real cubes: the device solver is called directly (it must succeed, so a silent
/// fall-back to the host cannot hide a failure) and through the pipeline; the eigenvalues agree to
/// 1e-9, the transforms closely, and the components correlate ≥ 0.9999.
#[test]
#[ignore = "needs a CUDA device"]
fn device_eigen_step_matches_host() {
    use hypermnf::mnf::eigen::{self, NoiseWhitening};
    let dev = gpu(Route::Kernels);
    assert!(
        dev.eigen_on_device(),
        "libcusolver should be available on the GPU host"
    );
    let host = gpu(Route::Kernels).with_host_eigen();
    assert!(!host.eigen_on_device());
    let cpu = CpuBackend::new();
    for (name, cube) in real_cubes() {
        let prepared = dev.prepare(&cube, &Monitor::silent()).expect("prepare");
        let solver = prepared
            .eigen_solver()
            .expect("a device solver on the CUDA backend");
        for noise in [NoiseEstimator::MeanFilter, NoiseEstimator::ShiftDifference] {
            let params = MnfParams {
                components: Some(10),
                noise,
                ..Default::default()
            };
            // The solver alone, on the reference statistics: C_N as the pipeline scales it, C_D of the
            // same bands.
            let b = hypermnf::mnf::pipeline::analyse(&cube, &params, &cpu, &Monitor::silent())
                .unwrap();
            let (stats, _) = stats_of(&cpu, &cube, &spec(noise, &cube));
            let cd = hypermnf::mnf::bands::submatrix(
                &stats.data.covariance().unwrap(),
                cube.bands(),
                &b.bands_used,
            );
            let n = b.bands_used.len();
            let (values, w) = solver
                .solve(&b.noise_covariance, &cd, n)
                .unwrap_or_else(|e| panic!("{name} {noise:?}: device solve failed: {e}"));
            assert_eq!((values.len(), w.len()), (n, n * n));
            let mut sorted = values.clone();
            sorted.sort_by(|x, y| y.total_cmp(x));
            let want = eigen::solve(&NoiseWhitening::new(b.noise_covariance.clone(), n).unwrap(), &cd)
                .unwrap();
            let worst = sorted
                .iter()
                .zip(&want.eigenvalues)
                .map(|(x, y)| (x - y).abs() / y.abs().max(1e-300))
                .fold(0.0f64, f64::max);
            eprintln!("{name} {noise:?}: device solver vs host eigenvalues, max rel. diff {worst:.2e}");
            assert!(
                worst <= 1e-9,
                "{name} {noise:?}: device solver eigenvalues differ by {worst:.3e}"
            );
            // Ordered by the shared code: the leading components' loadings agree (up to sign: a
            // near-tie of the largest loadings could flip it), where their eigenvalues are separated.
            let got = eigen::solve_with(&NoiseWhitening::deferred(b.noise_covariance.clone(), n), &cd, Some(solver))
                .unwrap();
            let ev = &want.eigenvalues;
            let col = |t: &[f64], c: usize| (0..n).map(|r| t[r * n + c]).collect::<Vec<f64>>();
            for c in 0..n.min(10) {
                if c + 1 < n && (ev[c] - ev[c + 1]).abs() < 1e-3 * ev[c] {
                    continue;
                }
                let (x, y) = (col(&got.transform, c), col(&want.transform, c));
                let neg: Vec<f64> = x.iter().map(|v| -v).collect();
                let d = rel_fro(&x, &y).min(rel_fro(&neg, &y));
                assert!(d <= 1e-5, "{name} {noise:?}: component {c} of W differs by {d:.3e}");
            }

            // The whole pipeline, device against host eigen step.
            let a =
                hypermnf::mnf::pipeline::analyse(&cube, &params, &dev, &Monitor::silent()).unwrap();
            let h = hypermnf::mnf::pipeline::analyse(&cube, &params, &host, &Monitor::silent())
                .unwrap();
            assert_eq!(a.bands_used, h.bands_used, "{name} {noise:?}: bands used");
            let worst = a
                .eigenvalues
                .iter()
                .zip(&h.eigenvalues)
                .map(|(x, y)| (x - y).abs() / y.abs().max(1e-300))
                .fold(0.0f64, f64::max);
            eprintln!("{name} {noise:?}: device vs host eigenvalues, max rel. diff {worst:.2e}");
            assert!(
                worst <= 1e-9,
                "{name} {noise:?}: eigenvalues differ by {worst:.3e}"
            );
            assert_pipeline_matches(
                &format!("device eigen {name} {noise:?}"),
                &cube,
                &params,
                &dev,
            );
        }
    }
}

/// The 2-byte integer fast paths (noise_mean_filter_w16, project_w16: int16 / uint16, bands % 8 == 0)
/// against the generic kernels and the CPU: the noise moments must be bit-identical to the generic
/// kernel's (same residuals, same summation), the statistics and projection within the usual bounds of
/// the CPU's; on tiny images (1–3 lines or samples), odd sizes, both byte orders, no-data pixels, a noise
/// window, bad bands and k on both sides of the fast path's limit of 16.
#[test]
#[ignore = "needs a CUDA device"]
fn int16_fast_paths_match_generic_kernels_and_cpu() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let cpu = CpuBackend::new();
    let fast = gpu(Route::Kernels);
    let generic = gpu(Route::Kernels).with_generic_kernels();
    for dtype in [DataType::I16, DataType::U16] {
        for order in [ByteOrder::Little, ByteOrder::Big] {
            for (l, s, b) in [(1, 9, 8), (2, 5, 16), (3, 3, 8), (37, 29, 64), (23, 70, 224)] {
                let cube = random_cube(&mut rng, l, s, b, dtype, order);
                let hole = cube.to_f64()[((l / 2) * s + s / 2) * b + 3];
                let masked = StatsSpec {
                    noise: NoiseEstimator::MeanFilter,
                    window: (l > 4).then_some(Window { x0: 2, y0: 1, x1: s - 3, y1: l - 2 }),
                    ignore_value: Some(hole),
                    mask_bands: (0..b).filter(|x| x % 4 != 1).collect(),
                };
                for sp in [spec(NoiseEstimator::MeanFilter, &cube), masked] {
                    let what = format!("{dtype:?} {order:?} {l}x{s}x{b} mask {:?}", sp.ignore_value);
                    let (c, _) = stats_of(&cpu, &cube, &sp);
                    let (f, _) = stats_of(&fast, &cube, &sp);
                    let (g, _) = stats_of(&generic, &cube, &sp);
                    assert_eq!(f.noise, g.noise, "{what}: fast and generic noise moments differ");
                    assert_stats_match(&what, &f, &c);
                }
                let used: Vec<usize> = (0..b).filter(|x| x % 5 != 2).collect();
                let u = used.len();
                for k in [1, 4, 10, 16, 17].into_iter().filter(|&k| k <= u) {
                    let proj = Projection {
                        bands_used: used.clone(),
                        means: (0..u).map(|_| rng.random_range(-2000.0..30000.0)).collect(),
                        transform: (0..u * k).map(|_| rng.random_range(-1.0..1.0)).collect(),
                        k,
                        ignore_value: Some(hole),
                        mask_bands: vec![3],
                    };
                    let mut want = vec![0f32; l * s * k];
                    cpu.prepare(&cube, &Monitor::silent()).unwrap().project(&proj, &mut want, &Monitor::silent()).unwrap();
                    let mut got = vec![f32::INFINITY; l * s * k];
                    fast.prepare(&cube, &Monitor::silent()).unwrap().project(&proj, &mut got, &Monitor::silent()).unwrap();
                    let what = format!("{dtype:?} {order:?} {l}x{s}x{b} k={k}");
                    assert!(got.iter().zip(&want).all(|(a, w)| a.is_nan() == w.is_nan()), "{what}: NaN pattern");
                    assert!(got.iter().any(|v| v.is_nan()), "{what}: the no-data pixel must be NaN");
                    let (a, w): (Vec<f64>, Vec<f64>) =
                        got.iter().zip(&want).filter(|(x, _)| !x.is_nan()).map(|(x, y)| (*x as f64, *y as f64)).unzip();
                    let e = rel_fro(&a, &w);
                    assert!(e <= 1e-5, "{what}: projection rel. error {e:.3e}");
                }
            }
        }
    }
}

/// A noise covariance that is not positive definite, on the device path: the device's potrf says so
/// (never a panic or a result), and `solve_with` turns it into the host path's clear Degenerate error.
/// Exactly duplicated noise (a 3 × 3 with exact arithmetic) and a real C_N of 224 bands where band 11
/// repeats band 10's noise with a slightly smaller variance (indefinite by 0.1 %, far from rounding).
#[test]
#[ignore = "needs a CUDA device"]
fn device_eigen_singular_noise_is_a_clear_error() {
    use hypermnf::mnf::eigen::{self, NoiseWhitening, SolverError};
    use hypermnf::mnf::MnfError;
    let dev = gpu(Route::Kernels);
    assert!(dev.eigen_on_device());
    let host_message = NoiseWhitening::new(vec![1.0, 1.0, 1.0, 1.0], 2)
        .err()
        .expect("singular")
        .to_string();
    let (name, cube) = real_cubes().into_iter().next().expect("a real cube");
    let prepared = dev.prepare(&cube, &Monitor::silent()).expect("prepare");
    let solver = prepared.eigen_solver().expect("a device solver");

    let mut cases: Vec<(String, Vec<f64>, Vec<f64>, usize)> = Vec::new();
    let cn3 = vec![4.0, 4.0, 0.0, 4.0, 4.0, 0.0, 0.0, 0.0, 1.0];
    let cd3 = vec![3.0, 1.0, 0.0, 1.0, 2.0, 0.5, 0.0, 0.5, 1.0];
    cases.push(("3 x 3, bands 0 and 1 identical".into(), cn3, cd3, 3));
    let params = MnfParams {
        components: Some(10),
        ..Default::default()
    };
    let sys = hypermnf::mnf::pipeline::analyse(&cube, &params, &CpuBackend::new(), &Monitor::silent())
        .unwrap();
    let n = sys.bands_used.len();
    assert!(n > 12, "{name}: {n} bands");
    let mut cn = sys.noise_covariance.clone();
    for k in 0..n {
        cn[11 * n + k] = cn[10 * n + k];
    }
    for k in 0..n {
        cn[k * n + 11] = cn[k * n + 10];
    }
    cn[11 * n + 11] = cn[10 * n + 10] * 0.999;
    let (stats, _) = stats_of(&CpuBackend::new(), &cube, &spec(params.noise, &cube));
    let cd = hypermnf::mnf::bands::submatrix(&stats.data.covariance().unwrap(), cube.bands(), &sys.bands_used);
    cases.push((format!("{name}, {n} bands, band 11 repeats band 10"), cn, cd, n));

    for (what, cn, cd, n) in cases {
        match solver.solve(&cn, &cd, n) {
            Err(SolverError::NotPositiveDefinite(k)) => {
                eprintln!("{what}: potrf: leading minor of order {k} not positive definite");
                assert!((1..=12).contains(&k), "{what}: order {k}");
            }
            other => panic!("{what}: expected NotPositiveDefinite, got {:?}", other.map(|_| "a result")),
        }
        let err = eigen::solve_with(&NoiseWhitening::deferred(cn.clone(), n), &cd, Some(solver))
            .err()
            .unwrap_or_else(|| panic!("{what}: solved a singular problem"));
        assert!(matches!(err, MnfError::Degenerate(_)), "{what}: {err}");
        assert_eq!(err.to_string(), host_message, "{what}");
        // The solver is still usable afterwards.
        let ok = solver.solve(&[2.0, 0.0, 0.0, 3.0], &[1.0, 0.0, 0.0, 1.0], 2).expect("a regular solve after a failed one");
        let mut v = ok.0;
        v.sort_by(|a, b| a.total_cmp(b));
        assert!((v[0] - 1.0 / 3.0).abs() < 1e-14 && (v[1] - 0.5).abs() < 1e-14, "{v:?}");
    }
}

/// Components projected into page-locked output memory (downloaded straight into it, no host copy)
/// are bit-identical to those projected into ordinary memory, resident and streamed, and the inverse
/// into a registered buffer too.
#[test]
#[ignore = "needs a CUDA device"]
fn projection_into_page_locked_output_matches_ordinary_memory() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let mut sp = SyntheticSpec::small(301, 67, 40);
    sp.seed = rng.random();
    let cube = synthetic::generate(&sp);
    let params = MnfParams { components: Some(7), ..Default::default() };
    for budget in [None, Some(cube.raw().len() / 5)] {
        let mut g = gpu(Route::Kernels);
        if let Some(b) = budget {
            g = g.with_memory_budget(b);
        }
        let system = mnf::pipeline::analyse(&cube, &params, &g, &Monitor::silent()).expect("analyse");
        let proj = Projection {
            bands_used: system.bands_used.clone(),
            means: system.means.clone(),
            transform: system.transform_k(7),
            k: 7,
            ignore_value: None,
            mask_bands: (0..40).collect(),
        };
        let n = cube.pixels() * 7;
        let mut plain = vec![0f32; n];
        g.prepare(&cube, &Monitor::silent()).unwrap().project(&proj, &mut plain, &Monitor::silent()).unwrap();
        let mut store = vec![f32::INFINITY; n];
        // SAFETY: a byte view of the f32 buffer for the registration; back to f32 below.
        let bytes = unsafe { std::slice::from_raw_parts_mut(store.as_mut_ptr() as *mut u8, n * 4) };
        let (reg, pinned) = g.register_host_mut(bytes).expect("cuMemHostRegister");
        let pinned = unsafe { std::slice::from_raw_parts_mut(pinned.as_mut_ptr() as *mut f32, n) };
        g.prepare(&cube, &Monitor::silent()).unwrap().project(&proj, pinned, &Monitor::silent()).unwrap();
        drop(reg);
        assert!(
            plain.iter().zip(&store).all(|(a, b)| a.to_bits() == b.to_bits()),
            "budget {budget:?}: page-locked output differs"
        );
    }
}

// ---------------------------------------------------------------------------------------------------
// Several devices: a cube split by lines (backend::split).

use hypermnf::backend::devices::{select_devices, DeviceSelection};
use hypermnf::backend::split::{SplitBackend, SplitCube, SplitMode};
use hypermnf::mnf::BackendChoice;
use std::sync::Arc;

/// Largest difference between two moments, relative: M2 against the largest |M2| entry, means in
/// standard deviations of their band. Counts must be equal.
fn moments_rel(what: &str, a: &Moments, b: &Moments) -> f64 {
    assert_eq!(a.n, b.n, "{what}: count");
    let scale = b.m2.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
    let m2 = a.m2.iter().zip(&b.m2).fold(0.0f64, |m, (x, y)| m.max((x - y).abs())) / scale;
    let mean = (0..b.bands)
        .map(|i| (a.mean[i] - b.mean[i]).abs() / b.variance(i).sqrt().max(f64::MIN_POSITIVE))
        .fold(0.0f64, f64::max);
    m2.max(mean)
}

/// The split statistics against one device's (1e-12 relative, equal counts) and the CPU's (the usual
/// 1e-5); prints the relative differences.
fn assert_split_stats(what: &str, cube: &Cube, st: &StatsSpec, one: &dyn Backend, parts: &[Arc<dyn Backend>]) {
    let (single, _) = stats_of(one, cube, st);
    let mut split = SplitCube::new(cube, parts, &Monitor::silent()).expect("split prepare");
    assert_eq!(split.share_lines().len(), parts.len().min(cube.lines() / 2), "{what}: shares");
    let mut early = None;
    let s = hypermnf::backend::PreparedCube::statistics(&mut split, st, &mut |m: &Moments| early = Some(m.clone()), &Monitor::silent())
        .expect("split statistics");
    assert_eq!(early.as_ref(), Some(&s.noise), "{what}: on_noise gets the merged noise moments");
    assert_eq!(s.masked_pixels, single.masked_pixels, "{what}: masked pixels");
    let d = moments_rel(&format!("{what} data"), &s.data, &single.data);
    let n = moments_rel(&format!("{what} noise"), &s.noise, &single.noise);
    eprintln!("{what}: split vs one device: data {d:.2e}, noise {n:.2e} (relative)");
    assert!(d <= 1e-12 && n <= 1e-12, "{what}: split vs one device: data {d:.3e}, noise {n:.3e} > 1e-12");
    let (c, _) = stats_of(&CpuBackend::new(), cube, st);
    assert_stats_match(&format!("{what} split vs CPU"), &s, &c);
}

/// The seams on a device: the cube split into 2 and 3 shares on the same device (so that one GPU
/// runs it) equals one device to 1e-12, for int16 / uint16 / float32 / float64 cubes of fresh random
/// values, both estimators, with no-data pixels and a noise window across a seam, resident and
/// streamed, both routes.
#[test]
#[ignore = "needs a CUDA device"]
fn split_statistics_match_one_device_and_cpu() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    for route in ROUTES {
        let dev: Arc<dyn Backend> = Arc::new(gpu(route));
        for (dtype, order) in [
            (DataType::I16, ByteOrder::Little),
            (DataType::U16, ByteOrder::Big),
            (DataType::F32, ByteOrder::Little),
            (DataType::F64, ByteOrder::Little),
        ] {
            let cube = random_cube(&mut rng, 61, 47, 19, dtype, order);
            let streamed: Arc<dyn Backend> = Arc::new(gpu(route).with_memory_budget(cube.raw().len() / 5));
            for noise in [NoiseEstimator::MeanFilter, NoiseEstimator::ShiftDifference] {
                let plain = spec(noise, &cube);
                let mut masked = plain.clone();
                masked.ignore_value = Some(cube.to_f64()[(7 * 47 + 3) * 19]);
                let mut windowed = plain.clone();
                windowed.window = Some(Window { x0: 4, x1: 40, y0: 13, y1: 44 });
                for (name, st) in [("plain", &plain), ("no-data", &masked), ("window", &windowed)] {
                    for shares in [2usize, 3] {
                        let what = format!("{route:?} {dtype:?} {noise:?} {name} {shares} shares");
                        assert_split_stats(&what, &cube, st, dev.as_ref(), &vec![dev.clone(); shares]);
                    }
                    let what = format!("{route:?} {dtype:?} {noise:?} {name} streamed, 2 shares");
                    assert_split_stats(&what, &cube, st, dev.as_ref(), &vec![streamed.clone(); 2]);
                }
            }
        }
    }
}

/// The whole pipeline through a split backend on one device (2 shares) matches the CPU as the
/// unsplit backend does, and its eigenvalues equal the unsplit device's to 1e-9 relative.
#[test]
#[ignore = "needs a CUDA device"]
fn split_pipeline_matches_one_device_and_cpu() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let mut sp = SyntheticSpec::small(120, 64, 48);
    sp.seed = rng.random();
    let cube = synthetic::generate(&sp);
    let dev: Arc<dyn Backend> = Arc::new(gpu(Route::Kernels));
    let split = SplitBackend::new(vec![dev.clone(), dev.clone()], SplitMode::Always).unwrap();
    for noise in [NoiseEstimator::MeanFilter, NoiseEstimator::ShiftDifference] {
        let params = MnfParams { components: Some(6), noise, inverse: true, ..Default::default() };
        assert_pipeline_matches(&format!("split {noise:?}"), &cube, &params, &split);
        let a = mnf::run(&cube, &params, dev.as_ref(), &Monitor::silent()).unwrap();
        let b = mnf::run(&cube, &params, &split, &Monitor::silent()).unwrap();
        let e = rel_fro(&b.metadata.eigenvalues, &a.metadata.eigenvalues);
        eprintln!("split {noise:?}: eigenvalues vs one device, rel. {e:.2e}");
        assert!(e <= 1e-9, "split {noise:?}: eigenvalues rel. {e:.3e}");
    }
}

/// Device lists are checked against the host: one past the last device is a clear error, never a
/// panic; `all` opens every device.
#[test]
#[ignore = "needs a CUDA device"]
fn device_lists_are_checked_against_the_host() {
    let n = hypermnf::backend::cuda::device_count().expect("a driver");
    eprintln!("{n} CUDA device(s)");
    let all = select_devices(BackendChoice::Cuda, &DeviceSelection::All).unwrap();
    assert_eq!(all.len(), n);
    for (i, b) in all.iter().enumerate() {
        assert_eq!(b.ordinal(), Some(i));
    }
    let e = select_devices(BackendChoice::Auto, &DeviceSelection::List(vec![n])).err().expect("no such device");
    eprintln!("--devices {n}: {e}");
    assert_eq!(e.code(), "invalid_input");
    let e = CudaBackend::on_device(n, Route::Kernels).err().expect("no such device");
    assert_eq!(e.code(), "backend_unavailable");
}

/// Two real devices: a 1087 × 614 × 224 int16 cube (the published size) and a float32 one split
/// over devices 0 and 1 equal device 0 alone (statistics to 1e-12, eigenvalues to 1e-9), and each
/// device alone gives the same statistics. Skipped, saying so, with fewer than two devices.
#[test]
#[ignore = "needs a CUDA device"]
fn two_devices_split_matches_one() {
    let n = hypermnf::backend::cuda::device_count().expect("a driver");
    if n < 2 {
        eprintln!("SKIPPED two_devices_split_matches_one: this host has {n} CUDA device(s), the test needs 2");
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let d0: Arc<dyn Backend> = Arc::new(CudaBackend::on_device(0, Route::Kernels).unwrap());
    let d1: Arc<dyn Backend> = Arc::new(CudaBackend::on_device(1, Route::Kernels).unwrap());
    let mut sp = SyntheticSpec::paper_size();
    sp.seed = rng.random();
    let big = synthetic::generate(&sp);
    let float = random_cube(&mut rng, 301, 211, 64, DataType::F32, ByteOrder::Little);
    for (name, cube) in [("1087x614x224 int16", &big), ("301x211x64 float32", &float)] {
        for noise in [NoiseEstimator::MeanFilter, NoiseEstimator::ShiftDifference] {
            let st = spec(noise, cube);
            let what = format!("{name} {noise:?} devices 0+1");
            assert_split_stats(&what, cube, &st, d0.as_ref(), &[d0.clone(), d1.clone()]);
            let (a, _) = stats_of(d0.as_ref(), cube, &st);
            let (b, _) = stats_of(d1.as_ref(), cube, &st);
            let (x, y) = (moments_rel("data", &b.data, &a.data), moments_rel("noise", &b.noise, &a.noise));
            eprintln!("{name} {noise:?}: device 1 vs device 0 alone: data {x:.2e}, noise {y:.2e}");
            assert!(x <= 1e-12 && y <= 1e-12);
        }
        let split = SplitBackend::new(vec![d0.clone(), d1.clone()], SplitMode::Always).unwrap();
        let params = MnfParams { components: Some(10), ..Default::default() };
        let a = mnf::run(cube, &params, d0.as_ref(), &Monitor::silent()).unwrap();
        let b = mnf::run(cube, &params, &split, &Monitor::silent()).unwrap();
        let e = rel_fro(&b.metadata.eigenvalues, &a.metadata.eigenvalues);
        let za: Vec<f64> = a.components.iter().map(|&v| v as f64).collect();
        let zb: Vec<f64> = b.components.iter().map(|&v| v as f64).collect();
        let z = rel_fro(&zb, &za);
        eprintln!("{name}: split over devices 0+1 vs device 0: eigenvalues {e:.2e}, components {z:.2e} (relative)");
        assert!(e <= 1e-9, "{name}: eigenvalues rel. {e:.3e}");
        assert!(z <= 1e-5, "{name}: components rel. {z:.3e}");
    }
}

/// A cube mapped from a stored `.npy` (as a service job reads its upload) goes to the device with
/// positioned reads of the file, in 16 MiB staging pieces: the result is bit-identical to the same
/// cube in memory, resident, streamed and split (shares start mid-file), and matches the CPU backend.
#[test]
#[ignore = "needs a CUDA device"]
fn mapped_cube_is_read_from_its_file_like_one_in_memory() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    // 300 × 200 × 224 int16 = 26.9 MB: two staging pieces, the second partial.
    let mut sp = SyntheticSpec::small(300, 200, 224);
    sp.seed = rng.random();
    let cube = synthetic::generate(&sp);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cube.npy");
    hypermnf::cube::npy::write_cube(&path, &cube).unwrap();
    let mapped = hypermnf::cube::npy::map(&path).unwrap();
    assert!(mapped.is_mapped() && mapped.raw_file().is_some() && mapped.raw() == cube.raw());
    let dev: Arc<dyn Backend> = Arc::new(gpu(Route::Kernels));
    let streamed = gpu(Route::Kernels).with_memory_budget(cube.raw().len() / 5);
    let split = SplitBackend::new(vec![dev.clone(), dev.clone()], SplitMode::Always).unwrap();
    let params = MnfParams { components: Some(8), ..Default::default() };
    for (what, backend) in [("resident", dev.as_ref()), ("streamed", &streamed as &dyn Backend), ("split", &split)] {
        let a = mnf::run(&cube, &params, backend, &Monitor::silent()).unwrap();
        let b = mnf::run(&mapped, &params, backend, &Monitor::silent()).unwrap();
        assert!(a.components == b.components, "{what}: mapped and in-memory components differ");
        assert_eq!(a.metadata.eigenvalues, b.metadata.eigenvalues, "{what}: eigenvalues");
        assert_pipeline_matches(&format!("mapped, {what}"), &mapped, &params, backend);
    }
}

/// A resident cube gives its two staging buffers back to the backend's pool once it is wholly on the
/// device: a cube that the device-level cache keeps must not hold the page-locked memory that the next
/// cube's passes need (they waited for a fresh `cuMemHostAlloc` before). A streamed cube keeps them for
/// its next pass.
#[test]
#[ignore = "needs a CUDA device"]
fn resident_cube_returns_its_staging_once_uploaded() {
    use hypermnf::backend::PreparedCube;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let mut sp = SyntheticSpec::small(97, 53, 31);
    sp.seed = rng.random();
    let cube = synthetic::generate(&sp);
    let st = spec(NoiseEstimator::MeanFilter, &cube);
    for (what, be, resident) in [
        ("resident", gpu(Route::Kernels), true),
        ("streamed", gpu(Route::Kernels).with_memory_budget(cube.raw().len() / 5), false),
    ] {
        let idle = be.idle_pinned_bytes();
        assert!(idle >= 2 * (16 << 20), "{what}: the backend makes its staging buffers when it opens ({idle} bytes idle)");
        let mut p = be.prepare_cuda(&cube).unwrap();
        assert_eq!(p.is_resident(), resident, "{what}");
        p.statistics(&st, &mut |_| {}, &Monitor::silent()).unwrap();
        let after = be.idle_pinned_bytes();
        if resident {
            assert!(after >= idle, "{what}: {after} bytes idle after the pass, {idle} before: the staging was kept");
        } else {
            assert!(after < idle, "{what}: a streamed cube keeps its staging between passes");
        }
        drop(p);
        assert!(be.idle_pinned_bytes() >= idle, "{what}: everything back once the cube is dropped");
    }
}

/// A `.npy` upload sent to the device while it arrives (`jobs::feed`), then computed by its job
/// started before the upload was synced (`jobs::early`): the result is bit-identical to the same cube
/// computed in memory on the same backend, which matches the CPU backend; the metrics say the job
/// ran on the fed cube. A second upload of the same cube with other parameters finds the cube
/// resident and its eigen system kept beside it (nothing fed: the level held it already).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a CUDA device"]
async fn a_new_job_of_a_cube_on_the_device_runs_without_its_body() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let mut sp = SyntheticSpec::small(500, 300, 128);
    sp.seed = rng.random();
    let cube = synthetic::generate(&sp);
    let dir = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path());
    args.backend = hypermnf::mnf::BackendChoice::Cuda;
    let srv = common::TestServer::start_on_given_backend(args).await;
    let body = common::npy_bytes(&cube);
    let digest = hex::encode(hypermnf::cube::digest::of_parts(&[&body]));
    let post = |k: usize, body: Vec<u8>| {
        srv.client
            .post(srv.url(&format!("/v1/jobs?components={k}&backend=cuda")))
            .header("content-type", "application/x-npy")
            .header("x-cube-digest", digest.clone())
            .body(body)
            .send()
    };
    // The cube, sent once; then other components with no body at all.
    let r = post(6, body.clone()).await.unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::ACCEPTED);
    let first: serde_json::Value = r.json().await.unwrap();
    assert_eq!(srv.wait(first["id"].as_str().unwrap()).await["status"], "succeeded");
    let r = post(9, Vec::new()).await.unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::CREATED, "the job did not run on the resident cube");
    let job: serde_json::Value = r.json().await.unwrap();
    assert_eq!(job["status"], "succeeded", "{job}");
    let id = job["id"].as_str().unwrap();
    let (s, got) = srv.get_bytes(&format!("/v1/jobs/{id}/result")).await;
    assert_eq!(s, reqwest::StatusCode::OK);
    let params = MnfParams { components: Some(9), backend: hypermnf::mnf::BackendChoice::Cuda, ..Default::default() };
    assert_pipeline_matches("in memory, k = 9", &cube, &params, &gpu(Route::Kernels));
    let want = mnf::run(&cube, &params, &gpu(Route::Kernels), &Monitor::silent()).unwrap();
    let values: Vec<u32> = got[got.len() - want.components.len() * 4..].chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
    assert!(values == want.components.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "the result differs from the in-memory pipeline");
    let md = srv.get_json(&format!("/v1/jobs/{id}/metadata")).await.1;
    assert_eq!(md["statistics"]["source"], "device", "{md}");
    eprintln!("without its body: timings {}", md["timings_ms"]);
    // The same request again is the job just made; the metrics count one such run.
    let r = post(9, Vec::new()).await.unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    let metrics = srv.client.get(srv.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("hypermnf_jobs_run_on_resident_cube_total 1\n"), "{metrics}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a CUDA device"]
async fn an_upload_fed_to_the_device_while_it_arrives_gives_the_in_memory_result() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    // 700 × 300 × 128 int16 = 53.8 MB: several statistics chunks, fed as the writer reports them.
    let mut sp = SyntheticSpec::small(700, 300, 128);
    sp.seed = rng.random();
    let cube = synthetic::generate(&sp);
    let dir = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path());
    args.backend = hypermnf::mnf::BackendChoice::Cuda;
    let srv = common::TestServer::start_on_given_backend(args).await;
    let body = common::npy_bytes(&cube);
    let in_memory = |k: usize| {
        let params = MnfParams { components: Some(k), backend: hypermnf::mnf::BackendChoice::Cuda, ..Default::default() };
        assert_pipeline_matches(&format!("in memory, k = {k}"), &cube, &params, &gpu(Route::Kernels));
        mnf::run(&cube, &params, &gpu(Route::Kernels), &Monitor::silent()).unwrap()
    };
    for (k, fed) in [(6, 1), (9, 1)] {
        let (s, job) = srv.post_npy(&body, &format!("components={k}&backend=cuda")).await;
        assert_eq!(s, reqwest::StatusCode::ACCEPTED, "{job}");
        let id = job["id"].as_str().unwrap();
        assert_eq!(srv.wait(id).await["status"], "succeeded");
        let (s, got) = srv.get_bytes(&format!("/v1/jobs/{id}/result")).await;
        assert_eq!(s, reqwest::StatusCode::OK);
        let want = in_memory(k);
        let values: Vec<u32> = got[got.len() - want.components.len() * 4..]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(values == want.components.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "k = {k}: the service's result differs");
        let metrics = srv.client.get(srv.url("/metrics")).send().await.unwrap().text().await.unwrap();
        assert!(metrics.contains(&format!("hypermnf_jobs_fed_to_device_total {fed}\n")), "k = {k}: {metrics}");
        let md = srv.get_json(&format!("/v1/jobs/{id}/metadata")).await.1;
        eprintln!("k = {k}: statistics {} timings {}", md["statistics"], md["timings_ms"]);
        if k == 9 {
            assert_eq!(md["statistics"]["source"], "device", "{md}");
        }
    }
    srv.stop().await;
}
