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

    pub(super) fn cube(e: CubeError) -> JobFailure {
        let code = if is_disk_condition(&e) { Self::DISK_UNAVAILABLE } else { e.code() };
        JobFailure { code: code.into(), message: e.to_string() }
    }

    /// A storage or local file error: `DISK_UNAVAILABLE` for a disk condition, else `storage_error`.
    pub(super) fn storage(e: &(dyn std::error::Error + 'static)) -> JobFailure {
        let code = if is_disk_condition(e) { Self::DISK_UNAVAILABLE } else { "storage_error" };
        JobFailure { code: code.into(), message: e.to_string() }
    }
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
