//! Jobs started early: an upload's job computed while the upload is still being synced to the disk.
//! (Its cube may already be on the device: see `jobs::upload_to_device`.)
//!
//! Once the last byte of an upload (a `.npy`, or the data part of a multipart ENVI upload) is in its
//! scratch file and digested, what is left before
//! the 202 is the disk catching up (the final `sync_data`: 15–20 ms for 299 MB on the H100 host,
//! BENCHMARKS.md, Service), then the store and the insert. When a worker of this instance is idle, the job's
//! steps 2 to 4 (plan, load, compute, write the results into scratch) start then, on the scratch
//! file, instead of after the 202, the claim and the queue: the disk and the compute overlap.
//!
//! The job is inserted already claimed by this instance ([`JobStore::insert_claimed`]), so no worker
//! of any instance takes it while it runs here; the same run then goes through steps 5 to 7 as a
//! worker's would. Durability is unchanged: the row is inserted only after the upload is synced and
//! stored, and a job of a process that dies is claimed again when its lease lapses, from its stored
//! input. An upload that is not accepted after all (its sync failed, a job of the same cube and
//! parameters appeared meanwhile) drops its [`EarlyRun`]: the computation is canceled and what it
//! wrote removed.
//!
//! [`JobStore::insert_claimed`]: super::store::JobStore::insert_claimed

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;

use super::job_run::{JobRun, Started};
use super::model::{Job, JobStatus};
use super::store::NewJob;
use super::running::Running;
use super::services::JobServices;
use crate::job_cache::ResidentCube;

/// The computation of a job whose row does not exist yet. Dropped without [`EarlyRun::finish`], it is
/// canceled and its scratch removed.
pub struct EarlyRun {
    run: Option<(JobRun, Started)>,
    /// Told once the row is inserted (the run's register step waits for it); dropped unsent, the
    /// register step gives up.
    inserted: tokio::sync::watch::Sender<bool>,
    services: JobServices,
    /// Where the run is counted as running here (and its worker's place given back).
    running: Arc<Running>,
    /// The idle worker's place this run takes, until it ends.
    slot: Option<OwnedSemaphorePermit>,
}

impl EarlyRun {
    /// Starts steps 2 to 4 of `new` (its input still at `scratch_location`, a `scratch/<token>` key)
    /// with `services`, counted in `running`. The caller took an idle worker's place (`slot`).
    pub(super) fn start(
        services: JobServices,
        running: Arc<Running>,
        new: &NewJob,
        scratch_location: String,
        slot: OwnedSemaphorePermit,
        fed: Option<Arc<ResidentCube>>,
    ) -> EarlyRun {
        let job = job_before_insert(new, scratch_location);
        let (inserted, row) = tokio::sync::watch::channel(false);
        let run = JobRun::unclaimed(job, services.clone(), fed, row);
        running.track(&new.id, run.cancel_flag());
        let started = run.start_compute();
        tracing::debug!(job = %new.id, "job started before its upload was synced");
        EarlyRun { run: Some((run, started)), inserted, services, running, slot: Some(slot) }
    }

    /// The row was inserted (claimed by this instance) as `job`: the run goes on to its end in a task
    /// of its own, as a worker's would.
    pub fn finish(mut self, job: Job) {
        let Some((run, started)) = self.run.take() else { return };
        let _ = self.inserted.send(true);
        // The line a worker logs when it claims a job (operators and tests/cluster follow jobs by it).
        tracing::info!(job = %job.id, attempt = job.attempts, early = true, "job started");
        let (running, slot) = (self.running.clone(), self.slot.take());
        self.services.metrics.started_early.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tokio::spawn(async move {
            let (id, flag) = (job.id.clone(), run.cancel_flag());
            run.with_job(job).finish(started).await;
            running.untrack(&id, &flag);
            drop(slot);
        });
    }
}

impl Drop for EarlyRun {
    fn drop(&mut self) {
        let Some((run, started)) = self.run.take() else { return };
        let flag = run.cancel_flag();
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
        let (services, running) = (self.services.clone(), self.running.clone());
        let (id, slot) = (run.job().id.clone(), self.slot.take());
        tracing::debug!(job = %id, "the upload was not accepted: its early computation is dropped");
        // Dropped on the async runtime (the API's handlers); elsewhere there is nothing to wait on.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                started.discard(&services, &id).await;
                running.untrack(&id, &flag);
                drop(slot);
            });
        }
    }
}

/// The job as its row will read once inserted claimed, but with its input where it is now (a job
/// run before its row exists: here, and in `jobs::resident_run`).
pub(super) fn job_before_insert(new: &NewJob, scratch_location: String) -> Job {
    let now = super::model::now_ms();
    Job {
        id: new.id.clone(),
        owner: new.owner.clone(),
        status: JobStatus::Running,
        stage: Some("read".into()),
        progress: 0.0,
        params: new.params.clone(),
        digest: new.digest.clone(),
        content_digest: new.content_digest.clone(),
        upload_sha256: new.upload_sha256.clone(),
        input: new.input.clone(),
        input_kind: new.input_kind,
        input_location: scratch_location,
        error_code: None,
        error_message: None,
        results: Default::default(),
        attempts: 1,
        created_at: now,
        started_at: Some(now),
        finished_at: None,
        results_unsynced: false,
        batch: None,
    }
}
