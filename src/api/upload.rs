//! Receiving uploads: bodies are streamed to a scratch file (never held whole in memory) by a blocking
//! writer that hashes them with SHA-256 on the way, within a byte budget (413 past it). Before the bulk
//! of a `.npy` body or an ENVI data part is read, the size its header claims is checked against the
//! budget, so that a header claiming 10¹² pixels is refused at once.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use sha2::{Digest, Sha256};

use super::error::Error;
use crate::cube::sample_type::checked_cube_bytes;
use crate::cube::{ByteOrder, DataType};
pub use crate::jobs::upload_to_device::Progress;

/// Bytes the writer thread receives at once: big enough that hashing and writing run in long strides.
const WRITE_CHUNK: usize = 4 << 20;
/// Bytes written between two starts of writeback to the disk (see `write_durably`). What is not on the
/// disk when the last byte arrives is what the 202 waits for, when the client sends faster than the disk
/// writes: at most the range being written back, the one after it, and the writer's queue. 16 MiB ranges
/// and a queue of four batches left 25-31 ms of it for 299 MB on the H100 host (1.3-1.5 GB/s disk).
const WRITEBACK_EVERY: u64 = 8 << 20;
/// Batches queued for the writer thread (see `WRITEBACK_EVERY`).
const WRITER_QUEUE: usize = 2;
/// The last bytes of a body whose length is known go to the file without waiting for the disk: a job
/// started early (`jobs::early_start`) starts computing once the last byte is in the file, and the disk
/// catches up beneath it. Waiting for each written-back range until the end left the last byte
/// 8.6–11.8 ms behind the client's on the H100 host (BENCHMARKS.md, Service): the socket buffers and the writer's
/// queue drained at the disk's pace. The cost is a longer final sync (the disk is ~0.4 ms per MiB
/// further behind when the last byte arrives: its 1.3 GB/s against ~2.5 GB/s for a body not held
/// back), which must stay shorter than the job's ~24 ms, or the row (inserted after the sync) would
/// hold the job up instead.
const RUN_AHEAD_AT_END: u64 = 16 << 20;
/// Batches queued for each hashing thread: they keep up with the writer, so this only absorbs jitter.
const HASHER_QUEUE: usize = 4;
/// Largest JSON body (href requests) and multipart side parts (an ENVI header, the params).
pub const SMALL_BODY_MAX: usize = 1 << 20;
/// How much of a `.npy` body is looked at for its header (the format keeps headers small; 64 KiB is
/// the v1 maximum, v2 allows more but nothing real uses it).
const NPY_HEADER_MAX: usize = 1 << 20;

/// The request's byte budget: `--max-upload-bytes` over the whole body.
pub struct Budget {
    pub limit: u64,
    pub used: u64,
}

impl Budget {
    pub fn new(limit: u64) -> Budget {
        Budget { limit, used: 0 }
    }
    pub fn take(&mut self, n: usize) -> Result<(), Error> {
        self.used += n as u64;
        if self.used > self.limit {
            return Err(Error::too_large(format!(
                "the upload exceeds the limit of {} bytes; {}",
                self.limit,
                crate::config::UPLOAD_LIMIT_HINT
            )));
        }
        Ok(())
    }
}

/// What a header says the payload holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// Bytes before the samples (the .npy header, or the ENVI `header offset`).
    pub offset: u64,
    /// Bytes of samples.
    pub data: u64,
    /// For a C-order `.npy` whose samples are little-endian (or single bytes): the shape and type, so
    /// that the cube's content digest can be computed while the body streams in (the bytes after the
    /// header are then exactly the cube's BIP samples as `Cube::content_digest` hashes them).
    pub bip_le: Option<(u64, u64, u64, DataType)>,
}

impl Claim {
    pub fn total(&self) -> u64 {
        self.offset + self.data
    }
}

/// Checks a claim against the limit and the cube-size sanity checks.
pub fn check_claim(lines: u64, samples: u64, bands: u64, dtype: DataType, offset: u64, limit: u64) -> Result<Claim, Error> {
    let data = checked_cube_bytes(lines, samples, bands, dtype)?;
    let claim = Claim { offset, data, bip_le: None };
    if claim.total() > limit {
        return Err(Error::too_large(format!(
            "the header claims {lines} x {samples} x {bands} {} ({} bytes), more than the limit of {limit} bytes; {}",
            dtype.name(),
            claim.total(),
            crate::config::UPLOAD_LIMIT_HINT
        )));
    }
    Ok(claim)
}

/// A file received into scratch.
#[derive(Debug)]
pub struct Received {
    pub path: PathBuf,
    pub bytes: u64,
    /// SHA-256 of the bytes as received, when asked for (to check a client's `X-Content-SHA256`).
    pub sha256: Option<[u8; 32]>,
    /// `Cube::content_digest` of the cube, when the claim allowed computing it on the way.
    pub content_digest: Option<[u8; 32]>,
}

/// A batch of received frames, passed on without copying them into one buffer.
type Batch = Vec<Bytes>;
type Sink<T> = (tokio::sync::mpsc::Sender<Batch>, tokio::task::JoinHandle<std::io::Result<T>>);

/// A blocking thread fed batches through a short channel (so a slow disk or hash slows the upload
/// instead of filling memory).
fn sink<T: Send + 'static>(
    queue: usize,
    work: impl FnOnce(tokio::sync::mpsc::Receiver<Batch>) -> std::io::Result<T> + Send + 'static,
) -> Sink<T> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Batch>(queue);
    (tx, tokio::task::spawn_blocking(move || work(rx)))
}

/// The SHA-256 of every batch, in order.
fn sha256_of_batches(mut rx: tokio::sync::mpsc::Receiver<Batch>) -> std::io::Result<[u8; 32]> {
    let mut h = Sha256::new();
    while let Some(batch) = rx.blocking_recv() {
        for b in &batch {
            h.update(b);
        }
    }
    Ok(h.finalize().into())
}

/// Writes every batch to `f`, then `sync_data`: the job must survive a crash once it is accepted, so
/// the data reaches the disk before the 202. Writeback is started every WRITEBACK_EVERY bytes while the
/// body streams in (and the range before waited for), so that the final sync only has the last few
/// MiB left to write instead of the whole upload (0.1 s of a 0.4 s upload of 300 MB before).
///
/// `expected` is the length the header claims, once known (before the first batch): it is reserved on
/// the disk at once. Once `ended` is set (the body is complete), or within `RUN_AHEAD_AT_END` bytes of
/// the expected length, batches are written without waiting for the disk, and `written` is told
/// before the final sync: the bytes are then in the file for readers (a job started early, see
/// `jobs::early_start`) while the disk catches up.
///
/// With `progress`, every batch written is reported, and the file is given the claimed length before
/// the first byte is written when a reader asked to map it while it fills.
fn write_durably(
    mut f: std::fs::File,
    expected: Arc<OnceLock<u64>>,
    ended: Arc<AtomicBool>,
    written_tx: tokio::sync::oneshot::Sender<()>,
    progress: Option<Arc<Progress>>,
    mut rx: tokio::sync::mpsc::Receiver<Batch>,
) -> std::io::Result<()> {
    let _end = progress.clone().map(Progress::end_on_drop);
    let (mut written, mut started, mut previous) = (0u64, 0u64, None);
    while let Some(batch) = rx.blocking_recv() {
        if written == 0 {
            if let Some(&len) = expected.get() {
                // The length the header claims, already checked against the limit; a full disk shows
                // before the body is read, not after.
                crate::write_to_disk::reserve(&f, len)?;
                if progress.as_ref().is_some_and(|p| p.maps_while_written()) {
                    f.set_len(len)?;
                }
            }
        }
        for b in &batch {
            f.write_all(b)?;
            written += b.len() as u64;
        }
        if let Some(p) = &progress {
            p.advance(written);
        }
        if written - started >= WRITEBACK_EVERY {
            let near_end = expected.get().is_some_and(|&len| len.saturating_sub(written) <= RUN_AHEAD_AT_END);
            let wait = if ended.load(Ordering::Acquire) || near_end { None } else { previous };
            crate::write_to_disk::start_writeback(&f, (started, written - started), wait);
            previous = Some((started, written - started));
            started = written;
        }
    }
    let _ = written_tx.send(());
    let t = std::time::Instant::now();
    f.sync_data()?;
    tracing::debug!(bytes = written, final_sync_secs = t.elapsed().as_secs_f64(), "upload written and synced");
    Ok(())
}

/// Looks at the first bytes of a body: refuses it, or says what its header claims.
pub type PrefixCheck<'a> = dyn FnMut(&[u8]) -> Result<Option<Claim>, Error> + Send + 'a;

/// Streams `stream` into `dest`. `prefix_check` is called once with the first bytes (at least enough
/// for a `.npy` header, or all of a short body) and may refuse the upload or return a claim; when it
/// returns one, a body longer than the claim is refused early as a size mismatch. Writing and
/// digesting the bytes run side by side: a thread writes them, another cuts the cube's content
/// stream into the leaves of its tree digest (`cube::digest`), which are hashed on every core; a third
/// computes the body's plain SHA-256 when `body_sha256` asks for it (one core: it bounds the ingest).
pub async fn receive<S, E>(
    stream: S,
    dest: PathBuf,
    budget: &mut Budget,
    prefix_check: Option<&mut PrefixCheck<'_>>,
    claim: Option<Claim>,
    body_sha256: bool,
) -> Result<Received, Error>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let (received, sync) = receive_unsynced(stream, dest, budget, prefix_check, claim, Alongside { body_sha256, ..Default::default() }).await?;
    sync.wait().await?;
    Ok(received)
}

/// The final `sync_data` of a received file, still running: the upload is durable once it is done.
#[must_use = "an upload is durable only once its sync is waited for"]
pub struct Unsynced(tokio::task::JoinHandle<std::io::Result<()>>);

impl Unsynced {
    /// Waits until the file is on the disk.
    pub async fn wait(self) -> Result<(), Error> {
        let t = std::time::Instant::now();
        let r = finished(self.0).await;
        tracing::debug!(waited_secs = t.elapsed().as_secs_f64(), "upload synced");
        r
    }
}

/// What is done with a body besides writing it to its file.
#[derive(Default)]
pub struct Alongside {
    /// Its plain SHA-256 (to check a client's `X-Content-SHA256`).
    pub body_sha256: bool,
    /// Told of every batch written, for readers of the file while it fills.
    pub progress: Option<Arc<Progress>>,
    /// The content digest of the cube whose stored samples follow the claim's offset, computed from
    /// the received bytes (a BIP or BIL ENVI data part; a `.npy` claim brings its own).
    pub content: Option<crate::cube::digest::Arriving>,
}

/// [`receive`], answering once every byte is in the file and digested, before the final sync: the
/// caller may start reading the file while the disk catches up, and waits for [`Unsynced`] before it
/// calls the upload accepted.
pub async fn receive_unsynced<S, E>(
    mut stream: S,
    dest: PathBuf,
    budget: &mut Budget,
    mut prefix_check: Option<&mut PrefixCheck<'_>>,
    mut claim: Option<Claim>,
    alongside: Alongside,
) -> Result<(Received, Unsynced), Error>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let file = std::fs::File::create(&dest).map_err(Error::disk)?;
    let t0 = std::time::Instant::now();
    let expected = Arc::new(OnceLock::new());
    if let Some(c) = claim {
        let _ = expected.set(c.total());
    }
    let ended = Arc::new(AtomicBool::new(false));
    let (written_tx, written_rx) = tokio::sync::oneshot::channel();
    let writer = sink(WRITER_QUEUE, {
        let (expected, ended) = (expected.clone(), ended.clone());
        let progress = alongside.progress;
        move |rx| write_durably(file, expected, ended, written_tx, progress, rx)
    });
    let hasher = alongside.body_sha256.then(|| sink(HASHER_QUEUE, sha256_of_batches));
    let mut content: Option<Sink<[u8; 32]>> = alongside.content.map(|mut arriving| {
        sink(HASHER_QUEUE, move |mut rx| {
            while let Some(batch) = rx.blocking_recv() {
                for b in batch {
                    arriving.update(b);
                }
            }
            Ok(arriving.finish())
        })
    });
    // The first bytes are gathered into one buffer for the header check; after that, frames are
    // batched as they came (no copy) and handed on every WRITE_CHUNK bytes.
    let mut head = BytesMut::new();
    let mut batch: Batch = Vec::new();
    let mut batch_len = 0usize;
    let mut total: u64 = 0;
    let mut sent: u64 = 0;
    let mut prefix_done = prefix_check.is_none();
    let outcome: Result<(), Error> = async {
        loop {
            let chunk = match stream.next().await {
                Some(Ok(c)) => Some(c),
                Some(Err(e)) => return Err(Error::bad_request("incomplete_body", format!("the upload was interrupted: {e}"))),
                None => None,
            };
            if let Some(c) = chunk.as_ref() {
                budget.take(c.len())?;
                total += c.len() as u64;
            }
            if let Some(c) = chunk.as_ref().filter(|_| prefix_done) {
                batch_len += c.len();
                batch.push(c.clone());
            } else if let Some(c) = &chunk {
                head.extend_from_slice(c);
            }
            let finished = chunk.is_none();
            if !prefix_done && (head.len() >= NPY_HEADER_MAX || finished || npy_header_complete(&head)) {
                prefix_done = true;
                if let Some(check) = prefix_check.as_deref_mut() {
                    if let Some(c) = check(&head)? {
                        claim = Some(c);
                        let _ = expected.set(c.total());
                        if content.is_none() {
                            content = content_digest_for(&c);
                        }
                    }
                }
                if !head.is_empty() {
                    batch_len += head.len();
                    batch.push(head.split().freeze());
                }
            }
            if let Some(c) = claim {
                if total > c.total() {
                    return Err(Error::bad_request(
                        "size_mismatch",
                        format!("the data is longer than its header claims ({} bytes)", c.total()),
                    ));
                }
            }
            if prefix_done && (batch_len >= WRITE_CHUNK || (finished && batch_len > 0)) {
                let out = std::mem::take(&mut batch);
                let out_len = std::mem::replace(&mut batch_len, 0) as u64;
                if let (Some((tx, _)), Some(c)) = (&content, claim) {
                    // Only the samples: leave out what the batch holds of the header.
                    let mut at = sent;
                    let mut samples = Vec::with_capacity(out.len());
                    for b in &out {
                        let skip = c.offset.saturating_sub(at).min(b.len() as u64) as usize;
                        if skip < b.len() {
                            samples.push(b.slice(skip..));
                        }
                        at += b.len() as u64;
                    }
                    if tx.send(samples).await.is_err() {
                        return Ok(()); // the thread failed; its error is reported below
                    }
                }
                if let Some((tx, _)) = &hasher {
                    if tx.send(out.clone()).await.is_err() {
                        return Ok(());
                    }
                }
                if writer.0.send(out).await.is_err() {
                    return Ok(());
                }
                sent += out_len;
            }
            if finished {
                return Ok(());
            }
        }
    }
    .await;
    // Every thread is joined (its channel closed first) before answering, even on a refusal: the
    // scratch file is not removed under a writer still holding it. A complete body's writer is
    // waited for only until its bytes are in the file; its final sync is left to `Unsynced`.
    ended.store(true, Ordering::Release);
    let (tx, task) = writer;
    drop(tx);
    // Not told: the body was refused, or the writer stopped on an error (which joining it gives).
    let complete = outcome.is_ok() && written_rx.await.is_ok();
    let (written, sync) = if complete { (Ok(()), Some(task)) } else { (finished(task).await, None) };
    let sha256 = match hasher {
        Some(h) => Some(join(h).await),
        None => None,
    };
    let content_digest = match content {
        Some(c) => Some(join(c).await),
        None => None,
    };
    let checked = (|| {
        outcome?;
        written?;
        let sha256 = sha256.transpose()?;
        let content_digest = content_digest.transpose()?;
        if let Some(c) = claim {
            if total != c.total() {
                return Err(Error::bad_request(
                    "size_mismatch",
                    format!("the data holds {total} bytes but its header claims {}", c.total()),
                ));
            }
        }
        Ok((sha256, content_digest))
    })();
    let (sha256, content_digest) = match checked {
        Ok(v) => v,
        Err(e) => {
            if let Some(task) = sync {
                let _ = task.await; // not removed under the writer's sync
            }
            return Err(e);
        }
    };
    let sync = sync.ok_or_else(|| Error::internal(anyhow::anyhow!("the upload's writer ended without an error or its sync")))?;
    tracing::debug!(bytes = total, secs = t0.elapsed().as_secs_f64(), "upload received and hashed (its sync goes on)");
    Ok((Received { path: dest, bytes: total, sha256, content_digest }, Unsynced(sync)))
}

/// Closes a thread's channel and waits for its result.
async fn join<T>((tx, task): Sink<T>) -> Result<T, Error> {
    drop(tx);
    finished(task).await
}

/// A thread's result, once it has ended.
async fn finished<T>(task: tokio::task::JoinHandle<std::io::Result<T>>) -> Result<T, Error> {
    task.await.map_err(Error::internal)?.map_err(Error::disk)
}

/// For a little-endian C-order `.npy` claim: a thread that digests the cube's content stream (the
/// canonical header, then the samples it is sent), the same bytes in the same order as
/// `Cube::content_digest` hashes for a cube without bbl or data ignore value (a `.npy` has neither).
fn content_digest_for(claim: &Claim) -> Option<Sink<[u8; 32]>> {
    let (l, s, b, dt) = claim.bip_le?;
    let canonical = crate::cube::npy::canonical_header(dt, l as usize, s as usize, b as usize);
    Some(sink(HASHER_QUEUE, move |mut rx| {
        let mut tree = crate::cube::digest::Streaming::new();
        tree.update(Bytes::from(canonical));
        while let Some(batch) = rx.blocking_recv() {
            for b in batch {
                tree.update(b);
            }
        }
        Ok(tree.finish())
    }))
}

/// True once `buf` holds a whole `.npy` header (or clearly is not one).
fn npy_header_complete(buf: &[u8]) -> bool {
    if buf.len() < 10 {
        return false;
    }
    if &buf[..6] != b"\x93NUMPY" {
        return true;
    }
    let (start, len) = match buf[6] {
        1 => (10usize, u16::from_le_bytes([buf[8], buf[9]]) as usize),
        2 | 3 if buf.len() >= 12 => (12, u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize),
        2 | 3 => return false,
        _ => return true,
    };
    buf.len() >= start.saturating_add(len)
}

/// The size a `.npy` header claims, read with the cube reader's own header parser and checked against
/// `limit` (and the 3-D shape the service needs).
pub fn npy_claim(buf: &[u8], limit: u64) -> Result<Option<Claim>, Error> {
    let h = crate::cube::npy::read_header(&mut std::io::Cursor::new(buf))?;
    let [lines, samples, bands] = h.cube_shape()?;
    let mut claim = check_claim(lines, samples, bands, h.dtype, h.data_offset, limit)?;
    if !h.fortran_order && (h.byte_order == ByteOrder::Little || h.dtype.size() == 1) {
        claim.bip_le = Some((lines, samples, bands, h.dtype));
    }
    Ok(Some(claim))
}

/// The size an ENVI header claims, read with the cube reader's own header parser and checked against
/// `limit`. An invalid header is refused here, before its data part is read.
pub fn envi_claim(text: &str, limit: u64) -> Result<Option<Claim>, Error> {
    let h = crate::cube::envi::parse_header(text)?;
    check_claim(h.lines as u64, h.samples as u64, h.bands as u64, h.data_type, h.header_offset, limit).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy_prefix(descr: &str, shape: &str) -> Vec<u8> {
        let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        let mut v = b"\x93NUMPY\x01\x00".to_vec();
        v.extend_from_slice(&(h.len() as u16).to_le_bytes());
        v.extend_from_slice(h.as_bytes());
        v
    }

    /// A reader of an upload being written waits for the bytes it needs, and is let go (None) when the
    /// writer ends short of them; the file has its full length from the first batch when asked.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn progress_follows_the_writer_and_lets_readers_go_when_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let progress = Arc::new(Progress::default());
        progress.map_while_written();
        let mut check = |_: &[u8]| -> Result<Option<Claim>, Error> { Ok(Some(Claim { offset: 0, data: 3 * WRITE_CHUNK as u64, bip_le: None })) };
        let chunk = Bytes::from(vec![7u8; WRITE_CHUNK]);
        // The body ends a chunk short of its claim.
        let stream = futures::stream::iter(vec![Ok::<Bytes, std::io::Error>(chunk.clone()), Ok(chunk)]);
        let path = dir.path().join("x");
        let reader = {
            let (progress, path) = (progress.clone(), path.clone());
            tokio::task::spawn_blocking(move || {
                let first = progress.wait_for(1).unwrap();
                // the whole claimed length is there before the rest is written
                let len = std::fs::metadata(&path).unwrap().len();
                (first, len, progress.wait_for(2 * WRITE_CHUNK as u64), progress.wait_for(3 * WRITE_CHUNK as u64))
            })
        };
        let mut budget = Budget::new(u64::MAX);
        let alongside = Alongside { progress: Some(progress.clone()), ..Default::default() };
        let got = receive_unsynced(stream, path, &mut budget, Some(&mut check), None, alongside).await;
        assert_eq!(got.err().map(|e| e.code().to_string()).as_deref(), Some("size_mismatch"));
        let (first, len, two, three) = reader.await.unwrap();
        assert!(first >= 1);
        assert_eq!(len, 3 * WRITE_CHUNK as u64);
        assert_eq!(two, Some(2 * WRITE_CHUNK as u64));
        assert_eq!(three, None, "the writer ended short: the reader is let go");
    }

    #[test]
    fn npy_claims() {
        let p = npy_prefix("<i2", "(3, 4, 5)");
        assert_eq!(npy_claim(&p, 1 << 20).unwrap(), Some(Claim { offset: p.len() as u64, data: 120, bip_le: Some((3, 4, 5, DataType::I16)) }));
        let e = npy_claim(&npy_prefix("<f4", "(100000, 100000, 400)"), 1 << 30).unwrap_err();
        assert_eq!(e.code(), "too_large");
        let e = npy_claim(&npy_prefix("<f8", "(18446744073709551615, 2, 2)"), u64::MAX).unwrap_err();
        assert_eq!(e.code(), "too_large");
        assert_eq!(npy_claim(&npy_prefix("<f4", "(3, 4)"), 1 << 20).unwrap_err().code(), "invalid_npy");
        assert_eq!(npy_claim(b"PK\x03\x04 not a numpy file", 1 << 20).unwrap_err().code(), "invalid_npy");
        assert_eq!(npy_claim(&p[..p.len() - 5], 1 << 20).unwrap_err().code(), "invalid_npy");
        assert!(npy_header_complete(&p));
        assert!(!npy_header_complete(&p[..p.len() - 1]));
    }

    /// The digest computed while streaming equals `Cube::content_digest` of the decoded file, however
    /// the body is cut into chunks (here: 7 bytes, so the header and samples straddle chunks): for a
    /// canonical `.npy` (where it is the tree digest of the body) and for one whose header is written
    /// another way (keys in another order, more padding, format 2.0), where the canonical header takes
    /// the place of the body's.
    #[tokio::test]
    async fn streamed_content_digest_matches_the_decoded_cube() {
        let dir = tempfile::tempdir().unwrap();
        let values: Vec<i16> = (0..5 * 4 * 3).map(|i| (i * 37 % 101 - 50) as i16).collect();
        let cubes = [
            crate::cube::Cube::from_i16(5, 4, 3, &values).unwrap(),
            crate::cube::Cube::from_f32(5, 4, 3, &values.iter().map(|&v| v as f32 * 0.5).collect::<Vec<_>>()).unwrap(),
        ];
        for (n, cube) in cubes.iter().enumerate() {
            let p = dir.path().join(format!("c{n}.npy"));
            crate::cube::npy::write_cube(&p, cube).unwrap();
            let canonical = std::fs::read(&p).unwrap();
            let offset = canonical.len() - cube.raw().len();
            let descr = if n == 0 { "<i2" } else { "<f4" };
            let dict = format!("{{'shape': (5, 4, 3), 'descr': '{descr}', 'fortran_order': False}}");
            let mut other_v1 = b"\x93NUMPY\x01\x00".to_vec();
            other_v1.extend_from_slice(&(128u16 - 10).to_le_bytes());
            other_v1.extend_from_slice(dict.as_bytes());
            other_v1.resize(127, b' ');
            other_v1.push(b'\n');
            other_v1.extend_from_slice(cube.raw());
            let mut other_v2 = b"\x93NUMPY\x02\x00".to_vec();
            other_v2.extend_from_slice(&(offset as u32 - 12).to_le_bytes());
            other_v2.extend_from_slice(&canonical[10..offset]);
            other_v2.truncate(offset - 1);
            other_v2.push(b'\n');
            other_v2.extend_from_slice(cube.raw());
            for (form, bytes) in [("canonical", canonical), ("keys reordered", other_v1), ("format 2.0", other_v2)] {
                let path = dir.path().join(format!("{form}-{n}.npy"));
                std::fs::write(&path, &bytes).unwrap();
                let decoded = crate::cube::npy::read(&path).unwrap();
                assert_eq!(decoded.raw(), cube.raw(), "{form}");
                let chunks: Vec<Result<Bytes, std::io::Error>> = bytes.chunks(7).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
                let mut budget = Budget::new(1 << 20);
                let mut check = |prefix: &[u8]| npy_claim(prefix, 1 << 20);
                let got = receive(futures::stream::iter(chunks), dir.path().join(format!("r-{form}-{n}")), &mut budget, Some(&mut check), None, true)
                    .await
                    .unwrap();
                assert_eq!(got.bytes, bytes.len() as u64, "{form}");
                assert_eq!(std::fs::read(&got.path).unwrap(), bytes, "{form}");
                assert_eq!(got.sha256, Some(<[u8; 32]>::from(Sha256::digest(&bytes))), "{form}");
                assert_eq!(got.content_digest, Some(decoded.content_digest()), "{form}");
                // Only the canonical form's body is the cube's canonical serialisation.
                let body_tree = crate::cube::digest::of_parts(&[&bytes]);
                assert_eq!(got.content_digest == Some(body_tree), form == "canonical", "{form}");
            }
        }
    }

    /// A canonical `.npy` of several leaves, sent in pieces that do not meet the leaves' bounds, and
    /// the same samples after another header: the streamed digest is the decoded cube's, and the
    /// body's SHA-256 is only computed when asked for.
    #[tokio::test]
    async fn streamed_content_digest_of_a_cube_of_several_leaves() {
        let dir = tempfile::tempdir().unwrap();
        let (l, s, b) = (97, 128, 301); // 7.5 MB of int16: two leaves
        let values: Vec<i16> = (0..l * s * b).map(|i| (i as i64 * 7919 % 65521 - 32000) as i16).collect();
        let cube = crate::cube::Cube::from_i16(l, s, b, &values).unwrap();
        let p = dir.path().join("c.npy");
        crate::cube::npy::write_cube(&p, &cube).unwrap();
        let canonical = std::fs::read(&p).unwrap();
        let offset = canonical.len() - cube.raw().len();
        let mut other = canonical.clone();
        // "..., 301), }" written as "..., 301)}  ": the same claim, another header.
        let at = canonical[..offset].windows(4).position(|w| w == b"), }").unwrap();
        other[at..at + 4].copy_from_slice(b")}  ");
        assert_ne!(other, canonical);
        for (form, bytes, body_sha) in [("canonical", &canonical, false), ("other header", &other, true)] {
            let chunks: Vec<Result<Bytes, std::io::Error>> =
                bytes.chunks((1 << 20) + 3).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
            let mut budget = Budget::new(1 << 30);
            let mut check = |prefix: &[u8]| npy_claim(prefix, 1 << 30);
            let got = receive(futures::stream::iter(chunks), dir.path().join(format!("r-{form}")), &mut budget, Some(&mut check), None, body_sha)
                .await
                .unwrap();
            assert_eq!(got.content_digest, Some(cube.content_digest()), "{form}");
            assert_eq!(got.sha256, body_sha.then(|| <[u8; 32]>::from(Sha256::digest(bytes))), "{form}");
        }
    }

    /// The content digest is the tree digest (`cube::digest`) of the cube's canonical `.npy` (what
    /// `write_cube` writes for a little-endian cube), whatever byte order the cube is held in, over
    /// one leaf or several; metadata that changes results changes it.
    #[test]
    fn content_digest_is_the_tree_digest_of_the_canonical_npy() {
        let dir = tempfile::tempdir().unwrap();
        for (l, s, b) in [(6, 5, 4), (61, 97, 389)] {
            let values: Vec<i16> = (0..l * s * b).map(|i| (i as i64 * 53 % 211 - 100) as i16).collect();
            let le = crate::cube::Cube::from_i16(l, s, b, &values).unwrap();
            let p = dir.path().join("le.npy");
            crate::cube::npy::write_cube(&p, &le).unwrap();
            let file_digest = crate::cube::digest::of_parts(&[&std::fs::read(&p).unwrap()]);
            assert_eq!(le.content_digest(), file_digest);
            let be_raw: Vec<u8> = values.iter().flat_map(|v| v.to_be_bytes()).collect();
            let be = crate::cube::Cube::from_raw(l, s, b, DataType::I16, ByteOrder::Big, be_raw, Default::default()).unwrap();
            assert_eq!(be.content_digest(), file_digest, "{l}x{s}x{b} big-endian");
            let f64s: Vec<f64> = values.iter().map(|&v| v as f64 / 3.0).collect();
            let le64 = crate::cube::Cube::from_raw(l, s, b, DataType::F64, ByteOrder::Little, f64s.iter().flat_map(|v| v.to_le_bytes()).collect(), Default::default()).unwrap();
            let be64 = crate::cube::Cube::from_raw(l, s, b, DataType::F64, ByteOrder::Big, f64s.iter().flat_map(|v| v.to_be_bytes()).collect(), Default::default()).unwrap();
            assert_eq!(le64.content_digest(), be64.content_digest(), "{l}x{s}x{b} float64");
        }
        let values: Vec<i16> = (0..6 * 5 * 4).map(|i| (i * 53 % 211 - 100) as i16).collect();
        let le = crate::cube::Cube::from_i16(6, 5, 4, &values).unwrap();
        let mut with_bbl = le.clone();
        with_bbl.meta.bbl = Some(vec![true, false, true, true]);
        let mut with_ignore = le.clone();
        with_ignore.meta.ignore_value = Some(0.0);
        let digests = [le.content_digest(), with_bbl.content_digest(), with_ignore.content_digest()];
        assert!(digests[0] != digests[1] && digests[0] != digests[2] && digests[1] != digests[2]);
        // The canonical header is the one NumPy's np.save (2.4) writes, so that NumPy clients' uploads
        // are digested on the way in.
        let mut numpy = b"\x93NUMPY\x01\x00v\x00{'descr': '<i2', 'fortran_order': False, 'shape': (1087, 614, 224), }".to_vec();
        numpy.extend_from_slice(&[b' '; 48]);
        numpy.push(b'\n');
        assert_eq!(crate::cube::npy::canonical_header(DataType::I16, 1087, 614, 224), numpy);
    }

    /// The Python client computes the same digest (`clients/python/tests/test_offline.py` pins the same
    /// value for the same array): the definition is shared across languages, not just self-consistent.
    #[test]
    fn content_digest_of_a_small_cube_is_pinned() {
        let values: Vec<i16> = (0..24).collect();
        let cube = crate::cube::Cube::from_i16(2, 3, 4, &values).unwrap();
        assert_eq!(hex::encode(cube.content_digest()), "53b149a83047525a93da71e975a5269557f6f44851f32aeaf51fab90631e7db7");
    }

    #[test]
    fn envi_claims() {
        let h = "ENVI\ndescription = {\n lines = 99999999 }\nsamples = 4\nlines = 3\nbands = 2\ndata type = 12\nheader offset = 10\ninterleave = bsq\nbyte order = 0\n";
        assert_eq!(envi_claim(h, 1 << 20).unwrap(), Some(Claim { offset: 10, data: 48, bip_le: None }));
        let huge = "ENVI\nsamples = 1000000\nlines = 1000000\nbands = 1000\ndata type = 4\ninterleave = bsq\nbyte order = 0\n";
        assert_eq!(envi_claim(huge, 1 << 30).unwrap_err().code(), "too_large");
        assert_eq!(envi_claim("ENVI\nsamples = 4\n", 1 << 20).unwrap_err().code(), "invalid_header");
        assert_eq!(envi_claim("ENVI\nsamples = -4\n", 1 << 20).unwrap_err().code(), "invalid_header");
    }
}
