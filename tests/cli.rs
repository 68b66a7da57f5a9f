//! `hypermnf run` as users and automated checks call it: outputs, metadata fields, the same answer from
//! every input format, and clear failures.

use std::path::{Path, PathBuf};
use std::process::Command;

use hypermnf::cube::{self, npy, ByteOrder, Interleave};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn hypermnf(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hypermnf")).args(args).output().expect("hypermnf runs")
}

fn run_ok(args: &[&str]) -> String {
    let out = hypermnf(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "hypermnf {args:?} failed:\n{stderr}");
    stderr
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn npy_output_and_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("result.npy");
    let stderr = run_ok(&[
        "run",
        data("jasper_ridge_r198_bil.hdr").to_str().unwrap(),
        "--components",
        "7",
        "--backend",
        "cpu",
        "--bad-bands",
        "0,5",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(stderr.contains("statistics"), "progress goes to stderr: {stderr}");
    let z = npy::read(&out).unwrap();
    assert_eq!((z.lines(), z.samples(), z.bands()), (100, 100, 7));
    assert_eq!(z.dtype(), cube::DataType::F32);
    let md = json(&dir.path().join("result.json"));
    for key in ["eigenvalues", "snr", "components", "bands_used", "dropped_bands", "noise", "transform", "means", "backend", "timings_ms"] {
        assert!(md.get(key).is_some(), "metadata lacks {key}");
    }
    assert_eq!(md["components"], 7);
    assert_eq!(md["backend"], "cpu");
    assert_eq!(md["eigenvalues"].as_array().unwrap().len(), 196);
    assert_eq!(md["bands_used"].as_array().unwrap().len(), 196);
    assert_eq!(md["bands_used"][0], 1);
    assert_eq!(md["dropped_bands"][0]["band"], 0);
    assert_eq!(md["dropped_bands"][0]["reason"], "user");
    assert_eq!(md["transform"].as_array().unwrap().len(), 196);
    assert_eq!(md["transform"][0].as_array().unwrap().len(), 7);
    assert_eq!(md["noise"]["estimator"], "mean-filter");
    assert_eq!(md["noise"]["scale"], 1.125);
    let ev: Vec<f64> = md["eigenvalues"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert!(ev.windows(2).all(|p| p[0] >= p[1]), "eigenvalues descending");
    for stage in ["read", "statistics", "eigen", "projection", "write"] {
        assert!(md["timings_ms"].get(stage).is_some(), "timings_ms lacks {stage}");
    }
}

#[test]
fn envi_output_inverse_and_snr() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mnf.hdr");
    run_ok(&[
        "run",
        data("salinasA_224_bip_be.hdr").to_str().unwrap(),
        "--snr",
        "5",
        "--inverse",
        "--backend",
        "cpu",
        "--out",
        out.to_str().unwrap(),
    ]);
    let md = json(&dir.path().join("mnf.json"));
    let k = md["components"].as_u64().unwrap() as usize;
    let ev: Vec<f64> = md["eigenvalues"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(k, ev.iter().filter(|&&l| l >= 6.0).count());
    assert!(k >= 1);
    let z = cube::open(&out).unwrap();
    assert_eq!((z.lines(), z.samples(), z.bands()), (83, 86, k));
    let header = std::fs::read_to_string(&out).unwrap().to_lowercase();
    assert!(header.contains("mnf 1"), "band names: {header}");
    assert!(header.contains("eigenvalues"), "eigenvalues in the header: {header}");
    let den = cube::open(&dir.path().join("mnf-denoised.hdr")).unwrap();
    assert_eq!((den.lines(), den.samples(), den.bands()), (83, 86, 224));
    // The denoised cube is close to the input (it removes only low-SNR components).
    let (x, y) = (cube::open(&data("salinasA_224_bip_be.hdr")).unwrap().to_f64(), den.to_f64());
    let num: f64 = x.iter().zip(&y).map(|(a, b)| (a - b).powi(2)).sum();
    let den_norm: f64 = x.iter().map(|a| a * a).sum();
    assert!((num / den_norm).sqrt() < 0.05, "denoised differs from input by {}", (num / den_norm).sqrt());
}

#[test]
fn every_input_format_gives_the_same_components() {
    let dir = tempfile::tempdir().unwrap();
    let source = cube::open(&data("abu_beach1_cat_island_bsq.hdr")).unwrap();
    let run = |input: &Path, name: &str| -> Vec<u8> {
        let out = dir.path().join(format!("{name}.npy"));
        run_ok(&["run", input.to_str().unwrap(), "--components", "5", "--backend", "cpu", "--out", out.to_str().unwrap()]);
        std::fs::read(out).unwrap()
    };
    let reference = run(&data("abu_beach1_cat_island_bsq.hdr"), "bsq");
    let bip_be = dir.path().join("bip_be.hdr");
    hypermnf::cube::envi::write_cube(&bip_be, &source, Interleave::Bip, ByteOrder::Big).unwrap();
    assert_eq!(run(&bip_be, "bip_be"), reference, "BIP big-endian copy");
    let bil = dir.path().join("bil.hdr");
    hypermnf::cube::envi::write_cube(&bil, &source, Interleave::Bil, ByteOrder::Little).unwrap();
    assert_eq!(run(&bil, "bil"), reference, "BIL copy");
    let as_npy = dir.path().join("cube.npy");
    npy::write_cube(&as_npy, &source).unwrap();
    assert_eq!(run(&as_npy, "npy"), reference, ".npy copy");
}

#[test]
fn failures_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.npy");
    let o = out.to_str().unwrap();
    // Truncated data file.
    std::fs::copy(data("jasper_ridge_r198_bil.hdr"), dir.path().join("t.hdr")).unwrap();
    let raw = std::fs::read(data("jasper_ridge_r198_bil.img")).unwrap();
    std::fs::write(dir.path().join("t.img"), &raw[..raw.len() - 100]).unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec![dir.path().join("t.hdr").display().to_string()], "truncated"),
        (vec![data("salinasA_224_bip_be.hdr").display().to_string(), "--components".into(), "500".into()], "components"),
        (vec![data("salinasA_224_bip_be.hdr").display().to_string(), "--noise-window".into(), "0,0,999,5".into()], "noise window"),
        (vec![data("salinasA_224_bip_be.hdr").display().to_string(), "--noise".into(), "median".into()], "median"),
        (vec![dir.path().join("missing.hdr").display().to_string()], "missing.hdr"),
        (vec![data("README.md").display().to_string()], ".hdr"),
    ];
    for (mut args, needle) in cases {
        let mut full = vec!["run".to_string()];
        full.append(&mut args);
        full.extend(["--backend".into(), "cpu".into(), "--out".into(), o.into()]);
        let r = hypermnf(&full.iter().map(String::as_str).collect::<Vec<_>>());
        let stderr = String::from_utf8_lossy(&r.stderr);
        assert!(!r.status.success(), "{full:?} should fail");
        assert!(!stderr.contains("panicked"), "{full:?} panicked: {stderr}");
        assert!(stderr.to_lowercase().contains(&needle.to_lowercase()), "{full:?}: message should name {needle:?}: {stderr}");
    }
    assert!(!out.exists(), "no output written on failure");
}

/// `--devices`: a malformed list is refused before anything runs, on any machine; on a machine
/// without a GPU a well-formed list is ignored (the CPU runs) and the result is the CPU's.
#[test]
fn device_lists_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.npy");
    let input = data("salinasA_224_bip_be.hdr");
    for (list, needle) in [("x", "not a device ordinal"), ("0,0", "listed twice"), ("", "empty"), ("1,", "empty entry")] {
        let r = hypermnf(&["run", input.to_str().unwrap(), "--devices", list, "--out", out.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&r.stderr);
        assert!(!r.status.success(), "--devices {list:?} should fail");
        assert!(!stderr.contains("panicked") && stderr.contains(needle), "--devices {list:?}: {stderr}");
        let r = hypermnf(&["serve", "--devices", list, "--data-dir", dir.path().join("d").to_str().unwrap()]);
        assert!(!r.status.success() && String::from_utf8_lossy(&r.stderr).contains(needle), "serve --devices {list:?}");
    }
    assert!(!out.exists());
    // SAFETY: only tries to dlopen libcuda.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        eprintln!("a CUDA driver is present: the CPU fallback is not exercised here");
        return;
    }
    let cpu = dir.path().join("cpu.npy");
    run_ok(&["run", input.to_str().unwrap(), "--backend", "cpu", "--out", cpu.to_str().unwrap()]);
    run_ok(&["run", input.to_str().unwrap(), "--devices", "3,1", "--split-cube", "--out", out.to_str().unwrap()]);
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&cpu).unwrap(), "the CPU ran, list ignored");
}
