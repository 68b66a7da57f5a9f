//! The measurements of `hypermnf bench flightline` that need no server: the page-cache read floor,
//! the PCIe floor, `hypermnf run` as a child process, and the anonymous-memory pollers.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rayon::prelude::*;

/// Pieces of the parallel positioned reads of the read floor.
const READ_PIECE: usize = 8 << 20;
/// Pieces of the file copied to the device one after the other for the PCIe floor.
const PCIE_PIECE: usize = 512 << 20;
/// How often the pollers read `RssAnon`.
const POLL: Duration = Duration::from_millis(2);

/// `RssAnon` of process `pid` (None: this process) in bytes, from /proc/PID/status.
pub fn rss_anon(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".to_string(),
    };
    let status = std::fs::read_to_string(path).ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A thread that reads a process's `RssAnon` every 2 ms and keeps the largest value seen since the
/// last [`RssPoller::take`]; it stops when dropped.
pub struct RssPoller {
    pid: Option<u32>,
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssPoller {
    pub fn start(pid: Option<u32>) -> RssPoller {
        let peak = Arc::new(AtomicU64::new(rss_anon(pid).unwrap_or(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match rss_anon(pid) {
                    Some(v) => {
                        p.fetch_max(v, Ordering::Relaxed);
                    }
                    None if pid.is_some() => break, // the child has gone
                    None => {}
                }
                std::thread::sleep(POLL);
            }
        });
        RssPoller {
            pid,
            peak,
            stop,
            thread: Some(thread),
        }
    }

    /// The peak since the start or the last `take`, and a fresh start from the current value.
    pub fn take(&self) -> u64 {
        self.peak.swap(rss_anon(self.pid).unwrap_or(0), Ordering::Relaxed)
    }

    /// Stops the thread and returns the peak it saw.
    pub fn finish(mut self) -> u64 {
        self.halt();
        self.peak.load(Ordering::Relaxed)
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RssPoller {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The whole file read from the page cache, `runs` times after one untimed pass that warms the
/// cache: 8 MiB positioned reads on every core, each thread into its own buffer, reused (ms).
pub fn read_floor(path: &Path, runs: usize) -> anyhow::Result<Vec<f64>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata()?.len();
    let pieces = len.div_ceil(READ_PIECE as u64);
    let pass = || -> std::io::Result<()> {
        (0..pieces).into_par_iter().try_for_each_init(
            || vec![0u8; READ_PIECE],
            |buf, i| {
                let at = i * READ_PIECE as u64;
                let n = (len - at).min(READ_PIECE as u64) as usize;
                file.read_exact_at(&mut buf[..n], at)
            },
        )
    };
    pass()?;
    let mut out = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        pass()?;
        out.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(out)
}

/// The disk's durable write speed where the servers keep their uploads (GB/s): `bytes` written to a
/// new file in `dir` in 16 MiB writes, then `sync_data`, timed together. An upload is answered only
/// once its bytes are on the disk, so this bounds the service's ingest.
pub fn disk_floor(dir: &Path, bytes: u64) -> anyhow::Result<f64> {
    use std::io::Write;
    let path = dir.join("disk-floor.tmp");
    let buf: Vec<u8> = (0..16usize << 20).map(|i| (i * 131 % 251) as u8).collect();
    let t = Instant::now();
    let written = (|| -> std::io::Result<()> {
        let mut f = File::create(&path)?;
        let mut left = bytes;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            f.write_all(&buf[..n])?;
            left -= n as u64;
        }
        f.sync_data()
    })();
    let secs = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&path);
    written.with_context(|| format!("writing {}", path.display()))?;
    Ok(bytes as f64 / secs / 1e9)
}

/// The file's bytes copied host → device from page-locked memory, `runs` times (ms): the file in
/// 512 MiB pieces, each timed by the CUDA backend's own pinned-upload timer
/// ([`CudaBackend::time_upload`](crate::backend::cuda::CudaBackend::time_upload), after one untimed
/// copy), summed per run. Only one piece is in host memory at a time, never the whole cube; the
/// pinned buffer's allocation and fill are outside the timed copies.
pub fn pcie_floor(be: &crate::backend::cuda::CudaBackend, path: &Path, runs: usize) -> anyhow::Result<Vec<f64>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata()?.len();
    let mut totals = vec![0f64; runs];
    let mut buf = vec![0u8; PCIE_PIECE.min(len as usize)];
    let mut at = 0u64;
    while at < len {
        let n = (len - at).min(PCIE_PIECE as u64) as usize;
        file.read_exact_at(&mut buf[..n], at)?;
        for t in totals.iter_mut() {
            *t += be.time_upload(&buf[..n], 1, 1)?.0;
        }
        at += n as u64;
    }
    Ok(totals)
}

/// `hypermnf run HDR --out OUT --backend B --components 10` once, as a child process of the current
/// executable: (ms from the spawn to the exit, its largest `RssAnon` polled every 2 ms). Its stderr
/// goes to `log`.
pub fn cli(hdr: &Path, out: &Path, backend: &str, log: &Path) -> anyhow::Result<(f64, u64)> {
    let exe = std::env::current_exe().context("finding the current executable")?;
    let stderr = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let t = Instant::now();
    let mut child = Command::new(&exe)
        .arg("run")
        .arg(hdr)
        .arg("--out")
        .arg(out)
        .args(["--backend", backend, "--components", "10"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("starting {}", exe.display()))?;
    let poller = RssPoller::start(Some(child.id()));
    let status = child.wait()?;
    let took = t.elapsed().as_secs_f64() * 1e3;
    let peak = poller.finish();
    if !status.success() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        bail!("hypermnf run failed ({status}): {}", text.trim());
    }
    Ok((took, peak))
}

/// The 1-minute load average (/proc/loadavg): how busy the machine was around a measurement.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
