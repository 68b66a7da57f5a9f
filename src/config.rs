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
    /// Largest accepted upload in bytes (the whole request body), and the largest cube a header may
    /// claim; 413 past it. `auto` (the default): 64 GiB, capped at start-up by the free space of the
    /// file system holding DATA_DIR (where uploads are received) less a margin of 5 % of that free
    /// space, at least 1 GiB. A number is used as given. `/v1/info` reports the effective value.
    #[arg(long, env = "HYPERMNF_MAX_UPLOAD_BYTES", value_name = "BYTES|auto", default_value = "auto", value_parser = parse_upload_limit)]
    pub max_upload_bytes: u64,
    /// How long a resumable upload (`/v1/uploads`, tus) is kept after its last PATCH, finished or not,
    /// until a job is made from it: then it expires and its disk space is freed.
    #[arg(long, env = "HYPERMNF_UPLOAD_EXPIRY_SECS", value_name = "SECONDS", default_value_t = DEFAULT_UPLOAD_EXPIRY_SECS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub upload_expiry_secs: u64,
    /// File of API keys: one per line, `key` or `name:key`; `#` starts a comment. When given, every
    /// `/v1` request needs `Authorization: Bearer <key>`, and each key sees only its own jobs.
    #[arg(long, env = "HYPERMNF_API_KEYS_FILE")]
    pub api_keys_file: Option<PathBuf>,
    /// Directory whose files may be named by `file://` hrefs (repeatable; comma-separated in the
    /// variable). Without one, href inputs are refused.
    #[arg(long = "input-root", env = "HYPERMNF_INPUT_ROOT", value_delimiter = ',')]
    pub input_roots: Vec<PathBuf>,
    /// S3 bucket whose objects may be named by `s3://bucket/key` hrefs (repeatable; comma-separated
    /// in the variable). They are read with ranged GETs through the same S3 settings as `--store
    /// s3://` (AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...), which
    /// configure this input client even where the server stores its own files locally. Without one,
    /// s3:// hrefs are refused (403 forbidden_reference).
    #[arg(long = "input-bucket", env = "HYPERMNF_INPUT_BUCKETS", value_name = "NAME", value_delimiter = ',')]
    pub input_buckets: Vec<String>,
    /// Host whose files may be named by `https://` hrefs: HOST, HOST:PORT, IP, IP:PORT or [IPv6]:PORT
    /// (repeatable; comma-separated in the variable). A name must resolve only to public addresses:
    /// loopback, private, link-local (metadata services), unique-local, multicast and unspecified
    /// addresses are refused unless that IP is listed here literally. Redirects are never followed
    /// and plain http:// is refused. Without one, https:// hrefs are refused.
    #[arg(long = "input-host", env = "HYPERMNF_INPUT_HOSTS", value_name = "HOST[:PORT]", value_delimiter = ',')]
    pub input_hosts: Vec<String>,
    /// PEM file of extra CA certificates trusted for https:// hrefs, beside the system's (an internal
    /// CA, or a test server's self-signed certificate). Repeatable.
    #[arg(long = "input-ca-cert", env = "HYPERMNF_INPUT_CA_CERT", value_name = "FILE")]
    pub input_ca_certs: Vec<PathBuf>,
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

/// The upload limit by default, before the cap by free disk space: 64 GiB, room for the flight lines
/// scientists download (AVIRIS-NG and AVIRIS-3 ENVI lines of 5–30 GB, EMIT granules of 1.8 GB).
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 64 << 30;

/// How long a resumable upload is kept after its last PATCH by default: 24 hours.
pub const DEFAULT_UPLOAD_EXPIRY_SECS: u64 = 24 * 3600;

/// `ServeArgs::max_upload_bytes` before start-up has resolved it: `--max-upload-bytes auto` (the
/// default). [`ServeArgs::resolve_upload_limit`] replaces it with the effective limit.
pub const MAX_UPLOAD_AUTO: u64 = 0;

/// The smallest free-space margin left by the default limit (the margin is 5 % of the free space, at
/// least this).
pub const UPLOAD_MARGIN_MIN: u64 = 1 << 30;

/// Where a 413 for the upload limit says how to raise it.
pub const UPLOAD_LIMIT_HINT: &str = "raise it with --max-upload-bytes (or HYPERMNF_MAX_UPLOAD_BYTES)";

/// Parses `--max-upload-bytes`: `auto`, or a positive number of bytes.
fn parse_upload_limit(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("auto") {
        return Ok(MAX_UPLOAD_AUTO);
    }
    match s.parse::<u64>() {
        Ok(0) => Err("the upload limit must be at least 1 byte (`auto` for the default)".to_string()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("the upload limit must be a number of bytes or `auto`, not {s:?}")),
    }
}

/// The default upload limit where the data dir's file system has `free` bytes available (None: it
/// could not be asked): [`DEFAULT_MAX_UPLOAD_BYTES`], capped at `free` less a margin of 5 % of `free`
/// (at least [`UPLOAD_MARGIN_MIN`]), so that an accepted upload leaves room for its results, the
/// database and the rest of the machine. Never below 1 byte: a full disk refuses every upload (413),
/// with a warning at start-up.
pub fn default_upload_limit(free: Option<u64>) -> u64 {
    match free {
        None => DEFAULT_MAX_UPLOAD_BYTES,
        Some(free) => {
            let margin = (free / 20).max(UPLOAD_MARGIN_MIN);
            DEFAULT_MAX_UPLOAD_BYTES.min(free.saturating_sub(margin)).max(1)
        }
    }
}

/// Bytes available to this (unprivileged) process on the file system holding `path`, or on that of
/// its nearest existing ancestor (`statvfs`: available blocks × fragment size). None if it cannot be
/// asked.
pub fn free_disk_bytes(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    path.ancestors().filter(|p| !p.as_os_str().is_empty()).find_map(|p| {
        let c = std::ffi::CString::new(p.as_os_str().as_bytes()).ok()?;
        // SAFETY: `c` is a NUL-terminated path and `st` a properly sized, writable struct statvfs.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            return None;
        }
        Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
    })
}

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
            max_upload_bytes: MAX_UPLOAD_AUTO,
            upload_expiry_secs: DEFAULT_UPLOAD_EXPIRY_SECS,
            api_keys_file: None,
            input_roots: Vec::new(),
            input_buckets: Vec::new(),
            input_hosts: Vec::new(),
            input_ca_certs: Vec::new(),
            insecure: false,
            retention: Duration::from_secs(7 * 86400),
            request_timeout: Duration::from_secs(1800),
            gpu_cache_bytes: DEFAULT_GPU_CACHE_BYTES,
            early_start: EarlyStart::Device,
        }
    }

    /// Resolves `max_upload_bytes` once, at start-up (`api::context`, after the data dir exists): an
    /// explicit value stays as given; `auto` becomes [`default_upload_limit`] of the data dir's free
    /// space, logged with how it was reached.
    pub fn resolve_upload_limit(mut self) -> Self {
        if self.max_upload_bytes != MAX_UPLOAD_AUTO {
            tracing::info!(max_upload_bytes = self.max_upload_bytes, "upload limit (as given)");
            return self;
        }
        let free = free_disk_bytes(&self.data_dir);
        let limit = default_upload_limit(free);
        self.max_upload_bytes = limit;
        match free {
            None => tracing::warn!(
                max_upload_bytes = limit,
                "upload limit: the free space of {} could not be read, so the default is not capped",
                self.data_dir.display()
            ),
            Some(free) if limit < DEFAULT_MAX_UPLOAD_BYTES => tracing::warn!(
                max_upload_bytes = limit,
                free_bytes = free,
                "upload limit: {} has {free} bytes free, so the {DEFAULT_MAX_UPLOAD_BYTES}-byte default is capped \
                 to leave a margin; free disk space, or {UPLOAD_LIMIT_HINT}",
                self.data_dir.display()
            ),
            Some(free) => tracing::info!(max_upload_bytes = limit, free_bytes = free, "upload limit (default)"),
        }
        self
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
    fn upload_limit_default_is_64_gib_capped_by_free_space_less_a_margin() {
        const GIB: u64 = 1 << 30;
        // Plenty of space, or space unknown: the default as it is.
        assert_eq!(default_upload_limit(Some(10_000 * GIB)), 64 * GIB);
        assert_eq!(default_upload_limit(None), 64 * GIB);
        assert_eq!(default_upload_limit(Some(100 * GIB)), 64 * GIB);
        // Just under 64 GiB once the 5 % margin is taken.
        assert_eq!(default_upload_limit(Some(67 * GIB)), 67 * GIB - 67 * GIB / 20);
        // Less: free space less 5 % of it...
        assert_eq!(default_upload_limit(Some(40 * GIB)), 38 * GIB);
        // ... or less 1 GiB where 5 % is smaller.
        assert_eq!(default_upload_limit(Some(10 * GIB)), 9 * GIB);
        // A nearly full disk refuses uploads (1 byte), never a limit of 0 (the `auto` marker).
        assert_eq!(default_upload_limit(Some(GIB / 2)), 1);
        assert_eq!(default_upload_limit(Some(0)), 1);
    }

    #[test]
    fn upload_limit_option_and_resolution() {
        assert_eq!(parse_upload_limit("auto"), Ok(MAX_UPLOAD_AUTO));
        assert_eq!(parse_upload_limit(" AUTO "), Ok(MAX_UPLOAD_AUTO));
        assert_eq!(parse_upload_limit("1048576"), Ok(1 << 20));
        assert!(parse_upload_limit("0").is_err());
        assert!(parse_upload_limit("4G").unwrap_err().contains("auto"));

        let dir = tempfile::tempdir().unwrap();
        // The default: resolved from the data dir's file system (one that does not exist yet counts
        // as its nearest existing ancestor's).
        let args = ServeArgs::with_data_dir(dir.path().join("not/yet"));
        assert_eq!(args.max_upload_bytes, MAX_UPLOAD_AUTO);
        let free = free_disk_bytes(dir.path()).expect("statvfs answers for a temp dir");
        assert!(free > 0);
        let resolved = args.resolve_upload_limit().max_upload_bytes;
        // The free space moves while other tests write: compare with the bounds around the reading.
        assert!((1..=DEFAULT_MAX_UPLOAD_BYTES).contains(&resolved) && resolved <= free, "{resolved} of {free} free");
        // An explicit value is used as given, however large or small.
        for given in [1u64, 123_456, 1 << 50] {
            let mut args = ServeArgs::with_data_dir(dir.path());
            args.max_upload_bytes = given;
            assert_eq!(args.resolve_upload_limit().max_upload_bytes, given);
        }
    }

    #[test]
    fn upload_limit_from_the_command_line_and_the_environment() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        use clap::Parser as _;
        let parse = |args: &[&str]| Cli::try_parse_from([&["hypermnf"], args].concat()).map(|c| c.serve.max_upload_bytes);
        // HYPERMNF_MAX_UPLOAD_BYTES is not set in the test environment (scripts/test.sh sets none).
        if std::env::var_os("HYPERMNF_MAX_UPLOAD_BYTES").is_none() {
            assert_eq!(parse(&[]).unwrap(), MAX_UPLOAD_AUTO);
        }
        assert_eq!(parse(&["--max-upload-bytes", "auto"]).unwrap(), MAX_UPLOAD_AUTO);
        assert_eq!(parse(&["--max-upload-bytes", "5000000000"]).unwrap(), 5_000_000_000);
        assert!(parse(&["--max-upload-bytes", "0"]).is_err());
    }

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
