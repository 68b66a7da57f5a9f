//! The `hypermnf` command: `serve` (the HTTP service), `run` (one cube from the command line),
//! `bench` (benchmark programs) and `info` (backends and devices).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "hypermnf", version, about = "Maximum Noise Fraction reduction of hyperspectral cubes, on the GPU or the CPU")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP service (SQLite and local storage in the data dir by default).
    Serve(hypermnf::config::ServeArgs),
    /// Reduce one cube from the command line, without a server.
    Run(RunArgs),
    /// Benchmark programs; their numbers go to BENCHMARKS.md.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
    /// Show the version, the backends and the devices found.
    Info,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// The CPU backend on a synthetic 1087 × 614 × 224 int16 cube.
    Cpu(hypermnf::bench::cpu::Args),
    /// The GPU backends side by side.
    Gpu(hypermnf::bench::gpu::Args),
    /// The eigen step (float64 generalized eigenproblem) by every solver, per band count.
    Eigen(hypermnf::bench::eigen::Args),
    /// The GPU hash table of the job cache.
    Hashtable(hypermnf::bench::hashtable::Args),
    /// The HTTP service over loopback.
    Service(hypermnf::bench::service::Args),
    /// A campaign of cubes through the service: uploads against one batch by reference, each and pooled.
    Batch(hypermnf::bench::batch::Args),
    /// A flight-line-shaped ENVI file (598 × N × 425) through the CLI, the pipeline and the service, against its floors.
    Flightline(hypermnf::bench::flightline::Args),
    /// A ~1 GB cube read through GDAL (GeoTIFF, EMIT NetCDF) against its ENVI twin (feature `gdal`).
    #[cfg(feature = "gdal")]
    Formats(hypermnf::bench::formats::Args),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Input cube: an ENVI header (.hdr, data file beside it), a NumPy array (.npy, shape (lines, samples,
    /// bands)), or with the `gdal` feature an EMIT NetCDF (.nc), NEON or PRISMA HDF5 (.h5, .he5) or a
    /// multi-band GeoTIFF (.tif).
    input: PathBuf,
    /// Number of components to keep (default 10).
    #[arg(long, conflicts_with = "snr")]
    components: Option<usize>,
    /// Keep the components whose eigenvalue is at least 1 + S.
    #[arg(long)]
    snr: Option<f64>,
    /// Noise estimator: mean-filter (default) or shift-difference.
    #[arg(long, default_value = "mean-filter")]
    noise: hypermnf::mnf::NoiseEstimator,
    /// Also write the inverse MNF (denoised cube) next to OUT as OUT-stem-denoised.
    #[arg(long)]
    inverse: bool,
    /// 0-based bands to exclude, comma-separated (e.g. 0,5,7).
    #[arg(long, value_delimiter = ',')]
    bad_bands: Vec<usize>,
    /// No-data value (overrides the header's `data ignore value`).
    #[arg(long, allow_hyphen_values = true)]
    ignore_value: Option<f64>,
    /// Compute the noise statistics only in columns x0..x1 and rows y0..y1 (end excluded).
    #[arg(long)]
    noise_window: Option<hypermnf::mnf::Window>,
    /// auto (CUDA if a device is found), cpu, cuda or cuda-cublas.
    #[arg(long, default_value = "auto")]
    backend: hypermnf::mnf::BackendChoice,
    /// CUDA devices: `all` or ordinals such as `0,2`. With several, a cube that does not fit the first
    /// device's memory is split over them by lines (ignored by the CPU backend).
    #[arg(long, env = "HYPERMNF_DEVICES", default_value = "all")]
    devices: hypermnf::backend::devices::DeviceSelection,
    /// Split the cube over the devices whatever its size, each computing a share of its lines.
    #[arg(long)]
    split_cube: bool,
    /// Output: OUT.npy (float32 (lines, samples, k)), OUT.hdr (ENVI float32 BSQ + OUT.img), or with the
    /// `gdal` feature OUT.tif (Cloud-Optimized GeoTIFF with the source's CRS).
    #[arg(long)]
    out: PathBuf,
    /// EMIT granules: write the COG on the granule's north-up grid by its geometry lookup table (GLT)
    /// instead of in sensor geometry (which has no CRS). Needs OUT.tif.
    #[arg(long)]
    ortho: bool,
    /// Project with the eigen system of this system file (`GET /v1/jobs/{id}/system`,
    /// `--export-system`) instead of computing one: only the projection runs. The cube must have the
    /// system's band count (and wavelengths, when both know them).
    #[arg(long, value_name = "FILE")]
    system: Option<PathBuf>,
    /// Also write the eigen system this run projected with, as a system file (JSON, arrays as .npy).
    #[arg(long, value_name = "FILE")]
    export_system: Option<PathBuf>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "hypermnf=info,tower_http=info".into()),
        )
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => tokio::runtime::Runtime::new()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(hypermnf::api::serve(args))),
        Command::Run(args) => run(args),
        Command::Bench { which } => match which {
            BenchCommand::Cpu(a) => hypermnf::bench::cpu::run(&a),
            BenchCommand::Gpu(a) => hypermnf::bench::gpu::run(&a),
            BenchCommand::Eigen(a) => hypermnf::bench::eigen::run(&a),
            BenchCommand::Hashtable(a) => hypermnf::bench::hashtable::run(&a),
            BenchCommand::Service(a) => hypermnf::bench::service::run(&a),
            BenchCommand::Batch(a) => hypermnf::bench::batch::run(&a),
            BenchCommand::Flightline(a) => hypermnf::bench::flightline::run(&a),
            #[cfg(feature = "gdal")]
            BenchCommand::Formats(a) => hypermnf::bench::formats::run(&a),
        },
        Command::Info => info(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hypermnf: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    use hypermnf::mnf::{MnfParams, Monitor, Stage};
    use std::sync::Mutex;
    use std::time::Instant;

    let mut params = MnfParams {
        components: args.components,
        snr: args.snr,
        noise: args.noise,
        inverse: args.inverse,
        bad_bands: args.bad_bands.clone(),
        ignore_value: args.ignore_value,
        noise_window: args.noise_window,
        backend: args.backend,
        statistics_from: None,
        statistics_sha256: None,
        ortho: args.ortho,
    };
    // Fail on a bad output name before the work, not after it.
    match args.out.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("npy") | Some("hdr") => {}
        Some("tif") | Some("tiff") if cfg!(feature = "gdal") => {}
        Some("tif") | Some("tiff") => {
            return Err(hypermnf::cube::needs_gdal(&args.out, hypermnf::cube::sniff::GdalFormat::Tiff).into())
        }
        _ => anyhow::bail!("--out must end in .npy, .hdr or .tif, not {}", args.out.display()),
    }
    if args.ortho && !matches!(args.out.extension().and_then(|e| e.to_str()), Some("tif" | "tiff" | "TIF" | "TIFF")) {
        anyhow::bail!("--ortho writes a GeoTIFF: --out must end in .tif");
    }
    // A bad system file is reported before any work.
    let given = match &args.system {
        Some(path) => {
            let file = hypermnf::mnf::system_file::SystemFile::load(path).map_err(|e| anyhow::anyhow!("--system: {e}"))?;
            params = file.apply_params(&params);
            Some(file)
        }
        None => None,
    };
    // The devices are opened (driver, context, kernels: the larger part of a short run) on a thread
    // of their own while the cube is mapped; a bad --devices list is reported before the cube is.
    let started = Instant::now();
    let (choice, devices, split) = (params.backend, args.devices.clone(), args.split_cube);
    let opening = std::thread::spawn(move || {
        let backend = run_backend(choice, &devices, split);
        (backend, started.elapsed().as_secs_f64() * 1e3)
    });
    let t = Instant::now();
    eprintln!("hypermnf: reading {}", args.input.display());
    // Mapped in the layout the file is stored in: a flight line is neither copied nor transposed here.
    let mapped = hypermnf::cube::map(&args.input);
    let read_ms = t.elapsed().as_secs_f64() * 1e3;
    let (backend, backend_ms) = opening.join().map_err(|_| anyhow::anyhow!("opening the devices panicked"))?;
    let backend = backend?;
    let cube = mapped?;
    eprintln!(
        "hypermnf: {} lines x {} samples x {} bands, {} ({:.0} ms)",
        cube.lines(),
        cube.samples(),
        cube.bands(),
        cube.dtype().name(),
        read_ms
    );
    eprintln!("hypermnf: backend {} on {} (ready in {backend_ms:.0} ms)", backend.name(), backend.device());
    if let Some(file) = &given {
        if let Some(why) = file.mismatch(cube.bands(), cube.meta.wavelength.as_deref(), params.components) {
            anyhow::bail!("--system {}: {why}", args.system.as_ref().expect("given").display());
        }
        params.validate(cube.lines(), cube.samples(), cube.bands())?;
        eprintln!("hypermnf: projecting with the system of {} ({} bands used)", args.system.as_ref().expect("given").display(), file.used());
    }

    // Progress to stderr: a line when a stage starts and at every further 25%.
    let last: Mutex<Option<(Stage, u32)>> = Mutex::new(None);
    let monitor = Monitor::new(move |stage, fraction| {
        let quarter = (fraction * 4.0).floor() as u32;
        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|(s, q)| s != stage || quarter > q) {
            eprintln!("hypermnf: {:<10} {:>3.0}%", stage.name(), fraction * 100.0);
            *last = Some((stage, quarter));
        }
    });
    let t = Instant::now();
    // A .npy of components is written while the projection computes them (as the service writes a
    // job's), instead of after it.
    let npy_out = args.out.extension().is_some_and(|e| e.eq_ignore_ascii_case("npy"));
    let mut ahead = npy_out.then(|| hypermnf::output::components_file::ComponentsFile::new(args.out.clone()));
    let (mut result, system) = {
        use hypermnf::mnf::pipeline::{analyse_on, apply_on_to, ComponentSink};
        let mut prepared = backend.prepare(&cube, &monitor)?;
        let mut timings = std::collections::BTreeMap::new();
        let system = match given {
            Some(file) => file.system,
            None => analyse_on(&cube, &params, prepared.as_mut(), &monitor, &mut timings)?,
        };
        let sink = ahead.as_mut().map(|f| f as &mut dyn ComponentSink);
        let projected = apply_on_to(&cube, &params, &system, backend.as_ref(), prepared.as_mut(), &monitor, timings, sink);
        if let Some(e) = ahead.as_mut().and_then(|f| f.take_error()) {
            return Err(anyhow::Error::new(e).context(format!("writing {}", args.out.display())));
        }
        (projected?, system)
    };
    let pipeline_ms = t.elapsed().as_secs_f64() * 1e3;
    result.metadata.timings_ms.insert("read".into(), read_ms);
    let t = Instant::now();
    let written = ahead.as_ref().is_some_and(|f| f.complete());
    let files = write_output(&args, &result, &cube, written)?;
    let write_ms = t.elapsed().as_secs_f64() * 1e3;
    let md = &result.metadata;
    let top: Vec<String> = md.eigenvalues.iter().take(5).map(|v| format!("{v:.4}")).collect();
    eprintln!(
        "hypermnf: kept {} of {} components (bands used {}, dropped {}); eigenvalues {} ...",
        result.k,
        md.eigenvalues.len(),
        md.bands_used.len(),
        md.dropped_bands.len(),
        top.join(", ")
    );
    eprintln!("hypermnf: wrote {} and {}", files.components.display(), files.metadata.display());
    if let Some(d) = &files.denoised {
        eprintln!("hypermnf: wrote {}", d.display());
    }
    if let Some(path) = &args.export_system {
        use hypermnf::mnf::system_file::{Source, SystemFile};
        let file = SystemFile::of_run(Source::Run(args.input.display().to_string()), &result.metadata, &system);
        file.save(path)?;
        eprintln!("hypermnf: wrote the eigen system to {}", path.display());
    }
    // One line that `bench flightline` reads (the rest of a run's wall time is the process itself).
    eprintln!(
        "hypermnf: timings: devices {backend_ms:.1} ms, map {read_ms:.1} ms, pipeline {pipeline_ms:.1} ms, write {write_ms:.1} ms, in process {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

/// Writes the result of `hypermnf run` (on the GLT's grid with `--ortho`).
/// `written`: a `.npy` OUT already holds the components (written during the projection).
fn write_output(
    args: &RunArgs,
    result: &hypermnf::mnf::MnfOutput,
    cube: &hypermnf::cube::Cube,
    written: bool,
) -> anyhow::Result<hypermnf::output::WrittenFiles> {
    use anyhow::Context;
    let outcome = if args.ortho {
        #[cfg(feature = "gdal")]
        {
            let glt = hypermnf::output::cog::ortho_grid(&args.input, &cube.meta, cube.lines(), cube.samples())?;
            hypermnf::output::write_result_ortho(&args.out, result, &cube.meta, Some(&glt))
        }
        #[cfg(not(feature = "gdal"))]
        {
            Err(hypermnf::cube::needs_gdal(&args.out, hypermnf::cube::sniff::GdalFormat::Tiff))
        }
    } else {
        hypermnf::output::write_result_with(&args.out, result, &cube.meta, written)
    };
    outcome.with_context(|| format!("writing {}", args.out.display()))
}

/// The backend of `hypermnf run`: one device, or with several a split backend (every cube with
/// `--split-cube`, else only a cube too large for the first device).
fn run_backend(
    choice: hypermnf::mnf::BackendChoice,
    devices: &hypermnf::backend::devices::DeviceSelection,
    split_cube: bool,
) -> anyhow::Result<std::sync::Arc<dyn hypermnf::backend::Backend>> {
    use hypermnf::backend::split::{SplitBackend, SplitMode};
    let mut all = hypermnf::backend::devices::select_devices(choice, devices)?;
    if all.len() == 1 {
        if split_cube {
            eprintln!("hypermnf: one device: --split-cube has nothing to split over");
        }
        return Ok(all.remove(0));
    }
    let mode = if split_cube { SplitMode::Always } else { SplitMode::WhenTooLarge };
    Ok(std::sync::Arc::new(SplitBackend::new(all, mode)?))
}

fn info() -> anyhow::Result<()> {
    use hypermnf::backend::cuda::{device_count, CudaBackend, Route};
    use hypermnf::backend::Backend;
    println!("hypermnf {}", env!("CARGO_PKG_VERSION"));
    println!("cpu: {}", hypermnf::backend::cpu::CpuBackend::new().device());
    match device_count() {
        Ok(0) => println!("cuda: unavailable (the driver reports no device)"),
        Ok(n) => {
            println!("cuda: {n} device{}", if n == 1 { "" } else { "s" });
            for d in 0..n {
                match CudaBackend::on_device(d, Route::Kernels) {
                    Ok(b) => match b.memory_in_use() {
                        Some((used, total)) => println!(
                            "cuda {d}: {} ({:.1} GiB, {:.1} GiB in use)",
                            b.device(),
                            total as f64 / (1u64 << 30) as f64,
                            used as f64 / (1u64 << 30) as f64
                        ),
                        None => println!("cuda {d}: {}", b.device()),
                    },
                    Err(e) => println!("cuda {d}: unavailable ({e})"),
                }
            }
        }
        Err(e) => println!("cuda: unavailable ({e})"),
    }
    Ok(())
}
