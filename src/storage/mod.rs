//! Where uploads and results live: a local directory (`DATA_DIR/objects` by default, or
//! `--store file:///dir`) or an S3 bucket (`--store s3://bucket/prefix`), which several instances
//! can share.
//!
//! Layout: `uploads/<job>/cube.{npy,hdr,img}` and `results/<job>/<product>` in the store;
//! `scratch/<token>/` on this instance's local disk for files being written (an upload in flight, a
//! result being produced) and for local copies of stored objects. Scratch is `DATA_DIR/objects/scratch`
//! with the default store (so a finished file enters the store by a rename) and `DATA_DIR/scratch`
//! otherwise; a `scratch/<token>/<name>` key names a scratch file on every store.
//!
//! Nothing is held whole in memory: [`Storage::put_file`] renames (local) or uploads in parts (S3),
//! [`Storage::get`] streams, and [`Storage::local_copy`] gives the readers that need a file (the cube
//! readers, the zip writer) the stored file itself, or a copy downloaded into scratch by concurrent
//! ranged reads, removed when dropped.
//!
//! Modules: `local` and `remote` (+ `s3`, its client set-up) are the two kinds of store, `transfer`
//! moves files to and from a remote one in parts, `scratch` is the local scratch area, `url` parses
//! `--store`.

mod download;
mod error;
mod local;
mod remote;
mod s3;
mod scratch;
mod transfer;
mod url;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::path::Path as StorePath;

pub use download::Download;
pub use error::StorageError;
pub use local::SyncPause;
pub use scratch::LocalFile;
pub use transfer::{PARTS_IN_FLIGHT, PART_SIZE};
pub use url::StoreUrl;

use local::LocalStore;
use remote::RemoteStore;
use scratch::Scratch;

#[derive(Clone)]
pub struct Storage {
    backend: Backend,
    scratch: Scratch,
}

#[derive(Clone)]
enum Backend {
    Local(Arc<LocalStore>),
    Remote(Arc<RemoteStore>),
}

impl Storage {
    /// The store `--store` names (`None`: the local directory `DATA_DIR/objects`), with its scratch
    /// area under `data_dir`. No request is sent yet; [`Storage::check`] tries the store.
    pub fn open(url: Option<&StoreUrl>, data_dir: &Path) -> Result<Storage, StorageError> {
        let storage = match url {
            None => Storage::local(data_dir.join("objects"))?,
            Some(StoreUrl::Local(dir)) => Storage::with_backend(Backend::Local(Arc::new(LocalStore::open(dir)?)), data_dir),
            Some(StoreUrl::S3 { bucket, prefix }) => Storage::with_backend(Backend::Remote(Arc::new(s3::open(bucket, prefix)?)), data_dir),
        };
        tracing::info!(store = %storage.describe(), "storage");
        Ok(storage)
    }

    /// The local store rooted at `dir` (created if needed), its scratch area inside it.
    pub fn local(dir: PathBuf) -> Result<Storage, StorageError> {
        let store = LocalStore::open(&dir)?;
        let root = dir.canonicalize().map_err(|e| StorageError::io("open the store directory", &dir, e))?;
        Ok(Storage { backend: Backend::Local(Arc::new(store)), scratch: Scratch::new(root.join("scratch")) })
    }

    fn with_backend(backend: Backend, data_dir: &Path) -> Storage {
        Storage { backend, scratch: Scratch::new(data_dir.join("scratch")) }
    }

    /// Which store this is, for logs and messages.
    pub fn describe(&self) -> &str {
        match &self.backend {
            Backend::Local(s) => s.name(),
            Backend::Remote(s) => s.name(),
        }
    }

    fn key(k: &str) -> Result<StorePath, StorageError> {
        match StorePath::parse(k) {
            Ok(p) if !p.as_ref().is_empty() => Ok(p),
            _ => Err(StorageError::BadKey(k.to_string())),
        }
    }

    /// A fresh scratch directory on local disk for files about to be stored.
    pub fn scratch_dir(&self, token: &str) -> Result<PathBuf, StorageError> {
        self.scratch.dir(token)
    }

    /// Removes a scratch directory and whatever is left in it.
    pub fn remove_scratch(&self, token: &str) {
        self.scratch.remove(token)
    }

    /// Empties the scratch area (at start: whatever is there belongs to requests of a dead process).
    pub fn clear_scratch(&self) {
        self.scratch.clear()
    }

    /// Stores the local file `local` (a finished scratch file) as `key`; the file is gone afterwards.
    /// Local store: a rename. S3: one PUT up to [`PART_SIZE`], a multipart upload above.
    pub async fn put_file(&self, local: &Path, key: &str) -> Result<(), StorageError> {
        let key = Self::key(key)?;
        match &self.backend {
            Backend::Local(s) => s.put_file(local, &key).await,
            Backend::Remote(s) => s.put_file(local, &key).await,
        }
    }

    pub async fn put_bytes(&self, key: &str, bytes: bytes::Bytes) -> Result<(), StorageError> {
        let key = Self::key(key)?;
        match &self.backend {
            Backend::Local(s) => s.put_bytes(&key, bytes).await,
            Backend::Remote(s) => s.put_bytes(&key, bytes).await,
        }
    }

    /// The object as a stream (for a download).
    pub async fn get(&self, key: &str) -> Result<Download, StorageError> {
        let key = Self::key(key)?;
        match &self.backend {
            Backend::Local(s) => s.get(&key).await,
            Backend::Remote(s) => s.get(&key).await,
        }
    }

    /// The whole object in memory (small ones: metadata, eigen systems).
    pub async fn get_bytes(&self, key: &str) -> Result<bytes::Bytes, StorageError> {
        let key = Self::key(key)?;
        match &self.backend {
            Backend::Local(s) => s.get_bytes(&key).await,
            Backend::Remote(s) => s.get_bytes(&key).await,
        }
    }

    /// Bytes `range` of the object, fewer if it ends first (an error if it ends before `range.start`).
    /// A `scratch/<token>/<name>` key reads that scratch file (as [`Storage::local_copy`] gives it).
    pub async fn get_range(&self, key: &str, range: Range<u64>) -> Result<bytes::Bytes, StorageError> {
        if let Some(path) = self.scratch.file_for_key(key) {
            let path = path?;
            let k = key.to_string();
            return tokio::task::spawn_blocking(move || read_range(&path, range))
                .await
                .map_err(|e| StorageError::io("read", Path::new(&k), std::io::Error::other(e)))?
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => StorageError::NotFound { store: "scratch".into(), key: k.clone() },
                    _ => StorageError::io("read", Path::new(&k), e),
                });
        }
        let key = Self::key(key)?;
        match &self.backend {
            Backend::Local(s) => s.get_range(&key, range).await,
            Backend::Remote(s) => s.get_range(&key, range).await,
        }
    }

    /// The object's size (and whether it exists: a missing one is [`StorageError::NotFound`]).
    pub async fn size(&self, key: &str) -> Result<u64, StorageError> {
        let key = Self::key(key)?;
        match &self.backend {
            Backend::Local(s) => s.size(&key).await,
            Backend::Remote(s) => s.size(&key).await,
        }
    }

    /// The object as a local file, for readers that need a path; a `scratch/<token>/<name>` key gives
    /// that scratch file. Keep the [`LocalFile`] while reading: with S3 it is a downloaded copy that
    /// goes when it is dropped. From a blocking thread: `handle.block_on(storage.local_copy(key))`.
    pub async fn local_copy(&self, key: &str) -> Result<LocalFile, StorageError> {
        if let Some(path) = self.scratch.file_for_key(key) {
            let path = path?;
            return match tokio::fs::metadata(&path).await {
                Ok(m) if m.is_file() => Ok(LocalFile::stored(path)),
                _ => Err(StorageError::NotFound { store: "scratch".into(), key: key.to_string() }),
            };
        }
        let key = Self::key(key)?;
        match &self.backend {
            Backend::Local(s) => s.local_copy(&key).await,
            Backend::Remote(s) => s.local_copy(&key, &self.scratch).await,
        }
    }

    /// The keys under `prefix` ("" for all), in no particular order.
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        let p = StorePath::parse(prefix).map_err(|_| StorageError::BadKey(prefix.to_string()))?;
        match &self.backend {
            Backend::Local(s) => s.list(&p).await,
            Backend::Remote(s) => s.list(&p).await,
        }
    }

    /// [`Storage::delete_prefix`] for a finished job's synced upload: on local storage, its cached
    /// pages are dropped gradually first, so that the deletion does not free them all at once (S3:
    /// the same as `delete_prefix`).
    pub async fn delete_upload(&self, prefix: &str) -> Result<(), StorageError> {
        let p = Self::key(prefix)?;
        match &self.backend {
            Backend::Local(s) => s.delete_upload(&p).await,
            Backend::Remote(s) => s.delete_prefix(&p).await,
        }
    }

    /// Deletes every object under `prefix` (e.g. `results/<job>`), and the object named `prefix` if
    /// there is one.
    pub async fn delete_prefix(&self, prefix: &str) -> Result<(), StorageError> {
        let p = Self::key(prefix)?;
        match &self.backend {
            Backend::Local(s) => s.delete_prefix(&p).await,
            Backend::Remote(s) => s.delete_prefix(&p).await,
        }
    }

    /// Whether stored files may still be only in this machine's page cache: true for a local store
    /// (files enter it by a rename, unsynced: see [`Storage::sync_prefix`]); an S3 store has an
    /// object once its PUT answered.
    pub fn syncs_locally(&self) -> bool {
        matches!(self.backend, Backend::Local(_))
    }

    /// Local store: syncs the directory `prefix` and its parent, so that files renamed into it
    /// (whose data was synced before) keep their names through a power cut. S3: nothing to do.
    pub async fn sync_names(&self, prefix: &str) -> Result<(), StorageError> {
        let p = Self::key(prefix)?;
        match &self.backend {
            Backend::Local(s) => s.sync_names(&p).await,
            Backend::Remote(_) => Ok(()),
        }
    }

    /// Holds the local store's result syncs back while the pause lives (see
    /// `LocalStore::pause_syncs`); nothing to pause on S3.
    pub fn pause_syncs(&self) -> SyncPause {
        match &self.backend {
            Backend::Local(s) => s.pause_syncs(),
            Backend::Remote(_) => SyncPause::none(),
        }
    }

    /// Local store: writes every file under `prefix` (e.g. `results/<job>`), and the directories
    /// that name them, to the disk (fsync), so that they survive a power cut. S3: nothing to do.
    pub async fn sync_prefix(&self, prefix: &str) -> Result<(), StorageError> {
        let p = Self::key(prefix)?;
        match &self.backend {
            Backend::Local(s) => s.sync_prefix(&p).await,
            Backend::Remote(_) => Ok(()),
        }
    }

    /// Writes and reads back a small object: the store is reachable and writable.
    pub async fn check(&self) -> Result<(), StorageError> {
        self.put_bytes("health/probe", bytes::Bytes::from_static(b"ok")).await?;
        self.get_bytes("health/probe").await?;
        Ok(())
    }
}

/// Bytes `range` of a local file, fewer if it ends first.
fn read_range(path: &Path, range: Range<u64>) -> std::io::Result<bytes::Bytes> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    if range.start > len {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the range starts past the end"));
    }
    let mut buf = vec![0u8; (range.end.min(len) - range.start) as usize];
    f.read_exact_at(&mut buf, range.start)?;
    Ok(buf.into())
}
