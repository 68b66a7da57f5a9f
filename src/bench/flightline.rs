//! `hypermnf bench flightline`: a flight line as scientists have them (issue 29) — an ENVI file of
//! 598 samples × 425 bands × N lines, float32 or int16, BIL, BSQ or BIP, with a wavelength list,
//! `bbl`, `data ignore value` and map info — through every way in, against its floors, in one run:
//!
//! - `read_floor_ms`: the file read from the page cache with parallel positioned reads;
//! - `pcie_floor_ms` (GPU only): its bytes copied host → device from page-locked memory;
//! - `cli_ms`: `hypermnf run FILE.hdr --out OUT.npy --components 10` warm, as a child process;
//! - `pipeline_ms`: `cube::map` + `mnf::run` in this process;
//! - `upload_gbps` and `after_upload_ms`: the multipart ENVI upload to an in-process server, and the
//!   time from its last byte to `succeeded`;
//! - `max_upload_bytes`: the server's default upload limit as `/v1/info` reports it;
//! - `peak_anon_rss_mb` (the pipeline and server part of this process) and `cli_peak_anon_rss_mb`
//!   (the `hypermnf run` children): the largest `RssAnon` polled every 2 ms.
//!
//! Each time is measured `--runs` times after a warm-up (the median is reported, with the minimum
//! and maximum); the CLI, pipeline and service runs take turns, so that all three see the same
//! background load, and the 1-minute load average is reported beside them. The file is written into
//! a directory of its own (under `--dir`, or the system's temporary directory), which is removed at
//! the end; `--keep` keeps the file.

mod generate;
mod measure;
mod upload;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};

pub use generate::{Dtype, Layout};

use crate::backend::Backend;
use crate::mnf::{BackendChoice, MnfParams, Monitor};

/// The shape of an AVIRIS-NG radiance line.
const SAMPLES: usize = 598;
const BANDS: usize = 425;
/// Lines of the warm-up file sent to each server before the timed upload.
const WARM_LINES: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchBackend {
    Cpu,
    Cuda,
}

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Lines of the flight line (598 samples × 425 bands each: 6000 lines are 6.1 GB as float32).
    #[arg(long, default_value_t = 6000)]
    pub lines: usize,
    /// Backend of every part (default: cuda if a device is found, else cpu).
    #[arg(long, value_enum)]
    pub backend: Option<BenchBackend>,
    #[arg(long, value_enum, default_value_t = Layout::Bil)]
    pub interleave: Layout,
    #[arg(long, value_enum, default_value_t = Dtype::F32)]
    pub dtype: Dtype,
    /// Also write the figures as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Where the file is written (in a directory of its own, removed at the end); default: the
    /// system's temporary directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the flight line's .hdr and .img (their paths are printed).
    #[arg(long)]
    pub keep: bool,
    /// Timed runs of each measure, after one warm-up.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Time only the multipart ENVI upload to the in-process server (`upload_gbps`, with the time
    /// from its last byte to `succeeded`): no floors, no `hypermnf run`, no in-process pipeline. For
    /// profiling the ingest and comparing builds cheaply on a shared machine.
    #[arg(long)]
    pub upload_only: bool,
}

/// Median, minimum and maximum.
fn spread(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    let median = if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
    (median, s[0], s[n - 1])
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if args.lines < 16 {
        bail!("--lines must be at least 16");
    }
    let backend = match args.backend {
        Some(b) => b,
        None if crate::backend::cuda::device_count().is_ok_and(|n| n > 0) => BenchBackend::Cuda,
        None => BenchBackend::Cpu,
    };
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let work = base.join(format!("hypermnf-bench-flightline-{}", std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let stem = format!("flightline-{}-{}-{}", args.lines, args.interleave.envi_name(), args.dtype.name());
    let (hdr, img) = (work.join(format!("{stem}.hdr")), work.join(format!("{stem}.img")));
    let result = measure_all(args, backend, &work, &hdr, &img);
    if args.keep {
        for p in [&hdr, &img] {
            let to = base.join(p.file_name().expect("a file name"));
            if std::fs::rename(p, &to).is_ok() {
                eprintln!("bench flightline: kept {}", to.display());
            }
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn measure_all(args: &Args, backend: BenchBackend, work: &Path, hdr: &Path, img: &Path) -> anyhow::Result<()> {
    let (runs, lines) = (args.runs, args.lines);
    let spec = generate::Spec {
        lines,
        samples: SAMPLES,
        bands: BANDS,
        layout: args.interleave,
        dtype: args.dtype,
    };
    let file_bytes = spec.file_bytes();
    let me = measure::RssPoller::start(None);
    let t = Instant::now();
    eprintln!(
        "bench flightline: writing {lines} x {SAMPLES} x {BANDS} {} {} ({:.2} GB) to {} ...",
        args.dtype.name(),
        args.interleave.envi_name(),
        file_bytes as f64 / 1e9,
        img.display()
    );
    generate::write(&spec, hdr, img)?;
    let warm = generate::Spec { lines: WARM_LINES, ..spec };
    let (warm_hdr, warm_img) = (work.join("warm-up.hdr"), work.join("warm-up.img"));
    generate::write(&warm, &warm_hdr, &warm_img)?;
    eprintln!("bench flightline: written in {:.1} s", t.elapsed().as_secs_f64());

    let (read_floor, disk_floor) = if args.upload_only {
        (Vec::new(), 0.0)
    } else {
        eprintln!("bench flightline: read floor ...");
        let read_floor = measure::read_floor(img, runs)?;
        eprintln!("bench flightline: disk floor (2 GB written and synced beside the file) ...");
        (read_floor, measure::disk_floor(work, 2_000_000_000)?)
    };
    let cuda = match backend {
        BenchBackend::Cuda if args.upload_only => None,
        BenchBackend::Cuda => {
            Some(crate::backend::cuda::CudaBackend::new(crate::backend::cuda::Route::Kernels).context("the CUDA backend")?)
        }
        BenchBackend::Cpu => None,
    };
    let pcie_floor = match &cuda {
        Some(be) => {
            eprintln!("bench flightline: PCIe floor ...");
            Some(measure::pcie_floor(be, img, runs)?)
        }
        None => None,
    };
    let setup_peak = me.take();
    if args.upload_only {
        return measure_upload_only(args, backend, &spec, work, hdr, img, (&warm_hdr, &warm_img));
    }

    let bname = match backend {
        BenchBackend::Cpu => "cpu",
        BenchBackend::Cuda => "cuda",
    };
    let choice = match backend {
        BenchBackend::Cpu => BackendChoice::Cpu,
        BenchBackend::Cuda => BackendChoice::Cuda,
    };
    let text = |p: &Path| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    let envi = upload::Envi {
        header: text(hdr)?,
        data: img,
    };
    let warm_envi = upload::Envi {
        header: text(&warm_hdr)?,
        data: &warm_img,
    };
    let mut service = upload::Service::new(&envi, &warm_envi, work, choice)?;

    // `hypermnf run`, the in-process pipeline and the upload to a fresh server in turns (one warm-up
    // of the first two, then `runs` of each; each server has a warm-up job of its own), so that all
    // three see the same background load on a shared machine. This process's anonymous memory counts
    // from here on (the children's apart).
    eprintln!("bench flightline: hypermnf run, the in-process pipeline and the service in turns ({runs} runs each after a warm-up) ...");
    let cpu = crate::backend::cpu::CpuBackend::new();
    let be: &dyn Backend = match &cuda {
        Some(c) => c,
        None => &cpu,
    };
    let device = be.device();
    let params = MnfParams {
        components: Some(10),
        ..Default::default()
    };
    let (out, log) = (work.join("out.npy"), work.join("run.log"));
    let (mut cli, mut pipeline, mut cli_peak) = (Vec::new(), Vec::new(), 0);
    let (mut upload_gbps, mut after_upload) = (Vec::new(), Vec::new());
    let mut load = vec![measure::load_average()];
    me.take();
    for i in 0..=runs {
        let (ms, peak) = measure::cli(hdr, &out, bname, &log)?;
        cli_peak = cli_peak.max(peak);
        let t = Instant::now();
        let cube = crate::cube::map(hdr)?;
        let result = crate::mnf::run(&cube, &params, be, &Monitor::silent())?;
        let took = t.elapsed().as_secs_f64() * 1e3;
        // The pipeline's phases (statistics, eigen at 425 bands, projection) as a job records them.
        let phases: Vec<String> = result.metadata.timings_ms.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
        eprintln!("bench flightline: in-process pipeline {took:.1} ms: {} (ms)", phases.join(", "));
        drop(result);
        drop(cube);
        if i > 0 {
            cli.push(ms);
            pipeline.push(took);
            let (gbps, after) = service.run_once()?;
            upload_gbps.push(gbps);
            after_upload.push(after);
            load.push(measure::load_average());
        }
    }
    let peak = me.finish();
    for p in ["out.npy", "out.json"] {
        let _ = std::fs::remove_file(work.join(p));
    }

    let report = Report {
        args,
        backend: bname,
        device: if device.is_empty() { service.device.clone() } else { device },
        file_bytes,
        read_floor: spread(&read_floor),
        disk_floor_gbps: disk_floor,
        pcie_floor: pcie_floor.as_deref().map(spread),
        cli: spread(&cli),
        pipeline: spread(&pipeline),
        upload_gbps: spread(&upload_gbps),
        after_upload: spread(&after_upload),
        peak_anon: peak,
        cli_peak_anon: cli_peak,
        cli_breakdown: std::fs::read_to_string(&log)
            .ok()
            .and_then(|t| t.lines().rev().find_map(|l| l.strip_prefix("hypermnf: timings: ").map(str::to_string))),
        setup_peak_anon: setup_peak,
        max_upload_bytes: service.max_upload_bytes,
        raised_to: service.raised_to,
        load,
    };
    report.print();
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report.json())?).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `--upload-only`: the timed uploads alone, each to a fresh server after its warm-up job, with the
/// load average before each.
fn measure_upload_only(
    args: &Args,
    backend: BenchBackend,
    spec: &generate::Spec,
    work: &Path,
    hdr: &Path,
    img: &Path,
    (warm_hdr, warm_img): (&Path, &Path),
) -> anyhow::Result<()> {
    let text = |p: &Path| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    let envi = upload::Envi { header: text(hdr)?, data: img };
    let warm_envi = upload::Envi { header: text(warm_hdr)?, data: warm_img };
    let choice = match backend {
        BenchBackend::Cpu => BackendChoice::Cpu,
        BenchBackend::Cuda => BackendChoice::Cuda,
    };
    let mut service = upload::Service::new(&envi, &warm_envi, work, choice)?;
    let (mut gbps, mut after, mut load) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.runs {
        load.push(measure::load_average());
        let (g, a) = service.run_once()?;
        gbps.push(g);
        after.push(a);
    }
    let (g, a) = (spread(&gbps), spread(&after));
    let loads: Vec<String> = load.iter().map(|l| l.map_or("?".into(), |l| format!("{l:.1}"))).collect();
    println!(
        "flightline upload only: {} lines {} {} ({:.2} GB), device {}: multipart ENVI ingest {:.2} GB/s ({:.2}–{:.2}), \
         last byte to succeeded {:.0} ms ({:.0}–{:.0}); load average before each run: {}",
        args.lines,
        args.dtype.name(),
        args.interleave.envi_name(),
        spec.file_bytes() as f64 / 1e9,
        service.device,
        g.0,
        g.1,
        g.2,
        a.0,
        a.1,
        a.2,
        loads.join(", ")
    );
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "upload_gbps": g.0,
            "after_upload_ms": a.0,
            "upload_gbps_runs": gbps,
            "after_upload_ms_runs": after,
            "load_average_before": load,
            "lines": args.lines,
            "file_bytes": spec.file_bytes(),
        });
        std::fs::write(path, serde_json::to_vec_pretty(&json)?).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Everything measured; times as (median, min, max).
struct Report<'a> {
    args: &'a Args,
    backend: &'static str,
    device: String,
    file_bytes: u64,
    read_floor: (f64, f64, f64),
    /// What the disk holding the servers' data takes durably (GB/s): the bound on ingest.
    disk_floor_gbps: f64,
    pcie_floor: Option<(f64, f64, f64)>,
    cli: (f64, f64, f64),
    pipeline: (f64, f64, f64),
    upload_gbps: (f64, f64, f64),
    after_upload: (f64, f64, f64),
    peak_anon: u64,
    cli_peak_anon: u64,
    /// Generation and floors, before the CLI runs.
    setup_peak_anon: u64,
    max_upload_bytes: u64,
    raised_to: Option<u64>,
    /// The last `hypermnf run`'s own timing line: where its wall time went inside the process.
    cli_breakdown: Option<String>,
    /// The 1-minute load average before the timed runs and after each of them.
    load: Vec<Option<f64>>,
}

impl Report<'_> {
    fn floor(&self) -> f64 {
        self.read_floor.0.max(self.pcie_floor.map_or(0.0, |p| p.0))
    }

    fn json(&self) -> serde_json::Value {
        let mb = |b: u64| b as f64 / 1e6;
        let range = |s: (f64, f64, f64)| serde_json::json!([s.1, s.2]);
        serde_json::json!({
            "read_floor_ms": self.read_floor.0,
            "disk_floor_gbps": self.disk_floor_gbps,
            "pcie_floor_ms": self.pcie_floor.map(|p| p.0),
            "cli_ms": self.cli.0,
            "pipeline_ms": self.pipeline.0,
            "upload_gbps": self.upload_gbps.0,
            "after_upload_ms": self.after_upload.0,
            "peak_anon_rss_mb": mb(self.peak_anon),
            "max_upload_bytes": self.max_upload_bytes,
            "cli_peak_anon_rss_mb": mb(self.cli_peak_anon),
            "setup_peak_anon_rss_mb": mb(self.setup_peak_anon),
            "upload_limit_raised_to": self.raised_to,
            "lines": self.args.lines,
            "samples": SAMPLES,
            "bands": BANDS,
            "interleave": self.args.interleave.envi_name(),
            "dtype": self.args.dtype.name(),
            "backend": self.backend,
            "device": self.device,
            "file_bytes": self.file_bytes,
            "runs": self.args.runs,
            "load_average_1m": self.load,
            "cli_breakdown": self.cli_breakdown,
            "cli_over_floor": self.cli.0 / self.floor(),
            "after_upload_over_pipeline": self.after_upload.0 / self.pipeline.0,
            "min_max": {
                "read_floor_ms": range(self.read_floor),
                "pcie_floor_ms": self.pcie_floor.map(range),
                "cli_ms": range(self.cli),
                "pipeline_ms": range(self.pipeline),
                "upload_gbps": range(self.upload_gbps),
                "after_upload_ms": range(self.after_upload),
            },
        })
    }

    fn print(&self) {
        let a = self.args;
        let gpu = self.backend == "cuda";
        println!(
            "hypermnf bench flightline — {} x {SAMPLES} x {BANDS} {} {} ENVI ({:.2} GB), 10 components, backend {} ({}); median (min–max) of {} runs",
            a.lines,
            a.dtype.name(),
            a.interleave.envi_name(),
            self.file_bytes as f64 / 1e9,
            self.backend,
            self.device,
            a.runs
        );
        println!("| measure | median | min–max | goal (issue 29) |");
        println!("|---|---|---|---|");
        let ms = |name: &str, s: (f64, f64, f64), goal: &str| println!("| {name} | {:.1} ms | {:.1}–{:.1} ms | {goal} |", s.0, s.1, s.2);
        ms(
            "read floor: the file from the page cache, parallel 8 MiB preads",
            self.read_floor,
            "",
        );
        match self.pcie_floor {
            Some(p) => ms("PCIe floor: its bytes host → device, pinned", p, ""),
            None => println!("| PCIe floor | – (CPU backend) | | |"),
        }
        ms("`hypermnf run` warm (child process, map + MNF + write out.npy)", self.cli, "");
        if let Some(b) = &self.cli_breakdown {
            println!("| `hypermnf run`'s own timings (last run; the rest of its wall time is process start and exit) | {b} | | |");
        }
        ms("in-process pipeline: `cube::map` + `mnf::run`", self.pipeline, "");
        println!("| disk floor: 2 GB written and synced where the servers keep uploads | {:.2} GB/s | | |", self.disk_floor_gbps);
        let g = self.upload_gbps;
        println!(
            "| multipart ENVI upload, first byte to the answer | {:.2} GB/s | {:.2}–{:.2} GB/s | ≥ {} GB/s |",
            g.0,
            g.1,
            g.2,
            if gpu { "1.5" } else { "1" }
        );
        ms("upload's last byte until `succeeded` is seen", self.after_upload, "");
        println!(
            "| CLI / max(floors) | {:.2}x | | {} |",
            self.cli.0 / self.floor(),
            if gpu { "≤ 2x" } else { "" }
        );
        println!(
            "| last byte → succeeded / pipeline | {:.2}x | | ≤ {}x |",
            self.after_upload.0 / self.pipeline.0,
            if gpu { "2" } else { "1.3" }
        );
        let limit = match self.raised_to {
            Some(r) => format!(
                "{} bytes ({:.1} GiB; smaller than the upload, so the timed servers ran with {r})",
                self.max_upload_bytes,
                self.max_upload_bytes as f64 / (1u64 << 30) as f64
            ),
            None => format!(
                "{} bytes ({:.1} GiB)",
                self.max_upload_bytes,
                self.max_upload_bytes as f64 / (1u64 << 30) as f64
            ),
        };
        println!("| default upload limit (`/v1/info` max_upload_bytes) | {limit} | | ≥ 64 GiB (or the free space less 5 %) |");
        println!(
            "| peak anonymous RSS, in-process pipeline + server | {:.0} MB | | {} |",
            self.peak_anon as f64 / 1e6,
            if gpu { "" } else { "≤ 1500 MB" }
        );
        println!(
            "| peak anonymous RSS, `hypermnf run` children | {:.0} MB | | |",
            self.cli_peak_anon as f64 / 1e6
        );
        println!(
            "| peak anonymous RSS, writing the file and the floors | {:.0} MB | | |",
            self.setup_peak_anon as f64 / 1e6
        );
        let load: Vec<String> = self.load.iter().map(|l| l.map_or("?".to_string(), |v| format!("{v:.2}"))).collect();
        println!(
            "| 1-minute load average: before the timed runs, after each | {} | | |",
            load.join(" / ")
        );
    }
}
