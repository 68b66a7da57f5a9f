//! Workers: N tokio tasks that each claim a queued job and run it to its end, one job at a time (the
//! steps of a job's run, in order, are in [`JobRun`](super::job_run::JobRun)), and the [`Runner`]
//! that starts them and that the API shares: it wakes the workers when a job is queued, and cancels
//! a job running here by setting its run's flag (the backend stops at its next chunk).
//!
//! A claim is a lease (see `store`), which the run extends while it computes. With PostgreSQL,
//! `listen` follows the other instances' notifications: queued jobs wake a worker, cancellations
//! stop a job running here, and succeeded or deleted jobs keep this instance's job cache index
//! current.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::Notify;

use super::backends::Backends;
use super::service_cache::ServiceCache;
use super::early_start::EarlyRun;
use super::services::JobServices;
use super::metrics::JobMetrics;
use super::running::Running;
use super::store::notify::Event;
use super::store::{retry_while_unavailable, JobStore, Lease, NewJob, START_WAIT};
use crate::config::EarlyStart;
use crate::storage::Storage;

/// How often an idle worker looks at the queue without being woken (jobs queued by another process).
const IDLE_POLL: Duration = Duration::from_secs(2);
/// The longest wait between two claims while claiming fails (the database is down).
const CLAIM_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Everything a worker needs, shared with the API (which cancels through `cancel`).
pub struct Runner {
    pub store: JobStore,
    pub storage: Storage,
    pub backends: Arc<Backends>,
    pub metrics: Arc<JobMetrics>,
    pub cache: Arc<ServiceCache>,
    /// What `s3://` and `https://` inputs may name, and their clients (`--input-bucket`, `--input-host`).
    pub references: Arc<crate::reference::References>,
    /// This instance's claims.
    pub lease: Lease,
    wake: Notify,
    /// Woken whenever a job may have finished (here, or on another instance that notified): the
    /// clients that hold a `GET /v1/jobs/{id}?wait=` look at their job again.
    ended: Arc<Notify>,
    /// The jobs running here: their places (one per worker) and cancel flags.
    running: Arc<Running>,
    /// Which jobs `start_early` may start.
    early_start: EarlyStart,
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
            backends: Arc::new(backends),
            metrics: Arc::default(),
            cache: Arc::new(cache),
            references: Arc::new(crate::reference::References::none()),
            lease,
            wake: Notify::new(),
            ended: Arc::default(),
            running: Arc::new(Running::new()),
            early_start: EarlyStart::Device,
        }
    }

    /// A runner for unit tests, its database and store under `dir` (SQLite, a local store), the
    /// device level of its job cache `gpu_cache_bytes` large, its lease held as "test".
    #[cfg(test)]
    pub(crate) async fn for_test(dir: &std::path::Path, backends: Backends, gpu_cache_bytes: u64) -> Runner {
        let store = JobStore::open(&format!("sqlite://{}", dir.join("t.db").display())).await.unwrap();
        let storage = Storage::local(dir.join("objects")).unwrap();
        let settings = super::service_cache::CacheSettings { gpu_cache_bytes, index_cells: 1 << 10, index_on_gpu: false };
        let cache = ServiceCache::new(&settings, store.clone(), storage.clone()).unwrap();
        Runner::new(store, storage, backends, cache, Lease { owner: "test".into(), duration: Duration::from_secs(30) })
    }

    /// The runner of `hypermnf serve`'s options: opens the database (applying migrations), the storage
    /// and the backends; puts back in the queue the jobs a dead process left running, checks the results
    /// that had not reached the disk, and builds the job cache from the database. The workers start
    /// later ([`Runner::start`]).
    pub async fn open(args: &crate::config::ServeArgs) -> anyhow::Result<Runner> {
        let url = args.database_url();
        let store = retry_while_unavailable("open", START_WAIT, || JobStore::open(&url)).await.context("cannot open the job database")?;
        let storage = Storage::open(args.store.as_ref(), &args.data_dir).context("cannot open the storage")?;
        storage.clear_scratch();
        let (choice, devices, split) = (args.backend, args.devices.clone(), args.split_cube);
        let backends = tokio::task::spawn_blocking(move || Backends::with_devices(choice, devices, split))
            .await?
            .with_context(|| format!("cannot start the {} backend", choice.name()))?;
        let lease = Lease { owner: args.instance_id(), duration: args.lease };
        let requeued = retry_while_unavailable("requeue", START_WAIT, || store.requeue_running(&lease.owner)).await?;
        if requeued > 0 {
            tracing::info!(requeued, "jobs left running by an earlier process are queued again");
        }
        // Before the job cache is built from the database: a job whose results are computed again
        // leaves the result level.
        retry_while_unavailable("result check", START_WAIT, || super::result_sync::check_at_start(&store, &storage, &lease.owner))
            .await
            .context("cannot check the results that had not reached the disk")?;
        let cache = super::service_cache::open(args, backends.default_backend().as_ref(), &store, &storage).await?;
        Ok(Runner::new(store, storage, backends, cache, lease))
    }

    /// What `s3://` and `https://` inputs may name (none by default).
    pub fn with_references(mut self, references: crate::reference::References) -> Runner {
        self.references = Arc::new(references);
        self
    }

    /// Which uploads' jobs start before the upload is synced (`--early-start`).
    pub fn with_early_start(mut self, policy: EarlyStart) -> Runner {
        self.early_start = policy;
        self
    }

    /// Whether a job of `choice` may start early under `--early-start`.
    pub fn may_start_early(&self, choice: crate::mnf::BackendChoice) -> bool {
        match self.early_start {
            EarlyStart::Never => false,
            EarlyStart::Always => true,
            EarlyStart::Device => self.backends.on_device(choice),
        }
    }

    /// Starts `n` workers, and the listener of the other instances' notifications (PostgreSQL).
    pub fn start(self: &Arc<Self>, n: usize) -> Workers {
        self.running.add_places(n);
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
        self.running.cancel(id);
    }

    /// Starts the job `new` before its row exists, its input still in the upload's scratch files
    /// (see [`super::early_start`]), when a worker is idle (it takes that worker's place
    /// until the job ends); None otherwise (the job is queued as usual). The input is linked into the
    /// job's own scratch first, so that storing the upload (a rename) does not take it from under the
    /// computation.
    pub fn start_early(
        self: &Arc<Self>,
        new: &NewJob,
        choice: crate::mnf::BackendChoice,
        scratch_files: &[&std::path::Path],
        fed: Option<Arc<crate::job_cache::ResidentCube>>,
    ) -> Option<EarlyRun> {
        use super::model::InputKind;
        if !matches!(new.input_kind, InputKind::Npy | InputKind::Envi) || !self.may_start_early(choice) {
            return None;
        }
        let slot = self.try_take_slot()?;
        let token = format!("job-{}", new.id);
        // The upload's files under their own names (`cube.npy`, or `cube.hdr` and `cube.img`), as the
        // job's input is read from a location.
        let linked = self.storage.scratch_dir(&token).map_err(|e| e.to_string()).and_then(|dir| {
            scratch_files.iter().try_for_each(|f| {
                let name = f.file_name().ok_or_else(|| format!("{} has no file name", f.display()))?;
                std::fs::hard_link(f, dir.join(name)).map_err(|e| e.to_string())
            })
        });
        if let Err(e) = linked {
            tracing::debug!(job = %new.id, "not started early: cannot link its upload ({e})");
            self.storage.remove_scratch(&token);
            return None;
        }
        Some(EarlyRun::start(self.services(), self.running.clone(), new, format!("scratch/{token}"), slot, fed))
    }

    /// An idle worker's place, for a job run outside the workers (started early, or run on a resident
    /// cube) until the permit is dropped; None when every worker is busy.
    pub(super) fn try_take_slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.running.try_take_place()
    }

    /// Whether a worker is idle now (a job started early would take its place).
    pub fn has_idle_worker(&self) -> bool {
        self.running.has_idle_place()
    }

    /// Counts `flag`'s job as running here (`cancel` reaches it).
    pub(super) fn track(&self, id: &str, flag: Arc<AtomicBool>) {
        self.running.track(id, flag);
    }

    /// The job no longer runs here (only this run's flag: after a lapsed lease the job may run again).
    pub(super) fn untrack(&self, id: &str, flag: &Arc<AtomicBool>) {
        self.running.untrack(id, flag);
    }

    /// What the run of a job calls (the same store, storage, backends, cache and metrics as here).
    pub(super) fn services(&self) -> JobServices {
        JobServices {
            store: self.store.clone(),
            storage: self.storage.clone(),
            backends: self.backends.clone(),
            cache: self.cache.clone(),
            references: self.references.clone(),
            metrics: self.metrics.clone(),
            lease: self.lease.clone(),
            ended: self.ended.clone(),
        }
    }

    async fn work_loop(self: Arc<Self>, n: usize) {
        let services = self.services();
        // Claims failing in a row: the wait before the next doubles up to CLAIM_BACKOFF_MAX, and only
        // the first failure and the recovery are logged above debug (a database that is down for a
        // minute does not fill the log).
        let mut failing = 0u32;
        loop {
            let Some(slot) = self.running.take_place().await else { return };
            let claimed = services.claim().await;
            if claimed.is_ok() && failing > 0 {
                tracing::info!(worker = n, failed_claims = failing, "claiming jobs again");
                failing = 0;
            }
            match claimed {
                Ok(Some(run)) => {
                    // There may be more: another idle worker looks too (a batch queues many jobs at
                    // once, a pooled system makes many claimable, and one wake-up reaches one worker).
                    self.wake.notify_one();
                    let (id, flag) = (run.job().id.clone(), run.cancel_flag());
                    tracing::info!(worker = n, job = %id, attempt = run.job().attempts, "job started");
                    self.track(&id, flag.clone());
                    run.run().await;
                    self.untrack(&id, &flag);
                    drop(slot);
                }
                Ok(None) => {
                    drop(slot);
                    // One worker per instance also finishes pooled batches another instance left
                    // without their system (killed between a member's statistics and the system).
                    if n == 0 && super::batch::compute_ready_systems(&services, None).await {
                        continue; // its members can be claimed now
                    }
                    let _ = tokio::time::timeout(IDLE_POLL, self.wake.notified()).await;
                }
                Err(e) => {
                    drop(slot);
                    let wait = IDLE_POLL.saturating_mul(1 << failing.min(4)).min(CLAIM_BACKOFF_MAX);
                    if failing == 0 {
                        tracing::warn!(worker = n, "cannot claim a job: {e}; retrying, less often while it fails");
                    } else {
                        tracing::debug!(worker = n, failed_claims = failing + 1, "cannot claim a job: {e}");
                    }
                    failing = failing.saturating_add(1);
                    // A job inserted meanwhile (the database is back) wakes the worker at once.
                    let _ = tokio::time::timeout(wait, self.wake.notified()).await;
                }
            }
        }
    }
}
