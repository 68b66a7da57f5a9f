//! The run of one job, from its claim to its final status. [`JobRun::run`] takes the steps in order,
//! calling the job cache, the store and the storage; none of them calls back:
//!
//! 1. **claim**: [`JobServices::claim`] takes the next queued job under this instance's lease;
//! 2. **plan from the cache**: the device level may still hold the job's cube
//!    ([`DeviceLookup::find`]);
//! 3. **load**: otherwise the cube is read from the job's input ([`input::load_cube`]); with the cube
//!    at hand, the statistics level may know its eigen system ([`Plan::new`]);
//! 4. **compute**: the MNF, only the projection when the eigen system is known ([`Plan::execute`]),
//!    and the result files written into scratch with the bytes `hypermnf run --out` writes (the
//!    components while the projection computes them, `output::components_file`);
//! 5. **store**: the result files move to `results/<id>/`, and scratch is cleared;
//! 6. **register**: the eigen system the job computed is stored beside its results, and the job
//!    cache learns both before anyone can see the job succeeded (it begins as soon as a fresh system
//!    is known, beside the projection; a job that goes no further undoes it);
//! 7. **mark done**: the final status goes to the database (only the lease's holder writes it), the
//!    clients waiting on the job are woken; then the results are synced to the disk
//!    (`jobs::result_sync`), and the upload is deleted.
//!
//! Steps 2 to 4 run on the blocking pool (`spawn_blocking`). Meanwhile progress goes to the database
//! at most every 250 ms, and the lease is extended every third of its duration; a lease that cannot
//! be extended (the job was canceled or deleted, or this instance stalled long enough for another to
//! claim the job again) stops the job at the backend's next chunk, as a cancellation does (the
//! worker hands [`JobRun::cancel_flag`] to `Runner::cancel`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::service_cache::Registered;
use super::reuse::{Computed, DeviceLookup, Plan};
use crate::output::components_file::ComponentsFile;
use super::input;
use super::lease::{self, keep_lease};
use super::job_failure::JobFailure;
use super::result_files::{write_results, RESULT_NPY};
use super::services::JobServices;
use super::model::{now_ms, BatchPhase, InputKind, Job, JobStatus};
use super::result_sync;
use super::store::StoreError;
use crate::job_cache::{Digest, ResidentCube, SystemRecord};
use crate::backend::BackendError;
use crate::mnf::pipeline::ComponentSink;
use crate::mnf::result::EigenSystem;
use crate::mnf::{MnfParams, Monitor, ReuseSource, Stage};
use crate::storage::StorageError;

impl JobServices {
    /// Step 1: claims the next queued job under this instance's lease; None when the queue is empty.
    pub async fn claim(&self) -> Result<Option<JobRun>, StoreError> {
        let job = self.store.claim(&self.lease).await?;
        Ok(job.map(|job| JobRun {
            job,
            services: self.clone(),
            cancel: Arc::new(AtomicBool::new(false)),
            fed: Arc::default(),
            resident: None,
            inserted: None,
        }))
    }
}

/// One claimed job; [`JobRun::run`] takes it to its end.
#[derive(Clone)]
pub struct JobRun {
    job: Job,
    services: JobServices,
    /// Stops the job at the backend's next chunk: a cancellation, or a lease that cannot be extended.
    cancel: Arc<AtomicBool>,
    /// The job's cube, prepared on a device while its upload arrived (`jobs::upload_to_device`): the job runs
    /// on it (and that device's backend) unless the device level already holds the cube.
    ///
    /// Shared by the run's clones, so that the computation can take it: a fed cube the job does not
    /// use (the level held the cube already) is let go there, on the blocking pool, with its device
    /// memory and its mapping of the upload. Before, every clone of the run held it until the last
    /// one went, after the input's deletion, on the runtime.
    fed: Arc<Mutex<Option<Arc<ResidentCube>>>>,
    /// The job's cube, found resident on a device by its content digest (`jobs::resident_run`): the job
    /// has no stored input and runs on it (and that device's backend).
    resident: Option<Resident>,
    /// For a job started early: becomes true once its row is inserted (the register step needs the
    /// row); the sender dropped means it never will be.
    inserted: Option<tokio::sync::watch::Receiver<bool>>,
}

/// A cube resident on a device: its content digest, its key at the device level, and the cube.
#[derive(Clone)]
pub(super) struct Resident {
    pub content: Digest,
    pub key: Digest,
    pub item: Arc<ResidentCube>,
}

/// Steps 2 to 4, running on the blocking pool.
pub(super) struct Started {
    task: tokio::task::JoinHandle<Result<JobDone, JobFailure>>,
    progress: Arc<Mutex<(Stage, f64)>>,
    began: Instant,
}

impl Started {
    /// Waits for the computation, whatever its outcome, and removes what it wrote: a run that will
    /// not be finished (`jobs::early_start`, an upload that was not accepted after all).
    pub(super) async fn discard(self, services: &JobServices, id: &str) {
        let _ = self.task.await;
        services.storage.remove_scratch(&format!("job-{id}"));
    }
}

/// What steps 2 to 4 (and 6, run beside the writing of the results) leave for the store step.
struct JobDone {
    /// (product name, scratch path)
    files: Vec<(String, PathBuf)>,
    /// What the register step entered in the job cache: withdrawn if the job does not succeed.
    registered: Registered,
}

impl JobRun {
    /// The job as claimed.
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// Set it to stop the job at the backend's next chunk (a cancellation).
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }

    /// Runs the claimed job to its end, every outcome recorded (see the module doc for the steps).
    pub async fn run(self) {
        let queued_ms = (now_ms() - self.job.created_at).max(0) as u64;
        self.services.metrics.record_phase("queued", Duration::from_millis(queued_ms));
        if let Some(member) = self.job.batch.clone().filter(|m| m.phase == Some(BatchPhase::Statistics)) {
            return super::batch::run_statistics(self.services.clone(), self.job.clone(), self.cancel_flag(), member).await;
        }
        let started = self.start_compute();
        self.finish(started).await
    }

    /// A run of `job` that no worker claimed: a job started early (`jobs::early_start`), whose row does not
    /// exist yet. Its computation may start ([`JobRun::start_compute`]) before the row is inserted,
    /// and the run of the inserted row finishes it ([`JobRun::with_job`], [`JobRun::finish`]).
    pub(super) fn unclaimed(
        job: Job,
        services: JobServices,
        fed: Option<Arc<ResidentCube>>,
        inserted: tokio::sync::watch::Receiver<bool>,
    ) -> JobRun {
        let fed = Arc::new(Mutex::new(fed));
        JobRun { job, services, cancel: Arc::new(AtomicBool::new(false)), fed, resident: None, inserted: Some(inserted) }
    }

    /// A run of `job`, whose row does not exist yet, on its cube `resident` on a device
    /// (`jobs::resident_run`): [`JobRun::run_before_row`] takes it through steps 2 to 6, and the caller
    /// inserts the row once it succeeded.
    pub(super) fn on_resident(job: Job, services: JobServices, resident: Resident) -> JobRun {
        JobRun { job, services, cancel: Arc::new(AtomicBool::new(false)), fed: Arc::default(), resident: Some(resident), inserted: None }
    }

    /// Steps 2 to 6 of a run made by [`JobRun::on_resident`]: its results stored under
    /// `results/<id>/` and registered (the entries read as misses until a row says succeeded), or
    /// why not (what it wrote is removed then). Short (the cube is on the device, its eigen system
    /// usually known), so no lease is kept: no row holds one.
    pub(super) async fn run_before_row(&self) -> Result<(Registered, BTreeMap<String, String>), JobFailure> {
        let Started { task, began, .. } = self.start_compute();
        let computed = match task.await {
            Ok(r) => r,
            Err(e) => Err(JobFailure { code: "internal".into(), message: format!("the job's task ended abnormally: {e}") }),
        };
        let compute = began.elapsed();
        self.services.metrics.record_phase("compute", compute);
        let stored = match computed {
            Ok(done) => self.store_results(done).await,
            Err(f) => Err(f),
        };
        let store = began.elapsed() - compute;
        // Its scratch (the result files were moved out) goes after the answer, on the blocking pool.
        let (storage, token) = (self.services.storage.clone(), format!("job-{}", self.job.id));
        tokio::task::spawn_blocking(move || storage.remove_scratch(&token));
        tracing::debug!(
            target: "hypermnf::timing",
            job = %self.job.id,
            compute_ms = compute.as_secs_f64() * 1e3,
            store_ms = store.as_secs_f64() * 1e3,
            "a job run before its row"
        );
        if stored.is_err() {
            let _ = self.services.storage.delete_prefix(&format!("results/{}", self.job.id)).await;
        }
        stored
    }

    /// The same run (the same cancel flag) for `job`: the row as inserted, after the computation
    /// started on the job as it was before (its input still in scratch).
    pub(super) fn with_job(self, job: Job) -> JobRun {
        JobRun { job, ..self }
    }

    /// Starts steps 2 to 4 on the blocking pool.
    pub(super) fn start_compute(&self) -> Started {
        let progress = Arc::new(Mutex::new((Stage::Read, 0.0f64)));
        let me = self.clone();
        let p = progress.clone();
        let rt = tokio::runtime::Handle::current();
        let task = tokio::task::spawn_blocking(move || me.compute(p, &rt));
        Started { task, progress, began: Instant::now() }
    }

    /// Steps 5 to 7 once the computation `started` has ended (the lease kept meanwhile).
    pub(super) async fn finish(self, started: Started) {
        let id = &self.job.id;
        let computed = self.await_under_lease(started).await;
        // Step 5: the results leave scratch for storage, and scratch is cleared, before the job's
        // final status is written: a client that sees the job finished finds nothing of it left there.
        let stored = match computed {
            Ok(done) => self.store_results(done).await,
            Err(f) => Err(f),
        };
        self.services.storage.remove_scratch(&format!("job-{id}"));
        // Step 7 (step 6 ran beside the writing of the results).
        let succeeded = match stored {
            Ok((registered, results)) => self.mark_succeeded(&results, registered).await,
            Err(failure) => {
                self.mark_failed(failure).await;
                false
            }
        };
        self.services.ended.notify_waiters();
        // Not part of the job: the worker is free for the next job meanwhile (unlinking a 299 MB
        // upload takes milliseconds, and a client that saw `succeeded` may already ask for the next
        // job, which `jobs::resident_run` runs only if a worker is idle). The results go to the disk
        // first: until they are there, the input is what they can be computed again from.
        let me = self.clone();
        tokio::spawn(async move {
            let s = &me.services;
            if succeeded && s.storage.syncs_locally() && !result_sync::sync(&s.store, &s.storage, &me.job.id).await {
                return; // kept for the check at the next start
            }
            me.delete_finished_input().await
        });
    }

    /// Waits for steps 2 to 4 while a task writes progress and keeps the lease.
    async fn await_under_lease(&self, started: Started) -> Result<JobDone, JobFailure> {
        let Started { task, progress, began } = started;
        let keeper = tokio::spawn(keep_lease(self.services.clone(), self.job.id.clone(), progress, self.cancel.clone()));
        let outcome = task.await;
        self.services.metrics.record_phase("compute", began.elapsed());
        keeper.abort();
        match outcome {
            Ok(r) => r,
            Err(e) => Err(JobFailure { code: "internal".into(), message: format!("the job's task ended abnormally: {e}") }),
        }
    }

    /// Steps 2 to 4, blocking: find the cube and eigen system in the job cache or read the cube, run
    /// the MNF (only the projection when the statistics are known), write the result files into
    /// scratch.
    fn compute(&self, progress: Arc<Mutex<(Stage, f64)>>, rt: &tokio::runtime::Handle) -> Result<JobDone, JobFailure> {
        let (s, job) = (&self.services, &self.job);
        let params: MnfParams = serde_json::from_str(&job.params)
            .map_err(|e| JobFailure { code: "invalid_params".into(), message: e.to_string() })?;
        // A system named by the request (`statistics_from`): found again, and still the one the job
        // was created with (its identity is in the job's digest).
        let given = match &params.statistics_from {
            Some(id) => {
                let found = rt
                    .block_on(super::systems::resolve(&s.store, &s.storage, &job.owner, id))
                    .map_err(|e| JobFailure { code: e.code().into(), message: e.to_string() })?;
                if params.statistics_sha256.as_deref() != Some(found.identity.as_str()) {
                    return Err(JobFailure {
                        code: "system_mismatch".into(),
                        message: format!("statistics_from {id}: the system is not the one the job was created with"),
                    });
                }
                Some(found)
            }
            None => None,
        };
        let params = match &given {
            Some(g) => g.file.apply_params(&params),
            None => params,
        };
        // A cube fed to a device, or found resident on one, is on one of the backends of its choice:
        // that one.
        let mut fed = self.fed.lock().unwrap_or_else(|p| p.into_inner()).take();
        // With several devices, a cube already resident on one of them brings its job there, even
        // when this upload was fed to another (or a turn would give it another): its copy and its
        // statistics are not made again.
        let elsewhere = match &self.resident {
            Some(_) => None,
            None => {
                let candidates = s.backends.candidates(params.backend);
                let fed_on = fed.as_ref().map(|f| f.backend().clone());
                (candidates.len() > 1).then(|| {
                    candidates.into_iter().find_map(|b| {
                        let lookup = DeviceLookup::find(&s.cache, job, &b, &s.storage, rt);
                        lookup.is_resident().then_some((b, lookup))
                    })
                })
                .flatten()
                .filter(|(b, _)| fed_on.as_ref().is_none_or(|f| !Arc::ptr_eq(f, b)))
            }
        };
        if elsewhere.is_some() {
            fed = None; // the fed copy is let go
        }
        let backend = match (&elsewhere, &fed, &self.resident) {
            (Some((b, _)), _, _) => b.clone(),
            (None, Some(fed), _) => fed.backend().clone(),
            (None, None, Some(r)) => r.item.backend().clone(),
            (None, None, None) => s.backends.get(params.backend).map_err(|e| JobFailure { code: e.code().into(), message: e.to_string() })?,
        };
        let started = Instant::now();
        // A member of a pooled batch, in its second run: projected with the batch's system.
        let pooled = match job.batch.as_ref().filter(|m| m.phase == Some(BatchPhase::Project)) {
            Some(m) => Some(rt.block_on(super::batch::load_system(&s.store, &s.storage, &m.batch_id, job))?),
            None => None,
        };

        // Step 2: the cube may still be resident on the device, or have been fed to it.
        let mut found = match (&self.resident, elsewhere) {
            (Some(r), _) => DeviceLookup::of_resident(r.content, r.key, r.item.clone()),
            (None, Some((_, lookup))) => lookup,
            (None, None) => DeviceLookup::find(&s.cache, job, &backend, &s.storage, rt),
        };
        if let Some(fed) = fed {
            if found.adopt_fed(fed) {
                s.metrics.fed_to_device.fetch_add(1, Ordering::Relaxed);
            }
        }
        let looked_up = Instant::now();
        // Step 3: if not, it is read; then an eigen system may be known for it.
        let cube = match found.cube() {
            Some(cube) => cube,
            None => Arc::new(match crate::reference::Stored::of_location(&job.input_location) {
                Some(stored) => {
                    // A referenced cube: its digest was computed while it was read, when it could be.
                    let loaded = super::remote_input::load(s, job, &stored, rt)?;
                    if let Some(content) = loaded.content {
                        found.set_content(content);
                    }
                    loaded.cube
                }
                None => input::load_cube(job.input_kind, &job.input_location, &s.storage, rt).map_err(JobFailure::cube)?,
            }),
        };
        let loaded = Instant::now();
        let plan = match (given, pooled) {
            (Some(g), _) => {
                if let Some(why) = g.file.mismatch(cube.bands(), cube.meta.wavelength.as_deref(), params.components) {
                    return Err(JobFailure { code: "system_mismatch".into(), message: format!("statistics_from {}: {why}", g.id) });
                }
                let job_id = if g.kind == super::systems::SystemKind::Job { g.id.clone() } else { String::new() };
                let record = Arc::new(SystemRecord::new(g.file.system, job_id, job.owner.clone()));
                Plan::with_system(&params, &backend, found, cube, record, g.id, g.identity, ReuseSource::StatisticsFrom)
            }
            (None, Some(p)) => Plan::with_system(&params, &backend, found, cube, p.record, p.batch, p.identity, ReuseSource::Pooled),
            (None, None) => Plan::new(&s.cache, &params, &backend, found, cube, rt),
        };
        super::remote_input::remember(s, job, &plan, rt);
        tracing::debug!(
            target: "hypermnf::timing",
            job = %job.id,
            device_lookup_ms = (looked_up - started).as_secs_f64() * 1e3,
            load_ms = (loaded - looked_up).as_secs_f64() * 1e3,
            statistics_lookup_ms = loaded.elapsed().as_secs_f64() * 1e3,
            "job plan (part of the read stage)"
        );
        if plan.reuses_statistics() {
            tracing::info!(job = %job.id, "statistics found in the job cache: running the projection only");
        }

        // Step 4. The read stage runs from `started` until the pipeline reports its first other
        // stage: the lookups, the read and the reading inside the pipeline are one sample (recording
        // them apart counted every job's read twice in /metrics).
        let clock = Arc::new(Mutex::new((Stage::Read, started)));
        let monitor = {
            let progress = progress.clone();
            let clock = clock.clone();
            let metrics = s.metrics.clone();
            Monitor::new(move |stage, fraction| {
                *progress.lock().unwrap_or_else(|p| p.into_inner()) = (stage, fraction);
                let mut c = clock.lock().unwrap_or_else(|p| p.into_inner());
                if c.0 != stage {
                    metrics.record_stage(c.0, c.1.elapsed());
                    *c = (stage, Instant::now());
                }
            })
            .with_cancel_flag(self.cancel.clone())
        };
        // The components' file is written while the projection runs (`output::components_file`), and
        // step 6 starts as soon as a fresh eigen system is known (it needs only that system, and a
        // result it registers reads as a miss until the row says succeeded): both beside the
        // projection, instead of after it.
        let scratch = s.storage.scratch_dir(&format!("job-{}", job.id)).map_err(|e| JobFailure::storage(&e))?;
        let mut components = ComponentsFile::new(scratch.join(RESULT_NPY));
        let statistics_key = plan.statistics_key();
        let register_fresh = |system: &EigenSystem| {
            let record = Arc::new(SystemRecord::new(system.clone(), job.id.clone(), job.owner.clone()));
            let (me, name) = (self.clone(), backend.name());
            rt.spawn(async move { me.register(Some((statistics_key, record)), name).await })
        };
        let mut during = WhileComputing { components: &mut components, register: Some(Box::new(register_fresh)), registering: None };
        let executed = plan.execute(&s.cache, job, &params, &backend, &monitor, Some(&mut during));
        let early = during.registering.take();
        drop(during);
        // A registration is undone when the job goes no further: its entries, its eigen system's
        // row, and the stored system (nothing else of the job is under results/ before step 5).
        let unregister = |registered: Registered| {
            rt.block_on(s.cache.withdraw(&job.id, registered));
            if let Err(e) = rt.block_on(s.storage.delete_prefix(&format!("results/{}", job.id))) {
                tracing::warn!(job = %job.id, "cannot delete the stored eigen system of a job that did not succeed: {e}");
            }
        };
        let withdraw_early = |early: Option<tokio::task::JoinHandle<Registered>>| {
            if let Some(Ok(registered)) = early.map(|h| rt.block_on(h)) {
                unregister(registered);
            }
        };
        let Computed { cube, output, fresh, used } = match executed {
            Ok(c) => c,
            Err(e) => {
                withdraw_early(early);
                return Err(match components.take_error() {
                    Some(written) => JobFailure::cube(written),
                    None => JobFailure { code: e.code().into(), message: e.to_string() },
                });
            }
        };
        {
            let c = clock.lock().unwrap_or_else(|p| p.into_inner());
            s.metrics.record_stage(c.0, c.1.elapsed());
        }
        if self.cancel.load(Ordering::Relaxed) {
            withdraw_early(early);
            return Err(JobFailure { code: "canceled".into(), message: "canceled".into() });
        }

        // Step 6, unless it began with the fresh system: on the runtime while this thread writes the
        // rest of the result files.
        let registering = match early {
            Some(begun) => begun,
            None => {
                let (me, name) = (self.clone(), backend.name());
                rt.spawn(async move { me.register(fresh, name).await })
            }
        };
        *progress.lock().unwrap_or_else(|p| p.into_inner()) = (Stage::Write, 0.0);
        let write_started = Instant::now();
        tracing::debug!(
            target: "hypermnf::timing",
            job = %job.id,
            components_streamed = components.complete(),
            components_write_ms = components.writing.as_secs_f64() * 1e3,
            "components written during the projection"
        );
        let written = write_results(&scratch, &cube, &output, components.complete(), &used.encoded());
        let write_ms = write_started.elapsed().as_secs_f64() * 1e3;
        s.metrics.record_stage(Stage::Write, write_started.elapsed());
        // Freed on the blocking pool, after the job: unmapping the output's pages (37 MB for 14
        // components of the 1087 × 614 benchmark cube) took ~2 ms on the H100 host between the
        // written results and the end of the job.
        rt.spawn_blocking(move || drop((output, cube)));
        let registered = rt
            .block_on(registering)
            .map_err(|e| JobFailure { code: "internal".into(), message: format!("the register step ended abnormally: {e}") })?;
        tracing::debug!(
            target: "hypermnf::timing",
            job = %job.id,
            write_ms,
            then_register_ms = write_started.elapsed().as_secs_f64() * 1e3 - write_ms,
            "result files written (and the register step awaited)"
        );
        match written {
            Ok(files) => Ok(JobDone { files, registered }),
            Err(f) => {
                unregister(registered);
                Err(f)
            }
        }
    }

    /// Step 5: moves the written files into `results/<id>/`: what was registered, and the map of
    /// product name to storage key. A failure withdraws the registration.
    async fn store_results(&self, done: JobDone) -> Result<(Registered, BTreeMap<String, String>), JobFailure> {
        let started = Instant::now();
        let stored = self.put_results(&done.files).await;
        self.services.metrics.record_phase("store", started.elapsed());
        match stored {
            Ok(results) => Ok((done.registered, results)),
            Err(e) => {
                self.services.cache.withdraw(&self.job.id, done.registered).await;
                Err(JobFailure::storage(&e))
            }
        }
    }

    async fn put_results(&self, files: &[(String, PathBuf)]) -> Result<BTreeMap<String, String>, StorageError> {
        let mut out = BTreeMap::new();
        for (name, path) in files {
            let key = format!("results/{}/{name}", self.job.id);
            self.services.storage.put_file(path, &key).await?;
            out.insert(name.clone(), key);
        }
        Ok(out)
    }

    /// Step 6: the eigen system this job computed (`fresh`, None when it reused one) goes beside its
    /// results before the job is marked succeeded (if the job is canceled or deleted meanwhile, both
    /// go together), and the cache knows the job before anyone can see it succeeded. A job started
    /// early waits for its row first; one whose row never comes registers nothing.
    async fn register(&self, fresh: Option<(Digest, Arc<SystemRecord>)>, backend: &str) -> Registered {
        let s = &self.services;
        if let Some(inserted) = &self.inserted {
            if inserted.clone().wait_for(|&v| v).await.is_err() {
                return Registered::default();
            }
        }
        let started = Instant::now();
        let system = match &fresh {
            Some((key, record)) => s.cache.write_system(&self.job.id, *key, record, backend).await,
            None => None,
        };
        let registered = s.cache.register_before_success(&self.job, system).await;
        s.metrics.record_phase("register", started.elapsed());
        registered
    }

    /// Step 7 for a job whose results are stored and registered: whether it is now succeeded (its
    /// results marked unsynced on a local store, see `jobs::result_sync`).
    async fn mark_succeeded(&self, results: &BTreeMap<String, String>, registered: Registered) -> bool {
        let (s, id) = (&self.services, &self.job.id);
        let started = Instant::now();
        let recorded = s.store.succeed(id, &s.lease.owner, results, s.storage.syncs_locally()).await;
        s.metrics.record_phase("record", started.elapsed());
        match recorded {
            Ok(true) => {
                s.metrics.succeeded.fetch_add(1, Ordering::Relaxed);
                tracing::info!(job = %id, "job succeeded");
                // Its row as recorded, for status reads while the database is down (best effort).
                if let Ok(Some(job)) = s.store.get(id).await {
                    s.cache.remember_finished(&job);
                }
                true
            }
            Ok(false) => {
                s.cache.withdraw(id, registered).await;
                // Canceled or deleted while it ran: its results are not wanted. Claimed again by
                // another instance (this one stalled past its lease): the results prefix is that
                // instance's now, and stays.
                let abandoned = match s.store.get(id).await {
                    Ok(Some(j)) => matches!(j.status, JobStatus::Canceled | JobStatus::Failed),
                    Ok(None) => true,
                    Err(_) => false,
                };
                if abandoned {
                    let _ = s.storage.delete_prefix(&format!("results/{id}")).await;
                    s.metrics.canceled.fetch_add(1, Ordering::Relaxed);
                }
                false
            }
            Err(e) => {
                s.cache.withdraw(id, registered).await;
                tracing::error!(job = %id, "cannot record the result: {e}");
                false
            }
        }
    }

    /// Step 7 for a job that did not get through steps 2 to 5.
    async fn mark_failed(&self, f: JobFailure) {
        lease::record_failure(&self.services, &self.job.id, f).await
    }

    /// The upload is no longer needed once the job is finished (an href is not ours to delete).
    async fn delete_finished_input(&self) {
        let (s, job) = (&self.services, &self.job);
        if job.input_kind != InputKind::Href {
            if let Ok(Some(j)) = s.store.get(&job.id).await {
                if j.status.is_finished() {
                    let _ = s.storage.delete_upload(&job.input_location).await;
                }
            }
        }
    }
}

/// Starts step 6 with a fresh eigen system.
type StartRegister<'a> = Box<dyn FnOnce(&EigenSystem) -> tokio::task::JoinHandle<Registered> + 'a>;

/// What a job does while its pipeline runs: the components go to their file as they are computed,
/// and step 6 begins once a fresh eigen system is known.
struct WhileComputing<'a> {
    components: &'a mut ComponentsFile,
    register: Option<StartRegister<'a>>,
    registering: Option<tokio::task::JoinHandle<Registered>>,
}

impl ComponentSink for WhileComputing<'_> {
    fn begin(&mut self, shape: [usize; 3]) -> Result<(), BackendError> {
        self.components.begin(shape)
    }

    fn put(&mut self, first: usize, values: &[f32]) -> Result<(), BackendError> {
        self.components.put(first, values)
    }

    fn fresh_system(&mut self, system: &EigenSystem) {
        // Once: a second attempt (after a device error) computes the same system again.
        if let Some(start) = self.register.take() {
            self.registering = Some(start(system));
        }
    }
}

