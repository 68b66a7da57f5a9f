//! Removing jobs: a client's cancel or delete ([`cancel_or_delete`], [`delete_batch`]), and the upkeep loop that
//! deletes finished jobs past the retention ([`expire_once`]) and sweeps the uploads finished jobs
//! left behind (`sweep`). A removed job's files and job cache entries go with it ([`purge_files`]).

use std::time::Duration;

use super::model::{now_ms, InputKind, Job};
use super::store::StoreError;
use super::worker::Runner;

/// What `cancel_or_delete` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// It was queued or running: now canceled (its row stays, status `canceled`).
    Canceled,
    /// It was finished: its row and files are gone.
    Deleted,
}

/// Cancels a queued or running job, or deletes a finished one with its files (`DELETE /v1/jobs/{id}`
/// and the OGC API's dismiss).
pub async fn cancel_or_delete(runner: &Runner, job: Job) -> Result<Removal, StoreError> {
    if !job.status.is_finished() && runner.store.cancel(&job.id).await? {
        runner.cancel(&job.id);
        return Ok(Removal::Canceled);
    }
    // Finished (or finished in between): remove it and its files.
    runner.store.delete(&job.id).await?;
    runner.job_may_have_ended();
    purge_files(runner, &job).await;
    Ok(Removal::Deleted)
}

/// Removes a job's stored upload and results (its row is already gone or going), and its job cache
/// entries.
pub async fn purge_files(runner: &Runner, job: &Job) {
    runner.cache.forget_job(&job.id);
    let mut prefixes = vec![format!("results/{}", job.id), super::geometry::glt_prefix(&job.id)];
    if job.input_kind != InputKind::Href {
        prefixes.push(job.input_location.clone());
    }
    for p in prefixes {
        if let Err(e) = runner.storage.delete_prefix(&p).await {
            tracing::warn!(job = %job.id, "cannot delete {p}: {e}");
        }
    }
}

/// Deletes a batch (`DELETE /v1/batches/{id}`): its row, then each member (canceled if it still
/// runs, then deleted with its files), then the files the batch stored.
pub async fn delete_batch(runner: &Runner, batch_id: &str) -> Result<(), StoreError> {
    // The row first: a member whose statistics end meanwhile then finds no batch to compute a system
    // for, and a system stored meanwhile is removed by whoever stored it (`jobs::batch`).
    runner.store.delete_batch(batch_id).await?;
    for job in runner.store.batch_jobs(batch_id).await? {
        if !job.status.is_finished() && runner.store.cancel(&job.id).await? {
            runner.cancel(&job.id);
        }
        runner.store.delete(&job.id).await?;
        purge_files(runner, &job).await;
    }
    runner.job_may_have_ended();
    if let Err(e) = runner.storage.delete_prefix(&super::batch::storage_prefix(batch_id)).await {
        tracing::warn!(batch = %batch_id, "cannot delete the batch's files: {e}");
    }
    Ok(())
}

/// Deletes finished jobs (rows and files) older than `retention`, at most once a minute; and the
/// uploads of finished jobs that were left behind, at the start and then every `sweep::EVERY`.
/// Runs until aborted.
pub async fn expire_loop(runner: &Runner, retention: Duration) {
    let period = retention.min(Duration::from_secs(60)).max(Duration::from_secs(1));
    let mut swept: Option<std::time::Instant> = None;
    loop {
        if swept.is_none_or(|t| t.elapsed() >= super::sweep::EVERY) {
            swept = Some(std::time::Instant::now());
            if let Err(e) = super::sweep::finished_uploads(&runner.store, &runner.storage).await {
                tracing::warn!("the sweep of finished jobs' uploads failed: {e:#}");
            }
        }
        if let Err(e) = expire_once(runner, retention).await {
            tracing::warn!("expiry of old jobs failed: {e:#}");
        }
        tokio::time::sleep(period).await;
    }
}

/// Deletes the finished jobs older than `retention`, with their files: how many.
pub async fn expire_once(runner: &Runner, retention: Duration) -> Result<usize, StoreError> {
    let cutoff = now_ms() - retention.as_millis() as i64;
    let mut n = 0;
    loop {
        let old = runner.store.finished_before(cutoff, 100).await?;
        if old.is_empty() {
            return Ok(n);
        }
        for job in old {
            purge_files(runner, &job).await;
            runner.store.delete(&job.id).await?;
            n += 1;
        }
    }
}
