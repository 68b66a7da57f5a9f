//! The compiled kernels and one typed launcher per kernel, so that argument lists are written once and
//! match kernels/*.cu. Device memory is passed as typed pointers ([`DevPtr`]), `None` where the kernel
//! accepts a null pointer; every launch goes through [`Kernels::launch`].

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg};

use super::compile::{self, PtxOrigin};
use super::device::{cuda, DevBuf, Sized_};
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

/// `len` elements of `T` in device memory from address `addr`: what a kernel's `T*` parameter takes.
/// It records an address and an extent, not a borrow: the caller keeps the buffer alive until the
/// stream has run the kernels that use it, as for any device address (see `Kernels::launch`).
pub(crate) struct DevPtr<T> {
    addr: u64,
    len: usize,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for DevPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevPtr<T> {}

impl<T> std::fmt::Debug for DevPtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevPtr<{}>({:#x}, {})", std::any::type_name::<T>(), self.addr, self.len)
    }
}

impl<T> DevPtr<T> {
    /// All of `buf` as elements of T (a pooled buffer may be larger than was asked for).
    pub(crate) fn of(buf: &DevBuf) -> Self {
        DevPtr {
            addr: buf.ptr(),
            len: buf.size() / size_of::<T>(),
            _t: PhantomData,
        }
    }
    /// `buf` from byte `offset` on, as elements of T.
    pub(crate) fn at(buf: &DevBuf, offset: usize) -> Self {
        debug_assert_eq!(offset % size_of::<T>(), 0, "element-aligned offset");
        Self::of(buf).skip(offset / size_of::<T>())
    }
    /// The elements from `n` on.
    pub(crate) fn skip(self, n: usize) -> Self {
        debug_assert!(n <= self.len, "{self:?} has no element {n}");
        DevPtr {
            addr: self.addr + (n * size_of::<T>()) as u64,
            len: self.len - n,
            _t: PhantomData,
        }
    }
    pub(crate) fn addr(self) -> u64 {
        self.addr
    }
    /// `len` elements at device address `addr` (a place inside a buffer the caller holds).
    pub(crate) fn raw(addr: u64, len: usize) -> Self {
        DevPtr { addr, len, _t: PhantomData }
    }
}

/// Where a launch may check, in debug builds, that a buffer holds what the kernel will touch.
trait Extent {
    fn holds(self, n: usize);
}
impl<T> Extent for DevPtr<T> {
    fn holds(self, n: usize) {
        debug_assert!(n <= self.len, "{self:?} is shorter than the {n} elements the kernel uses");
    }
}
/// None is a null pointer: the kernel does not touch it.
impl<T> Extent for Option<DevPtr<T>> {
    fn holds(self, n: usize) {
        if let Some(p) = self {
            p.holds(n);
        }
    }
}

/// `npix` pixels of `bands` samples of type `t` from `raw`, with their valid flags (None: all valid): what
/// the conversion and projection kernels read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pixels {
    pub raw: DevPtr<u8>,
    pub valid: Option<DevPtr<u8>>,
    pub npix: i64,
    pub bands: i32,
    pub t: RawType,
}

impl Pixels {
    fn check(&self) {
        self.raw.holds(self.npix as usize * self.bands as usize * self.t.size);
        self.valid.holds(self.npix as usize);
    }
    /// These kernels' arguments: raw, valid, npix, bands, dtype, swap, then `rest`.
    fn args(&self, rest: &[Arg]) -> Vec<Arg> {
        let mut v = vec![
            self.raw.into(),
            self.valid.into(),
            self.npix.into(),
            self.bands.into(),
            self.t.code.into(),
            self.t.swap.into(),
        ];
        v.extend_from_slice(rest);
        v
    }
}

/// One kernel argument, by value as the kernel takes it (a pointer as its address, null for None).
#[derive(Debug, Clone, Copy)]
enum Arg {
    I32(i32),
    I64(i64),
    F64(f64),
    Ptr(u64),
}
impl From<i32> for Arg {
    fn from(v: i32) -> Arg {
        Arg::I32(v)
    }
}
impl From<i64> for Arg {
    fn from(v: i64) -> Arg {
        Arg::I64(v)
    }
}
impl From<f64> for Arg {
    fn from(v: f64) -> Arg {
        Arg::F64(v)
    }
}
impl<T> From<DevPtr<T>> for Arg {
    fn from(p: DevPtr<T>) -> Arg {
        Arg::Ptr(p.addr)
    }
}
impl<T> From<Option<DevPtr<T>>> for Arg {
    fn from(p: Option<DevPtr<T>>) -> Arg {
        Arg::Ptr(p.map_or(0, |p| p.addr))
    }
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
    /// reorder_to_bip{1,2,4,8}, by element size.
    reorder_to_bip: [CudaFunction; 4],
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
            reorder_to_bip: [f("reorder_to_bip1")?, f("reorder_to_bip2")?, f("reorder_to_bip4")?, f("reorder_to_bip8")?],
            wide: true,
            module,
        })
    }

    /// Launches `f` on `s` with `cfg` and `args`, the kernel's parameters in order; `what` names the
    /// kernel in the error. Every launch of this module's kernels goes through here.
    fn launch(
        &self,
        s: &CudaStream,
        f: &CudaFunction,
        cfg: LaunchConfig,
        args: &[Arg],
        what: &'static str,
    ) -> Result<(), BackendError> {
        let mut b = s.launch_builder(f);
        for a in args {
            match a {
                Arg::I32(v) => b.arg(v),
                Arg::I64(v) => b.arg(v),
                Arg::F64(v) => b.arg(v),
                Arg::Ptr(v) => b.arg(v),
            };
        }
        // SAFETY: the one kernel launch of this module. What the wrappers below guarantee, and their
        // callers with them: `args` has the number, order and types of `f`'s parameters in kernels/*.cu
        // (i32 for int, i64 for i64, f64 for double, a DevPtr<T> or None for a T*, which the kernel
        // accepts as null only where the wrapper takes an Option); the memory the kernel touches under
        // `cfg` lies inside the DevPtrs passed (their lengths are checked in debug builds where the
        // wrapper knows the extent); `cfg`'s dynamic shared memory is what the kernel expects and within
        // its limit; and that memory stays allocated, and no other work writes what the kernel reads or
        // touches what it writes, until `s` has run the kernel (the backend orders its streams with events).
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(cuda(what))
    }

    /// Transposes `groups` matrices of `rows` x `cols` elements of `size` bytes from `src` into `dst`
    /// (kernels/reorder.cu): a block of BIL lines (rows = bands, cols = samples, a group per line) or
    /// of BSQ lines (rows = bands, cols = pixels, one group) into BIP. `src` and `dst` must not overlap.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reorder_to_bip(
        &self,
        s: &CudaStream,
        src: DevPtr<u8>,
        dst: DevPtr<u8>,
        groups: usize,
        rows: usize,
        cols: usize,
        size: usize,
    ) -> Result<(), BackendError> {
        let bytes = groups * rows * cols * size;
        if bytes == 0 {
            return Ok(());
        }
        src.holds(bytes);
        dst.holds(bytes);
        let f = match size {
            1 => &self.reorder_to_bip[0],
            2 => &self.reorder_to_bip[1],
            4 => &self.reorder_to_bip[2],
            8 => &self.reorder_to_bip[3],
            other => return Err(BackendError::Invalid(format!("no reorder kernel for {other}-byte samples"))),
        };
        let tiles = |n: usize| n.div_ceil(32) as u64;
        let cfg = LaunchConfig {
            grid_dim: (tiles(cols).min(1 << 20) as u32, tiles(rows).min(65535) as u32, (groups as u64).min(65535) as u32),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
        let args = [src.into(), dst.into(), (groups as i64).into(), (rows as i32).into(), (cols as i64).into()];
        self.launch(s, f, cfg, &args, "launch reorder_to_bip")
    }

    /// valid[p] for `npix` pixels from `raw`; adds the valid count to `count` (None: not counted).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pixel_mask(
        &self,
        s: &CudaStream,
        raw: DevPtr<u8>,
        npix: i64,
        bands: i32,
        t: RawType,
        mask_bands: DevPtr<i32>,
        n_mask: i32,
        ignore: f64,
        valid: DevPtr<u8>,
        count: Option<DevPtr<u64>>,
    ) -> Result<(), BackendError> {
        if npix == 0 {
            return Ok(());
        }
        raw.holds(npix as usize * bands as usize * t.size);
        mask_bands.holds(n_mask as usize);
        valid.holds(npix as usize);
        let cfg = grid_for(npix as u64 * 32, self.sms);
        #[rustfmt::skip]
        let args = [raw.into(), npix.into(), bands.into(), t.code.into(), t.swap.into(), mask_bands.into(),
            n_mask.into(), ignore.into(), valid.into(), count.into()];
        self.launch(s, &self.pixel_mask, cfg, &args, "launch pixel_mask")
    }

    /// Noise residual rows for lines out_l0..out_l1 into `out`, minus `shift`; `count` += residuals.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn noise(
        &self,
        s: &CudaStream,
        mean_filter: bool,
        raw: DevPtr<u8>,
        valid: Option<DevPtr<u8>>,
        t: RawType,
        g: NoiseArgs,
        shift: DevPtr<f64>,
        out: DevPtr<f32>,
        count: DevPtr<u64>,
    ) -> Result<(), BackendError> {
        let rows = (g.out_l1 - g.out_l0).max(0) as u64;
        if rows == 0 {
            return Ok(());
        }
        let buf_pixels = g.buf_lines as usize * g.samples as usize;
        raw.holds(buf_pixels * g.bands as usize * t.size);
        valid.holds(buf_pixels);
        shift.holds(g.bands as usize);
        out.holds(rows as usize * g.samples as usize * g.bands as usize);
        // The 2-byte integer fast path needs 16-byte aligned rows in and out.
        let wide = mean_filter
            && self.wide
            && w16_eligible(t, g.bands as usize)
            && raw.addr() % 16 == 0
            && out.addr() % 16 == 0;
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
        // One argument list for noise_mean_filter / noise_shift_difference / noise_mean_filter_w16{s,u}.
        #[rustfmt::skip]
        let args = [raw.into(), valid.into(), t.code.into(), t.swap.into(), g.lines.into(), g.samples.into(),
            g.bands.into(), g.buf_l0.into(), g.buf_lines.into(), g.out_l0.into(), g.out_l1.into(), wx0.into(),
            wx1.into(), wy0.into(), wy1.into(), shift.into(), out.into(), count.into()];
        self.launch(s, f, cfg, &args, "launch noise kernel")
    }

    /// out = raw − shift (float32), zero rows at invalid pixels.
    pub(crate) fn convert_shifted(
        &self,
        s: &CudaStream,
        px: Pixels,
        shift: DevPtr<f64>,
        out: DevPtr<f32>,
    ) -> Result<(), BackendError> {
        let Pixels { npix, bands, .. } = px;
        if npix == 0 {
            return Ok(());
        }
        px.check();
        let n = npix as usize * bands as usize;
        shift.holds(bands as usize);
        out.holds(n);
        let cfg = grid_for(n as u64, self.sms);
        self.launch(s, &self.convert_shifted, cfg, &px.args(&[shift.into(), out.into()]), "launch convert_shifted")
    }

    /// sums[b] += Σ_p d[p, b] (float64 atomics, one per block and band).
    pub(crate) fn col_sums(
        &self,
        s: &CudaStream,
        d: DevPtr<f32>,
        npix: i64,
        bands: i32,
        sums: DevPtr<f64>,
    ) -> Result<(), BackendError> {
        if npix == 0 {
            return Ok(());
        }
        d.holds(npix as usize * bands as usize);
        sums.holds(bands as usize);
        let per_block: i64 = 256;
        let blocks = (npix as u64).div_ceil(per_block as u64) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = [d.into(), npix.into(), bands.into(), per_block.into(), sums.into()];
        self.launch(s, &self.col_sums, cfg, &args, "launch col_sums")
    }

    /// Adds the rows of `d` into the per-split partial sums (see CovParts).
    pub(crate) fn cov_lower(&self, s: &CudaStream, d: DevPtr<f32>, npix: i64, parts: &CovParts) -> Result<(), BackendError> {
        if npix == 0 {
            return Ok(());
        }
        d.holds(npix as usize * parts.bands);
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
        let (pc, ps) = parts.ptrs();
        let f = if let Some(m16) = &self.cov_lower_m16 {
            m16
        } else if self.use_dmma {
            &self.cov_lower_dmma
        } else {
            &self.cov_lower
        };
        // One argument list for cov_lower / cov_lower_dmma / cov_lower_m16; parts holds splits × pairs tiles.
        #[rustfmt::skip]
        let args = [d.into(), npix.into(), bands.into(), per_split.into(), pairs.into(), tiles.into(), pc.into(),
            ps.into()];
        self.launch(s, f, cfg, &args, "launch cov_lower")
    }

    /// c (B × B, lower triangle) and sums (B) from the partial sums.
    pub(crate) fn reduce_parts(
        &self,
        s: &CudaStream,
        parts: &CovParts,
        c: DevPtr<f64>,
        sums: DevPtr<f64>,
    ) -> Result<(), BackendError> {
        c.holds(parts.bands * parts.bands);
        sums.holds(parts.bands);
        let cfg = grid_for((parts.pairs * COV_TILE * COV_TILE) as u64, self.sms);
        let (splits, pairs, tiles, bands) = (
            parts.splits as i32,
            parts.pairs as i32,
            parts.tiles as i32,
            parts.bands as i32,
        );
        let (pc, ps) = parts.ptrs();
        #[rustfmt::skip]
        let args = [pc.into(), ps.into(), splits.into(), pairs.into(), tiles.into(), bands.into(), c.into(),
            sums.into()];
        self.launch(s, &self.reduce_parts, cfg, &args, "launch reduce_parts")
    }

    /// out (float64) = in (float32), n values.
    pub(crate) fn widen_f64(&self, s: &CudaStream, input: DevPtr<f32>, n: i64, out: DevPtr<f64>) -> Result<(), BackendError> {
        if n == 0 {
            return Ok(());
        }
        input.holds(n as usize);
        out.holds(n as usize);
        let cfg = grid_for(n as u64, self.sms);
        self.launch(s, &self.widen_f64, cfg, &[input.into(), n.into(), out.into()], "launch widen_f64")
    }

    /// The projection / inverse kernel with T in global memory (project_global in transform.cu).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn project(
        &self,
        s: &CudaStream,
        px: Pixels,
        used: DevPtr<i32>,
        n_used: i32,
        means: DevPtr<f64>,
        t_global: DevPtr<f32>,
        k: i32,
        out: DevPtr<f32>,
        out_stride: i32,
        out_col: Option<DevPtr<i32>>,
        add_mean: Option<DevPtr<f64>>,
    ) -> Result<(), BackendError> {
        let Pixels { npix, .. } = px;
        if npix == 0 {
            return Ok(());
        }
        px.check();
        used.holds(n_used as usize);
        let blocks = (npix as u64).div_ceil(32).clamp(1, self.sms as u64 * 16) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        #[rustfmt::skip]
        let args = px.args(&[used.into(), n_used.into(), means.into(), t_global.into(), k.into(), out.into(),
            out_stride.into(), out_col.into(), add_mean.into()]);
        self.launch(s, &self.project_global, cfg, &args, "launch project_global")
    }

    /// The projection with T (u × kpad, zero-padded) `kp` components per pass: from shared memory when
    /// `t_pad` (the same T in device memory) is given, else from constant memory (already filled).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn project_px(
        &self,
        s: &CudaStream,
        t_pad: Option<DevPtr<f32>>,
        kp: usize,
        px: Pixels,
        used: DevPtr<i32>,
        n_used: i32,
        means: DevPtr<f64>,
        kpad: i32,
        k: i32,
        out: DevPtr<f32>,
    ) -> Result<(), BackendError> {
        let Pixels { npix, .. } = px;
        if npix == 0 {
            return Ok(());
        }
        px.check();
        used.holds(n_used as usize);
        t_pad.holds(n_used as usize * kpad as usize);
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
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: if t_pad.is_some() {
                (n_used as u32) * (kpad as u32) * 4
            } else {
                0
            },
        };
        // project_px{KP} / project_pxs{KP}: u × kpad floats of T at t_pad (null for the constant-memory
        // kernels), that many bytes of dynamic shared memory.
        #[rustfmt::skip]
        let args = px.args(&[used.into(), n_used.into(), means.into(), kpad.into(), k.into(), out.into(), t_pad.into()]);
        self.launch(s, f, cfg, &args, "launch project_px")
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
        px: Pixels,
        t_full: DevPtr<f32>,
        centre: DevPtr<i32>,
        corr: DevPtr<f32>,
        k: i32,
        out: DevPtr<f32>,
    ) -> Result<(), BackendError> {
        let Pixels { npix, bands, t, .. } = px;
        if npix == 0 {
            return Ok(());
        }
        px.check();
        t_full.holds(bands as usize * kp);
        centre.holds(bands as usize);
        corr.holds(kp);
        out.holds(npix as usize * k as usize);
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
        // bands · (kp + 1) · 4 bytes of dynamic shared memory (≤ 48 KB, checked by w16_project_kp).
        #[rustfmt::skip]
        let Pixels { raw, valid, .. } = px;
        let args = [raw.into(), valid.into(), npix.into(), bands.into(), t.swap.into(), t_full.into(), centre.into(),
            corr.into(), k.into(), out.into()];
        self.launch(s, f, cfg, &args, "launch project_w16")
    }

    /// out[p, cols[j]] = float32(x) (NaN at invalid pixels).
    pub(crate) fn pass_through(
        &self,
        s: &CudaStream,
        px: Pixels,
        cols: DevPtr<i32>,
        n_cols: i32,
        out: DevPtr<f32>,
    ) -> Result<(), BackendError> {
        let Pixels { npix, .. } = px;
        if npix == 0 || n_cols == 0 {
            return Ok(());
        }
        px.check();
        cols.holds(n_cols as usize);
        let cfg = grid_for(npix as u64 * n_cols as u64, self.sms);
        #[rustfmt::skip]
        let args = px.args(&[cols.into(), n_cols.into(), out.into()]);
        self.launch(s, &self.pass_through, cfg, &args, "launch pass_through")
    }

    /// out = x_used − means (float32, npix × n_used), NaN rows at invalid pixels.
    pub(crate) fn convert_centred_used(
        &self,
        s: &CudaStream,
        px: Pixels,
        used: DevPtr<i32>,
        n_used: i32,
        means: DevPtr<f64>,
        out: DevPtr<f32>,
    ) -> Result<(), BackendError> {
        let Pixels { npix, .. } = px;
        if npix == 0 {
            return Ok(());
        }
        px.check();
        used.holds(n_used as usize);
        means.holds(n_used as usize);
        out.holds(npix as usize * n_used as usize);
        let cfg = grid_for(npix as u64 * n_used as u64, self.sms);
        #[rustfmt::skip]
        let args = px.args(&[used.into(), n_used.into(), means.into(), out.into()]);
        self.launch(s, &self.convert_centred_used, cfg, &args, "launch convert_centred_used")
    }
}

/// The per-split partial sums of cov_lower for one covariance: splits × pairs tiles of 64 × 64 float64
/// and splits × tiles × 64 band sums, zeroed at the start of a pass and reduced at its end.
pub(crate) struct CovParts<'c> {
    pub bands: usize,
    pub tiles: usize,
    pub pairs: usize,
    pub splits: usize,
    pub cross: super::device::Pooled<'c, DevBuf>,
    pub sum: super::device::Pooled<'c, DevBuf>,
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
    /// The partial cross products and band sums.
    fn ptrs(&self) -> (DevPtr<f64>, DevPtr<f64>) {
        (DevPtr::of(&self.cross), DevPtr::of(&self.sum))
    }
    pub(crate) fn zero(&self, s: &CudaStream) -> Result<(), BackendError> {
        self.cross.zero_async(s)?;
        self.sum.zero_async(s)
    }
}
