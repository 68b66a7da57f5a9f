//! The library API on ndarray (`hypermnf::Mnf`) against what `hypermnf run` and the CPU pipeline give
//! on the real cubes in tests/data (bit for bit: it runs the same pipeline), views of every layout
//! against the contiguous one, `transform` and `inverse` against the CLI and a per-pixel computation,
//! the eigenvalues against an independent nalgebra float64 reference, and every error it can return.

use std::path::{Path, PathBuf};
use std::process::Command;

use hypermnf::backend::cpu::CpuBackend;
use hypermnf::cube::synthetic::{generate, SyntheticSpec};
use hypermnf::cube::{self, Cube, DataType};
use hypermnf::library::{cube_to_array, DropReason, Error, Sample};
use hypermnf::mnf::{self, MnfOutput, MnfParams, Monitor};
use hypermnf::{Backend, Mnf, MnfFit, NoiseEstimator, Window};
use ndarray::{s, Array3, ArrayView3, ShapeBuilder};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

/// A real cube, read with the crate's ENVI reader.
fn real(name: &str) -> Cube {
    cube::open(&data(name)).unwrap()
}

const REAL_CUBES: [&str; 3] = ["salinasA_224_bip_be.hdr", "jasper_ridge_r198_bil.hdr", "abu_beach1_cat_island_bsq.hdr"];

/// `mnf` fitted to `cube` as an ndarray of the cube's own sample type (int16 or uint16 here).
fn fit_cube(mnf: &Mnf, cube: &Cube) -> Result<MnfFit, Error> {
    match cube.dtype() {
        DataType::I16 => mnf.fit(cube_to_array::<i16>(cube)?.view()),
        DataType::U16 => mnf.fit(cube_to_array::<u16>(cube)?.view()),
        other => panic!("no test cube is {other:?}"),
    }
}

/// The CPU pipeline as `hypermnf run --backend cpu` calls it.
fn pipeline(cube: &Cube, params: &MnfParams) -> MnfOutput {
    mnf::run(cube, params, &CpuBackend::new(), &Monitor::silent()).unwrap()
}

/// f32 values as bits, so that NaN (no-data pixels) compares equal to NaN and -0 differs from 0.
fn bits<'a>(values: impl IntoIterator<Item = &'a f32>) -> Vec<u32> {
    values.into_iter().map(|v| v.to_bits()).collect()
}

fn assert_same_fit(a: &MnfFit, b: &MnfFit, what: &str) {
    assert_eq!(a.components().dim(), b.components().dim(), "{what}");
    assert!(bits(a.components()) == bits(b.components()), "{what}: components differ");
    assert_eq!(a.eigenvalues(), b.eigenvalues(), "{what}");
    assert_eq!(a.transform_matrix(), b.transform_matrix(), "{what}");
    assert_eq!(a.bands_used(), b.bands_used(), "{what}");
}

/// The fit equals the pipeline's output in every number: components bit for bit, the eigen system and
/// the metadata's view of it exactly.
fn assert_fit_is_pipeline(fit: &MnfFit, out: &MnfOutput, what: &str) {
    let md = &out.metadata;
    assert_eq!(fit.k(), out.k, "{what}");
    assert_eq!(fit.components().dim(), (md.input.lines, md.input.samples, out.k), "{what}");
    assert!(bits(fit.components()) == bits(&out.components), "{what}: components differ from the pipeline's");
    assert_eq!(fit.eigenvalues().to_vec(), md.eigenvalues, "{what}");
    assert_eq!(fit.snr().to_vec(), md.snr, "{what}");
    assert_eq!(fit.means().to_vec(), md.means, "{what}");
    assert_eq!(fit.bands_used(), &md.bands_used[..], "{what}");
    assert_eq!(fit.dropped_bands(), &md.dropped_bands[..], "{what}");
    let rows: Vec<Vec<f64>> = fit.transform_matrix().rows().into_iter().map(|r| r.to_vec()).collect();
    assert_eq!(rows, md.transform, "{what}");
    assert_eq!(fit.metadata().eigenvalues, md.eigenvalues, "{what}");
    assert_eq!(fit.backend_name(), "cpu");
}

#[test]
fn fit_equals_the_cpu_pipeline_on_every_real_cube() {
    for name in REAL_CUBES {
        let cube = real(name);
        let options = [
            (Mnf::new(), MnfParams::default()),
            (
                Mnf::new().components(7).noise(NoiseEstimator::ShiftDifference).bad_bands([0, 5]),
                MnfParams {
                    components: Some(7),
                    noise: NoiseEstimator::ShiftDifference,
                    bad_bands: vec![0, 5],
                    ..MnfParams::default()
                },
            ),
            (
                Mnf::new().snr(5.0).noise_window([10, 20, 60, 70]).inverse(true),
                MnfParams { snr: Some(5.0), noise_window: Some(Window::from([10, 20, 60, 70])), inverse: true, ..MnfParams::default() },
            ),
        ];
        for (mnf, params) in options {
            let mnf = mnf.backend(Backend::Cpu);
            let params = MnfParams { backend: hypermnf::Backend::Cpu, ..params };
            assert_eq!(mnf.params(), &params, "the builder sets the pipeline's parameters");
            let what = format!("{name} {params:?}");
            let fit = fit_cube(&mnf, &cube).unwrap();
            let out = pipeline(&cube, &params);
            assert_fit_is_pipeline(&fit, &out, &what);
            match (&out.denoised, fit.inverse()) {
                (Some(d), Ok(inv)) => assert!(bits(d) == bits(inv), "{what}: inverse differs"),
                (None, Err(Error::InverseNotRequested)) => {}
                (d, inv) => panic!("{what}: pipeline inverse {:?}, fit's {inv:?}", d.is_some()),
            }
        }
    }
}

fn hypermnf_run(args: &[&str]) {
    // HYPERMNF_BIN: where the binary is on a machine other than the one that built the tests (the GPU
    // host runs a packed copy, where CARGO_BIN_EXE_hypermnf's build path does not exist).
    let bin = std::env::var_os("HYPERMNF_BIN").map(std::path::PathBuf::from).unwrap_or_else(|| env!("CARGO_BIN_EXE_hypermnf").into());
    let out = Command::new(&bin).args(args).output().unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    assert!(out.status.success(), "hypermnf {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

/// An float32 `.npy` that `hypermnf run` wrote, as an array.
fn read_npy(path: &Path) -> Array3<f32> {
    cube_to_array::<f32>(&cube::npy::read(path).unwrap()).unwrap()
}

/// The `eigenvalues` of a metadata JSON, exactly: serde_json (without its `float_roundtrip` feature)
/// may parse a float 1 ulp off, so the numbers are taken from the text and parsed by `str::parse`.
fn metadata_eigenvalues(path: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(path).unwrap();
    let md: serde_json::Value = serde_json::from_str(&text).unwrap();
    let count = md["eigenvalues"].as_array().unwrap().len();
    let key = "\"eigenvalues\":";
    let start = text.find(key).expect("eigenvalues in the metadata") + key.len();
    let list = &text[start..];
    let list = &list[list.find('[').unwrap() + 1..list.find(']').unwrap()];
    let values: Vec<f64> = list.split(',').map(|v| v.trim().parse().unwrap()).collect();
    assert_eq!(values.len(), count);
    values
}

#[test]
fn fit_and_inverse_equal_hypermnf_run() {
    let dir = tempfile::tempdir().unwrap();
    // A no-data value that does occur: one sample of the scene, so some pixels are NaN in the outputs.
    let jasper = real("jasper_ridge_r198_bil.hdr");
    let ignore = f64::from(cube_to_array::<u16>(&jasper).unwrap()[[10, 10, 3]]);
    let ignore_arg = ignore.to_string();
    let cases: [(&str, Vec<&str>, Mnf); 2] = [
        (
            "salinasA_224_bip_be.hdr",
            vec!["--noise", "shift-difference", "--components", "6", "--bad-bands", "0,1,2"],
            Mnf::new().noise(NoiseEstimator::ShiftDifference).components(6).bad_bands([0, 1, 2]),
        ),
        (
            "jasper_ridge_r198_bil.hdr",
            vec!["--snr", "3", "--ignore-value", &ignore_arg, "--noise-window", "5,5,95,60"],
            Mnf::new().snr(3.0).ignore_value(ignore).noise_window([5, 5, 95, 60]),
        ),
    ];
    for (i, (name, options, mnf)) in cases.into_iter().enumerate() {
        let out = dir.path().join(format!("out{i}.npy"));
        let input = data(name);
        let mut args = vec!["run", input.to_str().unwrap(), "--backend", "cpu", "--inverse", "--out", out.to_str().unwrap()];
        args.extend(options);
        hypermnf_run(&args);
        let fit = fit_cube(&mnf.backend(Backend::Cpu).inverse(true), &real(name)).unwrap();
        let cli = read_npy(&out);
        assert_eq!(cli.dim(), fit.components().dim(), "{name}");
        assert!(bits(&cli) == bits(fit.components()), "{name}: components differ from hypermnf run's");
        let denoised = read_npy(&dir.path().join(format!("out{i}-denoised.npy")));
        assert!(bits(&denoised) == bits(fit.inverse().unwrap()), "{name}: inverse differs from hypermnf run --inverse");
        assert_eq!(metadata_eigenvalues(&dir.path().join(format!("out{i}.json"))), fit.eigenvalues().to_vec(), "{name}");
        if name.starts_with("jasper") {
            assert!(fit.components().iter().any(|v| v.is_nan()), "the no-data pixels are NaN");
            assert!(fit.metadata().pixels.masked > 0);
        }
    }
}

#[test]
fn a_view_of_any_layout_gives_the_same_fit_as_the_contiguous_one() {
    let cube = real("abu_beach1_cat_island_bsq.hdr");
    let a: Array3<i16> = cube_to_array(&cube).unwrap();
    let (l, s, b) = a.dim();
    let mnf = Mnf::new().components(8).backend(Backend::Cpu).inverse(true);
    let reference = mnf.fit(a.view()).unwrap();

    // Band-sequential memory, as the ENVI file holds it, seen as (lines, samples, bands).
    let bsq = a.view().permuted_axes([2, 0, 1]).as_standard_layout().into_owned();
    let permuted = bsq.view().permuted_axes([1, 2, 0]);
    // A window of a larger array: every line skips samples and bands.
    let mut padded = Array3::<i16>::zeros((l, s + 3, b + 2));
    padded.slice_mut(s![.., 1..s + 1, 2..]).assign(&a);
    let sliced = padded.slice(s![.., 1..s + 1, 2..]);
    // Fortran order.
    let fortran = {
        let mut f = Array3::<i16>::zeros((l, s, b).f());
        f.assign(&a);
        f
    };
    let views: [(&str, ArrayView3<i16>); 3] = [("permuted", permuted), ("sliced", sliced), ("fortran", fortran.view())];
    for (what, view) in views {
        assert!(!view.is_standard_layout(), "{what} must take the copying path");
        assert_eq!(view, a.view());
        let fit = mnf.fit(view).unwrap();
        assert_same_fit(&fit, &reference, what);
        assert!(bits(fit.inverse().unwrap()) == bits(reference.inverse().unwrap()), "{what}: inverse");
    }

    // Reversed lines: a negative stride, against the same values laid out contiguously.
    let reversed = a.slice(s![..;-1, .., ..]);
    let contiguous = reversed.as_standard_layout().into_owned();
    assert!(!reversed.is_standard_layout() && contiguous.is_standard_layout());
    assert_same_fit(&mnf.fit(reversed).unwrap(), &mnf.fit(contiguous.view()).unwrap(), "reversed");
}

#[test]
fn transform_of_the_fitted_cube_equals_its_components() {
    let jasper = real("jasper_ridge_r198_bil.hdr");
    let a: Array3<u16> = cube_to_array(&jasper).unwrap();
    // With no-data pixels (NaN in both) and bad bands, which transform applies as fit did.
    let ignore = f64::from(a[[40, 40, 7]]);
    let mnf = Mnf::new().components(9).bad_bands([3, 4]).ignore_value(ignore).backend(Backend::Cpu).inverse(true);
    let fit = mnf.fit(a.view()).unwrap();
    let z = fit.transform(a.view()).unwrap();
    assert!(bits(&z) == bits(fit.components()), "transform(fitted cube) differs from the components");
    assert!(z.iter().any(|v| v.is_nan()));
    // denoise() of the fitted cube is the inverse computed during fit.
    assert!(bits(&fit.denoise(a.view()).unwrap()) == bits(fit.inverse().unwrap()), "denoise differs from inverse");
    // A non-contiguous view of it too.
    let bsq = a.view().permuted_axes([2, 0, 1]).as_standard_layout().into_owned();
    let permuted = bsq.view().permuted_axes([1, 2, 0]);
    assert!(bits(&fit.transform(permuted).unwrap()) == bits(fit.components()));
}

#[test]
fn transform_of_another_cube_is_the_fitted_projection_per_pixel() {
    // Two scenes with the same spectra (the same seed gives them) and different abundances and noise.
    let spec = SyntheticSpec::small(40, 36, 24);
    let first: Array3<i16> = cube_to_array(&generate(&spec)).unwrap();
    let second: Array3<i16> = cube_to_array(&generate(&SyntheticSpec { lines: 31, samples: 29, ..spec })).unwrap();
    let fit = Mnf::new().components(5).backend(Backend::Cpu).fit(first.view()).unwrap();
    // As f32 samples: the sample type of the other cube need not be the fitted one's.
    let second_f32 = second.mapv(f32::from);
    let z = fit.transform(second_f32.view()).unwrap();
    assert_eq!(z.dim(), (31, 29, 5));
    assert!(bits(&z) == bits(&fit.transform(second.view()).unwrap()), "int16 and float32 of the same values");
    // z = Tᵀ (x − μ) per pixel, in float64 here.
    let (t, mu, used) = (fit.transform_matrix(), fit.means(), fit.bands_used());
    let scale = z.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
    for l in 0..31 {
        for smp in 0..29 {
            for c in 0..5 {
                let want: f64 = used.iter().enumerate().map(|(j, &band)| t[[j, c]] * (f64::from(second[[l, smp, band]]) - mu[j])).sum();
                let got = f64::from(z[[l, smp, c]]);
                assert!((got - want).abs() <= 1e-6 * scale, "pixel ({l}, {smp}) component {c}: {got} vs {want}");
            }
        }
    }
}

/// Eigenvalues of C_D w = λ C_N w from covariances formed with naive loops and solved with nalgebra,
/// independently of the crate (shift-difference noise, no no-data).
fn nalgebra_eigenvalues(x: &Array3<i16>, used: &[usize]) -> Vec<f64> {
    use nalgebra::{DMatrix, SymmetricEigen};
    let (l, s, _) = x.dim();
    let u = used.len();
    let cov = |rows: &[Vec<f64>]| {
        let n = rows.len() as f64;
        let mean: Vec<f64> = (0..u).map(|j| rows.iter().map(|r| r[j]).sum::<f64>() / n).collect();
        DMatrix::from_fn(u, u, |i, j| rows.iter().map(|r| (r[i] - mean[i]) * (r[j] - mean[j])).sum::<f64>() / (n - 1.0))
    };
    let pixels: Vec<Vec<f64>> =
        (0..l).flat_map(|li| (0..s).map(move |si| (li, si))).map(|(li, si)| used.iter().map(|&b| f64::from(x[[li, si, b]])).collect()).collect();
    let residuals: Vec<Vec<f64>> = (0..l - 1)
        .flat_map(|li| (0..s - 1).map(move |si| (li, si)))
        .map(|(li, si)| used.iter().map(|&b| f64::from(x[[li, si, b]]) - f64::from(x[[li + 1, si + 1, b]])).collect())
        .collect();
    let (cd, cn) = (cov(&pixels), cov(&residuals) / 2.0);
    let linv = cn.cholesky().expect("C_N positive definite").l().try_inverse().unwrap();
    let a = &linv * cd * linv.transpose();
    let mut ev: Vec<f64> = SymmetricEigen::new((&a + a.transpose()) * 0.5).eigenvalues.iter().copied().collect();
    ev.sort_by(|p, q| q.total_cmp(p));
    ev
}

#[test]
fn eigenvalues_match_an_independent_nalgebra_reference_on_a_real_cube() {
    let x: Array3<i16> = cube_to_array(&real("salinasA_224_bip_be.hdr")).unwrap();
    let fit = Mnf::new().noise(NoiseEstimator::ShiftDifference).backend(Backend::Cpu).fit(x.view()).unwrap();
    let reference = nalgebra_eigenvalues(&x, fit.bands_used());
    assert_eq!(reference.len(), fit.eigenvalues().len());
    let largest = reference[0];
    for (i, (ours, theirs)) in fit.eigenvalues().iter().zip(&reference).enumerate() {
        assert!((ours - theirs).abs() <= 1e-8 * largest, "eigenvalue {i}: {ours} vs nalgebra {theirs}");
    }
}

#[test]
fn every_sample_type_gives_the_same_fit() {
    // Values in 0..=255, so that every type holds them exactly.
    let spec = SyntheticSpec { noise_sigma: 3.0, amplitude: 40.0, offset: 128.0, ..SyntheticSpec::small(20, 22, 10) };
    let base: Array3<u8> = cube_to_array(&generate(&SyntheticSpec { dtype: DataType::U8, ..spec })).unwrap();
    let mnf = Mnf::new().components(4).backend(Backend::Cpu);
    let reference = mnf.fit(base.view()).unwrap();
    fn check<T: Sample>(mnf: &Mnf, reference: &MnfFit, values: Array3<T>) {
        let fit = mnf.fit(values.view()).unwrap();
        assert_same_fit(&fit, reference, std::any::type_name::<T>());
    }
    check(&mnf, &reference, base.mapv(i16::from));
    check(&mnf, &reference, base.mapv(u16::from));
    check(&mnf, &reference, base.mapv(i32::from));
    check(&mnf, &reference, base.mapv(u32::from));
    check(&mnf, &reference, base.mapv(i64::from));
    check(&mnf, &reference, base.mapv(u64::from));
    check(&mnf, &reference, base.mapv(f32::from));
    check(&mnf, &reference, base.mapv(f64::from));
}

// ---- errors: each is typed, with its code, and nothing panics

fn small() -> Array3<i16> {
    cube_to_array(&generate(&SyntheticSpec::small(12, 14, 8))).unwrap()
}

fn fit_err<T: Sample>(mnf: Mnf, cube: ArrayView3<T>) -> Error {
    match mnf.backend(Backend::Cpu).fit(cube) {
        Ok(f) => panic!("expected an error, got {f:?}"),
        Err(e) => e,
    }
}

#[test]
fn a_zero_sized_axis_is_refused() {
    for shape in [(0, 4, 3), (4, 0, 3), (4, 4, 0)] {
        let e = fit_err(Mnf::new(), Array3::<f32>::zeros(shape).view());
        let (lines, samples, bands) = shape;
        assert!(matches!(e, Error::EmptyAxis { lines: l, samples: s, bands: b } if (l, s, b) == (lines, samples, bands)), "{e}");
        assert_eq!(e.code(), "empty_axis");
    }
    let fit = Mnf::new().components(2).backend(Backend::Cpu).fit(small().view()).unwrap();
    let e = fit.transform(Array3::<i16>::zeros((0, 14, 8)).view()).unwrap_err();
    assert!(matches!(e, Error::EmptyAxis { .. }), "{e}");
}

#[test]
fn too_many_components_are_refused_before_and_after_the_statistics() {
    let x = small();
    // More than the cube's bands, and more than its bands less the bad ones: before any work.
    let e = fit_err(Mnf::new().components(9), x.view());
    assert!(matches!(e, Error::TooManyComponents { requested: 9, available: 8 }), "{e}");
    assert_eq!(e.code(), "too_many_components");
    let e = fit_err(Mnf::new().components(7).bad_bands([0, 1]), x.view());
    assert!(matches!(e, Error::TooManyComponents { requested: 7, available: 6 }), "{e}");
    // More than the bands left once the constant ones are found: band 3 constant leaves 7.
    let mut with_constant = x.clone();
    with_constant.slice_mut(s![.., .., 3]).fill(900);
    let fit = Mnf::new().components(7).backend(Backend::Cpu).fit(with_constant.view()).unwrap();
    assert_eq!(fit.bands_used(), &[0, 1, 2, 4, 5, 6, 7]);
    assert_eq!(fit.dropped_bands()[0].reason, DropReason::Constant);
    let e = fit_err(Mnf::new().components(8), with_constant.view());
    assert!(matches!(e, Error::TooManyComponents { requested: 8, available: 7 }), "{e}");
}

#[test]
fn invalid_options_are_refused() {
    let x = small();
    let cases: Vec<(Mnf, &str)> = vec![
        (Mnf::new().components(0), "at least 1"),
        (Mnf::new().components(3).snr(2.0), "not both"),
        (Mnf::new().snr(-1.0), "snr"),
        (Mnf::new().snr(f64::NAN), "snr"),
        (Mnf::new().bad_bands([8]), "bad band 8"),
        (Mnf::new().noise_window([0, 0, 15, 5]), "noise window"),
        (Mnf::new().noise_window([3, 3, 3, 6]), "noise window"),
        (Mnf::new().bad_bands(0..8), "every band is excluded"),
        (Mnf::new().snr(1e9), "no component has an SNR"),
    ];
    for (mnf, needle) in cases {
        let e = fit_err(mnf.clone(), x.view());
        assert!(matches!(e, Error::InvalidOptions(_)), "{mnf:?}: {e}");
        assert!(e.to_string().contains(needle), "{mnf:?}: {e} should say {needle:?}");
        assert_eq!(e.code(), "invalid_params");
    }
}

#[test]
fn cubes_that_cannot_give_an_mnf_are_refused() {
    let x = small();
    let constant = Array3::<f32>::from_elem((6, 6, 4), 5.0);
    let one_line = x.slice(s![..1, .., ..]).to_owned();
    let two_by_two = x.slice(s![..2, ..2, ..]).to_owned();
    // Every pixel no-data.
    let mut nodata = x.clone();
    nodata.slice_mut(s![.., .., 0]).fill(-1);
    let errors = [
        (fit_err(Mnf::new(), constant.view()), "constant"),
        (fit_err(Mnf::new().noise(NoiseEstimator::ShiftDifference), one_line.view()), "shift-difference"),
        (fit_err(Mnf::new(), two_by_two.view()), "mean-filter"),
        (fit_err(Mnf::new().ignore_value(-1.0), nodata.view()), "no-data"),
    ];
    for (e, needle) in errors {
        assert!(matches!(e, Error::Degenerate(_)), "{e}");
        assert!(e.to_string().contains(needle), "{e} should say {needle:?}");
        assert_eq!(e.code(), "degenerate_input");
    }
}

/// NaN and ±Inf are no-data in float cubes: the fit equals the fit of the same cube with an ignore
/// value there, bit for bit, and the pixel's components are NaN. In a bad band the sample is not
/// looked at, and the fit is the one without it.
#[test]
fn a_non_finite_sample_is_no_data() {
    let x = small().mapv(f32::from);
    let mut filled = x.clone();
    filled[[3, 4, 2]] = -9999.0;
    let explicit = Mnf::new().components(3).ignore_value(-9999.0).backend(Backend::Cpu).fit(filled.view()).unwrap();
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut with_bad = x.clone();
        with_bad[[3, 4, 2]] = bad;
        let fit = Mnf::new().components(3).backend(Backend::Cpu).fit(with_bad.view()).unwrap();
        assert_same_fit(&fit, &explicit, &format!("{bad} as no-data"));
        assert!(fit.components().slice(s![3, 4, ..]).iter().all(|v| v.is_nan()), "{bad}");
        assert_eq!(fit.metadata().pixels.masked, 1, "{bad}");
        let skip_band = |c: &Array3<f32>| Mnf::new().components(3).bad_bands([2]).backend(Backend::Cpu).fit(c.view()).unwrap();
        assert_same_fit(&skip_band(&with_bad), &skip_band(&x), "NaN in a bad band");
    }
    // transform() projects pixel by pixel: only that pixel is NaN.
    let fit = Mnf::new().components(3).backend(Backend::Cpu).fit(x.view()).unwrap();
    let mut with_nan = x.clone();
    with_nan[[3, 4, 2]] = f32::NAN;
    let z = fit.transform(with_nan.view()).unwrap();
    assert!(z.slice(s![3, 4, ..]).iter().all(|v| v.is_nan()));
    assert_eq!(z.iter().filter(|v| v.is_nan()).count(), 3);
}

#[test]
fn a_fit_and_its_error_can_cross_threads() {
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<MnfFit>();
    send_sync::<Mnf>();
    send_sync::<Error>();
    // std::error::Error, so that `?` into Box<dyn Error> and anyhow works.
    let e: Box<dyn std::error::Error + Send + Sync> = Box::new(Error::InverseNotRequested);
    assert!(e.to_string().contains("inverse(true)"));
}

#[test]
fn misuse_of_a_fit_is_refused() {
    let x = small();
    let fit = Mnf::new().components(3).backend(Backend::Cpu).fit(x.view()).unwrap();
    let e = fit.inverse().unwrap_err();
    assert!(matches!(e, Error::InverseNotRequested), "{e}");
    assert_eq!(e.code(), "inverse_not_requested");
    let other_bands = x.slice(s![.., .., ..7]);
    for e in [fit.transform(other_bands).unwrap_err(), fit.denoise(other_bands).unwrap_err()] {
        assert!(matches!(e, Error::BandCountMismatch { expected: 8, got: 7 }), "{e}");
        assert_eq!(e.code(), "band_count_mismatch");
    }
    let e = cube_to_array::<f32>(&generate(&SyntheticSpec::small(3, 3, 3))).unwrap_err();
    assert!(matches!(e, Error::DataTypeMismatch { expected: DataType::F32, got: DataType::I16 }), "{e}");
}

#[test]
fn the_cuda_backend_fits_where_there_is_a_device_and_is_a_typed_error_elsewhere() {
    let x = small();
    let result = Mnf::new().components(3).backend(Backend::Cuda).fit(x.view());
    match hypermnf::backend::cuda::CudaBackend::new(hypermnf::backend::cuda::Route::Kernels) {
        Ok(_) => {
            let fit = result.unwrap();
            assert_eq!(fit.backend_name(), "cuda");
            let cpu = Mnf::new().components(3).backend(Backend::Cpu).fit(x.view()).unwrap();
            // The tolerance of the GPU tests (tests/common/gpu.rs) for the leading eigenvalues (the GPU
            // forms the covariances from float32 samples).
            assert_eq!(fit.bands_used(), cpu.bands_used());
            for (g, c) in fit.eigenvalues().iter().zip(cpu.eigenvalues()).take(fit.k()) {
                assert!((g - c).abs() <= 1e-4 * c.abs(), "eigenvalue {g} on CUDA vs {c} on the CPU");
            }
        }
        Err(_) => {
            let e = result.unwrap_err();
            assert!(matches!(e, Error::Backend(hypermnf::backend::BackendError::Unavailable(_))), "{e}");
            assert_eq!(e.code(), "backend_unavailable");
            // Auto falls back to the CPU.
            let fit = Mnf::new().components(3).backend(Backend::Auto).fit(x.view()).unwrap();
            assert_eq!(fit.backend_name(), "cpu");
        }
    }
}

/// The README's Rust example is the crate's doc example (src/lib.rs, which `cargo test --doc` compiles
/// and runs), less the hidden `# ` lines: so the README's code is tested too.
#[test]
fn the_readme_example_is_the_tested_crate_doc_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let section = &readme[readme.find("### As a Rust library").expect("the README's library section")..];
    let start = section.find("```rust\n").expect("a rust block") + "```rust\n".len();
    let readme_code = &section[start..start + section[start..].find("```").unwrap()];
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let doc: Vec<&str> = lib.lines().take_while(|l| l.starts_with("//!")).map(|l| l.trim_start_matches("//!").strip_prefix(' ').unwrap_or("")).collect();
    let open = doc.iter().position(|l| *l == "```").expect("a doc example");
    let close = open + 1 + doc[open + 1..].iter().position(|l| *l == "```").unwrap();
    let doc_code: String = doc[open + 1..close].iter().filter(|l| !l.starts_with("# ")).map(|l| format!("{l}\n")).collect();
    assert_eq!(readme_code, doc_code, "README.md's example and src/lib.rs's doc example differ");
}
