//! Durable jobs: the row model and its state machine (`model`), the SQLite store (`store`) and the
//! workers that claim queued jobs and run them (`worker`).
//!
//! The database is the only durable state: a job accepted with 202 is a row whose input is already on
//! disk, so a process that dies loses nothing; the next start puts its running jobs back in the queue.

pub mod model;
pub mod store;
pub mod worker;

pub use model::{InputKind, InputSummary, Job, JobStatus};
pub use store::{JobStore, NewJob, StoreError};
pub use worker::{Runner, Workers};
