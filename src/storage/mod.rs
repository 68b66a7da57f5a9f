//! Where uploads and results live: an `object_store` store (a local directory under the data dir for
//! now), so that S3 can come later without changing the callers.
//!
//! Layout: `uploads/<job>/cube.{npy,hdr,img}`, `results/<job>/<product>`, and `scratch/<token>/` for files
//! being written (an upload in flight, a result being produced). The cube readers and the result writer
//! work on local paths; with the local store a scratch file is moved into place with `rename`, which the
//! store implements as a filesystem rename (a copy on stores without one).

use std::path::PathBuf;
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, PutPayload};

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("storage: {0}")]
    Store(#[from] object_store::Error),
    #[error("storage: {0}")]
    Io(#[from] std::io::Error),
    #[error("storage key {0:?} is not valid")]
    BadKey(String),
}

impl StorageError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, StorageError::Store(object_store::Error::NotFound { .. }))
    }
}

/// A stored object opened for reading: its size and a stream of its bytes.
pub struct Download {
    pub size: u64,
    pub stream: futures::stream::BoxStream<'static, Result<bytes::Bytes, StorageError>>,
}

#[derive(Clone)]
pub struct Storage {
    local: Arc<LocalFileSystem>,
    root: PathBuf,
}

impl Storage {
    /// The local store rooted at `dir` (created if needed).
    pub fn local(dir: PathBuf) -> Result<Storage, StorageError> {
        std::fs::create_dir_all(&dir)?;
        let root = dir.canonicalize()?;
        let local = LocalFileSystem::new_with_prefix(&root)?.with_automatic_cleanup(true);
        Ok(Storage { local: Arc::new(local), root })
    }

    fn key(k: &str) -> Result<StorePath, StorageError> {
        StorePath::parse(k).map_err(|_| StorageError::BadKey(k.to_string()))
    }

    /// A fresh scratch directory on local disk for files about to be stored.
    pub fn scratch_dir(&self, token: &str) -> Result<PathBuf, StorageError> {
        let dir = self.root.join("scratch").join(token);
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// Removes a scratch directory and whatever is left in it.
    pub fn remove_scratch(&self, token: &str) {
        let dir = self.root.join("scratch").join(token);
        if dir.exists() {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), "cannot remove scratch directory: {e}");
            }
        }
    }

    /// Empties the scratch area (at start: whatever is there belongs to requests of a dead process).
    pub fn clear_scratch(&self) {
        let _ = std::fs::remove_dir_all(self.root.join("scratch"));
    }

    /// Moves a local file (under the scratch area) into the store at `key`.
    pub async fn put_file(&self, local: &std::path::Path, key: &str) -> Result<(), StorageError> {
        let rel = local
            .strip_prefix(&self.root)
            .map_err(|_| StorageError::BadKey(local.display().to_string()))?
            .to_str()
            .ok_or_else(|| StorageError::BadKey(local.display().to_string()))?
            .to_string();
        self.local.rename(&Self::key(&rel)?, &Self::key(key)?).await?;
        Ok(())
    }

    pub async fn put_bytes(&self, key: &str, bytes: bytes::Bytes) -> Result<(), StorageError> {
        self.local.put(&Self::key(key)?, PutPayload::from_bytes(bytes)).await?;
        Ok(())
    }

    /// The local path of a stored object (the cube readers need one).
    pub fn local_path(&self, key: &str) -> Result<PathBuf, StorageError> {
        Ok(self.local.path_to_filesystem(&Self::key(key)?)?)
    }

    pub async fn get(&self, key: &str) -> Result<Download, StorageError> {
        let r = self.local.get(&Self::key(key)?).await?;
        let size = r.meta.size;
        let stream = r.into_stream().map_err(StorageError::from);
        Ok(Download { size, stream: Box::pin(stream) })
    }

    pub async fn get_bytes(&self, key: &str) -> Result<bytes::Bytes, StorageError> {
        Ok(self.local.get(&Self::key(key)?).await?.bytes().await?)
    }

    /// Deletes every object under `prefix` (e.g. `results/<job>`).
    pub async fn delete_prefix(&self, prefix: &str) -> Result<(), StorageError> {
        let p = Self::key(prefix)?;
        let keys: Vec<StorePath> = self.local.list(Some(&p)).map_ok(|m| m.location).try_collect().await?;
        for k in keys {
            match self.local.delete(&k).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Writes and reads back a small object: the store is reachable and writable.
    pub async fn check(&self) -> Result<(), StorageError> {
        self.put_bytes("health/probe", bytes::Bytes::from_static(b"ok")).await?;
        self.get_bytes("health/probe").await?;
        Ok(())
    }
}
