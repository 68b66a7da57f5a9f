//! One job's MNF through the job cache, as the run of a job (`job_run`) drives it.
//!
//! [`DeviceLookup::find`] looks for the job's cube still resident on the device; when it is not
//! there, the caller reads the cube. [`Plan::new`] then looks for an eigen system for the job's
//! statistics key (kept with the resident cube, or stored by an earlier job), and [`Plan::execute`]
//! runs only the projection when it has one, the whole pipeline otherwise, and leaves the cube (if
//! the backend kept it on the device) and the system it computed in the cache for the next job. A
//! job never fails because of the cache: room for its cube is made by evicting first, and a CUDA
//! failure while the cache held device memory is retried once with the device level emptied.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::service_cache::ServiceCache;
use super::input;
use super::model::{InputKind, Job};
use crate::backend::{Backend, BackendError, PreparedCube};
use crate::job_cache::{keys, resident_need, DeviceLevel, Digest, ResidentCube, SystemRecord};
use crate::cube::Cube;
use crate::mnf::result::EigenSystem;
use crate::mnf::pipeline::{self, ComponentSink};
use crate::mnf::{MnfError, MnfOutput, MnfParams, Monitor, ReuseSource, StatisticsReuse};
use crate::storage::Storage;

/// The device level's answer for a job, before its cube is read.
pub struct DeviceLookup {
    /// The content digest recorded when the upload arrived (None for an href, whose file can change).
    stored: Option<Digest>,
    /// The job's key at the device level (None: the level is off, or the input is an href).
    device_key: Option<Digest>,
    /// The resident cube found under `device_key`.
    resident: Option<Arc<ResidentCube>>,
    /// The job's cube sent to the device while its upload arrived (`jobs::upload_to_device`), when the level did
    /// not hold it already: used like a cube this job prepared, and kept under `device_key`.
    fed: Option<Arc<ResidentCube>>,
}

impl DeviceLookup {
    /// Looks for `job`'s cube on `backend`'s device. `rt` runs the storage reads of the upload's
    /// header (this runs on a blocking thread).
    pub fn find(cache: &ServiceCache, job: &Job, backend: &Arc<dyn Backend>, storage: &Storage, rt: &tokio::runtime::Handle) -> DeviceLookup {
        // An upload's content digest was computed when it arrived and the upload cannot change; an
        // href's file can, so its digest is taken from what is read now.
        let stored = match job.input_kind {
            InputKind::Href => None,
            _ => job.content_digest.as_deref().and_then(keys::parse_hex),
        };
        let device_key = match (cache.device_for(backend.as_ref()), stored) {
            (Some(_), Some(content)) => match input::header_digest(job.input_kind, &job.input_location, storage, rt) {
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
        DeviceLookup { stored, device_key, resident, fed: None }
    }

    /// The lookup's answer for a job whose cube was found resident under `device_key` by its content
    /// digest `content` (`jobs::resident_run`): nothing to read.
    pub fn of_resident(content: Digest, device_key: Digest, item: Arc<ResidentCube>) -> DeviceLookup {
        DeviceLookup { stored: Some(content), device_key: Some(device_key), resident: Some(item), fed: None }
    }

    /// Takes `fed` (the job's cube, fed to the device while its upload arrived) as the cube to run
    /// on, unless the level already holds the cube, or cannot keep it (an href, or no level): whether
    /// it was taken.
    pub fn adopt_fed(&mut self, fed: Arc<ResidentCube>) -> bool {
        let take = self.resident.is_none() && self.device_key.is_some();
        if take {
            self.fed = Some(fed);
        }
        take
    }

    /// The content digest of a cube this job read, computed while it was read (a referenced cube,
    /// `jobs::remote_input`): `Plan::new` then does not compute it again. A digest recorded with the
    /// job is kept.
    pub fn set_content(&mut self, content: Digest) {
        self.stored.get_or_insert(content);
    }

    /// Whether the level holds the job's cube already.
    pub fn is_resident(&self) -> bool {
        self.resident.is_some()
    }

    /// The job's cube when it is on the device (resident, or fed): it need not be read.
    pub fn cube(&self) -> Option<Arc<Cube>> {
        self.resident.as_ref().or(self.fed.as_ref()).map(|r| r.cube().clone())
    }
}

/// What a job runs on, found before any pass.
pub struct Plan {
    pub cube: Arc<Cube>,
    /// The job's key at the device level (None: the level is off, or the input is an href).
    device_key: Option<Digest>,
    /// The resident cube found under `device_key`.
    resident: Option<Arc<ResidentCube>>,
    /// The job's cube, fed to the device (see [`DeviceLookup::adopt_fed`]).
    fed: Option<Arc<ResidentCube>>,
    statistics_key: Digest,
    known: Option<(Arc<SystemRecord>, ReuseSource)>,
    /// The system was given (id, system identity): the request's `statistics_from`, or the pooled
    /// system of the job's batch. Not the cube's own, so never kept with the cube at the device level,
    /// where a later job on the same cube would take it for its own.
    given: Option<(String, String)>,
    /// The cube's content digest (recorded with the job, or computed from the cube here).
    content: Digest,
}

/// A finished computation.
pub struct Computed {
    pub cube: Arc<Cube>,
    pub output: MnfOutput,
    /// The eigen system this job computed and its statistics key: stored when the job succeeds.
    pub fresh: Option<(Digest, Arc<SystemRecord>)>,
    /// The eigen system the job projected with (computed, found in the cache, or given): kept with
    /// its results (`GET /v1/jobs/{id}/system`).
    pub used: Arc<SystemRecord>,
}

impl Plan {
    /// The cube's content digest.
    pub fn content_digest(&self) -> Digest {
        self.content
    }

    /// The key of the job's eigen system at the statistics level.
    pub fn statistics_key(&self) -> Digest {
        self.statistics_key
    }

    /// The plan for `job` on `backend` once its cube is at hand (`found.cube()`, or the cube read
    /// from the job's input): an eigen system for its statistics key, if one is known. `rt` runs the
    /// database and storage reads of the statistics level (this runs on a blocking thread).
    pub fn new(
        cache: &ServiceCache,
        params: &MnfParams,
        backend: &Arc<dyn Backend>,
        found: DeviceLookup,
        cube: Arc<Cube>,
        rt: &tokio::runtime::Handle,
    ) -> Plan {
        let DeviceLookup { stored, device_key, resident, fed } = found;
        let content = match stored {
            Some(c) => c,
            None => cube.content_digest(),
        };
        let statistics_key = keys::statistics_key(&content, params, backend.name());
        let known = match resident.as_ref().and_then(|r| r.system(&statistics_key)) {
            Some(s) => Some((s, ReuseSource::Device)),
            None => rt.block_on(cache.find_system(&statistics_key)).map(|s| (s, ReuseSource::Storage)),
        };
        Plan { cube, device_key, resident, fed, statistics_key, known, given: None, content }
    }

    /// The plan for a job whose eigen system is given: its request named it (`statistics_from`,
    /// resolved by `jobs::systems`), or it is a member of a pooled batch (`jobs::batch`; `source`
    /// says which). Only the projection runs, with `system`. The statistics level is neither asked nor
    /// told: the system is not this cube's, and must never be found under its key.
    #[allow(clippy::too_many_arguments)]
    pub fn with_system(
        params: &MnfParams,
        backend: &Arc<dyn Backend>,
        found: DeviceLookup,
        cube: Arc<Cube>,
        system: Arc<SystemRecord>,
        from: String,
        identity: String,
        source: ReuseSource,
    ) -> Plan {
        let DeviceLookup { stored, device_key, resident, fed } = found;
        let content = match stored {
            Some(c) => c,
            None => cube.content_digest(),
        };
        let statistics_key = keys::statistics_key(&content, params, backend.name());
        let known = Some((system, source));
        Plan { cube, device_key, resident, fed, statistics_key, known, given: Some((from, identity)), content }
    }

    /// Whether the statistics passes will be skipped.
    pub fn reuses_statistics(&self) -> bool {
        self.known.is_some()
    }

    /// Runs the passes (see the module doc).
    pub fn execute(
        mut self,
        cache: &ServiceCache,
        job: &Job,
        params: &MnfParams,
        backend: &Arc<dyn Backend>,
        monitor: &Monitor,
        mut sink: Option<&mut dyn ComponentSink>,
    ) -> Result<Computed, MnfError> {
        let device = cache.device_for(backend.as_ref());
        let cache_held_memory = self.resident.is_some() || device.is_some_and(|d| !d.is_empty());
        let outcome = match self.attempt(device, job, params, backend, monitor, again(&mut sink)) {
            Err(MnfError::Backend(BackendError::Cuda(msg))) if cache_held_memory && !monitor.is_canceled() => {
                tracing::warn!(job = %job.id, "CUDA error while the device cache held memory ({msg}); retrying with it emptied");
                // This job's own hold on a resident cube goes too, or clearing could not free it.
                drop(self.resident.take());
                drop(self.fed.take());
                if let Some(d) = device {
                    d.clear();
                }
                backend.release_idle_memory();
                self.attempt(None, job, params, backend, monitor, sink)
            }
            other => other,
        }?;
        let (mut output, fresh) = outcome;
        output.metadata.batch = job.batch.as_ref().map(|b| b.batch_id.clone());
        if let Some((record, source)) = &self.known {
            output.metadata.statistics = Some(StatisticsReuse {
                reused: true,
                from_job: (record.owner == job.owner && self.given.is_none()).then(|| record.job_id.clone()),
                source: *source,
                from: self.given.as_ref().map(|(id, _)| id.clone()),
                system_sha256: self.given.as_ref().map(|(_, identity)| identity.clone()),
                batch: job.batch.as_ref().filter(|_| *source == ReuseSource::Pooled).map(|b| b.batch_id.clone()),
            });
        }
        let used = match (&fresh, &self.known) {
            (Some(r), _) | (None, Some((r, _))) => r.clone(),
            (None, None) => unreachable!("a run without a known system computes one"),
        };
        Ok(Computed { cube: self.cube, output, fresh: fresh.map(|r| (self.statistics_key, r)), used })
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
        mut sink: Option<&mut dyn ComponentSink>,
    ) -> Result<(MnfOutput, Option<Arc<SystemRecord>>), MnfError> {
        let known = self.known.as_ref().map(|(r, _)| &r.system);
        let record = |system: EigenSystem| Arc::new(SystemRecord::new(system, job.id.clone(), job.owner.clone()));
        let plain = |sink: Option<&mut dyn ComponentSink>| -> Result<(MnfOutput, Option<Arc<SystemRecord>>), MnfError> {
            let mut prepared = backend.prepare(&self.cube, monitor)?;
            let (out, fresh) = run_passes(&self.cube, params, known, backend.as_ref(), prepared.as_mut(), monitor, sink)?;
            Ok((out, fresh.map(record)))
        };
        let Some(device) = device else { return plain(sink) };
        let Some(key) = self.device_key else {
            // Not cacheable (an href), but the cached cubes must still make room for it.
            device.make_room(backend.as_ref(), resident_need(&self.cube));
            return plain(sink);
        };
        let (item, new) = match (&self.resident, &self.fed) {
            (Some(item), _) => (item.clone(), false),
            (None, Some(fed)) => (fed.clone(), true),
            (None, None) => {
                // Jobs come first: evict until this cube fits on the device.
                let t = std::time::Instant::now();
                device.make_room(backend.as_ref(), resident_need(&self.cube));
                let room = t.elapsed();
                let item = Arc::new(ResidentCube::prepare(self.cube.clone(), backend.clone(), monitor)?);
                tracing::debug!(
                    target: "hypermnf::timing",
                    make_room_ms = room.as_secs_f64() * 1e3,
                    prepare_ms = (t.elapsed() - room).as_secs_f64() * 1e3,
                    "device level: room made and the cube prepared (part of the read stage)"
                );
                (item, true)
            }
        };
        let result = item.with_prepared(|p| run_passes(&self.cube, params, known, backend.as_ref(), p, monitor, again(&mut sink)));
        let result = result.map(|(out, fresh)| (out, fresh.map(record)));
        if let Ok((_, fresh)) = &result {
            match (fresh, &self.known) {
                (Some(r), _) => item.keep_system(self.statistics_key, r.clone()),
                // A given system is not this cube's: never kept under its statistics key.
                (None, Some((r, _))) if self.given.is_none() => item.keep_system(self.statistics_key, r.clone()),
                (None, Some(_)) => {}
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

/// The sink for one more use (an `Option` of a trait object is not reborrowed by itself).
fn again<'b>(sink: &'b mut Option<&mut dyn ComponentSink>) -> Option<&'b mut dyn ComponentSink> {
    sink.as_mut().map(|s| &mut **s as &mut dyn ComponentSink)
}

/// The projection with a known eigen system, or the whole pipeline (what `mnf::run` does); the
/// components also go to `sink` as they are computed.
fn run_passes(
    cube: &Cube,
    params: &MnfParams,
    known: Option<&EigenSystem>,
    backend: &dyn Backend,
    prepared: &mut dyn PreparedCube,
    monitor: &Monitor,
    mut sink: Option<&mut dyn ComponentSink>,
) -> Result<(MnfOutput, Option<EigenSystem>), MnfError> {
    match known {
        Some(system) => Ok((pipeline::apply_on_to(cube, params, system, backend, prepared, monitor, BTreeMap::new(), sink)?, None)),
        None => {
            let mut timings = BTreeMap::new();
            let system = pipeline::analyse_on(cube, params, prepared, monitor, &mut timings)?;
            if let Some(s) = again(&mut sink) {
                s.fresh_system(&system);
            }
            let out = pipeline::apply_on_to(cube, params, &system, backend, prepared, monitor, timings, sink)?;
            Ok((out, Some(system)))
        }
    }
}

#[cfg(test)]
mod tests {
    //! The device level's rules in a worker, on a pretend device that computes on the CPU.

    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::jobs::service_cache::CacheSettings;
    use crate::jobs::model::{InputSummary, JobStatus};
    use crate::jobs::store::JobStore;
    use crate::mnf::stats::{Denoise, Moments, Projection, Statistics, StatsSpec};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Claims plenty of free memory (as another process's allocations can make the numbers lie), but
    /// fails to prepare a cube while another of its cubes is alive: only emptying the cache helps.
    struct TightDevice {
        cpu: CpuBackend,
        alive: Arc<AtomicUsize>,
        prepared: AtomicUsize,
    }

    struct TightCube<'c> {
        inner: Box<dyn PreparedCube + Send + 'c>,
        bytes: u64,
        alive: Arc<AtomicUsize>,
    }

    impl Drop for TightCube<'_> {
        fn drop(&mut self) {
            self.alive.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl PreparedCube for TightCube<'_> {
        fn statistics(&mut self, spec: &StatsSpec, on_noise: &mut dyn FnMut(&Moments), m: &Monitor) -> Result<Statistics, BackendError> {
            self.inner.statistics(spec, on_noise, m)
        }
        fn project(&mut self, p: &Projection, out: &mut [f32], m: &Monitor) -> Result<(), BackendError> {
            self.inner.project(p, out, m)
        }
        fn denoise(&mut self, d: &Denoise, out: &mut [f32], m: &Monitor) -> Result<(), BackendError> {
            self.inner.denoise(d, out, m)
        }
        fn resident_bytes(&self) -> u64 {
            self.bytes
        }
    }

    impl Backend for TightDevice {
        fn name(&self) -> &'static str {
            "tight"
        }
        fn device(&self) -> String {
            "a device with room for one cube".into()
        }
        fn memory_in_use(&self) -> Option<(u64, u64)> {
            Some((0, 1 << 40))
        }
        fn prepare<'c>(&'c self, cube: &'c Cube, monitor: &Monitor) -> Result<Box<dyn PreparedCube + Send + 'c>, BackendError> {
            if self.alive.load(Ordering::SeqCst) > 0 {
                return Err(BackendError::Cuda("cannot allocate: out of memory (test device)".into()));
            }
            self.alive.fetch_add(1, Ordering::SeqCst);
            self.prepared.fetch_add(1, Ordering::SeqCst);
            let inner = self.cpu.prepare(cube, monitor)?;
            Ok(Box::new(TightCube { inner, bytes: cube.raw_len() as u64, alive: self.alive.clone() }))
        }
    }

    struct Fixture {
        cache: ServiceCache,
        storage: Storage,
        rt: tokio::runtime::Runtime,
        _dir: tempfile::TempDir,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let store = rt.block_on(JobStore::open(&format!("sqlite://{}", dir.path().join("t.db").display()))).unwrap();
        let storage = Storage::local(dir.path().join("objects")).unwrap();
        let settings = CacheSettings { gpu_cache_bytes: 1 << 30, index_cells: 1 << 10, index_on_gpu: false };
        let cache = ServiceCache::new(&settings, store, storage.clone()).unwrap();
        Fixture { cache, storage, rt, _dir: dir }
    }

    /// Stores `cube` as the .npy upload of job `id`.
    fn upload(f: &Fixture, id: &str, cube: &Cube) -> Job {
        let path = f.storage.scratch_dir("fixture").unwrap().join("cube.npy");
        crate::cube::npy::write_cube(&path, cube).unwrap();
        f.rt.block_on(f.storage.put_file(&path, &format!("uploads/{id}/cube.npy"))).unwrap();
        let input = InputSummary { lines: cube.lines(), samples: cube.samples(), bands: cube.bands(), data_type: "i16".into(), interleave: "bip".into() };
        Job {
            content_digest: Some(hex::encode(cube.content_digest())),
            ..Job::for_tests(id, JobStatus::Running, input, InputKind::Npy)
        }
    }

    fn run(f: &Fixture, job: &Job, params: &str, backend: &Arc<dyn Backend>) -> Computed {
        let params: MnfParams = serde_json::from_str(params).unwrap();
        let found = DeviceLookup::find(&f.cache, job, backend, &f.storage, f.rt.handle());
        let cube = match found.cube() {
            Some(cube) => cube,
            None => Arc::new(input::load_cube(job.input_kind, &job.input_location, &f.storage, f.rt.handle()).unwrap()),
        };
        let plan = Plan::new(&f.cache, &params, backend, found, cube, f.rt.handle());
        plan.execute(&f.cache, job, &params, backend, &Monitor::silent(), None).unwrap()
    }

    fn cube(seed: u64) -> Cube {
        let mut spec = crate::cube::synthetic::SyntheticSpec::small(30, 24, 12);
        spec.seed = seed;
        crate::cube::synthetic::generate(&spec)
    }

    fn assert_matches_cold(computed: &Computed, params: &str) {
        let params: MnfParams = serde_json::from_str(params).unwrap();
        let cold = crate::mnf::run(&computed.cube, &params, &CpuBackend::new(), &Monitor::silent()).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&computed.output.components), bits(&cold.components));
    }

    #[test]
    fn a_resident_cube_serves_the_next_projection_and_never_makes_a_job_fail() {
        let f = fixture();
        let dev = Arc::new(TightDevice { cpu: CpuBackend::new(), alive: Arc::new(AtomicUsize::new(0)), prepared: AtomicUsize::new(0) });
        let backend: Arc<dyn Backend> = dev.clone();
        let (a, b) = (cube(1), cube(2));

        // The first job computes everything and leaves its cube on the device.
        let first = run(&f, &upload(&f, "a1", &a), r#"{"components": 4}"#, &backend);
        assert!(first.fresh.is_some() && first.output.metadata.statistics.is_none());
        assert_matches_cold(&first, r#"{"components": 4}"#);
        let level = f.cache.device_for(backend.as_ref()).expect("the device level is on for a device");
        assert_eq!((level.stats().entries, dev.alive.load(Ordering::SeqCst)), (1, 1));

        // Same cube, other k: from the resident cube and the eigen system kept with it.
        let again = run(&f, &upload(&f, "a2", &a), r#"{"components": 2, "inverse": true}"#, &backend);
        let reuse = again.output.metadata.statistics.clone().expect("statistics reused");
        assert_eq!((reuse.source, reuse.from_job.as_deref()), (ReuseSource::Device, Some("a1")));
        assert!(again.fresh.is_none());
        assert_matches_cold(&again, r#"{"components": 2, "inverse": true}"#);
        assert_eq!(dev.prepared.load(Ordering::SeqCst), 1, "the resident cube was prepared again");
        assert_eq!(level.stats().hits, 1);

        // Another cube: the device (which claims to be empty) cannot hold it beside the cached one;
        // the job retries with the cache emptied and succeeds.
        let other = run(&f, &upload(&f, "b1", &b), r#"{"components": 3}"#, &backend);
        assert_matches_cold(&other, r#"{"components": 3}"#);
        assert!(level.is_empty(), "the retry emptied the device level");
        assert_eq!(dev.alive.load(Ordering::SeqCst), 0, "no prepared cube is left behind");
    }

    #[test]
    fn the_cpu_backend_keeps_nothing_on_a_device() {
        let f = fixture();
        let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
        let a = cube(3);
        run(&f, &upload(&f, "c1", &a), r#"{"components": 3}"#, &backend);
        assert!(f.cache.device_for(backend.as_ref()).is_none());
        assert_eq!(f.cache.report().device.map(|d| d.entries), Some(0));
    }
}
