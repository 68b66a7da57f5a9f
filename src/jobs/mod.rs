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

pub mod backends;
pub mod batch;
pub mod early_start;
pub mod geometry;
pub mod input;
pub mod job_failure;
pub mod job_run;
mod lease;
pub mod metrics;
pub mod model;
pub mod remote_input;
pub mod resident_run;
pub mod result_files;
pub mod result_sync;
pub mod reuse;
#[cfg(test)]
mod runner_tests;
pub mod running;
pub mod service_cache;
pub mod services;
pub mod store;
pub mod submit;
pub mod sweep;
pub mod systems;
pub mod upkeep;
pub mod upload_progress;
pub mod upload_to_device;
pub mod worker;

pub use model::{InputKind, InputSummary, Job, JobStatus};
pub use store::{JobStore, NewJob, StoreError};
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
