//! The CUDA backend against the CPU backend (the float64 reference), on fresh random cubes and on the
//! three real AVIRIS chips. Every test needs a CUDA device: they are ignored elsewhere and run on the
//! GPU host with `--include-ignored` (see .gpu/run). Random seeds are printed, so a failure can be
//! replayed with HYPERMNF_TEST_SEED. The other GPU suites have files of their own: tests/gpu_split.rs
//! (a cube split over devices), tests/gpu_cache.rs (the job cache's device level),
//! tests/gpu_hashtable.rs (the job cache's index) and tests/gpu_ht_designs.rs (the published designs
//! `hypermnf bench hashtable` compares with it).

/// The in-process server of the service tests, here on the CUDA backend, and the GPU suites' helpers.
mod common;

use std::sync::Arc;

use common::gpu::*;
use hypermnf::backend::cpu::CpuBackend;
use hypermnf::backend::cuda::{CudaBackend, Route};
use hypermnf::backend::split::{SplitBackend, SplitMode};
use hypermnf::backend::Backend;
use hypermnf::cube::synthetic::{self, SyntheticSpec};
use hypermnf::cube::{ByteOrder, Cube, CubeMeta, DataType};
use hypermnf::mnf::stats::{Projection, StatsSpec};
use hypermnf::mnf::{self, MnfParams, Monitor, NoiseEstimator, Window};
use rand::{Rng, SeedableRng};

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
            for noise in ESTIMATORS {
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
        let cube = synthetic_cube(&mut rng, 61, 45, 37);
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
        for noise in ESTIMATORS {
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
            let params = MnfParams { components: Some(10), ..Default::default() };
            assert_stats_and_pipeline_match_cpu(&format!("{which} {name}"), &cube, &fma, &params, |_| {});
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

#[test]
#[ignore = "needs a CUDA device"]
fn real_cubes_statistics_and_pipeline_match_cpu() {
    for route in ROUTES {
        let g = gpu(route);
        for (name, cube) in real_cubes() {
            let params = MnfParams { components: Some(10), inverse: true, ..Default::default() };
            assert_stats_and_pipeline_match_cpu(&format!("{route:?} {name}"), &cube, &g, &params, |_| {});
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
            for noise in ESTIMATORS {
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
        let cube = synthetic_cube(&mut rng, 45, 37, 29);
        for k in [1, 29] {
            let params = MnfParams {
                components: Some(k),
                inverse: true,
                ..Default::default()
            };
            assert_pipeline_matches(&format!("{route:?} k={k}"), &cube, &params, &g);
        }
        // 120 bands: the device eigen step by the own kernels (97–144 bands), with the inverse.
        let mut sp = SyntheticSpec::small(41, 37, 120);
        sp.seed = rng.random();
        sp.dtype = DataType::F32;
        let cube = synthetic::generate(&sp);
        let params = MnfParams { components: Some(12), inverse: true, ..Default::default() };
        assert_pipeline_matches(&format!("{route:?} 120 bands (own eigen kernels)"), &cube, &params, &g);
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
            assert_projection_close(&format!("{route} k={k}"), &got, &want);
        }
    }
}

/// A cube larger than the memory budget is streamed (both passes) and gives the same answers.
#[test]
#[ignore = "needs a CUDA device"]
fn streamed_cube_matches_resident_and_cpu() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let cube = synthetic_cube(&mut rng, 97, 53, 31);
    for route in ROUTES {
        let small = gpu(route).with_memory_budget(cube.raw().len() / 5);
        assert!(
            !small.prepare_cuda(&cube).unwrap().is_resident(),
            "the budget must force streaming"
        );
        assert!(gpu(route).prepare_cuda(&cube).unwrap().is_resident());
        let params = MnfParams { components: Some(6), inverse: true, ..Default::default() };
        let hole = cube.to_f64()[31 * 200];
        assert_stats_and_pipeline_match_cpu(&format!("{route:?} streamed"), &cube, &small, &params, |st| {
            st.ignore_value = Some(hole)
        });
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
        for noise in ESTIMATORS {
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

/// A solver seen through `solve` alone: its answers ordered and signed by the host.
struct Unordered<'a>(&'a dyn hypermnf::mnf::eigen::GeneralizedEigenSolver);

impl hypermnf::mnf::eigen::GeneralizedEigenSolver for Unordered<'_> {
    fn name(&self) -> &'static str {
        "the device solver, ordered by the host"
    }
    fn solve(&self, cn: &[f64], cd: &[f64], n: usize) -> Result<(Vec<f64>, Vec<f64>), hypermnf::mnf::eigen::SolverError> {
        self.0.solve(cn, cd, n)
    }
    fn takes(&self, n: usize) -> bool {
        self.0.takes(n)
    }
}

/// The eigen step on the device (potrf, the whitening, the job's eigensolver) against the host (faer) and the
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
        for noise in ESTIMATORS {
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
            // The pairs ordered and signed on the device are the host's ordering of the device's W,
            // bit for bit (the solver seen through `solve` alone leaves the ordering to the host).
            let by_host = eigen::solve_with(&NoiseWhitening::deferred(b.noise_covariance.clone(), n), &cd, Some(&Unordered(solver)))
                .unwrap();
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<u64>>();
            assert_eq!(bits(&got.eigenvalues), bits(&by_host.eigenvalues), "{name} {noise:?}: eigenvalues ordered on the device");
            assert_eq!(bits(&got.transform), bits(&by_host.transform), "{name} {noise:?}: transform ordered on the device");
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
                    window: (l > 4).then(|| Window { x0: 2, y0: 1, x1: s - 3, y1: l - 2 }),
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
                    assert_projection_close(&format!("{dtype:?} {order:?} {l}x{s}x{b} k={k}"), &got, &want);
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
    let cube = synthetic_cube(&mut rng, 301, 67, 40);
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

/// A cube mapped from a stored `.npy` (as a service job reads its upload) goes to the device with
/// positioned reads of the file, in 16 MiB staging pieces: the result is bit-identical to the same
/// cube in memory, resident, streamed and split (shares start mid-file), and matches the CPU backend.
#[test]
#[ignore = "needs a CUDA device"]
fn mapped_cube_is_read_from_its_file_like_one_in_memory() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    // 300 × 200 × 224 int16 = 26.9 MB: two staging pieces, the second partial.
    let cube = synthetic_cube(&mut rng, 300, 200, 224);
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
    let cube = synthetic_cube(&mut rng, 97, 53, 31);
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

/// A page-locked resident cube of many chunks is uploaded in copies of several chunks, then one
/// chunk a copy for its last chunks (`issue_all_chunks`): the job gives the bits of the same cube
/// uploaded chunk by chunk through the staging buffers, with the same chunks.
#[test]
#[ignore = "needs a CUDA device"]
fn a_page_locked_cube_uploaded_in_grouped_copies_gives_the_bits_of_one_sent_chunk_by_chunk() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let (lines, samples, bands) = (437, 41, 48);
    let cube = synthetic_cube(&mut rng, lines, samples, bands);
    // 10-line chunks: 44 chunks and tail pieces, of which the first two dozen go in grouped copies.
    let be = gpu(Route::Kernels).with_chunk_work_bytes(10 * samples * bands * 4);
    let params = MnfParams { components: Some(6), ..Default::default() };
    let pageable = mnf::run(&cube, &params, &be, &Monitor::silent()).expect("pageable run");
    let reg = be.register_host(cube.raw()).expect("cuMemHostRegister");
    let p = be.prepare_cuda(&cube).unwrap();
    assert!(p.is_resident());
    assert!(p.timeline().chunks > 40, "{} chunks", p.timeline().chunks);
    drop(p);
    let locked = mnf::run(&cube, &params, &be, &Monitor::silent()).expect("page-locked run");
    drop(reg);
    assert_eq!(pageable.metadata.eigenvalues, locked.metadata.eigenvalues);
    assert!(
        pageable.components.iter().zip(&locked.components).all(|(a, b)| a.to_bits() == b.to_bits()),
        "the components differ"
    );
    assert_eq!(pageable.components.len(), lines * samples * 6);
}

/// A random `lines` × 300 × 128 int16 cube, also as `.npy` bytes, and the service on the CUDA backend
/// in a fresh data dir (removed when the returned guard goes, after the server).
async fn cuda_service_and_cube(lines: usize) -> (tempfile::TempDir, common::TestServer, Cube, Vec<u8>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let cube = synthetic_cube(&mut rng, lines, 300, 128);
    let dir = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path());
    args.backend = hypermnf::mnf::BackendChoice::Cuda;
    let srv = common::TestServer::start_on_given_backend(args).await;
    let body = common::npy_bytes(&cube);
    (dir, srv, cube, body)
}

/// Whether a job's result `.npy` ends with exactly `want`'s components (bit for bit).
fn result_holds(npy: &[u8], want: &mnf::MnfOutput) -> bool {
    let values = &npy[npy.len() - want.components.len() * 4..];
    values.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).eq(want.components.iter().map(|v| v.to_bits()))
}

/// A `.npy` upload sent to the device while it arrives (`jobs::upload_to_device`), then computed by its job
/// started before the upload was synced (`jobs::early_start`): the result is bit-identical to the same cube
/// computed in memory on the same backend, which matches the CPU backend; the metrics say the job
/// ran on the fed cube. A second upload of the same cube with other parameters finds the cube
/// resident and its eigen system kept beside it (nothing fed: the level held it already).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a CUDA device"]
async fn a_new_job_of_a_cube_on_the_device_runs_without_its_body() {
    let (_dir, srv, cube, body) = cuda_service_and_cube(500).await;
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
    assert!(result_holds(&got, &want), "the result differs from the in-memory pipeline");
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
    // 700 × 300 × 128 int16 = 53.8 MB: several statistics chunks, fed as the writer reports them.
    let (_dir, srv, cube, body) = cuda_service_and_cube(700).await;
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
        assert!(result_holds(&got, &want), "k = {k}: the service's result differs");
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

/// The early solve (`PreparedCube::solve_early`): C_N and C_D formed on the device from the pass's
/// sums, with the solve started there, give the pairs the host path gives from the downloaded moments,
/// bit for bit; the statistics themselves are those of a pass without it. On the real cubes (every
/// band, both estimators), and on a random float cube with no-data pixels, a noise window, mask bands
/// and a subset of the bands, resident and streamed, on both covariance routes.
#[test]
#[ignore = "needs a CUDA device"]
fn an_early_solve_from_the_device_sums_has_the_host_paths_bits() {
    use hypermnf::mnf::eigen::{self, NoiseWhitening};
    fn check(what: &str, backend: &CudaBackend, cube: &Cube, sp: &StatsSpec, bands: &[usize], scale: f64) {
        let mut prepared = backend.prepare(cube, &Monitor::silent()).expect("prepare");
        assert!(prepared.solve_early(bands, scale), "{what}: the CUDA backend solves early");
        let stats = prepared.statistics(sp, &mut |_| {}, &Monitor::silent()).expect("statistics");
        let early = prepared.early_solution().expect("an early answer");
        assert!(prepared.early_solution().is_none(), "{what}: the answer is taken once");
        assert_eq!(early.bands, bands, "{what}");
        // The pass is the pass without the early solve: bit for bit with the own covariance kernels;
        // cuBLAS promises the same bits only while one stream is active, and may pick another DSYRK
        // when another is (its documentation, "Results reproducibility").
        let (plain, _) = stats_of(backend, cube, sp);
        if backend.route() == Route::Kernels {
            assert_eq!(stats.data, plain.data, "{what}: data moments with and without the early solve");
            assert_eq!(stats.noise, plain.noise, "{what}: noise moments with and without the early solve");
        } else {
            assert_stats_match(what, &stats, &plain);
        }
        let n = bands.len();
        let cn = stats.noise.covariance_of(bands, scale).expect("n >= 2");
        let cd = stats.data.covariance_of(bands, 1.0).expect("n >= 2");
        let solver = prepared.eigen_solver().expect("a device solver");
        let want = eigen::solve_with(&NoiseWhitening::deferred(cn, n), &cd, Some(solver)).expect("host path");
        let got = eigen::pairs_from_device(early.answer, n, early.solver)
            .expect("a usable early answer")
            .expect("pairs");
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<u64>>();
        assert_eq!(bits(&got.eigenvalues), bits(&want.eigenvalues), "{what}: eigenvalues");
        assert_eq!(bits(&got.transform), bits(&want.transform), "{what}: transform");
        eprintln!("{what}: {n} bands, early solve = host path bit for bit (waited {:.3} ms)", early.wait_ms);
    }

    let dev = gpu(Route::Kernels);
    assert!(dev.eigen_on_device(), "libcusolver should be available on the GPU host");
    for (name, cube) in real_cubes() {
        for noise in ESTIMATORS {
            let all: Vec<usize> = (0..cube.bands()).collect();
            check(&format!("{name} {noise:?}"), &dev, &cube, &spec(noise, &cube), &all, noise.scale());
        }
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let (l, s, b) = (61, 47, 120);
    let cube = random_cube(&mut rng, l, s, b, DataType::F32, ByteOrder::Little);
    let hole = cube.to_f64()[((l / 2) * s + s / 2) * b + 3];
    let sp = StatsSpec {
        noise: NoiseEstimator::MeanFilter,
        window: Some(Window { x0: 2, y0: 1, x1: s - 3, y1: l - 2 }),
        ignore_value: Some(hole),
        mask_bands: (0..b).filter(|x| x % 4 != 1).collect(),
    };
    let used: Vec<usize> = (0..b).filter(|x| x % 7 != 3).collect();
    for route in ROUTES {
        let streamed = gpu(route).with_memory_budget(cube.raw().len() / 5);
        assert!(!streamed.prepare_cuda(&cube).unwrap().is_resident(), "the budget must force streaming");
        for (how, backend) in [("resident", gpu(route)), ("streamed", streamed)] {
            check(&format!("random {l}x{s}x{b} {route:?} {how}"), &backend, &cube, &sp, &used, 1.7);
        }
    }

    // A band the host then drops (constant: no noise) leaves the early answer unused: the pipeline
    // solves the bands it kept, as the CPU does.
    let mut raw = cube.raw().to_vec();
    for p in 0..l * s {
        let at = (p * b + 5) * 4;
        raw[at..at + 4].copy_from_slice(&100.0f32.to_le_bytes());
    }
    let constant = Cube::from_raw(l, s, b, DataType::F32, ByteOrder::Little, raw, CubeMeta::default()).expect("cube");
    let params = MnfParams { components: Some(8), ..Default::default() };
    let sys = mnf::pipeline::analyse(&constant, &params, &dev, &Monitor::silent()).expect("analyse");
    assert!(!sys.bands_used.contains(&5) && sys.bands_used.len() == b - 1, "band 5 is dropped");
    assert_pipeline_matches("a constant band", &constant, &params, &dev);
}
