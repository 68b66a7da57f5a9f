//! The local store: a directory (`DATA_DIR/objects` by default, or `--store file:///dir`) through
//! object_store's `LocalFileSystem`, which writes through a staging file and a rename, so that a
//! reader never sees half an object. Finished files enter it by a rename, not a copy.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;
use object_store::{GetOptions, GetRange, GetResultPayload, ObjectStore, PutPayload};

use super::{Download, LocalFile, StorageError};

/// Files at least this large are served from a mapping (see `LocalStore::get`).
const MAP_FROM: u64 = 4 << 20;
/// Bytes per piece of a mapped download.
const MAP_PIECE: usize = 4 << 20;

/// The file's bytes as a stream of slices of one mapping, or None where it cannot be mapped.
fn map_stream(file: &std::fs::File) -> Option<futures::stream::BoxStream<'static, Result<bytes::Bytes, StorageError>>> {
    // SAFETY: stored objects are never written in place: they enter the store by a rename (a staging
    // file, `put_file`, `put_bytes`) and leave it by an unlink, after which the mapping still reads the
    // old inode. So the mapped bytes do not change while the response streams them.
    let map = unsafe { memmap2::Mmap::map(file) }.ok()?;
    let _ = map.advise(memmap2::Advice::Sequential);
    let all = bytes::Bytes::from_owner(map);
    let pieces: Vec<Result<bytes::Bytes, StorageError>> =
        (0..all.len()).step_by(MAP_PIECE).map(|at| Ok(all.slice(at..(at + MAP_PIECE).min(all.len())))).collect();
    Some(Box::pin(futures::stream::iter(pieces)))
}

pub(crate) struct LocalStore {
    fs: Arc<LocalFileSystem>,
    name: String,
    /// Requests that want no write-back in flight when they sync the job database (see
    /// [`LocalStore::pause_syncs`]).
    quiet: Arc<AtomicUsize>,
}

/// While held, [`LocalStore::sync_prefix`] submits no new piece (up to [`QUIET_AT_MOST`] per piece).
pub struct SyncPause(Option<Arc<AtomicUsize>>);

impl SyncPause {
    /// A pause that pauses nothing (a store with nothing to sync).
    pub(crate) fn none() -> SyncPause {
        SyncPause(None)
    }
}

impl Drop for SyncPause {
    fn drop(&mut self) {
        if let Some(q) = &self.0 {
            q.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl LocalStore {
    /// The store rooted at `dir` (created if needed).
    pub fn open(dir: &Path) -> Result<LocalStore, StorageError> {
        std::fs::create_dir_all(dir).map_err(|e| StorageError::io("create the store directory", dir, e))?;
        let root = dir.canonicalize().map_err(|e| StorageError::io("open the store directory", dir, e))?;
        let name = format!("local store {}", root.display());
        let fs = LocalFileSystem::new_with_prefix(&root)
            .map_err(|e| StorageError::store(&name, "open", "", e))?
            .with_automatic_cleanup(true);
        Ok(LocalStore { fs: Arc::new(fs), name, quiet: Arc::default() })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn err(&self, op: &'static str, key: &StorePath) -> impl FnOnce(object_store::Error) -> StorageError + '_ {
        let key = key.to_string();
        move |e| StorageError::store(&self.name, op, &key, e)
    }

    fn file(&self, key: &StorePath) -> Result<PathBuf, StorageError> {
        self.fs.path_to_filesystem(key).map_err(self.err("map to a file", key))
    }

    /// Moves `local` to `key`: a rename, or a copy where the two are on different filesystems
    /// (a `file://` store on another disk than the data dir).
    pub async fn put_file(&self, local: &Path, key: &StorePath) -> Result<(), StorageError> {
        let (src, dst) = (local.to_path_buf(), self.file(key)?);
        tokio::task::spawn_blocking(move || move_file(&src, &dst))
            .await
            .map_err(|e| StorageError::store(&self.name, "store", key.as_ref(), object_store::Error::JoinError { source: e }))?
    }

    pub async fn put_bytes(&self, key: &StorePath, bytes: bytes::Bytes) -> Result<(), StorageError> {
        self.fs.put(key, PutPayload::from_bytes(bytes)).await.map_err(self.err("write", key))?;
        Ok(())
    }

    pub async fn get(&self, key: &StorePath) -> Result<Download, StorageError> {
        let r = self.fs.get(key).await.map_err(self.err("read", key))?;
        let size = r.meta.size;
        let stream: futures::stream::BoxStream<'static, Result<bytes::Bytes, StorageError>> = match r.payload {
            // A large local file: mapped and handed to the connection in slices, without a copy or a
            // trip to the blocking pool per read (1 MiB reads through tokio's file gave ~1 GB/s
            // downloads on the H100 host). A small one, or one that cannot be mapped: read
            // in 1 MiB strides (the store's own stream reads 8 KiB at a time, each on the blocking
            // pool, which caps downloads far below the disk and the network).
            GetResultPayload::File(file, path) => match (size >= MAP_FROM).then(|| map_stream(&file)).flatten() {
                Some(s) => s,
                None => {
                    let file = tokio::fs::File::from_std(file);
                    Box::pin(tokio_util::io::ReaderStream::with_capacity(file, 1 << 20).map_err(move |e| StorageError::io("read", &path, e)))
                }
            },
            GetResultPayload::Stream(s) => {
                let name = self.name.clone();
                let key = key.to_string();
                Box::pin(s.map_err(move |e| StorageError::store(&name, "read", &key, e)))
            }
        };
        Ok(Download { size, stream })
    }

    pub async fn get_bytes(&self, key: &StorePath) -> Result<bytes::Bytes, StorageError> {
        let r = self.fs.get(key).await.map_err(self.err("read", key))?;
        r.bytes().await.map_err(self.err("read", key))
    }

    pub async fn get_range(&self, key: &StorePath, range: std::ops::Range<u64>) -> Result<bytes::Bytes, StorageError> {
        let opts = GetOptions { range: Some(GetRange::Bounded(range)), ..Default::default() };
        let r = self.fs.get_opts(key, opts).await.map_err(self.err("read a range of", key))?;
        r.bytes().await.map_err(self.err("read a range of", key))
    }

    pub async fn size(&self, key: &StorePath) -> Result<u64, StorageError> {
        Ok(self.fs.head(key).await.map_err(self.err("look up", key))?.size)
    }

    /// The stored file itself: nothing to copy.
    pub async fn local_copy(&self, key: &StorePath) -> Result<LocalFile, StorageError> {
        let path = self.file(key)?;
        match tokio::fs::metadata(&path).await {
            Ok(m) if m.is_file() => Ok(LocalFile::stored(path)),
            Ok(_) => Err(StorageError::NotFound { store: self.name.clone(), key: key.to_string() }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(StorageError::NotFound { store: self.name.clone(), key: key.to_string() }),
            Err(e) => Err(StorageError::io("open", &path, e)),
        }
    }

    pub async fn list(&self, prefix: &StorePath) -> Result<Vec<String>, StorageError> {
        let p = (!prefix.as_ref().is_empty()).then_some(prefix);
        self.fs.list(p).map_ok(|m| m.location.to_string()).try_collect().await.map_err(self.err("list", prefix))
    }

    /// [`LocalStore::delete_prefix`] for a synced upload: each file's cached pages are dropped a
    /// slice at a time first (see `release_cached_pages`).
    pub async fn delete_upload(&self, prefix: &StorePath) -> Result<(), StorageError> {
        let keys: Vec<StorePath> = self.fs.list(Some(prefix)).map_ok(|m| m.location).try_collect().await.map_err(self.err("list", prefix))?;
        for key in keys {
            let path = self.file(&key)?;
            tokio::task::spawn_blocking(move || release_cached_pages(&path))
                .await
                .map_err(|e| StorageError::store(&self.name, "release", key.as_ref(), object_store::Error::JoinError { source: e }))?;
        }
        self.delete_prefix(prefix).await
    }

    /// Holds the result syncs back (between their pieces) until dropped: for a request about to
    /// make a synced commit that a client waits for, started well before it, so that the pieces in
    /// flight are on the disk by then and the commit waits for none (`sync_in_pieces`).
    pub fn pause_syncs(&self) -> SyncPause {
        self.quiet.fetch_add(1, Ordering::AcqRel);
        SyncPause(Some(self.quiet.clone()))
    }

    /// Syncs the directory `prefix/` and the one holding it: the names of files renamed into it
    /// whose data is already on the disk (an upload, synced before it is stored). A missing
    /// directory is nothing to sync.
    pub async fn sync_names(&self, prefix: &StorePath) -> Result<(), StorageError> {
        let dir = self.file(prefix)?;
        tokio::task::spawn_blocking(move || {
            for d in [Some(dir.as_path()), dir.parent()].into_iter().flatten() {
                match std::fs::File::open(d).and_then(|h| h.sync_all()) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(StorageError::io("sync", d, e)),
                    _ => {}
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| StorageError::store(&self.name, "sync", prefix.as_ref(), object_store::Error::JoinError { source: e }))?
    }

    /// Syncs every file under `prefix/`, then the directories holding them and the one holding
    /// `prefix/` itself (a file renamed into a new directory needs all three on the disk).
    pub async fn sync_prefix(&self, prefix: &StorePath) -> Result<(), StorageError> {
        let keys: Vec<StorePath> = self.fs.list(Some(prefix)).map_ok(|m| m.location).try_collect().await.map_err(self.err("list", prefix))?;
        let mut files = Vec::with_capacity(keys.len());
        for key in &keys {
            files.push(self.file(key)?);
        }
        let top = self.file(prefix)?;
        let quiet = self.quiet.clone();
        tokio::task::spawn_blocking(move || {
            let mut dirs = std::collections::BTreeSet::new();
            // A file or directory deleted meanwhile (its job deleted) is nothing to sync.
            let sync = |p: &Path| match std::fs::File::open(p).and_then(|h| sync_in_pieces(&h, &quiet)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StorageError::io("sync", p, e)),
                _ => Ok(()),
            };
            for f in &files {
                sync(f)?;
                dirs.extend(f.parent().map(Path::to_path_buf));
            }
            dirs.extend(top.parent().map(Path::to_path_buf));
            // Deepest first: a directory's entry in its parent is synced after what it holds.
            for d in dirs.iter().rev() {
                sync(d)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| StorageError::store(&self.name, "sync", prefix.as_ref(), object_store::Error::JoinError { source: e }))?
    }

    /// Deletes every object under `prefix/`, and the object named `prefix` itself if there is one.
    pub async fn delete_prefix(&self, prefix: &StorePath) -> Result<(), StorageError> {
        let mut keys: Vec<StorePath> = self.fs.list(Some(prefix)).map_ok(|m| m.location).try_collect().await.map_err(self.err("list", prefix))?;
        keys.push(prefix.clone());
        for k in keys {
            match self.fs.delete(&k).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(StorageError::store(&self.name, "delete", k.as_ref(), e)),
            }
        }
        Ok(())
    }
}

/// Bytes written back per step by `sync_in_pieces`.
const SYNC_PIECE: u64 = 1 << 20;
/// How long `sync_in_pieces` holds a piece back for a [`SyncPause`] at most (a stream of requests
/// does not stop the syncs), and how often it looks again.
const QUIET_AT_MOST: std::time::Duration = std::time::Duration::from_millis(50);
const QUIET_POLL: std::time::Duration = std::time::Duration::from_micros(200);

/// `f.sync_all()`, its data written back a piece at a time first, at most two pieces in flight.
/// Why: on ext4 (data=ordered) a commit that syncs the journal, as the job database's synced
/// commits do, waits for the data of every file whose blocks were allocated in the same
/// transaction. A 37 MB result synced in one call held such a commit for 20–26 ms on the H100 host
/// (a 4 KiB `fdatasync` takes 0.11 ms there when the disk is idle: `124019c:scripts/dev/fsync-probe.py`);
/// in pieces, a commit waits for the pieces in flight only, and none while `quiet` (a count of
/// [`SyncPause`]s) holds the next piece back.
fn sync_in_pieces(f: &std::fs::File, quiet: &AtomicUsize) -> std::io::Result<()> {
    let meta = f.metadata()?;
    let len = if meta.is_file() { meta.len() } else { 0 };
    let mut at = 0;
    while at < len {
        let held = std::time::Instant::now();
        while quiet.load(Ordering::Acquire) > 0 && held.elapsed() < QUIET_AT_MOST {
            std::thread::sleep(QUIET_POLL);
        }
        crate::write_to_disk::start_writeback(f, (at, SYNC_PIECE), at.checked_sub(SYNC_PIECE).map(|p| (p, SYNC_PIECE)));
        at += SYNC_PIECE;
    }
    f.sync_all()
}

/// Pages dropped per step by `release_cached_pages`, and the pause between steps.
const RELEASE_SLICE: u64 = 16 << 20;
const RELEASE_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

/// Drops a file's clean cached pages a slice at a time, with a pause between slices, before the file
/// is deleted. Deleting (or unmapping for the last time) a file whose pages are cached frees them all
/// at once in that thread: for a finished 299 MB upload on the H100 host's ext4, the job
/// that ran meanwhile took 50-100 ms instead of ~18 (its result written, its scratch directory
/// removed, while the pages were freed). Pages a mapping still uses (a cube kept on the GPU maps its
/// upload) are left alone by `POSIX_FADV_DONTNEED`, so this never takes data from a reader; a missing
/// file is nothing to do.
fn release_cached_pages(path: &Path) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let Ok(f) = std::fs::File::open(path) else { return };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let mut at = 0;
        while at < len {
            // SAFETY: posix_fadvise takes an open descriptor and integers; no memory is shared.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), at as libc::off_t, RELEASE_SLICE as libc::off_t, libc::POSIX_FADV_DONTNEED) };
            at += RELEASE_SLICE;
            std::thread::sleep(RELEASE_PAUSE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = path;
}

/// Renames `src` to `dst` (creating `dst`'s directory); across filesystems, copies to a staging name
/// beside `dst` (which the store's listings skip: `#` and digits) and renames that, so `dst` appears
/// whole or not at all.
fn move_file(src: &Path, dst: &Path) -> Result<(), StorageError> {
    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent).map_err(|e| StorageError::io("create the directory", parent, e))?;
    }
    match std::fs::rename(src, dst) {
        Ok(()) => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {}
        Err(e) => return Err(StorageError::io("move into the store", src, e)),
    }
    let mut staging = dst.as_os_str().to_owned();
    staging.push(format!("#{}", rand::random::<u32>()));
    let staging = PathBuf::from(staging);
    let copied = std::fs::copy(src, &staging)
        .and_then(|_| std::fs::File::open(&staging)?.sync_all())
        .and_then(|_| std::fs::rename(&staging, dst));
    if let Err(e) = copied {
        let _ = std::fs::remove_file(&staging);
        return Err(StorageError::io("copy into the store", src, e));
    }
    std::fs::remove_file(src).map_err(|e| StorageError::io("remove", src, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A held pause keeps each piece back for up to `QUIET_AT_MOST` (so a three-piece file takes at
    /// least three times that), and the sync still ends; dropping the pause releases it.
    #[test]
    fn a_paused_sync_waits_between_pieces_and_still_ends() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let path = dir.path().join("r.bin");
        std::fs::write(&path, vec![7u8; 3 * SYNC_PIECE as usize]).unwrap();
        let pause = store.pause_syncs();
        let t = std::time::Instant::now();
        sync_in_pieces(&std::fs::File::open(&path).unwrap(), &store.quiet).unwrap();
        assert!(t.elapsed() >= 3 * QUIET_AT_MOST, "{:?}", t.elapsed());
        assert_eq!(store.quiet.load(Ordering::Acquire), 1);
        drop(pause);
        assert_eq!(store.quiet.load(Ordering::Acquire), 0);
        sync_in_pieces(&std::fs::File::open(&path).unwrap(), &store.quiet).unwrap();
    }

    /// The names of an upload moved into the store are synced; a prefix with nothing under it is
    /// nothing to sync, not an error.
    #[tokio::test]
    async fn names_are_synced_and_a_missing_prefix_is_no_error() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let src = dir.path().join("cube.npy");
        std::fs::write(&src, b"cube").unwrap();
        store.put_file(&src, &StorePath::from("uploads/j1/cube.npy")).await.unwrap();
        store.sync_names(&StorePath::from("uploads/j1")).await.unwrap();
        store.sync_names(&StorePath::from("uploads/none")).await.unwrap();
        assert_eq!(std::fs::read(dir.path().join("uploads/j1/cube.npy")).unwrap(), b"cube");
    }

    #[test]
    fn move_file_renames_into_new_directories() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("a.bin");
        std::fs::write(&src, b"abc").unwrap();
        let dst = dir.path().join("x/y/b.bin");
        move_file(&src, &dst).unwrap();
        assert!(!src.exists());
        assert_eq!(std::fs::read(&dst).unwrap(), b"abc");
        let e = move_file(&src, &dst).unwrap_err();
        assert!(e.to_string().contains("a.bin"), "{e}");
    }
}
