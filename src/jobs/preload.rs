//! Putting an upload's cube on the device while the upload is made durable.
//!
//! A `.npy` upload's 202 waits for its bytes to reach the disk: 17-20 ms after the last byte for the
//! 299 MB cube on the H100 host's ext4 (2026-11-25), during which the GPU had nothing to do; then the
//! job's statistics pass began by copying the whole cube to the device. Here the cube is copied to the
//! device in that wait, from the just-written file, and kept in the device level of the job cache under
//! the key the job will look up (`DeviceLookup::find`): the job then finds it resident, as it would a
//! cube an earlier job left there, and its statistics pass reads device memory only.
//!
//! Only where the job's device is known before the job is claimed (one device, the default backend),
//! for a little-endian C-order `.npy` whose size and parameters were checked. Anything that fails here
//! is logged and forgotten: the job then reads its cube itself, as without this step.

use std::path::PathBuf;
use std::sync::Arc;

use crate::backend::Backend;
use crate::cache::{keys, resident_need, Digest, ResidentCube};
use crate::cube::DataType;
use crate::jobs::input::header_digest_of;
use crate::jobs::InputKind;
use crate::mnf::{MnfParams, Monitor};

use super::Runner;

/// A cube being copied to the device (on a blocking thread).
pub struct Preload {
    backend: Arc<dyn Backend>,
    /// The `.npy` header up to its data offset, as stored.
    header: Vec<u8>,
    task: tokio::task::JoinHandle<Option<ResidentCube>>,
}

impl Preload {
    /// Starts copying the `.npy` at `path` (all of it written, perhaps not yet synced) to the device a
    /// job with `params` will run on; None where that does not apply (see the module doc).
    pub fn start(runner: &Runner, path: PathBuf, header: Vec<u8>, dtype: DataType, params: &MnfParams) -> Option<Preload> {
        // 64-bit integers are widened to f64 on the host, a second copy of the cube: left to the job.
        if matches!(dtype, DataType::I64 | DataType::U64) {
            return None;
        }
        let backend = runner.backends.sole_default_device(params.backend)?;
        runner.cache.device_for(backend.as_ref())?;
        let (cache, b) = (runner.cache.clone(), backend.clone());
        let task = tokio::task::spawn_blocking(move || {
            let t = std::time::Instant::now();
            let outcome = (|| -> Result<ResidentCube, String> {
                let cube = Arc::new(crate::cube::npy::map(&path).map_err(|e| e.to_string())?);
                let device = cache.device_for(b.as_ref()).ok_or("the device level is off")?;
                device.make_room(b.as_ref(), resident_need(&cube));
                let item = ResidentCube::prepare(cube, b, &Monitor::silent()).map_err(|e| e.to_string())?;
                item.with_prepared(|p| p.upload_now()).map_err(|e| e.to_string())?;
                Ok(item)
            })();
            match outcome {
                Ok(item) => {
                    tracing::debug!(target: "hypermnf::timing", ms = t.elapsed().as_secs_f64() * 1e3, "upload copied to the device");
                    Some(item)
                }
                Err(e) => {
                    tracing::warn!("the upload was not copied to the device ahead of its job: {e}");
                    None
                }
            }
        });
        Some(Preload { backend, header, task })
    }

    /// Waits for the copy and keeps the cube in the device level under the key of the cube whose
    /// content digest is `content`, so that its job finds it. Call before the job is inserted.
    pub async fn keep(self, runner: &Runner, content: &Digest) {
        let Ok(Some(item)) = self.task.await else { return };
        let Some(device) = runner.cache.device_for(self.backend.as_ref()) else { return };
        let header = header_digest_of(InputKind::Npy, &self.header);
        let key = keys::device_key(content, &header, self.backend.name());
        if !device.keep(key, Arc::new(item)) {
            tracing::debug!("the uploaded cube was not kept on the device (streamed, or larger than --gpu-cache-bytes)");
        }
    }
}
