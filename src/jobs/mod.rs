//! Durable jobs. The run of one job ([`job_run`]) reads top to bottom: claim → plan from the job
//! cache → load → compute → store → register → mark done; the modules it calls call nothing back:
//!
//! * `submit`: job creation, once the API has checked a request (the owner's existing job, or the
//!   input stored and the row inserted); `upkeep`: cancel, delete, and the expiry of old jobs;
//! * `model`: the row model and its state machine; `store`: the job database (SQLite or PostgreSQL);
//! * `input`, `remote_input`: a job's stored input (or its `s3://`/`https://` objects), read as a cube
//!   or hashed for the device level;
//! * `backends`: the compute backends, one per device, handed to the jobs in turn;
//! * `service_cache`: the job cache (`crate::job_cache`) as the service uses it, shared by the API
//!   (result level) and the runs (statistics and device levels); `reuse`: one job's MNF through it;
//! * `services`: what a run calls; `job_failure`: why a job failed; `result_files`: the files a
//!   job writes; `metrics`: times and outcomes for `/metrics`; `lease`: a running job's hold on its
//!   row (its lease and progress kept, its failure recorded);
//! * `result_sync`: a succeeded job's results synced to the disk after it is seen succeeded, and
//!   checked at the next start if the machine stopped first; `sweep`: uploads of finished jobs left
//!   behind;
//! * `worker`: the workers that claim jobs and run them, and the [`Runner`] the API shares;
//!   `running`: the jobs running here (their places and cancel flags); `early_start`: an upload's job
//!   started while the upload is synced, when a worker is idle; `upload_to_device`: its cube sent to
//!   the device while the upload arrives (following `upload_progress`); `resident_run`: a job run on
//!   a cube still on a device, without its body;
//! * `batch`, `systems`: batches with pooled statistics, and the eigen systems a job may be given;
//!   `geometry`: the GLT an `ortho=true` job keeps from its EMIT upload.
//!
//! The database is the only durable state: a job accepted with 202 is a row, synced, whose input is
//! already on disk, so a process or a machine that dies loses nothing; the next start puts its
//! running jobs back in the queue, and checks the results that had not reached the disk.

mod backends;
pub(crate) mod batch;
mod early_start;
mod geometry;
mod input;
mod job_failure;
mod job_run;
mod lease;
pub(crate) mod metrics;
mod model;
mod remote_input;
mod resident_run;
mod result_files;
mod result_sync;
mod reuse;
#[cfg(test)]
mod runner_tests;
mod running;
mod service_cache;
mod services;
mod store;
pub(crate) mod submit;
mod sweep;
pub(crate) mod systems;
pub(crate) mod upkeep;
mod upload_progress;
pub(crate) mod upload_to_device;
mod worker;

// What the API uses of the jobs, named here so that it reaches into few modules: the runner and its
// workers, the rows it shows and their errors, job upkeep, and the job cache's report. Besides these
// it names `submit` (job creation), `systems` (eigen systems exported and imported),
// `upload_to_device` (an upload's cube fed to a device while it arrives) and `metrics` (the job
// phases' histograms).
pub use geometry::{kept_glt, upload_has_glt, GLT_FILE};
pub use input::load_cube;
pub use model::{now_ms, product, rfc3339, BatchPhase, InputKind, InputSummary, Job, JobStatus};
pub use resident_run::{possible as can_run_resident, run as run_resident};
pub use service_cache::CacheReport;
pub use submit::CubeKey;
pub use store::{BatchRow, Inserted, JobStore, NewBatch, NewJob, StoreError, SystemRow};
pub use upkeep::{cancel_or_delete, delete_batch, expire_loop, expire_once, Removal};
pub use worker::{Runner, Workers};

/// A failure of the job database or of the object store, for what writes to both (a job's input
/// and row, an imported system's file and row).
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Storage(#[from] crate::storage::StorageError),
}
