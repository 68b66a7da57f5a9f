//! Service configuration: every `hypermnf serve` option, each also read from a `HYPERMNF_*` variable.

use std::path::PathBuf;
use std::time::Duration;

use crate::backend::devices::DeviceSelection;
use crate::mnf::BackendChoice;

#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; the chosen address is printed on stdout).
    #[arg(long, env = "HYPERMNF_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Where the database (by default), uploads and results live.
    #[arg(long, env = "HYPERMNF_DATA_DIR", default_value = "./hypermnf-data")]
    pub data_dir: PathBuf,
    /// Database URL: sqlite://PATH (default: sqlite://DATA_DIR/hypermnf.db, for one instance), or
    /// postgres://USER[:PASSWORD]@HOST:PORT/DATABASE for several instances sharing one queue.
    #[arg(long, env = "HYPERMNF_DATABASE_URL")]
    pub database_url: Option<String>,
    /// How long a claimed job stays this instance's without a heartbeat (extended every third of it
    /// while the job runs): after an instance dies, another takes its jobs over once this has passed.
    #[arg(long, env = "HYPERMNF_LEASE", default_value = "30s", value_parser = parse_lease)]
    pub lease: Duration,
    /// This instance's name in the jobs it claims (default: HOSTNAME:DATA_DIR). An instance restarted
    /// under the same name takes back its own running jobs at once instead of waiting for their leases.
    #[arg(long, env = "HYPERMNF_INSTANCE_ID")]
    pub instance_id: Option<String>,
    /// Where uploads and results are stored: `s3://bucket/prefix` (endpoint, region and credentials
    /// from the AWS_* variables) or `file:///absolute/dir` (default: the directory DATA_DIR/objects).
    #[arg(long, env = "HYPERMNF_STORE", value_name = "URL", value_parser = crate::storage::StoreUrl::parse)]
    pub store: Option<crate::storage::StoreUrl>,
    /// Backend for jobs that ask for `auto`: auto (CUDA when a device is found), cpu, cuda, cuda-cublas.
    #[arg(long, env = "HYPERMNF_BACKEND", default_value = "auto")]
    pub backend: BackendChoice,
    /// CUDA devices to use: `all`, or ordinals such as `0,2`. One backend per device; jobs go to them
    /// in turn, and each device keeps its own cached cubes (`--gpu-cache-bytes` each). A device the
    /// host lacks, a duplicate or an empty entry stops the start. Ignored, with a log line, where the
    /// CPU backend runs.
    #[arg(long, env = "HYPERMNF_DEVICES", default_value = "all")]
    pub devices: DeviceSelection,
    /// Run every job on all the devices at once, each computing a share of the cube's lines, instead
    /// of one job per device (for cubes that are large against one device).
    #[arg(long, env = "HYPERMNF_SPLIT_CUBE")]
    pub split_cube: bool,
    /// Jobs run at the same time.
    #[arg(long, env = "HYPERMNF_WORKERS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub workers: u16,
    /// Largest accepted upload in bytes (the whole request body), and the largest cube a header may claim.
    #[arg(long, env = "HYPERMNF_MAX_UPLOAD_BYTES", default_value_t = 4 << 30)]
    pub max_upload_bytes: u64,
    /// File of API keys: one per line, `key` or `name:key`; `#` starts a comment. When given, every
    /// `/v1` request needs `Authorization: Bearer <key>`, and each key sees only its own jobs.
    #[arg(long, env = "HYPERMNF_API_KEYS_FILE")]
    pub api_keys_file: Option<PathBuf>,
    /// Directory whose files may be named by `file://` hrefs (repeatable; comma-separated in the
    /// variable). Without one, href inputs are refused.
    #[arg(long = "input-root", env = "HYPERMNF_INPUT_ROOT", value_delimiter = ',')]
    pub input_roots: Vec<PathBuf>,
    /// Allow listening on a non-loopback address without API keys.
    #[arg(long, env = "HYPERMNF_INSECURE")]
    pub insecure: bool,
    /// How long finished jobs and their files are kept (e.g. 7d, 12h, 30m, 90s).
    #[arg(long, env = "HYPERMNF_RETENTION", default_value = "7d", value_parser = parse_duration)]
    pub retention: Duration,
    /// Longest a request may take (uploads included) before it is answered 408.
    #[arg(long, env = "HYPERMNF_REQUEST_TIMEOUT", default_value = "30m", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// GPU memory in bytes the job cache may keep recent cubes (and their eigen systems) in between
    /// jobs, so that a re-projection of the same cube is neither read nor uploaded again; 0 turns
    /// this off. Used with the CUDA backends only. A job that needs the memory evicts them first. The
    /// host keeps each such cube too (the same bytes again, in RAM).
    #[arg(long, env = "HYPERMNF_GPU_CACHE_BYTES", default_value_t = DEFAULT_GPU_CACHE_BYTES)]
    pub gpu_cache_bytes: u64,
    /// Which `.npy` uploads' jobs start computing before the upload is synced, on an idle worker of
    /// the instance that received it: `device` (jobs on a GPU: the job, and on the way the copy of the
    /// cube to the device, hide behind the upload and its sync), `always` (CPU jobs too, which then
    /// share the cores with the end of the request: the 202 came ~20 ms later on two cores), `never`.
    #[arg(long, env = "HYPERMNF_EARLY_START", value_enum, default_value_t = EarlyStart::Device)]
    pub early_start: EarlyStart,
}

/// See `ServeArgs::early_start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EarlyStart {
    Device,
    Always,
    Never,
}

/// 4 GiB: a dozen cubes of the published design's size (299 MB each as int16) on an 80 GB device.
pub const DEFAULT_GPU_CACHE_BYTES: u64 = 4 << 30;

impl ServeArgs {
    /// The defaults, as `hypermnf serve` with no options and no environment would use them, with the
    /// given data dir (tests and the benchmark start from this).
    pub fn with_data_dir(data_dir: impl Into<PathBuf>) -> Self {
        ServeArgs {
            listen: "127.0.0.1:0".into(),
            data_dir: data_dir.into(),
            database_url: None,
            lease: Duration::from_secs(30),
            instance_id: None,
            store: None,
            backend: BackendChoice::Auto,
            devices: DeviceSelection::All,
            split_cube: false,
            workers: 1,
            max_upload_bytes: 4 << 30,
            api_keys_file: None,
            input_roots: Vec::new(),
            insecure: false,
            retention: Duration::from_secs(7 * 86400),
            request_timeout: Duration::from_secs(1800),
            gpu_cache_bytes: DEFAULT_GPU_CACHE_BYTES,
            early_start: EarlyStart::Device,
        }
    }

    /// The name this instance claims jobs under.
    pub fn instance_id(&self) -> String {
        if let Some(id) = &self.instance_id {
            return id.clone();
        }
        let dir = self.data_dir.canonicalize().unwrap_or_else(|_| self.data_dir.clone());
        format!("{}:{}", hostname(), dir.display())
    }

    pub fn database_url(&self) -> String {
        match &self.database_url {
            Some(u) => u.clone(),
            None => format!("sqlite://{}", self.data_dir.join("hypermnf.db").display()),
        }
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or fails.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(0);
    match (ok, std::str::from_utf8(&buf[..end])) {
        (true, Ok(h)) if !h.is_empty() => h.to_string(),
        _ => "localhost".to_string(),
    }
}

/// A lease of at least 3 s: shorter ones would expire between heartbeats on a busy machine.
fn parse_lease(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_secs(3) {
        return Err(format!("the lease must be at least 3s, not {s:?}"));
    }
    Ok(d)
}

/// Parses `90s`, `30m`, `12h`, `7d` (or a bare number of seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&s[..i], s[i..].trim()),
        None => (s, "s"),
    };
    let n: u64 = num.parse().map_err(|_| format!("duration must look like 90s, 30m, 12h or 7d, not {s:?}"))?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(format!("duration unit must be s, m, h or d, not {unit:?}")),
    };
    n.checked_mul(mult).map(Duration::from_secs).ok_or_else(|| format!("duration {s:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(604800));
        assert!(parse_duration("7w").is_err());
        assert!(parse_duration("d").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }
}
