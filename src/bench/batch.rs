//! `hypermnf bench batch`: a campaign of N cubes (default 16 of the 1087 × 614 × 224 int16 benchmark
//! shape, 299 MB each) through the service in this process: sent as `.npy` uploads (four at a time, as
//! a client would), and named by reference in one `POST /v1/batches` (`"each"`, then `"pooled"`); the
//! jobs per second of each, and what the pooled statistics cost against one job.
//!
//! The cubes are files under the server's `--input-root` (`file://` references: the GPU hosts reach
//! no S3 server); each is the synthetic cube with one sample changed, so that every one has its own
//! content digest and none is answered from the job cache.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use super::service::{follow, request};
use crate::backend::devices::DeviceSelection;
use crate::config::ServeArgs;
use crate::mnf::BackendChoice;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Cubes in the campaign.
    #[arg(long, default_value_t = 16)]
    pub cubes: usize,
    #[command(flatten)]
    pub cube: super::CubeSize,
    /// Uploads in flight at once in the upload run.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Backend of the server (auto: CUDA when a device is found).
    #[arg(long, default_value = "auto")]
    pub backend: BackendChoice,
    /// CUDA devices of the server (`all`, or ordinals such as `0`).
    #[arg(long, default_value = "all")]
    pub devices: DeviceSelection,
    /// Server workers (jobs at once); default: two per device, at least two.
    #[arg(long)]
    pub workers: Option<u16>,
    /// Where the cubes are written (default: a directory under the system's temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Also write the figures as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    if args.cubes == 0 || args.concurrency == 0 {
        bail!("--cubes and --concurrency must be at least 1");
    }
    let work = args.dir.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("hypermnf-bench-batch-{}", std::process::id())));
    let (inputs, data_dir) = (work.join("inputs"), work.join("data"));
    std::fs::create_dir_all(&inputs)?;
    eprintln!("writing {} cubes of {} x {} x {} int16 ...", args.cubes, args.cube.lines, args.cube.samples, args.cube.bands);
    // Each run gets cubes of its own: a cube seen before would be answered from the job cache's
    // statistics level, and only projected.
    let files = write_cubes(args, &inputs, 3 * args.cubes + 2)?;
    let outcome = measure_all(args, &files, &inputs, &data_dir);
    let _ = std::fs::remove_dir_all(&work);
    outcome
}

/// The synthetic cube as `.npy`, written `count` times with its first sample changed (a distinct
/// content digest each).
fn write_cubes(args: &Args, dir: &Path, count: usize) -> anyhow::Result<Vec<PathBuf>> {
    let spec = crate::cube::synthetic::SyntheticSpec::small(args.cube.lines, args.cube.samples, args.cube.bands);
    let cube = crate::cube::synthetic::generate(&spec);
    let first = dir.join("cube-0000.npy");
    crate::cube::npy::write_cube(&first, &cube)?;
    let mut bytes = std::fs::read(&first)?;
    let offset = crate::cube::npy::read_header(&mut &bytes[..])?.data_offset as usize;
    let mut files = vec![first];
    for i in 1..count {
        bytes[offset] = bytes[offset].wrapping_add(1);
        let p = dir.join(format!("cube-{i:04}.npy"));
        std::fs::write(&p, &bytes)?;
        files.push(p);
    }
    Ok(files)
}

struct Rates {
    upload_s: f64,
    each_s: f64,
    pooled_s: f64,
    /// From the pooled batch's creation until its system was stored.
    pooled_statistics_s: f64,
    one_job_s: f64,
}

fn measure_all(args: &Args, files: &[PathBuf], inputs: &Path, data_dir: &Path) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let mut serve = ServeArgs::with_data_dir(data_dir);
    serve.backend = args.backend;
    serve.devices = args.devices.clone();
    serve.input_roots = vec![inputs.canonicalize()?];
    serve.max_upload_bytes = 64 << 30;
    let server = rt.block_on(async {
        // Workers follow the devices the server found.
        let probe = crate::api::start(serve.clone()).await?;
        let devices = probe.ctx.runner.backends.candidates(args.backend).len().max(1);
        probe.stop().await?;
        serve.workers = args.workers.unwrap_or((2 * devices).max(2) as u16);
        crate::api::start(serve.clone()).await
    })?;
    let addr = server.addr;
    let backend = server.ctx.runner.backends.default_backend();
    let (bname, device, workers) = (backend.name(), backend.device(), serve.workers);
    let devices = server.ctx.runner.backends.candidates(args.backend).len();
    let params = json!({"components": args.cube.components});
    let measured = (|| -> anyhow::Result<Rates> {
        // Warm-up: one job (device contexts, kernels), not timed; then one job alone, by reference.
        let (warm_up, one, sets) = (&files[0..1], &files[1..2], &files[2..]);
        let (uploads, each, pooled) = (&sets[..args.cubes], &sets[args.cubes..2 * args.cubes], &sets[2 * args.cubes..]);
        let id = post_batch(addr, warm_up, "each", &params)?;
        wait_batch(addr, &id, None)?;
        let t = Instant::now();
        let id = post_batch(addr, one, "each", &params)?;
        wait_batch(addr, &id, None)?;
        let one_job_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        upload_all(addr, uploads, args.concurrency, args.cube.components)?;
        let upload_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let id = post_batch(addr, each, "each", &params)?;
        wait_batch(addr, &id, None)?;
        let each_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let id = post_batch(addr, pooled, "pooled", &params)?;
        let mut system_at = None;
        wait_batch(addr, &id, Some((&mut system_at, t)))?;
        let pooled_s = t.elapsed().as_secs_f64();
        Ok(Rates { upload_s, each_s, pooled_s, pooled_statistics_s: system_at.unwrap_or(pooled_s), one_job_s })
    })();
    rt.block_on(server.stop())?;
    let r = measured?;
    let n = args.cubes as f64;
    let bytes = std::fs::metadata(&files[0])?.len() as f64 * n;
    println!(
        "backend {bname} ({device}), {devices} device(s), {workers} workers, {} cubes of {:.0} MB",
        args.cubes,
        bytes / n / 1e6
    );
    println!("| run | wall | jobs/s | GB/s of cubes |");
    println!("|---|---|---|---|");
    for (what, s) in [
        (format!("uploads (.npy, {} at a time)", args.concurrency), r.upload_s),
        ("batch by reference, each".to_string(), r.each_s),
        ("batch by reference, pooled".to_string(), r.pooled_s),
    ] {
        println!("| {what} | {s:.2} s | {:.2} | {:.2} |", n / s, bytes / s / 1e9);
    }
    println!(
        "pooled statistics (creation until the pooled system is stored): {:.2} s = {:.1}x one job ({:.3} s by reference)",
        r.pooled_statistics_s,
        r.pooled_statistics_s / r.one_job_s,
        r.one_job_s
    );
    if let Some(path) = &args.json {
        let v = json!({
            "backend": bname, "device": device, "devices": devices, "workers": workers, "cubes": args.cubes,
            "cube_bytes": bytes / n, "upload_jobs_per_s": n / r.upload_s, "each_jobs_per_s": n / r.each_s,
            "pooled_jobs_per_s": n / r.pooled_s, "pooled_statistics_s": r.pooled_statistics_s, "one_job_s": r.one_job_s,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&v)?)?;
    }
    Ok(())
}

fn post_batch(addr: SocketAddr, files: &[PathBuf], statistics: &str, params: &Value) -> anyhow::Result<String> {
    let inputs: Vec<Value> = files.iter().map(|f| json!({"href": format!("file://{}", f.canonicalize().unwrap_or(f.clone()).display())})).collect();
    let body = serde_json::to_vec(&json!({"inputs": inputs, "statistics": statistics, "params": params}))?;
    let r = request(addr, "POST", "/v1/batches", &[("content-type", "application/json")], Some(&body), false)?;
    if r.status != 201 {
        bail!("POST /v1/batches: {} {}", r.status, String::from_utf8_lossy(&r.body));
    }
    let v: Value = serde_json::from_slice(&r.body)?;
    Ok(v["id"].as_str().context("no batch id")?.to_string())
}

/// Polls the batch until it is finished (every 5 ms: the poll is a small fraction of a job); with
/// `system`, records when its pooled system became ready.
fn wait_batch(addr: SocketAddr, id: &str, mut system: Option<(&mut Option<f64>, Instant)>) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let r = request(addr, "GET", &format!("/v1/batches/{id}"), &[], None, false)?;
        let v: Value = serde_json::from_slice(&r.body)?;
        if let Some((at, t0)) = system.as_mut() {
            if at.is_none() && v["system_ready"] == true {
                **at = Some(t0.elapsed().as_secs_f64());
            }
        }
        match v["status"].as_str() {
            Some("succeeded") => return Ok(()),
            Some("failed" | "canceled") => bail!("batch {id}: {v}"),
            _ => {}
        }
        if Instant::now() > deadline {
            bail!("batch {id} did not finish in 30 minutes: {v}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Uploads every cube as a `.npy` body, `concurrency` at a time, each followed to `succeeded`.
fn upload_all(addr: SocketAddr, files: &[PathBuf], concurrency: usize, components: usize) -> anyhow::Result<()> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..concurrency)
            .map(|_| {
                scope.spawn(|| -> anyhow::Result<()> {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(f) = files.get(i) else { return Ok(()) };
                        let body = std::fs::read(f)?;
                        let r = request(
                            addr,
                            "POST",
                            &format!("/v1/jobs?components={components}"),
                            &[("content-type", "application/x-npy")],
                            Some(&body),
                            false,
                        )?;
                        if !(200..300).contains(&r.status) {
                            bail!("upload {}: {} {}", f.display(), r.status, String::from_utf8_lossy(&r.body));
                        }
                        let v: Value = serde_json::from_slice(&r.body)?;
                        follow(addr, v["id"].as_str().context("no job id")?)?;
                    }
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().map_err(|_| anyhow::anyhow!("an upload thread panicked"))?)
    })
}
