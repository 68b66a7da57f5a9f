//! The scratch area: a directory on this instance's local disk, always, whatever the store. Uploads
//! are received there, results are written there, and objects of a remote store are copied there
//! for the readers that need a file. Each instance has its own, and empties it when it starts.

use std::path::{Path, PathBuf};

use object_store::path::Path as StorePath;

use super::StorageError;

#[derive(Clone, Debug)]
pub(crate) struct Scratch {
    root: PathBuf,
}

impl Scratch {
    pub fn new(root: PathBuf) -> Scratch {
        Scratch { root }
    }

    /// `<root>/<token>`, created if needed.
    pub fn dir(&self, token: &str) -> Result<PathBuf, StorageError> {
        let dir = self.path(token)?;
        std::fs::create_dir_all(&dir).map_err(|e| StorageError::io("create the scratch directory", &dir, e))?;
        Ok(dir)
    }

    pub fn remove(&self, token: &str) {
        let Ok(dir) = self.path(token) else { return };
        if dir.exists() {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), "cannot remove scratch directory: {e}");
            }
        }
    }

    pub fn clear(&self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }

    /// The file a `scratch/<token>/<name>` key names: the requests that decode an upload before it is
    /// stored read it by that key, on every store.
    pub fn file_for_key(&self, key: &str) -> Option<Result<PathBuf, StorageError>> {
        let rest = key.strip_prefix("scratch/")?;
        Some(self.path(rest))
    }

    /// A path under the root, for a relative key-like name (no `..`, no absolute paths).
    fn path(&self, rel: &str) -> Result<PathBuf, StorageError> {
        let parsed = StorePath::parse(rel).map_err(|_| StorageError::BadKey(rel.to_string()))?;
        if parsed.as_ref().is_empty() {
            return Err(StorageError::BadKey(rel.to_string()));
        }
        Ok(parsed.parts().fold(self.root.clone(), |p, part| p.join(part.as_ref())))
    }

    /// A fresh directory for one local copy of a stored object; the [`LocalFile`] removes it.
    pub fn copy_dir(&self) -> Result<PathBuf, StorageError> {
        self.dir(&format!("copy-{}", uuid::Uuid::now_v7()))
    }
}

/// A stored object as a local file, for the readers that need a path (the cube readers, the zip
/// writer). With the local store it is the stored file itself; with a remote store it is a copy in
/// scratch, removed when this is dropped.
#[derive(Debug)]
pub struct LocalFile {
    path: PathBuf,
    /// The scratch directory holding the copy, if this is one.
    copy_dir: Option<PathBuf>,
}

impl LocalFile {
    /// The stored file itself (nothing to remove).
    pub(crate) fn stored(path: PathBuf) -> LocalFile {
        LocalFile { path, copy_dir: None }
    }

    /// A copy at `path`, inside `dir`, which goes when this is dropped.
    pub(crate) fn copy(path: PathBuf, dir: PathBuf) -> LocalFile {
        LocalFile { path, copy_dir: Some(dir) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for LocalFile {
    fn drop(&mut self) {
        if let Some(dir) = &self.copy_dir {
            if let Err(e) = std::fs::remove_dir_all(dir) {
                tracing::warn!(dir = %dir.display(), "cannot remove a local copy: {e}");
            }
        }
    }
}
