//! The service part of `hypermnf bench flightline`: the flight line sent to an in-process server
//! (the same code as `hypermnf serve`) as a multipart ENVI upload, header and data parts, the data
//! streamed from the file with `sendfile`; the rate of the upload and the time from its last byte to
//! `succeeded` (seen through a long poll). Each timed upload goes to a fresh server on a fresh data
//! dir, after one small warm-up job there, so that no run finds the job cache or the statistics of
//! an earlier one. The default upload limit is asked of a server started with the default settings
//! first. The HTTP client is `bench service`'s.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context};

use crate::bench::service::{follow, request, request_streamed, Reply};
use crate::config::ServeArgs;
use crate::mnf::BackendChoice;

const BOUNDARY: &str = "hypermnf-flightline-7d3c2a19e8b4";

/// One ENVI file: its header text and data file.
pub struct Envi<'a> {
    pub header: String,
    pub data: &'a Path,
}

impl Envi<'_> {
    fn parts(&self) -> anyhow::Result<(String, u64, String)> {
        let head = format!(
            "--{BOUNDARY}\r\ncontent-disposition: form-data; name=\"params\"\r\ncontent-type: application/json\r\n\r\n{{\"components\": 10}}\r\n\
             --{BOUNDARY}\r\ncontent-disposition: form-data; name=\"header\"; filename=\"flightline.hdr\"\r\ncontent-type: text/plain\r\n\r\n{}\r\n\
             --{BOUNDARY}\r\ncontent-disposition: form-data; name=\"data\"; filename=\"flightline.img\"\r\ncontent-type: application/octet-stream\r\n\r\n",
            self.header
        );
        let len = std::fs::metadata(self.data)
            .with_context(|| format!("reading {}", self.data.display()))?
            .len();
        Ok((head, len, format!("\r\n--{BOUNDARY}--\r\n")))
    }

    /// The whole request body's length.
    fn body_len(&self) -> anyhow::Result<u64> {
        let (head, len, tail) = self.parts()?;
        Ok(head.len() as u64 + len + tail.len() as u64)
    }
}

/// POSTs `envi` as a multipart upload (the data part sent from the file by `sendfile`) and follows
/// its job until it succeeded: (the reply, when the request started).
fn submit(addr: SocketAddr, envi: &Envi) -> anyhow::Result<(Reply, Instant)> {
    let (head, len, tail) = envi.parts()?;
    let file = std::fs::File::open(envi.data).with_context(|| format!("opening {}", envi.data.display()))?;
    let content_type = format!("multipart/form-data; boundary={BOUNDARY}");
    let mut send = |s: &mut TcpStream| -> std::io::Result<()> {
        s.write_all(head.as_bytes())?;
        sendfile_all(&file, s, len)?;
        s.write_all(tail.as_bytes())
    };
    let total = head.len() as u64 + len + tail.len() as u64;
    let t = Instant::now();
    let r = request_streamed(addr, "POST", "/v1/jobs", &[("content-type", &content_type)], total, &mut send)?;
    if r.status != 202 && r.status != 201 {
        bail!("the multipart upload answered {}: {}", r.status, String::from_utf8_lossy(&r.body));
    }
    let job: serde_json::Value = serde_json::from_slice(&r.body)?;
    if job["cached"] == true {
        bail!("the upload was answered by an existing job: {job}");
    }
    let id = job["id"].as_str().context("no job id")?.to_string();
    follow(addr, &id)?;
    Ok((r, t))
}

/// Sends the first `len` bytes of `file` to `s` with sendfile(2): from the page cache to the socket,
/// never through this process. The client shares the machine with the server it measures, so what
/// it spends is taken from the server: `std::io::copy` fell back to read and send here, and those two
/// copies took about a fifth of the 2-core machine's CPU during an upload (perf), which a client on
/// another machine does not take.
fn sendfile_all(file: &std::fs::File, s: &TcpStream, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut offset: libc::off_t = 0;
    while (offset as u64) < len {
        let left = (len - offset as u64).min(1 << 30) as usize;
        // SAFETY: both descriptors are open for the call, and `offset` is a valid off_t it updates.
        let n = unsafe { libc::sendfile(s.as_raw_fd(), file.as_raw_fd(), &mut offset, left) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the data file shrank while it was sent"));
        }
    }
    Ok(())
}

/// The servers of the timed uploads, one per [`Service::run_once`]; see the module doc.
pub struct Service<'a> {
    rt: tokio::runtime::Runtime,
    envi: &'a Envi<'a>,
    warm: &'a Envi<'a>,
    work: &'a Path,
    backend: BackendChoice,
    runs: usize,
    /// The effective upload limit of a server started with the default settings (`/v1/info`).
    pub max_upload_bytes: u64,
    /// The limit the timed servers are started with, where the default is too small for the file.
    pub raised_to: Option<u64>,
    pub device: String,
}

impl<'a> Service<'a> {
    /// Asks a server started with the default settings for its upload limit (`/v1/info`), and
    /// decides whether the timed servers need a larger one. `warm` is the small warm-up file, `work`
    /// the directory the servers' data dirs go in.
    pub fn new(envi: &'a Envi<'a>, warm: &'a Envi<'a>, work: &'a Path, backend: BackendChoice) -> anyhow::Result<Self> {
        let mut service = Service {
            rt: tokio::runtime::Runtime::new()?,
            envi,
            warm,
            work,
            backend,
            runs: 0,
            max_upload_bytes: 0,
            raised_to: None,
            device: String::new(),
        };
        let dir = work.join("server-defaults");
        let server = service.start(&dir)?;
        let info = request(server.addr, "GET", "/v1/info", &[], None, false);
        service.device = server.ctx.runner.backends.default_backend().device();
        service.rt.block_on(server.stop())?;
        let _ = std::fs::remove_dir_all(&dir);
        let info: serde_json::Value = serde_json::from_slice(&info?.body)?;
        service.max_upload_bytes = info["max_upload_bytes"].as_u64().context("/v1/info has no max_upload_bytes")?;
        let body_len = envi.body_len()?;
        if service.max_upload_bytes < body_len {
            service.raised_to = Some(body_len.saturating_mul(2).max(1 << 30));
        }
        Ok(service)
    }

    fn start(&self, dir: &Path) -> anyhow::Result<crate::api::Server> {
        let mut serve = ServeArgs::with_data_dir(dir);
        serve.backend = self.backend;
        if let Some(l) = self.raised_to {
            serve.max_upload_bytes = l;
        }
        self.rt.block_on(crate::api::start(serve))
    }

    /// One timed upload to a fresh server, after a warm-up job there: (the data file's bytes over the
    /// time from the request's first byte to the answer in GB/s, ms from the upload's last byte until
    /// `succeeded` is seen).
    pub fn run_once(&mut self) -> anyhow::Result<(f64, f64)> {
        self.runs += 1;
        let dir = self.work.join(format!("server-{}", self.runs));
        let server = self.start(&dir)?;
        let data_bytes = std::fs::metadata(self.envi.data)?.len();
        let measured = (|| -> anyhow::Result<(f64, f64)> {
            submit(server.addr, self.warm)?;
            let (r, t) = submit(server.addr, self.envi)?;
            let last = r.last_byte.context("the body was not sent")?;
            let after = last.elapsed().as_secs_f64() * 1e3;
            let upload = r.received.saturating_duration_since(t).as_secs_f64();
            Ok((data_bytes as f64 / upload / 1e9, after))
        })();
        self.rt.block_on(server.stop())?;
        let _ = std::fs::remove_dir_all(&dir);
        let (gbps, after) = measured?;
        eprintln!(
            "bench flightline: server run {}: upload {gbps:.2} GB/s, last byte to succeeded {after:.0} ms",
            self.runs
        );
        Ok((gbps, after))
    }
}
