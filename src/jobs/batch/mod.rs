//! The members of a pooled batch: their statistics run ([`run_statistics`]), and the pooled eigen
//! system computed once every member's statistics are stored ([`compute_ready_systems`]). The
//! projection run of a member is an ordinary job run with the batch's system (see
//! `cached_run::Plan`).
//!
//! Storage layout: `batches/<id>/moments/<position>` (one [`moments_file`] per member) and
//! `batches/<id>/system` (the pooled system, in the statistics level's `eigen_file` format).

pub mod moments_file;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::input;
use super::job_run::{keep_lease, JobFailure, JobRun, JobServices};
use super::model::{BatchMember, Job};
use super::store::{BatchRow, JobStore};
use crate::cache::{eigen_file, SystemRecord};
use crate::storage::Storage;
use crate::mnf::{pooled, MnfParams, Monitor, Stage};
use moments_file::MemberStatistics;

/// Where member `position`'s statistics are stored.
pub fn moments_key(batch: &str, position: i64) -> String {
    format!("batches/{batch}/moments/{position:06}")
}

/// Where a batch's pooled system is stored.
pub fn system_key(batch: &str) -> String {
    format!("batches/{batch}/system")
}

/// Everything a batch stored (its members' results are under their own `results/<job>/`).
pub fn storage_prefix(batch: &str) -> String {
    format!("batches/{batch}")
}

/// The statistics run of a pooled member: its cube's moments stored, the job queued again for its
/// projection, and the pooled system computed if this was the last member to finish. A failure
/// fails the job and the batch (its system can no longer be computed).
pub async fn run_statistics(run: JobRun, member: BatchMember) {
    let s = run.services().clone();
    let job = run.job().clone();
    let progress = Arc::new(Mutex::new((Stage::Statistics, 0.0f64)));
    let keeper = tokio::spawn(keep_lease(s.clone(), job.id.clone(), progress.clone(), run.cancel_flag()));
    let started = Instant::now();
    let outcome = {
        let (s, job, cancel) = (s.clone(), job.clone(), run.cancel_flag());
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
        Err(f) if f.code == "canceled" => run.record_failure(f).await,
        Err(f) => {
            let message = format!("input {} failed its statistics pass ({}): {}", member.position, f.code, f.message);
            run.record_failure(f).await;
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
    cancel: Arc<std::sync::atomic::AtomicBool>,
    rt: &tokio::runtime::Handle,
) -> Result<Vec<u8>, JobFailure> {
    let params: MnfParams = serde_json::from_str(&job.params).map_err(|e| JobFailure { code: "invalid_params".into(), message: e.to_string() })?;
    let backend = s.backends.get(params.backend).map_err(|e| JobFailure { code: e.code().into(), message: e.to_string() })?;
    let cube = input::load_cube(job.input_kind, &job.input_location, &s.storage, rt).map_err(JobFailure::cube)?;
    let monitor = Monitor::new(move |stage, fraction| *progress.lock().unwrap_or_else(|p| p.into_inner()) = (stage, fraction))
        .with_cancel_flag(cancel.clone());
    let mut prepared = backend.prepare(&cube, &monitor).map_err(|e| JobFailure { code: e.code().into(), message: e.to_string() })?;
    let statistics = pooled::statistics_on(&cube, &params, prepared.as_mut(), &monitor)
        .map_err(|e| JobFailure { code: e.code().into(), message: e.to_string() })?;
    if cancel.load(Ordering::Relaxed) {
        return Err(JobFailure { code: "canceled".into(), message: "canceled".into() });
    }
    Ok(moments_file::encode(&MemberStatistics { statistics, bbl: cube.meta.bbl.clone() }))
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
    tokio::task::spawn_blocking(move || {
        let bands = parts.first().map(|p| p.statistics.data.bands).unwrap_or(0);
        let bbl = pooled::union_bbl(bands, parts.iter().map(|p| p.bbl.as_deref()));
        let fail = |e: crate::mnf::MnfError| PooledFailure::Batch { code: e.code(), message: e.to_string() };
        let stats = pooled::pool(parts.iter().map(|p| &p.statistics)).map_err(fail)?;
        let system = pooled::system_of(bands, bbl.as_deref(), &stats, &params).map_err(fail)?;
        Ok(eigen_file::encode(&system))
    })
    .await
    .map_err(|e| PooledFailure::Retry(e.to_string()))?
}

/// The pooled system of batch `batch` for its member `job`'s projection run.
pub async fn load_system(store: &JobStore, storage: &Storage, batch: &str, job: &Job) -> Result<Arc<SystemRecord>, JobFailure> {
    let lost = |m: String| JobFailure { code: "statistics_lost".into(), message: m };
    let row = store
        .get_batch(batch)
        .await
        .map_err(|e| JobFailure { code: "database_unavailable".into(), message: e.to_string() })?
        .ok_or_else(|| JobFailure { code: "canceled".into(), message: "the job's batch was deleted".into() })?;
    let key = row.system_key.ok_or_else(|| lost(format!("batch {batch} has no pooled system")))?;
    let bytes = storage.get_bytes(&key).await.map_err(|e| JobFailure::storage(&e))?;
    let system = eigen_file::decode(&bytes).map_err(|e| lost(format!("the pooled system of batch {batch}: {e}")))?;
    Ok(Arc::new(SystemRecord { system, job_id: job.id.clone(), owner: job.owner.clone() }))
}
