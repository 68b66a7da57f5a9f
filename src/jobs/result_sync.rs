//! A succeeded job's result files on the disk, after the job is seen succeeded.
//!
//! On a local store a job's result files enter `results/<id>/` by a rename, still in the page cache,
//! and the job is marked succeeded at once: syncing a 37 MB result takes ~30 ms on the H100 host's
//! disk, longer than the rest of a re-projection. The row says so (`results_unsynced`); right after,
//! [`sync`] writes the files to the disk and clears the mark, durably, and only then is the job's
//! upload deleted (`JobRun::finish`). So until its results are on the disk, a job keeps its input.
//!
//! If the machine stops in between (a power cut, a kernel panic), ext4 leaves such a file whole,
//! short or missing, never with stale bytes. At the next start [`check_at_start`] looks at every job
//! still marked (on PostgreSQL, those this instance ran) before the workers and the job cache start:
//! - results whole: synced, and the mark cleared;
//! - a result cut short or missing, the input still there: the job goes back to the queue and is
//!   computed again (its results and stored eigen systems are deleted first);
//! - a result cut short, no input (a job run on a resident cube, `jobs::resident_run`): the job fails
//!   with `result_lost`, so that nobody downloads a short file; the client sends the cube again.
//!
//! An S3 store has an object once its PUT answered: nothing is marked there.

use super::model::{product, InputKind, Job};
use super::store::{JobStore, StoreError};
use crate::storage::Storage;

/// The error code of a job whose results were lost in a crash and that has no input left.
pub const RESULT_LOST: &str = "result_lost";

/// Bytes read from the start of a stored `.npy` to check its length against its header.
const NPY_HEAD: u64 = 64 << 10;

/// Syncs the result files of succeeded job `id` and clears its mark; false (logged) if either
/// failed, in which case the mark stays and the next start checks the job.
pub async fn sync(store: &JobStore, storage: &Storage, id: &str) -> bool {
    if let Err(e) = storage.sync_prefix(&format!("results/{id}")).await {
        tracing::error!(job = %id, "cannot sync the job's result files to the disk: {e}");
        return false;
    }
    match store.results_synced(id).await {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(job = %id, "cannot record that the job's results are on the disk: {e}");
            false
        }
    }
}

/// What [`check_at_start`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Checked {
    /// Whole, now synced.
    pub synced: usize,
    /// Damaged, queued again to be computed from their input.
    pub requeued: usize,
    /// Damaged with no input: failed with [`RESULT_LOST`].
    pub lost: usize,
}

/// Checks the results of every succeeded job whose results were not known to be on the disk when
/// `instance` last ran (see the module documentation). Run at start, before the job cache is built
/// from the database and before the workers start.
pub async fn check_at_start(store: &JobStore, storage: &Storage, instance: &str) -> Result<Checked, StoreError> {
    let mut checked = Checked::default();
    for job in store.unsynced_results(instance).await? {
        let why = match damage(storage, &job).await {
            None => {
                if sync(store, storage, &job.id).await {
                    checked.synced += 1;
                }
                continue;
            }
            Some(why) => why,
        };
        if input_present(storage, &job).await {
            forget(store, storage, &job.id).await?;
            if store.requeue_lost(&job.id).await? {
                checked.requeued += 1;
                tracing::warn!(job = %job.id, "the job's results did not reach the disk before the machine stopped ({why}); computing them again");
            }
        } else {
            let message = format!(
                "the job's results did not reach the disk before the machine stopped ({why}), and its input is gone; submit the cube again"
            );
            if store.fail_lost(&job.id, RESULT_LOST, &message).await? {
                forget(store, storage, &job.id).await?;
                checked.lost += 1;
                tracing::warn!(job = %job.id, "{message}");
            }
        }
    }
    if checked != Checked::default() {
        tracing::info!(synced = checked.synced, requeued = checked.requeued, lost = checked.lost, "results of jobs that had not reached the disk checked");
    }
    Ok(checked)
}

/// Deletes job `id`'s damaged results, and the eigen systems stored beside them.
async fn forget(store: &JobStore, storage: &Storage, id: &str) -> Result<(), StoreError> {
    store.delete_eigen_of_job(id).await?;
    if let Err(e) = storage.delete_prefix(&format!("results/{id}")).await {
        tracing::warn!(job = %id, "cannot delete the damaged results: {e}");
    }
    Ok(())
}

/// What is wrong with `job`'s stored results, or None when each is whole: each `.npy` as long as its
/// header says, each ENVI header and the metadata readable. (A zip of the ENVI pair is made after
/// the job, and synced before it is stored: `api::jobs`.)
async fn damage(storage: &Storage, job: &Job) -> Option<String> {
    if job.results.is_empty() {
        return Some("no result files recorded".into());
    }
    for (name, key) in &job.results {
        let whole = match name.rsplit_once('.').map(|x| x.1) {
            Some("npy") => npy_whole(storage, key).await,
            Some(kind @ ("hdr" | "json")) => match storage.get_bytes(key).await {
                Ok(b) if kind == "hdr" => std::str::from_utf8(&b)
                    .map_err(|_| "not text".to_string())
                    .and_then(|t| crate::cube::envi::parse_header(t).map(drop).map_err(|e| e.to_string())),
                Ok(b) => serde_json::from_slice::<serde_json::Value>(&b).map(drop).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            },
            // The ENVI data files that only jobs from before the data file was made on demand stored (never
            // marked unsynced).
            _ if name == product::COMPONENTS_IMG || name == product::DENOISED_IMG => Ok(()),
            _ => storage.size(key).await.map(drop).map_err(|e| e.to_string()),
        };
        if let Err(why) = whole {
            return Some(format!("{name}: {why}"));
        }
    }
    None
}

/// Whether the stored `.npy` at `key` is as long as its header says.
async fn npy_whole(storage: &Storage, key: &str) -> Result<(), String> {
    let size = storage.size(key).await.map_err(|e| e.to_string())?;
    let head = storage.get_range(key, 0..size.min(NPY_HEAD)).await.map_err(|e| e.to_string())?;
    crate::cube::npy::check_length(&head, size, std::path::Path::new(key)).map_err(|e| e.to_string())
}

/// Whether the job's input is still there to compute it again from: its upload, or the file an
/// href named.
async fn input_present(storage: &Storage, job: &Job) -> bool {
    match job.input_kind {
        // An s3:// or https:// reference is taken to be there: a run that finds it gone or changed
        // fails with input_not_found or input_changed.
        InputKind::Href if crate::reference::Stored::of_location(&job.input_location).is_some() => true,
        InputKind::Href => tokio::fs::metadata(&job.input_location).await.is_ok_and(|m| m.is_file()),
        InputKind::Npy | InputKind::Envi => storage.list(&job.input_location).await.is_ok_and(|keys| !keys.is_empty()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::store::{Lease, NewEigenRow, NewJob};
    use crate::jobs::JobStatus;
    use std::collections::BTreeMap;
    use std::time::Duration;

    const HDR: &str = "ENVI\nsamples = 3\nlines = 4\nbands = 2\nheader offset = 0\ndata type = 4\ninterleave = bsq\nbyte order = 0\n";

    /// Job `id`, run by instance "me" and marked succeeded with its results unsynced: a 4 × 3 × 2
    /// `.npy` (cut to `npy_bytes` when given), an ENVI header, the metadata unless `no_metadata`,
    /// an eigen system row and file; its upload stored when `with_upload`.
    async fn succeeded(store: &JobStore, storage: &Storage, dir: &std::path::Path, id: &str, npy_bytes: Option<usize>, no_metadata: bool, with_upload: bool) {
        store.insert(NewJob::for_test(id)).await.unwrap();
        store.claim(&Lease { owner: "me".into(), duration: Duration::from_secs(30) }).await.unwrap().unwrap();
        let file = dir.join(format!("{id}.npy"));
        crate::cube::npy::write_f32(&file, &[4, 3, 2], &(0..24).map(|v| v as f32 + 0.5).collect::<Vec<_>>()).unwrap();
        if let Some(n) = npy_bytes {
            std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(n as u64).unwrap();
        }
        let key = |name: &str| format!("results/{id}/{name}");
        storage.put_file(&file, &key("components.npy")).await.unwrap();
        storage.put_bytes(&key("components.hdr"), HDR.as_bytes().to_vec().into()).await.unwrap();
        if !no_metadata {
            storage.put_bytes(&key("metadata.json"), bytes::Bytes::from_static(b"{\"components\": 2}")).await.unwrap();
        }
        storage.put_bytes(&key("eigen.bin"), bytes::Bytes::from_static(b"system")).await.unwrap();
        let row = NewEigenRow { digest: format!("{:0>64}", hex::encode(id)), job_id: id.into(), storage_key: key("eigen.bin"), format_version: 1, backend: "cpu".into(), bytes: 6 };
        store.insert_eigen(&row).await.unwrap().unwrap();
        if with_upload {
            storage.put_bytes(&format!("uploads/{id}/cube.npy"), bytes::Bytes::from_static(b"the cube")).await.unwrap();
        }
        let results: BTreeMap<String, String> =
            ["components.npy", "components.hdr", "metadata.json"].iter().map(|n| (n.to_string(), key(n))).collect();
        assert!(store.succeed(id, "me", &results, true).await.unwrap());
    }

    /// Whole results are synced and kept; a result cut short is computed again from the upload; one
    /// whose metadata is missing and whose input is gone fails with `result_lost`. The damaged
    /// jobs' results and eigen systems are gone, and a second check finds nothing.
    #[tokio::test]
    async fn results_that_missed_the_disk_are_computed_again_or_the_job_fails() {
        let dir = tempfile::tempdir().unwrap();
        let store = JobStore::open(&format!("sqlite://{}", dir.path().join("t.db").display())).await.unwrap();
        let storage = Storage::local(dir.path().join("objects")).unwrap();
        succeeded(&store, &storage, dir.path(), "whole", None, false, true).await;
        // A header's worth and a few values: what ext4 can leave of a file written before a crash.
        succeeded(&store, &storage, dir.path(), "short", Some(128 + 20), false, true).await;
        succeeded(&store, &storage, dir.path(), "lost", None, true, false).await;

        let checked = check_at_start(&store, &storage, "me").await.unwrap();
        assert_eq!(checked, Checked { synced: 1, requeued: 1, lost: 1 });

        let whole = store.get("whole").await.unwrap().unwrap();
        assert_eq!((whole.status, whole.results_unsynced, whole.results.len()), (JobStatus::Succeeded, false, 3));
        assert_eq!(storage.list("results/whole").await.unwrap().len(), 4);

        let short = store.get("short").await.unwrap().unwrap();
        assert_eq!((short.status, short.results.len(), short.results_unsynced), (JobStatus::Queued, 0, false));
        assert!(storage.list("results/short").await.unwrap().is_empty());
        assert_eq!(storage.list("uploads/short").await.unwrap().len(), 1, "the input it is computed from again");

        let lost = store.get("lost").await.unwrap().unwrap();
        assert_eq!((lost.status, lost.error_code.as_deref()), (JobStatus::Failed, Some(RESULT_LOST)));
        assert!(lost.error_message.as_deref().unwrap().contains("metadata.json"), "{:?}", lost.error_message);
        assert!(storage.list("results/lost").await.unwrap().is_empty());

        for id in ["short", "lost"] {
            assert!(store.eigen_of_job(id, 1).await.unwrap().is_empty(), "{id}'s eigen system is forgotten");
        }
        assert_eq!(store.eigen_of_job("whole", 1).await.unwrap().len(), 1);
        assert_eq!(check_at_start(&store, &storage, "me").await.unwrap(), Checked::default());
    }

    /// The length check of a stored `.npy`: exact, and a file cut inside its header is damaged too.
    #[tokio::test]
    async fn a_stored_npy_is_whole_only_at_the_length_its_header_gives() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::local(dir.path().join("objects")).unwrap();
        let file = dir.path().join("a.npy");
        crate::cube::npy::write_f32(&file, &[2, 2, 2], &[1.0; 8]).unwrap();
        let full = std::fs::read(&file).unwrap();
        for (n, whole) in [(full.len(), true), (full.len() - 1, false), (40, false), (0, false)] {
            storage.put_bytes("results/j/a.npy", full[..n].to_vec().into()).await.unwrap();
            assert_eq!(npy_whole(&storage, "results/j/a.npy").await.is_ok(), whole, "{n} bytes");
        }
        let mut longer = full.clone();
        longer.push(0);
        storage.put_bytes("results/j/a.npy", longer.into()).await.unwrap();
        assert!(npy_whole(&storage, "results/j/a.npy").await.is_err(), "a longer file is not the result either");
    }
}
