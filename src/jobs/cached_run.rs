//! One job's MNF through the job cache.
//!
//! [`Plan::open`] finds the cube (still resident on the device, or read from storage) and an eigen
//! system for the job's statistics key (kept with the resident cube, or stored by an earlier job);
//! [`Plan::execute`] then runs only the projection when it has a system, the whole pipeline
//! otherwise, and leaves the cube (if the backend kept it on the device) and the system it computed in
//! the cache for the next job. A job never fails because of the cache: room for its cube is made by
//! evicting first, and a CUDA failure while the cache held device memory is retried once with the
//! device level emptied.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::cache::ServiceCache;
use super::input;
use super::model::{InputKind, Job};
use super::worker::load_cube;
use crate::backend::{Backend, BackendError, PreparedCube};
use crate::cache::{keys, resident_need, DeviceLevel, Digest, ResidentCube, SystemRecord};
use crate::cube::{Cube, CubeError};
use crate::mnf::result::EigenSystem;
use crate::mnf::{pipeline, MnfError, MnfOutput, MnfParams, Monitor, ReuseSource, StatisticsReuse};
use crate::storage::Storage;

/// What a job runs on, found before any pass.
pub struct Plan {
    pub cube: Arc<Cube>,
    /// The job's key at the device level (None: the level is off, or the input is an href).
    device_key: Option<Digest>,
    /// The resident cube found under `device_key`.
    resident: Option<Arc<ResidentCube>>,
    statistics_key: Digest,
    known: Option<(Arc<SystemRecord>, ReuseSource)>,
}

/// A finished computation.
pub struct Computed {
    pub cube: Arc<Cube>,
    pub output: MnfOutput,
    /// The eigen system this job computed and its statistics key: stored when the job succeeds.
    pub fresh: Option<(Digest, Arc<SystemRecord>)>,
}

impl Plan {
    /// Finds the cube and an eigen system for `job` on `backend`. `rt` runs the database and storage
    /// reads of the statistics level (this runs on a blocking thread).
    pub fn open(
        cache: &ServiceCache,
        job: &Job,
        params: &MnfParams,
        backend: &Arc<dyn Backend>,
        storage: &Storage,
        rt: &tokio::runtime::Handle,
    ) -> Result<Plan, CubeError> {
        // An upload's content digest was computed when it arrived and the upload cannot change; an
        // href's file can, so its digest is taken from what is read now.
        let stored = match job.input_kind {
            InputKind::Href => None,
            _ => job.content_digest.as_deref().and_then(keys::parse_hex),
        };
        let device_key = match (cache.device_for(backend.as_ref()), stored) {
            (Some(_), Some(content)) => match input::header_digest(job.input_kind, &job.input_location, storage) {
                Ok(header) => Some(keys::device_key(&content, &header, backend.name())),
                Err(e) => {
                    tracing::warn!(job = %job.id, "cannot read the input's header for the device cache: {e}");
                    None
                }
            },
            _ => None,
        };
        let resident = match (cache.device_for(backend.as_ref()), &device_key) {
            (Some(dev), Some(key)) => dev.get(key),
            _ => None,
        };
        let cube = match &resident {
            Some(r) => r.cube().clone(),
            None => Arc::new(load_cube(job.input_kind, &job.input_location, storage)?),
        };
        let content = match stored {
            Some(c) => c,
            None => cube.content_digest(),
        };
        let statistics_key = keys::statistics_key(&content, params, backend.name());
        let known = match resident.as_ref().and_then(|r| r.system(&statistics_key)) {
            Some(s) => Some((s, ReuseSource::Device)),
            None => rt.block_on(cache.find_system(&statistics_key)).map(|s| (s, ReuseSource::Storage)),
        };
        Ok(Plan { cube, device_key, resident, statistics_key, known })
    }

    /// Whether the statistics passes will be skipped.
    pub fn reuses_statistics(&self) -> bool {
        self.known.is_some()
    }

    /// Runs the passes (see the module doc).
    pub fn execute(
        self,
        cache: &ServiceCache,
        job: &Job,
        params: &MnfParams,
        backend: &Arc<dyn Backend>,
        monitor: &Monitor,
    ) -> Result<Computed, MnfError> {
        let device = cache.device_for(backend.as_ref());
        let cache_held_memory = self.resident.is_some() || device.is_some_and(|d| !d.is_empty());
        let outcome = match self.attempt(device, job, params, backend, monitor) {
            Err(MnfError::Backend(BackendError::Cuda(msg))) if cache_held_memory && !monitor.is_canceled() => {
                tracing::warn!(job = %job.id, "CUDA error while the device cache held memory ({msg}); retrying with it emptied");
                if let Some(d) = device {
                    d.clear();
                }
                self.attempt(None, job, params, backend, monitor)
            }
            other => other,
        }?;
        let (mut output, fresh) = outcome;
        if let Some((record, source)) = &self.known {
            output.metadata.statistics = Some(StatisticsReuse {
                reused: true,
                from_job: (record.owner == job.owner).then(|| record.job_id.clone()),
                source: *source,
            });
        }
        Ok(Computed { cube: self.cube, output, fresh: fresh.map(|r| (self.statistics_key, r)) })
    }

    /// One try: on the resident cube, on a cube prepared for the device level, or on a plain one
    /// (`device` None). Returns the output and the system record when this job computed it.
    fn attempt(
        &self,
        device: Option<&DeviceLevel>,
        job: &Job,
        params: &MnfParams,
        backend: &Arc<dyn Backend>,
        monitor: &Monitor,
    ) -> Result<(MnfOutput, Option<Arc<SystemRecord>>), MnfError> {
        let known = self.known.as_ref().map(|(r, _)| &r.system);
        let record = |system: EigenSystem| Arc::new(SystemRecord { system, job_id: job.id.clone(), owner: job.owner.clone() });
        let plain = || -> Result<(MnfOutput, Option<Arc<SystemRecord>>), MnfError> {
            let mut prepared = backend.prepare(&self.cube, monitor)?;
            let (out, fresh) = run_passes(&self.cube, params, known, backend.as_ref(), prepared.as_mut(), monitor)?;
            Ok((out, fresh.map(record)))
        };
        let Some(device) = device else { return plain() };
        let Some(key) = self.device_key else {
            // Not cacheable (an href), but the cached cubes must still make room for it.
            device.make_room(backend.as_ref(), resident_need(&self.cube));
            return plain();
        };
        let (item, new) = match &self.resident {
            Some(item) => (item.clone(), false),
            None => {
                // Jobs come first: evict until this cube fits on the device.
                device.make_room(backend.as_ref(), resident_need(&self.cube));
                (Arc::new(ResidentCube::prepare(self.cube.clone(), backend.clone(), monitor)?), true)
            }
        };
        let result = item.with_prepared(|p| run_passes(&self.cube, params, known, backend.as_ref(), p, monitor));
        let result = result.map(|(out, fresh)| (out, fresh.map(record)));
        if let Ok((_, fresh)) = &result {
            match (fresh, &self.known) {
                (Some(r), _) => item.keep_system(self.statistics_key, r.clone()),
                (None, Some((r, _))) => item.keep_system(self.statistics_key, r.clone()),
                (None, None) => {}
            }
            if new && !device.keep(key, item.clone()) {
                tracing::debug!(job = %job.id, "cube not kept on the device (streamed, or larger than --gpu-cache-bytes)");
            }
        }
        device.done_with(&key, item);
        result
    }
}

/// The projection with a known eigen system, or the whole pipeline (what `mnf::run` does).
fn run_passes(
    cube: &Cube,
    params: &MnfParams,
    known: Option<&EigenSystem>,
    backend: &dyn Backend,
    prepared: &mut dyn PreparedCube,
    monitor: &Monitor,
) -> Result<(MnfOutput, Option<EigenSystem>), MnfError> {
    match known {
        Some(system) => Ok((pipeline::apply_on(cube, params, system, backend, prepared, monitor, BTreeMap::new())?, None)),
        None => {
            let mut timings = BTreeMap::new();
            let system = pipeline::analyse_on(cube, params, prepared, monitor, &mut timings)?;
            let out = pipeline::apply_on(cube, params, &system, backend, prepared, monitor, timings)?;
            Ok((out, Some(system)))
        }
    }
}
