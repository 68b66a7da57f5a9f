//! The job cache as the service uses it: one per process, shared by the API (result level, on job
//! creation) and the runs of jobs (`job_run`, which looks up the statistics and device levels
//! through `reuse`, then registers what a job computed). It calls only the store and the
//! storage, never the run that uses it.
//!
//! * Result level: `(job digest, owner)` → the SQLite row id of a succeeded job. A hit is checked
//!   against the row (same owner, same digest, still succeeded) before it is answered; anything else
//!   is a miss, and the SQLite lookup that follows on a miss still finds queued and running jobs.
//! * Statistics level: statistics key → the id of a stored eigen system (`eigen_systems` row, file
//!   under `results/<job>/`). The file is read and checked (version, checksum) on every hit.
//! * Device level: see [`crate::job_cache::DeviceLevel`]; on only for backends with device memory and
//!   `--gpu-cache-bytes` > 0.
//!
//! * Finished documents: the rows of succeeded jobs this instance has seen succeed or read as
//!   succeeded, the newest [`FINISHED_JOBS`] of them, so that `GET /v1/jobs/{id}` can still answer
//!   for them while the database cannot be reached (a succeeded job's document changes no more; it
//!   can only be deleted). Never used while the database answers.
//!
//! The indexes are rebuilt from the rows at start; an entry is removed when its job is deleted or
//! expires ([`ServiceCache::forget_job`]). Index failures (a GPU index that stops working, say) are
//! logged and read as misses: the cache may lose speed, never a job.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use anyhow::Context;

use crate::backend::Backend;
use crate::job_cache::keys::{self, result_key};
use crate::job_cache::{eigen_file, CacheConfig, CacheError, CacheStats, DeviceLevel, DeviceLruStats, Digest, Handle, IndexBackend, JobCache, Level, SystemRecord};
use crate::jobs::model::Job;
use crate::jobs::store::{JobStore, NewEigenRow, StoreError};
use crate::jobs::JobStatus;
use crate::storage::Storage;

/// The service's cache for `hypermnf serve`'s options, rebuilt from the database (at start).
/// `default_backend` is the one `auto` jobs run on: its device, if any, takes the indexes.
pub async fn open(args: &crate::config::ServeArgs, default_backend: &dyn Backend, store: &JobStore, storage: &Storage) -> anyhow::Result<ServiceCache> {
    let settings = CacheSettings::for_service(args.gpu_cache_bytes, default_backend);
    let (store, storage) = (store.clone(), storage.clone());
    // A GPU index allocates device memory and may compile its kernels: off the async threads.
    let cache = tokio::task::spawn_blocking(move || ServiceCache::new(&settings, store, storage))
        .await?
        .context("cannot create the job cache")?;
    crate::jobs::store::retry_while_unavailable("job cache", crate::jobs::store::START_WAIT, || cache.rebuild())
        .await
        .context("cannot rebuild the job cache from the database")?;
    Ok(cache)
}

/// Name of the stored eigen system beside a job's results.
pub(crate) const EIGEN_OBJECT: &str = "eigen-system.bin";

/// How the cache is set up (from `hypermnf serve`'s options).
#[derive(Debug, Clone)]
pub struct CacheSettings {
    /// Device-resident level budget in bytes; 0 switches the level off.
    pub gpu_cache_bytes: u64,
    /// Index capacity per level, in cells (a power of two).
    pub index_cells: u64,
    /// Put the indexes on the GPU (when one is usable; else the CPU twin).
    pub index_on_gpu: bool,
}

impl CacheSettings {
    /// The service's cache: `gpu_cache_bytes` for the device level, indexes of 2^17 cells per level
    /// (about 114 000 entries each), on the GPU when the default backend has one.
    pub fn for_service(gpu_cache_bytes: u64, default_backend: &dyn Backend) -> CacheSettings {
        CacheSettings {
            gpu_cache_bytes,
            index_cells: CacheConfig::default().index_cells,
            index_on_gpu: default_backend.memory_in_use().is_some(),
        }
    }
}

/// Counters of every level, for `/metrics`.
#[derive(Debug, Clone)]
pub struct CacheReport {
    pub levels: CacheStats,
    pub device: Option<DeviceLruStats>,
    pub index: IndexBackend,
}

/// The index entries a job owns, so that deleting the job removes exactly those.
#[derive(Default)]
struct Owned {
    result: Option<(Digest, Handle)>,
    statistics: Vec<(Digest, Handle)>,
}

/// The device level, one per CUDA device: a cube resident on device 1 serves only jobs that run on
/// device 1 (the job's backend is its device's). Each has the whole `--gpu-cache-bytes` budget and is
/// created at its device's first job.
struct DeviceLevels {
    budget: u64,
    /// Index = device ordinal (backends without one, like the tests' fake devices, use 0).
    levels: Vec<OnceLock<DeviceLevel>>,
}

/// Device ordinals with a device level; jobs on a device beyond them run without one.
const MAX_DEVICE_LEVELS: usize = 64;

impl DeviceLevels {
    fn new(budget: u64) -> Self {
        DeviceLevels { budget, levels: (0..MAX_DEVICE_LEVELS).map(|_| OnceLock::new()).collect() }
    }

    /// The counters of every device's level added up (one empty level's when no job has run yet).
    fn stats(&self) -> DeviceLruStats {
        let mut sum: Option<DeviceLruStats> = None;
        for s in self.levels.iter().filter_map(|l| l.get()).map(|l| l.stats()) {
            let t = sum.get_or_insert_with(DeviceLruStats::default);
            t.hits += s.hits;
            t.misses += s.misses;
            t.evictions += s.evictions;
            t.refused += s.refused;
            t.entries += s.entries;
            t.bytes += s.bytes;
            t.budget_bytes += s.budget_bytes;
        }
        sum.unwrap_or(DeviceLruStats { budget_bytes: self.budget, ..DeviceLruStats::default() })
    }
}

/// How many succeeded jobs' rows [`ServiceCache`] keeps for status reads during a database outage.
/// A row is about 1 KB (its parameters, input summary and result keys), so at most a few MB.
pub const FINISHED_JOBS: usize = 4096;

/// The rows of the newest succeeded jobs, by id; the oldest goes first once `capacity` is reached.
struct FinishedJobs {
    jobs: HashMap<String, Job>,
    /// Ids in the order they came in (a forgotten id stays until its turn, then removes nothing).
    order: VecDeque<String>,
    capacity: usize,
}

impl FinishedJobs {
    fn new(capacity: usize) -> Self {
        FinishedJobs { jobs: HashMap::new(), order: VecDeque::new(), capacity }
    }

    fn insert(&mut self, job: &Job) {
        if self.jobs.insert(job.id.clone(), job.clone()).is_some() {
            return; // already in line
        }
        self.order.push_back(job.id.clone());
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.jobs.remove(&old);
            }
        }
    }
}

pub struct ServiceCache {
    index: Mutex<JobCache>,
    device: Option<DeviceLevels>,
    owned: Mutex<HashMap<String, Owned>>,
    finished: Mutex<FinishedJobs>,
    store: JobStore,
    storage: Storage,
}

/// What [`ServiceCache::register_before_success`] recorded, for [`ServiceCache::withdraw`].
#[derive(Debug, Default)]
#[must_use = "withdraw it if the job does not succeed"]
pub struct Registered {
    eigen_row: Option<i64>,
}

/// An eigen system written next to a job's results, waiting for the job to succeed.
#[derive(Debug, Clone)]
pub struct StoredSystem {
    key: Digest,
    storage_key: String,
    bytes: i64,
    backend: String,
}

impl ServiceCache {
    pub fn new(settings: &CacheSettings, store: JobStore, storage: Storage) -> Result<ServiceCache, CacheError> {
        let index = JobCache::new(&CacheConfig { index_cells: settings.index_cells, prefer_gpu: settings.index_on_gpu })?;
        tracing::info!(index = ?index.index_backend(), gpu_cache_bytes = settings.gpu_cache_bytes, "job cache ready");
        Ok(ServiceCache {
            index: Mutex::new(index),
            device: (settings.gpu_cache_bytes > 0).then(|| DeviceLevels::new(settings.gpu_cache_bytes)),
            owned: Mutex::new(HashMap::new()),
            finished: Mutex::new(FinishedJobs::new(FINISHED_JOBS)),
            store,
            storage,
        })
    }

    fn finished(&self) -> MutexGuard<'_, FinishedJobs> {
        self.finished.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A job's row as just read from the database or recorded: kept if it succeeded (for
    /// [`ServiceCache::finished_job`]), dropped otherwise.
    pub fn remember_finished(&self, job: &Job) {
        let mut finished = self.finished();
        if job.status == JobStatus::Succeeded {
            finished.insert(job);
        } else {
            finished.jobs.remove(&job.id);
        }
    }

    /// The row of succeeded job `id` as this instance last saw it, if it still keeps it: for status
    /// reads while the database cannot be reached, and only then (the database is the truth).
    pub fn finished_job(&self, id: &str) -> Option<Job> {
        self.finished().jobs.get(id).cloned()
    }

    fn index(&self) -> MutexGuard<'_, JobCache> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn owned(&self) -> MutexGuard<'_, HashMap<String, Owned>> {
        self.owned.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fills both indexes from the database (at start).
    pub async fn rebuild(&self) -> Result<(), StoreError> {
        let results = self.store.succeeded_for_cache().await?;
        let systems = self.store.eigen_for_cache(eigen_file::FORMAT_VERSION as i64).await?;
        let mut owned: HashMap<String, Owned> = HashMap::new();
        let mut rows = Vec::with_capacity(results.len() + systems.len());
        for (rowid, id, owner, digest) in &results {
            let key = result_key(digest, owner);
            rows.push((Level::Result, key, *rowid as Handle));
            owned.entry(id.clone()).or_default().result = Some((key, *rowid as Handle));
        }
        for row in &systems {
            let Some(key) = keys::parse_hex(&row.digest) else {
                tracing::warn!(id = row.id, "stored eigen system with a malformed key; left out of the cache");
                continue;
            };
            rows.push((Level::Statistics, key, row.id as Handle));
            owned.entry(row.job_id.clone()).or_default().statistics.push((key, row.id as Handle));
        }
        let outcome = self.index().rebuild(rows);
        match outcome {
            Ok(dropped) => {
                *self.owned() = owned;
                let s = self.index().stats();
                tracing::info!(
                    results = s.result.entries,
                    statistics = s.statistics.entries,
                    dropped = dropped.len(),
                    "job cache rebuilt from the database"
                );
            }
            Err(e) => tracing::warn!("cannot rebuild the job cache ({e}); starting with it empty"),
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------------------
    // Result level

    /// The caller's succeeded job of `job_digest`, if the result level has it.
    pub async fn find_result(&self, owner: &str, job_digest: &str) -> Result<Option<Job>, StoreError> {
        let key = result_key(job_digest, owner);
        let found = self.index().lookup(Level::Result, &key);
        let handle = match found {
            Ok(Some(h)) => h,
            Ok(None) => return Ok(None),
            Err(e) => {
                tracing::warn!("result cache lookup failed: {e}");
                return Ok(None);
            }
        };
        match self.store.get_by_rowid(handle as i64).await? {
            Some(job) if job.owner == owner && job.digest == job_digest && job.status == JobStatus::Succeeded => Ok(Some(job)),
            // Registered just before it is marked succeeded: not yet a hit, and not stale either.
            Some(job) if job.owner == owner && job.digest == job_digest && job.status == JobStatus::Running => Ok(None),
            _ => {
                // Deleted, or its row id now names another job: the entry is stale.
                let _ = self.index().remove_if(Level::Result, &key, handle);
                Ok(None)
            }
        }
    }

    // -----------------------------------------------------------------------------------------------
    // Statistics level

    /// The stored eigen system of statistics key `key`, read and checked.
    pub async fn find_system(&self, key: &Digest) -> Option<Arc<SystemRecord>> {
        let found = self.index().lookup(Level::Statistics, key);
        let handle = match found {
            Ok(h) => h?,
            Err(e) => {
                tracing::warn!("statistics cache lookup failed: {e}");
                return None;
            }
        };
        let stale = || {
            let _ = self.index().remove_if(Level::Statistics, key, handle);
        };
        let row = match self.store.eigen_by_id(handle as i64).await {
            Ok(Some(row)) if keys::parse_hex(&row.digest).as_ref() == Some(key) => row,
            Ok(_) => {
                stale();
                return None;
            }
            Err(e) => {
                tracing::warn!("cannot read the eigen system row {handle}: {e}");
                return None;
            }
        };
        let system = match self.storage.get_bytes(&row.storage_key).await {
            Ok(bytes) => eigen_file::decode(&bytes).map(|s| (s, bytes)).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match system {
            Ok((system, bytes)) => Some(Arc::new(SystemRecord::with_encoded(system, row.job_id, row.owner, bytes))),
            Err(why) => {
                // Unusable for good (missing, damaged, another format): recompute from now on.
                tracing::warn!(job = %row.job_id, key = %row.storage_key, "stored eigen system unusable ({why}); forgetting it");
                stale();
                let _ = self.store.delete_eigen(row.id).await;
                let _ = self.storage.delete_prefix(&row.storage_key).await;
                None
            }
        }
    }

    /// Writes the eigen system job `job_id` computed next to its results; recorded by `register_before_success`.
    pub async fn write_system(&self, job_id: &str, key: Digest, record: &SystemRecord, backend: &str) -> Option<StoredSystem> {
        let bytes = record.encoded();
        let storage_key = format!("results/{job_id}/{EIGEN_OBJECT}");
        let n = bytes.len() as i64;
        match self.storage.put_bytes(&storage_key, bytes).await {
            Ok(()) => Some(StoredSystem { key, storage_key, bytes: n, backend: backend.to_string() }),
            Err(e) => {
                tracing::warn!(job = %job_id, "cannot store the eigen system: {e}");
                None
            }
        }
    }

    /// A job is about to be marked succeeded: its result, and the eigen system it computed (if any),
    /// enter the cache first. Done in this order so that a client that sees the job succeeded (and
    /// repeats the request, or changes only the projection) always finds both; until the job row
    /// says succeeded, a result-level hit reads as a miss and the running job is found in SQLite
    /// instead, and a statistics-level hit uses a system that is already completely stored.
    /// If the job then does not succeed (canceled meanwhile), [`ServiceCache::withdraw`] undoes this.
    pub async fn register_before_success(&self, job: &Job, system: Option<StoredSystem>) -> Registered {
        let mut registered = Registered::default();
        match self.store.rowid_of(&job.id).await {
            Ok(Some(rowid)) => {
                let key = result_key(&job.digest, &job.owner);
                let inserted = self.index().insert(Level::Result, &key, rowid as Handle);
                match inserted {
                    Ok(_) => self.owned().entry(job.id.clone()).or_default().result = Some((key, rowid as Handle)),
                    Err(e) => tracing::warn!(job = %job.id, "cannot cache the result: {e}"),
                }
            }
            Ok(None) => {} // deleted meanwhile
            Err(e) => tracing::warn!(job = %job.id, "cannot cache the result: {e}"),
        }
        let Some(s) = system else { return registered };
        let row = NewEigenRow {
            digest: hex::encode(s.key),
            job_id: job.id.clone(),
            storage_key: s.storage_key.clone(),
            format_version: eigen_file::FORMAT_VERSION as i64,
            backend: s.backend.clone(),
            bytes: s.bytes,
        };
        match self.store.insert_eigen(&row).await {
            Ok(Some(id)) => {
                registered.eigen_row = Some(id);
                let inserted = self.index().insert(Level::Statistics, &s.key, id as Handle);
                match inserted {
                    Ok(_) => self.owned().entry(job.id.clone()).or_default().statistics.push((s.key, id as Handle)),
                    Err(e) => tracing::warn!(job = %job.id, "cannot cache the eigen system: {e}"),
                }
            }
            Ok(None) | Err(_) => {
                // Another job stored the same system first, or this job is gone: this copy is not needed.
                let _ = self.storage.delete_prefix(&s.storage_key).await;
            }
        }
        registered
    }

    /// The job registered by [`ServiceCache::register_before_success`] did not succeed after all
    /// (canceled or deleted while it ran): its entries and its eigen system row go. Its files are
    /// the caller's to delete.
    pub async fn withdraw(&self, job_id: &str, registered: Registered) {
        self.forget_job(job_id);
        if let Some(id) = registered.eigen_row {
            if let Err(e) = self.store.delete_eigen(id).await {
                tracing::warn!(job = %job_id, "cannot forget the eigen system row {id}: {e}");
            }
        }
    }

    /// Another instance sharing the store says job `id` succeeded: its result, and the eigen systems
    /// it stored, enter this instance's indexes (the database is the truth; the index follows it).
    /// A job this instance registered itself is left as it is.
    pub async fn adopt_job(&self, id: &str) {
        if self.owned().contains_key(id) {
            return;
        }
        let entry = match self.store.succeeded_cache_entry(id).await {
            Ok(Some(e)) => e,
            Ok(None) => return, // deleted again meanwhile
            Err(e) => {
                tracing::warn!(job = %id, "cannot read the job another instance finished: {e}");
                return;
            }
        };
        let systems = self.store.eigen_of_job(id, eigen_file::FORMAT_VERSION as i64).await.unwrap_or_else(|e| {
            tracing::warn!(job = %id, "cannot read the eigen systems another instance stored: {e}");
            Vec::new()
        });
        let (handle, owner, digest) = entry;
        let mut owned = Owned::default();
        let mut index = self.index();
        let key = result_key(&digest, &owner);
        match index.insert(Level::Result, &key, handle as Handle) {
            Ok(_) => owned.result = Some((key, handle as Handle)),
            Err(e) => tracing::warn!(job = %id, "cannot cache the result: {e}"),
        }
        for row in systems {
            let Some(key) = keys::parse_hex(&row.digest) else { continue };
            match index.insert(Level::Statistics, &key, row.id as Handle) {
                Ok(_) => owned.statistics.push((key, row.id as Handle)),
                Err(e) => tracing::warn!(job = %id, "cannot cache the eigen system: {e}"),
            }
        }
        drop(index);
        self.owned().insert(id.to_string(), owned);
    }

    /// A job was deleted (or expired): its entries leave the indexes, and its row the finished
    /// documents. Its eigen system rows went with its row, and its files with its results.
    pub fn forget_job(&self, job_id: &str) {
        self.finished().jobs.remove(job_id);
        let Some(owned) = self.owned().remove(job_id) else { return };
        let mut index = self.index();
        if let Some((key, h)) = owned.result {
            let _ = index.remove_if(Level::Result, &key, h);
        }
        for (key, h) in owned.statistics {
            let _ = index.remove_if(Level::Statistics, &key, h);
        }
    }

    // -----------------------------------------------------------------------------------------------
    // Device level

    /// The device level of `backend`'s device: none when it is off, or the backend has no device memory.
    pub fn device_for(&self, backend: &dyn Backend) -> Option<&DeviceLevel> {
        let levels = self.device.as_ref()?;
        backend.memory_in_use()?;
        let slot = levels.levels.get(backend.ordinal().unwrap_or(0))?;
        Some(slot.get_or_init(|| DeviceLevel::new(levels.budget)))
    }

    pub fn report(&self) -> CacheReport {
        let index = self.index();
        CacheReport { levels: index.stats(), device: self.device.as_ref().map(|d| d.stats()), index: index.index_backend().clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::store::Inserted;
    use crate::jobs::NewJob;

    async fn fixture() -> (ServiceCache, JobStore, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = JobStore::open(&format!("sqlite://{}", dir.path().join("t.db").display())).await.unwrap();
        let storage = Storage::local(dir.path().join("objects")).unwrap();
        let settings = CacheSettings { gpu_cache_bytes: 0, index_cells: 1 << 10, index_on_gpu: false };
        (ServiceCache::new(&settings, store.clone(), storage).unwrap(), store, dir)
    }

    /// A backend that claims device memory on device `ordinal` (the device level only asks that).
    struct OnDevice(Option<usize>);
    impl Backend for OnDevice {
        fn name(&self) -> &'static str {
            "cuda"
        }
        fn device(&self) -> String {
            format!("device {:?}", self.0)
        }
        fn memory_in_use(&self) -> Option<(u64, u64)> {
            Some((0, 1 << 30))
        }
        fn ordinal(&self) -> Option<usize> {
            self.0
        }
        fn prepare<'c>(&'c self, _: &'c crate::cube::Cube, _: &crate::mnf::Monitor) -> Result<Box<dyn crate::backend::PreparedCube + Send + 'c>, crate::backend::BackendError> {
            Err(crate::backend::BackendError::Unavailable("not a real device".into()))
        }
    }

    /// One device level per device: a cube resident on device 1 is never found by a job on device 0.
    #[tokio::test]
    async fn each_device_has_its_own_device_level() {
        let dir = tempfile::tempdir().unwrap();
        let store = JobStore::open(&format!("sqlite://{}", dir.path().join("t.db").display())).await.unwrap();
        let storage = Storage::local(dir.path().join("objects")).unwrap();
        let settings = CacheSettings { gpu_cache_bytes: 1 << 20, index_cells: 1 << 10, index_on_gpu: false };
        let cache = ServiceCache::new(&settings, store, storage).unwrap();
        assert_eq!(cache.report().device.map(|d| d.budget_bytes), Some(1 << 20), "reported before any job");
        let (d0, d1, none) = (OnDevice(Some(0)), OnDevice(Some(1)), OnDevice(None));
        let l0 = cache.device_for(&d0).expect("level of device 0") as *const DeviceLevel;
        let l1 = cache.device_for(&d1).expect("level of device 1") as *const DeviceLevel;
        assert_ne!(l0, l1, "devices 0 and 1 share no level");
        assert_eq!(cache.device_for(&d1).unwrap() as *const DeviceLevel, l1, "the same level on every call");
        assert_eq!(cache.device_for(&none).unwrap() as *const DeviceLevel, l0, "no ordinal: device 0's level");
        assert!(cache.device_for(&OnDevice(Some(MAX_DEVICE_LEVELS))).is_none());
        assert!(cache.device_for(&crate::backend::cpu::CpuBackend::new()).is_none());
        // Two levels in use: their budgets add up in the report.
        assert_eq!(cache.report().device.map(|d| d.budget_bytes), Some(2 << 20));
    }

    /// Inserts job `id` and claims it, as a worker does.
    async fn running_job(store: &JobStore, id: &str) -> Job {
        assert!(matches!(store.insert(NewJob::for_test(id)).await.unwrap(), Inserted::Created(_)));
        let job = store.claim(&crate::jobs::store::Lease { owner: "test".into(), duration: std::time::Duration::from_secs(30) }).await.unwrap().expect("the queued job");
        assert_eq!((job.id.as_str(), job.status), (id, JobStatus::Running));
        job
    }

    fn system(job: &Job, key: u8) -> StoredSystem {
        StoredSystem { key: [key; 32], storage_key: format!("results/{}/{EIGEN_OBJECT}", job.id), bytes: 10, backend: "cpu".into() }
    }

    /// The worker registers a job's entries before the job row says succeeded (CI once saw the job
    /// succeeded while its eigen system was not yet indexed): in between, the result entry is not a
    /// hit but stays; once the row says succeeded it is.
    #[tokio::test]
    async fn a_job_is_in_the_cache_before_it_reads_as_succeeded() {
        let (cache, store, _dir) = fixture().await;
        let job = running_job(&store, "j1").await;
        let registered = cache.register_before_success(&job, Some(system(&job, 1))).await;
        let s = cache.report().levels;
        assert_eq!((s.result.entries, s.statistics.entries), (1, 1));
        assert!(registered.eigen_row.is_some());

        assert!(cache.find_result("alice", &job.digest).await.unwrap().is_none(), "still running: not a hit");
        assert_eq!(cache.report().levels.result.entries, 1, "and not dropped as stale");
        assert!(store.succeed(&job.id, "test", &Default::default(), false).await.unwrap());
        let hit = cache.find_result("alice", &job.digest).await.unwrap().expect("a hit once succeeded");
        assert_eq!(hit.id, job.id);
        assert!(cache.find_result("bob", &job.digest).await.unwrap().is_none(), "another owner's result");
    }

    /// Another instance on the same store finished a job: after `adopt_job` (what its notification
    /// triggers) this instance's indexes answer for its result and its eigen system, and a deletion
    /// takes them out again.
    #[tokio::test]
    async fn a_job_finished_by_another_instance_is_adopted() {
        let (here, store, dir) = fixture().await;
        let settings = CacheSettings { gpu_cache_bytes: 0, index_cells: 1 << 10, index_on_gpu: false };
        let there = ServiceCache::new(&settings, store.clone(), Storage::local(dir.path().join("objects")).unwrap()).unwrap();
        let job = running_job(&store, "j4").await;
        let registered = there.register_before_success(&job, Some(system(&job, 4))).await;
        assert!(registered.eigen_row.is_some());
        assert!(store.succeed(&job.id, "test", &Default::default(), false).await.unwrap());
        assert!(here.find_result("alice", &job.digest).await.unwrap().is_none(), "not yet known here");

        here.adopt_job(&job.id).await;
        here.adopt_job(&job.id).await; // a repeated notification changes nothing
        let s = here.report().levels;
        assert_eq!((s.result.entries, s.statistics.entries), (1, 1));
        assert_eq!(here.find_result("alice", &job.digest).await.unwrap().map(|j| j.id), Some(job.id.clone()));
        here.forget_job(&job.id);
        let s = here.report().levels;
        assert_eq!((s.result.entries, s.statistics.entries), (0, 0));
        here.adopt_job("no-such-job").await;
        assert_eq!(here.report().levels.result.entries, 0);
    }

    /// The finished documents keep succeeded jobs only, the newest `capacity` of them, and lose a
    /// job when it is forgotten (deleted or expired).
    #[tokio::test]
    async fn finished_documents_are_bounded_and_forgotten() {
        let (cache, store, _dir) = fixture().await;
        let mut job = running_job(&store, "j5").await;
        cache.remember_finished(&job);
        assert!(cache.finished_job("j5").is_none(), "a running job is not kept");
        job.status = JobStatus::Succeeded;
        cache.remember_finished(&job);
        assert_eq!(cache.finished_job("j5").map(|j| j.status), Some(JobStatus::Succeeded));
        cache.forget_job("j5");
        assert!(cache.finished_job("j5").is_none(), "deleted: gone");

        let mut finished = FinishedJobs::new(3);
        for n in 0..5 {
            job.id = format!("k{n}");
            finished.insert(&job);
            finished.insert(&job); // read twice: still one place in line
        }
        let mut kept: Vec<_> = finished.jobs.keys().cloned().collect();
        kept.sort();
        assert_eq!(kept, ["k2", "k3", "k4"], "the newest three");
        assert_eq!(finished.order.len(), 3);
    }

    /// A job canceled while it was being registered leaves nothing behind: no index entries, no
    /// eigen system row.
    #[tokio::test]
    async fn a_job_that_does_not_succeed_is_withdrawn() {
        let (cache, store, _dir) = fixture().await;
        let job = running_job(&store, "j2").await;
        let registered = cache.register_before_success(&job, Some(system(&job, 2))).await;
        let row = registered.eigen_row.unwrap();
        assert!(store.cancel(&job.id).await.unwrap());
        assert!(!store.succeed(&job.id, "test", &Default::default(), false).await.unwrap());
        cache.withdraw(&job.id, registered).await;
        let s = cache.report().levels;
        assert_eq!((s.result.entries, s.statistics.entries), (0, 0));
        assert!(store.eigen_by_id(row).await.unwrap().is_none());
        assert!(cache.find_system(&[2; 32]).await.is_none());
        // The same system can be registered again by the next job that computes it.
        let again = running_job(&store, "j3").await;
        assert!(cache.register_before_success(&again, Some(system(&again, 2))).await.eigen_row.is_some());
    }
}
