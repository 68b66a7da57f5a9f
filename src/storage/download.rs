//! A stored object opened for reading, as the local and the remote stores hand it out.

use super::error::StorageError;

/// A stored object opened for reading: its size and a stream of its bytes.
pub struct Download {
    pub size: u64,
    pub stream: futures::stream::BoxStream<'static, Result<bytes::Bytes, StorageError>>,
}
