//! Workers: N tokio tasks that claim queued jobs and run them. The MNF work itself runs on the blocking
//! pool (`spawn_blocking`), through the job cache (`cached_run`); progress goes to the database at most
//! every 250 ms; cancellation reaches the backend through the monitor's flag and stops it at its next
//! chunk.
//!
//! A claim is a lease (see `store`): while a job runs, its lease is extended every third of its
//! duration; when the extension fails (the job was canceled or deleted, or this instance stalled
//! long enough for another to claim the job again) the job is abandoned here, and only the lease's
//! holder records a final status. With PostgreSQL, `listen` follows the other instances'
//! notifications: queued jobs wake a worker, cancellations stop a job running here, and succeeded
//! or deleted jobs keep this instance's job cache index current.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::backends::Backends;
use super::cache::ServiceCache;
use super::cached_run::{Computed, Plan};
use super::metrics::JobMetrics;
use super::model::{product, InputKind, Job, JobStatus};
use super::store::notify::Event;
use super::store::{JobStore, Lease};
use crate::cube::CubeError;
use crate::mnf::{MnfParams, Monitor, Stage};
use crate::storage::Storage;

/// How often a running job's progress is written to the database.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);
/// How often an idle worker looks at the queue without being woken (jobs queued by another process).
const IDLE_POLL: Duration = Duration::from_secs(2);

/// Everything a worker needs, shared with the API (which cancels through `cancel`).
pub struct Runner {
    pub store: JobStore,
    pub storage: Storage,
    pub backends: Backends,
    pub metrics: JobMetrics,
    pub cache: ServiceCache,
    /// This instance's claims.
    pub lease: Lease,
    wake: Notify,
    /// Woken whenever a job may have finished (here, or on another instance that notified): the
    /// clients that hold a `GET /v1/jobs/{id}?wait=` look at their job again.
    ended: Notify,
    running: Mutex<HashMap<String, Arc<AtomicBool>>>,
}

/// Handle on the worker tasks.
pub struct Workers {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Workers {
    pub fn abort(&self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Runner {
    pub fn new(store: JobStore, storage: Storage, backends: Backends, cache: ServiceCache, lease: Lease) -> Runner {
        Runner {
            store,
            storage,
            backends,
            metrics: JobMetrics::default(),
            cache,
            lease,
            wake: Notify::new(),
            ended: Notify::new(),
            running: Mutex::new(HashMap::new()),
        }
    }

    /// Starts `n` workers, and the listener of the other instances' notifications (PostgreSQL).
    pub fn start(self: &Arc<Self>, n: usize) -> Workers {
        let mut tasks: Vec<_> = (0..n)
            .map(|i| {
                let me = self.clone();
                tokio::spawn(async move { me.work_loop(i).await })
            })
            .collect();
        let me = self.clone();
        tasks.push(tokio::spawn(async move { me.listen().await }));
        Workers { tasks }
    }

    /// Follows the notifications of the instances that share the store (none on SQLite).
    async fn listen(self: Arc<Self>) {
        let mut listener = loop {
            match self.store.listen().await {
                Ok(Some(l)) => break l,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!("cannot listen to the other instances ({e}); retrying");
                    tokio::time::sleep(IDLE_POLL).await;
                }
            }
        };
        loop {
            // `recv` reconnects by itself after a dropped connection.
            let n = match listener.recv().await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!("notification listener: {e}");
                    tokio::time::sleep(IDLE_POLL).await;
                    continue;
                }
            };
            match Event::parse(n.payload()) {
                Some(Event::Queued) => self.wake.notify_one(),
                Some(Event::Canceled(id)) => self.cancel(&id),
                Some(Event::Succeeded(id)) => {
                    self.cache.adopt_job(&id).await;
                    self.ended.notify_waiters();
                }
                Some(Event::Deleted(id)) => {
                    self.cache.forget_job(&id);
                    self.ended.notify_waiters();
                }
                None => tracing::debug!(payload = n.payload(), "unknown notification"),
            }
        }
    }

    /// A job was queued: wake a worker.
    pub fn notify(&self) {
        self.wake.notify_one();
    }

    /// A future that completes at the next `job_may_have_ended`. Enable it (`Notified::enable`) before
    /// reading the job, so that an end between the read and the await is not missed.
    pub fn job_ended(&self) -> tokio::sync::futures::Notified<'_> {
        self.ended.notified()
    }

    /// Wakes the clients waiting on a job's end (a job finished, or was canceled or deleted here).
    pub fn job_may_have_ended(&self) {
        self.ended.notify_waiters();
    }

    /// Asks the running job `id` (if it runs in this process) to stop at its next chunk.
    pub fn cancel(&self, id: &str) {
        self.ended.notify_waiters();
        if let Some(flag) = self.running.lock().unwrap_or_else(|p| p.into_inner()).get(id) {
            flag.store(true, Ordering::Relaxed);
        }
    }

    async fn work_loop(self: Arc<Self>, n: usize) {
        loop {
            match self.store.claim(&self.lease).await {
                Ok(Some(job)) => {
                    tracing::info!(worker = n, job = %job.id, attempt = job.attempts, "job started");
                    self.clone().run_job(job).await;
                }
                Ok(None) => {
                    let _ = tokio::time::timeout(IDLE_POLL, self.wake.notified()).await;
                }
                Err(e) => {
                    tracing::error!(worker = n, "cannot claim a job: {e}");
                    tokio::time::sleep(IDLE_POLL).await;
                }
            }
        }
    }

    async fn run_job(self: Arc<Self>, job: Job) {
        let id = job.id.clone();
        let queued_ms = (super::model::now_ms() - job.created_at).max(0) as u64;
        self.metrics.record_phase("queued", Duration::from_millis(queued_ms));
        let cancel = Arc::new(AtomicBool::new(false));
        self.running.lock().unwrap_or_else(|p| p.into_inner()).insert(id.clone(), cancel.clone());
        let progress = Arc::new(Mutex::new((Stage::Read, 0.0f64)));

        // Writes progress every PROGRESS_EVERY, and extends the lease every third of its duration; a
        // lease that cannot be extended (canceled, deleted, claimed again elsewhere) stops the job.
        let ticker = {
            let me = self.clone();
            let progress = progress.clone();
            let cancel = cancel.clone();
            let id = id.clone();
            tokio::spawn(async move {
                let mut last = (Stage::Read, -1.0);
                let beat_every = (me.lease.duration / 3).max(PROGRESS_EVERY);
                let mut last_beat = Instant::now();
                loop {
                    tokio::time::sleep(PROGRESS_EVERY).await;
                    let now = *progress.lock().unwrap_or_else(|p| p.into_inner());
                    if now != last {
                        last = now;
                        if let Err(e) = me.store.progress(&id, now.0.name(), overall(now.0, now.1)).await {
                            tracing::warn!(job = %id, "cannot record progress: {e}");
                        }
                    }
                    if last_beat.elapsed() >= beat_every {
                        last_beat = Instant::now();
                        match me.store.heartbeat(&id, &me.lease).await {
                            Ok(true) => {}
                            Ok(false) => {
                                tracing::info!(job = %id, "the job is no longer this instance's to run; stopping it");
                                cancel.store(true, Ordering::Relaxed);
                            }
                            // The database is away: keep computing; the final write decides.
                            Err(e) => tracing::warn!(job = %id, "cannot extend the job's lease: {e}"),
                        }
                    }
                }
            })
        };

        let outcome = {
            let me = self.clone();
            let job = job.clone();
            let cancel = cancel.clone();
            let progress = progress.clone();
            let rt = tokio::runtime::Handle::current();
            let started = Instant::now();
            let r = tokio::task::spawn_blocking(move || me.compute(&job, cancel, progress, &rt)).await;
            self.metrics.record_phase("compute", started.elapsed());
            r
        };
        ticker.abort();
        self.running.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);

        let result = match outcome {
            Ok(r) => r,
            Err(e) => Err(JobFailure { code: "internal".into(), message: format!("the job's task ended abnormally: {e}") }),
        };
        // The results leave scratch for storage, and scratch is cleared, before the job's final
        // status is written: a client that sees the job finished finds nothing of it left there.
        let result = match result {
            Ok(done) => {
                let started = Instant::now();
                let stored = self.store_results(&id, &done.files).await;
                self.metrics.record_phase("store", started.elapsed());
                match stored {
                    Ok(results) => Ok((done, results)),
                    Err(e) => Err(JobFailure::storage(&e)),
                }
            }
            Err(f) => Err(f),
        };
        self.storage.remove_scratch(&format!("job-{id}"));
        match result {
            Ok((done, results)) => {
                // The eigen system this job computed goes beside its results before the job is
                // marked succeeded: if the job is canceled or deleted meanwhile, both go together.
                let started = Instant::now();
                let system = match &done.fresh {
                    Some((key, record)) => self.cache.write_system(&id, *key, record, done.backend).await,
                    None => None,
                };
                // The cache knows the job before anyone can see it succeeded.
                let registered = self.cache.register_before_success(&job, system).await;
                self.metrics.record_phase("register", started.elapsed());
                let started = Instant::now();
                let recorded = self.store.succeed(&id, &self.lease.owner, &results).await;
                self.metrics.record_phase("record", started.elapsed());
                match recorded {
                    Ok(true) => {
                        self.metrics.succeeded.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(job = %id, "job succeeded");
                    }
                    Ok(false) => {
                        self.cache.withdraw(&id, registered).await;
                        // Canceled or deleted while it ran: its results are not wanted. Claimed again
                        // by another instance (this one stalled past its lease): the results prefix is
                        // that instance's now, and stays.
                        let abandoned = match self.store.get(&id).await {
                            Ok(Some(j)) => matches!(j.status, JobStatus::Canceled | JobStatus::Failed),
                            Ok(None) => true,
                            Err(_) => false,
                        };
                        if abandoned {
                            let _ = self.storage.delete_prefix(&format!("results/{id}")).await;
                            self.metrics.canceled.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(e) => {
                        self.cache.withdraw(&id, registered).await;
                        tracing::error!(job = %id, "cannot record the result: {e}");
                    }
                }
            }
            Err(f) if f.code == "canceled" => {
                self.metrics.canceled.fetch_add(1, Ordering::Relaxed);
                // Normally already canceled in the database; if not, record it.
                let _ = self.store.fail(&id, &self.lease.owner, "canceled", "canceled").await;
                tracing::info!(job = %id, "job stopped: canceled, or no longer this instance's");
            }
            Err(f) if f.code == JobFailure::DISK_UNAVAILABLE => {
                tracing::error!(
                    job = %id,
                    "cannot write this instance's disk ({}); the job stays queued in effect: it runs again once its lease lapses",
                    f.message
                );
            }
            Err(f) => self.finish_failed(&id, &f.code, &f.message).await,
        }
        self.ended.notify_waiters();
        // The upload is no longer needed once the job is finished (an href is not ours to delete).
        if job.input_kind != InputKind::Href {
            if let Ok(Some(j)) = self.store.get(&id).await {
                if j.status.is_finished() {
                    let _ = self.storage.delete_prefix(&job.input_location).await;
                }
            }
        }
    }

    async fn finish_failed(&self, id: &str, code: &str, message: &str) {
        tracing::warn!(job = %id, code, "job failed: {message}");
        self.metrics.failed.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.store.fail(id, &self.lease.owner, code, message).await {
            tracing::error!(job = %id, "cannot record the failure: {e}");
        }
    }

    /// Moves the written files into `results/<id>/`.
    async fn store_results(&self, id: &str, files: &[(String, std::path::PathBuf)]) -> Result<BTreeMap<String, String>, crate::storage::StorageError> {
        let mut out = BTreeMap::new();
        for (name, path) in files {
            let key = format!("results/{id}/{name}");
            self.storage.put_file(path, &key).await?;
            out.insert(name.clone(), key);
        }
        Ok(out)
    }

    /// The blocking part: find the cube and eigen system (job cache) or read the cube, run the MNF
    /// (only the projection when the statistics are known), write the result files into scratch.
    fn compute(
        self: &Arc<Self>,
        job: &Job,
        cancel: Arc<AtomicBool>,
        progress: Arc<Mutex<(Stage, f64)>>,
        rt: &tokio::runtime::Handle,
    ) -> Result<JobDone, JobFailure> {
        let params: MnfParams = serde_json::from_str(&job.params)
            .map_err(|e| JobFailure { code: "invalid_params".into(), message: e.to_string() })?;
        let backend = self.backends.get(params.backend).map_err(|e| JobFailure { code: e.code().into(), message: e.to_string() })?;
        let started = Instant::now();
        let plan = Plan::open(&self.cache, job, &params, &backend, &self.storage, rt).map_err(JobFailure::cube)?;
        if plan.reuses_statistics() {
            tracing::info!(job = %job.id, "statistics found in the job cache: running the projection only");
        }

        // The read stage runs from here until the pipeline reports its first other stage: opening the
        // plan and the reading inside the pipeline are one sample (recording them apart counted every
        // job's read twice in /metrics).
        let clock = Arc::new(Mutex::new((Stage::Read, started)));
        let monitor = {
            let progress = progress.clone();
            let clock = clock.clone();
            let me = self.clone();
            Monitor::new(move |stage, fraction| {
                *progress.lock().unwrap_or_else(|p| p.into_inner()) = (stage, fraction);
                let mut c = clock.lock().unwrap_or_else(|p| p.into_inner());
                if c.0 != stage {
                    me.metrics.record_stage(c.0, c.1.elapsed());
                    *c = (stage, Instant::now());
                }
            })
            .with_cancel_flag(cancel.clone())
        };
        let Computed { cube, output, fresh } = plan
            .execute(&self.cache, job, &params, &backend, &monitor)
            .map_err(|e| JobFailure { code: e.code().into(), message: e.to_string() })?;
        {
            let c = clock.lock().unwrap_or_else(|p| p.into_inner());
            self.metrics.record_stage(c.0, c.1.elapsed());
        }
        if cancel.load(Ordering::Relaxed) {
            return Err(JobFailure { code: "canceled".into(), message: "canceled".into() });
        }

        *progress.lock().unwrap_or_else(|p| p.into_inner()) = (Stage::Write, 0.0);
        let write_started = Instant::now();
        let dir = self
            .storage
            .scratch_dir(&format!("job-{}", job.id))
            .map_err(|e| JobFailure::storage(&e))?;
        let mut files = Vec::new();
        // The same writer as `hypermnf run --out`, once as .npy and once as ENVI, so that every download
        // holds exactly the bytes the command line would have written. The two are written side by side:
        // the ENVI files are band-sequential, a transposition that took as long as the rest of the write.
        let envi_dir = dir.join("envi");
        let (npy, envi) = std::thread::scope(|s| {
            let envi = s.spawn(|| {
                std::fs::create_dir_all(&envi_dir).map_err(|e| JobFailure::storage(&e))?;
                crate::output::write_result(&envi_dir.join("result.hdr"), &output, &cube.meta).map_err(JobFailure::cube)
            });
            let npy = crate::output::write_result(&dir.join("result.npy"), &output, &cube.meta).map_err(JobFailure::cube);
            let envi = envi.join().unwrap_or_else(|_| Err(JobFailure { code: "internal".into(), message: "the ENVI writer panicked".into() }));
            (npy, envi)
        });
        let (npy, envi) = (npy?, envi?);
        files.push((product::COMPONENTS_NPY.to_string(), npy.components));
        files.push((product::METADATA.to_string(), npy.metadata));
        if let Some(d) = npy.denoised {
            files.push((product::DENOISED_NPY.to_string(), d));
        }
        files.push((product::COMPONENTS_HDR.to_string(), envi.components));
        if let Some(img) = envi.components_data {
            files.push((product::COMPONENTS_IMG.to_string(), img));
        }
        if let Some(d) = envi.denoised {
            files.push((product::DENOISED_HDR.to_string(), d));
        }
        if let Some(d) = envi.denoised_data {
            files.push((product::DENOISED_IMG.to_string(), d));
        }
        self.metrics.record_stage(Stage::Write, write_started.elapsed());
        Ok(JobDone { files, fresh, backend: backend.name() })
    }
}

/// What a successful computation leaves for `run_job` to store.
struct JobDone {
    /// (product name, scratch path)
    files: Vec<(String, std::path::PathBuf)>,
    /// The eigen system the job computed (None when it reused one), with its statistics key.
    fresh: Option<(crate::cache::Digest, Arc<crate::cache::SystemRecord>)>,
    backend: &'static str,
}

/// Overall progress from a stage and the fraction of it done.
fn overall(stage: Stage, fraction: f64) -> f64 {
    let (start, width) = match stage {
        Stage::Read => (0.0, 0.05),
        Stage::Statistics => (0.05, 0.45),
        Stage::Eigen => (0.5, 0.05),
        Stage::Projection => (0.55, 0.3),
        Stage::Inverse => (0.85, 0.1),
        Stage::Write => (0.95, 0.05),
    };
    (start + width * fraction.clamp(0.0, 1.0)).min(1.0)
}

/// Why a job failed: a stable code and a message for the user.
#[derive(Debug)]
pub struct JobFailure {
    pub code: String,
    pub message: String,
}

impl JobFailure {
    /// The code of a failure to write this instance's own disk that a later attempt can get past
    /// (full, read-only, not permitted). Such a job is not failed: `run_job` leaves it running without
    /// a heartbeat, its lease lapses, and it is claimed again (here or elsewhere), so that an accepted
    /// job is not lost to a disk that was full or read-only for a while.
    pub const DISK_UNAVAILABLE: &'static str = "disk_unavailable";

    fn cube(e: CubeError) -> JobFailure {
        let code = if is_disk_condition(&e) { Self::DISK_UNAVAILABLE } else { e.code() };
        JobFailure { code: code.into(), message: e.to_string() }
    }

    /// A storage or local file error: `DISK_UNAVAILABLE` for a disk condition, else `storage_error`.
    fn storage(e: &(dyn std::error::Error + 'static)) -> JobFailure {
        let code = if is_disk_condition(e) { Self::DISK_UNAVAILABLE } else { "storage_error" };
        JobFailure { code: code.into(), message: e.to_string() }
    }
}

/// True when `e` (or an error it wraps) is a local I/O error of a full, read-only or forbidden disk.
fn is_disk_condition(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT | libc::EROFS | libc::EACCES | libc::EPERM)) {
                return true;
            }
        }
        next = err.source();
    }
    false
}
