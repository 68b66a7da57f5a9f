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
//! float32, then in float64; `Moments::from_shifted_lower_sums` turns them into centred moments. When the
//! cube is resident the noise sums are finished and copied back first, so the host's noise
//! eigen-decomposition overlaps the data covariance. Where the pipeline asks for it
//! (`PreparedCube::solve_early`), the eigen step starts on the device from the finished sums, and the
//! host forms its moments while the device solves.

mod layout;
mod mask;
mod output_pass;
mod shifts;
mod statistics;
mod upload;

use std::borrow::Cow;
use std::time::Instant;

use cudarc::driver::{CudaEvent, CudaStream};

use super::device::{cuda, event, is_registered, pinned_class, DevBuf, PinnedBuf, Pooled, Sized_};
use super::kernels::RawType;
use super::CudaBackend;
use crate::backend::{BackendError, ChunkDone, PreparedCube};
use crate::cube::Cube;
use crate::mnf::stats::{Denoise, Moments, Projection, Statistics, StatsSpec};
use crate::mnf::Monitor;

use layout::Layout;
pub(crate) use shifts::sample_shifts;

/// Target size of one chunk's float32 work matrix (chunk pixels × bands × 4 bytes). Measured on the H100:
/// 32 MB chunks were slower than 64 MB at every size (more per-chunk host work).
const CHUNK_WORK_BYTES: usize = 64 << 20;
/// Device times of the last passes, in milliseconds from the start of each pass (CUDA events), plus
/// host wall times. Stages overlap, so these are points on a timeline, not a sum.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Timeline {
    pub resident: bool,
    pub chunks: usize,
    /// Statistics pass: where the copy stream was given its first upload. A page-locked resident cube
    /// queues its whole upload there, before the host's set-up, so this is negative (ms before the
    /// pass's first kernel), and `upload_done_ms` minus it is the upload's own time on the device.
    pub upload_start_ms: f32,
    /// Statistics pass: last upload finished (resident cubes upload during this pass).
    pub upload_done_ms: f32,
    /// Noise residuals and noise covariance finished (resident: before the data covariance starts).
    pub noise_done_ms: f32,
    /// Data covariance finished.
    pub data_done_ms: f32,
    /// The host saw the data covariance's results (on the device's clock, as `eigen_start_ms`).
    pub data_on_host_ms: f32,
    /// The eigen step started: on the device, where the solver's stream forms C_N at the noise sums'
    /// end (the early solve; potrf follows, beside the data sums' end); else where the host started it
    /// (an event recorded on the idle compute stream then). Minus `upload_done_ms`, the statistics'
    /// tail.
    pub eigen_start_ms: f32,
    /// Host wall time of the statistics pass, including the `on_noise` callback.
    pub statistics_wall_ms: f64,
    /// Host wall time spent inside `on_noise` (the host's noise eigen work, overlapped).
    pub on_noise_wall_ms: f64,
    /// Projection pass: kernels of the last chunk finished / last download finished.
    pub project_kernels_ms: f32,
    pub project_download_ms: f32,
    pub project_wall_ms: f64,
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
    /// The early solve the next statistics pass runs (the bands, the noise scale), as `solve_early`
    /// asked, and its answer until `early_solution` takes it.
    early_request: Option<(Vec<usize>, f64)>,
    early_answer: Option<crate::mnf::eigen::EarlySolution>,
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
        let mut chunk_lines = (be.chunk_work_bytes.unwrap_or(CHUNK_WORK_BYTES) / work_line.max(1)).clamp(1, lines);
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
            early_request: None,
            early_answer: None,
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

    /// Page-locked host memory from the backend's pool, at least `bytes` of it (see device::PINNED_MIN).
    fn pinned(&self, bytes: usize) -> Result<Pooled<'c, PinnedBuf>, BackendError> {
        let ctx = &self.be.ctx;
        self.be
            .pinned_pool
            .take(pinned_class(bytes), &[&self.compute, &self.copy], |n| PinnedBuf::alloc(ctx, n))
    }

    fn elapsed(&self, ev: &CudaEvent) -> f32 {
        self.t0.elapsed_ms(ev).unwrap_or(f32::NAN)
    }

    fn store_timeline(&self) {
        *self.be.last_timeline.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.timeline.clone());
    }
}

impl PreparedCube for CudaCube<'_> {
    fn statistics(
        &mut self,
        spec: &StatsSpec,
        on_noise: &mut dyn FnMut(&Moments),
        monitor: &Monitor,
    ) -> Result<Statistics, BackendError> {
        self.statistics_pass(spec, on_noise, monitor)
    }

    fn project(&mut self, projection: &Projection, out: &mut [f32], monitor: &Monitor) -> Result<(), BackendError> {
        self.project_into(projection, out, None, monitor)
    }

    fn eigen_starts(&mut self) {
        // The compute stream is idle after the statistics pass: the event is stamped at once.
        let stamped = event(&self.be.ctx, true).and_then(|ev| {
            ev.record(&self.compute).map_err(cuda("cuEventRecord"))?;
            ev.synchronize().map_err(cuda("cuEventSynchronize"))?;
            Ok(ev)
        });
        self.timeline.eigen_start_ms = stamped.map(|ev| self.elapsed(&ev)).unwrap_or(f32::NAN);
        self.store_timeline();
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

    fn solve_early(&mut self, bands: &[usize], noise_scale: f64) -> bool {
        // The band list goes to the kernel as i32.
        let fits = bands.iter().all(|&b| b < self.lay.bands) && i32::try_from(self.lay.bands).is_ok();
        if !self.be.early_solve || self.be.eigen.get().is_none() || bands.is_empty() || !fits {
            return false;
        }
        self.early_request = Some((bands.to_vec(), noise_scale));
        true
    }

    fn early_solution(&mut self) -> Option<crate::mnf::eigen::EarlySolution> {
        self.early_answer.take()
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
        self.denoise_into(d, out, monitor)
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

impl Drop for CudaCube<'_> {
    fn drop(&mut self) {
        // Nothing may still read the staging buffers or the cube's memory when they go away.
        let _ = self.bind();
        let _ = self.copy.synchronize();
        let _ = self.compute.synchronize();
    }
}
