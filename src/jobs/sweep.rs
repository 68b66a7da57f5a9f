//! Uploads of finished jobs left behind.
//!
//! A finished job's upload (299 MB for the benchmark cube) is deleted by a task spawned when the job
//! ends (`JobRun::finish`), so that the worker is free meanwhile. A process that stops before that task
//! ran, or a deletion that failed, leaves the upload until the job expires (`--retention`, 7 days by
//! default). The sweep, run when the service starts and then every [`EVERY`], deletes the uploads whose
//! job is finished. An upload without a row is left alone: its body may still be arriving, or its row
//! not yet inserted.

use std::collections::BTreeSet;
use std::time::Duration;

use super::model::InputKind;
use super::store::JobStore;
use crate::storage::Storage;

/// How often the service sweeps after its start.
pub const EVERY: Duration = Duration::from_secs(600);

/// Deletes `uploads/<id>` of every finished job with an upload still stored; returns how many.
pub async fn finished_uploads(store: &JobStore, storage: &Storage) -> anyhow::Result<usize> {
    let keys = storage.list("uploads").await?;
    // uploads/<id>/<file>: one prefix per job.
    let ids: BTreeSet<String> = keys.iter().filter_map(|k| k.strip_prefix("uploads/")?.split('/').next().map(str::to_string)).collect();
    let mut deleted = 0;
    for id in ids {
        let Some(job) = store.get(&id).await? else { continue };
        let location = format!("uploads/{id}");
        // A job whose results are not yet on the disk keeps its input (`jobs::result_sync`).
        if job.status.is_finished() && !job.results_unsynced && job.input_kind != InputKind::Href && job.input_location == location {
            match storage.delete_upload(&location).await {
                Ok(()) => deleted += 1,
                Err(e) => tracing::warn!(job = %id, "cannot delete the upload of a finished job: {e}"),
            }
        }
    }
    if deleted > 0 {
        tracing::info!("deleted the uploads of {deleted} finished job(s) left behind");
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::model::InputSummary;
    use crate::jobs::store::NewJob;
    use std::collections::BTreeMap;

    fn new_job(id: &str) -> NewJob {
        NewJob {
            id: id.into(),
            owner: "alice".into(),
            params: "{}".into(),
            digest: format!("digest-{id}"),
            content_digest: None,
            upload_sha256: None,
            input: InputSummary { lines: 1, samples: 1, bands: 1, data_type: "u8".into(), interleave: "bip".into() },
            input_kind: InputKind::Npy,
            input_location: format!("uploads/{id}"),
        }
    }

    /// Only the upload of the finished job goes; a queued job's and a row-less one stay.
    #[tokio::test]
    async fn only_finished_jobs_lose_their_uploads() {
        let dir = tempfile::tempdir().unwrap();
        let store = JobStore::open(&format!("sqlite://{}", dir.path().join("t.db").display())).await.unwrap();
        let storage = Storage::local(dir.path().join("objects")).unwrap();
        for id in ["done", "queued", "arriving"] {
            storage.put_bytes(&format!("uploads/{id}/cube.npy"), bytes::Bytes::from_static(b"x")).await.unwrap();
        }
        store.insert_succeeded(new_job("done"), &BTreeMap::new(), "test", false).await.unwrap();
        store.insert(new_job("queued")).await.unwrap();

        assert_eq!(finished_uploads(&store, &storage).await.unwrap(), 1);
        let mut left = storage.list("uploads").await.unwrap();
        left.sort();
        assert_eq!(left, vec!["uploads/arriving/cube.npy".to_string(), "uploads/queued/cube.npy".to_string()]);
        assert_eq!(finished_uploads(&store, &storage).await.unwrap(), 0, "nothing more to delete");
    }
}
