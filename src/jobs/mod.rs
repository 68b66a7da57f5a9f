//! Durable jobs: the row model and its state machine (`model`), the SQLite store (`store`), the
//! workers that claim queued jobs and run them (`worker`), and the job cache they share with the API
//! (`cache`, used by the workers through `cached_run`).
//!
//! The database is the only durable state: a job accepted with 202 is a row whose input is already on
//! disk, so a process that dies loses nothing; the next start puts its running jobs back in the queue.

pub mod backends;
pub mod cache;
pub mod cached_run;
pub mod input;
pub mod metrics;
pub mod model;
pub mod store;
pub mod worker;

pub use model::{InputKind, InputSummary, Job, JobStatus};
pub use store::{JobStore, NewJob, StoreError};
pub use worker::{Runner, Workers};
