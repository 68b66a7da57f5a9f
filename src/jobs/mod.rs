//! Durable jobs. The run of one job ([`job_run`]) reads top to bottom: claim → plan from the job
//! cache → load → compute → store → register → mark done; the modules it calls call nothing back:
//!
//! * `model`: the row model and its state machine; `store`: the job database (SQLite or PostgreSQL);
//! * `input`: a job's stored input, read as a cube or hashed for the device level;
//! * `backends`: the compute backends, one per device, handed to the jobs in turn;
//! * `cache`: the job cache the API (result level) and the runs (statistics and device levels)
//!   share; `cached_run`: one job's MNF through it;
//! * `metrics`: times and outcomes for `/metrics`;
//! * `result_sync`: a succeeded job's results synced to the disk after it is seen succeeded, and
//!   checked at the next start if the machine stopped first; `sweep`: uploads of finished jobs left
//!   behind;
//! * `worker`: the workers that claim jobs and run them, and the [`Runner`] the API shares;
//!   `early`: an upload's job started while the upload is synced, when a worker is idle; `feed`:
//!   its cube sent to the device while the upload arrives.
//!
//! The database is the only durable state: a job accepted with 202 is a row, synced, whose input is
//! already on disk, so a process or a machine that dies loses nothing; the next start puts its
//! running jobs back in the queue, and checks the results that had not reached the disk.

pub mod backends;
pub mod batch;
pub mod cache;
pub mod cached_run;
pub mod early;
pub mod feed;
pub mod input;
pub mod job_run;
pub mod metrics;
pub mod model;
pub mod remote_input;
pub mod resident;
pub mod result_sync;
pub mod store;
pub mod sweep;
pub mod systems;
pub mod worker;

pub use model::{InputKind, InputSummary, Job, JobStatus};
pub use store::{JobStore, NewJob, StoreError};
pub use worker::{Runner, Workers};
