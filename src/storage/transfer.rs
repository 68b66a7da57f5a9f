//! Moving whole files to and from a remote object store in parts, a few at a time: a cube is never
//! held whole in memory, and one slow request does not stall the rest.
//!
//! - upload: a multipart upload of the file, read part by part; at most `in_flight` parts are in
//!   memory, each sent by its own task (a failure aborts the upload, so no orphan parts stay billed);
//! - download to a file: concurrent ranged GETs, each written at its offset;
//! - download as a stream (to an HTTP client): ranged GETs one after another (one ahead), so that a
//!   slow client never holds an S3 request open past the client's request timeout.
//!
//! Every ranged GET of one object carries the ETag seen first (`If-Match`): an object replaced
//! meanwhile fails the transfer instead of mixing two versions.

use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use object_store::path::Path as StorePath;
use object_store::{GetOptions, GetRange, ObjectStore, PutPayload};

use super::StorageError;

/// The part size for uploads and ranged downloads: above S3's 5 MiB minimum, and small enough that a
/// few in flight stay a small fraction of memory.
pub const PART_SIZE: u64 = 16 << 20;
/// Parts in flight at a time, per transfer.
pub const PARTS_IN_FLIGHT: usize = 4;
/// S3 allows at most 10,000 parts per upload; larger files get larger parts.
const MAX_PARTS: u64 = 10_000;
/// The chunk of a streamed download: each is one GET, fetched while the previous one is sent.
const STREAM_CHUNK: u64 = 8 << 20;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Transfer {
    pub part_size: u64,
    pub in_flight: usize,
    pub stream_chunk: u64,
}

impl Default for Transfer {
    fn default() -> Transfer {
        Transfer { part_size: PART_SIZE, in_flight: PARTS_IN_FLIGHT, stream_chunk: STREAM_CHUNK }
    }
}

/// One object of a store, with what the error messages name.
#[derive(Clone)]
pub(crate) struct Object {
    pub store: Arc<dyn ObjectStore>,
    pub location: StorePath,
    /// The key as the caller gave it (without the store's prefix).
    pub key: String,
    /// The store's description, for messages.
    pub store_name: Arc<str>,
}

impl Object {
    fn err(&self, op: &'static str) -> impl FnOnce(object_store::Error) -> StorageError + '_ {
        move |e| StorageError::store(&self.store_name, op, &self.key, e)
    }

    /// The size and ETag of the object now.
    pub async fn head(&self) -> Result<(u64, Option<String>), StorageError> {
        let meta = self.store.head(&self.location).await.map_err(self.err("look up"))?;
        Ok((meta.size, meta.e_tag))
    }

    /// `range` of the object (fewer bytes if it ends first), as it was when `etag` was seen.
    pub async fn get_range(&self, range: Range<u64>, etag: Option<String>) -> Result<Bytes, StorageError> {
        let opts = GetOptions { range: Some(GetRange::Bounded(range)), if_match: etag, ..Default::default() };
        let r = self.store.get_opts(&self.location, opts).await.map_err(self.err("read a range of"))?;
        r.bytes().await.map_err(self.err("read a range of"))
    }

    /// Exactly `range`, or an error saying the object is shorter.
    async fn get_exact(&self, range: Range<u64>, etag: Option<String>) -> Result<Bytes, StorageError> {
        let want = range.end - range.start;
        let start = range.start;
        let bytes = self.get_range(range, etag).await?;
        if bytes.len() as u64 != want {
            return Err(StorageError::Store {
                store: self.store_name.to_string(),
                op: "read a range of",
                key: self.key.clone(),
                source: Box::new(object_store::Error::Generic {
                    store: "hypermnf",
                    source: format!("asked for {want} bytes at {start}, got {}", bytes.len()).into(),
                }),
            });
        }
        Ok(bytes)
    }
}

/// Byte ranges of `part` bytes covering `0..size`.
fn ranges(size: u64, part: u64) -> impl Iterator<Item = Range<u64>> {
    (0..size.div_ceil(part)).map(move |i| i * part..((i + 1) * part).min(size))
}

/// The part size for a file of `size` bytes: the configured one, or larger to stay within S3's part
/// count (rounded up to a MiB).
fn part_size_for(size: u64, configured: u64) -> u64 {
    let needed = size.div_ceil(MAX_PARTS).div_ceil(1 << 20) << 20;
    configured.max(needed)
}

/// Stores the file at `local` as `obj`: one PUT for a file of at most one part, a multipart upload
/// otherwise. The file is left in place (the caller removes it once stored).
pub(crate) async fn upload_file(obj: &Object, local: &Path, t: Transfer) -> Result<(), StorageError> {
    let file = tokio::fs::File::open(local).await.map_err(|e| StorageError::io("open", local, e))?;
    let file = Arc::new(file.into_std().await);
    let size = file.metadata().map_err(|e| StorageError::io("read the size of", local, e))?.len();
    if size <= t.part_size {
        let bytes = read_at(&file, local, 0..size).await?;
        obj.store.put(&obj.location, PutPayload::from(bytes)).await.map_err(obj.err("write"))?;
        return Ok(());
    }
    let mut upload = obj.store.put_multipart(&obj.location).await.map_err(obj.err("start a multipart upload of"))?;
    let sent = send_parts(obj, upload.as_mut(), &file, local, size, t).await;
    match sent {
        Ok(()) => {
            upload.complete().await.map_err(obj.err("complete the multipart upload of"))?;
            Ok(())
        }
        Err(e) => {
            if let Err(abort) = upload.abort().await {
                tracing::warn!(key = %obj.key, "cannot abort a failed multipart upload: {abort}");
            }
            Err(e)
        }
    }
}

async fn send_parts(
    obj: &Object,
    upload: &mut dyn object_store::MultipartUpload,
    file: &Arc<std::fs::File>,
    path: &Path,
    size: u64,
    t: Transfer,
) -> Result<(), StorageError> {
    // Each part is a task of its own, so that parts travel while the next one is read from disk;
    // dropping the set (on an error) cancels those still running.
    let mut parts = tokio::task::JoinSet::new();
    for range in ranges(size, part_size_for(size, t.part_size)) {
        while parts.len() >= t.in_flight.max(1) {
            joined(obj, parts.join_next().await)?;
        }
        let bytes = read_at(file, path, range).await?;
        parts.spawn(upload.put_part(PutPayload::from(bytes)));
    }
    while !parts.is_empty() {
        joined(obj, parts.join_next().await)?;
    }
    Ok(())
}

fn joined(obj: &Object, r: Option<Result<object_store::Result<()>, tokio::task::JoinError>>) -> Result<(), StorageError> {
    match r {
        None => Ok(()),
        Some(Ok(sent)) => sent.map_err(obj.err("upload a part of")),
        Some(Err(e)) => Err(obj.err("upload a part of")(object_store::Error::JoinError { source: e })),
    }
}

/// Reads `range` of the file on the blocking pool.
async fn read_at(file: &Arc<std::fs::File>, path: &Path, range: Range<u64>) -> Result<Bytes, StorageError> {
    let (file, p) = (file.clone(), path.to_path_buf());
    let read = tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; (range.end - range.start) as usize];
        file.read_exact_at(&mut buf, range.start).map(|_| Bytes::from(buf))
    });
    match read.await {
        Ok(r) => r.map_err(|e| StorageError::io("read", &p, e)),
        Err(e) => Err(StorageError::io("read", &p, std::io::Error::other(e))),
    }
}

/// Writes `obj` into a new file at `dest`, by concurrent ranged GETs. Returns its size.
pub(crate) async fn download_file(obj: &Object, dest: &Path, t: Transfer) -> Result<u64, StorageError> {
    let (size, etag) = obj.head().await?;
    let file = tokio::fs::File::create(dest).await.map_err(|e| StorageError::io("create", dest, e))?;
    file.set_len(size).await.map_err(|e| StorageError::io("allocate", dest, e))?;
    let file = Arc::new(file.into_std().await);
    futures::stream::iter(ranges(size, t.part_size))
        .map(|range| {
            let (file, etag, dest) = (file.clone(), etag.clone(), dest.to_path_buf());
            async move {
                let at = range.start;
                let bytes = obj.get_exact(range, etag).await?;
                write_at(file, dest, at, bytes).await
            }
        })
        .buffer_unordered(t.in_flight.max(1))
        .try_collect::<()>()
        .await?;
    Ok(size)
}

async fn write_at(file: Arc<std::fs::File>, path: PathBuf, at: u64, bytes: Bytes) -> Result<(), StorageError> {
    let p = path.clone();
    match tokio::task::spawn_blocking(move || file.write_all_at(&bytes, at)).await {
        Ok(r) => r.map_err(|e| StorageError::io("write", &path, e)),
        Err(e) => Err(StorageError::io("write", &p, std::io::Error::other(e))),
    }
}

/// The object's bytes as a stream of ranged GETs, `size` bytes in all.
pub(crate) fn chunk_stream(obj: Object, size: u64, etag: Option<String>, t: Transfer) -> BoxStream<'static, Result<Bytes, StorageError>> {
    futures::stream::iter(ranges(size, t.stream_chunk))
        .map(move |range| {
            let (obj, etag) = (obj.clone(), etag.clone());
            async move { obj.get_exact(range, etag).await }
        })
        .buffered(2)
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_the_object() {
        assert_eq!(ranges(0, 10).count(), 0);
        assert_eq!(ranges(10, 10).collect::<Vec<_>>(), vec![0..10]);
        assert_eq!(ranges(25, 10).collect::<Vec<_>>(), vec![0..10, 10..20, 20..25]);
    }

    #[test]
    fn parts_grow_to_stay_within_the_part_count() {
        assert_eq!(part_size_for(1 << 30, PART_SIZE), PART_SIZE);
        let big = 500u64 << 30; // 500 GiB: 16 MiB parts would be 32,000 of them
        let p = part_size_for(big, PART_SIZE);
        assert!(big.div_ceil(p) <= MAX_PARTS && p % (1 << 20) == 0, "{p}");
    }
}
