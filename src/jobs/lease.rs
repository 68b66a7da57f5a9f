//! A running job's hold on its row: while it computes, its progress is written and its lease
//! extended ([`keep_lease`]); a run that ends without a result is recorded by [`record_failure`].
//! Both the run of a job (`job_run`) and a batch member's statistics run (`batch`) use them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::job_failure::JobFailure;
use super::services::JobServices;
use crate::mnf::Stage;

/// How often a running job's progress is written to the database.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// While steps 2 to 4 run: writes progress every `PROGRESS_EVERY`, and extends the lease every third
/// of its duration; a lease that cannot be extended (canceled, deleted, claimed again elsewhere)
/// stops the job. Runs until aborted.
pub(super) async fn keep_lease(s: JobServices, id: String, progress: Arc<Mutex<(Stage, f64)>>, cancel: Arc<AtomicBool>) {
    let mut last = (Stage::Read, -1.0);
    let beat_every = (s.lease.duration / 3).max(PROGRESS_EVERY);
    let mut last_beat = Instant::now();
    loop {
        tokio::time::sleep(PROGRESS_EVERY).await;
        let now = *progress.lock().unwrap_or_else(|p| p.into_inner());
        if now != last {
            last = now;
            if let Err(e) = s.store.progress(&id, now.0.name(), overall(now.0, now.1)).await {
                tracing::warn!(job = %id, "cannot record progress: {e}");
            }
        }
        if last_beat.elapsed() >= beat_every {
            last_beat = Instant::now();
            match s.store.heartbeat(&id, &s.lease).await {
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
}

/// Step 7 for a job that did not get through steps 2 to 5.
pub(super) async fn record_failure(s: &JobServices, id: &str, f: JobFailure) {
    match f.code.as_str() {
        "canceled" => {
            s.metrics.canceled.fetch_add(1, Ordering::Relaxed);
            // Normally already canceled in the database; if not, record it.
            let _ = s.store.fail(id, &s.lease.owner, "canceled", "canceled").await;
            tracing::info!(job = %id, "job stopped: canceled, or no longer this instance's");
        }
        JobFailure::DISK_UNAVAILABLE => {
            tracing::error!(
                job = %id,
                "cannot write this instance's disk ({}); the job stays queued in effect: it runs again once its lease lapses",
                f.message
            );
        }
        JobFailure::STORE_UNAVAILABLE => {
            tracing::warn!(
                job = %id,
                "the object store cannot be reached ({}); the job stays queued in effect: it runs again once its lease lapses",
                f.message
            );
        }
        _ => {
            tracing::warn!(job = %id, code = f.code.as_str(), "job failed: {}", f.message);
            s.metrics.failed.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = s.store.fail(id, &s.lease.owner, &f.code, &f.message).await {
                tracing::error!(job = %id, "cannot record the failure: {e}");
            }
        }
    }
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
