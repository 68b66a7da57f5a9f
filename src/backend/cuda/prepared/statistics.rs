//! The statistics pass: noise residuals and the data and noise covariance sums, on the device.

use std::time::Instant;

use cudarc::driver::CudaEvent;

use super::{sample_shifts, CudaCube, MaskKey};
use crate::backend::cuda::device::{cuda, dtoh_async, event, DevBuf, PinnedBuf, Pooled};
use crate::backend::cuda::kernels::{CovParts, DevPtr, FormedPart, NoiseArgs, Pixels, COV_TILE};
use crate::backend::cuda::Route;
use crate::backend::{check_window, BackendError};
use crate::mnf::eigen::{EarlySolution, GeneralizedEigenSolver};
use crate::mnf::stats::{Moments, Statistics, StatsSpec};
use crate::mnf::{Monitor, NoiseEstimator, Stage};

/// Bytes of the statistics counters (valid pixels, noise residuals, unused).
const COUNTERS_BYTES: usize = 3 * 8;

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

/// The mask of a pass as `CudaCube::mask_setup` gives it: the ignore value, the mask band list on
/// the device, and its length.
type Mask<'c> = (f64, Pooled<'c, DevBuf>, i32);

/// One statistics pass: what it computes, where its kernels read and write on the device, and the
/// events it records.
struct Pass<'p, 'c> {
    spec: &'p StatsSpec,
    mean_filter: bool,
    bufs: &'p StatBufs<'c>,
    mask: Option<&'p Mask<'c>>,
    n_cross: DevPtr<f64>,
    n_sum: DevPtr<f64>,
    d_cross: DevPtr<f64>,
    d_sum: DevPtr<f64>,
    cnt_valid: DevPtr<u64>,
    cnt_noise: DevPtr<u64>,
    d_shift: DevPtr<f64>,
    n_shift: DevPtr<f64>,
    work: DevPtr<f32>,
    /// Bytes of the noise results (the first of the results); all results; the counters follow them.
    noise_bytes: usize,
    results_bytes: usize,
    /// Recorded on the compute stream once the noise results' download is queued.
    ev_noise: CudaEvent,
    /// Recorded on the copy stream after the last upload.
    ev_upload: CudaEvent,
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

    /// Queues on the compute stream the copies of the noise results (the first `noise_bytes` of the
    /// results) and of the counters into `host` (the counters at `results_bytes`).
    ///
    /// # Safety
    /// `host` must stay allocated and untouched until the compute stream has run the copies.
    unsafe fn download_noise(
        &self,
        bufs: &StatBufs,
        host: &mut PinnedBuf,
        noise_bytes: usize,
        results_bytes: usize,
    ) -> Result<(), BackendError> {
        // SAFETY: the caller keeps `host` until the stream has run the copies.
        unsafe {
            dtoh_async(&mut host.as_mut_slice()[..noise_bytes], bufs.results.ptr(), &self.compute)?;
            dtoh_async(
                &mut host.as_mut_slice()[results_bytes..results_bytes + COUNTERS_BYTES],
                bufs.counters.ptr(),
                &self.compute,
            )
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

impl CudaCube<'_> {
    /// The statistics of `PreparedCube::statistics`.
    pub(super) fn statistics_pass(
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
        let ev_up_start = event(&self.be.ctx, true)?;
        ev_up_start.record(&self.copy).map_err(cuda("cuEventRecord"))?;
        if self.resident.is_some() && self.registered {
            // Page-locked input: queue the whole upload now (the copy engine works through it in
            // order), so that the host's set-up below (shifts from sampled pixels, buffers) overlaps
            // it instead of delaying its start. Pageable input goes through two staging buffers
            // filled by the host, so it is issued chunk by chunk in the loop.
            self.issue_all_chunks()?;
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
        // The buffers live until the end of the pass (the stream is synchronized before it returns).
        let d_shift = self.dev_from(&data_shift)?;
        let n_shift = self.dev_from(&noise_shift)?;
        // The early solve's request (PreparedCube::solve_early), its band list on the device.
        let early = self.early_request.take();
        self.early_answer = None;
        let d_used = match &early {
            Some((bands, _)) => Some(self.dev_from(&bands.iter().map(|&b| b as i32).collect::<Vec<i32>>())?),
            None => None,
        };
        let bufs = self.stat_bufs()?;
        let work = self.dev(self.lay.chunk_pixels_max() * b * 4)?;
        let t_bufs = wall.elapsed();
        let off = StatBufs::offsets(b);
        // Pooled buffers may be larger than asked: sizes come from the layout, never from .bytes().
        let results_bytes = 2 * (b * b + b) * 8;
        let mut host_res = self.pinned(results_bytes + COUNTERS_BYTES)?;
        let pass = Pass {
            spec,
            mean_filter,
            bufs: &bufs,
            mask: mask.as_ref(),
            n_cross: DevPtr::at(&bufs.results, off[0]),
            n_sum: DevPtr::at(&bufs.results, off[1]),
            d_cross: DevPtr::at(&bufs.results, off[2]),
            d_sum: DevPtr::at(&bufs.results, off[3]),
            cnt_valid: DevPtr::at(&bufs.counters, 0),
            cnt_noise: DevPtr::at(&bufs.counters, 8),
            d_shift: DevPtr::of(&d_shift),
            n_shift: DevPtr::of(&n_shift),
            work: DevPtr::of(&work),
            noise_bytes: off[2],
            results_bytes,
            ev_noise: event(&ctx, true)?,
            ev_upload: event(&ctx, true)?,
        };
        let ev_data = event(&ctx, true)?;
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
        let noise_bytes = pass.noise_bytes;
        if self.resident.is_some() {
            self.resident_sums(&pass, &mut host_res, wall, monitor)?;
        } else {
            self.streamed_sums(&pass, &mut host_res, monitor)?;
        }
        let Pass { ev_noise, ev_upload, .. } = pass;
        // Where the sums are finished: the early solve starts there, beside their download.
        let ev_sums = match &early {
            Some(_) => {
                let e = event(&ctx, false)?;
                e.record(&self.compute).map_err(cuda("cuEventRecord"))?;
                Some(e)
            }
            None => None,
        };
        // SAFETY: host_res lives until the synchronize calls below.
        unsafe {
            dtoh_async(
                &mut host_res.as_mut_slice()[noise_bytes..results_bytes],
                bufs.results.at(noise_bytes),
                &self.compute,
            )?;
        }
        ev_data.record(&self.compute).map_err(cuda("cuEventRecord"))?;

        let t_enqueued = wall.elapsed();
        let total = (lines * samples) as u64;
        let masked = mask.is_some();
        // The host's part: the noise moments as soon as they are on the host (and `on_noise`), then
        // the data moments. Run while the device solves, where it solves early.
        let be = self.be;
        let mut host: Option<Result<HostMoments, BackendError>> = None;
        let mut host_part = || {
            host = Some((|| {
                ev_noise.synchronize().map_err(cuda("cuEventSynchronize"))?;
                let t_noise = wall.elapsed();
                let all = host_res.as_slice();
                let counters: Vec<u64> = all[results_bytes..results_bytes + COUNTERS_BYTES]
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .collect();
                let noise = moments_from(counters[1], &noise_shift, &all[..noise_bytes]);
                let cb = Instant::now();
                on_noise(&noise);
                self.timeline.on_noise_wall_ms = cb.elapsed().as_secs_f64() * 1e3;
                let t_on_noise = wall.elapsed();
                ev_data.synchronize().map_err(cuda("cuEventSynchronize"))?;
                let t_data = wall.elapsed();
                self.compute.synchronize().map_err(cuda("cuStreamSynchronize"))?;
                self.copy.synchronize().map_err(cuda("cuStreamSynchronize"))?;
                let all = host_res.as_slice();
                let n_valid = if masked { counters[0] } else { total };
                let data = moments_from(n_valid, &data_shift, &all[noise_bytes..results_bytes]);
                Ok(HostMoments { noise, data, n_valid, t_noise, t_on_noise, t_data, t_moments: wall.elapsed() })
            })());
        };
        let mut early_start = None;
        let early_answer = match (early, be.eigen.get(), &ev_sums, &d_used) {
            (Some((bands, scale)), Some(solver), Some(after), Some(used)) => {
                let u = bands.len();
                let start = event(&ctx, true)?;
                let (results, counters) = (&bufs.results, &bufs.counters);
                // `start`: where C_N is formed, at the noise sums' end: the eigen step starts there,
                // and factors C_N while the data's sums are finished.
                let fill = |stream: &cudarc::driver::CudaStream, part: FormedPart, dst: u64| -> Result<(), BackendError> {
                    if part == FormedPart::Noise {
                        start.record(stream).map_err(cuda("cuEventRecord"))?;
                    }
                    be.kernels.covariances_from_sums(
                        stream,
                        b,
                        DevPtr::at(results, off[0]),
                        DevPtr::at(results, off[2]),
                        DevPtr::at(counters, 0),
                        masked,
                        total,
                        DevPtr::of(used),
                        u,
                        scale,
                        part,
                        DevPtr::raw(dst, u * u),
                    )
                };
                let answer = solver.solve_formed_on_device(u, (&ev_noise, after), &fill, &mut host_part);
                early_start = Some(start);
                Some((bands, answer, solver.name(), wall.elapsed()))
            }
            _ => {
                host_part();
                None
            }
        };
        let HostMoments { noise, data, n_valid, t_noise, t_on_noise, t_data, t_moments } = host.expect("the host's part ran")?;
        if let Some((bands, answer, solver, t_solved)) = early_answer {
            self.early_answer = Some(EarlySolution {
                bands,
                answer,
                solver,
                wait_ms: t_solved.saturating_sub(t_moments).as_secs_f64() * 1e3,
            });
        }
        self.timeline.upload_start_ms = self.elapsed(&ev_up_start);
        self.timeline.upload_done_ms = self.elapsed(&ev_upload);
        self.timeline.noise_done_ms = self.elapsed(&ev_noise);
        self.timeline.data_done_ms = self.elapsed(&ev_data);
        self.timeline.statistics_wall_ms = wall.elapsed().as_secs_f64() * 1e3;
        if let Some(start) = &early_start {
            // The eigen step started on the device: the statistics' tail ends there.
            self.timeline.eigen_start_ms = self.elapsed(start);
        }
        self.release_staging_once_uploaded();
        // The host's points on the device's clock: an event recorded on the idle compute stream is
        // stamped at once, which ties the two clocks together here.
        let t_end = wall.elapsed();
        let d_end = event(&ctx, true)
            .and_then(|ev| {
                ev.record(&self.compute).map_err(cuda("cuEventRecord"))?;
                ev.synchronize().map_err(cuda("cuEventSynchronize"))?;
                Ok(self.elapsed(&ev))
            })
            .unwrap_or(f32::NAN);
        let on_device = |t: std::time::Duration| d_end - (t_end - t).as_secs_f32() * 1e3;
        self.timeline.data_on_host_ms = on_device(t_data);
        tracing::debug!(
            target: "hypermnf::timing",
            enqueued_ms = t_enqueued.as_secs_f64() * 1e3,
            noise_on_host_ms = t_noise.as_secs_f64() * 1e3,
            on_noise_ms = self.timeline.on_noise_wall_ms,
            total_ms = self.timeline.statistics_wall_ms,
            device_t0_to_data_ms = self.timeline.data_done_ms,
            // On the device's clock (ms from the pass's first kernel):
            noise_on_host_dev_ms = on_device(t_noise),
            on_noise_returned_dev_ms = on_device(t_on_noise),
            data_on_host_dev_ms = self.timeline.data_on_host_ms,
            moments_done_dev_ms = on_device(t_moments),
            returns_dev_ms = on_device(t_end),
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

    /// Resident cube: upload and compute interleaved, chunk by chunk. Once chunk c has arrived, its
    /// data rows are processed, and the noise residuals of every line whose neighbours have arrived
    /// (all but its last line, whose halo line below is in chunk c + 1). So when the last piece lands,
    /// only that piece's own rows are left: the statistics' tail after the upload is one small piece
    /// (see `Layout::new`), where it used to be the noise of the last two pieces (0.68 ms on the H100
    /// at 1x). Measured on the H100 with the int16 fast paths, the statistics of one 121-line chunk
    /// take ~0.5 ms against ~0.6 ms for its upload, so the kernels keep up with the copies. The last
    /// piece's noise goes first and its results are downloaded before the data covariance is finished,
    /// so that the host's noise work overlaps it.
    fn resident_sums(
        &mut self,
        p: &Pass,
        host_res: &mut PinnedBuf,
        wall: Instant,
        monitor: &Monitor,
    ) -> Result<(), BackendError> {
        let (lines, samples) = (self.lay.lines, self.lay.samples);
        let n_chunks = self.lay.chunks();
        let key = MaskKey {
            ignore: p.spec.ignore_value.map(f64::to_bits),
            bands: p.spec.mask_bands.clone(),
        };
        if p.mask.is_some() && self.valid.is_none() {
            self.valid = Some(self.dev(lines * samples)?);
        }
        // Per-chunk timeline (device: data done, noise done; host: enqueued), logged at debug level.
        let trace = tracing::enabled!(target: "hypermnf::timing", tracing::Level::DEBUG);
        let mut data_evs: Vec<CudaEvent> = Vec::new();
        let mut noise_evs: Vec<CudaEvent> = Vec::new();
        let mut host_ms: Vec<f64> = Vec::new();
        let mark = |me: &Self, evs: &mut Vec<CudaEvent>| -> Result<(), BackendError> {
            if trace {
                let e = event(&me.be.ctx, true)?;
                e.record(&me.compute).map_err(cuda("cuEventRecord"))?;
                evs.push(e);
            }
            Ok(())
        };
        // Noise residuals are computed for lines noise_from.. once their halo line below is in.
        let mut noise_from = 0;
        for c in 0..n_chunks {
            self.ensure_chunk(c)?;
            if let Some((v, list, n_mask)) = p.mask {
                // Recomputed even when cached: the valid count of this pass comes from here.
                self.mask_chunk_resident(c, *v, list, *n_mask, Some(p.cnt_valid))?;
            }
            let valid = self.valid.as_ref().filter(|_| p.mask.is_some()).map(|v| DevPtr::of(v));
            let last = c + 1 == n_chunks;
            let noise_to = if last { lines } else { self.lay.chunk(c).1 - 1 };
            if !last {
                self.resident_data_chunk(p, c)?;
                mark(self, &mut data_evs)?;
                self.resident_noise_lines(p, noise_from, noise_to, valid)?;
                mark(self, &mut noise_evs)?;
            } else {
                p.ev_upload.record(&self.copy).map_err(cuda("cuEventRecord"))?;
                self.resident_noise_lines(p, noise_from, noise_to, valid)?;
                mark(self, &mut noise_evs)?;
                self.finish(&p.bufs.noise, p.n_cross, p.n_sum)?;
                // SAFETY: host_res lives until the caller's synchronize calls.
                unsafe { self.download_noise(p.bufs, host_res, p.noise_bytes, p.results_bytes)? };
                p.ev_noise.record(&self.compute).map_err(cuda("cuEventRecord"))?;
                self.resident_data_chunk(p, c)?;
                mark(self, &mut data_evs)?;
            }
            noise_from = noise_to;
            if trace {
                host_ms.push(wall.elapsed().as_secs_f64() * 1e3);
            }
            monitor.tick(Stage::Statistics, c as f64 / n_chunks as f64)?;
        }
        if p.mask.is_some() {
            self.mask_key = Some(key);
        }
        self.finish(&p.bufs.data, p.d_cross, p.d_sum)?;
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
        Ok(())
    }

    /// Resident cube: the noise residuals of lines l0..l1 and their sums, in runs that fit the work
    /// matrix (a chunk's lines; the last run of a cube whose last chunk is whole is one line longer).
    fn resident_noise_lines(&self, p: &Pass, l0: usize, l1: usize, valid: Option<DevPtr<u8>>) -> Result<(), BackendError> {
        let raw = DevPtr::of(&self.resident.as_ref().expect("resident").raw);
        let step = self.lay.chunk_lines.max(1);
        for a in (l0..l1).step_by(step) {
            let z = (a + step).min(l1);
            let g = self.noise_args(p.spec, 0, self.lay.lines, a, z);
            self.be.kernels.noise(
                &self.compute,
                p.mean_filter,
                raw,
                valid,
                self.lay.t,
                g,
                p.n_shift,
                p.work,
                p.cnt_noise,
            )?;
            self.accumulate(&p.bufs.noise, p.work, (z - a) * self.lay.samples, p.n_cross, p.n_sum)?;
        }
        Ok(())
    }

    /// Resident cube: the shifted data rows of chunk c and their sums.
    fn resident_data_chunk(&self, p: &Pass, c: usize) -> Result<(), BackendError> {
        let samples = self.lay.samples;
        let (l0, l1) = self.lay.chunk(c);
        let raw = DevPtr::at(&self.resident.as_ref().expect("resident").raw, l0 * self.lay.line_bytes());
        let vp = if p.mask.is_some() {
            Some(DevPtr::at(self.valid.as_ref().expect("mask"), l0 * samples))
        } else {
            None
        };
        let npix = (l1 - l0) * samples;
        let px = Pixels {
            raw,
            valid: vp,
            npix: npix as i64,
            bands: self.lay.bands as i32,
            t: self.lay.t,
        };
        self.be.kernels.convert_shifted(&self.compute, px, p.d_shift, p.work)?;
        self.accumulate(&p.bufs.data, p.work, npix, p.d_cross, p.d_sum)
    }

    /// Streamed cube: each chunk (with its halo lines) once, noise and data together.
    fn streamed_sums(&mut self, p: &Pass, host_res: &mut PinnedBuf, monitor: &Monitor) -> Result<(), BackendError> {
        let (samples, b, t) = (self.lay.samples, self.lay.bands, self.lay.t);
        let lb = self.lay.line_bytes();
        let n_chunks = self.lay.chunks();
        let k = &self.be.kernels;
        for c in 0..n_chunks {
            let (l0, l1) = self.lay.chunk(c);
            let (slot, b0, blines) = self.load_slot(c, 1)?;
            let slots = self.slots.as_ref().expect("streamed");
            let raw = DevPtr::of(&slots.raw[slot]);
            let vbuf = &slots.valid[slot];
            let valid = if let Some((v, list, n_mask)) = p.mask {
                let before = l0 - b0;
                let lines = [before, l1 - l0, blines - before - (l1 - l0)];
                self.mask_slot(raw, vbuf, lines, (*v, list, *n_mask), p.cnt_valid)?;
                Some(DevPtr::of(vbuf))
            } else {
                None
            };
            let g = self.noise_args(p.spec, b0, blines, l0, l1);
            k.noise(
                &self.compute,
                p.mean_filter,
                raw,
                valid,
                t,
                g,
                p.n_shift,
                p.work,
                p.cnt_noise,
            )?;
            let npix = (l1 - l0) * samples;
            self.accumulate(&p.bufs.noise, p.work, npix, p.n_cross, p.n_sum)?;
            let before = l0 - b0;
            let vp = valid.map(|v| v.skip(before * samples));
            let px = Pixels {
                raw: raw.skip(before * lb),
                valid: vp,
                npix: npix as i64,
                bands: b as i32,
                t,
            };
            k.convert_shifted(&self.compute, px, p.d_shift, p.work)?;
            self.accumulate(&p.bufs.data, p.work, npix, p.d_cross, p.d_sum)?;
            self.release_slot(slot)?;
            monitor.tick(Stage::Statistics, c as f64 / n_chunks as f64)?;
        }
        p.ev_upload.record(&self.copy).map_err(cuda("cuEventRecord"))?;
        self.finish(&p.bufs.noise, p.n_cross, p.n_sum)?;
        self.finish(&p.bufs.data, p.d_cross, p.d_sum)?;
        // SAFETY: host_res lives until the caller's synchronize calls.
        unsafe { self.download_noise(p.bufs, host_res, p.noise_bytes, p.results_bytes)? };
        p.ev_noise.record(&self.compute).map_err(cuda("cuEventRecord"))?;
        Ok(())
    }
}

/// The host's part of a statistics pass: both moments (the data's over `n_valid` pixels), and when
/// (from the pass's start) the noise results were on the host, `on_noise` returned, the data results
/// were on the host and the moments were done.
struct HostMoments {
    noise: Moments,
    data: Moments,
    n_valid: u64,
    t_noise: std::time::Duration,
    t_on_noise: std::time::Duration,
    t_data: std::time::Duration,
    t_moments: std::time::Duration,
}

/// Moments from the device's float64 results as downloaded (`bytes`: the lower triangle of Σddᵀ,
/// B × B row-major, then the B band sums), read where they lie: the host's part of the statistics'
/// tail is on the critical path (copying, mirroring and converting them first took ~0.2 ms of it at
/// 224 bands on the H100 host).
fn moments_from(n: u64, shift: &[f64], bytes: &[u8]) -> Moments {
    let b = shift.len();
    let at = |k: usize| f64::from_le_bytes(bytes[8 * k..8 * k + 8].try_into().expect("8 bytes"));
    let sum: Vec<f64> = (0..b).map(|i| at(b * b + i)).collect();
    Moments::from_shifted_lower_sums(n, shift, &sum, |i, j| at(i * b + j))
}
