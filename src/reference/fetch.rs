//! The worker's read of a referenced cube: the recorded objects, each read with parallel ranged GETs
//! (conditional on the version recorded at submit) into the job's scratch, then mapped as a local
//! file of the same format would be. The scratch names are unlinked once the cube is mapped (the
//! mapping keeps the pages until the job drops the cube), so nothing is left behind however the job
//! ends; a process that dies meanwhile leaves files that the next start's scratch clearing removes.

use std::collections::BTreeMap;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use futures::{StreamExt, TryStreamExt};

use super::{Object, ObjectVersion, RefError, Reference, References, Stored};
use crate::cube::{Cube, CubeError};

/// Bytes per ranged GET.
pub const PART: u64 = 8 << 20;
/// Ranged GETs in flight per object.
pub const CONCURRENCY: usize = 6;

/// Why a referenced cube could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Reference(#[from] RefError),
    #[error(transparent)]
    Cube(#[from] CubeError),
}

/// The format of an object, by its name (as `cube::map` decides for a local file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Npy,
    EnviHeader,
    /// NetCDF, HDF5 or GeoTIFF, read through GDAL: the extension to give the local copy.
    Gdal(&'static str),
}

impl Format {
    pub fn of_name(name: &str) -> Option<Format> {
        let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase())?;
        Some(match ext.as_str() {
            "npy" => Format::Npy,
            "hdr" => Format::EnviHeader,
            "nc" | "nc4" | "netcdf" => Format::Gdal("nc"),
            "h5" | "he5" | "hdf5" | "hdf" => Format::Gdal("h5"),
            "tif" | "tiff" | "gtif" => Format::Gdal("tif"),
            _ => return None,
        })
    }
}

/// A referenced cube, read: the cube (mapped over its unlinked scratch files), and its content digest
/// when it was computed while the bytes arrived (a little-endian C-order `.npy`, an ENVI data object).
pub struct Loaded {
    pub cube: Cube,
    pub content: Option<[u8; 32]>,
}

/// Reads the cube of `stored` into `dir` (the job's scratch directory, removed here before the
/// cube is returned). The content digest follows the download where the cube can be mapped before
/// its bytes are all there (`Cube::content_digest_as_written`, as for an ENVI upload), so that the
/// read and the digest overlap. Runs on a blocking thread; `rt` runs the reads.
pub fn load(refs: &References, stored: &Stored, dir: &Path, rt: &tokio::runtime::Handle) -> Result<Loaded, LoadError> {
    let result = (|| {
        std::fs::create_dir_all(dir).map_err(|e| CubeError::io(dir, e))?;
        let main = parse(&stored.object.href)?;
        let format =
            Format::of_name(&main.file_name()).ok_or_else(|| RefError::Unsupported(format!("{} is not a cube this server reads", stored.object.href)))?;
        let object = rt.block_on(refs.open(&main))?;
        match format {
            Format::Npy => {
                let path = dir.join("cube.npy");
                let download = Download::start(rt, object, stored.object.clone(), &path)?;
                // A .npy header (at most 1 MiB) is in the first part.
                let content = match download.written.wait_for(PART.min(stored.object.size)) {
                    true => npy_mappable_at(&path)?,
                    false => None,
                };
                let Some(offset) = content else {
                    download.finish(rt)?;
                    return Ok(Loaded { cube: crate::cube::npy::map(&path)?, content: None });
                };
                let cube = crate::cube::npy::map(&path)?;
                let content = cube.content_digest_as_written(|n| download.written.wait_for(offset + n));
                download.finish(rt)?;
                Ok(Loaded { cube, content })
            }
            Format::EnviHeader => {
                let header = rt.block_on(object.get_range(0..stored.object.size, &stored.object))?;
                let text = String::from_utf8_lossy(&header).into_owned();
                let data_v = stored.data.as_ref().ok_or_else(|| RefError::Invalid("the job recorded no ENVI data object".into()))?;
                let data = rt.block_on(refs.open(&parse(&data_v.href)?))?;
                let path = dir.join("cube.img");
                let download = Download::start(rt, data, data_v.clone(), &path)?;
                // The file has its full length already: it is mapped now, and digested as it fills.
                let offset = crate::cube::envi::parse_header(&text)?.header_offset;
                let cube = crate::cube::envi::map_parts(&text, &path)?;
                let content = cube.content_digest_as_written(|n| download.written.wait_for(offset + n));
                download.finish(rt)?;
                Ok(Loaded { cube, content })
            }
            Format::Gdal(ext) => {
                let path = dir.join(format!("cube.{ext}"));
                Download::start(rt, object, stored.object.clone(), &path)?.finish(rt)?;
                Ok(Loaded { cube: crate::cube::map(&path)?, content: None })
            }
        }
    })();
    let _ = std::fs::remove_dir_all(dir);
    result
}

/// The data offset of the `.npy` at `path` (its first part written) when `npy::map` maps it as it is
/// (C order, little-endian or single bytes, aligned data): such a file can be digested while its
/// remaining parts arrive. None for one it would read into memory, which must wait for all of them.
fn npy_mappable_at(path: &Path) -> Result<Option<u64>, LoadError> {
    let mut f = std::fs::File::open(path).map_err(|e| CubeError::io(path, e))?;
    let h = crate::cube::npy::read_header(&mut f)?;
    let le = h.byte_order == crate::cube::ByteOrder::Little || h.dtype.size() == 1;
    Ok((!h.fortran_order && le && h.data_offset % 64 == 0).then_some(h.data_offset))
}

fn parse(href: &str) -> Result<Reference, RefError> {
    Reference::parse(href)?.ok_or_else(|| RefError::Invalid(format!("{href} is not an s3:// or https:// reference")))
}

/// How much of a file, from its start, the parallel GETs have written: for a reader that follows them.
#[derive(Default)]
pub struct Written {
    state: Mutex<WrittenState>,
    changed: Condvar,
}

#[derive(Default)]
struct WrittenState {
    /// Every byte before this is written.
    front: u64,
    /// Parts written beyond `front` (start → end).
    ahead: BTreeMap<u64, u64>,
    /// The download stopped (finished, or failed): `front` will not move any more.
    ended: bool,
}

impl Written {
    fn add(&self, part: &Range<u64>) {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let s = &mut *guard;
        s.ahead.insert(part.start, part.end);
        while let Some(end) = s.ahead.remove(&s.front) {
            s.front = end;
        }
        self.changed.notify_all();
    }

    fn end(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).ended = true;
        self.changed.notify_all();
    }

    /// Blocks until the first `n` bytes are written: true, or false when the download stopped short.
    pub fn wait_for(&self, n: u64) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if s.front >= n {
                return true;
            }
            if s.ended {
                return false;
            }
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Ends a [`Written`] when it is dropped: held by the download filling it, so that the download ends it
/// however it stops. A download's task can be dropped without finishing (aborted, or dropped with its
/// runtime when a server shuts down): a job's blocking thread following it in `Written::wait_for`
/// then waited for ever, and the runtime's shutdown with it, for the blocking thread (seen in a test
/// that ended while its job was fetching).
struct EndsWritten(Arc<Written>);

impl Drop for EndsWritten {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// Spawns `fut` on `rt` with an [`EndsWritten`] of `written` moved into the task, so that dropping the
/// task ends `written` whether or not the task was ever polled. (Held inside `fill`'s body, the guard
/// only existed from its first poll, and a runtime shutting down drops its queued tasks unpolled: a
/// CI run hung so in tests/references.rs after the guard was first added.)
fn spawn_ending<F>(rt: &tokio::runtime::Handle, written: &Arc<Written>, fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let ends = EndsWritten(written.clone());
    rt.spawn(async move {
        let _ends = ends;
        fut.await
    })
}

/// A download running on the runtime while a blocking thread follows it; aborted if dropped unfinished.
struct Download {
    task: Option<tokio::task::JoinHandle<Result<(), LoadError>>>,
    written: Arc<Written>,
}

impl Download {
    /// Creates `path` at the object's full length (so that it can be mapped at once) and starts
    /// filling it.
    fn start(rt: &tokio::runtime::Handle, object: Object, v: ObjectVersion, path: &Path) -> Result<Download, LoadError> {
        let file = std::fs::File::create(path).map_err(|e| CubeError::io(path, e))?;
        file.set_len(v.size).map_err(|e| CubeError::io(path, e))?;
        let written = Arc::new(Written::default());
        let task = spawn_ending(rt, &written, fill(object, v, Arc::new(file), path.to_path_buf(), written.clone()));
        Ok(Download { task: Some(task), written })
    }

    /// Waits for the last part.
    fn finish(mut self, rt: &tokio::runtime::Handle) -> Result<(), LoadError> {
        let task = self.task.take().expect("a download is finished once");
        rt.block_on(task).map_err(|e| CubeError::io(Path::new("download"), std::io::Error::other(e)))?
    }
}

impl Drop for Download {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// Writes the object (version `v`) to `path` with parallel ranged GETs, each at its offset. For a
/// caller that only needs the file (the API's GDAL references).
pub async fn download(object: &Object, v: &ObjectVersion, path: PathBuf) -> Result<PathBuf, LoadError> {
    let file = std::fs::File::create(&path).map_err(|e| CubeError::io(&path, e))?;
    file.set_len(v.size).map_err(|e| CubeError::io(&path, e))?;
    fill(object.clone(), v.clone(), Arc::new(file), path.clone(), Arc::default()).await?;
    Ok(path)
}

/// The parallel GETs of [`download`], each part recorded in `written` once it is in the file.
async fn fill(object: Object, v: ObjectVersion, file: Arc<std::fs::File>, path: PathBuf, written: Arc<Written>) -> Result<(), LoadError> {
    let parts = (0..v.size).step_by(PART as usize).map(|at| at..(at + PART).min(v.size));
    let result = futures::stream::iter(parts)
        .map(|range| {
            let (object, file, path, written, v) = (object.clone(), file.clone(), path.clone(), written.clone(), &v);
            async move {
                let bytes = object.get_range(range.clone(), v).await?;
                tokio::task::spawn_blocking(move || {
                    file.write_all_at(&bytes, range.start).map_err(|e| CubeError::io(&path, e))?;
                    written.add(&range);
                    Ok::<_, CubeError>(())
                })
                .await
                .map_err(|e| CubeError::io(Path::new("download"), std::io::Error::other(e)))??;
                Ok::<_, LoadError>(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<()>()
        .await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_follows_parts_that_end_out_of_order() {
        let w = Arc::new(Written::default());
        w.add(&(10..20));
        assert_eq!(w.state.lock().unwrap().front, 0);
        let waiter = {
            let w = w.clone();
            std::thread::spawn(move || w.wait_for(25))
        };
        w.add(&(0..10));
        assert_eq!(w.state.lock().unwrap().front, 20);
        w.add(&(20..30));
        assert!(waiter.join().unwrap());
        // A download that stops short answers false instead of blocking.
        let waiter = {
            let w = w.clone();
            std::thread::spawn(move || w.wait_for(40))
        };
        w.end();
        assert!(!waiter.join().unwrap());
        assert!(w.wait_for(30));
    }

    /// A reader following a download is released when the download's task is dropped unfinished,
    /// here with its runtime (as when a server shuts down while a job fetches its cube): a task that
    /// was running (a multi-thread runtime), and one that was never polled (a current-thread runtime
    /// that nothing drives: its queued task is dropped unpolled).
    #[test]
    fn a_reader_is_released_when_the_download_is_dropped_unfinished() {
        let runtimes = [
            ("polled", tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()),
            ("never polled", tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()),
        ];
        for (what, rt) in runtimes {
            let w = Arc::new(Written::default());
            // A download that never finishes.
            let polled = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let seen = polled.clone();
            let _task = spawn_ending(rt.handle(), &w, async move {
                seen.store(true, std::sync::atomic::Ordering::SeqCst);
                std::future::pending::<()>().await
            });
            if what == "polled" {
                let t0 = std::time::Instant::now();
                while !polled.load(std::sync::atomic::Ordering::SeqCst) && t0.elapsed().as_secs() < 10 {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            assert_eq!(polled.load(std::sync::atomic::Ordering::SeqCst), what == "polled", "{what}");
            let (tx, rx) = std::sync::mpsc::channel();
            let reader = w.clone();
            std::thread::spawn(move || tx.send(reader.wait_for(10)));
            drop(rt);
            // Bounded, so that a reader left waiting fails the test rather than hanging it.
            assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(10)), Ok(false), "{what}");
        }
    }

    #[test]
    fn formats_follow_the_name() {
        assert_eq!(Format::of_name("a.NPY"), Some(Format::Npy));
        assert_eq!(Format::of_name("a.img.hdr"), Some(Format::EnviHeader));
        assert_eq!(Format::of_name("EMIT_L1B.nc"), Some(Format::Gdal("nc")));
        assert_eq!(Format::of_name("x.tiff"), Some(Format::Gdal("tif")));
        assert_eq!(Format::of_name("x.img"), None);
        assert_eq!(Format::of_name("noext"), None);
    }
}
