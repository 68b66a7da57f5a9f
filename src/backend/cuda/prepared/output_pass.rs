//! The output passes: the projection onto the components and the inverse (denoising) transform.

use std::time::Instant;

use cudarc::driver::CudaEvent;
use rayon::prelude::*;

use super::CudaCube;
use crate::backend::cuda::device::{cuda, dtoh_async, event, is_registered, DevBuf, PinnedBuf, Pooled};
use crate::backend::cuda::kernels::{self, DevPtr, Pixels, MAX_CONST_T, PX_KP};
use crate::backend::cuda::Route;
use crate::backend::{BackendError, ChunkDone};
use crate::mnf::stats::{Denoise, Projection};
use crate::mnf::{Monitor, Stage};

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

/// The device operands of one output pass and the kernels they were prepared for.
struct Operands<'c> {
    used: Pooled<'c, DevBuf>,
    means: Pooled<'c, DevBuf>,
    /// The bands the inverse passes through unchanged.
    unused: Pooled<'c, DevBuf>,
    n_unused: usize,
    /// T (u × k, float32) in device memory.
    matrix: Pooled<'c, DevBuf>,
    cublas: bool,
    /// cuBLAS route: one chunk's used bands, centred (chunk pixels × u, float32).
    xu: Option<Pooled<'c, DevBuf>>,
    w16: Option<W16<'c>>,
    /// project_px: components per pass, T's padded width, and T padded in device memory (None: in
    /// constant memory).
    use_px: bool,
    kp: usize,
    kpad: usize,
    t_pad: Option<Pooled<'c, DevBuf>>,
}

/// The operands of the 2-byte integer fast path (see `OutputPass::w16_operands`).
struct W16<'c> {
    /// Components per pass.
    kp: usize,
    t: Pooled<'c, DevBuf>,
    centre: Pooled<'c, DevBuf>,
    corr: Pooled<'c, DevBuf>,
}

impl OutputPass<'_> {
    /// The matrix with zero columns added up to `kpad` per row (u × kpad).
    fn padded_matrix(&self, kpad: usize) -> Vec<f32> {
        let (u, k) = (self.used.len(), self.k);
        let mut v = vec![0f32; u * kpad];
        for r in 0..u {
            v[r * kpad..r * kpad + k].copy_from_slice(&self.matrix[r * k..(r + 1) * k]);
        }
        v
    }

    /// The operands of the 2-byte integer fast path (project_w16) for a cube of `bands` bands, `kw`
    /// components per pass: T' (bands × kw) with T's rows at the used bands' positions, the integer
    /// centres m_b = round(μ_b), and the correction Σ_r T[r,c] (μ_r − m_r) formed in float64.
    fn w16_operands(&self, kw: usize, bands: usize) -> (Vec<f32>, Vec<i32>, Vec<f32>) {
        let k = self.k;
        let mut t_full = vec![0f32; bands * kw];
        let mut centre = vec![0i32; bands];
        let mut corr = vec![0f64; kw];
        for (r, &band) in self.used.iter().enumerate() {
            let m = self.means[r].round().clamp(i32::MIN as f64, i32::MAX as f64);
            centre[band] = m as i32;
            for c in 0..k {
                let tv = self.matrix[r * k + c];
                t_full[band * kw + c] = tv;
                corr[c] += tv as f64 * (self.means[r] - m);
            }
        }
        (t_full, centre, corr.iter().map(|&v| v as f32).collect())
    }
}

impl CudaCube<'_> {
    /// The inverse transform of `PreparedCube::denoise`.
    pub(super) fn denoise_into(&mut self, d: &Denoise, out: &mut [f32], monitor: &Monitor) -> Result<(), BackendError> {
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

    /// The projection, with `done` (if any) given each chunk of `out` once it is final.
    pub(super) fn project_into(
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
                let (t_full, centre, corr) = pass.w16_operands(kw, b);
                Some(W16 {
                    kp: kw,
                    t: self.dev_from(&t_full)?,
                    centre: self.dev_from(&centre)?,
                    corr: self.dev_from(&corr)?,
                })
            }
            _ => None,
        };
        let kp = PX_KP.iter().copied().find(|&p| p >= k).unwrap_or(16);
        let kpad = k.div_ceil(kp) * kp;
        // Otherwise the project_px kernels (T staged in shared memory, or in constant memory) where T fits.
        let use_px = w16.is_none() && !cublas && !pass.denoise && u * kpad <= MAX_CONST_T;
        let t_padded: Vec<f32> = if use_px { pass.padded_matrix(kpad) } else { Vec::new() };
        let t_dev = self.dev_from(pass.matrix)?;
        // T in shared memory (copied per block from device memory) where the kernels exist, else in
        // constant memory (see transform.cu).
        let smem_t = use_px && !kern.project_pxs.is_empty() && !self.be.constant_projection;
        let t_pad_dev = if smem_t {
            Some(self.dev_from(&t_padded)?)
        } else {
            None
        };
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
        let ops = Operands {
            used: used_dev,
            means: means_dev,
            unused: unused_dev,
            n_unused: unused.len(),
            matrix: t_dev,
            cublas,
            xu,
            w16,
            use_px,
            kp,
            kpad,
            t_pad: t_pad_dev,
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

        for c in 0..n_chunks {
            let (l0, l1) = (c * out_lines, ((c + 1) * out_lines).min(lines));
            let npix = (l1 - l0) * samples;
            let slot = c % 2;
            if let Some(range) = pending[slot].take() {
                // While the device works on the next chunk (already queued).
                let host = host_out.as_ref().map(|h| &*h[slot]);
                deliver(host, &downloaded[slot], range, out, done.as_deref_mut())?;
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
            let px = Pixels {
                raw,
                valid,
                npix: npix as i64,
                bands: b as i32,
                t,
            };
            self.transform_chunk(pass, &ops, px, dst)?;
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
                deliver(host, &downloaded[slot], range, out, done.as_deref_mut())?;
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

    /// Launches the transform of one chunk (`px`) into `dst` with the kernels `ops` was prepared for:
    /// cuBLAS, the 2-byte integer fast path, project_px, or the generic kernel (and, for the inverse,
    /// the unused bands passed through).
    fn transform_chunk(&self, pass: &OutputPass, ops: &Operands, px: Pixels, dst: DevPtr<f32>) -> Result<(), BackendError> {
        let kern = &self.be.kernels;
        let (u, k, stride) = (pass.used.len(), pass.k, pass.stride);
        let npix = px.npix as usize;
        let (used_p, means_p) = (DevPtr::of(&ops.used), DevPtr::of(&ops.means));
        if ops.cublas {
            let xu = DevPtr::of(ops.xu.as_ref().expect("allocated for cuBLAS"));
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
            blas.gemm_project(&self.compute, xu.addr(), npix, u, ops.matrix.ptr(), k, dst.addr())?;
        } else if let Some(w) = ops.w16.as_ref() {
            debug_assert_eq!(px.raw.addr() % 16, 0, "project_w16 reads 16-byte words");
            kern.project_w16(
                &self.compute,
                w.kp,
                px,
                DevPtr::of(&w.t),
                DevPtr::of(&w.centre),
                DevPtr::of(&w.corr),
                k as i32,
                dst,
            )?;
        } else if ops.use_px {
            kern.project_px(
                &self.compute,
                ops.t_pad.as_ref().map(|d| DevPtr::of(d)),
                ops.kp,
                px,
                used_p,
                u as i32,
                means_p,
                ops.kpad as i32,
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
                DevPtr::of(&ops.matrix),
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
                    DevPtr::of(&ops.unused),
                    ops.n_unused as i32,
                    dst,
                )?;
            }
        }
        Ok(())
    }
}

/// A finished chunk (`range`: first float and count of `out`), once `ev` has passed: to `done` if
/// given, else into `out`.
fn deliver(
    host: Option<&PinnedBuf>,
    ev: &CudaEvent,
    range: (usize, usize),
    out: &mut [f32],
    done: Option<&mut ChunkDone>,
) -> Result<(), BackendError> {
    match done {
        Some(done) => hand_over(host, ev, range, out, done),
        None => copy_out(host, ev, range, out),
    }
}

/// Copies a finished chunk from pinned memory into `out`.
fn copy_out(host: Option<&PinnedBuf>, ev: &CudaEvent, range: (usize, usize), out: &mut [f32]) -> Result<(), BackendError> {
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
}

/// With `done`, a finished chunk goes to it straight from pinned memory (`out` is not written):
/// the caller's write of the chunk is then the only host work on it, while the device computes
/// the next. Copying each chunk into a fresh `out` first took most of the projection's ~4 ms on
/// the H100 host (page faults on new memory), with the write after it on the same thread.
fn hand_over(
    host: Option<&PinnedBuf>,
    ev: &CudaEvent,
    range: (usize, usize),
    out: &mut [f32],
    done: &mut ChunkDone,
) -> Result<(), BackendError> {
    if let Some(host) = host {
        ev.synchronize().map_err(cuda("cuEventSynchronize"))?;
        // SAFETY: any 4 bytes are a valid f32; align_to only reinterprets the aligned middle.
        let (head, floats, _) = unsafe { host.as_slice()[..range.1 * 4].align_to::<f32>() };
        if head.is_empty() && floats.len() == range.1 {
            return done(range.0, floats);
        }
    }
    copy_out(host, ev, range, out)?;
    done(range.0, &out[range.0..range.0 + range.1])
}
