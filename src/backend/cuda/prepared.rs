//! A cube made ready on the device, and the three passes over it.
//!
//! Data path: the raw cube (file data type and byte order) goes to the device in chunks of lines, from
//! the cube's own memory when it is page-locked (`CudaBackend::register_host`), otherwise through two
//! pinned staging buffers that the host fills (in parallel) while the DMA engine sends the other one.
//! Copies run on a copy stream, kernels on a compute stream, ordered by per-chunk events, so transfers
//! overlap the arithmetic. A cube that fits the memory budget stays on the device between the passes
//! (uploaded during the first pass, interleaved with its kernels); a larger one is streamed through two
//! device chunk buffers (with one halo line above and below for the noise filter) in every pass.
//!
//! Statistics: covariance sums are formed from float32 values shifted by a per-band value near their
//! mean (sampled on the host from at most 1024 pixels), summed per thread over at most 1024 pixels in
//! float32, then in float64; `Moments::from_shifted_sums` turns them into centred moments. When the
//! cube is resident the noise sums are finished and copied back first, so the host's noise
//! eigen-decomposition overlaps the data covariance.

use std::borrow::Cow;
use std::time::Instant;

use cudarc::driver::{CudaEvent, CudaStream};
use rayon::prelude::*;

use super::device::{cuda, dtoh_async, event, htod_async, is_registered, DevBuf, PinnedBuf, Pooled, Sized_};
use super::kernels::{self, CovParts, DevPtr, NoiseArgs, Pixels, RawType, COV_TILE, MAX_CONST_T, PX_KP};
use super::{CudaBackend, Route};
use crate::backend::{check_window, BackendError, ChunkDone, PreparedCube};
use crate::cube::Cube;
use crate::mnf::stats::{is_masked, Denoise, Moments, Projection, Statistics, StatsSpec};
use crate::mnf::{Monitor, NoiseEstimator, Stage};

/// Target size of one chunk's float32 work matrix (chunk pixels × bands × 4 bytes). Measured on the H100
/// (2026-11-22): 32 MB chunks were slower than 64 MB at every size (more per-chunk host work).
const CHUNK_WORK_BYTES: usize = 64 << 20;
/// Host pixels sampled to choose the shifts, in runs of SHIFT_RUN neighbouring pixels. A shift near the
/// mean only conditions the sums (integer data stay exact whatever it is), but the sampling runs before
/// the first kernel can start: 1024 scattered samples (2,300 decoded pixels with the mean filter's
/// neighbours, each a few cache and TLB misses in a cube of hundreds of MB) took 1.4–1.6 ms on the
/// H100's host (measured with RUST_LOG=hypermnf::timing=debug).
const SHIFT_SAMPLES: usize = 256;
/// Bytes of one pinned staging buffer: chunks are sent in pieces of this size, so that the buffers are
/// the same for every cube and the backend's pool hands the same two to every job. Sized by the chunk
/// before, they differed with each cube's shape and a service's job waited for a fresh cuMemHostAlloc
/// (46 ms of a 299 MB cube's statistics pass on the H100, 2026-11-25, after a smaller cube's job).
pub(super) const STAGING_PIECE: usize = 16 << 20;
/// Pinned requests are rounded up to a power of two of at least this, so that outputs of nearby sizes
/// (another k, another width) reuse the pool's buffers instead of allocating their own.
const PINNED_MIN: usize = 1 << 20;
const SHIFT_RUN: usize = 16;

/// The size a pinned request is served at: a power of two, at least PINNED_MIN.
pub(super) fn pinned_class(bytes: usize) -> usize {
    bytes.max(PINNED_MIN).next_power_of_two()
}

/// Index of sample i of n over 0..total: runs of SHIFT_RUN consecutive indices, spread evenly.
fn sample_index(i: usize, n: usize, total: usize) -> usize {
    let runs = n.div_ceil(SHIFT_RUN);
    let (r, o) = (i / SHIFT_RUN, i % SHIFT_RUN);
    (((r as u128 * total as u128) / runs as u128) as usize + o).min(total - 1)
}

/// Device times of the last passes, in milliseconds from the start of each pass (CUDA events), plus
/// host wall times. Stages overlap, so these are points on a timeline, not a sum.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Timeline {
    pub resident: bool,
    pub chunks: usize,
    /// Statistics pass: last upload finished (resident cubes upload during this pass).
    pub upload_done_ms: f32,
    /// Noise residuals and noise covariance finished (resident: before the data covariance starts).
    pub noise_done_ms: f32,
    /// Data covariance finished.
    pub data_done_ms: f32,
    /// Host wall time of the statistics pass, including the `on_noise` callback.
    pub statistics_wall_ms: f64,
    /// Host wall time spent inside `on_noise` (the host's noise eigen work, overlapped).
    pub on_noise_wall_ms: f64,
    /// Projection pass: kernels of the last chunk finished / last download finished.
    pub project_kernels_ms: f32,
    pub project_download_ms: f32,
    pub project_wall_ms: f64,
}

/// The raw bytes of chunk-able lines as the device reads them.
struct Layout {
    lines: usize,
    samples: usize,
    bands: usize,
    t: RawType,
    /// Lines of a full chunk (the largest).
    chunk_lines: usize,
    /// Chunk c is lines bounds[c]..bounds[c + 1].
    bounds: Vec<usize>,
}

impl Layout {
    /// Chunks of `chunk_lines` lines. With `split_tail` (a resident cube, uploaded and processed chunk
    /// by chunk) the last full chunk is cut in four: the statistics of the last two chunks run after
    /// the upload has ended, so small last chunks shorten that tail (by ~1 ms of the ~14 ms of a
    /// 299 MB cube on an H100).
    fn new(lines: usize, samples: usize, bands: usize, t: RawType, chunk_lines: usize, split_tail: bool) -> Layout {
        let mut bounds: Vec<usize> = (0..lines).step_by(chunk_lines.max(1)).collect();
        bounds.push(lines);
        if split_tail && bounds.len() >= 3 {
            let l0 = bounds[bounds.len() - 2];
            let n = lines - l0;
            if n >= 16 {
                bounds.pop();
                bounds.extend((1..4).map(|i| l0 + n * i / 4));
                bounds.push(lines);
            }
        }
        Layout {
            lines,
            samples,
            bands,
            t,
            chunk_lines,
            bounds,
        }
    }
    fn line_bytes(&self) -> usize {
        self.samples * self.bands * self.t.size
    }
    fn chunks(&self) -> usize {
        self.bounds.len() - 1
    }
    /// Lines l0..l1 of chunk c.
    fn chunk(&self, c: usize) -> (usize, usize) {
        (self.bounds[c], self.bounds[c + 1])
    }
    /// The chunk that holds line `l`.
    fn chunk_of(&self, l: usize) -> usize {
        self.bounds.partition_point(|&b| b <= l) - 1
    }
    fn chunk_pixels_max(&self) -> usize {
        self.chunk_lines * self.samples
    }
}

/// Whole cube on the device.
struct Resident<'c> {
    raw: Pooled<'c, DevBuf>,
    uploaded: Vec<bool>,
    /// Recorded on the copy stream when chunk c has arrived.
    arrived: Vec<CudaEvent>,
}

/// Two device chunk buffers for a streamed cube (each chunk plus one halo line above and below).
struct Slots<'c> {
    raw: [Pooled<'c, DevBuf>; 2],
    valid: [Pooled<'c, DevBuf>; 2],
    /// Recorded on the copy stream when the slot's upload finished.
    arrived: [CudaEvent; 2],
    /// Recorded on the compute stream when the kernels no longer read the slot.
    released: [CudaEvent; 2],
}

/// Two pinned host buffers that feed the DMA engine when the cube's memory is not page-locked.
struct Staging<'c> {
    buf: [Pooled<'c, PinnedBuf>; 2],
    /// Recorded on the copy stream after the DMA that read buf[i].
    copied: [CudaEvent; 2],
    next: usize,
}

/// A cube stored BIL or BSQ (an ENVI file mapped as it is): blocks of its lines are read from the file
/// in that order into the staging buffers, copied to a landing buffer on the device, and reordered
/// into BIP there (`Kernels::reorder_to_bip`), so the host never transposes it.
struct Native<'c> {
    storage: crate::cube::Interleave,
    file: &'c std::fs::File,
    /// Offset of the first stored sample in the file.
    base: u64,
}

/// The mask the valid-pixel buffer was computed for.
#[derive(Clone, PartialEq)]
struct MaskKey {
    ignore: Option<u64>,
    bands: Vec<usize>,
}

pub struct CudaCube<'c> {
    be: &'c CudaBackend,
    cube: &'c Cube,
    /// The cube's first line this prepared cube holds: the passes see lines first..first + lay.lines
    /// as a cube of their own (a share of a cube split over several devices; 0 and all lines otherwise).
    first: usize,
    /// Shifts given by the caller instead of sampled ones (data, noise): the shares of a split cube
    /// all use the whole cube's, so that they form the same float32 values as one device would.
    shifts: Option<(Vec<f64>, Vec<f64>)>,
    host: Cow<'c, [u8]>,
    /// Where `host` is a file's mapping: the file and the offset of `host[0]` in it. Staging copies
    /// read it with positioned reads (the mapping is not populated, see `cube::npy::map`).
    file: Option<(&'c std::fs::File, u64)>,
    /// Set for a cube stored BIL or BSQ (`host` is then empty): see [`Native`].
    native: Option<Native<'c>>,
    /// The device buffer a native block lands in before it is reordered into place.
    land: Option<Pooled<'c, DevBuf>>,
    registered: bool,
    lay: Layout,
    compute: std::sync::Arc<CudaStream>,
    copy: std::sync::Arc<CudaStream>,
    resident: Option<Resident<'c>>,
    slots: Option<Slots<'c>>,
    staging: Option<Staging<'c>>,
    /// Resident cubes: one byte per pixel, valid for `mask_key`.
    valid: Option<Pooled<'c, DevBuf>>,
    mask_key: Option<MaskKey>,
    t0: CudaEvent,
    timeline: Timeline,
}

impl<'c> CudaCube<'c> {
    /// Prepares lines `range` of `cube` (all of them for a whole cube); the range is checked by the
    /// caller (`CudaBackend::prepare_lines`).
    pub(super) fn new(be: &'c CudaBackend, cube: &'c Cube, range: std::ops::Range<usize>) -> Result<Self, BackendError> {
        let began = Instant::now();
        be.ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent"))?;
        let t = RawType::of(cube.dtype(), cube.byte_order());
        let stored_bip = cube.storage() == crate::cube::Interleave::Bip;
        let native = match (stored_bip, cube.raw_file()) {
            (false, Some((file, base))) if !RawType::host_converted(cube.dtype()) => {
                Some(Native { storage: cube.storage(), file, base })
            }
            _ => None,
        };
        // i64 / u64: no device conversion; widen to f64 on the host (documented in RawType::of).
        let host: Cow<'c, [u8]> = if RawType::host_converted(cube.dtype()) {
            let mut v = vec![0f64; range.len() * cube.samples() * cube.bands()];
            cube.decode_lines_f64(range.start, range.len(), &mut v);
            Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect())
        } else if native.is_some() {
            Cow::Borrowed(&[])
        } else if !stored_bip {
            // Stored BIL/BSQ without a file to read from: gathered here (not made by any reader).
            let mut v = vec![0u8; range.len() * cube.line_bytes()];
            cube.copy_lines_bip(range.start, range.len(), &mut v);
            Cow::Owned(v)
        } else {
            Cow::Borrowed(cube.raw_lines(range.start, range.len()))
        };
        let registered = is_registered(&be.registry, &host);
        let file = match (&host, cube.raw_file()) {
            (Cow::Borrowed(_), Some((f, at))) if native.is_none() => Some((f, at + (range.start * cube.line_bytes()) as u64)),
            _ => None,
        };
        let (lines, samples, bands) = (range.len(), cube.samples(), cube.bands());
        let work_line = samples * bands * 4;
        let mut chunk_lines = (CHUNK_WORK_BYTES / work_line.max(1)).clamp(1, lines);
        let line_bytes = samples * bands * t.size;
        let budget = be.memory_budget()?;
        // Resident: the raw cube, its mask, and per-pass chunk buffers (work matrix + two output chunks).
        let pass_bytes = |cl: usize| cl * samples * (bands * 4 * 3 + 1);
        // The raw lines on the device (the host holds none of a native cube's).
        let raw_bytes = lines * samples * bands * t.size;
        let resident_need = raw_bytes + lines * samples + pass_bytes(chunk_lines);
        let resident = resident_need <= budget;
        if !resident {
            // Two slots of (chunk + 2 halo lines) raw + mask, plus the per-pass buffers.
            let per_line = 2 * (line_bytes + samples) + pass_bytes(1);
            let fixed = 2 * 2 * (line_bytes + samples);
            chunk_lines = (budget.saturating_sub(fixed) / per_line.max(1)).clamp(1, chunk_lines);
        }
        let lay = Layout::new(lines, samples, bands, t, chunk_lines, resident);
        let compute = be.ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
        let copy = be.ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
        let n = lay.chunks();
        let streams = [&compute, &copy];
        let dev = |bytes: usize| be.dev_pool.take(bytes, &streams, |n| DevBuf::alloc(&be.ctx, n));
        let (resident, slots) = if resident {
            let raw = dev(raw_bytes)?;
            // Timed only when the per-chunk timeline is logged (hypermnf::timing at debug level).
            let timed = tracing::enabled!(target: "hypermnf::timing", tracing::Level::DEBUG);
            let arrived = (0..n).map(|_| event(&be.ctx, timed)).collect::<Result<Vec<_>, _>>()?;
            (
                Some(Resident {
                    raw,
                    uploaded: vec![false; n],
                    arrived,
                }),
                None,
            )
        } else {
            let slot_lines = chunk_lines + 2;
            let mk = || dev(slot_lines * line_bytes);
            let mv = || dev(slot_lines * samples);
            let ev = || event(&be.ctx, false);
            (
                None,
                Some(Slots {
                    raw: [mk()?, mk()?],
                    valid: [mv()?, mv()?],
                    arrived: [ev()?, ev()?],
                    released: [ev()?, ev()?],
                }),
            )
        };
        tracing::debug!(
            resident = resident.is_some(),
            chunk_lines,
            chunks = n,
            registered,
            ms = began.elapsed().as_secs_f64() * 1e3,
            "cube prepared on the device"
        );
        Ok(CudaCube {
            be,
            cube,
            first: range.start,
            shifts: None,
            host,
            file,
            native,
            land: None,
            registered,
            timeline: Timeline {
                resident: resident.is_some(),
                chunks: n,
                ..Default::default()
            },
            lay,
            compute,
            copy,
            resident,
            slots,
            staging: None,
            valid: None,
            mask_key: None,
            t0: event(&be.ctx, true)?,
        })
    }

    /// Uses these shifts (data, noise; one per band) in the statistics pass instead of sampling them.
    pub fn set_shifts(&mut self, data: Vec<f64>, noise: Vec<f64>) {
        self.shifts = Some((data, noise));
    }

    /// True when the cube stays on the device between passes.
    pub fn is_resident(&self) -> bool {
        self.resident.is_some()
    }

    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    fn bind(&self) -> Result<(), BackendError> {
        self.be.ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent"))
    }

    /// Device memory from the backend's pool.
    fn dev(&self, bytes: usize) -> Result<Pooled<'c, DevBuf>, BackendError> {
        let ctx = &self.be.ctx;
        self.be
            .dev_pool
            .take(bytes, &[&self.compute, &self.copy], |n| DevBuf::alloc(ctx, n))
    }

    /// Device memory holding `data` (copied in order on the compute stream).
    fn dev_from<T: Copy>(&self, data: &[T]) -> Result<Pooled<'c, DevBuf>, BackendError> {
        let b = self.dev(std::mem::size_of_val(data))?;
        if !data.is_empty() {
            // SAFETY: b holds the bytes; a copy from pageable memory is staged before the call returns.
            unsafe { cudarc::driver::result::memcpy_htod_async(b.ptr(), data, self.compute.cu_stream()) }
                .map_err(cuda("cuMemcpyHtoDAsync"))?;
        }
        Ok(b)
    }

    /// Page-locked host memory from the backend's pool, at least `bytes` of it (see PINNED_MIN).
    fn pinned(&self, bytes: usize) -> Result<Pooled<'c, PinnedBuf>, BackendError> {
        let ctx = &self.be.ctx;
        self.be
            .pinned_pool
            .take(pinned_class(bytes), &[&self.compute, &self.copy], |n| PinnedBuf::alloc(ctx, n))
    }

    /// Sends host bytes `range` to device address `dst` on the copy stream: directly from page-locked
    /// memory, or through the next pinned staging buffer (waiting until its previous DMA is done).
    fn send(&mut self, range: std::ops::Range<usize>, dst: u64) -> Result<(), BackendError> {
        if range.is_empty() {
            return Ok(());
        }
        if self.native.is_some() {
            return self.send_native(range, dst);
        }
        if self.registered {
            // SAFETY: the registered host memory outlives this prepared cube (borrowed for 'c) and is
            // not written; dst holds range.len() bytes (checked by the callers' layout).
            return unsafe { htod_async(dst, &self.host[range], &self.copy) };
        }
        if self.staging.is_none() {
            let ctx = &self.be.ctx;
            self.staging = Some(Staging {
                buf: [self.pinned(STAGING_PIECE)?, self.pinned(STAGING_PIECE)?],
                copied: [event(ctx, false)?, event(ctx, false)?],
                next: 0,
            });
        }
        let st = self.staging.as_mut().expect("staging allocated above");
        // Piece by piece through the two buffers: the host fills one while the DMA engine sends the other.
        let mut at = range.start;
        while at < range.end {
            let end = (at + STAGING_PIECE).min(range.end);
            let i = st.next;
            st.next ^= 1;
            st.copied[i].synchronize().map_err(cuda("cuEventSynchronize"))?;
            let src = &self.host[at..end];
            let dst_host = &mut st.buf[i].as_mut_slice()[..src.len()];
            if let Some((f, base)) = self.file {
                use std::os::unix::fs::FileExt;
                dst_host
                    .par_chunks_mut(1 << 20)
                    .enumerate()
                    .try_for_each(|(j, d)| f.read_exact_at(d, base + (at + (j << 20)) as u64))
                    .map_err(|e| BackendError::Invalid(format!("cannot read the cube's file: {e}")))?;
            } else {
                dst_host
                    .par_chunks_mut(1 << 20)
                    .zip(src.par_chunks(1 << 20))
                    .for_each(|(d, s)| d.copy_from_slice(s));
            }
            // SAFETY: the staging buffer is not touched again before `copied[i]` has passed (synchronized
            // above before each reuse, and in Drop); dst holds range.len() bytes, of which this piece is
            // the part at (at - range.start).
            unsafe { htod_async(dst + (at - range.start) as u64, &st.buf[i].as_slice()[..src.len()], &self.copy)? };
            st.copied[i].record(&self.copy).map_err(cuda("cuEventRecord"))?;
            at = end;
        }
        Ok(())
    }

    /// [`send`](Self::send) for a cube stored BIL or BSQ: `range` (whole lines, in bytes of this
    /// prepared cube's BIP lines) goes in blocks of whole lines. Each block is read from the file in
    /// the stored order with parallel positioned reads into a staging buffer (BIL: one run of bytes;
    /// BSQ: one run per band), copied to the landing buffer, and reordered into BIP at its place in
    /// `dst` on the copy stream, so a later wait on the copy stream covers the reorder too.
    fn send_native(&mut self, range: std::ops::Range<usize>, dst: u64) -> Result<(), BackendError> {
        use std::os::unix::fs::FileExt;
        let lb = self.lay.line_bytes();
        let (samples, bands, size) = (self.cube.samples(), self.cube.bands(), self.lay.t.size);
        let cube_lines = self.cube.lines();
        debug_assert!(range.start % lb == 0 && range.end % lb == 0, "whole lines");
        let piece = STAGING_PIECE.max(lb);
        let block_lines = piece / lb;
        if self.staging.is_none() {
            let ctx = &self.be.ctx;
            self.staging = Some(Staging {
                buf: [self.pinned(piece)?, self.pinned(piece)?],
                copied: [event(ctx, false)?, event(ctx, false)?],
                next: 0,
            });
        }
        if self.land.as_ref().is_none_or(|l| l.size() < piece) {
            let streams = [&self.compute, &self.copy];
            self.land = Some(self.be.dev_pool.take(piece, &streams, |n| DevBuf::alloc(&self.be.ctx, n))?);
        }
        let native = self.native.as_ref().expect("a native cube");
        let (storage, file, base) = (native.storage, native.file, native.base);
        let land = DevPtr::<u8>::of(self.land.as_ref().expect("allocated above"));
        let st = self.staging.as_mut().expect("staging allocated above");
        let read_err = |e: std::io::Error| BackendError::Invalid(format!("cannot read the cube's file: {e}"));
        let (l_first, l_end) = (self.first + range.start / lb, self.first + range.end / lb);
        let mut l0 = l_first;
        while l0 < l_end {
            let l1 = (l0 + block_lines).min(l_end);
            let n = l1 - l0;
            let bytes = n * lb;
            let i = st.next;
            st.next ^= 1;
            st.copied[i].synchronize().map_err(cuda("cuEventSynchronize"))?;
            let host = &mut st.buf[i].as_mut_slice()[..bytes];
            match storage {
                crate::cube::Interleave::Bil => host
                    .par_chunks_mut(1 << 20)
                    .enumerate()
                    .try_for_each(|(j, d)| file.read_exact_at(d, base + (l0 * lb + (j << 20)) as u64))
                    .map_err(read_err)?,
                // Band b's lines l0..l1 lie at ((b * lines) + l0) * samples samples in.
                _ => host
                    .par_chunks_mut(n * samples * size)
                    .enumerate()
                    .try_for_each(|(b, d)| file.read_exact_at(d, base + (((b * cube_lines) + l0) * samples * size) as u64))
                    .map_err(read_err)?,
            }
            // SAFETY: the staging buffer is not touched again before `copied[i]` has passed (synchronized
            // above before each reuse, and in Drop); the landing buffer holds `piece` >= bytes bytes and is
            // only read by the reorder below, on the same stream.
            unsafe { htod_async(land.addr(), &st.buf[i].as_slice()[..bytes], &self.copy)? };
            st.copied[i].record(&self.copy).map_err(cuda("cuEventRecord"))?;
            let at = dst + ((l0 - l_first) * lb) as u64;
            let out = DevPtr::<u8>::raw(at, bytes);
            let (groups, cols) = match storage {
                crate::cube::Interleave::Bil => (n, samples),
                _ => (1, n * samples),
            };
            self.be.kernels.reorder_to_bip(&self.copy, land, out, groups, bands, cols, size)?;
            l0 = l1;
        }
        Ok(())
    }

    /// Gives the staging buffers back to the backend's pool once a resident cube is wholly on the
    /// device (called at the end of a pass, with both streams idle). A cube that the device-level
    /// cache keeps held them for as long as it stayed cached, so the next job of another cube made two
    /// new ones: the 15-28 ms of `cuMemHostAlloc` before the first statistics chunk of a service job
    /// on the H100 (2026-11-25), and 32 MB of page-locked memory per cached cube.
    fn release_staging_once_uploaded(&mut self) {
        if self.resident.as_ref().is_some_and(|r| r.uploaded.iter().all(|&u| u)) {
            self.staging = None;
        }
    }

    /// Resident cube: starts the upload of chunk c on the copy stream, unless already started.
    fn issue_chunk(&mut self, c: usize) -> Result<(), BackendError> {
        let (l0, l1) = self.lay.chunk(c);
        let lb = self.lay.line_bytes();
        let res = self.resident.as_ref().expect("resident cube");
        if !res.uploaded[c] {
            let dst = res.raw.at(l0 * lb);
            self.send(l0 * lb..l1 * lb, dst)?;
            let res = self.resident.as_mut().expect("resident cube");
            res.arrived[c].record(&self.copy).map_err(cuda("cuEventRecord"))?;
            res.uploaded[c] = true;
        }
        Ok(())
    }

    /// Resident cube: makes sure chunk c is (being) uploaded and that the compute stream waits for it.
    fn ensure_chunk(&mut self, c: usize) -> Result<(), BackendError> {
        self.issue_chunk(c)?;
        let res = self.resident.as_ref().expect("resident cube");
        self.compute.wait(&res.arrived[c]).map_err(cuda("cuStreamWaitEvent"))
    }

    /// Streamed cube: uploads lines (l0 − halo)..(l1 + halo) of chunk c into slot c % 2 and makes the
    /// compute stream wait for it. Returns (slot, first line in the slot, lines in the slot).
    fn load_slot(&mut self, c: usize, halo: usize) -> Result<(usize, usize, usize), BackendError> {
        let (l0, l1) = self.lay.chunk(c);
        let (b0, b1) = (l0.saturating_sub(halo), (l1 + halo).min(self.lay.lines));
        let slot = c % 2;
        let lb = self.lay.line_bytes();
        let slots = self.slots.as_ref().expect("streamed cube");
        // The copy may only overwrite the slot once the kernels of chunk c − 2 are done with it.
        self.copy
            .wait(&slots.released[slot])
            .map_err(cuda("cuStreamWaitEvent"))?;
        let dst = slots.raw[slot].ptr();
        self.send(b0 * lb..b1 * lb, dst)?;
        let slots = self.slots.as_ref().expect("streamed cube");
        slots.arrived[slot].record(&self.copy).map_err(cuda("cuEventRecord"))?;
        self.compute
            .wait(&slots.arrived[slot])
            .map_err(cuda("cuStreamWaitEvent"))?;
        Ok((slot, b0, b1 - b0))
    }

    fn release_slot(&self, slot: usize) -> Result<(), BackendError> {
        let slots = self.slots.as_ref().expect("streamed cube");
        slots.released[slot]
            .record(&self.compute)
            .map_err(cuda("cuEventRecord"))
    }

    /// Checks mask parameters and uploads the mask band list.
    fn mask_setup(
        &self,
        ignore: Option<f64>,
        mask_bands: &[usize],
    ) -> Result<Option<(f64, Pooled<'c, DevBuf>, i32)>, BackendError> {
        // NaN is allowed: it equals no sample, and pixel_mask masks the non-finite ones (the pipeline
        // gives a float cube without a no-data value NaN, see mnf::pipeline::nodata).
        let Some(v) = ignore else { return Ok(None) };
        if let Some(&b) = mask_bands.iter().find(|&&b| b >= self.lay.bands) {
            return Err(BackendError::Invalid(format!(
                "mask band {b} is out of range (bands: {})",
                self.lay.bands
            )));
        }
        let list: Vec<i32> = mask_bands.iter().map(|&b| b as i32).collect();
        Ok(Some((v, self.dev_from(&list)?, list.len() as i32)))
    }

    /// Resident cube: computes the valid-pixel buffer for (ignore, mask_bands) over all chunks unless it
    /// is already there. Returns it (None: no mask, all pixels valid).
    fn ensure_resident_mask(
        &mut self,
        ignore: Option<f64>,
        mask_bands: &[usize],
    ) -> Result<Option<DevPtr<u8>>, BackendError> {
        let key = MaskKey {
            ignore: ignore.map(f64::to_bits),
            bands: mask_bands.to_vec(),
        };
        let Some((v, list, n_mask)) = self.mask_setup(ignore, mask_bands)? else {
            return Ok(None);
        };
        if self.mask_key.as_ref() == Some(&key) {
            if let Some(valid) = &self.valid {
                return Ok(Some(DevPtr::of(valid)));
            }
        }
        if self.valid.is_none() {
            self.valid = Some(self.dev(self.lay.lines * self.lay.samples)?);
        }
        for c in 0..self.lay.chunks() {
            self.ensure_chunk(c)?;
            self.mask_chunk_resident(c, v, &list, n_mask, None)?;
        }
        self.mask_key = Some(key);
        Ok(Some(DevPtr::of(self.valid.as_ref().expect("allocated above"))))
    }

    /// valid[] for the pixels of chunk c of a resident cube (adds the valid count to `count` if given).
    fn mask_chunk_resident(
        &self,
        c: usize,
        v: f64,
        list: &DevBuf,
        n_mask: i32,
        count: Option<DevPtr<u64>>,
    ) -> Result<(), BackendError> {
        let (l0, l1) = self.lay.chunk(c);
        let s = self.lay.samples;
        let res = self.resident.as_ref().expect("resident cube");
        let valid = self.valid.as_ref().expect("mask buffer");
        self.be.kernels.pixel_mask(
            &self.compute,
            DevPtr::at(&res.raw, l0 * self.lay.line_bytes()),
            ((l1 - l0) * s) as i64,
            self.lay.bands as i32,
            self.lay.t,
            DevPtr::of(list),
            n_mask,
            v,
            DevPtr::at(valid, l0 * s),
            count,
        )
    }

    fn elapsed(&self, ev: &CudaEvent) -> f32 {
        self.t0.elapsed_ms(ev).unwrap_or(f32::NAN)
    }

    fn store_timeline(&self) {
        *self.be.last_timeline.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.timeline.clone());
    }
}

/// The accumulators of one covariance for the chosen route.
enum CovAcc<'c> {
    Kernels(CovParts<'c>),
    /// A float64 copy of the work matrix for DSYRK.
    Cublas {
        wide: Pooled<'c, DevBuf>,
    },
}

/// Device results of the statistics pass: for noise and data, the lower triangle of Σddᵀ (B × B) and
/// Σd (B), float64, then three u64 counters (valid pixels, noise residuals, unused).
struct StatBufs<'c> {
    results: Pooled<'c, DevBuf>,
    counters: Pooled<'c, DevBuf>,
    noise: CovAcc<'c>,
    data: CovAcc<'c>,
}

impl StatBufs<'_> {
    fn offsets(b: usize) -> [usize; 4] {
        // noise cross, noise sum, data cross, data sum (bytes)
        [0, b * b * 8, (b * b + b) * 8, (2 * b * b + b) * 8]
    }
}

impl<'c> CudaCube<'c> {
    fn stat_bufs(&self) -> Result<StatBufs<'c>, BackendError> {
        let b = self.lay.bands;
        let results = self.dev(2 * (b * b + b) * 8)?;
        let counters = self.dev(3 * 8)?;
        results.zero_async(&self.compute)?;
        counters.zero_async(&self.compute)?;
        let acc = || -> Result<CovAcc<'c>, BackendError> {
            Ok(match self.be.route {
                Route::Kernels => {
                    let per_sm = if self.be.kernels.use_dmma { 3 } else { 2 };
                    let (tiles, pairs, splits) = CovParts::shape(b, self.be.kernels.sms, per_sm);
                    let p = CovParts {
                        bands: b,
                        tiles,
                        pairs,
                        splits,
                        cross: self.dev(splits * pairs * COV_TILE * COV_TILE * 8)?,
                        sum: self.dev(splits * tiles * COV_TILE * 8)?,
                    };
                    p.zero(&self.compute)?;
                    CovAcc::Kernels(p)
                }
                Route::Cublas => CovAcc::Cublas {
                    wide: self.dev(self.lay.chunk_pixels_max() * b * 8)?,
                },
            })
        };
        Ok(StatBufs {
            results,
            counters,
            noise: acc()?,
            data: acc()?,
        })
    }

    /// Adds the `npix` rows of the work matrix `d` into the accumulators of one covariance.
    fn accumulate(
        &self,
        acc: &CovAcc,
        d: DevPtr<f32>,
        npix: usize,
        cross: DevPtr<f64>,
        sum: DevPtr<f64>,
    ) -> Result<(), BackendError> {
        let k = &self.be.kernels;
        let b = self.lay.bands;
        match acc {
            CovAcc::Kernels(parts) => k.cov_lower(&self.compute, d, npix as i64, parts),
            CovAcc::Cublas { wide } => {
                if npix == 0 {
                    return Ok(());
                }
                k.col_sums(&self.compute, d, npix as i64, b as i32, sum)?;
                k.widen_f64(&self.compute, d, (npix * b) as i64, DevPtr::of(wide))?;
                let blas = self.be.blas.as_ref().expect("cuBLAS route has a handle");
                let blas = blas.lock().unwrap_or_else(|e| e.into_inner());
                blas.dsyrk_add(&self.compute, wide.ptr(), npix, b, cross.addr())
            }
        }
    }

    /// Final reduction of one covariance's accumulators into results (custom route only).
    fn finish(&self, acc: &CovAcc, cross: DevPtr<f64>, sum: DevPtr<f64>) -> Result<(), BackendError> {
        match acc {
            CovAcc::Kernels(parts) => self.be.kernels.reduce_parts(&self.compute, parts, cross, sum),
            CovAcc::Cublas { .. } => Ok(()),
        }
    }

    fn noise_args(&self, spec: &StatsSpec, buf_l0: usize, buf_lines: usize, out_l0: usize, out_l1: usize) -> NoiseArgs {
        let window = match spec.window {
            Some(w) => [w.x0 as i32, w.x1 as i32, w.y0 as i32, w.y1 as i32],
            None => [0, self.lay.samples as i32, 0, self.lay.lines as i32],
        };
        NoiseArgs {
            lines: self.lay.lines as i32,
            samples: self.lay.samples as i32,
            bands: self.lay.bands as i32,
            buf_l0: buf_l0 as i32,
            buf_lines: buf_lines as i32,
            out_l0: out_l0 as i32,
            out_l1: out_l1 as i32,
            window,
        }
    }
}

/// Shifts near the means of the data and of the noise residuals, from a sample of pixels decoded on the
/// host (a few thousand samples: this is not a host-side conversion of the cube).
/// Lines first..first + l_n of the cube are sampled, as a cube of their own (`spec.window` in their
/// coordinates).
pub(crate) fn sample_shifts(cube: &Cube, first: usize, l_n: usize, spec: &StatsSpec) -> (Vec<f64>, Vec<f64>) {
    let (s_n, b) = (cube.samples(), cube.bands());
    let pixel = |l: usize, s: usize, out: &mut [f64]| cube.decode_pixel_f64(first + l, s, out);
    let masked = |px: &[f64]| is_masked(px, spec.ignore_value, &spec.mask_bands);
    let mut x = vec![0.0; b];
    let mut y = vec![0.0; b];
    let mut data = vec![0.0; b];
    let mut n_data = 0usize;
    let total = l_n * s_n;
    let n = SHIFT_SAMPLES.min(total);
    for i in 0..n {
        let p = sample_index(i, n, total);
        pixel(p / s_n, p % s_n, &mut x);
        if !masked(&x) {
            data.iter_mut().zip(&x).for_each(|(a, v)| *a += v);
            n_data += 1;
        }
    }
    if n_data > 0 {
        data.iter_mut().for_each(|a| *a /= n_data as f64);
    }
    // Noise: sample inside the window (or the image), where a residual can exist.
    let (x0, x1, y0, y1) = match spec.window {
        Some(w) => (w.x0, w.x1.min(s_n), w.y0, w.y1.min(l_n)),
        None => (0, s_n, 0, l_n),
    };
    let mut noise = vec![0.0; b];
    let mut n_noise = 0usize;
    if x1 > x0 && y1 > y0 {
        let (w, h) = (x1 - x0, y1 - y0);
        let area = w * h;
        // Fewer than for the data: each mean-filter sample decodes nine pixels.
        let n = (SHIFT_SAMPLES / 4).min(area);
        let mut nb = vec![0.0; b];
        for i in 0..n {
            let q = sample_index(i, n, area);
            let (l, s) = (y0 + q / w, x0 + q % w);
            let ok = match spec.noise {
                NoiseEstimator::MeanFilter => {
                    if l < 1 || l + 2 > l_n || s < 1 || s + 2 > s_n {
                        false
                    } else {
                        nb.iter_mut().for_each(|v| *v = 0.0);
                        let mut ok = true;
                        for dl in 0..3 {
                            for ds in 0..3 {
                                pixel(l + dl - 1, s + ds - 1, &mut y);
                                ok &= !masked(&y);
                                if dl == 1 && ds == 1 {
                                    x.copy_from_slice(&y);
                                } else {
                                    nb.iter_mut().zip(&y).for_each(|(a, v)| *a += v);
                                }
                            }
                        }
                        if ok {
                            x.iter_mut().zip(&nb).for_each(|(a, v)| *a -= v / 8.0);
                        }
                        ok
                    }
                }
                NoiseEstimator::ShiftDifference => {
                    if l + 2 > l_n || s + 2 > s_n {
                        false
                    } else {
                        pixel(l, s, &mut x);
                        pixel(l + 1, s + 1, &mut y);
                        let ok = !masked(&x) && !masked(&y);
                        if ok {
                            x.iter_mut().zip(&y).for_each(|(a, v)| *a -= v);
                        }
                        ok
                    }
                }
            };
            if ok {
                noise.iter_mut().zip(&x).for_each(|(a, v)| *a += v);
                n_noise += 1;
            }
        }
    }
    if n_noise > 0 {
        noise.iter_mut().for_each(|a| *a /= n_noise as f64);
    }
    // For integer data, shifts on the residuals' grid (whole numbers; eighths for the mean filter)
    // keep every shifted value exact in float32.
    if !cube.dtype().is_float() {
        data.iter_mut().for_each(|a| *a = a.round());
        let grid = if spec.noise == NoiseEstimator::MeanFilter {
            8.0
        } else {
            1.0
        };
        noise.iter_mut().for_each(|a| *a = (*a * grid).round() / grid);
    }
    (data, noise)
}

/// Moments from the device's float64 results: `cross` holds the lower triangle of Σddᵀ.
fn moments_from(n: u64, shift: &[f64], sum: &[f64], cross_lower: &[f64]) -> Moments {
    let b = shift.len();
    let mut cross = cross_lower.to_vec();
    for i in 0..b {
        for j in 0..i {
            cross[j * b + i] = cross[i * b + j];
        }
    }
    Moments::from_shifted_sums(n, shift, sum, &cross)
}

fn f64s(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

impl PreparedCube for CudaCube<'_> {
    fn statistics(
        &mut self,
        spec: &StatsSpec,
        on_noise: &mut dyn FnMut(&Moments),
        monitor: &Monitor,
    ) -> Result<Statistics, BackendError> {
        self.bind()?;
        let wall = Instant::now();
        let (lines, samples, b) = (self.lay.lines, self.lay.samples, self.lay.bands);
        check_window(spec, samples, lines)?;
        let mean_filter = spec.noise == NoiseEstimator::MeanFilter;
        if self.resident.is_some() && self.registered {
            // Page-locked input: queue the whole upload now (the copy engine works through it in
            // order), so that the host's set-up below (shifts from sampled pixels, buffers) overlaps
            // it instead of delaying its start. Pageable input goes through two staging buffers
            // filled by the host, so it is issued chunk by chunk in the loop.
            for c in 0..self.lay.chunks() {
                self.issue_chunk(c)?;
            }
        }
        let t_issued = wall.elapsed();
        let mask = self.mask_setup(spec.ignore_value, &spec.mask_bands)?;
        let t_mask = wall.elapsed();
        let (data_shift, noise_shift) = match &self.shifts {
            Some((d, n)) if d.len() == b && n.len() == b => (d.clone(), n.clone()),
            _ => sample_shifts(self.cube, self.first, lines, spec),
        };
        let t_shifts = wall.elapsed();
        let ctx = self.be.ctx.clone();
        let d_shift = self.dev_from(&data_shift)?;
        let n_shift = self.dev_from(&noise_shift)?;
        let bufs = self.stat_bufs()?;
        let work = self.dev(self.lay.chunk_pixels_max() * b * 4)?;
        let t_bufs = wall.elapsed();
        let off = StatBufs::offsets(b);
        let (n_cross, n_sum, d_cross, d_sum) = (
            DevPtr::at(&bufs.results, off[0]),
            DevPtr::at(&bufs.results, off[1]),
            DevPtr::at(&bufs.results, off[2]),
            DevPtr::at(&bufs.results, off[3]),
        );
        let (cnt_valid, cnt_noise) = (DevPtr::at(&bufs.counters, 0), DevPtr::at(&bufs.counters, 8));
        let (d_shift, n_shift, work) = (DevPtr::of(&d_shift), DevPtr::of(&n_shift), DevPtr::of(&work));
        let n_chunks = self.lay.chunks();
        let lb = self.lay.line_bytes();
        let t = self.lay.t;
        let k = &self.be.kernels;
        // Pooled buffers may be larger than asked: sizes come from the layout, never from .bytes().
        let results_bytes = 2 * (b * b + b) * 8;
        let counters_bytes = 3 * 8;
        let mut host_res = self.pinned(results_bytes + counters_bytes)?;
        let ev_noise = event(&ctx, true)?;
        let ev_data = event(&ctx, true)?;
        let ev_upload = event(&ctx, true)?;
        self.t0.record(&self.compute).map_err(cuda("cuEventRecord"))?;
        // Where the host's time goes before the first kernel (target hypermnf::timing, level debug).
        tracing::debug!(
            target: "hypermnf::timing",
            issue_ms = t_issued.as_secs_f64() * 1e3,
            mask_ms = (t_mask - t_issued).as_secs_f64() * 1e3,
            shifts_ms = (t_shifts - t_mask).as_secs_f64() * 1e3,
            buffers_ms = (t_bufs - t_shifts).as_secs_f64() * 1e3,
            events_ms = (wall.elapsed() - t_bufs).as_secs_f64() * 1e3,
            "statistics set-up"
        );
        let noise_bytes = off[2];

        if self.resident.is_some() {
            // Upload and compute interleaved, chunk by chunk.
            let key = MaskKey {
                ignore: spec.ignore_value.map(f64::to_bits),
                bands: spec.mask_bands.clone(),
            };
            if mask.is_some() && self.valid.is_none() {
                self.valid = Some(self.dev(lines * samples)?);
            }
            let noise_chunk = |me: &Self, c: usize, valid: Option<DevPtr<u8>>| -> Result<(), BackendError> {
                let (l0, l1) = me.lay.chunk(c);
                let raw = DevPtr::of(&me.resident.as_ref().expect("resident").raw);
                let g = me.noise_args(spec, 0, lines, l0, l1);
                k.noise(
                    &me.compute,
                    mean_filter,
                    raw,
                    valid,
                    t,
                    g,
                    n_shift,
                    work,
                    cnt_noise,
                )?;
                me.accumulate(&bufs.noise, work, (l1 - l0) * samples, n_cross, n_sum)
            };
            let data_chunk = |me: &Self, c: usize| -> Result<(), BackendError> {
                let (l0, l1) = me.lay.chunk(c);
                let raw = DevPtr::at(&me.resident.as_ref().expect("resident").raw, l0 * lb);
                let vp = if mask.is_some() {
                    Some(DevPtr::at(me.valid.as_ref().expect("mask"), l0 * samples))
                } else {
                    None
                };
                let npix = (l1 - l0) * samples;
                let px = Pixels {
                    raw,
                    valid: vp,
                    npix: npix as i64,
                    bands: b as i32,
                    t,
                };
                k.convert_shifted(&me.compute, px, d_shift, work)?;
                me.accumulate(&bufs.data, work, npix, d_cross, d_sum)
            };
            // The data rows of chunk c are processed as soon as chunk c has arrived, its noise residuals
            // once chunk c + 1 (the halo line below) has: measured on the H100 with the int16 fast paths,
            // the statistics of one 121-line chunk take ~0.5 ms against ~0.6 ms for its upload, and
            // processing chunk c − 1 only when chunk c had arrived left a whole chunk of work behind the
            // last upload (~0.9 ms); now only the last piece's data and the last two pieces' noise are.
            // Per-chunk timeline (device: data done, noise done; host: enqueued), logged at debug level.
            let trace = tracing::enabled!(target: "hypermnf::timing", tracing::Level::DEBUG);
            let mut data_evs: Vec<CudaEvent> = Vec::new();
            let mut noise_evs: Vec<CudaEvent> = Vec::new();
            let mut host_ms: Vec<f64> = Vec::new();
            let mark = |me: &Self, evs: &mut Vec<CudaEvent>| -> Result<(), BackendError> {
                if trace {
                    let e = event(&ctx, true)?;
                    e.record(&me.compute).map_err(cuda("cuEventRecord"))?;
                    evs.push(e);
                }
                Ok(())
            };
            for c in 0..n_chunks {
                self.ensure_chunk(c)?;
                if let Some((v, list, n_mask)) = &mask {
                    // Recomputed even when cached: the valid count of this pass comes from here.
                    self.mask_chunk_resident(c, *v, list, *n_mask, Some(cnt_valid))?;
                }
                data_chunk(self, c)?;
                mark(self, &mut data_evs)?;
                let valid = self.valid.as_ref().filter(|_| mask.is_some()).map(|v| DevPtr::of(v));
                if c > 0 {
                    noise_chunk(self, c - 1, valid)?;
                    mark(self, &mut noise_evs)?;
                }
                if trace {
                    host_ms.push(wall.elapsed().as_secs_f64() * 1e3);
                }
                monitor.tick(Stage::Statistics, c as f64 / n_chunks as f64)?;
            }
            ev_upload.record(&self.copy).map_err(cuda("cuEventRecord"))?;
            let valid = self.valid.as_ref().filter(|_| mask.is_some()).map(|v| DevPtr::of(v));
            noise_chunk(self, n_chunks - 1, valid)?;
            mark(self, &mut noise_evs)?;
            self.finish(&bufs.noise, n_cross, n_sum)?;
            // SAFETY: host_res lives until the synchronize calls below.
            unsafe {
                dtoh_async(
                    &mut host_res.as_mut_slice()[..noise_bytes],
                    bufs.results.ptr(),
                    &self.compute,
                )?;
                dtoh_async(
                    &mut host_res.as_mut_slice()[results_bytes..results_bytes + counters_bytes],
                    bufs.counters.ptr(),
                    &self.compute,
                )?;
            }
            ev_noise.record(&self.compute).map_err(cuda("cuEventRecord"))?;
            if mask.is_some() {
                self.mask_key = Some(key);
            }
            self.finish(&bufs.data, d_cross, d_sum)?;
            if trace {
                self.compute.synchronize().map_err(cuda("cuStreamSynchronize"))?;
                self.copy.synchronize().map_err(cuda("cuStreamSynchronize"))?;
                let res = self.resident.as_ref().expect("resident");
                for c in 0..n_chunks {
                    let (l0, l1) = self.lay.chunk(c);
                    tracing::debug!(
                        target: "hypermnf::timing",
                        chunk = c,
                        lines = l1 - l0,
                        arrived_ms = self.elapsed(&res.arrived[c]),
                        data_done_ms = self.elapsed(&data_evs[c]),
                        noise_done_ms = self.elapsed(&noise_evs[c]),
                        host_enqueued_ms = host_ms[c],
                        "statistics chunk (device: ms from the pass's first kernel; host: from its start)"
                    );
                }
            }
        } else {
            // Streamed: each chunk (with its halo lines) once, noise and data together.
            for c in 0..n_chunks {
                let (l0, l1) = self.lay.chunk(c);
                let (slot, b0, blines) = self.load_slot(c, 1)?;
                let slots = self.slots.as_ref().expect("streamed");
                let raw = DevPtr::of(&slots.raw[slot]);
                let vbuf = &slots.valid[slot];
                let valid = if let Some((v, list, n_mask)) = &mask {
                    // Halo lines are masked but not counted; the chunk's own lines are counted.
                    let (m, bl) = (*n_mask, b as i32);
                    let before = l0 - b0;
                    let after = blines - before - (l1 - l0);
                    k.pixel_mask(
                        &self.compute,
                        raw,
                        (before * samples) as i64,
                        bl,
                        t,
                        DevPtr::of(list),
                        m,
                        *v,
                        DevPtr::of(vbuf),
                        None,
                    )?;
                    k.pixel_mask(
                        &self.compute,
                        raw.skip(before * lb),
                        ((l1 - l0) * samples) as i64,
                        bl,
                        t,
                        DevPtr::of(list),
                        m,
                        *v,
                        DevPtr::at(vbuf, before * samples),
                        Some(cnt_valid),
                    )?;
                    let at = before + (l1 - l0);
                    k.pixel_mask(
                        &self.compute,
                        raw.skip(at * lb),
                        (after * samples) as i64,
                        bl,
                        t,
                        DevPtr::of(list),
                        m,
                        *v,
                        DevPtr::at(vbuf, at * samples),
                        None,
                    )?;
                    Some(DevPtr::of(vbuf))
                } else {
                    None
                };
                let g = self.noise_args(spec, b0, blines, l0, l1);
                k.noise(
                    &self.compute,
                    mean_filter,
                    raw,
                    valid,
                    t,
                    g,
                    n_shift,
                    work,
                    cnt_noise,
                )?;
                let npix = (l1 - l0) * samples;
                self.accumulate(&bufs.noise, work, npix, n_cross, n_sum)?;
                let before = l0 - b0;
                let vp = valid.map(|v| v.skip(before * samples));
                let px = Pixels {
                    raw: raw.skip(before * lb),
                    valid: vp,
                    npix: npix as i64,
                    bands: b as i32,
                    t,
                };
                k.convert_shifted(&self.compute, px, d_shift, work)?;
                self.accumulate(&bufs.data, work, npix, d_cross, d_sum)?;
                self.release_slot(slot)?;
                monitor.tick(Stage::Statistics, c as f64 / n_chunks as f64)?;
            }
            ev_upload.record(&self.copy).map_err(cuda("cuEventRecord"))?;
            self.finish(&bufs.noise, n_cross, n_sum)?;
            self.finish(&bufs.data, d_cross, d_sum)?;
            // SAFETY: as above.
            unsafe {
                dtoh_async(
                    &mut host_res.as_mut_slice()[..noise_bytes],
                    bufs.results.ptr(),
                    &self.compute,
                )?;
                dtoh_async(
                    &mut host_res.as_mut_slice()[results_bytes..results_bytes + counters_bytes],
                    bufs.counters.ptr(),
                    &self.compute,
                )?;
            }
            ev_noise.record(&self.compute).map_err(cuda("cuEventRecord"))?;
        }
        // SAFETY: as above.
        unsafe {
            dtoh_async(
                &mut host_res.as_mut_slice()[noise_bytes..results_bytes],
                bufs.results.at(noise_bytes),
                &self.compute,
            )?;
        }
        ev_data.record(&self.compute).map_err(cuda("cuEventRecord"))?;

        let t_enqueued = wall.elapsed();
        // Noise moments as soon as they are on the host.
        ev_noise.synchronize().map_err(cuda("cuEventSynchronize"))?;
        let t_noise = wall.elapsed();
        let all = host_res.as_slice();
        let counters: Vec<u64> = all[results_bytes..results_bytes + 24]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let noise_vals = f64s(&all[..noise_bytes]);
        let noise = moments_from(counters[1], &noise_shift, &noise_vals[b * b..], &noise_vals[..b * b]);
        let cb = Instant::now();
        on_noise(&noise);
        self.timeline.on_noise_wall_ms = cb.elapsed().as_secs_f64() * 1e3;

        ev_data.synchronize().map_err(cuda("cuEventSynchronize"))?;
        self.compute.synchronize().map_err(cuda("cuStreamSynchronize"))?;
        self.copy.synchronize().map_err(cuda("cuStreamSynchronize"))?;
        let all = host_res.as_slice();
        let data_vals = f64s(&all[noise_bytes..results_bytes]);
        let total = (lines * samples) as u64;
        let n_valid = if mask.is_some() { counters[0] } else { total };
        let data = moments_from(n_valid, &data_shift, &data_vals[b * b..], &data_vals[..b * b]);
        self.timeline.upload_done_ms = self.elapsed(&ev_upload);
        self.timeline.noise_done_ms = self.elapsed(&ev_noise);
        self.timeline.data_done_ms = self.elapsed(&ev_data);
        self.timeline.statistics_wall_ms = wall.elapsed().as_secs_f64() * 1e3;
        self.release_staging_once_uploaded();
        tracing::debug!(
            target: "hypermnf::timing",
            enqueued_ms = t_enqueued.as_secs_f64() * 1e3,
            noise_on_host_ms = t_noise.as_secs_f64() * 1e3,
            on_noise_ms = self.timeline.on_noise_wall_ms,
            total_ms = self.timeline.statistics_wall_ms,
            device_t0_to_data_ms = self.timeline.data_done_ms,
            "statistics wall"
        );
        self.store_timeline();
        monitor.tick(Stage::Statistics, 1.0)?;
        Ok(Statistics {
            data,
            noise,
            masked_pixels: total - n_valid,
        })
    }

    fn project(&mut self, projection: &Projection, out: &mut [f32], monitor: &Monitor) -> Result<(), BackendError> {
        self.project_into(projection, out, None, monitor)
    }

    fn project_streamed(
        &mut self,
        projection: &Projection,
        out: &mut [f32],
        done: &mut ChunkDone,
        monitor: &Monitor,
    ) -> Result<(), BackendError> {
        self.project_into(projection, out, Some(done), monitor)
    }

    fn use_shifts(&mut self, data: &[f64], noise: &[f64]) {
        self.set_shifts(data.to_vec(), noise.to_vec());
    }

    fn eigen_solver(&self) -> Option<&dyn crate::mnf::eigen::GeneralizedEigenSolver> {
        self.be
            .eigen
            .get()
            .map(|e| e as &dyn crate::mnf::eigen::GeneralizedEigenSolver)
    }

    fn denoise(
        &mut self,
        d: &Denoise,
        out: &mut [f32],
        monitor: &Monitor,
    ) -> Result<(), BackendError> {
        let u = d.bands_used.len();
        if u == 0 || d.means.len() != u || d.matrix.len() != u * u {
            return Err(BackendError::Invalid(format!(
                "inverse shapes disagree: {u} bands used, {} means, {} matrix entries",
                d.means.len(),
                d.matrix.len()
            )));
        }
        // The kernel computes out[c] = Σ_r T[r, c] (x_r − μ_r): T = Aᵀ.
        let mut t = vec![0f32; u * u];
        for r in 0..u {
            for q in 0..u {
                t[q * u + r] = d.matrix[r * u + q] as f32;
            }
        }
        let pass = OutputPass {
            used: &d.bands_used,
            means: &d.means,
            matrix: &t,
            k: u,
            stride: self.lay.bands,
            denoise: true,
        };
        self.output_pass(&pass, d.ignore_value, &d.mask_bands, out, None, monitor, Stage::Inverse)
    }

    /// The resident cube's buffer and its valid-pixel mask (the per-pass buffers go back to the pool).
    fn resident_bytes(&self) -> u64 {
        match &self.resident {
            Some(r) => (r.raw.size() + self.valid.as_ref().map_or(0, |v| v.size())) as u64,
            None => 0,
        }
    }

    /// A resident cube: issues the upload of every chunk that lies wholly within the first `lines`
    /// lines (the statistics pass then finds them uploaded, and only waits for their copies). A
    /// streamed cube keeps nothing between passes: nothing to do. Only a cube read from its file as
    /// it goes can follow a file being written: one whose samples were converted on the host when it
    /// was prepared (64-bit integers) holds what the file held then, and is refused.
    fn upload_arrived(&mut self, lines: usize) -> Result<(), BackendError> {
        if self.resident.is_none() {
            return Ok(());
        }
        // Lines arrive in order: a file of whole BIP lines, or BIL lines (reordered on the device as
        // they are sent). A BSQ file has no whole line before its last band.
        let by_lines = self.file.is_some() || self.native.as_ref().is_some_and(|n| n.storage == crate::cube::Interleave::Bil);
        if !by_lines {
            return Err(BackendError::Invalid("this cube is not read from its file line by line as it goes".into()));
        }
        self.bind()?;
        for c in 0..self.lay.chunks() {
            if self.lay.chunk(c).1 <= lines {
                self.issue_chunk(c)?;
            }
        }
        Ok(())
    }
}

/// One output pass: the projection (k components per pixel) or the inverse (all bands per pixel).
struct OutputPass<'a> {
    used: &'a [usize],
    means: &'a [f64],
    /// u × k, row-major, float32.
    matrix: &'a [f32],
    k: usize,
    /// Floats per output pixel (k, or all bands for the inverse).
    stride: usize,
    denoise: bool,
}

impl CudaCube<'_> {
    /// The projection, with `done` (if any) given each chunk of `out` once it is final.
    fn project_into(
        &mut self,
        projection: &Projection,
        out: &mut [f32],
        done: Option<&mut ChunkDone>,
        monitor: &Monitor,
    ) -> Result<(), BackendError> {
        let p = projection;
        let u = p.bands_used.len();
        let k = p.k;
        if k == 0 || u == 0 {
            return Err(BackendError::Invalid(
                "projection needs at least one band and one component".into(),
            ));
        }
        if p.means.len() != u || p.transform.len() != u * k {
            return Err(BackendError::Invalid(format!(
                "projection shapes disagree: {u} bands used, {} means, {} transform entries for k = {k}",
                p.means.len(),
                p.transform.len()
            )));
        }
        let t: Vec<f32> = p.transform.iter().map(|&v| v as f32).collect();
        let pass = OutputPass {
            used: &p.bands_used,
            means: &p.means,
            matrix: &t,
            k,
            stride: k,
            denoise: false,
        };
        self.output_pass(&pass, p.ignore_value, &p.mask_bands, out, done, monitor, Stage::Projection)
    }

    #[allow(clippy::too_many_arguments)]
    fn output_pass(
        &mut self,
        pass: &OutputPass,
        ignore: Option<f64>,
        mask_bands: &[usize],
        out: &mut [f32],
        mut done: Option<&mut ChunkDone>,
        monitor: &Monitor,
        stage: Stage,
    ) -> Result<(), BackendError> {
        self.bind()?;
        let wall = Instant::now();
        let (lines, samples, b) = (self.lay.lines, self.lay.samples, self.lay.bands);
        let (u, k, stride) = (pass.used.len(), pass.k, pass.stride);
        if out.len() != lines * samples * stride {
            return Err(BackendError::Invalid(format!(
                "output holds {} floats, expected {} ({lines} x {samples} x {stride})",
                out.len(),
                lines * samples * stride
            )));
        }
        if let Some(&bad) = pass.used.iter().find(|&&x| x >= b) {
            return Err(BackendError::Invalid(format!(
                "band {bad} is out of range (bands: {b})"
            )));
        }
        let ctx = self.be.ctx.clone();
        let kern = &self.be.kernels;
        let t = self.lay.t;
        let used: Vec<i32> = pass.used.iter().map(|&x| x as i32).collect();
        let used_dev = self.dev_from(&used)?;
        let means_dev = self.dev_from(pass.means)?;
        let unused: Vec<i32> = (0..b as i32).filter(|x| !used.contains(x)).collect();
        let unused_dev = self.dev_from(&unused)?;
        let cublas = self.be.route == Route::Cublas && !pass.denoise;
        // Components per pass of project_px and T padded with zero columns to a multiple of it.
        // The 2-byte integer fast path (project_w16): T' with T's rows at the used bands' positions,
        // integer centres m_b = round(μ_b), and the correction Σ_r T[r,c] (μ_r − m_r) in float64. Chunk rows
        // start on 16-byte boundaries wherever it applies (bands % 8 == 0, buffers from cuMemAlloc).
        let w16 = match kernels::w16_project_kp(k, b) {
            Some(kw) if !cublas && !pass.denoise && kern.wide && kernels::w16_eligible(t, b) && !self.be.constant_projection => {
                let mut t_full = vec![0f32; b * kw];
                let mut centre = vec![0i32; b];
                let mut corr = vec![0f64; kw];
                for (r, &band) in pass.used.iter().enumerate() {
                    let m = pass.means[r].round().clamp(i32::MIN as f64, i32::MAX as f64);
                    centre[band] = m as i32;
                    for c in 0..k {
                        let tv = pass.matrix[r * k + c];
                        t_full[band * kw + c] = tv;
                        corr[c] += tv as f64 * (pass.means[r] - m);
                    }
                }
                let corr: Vec<f32> = corr.iter().map(|&v| v as f32).collect();
                Some((kw, self.dev_from(&t_full)?, self.dev_from(&centre)?, self.dev_from(&corr)?))
            }
            _ => None,
        };
        let kp = PX_KP.iter().copied().find(|&p| p >= k).unwrap_or(16);
        let kpad = k.div_ceil(kp) * kp;
        // Otherwise the project_px kernels (T staged in shared memory, or in constant memory) where T fits.
        let use_px = w16.is_none() && !cublas && !pass.denoise && u * kpad <= MAX_CONST_T;
        let t_padded: Vec<f32> = if use_px {
            let mut v = vec![0f32; u * kpad];
            for r in 0..u {
                v[r * kpad..r * kpad + k].copy_from_slice(&pass.matrix[r * k..(r + 1) * k]);
            }
            v
        } else {
            Vec::new()
        };
        let t_dev = self.dev_from(pass.matrix)?;
        // T in shared memory (copied per block from device memory) where the kernels exist, else in
        // constant memory (see transform.cu).
        let smem_t = use_px && !kern.project_pxs.is_empty() && !self.be.constant_projection;
        let t_pad_dev = if smem_t {
            Some(self.dev_from(&t_padded)?)
        } else {
            None
        };
        let t_pad_ptr = t_pad_dev.as_ref().map(|d| DevPtr::of(d));
        // The constant-memory T is shared by every user of the module: hold the lock for the pass.
        let _const_guard = if use_px && !smem_t {
            let g = self.be.const_lock.lock().unwrap_or_else(|e| e.into_inner());
            let sym = self
                .be
                .kernels
                .module
                .get_global("c_transform", &self.compute)
                .map_err(cuda("cuModuleGetGlobal"))?;
            let (sym_ptr, _sync) = cudarc::driver::DevicePtr::device_ptr(&sym, &self.compute);
            // SAFETY: t_padded (u·kpad ≤ MAX_CONST_T floats) outlives the copy (synchronized below).
            unsafe {
                cudarc::driver::result::memcpy_htod_async(sym_ptr, &t_padded, self.compute.cu_stream())
                    .map_err(cuda("cuMemcpyHtoDAsync (constant memory)"))?;
            }
            Some(g)
        } else {
            None
        };
        let valid_resident = if self.resident.is_some() {
            self.ensure_resident_mask(ignore, mask_bands)?
        } else {
            None
        };
        let mask = if self.resident.is_none() {
            self.mask_setup(ignore, mask_bands)?
        } else {
            None
        };
        // Output chunks: a resident cube is read in larger pieces (about 8 MB of output each), which
        // keeps the per-chunk host work (waiting, copying out of pinned memory) few and large. (2 MB
        // pieces, tried on the H100, doubled the projection's time.)
        let out_lines = if self.resident.is_some() {
            ((8usize << 20) / (samples * stride * 4).max(1))
                .max(self.lay.chunk_lines)
                .min(lines)
        } else {
            self.lay.chunk_lines
        };
        let chunk_px = out_lines * samples;
        let out_bytes = chunk_px * stride * 4;
        let dev_out = [self.dev(out_bytes)?, self.dev(out_bytes)?];
        let xu = if cublas {
            Some(self.dev(chunk_px * u * 4)?)
        } else {
            None
        };
        // Page-locked output (registered with this backend, e.g. by the benchmark as PyTorch's pinned
        // output): the downloads write straight into it and nothing is copied on the host. Otherwise
        // through two pinned buffers, copied out in parallel.
        // SAFETY: reinterprets the f32 output as bytes for the range check only.
        let direct = is_registered(&self.be.registry, unsafe {
            std::slice::from_raw_parts(out.as_ptr() as *const u8, std::mem::size_of_val(out))
        });
        let mut host_out = if direct {
            None
        } else {
            Some([self.pinned(out_bytes)?, self.pinned(out_bytes)?])
        };
        tracing::debug!(target: "hypermnf::timing", setup_ms = wall.elapsed().as_secs_f64() * 1e3, "output pass set-up");
        let kernels_done = [event(&ctx, false)?, event(&ctx, false)?];
        let downloaded = [event(&ctx, true)?, event(&ctx, true)?];
        let ev_kernels = event(&ctx, true)?;
        self.t0.record(&self.compute).map_err(cuda("cuEventRecord"))?;
        let n_chunks = lines.div_ceil(out_lines);
        let lb = self.lay.line_bytes();
        let mut pending: [Option<(usize, usize)>; 2] = [None, None];

        // Copies a finished chunk from pinned memory into `out`.
        let drain =
            |host: Option<&PinnedBuf>, ev: &CudaEvent, range: (usize, usize), out: &mut [f32]| -> Result<(), BackendError> {
                ev.synchronize().map_err(cuda("cuEventSynchronize"))?;
                let Some(host) = host else { return Ok(()) };
                let (first, count) = range;
                let src = &host.as_slice()[..count * 4];
                let dst = &mut out[first..first + count];
                // SAFETY: any 4 bytes are a valid f32; align_to only reinterprets the aligned middle.
                let (head, floats, _) = unsafe { src.align_to::<f32>() };
                if head.is_empty() && floats.len() == count {
                    // Pinned buffers are page-aligned: a plain parallel memcpy, in 256 KB pieces so
                    // that an 8 MB chunk keeps all the host's cores busy (1 MB pieces used 8).
                    dst.par_chunks_mut(1 << 16)
                        .zip(floats.par_chunks(1 << 16))
                        .for_each(|(d, s)| d.copy_from_slice(s));
                } else {
                    dst.par_chunks_mut(1 << 18)
                        .zip(src.par_chunks(1 << 20))
                        .for_each(|(d, s)| {
                            for (o, c) in d.iter_mut().zip(s.chunks_exact(4)) {
                                *o = f32::from_ne_bytes(c.try_into().expect("4 bytes"));
                            }
                        });
                }
                Ok(())
            };

        // With `done`, a finished chunk goes to it straight from pinned memory (`out` is not written):
        // the caller's write of the chunk is then the only host work on it, while the device computes
        // the next. Copying each chunk into a fresh `out` first took most of the projection's ~4 ms on
        // the H100 host (page faults on new memory), with the write after it on the same thread.
        let hand_over = |host: Option<&PinnedBuf>,
                         ev: &CudaEvent,
                         range: (usize, usize),
                         out: &mut [f32],
                         done: &mut ChunkDone|
         -> Result<(), BackendError> {
            if let Some(host) = host {
                ev.synchronize().map_err(cuda("cuEventSynchronize"))?;
                // SAFETY: any 4 bytes are a valid f32; align_to only reinterprets the aligned middle.
                let (head, floats, _) = unsafe { host.as_slice()[..range.1 * 4].align_to::<f32>() };
                if head.is_empty() && floats.len() == range.1 {
                    return done(range.0, floats);
                }
            }
            drain(host, ev, range, out)?;
            done(range.0, &out[range.0..range.0 + range.1])
        };

        for c in 0..n_chunks {
            let (l0, l1) = (c * out_lines, ((c + 1) * out_lines).min(lines));
            let npix = (l1 - l0) * samples;
            let slot = c % 2;
            if let Some(range) = pending[slot].take() {
                let host = host_out.as_ref().map(|h| &*h[slot]);
                match done.as_mut() {
                    // While the device works on the next chunk (already queued).
                    Some(done) => hand_over(host, &downloaded[slot], range, out, &mut **done)?,
                    None => drain(host, &downloaded[slot], range, out)?,
                }
            }
            // The kernels may overwrite dev_out[slot] once its previous download is done.
            self.compute
                .wait(&downloaded[slot])
                .map_err(cuda("cuStreamWaitEvent"))?;
            let (raw, valid, stream_slot) = if self.resident.is_some() {
                for uc in self.lay.chunk_of(l0)..=self.lay.chunk_of(l1 - 1) {
                    self.ensure_chunk(uc)?;
                }
                let raw = DevPtr::at(&self.resident.as_ref().expect("resident").raw, l0 * lb);
                let v = valid_resident.map(|v| v.skip(l0 * samples));
                (raw, v, None)
            } else {
                let (s, b0, blines) = self.load_slot(c, 0)?;
                debug_assert_eq!((b0, blines), (l0, l1 - l0));
                let slots = self.slots.as_ref().expect("streamed");
                let raw = DevPtr::of(&slots.raw[s]);
                let v = if let Some((v, list, n_mask)) = &mask {
                    kern.pixel_mask(
                        &self.compute,
                        raw,
                        npix as i64,
                        b as i32,
                        t,
                        DevPtr::of(list),
                        *n_mask,
                        *v,
                        DevPtr::of(&slots.valid[s]),
                        None,
                    )?;
                    Some(DevPtr::of(&slots.valid[s]))
                } else {
                    None
                };
                (raw, v, Some(s))
            };
            let dst = DevPtr::of(&dev_out[slot]);
            let (used_p, means_p) = (DevPtr::of(&used_dev), DevPtr::of(&means_dev));
            let px = Pixels {
                raw,
                valid,
                npix: npix as i64,
                bands: b as i32,
                t,
            };
            if cublas {
                let xu = DevPtr::of(xu.as_ref().expect("allocated for cuBLAS"));
                kern.convert_centred_used(
                    &self.compute,
                    px,
                    used_p,
                    u as i32,
                    means_p,
                    xu,
                )?;
                let blas = self.be.blas.as_ref().expect("cuBLAS route has a handle");
                let blas = blas.lock().unwrap_or_else(|e| e.into_inner());
                blas.gemm_project(&self.compute, xu.addr(), npix, u, t_dev.ptr(), k, dst.addr())?;
            } else if let Some((kw, t_full, centre, corr)) = w16.as_ref() {
                debug_assert_eq!(raw.addr() % 16, 0, "project_w16 reads 16-byte words");
                kern.project_w16(
                    &self.compute,
                    *kw,
                    px,
                    DevPtr::of(t_full),
                    DevPtr::of(centre),
                    DevPtr::of(corr),
                    k as i32,
                    dst,
                )?;
            } else if use_px {
                kern.project_px(
                    &self.compute,
                    t_pad_ptr,
                    kp,
                    px,
                    used_p,
                    u as i32,
                    means_p,
                    kpad as i32,
                    k as i32,
                    dst,
                )?;
            } else {
                // The inverse writes band used[r] of each pixel and adds its mean back; the projection
                // writes the k components in order.
                let (out_col, add_mean) = if pass.denoise { (Some(used_p), Some(means_p)) } else { (None, None) };
                kern.project(
                    &self.compute,
                    px,
                    used_p,
                    u as i32,
                    means_p,
                    DevPtr::of(&t_dev),
                    k as i32,
                    dst,
                    stride as i32,
                    out_col,
                    add_mean,
                )?;
                if pass.denoise {
                    kern.pass_through(
                        &self.compute,
                        px,
                        DevPtr::of(&unused_dev),
                        unused.len() as i32,
                        dst,
                    )?;
                }
            }
            if let Some(s) = stream_slot {
                self.release_slot(s)?;
            }
            kernels_done[slot]
                .record(&self.compute)
                .map_err(cuda("cuEventRecord"))?;
            self.copy.wait(&kernels_done[slot]).map_err(cuda("cuStreamWaitEvent"))?;
            // SAFETY: host_out[slot] is only read after `downloaded[slot]` has passed (drain).
            match host_out.as_mut() {
                Some(h) => unsafe { dtoh_async(&mut h[slot].as_mut_slice()[..npix * stride * 4], dst.addr(), &self.copy)? },
                None => {
                    let first = l0 * samples * stride;
                    let part = &mut out[first..first + npix * stride];
                    // SAFETY: page-locked (checked above) and borrowed for the whole pass; nothing reads
                    // or writes it before `downloaded[slot]` has passed (drain, and the final drains).
                    let bytes = unsafe { std::slice::from_raw_parts_mut(part.as_mut_ptr() as *mut u8, part.len() * 4) };
                    unsafe { dtoh_async(bytes, dst.addr(), &self.copy)? }
                }
            }
            downloaded[slot].record(&self.copy).map_err(cuda("cuEventRecord"))?;
            pending[slot] = Some((l0 * samples * stride, npix * stride));
            monitor.tick(stage, c as f64 / n_chunks as f64)?;
        }
        ev_kernels.record(&self.compute).map_err(cuda("cuEventRecord"))?;
        for c in n_chunks.saturating_sub(2)..n_chunks {
            let slot = c % 2;
            if let Some(range) = pending[slot].take() {
                let host = host_out.as_ref().map(|h| &*h[slot]);
                match done.as_mut() {
                    Some(done) => hand_over(host, &downloaded[slot], range, out, &mut **done)?,
                    None => drain(host, &downloaded[slot], range, out)?,
                }
            }
        }
        self.compute.synchronize().map_err(cuda("cuStreamSynchronize"))?;
        self.copy.synchronize().map_err(cuda("cuStreamSynchronize"))?;
        self.release_staging_once_uploaded();
        if !pass.denoise {
            self.timeline.project_kernels_ms = self.elapsed(&ev_kernels);
            self.timeline.project_download_ms = self.elapsed(&downloaded[(n_chunks - 1) % 2]);
            self.timeline.project_wall_ms = wall.elapsed().as_secs_f64() * 1e3;
            tracing::debug!(
                target: "hypermnf::timing",
                kernels_ms = self.timeline.project_kernels_ms,
                download_ms = self.timeline.project_download_ms,
                wall_ms = self.timeline.project_wall_ms,
                chunks = n_chunks,
                "projection pass"
            );
            self.store_timeline();
        }
        monitor.tick(stage, 1.0)?;
        Ok(())
    }
}

impl Drop for CudaCube<'_> {
    fn drop(&mut self) {
        // Nothing may still read the staging buffers or the cube's memory when they go away.
        let _ = self.bind();
        let _ = self.copy.synchronize();
        let _ = self.compute.synchronize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cube::{ByteOrder, DataType};

    /// Shift samples stay inside the cube and come in runs of neighbouring pixels.
    #[test]
    fn shift_samples_are_runs_inside_the_range() {
        for (n, total) in [(256, 667_418), (256, 10), (64, 1), (64, 1000), (3, 2)] {
            let idx: Vec<usize> = (0..n).map(|i| sample_index(i, n, total)).collect();
            assert!(idx.iter().all(|&p| p < total), "{n} of {total}");
            if total >= n * 2 {
                assert_eq!(idx[1], idx[0] + 1);
                assert!(idx[n - 1] > total / 2, "{n} of {total}: samples spread over the range");
            }
        }
    }

    /// Chunks cover every line once, in order; a resident layout's last full chunk is cut in four.
    #[test]
    fn chunk_bounds_cover_the_lines_and_split_the_tail() {
        let t = RawType::of(DataType::I16, ByteOrder::Little);
        for (lines, chunk, split) in [(1087, 121, true), (1087, 121, false), (5, 2, true), (40, 40, true), (300, 64, true)] {
            let lay = Layout::new(lines, 7, 3, t, chunk, split);
            let mut next = 0;
            for c in 0..lay.chunks() {
                let (l0, l1) = lay.chunk(c);
                assert_eq!(l0, next, "{lines}/{chunk}: chunk {c} starts at {l0}");
                assert!(l1 > l0 && l1 - l0 <= chunk);
                for l in l0..l1 {
                    assert_eq!(lay.chunk_of(l), c);
                }
                next = l1;
            }
            assert_eq!(next, lines);
        }
        // 1087 = 8 × 121 + 119: the last full-size chunk (119 lines) becomes four of 29–30 lines.
        let lay = Layout::new(1087, 7, 3, t, 121, true);
        assert_eq!(lay.chunks(), 8 + 4);
        assert_eq!(lay.chunk(11), (1087 - 30, 1087));
        assert_eq!(Layout::new(1087, 7, 3, t, 121, false).chunks(), 9);
    }
}
