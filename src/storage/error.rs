//! The storage layer's one error type. Every message names the store (`local store /dir`, or
//! `s3://bucket/prefix at <endpoint>`), what was being done and the key or file, so that a failure
//! in the log or in a job's error says where to look without a debugger.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// No object at `key`.
    #[error("{store}: no object {key:?}")]
    NotFound { store: String, key: String },
    /// A key that is not a valid object path (empty segments, `..`, ...).
    #[error("storage key {0:?} is not valid")]
    BadKey(String),
    /// `--store` could not be understood, or the store could not be set up from it.
    #[error("store {url:?}: {why}")]
    Config { url: String, why: String },
    /// A request to the object store failed (after the client's own retries).
    #[error("{store}: cannot {op} {key:?}: {source}")]
    Store {
        store: String,
        op: &'static str,
        key: String,
        // Boxed: object_store's error is large, and every storage Result carries this type.
        #[source]
        source: Box<object_store::Error>,
    },
    /// A local file (scratch, or the local store's own files) could not be read or written.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl StorageError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, StorageError::NotFound { .. })
    }

    /// Whether the object store did not answer, or answered with its own failure (object_store
    /// reports both, after its retries, as `Generic`): an outage to retry after. Its specific answers
    /// (a refusal of our credentials, a missing object, a failed precondition) are not.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StorageError::Store { source, .. } if matches!(**source, object_store::Error::Generic { .. }))
    }

    /// An object store error on `key`; the store's `NotFound` becomes [`StorageError::NotFound`],
    /// so that callers test one variant whichever store answered.
    pub(crate) fn store(store: &str, op: &'static str, key: &str, source: object_store::Error) -> StorageError {
        match source {
            object_store::Error::NotFound { .. } => StorageError::NotFound { store: store.to_string(), key: key.to_string() },
            source => StorageError::Store { store: store.to_string(), op, key: key.to_string(), source: Box::new(source) },
        }
    }

    pub(crate) fn io(op: &'static str, path: &Path, source: std::io::Error) -> StorageError {
        StorageError::Io { op, path: path.to_path_buf(), source }
    }

    /// As an I/O error (for the cube readers' error type), keeping "not found" recognisable, and
    /// this error inside it (`get_ref`), so that a job can tell a store outage from a bad input.
    pub fn into_io(self) -> std::io::Error {
        let kind = if self.is_not_found() { std::io::ErrorKind::NotFound } else { std::io::ErrorKind::Other };
        std::io::Error::new(kind, self)
    }
}
