//! The geometry an `ortho=true` job needs after its upload is gone: the GLT file of the EMIT granule
//! it was decoded from (`api::formats`), kept with the job under `geometry/<id>/` and removed with it.

use std::path::Path;

use crate::storage::{LocalFile, Storage, StorageError};

/// The name of an upload's GLT file (`cube::gdal::emit::write_glt_file`) beside its decoded pair.
pub const GLT_FILE: &str = "glt.tif";

/// Where a job keeps the GLT of the EMIT upload it was made from (deleted with the job).
pub fn glt_prefix(job_id: &str) -> String {
    format!("geometry/{job_id}")
}

/// Stores the GLT file in the upload scratch `dir`, if there is one, as job `job_id`'s.
pub async fn store_glt(storage: &Storage, dir: &Path, job_id: &str) -> Result<(), StorageError> {
    let p = dir.join(GLT_FILE);
    if p.exists() {
        let prefix = glt_prefix(job_id);
        storage.put_file(&p, &format!("{prefix}/{GLT_FILE}")).await?;
        storage.sync_names(&prefix).await?;
    }
    Ok(())
}

/// Whether the stored ENVI upload at `location` has a GLT file beside it (it was decoded from an EMIT
/// granule; `store_glt` keeps it with the job once the job exists).
pub async fn upload_has_glt(storage: &Storage, location: &str) -> bool {
    storage.size(&format!("{location}/{GLT_FILE}")).await.is_ok()
}

/// A local copy of the GLT kept with job `job_id` (see `store_glt`).
pub async fn kept_glt(storage: &Storage, job_id: &str) -> Result<LocalFile, StorageError> {
    storage.local_copy(&format!("{}/{GLT_FILE}", glt_prefix(job_id))).await
}
