//! What the run of a job calls (the store, the storage, the backends, the job cache, the metrics),
//! one set per instance; kept apart from the run (`job_run`) so that the modules a run uses
//! (`remote_input`, `early_start`) can name it without depending on the run itself.

use std::sync::Arc;

use tokio::sync::Notify;

use super::backends::Backends;
use super::metrics::JobMetrics;
use super::service_cache::ServiceCache;
use super::store::{JobStore, Lease};
use crate::storage::Storage;

/// What the run of a job calls: one set per instance, shared by its workers (cheap to clone).
#[derive(Clone)]
pub struct JobServices {
    pub store: JobStore,
    pub storage: Storage,
    pub backends: Arc<Backends>,
    pub cache: Arc<ServiceCache>,
    /// The clients of `s3://` and `https://` inputs.
    pub references: Arc<crate::reference::References>,
    pub metrics: Arc<JobMetrics>,
    /// This instance's claims.
    pub lease: Lease,
    /// Woken whenever a job may have finished: the clients that hold a `GET /v1/jobs/{id}?wait=`
    /// look at their job again.
    pub ended: Arc<Notify>,
}
