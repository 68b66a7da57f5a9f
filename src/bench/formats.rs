//! `hypermnf bench formats` (feature `gdal`): one ~1 GB float32 cube as an ENVI BIL file, a
//! band-interleaved GeoTIFF and an EMIT-layout NetCDF-4 (zlib), made by
//! `scripts/bench/make_formats_cube.py` when missing; each read (`cube::map`) and reduced on the CPU
//! backend (k = 10), the median of `--repeat` runs, and the GDAL formats' job time against the ENVI
//! twin's (the goal: at most 1.3x).

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::backend::cpu::CpuBackend;
use crate::mnf::{self, MnfParams, Monitor};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Where the three files are (made there when missing).
    #[arg(long, default_value = "/tmp/hypermnf-bench-formats")]
    pub dir: PathBuf,
    /// Geometry of a cube made here: lines, samples, bands (1024 x 1024 x 256 float32 = 1.07 GB).
    #[arg(long, default_value_t = 1024)]
    pub lines: usize,
    #[arg(long, default_value_t = 1024)]
    pub samples: usize,
    #[arg(long, default_value_t = 256)]
    pub bands: usize,
    /// The Python that makes the files (numpy, GDAL's bindings, netCDF4).
    #[arg(long, default_value = "/usr/bin/python3")]
    pub python: String,
    /// Timed repetitions of each (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Time the reads alone, without the MNF (the job column is then the read): readers compared
    /// without the passes' share of a busy machine's noise.
    #[arg(long)]
    pub read_only: bool,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let files = [("ENVI BIL", "cube.hdr"), ("GeoTIFF", "cube.tif"), ("NetCDF-4 (EMIT)", "cube.nc")];
    if files.iter().any(|(_, f)| !args.dir.join(f).is_file()) {
        make(args)?;
    }
    let backend = CpuBackend::new();
    let params = MnfParams { components: Some(10), ..Default::default() };
    println!("{:<18} {:>10} {:>10} {:>10} {:>12}", "input", "file MB", "read s", "job s", "job / ENVI");
    let mut envi_job = None;
    for (name, file) in files {
        let path = args.dir.join(file);
        let size = std::fs::metadata(data_of(&path))?.len() as f64 / 1e6;
        let (mut reads, mut jobs) = (Vec::new(), Vec::new());
        for _ in 0..args.repeat.max(1) {
            let t = Instant::now();
            let cube = crate::cube::map(&path)?;
            let read = t.elapsed().as_secs_f64();
            if !args.read_only {
                mnf::run(&cube, &params, &backend, &Monitor::silent())?;
            }
            reads.push(read);
            jobs.push(t.elapsed().as_secs_f64());
        }
        // Which way the NetCDF array was read (the last repetition's): HDF5's direct chunk reads, or
        // GDAL and why (src/cube/gdal/hdf5_chunks.rs).
        let path_note = match crate::cube::gdal::last_read_path() {
            Some(crate::cube::gdal::ReadPath::DirectChunks) if file.ends_with(".nc") => Some("HDF5 direct chunk reads".to_string()),
            Some(crate::cube::gdal::ReadPath::Gdal(why)) if file.ends_with(".nc") => Some(format!("GDAL ({why})")),
            _ => None,
        };
        let (read, job) = (median(&mut reads), median(&mut jobs));
        let base = *envi_job.get_or_insert(job);
        if args.read_only {
            // The ENVI twin is mapped, not read: no ratio to it.
            println!("{name:<18} {size:>10.0} {read:>10.2} {job:>10.2} {:>12}", "-");
        } else {
            println!("{name:<18} {size:>10.0} {read:>10.2} {job:>10.2} {:>11.2}x", job / base);
        }
        if let Some(note) = path_note {
            println!("{:<18} read through {note}", "");
        }
    }
    Ok(())
}

fn data_of(path: &Path) -> PathBuf {
    if path.extension().is_some_and(|e| e == "hdr") {
        path.with_extension("img")
    } else {
        path.to_path_buf()
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn make(args: &Args) -> anyhow::Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bench/make_formats_cube.py");
    println!("making the cube in {} ({} x {} x {} float32)", args.dir.display(), args.lines, args.samples, args.bands);
    let t = Instant::now();
    let status = std::process::Command::new(&args.python)
        .arg(&script)
        .arg(&args.dir)
        .args([args.lines, args.samples, args.bands].map(|v| v.to_string()))
        .status()?;
    anyhow::ensure!(status.success(), "{} failed", script.display());
    println!("made in {:.1} s", t.elapsed().as_secs_f64());
    Ok(())
}
