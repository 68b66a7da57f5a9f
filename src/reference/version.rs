//! The version of an object a job reads by reference, recorded at submit and required at each read.

use serde::{Deserialize, Serialize};

/// What the job records of one object at submit: its reference, size, and version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectVersion {
    pub href: String,
    pub size: u64,
    /// The ETag (S3 and most HTTPS servers); the worker's reads require it (If-Match).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// Last-Modified, for a server that gives no ETag (If-Unmodified-Since).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_modified: Option<String>,
}
