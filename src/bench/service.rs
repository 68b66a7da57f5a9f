//! `hypermnf bench service`: the HTTP service over loopback with a synthetic 1087 × 614 × 224 int16
//! cube sent as `.npy` — upload ingest rate, job time, download rate, and the latency of a cache hit.
//!
//! The server runs in this process (the same code as `hypermnf serve`) on a temporary data dir; the
//! client is a minimal HTTP/1.1 client on std sockets in another thread, so that what is timed is the
//! server and the loopback, not a client library.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};

use crate::config::ServeArgs;
use crate::mnf::BackendChoice;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[arg(long, default_value_t = 1087)]
    pub lines: usize,
    #[arg(long, default_value_t = 614)]
    pub samples: usize,
    #[arg(long, default_value_t = 224)]
    pub bands: usize,
    #[arg(long, default_value_t = 10)]
    pub components: usize,
    /// Cache-hit requests timed for the latency percentiles.
    #[arg(long, default_value_t = 500)]
    pub cache_requests: usize,
    /// Backend of the server (auto: CUDA when a device is found).
    #[arg(long, default_value = "auto")]
    pub backend: BackendChoice,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    if args.cache_requests < 200 {
        bail!("--cache-requests must be at least 200 for a meaningful p99");
    }
    eprintln!("building the {} x {} x {} int16 cube ...", args.lines, args.samples, args.bands);
    let data_dir = std::env::temp_dir().join(format!("hypermnf-bench-service-{}", std::process::id()));
    let npy = synthetic_npy(args.lines, args.samples, args.bands, &data_dir)?;
    let sha = hex::encode(Sha256::digest(&npy));
    let rt = tokio::runtime::Runtime::new()?;
    let mut serve = ServeArgs::with_data_dir(&data_dir);
    serve.backend = args.backend;
    serve.max_upload_bytes = (npy.len() as u64).max(1 << 30) * 2;
    let server = rt.block_on(crate::api::start(serve))?;
    let addr = server.addr;
    let backend = server.ctx.runner.backends.default_backend();
    let (bname, device) = (backend.name(), backend.device());

    let result = measure(addr, &npy, &sha, args);
    rt.block_on(server.stop())?;
    drop(rt);
    let _ = std::fs::remove_dir_all(&data_dir);
    let m = result?;

    let gb = |b: usize, d: Duration| b as f64 / d.as_secs_f64() / 1e9;
    println!(
        "hypermnf bench service — {} x {} x {} int16 as .npy ({:.1} MB), {} components, backend {bname} ({device})",
        args.lines,
        args.samples,
        args.bands,
        npy.len() as f64 / 1e6,
        args.components
    );
    println!("| measure | value |");
    println!("|---|---|");
    println!("| upload, POST until 202 (streamed to disk with writeback on the way + fsync, one SHA-256 (also the content digest of a canonical .npy), job queued) | {:.3} s = {:.2} GB/s |", m.upload.as_secs_f64(), gb(npy.len(), m.upload));
    println!("| job, 202 until succeeded (polled every 10 ms) | {:.3} s |", m.job.as_secs_f64());
    println!("| download components .npy ({:.1} MB) | {:.3} s = {:.2} GB/s |", m.download_bytes as f64 / 1e6, m.download.as_secs_f64(), gb(m.download_bytes, m.download));
    println!("| cache hit, identical re-upload (whole body sent) | {:.3} s |", m.reupload.as_secs_f64());
    let (p50, p99, max) = percentiles(&m.hits);
    println!(
        "| cache hit with X-Content-SHA256 + Expect: 100-continue, {} requests | p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms |",
        m.hits.len(),
        p50 * 1e3,
        p99 * 1e3,
        max * 1e3
    );
    Ok(())
}

struct Measured {
    upload: Duration,
    job: Duration,
    download: Duration,
    download_bytes: usize,
    reupload: Duration,
    hits: Vec<f64>,
}

fn measure(addr: SocketAddr, npy: &[u8], sha: &str, args: &Args) -> anyhow::Result<Measured> {
    let path = format!("/v1/jobs?components={}", args.components);
    let t = Instant::now();
    let r = request(addr, "POST", &path, &[("content-type", "application/x-npy")], Some(npy), false)?;
    let upload = t.elapsed();
    if r.status != 202 {
        bail!("upload answered {}: {}", r.status, String::from_utf8_lossy(&r.body));
    }
    let job: serde_json::Value = serde_json::from_slice(&r.body)?;
    let id = job["id"].as_str().context("no job id")?.to_string();

    let t = Instant::now();
    loop {
        let r = request(addr, "GET", &format!("/v1/jobs/{id}"), &[], None, false)?;
        let j: serde_json::Value = serde_json::from_slice(&r.body)?;
        match j["status"].as_str() {
            Some("succeeded") => break,
            Some("queued") | Some("running") => std::thread::sleep(Duration::from_millis(10)),
            _ => bail!("the job ended {}", j),
        }
    }
    let job_time = t.elapsed();

    let t = Instant::now();
    let r = request(addr, "GET", &format!("/v1/jobs/{id}/result"), &[], None, false)?;
    let download = t.elapsed();
    if r.status != 200 {
        bail!("download answered {}", r.status);
    }

    let t = Instant::now();
    let again = request(addr, "POST", &path, &[("content-type", "application/x-npy")], Some(npy), false)?;
    let reupload = t.elapsed();
    if again.status != 200 {
        bail!("the identical upload answered {} instead of 200", again.status);
    }

    let mut hits = Vec::with_capacity(args.cache_requests);
    let headers = [("content-type", "application/x-npy"), ("x-content-sha256", sha), ("expect", "100-continue")];
    for i in 0..args.cache_requests + 10 {
        let t = Instant::now();
        let r = request(addr, "POST", &path, &headers, Some(npy), true)?;
        let took = t.elapsed().as_secs_f64();
        if r.status != 200 {
            bail!("cache hit answered {}", r.status);
        }
        if i >= 10 {
            hits.push(took); // the first ten warm the connection pool and caches
        }
    }
    Ok(Measured { upload, job: job_time, download, download_bytes: r.body.len(), reupload, hits })
}

fn percentiles(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| s[((s.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.99), *s.last().unwrap_or(&0.0))
}

struct Reply {
    status: u16,
    body: Vec<u8>,
}

/// One HTTP/1.1 request on a fresh connection. With `expect_continue`, the body is sent only if the
/// server answers `100 Continue`.
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    expect_continue: bool,
) -> anyhow::Result<Reply> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        head.push_str(&format!("content-length: {}\r\n", b.len()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    let mut reader = BufReader::with_capacity(1 << 20, s.try_clone()?);
    if let Some(b) = body {
        if expect_continue {
            let (status, headers) = read_head(&mut reader)?;
            if status != 100 {
                let (status, body) = read_rest(&mut reader, status, &headers)?;
                return Ok(Reply { status, body });
            }
        }
        s.write_all(b)?;
    }
    let (status, headers) = read_head(&mut reader)?;
    let (status, body) = read_rest(&mut reader, status, &headers)?;
    Ok(Reply { status, body })
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

fn read_rest(r: &mut impl BufRead, status: u16, headers: &HashMap<String, String>) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut body = Vec::new();
    if let Some(n) = headers.get("content-length") {
        body.resize(n.parse()?, 0);
        r.read_exact(&mut body)?;
    } else if headers.get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
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
