//! `hypermnf bench service`: the HTTP service over loopback with a synthetic 1087 × 614 × 224 int16
//! cube sent as `.npy` — upload ingest rate, the time from the upload's last byte to a visible
//! `succeeded` (seen through a long poll, so no poll interval is counted; after one small warm-up job),
//! where that time goes (the
//! server's `/metrics` before and after the job), a statistics-level re-projection (the cube named by
//! `X-Cube-Digest`, run on the device without its body when the server still holds it; and with the
//! body sent again), the download rate,
//! the latency of a cache hit, the peak RSS, and the same MNF run in-process on the same backend.
//!
//! The server runs in this process (the same code as `hypermnf serve`) on a temporary data dir; the
//! client is a minimal HTTP/1.1 client on std sockets in another thread, so that what is timed is the
//! server and the loopback, not a client library.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::config::ServeArgs;
use crate::cube::Cube;
use crate::mnf::{BackendChoice, MnfParams, Monitor};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub cube: super::CubeSize,
    /// Cache-hit requests timed for the latency percentiles.
    #[arg(long, default_value_t = 500)]
    pub cache_requests: usize,
    /// In-process pipeline runs timed (after one warm-up run); the median is reported.
    #[arg(long, default_value_t = 5)]
    pub pipeline_runs: usize,
    /// Backend of the server (auto: CUDA when a device is found).
    #[arg(long, default_value = "auto")]
    pub backend: BackendChoice,
    /// Also write the figures as JSON (keys upload_gbps, after_upload_ms, pipeline_ms,
    /// reprojection_ms, download_gbps, peak_rss_mb, and the breakdown).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    if args.cache_requests < 200 {
        bail!("--cache-requests must be at least 200 for a meaningful p99");
    }
    if args.pipeline_runs == 0 {
        bail!("--pipeline-runs must be at least 1");
    }
    eprintln!("building the {} x {} x {} int16 cube ...", args.cube.lines, args.cube.samples, args.cube.bands);
    let data_dir = std::env::temp_dir().join(format!("hypermnf-bench-service-{}", std::process::id()));
    let npy = synthetic_npy(args.cube.lines, args.cube.samples, args.cube.bands, &data_dir)?;
    // What the Python client sends: the cube's content digest (the body is a canonical .npy).
    let digest = hex::encode(crate::cube::digest::of_parts(&[&npy]));
    let rss_before = super::peak_rss().unwrap_or(0);
    let rt = tokio::runtime::Runtime::new()?;
    let mut serve = ServeArgs::with_data_dir(&data_dir);
    serve.backend = args.backend;
    serve.max_upload_bytes = (npy.len() as u64).max(1 << 30) * 2;
    let server = rt.block_on(crate::api::start(serve))?;
    let addr = server.addr;
    let backend = server.ctx.runner.backends.default_backend();
    let (bname, device) = (backend.name(), backend.device());

    let result = measure(addr, &npy, &digest, args);
    let peak_rss = super::peak_rss().unwrap_or(0);
    rt.block_on(server.stop())?;
    drop(rt);
    let _ = std::fs::remove_dir_all(&data_dir);
    let m = result?;

    // The same MNF in this process, on the same backend object, from the cube in memory: what the
    // service adds is the difference.
    eprintln!("timing the in-process pipeline ({} runs) ...", args.pipeline_runs);
    let cube_mb = npy.len() as f64 / 1e6;
    let cube = crate::cube::npy::read_from(&mut std::io::Cursor::new(&npy[..]), npy.len() as u64, std::path::Path::new("bench.npy"))?;
    // The same cube as the service holds it: a stored .npy, mapped (what a job reads).
    let stored = std::env::temp_dir().join(format!("hypermnf-bench-service-{}.npy", std::process::id()));
    std::fs::File::create(&stored).and_then(|mut f| {
        f.write_all(&npy)?;
        f.sync_all()
    })?;
    drop(npy);
    let params = MnfParams { components: Some(args.cube.components), ..Default::default() };
    let runs = time_pipeline(args.pipeline_runs, backend.as_ref(), &params, &|| Ok(Cow::Borrowed(&cube)))?;
    let (pipeline_ms, _, _) = percentiles(&runs);
    drop(cube);
    // Mapped anew for each run, as each job maps its upload.
    let mapped_runs = time_pipeline(args.pipeline_runs, backend.as_ref(), &params, &|| Ok(Cow::Owned(crate::cube::npy::map(&stored)?)));
    let _ = std::fs::remove_file(&stored);
    let mapped_runs = mapped_runs?;
    let (mapped_ms, _, _) = percentiles(&mapped_runs);

    let gb = |b: usize, d: Duration| b as f64 / d.as_secs_f64() / 1e9;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "hypermnf bench service — {} x {} x {} int16 as .npy ({:.1} MB), {} components, backend {bname} ({device})",
        args.cube.lines, args.cube.samples, args.cube.bands, cube_mb, args.cube.components
    );
    println!("| measure | value |");
    println!("|---|---|");
    println!("| upload, POST until 202 (streamed to disk with writeback on the way + fsync, the content digest hashed as a tree on every core, job queued) | {:.3} s = {:.2} GB/s |", m.upload.as_secs_f64(), gb(m.upload_bytes, m.upload));
    println!("| last byte of the upload until 202 | {:.1} ms |", ms(m.last_byte_to_202));
    println!("| **last byte of the upload until `succeeded` is seen** (long poll `?wait=`) | {:.1} ms |", ms(m.after_upload));
    println!("| in-process pipeline, same backend, cube in memory (median of {}) | {:.1} ms |", runs.len(), pipeline_ms);
    println!("| in-process pipeline, cube mapped from a stored .npy as a job maps it (median of {}) | {:.1} ms |", mapped_runs.len(), mapped_ms);
    println!("| ratio service / pipeline | {:.1}x |", ms(m.after_upload) / pipeline_ms);
    let parts = m.breakdown.iter().map(|(k, v)| format!("{k} {v:.1}")).collect::<Vec<_>>().join(", ");
    println!("| where the job's time went (server /metrics, ms) | {parts} |");
    println!(
        "| statistics-level re-projection ({} components), X-Cube-Digest + Expect: 100-continue, request until `succeeded` is seen ({}; the job's stages, ms: {}) | {:.1} ms |",
        args.cube.components + 4,
        if m.reprojection_without_body { "run on the resident cube, body never sent" } else { "body sent" },
        m.reprojection_stages,
        ms(m.reprojection)
    );
    println!("| statistics-level re-projection ({} components), body sent again, last byte until `succeeded` | {:.1} ms |", args.cube.components + 2, ms(m.reprojection_resent));
    println!(
        "| download components .npy ({:.1} MB), median of 5 (the first) | {:.3} s = {:.2} GB/s ({:.3} s = {:.2} GB/s) |",
        m.download_bytes as f64 / 1e6,
        m.download.as_secs_f64(),
        gb(m.download_bytes, m.download),
        m.download_first.as_secs_f64(),
        gb(m.download_bytes, m.download_first)
    );
    println!("| cache hit, identical re-upload (whole body sent) | {:.3} s |", m.reupload.as_secs_f64());
    let (p50, p99, max) = percentiles(&m.hits);
    println!(
        "| cache hit with X-Cube-Digest + Expect: 100-continue, {} requests | p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms |",
        m.hits.len(),
        p50 * 1e3,
        p99 * 1e3,
        max * 1e3
    );
    println!(
        "| peak RSS of this process (server + the client's copy of the .npy) | {:.0} MB (before the server: {:.0} MB) |",
        peak_rss as f64 / 1e6,
        rss_before as f64 / 1e6
    );
    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "backend": bname,
            "device": device,
            "shape": [args.cube.lines, args.cube.samples, args.cube.bands],
            "components": args.cube.components,
            "cube_mb": cube_mb,
            "upload_gbps": gb(m.upload_bytes, m.upload),
            "last_byte_to_202_ms": ms(m.last_byte_to_202),
            "after_upload_ms": ms(m.after_upload),
            "pipeline_ms": pipeline_ms,
            "pipeline_mapped_ms": mapped_ms,
            "reprojection_ms": ms(m.reprojection),
            "reprojection_without_body": m.reprojection_without_body,
            "reprojection_stages_ms": m.reprojection_stages,
            "reprojection_resent_ms": ms(m.reprojection_resent),
            "download_gbps": gb(m.download_bytes, m.download),
            "download_first_gbps": gb(m.download_bytes, m.download_first),
            "peak_rss_mb": peak_rss as f64 / 1e6,
            "rss_before_server_mb": rss_before as f64 / 1e6,
            "cache_hit_p50_ms": p50 * 1e3,
            "cache_hit_p99_ms": p99 * 1e3,
            "breakdown_ms": m.breakdown.iter().cloned().collect::<serde_json::Map<String, serde_json::Value>>(),
        });
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

struct Measured {
    upload: Duration,
    upload_bytes: usize,
    last_byte_to_202: Duration,
    after_upload: Duration,
    breakdown: Vec<(String, serde_json::Value)>,
    /// By X-Cube-Digest, end to end; whether the server ran it without the body; with the body sent again.
    reprojection: Duration,
    reprojection_without_body: bool,
    /// The re-projection job's own `timings_ms` (ms per stage).
    reprojection_stages: serde_json::Value,
    reprojection_resent: Duration,
    /// The median of five downloads, and the first of them (which also pays for this client's first
    /// allocation of a buffer of that size: page faults and zeroing).
    download: Duration,
    download_first: Duration,
    download_bytes: usize,
    reupload: Duration,
    hits: Vec<f64>,
}

/// Posts `npy` with `query` and follows the job with long polls until it succeeded: (time of the
/// POST, time from the last byte to the 202, time from the last byte to `succeeded` seen, job id).
fn submit_and_follow(addr: SocketAddr, npy: &[u8], query: &str) -> anyhow::Result<(Duration, Duration, Duration, String)> {
    let t = Instant::now();
    let r = request(addr, "POST", &format!("/v1/jobs?{query}"), &[("content-type", "application/x-npy")], Some(npy), false)?;
    let upload = t.elapsed();
    if r.status != 202 {
        bail!("upload answered {}: {}", r.status, String::from_utf8_lossy(&r.body));
    }
    let last = r.last_byte.context("the body was not sent")?;
    let to_202 = r.received.saturating_duration_since(last);
    let job: serde_json::Value = serde_json::from_slice(&r.body)?;
    let id = job["id"].as_str().context("no job id")?.to_string();
    follow(addr, &id)?;
    Ok((upload, to_202, last.elapsed(), id))
}

/// Long polls job `id` until it succeeded.
pub(super) fn follow(addr: SocketAddr, id: &str) -> anyhow::Result<()> {
    loop {
        let r = request(addr, "GET", &format!("/v1/jobs/{id}?wait=50"), &[], None, false)?;
        let j: serde_json::Value = serde_json::from_slice(&r.body)?;
        match j["status"].as_str() {
            Some("succeeded") => return Ok(()),
            Some("queued") | Some("running") => continue,
            _ => bail!("the job ended {}", j),
        }
    }
}

/// One warm-up run of the pipeline, then `runs` timed ones (ms); `cube_for_run`, timed too, gives each
/// run its cube.
fn time_pipeline<'a>(
    runs: usize,
    backend: &dyn crate::backend::Backend,
    params: &MnfParams,
    cube_for_run: &dyn Fn() -> anyhow::Result<Cow<'a, Cube>>,
) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::with_capacity(runs);
    for i in 0..=runs {
        let t = Instant::now();
        let cube = cube_for_run()?;
        crate::mnf::pipeline::run(&cube, params, backend, &Monitor::silent())?;
        if i > 0 {
            out.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(out)
}

/// The server's `hypermnf_job_phase_seconds_sum` and `hypermnf_stage_seconds_sum` series, in seconds.
fn phase_sums(addr: SocketAddr) -> anyhow::Result<HashMap<String, f64>> {
    let r = request(addr, "GET", "/metrics", &[], None, false)?;
    let text = String::from_utf8_lossy(&r.body);
    let mut out = HashMap::new();
    for line in text.lines() {
        for (prefix, label) in [("hypermnf_job_phase_seconds_sum{phase=\"", "phase"), ("hypermnf_stage_seconds_sum{stage=\"", "stage")] {
            if let Some(rest) = line.strip_prefix(prefix) {
                if let Some((name, value)) = rest.split_once("\"} ") {
                    out.insert(format!("{label}:{name}"), value.trim().parse().unwrap_or(0.0));
                }
            }
        }
    }
    Ok(out)
}

fn measure(addr: SocketAddr, npy: &[u8], digest: &str, args: &Args) -> anyhow::Result<Measured> {
    let query = format!("components={}", args.cube.components);
    // A server that has run a job before: the first job of a process also pays for lazy set-up (the
    // CUDA kernels' first launches, cuSOLVER's workspace), which a running service has behind it.
    let warm_up = synthetic_npy(64.min(args.cube.lines), args.cube.samples, args.cube.bands, &std::env::temp_dir())?;
    submit_and_follow(addr, &warm_up, &query)?;
    drop(warm_up);
    let before = phase_sums(addr)?;
    let (upload, last_byte_to_202, after_upload, id) = submit_and_follow(addr, npy, &query)?;
    let after = phase_sums(addr)?;
    // The phases in the order a job goes through them, the pipeline's stages inside `compute`.
    let order = [
        "phase:queued", "stage:read", "stage:statistics", "stage:eigen", "stage:projection", "stage:inverse", "stage:write",
        "phase:compute", "phase:store", "phase:register", "phase:record",
    ];
    let breakdown = order
        .iter()
        .filter_map(|k| {
            let d = (after.get(*k).copied().unwrap_or(0.0) - before.get(*k).copied().unwrap_or(0.0)) * 1e3;
            (d > 0.0).then(|| (k.split_once(':').map_or(*k, |x| x.1).to_string(), serde_json::json!((d * 10.0).round() / 10.0)))
        })
        .collect();

    // Other components of the same cube: the eigen system is in the job cache, only the projection runs.
    let (_, _, reprojection_resent, _) = submit_and_follow(addr, npy, &format!("components={}", args.cube.components + 2))?;
    // Other components again, the cube named by X-Cube-Digest (as the Python client names an array)
    // with `Expect: 100-continue`: a server that still holds the cube on its device runs the job at
    // once and answers 201, already succeeded, and the body is never sent. Timed end to end, from
    // the request's first byte until `succeeded` is seen.
    let t = Instant::now();
    let headers = [("content-type", "application/x-npy"), ("x-cube-digest", digest), ("expect", "100-continue")];
    let r = request(addr, "POST", &format!("/v1/jobs?components={}", args.cube.components + 4), &headers, Some(npy), true)?;
    let job: serde_json::Value = serde_json::from_slice(&r.body)?;
    let reprojection_without_body = r.status == 201 && job["status"] == "succeeded";
    let reprojection_id = job["id"].as_str().context("no job id")?;
    if !reprojection_without_body {
        if r.status != 202 {
            bail!("the re-projection by digest answered {}: {job}", r.status);
        }
        follow(addr, reprojection_id)?;
    }
    let reprojection = t.elapsed();
    // What the job itself reports of its stages (its metadata's `timings_ms`).
    let md = request(addr, "GET", &format!("/v1/jobs/{reprojection_id}/metadata"), &[], None, false)?;
    let reprojection_stages = serde_json::from_slice::<serde_json::Value>(&md.body)?["timings_ms"].clone();

    // The median of five: one 27 MB transfer takes ~12-25 ms, within which a scheduling hiccup shows.
    // The first one also pays for the client's fresh 27 MB buffer (0.41-1.2 GB/s against 2.2 for the
    // median on the H100 host); the others read into the same buffer again, as a client that
    // streams into its own array does (a fresh zeroed buffer each time put a 27 MB memset and its page
    // faults into every figure: the client's cost, not the service's). Both are reported.
    let mut downloads = Vec::with_capacity(5);
    let mut buf = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let got = request_into(addr, "GET", &format!("/v1/jobs/{id}/result"), &[], None, false, buf)?;
        downloads.push(t.elapsed());
        if got.status != 200 {
            bail!("download answered {}", got.status);
        }
        buf = got.body;
    }
    let download_bytes = buf.len();
    let download_first = downloads[0];
    downloads.sort();
    let download = downloads[downloads.len() / 2];

    let t = Instant::now();
    let again = request(addr, "POST", &format!("/v1/jobs?{query}"), &[("content-type", "application/x-npy")], Some(npy), false)?;
    let reupload = t.elapsed();
    if again.status != 200 {
        bail!("the identical upload answered {} instead of 200", again.status);
    }

    let mut hits = Vec::with_capacity(args.cache_requests);
    for i in 0..args.cache_requests + 10 {
        let t = Instant::now();
        let r = request(addr, "POST", &format!("/v1/jobs?{query}"), &headers, Some(npy), true)?;
        let took = t.elapsed().as_secs_f64();
        if r.status != 200 {
            bail!("cache hit answered {}", r.status);
        }
        if i >= 10 {
            hits.push(took); // the first ten warm the connection pool and caches
        }
    }
    Ok(Measured {
        upload,
        upload_bytes: npy.len(),
        last_byte_to_202,
        after_upload,
        breakdown,
        reprojection,
        reprojection_without_body,
        reprojection_stages,
        reprojection_resent,
        download,
        download_first,
        download_bytes,
        reupload,
        hits,
    })
}

fn percentiles(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| s[((s.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.99), *s.last().unwrap_or(&0.0))
}

pub(super) struct Reply {
    pub(super) status: u16,
    pub(super) body: Vec<u8>,
    /// When the last byte of the body was handed to the socket (None: no body sent).
    pub(super) last_byte: Option<Instant>,
    /// When the answer's head had been read.
    pub(super) received: Instant,
}

/// Writes a request body of a known length to the socket (a file streamed from disk).
pub(super) type SendBody<'a> = &'a mut dyn FnMut(&mut TcpStream) -> std::io::Result<()>;

/// One HTTP/1.1 request on a fresh connection. With `expect_continue`, the body is sent only if the
/// server answers `100 Continue`.
pub(super) fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    expect_continue: bool,
) -> anyhow::Result<Reply> {
    request_into(addr, method, path, headers, body, expect_continue, Vec::new())
}

/// [`request`], reading the answer's body into `buf` (whose pages are reused when it already has the
/// answer's length, as a client streaming into its own array would).
fn request_into(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    expect_continue: bool,
    buf: Vec<u8>,
) -> anyhow::Result<Reply> {
    match body {
        Some(b) => exchange(addr, method, path, headers, Some((b.len() as u64, &mut |s: &mut TcpStream| s.write_all(b))), expect_continue, buf),
        None => exchange(addr, method, path, headers, None, expect_continue, buf),
    }
}

/// [`request`] with a body of `len` bytes that `send` writes to the socket, without holding it in
/// memory (a multi-GB file).
pub(super) fn request_streamed(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    len: u64,
    send: SendBody<'_>,
) -> anyhow::Result<Reply> {
    exchange(addr, method, path, headers, Some((len, send)), false, Vec::new())
}

/// The exchange behind [`request_into`] and [`request_streamed`]: `body` is the length and the writer
/// of the request body.
fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<(u64, SendBody<'_>)>,
    expect_continue: bool,
    buf: Vec<u8>,
) -> anyhow::Result<Reply> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some((len, _)) = &body {
        head.push_str(&format!("content-length: {len}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    let mut reader = BufReader::with_capacity(1 << 20, s.try_clone()?);
    let mut last_byte = None;
    if let Some((_, send)) = body {
        if expect_continue {
            let (status, headers) = read_head(&mut reader)?;
            if status != 100 {
                let received = Instant::now();
                let (status, body) = read_rest(&mut reader, status, &headers, buf)?;
                return Ok(Reply { status, body, last_byte: None, received });
            }
        }
        send(&mut s)?;
        last_byte = Some(Instant::now());
    }
    let (status, headers) = read_head(&mut reader)?;
    let received = Instant::now();
    let (status, body) = read_rest(&mut reader, status, &headers, buf)?;
    Ok(Reply { status, body, last_byte, received })
}

fn read_head(r: &mut impl BufRead) -> anyhow::Result<(u16, HashMap<String, String>)> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line.split_whitespace().nth(1).context("no status line")?.parse()?;
    let mut headers = HashMap::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    Ok((status, headers))
}

fn read_rest(r: &mut impl BufRead, status: u16, headers: &HashMap<String, String>, mut body: Vec<u8>) -> anyhow::Result<(u16, Vec<u8>)> {
    if let Some(n) = headers.get("content-length") {
        let n: usize = n.parse()?;
        if body.len() != n {
            body.clear();
            body.resize(n, 0);
        }
        r.read_exact(&mut body)?;
    } else if headers.get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        body.clear();
        loop {
            let mut line = String::new();
            r.read_line(&mut line)?;
            let n = usize::from_str_radix(line.trim().split(';').next().unwrap_or("0"), 16)?;
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk)?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        body.clear();
        r.read_to_end(&mut body)?;
    }
    Ok((status, body))
}

/// The synthetic int16 cube (5-dimensional signal plus white noise) as `.npy` bytes, written by the
/// project's own `.npy` writer.
fn synthetic_npy(lines: usize, samples: usize, bands: usize, dir: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    let spec = crate::cube::synthetic::SyntheticSpec::small(lines, samples, bands);
    let cube = crate::cube::synthetic::generate(&spec);
    std::fs::create_dir_all(dir)?;
    let p = dir.join("bench-input.npy");
    crate::cube::npy::write_cube(&p, &cube)?;
    let bytes = std::fs::read(&p)?;
    std::fs::remove_file(&p)?;
    Ok(bytes)
}
