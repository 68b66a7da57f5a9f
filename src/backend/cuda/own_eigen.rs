//! The symmetric eigen step by kernels of our own (kernels/eigen.cu): Householder tridiagonalisation
//! in one thread block (the packed matrix in its shared memory up to 238 bands on an H100, in an L2-
//! resident scratch above), every eigenvalue by Sturm multisection, every eigenvector of the
//! tridiagonal matrix by one twisted factorisation, and the reflectors applied back.
//!
//! `EigenMethod::Own`: the job's device method up to 144 bands, where it beats syevd (1.10 against
//! 1.66–1.84 ms for the whole step at 128 bands on an H100); above that one block, bound by one SM,
//! loses to syevd (`EigenMethod::for_bands`). Also a row of `hypermnf bench eigen` at every size.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg};

use super::compile;
use super::device::cuda;
use crate::backend::BackendError;

/// Threads of the tridiagonalisation's one block, warps (columns) a back-transform block takes and
/// reflectors it stages at a time: as `EIG_THREADS`, `EIG_BT_COLS` and `EIG_BT_PANEL` in
/// kernels/eigen.cu.
const TRIDIAG_THREADS: u32 = 1024;
const BACK_COLS: u32 = 8;
const BACK_PANEL: usize = 8;

/// The kernels, loaded on one context.
pub(crate) struct OwnEigen {
    _module: Arc<CudaModule>,
    tridiagonalize: CudaFunction,
    squares: CudaFunction,
    bisect: CudaFunction,
    vectors: CudaFunction,
    back_transform: CudaFunction,
    /// Dynamic shared memory a block may opt in to (bytes).
    smem_optin: usize,
}

/// Where one solve's scratch lies in the workspace (float64 offsets).
struct Scratch {
    packed: usize,
    d: usize,
    e: usize,
    tau: usize,
    e2: usize,
    lu: usize,
    len: usize,
}

impl Scratch {
    fn of(n: usize) -> Scratch {
        let packed = 0;
        let d = packed + n * (n + 1) / 2;
        let e = d + n;
        let tau = e + n;
        let e2 = tau + n;
        let lu = e2 + n;
        Scratch { packed, d, e, tau, e2, lu, len: lu + 2 * n * n }
    }
}

impl OwnEigen {
    /// The largest problem the kernels take: the back-transform keeps 16 rows of n float64 in shared
    /// memory (128 KB at 1024 bands), and the packed scratch's 32-bit indices stay far from overflow.
    pub(crate) const MAX_BANDS: usize = 1024;

    /// Compiles (or loads from the PTX cache) and loads kernels/eigen.cu on `ctx`.
    pub(crate) fn load(ctx: &Arc<CudaContext>) -> Result<OwnEigen, BackendError> {
        let (module, _) = compile::load_module(ctx, compile::Program::Eigen)?;
        let f = |name: &str| module.load_function(name).map_err(|e| BackendError::Cuda(format!("kernel {name}: {e}")));
        let smem_optin = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(cuda("cuDeviceGetAttribute"))?
            .max(0) as usize;
        // Both kernels may take more than the default 48 KB of dynamic shared memory.
        let opt_in = |name: &str| -> Result<CudaFunction, BackendError> {
            let func = f(name)?;
            func.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem_optin as i32,
            )
            .map_err(cuda("cuFuncSetAttribute"))?;
            Ok(func)
        };
        let tridiagonalize = opt_in("eig_tridiagonalize")?;
        let back_transform = opt_in("eig_back_transform")?;
        Ok(OwnEigen {
            tridiagonalize,
            squares: f("eig_squares")?,
            bisect: f("eig_bisect")?,
            vectors: f("eig_vectors")?,
            back_transform,
            smem_optin,
            _module: module,
        })
    }

    /// Device workspace of a solve at n bands, in bytes.
    pub(crate) fn workspace_bytes(n: usize) -> usize {
        Scratch::of(n).len * std::mem::size_of::<f64>()
    }

    /// Whether the packed matrix of n bands fits the tridiagonalisation block's shared memory (with
    /// the reflector, the product and two scalars beside it).
    fn in_shared(&self, n: usize) -> bool {
        Self::shared_bytes(n, true) <= self.smem_optin
    }

    fn shared_bytes(n: usize, packed: bool) -> usize {
        (2 * n + 2 + if packed { n * (n + 1) / 2 } else { 0 }) * std::mem::size_of::<f64>()
    }

    /// Queues the solve of the n × n matrix at `a` (lower triangle read; overwritten by V, column-
    /// major), the eigenvalues ascending to `w`, on `stream`.
    ///
    /// # Safety
    /// `a` (n² float64), `w` (n) and `work` (`workspace_bytes(n)`) are device allocations of this
    /// module's context that stay alive, and are touched by nothing else, until `stream` has run
    /// the kernels.
    pub(crate) unsafe fn enqueue(&self, stream: &CudaStream, n: usize, a: u64, w: u64, work: u64) -> Result<(), BackendError> {
        if n == 0 || n > Self::MAX_BANDS {
            return Err(BackendError::Invalid(format!("the own eigen kernels take 1 to {} bands, not {n}", Self::MAX_BANDS)));
        }
        let s = Scratch::of(n);
        let at = |off: usize| work + (off * std::mem::size_of::<f64>()) as u64;
        let (packed, d, e, tau, e2, lu) = (at(s.packed), at(s.d), at(s.e), at(s.tau), at(s.e2), at(s.lu));
        let ni = n as i32;
        let shared = self.in_shared(n);
        let in_shared = i32::from(shared);
        let cfg = |blocks: usize, threads: u32, smem: usize| LaunchConfig {
            grid_dim: (blocks.max(1) as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        // SAFETY (each launch): the parameters are those of the kernel in kernels/eigen.cu, in order
        // (device pointers as u64, int as i32); every pointer lies in the allocations the caller
        // vouches for, sized by `Scratch::of(n)`; the dynamic shared memory is what the kernel indexes
        // (the tridiagonalisation's within the opt-in set at load).
        let mut b = stream.launch_builder(&self.tridiagonalize);
        b.arg(&a).arg(&ni).arg(&packed).arg(&in_shared).arg(&d).arg(&e).arg(&tau);
        unsafe { b.launch(cfg(1, TRIDIAG_THREADS, Self::shared_bytes(n, shared))) }.map_err(cuda("eig_tridiagonalize"))?;
        let mut b = stream.launch_builder(&self.squares);
        b.arg(&e).arg(&ni).arg(&e2);
        unsafe { b.launch(cfg(n.div_ceil(128), 128, 0)) }.map_err(cuda("eig_squares"))?;
        let mut b = stream.launch_builder(&self.bisect);
        b.arg(&d).arg(&e).arg(&e2).arg(&ni).arg(&w);
        unsafe { b.launch(cfg((n * 32).div_ceil(128), 128, 0)) }.map_err(cuda("eig_bisect"))?;
        let mut b = stream.launch_builder(&self.vectors);
        b.arg(&d).arg(&e).arg(&w).arg(&ni).arg(&a).arg(&lu);
        unsafe { b.launch(cfg(n.div_ceil(64), 64, 0)) }.map_err(cuda("eig_vectors"))?;
        let mut b = stream.launch_builder(&self.back_transform);
        b.arg(&packed).arg(&tau).arg(&ni).arg(&a);
        let back_smem = (BACK_COLS as usize + BACK_PANEL) * n * std::mem::size_of::<f64>();
        if back_smem > self.smem_optin {
            return Err(BackendError::Invalid(format!("the own eigen back-transform needs {back_smem} bytes of shared memory at {n} bands")));
        }
        unsafe { b.launch(cfg(n.div_ceil(BACK_COLS as usize), BACK_COLS * 32, back_smem)) }.map_err(cuda("eig_back_transform"))?;
        Ok(())
    }
}
