//! The compiled kernels and one typed launcher per kernel, so that argument lists are written once and
//! match kernels/*.cu. Device memory is passed as raw addresses (u64); 0 means "none" where the kernel
//! accepts a null pointer.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg};

use super::compile::{self, PtxOrigin};
use super::device::cuda;
use crate::backend::BackendError;
use crate::cube::{ByteOrder, DataType};

/// Tile edge of cov_lower (CT in covariance.cu).
pub(crate) const COV_TILE: usize = 64;
/// Floats of T that fit the constant-memory array (MAX_CONST_T in transform.cu).
pub(crate) const MAX_CONST_T: usize = 16320;
const THREADS: u32 = 256;
/// Components per pass of the project_px kernels (template instances in transform.cu).
pub(crate) const PX_KP: [usize; 6] = [1, 2, 4, 8, 12, 16];

/// How the kernels read the raw samples of one cube.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawType {
    /// DT_* code of common.cuh.
    pub code: i32,
    /// 1 when the samples must be byte-swapped (big-endian file on this little-endian device).
    pub swap: i32,
    /// Bytes per sample as uploaded.
    pub size: usize,
}

impl RawType {
    /// The device-side type of a cube. i64 / u64 have no device conversion: the host widens them to
    /// f64 (little-endian) before upload, so they read as f64.
    pub(crate) fn of(dtype: DataType, order: ByteOrder) -> RawType {
        let swap = (order == ByteOrder::Big && dtype.size() > 1) as i32;
        match dtype {
            DataType::U8 => RawType {
                code: 0,
                swap: 0,
                size: 1,
            },
            DataType::I16 => RawType { code: 1, swap, size: 2 },
            DataType::U16 => RawType { code: 2, swap, size: 2 },
            DataType::I32 => RawType { code: 3, swap, size: 4 },
            DataType::U32 => RawType { code: 4, swap, size: 4 },
            DataType::F32 => RawType { code: 5, swap, size: 4 },
            DataType::F64 => RawType { code: 6, swap, size: 8 },
            DataType::I64 | DataType::U64 => RawType {
                code: 6,
                swap: 0,
                size: 8,
            },
        }
    }
    /// True when the host must convert the cube before upload (i64 / u64).
    pub(crate) fn host_converted(dtype: DataType) -> bool {
        matches!(dtype, DataType::I64 | DataType::U64)
    }
}

/// Geometry passed to the noise kernels: which lines the raw buffer holds and which to compute.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NoiseArgs {
    pub lines: i32,
    pub samples: i32,
    pub bands: i32,
    pub buf_l0: i32,
    pub buf_lines: i32,
    pub out_l0: i32,
    pub out_l1: i32,
    /// x0, x1, y0, y1 of the noise window (the whole image when none was given).
    pub window: [i32; 4],
}

pub(crate) struct Kernels {
    pub module: Arc<CudaModule>,
    pub sms: u32,
    pub origin: PtxOrigin,
    /// Covariance on the float64 tensor cores (compute capability 8.0 and later), else float64 FMAs.
    pub use_dmma: bool,
    pixel_mask: CudaFunction,
    noise_mean_filter: CudaFunction,
    noise_shift_difference: CudaFunction,
    convert_shifted: CudaFunction,
    col_sums: CudaFunction,
    cov_lower: CudaFunction,
    cov_lower_dmma: CudaFunction,
    /// The covariance on sm_90's mma.m16n8k4 (compute capability 9.0 and later; see covariance.cu).
    pub(crate) cov_lower_m16: Option<CudaFunction>,
    reduce_parts: CudaFunction,
    widen_f64: CudaFunction,
    /// project_px{KP} (T in constant memory), by KP.
    project_px: Vec<(usize, CudaFunction)>,
    /// project_pxs{KP} (T staged in shared memory), by KP; empty where the opt-in to large dynamic
    /// shared memory failed.
    pub(crate) project_pxs: Vec<(usize, CudaFunction)>,
    project_global: CudaFunction,
    pass_through: CudaFunction,
    convert_centred_used: CudaFunction,
    /// noise_mean_filter_w16{s,u}: the mean filter for 2-byte integer cubes with bands % 8 == 0.
    noise_mean_filter_w16: [CudaFunction; 2],
    /// project_w16{s,u}{KP}: the projection for the same cubes, by KP (a multiple of 4).
    project_w16: Vec<(usize, [CudaFunction; 2])>,
    /// Use the 2-byte integer fast paths where a cube qualifies (false: the generic kernels only; tests
    /// compare both).
    pub(crate) wide: bool,
}

/// Components per pass of the project_w16 kernels (instances in transform.cu).
pub(crate) const W16_KP: [usize; 4] = [4, 8, 12, 16];
/// Output lines per thread of noise_mean_filter_w16 (W16_LINES in noise.cu).
const W16_LINES: u32 = 16;
/// Dynamic shared memory the project_w16 kernels may take without an opt-in.
const W16_SMEM_MAX: usize = 48 * 1024;

/// Whether the 2-byte integer fast paths apply to a cube of this type and band count: int16 / uint16
/// (either byte order), pixel rows a whole number of 16-byte words.
pub(crate) fn w16_eligible(t: RawType, bands: usize) -> bool {
    (t.code == 1 || t.code == 2) && bands % 8 == 0 && bands > 0
}

/// The projection fast path's components per pass for k components, if it applies (k ≤ 16 and T'
/// plus the centres fit the default dynamic shared memory).
pub(crate) fn w16_project_kp(k: usize, bands: usize) -> Option<usize> {
    let kp = W16_KP.iter().copied().find(|&p| p >= k)?;
    (k > 0 && bands * (kp + 1) * 4 <= W16_SMEM_MAX).then_some(kp)
}

fn grid_for(n: u64, sms: u32) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as u64).clamp(1, sms as u64 * 16) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Kernels {
    /// Compiles (or loads from the PTX cache) and loads the module on `ctx`.
    pub(crate) fn load(ctx: &Arc<CudaContext>) -> Result<Kernels, BackendError> {
        let (major, minor) = ctx.compute_capability().map_err(cuda("cuDeviceGetAttribute"))?;
        let arch = format!("compute_{major}{minor}");
        let sms = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(cuda("cuDeviceGetAttribute"))?
            .max(1) as u32;
        let (ptx, origin, path) = compile::load_ptx(&arch)?;
        let module = match ctx.load_module(ptx) {
            Ok(m) => m,
            Err(e) if origin == PtxOrigin::Cache => {
                // A stale or damaged cache entry: compile afresh.
                tracing::warn!("cached PTX did not load ({e}); recompiling");
                if let Some(p) = &path {
                    compile::forget(p);
                }
                let (ptx, _, _) = compile::load_ptx(&arch)?;
                ctx.load_module(ptx).map_err(cuda("cuModuleLoadData"))?
            }
            Err(e) => return Err(BackendError::Cuda(format!("cuModuleLoadData: {e}"))),
        };
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| BackendError::Cuda(format!("kernel {name}: {e}")))
        };
        Ok(Kernels {
            sms,
            origin,
            pixel_mask: f("pixel_mask")?,
            noise_mean_filter: f("noise_mean_filter")?,
            noise_shift_difference: f("noise_shift_difference")?,
            convert_shifted: f("convert_shifted")?,
            col_sums: f("col_sums")?,
            cov_lower: f("cov_lower")?,
            cov_lower_dmma: f("cov_lower_dmma")?,
            use_dmma: major >= 8,
            cov_lower_m16: if major >= 9 {
                Some(f("cov_lower_m16")?)
            } else {
                None
            },
            reduce_parts: f("reduce_parts")?,
            widen_f64: f("widen_f64")?,
            project_px: PX_KP
                .iter()
                .map(|&kp| Ok((kp, f(&format!("project_px{kp}"))?)))
                .collect::<Result<_, BackendError>>()?,
            project_pxs: {
                let mut v = Vec::new();
                for &kp in PX_KP.iter() {
                    let func = f(&format!("project_pxs{kp}"))?;
                    // T takes up to MAX_CONST_T floats of dynamic shared memory, past the default 48 KB.
                    let opt_in = func.set_attribute(
                        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        (MAX_CONST_T * 4) as i32,
                    );
                    match opt_in {
                        Ok(()) => v.push((kp, func)),
                        Err(e) => {
                            tracing::info!("projection with T in shared memory unavailable ({e}); using constant memory");
                            v.clear();
                            break;
                        }
                    }
                }
                v
            },
            project_global: f("project_global")?,
            pass_through: f("pass_through")?,
            convert_centred_used: f("convert_centred_used")?,
            noise_mean_filter_w16: [f("noise_mean_filter_w16s")?, f("noise_mean_filter_w16u")?],
            project_w16: W16_KP
                .iter()
                .map(|&kp| Ok((kp, [f(&format!("project_w16s{kp}"))?, f(&format!("project_w16u{kp}"))?])))
                .collect::<Result<_, BackendError>>()?,
            wide: true,
            module,
        })
    }

    /// valid[p] for `npix` pixels from `raw`; adds the valid count to `count` (0: not counted).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pixel_mask(
        &self,
        s: &CudaStream,
        raw: u64,
        npix: i64,
        bands: i32,
        t: RawType,
        mask_bands: u64,
        n_mask: i32,
        ignore: f64,
        valid: u64,
        count: u64,
    ) -> Result<(), BackendError> {
        if npix == 0 {
            return Ok(());
        }
        let cfg = grid_for(npix as u64 * 32, self.sms);
        // SAFETY: the argument list matches pixel_mask in common.cuh; buffers are sized by the caller.
        unsafe {
            s.launch_builder(&self.pixel_mask)
                .arg(&raw)
                .arg(&npix)
                .arg(&bands)
                .arg(&t.code)
                .arg(&t.swap)
                .arg(&mask_bands)
                .arg(&n_mask)
                .arg(&ignore)
                .arg(&valid)
                .arg(&count)
                .launch(cfg)
        }
        .map(|_| ())
        .map_err(cuda("launch pixel_mask"))
    }

    /// Noise residual rows for lines out_l0..out_l1 into `out`, minus `shift`; `count` += residuals.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn noise(
        &self,
        s: &CudaStream,
        mean_filter: bool,
        raw: u64,
        valid: u64,
        t: RawType,
        g: NoiseArgs,
        shift: u64,
        out: u64,
        count: u64,
    ) -> Result<(), BackendError> {
        let rows = (g.out_l1 - g.out_l0).max(0) as u64;
        if rows == 0 {
            return Ok(());
        }
        // The 2-byte integer fast path needs 16-byte aligned rows in and out.
        let wide = mean_filter
            && self.wide
            && w16_eligible(t, g.bands as usize)
            && raw % 16 == 0
            && out % 16 == 0;
        let cfg = if wide {
            let threads = g.samples as u64 * (g.bands as u64 / 8);
            LaunchConfig {
                grid_dim: (threads.div_ceil(THREADS as u64) as u32, (rows as u32).div_ceil(W16_LINES), 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            }
        } else if mean_filter {
            LaunchConfig {
                grid_dim: ((g.samples as u32).div_ceil(16), (rows as u32).div_ceil(16), 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            }
        } else {
            grid_for(rows * g.samples as u64 * g.bands as u64, self.sms)
        };
        let f = if wide {
            &self.noise_mean_filter_w16[(t.code == 2) as usize]
        } else if mean_filter {
            &self.noise_mean_filter
        } else {
            &self.noise_shift_difference
        };
        let [wx0, wx1, wy0, wy1] = g.window;
        // SAFETY: matches noise_mean_filter / noise_shift_difference / noise_mean_filter_w16{s,u} in noise.cu
        // (one argument list).
        unsafe {
            s.launch_builder(f)
                .arg(&raw)
                .arg(&valid)
                .arg(&t.code)
                .arg(&t.swap)
                .arg(&g.lines)
                .arg(&g.samples)
                .arg(&g.bands)
                .arg(&g.buf_l0)
                .arg(&g.buf_lines)
                .arg(&g.out_l0)
                .arg(&g.out_l1)
                .arg(&wx0)
                .arg(&wx1)
                .arg(&wy0)
                .arg(&wy1)
                .arg(&shift)
                .arg(&out)
                .arg(&count)
                .launch(cfg)
        }
        .map(|_| ())
        .map_err(cuda("launch noise kernel"))
    }

    /// out = raw − shift (float32), zero rows at invalid pixels.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn convert_shifted(
        &self,
        s: &CudaStream,
        raw: u64,
        valid: u64,
        npix: i64,
        bands: i32,
        t: RawType,
        shift: u64,
        out: u64,
    ) -> Result<(), BackendError> {
        if npix == 0 {
            return Ok(());
        }
        let cfg = grid_for(npix as u64 * bands as u64, self.sms);
        // SAFETY: matches convert_shifted in covariance.cu.
        unsafe {
            s.launch_builder(&self.convert_shifted)
                .arg(&raw)
                .arg(&valid)
                .arg(&npix)
                .arg(&bands)
                .arg(&t.code)
                .arg(&t.swap)
                .arg(&shift)
                .arg(&out)
                .launch(cfg)
        }
        .map(|_| ())
        .map_err(cuda("launch convert_shifted"))
    }

    /// sums[b] += Σ_p d[p, b] (float64 atomics, one per block and band).
    pub(crate) fn col_sums(
        &self,
        s: &CudaStream,
        d: u64,
        npix: i64,
        bands: i32,
        sums: u64,
    ) -> Result<(), BackendError> {
        if npix == 0 {
            return Ok(());
        }
        let per_block: i64 = 256;
        let blocks = (npix as u64).div_ceil(per_block as u64) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches col_sums in covariance.cu.
        unsafe {
            s.launch_builder(&self.col_sums)
                .arg(&d)
                .arg(&npix)
                .arg(&bands)
                .arg(&per_block)
                .arg(&sums)
                .launch(cfg)
        }
        .map(|_| ())
        .map_err(cuda("launch col_sums"))
    }

    /// Adds the rows of `d` into the per-split partial sums (see CovParts).
    pub(crate) fn cov_lower(&self, s: &CudaStream, d: u64, npix: i64, parts: &CovParts) -> Result<(), BackendError> {
        if npix == 0 {
            return Ok(());
        }
        // The m16 kernel stages 32 pixels per step and runs 128 threads; the others 16 and 256.
        let (step, threads) = if self.cov_lower_m16.is_some() {
            (32, 128)
        } else {
            (16, THREADS)
        };
        let per_split = (npix as u64).div_ceil(parts.splits as u64).div_ceil(step) * step;
        let per_split = per_split.max(step) as i64;
        let bands = parts.bands as i32;
        let (pairs, tiles) = (parts.pairs as i32, parts.tiles as i32);
        let cfg = LaunchConfig {
            grid_dim: (parts.pairs as u32, parts.splits as u32, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let (pc, ps) = (parts.cross.ptr(), parts.sum.ptr());
        let f = if let Some(m16) = &self.cov_lower_m16 {
            m16
        } else if self.use_dmma {
            &self.cov_lower_dmma
        } else {
            &self.cov_lower
        };
        // SAFETY: matches cov_lower / cov_lower_dmma / cov_lower_m16 in covariance.cu; parts holds splits × pairs tiles.
        unsafe {
            s.launch_builder(f)
                .arg(&d)
                .arg(&npix)
                .arg(&bands)
                .arg(&per_split)
                .arg(&pairs)
                .arg(&tiles)
                .arg(&pc)
                .arg(&ps)
                .launch(cfg)
        }
        .map(|_| ())
        .map_err(cuda("launch cov_lower"))
    }

    /// c (B × B, lower triangle) and sums (B) from the partial sums.
    pub(crate) fn reduce_parts(&self, s: &CudaStream, parts: &CovParts, c: u64, sums: u64) -> Result<(), BackendError> {
        let cfg = grid_for((parts.pairs * COV_TILE * COV_TILE) as u64, self.sms);
        let (splits, pairs, tiles, bands) = (
            parts.splits as i32,
            parts.pairs as i32,
            parts.tiles as i32,
            parts.bands as i32,
        );
        let (pc, ps) = (parts.cross.ptr(), parts.sum.ptr());
        // SAFETY: matches reduce_parts in covariance.cu.
        unsafe {
            s.launch_builder(&self.reduce_parts)
                .arg(&pc)
                .arg(&ps)
                .arg(&splits)
                .arg(&pairs)
                .arg(&tiles)
                .arg(&bands)
                .arg(&c)
                .arg(&sums)
                .launch(cfg)
        }
        .map(|_| ())
        .map_err(cuda("launch reduce_parts"))
    }

    /// out (float64) = in (float32), n values.
    pub(crate) fn widen_f64(&self, s: &CudaStream, input: u64, n: i64, out: u64) -> Result<(), BackendError> {
        if n == 0 {
            return Ok(());
        }
        let cfg = grid_for(n as u64, self.sms);
        // SAFETY: matches widen_f64 in covariance.cu.
        unsafe {
            s.launch_builder(&self.widen_f64)
                .arg(&input)
                .arg(&n)
                .arg(&out)
                .launch(cfg)
        }
        .map(|_| ())
        .map_err(cuda("launch widen_f64"))
    }

    /// The projection / inverse kernel with T in global memory (project_global in transform.cu).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn project(
        &self,
        s: &CudaStream,
        raw: u64,
        valid: u64,
        npix: i64,
        bands: i32,
        t: RawType,
        used: u64,
        n_used: i32,
        means: u64,
        t_global: u64,
        k: i32,
        out: u64,
        out_stride: i32,
        out_col: u64,
        add_mean: u64,
    ) -> Result<(), BackendError> {
        if npix == 0 {
            return Ok(());
        }
        let blocks = (npix as u64).div_ceil(32).clamp(1, self.sms as u64 * 16) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches project_global in transform.cu.
        unsafe {
            s.launch_builder(&self.project_global)
                .arg(&raw)
                .arg(&valid)
                .arg(&npix)
                .arg(&bands)
                .arg(&t.code)
                .arg(&t.swap)
                .arg(&used)
                .arg(&n_used)
                .arg(&means)
                .arg(&t_global)
                .arg(&k)
                .arg(&out)
                .arg(&out_stride)
                .arg(&out_col)
                .arg(&add_mean)
                .launch(cfg)
        }
        .map(|_| ())
        .map_err(cuda("launch project_global"))
    }

    /// The projection with T (u × kpad, zero-padded) `kp` components per pass: from shared memory when
    /// `t_pad` (the same T in device memory) is given, else from constant memory (already filled).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn project_px(
        &self,
        s: &CudaStream,
        t_pad: Option<u64>,
        kp: usize,
        raw: u64,
        valid: u64,
        npix: i64,
        bands: i32,
        t: RawType,
        used: u64,
        n_used: i32,
        means: u64,
        kpad: i32,
        k: i32,
        out: u64,
    ) -> Result<(), BackendError> {
        if npix == 0 {
            return Ok(());
        }
        let list = if t_pad.is_some() {
            &self.project_pxs
        } else {
            &self.project_px
        };
        let f = &list
            .iter()
            .find(|(p, _)| *p == kp)
            .ok_or_else(|| {
                BackendError::Invalid(format!("no projection kernel for {kp} components per pass"))
            })?
            .1;
        let blocks = (npix as u64)
            .div_ceil(THREADS as u64)
            .clamp(1, self.sms as u64 * 8) as u32;
        let t_ptr = t_pad.unwrap_or(0);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: if t_pad.is_some() {
                (n_used as u32) * (kpad as u32) * 4
            } else {
                0
            },
        };
        // SAFETY: matches project_px{KP} / project_pxs{KP} in transform.cu (u × kpad floats of T at
        // t_pad, that many bytes of dynamic shared memory).
        unsafe {
            s.launch_builder(f)
                .arg(&raw)
                .arg(&valid)
                .arg(&npix)
                .arg(&bands)
                .arg(&t.code)
                .arg(&t.swap)
                .arg(&used)
                .arg(&n_used)
                .arg(&means)
                .arg(&kpad)
                .arg(&k)
                .arg(&out)
                .arg(&t_ptr)
                .launch(cfg)
        }
        .map(|_| ())
        .map_err(cuda("launch project_px"))
    }

    /// The projection fast path (project_w16{s,u}{KP} in transform.cu): T' (bands × kp floats, T's rows
    /// at the used bands' positions, zero elsewhere), integer centres (bands) and the centring
    /// correction (kp floats), all in device memory. The caller checked [`w16_eligible`] and
    /// [`w16_project_kp`] and that `raw` is 16-byte aligned.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn project_w16(
        &self,
        s: &CudaStream,
        kp: usize,
        raw: u64,
        valid: u64,
        npix: i64,
        bands: i32,
        t: RawType,
        t_full: u64,
        centre: u64,
        corr: u64,
        k: i32,
        out: u64,
    ) -> Result<(), BackendError> {
        if npix == 0 {
            return Ok(());
        }
        let f = &self
            .project_w16
            .iter()
            .find(|(p, _)| *p == kp)
            .ok_or_else(|| BackendError::Invalid(format!("no projection kernel for {kp} components per pass")))?
            .1[(t.code == 2) as usize];
        let blocks = (npix as u64).div_ceil(THREADS as u64).clamp(1, self.sms as u64 * 8) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: (bands as u32) * (kp as u32 + 1) * 4,
        };
        // SAFETY: matches project_w16{s,u}{KP} in transform.cu; bands · (kp + 1) · 4 bytes of dynamic
        // shared memory (≤ 48 KB, checked by w16_project_kp).
        unsafe {
            s.launch_builder(f)
                .arg(&raw)
                .arg(&valid)
                .arg(&npix)
                .arg(&bands)
                .arg(&t.swap)
                .arg(&t_full)
                .arg(&centre)
                .arg(&corr)
                .arg(&k)
                .arg(&out)
                .launch(cfg)
        }
        .map(|_| ())
        .map_err(cuda("launch project_w16"))
    }

    /// out[p, cols[j]] = float32(x) (NaN at invalid pixels).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pass_through(
        &self,
        s: &CudaStream,
        raw: u64,
        valid: u64,
        npix: i64,
        bands: i32,
        t: RawType,
        cols: u64,
        n_cols: i32,
        out: u64,
    ) -> Result<(), BackendError> {
        if npix == 0 || n_cols == 0 {
            return Ok(());
        }
        let cfg = grid_for(npix as u64 * n_cols as u64, self.sms);
        // SAFETY: matches pass_through in transform.cu.
        unsafe {
            s.launch_builder(&self.pass_through)
                .arg(&raw)
                .arg(&valid)
                .arg(&npix)
                .arg(&bands)
                .arg(&t.code)
                .arg(&t.swap)
                .arg(&cols)
                .arg(&n_cols)
                .arg(&out)
                .launch(cfg)
        }
        .map(|_| ())
        .map_err(cuda("launch pass_through"))
    }

    /// out = x_used − means (float32, npix × n_used), NaN rows at invalid pixels.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn convert_centred_used(
        &self,
        s: &CudaStream,
        raw: u64,
        valid: u64,
        npix: i64,
        bands: i32,
        t: RawType,
        used: u64,
        n_used: i32,
        means: u64,
        out: u64,
    ) -> Result<(), BackendError> {
        if npix == 0 {
            return Ok(());
        }
        let cfg = grid_for(npix as u64 * n_used as u64, self.sms);
        // SAFETY: matches convert_centred_used in transform.cu.
        unsafe {
            s.launch_builder(&self.convert_centred_used)
                .arg(&raw)
                .arg(&valid)
                .arg(&npix)
                .arg(&bands)
                .arg(&t.code)
                .arg(&t.swap)
                .arg(&used)
                .arg(&n_used)
                .arg(&means)
                .arg(&out)
                .launch(cfg)
        }
        .map(|_| ())
        .map_err(cuda("launch convert_centred_used"))
    }
}

/// The per-split partial sums of cov_lower for one covariance: splits × pairs tiles of 64 × 64 float64
/// and splits × tiles × 64 band sums, zeroed at the start of a pass and reduced at its end.
pub(crate) struct CovParts<'c> {
    pub bands: usize,
    pub tiles: usize,
    pub pairs: usize,
    pub splits: usize,
    pub cross: super::device::Pooled<'c, super::device::DevBuf>,
    pub sum: super::device::Pooled<'c, super::device::DevBuf>,
}

impl CovParts<'_> {
    /// (tiles, pairs, splits): one full wave of blocks (`blocks_per_sm` resident per multiprocessor:
    /// 3 for the tensor-core kernel at 80 registers per thread, 2 for the FMA kernel at 128), so that
    /// no partial second wave leaves most of the GPU idle.
    pub(crate) fn shape(bands: usize, sms: u32, blocks_per_sm: usize) -> (usize, usize, usize) {
        let tiles = bands.div_ceil(COV_TILE);
        let pairs = tiles * (tiles + 1) / 2;
        let splits = (sms as usize * blocks_per_sm / pairs).max(1);
        (tiles, pairs, splits)
    }
    pub(crate) fn zero(&self, s: &CudaStream) -> Result<(), BackendError> {
        self.cross.zero_async(s)?;
        self.sum.zero_async(s)
    }
}
