//! Why a job failed: the code and message a failed job's row keeps, and which local disk errors are
//! worth another attempt rather than a failure.

use crate::cube::CubeError;

/// Why a job failed: a stable code and a message for the user.
#[derive(Debug)]
pub struct JobFailure {
    pub code: String,
    pub message: String,
}

impl JobFailure {
    /// The code of a failure to write this instance's own disk that a later attempt can get past
    /// (full, read-only, not permitted). Such a job is not failed: `JobRun::run` leaves it running
    /// without a heartbeat, its lease lapses, and it is claimed again (here or elsewhere), so that an
    /// accepted job is not lost to a disk that was full or read-only for a while.
    pub const DISK_UNAVAILABLE: &'static str = "disk_unavailable";
    /// The code of a failure to reach the object store (it did not answer, after its client's
    /// retries): handled as [`JobFailure::DISK_UNAVAILABLE`], so that a job whose input or results
    /// meet a store outage runs again once the store is back instead of failing.
    pub const STORE_UNAVAILABLE: &'static str = "storage_unavailable";

    pub(super) fn cube(e: CubeError) -> JobFailure {
        let code = if is_disk_condition(&e) {
            Self::DISK_UNAVAILABLE
        } else if is_store_outage(&e) {
            Self::STORE_UNAVAILABLE
        } else {
            e.code()
        };
        JobFailure { code: code.into(), message: e.to_string() }
    }

    /// A storage or local file error: `DISK_UNAVAILABLE` for a disk condition, `STORE_UNAVAILABLE`
    /// for an object store that cannot be reached, else `storage_error`.
    pub(super) fn storage(e: &(dyn std::error::Error + 'static)) -> JobFailure {
        let code = if is_disk_condition(e) {
            Self::DISK_UNAVAILABLE
        } else if is_store_outage(e) {
            Self::STORE_UNAVAILABLE
        } else {
            "storage_error"
        };
        JobFailure { code: code.into(), message: e.to_string() }
    }
}

/// True when `e` (or an error it wraps, an I/O error made by `StorageError::into_io` included) is
/// an object store that did not answer.
fn is_store_outage(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        let inner = err.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()).map(|i| i as &(dyn std::error::Error + 'static));
        if [Some(err), inner].into_iter().flatten().any(|e| e.downcast_ref::<crate::storage::StorageError>().is_some_and(|s| s.is_unavailable())) {
            return true;
        }
        next = err.source();
    }
    false
}

/// True when `e` (or an error it wraps) is a local I/O error of a full, read-only or forbidden disk.
fn is_disk_condition(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT | libc::EROFS | libc::EACCES | libc::EPERM)) {
                return true;
            }
        }
        next = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store that does not answer, met reading a job's input (through the cube reader's I/O error)
    /// or storing its results, leaves the job to run again; the store's specific answers fail it.
    #[test]
    fn a_store_outage_is_not_a_job_failure() {
        use crate::storage::StorageError;
        let outage = || StorageError::store("s3://b/p", "get", "uploads/x", object_store::Error::Generic { store: "S3", source: "connection refused".into() });
        let missing = || StorageError::store("s3://b/p", "get", "uploads/x", object_store::Error::NotFound { path: "uploads/x".into(), source: "gone".into() });
        assert_eq!(JobFailure::storage(&outage()).code, JobFailure::STORE_UNAVAILABLE);
        assert_eq!(JobFailure::cube(CubeError::Io { path: "uploads/x".into(), source: outage().into_io() }).code, JobFailure::STORE_UNAVAILABLE);
        assert_eq!(JobFailure::storage(&missing()).code, "storage_error");
        assert_ne!(JobFailure::cube(CubeError::Io { path: "uploads/x".into(), source: missing().into_io() }).code, JobFailure::STORE_UNAVAILABLE);
    }
}
