//! Benchmark programs (`hypermnf bench ...`): numbers for BENCHMARKS.md, never timed tests.
pub mod batch;
pub mod cpu;
pub mod eigen;
pub mod flightline;
#[cfg(feature = "gdal")]
pub mod formats;
pub mod gpu;
pub mod hashtable;
pub mod service;

/// Peak resident set size of this process in bytes (Linux `VmHWM`), if known.
pub(crate) fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
