//! An upload sent to the device while it arrives.
//!
//! A job's statistics pass copies the whole cube to the device before it can finish: 299 MB at
//! ~27 GB/s, 11–13 ms of a job that starts when the upload's last byte is in its file (`jobs::early_start`).
//! The upload itself comes at ~1.3 GB/s, so the copy can ride along: once a `.npy` upload's header
//! (or a multipart ENVI upload's header part, for a cube stored BIP or BIL: whole lines arrive in
//! order, and the device reorders BIL lines as it does for a file) is checked, a thread maps the
//! scratch file as it fills (the writer gives it its full length at
//! once), prepares the cube on the device as the job would (a resident cube of the device level),
//! and issues the copy of each chunk of lines as soon as the writer reports it written
//! ([`PreparedCube::upload_arrived`]). The job started early then finds its cube on the device, and
//! its statistics pass only computes.
//!
//! Nothing here decides anything for the job: a feed that cannot keep up, fails, or is not wanted
//! (no device level for the job's backend, no idle worker, an upload that stops short) ends with no
//! cube, and the job reads its cube as before. The statistics pass orders its kernels after the
//! copies (per-chunk events), and its shifts are sampled from the complete file, so the result is
//! the same bit for bit.
//!
//! [`PreparedCube::upload_arrived`]: crate::backend::PreparedCube::upload_arrived

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::worker::Runner;
pub use super::upload_progress::Progress;
use crate::backend::Backend;
use crate::job_cache::{resident_need, DeviceLevel, ResidentCube};
use crate::cube::{Cube, DataType};
use crate::mnf::{BackendChoice, Monitor};

/// Bytes written between two looks at the file: about the statistics pass's chunk (fewer calls;
/// `upload_arrived` issues whole chunks only).
const LOOK_EVERY: u64 = 16 << 20;

/// The cube as the upload's header claims it.
#[derive(Clone, Debug)]
pub struct Claimed {
    pub lines: usize,
    pub samples: usize,
    pub bands: usize,
    pub dtype: DataType,
    /// Where the samples start in the file (the `.npy` header's length, or the ENVI header offset).
    pub data_offset: u64,
    /// How the file is mapped once its first bytes are in.
    pub form: Form,
}

/// What the file being written is.
#[derive(Clone, Debug)]
pub enum Form {
    /// A `.npy` file: its own header says the rest.
    Npy,
    /// The data file of an ENVI cube whose header text came apart (stored BIP or BIL: see the module doc).
    Envi { header: Arc<str> },
}

/// A thread feeding one upload to the device. Dropped, it stops at its next look at the file.
pub struct Feed {
    task: Option<tokio::task::JoinHandle<Option<Arc<ResidentCube>>>>,
    stop: Arc<AtomicBool>,
}

impl Feed {
    /// Starts feeding the upload being written to `path` (reported by `progress`) to the device of
    /// `choice`'s backend, when that backend keeps cubes on a device and a worker of `runner` is idle;
    /// None otherwise.
    pub fn start(runner: &Runner, choice: BackendChoice, claimed: Claimed, path: PathBuf, progress: Arc<Progress>) -> Option<Feed> {
        if !runner.has_idle_worker() || !runner.may_start_early(choice) {
            return None;
        }
        let backend = runner.backends.get(choice).ok()?;
        runner.cache.device_for(backend.as_ref())?;
        progress.map_while_written();
        let stop = Arc::new(AtomicBool::new(false));
        let cache = runner.cache.clone();
        let s = stop.clone();
        let task = tokio::task::spawn_blocking(move || {
            let device = cache.device_for(backend.as_ref())?;
            match feed(device, backend.clone(), claimed, &path, &progress, &s) {
                Ok(cube) => Some(cube),
                Err(why) => {
                    tracing::debug!(path = %path.display(), "upload not fed to the device: {why}");
                    None
                }
            }
        });
        Some(Feed { task: Some(task), stop })
    }

    /// Once every byte of the upload is in the file: the cube, prepared and all of it sent (or being
    /// sent) to the device; None if the feed gave up.
    pub async fn finish(mut self) -> Option<Arc<ResidentCube>> {
        let task = self.task.take()?;
        task.await.ok().flatten()
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn feed(
    device: &DeviceLevel,
    backend: Arc<dyn Backend>,
    claimed: Claimed,
    path: &std::path::Path,
    progress: &Progress,
    stop: &AtomicBool,
) -> Result<Arc<ResidentCube>, String> {
    let line_bytes = (claimed.samples * claimed.bands * claimed.dtype.size()) as u64;
    let end = claimed.data_offset + claimed.lines as u64 * line_bytes;
    // The header is in the file (and the file at its full length) once the first batch is written.
    progress.wait_for(claimed.data_offset.max(1)).ok_or("the upload stopped before its data")?;
    let cube = match &claimed.form {
        Form::Npy => crate::cube::npy::map(path),
        Form::Envi { header } => crate::cube::envi::map_parts(header, path),
    }
    .map_err(|e| e.to_string())?;
    if cube.storage() == crate::cube::Interleave::Bsq {
        return Err("a BSQ cube has no whole line until its last band arrives".into());
    }
    if (cube.lines(), cube.samples(), cube.bands(), cube.dtype()) != (claimed.lines, claimed.samples, claimed.bands, claimed.dtype) {
        return Err("the mapped file is not the claimed cube".into());
    }
    let cube: Arc<Cube> = Arc::new(cube);
    // Room for it as the job would make (the job's own cube comes first).
    device.make_room(backend.as_ref(), resident_need(&cube));
    let item = ResidentCube::prepare(cube, backend, &Monitor::silent()).map_err(|e| e.to_string())?;
    if item.resident_bytes() == 0 {
        return Err("the cube does not fit on the device whole (it is streamed)".into());
    }
    let mut look_at = claimed.data_offset;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err("the upload was abandoned".into());
        }
        look_at = (look_at + LOOK_EVERY).min(end);
        let written = progress.wait_for(look_at).ok_or("the upload stopped short")?.min(end);
        let lines = ((written - claimed.data_offset) / line_bytes) as usize;
        item.with_prepared(|p| p.upload_arrived(lines)).map_err(|e| e.to_string())?;
        if written >= end {
            return Ok(Arc::new(item));
        }
        look_at = written;
    }
}
