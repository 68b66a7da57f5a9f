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

/// The synthetic cube a benchmark measures and the components it keeps (`bench cpu`, `bench service`,
/// `bench batch`): by default the size of the paper's scene.
#[derive(Debug, Clone, clap::Args)]
pub struct CubeSize {
    /// Lines of the synthetic cube.
    #[arg(long, default_value_t = 1087)]
    pub lines: usize,
    /// Samples of the synthetic cube.
    #[arg(long, default_value_t = 614)]
    pub samples: usize,
    /// Bands of the synthetic cube.
    #[arg(long, default_value_t = 224)]
    pub bands: usize,
    /// Components kept.
    #[arg(long, default_value_t = 10)]
    pub components: usize,
}
