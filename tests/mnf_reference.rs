//! The CPU pipeline against an independent float64 reference written with naive loops and the paper's
//! route (eigen-decompose C_N, whiten with P = U D^(-1/2), eigen-decompose Pᵀ C_D P), and against the
//! known signal subspace of synthetic cubes.

use hypermnf::backend::cpu::CpuBackend;
use hypermnf::cube::synthetic::{generate, generate_with_truth, SyntheticSpec};
use hypermnf::cube::{Cube, DataType};
use hypermnf::mnf::bands::DropReason;
use hypermnf::mnf::{self, MnfError, MnfParams, Monitor, NoiseEstimator, Window};
use nalgebra::{DMatrix, SymmetricEigen};

/// Naive float64 reference: returns (eigenvalues descending, transform u × u columns, means, bands used).
struct Reference {
    eigenvalues: Vec<f64>,
    transform: DMatrix<f64>,
    means: Vec<f64>,
}

fn reference(cube: &Cube, noise: NoiseEstimator, window: Option<Window>, ignore: Option<f64>, used: &[usize]) -> Reference {
    let (l, s, b) = (cube.lines(), cube.samples(), cube.bands());
    let x = cube.to_f64();
    let at = |li: usize, si: usize, band: usize| x[(li * s + si) * b + band];
    let valid = |li: usize, si: usize| ignore.is_none_or(|v| used.iter().all(|&band| at(li, si, band) != v));
    let u = used.len();
    // Data covariance, two-pass.
    let mut pix: Vec<Vec<f64>> = Vec::new();
    for li in 0..l {
        for si in 0..s {
            if valid(li, si) {
                pix.push(used.iter().map(|&band| at(li, si, band)).collect());
            }
        }
    }
    let cov = |rows: &[Vec<f64>]| -> (Vec<f64>, DMatrix<f64>) {
        let n = rows.len() as f64;
        let mean: Vec<f64> = (0..u).map(|j| rows.iter().map(|r| r[j]).sum::<f64>() / n).collect();
        let c = DMatrix::from_fn(u, u, |i, j| rows.iter().map(|r| (r[i] - mean[i]) * (r[j] - mean[j])).sum::<f64>() / (n - 1.0));
        (mean, c)
    };
    let (means, cd) = cov(&pix);
    let mut res: Vec<Vec<f64>> = Vec::new();
    for li in 0..l {
        for si in 0..s {
            if window.is_some_and(|w| !w.contains(li, si)) {
                continue;
            }
            match noise {
                NoiseEstimator::MeanFilter => {
                    if li == 0 || si == 0 || li + 1 >= l || si + 1 >= s {
                        continue;
                    }
                    if !(li - 1..=li + 1).all(|a| (si - 1..=si + 1).all(|c| valid(a, c))) {
                        continue;
                    }
                    res.push(
                        used.iter()
                            .map(|&band| {
                                let mut sum = 0.0;
                                for a in li - 1..=li + 1 {
                                    for c in si - 1..=si + 1 {
                                        if (a, c) != (li, si) {
                                            sum += at(a, c, band);
                                        }
                                    }
                                }
                                at(li, si, band) - sum / 8.0
                            })
                            .collect(),
                    );
                }
                NoiseEstimator::ShiftDifference => {
                    if li + 1 >= l || si + 1 >= s || !valid(li, si) || !valid(li + 1, si + 1) {
                        continue;
                    }
                    res.push(used.iter().map(|&band| at(li, si, band) - at(li + 1, si + 1, band)).collect());
                }
            }
        }
    }
    let (_, cn) = cov(&res);
    let cn = cn / noise.scale();
    // The paper's route: C_N = U D Uᵀ, P = U D^(-1/2), C_adj = Pᵀ C_D P = V Λ Vᵀ, T = P V.
    let en = SymmetricEigen::new(cn.clone());
    let p = &en.eigenvectors * DMatrix::from_diagonal(&en.eigenvalues.map(|d| 1.0 / d.sqrt()));
    let cadj = p.transpose() * &cd * &p;
    let ea = SymmetricEigen::new((&cadj + cadj.transpose()) * 0.5);
    let mut order: Vec<usize> = (0..u).collect();
    order.sort_by(|&i, &j| ea.eigenvalues[j].total_cmp(&ea.eigenvalues[i]));
    let t = &p * &ea.eigenvectors;
    let transform = DMatrix::from_fn(u, u, |r, c| t[(r, order[c])]);
    Reference { eigenvalues: order.iter().map(|&i| ea.eigenvalues[i]).collect(), transform, means }
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-300)
}

fn cpu_run(cube: &Cube, params: &MnfParams) -> Result<mnf::MnfOutput, MnfError> {
    mnf::run(cube, params, &CpuBackend::new(), &Monitor::silent())
}

fn check_against_reference(cube: &Cube, params: &MnfParams) {
    let out = cpu_run(cube, params).expect("pipeline runs");
    let md = &out.metadata;
    let ignore = params.ignore_value.or(cube.meta.ignore_value);
    let r = reference(cube, params.noise, params.noise_window, ignore, &md.bands_used);
    assert_eq!(md.eigenvalues.len(), r.eigenvalues.len());
    for (i, (a, b)) in md.eigenvalues.iter().zip(&r.eigenvalues).enumerate() {
        assert!(rel(*a, *b) < 1e-8, "eigenvalue {i}: {a} vs reference {b}");
    }
    for (a, b) in md.means.iter().zip(&r.means) {
        assert!(rel(*a, *b) < 1e-12, "mean {a} vs {b}");
    }
    // Columns equal up to sign (eigenvalues here are well separated).
    let u = md.bands_used.len();
    for c in 0..out.k {
        let ours: Vec<f64> = (0..u).map(|row| md.transform[row][c]).collect();
        let theirs: Vec<f64> = (0..u).map(|row| r.transform[(row, c)]).collect();
        let dot: f64 = ours.iter().zip(&theirs).map(|(a, b)| a * b).sum();
        let sign = dot.signum();
        let err: f64 = ours.iter().zip(&theirs).map(|(a, b)| (a - sign * b).powi(2)).sum::<f64>().sqrt();
        let norm: f64 = theirs.iter().map(|v| v * v).sum::<f64>().sqrt();
        assert!(err / norm < 1e-6, "component {c}: transform differs from the reference by {}", err / norm);
    }
    // The components are Tᵀ(x − μ).
    let x = cube.to_f64();
    let b = cube.bands();
    for p in (0..cube.pixels()).step_by(97) {
        let px = &x[p * b..(p + 1) * b];
        if ignore.is_some_and(|v| md.bands_used.iter().any(|&band| px[band] == v)) {
            assert!(out.components[p * out.k..(p + 1) * out.k].iter().all(|v| v.is_nan()));
            continue;
        }
        for c in 0..out.k {
            let z: f64 = md.bands_used.iter().enumerate().map(|(i, &band)| md.transform[i][c] * (px[band] - md.means[i])).sum();
            let got = out.components[p * out.k + c] as f64;
            assert!((got - z).abs() <= 1e-4 * z.abs().max(1.0), "pixel {p} component {c}: {got} vs {z}");
        }
    }
}

fn spec(lines: usize, samples: usize, bands: usize, dtype: DataType, seed: u64) -> SyntheticSpec {
    SyntheticSpec { dtype, seed, ..SyntheticSpec::small(lines, samples, bands) }
}

#[test]
fn matches_float64_reference_mean_filter() {
    let cube = generate(&spec(37, 41, 12, DataType::I16, 1));
    check_against_reference(&cube, &MnfParams { components: Some(6), ..Default::default() });
}

#[test]
fn matches_float64_reference_shift_difference_float32() {
    let cube = generate(&spec(29, 53, 9, DataType::F32, 2));
    check_against_reference(
        &cube,
        &MnfParams { components: Some(9), noise: NoiseEstimator::ShiftDifference, ..Default::default() },
    );
}

#[test]
fn matches_reference_across_chunk_boundaries() {
    // 300 samples → 27 lines per chunk: several chunks, and the halo lines matter.
    let cube = generate(&spec(70, 300, 8, DataType::U16, 3));
    check_against_reference(&cube, &MnfParams { components: Some(4), ..Default::default() });
    check_against_reference(
        &cube,
        &MnfParams { components: Some(4), noise: NoiseEstimator::ShiftDifference, ..Default::default() },
    );
}

#[test]
fn matches_reference_with_no_data_and_window() {
    let s = spec(40, 45, 10, DataType::I16, 4);
    let (cube, _) = generate_with_truth(&s);
    // Put the no-data value into scattered pixels (one band is enough to mask a pixel).
    let mut raw = cube.raw().to_vec();
    for p in (0..40 * 45).step_by(37) {
        let o = (p * 10 + (p % 10)) * 2;
        raw[o..o + 2].copy_from_slice(&(-9999i16).to_le_bytes());
    }
    let cube = Cube::from_raw(40, 45, 10, DataType::I16, hypermnf::cube::ByteOrder::Little, raw, Default::default()).unwrap();
    for noise in [NoiseEstimator::MeanFilter, NoiseEstimator::ShiftDifference] {
        let params = MnfParams {
            components: Some(5),
            noise,
            ignore_value: Some(-9999.0),
            noise_window: Some(Window { x0: 3, y0: 5, x1: 40, y1: 33 }),
            ..Default::default()
        };
        check_against_reference(&cube, &params);
        let out = cpu_run(&cube, &params).unwrap();
        let nan_pixels = (0..40 * 45).filter(|p| out.components[p * 5].is_nan()).count();
        assert_eq!(nan_pixels, (0..40 * 45).step_by(37).count());
        assert_eq!(out.metadata.pixels.masked as usize, nan_pixels);
    }
}

#[test]
fn finds_the_known_signal_subspace() {
    let mut s = spec(80, 90, 40, DataType::F32, 5);
    s.signal_dims = 4;
    let (cube, clean) = generate_with_truth(&s);
    for noise in [NoiseEstimator::MeanFilter, NoiseEstimator::ShiftDifference] {
        let out = cpu_run(&cube, &MnfParams { components: Some(4), noise, inverse: true, ..Default::default() }).unwrap();
        let ev = &out.metadata.eigenvalues;
        assert!(ev[3] > 10.0, "{noise:?}: 4th eigenvalue {} should carry signal", ev[3]);
        for (i, v) in ev[4..].iter().enumerate() {
            assert!((0.8..1.25).contains(v), "{noise:?}: eigenvalue {} = {v} should be noise-only (≈ 1)", i + 4);
        }
        // Keeping the 4 signal components removes most of the noise.
        let den = out.denoised.as_ref().unwrap();
        let x = cube.to_f64();
        let err = |a: &dyn Fn(usize) -> f64| (0..clean.len()).map(|i| (a(i) - clean[i]).powi(2)).sum::<f64>();
        let noisy = err(&|i| x[i]);
        let denoised = err(&|i| den[i] as f64);
        assert!(denoised < 0.2 * noisy, "{noise:?}: denoised error {denoised} vs noisy {noisy}");
    }
}

#[test]
fn inverse_with_all_components_is_the_identity() {
    let cube = generate(&spec(20, 24, 7, DataType::I16, 6));
    let out = cpu_run(&cube, &MnfParams { components: Some(7), inverse: true, ..Default::default() }).unwrap();
    let x = cube.to_f64();
    let den = out.denoised.unwrap();
    for (a, b) in den.iter().zip(&x) {
        assert!((*a as f64 - b).abs() < 1e-2, "{a} vs {b}");
    }
}

#[test]
fn bad_and_constant_bands_are_dropped_and_passed_through() {
    let s = spec(30, 31, 8, DataType::I16, 7);
    let cube = generate(&s);
    // Make band 5 constant.
    let mut raw = cube.raw().to_vec();
    for p in 0..30 * 31 {
        let o = (p * 8 + 5) * 2;
        raw[o..o + 2].copy_from_slice(&0i16.to_le_bytes());
    }
    let meta = hypermnf::cube::CubeMeta { bbl: Some(vec![true, false, true, true, true, true, true, true]), ..Default::default() };
    let cube = Cube::from_raw(30, 31, 8, DataType::I16, hypermnf::cube::ByteOrder::Little, raw, meta).unwrap();
    let params = MnfParams { components: Some(3), bad_bands: vec![6], inverse: true, ..Default::default() };
    let out = cpu_run(&cube, &params).unwrap();
    let md = &out.metadata;
    assert_eq!(md.bands_used, vec![0, 2, 3, 4, 7]);
    let dropped: Vec<(usize, DropReason)> = md.dropped_bands.iter().map(|d| (d.band, d.reason)).collect();
    assert_eq!(dropped, vec![(1, DropReason::BadBandList), (5, DropReason::Constant), (6, DropReason::User)]);
    assert_eq!(md.transform.len(), 5);
    assert_eq!(md.eigenvalues.len(), 5);
    check_against_reference(&cube, &params);
    // Dropped bands pass through the inverse unchanged.
    let x = cube.to_f64();
    let den = out.denoised.unwrap();
    for p in 0..30 * 31 {
        for band in [1, 5, 6] {
            assert_eq!(den[p * 8 + band] as f64, x[p * 8 + band]);
        }
    }
}

#[test]
fn results_are_bit_identical_between_runs() {
    let cube = generate(&spec(90, 200, 16, DataType::I16, 8));
    let p = MnfParams { components: Some(5), ..Default::default() };
    let a = cpu_run(&cube, &p).unwrap();
    let b = cpu_run(&cube, &p).unwrap();
    assert_eq!(a.metadata.eigenvalues, b.metadata.eigenvalues);
    assert!(a.components.iter().zip(&b.components).all(|(x, y)| x.to_bits() == y.to_bits()));
}

#[test]
fn choice_of_k_by_snr() {
    let mut s = spec(50, 50, 20, DataType::F32, 9);
    s.signal_dims = 3;
    let cube = generate(&s);
    let out = cpu_run(&cube, &MnfParams { snr: Some(5.0), ..Default::default() }).unwrap();
    let want = out.metadata.eigenvalues.iter().filter(|&&l| l >= 6.0).count();
    assert_eq!(out.k, want);
    assert_eq!(out.k, 3);
    let err = cpu_run(&cube, &MnfParams { snr: Some(1e12), ..Default::default() }).unwrap_err();
    assert!(matches!(err, MnfError::InvalidParams(ref m) if m.contains("SNR")), "{err}");
}

#[test]
fn degenerate_inputs_are_clear_errors() {
    let one_line = generate(&spec(1, 30, 5, DataType::I16, 10));
    let err = cpu_run(&one_line, &MnfParams::default()).unwrap_err();
    assert!(matches!(err, MnfError::Degenerate(ref m) if m.contains("noise")), "{err}");
    let two_lines = generate(&spec(2, 30, 5, DataType::I16, 10));
    assert!(matches!(cpu_run(&two_lines, &MnfParams::default()), Err(MnfError::Degenerate(_))));
    let sd = MnfParams { noise: NoiseEstimator::ShiftDifference, components: Some(2), ..Default::default() };
    cpu_run(&generate(&spec(3, 40, 5, DataType::I16, 10)), &sd).expect("three lines suffice for differences");
    let cube = generate(&spec(10, 10, 5, DataType::I16, 11));
    for bad in [
        MnfParams { components: Some(6), ..Default::default() },
        MnfParams { components: Some(0), ..Default::default() },
        MnfParams { components: Some(2), snr: Some(1.0), ..Default::default() },
        MnfParams { bad_bands: vec![5], ..Default::default() },
        MnfParams { noise_window: Some(Window { x0: 5, y0: 0, x1: 5, y1: 3 }), ..Default::default() },
        MnfParams { noise_window: Some(Window { x0: 0, y0: 0, x1: 11, y1: 3 }), ..Default::default() },
    ] {
        assert!(matches!(cpu_run(&cube, &bad), Err(MnfError::InvalidParams(_))), "{bad:?} should be refused");
    }
    // Every pixel no-data: band 0 holds the ignore value everywhere.
    let mut vals: Vec<f32> = (0..10 * 10 * 5).map(|i| (i * 7 % 13) as f32 + 0.5).collect();
    for p in 0..100 {
        vals[p * 5] = -1.0;
    }
    let all_masked = Cube::from_f32(10, 10, 5, &vals).unwrap();
    let err = cpu_run(&all_masked, &MnfParams { ignore_value: Some(-1.0), ..Default::default() }).unwrap_err();
    assert!(matches!(err, MnfError::Degenerate(ref m) if m.contains("valid pixel")), "{err}");
}
