//! Several devices: a cube split by lines (backend::split), on one device split into shares and on
//! two real devices, against one device and the CPU backend. Every test needs a CUDA device: they are
//! ignored elsewhere and run on the GPU host with `--include-ignored` (see .gpu/run).

/// The GPU suites' helpers (`common::gpu`).
mod common;

use std::sync::Arc;

use common::gpu::*;
use hypermnf::backend::cpu::CpuBackend;
use hypermnf::backend::cuda::{CudaBackend, Route};
use hypermnf::backend::devices::{select_devices, DeviceSelection};
use hypermnf::backend::split::{SplitBackend, SplitCube, SplitMode};
use hypermnf::backend::Backend;
use hypermnf::cube::synthetic::{self, SyntheticSpec};
use hypermnf::cube::{ByteOrder, Cube, DataType};
use hypermnf::mnf::stats::{Moments, StatsSpec};
use hypermnf::mnf::{self, BackendChoice, MnfParams, Monitor, Window};
use rand::{Rng, SeedableRng};

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
            for noise in ESTIMATORS {
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
    let cube = synthetic_cube(&mut rng, 120, 64, 48);
    let dev: Arc<dyn Backend> = Arc::new(gpu(Route::Kernels));
    let split = SplitBackend::new(vec![dev.clone(), dev.clone()], SplitMode::Always).unwrap();
    for noise in ESTIMATORS {
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
        for noise in ESTIMATORS {
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

/// The split's streamed projection (what a job's writer gets: each device's download chunks as they
/// land, handed over on the caller's thread) gives every value once, bit for bit the unstreamed
/// projection's: on device 0 twice (any host) and on devices 0 and 1 where there are two.
#[test]
#[ignore = "needs a CUDA device"]
fn a_streamed_split_projection_equals_the_unstreamed_one() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let cube = random_cube(&mut rng, 301, 211, 64, DataType::F32, ByteOrder::Little);
    let d0: Arc<dyn Backend> = Arc::new(CudaBackend::on_device(0, Route::Kernels).unwrap());
    let mut pairs = vec![("device 0 twice", vec![d0.clone(), d0.clone()])];
    let n = hypermnf::backend::cuda::device_count().expect("a driver");
    if n >= 2 {
        pairs.push(("devices 0 and 1", vec![d0.clone(), Arc::new(CudaBackend::on_device(1, Route::Kernels).unwrap())]));
    } else {
        eprintln!("a_streamed_split_projection_equals_the_unstreamed_one: one device, so only device 0 twice");
    }
    let params = MnfParams { components: Some(7), ..Default::default() };
    for (what, parts) in pairs {
        let split = SplitBackend::new(parts, SplitMode::Always).unwrap();
        let system = mnf::pipeline::analyse(&cube, &params, &split, &Monitor::silent()).unwrap();
        let projection = mnf::pipeline::projection_of(&cube, &params, &system).unwrap();
        let len = cube.pixels() * projection.k;
        let mut prepared = split.prepare(&cube, &Monitor::silent()).unwrap();
        let mut whole = vec![0f32; len];
        prepared.project(&projection, &mut whole, &Monitor::silent()).unwrap();
        let (mut streamed, mut seen, mut runs) = (vec![f32::NAN; len], vec![0u8; len], 0usize);
        let mut scratch = vec![0f32; len];
        prepared
            .project_streamed(
                &projection,
                &mut scratch,
                &mut |first, values| {
                    runs += 1;
                    for (i, &v) in values.iter().enumerate() {
                        streamed[first + i] = v;
                        seen[first + i] += 1;
                    }
                    Ok(())
                },
                &Monitor::silent(),
            )
            .unwrap();
        eprintln!("{what}: {runs} runs handed over for {len} values");
        assert!(seen.iter().all(|&s| s == 1), "{what}: every value once");
        assert!(runs >= 2, "{what}: each device hands its own runs");
        let differ = whole.iter().zip(&streamed).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "{what}: {differ} values differ from the unstreamed projection");
    }
}
