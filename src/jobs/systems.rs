//! The eigen systems a job can be projected with (`statistics_from`), found by id: a succeeded job's
//! (kept with its results as `product::SYSTEM`, with its metadata), or one imported with
//! `POST /v1/systems` (a system file under `systems/<id>/`). Both are owner-scoped: another owner's id
//! reads as unknown. The API resolves the id when a job is created (to check the cube against the
//! system and key the job's cache digest on the system's identity), the run of the job again.

use crate::jobs::model::{product, Job};
use crate::jobs::store::{JobStore, StoreError, SystemRow};
use crate::jobs::JobStatus;
use crate::mnf::result::Metadata;
use crate::mnf::system_file::{Source, SystemFile, SystemFileError};
use crate::storage::{Storage, StorageError};

/// What an id named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SystemKind {
    /// A succeeded job's system.
    Job,
    /// A system imported with `POST /v1/systems`.
    Imported,
}

/// A system found by id, read and checked.
#[derive(Debug, Clone)]
pub struct ResolvedSystem {
    /// The id as given.
    pub id: String,
    pub kind: SystemKind,
    pub file: SystemFile,
    /// `SystemFile::identity`.
    pub identity: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("statistics_from: no job or system {0:?} of yours")]
    NotFound(String),
    #[error("statistics_from: job {id} is {status}; only a succeeded job's system can be used")]
    NotReady { id: String, status: &'static str },
    #[error("job {0} finished before jobs kept their eigen system; run it again to get one")]
    NoSystem(String),
    #[error("the stored system of {id} cannot be read: {source}")]
    Unreadable { id: String, source: SystemFileError },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl ResolveError {
    /// The stable code of the error (the API's and a failed job's).
    pub fn code(&self) -> &'static str {
        match self {
            ResolveError::NotFound(_) => "system_not_found",
            ResolveError::NotReady { .. } => "system_not_ready",
            ResolveError::NoSystem(_) => "no_system",
            ResolveError::Unreadable { .. } => "internal",
            ResolveError::Store(_) => "database_unavailable",
            ResolveError::Storage(_) => "storage_error",
        }
    }
}

/// The system named by `id` (a job id, or an imported system id) for `owner`.
///
/// The lead's batches extend this with batch ids: a new [`SystemKind`] and one more lookup before
/// the `NotFound` answer.
pub async fn resolve(store: &JobStore, storage: &Storage, owner: &str, id: &str) -> Result<ResolvedSystem, ResolveError> {
    // Ids are UUIDs: anything else is no id of ours (and never reaches a query).
    if uuid::Uuid::parse_str(id).is_err() {
        return Err(ResolveError::NotFound(id.to_string()));
    }
    if let Some(job) = store.get(id).await?.filter(|j| j.owner == owner) {
        let file = of_job(storage, &job).await?;
        return Ok(resolved(id, SystemKind::Job, file));
    }
    if let Some(row) = store.get_system(id).await?.filter(|r| r.owner == owner) {
        let file = of_imported(storage, &row).await?;
        return Ok(resolved(id, SystemKind::Imported, file));
    }
    Err(ResolveError::NotFound(id.to_string()))
}

fn resolved(id: &str, kind: SystemKind, file: SystemFile) -> ResolvedSystem {
    let identity = file.identity();
    ResolvedSystem { id: id.to_string(), kind, file, identity }
}

/// The system file of `job` (the caller checked its owner): its stored eigen system with what its
/// metadata says about the input and the fit.
pub async fn of_job(storage: &Storage, job: &Job) -> Result<SystemFile, ResolveError> {
    if job.status != JobStatus::Succeeded {
        return Err(ResolveError::NotReady { id: job.id.clone(), status: job.status.as_str() });
    }
    let Some(metadata_key) = job.results.get(product::METADATA) else {
        return Err(ResolveError::NoSystem(job.id.clone()));
    };
    // Jobs of before `product::SYSTEM` still have theirs where they computed one and the statistics
    // level kept it (the same bytes, beside their results).
    let system_key = match job.results.get(product::SYSTEM) {
        Some(key) => key.clone(),
        None => format!("results/{}/{}", job.id, crate::jobs::cache::EIGEN_OBJECT),
    };
    let bytes = match storage.get_bytes(&system_key).await {
        Ok(b) => b,
        Err(StorageError::NotFound { .. }) => return Err(ResolveError::NoSystem(job.id.clone())),
        Err(e) => return Err(e.into()),
    };
    let unreadable = |m: String| ResolveError::Unreadable { id: job.id.clone(), source: SystemFileError::Invalid(m) };
    let system = crate::cache::eigen_file::decode(&bytes).map_err(|e| unreadable(e.to_string()))?;
    let metadata: Metadata = serde_json::from_slice(&storage.get_bytes(metadata_key).await?).map_err(|e| unreadable(format!("metadata: {e}")))?;
    Ok(SystemFile::of_run(Source::Job(job.id.clone()), &metadata, &system))
}

/// The system file of an imported system (the caller checked its owner).
pub async fn of_imported(storage: &Storage, row: &SystemRow) -> Result<SystemFile, ResolveError> {
    let bytes = storage.get_bytes(&row.storage_key).await?;
    SystemFile::from_json(&bytes).map_err(|source| ResolveError::Unreadable { id: row.id.clone(), source })
}
