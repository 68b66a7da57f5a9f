//! The compiled kernels and one typed launcher per kernel, so that argument lists are written once and
//! match kernels/*.cu. Device memory is passed as typed pointers ([`DevPtr`]), `None` where the kernel
//! accepts a null pointer; every launch goes through [`Kernels::launch`].

mod args;
mod input;
mod output;
mod statistics;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg};

use super::compile::{self, PtxOrigin};
use super::device::cuda;
use crate::backend::BackendError;

pub(crate) use args::{DevPtr, NoiseArgs, Pixels, RawType};
use args::Arg;
pub(crate) use statistics::{CovParts, FormedPart};

/// Tile edge of cov_lower (CT in covariance.cu).
pub(crate) const COV_TILE: usize = 64;
/// Floats of T that fit the constant-memory array (MAX_CONST_T in transform.cu).
pub(crate) const MAX_CONST_T: usize = 16320;
const THREADS: u32 = 256;
/// Components per pass of the project_px kernels (template instances in transform.cu).
pub(crate) const PX_KP: [usize; 6] = [1, 2, 4, 8, 12, 16];

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
    cov_pair_from_sums: CudaFunction,
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
        let (major, _) = ctx.compute_capability().map_err(cuda("cuDeviceGetAttribute"))?;
        let sms = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(cuda("cuDeviceGetAttribute"))?
            .max(1) as u32;
        let (module, origin) = compile::load_module(ctx, compile::Program::Pipeline)?;
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
            cov_pair_from_sums: f("cov_pair_from_sums")?,
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
}
