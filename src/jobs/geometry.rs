//! The geometry an `ortho=true` job needs after its upload is gone: the GLT file of the EMIT granule
//! it was decoded from (`api::formats`), kept with the job under `geometry/<id>/` and removed with it.

use std::path::Path;

use crate::storage::{Storage, StorageError};

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
