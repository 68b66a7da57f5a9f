//! A remote object store (S3, see `s3.rs`) under a key prefix. Whole files go in and out in parts
//! (`transfer.rs`); the readers that need a file get a copy in scratch.

use std::path::Path;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, PutPayload};

use super::scratch::{LocalFile, Scratch};
use super::transfer::{self, Object, Transfer};
use super::{Download, StorageError};

pub(crate) struct RemoteStore {
    store: Arc<dyn ObjectStore>,
    /// Prepended to every key (the path part of `s3://bucket/prefix`).
    prefix: StorePath,
    name: Arc<str>,
    transfer: Transfer,
}

impl RemoteStore {
    pub fn new(store: Arc<dyn ObjectStore>, prefix: StorePath, name: String) -> RemoteStore {
        RemoteStore { store, prefix, name: name.into(), transfer: Transfer::default() }
    }

    #[cfg(test)]
    pub fn with_transfer(mut self, t: Transfer) -> RemoteStore {
        self.transfer = t;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn full(&self, key: &StorePath) -> StorePath {
        self.prefix.parts().chain(key.parts()).collect()
    }

    fn object(&self, key: &StorePath) -> Object {
        Object { store: self.store.clone(), location: self.full(key), key: key.to_string(), store_name: self.name.clone() }
    }

    fn err(&self, op: &'static str, key: &StorePath) -> impl FnOnce(object_store::Error) -> StorageError + '_ {
        let key = key.to_string();
        move |e| StorageError::store(&self.name, op, &key, e)
    }

    /// Uploads `local` and then removes it (it was a scratch file meant to become this object).
    pub async fn put_file(&self, local: &Path, key: &StorePath) -> Result<(), StorageError> {
        transfer::upload_file(&self.object(key), local, self.transfer).await?;
        match tokio::fs::remove_file(local).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StorageError::io("remove the stored scratch file", local, e)),
        }
    }

    pub async fn put_bytes(&self, key: &StorePath, bytes: bytes::Bytes) -> Result<(), StorageError> {
        self.store.put(&self.full(key), PutPayload::from_bytes(bytes)).await.map_err(self.err("write", key))?;
        Ok(())
    }

    pub async fn get(&self, key: &StorePath) -> Result<Download, StorageError> {
        let obj = self.object(key);
        let (size, etag) = obj.head().await?;
        Ok(Download { size, stream: transfer::chunk_stream(obj, size, etag, self.transfer) })
    }

    pub async fn get_bytes(&self, key: &StorePath) -> Result<bytes::Bytes, StorageError> {
        let r = self.store.get(&self.full(key)).await.map_err(self.err("read", key))?;
        r.bytes().await.map_err(self.err("read", key))
    }

    pub async fn get_range(&self, key: &StorePath, range: std::ops::Range<u64>) -> Result<bytes::Bytes, StorageError> {
        self.object(key).get_range(range, None).await
    }

    pub async fn size(&self, key: &StorePath) -> Result<u64, StorageError> {
        Ok(self.object(key).head().await?.0)
    }

    /// Downloads the object into its own scratch directory; the copy goes when the result is dropped
    /// (or, after a crash, when the next start clears scratch).
    pub async fn local_copy(&self, key: &StorePath, scratch: &Scratch) -> Result<LocalFile, StorageError> {
        let dir = scratch.copy_dir()?;
        let name = key.filename().unwrap_or("object");
        // Owned by the guard from here on, so that a failed download leaves nothing behind.
        let file = LocalFile::copy(dir.join(name), dir);
        transfer::download_file(&self.object(key), file.path(), self.transfer).await?;
        Ok(file)
    }

    /// Keys under `prefix` (relative to the store's prefix), every page of the listing.
    pub async fn list(&self, prefix: &StorePath) -> Result<Vec<String>, StorageError> {
        let full = self.full(prefix);
        let skip = self.prefix.parts().count();
        let p = (!full.as_ref().is_empty()).then_some(&full);
        self.store
            .list(p)
            .map_ok(|m| m.location.parts().skip(skip).collect::<StorePath>().to_string())
            .try_collect()
            .await
            .map_err(self.err("list", prefix))
    }

    /// Deletes every object under `prefix/`, and the object named `prefix` itself if there is one:
    /// the listing is paginated by the client, and the deletes go in batches (S3's DeleteObjects).
    pub async fn delete_prefix(&self, prefix: &StorePath) -> Result<(), StorageError> {
        let full = self.full(prefix);
        let listed = self.store.list(Some(&full)).map_ok(|m| m.location);
        let locations = futures::stream::once(async { Ok::<_, object_store::Error>(full.clone()) }).chain(listed).boxed();
        let mut deleted = self.store.delete_stream(locations);
        while let Some(r) = deleted.next().await {
            match r {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(StorageError::store(&self.name, "delete under", prefix.as_ref(), e)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    /// The remote path (multipart upload, ranged downloads, prefix, batch deletes) against an
    /// in-memory store with small parts; `tests/storage.rs` runs it against a real S3 server.
    #[tokio::test]
    async fn parts_prefix_and_deletes() {
        let mem = Arc::new(InMemory::new());
        let t = Transfer { part_size: 1000, in_flight: 3, stream_chunk: 700 };
        let store = RemoteStore::new(mem.clone(), StorePath::from("team/hm"), "test store".into()).with_transfer(t);
        let dir = tempfile::tempdir().unwrap();
        let scratch = Scratch::new(dir.path().join("scratch"));
        let data: Vec<u8> = (0..4321u32).map(|i| (i * 7 % 251) as u8).collect();
        let src = dir.path().join("src.bin");
        std::fs::write(&src, &data).unwrap();
        let key = StorePath::from("results/j1/cube.npy");
        store.put_file(&src, &key).await.unwrap();
        assert!(!src.exists(), "the scratch file is removed once stored");
        // Stored under the prefix, listed without it.
        assert_eq!(mem.head(&StorePath::from("team/hm/results/j1/cube.npy")).await.unwrap().size, 4321);
        assert_eq!(store.list(&StorePath::from("results")).await.unwrap(), vec!["results/j1/cube.npy".to_string()]);

        let dl = store.get(&key).await.unwrap();
        assert_eq!(dl.size, 4321);
        let streamed: Vec<u8> = dl.stream.map_ok(|b| b.to_vec()).try_concat().await.unwrap();
        assert_eq!(streamed, data);
        assert_eq!(store.get_range(&key, 995..1010).await.unwrap(), &data[995..1010]);

        let copy = store.local_copy(&key, &scratch).await.unwrap();
        assert_eq!(std::fs::read(copy.path()).unwrap(), data);
        let copy_dir = copy.path().parent().unwrap().to_path_buf();
        drop(copy);
        assert!(!copy_dir.exists(), "the copy goes with its guard");

        let missing = store.local_copy(&StorePath::from("results/none"), &scratch).await.unwrap_err();
        assert!(missing.is_not_found(), "{missing}");
        assert_eq!(std::fs::read_dir(dir.path().join("scratch")).unwrap().count(), 0, "a failed copy leaves nothing");

        for i in 0..5 {
            store.put_bytes(&StorePath::from(format!("results/j2/p{i}")), bytes::Bytes::from_static(b"x")).await.unwrap();
        }
        store.put_bytes(&StorePath::from("results/j22"), bytes::Bytes::from_static(b"y")).await.unwrap();
        store.delete_prefix(&StorePath::from("results/j2")).await.unwrap();
        let left = store.list(&StorePath::from("")).await.unwrap();
        assert_eq!(left, vec!["results/j1/cube.npy".to_string(), "results/j22".to_string()], "only results/j2/ goes");
        store.delete_prefix(&StorePath::from("results/j22")).await.unwrap();
        assert_eq!(store.list(&StorePath::from("")).await.unwrap().len(), 1, "a prefix naming one object deletes it");
    }

    /// An object replaced between two ranged reads fails the download instead of mixing versions.
    #[tokio::test]
    async fn a_replaced_object_fails_a_ranged_download() {
        let mem = Arc::new(InMemory::new());
        let t = Transfer { part_size: 10, in_flight: 1, stream_chunk: 10 };
        let store = RemoteStore::new(mem.clone(), StorePath::from(""), "test store".into()).with_transfer(t);
        let key = StorePath::from("k");
        store.put_bytes(&key, bytes::Bytes::from(vec![1u8; 30])).await.unwrap();
        let mut dl = store.get(&key).await.unwrap();
        assert_eq!(dl.stream.next().await.unwrap().unwrap().len(), 10);
        store.put_bytes(&key, bytes::Bytes::from(vec![2u8; 30])).await.unwrap();
        let mut failed = false;
        while let Some(r) = dl.stream.next().await {
            if r.is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed, "the stream mixed two versions of the object");
    }
}
