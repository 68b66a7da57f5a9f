//! The eigen systems a job can be projected with (`statistics_from`), found by id: a succeeded job's
//! (kept with its results as `product::SYSTEM`, with its metadata), or one imported with
//! `POST /v1/systems` (a system file under `systems/<id>/`). Both are owner-scoped: another owner's id
//! reads as unknown. The API resolves the id when a job is created (to check the cube against the
//! system and key the job's cache digest on the system's identity), the run of the job again.

use crate::jobs::model::{product, Job};
use crate::jobs::store::{JobStore, StoreError, SystemRow};
use crate::jobs::{JobStatus, PersistError};
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
    /// A pooled batch's system (`POST /v1/batches` with `"statistics": "pooled"`).
    Batch,
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
    #[error("statistics_from: batch {0} has no pooled system yet (its statistics are still being computed, or it failed)")]
    BatchNotReady(String),
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
            ResolveError::NotReady { .. } | ResolveError::BatchNotReady(_) => "system_not_ready",
            ResolveError::NoSystem(_) => "no_system",
            ResolveError::Unreadable { .. } => "internal",
            ResolveError::Store(_) => "database_unavailable",
            ResolveError::Storage(_) => "storage_error",
        }
    }
}

/// The system named by `id` (a job id, an imported system id, or a pooled batch's id) for `owner`.
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
    if let Some(row) = store.get_batch(id).await?.filter(|b| b.owner == owner && b.pooled) {
        let key = row.system_key.ok_or_else(|| ResolveError::BatchNotReady(id.to_string()))?;
        let bytes = storage.get_bytes(&key).await?;
        let file = SystemFile::from_json(&bytes).map_err(|source| ResolveError::Unreadable { id: id.to_string(), source })?;
        return Ok(resolved(id, SystemKind::Batch, file));
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
        None => format!("results/{}/{}", job.id, crate::jobs::service_cache::EIGEN_OBJECT),
    };
    let bytes = match storage.get_bytes(&system_key).await {
        Ok(b) => b,
        Err(StorageError::NotFound { .. }) => return Err(ResolveError::NoSystem(job.id.clone())),
        Err(e) => return Err(e.into()),
    };
    let unreadable = |m: String| ResolveError::Unreadable { id: job.id.clone(), source: SystemFileError::Invalid(m) };
    let system = crate::job_cache::eigen_file::decode(&bytes).map_err(|e| unreadable(e.to_string()))?;
    let metadata: Metadata = serde_json::from_slice(&storage.get_bytes(metadata_key).await?).map_err(|e| unreadable(format!("metadata: {e}")))?;
    Ok(SystemFile::of_run(Source::Job(job.id.clone()), &metadata, &system))
}

/// The system file of an imported system (the caller checked its owner).
pub async fn of_imported(storage: &Storage, row: &SystemRow) -> Result<SystemFile, ResolveError> {
    let bytes = storage.get_bytes(&row.storage_key).await?;
    SystemFile::from_json(&bytes).map_err(|source| ResolveError::Unreadable { id: row.id.clone(), source })
}

/// Stores an imported system file (`POST /v1/systems`): the object first, so that a row always
/// names a complete object; a row that cannot be inserted takes its object with it.
pub async fn store_imported(store: &JobStore, storage: &Storage, row: &SystemRow, json: Vec<u8>) -> Result<(), PersistError> {
    storage.put_bytes(&row.storage_key, json.into()).await?;
    if let Err(e) = store.insert_system(row).await {
        let _ = storage.delete_prefix(&format!("systems/{}", row.id)).await;
        return Err(e.into());
    }
    Ok(())
}

/// Deletes an imported system: its row, then its file (a file left behind is logged).
pub async fn delete_imported(store: &JobStore, storage: &Storage, id: &str) -> Result<(), StoreError> {
    store.delete_system(id).await?;
    if let Err(e) = storage.delete_prefix(&format!("systems/{id}")).await {
        tracing::warn!(system = %id, "cannot delete the stored system file: {e}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::jobs::store::Lease;
    use crate::jobs::NewJob;
    use crate::mnf::{MnfParams, Monitor};

    /// A succeeded job of alice's whose results hold `products` (name → bytes), as a worker leaves them.
    async fn succeeded(store: &JobStore, storage: &Storage, products: &[(&str, Vec<u8>)]) -> String {
        let id = uuid::Uuid::now_v7().to_string();
        store.insert(NewJob::for_test(&id)).await.unwrap();
        let lease = Lease { owner: "worker".into(), duration: Duration::from_secs(30) };
        assert_eq!(store.claim(&lease).await.unwrap().map(|j| j.id), Some(id.clone()));
        let mut results = BTreeMap::new();
        for (name, bytes) in products {
            let key = format!("results/{id}/{name}");
            storage.put_bytes(&key, bytes.clone().into()).await.unwrap();
            results.insert(name.to_string(), key);
        }
        assert!(store.succeed(&id, "worker", &results, false).await.unwrap());
        id
    }

    /// Old jobs (no `product::SYSTEM`) are served from the statistics level's copy beside their results
    /// when there is one, else `no_system`; ids of other owners, queued jobs and non-ids are refused.
    #[tokio::test]
    async fn job_ids_resolve_for_their_owner_only_and_old_jobs_from_the_cache_copy() {
        let dir = tempfile::tempdir().unwrap();
        let store = JobStore::open(&format!("sqlite://{}", dir.path().join("t.db").display())).await.unwrap();
        let storage = Storage::local(dir.path().join("objects")).unwrap();
        let cube = crate::cube::synthetic::generate(&crate::cube::synthetic::SyntheticSpec::small(20, 20, 8));
        let params = MnfParams { components: Some(3), ..MnfParams::default() };
        let system = crate::mnf::pipeline::analyse(&cube, &params, &CpuBackend::new(), &Monitor::silent()).unwrap();
        let out = crate::mnf::pipeline::apply(&cube, &params, &system, &CpuBackend::new(), &Monitor::silent()).unwrap();
        let metadata = serde_json::to_vec(&out.metadata).unwrap();
        let encoded = crate::job_cache::eigen_file::encode(&system);

        let new = succeeded(&store, &storage, &[(product::METADATA, metadata.clone()), (product::SYSTEM, encoded.clone())]).await;
        let found = resolve(&store, &storage, "alice", &new).await.unwrap();
        assert_eq!((found.kind, &found.file.system, found.file.input.bands), (SystemKind::Job, &system, 8));
        assert_eq!(found.identity, found.file.identity());

        let old = succeeded(&store, &storage, &[(product::METADATA, metadata.clone()), (crate::jobs::service_cache::EIGEN_OBJECT, encoded)]).await;
        assert_eq!(resolve(&store, &storage, "alice", &old).await.unwrap().file.system, system);
        let older = succeeded(&store, &storage, &[(product::METADATA, metadata)]).await;
        assert_eq!(resolve(&store, &storage, "alice", &older).await.unwrap_err().code(), "no_system");

        assert_eq!(resolve(&store, &storage, "bob", &new).await.unwrap_err().code(), "system_not_found");
        assert_eq!(resolve(&store, &storage, "alice", "../etc").await.unwrap_err().code(), "system_not_found");
        let queued = uuid::Uuid::now_v7().to_string();
        store.insert(NewJob::for_test(&queued)).await.unwrap();
        assert_eq!(resolve(&store, &storage, "alice", &queued).await.unwrap_err().code(), "system_not_ready");
    }
}
