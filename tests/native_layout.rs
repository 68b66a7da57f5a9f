//! ENVI files mapped in the layout they are stored in (`cube::map`, `envi::map`): a BIL or BSQ cube is
//! never transposed on the host, and everything computed from it is what the same cube read into BIP
//! gives, bit for bit: samples, pixels and blocks of lines, the content digest, and the MNF on the CPU
//! here and on the GPU (the `#[ignore]`d tests, run on the GPU host with `--include-ignored`). A
//! flight-line-shaped cube through `hypermnf run` keeps its anonymous memory far below its size.

use std::path::{Path, PathBuf};

use hypermnf::backend::cpu::CpuBackend;
use hypermnf::cube::{envi, ByteOrder, Cube, CubeMeta, DataType, Interleave};
use hypermnf::mnf::{self, MnfOutput, MnfParams, Monitor, NoiseEstimator};
use rand::{Rng, SeedableRng};

mod common;

const LAYOUTS: [Interleave; 3] = [Interleave::Bil, Interleave::Bsq, Interleave::Bip];
const TYPES: [DataType; 5] = [DataType::F32, DataType::I16, DataType::U16, DataType::F64, DataType::U8];
const ORDERS: [ByteOrder; 2] = [ByteOrder::Little, ByteOrder::Big];

/// A cube of `dtype` with a smooth 3-dimensional signal plus noise (values that fit every type),
/// in little-endian BIP.
fn cube(seed: u64, lines: usize, samples: usize, bands: usize, dtype: DataType) -> Cube {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let spectra: Vec<Vec<f64>> = (0..3).map(|_| (0..bands).map(|_| rng.random_range(0.2..1.0)).collect()).collect();
    let mut data = Vec::with_capacity(lines * samples * bands * dtype.size());
    for l in 0..lines {
        for s in 0..samples {
            let f = [((l as f64) * 0.3).sin() * 40.0, ((s as f64) * 0.23).cos() * 30.0, ((l + 2 * s) as f64 * 0.07).sin() * 20.0];
            for b in 0..bands {
                let v = 120.0 + f.iter().zip(&spectra).map(|(x, sp)| x * sp[b]).sum::<f64>() + rng.random_range(-3.0..3.0);
                match dtype {
                    DataType::F32 => data.extend_from_slice(&(v as f32).to_le_bytes()),
                    DataType::F64 => data.extend_from_slice(&v.to_le_bytes()),
                    DataType::I16 => data.extend_from_slice(&(v.round() as i16).to_le_bytes()),
                    DataType::U16 => data.extend_from_slice(&(v.round() as u16).to_le_bytes()),
                    DataType::U8 => data.push(v.round().clamp(0.0, 255.0) as u8),
                    other => panic!("{other:?}"),
                }
            }
        }
    }
    Cube::from_raw(lines, samples, bands, dtype, ByteOrder::Little, data, CubeMeta::default()).unwrap()
}

/// `cube` written as an ENVI file in `layout` and `order`; its header path.
fn write(dir: &Path, cube: &Cube, layout: Interleave, order: ByteOrder) -> PathBuf {
    let hdr = dir.join(format!("c-{}-{}-{:?}.hdr", layout.name(), cube.dtype().name(), order));
    envi::write_cube(&hdr, cube, layout, order).unwrap();
    hdr
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn assert_same_output(what: &str, a: &MnfOutput, b: &MnfOutput) {
    assert_eq!(bits(&a.components), bits(&b.components), "{what}: components");
    assert_eq!(a.denoised.as_deref().map(bits), b.denoised.as_deref().map(bits), "{what}: denoised");
    let f = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(f(&a.metadata.eigenvalues), f(&b.metadata.eigenvalues), "{what}: eigenvalues");
    assert_eq!(f(&a.metadata.means), f(&b.metadata.means), "{what}: means");
}

/// Every layout x type x byte order: the mapped cube is stored as the file is, and reads as the cube
/// read into BIP does: every block of lines, every pixel, the BIP bytes, and the content digest.
#[test]
fn a_mapped_cube_reads_as_the_bip_cube_does() {
    let dir = tempfile::tempdir().unwrap();
    let (lines, samples, bands) = (13, 11, 7);
    for dtype in TYPES {
        let c = cube(1, lines, samples, bands, dtype);
        for layout in LAYOUTS {
            for order in ORDERS {
                let what = format!("{} {} {order:?}", layout.name(), dtype.name());
                let hdr = write(dir.path(), &c, layout, order);
                let read = envi::read(&hdr).unwrap();
                let mapped = envi::map(&hdr).unwrap();
                assert_eq!(mapped.storage(), layout, "{what}");
                assert_eq!(read.storage(), Interleave::Bip, "{what}");
                assert_eq!(mapped.content_digest(), read.content_digest(), "{what}: content digest");
                assert_eq!(mapped.content_digest(), c.content_digest(), "{what}: content digest of the source");
                for (first, count) in [(0, lines), (0, 1), (5, 3), (lines - 1, 1)] {
                    let mut a = vec![0.0; count * samples * bands];
                    let mut b = a.clone();
                    mapped.decode_lines_f64(first, count, &mut a);
                    read.decode_lines_f64(first, count, &mut b);
                    assert_eq!(a, b, "{what}: lines {first}+{count}");
                    let mut raw = vec![0u8; count * read.line_bytes()];
                    mapped.copy_lines_bip(first, count, &mut raw);
                    assert_eq!(raw, read.raw_lines(first, count), "{what}: BIP bytes of lines {first}+{count}");
                }
                let (mut a, mut b) = (vec![0.0; bands], vec![0.0; bands]);
                for (l, s) in [(0, 0), (12, 10), (6, 3)] {
                    mapped.decode_pixel_f64(l, s, &mut a);
                    read.decode_pixel_f64(l, s, &mut b);
                    assert_eq!(a, b, "{what}: pixel ({l}, {s})");
                }
            }
        }
    }
}

/// The MNF of a mapped BIL or BSQ cube on the CPU is the MNF of the same cube read into BIP, bit for
/// bit, with both estimators, a no-data value and the inverse.
#[test]
fn the_cpu_mnf_of_a_mapped_cube_is_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let cpu = CpuBackend::new();
    for dtype in [DataType::F32, DataType::I16] {
        let c = cube(2, 40, 33, 12, dtype);
        for layout in LAYOUTS {
            for order in ORDERS {
                let hdr = write(dir.path(), &c, layout, order);
                let (read, mapped) = (envi::read(&hdr).unwrap(), envi::map(&hdr).unwrap());
                for noise in [NoiseEstimator::MeanFilter, NoiseEstimator::ShiftDifference] {
                    let what = format!("{} {} {order:?} {}", layout.name(), dtype.name(), noise.name());
                    let params = MnfParams { components: Some(4), inverse: true, noise, ignore_value: Some(121.0), ..MnfParams::default() };
                    let a = mnf::run(&mapped, &params, &cpu, &Monitor::silent()).unwrap();
                    let b = mnf::run(&read, &params, &cpu, &Monitor::silent()).unwrap();
                    assert_same_output(&what, &a, &b);
                }
            }
        }
    }
}

/// `cube::map` maps what `cube::open` reads: ENVI in its own layout (the real AVIRIS chips in
/// tests/data are BSQ, BIL and big-endian BIP), `.npy` as it is.
#[test]
fn cube_map_opens_the_real_cubes_in_their_own_layout() {
    // tests/data of the current directory first (the GPU host runs the tests from a copy of the tree).
    let here = Path::new("tests/data");
    let data = if here.join("README.md").exists() { here.to_path_buf() } else { Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data") };
    for (name, layout) in [
        ("abu_beach1_cat_island_bsq.hdr", Interleave::Bsq),
        ("jasper_ridge_r198_bil.hdr", Interleave::Bil),
        ("salinasA_224_bip_be.hdr", Interleave::Bip),
    ] {
        let mapped = hypermnf::cube::map(&data.join(name)).unwrap();
        let read = hypermnf::cube::open(&data.join(name)).unwrap();
        assert_eq!(mapped.storage(), layout, "{name}");
        assert_eq!(mapped.meta, read.meta, "{name}");
        assert_eq!(mapped.content_digest(), read.content_digest(), "{name}");
    }
}

/// A header that does not match its data file is refused by the mapping as by the reader.
#[test]
fn a_mapped_file_is_checked_against_its_header() {
    let dir = tempfile::tempdir().unwrap();
    let hdr = write(dir.path(), &cube(3, 6, 5, 4, DataType::I16), Interleave::Bil, ByteOrder::Little);
    let img = hdr.with_extension("img");
    let bytes = std::fs::read(&img).unwrap();
    std::fs::write(&img, &bytes[..bytes.len() - 2]).unwrap();
    assert_eq!(envi::map(&hdr).unwrap_err().code(), "size_mismatch");
    std::fs::write(&img, [bytes.as_slice(), &[0, 0]].concat()).unwrap();
    assert_eq!(envi::map(&hdr).unwrap_err().code(), "size_mismatch");
    std::fs::write(&img, []).unwrap();
    assert_eq!(envi::map(&hdr).unwrap_err().code(), "size_mismatch");
}

/// The largest anonymous memory (`RssAnon`) a running process reaches, polled from /proc.
fn run_and_watch_anon(mut cmd: std::process::Command) -> (std::process::ExitStatus, u64) {
    let mut child = cmd.spawn().unwrap();
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak_kb = 0u64;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, peak_kb * 1024);
        }
        if let Ok(text) = std::fs::read_to_string(&status_file) {
            if let Some(kb) = text.lines().find_map(|l| l.strip_prefix("RssAnon:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()) {
                peak_kb = peak_kb.max(kb);
            }
        }
        assert!(std::time::Instant::now() < deadline, "hypermnf run did not finish");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A flight-line-shaped BIL cube of a few hundred MB through `hypermnf run` on the CPU: the file is
/// mapped, so the process's anonymous memory stays far below the cube's size (the components, a block
/// of lines per thread and the statistics; before, the cube was read whole into memory and transposed).
#[test]
fn hypermnf_run_of_a_bil_flight_line_holds_no_copy_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let (lines, samples, bands) = (1200, 598, 96);
    let c = cube(4, lines, samples, bands, DataType::F32);
    let hdr = write(dir.path(), &c, Interleave::Bil, ByteOrder::Little);
    drop(c);
    let size = (lines * samples * bands * 4) as u64;
    // HYPERMNF_BIN where the test binary runs away from its build (the GPU host).
    let exe = std::env::var_os("HYPERMNF_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_hypermnf")), PathBuf::from);
    let mut cmd = std::process::Command::new(exe);
    // Two threads, as on the CI machine: each holds a block of lines widened to f64, so the bound
    // below is per machine size, not per cube size (16 threads on the GPU host held 221 MB here).
    cmd.env("RAYON_NUM_THREADS", "2");
    cmd.args(["run", "--backend", "cpu", "--components", "5"])
        .arg(&hdr)
        .arg("--out")
        .arg(dir.path().join("out.npy"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let (status, peak) = run_and_watch_anon(cmd);
    assert!(status.success(), "hypermnf run failed: {status}");
    eprintln!("{size} byte BIL cube: peak anonymous memory {} MB", peak >> 20);
    assert!(peak > 0, "RssAnon was never read");
    assert!(peak < size / 2, "peak anonymous memory {peak} bytes for a {size} byte cube: a copy of the cube was made");
}

/// The GPU on mapped BIL and BSQ cubes (blocks of lines read in the file's order and reordered on the
/// device): bit-identical to the same cube read into BIP, on both routes, resident and streamed (a
/// memory budget that forces it), every type and byte order; and within the GPU suite's tolerance of
/// the CPU backend.
#[test]
#[ignore = "needs a CUDA device"]
fn the_gpu_mnf_of_a_mapped_cube_is_bit_identical() {
    use hypermnf::backend::cuda::{CudaBackend, Route};
    let dir = tempfile::tempdir().unwrap();
    let cpu = CpuBackend::new();
    for dtype in TYPES {
        let c = cube(5, 90, 71, 24, dtype);
        for route in [Route::Kernels, Route::Cublas] {
            let resident = CudaBackend::new(route).unwrap_or_else(|e| panic!("CUDA backend {route:?}: {e}"));
            let streamed = CudaBackend::new(route).unwrap().with_memory_budget(c.raw().len() / 5);
            for (how, gpu) in [("resident", &resident), ("streamed", &streamed)] {
                for layout in LAYOUTS {
                    for order in ORDERS {
                        let what = format!("{route:?} {how} {} {} {order:?}", layout.name(), dtype.name());
                        let hdr = write(dir.path(), &c, layout, order);
                        let (read, mapped) = (envi::read(&hdr).unwrap(), envi::map(&hdr).unwrap());
                        let params = MnfParams { components: Some(5), inverse: true, ..MnfParams::default() };
                        let a = mnf::run(&mapped, &params, gpu, &Monitor::silent()).unwrap_or_else(|e| panic!("{what}: {e}"));
                        let b = mnf::run(&read, &params, gpu, &Monitor::silent()).unwrap();
                        assert_same_output(&what, &a, &b);
                        if how == "resident" && order == ByteOrder::Little {
                            let r = mnf::run(&read, &params, &cpu, &Monitor::silent()).unwrap();
                            let worst = a
                                .metadata
                                .eigenvalues
                                .iter()
                                .zip(&r.metadata.eigenvalues)
                                .map(|(x, y)| ((x - y) / y).abs())
                                .fold(0.0, f64::max);
                            eprintln!("{what}: eigenvalues max relative error against the CPU {worst:.2e}");
                            assert!(worst < 1e-4, "{what}: {worst:e}");
                        }
                    }
                }
            }
            eprintln!("{route:?} {}: mapped = read, bit for bit", dtype.name());
        }
    }
}

/// A multipart ENVI upload to a CUDA server (`api::envi_upload`): BIL and BIP data are sent to the
/// device while they arrive (the job then finds its cube there), BSQ is not (no whole line before its
/// last band); each job's components equal the in-process GPU run's bit for bit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a CUDA device"]
async fn a_multipart_envi_upload_is_fed_to_the_device_while_it_arrives() {
    use hypermnf::backend::cuda::{CudaBackend, Route};
    let dir = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path().join("server"));
    args.backend = hypermnf::mnf::BackendChoice::Cuda;
    let srv = common::TestServer::start_on_given_backend(args).await;
    let gpu = CudaBackend::new(Route::Kernels).unwrap();
    let mut fed = 0;
    // 600 x 300 x 128: 92-184 MB, several statistics chunks fed as the writer reports them.
    for (k, (layout, dtype, order)) in [
        (Interleave::Bil, DataType::F32, ByteOrder::Little),
        (Interleave::Bip, DataType::I16, ByteOrder::Big),
        (Interleave::Bil, DataType::U16, ByteOrder::Big),
        (Interleave::Bsq, DataType::F32, ByteOrder::Little),
    ]
    .into_iter()
    .enumerate()
    {
        let what = format!("{} {} {order:?}", layout.name(), dtype.name());
        let c = cube(40 + k as u64, 600, 300, 128, dtype);
        let hdr = write(dir.path(), &c, layout, order);
        let img = hdr.with_extension("img");
        let form = reqwest::multipart::Form::new()
            .text("header", std::fs::read_to_string(&hdr).unwrap())
            .text("params", r#"{"components": 6, "backend": "cuda"}"#)
            .part("data", reqwest::multipart::Part::bytes(std::fs::read(&img).unwrap()).file_name("cube.img"));
        let r = srv.client.post(srv.url("/v1/jobs")).multipart(form).send().await.unwrap();
        let (status, job) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
        assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{what}: {job}");
        let id = job["id"].as_str().unwrap();
        assert_eq!(srv.wait(id).await["status"], "succeeded", "{what}");
        let (st, got) = srv.get_bytes(&format!("/v1/jobs/{id}/result")).await;
        assert_eq!(st, reqwest::StatusCode::OK);
        let params = MnfParams { components: Some(6), backend: hypermnf::mnf::BackendChoice::Cuda, ..MnfParams::default() };
        let want = mnf::run(&envi::read(&hdr).unwrap(), &params, &gpu, &Monitor::silent()).unwrap();
        let values: Vec<u32> = got[got.len() - want.components.len() * 4..].chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
        assert!(values == bits(&want.components), "{what}: the service's result differs from the in-process run");
        if layout != Interleave::Bsq {
            fed += 1;
        }
        let metrics = srv.client.get(srv.url("/metrics")).send().await.unwrap().text().await.unwrap();
        assert!(metrics.contains(&format!("hypermnf_jobs_fed_to_device_total {fed}\n")), "{what}: {metrics}");
        let md = srv.get_json(&format!("/v1/jobs/{id}/metadata")).await.1;
        eprintln!("{what}: fed {fed}, timings {}", md["timings_ms"]);
    }
    srv.stop().await;
}

/// A small case of the above for compute-sanitizer (racecheck instruments every shared-memory access
/// of the reorder kernel; scripts/gpu-sanitize.sh runs the tests named *sanitizer_small_case*): every
/// element size, BIL and BSQ, a cube whose sides are not multiples of the 32 x 32 tile.
#[test]
#[ignore = "needs a CUDA device"]
fn native_layout_sanitizer_small_case() {
    use hypermnf::backend::cuda::{CudaBackend, Route};
    let dir = tempfile::tempdir().unwrap();
    let gpu = CudaBackend::new(Route::Kernels).unwrap_or_else(|e| panic!("CUDA backend: {e}"));
    for dtype in [DataType::U8, DataType::I16, DataType::F32, DataType::F64] {
        let c = cube(6, 19, 37, 35, dtype);
        for layout in [Interleave::Bil, Interleave::Bsq] {
            let hdr = write(dir.path(), &c, layout, ByteOrder::Big);
            let (read, mapped) = (envi::read(&hdr).unwrap(), envi::map(&hdr).unwrap());
            let params = MnfParams { components: Some(3), ..MnfParams::default() };
            let a = mnf::run(&mapped, &params, &gpu, &Monitor::silent()).unwrap();
            let b = mnf::run(&read, &params, &gpu, &Monitor::silent()).unwrap();
            assert_same_output(&format!("{} {}", layout.name(), dtype.name()), &a, &b);
        }
    }
}

/// The real tiny AVIRIS-NG and EMIT flight-line chips of `../shared/data/formats/` (10 x 10 pixels of
/// 425 or 285 bands): `hypermnf run` refuses them saying there are too few pixels for the bands, with
/// the counts (the bands left after the bbl), never blaming linear combinations of bands; the 30 x 25 AVIRIS-NG chip (644 residuals
/// for 425 bands) is enough, and runs. Skipped (said so) when the shared folder is missing, unless
/// HYPERMNF_REQUIRE_FORMATS=1.
#[test]
fn real_tiny_chips_say_too_few_pixels_for_their_bands() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/formats");
    if !dir.join("PROVENANCE.md").is_file() {
        assert_ne!(std::env::var("HYPERMNF_REQUIRE_FORMATS").as_deref(), Ok("1"), "{} is missing", dir.display());
        eprintln!("skipped: {} is missing", dir.display());
        return;
    }
    let out = tempfile::tempdir().unwrap();
    for (chip, pixels, bands) in [
        ("aviris-ng/ang20170323t202244_rdn_7000-7010.hdr", 100, 425),
        // 285 bands, 41 of them bad in its bbl.
        ("emit/emit20250324t221005_jpl_unmix_ex.hdr", 100, 244),
    ] {
        let run = std::process::Command::new(env!("CARGO_BIN_EXE_hypermnf"))
            .args(["run", "--backend", "cpu"])
            .arg(dir.join(chip))
            .arg("--out")
            .arg(out.path().join("o.npy"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success(), "{chip}: {stderr}");
        // The error line itself (the progress lines before it name the cube's bands too).
        let err = stderr.lines().find(|l| l.contains("error:")).unwrap_or_else(|| panic!("{chip}: no error line in {stderr}"));
        assert!(err.contains("too few pixels for the number of bands"), "{chip}: {err}");
        assert!(err.contains(&format!("{pixels} pixel")), "{chip}: {err}");
        assert!(err.contains(&format!("{bands} band")), "{chip}: {err}");
        assert!(!err.contains("linear combination"), "{chip}: {err}");
    }
    let enough = std::process::Command::new(env!("CARGO_BIN_EXE_hypermnf"))
        .args(["run", "--backend", "cpu"])
        .arg(dir.join("aviris-ng/ang20160910t185702_2rdn_img.hdr"))
        .arg("--out")
        .arg(out.path().join("o.npy"))
        .output()
        .unwrap();
    assert!(enough.status.success(), "{}", String::from_utf8_lossy(&enough.stderr));
}
