//! `hypermnf bench gpu`: the GPU backends side by side with the CPU backend on the synthetic
//! 1087 × 614 × 224 int16 cube (and 4× / 16× the pixels), k = 10, host int16 in → host float32 out.
//!
//! Measured per scale, medians of `--runs` runs after `--warmup` runs:
//! - `pcie`: the raw cube host → device alone, from page-locked memory (the floor of any end-to-end run):
//!   from a cuMemHostAlloc buffer (as PyTorch's pinned tensors), and from the cube's own memory
//!   registered with cuMemHostRegister, as the `backend` rows copy it;
//! - per route (custom kernels, cuBLAS): `backend` = prepare + statistics (+ the host's noise whitening
//!   overlapped, as the pipeline does it) + eigen + projection into a preallocated output, the cube's
//!   memory page-locked beforehand (as PyTorch's pinned input); `pinned input and output` the same
//!   with the output page-locked too (as PyTorch's pinned output), so the downloads land in it; `backend-pageable` the same from
//!   ordinary memory (through the pinned staging buffers); `pipeline` = `mnf::run` as the CLI calls it
//!   (it also allocates and NaN-fills the output and builds the metadata);
//! - the CPU backend through `mnf::run`.
//!
//! With `--devices` naming two or more devices, each scale also gets the several-device rows: `mnf::run`
//! on each device alone, the split's floor (every device copying its share of lines at once from the
//! pinned cube), `mnf::run` on the cube split over all of them (`--split-cube`), and the job rate of a
//! stream of cubes on one device against all of them (one job per device at a time), all from the
//! same page-locked cube (portable registration, so every device copies it directly).
//!
//! The per-stage columns come from CUDA events of the last `backend` run (points on a timeline from the
//! start of each pass; the stages overlap).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;

use std::sync::Arc;

use crate::backend::cuda::{CudaBackend, Route, Timeline};
use crate::backend::devices::DeviceSelection;
use crate::backend::split::{SplitBackend, SplitMode};
use crate::backend::{Backend, PreparedCube};
use crate::cube::synthetic::{self, SyntheticSpec};
use crate::cube::Cube;
use crate::mnf::stats::{self, Moments, Projection, StatsSpec};
use crate::mnf::{bands, eigen, MnfParams, Monitor, NoiseEstimator};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Pixel-count multipliers of the 1087 × 614 × 224 int16 cube (the line count is multiplied).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    pub scales: Vec<usize>,
    /// Timed runs per measurement (the median is reported).
    #[arg(long, default_value_t = 10)]
    pub runs: usize,
    /// Untimed runs first (kernel compilation, cuBLAS initialisation, caches).
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    #[arg(long, default_value_t = 10)]
    pub components: usize,
    /// Timed CPU-backend runs per scale (it takes seconds per run at 16×).
    #[arg(long, default_value_t = 3)]
    pub cpu_runs: usize,
    /// Skip the CPU backend.
    #[arg(long)]
    pub no_cpu: bool,
    /// Also write all numbers as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// CUDA devices for the several-device rows: `all` or ordinals such as 0,1 (rows only with two or
    /// more).
    #[arg(long)]
    pub devices: Option<DeviceSelection>,
    /// Only the several-device rows (no single-device variants, cuBLAS route, CPU backend or PCIe row).
    #[arg(long, requires = "devices")]
    pub devices_only: bool,
    /// Jobs in each stream of the job-rate rows.
    #[arg(long, default_value_t = 24)]
    pub stream_jobs: usize,
}

#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    scale: usize,
    lines: usize,
    what: String,
    median_ms: f64,
    min_ms: f64,
    runs: usize,
    timeline: Option<Timeline>,
    eigen_ms: Option<f64>,
    /// Job-rate rows: jobs per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    jobs_per_s: Option<f64>,
    /// Split rows: largest relative difference from the first device alone (eigenvalues; components).
    #[serde(skip_serializing_if = "Option::is_none")]
    rel_error: Option<(f64, f64)>,
}

impl Row {
    fn new(scale: usize, lines: usize, what: String, (median_ms, min_ms): (f64, f64), runs: usize) -> Row {
        Row { scale, lines, what, median_ms, min_ms, runs, timeline: None, eigen_ms: None, jobs_per_s: None, rel_error: None }
    }
}

fn median(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let m = if v.is_empty() {
        f64::NAN
    } else if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (m, v.first().copied().unwrap_or(f64::NAN))
}

fn time_runs(warmup: usize, runs: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<(f64, f64)> {
    for _ in 0..warmup {
        f()?;
    }
    let mut t = Vec::with_capacity(runs);
    for _ in 0..runs {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64() * 1e3);
    }
    Ok(median(t))
}

/// One MNF on the GPU backend at library level: what `mnf::run` does, minus output allocation and
/// metadata. Returns the host milliseconds of the eigen work that did not overlap the device.
fn backend_mnf(be: &CudaBackend, cube: &Cube, k: usize, out: &mut [f32]) -> anyhow::Result<f64> {
    backend_mnf_phases(be, cube, k, out).map(|p| p[2])
}

/// [`backend_mnf`] with the wall time of each phase: prepare, statistics (until the moments are on the
/// host), eigen, projection (until the components are in `out`).
fn backend_mnf_phases(
    be: &CudaBackend,
    cube: &Cube,
    k: usize,
    out: &mut [f32],
) -> anyhow::Result<[f64; 4]> {
    let monitor = Monitor::silent();
    let t_prep = Instant::now();
    let mut prep = be.prepare_cuda(cube)?;
    let prepare_ms = t_prep.elapsed().as_secs_f64() * 1e3;
    let pre = bands::preselect(cube.bands(), cube.meta.bbl.as_deref(), &[]);
    let noise_kind = NoiseEstimator::MeanFilter;
    let spec = StatsSpec {
        noise: noise_kind,
        window: None,
        // The pipeline's no-data rule (NaN in float cubes), so that the phases time what a job runs.
        ignore_value: crate::mnf::pipeline::nodata(cube, &MnfParams::default()),
        mask_bands: pre.used.clone(),
    };
    let scale = noise_kind.scale();
    // As the pipeline: with a device solver the callback only selects bands and scales C_N (the
    // device factors it); without, it also factors C_N on the host.
    let defer = crate::backend::PreparedCube::eigen_solver(&prep).is_some();
    let whiten = |noise: &Moments| -> anyhow::Result<(Vec<usize>, eigen::NoiseWhitening)> {
        let sel = stats::drop_noiseless(&pre, noise, None);
        let cn = noise.covariance_of(&sel.used, scale).context("too few noise samples")?;
        let n = sel.used.len();
        let w = if defer {
            eigen::NoiseWhitening::deferred(cn, n)
        } else {
            eigen::NoiseWhitening::new(cn, n)?
        };
        Ok((sel.used, w))
    };
    // As the pipeline: the device starts the eigen step from its own sums (unless the backend was made
    // without it, to measure that).
    crate::mnf::pipeline::ask_early_solve(&mut prep, &pre.used, scale);
    let mut early = None;
    let t_stats = Instant::now();
    let stats = prep.statistics(&spec, &mut |n: &Moments| early = Some(whiten(n)), &monitor)?;
    let mut stats_ms = t_stats.elapsed().as_secs_f64() * 1e3;
    let early_solution = crate::backend::PreparedCube::early_solution(&mut prep);
    let t = Instant::now();
    let (used, w) = early.context("on_noise was not called")??;
    let (pairs, waited_ms) = crate::mnf::pipeline::solve_after_statistics(&mut prep, early_solution, &used, &w, &stats.data)?;
    // The statistics pass waited for the early solve: eigen time, as in the pipeline.
    stats_ms -= waited_ms.min(stats_ms);
    let eigen_ms = t.elapsed().as_secs_f64() * 1e3 + waited_ms;
    let u = used.len();
    let mut tk = Vec::with_capacity(u * k);
    for r in 0..u {
        tk.extend_from_slice(&pairs.transform[r * u..r * u + k]);
    }
    let projection = Projection {
        means: used.iter().map(|&b| stats.data.mean[b]).collect(),
        bands_used: used,
        transform: tk,
        k,
        ignore_value: spec.ignore_value,
        mask_bands: pre.used.clone(),
    };
    let t_proj = Instant::now();
    prep.project(&projection, out, &monitor)?;
    Ok([
        prepare_ms,
        stats_ms,
        eigen_ms,
        t_proj.elapsed().as_secs_f64() * 1e3,
    ])
}

/// Times [`backend_mnf_phases`] (median and minimum of `runs` after `warmup`), prints the median of
/// each wall phase under `label` and returns (median, minimum, median eigen phase) in ms.
fn timed_phases(
    be: &CudaBackend,
    cube: &Cube,
    k: usize,
    out: &mut [f32],
    args: &Args,
    label: &str,
) -> anyhow::Result<(f64, f64, f64)> {
    let mut phases: Vec<[f64; 4]> = Vec::new();
    let (m, lo) = time_runs(args.warmup, args.runs, || {
        phases.push(backend_mnf_phases(be, cube, k, out)?);
        Ok(())
    })?;
    let phase = |i: usize| median(phases.iter().map(|p| p[i]).collect()).0;
    eprintln!(
        "bench gpu: {label} wall phases (medians, ms): prepare {:.2}, statistics {:.2}, eigen {:.2}, projection {:.2}",
        phase(0),
        phase(1),
        phase(2),
        phase(3)
    );
    Ok((m, lo, phase(2)))
}

/// Host → device copy of the whole raw cube from page-locked memory, timed alone.
fn pcie_ms(be: &CudaBackend, cube: &Cube, warmup: usize, runs: usize) -> anyhow::Result<(f64, f64)> {
    be.time_upload(cube.raw(), warmup, runs).map_err(Into::into)
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let k = args.components;
    let mut rows: Vec<Row> = Vec::new();
    let mut device = String::new();
    // The device list is checked before any cube is generated.
    let several = match &args.devices {
        Some(sel) => Some(sel.resolve(crate::backend::cuda::device_count()?)?),
        None => None,
    };
    if args.devices_only && several.as_ref().is_none_or(|o| o.len() < 2) {
        anyhow::bail!("--devices-only needs --devices with two or more devices");
    }
    for &scale in &args.scales {
        let mut spec = SyntheticSpec::paper_size();
        spec.lines *= scale;
        let t = Instant::now();
        let cube = synthetic::generate(&spec);
        eprintln!(
            "bench gpu: {}x: {} x {} x {} int16 ({} MB) generated in {:.1} s",
            scale,
            cube.lines(),
            cube.samples(),
            cube.bands(),
            cube.raw_len() >> 20,
            t.elapsed().as_secs_f64()
        );
        if !args.devices_only {
            let mut out = vec![0f32; cube.pixels() * k];
            for route in [Route::Kernels, Route::Cublas] {
                let be = CudaBackend::new(route).with_context(|| format!("CUDA backend {route:?}"))?;
                device = be.device();
                let label = be.name();
                if route == Route::Kernels {
                    let (m, lo) = pcie_ms(&be, &cube, args.warmup, args.runs)?;
                    rows.push(Row {
                        scale,
                        lines: cube.lines(),
                        what: "pcie (pinned raw cube, H2D only)".into(),
                        median_ms: m,
                        min_ms: lo,
                        runs: args.runs,
                        timeline: None,
                        eigen_ms: None,
                        jobs_per_s: None,
                        rel_error: None,
                    });
                }
                // Page-locked input (skipped, with a note, where the driver refuses to register it).
                match be.register_host(cube.raw()) {
                    Err(e) => eprintln!("bench gpu: cannot page-lock the cube ({e}); pinned-input rows skipped"),
                    Ok(_reg) => {
                        if route == Route::Kernels {
                            // The same copy from the cube's own memory, page-locked by registration as
                            // the backend rows below copy it: their floor.
                            let (m, lo) = be.time_upload_registered(cube.raw(), args.warmup, args.runs)?;
                            rows.push(Row::new(scale, cube.lines(), "pcie (the cube's registered memory, H2D only)".into(), (m, lo), args.runs));
                        }
                        // The design choices measured against their alternatives on the same cube: the eigen
                        // step on the host (faer), T in constant memory (the published v3), and the generic
                        // kernels instead of the int16 fast paths.
                        if route == Route::Kernels {
                            let variants = [
                                (
                                    "host eigen (faer)",
                                    CudaBackend::new(route)?.with_host_eigen(),
                                ),
                                (
                                    "eigen from the host's C_N and C_D (no early solve)",
                                    CudaBackend::new(route)?.without_early_solve(),
                                ),
                                (
                                    "T in constant memory",
                                    CudaBackend::new(route)?.with_constant_projection(),
                                ),
                                (
                                    "generic kernels (no int16 fast path)",
                                    CudaBackend::new(route)?.with_generic_kernels(),
                                ),
                            ];
                            for (what, vb) in variants {
                                let mut eig = Vec::new();
                                let (m, lo) = time_runs(args.warmup, args.runs, || {
                                    eig.push(backend_mnf(&vb, &cube, k, &mut out)?);
                                    Ok(())
                                })?;
                                rows.push(Row {
                                    scale,
                                    lines: cube.lines(),
                                    what: format!("{label}: backend, pinned input, {what}"),
                                    median_ms: m,
                                    min_ms: lo,
                                    runs: args.runs,
                                    timeline: vb.last_timeline(),
                                    eigen_ms: Some(median(eig).0),
                                    jobs_per_s: None,
                                    rel_error: None,
                                });
                            }
                        }
                        let (m, lo, eigen_ms) = timed_phases(&be, &cube, k, &mut out, args, &format!("{scale}x {label}"))?;
                        rows.push(Row {
                            scale,
                            lines: cube.lines(),
                            what: format!("{label}: backend, pinned input"),
                            median_ms: m,
                            min_ms: lo,
                            runs: args.runs,
                            timeline: be.last_timeline(),
                            eigen_ms: Some(eigen_ms),
                            jobs_per_s: None,
                            rel_error: None,
                        });
                        // The same with the components written into page-locked memory, as the PyTorch
                        // reference does (pinned output): the downloads land in it, no host copy.
                        {
                            let len = std::mem::size_of_val(out.as_slice());
                            // SAFETY: a byte view of the f32 output, only for the registration below.
                            let bytes = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, len) };
                            match be.register_host_mut(bytes) {
                                Err(e) => eprintln!("bench gpu: cannot page-lock the output ({e}); pinned-output row skipped"),
                                Ok((_out_reg, pinned)) => {
                                    // SAFETY: the same memory as f32 again (it came from a Vec<f32>, so aligned).
                                    let pinned_out = unsafe { std::slice::from_raw_parts_mut(pinned.as_mut_ptr() as *mut f32, len / 4) };
                                    let what = format!("{scale}x {label} pinned output,");
                                    let (m, lo, eigen_ms) = timed_phases(&be, &cube, k, pinned_out, args, &what)?;
                                    rows.push(Row {
                                        scale,
                                        lines: cube.lines(),
                                        what: format!("{label}: backend, pinned input and output"),
                                        median_ms: m,
                                        min_ms: lo,
                                        runs: args.runs,
                                        timeline: be.last_timeline(),
                                        eigen_ms: Some(eigen_ms),
                                        jobs_per_s: None,
                                        rel_error: None,
                                    });
                                }
                            }
                        }
                        let params = MnfParams {
                            components: Some(k),
                            ..Default::default()
                        };
                        let (m, lo) = time_runs(1, args.runs, || {
                            crate::mnf::run(&cube, &params, &be, &Monitor::silent())?;
                            Ok(())
                        })?;
                        rows.push(Row {
                            scale,
                            lines: cube.lines(),
                            what: format!("{label}: mnf::run, pinned input"),
                            median_ms: m,
                            min_ms: lo,
                            runs: args.runs,
                            timeline: None,
                            eigen_ms: None,
                            jobs_per_s: None,
                            rel_error: None,
                        });
                    }
                }
                // Ordinary (pageable) input, through the pinned staging buffers.
                let runs = args.runs.min(if scale > 4 { 3 } else { args.runs });
                let (m, lo) = time_runs(1, runs, || {
                    backend_mnf(&be, &cube, k, &mut out)?;
                    Ok(())
                })?;
                rows.push(Row {
                    scale,
                    lines: cube.lines(),
                    what: format!("{label}: backend, pageable input"),
                    median_ms: m,
                    min_ms: lo,
                    runs,
                    timeline: be.last_timeline(),
                    eigen_ms: None,
                    jobs_per_s: None,
                    rel_error: None,
                });
            }
            if !args.no_cpu {
                let cpu = crate::backend::cpu::CpuBackend::new();
                let params = MnfParams {
                    components: Some(k),
                    ..Default::default()
                };
                let runs = if scale == 1 {
                    args.cpu_runs.max(1)
                } else {
                    args.cpu_runs.clamp(1, 3)
                };
                let (m, lo) = time_runs(usize::from(scale == 1), runs, || {
                    crate::mnf::run(&cube, &params, &cpu, &Monitor::silent())?;
                    Ok(())
                })?;
                rows.push(Row {
                    scale,
                    lines: cube.lines(),
                    what: format!("cpu: mnf::run ({})", cpu.device()),
                    median_ms: m,
                    min_ms: lo,
                    runs,
                    timeline: None,
                    eigen_ms: None,
                    jobs_per_s: None,
                    rel_error: None,
                });
            }
        }
        match &several {
            Some(ordinals) if ordinals.len() >= 2 => {
                rows.extend(several_device_rows(&cube, scale, k, args, ordinals)?);
                if device.is_empty() {
                    device = format!("CUDA devices {ordinals:?}");
                }
            }
            Some(_) => eprintln!("bench gpu: one device listed: no several-device rows"),
            None => {}
        }
        print_rows(&rows, scale);
    }
    println!(
        "\ndevice: {device}; k = {k}; medians of {} runs after {} warm-up runs (CPU: fewer, see runs)",
        args.runs, args.warmup
    );
    if let Some(p) = &args.json {
        std::fs::write(
            p,
            serde_json::to_vec_pretty(&serde_json::json!({ "device": device, "k": k, "rows": rows }))?,
        )
        .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// The several-device rows of one scale; see the module doc.
fn several_device_rows(cube: &Cube, scale: usize, k: usize, args: &Args, ordinals: &[usize]) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let lines = cube.lines();
    let mut devs: Vec<Arc<CudaBackend>> = Vec::new();
    for &d in ordinals {
        devs.push(Arc::new(CudaBackend::on_device(d, Route::Kernels).with_context(|| format!("CUDA device {d}"))?));
    }
    let refs: Vec<&CudaBackend> = devs.iter().map(|b| b.as_ref()).collect();
    let _pinned = CudaBackend::register_host_shared(&refs, cube.raw()).context("page-locking the cube for every device")?;
    // The components page-locked for every device too (as the one-device "pinned input and output"
    // rows and the PyTorch reference): `mnf::run` returns them in fresh pageable memory, whose
    // download runs through the driver's staging and faults its pages in, and at 16x that alone
    // made a device's run ~1.6x its pinned one (2026-11-27 table).
    let mut out = vec![0f32; cube.pixels() * k];
    let out_len = std::mem::size_of_val(out.as_slice());
    // SAFETY: a byte view of the f32 output, only for the registration below.
    let out_bytes = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, out_len) };
    let (_out_reg, out_bytes) = CudaBackend::register_host_shared_mut(&refs, out_bytes).context("page-locking the output for every device")?;
    let params = MnfParams { components: Some(k), ..Default::default() };
    let silent = Monitor::silent();
    let mut alone = Vec::new();
    for (b, &d) in devs.iter().zip(ordinals) {
        let t = time_runs(args.warmup, args.runs, || {
            crate::mnf::run(cube, &params, b.as_ref(), &silent)?;
            Ok(())
        })?;
        rows.push(Row::new(scale, lines, format!("device {d} alone ({}): mnf::run, pinned input", b.device()), t, args.runs));
        let mut phases = Vec::new();
        let t = time_runs(args.warmup, args.runs, || {
            phases.push(run_into_phases(cube, &params, b.as_ref(), as_f32(out_bytes))?);
            Ok(())
        })?;
        print_phases(&format!("{scale}x device {d} alone, pinned input and output"), &phases[args.warmup..]);
        alone.push(t.0);
        rows.push(Row::new(scale, lines, format!("device {d} alone: pinned input and output"), t, args.runs));
    }
    // As a job writes its components: streamed, copied out of the download chunks as they land.
    let mut written = vec![0f32; cube.pixels() * k];
    let t = time_runs(args.warmup, args.runs, || run_streamed(cube, &params, devs[0].as_ref(), &mut written))?;
    rows.push(Row::new(scale, lines, format!("device {} alone: components streamed (as a job writes them)", ordinals[0]), t, args.runs));
    // The floor of the split: every device copying its share of lines at once, from the pinned cube;
    // then the same with each copying its share of the components back after it.
    let line_bytes = cube.raw().len() / lines.max(1);
    let floor_in = CudaBackend::time_shared_upload(&refs, cube.raw(), line_bytes, None, args.warmup, args.runs)?;
    rows.push(Row::new(scale, lines, format!("floor: {} devices copying their shares at once (pinned)", devs.len()), floor_in, args.runs));
    let floor = CudaBackend::time_shared_upload(&refs, cube.raw(), line_bytes, Some(&mut *out_bytes), args.warmup, args.runs)?;
    rows.push(Row::new(
        scale,
        lines,
        format!("floor with the components: {} devices copying their shares in, then their components out", devs.len()),
        floor,
        args.runs,
    ));
    let parts: Vec<Arc<dyn crate::backend::Backend>> = devs.iter().map(|b| b.clone() as Arc<dyn crate::backend::Backend>).collect();
    let split = SplitBackend::new(parts, SplitMode::Always)?;
    let t = time_runs(args.warmup, args.runs, || {
        crate::mnf::run(cube, &params, &split, &silent)?;
        Ok(())
    })?;
    rows.push(Row::new(
        scale,
        lines,
        format!("split over {} devices: mnf::run, pinned input ({:.2}x the input floor)", devs.len(), t.0 / floor_in.0),
        t,
        args.runs,
    ));
    let mut phases = Vec::new();
    let t = time_runs(args.warmup, args.runs, || {
        phases.push(run_into_phases(cube, &params, &split, as_f32(out_bytes))?);
        Ok(())
    })?;
    print_phases(&format!("{scale}x split over {} devices, pinned input and output", devs.len()), &phases[args.warmup..]);
    // Same cube, same parameters: how far the split result lies from the first device's.
    let one = crate::mnf::run(cube, &params, devs[0].as_ref(), &silent)?;
    let all = crate::mnf::run(cube, &params, &split, &silent)?;
    let ev = max_rel(&all.metadata.eigenvalues, &one.metadata.eigenvalues);
    let z = max_rel_f32(&all.components, &one.components);
    let mut row = Row::new(
        scale,
        lines,
        format!(
            "split over {} devices: pinned input and output ({:.2}x device {} alone, {:.2}x the input floor, {:.2}x the floor with the components)",
            devs.len(),
            t.0 / alone[0],
            ordinals[0],
            t.0 / floor_in.0,
            t.0 / floor.0
        ),
        t,
        args.runs,
    );
    row.rel_error = Some((ev, z));
    eprintln!("bench gpu: {scale}x split vs device {} alone: eigenvalues {ev:.2e}, components {z:.2e} (largest relative difference)", ordinals[0]);
    rows.push(row);
    let t = time_runs(args.warmup, args.runs, || run_streamed(cube, &params, &split, &mut written))?;
    rows.push(Row::new(
        scale,
        lines,
        format!("split over {} devices: components streamed (as a job writes them; {:.2}x the floor with the components)", devs.len(), t.0 / floor.0),
        t,
        args.runs,
    ));
    // A stream of jobs: one device, then every device with one job at a time each.
    let jobs = args.stream_jobs.max(devs.len());
    for n in [1, devs.len()] {
        let started = Instant::now();
        std::thread::scope(|sc| -> anyhow::Result<()> {
            let handles: Vec<_> = devs[..n]
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let (params, silent) = (&params, &silent);
                    sc.spawn(move || -> anyhow::Result<()> {
                        for _ in (i..jobs).step_by(n) {
                            crate::mnf::run(cube, params, b.as_ref(), silent)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            for h in handles {
                h.join().map_err(|_| anyhow::anyhow!("a device thread panicked"))??;
            }
            Ok(())
        })?;
        let s = started.elapsed().as_secs_f64();
        let mut row = Row::new(scale, lines, format!("stream of {jobs} jobs on {n} device(s): ms per job"), (s * 1e3 / jobs as f64, f64::NAN), jobs);
        row.jobs_per_s = Some(jobs as f64 / s);
        eprintln!("bench gpu: {scale}x stream on {n} device(s): {:.1} jobs/s", jobs as f64 / s);
        rows.push(row);
    }
    Ok(rows)
}

/// `mnf::run` with the components projected into `out` (page-locked by the caller) instead of fresh
/// memory; the wall times (ms) of its phases: prepare, statistics and eigen (as `analyse_on` splits
/// them), projection.
fn run_into_phases(cube: &Cube, params: &MnfParams, backend: &dyn crate::backend::Backend, out: &mut [f32]) -> anyhow::Result<[f64; 4]> {
    let silent = Monitor::silent();
    let t0 = Instant::now();
    let mut prepared = backend.prepare(cube, &silent)?;
    let prepare = t0.elapsed().as_secs_f64() * 1e3;
    let mut timings = Default::default();
    let system = crate::mnf::pipeline::analyse_on(cube, params, prepared.as_mut(), &silent, &mut timings)?;
    let projection = crate::mnf::pipeline::projection_of(cube, params, &system)?;
    let t1 = Instant::now();
    prepared.project(&projection, out, &silent)?;
    let phase = |n: &str| timings.get(n).copied().unwrap_or(f64::NAN);
    Ok([prepare, phase("statistics"), phase("eigen"), t1.elapsed().as_secs_f64() * 1e3])
}

/// The per-phase medians of `runs` runs of `run_into_phases`, on stderr under `what`.
fn print_phases(what: &str, phases: &[[f64; 4]]) {
    let m = |i: usize| median(phases.iter().map(|p| p[i]).collect()).0;
    eprintln!(
        "bench gpu: {what}: phases (medians of {} runs, ms): prepare {:.2}, statistics {:.2}, eigen {:.2}, projection {:.2}",
        phases.len(),
        m(0),
        m(1),
        m(2),
        m(3)
    );
}

/// `mnf::run` with the components streamed as a job writes them (`PreparedCube::project_streamed`:
/// the CUDA backend's page-locked download chunks handed over as they land), copied into `out`
/// (memory already touched, standing for the result file's page cache).
fn run_streamed(cube: &Cube, params: &MnfParams, backend: &dyn crate::backend::Backend, out: &mut [f32]) -> anyhow::Result<()> {
    let silent = Monitor::silent();
    let mut prepared = backend.prepare(cube, &silent)?;
    let system = crate::mnf::pipeline::analyse_on(cube, params, prepared.as_mut(), &silent, &mut Default::default())?;
    let projection = crate::mnf::pipeline::projection_of(cube, params, &system)?;
    // The backend may leave this unwritten (the values are the callback's): zeroed, so only mapped
    // if written, as the pipeline's.
    let mut scratch = vec![0f32; out.len()];
    prepared.project_streamed(
        &projection,
        &mut scratch,
        &mut |first, values| {
            out[first..first + values.len()].copy_from_slice(values);
            Ok(())
        },
        &silent,
    )?;
    Ok(())
}

/// The f32 view of a page-locked output that came from a `Vec<f32>` (so aligned, whole values).
fn as_f32(bytes: &mut [u8]) -> &mut [f32] {
    debug_assert!(bytes.as_ptr() as usize % 4 == 0 && bytes.len() % 4 == 0);
    // SAFETY: the bytes are a Vec<f32>'s, viewed as bytes for their registration only.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut f32, bytes.len() / 4) }
}

/// Largest |a − b| over the largest |b|.
fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0.0f64, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn max_rel_f32(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs() as f64));
    a.iter().zip(b).filter(|(x, y)| x.is_finite() && y.is_finite()).fold(0.0f64, |m, (x, y)| m.max((x - y).abs() as f64)) / scale
}

fn print_rows(rows: &[Row], scale: usize) {
    println!("\n| scale | lines | what | median ms | min ms | runs | upload done (its copy) | noise done | data cov done | on host | eigen starts (tail) | eigen (host, after stats) | projection kernels | download done |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows.iter().filter(|r| r.scale == scale) {
        let f = |v: f32| format!("{v:.2}");
        let (a, b, c, d, e) = match &r.timeline {
            Some(t) => (
                format!("{} ({})", f(t.upload_done_ms), f(t.upload_done_ms - t.upload_start_ms)),
                f(t.noise_done_ms),
                f(t.data_done_ms),
                f(t.project_kernels_ms),
                f(t.project_download_ms),
            ),
            None => Default::default(),
        };
        // The statistics' tail: from the last upload to the host starting the eigen step (issue goal
        // ≤ 0.4 ms), on the device's clock.
        let tail = match &r.timeline {
            Some(t) => format!("{} | {} ({})", f(t.data_on_host_ms), f(t.eigen_start_ms), f(t.eigen_start_ms - t.upload_done_ms)),
            None => " | ".into(),
        };
        let eig = r.eigen_ms.map(|v| format!("{v:.2}")).unwrap_or_default();
        let what = match (r.jobs_per_s, r.rel_error) {
            (Some(j), _) => format!("{} ({j:.1} jobs/s)", r.what),
            (_, Some((ev, z))) => format!("{} (rel. diff. eigenvalues {ev:.1e}, components {z:.1e})", r.what),
            _ => r.what.clone(),
        };
        println!(
            "| {}x | {} | {} | {:.2} | {:.2} | {} | {a} | {b} | {c} | {tail} | {eig} | {d} | {e} |",
            r.scale, r.lines, what, r.median_ms, r.min_ms, r.runs
        );
    }
}
