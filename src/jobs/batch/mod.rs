//! The members of a pooled batch: their statistics run ([`run_statistics`]), and the pooled eigen
//! system computed once every member's statistics are stored ([`compute_ready_systems`]). The
//! projection run of a member is an ordinary job run with the batch's system (see
//! `reuse::Plan`).
//!
//! Storage layout: `batches/<id>/moments/<position>` (one [`moments_file`] per member) and
//! `batches/<id>/system.json` (the pooled system as a system file, `mnf::system_file`, with the
//! pooled statistics as extra arrays: what `GET /v1/batches/{id}/system` serves).

pub mod moments_file;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::input;
use super::job_failure::JobFailure;
use super::lease::{keep_lease, record_failure};
use super::services::JobServices;
use super::model::{BatchMember, Job};
use super::store::{BatchRow, JobStore};
use base64::Engine as _;

use crate::job_cache::SystemRecord;
use crate::mnf::result::EigenSystem;
use crate::mnf::stats::Statistics;
use crate::mnf::system_file::{self, InputBands, NoiseModel, Source, SystemFile};
use crate::storage::Storage;
use crate::mnf::{pooled, MnfParams, Monitor, Stage};
use moments_file::MemberStatistics;

/// Where member `position`'s statistics are stored.
pub fn moments_key(batch: &str, position: i64) -> String {
    format!("batches/{batch}/moments/{position:06}")
}

/// Where a batch's pooled system is stored.
pub fn system_key(batch: &str) -> String {
    format!("batches/{batch}/system.json")
}

/// Everything a batch stored (its members' results are under their own `results/<job>/`).
pub fn storage_prefix(batch: &str) -> String {
    format!("batches/{batch}")
}

/// The statistics run of a pooled member: its cube's moments stored, the job queued again for its
/// projection, and the pooled system computed if this was the last member to finish. A failure
/// fails the job and the batch (its system can no longer be computed).
pub async fn run_statistics(s: JobServices, job: Job, cancel: Arc<AtomicBool>, member: BatchMember) {
    let progress = Arc::new(Mutex::new((Stage::Statistics, 0.0f64)));
    let keeper = tokio::spawn(keep_lease(s.clone(), job.id.clone(), progress.clone(), cancel.clone()));
    let started = Instant::now();
    let outcome = {
        let (s, job, cancel) = (s.clone(), job.clone(), cancel.clone());
        let rt = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || member_statistics(&s, &job, progress, cancel, &rt)).await
    };
    s.metrics.record_phase("compute", started.elapsed());
    let stored = match outcome {
        Ok(Ok(bytes)) => s
            .storage
            .put_bytes(&moments_key(&member.batch_id, member.position), bytes.into())
            .await
            .map_err(|e| JobFailure::storage(&e)),
        Ok(Err(f)) => Err(f),
        Err(e) => Err(JobFailure { code: "internal".into(), message: format!("the statistics task ended abnormally: {e}") }),
    };
    keeper.abort();
    match stored {
        Ok(()) => match s.store.statistics_done(&job.id, &s.lease.owner).await {
            Ok(true) => {
                tracing::info!(job = %job.id, batch = %member.batch_id, "member statistics stored");
                compute_ready_systems(&s, Some(&member.batch_id)).await;
            }
            Ok(false) => tracing::info!(job = %job.id, "member statistics no longer wanted (canceled, deleted or claimed again)"),
            Err(e) => tracing::warn!(job = %job.id, "cannot record the member's statistics: {e}; they are computed again once its lease lapses"),
        },
        Err(f) if f.code == "canceled" => record_failure(&s, &job.id, f).await,
        Err(f) => {
            let message = format!("input {} failed its statistics pass ({}): {}", member.position, f.code, f.message);
            record_failure(&s, &job.id, f).await;
            if let Err(e) = s.store.fail_batch(&member.batch_id, "batch_failed", &message).await {
                tracing::error!(batch = %member.batch_id, "cannot fail the batch: {e}");
            }
        }
    }
    s.ended.notify_waiters();
}

/// The blocking part: reads the cube and runs its statistics pass on the job's backend.
fn member_statistics(
    s: &JobServices,
    job: &Job,
    progress: Arc<Mutex<(Stage, f64)>>,
    cancel: Arc<AtomicBool>,
    rt: &tokio::runtime::Handle,
) -> Result<Vec<u8>, JobFailure> {
    let params: MnfParams = serde_json::from_str(&job.params).map_err(|e| JobFailure { code: "invalid_params".into(), message: e.to_string() })?;
    let backend = s.backends.get(params.backend).map_err(|e| JobFailure { code: e.code().into(), message: e.to_string() })?;
    // A cube by reference (s3://, https://) is read by the reference clients, as a job's is.
    let cube = match crate::reference::Stored::of_location(&job.input_location) {
        Some(stored) => super::remote_input::load(s, job, &stored, rt)?.cube,
        None => input::load_cube(job.input_kind, &job.input_location, &s.storage, rt).map_err(JobFailure::cube)?,
    };
    let monitor = Monitor::new(move |stage, fraction| *progress.lock().unwrap_or_else(|p| p.into_inner()) = (stage, fraction))
        .with_cancel_flag(cancel.clone());
    let mut prepared = backend.prepare(&cube, &monitor).map_err(|e| JobFailure { code: e.code().into(), message: e.to_string() })?;
    let statistics = pooled::statistics_on(&cube, &params, prepared.as_mut(), &monitor)
        .map_err(|e| JobFailure { code: e.code().into(), message: e.to_string() })?;
    if cancel.load(Ordering::Relaxed) {
        return Err(JobFailure { code: "canceled".into(), message: "canceled".into() });
    }
    Ok(moments_file::encode(&MemberStatistics {
        statistics,
        bbl: cube.meta.bbl.clone(),
        wavelength: cube.meta.wavelength.clone(),
        wavelength_units: cube.meta.wavelength_units.clone(),
    }))
}

/// Computes and stores the pooled system of every batch whose members all have their statistics
/// (only `batch` when given): after a member's statistics run, and from the idle workers' sweep (an
/// instance killed between a member's last statistics and the system leaves it to the others). Two
/// instances may compute the same system at once: it is the same, bit for bit (the members' moments
/// are merged in the batch's order), and the first recorded wins. Whether a system was recorded (its
/// members can be claimed).
pub async fn compute_ready_systems(s: &JobServices, batch: Option<&str>) -> bool {
    fail_broken_batches(s).await;
    let ready = match s.store.batches_awaiting_system().await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!("cannot look for batches awaiting their system: {e}");
            return false;
        }
    };
    let mut recorded = false;
    for b in ready.into_iter().filter(|b| batch.is_none_or(|id| id == b.id)) {
        match pooled_system(s, &b).await {
            Ok(bytes) => {
                let key = system_key(&b.id);
                if let Err(e) = s.storage.put_bytes(&key, bytes.into()).await {
                    tracing::warn!(batch = %b.id, "cannot store the pooled system: {e}; tried again at the next sweep");
                    continue;
                }
                match s.store.set_batch_system(&b.id, &key).await {
                    Ok(true) => {
                        tracing::info!(batch = %b.id, "pooled system stored; its members are projected");
                        recorded = true;
                    }
                    Ok(false) => {
                        // Recorded first elsewhere (the same object), or the batch was deleted meanwhile.
                        if matches!(s.store.get_batch(&b.id).await, Ok(None)) {
                            let _ = s.storage.delete_prefix(&storage_prefix(&b.id)).await;
                        }
                    }
                    Err(e) => tracing::warn!(batch = %b.id, "cannot record the pooled system: {e}"),
                }
            }
            Err(PooledFailure::Retry(e)) => tracing::warn!(batch = %b.id, "cannot compute the pooled system yet: {e}"),
            Err(PooledFailure::Batch { code, message }) => {
                tracing::warn!(batch = %b.id, code, "the batch has no pooled system: {message}");
                if let Err(e) = s.store.fail_batch(&b.id, code, &message).await {
                    tracing::error!(batch = %b.id, "cannot fail the batch: {e}");
                }
            }
        }
        s.ended.notify_waiters();
    }
    recorded
}

/// Fails the pooled batches that lost a member before their system was computed (see
/// `JobStore::broken_batches`): their other members would wait for it forever.
async fn fail_broken_batches(s: &JobServices) {
    let broken = match s.store.broken_batches().await {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!("cannot look for broken batches: {e}");
            return;
        }
    };
    for (b, position, status) in broken {
        let message = format!("input {position} was {status} before the pooled statistics were complete");
        match s.store.fail_batch(&b.id, "batch_failed", &message).await {
            Ok(failed) => tracing::info!(batch = %b.id, members = failed.len(), "{message}: the batch failed"),
            Err(e) => tracing::warn!(batch = %b.id, "cannot fail the batch: {e}"),
        }
        s.ended.notify_waiters();
    }
}

enum PooledFailure {
    /// Storage or database trouble: the next sweep tries again.
    Retry(String),
    /// The system cannot exist (degenerate pooled statistics, a damaged member file).
    Batch { code: &'static str, message: String },
}

/// The pooled system of batch `b`, encoded: its members' moments merged in order, then band selection
/// and the eigenproblem (`mnf::pooled`).
async fn pooled_system(s: &JobServices, b: &BatchRow) -> Result<Vec<u8>, PooledFailure> {
    let members = s.store.batch_jobs(&b.id).await.map_err(|e| PooledFailure::Retry(e.to_string()))?;
    let mut parts = Vec::with_capacity(members.len());
    for m in &members {
        let position = m.batch.as_ref().map(|x| x.position).unwrap_or_default();
        let bytes = s.storage.get_bytes(&moments_key(&b.id, position)).await.map_err(|e| PooledFailure::Retry(e.to_string()))?;
        let part = moments_file::decode(&bytes)
            .map_err(|e| PooledFailure::Batch { code: "statistics_lost", message: format!("input {position}: {e}") })?;
        parts.push(part);
    }
    let params: MnfParams = serde_json::from_str(&b.params).map_err(|e| PooledFailure::Batch { code: "invalid_params", message: e.to_string() })?;
    // The eigenproblem is solved as a job of the batch's backend solves it (on its device, where it
    // has a solver), so that a pooled batch of one cube gives that job's bits.
    let backend = s.backends.get(params.backend).ok();
    let batch = b.id.clone();
    tokio::task::spawn_blocking(move || {
        let first = parts.first().ok_or_else(|| PooledFailure::Batch { code: "statistics_lost", message: "the batch has no member".into() })?;
        let bands = first.statistics.data.bands;
        let bbl = pooled::union_bbl(bands, parts.iter().map(|p| p.bbl.as_deref()));
        let fail = |e: crate::mnf::MnfError| PooledFailure::Batch { code: e.code(), message: e.to_string() };
        let stats = pooled::pool(parts.iter().map(|p| &p.statistics)).map_err(fail)?;
        let solver = backend.as_ref().and_then(|b| b.eigen_solver());
        let system = pooled::system_with(bands, bbl.as_deref(), &stats, &params, solver).map_err(fail)?;
        Ok(pooled_file(batch, first, &stats, parts.len(), system, params).to_json())
    })
    .await
    .map_err(|e| PooledFailure::Retry(e.to_string()))?
}

/// The system file of a pooled system, with the pooled statistics as extra arrays (float64):
/// `pooled_data_mean` (B), `pooled_data_covariance` and `pooled_noise_covariance` (B × B, unbiased;
/// the noise one before the estimator's scale), and `pooled_counts` (data pixels, noise residuals,
/// no-data pixels, cubes).
fn pooled_file(batch: String, first: &MemberStatistics, stats: &Statistics, cubes: usize, system: EigenSystem, params: MnfParams) -> SystemFile {
    let b = stats.data.bands;
    let member = |shape: &[usize], values: &[f64]| {
        serde_json::json!({"npy": base64::engine::general_purpose::STANDARD.encode(system_file::npy_f64(shape, values))})
    };
    let mut extra = std::collections::BTreeMap::new();
    extra.insert("pooled_data_mean".to_string(), member(&[b], &stats.data.mean));
    extra.insert("pooled_data_covariance".to_string(), member(&[b, b], &stats.data.covariance().unwrap_or_default()));
    extra.insert("pooled_noise_covariance".to_string(), member(&[b, b], &stats.noise.covariance().unwrap_or_default()));
    let counts = [stats.data.n as f64, stats.noise.n as f64, stats.masked_pixels as f64, cubes as f64];
    extra.insert("pooled_counts".to_string(), member(&[4], &counts));
    let params = MnfParams { statistics_from: None, statistics_sha256: None, ..params };
    SystemFile {
        hypermnf_version: env!("CARGO_PKG_VERSION").to_string(),
        source: Source::Batch(batch),
        input: InputBands { bands: b, wavelengths: first.wavelength.clone(), wavelength_units: first.wavelength_units.clone(), fwhm: None },
        noise: NoiseModel { estimator: params.noise, scale: params.noise.scale(), window: params.noise_window },
        ignore_value: params.ignore_value,
        params,
        system,
        extra_arrays: extra,
    }
}

/// A batch's pooled system, read for a member's projection run.
pub struct PooledSystem {
    pub record: Arc<SystemRecord>,
    pub batch: String,
    /// `SystemFile::identity` of the stored file.
    pub identity: String,
}

/// The pooled system of batch `batch`, as stored, checked; None while it is not computed yet.
pub async fn stored_system(store: &JobStore, storage: &Storage, batch: &str) -> Result<Option<SystemFile>, JobFailure> {
    let row = store
        .get_batch(batch)
        .await
        .map_err(|e| JobFailure { code: "database_unavailable".into(), message: e.to_string() })?
        .ok_or_else(|| JobFailure { code: "canceled".into(), message: "the job's batch was deleted".into() })?;
    let Some(key) = row.system_key else { return Ok(None) };
    let bytes = storage.get_bytes(&key).await.map_err(|e| JobFailure::storage(&e))?;
    let file = SystemFile::from_json(&bytes)
        .map_err(|e| JobFailure { code: "statistics_lost".into(), message: format!("the pooled system of batch {batch}: {e}") })?;
    Ok(Some(file))
}

/// The pooled system of batch `batch` for its member `job`'s projection run.
pub async fn load_system(store: &JobStore, storage: &Storage, batch: &str, job: &Job) -> Result<PooledSystem, JobFailure> {
    let file = stored_system(store, storage, batch)
        .await?
        .ok_or_else(|| JobFailure { code: "statistics_lost".into(), message: format!("batch {batch} has no pooled system") })?;
    let identity = file.identity();
    Ok(PooledSystem { record: Arc::new(SystemRecord::new(file.system, String::new(), job.owner.clone())), batch: batch.to_string(), identity })
}
